//! Property tests: emit/parse round trips for every Repr, segmentation coverage,
//! and no panics on arbitrary bytes. Case counts are modest (shared 2-core box).

use ddp_rdmap::ddp::{self, BufferModel};
use ddp_rdmap::rdmap::{
    AtomicOpcode, AtomicRequestRepr, AtomicResponseRepr, ImmediateDataRepr, ReadRequestPacket,
    ReadRequestRepr,
};
use ddp_rdmap::reassembly::Receiver;
use ddp_rdmap::segment::{Message, Target};
use ddp_rdmap::terminate::{self, DdpHeaderCopy, ErrorCause, Offending, TerminatedDdp};
use ddp_rdmap::{Body, Header, Opcode, Ulpdu};
use proptest::prelude::*;

fn opcode() -> impl Strategy<Value = Opcode> {
    (0u8..12).prop_map(|v| Opcode::from_u8(v).unwrap())
}

fn header_for(op: Opcode) -> impl Strategy<Value = Header> {
    let single = op.is_single_segment();
    (
        any::<bool>(),
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(move |(last, stag, to, rsvd, qn, msn, mo)| Header {
            opcode: op,
            last: last || single,
            buffer: if op.is_tagged() {
                BufferModel::Tagged { stag, to }
            } else {
                BufferModel::Untagged {
                    rsvd_ulp: rsvd,
                    qn,
                    msn,
                    mo: if single { 0 } else { mo },
                }
            },
        })
}

fn header() -> impl Strategy<Value = Header> {
    opcode().prop_flat_map(header_for)
}

fn read_request() -> impl Strategy<Value = ReadRequestRepr> {
    (
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(
            |(sink_stag, sink_to, size, src_stag, src_to)| ReadRequestRepr {
                sink_stag,
                sink_to,
                size,
                src_stag,
                src_to,
            },
        )
}

fn atomic_request() -> impl Strategy<Value = AtomicRequestRepr> {
    (
        prop_oneof![
            Just(AtomicOpcode::FetchAdd),
            Just(AtomicOpcode::Swap),
            Just(AtomicOpcode::CmpSwap)
        ],
        any::<(u32, u32, u64)>(),
        any::<(u64, u64, u64, u64)>(),
    )
        .prop_map(
            |(opcode, (request_id, remote_stag, remote_to), (a, b, c, d))| AtomicRequestRepr {
                opcode,
                request_id,
                remote_stag,
                remote_to,
                add_or_swap_data: a,
                add_or_swap_mask: b,
                compare_data: c,
                compare_mask: d,
            },
        )
}

fn cause() -> impl Strategy<Value = ErrorCause> {
    (0u8..16, 0u8..16, any::<u8>()).prop_map(|(l, e, c)| ErrorCause::from_raw(l, e, c))
}

fn ddp_copy() -> impl Strategy<Value = DdpHeaderCopy> {
    prop_oneof![
        any::<[u8; 14]>().prop_map(|mut b| {
            b[0] |= ddp::FLAG_T;
            DdpHeaderCopy::Tagged(b)
        }),
        any::<[u8; 18]>().prop_map(|mut b| {
            b[0] &= !ddp::FLAG_T;
            DdpHeaderCopy::Untagged(b)
        }),
    ]
}

fn terminate_repr() -> impl Strategy<Value = terminate::Repr> {
    (
        cause(),
        proptest::option::of((proptest::option::of(any::<u16>()), ddp_copy())),
        proptest::option::of(any::<[u8; 28]>()),
    )
        .prop_map(|(cause, ddp, rdma_header)| terminate::Repr {
            cause,
            ddp: ddp.map(|(segment_length, header)| TerminatedDdp {
                segment_length,
                header,
            }),
            rdma_header,
        })
}

fn body_for(op: Opcode) -> BoxedStrategy<Body> {
    match op {
        Opcode::ReadRequest => read_request().prop_map(Body::ReadRequest).boxed(),
        Opcode::Terminate => terminate_repr().prop_map(Body::Terminate).boxed(),
        Opcode::ImmediateData | Opcode::ImmediateDataSE => any::<[u8; 8]>()
            .prop_map(|data| Body::ImmediateData(ImmediateDataRepr { data }))
            .boxed(),
        Opcode::AtomicRequest => atomic_request().prop_map(Body::AtomicRequest).boxed(),
        Opcode::AtomicResponse => any::<(u32, u64)>()
            .prop_map(|(request_id, original_value)| {
                Body::AtomicResponse(AtomicResponseRepr {
                    request_id,
                    original_value,
                })
            })
            .boxed(),
        _ => Just(Body::None).boxed(),
    }
}

/// A valid ULPDU as (header, body, payload).
fn ulpdu_parts() -> impl Strategy<Value = (Header, Body, Vec<u8>)> {
    opcode().prop_flat_map(|op| {
        let payload = if op.body_len().is_some() || op == Opcode::Terminate {
            Just(Vec::new()).boxed()
        } else {
            proptest::collection::vec(any::<u8>(), 0..64).boxed()
        };
        (header_for(op), body_for(op), payload)
    })
}

/// Valid captured headers/ULPDUs to mutate: real bytes reach deeper than noise.
const SEEDS: [&[u8]; 4] = [
    &[0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
    &[
        0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0x52, 0xa5, 0x3c, 0, 0, 0,
        0x55, 0x83, 0xa4, 0xe0, 0x0f, 0x30, 0, 0, 0, 0x40, 0x79, 0xba, 0xa4, 0, 0, 0, 0x55, 0xd4,
        0x19, 0x28, 0xdd, 0x50,
    ],
    &[
        0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0x12, 0x03, 0xc0, 0x00, 0x00,
        0x22, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
    ],
    &[
        0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 2, 3,
    ],
];

/// Runs every parser on `bytes`; only panics matter.
fn parse_everything(bytes: &[u8]) {
    if let Ok(u) = Ulpdu::parse(bytes) {
        // A successful parse re-emits to bytes that parse to the same thing.
        let mut out = vec![0; u.buffer_len()];
        u.emit(&mut out).unwrap();
        let again = Ulpdu::parse(&out).unwrap();
        assert_eq!(again.header, u.header);
        assert_eq!(again.body, u.body);
        assert_eq!(again.payload, u.payload);
        let mut r = Receiver::new(true);
        let _ = r.post_buffer(0, 64);
        let _ = r.handle_ulpdu(&u);
    }
    if let Err(e) = Ulpdu::parse(bytes) {
        let _ = e.terminate_cause();
        let _ = e.to_string();
    }
    let _ = Header::parse(bytes);
    if let Ok(p) = ddp::Packet::new_checked(bytes) {
        let _ = ddp::Repr::parse(&p);
        let _ = (
            p.stag(),
            p.tagged_offset(),
            p.qn(),
            p.msn(),
            p.mo(),
            p.payload(),
        );
    }
    let p = ddp::Packet::new_unchecked(bytes);
    let _ = (
        p.stag(),
        p.tagged_offset(),
        p.rsvd_ulp_word(),
        p.qn(),
        p.msn(),
        p.mo(),
        p.payload(),
    );
    let _ = terminate::Control::parse(bytes);
    let _ = terminate::Repr::parse_bytes(bytes);
    let tp = terminate::Packet::new_unchecked(bytes);
    let _ = (
        tp.ddp_segment_length(),
        tp.terminated_ddp_header(),
        tp.terminated_rdma_header(),
        tp.header_len(),
        tp.reserved(),
    );
    let _ = ReadRequestPacket::new_checked(bytes).map(|p| ReadRequestRepr::parse(&p));
    let _ = ReadRequestRepr::parse(&ReadRequestPacket::new_unchecked(bytes));
    let _ = AtomicRequestRepr::parse(bytes);
    let _ = AtomicResponseRepr::parse(bytes);
    let _ = ImmediateDataRepr::parse(bytes);
    for l in 0..16u8 {
        let c = ErrorCause::from_raw(l & 3, l >> 2, bytes.first().copied().unwrap_or(0));
        let len = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
        let t = terminate::Repr::for_error(
            c,
            Some(Offending {
                ulpdu_len: len,
                bytes,
            }),
        );
        let mut out = vec![0; t.buffer_len()];
        t.emit(&mut out).unwrap();
        assert_eq!(terminate::Repr::parse_bytes(&out), Ok(t));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn header_round_trip(h in header()) {
        let mut b = [0u8; 18];
        h.emit(&mut b).unwrap();
        prop_assert_eq!(Header::parse(&b[..h.buffer_len()]), Ok(h));
        let p = ddp::Packet::new_checked(&b[..h.buffer_len()]).unwrap();
        let d = ddp::Repr::parse(&p).unwrap();
        prop_assert_eq!(d.buffer, h.buffer);
        prop_assert_eq!(d.rsvd_ulp, h.opcode.control_byte());
        let mut b2 = [0u8; 18];
        d.emit(&mut b2).unwrap();
        prop_assert_eq!(b, b2);
    }

    #[test]
    fn read_request_round_trip(r in read_request()) {
        let b = r.to_bytes();
        prop_assert_eq!(ReadRequestRepr::parse(&ReadRequestPacket::new_checked(&b[..]).unwrap()), Ok(r));
    }

    #[test]
    fn atomic_round_trip(r in atomic_request(), id in any::<u32>(), v in any::<u64>()) {
        let mut b = [0u8; 52];
        r.emit(&mut b).unwrap();
        prop_assert_eq!(AtomicRequestRepr::parse(&b), Ok(r));
        let resp = AtomicResponseRepr { request_id: id, original_value: v };
        let mut b = [0u8; 12];
        resp.emit(&mut b).unwrap();
        prop_assert_eq!(AtomicResponseRepr::parse(&b), Ok(resp));
    }

    #[test]
    fn terminate_round_trip(t in terminate_repr()) {
        let mut b = vec![0u8; t.buffer_len()];
        t.emit(&mut b).unwrap();
        prop_assert_eq!(terminate::Repr::parse_bytes(&b), Ok(t));
        let c = terminate::Control::parse(&b).unwrap();
        prop_assert_eq!(c, t.control());
        prop_assert_eq!(c.cause, t.cause);
    }

    #[test]
    fn ulpdu_round_trip((h, body, payload) in ulpdu_parts()) {
        let u = Ulpdu { header: h, body, payload: &payload, len: 0 };
        let mut b = vec![0u8; u.buffer_len()];
        u.emit(&mut b).unwrap();
        let p = Ulpdu::parse(&b).unwrap();
        prop_assert_eq!(p.header, h);
        prop_assert_eq!(p.body, body);
        prop_assert_eq!(p.payload, &payload[..]);
        prop_assert_eq!(p.len, b.len());
        prop_assert_eq!(p.payload_range(), b.len() - payload.len()..b.len());
    }

    #[test]
    fn segmentation_covers_message(
        op in prop_oneof![Just(Opcode::Write), Just(Opcode::ReadResponse), Just(Opcode::Send), Just(Opcode::SendSEInvalidate)],
        len in prop_oneof![0u32..4000, 0u32..300_000],
        mulpdu in 19usize..9000,
        to in any::<u64>().prop_map(|t| t >> 1),
        msn in any::<u32>(),
    ) {
        let target = if op.is_tagged() {
            Target::Tagged { stag: 7, to }
        } else {
            Target::Untagged { msn, inv_stag: 9 }
        };
        let m = Message { opcode: op, len, target };
        let room = mulpdu - m.header_len();
        let segs: Vec<_> = m.segments(mulpdu).unwrap().collect();
        prop_assert_eq!(segs.len(), if len == 0 { 1 } else { (len as usize).div_ceil(room) });
        let mut next = 0u32;
        for (i, s) in segs.iter().enumerate() {
            prop_assert_eq!(s.offset, next, "gap or overlap at segment {}", i);
            prop_assert!(s.len as usize <= room);
            prop_assert!(s.ulpdu_len() <= mulpdu);
            prop_assert_eq!(s.header.last, i + 1 == segs.len());
            if i + 1 < segs.len() {
                prop_assert_eq!(s.len as usize, room);
            }
            match s.header.buffer {
                BufferModel::Tagged { stag, to: t } => {
                    prop_assert_eq!(stag, 7);
                    prop_assert_eq!(t, to + u64::from(s.offset));
                }
                BufferModel::Untagged { qn, msn: n, mo, rsvd_ulp } => {
                    prop_assert_eq!((qn, n, mo), (0, msn, s.offset));
                    prop_assert_eq!(rsvd_ulp, if op == Opcode::SendSEInvalidate { 9 } else { 0 });
                }
            }
            next += s.len;
        }
        prop_assert_eq!(next, len);
        prop_assert_eq!(segs.iter().filter(|s| s.header.last).count(), 1);
    }

    #[test]
    fn segments_feed_receiver(len in 0u32..20_000, mulpdu in 19usize..3000) {
        // What a sender cuts, a receiver with a big enough buffer accepts in order.
        let m = Message { opcode: Opcode::Send, len, target: Target::Untagged { msn: 1, inv_stag: 0 } };
        let mut r = Receiver::new(false);
        r.post_buffer(0, len).unwrap();
        for s in m.segments(mulpdu).unwrap() {
            r.handle(&s.header, s.len).unwrap();
        }
        prop_assert_eq!(r.queue(0).unwrap().next_msn(), 2);
        prop_assert_eq!(r.queue(0).unwrap().posted(), 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
        parse_everything(&bytes);
    }

    #[test]
    fn mutated_captures_never_panic(
        seed in 0usize..SEEDS.len(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in any::<usize>(),
        extra in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        let mut b = SEEDS[seed].to_vec();
        for (at, v) in flips {
            let n = b.len();
            b[at % n] ^= v;
        }
        b.truncate(cut % (b.len() + 1));
        if cut % 3 == 0 {
            b.extend_from_slice(&extra);
        }
        parse_everything(&b);
    }
}
