//! RFC 7306 atomics between two QP engines (sans-IO): results and memory, the wire
//! bytes, ORD and IRD shared with RDMA Reads, ordering behind a Read, the responder's
//! Terminates (misaligned, out of bounds, no `REMOTE_ATOMIC`), a bad response, flush.

use crate::support::qp::{Pair, Side, MULPDU};
use crate::support::{all_access, atomic_access, cap};
use ddp_rdmap::rdmap::{AtomicRequestRepr, AtomicResponseRepr};
use ddp_rdmap::terminate::{ErrorCause, RdmapOperationCode, RdmapProtectionCode};
use ddp_rdmap::{Body, Opcode, Ulpdu};
use softiwarp::rdmap::engine::{QpEvent, RxError};
use softiwarp::resources::stag_table::MemoryRegion;
use verbs::{
    AccessFlags, Payload, QpState, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};

/// The target MR's iova at B, and the requester's result MR's iova at A.
const TARGET: u64 = 0x7f3a_5c00_0000;
const RESULTS: u64 = 0x5000;

fn word(mr: &MemoryRegion, off: usize) -> u64 {
    let mut b = [0u8; 8];
    mr.read(off, &mut b).unwrap();
    u64::from_ne_bytes(b)
}

fn set_word(mr: &MemoryRegion, off: usize, v: u64) {
    mr.write(off, &v.to_ne_bytes()).unwrap();
}

fn fetch_add(wr_id: u64, result: Sge, remote_addr: u64, rkey: verbs::Stag, add: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::AtomicFetchAdd {
            remote_addr,
            rkey,
            add,
        },
        flags: SendFlags::SIGNALED,
        payload: Payload::Sges(vec![result]),
    }
}

fn cmp_swap(
    wr_id: u64,
    result: Sge,
    remote_addr: u64,
    rkey: verbs::Stag,
    compare: u64,
    swap: u64,
) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::AtomicCmpSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        },
        flags: SendFlags::SIGNALED,
        payload: Payload::Sges(vec![result]),
    }
}

/// A pair with a 64-byte target MR at B (`access`) and a 64-byte result MR at A.
fn setup(
    access: AccessFlags,
    ta: impl FnOnce(&mut softiwarp::rdmap::engine::QpInit),
    tb: impl FnOnce(&mut softiwarp::rdmap::engine::QpInit),
) -> (
    Pair,
    std::sync::Arc<MemoryRegion>,
    std::sync::Arc<MemoryRegion>,
) {
    let p = Pair::with(cap(16, 2), ta, tb);
    let target = p.b.reg(TARGET, 64, access);
    let results = p.a.reg(RESULTS, 64, AccessFlags::LOCAL_WRITE);
    (p, target, results)
}

fn result_sge(results: &MemoryRegion, slot: u64) -> Sge {
    Sge::new(RESULTS + 8 * slot, 8, results.stag())
}

fn ok(wr_id: u64, opcode: WcOpcode) -> (u64, WcStatus, WcOpcode, u32) {
    (wr_id, WcStatus::Success, opcode, 8)
}

fn summary(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus, WcOpcode, u32)> {
    wcs.iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect()
}

#[test]
fn fetch_add_and_cmp_swap_return_the_original_value_and_update_the_target() {
    let (mut p, target, results) = setup(atomic_access(), |_| {}, |_| {});
    let rkey = target.stag();
    set_word(&target, 8, 10);
    let at = TARGET + 8;
    let wrs = [
        fetch_add(1, result_sge(&results, 0), at, rkey, 5),
        // Adding 2^64 - 1 is subtracting 1 (modulo 2^64).
        fetch_add(2, result_sge(&results, 1), at, rkey, u64::MAX),
        cmp_swap(3, result_sge(&results, 2), at, rkey, 14, 100),
        // Mismatch: memory unchanged, the original value still returned.
        cmp_swap(4, result_sge(&results, 3), at, rkey, 7, 1),
        fetch_add(5, result_sge(&results, 4), at, rkey, 0x1_0000_0000),
    ];
    for wr in wrs {
        p.a.qp.post_send(wr).unwrap();
    }
    p.pump();
    assert!(p.rx_errors.is_empty(), "{:?}", p.rx_errors);
    assert_eq!(
        summary(&p.a.send_wcs()),
        [
            ok(1, WcOpcode::FetchAdd),
            ok(2, WcOpcode::FetchAdd),
            ok(3, WcOpcode::CompSwap),
            ok(4, WcOpcode::CompSwap),
            ok(5, WcOpcode::FetchAdd),
        ]
    );
    let got: Vec<u64> = (0..5).map(|i| word(&results, 8 * i)).collect();
    assert_eq!(got, [10, 15, 14, 100, 100]);
    assert_eq!(word(&target, 8), 100 + 0x1_0000_0000);
    assert_eq!(word(&target, 0), 0, "neighbouring words untouched");
    assert_eq!(word(&target, 16), 0);
    assert!(p.b.recv_wcs().is_empty() && p.b.send_wcs().is_empty());
    assert_eq!(
        (p.a.qp.state(), p.b.qp.state()),
        (QpState::Rts, QpState::Rts)
    );
}

#[test]
fn the_request_and_response_on_the_wire() {
    let (mut p, target, results) = setup(atomic_access(), |_| {}, |_| {});
    set_word(&target, 0, 7);
    p.a.qp
        .post_send(cmp_swap(
            9,
            result_sge(&results, 0),
            TARGET,
            target.stag(),
            7,
            0x1122_3344_5566_7788,
        ))
        .unwrap();
    let req = p.a.drain_tx(MULPDU);
    assert_eq!(req.len(), 1);
    let r = &req[0];
    assert_eq!(r.len(), 70);
    // DDP untagged, L, RDMAP opcode 0xA; QN 1, MSN 1, MO 0.
    assert_eq!(
        &r[..18],
        &[0x41, 0x4a, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]
    );
    let expected =
        AtomicRequestRepr::cmp_swap(1, target.stag().raw(), TARGET, 7, 0x1122_3344_5566_7788);
    assert_eq!(&r[18..], &expected.to_bytes());
    p.b.qp.handle_ulpdu(r).unwrap();
    let resp = p.b.drain_tx(MULPDU);
    assert_eq!(resp.len(), 1);
    // QN 3, MSN 1; Original Request Identifier 1, Original Remote Data Value 7.
    assert_eq!(
        &resp[0][..18],
        &[0x41, 0x4b, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0]
    );
    let body = AtomicResponseRepr {
        request_id: 1,
        original_value: 7,
    };
    assert_eq!(&resp[0][18..], &body.to_bytes());
    p.a.qp.handle_ulpdu(&resp[0]).unwrap();
    assert_eq!(summary(&p.a.send_wcs()), [ok(9, WcOpcode::CompSwap)]);
    assert_eq!(word(&results, 0), 7);
    assert_eq!(word(&target, 0), 0x1122_3344_5566_7788);
}

#[test]
fn atomics_and_reads_share_the_ord_and_all_complete() {
    // ORD 2 at A: of 6 atomics and a Read, at most two requests are ever outstanding.
    let (mut p, target, results) = setup(atomic_access(), |i| i.ord = 2, |i| i.ird = 2);
    let rkey = target.stag();
    let read_sink = p.a.reg(0x9000, 8, AccessFlags::LOCAL_WRITE);
    for i in 0..6u64 {
        p.a.qp
            .post_send(fetch_add(i, result_sge(&results, i), TARGET, rkey, 1))
            .unwrap();
        if i == 2 {
            let read = SendWr::rdma_read(
                100,
                vec![Sge::new(0x9000, 8, read_sink.stag())],
                TARGET,
                rkey,
            )
            .with_flags(SendFlags::SIGNALED);
            p.a.qp.post_send(read).unwrap();
        }
    }
    // A sends all it may before any response: two requests.
    while p.tx_a() {}
    assert_eq!((p.a_to_b.len(), p.a.qp.reads_outstanding()), (2, 2));
    let mut max_out = 0;
    loop {
        let mut any = p.rx_b() | p.tx_b() | p.rx_a();
        while p.tx_a() {
            any = true;
        }
        max_out = max_out.max(p.a.qp.reads_outstanding());
        if !any {
            break;
        }
    }
    assert_eq!(max_out, 2, "ORD reached, never passed");
    assert!(p.rx_errors.is_empty(), "{:?}", p.rx_errors);
    let wcs = p.a.send_wcs();
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [0, 1, 2, 100, 3, 4, 5], "completions in posting order");
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    let got: Vec<u64> = (0..6).map(|i| word(&results, 8 * i)).collect();
    assert_eq!(got, [0, 1, 2, 3, 4, 5], "each saw the one before it");
    assert_eq!(
        word(&read_sink, 0),
        3,
        "the Read saw the three atomics before it"
    );
    assert_eq!(word(&target, 0), 6);
}

#[test]
fn an_atomic_behind_a_queued_read_executes_after_the_read_took_its_data() {
    let (mut p, target, results) = setup(atomic_access(), |_| {}, |_| {});
    let rkey = target.stag();
    set_word(&target, 0, 40);
    let sink = p.a.reg(0x9000, 8, AccessFlags::LOCAL_WRITE);
    p.a.qp
        .post_send(
            SendWr::rdma_read(1, vec![Sge::new(0x9000, 8, sink.stag())], TARGET, rkey)
                .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
    p.a.qp
        .post_send(fetch_add(2, result_sge(&results, 0), TARGET, rkey, 2))
        .unwrap();
    // Both requests reach B before it answers either.
    assert!(p.tx_a() && p.tx_a());
    let ops: Vec<_> = p
        .a_to_b
        .iter()
        .map(|u| Ulpdu::parse(u).unwrap().opcode())
        .collect();
    assert_eq!(ops, [Opcode::ReadRequest, Opcode::AtomicRequest]);
    assert!(p.rx_b() && p.rx_b());
    assert!(p.rx_errors.is_empty(), "{:?}", p.rx_errors);
    assert_eq!(
        word(&target, 0),
        40,
        "not executed while a Read is queued ahead"
    );
    assert_eq!(p.b.qp.read_responses_pending(), 2);
    p.pump();
    assert_eq!(
        word(&sink, 0),
        40,
        "the Read Response has the value before the atomic"
    );
    assert_eq!(word(&results, 0), 40);
    assert_eq!(word(&target, 0), 42);
    let wcs = p.a.send_wcs();
    assert_eq!(wcs.len(), 2);
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::Success));
}

#[test]
fn atomic_requests_beyond_ird_get_the_no_buffer_terminate() {
    let (mut p, target, results) = setup(atomic_access(), |i| i.ord = 4, |i| i.ird = 1);
    for i in 0..2 {
        p.a.qp
            .post_send(fetch_add(
                i,
                result_sge(&results, i),
                TARGET,
                target.stag(),
                1,
            ))
            .unwrap();
    }
    assert!(p.tx_a() && p.tx_a());
    // B executed the first and has not answered it yet; the second has no credit.
    p.rx_b();
    p.rx_b();
    assert_eq!(
        p.rx_errors,
        [(
            'b',
            RxError::Protocol {
                cause: ErrorCause::DdpUntagged(
                    ddp_rdmap::terminate::DdpUntaggedCode::InvalidMsnNoBuffer
                )
            }
        )]
    );
    assert_eq!(p.b.qp.state(), QpState::Error);
}

/// B's Terminate for an Atomic Request that A sent (possibly edited on the way by
/// `edit`), A's completion of it, and both QPs in Error.
fn refused(
    access: AccessFlags,
    tb: impl FnOnce(&mut softiwarp::rdmap::engine::QpInit),
    remote: impl FnOnce(&MemoryRegion) -> (u64, verbs::Stag),
    edit: impl FnOnce(&mut Vec<u8>),
    cause: ErrorCause,
) {
    let (mut p, target, results) = setup(access, |_| {}, tb);
    set_word(&target, 0, 77);
    let (addr, rkey) = remote(&target);
    p.a.qp
        .post_send(fetch_add(1, result_sge(&results, 0), addr, rkey, 1))
        .unwrap();
    p.a.qp
        .post_send(fetch_add(
            2,
            result_sge(&results, 1),
            TARGET,
            target.stag(),
            1,
        ))
        .unwrap();
    assert!(p.tx_a());
    let mut req = p.a_to_b.pop_front().unwrap();
    edit(&mut req);
    let sent = req.clone();
    assert_eq!(p.b.qp.handle_ulpdu(&req), Err(RxError::Protocol { cause }));
    let term = p.b.drain_tx(MULPDU);
    assert_eq!(term.len(), 1, "the Terminate, and nothing after it");
    let t = Ulpdu::parse(&term[0]).unwrap();
    assert_eq!(t.opcode(), Opcode::Terminate);
    let Body::Terminate(body) = t.body else {
        panic!("not a Terminate")
    };
    assert_eq!(body.cause, cause);
    // The DDP header of the offending request is copied (D), with its length (M).
    let ddp = body.ddp.expect("DDP header copied");
    assert_eq!(ddp.segment_length, Some(70));
    assert_eq!(&term[0][18 + 6..18 + 24], &sent[..18]);
    assert_eq!(p.b.qp.state(), QpState::Error);
    assert!(p.b.events().contains(&QpEvent::TerminateQueued { cause }));
    assert_eq!(word(&target, 0), 77, "nothing executed");
    // A learns it from the Terminate: the atomic errs, the next one is flushed.
    let _ = p.a.qp.handle_ulpdu(&term[0]);
    let wcs = p.a.send_wcs();
    let vendor = (u32::from(cause.layer_value()) << 12)
        | (u32::from(cause.etype()) << 8)
        | u32::from(cause.code());
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.vendor_err))
            .collect::<Vec<_>>(),
        [
            (1, WcStatus::RemAccessErr, WcOpcode::FetchAdd, vendor),
            (2, WcStatus::WrFlushErr, WcOpcode::FetchAdd, 0),
        ]
    );
    assert_eq!(p.a.qp.state(), QpState::Error);
    assert_eq!(word(&results, 0), 0, "no result written");
}

fn protection(code: RdmapProtectionCode) -> ErrorCause {
    ErrorCause::RdmapRemoteProtection(code)
}

#[test]
fn a_misaligned_target_is_refused_with_base_or_bounds() {
    // post_send refuses a misaligned remote_addr, so the request is edited on the
    // way: Remote Tagged Offset (bytes 30..38 of the ULPDU) + 4.
    refused(
        atomic_access(),
        |_| {},
        |t| (TARGET, t.stag()),
        |u| u[37] += 4,
        protection(RdmapProtectionCode::BaseOrBoundsViolation),
    );
}

#[test]
fn an_out_of_bounds_target_is_refused_with_base_or_bounds() {
    // The last word of the 64-byte MR is fine, the one after is not.
    refused(
        atomic_access(),
        |_| {},
        |t| (TARGET + 64, t.stag()),
        |_| {},
        protection(RdmapProtectionCode::BaseOrBoundsViolation),
    );
}

#[test]
fn a_target_without_remote_atomic_is_refused_with_access_rights() {
    refused(
        all_access(),
        |_| {},
        |t| (TARGET, t.stag()),
        |_| {},
        protection(RdmapProtectionCode::AccessRightsViolation),
    );
}

#[test]
fn a_qp_without_remote_atomic_refuses_with_access_rights() {
    refused(
        atomic_access(),
        |i| i.access = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        |t| (TARGET, t.stag()),
        |_| {},
        protection(RdmapProtectionCode::AccessRightsViolation),
    );
}

#[test]
fn an_invalid_stag_is_refused_with_invalid_stag() {
    refused(
        atomic_access(),
        |_| {},
        |t| (TARGET, t.stag().with_key(t.stag().key().wrapping_add(1))),
        |_| {},
        protection(RdmapProtectionCode::InvalidStag),
    );
}

#[test]
fn a_response_with_the_wrong_identifier_is_a_bad_response() {
    let (mut p, target, results) = setup(atomic_access(), |_| {}, |_| {});
    p.a.qp
        .post_send(fetch_add(
            1,
            result_sge(&results, 0),
            TARGET,
            target.stag(),
            1,
        ))
        .unwrap();
    assert!(p.tx_a() && p.rx_b() && p.tx_b());
    let mut resp = p.b_to_a.pop_front().unwrap();
    resp[21] ^= 0x80; // Original Request Identifier
    let cause = ErrorCause::RdmapRemoteOperation(RdmapOperationCode::Unspecified);
    assert_eq!(p.a.qp.handle_ulpdu(&resp), Err(RxError::Protocol { cause }));
    let wcs = p.a.send_wcs();
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::BadRespErr));
    assert_eq!(word(&results, 0), 0);
    assert_eq!(p.a.qp.state(), QpState::Error);
}

#[test]
fn atomics_in_flight_are_flushed_once_on_error() {
    let (mut p, target, results) = setup(atomic_access(), |i| i.ord = 1, |_| {});
    for i in 0..3 {
        p.a.qp
            .post_send(fetch_add(
                i,
                result_sge(&results, i),
                TARGET,
                target.stag(),
                1,
            ))
            .unwrap();
    }
    // One request outstanding (ORD 1), two waiting for its credit.
    assert!(p.tx_a());
    assert!(!p.tx_a());
    assert_eq!(p.a.qp.reads_outstanding(), 1);
    p.a.qp.modify_state(QpState::Error).unwrap();
    // The response arriving now changes nothing.
    p.rx_b();
    p.tx_b();
    p.rx_a();
    let wcs = p.a.send_wcs();
    assert_eq!(
        summary(&wcs),
        (0..3)
            .map(|i| (i, WcStatus::WrFlushErr, WcOpcode::FetchAdd, 0))
            .collect::<Vec<_>>()
    );
    assert_eq!(word(&results, 0), 0);
    assert!(p.a.send_wcs().is_empty(), "exactly once");
    assert_eq!(p.a.qp.sq_outstanding(), 0);
}

#[test]
fn a_result_sge_without_local_write_fails_locally() {
    let (mut p, target, _) = setup(atomic_access(), |_| {}, |_| {});
    let ro = p.a.reg(0x6000, 8, AccessFlags::empty());
    p.a.qp
        .post_send(fetch_add(
            1,
            Sge::new(0x6000, 8, ro.stag()),
            TARGET,
            target.stag(),
            1,
        ))
        .unwrap();
    let out = p.a.drain_tx(MULPDU);
    // No Atomic Request leaves: the WR fails as it starts, with a Local
    // Catastrophic Terminate.
    assert_eq!(out.len(), 1);
    assert_eq!(Ulpdu::parse(&out[0]).unwrap().opcode(), Opcode::Terminate);
    let wcs = p.a.send_wcs();
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::LocProtErr));
    assert_eq!(word(&target, 0), 0);
}

#[test]
fn a_side_may_be_requester_and_responder_at_once() {
    // Both sides run atomics on each other's word in the same rounds.
    let mut a = Side::new(1, cap(8, 1), |_| {});
    let mut b = Side::new(2, cap(8, 1), |_| {});
    a.bring_up();
    b.bring_up();
    let mut p = Pair {
        a,
        b,
        mulpdu: MULPDU,
        a_to_b: Default::default(),
        b_to_a: Default::default(),
        rx_errors: Vec::new(),
        moved: 0,
    };
    let ta = p.a.reg(0x1000, 16, atomic_access());
    let tb = p.b.reg(0x2000, 16, atomic_access());
    for i in 0..4 {
        p.a.qp
            .post_send(fetch_add(
                i,
                Sge::new(0x1008, 8, ta.stag()),
                0x2000,
                tb.stag(),
                10,
            ))
            .unwrap();
        p.b.qp
            .post_send(fetch_add(
                i,
                Sge::new(0x2008, 8, tb.stag()),
                0x1000,
                ta.stag(),
                3,
            ))
            .unwrap();
    }
    p.pump();
    assert!(p.rx_errors.is_empty());
    assert_eq!((word(&tb, 0), word(&ta, 0)), (40, 12));
    assert_eq!((word(&ta, 8), word(&tb, 8)), (30, 9), "the last results");
    assert_eq!(p.a.send_wcs().len(), 4);
    assert_eq!(p.b.send_wcs().len(), 4);
}
