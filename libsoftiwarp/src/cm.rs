//! librdmacm entry points (rdma-core 44 names, symbol versions and errno rules) over
//! the `rdma_cm` crate's ids and event channels.
//!
//! Pointer rules: [`crate::boundary`]'s contract; ids, channels and events are looked
//! up among the live handles ([`crate::handles`]): one that is not live (NULL,
//! destroyed, acked, foreign) is `EINVAL`. The fields of `struct rdma_cm_id`
//! applications read (`verbs`, `route.addr.src_addr` / `dst_addr`, `port_num`, `qp`)
//! are refreshed after every call that can change them and before an event of the id is
//! returned, as librdmacm does. `verbs` is the CM context of the device the id is on:
//! the one `rdma_resolve_addr` routed it to or `rdma_bind_addr` bound it to, or, for
//! the id of a connect request, the device whose listener took the request (NULL while
//! it is on none, as an unbound id of librdmacm). All devices share one CM
//! ([`crate::device`]), so a wildcard listen spans them. `rdma_create_qp` refuses a PD
//! of another device (`EINVAL`, as librdmacm refuses one of another context). Calls
//! return 0, or -1 with `errno`.
//!
//! Lifetimes follow librdmacm: `rdma_destroy_id` waits until every event of the id
//! that was handed out to another thread is acknowledged (`rdma_ack_cm_event`); events
//! of an id queued but not yet taken are dropped with it. Where librdmacm would wait
//! forever, because the calling thread itself holds an unacked event of the id, it
//! fails with `EDEADLK` instead and the id stays alive (ack, then destroy again), as
//! the `rdma-cm` crate's `CmId::destroy` refuses with `CmError::UnackedEvents`.
//! `rdma_destroy_event_channel` destroys the channel even with ids on it, as librdmacm
//! does: the channel's handle is dead from then on, its ids stay usable and
//! destroyable.

#![allow(unsafe_code)]

pub use crate::blocking::rdma_get_cm_event;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use cxgb4::ffi::types::{
    IbvCompChannel, IbvContext, IbvCq, IbvPd, IbvQp, IbvQpInitAttr, RdmaCmEvent, RdmaCmId,
    RdmaConnParam, RdmaEventChannel, IBV_QPT_RC,
};
use rdma_cm::{ChannelEvent, CmIdRef, ConnParam};
use sw::cm::rdmacm::SoftDevice;
use verbs::provider::CmEventKind;

use crate::abi::{RdmaAddrinfo, RAI_PASSIVE, RDMA_PS_IB, RDMA_PS_IPOIB, RDMA_PS_TCP, RDMA_PS_UDP};
use crate::boundary::{
    c_fn, c_str, free_list, from_raw, guard, into_raw, into_raw_list, obj, obj_mut, read_sockaddr,
    set_errno, slice, sockaddr_in, sockaddr_storage, write_out, zeroed,
};
use crate::context::of_device;
use crate::device::NO_DEVICE;
use crate::objects::{
    lock, wait, ChanObj, ChanShared, ChanState, EventObj, EventState, FdWaker, IdObj, IdState,
    PdObj, QpObj,
};

/// Live ids by serial (the key of their events).
fn ids() -> &'static Mutex<HashMap<u64, Arc<IdObj>>> {
    static R: OnceLock<Mutex<HashMap<u64, Arc<IdObj>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// True if `id` is a live id of ours (never reads `id`).
fn live_id(id: *mut RdmaCmId) -> bool {
    IdObj::get(id).is_some()
}

/// The state of the live event channel `ch`.
pub(crate) fn live_channel(ch: *mut RdmaEventChannel) -> Option<Arc<ChanShared>> {
    ChanObj::get(ch).and_then(|c| lock(&c.s.shared).clone())
}

/// -1 with `errno` = `e`.
fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// The rdma-cm id of `id` (`EINVAL` for NULL, destroyed or foreign).
fn id_ref(id: *mut RdmaCmId) -> Result<CmIdRef<SoftDevice>, c_int> {
    IdObj::get(id)
        .and_then(|o| o.s.id_ref())
        .ok_or(libc::EINVAL)
}

/// Our device that the id `r` is on (resolved, bound or made by a connect
/// request on it), if it is on one.
fn id_device(r: &CmIdRef<SoftDevice>) -> Option<&'static crate::device::Soft> {
    r.device().and_then(|d| of_device(d.device()))
}

/// Rewrites the C fields of `o` from the rdma-cm id (device, addresses, port): `verbs`
/// is the CM context of the device the id is on (NULL while it is on none).
fn refresh(o: &IdObj) {
    let Some(r) = o.s.id_ref() else { return };
    let dev = id_device(&r);
    let bound = dev.is_some();
    let verbs = dev.map_or(std::ptr::null_mut(), |s| s.cm_ctx());
    let src = sockaddr_storage(r.local_addr());
    let dst = sockaddr_storage(r.peer_addr());
    let _c = lock(&o.s.c_lock);
    // librdmacm gives an id its device's default PD when the id reaches the device
    // (`ucma_get_device`: `id->pd = cma_dev->pd`), unless it has one.
    let pd = match dev {
        Some(s) if o.with_c(|c| c.pd.is_null()) => crate::ibv::default_pd(s).ok(),
        _ => None,
    };
    o.update_c(|c| {
        c.verbs = verbs;
        c.port_num = u8::from(bound);
        c.route.addr.src_addr = src;
        c.route.addr.dst_addr = dst;
        if let Some(pd) = pd {
            c.pd = pd;
        }
    });
}

/// Runs `f` on the id's rdma-cm id, refreshes the C fields, and maps the result.
fn id_call(
    id: *mut RdmaCmId,
    f: impl FnOnce(&CmIdRef<SoftDevice>) -> Result<(), rdma_cm::CmError>,
) -> c_int {
    let Some(o) = IdObj::get(id) else {
        return fail(libc::EINVAL);
    };
    let Some(r) = o.s.id_ref() else {
        return fail(libc::EINVAL);
    };
    let res = f(&r);
    refresh(&o);
    match res {
        Ok(()) => 0,
        Err(e) => fail(e.errno()),
    }
}

/// [`id_call`], then for a synchronous id the wait for the call's event
/// ([`complete`]).
fn sync_call(
    id: *mut RdmaCmId,
    f: impl FnOnce(&CmIdRef<SoftDevice>) -> Result<(), rdma_cm::CmError>,
) -> c_int {
    match id_call(id, f) {
        0 => IdObj::get(id).map_or_else(|| fail(libc::EINVAL), |o| complete(&o)),
        r => r,
    }
}

// ------------------------------------------------------------------ channels

c_fn!("RDMACM_1.0";
/// `rdma_create_event_channel(3)`: its fd is an eventfd, readable while an event can be
/// taken. `ENODEV` without a device (`crate::device`).
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut RdmaEventChannel {
    guard("rdma_create_event_channel", std::ptr::null_mut(), || {
        match new_channel() {
            Ok(c) => c.ptr(),
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
});

/// A new published event channel.
pub(crate) fn new_channel() -> Result<Arc<ChanObj>, c_int> {
    let cm = crate::context::cm().ok_or(NO_DEVICE)?;
    let fd = crate::boundary::new_eventfd()?;
    let ch = cm.create_event_channel();
    let c = RdmaEventChannel {
        fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
    };
    let shared = Arc::new(ChanShared {
        state: Mutex::new((ch.stream(), Default::default())),
        ch,
        waker: Arc::new(FdWaker { fd }),
    });
    shared.refill(&mut lock(&shared.state));
    let o = ChanObj::new(
        c,
        ChanState {
            shared: Mutex::new(Some(shared)),
        },
    );
    ChanObj::publish(&o);
    Ok(o)
}

/// Destroys the channel object `c` (taken out of the live handles).
pub(crate) fn destroy_channel(c: Arc<ChanObj>) {
    // The channel's state goes when its last id does (and a call blocked on it returns).
    drop(lock(&c.s.shared).take());
    ChanObj::bury(c);
}

c_fn!("RDMACM_1.0";
/// `rdma_destroy_event_channel(3)`: as librdmacm, also with ids on it (its ids stay
/// usable; the channel handle is dead); nothing for a handle that is not a live channel.
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut RdmaEventChannel) {
    guard("rdma_destroy_event_channel", (), || {
        if let Some(c) = ChanObj::take(channel) {
            destroy_channel(c);
        }
    })
});

// ------------------------------------------------------------------ ids

c_fn!("RDMACM_1.0";
/// `rdma_create_id(3)`: `RDMA_PS_TCP` only (the UD port spaces `RDMA_PS_UDP`,
/// `RDMA_PS_IPOIB` and InfiniBand's `RDMA_PS_IB` fail with `EPROTONOSUPPORT` after one
/// warning line: iWARP has no UD). A NULL channel makes the id synchronous, as
/// librdmacm does: it gets a channel of its own, and each call that produces an event
/// waits for it and leaves it in `id->event` (acked by the id's next such call or its
/// destroy).
pub unsafe extern "C" fn rdma_create_id(channel: *mut RdmaEventChannel, id: *mut *mut RdmaCmId, context: *mut c_void, ps: c_int) -> c_int {
    guard("rdma_create_id", -1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        match create_id(channel, context, ps, IBV_QPT_RC) {
            Ok(o) => {
                // SAFETY: contract 3.
                unsafe { write_out(id, o.ptr()) };
                0
            }
            Err(e) => fail(e),
        }
    })
});

/// Refuses a port space other than `RDMA_PS_TCP` with `EPROTONOSUPPORT` (the port
/// space is the protocol; socket(2)'s errno for one not supported), after one warning
/// line per kind, so librdmacm's UD programs (udaddy, mckey) say why they stop; then
/// the QP type as [`crate::ibv::refuse_qp_type`].
pub(crate) fn refuse_non_rc(call: &'static str, ps: c_int, qp_type: c_int) -> Result<(), c_int> {
    crate::ibv::refuse_qp_type(call, qp_type)?;
    let what = match ps {
        RDMA_PS_TCP => return Ok(()),
        RDMA_PS_UDP | RDMA_PS_IPOIB => "iWARP has no UD",
        RDMA_PS_IB => "iWARP has no InfiniBand port space",
        _ => "iWARP has no such port space",
    };
    crate::stubs::warn_once(
        what,
        &format!("{call} refused: iWARP is reliable connected only (RDMA_PS_TCP)"),
    );
    Err(libc::EPROTONOSUPPORT)
}

/// A new published id (`rdma_create_id`, `rdma_create_ep`): on `channel`, or
/// synchronous on a channel of its own for NULL; `Err(errno)`.
pub(crate) fn create_id(
    channel: *mut RdmaEventChannel,
    context: *mut c_void,
    ps: c_int,
    qp_type: c_int,
) -> Result<Arc<IdObj>, c_int> {
    refuse_non_rc("rdma_create_id", ps, qp_type)?;
    let (chan, sh, own) = if channel.is_null() {
        let c = new_channel()?;
        let sh = lock(&c.s.shared).clone().ok_or(libc::EINVAL)?;
        (c.ptr(), sh, Some(c))
    } else {
        (channel, live_channel(channel).ok_or(libc::EINVAL)?, None)
    };
    let cm = crate::context::cm().ok_or(NO_DEVICE)?;
    let cmid = cm.create_id_with_channel(&sh.ch);
    Ok(new_id_obj(cmid, chan, sh, own, context, ps, (0, 0)))
}

/// A new published id of `cmid` on the channel `chan` (state `sh`); synchronous when
/// the channel was made for it (`own_chan`).
fn new_id_obj(
    cmid: rdma_cm::CmId<SoftDevice>,
    chan: *mut RdmaEventChannel,
    sh: Arc<ChanShared>,
    own_chan: Option<Arc<ChanObj>>,
    context: *mut c_void,
    ps: c_int,
    request: (u16, u16),
) -> Arc<IdObj> {
    let serial = cmid.serial();
    let sync = own_chan.is_some();
    let mut c: RdmaCmId = zeroed();
    c.channel = chan;
    c.context = context;
    c.ps = ps;
    c.qp_type = IBV_QPT_RC;
    let o = IdObj::new(
        c,
        IdState {
            id: Mutex::new(Some(cmid)),
            serial,
            chan: Mutex::new(Some(sh)),
            own_chan: Mutex::new(own_chan),
            sync: AtomicBool::new(sync),
            ep_qp_attr: Mutex::new(None),
            disconnected: AtomicBool::new(false),
            connect_data: Mutex::new(Vec::new()),
            request,
            c_lock: Mutex::new(()),
            held: Mutex::new(Vec::new()),
            acked: Condvar::new(),
        },
    );
    refresh(&o);
    IdObj::publish(&o);
    lock(ids()).insert(serial, o.clone());
    o
}

c_fn!("RDMACM_1.0";
/// `rdma_destroy_id(3)`: acks the event a synchronous call left in `id->event` (as
/// librdmacm), then waits until the id's events handed out to other threads are
/// acknowledged; -1 with `EDEADLK` (the id left alive) while the calling thread holds
/// one, where librdmacm would wait forever; -1 with `EINVAL` if not a live id.
pub unsafe extern "C" fn rdma_destroy_id(id: *mut RdmaCmId) -> c_int {
    guard("rdma_destroy_id", -1, || {
        let me = std::thread::current().id();
        match IdObj::get(id) {
            None => return fail(libc::EINVAL),
            Some(o) => {
                ack_id_event(&o);
                if lock(&o.s.held).contains(&me) {
                    return fail(libc::EDEADLK);
                }
            }
        }
        let Some(o) = take_when_unheld(id) else {
            return fail(libc::EINVAL);
        };
        // The channel's state goes with the id, after it (the last id of a destroyed
        // channel closes its fd).
        let chan = lock(&o.s.chan).take();
        if let Some(sh) = &chan {
            // Events of the id taken from the channel but not yet returned go with it.
            let serial = o.s.serial;
            let mut st = lock(&sh.state);
            st.1.retain(|e: &ChannelEvent<SoftDevice>| {
                e.id().serial() != serial && e.listener().is_none_or(|l| l.serial() != serial)
            });
            sh.refill(&mut st);
        }
        let taken = lock(&o.s.id).take();
        if let Some(cmid) = taken {
            // Every event of the id handed out is acked; the rdma-cm crate can still
            // count one as this thread's (an event its stream handed to this thread
            // while restoring a channel's fd, returned to another): it refuses, and
            // dropping the id destroys it without waiting.
            if let Err(refused) = cmid.destroy() {
                drop(refused);
            }
        }
        drop(chan);
        let own = lock(&o.s.own_chan).take();
        if let Some(c) = own.and_then(|c| ChanObj::take(c.ptr())) {
            destroy_channel(c);
        }
        IdObj::bury(o);
        0
    })
});

/// Waits until no event of the live id at `id` is held (librdmacm: every event of
/// the id handed out to another thread is acked), then takes it out of the live
/// handles and the live ids at once; `None` if it is not live (or another destroy took
/// it meanwhile). The id stays live while this waits, so the threads holding its
/// events can still use `event->id`. The last check and the removal are under the lock
/// of the live ids, which `make_event` holds to count an event as held (`Hold`): an
/// event counted before the removal is waited for, and none is counted after it, so no
/// event of the id is returned after `rdma_destroy_id` returned.
fn take_when_unheld(id: *mut RdmaCmId) -> Option<Arc<IdObj>> {
    let o = IdObj::get(id)?;
    loop {
        let mut live = lock(ids());
        let held = lock(&o.s.held);
        if held.is_empty() {
            // From here the handle is dead: a second destroy finds nothing, and
            // events of the id taken from now on are dropped (`make_event`).
            let taken = IdObj::take(id)?;
            live.remove(&taken.s.serial);
            return Some(taken);
        }
        drop(live);
        // Woken by an ack (`unhold`); the held list is checked again, with the ids.
        drop(wait(&o.s.acked, held));
    }
}

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
/// `rdma_resolve_addr(3)` (a synchronous id waits for `ADDR_RESOLVED`).
pub unsafe extern "C" fn rdma_resolve_addr(id: *mut RdmaCmId, src_addr: *mut libc::sockaddr, dst_addr: *mut libc::sockaddr, timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_addr", -1, || {
        // SAFETY: contract 3.
        let (src, dst) = match unsafe { (read_sockaddr(src_addr), read_sockaddr(dst_addr)) } {
            (Ok(s), Ok(Some(d))) => (s, d),
            (Err(e), _) | (_, Err(e)) => return fail(e),
            (_, Ok(None)) => return fail(libc::EINVAL),
        };
        let t = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0).max(1));
        sync_call(id, |r| r.resolve_addr(src, dst, t))
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_resolve_route(3)` (a synchronous id waits for `ROUTE_RESOLVED`).
pub unsafe extern "C" fn rdma_resolve_route(id: *mut RdmaCmId, timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_route", -1, || {
        let t = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0).max(1));
        sync_call(id, |r| r.resolve_route(t))
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

/// The rdma-cm parameters of a C `struct rdma_conn_param` (`None`: `dflt`), and its
/// `qp_num` (`None` for NULL).
fn conn_param(
    p: *const RdmaConnParam,
    dflt: (u16, u16),
) -> Result<(ConnParam, Option<u32>), c_int> {
    // SAFETY: contract 3.
    let Some(c) = (unsafe { obj(p) }) else {
        return Ok((ConnParam::new(dflt.0, dflt.1), None));
    };
    // SAFETY: contract 3: `private_data_len` readable bytes.
    let pd = unsafe { slice(c.private_data.cast::<u8>(), usize::from(c.private_data_len)) }
        .ok_or(libc::EINVAL)?;
    Ok((
        ConnParam::new(c.responder_resources.into(), c.initiator_depth.into())
            .with_private_data(pd.to_vec())
            .with_retry_count(c.retry_count),
        Some(c.qp_num),
    ))
}

/// The QP a connect or accept of `o` names by `conn_param->qp_num` when the id has no
/// QP of its own (a QP from `ibv_create_qp`, as rping `-q` makes): `Ok(None)` if the id
/// has one (the number is ignored, as in cma.c); `EINVAL` without a `conn_param` (as
/// librdmacm's `ucma_valid_param`), or for a number that is no live QP of the id's
/// device (the kernel's `iw_cm_connect` finds no QP: `EINVAL`).
fn named_qp(
    o: &IdObj,
    r: &CmIdRef<SoftDevice>,
    qp_num: Option<u32>,
) -> Result<Option<Arc<sw::Qp>>, c_int> {
    if id_qp(o).is_some() {
        return Ok(None);
    }
    let qpn = qp_num.ok_or(libc::EINVAL)?;
    let dev = id_device(r).ok_or(libc::EINVAL)?;
    let q = crate::ibv::qp_by_num(dev.index, qpn).ok_or(libc::EINVAL)?;
    q.s.qp().map(Some).ok_or(libc::EINVAL)
}

c_fn!("RDMACM_1.0";
/// `rdma_connect(3)`: a NULL `conn_param` asks for IRD and ORD 255 (clamped by the
/// device), as librdmacm does. An id without a QP connects the QP `conn_param->qp_num`
/// names (one from `ibv_create_qp` on the id's device; the id never destroys it).
/// A synchronous id waits for `ESTABLISHED` (`ECONNREFUSED` if rejected).
pub unsafe extern "C" fn rdma_connect(id: *mut RdmaCmId, param: *mut RdmaConnParam) -> c_int {
    guard("rdma_connect", -1, || {
        let (mut p, qp_num) = match conn_param(param, (255, 255)) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        let (Some(o), Ok(r)) = (IdObj::get(id), id_ref(id)) else {
            return fail(libc::EINVAL);
        };
        let named = match named_qp(&o, &r, qp_num) {
            Ok(q) => q,
            Err(e) => return fail(e),
        };
        // `rdma_create_ep`'s `ai_connect` goes before the caller's private data.
        let mut data = lock(&o.s.connect_data).clone();
        if !data.is_empty() {
            data.extend_from_slice(&p.private_data);
            p.private_data = data;
        }
        sync_call(id, |r| match named {
            Some(q) => r.connect_with_qp(&p, q),
            None => r.connect(&p),
        })
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_accept(3)`: a NULL `conn_param` mirrors the request's ORD and IRD. An id
/// without a QP accepts with the QP `conn_param->qp_num` names (as `rdma_connect`;
/// `EINVAL` with a NULL `conn_param`, where librdmacm reads through it). Returns once
/// the QP is ready to send; a synchronous id also waits for `ESTABLISHED`.
pub unsafe extern "C" fn rdma_accept(id: *mut RdmaCmId, param: *mut RdmaConnParam) -> c_int {
    guard("rdma_accept", -1, || {
        let (Some(o), Ok(r)) = (IdObj::get(id), id_ref(id)) else {
            return fail(libc::EINVAL);
        };
        let (p, qp_num) = match conn_param(param, o.s.request) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        let named = match named_qp(&o, &r, qp_num) {
            Ok(q) => q,
            Err(e) => return fail(e),
        };
        let qp = named.clone().or_else(|| id_qp(&o).and_then(|q| q.s.qp()));
        let res = id_call(id, |r| match named {
            Some(q) => r.accept_with_qp(&p, q),
            None => r.accept(&p),
        });
        if res != 0 {
            return res;
        }
        if let Some(q) = qp {
            wait_ready_to_send(&q);
        }
        complete(&o)
    })
});

/// How long `rdma_accept` waits for the QP to reach RTS.
const ACCEPT_RTS_WAIT: Duration = Duration::from_secs(5);

/// The id's QP (its `qp` field), if it is a live QP of ours.
fn id_qp(o: &IdObj) -> Option<Arc<QpObj>> {
    let qp = {
        let _c = lock(&o.s.c_lock);
        o.with_c(|c| c.qp)
    };
    QpObj::get(qp.cast())
}

/// Waits (up to [`ACCEPT_RTS_WAIT`]) until the accepted QP `q` leaves Init/RTR: with
/// kernel siw the passive side's QP is in RTS when `rdma_accept` returns, and programs
/// post at once without waiting for ESTABLISHED (perftest's `ib_write_lat` server posts
/// its first RDMA Write right after accepting).
fn wait_ready_to_send(q: &sw::Qp) {
    let deadline = std::time::Instant::now() + ACCEPT_RTS_WAIT;
    while matches!(
        q.state(),
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
/// perftest disconnects twice and after its peer. A synchronous id waits for
/// `DISCONNECTED`, unless that event was already handed out (a second call, or one
/// taken with `rdma_get_cm_event`), where librdmacm would wait forever.
pub unsafe extern "C" fn rdma_disconnect(id: *mut RdmaCmId) -> c_int {
    guard("rdma_disconnect", -1, || {
        let mut already = false;
        let r = id_call(id, |r| match r.disconnect() {
            Err(rdma_cm::CmError::InvalidState { .. })
                if r.state() == rdma_cm::IdState::Disconnect =>
            {
                already = true;
                Ok(())
            }
            other => other,
        });
        let Some(o) = IdObj::get(id) else { return r };
        match (r, already) {
            (0, true) if o.s.disconnected.load(Ordering::Acquire) => 0,
            (0, _) => complete(&o),
            (r, _) => r,
        }
    })
});

// ------------------------------------------------------------------ QPs

c_fn!("RDMACM_1.0";
/// `rdma_create_qp(3)`: an RC QP of the id, ready for receives; the capabilities
/// granted and the CQs used are written back into `qp_init_attr`. A NULL `pd` is the
/// id's `pd`: its device's default PD, allocated once per device (librdmacm: one per
/// device). A NULL `send_cq` / `recv_cq` is made by the CM with a completion channel
/// of its own (`id->send_cq`, `id->send_cq_channel`, ...; CQ context: the id; sized
/// `max_send_wr` / `max_recv_wr`) and destroyed by `rdma_destroy_qp`, as librdmacm
/// does. UD, UC and XRC fail with `EOPNOTSUPP` after one warning line.
pub unsafe extern "C" fn rdma_create_qp(id: *mut RdmaCmId, pd: *mut IbvPd, qp_init_attr: *mut IbvQpInitAttr) -> c_int {
    guard("rdma_create_qp", -1, || create_qp(id, pd, qp_init_attr, 0))
});

c_fn!("RDMACM_1.0";
/// `rdma_create_qp_ex(3)`: as `rdma_create_qp` with the PD of the extended attributes
/// (`IBV_QP_INIT_ATTR_PD`) and the `ibv_wr_*` API for `send_ops_flags`
/// (`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, as `ibv_create_qp_ex`); any other `comp_mask`
/// bit (create flags, ...) is `EOPNOTSUPP`.
pub unsafe extern "C" fn rdma_create_qp_ex(id: *mut RdmaCmId, attr: *mut c_void) -> c_int {
    guard("rdma_create_qp_ex", -1, || {
        if attr.is_null() {
            return fail(libc::EINVAL);
        }
        // `struct ibv_qp_init_attr_ex` starts as `struct ibv_qp_init_attr` (up to
        // `sq_sig_all`), then `comp_mask` (u32, offset 60) and `pd` (offset 64).
        // SAFETY: contract 3: `attr` is a readable `struct ibv_qp_init_attr_ex`.
        let (mask, pd, ops) = unsafe {
            let b = attr.cast::<u8>();
            (
                std::ptr::read_unaligned(b.add(60).cast::<u32>()),
                std::ptr::read_unaligned(b.add(64).cast::<*mut IbvPd>()),
                std::ptr::read_unaligned(b.add(128).cast::<u64>()),
            )
        };
        use crate::abi::{IBV_QP_INIT_ATTR_PD, IBV_QP_INIT_ATTR_SEND_OPS_FLAGS};
        if mask & !(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        let pd = if mask & IBV_QP_INIT_ATTR_PD != 0 { pd } else { std::ptr::null_mut() };
        let ops = if mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 { ops } else { 0 };
        create_qp(id, pd, attr.cast(), ops)
    })
});

/// The CQs and completion channels the CM made for an id (`id->send_cq`, ...), as
/// addresses: librdmacm's `ucma_create_cqs` / `ucma_destroy_cqs`.
#[derive(Default, Clone, Copy)]
struct CmCqs {
    send_chan: usize,
    send_cq: usize,
    recv_chan: usize,
    recv_cq: usize,
}

impl CmCqs {
    /// The ones in `id`'s C fields.
    fn of(o: &IdObj) -> CmCqs {
        let _c = lock(&o.s.c_lock);
        o.with_c(|c| CmCqs {
            send_chan: c.send_cq_channel as usize,
            send_cq: c.send_cq as usize,
            recv_chan: c.recv_cq_channel as usize,
            recv_cq: c.recv_cq as usize,
        })
    }

    /// Writes them into `id`'s C fields.
    fn store(self, o: &IdObj) {
        let _c = lock(&o.s.c_lock);
        o.update_c(|c| {
            c.send_cq_channel = self.send_chan as *mut IbvCompChannel;
            c.send_cq = self.send_cq as *mut IbvCq;
            c.recv_cq_channel = self.recv_chan as *mut IbvCompChannel;
            c.recv_cq = self.recv_cq as *mut IbvCq;
        });
    }

    /// Makes the missing ones of `id` on its context `ctx`: a receive CQ of `recv`
    /// entries and a send CQ of `send` (0: none), each with its own channel, written
    /// into the id's fields as they are made (so a failure leaves them to
    /// [`CmCqs::destroy`]).
    fn make(
        mut self,
        o: &IdObj,
        ctx: *mut IbvContext,
        send: u32,
        recv: u32,
    ) -> Result<CmCqs, c_int> {
        if recv > 0 && self.recv_cq == 0 {
            (self.recv_chan, self.recv_cq) = CmCqs::one(o, ctx, recv)?;
            self.store(o);
        }
        if send > 0 && self.send_cq == 0 {
            (self.send_chan, self.send_cq) = CmCqs::one(o, ctx, send)?;
            self.store(o);
        }
        Ok(self)
    }

    /// A completion channel and a CQ of `n` entries on it (context: the id).
    fn one(o: &IdObj, ctx: *mut IbvContext, n: u32) -> Result<(usize, usize), c_int> {
        // SAFETY: `ctx` is the id's live context (ours).
        let ch = unsafe { crate::ibv::ibv_create_comp_channel(ctx) };
        if ch.is_null() {
            return Err(crate::boundary::errno());
        }
        let cqe = c_int::try_from(n).unwrap_or(c_int::MAX);
        // SAFETY: as above; `ch` was just made, the CQ context is the id's handle.
        let cq = unsafe { crate::ibv::ibv_create_cq(ctx, cqe, o.ptr().cast::<c_void>(), ch, 0) };
        if cq.is_null() {
            let e = crate::boundary::errno();
            // SAFETY: `ch` is ours, with no CQ.
            unsafe { crate::ibv::ibv_destroy_comp_channel(ch) };
            return Err(e);
        }
        Ok((ch as usize, cq as usize))
    }

    /// Destroys them (the QP on them is gone), leaving the id's fields NULL.
    fn destroy(self, o: &IdObj) {
        // SAFETY (each call): NULL or handles the CM made; the calls check them.
        unsafe {
            if self.recv_cq != 0 {
                crate::ibv::ibv_destroy_cq(self.recv_cq as *mut IbvCq);
            }
            if self.send_cq != 0 && self.send_cq != self.recv_cq {
                crate::ibv::ibv_destroy_cq(self.send_cq as *mut IbvCq);
            }
            if self.recv_chan != 0 {
                crate::ibv::ibv_destroy_comp_channel(self.recv_chan as *mut IbvCompChannel);
            }
            if self.send_chan != 0 && self.send_chan != self.recv_chan {
                crate::ibv::ibv_destroy_comp_channel(self.send_chan as *mut IbvCompChannel);
            }
        }
        CmCqs::default().store(o);
    }
}

/// `rdma_create_qp` on a checked `attr`, with the `ibv_wr_*` API for `ops` (its
/// `send_ops_flags`; `EOPNOTSUPP` beyond `crate::ex::SUPPORTED_SEND_OPS`).
pub(crate) fn create_qp(
    id: *mut RdmaCmId,
    pd: *mut IbvPd,
    attr: *mut IbvQpInitAttr,
    ops: u64,
) -> c_int {
    if ops & !crate::ex::SUPPORTED_SEND_OPS != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    let Some(o) = IdObj::get(id) else {
        return fail(libc::EINVAL);
    };
    let Some(r) = o.s.id_ref() else {
        return fail(libc::EINVAL);
    };
    // SAFETY: contract 3: NULL or the application's attributes, ours for the call.
    let Some(a) = (unsafe { obj_mut(attr) }) else {
        return fail(libc::EINVAL);
    };
    if let Err(e) = crate::ibv::refuse_qp_type("rdma_create_qp", a.qp_type) {
        return fail(e);
    }
    let (id_pd, verbs, has_qp) = {
        let _c = lock(&o.s.c_lock);
        o.with_c(|c| (c.pd, c.verbs, !c.qp.is_null()))
    };
    if has_qp {
        return fail(libc::EINVAL);
    }
    let pd = if pd.is_null() { id_pd } else { pd };
    let Some(p) = PdObj::get(pd) else {
        return fail(libc::EINVAL);
    };
    // The PD must be of the id's device (librdmacm: of `id->verbs`); an id on no device
    // yet is the CM's error.
    let dev = id_device(&r);
    if r.device().is_some() && dev.map(|s| s.index) != Some(p.s.ctx.s.dev) {
        return fail(libc::EINVAL);
    }
    // The CM's CQs, for the ones not given (librdmacm's `ucma_create_cqs`); a given CQ
    // other than one the CM made is `EINVAL`.
    let had = CmCqs::of(&o);
    let clash =
        |mine: usize, given: *mut IbvCq| mine != 0 && !given.is_null() && mine != given as usize;
    if clash(had.recv_cq, a.recv_cq) || clash(had.send_cq, a.send_cq) {
        return fail(libc::EINVAL);
    }
    let want =
        |given: *mut IbvCq, mine: usize, n: u32| if given.is_null() && mine == 0 { n } else { 0 };
    let made = if verbs.is_null() {
        Ok(had)
    } else {
        had.make(
            &o,
            verbs,
            want(a.send_cq, had.send_cq, a.cap.max_send_wr),
            want(a.recv_cq, had.recv_cq, a.cap.max_recv_wr),
        )
    };
    let cqs = match made {
        Ok(c) => c,
        Err(e) => {
            CmCqs::of(&o).destroy(&o);
            return fail(e);
        }
    };
    cqs.store(&o);
    if a.send_cq.is_null() {
        a.send_cq = cqs.send_cq as *mut IbvCq;
    }
    if a.recv_cq.is_null() {
        a.recv_cq = cqs.recv_cq as *mut IbvCq;
    }
    let made_qp = match crate::ibv::qp_parts(a, &p) {
        None => Err(libc::EINVAL),
        Some(parts) => match r.create_qp(&p.s.pd, parts.init()) {
            Ok(qp) => Ok(crate::ibv::qp_obj_ex(
                qp,
                a,
                Some(r),
                parts.uses,
                ops,
                |x| crate::ex::set_wr_ops(x, ops),
            )),
            Err(e) => Err(e.errno()),
        },
    };
    match made_qp {
        Ok(q) => {
            let _c = lock(&o.s.c_lock);
            o.update_c(|c| {
                c.qp = q;
                c.pd = pd;
            });
            0
        }
        Err(e) => {
            // librdmacm destroys the id's CQs when the QP cannot be made.
            CmCqs::of(&o).destroy(&o);
            fail(e)
        }
    }
}

c_fn!("RDMACM_1.0";
/// `rdma_destroy_qp(3)`: the id's QP, then the CQs and completion channels the CM
/// made for it (nothing for an id that is not live, or whose QP is gone).
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut RdmaCmId) {
    guard("rdma_destroy_qp", (), || {
        let Some(o) = IdObj::get(id) else { return };
        let qp: *mut IbvQp = {
            let _c = lock(&o.s.c_lock);
            let qp = o.with_c(|c| c.qp);
            o.update_c(|c| c.qp = std::ptr::null_mut());
            qp
        };
        if let Some(q) = QpObj::take(qp.cast()) {
            crate::ibv::destroy_qp_obj(q);
        }
        CmCqs::of(&o).destroy(&o);
    })
});

// ------------------------------------------------------------------ events

/// The non-blocking step of `rdma_get_cm_event(3)` (`src/blocking.c`;
/// [`crate::blocking`]): 0 with `*event` written (acknowledge it with
/// `rdma_ack_cm_event`); -1 with `EINVAL` if not a live channel, `EAGAIN` if none and
/// the channel's fd is `O_NONBLOCK`; otherwise [`crate::blocking::WAIT`] with `*fd` to
/// block on. `retry` is non-zero after a wait of the same call: a channel destroyed
/// meanwhile is then waited on for ever (as a read of librdmacm's closed fd), not
/// `EINVAL`.
///
/// # Safety
///
/// The pointer contract of [`crate::boundary`].
#[no_mangle]
pub unsafe extern "C" fn swi_get_cm_event_try(
    channel: *mut RdmaEventChannel,
    event: *mut *mut RdmaCmEvent,
    retry: c_int,
    fd: *mut c_int,
) -> c_int {
    guard("rdma_get_cm_event", -1, || {
        // Our own reference while this step runs; the wait is on a dup of the fd.
        let Some(sh) = live_channel(channel) else {
            if retry != 0 {
                // Destroyed while this call waited (see below).
                return crate::blocking::wait_forever(fd);
            }
            return fail(libc::EINVAL);
        };
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        while let Some(ev) = sh.take() {
            if let Some(e) = make_event(ev) {
                // SAFETY: contract 3.
                unsafe { write_out(event, e) };
                return 0;
            }
        }
        let raw = std::os::fd::AsRawFd::as_raw_fd(&sh.waker.fd);
        if ChanObj::get(channel).is_none() {
            if crate::boundary::is_nonblocking(raw) {
                // Never blocks: the channel is gone.
                return fail(libc::EINVAL);
            }
            // The channel was destroyed under this call: as a read blocked on
            // librdmacm's closed fd, it never returns (a signal or a cancellation
            // still ends it). rping destroys its channel at exit while its CM thread
            // waits here; returning an error made that thread exit(255) before main
            // returned 0.
            return crate::blocking::wait_forever(fd);
        }
        crate::blocking::wait_on(raw, fd)
    })
}

/// The next event of the channel `channel` (its state `sh`, which the caller holds),
/// handed out to this thread: blocking until one comes, `Err(EAGAIN)` at once if the
/// fd is `O_NONBLOCK`.
pub(crate) fn get_event(
    channel: *mut RdmaEventChannel,
    sh: &ChanShared,
) -> Result<*mut RdmaCmEvent, c_int> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sh.waker.fd);
    loop {
        if let Some(ev) = sh.take() {
            if let Some(e) = make_event(ev) {
                return Ok(e);
            }
            continue;
        }
        let nonblocking = crate::boundary::is_nonblocking(fd);
        if ChanObj::get(channel).is_none() {
            if nonblocking {
                // Never blocks: the channel is gone.
                return Err(libc::EINVAL);
            }
            // The channel was destroyed under this call: as a read blocked on
            // librdmacm's closed fd, it never returns. rping destroys its channel
            // at exit while its CM thread waits here; returning an error made that
            // thread exit(255) before main returned 0.
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        if nonblocking {
            return Err(libc::EAGAIN);
        }
        crate::boundary::wait_readable(fd)?;
    }
}

/// librdmacm's `ucma_complete`, after a call of a synchronous id that produces an
/// event (`rdma_resolve_addr`, `rdma_resolve_route`, `rdma_connect`, `rdma_accept`,
/// `rdma_disconnect`): acks the event in `id->event`, waits for the next event of the
/// id's own channel and leaves it in `id->event`; a non-zero status is the call's
/// error (`REJECTED`: `ECONNREFUSED`; a negative status: its errno). 0 at once for an
/// id with a channel of the program's.
pub(crate) fn complete(o: &IdObj) -> c_int {
    if !o.s.sync.load(Ordering::Acquire) {
        return 0;
    }
    ack_id_event(o);
    let chan = {
        let _c = lock(&o.s.c_lock);
        o.with_c(|c| c.channel)
    };
    let Some(sh) = o.s.chan() else {
        return fail(libc::EINVAL);
    };
    let e = match get_event(chan, &sh) {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    {
        let _c = lock(&o.s.c_lock);
        o.update_c(|c| c.event = e);
    }
    let (kind, status) = EventObj::get(e).map_or((0, 0), |ev| ev.with_c(|c| (c.event, c.status)));
    match status {
        0 => 0,
        _ if kind == CmEventKind::Rejected.to_raw() => fail(libc::ECONNREFUSED),
        s if s < 0 => fail(-s),
        s => fail(s),
    }
}

/// Acks the event a synchronous call left in `id->event`, if any (librdmacm's
/// `ucma_complete` and `rdma_destroy_id` do so first).
pub(crate) fn ack_id_event(o: &IdObj) {
    let ev = {
        let _c = lock(&o.s.c_lock);
        let ev = o.with_c(|c| c.event);
        o.update_c(|c| c.event = std::ptr::null_mut());
        ev
    };
    if !ev.is_null() {
        ack_event(ev);
    }
}

/// An event of `owner` counted as held by `holder` (`IdState::held`) until it is
/// handed out; dropped before that (the event is dropped too), it is uncounted.
struct Hold {
    owner: Arc<IdObj>,
    holder: std::thread::ThreadId,
    handed_out: bool,
}

impl Hold {
    /// Counts an event of the live id `serial` as held by this thread, in one step
    /// with the lookup (under the lock of the live ids, which `rdma_destroy_id` takes
    /// to remove the id): a destroy either removed the id first (`None`: the event is
    /// dropped) or finds the event held and waits for its ack. No event of an id is
    /// returned after its `rdma_destroy_id` returned.
    fn take(serial: u64) -> Option<Hold> {
        let holder = std::thread::current().id();
        let ids = lock(ids());
        let owner = ids.get(&serial)?.clone();
        lock(&owner.s.held).push(holder);
        Some(Hold {
            owner,
            holder,
            handed_out: false,
        })
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.handed_out {
            unhold(&self.owner, self.holder);
        }
    }
}

/// Uncounts one event of `owner` held by `holder` (acked, or never handed out) and
/// wakes a `rdma_destroy_id` waiting for it.
fn unhold(owner: &IdObj, holder: std::thread::ThreadId) {
    {
        let mut held = lock(&owner.s.held);
        if let Some(i) = held.iter().position(|t| *t == holder) {
            held.swap_remove(i);
        }
    }
    owner.s.acked.notify_all();
}

/// The C event of `ev`, handed out to this thread; `None` if its id is gone (the event
/// is dropped: acked).
fn make_event(mut ev: ChannelEvent<SoftDevice>) -> Option<*mut RdmaCmEvent> {
    let kind = sw::cm::provider::kind_to_neutral(ev.kind);
    // librdmacm: a connect request counts against its listener.
    let (id, listen, mut hold) = if let Some(newid) = ev.take_new_id() {
        let hold = Hold::take(ev.listener()?.serial())?;
        let lo = hold.owner.clone();
        let (chan, context, ps) = {
            let _c = lock(&lo.s.c_lock);
            lo.with_c(|c| (c.channel, c.context, c.ps))
        };
        let req = (ev.responder_resources, ev.initiator_depth);
        // librdmacm (`ucma_process_conn_req`): the new id of a synchronous listener is
        // synchronous, moved to a channel of its own at once; when that fails the
        // request is dropped (the new id destroyed: the request is rejected).
        let sync = lo.s.sync.load(Ordering::Acquire);
        let (chan, sh, own) = if sync {
            let c = new_channel().ok()?;
            let moved = lock(&c.s.shared)
                .clone()
                .filter(|sh| newid.migrate(&sh.ch).is_ok());
            let Some(sh) = moved else {
                if let Some(c) = ChanObj::take(c.ptr()) {
                    destroy_channel(c);
                }
                return None;
            };
            (c.ptr(), sh, Some(c))
        } else {
            (chan, lo.s.chan()?, None)
        };
        (
            new_id_obj(newid, chan, sh, own, context, ps, req),
            Some(lo),
            hold,
        )
    } else {
        let hold = Hold::take(ev.id().serial())?;
        let o = hold.owner.clone();
        refresh(&o);
        (o, None, hold)
    };
    if kind == CmEventKind::Disconnected {
        id.s.disconnected.store(true, Ordering::Release);
    }
    let mut c: RdmaCmEvent = zeroed();
    c.id = id.ptr();
    c.listen_id = listen.as_ref().map_or(std::ptr::null_mut(), |l| l.ptr());
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
    hold.handed_out = true;
    let e = EventObj::new(
        c,
        EventState {
            ev: Mutex::new(Some(ev)),
            owner: hold.owner.clone(),
            id,
            holder: hold.holder,
        },
    );
    Some(EventObj::publish(&e))
}

c_fn!("RDMACM_1.0";
/// `rdma_ack_cm_event(3)`: -1 with `EINVAL` if not an event handed out and not yet
/// acked.
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut RdmaCmEvent) -> c_int {
    guard("rdma_ack_cm_event", -1, || {
        if ack_event(event) {
            0
        } else {
            fail(libc::EINVAL)
        }
    })
});

/// Acks `event` if it is an event handed out and not yet acked (false otherwise).
fn ack_event(event: *mut RdmaCmEvent) -> bool {
    let Some(e) = EventObj::take(event) else {
        return false;
    };
    // Acked for the rdma-cm crate; the private data goes with it.
    drop(lock(&e.s.ev).take());
    e.update_c(|c| {
        c.param.conn.private_data = std::ptr::null();
        c.param.conn.private_data_len = 0;
    });
    unhold(&e.s.owner, e.s.holder);
    EventObj::bury(e);
    true
}

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
/// `rdma_get_devices(3)`: each device's context of CM ids, NULL-terminated.
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut IbvContext {
    guard("rdma_get_devices", std::ptr::null_mut(), || {
        let ctxs: Vec<usize> = crate::context::devices()
            .iter()
            .map(|s| s.cm_ctx() as usize)
            .collect();
        let n = c_int::try_from(ctxs.len()).unwrap_or(c_int::MAX);
        // SAFETY: contract 3.
        unsafe { write_out(num_devices, n) };
        into_raw_list(&ctxs).cast::<*mut IbvContext>()
    })
});

c_fn!("RDMACM_1.0";
/// `rdma_free_devices(3)`.
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut IbvContext) {
    guard("rdma_free_devices", (), || {
        if !list.is_null() {
            // SAFETY: contract 1: a list of ours, made by `into_raw_list`.
            unsafe { free_list(list.cast::<usize>()) };
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

/// One `rdma_addrinfo` and the addresses it points to.
#[repr(C)]
struct AddrInfoObj {
    c: RdmaAddrinfo,
    sa: libc::sockaddr_in,
    src: libc::sockaddr_in,
}

c_fn!("RDMACM_1.0";
/// `rdma_getaddrinfo(3)`: one IPv4 result (`RAI_PASSIVE`: the source address, else the
/// destination, with the hints' source address if they have one, as librdmacm), the
/// hints' QP type and port space (RC, `RDMA_PS_TCP` where they have none; others are
/// refused when an id is made of them). Names are resolved by the system resolver.
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
        let or = |v: c_int, dflt: c_int| if v != 0 { v } else { dflt };
        c.ai_qp_type = or(hints.map_or(0, |h| h.ai_qp_type), IBV_QPT_RC);
        c.ai_port_space = or(hints.map_or(0, |h| h.ai_port_space), RDMA_PS_TCP);
        // An active result keeps the hints' source address (librdmacm; cmtime's and
        // udaddy's `-b`).
        let hint_src = match hints.filter(|h| !passive && h.ai_src_len > 0) {
            // SAFETY: contract 3: the hints' address.
            Some(h) => match unsafe { read_sockaddr(h.ai_src_addr) } {
                Ok(Some(SocketAddr::V4(a))) => Some(a),
                Ok(_) | Err(_) => return fail(libc::EINVAL),
            },
            None => None,
        };
        let p = into_raw(AddrInfoObj {
            c,
            sa: sockaddr_in(SocketAddrV4::new(ip, port)),
            src: sockaddr_in(hint_src.unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))),
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
                if hint_src.is_some() {
                    (*p).c.ai_src_addr = std::ptr::addr_of_mut!((*p).src).cast::<libc::sockaddr>();
                    (*p).c.ai_src_len = len;
                }
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
