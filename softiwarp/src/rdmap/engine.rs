//! The per-QP protocol engine: RDMAP (RFC 5040, with RFC 7306 Immediate Data and
//! Atomics) over DDP (RFC 5041) for one RC QP, sans-IO.
//!
//! [`QpEngine`] owns one QP's protocol state and nothing else: no socket, no clock, no
//! thread (quinn-proto style). The driver (the device's engine thread) feeds it whole
//! ULPDUs with [`QpEngine::handle_ulpdu`] (the bytes MPA delivers after the ULPDU Length,
//! before pad and CRC) and pulls ULPDUs to send with [`QpEngine::poll_transmit`];
//! application verbs arrive as [`QpEngine::post_send`], [`QpEngine::post_recv`] and
//! [`QpEngine::modify_state`]. Completions go to the [`CompletionQueue`]s given at creation;
//! asynchronous events come out of [`QpEngine::poll_event`].
//!
//! Method groups: getters; `handle_*` (input); application mutators (`post_*`,
//! `modify_state`, `set_ord_ird`, `set_access`, `set_initial_msn`); `poll_*` (output;
//! `take_terminate` for drivers that send the Terminate on a path of their own).
//! [`WqCounters`] let a verbs layer on another thread see how many WRs left each queue
//! (counted before their completions are pushed), and [`validate_send_wr`] are the
//! post-time checks that need no engine state.
//!
//! # Example
//!
//! Two engines back to back, a Send moved by hand:
//!
//! ```
//! use std::sync::Arc;
//! use softiwarp::rdmap::engine::{QpEngine, QpInit};
//! use softiwarp::resources::{completion_queue::CompletionQueue, stag_table::MrTable};
//! use verbs::{AccessFlags, QpCap, QpState, RecvWr, SendFlags, SendWr, Sge, WcStatus};
//!
//! let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 };
//! let mut ends = Vec::new();
//! for n in 1..=2 {
//!     let mrs = Arc::new(MrTable::new());
//!     let pd = mrs.alloc_pd()?;
//!     let cq = CompletionQueue::new(n, 16)?;
//!     let mut qp = QpEngine::new(QpInit::new(n, pd, cap), Arc::clone(&mrs), Arc::clone(&cq), Arc::clone(&cq))?;
//!     for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
//!         qp.modify_state(s)?;
//!     }
//!     ends.push((mrs, pd, cq, qp));
//! }
//! let [(_, _, a_cq, mut a), (b_mrs, b_pd, b_cq, mut b)] = <[_; 2]>::try_from(ends).ok().unwrap();
//! let buf = b_mrs.reg_mr(b_pd, 0x1000, 64, AccessFlags::LOCAL_WRITE)?;
//! b.post_recv(RecvWr::new(7, vec![Sge::new(0x1000, 64, buf.stag())]))?;
//! a.post_send(SendWr::send_inline(1, b"hi".to_vec()).with_flags(SendFlags::SIGNALED))?;
//! while let Some(ulpdu) = a.poll_transmit_vec(1442)? {
//!     b.handle_ulpdu(&ulpdu)?;
//! }
//! assert_eq!(a_cq.poll(4)?[0].status, WcStatus::Success);
//! let wc = b_cq.poll(4)?[0];
//! assert_eq!((wc.wr_id, wc.byte_len), (7, 2));
//! let mut got = [0u8; 2];
//! buf.read(0, &mut got)?;
//! assert_eq!(&got, b"hi");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Send queue processing (TX; siw `siw_qp_tx.c`)
//!
//! WRs are started strictly in posting order. A started Send, Send with SE / with
//! Invalidate, RDMA Write or Write with Immediate is one *message* segmented into DDP
//! segments for the MULPDU the driver passes (`ddp_rdmap::segment`); an RDMA Read is
//! one Read Request per non-empty scatter SGE (a remote range split to match, each
//! one ORD credit; siw allows one SGE, we allow `max_send_sge`); an RFC 7306 atomic
//! (Fetch-and-Add, Compare-and-Swap) is one Atomic Request, also one ORD credit (see
//! "Atomics" below); Local Invalidate and Fast Register execute when they are
//! reached. A WR is started only when:
//!
//! - the QP is in RTS (in SQD nothing new starts; what is in flight finishes);
//! - with [`SendFlags::FENCE`], no earlier RDMA Read or atomic is outstanding (RFC
//!   5040 §5.5; `IBV_SEND_FENCE`; siw `orq_fence`);
//! - an RDMA Read has an ORD credit for each Read Request it sends, an atomic one for
//!   its Atomic Request; without one it waits at the head of the SQ (siw does the
//!   same for Reads);
//! - a tagged message (RDMA Write) does not start while a Read Response is half
//!   sent, nor a Read Response while a Write is: a receiver places tagged segments
//!   through one tagged context and rejects interleaved tagged messages (siw
//!   `siw_get_hdr`, "packet intersection").
//!
//! Read Responses (for the Read Requests the peer sent, queued up to IRD) form a
//! second stream beside the SQ: RFC 5040 §5.5 orders Read Responses among
//! themselves (request order) but not against the responder's own outgoing Sends and
//! Writes. [`QpEngine::poll_transmit`] alternates between the two streams segment by
//! segment whenever both have something ready, so a long Send does not starve the
//! peer's Reads; untagged SQ messages interleave with a Read Response at segment
//! granularity, Writes only at message boundaries (above).
//!
//! MSNs: each untagged queue counts messages from 1 (RFC 5041 §4.3): QN 0 (Sends and
//! Immediate Data), QN 1 (Read Requests and Atomic Requests), QN 3 (Atomic
//! Responses); the single Terminate uses QN 2, MSN 1.
//!
//! # Completion timing
//!
//! - Send, RDMA Write (and Write with Immediate, after its Immediate Data): when the
//!   last DDP segment of the message has been handed to the driver by
//!   [`QpEngine::poll_transmit`] (siw completes when the last byte is passed to TCP). The
//!   source buffer may be reused then; iWARP has no end-to-end acknowledgement, so a
//!   later failure at the peer surfaces as a Terminate (the QP goes to Error).
//! - RDMA Read: when the last Read Response segment of its last Read Request has
//!   been placed.
//! - Atomic: when its Atomic Response arrived and the original value was stored in
//!   its 8-byte SGE.
//! - Local Invalidate, Fast Register: when executed.
//! - Receive: when the last segment of the incoming Send (or the Immediate Data) is
//!   placed; for Send with Invalidate the STag is invalidated first, so the
//!   invalidation is visible before the completion is.
//!
//! Completions of each queue are delivered in posting order (verbs contract 2): a
//! finished WR waits behind an earlier RDMA Read still in flight. An unsignaled
//! successful send WR produces no completion; every other WR produces exactly one.
//!
//! # Errors and Terminate (RFC 5040 §7, RFC 5041 §7)
//!
//! Every violation found in an incoming ULPDU is checked *before* any byte of it is
//! placed. It queues the Terminate that [`ddp_rdmap::terminate::Repr::for_error`]
//! builds for the cause and the offending ULPDU (QN 2, MSN 1, opcode Terminate) as the
//! next and last ULPDU [`QpEngine::poll_transmit`] returns, moves the QP to Error, completes
//! the WR concerned with its error status (a receive WR too small:
//! [`WcStatus::LocLenErr`]; a Read WR whose response went wrong:
//! [`WcStatus::LocProtErr`] / [`WcStatus::BadRespErr`]), flushes the rest, and reports
//! [`QpEvent::TerminateQueued`] plus an async event ([`AsyncEvent::QpAccessErr`] for
//! protection errors, [`AsyncEvent::QpReqErr`] for malformed or unexpected requests).
//! Local failures (an SGE that fails its lkey check, a failed Local Invalidate or
//! Fast Register, a CQ overflow) complete the WR with its status, send an RDMAP
//! Local Catastrophic Error Terminate and report [`AsyncEvent::QpFatal`].
//!
//! A received Terminate is never answered: the QP goes to Error, the oldest started
//! send WR completes with the status mapped from the Terminate's cause
//! ([`status_for_terminate`]) and `vendor_err` = `Layer << 12 | EType << 8 | Code`,
//! everything else is flushed, and [`QpEvent::TerminateReceived`] and
//! [`AsyncEvent::QpFatal`] are reported. After a Terminate is sent or received, no
//! ULPDU is processed or produced any more.
//!
//! # Atomics (RFC 7306 §5)
//!
//! Requester: an atomic WR (one 8-byte SGE with `LOCAL_WRITE`, an 8-byte aligned
//! remote address; both checked at post) sends one Atomic Request on QN 1 with the
//! next Read Request MSN, which is also its Request Identifier; Fetch-and-Add is
//! FetchAdd with Add Mask 0, Compare-and-Swap is CmpSwap with both masks all ones
//! ([`ddp_rdmap::rdmap::AtomicRequestRepr::fetch_add`] / `cmp_swap`). It holds an
//! ORD credit like a Read Request (outstanding Reads + atomics <= ORD), and posts the
//! QN 3 buffer its Atomic Response consumes. The Response must answer the oldest
//! outstanding request with its Identifier; the Original Remote Data Value is stored
//! in native byte order in the SGE and the WR completes ([`WcOpcode::FetchAdd`] /
//! [`WcOpcode::CompSwap`], `byte_len` 8).
//!
//! Responder: an Atomic Request takes one IRD credit (the QN 1 buffers are 52 bytes,
//! the Atomic Request header, so Read and Atomic Requests share them), is checked
//! (QP `REMOTE_ATOMIC`, 8-byte alignment, the MR with `REMOTE_ATOMIC` and bounds:
//! RDMAP Remote Protection Terminates, see `rx_atomic_request`), and joins the Read
//! Requests' queue: its Atomic Response on QN 3 leaves in request order with the
//! Read Responses, and the credit comes back when it is sent. The operation itself
//! runs under the MR's lock (on application memory, one `AtomicU64` operation when
//! the word is aligned in memory): on arrival when no Read Response is queued ahead
//! of it, else when its turn comes, so an earlier Read never sees its effect and
//! atomics run in arrival order among themselves.
//!
//! # Flush
//!
//! Entering Error (by [`QpEngine::modify_state`], a Terminate, or a local failure) completes
//! every outstanding send WR and then every outstanding receive WR, each in posting
//! order, exactly once, with [`WcStatus::WrFlushErr`] unless it is the WR the error
//! concerns. A WR posted while the QP is in Error (or SQE) is accepted and completes
//! at once with [`WcStatus::WrFlushErr`] (Linux siw behaviour; verbs contract 3).
//! Moving to Reset flushes the same way first, so even then every accepted WR
//! completes once.
//!
//! # Shared receive queues
//!
//! A QP attached to a [`SharedReceiveQueue`] ([`QpEngine::attach_srq`], in Reset) has
//! no receive queue of its own ([`QpEngine::post_recv`] fails). When the first DDP
//! segment of a new untagged message (MSN) on QN 0 arrives, it takes the SRQ's oldest
//! WR for that message and keeps it for the message's later segments (siw
//! `siw_rqe_get` with an SRQ, called once per message); an empty SRQ at that moment is
//! the DDP "Invalid MSN - no buffer available" Terminate, as for a QP whose own
//! receive queue is empty. The SGEs are checked against the SRQ's PD. So each QP's
//! messages are placed and completed in MSN order, and WRs leave the SRQ in its order
//! across QPs. The completion goes to this QP's receive CQ with this QP's number.
//!
//! Entering Error flushes the WR a message in progress had taken (on this QP's receive
//! CQ) and then reports [`AsyncEvent::QpLastWqeReached`] (once per entry into Error,
//! after the error's own event): nothing more will be taken from the SRQ. The WRs
//! still in the SRQ stay there for its other QPs; only the device's end flushes them
//! ([`QpEngine::flush_srq`]). When a take leaves fewer WRs than the SRQ's armed limit,
//! [`AsyncEvent::SrqLimitReached`] is reported (once per arming; see
//! [`crate::resources::shared_receive_queue`]).

mod rx;
mod tx;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ddp_rdmap::reassembly::UntaggedQueue;
use ddp_rdmap::terminate::{ErrorCause, RdmapOperationCode};
use ddp_rdmap::Opcode;
use verbs::{
    check_transition, AccessFlags, AsyncEvent, Payload, QpCap, QpState, RecvWr, SendFlags, SendOp,
    SendWr, Sge, Stag, VerbsError, WcOpcode, WcStatus, WorkCompletion,
};

use crate::resources::completion_queue::CompletionQueue;
use crate::resources::shared_receive_queue::SharedReceiveQueue;
use crate::resources::stag_table::{MemoryRegion, MrTable, PdId};

pub use tx::TxSink;

/// Smallest MULPDU [`QpEngine::poll_transmit`] accepts, in bytes: the largest
/// single-segment ULPDU, a Terminate with both headers copied (18 + 52 bytes).
pub const MIN_MULPDU: usize = 70;

/// Largest ORD / IRD, in Read Requests: the 14-bit field of the MPA Rev 2 IRD/ORD
/// word (RFC 6581 §3).
pub const MAX_ORD_IRD: u32 = 0x3fff;

/// Size of one buffer on QN 1, bytes: the largest message of that queue, the
/// 52-byte Atomic Request header (RFC 7306 §5; the RDMA Read Request header is 28,
/// RFC 5040 §4.4). The IRD is the number of these buffers posted: Read Requests and
/// Atomic Requests share it.
const READ_REQUEST_BUFFER: u32 = ddp_rdmap::rdmap::ATOMIC_REQUEST_LEN as u32;

/// Size of one buffer on QN 3 (the Atomic Response header, RFC 7306 §5), bytes. One is
/// posted for each Atomic Request sent.
const ATOMIC_RESPONSE_BUFFER: u32 = ddp_rdmap::rdmap::ATOMIC_RESPONSE_LEN as u32;

/// Largest first MSN [`QpEngine::set_initial_msn`] accepts (an RTR takes MSN 1, so 2 is the
/// most a peer needs; a little room is left).
pub const MAX_INITIAL_MSN: u32 = 16;

/// Running counts of the WRs that left each work queue, shared with application
/// threads (`Arc`): a WR is counted *before* its completion (if any) is pushed to the
/// CQ, so a thread that has seen a completion also sees its WR's slot free. Posted
/// minus retired is the queue occupancy a verbs layer checks `max_send_wr` /
/// `max_recv_wr` against without asking the engine.
#[derive(Debug, Default)]
pub struct WqCounters {
    sq_retired: AtomicU64,
    rq_retired: AtomicU64,
}

impl WqCounters {
    /// Send WRs that left the SQ so far (completed, flushed, or retired unsignaled;
    /// including WRs flushed at post time in Error).
    pub fn sq_retired(&self) -> u64 {
        self.sq_retired.load(Ordering::Acquire)
    }

    /// Receive WRs that left the RQ so far (completed or flushed).
    pub fn rq_retired(&self) -> u64 {
        self.rq_retired.load(Ordering::Acquire)
    }

    /// Counts `n` send WRs as retired (a driver completing a WR the engine refused).
    pub fn retire_sq(&self, n: u64) {
        self.sq_retired.fetch_add(n, Ordering::AcqRel);
    }

    /// Counts `n` receive WRs as retired.
    pub fn retire_rq(&self, n: u64) {
        self.rq_retired.fetch_add(n, Ordering::AcqRel);
    }
}

/// The checks [`QpEngine::post_send`] makes that depend only on the WR, the QP's
/// capabilities and its ORD (none on the QP's state or queues), so a verbs layer can
/// run them on the caller's thread. Returns the payload length in bytes.
///
/// # Errors
///
/// As [`QpEngine::post_send`]: those of [`SendWr::validate`], [`VerbsError::Unsupported`]
/// (RDMA Read or atomic with ORD 0), [`VerbsError::MessageTooLong`],
/// [`VerbsError::InvalidArgument`] `"remote_addr"`.
pub fn validate_send_wr(cap: &QpCap, ord: u32, wr: &SendWr) -> Result<u32, VerbsError> {
    wr.validate(cap)?;
    let len = u32::try_from(wr.payload.len()).map_err(|_| VerbsError::MessageTooLong {
        len: wr.payload.len(),
        max: u64::from(u32::MAX),
    })?;
    let remote_addr = match wr.op {
        SendOp::RdmaWrite { remote_addr, .. }
        | SendOp::RdmaWriteWithImm { remote_addr, .. }
        | SendOp::RdmaRead { remote_addr, .. } => Some(remote_addr),
        _ => None,
    };
    if let Some(addr) = remote_addr {
        if len > 0 && addr.checked_add(u64::from(len) - 1).is_none() {
            return Err(VerbsError::InvalidArgument {
                what: "remote_addr",
            });
        }
    }
    if matches!(wr.op, SendOp::RdmaRead { .. }) && ord == 0 {
        return Err(VerbsError::Unsupported {
            what: "RDMA Read with ORD 0",
        });
    }
    if wr.op.is_atomic() && ord == 0 {
        return Err(VerbsError::Unsupported {
            what: "atomic with ORD 0",
        });
    }
    Ok(len)
}

/// What a QP is created with (`struct ibv_qp_init_attr` plus the iWARP IRD/ORD and
/// the QP's access flags, `ibv_qp_attr.qp_access_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    /// The QP number (`ibv_qp.qp_num`), copied into every completion.
    pub qp_num: u32,
    /// The QP's PD: MRs of other PDs are refused (RFC 5040 §2).
    pub pd: PdId,
    /// Queue depths (in WRs), SGE limits and inline limit (bytes).
    pub cap: QpCap,
    /// `sq_sig_all`: every send WR completes, signaled or not.
    pub sq_sig_all: bool,
    /// ORD: RDMA Read Requests and Atomic Requests this QP may have outstanding
    /// together (`max_rd_atomic`).
    pub ord: u32,
    /// IRD: incoming RDMA Read Requests and Atomic Requests this QP queues together
    /// (`max_dest_rd_atomic`); one more is a protocol error.
    pub ird: u32,
    /// Incoming remote operations accepted at all (`qp_access_flags`):
    /// `REMOTE_WRITE` (RDMA Write), `REMOTE_READ` (RDMA Read Request),
    /// `REMOTE_ATOMIC` (RFC 7306 Atomic Request).
    pub access: AccessFlags,
    /// What the sink MR of this QP's RDMA Reads must allow: `LOCAL_WRITE` (Linux siw,
    /// the default), or `LOCAL_WRITE | REMOTE_WRITE` (the iWARP hardware rule,
    /// [`crate::DeviceConfig::strict_read_sink`]). Checked when the Read starts and at
    /// every Read Response placed; a failure completes the Read with
    /// [`WcStatus::LocProtErr`].
    pub read_sink_access: AccessFlags,
}

impl QpInit {
    /// Defaults for a QP of `pd` numbered `qp_num` with `cap`: `sq_sig_all` off, ORD
    /// and IRD 16, remote Write, Read and Atomic accepted (as the RDMA CM's QPs with
    /// responder resources: `cma_ib_init_qp_attr`).
    pub fn new(qp_num: u32, pd: PdId, cap: QpCap) -> QpInit {
        QpInit {
            qp_num,
            pd,
            cap,
            sq_sig_all: false,
            ord: 16,
            ird: 16,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            read_sink_access: AccessFlags::LOCAL_WRITE,
        }
    }
}

/// Something the driver (or, through it, the application) must learn about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpEvent {
    /// A verbs asynchronous event for this QP (`ibv_get_async_event(3)`).
    Async(AsyncEvent),
    /// The engine found an error and queued a Terminate with this cause; it is the
    /// next ULPDU [`QpEngine::poll_transmit`] returns, and the last. The driver closes the
    /// connection after sending it.
    TerminateQueued {
        /// Layer / EType / Error Code sent.
        cause: ErrorCause,
    },
    /// The peer sent a Terminate (RFC 5040 §4.8). `cause` is `None` if its header
    /// did not parse. The QP is in Error; the driver closes the connection.
    TerminateReceived {
        /// The peer's Layer / EType / Error Code.
        cause: Option<ErrorCause>,
    },
    /// A completion did not fit in the CQ named `cq` (see [`crate::resources::completion_queue`]); the QP went
    /// to Error.
    CqOverflow {
        /// Handle of the CQ.
        cq: u32,
    },
}

/// Why [`QpEngine::handle_ulpdu`] did not process a ULPDU normally. The QP's state and
/// events tell the same story; this is for the driver's convenience.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RxError {
    /// The QP is not receiving (Reset or Init); the ULPDU was ignored.
    #[error("ULPDU ignored in QP state {state}")]
    NotReady {
        /// The QP's state.
        state: QpState,
    },
    /// A Terminate was already sent or received, or the QP is in Error: nothing is
    /// processed any more (RFC 5040 §7).
    #[error("ULPDU ignored: the RDMAP stream is terminated")]
    Terminated,
    /// The ULPDU broke a rule; a Terminate with `cause` is queued and the QP is in
    /// Error. Nothing of the ULPDU was placed.
    #[error("protocol error: {cause}")]
    Protocol {
        /// The Terminate's Layer / EType / Error Code.
        cause: ErrorCause,
    },
    /// A local resource failed while handling the ULPDU (a receive WR's SGE failed
    /// its lkey check); the WR completes with `status`, a Local Catastrophic
    /// Terminate is queued and the QP is in Error.
    #[error("local error: {status}")]
    Local {
        /// The completion status of the receive WR.
        status: WcStatus,
    },
    /// The ULPDU was the peer's Terminate; the QP is in Error.
    #[error("peer terminated the stream")]
    PeerTerminated {
        /// The peer's cause, if its header parsed.
        cause: Option<ErrorCause>,
    },
}

/// Why [`QpEngine::poll_transmit`] could not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TxError {
    /// The MULPDU is below [`MIN_MULPDU`] bytes.
    #[error("MULPDU {mulpdu} is below the minimum of {min} bytes")]
    MulpduTooSmall {
        /// MULPDU given, bytes.
        mulpdu: usize,
        /// [`MIN_MULPDU`].
        min: usize,
    },
}

/// The completion status for the send WR in progress when the peer's Terminate
/// carries `cause` (our mapping; the RFCs leave it to the verbs provider):
///
/// | cause | status |
/// |---|---|
/// | RDMAP Remote Protection, DDP Tagged Buffer (invalid STag, bounds, not associated, TO wrap) | [`WcStatus::RemAccessErr`] |
/// | DDP Untagged Buffer (QN, MSN, no buffer, MO, too long, version), RDMAP "Invalid RDMAP version", "Unexpected OpCode", DDP Tagged "Invalid DDP version" | [`WcStatus::RemInvReqErr`] |
/// | other RDMAP Remote Operation, Local Catastrophic (RDMAP, DDP) | [`WcStatus::RemOpErr`] |
/// | LLP (MPA) | [`WcStatus::FatalErr`] |
/// | unrecognized | [`WcStatus::GeneralErr`] |
pub fn status_for_terminate(cause: ErrorCause) -> WcStatus {
    use ddp_rdmap::terminate::DdpTaggedCode;
    match cause {
        ErrorCause::RdmapRemoteProtection(_) => WcStatus::RemAccessErr,
        ErrorCause::DdpTagged(DdpTaggedCode::InvalidVersion) => WcStatus::RemInvReqErr,
        ErrorCause::DdpTagged(_) => WcStatus::RemAccessErr,
        ErrorCause::DdpUntagged(_) => WcStatus::RemInvReqErr,
        ErrorCause::RdmapRemoteOperation(
            RdmapOperationCode::InvalidVersion | RdmapOperationCode::UnexpectedOpcode,
        ) => WcStatus::RemInvReqErr,
        ErrorCause::RdmapRemoteOperation(_)
        | ErrorCause::RdmapLocalCatastrophic { .. }
        | ErrorCause::DdpLocalCatastrophic { .. } => WcStatus::RemOpErr,
        ErrorCause::Llp(_) => WcStatus::FatalErr,
        ErrorCause::Unrecognized { .. } => WcStatus::GeneralErr,
    }
}

/// `vendor_err` for a completion caused by a Terminate: `Layer << 12 | EType << 8 |
/// Error Code` (the first 16 bits of the Terminate Control word, RFC 5040 §4.8).
pub fn vendor_err_for(cause: ErrorCause) -> u32 {
    (u32::from(cause.layer_value() & 0xf) << 12)
        | (u32::from(cause.etype() & 0xf) << 8)
        | u32::from(cause.code())
}

/// A resolved piece of local memory: `len` bytes at buffer offset `off` of `mr`.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    pub(crate) mr: Arc<MemoryRegion>,
    pub(crate) off: usize,
    pub(crate) len: usize,
}

/// Progress of one send WR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Posted, not started.
    Queued,
    /// Started: transmitting, or (Reads) waiting for Read Responses.
    Started,
    /// Finished successfully; waits for earlier WRs before it completes.
    Done,
}

#[derive(Debug)]
struct SqEntry {
    seq: u64,
    wr: SendWr,
    signaled: bool,
    /// Payload length, bytes.
    len: u32,
    phase: Phase,
    /// RDMA Read: Read Requests in the WR, and how many were answered in full.
    reads_total: u32,
    reads_done: u32,
}

#[derive(Debug)]
struct RqEntry {
    wr_id: u64,
    sges: Vec<Sge>,
    /// Per SGE, the resolved buffer offset once checked (lazily, before the first
    /// byte lands in it).
    resolved: Vec<Option<(Arc<MemoryRegion>, usize)>>,
}

/// An outbound RDMA Read Request awaiting its Read Response.
#[derive(Debug, Clone, Copy)]
struct OrqRead {
    seq: u64,
    sink_stag: u32,
    sink_to: u64,
    size: u32,
    placed: u32,
}

/// An outbound request awaiting its response (ORQ entry, one ORD credit): an RDMA
/// Read Request, or an RFC 7306 Atomic Request of WR `seq` whose Original Remote Data
/// Value goes to the 8 bytes of `sink`.
#[derive(Debug, Clone, Copy)]
enum OrqEntry {
    Read(OrqRead),
    Atomic {
        seq: u64,
        request_id: u32,
        sink: Sge,
    },
}

/// An inbound request, validated, waiting for its response (IRQ entry, one IRD
/// credit).
#[derive(Debug)]
enum IrqEntry {
    /// An RDMA Read Request: the Read Response reads `src` when it is sent.
    Read {
        sink_stag: u32,
        sink_to: u64,
        size: u32,
        src: Option<Piece>,
    },
    /// An Atomic Request on the word at buffer offset `off` of `mr` (checked on
    /// arrival). `original` is the value before the operation once it executed: on
    /// arrival when nothing was queued ahead of it, else when it reaches the head.
    Atomic {
        req: ddp_rdmap::rdmap::AtomicRequestRepr,
        mr: Arc<MemoryRegion>,
        off: usize,
        original: Option<u64>,
    },
}

/// The per-QP protocol engine. See the [module documentation](self).
#[derive(Debug)]
pub struct QpEngine {
    init: QpInit,
    mrs: Arc<MrTable>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    state: QpState,

    // Send queue.
    sq: VecDeque<SqEntry>,
    next_seq: u64,
    /// Sequence number of the next WR to start.
    start_seq: u64,
    tx_sq: Option<tx::Job>,
    tx_rr: Option<tx::Job>,
    last_was_rr: bool,
    send_msn: u32,
    rreq_msn: u32,
    /// MSN of the next Atomic Response sent (QN 3).
    aresp_msn: u32,
    orq: VecDeque<OrqEntry>,
    irq: VecDeque<IrqEntry>,

    // Receive side.
    /// The receive WRs: posted to this QP, or (with an SRQ) the one taken for the
    /// message in progress.
    rq: VecDeque<RqEntry>,
    srq: Option<Arc<SharedReceiveQueue>>,
    /// An SRQ QP entered Error: [`AsyncEvent::QpLastWqeReached`] is due.
    last_wqe_pending: bool,
    q0: UntaggedQueue,
    q1: UntaggedQueue,
    /// QN 3: one buffer per Atomic Request sent, consumed by its Atomic Response.
    q3: UntaggedQueue,
    rx_cache: Option<Arc<MemoryRegion>>,

    // Termination.
    terminate_out: Option<Vec<u8>>,
    stream_closed: bool,
    cq_overflow: Option<u32>,
    comm_est: bool,
    sqd_notified: bool,
    events: VecDeque<QpEvent>,
    counters: Arc<WqCounters>,
}

impl QpEngine {
    /// Creates a QP in Reset (`ibv_create_qp(3)`).
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidHandle`] if `init.pd` is not allocated in `mrs`;
    /// [`VerbsError::InvalidArgument`] `"max_send_wr"` (0) or `"ord"` / `"ird"`
    /// (above [`MAX_ORD_IRD`]).
    pub fn new(
        init: QpInit,
        mrs: Arc<MrTable>,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
    ) -> Result<QpEngine, VerbsError> {
        if !mrs.pd_exists(init.pd) {
            return Err(VerbsError::InvalidHandle {
                object: verbs::ObjectKind::Pd,
                handle: init.pd.raw(),
            });
        }
        if init.cap.max_send_wr == 0 {
            return Err(VerbsError::InvalidArgument {
                what: "max_send_wr",
            });
        }
        if init.ord > MAX_ORD_IRD {
            return Err(VerbsError::InvalidArgument { what: "ord" });
        }
        if init.ird > MAX_ORD_IRD {
            return Err(VerbsError::InvalidArgument { what: "ird" });
        }
        let mut qp = QpEngine {
            init,
            mrs,
            send_cq,
            recv_cq,
            state: QpState::Reset,
            sq: VecDeque::new(),
            next_seq: 0,
            start_seq: 0,
            tx_sq: None,
            tx_rr: None,
            last_was_rr: false,
            send_msn: 1,
            rreq_msn: 1,
            aresp_msn: 1,
            orq: VecDeque::new(),
            irq: VecDeque::new(),
            rq: VecDeque::new(),
            srq: None,
            last_wqe_pending: false,
            q0: UntaggedQueue::new(),
            q1: UntaggedQueue::new(),
            q3: UntaggedQueue::new(),
            rx_cache: None,
            terminate_out: None,
            stream_closed: false,
            cq_overflow: None,
            comm_est: false,
            sqd_notified: false,
            events: VecDeque::new(),
            counters: Arc::new(WqCounters::default()),
        };
        qp.reset_protocol();
        Ok(qp)
    }

    // ------------------------------------------------------------------ getters

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.init.qp_num
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// The creation parameters (ORD/IRD as last set).
    pub fn init(&self) -> &QpInit {
        &self.init
    }

    /// Send WRs accepted and not yet completed (SQ occupancy, in WRs).
    pub fn sq_outstanding(&self) -> usize {
        self.sq.len()
    }

    /// Receive WRs posted and not yet completed (RQ occupancy, in WRs).
    pub fn rq_outstanding(&self) -> usize {
        self.rq.len()
    }

    /// Outbound Read Requests and Atomic Requests awaiting a response (ORQ; at most
    /// ORD together).
    pub fn reads_outstanding(&self) -> usize {
        self.orq.len()
    }

    /// Inbound Read Requests and Atomic Requests queued or being answered (at most
    /// IRD together).
    pub fn read_responses_pending(&self) -> usize {
        self.irq.len() + usize::from(self.tx_rr.is_some())
    }

    /// True once a Terminate was sent or received, or the QP entered Error: no ULPDU
    /// is processed any more, and none is produced once the queued Terminate (if
    /// any) was transmitted.
    pub fn is_terminated(&self) -> bool {
        self.stream_closed
    }

    /// The SRQ the QP takes its receive WRs from, if attached.
    pub fn srq(&self) -> Option<&Arc<SharedReceiveQueue>> {
        self.srq.as_ref()
    }

    /// The QP's [`WqCounters`] (shared: clone the `Arc` to read them from another
    /// thread).
    pub fn counters(&self) -> &Arc<WqCounters> {
        &self.counters
    }

    /// True if a Terminate is queued and not yet handed out (by
    /// [`QpEngine::poll_transmit`] or [`QpEngine::take_terminate`]).
    pub fn terminate_pending(&self) -> bool {
        self.terminate_out.is_some()
    }

    // ------------------------------------------------------------------ mutators

    /// Changes the QP state (`ibv_modify_qp(3)` with `IBV_QP_STATE`), checked with
    /// [`check_transition`]. To Error: flushes every outstanding WR (no Terminate is
    /// sent; the driver closes the connection). To Reset: flushes the same way, then
    /// clears every queue and counter (MSNs back to 1). To SQD: no new send WR
    /// starts; [`AsyncEvent::SqDrained`] is reported once nothing is in flight.
    ///
    /// # Errors
    ///
    /// [`VerbsError::IllegalTransition`].
    pub fn modify_state(&mut self, to: QpState) -> Result<(), VerbsError> {
        check_transition(self.state, to)?;
        match to {
            QpState::Error => self.enter_error(None, None),
            QpState::Reset => {
                if self.state != QpState::Error {
                    self.enter_error(None, None);
                }
                self.reset_protocol();
                self.state = QpState::Reset;
            }
            QpState::Sqd => {
                self.state = QpState::Sqd;
                self.sqd_notified = false;
                self.check_sq_drained();
            }
            other => self.state = other,
        }
        self.after_op();
        Ok(())
    }

    /// Sets ORD and IRD, e.g. to the values negotiated in the MPA Rev 2 IRD/ORD word
    /// (RFC 6581 §3). Allowed in Reset and Init.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidQpState`] in other states; [`VerbsError::InvalidArgument`]
    /// `"ord"` / `"ird"` above [`MAX_ORD_IRD`].
    pub fn set_ord_ird(&mut self, ord: u32, ird: u32) -> Result<(), VerbsError> {
        if !matches!(self.state, QpState::Reset | QpState::Init) {
            return Err(VerbsError::InvalidQpState {
                op: "set_ord_ird",
                state: self.state,
            });
        }
        if ord > MAX_ORD_IRD {
            return Err(VerbsError::InvalidArgument { what: "ord" });
        }
        if ird > MAX_ORD_IRD {
            return Err(VerbsError::InvalidArgument { what: "ird" });
        }
        self.init.ord = ord;
        self.init.ird = ird;
        self.q1 = UntaggedQueue::new();
        for _ in 0..ird {
            self.q1.post_buffer(READ_REQUEST_BUFFER);
        }
        Ok(())
    }

    /// Sets the incoming remote operations the QP accepts (`qp_access_flags` of
    /// `ibv_modify_qp(3)`): `REMOTE_WRITE` for RDMA Writes, `REMOTE_READ` for RDMA
    /// Read Requests; other bits are ignored. Allowed in every state.
    pub fn set_access(&mut self, access: AccessFlags) {
        self.init.access = access;
    }

    /// Attaches the QP to `srq` (`ibv_qp_init_attr.srq`): from now on its receive WRs
    /// come from the SRQ (see the [module documentation](self)), and
    /// [`QpEngine::post_recv`] fails. Allowed in Reset, before any receive WR is
    /// posted; once only.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidQpState`] outside Reset; [`VerbsError::InvalidArgument`]
    /// `"srq"` when already attached or receive WRs are posted.
    pub fn attach_srq(&mut self, srq: Arc<SharedReceiveQueue>) -> Result<(), VerbsError> {
        if self.state != QpState::Reset {
            return Err(VerbsError::InvalidQpState {
                op: "attach_srq",
                state: self.state,
            });
        }
        if self.srq.is_some() || !self.rq.is_empty() {
            return Err(VerbsError::InvalidArgument { what: "srq" });
        }
        self.srq = Some(srq);
        Ok(())
    }

    /// Flushes every WR still in the attached SRQ onto this QP's receive CQ
    /// ([`WcStatus::WrFlushErr`], this QP's number), oldest first: what the device's end
    /// does with an SRQ through one of its QPs, so that every WR posted to the SRQ
    /// completes once. Returns how many were flushed (0 without an SRQ).
    pub fn flush_srq(&mut self) -> usize {
        let Some(srq) = &self.srq else { return 0 };
        let left = srq.drain();
        let qp_num = self.qp_num();
        for wr in &left {
            self.push_recv_wc(WorkCompletion::flushed(wr.wr_id, WcOpcode::Recv, qp_num));
        }
        self.after_op();
        left.len()
    }

    /// Sets the first DDP MSNs (RFC 5041 §4.3) of the two untagged queues the QP
    /// shares with an MPA peer-to-peer RTR (RFC 6581): `send_tx` / `send_rx` for QN 0
    /// (Sends, Immediate Data), `read_tx` / `read_rx` for QN 1 (Read Requests). A
    /// Send or Read RTR consumes MSN 1 of its queue, so the ULP starts at 2
    /// (`mpa_conn::InitialMsn`). Allowed in Reset and Init, before any message;
    /// receive WRs already posted keep their order.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidQpState`] in other states;
    /// [`VerbsError::InvalidArgument`] `"msn"` for 0 or above [`MAX_INITIAL_MSN`].
    pub fn set_initial_msn(
        &mut self,
        send_tx: u32,
        send_rx: u32,
        read_tx: u32,
        read_rx: u32,
    ) -> Result<(), VerbsError> {
        if !matches!(self.state, QpState::Reset | QpState::Init) {
            return Err(VerbsError::InvalidQpState {
                op: "set_initial_msn",
                state: self.state,
            });
        }
        if [send_tx, send_rx, read_tx, read_rx]
            .iter()
            .any(|&m| m == 0 || m > MAX_INITIAL_MSN)
        {
            return Err(VerbsError::InvalidArgument { what: "msn" });
        }
        use ddp_rdmap::rdmap::{QN_READ_REQUEST, QN_SEND};
        // Skip MSNs below the first by accepting zero-length messages into
        // zero-length buffers, then post the real buffers again in order.
        let skip = |q: &mut UntaggedQueue, qn: u32, first: u32| {
            for msn in 1..first {
                q.post_buffer(0);
                // Cannot fail: MSN, MO 0 and length 0 match the buffer just posted.
                let _ = q.accept(qn, msn, 0, 0, true);
            }
        };
        let mut q0 = UntaggedQueue::new();
        skip(&mut q0, QN_SEND, send_rx);
        for r in &self.rq {
            let len: u64 = r.sges.iter().map(|s| u64::from(s.length)).sum();
            q0.post_buffer(u32::try_from(len).unwrap_or(u32::MAX));
        }
        let mut q1 = UntaggedQueue::new();
        skip(&mut q1, QN_READ_REQUEST, read_rx);
        for _ in 0..self.init.ird {
            q1.post_buffer(READ_REQUEST_BUFFER);
        }
        self.q0 = q0;
        self.q1 = q1;
        self.send_msn = send_tx;
        self.rreq_msn = read_tx;
        Ok(())
    }

    /// Takes the queued Terminate ULPDU, if any, instead of receiving it from
    /// [`QpEngine::poll_transmit`]: a driver whose transport sends a Terminate on a
    /// separate path (the stack's `Ulp::poll_terminate`) calls this first.
    pub fn take_terminate(&mut self) -> Option<Vec<u8>> {
        self.terminate_out.take()
    }

    /// Posts a send WR (`ibv_post_send(3)`).
    ///
    /// Accepted in RTS and SQD (queued; in SQD it starts once the QP is back in
    /// RTS) and in Error / SQE, where it completes at once with
    /// [`WcStatus::WrFlushErr`] (siw behaviour). Local checks that need the MR table
    /// (lkey, PD, bounds) run when the WR starts and fail it with
    /// [`WcStatus::LocProtErr`].
    ///
    /// # Errors
    ///
    /// Those of [`SendWr::validate`] against the QP's [`QpCap`];
    /// [`VerbsError::Unsupported`] for an RDMA Read or an atomic when ORD is 0;
    /// [`VerbsError::InvalidArgument`] `"remote_addr"` when an RDMA Write's or
    /// Read's remote range wraps past 2^64;
    /// [`VerbsError::InvalidQpState`] in Reset, Init, RTR;
    /// [`VerbsError::QueueFull`] with `max_send_wr` WRs outstanding.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), VerbsError> {
        let len = validate_send_wr(&self.init.cap, self.init.ord, &wr)?;
        match self.state {
            QpState::Rts | QpState::Sqd => {}
            QpState::Error | QpState::Sqe => {
                let wc = WorkCompletion::flushed(wr.wr_id, wr.op.wc_opcode(), self.qp_num());
                self.counters.retire_sq(1);
                self.push_send_wc(wc);
                self.after_op();
                return Ok(());
            }
            state => {
                return Err(VerbsError::InvalidQpState {
                    op: "post_send",
                    state,
                })
            }
        }
        if self.sq.len() >= self.init.cap.max_send_wr as usize {
            return Err(VerbsError::QueueFull {
                queue: verbs::WorkQueue::Send,
                depth: self.init.cap.max_send_wr,
            });
        }
        let reads_total = match (&wr.op, &wr.payload) {
            (SendOp::RdmaRead { .. }, Payload::Sges(sges)) => {
                let n = sges.iter().filter(|s| s.length > 0).count() as u32;
                n.max(1)
            }
            _ => 0,
        };
        let signaled = self.init.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.sq.push_back(SqEntry {
            seq,
            wr,
            signaled,
            len,
            phase: Phase::Queued,
            reads_total,
            reads_done: 0,
        });
        Ok(())
    }

    /// Posts a receive WR (`ibv_post_recv(3)`). Receive WRs are consumed in posting
    /// order, one per incoming Send or Immediate Data message (RFC 5040 §5.3: MSN
    /// *n* on QN 0 lands in the *n*-th one).
    ///
    /// Accepted in every state but Reset; in Error it completes at once with
    /// [`WcStatus::WrFlushErr`].
    ///
    /// # Errors
    ///
    /// Those of [`RecvWr::validate`]; [`VerbsError::InvalidQpState`] in Reset;
    /// [`VerbsError::QueueFull`] with `max_recv_wr` WRs outstanding;
    /// [`VerbsError::InvalidArgument`] `"qp with an SRQ"` on a QP attached to an SRQ
    /// (`EINVAL`, as rdma-core's providers: its receives go to the SRQ).
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), VerbsError> {
        if self.srq.is_some() {
            return Err(VerbsError::InvalidArgument {
                what: "qp with an SRQ",
            });
        }
        wr.validate(&self.init.cap)?;
        match self.state {
            QpState::Reset => {
                return Err(VerbsError::InvalidQpState {
                    op: "post_recv",
                    state: self.state,
                })
            }
            QpState::Error => {
                let wc = WorkCompletion::flushed(wr.wr_id, WcOpcode::Recv, self.qp_num());
                self.retire_recv(1);
                self.push_recv_wc(wc);
                self.after_op();
                return Ok(());
            }
            _ => {}
        }
        if self.rq.len() >= self.init.cap.max_recv_wr as usize {
            return Err(VerbsError::QueueFull {
                queue: verbs::WorkQueue::Recv,
                depth: self.init.cap.max_recv_wr,
            });
        }
        // RecvWr::validate bounds the total by u32::MAX.
        let len = u32::try_from(wr.len()).unwrap_or(u32::MAX);
        self.q0.post_buffer(len);
        let n = wr.sg_list.len();
        self.rq.push_back(RqEntry {
            wr_id: wr.wr_id,
            sges: wr.sg_list,
            resolved: vec![None; n],
        });
        Ok(())
    }

    // ------------------------------------------------------------------ output

    /// The next event, oldest first.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    /// True if [`QpEngine::poll_transmit`] may produce a ULPDU now: a Terminate is queued,
    /// a message or Read Response is in progress, or a WR or Read Request waits and
    /// is not blocked by fence, ORD or the tagged-interleaving rule. (It may still
    /// produce nothing if the next WR is local or fails its checks.)
    pub fn wants_transmit(&self) -> bool {
        if self.terminate_out.is_some() {
            return true;
        }
        if self.stream_closed || !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return false;
        }
        if self.tx_rr.is_some() || (!self.irq.is_empty() && !self.sq_job_tagged()) {
            return true;
        }
        match &self.tx_sq {
            Some(job) => self.job_ready(job),
            None => self.state == QpState::Rts && self.next_startable().is_some(),
        }
    }

    // ------------------------------------------------------------------ internals

    fn reset_protocol(&mut self) {
        self.sq.clear();
        self.rq.clear();
        self.start_seq = self.next_seq;
        self.tx_sq = None;
        self.tx_rr = None;
        self.last_was_rr = false;
        self.send_msn = 1;
        self.rreq_msn = 1;
        self.aresp_msn = 1;
        self.orq.clear();
        self.irq.clear();
        self.q0 = UntaggedQueue::new();
        self.q1 = UntaggedQueue::new();
        self.q3 = UntaggedQueue::new();
        for _ in 0..self.init.ird {
            self.q1.post_buffer(READ_REQUEST_BUFFER);
        }
        self.rx_cache = None;
        self.terminate_out = None;
        self.stream_closed = false;
        self.comm_est = false;
        self.sqd_notified = false;
    }

    fn index_of(&self, seq: u64) -> Option<usize> {
        let front = self.sq.front()?.seq;
        let i = usize::try_from(seq.checked_sub(front)?).ok()?;
        (i < self.sq.len()).then_some(i)
    }

    fn entry_mut(&mut self, seq: u64) -> Option<&mut SqEntry> {
        let i = self.index_of(seq)?;
        self.sq.get_mut(i)
    }

    fn push_send_wc(&mut self, wc: WorkCompletion) {
        if self.send_cq.push(wc).is_err() {
            self.cq_overflow.get_or_insert(self.send_cq.handle());
        }
    }

    fn push_recv_wc(&mut self, wc: WorkCompletion) {
        if self.recv_cq.push(wc).is_err() {
            self.cq_overflow.get_or_insert(self.recv_cq.handle());
        }
    }

    /// Counts `n` receive WRs of the QP's own receive queue as retired (WRs taken from
    /// an SRQ were never posted to the QP, so they are not counted).
    fn retire_recv(&mut self, n: u64) {
        if self.srq.is_none() {
            self.counters.retire_rq(n);
        }
    }

    /// The PD the receive WRs' SGEs belong to: the SRQ's when attached, else the QP's.
    fn recv_pd(&self) -> PdId {
        self.srq.as_ref().map_or(self.init.pd, |s| s.pd())
    }

    /// With an SRQ: takes the SRQ's oldest WR for the message the segment (`msn`,
    /// `mo`) starts, if it starts the next message and the QP holds no WR yet (siw
    /// `siw_rqe_get` at a message's first segment). Anything else is left to the
    /// untagged queue's checks: a segment that starts no new message, and an empty SRQ,
    /// are refused there ("no buffer available" when no WR could be taken).
    fn take_srq_wqe(&mut self, msn: u32, mo: u32) {
        let Some(srq) = &self.srq else { return };
        if mo != 0
            || self.q0.posted() > 0
            || self.q0.expected_mo().is_some()
            || msn != self.q0.next_msn()
        {
            return;
        }
        let Some((wr, event)) = srq.take() else {
            return;
        };
        if let Some(e) = event {
            tracing::debug!(srq = srq.handle(), "SRQ limit reached");
            self.events.push_back(QpEvent::Async(e));
        }
        // RecvWr::validate (at post) bounds the total by u32::MAX.
        self.q0
            .post_buffer(u32::try_from(wr.len()).unwrap_or(u32::MAX));
        let n = wr.sg_list.len();
        self.rq.push_back(RqEntry {
            wr_id: wr.wr_id,
            sges: wr.sg_list,
            resolved: vec![None; n],
        });
    }

    /// Completes finished send WRs from the head of the SQ, in order.
    fn retire(&mut self) {
        while let Some(front) = self.sq.front() {
            if front.phase != Phase::Done {
                break;
            }
            let Some(e) = self.sq.pop_front() else { break };
            self.counters.retire_sq(1);
            if e.signaled {
                let mut wc = WorkCompletion::new(
                    e.wr.wr_id,
                    WcStatus::Success,
                    e.wr.op.wc_opcode(),
                    self.qp_num(),
                );
                wc.byte_len = if e.wr.op.is_local() { 0 } else { e.len };
                self.push_send_wc(wc);
            }
        }
        self.check_sq_drained();
    }

    /// Marks the WR `seq` finished and completes what can be completed.
    fn finish(&mut self, seq: u64) {
        if let Some(e) = self.entry_mut(seq) {
            e.phase = Phase::Done;
        }
        self.retire();
    }

    fn check_sq_drained(&mut self) {
        if self.state != QpState::Sqd || self.sqd_notified {
            return;
        }
        let in_flight = self.tx_sq.is_some() || self.sq.iter().any(|e| e.phase == Phase::Started);
        if !in_flight {
            self.sqd_notified = true;
            self.events.push_back(QpEvent::Async(AsyncEvent::SqDrained {
                qp_num: self.qp_num(),
            }));
        }
    }

    /// Moves to Error and flushes: every send WR, then every receive WR, in
    /// posting order. `sq_err` names the send WR (by sequence number) the error
    /// concerns and its status; `rq_err` gives the status of the oldest receive WR.
    /// Both carry the `vendor_err`.
    fn enter_error(
        &mut self,
        sq_err: Option<(u64, WcStatus, u32)>,
        rq_err: Option<(WcStatus, u32)>,
    ) {
        let entered = self.state != QpState::Error;
        self.state = QpState::Error;
        self.stream_closed = true;
        self.tx_sq = None;
        self.tx_rr = None;
        self.orq.clear();
        self.irq.clear();
        self.rx_cache = None;
        let qp_num = self.qp_num();
        let sq: Vec<SqEntry> = self.sq.drain(..).collect();
        self.counters.retire_sq(sq.len() as u64);
        for e in sq {
            let (status, vendor) = match sq_err {
                Some((seq, st, v)) if seq == e.seq => (st, v),
                _ => (WcStatus::WrFlushErr, 0),
            };
            let mut wc = WorkCompletion::new(e.wr.wr_id, status, e.wr.op.wc_opcode(), qp_num);
            wc.vendor_err = vendor;
            self.push_send_wc(wc);
        }
        self.start_seq = self.next_seq;
        let rq: Vec<RqEntry> = self.rq.drain(..).collect();
        self.retire_recv(rq.len() as u64);
        for (i, r) in rq.into_iter().enumerate() {
            let (status, vendor) = match rq_err {
                Some((st, v)) if i == 0 => (st, v),
                _ => (WcStatus::WrFlushErr, 0),
            };
            let mut wc = WorkCompletion::new(r.wr_id, status, WcOpcode::Recv, qp_num);
            wc.vendor_err = vendor;
            self.push_recv_wc(wc);
        }
        self.q0 = UntaggedQueue::new();
        // Its taken WR is completed above; nothing more is taken from the SRQ. Reported
        // by `after_op`, behind the event of the error itself.
        self.last_wqe_pending |= entered && self.srq.is_some();
    }

    /// Queues `repr` as the final ULPDU.
    fn queue_terminate(&mut self, repr: &ddp_rdmap::terminate::Repr) {
        use ddp_rdmap::ddp::BufferModel;
        let header = ddp_rdmap::Header {
            opcode: Opcode::Terminate,
            last: true,
            buffer: BufferModel::Untagged {
                rsvd_ulp: 0,
                qn: ddp_rdmap::rdmap::QN_TERMINATE,
                msn: 1,
                mo: 0,
            },
        };
        let hlen = header.buffer_len();
        let mut bytes = vec![0u8; hlen + repr.buffer_len()];
        // Cannot fail: the buffer is sized by buffer_len and the cause's nibbles
        // come from the tables.
        let ok = header.emit(&mut bytes).is_ok()
            && bytes.get_mut(hlen..).is_some_and(|b| repr.emit(b).is_ok());
        if ok {
            self.terminate_out = Some(bytes);
        }
        self.events
            .push_back(QpEvent::TerminateQueued { cause: repr.cause });
    }

    /// A local failure of WR `seq` (or of no WR): completes it with `status`,
    /// queues an RDMAP Local Catastrophic Terminate, moves to Error.
    fn local_failure(&mut self, sq_err: Option<(u64, WcStatus)>, rq_err: Option<WcStatus>) {
        self.local_failure_with(
            sq_err,
            rq_err,
            AsyncEvent::QpFatal {
                qp_num: self.qp_num(),
            },
        );
    }

    /// [`QpEngine::local_failure`] reporting `event`.
    fn local_failure_with(
        &mut self,
        sq_err: Option<(u64, WcStatus)>,
        rq_err: Option<WcStatus>,
        event: AsyncEvent,
    ) {
        if self.state == QpState::Error {
            return;
        }
        let cause = ErrorCause::RdmapLocalCatastrophic { code: 0 };
        tracing::debug!(qp = self.qp_num(), ?sq_err, ?rq_err, "local failure");
        self.queue_terminate(&ddp_rdmap::terminate::Repr::for_error(cause, None));
        self.enter_error(sq_err.map(|(s, st)| (s, st, 0)), rq_err.map(|st| (st, 0)));
        self.events.push_back(QpEvent::Async(event));
    }

    /// Runs after every public entry point: turns a CQ overflow into QP Error.
    /// Then reports [`AsyncEvent::QpLastWqeReached`] if an SRQ QP entered Error.
    fn after_op(&mut self) {
        if let Some(cq) = self.cq_overflow.take() {
            self.events.push_back(QpEvent::CqOverflow { cq });
            if self.state != QpState::Error {
                self.local_failure(None, None);
            }
            // Flushing into a broken CQ overflows again; that is already reported.
            self.cq_overflow = None;
        }
        if std::mem::take(&mut self.last_wqe_pending) {
            self.events
                .push_back(QpEvent::Async(AsyncEvent::QpLastWqeReached {
                    qp_num: self.qp_num(),
                }));
        }
    }

    /// The first startable WR's sequence number, if the head of the unstarted WRs
    /// may start now (fence and tagged-interleaving rules; ORD is checked when the
    /// Read Request is sent).
    fn next_startable(&self) -> Option<u64> {
        let i = self.index_of(self.start_seq)?;
        let e = self.sq.get(i)?;
        if e.wr.flags.contains(SendFlags::FENCE)
            && self
                .sq
                .iter()
                .take(i)
                .any(|p| p.wr.op.uses_ord() && p.phase != Phase::Done)
        {
            return None;
        }
        if matches!(
            e.wr.op,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }
        ) && self.tx_rr.is_some()
        {
            return None;
        }
        Some(e.seq)
    }

    /// Resolves the local SGEs of a WR: lkey index, key, PD, valid, rights, bounds
    /// (siw `siw_check_sgl_tx`). Zero-length SGEs are skipped.
    fn resolve_sges(&self, sges: &[Sge], needed: AccessFlags) -> Option<Vec<Piece>> {
        let mut pieces = Vec::with_capacity(sges.len());
        for s in sges.iter().filter(|s| s.length > 0) {
            let (mr, off) = self
                .mrs
                .check(s.lkey, self.init.pd, s.addr, u64::from(s.length), needed)
                .ok()?;
            pieces.push(Piece {
                mr,
                off,
                len: s.length as usize,
            });
        }
        Some(pieces)
    }

    /// Tagged placement by `stag`: through the cached MR if it still holds that index,
    /// else after a table lookup (which becomes the cache). Keeps the FPDU path at one
    /// lock acquisition (the MR's) and no reference-count traffic in the common case.
    /// `None` if no MR has the STag's index; otherwise the outcome of the MR's checks
    /// 2-6 and the copy ([`MemoryRegion::place`]).
    fn place_tagged(
        &mut self,
        stag: Stag,
        to: u64,
        data: &[u8],
        needed: AccessFlags,
    ) -> Option<Result<(), crate::resources::stag_table::ProtectionError>> {
        let cached = self
            .rx_cache
            .as_ref()
            .is_some_and(|m| m.index() == stag.index() && !m.is_deregistered());
        if !cached {
            self.rx_cache = Some(self.mrs.lookup(stag)?);
        }
        let pd = self.init.pd;
        self.rx_cache
            .as_ref()
            .map(|mr| mr.place(stag, pd, to, data, needed))
    }

    fn sq_job_tagged(&self) -> bool {
        self.tx_sq.as_ref().is_some_and(tx::Job::is_tagged)
    }

    fn job_ready(&self, job: &tx::Job) -> bool {
        match job {
            tx::Job::ReadRequests { .. } | tx::Job::Atomic { .. } => {
                (self.orq.len() as u64) < u64::from(self.init.ord)
            }
            tx::Job::Message(_) => true,
        }
    }
}

/// Helper for tests and drivers that want a ULPDU as a vector:
/// [`QpEngine::poll_transmit`] into a fresh `Vec<u8>`.
impl QpEngine {
    /// [`QpEngine::poll_transmit`] into a new vector: `Ok(Some(ulpdu))` if one was
    /// produced.
    ///
    /// # Errors
    ///
    /// As [`QpEngine::poll_transmit`].
    pub fn poll_transmit_vec(&mut self, mulpdu: usize) -> Result<Option<Vec<u8>>, TxError> {
        let mut v = Vec::new();
        Ok(self.poll_transmit(mulpdu, &mut v)?.then_some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_is_send() {
        fn is_send<T: Send>() {}
        is_send::<QpEngine>();
    }

    #[test]
    fn vendor_err_layout() {
        use ddp_rdmap::terminate::DdpUntaggedCode;
        let c = ErrorCause::DdpUntagged(DdpUntaggedCode::MessageTooLong);
        assert_eq!(vendor_err_for(c), 0x1205);
        assert_eq!(status_for_terminate(c), WcStatus::RemInvReqErr);
    }
}
