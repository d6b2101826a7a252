//! Receive-side DDP/RDMAP bookkeeping and checks (RFC 5041 §5, §7; RFC 5040 §5,
//! §7): sans-IO, deterministic, no clocks.
//!
//! [`Receiver`] follows the untagged queues of one RDMAP Stream (QN 0 Send, 1 Read
//! Request, 2 Terminate, and 3 Atomic Response when RFC 7306 atomics are on) and
//! checks each incoming segment header before its payload is placed. Every check
//! returns the [`ErrorCause`] (layer / error type / error code) to put in the
//! Terminate, ready for [`crate::terminate::Repr::for_error`].
//!
//! Checks that need the memory registration table (STag lookup, PD, access rights,
//! bounds) belong to the device and are not here; the tagged check here is TO wrap.
//!
//! Untagged rules, per queue (MSN arithmetic is modulo 2^32):
//!
//! * MSN of the first message is 1 (RFC 5041 §4.3, MSN); each completed message (L = 1)
//!   consumes one posted buffer and advances the expected MSN by one.
//! * A segment with an MSN behind the expected one -> "Invalid MSN - MSN range is
//!   not valid"; one beyond the posted buffers (including any MSN when none is
//!   posted) -> "Invalid MSN - no buffer available"; one for a later posted buffer
//!   while an earlier message is unfinished -> "MSN range is not valid" (MPA/TCP
//!   deliver in order, so a skipped message is a protocol error).
//! * The first segment of a message has MO 0; a continuation has the MO where the
//!   previous segment ended. Otherwise (including a continuation with no first
//!   segment) -> "Invalid MO".
//! * MO + segment length beyond the buffer -> "DDP Message too long for available
//!   buffer".
//! * QN unknown, or not the queue the opcode uses -> "Invalid QN".

use crate::ddp::BufferModel;
use crate::rdmap::{AtomicRequestRepr, Opcode, ReadRequestRepr, QN_ATOMIC_RESPONSE};
use crate::terminate::{
    DdpTaggedCode, DdpUntaggedCode, ErrorCause, RdmapOperationCode, RdmapProtectionCode,
};
use crate::ulpdu::{Header, Ulpdu};
use std::collections::VecDeque;

/// The MSN of the first message on every untagged queue (RFC 5041 §4.3, MSN).
pub const INITIAL_MSN: u32 = 1;

/// Bookkeeping of one untagged queue: expected MSN, progress of the message in
/// flight, and the buffers posted for the next messages (their sizes in bytes).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UntaggedQueue {
    next_msn: u32,
    next_mo: u32,
    in_progress: bool,
    buffers: VecDeque<u32>,
}

/// Where an accepted untagged segment goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UntaggedPlacement {
    /// Queue Number.
    pub qn: u32,
    /// Message Sequence Number.
    pub msn: u32,
    /// Message Offset of the segment's first byte.
    pub mo: u32,
    /// Segment payload length, bytes.
    pub len: u32,
    /// Size of the buffer the message lands in, bytes.
    pub buffer_len: u32,
    /// True if this segment starts the message.
    pub first: bool,
    /// True if this segment ends the message (the buffer is consumed).
    pub last: bool,
}

impl UntaggedQueue {
    /// An empty queue expecting MSN 1, with no buffer posted.
    pub fn new() -> Self {
        UntaggedQueue {
            next_msn: INITIAL_MSN,
            next_mo: 0,
            in_progress: false,
            buffers: VecDeque::new(),
        }
    }

    /// The MSN of the message in flight, or of the next one.
    pub fn next_msn(&self) -> u32 {
        self.next_msn
    }

    /// The MO the next segment of the message in flight must have; `None` if no
    /// message is in flight (the next segment must then start one, MO 0).
    pub fn expected_mo(&self) -> Option<u32> {
        self.in_progress.then_some(self.next_mo)
    }

    /// Number of posted buffers, including the one the message in flight uses.
    pub fn posted(&self) -> usize {
        self.buffers.len()
    }

    /// Posts a buffer of `len` bytes for a future message.
    pub fn post_buffer(&mut self, len: u32) {
        self.buffers.push_back(len);
    }

    /// Checks a segment (MSN, MO, payload length) without changing state.
    ///
    /// # Errors
    /// DDP Untagged Buffer Errors: `InvalidMsnRange`, `InvalidMsnNoBuffer`,
    /// `InvalidMo`, `MessageTooLong` (rules in the module doc).
    pub fn check(&self, msn: u32, mo: u32, len: u32) -> Result<u32, ErrorCause> {
        let untagged = |c| Err(ErrorCause::DdpUntagged(c));
        let ahead = msn.wrapping_sub(self.next_msn);
        if ahead >= 1 << 31 {
            return untagged(DdpUntaggedCode::InvalidMsnRange);
        }
        if ahead as usize >= self.buffers.len() {
            return untagged(DdpUntaggedCode::InvalidMsnNoBuffer);
        }
        if ahead != 0 {
            return untagged(DdpUntaggedCode::InvalidMsnRange);
        }
        let expected_mo = if self.in_progress { self.next_mo } else { 0 };
        if mo != expected_mo {
            return untagged(DdpUntaggedCode::InvalidMo);
        }
        let buffer_len = self.buffers.front().copied().unwrap_or(0);
        if u64::from(mo) + u64::from(len) > u64::from(buffer_len) {
            return untagged(DdpUntaggedCode::MessageTooLong);
        }
        Ok(buffer_len)
    }

    /// Checks a segment and, if it passes, records it: a last segment completes the
    /// message, consumes its buffer and advances the MSN.
    ///
    /// # Errors
    /// As [`UntaggedQueue::check`]; state is unchanged on error.
    pub fn accept(
        &mut self,
        qn: u32,
        msn: u32,
        mo: u32,
        len: u32,
        last: bool,
    ) -> Result<UntaggedPlacement, ErrorCause> {
        let buffer_len = self.check(msn, mo, len)?;
        let first = !self.in_progress;
        if last {
            self.buffers.pop_front();
            self.next_msn = self.next_msn.wrapping_add(1);
            self.next_mo = 0;
            self.in_progress = false;
        } else {
            self.next_mo = mo + len;
            self.in_progress = true;
        }
        Ok(UntaggedPlacement {
            qn,
            msn,
            mo,
            len,
            buffer_len,
            first,
            last,
        })
    }
}

/// Where an accepted segment goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Accepted {
    /// Tagged: place `len` bytes at (`stag`, `to`) after the device's STag checks.
    Tagged {
        /// The opcode (Write or Read Response).
        opcode: Opcode,
        /// Data Sink STag.
        stag: u32,
        /// Tagged Offset of the first byte.
        to: u64,
        /// Payload length, bytes.
        len: u32,
        /// L flag.
        last: bool,
    },
    /// Untagged: place into the queue's current buffer.
    Untagged {
        /// The opcode.
        opcode: Opcode,
        /// The placement.
        placement: UntaggedPlacement,
    },
}

/// Receive-side checker for one RDMAP Stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receiver {
    queues: [UntaggedQueue; 4],
    atomics: bool,
}

impl Receiver {
    /// A receiver with every queue at MSN 1. QN 2 (Terminate) gets its single
    /// buffer of [`crate::terminate::MAX_LEN`] (52) bytes posted; the caller posts
    /// QN 0 buffers (receive WQEs), QN 1 buffers (one 28-byte buffer per IRD
    /// credit) and, with `atomics`, QN 3 buffers (one 12-byte buffer per
    /// outstanding Atomic Request).
    pub fn new(atomics: bool) -> Self {
        let mut r = Receiver {
            queues: Default::default(),
            atomics,
        };
        for q in &mut r.queues {
            *q = UntaggedQueue::new();
        }
        r.queues[2].post_buffer(crate::terminate::MAX_LEN as u32);
        r
    }

    /// True if QN 3 and the RFC 7306 atomic opcodes are accepted.
    pub fn atomics(&self) -> bool {
        self.atomics
    }

    fn qn_valid(&self, qn: u32) -> bool {
        qn < QN_ATOMIC_RESPONSE || (self.atomics && qn == QN_ATOMIC_RESPONSE)
    }

    /// The queue `qn`, if this stream has it.
    pub fn queue(&self, qn: u32) -> Option<&UntaggedQueue> {
        if self.qn_valid(qn) {
            self.queues.get(qn as usize)
        } else {
            None
        }
    }

    /// Posts a buffer of `len` bytes on queue `qn`.
    ///
    /// # Errors
    /// DDP Untagged "Invalid QN" if the stream has no such queue.
    pub fn post_buffer(&mut self, qn: u32, len: u32) -> Result<(), ErrorCause> {
        if !self.qn_valid(qn) {
            return Err(ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidQn));
        }
        match self.queues.get_mut(qn as usize) {
            Some(q) => {
                q.post_buffer(len);
                Ok(())
            }
            None => Err(ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidQn)),
        }
    }

    /// Checks one segment header with `len` bytes after the DDP header, and records
    /// it if it passes.
    ///
    /// # Errors
    /// RDMAP Remote Operation "Unexpected OpCode" for an atomic opcode when atomics
    /// are off; DDP Untagged Buffer Errors from the queue rules (module doc),
    /// "Invalid QN" for a QN that does not exist or is not the opcode's; DDP Tagged
    /// "TO wrap" ([`check_tagged`]).
    pub fn handle(&mut self, header: &Header, len: u32) -> Result<Accepted, ErrorCause> {
        let op = header.opcode;
        if matches!(op, Opcode::AtomicRequest | Opcode::AtomicResponse) && !self.atomics {
            return Err(ErrorCause::RdmapRemoteOperation(
                RdmapOperationCode::UnexpectedOpcode,
            ));
        }
        match header.buffer {
            BufferModel::Tagged { stag, to } => {
                check_tagged(to, len)?;
                Ok(Accepted::Tagged {
                    opcode: op,
                    stag,
                    to,
                    len,
                    last: header.last,
                })
            }
            BufferModel::Untagged { qn, msn, mo, .. } => {
                if !self.qn_valid(qn) || op.queue() != Some(qn) {
                    return Err(ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidQn));
                }
                let q = self
                    .queues
                    .get_mut(qn as usize)
                    .ok_or(ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidQn))?;
                let placement = q.accept(qn, msn, mo, len, header.last)?;
                Ok(Accepted::Untagged {
                    opcode: op,
                    placement,
                })
            }
        }
    }

    /// [`Receiver::handle`] for a parsed ULPDU (length = bytes after its DDP
    /// header).
    ///
    /// # Errors
    /// As [`Receiver::handle`].
    pub fn handle_ulpdu(&mut self, ulpdu: &Ulpdu<'_>) -> Result<Accepted, ErrorCause> {
        let len = u32::try_from(ulpdu.ddp_payload_len()).unwrap_or(u32::MAX);
        self.handle(&ulpdu.header, len)
    }
}

/// The tagged check that needs no memory registration: the segment's last byte
/// must not pass TO 2^64 - 1.
///
/// # Errors
/// DDP Tagged Buffer Error "TO wrap" (0x1/0x1/0x03).
pub fn check_tagged(to: u64, len: u32) -> Result<(), ErrorCause> {
    if len > 0 && to.checked_add(u64::from(len) - 1).is_none() {
        return Err(ErrorCause::DdpTagged(DdpTaggedCode::ToWrap));
    }
    Ok(())
}

/// Checks an incoming Atomic Request before the responder looks up its target: the
/// Remote Tagged Offset must be 8-byte aligned (RFC 7306 §5). RFC 7306 adds no RDMAP
/// error code (the IANA "RDMAP Errors" registry, updated when it was published, holds
/// only RFC 5040's), so a misaligned target is reported as the Remote Protection Error
/// "Base or bounds violation": it is not a valid 64-bit word of any registration. An
/// aligned TO cannot wrap (the last aligned word ends at 2^64 - 1).
///
/// # Errors
/// RDMAP Remote Protection Error "Base or bounds violation" (0x0/0x1/0x01).
pub fn check_atomic_request(ar: &AtomicRequestRepr) -> Result<(), ErrorCause> {
    if !ar.is_aligned() {
        return Err(ErrorCause::RdmapRemoteProtection(
            RdmapProtectionCode::BaseOrBoundsViolation,
        ));
    }
    Ok(())
}

/// Checks an incoming RDMA Read Request before the responder looks up its source
/// buffer: the Data Source range must not wrap, nor the Data Sink range.
///
/// # Errors
/// RDMAP Remote Protection Error "TO wrap" (0x0/0x1/0x04).
pub fn check_read_request(rr: &ReadRequestRepr) -> Result<(), ErrorCause> {
    let wraps = |to: u64| rr.size > 0 && to.checked_add(u64::from(rr.size) - 1).is_none();
    if wraps(rr.src_to) || wraps(rr.sink_to) {
        return Err(ErrorCause::RdmapRemoteProtection(
            RdmapProtectionCode::ToWrap,
        ));
    }
    Ok(())
}
