//! The stream upper: ULPDU queues between one connection of a [`Stack`](crate::transport::Stack)
//! and the user, the first (and simplest) implementation of [`Ulp`].
//!
//! [`pair`] makes the two ends of one connection's queues:
//!
//! - [`StreamUlp`], given to the stack ([`Stack::connect`](crate::transport::Stack::connect) /
//!   [`Stack::accept`](crate::transport::Stack::accept)): received ULPDUs go into the receive
//!   queue, ULPDUs to send come out of the send queue, one per call.
//! - [`StreamEnd`], kept by the user (wrapped by [`Connection`](crate::api::device::Connection)):
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
//!
//! Wake-ups of the user are batched, so that a user thread and a driver thread sharing a
//! core do not switch per ULPDU: a sender blocked on a full send queue is woken once the
//! queue has drained to half its bound (or is empty); with a batched waker
//! ([`Waker::engine`]) a receiver blocked on an empty receive queue is woken when the
//! driver calls [`StreamEnd::flush_wakeups`] (the engine does after every pass; the
//! wake-up is due once the engine is about to sleep, i.e. after its spin time without
//! work, or [`RX_WAKE_DELAY`] after the first ULPDU the receiver waits for), or at once
//! when half the receive bound is queued (a quarter until 2026-11-30: half cut the
//! receiving process's context switches by a third at MTU 65000). Without a batched
//! waker every received ULPDU wakes the receiver (a test loop driving the stack itself).
//!
//! The stack side touches the shared state once per batch, not per ULPDU (see
//! [`StreamUlp`]): received ULPDUs are staged and queued at the end of each receive pass
//! ([`Ulp::rx_done`]); ULPDUs to send are taken up to an eighth of the send queue's bound
//! at a time. The user side can do the same with [`StreamEnd::recv_batch`] and
//! [`StreamEnd::recycle_all`].
//!
//! Buffers are recycled: the stack side copies received ULPDUs into buffers the user gave
//! back with [`StreamEnd::recycle`] and returns sent ULPDUs' buffers to the same pool,
//! where [`StreamEnd::buffer`] takes them, so a steady stream allocates nothing per ULPDU.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::eventfd::EventFd;

use crate::transport::mpa_conn::CallError;
use crate::transport::{ConnError, ConnEvent, EmitUlpdu, Established, Ulp};

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

/// How long at most a receiver waiting on a batched stream ([`Waker::engine`]) waits for
/// ULPDUs already queued while the driver stays busy.
pub const RX_WAKE_DELAY: Duration = Duration::from_micros(200);

/// Wakes the thread driving the stack: writes 1 to its eventfd. [`Waker::none`] does
/// nothing (a stack driven by a test loop polls anyway).
#[derive(Debug, Clone, Default)]
pub struct Waker {
    fd: Option<Arc<EventFd>>,
    /// The driver calls [`StreamEnd::flush_wakeups`] after its passes.
    batched: bool,
}

impl Waker {
    /// A waker that does nothing.
    pub fn none() -> Self {
        Waker::default()
    }

    /// A waker writing to `fd` (an eventfd the driver polls).
    pub fn eventfd(fd: Arc<EventFd>) -> Self {
        Waker {
            fd: Some(fd),
            batched: false,
        }
    }

    /// A waker writing to `fd`, for a driver that calls [`StreamEnd::flush_wakeups`]
    /// on every stream after each pass (the device engine): receivers are woken in
    /// batches (see the [module docs](self)).
    pub fn engine(fd: Arc<EventFd>) -> Self {
        Waker {
            fd: Some(fd),
            batched: true,
        }
    }

    /// Wakes the driver. Never blocks: an eventfd write fails only when its counter would
    /// overflow, which 1 per call cannot reach in practice; errors are ignored.
    pub fn wake(&self) {
        if let Some(fd) = &self.fd {
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

/// A queued ULPDU to send: `head`, then (zero-copy sends) a range of a shared buffer.
#[derive(Debug)]
struct TxItem {
    head: Vec<u8>,
    body: Option<(Arc<[u8]>, std::ops::Range<usize>)>,
}

impl TxItem {
    fn len(&self) -> usize {
        self.head.len() + self.body.as_ref().map_or(0, |(_, r)| r.len())
    }
}

#[derive(Debug, Default)]
struct Inner {
    rx: VecDeque<Vec<u8>>,
    rx_bytes: usize,
    tx: VecDeque<TxItem>,
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
    /// Recycled ULPDU buffers and their total capacity.
    free: Vec<Vec<u8>>,
    free_bytes: usize,
    /// Batched: when the first ULPDU a waiting receiver has not been woken for arrived.
    rx_wake_since: Option<Instant>,
}

impl Inner {
    /// A recycled buffer (empty), or a new one of `cap` bytes.
    fn take_buffer(&mut self, cap: usize) -> Vec<u8> {
        match self.free.pop() {
            Some(mut b) => {
                self.free_bytes -= b.capacity();
                b.clear();
                b
            }
            None => Vec::with_capacity(cap),
        }
    }

    /// Keeps `buf` for reuse while the pool holds less than `limit` bytes.
    fn give_buffer(&mut self, buf: Vec<u8>, limit: usize) {
        let cap = buf.capacity();
        if cap > 0 && self.free_bytes + cap <= limit {
            self.free_bytes += cap;
            self.free.push(buf);
        }
    }
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    cond: Condvar,
    cfg: StreamConfig,
    waker: Waker,
    /// Batched: a receiver waits for ULPDUs already queued (`Inner::rx_wake_since`).
    rx_wake_pending: AtomicBool,
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

    /// Bytes of recycled buffers kept at most.
    fn pool_limit(&self) -> usize {
        self.cfg.tx_queue_bytes + self.cfg.rx_queue_bytes
    }

    /// A received ULPDU was queued (lock held): wake a waiting receiver now, or (batched)
    /// leave it to [`StreamEnd::flush_wakeups`]. Returns whether to notify once the lock
    /// is released.
    fn rx_queued(&self, g: &mut Inner) -> bool {
        if g.waiters == 0 {
            return false;
        }
        if !self.waker.batched || g.rx_bytes >= self.cfg.rx_queue_bytes / 2 {
            g.rx_wake_since = None;
            self.rx_wake_pending.store(false, Ordering::Relaxed);
            return true;
        }
        if g.rx_wake_since.is_none() {
            g.rx_wake_since = Some(Instant::now());
            self.rx_wake_pending.store(true, Ordering::Release);
        }
        false
    }
}

/// ULPDUs the stack side takes from the send queue under one lock: at most this share of
/// the queue's bound (and at least one ULPDU).
const TX_BATCH_DIVISOR: usize = 8;

/// Recycled buffers the stack side takes from the pool at a time for staging received
/// ULPDUs (one receive chunk of [`crate::transport::RX_CHUNK`] bytes holds at most 45
/// ULPDUs at MTU 1500).
const STAGING_BUFFERS: usize = 64;

/// The stack side of a stream connection: an [`Ulp`]. See the [module docs](self).
///
/// It touches the shared queues once per batch, not per ULPDU: received ULPDUs are
/// staged (copied into buffers from a local pool) and queued for the user at the end of
/// each receive pass ([`Ulp::rx_done`]) or when the room is asked; ULPDUs to send are
/// taken up to an eighth of the send queue's bound at a time, and the buffers of those
/// sent go back to the pool with the next batch.
#[derive(Debug)]
pub struct StreamUlp {
    shared: Arc<Shared>,
    /// Received ULPDUs not yet queued for the user, and their bytes.
    staged: Vec<Vec<u8>>,
    staged_bytes: usize,
    /// Empty buffers taken from the pool for staging.
    free: Vec<Vec<u8>>,
    /// ULPDUs taken from the send queue, not yet framed.
    tx: VecDeque<TxItem>,
    /// Buffers of ULPDUs sent, for the pool.
    spent: Vec<Vec<u8>>,
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
        rx_wake_pending: AtomicBool::new(false),
    });
    (StreamUlp::new(shared.clone()), StreamEnd { shared })
}

impl StreamEnd {
    /// Another [`StreamUlp`] on the same queues (the responder's upper is made at
    /// accept time, after the end was handed to the user).
    pub fn ulp(&self) -> StreamUlp {
        StreamUlp::new(self.shared.clone())
    }

    /// For the driver of a batched stream ([`Waker::engine`]), after a pass: wakes a
    /// receiver waiting for ULPDUs already queued if `idle` (the pass found nothing more
    /// to do) or it has waited [`RX_WAKE_DELAY`] at `now` (the driver's clock reading
    /// of this pass). Cheap when there is nothing to do (one atomic load).
    pub fn flush_wakeups(&self, idle: bool, now: Instant) {
        if !self.shared.rx_wake_pending.load(Ordering::Acquire) {
            return;
        }
        let mut g = self.shared.lock();
        let due = match g.rx_wake_since {
            Some(since) => idle || now.saturating_duration_since(since) >= RX_WAKE_DELAY,
            None => true,
        };
        if !due {
            return;
        }
        g.rx_wake_since = None;
        self.shared.rx_wake_pending.store(false, Ordering::Relaxed);
        let wake = g.waiters > 0;
        drop(g);
        if wake {
            self.shared.cond.notify_all();
        }
    }

    /// An empty buffer for a ULPDU to send with [`StreamEnd::send_vec`]: a recycled one
    /// (from sent ULPDUs and [`StreamEnd::recycle`]) when there is one, else a new one
    /// with room for `capacity` bytes.
    pub fn buffer(&self, capacity: usize) -> Vec<u8> {
        self.shared.lock().take_buffer(capacity)
    }

    /// Gives a buffer (e.g. a received ULPDU, read) back for reuse by the receive path
    /// and [`StreamEnd::buffer`]. The pool is bounded (the two queue bounds together);
    /// beyond it the buffer is freed.
    pub fn recycle(&self, buf: Vec<u8>) {
        let limit = self.shared.pool_limit();
        self.shared.lock().give_buffer(buf, limit);
    }

    /// Hands a connection event to the user side: the driver routes every
    /// [`StackEvent::Conn`](crate::transport::StackEvent::Conn) event of the connection here,
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

    fn push(&self, g: MutexGuard<'_, Inner>, ulpdu: Vec<u8>) {
        self.push_item(
            g,
            TxItem {
                head: ulpdu,
                body: None,
            },
        );
    }

    fn push_item(&self, mut g: MutexGuard<'_, Inner>, item: TxItem) {
        let was_empty = g.tx.is_empty();
        g.tx_bytes += item.len();
        g.tx.push_back(item);
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

    /// Queues one ULPDU made of `head` (copied; e.g. a DDP header) followed by
    /// `body[range]`, which is not copied: the driver frames it straight from `body`
    /// into the TCP send buffer (as a QP sends from a memory region). Waits up to
    /// `timeout` for room in the send queue.
    ///
    /// Errors: as [`StreamEnd::send_vec`]; an out-of-bounds `range` is
    /// [`SendError::TooLong`].
    pub fn send_shared(
        &self,
        head: &[u8],
        body: Arc<[u8]>,
        range: std::ops::Range<usize>,
        timeout: Duration,
    ) -> Result<(), SendError> {
        let len = head.len() + range.len();
        if range.start > range.end || range.end > body.len() {
            return Err(SendError::TooLong {
                len: range.end,
                mulpdu: body.len(),
            });
        }
        // The clock is read only if the call has to wait.
        let mut deadline = None;
        let mut g = self.shared.lock();
        loop {
            self.check_send(&g, len)?;
            if self.has_room(&g, len) {
                let mut h = g.take_buffer(head.len());
                h.extend_from_slice(head);
                self.push_item(
                    g,
                    TxItem {
                        head: h,
                        body: Some((body, range)),
                    },
                );
                return Ok(());
            }
            g = self
                .wait(g, *deadline.get_or_insert_with(|| Instant::now() + timeout))
                .ok_or(SendError::Timeout)?;
        }
    }

    /// Queues one ULPDU (1..=MULPDU bytes, taken as is), waiting up to `timeout` for
    /// room in the send queue.
    ///
    /// Errors: [`SendError::Timeout`] (no room in time), [`SendError::NotEstablished`],
    /// [`SendError::Closed`], [`SendError::Failed`], [`SendError::Empty`],
    /// [`SendError::TooLong`].
    pub fn send_vec(&self, ulpdu: Vec<u8>, timeout: Duration) -> Result<(), SendError> {
        // The clock is read only if the call has to wait.
        let mut deadline = None;
        let mut g = self.shared.lock();
        loop {
            self.check_send(&g, ulpdu.len())?;
            if self.has_room(&g, ulpdu.len()) {
                self.push(g, ulpdu);
                return Ok(());
            }
            g = self
                .wait(g, *deadline.get_or_insert_with(|| Instant::now() + timeout))
                .ok_or(SendError::Timeout)?;
        }
    }

    fn pop<'a>(&'a self, mut g: MutexGuard<'a, Inner>) -> Result<Vec<u8>, MutexGuard<'a, Inner>> {
        let Some(u) = g.rx.pop_front() else {
            return Err(g);
        };
        self.taken(g, u.len());
        Ok(u)
    }

    /// `bytes` of ULPDUs were taken from the receive queue: releases the lock and wakes
    /// the driver if it waits for room and the queue is down to half its bound.
    fn taken(&self, mut g: MutexGuard<'_, Inner>, bytes: usize) {
        g.rx_bytes -= bytes;
        let wake = g.driver_wants_room && g.rx_bytes <= self.shared.cfg.rx_queue_bytes / 2;
        if wake {
            g.driver_wants_room = false;
        }
        drop(g);
        if wake {
            self.shared.waker.wake();
        }
    }

    fn end_error(g: &Inner) -> Option<RecvError> {
        match &g.ended {
            Some(Some(e)) => Some(RecvError::Failed(e.clone())),
            Some(None) => Some(RecvError::Closed),
            None if g.peer_closed => Some(RecvError::Closed),
            None => None,
        }
    }

    /// True if a ULPDU is queued for the user, or the stream ended (a receive would
    /// not wait).
    pub fn has_received(&self) -> bool {
        let g = self.shared.lock();
        !g.rx.is_empty() || Self::end_error(&g).is_some()
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
        // The clock is read only if the call has to wait.
        let mut deadline = None;
        let mut g = self.shared.lock();
        loop {
            g = match self.pop(g) {
                Ok(u) => return Ok(u),
                Err(g) => g,
            };
            if let Some(e) = Self::end_error(&g) {
                return Err(e);
            }
            g = self
                .wait(g, *deadline.get_or_insert_with(|| Instant::now() + timeout))
                .ok_or(RecvError::Timeout)?;
        }
    }

    /// Every received ULPDU queued now, up to `max`, appended to `out` in order under
    /// one lock, waiting up to `timeout` for the first; returns how many were taken
    /// (at least 1; 0 only when `max` is 0). The batch form of [`StreamEnd::recv`] (give
    /// the buffers back with [`StreamEnd::recycle_all`]).
    ///
    /// Errors: as [`StreamEnd::recv`].
    pub fn recv_batch(
        &self,
        out: &mut Vec<Vec<u8>>,
        max: usize,
        timeout: Duration,
    ) -> Result<usize, RecvError> {
        let mut deadline = None;
        let mut g = self.shared.lock();
        loop {
            let n = g.rx.len().min(max);
            if n > 0 {
                let mut bytes = 0;
                for u in g.rx.drain(..n) {
                    bytes += u.len();
                    out.push(u);
                }
                self.taken(g, bytes);
                return Ok(n);
            }
            if let Some(e) = Self::end_error(&g) {
                return Err(e);
            }
            if max == 0 {
                return Ok(0);
            }
            g = self
                .wait(g, *deadline.get_or_insert_with(|| Instant::now() + timeout))
                .ok_or(RecvError::Timeout)?;
        }
    }

    /// [`StreamEnd::recycle`] for many buffers under one lock (`bufs` is left empty).
    pub fn recycle_all(&self, bufs: &mut Vec<Vec<u8>>) {
        let limit = self.shared.pool_limit();
        let mut g = self.shared.lock();
        for b in bufs.drain(..) {
            g.give_buffer(b, limit);
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

impl StreamUlp {
    fn new(shared: Arc<Shared>) -> Self {
        StreamUlp {
            shared,
            staged: Vec::new(),
            staged_bytes: 0,
            free: Vec::new(),
            tx: VecDeque::new(),
            spent: Vec::new(),
        }
    }

    /// Queues the staged ULPDUs for the user (lock held); returns whether to wake a
    /// waiting receiver once the lock is released.
    fn flush_staged(&mut self, g: &mut Inner) -> bool {
        if self.staged.is_empty() {
            return false;
        }
        g.rx_bytes += self.staged_bytes;
        g.rx.extend(self.staged.drain(..));
        self.staged_bytes = 0;
        self.shared.rx_queued(g)
    }

    fn flush_staged_now(&mut self) {
        if self.staged.is_empty() {
            return;
        }
        let shared = self.shared.clone();
        let mut g = shared.lock();
        let wake = self.flush_staged(&mut g);
        drop(g);
        if wake {
            shared.cond.notify_all();
        }
    }
}

impl Ulp for StreamUlp {
    // The user-visible state (established, peer closed, ended) follows the events the
    // driver routes to [`StreamEnd::deliver_event`], so that it never runs ahead of the
    // event queue (a `wait_ended` that returns has the final event queued). Staged
    // ULPDUs are queued at the end of every receive pass, before its events are routed.
    fn on_established(&mut self, _info: &Established) {}

    fn rx_room(&mut self) -> usize {
        let shared = self.shared.clone();
        let mut g = shared.lock();
        let wake = self.flush_staged(&mut g);
        let room = shared.cfg.rx_queue_bytes.saturating_sub(g.rx_bytes);
        if room == 0 {
            g.driver_wants_room = true;
        }
        if self.free.is_empty() {
            // Buffers for the next chunk's ULPDUs, one lock for all of them.
            let inner = &mut *g;
            let at = inner.free.len().saturating_sub(STAGING_BUFFERS);
            for b in inner.free.drain(at..) {
                inner.free_bytes -= b.capacity();
                self.free.push(b);
            }
        }
        drop(g);
        if wake {
            shared.cond.notify_all();
        }
        room
    }

    fn on_ulpdu(&mut self, ulpdu: Vec<u8>) {
        let shared = self.shared.clone();
        let mut g = shared.lock();
        // Behind the staged ones: order is kept.
        let mut wake = self.flush_staged(&mut g);
        g.rx_bytes += ulpdu.len();
        g.rx.push_back(ulpdu);
        wake |= shared.rx_queued(&mut g);
        drop(g);
        if wake {
            shared.cond.notify_all();
        }
    }

    fn on_ulpdu_in_place(&mut self, ulpdu: &[u8]) -> bool {
        let mut buf = match self.free.pop() {
            Some(mut b) => {
                b.clear();
                b
            }
            None => Vec::with_capacity(ulpdu.len()),
        };
        buf.extend_from_slice(ulpdu);
        self.staged_bytes += buf.len();
        self.staged.push(buf);
        true
    }

    fn rx_done(&mut self) {
        self.flush_staged_now();
    }

    fn poll_ulpdu(&mut self, mulpdu: usize, emit: &mut EmitUlpdu<'_>) -> Result<bool, CallError> {
        if self.tx.is_empty() {
            let shared = self.shared.clone();
            let mut g = shared.lock();
            let limit = shared.pool_limit();
            for b in self.spent.drain(..) {
                g.give_buffer(b, limit);
            }
            let batch = (shared.cfg.tx_queue_bytes / TX_BATCH_DIVISOR).max(1);
            let mut took = 0;
            while let Some(u) = g.tx.pop_front() {
                took += u.len();
                self.tx.push_back(u);
                if took >= batch {
                    break;
                }
            }
            g.tx_bytes -= took;
            // A blocked sender is woken once the queue has drained to half (or is
            // empty), not for every ULPDU's room.
            let wake = took > 0
                && g.waiters > 0
                && (g.tx.is_empty() || g.tx_bytes <= shared.cfg.tx_queue_bytes / 2);
            drop(g);
            if wake {
                shared.cond.notify_all();
            }
        }
        let Some(ulpdu) = self.tx.pop_front() else {
            return Ok(false);
        };
        if ulpdu.len() > mulpdu {
            return Err(CallError::UlpduTooLong {
                len: ulpdu.len(),
                mulpdu,
            });
        }
        match &ulpdu.body {
            None => emit(&[&ulpdu.head])?,
            Some((body, range)) => emit(&[&ulpdu.head, &body[range.clone()]])?,
        }
        self.spent.push(ulpdu.head);
        Ok(true)
    }

    fn on_closed(&mut self) {}

    fn on_error(&mut self, _error: &ConnError) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_ulpdus_are_queued_in_order_at_the_end_of_a_receive_pass() {
        let (mut ulp, end) = pair(StreamConfig::default(), Waker::none());
        assert!(ulp.on_ulpdu_in_place(b"one"));
        assert!(ulp.on_ulpdu_in_place(b"two"));
        // Staged: not visible until the pass ends (or the room is asked).
        assert_eq!(end.try_recv(), Err(RecvError::WouldBlock));
        assert_eq!(end.rx_queued_bytes(), 0);
        // A ULPDU handed over by copy goes behind the staged ones.
        ulp.on_ulpdu(b"three".to_vec());
        assert!(ulp.on_ulpdu_in_place(b"four"));
        ulp.rx_done();
        assert_eq!(end.rx_queued_bytes(), 3 + 3 + 5 + 4);
        let mut out = Vec::new();
        assert_eq!(end.recv_batch(&mut out, 3, Duration::ZERO), Ok(3));
        assert_eq!(out, [&b"one"[..], b"two", b"three"]);
        assert_eq!(end.recv_batch(&mut out, 10, Duration::ZERO), Ok(1));
        assert_eq!(out.last().map(Vec::as_slice), Some(&b"four"[..]));
        assert_eq!(end.rx_queued_bytes(), 0);
        assert_eq!(
            end.recv_batch(&mut out, 10, Duration::ZERO),
            Err(RecvError::Timeout)
        );
        // The buffers go back to the pool; the next pass stages into them.
        end.recycle_all(&mut out);
        assert!(out.is_empty());
        assert!(ulp.rx_room() > 0);
        assert_eq!(ulp.free.len(), 4);
        assert!(ulp.on_ulpdu_in_place(b"five"));
        assert_eq!(ulp.free.len(), 3);
        // Asking for room queues what was staged.
        let room = ulp.rx_room();
        assert_eq!(room, StreamConfig::default().rx_queue_bytes - 4);
        assert_eq!(end.try_recv().as_deref(), Ok(&b"five"[..]));
    }
}
