//! QP engines attached to one shared receive queue, the ULPDUs moved by hand so that
//! segments of different QPs' messages interleave exactly: a WR is taken at a message's
//! first segment and kept for its later ones, WRs leave the SRQ in posting order across
//! QPs, completions carry the receiving QP's number; the limit event; Error flushes the
//! taken WR and reports Last WQE Reached once; an empty SRQ is the "no buffer"
//! Terminate.

use std::sync::Arc;

use crate::support::qp::*;
use ddp_rdmap::terminate::{DdpUntaggedCode, ErrorCause};
use softiwarp::rdmap::engine::{QpEngine, QpEvent, QpInit, RxError};
use softiwarp::resources::completion_queue::CompletionQueue;
use softiwarp::resources::shared_receive_queue::SharedReceiveQueue;
use softiwarp::resources::stag_table::{MemoryRegion, MrTable};
use softiwarp::PdId;
use verbs::{
    AsyncEvent, QpState, RecvWr, SendFlags, SendOp, SendWr, Sge, SrqAttr, SrqAttrMask, VerbsError,
    WcOpcode, WcStatus, WorkCompletion,
};

/// Bytes of each receive buffer slot.
const SLOT: u64 = 8192;
/// SRQ handle of the tests.
const SRQ: u32 = 77;

/// The receiving device: one MR table and PD, one SRQ, QPs numbered 11, 12, ... on
/// it, all completing on one receive CQ.
struct Receiver {
    mrs: Arc<MrTable>,
    pd: PdId,
    srq: Arc<SharedReceiveQueue>,
    rcq: Arc<CompletionQueue>,
    buf: Arc<MemoryRegion>,
    qps: Vec<QpEngine>,
}

impl Receiver {
    fn new(n: u32, attr: SrqAttr) -> Receiver {
        let mrs = Arc::new(MrTable::new());
        let pd = mrs.alloc_pd().unwrap();
        let srq = SharedReceiveQueue::new(SRQ, pd, attr).unwrap();
        let scq = CompletionQueue::new(100, 1 << 12).unwrap();
        let rcq = CompletionQueue::new(101, 1 << 12).unwrap();
        let buf = mrs.reg_mr(pd, 0x10000, 64 * SLOT, all_access()).unwrap();
        let qps = (0..n)
            .map(|i| {
                let init = QpInit::new(11 + i, pd, cap(8, 1));
                let mut qp =
                    QpEngine::new(init, Arc::clone(&mrs), Arc::clone(&scq), Arc::clone(&rcq))
                        .unwrap();
                qp.attach_srq(Arc::clone(&srq)).unwrap();
                for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
                    qp.modify_state(s).unwrap();
                }
                qp
            })
            .collect();
        Receiver {
            mrs,
            pd,
            srq,
            rcq,
            buf,
            qps,
        }
    }

    /// Posts WR `wr_id` to the SRQ: buffer slot `slot`, `len` bytes.
    fn post(&self, wr_id: u64, slot: u64, len: u32) {
        let sge = Sge::new(self.buf.iova() + slot * SLOT, len, self.buf.stag());
        self.srq.post(RecvWr::new(wr_id, vec![sge])).unwrap();
    }

    /// The bytes of slot `slot`.
    fn slot(&self, slot: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.buf.read((slot * SLOT) as usize, &mut v).unwrap();
        v
    }

    fn wcs(&self) -> Vec<WorkCompletion> {
        self.rcq.poll(usize::MAX).unwrap()
    }

    /// Every event of QP `i`, oldest first.
    fn events(&mut self, i: usize) -> Vec<QpEvent> {
        std::iter::from_fn(|| self.qps[i].poll_event()).collect()
    }
}

/// A sender QP numbered `n` in RTS with a 64 KiB MR.
fn sender(n: u32) -> (Side, Arc<MemoryRegion>) {
    let mut s = Side::new(n, cap(8, 1), |_| {});
    s.bring_up();
    let mr = s.reg(0, 1 << 16, all_access());
    (s, mr)
}

/// `data` is sent as one Send by `s` from its MR at offset `off`; returns its ULPDUs.
fn send(s: &mut Side, mr: &MemoryRegion, id: u64, off: u64, data: &[u8]) -> Vec<Vec<u8>> {
    mr.write(off as usize, data).unwrap();
    let sge = Sge::new(mr.iova() + off, data.len() as u32, mr.stag());
    s.qp.post_send(SendWr::send(id, vec![sge]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    s.drain_tx(MULPDU)
}

fn triple(w: &WorkCompletion) -> (u64, u32, u32) {
    (w.wr_id, w.qp_num, w.byte_len)
}

#[test]
fn a_wr_is_taken_at_a_messages_first_segment_in_srq_order_across_qps() {
    let mut r = Receiver::new(2, SrqAttr::new(8, 1));
    for i in 0..5 {
        r.post(100 + i, i, SLOT as u32);
    }
    let (mut a1, m1) = sender(1);
    let (mut a2, m2) = sender(2);
    let d1 = pattern(3000, 1); // 3 segments: 1424 + 1424 + 152
    let d2 = pattern(2000, 2); // 2 segments
    let d3 = pattern(100, 3);
    let d4 = pattern(10, 4);
    let s1 = send(&mut a1, &m1, 1, 0, &d1);
    let s3 = send(&mut a1, &m1, 3, 4096, &d3);
    let s2 = send(&mut a2, &m2, 2, 0, &d2);
    let s4 = send(&mut a2, &m2, 4, 4096, &d4);
    assert_eq!((s1.len(), s2.len(), s3.len(), s4.len()), (3, 2, 1, 1));
    let rx = |r: &mut Receiver, qp: usize, u: &[u8]| {
        r.qps[qp].handle_ulpdu(u).unwrap();
    };
    // QP 11 starts message 1: it takes WR 100, the SRQ's oldest.
    rx(&mut r, 0, &s1[0]);
    assert_eq!(r.srq.len(), 4);
    // QP 12 starts message 2 (WR 101) and finishes it before QP 11 finishes its own.
    rx(&mut r, 1, &s2[0]);
    assert_eq!(r.srq.len(), 3);
    rx(&mut r, 1, &s2[1]);
    assert_eq!(
        r.wcs().iter().map(triple).collect::<Vec<_>>(),
        [(101, 12, 2000)]
    );
    // A segment in the middle of a message takes nothing.
    rx(&mut r, 0, &s1[1]);
    assert_eq!(r.srq.len(), 3);
    rx(&mut r, 1, &s4[0]);
    rx(&mut r, 0, &s1[2]);
    rx(&mut r, 0, &s3[0]);
    let wcs = r.wcs();
    assert_eq!(
        wcs.iter().map(triple).collect::<Vec<_>>(),
        [(102, 12, 10), (100, 11, 3000), (103, 11, 100)]
    );
    assert!(wcs
        .iter()
        .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Recv));
    assert_eq!(r.slot(0, 3000), d1);
    assert_eq!(r.slot(1, 2000), d2);
    assert_eq!(r.slot(2, 10), d4);
    assert_eq!(r.slot(3, 100), d3);
    // WR 104 is still in the SRQ; nothing was counted on the QPs' own receive queues.
    assert_eq!(r.srq.len(), 1);
    assert_eq!(r.qps[0].rq_outstanding() + r.qps[1].rq_outstanding(), 0);
    assert_eq!(r.qps[0].counters().rq_retired(), 0);
    assert!(r.events(0).is_empty() && r.events(1).is_empty());
}

#[test]
fn immediate_data_takes_an_srq_wr_too() {
    let mut r = Receiver::new(1, SrqAttr::new(4, 1));
    r.post(7, 0, 64);
    let (mut a, m) = sender(1);
    m.write(0, b"written").unwrap();
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::RdmaWriteWithImm {
            remote_addr: r.buf.iova() + 5 * SLOT,
            rkey: r.buf.stag(),
            imm_data: 0xfeed,
        },
        flags: SendFlags::SIGNALED,
        payload: verbs::Payload::Sges(vec![Sge::new(m.iova(), 7, m.stag())]),
    };
    a.qp.post_send(wr).unwrap();
    for u in a.drain_tx(MULPDU) {
        r.qps[0].handle_ulpdu(&u).unwrap();
    }
    let wcs = r.wcs();
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].qp_num, wcs[0].opcode, wcs[0].imm_data),
        (7, 11, WcOpcode::RecvRdmaWithImm, Some(0xfeed))
    );
    assert_eq!(r.slot(5, 7), b"written");
    assert!(r.srq.is_empty());
}

#[test]
fn an_empty_srq_is_the_no_buffer_terminate() {
    let mut r = Receiver::new(1, SrqAttr::new(4, 1));
    let (mut a, m) = sender(1);
    let s = send(&mut a, &m, 1, 0, b"nobody waits");
    let e = r.qps[0].handle_ulpdu(&s[0]).unwrap_err();
    assert_eq!(
        e,
        RxError::Protocol {
            cause: ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidMsnNoBuffer)
        }
    );
    assert_eq!(r.qps[0].state(), QpState::Error);
    assert!(r.wcs().is_empty(), "no WR was taken");
    let evs = r.events(0);
    assert!(matches!(evs[0], QpEvent::TerminateQueued { .. }), "{evs:?}");
    assert_eq!(
        &evs[1..],
        [
            QpEvent::Async(AsyncEvent::QpReqErr { qp_num: 11 }),
            QpEvent::Async(AsyncEvent::QpLastWqeReached { qp_num: 11 }),
        ]
    );
}

#[test]
fn a_message_too_long_for_the_taken_wr_completes_it_with_loc_len_err() {
    let mut r = Receiver::new(1, SrqAttr::new(4, 1));
    r.post(1, 0, 16);
    r.post(2, 1, 4096);
    let (mut a, m) = sender(1);
    let s = send(&mut a, &m, 1, 0, &pattern(100, 9));
    let e = r.qps[0].handle_ulpdu(&s[0]).unwrap_err();
    assert_eq!(
        e,
        RxError::Protocol {
            cause: ErrorCause::DdpUntagged(DdpUntaggedCode::MessageTooLong)
        }
    );
    let wcs = r.wcs();
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].qp_num, wcs[0].status),
        (1, 11, WcStatus::LocLenErr)
    );
    assert_eq!(r.slot(0, 16), [0u8; 16], "nothing placed");
    // WR 2 stays in the SRQ.
    assert_eq!(r.srq.len(), 1);
}

#[test]
fn error_flushes_the_taken_wr_once_and_the_srq_serves_the_other_qp() {
    let mut r = Receiver::new(2, SrqAttr::new(8, 1));
    for i in 0..3 {
        r.post(10 + i, i, SLOT as u32);
    }
    let (mut a1, m1) = sender(1);
    let (mut a2, m2) = sender(2);
    let s1 = send(&mut a1, &m1, 1, 0, &pattern(2000, 1));
    assert_eq!(s1.len(), 2);
    // QP 11 takes WR 10 with the first segment, then goes to Error mid-message.
    r.qps[0].handle_ulpdu(&s1[0]).unwrap();
    r.qps[0].modify_state(QpState::Error).unwrap();
    let wcs = r.wcs();
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].qp_num, wcs[0].status, wcs[0].opcode),
        (10, 11, WcStatus::WrFlushErr, WcOpcode::Recv)
    );
    assert_eq!(
        r.events(0),
        [QpEvent::Async(AsyncEvent::QpLastWqeReached { qp_num: 11 })]
    );
    // Error -> Error flushes nothing again and reports nothing again; the rest of the
    // message is ignored.
    r.qps[0].modify_state(QpState::Error).unwrap();
    assert_eq!(
        r.qps[0].handle_ulpdu(&s1[1]).unwrap_err(),
        RxError::Terminated
    );
    assert!(r.wcs().is_empty());
    assert!(r.events(0).is_empty());
    // The WRs still in the SRQ were not QP 11's: QP 12 takes them, in order.
    assert_eq!(r.srq.len(), 2);
    for (i, d) in [b"first".as_slice(), b"second"].into_iter().enumerate() {
        for u in send(&mut a2, &m2, i as u64, 64 * i as u64, d) {
            r.qps[1].handle_ulpdu(&u).unwrap();
        }
    }
    assert_eq!(
        r.wcs().iter().map(triple).collect::<Vec<_>>(),
        [(11, 12, 5), (12, 12, 6)]
    );
    assert_eq!(r.slot(1, 5), b"first");
    assert_eq!(r.slot(2, 6), b"second");
    // Reset -> Init -> Error reports Last WQE Reached again: a new entry into Error.
    r.qps[0].modify_state(QpState::Reset).unwrap();
    r.qps[0].modify_state(QpState::Init).unwrap();
    r.qps[0].modify_state(QpState::Error).unwrap();
    assert_eq!(
        r.events(0),
        [QpEvent::Async(AsyncEvent::QpLastWqeReached { qp_num: 11 })]
    );
}

#[test]
fn the_limit_fires_once_per_arming_when_fewer_wrs_than_it_remain() {
    let attr = SrqAttr {
        max_wr: 8,
        max_sge: 1,
        srq_limit: 3,
    };
    let mut r = Receiver::new(1, attr);
    assert_eq!(r.srq.query().srq_limit, 3);
    for i in 0..6 {
        r.post(i, i, 64);
    }
    let (mut a, m) = sender(1);
    let mut next = 0u64;
    let mut one_message = |r: &mut Receiver| -> Vec<QpEvent> {
        for u in send(&mut a, &m, next, 0, b"x") {
            r.qps[0].handle_ulpdu(&u).unwrap();
        }
        next += 1;
        r.events(0)
    };
    // 5, 4 and 3 WRs left: not below 3.
    for _ in 0..3 {
        assert!(one_message(&mut r).is_empty());
    }
    // 2 left: the event, once; the limit is disarmed.
    assert_eq!(
        one_message(&mut r),
        [QpEvent::Async(AsyncEvent::SrqLimitReached { srq: SRQ })]
    );
    assert_eq!(r.srq.query().srq_limit, 0);
    for _ in 0..2 {
        assert!(one_message(&mut r).is_empty());
    }
    assert!(r.srq.is_empty());
    // Re-armed at 2 with 4 WRs in: fires when the third take leaves 1.
    for i in 0..4 {
        r.post(10 + i, i, 64);
    }
    let limit = SrqAttr {
        srq_limit: 2,
        ..SrqAttr::default()
    };
    r.srq.modify(&limit, SrqAttrMask::LIMIT).unwrap();
    assert!(one_message(&mut r).is_empty());
    assert!(one_message(&mut r).is_empty());
    assert_eq!(
        one_message(&mut r),
        [QpEvent::Async(AsyncEvent::SrqLimitReached { srq: SRQ })]
    );
    assert!(one_message(&mut r).is_empty());
    assert_eq!(r.wcs().len(), 10);
}

#[test]
fn an_srq_qp_has_no_receive_queue_and_attaches_only_in_reset() {
    let mut r = Receiver::new(1, SrqAttr::new(4, 1));
    let sge = Sge::new(r.buf.iova(), 8, r.buf.stag());
    assert_eq!(
        r.qps[0].post_recv(RecvWr::new(1, vec![sge])),
        Err(VerbsError::InvalidArgument {
            what: "qp with an SRQ"
        })
    );
    let srq2 = SharedReceiveQueue::new(78, r.pd, SrqAttr::new(4, 1)).unwrap();
    assert!(matches!(
        r.qps[0].attach_srq(Arc::clone(&srq2)),
        Err(VerbsError::InvalidQpState {
            state: QpState::Rts,
            ..
        })
    ));
    let cq = CompletionQueue::new(1, 16).unwrap();
    let mut qp = QpEngine::new(
        QpInit::new(20, r.pd, cap(4, 1)),
        Arc::clone(&r.mrs),
        Arc::clone(&cq),
        Arc::clone(&cq),
    )
    .unwrap();
    qp.modify_state(QpState::Init).unwrap();
    qp.post_recv(RecvWr::new(1, vec![sge])).unwrap();
    qp.modify_state(QpState::Reset).unwrap();
    qp.attach_srq(Arc::clone(&srq2)).unwrap();
    assert_eq!(
        qp.attach_srq(srq2),
        Err(VerbsError::InvalidArgument { what: "srq" })
    );
    assert_eq!(qp.srq().map(|s| s.handle()), Some(78));
}

#[test]
fn flush_srq_completes_what_is_left_on_the_qps_receive_cq() {
    let mut r = Receiver::new(2, SrqAttr::new(4, 1));
    for i in 0..3 {
        r.post(30 + i, i, 64);
    }
    for qp in &mut r.qps {
        qp.modify_state(QpState::Error).unwrap();
    }
    assert_eq!(r.qps[1].flush_srq(), 3);
    assert_eq!(r.qps[0].flush_srq(), 0);
    let wcs = r.wcs();
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.qp_num, w.status))
            .collect::<Vec<_>>(),
        (30..33)
            .map(|id| (id, 12, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
}
