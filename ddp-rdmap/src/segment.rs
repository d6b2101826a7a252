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

use crate::ddp::{self, BufferModel};
use crate::rdmap::Opcode;
use crate::ulpdu::Header;
use core::fmt;

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
    /// Message length in bytes after the DDP header.
    pub len: u32,
    /// Tagged or untagged placement.
    pub target: Target,
}

/// Why a message cannot be segmented as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
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
    /// the LLP carries in one FPDU).
    ///
    /// # Errors
    /// [`SegmentError::MulpduTooSmall`], [`SegmentError::TargetMismatch`],
    /// [`SegmentError::TooLongForOneSegment`], [`SegmentError::ToWrap`].
    pub fn segments(&self, mulpdu: usize) -> Result<Segments, SegmentError> {
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
        // Payload room cannot usefully exceed u32 (MO is 32 bits).
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

impl Iterator for Segments {
    type Item = Segment;

    fn next(&mut self) -> Option<Segment> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let offset = self.next_offset;
        let left = self.message.len - offset;
        let len = left.min(self.per_segment);
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
