//! One MPA endpoint on one TCP connection, both roles, as a sans-IO,
//! deterministic state machine (RFC 5044 section 7.1 "Connection Setup",
//! RFC 6581 "Enhanced RDMA Connection Establishment").
//!
//! [`MpaConn`] owns no socket and reads no clock, in the style of
//! `quinn-proto`: the driver (the engine thread with its smoltcp socket, or a
//! test) feeds it the TCP receive stream ([`MpaConn::handle_rx`]), the time
//! ([`MpaConn::handle_timeout`]) and the end of the TCP connection
//! ([`MpaConn::handle_tcp_closed`]); it takes the bytes to write into the TCP
//! send buffer from [`MpaConn::poll_transmit`], the events from
//! [`MpaConn::poll_event`] and the next deadline from
//! [`MpaConn::poll_timeout`]. Time is a `u64` count of **microseconds** on a
//! monotonic clock of the driver's choice (only differences matter).
//!
//! The wire work is done by the `mpa` crate (frames, negotiation, FPDU
//! framing and deframing) and the `ddp-rdmap` crate (the RTR messages); this
//! module only sequences it.
//!
//! # Driving loop
//!
//! ```
//! use softiwarp::transport::mpa_conn::{MpaConfig, MpaConn, MpaEvent};
//!
//! let mut ini = MpaConn::initiator(MpaConfig::default(), 0).unwrap();
//! let mut rsp = MpaConn::responder(MpaConfig::default(), 0).unwrap();
//! // The Request goes over "TCP".
//! let req = ini.poll_transmit().unwrap().to_vec();
//! ini.transmit_done(req.len()).unwrap();
//! assert_eq!(rsp.handle_rx(&req, 10), req.len());
//! let Some(MpaEvent::ConnectRequest { .. }) = rsp.poll_event() else { panic!() };
//! rsp.accept(b"", 1, 1).unwrap();
//! assert!(matches!(rsp.poll_event(), Some(MpaEvent::Established { .. })));
//! // The responder's Send is held until the initiator's first FPDU arrives.
//! rsp.send_ulpdu(&[b"from the responder"]).unwrap();
//! let reply = rsp.poll_transmit().unwrap().to_vec();
//! assert_eq!(reply.len(), 24, "only the Reply may go out yet");
//! rsp.transmit_done(reply.len()).unwrap();
//! ini.handle_rx(&reply, 20);
//! assert!(matches!(ini.poll_event(), Some(MpaEvent::Established { .. })));
//! ini.send_ulpdu(&[b"hello"]).unwrap();
//! let fpdu = ini.poll_transmit().unwrap().to_vec();
//! ini.transmit_done(fpdu.len()).unwrap();
//! rsp.handle_rx(&fpdu, 30);
//! assert_eq!(rsp.poll_event(), Some(MpaEvent::Ulpdu(b"hello".to_vec())));
//! assert!(rsp.poll_transmit().is_some(), "the held FPDU is released");
//! ```
//!
//! # Startup rules (RFC 5044 section 7.1.2, RFC 6581)
//!
//! * The initiator queues its MPA Request at construction and sends no FPDU
//!   before the Reply is received and validated. The octets behind the Reply
//!   in the same read are FPDUs and are deframed (an FPDU right behind the
//!   Reply is the classic interop trap with Linux siw, which does not hold its
//!   FPDUs). [`MpaEvent::Established`] is reported when the Reply validates.
//! * The responder reports [`MpaEvent::ConnectRequest`] when the Request is
//!   in, and the application answers with [`MpaConn::accept`] or
//!   [`MpaConn::reject`]. A Request that cannot be accepted whatever the
//!   accept's IRD/ORD are (CRC refused, Markers refused, no matching RTR
//!   kind) is rejected right away, without a ConnectRequest, as siw does
//!   (`siw_proc_mpareq`). The responder reports `Established` when it accepts
//!   (the Reply is queued) but sends **no FPDU before it has received one
//!   complete, valid FPDU from the initiator**: ULPDUs given to
//!   [`MpaConn::send_ulpdu`] before that are *held* (copied, checked against
//!   MULPDU, not yet framed) and framed, in order, when the first FPDU
//!   arrives. A first FPDU that fails (bad CRC, bad ULPDU_Length or Marker)
//!   still ends the hold for the Terminate alone: the initiator is in full
//!   operation by then, and siw answers a bad CRC with the LLP/MPA/CRC
//!   Terminate in any case. A responder that accepted and never gets a first FPDU does not
//!   time out at the MPA level; TCP keep-alive and the ULP cover it.
//! * Octets behind the Request (which a conforming initiator never sends
//!   before the Reply) are not consumed before `accept`: `handle_rx` returns
//!   the count of octets it took and the driver offers the rest again.
//! * Sends before `Established` (initiator waiting for the Reply, responder
//!   before `accept`) are refused with [`CallError::WrongState`].
//!
//! # Peer-to-peer mode and the RTR (RFC 6581)
//!
//! When [`Agreed::p2p`], the initiator's first FPDU is the zero-length RTR
//! ("ready to receive") message of the agreed kind, queued right behind
//! nothing but the Request, ahead of any ULPDU. The exact messages (all with
//! DDP L = 1):
//!
//! | kind | ULPDU | source |
//! |---|---|---|
//! | Write | tagged RDMA Write, STag 1, TO 0, no payload (14 octets: `c140 0000 0001 0000 0000 0000 0000`) | Linux siw `siw_qp_mpa_rts` (`rkey = 1`, "some HW may treat STag 0 special"); byte for byte `shared/pcaps/rping-srv_p2p-cli_p2p.pcap` frame 10 |
//! | Read | RDMA Read Request, QN 1, MSN 1, MO 0, sink STag 0, sink TO 0, size 0, source STag 1, source TO 0 (46 octets) | siw `siw_qp_mpa_rts` + `siw_qp_prepare_tx`: `sge[0].lkey = 0` is the sink STag, `rkey = 1` the source STag, `++ddp_msn[RDMAP_UNTAGGED_QN_RDMA_READ]` = 1 |
//! | Send | Send, QN 0, MSN 1, MO 0, no payload (18 octets) | siw cannot send it (`-EINVAL`); built like siw's Send (`++ddp_msn[QN_SEND]`) |
//!
//! **MSN consumption.** A zero-length Send or Read Request is an untagged
//! DDP message, and DDP numbers every message of a queue (RFC 5041 section
//! 4.3: the MSN is 1 for the first message on a queue and increases by one
//! with each message; a receiver checks it, siw terminates on a mismatch). So the RTR *does*
//! consume MSN 1 of its queue: with a Send RTR the initiator's first ULP Send
//! carries MSN 2 and the responder expects MSN 2; with a Read RTR the same
//! holds for QN 1 (Read Requests). Sending the first ULP message with MSN 1
//! again would be rejected by any DDP receiver that checks MSNs. The upper
//! layer reads the numbers to start from in [`MpaConn::initial_msn`]. The
//! zero-length Write RTR is tagged and consumes nothing.
//!
//! The responder consumes the RTR: it is never delivered as
//! [`MpaEvent::Ulpdu`] and never consumes a ULP receive buffer. It must be the
//! first FPDU and of the agreed kind (Write: opcode Write, L = 1, no payload,
//! any STag/TO, which a zero-length Write never touches; Send: QN 0, MSN 1,
//! MO 0, no payload; Read: QN 1, MSN 1, size 0); anything else is
//! [`MpaError::Rtr`] with LLP error code 0x07 "No matching RTR option"
//! (RFC 6581's code for RTR disagreements; our choice for this case). A Read
//! RTR is answered with a zero-length RDMA Read Response (tagged, STag and TO
//! = the request's sink STag and TO, as siw's `siw_init_rresp` does) queued
//! ahead of every held FPDU (siw too prefers pending Read Responses over SQ
//! work, `siw_activate_tx`). The initiator consumes that Read Response: while
//! [`MpaConn::read_rtr_outstanding`] is true, the first Read Response to
//! arrive is the RTR's (Read Responses come back in Read Request order,
//! RFC 5040 section 5.5) and must be zero-length. The upper layer should
//! count the outstanding Read RTR against its ORD while that getter is true.
//!
//! # Errors, Terminate and closing
//!
//! [`MpaEvent::Error`] is fatal: the state becomes [`State::Failed`], nothing
//! after the offending octets is delivered and held ULPDUs are dropped.
//! [`MpaError::llp_error_code`] gives the RFC 5044 section 8 / RFC 6581 LLP
//! error code (Layer LLP, Error Type MPA) and [`MpaError::terminate_cause`]
//! the matching `ddp_rdmap` Terminate cause, so the upper layer can build a
//! Terminate and queue it with [`MpaConn::send_terminate`] (possible once this
//! side may send FPDUs: [`MpaConn::can_send_terminate`]) before the driver
//! closes. How the driver ends the TCP connection is in
//! [`MpaConn::llp_close`]: [`LlpClose::Abort`] after fatal errors (write out
//! a queued Terminate first if there is one), [`LlpClose::Graceful`] (FIN
//! once `poll_transmit` is drained) after [`MpaConn::close`], a reject sent
//! or received, and a responder-side negotiation failure (whose reject Reply
//! must reach the initiator).
//!
//! Tracing: state changes at `debug`, per-FPDU details at `trace`; nothing at
//! `info` or above.

use std::collections::VecDeque;

use ddp_rdmap::ddp::BufferModel;
use ddp_rdmap::rdmap::{ReadRequestRepr, QN_READ_REQUEST, QN_SEND};
use ddp_rdmap::terminate::{ErrorCause, LlpCode};
use ddp_rdmap::{Body, Header, Opcode, Ulpdu};
use mpa::deframer::{DeframeError, Deframer, DeframerConfig};
use mpa::fpdu::{mulpdu, FrameError, Framer, Framing};
use mpa::negotiate::{
    self, Agreed, InitiatorError, LocalSettings, NegotiationError, Response, SettingsError,
};
use mpa::wire::{FrameKind, Limits, Repr, RtrKind, Startup, StartupReader, WireError};
use mpa::LlpErrorCode;
use thiserror::Error;

/// Default time to wait for the MPA Request (responder) or Reply (initiator):
/// 10 s, in microseconds. Linux siw (`siw_cm.h`) waits `MPAREQ_TIMEOUT` = 10 s
/// for the Reply after sending the Request and `MPAREP_TIMEOUT` = 5 s for the
/// Request on a new connection; set [`MpaConfig::startup_timeout_us`] per
/// role to match it exactly.
pub const DEFAULT_STARTUP_TIMEOUT_US: u64 = 10_000_000;

/// Default EMSS, in octets of TCP payload per segment: 1448 = MSS 1460 less
/// 12 octets of TCP timestamp option (`shared/pcaps`), giving MULPDU 1442.
pub const DEFAULT_EMSS: usize = 1448;

/// Smallest accepted EMSS, in octets: every RTR and Read Response FPDU and a
/// Terminate fit in one segment of this size, with Markers.
pub const MIN_EMSS: usize = 128;

/// Configuration of one [`MpaConn`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaConfig {
    /// What this side wants from the negotiation (revision, CRC policy,
    /// Markers, P2P and RTR kinds, IRD/ORD, private data). The responder's
    /// private data, IRD and ORD are replaced by the arguments of
    /// [`MpaConn::accept`].
    pub settings: LocalSettings,
    /// Limits for parsing the peer's Request or Reply (largest PD_Length,
    /// reserved-bit leniency).
    pub limits: Limits,
    /// Effective MSS in octets: TCP payload octets per segment (MSS less TCP
    /// options). Sets MULPDU (RFC 5044 section 4.5). At least [`MIN_EMSS`].
    pub emss: usize,
    /// How long to wait for the peer's Request (responder) or Reply
    /// (initiator), in microseconds from construction. Default
    /// [`DEFAULT_STARTUP_TIMEOUT_US`].
    pub startup_timeout_us: u64,
    /// Initiator: how long to hold this side's first FPDU (the RTR in peer-to-peer
    /// mode, else the first ULPDU) after the Reply validated, in microseconds; ULPDUs
    /// sent meanwhile are held and go out in order when it ends (or at a graceful
    /// close). 0 (the default): none, as RFC 5044 section 7.1.2 allows. A Linux siw
    /// responder (6.1) installs its QP's receive upcall only after its Reply went out:
    /// an FPDU arriving in that window stays unread in its socket until more data
    /// comes, and rping-like exchanges stall (docs/ARCHITECTURE.md, "Interop with
    /// kernel siw"); a few milliseconds of hold avoid it.
    pub first_fpdu_delay_us: u64,
}

impl Default for MpaConfig {
    /// `LocalSettings::default()` (siw compatible: Rev 2, CRC if the peer
    /// asks, no Markers, no P2P, IRD = ORD = 1), default limits,
    /// [`DEFAULT_EMSS`], [`DEFAULT_STARTUP_TIMEOUT_US`].
    fn default() -> MpaConfig {
        MpaConfig {
            settings: LocalSettings::default(),
            limits: Limits::default(),
            emss: DEFAULT_EMSS,
            startup_timeout_us: DEFAULT_STARTUP_TIMEOUT_US,
            first_fpdu_delay_us: 0,
        }
    }
}

/// Which end of the TCP connection this endpoint is (RFC 5044 section 7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Sends the MPA Request (the active side, rdma_connect).
    Initiator,
    /// Answers with the MPA Reply (the passive side, rdma_accept).
    Responder,
}

/// The state of an [`MpaConn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Responder: waiting for the MPA Request (startup timer running).
    AwaitingRequest,
    /// Responder: the Request is in ([`MpaEvent::ConnectRequest`]); waiting
    /// for [`MpaConn::accept`] or [`MpaConn::reject`] (no timer).
    AwaitingDecision,
    /// Initiator: the Request is queued or sent; waiting for the MPA Reply
    /// (startup timer running).
    AwaitingReply,
    /// Responder: accepted, the Reply is queued, FPDUs are received, but this
    /// side's FPDUs are held until the initiator's first FPDU arrives
    /// (RFC 5044 section 7.1.2; in P2P mode that FPDU is the RTR).
    AwaitingFirstFpdu,
    /// Full operation in both directions (RFC 5044 section 4).
    FullOperation,
    /// Closing gracefully: [`MpaConn::close`] was called, or a reject was
    /// sent or received. The driver flushes `poll_transmit` and closes TCP.
    Closing,
    /// Terminal: the TCP connection is closed ([`MpaEvent::Closed`] reported).
    Closed,
    /// Terminal: a fatal error was reported ([`MpaEvent::Error`]).
    Failed,
}

/// How the driver should end the TCP connection (see [`MpaConn::llp_close`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LlpClose {
    /// Write out everything `poll_transmit` still returns, then send FIN.
    Graceful,
    /// Abort (RST) once any Terminate queued by the upper layer is written;
    /// other queued octets may be dropped.
    Abort,
}

/// The first DDP Message Sequence Number the upper layer uses (tx) or
/// expects (rx) on the untagged queues it shares with the RTR, after the RTR
/// took its MSN (see the module documentation). 1 unless a Send or Read RTR
/// was exchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InitialMsn {
    /// First MSN this side sends on QN 0 (Sends).
    pub send_tx: u32,
    /// First MSN this side expects on QN 0.
    pub send_rx: u32,
    /// First MSN this side sends on QN 1 (RDMA Read Requests).
    pub read_tx: u32,
    /// First MSN this side expects on QN 1.
    pub read_rx: u32,
}

/// What the connection reports to its user, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MpaEvent {
    /// Responder: a valid MPA Request arrived; answer with
    /// [`MpaConn::accept`] or [`MpaConn::reject`].
    ConnectRequest {
        /// The peer's Request (its private data, IRD/ORD word, flags).
        request: Repr,
    },
    /// Negotiation succeeded. Initiator: the Reply validated (FPDUs may be
    /// sent now). Responder: the Reply is queued by `accept` (FPDUs are held
    /// until the first FPDU from the initiator).
    Established {
        /// The agreed settings, seen from this side.
        agreed: Agreed,
    },
    /// Initiator: the responder rejected the connection (R set in the
    /// Reply, RFC 5044 section 7.1.1). [`MpaConn::llp_close`] is then
    /// `Graceful`.
    Rejected {
        /// The ULP private data of the reject Reply, in octets.
        private_data: Vec<u8>,
    },
    /// A received ULPDU (one DDP segment, without MPA length, pad, Markers
    /// and CRC), copied. RTRs and the Read RTR's Read Response never appear.
    Ulpdu(Vec<u8>),
    /// A fatal error; the state is [`State::Failed`]. See
    /// [`MpaError::llp_error_code`].
    Error(MpaError),
    /// The TCP connection closed after a graceful close (either side) or a
    /// reject; the state is [`State::Closed`].
    Closed,
}

/// Why the RTR exchange of peer-to-peer mode failed (RFC 6581).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RtrError {
    /// Responder: the first FPDU is not the zero-length RTR of the agreed kind.
    #[error(
        "first FPDU is not the agreed {expected:?} RTR (opcode {opcode:?}, {ulpdu_len} octets)"
    )]
    NotRtr {
        /// The agreed RTR kind.
        expected: RtrKind,
        /// The opcode of the FPDU received instead, if its header parsed.
        opcode: Option<Opcode>,
        /// The ULPDU length of that FPDU, in octets.
        ulpdu_len: usize,
    },
    /// Initiator: the first RDMA Read Response after a Read RTR is not zero-length.
    #[error(
        "the Read Response to the Read RTR carries {payload_len} octets of payload (L = {last})"
    )]
    ReadResponseNotEmpty {
        /// Payload octets of the Read Response.
        payload_len: usize,
        /// Its DDP L flag.
        last: bool,
    },
}

/// A fatal connection error, reported as [`MpaEvent::Error`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MpaError {
    /// The peer's Request or Reply is malformed (bad key, revision, reserved
    /// bits, PD_Length over the limit, wrong frame kind). LLP code 0x04. A
    /// responder given a Request of an unsupported Rev
    /// ([`WireError::BadRevision`]) queues a reject Reply with its own Rev
    /// (`mpa::negotiate::unsupported_revision_reply`) and `llp_close` is
    /// `Graceful`; every other case aborts.
    #[error("invalid MPA Request/Reply: {0}")]
    BadFrame(WireError),
    /// Negotiation failed: on the responder the reject Reply is queued (and
    /// `llp_close` is `Graceful` so it gets out); on the initiator the Reply
    /// was unacceptable. LLP code from [`NegotiationError::llp_error_code`]
    /// (0x06 Insufficient IRD, 0x07 No matching RTR, else 0x04).
    #[error("MPA negotiation failed: {0}")]
    Negotiation(NegotiationError),
    /// An FPDU failed its CRC check (RFC 5044 section 6). LLP code 0x02.
    #[error("MPA CRC error in the FPDU at stream offset {offset}: received {received:#010x}, computed {computed:#010x}")]
    Crc {
        /// Offset of the FPDU in the received FPDU stream, octets since its first FPDU.
        offset: u64,
        /// The CRC field.
        received: u32,
        /// The CRC32c computed over the FPDU.
        computed: u32,
    },
    /// Framing lost: a bad ULPDU_Length or Marker (RFC 5044 sections 4, 6).
    /// LLP code 0x03.
    #[error("MPA framing error: {0}")]
    Framing(DeframeError),
    /// The RTR exchange of peer-to-peer mode failed. LLP code 0x07.
    #[error("MPA peer-to-peer RTR error: {0}")]
    Rtr(RtrError),
    /// The peer's Request (responder) or Reply (initiator) did not arrive
    /// within [`MpaConfig::startup_timeout_us`]. No LLP code (nothing to
    /// terminate: no FPDU may be sent).
    #[error("timed out waiting for the MPA {waiting_for:?}")]
    Timeout {
        /// The frame that did not come.
        waiting_for: FrameKind,
    },
    /// The TCP connection closed before the MPA exchange completed. LLP code 0x01.
    #[error("TCP connection closed during MPA startup (graceful: {graceful})")]
    PeerClosedDuringStartup {
        /// FIN (true) or reset/loss (false).
        graceful: bool,
    },
    /// The TCP connection was reset or lost, or closed in the middle of an
    /// FPDU, in full operation. LLP code 0x01.
    #[error("TCP connection lost (graceful: {graceful}, inside an FPDU: {mid_fpdu})")]
    ConnectionLost {
        /// FIN (true) or reset/loss (false).
        graceful: bool,
        /// An FPDU was partly received.
        mid_fpdu: bool,
    },
    /// The local settings were refused while completing the negotiation
    /// (cannot happen with settings that passed construction). LLP code 0x05.
    #[error("local MPA settings refused: {0}")]
    Local(SettingsError),
}

impl MpaError {
    /// The LLP error code for a Terminate message (Layer 2 = LLP, Error Type
    /// 0 = MPA; RFC 5044 section 8, codes 0x05-0x07 from RFC 6581), or `None`
    /// for a startup timeout.
    pub fn llp_error_code(&self) -> Option<LlpErrorCode> {
        Some(match self {
            MpaError::BadFrame(e) => e.llp_error_code(),
            MpaError::Negotiation(e) => e.llp_error_code(),
            MpaError::Crc { .. } => LlpErrorCode::CrcError,
            MpaError::Framing(e) => e.llp_error_code(),
            MpaError::Rtr(_) => LlpErrorCode::NoMatchingRtr,
            MpaError::Timeout { .. } => return None,
            MpaError::PeerClosedDuringStartup { .. } | MpaError::ConnectionLost { .. } => {
                LlpErrorCode::TcpConnectionLost
            }
            MpaError::Local(_) => LlpErrorCode::LocalCatastrophic,
        })
    }

    /// The Terminate error cause (`ddp_rdmap::terminate::ErrorCause::Llp`)
    /// for [`MpaError::llp_error_code`], ready for
    /// `ddp_rdmap::terminate::Repr::for_error`.
    pub fn terminate_cause(&self) -> Option<ErrorCause> {
        let code = self.llp_error_code()?;
        LlpCode::from_u8(code.code()).map(ErrorCause::Llp)
    }
}

/// A call that cannot be carried out; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CallError {
    /// The call is not allowed in the current state (e.g. `accept` on an
    /// initiator or before the Request, `send_ulpdu` before `Established`).
    #[error("{call} not allowed in state {state:?}")]
    WrongState {
        /// The method called.
        call: &'static str,
        /// The state it was called in.
        state: State,
    },
    /// Settings given to `accept` / `reject` are invalid (IRD/ORD over 14
    /// bits, private data over 512 octets with the IRD/ORD word).
    #[error("invalid MPA settings: {0}")]
    Settings(SettingsError),
    /// A ULPDU of zero octets (MPA's ULPDU_Length must be at least 1).
    #[error("empty ULPDU")]
    EmptyUlpdu,
    /// The ULPDU is longer than MULPDU for the agreed framing and the EMSS
    /// (RFC 5044 section 4.5; one FPDU per TCP segment).
    #[error("ULPDU of {len} octets is longer than MULPDU {mulpdu}")]
    UlpduTooLong {
        /// The ULPDU length, in octets.
        len: usize,
        /// MULPDU, in octets.
        mulpdu: usize,
    },
    /// A Terminate was already queued: no FPDU may follow it (RFC 5040 section 5.3).
    #[error("a Terminate was already sent")]
    TerminateSent,
    /// `transmit_done` reported more octets than `poll_transmit` offered.
    #[error("transmit_done({done}) but only {pending} octets are pending")]
    TransmitOverrun {
        /// Octets reported.
        done: usize,
        /// Octets pending.
        pending: usize,
    },
    /// A frame could not be built (should not happen with valid settings).
    #[error("MPA frame: {0}")]
    Wire(WireError),
    /// An FPDU could not be built (should not happen for a ULPDU within MULPDU).
    #[error("FPDU: {0}")]
    Frame(FrameError),
}

/// The configuration cannot be used; no connection was made.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// The local settings are invalid (see `LocalSettings::validate`), e.g.
    /// private data too long, IRD/ORD over 14 bits, P2P with Rev 1.
    #[error("invalid MPA settings: {0}")]
    Settings(SettingsError),
    /// The EMSS is below [`MIN_EMSS`].
    #[error("EMSS of {emss} octets is below the minimum of {min}")]
    EmssTooSmall {
        /// The configured EMSS, in octets.
        emss: usize,
        /// [`MIN_EMSS`].
        min: usize,
    },
    /// The Request could not be built (should not happen with valid settings).
    #[error("MPA Request: {0}")]
    Wire(WireError),
}

/// The receiver of [`MpaConn::handle_rx_in_place`]: offered each ULPDU in place,
/// returns whether it consumed it.
pub type InPlace<'a> = dyn FnMut(&[u8]) -> bool + 'a;

/// Octets waiting to be written into the TCP send buffer, in order.
#[derive(Debug, Default)]
struct TxQueue {
    /// Bytes `head..end` are pending; `end..` is spare room kept initialised, so
    /// framing into it needs no zero-fill.
    buf: Vec<u8>,
    head: usize,
    end: usize,
}

impl TxQueue {
    fn pending(&self) -> &[u8] {
        self.buf.get(self.head..self.end).unwrap_or(&[])
    }

    fn len(&self) -> usize {
        self.end - self.head
    }

    /// Appends `bytes` (MPA frames).
    fn extend(&mut self, bytes: &[u8]) {
        self.buf.truncate(self.end);
        self.buf.extend_from_slice(bytes);
        self.end = self.buf.len();
    }

    /// Frames one FPDU at the end of the queue, straight into the buffer.
    fn frame(&mut self, framer: &mut Framer, parts: &[&[u8]]) -> Result<usize, FrameError> {
        let ulpdu_len: usize = parts.iter().map(|p| p.len()).sum();
        let need = self.end + framer.next_fpdu_len(ulpdu_len);
        if self.buf.len() < need {
            // Zero-filled once; later FPDUs reuse the room.
            self.buf
                .resize(need.max(self.buf.len() * 2).max(64 * 1024), 0);
        }
        let room = self.buf.get_mut(self.end..).unwrap_or(&mut []);
        let n = framer.write_parts(parts, room)?;
        self.end += n;
        Ok(n)
    }

    fn consume(&mut self, n: usize) {
        self.head += n;
        if self.head >= self.end {
            self.head = 0;
            self.end = 0;
        } else if self.head >= 64 * 1024 && self.head * 2 >= self.end {
            self.buf.copy_within(self.head..self.end, 0);
            self.end -= self.head;
            self.head = 0;
        }
    }
}

/// One MPA endpoint on one TCP connection. See the module documentation.
///
/// Methods are grouped as in `quinn-proto`: construction, getters, `handle_*`
/// inputs, application calls, `poll_*` outputs.
#[derive(Debug)]
pub struct MpaConn {
    role: Role,
    cfg: MpaConfig,
    state: State,
    reader: StartupReader,
    /// Startup deadline, microseconds; only while waiting for Request/Reply.
    deadline: Option<u64>,
    /// Responder: the peer's Request, kept for accept/reject.
    request: Option<Repr>,
    agreed: Option<Agreed>,
    framer: Option<Framer>,
    deframer: Option<Deframer>,
    tx: TxQueue,
    /// Responder: ULPDUs sent before the first FPDU arrived; initiator: ULPDUs
    /// sent during the first-FPDU hold. Unframed.
    held: VecDeque<Vec<u8>>,
    /// Initiator: end of the first-FPDU hold ([`MpaConfig::first_fpdu_delay_us`]),
    /// microseconds.
    hold_until: Option<u64>,
    /// This side may put FPDUs on the wire (startup rule satisfied).
    tx_open: bool,
    /// Responder: the first FPDU from the initiator was received.
    first_fpdu_seen: bool,
    read_rtr_outstanding: bool,
    terminate_sent: bool,
    events: VecDeque<MpaEvent>,
    llp_close: Option<LlpClose>,
}

impl MpaConn {
    // ---- construction -------------------------------------------------

    /// An initiator: builds the MPA Request with `mpa::negotiate::request`
    /// from `cfg.settings` and queues it for `poll_transmit`; the startup
    /// deadline is `now + cfg.startup_timeout_us` (`now` in microseconds).
    ///
    /// Errors: [`ConfigError::Settings`] (e.g. private data over 508 octets
    /// with Rev 2), [`ConfigError::EmssTooSmall`].
    pub fn initiator(cfg: MpaConfig, now: u64) -> Result<MpaConn, ConfigError> {
        check_config(&cfg)?;
        let request = negotiate::request(&cfg.settings).map_err(ConfigError::Settings)?;
        let bytes = request.to_bytes().map_err(ConfigError::Wire)?;
        let mut conn = MpaConn::new(Role::Initiator, cfg, now);
        conn.tx.extend(&bytes);
        tracing::debug!(role = ?conn.role, "MPA Request queued");
        Ok(conn)
    }

    /// A responder, waiting for the MPA Request until `now +
    /// cfg.startup_timeout_us` (microseconds).
    ///
    /// Errors: [`ConfigError::Settings`], [`ConfigError::EmssTooSmall`].
    pub fn responder(cfg: MpaConfig, now: u64) -> Result<MpaConn, ConfigError> {
        check_config(&cfg)?;
        Ok(MpaConn::new(Role::Responder, cfg, now))
    }

    fn new(role: Role, cfg: MpaConfig, now: u64) -> MpaConn {
        let (expect, state) = match role {
            Role::Initiator => (FrameKind::Reply, State::AwaitingReply),
            Role::Responder => (FrameKind::Request, State::AwaitingRequest),
        };
        MpaConn {
            role,
            reader: StartupReader::new(Some(expect), cfg.limits),
            deadline: Some(now.saturating_add(cfg.startup_timeout_us)),
            cfg,
            state,
            request: None,
            agreed: None,
            framer: None,
            deframer: None,
            tx: TxQueue::default(),
            held: VecDeque::new(),
            hold_until: None,
            tx_open: false,
            first_fpdu_seen: false,
            read_rtr_outstanding: false,
            terminate_sent: false,
            events: VecDeque::new(),
            llp_close: None,
        }
    }

    // ---- getters --------------------------------------------------------

    /// The role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// The configuration.
    pub fn config(&self) -> &MpaConfig {
        &self.cfg
    }

    /// The agreed settings, once negotiation succeeded.
    pub fn agreed(&self) -> Option<&Agreed> {
        self.agreed.as_ref()
    }

    /// Responder: the peer's MPA Request, once received.
    pub fn peer_request(&self) -> Option<&Repr> {
        self.request.as_ref()
    }

    /// MULPDU: the largest ULPDU, in octets, that [`MpaConn::send_ulpdu`]
    /// accepts, so that each FPDU fits one TCP segment of `cfg.emss` octets
    /// with this side's transmit framing (RFC 5044 section 4.5,
    /// `mpa::fpdu::mulpdu`). `None` until the transmit framing is known.
    pub fn mulpdu(&self) -> Option<usize> {
        self.framer
            .as_ref()
            .map(|f| mulpdu(self.cfg.emss, f.framing().markers))
    }

    /// How the driver should end the TCP connection, once decided (see
    /// [`LlpClose`] and the module documentation); `None` while open.
    pub fn llp_close(&self) -> Option<LlpClose> {
        self.llp_close
    }

    /// The first MSNs the upper layer uses on QN 0 and QN 1, accounting for a
    /// Send or Read RTR (RFC 5041 section 4.3; see the module documentation).
    /// `None` until negotiation succeeded.
    pub fn initial_msn(&self) -> Option<InitialMsn> {
        let agreed = self.agreed.as_ref()?;
        let mut msn = InitialMsn {
            send_tx: 1,
            send_rx: 1,
            read_tx: 1,
            read_rx: 1,
        };
        let (send, read) = match self.role {
            Role::Initiator => (&mut msn.send_tx, &mut msn.read_tx),
            Role::Responder => (&mut msn.send_rx, &mut msn.read_rx),
        };
        match agreed.rtr {
            Some(RtrKind::Send) => *send = 2,
            Some(RtrKind::Read) => *read = 2,
            Some(RtrKind::Write) | None => {}
        }
        Some(msn)
    }

    /// Initiator: the Read RTR was sent and its zero-length Read Response has
    /// not arrived yet; the upper layer counts it against its ORD meanwhile
    /// (siw keeps it in its ORQ).
    pub fn read_rtr_outstanding(&self) -> bool {
        self.read_rtr_outstanding
    }

    /// Octets queued for `poll_transmit`, not yet reported done.
    pub fn transmit_pending(&self) -> usize {
        self.tx.len()
    }

    /// Responder: ULPDUs held until the initiator's first FPDU arrives.
    pub fn held_ulpdus(&self) -> usize {
        self.held.len()
    }

    /// Whether [`MpaConn::send_terminate`] would be accepted: the transmit
    /// framing is known, the startup rules let this side send FPDUs, no
    /// Terminate was sent, and the state is `FullOperation`, `Closing` or
    /// `Failed`.
    pub fn can_send_terminate(&self) -> bool {
        self.framer.is_some()
            && self.tx_open
            && !self.terminate_sent
            && matches!(
                self.state,
                State::FullOperation | State::Closing | State::Failed
            )
    }

    // ---- inputs -----------------------------------------------------------

    /// Feeds octets of the TCP receive stream, in order, in chunks of any
    /// size; `now` is the current time in microseconds (a startup deadline
    /// that has passed fires first, as in [`MpaConn::handle_timeout`]).
    ///
    /// Returns how many octets were consumed. All are consumed, except:
    /// * responder in [`State::AwaitingDecision`]: the octets behind the
    ///   Request are not taken before `accept` (offer them again after it);
    /// * after a fatal error: the octets from the end of the offending frame
    ///   or FPDU on are not taken (the driver aborts);
    /// * in [`State::Closed`]: nothing is taken.
    ///
    /// In [`State::Closing`] after a reject, octets are taken and dropped.
    /// Results come as events.
    pub fn handle_rx(&mut self, data: &[u8], now: u64) -> usize {
        self.rx(data, now, None)
    }

    /// As [`MpaConn::handle_rx`], but a received ULPDU is first offered in place to
    /// `deliver` (a slice of `data`, or of the deframer's buffer when the FPDU
    /// spans chunks or carries Markers): no copy, no allocation. `deliver` returns
    /// true if it consumed the ULPDU; false makes it an [`MpaEvent::Ulpdu`] as
    /// with `handle_rx`. A ULPDU is offered only when no event is queued ahead of
    /// it (so the order of events and ULPDUs is kept) and MPA has nothing to do
    /// with it (not the responder's first FPDU, nor a Read Response while
    /// [`MpaConn::read_rtr_outstanding`]). Once `deliver` declines one, the
    /// ULPDUs behind it in the same call become events too.
    pub fn handle_rx_in_place(
        &mut self,
        data: &[u8],
        now: u64,
        deliver: &mut InPlace<'_>,
    ) -> usize {
        self.rx(data, now, Some(deliver))
    }

    fn rx(&mut self, data: &[u8], now: u64, deliver: Option<&mut InPlace<'_>>) -> usize {
        self.check_deadline(now);
        match self.state {
            State::AwaitingRequest | State::AwaitingReply => self.rx_startup(data, now),
            State::AwaitingDecision | State::Closed | State::Failed => 0,
            State::AwaitingFirstFpdu | State::FullOperation => self.rx_fpdus(data, deliver),
            State::Closing => {
                if self.deframer.is_some() {
                    self.rx_fpdus(data, deliver)
                } else {
                    data.len()
                }
            }
        }
    }

    /// Tells the time, in microseconds. At or after the startup deadline
    /// ([`MpaConn::poll_timeout`]) while still waiting for the Request or
    /// Reply, the connection fails with [`MpaError::Timeout`]. Otherwise
    /// nothing happens.
    pub fn handle_timeout(&mut self, now: u64) {
        self.check_deadline(now);
        if self.hold_until.is_some_and(|t| now >= t) {
            self.end_hold();
        }
    }

    /// The TCP connection ended: `graceful` for a FIN from the peer (all its
    /// data delivered), `false` for a reset or a lost connection.
    ///
    /// * During startup (waiting for the Request, the decision or the
    ///   Reply): [`MpaError::PeerClosedDuringStartup`].
    /// * In full operation (or a responder waiting for the first FPDU): a FIN
    ///   between FPDUs gives [`MpaEvent::Closed`]; a reset, or a FIN inside an
    ///   FPDU, gives [`MpaError::ConnectionLost`] (LLP code 0x01).
    /// * In [`State::Closing`]: [`MpaEvent::Closed`].
    /// * In a terminal state: nothing.
    pub fn handle_tcp_closed(&mut self, graceful: bool) {
        match self.state {
            State::AwaitingRequest | State::AwaitingDecision | State::AwaitingReply => {
                self.fail(MpaError::PeerClosedDuringStartup { graceful });
            }
            State::AwaitingFirstFpdu | State::FullOperation => {
                let mid_fpdu = self.deframer.as_ref().is_some_and(|d| !d.is_idle());
                if graceful && !mid_fpdu {
                    self.llp_close = Some(LlpClose::Graceful);
                    self.enter_closed();
                } else {
                    self.fail(MpaError::ConnectionLost { graceful, mid_fpdu });
                }
            }
            State::Closing => self.enter_closed(),
            State::Closed | State::Failed => {}
        }
    }

    // ---- application calls --------------------------------------------

    /// Responder: accepts the connection after [`MpaEvent::ConnectRequest`],
    /// with `private_data` (octets, at most 508 with Rev 2), `ird` and `ord`
    /// (14 bits) replacing those of `cfg.settings`. Builds the Reply with
    /// `mpa::negotiate::respond`:
    /// * accepted: the Reply is queued, [`MpaEvent::Established`] is reported
    ///   and the state is [`State::AwaitingFirstFpdu`];
    /// * refused by the MPA rules (e.g. the initiator's ORD over `ird` with
    ///   `relaxed_ird_ord` off): a reject Reply is queued,
    ///   [`MpaError::Negotiation`] is reported (LLP code 0x06 for IRD, 0x07
    ///   for RTR), `llp_close` is `Graceful`. The call still returns `Ok`.
    ///
    /// Errors (nothing changes): [`CallError::WrongState`] unless in
    /// [`State::AwaitingDecision`]; [`CallError::Settings`].
    pub fn accept(&mut self, private_data: &[u8], ird: u16, ord: u16) -> Result<(), CallError> {
        let request = match (self.state, &self.request) {
            (State::AwaitingDecision, Some(request)) => request,
            _ => return Err(self.wrong_state("accept")),
        };
        let mut settings = self.cfg.settings.clone();
        settings.private_data = private_data.to_vec();
        settings.ird = ird;
        settings.ord = ord;
        settings.validate().map_err(CallError::Settings)?;
        match negotiate::respond(&settings, request).map_err(CallError::Settings)? {
            Response::Accept { agreed, reply } => {
                let bytes = reply.to_bytes().map_err(CallError::Wire)?;
                self.tx.extend(&bytes);
                self.start_full_operation(agreed.clone());
                self.set_state(State::AwaitingFirstFpdu);
                self.events.push_back(MpaEvent::Established { agreed });
                Ok(())
            }
            Response::Reject { reason, reply } => {
                let bytes = reply.to_bytes().map_err(CallError::Wire)?;
                self.tx.extend(&bytes);
                self.fail_with(MpaError::Negotiation(reason), LlpClose::Graceful);
                Ok(())
            }
        }
    }

    /// Responder: rejects the connection after [`MpaEvent::ConnectRequest`]
    /// with a reject Reply (R set, RFC 5044 section 7.1.1) carrying
    /// `private_data` (octets), built by `mpa::negotiate::reject_reply`. The
    /// state becomes [`State::Closing`] and `llp_close` `Graceful`.
    ///
    /// Errors (nothing changes): [`CallError::WrongState`] unless in
    /// [`State::AwaitingDecision`]; [`CallError::Settings`] for private data
    /// over the limit.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), CallError> {
        let request = match (self.state, &self.request) {
            (State::AwaitingDecision, Some(request)) => request,
            _ => return Err(self.wrong_state("reject")),
        };
        let reply = negotiate::reject_reply(&self.cfg.settings, request, private_data)
            .map_err(CallError::Settings)?;
        let bytes = reply.to_bytes().map_err(CallError::Wire)?;
        self.tx.extend(&bytes);
        self.llp_close = Some(LlpClose::Graceful);
        self.set_state(State::Closing);
        Ok(())
    }

    /// Sends one ULPDU (a DDP segment), the concatenation of `parts`, as one
    /// FPDU framed by `mpa::fpdu::Framer` with the agreed transmit framing
    /// (CRC computed while copying into the transmit queue, Markers inserted
    /// at their stream positions).
    ///
    /// Allowed in [`State::FullOperation`] and, on the responder, in
    /// [`State::AwaitingFirstFpdu`], where the ULPDU is held (copied, not
    /// framed) and framed in order when the initiator's first FPDU arrives
    /// (RFC 5044 section 7.1.2).
    ///
    /// Errors (nothing changes): [`CallError::WrongState`] in any other
    /// state (before `Established`, while closing, after an error);
    /// [`CallError::TerminateSent`]; [`CallError::EmptyUlpdu`];
    /// [`CallError::UlpduTooLong`] beyond [`MpaConn::mulpdu`].
    pub fn send_ulpdu(&mut self, parts: &[&[u8]]) -> Result<(), CallError> {
        if !matches!(self.state, State::FullOperation | State::AwaitingFirstFpdu) {
            return Err(self.wrong_state("send_ulpdu"));
        }
        if self.terminate_sent {
            return Err(CallError::TerminateSent);
        }
        self.check_ulpdu(parts)?;
        if self.tx_open && self.held.is_empty() {
            self.frame(parts).map_err(CallError::Frame)
        } else {
            self.held.push_back(parts.concat());
            tracing::trace!(held = self.held.len(), "ULPDU held until the first FPDU");
            Ok(())
        }
    }

    /// Frames one ULPDU straight into `buf` (e.g. the free room of the TCP send
    /// buffer), CRC computed in the same copy, when it can go there at once: full
    /// operation (or the responder after the initiator's first FPDU), nothing else
    /// pending in [`MpaConn::poll_transmit`], and the whole FPDU fits in `buf`.
    /// Returns the FPDU's length (the caller must write those bytes to TCP now, in
    /// order), or `None` when it cannot (nothing changed: use
    /// [`MpaConn::send_ulpdu`], which queues or holds it).
    ///
    /// Errors (nothing changes): as [`MpaConn::send_ulpdu`].
    pub fn frame_into(
        &mut self,
        buf: &mut [u8],
        parts: &[&[u8]],
    ) -> Result<Option<usize>, CallError> {
        if !matches!(self.state, State::FullOperation | State::AwaitingFirstFpdu) {
            return Err(self.wrong_state("send_ulpdu"));
        }
        if self.terminate_sent {
            return Err(CallError::TerminateSent);
        }
        self.check_ulpdu(parts)?;
        if !self.tx_open || self.tx.len() > 0 || !self.held.is_empty() {
            return Ok(None);
        }
        let Some(framer) = self.framer.as_mut() else {
            return Ok(None);
        };
        let ulpdu_len: usize = parts.iter().map(|p| p.len()).sum();
        if buf.len() < framer.next_fpdu_len(ulpdu_len) {
            return Ok(None);
        }
        let n = framer.write_parts(parts, buf).map_err(CallError::Frame)?;
        tracing::trace!(role = ?self.role, fpdu_len = n, "FPDU framed in place");
        Ok(Some(n))
    }

    /// Sends a Terminate message (a ULPDU the upper layer built, e.g. with
    /// `ddp_rdmap::terminate::Repr::for_error` and
    /// [`MpaError::terminate_cause`]) as the last FPDU of this side
    /// (RFC 5040 section 5.3): allowed whenever
    /// [`MpaConn::can_send_terminate`] is true, also after a fatal error.
    /// Held ULPDUs are dropped; no FPDU is accepted afterwards.
    ///
    /// Errors (nothing changes): [`CallError::WrongState`],
    /// [`CallError::TerminateSent`], [`CallError::EmptyUlpdu`],
    /// [`CallError::UlpduTooLong`].
    pub fn send_terminate(&mut self, parts: &[&[u8]]) -> Result<(), CallError> {
        if self.terminate_sent {
            return Err(CallError::TerminateSent);
        }
        if !self.can_send_terminate() {
            return Err(self.wrong_state("send_terminate"));
        }
        self.check_ulpdu(parts)?;
        self.frame(parts).map_err(CallError::Frame)?;
        self.terminate_sent = true;
        self.held.clear();
        tracing::debug!(role = ?self.role, "Terminate queued");
        Ok(())
    }

    /// Closes gracefully: no more ULPDUs are accepted, held ULPDUs are
    /// dropped (they could never be sent), the startup timer stops; received
    /// FPDUs are still delivered. The state becomes [`State::Closing`] and
    /// `llp_close` `Graceful`: the driver writes out `poll_transmit` and
    /// sends FIN, then reports [`MpaConn::handle_tcp_closed`], which gives
    /// [`MpaEvent::Closed`]. Calling it again while closing does nothing.
    ///
    /// Errors: [`CallError::WrongState`] in [`State::Closed`] or [`State::Failed`].
    pub fn close(&mut self) -> Result<(), CallError> {
        match self.state {
            State::Closed | State::Failed => Err(self.wrong_state("close")),
            State::Closing => Ok(()),
            _ => {
                // An initiator's held ULPDUs can go (ahead of the FIN); a
                // responder's never could.
                self.end_hold();
                if self.tx_open {
                    // Closing: what is held goes out at once, ahead of the FIN.
                    self.frame_held(true);
                }
                self.held.clear();
                self.deadline = None;
                self.llp_close = Some(LlpClose::Graceful);
                self.set_state(State::Closing);
                Ok(())
            }
        }
    }

    /// Reports that the first `n` octets of [`MpaConn::poll_transmit`] were
    /// written into the TCP send buffer.
    ///
    /// Errors (nothing changes): [`CallError::TransmitOverrun`] if `n` is
    /// more than is pending.
    pub fn transmit_done(&mut self, n: usize) -> Result<(), CallError> {
        let pending = self.tx.len();
        if n > pending {
            return Err(CallError::TransmitOverrun { done: n, pending });
        }
        self.tx.consume(n);
        // Held ULPDUs leave one FPDU at a time: the connection writes the next only
        // once this one is out, so each leaves as its own segment.
        if self.tx.len() == 0 && self.tx_open {
            self.release_held();
        }
        Ok(())
    }

    // ---- outputs --------------------------------------------------------------

    /// The octets to write into the TCP send buffer next, in order (Request
    /// or Reply, then FPDUs), or `None` if nothing is pending. Write as many
    /// as fit and report them with [`MpaConn::transmit_done`].
    pub fn poll_transmit(&mut self) -> Option<&[u8]> {
        let pending = self.tx.pending();
        (!pending.is_empty()).then_some(pending)
    }

    /// The next event, in order.
    pub fn poll_event(&mut self) -> Option<MpaEvent> {
        self.events.pop_front()
    }

    /// The startup deadline in microseconds (same clock as `now`) while
    /// waiting for the Request or Reply; `None` otherwise.
    pub fn poll_timeout(&self) -> Option<u64> {
        match self.state {
            State::AwaitingRequest | State::AwaitingReply => self.deadline,
            State::FullOperation => self.hold_until,
            _ => None,
        }
    }

    // ---- internals --------------------------------------------------------------

    fn wrong_state(&self, call: &'static str) -> CallError {
        CallError::WrongState {
            call,
            state: self.state,
        }
    }

    fn set_state(&mut self, state: State) {
        if self.state != state {
            tracing::debug!(role = ?self.role, from = ?self.state, to = ?state, "MPA state");
            self.state = state;
        }
    }

    fn enter_closed(&mut self) {
        self.held.clear();
        self.deadline = None;
        self.set_state(State::Closed);
        self.events.push_back(MpaEvent::Closed);
    }

    /// Reports a fatal error (once) and moves to `Failed`; `llp_close`
    /// becomes `Abort`.
    fn fail(&mut self, error: MpaError) {
        self.fail_with(error, LlpClose::Abort);
    }

    /// Reports a fatal error (once), moves to `Failed` and sets `llp_close`.
    fn fail_with(&mut self, error: MpaError, close: LlpClose) {
        if matches!(self.state, State::Failed | State::Closed) {
            return;
        }
        self.llp_close = Some(close);
        tracing::debug!(role = ?self.role, %error, "MPA connection failed");
        self.held.clear();
        self.deadline = None;
        self.read_rtr_outstanding = false;
        self.set_state(State::Failed);
        self.events.push_back(MpaEvent::Error(error));
    }

    fn check_deadline(&mut self, now: u64) {
        let Some(deadline) = self
            .deadline
            .filter(|_| matches!(self.state, State::AwaitingRequest | State::AwaitingReply))
        else {
            return;
        };
        if now >= deadline {
            let waiting_for = match self.role {
                Role::Initiator => FrameKind::Reply,
                Role::Responder => FrameKind::Request,
            };
            self.fail(MpaError::Timeout { waiting_for });
        }
    }

    fn check_ulpdu(&self, parts: &[&[u8]]) -> Result<(), CallError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len == 0 {
            return Err(CallError::EmptyUlpdu);
        }
        let max = self.mulpdu().unwrap_or(0);
        if len > max {
            return Err(CallError::UlpduTooLong { len, mulpdu: max });
        }
        Ok(())
    }

    /// Frames one ULPDU into the transmit queue.
    fn frame(&mut self, parts: &[&[u8]]) -> Result<(), FrameError> {
        let Some(framer) = self.framer.as_mut() else {
            // Unreachable: callers check that the framing is known.
            return Err(FrameError::UlpduLength { len: 0 });
        };
        let len = self.tx.frame(framer, parts)?;
        tracing::trace!(role = ?self.role, fpdu_len = len, "FPDU queued");
        Ok(())
    }

    fn start_full_operation(&mut self, agreed: Agreed) {
        self.framer = Some(Framer::new(agreed.tx_framing()));
        self.deframer = Some(Deframer::new(DeframerConfig::new(agreed.rx_framing())));
        self.deadline = None;
        self.agreed = Some(agreed);
    }

    /// Startup: feeds the StartupReader; behind a Reply, the FPDU stream.
    fn rx_startup(&mut self, data: &[u8], now: u64) -> usize {
        match self.reader.push(data) {
            Ok(Startup::Incomplete) => data.len(),
            Ok(Startup::Complete { frame, rest }) => {
                let used = data.len() - rest.len();
                match self.role {
                    Role::Responder => {
                        self.on_request(frame);
                        used
                    }
                    Role::Initiator => {
                        self.on_reply(frame, now);
                        match self.state {
                            State::FullOperation => used + self.rx_fpdus(rest, None),
                            State::Closing => data.len(),
                            _ => used,
                        }
                    }
                }
            }
            Err(WireError::BadRevision(rev)) if self.role == Role::Responder => {
                // A Request (the reader checked the key first) of a Rev this side
                // does not speak: a reject Reply with our Rev, then FIN
                // (`negotiate::unsupported_revision_reply`).
                let reply = negotiate::unsupported_revision_reply(&self.cfg.settings);
                let close = match reply.to_bytes() {
                    Ok(bytes) => {
                        self.tx.extend(&bytes);
                        LlpClose::Graceful
                    }
                    Err(_) => LlpClose::Abort,
                };
                tracing::debug!(rev, "MPA Request of an unsupported Rev rejected");
                self.fail_with(MpaError::BadFrame(WireError::BadRevision(rev)), close);
                data.len()
            }
            Err(e) => {
                self.fail(MpaError::BadFrame(e));
                data.len()
            }
        }
    }

    fn on_request(&mut self, request: Repr) {
        self.deadline = None;
        tracing::debug!(role = ?self.role, rev = request.rev, crc = request.crc,
            markers = request.markers, "MPA Request received");
        // Refuse right away what no accept() argument can fix (siw checks
        // CRC and Markers in siw_proc_mpareq before the upcall).
        if let Ok(Response::Reject { reason, reply }) =
            negotiate::respond(&self.cfg.settings, &request)
        {
            if !matches!(reason, NegotiationError::InsufficientIrd { .. }) {
                // The reject Reply must reach the initiator: FIN, not RST.
                let close = match reply.to_bytes() {
                    Ok(bytes) => {
                        self.tx.extend(&bytes);
                        LlpClose::Graceful
                    }
                    Err(_) => LlpClose::Abort,
                };
                self.request = Some(request);
                self.fail_with(MpaError::Negotiation(reason), close);
                return;
            }
        }
        self.request = Some(request.clone());
        self.set_state(State::AwaitingDecision);
        self.events.push_back(MpaEvent::ConnectRequest { request });
    }

    fn on_reply(&mut self, reply: Repr, now: u64) {
        self.deadline = None;
        match negotiate::complete(&self.cfg.settings, &reply) {
            Ok(agreed) => {
                self.start_full_operation(agreed.clone());
                let delay = self.cfg.first_fpdu_delay_us;
                self.tx_open = delay == 0;
                if delay > 0 {
                    self.hold_until = Some(now.saturating_add(delay));
                    tracing::debug!(delay_us = delay, "first FPDU held");
                }
                self.set_state(State::FullOperation);
                self.events.push_back(MpaEvent::Established {
                    agreed: agreed.clone(),
                });
                if let Some(kind) = agreed.rtr {
                    let ulpdu = rtr_ulpdu(kind);
                    if !self.tx_open {
                        self.held.push_front(ulpdu);
                    } else if let Err(e) = self.frame(&[&ulpdu]) {
                        tracing::debug!(%e, "RTR not framed");
                    }
                    self.read_rtr_outstanding = kind == RtrKind::Read;
                    tracing::debug!(?kind, "RTR queued");
                }
            }
            Err(InitiatorError::Rejected { private_data, .. }) => {
                self.llp_close = Some(LlpClose::Graceful);
                self.set_state(State::Closing);
                self.events.push_back(MpaEvent::Rejected { private_data });
            }
            Err(InitiatorError::Protocol(reason)) => {
                // The framing both frames imply, so the upper layer can send
                // the Terminate RFC 6581 asks for (e.g. Insufficient IRD).
                self.framer = Some(Framer::new(Framing {
                    crc: self.cfg.settings.crc.sets_c() || reply.crc,
                    markers: reply.markers,
                }));
                self.tx_open = true;
                self.fail(MpaError::Negotiation(reason));
            }
            Err(InitiatorError::Settings(e)) => self.fail(MpaError::Local(e)),
        }
    }

    /// Full operation: deframes FPDUs until the data ends or an error.
    fn rx_fpdus(&mut self, data: &[u8], mut deliver: Option<&mut InPlace<'_>>) -> usize {
        let mut off = 0;
        while off < data.len() {
            // In place only when nothing is queued ahead and on_ulpdu would just
            // queue the ULPDU (see handle_rx_in_place).
            let in_place = deliver.is_some()
                && self.events.is_empty()
                && !self.read_rtr_outstanding
                && (self.role == Role::Initiator || self.first_fpdu_seen)
                && matches!(self.state, State::FullOperation | State::Closing);
            let Some(deframer) = self.deframer.as_mut() else {
                break;
            };
            let (n, item) = deframer.decode(&data[off..]);
            off += n;
            let item = match item {
                None => break,
                Some(Ok(fpdu)) => {
                    tracing::trace!(
                        offset = fpdu.offset,
                        wire_len = fpdu.wire_len,
                        "FPDU received"
                    );
                    if in_place {
                        if let Some(d) = deliver.as_mut() {
                            if d(fpdu.ulpdu) {
                                continue;
                            }
                        }
                        deliver = None;
                    }
                    Ok(fpdu.ulpdu.to_vec())
                }
                Some(Err(e)) => Err(e),
            };
            match item {
                Ok(ulpdu) => self.on_ulpdu(ulpdu),
                Err(DeframeError::BadCrc {
                    offset,
                    received,
                    computed,
                    ..
                }) => {
                    self.first_fpdu_in();
                    self.fail(MpaError::Crc {
                        offset,
                        received,
                        computed,
                    })
                }
                Err(e) => {
                    self.first_fpdu_in();
                    self.fail(MpaError::Framing(e))
                }
            }
            if self.state == State::Failed {
                break;
            }
        }
        off
    }

    /// Responder: octets of the initiator's FPDU stream arrived, so the
    /// initiator has left startup (RFC 5044 section 7.1.2 holds this side's
    /// FPDUs only until then). Called before failing on a bad first FPDU (CRC
    /// or framing), so that the Terminate can still go out behind the Reply,
    /// as Linux siw does (`siw_rx_data` -> `siw_init_terminate(qp,
    /// TERM_ERROR_LAYER_LLP, LLP_ETYPE_MPA, LLP_ECODE_RECEIVED_CRC, 0)`; siw's
    /// responder holds nothing).
    fn first_fpdu_in(&mut self) {
        if self.role == Role::Responder && !self.first_fpdu_seen {
            self.first_fpdu_seen = true;
            self.tx_open = true;
        }
    }

    fn on_ulpdu(&mut self, ulpdu: Vec<u8>) {
        if self.role == Role::Responder && !self.first_fpdu_seen {
            self.first_fpdu_seen = true;
            self.tx_open = true;
            let rtr = self.agreed.as_ref().and_then(|a| a.rtr);
            if let Some(kind) = rtr {
                match check_rtr(kind, &ulpdu) {
                    Ok(response) => {
                        tracing::debug!(?kind, "RTR received");
                        if let Some(response) = response {
                            if let Err(e) = self.frame(&[&response]) {
                                tracing::debug!(%e, "Read Response to the RTR not framed");
                            }
                        }
                    }
                    Err(e) => {
                        self.fail(MpaError::Rtr(e));
                        return;
                    }
                }
            }
            self.release_held();
            if self.state == State::AwaitingFirstFpdu {
                self.set_state(State::FullOperation);
            }
            if rtr.is_some() {
                return;
            }
        } else if self.read_rtr_outstanding {
            if let Ok(parsed) = Ulpdu::parse(&ulpdu) {
                if parsed.opcode() == Opcode::ReadResponse {
                    if parsed.payload.is_empty() && parsed.last() {
                        self.read_rtr_outstanding = false;
                        tracing::debug!("Read Response to the Read RTR received");
                    } else {
                        self.fail(MpaError::Rtr(RtrError::ReadResponseNotEmpty {
                            payload_len: parsed.payload.len(),
                            last: parsed.last(),
                        }));
                    }
                    return;
                }
            }
        }
        self.events.push_back(MpaEvent::Ulpdu(ulpdu));
    }

    /// Initiator: ends the first-FPDU hold, framing what was held.
    fn end_hold(&mut self) {
        if self.hold_until.take().is_some() && self.state == State::FullOperation {
            self.tx_open = true;
            self.release_held();
        }
    }

    /// Frames the oldest held ULPDU when nothing else is pending; the next when that
    /// one has been written ([`MpaConn::transmit_done`]). Framing them all at once
    /// would hand TCP one block of FPDUs that it cuts every MSS octets, whatever the
    /// FPDU boundaries.
    fn release_held(&mut self) {
        if self.tx.len() == 0 {
            self.frame_held(false);
        }
    }

    /// Frames held ULPDUs in order: all of them (`all`), or until one is framed (while
    /// anything is held, new ULPDUs queue behind it, so an empty transmit queue with
    /// ULPDUs held would stall the connection).
    fn frame_held(&mut self, all: bool) {
        while let Some(ulpdu) = self.held.pop_front() {
            match self.frame(&[&ulpdu]) {
                Ok(()) if !all => break,
                Ok(()) => {}
                // Unreachable: the length was checked against MULPDU.
                Err(e) => tracing::debug!(%e, "held ULPDU not framed"),
            }
        }
    }
}

fn check_config(cfg: &MpaConfig) -> Result<(), ConfigError> {
    cfg.settings.validate().map_err(ConfigError::Settings)?;
    if cfg.emss < MIN_EMSS {
        return Err(ConfigError::EmssTooSmall {
            emss: cfg.emss,
            min: MIN_EMSS,
        });
    }
    Ok(())
}

/// Emits `header` (and `body`) into a new vector.
fn build(header: Header, body: Option<ReadRequestRepr>) -> Vec<u8> {
    let mut out = vec![0u8; header.buffer_len() + body.map_or(0, |b| b.buffer_len())];
    let h = header.buffer_len();
    // Cannot fail: the buffer is exactly long enough and the opcodes match
    // their buffer models.
    let _ = header.emit(&mut out);
    if let (Some(body), Some(tail)) = (body, out.get_mut(h..)) {
        let _ = body.emit(tail);
    }
    out
}

/// The ULPDU of the zero-length RTR of `kind` the initiator sends (see the
/// module documentation for the field values and their sources).
fn rtr_ulpdu(kind: RtrKind) -> Vec<u8> {
    match kind {
        RtrKind::Write => build(
            Header {
                opcode: Opcode::Write,
                last: true,
                buffer: BufferModel::Tagged { stag: 1, to: 0 },
            },
            None,
        ),
        RtrKind::Send => build(
            Header {
                opcode: Opcode::Send,
                last: true,
                buffer: BufferModel::Untagged {
                    rsvd_ulp: 0,
                    qn: QN_SEND,
                    msn: 1,
                    mo: 0,
                },
            },
            None,
        ),
        RtrKind::Read => build(
            Header {
                opcode: Opcode::ReadRequest,
                last: true,
                buffer: BufferModel::Untagged {
                    rsvd_ulp: 0,
                    qn: QN_READ_REQUEST,
                    msn: 1,
                    mo: 0,
                },
            },
            Some(ReadRequestRepr {
                sink_stag: 0,
                sink_to: 0,
                size: 0,
                src_stag: 1,
                src_to: 0,
            }),
        ),
    }
}

/// The zero-length RDMA Read Response answering a Read RTR.
fn read_response_ulpdu(sink_stag: u32, sink_to: u64) -> Vec<u8> {
    build(
        Header {
            opcode: Opcode::ReadResponse,
            last: true,
            buffer: BufferModel::Tagged {
                stag: sink_stag,
                to: sink_to,
            },
        },
        None,
    )
}

/// Checks that `ulpdu` is the zero-length RTR of `kind`; for a Read RTR,
/// returns the Read Response ULPDU to send.
fn check_rtr(kind: RtrKind, ulpdu: &[u8]) -> Result<Option<Vec<u8>>, RtrError> {
    let not_rtr = |opcode| RtrError::NotRtr {
        expected: kind,
        opcode,
        ulpdu_len: ulpdu.len(),
    };
    let parsed =
        Ulpdu::parse(ulpdu).map_err(|_| not_rtr(Header::parse(ulpdu).ok().map(|h| h.opcode)))?;
    let h = parsed.header;
    let untagged_first = |qn: u32| h.qn() == Some(qn) && h.msn() == Some(1) && h.mo() == Some(0);
    let ok = h.last
        && parsed.payload.is_empty()
        && match (kind, parsed.body) {
            (RtrKind::Write, _) => h.opcode == Opcode::Write,
            (RtrKind::Send, _) => h.opcode == Opcode::Send && untagged_first(QN_SEND),
            (RtrKind::Read, Body::ReadRequest(rr)) => {
                if h.opcode == Opcode::ReadRequest
                    && untagged_first(QN_READ_REQUEST)
                    && rr.size == 0
                {
                    return Ok(Some(read_response_ulpdu(rr.sink_stag, rr.sink_to)));
                }
                false
            }
            (RtrKind::Read, _) => false,
        };
    if ok {
        Ok(None)
    } else {
        Err(not_rtr(Some(h.opcode)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// rping-srv_p2p-cli_p2p.pcap frame 10, the ULPDU of siw's Write RTR.
    #[test]
    fn write_rtr_matches_siw_capture() {
        assert_eq!(
            rtr_ulpdu(RtrKind::Write),
            unhex("c140 00000001 0000000000000000")
        );
        assert_eq!(
            check_rtr(RtrKind::Write, &rtr_ulpdu(RtrKind::Write)),
            Ok(None)
        );
    }

    #[test]
    fn read_and_send_rtr_bytes() {
        let read = rtr_ulpdu(RtrKind::Read);
        assert_eq!(
            read,
            unhex(
                "4141 00000000 00000001 00000001 00000000
                 00000000 0000000000000000 00000000 00000001 0000000000000000"
            )
        );
        assert_eq!(read.len(), 46);
        let response = check_rtr(RtrKind::Read, &read).unwrap().unwrap();
        assert_eq!(response, unhex("c142 00000000 0000000000000000"));
        let send = rtr_ulpdu(RtrKind::Send);
        assert_eq!(send, unhex("4143 00000000 00000000 00000001 00000000"));
        assert_eq!(check_rtr(RtrKind::Send, &send), Ok(None));
    }

    #[test]
    fn wrong_rtr_kinds_refused() {
        for expected in [RtrKind::Write, RtrKind::Read, RtrKind::Send] {
            for sent in [RtrKind::Write, RtrKind::Read, RtrKind::Send] {
                let got = check_rtr(expected, &rtr_ulpdu(sent));
                assert_eq!(got.is_ok(), expected == sent, "{expected:?} <- {sent:?}");
            }
            // Garbage, a Send with payload, MSN 2.
            assert!(matches!(
                check_rtr(expected, &[0xff; 3]),
                Err(RtrError::NotRtr { opcode: None, .. })
            ));
        }
        let mut send = rtr_ulpdu(RtrKind::Send);
        send.push(7);
        assert!(check_rtr(RtrKind::Send, &send).is_err());
        let mut send = rtr_ulpdu(RtrKind::Send);
        send[13] = 2;
        assert!(check_rtr(RtrKind::Send, &send).is_err());
        let mut read = rtr_ulpdu(RtrKind::Read);
        read[33] = 1; // read size 1
        assert!(check_rtr(RtrKind::Read, &read).is_err());
        let mut write = rtr_ulpdu(RtrKind::Write);
        write[0] = 0x81; // L = 0
        assert!(check_rtr(RtrKind::Write, &write).is_err());
    }

    #[test]
    fn calls_in_the_wrong_state_are_typed_errors() {
        let mut ini = MpaConn::initiator(MpaConfig::default(), 0).unwrap();
        assert_eq!(
            ini.accept(b"", 1, 1),
            Err(CallError::WrongState {
                call: "accept",
                state: State::AwaitingReply
            })
        );
        assert!(matches!(ini.reject(b""), Err(CallError::WrongState { .. })));
        assert!(matches!(
            ini.send_ulpdu(&[b"x"]),
            Err(CallError::WrongState { .. })
        ));
        assert!(matches!(
            ini.send_terminate(&[b"x"]),
            Err(CallError::WrongState { .. })
        ));
        assert_eq!(ini.mulpdu(), None);
        assert_eq!(ini.initial_msn(), None);
        let pending = ini.transmit_pending();
        assert_eq!(pending, 24);
        assert_eq!(
            ini.transmit_done(25),
            Err(CallError::TransmitOverrun {
                done: 25,
                pending: 24
            })
        );
        assert_eq!(ini.transmit_pending(), 24);
        ini.transmit_done(10).unwrap();
        assert_eq!(ini.poll_transmit().map(<[u8]>::len), Some(14));
        ini.transmit_done(14).unwrap();
        assert_eq!(ini.poll_transmit(), None);
        ini.close().unwrap();
        ini.close().unwrap();
        assert_eq!(ini.state(), State::Closing);
        assert_eq!(ini.poll_timeout(), None);
        ini.handle_tcp_closed(true);
        assert_eq!(ini.poll_event(), Some(MpaEvent::Closed));
        assert!(matches!(ini.close(), Err(CallError::WrongState { .. })));
        assert_eq!(ini.handle_rx(b"anything", 5), 0);

        let mut rsp = MpaConn::responder(MpaConfig::default(), 0).unwrap();
        assert!(matches!(
            rsp.accept(b"", 1, 1),
            Err(CallError::WrongState { .. })
        ));
        assert!(matches!(
            rsp.send_ulpdu(&[b"x"]),
            Err(CallError::WrongState { .. })
        ));
        assert_eq!(rsp.poll_transmit(), None);
    }

    #[test]
    fn config_errors() {
        let mut cfg = MpaConfig::default();
        cfg.settings.private_data = vec![0; 509];
        assert!(matches!(
            MpaConn::initiator(cfg.clone(), 0),
            Err(ConfigError::Settings(SettingsError::PrivateDataTooLong {
                len: 509,
                limit: 508
            }))
        ));
        assert!(matches!(
            MpaConn::responder(cfg, 0),
            Err(ConfigError::Settings(_))
        ));
        let cfg = MpaConfig {
            emss: 100,
            ..MpaConfig::default()
        };
        assert_eq!(
            MpaConn::initiator(cfg, 0).unwrap_err(),
            ConfigError::EmssTooSmall {
                emss: 100,
                min: 128
            }
        );
    }

    #[test]
    fn error_codes() {
        assert_eq!(
            MpaError::Crc {
                offset: 0,
                received: 0,
                computed: 1
            }
            .llp_error_code(),
            Some(LlpErrorCode::CrcError)
        );
        assert_eq!(
            MpaError::Timeout {
                waiting_for: FrameKind::Reply
            }
            .terminate_cause(),
            None
        );
        assert_eq!(
            MpaError::Negotiation(NegotiationError::NoMatchingRtr).terminate_cause(),
            Some(ErrorCause::Llp(LlpCode::NoMatchingRtr))
        );
        assert_eq!(
            MpaError::ConnectionLost {
                graceful: true,
                mid_fpdu: true
            }
            .terminate_cause(),
            Some(ErrorCause::Llp(LlpCode::ConnectionLost))
        );
        assert_eq!(
            MpaError::BadFrame(WireError::BadKey).llp_error_code(),
            Some(LlpErrorCode::InvalidRequestReply)
        );
    }
}
