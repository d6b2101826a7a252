//! The verbs objects of a soft device, [`Pd`], [`Mr`], [`Cq`], [`Srq`] and [`Qp`],
//! re-exported at the crate root, whose documentation gives their thread, memory and
//! lifetime rules.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use verbs::{
    AccessFlags, AsyncEvent, Lkey, ObjectKind, QpAttr, QpCap, QpState, RecvWr, Rkey, SendWr, Sge,
    SrqAttr, SrqAttrMask, SrqInitAttr, Stag, VerbsError, WorkCompletion, WorkQueue,
};

use crate::engine::{Command, Handle};
use crate::rdmap::binding::{PostSide, QpCore, QpShared, QpStats, UsesGuard};
use crate::rdmap::engine::{validate_send_wr, QpEngine, QpInit, MAX_ORD_IRD};
use crate::resources::completion_queue::{CompletionQueue, CqError, WaitAsync, MAX_CQE};
use crate::resources::shared_receive_queue::{SharedReceiveQueue, MAX_SRQ_SGE, MAX_SRQ_WR};
use crate::resources::stag_table::{MemoryRegion, MrOptions, MrState, PdId, MAX_MR_LEN};

/// The limits of a soft device (`struct ibv_device_attr`, `ibv_query_device(3)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Largest `max_send_wr` / `max_recv_wr` of a QP, in WRs (`max_qp_wr`).
    pub max_qp_wr: u32,
    /// Largest `max_send_sge` / `max_recv_sge` of a QP (`max_sge`).
    pub max_sge: u32,
    /// Largest `max_inline_data` of a QP, in bytes.
    pub max_inline_data: u32,
    /// Largest CQ, in completions (`max_cqe`).
    pub max_cqe: usize,
    /// Largest MR, in bytes (`max_mr_size`).
    pub max_mr_size: u64,
    /// Largest ORD and IRD, in RDMA Read Requests (`max_qp_rd_atom`,
    /// `max_qp_init_rd_atom`): the 14-bit MPA field (RFC 6581).
    pub max_ord_ird: u32,
    /// Most SRQs of the device at once (`max_srq`).
    pub max_srq: u32,
    /// Largest `max_wr` of an SRQ, in WRs (`max_srq_wr`).
    pub max_srq_wr: u32,
    /// Largest `max_sge` of an SRQ (`max_srq_sge`).
    pub max_srq_sge: u32,
}

impl DeviceAttr {
    /// The soft device's limits.
    pub const SOFT: DeviceAttr = DeviceAttr {
        max_qp_wr: 1 << 15,
        max_sge: 16,
        max_inline_data: 4096,
        max_cqe: MAX_CQE,
        max_mr_size: MAX_MR_LEN,
        max_ord_ird: MAX_ORD_IRD,
        max_srq: 1024,
        max_srq_wr: MAX_SRQ_WR,
        max_srq_sge: MAX_SRQ_SGE,
    };
}

// ---------------------------------------------------------------------------------
// Lifetimes of PDs and CQs against the QPs created on them.

/// The life of a PD or CQ that QPs use ([`Life`]): live.
const LIVE: u8 = 0;
/// A destroy is deciding (it checks the object's QP count next).
const DESTROYING: u8 = 1;
/// Destroyed.
const DESTROYED: u8 = 2;

/// The life of a PD or CQ, against the creation of the QPs that use it. A creation
/// and a destroy that race meet as in Dekker's protocol, so that never both succeed:
/// the creator counts its QP on the object first and checks the life after
/// ([`Life::check_live`]); the destroyer moves the life to [`DESTROYING`] first and
/// checks the count after ([`Life::destroy`]), every step `SeqCst`. So at least one of
/// them sees the other: a creator that sees a destroy undoes its count and fails; a
/// destroy that sees a QP goes back to live and fails with
/// [`VerbsError::InUse`]. (Both can fail when they race, as with the kernel's uobject
/// locks: the destroy of a PD or CQ a creation is looking at fails with `EBUSY`.)
#[derive(Debug)]
struct Life(AtomicU8);

impl Life {
    fn new() -> Life {
        Life(AtomicU8::new(LIVE))
    }

    /// True once a destroy succeeded.
    fn destroyed(&self) -> bool {
        self.0.load(Ordering::SeqCst) == DESTROYED
    }

    /// A creator's check, after it counted its QP: `Err` (the caller undoes its count)
    /// unless live.
    fn check_live(&self, object: ObjectKind, handle: u32) -> Result<(), VerbsError> {
        if self.0.load(Ordering::SeqCst) == LIVE {
            Ok(())
        } else {
            Err(VerbsError::InvalidHandle { object, handle })
        }
    }

    /// Destroys the object unless `users` (its QP count) is above 0 or `finish` (the
    /// rest of the destroy) refuses: [`VerbsError::InUse`] then, and the object stays
    /// live. [`VerbsError::InvalidHandle`] if already destroyed; `InUse` while another
    /// destroy of it is deciding.
    fn destroy(
        &self,
        users: &AtomicUsize,
        object: ObjectKind,
        handle: u32,
        finish: impl FnOnce() -> Result<(), VerbsError>,
    ) -> Result<(), VerbsError> {
        match self
            .0
            .compare_exchange(LIVE, DESTROYING, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => {}
            Err(DESTROYED) => return Err(VerbsError::InvalidHandle { object, handle }),
            Err(_) => return Err(VerbsError::InUse { object }),
        }
        let r = if users.load(Ordering::SeqCst) > 0 {
            Err(VerbsError::InUse { object })
        } else {
            finish()
        };
        self.0
            .store(if r.is_ok() { DESTROYED } else { LIVE }, Ordering::SeqCst);
        r
    }
}

// ---------------------------------------------------------------------------------
// Protection domains.

/// The PD object behind [`Pd`] handles, [`Mr`]s and [`Qp`]s.
#[derive(Debug)]
pub(crate) struct PdInner {
    id: PdId,
    handle: Arc<Handle>,
    qps: AtomicUsize,
    life: Life,
}

impl PdInner {
    pub(crate) fn new(id: PdId, handle: Arc<Handle>) -> PdInner {
        PdInner {
            id,
            handle,
            qps: AtomicUsize::new(0),
            life: Life::new(),
        }
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        if !self.life.destroyed() {
            // Nothing uses it any more (MRs and QPs hold this object).
            let _ = self.handle.mrs.dealloc_pd(self.id);
        }
    }
}

/// A protection domain (`struct ibv_pd`): MRs and QPs of one PD may be used together
/// only (RFC 5040 §2). Made by [`Device::alloc_pd`](crate::api::device::Device::alloc_pd).
#[derive(Debug)]
pub struct Pd {
    inner: Arc<PdInner>,
}

impl Pd {
    pub(crate) fn new(inner: PdInner) -> Pd {
        Pd {
            inner: Arc::new(inner),
        }
    }

    /// The PD's handle.
    pub fn id(&self) -> PdId {
        self.inner.id
    }

    /// Registers a new MR of `len` bytes at iova `iova` with `access` rights
    /// (`ibv_reg_mr(3)`): the library allocates the zeroed buffer; byte `i` of it is
    /// at iova `iova + i`. The MR is valid at once.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidAccessFlags`] (remote write without local write, as
    /// `ibv_reg_mr(3)`), [`VerbsError::InvalidArgument`] `"length"` (0 or above
    /// [`DeviceAttr::max_mr_size`]) or `"iova"` (the range wraps past 2^64),
    /// [`VerbsError::InvalidHandle`] (PD deallocated), [`VerbsError::OutOfResources`],
    /// [`VerbsError::DeviceGone`].
    pub fn reg_mr(&self, len: u64, iova: u64, access: AccessFlags) -> Result<Mr, VerbsError> {
        self.inner.handle.alive()?;
        self.reg_mr_with(len, iova, access, MrOptions::default())
    }

    /// [`Pd::reg_mr`] with registration options beyond the verbs access flags:
    /// [`MrOptions::remote_invalidate`] lets the peer invalidate the MR with a Send
    /// with Invalidate (without it only [`Pd::alloc_mr`] MRs may be invalidated
    /// remotely; a peer's attempt on another MR gets a Terminate and the MR stays
    /// valid).
    ///
    /// # Errors
    ///
    /// As [`Pd::reg_mr`].
    pub fn reg_mr_with(
        &self,
        len: u64,
        iova: u64,
        access: AccessFlags,
        options: MrOptions,
    ) -> Result<Mr, VerbsError> {
        self.inner.handle.alive()?;
        let mr = self
            .inner
            .handle
            .mrs
            .reg_mr_with(self.inner.id, iova, len, access, options)?;
        Ok(Mr::new(mr, Arc::clone(&self.inner)))
    }

    /// Registers `mem`, the application's own memory, as an MR at iova `iova`
    /// (`ibv_reg_mr(3)` as a NIC implements it: what the peer writes lands in that
    /// memory, what a Send or a Read Response carries is read from it). `mem` comes
    /// from the unsafe [`UserMemory::new`](crate::resources::user_memory::UserMemory::new),
    /// whose contract keeps the memory valid for the MR's life. A C application's
    /// `ibv_reg_mr(pd, addr, len, access)` is this call with `iova = addr`.
    ///
    /// # Errors
    ///
    /// As [`Pd::reg_mr`].
    pub fn reg_user_mr(
        &self,
        mem: crate::resources::user_memory::UserMemory,
        iova: u64,
        access: AccessFlags,
        options: MrOptions,
    ) -> Result<Mr, VerbsError> {
        self.inner.handle.alive()?;
        let mr =
            self.inner
                .handle
                .mrs
                .reg_user_memory(self.inner.id, mem, iova, access, options)?;
        Ok(Mr::new(mr, Arc::clone(&self.inner)))
    }

    /// Allocates an MR of up to `max_len` bytes for fast registration (kernel
    /// `ib_alloc_mr`): invalid and without rights until a [`verbs::FastReg`] send WR
    /// ([`SendWr::fast_reg`]) registers it with a key, range and rights; a Local
    /// Invalidate WR (or a peer's Send with Invalidate) makes it invalid again.
    ///
    /// # Errors
    ///
    /// As [`Pd::reg_mr`].
    pub fn alloc_mr(&self, max_len: u64) -> Result<Mr, VerbsError> {
        self.inner.handle.alive()?;
        let mr = self.inner.handle.mrs.alloc_mr(self.inner.id, max_len)?;
        Ok(Mr::new(mr, Arc::clone(&self.inner)))
    }

    /// Deallocates the PD (`ibv_dealloc_pd(3)`). Afterwards registrations and QP
    /// creation in it fail with [`VerbsError::InvalidHandle`].
    ///
    /// # Errors
    ///
    /// [`VerbsError::InUse`] (`EBUSY`) while MRs are registered or QPs or SRQs exist in
    /// it (a dropped QP until the engine flushed and removed it; an SRQ until destroyed,
    /// or dropped with every QP on it gone), or while a QP or SRQ is being
    /// created in it on another thread or another dealloc of it runs (never both the
    /// creation and the dealloc succeed); [`VerbsError::InvalidHandle`] if already
    /// deallocated.
    pub fn dealloc(&self) -> Result<(), VerbsError> {
        let inner = &self.inner;
        inner
            .life
            .destroy(&inner.qps, ObjectKind::Pd, inner.id.raw(), || {
                // MRs: counted and checked under the MR table's lock.
                inner.handle.mrs.dealloc_pd(inner.id)
            })
    }
}

// ---------------------------------------------------------------------------------
// Memory regions.

/// A memory region (`struct ibv_mr`): library-owned memory and its registration (see
/// the [crate documentation](crate)). Made by [`Pd::reg_mr`] or [`Pd::alloc_mr`];
/// dropping it deregisters it.
#[derive(Debug)]
pub struct Mr {
    mr: Arc<MemoryRegion>,
    pd: Arc<PdInner>,
    deregistered: AtomicBool,
}

impl Mr {
    fn new(mr: Arc<MemoryRegion>, pd: Arc<PdInner>) -> Mr {
        Mr {
            mr,
            pd,
            deregistered: AtomicBool::new(false),
        }
    }

    /// The STag (`index << 8 | key`): lkey and rkey at once in iWARP. Changes when a
    /// fast registration sets a new key.
    pub fn stag(&self) -> Stag {
        self.mr.stag()
    }

    /// A random 8-bit key for the next fast registration of this MR
    /// ([`verbs::FastReg::key`]), other than the current one: the registration then
    /// re-keys the STag, which it must (a fast registration with the previous
    /// registration's key fails with [`VerbsError::InvalidArgument`] `"key"`).
    pub fn fresh_key(&self) -> u8 {
        self.pd.handle.mrs.fresh_key(&self.mr)
    }

    /// The lkey, for local SGEs (`ibv_mr.lkey`): the STag.
    pub fn lkey(&self) -> Lkey {
        self.mr.stag()
    }

    /// The rkey, for the peer's RDMA Writes and Reads (`ibv_mr.rkey`): the STag.
    pub fn rkey(&self) -> Rkey {
        self.mr.stag()
    }

    /// The iova of byte 0 of the buffer (`ibv_mr.addr`): also its Tagged Offset.
    pub fn iova(&self) -> u64 {
        self.mr.iova()
    }

    /// Registered length in bytes (`ibv_mr.length`; 0 before a fast registration).
    pub fn length(&self) -> u64 {
        self.mr.length()
    }

    /// Buffer size in bytes.
    pub fn capacity(&self) -> usize {
        self.mr.capacity()
    }

    /// The access rights of the registration.
    pub fn access(&self) -> AccessFlags {
        self.mr.access()
    }

    /// Valid or invalid (invalidated, not yet fast-registered, deregistered).
    pub fn state(&self) -> MrState {
        self.mr.state()
    }

    /// The PD the MR belongs to.
    pub fn pd(&self) -> PdId {
        self.pd.id
    }

    /// An SGE of `len` bytes at byte `offset` of the buffer: iova
    /// `self.iova() + offset`, lkey [`Mr::lkey`]. Not checked here; the QP checks
    /// it when the WR runs.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge::new(self.iova().wrapping_add(offset), len, self.lkey())
    }

    /// Copies `data` into the buffer at byte `offset`. Works in every state
    /// (the memory is the application's whether or not the STag is valid).
    ///
    /// # Errors
    ///
    /// [`VerbsError::MrOutOfBounds`] if `offset + data.len()` exceeds
    /// [`Mr::capacity`].
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), VerbsError> {
        self.mr.write(offset, data)
    }

    /// Copies `out.len()` bytes from byte `offset` of the buffer into `out`.
    ///
    /// # Errors
    ///
    /// [`VerbsError::MrOutOfBounds`] if `offset + out.len()` exceeds
    /// [`Mr::capacity`].
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), VerbsError> {
        self.mr.read(offset, out)
    }

    /// A copy of the whole buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        self.mr.to_vec()
    }

    /// Deregisters the MR (`ibv_dereg_mr(3)`): its STag stops resolving at once, so
    /// WRs using it fail their protection checks. The handle can still read and write
    /// the buffer.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidHandle`] if already deregistered.
    pub fn dereg(&self) -> Result<(), VerbsError> {
        if self.deregistered.swap(true, Ordering::AcqRel) {
            return Err(VerbsError::InvalidHandle {
                object: ObjectKind::Mr,
                handle: self.mr.index(),
            });
        }
        self.pd.handle.mrs.dereg_mr(&self.mr)
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if !self.deregistered.swap(true, Ordering::AcqRel) {
            let _ = self.pd.handle.mrs.dereg_mr(&self.mr);
        }
    }
}

// ---------------------------------------------------------------------------------
// Completion queues.

/// The CQ object behind a [`Cq`] handle and the QPs using it.
#[derive(Debug)]
pub(crate) struct CqInner {
    cq: Arc<CompletionQueue>,
    handle: Arc<Handle>,
    users: AtomicUsize,
    life: Life,
}

impl CqInner {
    pub(crate) fn new(cq: Arc<CompletionQueue>, handle: Arc<Handle>) -> CqInner {
        CqInner {
            cq,
            handle,
            users: AtomicUsize::new(0),
            life: Life::new(),
        }
    }
}

/// A completion queue (`struct ibv_cq`): a bounded FIFO of [`WorkCompletion`]s the
/// engine fills and application threads take. An overflow is never silent: the CQ
/// enters the error state, [`Cq::poll`] returns [`CqError::Overflow`] once the
/// completions that fit are taken, an [`AsyncEvent::CqErr`] is queued (here and in
/// [`Device::next_async_event`](crate::api::device::Device::next_async_event)), and the
/// QPs that lost a completion go to Error. Made by
/// [`Device::create_cq`](crate::api::device::Device::create_cq).
#[derive(Debug)]
pub struct Cq {
    inner: Arc<CqInner>,
}

impl Cq {
    pub(crate) fn new(inner: CqInner) -> Cq {
        Cq {
            inner: Arc::new(inner),
        }
    }

    /// The CQ's handle (the `cq` of [`AsyncEvent::CqErr`]).
    pub fn handle(&self) -> u32 {
        self.inner.cq.handle()
    }

    /// Capacity, in completions (`ibv_cq.cqe`).
    pub fn capacity(&self) -> usize {
        self.inner.cq.capacity()
    }

    /// Completions queued now.
    pub fn len(&self) -> usize {
        self.inner.cq.len()
    }

    /// True if no completion is queued.
    pub fn is_empty(&self) -> bool {
        self.inner.cq.is_empty()
    }

    /// Takes up to `max` completions, oldest first (`ibv_poll_cq(3)`); never
    /// blocks.
    ///
    /// # Errors
    ///
    /// [`CqError::Overflow`] once the CQ overflowed and every completion that fit
    /// was taken; [`CqError::Destroyed`] after [`Cq::destroy`].
    pub fn poll(&self, max: usize) -> Result<Vec<WorkCompletion>, CqError> {
        self.check_live()?;
        let got = self.inner.cq.poll(max)?;
        if got.is_empty() && max > 0 && self.drive_if_empty() {
            return self.inner.cq.poll(max);
        }
        Ok(got)
    }

    /// [`crate::ProgressMode::Hybrid`]: a poll that found the CQ empty drives the
    /// device (libfabric's manual progress on a CQ read). True if a completion may have
    /// arrived.
    fn drive_if_empty(&self) -> bool {
        self.inner.handle.drives()
            && self.inner.cq.is_empty()
            && self.inner.handle.drive(crate::engine::POLL_BUDGET)
    }

    /// `Err(Destroyed)` once [`Cq::destroy`] succeeded.
    fn check_live(&self) -> Result<(), CqError> {
        if self.inner.life.destroyed() {
            return Err(CqError::Destroyed { cq: self.handle() });
        }
        Ok(())
    }

    /// Takes up to `out.len()` completions into `out` and returns how many
    /// (`ibv_poll_cq(3)` with a caller array); never blocks.
    ///
    /// # Errors
    ///
    /// As [`Cq::poll`].
    pub fn poll_into(&self, out: &mut [WorkCompletion]) -> Result<usize, CqError> {
        self.check_live()?;
        let n = self.inner.cq.poll_into(out)?;
        if n == 0 && !out.is_empty() && self.drive_if_empty() {
            return self.inner.cq.poll_into(out);
        }
        Ok(n)
    }

    /// Blocks until a completion is queued or the CQ is in error (true), or
    /// `timeout` passed (false). The completion-channel wait of libibverbs
    /// (`ibv_get_cq_event(3)`) without the channel. A destroyed CQ returns true at
    /// once (its [`Cq::poll`] fails).
    ///
    /// In [`crate::ProgressMode::Hybrid`] the caller first drives the device for up to
    /// [`crate::EngineConfig::spin`] (busy polling), then sleeps on the CQ.
    pub fn wait(&self, timeout: Duration) -> bool {
        if self.check_live().is_err() {
            return true;
        }
        let handle = &self.inner.handle;
        if handle.drives() {
            let begin = Instant::now();
            let cq = &self.inner.cq;
            if let Some(ready) = handle
                .driving
                .app_wait(timeout, &|| !cq.is_empty() || cq.is_error())
            {
                return ready;
            }
            // Another thread polls the link: sleep on the CQ.
            return cq.wait(timeout.saturating_sub(begin.elapsed()));
        }
        self.inner.cq.wait(timeout)
    }

    /// Waits up to `timeout` for at least one completion, then takes up to `max`.
    /// Returns an empty vector on timeout.
    ///
    /// # Errors
    ///
    /// As [`Cq::poll`].
    pub fn poll_wait(&self, max: usize, timeout: Duration) -> Result<Vec<WorkCompletion>, CqError> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let got = self.poll(max)?;
            if !got.is_empty() || max == 0 {
                return Ok(got);
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) if !l.is_zero() => l,
                    _ => return Ok(got),
                },
                None => Duration::from_secs(3600),
            };
            self.wait(left);
        }
    }

    /// A future resolving when a completion is queued or the CQ is in error (then
    /// [`Cq::poll`] returns something). Executor-agnostic (tokio, async-std, a hand
    /// loop): it registers the task's waker, which the engine wakes.
    pub fn wait_async(&self) -> WaitAsync<'_> {
        self.inner.cq.wait_async()
    }

    /// True once the CQ overflowed.
    pub fn is_error(&self) -> bool {
        self.inner.cq.is_error()
    }

    /// Completions lost to overflow so far.
    pub fn lost(&self) -> u64 {
        self.inner.cq.lost()
    }

    /// The pending [`AsyncEvent::CqErr`], once, after an overflow.
    pub fn take_async_event(&self) -> Option<AsyncEvent> {
        self.inner.cq.take_async_event()
    }

    /// Destroys the CQ (`ibv_destroy_cq(3)`); queued completions are dropped with it,
    /// and [`Cq::poll`] fails with [`CqError::Destroyed`] from then on.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InUse`] (`EBUSY`) while QPs use it, including a dropped QP the
    /// engine has not flushed and removed yet (its flushed completions still come
    /// here; [`Qp::destroy`] waits for that), or while a QP is being created on it on
    /// another thread or another destroy of it runs (never both the creation and the
    /// destroy succeed); [`VerbsError::InvalidHandle`] if already destroyed.
    pub fn destroy(&self) -> Result<(), VerbsError> {
        let inner = &self.inner;
        inner
            .life
            .destroy(&inner.users, ObjectKind::Cq, self.handle(), || Ok(()))?;
        // Drain what is queued: nothing is delivered from a destroyed CQ.
        let _ = inner.cq.poll(usize::MAX);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------
// Shared receive queues.

/// The SRQ object behind an [`Srq`] handle and the QPs attached to it.
#[derive(Debug)]
pub(crate) struct SrqInner {
    srq: Arc<SharedReceiveQueue>,
    handle: Arc<Handle>,
    pd: Arc<PdInner>,
    /// QPs attached: created on it and not yet flushed and removed by the engine.
    users: AtomicUsize,
    life: Life,
    /// The SRQ's counts on its PD and on the device's SRQs were given back (destroyed,
    /// or the last reference dropped).
    released: AtomicBool,
}

impl SrqInner {
    /// Gives back the SRQ's counts on its PD and on the device's SRQs, once.
    fn release(&self) {
        if !self.released.swap(true, Ordering::SeqCst) {
            self.pd.qps.fetch_sub(1, Ordering::SeqCst);
            self.handle.srqs.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        self.release();
    }
}

/// A shared receive queue (`struct ibv_srq`, basic type): receive WRs that every QP
/// created on it with
/// [`Device::create_qp_with_srq`](crate::api::device::Device::create_qp_with_srq) draws
/// from. Made by [`Device::create_srq`](crate::api::device::Device::create_srq).
///
/// - A QP takes the SRQ's oldest WR when the first DDP segment of a new Send or
///   Immediate Data message reaches it, and keeps it for the message's other segments
///   (siw); so WRs leave the SRQ in posting order across QPs, and each QP's messages
///   complete in the peer's order. The completion is on the receiving QP's receive CQ
///   with its `qp_num`. A message that finds the SRQ empty is the DDP Terminate
///   "Invalid MSN - no buffer available", as for an empty receive queue.
/// - The limit: see [`Srq::modify`] ([`AsyncEvent::SrqLimitReached`] once per arming,
///   through [`Device::next_async_event`](crate::api::device::Device::next_async_event)).
/// - A QP that goes to Error completes flushed the WR its message in progress had
///   taken, then reports [`AsyncEvent::QpLastWqeReached`]; the WRs still in the SRQ
///   stay there for the other QPs.
/// - The device's end (removal, shutdown) flushes the WRs still in the SRQ onto the
///   receive CQ of its attached QP with the lowest number, so every WR posted to an SRQ
///   with a QP attached completes exactly once. An SRQ no QP uses has no CQ to complete
///   them on: they stay until [`Srq::destroy`] discards them.
///
/// Dropping the handle leaves the SRQ to the QPs attached to it; it goes away with the
/// last of them.
#[derive(Debug)]
pub struct Srq {
    inner: Arc<SrqInner>,
}

impl Srq {
    pub(crate) fn create(
        handle: &Arc<Handle>,
        pd: &Pd,
        attr: SrqInitAttr,
    ) -> Result<Srq, VerbsError> {
        handle.alive()?;
        if !Arc::ptr_eq(&pd.inner.handle, handle) {
            return Err(VerbsError::NotPermitted {
                what: "a PD of another device",
            });
        }
        let srq = SharedReceiveQueue::new(handle.next_srq(), pd.inner.id, attr)?;
        if handle.srqs.fetch_add(1, Ordering::SeqCst) >= DeviceAttr::SOFT.max_srq as usize {
            handle.srqs.fetch_sub(1, Ordering::SeqCst);
            return Err(VerbsError::OutOfResources { what: "SRQs" });
        }
        // Counted on the PD first, then checked live (`Life`): a racing
        // `Pd::dealloc` and this creation never both succeed. From here the counts go
        // back when `inner` does.
        pd.inner.qps.fetch_add(1, Ordering::SeqCst);
        let inner = SrqInner {
            srq,
            handle: Arc::clone(handle),
            pd: Arc::clone(&pd.inner),
            users: AtomicUsize::new(0),
            life: Life::new(),
            released: AtomicBool::new(false),
        };
        pd.inner
            .life
            .check_live(ObjectKind::Pd, pd.inner.id.raw())?;
        let a = inner.srq.query();
        tracing::debug!(
            srq = inner.srq.handle(),
            pd = pd.inner.id.raw(),
            max_wr = a.max_wr,
            max_sge = a.max_sge,
            "SRQ created"
        );
        Ok(Srq {
            inner: Arc::new(inner),
        })
    }

    /// The SRQ's handle (the `srq` of [`AsyncEvent::SrqLimitReached`]).
    pub fn handle(&self) -> u32 {
        self.inner.srq.handle()
    }

    /// The PD the SRQ was created in: the lkeys of its receive WRs are checked against
    /// it when a message is placed.
    pub fn pd(&self) -> PdId {
        self.inner.pd.id
    }

    /// Receive WRs in the SRQ now: posted and not yet taken by a QP.
    pub fn len(&self) -> usize {
        self.inner.srq.len()
    }

    /// True if no receive WR is in the SRQ.
    pub fn is_empty(&self) -> bool {
        self.inner.srq.is_empty()
    }

    /// `Err(InvalidHandle)` once destroyed.
    fn check_live(&self) -> Result<(), VerbsError> {
        if self.inner.life.destroyed() {
            return Err(VerbsError::InvalidHandle {
                object: ObjectKind::Srq,
                handle: self.handle(),
            });
        }
        Ok(())
    }

    /// Posts one receive WR (`ibv_post_srq_recv(3)`), behind every WR posted before
    /// it. A message that reaches an attached QP after this returns can take it.
    ///
    /// # Errors
    ///
    /// [`VerbsError::TooManySges`] (more than the SRQ's `max_sge`),
    /// [`VerbsError::InvalidArgument`] `"sg_list"` (an SGE wraps past 2^64),
    /// [`VerbsError::MessageTooLong`]; [`VerbsError::QueueFull`] (`ENOMEM`) with the
    /// SRQ's `max_wr` WRs in it; [`VerbsError::InvalidHandle`] after [`Srq::destroy`];
    /// [`VerbsError::DeviceGone`] once the device ended. A refused WR never completes.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError> {
        // Held while the WR is queued: the device's end flushes it, or refuses it.
        let _gate = self.inner.handle.gate()?;
        self.check_live()?;
        self.inner.srq.post(wr)
    }

    /// Posts receive WRs in order (`ibv_post_srq_recv(3)` with a WR list). Stops at the
    /// first WR refused.
    ///
    /// # Errors
    ///
    /// [`PostListError`] with the refused WR's index and the error of
    /// [`Srq::post_recv`]; the WRs before it were posted.
    pub fn post_recv_list(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<(), PostListError> {
        let _gate = self
            .inner
            .handle
            .gate()
            .map_err(|error| PostListError { index: 0, error })?;
        self.check_live()
            .map_err(|error| PostListError { index: 0, error })?;
        for (index, wr) in wrs.into_iter().enumerate() {
            self.inner
                .srq
                .post(wr)
                .map_err(|error| PostListError { index, error })?;
        }
        Ok(())
    }

    /// Modifies the SRQ (`ibv_modify_srq(3)`): the fields of `attr` named in `mask`.
    /// [`SrqAttrMask::LIMIT`] arms the limit with `attr.srq_limit` (or disarms it with
    /// 0): when a QP's take leaves fewer WRs in the SRQ than the limit,
    /// [`AsyncEvent::SrqLimitReached`] is reported once and the limit goes back to 0
    /// (what [`Srq::query`] shows) until it is armed again. Arming with fewer WRs in
    /// the SRQ than the limit reports nothing until the next take (siw checks at each
    /// take).
    ///
    /// # Errors
    ///
    /// [`VerbsError::Unsupported`] (`EOPNOTSUPP`, what `siw_modify_srq` returns) with
    /// [`SrqAttrMask::MAX_WR`]: the SRQ cannot be resized; [`VerbsError::InvalidArgument`]
    /// `"srq_limit"` above the SRQ's `max_wr` (`EINVAL`); [`VerbsError::InvalidHandle`]
    /// after [`Srq::destroy`]; [`VerbsError::DeviceGone`]. Nothing changes on error.
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<(), VerbsError> {
        self.inner.handle.alive()?;
        self.check_live()?;
        self.inner.srq.modify(attr, mask)
    }

    /// The SRQ's attributes (`ibv_query_srq(3)`): the granted `max_wr` (the request
    /// rounded up to a power of two, as siw) and `max_sge`, and the limit (0: not, or
    /// no longer, armed).
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidHandle`] after [`Srq::destroy`].
    pub fn query(&self) -> Result<SrqAttr, VerbsError> {
        self.check_live()?;
        Ok(self.inner.srq.query())
    }

    /// Destroys the SRQ (`ibv_destroy_srq(3)`). The WRs still in it are discarded, never
    /// completed (an SRQ has no CQ of its own; rdma-core's providers free them the
    /// same way); posts fail with [`VerbsError::InvalidHandle`] from then on.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InUse`] (`EBUSY`, as the kernel's `ib_destroy_srq_user` while a
    /// QP uses it; siw itself trusts the core for that) while a QP attached to it
    /// exists, including a dropped QP the engine has not flushed and removed yet
    /// ([`Qp::destroy`] waits for that), or while a QP is being created on it on
    /// another thread; [`VerbsError::InvalidHandle`] if already destroyed.
    pub fn destroy(&self) -> Result<(), VerbsError> {
        let inner = &self.inner;
        inner
            .life
            .destroy(&inner.users, ObjectKind::Srq, self.handle(), || Ok(()))?;
        let discarded = inner.srq.close().len();
        inner.release();
        tracing::debug!(srq = self.handle(), discarded, "SRQ destroyed");
        Ok(())
    }
}

// ---------------------------------------------------------------------------------
// Queue pairs.

/// What [`Device::create_qp`](crate::api::device::Device::create_qp) takes (`struct
/// ibv_qp_init_attr`; the type is always RC).
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr<'a> {
    /// Completions of send WRs go here.
    pub send_cq: &'a Cq,
    /// Completions of receive WRs go here (may be the same CQ).
    pub recv_cq: &'a Cq,
    /// Queue depths (WRs), SGEs per WR, inline bytes.
    pub cap: QpCap,
    /// Every send WR completes, signaled or not (`sq_sig_all`).
    pub sq_sig_all: bool,
}

/// What [`Qp::query_qp`] reports (`ibv_query_qp(3)`): the values the engine last
/// published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttributes {
    /// The QP number.
    pub qp_num: u32,
    /// The state (`qp_state`).
    pub state: QpState,
    /// Capabilities (`cap`).
    pub cap: QpCap,
    /// `sq_sig_all`.
    pub sq_sig_all: bool,
    /// ORD (`max_rd_atomic`): as negotiated once connected.
    pub ord: u32,
    /// IRD (`max_dest_rd_atomic`): as negotiated once connected.
    pub ird: u32,
    /// Incoming remote operations accepted (`qp_access_flags`).
    pub access: AccessFlags,
    /// Send WRs posted and not yet retired.
    pub sq_outstanding: u64,
    /// Receive WRs posted and not yet retired.
    pub rq_outstanding: u64,
    /// Bound to a live connection.
    pub connected: bool,
}

/// A queue pair (`struct ibv_qp`, RC). See the [crate documentation](crate) for the
/// threading and completion rules. Dropping it destroys it as [`Qp::destroy`] does but
/// without waiting for the engine: the flushed completions may reach its CQs after the
/// drop (call [`Qp::destroy`] to have them all there when it returns).
#[derive(Debug)]
pub struct Qp {
    shared: Arc<QpShared>,
    handle: Arc<Handle>,
    /// The handle of the SRQ the QP takes its receive WRs from.
    srq: Option<u32>,
    /// Shared with the engine's copy of the QP: the PD, CQs and SRQ are in use until
    /// both are gone (held for its `Drop` only).
    _uses: Arc<QpUses>,
}

/// One QP's use of its PD, CQs and SRQ (the `qps` / `users` counts that make
/// [`Pd::dealloc`], [`Cq::destroy`] and [`Srq::destroy`] fail with
/// [`VerbsError::InUse`]). The [`Qp`] handle holds one reference and the engine's QP
/// another, which the engine drops only once it flushed the QP and removed it: the
/// counts fall when both are gone, so no completion can reach a CQ after its destroy
/// succeeded, and no QP takes from an SRQ after its destroy succeeded.
#[derive(Debug)]
pub(crate) struct QpUses {
    pd: Arc<PdInner>,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    srq: Option<Arc<SrqInner>>,
}

impl QpUses {
    /// Counts a QP about to be created on the PD, CQs and SRQ, then checks that they
    /// are live ([`Life`]: the creator's half of the protocol); on `Err` the counts
    /// are undone (the `QpUses` is dropped).
    fn acquire(
        pd: &Arc<PdInner>,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
    ) -> Result<QpUses, VerbsError> {
        pd.qps.fetch_add(1, Ordering::SeqCst);
        send_cq.inner.users.fetch_add(1, Ordering::SeqCst);
        recv_cq.inner.users.fetch_add(1, Ordering::SeqCst);
        if let Some(srq) = srq {
            srq.inner.users.fetch_add(1, Ordering::SeqCst);
        }
        let uses = QpUses {
            pd: Arc::clone(pd),
            send_cq: Arc::clone(&send_cq.inner),
            recv_cq: Arc::clone(&recv_cq.inner),
            srq: srq.map(|s| Arc::clone(&s.inner)),
        };
        for cq in [send_cq, recv_cq] {
            cq.inner.life.check_live(ObjectKind::Cq, cq.handle())?;
        }
        if let Some(srq) = srq {
            srq.inner.life.check_live(ObjectKind::Srq, srq.handle())?;
        }
        pd.life.check_live(ObjectKind::Pd, pd.id.raw())?;
        Ok(uses)
    }
}

impl Drop for QpUses {
    fn drop(&mut self) {
        self.pd.qps.fetch_sub(1, Ordering::SeqCst);
        self.send_cq.users.fetch_sub(1, Ordering::SeqCst);
        self.recv_cq.users.fetch_sub(1, Ordering::SeqCst);
        if let Some(srq) = &self.srq {
            srq.users.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Why a list post stopped: the index of the first WR refused (`bad_wr` of
/// `ibv_post_send(3)`) and why. The WRs before it were posted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("WR {index} of the list refused: {error}")]
pub struct PostListError {
    /// Index of the refused WR in the list.
    pub index: usize,
    /// Why it was refused.
    pub error: VerbsError,
}

impl Qp {
    /// Creates a QP (`ibv_create_qp(3)`); with `srq`, its receive WRs come from the
    /// SRQ and `attr.cap`'s `max_recv_wr` and `max_recv_sge` are ignored (0 in the
    /// QP's capabilities), as `ibv_create_qp(3)` says.
    pub(crate) fn create(
        handle: &Arc<Handle>,
        pd: &Pd,
        attr: QpInitAttr<'_>,
        srq: Option<&Srq>,
    ) -> Result<Qp, VerbsError> {
        handle.alive()?;
        let foreign = VerbsError::NotPermitted {
            what: "an object of another device",
        };
        if !Arc::ptr_eq(&pd.inner.handle, handle)
            || !Arc::ptr_eq(&attr.send_cq.inner.handle, handle)
            || !Arc::ptr_eq(&attr.recv_cq.inner.handle, handle)
            || srq.is_some_and(|s| !Arc::ptr_eq(&s.inner.handle, handle))
        {
            return Err(foreign);
        }
        // Counted on the PD, CQs and SRQ first, then checked live (`Life`): a racing
        // `Pd::dealloc`, `Cq::destroy` or `Srq::destroy` and this creation never both
        // succeed.
        let uses = QpUses::acquire(&pd.inner, attr.send_cq, attr.recv_cq, srq)?;
        let mut cap = attr.cap;
        if srq.is_some() {
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        }
        check_cap(&cap)?;
        let qpn = handle.next_qpn();
        let mut init = QpInit::new(qpn, pd.inner.id, cap);
        init.sq_sig_all = attr.sq_sig_all;
        if handle.strict_read_sink {
            init.read_sink_access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        }
        let mut engine = QpEngine::new(
            init,
            Arc::clone(&handle.mrs),
            Arc::clone(&attr.send_cq.inner.cq),
            Arc::clone(&attr.recv_cq.inner.cq),
        )?;
        if let Some(srq) = srq {
            engine.attach_srq(Arc::clone(&srq.inner.srq))?;
        }
        let mut core = QpCore::new(
            engine,
            Arc::clone(&attr.send_cq.inner.cq),
            Arc::clone(&attr.recv_cq.inner.cq),
            handle.async_events(),
            handle.kick(),
        );
        let uses = Arc::new(uses);
        core.uses = Some(Arc::clone(&uses) as UsesGuard);
        let shared = Arc::clone(&core.shared);
        handle.enqueue(Command::CreateQp {
            core: Arc::new(Mutex::new(core)),
        })?;
        let srq = srq.map(Srq::handle);
        tracing::debug!(qpn, pd = pd.inner.id.raw(), ?srq, "QP created");
        Ok(Qp {
            shared,
            handle: Arc::clone(handle),
            srq,
            _uses: uses,
        })
    }

    /// `Err(NotPermitted)` unless the QP belongs to the device of `handle`.
    pub(crate) fn check_device(&self, handle: &Arc<Handle>) -> Result<(), VerbsError> {
        if Arc::ptr_eq(&self.handle, handle) {
            Ok(())
        } else {
            Err(VerbsError::NotPermitted {
                what: "a QP of another device",
            })
        }
    }

    /// The QP number (`ibv_qp.qp_num`).
    pub fn qp_num(&self) -> u32 {
        self.shared.qp_num
    }

    /// The handle of the SRQ the QP takes its receive WRs from (`ibv_qp.srq`), if it
    /// was created with one.
    pub fn srq(&self) -> Option<u32> {
        self.srq
    }

    /// The state the engine last published (`ibv_qp.state`).
    pub fn state(&self) -> QpState {
        self.shared.state()
    }

    /// The QP's attributes (`ibv_query_qp(3)`), as the engine last published them.
    pub fn query_qp(&self) -> QpAttributes {
        let p = self.shared.lock_post();
        let c = &self.shared.counters;
        QpAttributes {
            qp_num: self.shared.qp_num,
            state: self.shared.state(),
            cap: self.shared.cap,
            sq_sig_all: self.shared.sq_sig_all,
            ord: self.shared.ord(),
            ird: self.shared.ird(),
            access: self.shared.access(),
            sq_outstanding: p.sends.saturating_sub(c.sq_retired()),
            rq_outstanding: p.recvs.saturating_sub(c.rq_retired()),
            connected: self.shared.connected(),
        }
    }

    /// Counters the engine publishes (ORD/IRD high-water marks, ULPDUs).
    pub fn stats(&self) -> QpStats {
        self.shared.stats()
    }

    /// Posts one send WR (`ibv_post_send(3)`): Send (with SE, with Invalidate), RDMA
    /// Write (with Immediate), RDMA Read, Local Invalidate, Fast Register. Checked on
    /// the calling thread, then queued for the engine.
    ///
    /// Accepted in RTS and SQD (started in order once in RTS), and in Error / SQE,
    /// where it completes at once with [`verbs::WcStatus::WrFlushErr`] (Linux siw
    /// behaviour). The local checks that need the MR table (lkey, PD, bounds, rights)
    /// run when the WR starts and fail it with [`verbs::WcStatus::LocProtErr`]; a
    /// protection failure at the peer comes back as a Terminate
    /// ([`verbs::WcStatus::RemAccessErr`] and friends, `vendor_err` = the
    /// Terminate's layer, type and code).
    ///
    /// # Errors
    ///
    /// Those of [`SendWr::validate`] against the QP's capabilities;
    /// [`VerbsError::Unsupported`] (an RDMA Read or an RFC 7306 atomic with ORD 0);
    /// [`VerbsError::MessageTooLong`]; [`VerbsError::InvalidArgument`]
    /// `"remote_addr"` (remote range wraps); [`VerbsError::InvalidQpState`] in Reset,
    /// Init, RTR; [`VerbsError::QueueFull`] (`ENOMEM`) with `max_send_wr` WRs
    /// outstanding; [`VerbsError::InvalidHandle`] after [`Qp::destroy`];
    /// [`VerbsError::DeviceGone`] once the device ended. A refused WR never
    /// completes.
    pub fn post_send(&self, wr: SendWr) -> Result<(), VerbsError> {
        self.post(Ring::Send, |p| self.queue_send(p, wr))
    }

    /// Posts send WRs in order, ringing the doorbell once (`ibv_post_send(3)` with a
    /// WR list). Stops at the first WR refused.
    ///
    /// # Errors
    ///
    /// [`PostListError`] with the refused WR's index and the error of
    /// [`Qp::post_send`]; the WRs before it were posted.
    pub fn post_send_list(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), PostListError> {
        self.post_list(Ring::Send, wrs, |p, wr| self.queue_send(p, wr))
    }

    /// Posts one receive WR (`ibv_post_recv(3)`): consumed in posting order, one per
    /// incoming Send or Immediate Data message. Checked on the calling thread, then
    /// queued for the engine; a message that arrives after this returns finds it.
    /// Accepted in every state but Reset; in Error it completes at once with
    /// [`verbs::WcStatus::WrFlushErr`].
    ///
    /// # Errors
    ///
    /// Those of [`RecvWr::validate`]; [`VerbsError::InvalidQpState`] in Reset;
    /// [`VerbsError::QueueFull`] with `max_recv_wr` WRs outstanding;
    /// [`VerbsError::InvalidArgument`] `"qp with an SRQ"` (`EINVAL`, as rdma-core's
    /// providers) on a QP created with an SRQ: post to the [`Srq`];
    /// [`VerbsError::InvalidHandle`] after [`Qp::destroy`];
    /// [`VerbsError::DeviceGone`]. A refused WR never completes.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError> {
        self.post(Ring::Recv, |p| self.queue_recv(p, wr))
    }

    /// Posts receive WRs in order, ringing the doorbell once.
    ///
    /// # Errors
    ///
    /// [`PostListError`] as for [`Qp::post_send_list`].
    pub fn post_recv_list(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<(), PostListError> {
        self.post_list(Ring::Recv, wrs, |p, wr| self.queue_recv(p, wr))
    }

    /// Runs `queue` with the QP's post side locked, under the device's gate (so the
    /// engine is certain to take what is queued), then rings the doorbell.
    fn post(
        &self,
        ring: Ring,
        queue: impl FnOnce(&mut PostSide) -> Result<(), VerbsError>,
    ) -> Result<(), VerbsError> {
        {
            let _gate = self.handle.gate()?;
            let mut p = self.shared.lock_post();
            if p.destroyed {
                return Err(self.destroyed_error());
            }
            queue(&mut p)?;
        }
        self.ring(ring);
        Ok(())
    }

    fn post_list<W>(
        &self,
        ring: Ring,
        wrs: impl IntoIterator<Item = W>,
        mut queue: impl FnMut(&mut PostSide, W) -> Result<(), VerbsError>,
    ) -> Result<(), PostListError> {
        let mut posted = 0usize;
        let r = (|| {
            let _gate = self
                .handle
                .gate()
                .map_err(|error| PostListError { index: 0, error })?;
            let mut p = self.shared.lock_post();
            if p.destroyed {
                return Err(PostListError {
                    index: 0,
                    error: self.destroyed_error(),
                });
            }
            for (index, wr) in wrs.into_iter().enumerate() {
                queue(&mut p, wr).map_err(|error| PostListError { index, error })?;
                posted += 1;
            }
            Ok(())
        })();
        if posted > 0 {
            self.ring(ring);
        }
        r
    }

    /// Tells the engine this QP has new WRs (one doorbell entry and wake-up per batch
    /// the engine has not taken yet). In [`crate::ProgressMode::Hybrid`] a post of
    /// Sends drives the device itself; a post of receives does not (nothing to
    /// transmit: the receive path takes posted receives before every ULPDU, as siw's
    /// `siw_post_receive` only queues), it only wakes the engine when the engine covers
    /// the link.
    fn ring(&self, ring: Ring) {
        let first = !self.shared.has_work.swap(true, Ordering::AcqRel);
        self.handle
            .ring(self.shared.qp_num, first, ring == Ring::Send);
    }

    fn queue_send(&self, p: &mut PostSide, wr: SendWr) -> Result<(), VerbsError> {
        validate_send_wr(&self.shared.cap, self.shared.ord(), &wr)?;
        let state = self.shared.state();
        match state {
            QpState::Rts | QpState::Sqd => {
                let outstanding = p.sends.saturating_sub(self.shared.counters.sq_retired());
                if outstanding >= u64::from(self.shared.cap.max_send_wr) {
                    return Err(VerbsError::QueueFull {
                        queue: WorkQueue::Send,
                        depth: self.shared.cap.max_send_wr,
                    });
                }
            }
            QpState::Error | QpState::Sqe => {}
            state => {
                return Err(VerbsError::InvalidQpState {
                    op: "post_send",
                    state,
                })
            }
        }
        p.send_q.push_back(wr);
        p.sends += 1;
        Ok(())
    }

    fn queue_recv(&self, p: &mut PostSide, wr: RecvWr) -> Result<(), VerbsError> {
        if self.srq.is_some() {
            return Err(VerbsError::InvalidArgument {
                what: "qp with an SRQ",
            });
        }
        wr.validate(&self.shared.cap)?;
        match self.shared.state() {
            QpState::Reset => {
                return Err(VerbsError::InvalidQpState {
                    op: "post_recv",
                    state: QpState::Reset,
                })
            }
            QpState::Error => {}
            _ => {
                let outstanding = p.recvs.saturating_sub(self.shared.counters.rq_retired());
                if outstanding >= u64::from(self.shared.cap.max_recv_wr) {
                    return Err(VerbsError::QueueFull {
                        queue: WorkQueue::Recv,
                        depth: self.shared.cap.max_recv_wr,
                    });
                }
            }
        }
        p.recv_q.push_back(wr);
        p.recvs += 1;
        Ok(())
    }

    /// Modifies the QP (`ibv_modify_qp(3)`): the fields of `attr` that are `Some`.
    /// Checked first, then applied in this order: `qp_access_flags`,
    /// `max_rd_atomic` (ORD) and `max_dest_rd_atomic` (IRD), `qp_state` (the
    /// transition table of [`verbs::check_transition`]). To Error: every outstanding
    /// WR is flushed, and a bound connection is closed (abortively). To Reset: the
    /// same, then every queue and counter is cleared. To SQD: no new send WR starts;
    /// [`AsyncEvent::SqDrained`] follows once nothing is in flight.
    /// `en_sqd_async_notify` is accepted (the event is always reported). To RTS: only
    /// for a QP bound to a connection (as kernel siw: RTS needs the LLP connection; a
    /// QP is normally moved there by [`Device::connect_qp`] /
    /// [`ConnectRequest::accept_qp`](crate::api::device::ConnectRequest::accept_qp)), so a
    /// send WR is never accepted by a QP that could not send it. When the QP goes to
    /// Error by itself (a Terminate, a local failure), its connection is aborted.
    ///
    /// [`Device::connect_qp`]: crate::api::device::Device::connect_qp
    ///
    /// # Errors
    ///
    /// [`VerbsError::IllegalTransition`]; [`VerbsError::InvalidArgument`]
    /// `"cur_qp_state"` (not the current state), `"ord"` / `"ird"`;
    /// [`VerbsError::InvalidQpState`] (ORD/IRD outside Reset and Init; RTS for a QP
    /// not bound to a connection);
    /// [`VerbsError::Unsupported`] (`cap`: QPs are not resized);
    /// [`VerbsError::InvalidHandle`] after [`Qp::destroy`];
    /// [`VerbsError::DeviceGone`]. Nothing changes on error.
    pub fn modify_qp(&self, attr: &QpAttr) -> Result<(), VerbsError> {
        if self.shared.lock_post().destroyed {
            return Err(self.destroyed_error());
        }
        let qpn = self.shared.qp_num;
        let attr = *attr;
        self.handle
            .call_verbs("ibv_modify_qp", |reply| Command::ModifyQp {
                qpn,
                attr,
                reply,
            })
    }

    /// [`Qp::modify_qp`] with only a new state.
    ///
    /// # Errors
    ///
    /// As [`Qp::modify_qp`].
    pub fn modify_state(&self, to: QpState) -> Result<(), VerbsError> {
        self.modify_qp(&QpAttr::state(to))
    }

    /// Destroys the QP (`ibv_destroy_qp(3)`), safe at any time: the QP goes to Error
    /// and every outstanding WR is flushed onto its CQs, its connection (if any) is
    /// closed, and it leaves the engine; no completion of it appears after this
    /// returns. After the device ended, the engine already flushed it.
    ///
    /// # Errors
    ///
    /// An `ETIMEDOUT` [`VerbsError::Os`] if the engine did not answer within
    /// [`crate::engine::COMMAND_TIMEOUT`] (the destroy still happens).
    pub fn destroy(self) -> Result<(), VerbsError> {
        self.destroy_inner(true)
    }

    fn destroy_inner(&self, wait: bool) -> Result<(), VerbsError> {
        {
            let mut p = self.shared.lock_post();
            if p.destroyed {
                return Ok(());
            }
            p.destroyed = true;
        }
        let qpn = self.shared.qp_num;
        if !wait {
            if self
                .handle
                .enqueue(Command::DestroyQp { qpn, reply: None })
                .is_ok()
            {
                self.handle.wake();
            }
            return Ok(());
        }
        let (tx, rx) = std::sync::mpsc::channel();
        if self
            .handle
            .enqueue(Command::DestroyQp {
                qpn,
                reply: Some(tx),
            })
            .is_err()
        {
            // The engine ended and flushed every QP already.
            return Ok(());
        }
        self.handle.wake();
        match rx.recv_timeout(crate::engine::COMMAND_TIMEOUT) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Ok(()),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(VerbsError::Os {
                call: "ibv_destroy_qp",
                errno: libc::ETIMEDOUT,
            }),
        }
    }

    fn destroyed_error(&self) -> VerbsError {
        VerbsError::InvalidHandle {
            object: ObjectKind::Qp,
            handle: self.shared.qp_num,
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // The PD and CQ uses end when the engine flushed and removed the QP too
        // (`QpUses`).
        let _ = self.destroy_inner(false);
    }
}

/// The capability checks of `ibv_create_qp(3)` against [`DeviceAttr::SOFT`].
fn check_cap(cap: &QpCap) -> Result<(), VerbsError> {
    let d = DeviceAttr::SOFT;
    let bad = |what| Err(VerbsError::InvalidArgument { what });
    if cap.max_send_wr == 0 || cap.max_send_wr > d.max_qp_wr {
        return bad("max_send_wr");
    }
    if cap.max_recv_wr > d.max_qp_wr {
        return bad("max_recv_wr");
    }
    if cap.max_send_sge > d.max_sge {
        return bad("max_send_sge");
    }
    if cap.max_recv_sge > d.max_sge {
        return bad("max_recv_sge");
    }
    if cap.max_inline_data > d.max_inline_data {
        return bad("max_inline_data");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_send_and_sync() {
        fn both<T: Send + Sync>() {}
        both::<Pd>();
        both::<Mr>();
        both::<Cq>();
        both::<Srq>();
        both::<Qp>();
    }

    #[test]
    fn cap_limits() {
        let ok = QpCap {
            max_send_wr: 1,
            max_recv_wr: 0,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        assert!(check_cap(&ok).is_ok());
        let zero = QpCap {
            max_send_wr: 0,
            ..ok
        };
        assert_eq!(
            check_cap(&zero),
            Err(VerbsError::InvalidArgument {
                what: "max_send_wr"
            })
        );
        let sges = QpCap {
            max_recv_sge: 17,
            ..ok
        };
        assert!(check_cap(&sges).is_err());
    }
}

/// Which work queue a post filled (how [`Qp`] rings the doorbell).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ring {
    Send,
    Recv,
}
