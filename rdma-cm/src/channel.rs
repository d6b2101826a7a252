//! Event channels: librdmacm's `rdma_event_channel` with `rdma_get_cm_event` /
//! `rdma_ack_cm_event`, plus an async [`Stream`](futures_core::Stream) of the same
//! events for tokio (or any executor).
//!
//! Delivering an event to a channel id means queueing it, under the id's handler lock
//! (so an id's events are queued in order and never after it was destroyed). Taking an
//! event out ([`EventChannel::get_event`], the stream) hands it out: it counts as
//! un-acked for its id until the [`ChannelEvent`] is acked or dropped. Destroying an id
//! waits for those acks (librdmacm's `rdma_destroy_id`), except that a destroy by a
//! thread that itself holds an un-acked event of the id is refused with
//! [`crate::CmError::UnackedEvents`] instead of hanging. Events queued but not yet taken
//! when their id is destroyed are discarded. A `ConnectRequest` counts against the
//! listener (librdmacm's `event->listen_id`).

use crate::device::CmDevice;
#[cfg(not(loom))]
use crate::error::CmError;
use crate::id::{ChannelQueue, CmEvent, CmIdRef, IdInner, Queued};
use crate::machine::IdState;
use crate::stats::{bump, sub, Counters};
use crate::sync::{self, lock, wait, Arc, Condvar, Mutex};
use core::fmt;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use std::collections::VecDeque;

struct ChanQ<D: CmDevice> {
    events: VecDeque<Queued<D>>,
    wakers: Vec<Waker>,
}

/// The number of the next event handed out by any channel: unique in the process, so
/// an id that moved between channels ([`CmIdRef::migrate`]) never holds two un-acked
/// events of one number (an ack removes its number from the id's list). A plain `std`
/// atomic also under loom: a name, not a synchronization point.
fn next_seq() -> u64 {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
}

/// The queue of an event channel (held in a `std` `Arc`: the ids of the channel reach it
/// as a [`ChannelQueue`] object).
pub(crate) struct ChanInner<D: CmDevice> {
    q: Mutex<ChanQ<D>>,
    cv: Condvar,
    counters: std::sync::Arc<Counters>,
}

impl<D: CmDevice> ChanInner<D> {
    pub(crate) fn new(counters: std::sync::Arc<Counters>) -> std::sync::Arc<ChanInner<D>> {
        std::sync::Arc::new(ChanInner {
            q: Mutex::new(ChanQ {
                events: VecDeque::new(),
                wakers: Vec::new(),
            }),
            cv: Condvar::new(),
            counters,
        })
    }

    /// Hand out the next event whose id is alive, if any.
    fn try_take(&self) -> Option<ChannelEvent<D>> {
        loop {
            let (item, seq) = {
                let mut q = lock(&self.q);
                let item = q.events.pop_front()?;
                (item, next_seq())
            };
            sub(&self.counters.events_queued, 1);
            let token = sync::thread_token();
            let live = {
                let mut st = lock(&item.owner.st);
                if st.state.get() == IdState::Destroying {
                    false
                } else {
                    st.unacked.push((seq, token));
                    true
                }
            };
            if !live {
                bump(&self.counters.events_dropped);
                drop(item);
                continue;
            }
            bump(&self.counters.events_unacked);
            return Some(ChannelEvent {
                event: item.event,
                id: CmIdRef { inner: item.id },
                owner: item.owner,
                seq,
            });
        }
    }
}

impl<D: CmDevice> ChannelQueue<D> for ChanInner<D> {
    fn push(&self, item: Queued<D>) {
        let wakers = {
            let mut q = lock(&self.q);
            q.events.push_back(item);
            core::mem::take(&mut q.wakers)
        };
        bump(&self.counters.events_queued);
        self.cv.notify_all();
        for w in wakers {
            w.wake();
        }
    }

    /// Discard the queued events of id `serial` (destroyed): its own, and connect
    /// requests on it if it was a listener (their new ids are destroyed with them).
    fn purge(&self, serial: u64) {
        let dropped: Vec<Queued<D>> = {
            let mut q = lock(&self.q);
            let (gone, kept): (VecDeque<_>, VecDeque<_>) = core::mem::take(&mut q.events)
                .into_iter()
                .partition(|e| e.id.serial == serial || e.owner.serial == serial);
            q.events = kept;
            gone.into_iter().collect()
        };
        if !dropped.is_empty() {
            sub(&self.counters.events_queued, dropped.len());
            for _ in 0..dropped.len() {
                bump(&self.counters.events_dropped);
            }
        }
        drop(dropped);
    }

    fn take_owned(&self, serial: u64) -> Vec<Queued<D>> {
        let moved: Vec<Queued<D>> = {
            let mut q = lock(&self.q);
            let (moved, kept): (VecDeque<_>, VecDeque<_>) = core::mem::take(&mut q.events)
                .into_iter()
                .partition(|e| e.owner.serial == serial);
            q.events = kept;
            moved.into_iter().collect()
        };
        // `push` on the new channel counts them again.
        sub(&self.counters.events_queued, moved.len());
        moved
    }
}

/// An event channel (librdmacm's `rdma_create_event_channel`). Ids created on it
/// ([`crate::RdmaCm::create_id_with_channel`]) queue their events here, and so do the
/// new ids of their connection requests. Cloning gives another handle on the same
/// channel.
pub struct EventChannel<D: CmDevice> {
    pub(crate) inner: std::sync::Arc<ChanInner<D>>,
}

impl<D: CmDevice> Clone for EventChannel<D> {
    fn clone(&self) -> Self {
        EventChannel {
            inner: self.inner.clone(),
        }
    }
}

impl<D: CmDevice> fmt::Debug for EventChannel<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("queued", &self.queued())
            .finish()
    }
}

impl<D: CmDevice> EventChannel<D> {
    /// The next event, waiting as long as it takes (`rdma_get_cm_event` on a blocking
    /// channel). Ack it ([`ChannelEvent::ack`], or drop it) when done.
    pub fn get_event(&self) -> ChannelEvent<D> {
        loop {
            if let Some(e) = self.inner.try_take() {
                return e;
            }
            let q = lock(&self.inner.q);
            if q.events.is_empty() {
                drop(wait(&self.inner.cv, q));
            }
        }
    }

    /// The next event, waiting at most `timeout`.
    ///
    /// # Errors
    /// [`CmError::Timeout`] if none arrived in time.
    #[cfg(not(loom))]
    pub fn get_event_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> Result<ChannelEvent<D>, CmError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.inner.try_take() {
                return Ok(e);
            }
            let q = lock(&self.inner.q);
            if q.events.is_empty() {
                let now = std::time::Instant::now();
                if now >= deadline {
                    return Err(CmError::Timeout { what: "an event" });
                }
                drop(sync::wait_timeout(&self.inner.cv, q, deadline - now));
            }
        }
    }

    /// The next event if one is queued (`rdma_get_cm_event` on a non-blocking
    /// channel, `EAGAIN` -> `None`).
    pub fn try_get_event(&self) -> Option<ChannelEvent<D>> {
        self.inner.try_take()
    }

    /// Events queued and not handed out yet.
    pub fn queued(&self) -> usize {
        lock(&self.inner.q).events.len()
    }

    /// The channel's events as an async stream (never ends). Events taken by the
    /// stream count as held by the thread that polled it.
    pub fn stream(&self) -> EventStream<D> {
        EventStream {
            inner: self.inner.clone(),
        }
    }
}

/// The async stream of an [`EventChannel`]'s events ([`EventChannel::stream`]).
pub struct EventStream<D: CmDevice> {
    inner: std::sync::Arc<ChanInner<D>>,
}

impl<D: CmDevice> fmt::Debug for EventStream<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventStream").finish_non_exhaustive()
    }
}

impl<D: CmDevice> futures_core::Stream for EventStream<D> {
    type Item = ChannelEvent<D>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ChannelEvent<D>>> {
        loop {
            if let Some(e) = self.inner.try_take() {
                return Poll::Ready(Some(e));
            }
            let mut q = lock(&self.inner.q);
            if q.events.is_empty() {
                if !q.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    q.wakers.push(cx.waker().clone());
                }
                return Poll::Pending;
            }
        }
    }
}

/// An event taken from an event channel (librdmacm's `struct rdma_cm_event *` from
/// `rdma_get_cm_event`). Dereferences to [`CmEvent`]. Ack it with
/// [`ChannelEvent::ack`] (`rdma_ack_cm_event`) or by dropping it; until then its id's
/// destroy waits for it, except on the thread that took it, where destroy is refused
/// with [`crate::CmError::UnackedEvents`] (that thread is recorded when the event is
/// taken; it stays the holder if the event is sent to another thread).
pub struct ChannelEvent<D: CmDevice> {
    event: CmEvent<D>,
    id: CmIdRef<D>,
    owner: Arc<IdInner<D>>,
    seq: u64,
}

impl<D: CmDevice> ChannelEvent<D> {
    /// The id the event is about (`event->id`; for a `ConnectRequest`, the new id,
    /// also available owned through [`CmEvent::take_new_id`]).
    pub fn id(&self) -> &CmIdRef<D> {
        &self.id
    }

    /// For a `ConnectRequest`: the listener (`event->listen_id`).
    pub fn listener(&self) -> Option<CmIdRef<D>> {
        if self.owner.serial != self.id.inner.serial {
            Some(CmIdRef {
                inner: self.owner.clone(),
            })
        } else {
            None
        }
    }

    /// Acknowledge the event (`rdma_ack_cm_event`); same as dropping it.
    pub fn ack(self) {}
}

impl<D: CmDevice> core::ops::Deref for ChannelEvent<D> {
    type Target = CmEvent<D>;
    fn deref(&self) -> &CmEvent<D> {
        &self.event
    }
}

impl<D: CmDevice> core::ops::DerefMut for ChannelEvent<D> {
    fn deref_mut(&mut self) -> &mut CmEvent<D> {
        &mut self.event
    }
}

impl<D: CmDevice> fmt::Debug for ChannelEvent<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelEvent")
            .field("id", &self.id.serial())
            .field("event", &self.event)
            .finish()
    }
}

impl<D: CmDevice> Drop for ChannelEvent<D> {
    fn drop(&mut self) {
        {
            let mut st = lock(&self.owner.st);
            st.unacked.retain(|(s, _)| *s != self.seq);
        }
        sub(&self.owner.shared.counters.events_unacked, 1);
        self.owner.ack_cv.notify_all();
    }
}
