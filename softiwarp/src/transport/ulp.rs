//! The upper layer of a connection ([`Ulp`]) and what a [`Stack`] reports
//! about connections: [`ConnEvent`], [`ConnError`], [`StackEvent`].

use std::net::SocketAddrV4;

use ddp_rdmap::terminate::ErrorCause;
use mpa::negotiate::Agreed;
use mpa::wire::Repr;

use super::mpa_conn::{CallError, InitialMsn, MpaError, Role};
use super::{ConnId, ListenerId};
#[allow(unused_imports)] // doc links
use super::{Stack, RX_CHUNK};
use crate::link::{GoneReason, LinkEvent};

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

    /// [`Ulp::poll_ulpdu`] for the last FPDU of a run that must be full-sized but for its
    /// last one: with TCP segmentation offload, the FPDUs a connection writes in one
    /// round leave as one super-segment that the link cuts every MSS bytes, so only its
    /// last FPDU may be short (module docs of `transport`, "One FPDU per TCP segment").
    /// An upper that cuts messages into segments may put a message's short segment here
    /// (RDMAP does: `QpEngine::poll_transmit_at`), so the message's later segments are
    /// full and the next round can run on into the next message. Same contract and
    /// errors as `poll_ulpdu`. Default: `poll_ulpdu`.
    fn poll_ulpdu_ending_run(
        &mut self,
        mulpdu: usize,
        emit: &mut EmitUlpdu<'_>,
    ) -> Result<bool, CallError> {
        self.poll_ulpdu(mulpdu, emit)
    }

    /// A Terminate ULPDU the upper wants sent (RFC 5040 5.3, e.g. after a DDP or RDMAP
    /// error it detected). The stack sends it as the last FPDU, then aborts the
    /// connection ([`ConnError::TerminateSent`]). Asked before the first ULPDU of each
    /// transmit round, not before every ULPDU: an upper that has one queued reports no
    /// ULPDU from [`Ulp::poll_ulpdu`], which ends the round, and the next round takes
    /// it. Default: never.
    fn poll_terminate(&mut self) -> Option<Vec<u8>> {
        None
    }

    /// Whether the upper's stream already ended on its own: a QP whose RDMAP stream is
    /// terminated (it took the peer's Terminate, found an error and queued its own, or
    /// is in Error; RFC 5040 §7). When MPA then finds an error in the bytes behind
    /// (deframed in the same read), the stack sends the upper's queued Terminate if it
    /// has one ([`Ulp::poll_terminate`]: the first error in the stream is the one
    /// reported), else none: never one in answer to the peer's Terminate. Default:
    /// false.
    fn stream_ended(&mut self) -> bool {
        false
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
