//! The soft iWARP device: PD/MR/CQ/QP objects, the STag table, the per-QP protocol
//! engine, the smoltcp transport over a TAP or in-memory link, and the engine thread.
//!
//! What is here so far (step 2): the link layer and the transport with its engine thread.
//!
//! - [`link`]: whole Ethernet frames over a TAP ([`link::TapLink`]) or an in-process pair
//!   ([`link::MemoryLink`]), with stackable middlewares ([`link::Pcap`],
//!   [`link::Faults`]) and link failure as events ([`link::LinkEvent`]).
//! - [`phy`]: the smoltcp `Device` over any link, the `Interface` and TCP socket builders.
//! - [`netns`]: network namespaces and the two-TAP topology for root-only tests.
//! - [`stack`]: the sans-IO transport core (smoltcp interface, TCP sockets, an
//!   [`mpa_conn::MpaConn`] and an upper layer per connection, listeners with a backlog).
//! - [`stream`]: the stream upper (bounded ULPDU queues between a connection and its user).
//! - [`engine`]: the engine thread that owns a device's stack and link.
//! - [`device`]: the public device API (open, listen, connect, accept/reject, ULPDUs, close).
//!
//! The per-QP engine plugs into [`stack`] as a [`stack::Ulp`] next; see
//! `docs/ARCHITECTURE.md`.

/// The smoltcp version this crate is built with (its `phy`, `iface` and `socket` types
/// appear in [`phy`]'s API).
pub use smoltcp;

pub mod cq;
pub mod device;
pub mod engine;
pub mod link;
pub mod mpa_conn;
pub mod mr;
pub mod netns;
pub mod phy;
pub mod qp;
pub mod stack;
pub mod stream;
