//! What the ids, the devices' handles and the worker of an RDMA CM share: the device
//! registry, the worker thread (cma.c's `cma_wq`) and its jobs and timers, port
//! reservations, wildcard listeners, the device side of removal, counters.
//!
//! # Module order
//!
//! The registry sits below `id` (the id engine) and `cm` ([`crate::RdmaCm`], the
//! public instance): it names no id type. What it does to an id — run a finished
//! address or route query, an address change, the per-id step of a device removal,
//! listen on a new device for a wildcard listener — goes through the small trait
//! [`RegId`], which the id engine implements; the registry's types are generic over it
//! (static dispatch: jobs, timers and device entries own `crate::sync::Arc`s of their
//! ids, which loom must see). cma.c keeps both in one file (`rdma_id_private` and
//! `cma_device` point at each other); the lock order of `crate::id` is unchanged:
//! `handler_lock` -> `ops` -> `st` -> (registry, device entry).

use crate::device::{CmDevice, DeviceEvents, DeviceNotifier, NeighborResult, QpOf};
use crate::error::CmError;
use crate::route::DeviceRoutes;
use crate::stats::{bump, sub, Counters, RdmaCmStats};
use crate::sync::{self, lock, wait, Arc, Condvar, Mutex};
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

/// Configuration of an [`crate::RdmaCm`].
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

// ------------------------------------------------------------------- the ids

/// What the registry and its worker do to an id: implemented by the id engine
/// (`crate::id`), which sits above this module.
pub(crate) trait RegId: Send + Sync + Sized + 'static {
    /// The device type of the ids' RDMA CM.
    type Device: CmDevice;
    /// The id's serial number.
    fn serial(&self) -> u64;
    /// Whether it is a user id (not an internal per-device listener of a wildcard
    /// listen).
    fn is_user(&self) -> bool;
    /// The first half of device removal, as soon as the device reports it: mark the
    /// id `DEVICE_REMOVAL` unless destroy was asked. Never waits.
    fn mark_device_removal(&self);
    /// An address resolution of query `gen` ended.
    fn addr_done(
        this: &Arc<Self>,
        gen: u64,
        entry: Option<Arc<DevEntry<Self>>>,
        src: Ipv4Addr,
        next_hop: Ipv4Addr,
        result: NeighborResult,
    );
    /// Deliver the route of query `gen`.
    fn route_done(this: &Arc<Self>, gen: u64);
    /// The addresses of the id's device changed.
    fn addr_change(this: &Arc<Self>);
    /// The per-id step of the removal of `entry` (cma.c's `cma_process_remove` loop
    /// body): an internal listener is destroyed silently, a user id gets
    /// `cma_remove_id_dev`.
    fn device_removed(this: &Arc<Self>, entry: &Arc<DevEntry<Self>>);
    /// Make wildcard listener `listener`'s internal listener on `entry`
    /// (`cma_listen_on_dev`).
    fn create_internal(listener: &Arc<Self>, entry: &Arc<DevEntry<Self>>) -> Result<(), CmError>;
}

/// The device type of id type `I`.
type Dev<I> = <I as RegId>::Device;
/// The iWARP provider of id type `I`'s device.
type Prov<I> = <Dev<I> as CmDevice>::Provider;

// ------------------------------------------------------------------- devices

struct DevSt<I: RegId> {
    removing: bool,
    processed: bool,
    release_queued: bool,
    released: bool,
    /// Every id bound to the device (cma.c's `cma_dev->id_list`), internal listeners
    /// included.
    ids: Vec<Arc<I>>,
}

/// A registered device (cma.c's `struct cma_device`).
pub(crate) struct DevEntry<I: RegId> {
    pub(crate) serial: u64,
    pub(crate) name: String,
    dev: Mutex<Option<std::sync::Arc<Dev<I>>>>,
    iw: Mutex<Option<iw_cm::IwCm<Prov<I>>>>,
    st: Mutex<DevSt<I>>,
    cv: Condvar,
}

impl<I: RegId> DevEntry<I> {
    /// The device, until it is released.
    pub(crate) fn device(&self) -> Option<std::sync::Arc<Dev<I>>> {
        lock(&self.dev).clone()
    }

    pub(crate) fn is_removing(&self) -> bool {
        lock(&self.st).removing
    }

    /// Create an iWARP CM id on the device's iw-cm instance (`None` once released).
    pub(crate) fn create_iw_id(
        &self,
        handler: std::sync::Arc<dyn iw_cm::EventHandler<Prov<I>>>,
    ) -> Option<iw_cm::CmId<Prov<I>>> {
        lock(&self.iw)
            .as_ref()
            .map(|cm| cm.create_id_shared(handler))
    }

    /// The user ids bound to the device now (internal listeners left out).
    pub(crate) fn user_ids(&self) -> Vec<Arc<I>> {
        lock(&self.st)
            .ids
            .iter()
            .filter(|i| i.is_user())
            .cloned()
            .collect()
    }

    /// Bind an id to the device (cma.c's `cma_attach_to_dev`); refused once removal
    /// started.
    pub(crate) fn attach(&self, id: &Arc<I>) -> Result<(), CmError> {
        let mut st = lock(&self.st);
        if st.removing {
            return Err(CmError::DeviceRemoved { op: "attach" });
        }
        st.ids.push(id.clone());
        Ok(())
    }

    /// Unbind an id (cma.c's `cma_release_dev`); the last id of a removed device lets
    /// it be released.
    pub(crate) fn detach(this: &Arc<Self>, shared: &Shared<I>, serial: u64) {
        let release = {
            let mut st = lock(&this.st);
            st.ids.retain(|i| i.serial() != serial);
            this.release_due(&mut st)
        };
        if release {
            shared.queue_release(this.clone());
        }
    }

    fn release_due(&self, st: &mut DevSt<I>) -> bool {
        if st.removing && st.processed && st.ids.is_empty() && !st.release_queued {
            st.release_queued = true;
            true
        } else {
            false
        }
    }

    pub(crate) fn qp_to_error(&self, qp: &QpOf<Dev<I>>) {
        if let Some(dev) = self.device() {
            dev.qp_to_error(qp);
        }
    }

    pub(crate) fn destroy_qp(&self, qp: QpOf<Dev<I>>) {
        match self.device() {
            Some(dev) => dev.destroy_qp(qp),
            None => drop(qp),
        }
    }

    /// Ids still bound to the device.
    pub(crate) fn ids_bound(&self) -> usize {
        lock(&self.st).ids.len()
    }

    /// Whether the device was released.
    pub(crate) fn is_released(&self) -> bool {
        lock(&self.st).released
    }

    /// Wait until the device is released (cma.c's `wait_for_completion(&cma_dev->comp)`).
    pub(crate) fn wait_released(&self) {
        let mut st = lock(&self.st);
        while !st.released {
            st = wait(&self.cv, st);
        }
    }

    /// [`DevEntry::wait_released`] for at most `timeout`; `false` if ids are still
    /// bound then.
    #[cfg(not(loom))]
    pub(crate) fn wait_released_timeout(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut st = lock(&self.st);
        while !st.released {
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            st = sync::wait_timeout(&self.cv, st, deadline - now);
        }
        true
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
pub(crate) enum Job<I: RegId> {
    /// An address resolution ended (device completion, or a route-less failure).
    AddrDone {
        id: Arc<I>,
        gen: u64,
        entry: Option<Arc<DevEntry<I>>>,
        src: Ipv4Addr,
        next_hop: Ipv4Addr,
        result: NeighborResult,
    },
    /// Deliver the route of an id.
    RouteDone { id: Arc<I>, gen: u64 },
    /// A device reported its removal.
    Remove(Arc<DevEntry<I>>),
    /// A device reported an address change.
    AddrChange(Arc<DevEntry<I>>),
    /// Release a removed device whose ids are all gone.
    Release(Arc<DevEntry<I>>),
}

#[cfg(not(loom))]
struct Timer<I: RegId> {
    deadline: std::time::Instant,
    id: Arc<I>,
    gen: u64,
}

struct JobQueue<I: RegId> {
    jobs: VecDeque<Job<I>>,
    busy: usize,
    running: bool,
    stopping: bool,
    #[cfg(not(loom))]
    timers: Vec<Timer<I>>,
}

struct PortRes {
    ip: Ipv4Addr,
    port: u16,
    owner: u64,
}

pub(crate) struct Reg<I: RegId> {
    devices: Vec<Arc<DevEntry<I>>>,
    listen_any: Vec<Arc<I>>,
    ports: Vec<PortRes>,
    next_port: u16,
}

/// What the ids, the devices' handles and the worker share.
pub(crate) struct Shared<I: RegId> {
    pub(crate) config: RdmaCmConfig,
    pub(crate) counters: std::sync::Arc<Counters>,
    next_serial: AtomicU64,
    reg: Mutex<Reg<I>>,
    /// Serializes listen on the wildcard address with device addition, so that each
    /// (wildcard listener, device) pair gets exactly one internal listener.
    listen_lock: Mutex<()>,
    jobs: Mutex<JobQueue<I>>,
    jobs_cv: Condvar,
    idle_cv: Condvar,
    #[cfg(not(loom))]
    pub(crate) ids: std::sync::Mutex<std::collections::HashMap<u64, std::sync::Weak<I>>>,
}

impl<I: RegId> Shared<I> {
    /// The shared part of a new RDMA CM (its worker not started yet).
    pub(crate) fn new(config: RdmaCmConfig) -> Self {
        let first_port = config.ephemeral_ports.0;
        Shared {
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
        }
    }

    /// Register a device ([`crate::RdmaCm::add_device`], cma.c's `cma_add_one`).
    pub(crate) fn add_device(this: &Arc<Self>, dev: std::sync::Arc<Dev<I>>) -> Result<(), CmError> {
        let name = dev.name().to_string();
        let _l = lock(&this.listen_lock);
        if lock(&this.reg).devices.iter().any(|d| d.name == name) {
            return Err(CmError::DuplicateDevice(name));
        }
        let iw = iw_cm::IwCm::new(dev.provider(), dev.iw_cm_config())?;
        let entry = Arc::new(DevEntry {
            serial: this.next_serial(),
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
            let mut reg = lock(&this.reg);
            reg.devices.push(entry.clone());
            reg.listen_any.clone()
        };
        bump(&this.counters.devices_held);
        bump(&this.counters.devices_added);
        tracing::info!(device = %name, "device added");
        dev.attached(DeviceNotifier::new(std::sync::Arc::new(Notifier {
            shared: this.clone(),
            entry: entry.clone(),
        })));
        for l in &listeners {
            // A device added later: a failed listen there only loses that device
            // (cma.c's `cma_add_one` logs it too).
            let _ = I::create_internal(l, &entry);
        }
        Ok(())
    }

    /// The registered device named `name` (not being removed).
    pub(crate) fn find_device(&self, name: &str) -> Option<Arc<DevEntry<I>>> {
        lock(&self.reg)
            .devices
            .iter()
            .find(|d| d.name == name)
            .cloned()
    }

    /// The names of the registered devices (not being removed), in the order added.
    pub(crate) fn device_names(&self) -> Vec<String> {
        lock(&self.reg)
            .devices
            .iter()
            .map(|d| d.name.clone())
            .collect()
    }

    /// Wait until the worker has nothing queued or running, or has stopped.
    pub(crate) fn wait_idle(&self) {
        let mut q = lock(&self.jobs);
        while !(q.jobs.is_empty() && q.busy == 0) && q.running {
            q = wait(&self.idle_cv, q);
        }
    }

    /// Tell the worker to stop after its queued jobs.
    pub(crate) fn stop_worker(&self) {
        lock(&self.jobs).stopping = true;
        self.jobs_cv.notify_all();
    }

    /// One line per registered device, for [`crate::RdmaCm::dump_state`].
    pub(crate) fn dump_devices(&self, out: &mut String) {
        use core::fmt::Write;
        let devices = lock(&self.reg).devices.clone();
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
    }

    pub(crate) fn breaks(&self, rule: RuleBreak) -> bool {
        self.config.rule_break == Some(rule)
    }

    pub(crate) fn next_serial(&self) -> u64 {
        self.next_serial.fetch_add(1, Relaxed) + 1
    }

    /// Queue work for the worker. Dropped (with a log line) once the worker stopped;
    /// a release is then done at once.
    pub(crate) fn push_job(&self, job: Job<I>) {
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

    pub(crate) fn queue_release(&self, entry: Arc<DevEntry<I>>) {
        self.push_job(Job::Release(entry));
    }

    #[cfg(not(loom))]
    pub(crate) fn add_timer(&self, id: &Arc<I>, gen: u64, timeout: std::time::Duration) {
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
    pub(crate) fn add_timer(&self, _id: &Arc<I>, _gen: u64, _timeout: std::time::Duration) {}

    /// Forget the resolution timeout of id `serial` (of query `gen`, or all of them):
    /// a timer holds its id.
    #[cfg(not(loom))]
    pub(crate) fn cancel_timer(&self, serial: u64, gen: Option<u64>) {
        let gone: Vec<Timer<I>> = {
            let mut q = lock(&self.jobs);
            let (gone, kept) = core::mem::take(&mut q.timers)
                .into_iter()
                .partition(|t| t.id.serial() == serial && gen.is_none_or(|g| t.gen == g));
            q.timers = kept;
            gone
        };
        drop(gone);
    }

    #[cfg(loom)]
    pub(crate) fn cancel_timer(&self, _serial: u64, _gen: Option<u64>) {}

    #[cfg(not(loom))]
    fn next_job(&self) -> Option<Job<I>> {
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
    fn next_job(&self) -> Option<Job<I>> {
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

    fn run(this: &Arc<Self>, job: Job<I>) {
        match job {
            Job::AddrDone {
                id,
                gen,
                entry,
                src,
                next_hop,
                result,
            } => I::addr_done(&id, gen, entry, src, next_hop, result),
            Job::RouteDone { id, gen } => I::route_done(&id, gen),
            Job::Remove(entry) => Shared::process_removal(this, &entry),
            Job::AddrChange(entry) => {
                let ids: Vec<_> = lock(&entry.st).ids.clone();
                for id in ids {
                    if id.is_user() {
                        I::addr_change(&id);
                    }
                }
            }
            Job::Release(entry) => entry.release(&this.counters),
        }
    }

    // ---------------------------------------------------------------- removal

    /// cma.c's `cma_process_remove`: for each id bound to the device, internal
    /// listeners are destroyed silently and user ids get `cma_remove_id_dev`
    /// ([`RegId::device_removed`]); the device is released once the last id is gone.
    /// A second call for the same device waits until the first has delivered.
    pub(crate) fn process_removal(this: &Arc<Self>, entry: &Arc<DevEntry<I>>) {
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
            I::device_removed(&id, entry);
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
    /// With `dst`, each kernel-routed device's [`DeviceRoutes::kernel_source`] for it.
    pub(crate) fn route_snapshot(
        &self,
        dst: Option<Ipv4Addr>,
    ) -> (Vec<Arc<DevEntry<I>>>, Vec<DeviceRoutes>) {
        let entries = lock(&self.reg).devices.clone();
        let routes = entries
            .iter()
            .map(|e| match e.device() {
                Some(d) => DeviceRoutes {
                    addrs: d.addresses(),
                    gateway: d.gateway(),
                    kernel_source: dst.and_then(|dst| d.route_source(dst)),
                },
                None => DeviceRoutes {
                    addrs: Vec::new(),
                    gateway: None,
                    kernel_source: None,
                },
            })
            .collect();
        (entries, routes)
    }

    /// The registered device that has address `ip`.
    pub(crate) fn device_owning(&self, ip: Ipv4Addr) -> Option<Arc<DevEntry<I>>> {
        let (entries, routes) = self.route_snapshot(None);
        crate::route::device_owning(&routes, ip).map(|i| entries[i].clone())
    }

    /// Reserve `ip:port` for id `owner` (port 0: an ephemeral one). Two reservations of
    /// a port conflict when their addresses are equal or either is the wildcard (the
    /// kernel's port space without `SO_REUSEADDR`).
    pub(crate) fn reserve_port(&self, ip: Ipv4Addr, port: u16, owner: u64) -> Result<u16, CmError> {
        let mut reg = lock(&self.reg);
        let conflict = |reg: &Reg<I>, p: u16| {
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
    /// Listens on every registered device for wildcard listener `listener`, and on
    /// every device added later. Errors: the first device whose listen failed (the
    /// caller undoes the internal listeners made so far, as cma.c's
    /// `cma_listen_on_all` does since Linux 5.11); the listener is then not kept for
    /// later devices.
    pub(crate) fn listen_any(&self, listener: &Arc<I>) -> Result<(), CmError> {
        let _l = lock(&self.listen_lock);
        let devices = {
            let mut reg = lock(&self.reg);
            reg.listen_any.push(listener.clone());
            reg.devices.clone()
        };
        for entry in &devices {
            if let Err(e) = I::create_internal(listener, entry) {
                let serial = listener.serial();
                lock(&self.reg).listen_any.retain(|l| l.serial() != serial);
                return Err(e);
            }
        }
        Ok(())
    }

    pub(crate) fn remove_listen_any(&self, serial: u64) {
        let gone: Vec<_> = {
            let mut reg = lock(&self.reg);
            let (gone, kept) = core::mem::take(&mut reg.listen_any)
                .into_iter()
                .partition(|l| l.serial() == serial);
            reg.listen_any = kept;
            gone
        };
        drop(gone);
    }

    pub(crate) fn stats(&self) -> RdmaCmStats {
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
struct Notifier<I: RegId> {
    shared: Arc<Shared<I>>,
    entry: Arc<DevEntry<I>>,
}

impl<I: RegId> DeviceEvents for Notifier<I> {
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

pub(crate) fn worker_main<I: RegId>(shared: Arc<Shared<I>>) {
    sync::set_on_worker(true);
    while let Some(job) = shared.next_job() {
        Shared::run(&shared, job);
        shared.job_done();
    }
    sync::set_on_worker(false);
}
