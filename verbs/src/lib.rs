//! Provider-neutral RDMA verbs types for softiwarp.
//!
//! Its room: the verbs vocabulary (values, the QP state table, errors) that every
//! backend and the CMs share. It touches nothing of ours and knows no backend.
//!
//! Both the soft device (`softiwarp`) and the Chelsio hardware backend over
//! rdma-core (`cxgb4`) speak this vocabulary, so it mirrors libibverbs
//! (`<infiniband/verbs.h>` and the `ibv_post_send(3)`, `ibv_poll_cq(3)`,
//! `ibv_modify_qp(3)` man pages) in names, numeric values and semantics. Every
//! enum that has a libibverbs counterpart converts to and from the libibverbs
//! numeric value (`to_ibv` / `from_ibv`), so the hardware backend is a table
//! lookup, never a guess.
//!
//! | module | what | libibverbs counterpart |
//! |---|---|---|
//! | [`access`] | [`AccessFlags`] and the MR access rule | `enum ibv_access_flags` |
//! | [`stag`] | [`Stag`] (= lkey = rkey in iWARP), [`Lkey`], [`Rkey`] | `ibv_mr.lkey` / `rkey` |
//! | [`wr`] | [`Sge`], [`SendWr`] / [`SendOp`] / [`SendFlags`], [`RecvWr`] | `struct ibv_sge`, `ibv_send_wr`, `ibv_recv_wr`, `enum ibv_wr_opcode`, `enum ibv_send_flags` |
//! | [`wc`] | [`WorkCompletion`], [`WcStatus`], [`WcOpcode`], [`WcFlags`] | `struct ibv_wc`, `enum ibv_wc_status`, `enum ibv_wc_opcode`, `enum ibv_wc_flags` |
//! | [`qp`] | [`QpState`], [`check_transition`], [`QpType`], [`QpCap`], [`QpAttr`], [`QpAttrMask`] | `enum ibv_qp_state`, `ibv_qp_type`, `struct ibv_qp_cap`, `ibv_qp_attr`, `enum ibv_qp_attr_mask` |
//! | [`error`] | [`VerbsError`] and its [`errno`](VerbsError::errno) | the errno a verb returns |
//! | [`event`] | [`AsyncEvent`], [`AsyncEventType`] | `struct ibv_async_event`, `enum ibv_event_type` |
//! | [`srq`] | [`SrqAttr`], [`SrqInitAttr`], [`SrqAttrMask`] | `struct ibv_srq_attr`, `ibv_srq_init_attr`, `enum ibv_srq_attr_mask` |
//! | [`caps`] | [`DeviceCaps`]: a device's limits and features as data (the Chelsio T5/T6 facts) | `struct ibv_device_attr` |
//! | [`provider`] | the object traits both backends implement (device, PD, MR, CQ, QP) and the RDMA CM in event-channel style | libibverbs' objects, librdmacm's `rdma_*` calls |
//!
//! Units: every length, offset and size in this crate is in bytes (octets);
//! addresses are I/O virtual addresses (iova) of registered memory, which for
//! iWARP are also the Tagged Offsets on the wire (RFC 5040 §2, RFC 5041 §4.1).
//!
//! # iWARP specifics
//!
//! - There is one key per memory registration: the STag (RFC 5040 §2). An MR's
//!   lkey and rkey are the same 32-bit value, laid out as in Linux siw: a 24-bit
//!   index naming the MR object and an 8-bit consumer key ([`Stag`]).
//! - RDMA Write with Immediate exists on the wire only through the RFC 7306
//!   extension: an RDMA Write followed by an Immediate Data message (RDMAP opcode
//!   0x8, or 0x9 with Solicited Event), which consumes one receive WR at the
//!   peer, exactly like `IBV_WR_RDMA_WRITE_WITH_IMM`. A verbs Send with Immediate
//!   has no iWARP encoding that consumes a single receive WR, so [`SendOp`] has no
//!   such variant. RFC 7306 Immediate Data carries 8 bytes; the verbs immediate
//!   is 32 bits (`ibv_send_wr.imm_data`), so a backend uses 4 of them.
//! - Atomics are the RFC 7306 Fetch-and-Add and Compare-and-Swap on 64-bit
//!   words; a backend may reject them with [`VerbsError::Unsupported`].
//!
//! # The completion-side contract
//!
//! Backends implement the verbs with these guarantees, which the soft device and
//! the hardware backend both test:
//!
//! 1. **Exactly once.** Every WR accepted by a post call (the call returned
//!    `Ok`) produces exactly one [`WorkCompletion`] carrying its `wr_id`, with
//!    one exception inherited from libibverbs: a successful *unsignaled* send WR
//!    (no [`SendFlags::SIGNALED`] on a QP created without "signal all") produces
//!    none. An unsignaled WR that fails, or that is flushed, always completes.
//!    A WR rejected by the post call (the call returned `Err`) never completes.
//! 2. **In order.** Completions of one work queue (the SQ, or the RQ) are
//!    delivered in the order the WRs were posted. (RDMA Read Responses may be
//!    *placed* out of order with later Sends, but their completions are not
//!    reordered; RFC 5040 §5.5.)
//! 3. **Flush on Error.** When a QP enters [`QpState::Error`] (by
//!    `modify_qp`, by a Terminate sent or received, RFC 5040 §6, or by the loss
//!    of the transport or of the device), the WR being processed completes with
//!    its error status (or [`WcStatus::WrFlushErr`]) and every WR still
//!    outstanding on both queues completes with [`WcStatus::WrFlushErr`], in
//!    posting order. WRs posted while the QP is in Error complete immediately
//!    with [`WcStatus::WrFlushErr`] (Linux siw behaviour) or are rejected with
//!    [`VerbsError::InvalidQpState`] (libcxgb4 behaviour); a backend documents
//!    which.
//! 4. **Error completions carry little.** As `ibv_poll_cq(3)` says, when the
//!    status is not [`WcStatus::Success`] only `wr_id`, `status`, `qp_num` and
//!    `vendor_err` are meaningful; `opcode` is filled when the backend knows it.
//! 5. **No callbacks.** Completions are queued on the CQ and taken by polling;
//!    the backend never runs user code to deliver them (design.md §5).
//!
//! The traits a backend implements (PD/MR/CQ/QP objects, the post/poll
//! calls and the RDMA CM) are in [`provider`]: the soft device (`softiwarp`)
//! and rdma-core (`cxgb4`) implement them, and a tool written against them
//! runs on either.
//!
//! # Example
//!
//! ```
//! use verbs::{
//!     check_transition, AccessFlags, QpCap, QpState, SendFlags, SendWr, Sge, Stag,
//!     VerbsError, WcOpcode, WcStatus, WorkCompletion,
//! };
//!
//! // A registration's access rights, checked by the verbs rule.
//! let access = AccessFlags::for_mr(0x7).unwrap(); // LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ
//! assert!(access.is_remote());
//! assert!(AccessFlags::for_mr(0x2).is_err()); // REMOTE_WRITE alone
//!
//! // The MR's STag: index 0x1a, key 0x02; lkey == rkey.
//! let stag = Stag::new(0x1a, 0x02).unwrap();
//! assert_eq!(stag.raw(), 0x1a02);
//!
//! // A signaled RDMA Write of 4 KiB, checked against the QP's capabilities.
//! let cap = QpCap { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 64 };
//! let wr = SendWr::rdma_write(7, vec![Sge::new(0x10000, 4096, stag)], 0x7f00_0000, Stag::from_raw(0x3301))
//!     .with_flags(SendFlags::SIGNALED);
//! wr.validate(&cap).unwrap();
//! assert_eq!(wr.op.wc_opcode(), WcOpcode::RdmaWrite);
//!
//! // modify_qp's table, and what a flushed WR looks like.
//! assert!(check_transition(QpState::Rts, QpState::Error).is_ok());
//! let e = VerbsError::from(check_transition(QpState::Rts, QpState::Init).unwrap_err());
//! assert_eq!(e.errno(), verbs::errno::EINVAL);
//! let wc = WorkCompletion::flushed(7, WcOpcode::RdmaWrite, 1);
//! assert_eq!(wc.status, WcStatus::WrFlushErr);
//! assert_eq!(wc.status.to_string(), "Work Request Flushed Error");
//! ```
//!
//! No `unsafe` code.

#![forbid(unsafe_code)]

pub mod access;
pub mod caps;
pub mod error;
pub mod event;
pub mod provider;
pub mod qp;
pub mod srq;
pub mod stag;
pub mod wc;
pub mod wr;

pub use access::{AccessFlags, AccessFlagsError};
pub use caps::DeviceCaps;
pub use error::{errno, ObjectKind, VerbsError, WorkQueue};
pub use event::{AsyncEvent, AsyncEventType};
pub use qp::{check_transition, QpAttr, QpAttrMask, QpCap, QpState, QpTransitionError, QpType};
pub use srq::{SrqAttr, SrqAttrMask, SrqInitAttr};
pub use stag::{Lkey, Rkey, Stag, StagIndexError};
pub use wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use wr::{FastReg, Payload, RecvWr, SendFlags, SendOp, SendWr, Sge};
