//! The queues that carry events out of the engine thread (device events, connection
//! requests, verbs asynchronous events) to the threads that wait for them, and how
//! they end ([`DeviceEnd`]).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant as StdInstant};

use crate::link::GoneReason;

/// What ended a device, as later calls report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEnd {
    /// The link is gone.
    Gone(GoneReason),
    /// The device was shut down.
    Closed,
}

/// A queue with a condition variable, for events leaving the engine.
#[derive(Debug)]
pub(crate) struct EventQueue<T> {
    inner: Mutex<(VecDeque<T>, Option<DeviceEnd>)>,
    cond: Condvar,
}

impl<T> EventQueue<T> {
    pub(crate) fn new() -> Self {
        EventQueue {
            inner: Mutex::new((VecDeque::new(), None)),
            cond: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (VecDeque<T>, Option<DeviceEnd>)> {
        // Every critical section is a push, a pop or a flag set: a poisoned lock still
        // holds a consistent queue.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn push(&self, item: T) {
        self.lock().0.push_back(item);
        self.cond.notify_all();
    }

    /// Takes every queued item.
    pub(crate) fn drain(&self) -> Vec<T> {
        self.lock().0.drain(..).collect()
    }

    /// Marks the queue ended (nothing more will come).
    pub(crate) fn end(&self, end: DeviceEnd) {
        self.lock().1.get_or_insert(end);
        self.cond.notify_all();
    }

    /// The next item, waiting up to `timeout`. `Err(Some(end))` once the queue is empty
    /// and ended, `Err(None)` on timeout.
    pub(crate) fn pop(&self, timeout: Duration) -> Result<T, Option<DeviceEnd>> {
        let deadline = StdInstant::now() + timeout;
        let mut g = self.lock();
        loop {
            if let Some(item) = g.0.pop_front() {
                return Ok(item);
            }
            if let Some(end) = g.1 {
                return Err(Some(end));
            }
            let left = deadline
                .checked_duration_since(StdInstant::now())
                .filter(|d| !d.is_zero())
                .ok_or(None)?;
            g = self
                .cond
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}
