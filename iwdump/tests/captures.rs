//! Decoding the reference captures of kernel siw (shared/pcaps): counts, fields
//! and the one expected error.

mod common;

use std::collections::BTreeMap;

use iwdump::report::{CrcStatus, DdpInfo, ErrorKind, PduKind};
use iwdump::Report;

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn assert_clean(name: &str, r: &Report) {
    assert!(
        r.errors.is_empty(),
        "{name}: unexpected errors: {:#?}",
        r.errors
    );
    assert!(r.skipped.is_empty(), "{name}: skipped {:?}", r.skipped);
    // The only remark allowed: siw's non-zero PAD octets in perftest's 2-byte
    // Sends (one each way on the parameter-exchange connection).
    let pads: Vec<u64> = r
        .fpdu_records()
        .filter(|(_, f)| f.pad_nonzero)
        .map(|(p, _)| p.frame)
        .collect();
    let expected: &[u64] = match name {
        "ib_send_bw" => &[14, 15],
        "ib_write_bw" => &[15, 16],
        _ => &[],
    };
    assert_eq!(pads, expected, "{name}: FPDUs with non-zero PAD");
    assert_eq!(
        r.warnings.len(),
        pads.len(),
        "{name}: warnings {:?}",
        r.warnings
    );
    assert!(r.warnings.iter().all(|w| w.message.contains("PAD")));
}

#[test]
fn every_capture_decodes_cleanly_except_bad_crc() {
    for name in common::ALL {
        let r = common::dissect(name);
        assert!(r.fpdus > 0, "{name}: no FPDU decoded");
        assert!(!r.connections.is_empty(), "{name}: no MPA connection");
        for c in &r.connections {
            assert!(c.request.is_some() && c.reply.is_some(), "{name}: {c:?}");
        }
        if *name == "bad-crc.pcap" {
            continue;
        }
        assert_clean(name.trim_end_matches(".pcap"), &r);
    }
}

#[test]
fn bad_crc_reports_exactly_one_crc_error_at_frame_10() {
    let r = common::dissect("bad-crc.pcap");
    assert_eq!(r.errors.len(), 1, "{:#?}", r.errors);
    let e = &r.errors[0];
    assert_eq!(e.kind, ErrorKind::Crc);
    assert_eq!(e.frame, Some(10));
    assert!(e.offset.is_some());
    // Decoding went on after the bad CRC: same FPDU count as the clean capture.
    let clean = common::dissect("rping-srv_crc-cli_crc.pcap");
    assert_eq!(r.fpdus, clean.fpdus);
    assert_eq!(r.opcodes, clean.opcodes);
    let bad: Vec<_> = r
        .fpdu_records()
        .filter(|(_, f)| f.crc == CrcStatus::Bad)
        .map(|(p, _)| p.frame)
        .collect();
    assert_eq!(bad, vec![10]);
    // Every other FPDU of the CRC captures has a good CRC.
    assert!(clean.fpdu_records().all(|(_, f)| f.crc == CrcStatus::Good));
    assert_eq!(clean.connections[0].crc, Some(true));
}

#[test]
fn rping_counts() {
    let r = common::dissect("rping.pcap");
    assert_clean("rping", &r);
    let expected = counts(&[
        ("Write", 10),
        ("ReadRequest", 10),
        ("ReadResponse", 10),
        ("Send", 40),
    ]);
    assert_eq!(r.opcodes, expected);
    assert_eq!(r.messages, expected);
    assert_eq!(r.fpdus, 70);
    assert_eq!(r.connections.len(), 1);
    let c = &r.connections[0];
    assert_eq!(c.initiator.to_string(), "10.77.0.2:42307");
    assert_eq!(c.responder.to_string(), "10.77.0.1:7174");
    assert_eq!(c.crc, Some(false));
    assert_eq!(c.markers_to_initiator, Some(false));
    assert_eq!(c.markers_to_responder, Some(false));
    let req = c.request.as_ref().unwrap();
    assert_eq!(req.revision, 2);
    assert!(req.enhanced && !req.crc && !req.markers && !req.reject);
    assert_eq!(req.private_data_len, 4);
    // 10 x {Send, ReadRequest, ReadResponse, Send, Send, Write, Send}.
    assert_eq!(c.fpdus_from_initiator + c.fpdus_from_responder, 70);
    assert!(r
        .fpdu_records()
        .all(|(_, f)| f.crc == CrcStatus::Off && f.last));
}

/// perftest's parameter exchange over rdma_cm: small single-FPDU Sends, `n` each
/// way, MSN 1..=n in order, nothing else on that connection.
fn assert_exchange_sends(r: &Report, n: u32) {
    let exch = &r.connections[0];
    assert_eq!(
        (exch.fpdus_from_initiator, exch.fpdus_from_responder),
        (u64::from(n), u64::from(n))
    );
    for src in [exch.initiator, exch.responder] {
        let msns: Vec<u32> = r
            .fpdu_records()
            .filter(|(p, _)| p.tcp_id == exch.tcp_id && p.src == src)
            .map(|(_, f)| {
                assert_eq!(f.opcode, "Send");
                assert!(f.last && f.payload_len < 100, "{f:?}");
                let Some(DdpInfo::Untagged { qn: 0, msn, mo: 0 }) = f.ddp else {
                    panic!("{f:?}")
                };
                msn
            })
            .collect();
        assert_eq!(msns, (1..=n).collect::<Vec<_>>());
    }
}

#[test]
fn ib_write_bw_counts() {
    let r = common::dissect("ib_write_bw.pcap");
    assert_clean("ib_write_bw", &r);
    // perftest: a parameter-exchange connection (16 Sends each way), then the test QP.
    assert_eq!(r.connections.len(), 2);
    assert_eq!(r.opcodes, counts(&[("Write", 920), ("Send", 32)]));
    assert_eq!(r.messages, counts(&[("Write", 20), ("Send", 32)]));
    let exch = &r.connections[0];
    assert_eq!(exch.request.as_ref().unwrap().ird, Some(0));
    assert_eq!(exch.request.as_ref().unwrap().ord, Some(0));
    assert_eq!(
        (exch.fpdus_from_initiator, exch.fpdus_from_responder),
        (16, 16)
    );
    let test_qp = &r.connections[1];
    assert_eq!(
        (test_qp.fpdus_from_initiator, test_qp.fpdus_from_responder),
        (920, 0)
    );
    // 64 KiB = 45 full FPDUs (ULPDU 1442, tagged payload 1428) + 1 of 1276.
    let writes: Vec<_> = r
        .fpdu_records()
        .filter(|(_, f)| f.opcode == "Write")
        .collect();
    assert_eq!(writes.len(), 920);
    for msg in writes.chunks(46) {
        let mut to_expected = None;
        for (i, (p, f)) in msg.iter().enumerate() {
            let Some(DdpInfo::Tagged { to, .. }) = f.ddp else {
                panic!("untagged Write")
            };
            let base = *to_expected.get_or_insert(to);
            assert_eq!(to, base + 1428 * i as u64, "TO advances by 1428");
            if i < 45 {
                assert_eq!((f.ulpdu_len, f.payload_len, f.last), (1442, 1428, false));
                assert_eq!(p.wire_len, 1448);
            } else {
                assert_eq!((f.payload_len, f.last), (65536 - 45 * 1428, true));
            }
        }
    }
}

#[test]
fn ib_send_bw_counts() {
    let r = common::dissect("ib_send_bw.pcap");
    assert_clean("ib_send_bw", &r);
    assert_eq!(r.connections.len(), 2);
    // Test QP: 20 x 64 KiB Sends = 20 x 47 FPDUs (46 x 1424 + 32); parameter
    // exchange: 11 Sends each way; the server's 4 small Writes on the test QP.
    assert_eq!(r.opcodes, counts(&[("Send", 962), ("Write", 4)]));
    assert_eq!(r.messages, counts(&[("Send", 42), ("Write", 4)]));
    assert_exchange_sends(&r, 11);
    let test_qp = r.connections[1].tcp_id;
    let sends: Vec<_> = r
        .fpdu_records()
        .filter(|(p, f)| p.tcp_id == test_qp && f.opcode == "Send")
        .collect();
    assert_eq!(sends.len(), 940);
    for (msn, msg) in sends.chunks(47).enumerate() {
        for (i, (p, f)) in msg.iter().enumerate() {
            let Some(DdpInfo::Untagged { qn, msn: m, mo }) = f.ddp else {
                panic!("tagged Send")
            };
            assert_eq!((qn, m, mo), (0, msn as u32 + 1, 1424 * i as u32));
            if i < 46 {
                assert_eq!((f.ulpdu_len, f.payload_len, f.last), (1442, 1424, false));
                assert_eq!(p.wire_len, 1448);
            } else {
                assert_eq!((f.payload_len, f.last), (32, true));
            }
        }
    }
}

#[test]
fn p2p_rtr_and_ird_ord() {
    let r = common::dissect("rping-srv_p2p-cli_p2p.pcap");
    assert_clean("p2p", &r);
    let c = &r.connections[0];
    let req = c.request.as_ref().unwrap();
    let rep = c.reply.as_ref().unwrap();
    assert_eq!(req.ird_ord_words.as_deref(), Some("8001 c001"));
    assert_eq!(rep.ird_ord_words.as_deref(), Some("8001 8001"));
    assert_eq!((req.ird, req.ord), (Some(1), Some(1)));
    assert_eq!(req.p2p, Some(true));
    assert_eq!(
        (req.rtr_send, req.rtr_write, req.rtr_read),
        (Some(false), Some(true), Some(true))
    );
    assert_eq!((rep.ird, rep.ord), (Some(1), Some(1)));
    assert_eq!(rep.p2p, Some(true));
    assert_eq!(
        (rep.rtr_send, rep.rtr_write, rep.rtr_read),
        (Some(false), Some(true), Some(false))
    );
    assert_eq!((req.frame, rep.frame), (6, 8));
    // Frame 10: the RTR, a zero-length tagged Write, STag 1, TO 0, ULPDU length 14.
    let (p, f) = r
        .fpdu_records()
        .find(|(p, _)| p.frame == 10)
        .expect("an FPDU in frame 10");
    assert_eq!(p.src, c.initiator);
    assert_eq!(f.opcode, "Write");
    assert_eq!(f.ddp, Some(DdpInfo::Tagged { stag: 1, to: 0 }));
    assert_eq!((f.ulpdu_len, f.payload_len, f.last), (14, 0, true));
    // It is the initiator's first FPDU, before the first Send.
    let first = r
        .fpdu_records()
        .find(|(p, _)| p.src == c.initiator)
        .unwrap();
    assert_eq!(first.0.frame, 10);
    assert!(matches!(r.pdus[0].kind, PduKind::MpaRequest(_)));
}

#[test]
fn fpdus_tile_each_stream_exactly() {
    // The PDUs of each direction follow each other with no hole or overlap.
    for name in common::ALL {
        let r = common::dissect(name);
        let mut next: BTreeMap<(usize, String), u64> = BTreeMap::new();
        let mut pdus = r.pdus.clone();
        pdus.sort_by_key(|p| (p.tcp_id, p.src, p.offset));
        for p in &pdus {
            let key = (p.tcp_id, p.src.to_string());
            let at = next.entry(key).or_insert(0);
            assert_eq!(p.offset, *at, "{name}: {p:?}");
            *at += p.wire_len;
            assert!(p.first_frame <= p.frame);
        }
    }
}
