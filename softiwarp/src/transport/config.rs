//! Constants and configuration of the [`Stack`]: limits, defaults, the
//! device's MPA defaults and the MPA parameters of one connection.

use mpa::negotiate::LocalSettings;
use mpa::wire::Limits;

use super::mpa_conn::DEFAULT_STARTUP_TIMEOUT_US;
use super::smoltcp_glue::{InterfaceConfig, TcpConfig};
#[allow(unused_imports)] // doc links
use super::{mpa_conn::MpaConfig, ConnError, MpaConn, Stack};

/// Most connection rounds (one FPDU per connection each) in one [`Stack::poll`]; when
/// more work is left, `poll` returns `now` as the deadline so the driver calls again
/// (after taking in new frames), which keeps ingress from starving.
pub const MAX_ROUNDS: usize = 256;

/// Bytes of FPDUs a connection writes in one round at most (`Conn::may_batch`): at
/// MTU 1500 about 45 FPDUs; at MTUs over 32 KiB one.
pub(super) const TX_BATCH_BYTES: usize = 64 * 1024;

/// Bytes a [`Stack::poll`] must have consumed from the sockets before it ends with an
/// egress pass for the window update (see the comment there): 16 KiB.
pub(super) const WINDOW_UPDATE_MIN: u64 = 16 * 1024;

/// Largest listen backlog, in connections (Linux caps `listen(2)` at `somaxconn`, 4096
/// by default; each armed socket here reserves its buffers' address space).
pub const MAX_BACKLOG: usize = 1024;

/// Default bound of a listener's half-open pool ([`StackConfig::half_open_max`]): 64
/// connections. Each holds a TCP socket with its receive and send buffers
/// ([`TcpConfig::rx_buffer`] + [`TcpConfig::tx_buffer`], 512 KiB by default, allocated
/// zeroed) from the SYN on, so the pool bounds that memory at 64 x 512 KiB = 32 MiB per
/// listener by default.
pub const DEFAULT_HALF_OPEN_MAX: usize = 64;

/// Most listening sockets a listener keeps armed (while its backlog has room): 8.
///
/// smoltcp answers a SYN that finds no listening socket with a RST and sockets are
/// re-armed once a poll, so this is how many SYNs one poll can take: with a single one,
/// a client opening several connections at once (an `iwperf client --qps 2`) had all but
/// the first refused during a flood (found by the root-only
/// `bench/tests/iwperf_flood.rs`). It also holds while the half-open pool is full: each
/// connection an armed socket takes pushes the oldest half-open one out, so the pool's
/// bound holds and the armed sockets add at most this many sockets' buffers.
///
/// Not more, because every armed socket is visited by every smoltcp ingress, egress and
/// `poll_at` scan: with the backlog's room armed (64 sockets for a backlog of 128 and the
/// default pool), those scans were 12% of a passive RDMA Write target's CPU at MTU 65000
/// and about 4 points of its throughput (docs/ARCHITECTURE.md, "Hostile peers", has the
/// bound and its tests).
pub const MAX_ARMED: usize = 8;

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
    /// Largest number of half-open connections per listener (TCP established, MPA
    /// Request not yet valid; see "Listeners and the backlog" in the module docs): when
    /// a new connection would exceed it, the oldest half-open one is reset. At least 1.
    /// Default [`DEFAULT_HALF_OPEN_MAX`]. How long a half-open connection may wait for
    /// its Request is [`MpaDefaults::startup_timeout_us`].
    pub half_open_max: usize,
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
            half_open_max: DEFAULT_HALF_OPEN_MAX,
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
