//! The iWARP connection manager (the Linux kernel's `iw_cm`,
//! `drivers/infiniband/core/iwcm.c`): cm_ids, the provider trait, ordered per-id event
//! delivery on CM worker threads, non-blocking destroy, free on last reference.
//!
//! # Room
//!
//! iw-cm owns the iWARP CM core: cm_ids and their state machine ([`machine`]), the
//! per-id event queues and the workers that deliver them, destroy and the free on last
//! reference, and the [`Provider`] trait that a device implements under it (siw's
//! `iw_cm_verbs`). It touches nothing else of the workspace and names no device: a
//! device (softiwarp's provider, or a test's fake) implements [`Provider`] in its own
//! crate, and the RDMA CM (rdma-cm) sits above it. It knows no wire format. With the
//! cargo feature `testing` (tests only), [`testing`] is the fake iWARP network that the
//! iw-cm and rdma-cm tests share (it uses `testkit`).
//!
//! Modules, each above the ones after it (no import cycle; `scripts/modgraph.py
//! --check iw-cm/src`): `cm` ([`IwCm`], the instance), `id` (cm_ids, their calls,
//! what their handler gets and returns, delivery, destroy), `work` (configuration,
//! counters, the job queue and its workers; it runs an id's job through a small trait
//! the id implements), `error`, [`machine`], `provider` (the trait, its events and the
//! [`EventSink`] they are reported to, which reaches its id through a small trait the
//! id implements), `sync` (std or loom primitives).
//!
//! | item | what | kernel counterpart |
//! |---|---|---|
//! | [`IwCm`] | one CM instance per provider (device), its worker thread(s), counters | `iw_cm` + `iw_cm_wq` |
//! | [`CmId`], [`CmIdRef`] | a cm_id and its calls: listen, connect, accept, reject, disconnect, destroy | `struct iw_cm_id`, `iw_cm_*`, `iw_destroy_cm_id` |
//! | [`EventHandler`], [`CmEvent`], [`Disposition`] | the user's handler, what it gets, what it returns | `iw_cm_handler`, `struct iw_cm_event` |
//! | [`Provider`], [`ProviderEvent`], [`EventSink`] | what a device implements, what it reports, where | `struct iw_cm_verbs`, `cm_id->event_handler` |
//! | [`machine`] | the sans-IO state machine: `(state, input) -> (state, result, downcalls, upcall)` | the state switch of every iwcm.c function |
//!
//! # The rules (design.md section 5, iw-cm)
//!
//! 1. **A provider reports events by enqueueing them** ([`EventSink::report`]); it never
//!    calls up into the user. Reporting from inside any downcall is safe: the CM holds
//!    no lock across a downcall.
//! 2. **Events of one id are delivered in order, one at a time**, on CM worker threads
//!    (never on the provider's thread): a per-id FIFO plus a "scheduled" flag so that
//!    at most one worker handles an id at a time (`cm_event_handler` /
//!    `cm_work_handler` on the ordered `iw_cm_wq`). A listener's queue holds at most
//!    `backlog` requests; beyond that a request is rejected at the provider, never
//!    dropped silently.
//! 3. **Destroy never blocks on the event path** ([`CmId::destroy`]): it marks the id
//!    `DESTROYING` (`IWCM_F_DROP_EVENTS`), drops its queued events, tears down per
//!    state and drops the creator's reference. The memory is freed with the last
//!    reference (`Arc` + `Drop`, `iwcm_deref_id` -> `free_cm_id`). A handler returning
//!    [`Disposition::Destroy`] destroys its id the same way. Waiting for delivery
//!    ([`IwCm::flush`], [`Destroyed::wait`]) is refused on worker threads with
//!    [`CmError::InDeliveryContext`] instead of deadlocking.
//! 4. **`DISCONNECT` only moves `ESTABLISHED` to `CLOSING`**; the user hears
//!    [`CmEvent::Close`]. `Established`/`ConnectReply` is always delivered before
//!    `Close` (FIFO).
//!
//! The kernel history these rules come from: the 2016 iwarp device-removal deadlock
//! (Steve Wise: iw_cxgb4 and iw_cm blocked in destroy until the references dropped,
//! while the event path held them; fixed since v4.8 by freeing on the last
//! reference and dropping events of destroyed ids); the 2024 use-after-free fix
//! ("RDMA/iwcm: Fix a use-after-free related to destroying CM IDs": a handler could
//! run after its owner's context was freed, fixed with `flush_workqueue` in
//! `iw_destroy_cm_id`; here the handler's context is owned by the id through an `Arc`,
//! so it cannot be freed under a running handler, and [`Destroyed::wait`] offers the
//! flush where the caller may block); and the 2025 use-after-free of queued work items
//! of a freed cm_id (work items embedded in the id outlived it; here a queued job owns
//! an `Arc` of its id, and an id has at most one job queued).
//!
//! # Example
//!
//! ```
//! # use iw_cm::*;
//! # use std::net::SocketAddr;
//! # use std::sync::Arc;
//! # struct Nic;
//! # impl Provider for Nic {
//! #     type Qp = u32; type Conn = u32; type Listener = ();
//! #     fn connect(&self, _: EventSink<Self>, _: ConnectArgs<'_, u32>) -> Result<u32, ProviderError> { Ok(1) }
//! #     fn accept(&self, _: EventSink<Self>, _: &u32, _: AcceptArgs<'_, u32>) -> Result<(), ProviderError> { Ok(()) }
//! #     fn reject(&self, _: &u32, _: &[u8]) -> Result<(), ProviderError> { Ok(()) }
//! #     fn create_listen(&self, _: EventSink<Self>, _: SocketAddr, _: u32) -> Result<(), ProviderError> { Ok(()) }
//! #     fn destroy_listen(&self, _: ()) {}
//! #     fn disconnect(&self, _: &u32, _: Option<&u32>, _: DisconnectMode) -> Result<(), ProviderError> { Ok(()) }
//! #     fn qp_add_ref(&self, _: &u32) {}
//! #     fn qp_rem_ref(&self, _: &u32) {}
//! # }
//! let cm = IwCm::new(Arc::new(Nic), CmConfig::default()).unwrap();
//! let children = Arc::new(std::sync::Mutex::new(Vec::new()));
//! let table = children.clone();
//! let listener = cm.create_id(move |_: &CmIdRef<Nic>, ev: CmEvent<Nic>| match ev {
//!     CmEvent::ConnectRequest(req) => {
//!         // Runs on a CM worker, for the new child id.
//!         let _ = req.id.accept(AcceptParams { qp: 7, private_data: vec![], ird: 16, ord: 16 });
//!         table.lock().unwrap().push(req.id); // keep it; dropping it would destroy it
//!         Disposition::Keep
//!     }
//!     CmEvent::Close => Disposition::Destroy,
//!     _ => Disposition::Keep,
//! });
//! listener.listen("10.0.0.1:4791".parse().unwrap(), 8).unwrap();
//! assert_eq!(listener.state(), CmState::Listen);
//! let _ = listener.destroy(); // never blocks
//! cm.flush().unwrap();
//! ```

mod cm;
mod error;
mod id;
pub mod machine;
mod provider;
mod sync;
#[cfg(feature = "testing")]
pub mod testing;
mod work;

pub use cm::IwCm;
pub use error::CmError;
pub use id::{
    in_delivery_context, AcceptParams, CmEvent, CmId, CmIdRef, ConnectParams, ConnectRequest,
    Destroyed, Disposition, EventHandler,
};
pub use machine::CmState;
pub use provider::{
    AcceptArgs, ConnectArgs, ConnectReply, ConnectStatus, DisconnectMode, EventSink,
    IncomingRequest, Provider, ProviderError, ProviderEvent, ReportError, MAX_IRD_ORD,
    MAX_PRIVATE_DATA,
};
pub use work::{CmConfig, CmStats, RuleBreak};
