//! Application threads drive the device ([`ProgressMode::Hybrid`], design.md section 5
//! "Progress"): posts, polls and blocking waits from several threads at once, then the
//! client's link removed in the middle of the traffic. Exact accounting: every WR a
//! post call accepted completes exactly once (successfully or flushed), every WR it
//! refused was refused with `DeviceGone` after the removal, every delivered Send carries
//! the stamp of a Send that completed successfully, and the removal is noticed (the
//! first flushed completion, `DeviceGone` on the device) within 100 ms while an
//! application thread waits on its CQ as the link's poller.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::devices::*;
use crate::support::{thread_ticks, ticks_per_second};
use softiwarp::{DeviceEvent, ProgressMode};
use verbs::{RecvWr, SendFlags, SendWr, VerbsError, WcOpcode, WcStatus};

/// Sends per sender thread.
const PER_SENDER: u64 = 600;
/// Sender threads on the client's one QP.
const SENDERS: u64 = 2;
/// Receives the server posts (more than all the Sends: none may find no receive).
const RECVS: u64 = PER_SENDER * SENDERS + 64;
/// Client Sends completed before the link is removed.
const REMOVE_AFTER: usize = 300;

/// Completions by WR id: every status each WR completed with.
type Completed = Mutex<BTreeMap<u64, Vec<WcStatus>>>;

fn record(into: &Completed, wc: &verbs::WorkCompletion) {
    into.lock()
        .unwrap()
        .entry(wc.wr_id)
        .or_default()
        .push(wc.status);
}

fn id(sender: u64, i: u64) -> u64 {
    (sender << 32) | i
}

#[test]
fn hybrid_progress_from_many_threads_accounts_for_every_wr_through_removal() {
    let s = Setup {
        cap: cap(2048, 1),
        progress: Some(ProgressMode::Hybrid),
        ..Setup::default()
    };
    let (mut a, mut b) = devices(&s);
    let rmr = Arc::new(b.pd.reg_mr(RECVS * 8, 0x10_0000, all_access()).unwrap());
    // Two threads post the server's receives while the connection comes up.
    connect_with(&mut a, &mut b, &s, |_, b| {
        if b.qp.state() == verbs::QpState::Reset {
            b.qp.modify_state(verbs::QpState::Init).unwrap();
        }
        std::thread::scope(|sc| {
            for half in 0..2u64 {
                let (qp, rmr) = (&b.qp, &rmr);
                sc.spawn(move || {
                    for r in (half..RECVS).step_by(2) {
                        qp.post_recv(RecvWr::new(r, vec![rmr.sge(r * 8, 8)]))
                            .unwrap();
                    }
                });
            }
        });
    });
    let a = Arc::new(a);
    let b = Arc::new(b);
    let smr = Arc::new(
        a.pd.reg_mr(SENDERS * PER_SENDER * 8, 0x20_0000, all_access())
            .unwrap(),
    );

    // Accepted client Sends, and those refused after the removal.
    let accepted = Arc::new(Mutex::new(BTreeSet::new()));
    let refused = Arc::new(AtomicU64::new(0));
    let removed = Arc::new(AtomicBool::new(false));
    let send_wcs: Arc<Completed> = Arc::default();

    std::thread::scope(|sc| {
        let mut senders = Vec::new();
        for k in 0..SENDERS {
            let (a, smr, accepted, refused, removed) = (&a, &smr, &accepted, &refused, &removed);
            senders.push(sc.spawn(move || {
                for i in 0..PER_SENDER {
                    let slot = (k * PER_SENDER + i) * 8;
                    smr.write(slot as usize, &id(k, i).to_le_bytes()).unwrap();
                    let wr = SendWr::send(id(k, i), vec![smr.sge(slot, 8)])
                        .with_flags(SendFlags::SIGNALED);
                    loop {
                        match a.qp.post_send(wr.clone()) {
                            Ok(()) => {
                                accepted.lock().unwrap().insert(id(k, i));
                                break;
                            }
                            Err(VerbsError::QueueFull { .. }) => std::thread::yield_now(),
                            Err(e) => {
                                assert!(
                                    removed.load(Ordering::SeqCst),
                                    "post refused before the removal: {e}"
                                );
                                refused.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                }
            }));
        }
        // The client's send CQ: a blocking waiter (the link's poller) and, after the
        // removal, until every accepted Send has completed.
        let waiter = {
            let (a, send_wcs, accepted, removed) = (&a, &send_wcs, &accepted, &removed);
            sc.spawn(move || {
                let mut first_flush: Option<Instant> = None;
                let deadline = Instant::now() + WAIT;
                loop {
                    let done = send_wcs.lock().unwrap().len();
                    let all = removed.load(Ordering::SeqCst)
                        && done >= accepted.lock().unwrap().len()
                        && a.qp.state() == verbs::QpState::Error;
                    if all {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "send completions stuck at {done}"
                    );
                    a.scq.wait(Duration::from_millis(20));
                    for wc in a.scq.poll(64).unwrap() {
                        if wc.status == WcStatus::WrFlushErr && first_flush.is_none() {
                            first_flush = Some(Instant::now());
                        }
                        record(send_wcs, &wc);
                    }
                }
                first_flush
            })
        };
        // The server's receive CQ, polled (never blocking) from another thread.
        let receiver = {
            let b = &b;
            sc.spawn(move || {
                let mut got = BTreeMap::new();
                let deadline = Instant::now() + WAIT;
                while b.qp.state() != verbs::QpState::Error || !b.rcq.is_empty() {
                    assert!(Instant::now() < deadline, "receiver stuck");
                    let wcs = b.rcq.poll(64).unwrap();
                    if wcs.is_empty() {
                        std::thread::yield_now();
                    }
                    for wc in wcs {
                        got.entry(wc.wr_id).or_insert_with(Vec::new).push(wc);
                    }
                }
                got
            })
        };
        // Remove the client's link once enough Sends completed.
        let deadline = Instant::now() + WAIT;
        while send_wcs.lock().unwrap().len() < REMOVE_AFTER {
            assert!(Instant::now() < deadline, "no traffic");
            std::thread::sleep(Duration::from_millis(1));
        }
        removed.store(true, Ordering::SeqCst);
        let t0 = Instant::now();
        a.control.remove();
        let gone = a.dev.next_event(Duration::from_secs(5));
        let noticed = t0.elapsed();
        assert!(matches!(gone, Some(DeviceEvent::DeviceGone(_))), "{gone:?}");
        for t in senders {
            t.join().unwrap();
        }
        let first_flush = waiter.join().unwrap();
        // Completions pushed after the waiter's last look.
        for wc in a.scq.poll(usize::MAX).unwrap() {
            record(&send_wcs, &wc);
        }
        println!(
            "device gone noticed after {noticed:?}, first flushed send after {:?}",
            first_flush.map(|f| f.saturating_duration_since(t0))
        );
        assert!(noticed < Duration::from_millis(100), "{noticed:?}");
        // The server never hears of it (the link is gone): flush its receives.
        b.qp.modify_state(verbs::QpState::Error).unwrap();
        let got = receiver.join().unwrap();

        // Client: every accepted Send completed exactly once; success or flush only.
        let accepted = accepted.lock().unwrap().clone();
        let wcs = send_wcs.lock().unwrap().clone();
        assert_eq!(wcs.keys().copied().collect::<BTreeSet<_>>(), accepted);
        let mut delivered_ok = BTreeSet::new();
        for (wr, statuses) in &wcs {
            assert_eq!(statuses.len(), 1, "WR {wr:#x} completed {statuses:?}");
            match statuses[0] {
                WcStatus::Success => {
                    delivered_ok.insert(*wr);
                }
                WcStatus::WrFlushErr => {}
                other => panic!("WR {wr:#x}: {other:?}"),
            }
        }
        assert_eq!(
            accepted.len() as u64 + refused.load(Ordering::Relaxed),
            SENDERS * PER_SENDER
        );
        // Server: every posted receive completed exactly once; each successful one
        // carries the stamp of a Send the client saw complete, no stamp twice.
        assert_eq!(got.len() as u64, RECVS, "receives completed");
        let mut stamps = BTreeSet::new();
        for (r, wcs) in &got {
            assert_eq!(wcs.len(), 1, "receive {r} completed {} times", wcs.len());
            let wc = &wcs[0];
            match wc.status {
                WcStatus::Success => {
                    assert_eq!(wc.opcode, WcOpcode::Recv);
                    assert_eq!(wc.byte_len, 8);
                    let mut stamp = [0u8; 8];
                    rmr.read(*r as usize * 8, &mut stamp).unwrap();
                    assert!(stamps.insert(u64::from_le_bytes(stamp)), "stamp twice");
                }
                WcStatus::WrFlushErr => {}
                other => panic!("receive {r}: {other:?}"),
            }
        }
        // A Send is complete once passed to TCP (siw semantics): delivered Sends are a
        // subset of the successful ones.
        assert!(
            stamps.is_subset(&delivered_ok),
            "a stamp from a Send that did not succeed"
        );
        assert!(
            stamps.len() >= REMOVE_AFTER / 2,
            "only {} delivered",
            stamps.len()
        );
    });
}

/// An application thread drives (a post holds the link's lease), then sleeps in its own
/// code: the lease lapses, the engine thread takes the link back and notices the
/// removal within 100 ms without any verbs call.
#[test]
fn hybrid_removal_is_noticed_while_the_driving_thread_sleeps_in_its_own_code() {
    let s = Setup {
        progress: Some(ProgressMode::Hybrid),
        ..Setup::default()
    };
    let (a, b) = pair(&s);
    let mr = a.pd.reg_mr(64, 0x1000, all_access()).unwrap();
    b.qp.post_recv(RecvWr::new(1, vec![])).unwrap();
    a.qp.post_send(SendWr::send(2, vec![mr.sge(0, 0)]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    let t0 = Instant::now();
    a.control.remove();
    // The poster's own code: no verbs call for 300 ms.
    let watcher = std::thread::spawn({
        let ev = Arc::new(a);
        move || {
            let got = ev.dev.next_event(Duration::from_secs(5));
            (got, t0.elapsed(), ev)
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let (got, noticed, a) = watcher.join().unwrap();
    println!("device gone noticed after {noticed:?}");
    assert!(matches!(got, Some(DeviceEvent::DeviceGone(_))), "{got:?}");
    assert!(noticed < Duration::from_millis(100), "{noticed:?}");
    // The Send completed once: successfully (passed to TCP before) or flushed.
    let wcs = End::wait_n(&a.scq, 1);
    assert!(matches!(
        wcs[0].status,
        WcStatus::Success | WcStatus::WrFlushErr
    ));
    assert!(a.scq.poll(8).unwrap().is_empty());
    drop(b);
}

/// After a burst driven by application threads, the device goes quiet: one second
/// later, over one second, both engine threads and the application thread that drove
/// (now idle in its own code) use under 3% of a core together (no thread left spinning
/// on a lease, a poller state or the link).
#[test]
fn hybrid_device_is_idle_one_second_after_a_burst() {
    let s = Setup {
        progress: Some(ProgressMode::Hybrid),
        ..Setup::default()
    };
    let (a, b) = pair(&s);
    let mr = a.pd.reg_mr(1 << 16, 0x1000, all_access()).unwrap();
    let rmr = b.pd.reg_mr(1 << 16, 0x1000, all_access()).unwrap();
    let app_tid = nix::unistd::gettid().as_raw();
    for round in 0..20u64 {
        for i in 0..32u64 {
            b.qp.post_recv(RecvWr::new(round * 32 + i, vec![rmr.sge(0, 1 << 16)]))
                .unwrap();
        }
        for i in 0..32u64 {
            a.qp.post_send(
                SendWr::send(round * 32 + i, vec![mr.sge(0, 1 << 16)])
                    .with_flags(SendFlags::SIGNALED),
            )
            .unwrap();
        }
        let sent = End::wait_n(&a.scq, 32);
        assert!(sent.iter().all(|wc| wc.status == WcStatus::Success));
        let got = End::wait_n(&b.rcq, 32);
        assert!(got.iter().all(|wc| wc.byte_len == 1 << 16));
    }
    std::thread::sleep(Duration::from_secs(1));
    let tids = [a.dev.engine_tid(), b.dev.engine_tid(), app_tid];
    let before: u64 = tids.iter().map(|&t| thread_ticks(t)).sum();
    let wall = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let wall = wall.elapsed();
    let used = tids.iter().map(|&t| thread_ticks(t)).sum::<u64>() - before;
    let share = used as f64 / ticks_per_second() as f64 / wall.as_secs_f64();
    println!(
        "after the burst: {used} ticks in {wall:?} ({:.1}%)",
        share * 100.0
    );
    assert!(share < 0.03, "idle device used {:.1}% CPU", share * 100.0);
}

/// After an application thread drove for 300 ms without a pause (polling an empty CQ,
/// which renews the link's lease on every pass, so the engine's naps have grown to
/// `LEASE_NAP_MAX`), it stops: the engine takes the link back, and a Send posted and
/// then left alone completes, as does the receive it lands in.
#[test]
fn hybrid_engine_takes_the_link_back_after_a_long_drive() {
    let s = Setup {
        progress: Some(ProgressMode::Hybrid),
        ..Setup::default()
    };
    let (a, b) = pair(&s);
    let mr = a.pd.reg_mr(4096, 0x1000, all_access()).unwrap();
    let rmr = b.pd.reg_mr(4096, 0x1000, all_access()).unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(300) {
        assert!(a.scq.poll(4).unwrap().is_empty());
    }
    b.qp.post_recv(RecvWr::new(1, vec![rmr.sge(0, 4096)]))
        .unwrap();
    a.qp.post_send(SendWr::send(2, vec![mr.sge(0, 4096)]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    let got = End::wait_n(&b.rcq, 1);
    assert_eq!((got[0].wr_id, got[0].status), (1, WcStatus::Success));
    let sent = End::wait_n(&a.scq, 1);
    assert_eq!((sent[0].wr_id, sent[0].status), (2, WcStatus::Success));
}
