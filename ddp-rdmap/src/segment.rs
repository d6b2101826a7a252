//! TX segmentation: one RDMAP message -> its DDP segment headers (RFC 5041 §5,
//! RFC 5040 §5).
//!
//! A message of `len` bytes (everything after the DDP header: payload, or the RDMAP
//! header of a Read Request / Terminate / Atomic / Immediate Data message) is cut
//! into segments of at most `MULPDU - header_len` bytes each: 1428 bytes tagged and
//! 1424 bytes untagged for the MULPDU of 1442 that a 1460-byte MSS gives
//! (`shared/pcaps`: a 64 KiB Write is 46 segments, a 64 KiB Send 47). Tagged
//! segments advance the TO, untagged ones the MO; only the last has L set. A
//! zero-length message is exactly one segment with L set (e.g. the zero-length
//! Write RTR of MPA peer-to-peer mode).
//!
//! MULPDU is at most [`MAX_MULPDU`] (65535 bytes: MPA's ULPDU_Length field is
//! 16 bits, RFC 5044 §4.1). The single-segment messages (Read Request,
//! Terminate, Immediate Data, Atomic Request / Response) are a fixed RDMAP
//! header and nothing else, so their length must be one of
//! [`allowed_lengths`].

use crate::ddp::{self, BufferModel};
use crate::rdmap::{
    Opcode, ATOMIC_REQUEST_LEN, ATOMIC_RESPONSE_LEN, IMMEDIATE_DATA_LEN, READ_REQUEST_LEN,
};
use crate::terminate::{
    CONTROL_LEN, MAX_LEN as TERMINATE_MAX_LEN, RDMA_HEADER_LEN, SEGMENT_LENGTH_LEN,
};
use crate::ulpdu::Header;
use core::fmt;

/// Largest MULPDU in bytes: 65535, the largest MPA ULPDU_Length (a 16-bit
/// field, RFC 5044 §4.1). [`Message::segments`] rejects a larger one.
pub const MAX_MULPDU: usize = u16::MAX as usize;

/// Message lengths (bytes after the DDP header) of a Terminate (RFC 5040 §4.8):
/// the 4-byte Terminate Control word; with D, the 2-byte DDP Segment Length
/// and the 14-byte tagged or 18-byte untagged terminated DDP header; with R,
/// the 28-byte terminated RDMA header. So 4, 20, 24, 32, 48 or 52.
const TERMINATE_LENGTHS: [u32; 6] = [
    CONTROL_LEN as u32,
    (CONTROL_LEN + SEGMENT_LENGTH_LEN + ddp::TAGGED_HEADER_LEN) as u32,
    (CONTROL_LEN + SEGMENT_LENGTH_LEN + ddp::UNTAGGED_HEADER_LEN) as u32,
    (CONTROL_LEN + RDMA_HEADER_LEN) as u32,
    (CONTROL_LEN + SEGMENT_LENGTH_LEN + ddp::TAGGED_HEADER_LEN + RDMA_HEADER_LEN) as u32,
    TERMINATE_MAX_LEN as u32,
];
const READ_REQUEST_LENGTHS: [u32; 1] = [READ_REQUEST_LEN as u32];
const IMMEDIATE_DATA_LENGTHS: [u32; 1] = [IMMEDIATE_DATA_LEN as u32];
const ATOMIC_REQUEST_LENGTHS: [u32; 1] = [ATOMIC_REQUEST_LEN as u32];
const ATOMIC_RESPONSE_LENGTHS: [u32; 1] = [ATOMIC_RESPONSE_LEN as u32];

/// The message lengths in bytes ([`Message::len`], everything after the DDP
/// header) that a single-segment opcode allows, its body being a fixed RDMAP
/// header; `None` for the opcodes that carry a payload of any length.
///
/// * Read Request: 28 (RFC 5040 §4.4).
/// * Terminate: 4, 20, 24, 32, 48 or 52 (RFC 5040 §4.8; at most
///   4 + 2 + 18 + 28 = 52).
/// * Immediate Data, with or without SE: 8 (RFC 7306 §6).
/// * Atomic Request: 52; Atomic Response: 12 (RFC 7306 §5).
pub const fn allowed_lengths(opcode: Opcode) -> Option<&'static [u32]> {
    match opcode {
        Opcode::ReadRequest => Some(&READ_REQUEST_LENGTHS),
        Opcode::Terminate => Some(&TERMINATE_LENGTHS),
        Opcode::ImmediateData | Opcode::ImmediateDataSE => Some(&IMMEDIATE_DATA_LENGTHS),
        Opcode::AtomicRequest => Some(&ATOMIC_REQUEST_LENGTHS),
        Opcode::AtomicResponse => Some(&ATOMIC_RESPONSE_LENGTHS),
        Opcode::Write
        | Opcode::ReadResponse
        | Opcode::Send
        | Opcode::SendInvalidate
        | Opcode::SendSE
        | Opcode::SendSEInvalidate => None,
    }
}

/// Where the message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Tagged buffer (Write, Read Response): Data Sink STag and starting TO.
    Tagged {
        /// Data Sink STag.
        stag: u32,
        /// Tagged Offset of the first byte, bytes.
        to: u64,
    },
    /// Untagged buffer: the message's MSN on the opcode's queue (see
    /// [`Opcode::queue`]), and the Invalidate STag for Send with Invalidate (sent
    /// as 0 for every other opcode).
    Untagged {
        /// Message Sequence Number.
        msn: u32,
        /// Invalidate STag (Send with (SE and) Invalidate only).
        inv_stag: u32,
    },
}

/// One RDMAP message to segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Message {
    /// The opcode; decides the buffer model and queue.
    pub opcode: Opcode,
    /// Message length in bytes after the DDP header: the payload of a Write,
    /// Read Response or Send; for the single-segment opcodes the RDMAP header
    /// that is their whole body, whose length must be one of
    /// [`allowed_lengths`] (Read Request 28, Terminate 4 to 52, ...).
    pub len: u32,
    /// Tagged or untagged placement.
    pub target: Target,
}

/// Why a message cannot be segmented as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    /// MULPDU over [`MAX_MULPDU`] (65535 bytes): no FPDU can carry such a
    /// ULPDU, MPA's ULPDU_Length being 16 bits (RFC 5044 §4.1).
    #[error("MULPDU {mulpdu} over {max}, the largest MPA ULPDU_Length")]
    MulpduTooLarge {
        /// MULPDU given, bytes.
        mulpdu: usize,
        /// [`MAX_MULPDU`], bytes.
        max: usize,
    },
    /// A single-segment message whose length is not one its opcode allows
    /// (see [`allowed_lengths`]): e.g. a Read Request that is not 28 bytes
    /// (RFC 5040 §4.4) or a Terminate over 52 (RFC 5040 §4.8).
    #[error("{opcode} of {len} bytes: its RDMAP header must be {allowed:?} bytes")]
    WrongLength {
        /// The opcode.
        opcode: Opcode,
        /// Message length given, bytes.
        len: u32,
        /// The lengths the opcode allows, bytes.
        allowed: &'static [u32],
    },
    /// MULPDU leaves no room for a payload byte after the `header_len`-byte header.
    #[error("MULPDU {mulpdu} leaves no payload room after a {header_len}-byte header")]
    MulpduTooSmall {
        /// MULPDU given, bytes.
        mulpdu: usize,
        /// DDP header length, bytes.
        header_len: usize,
    },
    /// The target's buffer model does not match the opcode.
    #[error("{opcode} cannot use this buffer model")]
    TargetMismatch {
        /// The opcode.
        opcode: Opcode,
    },
    /// A single-segment message (Read Request, Terminate, Atomic, Immediate Data)
    /// does not fit one segment.
    #[error("{opcode} of {len} bytes does not fit one segment of {max}")]
    TooLongForOneSegment {
        /// The opcode.
        opcode: Opcode,
        /// Message length, bytes.
        len: u32,
        /// Payload room of one segment, bytes.
        max: usize,
    },
    /// TO + length passes 2^64 (RFC 5041: TO wrap).
    #[error("TO {to:#x} + {len} wraps")]
    ToWrap {
        /// Starting TO.
        to: u64,
        /// Message length, bytes.
        len: u32,
    },
}

/// One DDP segment of a message: its header and which message bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Segment {
    /// The header to emit.
    pub header: Header,
    /// Offset in bytes of this segment's first payload byte within the message.
    pub offset: u32,
    /// Payload bytes in this segment.
    pub len: u32,
}

impl Segment {
    /// ULPDU length of this segment in bytes: header + payload.
    pub fn ulpdu_len(&self) -> usize {
        self.header.buffer_len() + self.len as usize
    }
}

/// Iterator over the segments of one message, in order.
#[derive(Debug, Clone)]
pub struct Segments {
    message: Message,
    per_segment: u32,
    next_offset: u32,
    remaining: usize,
}

impl Message {
    /// DDP header length for this message: 14 or 18 bytes.
    pub const fn header_len(&self) -> usize {
        ddp::header_len(self.opcode.is_tagged())
    }

    /// Payload bytes per full segment for a given MULPDU (`mulpdu - header_len`).
    pub const fn payload_per_segment(&self, mulpdu: usize) -> usize {
        mulpdu.saturating_sub(self.header_len())
    }

    /// The segments of this message for MULPDU `mulpdu` (bytes: the largest ULPDU
    /// the LLP carries in one FPDU, at most [`MAX_MULPDU`]).
    ///
    /// # Errors
    /// Checked in this order: [`SegmentError::MulpduTooLarge`] (over 65535),
    /// [`SegmentError::MulpduTooSmall`], [`SegmentError::TargetMismatch`],
    /// [`SegmentError::ToWrap`] (tagged opcodes),
    /// [`SegmentError::WrongLength`] (a single-segment opcode with a length
    /// outside [`allowed_lengths`]), [`SegmentError::TooLongForOneSegment`].
    pub fn segments(&self, mulpdu: usize) -> Result<Segments, SegmentError> {
        if mulpdu > MAX_MULPDU {
            return Err(SegmentError::MulpduTooLarge {
                mulpdu,
                max: MAX_MULPDU,
            });
        }
        let header_len = self.header_len();
        let room = self.payload_per_segment(mulpdu);
        if room == 0 {
            return Err(SegmentError::MulpduTooSmall { mulpdu, header_len });
        }
        match (self.opcode.is_tagged(), self.target) {
            (true, Target::Tagged { to, .. }) => {
                if self.len > 0 && to.checked_add(u64::from(self.len) - 1).is_none() {
                    return Err(SegmentError::ToWrap { to, len: self.len });
                }
            }
            (false, Target::Untagged { .. }) => {}
            _ => {
                return Err(SegmentError::TargetMismatch {
                    opcode: self.opcode,
                })
            }
        }
        if let Some(allowed) = allowed_lengths(self.opcode) {
            if !allowed.contains(&self.len) {
                return Err(SegmentError::WrongLength {
                    opcode: self.opcode,
                    len: self.len,
                    allowed,
                });
            }
        }
        // Bounded by MAX_MULPDU above.
        let per_segment = u32::try_from(room).unwrap_or(u32::MAX);
        let count = segment_count(self.len, per_segment);
        if self.opcode.is_single_segment() && count > 1 {
            return Err(SegmentError::TooLongForOneSegment {
                opcode: self.opcode,
                len: self.len,
                max: room,
            });
        }
        Ok(Segments {
            message: *self,
            per_segment,
            next_offset: 0,
            remaining: count,
        })
    }
}

/// Number of segments for `len` bytes at `per_segment` bytes each: at least 1.
pub const fn segment_count(len: u32, per_segment: u32) -> usize {
    if len == 0 || per_segment == 0 {
        1
    } else {
        len.div_ceil(per_segment) as usize
    }
}

impl Segments {
    /// The next segment like [`Iterator::next`], except that when more than one segment
    /// is left and the bytes left are not a whole number of full segments, this one
    /// carries only the remainder (`left mod per_segment` bytes, 1 to `per_segment - 1`),
    /// so that every later segment of the message is full. The number of segments, and
    /// so [`ExactSizeIterator::len`], is the same either way; only the position of the
    /// message's one short segment moves.
    ///
    /// RFC 5041 (section 5, and 8.1 for the MULPDU bound) lets a sender cut a message
    /// into segments of any sizes up to MULPDU; receivers place each by its TO or MO. A
    /// sender that packs FPDUs into TCP super-segments (segmentation offload, cut every
    /// MSS bytes) uses this for the segment that ends a super-segment, the one place a
    /// short FPDU may be: the message's remaining segments then are all full and the
    /// next super-segment can run on into the next message. Returns `None` when the
    /// message is done.
    pub fn next_remainder_first(&mut self) -> Option<Segment> {
        let left = self.message.len.saturating_sub(self.next_offset);
        let short = left % self.per_segment.max(1);
        if self.remaining > 1 && short != 0 {
            self.take(short)
        } else {
            self.next()
        }
    }

    /// Takes the next segment with at most `max` payload bytes.
    fn take(&mut self, max: u32) -> Option<Segment> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let offset = self.next_offset;
        let left = self.message.len - offset;
        let len = left.min(max);
        let last = self.remaining == 0;
        self.next_offset = offset + len;
        let buffer = match self.message.target {
            Target::Tagged { stag, to } => BufferModel::Tagged {
                stag,
                to: to.wrapping_add(u64::from(offset)),
            },
            Target::Untagged { msn, inv_stag } => BufferModel::Untagged {
                rsvd_ulp: if self.message.opcode.carries_invalidate_stag() {
                    inv_stag
                } else {
                    0
                },
                qn: self.message.opcode.queue().unwrap_or(0),
                msn,
                mo: offset,
            },
        };
        Some(Segment {
            header: Header {
                opcode: self.message.opcode,
                last,
                buffer,
            },
            offset,
            len,
        })
    }
}

impl Iterator for Segments {
    type Item = Segment;

    fn next(&mut self) -> Option<Segment> {
        self.take(self.per_segment)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Segments {}
impl core::iter::FusedIterator for Segments {}

impl fmt::Display for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} [{}..{}){}",
            self.header.opcode,
            self.offset,
            u64::from(self.offset) + u64::from(self.len),
            if self.header.last { " L" } else { "" }
        )
    }
}
