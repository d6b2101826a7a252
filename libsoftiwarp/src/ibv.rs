//! libibverbs entry points (rdma-core 44 names, symbol versions and errno rules) on an
//! open context: device and port queries, PDs, MRs, CQs and completion channels, QPs,
//! SRQs; and the strings and fork calls. Elsewhere: the device list and opening a
//! context ([`crate::context`]), the data path of the context's ops table
//! ([`crate::ops`]), asynchronous events ([`crate::events`]), the extended verbs
//! ([`crate::ex`]).
//!
//! Pointer rules: [`crate::boundary`]'s contract. Every entry point runs in
//! [`guard`]. Object handles are looked up among the live handles
//! ([`crate::handles`]) before use: NULL, destroyed, foreign or wrong-kind handles get
//! `EINVAL` (as errno, and as the return value of the calls that return an errno).

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cxgb4::ffi::types::{
    IbvCompChannel, IbvContext, IbvCq, IbvDeviceAttr, IbvGid, IbvMr, IbvPd, IbvPortAttr, IbvQp,
    IbvQpCap, IbvQpInitAttr,
};
use verbs::{AccessFlags, QpCap, QpState, WcStatus};

use crate::abi::*;
pub use crate::blocking::{ibv_get_async_event, ibv_get_cq_event};
use crate::boundary::{c_fn, guard, obj, obj_mut, set_errno, write_out, zeroed};
use crate::device::{Soft, NO_DEVICE};
use crate::events::{forget_async_events, soft_objects, SoftKind};
use crate::objects::{
    lock, CompChanObj, CompChanState, CompShared, CqObj, CqState, CtxObj, FdQueue, MrObj, MrState,
    Notify, PdObj, PdState, QpObj, QpState as QpObjState, QpUses, SrqObj, SrqState,
};

/// Handles of PDs, MRs, CQs and QPs (`->handle`), for the application's logs only.
static HANDLES: AtomicU32 = AtomicU32::new(1);

pub(crate) fn next_handle() -> u32 {
    HANDLES.fetch_add(1, Ordering::Relaxed)
}

/// Returns NULL with `errno` = `e`.
pub(crate) fn null_err<T>(e: c_int) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// Returns `e` (the errno-returning calls) and sets `errno` to it too.
pub(crate) fn err_ret(e: c_int) -> c_int {
    set_errno(e);
    e
}

/// -1 with `errno` = `e`.
fn minus_one(e: c_int) -> c_int {
    set_errno(e);
    -1
}

// ------------------------------------------------------------------ devices

/// The device of the context `c` (`ENODEV` if there is none: never for a context
/// made by this library).
pub(crate) fn dev_of(c: &CtxObj) -> Result<&'static Soft, c_int> {
    crate::device::get(c.s.dev).ok_or(NO_DEVICE)
}

/// The device behind a live `context` (else `EINVAL`).
fn ctx_soft(context: *const IbvContext) -> Result<&'static Soft, c_int> {
    Ok(ctx_obj(context)?.1)
}

/// The live context at `context` and its device (errors as [`ctx_soft`]).
pub(crate) fn ctx_obj(context: *const IbvContext) -> Result<(Arc<CtxObj>, &'static Soft), c_int> {
    let c = CtxObj::get(context).ok_or(libc::EINVAL)?;
    let s = dev_of(&c)?;
    Ok((c, s))
}

c_fn!("IBVERBS_1.1";
/// `ibv_query_device(3)`: the soft device's limits (`DeviceAttr::SOFT`).
pub unsafe extern "C" fn ibv_query_device(context: *mut IbvContext, attr: *mut IbvDeviceAttr) -> c_int {
    guard("ibv_query_device", libc::EIO, || {
        let s = match ctx_soft(context) {
            Ok(s) => s,
            Err(e) => return err_ret(e),
        };
        let d = device_attr(s);
        // SAFETY: contract 3.
        if !unsafe { write_out(attr, d) } {
            return err_ret(libc::EINVAL);
        }
        0
    })
});

/// The device attributes of `s` (`ibv_query_device`, and `orig_attr` of
/// `ibv_query_device_ex`): the soft device's limits (`DeviceAttr::SOFT`).
pub(crate) fn device_attr(s: &Soft) -> IbvDeviceAttr {
    let a = s.device.query_device();
    let mut d: IbvDeviceAttr = zeroed();
    crate::boundary::copy_cstr(&mut d.fw_ver, env!("CARGO_PKG_VERSION"));
    d.node_guid = s.guid();
    d.sys_image_guid = s.guid();
    d.max_mr_size = a.max_mr_size;
    d.page_size_cap = 4096;
    d.vendor_id = 0x626d74; // siw's vendor id ("bmt")
    d.vendor_part_id = 0;
    d.max_qp = 1 << 16;
    d.max_qp_wr = i32::try_from(a.max_qp_wr).unwrap_or(i32::MAX);
    d.max_sge = i32::try_from(a.max_sge).unwrap_or(i32::MAX);
    d.max_sge_rd = d.max_sge;
    d.max_cq = 1 << 16;
    d.max_cqe = i32::try_from(a.max_cqe).unwrap_or(i32::MAX);
    d.max_mr = 1 << 20;
    d.max_pd = 1 << 16;
    d.max_qp_rd_atom = i32::try_from(a.max_ord_ird).unwrap_or(i32::MAX);
    d.max_qp_init_rd_atom = d.max_qp_rd_atom;
    d.max_res_rd_atom = d.max_qp_rd_atom;
    // RFC 7306 Fetch-and-Add and Compare-and-Swap, executed under the target MR's
    // lock (on application memory one atomic instruction when the word is aligned).
    d.atomic_cap = IBV_ATOMIC_HCA;
    // max_srq, max_srq_wr, max_srq_sge (the last three of max_ee .. max_srq_sge).
    let soft = sw::DeviceAttr::SOFT;
    d._max_ee_to_max_srq_sge[11] = i32::try_from(soft.max_srq).unwrap_or(i32::MAX);
    d._max_ee_to_max_srq_sge[12] = i32::try_from(soft.max_srq_wr).unwrap_or(i32::MAX);
    d._max_ee_to_max_srq_sge[13] = i32::try_from(soft.max_srq_sge).unwrap_or(i32::MAX);
    d.max_pkeys = 1;
    d.phys_port_cnt = 1;
    d
}

/// The port attributes of the device's one port.
pub(crate) fn port_attr(s: &Soft) -> IbvPortAttr {
    let mut p: IbvPortAttr = zeroed();
    p.state = IBV_PORT_ACTIVE;
    p.max_mtu = ibv_mtu(s.mtu);
    p.active_mtu = ibv_mtu(s.mtu);
    p.gid_tbl_len = 1;
    p.max_msg_sz = u32::MAX;
    p.pkey_tbl_len = 1;
    p.active_width = 1;
    p.active_speed = 1;
    p.phys_state = 5; // LinkUp
    p.link_layer = IBV_LINK_LAYER_ETHERNET;
    p
}

c_fn!("IBVERBS_1.1";
/// `ibv_query_port(3)` (the exported call behind the header inline: it is given a
/// `struct _compat_ibv_port_attr`, so only the fields up to `flags` are written).
pub unsafe extern "C" fn ibv_query_port(context: *mut IbvContext, port_num: u8, attr: *mut IbvPortAttr) -> c_int {
    guard("ibv_query_port", libc::EIO, || {
        let s = match ctx_soft(context) {
            Ok(s) => s,
            Err(e) => return err_ret(e),
        };
        if port_num != 1 || attr.is_null() {
            return err_ret(libc::EINVAL);
        }
        let p = port_attr(s);
        let n = std::mem::offset_of!(IbvPortAttr, flags) + 1;
        // SAFETY: contract 3: `attr` is writable for the compat struct, which is
        // `IbvPortAttr` up to and including `flags`.
        unsafe { crate::boundary::write_prefix(attr, &p, n) };
        0
    })
});

/// The GID of index 0: the MAC in the first six bytes (siw's rule).
pub(crate) fn gid(s: &Soft) -> IbvGid {
    let mut g = IbvGid { raw: [0; 16] };
    g.raw[..6].copy_from_slice(&s.mac);
    g
}

c_fn!("IBVERBS_1.1";
/// `ibv_query_gid(3)`: index 0 only; -1 with `EINVAL` otherwise.
pub unsafe extern "C" fn ibv_query_gid(context: *mut IbvContext, port_num: u8, index: c_int, out: *mut IbvGid) -> c_int {
    guard("ibv_query_gid", -1, || {
        let s = match ctx_soft(context) {
            Ok(s) => s,
            Err(e) => {
                set_errno(e);
                return -1;
            }
        };
        // SAFETY: contract 3.
        if port_num != 1 || index != 0 || !unsafe { write_out(out, gid(s)) } {
            set_errno(libc::EINVAL);
            return -1;
        }
        0
    })
});

c_fn!("IBVERBS_1.11";
/// `ibv_query_gid_ex(3)` (what the header inline calls): index 0, type IB (0).
pub unsafe extern "C" fn _ibv_query_gid_ex(context: *mut IbvContext, port_num: u32, gid_index: u32, entry: *mut IbvGidEntry, _flags: u32, entry_size: usize) -> c_int {
    guard("ibv_query_gid_ex", libc::EIO, || {
        let s = match ctx_soft(context) {
            Ok(s) => s,
            Err(e) => return err_ret(e),
        };
        if port_num != 1 || gid_index != 0 || entry_size < std::mem::size_of::<IbvGidEntry>() {
            return err_ret(libc::EINVAL);
        }
        let e = gid_entry(s);
        // SAFETY: contract 3.
        if !unsafe { write_out(entry, e) } {
            return err_ret(libc::EINVAL);
        }
        0
    })
});

/// The GID table's one entry: index 0 of port 1, type IB (0).
pub(crate) fn gid_entry(s: &Soft) -> IbvGidEntry {
    IbvGidEntry {
        gid: gid(s),
        gid_index: 0,
        port_num: 1,
        gid_type: 0,
        ndev_ifindex: 0,
    }
}

c_fn!("IBVERBS_PRIVATE_34";
/// `ibv_query_gid_type` (private to rdma-core's tools; `ibv_devinfo` calls it): type
/// 0 (`IBV_GID_TYPE_SYSFS_IB_ROCE_V1`) for index 0.
pub unsafe extern "C" fn ibv_query_gid_type(context: *mut IbvContext, port_num: u8, index: c_uint, gid_type: *mut c_int) -> c_int {
    guard("ibv_query_gid_type", -1, || {
        // SAFETY: contract 3.
        if CtxObj::get(context).is_none() || port_num != 1 || index != 0 || !unsafe { write_out(gid_type, 0) } {
            set_errno(libc::EINVAL);
            return -1;
        }
        0
    })
});

c_fn!("IBVERBS_1.1";
/// `ibv_query_pkey(3)`: 0xffff at index 0.
pub unsafe extern "C" fn ibv_query_pkey(context: *mut IbvContext, port_num: u8, index: c_int, pkey: *mut u16) -> c_int {
    guard("ibv_query_pkey", -1, || {
        // SAFETY: contract 3.
        if CtxObj::get(context).is_none() || port_num != 1 || index != 0 || !unsafe { write_out(pkey, 0xffffu16.to_be()) } {
            set_errno(libc::EINVAL);
            return -1;
        }
        0
    })
});

// ------------------------------------------------------------------ PD, MR

c_fn!("IBVERBS_1.1";
/// `ibv_alloc_pd(3)`.
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut IbvContext) -> *mut IbvPd {
    guard("ibv_alloc_pd", std::ptr::null_mut(), || {
        alloc_pd(context).unwrap_or_else(null_err)
    })
});

/// A new published PD of the live `context`; `Err(errno)`.
fn alloc_pd(context: *mut IbvContext) -> Result<*mut IbvPd, c_int> {
    let (ctx, s) = ctx_obj(context)?;
    let pd = s.device.alloc_pd().map_err(|e| e.errno())?;
    let mut c: IbvPd = zeroed();
    c.context = context;
    c.handle = next_handle();
    Ok(PdObj::publish(&PdObj::new(c, PdState { pd, ctx })))
}

/// The default PD of device `s` on its context of CM ids (librdmacm's
/// `cma_dev->pd`, one per device, the `id->pd` of ids on it and the PD of
/// `rdma_create_qp(id, NULL, ...)`): allocated on first use and kept for the process
/// (librdmacm frees it with the device's last id); allocated again if the program
/// deallocated it.
pub(crate) fn default_pd(s: &Soft) -> Result<*mut IbvPd, c_int> {
    static PDS: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    let mut pds = lock(PDS.get_or_init(Default::default));
    if let Some(&pd) = pds.get(&s.index) {
        if PdObj::get(pd as *const IbvPd).is_some() {
            return Ok(pd as *mut IbvPd);
        }
    }
    let pd = alloc_pd(s.cm_ctx())?;
    pds.insert(s.index, pd as usize);
    Ok(pd)
}

c_fn!("IBVERBS_1.1";
/// `ibv_dealloc_pd(3)`: `EBUSY` while MRs or QPs use it, `EINVAL` if not a live PD.
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut IbvPd) -> c_int {
    guard("ibv_dealloc_pd", libc::EIO, || {
        match PdObj::destroy_with(pd, |p| p.s.pd.dealloc().map_err(|e| e.errno())) {
            Ok(()) => 0,
            Err(e) => err_ret(e),
        }
    })
});

/// Registers `[addr, addr + length)` of the application at `iova`.
fn reg_mr(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut IbvMr {
    let Some(p) = PdObj::get(pd) else {
        return null_err(libc::EINVAL);
    };
    let Ok(flags) = AccessFlags::for_mr(access & !IBV_ACCESS_OPTIONAL_RANGE) else {
        return null_err(libc::EINVAL);
    };
    // What the kernel's pinning checks: the pages are there, writable if the device
    // writes them (EFAULT otherwise).
    let writes = flags.intersects(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    if !crate::maps::is_mapped(addr as usize, length, writes) {
        return null_err(libc::EFAULT);
    }
    // SAFETY: ibv_reg_mr(3)'s rule, the contract of `UserMemory::new`: the buffer is
    // the application's and stays valid until ibv_dereg_mr, which deregisters the MR
    // (the device is done with the memory once the STag stops resolving).
    let Some(mem) = (unsafe { sw::resources::user_memory::UserMemory::new(addr.cast(), length) })
    else {
        return null_err(libc::EINVAL);
    };
    match p
        .s
        .pd
        .reg_user_mr(mem, iova, flags, sw::MrOptions::default())
    {
        Ok(mr) => {
            let mut c: IbvMr = zeroed();
            c.context = p.s.ctx.ptr();
            c.pd = pd;
            c.addr = addr;
            c.length = length;
            c.handle = next_handle();
            c.lkey = u32::from(mr.lkey());
            c.rkey = u32::from(mr.rkey());
            let ctx = p.s.ctx.clone();
            MrObj::publish(&MrObj::new(c, MrState { mr, ctx }))
        }
        Err(e) => null_err(e.errno()),
    }
}

c_fn!("IBVERBS_1.1";
/// `ibv_reg_mr(3)`: an MR over the application's own memory, iova = `addr`.
pub unsafe extern "C" fn ibv_reg_mr(pd: *mut IbvPd, addr: *mut c_void, length: usize, access: c_int) -> *mut IbvMr {
    guard("ibv_reg_mr", std::ptr::null_mut(), || {
        reg_mr(pd, addr, length, addr as u64, access as c_uint)
    })
});

c_fn!("IBVERBS_1.8";
/// `ibv_reg_mr_iova2(3)` (the header's `ibv_reg_mr` for non-constant access flags).
pub unsafe extern "C" fn ibv_reg_mr_iova2(pd: *mut IbvPd, addr: *mut c_void, length: usize, iova: u64, access: c_uint) -> *mut IbvMr {
    guard("ibv_reg_mr_iova2", std::ptr::null_mut(), || {
        reg_mr(pd, addr, length, iova, access)
    })
});

c_fn!("IBVERBS_1.7";
/// `ibv_reg_mr_iova(3)`.
pub unsafe extern "C" fn ibv_reg_mr_iova(pd: *mut IbvPd, addr: *mut c_void, length: usize, iova: u64, access: c_int) -> *mut IbvMr {
    guard("ibv_reg_mr_iova", std::ptr::null_mut(), || {
        reg_mr(pd, addr, length, iova, access as c_uint)
    })
});

c_fn!("IBVERBS_1.1";
/// `ibv_dereg_mr(3)`: `EINVAL` if not a live MR.
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut IbvMr) -> c_int {
    guard("ibv_dereg_mr", libc::EIO, || {
        match MrObj::destroy_with(mr, |m| m.s.mr.dereg().map_err(|e| e.errno())) {
            Ok(()) => 0,
            Err(e) => err_ret(e),
        }
    })
});

// ------------------------------------------------------------------ CQ, channel

c_fn!("IBVERBS_1.0";
/// `ibv_create_comp_channel(3)`: its fd is an eventfd, readable while an event waits.
pub unsafe extern "C" fn ibv_create_comp_channel(context: *mut IbvContext) -> *mut IbvCompChannel {
    guard("ibv_create_comp_channel", std::ptr::null_mut(), || {
        let ctx = match ctx_obj(context) {
            Ok((c, _)) => c,
            Err(e) => return null_err(e),
        };
        let fd = match crate::boundary::new_eventfd() {
            Ok(fd) => fd,
            Err(e) => return null_err(e),
        };
        let shared = Arc::new(CompShared {
            q: FdQueue::new(fd),
            cqs: AtomicUsize::new(0),
        });
        let mut c: IbvCompChannel = zeroed();
        c.context = context;
        c.fd = shared.q.raw_fd();
        let state = CompChanState {
            shared: Mutex::new(Some(shared)),
            ctx,
        };
        CompChanObj::publish(&CompChanObj::new(c, state))
    })
});

c_fn!("IBVERBS_1.0";
/// `ibv_destroy_comp_channel(3)`: `EBUSY` while a CQ uses it, `EINVAL` if not a live
/// channel (returned, as libibverbs does, and in `errno`).
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut IbvCompChannel) -> c_int {
    guard("ibv_destroy_comp_channel", libc::EIO, || {
        // Marked dying first, the CQ count checked after (`crate::handles`; the
        // other half is `ibv_create_cq`).
        let r = CompChanObj::destroy_with(channel, |ch| {
            let mut shared = lock(&ch.s.shared);
            if shared
                .as_ref()
                .is_some_and(|s| s.cqs.load(Ordering::SeqCst) > 0)
            {
                return Err(libc::EBUSY);
            }
            // Closes the fd (unless a blocked ibv_get_cq_event still holds it).
            drop(shared.take());
            Ok(())
        });
        match r {
            Ok(()) => 0,
            Err(e) => err_ret(e),
        }
    })
});

c_fn!("IBVERBS_1.1";
/// `ibv_create_cq(3)`: NULL with `EINVAL` for `cqe` below 1 or above the device's
/// `max_cqe`, a `comp_vector` outside `0..num_comp_vectors` (the context has 1), or a
/// channel that is not live.
pub unsafe extern "C" fn ibv_create_cq(context: *mut IbvContext, cqe: c_int, cq_context: *mut c_void, channel: *mut IbvCompChannel, comp_vector: c_int) -> *mut IbvCq {
    guard("ibv_create_cq", std::ptr::null_mut(), || {
        match new_cq(context, cqe, cq_context, channel, comp_vector, |_| {}) {
            Ok(p) => p.cast(),
            Err(e) => null_err(e),
        }
    })
});

/// Makes and publishes a CQ (`ibv_create_cq`, `ibv_create_cq_ex`): checks as
/// [`ibv_create_cq`]; `ex` fills the extended part of its C view before it is
/// published. `Err(errno)`.
pub(crate) fn new_cq(
    context: *mut IbvContext,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    comp_vector: c_int,
    ex: impl FnOnce(&mut IbvCqEx),
) -> Result<*mut IbvCqEx, c_int> {
    let (ctx, s) = ctx_obj(context)?;
    let n = match usize::try_from(cqe) {
        Ok(n) if n > 0 && n <= sw::DeviceAttr::SOFT.max_cqe => n,
        _ => return Err(libc::EINVAL),
    };
    let vectors = ctx.with_c(|c| c.num_comp_vectors);
    if !(0..vectors).contains(&comp_vector) {
        return Err(libc::EINVAL);
    }
    let chan = if channel.is_null() {
        None
    } else {
        Some(
            CompChanObj::get(channel)
                .and_then(|c| chan_use(&c))
                .ok_or(libc::EINVAL)?,
        )
    };
    let cq = match s.device.create_cq(cq_capacity(n)) {
        Ok(cq) => cq,
        Err(e) => {
            if let Some(chan) = chan {
                chan.cqs.fetch_sub(1, Ordering::SeqCst);
            }
            return Err(e.errno());
        }
    };
    let mut c: IbvCqEx = zeroed();
    c.cq.context = context;
    c.cq.channel = channel;
    c.cq.cq_context = cq_context;
    c.cq.handle = next_handle();
    c.cq.cqe = i32::try_from(cq.capacity()).unwrap_or(cqe);
    ex(&mut c);
    let soft_handle = cq.handle();
    let o = CqObj::new_cyclic(c, |addr| CqState {
        cq: Mutex::new(Some(Arc::new(cq))),
        notify: Mutex::new(chan.map(|chan| {
            Arc::new(Notify {
                armed: AtomicBool::new(false),
                chan,
                cq: addr,
            })
        })),
        events: AtomicU32::new(0),
        acked: AtomicU32::new(0),
        qps: AtomicUsize::new(0),
        cq_context: cq_context as usize,
        current: Mutex::new(None),
        ctx,
    });
    let dev = o.s.ctx.s.dev;
    soft_objects(|m| m.insert((dev, SoftKind::Cq, soft_handle), o.addr()));
    Ok(CqObj::publish(&o))
}

/// Counts a CQ about to be created on the channel `c`, before the CQ is made: its
/// shared state, or `None` (the count undone) if the channel is being destroyed or is
/// destroyed. Counted first, checked after (`SeqCst`); `ibv_destroy_comp_channel`
/// marks the channel dying first and checks the count after (`crate::handles`): never
/// both succeed.
fn chan_use(c: &CompChanObj) -> Option<Arc<CompShared>> {
    let sh = lock(&c.s.shared).clone()?;
    sh.cqs.fetch_add(1, Ordering::SeqCst);
    if c.is_dying() {
        sh.cqs.fetch_sub(1, Ordering::SeqCst);
        return None;
    }
    Some(sh)
}

/// The capacity given to a CQ asked for `cqe` entries: at least [`MIN_CQE`], rounded
/// up to a power of two, capped at the device's maximum (ibv_create_cq(3): "the CQ
/// will have at least cqe entries"; rdma-core's providers round up likewise, and
/// programs sized for them, such as perftest's one-entry latency CQs, rely on it).
fn cq_capacity(cqe: usize) -> usize {
    let max = sw::DeviceAttr::SOFT.max_cqe;
    cqe.max(MIN_CQE)
        .checked_next_power_of_two()
        .unwrap_or(max)
        .min(max)
        .max(cqe)
}

/// The smallest CQ made, entries.
pub const MIN_CQE: usize = 64;

c_fn!("IBVERBS_1.1";
/// `ibv_destroy_cq(3)`: `EBUSY` while a QP uses it (the flush of a QP destroyed just
/// before is waited for, up to 2 s), `EINVAL` if not a live CQ. Unlike libibverbs it
/// does not wait until the CQ's events taken by `ibv_get_cq_event` are acked (README,
/// "Misuse": nothing an event refers to is freed here).
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut IbvCq) -> c_int {
    guard("ibv_destroy_cq", libc::EIO, || {
        // Marked dying first, the QP count checked after (`crate::handles`; the
        // other half is `QpUses::acquire`).
        match CqObj::destroy_with(cq.cast(), destroy_cq_obj) {
            Ok(()) => 0,
            Err(e) => err_ret(e),
        }
    })
});

/// Destroys the soft side of the dying CQ `c`: `Err(EBUSY)` while a QP of ours uses
/// it, or while the engine has not flushed the QPs destroyed last (waited for up to
/// 2 s). The CQ stays live (and usable) until this returns.
fn destroy_cq_obj(c: &CqObj) -> Result<(), c_int> {
    if c.s.qps.load(Ordering::SeqCst) > 0 {
        return Err(libc::EBUSY);
    }
    let Some(soft_cq) = c.s.cq() else {
        return Err(libc::EINVAL);
    };
    destroy_when_flushed(|| soft_cq.destroy())?;
    if let Some(n) = lock(&c.s.notify).take() {
        n.retire();
        n.chan.cqs.fetch_sub(1, Ordering::SeqCst);
    }
    drop(lock(&c.s.cq).take());
    forget_async_events(&c.s.ctx, c.addr());
    soft_objects(|m| m.remove(&(c.s.ctx.s.dev, SoftKind::Cq, soft_cq.handle())));
    Ok(())
}

/// Runs `destroy` (a soft CQ's or SRQ's) until it is not `InUse`, for up to 2 s: a QP
/// destroyed just before still counts on it until the engine has flushed and removed
/// it. Its errno otherwise.
fn destroy_when_flushed(
    mut destroy: impl FnMut() -> Result<(), verbs::VerbsError>,
) -> Result<(), c_int> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match destroy() {
            Ok(()) => return Ok(()),
            Err(verbs::VerbsError::InUse { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e.errno()),
        }
    }
}

/// The non-blocking step of `ibv_get_cq_event(3)` (`src/blocking.c` loops on it;
/// [`crate::blocking`] has the contract): 0 with `*cq` and `*cq_context` written when
/// an armed CQ of the channel had a completion; -1 with `EINVAL` if not a live channel,
/// `EAGAIN` if none and the fd is `O_NONBLOCK`; otherwise [`crate::blocking::WAIT`]
/// with `*fd` an fd for the caller to block on and close.
///
/// # Safety
///
/// The pointer contract of [`crate::boundary`].
#[no_mangle]
pub unsafe extern "C" fn swi_get_cq_event_try(
    channel: *mut IbvCompChannel,
    cq: *mut *mut IbvCq,
    cq_context: *mut *mut c_void,
    fd: *mut c_int,
) -> c_int {
    guard("ibv_get_cq_event", -1, || {
        // Our own reference while this step runs; the wait is on a dup of the fd, so
        // a destroy of the channel meanwhile closes nothing under the caller.
        let Some(sh) = CompChanObj::get(channel).and_then(|ch| lock(&ch.s.shared).clone()) else {
            return minus_one(libc::EINVAL);
        };
        while let Some(p) = sh.q.pop() {
            // A CQ destroyed meanwhile has no event (destroy removes them; this is
            // the race with that removal).
            let Some(co) = CqObj::get(p as *const IbvCqEx) else {
                continue;
            };
            co.s.events.fetch_add(1, Ordering::Relaxed);
            // SAFETY: contract 3.
            unsafe {
                write_out(cq, co.ptr().cast());
                write_out(cq_context, co.s.cq_context as *mut c_void);
            }
            return 0;
        }
        crate::blocking::wait_on(sh.q.raw_fd(), fd)
    })
}

c_fn!("IBVERBS_1.1";
/// `ibv_ack_cq_events(3)` (nothing for a handle that is not a live CQ).
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut IbvCq, nevents: c_uint) {
    guard("ibv_ack_cq_events", (), || {
        if let Some(c) = CqObj::get(cq.cast()) {
            c.s.acked.fetch_add(nevents, Ordering::Relaxed);
        }
    })
});

// ------------------------------------------------------------------ QP

/// The smallest send and receive queue made, WRs.
pub const MIN_QP_WR: u32 = 16;

/// The least inline data a QP takes, bytes: kernel siw grants every QP
/// `SIW_MAX_INLINE` (80) whatever was asked, and programs rely on it (librdmacm's
/// `rdma_xclient` sends 16 bytes inline from a QP made with `max_inline_data` 0).
pub const MIN_INLINE: u32 = 80;

/// The soft capabilities of C ones, the queue depths at least [`MIN_QP_WR`]
/// (ibv_create_qp(3): "the actual capacity may be greater"; providers round up, and
/// programs sized for them rely on it: perftest's `-e` latency tests post their next
/// Send on a one-WR queue before the previous completion was seen), the inline data at
/// least [`MIN_INLINE`] bytes.
pub fn cap_of(c: &IbvQpCap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr.max(MIN_QP_WR),
        max_recv_wr: c.max_recv_wr.max(MIN_QP_WR),
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data.max(MIN_INLINE),
    }
}

/// The C capabilities of soft ones.
pub fn cap_to_c(c: &QpCap) -> IbvQpCap {
    IbvQpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// The new published `struct ibv_qp` of `qp`, on the PD and CQs of `uses`, from
/// `attr` (capabilities written back into `attr`).
pub(crate) fn qp_obj(
    qp: Arc<sw::Qp>,
    attr: &mut IbvQpInitAttr,
    id: Option<rdma_cm::CmIdRef<sw::cm::rdmacm::SoftDevice>>,
    uses: QpUses,
) -> *mut IbvQp {
    qp_obj_ex(qp, attr, id, uses, 0, |_| {})
}

/// [`qp_obj`] for a QP of `ibv_create_qp_ex` with `send_ops` (its `send_ops_flags`):
/// `ex` fills the extended part of its C view (the `wr_*` pointers) before it is
/// published. The C view's `state` is Init for a QP of the RDMA CM (librdmacm moves it
/// there) and Reset otherwise, as libibverbs writes it at creation, whatever the soft
/// QP's own state (siw's: Init; `ibv_query_qp` reports that one).
pub(crate) fn qp_obj_ex(
    qp: Arc<sw::Qp>,
    attr: &mut IbvQpInitAttr,
    id: Option<rdma_cm::CmIdRef<sw::cm::rdmacm::SoftDevice>>,
    uses: QpUses,
    send_ops: u64,
    ex: impl FnOnce(&mut IbvQpEx),
) -> *mut IbvQp {
    let cap = qp.query_qp().cap;
    attr.cap = cap_to_c(&cap);
    let pd = &uses.pd;
    let mut x: IbvQpEx = zeroed();
    let c = &mut x.qp_base;
    c.context = pd.s.ctx.ptr();
    c.qp_context = attr.qp_context;
    c.pd = pd.ptr();
    c.send_cq = uses.cqs[0].ptr().cast();
    c.recv_cq = uses.cqs[1].ptr().cast();
    c.srq = uses
        .srq
        .as_ref()
        .map_or(std::ptr::null_mut(), |o| o.ptr().cast());
    c.handle = next_handle();
    c.qp_num = qp.qp_num();
    c.state = if id.is_some() {
        IBV_QPS_INIT
    } else {
        IBV_QPS_RESET
    };
    c.qp_type = cxgb4::ffi::types::IBV_QPT_RC;
    ex(&mut x);
    let qpn = qp.qp_num();
    let ctx = pd.s.ctx.clone();
    let dev = ctx.s.dev;
    let o = QpObj::new(
        x,
        QpObjState {
            qp: Mutex::new(Some(qp)),
            id: Mutex::new(id),
            cap,
            uses: Mutex::new(Some(uses)),
            batch: Mutex::new(None),
            send_ops,
            ctx,
        },
    );
    soft_objects(|m| m.insert((dev, SoftKind::Qp, qpn), o.addr()));
    QpObj::publish(&o).cast()
}

/// The live QP number `qpn` of the `dev`th device (`rdma_connect` / `rdma_accept` name
/// one by `conn_param->qp_num`, as the kernel's `iw_cm` looks it up on the device).
pub(crate) fn qp_by_num(dev: usize, qpn: u32) -> Option<Arc<QpObj>> {
    let addr = soft_objects(|m| m.get(&(dev, SoftKind::Qp, qpn)).copied())?;
    QpObj::get(addr as *const crate::abi::IbvQpEx)
}

/// Refuses a QP type other than RC with `EOPNOTSUPP` (kernel siw's errno for any other
/// type, and the verbs man pages' "not supported by the device"), after one warning
/// line per kind (`libsoftiwarp: iWARP has no UD: ...`).
pub(crate) fn refuse_qp_type(call: &'static str, qp_type: c_int) -> Result<(), c_int> {
    let what = match qp_type {
        cxgb4::ffi::types::IBV_QPT_RC => return Ok(()),
        IBV_QPT_UD => "iWARP has no UD",
        IBV_QPT_UC => "iWARP has no UC",
        IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => "iWARP has no XRC",
        _ => "iWARP has no such QP type",
    };
    crate::stubs::warn_once(
        what,
        &format!("{call} refused: iWARP QPs are reliable connected (IBV_QPT_RC) only"),
    );
    Err(libc::EOPNOTSUPP)
}

c_fn!("IBVERBS_1.1";
/// `ibv_create_qp(3)`: an RC QP in Init, as kernel siw's (receives can be posted at
/// once; its C view's `state` says Reset, as libibverbs writes it), not bound to a
/// connection: `rdma_connect` / `rdma_accept` connect it when they name it by
/// `conn_param->qp_num`. With `init_attr.srq` it takes its receive WRs from that SRQ
/// (its `max_recv_wr` / `max_recv_sge` are ignored and reported 0, and `ibv_post_recv`
/// on it is `EINVAL`). Other QP types fail with `EOPNOTSUPP` after one warning line.
pub unsafe extern "C" fn ibv_create_qp(pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> *mut IbvQp {
    guard("ibv_create_qp", std::ptr::null_mut(), || {
        // SAFETY: contract 3: NULL or the application's attributes, ours for the call.
        let (Some(p), Some(a)) = (PdObj::get(pd), unsafe { obj_mut(attr) }) else {
            return null_err(libc::EINVAL);
        };
        if let Err(e) = refuse_qp_type("ibv_create_qp", a.qp_type) {
            return null_err(e);
        }
        let s = match dev_of(&p.s.ctx) {
            Ok(s) => s,
            Err(e) => return null_err(e),
        };
        match new_soft_qp(s, &p, a) {
            Ok((qp, uses)) => qp_obj(qp, a, None, uses),
            Err(e) => null_err(e),
        }
    })
});

/// A soft QP of `attr` on the PD `p` of device `s`, not bound to a connection, moved to
/// Init as siw's QPs start (`ibv_query_qp` then says Init, rdma-core commit 698f2ae80),
/// and its uses; `Err(errno)` (`EINVAL` for dead or foreign CQs or SRQ).
pub(crate) fn new_soft_qp(
    s: &Soft,
    p: &Arc<PdObj>,
    attr: &IbvQpInitAttr,
) -> Result<(Arc<sw::Qp>, QpUses), c_int> {
    let parts = qp_parts(attr, p).ok_or(libc::EINVAL)?;
    let init = parts.init();
    let made = match init.srq {
        Some(srq) => s.device.create_qp_with_srq(&p.s.pd, init.attr, srq),
        None => s.device.create_qp(&p.s.pd, init.attr),
    };
    // On error `parts` is dropped: the CQs are free of it again.
    let qp = made.map_err(|e| e.errno())?;
    if let Err(e) = qp.modify_state(QpState::Init) {
        let _ = qp.destroy();
        return Err(e.errno());
    }
    Ok((Arc::new(qp), parts.uses))
}

/// What a QP is made of: its CQs, PD and SRQ counted as used ([`QpUses`]), their soft
/// objects, and the soft attributes of the C ones.
pub(crate) struct QpParts {
    /// The C-level counts (dropped if the creation fails).
    pub uses: QpUses,
    scq: Arc<sw::Cq>,
    rcq: Arc<sw::Cq>,
    srq: Option<Arc<sw::Srq>>,
    cap: QpCap,
    sq_sig_all: bool,
}

impl QpParts {
    /// The soft attributes (with the SRQ, if any) to create the QP with.
    pub fn init(&self) -> sw::cm::rdmacm::CmQpInit<'_> {
        sw::cm::rdmacm::CmQpInit {
            attr: sw::QpInitAttr {
                send_cq: &self.scq,
                recv_cq: &self.rcq,
                cap: self.cap,
                sq_sig_all: self.sq_sig_all,
            },
            srq: self.srq.as_deref(),
        }
    }
}

/// The live CQs (and SRQ, if `attr.srq` is set) of `attr`, counted as used by a QP
/// about to be made on `pd` ([`QpUses::acquire`]), with their soft objects; `None` if
/// a CQ is being destroyed, or a CQ or the SRQ is not live or of another device than
/// the PD (the soft device refuses a QP on a destroyed SRQ itself).
pub(crate) fn qp_parts(attr: &IbvQpInitAttr, pd: &Arc<PdObj>) -> Option<QpParts> {
    let dev = pd.s.ctx.s.dev;
    let srq_obj = if attr.srq.is_null() {
        None
    } else {
        Some(SrqObj::get(attr.srq.cast::<IbvSrq>()).filter(|o| o.s.ctx.s.dev == dev)?)
    };
    let srq = match &srq_obj {
        Some(o) => Some(o.s.srq()?),
        None => None,
    };
    let scq = CqObj::get(attr.send_cq.cast()).filter(|c| c.s.ctx.s.dev == dev)?;
    let rcq = CqObj::get(attr.recv_cq.cast()).filter(|c| c.s.ctx.s.dev == dev)?;
    let (s, r) = (scq.s.cq()?, rcq.s.cq()?);
    let mut uses = QpUses::acquire(scq, rcq, pd.clone())?;
    if let Some(o) = srq_obj {
        if !uses.use_srq(o) {
            return None;
        }
    }
    Some(QpParts {
        uses,
        scq: s,
        rcq: r,
        srq,
        cap: cap_of(&attr.cap),
        sq_sig_all: attr.sq_sig_all != 0,
    })
}

/// The soft state of a C `enum ibv_qp_state`.
fn qp_state(s: c_int) -> Option<QpState> {
    QpState::ALL.iter().copied().find(|q| *q as c_int == s)
}

c_fn!("IBVERBS_1.1";
/// `ibv_modify_qp(3)`: the state (`IBV_QP_STATE`); on a QP of the RDMA CM only the move
/// to Error is honoured (the CM drives the others on iWARP); other attributes are
/// accepted and ignored. A QP from `ibv_create_qp` follows kernel siw, whose QP states
/// the CM drives too: to Init or RTR is a no-op from Init, RTR, RTS or SQD (an
/// unconnected siw QP stays idle; a connected one ignores it), so librdmacm's
/// `rdma_init_qp_attr` sequence (rping `-q`) works before and after the connect; to RTS
/// without a connection is `EINVAL`; to Error flushes every WR and aborts the
/// connection. `EINVAL` if not a live QP.
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, attr_mask: c_int) -> c_int {
    guard("ibv_modify_qp", libc::EIO, || {
        // SAFETY: contract 3.
        let (Some(q), Some(a)) = (QpObj::get(qp.cast()), unsafe { obj(attr) }) else {
            return err_ret(libc::EINVAL);
        };
        let Some(soft_qp) = q.s.qp() else {
            return err_ret(libc::EINVAL);
        };
        if attr_mask & IBV_QP_STATE == 0 {
            return 0;
        }
        let Some(to) = qp_state(a.qp_state) else {
            return err_ret(libc::EINVAL);
        };
        let cm_qp = lock(&q.s.id).is_some();
        let no_op = (cm_qp && to != QpState::Error)
            || (matches!(to, QpState::Init | QpState::Rtr)
                && matches!(
                    soft_qp.state(),
                    QpState::Init | QpState::Rtr | QpState::Rts | QpState::Sqd
                ));
        if !no_op {
            if let Err(e) = soft_qp.modify_state(to) {
                return err_ret(e.errno());
            }
        }
        // libibverbs' `ibv_modify_qp` records the new state in the C view (pyverbs
        // reads it there).
        let _c = lock(&q.s.batch);
        q.update_c(|c| c.qp_base.state = a.qp_state);
        0
    })
});

c_fn!("IBVERBS_1.1";
/// `ibv_query_qp(3)`: state, capabilities, ORD/IRD, access flags; `EINVAL` if not a
/// live QP.
pub unsafe extern "C" fn ibv_query_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, _attr_mask: c_int, init_attr: *mut IbvQpInitAttr) -> c_int {
    guard("ibv_query_qp", libc::EIO, || {
        let Some(q) = QpObj::get(qp.cast()) else {
            return err_ret(libc::EINVAL);
        };
        let Some(soft_qp) = q.s.qp() else {
            return err_ret(libc::EINVAL);
        };
        let qa = soft_qp.query_qp();
        let mut a: IbvQpAttr = zeroed();
        a.qp_state = qa.state as c_int;
        a.cur_qp_state = a.qp_state;
        a.path_mtu = dev_of(&q.s.ctx).map_or(3, |s| ibv_mtu(s.mtu));
        a.qp_access_flags = qa.access.to_ibv();
        a.cap = cap_to_c(&qa.cap);
        a.max_rd_atomic = u8::try_from(qa.ord).unwrap_or(u8::MAX);
        a.max_dest_rd_atomic = u8::try_from(qa.ird).unwrap_or(u8::MAX);
        a.port_num = 1;
        let mut i: IbvQpInitAttr = zeroed_init();
        {
            let _c = lock(&q.s.batch);
            q.with_c(|c| {
                i.qp_context = c.qp_base.qp_context;
                i.send_cq = c.qp_base.send_cq;
                i.recv_cq = c.qp_base.recv_cq;
                i.srq = c.qp_base.srq;
            });
        }
        i.cap = a.cap;
        i.qp_type = cxgb4::ffi::types::IBV_QPT_RC;
        i.sq_sig_all = c_int::from(qa.sq_sig_all);
        // SAFETY: contract 3.
        unsafe {
            write_out(attr, a);
            write_out(init_attr, i);
        }
        0
    })
});

fn zeroed_init() -> IbvQpInitAttr {
    IbvQpInitAttr {
        qp_context: std::ptr::null_mut(),
        send_cq: std::ptr::null_mut(),
        recv_cq: std::ptr::null_mut(),
        srq: std::ptr::null_mut(),
        cap: IbvQpCap::default(),
        qp_type: 0,
        sq_sig_all: 0,
    }
}

/// Destroys the QP object `q`, already taken out of the live handles (both
/// `ibv_destroy_qp` and `rdma_destroy_qp`): the CM's hold first (its id moves the QP to
/// Error), then ours, waiting for the flush when ours is the last handle; then its CQs
/// and PD are free of it, and its struct goes to the graveyard.
pub(crate) fn destroy_qp_obj(q: Arc<QpObj>) -> c_int {
    if let Some(id) = lock(&q.s.id).take() {
        id.destroy_qp();
    }
    let qp = lock(&q.s.qp).take();
    let r = match qp.map(Arc::try_unwrap) {
        Some(Ok(qp)) => {
            let qpn = qp.qp_num();
            soft_objects(|m| m.remove(&(q.s.ctx.s.dev, SoftKind::Qp, qpn)));
            match qp.destroy() {
                Ok(()) => 0,
                Err(e) => e.errno(),
            }
        }
        Some(Err(shared)) => {
            soft_objects(|m| m.remove(&(q.s.ctx.s.dev, SoftKind::Qp, shared.qp_num())));
            let _ = shared.modify_state(QpState::Error);
            0
        }
        None => 0,
    };
    drop(lock(&q.s.uses).take());
    forget_async_events(&q.s.ctx, q.addr());
    QpObj::bury(q);
    r
}

c_fn!("IBVERBS_1.1";
/// `ibv_destroy_qp(3)` (rping destroys its CM-made QP this way, even after its id);
/// `EINVAL` if not a live QP.
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut IbvQp) -> c_int {
    guard("ibv_destroy_qp", libc::EIO, || {
        let Some(q) = QpObj::take(qp.cast()) else {
            return err_ret(libc::EINVAL);
        };
        let r = destroy_qp_obj(q);
        if r != 0 {
            set_errno(r);
        }
        r
    })
});

// ------------------------------------------------------------------ SRQ

c_fn!("IBVERBS_1.1";
/// `ibv_create_srq(3)`: a shared receive queue on `pd`. The granted `max_wr` (the
/// request rounded up to a power of two, as siw) and `max_sge` are written back into
/// `srq_init_attr->attr`; a non-zero `srq_limit` arms the limit. NULL with `EINVAL`
/// for a dead PD or `max_wr` / `max_sge` beyond the device's (`max_srq_wr`,
/// `max_srq_sge`) or `srq_limit` above `max_wr`, `ENOMEM` beyond `max_srq` SRQs.
pub unsafe extern "C" fn ibv_create_srq(pd: *mut IbvPd, srq_init_attr: *mut IbvSrqInitAttr) -> *mut IbvSrq {
    guard("ibv_create_srq", std::ptr::null_mut(), || {
        // SAFETY: contract 3: NULL or the application's attributes, ours for the call.
        let (Some(p), Some(a)) = (PdObj::get(pd), unsafe { obj_mut(srq_init_attr) }) else {
            return null_err(libc::EINVAL);
        };
        let s = match dev_of(&p.s.ctx) {
            Ok(s) => s,
            Err(e) => return null_err(e),
        };
        let want = verbs::SrqInitAttr {
            max_wr: a.attr.max_wr,
            max_sge: a.attr.max_sge,
            srq_limit: a.attr.srq_limit,
        };
        let srq = match s.device.create_srq(&p.s.pd, want) {
            Ok(srq) => srq,
            Err(e) => return null_err(e.errno()),
        };
        let got = match srq.query() {
            Ok(g) => g,
            Err(e) => {
                let _ = srq.destroy();
                return null_err(e.errno());
            }
        };
        a.attr = srq_attr_to_c(&got);
        let mut c: IbvSrq = zeroed();
        c.context = p.s.ctx.ptr();
        c.srq_context = a.srq_context;
        c.pd = pd;
        c.handle = next_handle();
        let soft_handle = srq.handle();
        let o = SrqObj::new(
            c,
            SrqState {
                srq: Mutex::new(Some(Arc::new(srq))),
                max_sge: got.max_sge,
                max_wr: got.max_wr,
                qps: AtomicUsize::new(0),
                pd: p.clone(),
                ctx: p.s.ctx.clone(),
            },
        );
        let dev = o.s.ctx.s.dev;
        soft_objects(|m| m.insert((dev, SoftKind::Srq, soft_handle), o.addr()));
        SrqObj::publish(&o)
    })
});

/// The C attributes of soft ones.
fn srq_attr_to_c(a: &verbs::SrqAttr) -> IbvSrqAttr {
    IbvSrqAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

c_fn!("IBVERBS_1.1";
/// `ibv_modify_srq(3)`: `IBV_SRQ_LIMIT` arms the limit with `srq_limit` (0 disarms;
/// `SRQ_LIMIT_REACHED` comes once, then the limit reads 0 until armed again);
/// `IBV_SRQ_MAX_WR` is `EOPNOTSUPP` (no resize, as siw); `EINVAL` for a dead SRQ,
/// a limit above `max_wr`, or other mask bits. Returns the errno.
pub unsafe extern "C" fn ibv_modify_srq(srq: *mut IbvSrq, srq_attr: *mut IbvSrqAttr, srq_attr_mask: c_int) -> c_int {
    guard("ibv_modify_srq", libc::EIO, || {
        // SAFETY: contract 3.
        let (Some(o), Some(a)) = (SrqObj::get(srq), unsafe { obj(srq_attr) }) else {
            return err_ret(libc::EINVAL);
        };
        let Some(soft) = o.s.srq() else {
            return err_ret(libc::EINVAL);
        };
        if srq_attr_mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
            return err_ret(libc::EINVAL);
        }
        let mut mask = verbs::SrqAttrMask::empty();
        if srq_attr_mask & IBV_SRQ_MAX_WR != 0 {
            mask |= verbs::SrqAttrMask::MAX_WR;
        }
        if srq_attr_mask & IBV_SRQ_LIMIT != 0 {
            mask |= verbs::SrqAttrMask::LIMIT;
        }
        let attr = verbs::SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        };
        match soft.modify(&attr, mask) {
            Ok(()) => 0,
            Err(e) => err_ret(e.errno()),
        }
    })
});

c_fn!("IBVERBS_1.1";
/// `ibv_query_srq(3)`: the granted `max_wr`, `max_sge` and the limit (0: not, or no
/// longer, armed). Returns the errno (`EINVAL` for a dead SRQ).
pub unsafe extern "C" fn ibv_query_srq(srq: *mut IbvSrq, srq_attr: *mut IbvSrqAttr) -> c_int {
    guard("ibv_query_srq", libc::EIO, || {
        let Some(soft) = SrqObj::get(srq).and_then(|o| o.s.srq()) else {
            return err_ret(libc::EINVAL);
        };
        match soft.query() {
            // SAFETY: contract 3.
            Ok(a) if unsafe { write_out(srq_attr, srq_attr_to_c(&a)) } => 0,
            Ok(_) => err_ret(libc::EINVAL),
            Err(e) => err_ret(e.errno()),
        }
    })
});

c_fn!("IBVERBS_1.1";
/// `ibv_destroy_srq(3)`: `EBUSY` while a QP uses it (the kernel's rule; the flush of
/// a QP destroyed just before is waited for, up to 2 s), `EINVAL` if not a live SRQ. The WRs still in it are discarded, never completed (as rdma-core's
/// providers do). Returns the errno.
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut IbvSrq) -> c_int {
    guard("ibv_destroy_srq", libc::EIO, || {
        // Marked dying first, the QP count checked after (the other half is
        // `QpUses::use_srq`).
        let r = SrqObj::destroy_with(srq, |o| {
            if o.s.qps.load(Ordering::SeqCst) > 0 {
                return Err(libc::EBUSY);
            }
            let soft = o.s.srq().ok_or(libc::EINVAL)?;
            destroy_when_flushed(|| soft.destroy())?;
            drop(lock(&o.s.srq).take());
            forget_async_events(&o.s.ctx, o.addr());
            soft_objects(|m| m.remove(&(o.s.ctx.s.dev, SoftKind::Srq, soft.handle())));
            Ok(())
        });
        match r {
            Ok(()) => 0,
            Err(e) => err_ret(e),
        }
    })
});

// ------------------------------------------------------------------ strings, fork

/// NUL-terminated copies of `names`, made once.
fn c_strings(cell: &'static OnceLock<Vec<CString>>, names: &[&str]) -> &'static [CString] {
    cell.get_or_init(|| {
        names
            .iter()
            .map(|n| CString::new(*n).unwrap_or_default())
            .collect()
    })
}

static WC_STATUS: OnceLock<Vec<CString>> = OnceLock::new();
static NODE_TYPE: OnceLock<Vec<CString>> = OnceLock::new();
static PORT_STATE: OnceLock<Vec<CString>> = OnceLock::new();
static EVENT_TYPE: OnceLock<Vec<CString>> = OnceLock::new();

c_fn!("IBVERBS_1.1";
/// `ibv_wc_status_str(3)`: libibverbs' strings; "unknown" out of range.
pub unsafe extern "C" fn ibv_wc_status_str(status: c_uint) -> *const c_char {
    let mut names: Vec<&str> = WcStatus::ALL.iter().map(|s| s.as_str()).collect();
    names.push("unknown");
    let t = c_strings(&WC_STATUS, &names);
    let i = (status as usize).min(t.len() - 1);
    t[i].as_ptr()
});

c_fn!("IBVERBS_1.1";
/// `ibv_node_type_str(3)`.
pub unsafe extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    let t = c_strings(&NODE_TYPE, &["unknown", "InfiniBand channel adapter", "InfiniBand switch", "InfiniBand router", "iWARP NIC", "usNIC", "usNIC UDP", "unspecified"]);
    let i = usize::try_from(node_type.saturating_add(1)).unwrap_or(0);
    t[if i < t.len() { i } else { 0 }].as_ptr()
});

c_fn!("IBVERBS_1.1";
/// `ibv_port_state_str(3)`.
pub unsafe extern "C" fn ibv_port_state_str(port_state: c_int) -> *const c_char {
    let t = c_strings(&PORT_STATE, &["no state change (NOP)", "down", "init", "armed", "active", "active defer", "unknown"]);
    let i = usize::try_from(port_state).unwrap_or(usize::MAX).min(t.len() - 1);
    t[i].as_ptr()
});

c_fn!("IBVERBS_1.1";
/// `ibv_event_type_str(3)`.
pub unsafe extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    let t = c_strings(&EVENT_TYPE, &["CQ error", "local work queue catastrophic error", "invalid request local work queue error", "local access violation work queue error", "communication established", "send queue drained", "path migrated", "path migration request error", "local catastrophic error", "port active", "port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error", "SRQ limit reached", "last WQE reached", "client reregistration", "GID table change", "WQ fatal", "unknown"]);
    let i = usize::try_from(event).unwrap_or(usize::MAX).min(t.len() - 1);
    t[i].as_ptr()
});

c_fn!("IBVERBS_1.1";
/// `ibv_fork_init(3)`: nothing to do (no pinned pages: the device copies), 0.
pub unsafe extern "C" fn ibv_fork_init() -> c_int { 0 });

c_fn!("IBVERBS_1.13";
/// `ibv_is_fork_initialized(3)`: `IBV_FORK_UNNEEDED` (2): copy-based, fork-safe.
pub unsafe extern "C" fn ibv_is_fork_initialized() -> c_int { 2 });
