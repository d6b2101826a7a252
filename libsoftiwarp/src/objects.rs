//! The objects behind the C pointers: each an [`Obj`] of the C struct the application
//! reads and our state, registered as a live handle (`crate::handles`). Safe code:
//! the pointer steps are in [`crate::boundary`] and [`crate::handles`].

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::Wake;
use std::thread::ThreadId;

use cxgb4::ffi::types::{
    IbvCompChannel, IbvContext, IbvCq, IbvMr, IbvPd, IbvQpCap, IbvQpInitAttr, IbvWc, RdmaCmEvent,
    RdmaCmId, RdmaEventChannel,
};
use rdma_cm::{ChannelEvent, CmId, CmIdRef, EventChannel, EventStream};
use sw::cm::rdmacm::SoftDevice;
use sw::{Cq, Mr, Pd, Qp, Srq};
use verbs::{QpCap, WorkCompletion};

pub use crate::handles::Obj;

use crate::boundary::{drain_eventfd, signal_eventfd};

/// Locks `m`, ignoring poisoning (a panic caught at the boundary must not wedge the
/// object for the rest of the process).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv`, ignoring poisoning.
pub fn wait<'a, T>(cv: &Condvar, g: std::sync::MutexGuard<'a, T>) -> std::sync::MutexGuard<'a, T> {
    cv.wait(g).unwrap_or_else(PoisonError::into_inner)
}

/// A queue and an eventfd readable exactly while the queue is not empty (a completion
/// channel's fd, a context's `async_fd`).
pub struct FdQueue<T> {
    /// The fd.
    pub fd: OwnedFd,
    /// The queue.
    pub queue: Mutex<VecDeque<T>>,
}

impl<T> FdQueue<T> {
    /// An empty queue on `fd` (an eventfd at 0).
    pub fn new(fd: OwnedFd) -> Self {
        FdQueue {
            fd,
            queue: Mutex::new(VecDeque::new()),
        }
    }

    /// Appends `item` to the locked queue `q` (of this `FdQueue`).
    pub fn push_locked(&self, q: &mut VecDeque<T>, item: T) {
        if q.is_empty() {
            signal_eventfd(self.fd.as_raw_fd());
        }
        q.push_back(item);
    }

    /// Appends `item`, dropping the oldest beyond `bound` items.
    pub fn push_bounded(&self, item: T, bound: usize) {
        let mut q = lock(&self.queue);
        self.push_locked(&mut q, item);
        while q.len() > bound {
            q.pop_front();
        }
    }

    /// Takes the oldest item, keeping the fd readable exactly while more remain.
    pub fn pop(&self) -> Option<T> {
        let mut q = lock(&self.queue);
        let item = q.pop_front()?;
        if q.is_empty() {
            // The counter was signalled when the queue became non-empty, but the
            // application may have read the fd itself: drained without blocking (a
            // blocking read here would hold the lock that `push_locked`'s callers
            // need to signal it again).
            drain_eventfd(self.fd.as_raw_fd());
        } else {
            // A blocking call's read (`crate::blocking`), or the application's, may
            // have taken the counter while items remain: readable again.
            signal_eventfd(self.fd.as_raw_fd());
        }
        Some(item)
    }

    /// Keeps only the items `keep` accepts.
    pub fn retain(&self, keep: impl FnMut(&T) -> bool) {
        let mut q = lock(&self.queue);
        let had = !q.is_empty();
        q.retain(keep);
        if had && q.is_empty() {
            drain_eventfd(self.fd.as_raw_fd());
        }
    }

    /// The raw fd.
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// An asynchronous event waiting in a context (`struct ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncItem {
    /// `event_type`.
    pub event_type: u32,
    /// `element`: the CQ's or QP's handle, or the port number.
    pub element: usize,
}

/// Our side of `struct ibv_context`.
pub struct CtxState {
    /// The asynchronous events (`async_fd` is its fd), until the context is closed.
    pub events: Mutex<Option<Arc<FdQueue<AsyncItem>>>>,
    /// Its device: the index in `crate::context::devices()`.
    pub dev: usize,
    /// The context of CM ids (`id->verbs`): never closed.
    pub cm: bool,
    /// Async events handed out by `ibv_get_async_event` and not yet acknowledged.
    pub unacked: AtomicUsize,
}

/// `struct ibv_context`, with the head of `struct verbs_context` right before it (the
/// extended verbs' operations; `abi_compat` says it is there).
pub type CtxObj = Obj<IbvContext, CtxState, crate::abi::VerbsContextPrefix>;

/// Our side of `struct ibv_pd`.
pub struct PdState {
    /// The soft PD.
    pub pd: Pd,
    /// Its context (kept readable as long as the PD's struct is).
    pub ctx: Arc<CtxObj>,
}

/// `struct ibv_pd`.
pub type PdObj = Obj<IbvPd, PdState>;

/// Our side of `struct ibv_mr` over the application's memory.
pub struct MrState {
    /// The soft MR (its memory is the application's).
    pub mr: Mr,
    /// Its context.
    pub ctx: Arc<CtxObj>,
}

/// `struct ibv_mr`.
pub type MrObj = Obj<IbvMr, MrState>;

/// The queue and fd of a completion channel, shared with the CQs' notifiers.
pub struct CompShared {
    /// CQ handles with a completion event not yet taken; the fd is readable exactly
    /// while it is not empty.
    pub q: FdQueue<usize>,
    /// CQs created on the channel and not destroyed (`ibv_destroy_comp_channel` is
    /// `EBUSY` while any remain).
    pub cqs: AtomicUsize,
}

/// Our side of `struct ibv_comp_channel`.
pub struct CompChanState {
    /// Queue and fd (taken, and the fd closed, when the channel is destroyed).
    pub shared: Mutex<Option<Arc<CompShared>>>,
    /// Its context.
    pub ctx: Arc<CtxObj>,
}

/// `struct ibv_comp_channel`.
pub type CompChanObj = Obj<IbvCompChannel, CompChanState>;

/// The completion-event arm of one CQ (`ibv_req_notify_cq`): registered as a waker of
/// the soft CQ, it queues one event on the channel when a completion arrives while
/// armed.
pub struct Notify {
    /// Armed by `ibv_req_notify_cq`, disarmed by the event it produces.
    pub armed: AtomicBool,
    /// The channel.
    pub chan: Arc<CompShared>,
    /// The CQ's handle (what `ibv_get_cq_event` returns).
    pub cq: usize,
}

impl Notify {
    /// Queues the event if armed (one event per arm, as the verbs rule).
    pub fn fire(&self) {
        let mut q = lock(&self.chan.q.queue);
        if self.armed.swap(false, Ordering::AcqRel) {
            self.chan.q.push_locked(&mut q, self.cq);
        }
    }

    /// Disarms for good and drops queued events (the CQ is being destroyed).
    pub fn retire(&self) {
        {
            let _q = lock(&self.chan.q.queue);
            self.armed.store(false, Ordering::Release);
        }
        self.chan.q.retain(|&c| c != self.cq);
    }
}

impl Wake for Notify {
    fn wake(self: Arc<Self>) {
        self.fire();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fire();
    }
}

/// Our side of `struct ibv_cq`.
pub struct CqState {
    /// The soft CQ (taken when destroyed: a destroyed CQ's struct stays in the
    /// graveyard, its queue does not).
    pub cq: Mutex<Option<Arc<Cq>>>,
    /// Its completion-event arm, if it has a channel (taken when destroyed: it holds
    /// the channel's fd).
    pub notify: Mutex<Option<Arc<Notify>>>,
    /// Events handed out by `ibv_get_cq_event`.
    pub events: AtomicU32,
    /// Events acknowledged (`ibv_ack_cq_events`).
    pub acked: AtomicU32,
    /// QPs (of ours, not destroyed) that use the CQ: `ibv_destroy_cq` is `EBUSY` at once
    /// while any remain.
    pub qps: AtomicUsize,
    /// `cq_context` as created (returned by `ibv_get_cq_event`).
    pub cq_context: usize,
    /// The completion `start_poll` / `next_poll` made current (an extended CQ's poll
    /// API; the lock also serializes the writes of `status` and `wr_id` into its C
    /// view).
    pub current: Mutex<Option<IbvWc>>,
    /// Its context.
    pub ctx: Arc<CtxObj>,
}

impl CqState {
    /// The soft CQ, unless destroyed.
    pub fn cq(&self) -> Option<Arc<Cq>> {
        lock(&self.cq).clone()
    }
}

/// `struct ibv_cq`, as `struct ibv_cq_ex` (whose head it is) for every CQ.
pub type CqObj = Obj<crate::abi::IbvCqEx, CqState>;

/// Our side of `struct ibv_srq`.
pub struct SrqState {
    /// The soft SRQ (taken when destroyed).
    pub srq: Mutex<Option<Arc<Srq>>>,
    /// `max_sge` granted: a posted WR's `num_sge` is checked against it before its
    /// SGE array is read.
    pub max_sge: u32,
    /// `max_wr` granted: a posted WR list is followed for at most this many WRs.
    pub max_wr: u32,
    /// QPs (of ours, not destroyed) that take their receive WRs from it:
    /// `ibv_destroy_srq` is `EBUSY` at once while any remain.
    pub qps: AtomicUsize,
    /// Its PD (the `pd` of the C struct, kept readable).
    pub pd: Arc<PdObj>,
    /// Its context.
    pub ctx: Arc<CtxObj>,
}

impl SrqState {
    /// The soft SRQ, unless destroyed.
    pub fn srq(&self) -> Option<Arc<Srq>> {
        lock(&self.srq).clone()
    }
}

/// `struct ibv_srq`.
pub type SrqObj = Obj<crate::abi::IbvSrq, SrqState>;

/// One QP's use of its CQs and PD (the C-level counts); dropped when the QP is
/// destroyed, or when its creation fails.
pub struct QpUses {
    /// Send and receive CQ.
    pub cqs: [Arc<CqObj>; 2],
    /// The PD.
    pub pd: Arc<PdObj>,
    /// The SRQ the QP takes its receive WRs from, if any (kept readable as the QP's
    /// `srq`), counted in its `qps` ([`QpUses::use_srq`]).
    pub srq: Option<Arc<SrqObj>>,
}

impl QpUses {
    /// Counts a QP about to be created on its CQs, before the QP is made: `None` (the
    /// count undone) if either CQ is being destroyed or is destroyed. The count comes
    /// first and the check after (`SeqCst`), while `ibv_destroy_cq` marks the CQ dying
    /// first and checks the count after (`crate::handles`): of a creation and a
    /// destroy that race, never both succeed.
    pub fn acquire(send_cq: Arc<CqObj>, recv_cq: Arc<CqObj>, pd: Arc<PdObj>) -> Option<QpUses> {
        for c in [&send_cq, &recv_cq] {
            c.s.qps.fetch_add(1, Ordering::SeqCst);
        }
        let uses = QpUses {
            cqs: [send_cq, recv_cq],
            pd,
            srq: None,
        };
        if uses.cqs.iter().any(|c| c.is_dying() || c.s.cq().is_none()) {
            return None;
        }
        Some(uses)
    }
}

impl QpUses {
    /// Counts the QP about to be created on `srq` too: `false` (nothing counted) if the
    /// SRQ is being destroyed or is destroyed. Counted first, checked after, as
    /// [`QpUses::acquire`] does for CQs (`ibv_destroy_srq` marks first, checks after).
    pub fn use_srq(&mut self, srq: Arc<SrqObj>) -> bool {
        srq.s.qps.fetch_add(1, Ordering::SeqCst);
        if srq.is_dying() || srq.s.srq().is_none() {
            srq.s.qps.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        self.srq = Some(srq);
        true
    }
}

impl Drop for QpUses {
    fn drop(&mut self) {
        for c in &self.cqs {
            c.s.qps.fetch_sub(1, Ordering::SeqCst);
        }
        if let Some(srq) = &self.srq {
            srq.s.qps.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Our side of `struct ibv_qp` (RC).
pub struct QpState {
    /// The soft QP (taken when destroyed).
    pub qp: Mutex<Option<Arc<Qp>>>,
    /// The CM id that made it (`rdma_create_qp`), which destroys it.
    pub id: Mutex<Option<CmIdRef<SoftDevice>>>,
    /// Capabilities granted.
    pub cap: QpCap,
    /// Its CQs and PD, until destroyed.
    pub uses: Mutex<Option<QpUses>>,
    /// The WRs built by the `ibv_wr_*` API since `wr_start` (`None` outside a batch);
    /// the lock also serializes the Rust side's reads and writes of the QP's C view
    /// after publication (`state`, `wr_id`, `wr_flags`).
    pub batch: Mutex<Option<WrBatch>>,
    /// The `send_ops_flags` the QP was created with (`ibv_create_qp_ex`; 0 otherwise).
    pub send_ops: u64,
    /// Its context.
    pub ctx: Arc<CtxObj>,
}

/// The send WRs an `ibv_wr_*` batch built (`wr_start` .. `wr_complete`), and the first
/// error met while building it (`wr_complete` returns it and posts nothing, as
/// rdma-core's providers do).
#[derive(Debug, Default)]
pub struct WrBatch {
    /// The WRs, in order; the last one is the one `wr_set_*` completes.
    pub wrs: Vec<verbs::SendWr>,
    /// The first error (an errno).
    pub err: Option<i32>,
}

impl QpState {
    /// The soft QP, unless destroyed.
    pub fn qp(&self) -> Option<Arc<Qp>> {
        lock(&self.qp).clone()
    }
}

/// `struct ibv_qp`, as `struct ibv_qp_ex` (whose head it is) for every QP.
pub type QpObj = Obj<crate::abi::IbvQpEx, QpState>;

/// What a CQ poll fills per call before copying out, WCs.
pub const POLL_CHUNK: usize = 32;

/// `wc` in libibverbs' layout.
pub fn to_ibv_wc(wc: &WorkCompletion) -> IbvWc {
    let mut w: IbvWc = crate::boundary::zeroed();
    w.wr_id = wc.wr_id;
    w.status = wc.status.to_ibv();
    w.opcode = wc.opcode.to_ibv().unwrap_or(0);
    w.vendor_err = wc.vendor_err;
    w.byte_len = wc.byte_len;
    w.imm_data_or_invalidated_rkey = match (wc.imm_data, wc.invalidated_stag) {
        (Some(imm), _) => imm.to_be(),
        (None, Some(stag)) => u32::from(stag),
        (None, None) => 0,
    };
    w.qp_num = wc.qp_num;
    w.wc_flags = wc.wc_flags().bits();
    w
}

/// Our side of `struct rdma_event_channel`.
pub struct ChanState {
    /// The channel's state, until destroyed; ids on the channel hold it too (a channel
    /// destroyed under live ids, which librdmacm allows, stays usable by them).
    pub shared: Mutex<Option<Arc<ChanShared>>>,
}

/// `struct rdma_event_channel`: the fd is readable exactly while an event can be taken.
pub type ChanObj = Obj<RdmaEventChannel, ChanState>;

/// The state of an event channel.
pub struct ChanShared {
    /// The rdma-cm channel.
    pub ch: EventChannel<SoftDevice>,
    /// The stream of its events (whose waker signals the fd), and the events the
    /// stream handed out that no `rdma_get_cm_event` has returned yet (rare: an event
    /// that arrived while the fd's state was being restored).
    pub state: Mutex<(EventStream<SoftDevice>, VecDeque<ChannelEvent<SoftDevice>>)>,
    /// Signals the fd when an event is queued.
    pub waker: Arc<FdWaker>,
}

/// A waker that makes an eventfd readable.
pub struct FdWaker {
    /// The fd (the channel's `fd`).
    pub fd: OwnedFd,
}

impl Wake for FdWaker {
    fn wake(self: Arc<Self>) {
        signal_eventfd(self.fd.as_raw_fd());
    }

    fn wake_by_ref(self: &Arc<Self>) {
        signal_eventfd(self.fd.as_raw_fd());
    }
}

impl ChanShared {
    /// Restores the fd rule: readable exactly while an event can be taken. With events
    /// stashed, or queued on the channel, the fd is signalled; with none, it is drained
    /// and the stream polled, so that an event queued after the poll signals the fd
    /// through the waker (no wake-up lost). An event the poll hands out then is stashed
    /// (it counts as held by this thread, where `rdma_get_cm_event` would have taken
    /// it from the channel on its caller's thread).
    pub fn refill(&self, st: &mut (EventStream<SoftDevice>, VecDeque<ChannelEvent<SoftDevice>>)) {
        use futures_core::Stream;
        let fd = self.waker.fd.as_raw_fd();
        if !st.1.is_empty() || self.ch.queued() > 0 {
            signal_eventfd(fd);
            return;
        }
        crate::boundary::drain_eventfd(fd);
        let waker = std::task::Waker::from(self.waker.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        if let std::task::Poll::Ready(Some(ev)) = std::pin::Pin::new(&mut st.0).poll_next(&mut cx) {
            st.1.push_back(ev);
            signal_eventfd(fd);
        }
    }

    /// The next event: stashed first, then taken from the channel on this thread.
    pub fn take(&self) -> Option<ChannelEvent<SoftDevice>> {
        let mut st = lock(&self.state);
        let ev = st.1.pop_front().or_else(|| self.ch.try_get_event());
        self.refill(&mut st);
        ev
    }
}

/// Our side of `struct rdma_cm_id`.
pub struct IdState {
    /// The rdma-cm id (taken while being destroyed, and when destroyed).
    pub id: Mutex<Option<CmId<SoftDevice>>>,
    /// Its serial (the key of its events).
    pub serial: u64,
    /// The channel's state (taken when destroyed: it holds the channel's fd).
    pub chan: Mutex<Option<Arc<ChanShared>>>,
    /// The channel object, if it was made for this id (`rdma_create_id` with a NULL
    /// channel, `rdma_create_ep`, `rdma_migrate_id` to NULL, the new id of a request
    /// on a synchronous listener): destroyed with the id, or when it migrates away.
    pub own_chan: Mutex<Option<Arc<ChanObj>>>,
    /// Synchronous (librdmacm's `id_priv->sync`: made without a channel): the calls
    /// that produce an event wait for it and leave it in `id->event`.
    pub sync: AtomicBool,
    /// The QP attributes a passive `rdma_create_ep` saved (its `qp_type` that of the
    /// `rdma_addrinfo`): `rdma_get_request` gives the new id a QP with them, on the
    /// listener's `pd`.
    pub ep_qp_attr: Mutex<Option<SavedQpAttr>>,
    /// A `DISCONNECTED` event of the id was handed out (a synchronous
    /// `rdma_disconnect` of an id already disconnected waits for it only if not).
    pub disconnected: AtomicBool,
    /// Private data an active `rdma_create_ep` took from `rdma_addrinfo.ai_connect`:
    /// `rdma_connect` sends it before the caller's own (librdmacm's `connect`).
    pub connect_data: Mutex<Vec<u8>>,
    /// For the new id of a request: the peer's ORD and IRD (what `rdma_accept` with a
    /// NULL `conn_param` mirrors).
    pub request: (u16, u16),
    /// Serializes the Rust side's reads and writes of the id's C view.
    pub c_lock: Mutex<()>,
    /// The threads holding events of the id handed out by `rdma_get_cm_event` and not
    /// yet acked, one entry per event (librdmacm's rule: a `CONNECT_REQUEST` counts
    /// against its listener).
    pub held: Mutex<Vec<ThreadId>>,
    /// Signalled when an event of the id is acked.
    pub acked: Condvar,
}

impl IdState {
    /// The channel's state, unless destroyed.
    pub fn chan(&self) -> Option<Arc<ChanShared>> {
        lock(&self.chan).clone()
    }

    /// A reference to the rdma-cm id, unless destroyed.
    pub fn id_ref(&self) -> Option<CmIdRef<SoftDevice>> {
        lock(&self.id).as_ref().map(|i| i.as_ref())
    }
}

/// `struct rdma_cm_id`.
pub type IdObj = Obj<RdmaCmId, IdState>;

/// A copy of a `struct ibv_qp_init_attr` kept by the library (its pointers as
/// addresses, so the copy can move between threads; they are the application's).
#[derive(Debug, Clone, Copy)]
pub struct SavedQpAttr {
    /// `qp_context`.
    pub qp_context: usize,
    /// `send_cq`.
    pub send_cq: usize,
    /// `recv_cq`.
    pub recv_cq: usize,
    /// `srq`.
    pub srq: usize,
    /// `cap`.
    pub cap: IbvQpCap,
    /// `qp_type`.
    pub qp_type: i32,
    /// `sq_sig_all`.
    pub sq_sig_all: i32,
}

impl SavedQpAttr {
    /// The copy of `a`.
    pub fn of(a: &IbvQpInitAttr) -> SavedQpAttr {
        SavedQpAttr {
            qp_context: a.qp_context as usize,
            send_cq: a.send_cq as usize,
            recv_cq: a.recv_cq as usize,
            srq: a.srq as usize,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        }
    }

    /// The C struct again.
    pub fn to_c(self) -> IbvQpInitAttr {
        IbvQpInitAttr {
            qp_context: self.qp_context as *mut std::ffi::c_void,
            send_cq: self.send_cq as *mut IbvCq,
            recv_cq: self.recv_cq as *mut IbvCq,
            srq: self.srq as *mut std::ffi::c_void,
            cap: self.cap,
            qp_type: self.qp_type,
            sq_sig_all: self.sq_sig_all,
        }
    }
}

/// Our side of `struct rdma_cm_event` (the event is acked when dropped).
pub struct EventState {
    /// The rdma-cm event (`param.conn.private_data` points into it), until acked.
    pub ev: Mutex<Option<ChannelEvent<SoftDevice>>>,
    /// The id the event counts against (its listener for a connect request), whose
    /// `held` lists this event.
    pub owner: Arc<IdObj>,
    /// `event->id` (kept readable while the event is).
    pub id: Arc<IdObj>,
    /// The thread that took it.
    pub holder: ThreadId,
}

/// `struct rdma_cm_event`.
pub type EventObj = Obj<RdmaCmEvent, EventState>;
