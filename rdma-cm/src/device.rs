//! The device abstraction: what a device (the soft iWARP device, or a hardware
//! backend) implements so that the RDMA CM can route over it, resolve neighbours through
//! it, create its iWARP CM instance and QPs, and learn of its removal.
//!
//! See the crate documentation for how `softiwarp` implements it.

use crate::route::Ipv4Subnet;
use core::fmt;
use core::marker::PhantomData;
use std::net::Ipv4Addr;
use std::time::Duration;

/// The QP handle type of a device: its iWARP provider's QP (`iw_cm::Provider::Qp`).
pub type QpOf<D> = <<D as CmDevice>::Provider as iw_cm::Provider>::Qp;

/// A device the RDMA CM can use (the kernel's `ib_device` as cma.c sees it, plus the
/// netdev facts `rdma_resolve_addr` gets from the IP stack).
///
/// Every method is called from a user thread or the RDMA CM's worker, never while the
/// CM holds a lock of its own, and never from the device's engine thread. None of them
/// may call back into the RDMA CM synchronously except through the handles it is given
/// ([`NeighborDone`], [`DeviceNotifier`]), which only enqueue and are safe from any
/// thread, including the engine and from inside these methods.
pub trait CmDevice: Send + Sync + Sized + 'static {
    /// The device's iWARP provider (`iw_cm_verbs`): the RDMA CM creates one
    /// [`iw_cm::IwCm`] over it per device and issues every connection call through it.
    type Provider: iw_cm::Provider;
    /// The device's protection domain type, for [`CmDevice::create_qp`].
    type Pd: ?Sized;
    /// The device's QP creation attributes (`ibv_qp_init_attr`).
    type QpInitAttr<'a>;

    /// The device's name (unique in a registry; e.g. `siw0`).
    fn name(&self) -> &str;

    /// The device's IPv4 addresses with their prefixes, for route selection and
    /// `bind_addr`. Read at every resolution (a device may change them; report it with
    /// [`DeviceNotifier::address_changed`]).
    fn addresses(&self) -> Vec<Ipv4Subnet>;

    /// The device's default gateway, if any.
    fn gateway(&self) -> Option<Ipv4Addr> {
        None
    }

    /// The source address the host kernel's routing table picks for `dst`, for a device
    /// whose connections are kernel TCP sockets on a host interface (a host-TCP soft
    /// device, as Linux siw on its netdev: `rdma_resolve_ip` -> `ip_route_output_key`);
    /// `None` (the default) for a device with its own IP stack. When one is given and a
    /// device owns that address, that device carries the route ([`crate::route`], rule
    /// 3).
    fn route_source(&self, dst: Ipv4Addr) -> Option<Ipv4Addr> {
        let _ = dst;
        None
    }

    /// The device's iWARP provider (called once, by [`crate::RdmaCm::add_device`]).
    fn provider(&self) -> std::sync::Arc<Self::Provider>;

    /// The configuration of the device's iWARP CM instance. The default names it after
    /// the device and keeps iw-cm's defaults.
    fn iw_cm_config(&self) -> iw_cm::CmConfig {
        iw_cm::CmConfig {
            name: format!("iwcm-{}", self.name()),
            ..iw_cm::CmConfig::default()
        }
    }

    /// Resolve the hardware address of `request.next_hop` through this device (ARP),
    /// giving up after `request.timeout`; report the outcome through `done`, now or
    /// later, from any thread. Dropping `done` without completing it reports
    /// [`ResolveError::Dropped`]. A device whose stack resolves neighbours by itself on
    /// first use may complete at once with `Ok(None)`.
    ///
    /// This mirrors `rdma_resolve_ip`'s completion callback: the RDMA CM delivers
    /// `AddrResolved` / `AddrError` from its own worker, never from inside this call.
    fn resolve_neighbor(&self, request: NeighborRequest, done: NeighborDone<Self>);

    /// Create a QP on the device (`rdma_create_qp` -> `ib_create_qp`). The handle is
    /// the provider's `Qp` (a cheap clone, e.g. an `Arc` of the device's QP): the id
    /// and the iWARP CM keep clones.
    ///
    /// # Errors
    /// The device's [`verbs::VerbsError`].
    fn create_qp(
        &self,
        pd: &Self::Pd,
        attr: Self::QpInitAttr<'_>,
    ) -> Result<QpOf<Self>, verbs::VerbsError>;

    /// Move a QP to ERROR, flushing its outstanding work requests (design.md section 5,
    /// rdma-cm rule 4). Called for the QPs of the device's ids when the device is
    /// removed. Must be safe at any time, including after the device is gone.
    fn qp_to_error(&self, qp: &QpOf<Self>);

    /// Destroy a QP created by [`CmDevice::create_qp`] (`rdma_destroy_qp`). Must be
    /// safe at any time, including after the device is gone. The default drops the
    /// handle.
    fn destroy_qp(&self, qp: QpOf<Self>) {
        drop(qp);
    }

    /// The device was registered: `notifier` is how it reports its own removal (link
    /// gone) and address changes. The default ignores it (removal then only happens
    /// through [`crate::RdmaCm::remove_device`]).
    fn attached(&self, notifier: DeviceNotifier<Self>) {
        drop(notifier);
    }

    /// The registry let go of the device: every id that was bound to it is gone and
    /// its iWARP CM instance is shut down (cma.c's `cma_process_remove` returning).
    fn released(&self) {}
}

/// What [`CmDevice::resolve_neighbor`] is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NeighborRequest {
    /// The final destination.
    pub dst: Ipv4Addr,
    /// The source address chosen on this device.
    pub src: Ipv4Addr,
    /// The address whose hardware address is wanted: the destination or the gateway.
    pub next_hop: Ipv4Addr,
    /// How long to try.
    pub timeout: Duration,
}

/// Why a neighbour could not be resolved (the status of `AddrError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// No answer in time (`-ETIMEDOUT`).
    #[error("neighbour resolution timed out")]
    TimedOut,
    /// The neighbour is known to be unreachable (`-EHOSTUNREACH`).
    #[error("host unreachable")]
    HostUnreachable,
    /// No device reaches the destination (`-ENETUNREACH`).
    #[error("network unreachable")]
    NetUnreachable,
    /// The device is gone (`-ENODEV`).
    #[error("device gone")]
    DeviceGone,
    /// The device dropped the completion without reporting (`-EIO`).
    #[error("the device dropped the resolution without completing it")]
    Dropped,
    /// Anything else, described (`-EIO`).
    #[error("{0}")]
    Other(String),
}

impl ResolveError {
    /// The (positive) errno; the event's status is its negation.
    pub fn errno(&self) -> i32 {
        match self {
            ResolveError::TimedOut => 110,
            ResolveError::HostUnreachable => 113,
            ResolveError::NetUnreachable => 101,
            ResolveError::DeviceGone => 19,
            ResolveError::Dropped | ResolveError::Other(_) => 5,
        }
    }
}

/// The result of a neighbour resolution: the hardware address if the device knows it.
pub type NeighborResult = Result<Option<[u8; 6]>, ResolveError>;

/// The completion handle of one [`CmDevice::resolve_neighbor`] call. Completing it only
/// queues work for the RDMA CM's worker: safe from any thread, including the device's
/// engine and from inside `resolve_neighbor`. It holds a reference on the id being
/// resolved: complete or drop it when the resolution ends (a completion after the id
/// was destroyed, or after the CM's own timeout fired, is ignored).
pub struct NeighborDone<D: CmDevice> {
    /// Queues the outcome for the worker (made by `resolve_addr`); taken when sent.
    send: Option<NeighborSend>,
    id: u64,
    device: String,
    next_hop: Ipv4Addr,
    _device: PhantomData<fn() -> D>,
}

/// What completing a [`NeighborDone`] does: queue the outcome for the worker.
type NeighborSend = Box<dyn FnOnce(NeighborResult) + Send + Sync>;

impl<D: CmDevice> NeighborDone<D> {
    /// The completion of id `id`'s resolution of `next_hop` on `device`; `send` queues
    /// the outcome (called once: by [`Self::complete`], or with
    /// [`ResolveError::Dropped`] when dropped).
    pub(crate) fn new(
        id: u64,
        device: String,
        next_hop: Ipv4Addr,
        send: impl FnOnce(NeighborResult) + Send + Sync + 'static,
    ) -> NeighborDone<D> {
        NeighborDone {
            send: Some(Box::new(send)),
            id,
            device,
            next_hop,
            _device: PhantomData,
        }
    }

    /// Report the outcome.
    pub fn complete(mut self, result: NeighborResult) {
        self.send(result);
    }

    fn send(&mut self, result: NeighborResult) {
        if let Some(send) = self.send.take() {
            send(result);
        }
    }
}

impl<D: CmDevice> Drop for NeighborDone<D> {
    fn drop(&mut self) {
        self.send(Err(ResolveError::Dropped));
    }
}

impl<D: CmDevice> fmt::Debug for NeighborDone<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NeighborDone")
            .field("id", &self.send.as_ref().map(|_| self.id))
            .field("device", &self.device)
            .field("next_hop", &self.next_hop)
            .finish()
    }
}

/// How a registered device tells the RDMA CM about itself (given to it by
/// [`CmDevice::attached`]). Every call only queues work for the RDMA CM's worker: safe
/// from the device's engine thread, which must never wait for user code.
pub struct DeviceNotifier<D: CmDevice> {
    events: std::sync::Arc<dyn DeviceEvents>,
    _device: PhantomData<fn() -> D>,
}

/// What a [`DeviceNotifier`] reaches: the device's registry entry (implemented by the
/// registry; every method only queues work for the worker).
pub(crate) trait DeviceEvents: Send + Sync {
    /// See [`DeviceNotifier::removed`].
    fn removed(&self);
    /// See [`DeviceNotifier::address_changed`].
    fn address_changed(&self);
    /// The device's name.
    fn device_name(&self) -> &str;
}

impl<D: CmDevice> Clone for DeviceNotifier<D> {
    fn clone(&self) -> Self {
        DeviceNotifier {
            events: self.events.clone(),
            _device: PhantomData,
        }
    }
}

impl<D: CmDevice> fmt::Debug for DeviceNotifier<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceNotifier")
            .field("device", &self.device_name())
            .finish()
    }
}

impl<D: CmDevice> DeviceNotifier<D> {
    /// The notifier of a registered device.
    pub(crate) fn new(events: std::sync::Arc<dyn DeviceEvents>) -> DeviceNotifier<D> {
        DeviceNotifier {
            events,
            _device: PhantomData,
        }
    }

    /// The device is going away (its link is gone): start device removal on the RDMA
    /// CM's worker (cma.c's `cma_remove_one` -> `cma_process_remove`). Idempotent.
    ///
    /// Before it returns, every user id bound to the device whose destroy was not asked
    /// is marked `DEVICE_REMOVAL` (a brief lock per id, no waiting): from then on no
    /// other event reaches it, so connection ends that the device reports after this
    /// call (its QPs failing, TCP gone) are dropped and the id's next event is its one
    /// `DeviceRemoval`. This is the kernel's order: `ib_unregister_device` runs
    /// `cma_remove_one` before the driver tears its connections down.
    pub fn removed(&self) {
        self.events.removed();
    }

    /// The device's addresses changed: deliver `AddrChange` to every id bound to it
    /// (cma.c's `cma_netdev_callback`).
    pub fn address_changed(&self) {
        self.events.address_changed();
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        self.events.device_name()
    }
}
