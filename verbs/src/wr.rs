//! Work requests: `struct ibv_sge`, `struct ibv_send_wr`, `struct
//! ibv_recv_wr`, `enum ibv_wr_opcode` and `enum ibv_send_flags` of
//! `<infiniband/verbs.h>` (`ibv_post_send(3)`, `ibv_post_recv(3)`).
//!
//! A WR is an owned value: the C linked list (`next`) becomes a slice of WRs
//! passed to the post call, and the C unions become the [`SendOp`] enum, so
//! an opcode can only carry the fields it uses. The buffers an SGE names are
//! registered memory owned by the consumer; as in libibverbs they must stay
//! untouched until the WR's completion is polled (inline payloads are copied
//! at post time and may be reused at once).
//!
//! [`SendWr::validate`] and [`RecvWr::validate`] are the checks a post call
//! makes before accepting a WR, shared by all backends; their errors are the
//! synchronous failures of `ibv_post_send` / `ibv_post_recv`. Checks that need
//! the memory tables (lkey valid, range inside the MR, PD match) happen when
//! the WR executes and surface as completion statuses
//! ([`crate::WcStatus::LocProtErr`] and friends).

use crate::access::AccessFlags;
use crate::error::VerbsError;
use crate::qp::QpCap;
use crate::stag::{Lkey, Rkey, Stag};
use crate::wc::WcOpcode;
use bitflags::bitflags;

/// One gather/scatter element: `struct ibv_sge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Start of the buffer: an iova inside the MR named by `lkey`.
    pub addr: u64,
    /// Length of the buffer, in bytes.
    pub length: u32,
    /// The lkey (STag) of the MR containing the buffer.
    pub lkey: Lkey,
}

impl Sge {
    /// An SGE covering `length` bytes at `addr` in the MR named by `lkey`.
    pub const fn new(addr: u64, length: u32, lkey: Lkey) -> Sge {
        Sge { addr, length, lkey }
    }

    /// One past the last byte (`addr + length`), or `None` if that overflows
    /// 64 bits.
    pub const fn end(&self) -> Option<u64> {
        self.addr.checked_add(self.length as u64)
    }
}

/// Largest message a WR may describe, in bytes: `ibv_wc.byte_len` is 32 bits.
pub const MAX_MESSAGE_LEN: u64 = u32::MAX as u64;

/// The local data of a send WR: SGEs gathered from registered memory, or an
/// inline copy (`IBV_SEND_INLINE`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Payload {
    /// Gather list (`sg_list` / `num_sge`). For RDMA Read and the atomics it
    /// is the scatter list receiving the data. May be empty (a zero-length
    /// message).
    Sges(Vec<Sge>),
    /// Inline data, copied at post time; no lkey is checked
    /// (`ibv_post_send(3)`, `IBV_SEND_INLINE`). Length is limited by
    /// [`QpCap::max_inline_data`].
    Inline(Vec<u8>),
}

impl Default for Payload {
    /// No data: an empty gather list.
    fn default() -> Payload {
        Payload::Sges(Vec::new())
    }
}

impl Payload {
    /// Total length, in bytes: the sum of the SGE lengths, or the inline
    /// length.
    pub fn len(&self) -> u64 {
        match self {
            Payload::Sges(sges) => sges.iter().map(|s| s.length as u64).sum(),
            Payload::Inline(data) => data.len() as u64,
        }
    }

    /// True if the payload describes zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True for [`Payload::Inline`].
    pub const fn is_inline(&self) -> bool {
        matches!(self, Payload::Inline(_))
    }
}

bitflags! {
    /// Send WR flags: `enum ibv_send_flags`, with the libibverbs bit values
    /// (`IBV_SEND_IP_CSUM` is not represented).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// `IBV_SEND_FENCE` (1 << 0): do not start this WR until every prior
        /// RDMA Read and atomic on the QP has completed (RFC 5040 §5.5, the
        /// Read fence).
        const FENCE = 1 << 0;
        /// `IBV_SEND_SIGNALED` (1 << 1): generate a completion on success
        /// (relevant when the QP does not signal all WRs).
        const SIGNALED = 1 << 1;
        /// `IBV_SEND_SOLICITED` (1 << 2): set the Solicited Event bit: the
        /// Send with SE opcodes of RFC 5040 §4.2, or Immediate Data with SE of
        /// RFC 7306. Valid for Sends and RDMA Write with Immediate only.
        const SOLICITED = 1 << 2;
        /// `IBV_SEND_INLINE` (1 << 3): the payload is [`Payload::Inline`].
        /// Valid for Sends and RDMA Writes only. Set by
        /// [`SendWr::send_inline`] / [`SendWr::rdma_write_inline`]; it must
        /// agree with the payload.
        const INLINE = 1 << 3;
    }
}

/// A fast registration (kernel verbs `IB_WR_REG_MR`; siw `SIW_OP_REG_MR`):
/// makes a pre-allocated MR valid with a new key, access rights and range,
/// as a send-queue WR ordered with the others.
///
/// The MR is named by its current STag, whose index identifies the MR object
/// (siw does the same); after the WR succeeds the MR answers to
/// [`FastReg::new_stag`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FastReg {
    /// The MR's current STag; its index names the MR.
    pub mr: Stag,
    /// The new 8-bit consumer key.
    pub key: u8,
    /// Access rights of the registration; must satisfy
    /// [`AccessFlags::validate_for_mr`].
    pub access: AccessFlags,
    /// First iova of the registered range (the Tagged Offset of its first
    /// byte, RFC 5040 §2).
    pub iova: u64,
    /// Length of the registered range, in bytes (> 0).
    pub length: u64,
}

impl FastReg {
    /// The STag the MR answers to once the registration completes: the MR's
    /// index with [`FastReg::key`].
    pub const fn new_stag(&self) -> Stag {
        self.mr.with_key(self.key)
    }
}

/// The operation of a send WR: `enum ibv_wr_opcode` with the union fields of
/// `struct ibv_send_wr` each opcode uses.
///
/// Remote addresses are the peer's iovas, which iWARP carries as Tagged
/// Offsets with the rkey as STag (RFC 5040 §2, RFC 5041 §4.1). Immediate data
/// is the host-order value; on the wire and in `ibv_send_wr.imm_data` it is
/// big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// `IBV_WR_SEND` (2): RDMAP Send (or Send with SE), consuming one receive
    /// WR at the peer (RFC 5040 §5.3).
    Send,
    /// `IBV_WR_SEND_WITH_INV` (9): Send with Invalidate (or with SE and
    /// Invalidate): the peer invalidates `invalidate_rkey` before completing
    /// the receive (RFC 5040 §5.3).
    SendWithInv {
        /// The peer's STag to invalidate.
        invalidate_rkey: Rkey,
    },
    /// `IBV_WR_RDMA_WRITE` (0): RDMA Write of the payload to
    /// `remote_addr` in the peer's region `rkey` (RFC 5040 §5.1).
    RdmaWrite {
        /// Peer iova of the first byte written.
        remote_addr: u64,
        /// Peer STag (Data Sink).
        rkey: Rkey,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM` (1): an RDMA Write followed by an RFC
    /// 7306 Immediate Data message (or Immediate Data with SE) carrying
    /// `imm_data`; consumes one receive WR at the peer, which completes as
    /// [`WcOpcode::RecvRdmaWithImm`].
    RdmaWriteWithImm {
        /// Peer iova of the first byte written.
        remote_addr: u64,
        /// Peer STag (Data Sink).
        rkey: Rkey,
        /// The 32-bit immediate value.
        imm_data: u32,
    },
    /// `IBV_WR_RDMA_READ` (4): RDMA Read of the peer's range into the
    /// payload's SGEs (RFC 5040 §5.2). Counts against ORD.
    RdmaRead {
        /// Peer iova of the first byte read.
        remote_addr: u64,
        /// Peer STag (Data Source).
        rkey: Rkey,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP` (5): RFC 7306 Compare-and-Swap on the
    /// 64-bit word at `remote_addr`; the original value lands in the single
    /// 8-byte SGE.
    AtomicCmpSwap {
        /// Peer iova of the 8-byte-aligned word.
        remote_addr: u64,
        /// Peer STag.
        rkey: Rkey,
        /// Value compared with the word.
        compare: u64,
        /// Value stored if equal.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD` (6): RFC 7306 Fetch-and-Add on the
    /// 64-bit word at `remote_addr`; the original value lands in the single
    /// 8-byte SGE.
    AtomicFetchAdd {
        /// Peer iova of the 8-byte-aligned word.
        remote_addr: u64,
        /// Peer STag.
        rkey: Rkey,
        /// Value added to the word (modulo 2^64).
        add: u64,
    },
    /// `IBV_WR_LOCAL_INV` (7): invalidate a local STag, ordered with the SQ
    /// (RFC 5040 §2: STag invalidation). No payload.
    LocalInv {
        /// The local STag to invalidate.
        invalidate_stag: Stag,
    },
    /// Fast registration (kernel verbs `IB_WR_REG_MR`; no libibverbs
    /// opcode). No payload.
    FastReg(FastReg),
}

impl SendOp {
    /// The `enum ibv_wr_opcode` value; `None` for [`SendOp::FastReg`], which
    /// libibverbs does not define.
    pub const fn to_ibv(&self) -> Option<u32> {
        Some(match self {
            SendOp::RdmaWrite { .. } => 0,
            SendOp::RdmaWriteWithImm { .. } => 1,
            SendOp::Send => 2,
            SendOp::RdmaRead { .. } => 4,
            SendOp::AtomicCmpSwap { .. } => 5,
            SendOp::AtomicFetchAdd { .. } => 6,
            SendOp::LocalInv { .. } => 7,
            SendOp::SendWithInv { .. } => 9,
            SendOp::FastReg(_) => return None,
        })
    }

    /// The libibverbs constant name, e.g. `"IBV_WR_RDMA_READ"`; for
    /// [`SendOp::FastReg`] the kernel name `"IB_WR_REG_MR"`.
    pub const fn ibv_name(&self) -> &'static str {
        match self {
            SendOp::RdmaWrite { .. } => "IBV_WR_RDMA_WRITE",
            SendOp::RdmaWriteWithImm { .. } => "IBV_WR_RDMA_WRITE_WITH_IMM",
            SendOp::Send => "IBV_WR_SEND",
            SendOp::RdmaRead { .. } => "IBV_WR_RDMA_READ",
            SendOp::AtomicCmpSwap { .. } => "IBV_WR_ATOMIC_CMP_AND_SWP",
            SendOp::AtomicFetchAdd { .. } => "IBV_WR_ATOMIC_FETCH_AND_ADD",
            SendOp::LocalInv { .. } => "IBV_WR_LOCAL_INV",
            SendOp::SendWithInv { .. } => "IBV_WR_SEND_WITH_INV",
            SendOp::FastReg(_) => "IB_WR_REG_MR",
        }
    }

    /// The opcode of this WR's completion.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithInv { .. } => WcOpcode::Send,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::AtomicCmpSwap { .. } => WcOpcode::CompSwap,
            SendOp::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
            SendOp::FastReg(_) => WcOpcode::RegMr,
        }
    }

    /// True if the payload may be inline: Sends and RDMA Writes
    /// (`ibv_post_send(3)`: "Valid only for Send and RDMA Write").
    pub const fn allows_inline(&self) -> bool {
        matches!(
            self,
            SendOp::Send
                | SendOp::SendWithInv { .. }
                | SendOp::RdmaWrite { .. }
                | SendOp::RdmaWriteWithImm { .. }
        )
    }

    /// True if [`SendFlags::SOLICITED`] is meaningful: Sends and RDMA Write
    /// with Immediate (the messages that consume a receive WR at the peer).
    pub const fn allows_solicited(&self) -> bool {
        matches!(
            self,
            SendOp::Send | SendOp::SendWithInv { .. } | SendOp::RdmaWriteWithImm { .. }
        )
    }

    /// True if the operation is local only (no message to the peer) and takes
    /// no payload: Local Invalidate and Fast Registration.
    pub const fn is_local(&self) -> bool {
        matches!(self, SendOp::LocalInv { .. } | SendOp::FastReg(_))
    }

    /// True for the RFC 7306 atomics.
    pub const fn is_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }

    /// True if the WR occupies an ORD slot while outstanding (RDMA Read and
    /// atomics: the operations that wait for a response; RFC 5040 §5.2).
    pub const fn uses_ord(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead { .. } | SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }
}

/// A send-queue work request: `struct ibv_send_wr` (`ibv_post_send(3)`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SendWr {
    /// Consumer cookie returned in the completion.
    pub wr_id: u64,
    /// The operation and its remote parameters.
    pub op: SendOp,
    /// `send_flags`.
    pub flags: SendFlags,
    /// Local data: gather list, scatter list (Read, atomics) or inline bytes.
    pub payload: Payload,
}

impl SendWr {
    /// A Send gathering `sg_list`; no flags.
    pub fn send(wr_id: u64, sg_list: Vec<Sge>) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::Send,
            flags: SendFlags::empty(),
            payload: Payload::Sges(sg_list),
        }
    }

    /// A Send of inline bytes; sets [`SendFlags::INLINE`].
    pub fn send_inline(wr_id: u64, data: Vec<u8>) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::Send,
            flags: SendFlags::INLINE,
            payload: Payload::Inline(data),
        }
    }

    /// An RDMA Write of `sg_list` to `remote_addr` in the peer's `rkey`.
    pub fn rdma_write(wr_id: u64, sg_list: Vec<Sge>, remote_addr: u64, rkey: Rkey) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::RdmaWrite { remote_addr, rkey },
            flags: SendFlags::empty(),
            payload: Payload::Sges(sg_list),
        }
    }

    /// An RDMA Write of inline bytes; sets [`SendFlags::INLINE`].
    pub fn rdma_write_inline(wr_id: u64, data: Vec<u8>, remote_addr: u64, rkey: Rkey) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::RdmaWrite { remote_addr, rkey },
            flags: SendFlags::INLINE,
            payload: Payload::Inline(data),
        }
    }

    /// An RDMA Read of the peer's `remote_addr`/`rkey` into `sg_list`.
    pub fn rdma_read(wr_id: u64, sg_list: Vec<Sge>, remote_addr: u64, rkey: Rkey) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::RdmaRead { remote_addr, rkey },
            flags: SendFlags::empty(),
            payload: Payload::Sges(sg_list),
        }
    }

    /// A Local Invalidate of `stag`.
    pub fn local_inv(wr_id: u64, stag: Stag) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::LocalInv {
                invalidate_stag: stag,
            },
            flags: SendFlags::empty(),
            payload: Payload::default(),
        }
    }

    /// A fast registration.
    pub fn fast_reg(wr_id: u64, reg: FastReg) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::FastReg(reg),
            flags: SendFlags::empty(),
            payload: Payload::default(),
        }
    }

    /// Adds `flags` to the WR's flags (builder style), e.g.
    /// `SendWr::send(1, sges).with_flags(SendFlags::SIGNALED)`.
    pub fn with_flags(mut self, flags: SendFlags) -> SendWr {
        self.flags |= flags;
        self
    }

    /// The checks `ibv_post_send` makes before accepting this WR on a QP with
    /// capabilities `cap`.
    ///
    /// # Errors
    ///
    /// In the order checked:
    /// - [`VerbsError::InvalidArgument`] `"send_flags"`: `INLINE` disagrees
    ///   with the payload, inline data on an opcode other than Send / RDMA
    ///   Write, or `SOLICITED` on an opcode other than Send / RDMA Write with
    ///   Immediate.
    /// - [`VerbsError::InlineTooLong`]: inline payload longer than
    ///   `cap.max_inline_data` bytes.
    /// - [`VerbsError::TooManySges`]: more than `cap.max_send_sge` SGEs.
    /// - [`VerbsError::InvalidArgument`] `"sg_list"`: an SGE whose range wraps
    ///   past 2^64; a payload on Local Invalidate / Fast Registration; an
    ///   atomic whose payload is not exactly one 8-byte SGE.
    /// - [`VerbsError::MessageTooLong`]: total length above
    ///   [`MAX_MESSAGE_LEN`] bytes.
    /// - [`VerbsError::InvalidArgument`] `"remote_addr"`: an atomic target not
    ///   8-byte aligned.
    /// - Fast registration: [`VerbsError::InvalidAccessFlags`] (the MR rule),
    ///   [`VerbsError::InvalidArgument`] `"length"` (zero) or `"iova"`
    ///   (`iova + length` wraps past 2^64).
    pub fn validate(&self, cap: &QpCap) -> Result<(), VerbsError> {
        let send_flags = VerbsError::InvalidArgument { what: "send_flags" };
        let sg_list = VerbsError::InvalidArgument { what: "sg_list" };

        if self.flags.contains(SendFlags::INLINE) != self.payload.is_inline() {
            return Err(send_flags);
        }
        if self.payload.is_inline() && !self.op.allows_inline() {
            return Err(send_flags);
        }
        if self.flags.contains(SendFlags::SOLICITED) && !self.op.allows_solicited() {
            return Err(send_flags);
        }
        match &self.payload {
            Payload::Inline(data) => {
                if data.len() as u64 > cap.max_inline_data as u64 {
                    return Err(VerbsError::InlineTooLong {
                        len: data.len(),
                        max: cap.max_inline_data,
                    });
                }
            }
            Payload::Sges(sges) => check_sges(sges, cap.max_send_sge)?,
        }
        // Local operations take no SGEs at all, not even zero-length ones
        // (inline payloads were refused above).
        if self.op.is_local() && matches!(&self.payload, Payload::Sges(s) if !s.is_empty()) {
            return Err(sg_list);
        }
        let len = self.payload.len();
        if len > MAX_MESSAGE_LEN {
            return Err(VerbsError::MessageTooLong {
                len,
                max: MAX_MESSAGE_LEN,
            });
        }
        match self.op {
            SendOp::AtomicCmpSwap { remote_addr, .. }
            | SendOp::AtomicFetchAdd { remote_addr, .. } => {
                match &self.payload {
                    Payload::Sges(sges) if sges.len() == 1 && sges[0].length == 8 => {}
                    _ => return Err(sg_list),
                }
                if remote_addr % 8 != 0 {
                    return Err(VerbsError::InvalidArgument {
                        what: "remote_addr",
                    });
                }
            }
            SendOp::FastReg(reg) => {
                reg.access.validate_for_mr()?;
                if reg.length == 0 {
                    return Err(VerbsError::InvalidArgument { what: "length" });
                }
                if reg.iova.checked_add(reg.length).is_none() {
                    return Err(VerbsError::InvalidArgument { what: "iova" });
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Checks the SGE count against `max` and every SGE's range for wrap-around.
fn check_sges(sges: &[Sge], max: u32) -> Result<(), VerbsError> {
    if sges.len() as u64 > max as u64 {
        return Err(VerbsError::TooManySges {
            num_sge: sges.len(),
            max,
        });
    }
    if sges.iter().any(|s| s.end().is_none()) {
        return Err(VerbsError::InvalidArgument { what: "sg_list" });
    }
    Ok(())
}

/// A receive-queue work request: `struct ibv_recv_wr` (`ibv_post_recv(3)`).
///
/// Consumed, in posting order, by each incoming Send (any of the four Send
/// opcodes) and by each RFC 7306 Immediate Data message (RFC 5040 §5.3: the
/// untagged buffer for MSN *n* on QN 0 is the *n*-th receive WR).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecvWr {
    /// Consumer cookie returned in the completion.
    pub wr_id: u64,
    /// Scatter list receiving the message; may be empty (zero-length
    /// messages only).
    pub sg_list: Vec<Sge>,
}

impl RecvWr {
    /// A receive WR scattering into `sg_list`.
    pub fn new(wr_id: u64, sg_list: Vec<Sge>) -> RecvWr {
        RecvWr { wr_id, sg_list }
    }

    /// Total buffer space, in bytes.
    pub fn len(&self) -> u64 {
        self.sg_list.iter().map(|s| s.length as u64).sum()
    }

    /// True if the WR has no buffer space.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The checks `ibv_post_recv` makes before accepting this WR on a QP with
    /// capabilities `cap`.
    ///
    /// # Errors
    ///
    /// [`VerbsError::TooManySges`] (more than `cap.max_recv_sge`),
    /// [`VerbsError::InvalidArgument`] `"sg_list"` (an SGE range wraps past
    /// 2^64), [`VerbsError::MessageTooLong`] (total above
    /// [`MAX_MESSAGE_LEN`] bytes).
    pub fn validate(&self, cap: &QpCap) -> Result<(), VerbsError> {
        check_sges(&self.sg_list, cap.max_recv_sge)?;
        let len = self.len();
        if len > MAX_MESSAGE_LEN {
            return Err(VerbsError::MessageTooLong {
                len,
                max: MAX_MESSAGE_LEN,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::AccessFlagsError;

    const CAP: QpCap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 3,
        max_inline_data: 64,
    };
    const LKEY: Stag = Stag::from_raw(0x0000_0100);
    const RKEY: Stag = Stag::from_raw(0x0000_0201);

    fn sge(len: u32) -> Sge {
        Sge::new(0x1000, len, LKEY)
    }

    /// `enum ibv_send_flags` in rdma-core's `libibverbs/verbs.h`.
    #[test]
    fn send_flag_values_match_verbs_h() {
        assert_eq!(SendFlags::FENCE.bits(), 1);
        assert_eq!(SendFlags::SIGNALED.bits(), 2);
        assert_eq!(SendFlags::SOLICITED.bits(), 4);
        assert_eq!(SendFlags::INLINE.bits(), 8);
    }

    /// `enum ibv_wr_opcode` in rdma-core's `libibverbs/verbs.h`, and the
    /// completion opcode of each.
    #[test]
    fn wr_opcode_values_match_verbs_h() {
        let fr = FastReg {
            mr: LKEY,
            key: 1,
            access: AccessFlags::LOCAL_WRITE,
            iova: 0,
            length: 1,
        };
        let cases = [
            (
                SendOp::RdmaWrite {
                    remote_addr: 0,
                    rkey: RKEY,
                },
                Some(0),
                WcOpcode::RdmaWrite,
            ),
            (
                SendOp::RdmaWriteWithImm {
                    remote_addr: 0,
                    rkey: RKEY,
                    imm_data: 1,
                },
                Some(1),
                WcOpcode::RdmaWrite,
            ),
            (SendOp::Send, Some(2), WcOpcode::Send),
            (
                SendOp::RdmaRead {
                    remote_addr: 0,
                    rkey: RKEY,
                },
                Some(4),
                WcOpcode::RdmaRead,
            ),
            (
                SendOp::AtomicCmpSwap {
                    remote_addr: 0,
                    rkey: RKEY,
                    compare: 0,
                    swap: 0,
                },
                Some(5),
                WcOpcode::CompSwap,
            ),
            (
                SendOp::AtomicFetchAdd {
                    remote_addr: 0,
                    rkey: RKEY,
                    add: 0,
                },
                Some(6),
                WcOpcode::FetchAdd,
            ),
            (
                SendOp::LocalInv {
                    invalidate_stag: LKEY,
                },
                Some(7),
                WcOpcode::LocalInv,
            ),
            (
                SendOp::SendWithInv {
                    invalidate_rkey: RKEY,
                },
                Some(9),
                WcOpcode::Send,
            ),
            (SendOp::FastReg(fr), None, WcOpcode::RegMr),
        ];
        for (op, v, wc) in cases {
            assert_eq!(op.to_ibv(), v, "{}", op.ibv_name());
            assert_eq!(op.wc_opcode(), wc, "{}", op.ibv_name());
        }
    }

    #[test]
    fn op_properties() {
        assert!(SendOp::Send.allows_inline());
        assert!(!SendOp::RdmaRead {
            remote_addr: 0,
            rkey: RKEY
        }
        .allows_inline());
        assert!(SendOp::RdmaWriteWithImm {
            remote_addr: 0,
            rkey: RKEY,
            imm_data: 0
        }
        .allows_solicited());
        assert!(!SendOp::RdmaWrite {
            remote_addr: 0,
            rkey: RKEY
        }
        .allows_solicited());
        assert!(SendOp::RdmaRead {
            remote_addr: 0,
            rkey: RKEY
        }
        .uses_ord());
        assert!(!SendOp::Send.uses_ord());
        assert!(SendOp::LocalInv {
            invalidate_stag: LKEY
        }
        .is_local());
        assert!(SendOp::AtomicFetchAdd {
            remote_addr: 0,
            rkey: RKEY,
            add: 1
        }
        .is_atomic());
    }

    #[test]
    fn valid_wrs_pass() {
        SendWr::send(1, vec![sge(10), sge(20)])
            .validate(&CAP)
            .unwrap();
        SendWr::send(1, vec![]).validate(&CAP).unwrap();
        SendWr::send_inline(2, vec![0; 64]).validate(&CAP).unwrap();
        SendWr::rdma_write_inline(2, vec![1; 3], 0x10, RKEY)
            .with_flags(SendFlags::SIGNALED | SendFlags::FENCE)
            .validate(&CAP)
            .unwrap();
        SendWr::rdma_read(3, vec![sge(4096)], 0x2000, RKEY)
            .validate(&CAP)
            .unwrap();
        SendWr::send(4, vec![sge(1)])
            .with_flags(SendFlags::SOLICITED)
            .validate(&CAP)
            .unwrap();
        SendWr::local_inv(5, RKEY).validate(&CAP).unwrap();
        let wr = SendWr {
            wr_id: 6,
            op: SendOp::AtomicFetchAdd {
                remote_addr: 0x1008,
                rkey: RKEY,
                add: 1,
            },
            flags: SendFlags::SIGNALED,
            payload: Payload::Sges(vec![sge(8)]),
        };
        wr.validate(&CAP).unwrap();
    }

    #[test]
    fn inline_rules() {
        assert_eq!(
            SendWr::send_inline(1, vec![0; 65]).validate(&CAP),
            Err(VerbsError::InlineTooLong { len: 65, max: 64 })
        );
        // INLINE flag without inline payload, and the reverse.
        let flag_only = SendWr::send(1, vec![sge(1)]).with_flags(SendFlags::INLINE);
        assert_eq!(
            flag_only.validate(&CAP),
            Err(VerbsError::InvalidArgument { what: "send_flags" })
        );
        let mut payload_only = SendWr::send_inline(1, vec![1]);
        payload_only.flags = SendFlags::empty();
        assert_eq!(
            payload_only.validate(&CAP),
            Err(VerbsError::InvalidArgument { what: "send_flags" })
        );
        // Inline RDMA Read is not a thing.
        let read = SendWr {
            wr_id: 1,
            op: SendOp::RdmaRead {
                remote_addr: 0,
                rkey: RKEY,
            },
            flags: SendFlags::INLINE,
            payload: Payload::Inline(vec![1]),
        };
        assert_eq!(
            read.validate(&CAP),
            Err(VerbsError::InvalidArgument { what: "send_flags" })
        );
    }

    #[test]
    fn solicited_only_on_sends_and_write_imm() {
        let w = SendWr::rdma_write(1, vec![sge(1)], 0, RKEY).with_flags(SendFlags::SOLICITED);
        assert_eq!(
            w.validate(&CAP),
            Err(VerbsError::InvalidArgument { what: "send_flags" })
        );
        let wi = SendWr {
            wr_id: 1,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: 0,
                rkey: RKEY,
                imm_data: 7,
            },
            flags: SendFlags::SOLICITED,
            payload: Payload::Sges(vec![sge(1)]),
        };
        wi.validate(&CAP).unwrap();
    }

    #[test]
    fn sge_limits() {
        assert_eq!(
            SendWr::send(1, vec![sge(1); 3]).validate(&CAP),
            Err(VerbsError::TooManySges { num_sge: 3, max: 2 })
        );
        let wrap = Sge::new(u64::MAX - 1, 4, LKEY);
        assert_eq!(wrap.end(), None);
        assert_eq!(sge(16).end(), Some(0x1010));
        assert_eq!(
            SendWr::send(1, vec![wrap]).validate(&CAP),
            Err(VerbsError::InvalidArgument { what: "sg_list" })
        );
        let big = QpCap {
            max_send_sge: 4,
            ..CAP
        };
        let too_long = SendWr::send(1, vec![sge(u32::MAX), sge(1)]);
        assert_eq!(
            too_long.validate(&big),
            Err(VerbsError::MessageTooLong {
                len: 1 << 32,
                max: u32::MAX as u64
            })
        );
        SendWr::send(1, vec![sge(u32::MAX)]).validate(&big).unwrap();
    }

    #[test]
    fn atomic_rules() {
        let mk = |addr: u64, sges: Vec<Sge>| SendWr {
            wr_id: 1,
            op: SendOp::AtomicCmpSwap {
                remote_addr: addr,
                rkey: RKEY,
                compare: 1,
                swap: 2,
            },
            flags: SendFlags::empty(),
            payload: Payload::Sges(sges),
        };
        mk(0x10, vec![sge(8)]).validate(&CAP).unwrap();
        assert_eq!(
            mk(0x14, vec![sge(8)]).validate(&CAP),
            Err(VerbsError::InvalidArgument {
                what: "remote_addr"
            })
        );
        assert_eq!(
            mk(0x10, vec![sge(4)]).validate(&CAP),
            Err(VerbsError::InvalidArgument { what: "sg_list" })
        );
        assert_eq!(
            mk(0x10, vec![]).validate(&CAP),
            Err(VerbsError::InvalidArgument { what: "sg_list" })
        );
        assert_eq!(
            mk(0x10, vec![sge(4), sge(4)]).validate(&CAP),
            Err(VerbsError::InvalidArgument { what: "sg_list" })
        );
    }

    #[test]
    fn local_ops_take_no_payload() {
        let mut wr = SendWr::local_inv(1, RKEY);
        wr.payload = Payload::Sges(vec![sge(4)]);
        assert_eq!(
            wr.validate(&CAP),
            Err(VerbsError::InvalidArgument { what: "sg_list" })
        );
        // Even a zero-length SGE is a payload the operation cannot take.
        wr.payload = Payload::Sges(vec![sge(0)]);
        assert_eq!(
            wr.validate(&CAP),
            Err(VerbsError::InvalidArgument { what: "sg_list" })
        );
    }

    #[test]
    fn fast_reg_rules() {
        let mr = Stag::new(0x42, 0x07).unwrap();
        let good = FastReg {
            mr,
            key: 0x08,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            iova: 0x7f00_0000_0000,
            length: 1 << 20,
        };
        assert_eq!(good.new_stag().raw(), 0x4208);
        SendWr::fast_reg(1, good).validate(&CAP).unwrap();

        let bad_access = FastReg {
            access: AccessFlags::REMOTE_WRITE,
            ..good
        };
        assert_eq!(
            SendWr::fast_reg(1, bad_access).validate(&CAP),
            Err(VerbsError::InvalidAccessFlags(
                AccessFlagsError::RemoteWriteWithoutLocalWrite
            ))
        );
        let zero = FastReg { length: 0, ..good };
        assert_eq!(
            SendWr::fast_reg(1, zero).validate(&CAP),
            Err(VerbsError::InvalidArgument { what: "length" })
        );
        let wrap = FastReg {
            iova: u64::MAX,
            length: 2,
            ..good
        };
        assert_eq!(
            SendWr::fast_reg(1, wrap).validate(&CAP),
            Err(VerbsError::InvalidArgument { what: "iova" })
        );
    }

    #[test]
    fn recv_wr_rules() {
        RecvWr::new(1, vec![sge(1), sge(2), sge(3)])
            .validate(&CAP)
            .unwrap();
        RecvWr::new(1, vec![]).validate(&CAP).unwrap();
        assert_eq!(RecvWr::new(1, vec![sge(5), sge(7)]).len(), 12);
        assert!(RecvWr::new(1, vec![]).is_empty());
        assert_eq!(
            RecvWr::new(1, vec![sge(1); 4]).validate(&CAP),
            Err(VerbsError::TooManySges { num_sge: 4, max: 3 })
        );
        assert_eq!(
            RecvWr::new(1, vec![sge(u32::MAX), sge(1)]).validate(&CAP),
            Err(VerbsError::MessageTooLong {
                len: 1 << 32,
                max: u32::MAX as u64
            })
        );
        assert_eq!(
            RecvWr::new(1, vec![Sge::new(u64::MAX, 1, LKEY)]).validate(&CAP),
            Err(VerbsError::InvalidArgument { what: "sg_list" })
        );
    }

    #[test]
    fn payload_len() {
        assert_eq!(Payload::default().len(), 0);
        assert!(Payload::default().is_empty());
        assert_eq!(Payload::Sges(vec![sge(3), sge(4)]).len(), 7);
        assert_eq!(Payload::Inline(vec![0; 9]).len(), 9);
        assert!(Payload::Inline(vec![]).is_inline());
    }
}
