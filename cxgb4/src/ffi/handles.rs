//! Owned handles of rdma-core objects: each wraps one pointer that a
//! successful create call returned, keeps its parents alive (`Arc`), offers
//! safe methods (one FFI call each) and frees the object once, on drop.
//!
//! Errors are positive errno values (`i32`), as libibverbs returns them or
//! librdmacm leaves them in `errno`. The safe layer above turns them into
//! [`crate::Error`].

use super::loader::{c_chars_to_string, RdmaCore};
use super::sockaddr;
use super::types::*;
use core::ffi::{c_int, c_void};
use core::ptr::{self, NonNull};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The calling thread's `errno`, or `EIO` if the OS reports none.
fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .filter(|&e| e != 0)
        .unwrap_or(libc::EIO)
}

/// A librdmacm call's `0 / -1 + errno` result as `Ok` / `Err(errno)`.
fn cm_result(rc: c_int) -> Result<(), i32> {
    if rc == 0 {
        Ok(())
    } else {
        Err(last_errno())
    }
}

/// A libibverbs call's `0 / errno` result (some calls return `-1` and set
/// errno; a negative value is read from errno then).
fn ibv_result(rc: c_int) -> Result<(), i32> {
    match rc {
        0 => Ok(()),
        r if r > 0 => Err(r),
        _ => Err(last_errno()),
    }
}

/// One entry of the device list, copied out (the list itself is freed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawDeviceEntry {
    /// `ibv_device.name`.
    pub name: String,
    /// `ibv_device.node_type`.
    pub node_type: c_int,
    /// `ibv_device.transport_type`.
    pub transport_type: c_int,
}

impl RdmaCore {
    /// Calls `f` with the live device array (`ibv_get_device_list`), freeing
    /// it afterwards. `ENOSYS` (no kernel uverbs support: libibverbs found no
    /// `/sys/class/infiniband_verbs`) is an empty list.
    fn with_device_list<T>(&self, f: impl FnOnce(&[*mut IbvDevice]) -> T) -> Result<T, i32> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out pointer; the result is null or an array
        // of `n` device pointers, freed below exactly once.
        let list = unsafe { (self.ibv.ibv_get_device_list)(&mut n) };
        if list.is_null() {
            let e = last_errno();
            return if e == libc::ENOSYS {
                Ok(f(&[]))
            } else {
                Err(e)
            };
        }
        // SAFETY: libibverbs returned `n` valid entries (plus a terminating null).
        let devices = unsafe { core::slice::from_raw_parts(list, n.max(0) as usize) };
        let out = f(devices);
        // SAFETY: `list` came from ibv_get_device_list and is freed once.
        unsafe { (self.ibv.ibv_free_device_list)(list) };
        Ok(out)
    }

    /// The devices libibverbs sees (`ibv_get_device_list(3)`), copied.
    pub fn raw_devices(&self) -> Result<Vec<RawDeviceEntry>, i32> {
        self.with_device_list(|devs| {
            devs.iter()
                .map(|&d| {
                    // SAFETY: each entry is a valid ibv_device while the list lives.
                    let d = unsafe { &*d };
                    RawDeviceEntry {
                        name: c_chars_to_string(&d.name),
                        node_type: d.node_type,
                        transport_type: d.transport_type,
                    }
                })
                .collect()
        })
    }

    /// Asks librdmacm for its device list and frees it at once
    /// (`rdma_get_devices` + `rdma_free_devices`): librdmacm syncs its cache
    /// then and closes the cached `ibv_context` of a device that has gone
    /// and has no id left (notes section 3, step 4). Returns the number of
    /// devices listed.
    pub fn sync_cm_devices(&self) -> Result<usize, i32> {
        let mut n: c_int = 0;
        // SAFETY: valid out pointer; the array is freed once below.
        let list = unsafe { (self.cm.rdma_get_devices)(&mut n) };
        if list.is_null() {
            let e = last_errno();
            return if e == libc::ENODEV { Ok(0) } else { Err(e) };
        }
        // SAFETY: `list` came from rdma_get_devices.
        unsafe { (self.cm.rdma_free_devices)(list) };
        Ok(n.max(0) as usize)
    }
}

/// Who closes an `ibv_context`.
enum ContextOwner {
    /// Opened by `ibv_open_device`; closed on drop.
    Us,
    /// librdmacm's cached context of a cm_id's device: never closed here;
    /// the id is kept alive so librdmacm keeps the context open.
    CmId(#[allow(dead_code)] Arc<RawCmId>),
}

/// An open device context.
pub struct RawContext {
    core: Arc<RdmaCore>,
    ptr: NonNull<IbvContext>,
    owner: ContextOwner,
}

// SAFETY: libibverbs contexts may be used from any thread (libibverbs is
// thread-safe, ibv_open_device(3)); the handle has no thread affinity.
unsafe impl Send for RawContext {}
// SAFETY: as above; every method takes &self and libibverbs serializes.
unsafe impl Sync for RawContext {}

/// One asynchronous event, copied and acknowledged, its `element` decoded
/// by the event type (`ibv_get_async_event(3)`): QP events (1-7, 16) name a
/// QP, `IBV_EVENT_CQ_ERR` (0) a CQ, port events (9-13, 17, 18) a port
/// number; zero where the type names none of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawAsyncEvent {
    /// `event_type` (`enum ibv_event_type`).
    pub event_type: u32,
    /// `element.qp->qp_num` for QP events.
    pub qp_num: u32,
    /// `element.cq->handle` for CQ events.
    pub cq_handle: u32,
    /// `element.port_num` for port events.
    pub port_num: i32,
}

impl RawContext {
    /// Opens the device named `name` (`ibv_open_device(3)`); `Ok(None)` if
    /// no device has that name.
    pub fn open(core: &Arc<RdmaCore>, name: &str) -> Result<Option<RawContext>, i32> {
        let opened = core.with_device_list(|devs| {
            for &d in devs {
                // SAFETY: a valid list entry while the list lives.
                if c_chars_to_string(unsafe { &(*d).name }) == name {
                    // SAFETY: `d` is a live entry; opening before freeing the
                    // list is what ibv_free_device_list(3) requires.
                    let ctx = unsafe { (core.ibv.ibv_open_device)(d) };
                    return Some(NonNull::new(ctx).ok_or_else(last_errno));
                }
            }
            None
        })?;
        match opened {
            None => Ok(None),
            Some(Err(e)) => Err(e),
            Some(Ok(ptr)) => Ok(Some(RawContext {
                core: core.clone(),
                ptr,
                owner: ContextOwner::Us,
            })),
        }
    }

    /// The context librdmacm opened for `id`'s device (`id->verbs`), or
    /// `None` while the id is not bound to a device.
    pub fn of_cm_id(id: &Arc<RawCmId>) -> Option<RawContext> {
        // SAFETY: `id.ptr` is a live rdma_cm_id; `verbs` is read only.
        let verbs = unsafe { (*id.ptr.as_ptr()).verbs };
        NonNull::new(verbs).map(|ptr| RawContext {
            core: id.chan.core.clone(),
            ptr,
            owner: ContextOwner::CmId(id.clone()),
        })
    }

    /// The loaded library.
    pub fn core(&self) -> &Arc<RdmaCore> {
        &self.core
    }

    /// The device name (`ibv_get_device_name`, read from `ibv_device.name`).
    pub fn device_name(&self) -> String {
        // SAFETY: the context and its device live while the context is open.
        unsafe { c_chars_to_string(&(*(*self.ptr.as_ptr()).device).name) }
    }

    /// `ibv_device.transport_type` of the context's device.
    pub fn transport_type(&self) -> c_int {
        // SAFETY: as in `device_name`.
        unsafe { (*(*self.ptr.as_ptr()).device).transport_type }
    }

    /// `ibv_query_device(3)`.
    pub fn query_device(&self) -> Result<IbvDeviceAttr, i32> {
        // SAFETY: all-zero is a valid IbvDeviceAttr (integers and chars).
        let mut attr: IbvDeviceAttr = unsafe { core::mem::zeroed() };
        // SAFETY: live context, valid out pointer of the C struct's layout.
        ibv_result(unsafe { (self.core.ibv.ibv_query_device)(self.ptr.as_ptr(), &mut attr) })?;
        Ok(attr)
    }

    /// `ibv_query_port(3)` through the exported compat symbol, into a zeroed
    /// full `ibv_port_attr` (what verbs.h's inline wrapper does).
    pub fn query_port(&self, port: u8) -> Result<IbvPortAttr, i32> {
        // SAFETY: all-zero is a valid IbvPortAttr.
        let mut attr: IbvPortAttr = unsafe { core::mem::zeroed() };
        // SAFETY: live context; the compat struct the library fills is a
        // prefix of ibv_port_attr, so the buffer is large enough.
        ibv_result(unsafe { (self.core.ibv.ibv_query_port)(self.ptr.as_ptr(), port, &mut attr) })?;
        Ok(attr)
    }

    /// `async_fd`: readable when [`RawContext::get_async_event`] will not block.
    pub fn async_fd(&self) -> c_int {
        // SAFETY: live context, field read.
        unsafe { (*self.ptr.as_ptr()).async_fd }
    }

    /// `ibv_get_async_event(3)` (blocks unless `async_fd` is non-blocking),
    /// copied and acknowledged at once (`ibv_ack_async_event`).
    pub fn get_async_event(&self) -> Result<RawAsyncEvent, i32> {
        let mut ev = IbvAsyncEvent {
            element: ptr::null_mut(),
            event_type: 0,
        };
        // SAFETY: live context, valid out pointer.
        ibv_result(unsafe { (self.core.ibv.ibv_get_async_event)(self.ptr.as_ptr(), &mut ev) })?;
        let mut out = RawAsyncEvent {
            event_type: ev.event_type,
            ..RawAsyncEvent::default()
        };
        match ev.event_type {
            // SAFETY: for these types `element` is the live `struct ibv_qp *`
            // (valid until the ack below).
            1..=7 | 16 => out.qp_num = unsafe { (*ev.element.cast::<IbvQp>()).qp_num },
            // SAFETY: for IBV_EVENT_CQ_ERR `element` is the live `struct ibv_cq *`.
            0 => out.cq_handle = unsafe { (*ev.element.cast::<IbvCq>()).handle },
            // The union's int member: the low 32 bits of the pointer-sized
            // union (little-endian x86-64).
            9..=13 | 17 | 18 => out.port_num = ev.element as usize as u32 as i32,
            _ => {}
        }
        // SAFETY: `ev` was filled by ibv_get_async_event and is acked once.
        unsafe { (self.core.ibv.ibv_ack_async_event)(&mut ev) };
        Ok(out)
    }
}

impl Drop for RawContext {
    fn drop(&mut self) {
        if let ContextOwner::Us = self.owner {
            // SAFETY: opened by us, closed once; every child holds an Arc to
            // this handle, so none is left.
            let rc = unsafe { (self.core.ibv.ibv_close_device)(self.ptr.as_ptr()) };
            if rc != 0 {
                tracing::warn!(rc, "ibv_close_device failed");
            }
        }
    }
}

/// A protection domain.
pub struct RawPd {
    ctx: Arc<RawContext>,
    ptr: NonNull<IbvPd>,
}

// SAFETY: see RawContext.
unsafe impl Send for RawPd {}
// SAFETY: see RawContext.
unsafe impl Sync for RawPd {}

impl RawPd {
    /// `ibv_alloc_pd(3)`.
    pub fn alloc(ctx: &Arc<RawContext>) -> Result<RawPd, i32> {
        // SAFETY: live context.
        let p = unsafe { (ctx.core.ibv.ibv_alloc_pd)(ctx.ptr.as_ptr()) };
        let ptr = NonNull::new(p).ok_or_else(last_errno)?;
        Ok(RawPd {
            ctx: ctx.clone(),
            ptr,
        })
    }

    /// The context the PD belongs to.
    pub fn context(&self) -> &Arc<RawContext> {
        &self.ctx
    }
}

impl Drop for RawPd {
    fn drop(&mut self) {
        // SAFETY: allocated by us, freed once; MRs and QPs hold Arcs to it.
        let rc = unsafe { (self.ctx.core.ibv.ibv_dealloc_pd)(self.ptr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_dealloc_pd failed");
        }
    }
}

/// A memory region over a buffer the handle owns.
///
/// The buffer is taken from its `Box` (so nothing else can free or move it)
/// and given back to the allocator after `ibv_dereg_mr`.
pub struct RawMr {
    pd: Arc<RawPd>,
    ptr: NonNull<IbvMr>,
    buf: NonNull<[u8]>,
}

// SAFETY: see RawContext; the buffer is owned by the handle.
unsafe impl Send for RawMr {}
// SAFETY: shared access only reads the buffer (see the module contract on
// device writes).
unsafe impl Sync for RawMr {}

impl RawMr {
    /// `ibv_reg_mr(3)` of `buf` with `access` (`enum ibv_access_flags` bits).
    /// On failure the buffer is dropped. `buf` must not be empty (`EINVAL`).
    pub fn register(pd: &Arc<RawPd>, buf: Box<[u8]>, access: c_int) -> Result<RawMr, i32> {
        if buf.is_empty() {
            return Err(libc::EINVAL);
        }
        let len = buf.len();
        let raw: *mut [u8] = Box::into_raw(buf);
        // SAFETY: Box::into_raw never returns null.
        let buf = unsafe { NonNull::new_unchecked(raw) };
        // SAFETY: live PD; `raw` is `len` bytes we own until dereg.
        let mr = unsafe {
            (pd.ctx.core.ibv.ibv_reg_mr)(pd.ptr.as_ptr(), raw.cast::<c_void>(), len, access)
        };
        match NonNull::new(mr) {
            Some(ptr) => Ok(RawMr {
                pd: pd.clone(),
                ptr,
                buf,
            }),
            None => {
                let e = last_errno();
                // SAFETY: not registered; give the Box back to be freed.
                drop(unsafe { Box::from_raw(raw) });
                Err(e)
            }
        }
    }

    /// `lkey`.
    pub fn lkey(&self) -> u32 {
        // SAFETY: live MR, field read.
        unsafe { (*self.ptr.as_ptr()).lkey }
    }

    /// `rkey` (the same STag as `lkey` on iWARP).
    pub fn rkey(&self) -> u32 {
        // SAFETY: live MR, field read.
        unsafe { (*self.ptr.as_ptr()).rkey }
    }

    /// The registered buffer's first byte, as the iova peers and SGEs use.
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr().cast::<u8>() as u64
    }

    /// The buffer's length, bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Always false: an MR is never empty.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The buffer, read-only.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: we own the buffer for our lifetime (see the contract on
        // concurrent device writes).
        unsafe { self.buf.as_ref() }
    }

    /// The buffer, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` excludes other Rust references.
        unsafe { self.buf.as_mut() }
    }

    /// Copies `out.len()` bytes from byte `off` of the buffer with a raw copy (no
    /// Rust reference to memory the device may be writing: a poll loop reading a
    /// byte an RDMA Write lands in sees each new value). False if out of range.
    pub fn copy_out(&self, off: usize, out: &mut [u8]) -> bool {
        if off
            .checked_add(out.len())
            .is_none_or(|end| end > self.buf.len())
        {
            return false;
        }
        // SAFETY: in range (checked); we own the buffer for our lifetime; `out` is a
        // distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.buf.as_ptr().cast::<u8>().add(off),
                out.as_mut_ptr(),
                out.len(),
            );
        }
        true
    }

    /// Copies `data` to byte `off` of the buffer with a raw copy. False if out of
    /// range.
    pub fn copy_in(&mut self, off: usize, data: &[u8]) -> bool {
        if off
            .checked_add(data.len())
            .is_none_or(|end| end > self.buf.len())
        {
            return false;
        }
        // SAFETY: in range (checked); `&mut self` excludes other Rust references; `data`
        // is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.buf.as_ptr().cast::<u8>().add(off),
                data.len(),
            );
        }
        true
    }

    /// The PD.
    pub fn pd(&self) -> &Arc<RawPd> {
        &self.pd
    }
}

impl Drop for RawMr {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered once.
        let rc = unsafe { (self.pd.ctx.core.ibv.ibv_dereg_mr)(self.ptr.as_ptr()) };
        if rc != 0 {
            // The device may still write the memory: leak it rather than free.
            tracing::warn!(rc, "ibv_dereg_mr failed; leaking the buffer");
            return;
        }
        // SAFETY: deregistered; the pointer came from Box::into_raw.
        drop(unsafe { Box::from_raw(self.buf.as_ptr()) });
    }
}

/// A completion event channel.
pub struct RawCompChannel {
    ctx: Arc<RawContext>,
    ptr: NonNull<IbvCompChannel>,
}

// SAFETY: see RawContext.
unsafe impl Send for RawCompChannel {}
// SAFETY: see RawContext.
unsafe impl Sync for RawCompChannel {}

impl RawCompChannel {
    /// `ibv_create_comp_channel(3)`.
    pub fn create(ctx: &Arc<RawContext>) -> Result<RawCompChannel, i32> {
        // SAFETY: live context.
        let p = unsafe { (ctx.core.ibv.ibv_create_comp_channel)(ctx.ptr.as_ptr()) };
        let ptr = NonNull::new(p).ok_or_else(last_errno)?;
        Ok(RawCompChannel {
            ctx: ctx.clone(),
            ptr,
        })
    }

    /// The channel's fd (readable when an event is pending).
    pub fn fd(&self) -> c_int {
        // SAFETY: live channel, field read.
        unsafe { (*self.ptr.as_ptr()).fd }
    }

    /// `ibv_get_cq_event(3)`: the address of the CQ that has an event
    /// (blocks unless the fd is non-blocking: then `EAGAIN`).
    pub fn get_cq_event(&self) -> Result<usize, i32> {
        let mut cq: *mut IbvCq = ptr::null_mut();
        let mut cq_ctx: *mut c_void = ptr::null_mut();
        // SAFETY: live channel, valid out pointers.
        let rc = unsafe {
            (self.ctx.core.ibv.ibv_get_cq_event)(self.ptr.as_ptr(), &mut cq, &mut cq_ctx)
        };
        ibv_result(rc).map(|()| cq as usize)
    }
}

impl Drop for RawCompChannel {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once; CQs hold Arcs to it.
        let rc = unsafe { (self.ctx.core.ibv.ibv_destroy_comp_channel)(self.ptr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_comp_channel failed");
        }
    }
}

/// A completion queue.
pub struct RawCq {
    ctx: Arc<RawContext>,
    _channel: Option<Arc<RawCompChannel>>,
    ptr: NonNull<IbvCq>,
    poll_cq: PollCqFn,
    req_notify_cq: ReqNotifyCqFn,
}

// SAFETY: see RawContext; providers lock their CQs.
unsafe impl Send for RawCq {}
// SAFETY: as above.
unsafe impl Sync for RawCq {}

impl RawCq {
    /// `ibv_create_cq(3)` with at least `cqe` entries, on `channel` if given.
    /// `EINVAL` if `channel` belongs to another context; `EOPNOTSUPP` if the
    /// provider lacks `poll_cq` / `req_notify_cq`.
    pub fn create(
        ctx: &Arc<RawContext>,
        cqe: c_int,
        channel: Option<&Arc<RawCompChannel>>,
    ) -> Result<RawCq, i32> {
        // SAFETY: live context, field reads of its ops table.
        let (poll_cq, req_notify_cq) = unsafe {
            let ops = &(*ctx.ptr.as_ptr()).ops;
            (ops.poll_cq, ops.req_notify_cq)
        };
        let (Some(poll_cq), Some(req_notify_cq)) = (poll_cq, req_notify_cq) else {
            return Err(libc::EOPNOTSUPP);
        };
        if channel.is_some_and(|c| c.ctx.ptr != ctx.ptr) {
            return Err(libc::EINVAL);
        }
        let ch = channel.map_or(ptr::null_mut(), |c| c.ptr.as_ptr());
        // SAFETY: live context; the channel (if any) belongs to it (checked
        // above) and is kept alive by the returned handle.
        let p =
            unsafe { (ctx.core.ibv.ibv_create_cq)(ctx.ptr.as_ptr(), cqe, ptr::null_mut(), ch, 0) };
        let ptr = NonNull::new(p).ok_or_else(last_errno)?;
        Ok(RawCq {
            ctx: ctx.clone(),
            _channel: channel.cloned(),
            ptr,
            poll_cq,
            req_notify_cq,
        })
    }

    /// The CQ's address (what [`RawCompChannel::get_cq_event`] returns).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The actual number of entries (`ibv_cq.cqe`).
    pub fn cqe(&self) -> c_int {
        // SAFETY: live CQ, field read.
        unsafe { (*self.ptr.as_ptr()).cqe }
    }

    /// `ibv_poll_cq(3)` into `out`: the number of completions written;
    /// `EIO` for a provider's `-1`, the errno of a `-errno` return.
    pub fn poll(&self, out: &mut [IbvWc]) -> Result<usize, i32> {
        let n = out.len().min(c_int::MAX as usize) as c_int;
        // SAFETY: live CQ; `out` has room for `n` ibv_wc.
        let rc = unsafe { (self.poll_cq)(self.ptr.as_ptr(), n, out.as_mut_ptr()) };
        // ibv_poll_cq(3): "a negative value" on failure. Providers return
        // -1 (no errno meant) or a negative errno; -1 reads as EIO, not EPERM.
        if rc < 0 {
            Err(if rc == -1 || rc == c_int::MIN {
                libc::EIO
            } else {
                -rc
            })
        } else {
            Ok(rc as usize)
        }
    }

    /// `ibv_req_notify_cq(3)`.
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), i32> {
        // SAFETY: live CQ.
        ibv_result(unsafe { (self.req_notify_cq)(self.ptr.as_ptr(), solicited_only as c_int) })
    }

    /// `ibv_ack_cq_events(3)`.
    pub fn ack_events(&self, n: u32) {
        // SAFETY: live CQ.
        unsafe { (self.ctx.core.ibv.ibv_ack_cq_events)(self.ptr.as_ptr(), n) }
    }
}

impl Drop for RawCq {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once; QPs hold Arcs to it.
        let rc = unsafe { (self.ctx.core.ibv.ibv_destroy_cq)(self.ptr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_cq failed");
        }
    }
}

/// A CM event channel.
pub struct RawCmChannel {
    core: Arc<RdmaCore>,
    ptr: NonNull<RdmaEventChannel>,
}

// SAFETY: librdmacm channels may be used from any thread.
unsafe impl Send for RawCmChannel {}
// SAFETY: as above.
unsafe impl Sync for RawCmChannel {}

impl RawCmChannel {
    /// `rdma_create_event_channel(3)` (`ENODEV` without `/dev/infiniband/rdma_cm`).
    pub fn create(core: &Arc<RdmaCore>) -> Result<RawCmChannel, i32> {
        // SAFETY: no arguments.
        let p = unsafe { (core.cm.rdma_create_event_channel)() };
        let ptr = NonNull::new(p).ok_or_else(last_errno)?;
        Ok(RawCmChannel {
            core: core.clone(),
            ptr,
        })
    }

    /// The channel's fd.
    pub fn fd(&self) -> c_int {
        // SAFETY: live channel, field read.
        unsafe { (*self.ptr.as_ptr()).fd }
    }

    /// `rdma_get_cm_event(3)` (blocks unless the fd is non-blocking).
    pub fn get_event(self: &Arc<Self>) -> Result<RawCmEvent, i32> {
        let mut ev: *mut RdmaCmEvent = ptr::null_mut();
        // SAFETY: live channel, valid out pointer.
        cm_result(unsafe { (self.core.cm.rdma_get_cm_event)(self.ptr.as_ptr(), &mut ev) })?;
        let ptr = NonNull::new(ev).ok_or(libc::EIO)?;
        Ok(RawCmEvent {
            chan: self.clone(),
            ptr,
            new_id_taken: AtomicBool::new(false),
        })
    }
}

impl Drop for RawCmChannel {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once; ids and events hold Arcs.
        unsafe { (self.core.cm.rdma_destroy_event_channel)(self.ptr.as_ptr()) }
    }
}

/// A CM event, acknowledged (`rdma_ack_cm_event`) on drop.
pub struct RawCmEvent {
    chan: Arc<RawCmChannel>,
    ptr: NonNull<RdmaCmEvent>,
    new_id_taken: AtomicBool,
}

// SAFETY: the event is plain data owned until acked.
unsafe impl Send for RawCmEvent {}
// SAFETY: as above.
unsafe impl Sync for RawCmEvent {}

impl RawCmEvent {
    fn ev(&self) -> &RdmaCmEvent {
        // SAFETY: the event lives until acked in drop.
        unsafe { self.ptr.as_ref() }
    }

    /// `event` (`enum rdma_cm_event_type`).
    pub fn event(&self) -> u32 {
        self.ev().event
    }

    /// `status`.
    pub fn status(&self) -> i32 {
        self.ev().status
    }

    /// `id` as an address.
    pub fn id_addr(&self) -> usize {
        self.ev().id as usize
    }

    /// `listen_id` as an address (null = 0).
    pub fn listen_id_addr(&self) -> usize {
        self.ev().listen_id as usize
    }

    /// `param.conn` (its `private_data` pointer nulled) and a copy of the
    /// private data it pointed at.
    pub fn conn_param(&self) -> (RdmaConnParam, Vec<u8>) {
        // SAFETY: connection events carry param.conn; for others the bytes
        // are zero or stale integers, still plain data.
        let mut c = unsafe { self.ev().param.conn };
        let private_data = if c.private_data.is_null() || c.private_data_len == 0 {
            Vec::new()
        } else {
            // SAFETY: librdmacm points at private_data_len bytes it owns
            // until the ack.
            unsafe {
                core::slice::from_raw_parts(
                    c.private_data.cast::<u8>(),
                    c.private_data_len as usize,
                )
            }
            .to_vec()
        };
        c.private_data = ptr::null();
        (c, private_data)
    }

    /// Takes ownership of the new id of a connect request (`event->id`,
    /// created by librdmacm for the caller). `None` after the first call.
    /// Only for `RDMA_CM_EVENT_CONNECT_REQUEST` (4): other events name ids
    /// someone else owns, so the call returns `None` for them.
    pub fn take_new_id(&self) -> Option<RawCmId> {
        if self.event() != 4 || self.new_id_taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        NonNull::new(self.ev().id).map(|ptr| RawCmId {
            chan: self.chan.clone(),
            ptr,
        })
    }
}

impl Drop for RawCmEvent {
    fn drop(&mut self) {
        // SAFETY: got from rdma_get_cm_event, acked once.
        let rc = unsafe { (self.chan.core.cm.rdma_ack_cm_event)(self.ptr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(errno = last_errno(), "rdma_ack_cm_event failed");
        }
    }
}

/// `param` with its `private_data` / `private_data_len` set from `data`
/// (at most 255 bytes: `private_data_len` is a `uint8_t`; `EINVAL` above).
fn with_private_data(mut param: RdmaConnParam, data: &[u8]) -> Result<RdmaConnParam, i32> {
    param.private_data_len = u8::try_from(data.len()).map_err(|_| libc::EINVAL)?;
    param.private_data = if data.is_empty() {
        ptr::null()
    } else {
        data.as_ptr().cast()
    };
    Ok(param)
}

/// An RDMA CM id.
pub struct RawCmId {
    chan: Arc<RawCmChannel>,
    ptr: NonNull<RdmaCmId>,
}

// SAFETY: librdmacm ids may be used from any thread; librdmacm locks.
unsafe impl Send for RawCmId {}
// SAFETY: as above.
unsafe impl Sync for RawCmId {}

impl RawCmId {
    /// `rdma_create_id(3)` on `chan` with port space `ps`.
    pub fn create(chan: &Arc<RawCmChannel>, ps: c_int) -> Result<RawCmId, i32> {
        let mut id: *mut RdmaCmId = ptr::null_mut();
        // SAFETY: live channel, valid out pointer.
        cm_result(unsafe {
            (chan.core.cm.rdma_create_id)(chan.ptr.as_ptr(), &mut id, ptr::null_mut(), ps)
        })?;
        let ptr = NonNull::new(id).ok_or(libc::EIO)?;
        Ok(RawCmId {
            chan: chan.clone(),
            ptr,
        })
    }

    fn cm(&self) -> &super::loader::Rdmacm {
        &self.chan.core.cm
    }

    /// The id's address (what events name).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The channel.
    pub fn channel(&self) -> &Arc<RawCmChannel> {
        &self.chan
    }

    /// `rdma_bind_addr(3)`.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<(), i32> {
        let mut s = sockaddr::to_storage(addr);
        // SAFETY: live id; `s` holds a sockaddr of its family.
        cm_result(unsafe {
            (self.cm().rdma_bind_addr)(
                self.ptr.as_ptr(),
                (&mut s as *mut libc::sockaddr_storage).cast(),
            )
        })
    }

    /// `rdma_resolve_addr(3)`.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout_ms: i32,
    ) -> Result<(), i32> {
        let mut s = src.map(sockaddr::to_storage);
        let mut d = sockaddr::to_storage(dst);
        let sp = s.as_mut().map_or(ptr::null_mut(), |s| {
            (s as *mut libc::sockaddr_storage).cast()
        });
        // SAFETY: live id; valid sockaddrs (or null src).
        cm_result(unsafe {
            (self.cm().rdma_resolve_addr)(
                self.ptr.as_ptr(),
                sp,
                (&mut d as *mut libc::sockaddr_storage).cast(),
                timeout_ms,
            )
        })
    }

    /// `rdma_resolve_route(3)`.
    pub fn resolve_route(&self, timeout_ms: i32) -> Result<(), i32> {
        // SAFETY: live id.
        cm_result(unsafe { (self.cm().rdma_resolve_route)(self.ptr.as_ptr(), timeout_ms) })
    }

    /// `rdma_listen(3)`.
    pub fn listen(&self, backlog: i32) -> Result<(), i32> {
        // SAFETY: live id.
        cm_result(unsafe { (self.cm().rdma_listen)(self.ptr.as_ptr(), backlog) })
    }

    /// `rdma_connect(3)` with `param` and `private_data`.
    pub fn connect(&self, param: RdmaConnParam, private_data: &[u8]) -> Result<(), i32> {
        let mut p = with_private_data(param, private_data)?;
        // SAFETY: live id; `p` points at private data that outlives the call
        // (librdmacm copies it).
        cm_result(unsafe { (self.cm().rdma_connect)(self.ptr.as_ptr(), &mut p) })
    }

    /// `rdma_accept(3)` with `param` and `private_data`.
    pub fn accept(&self, param: RdmaConnParam, private_data: &[u8]) -> Result<(), i32> {
        let mut p = with_private_data(param, private_data)?;
        // SAFETY: as in `connect`.
        cm_result(unsafe { (self.cm().rdma_accept)(self.ptr.as_ptr(), &mut p) })
    }

    /// `rdma_reject(3)` with private data (at most 255 bytes).
    pub fn reject(&self, private_data: &[u8]) -> Result<(), i32> {
        let len = u8::try_from(private_data.len()).map_err(|_| libc::EINVAL)?;
        let p = if len == 0 {
            ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: live id; `p` valid for `len` bytes during the call.
        cm_result(unsafe { (self.cm().rdma_reject)(self.ptr.as_ptr(), p, len) })
    }

    /// `rdma_disconnect(3)`.
    pub fn disconnect(&self) -> Result<(), i32> {
        // SAFETY: live id.
        cm_result(unsafe { (self.cm().rdma_disconnect)(self.ptr.as_ptr()) })
    }

    fn route_addr(&self) -> &RdmaAddr {
        // SAFETY: live id; librdmacm updates the route only inside calls on
        // this id or its events, which the safe layer serializes with reads.
        unsafe { &(*self.ptr.as_ptr()).route.addr }
    }

    /// The local address (`rdma_get_local_addr`: `route.addr.src_addr`).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        sockaddr::from_storage(&self.route_addr().src_addr)
    }

    /// The peer address (`rdma_get_peer_addr`: `route.addr.dst_addr`).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        sockaddr::from_storage(&self.route_addr().dst_addr)
    }

    /// True once the id is bound to a device (`verbs` not null).
    pub fn has_device(&self) -> bool {
        // SAFETY: live id, field read.
        unsafe { !(*self.ptr.as_ptr()).verbs.is_null() }
    }
}

impl Drop for RawCmId {
    fn drop(&mut self) {
        // SAFETY: created by us (or adopted from a connect request), destroyed
        // once. Every event naming this id holds an Arc to its safe wrapper,
        // so all are acked by now and rdma_destroy_id cannot wait forever.
        let rc = unsafe { (self.chan.core.cm.rdma_destroy_id)(self.ptr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(errno = last_errno(), "rdma_destroy_id failed");
        }
    }
}

/// The payload of one send WR for [`RawQp::post_send`].
#[derive(Debug, Clone, Copy)]
pub enum SendPayload<'a> {
    /// SGEs in registered memory (`lkey` checked by the device).
    Sges(&'a [IbvSge]),
    /// Inline bytes, copied by the provider during the call
    /// (`IBV_SEND_INLINE` is set).
    Inline(&'a [u8]),
}

/// `IBV_SEND_INLINE` (1 << 3).
pub const IBV_SEND_INLINE: u32 = 1 << 3;

/// A QP made by `rdma_create_qp` on a cm_id.
pub struct RawQp {
    id: Arc<RawCmId>,
    _pd: Arc<RawPd>,
    _send_cq: Arc<RawCq>,
    _recv_cq: Arc<RawCq>,
    ptr: NonNull<IbvQp>,
    post_send: PostSendFn,
    post_recv: PostRecvFn,
}

// SAFETY: providers lock their queues; see RawContext.
unsafe impl Send for RawQp {}
// SAFETY: as above.
unsafe impl Sync for RawQp {}

impl RawQp {
    /// `rdma_create_qp(3)` on `id` (an RC QP); returns the QP and the
    /// capabilities the provider granted. `EINVAL` unless the PD and both
    /// CQs are of the id's device context (uverbs handles are per context:
    /// a CQ of another context could alias one of this context's);
    /// `EOPNOTSUPP` if the provider lacks post calls.
    pub fn create(
        id: &Arc<RawCmId>,
        pd: &Arc<RawPd>,
        send_cq: &Arc<RawCq>,
        recv_cq: &Arc<RawCq>,
        cap: IbvQpCap,
        sq_sig_all: bool,
    ) -> Result<(RawQp, IbvQpCap), i32> {
        // SAFETY: live PD and context; field reads of the ops table.
        let (post_send, post_recv) = unsafe {
            let ops = &(*pd.ctx.ptr.as_ptr()).ops;
            (ops.post_send, ops.post_recv)
        };
        let (Some(post_send), Some(post_recv)) = (post_send, post_recv) else {
            return Err(libc::EOPNOTSUPP);
        };
        // SAFETY: live id, field read.
        let verbs = unsafe { (*id.ptr.as_ptr()).verbs };
        let ctx = pd.ctx.ptr.as_ptr();
        if verbs != ctx || send_cq.ctx.ptr.as_ptr() != ctx || recv_cq.ctx.ptr.as_ptr() != ctx {
            return Err(libc::EINVAL);
        }
        let mut attr = IbvQpInitAttr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.ptr.as_ptr(),
            recv_cq: recv_cq.ptr.as_ptr(),
            srq: ptr::null_mut(),
            cap,
            qp_type: IBV_QPT_RC,
            sq_sig_all: sq_sig_all as c_int,
        };
        // SAFETY: live id, PD and CQs, kept alive by the returned handle.
        cm_result(unsafe {
            (id.cm().rdma_create_qp)(id.ptr.as_ptr(), pd.ptr.as_ptr(), &mut attr)
        })?;
        // SAFETY: rdma_create_qp succeeded, so id->qp is set.
        let qp = unsafe { (*id.ptr.as_ptr()).qp };
        let ptr = NonNull::new(qp).ok_or(libc::EIO)?;
        Ok((
            RawQp {
                id: id.clone(),
                _pd: pd.clone(),
                _send_cq: send_cq.clone(),
                _recv_cq: recv_cq.clone(),
                ptr,
                post_send,
                post_recv,
            },
            attr.cap,
        ))
    }

    /// `qp_num`.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: live QP, field read.
        unsafe { (*self.ptr.as_ptr()).qp_num }
    }

    /// `ibv_post_send(3)` of one WR. The WR's `next`, `sg_list` and
    /// `num_sge` are set here from `payload`; `IBV_SEND_INLINE` in
    /// `send_flags` is set for [`SendPayload::Inline`] and cleared otherwise.
    pub fn post_send(&self, mut wr: IbvSendWr, payload: SendPayload<'_>) -> Result<(), i32> {
        let mut inline_sge;
        wr.next = ptr::null_mut();
        match payload {
            SendPayload::Sges(sges) => {
                wr.sg_list = sges.as_ptr().cast_mut();
                wr.num_sge = c_int::try_from(sges.len()).map_err(|_| libc::EINVAL)?;
                wr.send_flags &= !IBV_SEND_INLINE;
            }
            SendPayload::Inline(data) => {
                inline_sge = IbvSge {
                    addr: data.as_ptr() as u64,
                    length: u32::try_from(data.len()).map_err(|_| libc::EINVAL)?,
                    lkey: 0,
                };
                wr.sg_list = &mut inline_sge;
                wr.num_sge = if data.is_empty() { 0 } else { 1 };
                wr.send_flags |= IBV_SEND_INLINE;
            }
        }
        let mut bad: *mut IbvSendWr = ptr::null_mut();
        // SAFETY: live QP; `wr` is one WR (next = null) whose sg_list points
        // at `num_sge` SGEs valid for the call; with IBV_SEND_INLINE the one
        // SGE points at `data`, readable for its length; without it the
        // provider hands addresses to the device, which checks them against
        // the lkey's MR.
        ibv_result(unsafe { (self.post_send)(self.ptr.as_ptr(), &mut wr, &mut bad) })
    }

    /// `ibv_post_recv(3)` of one WR with `sges` (registered memory).
    pub fn post_recv(&self, wr_id: u64, sges: &[IbvSge]) -> Result<(), i32> {
        let mut wr = IbvRecvWr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: sges.as_ptr().cast_mut(),
            num_sge: c_int::try_from(sges.len()).map_err(|_| libc::EINVAL)?,
        };
        let mut bad: *mut IbvRecvWr = ptr::null_mut();
        // SAFETY: live QP; one WR whose SGEs are valid for the call; the
        // device checks addresses against the lkeys.
        ibv_result(unsafe { (self.post_recv)(self.ptr.as_ptr(), &mut wr, &mut bad) })
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        // SAFETY: created on this id by rdma_create_qp, destroyed once,
        // before the id (we hold an Arc to it).
        unsafe { (self.id.cm().rdma_destroy_qp)(self.id.ptr.as_ptr()) }
    }
}
