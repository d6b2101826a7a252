//! Property tests: emit/parse round trips of every Repr, the deframer against
//! the framer under any chunking, and no panics on arbitrary input.

use mpa::deframer::{CrcStatus, Deframer, DeframerConfig};
use mpa::fpdu::{fpdu_len, mulpdu, Framer, Framing, Marker};
use mpa::negotiate::{self, CrcPolicy, LocalSettings, Response};
use mpa::wire::{
    needed_len, reserved_mask, FrameKind, Limits, Packet, Repr, Rev2Params, RtrKinds, Startup,
    StartupReader, IRD_ORD_MASK, MAX_PRIVATE_DATA_LEN, REPLY_KEY, REQUEST_KEY,
};
use proptest::collection::vec;
use proptest::prelude::*;

fn arb_rtr() -> impl Strategy<Value = RtrKinds> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(send, write, read)| RtrKinds {
        send,
        write,
        read,
    })
}

fn arb_rev2() -> impl Strategy<Value = Rev2Params> {
    (any::<bool>(), arb_rtr(), 0..=IRD_ORD_MASK, 0..=IRD_ORD_MASK).prop_map(
        |(peer_to_peer, rtr, ird, ord)| Rev2Params {
            peer_to_peer,
            rtr,
            ird,
            ord,
        },
    )
}

fn arb_kind() -> impl Strategy<Value = FrameKind> {
    prop_oneof![Just(FrameKind::Request), Just(FrameKind::Reply)]
}

/// Any valid Repr (one `Repr::check` accepts).
fn arb_repr() -> impl Strategy<Value = Repr> {
    (
        arb_kind(),
        any::<[bool; 5]>(),
        1u8..=2,
        arb_rev2(),
        vec(any::<u8>(), 0..=MAX_PRIVATE_DATA_LEN),
        prop_oneof![Just(0u8), any::<u8>()],
    )
        .prop_map(
            |(kind, [markers, crc, reject, enhanced, word], rev, params, mut private_data, res)| {
                let reject = reject && kind == FrameKind::Reply;
                let enhanced = enhanced && rev == 2;
                // A reject Reply may lack the word if it has under 4 octets of private data.
                let rev2 = if enhanced && (word || !reject || private_data.len() >= 4) {
                    Some(params)
                } else {
                    None
                };
                let limit = MAX_PRIVATE_DATA_LEN - if rev2.is_some() { 4 } else { 0 };
                private_data.truncate(limit);
                Repr {
                    kind,
                    markers,
                    crc,
                    reject,
                    enhanced,
                    reserved: res & reserved_mask(rev),
                    rev,
                    rev2,
                    private_data,
                }
            },
        )
}

fn arb_settings() -> impl Strategy<Value = LocalSettings> {
    (
        1u8..=2,
        prop_oneof![
            Just(CrcPolicy::IfPeerAsks),
            Just(CrcPolicy::Wanted),
            Just(CrcPolicy::Required),
            Just(CrcPolicy::Refused)
        ],
        any::<[bool; 4]>(),
        arb_rtr(),
        prop_oneof![0..=16u16, Just(IRD_ORD_MASK)],
        prop_oneof![0..=16u16, Just(IRD_ORD_MASK)],
        vec(any::<u8>(), 0..=64),
    )
        .prop_map(
            |(rev, crc, [markers_rx, markers_tx_ok, p2p, relaxed], rtr, ird, ord, private_data)| {
                let p2p = p2p && rev == 2 && !rtr.is_empty();
                LocalSettings {
                    rev,
                    crc,
                    markers_rx,
                    markers_tx_ok,
                    p2p,
                    rtr,
                    ird,
                    ord,
                    relaxed_ird_ord: relaxed,
                    private_data,
                }
            },
        )
}

/// An owned deframer item: (offset, ULPDU, CRC status, wire length) or the error.
type Item = Result<(u64, Vec<u8>, CrcStatus, usize), mpa::deframer::DeframeError>;

/// Feeds `stream` to `deframer` in chunks of the sizes in `cuts` (cycled);
/// returns the items as owned values.
fn deframe_chunked(deframer: &mut Deframer, stream: &[u8], cuts: &[usize]) -> Vec<Item> {
    let mut items = Vec::new();
    let mut rest = stream;
    let mut i = 0;
    while !rest.is_empty() && !deframer.is_poisoned() {
        let n = cuts[i % cuts.len()].clamp(1, rest.len());
        i += 1;
        let consumed = deframer.feed(&rest[..n], |item| {
            items.push(item.map(|f| (f.offset, f.ulpdu.to_vec(), f.crc, f.wire_len)));
        });
        assert!(consumed <= n);
        if !deframer.is_poisoned() {
            assert_eq!(consumed, n);
        }
        rest = &rest[n..];
    }
    items
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn repr_round_trip(repr in arb_repr()) {
        let bytes = repr.to_bytes().unwrap();
        prop_assert_eq!(bytes.len(), repr.buffer_len());
        let (parsed, len) = Repr::parse_bytes(&bytes, &Limits::default()).unwrap();
        prop_assert_eq!(len, bytes.len());
        prop_assert_eq!(&parsed, &repr);
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(packet.kind(), Some(repr.kind));
        prop_assert_eq!(packet.flags(), repr.flags());
        prop_assert_eq!(packet.rev(), repr.rev);
        prop_assert_eq!(usize::from(packet.private_data_len()), repr.private_data_len());
        prop_assert_eq!(needed_len(&bytes[..20], &Limits::default()).unwrap(), Some(bytes.len()));
        // Any split of the frame through the startup reader, FPDU octets behind it.
        let mut stream = bytes.clone();
        stream.extend_from_slice(&[1, 2, 3]);
        let cut = bytes.len() / 2;
        let mut reader = StartupReader::new(Some(repr.kind), Limits::default());
        let first = reader.push(&stream[..cut]).unwrap();
        let done = if first == Startup::Incomplete { reader.push(&stream[cut..]).unwrap() } else { first };
        prop_assert_eq!(done, Startup::Complete { frame: repr, rest: &[1, 2, 3][..] });
    }

    #[test]
    fn rev2_params_and_marker_round_trip(p in arb_rev2(), m in any::<(u16, u16)>()) {
        prop_assert_eq!(Rev2Params::parse(&p.to_bytes()).unwrap(), p);
        let marker = Marker { reserved: m.0, fpduptr: m.1 };
        prop_assert_eq!(Marker::from_bytes(marker.to_bytes()), marker);
    }

    #[test]
    fn frame_parsers_never_panic(
        key in prop_oneof![Just(REQUEST_KEY.to_vec()), Just(REPLY_KEY.to_vec()), vec(any::<u8>(), 0..16)],
        tail in vec(any::<u8>(), 0..600),
        cut in 0usize..700,
        lenient: bool,
    ) {
        let mut bytes = key;
        bytes.extend_from_slice(&tail);
        let limits = Limits { allow_reserved_bits: lenient, ..Limits::default() };
        let parsed = Repr::parse_bytes(&bytes, &limits);
        let _ = needed_len(&bytes, &limits);
        if let Ok(packet) = Packet::new_checked(&bytes[..]) {
            let _ = (packet.kind(), packet.flags(), packet.rev(), packet.private_data().len(), packet.frame_len());
            let _ = Repr::parse(&packet, &limits);
        }
        let _ = Rev2Params::parse(&bytes);
        if let Ok((repr, len)) = parsed {
            prop_assert!(len <= bytes.len());
            // What parses, strictly or leniently (reserved bits kept in
            // `Repr::reserved`), re-emits to the same octets.
            prop_assert_eq!(&repr.to_bytes().unwrap()[..], &bytes[..len]);
            let _ = negotiate::respond(&LocalSettings::default(), &repr);
            let _ = negotiate::complete(&LocalSettings::default(), &repr);
        }
        let mut reader = StartupReader::new(None, limits);
        let cut = cut.min(bytes.len());
        if let Ok(Startup::Incomplete) = reader.push(&bytes[..cut]) {
            let _ = reader.push(&bytes[cut..]);
        }
    }

    #[test]
    fn negotiation_is_consistent(ini in arb_settings(), rsp in arb_settings()) {
        let request = negotiate::request(&ini).unwrap();
        let request = Repr::parse_bytes(&request.to_bytes().unwrap(), &Limits::default()).unwrap().0;
        match negotiate::respond(&rsp, &request).unwrap() {
            Response::Reject { reply, .. } => {
                prop_assert!(reply.reject);
                let reply = Repr::parse_bytes(&reply.to_bytes().unwrap(), &Limits::default()).unwrap().0;
                let rejected = matches!(
                    negotiate::complete(&ini, &reply),
                    Err(negotiate::InitiatorError::Rejected { .. })
                );
                prop_assert!(rejected);
            }
            Response::Accept { agreed: r, reply } => {
                let reply = Repr::parse_bytes(&reply.to_bytes().unwrap(), &Limits::default()).unwrap().0;
                if let Ok(i) = negotiate::complete(&ini, &reply) {
                    prop_assert_eq!(i.rev, r.rev);
                    prop_assert_eq!(i.crc, r.crc);
                    prop_assert_eq!(i.crc, ini.crc.sets_c() || rsp.crc.sets_c());
                    prop_assert_eq!(i.tx_framing(), r.rx_framing());
                    prop_assert_eq!(r.tx_framing(), i.rx_framing());
                    prop_assert_eq!(i.markers_rx, ini.markers_rx);
                    prop_assert_eq!(r.markers_rx, rsp.markers_rx);
                    prop_assert_eq!(i.rtr, r.rtr);
                    prop_assert_eq!(i.enhanced, r.enhanced);
                    if i.enhanced {
                        prop_assert!(i.ord <= r.ird && r.ord <= i.ird);
                    }
                    if let Some(kind) = i.rtr {
                        prop_assert!(ini.rtr.contains(kind) && rsp.rtr.contains(kind));
                    }
                    prop_assert_eq!(i.p2p(), ini.p2p);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The deframer yields exactly what the framer framed, for every chunking,
    /// with and without CRC and Markers, from any 4-aligned start position.
    #[test]
    fn deframer_undoes_framer_for_any_chunking(
        ulpdus in vec(vec(any::<u8>(), 1..1300), 1..8),
        crc: bool,
        markers: bool,
        start in 0u64..300,
        base in 0u64..(1 << 33),
        cuts in vec(1usize..600, 1..32),
        parts_split in 0usize..40,
    ) {
        let framing = Framing { crc, markers };
        let start = start * 4;
        let mut framer = Framer::with_stream_pos(framing, start);
        let mut stream = Vec::new();
        let mut expected = Vec::new();
        for u in &ulpdus {
            let offset = framer.stream_pos();
            let len = if u.len() % 2 == 0 {
                framer.append(u, &mut stream).unwrap()
            } else {
                // Gathered from parts, written into a caller buffer.
                let split = parts_split.min(u.len());
                let mut buf = vec![0u8; framer.next_fpdu_len(u.len()) + 5];
                let n = framer.write_parts(&[&u[..split], &u[split..]], &mut buf).unwrap();
                stream.extend_from_slice(&buf[..n]);
                n
            };
            prop_assert_eq!(len, fpdu_len(u.len(), markers, offset));
            expected.push((base + offset, u.clone(), len));
        }
        let mut cfg = DeframerConfig::new(framing);
        cfg.stream_pos = start;
        cfg.offset_base = base;
        let mut deframer = Deframer::new(cfg);
        let items = deframe_chunked(&mut deframer, &stream, &cuts);
        prop_assert_eq!(items.len(), expected.len());
        for (item, (offset, ulpdu, len)) in items.into_iter().zip(expected) {
            let (o, u, status, wire_len) = item.unwrap();
            prop_assert_eq!(o, offset);
            prop_assert_eq!(u, ulpdu);
            prop_assert_eq!(wire_len, len);
            let status_ok = if crc { matches!(status, CrcStatus::Good(_)) } else { status == CrcStatus::Off };
            prop_assert!(status_ok);
        }
        prop_assert!(deframer.is_idle());
        prop_assert_eq!(deframer.stream_offset(), base + start + stream.len() as u64);
    }

    /// A corrupted stream never makes the deframer panic; a single flipped
    /// octet with CRC on never goes unnoticed.
    #[test]
    fn deframer_never_panics(
        ulpdus in vec(vec(any::<u8>(), 1..700), 1..5),
        markers: bool,
        crc: bool,
        flip in any::<(usize, u8)>(),
        garbage in vec(any::<u8>(), 0..1200),
        cuts in vec(1usize..300, 1..16),
        max in 1u16..=u16::MAX,
        deliver_bad_crc: bool,
    ) {
        let framing = Framing { crc, markers };
        let mut framer = Framer::new(framing);
        let mut stream = Vec::new();
        for u in &ulpdus {
            framer.append(u, &mut stream).unwrap();
        }
        let clean = stream.clone();
        let at = flip.0 % stream.len();
        let mask = flip.1 | 1;
        stream[at] ^= mask;
        let mut cfg = DeframerConfig::new(framing);
        cfg.max_ulpdu_len = max;
        cfg.deliver_bad_crc = deliver_bad_crc;
        let mut deframer = Deframer::new(cfg);
        let items = deframe_chunked(&mut deframer, &stream, &cuts);
        if crc && max as usize >= ulpdus.iter().map(Vec::len).max().unwrap() {
            // Something must be reported: a bad CRC, length or Marker, or a
            // different FPDU count (a damaged length can swallow the tail).
            let all_good = items.len() == ulpdus.len()
                && items.iter().all(|i| matches!(i, Ok((_, _, CrcStatus::Good(_), _))));
            prop_assert!(!all_good, "flip at {} of {} undetected", at, clean.len());
        }
        // Pure garbage, in both configurations.
        let mut deframer = Deframer::new(cfg);
        let _ = deframe_chunked(&mut deframer, &garbage, &cuts);
        let mut garbage_stream = clean;
        garbage_stream.extend_from_slice(&garbage);
        let mut deframer = Deframer::new(cfg);
        let _ = deframe_chunked(&mut deframer, &garbage_stream, &cuts);
    }

    /// MULPDU-sized FPDUs always fit the EMSS (RFC 5044, section 4.5).
    #[test]
    fn mulpdu_fits(emss in 64usize..9000, pos in 0u64..128, markers: bool) {
        let m = mulpdu(emss, markers);
        prop_assert!(fpdu_len(m, markers, pos * 4) <= emss);
    }
}
