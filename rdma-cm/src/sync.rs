//! The synchronization primitives of the RDMA CM: `std`'s normally, loom's model-checked
//! ones when built with `RUSTFLAGS="--cfg loom"` (see README.md). Everything that two
//! threads of the CM share goes through here, so the loom models check the real code.
//! Counters are plain `std` atomics: they order nothing.
//!
//! Two thread-local facts live here too:
//!
//! * the **handler locks this thread holds** (the ids whose callback serialization it
//!   owns right now, i.e. whose callback it is running): `destroy` of such an id from
//!   this thread would wait for itself, so it is refused with
//!   [`crate::CmError::DestroyInOwnCallback`];
//! * a **thread token**, a small number naming the thread, recorded in every event an
//!   event channel hands out, so that `destroy` can tell "an un-acked event of this id
//!   is held by the calling thread" (librdmacm hangs there) from "held by another
//!   thread" (wait for its ack, as librdmacm does).

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread::JoinHandle;

#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread::JoinHandle;

use core::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Lock, ignoring poisoning: user callbacks run under a handler lock, and a callback
/// that panics is caught (outside loom) before the guard is dropped; the data behind
/// every other lock is kept consistent before any call that could panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Wait on `cv`, ignoring poisoning (see [`lock`]).
pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(|e| e.into_inner())
}

/// Wait on `cv` for at most `dur` (std only: loom has no time).
#[cfg(not(loom))]
pub(crate) fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    dur: std::time::Duration,
) -> MutexGuard<'a, T> {
    cv.wait_timeout(guard, dur)
        .map(|(g, _)| g)
        .unwrap_or_else(|e| e.into_inner().0)
}

/// Spawn a named thread.
pub(crate) fn spawn<F>(name: String, f: F) -> std::io::Result<JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    #[cfg(loom)]
    {
        loom::thread::Builder::new().name(name).spawn(f)
    }
    #[cfg(not(loom))]
    {
        std::thread::Builder::new().name(name).spawn(f)
    }
}

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

#[cfg(loom)]
loom::thread_local! {
    static HELD: RefCell<Vec<u64>> = RefCell::new(Vec::new());
    static TOKEN: Cell<u64> = Cell::new(0);
    static ON_WORKER: Cell<bool> = Cell::new(false);
}
#[cfg(not(loom))]
std::thread_local! {
    static HELD: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static TOKEN: Cell<u64> = const { Cell::new(0) };
    static ON_WORKER: Cell<bool> = const { Cell::new(false) };
}

/// Record that this thread now holds the handler lock of id `serial`.
pub(crate) fn push_held(serial: u64) {
    HELD.with(|h| h.borrow_mut().push(serial));
}

/// Record that this thread released the handler lock of id `serial`.
pub(crate) fn pop_held(serial: u64) {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if let Some(pos) = h.iter().rposition(|&s| s == serial) {
            h.remove(pos);
        }
    });
}

/// Whether this thread holds the handler lock of id `serial` (runs its callback).
pub(crate) fn holds(serial: u64) -> bool {
    HELD.with(|h| h.borrow().contains(&serial))
}

/// Whether this thread runs a callback of any id.
pub(crate) fn in_callback() -> bool {
    HELD.with(|h| !h.borrow().is_empty())
}

/// This thread's token (allocated on first use).
pub(crate) fn thread_token() -> u64 {
    TOKEN.with(|t| {
        if t.get() == 0 {
            t.set(NEXT_TOKEN.fetch_add(1, Relaxed));
        }
        t.get()
    })
}

/// Mark the current thread as the CM's worker thread (or not).
pub(crate) fn set_on_worker(on: bool) {
    ON_WORKER.with(|c| c.set(on));
}

/// Whether the current thread is the CM's worker thread.
pub(crate) fn on_worker() -> bool {
    ON_WORKER.with(|c| c.get())
}
