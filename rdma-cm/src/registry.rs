//! The RDMA CM instance: the device registry, the worker thread (cma.c's `cma_wq`),
//! port reservations, wildcard listeners, device removal, counters.

use crate::channel::{ChanInner, EventChannel};
use crate::device::{CmDevice, DeviceEvents, DeviceNotifier, NeighborResult, QpOf};
use crate::error::CmError;
use crate::id::{CmId, Delivery, Handler, IdInner, IwId, Role};
use crate::machine::IdState;
use crate::route::DeviceRoutes;
use crate::stats::{bump, sub, Counters, RdmaCmStats};
use crate::sync::{self, lock, wait, Arc, Condvar, JoinHandle, Mutex};
use core::fmt;
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A rule of design.md section 5 (rdma-cm) that a test may switch off to show that the
/// loom models and the stress test catch its violation. Never set outside such a test:
/// the default ([`RdmaCmConfig::rule_break`] = `None`) keeps every rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleBreak {
    /// `destroy` does not wait for a callback in progress on the id (rule 2: "destroy
    /// waits until any callback in progress on that id has returned").
    DestroyNoWait,
    /// Device removal delivers `DeviceRemoval` even to an id whose destroy was asked
    /// (by a call, or by a callback's return) — the bug the 2007 thread is about
    /// (rule 3: "if the user has already asked to destroy it, deliver nothing").
    RemovalIgnoresDestroying,
    /// Device removal delivers `DeviceRemoval` without taking the id's handler lock,
    /// i.e. concurrently with a callback in progress (rule 1 and 3: "take the id's
    /// callback serialization").
    UnserializedRemoval,
    /// Device removal treats a wildcard listener's internal per-device listener like a
    /// user id: the user's wildcard listener gets `DeviceRemoval` (rule 3: "internal
    /// per-device listeners are destroyed silently; the user's wildcard listener
    /// survives").
    RemovalHitsWildcardListener,
}

impl RuleBreak {
    /// Parse the names used by the `RDMACM_BREAK` environment variable of the tests:
    /// `destroy-no-wait`, `removal-after-destroy`, `unserialized-removal`,
    /// `removal-hits-wildcard`.
    pub fn from_name(name: &str) -> Option<RuleBreak> {
        match name {
            "destroy-no-wait" => Some(RuleBreak::DestroyNoWait),
            "removal-after-destroy" => Some(RuleBreak::RemovalIgnoresDestroying),
            "unserialized-removal" => Some(RuleBreak::UnserializedRemoval),
            "removal-hits-wildcard" => Some(RuleBreak::RemovalHitsWildcardListener),
            _ => None,
        }
    }
}

/// Configuration of an [`RdmaCm`].
#[derive(Debug, Clone)]
pub struct RdmaCmConfig {
    /// A name for the worker thread and logs.
    pub name: String,
    /// The backlog `listen` uses when given 0.
    pub default_backlog: u32,
    /// The ephemeral port range for `bind_addr`/`listen` with port 0 (inclusive).
    pub ephemeral_ports: (u16, u16),
    /// Test-only: a rule to break (see [`RuleBreak`]). `None` in any real use.
    pub rule_break: Option<RuleBreak>,
}

impl Default for RdmaCmConfig {
    fn default() -> Self {
        RdmaCmConfig {
            name: "rdmacm".to_string(),
            default_backlog: 256,
            ephemeral_ports: (49152, 65535),
            rule_break: None,
        }
    }
}

// ------------------------------------------------------------------- devices

struct DevSt<D: CmDevice> {
    removing: bool,
    processed: bool,
    release_queued: bool,
    released: bool,
    /// Every id bound to the device (cma.c's `cma_dev->id_list`), internal listeners
    /// included.
    ids: Vec<Arc<IdInner<D>>>,
}

/// A registered device (cma.c's `struct cma_device`).
pub(crate) struct DevEntry<D: CmDevice> {
    pub(crate) serial: u64,
    pub(crate) name: String,
    dev: Mutex<Option<std::sync::Arc<D>>>,
    iw: Mutex<Option<iw_cm::IwCm<D::Provider>>>,
    st: Mutex<DevSt<D>>,
    cv: Condvar,
}

impl<D: CmDevice> DevEntry<D> {
    /// The device, until it is released.
    pub(crate) fn device(&self) -> Option<std::sync::Arc<D>> {
        lock(&self.dev).clone()
    }

    pub(crate) fn is_removing(&self) -> bool {
        lock(&self.st).removing
    }

    /// Create an iWARP CM id on the device's iw-cm instance (`None` once released).
    pub(crate) fn create_iw_id(
        &self,
        handler: std::sync::Arc<dyn iw_cm::EventHandler<D::Provider>>,
    ) -> Option<IwId<D>> {
        lock(&self.iw)
            .as_ref()
            .map(|cm| cm.create_id_shared(handler))
    }

    /// The user ids bound to the device now (internal listeners left out).
    pub(crate) fn user_ids(&self) -> Vec<Arc<IdInner<D>>> {
        lock(&self.st)
            .ids
            .iter()
            .filter(|i| matches!(i.role, Role::User))
            .cloned()
            .collect()
    }

    /// Bind an id to the device (cma.c's `cma_attach_to_dev`); refused once removal
    /// started.
    pub(crate) fn attach(&self, id: &Arc<IdInner<D>>) -> Result<(), CmError> {
        let mut st = lock(&self.st);
        if st.removing {
            return Err(CmError::DeviceRemoved { op: "attach" });
        }
        st.ids.push(id.clone());
        Ok(())
    }

    /// Unbind an id (cma.c's `cma_release_dev`); the last id of a removed device lets
    /// it be released.
    pub(crate) fn detach(this: &Arc<Self>, shared: &Shared<D>, serial: u64) {
        let release = {
            let mut st = lock(&this.st);
            st.ids.retain(|i| i.serial != serial);
            this.release_due(&mut st)
        };
        if release {
            shared.queue_release(this.clone());
        }
    }

    fn release_due(&self, st: &mut DevSt<D>) -> bool {
        if st.removing && st.processed && st.ids.is_empty() && !st.release_queued {
            st.release_queued = true;
            true
        } else {
            false
        }
    }

    pub(crate) fn qp_to_error(&self, qp: &QpOf<D>) {
        if let Some(dev) = self.device() {
            dev.qp_to_error(qp);
        }
    }

    pub(crate) fn destroy_qp(&self, qp: QpOf<D>) {
        match self.device() {
            Some(dev) => dev.destroy_qp(qp),
            None => drop(qp),
        }
    }

    /// Let go of the device: shut its iWARP CM down, tell it, drop it.
    fn release(&self, counters: &Counters) {
        let iw = lock(&self.iw).take();
        drop(iw);
        let dev = lock(&self.dev).take();
        if let Some(dev) = &dev {
            dev.released();
        }
        drop(dev);
        {
            let mut st = lock(&self.st);
            st.released = true;
        }
        sub(&counters.devices_held, 1);
        bump(&counters.devices_released);
        self.cv.notify_all();
        tracing::info!(device = %self.name, "device released");
    }
}

// ----------------------------------------------------------------------- jobs

/// Work for the worker thread.
pub(crate) enum Job<D: CmDevice> {
    /// An address resolution ended (device completion, or a route-less failure).
    AddrDone {
        id: Arc<IdInner<D>>,
        gen: u64,
        entry: Option<Arc<DevEntry<D>>>,
        src: Ipv4Addr,
        next_hop: Ipv4Addr,
        result: NeighborResult,
    },
    /// Deliver the route of an id.
    RouteDone { id: Arc<IdInner<D>>, gen: u64 },
    /// A device reported its removal.
    Remove(Arc<DevEntry<D>>),
    /// A device reported an address change.
    AddrChange(Arc<DevEntry<D>>),
    /// Release a removed device whose ids are all gone.
    Release(Arc<DevEntry<D>>),
}

#[cfg(not(loom))]
struct Timer<D: CmDevice> {
    deadline: std::time::Instant,
    id: Arc<IdInner<D>>,
    gen: u64,
}

struct JobQueue<D: CmDevice> {
    jobs: VecDeque<Job<D>>,
    busy: usize,
    running: bool,
    stopping: bool,
    #[cfg(not(loom))]
    timers: Vec<Timer<D>>,
}

struct PortRes {
    ip: Ipv4Addr,
    port: u16,
    owner: u64,
}

pub(crate) struct Reg<D: CmDevice> {
    devices: Vec<Arc<DevEntry<D>>>,
    listen_any: Vec<Arc<IdInner<D>>>,
    ports: Vec<PortRes>,
    next_port: u16,
}

/// What the ids, the devices' handles and the worker share.
pub(crate) struct Shared<D: CmDevice> {
    pub(crate) config: RdmaCmConfig,
    pub(crate) counters: std::sync::Arc<Counters>,
    next_serial: AtomicU64,
    reg: Mutex<Reg<D>>,
    /// Serializes listen on the wildcard address with device addition, so that each
    /// (wildcard listener, device) pair gets exactly one internal listener.
    listen_lock: Mutex<()>,
    jobs: Mutex<JobQueue<D>>,
    jobs_cv: Condvar,
    idle_cv: Condvar,
    #[cfg(not(loom))]
    pub(crate) ids: std::sync::Mutex<std::collections::HashMap<u64, std::sync::Weak<IdInner<D>>>>,
}

impl<D: CmDevice> Shared<D> {
    pub(crate) fn breaks(&self, rule: RuleBreak) -> bool {
        self.config.rule_break == Some(rule)
    }

    pub(crate) fn next_serial(&self) -> u64 {
        self.next_serial.fetch_add(1, Relaxed) + 1
    }

    /// Queue work for the worker. Dropped (with a log line) once the worker stopped;
    /// a release is then done at once.
    pub(crate) fn push_job(&self, job: Job<D>) {
        let mut q = lock(&self.jobs);
        if !q.running {
            drop(q);
            match job {
                Job::Release(entry) => entry.release(&self.counters),
                _ => tracing::warn!("rdma_cm worker stopped; job dropped"),
            }
            return;
        }
        q.jobs.push_back(job);
        drop(q);
        self.jobs_cv.notify_all();
    }

    pub(crate) fn queue_release(&self, entry: Arc<DevEntry<D>>) {
        self.push_job(Job::Release(entry));
    }

    #[cfg(not(loom))]
    pub(crate) fn add_timer(&self, id: &Arc<IdInner<D>>, gen: u64, timeout: std::time::Duration) {
        let deadline = std::time::Instant::now() + timeout;
        let mut q = lock(&self.jobs);
        q.timers.push(Timer {
            deadline,
            id: id.clone(),
            gen,
        });
        drop(q);
        self.jobs_cv.notify_all();
    }

    /// Loom has no time: address resolutions end only by their device's completion.
    #[cfg(loom)]
    pub(crate) fn add_timer(
        &self,
        _id: &Arc<IdInner<D>>,
        _gen: u64,
        _timeout: std::time::Duration,
    ) {
    }

    /// Forget the resolution timeout of id `serial` (of query `gen`, or all of them):
    /// a timer holds its id.
    #[cfg(not(loom))]
    pub(crate) fn cancel_timer(&self, serial: u64, gen: Option<u64>) {
        let gone: Vec<Timer<D>> = {
            let mut q = lock(&self.jobs);
            let (gone, kept) = core::mem::take(&mut q.timers)
                .into_iter()
                .partition(|t| t.id.serial == serial && gen.is_none_or(|g| t.gen == g));
            q.timers = kept;
            gone
        };
        drop(gone);
    }

    #[cfg(loom)]
    pub(crate) fn cancel_timer(&self, _serial: u64, _gen: Option<u64>) {}

    #[cfg(not(loom))]
    fn next_job(&self) -> Option<Job<D>> {
        let mut q = lock(&self.jobs);
        loop {
            let now = std::time::Instant::now();
            let mut i = 0;
            while i < q.timers.len() {
                if q.timers[i].deadline <= now {
                    let t = q.timers.swap_remove(i);
                    q.jobs.push_back(Job::AddrDone {
                        id: t.id,
                        gen: t.gen,
                        entry: None,
                        src: Ipv4Addr::UNSPECIFIED,
                        next_hop: Ipv4Addr::UNSPECIFIED,
                        result: Err(crate::device::ResolveError::TimedOut),
                    });
                } else {
                    i += 1;
                }
            }
            if let Some(job) = q.jobs.pop_front() {
                q.busy += 1;
                return Some(job);
            }
            if q.stopping {
                q.running = false;
                q.timers.clear();
                drop(q);
                self.idle_cv.notify_all();
                return None;
            }
            match q.timers.iter().map(|t| t.deadline).min() {
                Some(d) => q = sync::wait_timeout(&self.jobs_cv, q, d - now),
                None => q = wait(&self.jobs_cv, q),
            }
        }
    }

    #[cfg(loom)]
    fn next_job(&self) -> Option<Job<D>> {
        let mut q = lock(&self.jobs);
        loop {
            if let Some(job) = q.jobs.pop_front() {
                q.busy += 1;
                return Some(job);
            }
            if q.stopping {
                q.running = false;
                drop(q);
                self.idle_cv.notify_all();
                return None;
            }
            q = wait(&self.jobs_cv, q);
        }
    }

    fn job_done(&self) {
        let mut q = lock(&self.jobs);
        q.busy -= 1;
        let idle = q.busy == 0 && q.jobs.is_empty();
        drop(q);
        if idle {
            self.idle_cv.notify_all();
        }
    }

    fn run(this: &Arc<Self>, job: Job<D>) {
        match job {
            Job::AddrDone {
                id,
                gen,
                entry,
                src,
                next_hop,
                result,
            } => IdInner::addr_done(&id, gen, entry, src, next_hop, result),
            Job::RouteDone { id, gen } => IdInner::route_done(&id, gen),
            Job::Remove(entry) => Shared::process_removal(this, &entry),
            Job::AddrChange(entry) => {
                let ids: Vec<_> = lock(&entry.st).ids.clone();
                for id in ids {
                    if matches!(id.role, Role::User) {
                        IdInner::addr_change(&id);
                    }
                }
            }
            Job::Release(entry) => entry.release(&this.counters),
        }
    }

    // ---------------------------------------------------------------- removal

    /// cma.c's `cma_process_remove`: for each id bound to the device, internal
    /// listeners are destroyed silently and user ids get `cma_remove_id_dev`
    /// ([`IdInner::remove_id_dev`]); the device is released once the last id is gone.
    /// A second call for the same device waits until the first has delivered.
    pub(crate) fn process_removal(this: &Arc<Self>, entry: &Arc<DevEntry<D>>) {
        lock(&this.reg).devices.retain(|d| d.serial != entry.serial);
        let ids = {
            let mut st = lock(&entry.st);
            if st.removing {
                while !st.processed {
                    st = wait(&entry.cv, st);
                }
                return;
            }
            st.removing = true;
            st.ids.clone()
        };
        tracing::info!(device = %entry.name, ids = ids.len(), "device removal");
        for id in ids {
            match &id.role {
                Role::Internal { parent } => {
                    if this.breaks(RuleBreak::RemovalHitsWildcardListener) {
                        IdInner::remove_id_dev(parent, entry);
                    }
                    IdInner::internal_teardown(&id);
                }
                Role::User => IdInner::remove_id_dev(&id, entry),
            }
        }
        let release = {
            let mut st = lock(&entry.st);
            st.processed = true;
            entry.release_due(&mut st)
        };
        entry.cv.notify_all();
        if release {
            this.queue_release(entry.clone());
        }
    }

    // ------------------------------------------------------- addresses, ports

    /// The devices and their IPv4 configuration, for route selection.
    pub(crate) fn route_snapshot(&self) -> (Vec<Arc<DevEntry<D>>>, Vec<DeviceRoutes>) {
        let entries = lock(&self.reg).devices.clone();
        let routes = entries
            .iter()
            .map(|e| match e.device() {
                Some(d) => DeviceRoutes {
                    addrs: d.addresses(),
                    gateway: d.gateway(),
                },
                None => DeviceRoutes {
                    addrs: Vec::new(),
                    gateway: None,
                },
            })
            .collect();
        (entries, routes)
    }

    /// The registered device that has address `ip`.
    pub(crate) fn device_owning(&self, ip: Ipv4Addr) -> Option<Arc<DevEntry<D>>> {
        let (entries, routes) = self.route_snapshot();
        crate::route::device_owning(&routes, ip).map(|i| entries[i].clone())
    }

    /// Reserve `ip:port` for id `owner` (port 0: an ephemeral one). Two reservations of
    /// a port conflict when their addresses are equal or either is the wildcard (the
    /// kernel's port space without `SO_REUSEADDR`).
    pub(crate) fn reserve_port(&self, ip: Ipv4Addr, port: u16, owner: u64) -> Result<u16, CmError> {
        let mut reg = lock(&self.reg);
        let conflict = |reg: &Reg<D>, p: u16| {
            reg.ports.iter().any(|r| {
                r.port == p && (r.ip == ip || r.ip.is_unspecified() || ip.is_unspecified())
            })
        };
        let port = if port == 0 {
            let (lo, hi) = self.config.ephemeral_ports;
            let span = u32::from(hi.saturating_sub(lo)) + 1;
            let mut found = None;
            for _ in 0..span {
                let p = reg.next_port.clamp(lo, hi);
                reg.next_port = if p >= hi { lo } else { p + 1 };
                if !conflict(&reg, p) {
                    found = Some(p);
                    break;
                }
            }
            found.ok_or(CmError::NoPorts)?
        } else {
            if conflict(&reg, port) {
                return Err(CmError::AddressInUse(std::net::SocketAddr::new(
                    ip.into(),
                    port,
                )));
            }
            port
        };
        reg.ports.push(PortRes { ip, port, owner });
        Ok(port)
    }

    pub(crate) fn release_port(&self, ip: Ipv4Addr, port: u16, owner: u64) {
        lock(&self.reg)
            .ports
            .retain(|r| !(r.ip == ip && r.port == port && r.owner == owner));
    }

    /// Register a wildcard listener and create its internal listener on every device
    /// (cma.c's `cma_listen_on_all`).
    pub(crate) fn listen_any(&self, listener: &Arc<IdInner<D>>) {
        let _l = lock(&self.listen_lock);
        let devices = {
            let mut reg = lock(&self.reg);
            reg.listen_any.push(listener.clone());
            reg.devices.clone()
        };
        for entry in &devices {
            IdInner::create_internal(listener, entry);
        }
    }

    pub(crate) fn remove_listen_any(&self, serial: u64) {
        let gone: Vec<_> = {
            let mut reg = lock(&self.reg);
            let (gone, kept) = core::mem::take(&mut reg.listen_any)
                .into_iter()
                .partition(|l| l.serial == serial);
            reg.listen_any = kept;
            gone
        };
        drop(gone);
    }

    fn stats(&self) -> RdmaCmStats {
        let c = &self.counters;
        let (jobs_pending, timers_pending) = {
            let q = lock(&self.jobs);
            #[cfg(not(loom))]
            let timers = q.timers.len();
            #[cfg(loom)]
            let timers = 0;
            (q.jobs.len() + q.busy, timers)
        };
        c.snapshot(jobs_pending, timers_pending)
    }
}

/// What a registered device's [`DeviceNotifier`] reaches: its entry, and the worker.
struct Notifier<D: CmDevice> {
    shared: Arc<Shared<D>>,
    entry: Arc<DevEntry<D>>,
}

impl<D: CmDevice> DeviceEvents for Notifier<D> {
    fn removed(&self) {
        for id in self.entry.user_ids() {
            id.mark_device_removal();
        }
        self.shared.push_job(Job::Remove(self.entry.clone()));
    }

    fn address_changed(&self) {
        self.shared.push_job(Job::AddrChange(self.entry.clone()));
    }

    fn device_name(&self) -> &str {
        &self.entry.name
    }
}

fn worker_main<D: CmDevice>(shared: Arc<Shared<D>>) {
    sync::set_on_worker(true);
    while let Some(job) = shared.next_job() {
        Shared::run(&shared, job);
        shared.job_done();
    }
    sync::set_on_worker(false);
}

// ------------------------------------------------------------------- the API

/// The RDMA connection manager: a registry of devices, the ids, and the worker thread
/// that delivers address, route, device-removal and address-change events (cma.c's
/// `cma_wq` and the `ib_client` callbacks; connection events come from each device's
/// iWARP CM worker). Generic over the device type `D` (see [`CmDevice`]).
///
/// Dropping it stops the worker (after its queued jobs) and joins it. Remove the
/// devices first for an orderly end: ids and devices outlive it, but no address, route
/// or removal event is delivered any more.
pub struct RdmaCm<D: CmDevice> {
    shared: Arc<Shared<D>>,
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
        let first_port = config.ephemeral_ports.0;
        let shared = Arc::new(Shared {
            config,
            counters: std::sync::Arc::new(Counters::default()),
            next_serial: AtomicU64::new(0),
            reg: Mutex::new(Reg {
                devices: Vec::new(),
                listen_any: Vec::new(),
                ports: Vec::new(),
                next_port: first_port,
            }),
            listen_lock: Mutex::new(()),
            jobs: Mutex::new(JobQueue {
                jobs: VecDeque::new(),
                busy: 0,
                running: true,
                stopping: false,
                #[cfg(not(loom))]
                timers: Vec::new(),
            }),
            jobs_cv: Condvar::new(),
            idle_cv: Condvar::new(),
            #[cfg(not(loom))]
            ids: std::sync::Mutex::new(std::collections::HashMap::new()),
        });
        let s2 = shared.clone();
        let worker = sync::spawn(format!("{name}-worker"), move || worker_main(s2))
            .map_err(|e| CmError::Worker(e.to_string()))?;
        Ok(RdmaCm {
            shared,
            worker: Some(worker),
        })
    }

    /// Register a device (cma.c's `cma_add_one`): start its iWARP CM instance, hand it
    /// its [`DeviceNotifier`] ([`CmDevice::attached`]), and make every wildcard
    /// listener listen on it too.
    ///
    /// # Errors
    /// [`CmError::DuplicateDevice`] if a registered device has the same name;
    /// [`CmError::Iw`] if its iWARP CM cannot start.
    pub fn add_device(&self, dev: std::sync::Arc<D>) -> Result<(), CmError> {
        let name = dev.name().to_string();
        let _l = lock(&self.shared.listen_lock);
        if lock(&self.shared.reg)
            .devices
            .iter()
            .any(|d| d.name == name)
        {
            return Err(CmError::DuplicateDevice(name));
        }
        let iw = iw_cm::IwCm::new(dev.provider(), dev.iw_cm_config())?;
        let entry = Arc::new(DevEntry {
            serial: self.shared.next_serial(),
            name: name.clone(),
            dev: Mutex::new(Some(dev.clone())),
            iw: Mutex::new(Some(iw)),
            st: Mutex::new(DevSt {
                removing: false,
                processed: false,
                release_queued: false,
                released: false,
                ids: Vec::new(),
            }),
            cv: Condvar::new(),
        });
        let listeners = {
            let mut reg = lock(&self.shared.reg);
            reg.devices.push(entry.clone());
            reg.listen_any.clone()
        };
        bump(&self.shared.counters.devices_held);
        bump(&self.shared.counters.devices_added);
        tracing::info!(device = %name, "device added");
        dev.attached(DeviceNotifier::new(std::sync::Arc::new(Notifier {
            shared: self.shared.clone(),
            entry: entry.clone(),
        })));
        for l in &listeners {
            IdInner::create_internal(l, &entry);
        }
        Ok(())
    }

    /// Remove a device now, on the calling thread (cma.c's `cma_remove_one`): it stops
    /// being chosen by routes and listens; its wildcard internal listeners are
    /// destroyed silently; every other id bound to it, under its callback
    /// serialization, gets exactly one `DeviceRemoval` unless its destroy was already
    /// asked (its QP first moved to ERROR). `DeviceRemoval` callbacks run on this
    /// thread. Returns once every id was handled; the device itself is released when
    /// the last id bound to it is destroyed: see [`Removal`]. A device that reports its
    /// own removal uses [`DeviceNotifier::removed`] instead (same steps, on the
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
        let entry = lock(&self.shared.reg)
            .devices
            .iter()
            .find(|d| d.name == name)
            .cloned()
            .ok_or_else(|| CmError::NoSuchDevice(name.to_string()))?;
        Shared::process_removal(&self.shared, &entry);
        Ok(Removal { entry })
    }

    /// The names of the registered devices (not being removed), in the order added.
    pub fn devices(&self) -> Vec<String> {
        lock(&self.shared.reg)
            .devices
            .iter()
            .map(|d| d.name.clone())
            .collect()
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
        let mut q = lock(&self.shared.jobs);
        while !(q.jobs.is_empty() && q.busy == 0) && q.running {
            q = wait(&self.shared.idle_cv, q);
        }
        Ok(())
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
        let devices = lock(&self.shared.reg).devices.clone();
        for d in &devices {
            let st = lock(&d.st);
            let _ = writeln!(
                out,
                "  device {} #{}: removing={} ids={}",
                d.name,
                d.serial,
                st.removing,
                st.ids.len()
            );
        }
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
        lock(&self.shared.jobs).stopping = true;
        self.shared.jobs_cv.notify_all();
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
    entry: Arc<DevEntry<D>>,
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
        lock(&self.entry.st).ids.len()
    }

    /// Whether the device was released.
    pub fn is_released(&self) -> bool {
        lock(&self.entry.st).released
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
        let mut st = lock(&self.entry.st);
        while !st.released {
            st = wait(&self.entry.cv, st);
        }
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
        let deadline = std::time::Instant::now() + timeout;
        let mut st = lock(&self.entry.st);
        while !st.released {
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(CmError::Timeout {
                    what: "the device's release",
                });
            }
            st = sync::wait_timeout(&self.entry.cv, st, deadline - now);
        }
        Ok(())
    }
}
