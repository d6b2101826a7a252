//! The outbox of the progress lock: what a pass holds back until the lock is released
//! (the kernel's `wake_q`: "do the wakeups once the corresponding user lock has been
//! released"), and the thread-local mark that says a thread is inside a pass.
//!
//! **Room.** Below every layer that runs inside a pass: the completion queues
//! (`resources`: an executor's waker), neighbour resolution (`transport`: the caller's
//! closure) and the progress lock itself ([`crate::progress`], which marks its passes
//! and runs the outbox after unlock) all take these helpers from here, so no lower
//! layer imports the engine. It knows nothing of devices, stacks or QPs: a thread-local
//! flag and a thread-local list.
//!
//! The rule it serves is design.md section 5's "no user code under the progress lock":
//! [`defer_wake`] and [`defer_call`] run foreign code at once outside a pass and after
//! unlock inside one; [`assert_outside_driver`] fails a blocking call made from inside
//! a pass (debug builds).

use core::cell::{Cell, RefCell};

thread_local! {
    static IN_DRIVER: Cell<bool> = const { Cell::new(false) };
    static DEFERRED: RefCell<Vec<Deferred>> = const { RefCell::new(Vec::new()) };
}

/// Something that may run foreign code, held back until the progress lock is released.
enum Deferred {
    Wake(std::task::Waker),
    Call(Box<dyn FnOnce() + Send>),
}

/// Wakes `waker` now, or, inside a pass, once the pass's lock is released (an executor's
/// waker is foreign code: it may poll a task inline).
pub fn defer_wake(waker: std::task::Waker) {
    if in_driver() {
        DEFERRED.with(|d| d.borrow_mut().push(Deferred::Wake(waker)));
    } else {
        waker.wake();
    }
}

/// Runs `f` now, or, inside a pass, once the pass's lock is released (a completion
/// closure handed in by a caller, such as a neighbour resolution's reply).
pub fn defer_call(f: impl FnOnce() + Send + 'static) {
    if in_driver() {
        DEFERRED.with(|d| d.borrow_mut().push(Deferred::Call(Box::new(f))));
    } else {
        f();
    }
}

/// Runs what this thread deferred during its pass (an
/// [`Outbox`](crate::progress::Outbox) calls it after the lock is released). Loom models
/// share one OS thread between modelled threads, so their toy drivers defer nothing.
pub fn run_deferred() {
    loop {
        let batch = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
        if batch.is_empty() {
            return;
        }
        for item in batch {
            match item {
                Deferred::Wake(w) => w.wake(),
                Deferred::Call(f) => f(),
            }
        }
    }
}

/// Debug assertion: the calling thread is not inside a pass (holding a progress lock).
/// Called where user code may run or a thread may block (CQ waits, deferred wakers), so
/// that "no user code under the progress lock" (design.md section 5) fails loudly.
pub fn assert_outside_driver(what: &str) {
    debug_assert!(
        !IN_DRIVER.with(Cell::get),
        "{what} inside a progress pass (the progress lock is held: no user code, no blocking)"
    );
}

/// True while the calling thread runs a pass.
pub fn in_driver() -> bool {
    IN_DRIVER.with(Cell::get)
}

/// The mark of a pass on its thread: set by [`InDriver::enter`], cleared when dropped
/// (the progress lock holds one around each pass and each `with_driver` closure).
pub(crate) struct InDriver;

impl InDriver {
    /// Marks the calling thread as inside a pass until the guard is dropped.
    pub(crate) fn enter() -> InDriver {
        IN_DRIVER.with(|c| c.set(true));
        InDriver
    }
}

impl Drop for InDriver {
    fn drop(&mut self) {
        IN_DRIVER.with(|c| c.set(false));
    }
}
