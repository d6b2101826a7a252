//! The soft iWARP device (Linux siw's role): iWARP (RFC 5040/5041/5044) over smoltcp TCP
//! on a TAP or in-memory link, with the verbs objects (PD, MR, CQ, QP) on top and the
//! glue that puts the device under the two connection managers.
//!
//! **Room.** The crate owns everything between a link's Ethernet frames and the verbs
//! calls of an application: the link layer, the sans-IO transport (TCP through smoltcp,
//! MPA per connection), the sans-IO per-QP RDMAP/DDP engine, the state shared with the
//! application threads (STag table, CQs, event queues), the engine thread that drives it
//! all, the public device and verbs API, and the device's adapters to iw-cm and rdma-cm.
//! It touches the wire crates (`mpa`, `ddp-rdmap`), `verbs` and smoltcp; it touches
//! `iw-cm` and `rdma-cm` from [`cm`] only, implementing their provider / device traits
//! (their cores never name this crate). Its threads (the engine, the iw-cm provider
//! thread, the rdma-cm link watcher) only enqueue towards their users and never wait
//! for them.
//!
//! Applications use the verbs objects ([`Pd`], [`Mr`], [`Cq`], [`Qp`]) made from a
//! [`Device`], and bind a QP to an iWARP connection with
//! [`Device::connect_qp`] or [`ConnectRequest::accept_qp`]:
//!
//! ```
//! use std::net::Ipv4Addr;
//! use std::time::Duration;
//! use softiwarp::{Device, DeviceConfig, LinkConfig};
//! use softiwarp::link::{MemoryConfig, MemoryLink};
//! use softiwarp::transport::MpaParams;
//! use softiwarp::QpInitAttr;
//! use verbs::{AccessFlags, QpCap, RecvWr, SendFlags, SendWr, WcStatus};
//!
//! let (l1, l2) = MemoryLink::pair(MemoryConfig::default())?;
//! let server = Device::open(DeviceConfig::new("srv", LinkConfig::memory(l2), Ipv4Addr::new(10, 8, 0, 2), 24))?;
//! let client = Device::open(DeviceConfig::new("cli", LinkConfig::memory(l1), Ipv4Addr::new(10, 8, 0, 1), 24))?;
//! let cap = QpCap { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
//! // Verbs objects on each device.
//! let (spd, scq) = (server.alloc_pd()?, server.create_cq(16)?);
//! let sqp = server.create_qp(&spd, QpInitAttr { send_cq: &scq, recv_cq: &scq, cap, sq_sig_all: false })?;
//! let (cpd, ccq) = (client.alloc_pd()?, client.create_cq(16)?);
//! let cqp = client.create_qp(&cpd, QpInitAttr { send_cq: &ccq, recv_cq: &ccq, cap, sq_sig_all: false })?;
//! // The server exposes a buffer; the client writes into it with RDMA.
//! let target = spd.reg_mr(4096, 0x10000, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! let source = cpd.reg_mr(4096, 0x20000, AccessFlags::LOCAL_WRITE)?;
//! source.write(0, b"hello, iWARP")?;
//! // Connect: the QPs are handed to the connection and reach RTS when MPA is done.
//! let listener = server.listen(4791, 4)?;
//! let conn = client.connect_qp(Ipv4Addr::new(10, 8, 0, 2), 4791, MpaParams::default(), &cqp)?;
//! let served = listener.next_request(Duration::from_secs(5))?.accept_qp(&sqp, b"", 1, 1)?;
//! conn.wait_established(Duration::from_secs(5))?;
//! cqp.post_send(SendWr::rdma_write(1, vec![source.sge(0, 12)], target.iova(), target.rkey())
//!     .with_flags(SendFlags::SIGNALED))?;
//! let wc = ccq.poll_wait(1, Duration::from_secs(5))?[0];
//! assert_eq!(wc.status, WcStatus::Success);
//! // A Send behind the Write tells the server the data is there (RDMAP ordering).
//! sqp.post_recv(RecvWr::new(7, vec![]))?;
//! cqp.post_send(SendWr::send(2, vec![]))?;
//! assert_eq!(scq.poll_wait(1, Duration::from_secs(5))?[0].wr_id, 7);
//! let mut got = [0u8; 12];
//! target.read(0, &mut got)?;
//! assert_eq!(&got, b"hello, iWARP");
//! # drop(served);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The verbs objects
//!
//! The verbs objects of a soft device: [`Pd`], [`Mr`], [`Cq`], [`Srq`] and [`Qp`], named
//! and behaving as their libibverbs counterparts (`ibv_alloc_pd(3)`, `ibv_reg_mr(3)`,
//! `ibv_create_cq(3)`, `ibv_poll_cq(3)`, `ibv_create_srq(3)`, `ibv_post_srq_recv(3)`,
//! `ibv_create_qp(3)`, `ibv_modify_qp(3)`, `ibv_query_qp(3)`, `ibv_post_send(3)`,
//! `ibv_post_recv(3)`, `ibv_destroy_qp(3)`).
//!
//! They are made from a [`Device`]: [`Device::alloc_pd`],
//! [`Pd::reg_mr`], [`Device::create_cq`], [`Device::create_srq`], [`Device::create_qp`]
//! (or [`Device::create_qp_with_srq`]); a QP is bound to an
//! iWARP connection by [`Device::connect_qp`] or
//! [`ConnectRequest::accept_qp`].
//!
//!
//! ## Threads (design.md §5)
//!
//! Every object is `Send + Sync`; calls take `&self` and may come from any number of
//! application threads. A QP's protocol state belongs to the device's engine thread,
//! which no call touches:
//!
//! - [`Qp::post_send`] / [`Qp::post_recv`] check the WR **on the caller's thread**
//!   (the `ibv_post_send(3)` rules against the QP's capabilities, its ORD, the state
//!   the engine last published, and the queue occupancy counted from the WRs posted
//!   and the WRs the engine retired), return a typed [`VerbsError`] if it is refused,
//!   and otherwise queue it on the QP's work queue and ring the doorbell (the engine
//!   is woken once per batch it has not taken yet). The engine takes the queued WRs
//!   before it handles anything else for the QP, in particular before every received
//!   ULPDU, so a receive posted before the peer was told to send is there when the
//!   Send arrives (as with a NIC reading its rings from host memory). From then on
//!   the WR completes exactly once, on the QP's CQ (unless it is an unsignaled
//!   successful send WR), whatever happens to the QP, the connection or the device.
//! - [`Qp::modify_qp`] and [`Qp::destroy`] are answered by the engine (a round trip
//!   of microseconds); [`Qp::query_qp`] reads what the engine published.
//! - Completions come back through the [`Cq`]: [`Cq::poll`], the blocking
//!   [`Cq::wait`] / [`Cq::poll_wait`], or the executor-agnostic [`Cq::wait_async`]
//!   (usable from tokio). The engine never waits for the application and runs no
//!   application code.
//!
//! ## Memory
//!
//! An [`Mr`]'s buffer is allocated and owned by the library (zeroed at registration):
//! the application fills and reads it with [`Mr::write`] / [`Mr::read`] at byte
//! offsets, and names it in WRs by iova (`Mr::iova() + offset`) and STag
//! ([`Mr::lkey`] = [`Mr::rkey`] = [`Mr::stag`]; [`Mr::sge`] builds an SGE). Data placed
//! by the peer is visible once the WR's completion was polled (as with any RDMA
//! device).
//!
//! ## Object lifetime
//!
//! - [`Pd::dealloc`] fails with [`VerbsError::InUse`] (`EBUSY`) while MRs, QPs or SRQs
//!   use the PD, [`Cq::destroy`] while QPs use the CQ, [`Srq::destroy`] while QPs use
//!   the SRQ. A dropped QP uses them until the
//!   engine flushed and removed it (so no completion reaches a destroyed CQ; a
//!   destroyed CQ's [`Cq::poll`] fails with [`CqError::Destroyed`]). Dropping a handle
//!   releases its object as the explicit call would (a PD or CQ once nothing uses it
//!   any more).
//! - [`Qp::destroy`] (and dropping a [`Qp`]) is safe at any time: the QP goes to Error
//!   (every outstanding WR is flushed onto its CQ), its connection is closed, and no
//!   completion of it is produced after `destroy` returns. After the device is gone
//!   (or shut down) the engine has already flushed every QP, and destroy just
//!   releases the handle.
//! - After the device ended, calls that need the engine fail with
//!   [`VerbsError::DeviceGone`] (`EIO`, as a disassociated uverbs device); CQs still
//!   poll, MRs still read and write, QPs still answer [`Qp::query_qp`].
//!
//! [`VerbsError`]: verbs::VerbsError
//! [`VerbsError::InUse`]: verbs::VerbsError::InUse
//! [`VerbsError::DeviceGone`]: verbs::VerbsError::DeviceGone
//!
//! # Layers
//!
//! One folder per layer, bottom up (as smoltcp's `phy/ iface/ socket/`); a folder uses
//! only the folders listed before it. Below them all sit two private modules: `sync`
//! (std's or loom's primitives) and `progress_outbox`, the outbox of the progress lock
//! (`defer_wake`, `defer_call`, `assert_outside_driver`, offered as [`progress`]'s), which
//! the completion queues and neighbour resolution use inside a pass without importing
//! the engine. `scripts/modgraph.py --check softiwarp/src` holds the same order and fails
//! on an upward import or a module circle (without `--check` it prints the graph):
//!
//! | folder | owns | may touch |
//! |---|---|---|
//! | [`link`] | whole Ethernet frames: a TAP ([`link::TapLink`]), an in-process pair ([`link::MemoryLink`]) or UDP datagrams to a fixed peer ([`link::UdpLink`]), stackable middlewares ([`link::Pcap`], [`link::Faults`]), link failure as events ([`link::LinkEvent`]), rtnetlink | nothing of ours |
//! | [`transport`] | sans-IO, no threads, no clock: the [`transport::Stack`] (smoltcp interface, TCP sockets, listeners with a backlog, an upper layer per connection), [`transport::smoltcp_glue`] (smoltcp's `Device` over any link), [`transport::mpa_conn`] (one connection's MPA endpoint, RFC 5044/6581), [`transport::stream`] (the stream upper: bounded ULPDU queues), [`transport::neighbor`] (ARP on request) | `link` |
//! | [`resources`] | state shared by application threads and the engine: the STag table and MRs ([`resources::stag_table`], siw_mem.c; MRs over the application's own memory through [`resources::user_memory`], the crate's second `unsafe` module), completion queues ([`resources::completion_queue`], siw_cq.c), the event queues and [`DeviceEnd`] | `link` |
//! | [`host`] | the host-TCP transport: a device on a host interface, its connections kernel TCP sockets under one epoll set, the interface followed through rtnetlink (`host::socket`, [`host::netdev`]; `SIOCOUTQ` in the crate's third `unsafe` module) | `link`, `transport` |
//! | [`rdmap`] | sans-IO, no threads: the per-QP RDMAP/DDP engine ([`rdmap::engine::QpEngine`] with its `tx`/`rx` paths, siw_qp.c, siw_qp_tx.c, siw_qp_rx.c) and the QP as a connection's upper layer ([`rdmap::binding`]: placement in place from the TCP receive buffer, header + MR slice framed with the CRC in one pass) | `resources`, `transport` |
//! | `engine/` (private) | the engine thread (the NIC's firmware): its commands, the handle every device object holds, [`DeviceError`], [`DeviceEvent`], [`EngineConfig`] | `rdmap`, `resources`, `transport`, `link` |
//! | `api/` (private; re-exported here) | the public surface, siw_verbs.c's role: [`Device`] (open, listen, connect, accept/reject, ULPDUs, close; binding QPs to connections) and the verbs objects [`Pd`], [`Mr`], [`Cq`], [`Qp`] (checked on the caller's thread, handed to the engine) | every folder above |
//! | [`spec`] | a device described in one line (`SOFTIWARP_DEVICE`: `name`, `link=tap:IF` or `udp:ADDR:PORT`, `peer`, `ip`, `mac`, `mtu`, `crc`, `mpa_rev`, `p2p`) parsed into a [`DeviceConfig`], errors naming the key | the crate's public surface |
//! | [`cm`] | the device under the connection managers, siw_cm.c's role: [`cm::iwcm::SoftProvider`] (`iw_cm::Provider`, with its provider thread) and [`cm::rdmacm::SoftDevice`] (`rdma_cm::CmDevice`) | the crate's public surface (root, `link`, `transport`); `iw-cm`, `rdma-cm` |
//!
//! [`rdmap`] and [`resources`] are public for
//! the crate's own tests and benchmarks; applications need only the root and [`link`],
//! [`transport`] (MPA parameters, connection events) and [`cm`].
//!
//! See `docs/ARCHITECTURE.md` for the threads and the rules of design.md §5.

/// The smoltcp version this crate is built with (its `phy`, `iface` and `socket` types
/// appear in [`transport::smoltcp_glue`]'s API).
pub use smoltcp;

mod api;
pub mod cm;
mod engine;
pub mod host;
pub mod link;
mod progress_outbox;
pub mod rdmap;
pub mod resources;
pub mod spec;
mod sync;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transport;

/// The progress lock: who drives a device (shared/progress-design.md).
pub use engine::progress;

pub use api::device::{
    ConnectError, ConnectRequest, Connection, Device, DeviceConfig, FaultSpec, LinkConfig,
    LinkSpec, ListenError, Listener, QpBound, QpConnection, UlpduStream, SEND_DRIVE_BYTES,
    SEND_DRIVE_INTERVAL_US,
};
pub use api::verbs_objects::{
    Cq, DeviceAttr, Mr, Pd, PostListError, Qp, QpAttributes, QpInitAttr, Srq,
};
pub use engine::{DeviceError, DeviceEvent, EngineConfig, ProgressMode, COMMAND_TIMEOUT};
pub use rdmap::binding::QpStats;
pub use resources::completion_queue::{CqError, WaitAsync};
pub use resources::event_queue::DeviceEnd;
pub use resources::stag_table::{MrOptions, MrState, PdId};
