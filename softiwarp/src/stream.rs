//! The stream upper: ULPDU queues between one connection of a [`Stack`](crate::stack::Stack)
//! and the user, the first (and simplest) implementation of [`Ulp`].
//!
//! [`pair`] makes the two ends of one connection's queues:
//!
//! - [`StreamUlp`], given to the stack ([`Stack::connect`](crate::stack::Stack::connect) /
//!   [`Stack::accept`](crate::stack::Stack::accept)): received ULPDUs go into the receive
//!   queue, ULPDUs to send come out of the send queue, one per call.
//! - [`StreamEnd`], kept by the user (wrapped by [`Connection`](crate::device::Connection)):
//!   [`StreamEnd::send`] / [`StreamEnd::try_send`] and [`StreamEnd::recv`] /
//!   [`StreamEnd::try_recv`], the connection's events, and its state.
//!
//! Both queues are bounded in bytes ([`StreamConfig`]). A full send queue blocks
//! `send` (with a timeout) or fails `try_send` with [`SendError::WouldBlock`]: transmit
//! backpressure. A full receive queue makes [`Ulp::rx_room`] 0, so the stack stops reading
//! the TCP socket and TCP's window closes: receive backpressure reaches the peer.
//!
//! Both ends share a mutex-protected state and a condition variable; the stack side never
//! waits on the user (it only takes the lock briefly). The user side wakes the driver with
//! a [`Waker`] (the engine's eventfd) when the send queue goes from empty to non-empty and
//! when it frees receive room the driver was waiting for.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::eventfd::EventFd;

use crate::mpa_conn::CallError;
use crate::stack::{ConnError, ConnEvent, EmitUlpdu, Established, Ulp};

/// Queue bounds of a stream connection, in bytes of ULPDUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamConfig {
    /// Bytes of ULPDUs the send queue holds before `send` blocks (a single ULPDU is
    /// always accepted into an empty queue). Default 1 MiB.
    pub tx_queue_bytes: usize,
    /// Bytes of ULPDUs the receive queue holds before the stack stops reading the socket
    /// (soft: up to 64 KiB more may arrive). Default 1 MiB.
    pub rx_queue_bytes: usize,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            tx_queue_bytes: 1 << 20,
            rx_queue_bytes: 1 << 20,
        }
    }
}

/// Wakes the thread driving the stack: writes 1 to its eventfd. [`Waker::none`] does
/// nothing (a stack driven by a test loop polls anyway).
#[derive(Debug, Clone, Default)]
pub struct Waker(Option<Arc<EventFd>>);

impl Waker {
    /// A waker that does nothing.
    pub fn none() -> Self {
        Waker(None)
    }

    /// A waker writing to `fd` (an eventfd the driver polls).
    pub fn eventfd(fd: Arc<EventFd>) -> Self {
        Waker(Some(fd))
    }

    /// Wakes the driver. Never blocks: an eventfd write fails only when its counter would
    /// overflow, which 1 per call cannot reach in practice; errors are ignored.
    pub fn wake(&self) {
        if let Some(fd) = &self.0 {
            let _ = fd.write(1);
        }
    }
}

/// Why a send failed. Nothing was queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// `try_send`: the send queue is full.
    #[error("send queue full")]
    WouldBlock,
    /// `send`: the queue stayed full for the whole timeout.
    #[error("send timed out")]
    Timeout,
    /// The connection is not established yet.
    #[error("connection not established")]
    NotEstablished,
    /// The connection was closed (locally or by the peer); nothing more can be sent.
    #[error("connection closed")]
    Closed,
    /// The connection failed.
    #[error("connection failed: {0}")]
    Failed(ConnError),
    /// A ULPDU of zero bytes (MPA's ULPDU_Length must be at least 1).
    #[error("empty ULPDU")]
    Empty,
    /// The ULPDU is longer than MULPDU (RFC 5044 4.5).
    #[error("ULPDU of {len} bytes is longer than MULPDU {mulpdu}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// MULPDU in bytes.
        mulpdu: usize,
    },
}

/// Why a receive returned no ULPDU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// `try_recv`: nothing is queued.
    #[error("no ULPDU queued")]
    WouldBlock,
    /// `recv`: nothing arrived within the timeout.
    #[error("receive timed out")]
    Timeout,
    /// The connection was closed (by either side) and everything received was read.
    #[error("connection closed")]
    Closed,
    /// The connection failed and everything received before was read.
    #[error("connection failed: {0}")]
    Failed(ConnError),
}

#[derive(Debug, Default)]
struct Inner {
    rx: VecDeque<Vec<u8>>,
    rx_bytes: usize,
    tx: VecDeque<Vec<u8>>,
    tx_bytes: usize,
    events: VecDeque<ConnEvent>,
    established: Option<Established>,
    /// Final outcome: `None` = closed gracefully / aborted locally, `Some(e)` = failed.
    ended: Option<Option<ConnError>>,
    /// The peer closed its half: no more ULPDUs will come.
    peer_closed: bool,
    /// The user closed (or asked to close): no more sends.
    local_closed: bool,
    waiters: usize,
    driver_wants_room: bool,
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    cond: Condvar,
    cfg: StreamConfig,
    waker: Waker,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves the state consistent; a panic in one (there are
        // none that can panic) would not leave it half-changed.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn notify(&self, inner: &Inner) {
        if inner.waiters > 0 {
            self.cond.notify_all();
        }
    }
}

/// The stack side of a stream connection: an [`Ulp`]. See the [module docs](self).
#[derive(Debug)]
pub struct StreamUlp {
    shared: Arc<Shared>,
}

/// The user side of a stream connection. See the [module docs](self). Cloning gives
/// another handle to the same queues.
#[derive(Debug, Clone)]
pub struct StreamEnd {
    shared: Arc<Shared>,
}

/// The two ends of one connection's queues; `waker` is called as described in the
/// [module docs](self).
pub fn pair(cfg: StreamConfig, waker: Waker) -> (StreamUlp, StreamEnd) {
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner::default()),
        cond: Condvar::new(),
        cfg,
        waker,
    });
    (
        StreamUlp {
            shared: shared.clone(),
        },
        StreamEnd { shared },
    )
}

impl StreamEnd {
    /// Another [`StreamUlp`] on the same queues (the responder's upper is made at
    /// accept time, after the end was handed to the user).
    pub fn ulp(&self) -> StreamUlp {
        StreamUlp {
            shared: self.shared.clone(),
        }
    }

    /// Hands a connection event to the user side: the driver routes every
    /// [`StackEvent::Conn`](crate::stack::StackEvent::Conn) event of the connection here,
    /// in order. The state the user side reports ([`StreamEnd::established`],
    /// [`StreamEnd::ended`], send and receive errors) follows these events.
    pub fn deliver_event(&self, event: ConnEvent) {
        let mut g = self.shared.lock();
        match &event {
            ConnEvent::Established(info) => g.established = Some(info.clone()),
            ConnEvent::Disconnected => g.peer_closed = true,
            ConnEvent::Closed => {
                g.ended.get_or_insert(None);
            }
            ConnEvent::Failed(e) => {
                g.ended.get_or_insert(Some(e.clone()));
            }
        }
        g.events.push_back(event);
        self.shared.notify(&g);
    }

    /// Marks the send side closed (the user called close): later sends fail with
    /// [`SendError::Closed`]; queued ULPDUs still go out before the FIN.
    pub fn mark_closed(&self) {
        let mut g = self.shared.lock();
        g.local_closed = true;
        self.shared.notify(&g);
    }

    fn wait<'a>(
        &'a self,
        mut g: MutexGuard<'a, Inner>,
        deadline: Instant,
    ) -> Option<MutexGuard<'a, Inner>> {
        let left = deadline.checked_duration_since(Instant::now())?;
        if left.is_zero() {
            return None;
        }
        g.waiters += 1;
        let (mut g, _) = self
            .shared
            .cond
            .wait_timeout(g, left)
            .unwrap_or_else(|p| p.into_inner());
        g.waiters -= 1;
        Some(g)
    }

    /// The next event, waiting up to `timeout`; `None` if none came.
    pub fn next_event(&self, timeout: Duration) -> Option<ConnEvent> {
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.lock();
        loop {
            if let Some(e) = g.events.pop_front() {
                return Some(e);
            }
            g = self.wait(g, deadline)?;
        }
    }

    /// The next event if one is queued.
    pub fn try_next_event(&self) -> Option<ConnEvent> {
        self.shared.lock().events.pop_front()
    }

    /// Waits up to `timeout` until the connection is established (the parameters) or
    /// has ended (`Err(Some(error))` failed, `Err(None)` closed); `Ok`/`Err` as soon as
    /// either holds. Events are not consumed.
    ///
    /// Errors: `Err(Some(e))` it failed with `e` (e.g. [`ConnError::Rejected`]);
    /// `Err(None)` closed before establishment or the timeout passed (see
    /// [`StreamEnd::ended`] to tell which).
    pub fn wait_established(&self, timeout: Duration) -> Result<Established, Option<ConnError>> {
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.lock();
        loop {
            if let Some(e) = &g.established {
                return Ok(e.clone());
            }
            if let Some(end) = &g.ended {
                return Err(end.clone());
            }
            g = self.wait(g, deadline).ok_or(None)?;
        }
    }

    /// Waits up to `timeout` for the connection to end; returns the outcome
    /// (`Some(None)` closed, `Some(Some(e))` failed) or `None` on timeout. Events are
    /// not consumed.
    pub fn wait_ended(&self, timeout: Duration) -> Option<Option<ConnError>> {
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.lock();
        loop {
            if let Some(end) = &g.ended {
                return Some(end.clone());
            }
            g = self.wait(g, deadline)?;
        }
    }

    /// The established connection's parameters, once established.
    pub fn established(&self) -> Option<Established> {
        self.shared.lock().established.clone()
    }

    /// The final outcome once the connection ended: `Some(None)` closed,
    /// `Some(Some(e))` failed with `e`; `None` while it lasts.
    pub fn ended(&self) -> Option<Option<ConnError>> {
        self.shared.lock().ended.clone()
    }

    fn check_send(&self, g: &Inner, len: usize) -> Result<(), SendError> {
        if let Some(end) = &g.ended {
            return Err(match end {
                Some(e) => SendError::Failed(e.clone()),
                None => SendError::Closed,
            });
        }
        if g.local_closed || g.peer_closed {
            return Err(SendError::Closed);
        }
        let Some(est) = &g.established else {
            return Err(SendError::NotEstablished);
        };
        if len == 0 {
            return Err(SendError::Empty);
        }
        if len > est.mulpdu {
            return Err(SendError::TooLong {
                len,
                mulpdu: est.mulpdu,
            });
        }
        Ok(())
    }

    fn push(&self, mut g: MutexGuard<'_, Inner>, ulpdu: Vec<u8>) {
        let was_empty = g.tx.is_empty();
        g.tx_bytes += ulpdu.len();
        g.tx.push_back(ulpdu);
        drop(g);
        if was_empty {
            self.shared.waker.wake();
        }
    }

    fn has_room(&self, g: &Inner, len: usize) -> bool {
        g.tx.is_empty() || g.tx_bytes + len <= self.shared.cfg.tx_queue_bytes
    }

    /// Queues one ULPDU (1..=MULPDU bytes, copied) without waiting.
    ///
    /// Errors: [`SendError::WouldBlock`] when the send queue is full, and those of
    /// [`StreamEnd::send_vec`].
    pub fn try_send(&self, ulpdu: &[u8]) -> Result<(), SendError> {
        let g = self.shared.lock();
        self.check_send(&g, ulpdu.len())?;
        if !self.has_room(&g, ulpdu.len()) {
            return Err(SendError::WouldBlock);
        }
        self.push(g, ulpdu.to_vec());
        Ok(())
    }

    /// Queues one ULPDU (1..=MULPDU bytes, copied), waiting up to `timeout` for room.
    ///
    /// Errors: as [`StreamEnd::send_vec`].
    pub fn send(&self, ulpdu: &[u8], timeout: Duration) -> Result<(), SendError> {
        self.send_vec(ulpdu.to_vec(), timeout)
    }

    /// Queues one ULPDU (1..=MULPDU bytes, taken as is), waiting up to `timeout` for
    /// room in the send queue.
    ///
    /// Errors: [`SendError::Timeout`] (no room in time), [`SendError::NotEstablished`],
    /// [`SendError::Closed`], [`SendError::Failed`], [`SendError::Empty`],
    /// [`SendError::TooLong`].
    pub fn send_vec(&self, ulpdu: Vec<u8>, timeout: Duration) -> Result<(), SendError> {
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.lock();
        loop {
            self.check_send(&g, ulpdu.len())?;
            if self.has_room(&g, ulpdu.len()) {
                self.push(g, ulpdu);
                return Ok(());
            }
            g = self.wait(g, deadline).ok_or(SendError::Timeout)?;
        }
    }

    fn pop<'a>(&'a self, mut g: MutexGuard<'a, Inner>) -> Result<Vec<u8>, MutexGuard<'a, Inner>> {
        let Some(u) = g.rx.pop_front() else {
            return Err(g);
        };
        g.rx_bytes -= u.len();
        let wake = g.driver_wants_room && g.rx_bytes <= self.shared.cfg.rx_queue_bytes / 2;
        if wake {
            g.driver_wants_room = false;
        }
        drop(g);
        if wake {
            self.shared.waker.wake();
        }
        Ok(u)
    }

    fn end_error(g: &Inner) -> Option<RecvError> {
        match &g.ended {
            Some(Some(e)) => Some(RecvError::Failed(e.clone())),
            Some(None) => Some(RecvError::Closed),
            None if g.peer_closed => Some(RecvError::Closed),
            None => None,
        }
    }

    /// The next received ULPDU if one is queued.
    ///
    /// Errors: [`RecvError::WouldBlock`]; [`RecvError::Closed`] / [`RecvError::Failed`]
    /// once the connection ended and the queue is empty.
    pub fn try_recv(&self) -> Result<Vec<u8>, RecvError> {
        match self.pop(self.shared.lock()) {
            Ok(u) => Ok(u),
            Err(g) => Err(Self::end_error(&g).unwrap_or(RecvError::WouldBlock)),
        }
    }

    /// The next received ULPDU, waiting up to `timeout`.
    ///
    /// Errors: [`RecvError::Timeout`]; [`RecvError::Closed`] / [`RecvError::Failed`] once
    /// the connection ended (or the peer closed) and the queue is empty.
    pub fn recv(&self, timeout: Duration) -> Result<Vec<u8>, RecvError> {
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.lock();
        loop {
            g = match self.pop(g) {
                Ok(u) => return Ok(u),
                Err(g) => g,
            };
            if let Some(e) = Self::end_error(&g) {
                return Err(e);
            }
            g = self.wait(g, deadline).ok_or(RecvError::Timeout)?;
        }
    }

    /// Bytes of ULPDUs waiting in the send queue.
    pub fn tx_queued_bytes(&self) -> usize {
        self.shared.lock().tx_bytes
    }

    /// Bytes of ULPDUs waiting in the receive queue.
    pub fn rx_queued_bytes(&self) -> usize {
        self.shared.lock().rx_bytes
    }
}

impl Ulp for StreamUlp {
    // The user-visible state (established, peer closed, ended) follows the events the
    // driver routes to [`StreamEnd::deliver_event`], so that it never runs ahead of the
    // event queue (a `wait_ended` that returns has the final event queued).
    fn on_established(&mut self, _info: &Established) {}

    fn rx_room(&mut self) -> usize {
        let mut g = self.shared.lock();
        let room = self.shared.cfg.rx_queue_bytes.saturating_sub(g.rx_bytes);
        if room == 0 {
            g.driver_wants_room = true;
        }
        room
    }

    fn on_ulpdu(&mut self, ulpdu: Vec<u8>) {
        let mut g = self.shared.lock();
        g.rx_bytes += ulpdu.len();
        g.rx.push_back(ulpdu);
        self.shared.notify(&g);
    }

    fn poll_ulpdu(&mut self, mulpdu: usize, emit: &mut EmitUlpdu<'_>) -> Result<bool, CallError> {
        let ulpdu = {
            let mut g = self.shared.lock();
            let Some(u) = g.tx.pop_front() else {
                return Ok(false);
            };
            g.tx_bytes -= u.len();
            self.shared.notify(&g);
            u
        };
        if ulpdu.len() > mulpdu {
            return Err(CallError::UlpduTooLong {
                len: ulpdu.len(),
                mulpdu,
            });
        }
        emit(&[&ulpdu])?;
        Ok(true)
    }

    fn on_closed(&mut self) {}

    fn on_error(&mut self, _error: &ConnError) {}
}
