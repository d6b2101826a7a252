//! The synchronization primitives the CM uses (counters are plain `std` atomics: they
//! order nothing): `std`'s normally, loom's model-checked
//! ones when built with `RUSTFLAGS="--cfg loom"` (see README.md). Everything that two
//! CM threads share goes through here, so the loom models check the real code.

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread::JoinHandle;

#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread::JoinHandle;

/// Lock, ignoring poisoning: no CM code panics while holding a lock (handlers run
/// outside every lock), so a poisoned lock still guards consistent data.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Wait on `cv`, ignoring poisoning (see [`lock`]).
pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(|e| e.into_inner())
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

#[cfg(loom)]
loom::thread_local! {
    static IN_DELIVERY: core::cell::Cell<bool> = core::cell::Cell::new(false);
}
#[cfg(not(loom))]
std::thread_local! {
    static IN_DELIVERY: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Mark the current thread as a CM worker (the delivery context) or not.
pub(crate) fn set_delivery_context(on: bool) {
    IN_DELIVERY.with(|c| c.set(on));
}

/// Whether the current thread is a CM worker thread, i.e. user handlers run on it.
pub(crate) fn in_delivery_context() -> bool {
    IN_DELIVERY.with(|c| c.get())
}
