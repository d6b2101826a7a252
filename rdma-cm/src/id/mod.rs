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

use crate::device::{CmDevice, NeighborResult, QpOf};
use crate::error::CmError;
use crate::event::{Disposition, EventKind};
use crate::machine::{IdState, Input, Refused, StateCell};
use crate::registry::{self, RegId, RuleBreak};
use crate::stats::{bump, sub};
use crate::sync::{self, lock, wait, Arc, Condvar, Mutex, MutexGuard};
use core::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

pub(crate) mod calls;
mod handlers;
mod removal;

pub(crate) type IwId<D> = iw_cm::CmId<<D as CmDevice>::Provider>;
/// The registry shared by the ids of one RDMA CM, with this module's id type.
pub(crate) type Shared<D> = registry::Shared<IdInner<D>>;
/// A registered device, with this module's id type.
pub(crate) type DevEntry<D> = registry::DevEntry<IdInner<D>>;
/// A job for the RDMA CM's worker, with this module's id type.
pub(crate) type Job<D> = registry::Job<IdInner<D>>;
type IwHandler<D> = std::sync::Arc<dyn iw_cm::EventHandler<<D as CmDevice>::Provider>>;

/// Where an id's events go.
pub(crate) enum Delivery<D: CmDevice> {
    /// A callback (the kernel's `event_handler`).
    Callback(std::sync::Arc<dyn Handler<D>>),
    /// An event channel (librdmacm's `rdma_event_channel`): its queue.
    Channel(std::sync::Arc<dyn ChannelQueue<D>>),
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

/// An event channel's queue, as an id's delivery sees it (implemented by the channel's
/// queue, `crate::channel`).
pub(crate) trait ChannelQueue<D: CmDevice>: Send + Sync {
    /// Queue one event (under the handler lock of its id).
    fn push(&self, item: Queued<D>);
    /// Discard the queued events of id `serial` (destroyed): its own, and connect
    /// requests on it if it was a listener.
    fn purge(&self, serial: u64);
    /// Take out, in order, the queued events counted against id `serial` (its own,
    /// and connect requests on it if it is a listener): the id moves to another
    /// channel.
    fn take_owned(&self, serial: u64) -> Vec<Queued<D>>;
}

/// One queued event.
pub(crate) struct Queued<D: CmDevice> {
    /// The id the event is about (for a `ConnectRequest`: the new id).
    pub(crate) id: Arc<IdInner<D>>,
    /// The id the ack is counted against (for a `ConnectRequest`: the listener).
    pub(crate) owner: Arc<IdInner<D>>,
    pub(crate) event: CmEvent<D>,
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
    /// The QP that `connect_with_qp` / `accept_with_qp` named, the id having none of
    /// its own (librdmacm's `conn_param->qp_num`): not the id's, so never destroyed
    /// by it, only moved to ERROR on device removal as the id's own.
    user_qp: Option<QpOf<D>>,
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
                user_qp: None,
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
            // Not the id's to destroy: the reference goes (the iWARP CM's goes with
            // its id below).
            drop(st.user_qp.take());
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

/// What the registry (below this module) does to an id.
impl<D: CmDevice> RegId for IdInner<D> {
    type Device = D;

    fn serial(&self) -> u64 {
        self.serial
    }

    fn is_user(&self) -> bool {
        matches!(self.role, Role::User)
    }

    fn mark_device_removal(&self) {
        IdInner::mark_device_removal(self);
    }

    fn addr_done(
        this: &Arc<Self>,
        gen: u64,
        entry: Option<Arc<DevEntry<D>>>,
        src: Ipv4Addr,
        next_hop: Ipv4Addr,
        result: NeighborResult,
    ) {
        IdInner::addr_done(this, gen, entry, src, next_hop, result);
    }

    fn route_done(this: &Arc<Self>, gen: u64) {
        IdInner::route_done(this, gen);
    }

    fn addr_change(this: &Arc<Self>) {
        IdInner::addr_change(this);
    }

    fn device_removed(this: &Arc<Self>, entry: &Arc<DevEntry<D>>) {
        IdInner::device_removed(this, entry);
    }

    fn create_internal(listener: &Arc<Self>, entry: &Arc<DevEntry<D>>) -> Result<(), CmError> {
        IdInner::create_internal(listener, entry)
    }
}

// -------------------------------------------------------------------- handles

/// A reference to an rdma_cm id: every call except destroy (librdmacm's
/// `struct rdma_cm_id *` as callbacks see it). What callbacks and channel events give;
/// what [`CmId`] dereferences to. Cloning it does not keep the id from being destroyed;
/// calls on a destroyed id fail with [`CmError::InvalidState`] (`DESTROYING`).
pub struct CmIdRef<D: CmDevice> {
    pub(crate) inner: Arc<IdInner<D>>,
}

/// An rdma_cm id owned by the user (librdmacm's `rdma_create_id` result). Dereferences
/// to [`CmIdRef`] for the calls. [`CmId::destroy`] is `rdma_destroy_id`; dropping it
/// destroys it too (see [`CmId::destroy`] for the two cases where dropping differs).
pub struct CmId<D: CmDevice> {
    r: CmIdRef<D>,
    destroyed: bool,
}

// -------------------------------------------------------------------- events

/// An event (librdmacm's `struct rdma_cm_event`): what a callback receives, and what an
/// [`crate::ChannelEvent`] dereferences to.
pub struct CmEvent<D: CmDevice> {
    /// What happened.
    pub kind: EventKind,
    /// 0, or a negative errno saying why (librdmacm's `event->status`).
    pub status: i32,
    /// The peer's private data (`ConnectRequest`, `Established` on the active side,
    /// `Rejected`), empty otherwise.
    pub private_data: Vec<u8>,
    /// `param.conn.responder_resources`: for a `ConnectRequest` and an active
    /// `Established`, the peer's ORD (the kernel maps the iWARP ORD here).
    pub responder_resources: u16,
    /// `param.conn.initiator_depth`: for a `ConnectRequest` and an active
    /// `Established`, the peer's IRD.
    pub initiator_depth: u16,
    pub(crate) new_id: Option<CmId<D>>,
    pub(crate) listen_id: Option<u64>,
}

impl<D: CmDevice> CmEvent<D> {
    pub(crate) fn new(kind: EventKind, status: i32) -> CmEvent<D> {
        CmEvent {
            kind,
            status,
            private_data: Vec::new(),
            responder_resources: 0,
            initiator_depth: 0,
            new_id: None,
            listen_id: None,
        }
    }

    /// For a `ConnectRequest`: take ownership of the new id (librdmacm's `event->id`
    /// of a connect request). Accept or reject it through the returned [`CmId`]; keep
    /// it as long as the connection lives. If it is not taken, it is destroyed with
    /// the event (which rejects the request). `None` for other events, or if already
    /// taken.
    pub fn take_new_id(&mut self) -> Option<CmId<D>> {
        self.new_id.take()
    }

    /// For a `ConnectRequest`: the new id, if not taken yet.
    pub fn new_id(&self) -> Option<&CmIdRef<D>> {
        self.new_id.as_deref()
    }

    /// For a `ConnectRequest`: the serial number of the listening id it arrived at
    /// (librdmacm's `event->listen_id`).
    pub fn listen_id(&self) -> Option<u64> {
        self.listen_id
    }
}

impl<D: CmDevice> fmt::Debug for CmEvent<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmEvent")
            .field("kind", &self.kind)
            .field("status", &self.status)
            .field("private_data_len", &self.private_data.len())
            .field("responder_resources", &self.responder_resources)
            .field("initiator_depth", &self.initiator_depth)
            .field("new_id", &self.new_id.as_ref().map(|i| i.serial()))
            .field("listen_id", &self.listen_id)
            .finish()
    }
}

/// A callback (the kernel's `rdma_cm_event_handler`): any
/// `Fn(&CmIdRef<D>, CmEvent<D>) -> Disposition + Send + Sync + 'static`.
///
/// Callbacks of one id never run concurrently (cma.c's `handler_mutex`); callbacks of
/// different ids may. They run on the RDMA CM's worker thread (address, route, device
/// removal and address change events), on the device's iWARP CM worker (connection
/// events), or on the thread that called [`crate::RdmaCm::remove_device`]
/// (`DeviceRemoval`); never on a device's engine thread. A callback may call anything
/// on any id, with two exceptions that would wait for the callback itself and are
/// refused with a typed error instead: destroying its own id
/// ([`crate::CmError::DestroyInOwnCallback`]; return [`Disposition::Destroy`]) and
/// waiting for removal or for the worker ([`crate::CmError::InCallback`]). Destroying
/// *another* id from a callback waits for that id's callback in progress; two
/// callbacks destroying each other's ids deadlock, as in the kernel.
///
/// The new id of a `ConnectRequest` inherits its listener's callback (cma.c's
/// `cma_listen_handler` copies `event_handler`). A callback that stores the new
/// [`crate::CmId`]s it is given therefore owns ids that hold it: clear that storage
/// (destroy them) when done, or the ids and the callback keep each other alive.
pub trait Handler<D: CmDevice>: Send + Sync + 'static {
    /// Handle one event of `id` (for a `ConnectRequest`: the new id).
    fn on_event(&self, id: &CmIdRef<D>, event: CmEvent<D>) -> Disposition;
}

impl<D, F> Handler<D> for F
where
    D: CmDevice,
    F: Fn(&CmIdRef<D>, CmEvent<D>) -> Disposition + Send + Sync + 'static,
{
    fn on_event(&self, id: &CmIdRef<D>, event: CmEvent<D>) -> Disposition {
        self(id, event)
    }
}
