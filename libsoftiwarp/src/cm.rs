//! librdmacm entry points (rdma-core 44 names, symbol versions and errno rules) over
//! the `rdma_cm` crate's ids and event channels.
//!
//! Pointer rules: [`crate::boundary`]'s contract. The fields of `struct rdma_cm_id`
//! applications read (`verbs`, `route.addr.src_addr` / `dst_addr`, `port_num`, `qp`)
//! are refreshed after every call that can change them and before an event of the id is
//! returned, as librdmacm does. Calls return 0, or -1 with `errno`.
//!
//! Lifetimes follow librdmacm: `rdma_destroy_id` waits until every event of the id
//! that was handed out is acknowledged (`rdma_ack_cm_event`); events of an id queued
//! but not yet taken are dropped with it.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use cxgb4::ffi::types::{
    IbvContext, IbvPd, IbvQp, IbvQpInitAttr, RdmaCmEvent, RdmaCmId, RdmaConnParam,
    RdmaEventChannel, IBV_QPT_RC,
};
use rdma_cm::{ChannelEvent, CmIdRef, ConnParam};
use sw::cm::rdmacm::SoftDevice;
use verbs::provider::CmEventKind;

use crate::abi::{RdmaAddrinfo, RAI_PASSIVE, RDMA_PS_TCP};
use crate::boundary::{
    c_fn, c_str, from_raw, guard, into_raw, obj, read_sockaddr, set_errno, slice, sockaddr_in,
    sockaddr_storage, write_out, zeroed,
};
use crate::device::{soft, NO_DEVICE};
use crate::objects::{lock, ChanObj, ChanShared, CqObj, EventObj, FdWaker, IdObj, PdObj};

/// Live ids by serial (the key of their events): the address of their [`IdObj`].
fn registry() -> &'static Mutex<HashMap<u64, usize>> {
    static R: OnceLock<Mutex<HashMap<u64, usize>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Live event channels (addresses of their [`ChanObj`]).
fn channels() -> &'static Mutex<std::collections::HashSet<usize>> {
    static C: OnceLock<Mutex<std::collections::HashSet<usize>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// True if `id` is a live id of ours. Checked before an id is read: a pointer that is
/// not (NULL, or one already destroyed: perftest's connect-retry path reuses freed
/// ids) gets `EINVAL` instead of being dereferenced.
fn live_id(id: *mut RdmaCmId) -> bool {
    !id.is_null() && lock(registry()).values().any(|&p| p == id as usize)
}

/// True if `ch` is a live event channel of ours (as [`live_id`]).
fn live_channel(ch: *mut RdmaEventChannel) -> bool {
    !ch.is_null() && lock(channels()).contains(&(ch as usize))
}

/// -1 with `errno` = `e`.
fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// The rdma-cm id of `id` (`EINVAL` for NULL or destroyed).
fn id_ref(id: *mut RdmaCmId) -> Result<CmIdRef<SoftDevice>, c_int> {
    if !live_id(id) {
        return Err(libc::EINVAL);
    }
    // SAFETY: contract 1; only the Rust field is borrowed (the C fields are written
    // through the raw pointer).
    let m = unsafe { &(*id.cast::<IdObj>()).id };
    lock(m).as_ref().map(|i| i.as_ref()).ok_or(libc::EINVAL)
}

/// Rewrites the C fields of `id` from the rdma-cm id (device, addresses, port).
fn refresh(id: *mut RdmaCmId) {
    let Ok(r) = id_ref(id) else { return };
    let bound = r.device().is_some();
    let verbs = match soft() {
        Some(s) if bound => s.cm_ctx(),
        _ => std::ptr::null_mut(),
    };
    let src = sockaddr_storage(r.local_addr());
    let dst = sockaddr_storage(r.peer_addr());
    // SAFETY: contract 1 and 2; the C fields are written through the raw pointer (the
    // application may read them, as with librdmacm).
    unsafe {
        (*id).verbs = verbs;
        (*id).port_num = u8::from(bound);
        (*id).route.addr.src_addr = src;
        (*id).route.addr.dst_addr = dst;
    }
}

/// Runs `f` on the id's rdma-cm id, refreshes the C fields, and maps the result.
fn id_call(
    id: *mut RdmaCmId,
    f: impl FnOnce(&CmIdRef<SoftDevice>) -> Result<(), rdma_cm::CmError>,
) -> c_int {
    let r = match id_ref(id) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let res = f(&r);
    refresh(id);
    match res {
        Ok(()) => 0,
        Err(e) => fail(e.errno()),
    }
}

// ------------------------------------------------------------------ channels

c_fn!("RDMACM_1.0";
/// `rdma_create_event_channel(3)`: its fd is an eventfd, readable while an event can be
/// taken. `ENODEV` without a device (`SOFTIWARP_DEVICE`).
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut RdmaEventChannel {
    guard("rdma_create_event_channel", std::ptr::null_mut(), || {
        match new_channel() {
            Ok(p) => p.cast::<RdmaEventChannel>(),
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
});

fn new_channel() -> Result<*mut ChanObj, c_int> {
    let s = soft().ok_or(NO_DEVICE)?;
    let fd = crate::boundary::new_eventfd()?;
    let ch = s.cm.create_event_channel();
    let c = RdmaEventChannel {
        fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
    };
    let shared = std::sync::Arc::new(ChanShared {
        state: Mutex::new((ch.stream(), Default::default())),
        ch,
        waker: std::sync::Arc::new(FdWaker { fd }),
    });
    shared.refill(&mut lock(&shared.state));
    let p = into_raw(ChanObj { c, shared });
    lock(channels()).insert(p as usize);
    Ok(p)
}

c_fn!("RDMACM_1.0";
/// `rdma_destroy_event_channel(3)` (destroy its ids first).
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut RdmaEventChannel) {
    guard("rdma_destroy_event_channel", (), || {
        if lock(channels()).remove(&(channel as usize)) {
            // SAFETY: a live channel of ours (just unregistered); contract 2.
            drop(unsafe { from_raw(channel.cast::<ChanObj>()) });
        }
    })
});

// ------------------------------------------------------------------ ids

c_fn!("RDMACM_1.0";
/// `rdma_create_id(3)`: `RDMA_PS_TCP` only (`EPROTONOSUPPORT` otherwise); a NULL
/// channel gives the id a channel of its own.
pub unsafe extern "C" fn rdma_create_id(channel: *mut RdmaEventChannel, id: *mut *mut RdmaCmId, context: *mut c_void, ps: c_int) -> c_int {
    guard("rdma_create_id", -1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        if ps != RDMA_PS_TCP {
            return fail(libc::EPROTONOSUPPORT);
        }
        let (chan, own) = if channel.is_null() {
            match new_channel() {
                Ok(p) => (p, true),
                Err(e) => return fail(e),
            }
        } else if live_channel(channel) {
            (channel.cast::<ChanObj>(), false)
        } else {
            return fail(libc::EINVAL);
        };
        let Some(s) = soft() else { return fail(NO_DEVICE) };
        // SAFETY: contract 1.
        let ch = unsafe { &*chan };
        let cmid = s.cm.create_id_with_channel(&ch.shared.ch);
        let p = new_id_obj(cmid, chan, own, context, ps, (0, 0));
        // SAFETY: contract 3.
        unsafe { write_out(id, p) };
        0
    })
});

/// A new registered `IdObj` of `cmid`.
fn new_id_obj(
    cmid: rdma_cm::CmId<SoftDevice>,
    chan: *mut ChanObj,
    own_chan: bool,
    context: *mut c_void,
    ps: c_int,
    request: (u16, u16),
) -> *mut RdmaCmId {
    let serial = cmid.serial();
    let mut c: RdmaCmId = zeroed();
    c.channel = chan.cast::<RdmaEventChannel>();
    c.context = context;
    c.ps = ps;
    c.qp_type = IBV_QPT_RC;
    let p = into_raw(IdObj {
        c,
        id: Mutex::new(Some(cmid)),
        serial,
        chan: chan as usize,
        own_chan,
        request,
    })
    .cast::<RdmaCmId>();
    lock(registry()).insert(serial, p as usize);
    refresh(p);
    p
}

c_fn!("RDMACM_1.0";
/// `rdma_destroy_id(3)`: waits until the id's handed-out events are acknowledged.
pub unsafe extern "C" fn rdma_destroy_id(id: *mut RdmaCmId) -> c_int {
    guard("rdma_destroy_id", -1, || {
        if !live_id(id) {
            return fail(libc::EINVAL);
        }
        // SAFETY: contract 1; Rust fields only.
        let (serial, chan, own) = unsafe {
            let o = &*id.cast::<IdObj>();
            (o.serial, o.chan as *mut ChanObj, o.own_chan)
        };
        // SAFETY: contract 1 (the id's channel outlives it).
        let ch = unsafe { &*chan };
        {
            // Events of the id taken from the channel but not yet returned go with it.
            let sh = &ch.shared;
            let mut st = lock(&sh.state);
            st.1.retain(|e: &ChannelEvent<SoftDevice>| {
                e.id().serial() != serial && e.listener().is_none_or(|l| l.serial() != serial)
            });
            sh.refill(&mut st);
        }
        // SAFETY: contract 1; Rust field only.
        let taken = lock(unsafe { &(*id.cast::<IdObj>()).id }).take();
        if let Some(cmid) = taken {
            // Refused only while this thread holds un-acked events of the id, where
            // librdmacm would wait forever: then it is destroyed without waiting.
            if let Err(refused) = cmid.destroy() {
                drop(refused);
            }
        }
        lock(registry()).remove(&serial);
        // SAFETY: contract 1 and 2.
        drop(unsafe { from_raw(id.cast::<IdObj>()) });
        if own && lock(channels()).remove(&(chan as usize)) {
            // SAFETY: the channel was made for this id alone.
            drop(unsafe { from_raw(chan) });
        }
        0
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_bind_addr(3)` (IPv4, or IPv4-mapped IPv6).
pub unsafe extern "C" fn rdma_bind_addr(id: *mut RdmaCmId, addr: *mut libc::sockaddr) -> c_int {
    guard("rdma_bind_addr", -1, || {
        // SAFETY: contract 3.
        let a = match unsafe { read_sockaddr(addr) } {
            Ok(Some(a)) => a,
            Ok(None) => return fail(libc::EINVAL),
            Err(e) => return fail(e),
        };
        id_call(id, |r| r.bind_addr(a))
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_resolve_addr(3)`.
pub unsafe extern "C" fn rdma_resolve_addr(id: *mut RdmaCmId, src_addr: *mut libc::sockaddr, dst_addr: *mut libc::sockaddr, timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_addr", -1, || {
        // SAFETY: contract 3.
        let (src, dst) = match unsafe { (read_sockaddr(src_addr), read_sockaddr(dst_addr)) } {
            (Ok(s), Ok(Some(d))) => (s, d),
            (Err(e), _) | (_, Err(e)) => return fail(e),
            (_, Ok(None)) => return fail(libc::EINVAL),
        };
        let t = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0).max(1));
        id_call(id, |r| r.resolve_addr(src, dst, t))
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_resolve_route(3)`.
pub unsafe extern "C" fn rdma_resolve_route(id: *mut RdmaCmId, timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_route", -1, || {
        let t = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0).max(1));
        id_call(id, |r| r.resolve_route(t))
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_listen(3)` (a backlog of 0 or less: 128).
pub unsafe extern "C" fn rdma_listen(id: *mut RdmaCmId, backlog: c_int) -> c_int {
    guard("rdma_listen", -1, || {
        let b = u32::try_from(backlog).ok().filter(|b| *b > 0).unwrap_or(128);
        id_call(id, |r| r.listen(b))
    })
});

/// The rdma-cm parameters of a C `struct rdma_conn_param` (`None`: `dflt`).
fn conn_param(p: *const RdmaConnParam, dflt: (u16, u16)) -> Result<ConnParam, c_int> {
    // SAFETY: contract 3.
    let Some(c) = (unsafe { obj(p) }) else {
        return Ok(ConnParam::new(dflt.0, dflt.1));
    };
    // SAFETY: contract 3: `private_data_len` readable bytes.
    let pd = unsafe { slice(c.private_data.cast::<u8>(), usize::from(c.private_data_len)) }
        .ok_or(libc::EINVAL)?;
    Ok(
        ConnParam::new(c.responder_resources.into(), c.initiator_depth.into())
            .with_private_data(pd.to_vec())
            .with_retry_count(c.retry_count),
    )
}

c_fn!("RDMACM_1.0";
/// `rdma_connect(3)`: a NULL `conn_param` asks for IRD and ORD 255 (clamped by the
/// device), as librdmacm does.
pub unsafe extern "C" fn rdma_connect(id: *mut RdmaCmId, param: *mut RdmaConnParam) -> c_int {
    guard("rdma_connect", -1, || {
        let p = match conn_param(param, (255, 255)) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        id_call(id, |r| r.connect(&p))
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_accept(3)`: a NULL `conn_param` mirrors the request's ORD and IRD.
pub unsafe extern "C" fn rdma_accept(id: *mut RdmaCmId, param: *mut RdmaConnParam) -> c_int {
    guard("rdma_accept", -1, || {
        if !live_id(id) {
            return fail(libc::EINVAL);
        }
        // SAFETY: contract 1; Rust field only.
        let req = unsafe { (*id.cast::<IdObj>()).request };
        let p = match conn_param(param, req) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        let r = id_call(id, |r| r.accept(&p));
        if r == 0 {
            wait_ready_to_send(id);
        }
        r
    })
});

/// How long `rdma_accept` waits for the QP to reach RTS.
const ACCEPT_RTS_WAIT: Duration = Duration::from_secs(5);

/// Waits (up to [`ACCEPT_RTS_WAIT`]) until the id's QP leaves Init/RTR: with kernel siw
/// the passive side's QP is in RTS when `rdma_accept` returns, and programs post at once
/// without waiting for ESTABLISHED (perftest's `ib_write_lat` server posts its first RDMA
/// Write right after accepting).
fn wait_ready_to_send(id: *mut RdmaCmId) {
    // SAFETY: contract 1 (the id's own `qp` field).
    let qp = unsafe { (*id).qp };
    // SAFETY: contract 1: the id's QP is one of ours.
    let Some(q) = (unsafe { obj(qp.cast::<crate::objects::QpObj>()) }) else {
        return;
    };
    let deadline = std::time::Instant::now() + ACCEPT_RTS_WAIT;
    while matches!(
        q.qp.state(),
        verbs::QpState::Reset | verbs::QpState::Init | verbs::QpState::Rtr
    ) && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_micros(200));
    }
}

c_fn!("RDMACM_1.0";
/// `rdma_reject(3)`.
pub unsafe extern "C" fn rdma_reject(id: *mut RdmaCmId, private_data: *const c_void, private_data_len: u8) -> c_int {
    guard("rdma_reject", -1, || {
        // SAFETY: contract 3.
        let Some(pd) = (unsafe { slice(private_data.cast::<u8>(), usize::from(private_data_len)) }) else {
            return fail(libc::EINVAL);
        };
        id_call(id, |r| r.reject(pd))
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_disconnect(3)`. On an id already disconnected (the peer closed first, or a
/// second call) it succeeds, as the kernel's `iw_cm_disconnect` does in CLOSING/IDLE;
/// perftest disconnects twice and after its peer.
pub unsafe extern "C" fn rdma_disconnect(id: *mut RdmaCmId) -> c_int {
    guard("rdma_disconnect", -1, || {
        id_call(id, |r| match r.disconnect() {
            Err(rdma_cm::CmError::InvalidState { .. })
                if r.state() == rdma_cm::IdState::Disconnect =>
            {
                Ok(())
            }
            other => other,
        })
    })
});

// ------------------------------------------------------------------ QPs

c_fn!("RDMACM_1.0";
/// `rdma_create_qp(3)`: an RC QP of the id on `pd` (NULL: `id->pd`) with the CQs of
/// `qp_init_attr`, ready for receives; the capabilities granted are written back.
pub unsafe extern "C" fn rdma_create_qp(id: *mut RdmaCmId, pd: *mut IbvPd, qp_init_attr: *mut IbvQpInitAttr) -> c_int {
    guard("rdma_create_qp", -1, || create_qp(id, pd, qp_init_attr))
});

c_fn!("RDMACM_1.0";
/// `rdma_create_qp_ex(3)`: as `rdma_create_qp` with the PD of the extended attributes
/// (`IBV_QP_INIT_ATTR_PD`); any other `comp_mask` bit (send ops, create flags, ...) is
/// `EOPNOTSUPP`.
pub unsafe extern "C" fn rdma_create_qp_ex(id: *mut RdmaCmId, attr: *mut c_void) -> c_int {
    guard("rdma_create_qp_ex", -1, || {
        if attr.is_null() {
            return fail(libc::EINVAL);
        }
        // `struct ibv_qp_init_attr_ex` starts as `struct ibv_qp_init_attr` (up to
        // `sq_sig_all`), then `comp_mask` (u32, offset 60) and `pd` (offset 64).
        // SAFETY: contract 3: `attr` is a readable `struct ibv_qp_init_attr_ex`.
        let (mask, pd) = unsafe {
            let b = attr.cast::<u8>();
            (
                std::ptr::read_unaligned(b.add(60).cast::<u32>()),
                std::ptr::read_unaligned(b.add(64).cast::<*mut IbvPd>()),
            )
        };
        const IBV_QP_INIT_ATTR_PD: u32 = 1;
        if mask & !IBV_QP_INIT_ATTR_PD != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        let pd = if mask & IBV_QP_INIT_ATTR_PD != 0 { pd } else { std::ptr::null_mut() };
        create_qp(id, pd, attr.cast())
    })
});

/// `rdma_create_qp` on a checked `attr`.
fn create_qp(id: *mut RdmaCmId, pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> c_int {
    let r = match id_ref(id) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    // SAFETY: contract 1 (the id's own `pd` field).
    let pd = if pd.is_null() {
        unsafe { (*id).pd }
    } else {
        pd
    };
    // SAFETY: contract 1 and 3.
    let (Some(p), Some(a)) = (unsafe { obj(pd.cast::<PdObj>()) }, unsafe { obj(attr) }) else {
        return fail(libc::EINVAL);
    };
    if a.qp_type != IBV_QPT_RC {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: contract 1.
    let (Some(scq), Some(rcq)) = (unsafe { obj(a.send_cq.cast::<CqObj>()) }, unsafe {
        obj(a.recv_cq.cast::<CqObj>())
    }) else {
        return fail(libc::EINVAL);
    };
    let init = sw::QpInitAttr {
        send_cq: &scq.cq,
        recv_cq: &rcq.cq,
        cap: crate::ibv::cap_of(&a.cap),
        sq_sig_all: a.sq_sig_all != 0,
    };
    match r.create_qp(&p.pd, init) {
        Ok(qp) => {
            let q = crate::ibv::qp_obj(qp, pd, attr, Some(r), p.c.context);
            // SAFETY: contract 1; a C field written through the raw pointer.
            unsafe { (*id).qp = q };
            0
        }
        Err(e) => fail(e.errno()),
    }
}

c_fn!("RDMACM_1.0";
/// `rdma_destroy_qp(3)`.
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut RdmaCmId) {
    guard("rdma_destroy_qp", (), || {
        if !live_id(id) {
            return;
        }
        // SAFETY: contract 1.
        let qp: *mut IbvQp = unsafe { (*id).qp };
        if !qp.is_null() {
            // SAFETY: contract 1 and 2: the id's QP, not in use.
            unsafe {
                crate::ibv::destroy_qp_obj(qp);
                (*id).qp = std::ptr::null_mut();
            }
        }
    })
});

// ------------------------------------------------------------------ events

c_fn!("RDMACM_1.0";
/// `rdma_get_cm_event(3)`: blocks until an event (`EAGAIN` at once if the channel's fd
/// is `O_NONBLOCK`); acknowledge it with `rdma_ack_cm_event`.
pub unsafe extern "C" fn rdma_get_cm_event(channel: *mut RdmaEventChannel, event: *mut *mut RdmaCmEvent) -> c_int {
    guard("rdma_get_cm_event", -1, || {
        if !live_channel(channel) {
            return fail(libc::EINVAL);
        }
        // SAFETY: a live channel of ours.
        let Some(ch) = (unsafe { obj(channel.cast::<ChanObj>()) }) else {
            return fail(libc::EINVAL);
        };
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        let fd = ch.c.fd;
        // Our own reference: the channel may be destroyed while this call blocks.
        let sh = ch.shared.clone();
        loop {
            let ev = {
                let mut st = lock(&sh.state);
                if st.1.is_empty() {
                    sh.refill(&mut st);
                }
                let ev = st.1.pop_front();
                if ev.is_some() {
                    sh.refill(&mut st);
                }
                ev
            };
            if let Some(ev) = ev {
                if let Some(e) = make_event(ev) {
                    // SAFETY: contract 3.
                    unsafe { write_out(event, e) };
                    return 0;
                }
                continue;
            }
            if crate::boundary::is_nonblocking(fd) {
                return fail(libc::EAGAIN);
            }
            if crate::boundary::wait_readable(fd).is_err() {
                // The channel was destroyed under this call (its fd closed): as a read
                // blocked on librdmacm's closed fd, it never returns. rping destroys its
                // channel at exit while its CM thread waits here; returning an error
                // made that thread exit(255) before main returned 0.
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
        }
    })
});

/// The C event of `ev`; `None` if its id is gone (the event is dropped: acked).
fn make_event(mut ev: ChannelEvent<SoftDevice>) -> Option<*mut RdmaCmEvent> {
    let kind = sw::cm::provider::kind_to_neutral(ev.kind);
    let (idp, listenp) = if let Some(newid) = ev.take_new_id() {
        let lserial = ev.listener()?.serial();
        let lp = *lock(registry()).get(&lserial)? as *mut RdmaCmId;
        // SAFETY: a registered id is live (contract 2: not destroyed during this call).
        let (chan, context, ps) = unsafe {
            let o = &*lp.cast::<IdObj>();
            (o.chan as *mut ChanObj, (*lp).context, (*lp).ps)
        };
        let req = (ev.responder_resources, ev.initiator_depth);
        (new_id_obj(newid, chan, false, context, ps, req), lp)
    } else {
        let p = *lock(registry()).get(&ev.id().serial())? as *mut RdmaCmId;
        refresh(p);
        (p, std::ptr::null_mut())
    };
    let mut c: RdmaCmEvent = zeroed();
    c.id = idp;
    c.listen_id = listenp;
    c.event = kind.to_raw();
    c.status = ev.status;
    let sat = |v: u16| u8::try_from(v).unwrap_or(u8::MAX);
    c.param.conn = RdmaConnParam {
        private_data: if ev.private_data.is_empty() {
            std::ptr::null()
        } else {
            ev.private_data.as_ptr().cast()
        },
        private_data_len: sat(u16::try_from(ev.private_data.len()).unwrap_or(u16::MAX)),
        responder_resources: sat(ev.responder_resources),
        initiator_depth: sat(ev.initiator_depth),
        flow_control: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: 0,
        qp_num: 0,
    };
    Some(into_raw(EventObj { c, ev }).cast::<RdmaCmEvent>())
}

c_fn!("RDMACM_1.0";
/// `rdma_ack_cm_event(3)`.
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut RdmaCmEvent) -> c_int {
    guard("rdma_ack_cm_event", -1, || {
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: contract 1 and 2.
        drop(unsafe { from_raw(event.cast::<EventObj>()) });
        0
    })
});

static EVENT_STR: OnceLock<Vec<CString>> = OnceLock::new();

c_fn!("RDMACM_1.0";
/// `rdma_event_str(3)`.
pub unsafe extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    let t = EVENT_STR.get_or_init(|| {
        let mut v: Vec<CString> = CmEventKind::ALL
            .iter()
            .map(|k| CString::new(k.librdmacm_name()).unwrap_or_default())
            .collect();
        v.push(CString::new("UNKNOWN EVENT").unwrap_or_default());
        v
    });
    let i = usize::try_from(event).unwrap_or(usize::MAX).min(t.len() - 1);
    t[i].as_ptr()
});

// ------------------------------------------------------------------ addresses, devices

c_fn!("RDMACM_1.0";
/// `rdma_get_src_port(3)` (network order).
pub unsafe extern "C" fn rdma_get_src_port(id: *mut RdmaCmId) -> u16 {
    guard("rdma_get_src_port", 0, || {
        id_ref(id).ok().and_then(|r| r.local_addr()).map_or(0, |a| a.port().to_be())
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_get_dst_port(3)` (network order).
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut RdmaCmId) -> u16 {
    guard("rdma_get_dst_port", 0, || {
        id_ref(id).ok().and_then(|r| r.peer_addr()).map_or(0, |a| a.port().to_be())
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_get_devices(3)`: the context of CM ids, NULL-terminated.
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut IbvContext {
    guard("rdma_get_devices", std::ptr::null_mut(), || {
        let ctx = soft().map_or(0, |s| s.cm_ctx() as usize);
        // SAFETY: contract 3.
        unsafe { write_out(num_devices, c_int::from(ctx != 0)) };
        into_raw([ctx, 0usize]).cast::<*mut IbvContext>()
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_free_devices(3)`.
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut IbvContext) {
    guard("rdma_free_devices", (), || {
        if !list.is_null() {
            // SAFETY: contract 1: a list of ours.
            drop(unsafe { from_raw(list.cast::<[usize; 2]>()) });
        }
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_set_option(3)`: `RDMA_OPTION_ID` (level 0) options are accepted with no
/// effect (type of service, reuse, AF-only, ACK timeout mean nothing on the soft
/// device); others `ENOSYS`.
pub unsafe extern "C" fn rdma_set_option(id: *mut RdmaCmId, level: c_int, _optname: c_int, _optval: *mut c_void, _optlen: usize) -> c_int {
    guard("rdma_set_option", -1, || {
        if !live_id(id) {
            return fail(libc::EINVAL);
        }
        if level == 0 {
            return 0;
        }
        fail(libc::ENOSYS)
    })
});

/// One `rdma_addrinfo` and the address it points to.
#[repr(C)]
struct AddrInfoObj {
    c: RdmaAddrinfo,
    sa: libc::sockaddr_in,
}

c_fn!("RDMACM_1.0";
/// `rdma_getaddrinfo(3)`: one IPv4 result (`RAI_PASSIVE`: the source address, else the
/// destination), RC, `RDMA_PS_TCP`. Names are resolved by the system resolver.
pub unsafe extern "C" fn rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: *const RdmaAddrinfo, res: *mut *mut RdmaAddrinfo) -> c_int {
    guard("rdma_getaddrinfo", -1, || {
        if res.is_null() || (node.is_null() && service.is_null()) {
            return fail(libc::EINVAL);
        }
        // SAFETY: contract 3.
        let (node, service, hints) = unsafe { (c_str(node), c_str(service), obj(hints)) };
        let passive = hints.is_some_and(|h| h.ai_flags & RAI_PASSIVE != 0);
        let port = match service.map(str::parse::<u16>) {
            None => 0,
            Some(Ok(p)) => p,
            Some(Err(_)) => return fail(libc::EINVAL),
        };
        let ip = match node {
            None => Ipv4Addr::UNSPECIFIED,
            Some(n) => match n.parse::<Ipv4Addr>() {
                Ok(ip) => ip,
                Err(_) => match (n, port).to_socket_addrs().ok().and_then(|mut a| {
                    a.find_map(|a| match a {
                        SocketAddr::V4(v4) => Some(*v4.ip()),
                        SocketAddr::V6(_) => None,
                    })
                }) {
                    Some(ip) => ip,
                    None => return fail(libc::EADDRNOTAVAIL),
                },
            },
        };
        let mut c: RdmaAddrinfo = zeroed();
        c.ai_flags = hints.map_or(0, |h| h.ai_flags);
        c.ai_family = libc::AF_INET;
        c.ai_qp_type = IBV_QPT_RC;
        c.ai_port_space = RDMA_PS_TCP;
        let p = into_raw(AddrInfoObj {
            c,
            sa: sockaddr_in(SocketAddrV4::new(ip, port)),
        });
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `p` is ours and not yet handed out.
        unsafe {
            let sa = std::ptr::addr_of_mut!((*p).sa).cast::<libc::sockaddr>();
            if passive {
                (*p).c.ai_src_addr = sa;
                (*p).c.ai_src_len = len;
            } else {
                (*p).c.ai_dst_addr = sa;
                (*p).c.ai_dst_len = len;
            }
            write_out(res, p.cast::<RdmaAddrinfo>());
        }
        0
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_freeaddrinfo(3)`.
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut RdmaAddrinfo) {
    guard("rdma_freeaddrinfo", (), || {
        if !res.is_null() {
            // SAFETY: contract 1: one of ours (never chained).
            drop(unsafe { from_raw(res.cast::<AddrInfoObj>()) });
        }
    })
});
