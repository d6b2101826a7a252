//! QP states, flush, post-time validation and CQ overflow: every accepted WR
//! completes exactly once, in posting order per queue; WRs posted in Error complete
//! flushed at once.

use crate::support::qp::*;
use softiwarp::rdmap::engine::{QpEvent, RxError};
use verbs::{
    AsyncEvent, Payload, QpState, RecvWr, SendFlags, SendOp, SendWr, Sge, Stag, VerbsError,
    WcOpcode, WcStatus, WorkQueue,
};

fn ids_status(wcs: &[verbs::WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

#[test]
fn flush_outstanding_wrs_in_order_exactly_once() {
    let mut p = Pair::new(cap(32, 2));
    let mr = p.a.reg(0, 4096, all_access());
    for i in 0..7u64 {
        p.a.post_recv(100 + i, &mr, i * 64, 64);
    }
    for i in 0..10u64 {
        let wr = SendWr::send(i, vec![Sge::new(i * 8, 8, mr.stag())]);
        // Unsignaled WRs complete too when flushed.
        let wr = if i % 3 == 0 {
            wr.with_flags(SendFlags::SIGNALED)
        } else {
            wr
        };
        p.a.qp.post_send(wr).unwrap();
    }
    p.a.qp.modify_state(QpState::Error).unwrap();
    let s = p.a.send_wcs();
    assert_eq!(
        ids_status(&s),
        (0..10)
            .map(|i| (i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
    assert!(s
        .iter()
        .all(|w| w.opcode == WcOpcode::Send && w.qp_num == 1));
    let r = p.a.recv_wcs();
    assert_eq!(
        ids_status(&r),
        (100..107)
            .map(|i| (i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
    assert!(r.iter().all(|w| w.opcode == WcOpcode::Recv));
    // Error -> Error is legal and flushes nothing twice.
    p.a.qp.modify_state(QpState::Error).unwrap();
    assert!(p.a.send_wcs().is_empty() && p.a.recv_wcs().is_empty());
    // WRs posted in Error complete at once, flushed (siw behaviour).
    p.a.qp.post_send(SendWr::send_inline(50, vec![1])).unwrap();
    p.a.post_recv(150, &mr, 0, 8);
    assert_eq!(ids_status(&p.a.send_wcs()), [(50, WcStatus::WrFlushErr)]);
    assert_eq!(ids_status(&p.a.recv_wcs()), [(150, WcStatus::WrFlushErr)]);
    // A user-requested Error sends no Terminate.
    assert!(p.a.drain_tx(MULPDU).is_empty());
    assert_eq!(p.a.qp.sq_outstanding() + p.a.qp.rq_outstanding(), 0);
}

/// WRs in every phase: a Read awaiting its response, Sends already sent but
/// waiting behind it, a WR not started: all flushed, in posting order.
#[test]
fn flush_in_every_phase() {
    let mut p = Pair::new(cap(16, 1));
    let src = p.b.reg(0, 4096, all_access());
    let dst = p.a.reg(0, 4096, all_access());
    let recv = p.b.reg(0x10000, 4096, all_access());
    p.b.post_recv(9, &recv, 0, 4096);
    p.a.qp
        .post_send(SendWr::rdma_read(
            1,
            vec![Sge::new(0, 100, dst.stag())],
            0,
            src.stag(),
        ))
        .unwrap();
    p.a.qp
        .post_send(SendWr::send_inline(2, b"sent".to_vec()).with_flags(SendFlags::SIGNALED))
        .unwrap();
    p.a.qp
        .post_send(
            SendWr::send_inline(3, b"fenced".to_vec())
                .with_flags(SendFlags::SIGNALED | SendFlags::FENCE),
        )
        .unwrap();
    while p.tx_a() {}
    assert_eq!(p.a_to_b.len(), 2, "Read Request and the first Send");
    assert_eq!(p.a.qp.reads_outstanding(), 1);
    assert!(p.a.send_wcs().is_empty(), "the Send waits behind the Read");
    p.a.qp.modify_state(QpState::Error).unwrap();
    assert_eq!(
        ids_status(&p.a.send_wcs()),
        [
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.a.qp.reads_outstanding(), 0);
}

/// A partly received Send is flushed; the sender's in-progress Send gets the
/// status mapped from the peer's Terminate.
#[test]
fn flush_mid_message_both_sides() {
    let mut p = Pair::new(cap(8, 1));
    let src = p.a.reg(0, 65536, all_access());
    let dst = p.b.reg(0, 65536, all_access());
    p.b.post_recv(7, &dst, 0, 65536);
    p.b.post_recv(8, &dst, 0, 65536);
    p.a.qp
        .post_send(SendWr::send(1, vec![Sge::new(0, 65536, src.stag())]))
        .unwrap();
    for _ in 0..3 {
        p.tx_a();
        p.rx_b();
    }
    p.b.qp.modify_state(QpState::Error).unwrap();
    assert_eq!(
        ids_status(&p.b.recv_wcs()),
        [(7, WcStatus::WrFlushErr), (8, WcStatus::WrFlushErr)]
    );
    // The peer's Terminate (here: "Invalid MSN - no buffer available") arrives
    // while A is mid-Send.
    let term = [
        0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0x12, 0x02, 0, 0,
    ];
    let cause = ddp_rdmap::ErrorCause::DdpUntagged(
        ddp_rdmap::terminate::DdpUntaggedCode::InvalidMsnNoBuffer,
    );
    assert_eq!(
        p.a.qp.handle_ulpdu(&term),
        Err(RxError::PeerTerminated { cause: Some(cause) })
    );
    let wcs = p.a.send_wcs();
    assert_eq!(ids_status(&wcs), [(1, WcStatus::RemInvReqErr)]);
    assert_eq!(wcs[0].vendor_err, 0x1202);
    assert!(p.a.drain_tx(MULPDU).is_empty(), "nothing after a Terminate");
}

#[test]
fn state_rules_and_transitions() {
    let mut s = Side::new(3, cap(4, 1), |_| {});
    let mr = s.reg(0, 64, all_access());
    assert_eq!(s.qp.state(), QpState::Reset);
    // Posting in Reset.
    assert!(matches!(
        s.qp.post_recv(RecvWr::new(1, vec![])),
        Err(VerbsError::InvalidQpState {
            op: "post_recv",
            ..
        })
    ));
    assert!(matches!(
        s.qp.post_send(SendWr::send_inline(1, vec![1])),
        Err(VerbsError::InvalidQpState {
            op: "post_send",
            ..
        })
    ));
    // Illegal transitions.
    assert!(matches!(
        s.qp.modify_state(QpState::Rts),
        Err(VerbsError::IllegalTransition(_))
    ));
    assert!(s.qp.modify_state(QpState::Error).is_err(), "Reset -> Error");
    s.qp.modify_state(QpState::Init).unwrap();
    // Receives may be posted in Init; sends not.
    s.post_recv(1, &mr, 0, 8);
    assert!(s.qp.post_send(SendWr::send_inline(1, vec![1])).is_err());
    // ORD/IRD may be set in Init, not later.
    s.qp.set_ord_ird(4, 4).unwrap();
    assert!(s.qp.set_ord_ird(0x4000, 1).is_err());
    s.qp.modify_state(QpState::Rtr).unwrap();
    assert!(s.qp.set_ord_ird(4, 4).is_err());
    assert!(s.qp.modify_state(QpState::Init).is_err());
    // In RTR the QP receives (and reports communication established) but sends
    // nothing.
    let send = [
        0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, b'x',
    ];
    s.qp.handle_ulpdu(&send).unwrap();
    assert_eq!(
        s.events(),
        vec![QpEvent::Async(AsyncEvent::CommEst { qp_num: 3 })]
    );
    assert_eq!(s.recv_wcs()[0].byte_len, 1);
    assert!(s.drain_tx(MULPDU).is_empty());
    s.qp.modify_state(QpState::Rts).unwrap();
    // Reset from RTS flushes first, then the QP is new again.
    s.post_recv(2, &mr, 0, 8);
    s.qp.post_send(SendWr::send_inline(3, vec![1])).unwrap();
    s.qp.modify_state(QpState::Reset).unwrap();
    assert_eq!(ids_status(&s.send_wcs()), [(3, WcStatus::WrFlushErr)]);
    assert_eq!(ids_status(&s.recv_wcs()), [(2, WcStatus::WrFlushErr)]);
    // A ULPDU in Reset / Init is ignored.
    assert_eq!(
        s.qp.handle_ulpdu(&send),
        Err(RxError::NotReady {
            state: QpState::Reset
        })
    );
}

/// After Error and Reset, the QP pair works again from MSN 1.
#[test]
fn reuse_after_reset() {
    let mut p = Pair::new(cap(8, 1));
    let m = p.b.reg(0, 64, all_access());
    for side in [&mut p.a, &mut p.b] {
        side.qp.modify_state(QpState::Error).unwrap();
        side.qp.modify_state(QpState::Reset).unwrap();
        side.bring_up();
    }
    for round in 0..2u64 {
        p.b.post_recv(round, &m, 0, 64);
        p.a.qp
            .post_send(
                SendWr::send_inline(round, vec![round as u8; 3]).with_flags(SendFlags::SIGNALED),
            )
            .unwrap();
        p.pump();
        assert_eq!(ids_status(&p.b.recv_wcs()), [(round, WcStatus::Success)]);
        assert_eq!(ids_status(&p.a.send_wcs()), [(round, WcStatus::Success)]);
    }
    assert!(p.rx_errors.is_empty());
}

#[test]
fn post_time_validation_is_typed() {
    let mut p = Pair::with(cap(2, 1), |_| {}, |i| i.ord = 0);
    let mr = p.a.reg(0, 64, all_access());
    let s = |a, l| Sge::new(a, l, mr.stag());
    assert!(matches!(
        p.a.qp.post_send(SendWr::send(1, vec![s(0, 1), s(1, 1)])),
        Err(VerbsError::TooManySges { num_sge: 2, max: 1 })
    ));
    assert!(matches!(
        p.a.qp.post_send(SendWr::send_inline(1, vec![0; 257])),
        Err(VerbsError::InlineTooLong { len: 257, max: 256 })
    ));
    // B has ORD 0: no atomic (nor Read) can be outstanding.
    assert!(matches!(
        p.b.qp.post_send(SendWr {
            wr_id: 1,
            op: SendOp::AtomicFetchAdd {
                remote_addr: 0,
                rkey: Stag::from_raw(0),
                add: 1
            },
            flags: SendFlags::empty(),
            payload: Payload::Sges(vec![s(0, 8)]),
        }),
        Err(VerbsError::Unsupported {
            what: "atomic with ORD 0"
        })
    ));
    assert!(matches!(
        p.a.qp.post_send(SendWr::rdma_write(
            1,
            vec![s(0, 16)],
            u64::MAX - 8,
            Stag::from_raw(0)
        )),
        Err(VerbsError::InvalidArgument {
            what: "remote_addr"
        })
    ));
    assert!(matches!(
        p.b.qp
            .post_send(SendWr::rdma_read(1, vec![], 0, Stag::from_raw(0))),
        Err(VerbsError::Unsupported { .. })
    ));
    // Queue depth 2.
    p.a.qp.post_send(SendWr::send_inline(1, vec![1])).unwrap();
    p.a.qp.post_send(SendWr::send_inline(2, vec![1])).unwrap();
    assert!(matches!(
        p.a.qp.post_send(SendWr::send_inline(3, vec![1])),
        Err(VerbsError::QueueFull {
            queue: WorkQueue::Send,
            depth: 2
        })
    ));
    p.a.post_recv(1, &mr, 0, 8);
    p.a.post_recv(2, &mr, 0, 8);
    assert!(matches!(
        p.a.qp.post_recv(RecvWr::new(3, vec![])),
        Err(VerbsError::QueueFull {
            queue: WorkQueue::Recv,
            ..
        })
    ));
    // Rejected WRs never complete; the accepted unsignaled ones succeed silently.
    let bm = p.b.reg(0, 64, all_access());
    p.b.post_recv(1, &bm, 0, 8);
    p.b.post_recv(2, &bm, 8, 8);
    p.pump();
    assert_eq!(p.b.recv_wcs().len(), 2);
    let w = p.a.send_wcs();
    assert!(
        w.is_empty(),
        "unsignaled successes only: {w:?} {:?}",
        p.rx_errors
    );
}

/// A CQ that overflows: counted, CQ in error with its async event, QP to Error
/// with a Terminate to the peer. Never silent.
#[test]
fn cq_overflow_moves_qp_to_error() {
    let mut p = Pair::new(cap(8, 1));
    // Replace A's QP with one whose send CQ holds 2 completions.
    let small = softiwarp::resources::completion_queue::CompletionQueue::new(99, 2).unwrap();
    let init = *p.a.qp.init();
    p.a.qp = softiwarp::rdmap::engine::QpEngine::new(
        init,
        std::sync::Arc::clone(&p.a.mrs),
        std::sync::Arc::clone(&small),
        std::sync::Arc::clone(&p.a.rcq),
    )
    .unwrap();
    p.a.bring_up();
    let t = p.b.reg(0, 64, all_access());
    for i in 0..4u64 {
        p.a.qp
            .post_send(
                SendWr::rdma_write_inline(i, vec![i as u8], i, t.stag())
                    .with_flags(SendFlags::SIGNALED),
            )
            .unwrap();
    }
    p.pump();
    assert!(small.is_error());
    assert_eq!(small.take_async_event(), Some(AsyncEvent::CqErr { cq: 99 }));
    assert_eq!(small.poll(8).unwrap().len(), 2);
    assert!(small.poll(8).is_err());
    assert!(small.lost() >= 1);
    assert_eq!(p.a.qp.state(), QpState::Error);
    let ev = p.a.events();
    assert!(ev.contains(&QpEvent::CqOverflow { cq: 99 }));
    assert!(ev.contains(&QpEvent::Async(AsyncEvent::QpFatal { qp_num: 1 })));
    assert!(p
        .b
        .events()
        .iter()
        .any(|e| matches!(e, QpEvent::TerminateReceived { .. })));
}

#[test]
fn sqd_holds_new_work_and_reports_drained() {
    let mut p = Pair::new(cap(8, 1));
    let t = p.b.reg(0, 64, all_access());
    p.a.qp.modify_state(QpState::Sqd).unwrap();
    assert_eq!(
        p.a.events(),
        vec![QpEvent::Async(AsyncEvent::SqDrained { qp_num: 1 })]
    );
    p.a.qp
        .post_send(
            SendWr::rdma_write_inline(1, vec![9], 0, t.stag()).with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
    assert!(p.a.drain_tx(MULPDU).is_empty(), "nothing starts in SQD");
    p.a.qp.modify_state(QpState::Rts).unwrap();
    p.pump();
    assert_eq!(ids_status(&p.a.send_wcs()), [(1, WcStatus::Success)]);
    assert_eq!(t.to_vec()[0], 9);
}
