//! What every id of one CM instance shares (the kernel's `iw_cm_wq` and its work
//! items): the configuration, the counters, the job queue and the worker threads that
//! run it.
//!
//! This module sits below `id` (the id engine) and `cm` ([`crate::IwCm`], the
//! instance): it names no id type. A job that runs an id reaches it through the small
//! trait [`IdJob`], which the id engine implements; [`Shared`] is generic over it
//! (static dispatch: a queued job owns a `crate::sync::Arc` of its id, which loom
//! must see).

use crate::provider::Provider;
use crate::sync::{self, lock, wait, Arc, Condvar, Mutex};
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
/// nothing leaks ([`crate::IwCm::stats`]).
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

/// What a worker does with an id whose job comes up: implemented by the id engine
/// (`crate::id`), which sits above this module.
pub(crate) trait IdJob: Send + Sync + Sized + 'static {
    /// Take the id's next queued event and deliver or drop it (`cm_work_handler`,
    /// one event per job).
    fn run_one(this: &Arc<Self>);
}

/// Work for a CM worker; `I` is the id type ([`IdJob`]).
pub(crate) enum Job<P: Provider, I> {
    /// Deliver (or drop) the next queued event of this id.
    Run(Arc<I>),
    /// Reject a connection request at the provider (backlog full, or its listener was
    /// destroyed): done on a worker so the provider is never called back from inside
    /// its own event report.
    Reject(P::Conn),
}

struct JobQueue<P: Provider, I> {
    jobs: VecDeque<Job<P, I>>,
    /// Jobs taken by a worker and not finished.
    busy: usize,
    /// Workers still running.
    workers: usize,
    stopping: bool,
}

/// What every id of one instance shares; `I` is the id type ([`IdJob`]).
pub(crate) struct Shared<P: Provider, I: IdJob> {
    pub(crate) provider: std::sync::Arc<P>,
    pub(crate) config: CmConfig,
    pub(crate) counters: std::sync::Arc<Counters>,
    next_serial: AtomicUsize,
    jobs: Mutex<JobQueue<P, I>>,
    /// Workers wait here for jobs.
    jobs_cv: Condvar,
    /// `flush` waits here for the queue to drain.
    idle_cv: Condvar,
    #[cfg(not(loom))]
    pub(crate) registry: std::sync::Mutex<std::collections::HashMap<u64, std::sync::Weak<I>>>,
}

impl<P: Provider, I: IdJob> Shared<P, I> {
    /// The shared part of an instance that will have `workers` worker threads.
    pub(crate) fn new(provider: std::sync::Arc<P>, config: CmConfig, workers: usize) -> Self {
        Shared {
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
        }
    }

    /// Account for `n` workers that will never run (their threads could not start).
    pub(crate) fn workers_lost(&self, n: usize) {
        lock(&self.jobs).workers -= n;
    }

    pub(crate) fn breaks(&self, rule: RuleBreak) -> bool {
        self.config.rule_break == Some(rule)
    }

    pub(crate) fn next_serial(&self) -> u64 {
        self.next_serial.fetch_add(1, Relaxed) as u64 + 1
    }

    /// Queue a job; gives it back if every worker has exited (after shutdown).
    pub(crate) fn push_job(&self, job: Job<P, I>) -> Result<(), Job<P, I>> {
        let mut q = lock(&self.jobs);
        if q.workers == 0 {
            return Err(job);
        }
        q.jobs.push_back(job);
        drop(q);
        self.jobs_cv.notify_one();
        Ok(())
    }

    fn next_job(&self) -> Option<Job<P, I>> {
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

    /// Runs `jobs` (rejects of connect requests after shutdown) on a thread of their
    /// own, for a caller that must not call the provider: a report, perhaps on the
    /// provider's engine thread. If no thread can start, the requests are left to the
    /// initiator's MPA timeout, with a warning.
    pub(crate) fn run_off_thread(this: &Arc<Self>, jobs: Vec<Job<P, I>>) {
        if jobs.is_empty() {
            return;
        }
        let shared = this.clone();
        let n = jobs.len();
        let spawned = sync::spawn("iwcm-reject".into(), move || {
            for job in jobs {
                shared.run(job);
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, requests = n, "cannot start a thread to reject connect requests after shutdown");
        }
    }

    /// Runs one job on the calling thread (a worker; or, after shutdown, whoever holds a
    /// job no worker will take: a refused connect request must still be rejected at the
    /// provider, never dropped silently).
    pub(crate) fn run(&self, job: Job<P, I>) {
        match job {
            Job::Run(id) => I::run_one(&id),
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

    /// Wait until every queued job has been run and no job is running, or every worker
    /// has exited (`flush_workqueue`).
    pub(crate) fn wait_idle(&self) {
        let mut q = lock(&self.jobs);
        while !(q.jobs.is_empty() && q.busy == 0) && q.workers > 0 {
            q = wait(&self.idle_cv, q);
        }
    }

    /// [`Shared::wait_idle`] with a deadline; `false` if it passed first.
    #[cfg(not(loom))]
    pub(crate) fn wait_idle_timeout(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut q = lock(&self.jobs);
        while !(q.jobs.is_empty() && q.busy == 0) && q.workers > 0 {
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            q = self
                .idle_cv
                .wait_timeout(q, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        true
    }

    /// Tell the workers to stop once the queued jobs are done.
    pub(crate) fn stop_workers(&self) {
        lock(&self.jobs).stopping = true;
        self.jobs_cv.notify_all();
    }
}

/// A worker thread: run jobs until told to stop.
pub(crate) fn worker_main<P: Provider, I: IdJob>(shared: Arc<Shared<P, I>>) {
    sync::set_delivery_context(true);
    while let Some(job) = shared.next_job() {
        shared.run(job);
        shared.job_done();
    }
    sync::set_delivery_context(false);
}
