//! The soft iWARP device: PD/MR/CQ/QP objects, the STag table, the per-QP protocol
//! engine, the smoltcp transport over a TAP or in-memory link, and the engine thread.
//!
//! What is here so far (step 2, lower half): the link layer.
//!
//! - [`link`]: whole Ethernet frames over a TAP ([`link::TapLink`]) or an in-process pair
//!   ([`link::MemoryLink`]), with stackable middlewares ([`link::Pcap`],
//!   [`link::Faults`]) and link failure as events ([`link::LinkEvent`]).
//! - [`phy`]: the smoltcp `Device` over any link, the `Interface` and TCP socket builders.
//! - [`netns`]: network namespaces and the two-TAP topology for root-only tests.
//!
//! The engine thread, MPA connections, verbs objects and the QP engine come next; see
//! `docs/ARCHITECTURE.md`.

/// The smoltcp version this crate is built with (its `phy`, `iface` and `socket` types
/// appear in [`phy`]'s API).
pub use smoltcp;

pub mod cq;
pub mod link;
pub mod mpa_conn;
pub mod mr;
pub mod netns;
pub mod phy;
pub mod qp;
