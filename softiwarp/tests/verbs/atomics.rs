//! RFC 7306 atomics through the verbs API between two real devices (engine threads,
//! memory link, MPA with CRC): Fetch-and-Add and Compare-and-Swap results and memory,
//! more atomics than ORD, the peer's Terminates as error completions, and atomics in
//! flight when the device goes away flushed exactly once.

use std::collections::BTreeSet;

use crate::support::devices::*;
use softiwarp::Mr;
use verbs::{AccessFlags, Payload, QpState, SendFlags, SendOp, SendWr, WcOpcode, WcStatus};

fn word(mr: &Mr, off: usize) -> u64 {
    let mut b = [0u8; 8];
    mr.read(off, &mut b).unwrap();
    u64::from_ne_bytes(b)
}

fn fetch_add(wr_id: u64, result: &Mr, slot: u64, target: &Mr, off: u64, add: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::AtomicFetchAdd {
            remote_addr: target.iova() + off,
            rkey: target.rkey(),
            add,
        },
        flags: SendFlags::SIGNALED,
        payload: Payload::Sges(vec![result.sge(8 * slot, 8)]),
    }
}

fn cmp_swap(wr_id: u64, result: &Mr, slot: u64, target: &Mr, compare: u64, swap: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::AtomicCmpSwap {
            remote_addr: target.iova(),
            rkey: target.rkey(),
            compare,
            swap,
        },
        flags: SendFlags::SIGNALED,
        payload: Payload::Sges(vec![result.sge(8 * slot, 8)]),
    }
}

#[test]
fn fetch_add_and_cmp_swap_over_two_devices() {
    let (a, b) = pair(&Setup::default());
    assert!(softiwarp::cm::provider::soft_caps(&softiwarp::DeviceAttr::SOFT).atomics);
    let target = b.pd.reg_mr(64, 0x7f00_0000_1000, atomic_access()).unwrap();
    let results = a.pd.reg_mr(64, 0x5000, AccessFlags::LOCAL_WRITE).unwrap();
    target.write(0, &1000u64.to_ne_bytes()).unwrap();
    let wrs = vec![
        fetch_add(1, &results, 0, &target, 0, 1),
        fetch_add(2, &results, 1, &target, 0, 0x8000_0000_0000_0000),
        // Compare with the value now: swapped.
        cmp_swap(3, &results, 2, &target, 0x8000_0000_0000_03e9, 7),
        // Compare with a stale value: unchanged, the current value returned.
        cmp_swap(4, &results, 3, &target, 1000, 9),
        cmp_swap(5, &results, 4, &target, 7, u64::MAX),
        fetch_add(6, &results, 5, &target, 0, 2),
    ];
    a.qp.post_send_list(wrs).unwrap();
    let wcs = a.send_wcs(6);
    let got: Vec<_> = wcs
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect();
    let fa = WcOpcode::FetchAdd;
    let cs = WcOpcode::CompSwap;
    let s = WcStatus::Success;
    assert_eq!(
        got,
        [
            (1, s, fa, 8),
            (2, s, fa, 8),
            (3, s, cs, 8),
            (4, s, cs, 8),
            (5, s, cs, 8),
            (6, s, fa, 8)
        ]
    );
    let values: Vec<u64> = (0..6).map(|i| word(&results, 8 * i)).collect();
    assert_eq!(values, [1000, 1001, 0x8000_0000_0000_03e9, 7, 7, u64::MAX]);
    assert_eq!(word(&target, 0), 1, "u64::MAX + 2 wraps to 1");
    assert_eq!(word(&target, 8), 0, "the next word is untouched");
    assert_eq!((a.qp.state(), b.qp.state()), (QpState::Rts, QpState::Rts));
    a.assert_quiet(std::time::Duration::from_millis(20));
}

#[test]
fn more_atomics_than_ord_are_queued_and_all_complete() {
    let s = Setup {
        ird_ord: (2, 2),
        cap: cap(64, 1),
        ..Setup::default()
    };
    let (a, b) = pair(&s);
    let target = b.pd.reg_mr(8, 0x10_0000, atomic_access()).unwrap();
    let results =
        a.pd.reg_mr(64 * 8, 0x20_0000, AccessFlags::LOCAL_WRITE)
            .unwrap();
    let wrs: Vec<SendWr> = (0..64)
        .map(|i| fetch_add(i, &results, i, &target, 0, 3))
        .collect();
    a.qp.post_send_list(wrs).unwrap();
    let wcs = a.send_wcs(64);
    for (i, wc) in wcs.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (i as u64, WcStatus::Success, WcOpcode::FetchAdd)
        );
    }
    // Executed in order: the i-th saw 3 * i.
    let values: Vec<u64> = (0..64).map(|i| word(&results, 8 * i)).collect();
    assert_eq!(values, (0..64).map(|i| 3 * i).collect::<Vec<u64>>());
    assert_eq!(word(&target, 0), 192);
    assert_ord_ird_respected(&a, &b, 2);
}

#[test]
fn the_peers_terminate_fails_the_atomic_and_flushes_the_rest() {
    // (target access, offset, expected vendor_err = Layer << 12 | EType << 8 | code)
    let cases = [
        // No REMOTE_ATOMIC on the MR: RDMAP Remote Protection, Access rights.
        (all_access(), 0, 0x0102),
        // One word past the MR's end: RDMAP Remote Protection, Base or bounds.
        (atomic_access(), 64, 0x0101),
    ];
    for (access, off, vendor) in cases {
        let (a, b) = pair(&Setup::default());
        let target = b.pd.reg_mr(64, 0x7f00_0000_0000, access).unwrap();
        target.write(0, &5u64.to_ne_bytes()).unwrap();
        let results = a.pd.reg_mr(16, 0x5000, AccessFlags::LOCAL_WRITE).unwrap();
        a.qp.post_send_list(vec![
            fetch_add(1, &results, 0, &target, off, 1),
            fetch_add(2, &results, 1, &target, 0, 1),
        ])
        .unwrap();
        let wcs = a.send_wcs(2);
        assert_eq!(
            wcs.iter()
                .map(|w| (w.wr_id, w.status, w.opcode, w.vendor_err))
                .collect::<Vec<_>>(),
            [
                (1, WcStatus::RemAccessErr, WcOpcode::FetchAdd, vendor),
                (2, WcStatus::WrFlushErr, WcOpcode::FetchAdd, 0),
            ],
            "access {access:?}, offset {off}"
        );
        a.wait_state(QpState::Error);
        b.wait_state(QpState::Error);
        assert_eq!(word(&target, 0), 5, "nothing executed");
        assert_eq!(results.to_vec(), vec![0u8; 16], "no result written");
    }
}

#[test]
fn atomics_in_flight_at_device_removal_are_flushed_exactly_once() {
    let s = Setup {
        ird_ord: (4, 4),
        cap: cap(256, 1),
        ..Setup::default()
    };
    let (a, b) = pair(&s);
    let target = b.pd.reg_mr(8, 0x10_0000, atomic_access()).unwrap();
    let results =
        a.pd.reg_mr(256 * 8, 0x20_0000, AccessFlags::LOCAL_WRITE)
            .unwrap();
    let posted = 200u64;
    let wrs: Vec<SendWr> = (0..posted)
        .map(|i| fetch_add(i, &results, i, &target, 0, 1))
        .collect();
    a.qp.post_send_list(wrs).unwrap();
    // Remove the requester's device while most are queued behind the ORD of 4.
    a.control.remove();
    let wcs = a.send_wcs(posted as usize);
    let ids: BTreeSet<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..posted).collect(), "every WR completed once");
    let ok: Vec<_> = wcs
        .iter()
        .filter(|w| w.status == WcStatus::Success)
        .collect();
    let flushed = wcs
        .iter()
        .filter(|w| w.status == WcStatus::WrFlushErr)
        .count();
    assert_eq!(ok.len() + flushed, posted as usize, "{wcs:?}");
    assert!(flushed > 0, "some were still in flight");
    assert!(wcs.iter().all(|w| w.opcode == WcOpcode::FetchAdd));
    // Successes are the first ones, each with its value; the rest are flushed.
    for (i, w) in ok.iter().enumerate() {
        assert_eq!(w.wr_id, i as u64);
        assert_eq!(word(&results, 8 * i), i as u64);
    }
    assert!(word(&target, 0) >= ok.len() as u64 && word(&target, 0) <= posted);
    a.wait_state(QpState::Error);
    // Nothing more ever arrives.
    a.assert_quiet(std::time::Duration::from_millis(50));
    drop(b);
}

#[test]
fn iwdump_decodes_a_captured_atomic_exchange() {
    let pcap = std::env::temp_dir().join(format!("sw-verbs-atomics-{}.pcap", std::process::id()));
    let s = Setup {
        pcap: Some(pcap.clone()),
        ..Setup::default()
    };
    let (a, b) = pair(&s);
    let target = b.pd.reg_mr(8, 0x7f00_0000_2000, atomic_access()).unwrap();
    target.write(0, &41u64.to_ne_bytes()).unwrap();
    let results = a.pd.reg_mr(16, 0x5000, AccessFlags::LOCAL_WRITE).unwrap();
    a.qp.post_send_list(vec![
        fetch_add(1, &results, 0, &target, 0, 1),
        cmp_swap(2, &results, 1, &target, 42, 7),
    ])
    .unwrap();
    let wcs = a.send_wcs(2);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(
        (word(&results, 0), word(&results, 8), word(&target, 0)),
        (41, 42, 7)
    );
    let stag = target.rkey().raw();
    drop(a);
    drop(b); // closes the device, flushing the pcap
    let report = iwdump::dissect_file(&pcap).expect("pcap");
    let _ = std::fs::remove_file(&pcap);
    assert!(report.errors.is_empty(), "{:?}", report.errors.first());
    assert_eq!(report.opcodes.get("AtomicRequest"), Some(&2));
    assert_eq!(report.opcodes.get("AtomicResponse"), Some(&2));
    let atomics: Vec<(std::net::IpAddr, String)> = report
        .fpdu_records()
        .filter(|(_, f)| f.opcode.starts_with("Atomic"))
        .map(|(p, f)| (p.src.ip(), f.detail.clone().unwrap_or_default()))
        .collect();
    // Each direction in order (how the two interleave depends on timing).
    let from = |ip: std::net::Ipv4Addr| -> Vec<&str> {
        atomics
            .iter()
            .filter(|(src, _)| *src == std::net::IpAddr::V4(ip))
            .map(|(_, d)| d.as_str())
            .collect()
    };
    assert_eq!(
        from(addr(1)),
        [
            format!("FetchAdd id 1 STag 0x{stag:08x} TO 0x7f0000002000 add 0x1 add mask 0x0"),
            format!(
                "CmpSwap id 2 STag 0x{stag:08x} TO 0x7f0000002000 compare 0x2a mask \
                 0xffffffffffffffff swap 0x7 mask 0xffffffffffffffff"
            ),
        ]
    );
    assert_eq!(
        from(addr(2)),
        ["id 1 original value 0x29", "id 2 original value 0x2a"]
    );
}
