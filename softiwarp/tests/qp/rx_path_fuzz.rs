//! The whole receive path (`softiwarp::testing::rx_path`: real MPA exchange, the QP
//! binding, the engine) under a hostile peer: a bounded proptest over every input mode
//! (the fuzz target `fuzz/fuzz_targets/rx_path.rs` runs the same harness unbounded),
//! and fixed inputs whose outcome is asserted exactly.

use ddp_rdmap::terminate::{DdpUntaggedCode, ErrorCause, LlpCode, RdmapProtectionCode};
use proptest::prelude::*;
use softiwarp::testing::rx_path::{self, Input, Mode, QueuePos, Record, IOVA_WRITE};
use verbs::{QpState, WcOpcode, WcStatus};

// Opcodes (RFC 5040 §4.2).
const WRITE: u8 = 0x0;
const READ_REQ: u8 = 0x1;
const READ_RESP: u8 = 0x2;
const SEND: u8 = 0x3;
const SEND_INV: u8 = 0x4;
const TERMINATE: u8 = 0x7;

/// Fix-up flags (see the harness's docs).
const STAG: u8 = 0x01;
const MSN: u8 = 0x10;
const RR_SRC: u8 = 0x20;
const TO: u8 = 0x40;
/// STag index in the flags: write, read, fast, local, recv.
const fn idx(i: u8) -> u8 {
    i << 1
}

/// A tagged segment (DDP `T=1 L DV=1`, RDMAP `RV=1`), STag and TO zero (fixed up).
fn tagged(opcode: u8, last: bool, to_low: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0x81 | if last { 0x40 } else { 0 }, 0x40 | opcode];
    v.extend([0; 4]);
    v.extend([0, 0, 0, 0, 0, 0, 0, to_low]);
    v.extend(payload);
    v
}

/// An untagged segment: Invalidate STag, QN, MSN, MO, payload.
fn untagged(opcode: u8, last: bool, qn: u32, msn: u32, mo: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0x01 | if last { 0x40 } else { 0 }, 0x40 | opcode];
    v.extend([0; 4]);
    v.extend(qn.to_be_bytes());
    v.extend(msn.to_be_bytes());
    v.extend(mo.to_be_bytes());
    v.extend(payload);
    v
}

fn rec(flags: u8, body: Vec<u8>) -> Record {
    Record {
        flags,
        corrupt_at: None,
        body,
    }
}

fn framed(markers: bool, device_initiator: bool, records: Vec<Record>) -> Vec<u8> {
    Input {
        markers,
        device_initiator,
        max_chunk: 15,
        chunk_seed: 0,
        mode: Mode::Framed(records),
    }
    .to_bytes()
}

fn status_of(o: &rx_path::Outcome, id: u64) -> (WcOpcode, WcStatus) {
    let hits: Vec<_> = o.completions.iter().filter(|c| c.0 == id).collect();
    assert_eq!(hits.len(), 1, "wr_id {id}: {:?}", o.completions);
    (hits[0].1, hits[0].2)
}

#[test]
fn no_input_leaves_the_qp_rts_and_the_flush_completes_every_wr() {
    for head in [0u8, 1, 2, 3] {
        let o = rx_path::run(&[head]);
        assert_eq!(o.state, QpState::Rts, "head {head}");
        assert_eq!(o.terminate, None);
        // Fast Register done; the Send went out; the Read waits for its response:
        // flushed, and so is the Write behind it (sent, but send WRs complete in
        // order).
        assert_eq!(status_of(&o, 1), (WcOpcode::RegMr, WcStatus::Success));
        assert_eq!(status_of(&o, 2), (WcOpcode::Send, WcStatus::Success));
        assert_eq!(status_of(&o, 3), (WcOpcode::RdmaRead, WcStatus::WrFlushErr));
        assert_eq!(
            status_of(&o, 4),
            (WcOpcode::RdmaWrite, WcStatus::WrFlushErr)
        );
        for id in 100..104 {
            assert_eq!(status_of(&o, id), (WcOpcode::Recv, WcStatus::WrFlushErr));
        }
        // Send, Read Request, Write (the Fast Register is local); a responder holds
        // them until the initiator's first FPDU (RFC 5044 §7.1.2), which never comes.
        assert_eq!(
            o.ulpdus_sent,
            if head & 2 != 0 { 3 } else { 0 },
            "head {head}"
        );
    }
}

#[test]
fn framed_send_write_and_read_response_complete_in_every_setup() {
    for head in 0..4u8 {
        let records = vec![
            rec(MSN, untagged(SEND, false, 0, 0, 0, b"hel")),
            rec(MSN, untagged(SEND, true, 0, 0, 0, b"lo")),
            rec(STAG | idx(0) | TO, tagged(WRITE, true, 10, b"written")),
            rec(STAG | idx(2) | TO, tagged(WRITE, true, 0, b"fast")),
            rec(STAG | idx(4) | TO, tagged(READ_RESP, true, 208, &[7u8; 40])),
        ];
        let o = rx_path::run(&framed(head & 1 != 0, head & 2 != 0, records));
        assert_eq!(o.state, QpState::Rts, "head {head}: {o:?}");
        assert_eq!(o.terminate, None);
        assert_eq!(o.ulpdus_received, 5);
        assert_eq!(status_of(&o, 100), (WcOpcode::Recv, WcStatus::Success));
        assert_eq!(status_of(&o, 101), (WcOpcode::Recv, WcStatus::WrFlushErr));
        assert_eq!(status_of(&o, 3), (WcOpcode::RdmaRead, WcStatus::Success));
        assert_eq!(status_of(&o, 4), (WcOpcode::RdmaWrite, WcStatus::Success));
    }
}

#[test]
fn write_to_the_read_only_mr_is_terminated_with_an_access_violation() {
    let records = vec![rec(STAG | idx(1) | TO, tagged(WRITE, true, 0, b"nope"))];
    let o = rx_path::run(&framed(false, false, records));
    assert_eq!(o.state, QpState::Error);
    assert_eq!(
        o.terminate,
        Some(Some(ErrorCause::RdmapRemoteProtection(
            RdmapProtectionCode::AccessRightsViolation
        )))
    );
    for id in 100..104 {
        assert_eq!(status_of(&o, id), (WcOpcode::Recv, WcStatus::WrFlushErr));
    }
}

#[test]
fn a_send_with_the_wrong_msn_is_terminated() {
    // Four receives are posted, the next MSN is 1 (RFC 5041 §7.2; ddp_rdmap::reassembly):
    // MSN 2 is ahead within the posted buffers, MSN 9 past them.
    for (msn, code) in [
        (2, DdpUntaggedCode::InvalidMsnRange),
        (9, DdpUntaggedCode::InvalidMsnNoBuffer),
    ] {
        let records = vec![rec(0, untagged(SEND, true, 0, msn, 0, b"x"))];
        let o = rx_path::run(&framed(true, true, records));
        assert_eq!(o.state, QpState::Error);
        assert_eq!(
            o.terminate,
            Some(Some(ErrorCause::DdpUntagged(code))),
            "MSN {msn}"
        );
        assert_eq!(status_of(&o, 100), (WcOpcode::Recv, WcStatus::WrFlushErr));
    }
}

#[test]
fn a_corrupted_fpdu_is_terminated_with_the_mpa_crc_error() {
    for markers in [false, true] {
        let mut r = rec(MSN, untagged(SEND, true, 0, 0, 0, b"hello"));
        // Byte 20 of the FPDU is in the ULPDU (past the MPA length and the header).
        r.corrupt_at = Some(20);
        let bytes = Input {
            markers,
            device_initiator: false,
            max_chunk: 3,
            chunk_seed: 9,
            mode: Mode::Mixed(vec![r]),
        }
        .to_bytes();
        let o = rx_path::run(&bytes);
        assert_eq!(o.state, QpState::Error);
        assert_eq!(o.terminate, Some(Some(ErrorCause::Llp(LlpCode::CrcError))));
        assert_eq!(o.ulpdus_received, 0);
    }
}

#[test]
fn the_peers_terminate_ends_the_qp_without_one_of_ours() {
    // Terminate Control: layer RDMAP, etype Remote Operation, code 0 (no header copied).
    let mut t = untagged(TERMINATE, true, 2, 1, 0, &[0x02, 0x00, 0x00, 0x00]);
    t.truncate(22);
    let o = rx_path::run(&framed(false, false, vec![rec(0, t)]));
    assert_eq!(o.state, QpState::Error);
    assert_eq!(o.terminate, None);
    assert!(o.peer_terminated);
}

#[test]
fn a_bad_fpdu_behind_the_peers_terminate_in_the_same_read_sends_nothing() {
    // The peer's Terminate, then (in the same TCP read) an FPDU with a bad CRC: MPA
    // deframes both, but the connection is aborted at the Terminate, so the LLP
    // Terminate MPA queues for the bad FPDU never leaves (found by the fuzzer when the
    // harness still wrote an aborted connection's queue; `Conn::tx` resets it first).
    let term = untagged(TERMINATE, true, 2, 1, 0, &[0x00, 0x00, 0x00, 0x00]);
    let mut bad = rec(MSN, untagged(SEND, true, 0, 0, 0, b"late"));
    bad.corrupt_at = Some(30);
    let bytes = Input {
        markers: true,
        device_initiator: false,
        max_chunk: 15,
        chunk_seed: 2,
        mode: Mode::Mixed(vec![
            rec(MSN, untagged(SEND, true, 0, 0, 0, b"hello")),
            rec(0, term),
            bad,
        ]),
    }
    .to_bytes();
    let o = rx_path::run(&bytes);
    assert_eq!(o.state, QpState::Error);
    assert_eq!(o.terminate, None);
    assert!(o.peer_terminated);
    assert_eq!(o.ulpdus_received, 2);
    assert_eq!(status_of(&o, 100), (WcOpcode::Recv, WcStatus::Success));
    assert_eq!(status_of(&o, 101), (WcOpcode::Recv, WcStatus::WrFlushErr));
}

#[test]
fn a_bad_fpdu_behind_an_unreadable_terminate_is_not_answered() {
    // Found by the fuzz target (minimized by hand): markers, the device responds, one
    // TCP read of three FPDUs: a Read Response into the sink, then an opcode-7 ULPDU on
    // QN 0x15161718 with MO 0xa500 (the stack's `ulpdu::terminate_cause` does not read
    // it, the QP takes it as the peer's Terminate, RFC 5040 §7), then an FPDU with a
    // bad CRC. The stack used to answer the bad FPDU with the LLP CRC Terminate; now
    // the QP's stream has ended (`Ulp::stream_ended`) and nothing is sent.
    let mut term = vec![
        0x41, 0x47, 0, 0, 0, 0x14, 0x15, 0x16, 0x17, 0x18, 0x20, 0x25, 0,
    ];
    term.extend([0, 0, 0, 0xa5, 0, 0, 0, 0, 0]);
    let mut bad = rec(MSN, untagged(SEND, true, 0, 0, 0, b"late"));
    bad.corrupt_at = Some(30);
    let bytes = Input {
        markers: true,
        device_initiator: false,
        max_chunk: 13,
        chunk_seed: 2,
        mode: Mode::Mixed(vec![
            rec(STAG | idx(4) | TO, tagged(READ_RESP, true, 208, &[9u8; 40])),
            rec(0, term),
            bad,
        ]),
    }
    .to_bytes();
    let o = rx_path::run(&bytes);
    assert_eq!(o.state, QpState::Error);
    assert_eq!(o.terminate, None, "nothing answers the peer's Terminate");
    assert!(o.peer_terminated);
    assert_eq!(o.ulpdus_received, 2);
    assert_eq!(status_of(&o, 3), (WcOpcode::RdmaRead, WcStatus::Success));
    assert_eq!(status_of(&o, 100), (WcOpcode::Recv, WcStatus::WrFlushErr));
}

#[test]
fn a_bad_fpdu_behind_the_qps_own_error_reports_the_first_error() {
    // A Write to the read-only MR, then (same read) an FPDU with a bad CRC: the one
    // Terminate sent is the QP's for the first error, not MPA's for the second.
    let mut bad = rec(MSN, untagged(SEND, true, 0, 0, 0, b"late"));
    bad.corrupt_at = Some(30);
    let bytes = Input {
        markers: false,
        device_initiator: true,
        max_chunk: 15,
        chunk_seed: 0,
        mode: Mode::Mixed(vec![
            rec(STAG | idx(1) | TO, tagged(WRITE, true, 0, b"nope")),
            bad,
        ]),
    }
    .to_bytes();
    let o = rx_path::run(&bytes);
    assert_eq!(o.state, QpState::Error);
    assert_eq!(
        o.terminate,
        Some(Some(ErrorCause::RdmapRemoteProtection(
            RdmapProtectionCode::AccessRightsViolation
        )))
    );
}

#[test]
fn the_peers_fin_after_a_send_flushes_without_a_terminate() {
    for device_initiator in [false, true] {
        let bytes = Input {
            markers: false,
            device_initiator,
            max_chunk: 6,
            chunk_seed: 1,
            mode: Mode::FramedThenFin(vec![rec(MSN, untagged(SEND, true, 0, 0, 0, b"bye"))]),
        }
        .to_bytes();
        let o = rx_path::run(&bytes);
        assert_eq!(o.state, QpState::Error, "initiator {device_initiator}");
        assert_eq!(o.terminate, None);
        assert!(o.peer_closed && !o.peer_terminated);
        assert_eq!(status_of(&o, 100), (WcOpcode::Recv, WcStatus::Success));
        assert_eq!(status_of(&o, 101), (WcOpcode::Recv, WcStatus::WrFlushErr));
        assert_eq!(status_of(&o, 3), (WcOpcode::RdmaRead, WcStatus::WrFlushErr));
    }
}

#[test]
fn raw_garbage_after_the_mpa_exchange_is_terminated() {
    let mut bytes = vec![0u8, 0];
    bytes.extend([0x00, 0x10, 0xde, 0xad, 0xbe, 0xef]);
    bytes.extend([0x55; 40]);
    let o = rx_path::run(&bytes);
    assert_eq!(o.state, QpState::Error);
    assert_eq!(o.terminate, Some(Some(ErrorCause::Llp(LlpCode::CrcError))));
}

// ---------------------------------------------------------------- the proptest

/// ULPDU bodies: well-formed templates of every opcode (then mutated) and noise.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let template = (
        0u8..8,
        any::<bool>(),
        any::<u8>(),
        proptest::collection::vec(any::<u8>(), 0..48),
    )
        .prop_map(|(kind, last, low, payload)| match kind {
            0 => tagged(WRITE, last, low, &payload),
            1 => tagged(READ_RESP, last, low, &payload),
            2 => untagged(SEND, last, 0, 0, u32::from(low & 0x3f), &payload),
            3 => untagged(SEND_INV, last, 0, 0, 0, &payload),
            4 => {
                let mut b = vec![0u8; 28];
                b[12..16].copy_from_slice(&u32::from(low).to_be_bytes());
                b[27] = low;
                untagged(READ_REQ, true, 1, 0, 0, &b)
            }
            5 => untagged(TERMINATE, true, 2, 1, 0, &payload),
            6 => untagged(SEND, true, u32::from(low), 1, 0, &payload),
            _ => payload,
        });
    let mutated = (
        template,
        proptest::collection::vec((any::<u8>(), any::<u8>()), 0..3),
    )
        .prop_map(|(mut b, flips)| {
            for (at, x) in flips {
                if !b.is_empty() {
                    let i = usize::from(at) % b.len();
                    b[i] ^= x;
                }
            }
            b
        });
    prop_oneof![4 => mutated, 1 => proptest::collection::vec(any::<u8>(), 0..64)]
}

/// A well-formed record with the fix-ups it needs to reach its target: Sends (in one or
/// more segments), Writes to each MR (legal for `write` and `fast`), the Read Response
/// to the device's Read, Read Requests of `read` and `fast`, Send with Invalidate of
/// `fast`.
fn good_record() -> impl Strategy<Value = Record> {
    (
        0u8..7,
        any::<bool>(),
        any::<u8>(),
        proptest::collection::vec(any::<u8>(), 0..48),
    )
        .prop_map(|(kind, last, low, payload)| match kind {
            0 => rec(MSN, untagged(SEND, last, 0, 0, 0, &payload)),
            1 => rec(STAG | TO | idx(low % 5), tagged(WRITE, last, low, &payload)),
            2 => rec(
                STAG | TO | idx(low % 3 * 2),
                tagged(WRITE, last, low % 200, &payload),
            ),
            3 => {
                let len = payload.len().min(40);
                rec(
                    STAG | TO | idx(4),
                    tagged(READ_RESP, last, 208, &payload[..len]),
                )
            }
            4 => {
                let mut b = vec![0u8; 28];
                b[12..16].copy_from_slice(&u32::from(low % 64).to_be_bytes());
                b[27] = low % 128;
                rec(
                    MSN | STAG | TO | RR_SRC | idx(1 + low % 2),
                    untagged(READ_REQ, true, 1, 0, 0, &b),
                )
            }
            5 => rec(
                MSN | STAG | idx(2),
                untagged(SEND_INV, true, 0, 0, 0, &payload),
            ),
            _ => rec(MSN, untagged(SEND, true, 0, 0, 0, &payload)),
        })
}

fn record() -> impl Strategy<Value = Record> {
    let fuzzed = (
        any::<u8>(),
        proptest::option::weighted(0.2, any::<u8>()),
        body(),
    )
        .prop_map(|(flags, corrupt_at, body)| Record {
            // Mostly with the MSN fix-up: more messages get past DDP.
            flags: (flags & 0x7f) | if flags & 0x80 != 0 { MSN } else { 0 },
            corrupt_at,
            body,
        });
    let good = (good_record(), proptest::option::weighted(0.1, any::<u8>()))
        .prop_map(|(r, corrupt_at)| Record { corrupt_at, ..r });
    prop_oneof![3 => good, 1 => fuzzed]
}

fn input() -> impl Strategy<Value = Input> {
    let records = || proptest::collection::vec(record(), 0..8);
    let mode = prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..200).prop_map(Mode::Raw),
        3 => records().prop_map(Mode::Framed),
        2 => records().prop_map(Mode::Mixed),
        1 => records().prop_map(Mode::FramedThenFin),
    ];
    (any::<bool>(), any::<bool>(), 0u8..16, any::<u8>(), mode).prop_map(
        |(markers, device_initiator, max_chunk, chunk_seed, mode)| Input {
            markers,
            device_initiator,
            max_chunk,
            chunk_seed,
            mode,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// Every input keeps the harness's invariants (`rx_path::run` panics otherwise).
    #[test]
    fn every_input_keeps_the_invariants(input in input()) {
        let o = rx_path::run(&input.to_bytes());
        // What `run` asserts, spelled out for the two ends.
        prop_assert!(matches!(o.state, QpState::Rts | QpState::Error));
        if o.state == QpState::Rts {
            prop_assert_eq!(o.terminate, None);
        }
    }
}

#[test]
fn the_fixups_patch_stags_tos_msns_and_mos() {
    // The TO fix-up adds the TO's last byte to the chosen MR's iova.
    let stags = [(0, IOVA_WRITE); 8];
    let mut body = tagged(WRITE, true, 5, b"x");
    let mut queues = [QueuePos { msn: 1, mo: 0 }; 3];
    rx_path::apply_fixups(TO, &mut body, &stags, &mut queues);
    assert_eq!(body[6..14], (IOVA_WRITE + 5).to_be_bytes());
    let mut rr = untagged(READ_REQ, true, 1, 0, 0, &[0u8; 28]);
    rr[45] = 3;
    rx_path::apply_fixups(TO | RR_SRC | STAG, &mut rr, &stags, &mut queues);
    assert_eq!(rr[38..46], (IOVA_WRITE + 3).to_be_bytes());
    assert_eq!(rr[2..6], [0; 4], "only the source STag is patched");
    assert_eq!(
        queues[1],
        QueuePos { msn: 1, mo: 0 },
        "MSN 0 was sent: 1 is next"
    );
    // A Send in two segments: the MSN fix-up gives both MSN 1, the second MO 3.
    let mut first = untagged(SEND, false, 0, 7, 7, b"abc");
    let mut second = untagged(SEND, true, 0, 7, 7, b"de");
    rx_path::apply_fixups(MSN, &mut first, &stags, &mut queues);
    rx_path::apply_fixups(MSN, &mut second, &stags, &mut queues);
    assert_eq!(first[10..18], [0, 0, 0, 1, 0, 0, 0, 0]);
    assert_eq!(second[10..18], [0, 0, 0, 1, 0, 0, 0, 3]);
    assert_eq!(queues[0], QueuePos { msn: 2, mo: 0 });
}
