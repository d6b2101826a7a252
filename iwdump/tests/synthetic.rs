//! Hand-built captures for what the siw captures do not show: Markers, bad
//! Markers, bad lengths, unknown opcodes, malformed MPA frames, non-MPA streams,
//! missing TCP data, a stream ending inside an FPDU, a reject, a Terminate, an RFC
//! 7306 atomic exchange.

use std::net::SocketAddr;

use ddp_rdmap::ddp::BufferModel;
use ddp_rdmap::terminate::{self, ErrorCause, RdmapOperationCode};
use ddp_rdmap::{Header, Opcode};
use etherparse::PacketBuilder;
use iwdump::report::{CrcStatus, ErrorKind};
use mpa::fpdu::{Framer, Framing};
use mpa::negotiate::{self, CrcPolicy, LocalSettings, Response};
use mpa::wire::{FrameKind, Repr};

const CLIENT: &str = "10.0.0.2:40000";
const SERVER: &str = "10.0.0.1:7174";

/// A capture under construction: one TCP connection, segments in order.
struct Pcap {
    frames: Vec<Vec<u8>>,
    seq: [u32; 2],
}

impl Pcap {
    /// SYN, SYN-ACK, ACK.
    fn new() -> Pcap {
        let mut p = Pcap {
            frames: Vec::new(),
            seq: [1000, 5000],
        };
        p.raw(0, p.seq[0], true, false, b"");
        p.raw(1, p.seq[1], true, false, b"");
        p.seq = [1001, 5001];
        p
    }

    fn raw(&mut self, dir: usize, seq: u32, syn: bool, fin: bool, payload: &[u8]) {
        let (a, b): (SocketAddr, SocketAddr) = if dir == 0 {
            (CLIENT.parse().unwrap(), SERVER.parse().unwrap())
        } else {
            (SERVER.parse().unwrap(), CLIENT.parse().unwrap())
        };
        let ip = |s: SocketAddr| match s.ip() {
            std::net::IpAddr::V4(v) => v.octets(),
            std::net::IpAddr::V6(_) => unreachable!(),
        };
        let mut builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4(ip(a), ip(b), 64)
            .tcp(a.port(), b.port(), seq, 1000);
        if syn {
            builder = builder.syn();
        }
        if dir == 1 || !syn {
            builder = builder.ack(1);
        }
        if fin {
            builder = builder.fin();
        }
        let mut out = Vec::new();
        builder.write(&mut out, payload).unwrap();
        self.frames.push(out);
    }

    /// A data segment from `dir` (0 client, 1 server); returns its frame number.
    fn send(&mut self, dir: usize, payload: &[u8]) -> u64 {
        let seq = self.seq[dir];
        self.raw(dir, seq, false, false, payload);
        self.seq[dir] = seq.wrapping_add(payload.len() as u32);
        self.frames.len() as u64
    }

    /// Skip `n` octets of sequence space in `dir` (a segment never captured).
    fn lose(&mut self, dir: usize, n: u32) {
        self.seq[dir] = self.seq[dir].wrapping_add(n);
    }

    fn fin(&mut self, dir: usize) {
        let seq = self.seq[dir];
        self.raw(dir, seq, false, true, b"");
        self.seq[dir] = seq.wrapping_add(1);
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for w in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 65535, 1] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        for f in &self.frames {
            for w in [0u32, 0, f.len() as u32, f.len() as u32] {
                out.extend_from_slice(&w.to_le_bytes());
            }
            out.extend_from_slice(f);
        }
        out
    }

    fn dissect(&self) -> iwdump::Report {
        iwdump::dissect(&self.bytes()).unwrap()
    }
}

/// Request and Reply bytes for the given initiator/responder settings, and the
/// framing of (initiator -> responder, responder -> initiator).
fn handshake(init: &LocalSettings, resp: &LocalSettings) -> (Vec<u8>, Vec<u8>, Framing, Framing) {
    let req = negotiate::request(init).unwrap();
    let Response::Accept { agreed, reply } = negotiate::respond(resp, &req).unwrap() else {
        panic!("rejected")
    };
    (
        req.to_bytes().unwrap(),
        reply.to_bytes().unwrap(),
        agreed.rx_framing(),
        agreed.tx_framing(),
    )
}

fn send_ulpdu(msn: u32, payload: &[u8]) -> Vec<u8> {
    let h = Header {
        opcode: Opcode::Send,
        last: true,
        buffer: BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: 0,
            msn,
            mo: 0,
        },
    };
    let mut v = h.to_bytes().unwrap()[..h.buffer_len()].to_vec();
    v.extend_from_slice(payload);
    v
}

fn write_ulpdu(stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    let h = Header {
        opcode: Opcode::Write,
        last: true,
        buffer: BufferModel::Tagged { stag, to },
    };
    let mut v = h.to_bytes().unwrap()[..h.buffer_len()].to_vec();
    v.extend_from_slice(payload);
    v
}

fn fpdus(framer: &mut Framer, ulpdus: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for u in ulpdus {
        framer.append(u, &mut out).unwrap();
    }
    out
}

fn kinds(r: &iwdump::Report) -> Vec<ErrorKind> {
    r.errors.iter().map(|e| e.kind).collect()
}

#[test]
fn markers_and_crc_both_ways_with_reply_and_fpdu_in_one_segment() {
    let init = LocalSettings {
        crc: CrcPolicy::Wanted,
        markers_rx: true,
        ..LocalSettings::default()
    };
    let resp = LocalSettings {
        markers_rx: true,
        ..LocalSettings::default()
    };
    let (req, rep, up, down) = handshake(&init, &resp);
    assert!(up.markers && down.markers && up.crc);
    let mut p = Pcap::new();
    p.send(0, &req);
    // The Reply and the responder's first FPDUs in one segment.
    let mut down_framer = Framer::new(down);
    let mut seg = rep.clone();
    seg.extend(fpdus(&mut down_framer, &[send_ulpdu(1, &[7; 700])]));
    p.send(1, &seg);
    let mut up_framer = Framer::new(up);
    // Long FPDUs that cross several Markers, cut at odd places.
    let stream = fpdus(
        &mut up_framer,
        &[
            send_ulpdu(1, &[1; 1500]),
            write_ulpdu(0x1234, 0x10, &[2; 3000]),
            send_ulpdu(2, &[3; 10]),
        ],
    );
    for piece in stream.chunks(333) {
        p.send(0, piece);
    }
    let r = p.dissect();
    assert!(r.errors.is_empty(), "{:#?}", r.errors);
    assert_eq!(r.fpdus, 4);
    let c = &r.connections[0];
    assert_eq!(c.markers_to_responder, Some(true));
    assert_eq!(c.markers_to_initiator, Some(true));
    assert_eq!(c.crc, Some(true));
    assert!(r.fpdu_records().all(|(_, f)| f.crc == CrcStatus::Good));
    let sizes: Vec<_> = r.fpdu_records().map(|(_, f)| f.payload_len).collect();
    assert_eq!(sizes, vec![700, 1500, 3000, 10]);
}

#[test]
fn bad_marker_is_fatal_for_the_direction() {
    let init = LocalSettings::default();
    let resp = LocalSettings {
        markers_rx: true,
        ..LocalSettings::default()
    };
    let (req, rep, up, _) = handshake(&init, &resp);
    let mut p = Pcap::new();
    p.send(0, &req);
    p.send(1, &rep);
    let mut framer = Framer::new(up);
    let mut stream = fpdus(
        &mut framer,
        &[
            send_ulpdu(1, &[1; 600]),
            send_ulpdu(2, &[2; 600]),
            send_ulpdu(3, &[3; 8]),
        ],
    );
    // The Marker at stream position 512 lies inside the first FPDU: break its FPDUPTR.
    stream[512 + 3] ^= 0x04;
    let frame = p.send(0, &stream);
    let r = p.dissect();
    assert_eq!(kinds(&r), vec![ErrorKind::Marker], "{:#?}", r.errors);
    assert_eq!(r.errors[0].frame, Some(frame));
    assert_eq!(r.fpdus, 0, "nothing decoded after the framing error");
}

#[test]
fn zero_ulpdu_length_is_fatal() {
    let (req, rep, up, _) = handshake(&LocalSettings::default(), &LocalSettings::default());
    let mut p = Pcap::new();
    p.send(0, &req);
    p.send(1, &rep);
    let mut framer = Framer::new(up);
    p.send(0, &fpdus(&mut framer, &[send_ulpdu(1, b"ok")]));
    let bad = p.send(0, &[0, 0, 0, 0, 0, 0, 0, 0]);
    p.send(0, &fpdus(&mut framer, &[send_ulpdu(2, b"never seen")]));
    let r = p.dissect();
    assert_eq!(kinds(&r), vec![ErrorKind::Length]);
    assert_eq!(r.errors[0].frame, Some(bad));
    assert_eq!(r.fpdus, 1);
}

#[test]
fn unknown_opcode_and_bad_header_do_not_stop_decoding() {
    let (req, rep, up, _) = handshake(&LocalSettings::default(), &LocalSettings::default());
    let mut p = Pcap::new();
    p.send(0, &req);
    p.send(1, &rep);
    let mut framer = Framer::new(up);
    let mut unknown = send_ulpdu(1, b"abcd");
    unknown[1] = 0x4d; // RV 1, opcode 0xD
    let mut short = send_ulpdu(1, b"");
    short.truncate(10); // an untagged header cut short
    let f1 = p.send(0, &fpdus(&mut framer, &[unknown]));
    let f2 = p.send(0, &fpdus(&mut framer, &[short]));
    p.send(0, &fpdus(&mut framer, &[send_ulpdu(1, b"fine")]));
    let r = p.dissect();
    assert_eq!(kinds(&r), vec![ErrorKind::Opcode, ErrorKind::Length]);
    assert_eq!(r.errors[0].frame, Some(f1));
    assert_eq!(r.errors[1].frame, Some(f2));
    assert_eq!(r.fpdus, 3);
    assert_eq!(r.opcodes.get("Unknown(0xd)"), Some(&1));
    assert_eq!(r.messages.get("Send"), Some(&1));
}

#[test]
fn malformed_request_is_an_error() {
    let mut req = negotiate::request(&LocalSettings::default())
        .unwrap()
        .to_bytes()
        .unwrap();
    req[17] = 3; // Rev 3
    let mut p = Pcap::new();
    let f = p.send(0, &req);
    let r = p.dissect();
    assert_eq!(kinds(&r), vec![ErrorKind::MpaFrame]);
    assert_eq!(r.errors[0].frame, Some(f));
    assert_eq!(r.connections.len(), 1);
}

#[test]
fn reply_must_follow_a_request() {
    let (req, _, _, _) = handshake(&LocalSettings::default(), &LocalSettings::default());
    let mut p = Pcap::new();
    p.send(0, &req);
    p.send(1, b"HTTP/1.1 200 OK\r\n\r\n");
    let r = p.dissect();
    assert_eq!(kinds(&r), vec![ErrorKind::MpaFrame]);
}

#[test]
fn non_mpa_connection_is_skipped_not_an_error() {
    let mut p = Pcap::new();
    p.send(0, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    p.send(1, b"HTTP/1.1 200 OK\r\n\r\n");
    let r = p.dissect();
    assert!(r.errors.is_empty());
    assert_eq!(r.skipped.len(), 1);
    assert_eq!(r.tcp_connections, 1);
    assert!(r.connections.is_empty());
}

#[test]
fn missing_tcp_data_is_reported() {
    let (req, rep, up, _) = handshake(&LocalSettings::default(), &LocalSettings::default());
    let mut p = Pcap::new();
    p.send(0, &req);
    p.send(1, &rep);
    let mut framer = Framer::new(up);
    let one = fpdus(&mut framer, &[send_ulpdu(1, b"one")]);
    let two = fpdus(&mut framer, &[send_ulpdu(2, b"two")]);
    let three = fpdus(&mut framer, &[send_ulpdu(3, b"three")]);
    p.send(0, &one);
    p.lose(0, two.len() as u32);
    let after = p.send(0, &three);
    let r = p.dissect();
    assert_eq!(kinds(&r), vec![ErrorKind::MissingData]);
    assert_eq!(r.errors[0].frame, Some(after));
    assert_eq!(r.fpdus, 1);
}

#[test]
fn fin_inside_an_fpdu_is_truncation() {
    let (req, rep, up, _) = handshake(&LocalSettings::default(), &LocalSettings::default());
    let mut p = Pcap::new();
    p.send(0, &req);
    p.send(1, &rep);
    let mut framer = Framer::new(up);
    let s = fpdus(&mut framer, &[send_ulpdu(1, &[5; 100])]);
    let f = p.send(0, &s[..50]);
    p.fin(0);
    let r = p.dissect();
    assert_eq!(kinds(&r), vec![ErrorKind::Truncated]);
    assert_eq!(r.errors[0].frame, Some(f));
    // Without the FIN, the capture merely ends: a warning.
    let mut p = Pcap::new();
    p.send(0, &req);
    p.send(1, &rep);
    p.send(0, &s[..50]);
    let r = p.dissect();
    assert!(r.errors.is_empty());
    assert_eq!(r.warnings.len(), 1);
}

#[test]
fn rejected_connection() {
    let init = LocalSettings {
        markers_rx: true,
        ..LocalSettings::default()
    };
    let resp = LocalSettings {
        markers_tx_ok: false,
        ..LocalSettings::default()
    };
    let req = negotiate::request(&init).unwrap();
    let Response::Reject { reply, .. } = negotiate::respond(&resp, &req).unwrap() else {
        panic!("accepted")
    };
    assert!(reply.reject);
    let mut p = Pcap::new();
    p.send(0, &req.to_bytes().unwrap());
    let f = p.send(1, &reply.to_bytes().unwrap());
    p.fin(1);
    p.fin(0);
    let r = p.dissect();
    assert!(r.errors.is_empty(), "{:#?}", r.errors);
    let rep = r.connections[0].reply.as_ref().unwrap();
    assert!(rep.reject);
    assert_eq!(rep.frame, f);
    assert!(p_text_mentions(&r, "MPA Reject"));
}

fn p_text_mentions(r: &iwdump::Report, what: &str) -> bool {
    r.to_text(true).contains(what)
}

#[test]
fn terminate_is_decoded_and_later_fpdus_warned_about() {
    let (req, rep, up, down) = handshake(&LocalSettings::default(), &LocalSettings::default());
    let mut p = Pcap::new();
    p.send(0, &req);
    p.send(1, &rep);
    let term = terminate::Repr::new(ErrorCause::RdmapRemoteOperation(
        RdmapOperationCode::UnexpectedOpcode,
    ));
    let h = Header {
        opcode: Opcode::Terminate,
        last: true,
        buffer: BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: 2,
            msn: 1,
            mo: 0,
        },
    };
    let mut u = h.to_bytes().unwrap()[..h.buffer_len()].to_vec();
    let mut body = vec![0u8; term.buffer_len()];
    term.emit(&mut body).unwrap();
    u.extend_from_slice(&body);
    let mut down_framer = Framer::new(down);
    p.send(1, &fpdus(&mut down_framer, &[u]));
    let mut up_framer = Framer::new(up);
    p.send(0, &fpdus(&mut up_framer, &[send_ulpdu(1, b"late")]));
    let r = p.dissect();
    assert!(r.errors.is_empty(), "{:#?}", r.errors);
    assert_eq!(r.opcodes.get("Terminate"), Some(&1));
    let (_, t) = r
        .fpdu_records()
        .find(|(_, f)| f.opcode == "Terminate")
        .unwrap();
    assert!(
        t.detail.as_deref().unwrap().contains("0x2"),
        "{:?}",
        t.detail
    );
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
}

#[test]
fn mpa_rev1_without_private_data() {
    let init = LocalSettings {
        rev: 1,
        ..LocalSettings::default()
    };
    let (req, rep, up, _) = handshake(&init, &LocalSettings::default());
    let (parsed, _) = Repr::parse_bytes(&req, &mpa::wire::Limits::default()).unwrap();
    assert_eq!((parsed.kind, parsed.rev), (FrameKind::Request, 1));
    let mut p = Pcap::new();
    p.send(0, &req);
    p.send(1, &rep);
    let mut framer = Framer::new(up);
    p.send(0, &fpdus(&mut framer, &[write_ulpdu(9, 0, b"x")]));
    let r = p.dissect();
    assert!(r.errors.is_empty(), "{:#?}", r.errors);
    let c = &r.connections[0];
    assert_eq!(c.request.as_ref().unwrap().revision, 1);
    assert_eq!(c.request.as_ref().unwrap().ird, None);
    assert_eq!(r.opcodes.get("Write"), Some(&1));
}

#[test]
fn garbage_after_the_handshake_never_panics() {
    let mut x: u64 = 0x1234_5678_9abc_def1;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    };
    for round in 0..150u64 {
        let init = LocalSettings {
            crc: if round % 2 == 0 {
                CrcPolicy::Wanted
            } else {
                CrcPolicy::IfPeerAsks
            },
            markers_rx: round % 3 == 0,
            ..LocalSettings::default()
        };
        let resp = LocalSettings {
            markers_rx: round % 5 == 0,
            ..LocalSettings::default()
        };
        let (req, rep, up, _) = handshake(&init, &resp);
        let mut framer = Framer::new(up);
        let mut stream = Vec::new();
        for i in 0..1 + rnd(6) {
            let u = if rnd(2) == 0 {
                send_ulpdu(i as u32 + 1, &vec![7; rnd(1500) as usize])
            } else {
                write_ulpdu(3, 0, &vec![9; rnd(1500) as usize])
            };
            framer.append(&u, &mut stream).unwrap();
        }
        // Corrupt a few octets, or append pure garbage.
        for _ in 0..rnd(4) {
            let i = rnd(stream.len() as u64) as usize;
            stream[i] = rnd(256) as u8;
        }
        if rnd(3) == 0 {
            stream.extend((0..rnd(600)).map(|_| rnd(256) as u8));
        }
        let mut p = Pcap::new();
        p.send(0, &req);
        p.send(1, &rep);
        let mut at = 0;
        while at < stream.len() {
            let n = (1 + rnd(700) as usize).min(stream.len() - at);
            p.send(0, &stream[at..at + n]);
            at += n;
        }
        if rnd(2) == 0 {
            p.fin(0);
        }
        let r = p.dissect();
        let _ = (r.to_text(true), r.to_json(true));
    }
}

#[test]
fn an_atomic_exchange_is_decoded_with_its_operands() {
    use ddp_rdmap::rdmap::{AtomicRequestRepr, AtomicResponseRepr, QN_ATOMIC_RESPONSE};
    let (req, rep, up, down) = handshake(&LocalSettings::default(), &LocalSettings::default());
    let mut p = Pcap::new();
    p.send(0, &req);
    p.send(1, &rep);
    let untagged = |opcode, qn, msn, body: &[u8]| {
        let h = Header {
            opcode,
            last: true,
            buffer: BufferModel::Untagged {
                rsvd_ulp: 0,
                qn,
                msn,
                mo: 0,
            },
        };
        let mut u = h.to_bytes().unwrap()[..h.buffer_len()].to_vec();
        u.extend_from_slice(body);
        u
    };
    let fa = AtomicRequestRepr::fetch_add(1, 0x1234_5600, 0x7f00_0000_1000, 5);
    let cs = AtomicRequestRepr::cmp_swap(2, 0x1234_5600, 0x7f00_0000_1000, 15, 9);
    let requests = [
        untagged(Opcode::AtomicRequest, 1, 1, &fa.to_bytes()),
        untagged(Opcode::AtomicRequest, 1, 2, &cs.to_bytes()),
    ];
    let responses: Vec<Vec<u8>> = [(1, 10), (2, 15)]
        .iter()
        .enumerate()
        .map(|(i, &(request_id, original_value))| {
            let body = AtomicResponseRepr {
                request_id,
                original_value,
            };
            untagged(
                Opcode::AtomicResponse,
                QN_ATOMIC_RESPONSE,
                i as u32 + 1,
                &body.to_bytes(),
            )
        })
        .collect();
    let mut up_framer = Framer::new(up);
    p.send(0, &fpdus(&mut up_framer, &requests));
    let mut down_framer = Framer::new(down);
    p.send(1, &fpdus(&mut down_framer, &responses));
    let r = p.dissect();
    assert!(r.errors.is_empty(), "{:#?}", r.errors);
    assert_eq!(r.opcodes.get("AtomicRequest"), Some(&2));
    assert_eq!(r.opcodes.get("AtomicResponse"), Some(&2));
    let details: Vec<String> = r
        .fpdu_records()
        .map(|(_, f)| format!("{} {}", f.opcode, f.detail.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        details,
        [
            "AtomicRequest FetchAdd id 1 STag 0x12345600 TO 0x7f0000001000 add 0x5 add mask 0x0",
            "AtomicRequest CmpSwap id 2 STag 0x12345600 TO 0x7f0000001000 compare 0xf \
             mask 0xffffffffffffffff swap 0x9 mask 0xffffffffffffffff",
            "AtomicResponse id 1 original value 0xa",
            "AtomicResponse id 2 original value 0xf",
        ]
    );
    let queues: Vec<_> = r.fpdu_records().map(|(_, f)| f.ddp).collect();
    assert!(
        matches!(
            queues[2],
            Some(iwdump::report::DdpInfo::Untagged {
                qn: 3,
                msn: 1,
                mo: 0
            })
        ),
        "{queues:?}"
    );
    assert!(r
        .fpdu_records()
        .all(|(_, f)| f.crc != CrcStatus::Bad && f.last));
}
