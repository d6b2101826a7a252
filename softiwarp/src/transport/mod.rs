//! The device's transport core: one smoltcp interface, its TCP sockets, and an MPA
//! connection with an upper layer on each socket, driven sans-IO.
//!
//! **Room.** Sans-IO: no threads, no clock (time is an argument). It owns the
//! smoltcp interface and sockets (`smoltcp_glue`), each connection's MPA endpoint
//! (`mpa_conn`), the listeners, the [`Ulp`] trait an upper layer implements, the stream
//! upper (`stream`) and ARP on request (`neighbor`). It touches `link` only (and the wire
//! crates); the QP engine plugs in from above through [`Ulp`] (`crate::rdmap::binding`).
//!
//! A [`Stack`] owns the [`Link`] (through a [`LinkDevice`]), the smoltcp `Interface` and
//! `SocketSet`, a table of connections and a table of listeners. It reads no clock and
//! starts no thread: the driver (the device's engine thread, or a test with a
//! virtual clock) calls [`Stack::poll`] with the current time and gets back the next
//! deadline, and reads what happened from [`Stack::poll_event`]. Two stacks joined by a
//! [`MemoryLink`](crate::link::MemoryLink) pair therefore run deterministically in one
//! thread, which is how most of the tests drive it.
//!
//! # A connection
//!
//! Each connection is a TCP socket, an [`MpaConn`] (created once TCP is established,
//! with the EMSS of that TCP connection) and an upper layer implementing [`Ulp`]: the
//! consumer of received ULPDUs and the supplier of ULPDUs to send: the stream upper of
//! [`crate::transport::stream`], or a QP's RDMAP engine ([`crate::rdmap::binding`]).
//!
//! [`Stack::poll`] does, in order:
//!
//! 1. link events ([`LinkEvent`]): reported as [`StackEvent::Link`]; `Gone` fails every
//!    connection with [`ConnError::DeviceGone`] and removes every listener;
//! 2. smoltcp `Interface::poll` (ingress, then egress: ACKs go out at once);
//! 3. listeners: harvest listen sockets that became connections (they join the
//!    half-open pool; the pool is swept and re-armed after step 5, see "Listeners and
//!    the backlog");
//! 4. rounds over the connections: TCP state changes, the receive path (socket bytes into
//!    [`MpaConn::handle_rx`], events out, ULPDUs to the upper while it has room), MPA
//!    timers, closing, and the transmit path (FPDUs into the socket: one per connection
//!    per round, or several full-sized ones when the peer's window takes them all, see
//!    below), then `Interface::poll_egress` until smoltcp has sent them, so each FPDU
//!    leaves as its own segment; repeated while any connection wrote something (at most
//!    [`MAX_ROUNDS`] rounds per call);
//! 5. after rounds that wrote, or that consumed at least 16 KiB, egress until smoltcp
//!    has nothing left to send, which includes the window update
//!    for what step 4 consumed (the ACKs of step 2 advertised the window before it): a
//!    sender's window edge then seldom falls inside a full-sized FPDU (at MTU 65000 with
//!    256 KiB buffers, without this pass 170 of 400 such FPDUs left as two segments:
//!    `softiwarp/tests/engine/pair.rs` `full_sized_fpdus_leave_whole_at_a_large_mtu`);
//! 6. the next deadline: the earliest of smoltcp's `poll_at`, the MPA startup timers, TCP
//!    connect deadlines and Terminate linger deadlines, or `now` when work was left over.
//!
//! # One FPDU per TCP segment (RFC 5044 section 4.5, design.md section 4)
//!
//! ULPDUs are limited to MULPDU, computed by `mpa::fpdu::mulpdu` from the EMSS of the
//! connection (the smaller of this side's MSS, `MTU - 40`, and the MSS option of the
//! peer's SYN; smoltcp sends no TCP options on data segments, so the MSS is the EMSS) and
//! the agreed markers. So every FPDU fits in one segment. What smoltcp does with the bytes
//! of its send buffer is another matter: it has no notion of records and cuts the buffer
//! at `min(peer window, MSS, congestion window)` from its send pointer. With a full-sized
//! window two FPDUs written back to back would leave as one MSS-sized segment holding one
//! and a half of them (**re-segmentation**), and when the peer's window is smaller than
//! an FPDU smoltcp sends the part that fits, so an FPDU can also be split.
//!
//! What the stack does about it (best effort):
//!
//! * Only whole FPDUs go into the send buffer (an FPDU waits until the buffer has room
//!   for all of it).
//! * A connection writes its next FPDU only when everything written before has been
//!   *transmitted at least once*: the device wrapper reads the TCP header of every frame
//!   smoltcp sends and keeps, per 4-tuple, the highest sequence number sent; written minus
//!   sent is the unsent backlog, and the next FPDU waits for it to be zero. Each write is
//!   followed by an egress pass, so an FPDU leaves as exactly one segment whenever the
//!   peer's window can take it. The result: **a segment never carries bytes of two FPDUs
//!   on first transmission**; when the window is smaller than the FPDU, the FPDU goes out
//!   as two or more segments, each holding only bytes of that FPDU.
//! * The exception, which keeps that result: an FPDU of exactly EMSS bytes (MULPDU-sized
//!   ULPDUs without Markers) ends exactly where smoltcp will end its segment, so the next
//!   FPDU may be written behind it in the same round, and so on (at most 64 KiB per
//!   round), as long as the peer's window takes everything unsent plus one more full
//!   segment, so that no segment is cut short by the window. The tracker takes the
//!   peer's window from the pure ACKs it receives and smoltcp accepts (checksums right,
//!   not older than the last; acknowledgment number plus the window scaled per RFC 7323
//!   when both SYNs carried the option); an older window edge is never further, so a
//!   stale one only means fewer FPDUs written ahead. At MTU 1500 this is one
//!   connection round per up to 44 FPDUs instead of one per FPDU;
//!   [`StackStats::fpdus_batched`] counts the FPDUs written ahead.
//! * With TCP segmentation offload ([`crate::link::Link::tcp_offload`]) smoltcp sends
//!   all unsent bytes up to its TSO limit (whole EMSS-sized segments,
//!   [`smoltcp_glue::tso_payload_max`]) as one super-segment, which the link cuts every
//!   EMSS bytes from its start: the same segments as without the offload. A round then
//!   writes at most that many bytes of FPDUs (instead of 64 KiB), so that what it wrote
//!   leaves as one super-segment and every cut falls between two FPDUs. Only a round's
//!   last FPDU may be short, so a message's short last segment used to end the round
//!   early: a 64 KiB message at MTU 1500 (46 segments, the last 736 octets) took two
//!   super-segments. The stack therefore tells the upper which FPDU ends a round
//!   ([`Ulp::poll_ulpdu_ending_run`]), and RDMAP puts the message's short segment there
//!   (`ddp_rdmap::segment::Segments::next_remainder_first`; RFC 5041 allows segments
//!   of any size up to MULPDU), so the message's later segments are full and the next
//!   round runs on into the next message: about 46/44 super-segments per message.
//! * Retransmissions are smoltcp's: after an RTO it resends from the oldest unacknowledged
//!   byte in MSS-sized pieces, which may cross FPDU boundaries. Receivers (ours, siw,
//!   Chelsio) reassemble the stream, so this costs only the "one FPDU per segment"
//!   optimisation, not correctness.
//!
//! # Listeners and the backlog
//!
//! smoltcp has no accept queue: a listening socket *becomes* the connection when a SYN
//! arrives. A listener therefore keeps a pool of listening sockets (**armed**) on its
//! port, re-armed at every poll, and counts its connections in two bounded sets:
//!
//! - the **half-open pool**: TCP established, MPA Request not yet valid. At most
//!   [`StackConfig::half_open_max`] (default [`DEFAULT_HALF_OPEN_MAX`]); when a new
//!   connection makes it one more, the **oldest** half-open connection is reset
//!   ([`StackStats::half_open_dropped`]). A peer that opens connections and never sends
//!   (or dribbles) its Request can thus hold at most that many sockets, and cannot keep
//!   a client that sends its Request promptly out: the client is pushed out only if
//!   `half_open_max` newer connections arrive before its Request is in. Each still
//!   waits at most [`MpaDefaults::startup_timeout_us`] for its Request.
//! - the **backlog**: [`StackEvent::ConnectRequest`] reported and neither
//!   [`Stack::accept`]ed nor [`Stack::reject`]ed; at most `backlog` (the argument of
//!   [`Stack::listen`], at most [`MAX_BACKLOG`]). A half-open connection whose Request
//!   comes in while the backlog is full gets a reject Reply and a FIN, and is not
//!   reported ([`StackStats::backlog_rejects`]): our choice, so the backlog bound holds
//!   (Linux siw hands the backlog to its kernel listening socket, `siw_create_listen`,
//!   where the TCP accept queue bounds connections before MPA).
//!
//! While the backlog is full no socket is armed, and smoltcp answers a further SYN with
//! a RST (no socket accepts the segment, so `process_tcp` replies with `rst_reply`): the
//! initiator sees the connection refused. Linux instead drops the SYN while its accept
//! queue is full, so the client retries; here the refusal is immediate and visible.
//! Otherwise up to `backlog - requests` sockets are in LISTEN, at most [`MAX_ARMED`]
//! (8), whether or not the half-open pool is full: enough that a client opening several
//! connections at once is not refused, few enough that smoltcp's per-poll scans of the
//! socket set stay cheap. A burst of more SYNs than that within one poll is not
//! refused: the SYNs beyond the sockets in LISTEN are held (`seg_tracker::SynGate`, at
//! most 1,024) and handed to smoltcp in the next polls, right after the re-arm, oldest
//! first ([`StackStats::syns_held`]). A socket a SYN took (SYN-RECEIVED) is replaced at
//! the next poll; those
//! waiting for the handshake's last ACK are bounded by `half_open_max` apart, the
//! oldest dropped beyond it ([`StackStats::syn_received_dropped`]), so SYNs that never
//! complete a handshake cannot take every listening socket (smoltcp has no SYN
//! cookies). [`Stack::listener_stats`] gives the counts.
//!
//! Memory: a socket's receive and send buffers ([`TcpConfig::rx_buffer`],
//! [`TcpConfig::tx_buffer`]) are allocated zeroed when it is armed and keep their size
//! for the connection's life (smoltcp cannot resize them), so every half-open connection
//! costs them in full: the half-open pool bounds that cost per listener at
//! `half_open_max x (rx_buffer + tx_buffer)`.
//!
//! # Bad input
//!
//! Anything the peer sends that MPA refuses (a broken Request/Reply, garbage instead of an
//! FPDU, a CRC error, a failed RTR) fails only that connection: [`MpaConn`] reports the
//! error, the stack sends a Terminate when [`MpaConn::can_send_terminate`] says one may
//! be sent (Layer LLP, the error's code; RFC 5044 section 8), waits until it is
//! acknowledged (at most [`StackConfig::terminate_linger_us`]) and aborts the TCP
//! connection (RST). A Terminate received from the peer ends the connection the same way
//! (no further FPDU is processed, RFC 5040 section 5.3) with
//! [`ConnError::TerminateReceived`]. Connections that fail before the user heard of them
//! (a responder that never got a valid Request) are dropped silently and counted in
//! [`StackStats::startup_failures`].
//!
//! # Copies
//!
//! Transmit: the upper hands the ULPDU parts (a header and a payload slice) to the
//! stack, which frames them straight into smoltcp's send buffer with the CRC computed in
//! the same pass ([`MpaConn::frame_into`]: the one copy out of user memory). smoltcp's
//! `send` closure hands out the ring's free space up to the ring's end, so an FPDU that
//! would cross the end is framed into MPA's own transmit queue instead
//! ([`MpaConn::send_ulpdu`]) and then copied into the ring (a second copy). The stack
//! sizes the ring to a whole number of segments ([`TcpConfig::socket_for_mss`]), so a
//! stream of EMSS-sized FPDUs never crosses it.
//!
//! Receive: the deframer checks each FPDU's CRC where it lies in smoltcp's receive buffer
//! (an FPDU split across the ring's wrap, or carrying Markers, is gathered into the
//! deframer's buffer first) and the ULPDU is offered *in place* to
//! [`Ulp::on_ulpdu_in_place`]: a QP places the payload straight into the MR (the one
//! copy), with no allocation. Uppers that decline (the stream upper) get a copy as
//! [`Ulp::on_ulpdu`].

mod config;
pub(crate) mod conn;
mod listener;
pub mod llp;
pub mod mpa_conn;
pub mod neighbor;
pub(crate) mod seg_tracker;
pub mod smoltcp_glue;
pub mod stream;
mod ulp;

use config::WINDOW_UPDATE_MIN;
pub use config::*;
pub(crate) use listener::sweep_half_open_of;
pub use listener::ListenerStats;
pub use ulp::*;
// The LLP Terminate after an MPA error, for the receive-path harness (`crate::testing`).
#[cfg(feature = "testing")]
pub(crate) use conn::terminate_ulpdu;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};

use rustc_hash::FxHashSet;
use smoltcp::iface::{Interface, PollResult, SocketHandle, SocketSet};
use smoltcp::phy::{Device, TxToken};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::IpAddress;

use crate::link::{GoneReason, Link, LinkError, LinkEvent};
use conn::{from_micros, micros, v4, Conn, Cx, Life, LocalClose, Timer};
use mpa::negotiate::{LocalSettings, SettingsError};
use mpa_conn::{CallError, MpaConn, Role, State};
use seg_tracker::{tuple_key, SegTracker, Track, TrackedDevice};
use smoltcp_glue::{build_interface, mss_for_mtu, DeviceStats, LinkDevice};
#[allow(unused_imports)] // doc links
use smoltcp_glue::{InterfaceConfig, TcpConfig};

/// One listener: a port, its backlog, its half-open pool and its pool of listening
/// sockets. Defined here, below both `conn` (which counts a valid Request against the
/// backlog) and `listener` (which arms, harvests and sweeps), so that neither imports
/// the other.
pub(crate) struct Listener {
    pub(crate) port: u16,
    pub(crate) backlog: usize,
    pub(crate) settings: LocalSettings,
    pub(crate) armed: Vec<SocketHandle>,
    /// Connection requests reported and not yet decided (the backlog; see the module
    /// docs).
    pub(crate) pending: usize,
    /// Half-open connections (TCP established, MPA Request not yet valid), oldest
    /// first; at most `half_open_max` after each poll.
    pub(crate) half_open: VecDeque<ConnId>,
    /// Bound of `half_open` ([`StackConfig::half_open_max`]).
    pub(crate) half_open_max: usize,
}

/// Identifies a connection of one [`Stack`] (never reused by that stack).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// Identifies a listener of one [`Stack`] (never reused by that stack).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenerId(pub u64);

/// Counters of a [`Stack`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackStats {
    /// TCP connections established (both roles).
    pub tcp_established: u64,
    /// Connections that reached MPA full operation (both roles).
    pub mpa_established: u64,
    /// Responder connections dropped before the user heard of them (bad or missing
    /// Request, negotiation refused without a ConnectRequest, reset during startup).
    pub startup_failures: u64,
    /// ULPDUs handed to MPA for sending.
    pub ulpdus_tx: u64,
    /// ULPDUs received and given to an upper.
    pub ulpdus_rx: u64,
    /// Bytes written into TCP send buffers (MPA frames and FPDUs).
    pub stream_tx_bytes: u64,
    /// Bytes read from TCP receive buffers.
    pub stream_rx_bytes: u64,
    /// FPDUs whose CRC did not match.
    pub crc_errors: u64,
    /// Terminates sent (by the stack or an upper).
    pub terminates_sent: u64,
    /// Terminates received.
    pub terminates_received: u64,
    /// Valid MPA Requests rejected (reject Reply, then FIN) because their listener's
    /// backlog was full; also counted in `startup_failures`.
    pub backlog_rejects: u64,
    /// Half-open connections (MPA Request not yet valid) reset because their
    /// listener's half-open pool was full ([`StackConfig::half_open_max`]), oldest first.
    pub half_open_dropped: u64,
    /// Sockets a SYN took that were dropped before the handshake completed because
    /// more than `half_open_max` were waiting for its last ACK (a SYN flood; see
    /// "Listeners and the backlog").
    pub syn_received_dropped: u64,
    /// SYNs to a listening port held for a later poll because every socket in LISTEN
    /// there was taken in this one (a burst of connections; see "Listeners and the
    /// backlog").
    pub syns_held: u64,
    /// SYNs dropped because [`seg_tracker::SYN_GATE_MAX`] were held already (their
    /// senders retransmit them).
    pub syns_dropped: u64,
    /// FPDUs written behind another full-sized one before it was on the wire (several
    /// per connection round; see "One FPDU per TCP segment" in the module docs).
    pub fpdus_batched: u64,
}

/// Errors of [`Stack`] calls. Nothing changed when one is returned.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// The link or the interface configuration was refused.
    #[error("link: {0}")]
    Link(#[from] LinkError),
    /// MPA settings that cannot be put on the wire (e.g. private data too long).
    #[error("MPA settings: {0}")]
    Settings(#[from] SettingsError),
    /// A configuration value is out of range (the message says which).
    #[error("configuration: {0}")]
    Config(String),
    /// Port 0 cannot be listened on or connected to.
    #[error("port 0 is not a valid port")]
    InvalidPort,
    /// The backlog is 0 or over [`MAX_BACKLOG`].
    #[error("backlog {0} is outside 1..={MAX_BACKLOG}")]
    InvalidBacklog(usize),
    /// A listener already exists on that port.
    #[error("port {0} is already listened on")]
    PortInUse(u16),
    /// No ephemeral port is free for a new connection.
    #[error("no free ephemeral port")]
    NoFreePort,
    /// smoltcp refused the remote address (unspecified, or not reachable by any route).
    #[error("address {0} is not reachable")]
    Unaddressable(SocketAddrV4),
    /// No such connection (never made, or already removed).
    #[error("no connection {0:?}")]
    NoSuchConnection(ConnId),
    /// No such listener.
    #[error("no listener {0:?}")]
    NoSuchListener(ListenerId),
    /// The call does not fit the connection's state (e.g. `accept` twice).
    #[error("{call} not allowed: {why}")]
    WrongState {
        /// The call.
        call: &'static str,
        /// Why.
        why: &'static str,
    },
    /// MPA refused the call (e.g. accept with IRD/ORD over 14 bits).
    #[error("MPA: {0}")]
    Mpa(#[from] CallError),
    /// The link is gone; nothing can be done on this stack any more.
    #[error("device gone ({0:?})")]
    Gone(GoneReason),
}

/// The transport core of one device. See the [module docs](self).
///
/// It performs no I/O of its own but on its [`Link`], reads no clock and starts no
/// thread. Its methods fall into four classes, as quinn-proto's `Connection`:
///
/// - **Getters**, which change nothing: [`config`](Self::config), [`link`](Self::link),
///   [`address`](Self::address), [`mss`](Self::mss), [`stats`](Self::stats),
///   [`device_stats`](Self::device_stats), [`progressed`](Self::progressed),
///   [`gone`](Self::gone), [`connection_count`](Self::connection_count),
///   [`mpa_state`](Self::mpa_state), [`tcp_state`](Self::tcp_state).
/// - **Inputs**: there are no `handle_*` calls. Frames and link events come from the
///   link itself, which [`poll`](Self::poll) reads; time comes as `poll`'s `now`.
/// - **Commands**, which queue work and report through events: [`listen`](Self::listen),
///   [`unlisten`](Self::unlisten), [`connect`](Self::connect), [`accept`](Self::accept),
///   [`reject`](Self::reject), [`close`](Self::close),
///   [`resolve_neighbor`](Self::resolve_neighbor), [`shutdown`](Self::shutdown) (which
///   also sends its RSTs at once); and the settings
///   [`set_link_check_interval`](Self::set_link_check_interval) and, for tests,
///   [`set_rx_hook`](Self::set_rx_hook), [`link_mut`](Self::link_mut) and
///   [`into_link`](Self::into_link).
/// - **Outputs**: [`poll`](Self::poll) does the work due (frames in and out, the
///   connections' rounds) and returns the next deadline; [`poll_event`](Self::poll_event)
///   hands out what happened, oldest first. The upper layers ([`Ulp`]) are called from
///   inside `poll`, from [`accept`](Self::accept) (its `Established`) and from
///   [`shutdown`](Self::shutdown) (the final `on_error`).
///
/// The driver calls `poll(now)` whenever the link is readable, a command was made, or
/// the returned deadline passed, then drains `poll_event` until `None`, before it
/// sleeps. A command's frames go out at the next `poll` (a SYN, an MPA Reply, a FIN or
/// RST): a driver that makes a command and then sleeps until the old deadline leaves
/// them waiting. `progressed` after `poll` says whether sleeping is safe.
pub struct Stack<L: Link> {
    dev: TrackedDevice<L>,
    iface: Interface,
    sockets: SocketSet<'static>,
    cfg: StackConfig,
    conns: std::collections::BTreeMap<ConnId, Conn>,
    listeners: std::collections::BTreeMap<ListenerId, Listener>,
    events: VecDeque<StackEvent>,
    stats: StackStats,
    next_id: u64,
    next_port: u16,
    progress: bool,
    gone: Option<GoneReason>,
    /// When the link was last asked for events ([`Stack::set_link_check_interval`]).
    link_checked: Option<Instant>,
    link_check_us: u64,
    /// Neighbour resolutions asked for ([`Stack::resolve_neighbor`]).
    neighbors: crate::transport::neighbor::Neighbors,
}

impl<L: Link> std::fmt::Debug for Stack<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("link", &self.dev.inner.link().name())
            .field("address", &self.cfg.interface.address)
            .field("connections", &self.conns.len())
            .field("listeners", &self.listeners.len())
            .field("gone", &self.gone)
            .finish()
    }
}

impl<L: Link> Stack<L> {
    // ---- construction and getters ------------------------------------------------

    /// A stack on `link` with `config`, at time `now`.
    ///
    /// Errors: [`StackError::Link`] for a bad interface configuration or TCP settings
    /// ([`build_interface`], [`TcpConfig::validate`]); [`StackError::Settings`] for invalid
    /// MPA default settings; [`StackError::Config`] if the TCP send buffer cannot hold one
    /// full-sized FPDU (`tx_buffer` < MSS).
    pub fn new(link: L, config: StackConfig, now: Instant) -> Result<Self, StackError> {
        config.tcp.validate()?;
        config.mpa.settings.validate()?;
        let mss = mss_for_mtu(link.mtu());
        if config.tcp.tx_buffer < mss {
            return Err(StackError::Config(format!(
                "TCP tx_buffer of {} bytes is smaller than the MSS of {mss} bytes",
                config.tcp.tx_buffer
            )));
        }
        let mut dev = TrackedDevice {
            inner: LinkDevice::new(link),
            tracker: RefCell::new(SegTracker::default()),
            gate: Default::default(),
        };
        let iface = build_interface(&config.interface, &mut dev.inner, now)?;
        let next_port = EPHEMERAL_FIRST + (config.interface.random_seed % 16384) as u16;
        tracing::debug!(link = dev.inner.link().name(), address = %config.interface.address,
            mtu = dev.inner.link().mtu(), "stack up");
        Ok(Stack {
            dev,
            iface,
            sockets: SocketSet::new(Vec::new()),
            cfg: config,
            conns: Default::default(),
            listeners: Default::default(),
            events: VecDeque::new(),
            stats: StackStats::default(),
            next_id: 1,
            next_port,
            progress: false,
            gone: None,
            link_checked: None,
            link_check_us: 0,
            neighbors: Default::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &StackConfig {
        &self.cfg
    }

    /// The link.
    pub fn link(&self) -> &L {
        self.dev.inner.link()
    }

    /// The link, mutably (tests: fault settings, captures).
    pub fn link_mut(&mut self) -> &mut L {
        self.dev.inner.link_mut()
    }

    /// Unwraps the link (e.g. to read a capture written to memory). Connections and
    /// listeners are dropped without sending anything.
    pub fn into_link(self) -> L {
        self.dev.inner.into_link()
    }

    /// The IPv4 address of the interface.
    pub fn address(&self) -> Ipv4Addr {
        self.cfg.interface.address
    }

    /// This side's TCP MSS in bytes: the link MTU less 40 ([`mss_for_mtu`]).
    pub fn mss(&self) -> usize {
        mss_for_mtu(self.link().mtu())
    }

    /// Frame counters of the device.
    pub fn device_stats(&self) -> DeviceStats {
        self.dev.inner.stats()
    }

    /// Counters of the stack.
    pub fn stats(&self) -> StackStats {
        StackStats {
            syns_held: self.dev.gate.held,
            syns_dropped: self.dev.gate.dropped,
            ..self.stats
        }
    }

    /// Whether the last [`Stack::poll`] did anything (frames moved, bytes moved, events):
    /// a driver that sees `false` may sleep until the returned deadline.
    pub fn progressed(&self) -> bool {
        self.progress
    }

    /// `Some(reason)` once the link is gone.
    pub fn gone(&self) -> Option<GoneReason> {
        self.gone
    }

    /// Connections in the table (including ones closing in the background).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// The MPA state of a connection (`None`: no such connection, or TCP not established).
    pub fn mpa_state(&self, conn: ConnId) -> Option<State> {
        self.conns.get(&conn)?.mpa.as_ref().map(MpaConn::state)
    }

    /// The TCP state of a connection's socket.
    pub fn tcp_state(&self, conn: ConnId) -> Option<tcp::State> {
        let c = self.conns.get(&conn)?;
        Some(self.sockets.get::<tcp::Socket>(c.handle).state())
    }

    /// Installs a receive-path test hook on a connection (see [`RxHook`]).
    ///
    /// Errors: [`StackError::NoSuchConnection`].
    pub fn set_rx_hook(&mut self, conn: ConnId, hook: RxHook) -> Result<(), StackError> {
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(StackError::NoSuchConnection(conn))?;
        c.hook = Some(hook);
        Ok(())
    }

    // ---- application calls ------------------------------------------------------

    fn check_gone(&self) -> Result<(), StackError> {
        match self.gone {
            Some(r) => Err(StackError::Gone(r)),
            None => Ok(()),
        }
    }

    fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn new_socket(&self) -> Result<tcp::Socket<'static>, StackError> {
        Ok(self.cfg.tcp.socket_for_mss(self.mss())?)
    }

    /// Listens on `port` with room for `backlog` undecided connections (see the module
    /// docs on how the backlog is kept), negotiating with `settings` (default: the
    /// device's [`MpaDefaults::settings`]; `accept` supplies private data, IRD and ORD).
    ///
    /// Errors: [`StackError::InvalidPort`], [`StackError::InvalidBacklog`],
    /// [`StackError::PortInUse`], [`StackError::Settings`], [`StackError::Gone`].
    pub fn listen(
        &mut self,
        port: u16,
        backlog: usize,
        settings: Option<LocalSettings>,
    ) -> Result<ListenerId, StackError> {
        self.check_gone()?;
        if port == 0 {
            return Err(StackError::InvalidPort);
        }
        if backlog == 0 || backlog > MAX_BACKLOG {
            return Err(StackError::InvalidBacklog(backlog));
        }
        if self.cfg.half_open_max == 0 {
            return Err(StackError::Config(
                "half_open_max must be at least 1".into(),
            ));
        }
        if self.listeners.values().any(|l| l.port == port) {
            return Err(StackError::PortInUse(port));
        }
        let settings = settings.unwrap_or_else(|| self.cfg.mpa.settings.clone());
        settings.validate()?;
        // One socket first, to surface configuration errors before anything changes.
        let first = self.new_socket()?;
        let id = ListenerId(self.next_id());
        let mut l = Listener {
            port,
            backlog,
            settings,
            armed: Vec::new(),
            pending: 0,
            half_open: Default::default(),
            half_open_max: self.cfg.half_open_max,
        };
        Self::arm(&mut self.sockets, &mut l, first);
        self.listeners.insert(id, l);
        self.dev.tracker.borrow_mut().listen_ports.push(port);
        self.rearm();
        tracing::debug!(port, backlog, "listening");
        Ok(id)
    }

    /// Stops listening (iw-cm `destroy_listen`): the listening sockets are closed, and
    /// connections not yet reported by a [`StackEvent::ConnectRequest`] are aborted.
    /// Connections already reported stay; they are answered with accept/reject as usual.
    ///
    /// Errors: [`StackError::NoSuchListener`].
    pub fn unlisten(&mut self, id: ListenerId) -> Result<(), StackError> {
        let l = self
            .listeners
            .remove(&id)
            .ok_or(StackError::NoSuchListener(id))?;
        for h in l.armed {
            self.sockets.remove(h);
        }
        for c in self.conns.values_mut() {
            if c.listener == Some(id) {
                c.in_backlog = false;
                if !c.visible {
                    c.ask_abort();
                }
            }
        }
        let mut t = self.dev.tracker.borrow_mut();
        t.listen_ports.retain(|&p| p != l.port);
        Ok(())
    }

    fn alloc_port(&mut self) -> Result<u16, StackError> {
        let used: std::collections::HashSet<u16> = self
            .conns
            .values()
            .map(|c| c.local.port())
            .chain(self.listeners.values().map(|l| l.port))
            .collect();
        for _ in 0..=(u16::MAX - EPHEMERAL_FIRST) {
            let p = self.next_port;
            self.next_port = if p == u16::MAX {
                EPHEMERAL_FIRST
            } else {
                p + 1
            };
            if !used.contains(&p) {
                return Ok(p);
            }
        }
        Err(StackError::NoFreePort)
    }

    /// Starts a connection to `remote` (TCP SYN now, MPA Request once TCP is
    /// established) with `params`, `upper` taking its ULPDUs. Its events come as
    /// [`StackEvent::Conn`]: [`ConnEvent::Established`] or a [`ConnEvent::Failed`] with
    /// [`ConnError::Rejected`], [`ConnError::Refused`], [`ConnError::TimedOut`],
    /// [`ConnError::Reset`], [`ConnError::Mpa`].
    ///
    /// Errors: [`StackError::InvalidPort`], [`StackError::Settings`] (e.g. private data
    /// over 508 bytes with Rev 2), [`StackError::NoFreePort`],
    /// [`StackError::Unaddressable`], [`StackError::Gone`].
    pub fn connect(
        &mut self,
        remote: SocketAddrV4,
        params: MpaParams,
        upper: Box<dyn Ulp>,
        now: Instant,
    ) -> Result<ConnId, StackError> {
        self.check_gone()?;
        if remote.port() == 0 {
            return Err(StackError::InvalidPort);
        }
        let mut settings = params
            .settings
            .unwrap_or_else(|| self.cfg.mpa.settings.clone());
        settings.private_data = params.private_data;
        settings.ird = params.ird;
        settings.ord = params.ord;
        settings.validate()?;
        let port = self.alloc_port()?;
        let mut s = self.new_socket()?;
        s.connect(
            self.iface.context(),
            (IpAddress::Ipv4(*remote.ip()), remote.port()),
            port,
        )
        .map_err(|_| StackError::Unaddressable(remote))?;
        let handle = self.sockets.add(s);
        let id = ConnId(self.next_id());
        let local = SocketAddrV4::new(self.cfg.interface.address, port);
        let mut c = Conn::new(
            id,
            handle,
            Role::Initiator,
            local,
            remote,
            None,
            settings,
            now,
        );
        c.timer = Timer::Connect {
            deadline: now + smoltcp::time::Duration::from_micros(self.cfg.connect_timeout_us),
        };
        c.upper = Some(upper);
        self.dev
            .tracker
            .borrow_mut()
            .map
            .insert(c.key, Track::default());
        self.conns.insert(id, c);
        tracing::debug!(conn = id.0, %remote, local_port = port, "connecting");
        Ok(id)
    }

    fn cx_parts(
        &mut self,
    ) -> (
        &mut std::collections::BTreeMap<ConnId, Conn>,
        &mut SocketSet<'static>,
        Cx<'_>,
    ) {
        let mtu = self.dev.inner.link().mtu();
        let offload = self.dev.inner.offload();
        let tx_batch_max = if offload {
            TX_BATCH_BYTES.min(self.dev.inner.tcp_payload_max())
        } else {
            TX_BATCH_BYTES
        };
        (
            &mut self.conns,
            &mut self.sockets,
            Cx {
                events: &mut self.events,
                tracker: &self.dev.tracker,
                stats: &mut self.stats,
                cfg: &self.cfg,
                progress: &mut self.progress,
                listeners: &mut self.listeners,
                mtu,
                tx_batch_max,
                short_last: offload && tx_batch_max >= 2 * mss_for_mtu(mtu),
            },
        )
    }

    /// Accepts a connection reported by [`StackEvent::ConnectRequest`] with
    /// `private_data` (bytes), `ird` and `ord` (14 bits), `upper` taking its ULPDUs
    /// (iw-cm `accept`). The MPA Reply is queued; [`ConnEvent::Established`] follows at
    /// once, or [`ConnEvent::Failed`] with [`ConnError::Mpa`] if the MPA rules refuse the
    /// IRD/ORD (a reject Reply is sent then, RFC 6581).
    ///
    /// Errors (nothing changes): [`StackError::NoSuchConnection`],
    /// [`StackError::WrongState`] (not an undecided request), [`StackError::Mpa`] (e.g.
    /// private data too long, IRD over 14 bits).
    pub fn accept(
        &mut self,
        conn: ConnId,
        private_data: &[u8],
        ird: u16,
        ord: u16,
        upper: Box<dyn Ulp>,
    ) -> Result<(), StackError> {
        let c = self.undecided(conn, "accept")?;
        if let Some(m) = c.mpa.as_mut() {
            m.accept(private_data, ird, ord)?;
        }
        c.upper = Some(upper);
        self.leave_backlog(conn);
        let (conns, _, mut cx) = self.cx_parts();
        if let Some(c) = conns.get_mut(&conn) {
            c.drain_mpa(&mut cx);
        }
        self.rearm();
        Ok(())
    }

    /// Rejects a connection reported by [`StackEvent::ConnectRequest`] with a reject
    /// Reply carrying `private_data` (iw-cm `reject`); the TCP connection is then closed
    /// gracefully. No further event is reported for it.
    ///
    /// Errors (nothing changes): [`StackError::NoSuchConnection`],
    /// [`StackError::WrongState`], [`StackError::Mpa`] (private data too long).
    pub fn reject(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), StackError> {
        let c = self.undecided(conn, "reject")?;
        if let Some(m) = c.mpa.as_mut() {
            m.reject(private_data)?;
        }
        c.visible = false;
        c.final_sent = true;
        self.leave_backlog(conn);
        self.rearm();
        Ok(())
    }

    /// Closes a connection (iw-cm `disconnect`, or destroying a connecting id).
    /// Graceful: queued FPDUs go out, then FIN (MPA close, RFC 5044 7.2); before TCP is
    /// established the SYN is simply abandoned. Abortive: RST now. Either way
    /// [`ConnEvent::Closed`] is the final event (unless a failure came first). An
    /// undecided connection request is rejected (graceful) or reset (abortive).
    ///
    /// Errors: [`StackError::NoSuchConnection`]; [`StackError::WrongState`] after the
    /// final event.
    pub fn close(&mut self, conn: ConnId, mode: CloseMode) -> Result<(), StackError> {
        let undecided = self.undecided(conn, "close").is_ok();
        if undecided && mode == CloseMode::Graceful {
            return self.reject(conn, &[]);
        }
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(StackError::NoSuchConnection(conn))?;
        if c.final_sent || c.life.is_zombie() {
            return Err(StackError::WrongState {
                call: "close",
                why: "the connection already ended",
            });
        }
        if c.close == LocalClose::No {
            c.close = LocalClose::Asked;
        }
        match (mode, c.mpa.as_mut()) {
            (CloseMode::Graceful, Some(m)) => {
                if m.state() == State::FullOperation && c.upper.is_some() {
                    // What the upper still has queued goes out first.
                    c.close = LocalClose::Draining;
                } else {
                    // Err only in Closed/Failed, where the close is under way anyway.
                    let _ = m.close();
                }
            }
            _ => c.ask_abort(),
        }
        self.leave_backlog(conn);
        Ok(())
    }

    // ---- the driver's calls -------------------------------------------------------

    /// Does all the work that is due at `now` (see the module docs) and returns the
    /// next time `poll` must be called even if no frame arrives and no call is made:
    /// `Some(now)` (or earlier) when it should be called again at once, `None` when
    /// nothing is timed (idle, or the link is gone).
    pub fn poll(&mut self, now: Instant) -> Option<Instant> {
        self.poll_rounds(now, MAX_ROUNDS)
    }

    /// As [`Stack::poll`] with at most `max_rounds` connection rounds (at least 1, at
    /// most [`MAX_ROUNDS`]): the budget of a pass run inside a verbs call (siw's
    /// `SQ_USER_MAXBURST`). Work left returns `now` as the deadline, as in `poll`.
    pub fn poll_rounds(&mut self, now: Instant, max_rounds: usize) -> Option<Instant> {
        let max_rounds = max_rounds.clamp(1, MAX_ROUNDS);
        self.progress = false;
        let check_link = self.link_check_us == 0
            || self
                .link_checked
                .is_none_or(|t| now < t || micros(now) - micros(t) >= self.link_check_us);
        if check_link {
            self.link_checked = Some(now);
        }
        while let Some(ev) = check_link
            .then(|| self.dev.inner.link_mut().poll_event())
            .flatten()
        {
            self.progress = true;
            tracing::debug!(link = self.dev.inner.link().name(), event = ?ev, "link event");
            self.events.push_back(StackEvent::Link(ev));
            if let LinkEvent::Gone(reason) = ev {
                self.fail_all(ConnError::DeviceGone(reason));
                self.gone = Some(reason);
            }
        }
        if self.gone.is_some() {
            return None;
        }
        let before = self.dev.inner.stats();
        let rx_before = self.stats.stream_rx_bytes;
        self.set_syn_budget();
        self.iface.poll(now, &mut self.dev, &mut self.sockets);
        let arp_next = self.poll_neighbors(now);
        self.harvest(now);
        let mut more = false;
        let mut rounds = 0;
        loop {
            let (conns, sockets, mut cx) = self.cx_parts();
            let mut wrote = false;
            for c in conns.values_mut() {
                let sock = sockets.get_mut::<tcp::Socket>(c.handle);
                wrote |= c.service(sock, &mut cx, now);
            }
            if !wrote {
                break;
            }
            while self
                .iface
                .poll_egress(now, &mut self.dev, &mut self.sockets)
                != PollResult::None
            {}
            rounds += 1;
            if rounds >= max_rounds {
                more = true;
                break;
            }
        }
        // Everything left to send after rounds that wrote, or that consumed enough for a
        // window update to matter: closes and aborts decided in the last round, and the
        // window updates of what the rounds consumed (smoltcp sends one once the window
        // doubled since the last ACK, which went out in `poll` above, before the
        // consumption; without this pass it would wait for the next poll, and at large
        // MTUs the sender's window edge then fell inside FPDUs). Other passes skip it:
        // an egress pass scans every socket (a listener's armed pool too), which cost
        // an 8-byte ping-pong about 0.5 us per round trip when done for every message.
        let consumed = self.stats.stream_rx_bytes - rx_before;
        if rounds > 0 || consumed >= WINDOW_UPDATE_MIN {
            while self
                .iface
                .poll_egress(now, &mut self.dev, &mut self.sockets)
                != PollResult::None
            {}
        }
        self.reap(now);
        self.sweep_half_open();
        self.rearm();
        if self.dev.inner.stats() != before {
            self.progress = true;
        }
        // SYNs held for want of a socket in LISTEN go at the next poll, at once.
        self.set_syn_budget();
        if more || self.dev.gate.ready() {
            return Some(now);
        }
        let mut next = self.iface.poll_at(now, &self.sockets);
        next = match (next, arp_next) {
            (Some(n), Some(a)) => Some(n.min(a)),
            (n, a) => n.or(a),
        };
        for c in self.conns.values() {
            let t = [
                c.mpa
                    .as_ref()
                    .and_then(MpaConn::poll_timeout)
                    .map(from_micros),
                c.poll_at(),
            ];
            for t in t.into_iter().flatten() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        // smoltcp asks to be polled "now" while it has a frame to send, which it cannot
        // while the link is down: wait for the link instead of spinning.
        if !self.link().state().is_up() {
            let floor = now + smoltcp::time::Duration::from_millis(10);
            next = next.map(|n| n.max(floor));
        }
        next
    }

    /// Resolves `ip`'s Ethernet address by ARP (RFC 826), giving up `timeout_us`
    /// microseconds after `now`: a Request goes out at the next [`Stack::poll`] and every
    /// [`crate::transport::neighbor::PROBE_INTERVAL`] after, and `reply` is completed (during a
    /// later `poll`, or at once if `ip` was learned recently) with the address, or with
    /// [`NeighborError::TimedOut`](crate::transport::neighbor::NeighborError::TimedOut). Dropping
    /// the stack completes the resolutions still pending with `DeviceGone`. This is
    /// `rdma_resolve_addr`'s neighbour step (see [`crate::transport::neighbor`]).
    pub fn resolve_neighbor(
        &mut self,
        ip: Ipv4Addr,
        timeout_us: u64,
        now: Instant,
        reply: crate::transport::neighbor::NeighborReply,
    ) {
        let iface = &self.cfg.interface;
        let subnet = smoltcp::wire::Ipv4Cidr::new(iface.address, iface.prefix_len);
        let broadcast = subnet.broadcast() == Some(ip);
        let unicast = !(ip.is_multicast() || ip.is_broadcast() || ip.is_unspecified() || broadcast);
        if !subnet.contains_addr(&ip) || !unicast || ip == iface.address {
            reply.complete(Err(crate::transport::neighbor::NeighborError::NotOnLink(
                ip,
            )));
            return;
        }
        let timeout = smoltcp::time::Duration::from_micros(timeout_us);
        self.neighbors.start(ip, timeout, now, reply);
        self.progress = true;
    }

    /// Learns from the ARP frames received, times out and sends ARP Requests; the next
    /// time neighbour resolution needs a poll.
    fn poll_neighbors(&mut self, now: Instant) -> Option<Instant> {
        let seen = std::mem::take(&mut self.dev.tracker.borrow_mut().arp_seen);
        for (ip, mac) in seen {
            self.neighbors.learn(ip, mac, now);
        }
        if self.neighbors.pending() == 0 {
            return None;
        }
        let (mac, address) = (self.cfg.interface.mac, self.cfg.interface.address);
        let dev = &mut self.dev.inner;
        self.neighbors.poll(now, |target| {
            if let Some(tx) = dev.transmit(now) {
                tracing::trace!(%target, "ARP request");
                tx.consume(crate::transport::neighbor::ARP_FRAME_LEN, |frame| {
                    crate::transport::neighbor::emit_arp_request(frame, mac, address, target);
                });
            }
        })
    }

    /// Asks the link for events ([`Link::poll_event`]) at most every `us` microseconds
    /// of the `now` given to [`Stack::poll`] instead of in every poll (0, the default).
    /// A TAP link looks with an `epoll_wait` system call, a measurable share of a busy
    /// driver's time when paid on every pass; the device engine sets 1 ms.
    pub fn set_link_check_interval(&mut self, us: u64) {
        self.link_check_us = us;
    }

    /// The next event, oldest first.
    pub fn poll_event(&mut self) -> Option<StackEvent> {
        self.events.pop_front()
    }

    /// Fails every connection with `error` (final events reported), drops every socket
    /// and listener. Used for device removal and shutdown.
    fn fail_all(&mut self, error: ConnError) {
        let (conns, _, mut cx) = self.cx_parts();
        for c in conns.values_mut() {
            if c.life == Life::Active && !c.final_sent {
                c.fail(&mut cx, error.clone());
            }
        }
        let handles: Vec<SocketHandle> = self
            .conns
            .values()
            .map(|c| c.handle)
            .chain(
                self.listeners
                    .values()
                    .flat_map(|l| l.armed.iter().copied()),
            )
            .collect();
        for h in handles {
            self.sockets.remove(h);
        }
        self.conns.clear();
        self.listeners.clear();
        let mut t = self.dev.tracker.borrow_mut();
        t.map.clear();
        t.listen_ports.clear();
    }

    /// Shuts the stack down at `now`: every connection is reset (RST sent if the link
    /// is up) and fails with [`ConnError::DeviceClosed`]; listeners are removed.
    pub fn shutdown(&mut self, now: Instant) {
        if self.gone.is_some() {
            return;
        }
        for c in self.conns.values() {
            self.sockets.get_mut::<tcp::Socket>(c.handle).abort();
        }
        for l in self.listeners.values() {
            for &h in &l.armed {
                self.sockets.get_mut::<tcp::Socket>(h).abort();
            }
        }
        self.iface.poll(now, &mut self.dev, &mut self.sockets);
        self.fail_all(ConnError::DeviceClosed);
    }

    /// Removes finished connections whose sockets are done, and stale tracker entries.
    /// A closed socket whose RST cannot be sent (no ARP answer, link down) is dropped
    /// after [`ZOMBIE_LINGER_MS`].
    fn reap(&mut self, now: Instant) {
        let Stack {
            conns,
            sockets,
            listeners,
            dev,
            ..
        } = self;
        let mut tracker = dev.tracker.borrow_mut();
        conns.retain(|_, c| {
            let Life::Zombie { since } = &mut c.life else {
                return true;
            };
            let since = *since.get_or_insert(now);
            if std::mem::take(&mut c.in_backlog) {
                if let Some(l) = c.listener.and_then(|l| listeners.get_mut(&l)) {
                    l.pending = l.pending.saturating_sub(1);
                }
            }
            let s = sockets.get::<tcp::Socket>(c.handle);
            let stuck = now >= since + smoltcp::time::Duration::from_millis(ZOMBIE_LINGER_MS);
            if s.state() == tcp::State::Closed && (s.remote_endpoint().is_none() || stuck) {
                sockets.remove(c.handle);
                tracker.map.remove(&c.key);
                false
            } else {
                true
            }
        });
        // Entries of SYNs that never became connections (refused, reset in SYN-RECEIVED).
        if tracker.map.len() > 2 * conns.len() + 64 {
            let mut keep: FxHashSet<u64> = conns.values().map(|c| c.key).collect();
            for l in listeners.values() {
                for &h in &l.armed {
                    let s = sockets.get::<tcp::Socket>(h);
                    if let (Some(a), Some(b)) = (s.local_endpoint(), s.remote_endpoint()) {
                        let (a, b) = (v4(a), v4(b));
                        keep.insert(tuple_key(a.port(), *b.ip(), b.port()));
                    }
                }
            }
            tracker.map.retain(|k, _| keep.contains(k));
        }
    }
}
