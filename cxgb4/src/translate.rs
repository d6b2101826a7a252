//! The translation tables between `verbs` values and rdma-core's numbers:
//! pure functions, no FFI call, testable without rdma-core or root.
//!
//! | from | to | function |
//! |---|---|---|
//! | [`SendWr`] | `struct ibv_send_wr` (opcode, flags, imm/invalidate, `wr.rdma` / `wr.atomic`) + SGEs | [`send_wr_to_ibv`] |
//! | [`RecvWr`] | SGEs of `struct ibv_recv_wr` | [`recv_sges`] |
//! | `struct ibv_wc` | [`WorkCompletion`] | [`wc_from_ibv`] |
//! | [`AccessFlags`] | `int access` of `ibv_reg_mr` | [`mr_access_to_ibv`] |
//! | `enum rdma_cm_event_type` | [`CmEventKind`] | [`CmEventKind::from_raw`] |
//! | errno | [`VerbsError`] | [`verbs_error`], [`post_error`] |
//! | `struct ibv_async_event` | [`verbs::AsyncEvent`] | [`async_event_from_ibv`] |
//!
//! Numbers are those of rdma-core 44's `<infiniband/verbs.h>` and
//! `<rdma/rdma_cma.h>`.

use crate::ffi::handles::{RawAsyncEvent, SendPayload};
use crate::ffi::types::{IbvAtomicWr, IbvRdmaWr, IbvSendWr, IbvSendWrWr, IbvSge, IbvWc};
use core::ptr;
use verbs::{
    errno, AccessFlags, AsyncEvent, AsyncEventType, Payload, RecvWr, SendOp, SendWr, Sge, Stag,
    VerbsError, WcFlags, WcOpcode, WcStatus, WorkCompletion, WorkQueue,
};

/// The most SGEs one WR may carry through this crate: the size of the stack
/// array a post builds (no heap per post). Chelsio T5/T6 allow 17 per send
/// WR and 4 per receive WR (notes section 2), siw 6, so 32 is above both.
pub const MAX_SGE_PER_WR: usize = 32;

/// `IBV_WC_WITH_IMM` (1 << 1) of `enum ibv_wc_flags`.
pub const IBV_WC_WITH_IMM: u32 = 1 << 1;
/// `IBV_WC_WITH_INV` (1 << 3) of `enum ibv_wc_flags`.
pub const IBV_WC_WITH_INV: u32 = 1 << 3;

/// SGEs of one WR in a stack array.
#[derive(Clone, Copy)]
pub struct SgeArray {
    sges: [IbvSge; MAX_SGE_PER_WR],
    len: usize,
}

impl SgeArray {
    /// The SGEs of `sg_list`, as `struct ibv_sge`.
    ///
    /// # Errors
    ///
    /// [`VerbsError::TooManySges`] above [`MAX_SGE_PER_WR`].
    pub fn new(sg_list: &[Sge]) -> Result<SgeArray, VerbsError> {
        if sg_list.len() > MAX_SGE_PER_WR {
            return Err(VerbsError::TooManySges {
                num_sge: sg_list.len(),
                max: MAX_SGE_PER_WR as u32,
            });
        }
        let mut sges = [IbvSge::default(); MAX_SGE_PER_WR];
        for (dst, s) in sges.iter_mut().zip(sg_list) {
            *dst = IbvSge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey.raw(),
            };
        }
        Ok(SgeArray {
            sges,
            len: sg_list.len(),
        })
    }

    /// The SGEs in use.
    pub fn as_slice(&self) -> &[IbvSge] {
        &self.sges[..self.len]
    }
}

/// The payload of a translated send WR. Lives on the post call's stack for
/// the call's duration, so the SGE array's size is meant (no heap per post).
#[derive(Clone, Copy)]
#[allow(clippy::large_enum_variant)]
pub enum IbvPayload<'a> {
    /// SGEs in registered memory.
    Sges(SgeArray),
    /// Inline bytes (`IBV_SEND_INLINE`).
    Inline(&'a [u8]),
}

impl IbvPayload<'_> {
    /// The form [`crate::ffi::handles::RawQp::post_send`] takes.
    pub fn as_send_payload(&self) -> SendPayload<'_> {
        match self {
            IbvPayload::Sges(a) => SendPayload::Sges(a.as_slice()),
            IbvPayload::Inline(d) => SendPayload::Inline(d),
        }
    }
}

/// A zeroed `ibv_send_wr` (all pointers null).
fn empty_send_wr() -> IbvSendWr {
    IbvSendWr {
        wr_id: 0,
        next: ptr::null_mut(),
        sg_list: ptr::null_mut(),
        num_sge: 0,
        opcode: 0,
        send_flags: 0,
        imm_data_or_invalidate_rkey: 0,
        wr: IbvSendWrWr {
            atomic: IbvAtomicWr::default(),
        },
        qp_type_xrc_remote_srqn: 0,
        _bind_mw_tso: [0; 6],
    }
}

/// Translates a send WR: `opcode` from [`SendOp::to_ibv`], `send_flags` the
/// [`verbs::SendFlags`] bits (same values), `imm_data` in network byte order
/// for RDMA Write with Immediate, `invalidate_rkey` (host order) for Send
/// with Invalidate and Local Invalidate, `wr.rdma` for Writes and Reads,
/// `wr.atomic` for atomics (`compare_add` = compare or add). The WR's
/// pointers are left null: the post call sets them.
///
/// # Errors
///
/// [`VerbsError::Unsupported`] for [`SendOp::FastReg`] (no libibverbs
/// opcode), [`VerbsError::TooManySges`] above [`MAX_SGE_PER_WR`].
pub fn send_wr_to_ibv(wr: &SendWr) -> Result<(IbvSendWr, IbvPayload<'_>), VerbsError> {
    let Some(opcode) = wr.op.to_ibv() else {
        return Err(VerbsError::Unsupported {
            what: "fast registration (no libibverbs opcode)",
        });
    };
    let mut out = empty_send_wr();
    out.wr_id = wr.wr_id;
    out.opcode = opcode;
    out.send_flags = wr.flags.bits();
    match wr.op {
        SendOp::Send | SendOp::FastReg(_) => {}
        SendOp::SendWithInv { invalidate_rkey } => {
            out.imm_data_or_invalidate_rkey = invalidate_rkey.raw();
        }
        SendOp::LocalInv { invalidate_stag } => {
            out.imm_data_or_invalidate_rkey = invalidate_stag.raw();
        }
        SendOp::RdmaWrite { remote_addr, rkey } | SendOp::RdmaRead { remote_addr, rkey } => {
            out.wr.rdma = IbvRdmaWr {
                remote_addr,
                rkey: rkey.raw(),
            };
        }
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm_data,
        } => {
            out.imm_data_or_invalidate_rkey = imm_data.to_be();
            out.wr.rdma = IbvRdmaWr {
                remote_addr,
                rkey: rkey.raw(),
            };
        }
        SendOp::AtomicCmpSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            out.wr.atomic = IbvAtomicWr {
                remote_addr,
                compare_add: compare,
                swap,
                rkey: rkey.raw(),
            };
        }
        SendOp::AtomicFetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            out.wr.atomic = IbvAtomicWr {
                remote_addr,
                compare_add: add,
                swap: 0,
                rkey: rkey.raw(),
            };
        }
    }
    let payload = match &wr.payload {
        Payload::Sges(sges) => IbvPayload::Sges(SgeArray::new(sges)?),
        Payload::Inline(data) => IbvPayload::Inline(data),
    };
    Ok((out, payload))
}

/// The SGEs of a receive WR.
///
/// # Errors
///
/// [`VerbsError::TooManySges`] above [`MAX_SGE_PER_WR`].
pub fn recv_sges(wr: &RecvWr) -> Result<SgeArray, VerbsError> {
    SgeArray::new(&wr.sg_list)
}

/// Translates a completion.
///
/// - `status`: [`WcStatus::from_ibv`]; a value it does not represent (the
///   tag-matching statuses 22, 23) becomes [`WcStatus::GeneralErr`], with
///   `vendor_err` kept.
/// - `opcode`: [`WcOpcode::from_ibv`]. On an error completion `ibv_wc.opcode`
///   is not defined (`ibv_poll_cq(3)`); an unknown value there becomes
///   [`WcOpcode::Send`]. An unknown opcode on a *successful* completion
///   cannot be represented and becomes status [`WcStatus::GeneralErr`].
/// - On success: `byte_len`, and `imm_data` (converted from network byte
///   order) when `IBV_WC_WITH_IMM` is set, the invalidated STag when
///   `IBV_WC_WITH_INV` is set. On an error completion these are left empty
///   (only `wr_id`, `status`, `qp_num`, `vendor_err` are meaningful).
pub fn wc_from_ibv(wc: &IbvWc) -> WorkCompletion {
    let mut status = WcStatus::from_ibv(wc.status).unwrap_or(WcStatus::GeneralErr);
    let opcode = match WcOpcode::from_ibv(wc.opcode) {
        Some(op) => op,
        None => {
            if status.is_success() {
                tracing::warn!(
                    opcode = wc.opcode,
                    wr_id = wc.wr_id,
                    "unknown ibv_wc opcode"
                );
                status = WcStatus::GeneralErr;
            }
            WcOpcode::Send
        }
    };
    let mut out = WorkCompletion::new(wc.wr_id, status, opcode, wc.qp_num);
    out.vendor_err = wc.vendor_err;
    if status.is_success() {
        out.byte_len = wc.byte_len;
        if wc.wc_flags & IBV_WC_WITH_IMM != 0 {
            out.imm_data = Some(u32::from_be(wc.imm_data_or_invalidated_rkey));
        }
        if wc.wc_flags & IBV_WC_WITH_INV != 0 {
            out.invalidated_stag = Some(Stag::from_raw(wc.imm_data_or_invalidated_rkey));
        }
    }
    out
}

/// The `ibv_wc_flags` a completion carries (the inverse direction, for tests
/// and tools that print them).
pub fn wc_flags_to_ibv(flags: WcFlags) -> u32 {
    flags.bits()
}

/// The `access` argument of `ibv_reg_mr(3)` for a registration, after the
/// verbs rule (remote write or atomic needs local write).
///
/// # Errors
///
/// [`VerbsError::InvalidAccessFlags`] when the rule fails.
pub fn mr_access_to_ibv(access: AccessFlags) -> Result<i32, VerbsError> {
    Ok(access.validate_for_mr()?.to_ibv() as i32)
}

/// The errno of a failed verbs or CM call as a [`VerbsError`]; `call` names
/// the C function.
///
/// | errno | value | error |
/// |---|---|---|
/// | `EINVAL` | 22 | [`VerbsError::InvalidArgument`] (`what` = the call) |
/// | `ENOMEM` | 12 | [`VerbsError::OutOfResources`] |
/// | `EOPNOTSUPP` / `ENOSYS` | 95 / 38 | [`VerbsError::Unsupported`] |
/// | `ENODEV` | 19 | [`VerbsError::NoDevice`] |
/// | `EIO` | 5 | [`VerbsError::DeviceGone`] (uverbs after disassociation) |
/// | `EPERM` | 1 | [`VerbsError::NotPermitted`] |
/// | other | | [`VerbsError::Os`] with the errno |
pub fn verbs_error(call: &'static str, errno_value: i32) -> VerbsError {
    match errno_value {
        errno::EINVAL => VerbsError::InvalidArgument { what: call },
        errno::ENOMEM => VerbsError::OutOfResources { what: call },
        errno::EOPNOTSUPP | libc::ENOSYS => VerbsError::Unsupported { what: call },
        errno::ENODEV => VerbsError::NoDevice,
        errno::EIO => VerbsError::DeviceGone,
        errno::EPERM => VerbsError::NotPermitted { what: call },
        e => VerbsError::Os { call, errno: e },
    }
}

/// The errno of a failed post call: `ENOMEM` is a full queue of `depth`
/// entries ([`VerbsError::QueueFull`]), as libibverbs providers return it;
/// anything else as [`verbs_error`].
pub fn post_error(queue: WorkQueue, depth: u32, errno_value: i32) -> VerbsError {
    if errno_value == errno::ENOMEM {
        return VerbsError::QueueFull { queue, depth };
    }
    let call = match queue {
        WorkQueue::Send => "ibv_post_send",
        WorkQueue::Recv => "ibv_post_recv",
        WorkQueue::Completion => "ibv_poll_cq",
    };
    verbs_error(call, errno_value)
}

/// An asynchronous event (`ibv_get_async_event(3)`, decoded by the FFI) as
/// a [`verbs::AsyncEvent`]; `None` for the types it does not represent
/// (`IBV_EVENT_PATH_MIG` 6, `_PATH_MIG_ERR` 7, `LID_CHANGE` 11, `PKEY_CHANGE`
/// 12, `SM_CHANGE` 13, `SRQ_ERR` 14, `CLIENT_REREGISTER` 17, `GID_CHANGE` 18,
/// `WQ_FATAL` 19, ...), and `SRQ_LIMIT_REACHED` 15, whose `element.srq` the FFI
/// does not decode (this backend creates no SRQ).
pub fn async_event_from_ibv(ev: &RawAsyncEvent) -> Option<AsyncEvent> {
    let qp_num = ev.qp_num;
    let port = u8::try_from(ev.port_num).unwrap_or(0);
    Some(match AsyncEventType::from_ibv(ev.event_type)? {
        AsyncEventType::CqErr => AsyncEvent::CqErr { cq: ev.cq_handle },
        AsyncEventType::QpFatal => AsyncEvent::QpFatal { qp_num },
        AsyncEventType::QpReqErr => AsyncEvent::QpReqErr { qp_num },
        AsyncEventType::QpAccessErr => AsyncEvent::QpAccessErr { qp_num },
        AsyncEventType::CommEst => AsyncEvent::CommEst { qp_num },
        AsyncEventType::SqDrained => AsyncEvent::SqDrained { qp_num },
        AsyncEventType::QpLastWqeReached => AsyncEvent::QpLastWqeReached { qp_num },
        AsyncEventType::DeviceFatal => AsyncEvent::DeviceFatal,
        AsyncEventType::PortActive => AsyncEvent::PortActive { port },
        AsyncEventType::PortErr => AsyncEvent::PortErr { port },
        AsyncEventType::SrqLimitReached => return None,
    })
}

/// `enum rdma_cm_event_type`, named as rdma_cm names them: the provider-neutral
/// kind of [`verbs::provider`], whose numbers are librdmacm's.
pub use verbs::provider::CmEventKind;

#[cfg(test)]
mod tests {
    use super::*;
    use verbs::{AccessFlagsError, SendFlags};

    fn stag(raw: u32) -> Stag {
        Stag::from_raw(raw)
    }

    /// `enum ibv_wr_opcode` (verbs.h): RDMA_WRITE 0, RDMA_WRITE_WITH_IMM 1,
    /// SEND 2, SEND_WITH_IMM 3, RDMA_READ 4, ATOMIC_CMP_AND_SWP 5,
    /// ATOMIC_FETCH_AND_ADD 6, LOCAL_INV 7, BIND_MW 8, SEND_WITH_INV 9.
    #[test]
    fn send_wr_opcodes_and_fields() {
        let sge = vec![Sge::new(0x1000, 64, stag(0x1a02))];
        let flags = SendFlags::SIGNALED | SendFlags::SOLICITED | SendFlags::FENCE;

        let wr = SendWr::send(1, sge.clone()).with_flags(flags);
        let (w, p) = send_wr_to_ibv(&wr).unwrap();
        assert_eq!((w.wr_id, w.opcode, w.send_flags), (1, 2, 0b111));
        let IbvPayload::Sges(a) = p else {
            panic!("sges")
        };
        assert_eq!(
            a.as_slice(),
            &[IbvSge {
                addr: 0x1000,
                length: 64,
                lkey: 0x1a02
            }]
        );
        assert!(w.sg_list.is_null() && w.next.is_null() && w.num_sge == 0);

        let wr = SendWr::rdma_write(2, sge.clone(), 0x7f00_0000_1000, stag(0x3301));
        let (w, _) = send_wr_to_ibv(&wr).unwrap();
        assert_eq!(w.opcode, 0);
        let r = w.rdma();
        assert_eq!((r.remote_addr, r.rkey), (0x7f00_0000_1000, 0x3301));

        let wr = SendWr::rdma_read(3, sge.clone(), 0x2000, stag(0x4401));
        let (w, _) = send_wr_to_ibv(&wr).unwrap();
        assert_eq!(w.opcode, 4);
        assert_eq!(w.rdma().rkey, 0x4401);

        let mut wr = SendWr::rdma_write(4, sge.clone(), 0x3000, stag(0x5501));
        wr.op = SendOp::RdmaWriteWithImm {
            remote_addr: 0x3000,
            rkey: stag(0x5501),
            imm_data: 0x1122_3344,
        };
        let (w, _) = send_wr_to_ibv(&wr).unwrap();
        assert_eq!(w.opcode, 1);
        // __be32: the bytes in memory are 11 22 33 44.
        assert_eq!(
            w.imm_data_or_invalidate_rkey.to_ne_bytes(),
            [0x11, 0x22, 0x33, 0x44]
        );

        let mut wr = SendWr::send(5, sge.clone());
        wr.op = SendOp::SendWithInv {
            invalidate_rkey: stag(0xabcd_ef01),
        };
        let (w, _) = send_wr_to_ibv(&wr).unwrap();
        assert_eq!((w.opcode, w.imm_data_or_invalidate_rkey), (9, 0xabcd_ef01));

        let wr = SendWr::local_inv(6, stag(0x0102_0304));
        let (w, p) = send_wr_to_ibv(&wr).unwrap();
        assert_eq!((w.opcode, w.imm_data_or_invalidate_rkey), (7, 0x0102_0304));
        let IbvPayload::Sges(a) = p else {
            panic!("sges")
        };
        assert!(a.as_slice().is_empty());

        let mut wr = SendWr::send(7, vec![Sge::new(0x4000, 8, stag(0x11))]);
        wr.op = SendOp::AtomicCmpSwap {
            remote_addr: 0x8000,
            rkey: stag(0x22),
            compare: 5,
            swap: 9,
        };
        let (w, _) = send_wr_to_ibv(&wr).unwrap();
        let a = w.atomic();
        assert_eq!(
            (w.opcode, a.remote_addr, a.compare_add, a.swap, a.rkey),
            (5, 0x8000, 5, 9, 0x22)
        );
        wr.op = SendOp::AtomicFetchAdd {
            remote_addr: 0x8008,
            rkey: stag(0x23),
            add: 3,
        };
        let (w, _) = send_wr_to_ibv(&wr).unwrap();
        let a = w.atomic();
        assert_eq!(
            (w.opcode, a.remote_addr, a.compare_add, a.rkey),
            (6, 0x8008, 3, 0x23)
        );
    }

    #[test]
    fn inline_payload_and_flag_value() {
        let wr = SendWr::send_inline(8, b"hello".to_vec());
        let (w, p) = send_wr_to_ibv(&wr).unwrap();
        // IBV_SEND_INLINE (8) | IBV_SEND_SIGNALED? no: only what the WR says.
        assert_eq!(w.send_flags & crate::ffi::handles::IBV_SEND_INLINE, 8);
        let IbvPayload::Inline(d) = p else {
            panic!("inline")
        };
        assert_eq!(d, b"hello");
    }

    #[test]
    fn fast_reg_and_too_many_sges_are_refused() {
        let reg = verbs::FastReg {
            mr: stag(0x100),
            key: 1,
            access: AccessFlags::LOCAL_WRITE,
            iova: 0,
            length: 4096,
        };
        let e = send_wr_to_ibv(&SendWr::fast_reg(1, reg)).err().unwrap();
        assert_eq!(e.errno(), 95);
        let sges = vec![Sge::new(0, 1, stag(1)); MAX_SGE_PER_WR + 1];
        let e = send_wr_to_ibv(&SendWr::send(1, sges.clone()))
            .err()
            .unwrap();
        assert_eq!(
            e,
            VerbsError::TooManySges {
                num_sge: 33,
                max: 32
            }
        );
        let e = recv_sges(&RecvWr::new(1, sges)).err().unwrap();
        assert_eq!(e.errno(), 22);
        let ok = recv_sges(&RecvWr::new(1, vec![Sge::new(0x10, 4, stag(7)); 4])).unwrap();
        assert_eq!(ok.as_slice().len(), 4);
        assert_eq!(ok.as_slice()[3].lkey, 7);
    }

    fn ibv_wc(status: u32, opcode: u32, flags: u32, imm: u32) -> IbvWc {
        IbvWc {
            wr_id: 0xdead_beef,
            status,
            opcode,
            vendor_err: 0x77,
            byte_len: 4096,
            imm_data_or_invalidated_rkey: imm,
            qp_num: 0x12,
            wc_flags: flags,
            ..IbvWc::default()
        }
    }

    /// `enum ibv_wc_opcode`: SEND 0, RDMA_WRITE 1, RDMA_READ 2, COMP_SWAP 3,
    /// FETCH_ADD 4, BIND_MW 5, LOCAL_INV 6, RECV 128, RECV_RDMA_WITH_IMM 129.
    #[test]
    fn wc_opcodes_statuses_and_fields() {
        let rows = [
            (0, WcOpcode::Send),
            (1, WcOpcode::RdmaWrite),
            (2, WcOpcode::RdmaRead),
            (3, WcOpcode::CompSwap),
            (4, WcOpcode::FetchAdd),
            (5, WcOpcode::BindMw),
            (6, WcOpcode::LocalInv),
            (128, WcOpcode::Recv),
            (129, WcOpcode::RecvRdmaWithImm),
        ];
        for (raw, op) in rows {
            let wc = wc_from_ibv(&ibv_wc(0, raw, 0, 0));
            assert_eq!(
                (
                    wc.wr_id,
                    wc.status,
                    wc.opcode,
                    wc.byte_len,
                    wc.qp_num,
                    wc.vendor_err
                ),
                (0xdead_beef, WcStatus::Success, op, 4096, 0x12, 0x77)
            );
            assert_eq!((wc.imm_data, wc.invalidated_stag), (None, None));
        }
        // IBV_WC_WR_FLUSH_ERR 5, IBV_WC_REM_ACCESS_ERR 10, IBV_WC_GENERAL_ERR 21.
        for (raw, st) in [
            (5, WcStatus::WrFlushErr),
            (10, WcStatus::RemAccessErr),
            (21, WcStatus::GeneralErr),
        ] {
            let wc = wc_from_ibv(&ibv_wc(raw, 1, IBV_WC_WITH_IMM, 9));
            assert_eq!(
                (wc.status, wc.opcode, wc.vendor_err),
                (st, WcOpcode::RdmaWrite, 0x77)
            );
            assert_eq!(
                (wc.byte_len, wc.imm_data),
                (0, None),
                "error completions carry little"
            );
        }
        // IBV_WC_TM_ERR (22) is not represented: general error.
        assert_eq!(
            wc_from_ibv(&ibv_wc(22, 0, 0, 0)).status,
            WcStatus::GeneralErr
        );
        // An undefined opcode on an error completion: Send; on success: general error.
        let wc = wc_from_ibv(&ibv_wc(5, 0xffff, 0, 0));
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::WrFlushErr, WcOpcode::Send)
        );
        let wc = wc_from_ibv(&ibv_wc(0, 0xffff, 0, 0));
        assert_eq!(wc.status, WcStatus::GeneralErr);
    }

    #[test]
    fn wc_immediate_is_network_order_and_invalidate_is_host_order() {
        let be = u32::from_ne_bytes([0xaa, 0xbb, 0xcc, 0xdd]);
        let wc = wc_from_ibv(&ibv_wc(0, 129, IBV_WC_WITH_IMM, be));
        assert_eq!(wc.imm_data, Some(0xaabb_ccdd));
        assert_eq!(wc.wc_flags(), WcFlags::WITH_IMM);
        assert_eq!(wc_flags_to_ibv(wc.wc_flags()), 2);
        let wc = wc_from_ibv(&ibv_wc(0, 128, IBV_WC_WITH_INV, 0x0000_1a02));
        assert_eq!(wc.invalidated_stag, Some(stag(0x1a02)));
        assert_eq!(wc_flags_to_ibv(wc.wc_flags()), 8);
    }

    /// `enum ibv_access_flags`: LOCAL_WRITE 1, REMOTE_WRITE 2, REMOTE_READ 4,
    /// REMOTE_ATOMIC 8, MW_BIND 16.
    #[test]
    fn access_flags() {
        let f = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        assert_eq!(mr_access_to_ibv(f).unwrap(), 7);
        assert_eq!(mr_access_to_ibv(AccessFlags::REMOTE_READ).unwrap(), 4);
        assert_eq!(
            mr_access_to_ibv(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC).unwrap(),
            9
        );
        assert_eq!(mr_access_to_ibv(AccessFlags::MW_BIND).unwrap(), 16);
        assert_eq!(
            mr_access_to_ibv(AccessFlags::REMOTE_WRITE).unwrap_err(),
            VerbsError::InvalidAccessFlags(AccessFlagsError::RemoteWriteWithoutLocalWrite)
        );
    }

    #[test]
    fn cm_event_numbers_and_names() {
        let rows = [
            (0, CmEventKind::AddrResolved, "RDMA_CM_EVENT_ADDR_RESOLVED"),
            (1, CmEventKind::AddrError, "RDMA_CM_EVENT_ADDR_ERROR"),
            (
                2,
                CmEventKind::RouteResolved,
                "RDMA_CM_EVENT_ROUTE_RESOLVED",
            ),
            (3, CmEventKind::RouteError, "RDMA_CM_EVENT_ROUTE_ERROR"),
            (
                4,
                CmEventKind::ConnectRequest,
                "RDMA_CM_EVENT_CONNECT_REQUEST",
            ),
            (
                5,
                CmEventKind::ConnectResponse,
                "RDMA_CM_EVENT_CONNECT_RESPONSE",
            ),
            (6, CmEventKind::ConnectError, "RDMA_CM_EVENT_CONNECT_ERROR"),
            (7, CmEventKind::Unreachable, "RDMA_CM_EVENT_UNREACHABLE"),
            (8, CmEventKind::Rejected, "RDMA_CM_EVENT_REJECTED"),
            (9, CmEventKind::Established, "RDMA_CM_EVENT_ESTABLISHED"),
            (10, CmEventKind::Disconnected, "RDMA_CM_EVENT_DISCONNECTED"),
            (
                11,
                CmEventKind::DeviceRemoval,
                "RDMA_CM_EVENT_DEVICE_REMOVAL",
            ),
            (
                12,
                CmEventKind::MulticastJoin,
                "RDMA_CM_EVENT_MULTICAST_JOIN",
            ),
            (
                13,
                CmEventKind::MulticastError,
                "RDMA_CM_EVENT_MULTICAST_ERROR",
            ),
            (14, CmEventKind::AddrChange, "RDMA_CM_EVENT_ADDR_CHANGE"),
            (15, CmEventKind::TimewaitExit, "RDMA_CM_EVENT_TIMEWAIT_EXIT"),
        ];
        for (raw, kind, name) in rows {
            assert_eq!(CmEventKind::from_raw(raw), Some(kind));
            assert_eq!(kind.to_raw(), raw);
            assert_eq!(kind.to_string(), name);
        }
        assert_eq!(CmEventKind::from_raw(16), None);
        assert_eq!(CmEventKind::from_raw(u32::MAX), None);
    }

    /// `enum ibv_event_type`: CQ_ERR 0, QP_FATAL 1, QP_REQ_ERR 2,
    /// QP_ACCESS_ERR 3, COMM_EST 4, SQ_DRAINED 5, DEVICE_FATAL 8,
    /// PORT_ACTIVE 9, PORT_ERR 10, QP_LAST_WQE_REACHED 16.
    #[test]
    fn async_events() {
        let ev = |t, qp, cq, port| RawAsyncEvent {
            event_type: t,
            qp_num: qp,
            cq_handle: cq,
            port_num: port,
        };
        let rows = [
            (ev(0, 0, 7, 0), Some(AsyncEvent::CqErr { cq: 7 })),
            (
                ev(1, 0x21, 0, 0),
                Some(AsyncEvent::QpFatal { qp_num: 0x21 }),
            ),
            (
                ev(2, 0x22, 0, 0),
                Some(AsyncEvent::QpReqErr { qp_num: 0x22 }),
            ),
            (
                ev(3, 0x23, 0, 0),
                Some(AsyncEvent::QpAccessErr { qp_num: 0x23 }),
            ),
            (
                ev(4, 0x24, 0, 0),
                Some(AsyncEvent::CommEst { qp_num: 0x24 }),
            ),
            (
                ev(5, 0x25, 0, 0),
                Some(AsyncEvent::SqDrained { qp_num: 0x25 }),
            ),
            (ev(8, 0, 0, 0), Some(AsyncEvent::DeviceFatal)),
            (ev(9, 0, 0, 1), Some(AsyncEvent::PortActive { port: 1 })),
            (ev(10, 0, 0, 1), Some(AsyncEvent::PortErr { port: 1 })),
            (
                ev(16, 0x26, 0, 0),
                Some(AsyncEvent::QpLastWqeReached { qp_num: 0x26 }),
            ),
            (ev(6, 0x27, 0, 0), None),
            (ev(14, 0, 0, 0), None),
            (ev(15, 0, 0, 0), None),
            (ev(19, 0, 0, 0), None),
        ];
        for (raw, want) in rows {
            assert_eq!(async_event_from_ibv(&raw), want, "{raw:?}");
        }
    }

    #[test]
    fn errno_rows() {
        let rows: [(i32, VerbsError); 8] = [
            (22, VerbsError::InvalidArgument { what: "ibv_reg_mr" }),
            (12, VerbsError::OutOfResources { what: "ibv_reg_mr" }),
            (95, VerbsError::Unsupported { what: "ibv_reg_mr" }),
            (38, VerbsError::Unsupported { what: "ibv_reg_mr" }),
            (19, VerbsError::NoDevice),
            (5, VerbsError::DeviceGone),
            (1, VerbsError::NotPermitted { what: "ibv_reg_mr" }),
            (
                16,
                VerbsError::Os {
                    call: "ibv_reg_mr",
                    errno: 16,
                },
            ),
        ];
        for (e, want) in rows {
            let got = verbs_error("ibv_reg_mr", e);
            assert_eq!(got, want, "errno {e}");
            if e != 38 {
                assert_eq!(got.errno(), e, "round trip of errno {e}");
            }
        }
        assert_eq!(
            post_error(WorkQueue::Send, 64, 12),
            VerbsError::QueueFull {
                queue: WorkQueue::Send,
                depth: 64
            }
        );
        assert_eq!(
            post_error(WorkQueue::Recv, 8, 22),
            VerbsError::InvalidArgument {
                what: "ibv_post_recv"
            }
        );
        assert_eq!(post_error(WorkQueue::Send, 8, 107).errno(), 107);
    }
}
