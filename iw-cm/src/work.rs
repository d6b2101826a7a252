//! One CM instance per provider (device): its worker threads, job queue, counters.

use crate::error::CmError;
use crate::event::EventHandler;
use crate::id::{CmId, IdInner};
use crate::provider::Provider;
use crate::sync::{self, lock, wait, Arc, Condvar, JoinHandle, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// A rule of design.md section 5 that a test may switch off, to show that the loom
/// models and stress tests catch its violation. Never set outside such a test; the
/// default ([`CmConfig::rule_break`] = `None`) keeps every rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleBreak {
    /// Ignore `IWCM_F_DROP_EVENTS`: destroy leaves queued events in place and the
    /// worker delivers events of a destroyed id (rule 3, "events still queued for a
    /// destroyed id are discarded").
    DeliverAfterDestroy,
    /// Make destroy wait until the delivery in progress on the id has returned, as the
    /// kernel did before the 2016 fix (rule 3, "destroy never blocks on anything the
    /// event path needs"): destroying from inside the handler then deadlocks.
    BlockingDestroy,
    /// Keep the id's lock held across provider downcalls (rule 1: a provider reporting
    /// an event from inside a downcall then deadlocks).
    LockedDowncalls,
    /// Release the id's storage at destroy instead of at the last reference (rule 3,
    /// "memory is freed when the last reference goes"). Safe Rust cannot free early, so
    /// the storage is a token that every access checks: touching an id whose token is
    /// gone panics with "use-after-free", as the kernel's UAF would corrupt memory.
    EagerFree,
}

impl RuleBreak {
    /// Parse the names used by the `IWCM_BREAK` environment variable of the tests:
    /// `deliver-after-destroy`, `blocking-destroy`, `locked-downcalls`, `eager-free`.
    pub fn from_name(name: &str) -> Option<RuleBreak> {
        match name {
            "deliver-after-destroy" => Some(RuleBreak::DeliverAfterDestroy),
            "blocking-destroy" => Some(RuleBreak::BlockingDestroy),
            "locked-downcalls" => Some(RuleBreak::LockedDowncalls),
            "eager-free" => Some(RuleBreak::EagerFree),
            _ => None,
        }
    }
}

/// Configuration of one CM instance.
#[derive(Debug, Clone)]
pub struct CmConfig {
    /// A name for the worker threads and logs (e.g. the device name).
    pub name: String,
    /// Worker threads delivering events (at least 1). Events of one id are delivered in
    /// order, one at a time, whatever the number (the kernel uses one ordered workqueue,
    /// `iw_cm_wq`, which is `workers: 1`).
    pub workers: usize,
    /// The backlog used when `listen` is given 0 (the kernel's
    /// `net.iw_cm.default_backlog`, 256).
    pub default_backlog: u32,
    /// The most events queued on a non-listening id; more is a provider bug (the kernel
    /// preallocates 4 work entries per connection and fails the upcall with `-ENOMEM`
    /// beyond).
    pub max_queued_per_id: usize,
    /// Test-only: a rule to break (see [`RuleBreak`]). `None` in any real use.
    pub rule_break: Option<RuleBreak>,
}

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig {
            name: "iwcm".to_string(),
            workers: 1,
            default_backlog: 256,
            max_queued_per_id: 16,
            rule_break: None,
        }
    }
}

/// Live-object and event counters of one CM instance, for tests proving that
/// nothing leaks ([`IwCm::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmStats {
    /// cm_ids whose memory is not freed yet.
    pub ids_alive: usize,
    /// cm_ids ever created (user ids and children).
    pub ids_created: usize,
    /// cm_ids freed (at their last reference).
    pub ids_freed: usize,
    /// Events in per-id queues, not yet taken by a worker.
    pub events_queued: usize,
    /// Events delivered to handlers.
    pub events_delivered: usize,
    /// Events discarded because their id was being destroyed.
    pub events_dropped: usize,
    /// Events that changed state without an upcall (`DISCONNECT`).
    pub events_consumed: usize,
    /// Events the provider reported in a state where they are impossible (the kernel
    /// `BUG()`s), plus events refused because an id's queue was full.
    pub unexpected_events: usize,
    /// Connect requests beyond a listener's backlog, rejected at the provider.
    pub backlog_rejects: usize,
    /// Connect requests dropped because their listener was destroyed, rejected at the
    /// provider.
    pub requests_rejected_on_destroy: usize,
    /// Handlers that panicked (the id was destroyed).
    pub handler_panics: usize,
    /// Jobs waiting for a worker plus jobs being run.
    pub jobs_pending: usize,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) ids_alive: AtomicUsize,
    pub(crate) ids_created: AtomicUsize,
    pub(crate) ids_freed: AtomicUsize,
    pub(crate) events_queued: AtomicUsize,
    pub(crate) events_delivered: AtomicUsize,
    pub(crate) events_dropped: AtomicUsize,
    pub(crate) events_consumed: AtomicUsize,
    pub(crate) unexpected_events: AtomicUsize,
    pub(crate) backlog_rejects: AtomicUsize,
    pub(crate) requests_rejected_on_destroy: AtomicUsize,
    pub(crate) handler_panics: AtomicUsize,
}

pub(crate) fn bump(c: &AtomicUsize) {
    c.fetch_add(1, Relaxed);
}

pub(crate) fn sub(c: &AtomicUsize, n: usize) {
    c.fetch_sub(n, Relaxed);
}

/// Work for a CM worker.
pub(crate) enum Job<P: Provider> {
    /// Deliver (or drop) the next queued event of this id.
    Run(Arc<IdInner<P>>),
    /// Reject a connection request at the provider (backlog full, or its listener was
    /// destroyed): done on a worker so the provider is never called back from inside
    /// its own event report.
    Reject(P::Conn),
}

struct JobQueue<P: Provider> {
    jobs: VecDeque<Job<P>>,
    /// Jobs taken by a worker and not finished.
    busy: usize,
    /// Workers still running.
    workers: usize,
    stopping: bool,
}

/// What every id of one instance shares.
pub(crate) struct Shared<P: Provider> {
    pub(crate) provider: std::sync::Arc<P>,
    pub(crate) config: CmConfig,
    pub(crate) counters: std::sync::Arc<Counters>,
    next_serial: AtomicUsize,
    jobs: Mutex<JobQueue<P>>,
    /// Workers wait here for jobs.
    jobs_cv: Condvar,
    /// `flush` waits here for the queue to drain.
    idle_cv: Condvar,
    #[cfg(not(loom))]
    pub(crate) registry:
        std::sync::Mutex<std::collections::HashMap<u64, std::sync::Weak<IdInner<P>>>>,
}

impl<P: Provider> Shared<P> {
    pub(crate) fn breaks(&self, rule: RuleBreak) -> bool {
        self.config.rule_break == Some(rule)
    }

    pub(crate) fn next_serial(&self) -> u64 {
        self.next_serial.fetch_add(1, Relaxed) as u64 + 1
    }

    /// Queue a job; gives it back if every worker has exited (after shutdown).
    pub(crate) fn push_job(&self, job: Job<P>) -> Result<(), Job<P>> {
        let mut q = lock(&self.jobs);
        if q.workers == 0 {
            return Err(job);
        }
        q.jobs.push_back(job);
        drop(q);
        self.jobs_cv.notify_one();
        Ok(())
    }

    fn next_job(&self) -> Option<Job<P>> {
        let mut q = lock(&self.jobs);
        loop {
            if let Some(job) = q.jobs.pop_front() {
                q.busy += 1;
                return Some(job);
            }
            if q.stopping {
                q.workers -= 1;
                if q.workers == 0 {
                    drop(q);
                    self.idle_cv.notify_all();
                }
                return None;
            }
            q = wait(&self.jobs_cv, q);
        }
    }

    fn job_done(&self) {
        let mut q = lock(&self.jobs);
        q.busy -= 1;
        let idle = q.busy == 0 && q.jobs.is_empty();
        drop(q);
        if idle {
            self.idle_cv.notify_all();
        }
    }

    /// Runs one job on the calling thread (a worker; or, after shutdown, whoever holds a
    /// job no worker will take: a refused connect request must still be rejected at the
    /// provider, never dropped silently).
    pub(crate) fn run(&self, job: Job<P>) {
        match job {
            Job::Run(id) => IdInner::run_one(&id),
            Job::Reject(conn) => {
                if let Err(e) = self.provider.reject(&conn, &[]) {
                    tracing::debug!(error = %e, "provider reject of a refused request failed");
                }
            }
        }
    }

    pub(crate) fn stats(&self) -> CmStats {
        let c = &self.counters;
        let q = lock(&self.jobs);
        let jobs_pending = q.jobs.len() + q.busy;
        drop(q);
        CmStats {
            ids_alive: c.ids_alive.load(Relaxed),
            ids_created: c.ids_created.load(Relaxed),
            ids_freed: c.ids_freed.load(Relaxed),
            events_queued: c.events_queued.load(Relaxed),
            events_delivered: c.events_delivered.load(Relaxed),
            events_dropped: c.events_dropped.load(Relaxed),
            events_consumed: c.events_consumed.load(Relaxed),
            unexpected_events: c.unexpected_events.load(Relaxed),
            backlog_rejects: c.backlog_rejects.load(Relaxed),
            requests_rejected_on_destroy: c.requests_rejected_on_destroy.load(Relaxed),
            handler_panics: c.handler_panics.load(Relaxed),
            jobs_pending,
        }
    }
}

fn worker_main<P: Provider>(shared: Arc<Shared<P>>) {
    sync::set_delivery_context(true);
    while let Some(job) = shared.next_job() {
        shared.run(job);
        shared.job_done();
    }
    sync::set_delivery_context(false);
}

/// An iWARP CM instance bound to one provider (device): the kernel's `iw_cm` for one
/// `ib_device`, with its own ordered worker(s) (`iw_cm_wq`).
///
/// Dropping it stops the workers after the queued jobs are done (and joins them,
/// unless dropped on a worker). Ids outlive it safely; events reported after the
/// workers stopped are dropped.
pub struct IwCm<P: Provider> {
    shared: Arc<Shared<P>>,
    workers: Vec<JoinHandle<()>>,
}

impl<P: Provider> core::fmt::Debug for IwCm<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IwCm")
            .field("name", &self.shared.config.name)
            .field("stats", &self.shared.stats())
            .finish_non_exhaustive()
    }
}

impl<P: Provider> IwCm<P> {
    /// Start a CM instance over `provider` with `config.workers` worker threads.
    ///
    /// # Errors
    /// [`CmError::Spawn`] if a worker thread cannot be started.
    pub fn new(provider: std::sync::Arc<P>, config: CmConfig) -> Result<IwCm<P>, CmError> {
        let workers = config.workers.max(1);
        let name = config.name.clone();
        let shared = Arc::new(Shared {
            provider,
            config,
            counters: std::sync::Arc::new(Counters::default()),
            next_serial: AtomicUsize::new(0),
            jobs: Mutex::new(JobQueue {
                jobs: VecDeque::new(),
                busy: 0,
                workers,
                stopping: false,
            }),
            jobs_cv: Condvar::new(),
            idle_cv: Condvar::new(),
            #[cfg(not(loom))]
            registry: std::sync::Mutex::new(std::collections::HashMap::new()),
        });
        let mut cm = IwCm {
            shared,
            workers: Vec::with_capacity(workers),
        };
        for n in 0..workers {
            let shared = cm.shared.clone();
            match sync::spawn(format!("{name}-worker-{n}"), move || worker_main(shared)) {
                Ok(handle) => cm.workers.push(handle),
                Err(e) => {
                    // Account for the workers that will never run, then stop the rest.
                    lock(&cm.shared.jobs).workers -= workers - n;
                    return Err(CmError::Spawn(e.to_string()));
                }
            }
        }
        Ok(cm)
    }

    /// Create a cm_id in `IDLE` whose events go to `handler` (`iw_create_cm_id`). The
    /// returned [`CmId`] is the creator's reference; dropping it destroys the id.
    pub fn create_id<H: EventHandler<P>>(&self, handler: H) -> CmId<P> {
        self.create_id_shared(std::sync::Arc::new(handler))
    }

    /// [`IwCm::create_id`] with a handler shared with other ids.
    pub fn create_id_shared(&self, handler: std::sync::Arc<dyn EventHandler<P>>) -> CmId<P> {
        CmId::from_inner(IdInner::new(
            &self.shared,
            handler,
            crate::machine::Machine::new(),
        ))
    }

    /// The provider.
    pub fn provider(&self) -> &std::sync::Arc<P> {
        &self.shared.provider
    }

    /// The instance's name.
    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// A snapshot of the live-object and event counters.
    pub fn stats(&self) -> CmStats {
        self.shared.stats()
    }

    /// Wait until every queued job has been run and no delivery is in progress
    /// (the kernel's `flush_workqueue(iw_cm_wq)`). Events reported meanwhile are
    /// waited for too.
    ///
    /// # Errors
    /// [`CmError::InDeliveryContext`] on a CM worker thread (from a handler), where it
    /// would wait for itself; nothing is waited for.
    pub fn flush(&self) -> Result<(), CmError> {
        if sync::in_delivery_context() {
            return Err(CmError::InDeliveryContext { op: "flush" });
        }
        let mut q = lock(&self.shared.jobs);
        while !(q.jobs.is_empty() && q.busy == 0) && q.workers > 0 {
            q = wait(&self.shared.idle_cv, q);
        }
        Ok(())
    }

    /// [`IwCm::flush`] with a deadline.
    ///
    /// # Errors
    /// [`CmError::InDeliveryContext`] as for `flush`; [`CmError::Timeout`] if the
    /// workers are still busy after `timeout`.
    #[cfg(not(loom))]
    pub fn flush_timeout(&self, timeout: std::time::Duration) -> Result<(), CmError> {
        if sync::in_delivery_context() {
            return Err(CmError::InDeliveryContext { op: "flush" });
        }
        let deadline = std::time::Instant::now() + timeout;
        let mut q = lock(&self.shared.jobs);
        while !(q.jobs.is_empty() && q.busy == 0) && q.workers > 0 {
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(CmError::Timeout);
            }
            q = self
                .shared
                .idle_cv
                .wait_timeout(q, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        Ok(())
    }

    /// A human-readable dump of the instance: counters, and each live id's state,
    /// queue length and delivery flags (for watchdogs and debugging).
    pub fn dump_state(&self) -> String {
        use core::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "iw-cm {}: {:?}", self.shared.config.name, self.stats());
        #[cfg(not(loom))]
        {
            let ids: Vec<_> = {
                let reg = self
                    .shared
                    .registry
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let mut v: Vec<_> = reg.values().filter_map(|w| w.upgrade()).collect();
                v.sort_by_key(|id| id.serial);
                v
            };
            for id in &ids {
                let _ = writeln!(out, "  {}", id.describe());
            }
            drop(ids);
        }
        out
    }

    /// Stop the workers after the queued jobs are done and join them.
    ///
    /// # Errors
    /// [`CmError::InDeliveryContext`] on a CM worker thread (it would join itself); the
    /// workers are then told to stop but not joined.
    pub fn shutdown(mut self) -> Result<(), CmError> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<(), CmError> {
        lock(&self.shared.jobs).stopping = true;
        self.shared.jobs_cv.notify_all();
        if sync::in_delivery_context() {
            self.workers.clear();
            return Err(CmError::InDeliveryContext { op: "shutdown" });
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        Ok(())
    }
}

impl<P: Provider> Drop for IwCm<P> {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}
