//! cm_ids: the user's handles ([`CmId`], [`CmIdRef`]), what their handler gets and
//! returns ([`CmEvent`], [`EventHandler`], [`Disposition`]), the per-id event queue
//! that the provider's [`EventSink`] reports to, delivery and destroy.
//!
//! # Module order
//!
//! `id` sits above `work` (the job queue and workers it schedules its jobs on; they
//! run an id through [`IdJob`], implemented here), `provider` (whose [`EventSink`]
//! reaches an id through [`ReportTarget`], implemented here), `machine` and `error`,
//! and below `cm` ([`crate::IwCm`]). The handler types live here, with the id they
//! are handed, because the id holds its handler and the handler is handed the id
//! (the kernel's `iw_cm_id.cm_handler`).
//!
//! # Locks and references
//!
//! Each id has two locks: `ops` serializes the user's downcalls on the id (connect,
//! accept, ..., destroy), so that a downcall and its rollback are atomic with respect
//! to the others; `st` guards the state machine and the event queue. Neither is ever
//! held across a provider downcall or a handler call, and `st` is never held while
//! taking `ops`. A provider reporting an event takes only `st` (briefly), so it may do
//! so from inside any downcall. The worker takes only `st`. Hence no cycle.
//!
//! References (`Arc`s) on an id: the user's [`CmId`] (the creator's reference), every
//! [`EventSink`] clone the provider keeps, a scheduled worker job, a delivery in
//! progress. The last one to go frees the id (`iwcm_deref_id` -> `free_cm_id`).

use crate::error::CmError;
use crate::machine::{CmState, Downcall, DropReason, Input, Machine, Upcall};
use crate::provider::{
    AcceptArgs, ConnectArgs, ConnectReply, DisconnectMode, EventSink, Provider, ProviderError,
    ProviderEvent, ReportError, ReportTarget, MAX_IRD_ORD, MAX_PRIVATE_DATA,
};
use crate::sync::{self, lock, wait, Arc, Condvar, Mutex, MutexGuard};
use crate::work::{self, bump, sub, IdJob, RuleBreak};
use core::fmt;
use std::collections::VecDeque;
use std::net::SocketAddr;

/// The shared part of the id's CM instance, with this module's id type.
pub(crate) type Shared<P> = work::Shared<P, IdInner<P>>;
/// A worker job, with this module's id type.
type Job<P> = work::Job<P, IdInner<P>>;

/// Stands for the id's memory: freed (dropped) with the last reference, or at destroy
/// under [`RuleBreak::EagerFree`]. Counts `ids_alive` / `ids_freed`.
struct AllocToken {
    counters: std::sync::Arc<work::Counters>,
}

impl Drop for AllocToken {
    fn drop(&mut self) {
        sub(&self.counters.ids_alive, 1);
        bump(&self.counters.ids_freed);
    }
}

struct IdState<P: Provider> {
    machine: Machine,
    handler: std::sync::Arc<dyn EventHandler<P>>,
    qp: Option<P::Qp>,
    conn: Option<P::Conn>,
    listener: Option<P::Listener>,
    /// Bound of the queue of a listener (its backlog).
    backlog: usize,
    queue: VecDeque<ProviderEvent<P::Conn>>,
    /// A worker job exists for this id, or a delivery is running: new events only
    /// queue. Guarantees one worker at a time per id.
    scheduled: bool,
    /// A handler call for this id is committed or running.
    delivering: bool,
    local_addr: Option<SocketAddr>,
    remote_addr: Option<SocketAddr>,
    alloc: Option<AllocToken>,
}

/// The shared part of a cm_id (the kernel's `iwcm_id_private`).
pub(crate) struct IdInner<P: Provider> {
    pub(crate) serial: u64,
    shared: Arc<Shared<P>>,
    ops: Mutex<()>,
    st: Mutex<IdState<P>>,
    /// Notified when `delivering` goes false.
    cv: Condvar,
    span: tracing::Span,
}

/// The provider-side effects of a transition, gathered under the lock and carried
/// out after it is released.
struct Plan<P: Provider> {
    downcalls: &'static [Downcall],
    /// QP for `Disconnect` (a clone).
    qp: Option<P::Qp>,
    /// QP whose reference `QpRemRef` drops (taken out of the id).
    rem_qp: Option<P::Qp>,
    conn: Option<P::Conn>,
    listener: Option<P::Listener>,
    /// Incoming requests to reject (dropped `ConnectRequest`s).
    rejects: Vec<P::Conn>,
    private_data: Vec<u8>,
    /// Values to drop after the lock is released (their `Drop` may run user or
    /// provider code).
    garbage: Vec<ProviderEvent<P::Conn>>,
    /// The connection handle, released when the connection is over (IDLE or
    /// DESTROYING): the id stops referencing the provider's endpoint.
    old_conn: Option<P::Conn>,
    old_handler: Option<std::sync::Arc<dyn EventHandler<P>>>,
}

impl<P: Provider> Plan<P> {
    fn new(downcalls: &'static [Downcall]) -> Plan<P> {
        Plan {
            downcalls,
            qp: None,
            rem_qp: None,
            conn: None,
            listener: None,
            rejects: Vec::new(),
            private_data: Vec::new(),
            garbage: Vec::new(),
            old_conn: None,
            old_handler: None,
        }
    }
}

/// Once an id is back to `IDLE` or `DESTROYING`, its connection is over: drop the
/// provider's endpoint handle (after the downcalls, which use their own clone).
fn release_conn_when_over<P: Provider>(st: &mut IdState<P>, plan: &mut Plan<P>) {
    if matches!(st.machine.state(), CmState::Idle | CmState::Destroying) {
        plan.old_conn = st.conn.take();
    }
}

/// A handler that ignores everything: what a destroyed id's handler is replaced with,
/// so the user's handler (and all it captured) is dropped at destroy.
struct Inert;

impl<P: Provider> EventHandler<P> for Inert {
    fn on_event(&self, _: &CmIdRef<P>, _: CmEvent<P>) -> Disposition {
        Disposition::Keep
    }
}

impl<P: Provider> IdInner<P> {
    pub(crate) fn new(
        shared: &Arc<Shared<P>>,
        handler: std::sync::Arc<dyn EventHandler<P>>,
        machine: Machine,
    ) -> Arc<IdInner<P>> {
        let serial = shared.next_serial();
        bump(&shared.counters.ids_alive);
        bump(&shared.counters.ids_created);
        let inner = Arc::new(IdInner {
            serial,
            shared: shared.clone(),
            ops: Mutex::new(()),
            st: Mutex::new(IdState {
                machine,
                handler,
                qp: None,
                conn: None,
                listener: None,
                backlog: 0,
                queue: VecDeque::new(),
                scheduled: false,
                delivering: false,
                local_addr: None,
                remote_addr: None,
                alloc: Some(AllocToken {
                    counters: shared.counters.clone(),
                }),
            }),
            cv: Condvar::new(),
            span: tracing::debug_span!(parent: None, "cm_id", id = serial),
        });
        #[cfg(not(loom))]
        shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(serial, std::sync::Arc::downgrade(&inner));
        tracing::trace!(parent: &inner.span, state = %machine.state(), "created");
        inner
    }

    /// Lock the state. Panics on an id whose storage was released early, which only
    /// [`RuleBreak::EagerFree`] does: the stand-in for a use-after-free.
    fn lock_st(&self) -> MutexGuard<'_, IdState<P>> {
        let g = lock(&self.st);
        assert!(
            g.alloc.is_some(),
            "use-after-free: cm_id #{} touched after its storage was released",
            self.serial
        );
        g
    }

    fn provider(&self) -> &P {
        &self.shared.provider
    }

    /// Run a provider downcall (outside every lock, unless the test switch
    /// [`RuleBreak::LockedDowncalls`] is on).
    fn downcall<R>(&self, f: impl FnOnce(&P) -> R) -> R {
        if self.shared.breaks(RuleBreak::LockedDowncalls) {
            let _held = lock(&self.st);
            f(self.provider())
        } else {
            f(self.provider())
        }
    }

    /// Apply `input` to the machine and gather the effects (under `st`).
    fn transition(
        &self,
        st: &mut IdState<P>,
        input: Input,
        op: &'static str,
    ) -> Result<Plan<P>, CmError> {
        let step = st.machine.step(input);
        step.result.map_err(|e| CmError::from_state(op, e))?;
        if st.machine != step.next {
            tracing::debug!(parent: &self.span, from = %st.machine.state(), to = %step.next.state(), ?input, "transition");
        }
        st.machine = step.next;
        let mut plan = Plan::new(step.downcalls);
        for d in step.downcalls {
            match d {
                Downcall::Disconnect(_) => {
                    plan.conn = st.conn.clone();
                    plan.qp = st.qp.clone();
                }
                Downcall::Reject => plan.conn = st.conn.clone(),
                Downcall::QpRemRef => plan.rem_qp = st.qp.take(),
                Downcall::DestroyListen => plan.listener = st.listener.take(),
                // Issued by the caller, which has the arguments.
                Downcall::CreateListen
                | Downcall::Connect
                | Downcall::Accept
                | Downcall::QpAddRef
                | Downcall::RejectRequest => {}
            }
        }
        release_conn_when_over(st, &mut plan);
        Ok(plan)
    }

    /// Carry out the generic downcalls of a plan. Returns the result of `Reject` (the
    /// only one whose error reaches the user).
    ///
    /// The spent plan goes to `trash`, which the caller drops after releasing the `ops`
    /// lock: it may hold the user's old handler, whose `Drop` is user code that may
    /// drop `CmId`s, i.e. destroy ids, this one included.
    fn execute(&self, mut plan: Plan<P>, trash: &mut Vec<Plan<P>>) -> Result<(), ProviderError> {
        let mut result = Ok(());
        for d in plan.downcalls {
            match *d {
                Downcall::Disconnect(mode) => {
                    if let Some(conn) = &plan.conn {
                        if let Err(e) =
                            self.downcall(|p| p.disconnect(conn, plan.qp.as_ref(), mode))
                        {
                            tracing::debug!(parent: &self.span, error = %e, ?mode, "provider disconnect failed (ignored)");
                        }
                    }
                }
                Downcall::Reject => {
                    if let Some(conn) = &plan.conn {
                        result = self.downcall(|p| p.reject(conn, &plan.private_data));
                    }
                }
                Downcall::QpRemRef => {
                    if let Some(qp) = plan.rem_qp.take() {
                        self.downcall(|p| p.qp_rem_ref(&qp));
                    }
                }
                Downcall::DestroyListen => {
                    if let Some(l) = plan.listener.take() {
                        self.downcall(|p| p.destroy_listen(l));
                    }
                }
                Downcall::RejectRequest => {
                    let conns = core::mem::take(&mut plan.rejects);
                    self.reject_requests(conns);
                }
                Downcall::CreateListen
                | Downcall::Connect
                | Downcall::Accept
                | Downcall::QpAddRef => {}
            }
        }
        trash.push(plan);
        result
    }

    /// A one-line description for state dumps.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn describe(&self) -> String {
        let st = lock(&self.st);
        format!(
            "cm_id #{}: {} accept_pending={} queued={} scheduled={} delivering={} qp={} listener={} freed={}",
            self.serial,
            st.machine.state(),
            st.machine.accept_pending(),
            st.queue.len(),
            st.scheduled,
            st.delivering,
            st.qp.is_some(),
            st.listener.is_some(),
            st.alloc.is_none(),
        )
    }

    // ------------------------------------------------------------------ destroy

    /// `destroy_cm_id`: mark the id (DESTROYING drops every event), drop the queued
    /// events, tear down per state, replace the handler. Never waits for the event path
    /// (unless [`RuleBreak::BlockingDestroy`]). Returns whether a delivery was in
    /// progress on the id.
    fn destroy(this: &Arc<Self>) -> bool {
        let _span = this.span.enter();
        // Declared before the ops guard: dropped after it is released.
        let mut trash = Vec::new();
        let _op = lock(&this.ops);
        let (mut plan, in_delivery) = {
            let mut st = this.lock_st();
            let mut plan = this
                .transition(&mut st, Input::Destroy, "destroy")
                .unwrap_or_else(|_| Plan::new(&[]));
            if !this.shared.breaks(RuleBreak::DeliverAfterDestroy) {
                let n = st.queue.len();
                if n > 0 {
                    sub(&this.shared.counters.events_queued, n);
                    for _ in 0..n {
                        bump(&this.shared.counters.events_dropped);
                    }
                    for ev in st.queue.drain(..) {
                        match ev {
                            ProviderEvent::ConnectRequest(req) => plan.rejects.push(req.conn),
                            other => plan.garbage.push(other),
                        }
                    }
                    tracing::debug!(n, "dropped queued events");
                }
                let inert: std::sync::Arc<dyn EventHandler<P>> = std::sync::Arc::new(Inert);
                plan.old_handler = Some(core::mem::replace(&mut st.handler, inert));
            }
            if this.shared.breaks(RuleBreak::EagerFree) {
                st.alloc = None;
            }
            (plan, st.delivering)
        };
        // Queued requests go after the teardown downcalls.
        let rejects = core::mem::take(&mut plan.rejects);
        this.execute(plan, &mut trash).ok();
        this.reject_requests(rejects);
        this.after_destroy(in_delivery)
    }

    /// Reject incoming requests that will never be delivered.
    fn reject_requests(&self, conns: Vec<P::Conn>) {
        for conn in conns {
            bump(&self.shared.counters.requests_rejected_on_destroy);
            if let Err(e) = self.downcall(|p| p.reject(&conn, &[])) {
                tracing::debug!(parent: &self.span, error = %e, "provider reject of a dropped request failed");
            }
        }
    }

    fn after_destroy(&self, in_delivery: bool) -> bool {
        if self.shared.breaks(RuleBreak::BlockingDestroy) {
            let mut st = lock(&self.st);
            while st.delivering {
                st = wait(&self.cv, st);
            }
        }
        tracing::debug!(parent: &self.span, in_delivery, "destroyed");
        in_delivery
    }

    // ----------------------------------------------------------------- delivery

    /// Queue a provider event (`cm_event_handler`): never calls up, never calls the
    /// provider.
    fn report(this: &Arc<Self>, event: ProviderEvent<P::Conn>) -> Result<(), ReportError> {
        let counters = &this.shared.counters;
        let mut reject = None;
        let mut schedule = false;
        let mut garbage = None;
        let result = {
            let mut st = this.lock_st();
            let is_request = matches!(event, ProviderEvent::ConnectRequest(_));
            let limit = if is_request && st.machine.state() == CmState::Listen {
                st.backlog
            } else {
                this.shared.config.max_queued_per_id
            };
            if st.machine.drops_events() && !this.shared.breaks(RuleBreak::DeliverAfterDestroy) {
                bump(&counters.events_dropped);
                match event {
                    ProviderEvent::ConnectRequest(req) => {
                        bump(&counters.requests_rejected_on_destroy);
                        reject = Some(req.conn);
                    }
                    other => garbage = Some(other),
                }
                Err(ReportError::Destroyed)
            } else if st.queue.len() >= limit {
                let overflow = if is_request && st.machine.state() == CmState::Listen {
                    bump(&counters.backlog_rejects);
                    ReportError::BacklogFull
                } else {
                    bump(&counters.unexpected_events);
                    ReportError::QueueFull
                };
                match event {
                    ProviderEvent::ConnectRequest(req) => reject = Some(req.conn),
                    other => garbage = Some(other),
                }
                Err(overflow)
            } else {
                tracing::trace!(parent: &this.span, ?event, "queued");
                st.queue.push_back(event);
                bump(&counters.events_queued);
                if !st.scheduled {
                    st.scheduled = true;
                    schedule = true;
                }
                Ok(())
            }
        };
        drop(garbage);
        if let Some(conn) = reject {
            tracing::debug!(parent: &this.span, ?result, "connect request refused; rejecting at the provider");
            if let Err(job) = this.shared.push_job(Job::Reject(conn)) {
                // No worker left (after shutdown). The reporting thread may be the
                // provider's own engine, where no downcall may run (EventSink's
                // contract): the reject runs on a thread of its own.
                Shared::run_off_thread(&this.shared, vec![job]);
            }
        }
        if schedule {
            if let Err(job) = this.shared.push_job(Job::Run(this.clone())) {
                drop(job);
                let rejects = this.drain_after_shutdown();
                Shared::run_off_thread(&this.shared, rejects);
                return Err(ReportError::Shutdown);
            }
        }
        result
    }

    /// The workers are gone: nothing will ever deliver this id's queue. Returns the
    /// rejects of the connect requests it held, for the caller to run (rule 2: never
    /// dropped silently), inline on an application thread, off the reporting thread in
    /// a report.
    #[must_use]
    fn drain_after_shutdown(&self) -> Vec<Job<P>> {
        let drained: Vec<_> = {
            let mut st = lock(&self.st);
            st.scheduled = false;
            let n = st.queue.len();
            sub(&self.shared.counters.events_queued, n);
            for _ in 0..n {
                bump(&self.shared.counters.events_dropped);
            }
            st.queue.drain(..).collect()
        };
        // A connect request nobody will deliver is still rejected at the provider.
        drained
            .into_iter()
            .filter_map(|event| match event {
                ProviderEvent::ConnectRequest(req) => Some(Job::Reject(req.conn)),
                _ => None,
            })
            .collect()
    }

    /// Take the next event of the id and deliver or drop it (`cm_work_handler`, one
    /// event per job).
    fn run_one(this: &Arc<Self>) {
        let _span = this.span.enter();
        let counters = &this.shared.counters;
        let (event, upcall, plan, handler) = {
            let mut st = this.lock_st();
            let Some(event) = st.queue.pop_front() else {
                st.scheduled = false;
                return;
            };
            sub(&counters.events_queued, 1);
            let kind = event.kind();
            let mut step = st.machine.step(Input::Event(kind));
            if step.upcall == Upcall::Dropped(DropReason::Destroying)
                && this.shared.breaks(RuleBreak::DeliverAfterDestroy)
            {
                step.upcall = Upcall::Deliver;
                step.downcalls = &[];
            }
            if st.machine != step.next {
                tracing::debug!(from = %st.machine.state(), to = %step.next.state(), ?kind, "transition");
            }
            st.machine = step.next;
            let mut plan = Plan::new(step.downcalls);
            if step.downcalls.contains(&Downcall::QpRemRef) {
                plan.rem_qp = st.qp.take();
            }
            release_conn_when_over(&mut st, &mut plan);
            let handler = if step.upcall == Upcall::Deliver {
                st.delivering = true;
                Some(st.handler.clone())
            } else {
                None
            };
            (event, step.upcall, plan, handler)
        };
        let mut plan = plan;
        let event = match upcall {
            Upcall::Deliver => Some(event),
            Upcall::Consumed => {
                bump(&counters.events_consumed);
                tracing::debug!(?event, "consumed (no upcall)");
                None
            }
            Upcall::Dropped(reason) => {
                match reason {
                    DropReason::Destroying => bump(&counters.events_dropped),
                    DropReason::Unexpected => {
                        bump(&counters.unexpected_events);
                        tracing::warn!(
                            ?event,
                            "provider reported an event impossible in this state; dropped"
                        );
                    }
                }
                if let ProviderEvent::ConnectRequest(req) = event {
                    plan.rejects.push(req.conn);
                }
                None
            }
            Upcall::None => None,
        };
        // QP release / request rejection of the transition, outside the lock.
        let mut trash = Vec::new();
        this.execute(plan, &mut trash).ok();
        drop(trash);

        if let (Some(event), Some(handler)) = (event, handler) {
            bump(&counters.events_delivered);
            IdInner::deliver(this, handler, event);
        }

        let reschedule = {
            let mut st = this.lock_st();
            if st.delivering {
                st.delivering = false;
                this.cv.notify_all();
            }
            if st.queue.is_empty() {
                st.scheduled = false;
                false
            } else {
                true
            }
        };
        if reschedule {
            if let Err(job) = this.shared.push_job(Job::Run(this.clone())) {
                drop(job);
                for reject in this.drain_after_shutdown() {
                    this.shared.run(reject);
                }
            }
        }
    }

    /// Call the handler for one event (`process_event`), and destroy on `Destroy`.
    fn deliver(
        this: &Arc<Self>,
        handler: std::sync::Arc<dyn EventHandler<P>>,
        event: ProviderEvent<P::Conn>,
    ) {
        let (target, user_event) = match event {
            ProviderEvent::ConnectRequest(req) => {
                // cm_conn_req_handler: a child id in CONN_RECV inheriting the handler,
                // busy (scheduled + delivering) until this upcall returns, so its own
                // events wait behind the request.
                let child = IdInner::new(&this.shared, handler.clone(), Machine::conn_recv());
                {
                    let mut cst = child.lock_st();
                    cst.conn = Some(req.conn);
                    cst.local_addr = Some(req.local_addr);
                    cst.remote_addr = Some(req.remote_addr);
                    cst.scheduled = true;
                    cst.delivering = true;
                }
                tracing::debug!(child = child.serial, remote = %req.remote_addr, "connect request: child created");
                let ev = CmEvent::ConnectRequest(ConnectRequest {
                    id: CmId::from_inner(child.clone()),
                    private_data: req.private_data,
                    ird: req.ird,
                    ord: req.ord,
                    local_addr: req.local_addr,
                    remote_addr: req.remote_addr,
                });
                (child, ev)
            }
            ProviderEvent::ConnectReply(r) => (this.clone(), CmEvent::ConnectReply(r)),
            ProviderEvent::Established => (this.clone(), CmEvent::Established),
            ProviderEvent::Close => (this.clone(), CmEvent::Close),
            ProviderEvent::Disconnect => return,
        };
        let name = user_event.name();
        tracing::debug!(target_id = target.serial, event = name, "deliver");
        let id_ref = CmIdRef {
            inner: target.clone(),
        };
        let disposition = call_handler(&*handler, &id_ref, user_event, &this.shared);
        drop(handler);
        if disposition == Disposition::Destroy {
            tracing::debug!(
                target_id = target.serial,
                event = name,
                "handler returned Destroy"
            );
            IdInner::destroy(&target);
        }
        drop(id_ref);
        if !Arc::ptr_eq(&target, this) {
            // The child's first delivery is over: let its own events run.
            let reschedule = {
                let mut st = target.lock_st();
                st.delivering = false;
                target.cv.notify_all();
                if st.queue.is_empty() {
                    st.scheduled = false;
                    false
                } else {
                    true
                }
            };
            if reschedule {
                if let Err(job) = this.shared.push_job(Job::Run(target.clone())) {
                    drop(job);
                    for reject in target.drain_after_shutdown() {
                        this.shared.run(reject);
                    }
                }
            }
        }
    }
}

#[cfg(not(loom))]
fn call_handler<P: Provider>(
    handler: &dyn EventHandler<P>,
    id: &CmIdRef<P>,
    event: CmEvent<P>,
    shared: &Shared<P>,
) -> Disposition {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.on_event(id, event))) {
        Ok(d) => d,
        Err(_) => {
            bump(&shared.counters.handler_panics);
            tracing::error!(
                id = id.serial(),
                "event handler panicked; destroying the cm_id"
            );
            Disposition::Destroy
        }
    }
}

/// Under loom a panic is a model failure and must propagate.
#[cfg(loom)]
fn call_handler<P: Provider>(
    handler: &dyn EventHandler<P>,
    id: &CmIdRef<P>,
    event: CmEvent<P>,
    _shared: &Shared<P>,
) -> Disposition {
    handler.on_event(id, event)
}

impl<P: Provider> Drop for IdInner<P> {
    fn drop(&mut self) {
        // The last reference: iwcm_deref_id -> free_cm_id.
        #[cfg(not(loom))]
        {
            let mut reg = self
                .shared
                .registry
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            reg.remove(&self.serial);
        }
        let st = self.st.get_mut().unwrap_or_else(|e| e.into_inner());
        let leftover = st.queue.len();
        if leftover > 0 {
            sub(&self.shared.counters.events_queued, leftover);
        }
        if let Some(qp) = st.qp.take() {
            // Only reachable if a provider dropped every sink of a connected id whose
            // user never destroyed it; keep the reference count balanced.
            tracing::warn!(
                id = self.serial,
                "cm_id freed while holding a QP; releasing it"
            );
            self.shared.provider.qp_rem_ref(&qp);
        }
        tracing::trace!(id = self.serial, "freed");
    }
}

impl<P: Provider> IdJob for IdInner<P> {
    fn run_one(this: &Arc<Self>) {
        IdInner::run_one(this);
    }
}

/// What an [`EventSink`] holds: a reference on its id.
struct SinkTarget<P: Provider>(Arc<IdInner<P>>);

impl<P: Provider> ReportTarget<P> for SinkTarget<P> {
    fn report(&self, event: ProviderEvent<P::Conn>) -> Result<(), ReportError> {
        IdInner::report(&self.0, event)
    }

    fn serial(&self) -> u64 {
        self.0.serial
    }
}

// ---------------------------------------------------------------------- handles

// ----------------------------------------------------------------------- events

/// An event delivered to a cm_id's handler, on a CM worker thread, in the order the
/// provider reported it, one at a time per id (the kernel's `cm_handler` upcalls).
///
/// The provider's `DISCONNECT` is never delivered: it only moves `ESTABLISHED` to
/// `CLOSING` (`cm_disconnect_handler`); the user hears about the end of a connection
/// from [`CmEvent::Close`]. `Established` (passive) or `ConnectReply` with
/// [`ConnectStatus::Ok`](crate::ConnectStatus::Ok) (active) is always delivered before
/// `Close`.
pub enum CmEvent<P: Provider> {
    /// A connection request arrived at a listener (`IW_CM_EVENT_CONNECT_REQUEST`,
    /// `cm_conn_req_handler`). The handler runs for the new child id (`CONN_RECV`),
    /// which inherits the listener's handler.
    ConnectRequest(ConnectRequest<P>),
    /// The outcome of `connect` (`IW_CM_EVENT_CONNECT_REPLY`, `cm_conn_rep_handler`).
    /// On success the id is `ESTABLISHED`; otherwise it is back to `IDLE` and the QP
    /// has been released.
    ConnectReply(ConnectReply),
    /// An accepted connection is established (`IW_CM_EVENT_ESTABLISHED`,
    /// `cm_conn_est_handler`).
    Established,
    /// The connection is closed and the QP is in ERROR (`IW_CM_EVENT_CLOSE`,
    /// `cm_close_handler`); the id is back to `IDLE` and the QP has been released.
    Close,
}

impl<P: Provider> CmEvent<P> {
    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            CmEvent::ConnectRequest(_) => "ConnectRequest",
            CmEvent::ConnectReply(_) => "ConnectReply",
            CmEvent::Established => "Established",
            CmEvent::Close => "Close",
        }
    }
}

impl<P: Provider> fmt::Debug for CmEvent<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmEvent::ConnectRequest(r) => f.debug_tuple("ConnectRequest").field(r).finish(),
            CmEvent::ConnectReply(r) => f.debug_tuple("ConnectReply").field(r).finish(),
            CmEvent::Established => f.write_str("Established"),
            CmEvent::Close => f.write_str("Close"),
        }
    }
}

/// A connection request delivered to a listener's handler.
pub struct ConnectRequest<P: Provider> {
    /// The new child id, owned by the user from now on: keep it to accept or reject
    /// later, or drop it (dropping destroys it, which rejects the request, as
    /// `destroy_cm_id` does in `CONN_RECV`).
    pub id: CmId<P>,
    /// The initiator's private data.
    pub private_data: Vec<u8>,
    /// The initiator's IRD.
    pub ird: u16,
    /// The initiator's ORD.
    pub ord: u16,
    /// Our address of the connection.
    pub local_addr: SocketAddr,
    /// The initiator's address.
    pub remote_addr: SocketAddr,
}

impl<P: Provider> fmt::Debug for ConnectRequest<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectRequest")
            .field("id", &self.id.serial())
            .field("private_data_len", &self.private_data.len())
            .field("ird", &self.ird)
            .field("ord", &self.ord)
            .field("local_addr", &self.local_addr)
            .field("remote_addr", &self.remote_addr)
            .finish()
    }
}

/// What a handler wants done with its id after an event: the kernel's handler return
/// value (0 or non-zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// Keep the id.
    Keep,
    /// Destroy the id, as [`CmId::destroy`] does (`cm_work_handler` calls
    /// `destroy_cm_id` when the handler returns non-zero). For a `ConnectRequest` the
    /// child is destroyed, which rejects the request unless it was accepted (then the
    /// connection is aborted). No further event of the id is delivered.
    Destroy,
}

/// A cm_id's event handler (the kernel's `iw_cm_handler`).
///
/// Called on a CM worker thread, never on the provider's thread and never with a CM
/// lock held, so it may call any downcall on any id ([`CmIdRef::accept`],
/// [`CmIdRef::disconnect`], ...), including destroying ids (its own included). It must
/// not wait for CM delivery: [`crate::IwCm::flush`] and [`crate::Destroyed::wait`]
/// return [`crate::CmError::InDeliveryContext`] there. A child id made for a
/// `ConnectRequest` inherits its listener's handler (`cm_conn_req_handler`); use
/// [`CmIdRef::set_handler`] to give it its own.
///
/// Closures `Fn(&CmIdRef<P>, CmEvent<P>) -> Disposition + Send + Sync + 'static`
/// implement it.
pub trait EventHandler<P: Provider>: Send + Sync + 'static {
    /// Handle one event of `id`.
    fn on_event(&self, id: &CmIdRef<P>, event: CmEvent<P>) -> Disposition;
}

impl<P, F> EventHandler<P> for F
where
    P: Provider,
    F: Fn(&CmIdRef<P>, CmEvent<P>) -> Disposition + Send + Sync + 'static,
{
    fn on_event(&self, id: &CmIdRef<P>, event: CmEvent<P>) -> Disposition {
        self(id, event)
    }
}

/// A reference to a cm_id that can issue the CM calls but does not own the id:
/// what handlers receive, and what [`CmId`] dereferences to.
pub struct CmIdRef<P: Provider> {
    inner: Arc<IdInner<P>>,
}

impl<P: Provider> fmt::Debug for CmIdRef<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmIdRef")
            .field("serial", &self.inner.serial)
            .field("state", &self.state())
            .finish()
    }
}

/// The arguments of [`CmIdRef::connect`] (the kernel's `iw_cm_conn_param` and the
/// id's addresses).
#[derive(Debug, Clone)]
pub struct ConnectParams<Q> {
    /// The QP to connect; referenced ([`Provider::qp_add_ref`]) until the connection
    /// ends or the id is destroyed.
    pub qp: Q,
    /// The local address to bind, if any.
    pub local_addr: Option<SocketAddr>,
    /// The peer.
    pub remote_addr: SocketAddr,
    /// Private data for the MPA Request (at most [`MAX_PRIVATE_DATA`] bytes).
    pub private_data: Vec<u8>,
    /// Our IRD (at most [`MAX_IRD_ORD`]).
    pub ird: u16,
    /// Our ORD (at most [`MAX_IRD_ORD`]).
    pub ord: u16,
}

/// The arguments of [`CmIdRef::accept`].
#[derive(Debug, Clone)]
pub struct AcceptParams<Q> {
    /// The QP to bind; referenced until the connection ends or the id is destroyed.
    pub qp: Q,
    /// Private data for the MPA Reply (at most [`MAX_PRIVATE_DATA`] bytes).
    pub private_data: Vec<u8>,
    /// Our IRD (at most [`MAX_IRD_ORD`]).
    pub ird: u16,
    /// Our ORD (at most [`MAX_IRD_ORD`]).
    pub ord: u16,
}

fn check_private_data(pd: &[u8]) -> Result<(), CmError> {
    if pd.len() > MAX_PRIVATE_DATA {
        return Err(CmError::PrivateDataTooLong {
            len: pd.len(),
            max: MAX_PRIVATE_DATA,
        });
    }
    Ok(())
}

fn check_ird_ord(ird: u16, ord: u16) -> Result<(), CmError> {
    for (what, value) in [("IRD", ird), ("ORD", ord)] {
        if value > MAX_IRD_ORD {
            return Err(CmError::IrdOrdTooLarge { what, value });
        }
    }
    Ok(())
}

impl<P: Provider> CmIdRef<P> {
    fn sink(&self) -> EventSink<P> {
        EventSink::new(std::sync::Arc::new(SinkTarget(self.inner.clone())))
    }

    /// The id's serial number, unique within its CM instance (for logs and tracing
    /// spans: `cm_id{id=N}`).
    pub fn serial(&self) -> u64 {
        self.inner.serial
    }

    /// The current state.
    pub fn state(&self) -> CmState {
        lock(&self.inner.st).machine.state()
    }

    /// The local address (listen address, connect's local address, or the local
    /// address of an incoming connection).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        lock(&self.inner.st).local_addr
    }

    /// The remote address (connect's peer, or the initiator of an incoming
    /// connection).
    pub fn remote_addr(&self) -> Option<SocketAddr> {
        lock(&self.inner.st).remote_addr
    }

    /// Replace the handler for the next events (what rdma-cm does to a child id:
    /// `cm_id->cm_handler = cma_iw_handler`). A delivery in progress keeps the old one.
    /// Ignored once the id is being destroyed.
    pub fn set_handler(&self, handler: std::sync::Arc<dyn EventHandler<P>>) {
        let old = {
            let mut st = self.inner.lock_st();
            if st.machine.drops_events() {
                return;
            }
            core::mem::replace(&mut st.handler, handler)
        };
        drop(old);
    }

    /// Listen for connect requests on `local_addr` (`iw_cm_listen`): `IDLE` ->
    /// `LISTEN`. Up to `backlog` requests (0: [`crate::CmConfig::default_backlog`])
    /// wait for delivery; more are rejected at the provider.
    ///
    /// # Errors
    /// [`CmError::InvalidState`] unless `IDLE`; [`CmError::Destroyed`];
    /// [`CmError::Provider`] if `create_listen` fails (the id is back to `IDLE`).
    pub fn listen(&self, local_addr: SocketAddr, backlog: u32) -> Result<(), CmError> {
        let inner = &self.inner;
        let _span = inner.span.enter();
        let backlog = if backlog == 0 {
            inner.shared.config.default_backlog
        } else {
            backlog
        };
        // Declared before the ops guard: dropped after it is released.
        let mut trash = Vec::new();
        let _op = lock(&inner.ops);
        {
            let mut st = inner.lock_st();
            inner.transition(&mut st, Input::Listen, "listen")?;
            st.backlog = backlog as usize;
            st.local_addr = Some(local_addr);
        }
        let sink = self.sink();
        match inner.downcall(|p| p.create_listen(sink, local_addr, backlog)) {
            Ok(listener) => {
                inner.lock_st().listener = Some(listener);
                Ok(())
            }
            Err(e) => {
                let plan = inner.transition(&mut inner.lock_st(), Input::ListenFailed, "listen")?;
                inner.execute(plan, &mut trash).ok();
                Err(e.into())
            }
        }
    }

    /// Connect (`iw_cm_connect`): `IDLE` -> `CONN_SENT`; the outcome arrives as
    /// [`CmEvent::ConnectReply`].
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`], [`CmError::IrdOrdTooLarge`];
    /// [`CmError::InvalidState`] unless `IDLE`; [`CmError::Destroyed`];
    /// [`CmError::Provider`] if the provider refuses (the QP is released and the id is
    /// back to `IDLE`, no event follows).
    pub fn connect(&self, params: ConnectParams<P::Qp>) -> Result<(), CmError> {
        check_private_data(&params.private_data)?;
        check_ird_ord(params.ird, params.ord)?;
        let inner = &self.inner;
        let _span = inner.span.enter();
        // Declared before the ops guard: dropped after it is released.
        let mut trash = Vec::new();
        let _op = lock(&inner.ops);
        {
            let mut st = inner.lock_st();
            inner.transition(&mut st, Input::Connect, "connect")?;
            st.qp = Some(params.qp.clone());
            st.local_addr = params.local_addr;
            st.remote_addr = Some(params.remote_addr);
        }
        inner.downcall(|p| p.qp_add_ref(&params.qp));
        let sink = self.sink();
        let args = ConnectArgs {
            qp: &params.qp,
            local_addr: params.local_addr,
            remote_addr: params.remote_addr,
            private_data: &params.private_data,
            ird: params.ird,
            ord: params.ord,
        };
        match inner.downcall(|p| p.connect(sink, args)) {
            Ok(conn) => {
                // A reply may already have ended the attempt (reported from inside
                // `connect` and processed by a worker): then the handle is not kept.
                let mut st = inner.lock_st();
                let mut spent = Plan::new(&[]);
                if matches!(st.machine.state(), CmState::Idle | CmState::Destroying) {
                    spent.old_conn = Some(conn);
                } else {
                    spent.old_conn = st.conn.replace(conn);
                }
                drop(st);
                trash.push(spent);
                Ok(())
            }
            Err(e) => {
                let plan =
                    inner.transition(&mut inner.lock_st(), Input::ConnectFailed, "connect")?;
                inner.execute(plan, &mut trash).ok();
                Err(e.into())
            }
        }
    }

    /// Accept the connect request this child id was made for (`iw_cm_accept`): stays
    /// `CONN_RECV` (accept in flight) until [`CmEvent::Established`].
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`], [`CmError::IrdOrdTooLarge`];
    /// [`CmError::InvalidState`] unless `CONN_RECV`; [`CmError::Busy`] if already
    /// accepted; [`CmError::Destroyed`]; [`CmError::Provider`] if the provider refuses
    /// (the QP is released and the id goes to `IDLE`, as in the kernel).
    pub fn accept(&self, params: AcceptParams<P::Qp>) -> Result<(), CmError> {
        check_private_data(&params.private_data)?;
        check_ird_ord(params.ird, params.ord)?;
        let inner = &self.inner;
        let _span = inner.span.enter();
        // Declared before the ops guard: dropped after it is released.
        let mut trash = Vec::new();
        let _op = lock(&inner.ops);
        let conn = {
            let mut st = inner.lock_st();
            inner.transition(&mut st, Input::Accept, "accept")?;
            st.qp = Some(params.qp.clone());
            st.conn.clone()
        };
        inner.downcall(|p| p.qp_add_ref(&params.qp));
        let sink = self.sink();
        let args = AcceptArgs {
            qp: &params.qp,
            private_data: &params.private_data,
            ird: params.ird,
            ord: params.ord,
        };
        let result = match &conn {
            Some(conn) => inner.downcall(|p| p.accept(sink, conn, args)),
            None => Err(ProviderError::NotConnected),
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) => {
                let plan = inner.transition(&mut inner.lock_st(), Input::AcceptFailed, "accept")?;
                inner.execute(plan, &mut trash).ok();
                Err(e.into())
            }
        }
    }

    /// Reject the connect request this child id was made for (`iw_cm_reject`):
    /// `CONN_RECV` -> `IDLE`; no event follows.
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`]; [`CmError::InvalidState`] unless `CONN_RECV`;
    /// [`CmError::Busy`] if already accepted; [`CmError::Destroyed`];
    /// [`CmError::Provider`] from the provider's reject.
    pub fn reject(&self, private_data: &[u8]) -> Result<(), CmError> {
        check_private_data(private_data)?;
        let inner = &self.inner;
        let _span = inner.span.enter();
        // Declared before the ops guard: dropped after it is released.
        let mut trash = Vec::new();
        let _op = lock(&inner.ops);
        let mut plan = inner.transition(&mut inner.lock_st(), Input::Reject, "reject")?;
        plan.private_data = private_data.to_vec();
        inner.execute(plan, &mut trash).map_err(CmError::from)
    }

    /// Disconnect (`iw_cm_disconnect`): `ESTABLISHED` -> `CLOSING` and the provider
    /// closes gracefully or abortively; [`CmEvent::Close`] follows. A no-op in `IDLE`,
    /// `CONN_RECV` (before accept) and `CLOSING` (the peer closed first), as in the
    /// kernel. Provider errors are ignored (both sides may be closing at once).
    ///
    /// # Errors
    /// [`CmError::InvalidState`] on a listener; [`CmError::Busy`] while a connect or
    /// accept is in flight; [`CmError::Destroyed`].
    pub fn disconnect(&self, mode: DisconnectMode) -> Result<(), CmError> {
        let inner = &self.inner;
        let _span = inner.span.enter();
        // Declared before the ops guard: dropped after it is released.
        let mut trash = Vec::new();
        let _op = lock(&inner.ops);
        let plan = inner.transition(&mut inner.lock_st(), Input::Disconnect(mode), "disconnect")?;
        inner.execute(plan, &mut trash).ok();
        Ok(())
    }
}

/// A cm_id, owned by the user: the creator's reference (`iw_create_cm_id`'s
/// reference). Dereferences to [`CmIdRef`] for the CM calls. Dropping it destroys the
/// id, like [`CmId::destroy`].
pub struct CmId<P: Provider> {
    r: CmIdRef<P>,
    destroyed: bool,
}

impl<P: Provider> fmt::Debug for CmId<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("serial", &self.r.inner.serial)
            .field("state", &self.r.state())
            .finish()
    }
}

impl<P: Provider> core::ops::Deref for CmId<P> {
    type Target = CmIdRef<P>;
    fn deref(&self) -> &CmIdRef<P> {
        &self.r
    }
}

impl<P: Provider> CmId<P> {
    pub(crate) fn from_inner(inner: Arc<IdInner<P>>) -> CmId<P> {
        CmId {
            r: CmIdRef { inner },
            destroyed: false,
        }
    }

    /// Destroy the id (`iw_destroy_cm_id`), without waiting for the event path:
    ///
    /// 1. mark it `DESTROYING` so that no further event is delivered
    ///    (`IWCM_F_DROP_EVENTS`) and drop the events already queued (a queued
    ///    `ConnectRequest` is rejected at the provider);
    /// 2. tear down per state (`destroy_cm_id`): a listener is destroyed
    ///    (`destroy_listen`); a pending request is rejected; a connection, established
    ///    or closing, or a connect/accept in flight is aborted (abortive disconnect:
    ///    QP to ERROR) and the QP released;
    /// 3. replace the handler, so the user's handler and what it captured are dropped
    ///    (now, or when the delivery in progress returns);
    /// 4. drop the creator's reference. The memory goes with the last reference
    ///    (provider sinks, worker jobs).
    ///
    /// Safe from anywhere, including the id's own handler. After it returns, no handler
    /// call for this id *starts*; one that had already started (see
    /// [`Destroyed::delivery_in_progress`]) may still be running: use
    /// [`Destroyed::wait`] from outside handlers to wait for it (what the kernel's 2024
    /// fix does with `flush_workqueue`; here the handler's captured state lives in an
    /// `Arc`, so not waiting cannot cause a use-after-free).
    pub fn destroy(mut self) -> Destroyed<P> {
        self.destroyed = true;
        let in_delivery = IdInner::destroy(&self.r.inner);
        Destroyed {
            id: if in_delivery {
                Some(self.r.inner.clone())
            } else {
                None
            },
        }
    }
}

impl<P: Provider> Drop for CmId<P> {
    fn drop(&mut self) {
        if !self.destroyed {
            IdInner::destroy(&self.r.inner);
        }
    }
}

/// What [`CmId::destroy`] returns: whether a handler call for the id was in progress,
/// and a way to wait for it.
#[must_use = "destroy has happened; use `delivery_in_progress`/`wait`, or ignore the result with `let _ =`"]
pub struct Destroyed<P: Provider> {
    id: Option<Arc<IdInner<P>>>,
}

impl<P: Provider> fmt::Debug for Destroyed<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Destroyed")
            .field("delivery_in_progress", &self.id.is_some())
            .finish()
    }
}

impl<P: Provider> Destroyed<P> {
    /// Whether a handler call for the id had started (or was committed to start) when
    /// destroy marked it; if `false`, the handler is never called for it again.
    pub fn delivery_in_progress(&self) -> bool {
        self.id.is_some()
    }

    /// Wait until the handler call in progress (if any) has returned; after that the
    /// handler never runs for this id again.
    ///
    /// # Errors
    /// [`CmError::InDeliveryContext`] on a CM worker thread (from a handler): waiting
    /// there could wait for itself. Nothing was waited for.
    pub fn wait(self) -> Result<(), CmError> {
        if sync::in_delivery_context() {
            return Err(CmError::InDeliveryContext {
                op: "Destroyed::wait",
            });
        }
        if let Some(id) = &self.id {
            let mut st = lock(&id.st);
            while st.delivering {
                st = wait(&id.cv, st);
            }
        }
        Ok(())
    }
}

/// Whether the current thread is a CM worker thread, where handlers run and waiting
/// for delivery is refused with [`CmError::InDeliveryContext`].
pub fn in_delivery_context() -> bool {
    sync::in_delivery_context()
}
