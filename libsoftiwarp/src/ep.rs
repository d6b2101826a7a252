//! librdmacm's synchronous endpoint API (`rdma_create_ep`, `rdma_get_request`,
//! `rdma_destroy_ep`, `rdma_migrate_id`) and the calls that serve QPs made outside the
//! CM (`rdma_init_qp_attr`, `rdma_establish`), over [`crate::cm`]'s ids.
//!
//! A synchronous id (made without a channel: `rdma_create_id(NULL, ...)`,
//! `rdma_create_ep`, `rdma_migrate_id(id, NULL)`, the new id of a request on a
//! synchronous listener) has a channel of its own; each call that produces an event
//! waits for it and leaves it in `id->event` until the id's next such call or its
//! destroy ([`crate::cm::complete`], librdmacm's `ucma_complete`). The
//! `rdma_post_*`, `rdma_get_*_comp` and `rdma_reg_*` helpers of `<rdma/rdma_verbs.h>`
//! are header inlines over the verbs this library exports and the id's `qp`, `pd`,
//! `send_cq`, `recv_cq` and completion channels, which `rdma_create_qp` fills as
//! librdmacm does.
//!
//! Pointer rules: [`crate::boundary`]'s contract; handles are looked up among the live
//! ones first (`EINVAL` otherwise). Calls return 0, or -1 with `errno`.

#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use cxgb4::ffi::types::{IbvPd, IbvQpInitAttr, RdmaCmId, RdmaEventChannel};

use crate::abi::{
    IbvQpAttr, RdmaAddrinfo, IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_WRITE, IBV_QPS_INIT,
    IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_ACCESS_FLAGS, IBV_QP_PORT, IBV_QP_STATE, RAI_PASSIVE,
};
use crate::boundary::{c_fn, guard, obj, obj_mut, set_errno, slice, write_out, zeroed};
use crate::cm::{ack_id_event, create_id, create_qp};
use crate::objects::{lock, wait, ChanObj, IdObj, SavedQpAttr};

/// -1 with `errno` = `e`.
fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// librdmacm's timeout for `rdma_create_ep`'s address and route resolution, ms.
const EP_RESOLVE_MS: c_int = 2000;

c_fn!("RDMACM_1.0";
/// `rdma_create_ep(3)`: a synchronous id for `res` (its port space and QP type: RC over
/// `RDMA_PS_TCP`; others fail with one warning line, see `rdma_create_id`). Passive
/// (`RAI_PASSIVE`): bound to `res->ai_src_addr`; `pd` (if not NULL) becomes `id->pd`
/// and a copy of `qp_init_attr` is kept for the QPs `rdma_get_request` makes. Active:
/// the address and route resolved (2 s each, waited for), a QP made if `qp_init_attr`
/// is given (`rdma_create_qp` with `pd`, NULL: the default PD), `res->ai_connect` kept
/// for `rdma_connect`. On error the id is destroyed and `*id` untouched.
pub unsafe extern "C" fn rdma_create_ep(id: *mut *mut RdmaCmId, res: *mut RdmaAddrinfo, pd: *mut IbvPd, qp_init_attr: *mut IbvQpInitAttr) -> c_int {
    guard("rdma_create_ep", -1, || {
        // SAFETY: contract 3.
        let Some(res) = (unsafe { obj(res) }) else {
            return fail(libc::EINVAL);
        };
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let o = match create_id(std::ptr::null_mut(), std::ptr::null_mut(), res.ai_port_space, res.ai_qp_type) {
            Ok(o) => o,
            Err(e) => return fail(e),
        };
        // SAFETY: contract 3, for the call.
        let r = unsafe { setup_ep(&o, res, pd, qp_init_attr) };
        if r != 0 {
            let e = crate::boundary::errno();
            // SAFETY: our own live id.
            unsafe { rdma_destroy_ep(o.ptr()) };
            return fail(e);
        }
        // SAFETY: contract 3.
        unsafe { write_out(id, o.ptr()) };
        0
    })
});

/// The passive or active part of `rdma_create_ep` on the new id `o`: 0, or -1 with
/// `errno`.
///
/// # Safety
///
/// `res`'s addresses and `qp_init_attr` follow the boundary's contract 3.
unsafe fn setup_ep(
    o: &Arc<IdObj>,
    res: &RdmaAddrinfo,
    pd: *mut IbvPd,
    qp_init_attr: *mut IbvQpInitAttr,
) -> c_int {
    let id = o.ptr();
    if res.ai_flags & RAI_PASSIVE != 0 {
        // SAFETY: contract 3.
        let r = unsafe { crate::cm::rdma_bind_addr(id, res.ai_src_addr) };
        if r != 0 {
            return r;
        }
        if !pd.is_null() {
            let _c = lock(&o.s.c_lock);
            o.update_c(|c| c.pd = pd);
        }
        // SAFETY: contract 3.
        if let Some(a) = unsafe { obj(qp_init_attr) } {
            let mut saved = SavedQpAttr::of(a);
            saved.qp_type = res.ai_qp_type;
            *lock(&o.s.ep_qp_attr) = Some(saved);
        }
        return 0;
    }
    // SAFETY: contract 3.
    let r = unsafe {
        crate::cm::rdma_resolve_addr(id, res.ai_src_addr, res.ai_dst_addr, EP_RESOLVE_MS)
    };
    if r != 0 {
        return r;
    }
    // SAFETY: our own live id.
    let r = unsafe { crate::cm::rdma_resolve_route(id, EP_RESOLVE_MS) };
    if r != 0 {
        return r;
    }
    // SAFETY: contract 3: NULL or the caller's attributes.
    if let Some(a) = unsafe { obj_mut(qp_init_attr) } {
        a.qp_type = res.ai_qp_type;
        let r = create_qp(id, pd, qp_init_attr, 0);
        if r != 0 {
            return r;
        }
    }
    // SAFETY: contract 3: `ai_connect_len` readable bytes.
    match unsafe { slice(res.ai_connect.cast::<u8>(), res.ai_connect_len) } {
        Some(d) => *lock(&o.s.connect_data) = d.to_vec(),
        None => return fail(libc::EINVAL),
    }
    0
}

c_fn!("RDMACM_1.0";
/// `rdma_destroy_ep(3)`: the id's QP (and the CQs the CM made for it), the saved
/// attributes, then the id (`rdma_destroy_id`'s rules; nothing for a handle that is not
/// a live id).
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut RdmaCmId) {
    guard("rdma_destroy_ep", (), || {
        let Some(o) = IdObj::get(id) else { return };
        // SAFETY: our own live id.
        unsafe { crate::cm::rdma_destroy_qp(id) };
        *lock(&o.s.ep_qp_attr) = None;
        drop(o);
        // SAFETY: as above.
        unsafe { crate::cm::rdma_destroy_id(id) };
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_get_request(3)`: on a synchronous listener, waits for the next connection
/// request and returns its new (synchronous) id, whose `event` is the request (acked by
/// its `rdma_accept`, `rdma_reject` or destroy); with the listener's saved QP
/// attributes (`rdma_create_ep`) the new id has a QP on the listener's `pd` (NULL: the
/// default PD). `EINVAL` on an asynchronous id, or an event other than a request
/// (left in the listener's `event`; `ECONNREFUSED` for `REJECTED`, a failed event's
/// status as its errno).
pub unsafe extern "C" fn rdma_get_request(listen: *mut RdmaCmId, id: *mut *mut RdmaCmId) -> c_int {
    guard("rdma_get_request", -1, || {
        let Some(l) = IdObj::get(listen) else {
            return fail(libc::EINVAL);
        };
        if id.is_null() || !l.s.sync.load(Ordering::Acquire) {
            return fail(libc::EINVAL);
        }
        ack_id_event(&l);
        let Some(sh) = l.s.chan() else {
            return fail(libc::EINVAL);
        };
        let chan = {
            let _c = lock(&l.s.c_lock);
            l.with_c(|c| c.channel)
        };
        let ev = match crate::cm::get_event(chan, &sh) {
            Ok(e) => e,
            Err(e) => return fail(e),
        };
        let keep_on_listener = |e: c_int| {
            let _c = lock(&l.s.c_lock);
            l.update_c(|c| c.event = ev);
            fail(e)
        };
        let Some((kind, status, new_id)) =
            crate::objects::EventObj::get(ev).map(|e| e.with_c(|c| (c.event, c.status, c.id)))
        else {
            return fail(libc::EINVAL);
        };
        use verbs::provider::CmEventKind as K;
        if kind == K::Rejected.to_raw() {
            return keep_on_listener(libc::ECONNREFUSED);
        }
        if status != 0 {
            return keep_on_listener(c_int::try_from(status.unsigned_abs()).unwrap_or(libc::EINVAL));
        }
        if kind != K::ConnectRequest.to_raw() {
            return keep_on_listener(libc::EINVAL);
        }
        let saved = *lock(&l.s.ep_qp_attr);
        if let Some(saved) = saved {
            let mut attr = saved.to_c();
            let pd = {
                let _c = lock(&l.s.c_lock);
                l.with_c(|c| c.pd)
            };
            if create_qp(new_id, pd, &mut attr, 0) != 0 {
                let e = crate::boundary::errno();
                return keep_on_listener(e);
            }
        }
        if let Some(n) = IdObj::get(new_id) {
            let _c = lock(&n.s.c_lock);
            n.update_c(|c| c.event = ev);
        }
        // SAFETY: contract 3.
        unsafe { write_out(id, new_id) };
        0
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_migrate_id(3)`: moves the id to `channel`, or, for NULL, to a channel of its
/// own, making it synchronous (`EINVAL` for NULL on an id already synchronous, as
/// librdmacm). Its events not yet taken go with it. As librdmacm, it first acks the
/// event in `id->event` of a synchronous id, and waits until the id's events other
/// threads took are acked; `EDEADLK` (nothing moved) while the calling thread holds one,
/// where librdmacm would wait forever (as `rdma_destroy_id`).
pub unsafe extern "C" fn rdma_migrate_id(id: *mut RdmaCmId, channel: *mut RdmaEventChannel) -> c_int {
    guard("rdma_migrate_id", -1, || {
        let Some(o) = IdObj::get(id) else {
            return fail(libc::EINVAL);
        };
        let was_sync = o.s.sync.load(Ordering::Acquire);
        if was_sync && channel.is_null() {
            return fail(libc::EINVAL);
        }
        let (new_ptr, new_sh, own) = if channel.is_null() {
            match crate::cm::new_channel() {
                Ok(c) => {
                    let sh = lock(&c.s.shared).clone();
                    match sh {
                        Some(sh) => (c.ptr(), sh, Some(c)),
                        None => return fail(libc::EINVAL),
                    }
                }
                Err(e) => return fail(e),
            }
        } else {
            match crate::cm::live_channel(channel) {
                Some(sh) => (channel, sh, None),
                None => return fail(libc::EINVAL),
            }
        };
        let undo = |own: Option<Arc<ChanObj>>, e: c_int| {
            if let Some(c) = own.and_then(|c| ChanObj::take(c.ptr())) {
                crate::cm::destroy_channel(c);
            }
            fail(e)
        };
        if was_sync {
            ack_id_event(&o);
        }
        if let Err(e) = wait_unheld(&o) {
            return undo(own, e);
        }
        let Some(r) = o.s.id_ref() else {
            return undo(own, libc::EINVAL);
        };
        if let Err(e) = r.migrate(&new_sh.ch) {
            return undo(own, e.errno());
        }
        let old_sh = lock(&o.s.chan).replace(new_sh.clone());
        if let Some(old) = old_sh {
            // Events of the id the old channel's stream handed out but no
            // `rdma_get_cm_event` returned yet go along.
            let serial = o.s.serial;
            let moved = {
                let mut st = lock(&old.state);
                let (moved, kept): (VecDeque<_>, VecDeque<_>) =
                    std::mem::take(&mut st.1).into_iter().partition(|e| {
                    e.id().serial() == serial || e.listener().is_some_and(|l| l.serial() == serial)
                });
                st.1 = kept;
                old.refill(&mut st);
                moved
            };
            let mut st = lock(&new_sh.state);
            st.1.extend(moved);
            new_sh.refill(&mut st);
        }
        {
            let _c = lock(&o.s.c_lock);
            o.update_c(|c| c.channel = new_ptr);
        }
        let old_own = std::mem::replace(&mut *lock(&o.s.own_chan), own);
        o.s.sync.store(channel.is_null(), Ordering::Release);
        if let Some(c) = old_own.and_then(|c| ChanObj::take(c.ptr())) {
            crate::cm::destroy_channel(c);
        }
        0
    })
});

/// Waits until no thread holds an event of `o` (librdmacm's wait for
/// `events_completed`); `EDEADLK` if this thread holds one.
fn wait_unheld(o: &IdObj) -> Result<(), c_int> {
    let me = std::thread::current().id();
    let mut held = lock(&o.s.held);
    loop {
        if held.contains(&me) {
            return Err(libc::EDEADLK);
        }
        if held.is_empty() {
            return Ok(());
        }
        held = wait(&o.s.acked, held);
    }
}

c_fn!("RDMACM_1.2";
/// `rdma_init_qp_attr(3)`: the attributes for moving a QP to `qp_attr->qp_state`, as
/// the kernel answers for an iWARP device (cma.c `rdma_init_qp_attr`, iwcm.c
/// `iw_cm_init_qp_attr`): the whole struct zeroed but `qp_state`, `port_num` (the
/// id's) and `qp_access_flags`; mask `IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT`
/// with access 0 for an id without an iWARP CM id yet (before connect or listen), with
/// remote write and read for Init and RTR on one that has one, and `IBV_QP_PORT` only
/// for RTS. `EINVAL` for an id on no device, another state on an id with an iWARP CM
/// id, or an id listening or disconnecting (iw_cm's LISTEN, CLOSING).
pub unsafe extern "C" fn rdma_init_qp_attr(id: *mut RdmaCmId, qp_attr: *mut IbvQpAttr, qp_attr_mask: *mut c_int) -> c_int {
    guard("rdma_init_qp_attr", -1, || {
        let Some(o) = IdObj::get(id) else {
            return fail(libc::EINVAL);
        };
        let Some(r) = o.s.id_ref() else {
            return fail(libc::EINVAL);
        };
        // SAFETY: contract 3.
        let Some(state) = (unsafe { obj(qp_attr) }).map(|a| a.qp_state) else {
            return fail(libc::EINVAL);
        };
        if qp_attr_mask.is_null() || r.device().is_none() {
            return fail(libc::EINVAL);
        }
        let (mask, access) = if !r.has_iw_id() {
            (IBV_QP_STATE | IBV_QP_ACCESS_FLAGS, 0)
        } else if matches!(
            r.state(),
            rdma_cm::IdState::Listen
                | rdma_cm::IdState::Disconnect
                | rdma_cm::IdState::DeviceRemoval
                | rdma_cm::IdState::Destroying
        ) {
            return fail(libc::EINVAL);
        } else {
            match state {
                IBV_QPS_INIT | IBV_QPS_RTR => (
                    IBV_QP_STATE | IBV_QP_ACCESS_FLAGS,
                    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
                ),
                IBV_QPS_RTS => (0, 0),
                _ => return fail(libc::EINVAL),
            }
        };
        let port = {
            let _c = lock(&o.s.c_lock);
            o.with_c(|c| c.port_num)
        };
        let mut a: IbvQpAttr = zeroed();
        a.qp_state = state;
        a.qp_access_flags = access;
        a.port_num = port;
        // SAFETY: contract 3.
        unsafe {
            write_out(qp_attr, a);
            write_out(qp_attr_mask, mask | IBV_QP_PORT);
        }
        0
    })
});

c_fn!("RDMACM_1.2";
/// `rdma_establish(3)`: on iWARP the connection is complete when `ESTABLISHED` arrives
/// (MPA has no third message, and an id without a QP gets `ESTABLISHED`, not
/// `CONNECT_RESPONSE`), so on an active id that is connected it succeeds with nothing to
/// do; `EINVAL` otherwise. Kernel iWARP devices refuse it (cma.c's `cma_accept_iw` has
/// no `conn_param`: `EINVAL`), which makes rping `-q` fail there; it works here.
pub unsafe extern "C" fn rdma_establish(id: *mut RdmaCmId) -> c_int {
    guard("rdma_establish", -1, || {
        let Some(r) = IdObj::get(id).and_then(|o| o.s.id_ref()) else {
            return fail(libc::EINVAL);
        };
        if r.state() == rdma_cm::IdState::Established && r.has_iw_id() {
            0
        } else {
            fail(libc::EINVAL)
        }
    })
});
