//! RDMAP (RFC 5040 §4, extended by RFC 7306): the control byte and opcodes, the
//! queues the untagged messages use, and the fixed RDMAP headers that follow the DDP
//! header (Read Request; Atomic Request / Response; Immediate Data).
//!
//! The RDMAP control byte is byte 1 of the ULPDU (DDP's first RsvdULP byte):
//! `RV(2) | rsvd(2) | opcode(4)` with RV = 01b (RFC 5040 §4.1).
//!
//! Opcodes (RFC 5040 §4.2 Figure 3; RFC 7306 for 0x8-0xB). 0x0-0x7 match Linux siw
//! and Wireshark's iwarp-ddp-rdmap dissector; 0xA/0xB match Wireshark; 0x8-0xB match
//! the opcode tables of the urdma userspace iWARP stack and of Chelsio's firmware
//! header (its RFC 7306 block):
//!
//! | value | opcode | T | QN |
//! |---|---|---|---|
//! | 0x0 | RDMA Write | 1 | - |
//! | 0x1 | RDMA Read Request | 0 | 1 |
//! | 0x2 | RDMA Read Response | 1 | - |
//! | 0x3 | Send | 0 | 0 |
//! | 0x4 | Send with Invalidate | 0 | 0 |
//! | 0x5 | Send with Solicited Event | 0 | 0 |
//! | 0x6 | Send with Solicited Event and Invalidate | 0 | 0 |
//! | 0x7 | Terminate | 0 | 2 |
//! | 0x8 | Immediate Data (RFC 7306) | 0 | 0 |
//! | 0x9 | Immediate Data with Solicited Event (RFC 7306) | 0 | 0 |
//! | 0xA | Atomic Request (RFC 7306) | 0 | 1 |
//! | 0xB | Atomic Response (RFC 7306) | 0 | 3 |
//!
//! 0xC-0xF are not assigned. RFC 7306 assigns no "Write with Immediate" opcode: a
//! verbs RDMA Write with Immediate maps onto an RDMA Write followed by an Immediate
//! Data message (QN 0, consuming a receive buffer like a Send).

use crate::error::{check_in, check_out, Error, Field, Result};
use crate::wire;

pub use crate::opcode::{
    Opcode, OPCODE_MASK, QN_ATOMIC_RESPONSE, QN_READ_REQUEST, QN_SEND, QN_TERMINATE, RDMAP_VERSION,
    RSVD_MASK, RV_MASK,
};

impl Opcode {
    /// Length in bytes of the fixed RDMAP header that makes up the whole message
    /// after the DDP header, for the fixed-size messages: Read Request 28, Immediate
    /// Data 8, Atomic Request 52, Atomic Response 12. `None` for the others
    /// (Terminate is variable, see [`crate::terminate`]).
    pub const fn body_len(self) -> Option<usize> {
        match self {
            Opcode::ReadRequest => Some(READ_REQUEST_LEN),
            Opcode::ImmediateData | Opcode::ImmediateDataSE => Some(IMMEDIATE_DATA_LEN),
            Opcode::AtomicRequest => Some(ATOMIC_REQUEST_LEN),
            Opcode::AtomicResponse => Some(ATOMIC_RESPONSE_LEN),
            _ => None,
        }
    }

    /// Parses an RDMAP control byte (RFC 5040 §4.1): RV must be 1, reserved bits
    /// are ignored, the opcode must be defined.
    ///
    /// # Errors
    /// [`Error::RdmapVersion`], [`Error::UnknownOpcode`].
    pub const fn parse_control(byte: u8) -> Result<Opcode> {
        let rv = (byte & RV_MASK) >> 6;
        if rv != RDMAP_VERSION {
            return Err(Error::RdmapVersion { rv });
        }
        match Opcode::from_u8(byte & OPCODE_MASK) {
            Some(op) => Ok(op),
            None => Err(Error::UnknownOpcode {
                opcode: byte & OPCODE_MASK,
            }),
        }
    }
}

/// Length in bytes of the RDMA Read Request header (RFC 5040 §4.4).
pub const READ_REQUEST_LEN: usize = 28;

/// Byte offsets in the RDMA Read Request header, counted from its start (the byte
/// after the 18-byte untagged DDP header) (RFC 5040 §4.4).
pub mod read_request_field {
    use core::ops::Range;
    /// Data Sink STag, 32 bits.
    pub const SINK_STAG: Range<usize> = 0..4;
    /// Data Sink Tagged Offset, 64 bits.
    pub const SINK_TO: Range<usize> = 4..12;
    /// RDMA Read Message Size in bytes, 32 bits.
    pub const SIZE: Range<usize> = 12..16;
    /// Data Source STag, 32 bits.
    pub const SRC_STAG: Range<usize> = 16..20;
    /// Data Source Tagged Offset, 64 bits.
    pub const SRC_TO: Range<usize> = 20..28;
}

/// A zero-copy view of an RDMA Read Request header (RFC 5040 §4.4). Accessors never
/// panic; after [`ReadRequestPacket::new_checked`] they read real bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequestPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ReadRequestPacket<T> {
    /// Wraps `buffer` (starting at the Data Sink STag) without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        ReadRequestPacket { buffer }
    }

    /// Wraps `buffer` and checks it holds 28 bytes.
    ///
    /// # Errors
    /// [`Error::Truncated`] with [`Field::ReadRequest`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_in(Field::ReadRequest, READ_REQUEST_LEN, buffer.as_ref().len())?;
        Ok(ReadRequestPacket { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Data Sink STag: where the Read Response data goes (requester's buffer).
    pub fn sink_stag(&self) -> u32 {
        wire::u32_in(self.buffer.as_ref(), read_request_field::SINK_STAG)
    }

    /// Data Sink Tagged Offset, bytes.
    pub fn sink_to(&self) -> u64 {
        wire::u64_in(self.buffer.as_ref(), read_request_field::SINK_TO)
    }

    /// RDMA Read Message Size, bytes.
    pub fn size(&self) -> u32 {
        wire::u32_in(self.buffer.as_ref(), read_request_field::SIZE)
    }

    /// Data Source STag: the responder's buffer to read from.
    pub fn src_stag(&self) -> u32 {
        wire::u32_in(self.buffer.as_ref(), read_request_field::SRC_STAG)
    }

    /// Data Source Tagged Offset, bytes.
    pub fn src_to(&self) -> u64 {
        wire::u64_in(self.buffer.as_ref(), read_request_field::SRC_TO)
    }
}

/// An RDMA Read Request header (RFC 5040 §4.4): read `size` bytes at
/// (`src_stag`, `src_to`) on the responder and write them to (`sink_stag`,
/// `sink_to`) on the requester.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReadRequestRepr {
    /// Data Sink STag.
    pub sink_stag: u32,
    /// Data Sink Tagged Offset, bytes.
    pub sink_to: u64,
    /// RDMA Read Message Size, bytes.
    pub size: u32,
    /// Data Source STag.
    pub src_stag: u32,
    /// Data Source Tagged Offset, bytes.
    pub src_to: u64,
}

impl ReadRequestRepr {
    /// Parses a checked Read Request header. Every bit pattern is valid.
    ///
    /// # Errors
    /// [`Error::Truncated`] if the packet is shorter than 28 bytes.
    pub fn parse<T: AsRef<[u8]>>(packet: &ReadRequestPacket<T>) -> Result<Self> {
        check_in(
            Field::ReadRequest,
            READ_REQUEST_LEN,
            packet.buffer.as_ref().len(),
        )?;
        Ok(ReadRequestRepr {
            sink_stag: packet.sink_stag(),
            sink_to: packet.sink_to(),
            size: packet.size(),
            src_stag: packet.src_stag(),
            src_to: packet.src_to(),
        })
    }

    /// Always 28 bytes.
    pub const fn buffer_len(&self) -> usize {
        READ_REQUEST_LEN
    }

    /// Writes the 28 bytes into the start of `buf`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(READ_REQUEST_LEN, buf.len())?;
        use read_request_field as f;
        wire::put_u32(buf, f::SINK_STAG, self.sink_stag);
        wire::put_u64(buf, f::SINK_TO, self.sink_to);
        wire::put_u32(buf, f::SIZE, self.size);
        wire::put_u32(buf, f::SRC_STAG, self.src_stag);
        wire::put_u64(buf, f::SRC_TO, self.src_to);
        Ok(())
    }

    /// The 28 header bytes.
    pub fn to_bytes(&self) -> [u8; READ_REQUEST_LEN] {
        let mut b = [0u8; READ_REQUEST_LEN];
        // Cannot fail: the array is exactly 28 bytes.
        let _ = self.emit(&mut b);
        b
    }
}

/// Length in bytes of the Immediate Data field of an Immediate Data message
/// (RFC 7306 §6).
pub const IMMEDIATE_DATA_LEN: usize = 8;

/// The body of an Immediate Data / Immediate Data with SE message (RFC 7306 §6):
/// 8 bytes of data delivered to the next posted receive buffer of QN 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ImmediateDataRepr {
    /// The Immediate Data, as the 8 bytes on the wire.
    pub data: [u8; IMMEDIATE_DATA_LEN],
}

impl ImmediateDataRepr {
    /// Parses exactly 8 bytes.
    ///
    /// # Errors
    /// [`Error::Truncated`] / [`Error::TrailingBytes`] with [`Field::ImmediateData`].
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        exact(Field::ImmediateData, IMMEDIATE_DATA_LEN, bytes)?;
        Ok(ImmediateDataRepr {
            data: wire::array(bytes, 0),
        })
    }

    /// Always 8 bytes.
    pub const fn buffer_len(&self) -> usize {
        IMMEDIATE_DATA_LEN
    }

    /// Writes the 8 bytes into the start of `buf`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(IMMEDIATE_DATA_LEN, buf.len())?;
        wire::put(buf, 0, &self.data);
        Ok(())
    }
}

/// The AtomicOpcode of an Atomic Request (RFC 7306 §5; the low 4 bits of the first
/// header word, whose upper 28 bits are reserved). 0x0 FetchAdd and 0x2 CmpSwap match
/// Wireshark's iwarp-ddp-rdmap dissector; 0x1 Swap is the value between them in the
/// RFC's table and is not cross-checked against an implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AtomicOpcode {
    /// FetchAdd (0x0): add Add Data to the target (carries stopped where Add Mask
    /// has a 1, see [`AtomicRequestRepr::apply`]), return the original value.
    FetchAdd = 0x0,
    /// Swap (0x1): replace the bits of the target selected by Swap Mask with Swap
    /// Data, return the original value.
    Swap = 0x1,
    /// CmpSwap (0x2): if the target equals Compare Data in the bits of Compare Mask,
    /// swap as [`AtomicOpcode::Swap`]; return the original value either way.
    CmpSwap = 0x2,
}

impl AtomicOpcode {
    /// The AtomicOpcode for a 4-bit value, `None` if undefined (0x3..=0xF).
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(AtomicOpcode::FetchAdd),
            1 => Some(AtomicOpcode::Swap),
            2 => Some(AtomicOpcode::CmpSwap),
            _ => None,
        }
    }

    /// The 4-bit wire value.
    pub const fn value(self) -> u8 {
        self as u8
    }

    /// The name as RFC 7306 spells it: "FetchAdd", "Swap", "CmpSwap".
    pub const fn name(self) -> &'static str {
        match self {
            AtomicOpcode::FetchAdd => "FetchAdd",
            AtomicOpcode::Swap => "Swap",
            AtomicOpcode::CmpSwap => "CmpSwap",
        }
    }
}

impl core::fmt::Display for AtomicOpcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// Length in bytes of the Atomic Request header (RFC 7306 §5): opcode word,
/// Request Identifier, Remote STag, Remote Tagged Offset, Add-or-Swap Data and
/// Mask, Compare Data and Mask.
pub const ATOMIC_REQUEST_LEN: usize = 52;
/// Length in bytes of the Atomic Response header (RFC 7306 §5): Original Request
/// Identifier and Original Remote Data Value.
pub const ATOMIC_RESPONSE_LEN: usize = 12;
/// Size in bytes of the target of an atomic: one 64-bit word (RFC 7306 §5).
pub const ATOMIC_OPERAND_LEN: u64 = 8;
/// Alignment in bytes the Remote Tagged Offset of an Atomic Request must have: the
/// target is a naturally aligned 64-bit word (RFC 7306 §5).
pub const ATOMIC_ALIGNMENT: u64 = 8;

/// Byte offsets in the Atomic Request header, counted from its start (the byte after
/// the 18-byte untagged DDP header) (RFC 7306 §5). Every field is big-endian.
pub mod atomic_request_field {
    use core::ops::Range;
    /// Reserved (28 bits) and AtomicOpcode (low 4 bits), 32 bits.
    pub const OPCODE: Range<usize> = 0..4;
    /// Request Identifier, 32 bits: echoed in the Atomic Response.
    pub const REQUEST_ID: Range<usize> = 4..8;
    /// Remote STag of the target, 32 bits.
    pub const REMOTE_STAG: Range<usize> = 8..12;
    /// Remote Tagged Offset of the target, 64 bits.
    pub const REMOTE_TO: Range<usize> = 12..20;
    /// Add Data (FetchAdd) or Swap Data (Swap, CmpSwap), 64 bits.
    pub const ADD_OR_SWAP_DATA: Range<usize> = 20..28;
    /// Add Mask or Swap Mask, 64 bits.
    pub const ADD_OR_SWAP_MASK: Range<usize> = 28..36;
    /// Compare Data (CmpSwap), 64 bits.
    pub const COMPARE_DATA: Range<usize> = 36..44;
    /// Compare Mask (CmpSwap), 64 bits.
    pub const COMPARE_MASK: Range<usize> = 44..52;
}

/// Byte offsets in the Atomic Response header, counted from its start (the byte after
/// the 18-byte untagged DDP header) (RFC 7306 §5). Every field is big-endian.
pub mod atomic_response_field {
    use core::ops::Range;
    /// Original Request Identifier, 32 bits: the Request Identifier answered.
    pub const REQUEST_ID: Range<usize> = 0..4;
    /// Original Remote Data Value, 64 bits: the target before the operation.
    pub const ORIGINAL_VALUE: Range<usize> = 4..12;
}

/// An Atomic Request header (RFC 7306 §5), 52 bytes, sent untagged on QN 1 (the
/// RDMA Read Request queue, so that it counts against the same IRD/ORD).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicRequestRepr {
    /// The operation.
    pub opcode: AtomicOpcode,
    /// Request Identifier, echoed in the Atomic Response.
    pub request_id: u32,
    /// Remote STag of the 8-byte target.
    pub remote_stag: u32,
    /// Remote Tagged Offset of the target, bytes; a multiple of
    /// [`ATOMIC_ALIGNMENT`] in a valid request.
    pub remote_to: u64,
    /// Add Data (FetchAdd) or Swap Data (Swap, CmpSwap).
    pub add_or_swap_data: u64,
    /// Add Mask or Swap Mask.
    pub add_or_swap_mask: u64,
    /// Compare Data (CmpSwap).
    pub compare_data: u64,
    /// Compare Mask (CmpSwap).
    pub compare_mask: u64,
}

impl AtomicRequestRepr {
    /// The FetchAdd that verbs' `IBV_WR_ATOMIC_FETCH_AND_ADD` means: add `add` to the
    /// whole 64-bit word modulo 2^64 (Add Mask 0: no carry stopped), compare fields 0.
    pub const fn fetch_add(request_id: u32, remote_stag: u32, remote_to: u64, add: u64) -> Self {
        AtomicRequestRepr {
            opcode: AtomicOpcode::FetchAdd,
            request_id,
            remote_stag,
            remote_to,
            add_or_swap_data: add,
            add_or_swap_mask: 0,
            compare_data: 0,
            compare_mask: 0,
        }
    }

    /// The CmpSwap that verbs' `IBV_WR_ATOMIC_CMP_AND_SWP` means: if the whole word
    /// equals `compare` (Compare Mask all ones), replace the whole word by `swap`
    /// (Swap Mask all ones).
    pub const fn cmp_swap(
        request_id: u32,
        remote_stag: u32,
        remote_to: u64,
        compare: u64,
        swap: u64,
    ) -> Self {
        AtomicRequestRepr {
            opcode: AtomicOpcode::CmpSwap,
            request_id,
            remote_stag,
            remote_to,
            add_or_swap_data: swap,
            add_or_swap_mask: u64::MAX,
            compare_data: compare,
            compare_mask: u64::MAX,
        }
    }

    /// True if the Remote Tagged Offset is a multiple of [`ATOMIC_ALIGNMENT`]
    /// (RFC 7306 §5 requires it).
    pub const fn is_aligned(&self) -> bool {
        self.remote_to.is_multiple_of(ATOMIC_ALIGNMENT)
    }

    /// The value the responder stores in the target whose value was `original`
    /// (RFC 7306 §5, the operations' definitions):
    ///
    /// - FetchAdd: `original + add_data`, where the carry out of bit *i* into bit
    ///   *i* + 1 is dropped when bit *i* of Add Mask is 1, so a mask splits the word
    ///   into independent fields (Add Mask 0 is the plain 64-bit sum, modulo 2^64).
    /// - Swap: `(original & !swap_mask) | (swap_data & swap_mask)`.
    /// - CmpSwap: as Swap if `(original ^ compare_data) & compare_mask == 0`, else
    ///   `original` unchanged.
    pub const fn apply(&self, original: u64) -> u64 {
        let data = self.add_or_swap_data;
        let mask = self.add_or_swap_mask;
        match self.opcode {
            AtomicOpcode::FetchAdd => {
                if mask == 0 {
                    return original.wrapping_add(data);
                }
                let mut out = 0u64;
                let mut carry = 0u64;
                let mut bit = 0;
                while bit < 64 {
                    let sum = ((original >> bit) & 1) + ((data >> bit) & 1) + carry;
                    out |= (sum & 1) << bit;
                    carry = if (mask >> bit) & 1 == 1 { 0 } else { sum >> 1 };
                    bit += 1;
                }
                out
            }
            AtomicOpcode::Swap => (original & !mask) | (data & mask),
            AtomicOpcode::CmpSwap => {
                if (original ^ self.compare_data) & self.compare_mask == 0 {
                    (original & !mask) | (data & mask)
                } else {
                    original
                }
            }
        }
    }

    /// Parses exactly 52 bytes. The 28 reserved bits above the AtomicOpcode are
    /// ignored.
    ///
    /// # Errors
    /// [`Error::Truncated`] / [`Error::TrailingBytes`] with [`Field::AtomicRequest`];
    /// [`Error::UnknownAtomicOpcode`].
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        use atomic_request_field as f;
        exact(Field::AtomicRequest, ATOMIC_REQUEST_LEN, bytes)?;
        let op = (wire::u32_in(bytes, f::OPCODE) & 0xf) as u8;
        let opcode =
            AtomicOpcode::from_u8(op).ok_or(Error::UnknownAtomicOpcode { atomic_opcode: op })?;
        Ok(AtomicRequestRepr {
            opcode,
            request_id: wire::u32_in(bytes, f::REQUEST_ID),
            remote_stag: wire::u32_in(bytes, f::REMOTE_STAG),
            remote_to: wire::u64_in(bytes, f::REMOTE_TO),
            add_or_swap_data: wire::u64_in(bytes, f::ADD_OR_SWAP_DATA),
            add_or_swap_mask: wire::u64_in(bytes, f::ADD_OR_SWAP_MASK),
            compare_data: wire::u64_in(bytes, f::COMPARE_DATA),
            compare_mask: wire::u64_in(bytes, f::COMPARE_MASK),
        })
    }

    /// Always 52 bytes.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_REQUEST_LEN
    }

    /// Writes the 52 bytes into the start of `buf` (reserved bits zero).
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        use atomic_request_field as f;
        check_out(ATOMIC_REQUEST_LEN, buf.len())?;
        wire::put_u32(buf, f::OPCODE, u32::from(self.opcode.value()));
        wire::put_u32(buf, f::REQUEST_ID, self.request_id);
        wire::put_u32(buf, f::REMOTE_STAG, self.remote_stag);
        wire::put_u64(buf, f::REMOTE_TO, self.remote_to);
        wire::put_u64(buf, f::ADD_OR_SWAP_DATA, self.add_or_swap_data);
        wire::put_u64(buf, f::ADD_OR_SWAP_MASK, self.add_or_swap_mask);
        wire::put_u64(buf, f::COMPARE_DATA, self.compare_data);
        wire::put_u64(buf, f::COMPARE_MASK, self.compare_mask);
        Ok(())
    }

    /// The 52 header bytes.
    pub fn to_bytes(&self) -> [u8; ATOMIC_REQUEST_LEN] {
        let mut b = [0u8; ATOMIC_REQUEST_LEN];
        // Cannot fail: the array is exactly 52 bytes.
        let _ = self.emit(&mut b);
        b
    }
}

/// An Atomic Response header (RFC 7306 §5), 12 bytes, sent untagged on QN 3 in the
/// order of the Atomic Requests (and after the Read Responses of earlier Read
/// Requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicResponseRepr {
    /// Original Request Identifier (from the Atomic Request).
    pub request_id: u32,
    /// Original Remote Data Value: the target's value before the operation.
    pub original_value: u64,
}

impl AtomicResponseRepr {
    /// Parses exactly 12 bytes.
    ///
    /// # Errors
    /// [`Error::Truncated`] / [`Error::TrailingBytes`] with [`Field::AtomicResponse`].
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        use atomic_response_field as f;
        exact(Field::AtomicResponse, ATOMIC_RESPONSE_LEN, bytes)?;
        Ok(AtomicResponseRepr {
            request_id: wire::u32_in(bytes, f::REQUEST_ID),
            original_value: wire::u64_in(bytes, f::ORIGINAL_VALUE),
        })
    }

    /// Always 12 bytes.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_RESPONSE_LEN
    }

    /// Writes the 12 bytes into the start of `buf`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        use atomic_response_field as f;
        check_out(ATOMIC_RESPONSE_LEN, buf.len())?;
        wire::put_u32(buf, f::REQUEST_ID, self.request_id);
        wire::put_u64(buf, f::ORIGINAL_VALUE, self.original_value);
        Ok(())
    }

    /// The 12 header bytes.
    pub fn to_bytes(&self) -> [u8; ATOMIC_RESPONSE_LEN] {
        let mut b = [0u8; ATOMIC_RESPONSE_LEN];
        // Cannot fail: the array is exactly 12 bytes.
        let _ = self.emit(&mut b);
        b
    }
}

/// Checks `bytes` is exactly `len` long.
pub(crate) fn exact(field: Field, len: usize, bytes: &[u8]) -> Result<()> {
    check_in(field, len, bytes.len())?;
    if bytes.len() > len {
        return Err(Error::TrailingBytes {
            field,
            extra: bytes.len() - len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // rping.pcap frame 11, the 28 bytes after the untagged header of the Read
    // Request: sink (0x52a53c00, 0x5583a4e00f30), 64 bytes, source (0x79baa400,
    // 0x55d41928dd50).
    static RREQ: [u8; 28] = [
        0x52, 0xa5, 0x3c, 0x00, 0x00, 0x00, 0x55, 0x83, 0xa4, 0xe0, 0x0f, 0x30, 0x00, 0x00, 0x00,
        0x40, 0x79, 0xba, 0xa4, 0x00, 0x00, 0x00, 0x55, 0xd4, 0x19, 0x28, 0xdd, 0x50,
    ];

    fn rreq_repr() -> ReadRequestRepr {
        ReadRequestRepr {
            sink_stag: 0x52a5_3c00,
            sink_to: 0x5583_a4e0_0f30,
            size: 64,
            src_stag: 0x79ba_a400,
            src_to: 0x55d4_1928_dd50,
        }
    }

    #[test]
    fn opcode_table() {
        for (i, op) in Opcode::ALL.iter().enumerate() {
            assert_eq!(op.value() as usize, i);
            assert_eq!(Opcode::from_u8(i as u8), Some(*op));
        }
        for v in 0xc..=0xff {
            assert_eq!(Opcode::from_u8(v), None);
        }
        let names: Vec<_> = Opcode::ALL.iter().map(|o| o.name()).collect();
        assert_eq!(
            names,
            [
                "Write",
                "ReadRequest",
                "ReadResponse",
                "Send",
                "SendInvalidate",
                "SendSE",
                "SendSEInvalidate",
                "Terminate",
                "ImmediateData",
                "ImmediateDataSE",
                "AtomicRequest",
                "AtomicResponse"
            ]
        );
        let tagged: Vec<_> = Opcode::ALL.iter().filter(|o| o.is_tagged()).collect();
        assert_eq!(tagged, [&Opcode::Write, &Opcode::ReadResponse]);
        assert_eq!(Opcode::Send.queue(), Some(0));
        assert_eq!(Opcode::SendSEInvalidate.queue(), Some(0));
        assert_eq!(Opcode::ImmediateDataSE.queue(), Some(0));
        assert_eq!(Opcode::ReadRequest.queue(), Some(1));
        assert_eq!(Opcode::AtomicRequest.queue(), Some(1));
        assert_eq!(Opcode::Terminate.queue(), Some(2));
        assert_eq!(Opcode::AtomicResponse.queue(), Some(3));
        assert_eq!(Opcode::Write.queue(), None);
        assert_eq!(Opcode::Write.control_byte(), 0x40);
        assert_eq!(Opcode::Send.control_byte(), 0x43);
        assert_eq!(Opcode::AtomicResponse.control_byte(), 0x4b);
        assert_eq!(
            Opcode::SendSEInvalidate.to_string(),
            "Send with SE and Invalidate"
        );
    }

    #[test]
    fn control_byte_checks() {
        assert_eq!(Opcode::parse_control(0x43), Ok(Opcode::Send));
        // Reserved bits ignored.
        assert_eq!(Opcode::parse_control(0x70), Ok(Opcode::Write));
        assert_eq!(
            Opcode::parse_control(0x03),
            Err(Error::RdmapVersion { rv: 0 })
        );
        assert_eq!(
            Opcode::parse_control(0x83),
            Err(Error::RdmapVersion { rv: 2 })
        );
        assert_eq!(
            Opcode::parse_control(0x4c),
            Err(Error::UnknownOpcode { opcode: 0xc })
        );
    }

    #[test]
    fn read_request_deconstruct() {
        let p = ReadRequestPacket::new_checked(&RREQ[..]).unwrap();
        assert_eq!(p.sink_stag(), 0x52a5_3c00);
        assert_eq!(p.sink_to(), 0x5583_a4e0_0f30);
        assert_eq!(p.size(), 64);
        assert_eq!(p.src_stag(), 0x79ba_a400);
        assert_eq!(p.src_to(), 0x55d4_1928_dd50);
        assert_eq!(ReadRequestRepr::parse(&p).unwrap(), rreq_repr());
    }

    #[test]
    fn read_request_construct() {
        let mut b = [0xaau8; 28];
        rreq_repr().emit(&mut b).unwrap();
        assert_eq!(b, RREQ);
        assert_eq!(rreq_repr().to_bytes(), RREQ);
        assert_eq!(
            rreq_repr().emit(&mut [0u8; 27]),
            Err(Error::BufferTooSmall {
                needed: 28,
                len: 27
            })
        );
    }

    #[test]
    fn read_request_truncated() {
        assert_eq!(
            ReadRequestPacket::new_checked(&RREQ[..27]).unwrap_err(),
            Error::Truncated {
                field: Field::ReadRequest,
                needed: 28,
                len: 27
            }
        );
        let p = ReadRequestPacket::new_unchecked(&RREQ[..3]);
        assert_eq!(p.src_to(), 0);
        assert!(ReadRequestRepr::parse(&p).is_err());
    }

    #[test]
    fn atomic_operations_apply_as_rfc_7306_defines_them() {
        let fa = AtomicRequestRepr::fetch_add(1, 0x100, 0, 5);
        assert_eq!(fa.apply(10), 15);
        assert_eq!(fa.apply(u64::MAX - 1), 3, "wraps modulo 2^64");
        // Add Mask bit 31 set: the carry out of bit 31 is dropped, so the two
        // 32-bit halves add independently.
        let halves = AtomicRequestRepr {
            add_or_swap_data: 0x0000_0001_0000_0001,
            add_or_swap_mask: 0x0000_0000_8000_0000,
            ..fa
        };
        assert_eq!(halves.apply(0x0000_0001_ffff_ffff), 0x0000_0002_0000_0000);
        // Without the mask the low half carries into the high one.
        let plain = AtomicRequestRepr {
            add_or_swap_mask: 0,
            ..halves
        };
        assert_eq!(plain.apply(0x0000_0001_ffff_ffff), 0x0000_0003_0000_0000);

        let cs = AtomicRequestRepr::cmp_swap(2, 0x100, 8, 7, 99);
        assert_eq!(cs.apply(7), 99, "equal: swapped");
        assert_eq!(cs.apply(8), 8, "not equal: unchanged");
        // Only the low byte compared, only the high byte swapped.
        let masked = AtomicRequestRepr {
            compare_mask: 0xff,
            add_or_swap_mask: 0xff00_0000_0000_0000,
            add_or_swap_data: 0xab00_0000_0000_0000,
            ..cs
        };
        assert_eq!(masked.apply(0x1111_0000_0000_0007), 0xab11_0000_0000_0007);
        assert_eq!(masked.apply(0x1111_0000_0000_0008), 0x1111_0000_0000_0008);

        let swap = AtomicRequestRepr {
            opcode: AtomicOpcode::Swap,
            add_or_swap_data: 0x1234,
            add_or_swap_mask: u64::MAX,
            ..cs
        };
        assert_eq!(swap.apply(0xffff), 0x1234);
        assert!(cs.is_aligned());
        assert!(!AtomicRequestRepr::fetch_add(1, 0, 4, 1).is_aligned());
        assert_eq!(AtomicOpcode::CmpSwap.to_string(), "CmpSwap");
        assert_eq!(AtomicOpcode::from_u8(3), None);
    }

    #[test]
    fn atomic_round_trip_and_lengths() {
        let r = AtomicRequestRepr {
            opcode: AtomicOpcode::CmpSwap,
            request_id: 7,
            remote_stag: 0x1234_5600,
            remote_to: 0x1000,
            add_or_swap_data: 1,
            add_or_swap_mask: u64::MAX,
            compare_data: 2,
            compare_mask: u64::MAX,
        };
        let mut b = [0u8; 52];
        r.emit(&mut b).unwrap();
        assert_eq!(&b[..4], &[0, 0, 0, 2]);
        assert_eq!(&b[8..12], &[0x12, 0x34, 0x56, 0x00]);
        assert_eq!(AtomicRequestRepr::parse(&b), Ok(r));
        b[3] = 0x0f;
        assert_eq!(
            AtomicRequestRepr::parse(&b),
            Err(Error::UnknownAtomicOpcode { atomic_opcode: 0xf })
        );
        assert_eq!(
            AtomicRequestRepr::parse(&b[..51]).unwrap_err(),
            Error::Truncated {
                field: Field::AtomicRequest,
                needed: 52,
                len: 51
            }
        );
        let resp = AtomicResponseRepr {
            request_id: 7,
            original_value: 0xdead_beef,
        };
        let mut b = [0u8; 13];
        resp.emit(&mut b).unwrap();
        assert_eq!(&b[..12], &[0, 0, 0, 7, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(
            AtomicResponseRepr::parse(&b),
            Err(Error::TrailingBytes {
                field: Field::AtomicResponse,
                extra: 1
            })
        );
        assert_eq!(AtomicResponseRepr::parse(&b[..12]), Ok(resp));
        let imm = ImmediateDataRepr {
            data: [1, 2, 3, 4, 5, 6, 7, 8],
        };
        let mut b = [0u8; 8];
        imm.emit(&mut b).unwrap();
        assert_eq!(ImmediateDataRepr::parse(&b), Ok(imm));
    }
}
