//! Completion queues (`ibv_create_cq(3)`, `ibv_poll_cq(3)`).
//!
//! A [`CompletionQueue`] is a bounded FIFO of [`WorkCompletion`]s shared (`Arc<CompletionQueue>`) by the
//! engine, which pushes, and application threads, which poll or wait. Nothing runs
//! user code on the engine's behalf (design.md §5): waiting is a blocking
//! [`CompletionQueue::wait`] on a condition variable, or the future [`CompletionQueue::wait_async`], usable from
//! tokio or any other executor (it only registers the task's `Waker`).
//!
//! # Overflow
//!
//! A CQ holds at most [`CompletionQueue::capacity`] completions. A completion that does not fit is
//! never dropped silently: it is counted ([`CompletionQueue::lost`]), the CQ enters the error
//! state ([`CompletionQueue::is_error`], `IBV_EVENT_CQ_ERR` in libibverbs terms: "CQ overrun"),
//! every later completion is counted as lost too, one
//! [`AsyncEvent::CqErr`] is queued for [`CompletionQueue::take_async_event`], waiters are woken,
//! and [`CompletionQueue::poll`] returns [`CqError::Overflow`] once the entries that did fit are
//! taken. The engine that pushed learns of it through [`CompletionQueue::push`]'s error and moves
//! the QP to Error (a lost completion breaks the exactly-once contract).
//!
//! One mutex guards the queue; it is held only to move entries in or out, never while
//! user code runs.
//!
//! # Notifying only registered waiters
//!
//! A blocking [`CompletionQueue::wait`] counts itself in the CQ's waiters (under the
//! lock) before it sleeps on the condition variable; [`CompletionQueue::push`] reads the
//! count under the same lock hold that queues the completion and notifies the condition
//! variable only when it is non-zero (std's futex condvar makes a `FUTEX_WAKE` system
//! call on every notify, waiters or not). Since both sides decide under the lock, no
//! wake-up is lost: the loom model `loom_progress::cq_notify_against_waiter` checks it,
//! and fails when the count is read before the completion is queued
//! (`ProgressBreak`-style switch [`CompletionQueue::with_notify_break`]).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use verbs::{AsyncEvent, VerbsError, WorkCompletion};

use crate::sync::{Condvar, Mutex, MutexGuard};

/// Largest CQ capacity accepted, in entries (siw's `SIW_MAX_CQE` is 64 Ki; we allow
/// more for bulk tests).
pub const MAX_CQE: usize = 1 << 22;

/// Why a CQ cannot be polled: it overflowed and is in the error state, or it was
/// destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum CqError {
    /// More completions arrived than the CQ holds; `lost` of them were dropped
    /// (counted, never silently) and the CQ is unusable.
    #[error("CQ {cq:#x} overflowed: {lost} completions lost")]
    Overflow {
        /// The CQ's handle.
        cq: u32,
        /// Completions that did not fit, so far.
        lost: u64,
    },
    /// The CQ was destroyed (`softiwarp::Cq::destroy`): nothing is delivered from it
    /// any more.
    #[error("CQ {cq:#x} destroyed")]
    Destroyed {
        /// The CQ's handle.
        cq: u32,
    },
}

#[derive(Debug, Default)]
struct Inner {
    queue: VecDeque<WorkCompletion>,
    lost: u64,
    error: bool,
    event: Option<AsyncEvent>,
    wakers: Vec<Waker>,
    /// Threads inside [`CompletionQueue::wait`] (registered before they sleep).
    waiters: usize,
}

/// A completion queue of bounded capacity. See the [module documentation](self).
#[derive(Debug)]
pub struct CompletionQueue {
    handle: u32,
    capacity: usize,
    inner: Mutex<Inner>,
    ready: Condvar,
    /// Loom models only: read the waiter count before queueing (a lost wake-up).
    notify_break: bool,
}

impl CompletionQueue {
    /// A CQ named `handle` holding up to `capacity` completions (`ibv_create_cq(3)`
    /// `cqe`).
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidArgument`] `"cqe"` if `capacity` is 0 or above
    /// [`MAX_CQE`] (`EINVAL`, as `ibv_create_cq(3)`).
    pub fn new(handle: u32, capacity: usize) -> Result<Arc<CompletionQueue>, VerbsError> {
        if capacity == 0 || capacity > MAX_CQE {
            return Err(VerbsError::InvalidArgument { what: "cqe" });
        }
        Ok(Arc::new(CompletionQueue {
            handle,
            capacity,
            inner: Mutex::new(Inner::default()),
            ready: Condvar::new(),
            notify_break: false,
        }))
    }

    /// As [`CompletionQueue::new`], with the waiter count read before the completion is
    /// queued: the lost wake-up the loom model must find. Never use it elsewhere.
    ///
    /// # Errors
    ///
    /// As [`CompletionQueue::new`].
    #[doc(hidden)]
    pub fn with_notify_break(
        handle: u32,
        capacity: usize,
    ) -> Result<Arc<CompletionQueue>, VerbsError> {
        let cq = CompletionQueue::new(handle, capacity)?;
        let mut cq = Arc::into_inner(cq).expect("just made");
        cq.notify_break = true;
        Ok(Arc::new(cq))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The CQ's handle (used in [`AsyncEvent::CqErr`]).
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Capacity, in completions.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Completions queued now.
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// True if no completion is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True once the CQ overflowed (see the [module documentation](self)).
    pub fn is_error(&self) -> bool {
        self.lock().error
    }

    /// Completions lost to overflow so far.
    pub fn lost(&self) -> u64 {
        self.lock().lost
    }

    /// Queues one completion and wakes the registered waiters: the threads blocked in
    /// [`CompletionQueue::wait`] (no condition-variable notify when there are none) and
    /// the wakers of [`CompletionQueue::wait_async`] (the provider side; the soft
    /// device's QP engine calls it).
    ///
    /// # Errors
    ///
    /// [`CqError::Overflow`] if the CQ is full or already in error: the completion
    /// is counted as lost and the CQ is (now) in the error state.
    pub fn push(&self, wc: WorkCompletion) -> Result<(), CqError> {
        let early = self.notify_break.then(|| self.lock().waiters > 0);
        let mut g = self.lock();
        let result = if g.error || g.queue.len() >= self.capacity {
            g.lost += 1;
            if !g.error {
                g.error = true;
                g.event = Some(AsyncEvent::CqErr { cq: self.handle });
            }
            Err(CqError::Overflow {
                cq: self.handle,
                lost: g.lost,
            })
        } else {
            g.queue.push_back(wc);
            Ok(())
        };
        let wakers = core::mem::take(&mut g.wakers);
        let notify = early.unwrap_or(g.waiters > 0);
        drop(g);
        if notify {
            self.ready.notify_all();
        }
        for w in wakers {
            // Executor wakers are foreign code: inside a pass they run after unlock.
            crate::progress_outbox::defer_wake(w);
        }
        result
    }

    /// Takes up to `max` completions, oldest first (`ibv_poll_cq(3)`).
    ///
    /// # Errors
    ///
    /// [`CqError::Overflow`] when the CQ is in the error state and every completion
    /// that fit has been taken.
    pub fn poll(&self, max: usize) -> Result<Vec<WorkCompletion>, CqError> {
        let mut g = self.lock();
        if g.queue.is_empty() && g.error {
            return Err(CqError::Overflow {
                cq: self.handle,
                lost: g.lost,
            });
        }
        let n = max.min(g.queue.len());
        Ok(g.queue.drain(..n).collect())
    }

    /// Takes up to `out.len()` completions into `out`, oldest first, and returns
    /// how many (`ibv_poll_cq(3)` with a caller array).
    ///
    /// # Errors
    ///
    /// As [`CompletionQueue::poll`].
    pub fn poll_into(&self, out: &mut [WorkCompletion]) -> Result<usize, CqError> {
        let mut g = self.lock();
        if g.queue.is_empty() && g.error {
            return Err(CqError::Overflow {
                cq: self.handle,
                lost: g.lost,
            });
        }
        let mut n = 0;
        for slot in out.iter_mut() {
            match g.queue.pop_front() {
                Some(wc) => {
                    *slot = wc;
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }

    /// Blocks the calling thread until a completion is queued or the CQ is in
    /// error, or `timeout` passes. Returns true in the first two cases. Never call
    /// it while driving a device (a debug assertion).
    pub fn wait(&self, timeout: Duration) -> bool {
        crate::progress_outbox::assert_outside_driver("CompletionQueue::wait");
        let deadline = Instant::now().checked_add(timeout);
        let mut g = self.lock();
        let ready = loop {
            if !g.queue.is_empty() || g.error {
                break true;
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => break false,
                },
                None => Duration::from_secs(3600),
            };
            // Registered under the lock that `push` reads the count under: a push
            // after this point notifies.
            g.waiters += 1;
            g = self
                .ready
                .wait_timeout(g, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            g.waiters -= 1;
        };
        ready
    }

    /// A future that resolves when a completion is queued or the CQ is in error
    /// (then [`CompletionQueue::poll`] returns something). Executor-agnostic: it registers the
    /// task's waker, which [`CompletionQueue::push`] wakes; the check and the registration happen
    /// under the CQ lock, so no wake-up is lost.
    pub fn wait_async(&self) -> WaitAsync<'_> {
        WaitAsync { cq: self }
    }

    /// The pending [`AsyncEvent::CqErr`], once, after an overflow.
    pub fn take_async_event(&self) -> Option<AsyncEvent> {
        self.lock().event.take()
    }
}

/// Future returned by [`CompletionQueue::wait_async`].
#[derive(Debug)]
#[must_use = "futures do nothing unless awaited"]
pub struct WaitAsync<'a> {
    cq: &'a CompletionQueue,
}

impl Future for WaitAsync<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut g = self.cq.lock();
        if !g.queue.is_empty() || g.error {
            return Poll::Ready(());
        }
        if !g.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            g.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::Wake;
    use verbs::{WcOpcode, WcStatus};

    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion::new(id, WcStatus::Success, WcOpcode::Send, 1)
    }

    #[test]
    fn fifo_and_capacity() {
        assert!(CompletionQueue::new(1, 0).is_err());
        let cq = CompletionQueue::new(1, 3).unwrap();
        for i in 0..3 {
            cq.push(wc(i)).unwrap();
        }
        assert_eq!(cq.len(), 3);
        let got: Vec<u64> = cq.poll(2).unwrap().iter().map(|w| w.wr_id).collect();
        assert_eq!(got, [0, 1]);
        let mut arr = [wc(99); 4];
        assert_eq!(cq.poll_into(&mut arr).unwrap(), 1);
        assert_eq!(arr[0].wr_id, 2);
        assert!(cq.poll(8).unwrap().is_empty());
    }

    #[test]
    fn overflow_is_an_error_never_silent() {
        let cq = CompletionQueue::new(7, 2).unwrap();
        cq.push(wc(0)).unwrap();
        cq.push(wc(1)).unwrap();
        assert_eq!(cq.push(wc(2)), Err(CqError::Overflow { cq: 7, lost: 1 }));
        assert!(cq.is_error());
        assert_eq!(cq.take_async_event(), Some(AsyncEvent::CqErr { cq: 7 }));
        assert_eq!(cq.take_async_event(), None);
        // Unusable from now on: even with room, pushes are lost.
        assert_eq!(cq.poll(1).unwrap().len(), 1);
        assert_eq!(cq.push(wc(3)), Err(CqError::Overflow { cq: 7, lost: 2 }));
        assert_eq!(cq.poll(8).unwrap().len(), 1);
        assert_eq!(cq.poll(8), Err(CqError::Overflow { cq: 7, lost: 2 }));
        assert!(cq.wait(Duration::from_millis(1)));
    }

    #[test]
    fn blocking_wait() {
        let cq = CompletionQueue::new(1, 4).unwrap();
        assert!(!cq.wait(Duration::from_millis(5)));
        let c = Arc::clone(&cq);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            c.push(wc(5)).unwrap();
        });
        assert!(cq.wait(Duration::from_secs(10)));
        t.join().unwrap();
        assert_eq!(cq.poll(1).unwrap()[0].wr_id, 5);
    }

    struct Unpark(std::thread::Thread, AtomicBool);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.1.store(true, Ordering::SeqCst);
            self.0.unpark();
        }
    }

    /// A minimal executor: polls the future, parks until woken.
    fn block_on<F: Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let unpark = Arc::new(Unpark(std::thread::current(), AtomicBool::new(false)));
        let waker = Waker::from(Arc::clone(&unpark));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            while !unpark.1.swap(false, Ordering::SeqCst) {
                std::thread::park_timeout(Duration::from_millis(100));
            }
        }
    }

    #[test]
    fn async_wait_is_woken_by_push() {
        let cq = CompletionQueue::new(1, 4).unwrap();
        let c = Arc::clone(&cq);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            c.push(wc(9)).unwrap();
        });
        block_on(cq.wait_async());
        t.join().unwrap();
        assert_eq!(cq.poll(4).unwrap()[0].wr_id, 9);
        // Already ready: resolves at once.
        cq.push(wc(10)).unwrap();
        block_on(cq.wait_async());
    }
}
