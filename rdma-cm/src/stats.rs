//! The RDMA CM's counters: [`RdmaCmStats`] (what [`crate::RdmaCm::stats`] returns) and
//! the live atomics behind it, bumped by the registry, the ids and the event channels.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Live-object and event counters of an [`crate::RdmaCm`] ([`crate::RdmaCm::stats`]), for tests
/// proving that nothing leaks and that removal delivered what it should.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RdmaCmStats {
    /// Ids whose memory is not freed yet (user ids, new ids of requests, internal
    /// listeners).
    pub ids_alive: usize,
    /// Ids ever created.
    pub ids_created: usize,
    /// Devices added and not released yet (a removed device stays held until every id
    /// bound to it is gone).
    pub devices_held: usize,
    /// Devices ever added.
    pub devices_added: usize,
    /// Devices released.
    pub devices_released: usize,
    /// Events queued on event channels and not handed out yet.
    pub events_queued: usize,
    /// Events handed out by event channels and not acked yet.
    pub events_unacked: usize,
    /// Callbacks called.
    pub callbacks: usize,
    /// Events dropped: their id was destroyed, or stopped listening, before delivery.
    pub events_dropped: usize,
    /// `DeviceRemoval` events delivered (called or queued).
    pub device_removals: usize,
    /// Ids of a removed device that got no `DeviceRemoval` because their destroy had
    /// been asked.
    pub removals_skipped: usize,
    /// Internal per-device listeners of wildcard listens alive.
    pub internal_listeners: usize,
    /// Internal listeners that could not be created (the device's listen failed).
    pub internal_listen_failures: usize,
    /// Callbacks that panicked (their id was destroyed).
    pub handler_panics: usize,
    /// Jobs queued for the worker or running.
    pub jobs_pending: usize,
    /// Address resolutions waiting for their device or their timeout.
    pub timers_pending: usize,
}

/// The live counters behind [`RdmaCmStats`], shared by the registry, the ids and the
/// event channels (plain atomics: they order nothing).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) ids_alive: AtomicUsize,
    pub(crate) ids_created: AtomicUsize,
    pub(crate) devices_held: AtomicUsize,
    pub(crate) devices_added: AtomicUsize,
    pub(crate) devices_released: AtomicUsize,
    pub(crate) events_queued: AtomicUsize,
    pub(crate) events_unacked: AtomicUsize,
    pub(crate) callbacks: AtomicUsize,
    pub(crate) events_dropped: AtomicUsize,
    pub(crate) device_removals: AtomicUsize,
    pub(crate) removals_skipped: AtomicUsize,
    pub(crate) internal_listeners: AtomicUsize,
    pub(crate) internal_listen_failures: AtomicUsize,
    pub(crate) handler_panics: AtomicUsize,
}

pub(crate) fn bump(c: &AtomicUsize) {
    c.fetch_add(1, Relaxed);
}

pub(crate) fn sub(c: &AtomicUsize, n: usize) {
    c.fetch_sub(n, Relaxed);
}

impl Counters {
    /// The counters now, with the worker's queue lengths.
    pub(crate) fn snapshot(&self, jobs_pending: usize, timers_pending: usize) -> RdmaCmStats {
        let c = self;
        RdmaCmStats {
            ids_alive: c.ids_alive.load(Relaxed),
            ids_created: c.ids_created.load(Relaxed),
            devices_held: c.devices_held.load(Relaxed),
            devices_added: c.devices_added.load(Relaxed),
            devices_released: c.devices_released.load(Relaxed),
            events_queued: c.events_queued.load(Relaxed),
            events_unacked: c.events_unacked.load(Relaxed),
            callbacks: c.callbacks.load(Relaxed),
            events_dropped: c.events_dropped.load(Relaxed),
            device_removals: c.device_removals.load(Relaxed),
            removals_skipped: c.removals_skipped.load(Relaxed),
            internal_listeners: c.internal_listeners.load(Relaxed),
            internal_listen_failures: c.internal_listen_failures.load(Relaxed),
            handler_panics: c.handler_panics.load(Relaxed),
            jobs_pending,
            timers_pending,
        }
    }
}
