//! libibverbs entry points (rdma-core 44 names, symbol versions and errno rules). The
//! data-path functions the header inlines call through `ctx->ops` are in [`crate::ops`],
//! the delivery of asynchronous events to contexts in [`crate::events`].
//!
//! Pointer rules: [`crate::boundary`]'s contract. Every entry point runs in
//! [`guard`]. Object handles are looked up among the live handles
//! ([`crate::handles`]) before use: NULL, destroyed, foreign or wrong-kind handles get
//! `EINVAL` (as errno, and as the return value of the calls that return an errno).

#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cxgb4::ffi::types::{
    IbvAsyncEvent, IbvCompChannel, IbvContext, IbvCq, IbvDevice, IbvDeviceAttr, IbvGid, IbvMr,
    IbvPd, IbvPortAttr, IbvQp, IbvQpCap, IbvQpInitAttr, IBV_ATOMIC_NONE,
};
use verbs::{AccessFlags, QpCap, QpState, WcStatus};

use crate::abi::*;
use crate::boundary::{
    c_fn, err_ret, free_list, guard, into_raw_list, minus_one, null_err, obj, obj_mut, set_errno,
    write_out, zeroed,
};
use crate::device::{devices, of_ibdev, Soft, NO_DEVICE};
use crate::events::{forget_async_events, names_object, remove_context, soft_objects, SoftKind};
use crate::objects::{
    lock, AsyncItem, CompChanObj, CompChanState, CompShared, CqObj, CqState, CtxObj, FdQueue,
    MrObj, MrState, Notify, PdObj, PdState, QpObj, QpState as QpObjState, QpUses,
};

/// Handles of PDs, MRs, CQs and QPs (`->handle`), for the application's logs only.
static HANDLES: AtomicU32 = AtomicU32::new(1);

fn next_handle() -> u32 {
    HANDLES.fetch_add(1, Ordering::Relaxed)
}

// ------------------------------------------------------------------ devices

c_fn!("IBVERBS_1.1";
/// `ibv_get_device_list(3)`: the process's soft devices (`crate::device`; none if
/// `SOFTIWARP_DEVICE` is wrong or, unset, no interface qualifies), NULL-terminated.
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut IbvDevice {
    guard("ibv_get_device_list", std::ptr::null_mut(), || {
        let devs: Vec<usize> = devices().iter().map(|s| s.ibdev() as usize).collect();
        let n = c_int::try_from(devs.len()).unwrap_or(c_int::MAX);
        // SAFETY: contract 3 (NULL or writable).
        unsafe { write_out(num_devices, n) };
        into_raw_list(&devs).cast::<*mut IbvDevice>()
    })
});

c_fn!("IBVERBS_1.1";
/// `ibv_free_device_list(3)`.
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut IbvDevice) {
    guard("ibv_free_device_list", (), || {
        if !list.is_null() {
            // SAFETY: contract 1: a list of ours, made by `into_raw_list`.
            unsafe { free_list(list.cast::<usize>()) };
        }
    })
});

c_fn!("IBVERBS_1.1";
/// `ibv_get_device_name(3)`: NULL with `EINVAL` for a device that is not ours.
pub unsafe extern "C" fn ibv_get_device_name(device: *mut IbvDevice) -> *const c_char {
    guard("ibv_get_device_name", std::ptr::null(), || match of_ibdev(device) {
        // SAFETY: one of our devices' `struct ibv_device`, alive for the process.
        Some(_) => match unsafe { obj(device) } {
            Some(d) => d.name.as_ptr(),
            None => std::ptr::null(),
        },
        None => {
            set_errno(libc::EINVAL);
            std::ptr::null()
        }
    })
});

c_fn!("IBVERBS_1.1";
/// `ibv_get_device_guid(3)`: the node GUID (network order), 0 for NULL.
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut IbvDevice) -> u64 {
    guard("ibv_get_device_guid", 0, || match of_ibdev(device) {
        Some(s) => s.guid(),
        None => {
            set_errno(libc::EINVAL);
            0
        }
    })
});

c_fn!("IBVERBS_1.9";
/// `ibv_get_device_index(3)`: the device's place in the device list.
pub unsafe extern "C" fn ibv_get_device_index(device: *mut IbvDevice) -> c_int {
    guard("ibv_get_device_index", -1, || {
        of_ibdev(device).map_or(-1, |s| c_int::try_from(s.index).unwrap_or(-1))
    })
});

c_fn!("IBVERBS_1.1";
/// `ibv_open_device(3)`: a new context of the device.
pub unsafe extern "C" fn ibv_open_device(device: *mut IbvDevice) -> *mut IbvContext {
    guard("ibv_open_device", std::ptr::null_mut(), || match of_ibdev(device) {
        Some(s) => match crate::device::new_context(device, s.index, false) {
            Ok(c) => c.ptr(),
            Err(e) => null_err(e),
        },
        None if devices().is_empty() => null_err(NO_DEVICE),
        None => null_err(libc::EINVAL),
    })
});

c_fn!("IBVERBS_1.1";
/// `ibv_close_device(3)`: 0, or -1 with `EINVAL` for a context that is not open. As
/// with rdma-core, the context's objects are not released: they stay usable (their
/// `context` stays readable, see `crate::handles`). The context of CM ids
/// (`id->verbs`) is never closed.
pub unsafe extern "C" fn ibv_close_device(context: *mut IbvContext) -> c_int {
    guard("ibv_close_device", -1, || {
        match CtxObj::get(context) {
            None => return minus_one(libc::EINVAL),
            Some(c) if c.s.cm => return 0,
            Some(_) => {}
        }
        let Some(c) = CtxObj::take(context) else {
            return minus_one(libc::EINVAL);
        };
        // Closes `async_fd` (unless a call blocked on it still holds it); port and
        // device events no longer come here.
        drop(lock(&c.s.events).take());
        remove_context(&c);
        CtxObj::bury(c);
        0
    })
});

/// The device of the context `c` (`ENODEV` if there is none: never for a context
/// made by this library).
fn dev_of(c: &CtxObj) -> Result<&'static Soft, c_int> {
    crate::device::get(c.s.dev).ok_or(NO_DEVICE)
}

/// The device behind a live `context` (else `EINVAL`).
fn ctx_soft(context: *const IbvContext) -> Result<&'static Soft, c_int> {
    Ok(ctx_obj(context)?.1)
}

/// The live context at `context` and its device (errors as [`ctx_soft`]).
fn ctx_obj(context: *const IbvContext) -> Result<(Arc<CtxObj>, &'static Soft), c_int> {
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
        d.atomic_cap = IBV_ATOMIC_NONE;
        d.max_pkeys = 1;
        d.phys_port_cnt = 1;
        // SAFETY: contract 3.
        if !unsafe { write_out(attr, d) } {
            return err_ret(libc::EINVAL);
        }
        0
    })
});

/// The port attributes of the device's one port.
fn port_attr(s: &Soft) -> IbvPortAttr {
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
fn gid(s: &Soft) -> IbvGid {
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
        let e = IbvGidEntry {
            gid: gid(s),
            gid_index: 0,
            port_num: 1,
            gid_type: 0,
            ndev_ifindex: 0,
        };
        // SAFETY: contract 3.
        if !unsafe { write_out(entry, e) } {
            return err_ret(libc::EINVAL);
        }
        0
    })
});

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
        let (ctx, s) = match ctx_obj(context) {
            Ok(v) => v,
            Err(e) => return null_err(e),
        };
        match s.device.alloc_pd() {
            Ok(pd) => {
                let mut c: IbvPd = zeroed();
                c.context = context;
                c.handle = next_handle();
                PdObj::publish(&PdObj::new(c, PdState { pd, ctx }))
            }
            Err(e) => null_err(e.errno()),
        }
    })
});

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
/// `ibv_create_cq(3)`.
pub unsafe extern "C" fn ibv_create_cq(context: *mut IbvContext, cqe: c_int, cq_context: *mut c_void, channel: *mut IbvCompChannel, _comp_vector: c_int) -> *mut IbvCq {
    guard("ibv_create_cq", std::ptr::null_mut(), || {
        let (ctx, s) = match ctx_obj(context) {
            Ok(v) => v,
            Err(e) => return null_err(e),
        };
        let n = match usize::try_from(cqe) {
            Ok(n) if n > 0 => n,
            _ => return null_err(libc::EINVAL),
        };
        let chan = if channel.is_null() {
            None
        } else {
            match CompChanObj::get(channel).and_then(|c| chan_use(&c)) {
                Some(sh) => Some(sh),
                None => return null_err(libc::EINVAL),
            }
        };
        let cq = match s.device.create_cq(cq_capacity(n)) {
            Ok(cq) => cq,
            Err(e) => {
                if let Some(chan) = chan {
                    chan.cqs.fetch_sub(1, Ordering::SeqCst);
                }
                return null_err(e.errno());
            }
        };
        let mut c: IbvCq = zeroed();
        c.context = context;
        c.channel = channel;
        c.cq_context = cq_context;
        c.handle = next_handle();
        c.cqe = i32::try_from(cq.capacity()).unwrap_or(cqe);
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
            ctx,
        });
        let dev = o.s.ctx.s.dev;
        soft_objects(|m| m.insert((dev, SoftKind::Cq, soft_handle), o.addr()));
        CqObj::publish(&o)
    })
});

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
        match CqObj::destroy_with(cq, destroy_cq_obj) {
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
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match soft_cq.destroy() {
            Ok(()) => break,
            Err(verbs::VerbsError::InUse { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e.errno()),
        }
    }
    if let Some(n) = lock(&c.s.notify).take() {
        n.retire();
        n.chan.cqs.fetch_sub(1, Ordering::SeqCst);
    }
    drop(lock(&c.s.cq).take());
    forget_async_events(&c.s.ctx, c.addr());
    soft_objects(|m| m.remove(&(c.s.ctx.s.dev, SoftKind::Cq, soft_cq.handle())));
    Ok(())
}

c_fn!("IBVERBS_1.1";
/// `ibv_get_cq_event(3)`: blocks until an armed CQ of the channel has a completion
/// (`EAGAIN` at once if the fd is `O_NONBLOCK`); -1 with `EINVAL` if not a live channel.
pub unsafe extern "C" fn ibv_get_cq_event(channel: *mut IbvCompChannel, cq: *mut *mut IbvCq, cq_context: *mut *mut c_void) -> c_int {
    guard("ibv_get_cq_event", -1, || {
        // Our own reference: the channel may be destroyed while this call blocks.
        let Some(sh) = CompChanObj::get(channel).and_then(|ch| lock(&ch.s.shared).clone())
        else {
            return minus_one(libc::EINVAL);
        };
        let fd = sh.q.raw_fd();
        loop {
            if let Some(p) = sh.q.pop() {
                // A CQ destroyed meanwhile has no event (destroy removes them; this
                // is the race with that removal).
                let Some(co) = CqObj::get(p as *const IbvCq) else {
                    continue;
                };
                co.s.events.fetch_add(1, Ordering::Relaxed);
                // SAFETY: contract 3.
                unsafe {
                    write_out(cq, co.ptr());
                    write_out(cq_context, co.s.cq_context as *mut c_void);
                }
                return 0;
            }
            if crate::boundary::is_nonblocking(fd) {
                return minus_one(libc::EAGAIN);
            }
            if let Err(e) = crate::boundary::wait_readable(fd) {
                return minus_one(e);
            }
        }
    })
});

c_fn!("IBVERBS_1.1";
/// `ibv_ack_cq_events(3)` (nothing for a handle that is not a live CQ).
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut IbvCq, nevents: c_uint) {
    guard("ibv_ack_cq_events", (), || {
        if let Some(c) = CqObj::get(cq) {
            c.s.acked.fetch_add(nevents, Ordering::Relaxed);
        }
    })
});

// ------------------------------------------------------------------ QP

/// The smallest send and receive queue made, WRs.
pub const MIN_QP_WR: u32 = 16;

/// The soft capabilities of C ones, the queue depths at least [`MIN_QP_WR`]
/// (ibv_create_qp(3): "the actual capacity may be greater"; providers round up, and
/// programs sized for them rely on it: perftest's `-e` latency tests post their next
/// Send on a one-WR queue before the previous completion was seen).
pub fn cap_of(c: &IbvQpCap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr.max(MIN_QP_WR),
        max_recv_wr: c.max_recv_wr.max(MIN_QP_WR),
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
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
    let cap = qp.query_qp().cap;
    attr.cap = cap_to_c(&cap);
    let pd = &uses.pd;
    let mut c: IbvQp = zeroed();
    c.context = pd.s.ctx.ptr();
    c.qp_context = attr.qp_context;
    c.pd = pd.ptr();
    c.send_cq = uses.cqs[0].ptr();
    c.recv_cq = uses.cqs[1].ptr();
    c.handle = next_handle();
    c.qp_num = qp.qp_num();
    c.state = IBV_QPS_INIT;
    c.qp_type = cxgb4::ffi::types::IBV_QPT_RC;
    let qpn = qp.qp_num();
    let ctx = pd.s.ctx.clone();
    let dev = ctx.s.dev;
    let o = QpObj::new(
        c,
        QpObjState {
            qp: Mutex::new(Some(qp)),
            id: Mutex::new(id),
            cap,
            uses: Mutex::new(Some(uses)),
            ctx,
        },
    );
    soft_objects(|m| m.insert((dev, SoftKind::Qp, qpn), o.addr()));
    QpObj::publish(&o)
}

c_fn!("IBVERBS_1.1";
/// `ibv_create_qp(3)`: an RC QP in Reset, not bound to a connection (an iWARP QP is
/// connected by the RDMA CM: use `rdma_create_qp`).
pub unsafe extern "C" fn ibv_create_qp(pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> *mut IbvQp {
    guard("ibv_create_qp", std::ptr::null_mut(), || {
        // SAFETY: contract 3: NULL or the application's attributes, ours for the call.
        let (Some(p), Some(a)) = (PdObj::get(pd), unsafe { obj_mut(attr) }) else {
            return null_err(libc::EINVAL);
        };
        if a.qp_type != cxgb4::ffi::types::IBV_QPT_RC {
            return null_err(libc::EOPNOTSUPP);
        }
        let s = match dev_of(&p.s.ctx) {
            Ok(s) => s,
            Err(e) => return null_err(e),
        };
        let Some((uses, soft_scq, soft_rcq)) = cq_pair(a, &p) else {
            return null_err(libc::EINVAL);
        };
        let init = sw::QpInitAttr {
            send_cq: &soft_scq,
            recv_cq: &soft_rcq,
            cap: cap_of(&a.cap),
            sq_sig_all: a.sq_sig_all != 0,
        };
        match s.device.create_qp(&p.s.pd, init) {
            Ok(qp) => qp_obj(Arc::new(qp), a, None, uses),
            // `uses` dropped: the CQs are free of it again.
            Err(e) => null_err(e.errno()),
        }
    })
});

/// The live CQs of `attr`, counted as used by a QP about to be made on `pd`
/// ([`QpUses::acquire`]: `None` if either is being destroyed, or is of another device
/// than the PD), and their soft CQs.
pub(crate) fn cq_pair(
    attr: &IbvQpInitAttr,
    pd: &Arc<PdObj>,
) -> Option<(QpUses, Arc<sw::Cq>, Arc<sw::Cq>)> {
    let dev = pd.s.ctx.s.dev;
    let scq = CqObj::get(attr.send_cq).filter(|c| c.s.ctx.s.dev == dev)?;
    let rcq = CqObj::get(attr.recv_cq).filter(|c| c.s.ctx.s.dev == dev)?;
    let (s, r) = (scq.s.cq()?, rcq.s.cq()?);
    let uses = QpUses::acquire(scq, rcq, pd.clone())?;
    Some((uses, s, r))
}

/// The soft state of a C `enum ibv_qp_state`.
fn qp_state(s: c_int) -> Option<QpState> {
    QpState::ALL.iter().copied().find(|q| *q as c_int == s)
}

c_fn!("IBVERBS_1.1";
/// `ibv_modify_qp(3)`: the state (`IBV_QP_STATE`); on a QP of the RDMA CM only the move
/// to Error is honoured (the CM drives the others on iWARP); other attributes are
/// accepted and ignored. `EINVAL` if not a live QP.
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, attr_mask: c_int) -> c_int {
    guard("ibv_modify_qp", libc::EIO, || {
        // SAFETY: contract 3.
        let (Some(q), Some(a)) = (QpObj::get(qp), unsafe { obj(attr) }) else {
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
        if lock(&q.s.id).is_some() && to != QpState::Error {
            return 0;
        }
        match soft_qp.modify_state(to) {
            Ok(()) => 0,
            Err(e) => err_ret(e.errno()),
        }
    })
});

c_fn!("IBVERBS_1.1";
/// `ibv_query_qp(3)`: state, capabilities, ORD/IRD, access flags; `EINVAL` if not a
/// live QP.
pub unsafe extern "C" fn ibv_query_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, _attr_mask: c_int, init_attr: *mut IbvQpInitAttr) -> c_int {
    guard("ibv_query_qp", libc::EIO, || {
        let Some(q) = QpObj::get(qp) else {
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
        q.with_c(|c| {
            i.qp_context = c.qp_context;
            i.send_cq = c.send_cq;
            i.recv_cq = c.recv_cq;
        });
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
        let Some(q) = QpObj::take(qp) else {
            return err_ret(libc::EINVAL);
        };
        let r = destroy_qp_obj(q);
        if r != 0 {
            set_errno(r);
        }
        r
    })
});

// ------------------------------------------------------------------ async events

c_fn!("IBVERBS_1.1";
/// `ibv_get_async_event(3)`: the next asynchronous event of the context's objects (a CQ
/// overrun `IBV_EVENT_CQ_ERR` with `element.cq`, a QP that went to Error
/// `IBV_EVENT_QP_FATAL` / `_REQ_ERR` / `_ACCESS_ERR` with `element.qp`, ...), blocking
/// until one comes (`EAGAIN` at once if `async_fd` is `O_NONBLOCK`); -1 with `EINVAL`
/// for a context that is not open. `async_fd` is readable exactly while an event waits.
pub unsafe extern "C" fn ibv_get_async_event(context: *mut IbvContext, event: *mut IbvAsyncEvent) -> c_int {
    guard("ibv_get_async_event", -1, || {
        let Some(q) = CtxObj::get(context).and_then(|c| lock(&c.s.events).clone()) else {
            return minus_one(libc::EINVAL);
        };
        if event.is_null() {
            return minus_one(libc::EINVAL);
        }
        let fd = q.raw_fd();
        loop {
            if let Some(item) = q.pop() {
                let e = IbvAsyncEvent {
                    element: item.element as *mut c_void,
                    event_type: item.event_type,
                };
                count_async_event(&item, 1);
                // SAFETY: contract 3.
                unsafe { write_out(event, e) };
                return 0;
            }
            if crate::boundary::is_nonblocking(fd) {
                return minus_one(libc::EAGAIN);
            }
            if let Err(e) = crate::boundary::wait_readable(fd) {
                return minus_one(e);
            }
        }
    })
});

/// Adds `delta` to the count of unacknowledged asynchronous events of the context of
/// the object `item` names (nothing for port and device events, or a destroyed object).
fn count_async_event(item: &AsyncItem, delta: isize) {
    let ctx = if !names_object(item.event_type) {
        None
    } else if item.event_type == verbs::AsyncEventType::CqErr.to_ibv() {
        CqObj::get(item.element as *const IbvCq).map(|c| c.s.ctx.clone())
    } else {
        QpObj::get(item.element as *const IbvQp).map(|q| q.s.ctx.clone())
    };
    if let Some(ctx) = ctx {
        let u = &ctx.s.unacked;
        if delta > 0 {
            u.fetch_add(delta.unsigned_abs(), Ordering::AcqRel);
        } else {
            let _ = u.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(delta.unsigned_abs()))
            });
        }
    }
}

c_fn!("IBVERBS_1.1";
/// `ibv_ack_async_event(3)`: counts the event acknowledged. Destroying its CQ or QP
/// does not wait for the acknowledgement (see README: the event's element stays a
/// readable, dead handle).
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut IbvAsyncEvent) {
    guard("ibv_ack_async_event", (), || {
        // SAFETY: contract 3: NULL or the event ibv_get_async_event filled.
        if let Some(e) = unsafe { obj(event) } {
            let item = AsyncItem {
                event_type: e.event_type,
                element: e.element as usize,
            };
            count_async_event(&item, -1);
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
