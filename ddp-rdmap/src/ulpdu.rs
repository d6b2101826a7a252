//! The combined DDP + RDMAP view of one ULPDU: the entry point for receivers,
//! dissectors and fuzzers.
//!
//! [`Ulpdu::parse`] takes the ULPDU bytes exactly as MPA delivers them (after the
//! 2-byte ULPDU Length, before the pad and CRC) and returns the header fields, the
//! opcode, the L flag, the typed RDMAP body of the fixed-format messages and the
//! payload range. It never panics; each [`Error`] names the field and maps to the
//! Terminate error to send ([`Error::terminate_cause`]).
//!
//! [`Header`] is the header a sender emits: the DDP header (RFC 5041 §4) whose
//! RsvdULP byte is the RDMAP control byte (RFC 5040 §4.1) and whose untagged
//! RsvdULP word is the Invalidate STag (reserved, 0, for other opcodes).

use crate::ddp::{self, BufferModel};
use crate::error::{check_in, check_out, Error, Field, Result};
use crate::rdmap::{
    self, AtomicRequestRepr, AtomicResponseRepr, ImmediateDataRepr, Opcode, ReadRequestPacket,
    ReadRequestRepr, QN_TERMINATE,
};
use crate::terminate::{self, ErrorCause};
use crate::wire;
use core::ops::Range;

/// The header of one DDP segment as RDMAP uses it: opcode, L flag and buffer model
/// fields. 14 bytes tagged, 18 untagged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// The RDMAP opcode.
    pub opcode: Opcode,
    /// DDP L flag: last segment of the message.
    pub last: bool,
    /// Tagged (STag, TO) or untagged (Invalidate STag / reserved, QN, MSN, MO).
    pub buffer: BufferModel,
}

impl Header {
    /// Whether `ulpdu` starts like an RDMAP Terminate, judged from its first two bytes
    /// alone, the DDP control byte and the RDMAP control byte: untagged (T = 0), DDP
    /// Version 1, RDMAP Version 1 and opcode 7 (RFC 5041 §4.2, RFC 5040 §4.1, §4.8). The
    /// L flag and the reserved bits are not looked at; shorter than two bytes is
    /// `false`.
    ///
    /// The cheap test a receiver runs on every ULPDU: `false` is final, `true` still
    /// wants [`Ulpdu::parse`] or [`terminate_cause`] (the QN, the lengths).
    #[inline]
    pub fn is_terminate(ulpdu: &[u8]) -> bool {
        const DDP_BITS: u8 = ddp::FLAG_T | ddp::DV_MASK;
        const RDMAP_BITS: u8 = rdmap::RV_MASK | rdmap::OPCODE_MASK;
        match (
            ulpdu.get(ddp::field::CONTROL),
            ulpdu.get(ddp::field::RSVD_ULP),
        ) {
            (Some(&ddp_control), Some(&rdmap_control)) => {
                ddp_control & DDP_BITS == ddp::DDP_VERSION
                    && rdmap_control & RDMAP_BITS == Opcode::Terminate.control_byte()
            }
            _ => false,
        }
    }

    /// Parses and validates the header at the start of `bytes`.
    ///
    /// Checks, in order: two bytes present; DV = 1; RV = 1; opcode defined; the
    /// T flag matches the opcode's buffer model; the full header present.
    ///
    /// # Errors
    /// [`Error::Truncated`] ([`Field::DdpHeader`]), [`Error::DdpVersion`],
    /// [`Error::RdmapVersion`], [`Error::UnknownOpcode`], [`Error::TaggedMismatch`].
    pub fn parse(bytes: &[u8]) -> Result<Header> {
        check_in(Field::DdpHeader, 2, bytes.len())?;
        let packet = ddp::Packet::new_unchecked(bytes);
        if packet.version() != ddp::DDP_VERSION {
            return Err(Error::DdpVersion {
                dv: packet.version(),
                tagged: packet.tagged(),
            });
        }
        let opcode = Opcode::parse_control(packet.rsvd_ulp())?;
        if opcode.is_tagged() != packet.tagged() {
            return Err(Error::TaggedMismatch {
                opcode,
                tagged: packet.tagged(),
            });
        }
        let repr = ddp::Repr::parse(&packet)?;
        Ok(Header {
            opcode,
            last: repr.last,
            buffer: repr.buffer,
        })
    }

    /// Header length in bytes: 14 (tagged) or 18 (untagged).
    pub const fn buffer_len(&self) -> usize {
        self.buffer.header_len()
    }

    /// Writes the header into the start of `buf`: DV = 1, RV = 1, reserved bits 0.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`]; [`Error::InvalidRepr`] if the buffer model does not
    /// match the opcode.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if self.opcode.is_tagged() != self.buffer.is_tagged() {
            return Err(Error::InvalidRepr {
                what: "opcode on the wrong DDP buffer model",
            });
        }
        check_out(self.buffer_len(), buf.len())?;
        ddp::Repr {
            last: self.last,
            rsvd_ulp: self.opcode.control_byte(),
            buffer: self.buffer,
        }
        .emit(buf)
    }

    /// The header bytes (14 or 18 of the returned array are used, see
    /// [`Header::buffer_len`]).
    ///
    /// # Errors
    /// [`Error::InvalidRepr`] as [`Header::emit`].
    pub fn to_bytes(&self) -> Result<[u8; ddp::UNTAGGED_HEADER_LEN]> {
        let mut b = [0u8; ddp::UNTAGGED_HEADER_LEN];
        self.emit(&mut b)?;
        Ok(b)
    }

    /// Data Sink STag, if tagged.
    pub const fn stag(&self) -> Option<u32> {
        match self.buffer {
            BufferModel::Tagged { stag, .. } => Some(stag),
            BufferModel::Untagged { .. } => None,
        }
    }

    /// Data Sink Tagged Offset (bytes), if tagged.
    pub const fn to(&self) -> Option<u64> {
        match self.buffer {
            BufferModel::Tagged { to, .. } => Some(to),
            BufferModel::Untagged { .. } => None,
        }
    }

    /// Queue Number, if untagged.
    pub const fn qn(&self) -> Option<u32> {
        match self.buffer {
            BufferModel::Untagged { qn, .. } => Some(qn),
            BufferModel::Tagged { .. } => None,
        }
    }

    /// Message Sequence Number, if untagged.
    pub const fn msn(&self) -> Option<u32> {
        match self.buffer {
            BufferModel::Untagged { msn, .. } => Some(msn),
            BufferModel::Tagged { .. } => None,
        }
    }

    /// Message Offset (bytes), if untagged.
    pub const fn mo(&self) -> Option<u32> {
        match self.buffer {
            BufferModel::Untagged { mo, .. } => Some(mo),
            BufferModel::Tagged { .. } => None,
        }
    }

    /// The Invalidate STag of a Send with (SE and) Invalidate; `None` for other
    /// opcodes (whose RsvdULP word is reserved).
    pub const fn invalidate_stag(&self) -> Option<u32> {
        match self.buffer {
            BufferModel::Untagged { rsvd_ulp, .. } if self.opcode.carries_invalidate_stag() => {
                Some(rsvd_ulp)
            }
            _ => None,
        }
    }
}

/// The RDMAP part of a ULPDU after the DDP header, typed for the messages that have
/// one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Body {
    /// No RDMAP header: Write, Read Response and the Sends carry only payload.
    None,
    /// RDMA Read Request header (RFC 5040 §4.4).
    ReadRequest(ReadRequestRepr),
    /// Terminate header (RFC 5040 §4.8).
    Terminate(terminate::Repr),
    /// Immediate Data (RFC 7306 §6).
    ImmediateData(ImmediateDataRepr),
    /// Atomic Request header (RFC 7306 §5).
    AtomicRequest(AtomicRequestRepr),
    /// Atomic Response header (RFC 7306 §5).
    AtomicResponse(AtomicResponseRepr),
}

impl Body {
    /// Length in bytes of the body on the wire.
    pub fn buffer_len(&self) -> usize {
        match self {
            Body::None => 0,
            Body::ReadRequest(r) => r.buffer_len(),
            Body::Terminate(t) => t.buffer_len(),
            Body::ImmediateData(i) => i.buffer_len(),
            Body::AtomicRequest(a) => a.buffer_len(),
            Body::AtomicResponse(a) => a.buffer_len(),
        }
    }

    /// Writes the body into the start of `buf`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] and the body's own emit errors.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        match self {
            Body::None => Ok(()),
            Body::ReadRequest(r) => r.emit(buf),
            Body::Terminate(t) => t.emit(buf),
            Body::ImmediateData(i) => i.emit(buf),
            Body::AtomicRequest(a) => a.emit(buf),
            Body::AtomicResponse(a) => a.emit(buf),
        }
    }
}

/// One parsed ULPDU (one DDP segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ulpdu<'a> {
    /// The DDP + RDMAP header.
    pub header: Header,
    /// The typed RDMAP header for Read Request, Terminate, Immediate Data and
    /// Atomic messages; [`Body::None`] otherwise.
    pub body: Body,
    /// The data payload: everything after the header for Write, Read Response and
    /// the Sends; empty for messages with a body.
    pub payload: &'a [u8],
    /// Total ULPDU length in bytes (the MPA ULPDU Length), as parsed. [`Ulpdu::emit`]
    /// ignores it and writes [`Ulpdu::buffer_len`] bytes.
    pub len: usize,
}

impl Ulpdu<'static> {
    /// The Terminate that carries only `cause` (M = D = R = 0: no header of the
    /// offending segment copied; RFC 5040 §4.8), on the Terminate queue
    /// ([`rdmap::QN_TERMINATE`]) with MSN `msn`, L = 1 and MO 0: for errors tied to no
    /// trustworthy ULPDU, such as an MPA error found below DDP. The first and only
    /// message of that queue has `msn` 1 (RFC 5041 §5.1). Emit it with [`Ulpdu::emit`]
    /// into [`Ulpdu::buffer_len`] bytes (22).
    pub fn terminate(cause: terminate::ErrorCause, msn: u32) -> Ulpdu<'static> {
        Ulpdu {
            header: Header {
                opcode: Opcode::Terminate,
                last: true,
                buffer: BufferModel::Untagged {
                    rsvd_ulp: 0,
                    qn: rdmap::QN_TERMINATE,
                    msn,
                    mo: 0,
                },
            },
            body: Body::Terminate(terminate::Repr::for_error(cause, None)),
            payload: &[],
            len: 0,
        }
    }
}

impl<'a> Ulpdu<'a> {
    /// Parses a complete ULPDU.
    ///
    /// After [`Header::parse`], single-segment messages (Read Request, Terminate,
    /// Immediate Data, Atomic) must have L = 1 and MO = 0, and their bodies must be
    /// complete and end the ULPDU exactly.
    ///
    /// # Errors
    /// Those of [`Header::parse`]; [`Error::NotLast`], [`Error::NonZeroMo`];
    /// [`Error::Truncated`] / [`Error::TrailingBytes`] naming the body field;
    /// [`Error::TerminateLengthWithoutHeader`]; [`Error::UnknownAtomicOpcode`].
    pub fn parse(bytes: &'a [u8]) -> Result<Ulpdu<'a>> {
        let header = Header::parse(bytes)?;
        let op = header.opcode;
        if op.is_single_segment() {
            if !header.last {
                return Err(Error::NotLast { opcode: op });
            }
            if let Some(mo) = header.mo() {
                if mo != 0 {
                    return Err(Error::NonZeroMo { opcode: op, mo });
                }
            }
        }
        let hlen = header.buffer_len();
        let rest = wire::slice(bytes, hlen..bytes.len());
        let (body, payload): (Body, &'a [u8]) = match op {
            Opcode::ReadRequest => {
                rdmap::exact(Field::ReadRequest, rdmap::READ_REQUEST_LEN, rest)?;
                let p = ReadRequestPacket::new_checked(rest)?;
                (Body::ReadRequest(ReadRequestRepr::parse(&p)?), &[])
            }
            Opcode::Terminate => (Body::Terminate(terminate::Repr::parse_bytes(rest)?), &[]),
            Opcode::ImmediateData | Opcode::ImmediateDataSE => {
                (Body::ImmediateData(ImmediateDataRepr::parse(rest)?), &[])
            }
            Opcode::AtomicRequest => (Body::AtomicRequest(AtomicRequestRepr::parse(rest)?), &[]),
            Opcode::AtomicResponse => (Body::AtomicResponse(AtomicResponseRepr::parse(rest)?), &[]),
            Opcode::Write
            | Opcode::ReadResponse
            | Opcode::Send
            | Opcode::SendInvalidate
            | Opcode::SendSE
            | Opcode::SendSEInvalidate => (Body::None, rest),
        };
        Ok(Ulpdu {
            header,
            body,
            payload,
            len: bytes.len(),
        })
    }

    /// Byte range of [`Ulpdu::payload`] within the parsed bytes.
    pub fn payload_range(&self) -> Range<usize> {
        let start = self.len.saturating_sub(self.payload.len());
        start..self.len.max(start)
    }

    /// Bytes after the DDP header (body + payload): DDP's payload length, the
    /// length the DDP segment contributes to its message.
    pub fn ddp_payload_len(&self) -> usize {
        self.len.saturating_sub(self.header.buffer_len())
    }

    /// The opcode.
    pub const fn opcode(&self) -> Opcode {
        self.header.opcode
    }

    /// The L flag.
    pub const fn last(&self) -> bool {
        self.header.last
    }

    /// The bytes a [`terminate::Repr::for_error`] needs about this ULPDU.
    pub fn offending<'b>(&self, bytes: &'b [u8]) -> terminate::Offending<'b> {
        terminate::Offending {
            ulpdu_len: u16::try_from(self.len).unwrap_or(u16::MAX),
            bytes,
        }
    }

    /// Length of the ULPDU that [`Ulpdu::emit`] writes: header + body + payload.
    pub fn buffer_len(&self) -> usize {
        self.header.buffer_len() + self.body.buffer_len() + self.payload.len()
    }

    /// Writes the whole ULPDU (header, body, payload) into the start of `buf`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`]; [`Error::InvalidRepr`] from [`Header::emit`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(self.buffer_len(), buf.len())?;
        self.header.emit(buf)?;
        let h = self.header.buffer_len();
        self.body.emit(wire_tail(buf, h))?;
        wire::put(buf, h + self.body.buffer_len(), self.payload);
        Ok(())
    }
}

/// The cause of the Terminate `ulpdu`, if it is one (RDMAP opcode 7 on QN 2; RFC 5040
/// §4.8), or `None` for every other ULPDU.
///
/// A malformed Terminate (a valid untagged DDP/RDMAP header with opcode 7 on QN 2, but
/// too short to hold the Terminate Control word, or with junk after it) is still the
/// peer ending the stream (RFC 5040 §7: never answered with a Terminate): its cause is
/// the raw Layer/EType/Error Code triple when those two bytes are there
/// ([`ErrorCause::from_raw`]), else [`ErrorCause::Unrecognized`] `0xf/0xf/0xff`. Runs
/// [`Header::is_terminate`] first, so other ULPDUs cost two byte tests.
pub fn terminate_cause(ulpdu: &[u8]) -> Option<ErrorCause> {
    if !Header::is_terminate(ulpdu) {
        return None;
    }
    match Ulpdu::parse(ulpdu) {
        Ok(u) => match u.body {
            Body::Terminate(t) => Some(t.cause),
            _ => None,
        },
        Err(_) => match Header::parse(ulpdu) {
            Ok(h) if h.opcode == Opcode::Terminate && h.qn() == Some(QN_TERMINATE) => {
                let at = h.buffer_len();
                Some(match ulpdu.get(at..at + 2) {
                    Some(&[layer_etype, code]) => {
                        ErrorCause::from_raw(layer_etype >> 4, layer_etype & 0x0f, code)
                    }
                    _ => ErrorCause::Unrecognized {
                        layer: 0x0f,
                        etype: 0x0f,
                        code: 0xff,
                    },
                })
            }
            _ => None,
        },
    }
}

fn wire_tail(buf: &mut [u8], at: usize) -> &mut [u8] {
    let len = buf.len();
    buf.get_mut(at..len).unwrap_or(&mut [])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::terminate::RdmapOperationCode;

    // rping-srv_p2p-cli_p2p.pcap frame 10: the zero-length RDMA Write RTR.
    static RTR: [u8; 14] = [
        0xc1, 0x40, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn header_check_order() {
        assert_eq!(
            Header::parse(&[0xc1]),
            Err(Error::Truncated {
                field: Field::DdpHeader,
                needed: 2,
                len: 1
            })
        );
        // DV is checked before the length.
        assert_eq!(
            Header::parse(&[0x42, 0x43]),
            Err(Error::DdpVersion {
                dv: 2,
                tagged: false
            })
        );
        assert_eq!(
            Header::parse(&[0x41, 0x03]),
            Err(Error::RdmapVersion { rv: 0 })
        );
        assert_eq!(
            Header::parse(&[0x41, 0x4d]),
            Err(Error::UnknownOpcode { opcode: 0xd })
        );
        assert_eq!(
            Header::parse(&[0x41, 0x40]),
            Err(Error::TaggedMismatch {
                opcode: Opcode::Write,
                tagged: false
            })
        );
        assert_eq!(
            Header::parse(&RTR[..13]),
            Err(Error::Truncated {
                field: Field::DdpHeader,
                needed: 14,
                len: 13
            })
        );
        let h = Header::parse(&RTR).unwrap();
        assert_eq!(h.opcode, Opcode::Write);
        assert_eq!((h.stag(), h.to(), h.qn()), (Some(1), Some(0), None));
    }

    #[test]
    fn single_segment_rules() {
        let mut rr = [0u8; 46];
        rr[..18].copy_from_slice(&[0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]);
        assert!(Ulpdu::parse(&rr).is_ok());
        let mut b = rr;
        b[0] = 0x01;
        let e = Ulpdu::parse(&b).unwrap_err();
        assert_eq!(
            e,
            Error::NotLast {
                opcode: Opcode::ReadRequest
            }
        );
        assert_eq!(
            e.terminate_cause(),
            Some(ErrorCause::RdmapRemoteOperation(
                RdmapOperationCode::Unspecified
            ))
        );
        let mut b = rr;
        b[17] = 4;
        assert_eq!(
            Ulpdu::parse(&b),
            Err(Error::NonZeroMo {
                opcode: Opcode::ReadRequest,
                mo: 4
            })
        );
        assert_eq!(
            Ulpdu::parse(&rr[..45]),
            Err(Error::Truncated {
                field: Field::ReadRequest,
                needed: 28,
                len: 27
            })
        );
        let mut long = [0u8; 47];
        long[..46].copy_from_slice(&rr);
        assert_eq!(
            Ulpdu::parse(&long),
            Err(Error::TrailingBytes {
                field: Field::ReadRequest,
                extra: 1
            })
        );
    }

    #[test]
    fn emit_rejects_wrong_model() {
        let h = Header {
            opcode: Opcode::Send,
            last: true,
            buffer: BufferModel::Tagged { stag: 1, to: 0 },
        };
        assert!(matches!(
            h.emit(&mut [0u8; 18]),
            Err(Error::InvalidRepr { .. })
        ));
        assert_eq!(h.invalidate_stag(), None);
    }
}
