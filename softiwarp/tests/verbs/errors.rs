//! Protection errors end to end between two real devices: the responder's engine
//! finds the violation before placing a byte, sends the Terminate RFC 5040 / 5041
//! prescribe (checked in the pcap with iwdump), both QPs go to Error, the requester's
//! WR completes with the remote error and the Terminate's code in `vendor_err`,
//! everything else is flushed, and the target memory is unchanged.

use std::time::Duration;

use crate::support::devices::*;
use ddp_rdmap::terminate::{DdpTaggedCode, ErrorCause, RdmapProtectionCode};
use softiwarp::rdmap::engine::vendor_err_for;
use softiwarp::transport::{ConnError, ConnEvent};
use verbs::{AccessFlags, AsyncEvent, QpState, RecvWr, SendFlags, SendWr, WcStatus};

fn final_event(e: &End) -> ConnEvent {
    let c = e.conn.as_ref().expect("connected");
    loop {
        let ev = c.next_event(WAIT).expect("no final event");
        if ev.is_final() {
            return ev;
        }
    }
}

fn async_events(e: &End) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| e.dev.next_async_event(Duration::from_millis(50))).collect()
}

#[test]
fn remote_write_without_remote_write_right_terminates() {
    let pcap = std::env::temp_dir().join(format!("sw-verbs-terminate-{}.pcap", std::process::id()));
    let s = Setup {
        pcap: Some(pcap.clone()),
        ..Setup::default()
    };
    let (a, b) = pair(&s);
    // B's MR is readable by the peer, not writable.
    let victim =
        b.pd.reg_mr(
            1 << 20,
            0x5000_0000,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let before = pattern(1 << 20, 42);
    victim.write(0, &before).unwrap();
    for i in 0..3 {
        b.qp.post_recv(RecvWr::new(100 + i, vec![])).unwrap();
    }
    // A writes 1 MiB into it, with a Send behind, and has a receive posted.
    let src = a.pd.reg_mr(1 << 20, 0x1000_0000, all_access()).unwrap();
    src.write(0, &pattern(1 << 20, 7)).unwrap();
    a.qp.post_recv(RecvWr::new(300, vec![])).unwrap();
    a.qp.post_send(
        SendWr::rdma_write(1, vec![src.sge(0, 1 << 20)], victim.iova(), victim.rkey())
            .with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    a.qp.post_send(SendWr::send(2, vec![]).with_flags(SendFlags::SIGNALED))
        .unwrap();

    let cause = ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::AccessRightsViolation);
    // Requester: the Write completes with the remote access error and the Terminate's
    // layer/type/code; the Send behind it and the receive are flushed.
    let w = a.send_wcs(2);
    assert_eq!(
        (w[0].wr_id, w[0].status, w[0].vendor_err),
        (1, WcStatus::RemAccessErr, vendor_err_for(cause)),
        "{w:?}"
    );
    assert_eq!(vendor_err_for(cause), 0x0102);
    assert_eq!((w[1].wr_id, w[1].status), (2, WcStatus::WrFlushErr));
    let r = a.recv_wcs(1);
    assert_eq!((r[0].wr_id, r[0].status), (300, WcStatus::WrFlushErr));
    // Responder: nothing was placed, its receives are flushed.
    let r = b.recv_wcs(3);
    assert!(
        r.iter()
            .enumerate()
            .all(|(i, w)| w.wr_id == 100 + i as u64 && w.status == WcStatus::WrFlushErr),
        "{r:?}"
    );
    assert!(victim.to_vec() == before, "the MR was changed");
    a.wait_state(QpState::Error);
    b.wait_state(QpState::Error);
    assert_eq!(
        final_event(&a),
        ConnEvent::Failed(ConnError::TerminateReceived(cause))
    );
    assert_eq!(
        final_event(&b),
        ConnEvent::Failed(ConnError::TerminateSent(Some(cause)))
    );
    let qa = a.qp.qp_num();
    let qb = b.qp.qp_num();
    assert!(async_events(&a).contains(&AsyncEvent::QpFatal { qp_num: qa }));
    assert!(async_events(&b).contains(&AsyncEvent::QpAccessErr { qp_num: qb }));
    a.assert_quiet(Duration::from_millis(20));
    b.assert_quiet(Duration::ZERO);

    // The Terminate is on the wire: B's capture, decoded by iwdump.
    drop(b); // closes the device, flushing the pcap
    let report = iwdump::dissect_file(&pcap).expect("pcap");
    let _ = std::fs::remove_file(&pcap);
    assert_eq!(
        report.opcodes.get("Terminate"),
        Some(&1),
        "{:?}",
        report.opcodes
    );
    let (rec, info) = report
        .fpdu_records()
        .find(|(_, f)| f.opcode == "Terminate")
        .expect("a Terminate FPDU");
    assert_eq!(rec.src.ip(), std::net::IpAddr::V4(addr(2)), "sent by B");
    let detail = info.detail.clone().unwrap_or_default();
    assert!(detail.contains(&cause.to_string()), "{detail}");
    assert_eq!(info.crc, iwdump::report::CrcStatus::Good);
    assert!(
        report.errors.is_empty(),
        "{} errors, first {:?}",
        report.errors.len(),
        report.errors.first()
    );
    // The Write's first FPDU reached B; the Terminate answered it.
    assert!(report.opcodes.get("Write").copied().unwrap_or(0) >= 1);
}

#[test]
fn read_without_remote_read_right_terminates() {
    let (a, b) = pair(&Setup::default());
    let secret =
        b.pd.reg_mr(
            4096,
            0x8000,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let sink = a.pd.reg_mr(4096, 0x1000, all_access()).unwrap();
    a.qp.post_send(
        SendWr::rdma_read(1, vec![sink.sge(0, 4096)], secret.iova(), secret.rkey())
            .with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    let cause = ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::AccessRightsViolation);
    let w = a.send_wcs(1);
    assert_eq!(
        (w[0].status, w[0].vendor_err),
        (WcStatus::RemAccessErr, vendor_err_for(cause))
    );
    assert!(sink.to_vec().iter().all(|&x| x == 0), "nothing was read");
    a.wait_state(QpState::Error);
    b.wait_state(QpState::Error);
}

/// `DeviceConfig::strict_read_sink` (the iWARP hardware rule of iw_cxgb4): an RDMA
/// Read into an MR with `LOCAL_WRITE` but not `REMOTE_WRITE` completes with
/// `LocProtErr` and nothing is read, and the QP goes to Error; with `REMOTE_WRITE` too
/// the same Read succeeds. Without the option (Linux siw's rule) `LOCAL_WRITE` is enough.
#[test]
fn strict_read_sink_needs_remote_write() {
    for (strict, sink_access, want) in [
        (true, AccessFlags::LOCAL_WRITE, WcStatus::LocProtErr),
        (
            true,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            WcStatus::Success,
        ),
        (false, AccessFlags::LOCAL_WRITE, WcStatus::Success),
    ] {
        let (a, b) = pair(&Setup {
            strict_read_sink: strict,
            ..Setup::default()
        });
        let source = b.pd.reg_mr(4096, 0x8000, all_access()).unwrap();
        source.write(0, &pattern(4096, 7)).unwrap();
        let sink = a.pd.reg_mr(4096, 0x1000, sink_access).unwrap();
        a.qp.post_send(
            SendWr::rdma_read(1, vec![sink.sge(0, 4096)], source.iova(), source.rkey())
                .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
        let w = a.send_wcs(1);
        assert_eq!(w[0].status, want, "strict {strict}, sink {sink_access:?}");
        if want == WcStatus::Success {
            assert_eq!(sink.to_vec(), pattern(4096, 7));
        } else {
            assert!(sink.to_vec().iter().all(|&x| x == 0), "nothing was read");
            a.wait_state(QpState::Error);
        }
    }
}

#[test]
fn write_to_an_invalidated_stag_terminates() {
    let (a, b) = pair(&Setup::default());
    let target = b.pd.reg_mr(4096, 0x8000, all_access()).unwrap();
    let src = a.pd.reg_mr(4096, 0x1000, all_access()).unwrap();
    src.write(0, &[0x5a; 64]).unwrap();
    // Works before the invalidation.
    a.qp.post_send(
        SendWr::rdma_write(1, vec![src.sge(0, 64)], target.iova(), target.rkey())
            .with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    assert_eq!(a.send_wcs(1)[0].status, WcStatus::Success);
    // The Write is placed at B once a Send behind it arrives (a Write's completion at A
    // only means it was sent).
    b.qp.post_recv(RecvWr::new(8, vec![])).unwrap();
    a.qp.post_send(SendWr::send(10, vec![])).unwrap();
    assert_eq!(b.recv_wcs(1)[0].wr_id, 8);
    assert_eq!(&target.to_vec()[..64], &[0x5a; 64]);
    b.qp.post_send(SendWr::local_inv(9, target.stag()).with_flags(SendFlags::SIGNALED))
        .unwrap();
    assert_eq!(b.send_wcs(1)[0].status, WcStatus::Success);
    let before = target.to_vec();
    src.write(0, &[0xa5; 64]).unwrap();
    a.qp.post_send(
        SendWr::rdma_write(2, vec![src.sge(0, 64)], target.iova(), target.rkey())
            .with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    // A 64-byte Write completes as soon as it is sent; the Terminate then takes the
    // QP to Error and flushes what was posted behind it.
    let w = a.send_wcs(1);
    assert_eq!((w[0].wr_id, w[0].status), (2, WcStatus::Success));
    assert_eq!(
        final_event(&a),
        ConnEvent::Failed(ConnError::TerminateReceived(ErrorCause::DdpTagged(
            DdpTaggedCode::InvalidStag
        )))
    );
    a.wait_state(QpState::Error);
    b.wait_state(QpState::Error);
    a.qp.post_send(SendWr::send(3, vec![])).unwrap();
    assert_eq!(a.send_wcs(1)[0].status, WcStatus::WrFlushErr);
    assert_eq!(
        target.to_vec(),
        before,
        "nothing placed after the invalidation"
    );
}

/// A hostile peer's Send with Invalidate: two connections on one PD of the server. The peer on
/// connection 1 sends a Send with Invalidate naming the rkey of an ordinary MR
/// used by connection 2 (same PD, registered without
/// `MrOptions::remote_invalidate`). Connection 1 gets the Terminate "STag cannot
/// be Invalidated" (RDMAP Remote Protection Error, code 0x09) and goes to Error;
/// the MR stays valid, and connection 2's next RDMA Write into it succeeds and
/// lands.
#[test]
fn send_with_invalidate_of_another_connections_mr_is_refused() {
    let s = Setup::default();
    let (a, b) = pair(&s);
    // The second connection: one more QP on each device, in the same PDs.
    let qp_on = |e: &End| {
        e.dev
            .create_qp(
                &e.pd,
                softiwarp::QpInitAttr {
                    send_cq: &e.scq,
                    recv_cq: &e.rcq,
                    cap: s.cap,
                    sq_sig_all: false,
                },
            )
            .expect("qp")
    };
    let (a2, b2) = (qp_on(&a), qp_on(&b));
    let listener = b.dev.listen(PORT + 1, 4).expect("listen");
    let params = softiwarp::transport::MpaParams {
        private_data: Vec::new(),
        ird: 16,
        ord: 16,
        settings: None,
    };
    let c2 = a.dev.connect_qp(addr(2), PORT + 1, params, &a2).unwrap();
    let req = listener.next_request(WAIT).expect("request");
    let s2 = req.accept_qp(&b2, b"", 16, 16).expect("accept_qp");
    c2.wait_established(WAIT).unwrap();
    s2.wait_established(WAIT).unwrap();
    // Connection 2's MR at the server: ordinary registration, all rights.
    let victim = b.pd.reg_mr(4096, 0x8000, all_access()).unwrap();
    // Connection 1's peer names it in a Send with Invalidate.
    b.qp.post_recv(RecvWr::new(7, vec![])).unwrap();
    let mut inv = SendWr::send(1, vec![]);
    inv.op = verbs::SendOp::SendWithInv {
        invalidate_rkey: victim.rkey(),
    };
    a.qp.post_send(inv.with_flags(SendFlags::SIGNALED)).unwrap();
    let cause = ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::StagCannotBeInvalidated);
    assert_eq!(
        final_event(&a),
        ConnEvent::Failed(ConnError::TerminateReceived(cause))
    );
    a.wait_state(QpState::Error);
    b.wait_state(QpState::Error);
    let r = b.recv_wcs(1);
    assert_eq!((r[0].wr_id, r[0].status), (7, WcStatus::RemInvReqErr));
    assert_eq!(r[0].invalidated_stag, None);
    assert_eq!(victim.state(), softiwarp::MrState::Valid);
    // Connection 2 is unaffected: a Write into the MR succeeds and lands.
    assert_eq!(a2.state(), QpState::Rts);
    assert_eq!(b2.state(), QpState::Rts);
    let src = a.pd.reg_mr(4096, 0x1000, all_access()).unwrap();
    src.write(0, &[0x3c; 64]).unwrap();
    a2.post_send(
        SendWr::rdma_write(2, vec![src.sge(0, 64)], victim.iova() + 64, victim.rkey())
            .with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    // A Send behind the Write shows it placed (RFC 5040 §5.5 ordering).
    b2.post_recv(RecvWr::new(8, vec![])).unwrap();
    a2.post_send(SendWr::send(3, vec![]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    let mut w: Vec<_> = End::wait_n(&a.scq, 3)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    w.sort_unstable();
    // Wr 1's completion (the refused Send) is among them: whatever its status, the
    // Write and the Send of connection 2 succeeded.
    assert!(w.contains(&(2, WcStatus::Success)), "{w:?}");
    assert!(w.contains(&(3, WcStatus::Success)), "{w:?}");
    let r = End::wait_n(&b.rcq, 1);
    assert_eq!((r[0].wr_id, r[0].status), (8, WcStatus::Success));
    assert_eq!(&victim.to_vec()[64..128], &[0x3c; 64]);
    assert_eq!(victim.to_vec()[..64], [0; 64]);
    drop((c2, s2));
}
