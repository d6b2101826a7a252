//! The RDMA CM instance, the top of the crate: [`RdmaCm`] (add and remove devices,
//! create ids and event channels, counters, flush, dump, shutdown) and [`Removal`].
//! It sits above `registry` (whose shared part and worker it starts), `id` and
//! `channel`; nothing in the crate names it.

use crate::channel::{ChanInner, EventChannel};
use crate::device::CmDevice;
use crate::error::CmError;
use crate::id::{CmId, Delivery, Handler, IdInner, Role};
use crate::machine::IdState;
use crate::registry::{worker_main, DevEntry, RdmaCmConfig, Shared};
use crate::stats::RdmaCmStats;
use crate::sync::{self, Arc, JoinHandle};
use core::fmt;

/// The RDMA connection manager: a registry of devices, the ids, and the worker thread
/// that delivers address, route, device-removal and address-change events (cma.c's
/// `cma_wq` and the `ib_client` callbacks; connection events come from each device's
/// iWARP CM worker). Generic over the device type `D` (see [`CmDevice`]).
///
/// Dropping it stops the worker (after its queued jobs) and joins it. Remove the
/// devices first for an orderly end: ids and devices outlive it, but no address, route
/// or removal event is delivered any more.
pub struct RdmaCm<D: CmDevice> {
    shared: Arc<Shared<IdInner<D>>>,
    worker: Option<JoinHandle<()>>,
}

impl<D: CmDevice> fmt::Debug for RdmaCm<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaCm")
            .field("name", &self.shared.config.name)
            .field("stats", &self.shared.stats())
            .finish_non_exhaustive()
    }
}

impl<D: CmDevice> RdmaCm<D> {
    /// Start an RDMA CM with its worker thread.
    ///
    /// # Errors
    /// [`CmError::Worker`] if the thread cannot be started.
    pub fn new(config: RdmaCmConfig) -> Result<RdmaCm<D>, CmError> {
        let name = config.name.clone();
        let shared = Arc::new(Shared::new(config));
        let s2 = shared.clone();
        let worker = sync::spawn(format!("{name}-worker"), move || worker_main(s2))
            .map_err(|e| CmError::Worker(e.to_string()))?;
        Ok(RdmaCm {
            shared,
            worker: Some(worker),
        })
    }

    /// Register a device (cma.c's `cma_add_one`): start its iWARP CM instance, hand it
    /// its [`crate::DeviceNotifier`] ([`CmDevice::attached`]), and make every wildcard
    /// listener listen on it too.
    ///
    /// # Errors
    /// [`CmError::DuplicateDevice`] if a registered device has the same name;
    /// [`CmError::Iw`] if its iWARP CM cannot start.
    pub fn add_device(&self, dev: std::sync::Arc<D>) -> Result<(), CmError> {
        Shared::add_device(&self.shared, dev)
    }

    /// Remove a device now, on the calling thread (cma.c's `cma_remove_one`): it stops
    /// being chosen by routes and listens; its wildcard internal listeners are
    /// destroyed silently; every other id bound to it, under its callback
    /// serialization, gets exactly one `DeviceRemoval` unless its destroy was already
    /// asked (its QP first moved to ERROR). `DeviceRemoval` callbacks run on this
    /// thread. Returns once every id was handled; the device itself is released when
    /// the last id bound to it is destroyed: see [`Removal`]. A device that reports its
    /// own removal uses [`crate::DeviceNotifier::removed`] instead (same steps, on the
    /// worker).
    ///
    /// # Errors
    /// [`CmError::InCallback`] from inside a callback (it could wait for that callback);
    /// [`CmError::NoSuchDevice`].
    pub fn remove_device(&self, name: &str) -> Result<Removal<D>, CmError> {
        if sync::in_callback() {
            return Err(CmError::InCallback {
                op: "remove_device",
            });
        }
        let entry = self
            .shared
            .find_device(name)
            .ok_or_else(|| CmError::NoSuchDevice(name.to_string()))?;
        Shared::process_removal(&self.shared, &entry);
        Ok(Removal { entry })
    }

    /// The names of the registered devices (not being removed), in the order added.
    pub fn devices(&self) -> Vec<String> {
        self.shared.device_names()
    }

    /// Create an id whose events go to `handler` (`rdma_create_id` with a callback, the
    /// kernel API).
    pub fn create_id<H: Handler<D>>(&self, handler: H) -> CmId<D> {
        self.create_id_shared(std::sync::Arc::new(handler))
    }

    /// [`RdmaCm::create_id`] with a handler shared with other ids.
    pub fn create_id_shared(&self, handler: std::sync::Arc<dyn Handler<D>>) -> CmId<D> {
        CmId::from_inner(IdInner::new(
            &self.shared,
            Role::User,
            Delivery::Callback(handler),
            IdState::Idle,
        ))
    }

    /// Create an event channel (`rdma_create_event_channel`).
    pub fn create_event_channel(&self) -> EventChannel<D> {
        EventChannel {
            inner: ChanInner::new(self.shared.counters.clone()),
        }
    }

    /// Create an id whose events go to `channel` (`rdma_create_id` with a channel,
    /// librdmacm).
    pub fn create_id_with_channel(&self, channel: &EventChannel<D>) -> CmId<D> {
        CmId::from_inner(IdInner::new(
            &self.shared,
            Role::User,
            Delivery::Channel(channel.inner.clone()),
            IdState::Idle,
        ))
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> RdmaCmStats {
        self.shared.stats()
    }

    /// Wait until the worker has nothing queued or running (address, route, removal
    /// and address-change jobs; not pending resolution timeouts).
    ///
    /// # Errors
    /// [`CmError::InCallback`] from a callback or the worker thread.
    pub fn flush(&self) -> Result<(), CmError> {
        if sync::in_callback() || sync::on_worker() {
            return Err(CmError::InCallback { op: "flush" });
        }
        self.shared.wait_idle();
        Ok(())
    }

    /// Waits (at most `timeout`) until every id has been freed, then returns the
    /// counters. An id is freed on its last reference (rule 2, cma.c's `cma_id_put`),
    /// which a worker may still hold a moment after `destroy` returned (an event in
    /// delivery, a resolution job, a device's shutdown completing the resolutions it
    /// held): this flushes the worker and polls every 2 ms. `ids_alive` in the result is
    /// 0 unless an id really is still alive at the deadline (a leak, or a user's handle).
    ///
    /// # Errors
    /// [`CmError::InCallback`] from a callback or the worker thread (as [`RdmaCm::flush`]).
    pub fn wait_ids_freed(&self, timeout: std::time::Duration) -> Result<RdmaCmStats, CmError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            self.flush()?;
            let s = self.stats();
            if s.ids_alive == 0 || std::time::Instant::now() >= deadline {
                return Ok(s);
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// A human-readable dump: counters, devices, and every live id (for watchdogs).
    pub fn dump_state(&self) -> String {
        use core::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "rdma-cm {}: {:?}",
            self.shared.config.name,
            self.stats()
        );
        self.shared.dump_devices(&mut out);
        #[cfg(not(loom))]
        {
            let ids: Vec<_> = {
                let reg = self.shared.ids.lock().unwrap_or_else(|e| e.into_inner());
                let mut v: Vec<_> = reg.values().filter_map(|w| w.upgrade()).collect();
                v.sort_by_key(|i| i.serial);
                v
            };
            for id in &ids {
                let _ = writeln!(out, "  {}", id.describe());
            }
        }
        out
    }

    /// Stop the worker after its queued jobs and join it.
    ///
    /// # Errors
    /// [`CmError::InCallback`] on the worker (from a callback), where it would join
    /// itself; the worker is then told to stop but not joined.
    pub fn shutdown(mut self) -> Result<(), CmError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), CmError> {
        self.shared.stop_worker();
        if sync::on_worker() {
            self.worker = None;
            return Err(CmError::InCallback { op: "shutdown" });
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        Ok(())
    }
}

impl<D: CmDevice> Drop for RdmaCm<D> {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// A device removal in progress ([`RdmaCm::remove_device`]): the device is released
/// (its iWARP CM shut down, [`CmDevice::released`] called, the registry's reference
/// dropped) when the last id bound to it is destroyed.
pub struct Removal<D: CmDevice> {
    entry: Arc<DevEntry<IdInner<D>>>,
}

impl<D: CmDevice> fmt::Debug for Removal<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Removal")
            .field("device", &self.entry.name)
            .field("released", &self.is_released())
            .finish()
    }
}

impl<D: CmDevice> Removal<D> {
    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.entry.name
    }

    /// Ids still bound to the device.
    pub fn ids_bound(&self) -> usize {
        self.entry.ids_bound()
    }

    /// Whether the device was released.
    pub fn is_released(&self) -> bool {
        self.entry.is_released()
    }

    /// Wait until the device is released (cma.c's `wait_for_completion(&cma_dev->comp)`).
    ///
    /// # Errors
    /// [`CmError::InCallback`] from a callback or the worker (the release may need
    /// them).
    pub fn wait(&self) -> Result<(), CmError> {
        if sync::in_callback() || sync::on_worker() {
            return Err(CmError::InCallback {
                op: "Removal::wait",
            });
        }
        self.entry.wait_released();
        Ok(())
    }

    /// [`Removal::wait`] for at most `timeout`.
    ///
    /// # Errors
    /// As `wait`; [`CmError::Timeout`] if ids are still bound after `timeout`.
    #[cfg(not(loom))]
    pub fn wait_timeout(&self, timeout: std::time::Duration) -> Result<(), CmError> {
        if sync::in_callback() || sync::on_worker() {
            return Err(CmError::InCallback {
                op: "Removal::wait",
            });
        }
        if self.entry.wait_released_timeout(timeout) {
            Ok(())
        } else {
            Err(CmError::Timeout {
                what: "the device's release",
            })
        }
    }
}
