//! The soft iWARP device as an rdma-cm [`CmDevice`]: [`SoftDevice`], and [`SoftRdmaCm`],
//! the RDMA CM over soft devices.
//!
//! | [`CmDevice`] | the soft device | kernel counterpart |
//! |---|---|---|
//! | `name` | [`Device::name`] | `ib_device.name` (`siw0`) |
//! | `addresses`, `gateway` | the interface it was opened with ([`Device::interface`]): one IPv4 address and prefix, its gateway; a host-TCP device: its interface's IPv4 addresses as they are now; nothing once the device ended | the netdev's `in_device` / FIB |
//! | `route_source` | a host-TCP device: the kernel's route (`host::netdev::route_source`); others `None` | `ip_route_output_key` |
//! | `provider` | one [`SoftProvider`] per `SoftDevice` (its provider thread `iwp-<name>`) | siw's `iw_cm_verbs` |
//! | `resolve_neighbor` | [`Device::resolve_neighbor`]: ARP through the device's own stack (Request at once, then every second, until the timeout) | `rdma_resolve_ip` -> `neigh_event_send` |
//! | `create_qp` | [`Device::create_qp`] (or [`Device::create_qp_with_srq`] for a [`CmQpInit`] naming an SRQ), moved to Init (receives can be posted before connect/accept), wrapped in an `Arc` ([`SoftQp`]) | `ib_create_qp` + `cma_init_conn_qp` |
//! | `qp_to_error` | [`Qp::modify_state`](crate::Qp::modify_state)`(Error)`: every outstanding WR completes flushed, a connection is closed abortively | `ib_modify_qp(IB_QPS_ERR)` |
//! | `destroy_qp` | [`Qp::destroy`](crate::Qp::destroy) if the CM held the last handle, else to Error and drop ours (the QP goes when the last handle does) | `ib_destroy_qp` |
//! | `attached` | removal when the device ends (TAP deleted, fd error, memory link removed: [`SoftProvider::on_device_end`], before the connections' ends are reported, which then reach no id), and when its link goes down (configurable) | `cma_remove_one` from `ib_unregister_device`; `siw_netdev_event` |
//!
//! Address changes are not pushed to the CM: a smoltcp device's address is fixed when
//! it is opened, and the CM reads a host-TCP device's addresses at every resolution.
//!
//! ```
//! use std::net::Ipv4Addr;
//! use std::sync::Arc;
//! use softiwarp::cm::rdmacm::{SoftDevice, SoftRdmaCm};
//! use rdma_cm::RdmaCmConfig;
//! use softiwarp::{Device, DeviceConfig, LinkConfig};
//! use softiwarp::link::{MemoryConfig, MemoryLink};
//!
//! let (a, _b) = MemoryLink::pair(MemoryConfig::default())?;
//! let dev = Device::open(DeviceConfig::new("siw0", LinkConfig::memory(a), Ipv4Addr::new(10, 7, 0, 1), 24))?;
//! let cm = SoftRdmaCm::new(RdmaCmConfig::default())?;
//! cm.add_device(SoftDevice::new(Arc::new(dev))?)?;
//! assert_eq!(cm.devices(), ["siw0"]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdma_cm::{
    CmDevice, DeviceNotifier, Ipv4Subnet, NeighborDone, NeighborRequest, RdmaCm, ResolveError,
};
use verbs::{QpState, VerbsError};

use crate::cm::iwcm::{SoftProvider, SoftQp};
use crate::transport::neighbor::NeighborError;
use crate::{Device, DeviceError, DeviceEvent, Pd, QpInitAttr, Srq};

/// What [`SoftDevice`]'s `create_qp` takes (`rdma_create_qp(3)`'s `struct
/// ibv_qp_init_attr`): the QP's attributes and, for a QP that takes its receive WRs
/// from a shared receive queue, the SRQ (`init_attr.srq`). A [`QpInitAttr`] converts
/// into one with no SRQ, so `CmIdRef::create_qp(pd, attr)` takes either.
#[derive(Debug, Clone, Copy)]
pub struct CmQpInit<'a> {
    /// CQs, capabilities, `sq_sig_all`.
    pub attr: QpInitAttr<'a>,
    /// The SRQ, if any ([`Device::create_qp_with_srq`]).
    pub srq: Option<&'a Srq>,
}

impl<'a> From<QpInitAttr<'a>> for CmQpInit<'a> {
    fn from(attr: QpInitAttr<'a>) -> Self {
        CmQpInit { attr, srq: None }
    }
}

/// The RDMA CM over soft iWARP devices.
pub type SoftRdmaCm = RdmaCm<SoftDevice>;

/// How often the link watcher looks at its stop flag while no device event comes.
const WATCH_TICK: Duration = Duration::from_millis(100);

/// Options of a [`SoftDevice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftDeviceConfig {
    /// Report the device's removal when its link goes down (`ip link set down`, no
    /// carrier, a memory link set down), not only when it is gone. Default `true`
    /// (design.md section 5: "the TAP disappears or the link fails"). The device stays
    /// removed from the CM if the link comes back: add a new `SoftDevice` over it.
    ///
    /// With it, a watcher thread (`siwcm-<name>`) takes the device's events
    /// ([`Device::next_event`]): do not read them elsewhere.
    pub remove_on_link_down: bool,
}

impl Default for SoftDeviceConfig {
    fn default() -> Self {
        SoftDeviceConfig {
            remove_on_link_down: true,
        }
    }
}

type NotifierSlot = Arc<Mutex<Option<DeviceNotifier<SoftDevice>>>>;

/// A soft iWARP device registered with an RDMA CM: a [`Device`] and its
/// [`SoftProvider`]. See the [module docs](self) for how each [`CmDevice`] call maps.
///
/// One `SoftDevice` belongs to one [`SoftRdmaCm`] at a time (its removal hooks report
/// to the CM that added it last).
pub struct SoftDevice {
    device: Arc<Device>,
    provider: Arc<SoftProvider>,
    config: SoftDeviceConfig,
    /// The CM's notifier while registered (cleared on release: no device -> CM cycle).
    notifier: NotifierSlot,
    /// Tells the current link watcher to stop (a new flag per registration).
    stop: Mutex<Arc<AtomicBool>>,
}

impl std::fmt::Debug for SoftDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftDevice")
            .field("name", &self.device.name())
            .field("address", &self.device.address())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SoftDevice {
    /// A CM device over `device`, with the default [`SoftDeviceConfig`]. Starts the
    /// device's [`SoftProvider`] (its provider thread).
    ///
    /// # Errors
    /// [`DeviceError::Thread`] if the provider thread cannot be started.
    pub fn new(device: Arc<Device>) -> Result<Arc<SoftDevice>, DeviceError> {
        SoftDevice::with_config(device, SoftDeviceConfig::default())
    }

    /// [`SoftDevice::new`] with `config`.
    ///
    /// # Errors
    /// As [`SoftDevice::new`].
    pub fn with_config(
        device: Arc<Device>,
        config: SoftDeviceConfig,
    ) -> Result<Arc<SoftDevice>, DeviceError> {
        let provider = Arc::new(SoftProvider::new(device.clone())?);
        Ok(Arc::new(SoftDevice {
            device,
            provider,
            config,
            notifier: Arc::new(Mutex::new(None)),
            stop: Mutex::new(Arc::new(AtomicBool::new(true))),
        }))
    }

    /// The soft device.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The device's iWARP provider (its counters: [`SoftProvider::stats`]).
    pub fn provider(&self) -> &Arc<SoftProvider> {
        &self.provider
    }

    /// The options it was made with.
    pub fn config(&self) -> SoftDeviceConfig {
        self.config
    }

    fn report_removal(slot: &NotifierSlot, why: &str) {
        let notifier = lock(slot).clone();
        if let Some(n) = notifier {
            tracing::info!(device = n.device_name(), why, "soft device removal");
            n.removed();
        }
    }

    /// The link watcher: device events until the device ends or we are told to stop;
    /// a link down reports removal.
    fn spawn_watcher(&self) {
        let stop = Arc::new(AtomicBool::new(false));
        let old = std::mem::replace(&mut *lock(&self.stop), stop.clone());
        old.store(true, Ordering::Release);
        let (device, slot) = (self.device.clone(), self.notifier.clone());
        let name: String = format!("siwcm-{}", device.name())
            .chars()
            .take(15)
            .collect();
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            while !stop.load(Ordering::Acquire) {
                match device.next_event(WATCH_TICK) {
                    Some(DeviceEvent::LinkDown(reason)) => {
                        tracing::debug!(device = device.name(), ?reason, "link down");
                        SoftDevice::report_removal(&slot, "link down");
                    }
                    Some(_) => {}
                    None if device.ended().is_some() => break,
                    None => {}
                }
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(device = self.device.name(), error = %e,
                "no link watcher thread: link down will not remove the device");
        }
    }
}

impl Drop for SoftDevice {
    fn drop(&mut self) {
        lock(&self.stop).store(true, Ordering::Release);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // No critical section here can leave its data inconsistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn resolve_error(e: NeighborError) -> ResolveError {
    match e {
        NeighborError::TimedOut => ResolveError::TimedOut,
        NeighborError::NotOnLink(_) => ResolveError::HostUnreachable,
        NeighborError::DeviceGone => ResolveError::DeviceGone,
    }
}

impl CmDevice for SoftDevice {
    type Provider = SoftProvider;
    type Pd = Pd;
    type QpInitAttr<'a> = CmQpInit<'a>;

    fn name(&self) -> &str {
        self.device.name()
    }

    /// The device's addresses and prefixes ([`Device::addresses`]: the one it was opened
    /// with, or a host-TCP device's interface addresses as they are now); none once it
    /// ended (it is then never chosen).
    fn addresses(&self) -> Vec<Ipv4Subnet> {
        if self.device.ended().is_some() {
            return Vec::new();
        }
        self.device.addresses()
    }

    /// A host-TCP device asks the kernel in its namespace ([`Device::route_source`]);
    /// others have their own stack (`None`).
    fn route_source(&self, dst: Ipv4Addr) -> Option<Ipv4Addr> {
        self.device.route_source(dst)
    }

    fn gateway(&self) -> Option<Ipv4Addr> {
        self.device.interface().gateway
    }

    fn provider(&self) -> Arc<SoftProvider> {
        self.provider.clone()
    }

    /// ARP for `request.next_hop` through the device's stack; `done` is completed on
    /// the engine thread (it only enqueues).
    fn resolve_neighbor(&self, request: NeighborRequest, done: NeighborDone<Self>) {
        self.device
            .resolve_neighbor(request.next_hop, request.timeout, move |r| {
                done.complete(r.map(Some).map_err(resolve_error));
            });
    }

    /// The QP is moved to Init before it is returned, as `rdma_create_qp` does
    /// (cma.c `cma_init_conn_qp`, librdmacm `ucma_init_conn_qp`): receives can be
    /// posted before `connect` / `accept`, so none is missing when the peer's first
    /// Send arrives.
    fn create_qp(&self, pd: &Pd, attr: CmQpInit<'_>) -> Result<SoftQp, VerbsError> {
        let qp = match attr.srq {
            Some(srq) => self.device.create_qp_with_srq(pd, attr.attr, srq)?,
            None => self.device.create_qp(pd, attr.attr)?,
        };
        if let Err(e) = qp.modify_state(QpState::Init) {
            let _ = qp.destroy();
            return Err(e);
        }
        Ok(Arc::new(qp))
    }

    fn qp_to_error(&self, qp: &SoftQp) {
        // A QP already destroyed, or of a device already gone (the engine flushed it
        // when it stopped), has nothing left to flush.
        if let Err(e) = qp.modify_state(QpState::Error) {
            tracing::debug!(qpn = qp.qp_num(), error = %e, "QP to ERROR");
        }
    }

    fn destroy_qp(&self, qp: SoftQp) {
        let result = match Arc::try_unwrap(qp) {
            Ok(qp) => qp.destroy(),
            Err(shared) => {
                // Another handle (the user's, or the provider's while connected) keeps
                // the QP: flush it now; it is destroyed when the last handle goes.
                let r = match shared.modify_state(QpState::Error) {
                    Err(VerbsError::InvalidHandle { .. } | VerbsError::DeviceGone) => Ok(()),
                    r => r,
                };
                drop(shared);
                r
            }
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "destroy QP");
        }
    }

    fn attached(&self, notifier: DeviceNotifier<Self>) {
        *lock(&self.notifier) = Some(notifier);
        let slot = self.notifier.clone();
        self.provider.on_device_end(move |end| {
            tracing::debug!(?end, "soft device ended");
            SoftDevice::report_removal(&slot, "device ended");
        });
        if self.config.remove_on_link_down {
            self.spawn_watcher();
        }
    }

    fn released(&self) {
        lock(&self.stop).store(true, Ordering::Release);
        lock(&self.notifier).take();
    }
}
