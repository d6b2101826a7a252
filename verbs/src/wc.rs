//! Work completions: `struct ibv_wc`, `enum ibv_wc_status`, `enum
//! ibv_wc_opcode` and `enum ibv_wc_flags` of `<infiniband/verbs.h>`, as
//! returned by `ibv_poll_cq(3)`.
//!
//! See the crate documentation for the completion-side contract (exactly
//! once, in order, flushed with [`WcStatus::WrFlushErr`] on Error).

use crate::stag::Stag;
use bitflags::bitflags;
use core::fmt;

/// Completion status: `enum ibv_wc_status`, with its libibverbs numeric values
/// (the discriminants) and, through `Display`, the strings of
/// `ibv_wc_status_str(3)`.
///
/// The InfiniBand-only statuses (EE contexts, RDD, RNR retry) are kept so the
/// hardware backend can pass any status through; iWARP backends produce the
/// others. How an iWARP error maps to a status (for example, a Terminate with
/// an invalid-STag code received for an RDMA Write becomes
/// [`WcStatus::RemAccessErr`]) is the soft device's business, not this
/// crate's.
///
/// The tag-matching statuses `IBV_WC_TM_ERR` (22) and
/// `IBV_WC_TM_RNDV_INCOMPLETE` (23) are not represented; [`WcStatus::from_ibv`]
/// returns `None` for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS` (0): the WR completed successfully.
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR` (1): local length error: an incoming message was
    /// longer than the receive WR's buffers, or an outgoing one exceeded the
    /// port's maximum message size.
    LocLenErr = 1,
    /// `IBV_WC_LOC_QP_OP_ERR` (2): local QP operation error: an internal
    /// consistency error in the WR (for example, inline data too long).
    LocQpOpErr = 2,
    /// `IBV_WC_LOC_EEC_OP_ERR` (3): local EE context operation error
    /// (InfiniBand RD only).
    LocEecOpErr = 3,
    /// `IBV_WC_LOC_PROT_ERR` (4): local protection error: an SGE's lkey or
    /// address range is not valid for the requested local access (wrong PD,
    /// out of bounds, missing `LOCAL_WRITE`).
    LocProtErr = 4,
    /// `IBV_WC_WR_FLUSH_ERR` (5): the WR was flushed because the QP entered
    /// the Error state before or while it was processed.
    WrFlushErr = 5,
    /// `IBV_WC_MW_BIND_ERR` (6): memory management operation error: a memory
    /// window bind, fast registration or local invalidate failed.
    MwBindErr = 6,
    /// `IBV_WC_BAD_RESP_ERR` (7): bad response error: an unexpected transport
    /// opcode was returned by the responder.
    BadRespErr = 7,
    /// `IBV_WC_LOC_ACCESS_ERR` (8): local access error on an incoming RDMA
    /// Read Response or atomic response (placing into a local buffer failed a
    /// protection check).
    LocAccessErr = 8,
    /// `IBV_WC_REM_INV_REQ_ERR` (9): remote invalid request error: the
    /// responder found the request invalid (unsupported opcode, message too
    /// long for its receive buffer).
    RemInvReqErr = 9,
    /// `IBV_WC_REM_ACCESS_ERR` (10): remote access error: the responder's
    /// protection check failed (invalid rkey/STag, bounds, rights).
    RemAccessErr = 10,
    /// `IBV_WC_REM_OP_ERR` (11): remote operation error: the responder could
    /// not complete the operation.
    RemOpErr = 11,
    /// `IBV_WC_RETRY_EXC_ERR` (12): transport retry counter exceeded (for
    /// iWARP: the transport connection was lost).
    RetryExcErr = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR` (13): RNR retry counter exceeded
    /// (InfiniBand receiver-not-ready; iWARP has no RNR).
    RnrRetryExcErr = 13,
    /// `IBV_WC_LOC_RDD_VIOL_ERR` (14): local RDD violation (InfiniBand RD only).
    LocRddViolErr = 14,
    /// `IBV_WC_REM_INV_RD_REQ_ERR` (15): remote invalid RD request
    /// (InfiniBand RD only).
    RemInvRdReqErr = 15,
    /// `IBV_WC_REM_ABORT_ERR` (16): the operation was aborted by the remote
    /// side.
    RemAbortErr = 16,
    /// `IBV_WC_INV_EECN_ERR` (17): invalid EE context number (InfiniBand RD
    /// only).
    InvEecnErr = 17,
    /// `IBV_WC_INV_EEC_STATE_ERR` (18): invalid EE context state (InfiniBand
    /// RD only).
    InvEecStateErr = 18,
    /// `IBV_WC_FATAL_ERR` (19): fatal error (device or transport).
    FatalErr = 19,
    /// `IBV_WC_RESP_TIMEOUT_ERR` (20): response timeout.
    RespTimeoutErr = 20,
    /// `IBV_WC_GENERAL_ERR` (21): any other error.
    GeneralErr = 21,
}

impl WcStatus {
    /// Every status, in numeric order.
    pub const ALL: [WcStatus; 22] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
    ];

    /// The libibverbs numeric value.
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }

    /// The status for a libibverbs numeric value; `None` for values this crate
    /// does not represent (22 and above).
    pub const fn from_ibv(value: u32) -> Option<WcStatus> {
        if (value as usize) < WcStatus::ALL.len() {
            Some(WcStatus::ALL[value as usize])
        } else {
            None
        }
    }

    /// The libibverbs constant name, e.g. `"IBV_WC_WR_FLUSH_ERR"`.
    pub const fn ibv_name(self) -> &'static str {
        match self {
            WcStatus::Success => "IBV_WC_SUCCESS",
            WcStatus::LocLenErr => "IBV_WC_LOC_LEN_ERR",
            WcStatus::LocQpOpErr => "IBV_WC_LOC_QP_OP_ERR",
            WcStatus::LocEecOpErr => "IBV_WC_LOC_EEC_OP_ERR",
            WcStatus::LocProtErr => "IBV_WC_LOC_PROT_ERR",
            WcStatus::WrFlushErr => "IBV_WC_WR_FLUSH_ERR",
            WcStatus::MwBindErr => "IBV_WC_MW_BIND_ERR",
            WcStatus::BadRespErr => "IBV_WC_BAD_RESP_ERR",
            WcStatus::LocAccessErr => "IBV_WC_LOC_ACCESS_ERR",
            WcStatus::RemInvReqErr => "IBV_WC_REM_INV_REQ_ERR",
            WcStatus::RemAccessErr => "IBV_WC_REM_ACCESS_ERR",
            WcStatus::RemOpErr => "IBV_WC_REM_OP_ERR",
            WcStatus::RetryExcErr => "IBV_WC_RETRY_EXC_ERR",
            WcStatus::RnrRetryExcErr => "IBV_WC_RNR_RETRY_EXC_ERR",
            WcStatus::LocRddViolErr => "IBV_WC_LOC_RDD_VIOL_ERR",
            WcStatus::RemInvRdReqErr => "IBV_WC_REM_INV_RD_REQ_ERR",
            WcStatus::RemAbortErr => "IBV_WC_REM_ABORT_ERR",
            WcStatus::InvEecnErr => "IBV_WC_INV_EECN_ERR",
            WcStatus::InvEecStateErr => "IBV_WC_INV_EEC_STATE_ERR",
            WcStatus::FatalErr => "IBV_WC_FATAL_ERR",
            WcStatus::RespTimeoutErr => "IBV_WC_RESP_TIMEOUT_ERR",
            WcStatus::GeneralErr => "IBV_WC_GENERAL_ERR",
        }
    }

    /// The string `ibv_wc_status_str(3)` returns for this status.
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }

    /// True for [`WcStatus::Success`].
    pub const fn is_success(self) -> bool {
        matches!(self, WcStatus::Success)
    }
}

/// Formats as `ibv_wc_status_str(3)` does, e.g. `"Work Request Flushed Error"`.
impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a completion completed: `enum ibv_wc_opcode` (libibverbs numeric
/// values via [`WcOpcode::to_ibv`]).
///
/// Send-queue completions carry the operation of the WR; receive-queue
/// completions are [`WcOpcode::Recv`] (a Send, Send with Invalidate, with or
/// without Solicited Event) or [`WcOpcode::RecvRdmaWithImm`] (the RFC 7306
/// Immediate Data that follows an RDMA Write with Immediate). As in
/// libibverbs, every receive opcode has bit 7 (`IBV_WC_RECV` = 128) set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WcOpcode {
    /// `IBV_WC_SEND` (0): a Send or Send with Invalidate WR.
    Send,
    /// `IBV_WC_RDMA_WRITE` (1): an RDMA Write or RDMA Write with Immediate WR.
    RdmaWrite,
    /// `IBV_WC_RDMA_READ` (2): an RDMA Read WR.
    RdmaRead,
    /// `IBV_WC_COMP_SWAP` (3): an atomic Compare-and-Swap WR.
    CompSwap,
    /// `IBV_WC_FETCH_ADD` (4): an atomic Fetch-and-Add WR.
    FetchAdd,
    /// `IBV_WC_BIND_MW` (5): a memory window bind WR.
    BindMw,
    /// `IBV_WC_LOCAL_INV` (6): a Local Invalidate WR.
    LocalInv,
    /// A fast registration WR ([`crate::SendOp::FastReg`]). Kernel verbs
    /// (`IB_WC_REG_MR`) only: libibverbs has no such opcode, so
    /// [`WcOpcode::to_ibv`] returns `None`.
    RegMr,
    /// `IBV_WC_RECV` (128): a receive WR consumed by an incoming Send (any of
    /// the four Send opcodes of RFC 5040 §4.2).
    Recv,
    /// `IBV_WC_RECV_RDMA_WITH_IMM` (129): a receive WR consumed by the
    /// Immediate Data (RFC 7306) of an RDMA Write with Immediate; `byte_len`
    /// is 0 and `imm_data` is set.
    RecvRdmaWithImm,
}

impl WcOpcode {
    /// Every opcode, send-side first.
    pub const ALL: [WcOpcode; 10] = [
        WcOpcode::Send,
        WcOpcode::RdmaWrite,
        WcOpcode::RdmaRead,
        WcOpcode::CompSwap,
        WcOpcode::FetchAdd,
        WcOpcode::BindMw,
        WcOpcode::LocalInv,
        WcOpcode::RegMr,
        WcOpcode::Recv,
        WcOpcode::RecvRdmaWithImm,
    ];

    /// The libibverbs numeric value; `None` for [`WcOpcode::RegMr`], which
    /// libibverbs does not define.
    pub const fn to_ibv(self) -> Option<u32> {
        Some(match self {
            WcOpcode::Send => 0,
            WcOpcode::RdmaWrite => 1,
            WcOpcode::RdmaRead => 2,
            WcOpcode::CompSwap => 3,
            WcOpcode::FetchAdd => 4,
            WcOpcode::BindMw => 5,
            WcOpcode::LocalInv => 6,
            WcOpcode::RegMr => return None,
            WcOpcode::Recv => 128,
            WcOpcode::RecvRdmaWithImm => 129,
        })
    }

    /// The opcode for a libibverbs numeric value; `None` for values not
    /// represented (`IBV_WC_TSO` (7), the tag-matching opcodes (130..),
    /// `IBV_WC_DRIVER1`, and undefined values).
    pub const fn from_ibv(value: u32) -> Option<WcOpcode> {
        Some(match value {
            0 => WcOpcode::Send,
            1 => WcOpcode::RdmaWrite,
            2 => WcOpcode::RdmaRead,
            3 => WcOpcode::CompSwap,
            4 => WcOpcode::FetchAdd,
            5 => WcOpcode::BindMw,
            6 => WcOpcode::LocalInv,
            128 => WcOpcode::Recv,
            129 => WcOpcode::RecvRdmaWithImm,
            _ => return None,
        })
    }

    /// True for completions of receive WRs (`opcode & IBV_WC_RECV` in C).
    pub const fn is_recv(self) -> bool {
        matches!(self, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
    }

    /// The libibverbs constant name, e.g. `"IBV_WC_RDMA_READ"`; for
    /// [`WcOpcode::RegMr`] the kernel name `"IB_WC_REG_MR"`.
    pub const fn ibv_name(self) -> &'static str {
        match self {
            WcOpcode::Send => "IBV_WC_SEND",
            WcOpcode::RdmaWrite => "IBV_WC_RDMA_WRITE",
            WcOpcode::RdmaRead => "IBV_WC_RDMA_READ",
            WcOpcode::CompSwap => "IBV_WC_COMP_SWAP",
            WcOpcode::FetchAdd => "IBV_WC_FETCH_ADD",
            WcOpcode::BindMw => "IBV_WC_BIND_MW",
            WcOpcode::LocalInv => "IBV_WC_LOCAL_INV",
            WcOpcode::RegMr => "IB_WC_REG_MR",
            WcOpcode::Recv => "IBV_WC_RECV",
            WcOpcode::RecvRdmaWithImm => "IBV_WC_RECV_RDMA_WITH_IMM",
        }
    }
}

/// Formats as the libibverbs constant name (see [`WcOpcode::ibv_name`]).
impl fmt::Display for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.ibv_name())
    }
}

bitflags! {
    /// Completion flags: the subset of `enum ibv_wc_flags` meaningful on an
    /// iWARP RC QP, with the libibverbs bit values. Derived from a
    /// [`WorkCompletion`] by [`WorkCompletion::wc_flags`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// `IBV_WC_WITH_IMM` (1 << 1): `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// `IBV_WC_WITH_INV` (1 << 3): `invalidated_rkey` is valid (the
        /// incoming message was a Send with Invalidate, RFC 5040 §5.3).
        const WITH_INV = 1 << 3;
    }
}

/// One completed work request: `struct ibv_wc` (`ibv_poll_cq(3)`).
///
/// The libibverbs union of `imm_data` and `invalidated_rkey` is two options
/// here, at most one of them `Some`, and `wc_flags` is derived from them
/// ([`WorkCompletion::wc_flags`]) so the two cannot disagree. The UD/IB-only
/// fields (`src_qp`, `pkey_index`, `slid`, `sl`, `dlid_path_bits`) are left
/// out.
///
/// If `status` is not [`WcStatus::Success`], only `wr_id`, `status`, `qp_num`
/// and `vendor_err` are meaningful (`ibv_poll_cq(3)`); backends still fill
/// `opcode` when they know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    /// The `wr_id` of the completed WR, as the consumer posted it.
    pub wr_id: u64,
    /// Outcome of the WR.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Provider-specific error detail (`ibv_wc.vendor_err`), 0 on success.
    /// The soft device puts the Terminate's `Layer|EType|ErrCode` here
    /// (RFC 5040 §7.1) when a Terminate caused the error.
    pub vendor_err: u32,
    /// Bytes transferred (`ibv_wc.byte_len`): for a receive, the length of the
    /// incoming message placed into the WR's buffers; for an RDMA Read, the
    /// bytes read; 0 for [`WcOpcode::RecvRdmaWithImm`] and local operations.
    pub byte_len: u32,
    /// Immediate data (`ibv_wc.imm_data` when `IBV_WC_WITH_IMM`), in host
    /// order: the value the sender put in `ibv_send_wr.imm_data`.
    pub imm_data: Option<u32>,
    /// The local STag invalidated by an incoming Send with Invalidate
    /// (`ibv_wc.invalidated_rkey` when `IBV_WC_WITH_INV`; RFC 5040 §5.3).
    pub invalidated_stag: Option<Stag>,
    /// The local QP number the WR was posted on (`ibv_wc.qp_num`).
    pub qp_num: u32,
}

impl WorkCompletion {
    /// A completion with `status` and no data: `byte_len` 0, no immediate,
    /// no invalidation, `vendor_err` 0. The usual start for a flush
    /// ([`WcStatus::WrFlushErr`]) or an error completion.
    pub const fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 0,
            imm_data: None,
            invalidated_stag: None,
            qp_num,
        }
    }

    /// The flushed completion of a WR: status [`WcStatus::WrFlushErr`].
    pub const fn flushed(wr_id: u64, opcode: WcOpcode, qp_num: u32) -> Self {
        WorkCompletion::new(wr_id, WcStatus::WrFlushErr, opcode, qp_num)
    }

    /// The `ibv_wc.wc_flags` value implied by `imm_data` and
    /// `invalidated_stag`.
    pub const fn wc_flags(&self) -> WcFlags {
        let mut f = WcFlags::empty();
        if self.imm_data.is_some() {
            f = f.union(WcFlags::WITH_IMM);
        }
        if self.invalidated_stag.is_some() {
            f = f.union(WcFlags::WITH_INV);
        }
        f
    }

    /// True if `status` is [`WcStatus::Success`].
    pub const fn is_success(&self) -> bool {
        self.status.is_success()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `enum ibv_wc_status` in rdma-core's `libibverbs/verbs.h`: implicit
    /// values from 0.
    #[test]
    fn status_values_match_verbs_h() {
        let expected: [(WcStatus, u32); 22] = [
            (WcStatus::Success, 0),
            (WcStatus::LocLenErr, 1),
            (WcStatus::LocQpOpErr, 2),
            (WcStatus::LocEecOpErr, 3),
            (WcStatus::LocProtErr, 4),
            (WcStatus::WrFlushErr, 5),
            (WcStatus::MwBindErr, 6),
            (WcStatus::BadRespErr, 7),
            (WcStatus::LocAccessErr, 8),
            (WcStatus::RemInvReqErr, 9),
            (WcStatus::RemAccessErr, 10),
            (WcStatus::RemOpErr, 11),
            (WcStatus::RetryExcErr, 12),
            (WcStatus::RnrRetryExcErr, 13),
            (WcStatus::LocRddViolErr, 14),
            (WcStatus::RemInvRdReqErr, 15),
            (WcStatus::RemAbortErr, 16),
            (WcStatus::InvEecnErr, 17),
            (WcStatus::InvEecStateErr, 18),
            (WcStatus::FatalErr, 19),
            (WcStatus::RespTimeoutErr, 20),
            (WcStatus::GeneralErr, 21),
        ];
        for (s, v) in expected {
            assert_eq!(s.to_ibv(), v, "{s:?}");
            assert_eq!(WcStatus::from_ibv(v), Some(s));
        }
        for (i, s) in WcStatus::ALL.iter().enumerate() {
            assert_eq!(s.to_ibv() as usize, i);
        }
        assert_eq!(
            WcStatus::from_ibv(22),
            None,
            "IBV_WC_TM_ERR not represented"
        );
        assert_eq!(WcStatus::from_ibv(23), None);
        assert_eq!(WcStatus::from_ibv(u32::MAX), None);
    }

    /// The strings of `ibv_wc_status_str()` in rdma-core's
    /// `libibverbs/enum_strs.c`.
    #[test]
    fn status_display_matches_ibv_wc_status_str() {
        let expected = [
            "success",
            "local length error",
            "local QP operation error",
            "local EE context operation error",
            "local protection error",
            "Work Request Flushed Error",
            "memory management operation error",
            "bad response error",
            "local access error",
            "remote invalid request error",
            "remote access error",
            "remote operation error",
            "transport retry counter exceeded",
            "RNR retry counter exceeded",
            "local RDD violation error",
            "remote invalid RD request",
            "aborted error",
            "invalid EE context number",
            "invalid EE context state",
            "fatal error",
            "response timeout error",
            "general error",
        ];
        for (s, want) in WcStatus::ALL.iter().zip(expected) {
            assert_eq!(s.to_string(), want, "{s:?}");
        }
    }

    #[test]
    fn status_names() {
        assert_eq!(WcStatus::WrFlushErr.ibv_name(), "IBV_WC_WR_FLUSH_ERR");
        assert_eq!(
            WcStatus::RemInvRdReqErr.ibv_name(),
            "IBV_WC_REM_INV_RD_REQ_ERR"
        );
        for s in WcStatus::ALL {
            assert!(s.ibv_name().starts_with("IBV_WC_"));
        }
    }

    /// `enum ibv_wc_opcode` in rdma-core's `libibverbs/verbs.h`.
    #[test]
    fn opcode_values_match_verbs_h() {
        let expected = [
            (WcOpcode::Send, Some(0)),
            (WcOpcode::RdmaWrite, Some(1)),
            (WcOpcode::RdmaRead, Some(2)),
            (WcOpcode::CompSwap, Some(3)),
            (WcOpcode::FetchAdd, Some(4)),
            (WcOpcode::BindMw, Some(5)),
            (WcOpcode::LocalInv, Some(6)),
            (WcOpcode::RegMr, None),
            (WcOpcode::Recv, Some(128)),
            (WcOpcode::RecvRdmaWithImm, Some(129)),
        ];
        assert_eq!(expected.len(), WcOpcode::ALL.len());
        for (op, v) in expected {
            assert_eq!(op.to_ibv(), v, "{op:?}");
            if let Some(v) = v {
                assert_eq!(WcOpcode::from_ibv(v), Some(op));
                // IBV_WC_RECV is 1 << 7; receive opcodes test true on the bit.
                assert_eq!(v & 128 != 0, op.is_recv(), "{op:?}");
            }
        }
        assert_eq!(WcOpcode::from_ibv(7), None, "IBV_WC_TSO not represented");
        assert_eq!(
            WcOpcode::from_ibv(130),
            None,
            "IBV_WC_TM_ADD not represented"
        );
        assert!(!WcOpcode::RegMr.is_recv());
    }

    #[test]
    fn opcode_display() {
        assert_eq!(
            WcOpcode::RecvRdmaWithImm.to_string(),
            "IBV_WC_RECV_RDMA_WITH_IMM"
        );
        assert_eq!(WcOpcode::LocalInv.to_string(), "IBV_WC_LOCAL_INV");
        assert_eq!(WcOpcode::RegMr.to_string(), "IB_WC_REG_MR");
    }

    /// `enum ibv_wc_flags` in rdma-core's `libibverbs/verbs.h`.
    #[test]
    fn wc_flags_values_and_derivation() {
        assert_eq!(WcFlags::WITH_IMM.bits(), 2);
        assert_eq!(WcFlags::WITH_INV.bits(), 8);

        let mut wc = WorkCompletion::new(7, WcStatus::Success, WcOpcode::Recv, 3);
        assert_eq!(wc.wc_flags(), WcFlags::empty());
        wc.invalidated_stag = Some(Stag::from_raw(0x1200));
        assert_eq!(wc.wc_flags().bits(), 8);
        wc.invalidated_stag = None;
        wc.imm_data = Some(0xabcd);
        assert_eq!(wc.wc_flags().bits(), 2);
    }

    #[test]
    fn flushed_completion() {
        let wc = WorkCompletion::flushed(42, WcOpcode::RdmaRead, 9);
        assert_eq!(wc.wr_id, 42);
        assert_eq!(wc.status, WcStatus::WrFlushErr);
        assert_eq!(wc.status.to_ibv(), 5);
        assert_eq!(wc.qp_num, 9);
        assert_eq!(wc.byte_len, 0);
        assert!(!wc.is_success());
        assert!(WorkCompletion::new(1, WcStatus::Success, WcOpcode::Send, 1).is_success());
    }
}
