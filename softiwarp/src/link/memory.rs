//! In-process link: two endpoints joined back to back, like two NICs on one cable.
//!
//! Each endpoint owns a receive queue of frames (bounded like a TAP's `txqueuelen`: when
//! full, a sent frame is dropped and counted) and an `eventfd(2)` that is readable exactly
//! while that queue or the endpoint's event queue is non-empty. The invariant is kept by
//! doing every queue change and the matching eventfd write/reset under the same mutex.
//!
//! Buffers are recycled: a sent frame is copied into a buffer taken from the receiving
//! endpoint's pool, and `recv` returns that buffer to the pool after copying the frame
//! out, so a steady flow allocates nothing.
//!
//! Failures are injected with a [`MemoryControl`]: an endpoint can be set down, set up
//! again, or removed (gone). A down or gone endpoint drops what is sent to it, and its own
//! sends fail.

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex, MutexGuard};

use nix::sys::eventfd::{EfdFlags, EventFd};

use super::{check_mtu, DownReason, GoneReason, Link, LinkError, LinkEvent, StateTracker, MAX_MTU};

/// Configuration of a [`MemoryLink::pair`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryConfig {
    /// IP MTU in bytes of both endpoints, 68..=65535. Default 1500.
    pub mtu: usize,
    /// Receive queue length in frames per endpoint, at least 1. Default 10000, the TAP
    /// `txqueuelen` that transport-notes.md found necessary for a 256 KiB window.
    pub queue_len: usize,
    /// Names of the two endpoints, for logs. Default `("mem0", "mem1")`.
    pub names: (String, String),
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            mtu: 1500,
            queue_len: 10_000,
            names: ("mem0".into(), "mem1".into()),
        }
    }
}

#[derive(Debug)]
struct Inner {
    queue: VecDeque<Vec<u8>>,
    pool: Vec<Vec<u8>>,
    tracker: StateTracker,
    dropped: u64,
}

/// One endpoint's shared half: what its peer and its controls reach.
#[derive(Debug)]
struct Endpoint {
    inner: Mutex<Inner>,
    /// Readable iff `queue` or the tracker's events are non-empty (kept under `inner`).
    wake: EventFd,
    queue_len: usize,
    /// The endpoint name, for logs.
    name: String,
}

impl Endpoint {
    fn new(queue_len: usize, name: &str) -> Result<Self, LinkError> {
        let wake = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| LinkError::io("eventfd", e))?;
        Ok(Endpoint {
            inner: Mutex::new(Inner {
                queue: VecDeque::new(),
                pool: Vec::new(),
                tracker: StateTracker::new(LinkEvent::Up),
                dropped: 0,
            }),
            wake,
            queue_len,
            name: name.to_owned(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the queue inconsistent (every
        // mutation is a single push/pop), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the eventfd readable (called when the pending set becomes non-empty).
    fn signal(&self) {
        // An eventfd write only fails if the counter would overflow (2^64 - 2), which a
        // 1 per empty-to-non-empty transition cannot reach.
        let _ = self.wake.write(1);
    }

    /// Resets the eventfd if nothing is pending (called under the lock).
    fn settle(&self, inner: &Inner) {
        if inner.queue.is_empty() && !inner.tracker.has_events() {
            // EAGAIN when already zero; nothing else can fail on a valid eventfd.
            let _ = self.wake.read();
        }
    }

    fn set_state(&self, next: LinkEvent) {
        let mut inner = self.lock();
        let was_pending = !inner.queue.is_empty() || inner.tracker.has_events();
        if inner.tracker.set(next) {
            tracing::info!(link = %self.name, event = ?next, "memory link state change");
            if !next.is_up() {
                // A down interface loses what was queued for it.
                let Inner { queue, pool, .. } = &mut *inner;
                pool.extend(queue.drain(..));
            }
            if !was_pending {
                self.signal();
            }
            if next.is_gone() {
                inner.pool = Vec::new();
            }
        }
    }
}

/// One endpoint of an in-process back-to-back link. See the [module docs](self).
#[derive(Debug)]
pub struct MemoryLink {
    name: String,
    mtu: usize,
    me: Arc<Endpoint>,
    peer: Arc<Endpoint>,
}

/// A handle that fails or restores one [`MemoryLink`] endpoint from any thread (tests).
#[derive(Debug, Clone)]
pub struct MemoryControl {
    endpoint: Arc<Endpoint>,
}

impl MemoryControl {
    /// Sets the endpoint down: it reports `Down(Injected)`, drops its queued frames and
    /// frames sent to it, and its sends fail with [`LinkError::Down`]. No effect once gone.
    pub fn set_down(&self) {
        self.endpoint
            .set_state(LinkEvent::Down(DownReason::Injected));
    }

    /// Sets the endpoint up again (reports `Up`). No effect once gone.
    pub fn set_up(&self) {
        self.endpoint.set_state(LinkEvent::Up);
    }

    /// Removes the endpoint: it reports `Gone(Injected)`, terminally.
    pub fn remove(&self) {
        self.endpoint
            .set_state(LinkEvent::Gone(GoneReason::Injected));
    }
}

impl MemoryLink {
    /// Creates two endpoints joined back to back: what one sends, the other receives, in
    /// order. Both start `Up`.
    ///
    /// Errors: [`LinkError::Config`] for an MTU outside 68..=65535 or a zero queue length;
    /// [`LinkError::Io`] if an eventfd cannot be created.
    pub fn pair(config: MemoryConfig) -> Result<(MemoryLink, MemoryLink), LinkError> {
        check_mtu(config.mtu, MAX_MTU)?;
        if config.queue_len == 0 {
            return Err(LinkError::Config("queue_len must be at least 1".into()));
        }
        let a = Arc::new(Endpoint::new(config.queue_len, &config.names.0)?);
        let b = Arc::new(Endpoint::new(config.queue_len, &config.names.1)?);
        Ok((
            MemoryLink {
                name: config.names.0,
                mtu: config.mtu,
                me: a.clone(),
                peer: b.clone(),
            },
            MemoryLink {
                name: config.names.1,
                mtu: config.mtu,
                me: b,
                peer: a,
            },
        ))
    }

    /// A handle that fails or restores this endpoint.
    pub fn control(&self) -> MemoryControl {
        MemoryControl {
            endpoint: self.me.clone(),
        }
    }

    /// Frames dropped on the way to this endpoint (queue full, or this endpoint not up).
    pub fn dropped(&self) -> u64 {
        self.me.lock().dropped
    }

    /// Frames waiting in this endpoint's receive queue.
    pub fn queued(&self) -> usize {
        self.me.lock().queue.len()
    }
}

impl Link for MemoryLink {
    fn name(&self) -> &str {
        &self.name
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        let mut inner = self.me.lock();
        if let LinkEvent::Gone(r) = inner.tracker.state() {
            return Err(LinkError::Gone(r));
        }
        let Some(frame) = inner.queue.pop_front() else {
            return Ok(None);
        };
        let n = frame.len().min(buf.len());
        buf[..n].copy_from_slice(&frame[..n]);
        inner.pool.push(frame);
        self.me.settle(&inner);
        Ok(Some(n))
    }

    fn send(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        let max = self.max_frame_len();
        if frame.len() > max {
            return Err(LinkError::FrameTooLarge {
                len: frame.len(),
                max,
            });
        }
        if let Some(e) = self.me.lock().tracker.error() {
            return Err(e);
        }
        let mut peer = self.peer.lock();
        if !peer.tracker.state().is_up() || peer.queue.len() >= self.peer.queue_len {
            peer.dropped += 1;
            return Ok(());
        }
        let mut buf = peer.pool.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        let was_pending = !peer.queue.is_empty() || peer.tracker.has_events();
        peer.queue.push_back(buf);
        if !was_pending {
            self.peer.signal();
        }
        Ok(())
    }

    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.me.wake.as_fd()
    }

    fn poll_event(&mut self) -> Option<LinkEvent> {
        let mut inner = self.me.lock();
        let ev = inner.tracker.pop();
        self.me.settle(&inner);
        ev
    }

    fn state(&self) -> LinkEvent {
        self.me.lock().tracker.state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

    fn readable(l: &MemoryLink) -> bool {
        let mut fds = [PollFd::new(l.poll_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).unwrap() == 1
    }

    fn frame(tag: u8, len: usize) -> Vec<u8> {
        let mut f = vec![tag; len];
        f[12] = 0x88;
        f[13] = 0xb5;
        f
    }

    #[test]
    fn frames_cross_in_order_and_fd_tracks_pending() {
        let (mut a, mut b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let mut buf = vec![0u8; b.max_frame_len()];
        assert!(!readable(&b));
        a.send(&frame(1, 60)).unwrap();
        a.send(&frame(2, 1514)).unwrap();
        assert!(readable(&b));
        assert!(!readable(&a));
        assert_eq!(b.recv(&mut buf).unwrap(), Some(60));
        assert_eq!(buf[0], 1);
        assert!(readable(&b));
        assert_eq!(b.recv(&mut buf).unwrap(), Some(1514));
        assert_eq!(&buf[..1514], &frame(2, 1514)[..]);
        assert!(!readable(&b));
        assert_eq!(b.recv(&mut buf).unwrap(), None);
        // The buffer went back to b's pool and is reused by the next send.
        assert_eq!(b.me.lock().pool.len(), 2);
        a.send(&frame(3, 100)).unwrap();
        assert_eq!(b.me.lock().pool.len(), 1);
    }

    #[test]
    fn oversize_frame_and_full_queue() {
        let cfg = MemoryConfig {
            mtu: 100,
            queue_len: 2,
            ..Default::default()
        };
        let (mut a, b) = MemoryLink::pair(cfg).unwrap();
        assert!(matches!(
            a.send(&frame(0, 115)),
            Err(LinkError::FrameTooLarge { len: 115, max: 114 })
        ));
        for i in 0..3 {
            a.send(&frame(i, 114)).unwrap();
        }
        assert_eq!(b.queued(), 2);
        assert_eq!(b.dropped(), 1);
    }

    #[test]
    fn bad_config_is_an_error() {
        for (mtu, q) in [(67, 1), (65536, 1), (1500, 0)] {
            let cfg = MemoryConfig {
                mtu,
                queue_len: q,
                ..Default::default()
            };
            assert!(matches!(MemoryLink::pair(cfg), Err(LinkError::Config(_))));
        }
    }

    #[test]
    fn injected_down_up_gone() {
        let (mut a, mut b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let ctl = b.control();
        a.send(&frame(1, 60)).unwrap();
        ctl.set_down();
        assert!(readable(&b));
        assert_eq!(b.poll_event(), Some(LinkEvent::Down(DownReason::Injected)));
        assert_eq!(b.poll_event(), None);
        // The queued frame was lost, and frames sent to a down endpoint are dropped.
        assert!(!readable(&b));
        a.send(&frame(2, 60)).unwrap();
        assert_eq!(b.dropped(), 1);
        let mut buf = [0u8; 1514];
        assert_eq!(b.recv(&mut buf).unwrap(), None);
        assert!(matches!(
            b.send(&frame(3, 60)),
            Err(LinkError::Down(DownReason::Injected))
        ));
        ctl.set_up();
        assert_eq!(b.poll_event(), Some(LinkEvent::Up));
        a.send(&frame(4, 60)).unwrap();
        assert_eq!(b.recv(&mut buf).unwrap(), Some(60));
        assert_eq!(buf[0], 4);
        ctl.remove();
        ctl.set_up();
        assert_eq!(b.poll_event(), Some(LinkEvent::Gone(GoneReason::Injected)));
        assert_eq!(b.poll_event(), None);
        assert!(!readable(&b));
        assert!(matches!(
            b.recv(&mut buf),
            Err(LinkError::Gone(GoneReason::Injected))
        ));
        assert_eq!(b.state(), LinkEvent::Gone(GoneReason::Injected));
        assert_eq!(a.state(), LinkEvent::Up);
    }

    #[test]
    fn wakes_a_thread_sleeping_in_poll() {
        let (mut a, mut b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let t = std::thread::spawn(move || {
            let mut fds = [PollFd::new(b.poll_fd(), PollFlags::POLLIN)];
            let n = poll(&mut fds, PollTimeout::from(10_000u16)).unwrap();
            let mut buf = [0u8; 1514];
            (n, b.recv(&mut buf).unwrap())
        });
        a.send(&frame(9, 64)).unwrap();
        assert_eq!(t.join().unwrap(), (1, Some(64)));
    }
}
