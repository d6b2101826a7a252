//! The RDMAP control byte's values and the opcodes (RFC 5040 §4.1, §4.2; RFC 7306):
//! the values every wire module and the crate's [`Error`](crate::Error) name, so they
//! sit below all of them. [`crate::rdmap`] re-exports them and adds what needs the
//! headers or the error type ([`Opcode::parse_control`], [`Opcode::body_len`]); the
//! opcode table is in its documentation.

use core::fmt;

/// RDMAP Version this crate speaks: RV = 01b (RFC 5040 §4.1).
pub const RDMAP_VERSION: u8 = 1;
/// RV bits of the RDMAP control byte.
pub const RV_MASK: u8 = 0xc0;
/// Reserved bits of the RDMAP control byte (sent as zero, ignored on receipt).
pub const RSVD_MASK: u8 = 0x30;
/// Opcode bits of the RDMAP control byte.
pub const OPCODE_MASK: u8 = 0x0f;

/// Queue Number of the Send queue: Send messages and RFC 7306 Immediate Data
/// (RFC 5040 §4.2, RFC 7306 §6).
pub const QN_SEND: u32 = 0;
/// Queue Number of the RDMA Read Request queue, also used by RFC 7306 Atomic
/// Requests (RFC 5040 §4.2, RFC 7306 §5).
pub const QN_READ_REQUEST: u32 = 1;
/// Queue Number of the Terminate queue (RFC 5040 §4.2).
pub const QN_TERMINATE: u32 = 2;
/// Queue Number of the Atomic Response queue (RFC 7306 §5).
pub const QN_ATOMIC_RESPONSE: u32 = 3;

/// An RDMAP message type (RFC 5040 §4.2; RFC 7306 §4). The discriminant is the
/// 4-bit wire value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Opcode {
    /// RDMA Write (0x0), tagged.
    Write = 0x0,
    /// RDMA Read Request (0x1), untagged, QN 1.
    ReadRequest = 0x1,
    /// RDMA Read Response (0x2), tagged.
    ReadResponse = 0x2,
    /// Send (0x3), untagged, QN 0.
    Send = 0x3,
    /// Send with Invalidate (0x4), untagged, QN 0; carries an Invalidate STag.
    SendInvalidate = 0x4,
    /// Send with Solicited Event (0x5), untagged, QN 0.
    SendSE = 0x5,
    /// Send with Solicited Event and Invalidate (0x6), untagged, QN 0.
    SendSEInvalidate = 0x6,
    /// Terminate (0x7), untagged, QN 2.
    Terminate = 0x7,
    /// Immediate Data (0x8, RFC 7306 §6), untagged, QN 0, 8 bytes of data.
    ImmediateData = 0x8,
    /// Immediate Data with Solicited Event (0x9, RFC 7306 §6), untagged, QN 0.
    ImmediateDataSE = 0x9,
    /// Atomic Request (0xA, RFC 7306 §5), untagged, QN 1.
    AtomicRequest = 0xa,
    /// Atomic Response (0xB, RFC 7306 §5), untagged, QN 3.
    AtomicResponse = 0xb,
}

impl Opcode {
    /// Every opcode, in wire order.
    pub const ALL: [Opcode; 12] = [
        Opcode::Write,
        Opcode::ReadRequest,
        Opcode::ReadResponse,
        Opcode::Send,
        Opcode::SendInvalidate,
        Opcode::SendSE,
        Opcode::SendSEInvalidate,
        Opcode::Terminate,
        Opcode::ImmediateData,
        Opcode::ImmediateDataSE,
        Opcode::AtomicRequest,
        Opcode::AtomicResponse,
    ];

    /// The opcode for a 4-bit wire value, or `None` for 0xC..=0xF (and > 0xF).
    pub const fn from_u8(value: u8) -> Option<Opcode> {
        Some(match value {
            0x0 => Opcode::Write,
            0x1 => Opcode::ReadRequest,
            0x2 => Opcode::ReadResponse,
            0x3 => Opcode::Send,
            0x4 => Opcode::SendInvalidate,
            0x5 => Opcode::SendSE,
            0x6 => Opcode::SendSEInvalidate,
            0x7 => Opcode::Terminate,
            0x8 => Opcode::ImmediateData,
            0x9 => Opcode::ImmediateDataSE,
            0xa => Opcode::AtomicRequest,
            0xb => Opcode::AtomicResponse,
            _ => return None,
        })
    }

    /// The 4-bit wire value.
    pub const fn value(self) -> u8 {
        self as u8
    }

    /// The variant name, exactly: "Write", "ReadRequest", "ReadResponse", "Send",
    /// "SendInvalidate", "SendSE", "SendSEInvalidate", "Terminate",
    /// "ImmediateData", "ImmediateDataSE", "AtomicRequest", "AtomicResponse".
    pub const fn name(self) -> &'static str {
        match self {
            Opcode::Write => "Write",
            Opcode::ReadRequest => "ReadRequest",
            Opcode::ReadResponse => "ReadResponse",
            Opcode::Send => "Send",
            Opcode::SendInvalidate => "SendInvalidate",
            Opcode::SendSE => "SendSE",
            Opcode::SendSEInvalidate => "SendSEInvalidate",
            Opcode::Terminate => "Terminate",
            Opcode::ImmediateData => "ImmediateData",
            Opcode::ImmediateDataSE => "ImmediateDataSE",
            Opcode::AtomicRequest => "AtomicRequest",
            Opcode::AtomicResponse => "AtomicResponse",
        }
    }

    /// The message name as the RFCs (and Wireshark) spell it, e.g. "Send with SE
    /// and Invalidate".
    pub const fn description(self) -> &'static str {
        match self {
            Opcode::Write => "RDMA Write",
            Opcode::ReadRequest => "RDMA Read Request",
            Opcode::ReadResponse => "RDMA Read Response",
            Opcode::Send => "Send",
            Opcode::SendInvalidate => "Send with Invalidate",
            Opcode::SendSE => "Send with SE",
            Opcode::SendSEInvalidate => "Send with SE and Invalidate",
            Opcode::Terminate => "Terminate",
            Opcode::ImmediateData => "Immediate Data",
            Opcode::ImmediateDataSE => "Immediate Data with SE",
            Opcode::AtomicRequest => "Atomic Request",
            Opcode::AtomicResponse => "Atomic Response",
        }
    }

    /// True if the message uses the DDP tagged buffer model (T = 1): RDMA Write and
    /// RDMA Read Response (RFC 5040 §4.2).
    pub const fn is_tagged(self) -> bool {
        matches!(self, Opcode::Write | Opcode::ReadResponse)
    }

    /// The untagged Queue Number the message uses, `None` for tagged messages
    /// (RFC 5040 §4.2; RFC 7306 §5, §6).
    pub const fn queue(self) -> Option<u32> {
        match self {
            Opcode::Write | Opcode::ReadResponse => None,
            Opcode::Send
            | Opcode::SendInvalidate
            | Opcode::SendSE
            | Opcode::SendSEInvalidate
            | Opcode::ImmediateData
            | Opcode::ImmediateDataSE => Some(QN_SEND),
            Opcode::ReadRequest | Opcode::AtomicRequest => Some(QN_READ_REQUEST),
            Opcode::Terminate => Some(QN_TERMINATE),
            Opcode::AtomicResponse => Some(QN_ATOMIC_RESPONSE),
        }
    }

    /// True for messages that always fit in one DDP segment (L = 1, MO = 0):
    /// Read Request, Terminate, Immediate Data (SE), Atomic Request / Response.
    pub const fn is_single_segment(self) -> bool {
        matches!(
            self,
            Opcode::ReadRequest
                | Opcode::Terminate
                | Opcode::ImmediateData
                | Opcode::ImmediateDataSE
                | Opcode::AtomicRequest
                | Opcode::AtomicResponse
        )
    }

    /// True if the untagged RsvdULP word carries an Invalidate STag (Send with
    /// Invalidate, Send with SE and Invalidate; RFC 5040 §4.1).
    pub const fn carries_invalidate_stag(self) -> bool {
        matches!(self, Opcode::SendInvalidate | Opcode::SendSEInvalidate)
    }

    /// True if the message asks for a Solicited Event (Send with SE, Send with SE
    /// and Invalidate, Immediate Data with SE).
    pub const fn is_solicited(self) -> bool {
        matches!(
            self,
            Opcode::SendSE | Opcode::SendSEInvalidate | Opcode::ImmediateDataSE
        )
    }

    /// True for the RFC 7306 extension opcodes (0x8..=0xB).
    pub const fn is_rfc7306(self) -> bool {
        (self as u8) >= 0x8
    }

    /// The RDMAP control byte for this opcode: RV = 1, reserved 0.
    pub const fn control_byte(self) -> u8 {
        (RDMAP_VERSION << 6) | self as u8
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}
