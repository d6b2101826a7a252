//! The objects behind the C pointers: each a `#[repr(C)]` struct whose first field is
//! the C struct the application reads, followed by the soft device's object. Safe code:
//! the pointer steps are in [`crate::boundary`].

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Wake;

use cxgb4::ffi::types::{
    IbvCompChannel, IbvCq, IbvMr, IbvPd, IbvQp, IbvWc, RdmaCmEvent, RdmaCmId, RdmaEventChannel,
};
use rdma_cm::{ChannelEvent, CmId, CmIdRef, EventChannel, EventStream};
use sw::cm::rdmacm::SoftDevice;
use sw::{Cq, Mr, Pd, Qp};
use verbs::{QpCap, WorkCompletion};

use crate::boundary::{read_eventfd, signal_eventfd};

/// Locks `m`, ignoring poisoning (a panic caught at the boundary must not wedge the
/// object for the rest of the process).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct PdObj {
    /// C view.
    pub c: IbvPd,
    /// The soft PD.
    pub pd: Pd,
}

/// `struct ibv_mr` over the application's memory.
#[repr(C)]
pub struct MrObj {
    /// C view.
    pub c: IbvMr,
    /// The soft MR (its memory is the application's).
    pub mr: Mr,
}

/// The queue and fd of a completion channel, shared with the CQs' notifiers.
pub struct CompShared {
    /// The channel's fd: readable exactly while `queue` is not empty.
    pub fd: OwnedFd,
    /// CQs (addresses of [`CqObj`]) with a completion event not yet taken.
    pub queue: Mutex<VecDeque<usize>>,
    /// CQs created on the channel and not destroyed (`ibv_destroy_comp_channel` is
    /// `EBUSY` while any remain).
    pub cqs: std::sync::atomic::AtomicUsize,
}

impl CompShared {
    /// Queues an event of `cq` (under the queue lock, `fire` decides).
    fn push(&self, q: &mut VecDeque<usize>, cq: usize) {
        if q.is_empty() {
            signal_eventfd(self.fd.as_raw_fd());
        }
        q.push_back(cq);
    }

    /// Takes the oldest event, keeping the fd readable exactly while more remain.
    pub fn pop(&self) -> Option<usize> {
        let mut q = lock(&self.queue);
        let cq = q.pop_front()?;
        if q.is_empty() {
            // The counter is non-zero (signalled when the queue became non-empty).
            let _ = read_eventfd(self.fd.as_raw_fd());
        }
        Some(cq)
    }

    /// Drops the queued events of `cq` (destroyed).
    pub fn forget(&self, cq: usize) {
        let mut q = lock(&self.queue);
        let had = !q.is_empty();
        q.retain(|&c| c != cq);
        if had && q.is_empty() {
            let _ = read_eventfd(self.fd.as_raw_fd());
        }
    }
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct CompChan {
    /// C view (`fd` is `shared.fd`).
    pub c: IbvCompChannel,
    /// Queue and fd.
    pub shared: Arc<CompShared>,
}

/// The completion-event arm of one CQ (`ibv_req_notify_cq`): registered as a waker of
/// the soft CQ, it queues one event on the channel when a completion arrives while
/// armed.
pub struct Notify {
    /// Armed by `ibv_req_notify_cq`, disarmed by the event it produces.
    pub armed: AtomicBool,
    /// The channel.
    pub chan: Arc<CompShared>,
    /// The CQ's address (what `ibv_get_cq_event` returns).
    pub cq: usize,
}

impl Notify {
    /// Queues the event if armed (one event per arm, as the verbs rule).
    pub fn fire(&self) {
        let mut q = lock(&self.chan.queue);
        if self.armed.swap(false, Ordering::AcqRel) {
            self.chan.push(&mut q, self.cq);
        }
    }

    /// Disarms for good and drops queued events (the CQ is being destroyed).
    pub fn retire(&self) {
        {
            let _q = lock(&self.chan.queue);
            self.armed.store(false, Ordering::Release);
        }
        self.chan.forget(self.cq);
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

/// `struct ibv_cq`.
#[repr(C)]
pub struct CqObj {
    /// C view.
    pub c: IbvCq,
    /// The soft CQ.
    pub cq: Cq,
    /// Its completion-event arm, if it has a channel.
    pub notify: Option<Arc<Notify>>,
    /// Events handed out by `ibv_get_cq_event`.
    pub events: AtomicU32,
    /// Events acknowledged (`ibv_ack_cq_events`).
    pub acked: AtomicU32,
}

/// `struct ibv_qp` (RC).
#[repr(C)]
pub struct QpObj {
    /// C view.
    pub c: IbvQp,
    /// The soft QP.
    pub qp: Arc<Qp>,
    /// The CM id that made it (`rdma_create_qp`), which destroys it.
    pub id: Option<CmIdRef<SoftDevice>>,
    /// Capabilities granted.
    pub cap: QpCap,
}

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

/// `struct rdma_event_channel`: the fd is readable exactly while an event can be taken.
#[repr(C)]
pub struct ChanObj {
    /// C view.
    pub c: RdmaEventChannel,
    /// The channel; a call blocked on it holds its own reference, so
    /// `rdma_destroy_event_channel` under a blocked `rdma_get_cm_event` (rping does this
    /// at exit) frees nothing that thread still uses.
    pub shared: Arc<ChanShared>,
}

/// The state of an event channel.
pub struct ChanShared {
    /// The rdma-cm channel.
    pub ch: EventChannel<SoftDevice>,
    /// Events taken from the channel and not yet returned, and the stream they come
    /// from (its waker signals the fd).
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
    /// Restores the fd rule after the stash changed: with events stashed the fd is
    /// readable; with none, the fd is drained first and then the stream polled, so an
    /// event queued after the poll signals the fd through the waker (no wake-up lost).
    pub fn refill(&self, st: &mut (EventStream<SoftDevice>, VecDeque<ChannelEvent<SoftDevice>>)) {
        use futures_core::Stream;
        let fd = self.waker.fd.as_raw_fd();
        if !st.1.is_empty() {
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
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct IdObj {
    /// C view.
    pub c: RdmaCmId,
    /// The rdma-cm id (taken when destroyed).
    pub id: Mutex<Option<CmId<SoftDevice>>>,
    /// Its serial (the registry key).
    pub serial: u64,
    /// The channel (`ChanObj` address).
    pub chan: usize,
    /// The channel was made for this id (`rdma_create_id` with a NULL channel).
    pub own_chan: bool,
    /// For the new id of a request: the peer's ORD and IRD (what `rdma_accept` with a
    /// NULL `conn_param` mirrors).
    pub request: (u16, u16),
}

impl IdObj {
    /// A reference to the rdma-cm id, unless destroyed.
    pub fn id_ref(&self) -> Option<CmIdRef<SoftDevice>> {
        lock(&self.id).as_ref().map(|i| i.as_ref())
    }
}

/// `struct rdma_cm_event` and the event it stands for (acked when freed).
#[repr(C)]
pub struct EventObj {
    /// C view; `param.conn.private_data` points into `ev`.
    pub c: RdmaCmEvent,
    /// The rdma-cm event.
    pub ev: ChannelEvent<SoftDevice>,
}
