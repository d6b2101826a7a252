//! The DDP header (RFC 5041 §4).
//!
//! Every ULPDU starts with the DDP control byte `T|L|rsvd(4)|DV(2)` (RFC 5041 §4.1).
//! RFC 5041 then gives byte 1 to the ULP ("RsvdULP"); RDMAP uses it as its control
//! byte `RV(2)|rsvd(2)|opcode(4)` (RFC 5040 §4.1). This module models the DDP view
//! only and carries that byte opaquely as [`Repr::rsvd_ulp`]; [`crate::rdmap`]
//! interprets it and [`crate::ulpdu::Header`] is the combined DDP + RDMAP header
//! that the rest of the stack uses.
//!
//! ```text
//! tagged (RFC 5041 §4.2), 14 bytes:
//!  0        1        2..6     6..14
//!  |T L rsvd DV| RsvdULP | STag | TO (64 bits) |
//! untagged (RFC 5041 §4.3), 18 bytes:
//!  0        1        2..6          6..10  10..14  14..18
//!  |T L rsvd DV| RsvdULP | RsvdULP (32) | QN | MSN | MO |
//! ```
//! All multi-byte fields are big-endian.

use crate::error::{check_in, check_out, Error, Field, Result};
use crate::wire;

/// DDP Version this crate speaks: DV = 01b (RFC 5041 §4.1).
pub const DDP_VERSION: u8 = 1;
/// Length in bytes of a tagged DDP header, control byte to TO (RFC 5041 §4.2).
pub const TAGGED_HEADER_LEN: usize = 14;
/// Length in bytes of an untagged DDP header, control byte to MO (RFC 5041 §4.3).
pub const UNTAGGED_HEADER_LEN: usize = 18;

/// T flag (Tagged) in the DDP control byte, bit 0 (RFC 5041 §4.1).
pub const FLAG_T: u8 = 0x80;
/// L flag (Last) in the DDP control byte, bit 1 (RFC 5041 §4.1).
pub const FLAG_L: u8 = 0x40;
/// Reserved bits 2..5 of the DDP control byte: sent as zero, ignored on receipt
/// (RFC 5041 §4.1).
pub const RSVD_MASK: u8 = 0x3c;
/// DV (DDP Version) bits 6..7 of the DDP control byte (RFC 5041 §4.1).
pub const DV_MASK: u8 = 0x03;

/// Byte offsets of the DDP header fields (RFC 5041 §4.1-4.3).
pub mod field {
    use core::ops::Range;
    /// DDP control byte: T, L, reserved, DV.
    pub const CONTROL: usize = 0;
    /// First RsvdULP byte (the RDMAP control byte when the ULP is RDMAP).
    pub const RSVD_ULP: usize = 1;
    /// Tagged: Data Sink STag, 32 bits.
    pub const STAG: Range<usize> = 2..6;
    /// Tagged: Data Sink Tagged Offset, 64 bits.
    pub const TO: Range<usize> = 6..14;
    /// Untagged: the remaining 32 RsvdULP bits (RDMAP: Invalidate STag or reserved).
    pub const RSVD_ULP_WORD: Range<usize> = 2..6;
    /// Untagged: Queue Number, 32 bits.
    pub const QN: Range<usize> = 6..10;
    /// Untagged: Message Sequence Number, 32 bits.
    pub const MSN: Range<usize> = 10..14;
    /// Untagged: Message Offset in bytes, 32 bits.
    pub const MO: Range<usize> = 14..18;
}

/// Header length in bytes for a segment whose T flag is `tagged`: 14 or 18.
pub const fn header_len(tagged: bool) -> usize {
    if tagged {
        TAGGED_HEADER_LEN
    } else {
        UNTAGGED_HEADER_LEN
    }
}

/// A zero-copy view of a DDP segment (a ULPDU): header then payload.
///
/// After [`Packet::new_checked`] the buffer holds the whole header its T flag calls
/// for, so every accessor returns real header bytes; no accessor ever panics (on a
/// short unchecked buffer they read zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` and checks it holds the full DDP header (14 bytes if T is
    /// set, 18 if not).
    ///
    /// # Errors
    /// [`Error::Truncated`] with [`Field::DdpHeader`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the buffer holds the whole header; see [`Packet::new_checked`].
    ///
    /// # Errors
    /// [`Error::Truncated`] with [`Field::DdpHeader`].
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        check_in(Field::DdpHeader, 1, len)?;
        check_in(Field::DdpHeader, self.header_len(), len)
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The raw DDP control byte (byte 0).
    pub fn control(&self) -> u8 {
        wire::u8_at(self.buffer.as_ref(), field::CONTROL)
    }

    /// T flag: the segment uses the tagged buffer model (RFC 5041 §4.1).
    pub fn tagged(&self) -> bool {
        self.control() & FLAG_T != 0
    }

    /// L flag: last segment of its DDP message (RFC 5041 §4.1).
    pub fn last(&self) -> bool {
        self.control() & FLAG_L != 0
    }

    /// The 4 reserved bits of the control byte, shifted down (should be 0).
    pub fn reserved(&self) -> u8 {
        (self.control() & RSVD_MASK) >> 2
    }

    /// DV, the DDP version (2 bits; must be 1).
    pub fn version(&self) -> u8 {
        self.control() & DV_MASK
    }

    /// Byte 1, the first RsvdULP byte: RDMAP's control byte (RFC 5040 §4.1).
    pub fn rsvd_ulp(&self) -> u8 {
        wire::u8_at(self.buffer.as_ref(), field::RSVD_ULP)
    }

    /// Header length in bytes implied by the T flag: 14 or 18.
    pub fn header_len(&self) -> usize {
        header_len(self.tagged())
    }

    /// Data Sink STag, if tagged.
    pub fn stag(&self) -> Option<u32> {
        self.tagged()
            .then(|| wire::u32_in(self.buffer.as_ref(), field::STAG))
    }

    /// Data Sink Tagged Offset (bytes), if tagged.
    pub fn tagged_offset(&self) -> Option<u64> {
        self.tagged()
            .then(|| wire::u64_in(self.buffer.as_ref(), field::TO))
    }

    /// The 32-bit RsvdULP word of an untagged header (RDMAP: Invalidate STag).
    pub fn rsvd_ulp_word(&self) -> Option<u32> {
        (!self.tagged()).then(|| wire::u32_in(self.buffer.as_ref(), field::RSVD_ULP_WORD))
    }

    /// Queue Number, if untagged.
    pub fn qn(&self) -> Option<u32> {
        (!self.tagged()).then(|| wire::u32_in(self.buffer.as_ref(), field::QN))
    }

    /// Message Sequence Number, if untagged.
    pub fn msn(&self) -> Option<u32> {
        (!self.tagged()).then(|| wire::u32_in(self.buffer.as_ref(), field::MSN))
    }

    /// Message Offset in bytes, if untagged.
    pub fn mo(&self) -> Option<u32> {
        (!self.tagged()).then(|| wire::u32_in(self.buffer.as_ref(), field::MO))
    }

    /// The bytes after the DDP header (empty if the buffer is short).
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        wire::slice(b, self.header_len()..b.len())
    }
}

/// Which DDP buffer model a segment uses, with that model's header fields
/// (RFC 5041 §4.2, §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferModel {
    /// Tagged buffer model: data is placed at `to` in the buffer named by `stag`.
    Tagged {
        /// Data Sink STag.
        stag: u32,
        /// Data Sink Tagged Offset, in bytes.
        to: u64,
    },
    /// Untagged buffer model: data is placed at `mo` in the `msn`-th buffer of
    /// queue `qn`.
    Untagged {
        /// The 32 RsvdULP bits after the control bytes (RDMAP: Invalidate STag for
        /// Send with Invalidate, otherwise reserved and sent as 0).
        rsvd_ulp: u32,
        /// Queue Number.
        qn: u32,
        /// Message Sequence Number (first message on a queue is 1).
        msn: u32,
        /// Message Offset, in bytes from the start of the message.
        mo: u32,
    },
}

impl BufferModel {
    /// True for the tagged model.
    pub const fn is_tagged(&self) -> bool {
        matches!(self, BufferModel::Tagged { .. })
    }

    /// Header length in bytes: 14 (tagged) or 18 (untagged).
    pub const fn header_len(&self) -> usize {
        header_len(self.is_tagged())
    }
}

/// A validated DDP header (RFC 5041 §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// L flag: last segment of the DDP message.
    pub last: bool,
    /// Byte 1, the first RsvdULP byte (carried opaquely; RDMAP's control byte).
    pub rsvd_ulp: u8,
    /// Buffer model and its fields.
    pub buffer: BufferModel,
}

impl Repr {
    /// Parses and validates the DDP header of a checked packet.
    ///
    /// # Errors
    /// [`Error::DdpVersion`] if DV is not 1 (reserved bits are ignored, RFC 5041
    /// §4.1); [`Error::Truncated`] if the packet was not checked and is short.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        if packet.version() != DDP_VERSION {
            return Err(Error::DdpVersion {
                dv: packet.version(),
                tagged: packet.tagged(),
            });
        }
        packet.check_len()?;
        let b = packet.buffer.as_ref();
        let buffer = if packet.tagged() {
            BufferModel::Tagged {
                stag: wire::u32_in(b, field::STAG),
                to: wire::u64_in(b, field::TO),
            }
        } else {
            BufferModel::Untagged {
                rsvd_ulp: wire::u32_in(b, field::RSVD_ULP_WORD),
                qn: wire::u32_in(b, field::QN),
                msn: wire::u32_in(b, field::MSN),
                mo: wire::u32_in(b, field::MO),
            }
        };
        Ok(Repr {
            last: packet.last(),
            rsvd_ulp: packet.rsvd_ulp(),
            buffer,
        })
    }

    /// Header length in bytes: 14 or 18.
    pub const fn buffer_len(&self) -> usize {
        self.buffer.header_len()
    }

    /// Writes the header into the first `buffer_len()` bytes of `buf` with DV = 1
    /// and the reserved bits zero.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(self.buffer_len(), buf.len())?;
        let mut ctrl = DDP_VERSION;
        if self.last {
            ctrl |= FLAG_L;
        }
        match self.buffer {
            BufferModel::Tagged { stag, to } => {
                ctrl |= FLAG_T;
                wire::put_u32(buf, field::STAG, stag);
                wire::put_u64(buf, field::TO, to);
            }
            BufferModel::Untagged {
                rsvd_ulp,
                qn,
                msn,
                mo,
            } => {
                wire::put_u32(buf, field::RSVD_ULP_WORD, rsvd_ulp);
                wire::put_u32(buf, field::QN, qn);
                wire::put_u32(buf, field::MSN, msn);
                wire::put_u32(buf, field::MO, mo);
            }
        }
        wire::put(buf, field::CONTROL, &[ctrl, self.rsvd_ulp]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // rping.pcap frame 15: RDMA Write, last, STag 0xd294a400, TO 0x55d41928df30.
    static TAGGED: [u8; 14] = [
        0xc1, 0x40, 0xd2, 0x94, 0xa4, 0x00, 0x00, 0x00, 0x55, 0xd4, 0x19, 0x28, 0xdf, 0x30,
    ];
    // rping.pcap frame 10: Send, last, QN 0, MSN 1, MO 0.
    static UNTAGGED: [u8; 18] = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&TAGGED[..]).unwrap();
        assert!(p.tagged() && p.last());
        assert_eq!(p.version(), 1);
        assert_eq!(p.reserved(), 0);
        assert_eq!(p.rsvd_ulp(), 0x40);
        assert_eq!(p.stag(), Some(0xd294_a400));
        assert_eq!(p.tagged_offset(), Some(0x55d4_1928_df30));
        assert_eq!(p.qn(), None);
        assert_eq!(p.payload(), &[] as &[u8]);

        let p = Packet::new_checked(&UNTAGGED[..]).unwrap();
        assert!(!p.tagged() && p.last());
        assert_eq!(p.rsvd_ulp(), 0x43);
        assert_eq!(
            (p.rsvd_ulp_word(), p.qn(), p.msn(), p.mo()),
            (Some(0), Some(0), Some(1), Some(0))
        );
        assert_eq!(p.stag(), None);
    }

    #[test]
    fn construct() {
        let r = Repr {
            last: true,
            rsvd_ulp: 0x40,
            buffer: BufferModel::Tagged {
                stag: 0xd294_a400,
                to: 0x55d4_1928_df30,
            },
        };
        let mut b = [0xffu8; 14];
        r.emit(&mut b).unwrap();
        assert_eq!(b, TAGGED);
        let r = Repr {
            last: true,
            rsvd_ulp: 0x43,
            buffer: BufferModel::Untagged {
                rsvd_ulp: 0,
                qn: 0,
                msn: 1,
                mo: 0,
            },
        };
        let mut b = [0xffu8; 18];
        r.emit(&mut b).unwrap();
        assert_eq!(b, UNTAGGED);
        assert_eq!(
            r.emit(&mut [0u8; 17]),
            Err(Error::BufferTooSmall {
                needed: 18,
                len: 17
            })
        );
    }

    #[test]
    fn parse_round_trip() {
        let r = Repr::parse(&Packet::new_checked(&TAGGED[..]).unwrap()).unwrap();
        assert!(r.last);
        assert_eq!(
            r.buffer,
            BufferModel::Tagged {
                stag: 0xd294_a400,
                to: 0x55d4_1928_df30
            }
        );
    }

    #[test]
    fn truncated() {
        assert_eq!(
            Packet::new_checked(&TAGGED[..13]).unwrap_err(),
            Error::Truncated {
                field: Field::DdpHeader,
                needed: 14,
                len: 13
            }
        );
        assert_eq!(
            Packet::new_checked(&[][..]).unwrap_err(),
            Error::Truncated {
                field: Field::DdpHeader,
                needed: 1,
                len: 0
            }
        );
        // An unchecked view of a short buffer reads zeros and does not panic.
        let p = Packet::new_unchecked(&UNTAGGED[..3]);
        assert_eq!(p.mo(), Some(0));
        assert_eq!(p.payload(), &[] as &[u8]);
    }

    #[test]
    fn impossible_len() {
        // Tagged control byte on an untagged-sized buffer is fine; an untagged
        // control byte on a tagged-sized (14-byte) buffer is short.
        let mut b = TAGGED;
        b[0] = 0x41;
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap_err(),
            Error::Truncated {
                field: Field::DdpHeader,
                needed: 18,
                len: 14
            }
        );
    }

    #[test]
    fn bad_version() {
        for dv in [0u8, 2, 3] {
            let mut b = TAGGED;
            b[0] = 0xc0 | dv;
            let p = Packet::new_checked(&b[..]).unwrap();
            assert_eq!(Repr::parse(&p), Err(Error::DdpVersion { dv, tagged: true }));
        }
        // Reserved bits are ignored on receipt.
        let mut b = UNTAGGED;
        b[0] |= RSVD_MASK;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.reserved(), 0xf);
        assert!(Repr::parse(&p).is_ok());
    }
}
