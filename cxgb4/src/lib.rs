//! The hardware backend: rdma-core (libibverbs + librdmacm) for Chelsio
//! T5/T6 (iw_cxgb4) and any kernel iWARP device (our test device: the
//! Linux kernel's siw, which exposes the same uverbs and rdma_ucm path).
//!
//! # What it is
//!
//! A thin, owned, safe layer over rdma-core's C API, opened at run time with
//! `dlopen` ([`RdmaCore::load`]): the workspace builds without rdma-core
//! headers, and a machine without rdma-core gets one line,
//! `rdma-core (libibverbs.so.1) not found`, never a panic.
//!
//! | module | what |
//! |---|---|
//! | [`ffi`] | `#[repr(C)]` layouts of rdma-core 44, the loader, owned raw handles: the only `unsafe` of the crate (its docs hold the **Contract**) |
//! | [`device`] | the device list, [`Context`] (open by name), [`DeviceCaps`] of a device |
//! | [`caps`] | [`DeviceCaps`] (now `verbs::DeviceCaps`, re-exported) of an `ibv_query_device` result ([`caps::from_device_attr`]) |
//! | [`pd`] | [`Pd`], [`Mr`] over a buffer the MR owns |
//! | [`cq`] | [`CompChannel`], [`Cq`]: poll into [`verbs::WorkCompletion`], arm, events |
//! | [`qp`] | [`Qp`]: `post_send` / `post_recv` of [`verbs::SendWr`] / [`verbs::RecvWr`] |
//! | [`cm`] | [`EventChannel`], [`CmId`], [`CmEvent`] (acks on drop), [`ConnParam`] |
//! | [`provider`] | the provider-neutral traits of [`verbs::provider`] over these objects ([`provider::WaitCq`], [`provider::Event`]) |
//! | [`translate`] | the pure tables between `verbs` values and rdma-core numbers |
//! | [`error`] | [`Error`]: load failure, unknown device name, verbs / CM errno |
//!
//! # The boundary
//!
//! It speaks the provider-neutral vocabulary of the `verbs` crate (WRs,
//! completions, access flags, errors with errno) and nothing of the soft
//! device: it depends on `verbs` only (design.md section 2). The object
//! traits both backends implement, and the RDMA CM API over either device,
//! meet at that vocabulary; this crate is the rdma-core side.
//! Connections are made only through the CM (`RDMA_PS_TCP`,
//! `rdma_create_qp` on the id): iWARP has no hand-driven QP bring-up.
//!
//! # Contract
//!
//! - **Memory.** An [`Mr`] owns its buffer (a boxed slice that cannot move or
//!   be freed while registered); it is deregistered before it is freed.
//!   Keep an MR until the WRs posted on it have completed (or their QP is
//!   destroyed): WRs name memory by address and lkey, not by a borrow, and
//!   a provider may still write a WR's pages after deregistration (see the
//!   [`ffi`] contract, item 4).
//! - **Order of destruction.** Every object holds its parents (`Arc`), so
//!   children go first: MR -> PD -> context; QP -> id, PD, CQs; CQ ->
//!   channel, context; id -> event channel. A [`CmEvent`] holds its id and
//!   acks before releasing it: librdmacm's `rdma_destroy_id` waits for every
//!   event of the id to be acked (the trap of notes section 3), and this
//!   order makes that wait empty.
//! - **Device removal** ([`CmEventKind::DeviceRemoval`]): drop the [`Qp`],
//!   the event (ack), the id, then the PD/CQ/MR of its context, and call
//!   [`release_cached_devices`] so librdmacm closes its cached context; when
//!   the removed device was the last one, librdmacm 44 keeps it open and the
//!   kernel's removal completes only at process exit (measured on siw).
//! - **Threads.** Every object is `Send + Sync`; libibverbs and librdmacm
//!   lock internally. No callback runs user code: completions are polled,
//!   CM events taken from the channel.
//! - **Completions.** [`Cq::poll`] translates each `ibv_wc`
//!   ([`translate::wc_from_ibv`]); libcxgb4 rejects posts on a QP in Error
//!   (`EINVAL`) rather than flushing them (verbs contract rule 3).
//!
//! # Chelsio facts (shared/rdma-core-notes.md section 2)
//!
//! From the kernel's `drivers/infiniband/hw/cxgb4/provider.c` and `qp.c` and
//! rdma-core's `providers/cxgb4/` (`t4.h`, `qp.c`), as data in
//! [`DeviceCaps::CHELSIO_T5`] / [`DeviceCaps::CHELSIO_T6`]: 17 SGEs per send
//! WR and 4 per receive WR (computed), 1 SGE per RDMA Read (`EINVAL` above),
//! 280 bytes inline (computed), ORD/IRD at most 32 (`c4iw_max_read_depth`;
//! `EINVAL` above; firmware may lower it), 8190 WRs per queue and 65518 CQEs
//! (computed), no atomics (`IBV_ATOMIC_NONE`), no Send with Immediate, RDMA
//! Write with Immediate only on T6 with capable firmware, and the local sink
//! of an RDMA Read must be registered with `REMOTE_WRITE`
//! ([`DeviceCaps::check_read_sink`]; siw does not check). The device is
//! `IBV_TRANSPORT_IWARP`, named `cxgb4_N`, vendor id 0x1425.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! let core = Arc::new(cxgb4::RdmaCore::load()?); // "rdma-core (libibverbs.so.1) not found"
//! for d in cxgb4::devices(&core)? {
//!     println!("{} {:?}", d.name, d.transport);
//! }
//! let ctx = cxgb4::Context::open(&core, "siw0")?; // "no RDMA device named 'siw0' (found: ...)"
//! let caps = ctx.caps()?;
//! let (ord, ird) = caps.clamp_ord_ird(128, 128);
//! # let _ = (ord, ird);
//! # Ok::<(), cxgb4::Error>(())
//! ```

pub mod caps;
pub mod cm;
pub mod cq;
pub mod device;
pub mod error;
pub mod ffi;
pub mod pd;
pub mod provider;
pub mod qp;
mod read_sink;
pub mod translate;
mod wr_track;

pub use caps::{DeviceCaps, CHELSIO_VENDOR_ID};
pub use cm::{CmEvent, CmId, ConnParam, EventChannel};
pub use cq::{CompChannel, Cq};
pub use device::{devices, release_cached_devices, Context, DeviceInfo, Transport};
pub use error::{Error, Result};
pub use ffi::{LoadError, RdmaCore};
pub use pd::{Mr, Pd};
pub use provider::{Event, WaitCq};
pub use qp::Qp;
pub use translate::CmEventKind;
