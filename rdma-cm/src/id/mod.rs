//! rdma_cm ids: the user's handles ([`CmId`], [`CmIdRef`]), the per-id callback
//! serialization (cma.c's `handler_mutex`), event delivery, destroy, and the per-id
//! part of device removal.
//!
//! # Locks
//!
//! Each id has three locks:
//!
//! * `handler_lock` — cma.c's `handler_mutex`: held while an event of the id is
//!   committed and its callback runs (or it is queued on a channel). Destroy takes it
//!   to wait for a callback in progress; device removal takes it to serialize
//!   `DeviceRemoval` with every other callback. The thread-local "held" list
//!   (`sync::push_held`) records it, so that destroying an id from inside its own
//!   callback is detected instead of deadlocking.
//! * `ops` — serializes the user's calls on the id (bind, resolve, connect, accept,
//!   ...), and holds the id's iWARP CM id. Held across iw-cm downcalls and device
//!   calls, which never wait for a callback.
//! * `st` — the state and everything else, held briefly, never across a call out.
//!
//! Order: `handler_lock` -> `ops` -> `st` -> (registry, device entry). A listener's
//! `handler_lock` is taken before the new id's (the new id is locked before any other
//! thread can see it). Nothing holds `st` while taking `handler_lock` or `ops`.
//!
//! # State changes that race callbacks
//!
//! As in cma.c, `destroy` and device removal *first* mark the id (`DESTROYING` /
//! `DEVICE_REMOVAL`, under `st`), then take `handler_lock` to wait for a callback in
//! progress. Every delivery checks the state under `handler_lock` before calling out,
//! so once an id is marked nothing new is delivered, except the one `DeviceRemoval`
//! whose own check sees `DEVICE_REMOVAL` still there.

use crate::channel::{ChanInner, Queued};
use crate::device::{CmDevice, NeighborDone, NeighborRequest, NeighborResult, QpOf, ResolveError};
use crate::error::CmError;
use crate::event::{map_iw_event, CmEvent, Disposition, EventKind, Handler, IwEventKind};
use crate::machine::{step, IdState, Input, IwInput, Refused, StateCell};
use crate::registry::{bump, sub, DevEntry, Job, RuleBreak, Shared};
use crate::route::RouteError;
use crate::sync::{self, lock, wait, Arc, Condvar, Mutex, MutexGuard};
use core::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

pub(crate) type IwId<D> = iw_cm::CmId<<D as CmDevice>::Provider>;
type IwHandler<D> = std::sync::Arc<dyn iw_cm::EventHandler<<D as CmDevice>::Provider>>;

/// Where an id's events go.
pub(crate) enum Delivery<D: CmDevice> {
    /// A callback (the kernel's `event_handler`).
    Callback(std::sync::Arc<dyn Handler<D>>),
    /// An event channel (librdmacm's `rdma_event_channel`).
    Channel(Arc<ChanInner<D>>),
    /// Nowhere: internal listeners, and every id once destroyed (the user's handler is
    /// dropped at destroy).
    Inert,
}

impl<D: CmDevice> Clone for Delivery<D> {
    fn clone(&self) -> Self {
        match self {
            Delivery::Callback(h) => Delivery::Callback(h.clone()),
            Delivery::Channel(c) => Delivery::Channel(c.clone()),
            Delivery::Inert => Delivery::Inert,
        }
    }
}

/// What an id is for.
pub(crate) enum Role<D: CmDevice> {
    /// The user's id (or a new id made for a connect request).
    User,
    /// An internal per-device listener of a wildcard listen (cma.c's `internal_id`,
    /// made by `cma_listen_on_dev`): never seen by the user, destroyed silently on
    /// device removal.
    Internal {
        /// The user's wildcard listener.
        parent: Arc<IdInner<D>>,
    },
}

pub(crate) struct IdSt<D: CmDevice> {
    /// Written only through [`IdInner::exch`] ([`StateCell::exch`]).
    pub(crate) state: StateCell,
    pub(crate) delivery: Delivery<D>,
    pub(crate) device: Option<Arc<DevEntry<D>>>,
    qp: Option<QpOf<D>>,
    local: Option<SocketAddrV4>,
    peer: Option<SocketAddrV4>,
    /// A port reservation (bound or listening ids).
    port: Option<(Ipv4Addr, u16)>,
    backlog: u32,
    /// A listener on the wildcard address: its per-device internal listeners.
    wildcard: bool,
    internal: Vec<(u64, Arc<IdInner<D>>)>,
    /// Events handed out by an event channel and not acked yet: (sequence, thread
    /// token of the thread that took it).
    pub(crate) unacked: Vec<(u64, u64)>,
    /// The id's `CmId` was dropped inside its own callback: destroy it when the
    /// callback returns.
    destroy_on_return: bool,
    /// Generation of the address/route query in flight.
    query_gen: u64,
    /// Made for a connect request (passive side).
    passive: bool,
    accepted: bool,
    next_hop: Option<Ipv4Addr>,
}

/// The shared part of an rdma_cm id (cma.c's `rdma_id_private`).
pub(crate) struct IdInner<D: CmDevice> {
    pub(crate) serial: u64,
    pub(crate) shared: Arc<Shared<D>>,
    pub(crate) role: Role<D>,
    handler_lock: Mutex<()>,
    pub(crate) st: Mutex<IdSt<D>>,
    ops: Mutex<Option<IwId<D>>>,
    pub(crate) ack_cv: Condvar,
    pub(crate) span: tracing::Span,
}

/// The handler lock of one id, held by this thread (recorded in the thread's "held"
/// list until dropped).
pub(crate) struct HandlerGuard<'a> {
    _g: MutexGuard<'a, ()>,
    serial: u64,
}

impl Drop for HandlerGuard<'_> {
    fn drop(&mut self) {
        sync::pop_held(self.serial);
    }
}

/// Whether the machine accepts `input` in the id's state (a user call's check, made
/// before the work that precedes its write).
fn check<D: CmDevice>(st: &IdSt<D>, input: Input) -> Result<(), CmError> {
    step(st.state.get(), input).map(drop).map_err(CmError::from)
}

fn v4(addr: SocketAddr) -> Result<SocketAddrV4, CmError> {
    match addr {
        SocketAddr::V4(a) => Ok(a),
        SocketAddr::V6(_) => Err(CmError::AddressFamily(addr)),
    }
}

#[cfg(not(loom))]
fn call_handler<D: CmDevice>(
    h: &dyn Handler<D>,
    id: &CmIdRef<D>,
    ev: CmEvent<D>,
    shared: &Shared<D>,
) -> Disposition {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.on_event(id, ev))) {
        Ok(d) => d,
        Err(_) => {
            bump(&shared.counters.handler_panics);
            tracing::error!(
                id = id.serial(),
                "rdma_cm callback panicked; destroying the id"
            );
            Disposition::Destroy
        }
    }
}

/// Under loom a panic is a model failure and must propagate.
#[cfg(loom)]
fn call_handler<D: CmDevice>(
    h: &dyn Handler<D>,
    id: &CmIdRef<D>,
    ev: CmEvent<D>,
    _shared: &Shared<D>,
) -> Disposition {
    h.on_event(id, ev)
}

impl<D: CmDevice> IdInner<D> {
    pub(crate) fn new(
        shared: &Arc<Shared<D>>,
        role: Role<D>,
        delivery: Delivery<D>,
        state: IdState,
    ) -> Arc<IdInner<D>> {
        let serial = shared.next_serial();
        bump(&shared.counters.ids_alive);
        bump(&shared.counters.ids_created);
        let internal = matches!(role, Role::Internal { .. });
        let inner = Arc::new(IdInner {
            serial,
            shared: shared.clone(),
            role,
            handler_lock: Mutex::new(()),
            st: Mutex::new(IdSt {
                state: StateCell::new(state),
                delivery,
                device: None,
                qp: None,
                local: None,
                peer: None,
                port: None,
                backlog: 0,
                wildcard: false,
                internal: Vec::new(),
                unacked: Vec::new(),
                destroy_on_return: false,
                query_gen: 0,
                passive: false,
                accepted: false,
                next_hop: None,
            }),
            ops: Mutex::new(None),
            ack_cv: Condvar::new(),
            span: tracing::debug_span!(parent: None, "rdma_cm_id", id = serial, internal),
        });
        #[cfg(not(loom))]
        shared
            .ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(serial, std::sync::Arc::downgrade(&inner));
        tracing::trace!(parent: &inner.span, %state, "created");
        inner
    }

    /// Take the handler lock (wait for a callback in progress) and record it.
    pub(crate) fn lock_handler(&self) -> HandlerGuard<'_> {
        let g = lock(&self.handler_lock);
        sync::push_held(self.serial);
        HandlerGuard {
            _g: g,
            serial: self.serial,
        }
    }

    pub(crate) fn state(&self) -> IdState {
        lock(&self.st).state.get()
    }

    /// The only writer of the id's state (cma.c's `cma_comp_exch`): apply `input` to
    /// `st` (this id's, locked) through the machine. The state the id left, or the
    /// refusal (state unchanged). See [`StateCell::exch`].
    pub(crate) fn exch(&self, st: &mut IdSt<D>, input: Input) -> Result<IdState, Refused> {
        st.state.exch(input, self.serial, &self.span)
    }

    /// Mark the id `DESTROYING`; `true` if this call did it (then it owns the
    /// teardown).
    fn mark_destroying(&self) -> bool {
        let mut st = lock(&self.st);
        match self.exch(&mut st, Input::Destroy) {
            Ok(from) => {
                tracing::debug!(parent: &self.span, %from, "-> RDMA_CM_DESTROYING");
                true
            }
            Err(_) => false,
        }
    }

    /// The first half of device removal, done as soon as the device reports it
    /// ([`crate::device::DeviceNotifier::removed`]): mark `DEVICE_REMOVAL` unless
    /// destroy was asked, so that no event but the `DeviceRemoval` that
    /// [`Self::remove_id_dev`] delivers reaches the id. Never waits.
    pub(crate) fn mark_device_removal(&self) {
        let mut st = lock(&self.st);
        if let Ok(from) = self.exch(&mut st, Input::DeviceRemovalReported) {
            tracing::debug!(parent: &self.span, %from, "-> RDMA_CM_DEVICE_REMOVAL (device reported removal)");
        }
    }

    fn take_destroy_on_return(&self) -> bool {
        core::mem::take(&mut lock(&self.st).destroy_on_return)
    }

    /// A one-line description for state dumps.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn describe(&self) -> String {
        let st = lock(&self.st);
        format!(
            "rdma_cm id #{}{}: {} device={} local={:?} peer={:?} qp={} unacked={} internal={}",
            self.serial,
            if matches!(self.role, Role::Internal { .. }) {
                " (internal listener)"
            } else {
                ""
            },
            st.state.get(),
            st.device.as_ref().map_or("-", |d| d.name.as_str()),
            st.local,
            st.peer,
            st.qp.is_some(),
            st.unacked.len(),
            st.internal.len(),
        )
    }

    // ------------------------------------------------------------------ delivery

    /// Hand `event` to `delivery` for `id`, whose handler lock is `guard` (`None` only
    /// under [`RuleBreak::UnserializedRemoval`]); destroy the id if the callback says
    /// so. Consumes the guard.
    fn deliver(
        this: &Arc<Self>,
        guard: Option<HandlerGuard<'_>>,
        delivery: Delivery<D>,
        event: CmEvent<D>,
    ) {
        let c = &this.shared.counters;
        let kind = event.kind;
        match delivery {
            Delivery::Callback(h) => {
                bump(&c.callbacks);
                tracing::debug!(parent: &this.span, event = %kind, "callback");
                let r = CmIdRef {
                    inner: this.clone(),
                };
                let d = call_handler(&*h, &r, event, &this.shared);
                drop(h);
                let destroy = d == Disposition::Destroy || this.take_destroy_on_return();
                if destroy {
                    tracing::debug!(parent: &this.span, event = %kind, "destroyed by the callback's return");
                    if this.mark_destroying() {
                        drop(guard);
                        Self::teardown(this);
                    }
                }
                drop(r);
            }
            Delivery::Channel(ch) => {
                tracing::debug!(parent: &this.span, event = %kind, "queued on the event channel");
                ch.push(Queued {
                    id: this.clone(),
                    owner: this.clone(),
                    event,
                });
            }
            Delivery::Inert => {
                bump(&c.events_dropped);
                drop(event);
            }
        }
    }

    // ------------------------------------------------------------------ destroy

    /// `rdma_destroy_id` (`explicit`) or the drop of the user's [`CmId`].
    pub(crate) fn destroy(this: &Arc<Self>, explicit: bool) -> Result<(), CmError> {
        let _span = this.span.enter();
        if sync::holds(this.serial) {
            if explicit {
                tracing::warn!("destroy from inside the id's own callback refused");
                return Err(CmError::DestroyInOwnCallback { id: this.serial });
            }
            // Dropped inside its own callback: the return-destroy path.
            lock(&this.st).destroy_on_return = true;
            return Ok(());
        }
        let token = sync::thread_token();
        let mine = lock(&this.st)
            .unacked
            .iter()
            .filter(|(_, t)| *t == token)
            .count();
        if mine > 0 && explicit {
            tracing::warn!(
                mine,
                "destroy with un-acked events held by this thread refused"
            );
            return Err(CmError::UnackedEvents {
                id: this.serial,
                count: mine,
            });
        }
        if this.mark_destroying() {
            // Wait for a callback in progress (cma.c: lock and unlock handler_mutex).
            // New callbacks see DESTROYING and do not start.
            if !this.shared.breaks(RuleBreak::DestroyNoWait) {
                drop(lock(&this.handler_lock));
            }
            Self::teardown(this);
        }
        if mine == 0 {
            // librdmacm: wait until every event of the id handed out has been acked.
            let mut st = lock(&this.st);
            while !st.unacked.is_empty() {
                st = wait(&this.ack_cv, st);
            }
        }
        Ok(())
    }

    /// Undo everything the id holds (the id is `DESTROYING`, no callback runs on it):
    /// its iWARP CM id (never blocks), internal listeners, QP, port, device binding,
    /// queued channel events; drop the user's handler.
    pub(crate) fn teardown(this: &Arc<Self>) {
        let (device, qp, internal, port, delivery, wildcard) = {
            let mut st = lock(&this.st);
            (
                st.device.take(),
                st.qp.take(),
                core::mem::take(&mut st.internal),
                st.port.take(),
                core::mem::replace(&mut st.delivery, Delivery::Inert),
                core::mem::take(&mut st.wildcard),
            )
        };
        let iw = lock(&this.ops).take();
        if let Some(iw) = iw {
            let _ = iw.destroy();
        }
        this.shared.cancel_timer(this.serial, None);
        if wildcard {
            this.shared.remove_listen_any(this.serial);
        }
        for (_, int) in internal {
            Self::internal_teardown(&int);
        }
        if let Some(qp) = qp {
            match &device {
                Some(entry) => entry.destroy_qp(qp),
                None => drop(qp),
            }
        }
        if let Some((ip, port)) = port {
            this.shared.release_port(ip, port, this.serial);
        }
        if let Some(entry) = device {
            DevEntry::detach(&entry, &this.shared, this.serial);
        }
        if let Delivery::Channel(ch) = &delivery {
            ch.purge(this.serial);
        }
        drop(delivery);
        tracing::debug!(parent: &this.span, "torn down");
    }

    /// Destroy an internal per-device listener, silently.
    pub(crate) fn internal_teardown(int: &Arc<Self>) {
        let device = {
            let mut st = lock(&int.st);
            if int.exch(&mut st, Input::Destroy).is_err() {
                return;
            }
            st.device.take()
        };
        let iw = lock(&int.ops).take();
        if let Some(iw) = iw {
            let _ = iw.destroy();
        }
        if let Role::Internal { parent } = &int.role {
            lock(&parent.st)
                .internal
                .retain(|(_, i)| i.serial != int.serial);
        }
        sub(&int.shared.counters.internal_listeners, 1);
        if let Some(entry) = device {
            DevEntry::detach(&entry, &int.shared, int.serial);
        }
        tracing::debug!(parent: &int.span, "internal listener destroyed");
    }

    // --------------------------------------------------------------- removal

    /// cma.c's `cma_remove_id_dev` for one id of a device being removed: unless destroy
    /// was asked, mark `DEVICE_REMOVAL`, move the QP to ERROR, wait for a callback in
    /// progress, and if the id was not destroyed meanwhile (by that callback's return
    /// or by `destroy`), deliver exactly one `DeviceRemoval`.
    pub(crate) fn remove_id_dev(this: &Arc<Self>, entry: &DevEntry<D>) {
        let _span = this.span.enter();
        let ignore_destroying = this.shared.breaks(RuleBreak::RemovalIgnoresDestroying);
        let (qp, delivery) = {
            let mut st = lock(&this.st);
            match this.exch(&mut st, Input::RemoveIdDev { ignore_destroying }) {
                Ok(from) => tracing::debug!(%from, "-> RDMA_CM_DEVICE_REMOVAL"),
                Err(_) => {
                    tracing::debug!("device removal: destroy already asked; nothing delivered");
                    bump(&this.shared.counters.removals_skipped);
                    return;
                }
            }
            (st.qp.clone(), st.delivery.clone())
        };
        if let Some(qp) = &qp {
            entry.qp_to_error(qp);
        }
        let guard = if this.shared.breaks(RuleBreak::UnserializedRemoval) {
            None
        } else {
            Some(this.lock_handler())
        };
        if this.state() != IdState::DeviceRemoval && !ignore_destroying {
            tracing::debug!(
                "device removal: destroyed by a callback or destroy meanwhile; nothing delivered"
            );
            bump(&this.shared.counters.removals_skipped);
            return;
        }
        bump(&this.shared.counters.device_removals);
        Self::deliver(
            this,
            guard,
            delivery,
            CmEvent::new(EventKind::DeviceRemoval, 0),
        );
    }

    /// `AddrChange` for an id of a device whose addresses changed.
    pub(crate) fn addr_change(this: &Arc<Self>) {
        let guard = this.lock_handler();
        let delivery = {
            let st = lock(&this.st);
            if matches!(st.state.get(), IdState::Destroying | IdState::DeviceRemoval) {
                return;
            }
            st.delivery.clone()
        };
        Self::deliver(
            this,
            Some(guard),
            delivery,
            CmEvent::new(EventKind::AddrChange, 0),
        );
    }

    // ------------------------------------------------------ address and route

    /// The end of an address query (cma.c's `addr_handler`), on the worker.
    pub(crate) fn addr_done(
        this: &Arc<Self>,
        gen: u64,
        entry: Option<Arc<DevEntry<D>>>,
        src: Ipv4Addr,
        next_hop: Ipv4Addr,
        result: NeighborResult,
    ) {
        let _span = this.span.enter();
        this.shared.cancel_timer(this.serial, Some(gen));
        let guard = this.lock_handler();
        let (delivery, event) = {
            let mut st = lock(&this.st);
            if st.state.get() != IdState::AddrQuery || st.query_gen != gen {
                tracing::trace!(state = %st.state.get(), "stale address resolution dropped");
                return;
            }
            st.query_gen += 1;
            let outcome = match (result, entry) {
                (Ok(_), Some(entry)) => {
                    let attached = match &st.device {
                        Some(cur) if cur.serial == entry.serial => Ok(()),
                        Some(_) => Err(ResolveError::NetUnreachable),
                        None => entry.attach(this).map_err(|_| ResolveError::DeviceGone),
                    };
                    attached.map(|()| entry)
                }
                (Ok(_), None) => Err(ResolveError::NetUnreachable),
                (Err(e), _) => Err(e),
            };
            let ev = match outcome {
                Ok(entry) => {
                    let port = st.local.map_or(0, |l| l.port());
                    st.local = Some(SocketAddrV4::new(src, port));
                    st.next_hop = Some(next_hop);
                    st.device = Some(entry);
                    let _ = this.exch(&mut st, Input::AddrResolved);
                    CmEvent::new(EventKind::AddrResolved, 0)
                }
                Err(e) => {
                    tracing::debug!(error = %e, "address resolution failed");
                    let _ = this.exch(&mut st, Input::AddrError);
                    CmEvent::new(EventKind::AddrError, -e.errno())
                }
            };
            (st.delivery.clone(), ev)
        };
        Self::deliver(this, Some(guard), delivery, event);
    }

    /// The end of a route query (cma.c's `cma_work_handler` for iWARP: the route is
    /// the address), on the worker.
    pub(crate) fn route_done(this: &Arc<Self>, gen: u64) {
        let _span = this.span.enter();
        let guard = this.lock_handler();
        let (delivery, event) = {
            let mut st = lock(&this.st);
            if st.state.get() != IdState::RouteQuery || st.query_gen != gen {
                return;
            }
            let alive = st.device.as_ref().is_some_and(|d| !d.is_removing());
            let ev = if alive {
                let _ = this.exch(&mut st, Input::RouteResolved);
                CmEvent::new(EventKind::RouteResolved, 0)
            } else {
                let _ = this.exch(&mut st, Input::RouteError);
                CmEvent::new(EventKind::RouteError, -19)
            };
            (st.delivery.clone(), ev)
        };
        Self::deliver(this, Some(guard), delivery, event);
    }

    // --------------------------------------------------------- iWARP events

    fn conn_iw_handler(this: &Arc<Self>) -> IwHandler<D> {
        let me = this.clone();
        std::sync::Arc::new(
            move |_: &iw_cm::CmIdRef<D::Provider>, ev: iw_cm::CmEvent<D::Provider>| {
                IdInner::iw_event(&me, ev);
                iw_cm::Disposition::Keep
            },
        )
    }

    fn listen_iw_handler(listener: &Arc<Self>, entry: &Arc<DevEntry<D>>) -> IwHandler<D> {
        let (l, e) = (listener.clone(), entry.clone());
        std::sync::Arc::new(
            move |_: &iw_cm::CmIdRef<D::Provider>, ev: iw_cm::CmEvent<D::Provider>| {
                if let iw_cm::CmEvent::ConnectRequest(req) = ev {
                    IdInner::conn_request(&l, &e, req);
                }
                iw_cm::Disposition::Keep
            },
        )
    }

    /// cma.c's `cma_iw_handler`: map the event and deliver it, under the handler
    /// lock, if the id is connecting or connected.
    fn iw_event(this: &Arc<Self>, ev: iw_cm::CmEvent<D::Provider>) {
        let _span = this.span.enter();
        let kind = IwEventKind::of(&ev);
        let guard = this.lock_handler();
        let (delivery, event) = {
            let mut st = lock(&this.st);
            let input = Input::IwEvent(match &ev {
                iw_cm::CmEvent::ConnectRequest(_) => IwInput::ConnectRequest,
                iw_cm::CmEvent::ConnectReply(r) => IwInput::ConnectReply {
                    ok: r.status.is_ok(),
                },
                iw_cm::CmEvent::Established => IwInput::Established,
                iw_cm::CmEvent::Close => IwInput::Close,
            });
            if let Err(r) = this.exch(&mut st, input) {
                tracing::debug!(state = %r.state, ?kind, "iWARP event dropped");
                bump(&this.shared.counters.events_dropped);
                return;
            }
            let (k, status) = map_iw_event(kind);
            let mut e = CmEvent::new(k, status);
            match ev {
                iw_cm::CmEvent::ConnectReply(r) => {
                    e.private_data = r.private_data;
                    if r.status.is_ok() {
                        e.initiator_depth = r.ird;
                        e.responder_resources = r.ord;
                    }
                }
                iw_cm::CmEvent::Established | iw_cm::CmEvent::Close => {}
                iw_cm::CmEvent::ConnectRequest(req) => {
                    drop(st);
                    drop(req);
                    return;
                }
            }
            (st.delivery.clone(), e)
        };
        Self::deliver(this, Some(guard), delivery, event);
    }

    /// cma.c's `iw_conn_req_handler`: a connection request on `listener` (the user's
    /// listener, for its own device or through an internal per-device listener) from
    /// `entry`. Under the listener's handler lock: make the new id, lock it before
    /// anyone can see it, bind it to the device (refused if the device is being
    /// removed: the request is then rejected), and deliver `ConnectRequest`.
    fn conn_request(
        listener: &Arc<Self>,
        entry: &Arc<DevEntry<D>>,
        req: iw_cm::ConnectRequest<D::Provider>,
    ) {
        let _span = listener.span.enter();
        let lguard = listener.lock_handler();
        let delivery = {
            let st = lock(&listener.st);
            if st.state.get() != IdState::Listen {
                tracing::debug!(state = %st.state.get(), "connect request on a listener that stopped; rejected");
                bump(&listener.shared.counters.events_dropped);
                return;
            }
            st.delivery.clone()
        };
        let (SocketAddr::V4(local), SocketAddr::V4(peer)) = (req.local_addr, req.remote_addr)
        else {
            return;
        };
        let child = IdInner::new(
            &listener.shared,
            Role::User,
            delivery.clone(),
            IdState::Connect,
        );
        let cguard = child.lock_handler();
        {
            let mut cst = lock(&child.st);
            cst.passive = true;
            cst.local = Some(local);
            cst.peer = Some(peer);
            if entry.attach(&child).is_err() {
                let _ = child.exch(&mut cst, Input::Destroy);
                drop(cst);
                drop(cguard);
                tracing::debug!(device = %entry.name, "connect request during device removal; rejected");
                return;
            }
            cst.device = Some(entry.clone());
        }
        req.id.set_handler(Self::conn_iw_handler(&child));
        let iw_cm::ConnectRequest {
            id: iw_child,
            private_data,
            ird,
            ord,
            ..
        } = req;
        *lock(&child.ops) = Some(iw_child);
        let mut event = CmEvent::new(EventKind::ConnectRequest, 0);
        event.private_data = private_data;
        event.initiator_depth = ird;
        event.responder_resources = ord;
        event.new_id = Some(CmId::from_inner(child.clone()));
        event.listen_id = Some(listener.serial);
        tracing::debug!(child = child.serial, %peer, "connect request");
        let c = &listener.shared.counters;
        match delivery {
            Delivery::Callback(h) => {
                bump(&c.callbacks);
                let r = CmIdRef {
                    inner: child.clone(),
                };
                let d = call_handler(&*h, &r, event, &listener.shared);
                drop(h);
                drop(r);
                if (d == Disposition::Destroy || child.take_destroy_on_return())
                    && child.mark_destroying()
                {
                    drop(cguard);
                    Self::teardown(&child);
                } else {
                    drop(cguard);
                }
                if listener.take_destroy_on_return() && listener.mark_destroying() {
                    drop(lguard);
                    Self::teardown(listener);
                }
            }
            Delivery::Channel(ch) => {
                ch.push(Queued {
                    id: child.clone(),
                    owner: listener.clone(),
                    event,
                });
                drop(cguard);
                drop(lguard);
            }
            Delivery::Inert => {
                drop(cguard);
                drop(lguard);
                bump(&c.events_dropped);
                drop(event);
            }
        }
    }

    /// Create the internal listener of wildcard listener `parent` on `entry` (cma.c's
    /// `cma_listen_on_dev`). Called with the registry's listen lock held.
    pub(crate) fn create_internal(parent: &Arc<Self>, entry: &Arc<DevEntry<D>>) {
        let (port, backlog) = {
            let pst = lock(&parent.st);
            if pst.state.get() != IdState::Listen
                || !pst.wildcard
                || pst.internal.iter().any(|(d, _)| *d == entry.serial)
            {
                return;
            }
            (pst.local.map_or(0, |l| l.port()), pst.backlog)
        };
        let int = IdInner::new(
            &parent.shared,
            Role::Internal {
                parent: parent.clone(),
            },
            Delivery::Inert,
            IdState::Listen,
        );
        bump(&parent.shared.counters.internal_listeners);
        if entry.attach(&int).is_err() {
            let _ = int.exch(&mut lock(&int.st), Input::Destroy);
            sub(&parent.shared.counters.internal_listeners, 1);
            return;
        }
        lock(&int.st).device = Some(entry.clone());
        let Some(iw) = entry.create_iw_id(Self::listen_iw_handler(parent, entry)) else {
            Self::internal_teardown(&int);
            return;
        };
        let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port));
        if let Err(e) = iw.listen(addr, backlog) {
            tracing::warn!(parent: &parent.span, device = %entry.name, error = %e, "wildcard listen on a device failed");
            bump(&parent.shared.counters.internal_listen_failures);
            let _ = iw.destroy();
            Self::internal_teardown(&int);
            return;
        }
        *lock(&int.ops) = Some(iw);
        let kept = {
            let mut pst = lock(&parent.st);
            if pst.state.get() == IdState::Listen && pst.wildcard {
                pst.internal.push((entry.serial, int.clone()));
                true
            } else {
                false
            }
        };
        if kept {
            tracing::debug!(parent: &parent.span, device = %entry.name, internal = int.serial, "listening on a device");
        } else {
            Self::internal_teardown(&int);
        }
    }
}

impl<D: CmDevice> Drop for IdInner<D> {
    fn drop(&mut self) {
        sub(&self.shared.counters.ids_alive, 1);
        #[cfg(not(loom))]
        self.shared
            .ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.serial);
    }
}

// -------------------------------------------------------------------- handles

/// The parameters of [`CmIdRef::connect`] and [`CmIdRef::accept`] (librdmacm's
/// `struct rdma_conn_param`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data for the MPA Request / Reply (at most
    /// [`iw_cm::MAX_PRIVATE_DATA`] bytes).
    pub private_data: Vec<u8>,
    /// The RDMA Reads we accept from the peer at once: our IRD (iWARP maps
    /// `responder_resources` to IRD).
    pub responder_resources: u16,
    /// The RDMA Reads we issue at once: our ORD (`initiator_depth` -> ORD).
    pub initiator_depth: u16,
    /// Transport retries (a 3-bit field, 0..=7). iWARP runs over TCP, which retries on
    /// its own: checked, then ignored, as the kernel's iWARP path does.
    pub retry_count: u8,
    /// RNR retries (3-bit, 0..=7). Ignored by iWARP, checked.
    pub rnr_retry_count: u8,
}

impl ConnParam {
    fn check(&self) -> Result<(), CmError> {
        if self.retry_count > 7 {
            return Err(CmError::InvalidArgument {
                what: "retry_count (0..=7)",
            });
        }
        if self.rnr_retry_count > 7 {
            return Err(CmError::InvalidArgument {
                what: "rnr_retry_count (0..=7)",
            });
        }
        if self.private_data.len() > iw_cm::MAX_PRIVATE_DATA {
            return Err(CmError::InvalidArgument {
                what: "private_data (at most 512 bytes)",
            });
        }
        Ok(())
    }
}

/// A reference to an rdma_cm id: every call except destroy (librdmacm's
/// `struct rdma_cm_id *` as callbacks see it). What callbacks and channel events give;
/// what [`CmId`] dereferences to. Cloning it does not keep the id from being destroyed;
/// calls on a destroyed id fail with [`CmError::InvalidState`] (`DESTROYING`).
pub struct CmIdRef<D: CmDevice> {
    pub(crate) inner: Arc<IdInner<D>>,
}

impl<D: CmDevice> Clone for CmIdRef<D> {
    fn clone(&self) -> Self {
        CmIdRef {
            inner: self.inner.clone(),
        }
    }
}

impl<D: CmDevice> fmt::Debug for CmIdRef<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmIdRef")
            .field("serial", &self.inner.serial)
            .field("state", &self.state())
            .finish()
    }
}

impl<D: CmDevice> CmIdRef<D> {
    /// The id's serial number, unique within its [`crate::RdmaCm`] (tracing spans:
    /// `rdma_cm_id{id=N}`).
    pub fn serial(&self) -> u64 {
        self.inner.serial
    }

    /// The id's state.
    pub fn state(&self) -> IdState {
        self.inner.state()
    }

    /// The name of the device the id is bound to, if any (librdmacm's `id->verbs`).
    pub fn device_name(&self) -> Option<String> {
        lock(&self.inner.st).device.as_ref().map(|d| d.name.clone())
    }

    /// The device the id is bound to, if any (librdmacm's `id->verbs`): e.g. to
    /// allocate the PD and CQs of a `ConnectRequest`'s new id on the device the request
    /// came in on. `None` before the id is bound, after it was destroyed, and once the
    /// device was released.
    pub fn device(&self) -> Option<std::sync::Arc<D>> {
        let entry = lock(&self.inner.st).device.clone();
        entry.and_then(|e| e.device())
    }

    /// The local address (`rdma_get_local_addr`): the bound address, the source
    /// chosen by `resolve_addr` (port 0 unless bound: the device picks the TCP port at
    /// connect), or our end of an incoming connection.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        lock(&self.inner.st).local.map(SocketAddr::V4)
    }

    /// The peer's address (`rdma_get_peer_addr`): `resolve_addr`'s destination, or the
    /// initiator of an incoming connection.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        lock(&self.inner.st).peer.map(SocketAddr::V4)
    }

    /// The next hop `resolve_addr` resolved (the destination or a gateway).
    pub fn next_hop(&self) -> Option<Ipv4Addr> {
        lock(&self.inner.st).next_hop
    }

    /// Bind to a local address and port (`rdma_bind_addr`): IDLE -> ADDR_BOUND. A
    /// specific address binds the id to the device that owns it; the wildcard
    /// `0.0.0.0` binds no device (a later `listen` listens on every device). Port 0
    /// picks a free ephemeral port.
    ///
    /// # Errors
    /// [`CmError::AddressFamily`] for IPv6; [`CmError::InvalidState`] unless IDLE;
    /// [`CmError::AddressNotAvailable`] if no device has the address;
    /// [`CmError::AddressInUse`] / [`CmError::NoPorts`];
    /// [`CmError::DeviceRemoved`] if the device is being removed.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<(), CmError> {
        let a = v4(addr)?;
        let inner = &self.inner;
        let _span = inner.span.enter();
        let _ops = lock(&inner.ops);
        let ip = *a.ip();
        let entry = if ip.is_unspecified() {
            None
        } else {
            Some(
                inner
                    .shared
                    .device_owning(ip)
                    .ok_or(CmError::AddressNotAvailable(ip.into()))?,
            )
        };
        let mut st = lock(&inner.st);
        check(&st, Input::BindAddr)?;
        let port = inner.shared.reserve_port(ip, a.port(), inner.serial)?;
        if let Some(e) = &entry {
            if let Err(err) = e.attach(inner) {
                inner.shared.release_port(ip, port, inner.serial);
                return Err(err);
            }
        }
        let _ = inner.exch(&mut st, Input::BindAddr);
        st.local = Some(SocketAddrV4::new(ip, port));
        st.port = Some((ip, port));
        st.device = entry;
        tracing::debug!(local = ?st.local, device = ?st.device.as_ref().map(|d| d.name.clone()), "bound");
        Ok(())
    }

    /// Resolve a destination (`rdma_resolve_addr`): IDLE/ADDR_BOUND -> ADDR_QUERY. Picks
    /// the device and source address whose subnet or gateway reaches `dst` (see
    /// [`crate::route`]), then resolves the next hop through the device's
    /// [`CmDevice::resolve_neighbor`]. The outcome arrives as `AddrResolved` (the id is
    /// now bound to that device) or `AddrError` (`-ENETUNREACH` when no device reaches
    /// it, `-ETIMEDOUT` after `timeout`, the device's error otherwise; the id goes to
    /// ADDR_BOUND). `src` (only its address is used) or a bound address restricts the
    /// choice to the device that owns it.
    ///
    /// # Errors
    /// [`CmError::AddressFamily`]; [`CmError::InvalidState`] unless IDLE or ADDR_BOUND;
    /// [`CmError::AddressNotAvailable`] if `src` belongs to no device;
    /// [`CmError::InvalidArgument`] if `dst` is not unicast or `src` differs from the
    /// bound address.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), CmError> {
        let dst = v4(dst)?;
        let src = src.map(v4).transpose()?.map(|s| *s.ip());
        let inner = &self.inner;
        let _span = inner.span.enter();
        let _ops = lock(&inner.ops);
        let (gen, prev, src) = {
            let mut st = lock(&inner.st);
            check(&st, Input::ResolveAddr)?;
            let bound = st.local.map(|l| *l.ip()).filter(|ip| !ip.is_unspecified());
            let src = match (src, bound) {
                (Some(s), Some(b)) if s != b => {
                    return Err(CmError::InvalidArgument {
                        what: "src (differs from the bound address)",
                    })
                }
                (s, b) => s.or(b),
            };
            let prev = inner.exch(&mut st, Input::ResolveAddr)?;
            st.query_gen += 1;
            st.peer = Some(dst);
            (st.query_gen, prev, src)
        };
        let (entries, routes) = inner.shared.route_snapshot();
        let route = match crate::route::select_route(&routes, *dst.ip(), src) {
            Ok(r) => r,
            Err(e @ (RouteError::SourceNotLocal(_) | RouteError::NotUnicast(_))) => {
                let mut st = lock(&inner.st);
                if inner.exch(&mut st, Input::ResolveAddrUndo(prev)).is_ok() {
                    st.peer = None;
                }
                return Err(match e {
                    RouteError::SourceNotLocal(s) => CmError::AddressNotAvailable(s.into()),
                    _ => CmError::InvalidArgument {
                        what: "dst (not a unicast address)",
                    },
                });
            }
            Err(RouteError::Unreachable(_)) => {
                tracing::debug!(%dst, "no device reaches the destination");
                inner.shared.push_job(Job::AddrDone {
                    id: inner.clone(),
                    gen,
                    entry: None,
                    src: Ipv4Addr::UNSPECIFIED,
                    next_hop: *dst.ip(),
                    result: Err(ResolveError::NetUnreachable),
                });
                return Ok(());
            }
        };
        let entry = entries[route.device].clone();
        tracing::debug!(%dst, device = %entry.name, src = %route.src, next_hop = %route.next_hop, kind = ?route.kind, "route chosen; resolving the next hop");
        inner.shared.add_timer(inner, gen, timeout);
        let done = NeighborDone {
            shared: inner.shared.clone(),
            id: Some(inner.clone()),
            gen,
            entry: entry.clone(),
            src: route.src,
            next_hop: route.next_hop,
        };
        match entry.device() {
            Some(dev) => dev.resolve_neighbor(
                NeighborRequest {
                    dst: *dst.ip(),
                    src: route.src,
                    next_hop: route.next_hop,
                    timeout,
                },
                done,
            ),
            None => done.complete(Err(ResolveError::DeviceGone)),
        }
        Ok(())
    }

    /// Resolve the route (`rdma_resolve_route`): ADDR_RESOLVED -> ROUTE_QUERY. For
    /// iWARP the route is the resolved address (cma.c's `cma_resolve_iw_route`): the
    /// worker delivers `RouteResolved`, or `RouteError` if the device is going away.
    /// `timeout` is accepted for the API's sake.
    ///
    /// # Errors
    /// [`CmError::InvalidState`] unless ADDR_RESOLVED; [`CmError::DeviceRemoved`].
    pub fn resolve_route(&self, timeout: Duration) -> Result<(), CmError> {
        let _ = timeout;
        let inner = &self.inner;
        let _span = inner.span.enter();
        let _ops = lock(&inner.ops);
        let gen = {
            let mut st = lock(&inner.st);
            inner.exch(&mut st, Input::ResolveRoute)?;
            st.query_gen += 1;
            st.query_gen
        };
        inner.shared.push_job(Job::RouteDone {
            id: inner.clone(),
            gen,
        });
        Ok(())
    }

    /// Create a QP on the id's device (`rdma_create_qp`), through
    /// [`CmDevice::create_qp`]; the id keeps a handle (used by `connect`/`accept`, and
    /// moved to ERROR if the device is removed). Returns the QP.
    ///
    /// # Errors
    /// [`CmError::NoDevice`] if the id is not bound to a device; [`CmError::QpExists`];
    /// [`CmError::DeviceRemoved`]; [`CmError::InvalidState`] on a destroyed id or a
    /// listener; [`CmError::Verbs`] from the device.
    pub fn create_qp(&self, pd: &D::Pd, attr: D::QpInitAttr<'_>) -> Result<QpOf<D>, CmError> {
        let inner = &self.inner;
        let _span = inner.span.enter();
        let _ops = lock(&inner.ops);
        let entry = {
            let st = lock(&inner.st);
            check(&st, Input::CreateQp)?;
            if st.qp.is_some() {
                return Err(CmError::QpExists);
            }
            st.device
                .clone()
                .ok_or(CmError::NoDevice { op: "create_qp" })?
        };
        let dev = entry
            .device()
            .ok_or(CmError::DeviceRemoved { op: "create_qp" })?;
        let qp = dev.create_qp(pd, attr)?;
        let mut st = lock(&inner.st);
        if matches!(st.state.get(), IdState::Destroying | IdState::DeviceRemoval) {
            let err = CmError::from(Refused {
                state: st.state.get(),
                input: Input::CreateQp,
            });
            drop(st);
            dev.destroy_qp(qp);
            return Err(err);
        }
        st.qp = Some(qp.clone());
        Ok(qp)
    }

    /// The id's QP, if any (`id->qp`).
    pub fn qp(&self) -> Option<QpOf<D>> {
        lock(&self.inner.st).qp.clone()
    }

    /// Destroy the id's QP (`rdma_destroy_qp`), through [`CmDevice::destroy_qp`]. Safe
    /// at any time, including after the device was removed; a no-op without a QP.
    pub fn destroy_qp(&self) {
        let inner = &self.inner;
        let _ops = lock(&inner.ops);
        let (qp, entry) = {
            let mut st = lock(&inner.st);
            (st.qp.take(), st.device.clone())
        };
        if let Some(qp) = qp {
            match entry {
                Some(e) => e.destroy_qp(qp),
                None => drop(qp),
            }
        }
    }

    /// Connect (`rdma_connect`): ROUTE_RESOLVED -> CONNECT, through the device's iWARP
    /// CM (`iw_cm_connect` with `ird` = `responder_resources`, `ord` =
    /// `initiator_depth`). The outcome arrives as `Established`, `Rejected`,
    /// `Unreachable` or `ConnectError` (cma.c's `cma_iw_handler` mapping).
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`] (`param`); [`CmError::InvalidState`] unless
    /// ROUTE_RESOLVED; [`CmError::NoQp`]; [`CmError::DeviceRemoved`]; [`CmError::Iw`]
    /// if the iWARP CM or the provider refuses (the id is back to ROUTE_RESOLVED).
    pub fn connect(&self, param: &ConnParam) -> Result<(), CmError> {
        param.check()?;
        let inner = &self.inner;
        let _span = inner.span.enter();
        let mut ops = lock(&inner.ops);
        let (entry, qp, local, peer) = {
            let mut st = lock(&inner.st);
            check(&st, Input::Connect)?;
            let qp = st.qp.clone().ok_or(CmError::NoQp { op: "connect" })?;
            let entry = st
                .device
                .clone()
                .ok_or(CmError::NoDevice { op: "connect" })?;
            let (Some(local), Some(peer)) = (st.local, st.peer) else {
                return Err(CmError::InvalidState {
                    op: "connect",
                    state: st.state.get(),
                });
            };
            let _ = inner.exch(&mut st, Input::Connect);
            (entry, qp, local, peer)
        };
        let rollback = |inner: &IdInner<D>| {
            let _ = inner.exch(&mut lock(&inner.st), Input::ConnectUndo);
        };
        let Some(iw) = entry.create_iw_id(IdInner::conn_iw_handler(inner)) else {
            rollback(inner);
            return Err(CmError::DeviceRemoved { op: "connect" });
        };
        let params = iw_cm::ConnectParams {
            qp,
            local_addr: Some(SocketAddr::V4(local)),
            remote_addr: SocketAddr::V4(peer),
            private_data: param.private_data.clone(),
            ird: param.responder_resources,
            ord: param.initiator_depth,
        };
        let iw = ops.insert(iw);
        match iw.connect(params) {
            Ok(()) => {
                tracing::debug!(%peer, "connecting");
                Ok(())
            }
            Err(e) => {
                if let Some(iw) = ops.take() {
                    let _ = iw.destroy();
                }
                rollback(inner);
                Err(e.into())
            }
        }
    }

    /// Listen (`rdma_listen`): ADDR_BOUND (or IDLE, which binds `0.0.0.0` and an
    /// ephemeral port) -> LISTEN. Bound to a device's address: listens on that device.
    /// Bound to the wildcard: one internal listener per registered device, and one on
    /// every device added later (cma.c's `cma_listen_on_all` / `cma_add_one`); a
    /// device's removal silently ends only its internal listener. `backlog` 0 uses the
    /// configured default. Connection requests arrive as `ConnectRequest` events.
    ///
    /// # Errors
    /// [`CmError::InvalidState`]; [`CmError::DeviceRemoved`]; [`CmError::NoPorts`];
    /// [`CmError::Iw`] if the device's listen fails (the id is back to ADDR_BOUND).
    pub fn listen(&self, backlog: u32) -> Result<(), CmError> {
        let inner = &self.inner;
        let _span = inner.span.enter();
        let mut ops = lock(&inner.ops);
        let backlog = if backlog == 0 {
            inner.shared.config.default_backlog
        } else {
            backlog
        };
        let (local, entry) = {
            let mut st = lock(&inner.st);
            check(&st, Input::Listen)?;
            if st.state.get() == IdState::Idle {
                // Binds the wildcard address; the machine goes IDLE -> LISTEN at once
                // (nothing can fail in between, and `st` stays locked).
                let port = inner
                    .shared
                    .reserve_port(Ipv4Addr::UNSPECIFIED, 0, inner.serial)?;
                st.local = Some(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port));
                st.port = Some((Ipv4Addr::UNSPECIFIED, port));
            }
            let Some(local) = st.local else {
                return Err(CmError::InvalidState {
                    op: "listen",
                    state: st.state.get(),
                });
            };
            let _ = inner.exch(&mut st, Input::Listen);
            st.backlog = backlog;
            st.wildcard = st.device.is_none();
            (local, st.device.clone())
        };
        match entry {
            Some(entry) => {
                let rollback = |inner: &IdInner<D>| {
                    let _ = inner.exch(&mut lock(&inner.st), Input::ListenUndo);
                };
                let Some(iw) = entry.create_iw_id(IdInner::listen_iw_handler(inner, &entry)) else {
                    rollback(inner);
                    return Err(CmError::DeviceRemoved { op: "listen" });
                };
                if let Err(e) = iw.listen(SocketAddr::V4(local), backlog) {
                    let _ = iw.destroy();
                    rollback(inner);
                    return Err(e.into());
                }
                *ops = Some(iw);
                tracing::debug!(%local, device = %entry.name, "listening");
            }
            None => {
                tracing::debug!(%local, "listening on every device");
                inner.shared.listen_any(inner);
            }
        }
        Ok(())
    }

    /// Accept the connection request this new id was made for (`rdma_accept`), with
    /// the id's QP (`iw_cm_accept`, `ird` = `responder_resources`, `ord` =
    /// `initiator_depth`). `Established` follows (or `Disconnected` if the connection
    /// fails first).
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`]; [`CmError::InvalidState`] unless a new id in
    /// CONNECT not accepted yet; [`CmError::NoQp`]; [`CmError::DeviceRemoved`];
    /// [`CmError::Iw`].
    pub fn accept(&self, param: &ConnParam) -> Result<(), CmError> {
        param.check()?;
        let inner = &self.inner;
        let _span = inner.span.enter();
        let ops = lock(&inner.ops);
        let qp = {
            let mut st = lock(&inner.st);
            check(&st, Input::Accept)?;
            if !st.passive || st.accepted {
                return Err(CmError::InvalidState {
                    op: "accept",
                    state: st.state.get(),
                });
            }
            let qp = st.qp.clone().ok_or(CmError::NoQp { op: "accept" })?;
            st.accepted = true;
            qp
        };
        let result = match ops.as_ref() {
            Some(iw) => iw
                .accept(iw_cm::AcceptParams {
                    qp,
                    private_data: param.private_data.clone(),
                    ird: param.responder_resources,
                    ord: param.initiator_depth,
                })
                .map_err(CmError::from),
            None => Err(CmError::InvalidState {
                op: "accept",
                state: IdState::Connect,
            }),
        };
        if result.is_err() {
            lock(&inner.st).accepted = false;
        }
        result
    }

    /// Reject the connection request this new id was made for (`rdma_reject`), with
    /// `private_data` for the peer's `Rejected` event. The id goes to DISCONNECT;
    /// destroy it.
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`]; [`CmError::InvalidState`] unless a new id in
    /// CONNECT not accepted; [`CmError::DeviceRemoved`]; [`CmError::Iw`].
    pub fn reject(&self, private_data: &[u8]) -> Result<(), CmError> {
        if private_data.len() > iw_cm::MAX_PRIVATE_DATA {
            return Err(CmError::InvalidArgument {
                what: "private_data (at most 512 bytes)",
            });
        }
        let inner = &self.inner;
        let _span = inner.span.enter();
        let ops = lock(&inner.ops);
        {
            let st = lock(&inner.st);
            check(&st, Input::Reject)?;
            if !st.passive || st.accepted {
                return Err(CmError::InvalidState {
                    op: "reject",
                    state: st.state.get(),
                });
            }
        }
        if let Some(iw) = ops.as_ref() {
            iw.reject(private_data)?;
        }
        let _ = inner.exch(&mut lock(&inner.st), Input::Reject);
        Ok(())
    }

    /// Disconnect (`rdma_disconnect`; for iWARP a graceful `iw_cm_disconnect`):
    /// CONNECT/ESTABLISHED -> DISCONNECT. `Disconnected` follows when the connection is
    /// closed.
    ///
    /// # Errors
    /// [`CmError::InvalidState`] unless CONNECT or ESTABLISHED;
    /// [`CmError::DeviceRemoved`]; [`CmError::Iw`] (e.g. `Busy` while a connect is
    /// still in flight: wait for its outcome or destroy the id).
    pub fn disconnect(&self) -> Result<(), CmError> {
        let inner = &self.inner;
        let _span = inner.span.enter();
        let ops = lock(&inner.ops);
        check(&lock(&inner.st), Input::Disconnect)?;
        if let Some(iw) = ops.as_ref() {
            iw.disconnect(iw_cm::DisconnectMode::Graceful)?;
        }
        let _ = inner.exch(&mut lock(&inner.st), Input::Disconnect);
        Ok(())
    }
}

/// An rdma_cm id owned by the user (librdmacm's `rdma_create_id` result). Dereferences
/// to [`CmIdRef`] for the calls. [`CmId::destroy`] is `rdma_destroy_id`; dropping it
/// destroys it too (see [`CmId::destroy`] for the two cases where dropping differs).
pub struct CmId<D: CmDevice> {
    r: CmIdRef<D>,
    destroyed: bool,
}

impl<D: CmDevice> fmt::Debug for CmId<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("serial", &self.r.inner.serial)
            .field("state", &self.r.state())
            .finish()
    }
}

impl<D: CmDevice> core::ops::Deref for CmId<D> {
    type Target = CmIdRef<D>;
    fn deref(&self) -> &CmIdRef<D> {
        &self.r
    }
}

impl<D: CmDevice> CmId<D> {
    pub(crate) fn from_inner(inner: Arc<IdInner<D>>) -> CmId<D> {
        CmId {
            r: CmIdRef { inner },
            destroyed: false,
        }
    }

    /// A non-owning reference to the id.
    pub fn as_ref(&self) -> CmIdRef<D> {
        self.r.clone()
    }

    /// Destroy the id (`rdma_destroy_id`):
    ///
    /// 1. mark it DESTROYING (from then on no callback starts, device removal delivers
    ///    nothing to it);
    /// 2. wait for a callback of the id in progress on another thread (cma.c takes and
    ///    releases `handler_mutex`);
    /// 3. tear down: the iWARP CM id (a connection is aborted, its QP moved to ERROR; a
    ///    pending request rejected; a listener stops, on every device), the QP handle,
    ///    the port, the device binding (the last id of a device being removed lets the
    ///    device be released), queued channel events;
    /// 4. for an id on an event channel, wait until every event of it that was handed
    ///    out has been acked (librdmacm).
    ///
    /// After it returns, no callback of the id runs and none will.
    ///
    /// # Errors
    /// Refused, with the id given back undestroyed, in the two cases where librdmacm
    /// and the kernel would wait forever:
    /// [`CmError::DestroyInOwnCallback`] from inside a callback of this id (return
    /// [`crate::Disposition::Destroy`] instead, or drop the `CmId`: dropping it there
    /// destroys it as the callback returns); [`CmError::UnackedEvents`] while the
    /// calling thread holds un-acked channel events of it (dropping the `CmId` then
    /// destroys it without waiting for those acks).
    pub fn destroy(mut self) -> Result<(), DestroyRefused<D>> {
        match IdInner::destroy(&self.r.inner, true) {
            Ok(()) => {
                self.destroyed = true;
                Ok(())
            }
            Err(error) => Err(DestroyRefused { id: self, error }),
        }
    }
}

impl<D: CmDevice> Drop for CmId<D> {
    fn drop(&mut self) {
        if !self.destroyed {
            self.destroyed = true;
            let _ = IdInner::destroy(&self.r.inner, false);
        }
    }
}

/// [`CmId::destroy`] refused: the id, undestroyed, and why.
pub struct DestroyRefused<D: CmDevice> {
    /// The id, still alive.
    pub id: CmId<D>,
    /// Why.
    pub error: CmError,
}

impl<D: CmDevice> fmt::Debug for DestroyRefused<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DestroyRefused")
            .field("id", &self.id.serial())
            .field("error", &self.error)
            .finish()
    }
}

impl<D: CmDevice> fmt::Display for DestroyRefused<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<D: CmDevice> std::error::Error for DestroyRefused<D> {}
