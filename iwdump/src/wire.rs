//! The glue between the dissector and the wire crates: MPA Request/Reply parsing
//! and negotiation with `mpa`, FPDU deframing with `mpa::deframer`, ULPDU decoding
//! with `ddp_rdmap`, all turned into the report's plain records.

use ddp_rdmap::ddp::BufferModel;
use ddp_rdmap::{Body, Opcode, Ulpdu};
use mpa::deframer::{self, DeframeError, Deframer, DeframerConfig};
use mpa::fpdu::Framing;
use mpa::negotiate::{self, CrcPolicy, InitiatorError, LocalSettings};
use mpa::wire::{FrameKind, Limits, Packet, Repr, RtrKind, RtrKinds, KEY_LEN};

use crate::report::{CrcStatus, DdpInfo, ErrorKind, FpduInfo, MpaFrameInfo};

/// How the start of a stream compares with the MPA keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMatch {
    /// "MPA ID Req Frame".
    Request,
    /// "MPA ID Rep Frame".
    Reply,
    /// Fewer than 16 octets so far, and they match a key's beginning.
    Partial,
    /// Not an MPA key.
    None,
}

/// Compare the start of a stream with the MPA keys (RFC 5044 7.1.1).
pub fn key_match(buf: &[u8]) -> KeyMatch {
    let n = buf.len().min(KEY_LEN);
    let is = |kind: FrameKind| buf[..n] == kind.key()[..n];
    match (is(FrameKind::Request), is(FrameKind::Reply), n == KEY_LEN) {
        (true, _, true) => KeyMatch::Request,
        (_, true, true) => KeyMatch::Reply,
        (true, _, false) | (_, true, false) => KeyMatch::Partial,
        _ => KeyMatch::None,
    }
}

/// Limits for parsing captured frames: `mpa`'s defaults, i.e. the RFC's 512-octet
/// private data bound, and lenient about reserved flag bits (RFC 5044 7.1.1: not
/// checked on receipt; Linux siw may use 0x08 for its GSO extension; they are shown
/// in [`MpaFrameInfo::reserved_flags`] and kept in the parsed `Repr`, so it
/// re-emits the captured octets).
fn limits() -> Limits {
    Limits::default()
}

/// Total length of the MPA frame at the front of `buf`: `Ok(None)` while its
/// 20-octet header is incomplete.
///
/// # Errors
/// A description of a malformed header (bad Rev, R in a Request, private data
/// length over 512).
pub fn mpa_frame_len(buf: &[u8]) -> Result<Option<usize>, String> {
    mpa::wire::needed_len(buf, &limits()).map_err(|e| e.to_string())
}

/// Parse a complete MPA frame (`bytes` is exactly the frame).
///
/// # Errors
/// A description of what is malformed.
pub fn parse_mpa_frame(bytes: &[u8]) -> Result<(MpaFrameInfo, Repr), String> {
    let (repr, _) = Repr::parse_bytes(bytes, &limits()).map_err(|e| e.to_string())?;
    let packet = Packet::new_checked(bytes).map_err(|e| e.to_string())?;
    let words = repr.rev2.map(|p| {
        let b = p.to_bytes();
        format!("{:02x}{:02x} {:02x}{:02x}", b[0], b[1], b[2], b[3])
    });
    let info = MpaFrameInfo {
        frame: 0,
        revision: repr.rev,
        markers: repr.markers,
        crc: repr.crc,
        reject: repr.reject,
        enhanced: packet.enhanced(),
        reserved_flags: packet.reserved_bits(),
        private_data_len: packet.private_data_len(),
        ird_ord_words: words,
        ird: repr.rev2.map(|p| p.ird),
        ord: repr.rev2.map(|p| p.ord),
        p2p: repr.rev2.map(|p| p.peer_to_peer),
        rtr_send: repr.rev2.map(|p| p.rtr.send),
        rtr_write: repr.rev2.map(|p| p.rtr.write),
        rtr_read: repr.rev2.map(|p| p.rtr.read),
    };
    Ok((info, repr))
}

/// The outcome of the Request/Reply exchange, as both peers must see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// CRC used in both directions.
    pub crc: bool,
    /// Markers in the initiator-to-responder direction.
    pub markers_to_responder: bool,
    /// Markers in the responder-to-initiator direction.
    pub markers_to_initiator: bool,
    /// The Reply rejected the connection.
    pub rejected: bool,
    /// The Reply breaks the negotiation rules (RFC 5044 7.1, RFC 6581): why.
    pub problem: Option<String>,
}

/// Work out the framing of both directions from the Request and the Reply.
///
/// The initiator's settings are rebuilt from its Request and the Reply is judged
/// with [`negotiate::complete`], the initiator's side of the `mpa` crate's
/// negotiation. When the Reply breaks a rule, the flag rules alone decide the
/// framing (C in either frame: CRC both ways; M in a frame: Markers in what its
/// sender receives) and the reason is returned in [`Negotiated::problem`].
pub fn negotiate(req: &Repr, rep: &Repr) -> Negotiated {
    let by_flags = Negotiated {
        crc: req.crc || rep.crc,
        markers_to_responder: rep.markers,
        markers_to_initiator: req.markers,
        rejected: rep.reject,
        problem: None,
    };
    if rep.reject {
        return by_flags;
    }
    // A Rev 2 Request without the enhanced bit has no IRD/ORD word; LocalSettings
    // cannot express it, and there is nothing more than the flags to check.
    if req.rev == 2 && req.rev2.is_none() {
        return by_flags;
    }
    let p2p = req.rev2.is_some_and(|p| p.peer_to_peer);
    let offered = req.rev2.map_or(RtrKinds::NONE, |p| p.rtr);
    let local = LocalSettings {
        rev: req.rev,
        crc: if req.crc {
            CrcPolicy::Wanted
        } else {
            CrcPolicy::IfPeerAsks
        },
        markers_rx: req.markers,
        markers_tx_ok: true,
        p2p,
        // An offer of no RTR kind is taken as Write (as Linux siw does).
        rtr: if p2p && offered.is_empty() {
            RtrKinds::only(Some(RtrKind::Write))
        } else {
            offered
        },
        ird: req.rev2.map_or(1, |p| p.ird),
        ord: req.rev2.map_or(1, |p| p.ord),
        relaxed_ird_ord: true,
        private_data: req.private_data.clone(),
    };
    match negotiate::complete(&local, rep) {
        Ok(agreed) => Negotiated {
            crc: agreed.crc,
            markers_to_responder: agreed.markers_tx,
            markers_to_initiator: agreed.markers_rx,
            rejected: false,
            problem: None,
        },
        Err(InitiatorError::Rejected { .. }) => Negotiated {
            rejected: true,
            ..by_flags
        },
        Err(e @ InitiatorError::Protocol(_)) => Negotiated {
            problem: Some(e.to_string()),
            ..by_flags
        },
        // Settings rebuilt from a valid Request are valid; if not, the flags decide.
        Err(InitiatorError::Settings(_)) => by_flags,
    }
}

/// Output of [`FpduDecoder::feed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeframeEvent {
    /// One FPDU, with the error found in it, if any (bad CRC, undecodable ULPDU).
    Fpdu {
        /// Stream offset of its first octet.
        offset: u64,
        /// Octets it occupies in the stream.
        wire_len: u64,
        /// Its fields.
        info: FpduInfo,
        /// A non-fatal error found in it.
        error: Option<(ErrorKind, String)>,
    },
    /// A framing error: the stream cannot be followed any further.
    Fatal {
        /// Stream offset of the offending FPDU or Marker.
        offset: u64,
        /// Category.
        kind: ErrorKind,
        /// What is wrong.
        message: String,
    },
}

/// FPDU decoding for one direction: the `mpa` deframer plus ULPDU decoding.
#[derive(Debug)]
pub struct FpduDecoder {
    deframer: Deframer,
    /// Stream offset where the next FPDU starts (end of the last one yielded).
    next_fpdu: u64,
    /// The last octets fed before the current chunk (at most [`TAIL`]), so the
    /// PAD of an FPDU that ends in this chunk can be looked at.
    tail: Vec<u8>,
}

/// PAD (0-3 octets) + CRC (4) end an FPDU: 7 octets before its end at most.
const TAIL: usize = 8;

impl FpduDecoder {
    /// A decoder for a direction whose FPDUs start at stream offset `start` (right
    /// after its MPA Request/Reply), with the negotiated CRC and Markers.
    pub fn new(crc: bool, markers: bool, start: u64) -> FpduDecoder {
        let mut cfg = DeframerConfig::new(Framing { crc, markers });
        cfg.offset_base = start;
        cfg.deliver_bad_crc = true;
        FpduDecoder {
            deframer: Deframer::new(cfg),
            next_fpdu: start,
            tail: Vec::new(),
        }
    }

    /// Octets of an incomplete FPDU held.
    pub fn pending(&self) -> u64 {
        self.deframer.stream_offset().saturating_sub(self.next_fpdu)
    }

    /// Stream offset of the incomplete FPDU held (where the next FPDU starts).
    pub fn pending_offset(&self) -> u64 {
        self.next_fpdu
    }

    /// Feed the next in-order octets of the stream.
    pub fn feed(&mut self, data: &[u8]) -> Vec<DeframeEvent> {
        let mut out = Vec::new();
        let next = &mut self.next_fpdu;
        let chunk_start = self.deframer.stream_offset();
        let markers = self.deframer.config().framing.markers;
        let tail = &self.tail;
        // The octet at stream offset `at`, if it is in this chunk or the tail.
        let octet = |at: u64| -> Option<u8> {
            if at >= chunk_start {
                data.get(usize::try_from(at - chunk_start).ok()?).copied()
            } else {
                let back = usize::try_from(chunk_start - at).ok()?;
                tail.len()
                    .checked_sub(back)
                    .and_then(|i| tail.get(i))
                    .copied()
            }
        };
        self.deframer.feed(data, |item| match item {
            Ok(fpdu) => {
                let end = fpdu.offset + fpdu.wire_len as u64;
                *next = end;
                // Without Markers the PAD sits right before the 4-octet CRC.
                let pad = mpa::fpdu::pad_len(fpdu.ulpdu.len()) as u64;
                let pad_nonzero = !markers
                    && (end - 4 - pad..end - 4).any(|at| octet(at).is_some_and(|b| b != 0));
                out.push(fpdu_event(&fpdu, pad_nonzero));
            }
            Err(e) => {
                let offset = e.offset();
                let kind = match e {
                    DeframeError::BadCrc { .. } => ErrorKind::Crc,
                    DeframeError::BadUlpduLength { .. } => ErrorKind::Length,
                    DeframeError::BadMarker { .. } => ErrorKind::Marker,
                };
                out.push(DeframeEvent::Fatal {
                    offset,
                    kind,
                    message: e.to_string(),
                });
            }
        });
        let keep = data.len().min(TAIL);
        let drop = (self.tail.len() + keep).saturating_sub(TAIL);
        self.tail.drain(..drop.min(self.tail.len()));
        self.tail.extend_from_slice(&data[data.len() - keep..]);
        out
    }
}

fn fpdu_event(fpdu: &deframer::Fpdu<'_>, pad_nonzero: bool) -> DeframeEvent {
    let crc = match fpdu.crc {
        deframer::CrcStatus::Good(_) => CrcStatus::Good,
        deframer::CrcStatus::Bad { .. } => CrcStatus::Bad,
        deframer::CrcStatus::Off => CrcStatus::Off,
    };
    let crc_error = match fpdu.crc {
        deframer::CrcStatus::Bad { received, computed } => Some((
            ErrorKind::Crc,
            format!("MPA CRC error: CRC field {received:#010x}, computed {computed:#010x}"),
        )),
        _ => None,
    };
    let ulpdu_len = u16::try_from(fpdu.ulpdu.len()).unwrap_or(u16::MAX);
    let (mut info, ulpdu_error) = decode_ulpdu(fpdu.ulpdu, ulpdu_len, crc);
    info.pad_nonzero = pad_nonzero;
    DeframeEvent::Fpdu {
        offset: fpdu.offset,
        wire_len: fpdu.wire_len as u64,
        info,
        // The CRC error first: with a bad CRC, a bad header is a consequence.
        error: crc_error.or(ulpdu_error),
    }
}

/// The fields of an RFC 7306 Atomic Request in words: the operation, its Request
/// Identifier, the target (STag, TO) and the operands the operation uses, e.g.
/// `FetchAdd id 1 STag 0x12345600 TO 0x1000 add 0x5 add mask 0x0` or `CmpSwap id 2
/// STag .. TO .. compare 0x7 mask 0xffffffffffffffff swap 0x9 mask 0xffffffffffffffff`.
fn atomic_request_detail(a: &ddp_rdmap::rdmap::AtomicRequestRepr) -> String {
    use ddp_rdmap::rdmap::AtomicOpcode;
    let target = format!(
        "{} id {} STag 0x{:08x} TO 0x{:x}",
        a.opcode, a.request_id, a.remote_stag, a.remote_to
    );
    let (data, mask) = (a.add_or_swap_data, a.add_or_swap_mask);
    match a.opcode {
        AtomicOpcode::FetchAdd => format!("{target} add 0x{data:x} add mask 0x{mask:x}"),
        AtomicOpcode::Swap => format!("{target} swap 0x{data:x} mask 0x{mask:x}"),
        AtomicOpcode::CmpSwap => format!(
            "{target} compare 0x{:x} mask 0x{:x} swap 0x{data:x} mask 0x{mask:x}",
            a.compare_data, a.compare_mask
        ),
    }
}

/// Decode one ULPDU with `ddp_rdmap`; on failure, a best-effort record (opcode
/// from the control byte) and the error.
fn decode_ulpdu(
    bytes: &[u8],
    ulpdu_len: u16,
    crc: CrcStatus,
) -> (FpduInfo, Option<(ErrorKind, String)>) {
    match Ulpdu::parse(bytes) {
        Ok(u) => {
            let ddp = match u.header.buffer {
                BufferModel::Tagged { stag, to } => DdpInfo::Tagged { stag, to },
                BufferModel::Untagged { qn, msn, mo, .. } => DdpInfo::Untagged { qn, msn, mo },
            };
            let detail = match (&u.body, u.header.invalidate_stag()) {
                (Body::ReadRequest(rr), _) => Some(format!(
                    "sink STag 0x{:08x} TO 0x{:x} size {} src STag 0x{:08x} TO 0x{:x}",
                    rr.sink_stag, rr.sink_to, rr.size, rr.src_stag, rr.src_to
                )),
                (Body::Terminate(t), _) => {
                    let c = t.control();
                    Some(format!(
                        "{} [M={} D={} R={}]",
                        t.cause,
                        u8::from(c.m),
                        u8::from(c.d),
                        u8::from(c.r)
                    ))
                }
                (Body::ImmediateData(d), _) => Some(format!("immediate data {:02x?}", d.data)),
                (Body::AtomicRequest(a), _) => Some(atomic_request_detail(a)),
                (Body::AtomicResponse(a), _) => Some(format!(
                    "id {} original value 0x{:x}",
                    a.request_id, a.original_value
                )),
                (Body::None, Some(stag)) => Some(format!("invalidate STag 0x{stag:08x}")),
                (Body::None, None) => None,
            };
            let info = FpduInfo {
                opcode: u.opcode().name().to_string(),
                last: u.last(),
                ddp: Some(ddp),
                ulpdu_len,
                payload_len: u.payload.len(),
                crc,
                pad_nonzero: false,
                detail,
            };
            (info, None)
        }
        Err(e) => {
            let control = bytes.first().copied().unwrap_or(0);
            let raw_op = bytes.get(1).map(|b| b & 0x0f);
            let opcode = match (e, raw_op) {
                (ddp_rdmap::Error::UnknownOpcode { opcode }, _) => format!("Unknown({opcode:#x})"),
                (_, Some(op)) => Opcode::from_u8(op)
                    .map_or_else(|| format!("Unknown({op:#x})"), |o| o.name().to_string()),
                (_, None) => "Malformed".to_string(),
            };
            let kind = match e {
                ddp_rdmap::Error::UnknownOpcode { .. }
                | ddp_rdmap::Error::TaggedMismatch { .. } => ErrorKind::Opcode,
                ddp_rdmap::Error::Truncated { .. } | ddp_rdmap::Error::TrailingBytes { .. } => {
                    ErrorKind::Length
                }
                _ => ErrorKind::Ddp,
            };
            let info = FpduInfo {
                opcode,
                last: control & ddp_rdmap::ddp::FLAG_L != 0,
                ddp: None,
                ulpdu_len,
                payload_len: 0,
                crc,
                pad_nonzero: false,
                detail: Some(format!("undecodable ULPDU: {e}")),
            };
            (info, Some((kind, format!("bad DDP/RDMAP header: {e}"))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert_eq!(key_match(b"MPA ID Req Frame\x10"), KeyMatch::Request);
        assert_eq!(key_match(b"MPA ID Rep Frame"), KeyMatch::Reply);
        assert_eq!(key_match(b"MPA ID Re"), KeyMatch::Partial);
        assert_eq!(key_match(b""), KeyMatch::Partial);
        assert_eq!(key_match(b"GET / HTTP/1.1\r\n"), KeyMatch::None);
        assert_eq!(key_match(b"MPA X"), KeyMatch::None);
    }

    fn frame(kind: FrameKind, flags: u8, rev: u8, pd: &[u8]) -> Vec<u8> {
        let mut v = kind.key().to_vec();
        v.push(flags);
        v.push(rev);
        v.extend_from_slice(&(pd.len() as u16).to_be_bytes());
        v.extend_from_slice(pd);
        v
    }

    #[test]
    fn p2p_frames_and_negotiation() {
        let req = frame(FrameKind::Request, 0x10, 2, &[0x80, 0x01, 0xc0, 0x01]);
        let rep = frame(FrameKind::Reply, 0x10, 2, &[0x80, 0x01, 0x80, 0x01]);
        assert_eq!(mpa_frame_len(&req[..19]), Ok(None));
        assert_eq!(mpa_frame_len(&req), Ok(Some(24)));
        let (qi, q) = parse_mpa_frame(&req).unwrap();
        let (pi, p) = parse_mpa_frame(&rep).unwrap();
        assert_eq!(qi.ird_ord_words.as_deref(), Some("8001 c001"));
        assert_eq!(pi.ird_ord_words.as_deref(), Some("8001 8001"));
        assert_eq!((qi.rtr_write, qi.rtr_read), (Some(true), Some(true)));
        assert_eq!((pi.rtr_write, pi.rtr_read), (Some(true), Some(false)));
        let n = negotiate(&q, &p);
        assert_eq!(
            n,
            Negotiated {
                crc: false,
                markers_to_responder: false,
                markers_to_initiator: false,
                rejected: false,
                problem: None
            }
        );
    }

    #[test]
    fn crc_and_markers_per_direction() {
        let req = frame(FrameKind::Request, 0x80 | 0x10, 2, &[0, 1, 0, 1]);
        let rep = frame(FrameKind::Reply, 0x40 | 0x10, 2, &[0, 1, 0, 1]);
        let (_, q) = parse_mpa_frame(&req).unwrap();
        let (_, p) = parse_mpa_frame(&rep).unwrap();
        let n = negotiate(&q, &p);
        assert!(n.crc);
        assert!(n.markers_to_initiator);
        assert!(!n.markers_to_responder);
        assert_eq!(n.problem, None);
    }

    #[test]
    fn reject_and_bad_reply() {
        let req = frame(FrameKind::Request, 0x10, 2, &[0, 1, 0, 1]);
        let (_, q) = parse_mpa_frame(&req).unwrap();
        let rej = frame(FrameKind::Reply, 0x20 | 0x10, 2, &[0, 1, 0, 1]);
        let (ri, r) = parse_mpa_frame(&rej).unwrap();
        assert!(ri.reject);
        assert!(negotiate(&q, &r).rejected);
        // Reply ORD 5 over the initiator's IRD 1: RFC 6581 violation.
        let bad = frame(FrameKind::Reply, 0x10, 2, &[0, 1, 0, 5]);
        let (_, b) = parse_mpa_frame(&bad).unwrap();
        let n = negotiate(&q, &b);
        assert!(!n.rejected);
        assert!(n.problem.is_some());
        // Malformed: Rev 3.
        assert!(mpa_frame_len(&frame(FrameKind::Request, 0, 3, &[])).is_err());
        assert!(parse_mpa_frame(&frame(FrameKind::Request, 0x10, 2, &[1])).is_err());
    }

    fn fpdu(ulpdu: &[u8], crc: bool) -> Vec<u8> {
        let mut out = Vec::new();
        mpa::fpdu::Framer::new(Framing {
            crc,
            markers: false,
        })
        .append(ulpdu, &mut out)
        .unwrap();
        out
    }

    #[test]
    fn fpdus_in_pieces_with_bad_crc_and_unknown_opcode() {
        // Send, QN 0, MSN 1, MO 0, L=1, 4 payload bytes.
        let send = [
            0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 2, 3, 4,
        ];
        let mut unknown = send;
        unknown[1] = 0x4c;
        let mut stream = fpdu(&send, true);
        let mut bad = fpdu(&send, true);
        bad[20] ^= 0xff;
        stream.extend_from_slice(&bad);
        stream.extend_from_slice(&fpdu(&unknown, true));
        let mut d = FpduDecoder::new(true, false, 100);
        let mut events = Vec::new();
        for b in &stream {
            events.extend(d.feed(std::slice::from_ref(b)));
        }
        assert_eq!(d.pending(), 0);
        assert_eq!(d.pending_offset(), 100 + stream.len() as u64);
        assert_eq!(events.len(), 3);
        let DeframeEvent::Fpdu {
            offset,
            wire_len,
            info,
            error,
        } = &events[0]
        else {
            panic!()
        };
        assert_eq!((*offset, *wire_len), (100, 28));
        assert_eq!(info.opcode, "Send");
        assert_eq!(
            info.ddp,
            Some(DdpInfo::Untagged {
                qn: 0,
                msn: 1,
                mo: 0
            })
        );
        assert_eq!(
            (info.payload_len, info.crc, info.last),
            (4, CrcStatus::Good, true)
        );
        assert!(error.is_none());
        let DeframeEvent::Fpdu { info, error, .. } = &events[1] else {
            panic!()
        };
        assert_eq!(info.crc, CrcStatus::Bad);
        assert_eq!(error.as_ref().unwrap().0, ErrorKind::Crc);
        let DeframeEvent::Fpdu { info, error, .. } = &events[2] else {
            panic!()
        };
        assert_eq!(info.opcode, "Unknown(0xc)");
        assert_eq!(error.as_ref().unwrap().0, ErrorKind::Opcode);
    }

    #[test]
    fn nonzero_pad_is_noticed_across_chunks() {
        // Send with a 2-byte payload: ULPDU 20, PAD 2.
        let send = [
            0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 7, 7,
        ];
        let mut one = fpdu(&send, false);
        assert_eq!(one.len(), 28);
        let clean = one.clone();
        one[23] = 0x40;
        for split in 0..one.len() {
            for (bytes, want) in [(&clean, false), (&one, true)] {
                let mut d = FpduDecoder::new(false, false, 0);
                let mut ev = d.feed(&bytes[..split]);
                ev.extend(d.feed(&bytes[split..]));
                let [DeframeEvent::Fpdu { info, .. }] = &ev[..] else {
                    panic!("{ev:?}")
                };
                assert_eq!(info.pad_nonzero, want, "split {split}");
            }
        }
    }

    #[test]
    fn zero_ulpdu_length_is_fatal() {
        let mut d = FpduDecoder::new(false, false, 0);
        let ev = d.feed(&[0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(
            ev[..],
            [DeframeEvent::Fatal {
                kind: ErrorKind::Length,
                offset: 0,
                ..
            }]
        ));
    }
}
