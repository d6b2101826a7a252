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
//! 3. listeners: harvest listen sockets that became connections, re-arm the pool;
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
//!    `engine_pair.rs` `full_sized_fpdus_leave_whole_at_a_large_mtu`);
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
//! * Retransmissions are smoltcp's: after an RTO it resends from the oldest unacknowledged
//!   byte in MSS-sized pieces, which may cross FPDU boundaries. Receivers (ours, siw,
//!   Chelsio) reassemble the stream, so this costs only the "one FPDU per segment"
//!   optimisation, not correctness.
//!
//! # Listeners and the backlog
//!
//! smoltcp has no accept queue: a listening socket *becomes* the connection when a SYN
//! arrives. A listener with backlog `n` therefore keeps a pool of listening sockets on its
//! port: while `armed + pending < n`, a fresh socket is armed, where `pending` counts
//! connections of this listener not yet decided (TCP handshake in progress, MPA Request
//! not yet in, or [`StackEvent::ConnectRequest`] reported and neither [`Stack::accept`]ed
//! nor [`Stack::reject`]ed). When `n` connections are pending no socket listens on the
//! port, and smoltcp answers a further SYN with a RST (no socket accepts the segment, so
//! `process_tcp` replies with `rst_reply`): the initiator sees the connection refused.
//! Linux instead drops the SYN while its accept queue is full, so the client retries;
//! here the refusal is immediate and visible. The pool is re-armed at every poll. Socket
//! buffers are allocated zeroed, so an armed socket costs address space, not memory, until
//! it is used. `backlog` is at most [`MAX_BACKLOG`].
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

pub mod mpa_conn;
pub mod neighbor;
pub mod smoltcp_glue;
pub mod stream;

use std::cell::RefCell;
use std::collections::VecDeque;

use rustc_hash::{FxHashMap, FxHashSet};
use std::net::{Ipv4Addr, SocketAddrV4};

use ddp_rdmap::ddp::BufferModel;
use ddp_rdmap::rdmap::QN_TERMINATE;
use ddp_rdmap::terminate::ErrorCause;
use ddp_rdmap::{Body, Header, Opcode, Ulpdu};
use mpa::negotiate::{Agreed, LocalSettings, SettingsError};
use mpa::wire::{Limits, Repr};
use smoltcp::iface::{Interface, PollResult, SocketHandle, SocketSet};
use smoltcp::phy::{Device, DeviceCapabilities, RxToken, TxToken};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{IpAddress, IpEndpoint};

use crate::link::{GoneReason, Link, LinkError, LinkEvent};
use crate::transport::mpa_conn::{
    CallError, InitialMsn, LlpClose, MpaConfig, MpaConn, MpaError, MpaEvent, Role, State,
    DEFAULT_STARTUP_TIMEOUT_US,
};
use crate::transport::smoltcp_glue::{
    build_interface, mss_for_mtu, DeviceStats, InterfaceConfig, LinkDevice, LinkRxToken,
    LinkTxToken, TcpConfig,
};

/// Most connection rounds (one FPDU per connection each) in one [`Stack::poll`]; when
/// more work is left, `poll` returns `now` as the deadline so the driver calls again
/// (after taking in new frames), which keeps ingress from starving.
pub const MAX_ROUNDS: usize = 256;

/// Bytes of FPDUs a connection writes in one round at most (`Conn::may_batch`): at
/// MTU 1500 about 45 FPDUs; at MTUs over 32 KiB one.
const TX_BATCH_BYTES: usize = 64 * 1024;

/// Bytes a [`Stack::poll`] must have consumed from the sockets before it ends with an
/// egress pass for the window update (see the comment there): 16 KiB.
const WINDOW_UPDATE_MIN: u64 = 16 * 1024;

/// Largest listen backlog, in connections (Linux caps `listen(2)` at `somaxconn`, 4096
/// by default; each armed socket here reserves its buffers' address space).
pub const MAX_BACKLOG: usize = 1024;

/// ULPDUs a responder takes from its upper before the initiator's first FPDU arrived
/// (MPA holds them, copied, until then; RFC 5044 7.1.2): 64.
pub const MAX_HELD_ULPDUS: usize = 64;

/// Bytes of the TCP receive stream handed to [`MpaConn::handle_rx`] at once: 64 KiB.
/// Between chunks the stack delivers the ULPDUs and asks the upper for room again.
pub const RX_CHUNK: usize = 64 * 1024;

/// Default TCP connect timeout: 20 s, in microseconds (the TCP user timeout default of
/// [`TcpConfig`]).
pub const DEFAULT_CONNECT_TIMEOUT_US: u64 = 20_000_000;

/// Default time to wait for a Terminate to be acknowledged before the RST: 1 s, in
/// microseconds.
pub const DEFAULT_TERMINATE_LINGER_US: u64 = 1_000_000;

/// How long a closed socket may wait to send its RST before it is dropped anyway:
/// 1000 ms.
pub const ZOMBIE_LINGER_MS: u64 = 1000;

/// First port of the ephemeral range used for active connections (IANA, RFC 6335 6).
pub const EPHEMERAL_FIRST: u16 = 49152;

/// MSS assumed for a peer whose SYN carries no MSS option: 536 bytes (RFC 9293 3.7.1).
pub const DEFAULT_REMOTE_MSS: usize = 536;

/// Identifies a connection of one [`Stack`] (never reused by that stack).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// Identifies a listener of one [`Stack`] (never reused by that stack).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenerId(pub u64);

/// MPA defaults of a device, used for every connection unless overridden.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaDefaults {
    /// Negotiation settings (revision, CRC policy, markers, P2P and RTR kinds, IRD/ORD,
    /// private data). Default: `LocalSettings::default()`, Linux siw compatible.
    pub settings: LocalSettings,
    /// Limits for parsing the peer's Request/Reply.
    pub limits: Limits,
    /// How long to wait for the peer's Request (responder) or Reply (initiator), in
    /// microseconds from TCP establishment. Default 10 s, as [`MpaConfig`].
    pub startup_timeout_us: u64,
    /// Initiator: hold of the first FPDU after the Reply, microseconds
    /// ([`MpaConfig::first_fpdu_delay_us`]). Default 0.
    pub first_fpdu_delay_us: u64,
}

impl Default for MpaDefaults {
    fn default() -> Self {
        MpaDefaults {
            settings: LocalSettings::default(),
            limits: Limits::default(),
            startup_timeout_us: DEFAULT_STARTUP_TIMEOUT_US,
            first_fpdu_delay_us: 0,
        }
    }
}

/// Configuration of a [`Stack`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackConfig {
    /// MAC, IPv4 address, prefix, gateway and smoltcp's random seed.
    pub interface: InterfaceConfig,
    /// TCP socket settings (buffers, Nagle, keep-alive, user timeout).
    pub tcp: TcpConfig,
    /// MPA defaults.
    pub mpa: MpaDefaults,
    /// A connect fails with [`ConnError::TimedOut`] when TCP is not established this many
    /// microseconds after [`Stack::connect`]. Default [`DEFAULT_CONNECT_TIMEOUT_US`].
    pub connect_timeout_us: u64,
    /// After an error with a Terminate queued, how long to wait (microseconds) for it to
    /// be acknowledged before the RST. Default [`DEFAULT_TERMINATE_LINGER_US`].
    pub terminate_linger_us: u64,
}

impl StackConfig {
    /// A configuration with every default but the interface.
    pub fn new(interface: InterfaceConfig) -> Self {
        StackConfig {
            interface,
            tcp: TcpConfig::default(),
            mpa: MpaDefaults::default(),
            connect_timeout_us: DEFAULT_CONNECT_TIMEOUT_US,
            terminate_linger_us: DEFAULT_TERMINATE_LINGER_US,
        }
    }
}

/// The MPA parameters of one connection: what `rdma_connect` / `rdma_accept` take.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MpaParams {
    /// ULP private data for the Request, in bytes (at most 508 with Rev 2, 512 with
    /// Rev 1; RFC 5044 7.1.1, RFC 6581).
    pub private_data: Vec<u8>,
    /// Inbound RDMA Read queue depth offered (14 bits, RFC 6581).
    pub ird: u16,
    /// Outbound RDMA Read queue depth wanted (14 bits).
    pub ord: u16,
    /// Settings replacing the device's [`MpaDefaults::settings`] for this connection
    /// (their `private_data`, `ird` and `ord` are replaced by the fields above).
    pub settings: Option<LocalSettings>,
}

/// What an established connection looks like, reported once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Established {
    /// This side's role.
    pub role: Role,
    /// The agreed MPA settings, seen from this side (includes the peer's private data).
    pub agreed: Agreed,
    /// The largest ULPDU this side may send, in bytes (RFC 5044 4.5).
    pub mulpdu: usize,
    /// The EMSS of the TCP connection, in bytes (payload bytes per segment).
    pub emss: usize,
    /// First DDP MSNs the upper uses, after any RTR (RFC 5041 4.3).
    pub initial_msn: InitialMsn,
    /// Local address and port.
    pub local: SocketAddrV4,
    /// Peer address and port.
    pub remote: SocketAddrV4,
}

/// Which phase a timeout happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeoutPhase {
    /// TCP was not established in time (no SYN-ACK; e.g. no such host).
    TcpConnect,
    /// The MPA Reply did not come within the startup timeout (RFC 5044 7.1.2).
    MpaReply,
}

/// Why a connection ended abnormally (the payload of [`ConnEvent::Failed`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// The responder rejected the connection (R set in the MPA Reply, RFC 5044 7.1.1):
    /// rdma_cm's `REJECTED` with the reply's private data.
    #[error("connection rejected by the peer ({} bytes of private data)", private_data.len())]
    Rejected {
        /// The ULP private data of the reject Reply, in bytes.
        private_data: Vec<u8>,
    },
    /// The peer answered the SYN with a RST (nothing listening, or its backlog is full):
    /// `ECONNREFUSED`.
    #[error("connection refused")]
    Refused,
    /// A timeout: `ETIMEDOUT`.
    #[error("timed out ({0:?})")]
    TimedOut(TimeoutPhase),
    /// The TCP connection was reset or lost (RST received, TCP user timeout):
    /// `ECONNRESET`.
    #[error("connection reset")]
    Reset,
    /// MPA found the peer's input bad, or the negotiation failed; a Terminate was sent
    /// when one could be.
    #[error("MPA error: {0}")]
    Mpa(MpaError),
    /// The peer sent a Terminate (RFC 5040 5.3); the connection was aborted.
    #[error("Terminate received: {0}")]
    TerminateReceived(ErrorCause),
    /// The upper layer sent a Terminate ([`Ulp::poll_terminate`]); the connection was
    /// aborted after it.
    #[error("Terminate sent by the upper layer: {0:?}")]
    TerminateSent(Option<ErrorCause>),
    /// The upper layer handed over a ULPDU MPA refused.
    #[error("upper layer error: {0}")]
    Ulp(CallError),
    /// The connection could not be set up with the TCP parameters it got (e.g. an EMSS
    /// below `mpa_conn::MIN_EMSS`).
    #[error("connection setup failed: {0}")]
    Setup(String),
    /// The link is gone (device removal).
    #[error("device gone ({0:?})")]
    DeviceGone(GoneReason),
    /// The device was shut down.
    #[error("device shut down")]
    DeviceClosed,
}

/// How to close a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseMode {
    /// Send what is queued, then FIN (`shutdown(SHUT_WR)` then close; MPA graceful close,
    /// RFC 5044 7.2): the peer sees [`ConnEvent::Disconnected`] then [`ConnEvent::Closed`].
    Graceful,
    /// RST now, dropping what is queued (`SO_LINGER` 0 close): the peer sees
    /// [`ConnError::Reset`].
    Abortive,
}

/// An event of one connection. Every connection's events end with exactly one
/// [`ConnEvent::Closed`] or [`ConnEvent::Failed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnEvent {
    /// MPA negotiation succeeded; ULPDUs may be sent (iw-cm `CONNECT_REPLY` with status
    /// 0 for the initiator, `ESTABLISHED` for the responder).
    Established(Established),
    /// The peer closed its half (FIN, iw-cm `DISCONNECT`); the stack closes this side in
    /// turn, and [`ConnEvent::Closed`] follows.
    Disconnected,
    /// Final: the TCP connection is closed (after a graceful close by either side, or a
    /// local abort). iw-cm `CLOSE`.
    Closed,
    /// Final: the connection failed.
    Failed(ConnError),
}

impl ConnEvent {
    /// `true` for the final events, [`ConnEvent::Closed`] and [`ConnEvent::Failed`].
    pub fn is_final(&self) -> bool {
        matches!(self, ConnEvent::Closed | ConnEvent::Failed(_))
    }
}

/// A connection request that reached a listener: the peer's valid MPA Request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequestInfo {
    /// The listener it came to.
    pub listener: ListenerId,
    /// The new connection; answer with [`Stack::accept`] or [`Stack::reject`].
    pub conn: ConnId,
    /// Local address and port.
    pub local: SocketAddrV4,
    /// Peer address and port.
    pub remote: SocketAddrV4,
    /// The peer's MPA Request (revision, flags, IRD/ORD word, private data).
    pub request: Repr,
}

/// What a [`Stack`] reports, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StackEvent {
    /// A valid MPA Request arrived on a listener (iw-cm `CONNECT_REQUEST`).
    ConnectRequest(ConnectRequestInfo),
    /// An event of a connection the user knows of (one made by [`Stack::connect`], or one
    /// reported by a [`StackEvent::ConnectRequest`]).
    Conn {
        /// The connection.
        conn: ConnId,
        /// What happened.
        event: ConnEvent,
    },
    /// The link changed state. After `Gone`, every connection has failed with
    /// [`ConnError::DeviceGone`] and every listener is removed.
    Link(LinkEvent),
}

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

/// The framing callback handed to [`Ulp::poll_ulpdu`]: takes the parts of one ULPDU
/// (their concatenation is the ULPDU) and frames them into an FPDU.
pub type EmitUlpdu<'a> = dyn FnMut(&[&[u8]]) -> Result<(), CallError> + 'a;

/// The upper layer of one connection: consumes received ULPDUs and supplies ULPDUs to
/// send. Called only from [`Stack`] methods, on the thread driving the stack (the engine
/// thread), so implementations must not block (the stream upper only takes a short lock;
/// the QP engine will only touch its own state).
pub trait Ulp: Send {
    /// MPA full operation was reached (RFC 5044 7.1.2; for the responder, at `accept`,
    /// before the initiator's first FPDU).
    fn on_established(&mut self, info: &Established);

    /// How many more bytes of ULPDUs the upper can take now. While it is 0 the stack
    /// stops reading the socket, so TCP's window closes (receive backpressure). The
    /// bound is soft: up to [`RX_CHUNK`] bytes of ULPDUs may arrive beyond it.
    fn rx_room(&mut self) -> usize;

    /// One received ULPDU (one DDP segment: no MPA length, pad, markers or CRC), CRC
    /// already checked.
    fn on_ulpdu(&mut self, ulpdu: Vec<u8>);

    /// Zero-copy receive: a received ULPDU offered in place, in the TCP receive
    /// buffer (or the MPA deframer's buffer when the FPDU arrived in pieces), CRC
    /// already checked, whenever nothing is queued ahead of it. Return true if it was
    /// consumed; false hands it over as [`Ulp::on_ulpdu`] instead (a copy). The
    /// peer's Terminate is never offered here (see [`Ulp::on_terminate`]). Default:
    /// false.
    fn on_ulpdu_in_place(&mut self, ulpdu: &[u8]) -> bool {
        let _ = ulpdu;
        false
    }

    /// The receive path handed over everything it will in this pass (called after every
    /// pass over the socket's bytes, before the pass's events are reported): an upper
    /// that stages ULPDUs taken by [`Ulp::on_ulpdu_in_place`] makes them visible now.
    /// Default: nothing.
    fn rx_done(&mut self) {}

    /// The peer's Terminate ULPDU (RFC 5040 5.3), shown before the connection fails
    /// with [`ConnError::TerminateReceived`] (no further ULPDU follows). Default:
    /// nothing.
    fn on_terminate(&mut self, ulpdu: &[u8]) {
        let _ = ulpdu;
    }

    /// Called when the connection can take one more ULPDU: full operation, everything
    /// written before went out, and the socket has room for a whole FPDU. Call `emit` at
    /// most once with the ULPDU's parts (1..=`mulpdu` bytes in total; e.g. a DDP header
    /// and a payload slice of a memory region), which frames them with MPA (one copy,
    /// CRC in the same pass). Return whether a ULPDU was emitted; an error (from `emit`
    /// or the upper's own) fails the connection with [`ConnError::Ulp`].
    fn poll_ulpdu(&mut self, mulpdu: usize, emit: &mut EmitUlpdu<'_>) -> Result<bool, CallError>;

    /// A Terminate ULPDU the upper wants sent (RFC 5040 5.3, e.g. after a DDP or RDMAP
    /// error it detected). The stack sends it as the last FPDU, then aborts the
    /// connection ([`ConnError::TerminateSent`]). Default: never.
    fn poll_terminate(&mut self) -> Option<Vec<u8>> {
        None
    }

    /// The peer closed its half gracefully ([`ConnEvent::Disconnected`]). Default: nothing.
    fn on_disconnected(&mut self) {}

    /// Final: the connection closed gracefully or was aborted locally.
    fn on_closed(&mut self);

    /// Final: the connection failed (also before establishment: rejected, refused, ...).
    fn on_error(&mut self, error: &ConnError);
}

/// A test hook on the receive path: called with the stream offset (bytes since the first
/// byte received on the connection, i.e. the first byte of the MPA Request or Reply) and
/// each newly received chunk of the TCP byte stream, before MPA sees it. It may change the
/// bytes, e.g. to emulate corruption that TCP's checksum did not catch.
pub type RxHook = Box<dyn FnMut(u64, &mut [u8]) + Send>;

// ---------------------------------------------------------------------------------------
// Per-4-tuple transmit tracking (see "One FPDU per TCP segment").

/// What the device wrapper learned about one TCP connection from its frames.
#[derive(Debug, Clone, Copy, Default)]
struct Track {
    /// One past the highest sequence number sent (SYN and FIN count).
    snd_max: Option<u32>,
    /// The MSS option of the peer's SYN (536 when absent).
    remote_mss: Option<u16>,
    /// Our SYN carried a window scale option (RFC 7323 2.2).
    wscale_sent: bool,
    /// The window scale option of the peer's SYN (shift count), if it had one.
    peer_wscale: Option<u8>,
    /// Right edge of the peer's receive window: acknowledgment number plus the scaled
    /// window of the latest ACK received (sequence space), once one arrived.
    wnd_edge: Option<u32>,
    /// The acknowledgment number of that ACK.
    wnd_ack: Option<u32>,
}

impl Track {
    /// Octets of sequence space the peer's window, as of the last pure ACK taken
    /// (`SegTracker::on_rx_ack`), still allows beyond `snd_max`; `None` before one.
    fn window_room(&self) -> Option<u32> {
        let room = self.wnd_edge?.wrapping_sub(self.snd_max?);
        // An edge behind what was sent (a shrunk window) leaves no room.
        Some(if (room as i32) < 0 { 0 } else { room })
    }
}

#[derive(Debug, Default)]
struct SegTracker {
    map: FxHashMap<u64, Track>,
    listen_ports: Vec<u16>,
    /// Senders of the ARP frames received since the last poll (`crate::transport::neighbor`).
    arp_seen: Vec<(Ipv4Addr, [u8; 6])>,
}

fn tuple_key(local_port: u16, remote: Ipv4Addr, remote_port: u16) -> u64 {
    (u64::from(u32::from(remote)) << 32) | (u64::from(remote_port) << 16) | u64::from(local_port)
}

/// The TCP fields the tracker needs, from an Ethernet/IPv4/TCP frame.
struct SegInfo {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
    seq: u32,
    seg_len: u32,
    syn: bool,
    ack: bool,
    mss: Option<u16>,
    /// Window scale option (shift count), SYNs only.
    wscale: Option<u8>,
    ack_no: u32,
    window: u16,
}

const TCP_SYN: u8 = 0x02;
const TCP_FIN: u8 = 0x01;
const TCP_ACK: u8 = 0x10;

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Parses the TCP header of an Ethernet II / IPv4 frame; `None` for anything else.
/// With `verify`, the IPv4 header and TCP checksums must be right (received frames may be
/// corrupted; smoltcp drops those, and so must the tracker).
fn parse_seg(frame: &[u8], verify: bool) -> Option<SegInfo> {
    if be16(frame, 12)? != 0x0800 {
        return None;
    }
    let ip = frame.get(14..)?;
    let ihl = usize::from(*ip.first()? & 0x0f) * 4;
    if *ip.first()? >> 4 != 4 || ihl < 20 || *ip.get(9)? != 6 {
        return None;
    }
    let total = usize::from(be16(ip, 2)?);
    let ip = ip.get(..total)?;
    let tcp = ip.get(ihl..)?;
    let doff = usize::from(*tcp.get(12)? >> 4) * 4;
    if doff < 20 || doff > tcp.len() {
        return None;
    }
    let src = Ipv4Addr::from(be32(ip, 12)?);
    let dst = Ipv4Addr::from(be32(ip, 16)?);
    if verify {
        let hdr = smoltcp::wire::Ipv4Packet::new_checked(ip).ok()?;
        if !hdr.verify_checksum() {
            return None;
        }
        let seg = smoltcp::wire::TcpPacket::new_checked(tcp).ok()?;
        if !seg.verify_checksum(&IpAddress::Ipv4(src), &IpAddress::Ipv4(dst)) {
            return None;
        }
    }
    let flags = *tcp.get(13)?;
    let syn = flags & TCP_SYN != 0;
    let fin = flags & TCP_FIN != 0;
    let mut mss = None;
    let mut wscale = None;
    if syn {
        let mut opts = tcp.get(20..doff)?;
        while let Some(&kind) = opts.first() {
            match kind {
                0 => break,
                1 => opts = &opts[1..],
                _ => {
                    let len = usize::from(*opts.get(1)?);
                    if len < 2 || len > opts.len() {
                        break;
                    }
                    if kind == 2 && len == 4 {
                        mss = be16(opts, 2);
                    }
                    if kind == 3 && len == 3 {
                        // RFC 7323 2.3: a shift over 14 is taken as 14.
                        wscale = Some(opts[2].min(14));
                    }
                    opts = &opts[len..];
                }
            }
        }
    }
    let payload = tcp.len() - doff;
    Some(SegInfo {
        src,
        dst,
        src_port: be16(tcp, 0)?,
        dst_port: be16(tcp, 2)?,
        seq: be32(tcp, 4)?,
        seg_len: u32::try_from(payload).ok()? + u32::from(syn) + u32::from(fin),
        syn,
        ack: flags & TCP_ACK != 0,
        mss,
        wscale,
        ack_no: be32(tcp, 8)?,
        window: be16(tcp, 14)?,
    })
}

/// Whether an Ethernet / IPv4 (no options) / TCP frame has payload. Windows are taken
/// from pure ACKs only (`SegTracker::on_rx`): a receiving side skips the work for every
/// data segment, and the window edge of an older ACK is never beyond the current one
/// (windows do not shrink, RFC 9293 3.8.6), so missing one only writes fewer FPDUs ahead.
/// (With traffic both ways most windows ride on data segments, and few FPDUs are written
/// ahead.)
fn carries_data(frame: &[u8]) -> bool {
    match (frame.get(14), frame.get(16..18), frame.get(46)) {
        (Some(0x45), Some(&[hi, lo]), Some(&off)) => {
            usize::from(u16::from_be_bytes([hi, lo])) > 20 + usize::from(off >> 4) * 4
        }
        _ => false,
    }
}

/// The sending side's key, sequence number and length in sequence space of a segment
/// without SYN, read at the fixed offsets of an Ethernet II / IPv4 frame without IP
/// options (all that smoltcp sends); `None` for anything else (the caller falls back to
/// [`parse_seg`]). It runs for every frame sent.
#[inline]
fn quick_tx(frame: &[u8]) -> Option<(u64, u32, u32)> {
    let h: &[u8; 48] = frame.get(..48)?.try_into().ok()?;
    let flags = h[47];
    if h[12..14] != [0x08, 0x00] || h[14] != 0x45 || h[23] != 6 || flags & TCP_SYN != 0 {
        return None;
    }
    let total = u32::from(u16::from_be_bytes([h[16], h[17]]));
    let doff = u32::from(h[46] >> 4) * 4;
    let payload = total.checked_sub(20 + doff)?;
    let dst = Ipv4Addr::new(h[30], h[31], h[32], h[33]);
    let key = tuple_key(
        u16::from_be_bytes([h[34], h[35]]),
        dst,
        u16::from_be_bytes([h[36], h[37]]),
    );
    let seq = u32::from_be_bytes([h[38], h[39], h[40], h[41]]);
    Some((key, seq, payload + u32::from(flags & TCP_FIN != 0)))
}

impl SegTracker {
    fn on_tx(&mut self, frame: &[u8]) {
        // The common case (every data segment): no SYN, so the entry exists or the
        // segment is not ours to track.
        if let Some((key, seq, seg_len)) = quick_tx(frame) {
            if let Some(e) = self.map.get_mut(&key) {
                let end = seq.wrapping_add(seg_len);
                if e.snd_max.is_none_or(|m| (end.wrapping_sub(m) as i32) > 0) {
                    e.snd_max = Some(end);
                }
            }
            return;
        }
        let Some(seg) = parse_seg(frame, false) else {
            return;
        };
        let k = tuple_key(seg.src_port, seg.dst, seg.dst_port);
        let entry = if seg.syn {
            self.map.entry(k).or_default()
        } else {
            match self.map.get_mut(&k) {
                Some(e) => e,
                None => return,
            }
        };
        if seg.syn {
            entry.wscale_sent = seg.wscale.is_some();
            entry.wnd_edge = None;
            entry.wnd_ack = None;
        }
        let end = seg.seq.wrapping_add(seg.seg_len);
        entry.snd_max = match entry.snd_max {
            // A SYN (re)starts the sequence space: a new connection on a reused 4-tuple.
            Some(m) if !seg.syn && (end.wrapping_sub(m) as i32) <= 0 => Some(m),
            _ => Some(end),
        };
    }

    fn on_rx(&mut self, frame: &[u8]) {
        if frame.get(12..14) == Some(&[0x08, 0x06]) {
            self.arp_seen
                .extend(crate::transport::neighbor::arp_sender(frame));
            return;
        }
        // Look at the flags before verifying anything: SYNs (their options are kept) and
        // pure ACKs (their window decides how many FPDUs `Conn::tx` writes ahead) are
        // verified, as smoltcp verifies them: a window from a frame smoltcp dropped would
        // be ahead of smoltcp's, and every FPDU written ahead into it would straddle two
        // segments (breaker_batching.rs). Data segments are not looked at.
        let Some(&flags) = frame
            .get(14)
            .map(|b| usize::from(b & 0x0f) * 4)
            .and_then(|ihl| frame.get(14 + ihl + 13))
        else {
            return;
        };
        if flags & TCP_SYN == 0 {
            if flags & TCP_ACK != 0 && !carries_data(frame) {
                self.on_rx_ack(frame);
            }
            return;
        }
        let Some(seg) = parse_seg(frame, true) else {
            return;
        };
        let k = tuple_key(seg.dst_port, seg.src, seg.src_port);
        let mss = Some(seg.mss.unwrap_or(DEFAULT_REMOTE_MSS as u16));
        let entry = if seg.ack {
            self.map.get_mut(&k)
        } else if self.listen_ports.contains(&seg.dst_port) {
            Some(self.map.entry(k).or_default())
        } else {
            None
        };
        if let Some(e) = entry {
            e.remote_mss = mss;
            e.peer_wscale = seg.wscale;
            e.wnd_edge = None;
            e.wnd_ack = None;
        }
    }

    /// Takes the peer's window from a pure ACK of a known connection, as smoltcp does
    /// (RFC 9293 3.10.7.4): checksums right, acknowledging nothing beyond what was sent,
    /// and not older than the ACK the current window came from (a reordered old ACK,
    /// which smoltcp ignores).
    fn on_rx_ack(&mut self, frame: &[u8]) {
        let Some(seg) = parse_seg(frame, true) else {
            return;
        };
        let k = tuple_key(seg.dst_port, seg.src, seg.src_port);
        let Some(e) = self.map.get_mut(&k) else {
            return;
        };
        let Some(snd_max) = e.snd_max else { return };
        if (seg.ack_no.wrapping_sub(snd_max) as i32) > 0
            || e.wnd_ack
                .is_some_and(|last| (seg.ack_no.wrapping_sub(last) as i32) < 0)
        {
            return;
        }
        e.wnd_ack = Some(seg.ack_no);
        let shift = match (e.wscale_sent, e.peer_wscale) {
            (true, Some(s)) => s,
            _ => 0,
        };
        e.wnd_edge = Some(seg.ack_no.wrapping_add(u32::from(seg.window) << shift));
    }

    fn get(&self, key: u64) -> Track {
        self.map.get(&key).copied().unwrap_or_default()
    }
}

/// The smoltcp device: a [`LinkDevice`] whose tokens show each frame to the tracker.
struct TrackedDevice<L> {
    inner: LinkDevice<L>,
    tracker: RefCell<SegTracker>,
}

struct TrackedRx<'a> {
    inner: LinkRxToken<'a>,
    tracker: &'a RefCell<SegTracker>,
}

struct TrackedTx<'a, L> {
    inner: LinkTxToken<'a, L>,
    tracker: &'a RefCell<SegTracker>,
}

impl RxToken for TrackedRx<'_> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        let tracker = self.tracker;
        self.inner.consume(|frame| {
            tracker.borrow_mut().on_rx(frame);
            f(frame)
        })
    }
}

impl<L: Link> TxToken for TrackedTx<'_, L> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let tracker = self.tracker;
        self.inner.consume(len, |frame| {
            let r = f(frame);
            tracker.borrow_mut().on_tx(frame);
            r
        })
    }
}

impl<L: Link> Device for TrackedDevice<L> {
    type RxToken<'a>
        = TrackedRx<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = TrackedTx<'a, L>
    where
        Self: 'a;

    fn receive(&mut self, timestamp: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let tracker = &self.tracker;
        let (rx, tx) = self.inner.receive(timestamp)?;
        Some((
            TrackedRx { inner: rx, tracker },
            TrackedTx { inner: tx, tracker },
        ))
    }

    fn transmit(&mut self, timestamp: Instant) -> Option<Self::TxToken<'_>> {
        let tracker = &self.tracker;
        let tx = self.inner.transmit(timestamp)?;
        Some(TrackedTx { inner: tx, tracker })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        self.inner.capabilities()
    }
}

// ---------------------------------------------------------------------------------------
// Connections.

/// Where a connection is in its life, as far as the stack's bookkeeping goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// Being serviced.
    Active,
    /// Final event given (or never visible); waiting for the socket to finish (RST sent,
    /// TIME-WAIT over) before removal.
    Zombie,
}

struct Conn {
    id: ConnId,
    handle: SocketHandle,
    role: Role,
    key: u64,
    local: SocketAddrV4,
    remote: SocketAddrV4,
    listener: Option<ListenerId>,
    settings: LocalSettings,
    /// `debug` span of this connection (id, role, peer), entered while it is serviced.
    span: tracing::Span,
    connect_started: Instant,
    connect_deadline: Option<Instant>,
    mpa: Option<MpaConn>,
    upper: Option<Box<dyn Ulp>>,
    emss: usize,
    life: Life,
    /// When the connection became a zombie (set by the reaper).
    zombie_since: Option<Instant>,
    /// The user knows of this connection (initiator; responder after ConnectRequest).
    visible: bool,
    /// Counts against its listener's backlog.
    in_backlog: bool,
    final_sent: bool,
    close_requested: bool,
    /// Graceful close asked in full operation: MPA closes once the upper's queue is empty.
    close_pending: bool,
    aborted: bool,
    abort_now: bool,
    peer_fin_seen: bool,
    tcp_closed_reported: bool,
    /// The TCP connection is closed: nothing can be sent any more.
    tcp_dead: bool,
    fin_sent: bool,
    rx_stopped: bool,
    terminate_queued: bool,
    /// The upper sent a Terminate: abort once it is out.
    ulp_terminated: bool,
    linger_deadline: Option<Instant>,
    written: u64,
    snd_base: Option<u32>,
    rx_offset: u64,
    hooked_upto: u64,
    hook: Option<RxHook>,
}

/// Borrowed stack state a connection works with.
struct Cx<'a> {
    events: &'a mut VecDeque<StackEvent>,
    tracker: &'a RefCell<SegTracker>,
    stats: &'a mut StackStats,
    cfg: &'a StackConfig,
    progress: &'a mut bool,
    /// The link's IP MTU in bytes.
    mtu: usize,
}

fn micros(t: Instant) -> u64 {
    u64::try_from(t.total_micros()).unwrap_or(0)
}

fn from_micros(us: u64) -> Instant {
    Instant::from_micros(i64::try_from(us).unwrap_or(i64::MAX))
}

fn v4(ep: IpEndpoint) -> SocketAddrV4 {
    #[allow(unreachable_patterns)] // IPv6 exists only if another crate turns it on
    match ep.addr {
        IpAddress::Ipv4(a) => SocketAddrV4::new(a, ep.port),
        _ => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, ep.port),
    }
}

/// The ULPDU of a Terminate with only the error (M = D = R = 0; RFC 5040 4.8), on the
/// Terminate queue (QN 2) with MSN 1: the first and only message of that queue.
fn terminate_ulpdu(cause: ErrorCause) -> Option<Vec<u8>> {
    let repr = ddp_rdmap::terminate::Repr::for_error(cause, None);
    let u = Ulpdu {
        header: Header {
            opcode: Opcode::Terminate,
            last: true,
            buffer: BufferModel::Untagged {
                rsvd_ulp: 0,
                qn: QN_TERMINATE,
                msn: 1,
                mo: 0,
            },
        },
        body: Body::Terminate(repr),
        payload: &[],
        len: 0,
    };
    let mut out = vec![0u8; u.buffer_len()];
    u.emit(&mut out).ok()?;
    Some(out)
}

/// The cheap test of [`terminate_cause_of`]: untagged (T = 0) with DV = 01, RV = 01
/// and opcode 7.
fn might_be_terminate(ulpdu: &[u8]) -> bool {
    ulpdu.len() >= 2 && ulpdu[0] & 0x83 == 0x01 && ulpdu[1] & 0xcf == 0x47
}

/// The cause of a Terminate message, if `ulpdu` is one (RDMAP opcode 7 on QN 2).
///
/// A malformed Terminate (a valid untagged DDP/RDMAP header with opcode 7 on QN 2,
/// but too short to hold the Terminate Control word, or with junk after it) is still
/// the peer ending the stream, as the QP engine treats it (RFC 5040 §7: never
/// answered with a Terminate): its cause is the raw Layer/EType/Error Code triple
/// when those bytes are there, else [`ErrorCause::Unrecognized`] `0xf/0xf/0xff`.
fn terminate_cause_of(ulpdu: &[u8]) -> Option<ErrorCause> {
    if !might_be_terminate(ulpdu) {
        return None;
    }
    match Ulpdu::parse(ulpdu) {
        Ok(u) => match u.body {
            Body::Terminate(t) => Some(t.cause),
            _ => None,
        },
        Err(_) => match Header::parse(ulpdu) {
            Ok(h) if h.opcode == Opcode::Terminate && h.qn() == Some(QN_TERMINATE) => {
                let hlen = h.buffer_len();
                Some(match ulpdu.get(hlen..hlen + 2) {
                    Some(&[lt, code]) => ErrorCause::from_raw(lt >> 4, lt & 0x0f, code),
                    _ => ErrorCause::Unrecognized {
                        layer: 0x0f,
                        etype: 0x0f,
                        code: 0xff,
                    },
                })
            }
            _ => None,
        },
    }
}

impl Conn {
    fn emit(&mut self, cx: &mut Cx, event: ConnEvent) {
        if !self.visible || self.final_sent {
            return;
        }
        *cx.progress = true;
        if event.is_final() {
            self.final_sent = true;
            if let Some(u) = self.upper.as_mut() {
                match &event {
                    ConnEvent::Failed(e) => u.on_error(e),
                    _ => u.on_closed(),
                }
            }
        }
        cx.events.push_back(StackEvent::Conn {
            conn: self.id,
            event,
        });
    }

    fn fail(&mut self, cx: &mut Cx, error: ConnError) {
        if !self.visible && !self.final_sent {
            cx.stats.startup_failures += 1;
            self.final_sent = true;
            return;
        }
        self.emit(cx, ConnEvent::Failed(error));
    }

    fn unsent(&self, cx: &Cx) -> usize {
        self.unsent_by(&cx.tracker.borrow().get(self.key))
    }

    /// Bytes written into the socket and not yet transmitted, by `track`.
    fn unsent_by(&self, track: &Track) -> usize {
        let Some(snd_max) = track.snd_max else {
            return 0;
        };
        let Some(base) = self.snd_base else {
            return 0;
        };
        let sent = snd_max.wrapping_sub(base);
        let unsent = (self.written as u32).wrapping_sub(sent);
        // A FIN counts in snd_max; anything absurd means "nothing to wait for".
        if unsent as i32 <= 0 {
            0
        } else {
            unsent as usize
        }
    }

    /// Whether another FPDU may be written behind the one just written, whose `direct`
    /// bytes went straight into the socket, before that one is on the wire ("One FPDU per
    /// TCP segment" in the module docs): only if that FPDU fills a segment exactly (so
    /// smoltcp, which cuts segments of EMSS from the first unsent byte, ends a segment
    /// at its end), MPA holds nothing, the connection is still in full operation, and the
    /// peer's window takes all that is unsent plus one more full segment (so no segment
    /// is cut short by the window).
    fn may_batch(&mut self, cx: &Cx, direct: usize) -> bool {
        // smoltcp takes an MSS option below 48 as 48 (`MIN_REMOTE_MSS`): its segments would
        // then not end where our EMSS-sized FPDUs do.
        if direct != self.emss
            || self.emss < 48
            || self.final_sent
            || self.abort_now
            || self.close_pending
        {
            return false;
        }
        if !self
            .mpa
            .as_ref()
            .is_some_and(|m| m.transmit_pending() == 0 && m.state() == State::FullOperation)
        {
            return false;
        }
        let track = cx.tracker.borrow().get(self.key);
        let Some(room) = track.window_room() else {
            return false;
        };
        self.unsent_by(&track) + self.emss <= room as usize
    }

    /// Creates the MPA endpoint once TCP is established.
    fn start_mpa(&mut self, cx: &mut Cx, now: Instant) {
        let local_mss = mss_for_mtu(cx.mtu);
        let remote_mss = cx
            .tracker
            .borrow()
            .get(self.key)
            .remote_mss
            .map_or(local_mss, usize::from);
        self.emss = local_mss.min(remote_mss);
        self.snd_base = cx.tracker.borrow().get(self.key).snd_max;
        cx.stats.tcp_established += 1;
        *cx.progress = true;
        let cfg = MpaConfig {
            settings: self.settings.clone(),
            limits: cx.cfg.mpa.limits,
            emss: self.emss,
            startup_timeout_us: cx.cfg.mpa.startup_timeout_us,
            first_fpdu_delay_us: cx.cfg.mpa.first_fpdu_delay_us,
        };
        let made = match self.role {
            Role::Initiator => MpaConn::initiator(cfg, micros(now)),
            Role::Responder => MpaConn::responder(cfg, micros(now)),
        };
        match made {
            Ok(m) => {
                tracing::debug!(conn = self.id.0, emss = self.emss, role = ?self.role, "TCP established");
                self.connect_deadline = None;
                self.mpa = Some(m);
            }
            Err(e) => {
                self.abort_now = true;
                self.fail(cx, ConnError::Setup(e.to_string()));
            }
        }
    }

    fn drain_mpa(&mut self, cx: &mut Cx) {
        while let Some(ev) = self.mpa.as_mut().and_then(MpaConn::poll_event) {
            self.on_mpa_event(cx, ev);
        }
    }

    fn on_mpa_event(&mut self, cx: &mut Cx, ev: MpaEvent) {
        *cx.progress = true;
        match ev {
            MpaEvent::ConnectRequest { request } => {
                self.visible = true;
                let listener = self.listener.unwrap_or(ListenerId(0));
                tracing::debug!(conn = self.id.0, remote = %self.remote, "MPA Request received");
                cx.events
                    .push_back(StackEvent::ConnectRequest(ConnectRequestInfo {
                        listener,
                        conn: self.id,
                        local: self.local,
                        remote: self.remote,
                        request,
                    }));
            }
            MpaEvent::Established { agreed } => {
                let Some(mpa) = self.mpa.as_ref() else { return };
                let info = Established {
                    role: self.role,
                    mulpdu: mpa.mulpdu().unwrap_or(0),
                    emss: self.emss,
                    initial_msn: mpa.initial_msn().unwrap_or(InitialMsn {
                        send_tx: 1,
                        send_rx: 1,
                        read_tx: 1,
                        read_rx: 1,
                    }),
                    agreed,
                    local: self.local,
                    remote: self.remote,
                };
                cx.stats.mpa_established += 1;
                tracing::debug!(conn = self.id.0, mulpdu = info.mulpdu, "MPA established");
                if let Some(u) = self.upper.as_mut() {
                    u.on_established(&info);
                }
                self.emit(cx, ConnEvent::Established(info));
            }
            MpaEvent::Rejected { private_data } => {
                self.fail(cx, ConnError::Rejected { private_data });
            }
            MpaEvent::Ulpdu(ulpdu) => {
                if self.rx_stopped || self.final_sent {
                    return;
                }
                cx.stats.ulpdus_rx += 1;
                if let Some(cause) = terminate_cause_of(&ulpdu) {
                    cx.stats.terminates_received += 1;
                    tracing::debug!(conn = self.id.0, %cause, "Terminate received");
                    self.rx_stopped = true;
                    self.abort_now = true;
                    if let Some(u) = self.upper.as_mut() {
                        u.on_terminate(&ulpdu);
                    }
                    self.fail(cx, ConnError::TerminateReceived(cause));
                } else if let Some(u) = self.upper.as_mut() {
                    u.on_ulpdu(ulpdu);
                }
            }
            MpaEvent::Error(e) => {
                tracing::debug!(conn = self.id.0, error = %e, "MPA error");
                if matches!(e, MpaError::Crc { .. }) {
                    cx.stats.crc_errors += 1;
                }
                self.rx_stopped = true;
                if let (Some(cause), Some(mpa)) = (e.terminate_cause(), self.mpa.as_mut()) {
                    if mpa.can_send_terminate() && !self.tcp_dead {
                        if let Some(t) = terminate_ulpdu(cause) {
                            if mpa.send_terminate(&[&t]).is_ok() {
                                self.terminate_queued = true;
                                cx.stats.terminates_sent += 1;
                            }
                        }
                    }
                }
                let error = match e {
                    MpaError::Timeout { .. } => ConnError::TimedOut(TimeoutPhase::MpaReply),
                    MpaError::PeerClosedDuringStartup { graceful: false }
                    | MpaError::ConnectionLost {
                        graceful: false, ..
                    } => ConnError::Reset,
                    e => ConnError::Mpa(e),
                };
                self.fail(cx, error);
            }
            MpaEvent::Closed => {
                if !self.close_requested && !self.final_sent && self.visible {
                    if let Some(u) = self.upper.as_mut() {
                        u.on_disconnected();
                    }
                    cx.events.push_back(StackEvent::Conn {
                        conn: self.id,
                        event: ConnEvent::Disconnected,
                    });
                }
            }
        }
    }

    /// The receive path: socket bytes into MPA while the upper has room; then the upper
    /// is told the pass is over ([`Ulp::rx_done`]).
    fn rx(&mut self, sock: &mut tcp::Socket<'static>, cx: &mut Cx, now_us: u64) {
        self.rx_pass(sock, cx, now_us);
        if let Some(u) = self.upper.as_mut() {
            u.rx_done();
        }
    }

    fn rx_pass(&mut self, sock: &mut tcp::Socket<'static>, cx: &mut Cx, now_us: u64) {
        loop {
            if self.rx_stopped || !sock.can_recv() {
                return;
            }
            let room = match self.upper.as_mut() {
                Some(u) => u.rx_room(),
                None => usize::MAX,
            };
            if room == 0 {
                return;
            }
            let limit = room.min(RX_CHUNK);
            let Some(mpa) = self.mpa.as_mut() else { return };
            let offset = self.rx_offset;
            let hooked_upto = &mut self.hooked_upto;
            let hook = &mut self.hook;
            // ULPDUs go to the upper in place while the connection is live; a
            // Terminate takes the event path (the connection ends there).
            let upper = if self.final_sent {
                None
            } else {
                self.upper.as_mut()
            };
            let stats = &mut *cx.stats;
            let used = sock.recv(|buf| {
                let n = buf.len().min(limit);
                let buf = &mut buf[..n];
                if let Some(hook) = hook.as_mut() {
                    let end = offset + n as u64;
                    if end > *hooked_upto {
                        let from = (*hooked_upto).max(offset);
                        hook(from, &mut buf[(from - offset) as usize..]);
                        *hooked_upto = end;
                    }
                }
                let used = match upper {
                    Some(u) => mpa.handle_rx_in_place(buf, now_us, &mut |ulpdu: &[u8]| {
                        if might_be_terminate(ulpdu) || !u.on_ulpdu_in_place(ulpdu) {
                            return false;
                        }
                        stats.ulpdus_rx += 1;
                        true
                    }),
                    None => mpa.handle_rx(buf, now_us),
                };
                (used, used)
            });
            match used {
                Ok(0) | Err(_) => {
                    self.drain_mpa(cx);
                    return;
                }
                Ok(n) => {
                    self.rx_offset += n as u64;
                    cx.stats.stream_rx_bytes += n as u64;
                    *cx.progress = true;
                    self.drain_mpa(cx);
                }
            }
        }
    }

    /// Writes MPA's pending bytes into the socket if they fit whole (or if they could
    /// never fit). Returns the bytes written.
    fn write_pending(&mut self, sock: &mut tcp::Socket<'static>, cx: &mut Cx) -> usize {
        let Some(mpa) = self.mpa.as_mut() else {
            return 0;
        };
        let Some(data) = mpa.poll_transmit() else {
            return 0;
        };
        let free = sock.send_capacity() - sock.send_queue();
        if data.len() > free && data.len() <= sock.send_capacity() {
            return 0;
        }
        match sock.send_slice(data) {
            Ok(n) if n > 0 => {
                // Cannot fail: n <= what poll_transmit offered.
                let _ = mpa.transmit_done(n);
                self.written += n as u64;
                cx.stats.stream_tx_bytes += n as u64;
                *cx.progress = true;
                n
            }
            _ => 0,
        }
    }

    /// The transmit and closing path; returns whether bytes went into the socket.
    fn tx(&mut self, sock: &mut tcp::Socket<'static>, cx: &mut Cx, now: Instant) -> bool {
        if self.aborted {
            return false;
        }
        if self.abort_now {
            sock.abort();
            self.aborted = true;
            *cx.progress = true;
            return false;
        }
        let Some(mpa) = self.mpa.as_ref() else {
            return false;
        };
        let close = if self.ulp_terminated {
            Some(LlpClose::Abort)
        } else {
            mpa.llp_close()
        };
        let pending = mpa.transmit_pending();
        let mpa_state = mpa.state();
        let mut wrote = false;
        match close {
            Some(LlpClose::Abort) => {
                if !self.terminate_queued {
                    sock.abort();
                    self.aborted = true;
                    *cx.progress = true;
                    return false;
                }
                let deadline = *self.linger_deadline.get_or_insert(
                    now + smoltcp::time::Duration::from_micros(cx.cfg.terminate_linger_us),
                );
                if pending > 0 && self.unsent(cx) == 0 {
                    wrote = self.write_pending(sock, cx) > 0;
                }
                let pending = self.mpa.as_ref().map_or(0, MpaConn::transmit_pending);
                if (pending == 0 && sock.send_queue() == 0) || now >= deadline || !sock.may_send() {
                    sock.abort();
                    self.aborted = true;
                    *cx.progress = true;
                }
            }
            Some(LlpClose::Graceful) => {
                if pending > 0 && self.unsent(cx) == 0 {
                    wrote = self.write_pending(sock, cx) > 0;
                }
                let pending = self.mpa.as_ref().map_or(0, MpaConn::transmit_pending);
                if (pending == 0 || !sock.may_send()) && !self.fin_sent {
                    sock.close();
                    self.fin_sent = true;
                    *cx.progress = true;
                }
            }
            None => {
                if pending > 0 {
                    if self.unsent(cx) == 0 {
                        wrote = self.write_pending(sock, cx) > 0;
                    }
                    return wrote;
                }
                // A responder waiting for the initiator's first FPDU may still take
                // a few ULPDUs from the upper: MPA holds them (RFC 5044 7.1.2) and the
                // upper's local work (a QP's Fast Register, Local Invalidate) goes on.
                let hold = mpa_state == State::AwaitingFirstFpdu
                    && !self.close_pending
                    && self
                        .mpa
                        .as_ref()
                        .is_some_and(|m| m.held_ulpdus() < MAX_HELD_ULPDUS);
                if (mpa_state != State::FullOperation && !hold) || self.final_sent {
                    // Nothing can be sent in this state: a pending close goes ahead.
                    self.finish_close(cx);
                    return false;
                }
                if self.unsent(cx) != 0 {
                    return false;
                }
                let mut batch = 0;
                loop {
                    let free = sock.send_capacity() - sock.send_queue();
                    match self.pull_from_upper(sock, cx, free) {
                        Pulled::Sent(w, direct) => {
                            wrote |= w;
                            if batch > 0 {
                                cx.stats.fpdus_batched += 1;
                            }
                            batch += direct;
                            if batch + self.emss > TX_BATCH_BYTES || !self.may_batch(cx, direct) {
                                break;
                            }
                        }
                        Pulled::Empty => {
                            self.finish_close(cx);
                            break;
                        }
                        Pulled::NoRoom => break,
                    }
                }
            }
        }
        wrote
    }

    /// A graceful close waits for the upper's queue to drain; then MPA closes.
    fn finish_close(&mut self, cx: &mut Cx) {
        if std::mem::take(&mut self.close_pending) {
            if let Some(m) = self.mpa.as_mut() {
                // Err only in Closed/Failed, where the close is under way anyway.
                let _ = m.close();
            }
            *cx.progress = true;
        }
    }

    /// Asks the upper for a Terminate or one ULPDU and writes the FPDU.
    fn pull_from_upper(
        &mut self,
        sock: &mut tcp::Socket<'static>,
        cx: &mut Cx,
        free: usize,
    ) -> Pulled {
        let (Some(mpa), Some(upper)) = (self.mpa.as_mut(), self.upper.as_mut()) else {
            return Pulled::Empty;
        };
        if let Some(t) = upper.poll_terminate() {
            let cause = terminate_cause_of(&t);
            match mpa.send_terminate(&[&t]) {
                Ok(()) => {
                    cx.stats.terminates_sent += 1;
                    self.terminate_queued = true;
                    self.rx_stopped = true;
                    self.fail(cx, ConnError::TerminateSent(cause));
                    // The Terminate goes out, then the RST (as after an MPA error).
                    self.linger_deadline = None;
                    let wrote = self.write_pending(sock, cx) > 0;
                    self.ulp_terminated = true;
                    return Pulled::Sent(wrote, 0);
                }
                Err(e) => {
                    self.abort_now = true;
                    self.fail(cx, ConnError::Ulp(e));
                    return Pulled::Sent(false, 0);
                }
            }
        }
        if free < self.emss.max(1) {
            return Pulled::NoRoom;
        }
        let Some(mulpdu) = mpa.mulpdu() else {
            return Pulled::Empty;
        };
        // Nothing is pending (checked by `tx`), so the FPDU goes straight into the
        // socket's send buffer, CRC in that copy; MPA's own queue only when the free
        // room wraps around the end of the ring (or the ULPDU is held).
        let mut direct = 0;
        let mut emit = |parts: &[&[u8]]| {
            if mpa.transmit_pending() == 0 {
                let mut framed = Ok(None);
                let _ = sock.send(|buf| {
                    framed = mpa.frame_into(buf, parts);
                    (framed.as_ref().map_or(0, |n| n.unwrap_or(0)), ())
                });
                if let Some(n) = framed? {
                    direct += n;
                    return Ok(());
                }
            }
            mpa.send_ulpdu(parts)
        };
        let polled = upper.poll_ulpdu(mulpdu, &mut emit);
        if direct > 0 {
            self.written += direct as u64;
            cx.stats.stream_tx_bytes += direct as u64;
            *cx.progress = true;
        }
        match polled {
            Ok(true) => {
                cx.stats.ulpdus_tx += 1;
                Pulled::Sent(self.write_pending(sock, cx) > 0 || direct > 0, direct)
            }
            Ok(false) => Pulled::Empty,
            Err(e) => {
                self.abort_now = true;
                self.fail(cx, ConnError::Ulp(e));
                Pulled::Sent(false, 0)
            }
        }
    }
}

/// What asking the upper for a ULPDU gave.
enum Pulled {
    /// A ULPDU (or Terminate) was framed; whether bytes went into the socket, and how
    /// many bytes of it went straight into the socket's send buffer.
    Sent(bool, usize),
    /// The upper had nothing to send.
    Empty,
    /// The socket had no room for a whole FPDU; the upper was not asked.
    NoRoom,
}

impl Conn {
    #[allow(clippy::too_many_arguments)]
    fn new(
        id: ConnId,
        handle: SocketHandle,
        role: Role,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        listener: Option<ListenerId>,
        settings: LocalSettings,
        now: Instant,
    ) -> Conn {
        Conn {
            id,
            handle,
            role,
            key: tuple_key(local.port(), *remote.ip(), remote.port()),
            local,
            remote,
            listener,
            settings,
            span: tracing::debug_span!("conn", id = id.0, ?role, %remote),
            connect_started: now,
            connect_deadline: None,
            mpa: None,
            upper: None,
            emss: 0,
            life: Life::Active,
            zombie_since: None,
            visible: role == Role::Initiator,
            in_backlog: role == Role::Responder,
            final_sent: false,
            close_requested: false,
            close_pending: false,
            aborted: false,
            abort_now: false,
            peer_fin_seen: false,
            tcp_closed_reported: false,
            tcp_dead: false,
            fin_sent: false,
            rx_stopped: false,
            terminate_queued: false,
            ulp_terminated: false,
            linger_deadline: None,
            written: 0,
            snd_base: None,
            rx_offset: 0,
            hooked_upto: 0,
            hook: None,
        }
    }

    /// Whether MPA still takes received bytes.
    fn mpa_consumes(&self) -> bool {
        !self.rx_stopped
            && self.mpa.as_ref().is_some_and(|m| {
                !matches!(
                    m.state(),
                    State::AwaitingDecision | State::Closed | State::Failed
                )
            })
    }

    /// One round of work on this connection; returns whether bytes went into the socket.
    fn service(&mut self, sock: &mut tcp::Socket<'static>, cx: &mut Cx, now: Instant) -> bool {
        use tcp::State as T;
        if self.life == Life::Zombie {
            return false;
        }
        let span = self.span.clone();
        let _entered = span.enter();
        let state = sock.state();
        if matches!(state, T::CloseWait | T::Closing | T::LastAck | T::TimeWait) {
            self.peer_fin_seen = true;
        }
        if self.mpa.is_none() && self.abort_now && !self.aborted {
            // Closed by the user (or its listener) before TCP was established.
            sock.abort();
            self.aborted = true;
            *cx.progress = true;
        }
        if self.mpa.is_none() && !self.aborted {
            match state {
                T::Established | T::CloseWait => {
                    self.start_mpa(cx, now);
                    if self.mpa.is_none() {
                        self.tx(sock, cx, now);
                        self.life = Life::Zombie;
                        return false;
                    }
                }
                T::SynSent | T::SynReceived => {
                    if self.connect_deadline.is_some_and(|d| now >= d) {
                        sock.abort();
                        self.aborted = true;
                        self.fail(cx, ConnError::TimedOut(TimeoutPhase::TcpConnect));
                        self.life = Life::Zombie;
                    }
                    return false;
                }
                _ => {
                    // Closed before MPA started: refused, timed out, or closed by the user.
                    if self.close_requested {
                        self.emit(cx, ConnEvent::Closed);
                    } else if self.role == Role::Initiator {
                        let waited = micros(now).saturating_sub(micros(self.connect_started));
                        let tcp_timeout = cx.cfg.tcp.timeout.map_or(u64::MAX, |t| {
                            u64::try_from(t.as_micros()).unwrap_or(u64::MAX)
                        });
                        let limit = tcp_timeout.min(cx.cfg.connect_timeout_us);
                        let e = if waited >= limit {
                            ConnError::TimedOut(TimeoutPhase::TcpConnect)
                        } else {
                            ConnError::Refused
                        };
                        self.fail(cx, e);
                    } else {
                        self.fail(cx, ConnError::Reset);
                    }
                    if state != T::Closed {
                        sock.abort();
                    }
                    self.aborted = true;
                    self.life = Life::Zombie;
                    return false;
                }
            }
        }
        if self.mpa.is_none() {
            // Aborted before MPA started (user close of a pending connect).
            if !self.final_sent {
                self.emit(cx, ConnEvent::Closed);
            }
            self.life = Life::Zombie;
            return false;
        }
        let now_us = micros(now);
        if let Some(m) = self.mpa.as_mut() {
            m.handle_timeout(now_us);
        }
        self.drain_mpa(cx);
        self.rx(sock, cx, now_us);
        let tcp_gone = matches!(sock.state(), T::Closed | T::TimeWait);
        if self.peer_fin_seen
            && !self.tcp_closed_reported
            && !tcp_gone
            && (sock.recv_queue() == 0 || !self.mpa_consumes())
        {
            self.tcp_closed_reported = true;
            if let Some(m) = self.mpa.as_mut() {
                m.handle_tcp_closed(true);
            }
            self.drain_mpa(cx);
        }
        let wrote = self.tx(sock, cx, now);
        if matches!(sock.state(), T::Closed | T::TimeWait) {
            if !self.tcp_closed_reported {
                self.tcp_closed_reported = true;
                // No Terminate can go out on a dead connection.
                self.tcp_dead = true;
                if !self.aborted {
                    let graceful = self.peer_fin_seen;
                    if let Some(m) = self.mpa.as_mut() {
                        m.handle_tcp_closed(graceful);
                    }
                    self.drain_mpa(cx);
                }
            }
            if !self.final_sent {
                let mpa_closed = self
                    .mpa
                    .as_ref()
                    .is_some_and(|m| m.state() == State::Closed);
                if self.close_requested || mpa_closed {
                    self.emit(cx, ConnEvent::Closed);
                } else {
                    self.fail(cx, ConnError::Reset);
                }
            }
            self.life = Life::Zombie;
        }
        wrote
    }
}

/// One listener: a port, its backlog and its pool of listening sockets.
struct Listener {
    port: u16,
    backlog: usize,
    settings: LocalSettings,
    armed: Vec<SocketHandle>,
    /// Connections of this listener not yet decided (see the module docs).
    pending: usize,
}

/// The transport core of one device. See the [module docs](self).
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
        self.stats
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
        };
        Self::arm(&mut self.sockets, &mut l, first);
        self.listeners.insert(id, l);
        self.dev.tracker.borrow_mut().listen_ports.push(port);
        self.rearm();
        tracing::debug!(port, backlog, "listening");
        Ok(id)
    }

    fn arm(sockets: &mut SocketSet<'static>, l: &mut Listener, mut s: tcp::Socket<'static>) {
        // Cannot fail: the socket is new and the port is not 0.
        if s.listen(l.port).is_ok() {
            l.armed.push(sockets.add(s));
        }
    }

    fn rearm(&mut self) {
        let mss = self.mss();
        for l in self.listeners.values_mut() {
            while l.armed.len() + l.pending < l.backlog {
                match self.cfg.tcp.socket_for_mss(mss) {
                    Ok(s) => Self::arm(&mut self.sockets, l, s),
                    Err(_) => break,
                }
            }
        }
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
                    c.abort_now = true;
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
        c.connect_deadline =
            Some(now + smoltcp::time::Duration::from_micros(self.cfg.connect_timeout_us));
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
        (
            &mut self.conns,
            &mut self.sockets,
            Cx {
                events: &mut self.events,
                tracker: &self.dev.tracker,
                stats: &mut self.stats,
                cfg: &self.cfg,
                progress: &mut self.progress,
                mtu,
            },
        )
    }

    fn leave_backlog(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if std::mem::take(&mut c.in_backlog) {
            if let Some(l) = c.listener.and_then(|l| self.listeners.get_mut(&l)) {
                l.pending = l.pending.saturating_sub(1);
            }
        }
    }

    fn undecided(&mut self, conn: ConnId, call: &'static str) -> Result<&mut Conn, StackError> {
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(StackError::NoSuchConnection(conn))?;
        let ok = c.visible
            && !c.final_sent
            && c.upper.is_none()
            && c.mpa.as_ref().map(MpaConn::state) == Some(State::AwaitingDecision);
        if ok {
            Ok(c)
        } else {
            Err(StackError::WrongState {
                call,
                why: "the connection is not an undecided connection request",
            })
        }
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
        if c.final_sent || c.life == Life::Zombie {
            return Err(StackError::WrongState {
                call: "close",
                why: "the connection already ended",
            });
        }
        c.close_requested = true;
        match (mode, c.mpa.as_mut()) {
            (CloseMode::Graceful, Some(m)) => {
                if m.state() == State::FullOperation && c.upper.is_some() {
                    // What the upper still has queued goes out first.
                    c.close_pending = true;
                } else {
                    // Err only in Closed/Failed, where the close is under way anyway.
                    let _ = m.close();
                }
            }
            _ => c.abort_now = true,
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
            if rounds >= MAX_ROUNDS {
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
        self.rearm();
        if self.dev.inner.stats() != before {
            self.progress = true;
        }
        if more {
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
                c.connect_deadline.filter(|_| c.mpa.is_none() && !c.aborted),
                c.linger_deadline.filter(|_| !c.aborted),
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

    /// Moves listening sockets that became connections into the connection table.
    fn harvest(&mut self, now: Instant) {
        let mut born = Vec::new();
        for (&lid, l) in self.listeners.iter_mut() {
            let mut i = 0;
            while i < l.armed.len() {
                let h = l.armed[i];
                let s = self.sockets.get_mut::<tcp::Socket>(h);
                match s.state() {
                    tcp::State::Listen | tcp::State::SynReceived => i += 1,
                    tcp::State::Closed => {
                        l.armed.swap_remove(i);
                        self.sockets.remove(h);
                    }
                    _ => {
                        l.armed.swap_remove(i);
                        match (s.local_endpoint(), s.remote_endpoint()) {
                            (Some(local), Some(remote)) => {
                                l.pending += 1;
                                born.push((lid, h, v4(local), v4(remote), l.settings.clone()));
                            }
                            _ => {
                                s.abort();
                            }
                        }
                    }
                }
            }
        }
        for (lid, h, local, remote, settings) in born {
            let id = ConnId(self.next_id());
            tracing::debug!(conn = id.0, %remote, "TCP connection accepted");
            self.conns.insert(
                id,
                Conn::new(
                    id,
                    h,
                    Role::Responder,
                    local,
                    remote,
                    Some(lid),
                    settings,
                    now,
                ),
            );
        }
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
            if c.life != Life::Zombie {
                return true;
            }
            if std::mem::take(&mut c.in_backlog) {
                if let Some(l) = c.listener.and_then(|l| listeners.get_mut(&l)) {
                    l.pending = l.pending.saturating_sub(1);
                }
            }
            let since = *c.zombie_since.get_or_insert(now);
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

#[cfg(test)]
mod tests {
    use super::*;
    use ddp_rdmap::terminate::{DdpUntaggedCode, LlpCode};
    use smoltcp::wire::{Ipv4Packet, TcpPacket};

    /// An Ethernet/IPv4/TCP frame from 10.0.0.1:`sport` to 10.0.0.2:`dport` with
    /// correct checksums, an MSS option when `mss` is given, and `payload`.
    fn frame(
        sport: u16,
        dport: u16,
        seq: u32,
        flags: u8,
        mss: Option<u16>,
        payload: &[u8],
    ) -> Vec<u8> {
        let opts = if mss.is_some() { 4 } else { 0 };
        let tcp_len = 20 + opts + payload.len();
        let mut f = vec![0u8; 14 + 20 + tcp_len];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        {
            let mut ip = Ipv4Packet::new_unchecked(&mut f[14..]);
            ip.set_version(4);
            ip.set_header_len(20);
            ip.set_total_len((20 + tcp_len) as u16);
            ip.set_hop_limit(64);
            ip.set_next_header(smoltcp::wire::IpProtocol::Tcp);
            ip.set_src_addr(Ipv4Addr::new(10, 0, 0, 1));
            ip.set_dst_addr(Ipv4Addr::new(10, 0, 0, 2));
            ip.fill_checksum();
        }
        let t = &mut f[34..];
        t[0..2].copy_from_slice(&sport.to_be_bytes());
        t[2..4].copy_from_slice(&dport.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[12] = (((20 + opts) / 4) as u8) << 4;
        t[13] = flags;
        if let Some(m) = mss {
            t[20..24].copy_from_slice(&[2, 4, (m >> 8) as u8, m as u8]);
        }
        t[20 + opts..].copy_from_slice(payload);
        let mut tcp = TcpPacket::new_unchecked(&mut f[34..]);
        tcp.fill_checksum(
            &IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 1)),
            &IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 2)),
        );
        f
    }

    #[test]
    fn segments_are_parsed_and_checked() {
        let syn = frame(5000, 80, 100, TCP_SYN, Some(1460), &[]);
        let s = parse_seg(&syn, true).unwrap();
        assert!(s.syn && !s.ack);
        assert_eq!(
            (s.src_port, s.dst_port, s.seq, s.seg_len, s.mss),
            (5000, 80, 100, 1, Some(1460))
        );
        let data = frame(5000, 80, 101, TCP_ACK | TCP_FIN, None, &[7; 100]);
        let s = parse_seg(&data, true).unwrap();
        assert_eq!((s.seg_len, s.mss, s.ack), (101, None, true));
        let mut bad = data.clone();
        bad[60] ^= 1;
        assert!(parse_seg(&bad, true).is_none(), "TCP checksum");
        assert!(parse_seg(&bad, false).is_some());
        let mut arp = data.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(parse_seg(&arp, false).is_none());
        for cut in [0, 13, 20, 40, 53] {
            assert!(parse_seg(&syn[..cut], false).is_none(), "{cut}");
        }
    }

    #[test]
    fn tracker_keeps_the_highest_sequence_sent_and_the_peer_mss() {
        let mut t = SegTracker::default();
        let key = tuple_key(5000, Ipv4Addr::new(10, 0, 0, 2), 80);
        // Data of an unknown connection is ignored; a SYN registers it.
        t.on_tx(&frame(5000, 80, 10, TCP_ACK, None, &[0; 5]));
        assert!(t.map.is_empty());
        t.on_tx(&frame(5000, 80, 100, TCP_SYN, Some(1460), &[]));
        assert_eq!(t.get(key).snd_max, Some(101));
        t.on_tx(&frame(5000, 80, 101, TCP_ACK, None, &[0; 1000]));
        assert_eq!(t.get(key).snd_max, Some(1101));
        // A retransmission does not move it back.
        t.on_tx(&frame(5000, 80, 101, TCP_ACK, None, &[0; 500]));
        assert_eq!(t.get(key).snd_max, Some(1101));
        // Wrapping sequence numbers.
        t.on_tx(&frame(5000, 80, u32::MAX - 10, TCP_SYN, None, &[]));
        t.on_tx(&frame(5000, 80, u32::MAX - 9, TCP_ACK, None, &[0; 20]));
        assert_eq!(t.get(key).snd_max, Some(10));
        // The peer's SYN-ACK (it comes from 10.0.0.2:80 in a real exchange; here the
        // frame builder's addresses are fixed, so look at the mirrored key).
        let mirrored = tuple_key(80, Ipv4Addr::new(10, 0, 0, 1), 5000);
        t.on_rx(&frame(5000, 80, 7, TCP_SYN | TCP_ACK, Some(536), &[]));
        assert_eq!(t.get(mirrored).remote_mss, None, "unknown connection");
        t.listen_ports.push(80);
        t.on_rx(&frame(5000, 80, 7, TCP_SYN, None, &[]));
        assert_eq!(t.get(mirrored).remote_mss, Some(536), "default MSS");
        t.on_rx(&frame(5000, 80, 7, TCP_SYN, Some(9000), &[]));
        assert_eq!(t.get(mirrored).remote_mss, Some(9000));
    }

    /// `frame` with the acknowledgment number and window set (checksums not redone:
    /// `mirrored` in the test below redoes them).
    fn with_ack(mut f: Vec<u8>, ack: u32, window: u16) -> Vec<u8> {
        f[42..46].copy_from_slice(&ack.to_be_bytes());
        f[48..50].copy_from_slice(&window.to_be_bytes());
        f
    }

    /// A SYN from 10.0.0.1:`sport` with the MSS 1460 and window scale `shift` options.
    fn syn_with_wscale(sport: u16, dport: u16, seq: u32, flags: u8, shift: u8) -> Vec<u8> {
        let mut f = frame(sport, dport, seq, flags, Some(1460), &[0; 4]);
        // Turn the 4 payload bytes into options: NOP, window scale (kind 3, length 3).
        f[34 + 12] = (28 / 4) << 4;
        f[34 + 24..34 + 28].copy_from_slice(&[1, 3, 3, shift]);
        TcpPacket::new_unchecked(&mut f[34..]).fill_checksum(
            &IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 1)),
            &IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 2)),
        );
        f
    }

    #[test]
    fn the_quick_transmit_parse_agrees_with_the_full_one() {
        for (flags, payload) in [
            (TCP_ACK, 0usize),
            (TCP_ACK, 1),
            (TCP_ACK, 1460),
            (TCP_ACK | TCP_FIN, 0),
            (TCP_ACK | TCP_FIN, 100),
        ] {
            let f = frame(5000, 80, 0xffff_fff0, flags, None, &vec![7; payload]);
            let full = parse_seg(&f, true).unwrap();
            let quick = quick_tx(&f).unwrap();
            assert_eq!(
                quick,
                (
                    tuple_key(full.src_port, full.dst, full.dst_port),
                    full.seq,
                    full.seg_len
                ),
                "flags {flags:#x}, {payload} bytes"
            );
            assert_eq!(carries_data(&f), payload > 0);
        }
        // SYNs, short frames and other protocols take the full parse.
        assert!(quick_tx(&frame(5000, 80, 1, TCP_SYN, Some(1460), &[])).is_none());
        let f = frame(5000, 80, 1, TCP_ACK, None, &[1; 10]);
        assert!(quick_tx(&f[..47]).is_none());
        let mut udp = f.clone();
        udp[23] = 17;
        assert!(quick_tx(&udp).is_none());
    }

    #[test]
    fn the_tracker_takes_the_peer_window_from_pure_acks() {
        let mut t = SegTracker::default();
        let key = tuple_key(5000, Ipv4Addr::new(10, 0, 0, 2), 80);
        let mirrored = |f: &[u8]| {
            // The builder's frames go 10.0.0.1:sport -> 10.0.0.2:dport; a frame from the
            // peer swaps the addresses.
            let mut f = f.to_vec();
            f[26..30].copy_from_slice(&[10, 0, 0, 2]);
            f[30..34].copy_from_slice(&[10, 0, 0, 1]);
            Ipv4Packet::new_unchecked(&mut f[14..]).fill_checksum();
            TcpPacket::new_unchecked(&mut f[34..]).fill_checksum(
                &IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 2)),
                &IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 1)),
            );
            f
        };
        // Our SYN and the peer's SYN-ACK, both with window scaling: shift 3 applies.
        t.on_tx(&syn_with_wscale(5000, 80, 99, TCP_SYN, 7));
        t.on_rx(&mirrored(&syn_with_wscale(
            80,
            5000,
            7,
            TCP_SYN | TCP_ACK,
            3,
        )));
        assert_eq!(
            t.get(key).window_room(),
            None,
            "no window before the first ACK"
        );
        t.on_tx(&frame(5000, 80, 100, TCP_ACK, None, &[0; 1000]));
        // Pure ACK of the first 500 bytes, window 100 (x 8).
        t.on_rx(&mirrored(&with_ack(
            frame(80, 5000, 8, TCP_ACK, None, &[]),
            600,
            100,
        )));
        assert_eq!(t.get(key).wnd_edge, Some(600 + 800));
        assert_eq!(t.get(key).window_room(), Some(1400 - 1100));
        // An ACK carrying data is not looked at; an ACK of more than was sent neither.
        t.on_rx(&mirrored(&with_ack(
            frame(80, 5000, 8, TCP_ACK, None, &[1; 10]),
            1100,
            1000,
        )));
        t.on_rx(&mirrored(&with_ack(
            frame(80, 5000, 8, TCP_ACK, None, &[]),
            1101,
            1000,
        )));
        assert_eq!(t.get(key).wnd_edge, Some(1400));
        // A pure ACK smoltcp would drop (bad checksum) or ignore (older than the last
        // one) is not looked at either.
        let mut bad = mirrored(&with_ack(
            frame(80, 5000, 8, TCP_ACK, None, &[]),
            1100,
            1000,
        ));
        bad[34 + 16] ^= 0xff;
        t.on_rx(&bad);
        t.on_rx(&mirrored(&with_ack(
            frame(80, 5000, 8, TCP_ACK, None, &[]),
            599,
            1000,
        )));
        assert_eq!(t.get(key).wnd_edge, Some(1400));
        // A window behind what was sent leaves no room.
        t.on_tx(&frame(5000, 80, 1100, TCP_ACK, None, &[0; 400]));
        assert_eq!(t.get(key).window_room(), Some(0));
        // Without the option in the peer's SYN the window is not scaled.
        let key2 = tuple_key(5001, Ipv4Addr::new(10, 0, 0, 2), 80);
        t.on_tx(&syn_with_wscale(5001, 80, 0, TCP_SYN, 7));
        t.on_rx(&mirrored(&frame(
            80,
            5001,
            7,
            TCP_SYN | TCP_ACK,
            Some(1460),
            &[],
        )));
        t.on_tx(&frame(5001, 80, 1, TCP_ACK, None, &[0; 10]));
        t.on_rx(&mirrored(&with_ack(
            frame(80, 5001, 8, TCP_ACK, None, &[]),
            11,
            100,
        )));
        assert_eq!(t.get(key2).window_room(), Some(100));
    }

    #[test]
    fn terminates_are_built_and_recognised() {
        for cause in [
            ErrorCause::Llp(LlpCode::CrcError),
            ErrorCause::Llp(LlpCode::InvalidRequestReply),
            ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidQn),
        ] {
            let t = terminate_ulpdu(cause).unwrap();
            // Untagged header on QN 2, MSN 1, MO 0; then the Terminate control word.
            assert_eq!(&t[..2], &[0x41, 0x47]);
            assert_eq!(&t[6..18], &[0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0]);
            assert_eq!(terminate_cause_of(&t), Some(cause));
        }
        assert_eq!(terminate_cause_of(&[0x41, 0x47, 0, 0]), None);
        assert_eq!(terminate_cause_of(b""), None);
        let send = [
            0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 9,
        ];
        assert_eq!(terminate_cause_of(&send), None);
    }
}
