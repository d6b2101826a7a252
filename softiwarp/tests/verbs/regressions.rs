//! Regression tests for bugs an adversarial tester found in the verbs layer:
//!
//! - a malformed Terminate from the peer moved the QP to Error but left the
//!   connection open (a QP in Error must never keep a live connection);
//! - a QP moved Init -> RTR -> RTS without a connection accepted send WRs that never
//!   completed (RTS needs the LLP connection, as in kernel siw);
//! - `Cq::destroy` / `Pd::dealloc` succeeded right after a QP was dropped, before the
//!   engine flushed it, and the flushed completions then reached the destroyed CQ.
//! - a QP created on one thread while another destroyed its CQ (or deallocated its
//!   PD): the destroy checked the QP count before the creation raised it, and the
//!   creation checked the CQ before the destroy marked it, so both succeeded and the
//!   QP used a destroyed CQ.

use std::time::{Duration, Instant};

use crate::support::devices::*;
use softiwarp::transport::{ConnError, MpaParams};
use softiwarp::CqError;
use softiwarp::QpInitAttr;
use verbs::{ObjectKind, QpState, RecvWr, SendFlags, SendWr, VerbsError, WcStatus};

/// An untagged segment: DDP control `T=0 L DV=1`, RDMAP control `RV=1 opcode`,
/// RsvdULP word, QN, MSN, MO, payload.
fn untagged(opcode: u8, qn: u32, msn: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0x41, 0x40 | opcode];
    v.extend(0u32.to_be_bytes());
    v.extend(qn.to_be_bytes());
    v.extend(msn.to_be_bytes());
    v.extend(0u32.to_be_bytes());
    v.extend(payload);
    v
}

/// A raw stream client on host 1 sends `terminate` to a QP accepted on host 2: the QP
/// goes to Error, its receive is flushed, and the connection ends on both sides (the
/// peer sees it fail; the victim sees `TerminateReceived` if the stack recognised the
/// Terminate, else the abort the engine made), with the QP no longer connected.
fn malformed_terminate_ends_the_connection(terminate: &[u8], recognised: bool) {
    assert!(
        ddp_rdmap::Ulpdu::parse(terminate).is_err(),
        "the Terminate must be malformed"
    );
    let (a, b) = devices(&Setup::default());
    let listener = b.dev.listen(PORT, 1).expect("listen");
    let raw = a
        .dev
        .connect(
            addr(2),
            PORT,
            MpaParams {
                private_data: vec![],
                ird: 4,
                ord: 4,
                settings: None,
            },
        )
        .expect("connect");
    let req = listener.next_request(WAIT).expect("request");
    let served = req.accept_qp(&b.qp, b"", 4, 4).expect("accept_qp");
    raw.wait_established(WAIT).expect("raw established");
    served.wait_established(WAIT).expect("served established");
    b.wait_state(QpState::Rts);
    b.qp.post_recv(RecvWr::new(1, vec![])).unwrap();

    raw.send_ulpdu(terminate, WAIT).expect("send the Terminate");
    b.wait_state(QpState::Error);
    let wcs = b.recv_wcs(1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::WrFlushErr));
    // Both ends see the connection fail.
    match served.wait_ended(WAIT) {
        Some(Some(ConnError::TerminateReceived(_))) if recognised => {}
        Some(_) if !recognised => {}
        other => panic!("victim's connection: {other:?}"),
    }
    match raw.wait_ended(WAIT) {
        Some(Some(_)) => {}
        other => panic!("peer's connection: {other:?}"),
    }
    let deadline = Instant::now() + WAIT;
    while b.qp.query_qp().connected {
        assert!(Instant::now() < deadline, "QP in Error still connected");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn terminate_without_control_word_aborts_the_connection() {
    // QN 2, opcode 7, no Terminate Control word at all.
    malformed_terminate_ends_the_connection(&untagged(7, 2, 1, &[]), true);
}

#[test]
fn terminate_with_d_flag_and_junk_aborts_the_connection() {
    // Terminate Control with D set (DDP header copied), followed by 3 junk bytes
    // instead of a DDP header.
    let control = [0x00, 0x00, ddp_rdmap::terminate::FLAG_D, 0x00];
    let mut t = untagged(7, 2, 1, &control);
    t.extend([0xde, 0xad, 0xbe]);
    malformed_terminate_ends_the_connection(&t, true);
}

#[test]
fn qp_in_error_by_itself_aborts_the_connection() {
    // A Terminate header on QN 0 without a control word: not recognised by the stack
    // (it reaches the QP), yet the QP takes it as the peer's Terminate and goes to
    // Error without answering; the engine then aborts the connection.
    malformed_terminate_ends_the_connection(&untagged(7, 0, 1, &[]), false);
}

#[test]
fn rts_needs_a_connection() {
    let s = Setup::default();
    let (mut a, mut b) = devices(&s);
    a.qp.modify_state(QpState::Init).unwrap();
    a.qp.modify_state(QpState::Rtr).unwrap();
    assert!(matches!(
        a.qp.modify_state(QpState::Rts),
        Err(VerbsError::InvalidQpState {
            state: QpState::Rtr,
            ..
        })
    ));
    assert_eq!(a.qp.state(), QpState::Rtr);
    // So no send WR is accepted that could never complete.
    assert!(matches!(
        a.qp.post_send(SendWr::send(1, vec![]).with_flags(SendFlags::SIGNALED)),
        Err(VerbsError::InvalidQpState {
            op: "post_send",
            state: QpState::Rtr,
        })
    ));
    assert!(!a.qp.query_qp().connected);
    // Back to Reset, the QP connects and runs normally.
    a.qp.modify_state(QpState::Reset).unwrap();
    b.qp.modify_state(QpState::Init).unwrap();
    connect_with(&mut a, &mut b, &s, |_, b| {
        b.qp.post_recv(RecvWr::new(7, vec![])).unwrap();
    });
    a.qp.post_send(SendWr::send(8, vec![]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    let s = a.send_wcs(1);
    assert_eq!((s[0].wr_id, s[0].status), (8, WcStatus::Success));
    let r = b.recv_wcs(1);
    assert_eq!((r[0].wr_id, r[0].status), (7, WcStatus::Success));
}

#[test]
fn cq_and_pd_stay_in_use_until_a_dropped_qp_is_flushed() {
    const WRS: u64 = 64;
    let (a, _b) = devices(&Setup::default());
    for round in 0..16 {
        let pd = a.dev.alloc_pd().unwrap();
        let cq = a.dev.create_cq(1024).unwrap();
        let qp = a
            .dev
            .create_qp(
                &pd,
                QpInitAttr {
                    send_cq: &cq,
                    recv_cq: &cq,
                    cap: cap(WRS as u32, 1),
                    sq_sig_all: false,
                },
            )
            .unwrap();
        qp.modify_state(QpState::Init).unwrap();
        for i in 0..WRS {
            qp.post_recv(RecvWr::new(i, vec![])).unwrap();
        }
        // Destroyed without waiting: the engine flushes the receives later.
        drop(qp);
        let deadline = Instant::now() + WAIT;
        let busy = |r: Result<(), VerbsError>, object| match r {
            Ok(()) => false,
            Err(VerbsError::InUse { object: o }) if o == object => {
                assert!(Instant::now() < deadline, "still in use");
                std::thread::yield_now();
                true
            }
            Err(e) => panic!("{e}"),
        };
        if round % 2 == 0 {
            // The PD is released only after the flush: every completion is there.
            while busy(pd.dealloc(), ObjectKind::Pd) {}
            assert_eq!(cq.len(), WRS as usize, "PD released before the flush");
            cq.destroy().unwrap();
        } else {
            let mut polled = 0;
            loop {
                let r = cq.destroy();
                if !busy(r, ObjectKind::Cq) {
                    break;
                }
                polled += cq.poll(WRS as usize).unwrap().len();
            }
            assert!(polled <= WRS as usize);
            pd.dealloc().unwrap();
        }
        // Nothing is delivered into the destroyed CQ.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(cq.len(), 0, "completions reached a destroyed CQ");
        assert_eq!(
            cq.poll(WRS as usize),
            Err(CqError::Destroyed { cq: cq.handle() })
        );
    }
}

/// Which parent of a QP [`creation_racing_a_destroy_never_both_succeed`] destroys.
#[derive(Clone, Copy, Debug)]
enum Parent {
    Cq,
    Pd,
}

/// Creates a QP on one thread while another destroys its CQ or deallocates its PD,
/// `rounds` times with a varying head start: never both succeed, and each failure is
/// the documented one (`InUse` for the destroy, `InvalidHandle` for the creation).
fn creation_racing_a_destroy(parent: Parent, rounds: usize) -> (usize, usize) {
    let (a, _b) = devices(&Setup::default());
    let (mut destroy_won, mut create_won) = (0, 0);
    for round in 0..rounds {
        let pd = a.dev.alloc_pd().unwrap();
        let cq = a.dev.create_cq(64).unwrap();
        let barrier = std::sync::Barrier::new(2);
        let (qp, destroyed) = std::thread::scope(|s| {
            let creator = s.spawn(|| {
                barrier.wait();
                a.dev.create_qp(
                    &pd,
                    QpInitAttr {
                        send_cq: &cq,
                        recv_cq: &cq,
                        cap: cap(16, 1),
                        sq_sig_all: false,
                    },
                )
            });
            barrier.wait();
            for _ in 0..(round % 40) * 50 {
                std::hint::spin_loop();
            }
            let destroyed = match parent {
                Parent::Cq => cq.destroy(),
                Parent::Pd => pd.dealloc(),
            };
            (creator.join().unwrap(), destroyed)
        });
        let object = match parent {
            Parent::Cq => ObjectKind::Cq,
            Parent::Pd => ObjectKind::Pd,
        };
        match (qp, destroyed) {
            (Ok(_), Ok(())) => {
                panic!("round {round}: the QP was created and its {parent:?} destroyed")
            }
            (Ok(qp), Err(e)) => {
                assert_eq!(e, VerbsError::InUse { object }, "round {round}");
                create_won += 1;
                qp.destroy().unwrap();
            }
            (Err(e), Ok(())) => {
                assert!(
                    matches!(e, VerbsError::InvalidHandle { object: o, .. } if o == object),
                    "round {round}: {e}"
                );
                destroy_won += 1;
            }
            // Both refused: possible when they race (the creation saw the destroy
            // deciding, the destroy saw the creation's count), never both succeeding.
            (Err(_), Err(_)) => {}
        }
        // Whatever is left goes (the engine may still hold a destroyed QP briefly).
        let deadline = Instant::now() + WAIT;
        let gone = |f: &dyn Fn() -> Result<(), VerbsError>| loop {
            match f() {
                Ok(()) | Err(VerbsError::InvalidHandle { .. }) => break,
                Err(VerbsError::InUse { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("round {round}: cleanup: {e}"),
            }
        };
        gone(&|| cq.destroy());
        gone(&|| pd.dealloc());
    }
    (destroy_won, create_won)
}

#[test]
fn creation_racing_a_destroy_never_both_succeed() {
    for parent in [Parent::Cq, Parent::Pd] {
        let (destroy_won, create_won) = creation_racing_a_destroy(parent, 400);
        println!("{parent:?}: destroy won {destroy_won}, creation won {create_won}");
    }
}
