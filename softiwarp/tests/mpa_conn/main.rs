//! Deterministic pair tests of `softiwarp::transport::mpa_conn`: two `MpaConn`s wired
//! back to back (no sockets, no clock), bytes moved from one's
//! `poll_transmit` into the other's `handle_rx` with configurable chunking,
//! plus replays of the Linux siw captures in `shared/pcaps`.

#[path = "../support/mod.rs"]
mod support;

use ddp_rdmap::ddp::BufferModel;
use ddp_rdmap::terminate::{self, ErrorCause, LlpCode};
use ddp_rdmap::{ulpdu, Body, Header, Opcode, Ulpdu};
use mpa::deframer::{CrcStatus, Deframer, DeframerConfig};
use mpa::fpdu::{self, Framer, Framing};
use mpa::negotiate::{
    self, CrcPolicy, InitiatorError, LocalSettings, NegotiationError, Response, SettingsError,
};
use mpa::wire::{FrameKind, RtrKind, RtrKinds, WireError};
use mpa::LlpErrorCode;
use softiwarp::transport::mpa_conn::{
    CallError, InitialMsn, LlpClose, MpaConfig, MpaConn, MpaError, MpaEvent, Role, RtrError, State,
    DEFAULT_STARTUP_TIMEOUT_US,
};
use support::{Rng, RngExt};

// ---------------------------------------------------------------------------
// Helpers: hex, a seeded RNG, the back-to-back pair.

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// How bytes are cut when moved between the two endpoints (both the
/// driver's partial writes and the reads).
#[derive(Debug, Clone, Copy)]
enum Chunks {
    Whole,
    Fixed(usize),
    Random(usize),
}

impl Chunks {
    fn take(self, rng: &mut Rng, available: usize) -> usize {
        match self {
            Chunks::Whole => available,
            Chunks::Fixed(k) => k.min(available),
            Chunks::Random(k) => rng.range(1, k).min(available),
        }
    }
}

struct Side {
    conn: MpaConn,
    events: Vec<MpaEvent>,
    /// Octets sent by the peer, not yet consumed ("TCP receive buffer").
    inbox: Vec<u8>,
    /// Everything this side wrote to the wire.
    wire: Vec<u8>,
}

impl Side {
    fn new(conn: MpaConn) -> Side {
        Side {
            conn,
            events: Vec::new(),
            inbox: Vec::new(),
            wire: Vec::new(),
        }
    }

    fn ulpdus(&self) -> Vec<Vec<u8>> {
        self.events
            .iter()
            .filter_map(|e| match e {
                MpaEvent::Ulpdu(u) => Some(u.clone()),
                _ => None,
            })
            .collect()
    }

    fn errors(&self) -> Vec<MpaError> {
        self.events
            .iter()
            .filter_map(|e| match e {
                MpaEvent::Error(err) => Some(err.clone()),
                _ => None,
            })
            .collect()
    }

    fn established(&self) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e, MpaEvent::Established { .. }))
    }
}

fn transmit(from: &mut Side, to: &mut Side, chunks: Chunks, rng: &mut Rng) -> bool {
    let mut progress = false;
    while let Some(bytes) = from.conn.poll_transmit() {
        let n = chunks.take(rng, bytes.len());
        to.inbox.extend_from_slice(&bytes[..n]);
        from.wire.extend_from_slice(&bytes[..n]);
        from.conn.transmit_done(n).unwrap();
        progress = true;
    }
    progress
}

fn deliver(side: &mut Side, now: u64, chunks: Chunks, rng: &mut Rng) -> bool {
    let mut off = 0;
    while off < side.inbox.len() {
        let n = chunks.take(rng, side.inbox.len() - off);
        let used = side.conn.handle_rx(&side.inbox[off..off + n], now);
        assert!(used <= n);
        off += used;
        if used < n {
            break;
        }
    }
    side.inbox.drain(..off);
    off > 0
}

fn collect(side: &mut Side) -> bool {
    let mut progress = false;
    while let Some(e) = side.conn.poll_event() {
        side.events.push(e);
        progress = true;
    }
    progress
}

struct Pair {
    ini: Side,
    rsp: Side,
    now: u64,
    chunks: Chunks,
    rng: Rng,
    /// Accept every ConnectRequest with (private data, IRD, ORD).
    auto_accept: Option<(Vec<u8>, u16, u16)>,
}

impl Pair {
    fn new(ini: MpaConfig, rsp: MpaConfig, chunks: Chunks) -> Pair {
        let accept = (
            rsp.settings.private_data.clone(),
            rsp.settings.ird,
            rsp.settings.ord,
        );
        Pair {
            ini: Side::new(MpaConn::initiator(ini, 0).unwrap()),
            rsp: Side::new(MpaConn::responder(rsp, 0).unwrap()),
            now: 0,
            chunks,
            rng: Rng::new(0x5eed),
            auto_accept: Some(accept),
        }
    }

    fn with_settings(ini: LocalSettings, rsp: LocalSettings, chunks: Chunks) -> Pair {
        Pair::new(cfg(ini), cfg(rsp), chunks)
    }

    /// Runs until nothing moves.
    fn run(&mut self) {
        loop {
            self.now += 1;
            let mut p = transmit(&mut self.ini, &mut self.rsp, self.chunks, &mut self.rng);
            p |= transmit(&mut self.rsp, &mut self.ini, self.chunks, &mut self.rng);
            p |= deliver(&mut self.rsp, self.now, self.chunks, &mut self.rng);
            p |= deliver(&mut self.ini, self.now, self.chunks, &mut self.rng);
            let before = self.rsp.events.len();
            p |= collect(&mut self.ini);
            p |= collect(&mut self.rsp);
            if let Some((pd, ird, ord)) = self.auto_accept.clone() {
                let requests = self.rsp.events[before..]
                    .iter()
                    .filter(|e| matches!(e, MpaEvent::ConnectRequest { .. }))
                    .count();
                for _ in 0..requests {
                    self.rsp.conn.accept(&pd, ird, ord).unwrap();
                    p = true;
                }
            }
            if !p {
                break;
            }
        }
    }
}

fn cfg(settings: LocalSettings) -> MpaConfig {
    MpaConfig {
        settings,
        ..MpaConfig::default()
    }
}

fn s(f: impl FnOnce(&mut LocalSettings)) -> LocalSettings {
    let mut x = LocalSettings::default();
    f(&mut x);
    x
}

fn p2p(kind: RtrKind) -> LocalSettings {
    s(|x| {
        x.p2p = true;
        x.rtr = RtrKinds::only(Some(kind));
    })
}

/// Deframes a captured direction (behind its 24-octet frame) with `framing`.
fn deframe(stream: &[u8], framing: Framing) -> Vec<(Vec<u8>, CrcStatus)> {
    let mut d = Deframer::new(DeframerConfig::new(framing));
    let mut out = Vec::new();
    d.feed(stream, |item| {
        let f = item.unwrap();
        out.push((f.ulpdu.to_vec(), f.crc));
    });
    assert!(d.is_idle());
    out
}

const NO_CRC: Framing = Framing {
    crc: false,
    markers: false,
};

// ---------------------------------------------------------------------------
// Golden bytes.

/// rping.pcap frame 6: siw's default MPA Request.
const RPING_REQUEST: &str = "4d504120494420526571204672616d651002000400010001";
/// rping.pcap frame 8: siw's default MPA Reply.
const RPING_REPLY: &str = "4d504120494420526570204672616d651002000400010001";
/// rping-srv_p2p-cli_p2p.pcap frame 10: the Write RTR FPDU (no CRC): ULPDU
/// length 14, tagged Write, STag 1, TO 0, no pad ((2 + 14) % 4 == 0), CRC
/// field 0.
const P2P_WRITE_RTR_FPDU: &str = "000e c140 00000001 0000000000000000 00000000";

#[test]
fn golden_default_request_equals_rping_capture() {
    let mut ini = MpaConn::initiator(MpaConfig::default(), 0).unwrap();
    assert_eq!(ini.poll_transmit().unwrap(), &unhex(RPING_REQUEST)[..]);
    // The p2p and CRC captures' Requests too.
    for (settings, stream) in [
        (p2p(RtrKind::Write), P2P_INITIATOR_STREAM),
        (
            s(|x| {
                x.p2p = true;
                x.rtr = RtrKinds {
                    send: false,
                    write: true,
                    read: true,
                }
            }),
            P2P_INITIATOR_STREAM,
        ),
        (s(|x| x.crc = CrcPolicy::Wanted), CRC_INITIATOR_STREAM),
    ] {
        let mut ini = MpaConn::initiator(cfg(settings.clone()), 0).unwrap();
        let req = ini.poll_transmit().unwrap().to_vec();
        let captured = unhex(stream);
        if settings.rtr.read {
            // siw offered Write and Read RTRs: 8001 c001.
            assert_eq!(req, captured[..24]);
        } else {
            assert_eq!(req[..22], captured[..22]);
            assert_eq!(req[22..24], [0x80, 0x01]);
        }
    }
}

// ---------------------------------------------------------------------------
// Interop: replays of siw's byte streams.

/// Our initiator, fed siw's responder stream of rping-srv_crc-cli_crc.pcap
/// (the Reply and twelve FPDUs with CRC, first FPDU right behind the Reply),
/// in one chunk and in many chunkings.
#[test]
fn initiator_takes_siw_reply_with_fpdus_behind_it() {
    let stream = unhex(CRC_RESPONDER_STREAM);
    let expected: Vec<Vec<u8>> = deframe(&stream[24..], NO_CRC)
        .into_iter()
        .map(|(u, _)| u)
        .collect();
    assert_eq!(expected.len(), 12);
    for chunk in [stream.len(), 1, 2, 3, 7, 24, 25, 100] {
        let mut ini = MpaConn::initiator(cfg(s(|x| x.crc = CrcPolicy::Wanted)), 0).unwrap();
        assert_eq!(
            ini.poll_transmit().unwrap(),
            &unhex(CRC_INITIATOR_STREAM)[..24]
        );
        for piece in stream.chunks(chunk) {
            assert_eq!(ini.handle_rx(piece, 1), piece.len());
        }
        let events: Vec<_> = std::iter::from_fn(|| ini.poll_event()).collect();
        let MpaEvent::Established { agreed } = &events[0] else {
            panic!("{events:?}")
        };
        assert!(agreed.crc && !agreed.p2p());
        let got: Vec<_> = events[1..]
            .iter()
            .map(|e| match e {
                MpaEvent::Ulpdu(u) => u.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(got, expected, "chunk {chunk}");
        assert_eq!(ini.state(), State::FullOperation);
    }
}

/// Our responder, fed siw's initiator stream of the CRC capture in one chunk:
/// the octets behind the Request wait for accept(); our Reply equals siw's.
#[test]
fn responder_takes_siw_request_and_fpdus() {
    let stream = unhex(CRC_INITIATOR_STREAM);
    let mut rsp = MpaConn::responder(MpaConfig::default(), 0).unwrap();
    assert_eq!(rsp.handle_rx(&stream, 1), 24);
    let Some(MpaEvent::ConnectRequest { request }) = rsp.poll_event() else {
        panic!()
    };
    assert!(request.crc);
    assert_eq!(rsp.state(), State::AwaitingDecision);
    assert_eq!(rsp.handle_rx(&stream[24..], 2), 0, "not before accept");
    rsp.accept(b"", 1, 1).unwrap();
    let reply = rsp.poll_transmit().unwrap().to_vec();
    assert_eq!(reply, unhex(CRC_RESPONDER_STREAM)[..24]);
    assert_eq!(rsp.handle_rx(&stream[24..], 3), stream.len() - 24);
    let events: Vec<_> = std::iter::from_fn(|| rsp.poll_event()).collect();
    assert!(matches!(&events[0], MpaEvent::Established { agreed } if agreed.crc));
    assert_eq!(events.len(), 1 + 9);
    assert_eq!(rsp.state(), State::FullOperation);
}

/// Both directions of the siw peer-to-peer capture: our responder consumes
/// siw's Write RTR; our initiator sends exactly siw's RTR bytes.
#[test]
fn p2p_capture_replayed_both_ways() {
    // Responder side.
    let stream = unhex(P2P_INITIATOR_STREAM);
    let mut rsp = MpaConn::responder(MpaConfig::default(), 0).unwrap();
    for chunk in [stream.len(), 1, 5] {
        rsp = MpaConn::responder(MpaConfig::default(), 0).unwrap();
        let mut off = 0;
        let mut accepted = false;
        while off < stream.len() {
            let end = (off + chunk).min(stream.len());
            off += rsp.handle_rx(&stream[off..end], 1);
            if !accepted && rsp.state() == State::AwaitingDecision {
                rsp.accept(b"", 1, 1).unwrap();
                accepted = true;
            }
        }
        let events: Vec<_> = std::iter::from_fn(|| rsp.poll_event()).collect();
        assert!(matches!(events[0], MpaEvent::ConnectRequest { .. }));
        let MpaEvent::Established { agreed } = &events[1] else {
            panic!()
        };
        assert_eq!(agreed.rtr, Some(RtrKind::Write));
        // 10 FPDUs, the RTR consumed: 9 ULPDUs, none of them the RTR.
        let ulpdus: Vec<_> = events[2..]
            .iter()
            .map(|e| match e {
                MpaEvent::Ulpdu(u) => u.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ulpdus.len(), 9);
        assert!(ulpdus.iter().all(|u| u[1] != 0x40), "no Write delivered");
    }
    assert_eq!(
        rsp.poll_transmit().unwrap(),
        &unhex(P2P_RESPONDER_STREAM)[..24],
        "our Reply = siw's Reply (Write RTR chosen)"
    );

    // Initiator side: siw offered Write and Read.
    let settings = s(|x| x.p2p = true);
    let mut ini = MpaConn::initiator(cfg(settings), 0).unwrap();
    let request = ini.poll_transmit().unwrap().to_vec();
    ini.transmit_done(request.len()).unwrap();
    assert_eq!(request, unhex(P2P_INITIATOR_STREAM)[..24]);
    let stream = unhex(P2P_RESPONDER_STREAM);
    assert_eq!(ini.handle_rx(&stream, 1), stream.len());
    assert_eq!(ini.poll_transmit().unwrap(), &unhex(P2P_WRITE_RTR_FPDU)[..]);
    assert_eq!(
        ini.poll_transmit().unwrap(),
        &unhex(P2P_INITIATOR_STREAM)[24..44]
    );
    let events: Vec<_> = std::iter::from_fn(|| ini.poll_event()).collect();
    assert!(
        matches!(&events[0], MpaEvent::Established { agreed } if agreed.rtr == Some(RtrKind::Write))
    );
    assert_eq!(events.len(), 1 + 12);
}

// ---------------------------------------------------------------------------
// Negotiation, end to end.

const POLICIES: [CrcPolicy; 4] = [
    CrcPolicy::IfPeerAsks,
    CrcPolicy::Wanted,
    CrcPolicy::Required,
    CrcPolicy::Refused,
];

/// What the pure negotiation functions say should happen.
enum Expect {
    Established,
    /// The responder refuses: it reports the reason, the initiator gets a reject.
    ResponderRejects(NegotiationError),
    /// The initiator cannot use the Reply.
    InitiatorFails(NegotiationError),
}

fn oracle(ini: &LocalSettings, rsp: &LocalSettings) -> Expect {
    let req = negotiate::request(ini).unwrap();
    match negotiate::respond(rsp, &req).unwrap() {
        Response::Reject { reason, .. } => Expect::ResponderRejects(reason),
        Response::Accept { reply, .. } => match negotiate::complete(ini, &reply) {
            Ok(_) => Expect::Established,
            Err(InitiatorError::Protocol(reason)) => Expect::InitiatorFails(reason),
            Err(e) => panic!("{e}"),
        },
    }
}

/// Runs one combination end to end and checks it against the oracle; if
/// established, exchanges ULPDUs both ways (the responder's sent right after
/// accept, so held) and checks that exactly those arrive (no RTR surfaces).
fn check_combination(ini: LocalSettings, rsp: LocalSettings, chunks: Chunks) {
    let name = format!("{ini:?} / {rsp:?} / {chunks:?}");
    let expect = oracle(&ini, &rsp);
    let mut pair = Pair::with_settings(ini.clone(), rsp.clone(), chunks);
    pair.auto_accept = None;
    pair.run();
    let mut rng = Rng::new(7);
    let from_ini: Vec<Vec<u8>> = (1..4).map(|i| rng.bytes(i * 37)).collect();
    let from_rsp: Vec<Vec<u8>> = (1..4).map(|i| rng.bytes(i * 41 + 1)).collect();
    if matches!(pair.rsp.conn.state(), State::AwaitingDecision) {
        pair.rsp
            .conn
            .accept(&rsp.private_data, rsp.ird, rsp.ord)
            .unwrap();
        collect(&mut pair.rsp);
        if pair.rsp.conn.state() == State::AwaitingFirstFpdu {
            for u in &from_rsp {
                pair.rsp.conn.send_ulpdu(&[u]).unwrap();
            }
            assert_eq!(pair.rsp.conn.held_ulpdus(), 3, "{name}");
        }
    }
    pair.run();
    match expect {
        Expect::Established => {
            let (Some(ai), Some(ar)) = (pair.ini.conn.agreed(), pair.rsp.conn.agreed()) else {
                panic!(
                    "{name}: not established: {:?} {:?}",
                    pair.ini.events, pair.rsp.events
                )
            };
            assert_eq!(ai.tx_framing(), ar.rx_framing(), "{name}");
            assert_eq!(ar.tx_framing(), ai.rx_framing(), "{name}");
            assert_eq!(ai.rtr, ar.rtr, "{name}");
            assert!(pair.ini.established() && pair.rsp.established(), "{name}");
            for u in &from_ini {
                pair.ini.conn.send_ulpdu(&[u]).unwrap();
            }
            pair.run();
            assert_eq!(pair.rsp.ulpdus(), from_ini, "{name}");
            assert_eq!(pair.ini.ulpdus(), from_rsp, "{name}");
            assert_eq!(pair.ini.conn.state(), State::FullOperation, "{name}");
            assert_eq!(pair.rsp.conn.state(), State::FullOperation, "{name}");
            assert!(!pair.ini.conn.read_rtr_outstanding(), "{name}");
            assert!(pair.ini.errors().is_empty() && pair.rsp.errors().is_empty());
        }
        Expect::ResponderRejects(reason) => {
            assert_eq!(
                pair.rsp.errors(),
                vec![MpaError::Negotiation(reason)],
                "{name}"
            );
            assert_eq!(
                pair.rsp.errors()[0].llp_error_code(),
                Some(reason.llp_error_code())
            );
            assert_eq!(
                pair.rsp.conn.llp_close(),
                Some(LlpClose::Graceful),
                "{name}"
            );
            assert_eq!(
                pair.ini.events,
                vec![MpaEvent::Rejected {
                    private_data: vec![]
                }],
                "{name}"
            );
            assert_eq!(pair.ini.conn.state(), State::Closing);
            assert_eq!(pair.ini.conn.llp_close(), Some(LlpClose::Graceful));
        }
        Expect::InitiatorFails(reason) => {
            assert_eq!(
                pair.ini.errors(),
                vec![MpaError::Negotiation(reason)],
                "{name}"
            );
            assert_eq!(pair.ini.conn.llp_close(), Some(LlpClose::Abort));
            assert!(pair.rsp.established(), "{name}");
            // The responder held its FPDUs: nothing but the Reply went out.
            let (_, reply_len) =
                mpa::wire::Repr::parse_bytes(&pair.rsp.wire, &mpa::wire::Limits::default())
                    .unwrap();
            assert_eq!(pair.rsp.wire.len(), reply_len, "{name}");
        }
    }
}

/// Rev 1/2 on each side x every CRC policy on each side x Markers in each
/// direction x P2P with each RTR kind (and none) x what the responder accepts.
#[test]
fn every_negotiation_combination_end_to_end() {
    let mut outcomes = [0usize; 3];
    for rev_i in [1u8, 2] {
        for rev_r in [1u8, 2] {
            for crc_i in POLICIES {
                for crc_r in POLICIES {
                    for (mk_i, mk_r) in [(false, false), (true, false), (false, true), (true, true)]
                    {
                        for rtr in [
                            None,
                            Some(RtrKind::Write),
                            Some(RtrKind::Read),
                            Some(RtrKind::Send),
                        ] {
                            for accepts in [RtrKinds::ALL, LocalSettings::default().rtr] {
                                if rtr.is_some() && rev_i == 1 {
                                    continue; // P2P needs Rev 2 (a settings error)
                                }
                                let ini = s(|x| {
                                    x.rev = rev_i;
                                    x.crc = crc_i;
                                    x.markers_rx = mk_i;
                                    x.p2p = rtr.is_some();
                                    x.rtr = RtrKinds::only(rtr);
                                    if rtr.is_none() {
                                        x.rtr = RtrKinds::ALL;
                                    }
                                });
                                let rsp = s(|x| {
                                    x.rev = rev_r;
                                    x.crc = crc_r;
                                    x.markers_rx = mk_r;
                                    x.rtr = accepts;
                                });
                                outcomes[match oracle(&ini, &rsp) {
                                    Expect::Established => 0,
                                    Expect::ResponderRejects(_) => 1,
                                    Expect::InitiatorFails(_) => 2,
                                }] += 1;
                                check_combination(ini, rsp, Chunks::Whole);
                            }
                        }
                    }
                }
            }
        }
    }
    // Every outcome was exercised.
    assert!(outcomes.iter().all(|&n| n > 0), "{outcomes:?}");
}

/// A sample of combinations with small and random chunks.
#[test]
fn negotiation_combinations_chunked() {
    for chunks in [Chunks::Fixed(1), Chunks::Fixed(3), Chunks::Random(17)] {
        for (ini, rsp) in [
            (s(|_| ()), s(|_| ())),
            (
                s(|x| x.crc = CrcPolicy::Required),
                s(|x| x.markers_rx = true),
            ),
            (p2p(RtrKind::Read), s(|x| x.crc = CrcPolicy::Wanted)),
            (
                s(|x| {
                    x.rev = 1;
                    x.markers_rx = true
                }),
                s(|x| x.crc = CrcPolicy::Refused),
            ),
            (
                s(|x| x.crc = CrcPolicy::Wanted),
                s(|x| x.crc = CrcPolicy::Refused),
            ),
        ] {
            check_combination(ini, rsp, chunks);
        }
    }
}

/// The RTR bytes on the wire for each kind, with CRC off and on; the Read
/// RTR is answered with a zero-length Read Response; RTRs never surface.
#[test]
fn p2p_rtr_bytes_on_the_wire() {
    for crc in [false, true] {
        for kind in [RtrKind::Write, RtrKind::Read, RtrKind::Send] {
            let name = format!("{kind:?} crc {crc}");
            let mut ini = p2p(kind);
            if crc {
                ini.crc = CrcPolicy::Wanted;
            }
            let rsp = s(|x| x.rtr = RtrKinds::ALL);
            let mut pair = Pair::with_settings(ini, rsp, Chunks::Whole);
            pair.run();
            // Held responder ULPDU, released after the RTR (and Read Response).
            pair.rsp.conn.send_ulpdu(&[b"after the rtr"]).unwrap();
            pair.run();
            assert_eq!(pair.ini.conn.agreed().unwrap().rtr, Some(kind), "{name}");
            let framing = Framing {
                crc,
                markers: false,
            };
            let i2r = deframe(&pair.ini.wire[24..], framing);
            let r2i = deframe(&pair.rsp.wire[24..], framing);
            let (rtr, status) = &i2r[0];
            if crc {
                assert!(matches!(status, CrcStatus::Good(_)), "{name}");
            }
            let expected_rtr = match kind {
                RtrKind::Write => unhex("c140 00000001 0000000000000000"),
                RtrKind::Send => unhex("4143 00000000 00000000 00000001 00000000"),
                RtrKind::Read => unhex(
                    "4141 00000000 00000001 00000001 00000000
                     00000000 0000000000000000 00000000 00000001 0000000000000000",
                ),
            };
            assert_eq!(rtr, &expected_rtr, "{name}");
            if kind == RtrKind::Write && !crc {
                assert_eq!(
                    pair.ini.wire[24..44],
                    unhex(P2P_WRITE_RTR_FPDU),
                    "siw's frame 10"
                );
            }
            if kind == RtrKind::Read {
                assert_eq!(r2i.len(), 2, "{name}");
                assert_eq!(r2i[0].0, unhex("c142 00000000 0000000000000000"));
                if !crc {
                    assert_eq!(
                        pair.rsp.wire[24..44],
                        unhex("000e c142 00000000 0000000000000000 00000000")
                    );
                }
            } else {
                assert_eq!(r2i.len(), 1, "{name}");
            }
            assert_eq!(r2i.last().unwrap().0, b"after the rtr", "{name}");
            // Nothing but the ULP's ULPDU surfaced, on either side.
            assert!(pair.rsp.ulpdus().is_empty(), "{name}");
            assert_eq!(pair.ini.ulpdus(), vec![b"after the rtr".to_vec()], "{name}");
            assert!(!pair.ini.conn.read_rtr_outstanding(), "{name}");
            // The MSNs the upper layer starts from.
            let one = InitialMsn {
                send_tx: 1,
                send_rx: 1,
                read_tx: 1,
                read_rx: 1,
            };
            let (ini_msn, rsp_msn) = match kind {
                RtrKind::Write => (one, one),
                RtrKind::Send => (
                    InitialMsn { send_tx: 2, ..one },
                    InitialMsn { send_rx: 2, ..one },
                ),
                RtrKind::Read => (
                    InitialMsn { read_tx: 2, ..one },
                    InitialMsn { read_rx: 2, ..one },
                ),
            };
            assert_eq!(pair.ini.conn.initial_msn(), Some(ini_msn), "{name}");
            assert_eq!(pair.rsp.conn.initial_msn(), Some(rsp_msn), "{name}");
        }
    }
}

/// The Read RTR is outstanding at the initiator until its Read Response comes.
#[test]
fn read_rtr_outstanding_until_response() {
    let mut pair = Pair::with_settings(p2p(RtrKind::Read), s(|_| ()), Chunks::Whole);
    // Request -> responder -> Reply -> initiator, stop before the RTR is delivered.
    transmit(&mut pair.ini, &mut pair.rsp, Chunks::Whole, &mut pair.rng);
    deliver(&mut pair.rsp, 1, Chunks::Whole, &mut pair.rng);
    collect(&mut pair.rsp);
    pair.rsp.conn.accept(b"", 1, 1).unwrap();
    transmit(&mut pair.rsp, &mut pair.ini, Chunks::Whole, &mut pair.rng);
    deliver(&mut pair.ini, 2, Chunks::Whole, &mut pair.rng);
    assert!(pair.ini.conn.read_rtr_outstanding());
    assert_eq!(pair.ini.conn.state(), State::FullOperation);
    pair.run();
    assert!(!pair.ini.conn.read_rtr_outstanding());
    assert!(pair.ini.ulpdus().is_empty() && pair.rsp.ulpdus().is_empty());
}

/// A first FPDU that is not the agreed RTR, and a Read Response to a Read
/// RTR that carries data: Error(Rtr) with LLP code 0x07.
#[test]
fn rtr_violations() {
    // Responder agreed on Write but the "initiator" sends a Send first.
    let mut rsp = MpaConn::responder(MpaConfig::default(), 0).unwrap();
    let req = negotiate::request(&p2p(RtrKind::Write))
        .unwrap()
        .to_bytes()
        .unwrap();
    rsp.handle_rx(&req, 1);
    rsp.poll_event();
    rsp.accept(b"", 1, 1).unwrap();
    rsp.send_ulpdu(&[b"held"]).unwrap();
    rsp.poll_event();
    let mut framer = Framer::new(NO_CRC);
    let mut wire = Vec::new();
    let send = Header {
        opcode: Opcode::Send,
        last: true,
        buffer: BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: 0,
            msn: 1,
            mo: 0,
        },
    };
    framer
        .append_parts(&[&send.to_bytes().unwrap()[..18], b"data"], &mut wire)
        .unwrap();
    framer.append(b"more", &mut wire).unwrap();
    let first_len = 2 + 22 + 4;
    assert_eq!(rsp.handle_rx(&wire, 2), first_len);
    let Some(MpaEvent::Error(e)) = rsp.poll_event() else {
        panic!()
    };
    assert!(matches!(
        e,
        MpaError::Rtr(RtrError::NotRtr {
            expected: RtrKind::Write,
            opcode: Some(Opcode::Send),
            ulpdu_len: 22
        })
    ));
    assert_eq!(e.llp_error_code(), Some(LlpErrorCode::NoMatchingRtr));
    assert_eq!(rsp.poll_event(), None, "nothing delivered after the error");
    assert_eq!(rsp.state(), State::Failed);
    assert_eq!(rsp.held_ulpdus(), 0);
    assert_eq!(rsp.poll_transmit().unwrap().len(), 24, "only the Reply");
    assert!(rsp.can_send_terminate());

    // Initiator with a Read RTR gets a Read Response with payload.
    let mut ini = MpaConn::initiator(cfg(p2p(RtrKind::Read)), 0).unwrap();
    let req = negotiate::request(&p2p(RtrKind::Read)).unwrap();
    let Response::Accept { reply, .. } =
        negotiate::respond(&LocalSettings::default(), &req).unwrap()
    else {
        panic!()
    };
    let mut wire = reply.to_bytes().unwrap();
    let resp = Header {
        opcode: Opcode::ReadResponse,
        last: true,
        buffer: BufferModel::Tagged { stag: 0, to: 0 },
    };
    Framer::new(NO_CRC)
        .append_parts(&[&resp.to_bytes().unwrap()[..14], b"x"], &mut wire)
        .unwrap();
    ini.handle_rx(&wire, 1);
    assert!(matches!(
        ini.poll_event(),
        Some(MpaEvent::Established { .. })
    ));
    assert_eq!(
        ini.poll_event(),
        Some(MpaEvent::Error(MpaError::Rtr(
            RtrError::ReadResponseNotEmpty {
                payload_len: 1,
                last: true
            }
        )))
    );
}

#[test]
fn ird_ord_mismatch() {
    // Strict responder: the initiator's ORD 8 over IRD 4 -> reject Reply, 0x06.
    let mut pair = Pair::with_settings(
        s(|x| x.ord = 8),
        s(|x| {
            x.ird = 4;
            x.relaxed_ird_ord = false
        }),
        Chunks::Whole,
    );
    pair.run();
    let reason = NegotiationError::InsufficientIrd { ird: 4, ord: 8 };
    assert!(matches!(
        pair.rsp.events[0],
        MpaEvent::ConnectRequest { .. }
    ));
    assert_eq!(pair.rsp.errors(), vec![MpaError::Negotiation(reason)]);
    assert_eq!(
        pair.rsp.errors()[0].llp_error_code(),
        Some(LlpErrorCode::InsufficientIrd)
    );
    assert_eq!(pair.rsp.conn.llp_close(), Some(LlpClose::Graceful));
    assert_eq!(
        pair.ini.events,
        vec![MpaEvent::Rejected {
            private_data: vec![]
        }]
    );
    pair.ini.conn.handle_tcp_closed(true);
    assert_eq!(pair.ini.conn.poll_event(), Some(MpaEvent::Closed));

    // Relaxed (default) responder: the initiator lowers its ORD to 4.
    let mut pair = Pair::with_settings(s(|x| x.ord = 8), s(|x| x.ird = 4), Chunks::Whole);
    pair.run();
    assert_eq!(pair.ini.conn.agreed().unwrap().ord, 4);

    // Strict initiator: it fails with 0x06 and can send a Terminate.
    let mut pair = Pair::with_settings(
        s(|x| {
            x.ord = 8;
            x.relaxed_ird_ord = false
        }),
        s(|x| x.ird = 4),
        Chunks::Whole,
    );
    pair.run();
    let err = MpaError::Negotiation(reason);
    assert_eq!(pair.ini.errors(), vec![err.clone()]);
    assert_eq!(pair.ini.conn.state(), State::Failed);
    assert!(pair.ini.conn.can_send_terminate());
    let cause = err.terminate_cause().unwrap();
    assert_eq!(cause, ErrorCause::Llp(LlpCode::InsufficientIrd));
    let term = Ulpdu {
        header: Header {
            opcode: Opcode::Terminate,
            last: true,
            buffer: BufferModel::Untagged {
                rsvd_ulp: 0,
                qn: 2,
                msn: 1,
                mo: 0,
            },
        },
        body: Body::Terminate(terminate::Repr::for_error(cause, None)),
        payload: &[],
        len: 0,
    };
    let mut bytes = vec![0; term.buffer_len()];
    term.emit(&mut bytes).unwrap();
    pair.ini.conn.send_terminate(&[&bytes]).unwrap();
    assert_eq!(
        pair.ini.conn.send_terminate(&[&bytes]),
        Err(CallError::TerminateSent)
    );
    pair.run();
    // The responder (no P2P: the Terminate is its first FPDU) delivers it.
    let got = pair.rsp.ulpdus();
    assert_eq!(got.len(), 1);
    let parsed = Ulpdu::parse(&got[0]).unwrap();
    let Body::Terminate(t) = parsed.body else {
        panic!()
    };
    assert_eq!(t.cause, ErrorCause::Llp(LlpCode::InsufficientIrd));
}

#[test]
fn bad_key() {
    let mut bad = unhex(RPING_REQUEST);
    bad[4] = b'X';
    for chunk in [bad.len(), 1] {
        let mut rsp = MpaConn::responder(MpaConfig::default(), 0).unwrap();
        for piece in bad.chunks(chunk) {
            rsp.handle_rx(piece, 1);
        }
        let Some(MpaEvent::Error(e)) = rsp.poll_event() else {
            panic!()
        };
        assert_eq!(e, MpaError::BadFrame(WireError::BadKey));
        assert_eq!(e.llp_error_code(), Some(LlpErrorCode::InvalidRequestReply));
        assert_eq!(rsp.llp_close(), Some(LlpClose::Abort));
        assert_eq!(rsp.state(), State::Failed);
        assert_eq!(rsp.poll_transmit(), None);
    }
    // An initiator handed a Request instead of a Reply, and a garbled Reply.
    let mut ini = MpaConn::initiator(MpaConfig::default(), 0).unwrap();
    ini.handle_rx(&unhex(RPING_REQUEST), 1);
    assert_eq!(
        ini.poll_event(),
        Some(MpaEvent::Error(MpaError::BadFrame(
            WireError::UnexpectedKind {
                expected: FrameKind::Reply,
                found: FrameKind::Request
            }
        )))
    );
    let mut ini = MpaConn::initiator(MpaConfig::default(), 0).unwrap();
    let mut reply = unhex(RPING_REPLY);
    reply[0] = 0;
    ini.handle_rx(&reply, 1);
    assert_eq!(
        ini.poll_event(),
        Some(MpaEvent::Error(MpaError::BadFrame(WireError::BadKey)))
    );
}

/// The reject Reply to a Request of an unsupported Rev, from a Rev 2 responder:
/// the Reply key, flags 0x20 (R only: no M, C or enhanced bit), Rev 2, PD_Length 0.
const UNSUPPORTED_REV_REJECT_REV2: &str = "4d504120494420526570204672616d6520020000";

/// A Request of Rev 3 (or 0, or 255): the responder answers with a reject Reply
/// carrying its own Rev (golden bytes), in every chunking, reports
/// BadFrame(BadRevision) with LLP code 0x04, and closes gracefully (FIN, so the
/// Reply gets out) instead of resetting. A Rev 1 responder answers with Rev 1.
/// Our initiator reads that Reply as a reject.
#[test]
fn unsupported_revision_request_gets_a_reject_reply() {
    for rev in [3u8, 0, 255] {
        for (local_rev, golden) in [
            (2u8, unhex(UNSUPPORTED_REV_REJECT_REV2)),
            (1, {
                let mut g = unhex(UNSUPPORTED_REV_REJECT_REV2);
                g[17] = 1;
                g
            }),
        ] {
            let mut req = unhex(RPING_REQUEST);
            req[17] = rev;
            for chunk in [req.len(), 7, 1] {
                let mut rsp = MpaConn::responder(cfg(s(|x| x.rev = local_rev)), 0).unwrap();
                let mut taken = 0;
                for piece in req.chunks(chunk) {
                    taken += rsp.handle_rx(piece, 1);
                }
                // Taken up to the end of the chunk that completed the 20-octet header.
                assert_eq!(
                    taken,
                    20usize.div_ceil(chunk) * chunk,
                    "rev {rev} chunk {chunk}"
                );
                let Some(MpaEvent::Error(e)) = rsp.poll_event() else {
                    panic!("rev {rev} chunk {chunk}")
                };
                assert_eq!(e, MpaError::BadFrame(WireError::BadRevision(rev)));
                assert_eq!(e.llp_error_code(), Some(LlpErrorCode::InvalidRequestReply));
                assert_eq!(rsp.poll_event(), None, "no ConnectRequest");
                assert_eq!(rsp.state(), State::Failed);
                assert_eq!(rsp.llp_close(), Some(LlpClose::Graceful));
                assert!(!rsp.can_send_terminate());
                let out = rsp.poll_transmit().unwrap().to_vec();
                assert_eq!(out, golden, "rev {rev} local {local_rev} chunk {chunk}");
                rsp.transmit_done(out.len()).unwrap();
                // Nothing more is read or sent; the peer's FIN changes nothing.
                assert_eq!(rsp.handle_rx(b"more", 2), 0);
                rsp.handle_tcp_closed(true);
                assert_eq!(rsp.poll_event(), None);
                assert_eq!(rsp.poll_transmit(), None);
            }
            // Our initiator (same Rev) takes it as a reject.
            let mut ini = MpaConn::initiator(cfg(s(|x| x.rev = local_rev)), 0).unwrap();
            let request = ini.poll_transmit().unwrap().len();
            ini.transmit_done(request).unwrap();
            ini.handle_rx(&golden, 1);
            assert_eq!(
                ini.poll_event(),
                Some(MpaEvent::Rejected {
                    private_data: Vec::new()
                })
            );
        }
    }
    // A Reply key with Rev 3 sent to a responder is not a Request: abort, no answer.
    let mut bad = unhex(RPING_REPLY);
    bad[17] = 3;
    for chunk in [bad.len(), 1] {
        let mut rsp = MpaConn::responder(MpaConfig::default(), 0).unwrap();
        for piece in bad.chunks(chunk) {
            rsp.handle_rx(piece, 1);
        }
        assert_eq!(
            rsp.poll_event(),
            Some(MpaEvent::Error(MpaError::BadFrame(
                WireError::UnexpectedKind {
                    expected: FrameKind::Request,
                    found: FrameKind::Reply
                }
            )))
        );
        assert_eq!(rsp.llp_close(), Some(LlpClose::Abort));
        assert_eq!(rsp.poll_transmit(), None);
    }
}

#[test]
fn private_data_too_long() {
    // In the local settings.
    let mut settings = LocalSettings {
        private_data: vec![1; 509],
        ..LocalSettings::default()
    };
    assert!(MpaConn::initiator(cfg(settings.clone()), 0).is_err());
    settings.rev = 1;
    settings.private_data = vec![1; 512];
    assert!(MpaConn::initiator(cfg(settings), 0).is_ok());
    // In accept() and reject(): refused, nothing changes, a shorter one works.
    let mut rsp = MpaConn::responder(MpaConfig::default(), 0).unwrap();
    rsp.handle_rx(&unhex(RPING_REQUEST), 1);
    rsp.poll_event();
    let too_long = SettingsError::PrivateDataTooLong {
        len: 509,
        limit: 508,
    };
    assert_eq!(
        rsp.accept(&[0; 509], 1, 1),
        Err(CallError::Settings(too_long.clone()))
    );
    assert_eq!(rsp.reject(&[0; 509]), Err(CallError::Settings(too_long)));
    assert_eq!(
        rsp.accept(b"", 0x4000, 1),
        Err(CallError::Settings(SettingsError::IrdOrdRange(0x4000)))
    );
    assert_eq!(rsp.state(), State::AwaitingDecision);
    assert_eq!(rsp.poll_transmit(), None);
    rsp.accept(&[7; 508], 1, 1).unwrap();
    assert_eq!(rsp.poll_transmit().unwrap().len(), 20 + 512);
    // On the wire: PD_Length 600 from the peer.
    let mut req = unhex(RPING_REQUEST);
    req[18..20].copy_from_slice(&600u16.to_be_bytes());
    let mut rsp = MpaConn::responder(MpaConfig::default(), 0).unwrap();
    rsp.handle_rx(&req, 1);
    let Some(MpaEvent::Error(e)) = rsp.poll_event() else {
        panic!()
    };
    assert_eq!(
        e,
        MpaError::BadFrame(WireError::PrivateDataTooLong {
            len: 600,
            limit: 512
        })
    );
    assert_eq!(e.llp_error_code(), Some(LlpErrorCode::InvalidRequestReply));
}

#[test]
fn private_data_both_ways_and_reject_with_private_data() {
    let mut pair = Pair::with_settings(
        s(|x| x.private_data = b"hello from the initiator".to_vec()),
        s(|x| x.private_data = b"hello from the responder".to_vec()),
        Chunks::Fixed(5),
    );
    pair.run();
    let MpaEvent::ConnectRequest { request } = &pair.rsp.events[0] else {
        panic!()
    };
    assert_eq!(request.private_data, b"hello from the initiator");
    assert_eq!(
        pair.ini.conn.agreed().unwrap().peer_private_data,
        b"hello from the responder"
    );

    let mut pair = Pair::with_settings(s(|_| ()), s(|_| ()), Chunks::Fixed(3));
    pair.auto_accept = None;
    pair.run();
    assert_eq!(pair.rsp.conn.state(), State::AwaitingDecision);
    pair.rsp.conn.reject(b"go away").unwrap();
    assert_eq!(pair.rsp.conn.state(), State::Closing);
    assert_eq!(pair.rsp.conn.llp_close(), Some(LlpClose::Graceful));
    assert!(matches!(
        pair.rsp.conn.send_ulpdu(&[b"x"]),
        Err(CallError::WrongState { .. })
    ));
    pair.run();
    assert_eq!(
        pair.ini.events,
        vec![MpaEvent::Rejected {
            private_data: b"go away".to_vec()
        }]
    );
    assert_eq!(pair.ini.conn.llp_close(), Some(LlpClose::Graceful));
    assert!(pair.rsp.errors().is_empty());
    pair.rsp.conn.handle_tcp_closed(true);
    pair.ini.conn.handle_tcp_closed(true);
    assert_eq!(pair.rsp.conn.poll_event(), Some(MpaEvent::Closed));
    assert_eq!(pair.ini.conn.poll_event(), Some(MpaEvent::Closed));
    assert_eq!(pair.ini.conn.state(), State::Closed);
}

// ---------------------------------------------------------------------------
// Timeouts.

#[test]
fn peer_that_never_replies_times_out_at_exactly_the_deadline() {
    let t0 = 1_000;
    let timeout = 5_000_000;
    for role in [Role::Initiator, Role::Responder] {
        let config = MpaConfig {
            startup_timeout_us: timeout,
            ..MpaConfig::default()
        };
        let mut conn = match role {
            Role::Initiator => MpaConn::initiator(config, t0).unwrap(),
            Role::Responder => MpaConn::responder(config, t0).unwrap(),
        };
        let deadline = t0 + timeout;
        assert_eq!(conn.poll_timeout(), Some(deadline));
        conn.handle_timeout(deadline - 1);
        assert_eq!(conn.poll_event(), None);
        // Part of a frame does not extend the deadline.
        conn.handle_rx(&unhex(RPING_REQUEST)[..10], deadline - 1);
        assert_eq!(conn.poll_timeout(), Some(deadline));
        conn.handle_timeout(deadline);
        let waiting_for = match role {
            Role::Initiator => FrameKind::Reply,
            Role::Responder => FrameKind::Request,
        };
        let err = MpaError::Timeout { waiting_for };
        assert_eq!(conn.poll_event(), Some(MpaEvent::Error(err.clone())));
        assert_eq!(err.llp_error_code(), None);
        assert_eq!(conn.poll_event(), None);
        assert_eq!(conn.poll_timeout(), None);
        assert_eq!(conn.state(), State::Failed);
        assert_eq!(conn.llp_close(), Some(LlpClose::Abort));
        conn.handle_timeout(deadline + 1);
        assert_eq!(conn.poll_event(), None, "reported once");
    }
    // Default 10 s; a Reply arriving at the deadline is too late.
    let mut ini = MpaConn::initiator(MpaConfig::default(), 0).unwrap();
    assert_eq!(ini.poll_timeout(), Some(DEFAULT_STARTUP_TIMEOUT_US));
    assert_eq!(
        ini.handle_rx(&unhex(RPING_REPLY), DEFAULT_STARTUP_TIMEOUT_US),
        0
    );
    assert!(matches!(
        ini.poll_event(),
        Some(MpaEvent::Error(MpaError::Timeout { .. }))
    ));
    // One microsecond earlier it is in time.
    let mut ini = MpaConn::initiator(MpaConfig::default(), 0).unwrap();
    ini.handle_rx(&unhex(RPING_REPLY), DEFAULT_STARTUP_TIMEOUT_US - 1);
    assert!(matches!(
        ini.poll_event(),
        Some(MpaEvent::Established { .. })
    ));
    assert_eq!(ini.poll_timeout(), None);
}

/// A responder that accepted and never gets a first FPDU does not time out.
#[test]
fn accepted_responder_has_no_mpa_timeout() {
    let mut rsp = MpaConn::responder(MpaConfig::default(), 0).unwrap();
    rsp.handle_rx(&unhex(RPING_REQUEST), 1);
    assert_eq!(rsp.poll_timeout(), None, "no timer while the ULP decides");
    rsp.poll_event();
    rsp.accept(b"", 1, 1).unwrap();
    rsp.poll_event();
    assert_eq!(rsp.poll_timeout(), None);
    rsp.handle_timeout(u64::MAX);
    assert_eq!(rsp.poll_event(), None);
    assert_eq!(rsp.state(), State::AwaitingFirstFpdu);
}

// ---------------------------------------------------------------------------
// Startup byte streams.

/// The responder's FPDUs are held until the initiator's first FPDU arrives;
/// the byte stream shows the Reply alone, then the FPDUs.
/// The Terminate for a bad MPA CRC, as the transport builds it (`Ulpdu::terminate`:
/// untagged, L = 1, RDMAP opcode 7, QN 2, MSN 1, MO 0) with the error only:
/// Layer 2 (LLP), EType 0 (MPA), Error Code 0x02 "MPA CRC error" (RFC 5040 section
/// 4.8; RFC 5044 section 8; siw `LLP_ECODE_RECEIVED_CRC`), H = M = D = 0.
const CRC_TERMINATE_ULPDU: &str = "4147 00000000 00000002 00000001 00000000 2002 0000";

/// A bad CRC in the initiator's *first* FPDU (the responder still holds its own
/// FPDUs, RFC 5044 section 7.1.2): the responder may send the Terminate anyway (the
/// initiator is in full operation), behind its Reply, with the exact LLP/MPA/CRC
/// cause; then it aborts. Before the fix the hold kept the Terminate in and the
/// peer only saw a reset.
#[test]
fn bad_crc_in_the_first_fpdu_still_gets_the_terminate() {
    for markers in [false, true] {
        let ini = s(|x| {
            x.crc = CrcPolicy::Wanted;
            x.markers_rx = markers
        });
        let mut pair = Pair::with_settings(ini, s(|_| ()), Chunks::Whole);
        pair.run();
        assert!(pair.rsp.established());
        assert_eq!(pair.rsp.conn.state(), State::AwaitingFirstFpdu);
        pair.rsp.conn.send_ulpdu(&[b"held"]).unwrap();
        assert!(
            !pair.rsp.conn.can_send_terminate(),
            "held before the first FPDU"
        );
        pair.ini.conn.send_ulpdu(&[&[7u8; 100]]).unwrap();
        let mut wire = pair.ini.conn.poll_transmit().unwrap().to_vec();
        wire[40] ^= 0x80;
        assert_eq!(pair.rsp.conn.handle_rx(&wire, 5), wire.len());
        collect(&mut pair.rsp);
        let errors = pair.rsp.errors();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(matches!(errors[0], MpaError::Crc { .. }), "{errors:?}");
        let cause = errors[0].terminate_cause().unwrap();
        assert_eq!(cause, ErrorCause::Llp(LlpCode::CrcError));
        assert_eq!(pair.rsp.conn.state(), State::Failed);
        assert_eq!(pair.rsp.conn.llp_close(), Some(LlpClose::Abort));
        assert_eq!(pair.rsp.conn.held_ulpdus(), 0, "held ULPDUs dropped");
        assert!(pair.rsp.conn.can_send_terminate());
        let t = Ulpdu::terminate(cause, 1);
        let mut tbytes = vec![0u8; t.buffer_len()];
        t.emit(&mut tbytes).unwrap();
        assert_eq!(tbytes, unhex(CRC_TERMINATE_ULPDU));
        pair.rsp.conn.send_terminate(&[&tbytes]).unwrap();
        // Only the Terminate goes out behind the Reply (never the held ULPDU).
        let out = pair.rsp.conn.poll_transmit().unwrap().to_vec();
        let framing = Framing { crc: true, markers };
        let fpdus = deframe(&out, framing);
        assert_eq!(fpdus.len(), 1);
        assert_eq!(fpdus[0].0, unhex(CRC_TERMINATE_ULPDU));
        assert!(matches!(fpdus[0].1, CrcStatus::Good(_)));
        let ulpdu = &fpdus[0].0;
        assert_eq!(
            ulpdu::terminate_cause(ulpdu),
            Some(ErrorCause::Llp(LlpCode::CrcError))
        );
        assert_eq!((ulpdu[18] >> 4, ulpdu[18] & 0xf, ulpdu[19]), (2, 0, 0x02));
        // Fed to our initiator: TerminateReceived material (a ULPDU it delivers).
        assert_eq!(pair.rsp.wire.len(), 24, "only the Reply went out before");
        pair.ini.conn.handle_rx(&out, 6);
        collect(&mut pair.ini);
        assert_eq!(pair.ini.ulpdus(), vec![unhex(CRC_TERMINATE_ULPDU)]);
    }
}

/// A framing error (ULPDU_Length 0 where the initiator's first FPDU should start)
/// also lets the responder's Terminate out, with the deframer's LLP code, never a
/// silent reset.
#[test]
fn garbage_as_the_first_fpdu_allows_the_terminate() {
    let mut pair = Pair::with_settings(s(|x| x.crc = CrcPolicy::Wanted), s(|_| ()), Chunks::Whole);
    pair.run();
    assert_eq!(pair.rsp.conn.state(), State::AwaitingFirstFpdu);
    pair.rsp.conn.handle_rx(&[0; 64], 5);
    collect(&mut pair.rsp);
    let errors = pair.rsp.errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(matches!(errors[0], MpaError::Framing(_)), "{errors:?}");
    assert_eq!(
        errors[0].llp_error_code(),
        Some(LlpErrorCode::MarkerMismatch)
    );
    assert!(pair.rsp.conn.can_send_terminate());
}

#[test]
fn responder_fpdus_held_until_first_initiator_fpdu() {
    let mut pair = Pair::with_settings(s(|_| ()), s(|_| ()), Chunks::Whole);
    pair.run();
    assert!(pair.ini.established() && pair.rsp.established());
    pair.rsp
        .conn
        .send_ulpdu(&[b"first", b" from responder"])
        .unwrap();
    pair.rsp.conn.send_ulpdu(&[b"second"]).unwrap();
    assert_eq!(pair.rsp.conn.held_ulpdus(), 2);
    pair.run();
    pair.now += 60_000_000;
    pair.rsp.conn.handle_timeout(pair.now);
    pair.run();
    assert_eq!(pair.rsp.wire, unhex(RPING_REPLY), "only the Reply went out");
    assert!(pair.ini.ulpdus().is_empty());
    // The initiator's first FPDU releases them, in order.
    pair.ini.conn.send_ulpdu(&[b"hi"]).unwrap();
    pair.run();
    assert_eq!(pair.rsp.conn.held_ulpdus(), 0);
    assert_eq!(pair.rsp.ulpdus(), vec![b"hi".to_vec()]);
    assert_eq!(
        pair.ini.ulpdus(),
        vec![b"first from responder".to_vec(), b"second".to_vec()]
    );
    let mut expected = unhex(RPING_REPLY);
    let mut framer = Framer::new(NO_CRC);
    framer
        .append(b"first from responder", &mut expected)
        .unwrap();
    framer.append(b"second", &mut expected).unwrap();
    assert_eq!(pair.rsp.wire, expected);
}

/// FPDUs right behind the Reply in the same chunk are delivered (siw's
/// responder does not hold its FPDUs), with CRC and Markers.
#[test]
fn fpdu_right_behind_reply_in_same_chunk() {
    for markers in [false, true] {
        let ini = s(|x| {
            x.crc = CrcPolicy::Wanted;
            x.markers_rx = markers
        });
        let mut conn = MpaConn::initiator(cfg(ini.clone()), 0).unwrap();
        let req = negotiate::request(&ini).unwrap();
        let Response::Accept { agreed, reply } =
            negotiate::respond(&LocalSettings::default(), &req).unwrap()
        else {
            panic!()
        };
        let mut wire = reply.to_bytes().unwrap();
        let mut framer = Framer::new(agreed.tx_framing());
        let big = vec![0x5a; 1000];
        framer.append(b"right behind", &mut wire).unwrap();
        framer.append(&big, &mut wire).unwrap();
        assert_eq!(conn.handle_rx(&wire, 1), wire.len());
        assert!(matches!(
            conn.poll_event(),
            Some(MpaEvent::Established { .. })
        ));
        assert_eq!(
            conn.poll_event(),
            Some(MpaEvent::Ulpdu(b"right behind".to_vec()))
        );
        assert_eq!(conn.poll_event(), Some(MpaEvent::Ulpdu(big)));
    }
}

// ---------------------------------------------------------------------------
// Data streams.

fn framings() -> Vec<(LocalSettings, LocalSettings)> {
    vec![
        (s(|_| ()), s(|_| ())),
        (s(|x| x.crc = CrcPolicy::Wanted), s(|_| ())),
        (
            s(|x| {
                x.crc = CrcPolicy::Wanted;
                x.markers_rx = true
            }),
            s(|x| x.markers_rx = true),
        ),
        (
            s(|x| {
                x.crc = CrcPolicy::Required;
                x.markers_rx = true;
                x.p2p = true;
                x.rtr = RtrKinds::only(Some(RtrKind::Read))
            }),
            s(|_| ()),
        ),
        (
            s(|x| {
                x.rev = 1;
                x.markers_rx = false
            }),
            s(|x| {
                x.crc = CrcPolicy::Wanted;
                x.markers_rx = true
            }),
        ),
    ]
}

/// Random ULPDUs both ways, sent while the pair runs, every chunking from 1
/// octet up: all arrive intact and in order.
#[test]
fn random_ulpdu_streams_every_chunking() {
    let mut chunkings: Vec<Chunks> = (1..=16).map(Chunks::Fixed).collect();
    chunkings.extend(
        [31, 61, 127, 509, 512, 513, 1000, 1448, 4096]
            .into_iter()
            .map(Chunks::Fixed),
    );
    chunkings.extend([Chunks::Whole, Chunks::Random(9), Chunks::Random(1500)]);
    for (f, (ini, rsp)) in framings().into_iter().enumerate() {
        for (c, &chunks) in chunkings.iter().enumerate() {
            let name = format!("framing {f} {chunks:?}");
            let mut rng = Rng::new((f * 1000 + c) as u64);
            let mut pair = Pair::with_settings(ini.clone(), rsp.clone(), chunks);
            pair.rng = Rng::new(c as u64 + 99);
            pair.run();
            let (mi, mr) = (
                pair.ini.conn.mulpdu().unwrap(),
                pair.rsp.conn.mulpdu().unwrap(),
            );
            let count = if matches!(chunks, Chunks::Fixed(k) if k < 8) {
                12
            } else {
                30
            };
            let mut sent_i = Vec::new();
            let mut sent_r = Vec::new();
            for i in 0..count {
                let len_i = match i % 5 {
                    0 => mi,
                    1 => 1,
                    _ => rng.range(1, mi),
                };
                let len_r = match i % 4 {
                    0 => mr,
                    1 => rng.range(1, 4),
                    _ => rng.range(1, mr),
                };
                let (a, b) = (rng.bytes(len_i), rng.bytes(len_r));
                // Split into parts at a random point (header + payload style).
                let cut = rng.range(0, a.len());
                pair.ini.conn.send_ulpdu(&[&a[..cut], &a[cut..]]).unwrap();
                pair.rsp.conn.send_ulpdu(&[&b]).unwrap();
                sent_i.push(a);
                sent_r.push(b);
                if i % 3 == 0 {
                    pair.run();
                }
            }
            pair.run();
            assert_eq!(pair.rsp.ulpdus().len(), sent_i.len(), "{name}");
            assert!(
                pair.rsp.ulpdus() == sent_i,
                "{name}: initiator -> responder"
            );
            assert!(
                pair.ini.ulpdus() == sent_r,
                "{name}: responder -> initiator"
            );
            assert!(
                pair.ini.errors().is_empty() && pair.rsp.errors().is_empty(),
                "{name}"
            );
        }
    }
}

#[test]
fn mulpdu_limits_sends() {
    for (markers, expected) in [(false, 1442), (true, fpdu::mulpdu(1448, true))] {
        let mut pair = Pair::with_settings(s(|_| ()), s(|x| x.markers_rx = markers), Chunks::Whole);
        pair.run();
        let ini = &mut pair.ini.conn;
        assert_eq!(ini.mulpdu(), Some(expected));
        assert_eq!(
            ini.send_ulpdu(&[&vec![0; expected + 1]]),
            Err(CallError::UlpduTooLong {
                len: expected + 1,
                mulpdu: expected
            })
        );
        assert_eq!(ini.send_ulpdu(&[]), Err(CallError::EmptyUlpdu));
        assert_eq!(ini.send_ulpdu(&[b"", b""]), Err(CallError::EmptyUlpdu));
        ini.send_ulpdu(&[&vec![1; expected]]).unwrap();
        // One FPDU fits one segment of EMSS octets wherever it starts.
        assert!(ini.transmit_pending() <= 1448);
    }
}

/// A corrupted octet in an FPDU with CRC on: Error(Crc) with LLP code 0x02,
/// nothing after it delivered, in every chunking.
#[test]
fn corrupted_fpdu_gives_crc_error_and_nothing_after() {
    for markers in [false, true] {
        for chunk in [1usize, 2, 5, 64, 10_000] {
            let ini = s(|x| {
                x.crc = CrcPolicy::Wanted;
                x.markers_rx = markers
            });
            let mut pair = Pair::with_settings(ini, s(|x| x.markers_rx = markers), Chunks::Whole);
            pair.run();
            let sent: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 300 + usize::from(i)]).collect();
            let mut bounds = Vec::new();
            for u in &sent {
                pair.ini.conn.send_ulpdu(&[u]).unwrap();
                bounds.push(pair.ini.conn.transmit_pending());
            }
            let mut wire = pair.ini.conn.poll_transmit().unwrap().to_vec();
            // Flip an octet in the middle of the third FPDU.
            let at = (bounds[1] + bounds[2]) / 2;
            wire[at] ^= 0x01;
            let mut consumed = 0;
            for piece in wire.chunks(chunk) {
                consumed += pair.rsp.conn.handle_rx(piece, 5);
                if pair.rsp.conn.state() == State::Failed {
                    break;
                }
            }
            assert_eq!(consumed, bounds[2], "stops right behind the bad FPDU");
            assert_eq!(pair.rsp.conn.handle_rx(&wire[bounds[2]..], 6), 0);
            collect(&mut pair.rsp);
            assert_eq!(pair.rsp.ulpdus(), sent[..2].to_vec(), "chunk {chunk}");
            let errors = pair.rsp.errors();
            assert_eq!(errors.len(), 1);
            assert!(matches!(errors[0], MpaError::Crc { .. }), "{errors:?}");
            assert_eq!(errors[0].llp_error_code(), Some(LlpErrorCode::CrcError));
            assert_eq!(
                errors[0].terminate_cause(),
                Some(ErrorCause::Llp(LlpCode::CrcError))
            );
            assert!(matches!(pair.rsp.events.last(), Some(MpaEvent::Error(_))));
            assert_eq!(pair.rsp.conn.llp_close(), Some(LlpClose::Abort));
            assert!(matches!(
                pair.rsp.conn.send_ulpdu(&[b"x"]),
                Err(CallError::WrongState { .. })
            ));
            assert!(pair.rsp.conn.can_send_terminate());
        }
    }
}

/// A bad Marker or ULPDU_Length: Error(Framing) with LLP code 0x03.
#[test]
fn bad_marker_and_length() {
    let mut pair = Pair::with_settings(s(|x| x.markers_rx = true), s(|_| ()), Chunks::Whole);
    pair.run();
    pair.rsp.conn.send_ulpdu(&[&[9u8; 1000]]).unwrap();
    pair.ini.conn.send_ulpdu(&[b"go"]).unwrap();
    transmit(&mut pair.ini, &mut pair.rsp, Chunks::Whole, &mut pair.rng);
    deliver(&mut pair.rsp, 1, Chunks::Whole, &mut pair.rng);
    let fpdus = pair.rsp.conn.poll_transmit().unwrap().to_vec();
    // Markers at 0 and 512 of the responder's stream; corrupt the second.
    let mut bad = fpdus.clone();
    bad[515] ^= 0x40;
    pair.ini.conn.handle_rx(&bad, 2);
    let events: Vec<_> = std::iter::from_fn(|| pair.ini.conn.poll_event()).collect();
    let Some(MpaEvent::Error(e)) = events.last() else {
        panic!("{events:?}")
    };
    assert!(matches!(e, MpaError::Framing(_)), "{e:?}");
    assert_eq!(e.llp_error_code(), Some(LlpErrorCode::MarkerMismatch));

    let mut pair = Pair::with_settings(s(|_| ()), s(|_| ()), Chunks::Whole);
    pair.run();
    pair.ini.conn.handle_rx(&[0, 0, 1, 2, 3, 4], 2);
    let events: Vec<_> = std::iter::from_fn(|| pair.ini.conn.poll_event()).collect();
    let Some(MpaEvent::Error(e)) = events.last() else {
        panic!("{events:?}")
    };
    assert!(matches!(e, MpaError::Framing(_)));
    assert_eq!(e.llp_error_code(), Some(LlpErrorCode::MarkerMismatch));
}

// ---------------------------------------------------------------------------
// Closing.

#[test]
fn tcp_closed_in_each_phase() {
    // During startup.
    let mut ini = MpaConn::initiator(MpaConfig::default(), 0).unwrap();
    ini.handle_tcp_closed(true);
    assert_eq!(
        ini.poll_event(),
        Some(MpaEvent::Error(MpaError::PeerClosedDuringStartup {
            graceful: true
        }))
    );
    let mut rsp = MpaConn::responder(MpaConfig::default(), 0).unwrap();
    rsp.handle_rx(&unhex(RPING_REQUEST), 1);
    rsp.poll_event();
    rsp.handle_tcp_closed(false);
    let Some(MpaEvent::Error(e)) = rsp.poll_event() else {
        panic!()
    };
    assert_eq!(e, MpaError::PeerClosedDuringStartup { graceful: false });
    assert_eq!(e.llp_error_code(), Some(LlpErrorCode::TcpConnectionLost));
    assert!(matches!(
        rsp.accept(b"", 1, 1),
        Err(CallError::WrongState { .. })
    ));

    // In full operation: FIN between FPDUs, FIN inside one, reset.
    for (graceful, partial) in [(true, false), (true, true), (false, false)] {
        let mut pair = Pair::with_settings(s(|_| ()), s(|_| ()), Chunks::Whole);
        pair.run();
        pair.ini.conn.send_ulpdu(&[b"abc"]).unwrap();
        let fpdu = pair.ini.conn.poll_transmit().unwrap().to_vec();
        let n = if partial { 3 } else { fpdu.len() };
        pair.rsp.conn.handle_rx(&fpdu[..n], 1);
        pair.rsp.conn.handle_tcp_closed(graceful);
        collect(&mut pair.rsp);
        let last = pair.rsp.events.last().unwrap().clone();
        if graceful && !partial {
            assert_eq!(last, MpaEvent::Closed);
            assert_eq!(pair.rsp.conn.state(), State::Closed);
            assert_eq!(pair.rsp.conn.llp_close(), Some(LlpClose::Graceful));
        } else {
            assert_eq!(
                last,
                MpaEvent::Error(MpaError::ConnectionLost {
                    graceful,
                    mid_fpdu: partial
                })
            );
        }
    }

    // Local graceful close: sends refused, receive still delivered, Closed at the end.
    let mut pair = Pair::with_settings(s(|_| ()), s(|_| ()), Chunks::Whole);
    pair.run();
    pair.ini.conn.send_ulpdu(&[b"before close"]).unwrap();
    pair.ini.conn.close().unwrap();
    assert_eq!(pair.ini.conn.llp_close(), Some(LlpClose::Graceful));
    assert!(matches!(
        pair.ini.conn.send_ulpdu(&[b"x"]),
        Err(CallError::WrongState {
            state: State::Closing,
            ..
        })
    ));
    pair.run();
    assert!(pair.ini.ulpdus().is_empty());
    assert_eq!(pair.rsp.ulpdus(), vec![b"before close".to_vec()]);
    pair.rsp.conn.send_ulpdu(&[b"late"]).unwrap();
    pair.run();
    assert_eq!(pair.ini.ulpdus(), vec![b"late".to_vec()]);
    pair.ini.conn.handle_tcp_closed(true);
    assert_eq!(pair.ini.conn.poll_event(), Some(MpaEvent::Closed));
    pair.ini.conn.handle_tcp_closed(true);
    assert_eq!(pair.ini.conn.poll_event(), None);
}

/// A responder that closes while FPDUs are held drops them.
#[test]
fn close_drops_held_ulpdus() {
    let mut pair = Pair::with_settings(s(|_| ()), s(|_| ()), Chunks::Whole);
    pair.run();
    pair.rsp.conn.send_ulpdu(&[b"never sent"]).unwrap();
    pair.rsp.conn.close().unwrap();
    assert_eq!(pair.rsp.conn.held_ulpdus(), 0);
    pair.ini.conn.send_ulpdu(&[b"hi"]).unwrap();
    pair.run();
    assert_eq!(pair.rsp.wire, unhex(RPING_REPLY));
    assert!(pair.ini.ulpdus().is_empty());
}

/// rping-srv_p2p-cli_p2p.pcap: the whole initiator-to-responder TCP byte stream.
const P2P_INITIATOR_STREAM: &str = concat!(
    "4d504120494420526571204672616d65100200048001c001000ec1400000000100000000000000000000000000224143",
    "000000000000000000000001000000000000561614445d509df7f1000000004000000000004ec1426db1680000005602",
    "f3d0bf3072646d612d70696e672d303a204142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f",
    "606162636465666768696a6b6c6d6e6f7071720000000000002241430000000000000000000000020000000000005616",
    "14445f3054ae0900000000400000000000224143000000000000000000000003000000000000561614445d509df7f100",
    "0000004000000000004ec1426db1680000005602f3d0bf3072646d612d70696e672d313a2042434445464748494a4b4c",
    "4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70717273000000000000224143",
    "000000000000000000000004000000000000561614445f3054ae09000000004000000000002241430000000000000000",
    "00000005000000000000561614445d509df7f1000000004000000000004ec1426db1680000005602f3d0bf3072646d61",
    "2d70696e672d323a20434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f60616263646566676869",
    "6a6b6c6d6e6f7071727374000000000000224143000000000000000000000006000000000000561614445f3054ae0900",
    "0000004000000000",
);

/// rping-srv_p2p-cli_p2p.pcap: the whole responder-to-initiator TCP byte stream.
const P2P_RESPONDER_STREAM: &str = concat!(
    "4d504120494420526570204672616d651002000480018001002e4141000000000000000100000001000000006db16800",
    "00005602f3d0bf30000000409df7f1000000561614445d50000000000022414300000000000000000000000100000000",
    "0000000000000000000000000000000000000000004ec14054ae09000000561614445f3072646d612d70696e672d303a",
    "204142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f",
    "707172000000000000224143000000000000000000000002000000000000000000000000000000000000000000000000",
    "002e4141000000000000000100000002000000006db1680000005602f3d0bf30000000409df7f1000000561614445d50",
    "0000000000224143000000000000000000000003000000000000000000000000000000000000000000000000004ec140",
    "54ae09000000561614445f3072646d612d70696e672d313a2042434445464748494a4b4c4d4e4f505152535455565758",
    "595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70717273000000000000224143000000000000000000000004",
    "000000000000000000000000000000000000000000000000002e4141000000000000000100000003000000006db16800",
    "00005602f3d0bf30000000409df7f1000000561614445d50000000000022414300000000000000000000000500000000",
    "0000000000000000000000000000000000000000004ec14054ae09000000561614445f3072646d612d70696e672d323a",
    "20434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f7071",
    "727374000000000000224143000000000000000000000006000000000000000000000000000000000000000000000000",
);

/// rping-srv_crc-cli_crc.pcap: the whole initiator-to-responder TCP byte stream.
const CRC_INITIATOR_STREAM: &str = concat!(
    "4d504120494420526571204672616d6550020004000100010022414300000000000000000000000100000000000055d4",
    "aab64d500a80a400000000402ffba8cb004ec14292c2570000005567384e6f3072646d612d70696e672d303a20414243",
    "4445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70717200",
    "2d76c8e50022414300000000000000000000000200000000000055d4aab64f3032d6ef0000000040d463da7600224143",
    "00000000000000000000000300000000000055d4aab64d500a80a40000000040f500bcd1004ec14292c2570000005567",
    "384e6f3072646d612d70696e672d313a2042434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f60",
    "6162636465666768696a6b6c6d6e6f707172730046204a660022414300000000000000000000000400000000000055d4",
    "aab64f3032d6ef0000000040ba6fe7580022414300000000000000000000000500000000000055d4aab64d500a80a400",
    "000000409b0c81ff004ec14292c2570000005567384e6f3072646d612d70696e672d323a20434445464748494a4b4c4d",
    "4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737400246071c800224143",
    "00000000000000000000000600000000000055d4aab64f3032d6ef00000000406094f342",
);

/// rping-srv_crc-cli_crc.pcap: the whole responder-to-initiator TCP byte stream.
const CRC_RESPONDER_STREAM: &str = concat!(
    "4d504120494420526570204672616d655002000400010001002e41410000000000000001000000010000000092c25700",
    "00005567384e6f30000000400a80a400000055d4aab64d502ad92ffa0022414300000000000000000000000100000000",
    "0000000000000000000000000000000084609a12004ec14032d6ef00000055d4aab64f3072646d612d70696e672d303a",
    "204142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f",
    "7071720058a6b183002241430000000000000000000000020000000000000000000000000000000000000000b3e68405",
    "002e41410000000000000001000000020000000092c2570000005567384e6f30000000400a80a400000055d4aab64d50",
    "5ba464140022414300000000000000000000000300000000000000000000000000000000000000005e9b8e08004ec140",
    "32d6ef00000055d4aab64f3072646d612d70696e672d313a2042434445464748494a4b4c4d4e4f505152535455565758",
    "595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172730033f0330000224143000000000000000000000004",
    "0000000000000000000000000000000000000000ddeab92b002e41410000000000000001000000030000000092c25700",
    "00005567384e6f30000000400a80a400000055d4aab64d50748f5d4e0022414300000000000000000000000500000000",
    "000000000000000000000000000000003097b326004ec14032d6ef00000055d4aab64f3072646d612d70696e672d323a",
    "20434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f7071",
    "7273740051b008ae0022414300000000000000000000000600000000000000000000000000000000000000000711ad31",
);

/// A fatal error after close() turns the graceful close into an abort.
#[test]
fn error_while_closing_aborts() {
    let mut pair = Pair::with_settings(s(|x| x.crc = CrcPolicy::Wanted), s(|_| ()), Chunks::Whole);
    pair.run();
    pair.ini.conn.close().unwrap();
    pair.rsp.conn.send_ulpdu(&[b"in flight"]).unwrap();
    pair.ini.conn.send_ulpdu(&[b"x"]).unwrap_err();
    // The responder's held ULPDU is never released (the initiator sent no FPDU).
    pair.run();
    assert_eq!(pair.ini.conn.state(), State::Closing);
    let mut fpdu = Vec::new();
    Framer::new(Framing {
        crc: true,
        markers: false,
    })
    .append(b"bad", &mut fpdu)
    .unwrap();
    fpdu[3] ^= 0xff;
    assert_eq!(pair.ini.conn.handle_rx(&fpdu, 9), fpdu.len());
    assert!(matches!(
        pair.ini.conn.poll_event(),
        Some(MpaEvent::Error(MpaError::Crc { .. }))
    ));
    assert_eq!(pair.ini.conn.llp_close(), Some(LlpClose::Abort));
}

/// The initiator's first-FPDU hold (`MpaConfig::first_fpdu_delay_us`, against the
/// Linux siw responder's window between sending its Reply and reading FPDUs): the RTR
/// and the ULPDUs sent during the hold stay off the wire until the deadline that
/// `poll_timeout` reports, then go out in order (RTR first); the startup timeout does
/// not fire on it; a graceful close during the hold sends them ahead of the FIN.
#[test]
fn initiator_holds_its_first_fpdu_after_the_reply() {
    const DELAY: u64 = 20_000;
    for rtr in [None, Some(RtrKind::Write), Some(RtrKind::Read)] {
        for close_early in [false, true] {
            let name = format!("rtr {rtr:?}, close during the hold {close_early}");
            let ini = match rtr {
                Some(kind) => p2p(kind),
                None => s(|_| ()),
            };
            let rsp = s(|x| x.rtr = RtrKinds::ALL);
            let mut pair = Pair::new(
                MpaConfig {
                    first_fpdu_delay_us: DELAY,
                    ..cfg(ini)
                },
                cfg(rsp),
                Chunks::Whole,
            );
            pair.run();
            assert!(pair.ini.established(), "{name}");
            let reply_at = pair.now;
            let hold_end = pair.ini.conn.poll_timeout().expect("the hold's deadline");
            assert!(
                hold_end > reply_at && hold_end <= reply_at + DELAY,
                "{name}"
            );
            pair.ini.conn.send_ulpdu(&[b"one"]).unwrap();
            pair.ini.conn.send_ulpdu(&[b"two"]).unwrap();
            let mut buf = [0u8; 256];
            assert_eq!(
                pair.ini.conn.frame_into(&mut buf, &[b"three"]).unwrap(),
                None,
                "{name}: no framing in place during the hold"
            );
            pair.run();
            assert_eq!(pair.ini.wire.len(), 24, "{name}: only the Request went out");
            // Just before the deadline nothing moves; the startup timer is not involved.
            pair.ini.conn.handle_timeout(hold_end - 1);
            pair.run();
            assert_eq!(pair.ini.wire.len(), 24, "{name}");
            assert_eq!(pair.ini.conn.state(), State::FullOperation, "{name}");
            if close_early {
                pair.ini.conn.close().unwrap();
                assert_eq!(pair.ini.conn.llp_close(), Some(LlpClose::Graceful));
            } else {
                pair.ini.conn.handle_timeout(hold_end);
                assert_eq!(pair.ini.conn.poll_timeout(), None, "{name}");
            }
            pair.run();
            assert_eq!(
                pair.rsp.ulpdus(),
                vec![b"one".to_vec(), b"two".to_vec()],
                "{name}: the held ULPDUs arrive in order, the RTR consumed"
            );
            let framing = Framing {
                crc: false,
                markers: false,
            };
            let sent = deframe(&pair.ini.wire[24..], framing);
            let rtr_count = usize::from(rtr.is_some());
            assert_eq!(sent.len(), 2 + rtr_count, "{name}");
            if rtr.is_some() {
                let first = Ulpdu::parse(&sent[0].0).unwrap();
                assert!(first.payload.is_empty(), "{name}: the RTR goes first");
            }
            if !close_early {
                pair.ini.conn.send_ulpdu(&[b"after"]).unwrap();
                assert_eq!(pair.ini.conn.held_ulpdus(), 0, "{name}");
                pair.run();
                assert_eq!(pair.rsp.ulpdus().last().unwrap(), b"after", "{name}");
            }
        }
    }
}

/// When the initiator's first-FPDU hold ends, its held ULPDUs leave one FPDU at a time:
/// `poll_transmit` offers the next only after the one before was written
/// (`transmit_done`), so a connection writes each as its own TCP segment. Framed all at
/// once they were one block that TCP cut every MSS octets across FPDU boundaries (found
/// on the wire with TAP segmentation offload). A ULPDU sent meanwhile queues behind
/// them, in order.
#[test]
fn held_ulpdus_leave_one_fpdu_at_a_time() {
    const DELAY: u64 = 20_000;
    let mut pair = Pair::new(
        MpaConfig {
            first_fpdu_delay_us: DELAY,
            ..cfg(s(|_| ()))
        },
        cfg(s(|_| ())),
        Chunks::Whole,
    );
    pair.run();
    assert!(pair.ini.established());
    let hold_end = pair.ini.conn.poll_timeout().expect("the hold's deadline");
    for u in [&b"one"[..], b"two", b"three"] {
        pair.ini.conn.send_ulpdu(&[u]).unwrap();
    }
    pair.run();
    assert_eq!(pair.ini.conn.held_ulpdus(), 3);
    pair.ini.conn.handle_timeout(hold_end);
    // One FPDU offered: length field, ULPDU, pad, CRC field (CRC off: zero).
    let fpdu = |u: &[u8]| {
        let mut v = Vec::new();
        Framer::new(NO_CRC).append(u, &mut v).unwrap();
        v
    };
    let mut out = Vec::new();
    for (i, u) in [&b"one"[..], b"two", b"three", b"four"].iter().enumerate() {
        let offered = pair.ini.conn.poll_transmit().expect("an FPDU").to_vec();
        assert_eq!(offered, fpdu(u), "FPDU {i} offered alone");
        if i == 0 {
            // Sent while two are still held: it queues behind them.
            pair.ini.conn.send_ulpdu(&[b"four"]).unwrap();
            assert_eq!(pair.ini.conn.held_ulpdus(), 3);
        }
        pair.ini.conn.transmit_done(offered.len()).unwrap();
        out.extend(offered);
    }
    assert!(pair.ini.conn.poll_transmit().is_none());
    assert_eq!(pair.ini.conn.held_ulpdus(), 0);
    pair.rsp.inbox.extend_from_slice(&out);
    pair.run();
    assert_eq!(
        pair.rsp.ulpdus(),
        vec![
            b"one".to_vec(),
            b"two".to_vec(),
            b"three".to_vec(),
            b"four".to_vec()
        ]
    );
}
