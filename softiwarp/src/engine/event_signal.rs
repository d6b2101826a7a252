//! A counter with a condition variable that the engine raises after it queued
//! connection, listener or device events, so that one thread can drain many of a
//! device's event queues (the iw-cm provider thread, [`crate::cm::iwcm`]) and sleep
//! while none has anything.
//!
//! The engine only increments the counter and notifies (a short critical section that
//! never blocks); a waiter remembers the value it last saw and sleeps until it changes.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// See the [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct EventSignal {
    seq: Mutex<u64>,
    cond: Condvar,
}

impl EventSignal {
    /// Raises the signal: every waiter wakes.
    pub(crate) fn notify(&self) {
        let mut g = self.seq.lock().unwrap_or_else(|p| p.into_inner());
        *g = g.wrapping_add(1);
        drop(g);
        self.cond.notify_all();
    }

    /// The current value.
    pub(crate) fn current(&self) -> u64 {
        *self.seq.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits up to `timeout` until the value differs from `seen`; returns the value then
    /// (equal to `seen` on timeout).
    pub(crate) fn wait_past(&self, seen: u64, timeout: Duration) -> u64 {
        let g = self.seq.lock().unwrap_or_else(|p| p.into_inner());
        let (g, _) = self
            .cond
            .wait_timeout_while(g, timeout, |v| *v == seen)
            .unwrap_or_else(|p| p.into_inner());
        *g
    }
}
