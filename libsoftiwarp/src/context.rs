//! Contexts and the device list they are opened from. [`new_context`] makes every
//! context (each device's context of CM ids, and each of `ibv_open_device`): its ops
//! table holds the data path of [`crate::ops`], its `verbs_context` head the operations
//! of [`crate::ex`], and [`crate::events`] queues the asynchronous events of its device
//! on its `async_fd`. The lookups here ([`devices`], [`cm`], [`of_ibdev`],
//! [`of_device`]) open the devices on first use ([`crate::device::all`], handed
//! [`new_context`] for each device's context of CM ids); the entry points of the device
//! list, `ibv_open_device` and `ibv_close_device` are here too.
//!
//! Above [`crate::ibv`] and [`crate::ex`]: a context's operations look its device up
//! ([`crate::device::get`]), so [`crate::device`] does not name them.
//!
//! Pointer rules: [`crate::boundary`]'s contract. Every entry point runs in [`guard`].

#![allow(unsafe_code)]

use std::ffi::{c_char, c_int};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use cxgb4::ffi::types::{IbvContext, IbvDevice};
use sw::cm::rdmacm::SoftRdmaCm;

use crate::boundary::{
    c_fn, free_list, guard, into_raw_list, minus_one, null_err, obj, set_errno, write_out, zeroed,
};
use crate::device::{Devices, Soft, NO_DEVICE};
use crate::objects::{lock, CtxObj, CtxState, FdQueue};

/// The devices and their RDMA CM, opened on first call.
fn all() -> Option<&'static Devices> {
    crate::device::all(new_context)
}

/// The devices, opened on first call; empty (after one line on stderr) if there are
/// none (see [`crate::device`]).
pub fn devices() -> &'static [Soft] {
    all().map_or(&[], |d| d.list())
}

/// The RDMA CM over the devices; `None` without a device.
pub fn cm() -> Option<&'static SoftRdmaCm> {
    all().map(|d| d.cm())
}

/// The device whose `struct ibv_device` is `dev` (compared, never read).
pub fn of_ibdev(dev: *const IbvDevice) -> Option<&'static Soft> {
    devices().iter().find(|s| s.ibdev().cast_const() == dev)
}

/// Our device of the soft device `d` (the one a CM id is on).
pub fn of_device(d: &sw::Device) -> Option<&'static Soft> {
    devices()
        .iter()
        .find(|s| std::ptr::eq(Arc::as_ptr(&s.device), d))
}

/// A new published context of `dev` (the `index`th device) whose ops are this
/// library's data path ([`crate::ops::install`]) and whose `verbs_context` head is
/// [`crate::ex::verbs_context_prefix`], recorded for port and device events
/// ([`crate::events::add_context`]) (`cm`: the context of CM ids, never closed);
/// `Err(errno)` if its `async_fd` cannot be made (`EMFILE` when the process is out of
/// fds).
pub fn new_context(dev: *mut IbvDevice, index: usize, cm: bool) -> Result<Arc<CtxObj>, c_int> {
    let mut c: IbvContext = zeroed();
    c.device = dev;
    crate::ops::install(&mut c.ops);
    c.cmd_fd = -1;
    let events = Arc::new(FdQueue::new(crate::boundary::new_eventfd()?));
    c.async_fd = events.raw_fd();
    c.num_comp_vectors = 1;
    c.abi_compat = crate::abi::VERBS_ABI_IS_EXTENDED;
    let ctx = CtxObj::with_prefix(
        crate::ex::verbs_context_prefix(),
        c,
        CtxState {
            events: Mutex::new(Some(events)),
            dev: index,
            cm,
            unacked: AtomicUsize::new(0),
        },
    );
    CtxObj::publish(&ctx);
    crate::events::add_context(&ctx);
    Ok(ctx)
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
        Some(s) => match new_context(device, s.index, false) {
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
        crate::events::remove_context(&c);
        CtxObj::bury(c);
        0
    })
});
