//! One CM instance per provider (device): [`IwCm`], the top of the crate. It starts
//! the workers of `work`, creates ids (`id`) and reads the counters; nothing below it
//! names it.

use crate::error::CmError;
use crate::id::{CmId, EventHandler, IdInner};
use crate::machine::Machine;
use crate::provider::Provider;
use crate::sync::{self, Arc, JoinHandle};
use crate::work::{worker_main, CmConfig, CmStats, Shared};

/// An iWARP CM instance bound to one provider (device): the kernel's `iw_cm` for one
/// `ib_device`, with its own ordered worker(s) (`iw_cm_wq`).
///
/// Dropping it stops the workers after the queued jobs are done (and joins them,
/// unless dropped on a worker). Ids outlive it safely; events reported after the
/// workers stopped are dropped.
pub struct IwCm<P: Provider> {
    shared: Arc<Shared<P, IdInner<P>>>,
    workers: Vec<JoinHandle<()>>,
}

impl<P: Provider> core::fmt::Debug for IwCm<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IwCm")
            .field("name", &self.shared.config.name)
            .field("stats", &self.shared.stats())
            .finish_non_exhaustive()
    }
}

impl<P: Provider> IwCm<P> {
    /// Start a CM instance over `provider` with `config.workers` worker threads.
    ///
    /// # Errors
    /// [`CmError::Spawn`] if a worker thread cannot be started.
    pub fn new(provider: std::sync::Arc<P>, config: CmConfig) -> Result<IwCm<P>, CmError> {
        let workers = config.workers.max(1);
        let name = config.name.clone();
        let shared = Arc::new(Shared::new(provider, config, workers));
        let mut cm = IwCm {
            shared,
            workers: Vec::with_capacity(workers),
        };
        for n in 0..workers {
            let shared = cm.shared.clone();
            match sync::spawn(format!("{name}-worker-{n}"), move || worker_main(shared)) {
                Ok(handle) => cm.workers.push(handle),
                Err(e) => {
                    // Account for the workers that will never run, then stop the rest.
                    cm.shared.workers_lost(workers - n);
                    return Err(CmError::Spawn(e.to_string()));
                }
            }
        }
        Ok(cm)
    }

    /// Create a cm_id in `IDLE` whose events go to `handler` (`iw_create_cm_id`). The
    /// returned [`CmId`] is the creator's reference; dropping it destroys the id.
    pub fn create_id<H: EventHandler<P>>(&self, handler: H) -> CmId<P> {
        self.create_id_shared(std::sync::Arc::new(handler))
    }

    /// [`IwCm::create_id`] with a handler shared with other ids.
    pub fn create_id_shared(&self, handler: std::sync::Arc<dyn EventHandler<P>>) -> CmId<P> {
        CmId::from_inner(IdInner::new(&self.shared, handler, Machine::new()))
    }

    /// The provider.
    pub fn provider(&self) -> &std::sync::Arc<P> {
        &self.shared.provider
    }

    /// The instance's name.
    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// A snapshot of the live-object and event counters.
    pub fn stats(&self) -> CmStats {
        self.shared.stats()
    }

    /// Wait until every queued job has been run and no delivery is in progress
    /// (the kernel's `flush_workqueue(iw_cm_wq)`). Events reported meanwhile are
    /// waited for too.
    ///
    /// # Errors
    /// [`CmError::InDeliveryContext`] on a CM worker thread (from a handler), where it
    /// would wait for itself; nothing is waited for.
    pub fn flush(&self) -> Result<(), CmError> {
        if sync::in_delivery_context() {
            return Err(CmError::InDeliveryContext { op: "flush" });
        }
        self.shared.wait_idle();
        Ok(())
    }

    /// [`IwCm::flush`] with a deadline.
    ///
    /// # Errors
    /// [`CmError::InDeliveryContext`] as for `flush`; [`CmError::Timeout`] if the
    /// workers are still busy after `timeout`.
    #[cfg(not(loom))]
    pub fn flush_timeout(&self, timeout: std::time::Duration) -> Result<(), CmError> {
        if sync::in_delivery_context() {
            return Err(CmError::InDeliveryContext { op: "flush" });
        }
        if self.shared.wait_idle_timeout(timeout) {
            Ok(())
        } else {
            Err(CmError::Timeout)
        }
    }

    /// A human-readable dump of the instance: counters, and each live id's state,
    /// queue length and delivery flags (for watchdogs and debugging).
    pub fn dump_state(&self) -> String {
        use core::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "iw-cm {}: {:?}", self.shared.config.name, self.stats());
        #[cfg(not(loom))]
        {
            let ids: Vec<_> = {
                let reg = self
                    .shared
                    .registry
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let mut v: Vec<_> = reg.values().filter_map(|w| w.upgrade()).collect();
                v.sort_by_key(|id| id.serial);
                v
            };
            for id in &ids {
                let _ = writeln!(out, "  {}", id.describe());
            }
            drop(ids);
        }
        out
    }

    /// Stop the workers after the queued jobs are done and join them.
    ///
    /// # Errors
    /// [`CmError::InDeliveryContext`] on a CM worker thread (it would join itself); the
    /// workers are then told to stop but not joined.
    pub fn shutdown(mut self) -> Result<(), CmError> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<(), CmError> {
        self.shared.stop_workers();
        if sync::in_delivery_context() {
            self.workers.clear();
            return Err(CmError::InDeliveryContext { op: "shutdown" });
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        Ok(())
    }
}

impl<P: Provider> Drop for IwCm<P> {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}
