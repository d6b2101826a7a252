//! MPA: Marker PDU Aligned framing for TCP (RFC 5044), with the enhanced
//! connection establishment of RFC 6581.
//!
//! Its room: the MPA wire (frames, negotiation, framer, deframer, MULPDU) as pure
//! functions and sans-IO types. It touches nothing of ours: no DDP, no sockets, no
//! threads (the soft device's `transport` drives it).
//!
//! MPA sits between DDP and TCP in the iWARP stack. A connection starts with
//! an MPA Request (initiator) and an MPA Reply (responder) on the fresh TCP
//! connection; both directions then carry FPDUs: a ULPDU (one DDP segment)
//! with a length field, padding, a CRC32c and, if negotiated, Markers every
//! 512 octets of the stream.
//!
//! | module | what |
//! |---|---|
//! | [`crc`] | CRC32c and its byte order on the wire |
//! | [`wire`] | Request/Reply frames: zero-copy [`wire::Packet`] view, validated [`wire::Repr`], the RFC 6581 IRD/ORD word [`wire::Rev2Params`], [`wire::StartupReader`] |
//! | [`negotiate`] | pure-function negotiation for both roles: [`negotiate::request`], [`negotiate::respond`], [`negotiate::complete`] |
//! | [`fpdu`] | FPDU layout, Marker placement, [`fpdu::mulpdu`], the [`fpdu::Framer`] |
//! | [`deframer`] | the streaming [`deframer::Deframer`] |
//!
//! Units: lengths are in octets; stream positions are octets of TCP sequence
//! space counted from the first octet of the first FPDU of a direction
//! (`SeqStart`, right behind that direction's MPA Request or Reply), which is
//! where RFC 5044 counts Marker positions from.
//!
//! # Example
//!
//! Negotiate, frame a ULPDU, and deframe it on the other side, with the Reply
//! and the first FPDU arriving in one read:
//!
//! ```
//! use mpa::deframer::{CrcStatus, Deframer, DeframerConfig};
//! use mpa::fpdu::Framer;
//! use mpa::negotiate::{self, CrcPolicy, LocalSettings, Response};
//! use mpa::wire::{FrameKind, Limits, Startup, StartupReader};
//!
//! // Initiator: build and send the MPA Request.
//! let initiator = LocalSettings { crc: CrcPolicy::Wanted, ..LocalSettings::default() };
//! let request = negotiate::request(&initiator).unwrap();
//! let request_bytes = request.to_bytes().unwrap();
//!
//! // Responder: read the Request from the stream, decide, send the Reply.
//! let responder = LocalSettings::default();
//! let mut reader = StartupReader::new(Some(FrameKind::Request), Limits::default());
//! let Ok(Startup::Complete { frame, .. }) = reader.push(&request_bytes) else { panic!() };
//! let Response::Accept { agreed: responder_agreed, reply } =
//!     negotiate::respond(&responder, &frame).unwrap() else { panic!("rejected") };
//! assert!(responder_agreed.crc);
//!
//! // The responder sends the Reply, and later an FPDU, in one TCP segment.
//! let mut wire = reply.to_bytes().unwrap();
//! let mut framer = Framer::new(responder_agreed.tx_framing());
//! framer.append(b"a DDP segment", &mut wire).unwrap();
//!
//! // Initiator: the Reply, then the FPDUs behind it in the same chunk.
//! let mut reader = StartupReader::new(Some(FrameKind::Reply), Limits::default());
//! let Ok(Startup::Complete { frame, rest }) = reader.push(&wire) else { panic!() };
//! let agreed = negotiate::complete(&initiator, &frame).unwrap();
//! let mut deframer = Deframer::new(DeframerConfig::new(agreed.rx_framing()));
//! let mut got = Vec::new();
//! deframer.feed(rest, |item| {
//!     let fpdu = item.unwrap();
//!     assert!(matches!(fpdu.crc, CrcStatus::Good(_)));
//!     got.push(fpdu.ulpdu.to_vec());
//! });
//! assert_eq!(got, vec![b"a DDP segment".to_vec()]);
//! ```
//!
//! # RFC facts and how they were checked
//!
//! The Request/Reply bytes, the RFC 6581 IRD/ORD words and the CRC byte order
//! (least significant octet first) are checked against the real Linux siw
//! captures in `shared/pcaps` (see the golden tests in each module and
//! `src/test_vectors.rs`); the CRC32c against the RFC 3720 appendix B.4
//! vectors. Linux siw does not do Markers, so the Marker placement rule
//! (see [`fpdu`]) is implemented from RFC 5044 and checked by round trips.

#![deny(missing_docs)]
// `unsafe` is denied (the workspace's lint) except in `crc::sse42`, which states its
// contract: the CRC32c instructions behind a CPU feature check.
#![deny(unsafe_code)]

pub mod crc;
pub mod deframer;
pub mod fpdu;
pub mod negotiate;
pub mod wire;

#[cfg(test)]
mod test_vectors;

/// MPA error codes of a Terminate message with Layer = LLP (2) and Error Type
/// = MPA (0) (RFC 5044, section 8 "Error Semantics"; 0x05-0x07 added by
/// RFC 6581 for enhanced connection establishment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LlpErrorCode {
    /// 0x01: TCP connection closed, terminated or lost.
    TcpConnectionLost = 0x01,
    /// 0x02: MPA CRC error.
    CrcError = 0x02,
    /// 0x03: MPA Marker and ULPDU Length field mismatch.
    MarkerMismatch = 0x03,
    /// 0x04: Invalid MPA Request or Reply frame.
    InvalidRequestReply = 0x04,
    /// 0x05: Local catastrophic error (RFC 6581).
    LocalCatastrophic = 0x05,
    /// 0x06: Insufficient IRD resources (RFC 6581).
    InsufficientIrd = 0x06,
    /// 0x07: No matching RTR option (RFC 6581).
    NoMatchingRtr = 0x07,
}

impl LlpErrorCode {
    /// The Terminate Layer value of LLP errors.
    pub const LAYER_LLP: u8 = 2;
    /// The Terminate Error Type value of MPA errors.
    pub const ETYPE_MPA: u8 = 0;

    /// The 8-bit error code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The variant for an 8-bit error code, `None` for an unassigned one.
    pub fn from_code(code: u8) -> Option<LlpErrorCode> {
        Some(match code {
            0x01 => LlpErrorCode::TcpConnectionLost,
            0x02 => LlpErrorCode::CrcError,
            0x03 => LlpErrorCode::MarkerMismatch,
            0x04 => LlpErrorCode::InvalidRequestReply,
            0x05 => LlpErrorCode::LocalCatastrophic,
            0x06 => LlpErrorCode::InsufficientIrd,
            0x07 => LlpErrorCode::NoMatchingRtr,
            _ => return None,
        })
    }

    /// The RFC's description of the error.
    pub fn description(self) -> &'static str {
        match self {
            LlpErrorCode::TcpConnectionLost => "TCP connection closed, terminated or lost",
            LlpErrorCode::CrcError => "MPA CRC error",
            LlpErrorCode::MarkerMismatch => "MPA Marker and ULPDU Length field mismatch",
            LlpErrorCode::InvalidRequestReply => "Invalid MPA Request or Reply frame",
            LlpErrorCode::LocalCatastrophic => "Local catastrophic error",
            LlpErrorCode::InsufficientIrd => "Insufficient IRD resources",
            LlpErrorCode::NoMatchingRtr => "No matching RTR option",
        }
    }
}

impl core::fmt::Display for LlpErrorCode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} ({:#04x})", self.description(), self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llp_error_codes() {
        for code in 0u8..=255 {
            match LlpErrorCode::from_code(code) {
                Some(e) => {
                    assert!((1..=7).contains(&code));
                    assert_eq!(e.code(), code);
                }
                None => assert!(!(1..=7).contains(&code)),
            }
        }
        assert_eq!(LlpErrorCode::InsufficientIrd.code(), 0x06);
        assert_eq!(LlpErrorCode::NoMatchingRtr.code(), 0x07);
        assert_eq!(LlpErrorCode::CrcError.to_string(), "MPA CRC error (0x02)");
        assert_eq!((LlpErrorCode::LAYER_LLP, LlpErrorCode::ETYPE_MPA), (2, 0));
    }
}
