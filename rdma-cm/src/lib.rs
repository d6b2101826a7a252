//! The RDMA connection manager of softiwarp: the librdmacm / kernel `rdma_cm` API
//! (`drivers/infiniband/core/cma.c`) over [`iw_cm`], for any device that implements
//! [`CmDevice`]. It knows no wire format and names no device: the soft iWARP device
//! implements [`CmDevice`] in its own crate (`softiwarp::cm::rdmacm`, as siw's `siw_cm.c`
//! is the driver's own).
//!
//! # Room
//!
//! rdma-cm owns the RDMA CM core, device-agnostic: rdma_cm ids and their state machine
//! ([`machine`]: the only writer of an id's state), callback serialization and event
//! delivery (callbacks and event channels), destroy, the device registry and its worker
//! (address and route resolution, wildcard listens, device removal), counters. It
//! touches `iw-cm` (each device's iWARP CM instance carries the connections) and
//! `verbs` (QP handles, verbs errors), nothing else of the workspace; a device
//! implements [`CmDevice`] (and its [`iw_cm::Provider`]) in its own crate. It knows no
//! wire format, opens no socket and runs no device thread.
//!
//! Modules: [`machine`] ([`IdState`] and its transitions), `id` (the id engine: locks,
//! delivery, destroy, and what a callback gets: [`CmEvent`], [`Handler`]; an event
//! channel's queue is reached through a trait object, so `id` does not name `channel`;
//! `id/calls.rs` the public [`CmIdRef`]/[`CmId`] calls,
//! `id/handlers.rs` the address, route, iWARP and connect-request paths,
//! `id/removal.rs` the per-id device removal), `cm` ([`RdmaCm`], [`Removal`]: the
//! public instance), `registry` (what the ids share: devices, worker, ports, timers,
//! [`RdmaCmConfig`]), `stats` ([`RdmaCmStats`]), `device` (the [`CmDevice`] trait and
//! its plain types), `channel`, `event` (event kinds and the iWARP mapping),
//! [`route`], `sync` (std or loom primitives).
//!
//! No import cycle between modules (`scripts/modgraph.py --check rdma-cm/src`); from
//! the top: `cm` > `channel` > `id` (and its files) > `registry` > `device`, `error`,
//! `machine`, `event`, `route`, `stats`, `sync`. An id holds its registry and device
//! entry, and the registry holds its ids and runs their work (cma.c's
//! `rdma_id_private` and `cma_device` lists point at each other): the registry reaches
//! an id only through the small trait `registry::RegId`, which `id` implements, and an
//! id reaches its event channel only through the trait `id::ChannelQueue`, which
//! `channel` implements.
//!
//! | item | what | cma.c / librdmacm counterpart |
//! |---|---|---|
//! | [`RdmaCm`] | the registry of devices, the ids, the worker thread, counters ([`RdmaCm::stats`]) | `cma_wq`, `dev_list`, `ib_client` add/remove |
//! | [`CmDevice`] | what a device implements: name, IPv4 addresses and gateway, neighbour resolution, its iWARP provider, QP creation, QP to ERROR, removal notification | `ib_device` + netdev + `rdma_resolve_ip` |
//! | [`CmId`], [`CmIdRef`] | an id and its calls: `bind_addr`, `resolve_addr`, `resolve_route`, `create_qp`, `connect`, `listen`, `accept`, `reject`, `disconnect`, `destroy`, addresses | `struct rdma_cm_id`, `rdma_*` |
//! | [`Handler`], [`CmEvent`], [`EventKind`], [`Disposition`] | callback mode: the callback, the event, Keep/Destroy | `rdma_cm_event_handler` and its return value |
//! | [`EventChannel`], [`ChannelEvent`], [`EventStream`] | channel mode: blocking `get_event` + ack, or an async `Stream` | `rdma_event_channel`, `rdma_get_cm_event`, `rdma_ack_cm_event` |
//! | [`machine`] | the id state machine: `(state, input) -> Result<state, Refused>` | `cma_comp_exch` and the state checks of every `rdma_*` |
//! | [`route`] | sans-IO route selection | `addr4_resolve` |
//!
//! # The rules (design.md section 5, rdma-cm) and where they are kept
//!
//! 1. **All callbacks on one id are serialized**: each id has a handler lock (cma.c's
//!    `handler_mutex`), held while one of its events is committed and delivered
//!    (called back, or queued on its channel), on every path: address and route
//!    completion, iWARP events (`cma_iw_handler`), connection requests (the
//!    listener's lock, then the new id's, taken before the new id is visible to
//!    anyone), device removal, address change.
//! 2. **Destroy**: [`CmId::destroy`] marks the id DESTROYING, then waits for a callback
//!    in progress on it (takes and releases its handler lock), then tears it down; a
//!    callback returning [`Disposition::Destroy`] destroys its id as it returns. Either
//!    way no callback runs afterwards. Destroying an id from inside its own callback
//!    would wait for itself: it is refused with [`CmError::DestroyInOwnCallback`]
//!    (dropping the [`CmId`] there takes the return-destroy path instead). Destroying
//!    an id while the calling thread holds an un-acked channel event of it — where
//!    librdmacm's `rdma_destroy_id` hangs forever — is refused with
//!    [`CmError::UnackedEvents`].
//! 3. **Device removal** ([`RdmaCm::remove_device`], or the device's own
//!    [`DeviceNotifier::removed`]): the device stops being chosen; for each id bound
//!    to it — unless destroy was already asked (DESTROYING): mark DEVICE_REMOVAL, move
//!    its QP to ERROR ([`CmDevice::qp_to_error`]), take its handler lock (wait for a
//!    callback in progress), and if it was not destroyed meanwhile deliver exactly one
//!    `DeviceRemoval` (a [`Disposition::Destroy`] return destroys it). Internal
//!    per-device listeners of a wildcard listen are destroyed silently; the user's
//!    listener keeps listening on the other devices. The device is released
//!    ([`Removal`], [`RdmaCmStats::devices_held`]) only when every id bound to it is
//!    gone.
//! 4. **QP teardown** is the device's: [`CmDevice::qp_to_error`] flushes, and
//!    [`CmDevice::destroy_qp`] must be safe at any time.
//!
//! The kernel history: Sean Hefty's 2007 answer (the seed of this crate) explains why
//! `cma_remove_id_dev` must not deliver `DEVICE_REMOVAL` to an id whose callback just
//! returned non-zero: "once the user has returned a non-zero value no further
//! callbacks can occur. (Otherwise the user wouldn't know when it was safe to
//! deallocate their connection context.)" That is `tests/loom_removal_vs_return.rs`.
//!
//! # Threads
//!
//! Callbacks run on the RDMA CM's worker (address, route, address change, removal
//! reported by a device), on the device's iWARP CM worker (connection events,
//! connection requests), or on the thread calling [`RdmaCm::remove_device`]. Never on
//! a device's engine thread: everything a device calls ([`NeighborDone::complete`],
//! [`DeviceNotifier`]) only enqueues, and every [`CmDevice`] method is called outside
//! the CM's locks.
//!
//! # The soft device
//!
//! `softiwarp::cm::rdmacm::SoftDevice` is the soft iWARP device as a [`CmDevice`]: its
//! address and gateway, ARP through its own stack, QPs through its verbs API, and its
//! removal reported when the device ends or its link goes down;
//! `softiwarp::cm::rdmacm::SoftRdmaCm` is `RdmaCm<SoftDevice>`.
//! `softiwarp/examples/rdma_write_send.rs` is a complete client and server.
//!
//! # Example (callback mode, with a device that has no connections)
//!
//! ```
//! use rdma_cm::*;
//! use std::sync::{Arc, Mutex, mpsc};
//! use std::time::Duration;
//! # mod nic {
//! #   use std::net::SocketAddr;
//! #   pub struct Nic;
//! #   impl iw_cm::Provider for Nic {
//! #     type Qp = u32; type Conn = u32; type Listener = ();
//! #     fn connect(&self, _: iw_cm::EventSink<Self>, _: iw_cm::ConnectArgs<'_, u32>) -> Result<u32, iw_cm::ProviderError> { Ok(1) }
//! #     fn accept(&self, _: iw_cm::EventSink<Self>, _: &u32, _: iw_cm::AcceptArgs<'_, u32>) -> Result<(), iw_cm::ProviderError> { Ok(()) }
//! #     fn reject(&self, _: &u32, _: &[u8]) -> Result<(), iw_cm::ProviderError> { Ok(()) }
//! #     fn create_listen(&self, _: iw_cm::EventSink<Self>, _: SocketAddr, _: u32) -> Result<(), iw_cm::ProviderError> { Ok(()) }
//! #     fn destroy_listen(&self, _: ()) {}
//! #     fn disconnect(&self, _: &u32, _: Option<&u32>, _: iw_cm::DisconnectMode) -> Result<(), iw_cm::ProviderError> { Ok(()) }
//! #     fn qp_add_ref(&self, _: &u32) {}
//! #     fn qp_rem_ref(&self, _: &u32) {}
//! #   }
//! # }
//! struct Dev(Arc<nic::Nic>);
//! impl CmDevice for Dev {
//!     type Provider = nic::Nic;
//!     type Pd = ();
//!     type QpInitAttr<'a> = ();
//!     fn name(&self) -> &str { "dev0" }
//!     fn addresses(&self) -> Vec<Ipv4Subnet> { vec![Ipv4Subnet::new([10, 0, 0, 1].into(), 24)] }
//!     fn provider(&self) -> Arc<nic::Nic> { self.0.clone() }
//!     fn resolve_neighbor(&self, _: NeighborRequest, done: NeighborDone<Self>) { done.complete(Ok(None)) }
//!     fn create_qp(&self, _: &(), _: ()) -> Result<u32, verbs::VerbsError> { Ok(7) }
//!     fn qp_to_error(&self, _: &u32) {}
//! }
//! let cm = RdmaCm::new(RdmaCmConfig::default()).unwrap();
//! cm.add_device(Arc::new(Dev(Arc::new(nic::Nic)))).unwrap();
//! let (tx, rx) = mpsc::channel();
//! let tx = Mutex::new(tx);
//! let id = cm.create_id(move |_: &CmIdRef<Dev>, ev: CmEvent<Dev>| {
//!     tx.lock().unwrap().send(ev.kind).unwrap();
//!     Disposition::Keep
//! });
//! id.resolve_addr(None, "10.0.0.2:4791".parse().unwrap(), Duration::from_secs(1)).unwrap();
//! assert_eq!(rx.recv().unwrap(), EventKind::AddrResolved);
//! assert_eq!(id.device_name().as_deref(), Some("dev0"));
//! let removal = cm.remove_device("dev0").unwrap();
//! assert_eq!(rx.recv().unwrap(), EventKind::DeviceRemoval);
//! assert!(!removal.is_released()); // the id still holds it
//! id.destroy().unwrap();
//! removal.wait().unwrap();
//! assert_eq!(cm.stats().devices_held, 0);
//! ```

mod channel;
mod cm;
mod device;
mod error;
mod event;
mod id;
pub mod machine;
mod registry;
pub mod route;
mod stats;
mod sync;

pub use channel::{ChannelEvent, EventChannel, EventStream};
pub use cm::{RdmaCm, Removal};
pub use device::{
    CmDevice, DeviceNotifier, NeighborDone, NeighborRequest, NeighborResult, QpOf, ResolveError,
};
pub use error::CmError;
pub use event::{map_connect_reply, map_iw_event, Disposition, EventKind, IwEventKind};
pub use id::calls::{ConnParam, DestroyRefused};
pub use id::{CmEvent, CmId, CmIdRef, Handler};
pub use machine::IdState;
pub use registry::{RdmaCmConfig, RuleBreak};
pub use route::Ipv4Subnet;
pub use stats::RdmaCmStats;
