//! loom models of the progress protocol (`softiwarp::progress`, shared/progress-design.md
//! section 3.7) and of the CQ's conditional notify, run on the real code with a toy
//! driver that counts work. Each model runs twice: as built (it must pass) and with its
//! deliberate break (it must fail, with the message named in `should_panic`), so a model
//! that cannot fail is itself a failing test.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p softiwarp --release --test loom_progress`
//! (scripts/test.sh does, with its own target dir).
#![cfg(loom)]

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use loom::sync::atomic::AtomicBool;
use loom::sync::{Arc, Mutex};
use loom::thread;

use softiwarp::progress::{
    Budget, Drive, Drove, EngineView, Gate, Outbox, Owner, Pass, Progress, ProgressBreak,
};
use softiwarp::resources::completion_queue::CompletionQueue;
use verbs::{WcOpcode, WcStatus, WorkCompletion};

/// Work published for the driver (a QP's posted WRs in the device).
type Queue = Arc<Mutex<Vec<u32>>>;

/// The toy driver: each pass takes every published item and completes it; when asked
/// to end, it closes the gate, takes the queue once more (flushing) and ends.
struct Toy {
    queue: Queue,
    gate: Arc<Gate>,
    end: Arc<AtomicBool>,
    /// Item -> how often it completed (done or flushed).
    completed: Arc<Mutex<BTreeMap<u32, u32>>>,
    /// Items per pass before it reports `more` (the budget's effect).
    per_pass: usize,
}

#[derive(Default)]
struct NoOutbox;
impl Outbox for NoOutbox {
    fn run(&mut self) {}
}

impl Drive for Toy {
    type Outbox = NoOutbox;
    fn pass(&mut self, _rounds: u32, _out: &mut NoOutbox) -> Pass {
        let ending = self.end.load(SeqCst);
        if ending {
            self.gate.close();
        }
        let mut q = self.queue.lock().unwrap();
        let n = if ending {
            q.len()
        } else {
            q.len().min(self.per_pass)
        };
        let taken: Vec<u32> = q.drain(..n).collect();
        let more = !q.is_empty();
        drop(q);
        let mut c = self.completed.lock().unwrap();
        for i in &taken {
            *c.entry(*i).or_default() += 1;
        }
        Pass {
            active: !taken.is_empty(),
            more,
            ended: ending,
        }
    }
}

struct World {
    progress: Progress<Toy>,
    queue: Queue,
    gate: Arc<Gate>,
    end: Arc<AtomicBool>,
    completed: Arc<Mutex<BTreeMap<u32, u32>>>,
}

fn world(brk: Option<ProgressBreak>, per_pass: usize) -> Arc<World> {
    let queue: Queue = Arc::default();
    let gate = Arc::new(Gate::with_break(brk));
    let end = Arc::new(AtomicBool::new(false));
    let completed: Arc<Mutex<BTreeMap<u32, u32>>> = Arc::default();
    let toy = Toy {
        queue: queue.clone(),
        gate: gate.clone(),
        end: end.clone(),
        completed: completed.clone(),
        per_pass,
    };
    Arc::new(World {
        progress: Progress::with_break(toy, brk),
        queue,
        gate,
        end,
        completed,
    })
}

const POST: Budget = Budget {
    passes: 4,
    rounds: 1,
};

/// A post call: queue under the gate, then drive. Returns whether the item was
/// accepted and whether the drive left work for the engine.
fn post(w: &World, item: u32) -> (bool, bool) {
    let Some(open) = w.gate.enter() else {
        return (false, false);
    };
    w.queue.lock().unwrap().push(item);
    drop(open);
    let left = matches!(
        w.progress.drive(POST),
        Drove::Drove {
            left_pending: true,
            ..
        }
    );
    (true, left)
}

/// Model 1: posters against a holder. Two threads each publish an item and drive; one
/// of them usually loses the try-lock and returns `Busy`, trusting the holder's
/// re-check. Afterwards every item completed exactly once, unless some drive reported
/// `left_pending` (it then wakes the engine, which is not part of this model).
fn poster_against_holder(brk: Option<ProgressBreak>) {
    loom::model(move || {
        let w = world(brk, usize::MAX);
        let w2 = w.clone();
        let t = thread::spawn(move || post(&w2, 2));
        let (_, left1) = post(&w, 1);
        let (_, left2) = t.join().unwrap();
        let c = w.completed.lock().unwrap().clone();
        if !(left1 || left2) {
            assert_eq!(
                c,
                BTreeMap::from([(1, 1), (2, 1)]),
                "stranded work: a published item was never run"
            );
        }
        assert!(c.values().all(|&n| n == 1), "an item ran twice: {c:?}");
    });
}

#[test]
fn poster_against_holder_holds() {
    poster_against_holder(None);
}

#[test]
#[should_panic(expected = "stranded work")]
fn poster_against_holder_fails_without_the_fences() {
    poster_against_holder(Some(ProgressBreak::NoFence));
}

#[test]
#[should_panic(expected = "stranded work")]
fn poster_against_holder_fails_when_pending_is_cleared_after_the_pass() {
    poster_against_holder(Some(ProgressBreak::ClearAfterPass));
}

/// Model 1b: a budget smaller than the work. One item per pass and one pass per drive:
/// whoever stops with work left says so (`left_pending`), and the engine's drive
/// (modelled after the posters) finishes it.
#[test]
fn budget_left_work_is_reported_and_finished_by_the_engine() {
    loom::model(|| {
        let w = world(None, 1);
        let w2 = w.clone();
        let one_pass = Budget {
            passes: 1,
            rounds: 1,
        };
        let t = thread::spawn(move || {
            w2.queue.lock().unwrap().extend([3, 4]);
            w2.progress.drive(one_pass)
        });
        w.queue.lock().unwrap().push(1);
        let a = w.progress.drive(one_pass);
        let b = t.join().unwrap();
        let left = |d: Drove| {
            matches!(
                d,
                Drove::Drove {
                    left_pending: true,
                    ..
                }
            )
        };
        let done = w.completed.lock().unwrap().len();
        if done < 3 {
            assert!(left(a) || left(b), "work left but nobody said so");
            assert!(w.progress.pending());
        }
        // The engine: drives until nothing is pending.
        while w.progress.pending() {
            w.progress.drive(one_pass);
        }
        let c = w.completed.lock().unwrap().clone();
        assert_eq!(c, BTreeMap::from([(1, 1), (3, 1), (4, 1)]));
    });
}

/// Model 3: a post against the device's end. The poster queues under the gate; the
/// ending driver closes the gate and takes the queue once more. An accepted item
/// completes exactly once (run or flushed), a refused one never; the device ends.
fn post_against_device_end(brk: Option<ProgressBreak>) {
    loom::model(move || {
        let w = world(brk, usize::MAX);
        let w2 = w.clone();
        let t = thread::spawn(move || post(&w2, 7).0);
        w.end.store(true, SeqCst);
        let mut d = w.progress.drive(POST);
        // The poster may hold the lock: the end is its pass's to run then.
        while d != Drove::Ended {
            thread::yield_now();
            d = w.progress.drive(POST);
        }
        let accepted = t.join().unwrap();
        let c = w.completed.lock().unwrap().clone();
        if accepted {
            assert_eq!(
                c,
                BTreeMap::from([(7, 1)]),
                "an accepted WR was lost at the device's end"
            );
        } else {
            assert!(c.is_empty(), "a refused WR completed: {c:?}");
        }
        assert!(w.gate.is_closed());
        assert_eq!(w.progress.drive(POST), Drove::Ended);
    });
}

#[test]
fn post_against_device_end_holds() {
    post_against_device_end(None);
}

#[test]
#[should_panic(expected = "an accepted WR was lost")]
fn post_against_device_end_fails_without_the_gate() {
    post_against_device_end(Some(ProgressBreak::UngatedPost));
}

/// Model 4: the CQ's conditional notify against a waiter's registration. A push from
/// another thread must wake the blocked waiter (loom's condvar wait never times out, so
/// a lost wake-up is a deadlock loom reports).
fn cq_notify_against_waiter(broken: bool) {
    loom::model(move || {
        let cq = if broken {
            CompletionQueue::with_notify_break(1, 4).unwrap()
        } else {
            CompletionQueue::new(1, 4).unwrap()
        };
        let cq2 = cq.clone();
        let t = thread::spawn(move || {
            cq2.push(WorkCompletion::new(5, WcStatus::Success, WcOpcode::Send, 1))
                .unwrap();
        });
        assert!(cq.wait(Duration::from_secs(1)));
        assert_eq!(cq.poll(4).unwrap()[0].wr_id, 5);
        t.join().unwrap();
    });
}

#[test]
fn cq_notify_against_waiter_holds() {
    cq_notify_against_waiter(false);
}

#[test]
#[should_panic(expected = "deadlock")]
fn cq_notify_against_waiter_fails_when_the_count_is_read_early() {
    cq_notify_against_waiter(true);
}

/// Model 2: owner and poller transitions. Two application threads try to become the
/// link's poller while the engine thread looks at a lapsed lease. At most one thread
/// polls; and if the engine took the link (it will sleep on the link fd), the first
/// application thread to become the poller after it saw `took` and wakes the engine off
/// the link: the two never both sit on the link fd for longer than a wake-up.
fn owner_and_poller(brk: Option<ProgressBreak>) {
    loom::model(move || {
        let owner = Arc::new(Owner::with_break(brk));
        owner.lease(10); // an application thread drove; its lease lapses at 10 us
        let polls = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        let app = |owner: Arc<Owner>, polls: Arc<loom::sync::atomic::AtomicUsize>| {
            move || {
                let took = owner.try_poll();
                if took.is_some() {
                    assert_eq!(polls.fetch_add(1, SeqCst), 0, "two pollers at once");
                    polls.fetch_sub(1, SeqCst);
                    owner.stop_polling(20);
                }
                took
            }
        };
        let a = thread::spawn(app(owner.clone(), polls.clone()));
        let b = thread::spawn(app(owner.clone(), polls.clone()));
        // The engine at 15 us: the lease lapsed.
        let view = owner.engine_view(15);
        let (ta, tb) = (a.join().unwrap(), b.join().unwrap());
        if view == EngineView::Engine {
            // The engine took the lapsed lease and sits on the link fd, so every poller
            // came after it (a poller leaves a lease that has not lapsed at 15 us): the
            // first of them must have seen that it took the link from the engine (and
            // woken it; later ones find the engine already told).
            let polled: Vec<bool> = [ta, tb].into_iter().flatten().collect();
            assert!(
                polled.is_empty() || polled.contains(&true),
                "a poller took the link without waking the engine that sits on it"
            );
        }
    });
}

#[test]
fn owner_and_poller_holds() {
    owner_and_poller(None);
}

#[test]
#[should_panic(expected = "without waking the engine")]
fn owner_and_poller_fails_when_the_engine_reads_a_lapsed_lease_without_cas() {
    owner_and_poller(Some(ProgressBreak::ViewWithoutCas));
}
