//! Flush and object lifetime through the verbs API on real devices: a QP moved to
//! Error flushes every outstanding WR in posting order, a WR posted after Error
//! completes flushed, a disconnect / a destroy / device removal / device shutdown all
//! flush, destroy is safe at any time (also after the device is gone), and the in-use
//! checks of dealloc / destroy / dereg.

use std::time::Duration;

use crate::support::devices::*;
use softiwarp::transport::{CloseMode, ConnError, ConnEvent};
use softiwarp::DeviceEvent;
use softiwarp::QpInitAttr;
use verbs::{
    AsyncEvent, ObjectKind, QpAttr, QpState, RecvWr, SendFlags, SendWr, VerbsError, WcOpcode,
    WcStatus, WorkCompletion,
};

fn flushed(wcs: &[WorkCompletion], ids: impl IntoIterator<Item = u64>) {
    let ids: Vec<u64> = ids.into_iter().collect();
    let got: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(got, ids, "flush order");
    for w in wcs {
        assert_eq!(w.status, WcStatus::WrFlushErr, "{w:?}");
    }
}

/// The connection's final event, skipping others.
fn final_event(e: &End) -> ConnEvent {
    let c = e.conn.as_ref().expect("connected");
    loop {
        let ev = c.next_event(WAIT).expect("no final event");
        if ev.is_final() {
            return ev;
        }
    }
}

#[test]
fn modify_to_error_flushes_every_outstanding_wr_in_order() {
    const N: u64 = 24;
    let (a, b) = pair(&Setup::default());
    let mr = a.pd.reg_mr(1 << 16, 0x1000, all_access()).unwrap();
    let far = b.pd.reg_mr(1 << 16, 0x9000, all_access()).unwrap();
    for i in 0..5 {
        b.qp.post_recv(RecvWr::new(500 + i, vec![far.sge(i * 64, 64)]))
            .unwrap();
    }
    // In SQD nothing new starts: the WRs stay outstanding.
    a.qp.modify_state(QpState::Sqd).unwrap();
    assert_eq!(
        a.dev.next_async_event(WAIT),
        Some(AsyncEvent::SqDrained {
            qp_num: a.qp.qp_num()
        })
    );
    let mut opcodes = Vec::new();
    for i in 0..N {
        let sge = vec![mr.sge(i * 64, 64)];
        let wr = match i % 3 {
            0 => SendWr::send(i, sge),
            1 => SendWr::rdma_write(i, sge, far.iova(), far.rkey()),
            _ => SendWr::rdma_read(i, sge, far.iova(), far.rkey()),
        };
        opcodes.push(wr.op.wc_opcode());
        // Unsignaled WRs complete too when flushed.
        let wr = if i % 2 == 0 {
            wr.with_flags(SendFlags::SIGNALED)
        } else {
            wr
        };
        a.qp.post_send(wr).unwrap();
        a.qp.post_recv(RecvWr::new(1000 + i, vec![mr.sge(i * 64, 64)]))
            .unwrap();
    }
    let q = a.qp.query_qp();
    assert_eq!((q.sq_outstanding, q.rq_outstanding), (N, N));
    a.assert_quiet(Duration::from_millis(20));
    a.qp.modify_state(QpState::Error).unwrap();
    assert_eq!(a.qp.state(), QpState::Error);
    let s = a.send_wcs(N as usize);
    flushed(&s, 0..N);
    assert_eq!(
        s.iter().map(|w| w.opcode).collect::<Vec<_>>(),
        opcodes,
        "opcodes filled in"
    );
    flushed(&a.recv_wcs(N as usize), 1000..1000 + N);
    let q = a.qp.query_qp();
    assert_eq!((q.sq_outstanding, q.rq_outstanding), (0, 0));
    assert!(!q.connected);
    // WRs posted after Error complete at once, flushed.
    a.qp.post_send(SendWr::send(77, vec![]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    a.qp.post_send(SendWr::send(78, vec![])).unwrap(); // unsignaled: still completes
    a.qp.post_recv(RecvWr::new(79, vec![])).unwrap();
    flushed(&a.send_wcs(2), [77, 78]);
    flushed(&a.recv_wcs(1), [79]);
    a.assert_quiet(Duration::from_millis(20));
    // The connection was closed by the QP's move to Error; the peer's QP follows and
    // flushes its receives.
    assert_eq!(final_event(&a), ConnEvent::Closed);
    assert_eq!(final_event(&b), ConnEvent::Failed(ConnError::Reset));
    b.wait_state(QpState::Error);
    flushed(&b.recv_wcs(5), 500..505);
    // Error -> Reset -> Init: usable again, queues empty.
    a.qp.modify_state(QpState::Reset).unwrap();
    a.qp.modify_state(QpState::Init).unwrap();
    a.qp.post_recv(RecvWr::new(80, vec![])).unwrap();
    assert_eq!(a.qp.query_qp().rq_outstanding, 1);
    a.qp.modify_state(QpState::Error).unwrap();
    flushed(&a.recv_wcs(1), [80]);
}

#[test]
fn peer_disconnect_flushes_both_sides() {
    let (a, b) = pair(&Setup::default());
    for i in 0..8 {
        a.qp.post_recv(RecvWr::new(i, vec![])).unwrap();
        b.qp.post_recv(RecvWr::new(100 + i, vec![])).unwrap();
    }
    // One Send goes through first.
    a.qp.post_send(SendWr::send(9, vec![]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    assert_eq!(a.send_wcs(1)[0].status, WcStatus::Success);
    assert_eq!(b.recv_wcs(1)[0].wr_id, 100);
    b.conn.as_ref().unwrap().close(CloseMode::Graceful).unwrap();
    let ca = a.conn.as_ref().unwrap();
    assert!(matches!(
        ca.next_event(WAIT),
        Some(ConnEvent::Established(_))
    ));
    assert_eq!(ca.next_event(WAIT), Some(ConnEvent::Disconnected));
    assert_eq!(final_event(&a), ConnEvent::Closed);
    assert_eq!(final_event(&b), ConnEvent::Closed);
    a.wait_state(QpState::Error);
    b.wait_state(QpState::Error);
    flushed(&a.recv_wcs(8), 0..8);
    flushed(&b.recv_wcs(7), 101..108);
}

#[test]
fn destroy_flushes_and_closes_the_connection() {
    let (a, b) = pair(&Setup::default());
    let mr = a.pd.reg_mr(4096, 0, all_access()).unwrap();
    for i in 0..6 {
        a.qp.post_recv(RecvWr::new(i, vec![mr.sge(i * 64, 64)]))
            .unwrap();
    }
    let End {
        conn,
        qp,
        scq,
        rcq,
        pd,
        dev,
        control: _,
    } = a;
    qp.destroy().unwrap();
    // Every completion is there when destroy returns, and none comes after.
    assert_eq!(rcq.len(), 6);
    flushed(&rcq.poll(16).unwrap(), 0..6);
    std::thread::sleep(Duration::from_millis(20));
    assert!(rcq.is_empty() && scq.is_empty());
    assert_eq!(
        conn.as_ref().unwrap().wait_ended(WAIT),
        Some(None),
        "closed locally"
    );
    assert_eq!(final_event(&b), ConnEvent::Failed(ConnError::Reset));
    b.wait_state(QpState::Error);
    // Objects the QP used are free now.
    drop(mr);
    pd.dealloc().unwrap();
    scq.destroy().unwrap();
    rcq.destroy().unwrap();
    drop(dev);
}

#[test]
fn device_removal_flushes_every_qp_and_destroy_stays_safe() {
    let (a, b) = pair(&Setup::default());
    let mr = a.pd.reg_mr(4096, 0, all_access()).unwrap();
    // A second, unconnected QP on the same device, in Init with receives.
    let idle = a
        .dev
        .create_qp(
            &a.pd,
            QpInitAttr {
                send_cq: &a.scq,
                recv_cq: &a.scq,
                cap: cap(8, 1),
                sq_sig_all: false,
            },
        )
        .unwrap();
    idle.modify_state(QpState::Init).unwrap();
    for i in 0..3 {
        idle.post_recv(RecvWr::new(200 + i, vec![])).unwrap();
    }
    for i in 0..5 {
        a.qp.post_recv(RecvWr::new(i, vec![mr.sge(i * 8, 8)]))
            .unwrap();
    }
    a.control.remove();
    loop {
        match a.dev.next_event(WAIT) {
            Some(DeviceEvent::DeviceGone(_)) => break,
            Some(_) => continue,
            None => panic!("no DeviceGone"),
        }
    }
    assert_eq!(
        final_event(&a),
        ConnEvent::Failed(ConnError::DeviceGone(softiwarp::link::GoneReason::Injected))
    );
    assert_eq!(a.qp.state(), QpState::Error);
    assert_eq!(idle.state(), QpState::Error);
    flushed(&a.recv_wcs(5), 0..5);
    flushed(&End::wait_n(&a.scq, 3), 200..203);
    let mut async_events = Vec::new();
    while let Some(e) = a.dev.next_async_event(Duration::from_millis(100)) {
        async_events.push(e);
    }
    assert!(
        async_events.contains(&AsyncEvent::DeviceFatal),
        "{async_events:?}"
    );
    // Calls that need the engine fail with DeviceGone (EIO); local ones still work.
    assert_eq!(
        a.qp.post_send(SendWr::send(9, vec![])),
        Err(VerbsError::DeviceGone)
    );
    assert_eq!(
        a.qp.post_recv(RecvWr::new(9, vec![])),
        Err(VerbsError::DeviceGone)
    );
    assert_eq!(
        a.qp.modify_state(QpState::Reset),
        Err(VerbsError::DeviceGone)
    );
    assert_eq!(VerbsError::DeviceGone.errno(), verbs::errno::EIO);
    assert!(matches!(a.dev.alloc_pd(), Err(VerbsError::DeviceGone)));
    assert!(matches!(a.dev.create_cq(4), Err(VerbsError::DeviceGone)));
    mr.write(0, b"still mine").unwrap();
    let mut back = [0u8; 10];
    mr.read(0, &mut back).unwrap();
    assert_eq!(&back, b"still mine");
    assert!(a.scq.poll(4).unwrap().is_empty());
    idle.destroy().unwrap();
    let End { qp, .. } = a;
    qp.destroy().unwrap();
    drop(b);
}

#[test]
fn device_shutdown_flushes_and_objects_outlive_it() {
    let (a, b) = pair(&Setup::default());
    for i in 0..4 {
        b.qp.post_recv(RecvWr::new(i, vec![])).unwrap();
    }
    let End {
        conn,
        qp,
        scq: _scq,
        rcq,
        pd,
        dev,
        control: _,
    } = b;
    drop(dev);
    assert_eq!(qp.state(), QpState::Error);
    flushed(&rcq.poll(8).unwrap(), 0..4);
    assert_eq!(
        conn.as_ref().unwrap().ended(),
        Some(Some(ConnError::DeviceClosed))
    );
    assert_eq!(
        qp.post_recv(RecvWr::new(9, vec![])),
        Err(VerbsError::DeviceGone)
    );
    assert_eq!(qp.query_qp().state, QpState::Error);
    qp.destroy().unwrap();
    drop(conn);
    pd.dealloc().unwrap();
    // The peer learns of it through the RST.
    assert_eq!(final_event(&a), ConnEvent::Failed(ConnError::Reset));
    a.wait_state(QpState::Error);
}

#[test]
fn in_use_checks_and_state_rules() {
    let (a, b) = devices(&Setup::default());
    // A PD with an MR or a QP cannot be deallocated; a CQ used by a QP cannot be
    // destroyed (EBUSY).
    let pd = a.dev.alloc_pd().unwrap();
    let cq = a.dev.create_cq(16).unwrap();
    let mr = pd.reg_mr(64, 0x100, all_access()).unwrap();
    let busy = Err(VerbsError::InUse {
        object: ObjectKind::Pd,
    });
    assert_eq!(pd.dealloc(), busy);
    let qp = a
        .dev
        .create_qp(
            &pd,
            QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: cap(4, 1),
                sq_sig_all: false,
            },
        )
        .unwrap();
    mr.dereg().unwrap();
    assert!(matches!(
        mr.dereg(),
        Err(VerbsError::InvalidHandle {
            object: ObjectKind::Mr,
            ..
        })
    ));
    assert_eq!(pd.dealloc(), busy);
    assert_eq!(
        cq.destroy(),
        Err(VerbsError::InUse {
            object: ObjectKind::Cq
        })
    );
    assert_eq!(
        VerbsError::InUse {
            object: ObjectKind::Cq
        }
        .errno(),
        verbs::errno::EBUSY
    );
    // State rules of the post calls and modify_qp.
    assert_eq!(qp.state(), QpState::Reset);
    assert!(matches!(
        qp.post_recv(RecvWr::new(1, vec![])),
        Err(VerbsError::InvalidQpState {
            state: QpState::Reset,
            ..
        })
    ));
    assert!(matches!(
        qp.modify_state(QpState::Rts),
        Err(VerbsError::IllegalTransition(_))
    ));
    assert!(matches!(
        qp.modify_state(QpState::Error),
        Err(VerbsError::IllegalTransition(_))
    ));
    qp.modify_state(QpState::Init).unwrap();
    assert!(matches!(
        qp.post_send(SendWr::send(1, vec![])),
        Err(VerbsError::InvalidQpState {
            state: QpState::Init,
            ..
        })
    ));
    qp.post_recv(RecvWr::new(1, vec![])).unwrap();
    let wrong_cur = QpAttr {
        qp_state: Some(QpState::Rtr),
        cur_qp_state: Some(QpState::Rts),
        ..QpAttr::default()
    };
    assert_eq!(
        qp.modify_qp(&wrong_cur),
        Err(VerbsError::InvalidArgument {
            what: "cur_qp_state"
        })
    );
    let with_ord = QpAttr {
        qp_state: Some(QpState::Rtr),
        max_rd_atomic: Some(4),
        max_dest_rd_atomic: Some(3),
        ..QpAttr::default()
    };
    qp.modify_qp(&with_ord).unwrap();
    let q = qp.query_qp();
    assert_eq!(
        (q.state, q.ord, q.ird, q.rq_outstanding),
        (QpState::Rtr, 4, 3, 1)
    );
    assert!(matches!(
        qp.modify_qp(&QpAttr {
            max_rd_atomic: Some(1),
            ..QpAttr::default()
        }),
        Err(VerbsError::InvalidQpState { .. })
    ));
    // RTS needs a connection (as kernel siw), and an RTR QP cannot be handed to one.
    assert!(matches!(
        qp.modify_state(QpState::Rts),
        Err(VerbsError::InvalidQpState {
            state: QpState::Rtr,
            ..
        })
    ));
    assert_eq!(qp.state(), QpState::Rtr);
    assert!(matches!(
        a.dev.connect_qp(addr(2), PORT, Default::default(), &qp),
        Err(softiwarp::DeviceError::Verbs(
            VerbsError::InvalidQpState { .. }
        ))
    ));
    // Objects of another device are refused.
    assert!(matches!(
        b.dev.create_qp(
            &pd,
            QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: cap(4, 1),
                sq_sig_all: false,
            }
        ),
        Err(VerbsError::NotPermitted { .. })
    ));
    assert!(matches!(
        b.dev.connect_qp(addr(1), PORT, Default::default(), &qp),
        Err(softiwarp::DeviceError::Verbs(
            VerbsError::NotPermitted { .. }
        ))
    ));
    // Capability checks.
    assert!(matches!(
        a.dev.create_qp(
            &pd,
            QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: cap(0, 1),
                sq_sig_all: false,
            }
        ),
        Err(VerbsError::InvalidArgument {
            what: "max_send_wr"
        })
    ));
    assert!(matches!(
        a.dev.create_cq(0),
        Err(VerbsError::InvalidArgument { what: "cqe" })
    ));
    // Destroying the QP flushes its receive and frees the PD and CQ.
    qp.destroy().unwrap();
    let w = cq.poll(4).unwrap();
    assert_eq!(
        (w.len(), w[0].wr_id, w[0].status, w[0].opcode),
        (1, 1, WcStatus::WrFlushErr, WcOpcode::Recv)
    );
    cq.destroy().unwrap();
    assert!(matches!(
        cq.destroy(),
        Err(VerbsError::InvalidHandle { .. })
    ));
    pd.dealloc().unwrap();
    assert!(matches!(
        pd.dealloc(),
        Err(VerbsError::InvalidHandle { .. })
    ));
    assert!(matches!(
        pd.reg_mr(64, 0, all_access()),
        Err(VerbsError::InvalidHandle { .. })
    ));
}

#[test]
fn cq_overflow_is_reported_never_silent() {
    let (a, _b) = devices(&Setup::default());
    let small = a.dev.create_cq(4).unwrap();
    let qp = a
        .dev
        .create_qp(
            &a.pd,
            QpInitAttr {
                send_cq: &small,
                recv_cq: &small,
                cap: cap(8, 1),
                sq_sig_all: false,
            },
        )
        .unwrap();
    qp.modify_state(QpState::Init).unwrap();
    for i in 0..6 {
        qp.post_recv(RecvWr::new(i, vec![])).unwrap();
    }
    qp.modify_state(QpState::Error).unwrap();
    // Four fit; two are lost, counted, and reported.
    let got = small.poll(16).unwrap();
    flushed(&got, 0..4);
    assert_eq!(
        small.poll(16),
        Err(softiwarp::CqError::Overflow {
            cq: small.handle(),
            lost: 2
        })
    );
    assert!(small.is_error());
    assert_eq!(
        small.take_async_event(),
        Some(AsyncEvent::CqErr { cq: small.handle() })
    );
    assert_eq!(
        a.dev.next_async_event(WAIT),
        Some(AsyncEvent::CqErr { cq: small.handle() })
    );
}

/// The CQ's future works from a tokio runtime: a task awaits completions while the
/// engine thread produces them.
#[test]
fn cq_wait_async_from_tokio() {
    let (a, b) = pair(&Setup::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    for i in 0..10 {
        b.qp.post_recv(RecvWr::new(i, vec![])).unwrap();
    }
    let sender = std::thread::scope(|s| {
        let t = s.spawn(|| {
            for i in 0..10 {
                std::thread::sleep(Duration::from_millis(2));
                a.qp.post_send(SendWr::send(i, vec![])).unwrap();
            }
        });
        let got = rt.block_on(async {
            let mut got = Vec::new();
            while got.len() < 10 {
                tokio::time::timeout(WAIT, b.rcq.wait_async())
                    .await
                    .expect("completion within the timeout");
                got.extend(b.rcq.poll(16).unwrap());
            }
            got
        });
        t.join().unwrap();
        got
    });
    let ids: Vec<u64> = sender.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..10).collect::<Vec<_>>());
    assert!(sender.iter().all(|w| w.status == WcStatus::Success));
}
