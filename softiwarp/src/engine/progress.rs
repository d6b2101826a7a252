//! The progress lock: who drives a device, and how work published by one thread is
//! never stranded while another holds the lock (shared/progress-design.md section 3.1,
//! design.md section 5 "Progress").
//!
//! **Room.** The device-independent protocol only: a [`Progress`] owns a driver (any
//! [`Drive`]: the device's protocol state in softiwarp, a toy that counts work in the
//! loom models) behind one mutex that is only ever *try*-locked, a `pending` flag, and
//! the [`Gate`] that decides which posted work a device end still has to flush. It
//! knows nothing of stacks, QPs or links.
//!
//! # The protocol (the Linux lockless qdisc's `MISSED` rule)
//!
//! A thread with work publishes it first (its own queue: a QP's posted WRs, the command
//! channel, a doorbell), then calls [`Progress::drive`]:
//!
//! ```text
//! pending := true
//! loop {
//!     fence(SeqCst)                         // store pending / load lock: store-load
//!     try-lock, or return Busy              // the holder will see `pending`
//!     pending := false                      // before the pass looks at the queues
//!     pass (takes every published queue, up to the budget)
//!     unlock; run the outbox                // wake-ups, wakers, closures: no user code under the lock
//!     fence(SeqCst)                         // unlock is a release only: store-load again
//!     if !pending or budget spent: return
//! }
//! ```
//!
//! Nobody waits on the lock: a thread that loses the try-lock leaves its work published
//! and returns at once, and the holder's re-check runs it. Work left when the budget is
//! spent keeps `pending` set, and `left_pending` in [`Drove::Drove`] tells the caller to hand it to
//! the engine thread. Both fences are needed: the Linux qdisc protocol lost packets
//! without the second one ("net: sched: fix packet stuck problem for lockless qdisc",
//! a90c57f2cedd, and the `smp_mb()` after `spin_unlock` that followed), and the loom
//! model `loom_progress::poster_against_holder` fails without either
//! ([`ProgressBreak::NoFence`]) or with `pending` cleared after the pass
//! ([`ProgressBreak::ClearAfterPass`]).
//!
//! # Posting against the end of the device
//!
//! [`Gate`]: a poster holds the gate open (a read guard) while it queues its work; the
//! driver that ends the device closes it (the write lock) before it takes every queue
//! one last time, so a WR a post call accepted is always taken (and flushed), and a WR
//! refused gets `DeviceGone` (model `loom_progress::post_against_device_end`).
//!
//! A panic inside a pass poisons the lock; the next driver takes the driver out and
//! ends the device ([`Drove::Ended`]), since its state may be half-updated
//! (progress-design.md section 3.9, risk 4).

use std::sync::atomic::Ordering::{Acquire, Release, SeqCst};
use std::sync::TryLockError;

use crate::progress_outbox::InDriver;
use crate::sync::{fence, AtomicBool, AtomicU64, Mutex, RwLock, RwLockReadGuard};

// The outbox of the progress lock lives below the layers that defer into it
// (`crate::progress_outbox`); the progress lock marks its passes with it and runs it
// after unlock, and `softiwarp::progress` keeps offering it.
pub use crate::progress_outbox::{
    assert_outside_driver, defer_call, defer_wake, in_driver, run_deferred,
};

/// How much one [`Progress::drive`] call may do: at most `passes` passes of the driver,
/// each with at most `rounds` transmit rounds per connection (the driver's unit; siw
/// caps a burst in the caller's context at `SQ_USER_MAXBURST`, 100 frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Passes, at least 1.
    pub passes: u32,
    /// Rounds per pass, handed to [`Drive::pass`].
    pub rounds: u32,
}

/// What one pass of a driver did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pass {
    /// It moved something (a frame, a WR, a command).
    pub active: bool,
    /// It stopped at its budget with work left: `pending` stays set.
    pub more: bool,
    /// The device ended in this pass: the driver is taken out and retired (see
    /// [`Progress::drop_retired`]).
    pub ended: bool,
}

/// Deferred actions of a pass: run by [`Progress::drive`] after the lock is released
/// (the kernel's `wake_q`: "do the wakeups once the corresponding user lock has been
/// released").
pub trait Outbox: Default {
    /// Runs (and empties) the deferred actions. Called with the lock released.
    fn run(&mut self);
}

/// A driver: what the holder of the progress lock runs.
pub trait Drive {
    /// The deferred actions one pass produces.
    type Outbox: Outbox;
    /// One pass: take every published queue, do up to `rounds` rounds of work, put
    /// wake-ups and anything else that may run foreign code into `out`. Must not block
    /// and must not run user code (checked by [`assert_outside_driver`] in debug builds).
    fn pass(&mut self, rounds: u32, out: &mut Self::Outbox) -> Pass;
}

/// What a [`Progress::drive`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drove {
    /// Another thread holds the lock: it will run this caller's published work.
    Busy,
    /// This thread ran `passes` passes (`active` if any moved something);
    /// `left_pending` if it stopped at its budget with work left (wake the engine).
    Drove {
        /// Passes run, at least 1.
        passes: u32,
        /// Some pass moved something.
        active: bool,
        /// Work is left for the next driver.
        left_pending: bool,
    },
    /// The device ended (now or before): there is no driver any more.
    Ended,
}

/// A deliberate break of the protocol, for the loom models only (each model must fail
/// with its break): see the [module documentation](self).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressBreak {
    /// Leave out both `fence(SeqCst)`s.
    NoFence,
    /// Clear `pending` after the pass instead of before it.
    ClearAfterPass,
    /// Do not hold the gate while queueing (the poster checks it, drops it, then queues).
    UngatedPost,
    /// The engine takes a lapsed lease by reading it, without a compare-and-swap.
    ViewWithoutCas,
}

/// One device's progress lock. See the [module documentation](self).
pub struct Progress<D> {
    driver: Mutex<Option<D>>,
    /// The driver of an ended device, until [`Progress::drop_retired`] (or the lock's
    /// own drop) frees it.
    retired: Mutex<Option<D>>,
    pending: AtomicBool,
    brk: Option<ProgressBreak>,
}

impl<D> std::fmt::Debug for Progress<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("pending", &self.pending.load(Acquire))
            .finish_non_exhaustive()
    }
}

impl<D: Drive> Progress<D> {
    /// A progress lock around `driver`.
    pub fn new(driver: D) -> Self {
        Self::with_break(driver, None)
    }

    /// As [`Progress::new`], with a deliberate break (loom models only).
    #[doc(hidden)]
    pub fn with_break(driver: D, brk: Option<ProgressBreak>) -> Self {
        Progress {
            driver: Mutex::new(Some(driver)),
            retired: Mutex::new(None),
            pending: AtomicBool::new(false),
            brk,
        }
    }

    fn fence(&self) {
        if self.brk != Some(ProgressBreak::NoFence) {
            fence(SeqCst);
        }
    }

    /// True if published work waits for a driver (a cheap check for the engine thread
    /// before it sleeps).
    pub fn pending(&self) -> bool {
        self.fence();
        self.pending.load(Acquire)
    }

    /// Drives the device if no other thread does, within `budget`; otherwise leaves the
    /// caller's published work to the holder. Never blocks. Runs each pass's
    /// [`Outbox`] after the lock is released.
    pub fn drive(&self, budget: Budget) -> Drove {
        assert_outside_driver("Progress::drive");
        self.pending.store(true, Release);
        let mut passes = 0;
        let mut active = false;
        loop {
            self.fence();
            let mut guard = match self.driver.try_lock() {
                Ok(g) => g,
                Err(TryLockError::WouldBlock) => {
                    return if passes == 0 {
                        Drove::Busy
                    } else {
                        Drove::Drove {
                            passes,
                            active,
                            left_pending: false,
                        }
                    };
                }
                Err(TryLockError::Poisoned(p)) => {
                    // A pass panicked: its state may be half-updated; end the device.
                    let mut g = p.into_inner();
                    if let Some(d) = g.take() {
                        self.retire(d);
                    }
                    return Drove::Ended;
                }
            };
            let Some(driver) = guard.as_mut() else {
                return Drove::Ended;
            };
            let clear_late = self.brk == Some(ProgressBreak::ClearAfterPass);
            if !clear_late {
                self.pending.store(false, Release);
            }
            let mut out = D::Outbox::default();
            let pass = {
                let _in = InDriver::enter();
                driver.pass(budget.rounds, &mut out)
            };
            if clear_late {
                self.pending.store(false, Release);
            }
            if pass.more {
                self.pending.store(true, Release);
            }
            // Retired while the lock is held: whoever then finds no driver finds it.
            let ended = pass.ended && guard.take().map(|d| self.retire(d)).is_some();
            drop(guard);
            out.run();
            passes += 1;
            active |= pass.active;
            if ended {
                return Drove::Ended;
            }
            self.fence();
            let pending = self.pending.load(Acquire);
            if !pending || passes >= budget.passes.max(1) {
                return Drove::Drove {
                    passes,
                    active,
                    left_pending: pending,
                };
            }
        }
    }

    /// Keeps the driver of an ended device for [`Progress::drop_retired`].
    fn retire(&self, d: D) {
        *self
            .retired
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(d);
    }

    /// Frees the driver of an ended device, if it has not been freed yet; true if this
    /// call freed it. Freeing it can block: it closes the device's link (a TAP fd
    /// whose interface `ip link del` is deleting waits in the kernel until the deletion
    /// is done: seconds on a loaded machine). The pass that ends the device may run on
    /// an application thread inside a verbs call, so the driver is not freed there; the
    /// engine thread calls this when it sees [`Drove::Ended`] (and the lock's own drop
    /// frees a driver no one freed).
    pub fn drop_retired(&self) -> bool {
        let d = self
            .retired
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        d.is_some()
    }

    /// Runs `f` on the driver if the lock is free (the engine thread's bookkeeping before
    /// it sleeps). Returns false when another thread holds the lock or the device
    /// ended: the caller must not sleep on the assumption that `f` ran.
    pub fn with_driver(&self, f: impl FnOnce(&mut D)) -> bool {
        let Ok(mut g) = self.driver.try_lock() else {
            return false;
        };
        let Some(d) = g.as_mut() else {
            return false;
        };
        {
            let _in = InDriver::enter();
            f(d);
        }
        drop(g);
        run_deferred();
        true
    }
}

/// The gate of a device's work queues: open while the device runs, closed for good by
/// the driver that ends it. See the [module documentation](self).
#[derive(Debug)]
pub struct Gate {
    closed: RwLock<bool>,
    brk: Option<ProgressBreak>,
}

/// Proof that the gate was open: while it lives, work queued is certain to be taken by
/// a driver (or flushed by the device's end).
#[derive(Debug)]
pub struct GateOpen<'a> {
    _guard: Option<RwLockReadGuard<'a, bool>>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate::with_break(None)
    }
}

impl Gate {
    /// An open gate.
    pub fn new() -> Self {
        Gate::default()
    }

    /// As [`Gate::new`], with a deliberate break (loom models only).
    #[doc(hidden)]
    pub fn with_break(brk: Option<ProgressBreak>) -> Self {
        Gate {
            closed: RwLock::new(false),
            brk,
        }
    }

    /// Holds the gate open for the caller's queueing; `None` once it is closed (the
    /// caller answers `DeviceGone`).
    pub fn enter(&self) -> Option<GateOpen<'_>> {
        let g = self.closed.read().unwrap_or_else(|p| p.into_inner());
        if *g {
            return None;
        }
        if self.brk == Some(ProgressBreak::UngatedPost) {
            drop(g);
            return Some(GateOpen { _guard: None });
        }
        Some(GateOpen { _guard: Some(g) })
    }

    /// Closes the gate (waits for the posters inside it, who only queue). Afterwards no
    /// [`Gate::enter`] succeeds, so taking every queue once more gets all accepted work.
    pub fn close(&self) {
        *self.closed.write().unwrap_or_else(|p| p.into_inner()) = true;
    }

    /// True once closed.
    pub fn is_closed(&self) -> bool {
        *self.closed.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// Who covers the link of a device in [`crate::ProgressMode::Hybrid`]
/// (progress-design.md section 3.3; the NAPI busy-poll "pledge" with a lapsing lease):
///
/// - **engine**: the engine thread polls the link fd and drives (as in
///   [`crate::ProgressMode::Engine`]);
/// - **app lease until T**: an application thread drove recently and will call in
///   again; until T (microseconds since the device started) the engine thread sleeps on
///   its wake-up alone and leaves the link to it; after T it takes over;
/// - **app polling**: exactly one application thread, blocked in a CQ wait, sleeps on
///   the link fd and drives; the engine sleeps on its wake-up alone.
///
/// Any transition is one compare-and-swap; at most one thread is ever in the polling
/// state ([`Owner::try_poll`]).
#[derive(Debug)]
pub struct Owner(AtomicU64, Option<ProgressBreak>);

const OWNER_ENGINE: u64 = 0;
const OWNER_POLLING: u64 = 1;
const OWNER_LEASE: u64 = 2;

/// What the engine thread should do now ([`Owner::engine_view`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineView {
    /// The engine covers the link: drive, spin, sleep on the link fd.
    Engine,
    /// An application thread holds a lease until this time (microseconds since the
    /// device started): sleep on the wake-up alone until then.
    Lease(u64),
    /// An application thread polls the link: sleep on the wake-up alone.
    AppPolling,
}

impl Default for Owner {
    fn default() -> Self {
        Owner(AtomicU64::new(OWNER_ENGINE), None)
    }
}

impl Owner {
    /// The engine covers the link.
    pub fn new() -> Self {
        Owner::default()
    }

    /// As [`Owner::new`], with a deliberate break (loom models only).
    #[doc(hidden)]
    pub fn with_break(brk: Option<ProgressBreak>) -> Self {
        Owner(AtomicU64::new(OWNER_ENGINE), brk)
    }

    fn lease_word(until_us: u64) -> u64 {
        (until_us << 2) | OWNER_LEASE
    }

    /// An application thread drove: it holds the lease until `until_us`, unless a
    /// poller is active (which keeps the link).
    pub fn lease(&self, until_us: u64) {
        let mut cur = self.0.load(Acquire);
        loop {
            if cur == OWNER_POLLING {
                return;
            }
            match self
                .0
                .compare_exchange_weak(cur, Self::lease_word(until_us), SeqCst, Acquire)
            {
                Ok(_) => return,
                Err(c) => cur = c,
            }
        }
    }

    /// The calling application thread becomes the one poller of the link. False if
    /// another thread polls. Returns `Some(true)` when it took the link from the engine
    /// (which must then be woken to leave the link fd).
    pub fn try_poll(&self) -> Option<bool> {
        let mut cur = self.0.load(Acquire);
        loop {
            if cur == OWNER_POLLING {
                return None;
            }
            match self
                .0
                .compare_exchange_weak(cur, OWNER_POLLING, SeqCst, Acquire)
            {
                Ok(prev) => return Some(prev == OWNER_ENGINE),
                Err(c) => cur = c,
            }
        }
    }

    /// The poller leaves, keeping a lease until `until_us` (the engine takes over
    /// after it).
    pub fn stop_polling(&self, until_us: u64) {
        let _ = self
            .0
            .compare_exchange(OWNER_POLLING, Self::lease_word(until_us), SeqCst, Acquire);
    }

    /// True if the engine covers the link at `now_us` (its own, or a lapsed lease it
    /// will take at its next look). A read only: no transition.
    pub fn is_engine(&self, now_us: u64) -> bool {
        let cur = self.0.load(Acquire);
        match cur & 3 {
            OWNER_POLLING => false,
            OWNER_LEASE => now_us >= cur >> 2,
            _ => true,
        }
    }

    /// The engine thread's view at `now_us`: a lapsed lease becomes the engine's.
    pub fn engine_view(&self, now_us: u64) -> EngineView {
        let cur = self.0.load(Acquire);
        match cur & 3 {
            OWNER_POLLING => EngineView::AppPolling,
            OWNER_LEASE => {
                let until = cur >> 2;
                if now_us < until {
                    return EngineView::Lease(until);
                }
                if self.1 == Some(ProgressBreak::ViewWithoutCas) {
                    return EngineView::Engine;
                }
                match self.0.compare_exchange(cur, OWNER_ENGINE, SeqCst, Acquire) {
                    Ok(_) => EngineView::Engine,
                    // Renewed, or a poller came: look again next time.
                    Err(c) if c == OWNER_POLLING => EngineView::AppPolling,
                    Err(c) if c & 3 == OWNER_LEASE => EngineView::Lease(c >> 2),
                    Err(_) => EngineView::Engine,
                }
            }
            _ => EngineView::Engine,
        }
    }
}
