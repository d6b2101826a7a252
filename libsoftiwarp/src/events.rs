//! Asynchronous events (`ibv_get_async_event(3)`, `ibv_ack_async_event(3)`): the open
//! contexts, the map from the soft device's CQ and SRQ handles and QP numbers to ours,
//! and the thread per device that moves the device's events
//! (`softiwarp::Device::next_async_event`) to the contexts of the objects they name.
//! Below [`crate::device`] (which starts the thread of each device), [`crate::ibv`]
//! (whose entry points register and forget objects) and [`crate::context`] (which
//! records each new context and forgets a closed one).
//!
//! Pointer rules: [`crate::boundary`]'s contract. Every entry point runs in
//! [`guard`].

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use cxgb4::ffi::types::{IbvAsyncEvent, IbvContext};
use verbs::AsyncEvent;

use crate::abi::{IbvCqEx, IbvQpEx, IbvSrq};
use crate::boundary::{c_fn, guard, minus_one, obj, write_out};
use crate::objects::{lock, AsyncItem, CqObj, CtxObj, QpObj, SrqObj};

/// The kinds of soft objects an asynchronous event names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum SoftKind {
    /// A CQ, by its soft handle.
    Cq,
    /// A QP, by its number.
    Qp,
    /// An SRQ, by its soft handle.
    Srq,
}

/// A soft object: its device's index, its kind, its handle or number on the device.
pub(crate) type SoftKey = (usize, SoftKind, u32);

/// Runs `f` on the map from the soft objects' handles and numbers to ours.
pub(crate) fn soft_objects<R>(f: impl FnOnce(&mut HashMap<SoftKey, usize>) -> R) -> R {
    static M: OnceLock<Mutex<HashMap<SoftKey, usize>>> = OnceLock::new();
    f(&mut lock(M.get_or_init(Default::default)))
}

/// The open contexts (port and device events go to each).
fn contexts() -> &'static Mutex<Vec<Weak<CtxObj>>> {
    static C: OnceLock<Mutex<Vec<Weak<CtxObj>>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// Events a context keeps for `ibv_get_async_event` at most (the oldest go first: the
/// context of CM ids may have no reader at all).
pub const ASYNC_QUEUE: usize = 1024;

/// Starts the thread that moves the asynchronous events of `device`, the `dev`th of
/// the list (`softiwarp::Device::next_async_event`), to the contexts of the objects
/// they name; it ends with the device.
pub fn start_async_events(dev: usize, device: Arc<sw::Device>) {
    let spawned = std::thread::Builder::new()
        .name(format!("swasync-{dev}"))
        .spawn(move || loop {
            let t0 = Instant::now();
            match device.next_async_event(Duration::from_secs(1)) {
                Some(ev) => deliver_async_event(dev, ev),
                // The device ended and every event was taken: nothing more comes.
                None if t0.elapsed() < Duration::from_millis(500) => return,
                None => {}
            }
        });
    if let Err(e) = spawned {
        eprintln!("libsoftiwarp: no asynchronous events: {e}");
    }
}

/// Queues `ev` of the `dev`th device on the context of the object it names (every open
/// context of the device for port and device events); events of objects already
/// destroyed are dropped.
fn deliver_async_event(dev: usize, ev: AsyncEvent) {
    let event_type = ev.event_type().to_ibv();
    let named = |kind, n| soft_objects(|m| m.get(&(dev, kind, n)).copied());
    let target = match ev {
        AsyncEvent::CqErr { cq } => named(SoftKind::Cq, cq)
            .and_then(|a| CqObj::get(a as *const IbvCqEx))
            .map(|c| (c.s.ctx.clone(), c.addr())),
        AsyncEvent::SrqLimitReached { srq } => named(SoftKind::Srq, srq)
            .and_then(|a| SrqObj::get(a as *const IbvSrq))
            .map(|o| (o.s.ctx.clone(), o.addr())),
        AsyncEvent::QpFatal { qp_num }
        | AsyncEvent::QpReqErr { qp_num }
        | AsyncEvent::QpAccessErr { qp_num }
        | AsyncEvent::CommEst { qp_num }
        | AsyncEvent::SqDrained { qp_num }
        | AsyncEvent::QpLastWqeReached { qp_num } => named(SoftKind::Qp, qp_num)
            .and_then(|a| QpObj::get(a as *const IbvQpEx))
            .map(|q| (q.s.ctx.clone(), q.addr())),
        AsyncEvent::PortActive { port } | AsyncEvent::PortErr { port } => {
            return to_every_context(
                dev,
                AsyncItem {
                    event_type,
                    element: usize::from(port),
                },
            )
        }
        _ => {
            return to_every_context(
                dev,
                AsyncItem {
                    event_type,
                    element: 0,
                },
            )
        }
    };
    if let Some((ctx, element)) = target {
        if let Some(q) = lock(&ctx.s.events).clone() {
            q.push_bounded(
                AsyncItem {
                    event_type,
                    element,
                },
                ASYNC_QUEUE,
            );
        }
    }
}

/// Queues `item` on every open context of the `dev`th device.
fn to_every_context(dev: usize, item: AsyncItem) {
    let ctxs: Vec<Arc<CtxObj>> = {
        let mut c = lock(contexts());
        c.retain(|w| w.strong_count() > 0);
        c.iter()
            .filter_map(Weak::upgrade)
            .filter(|c| c.s.dev == dev)
            .collect()
    };
    for ctx in ctxs {
        if let Some(q) = lock(&ctx.s.events).clone() {
            q.push_bounded(item, ASYNC_QUEUE);
        }
    }
}

/// Records a new context for port and device events (and forgets the contexts gone
/// meanwhile: a `Weak` keeps its object's memory allocated).
pub fn add_context(ctx: &Arc<CtxObj>) {
    let mut c = lock(contexts());
    c.retain(|w| w.strong_count() > 0);
    c.push(Arc::downgrade(ctx));
}

/// How many contexts port and device events go to (the open ones; tests check that a
/// closed context leaves nothing behind).
pub fn event_contexts() -> usize {
    lock(contexts()).len()
}

/// Forgets the closed context `ctx` (its struct lives on in the graveyard, but no event
/// goes to it any more).
pub(crate) fn remove_context(ctx: &Arc<CtxObj>) {
    lock(contexts())
        .retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(ctx)));
}

/// Drops the queued asynchronous events of the object at `addr` (being destroyed).
pub(crate) fn forget_async_events(ctx: &CtxObj, addr: usize) {
    if let Some(q) = lock(&ctx.s.events).clone() {
        q.retain(|i| !(i.element == addr && names_object(i.event_type)));
    }
}

/// True for the event types whose element is a CQ or QP (not a port number).
fn names_object(event_type: u32) -> bool {
    !matches!(
        verbs::AsyncEventType::from_ibv(event_type),
        Some(
            verbs::AsyncEventType::PortActive
                | verbs::AsyncEventType::PortErr
                | verbs::AsyncEventType::DeviceFatal
        )
    )
}

/// The non-blocking step of `ibv_get_async_event(3)` (`src/blocking.c`;
/// [`crate::blocking`]): 0 with `*event` written (the next asynchronous event of the
/// context's objects: a CQ overrun `IBV_EVENT_CQ_ERR` with `element.cq`, a QP that went
/// to Error `IBV_EVENT_QP_FATAL` / `_REQ_ERR` / `_ACCESS_ERR` with `element.qp`, ...);
/// -1 with `EINVAL` for a context that is not open or a NULL `event`, `EAGAIN` if none
/// and `async_fd` is `O_NONBLOCK`; otherwise [`crate::blocking::WAIT`] with `*fd` to
/// block on. `async_fd` is readable exactly while an event waits.
///
/// # Safety
///
/// The pointer contract of [`crate::boundary`].
#[no_mangle]
pub unsafe extern "C" fn swi_get_async_event_try(
    context: *mut IbvContext,
    event: *mut IbvAsyncEvent,
    fd: *mut c_int,
) -> c_int {
    guard("ibv_get_async_event", -1, || {
        let Some(q) = CtxObj::get(context).and_then(|c| lock(&c.s.events).clone()) else {
            return minus_one(libc::EINVAL);
        };
        if event.is_null() {
            return minus_one(libc::EINVAL);
        }
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
        crate::blocking::wait_on(q.raw_fd(), fd)
    })
}

/// Adds `delta` to the count of unacknowledged asynchronous events of the context of
/// the object `item` names (nothing for port and device events, or a destroyed object).
fn count_async_event(item: &AsyncItem, delta: isize) {
    let ctx = if !names_object(item.event_type) {
        None
    } else if item.event_type == verbs::AsyncEventType::CqErr.to_ibv() {
        CqObj::get(item.element as *const IbvCqEx).map(|c| c.s.ctx.clone())
    } else if item.event_type == verbs::AsyncEventType::SrqLimitReached.to_ibv() {
        SrqObj::get(item.element as *const IbvSrq).map(|o| o.s.ctx.clone())
    } else {
        QpObj::get(item.element as *const IbvQpEx).map(|q| q.s.ctx.clone())
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
