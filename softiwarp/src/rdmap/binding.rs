//! The QP engine as the upper layer of a connection: `QpUlp` adapts one
//! [`crate::rdmap::engine::QpEngine`] protocol engine to the stack's [`Ulp`] trait, and
//! [`PartsSink`] turns the engine's ULPDU output into the framer's parts.
//!
//! # Ownership and threads
//!
//! A QP's protocol state lives in a `QpCore` behind an `Arc<Mutex<_>>` that only the
//! device's engine thread ever locks (design.md §5): the engine's QP table holds one
//! reference (for the verbs work the application enqueues: posts, modify, destroy), and
//! the `QpUlp` the stack owns for the QP's connection holds the other (for the
//! connection's callbacks: received ULPDUs, ULPDUs to send, the end of the
//! connection). Both run on the engine thread, one after the other, so the lock is never
//! contended; it exists because two owners on one thread need shared mutable access
//! and `Rc<RefCell<_>>` is not `Send`.
//!
//! What the application threads see of a QP is the `QpShared` mirror: the state,
//! ORD/IRD, access flags and counters, published by the engine after each touch, and
//! the [`WqCounters`] the engine bumps before it pushes a completion.
//!
//! # The connection's life
//!
//! - [`Ulp::on_established`]: ORD and IRD become the values the MPA negotiation
//!   agreed (RFC 6581 §3), the first MSNs those after any RTR, and the QP moves
//!   Reset/Init -> RTR -> RTS.
//! - Received ULPDUs go to [`QpEngine::handle_ulpdu`], in place
//!   (straight from the TCP receive buffer, [`Ulp::on_ulpdu_in_place`]) whenever the
//!   stack can offer them so: placement into the MR is the one copy.
//! - [`Ulp::poll_ulpdu`]: [`QpEngine::poll_transmit`] writes the
//!   next ULPDU through a [`PartsSink`], which hands the DDP/RDMAP header and the MR
//!   slice (under the MR's lock) to the MPA framer as two parts: the framer copies them
//!   into the connection's transmit buffer with the CRC32c in the same pass.
//! - A Terminate the engine queues goes out through [`Ulp::poll_terminate`], after which
//!   the stack aborts the connection; the peer's Terminate reaches the engine through
//!   [`Ulp::on_terminate`] (the oldest started send WR completes with the mapped status).
//! - [`Ulp::on_disconnected`], [`Ulp::on_closed`], [`Ulp::on_error`] (including device
//!   removal and shutdown): the QP goes to Error, flushing every outstanding WR.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use verbs::{AccessFlags, AsyncEvent, QpCap, QpState, RecvWr, SendWr, WcStatus, WorkCompletion};

use crate::rdmap::engine::{QpEngine, QpEvent, TxSink, WqCounters};
use crate::resources::completion_queue::CompletionQueue;
use crate::resources::event_queue::EventQueue;
use crate::transport::mpa_conn::CallError;
use crate::transport::{ConnError, ConnId, EmitUlpdu, Established, Ulp};

/// Largest ULPDU header the engine puts before a payload part: the untagged DDP/RDMAP
/// header (18 bytes) plus a Read Request or Immediate Data body (16 bytes) fits.
const HEADER_ROOM: usize = 64;

/// A [`TxSink`] that collects one ULPDU's parts and hands them to `consume` as a slice
/// of parts (what `mpa::fpdu::Framer::append_parts` and the stack's framing callback
/// take), copying nothing in the common case:
///
/// - a ULPDU put as one part (a Read Request, a Terminate, a header-only segment) is
///   handed over as that part;
/// - a header and one payload part (every segment whose payload lies in one MR, or is
///   inline) are handed over as two parts: the payload slice is MR memory, borrowed
///   while the engine holds the MR's lock, so the framer reads it straight from the MR;
/// - anything else (a segment crossing an SGE boundary) is gathered into a reused
///   scratch buffer first.
///
/// `consume` runs inside [`TxSink::put`] or [`TxSink::end`], possibly while an MR lock
/// is held: it must not call into the MR API. Its first error is kept
/// ([`PartsSink::take_error`]) and later ULPDUs are dropped.
pub struct PartsSink<F, E> {
    consume: F,
    total: usize,
    got: usize,
    header: [u8; HEADER_ROOM],
    header_len: usize,
    /// Bytes gathered when the ULPDU comes in more than two parts.
    scratch: Vec<u8>,
    gathering: bool,
    done: bool,
    emitted: usize,
    error: Option<E>,
}

impl<F, E> std::fmt::Debug for PartsSink<F, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartsSink")
            .field("emitted", &self.emitted)
            .field("failed", &self.error.is_some())
            .finish()
    }
}

impl<F, E> PartsSink<F, E>
where
    F: FnMut(&[&[u8]]) -> Result<(), E>,
{
    /// A sink handing each ULPDU to `consume`.
    pub fn new(consume: F) -> Self {
        PartsSink {
            consume,
            total: 0,
            got: 0,
            header: [0; HEADER_ROOM],
            header_len: 0,
            scratch: Vec::new(),
            gathering: false,
            done: true,
            emitted: 0,
            error: None,
        }
    }

    /// ULPDUs handed to `consume` successfully so far.
    pub fn emitted(&self) -> usize {
        self.emitted
    }

    /// The first error `consume` returned, if any.
    pub fn take_error(&mut self) -> Option<E> {
        self.error.take()
    }

    fn hand_over(&mut self, parts: &[&[u8]]) {
        if self.error.is_some() {
            return;
        }
        match (self.consume)(parts) {
            Ok(()) => self.emitted += 1,
            Err(e) => self.error = Some(e),
        }
    }
}

impl<F, E> TxSink for PartsSink<F, E>
where
    F: FnMut(&[&[u8]]) -> Result<(), E>,
{
    fn begin(&mut self, len: usize) {
        self.total = len;
        self.got = 0;
        self.header_len = 0;
        self.gathering = false;
        self.done = false;
        self.scratch.clear();
    }

    fn put(&mut self, bytes: &[u8]) {
        if self.done {
            return;
        }
        let first = self.got == 0 && self.header_len == 0 && !self.gathering;
        self.got = self.got.saturating_add(bytes.len());
        let last = self.got >= self.total;
        if self.gathering {
            self.scratch.extend_from_slice(bytes);
        } else if first && last {
            self.done = true;
            self.hand_over(&[bytes]);
        } else if first && bytes.len() <= HEADER_ROOM {
            self.header[..bytes.len()].copy_from_slice(bytes);
            self.header_len = bytes.len();
        } else if !first && last {
            self.done = true;
            let header = self.header;
            let hlen = self.header_len;
            self.hand_over(&[&header[..hlen], bytes]);
        } else {
            // More than two parts (or an unusually long first part): gather.
            self.gathering = true;
            let hlen = self.header_len;
            self.scratch.extend_from_slice(&self.header[..hlen]);
            self.scratch.extend_from_slice(bytes);
        }
    }

    fn end(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let scratch = std::mem::take(&mut self.scratch);
        if self.gathering {
            self.hand_over(&[&scratch]);
        } else if self.header_len > 0 {
            // A header alone announced longer than it was (cannot happen).
            let header = self.header;
            self.hand_over(&[&header[..self.header_len]]);
        }
        self.scratch = scratch;
    }
}

/// What application threads see of one QP, published by the engine thread after every
/// touch (see the [module documentation](self)).
#[derive(Debug)]
pub(crate) struct QpShared {
    pub(crate) qp_num: u32,
    pub(crate) cap: QpCap,
    pub(crate) sq_sig_all: bool,
    pub(crate) counters: Arc<WqCounters>,
    state: AtomicU32,
    ord: AtomicU32,
    ird: AtomicU32,
    access: AtomicU32,
    connected: AtomicBool,
    reads_max: AtomicUsize,
    read_responses_max: AtomicUsize,
    ulpdus_tx: AtomicU64,
    ulpdus_rx: AtomicU64,
    ulpdus_rx_in_place: AtomicU64,
    /// Application side: WRs accepted by the post calls and not yet taken by the
    /// engine, counts, destroyed. Held while a post is validated and queued.
    pub(crate) post: Mutex<PostSide>,
    /// Set by a poster after queueing a WR, cleared by the engine before it takes the
    /// queues: the engine checks it (cheaply) before every received ULPDU, so a receive
    /// posted before a message arrived is there when the message is processed.
    pub(crate) has_work: AtomicBool,
}

/// The application side of a QP's work queues, under [`QpShared::post`]: WRs posted
/// and not yet taken by the engine (the QP's "doorbell" queues, like a NIC's rings in
/// host memory), the counts of WRs ever accepted, and whether the QP was destroyed.
#[derive(Debug, Default)]
pub(crate) struct PostSide {
    pub(crate) sends: u64,
    pub(crate) recvs: u64,
    pub(crate) destroyed: bool,
    pub(crate) send_q: VecDeque<SendWr>,
    pub(crate) recv_q: VecDeque<RecvWr>,
}

/// A snapshot of the published counters of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpStats {
    /// Most RDMA Read Requests this QP had outstanding at once (never above ORD).
    pub reads_outstanding_max: usize,
    /// Most incoming Read Requests queued or being answered at once (never above
    /// IRD).
    pub read_responses_pending_max: usize,
    /// ULPDUs (DDP segments) sent, Terminate included.
    pub ulpdus_tx: u64,
    /// ULPDUs received and handed to the engine.
    pub ulpdus_rx: u64,
    /// Of those, the ones placed in place from the transport's receive buffer (the
    /// rest were copied out first: the FPDU came in pieces, or events were queued
    /// ahead of it).
    pub ulpdus_rx_in_place: u64,
}

impl QpShared {
    pub(crate) fn new(qp: &QpEngine) -> QpShared {
        let init = qp.init();
        QpShared {
            qp_num: init.qp_num,
            cap: init.cap,
            sq_sig_all: init.sq_sig_all,
            counters: Arc::clone(qp.counters()),
            state: AtomicU32::new(qp.state().to_ibv()),
            ord: AtomicU32::new(init.ord),
            ird: AtomicU32::new(init.ird),
            access: AtomicU32::new(init.access.bits()),
            connected: AtomicBool::new(false),
            reads_max: AtomicUsize::new(0),
            read_responses_max: AtomicUsize::new(0),
            ulpdus_tx: AtomicU64::new(0),
            ulpdus_rx: AtomicU64::new(0),
            ulpdus_rx_in_place: AtomicU64::new(0),
            post: Mutex::new(PostSide::default()),
            has_work: AtomicBool::new(false),
        }
    }

    pub(crate) fn lock_post(&self) -> MutexGuard<'_, PostSide> {
        self.post.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The state last published.
    pub(crate) fn state(&self) -> QpState {
        QpState::from_ibv(self.state.load(Ordering::Acquire)).unwrap_or(QpState::Error)
    }

    pub(crate) fn ord(&self) -> u32 {
        self.ord.load(Ordering::Acquire)
    }

    pub(crate) fn ird(&self) -> u32 {
        self.ird.load(Ordering::Acquire)
    }

    pub(crate) fn access(&self) -> AccessFlags {
        AccessFlags::from_bits_truncate(self.access.load(Ordering::Acquire))
    }

    pub(crate) fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    pub(crate) fn stats(&self) -> QpStats {
        QpStats {
            reads_outstanding_max: self.reads_max.load(Ordering::Acquire),
            read_responses_pending_max: self.read_responses_max.load(Ordering::Acquire),
            ulpdus_tx: self.ulpdus_tx.load(Ordering::Acquire),
            ulpdus_rx: self.ulpdus_rx.load(Ordering::Acquire),
            ulpdus_rx_in_place: self.ulpdus_rx_in_place.load(Ordering::Acquire),
        }
    }
}

/// One QP's protocol state and bookkeeping, owned by the engine thread (see the
/// [module documentation](self)).
#[derive(Debug)]
pub(crate) struct QpCore {
    pub(crate) qp: QpEngine,
    pub(crate) shared: Arc<QpShared>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    /// The live connection the QP is bound to.
    pub(crate) conn: Option<ConnId>,
    /// A Terminate that came out of `poll_transmit` (a WR failed as it started); it
    /// leaves through `poll_terminate`.
    pending_terminate: Option<Vec<u8>>,
    /// Verbs asynchronous events of the device.
    async_events: Arc<EventQueue<AsyncEvent>>,
    /// Set when the engine must poll the stack again at once.
    kick: Arc<AtomicBool>,
    /// Bumped at every (un)binding: a [`QpUlp`] of an older binding (a connection
    /// closed by the engine whose callbacks still come) is ignored.
    pub(crate) generation: u64,
    /// Swapped with the application's queues when the engine takes the posted WRs.
    send_scratch: VecDeque<SendWr>,
    recv_scratch: VecDeque<RecvWr>,
    pub(crate) span: tracing::Span,
    /// The QP's uses of its PD and CQs: released when the engine drops it after
    /// flushing and removing the QP (and the application dropped its handle).
    pub(crate) uses: Option<UsesGuard>,
    /// Raised when the QP went to Error by itself while still bound (the engine then
    /// aborts the connection: a QP in Error never keeps a live connection).
    pub(crate) errored: Option<Arc<AtomicBool>>,
    /// Set by the engine's destroy of the QP: the QP's asynchronous events are dropped
    /// from then on (siw's `SIW_QP_IN_DESTROY`: no event for a QP its user destroys,
    /// such as the Last WQE Reached of an SRQ QP's move to Error).
    pub(crate) in_destroy: bool,
}

/// What a QP's verbs object keeps in use while the engine holds the QP: its PD and CQs
/// (the API's `QpUses`, whose drop makes them free again). Opaque here: the engine only
/// drops it, once it flushed and removed the QP.
pub(crate) type UsesGuard = Arc<dyn std::fmt::Debug + Send + Sync>;

/// The shared handle to a [`QpCore`].
pub(crate) type CoreRef = Arc<Mutex<QpCore>>;

/// Locks a core (only ever on the engine thread; a panic while it was held cannot
/// leave the engine half-updated in a way later calls could not cope with).
pub(crate) fn lock(core: &CoreRef) -> MutexGuard<'_, QpCore> {
    core.lock().unwrap_or_else(PoisonError::into_inner)
}

impl QpCore {
    pub(crate) fn new(
        qp: QpEngine,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
        async_events: Arc<EventQueue<AsyncEvent>>,
        kick: Arc<AtomicBool>,
    ) -> QpCore {
        let span = tracing::debug_span!("qp", qpn = qp.qp_num());
        QpCore {
            shared: Arc::new(QpShared::new(&qp)),
            qp,
            send_cq,
            recv_cq,
            conn: None,
            pending_terminate: None,
            async_events,
            kick,
            generation: 0,
            send_scratch: VecDeque::new(),
            recv_scratch: VecDeque::new(),
            span,
            uses: None,
            errored: None,
            in_destroy: false,
        }
    }

    /// Takes the WRs the application posted if the doorbell says there are some.
    pub(crate) fn take_posted(&mut self) {
        // A plain load first: the common case (nothing posted) costs no atomic write.
        let w = &self.shared.has_work;
        if w.load(Ordering::Acquire) && w.swap(false, Ordering::AcqRel) {
            self.take_posted_now();
        }
    }

    /// Takes every WR the application posted and hands it to the engine: receives
    /// first (a receive posted with a request is there before any answer), then sends.
    /// A WR the engine refuses (a concurrent modify to Reset won the race) completes
    /// flushed.
    pub(crate) fn take_posted_now(&mut self) {
        {
            let mut p = self.shared.lock_post();
            std::mem::swap(&mut p.recv_q, &mut self.recv_scratch);
            std::mem::swap(&mut p.send_q, &mut self.send_scratch);
        }
        while let Some(wr) = self.recv_scratch.pop_front() {
            let wr_id = wr.wr_id;
            if let Err(e) = self.qp.post_recv(wr) {
                tracing::debug!(error = %e, wr_id, "receive WR refused by the engine: flushed");
                self.refused_recv(wr_id);
            }
        }
        while let Some(wr) = self.send_scratch.pop_front() {
            let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode());
            if let Err(e) = self.qp.post_send(wr) {
                tracing::debug!(error = %e, wr_id, "send WR refused by the engine: flushed");
                self.refused_send(wr_id, opcode);
            }
        }
    }

    /// Forwards the engine's events and publishes the mirror; runs after every touch.
    pub(crate) fn after(&mut self) {
        while let Some(ev) = self.qp.poll_event() {
            match ev {
                QpEvent::Async(e) if self.in_destroy => {
                    tracing::trace!(%e, "event of a QP in destroy dropped");
                }
                QpEvent::Async(e) => self.async_events.push(e),
                QpEvent::CqOverflow { cq } => {
                    tracing::debug!(cq, "CQ overflow");
                    self.async_events.push(AsyncEvent::CqErr { cq });
                }
                QpEvent::TerminateQueued { cause } => {
                    tracing::debug!(%cause, "Terminate queued");
                }
                QpEvent::TerminateReceived { cause } => {
                    tracing::debug!(?cause, "Terminate received");
                }
            }
        }
        if self.orphaned() {
            if let Some(flag) = &self.errored {
                flag.store(true, Ordering::Release);
                self.kick.store(true, Ordering::Release);
            }
        }
        self.publish();
    }

    /// True if the QP is in Error but still bound to a connection that no Terminate
    /// of its own will end (e.g. after a malformed Terminate from the peer): the
    /// engine must abort that connection.
    pub(crate) fn orphaned(&self) -> bool {
        self.conn.is_some()
            && self.qp.state() == QpState::Error
            && self.pending_terminate.is_none()
            && !self.qp.terminate_pending()
    }

    /// Publishes the mirror. Plain stores of values that rarely change, and the
    /// high-water marks only when they rise (no read-modify-write per ULPDU).
    fn publish(&self) {
        let s = &self.shared;
        let init = self.qp.init();
        s.state.store(self.qp.state().to_ibv(), Ordering::Release);
        s.ord.store(init.ord, Ordering::Release);
        s.ird.store(init.ird, Ordering::Release);
        s.access.store(init.access.bits(), Ordering::Release);
        s.connected.store(self.conn.is_some(), Ordering::Release);
        let reads = self.qp.reads_outstanding();
        if reads > s.reads_max.load(Ordering::Relaxed) {
            s.reads_max.store(reads, Ordering::Release);
        }
        let responses = self.qp.read_responses_pending();
        if responses > s.read_responses_max.load(Ordering::Relaxed) {
            s.read_responses_max.store(responses, Ordering::Release);
        }
    }

    /// Moves the QP to Error (flushing) unless it is in Reset or already in Error.
    pub(crate) fn enter_error(&mut self) {
        if !matches!(self.qp.state(), QpState::Reset | QpState::Error) {
            // Legal from every state but Reset.
            let _ = self.qp.modify_state(QpState::Error);
        }
    }

    /// Completes a send WR the engine refused although the post call accepted it
    /// (a concurrent modify to Reset won the race): it was flushed.
    pub(crate) fn refused_send(&mut self, wr_id: u64, opcode: verbs::WcOpcode) {
        self.shared.counters.retire_sq(1);
        let wc = WorkCompletion::new(wr_id, WcStatus::WrFlushErr, opcode, self.qp.qp_num());
        if self.send_cq.push(wc).is_err() {
            self.async_events.push(AsyncEvent::CqErr {
                cq: self.send_cq.handle(),
            });
        }
    }

    /// As [`QpCore::refused_send`] for a receive WR.
    pub(crate) fn refused_recv(&mut self, wr_id: u64) {
        self.shared.counters.retire_rq(1);
        let wc = WorkCompletion::new(
            wr_id,
            WcStatus::WrFlushErr,
            verbs::WcOpcode::Recv,
            self.qp.qp_num(),
        );
        if self.recv_cq.push(wc).is_err() {
            self.async_events.push(AsyncEvent::CqErr {
                cq: self.recv_cq.handle(),
            });
        }
    }

    fn rx(&mut self, ulpdu: &[u8]) {
        self.take_posted();
        self.shared.ulpdus_rx.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.qp.handle_ulpdu(ulpdu) {
            tracing::trace!(error = %e, "ULPDU not processed");
        }
        if self.qp.terminate_pending() {
            self.kick.store(true, Ordering::Release);
        }
        self.after();
    }

    /// The connection ended (any way): Error, flush, unbind.
    fn conn_ended(&mut self, why: &str) {
        tracing::debug!(why, "connection ended");
        self.conn = None;
        self.generation += 1;
        self.enter_error();
        self.after();
    }

    /// Unbinds from the connection (the engine closes it) and invalidates the old
    /// binding's callbacks. Returns the connection, if one was bound.
    pub(crate) fn unbind(&mut self) -> Option<ConnId> {
        self.generation += 1;
        self.conn.take()
    }
}

/// The [`Ulp`] of a connection bound to a QP. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct QpUlp {
    core: CoreRef,
    generation: u64,
}

impl QpUlp {
    /// The upper of the connection bound to `core` as binding `generation`.
    pub(crate) fn new(core: CoreRef, generation: u64) -> QpUlp {
        QpUlp { core, generation }
    }

    /// One ULPDU from the QP's engine ([`Ulp::poll_ulpdu`]); `ends_run` as in
    /// [`QpEngine::poll_transmit_at`](crate::rdmap::engine::QpEngine::poll_transmit_at).
    fn pull(
        &mut self,
        mulpdu: usize,
        ends_run: bool,
        emit: &mut EmitUlpdu<'_>,
    ) -> Result<bool, CallError> {
        let Some(mut c) = self.core() else {
            return Ok(false);
        };
        c.take_posted();
        let mut terminate = None;
        let mut sink = PartsSink::new(|parts: &[&[u8]]| {
            if parts
                .first()
                .is_some_and(|p| ddp_rdmap::Header::is_terminate(p))
            {
                terminate = Some(parts.concat());
                return Ok(());
            }
            emit(parts)
        });
        let r = c.qp.poll_transmit_at(mulpdu, ends_run, &mut sink);
        let emitted = sink.emitted();
        let error = sink.take_error();
        drop(sink);
        if let Some(t) = terminate {
            // A WR failed as it started: the Terminate leaves by poll_terminate, so
            // the stack aborts the connection after it.
            c.pending_terminate = Some(t);
            c.kick.store(true, Ordering::Release);
        }
        let sent = match r {
            Ok(true) => emitted > 0 && c.pending_terminate.is_none(),
            Ok(false) => false,
            Err(e) => {
                tracing::debug!(error = %e, "poll_transmit refused the MULPDU");
                false
            }
        };
        if sent {
            c.shared.ulpdus_tx.fetch_add(1, Ordering::Relaxed);
        }
        c.after();
        match error {
            Some(e) => Err(e),
            None => Ok(sent),
        }
    }

    /// The core, if this binding is still current.
    fn core(&self) -> Option<MutexGuard<'_, QpCore>> {
        let c = lock(&self.core);
        (c.generation == self.generation).then_some(c)
    }
}

impl Ulp for QpUlp {
    fn on_established(&mut self, info: &Established) {
        let Some(mut c) = self.core() else { return };
        let span = c.span.clone();
        let _e = span.enter();
        let a = &info.agreed;
        if c.qp.state() == QpState::Reset {
            let _ = c.qp.modify_state(QpState::Init);
        }
        if c.qp.state() == QpState::Init {
            if let Err(e) = c.qp.set_ord_ird(u32::from(a.ord), u32::from(a.ird)) {
                tracing::debug!(error = %e, "ORD/IRD not set");
            }
            let m = info.initial_msn;
            if let Err(e) =
                c.qp.set_initial_msn(m.send_tx, m.send_rx, m.read_tx, m.read_rx)
            {
                tracing::debug!(error = %e, "initial MSNs not set");
            }
            let _ = c.qp.modify_state(QpState::Rtr);
        }
        if c.qp.state() == QpState::Rtr {
            let _ = c.qp.modify_state(QpState::Rts);
        }
        tracing::debug!(
            ord = a.ord,
            ird = a.ird,
            mulpdu = info.mulpdu,
            state = %c.qp.state(),
            "QP connected"
        );
        c.after();
        if c.qp.wants_transmit() {
            c.kick.store(true, Ordering::Release);
        }
    }

    fn rx_room(&mut self) -> usize {
        usize::MAX
    }

    fn on_ulpdu(&mut self, ulpdu: Vec<u8>) {
        if let Some(mut c) = self.core() {
            c.rx(&ulpdu);
        }
    }

    fn on_ulpdu_in_place(&mut self, ulpdu: &[u8]) -> bool {
        if let Some(mut c) = self.core() {
            c.shared.ulpdus_rx_in_place.fetch_add(1, Ordering::Relaxed);
            c.rx(ulpdu);
        }
        true
    }

    fn poll_ulpdu(&mut self, mulpdu: usize, emit: &mut EmitUlpdu<'_>) -> Result<bool, CallError> {
        self.pull(mulpdu, false, emit)
    }

    fn poll_ulpdu_ending_run(
        &mut self,
        mulpdu: usize,
        emit: &mut EmitUlpdu<'_>,
    ) -> Result<bool, CallError> {
        self.pull(mulpdu, true, emit)
    }

    fn poll_terminate(&mut self) -> Option<Vec<u8>> {
        let mut c = self.core()?;
        let t = c.pending_terminate.take().or_else(|| c.qp.take_terminate());
        if t.is_some() {
            c.shared.ulpdus_tx.fetch_add(1, Ordering::Relaxed);
        }
        t
    }

    fn on_terminate(&mut self, ulpdu: &[u8]) {
        if let Some(mut c) = self.core() {
            c.rx(ulpdu);
        }
    }

    fn stream_ended(&mut self) -> bool {
        self.core().is_some_and(|c| c.qp.is_terminated())
    }

    fn on_disconnected(&mut self) {
        if let Some(mut c) = self.core() {
            c.conn_ended("peer closed");
        }
    }

    fn on_closed(&mut self) {
        if let Some(mut c) = self.core() {
            c.conn_ended("closed");
        }
    }

    fn on_error(&mut self, error: &ConnError) {
        let Some(mut c) = self.core() else { return };
        let span = c.span.clone();
        let _e = span.enter();
        tracing::debug!(%error, "connection failed");
        c.conn_ended("failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdmap::engine::TxSink;

    fn collect(parts_seen: &mut Vec<usize>, out: &mut Vec<u8>, parts: &[&[u8]]) {
        parts_seen.push(parts.len());
        for p in parts {
            out.extend_from_slice(p);
        }
    }

    #[test]
    fn parts_sink_shapes() {
        let mut seen = Vec::new();
        let mut out = Vec::new();
        {
            let mut s = PartsSink::new(|p: &[&[u8]]| -> Result<(), ()> {
                collect(&mut seen, &mut out, p);
                Ok(())
            });
            // One part.
            s.begin(3);
            s.put(b"abc");
            s.end();
            // Header + payload.
            s.begin(5);
            s.put(b"hd");
            s.put(b"xyz");
            s.end();
            // Header + two payload pieces: gathered.
            s.begin(6);
            s.put(b"hd");
            s.put(b"12");
            s.put(b"34");
            s.end();
            assert_eq!(s.emitted(), 3);
        }
        assert_eq!(seen, vec![1, 2, 1]);
        assert_eq!(out, b"abchdxyzhd1234");
    }

    #[test]
    fn parts_sink_keeps_the_first_error() {
        let mut n = 0;
        let mut s = PartsSink::new(|_: &[&[u8]]| {
            n += 1;
            Err(n)
        });
        for _ in 0..2 {
            s.begin(1);
            s.put(b"a");
            s.end();
        }
        assert_eq!(s.take_error(), Some(1));
        assert_eq!(s.emitted(), 0);
    }
}
