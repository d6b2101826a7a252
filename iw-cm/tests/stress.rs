//! Stress with real threads: 10,000 connect / accept / disconnect / destroy cycles
//! against the fake provider (its own engine thread, seeded random delays), with
//! destroy at random moments on both sides: before the reply, during the
//! ESTABLISHED / CONNECT_REPLY delivery (handler returns Destroy), while established,
//! after CLOSE. A watchdog fails the run (with the CM state dump and every thread's
//! backtrace) if it does not finish in time. At the end every counter is back to zero.
//!
//! `IWCM_STRESS_CYCLES` and `IWCM_STRESS_SEED` override the defaults; `IWCM_BREAK`
//! breaks a rule on purpose (README.md).
#![cfg(not(loom))]

mod common;

use common::*;
use iw_cm::{
    AcceptParams, CmConfig, CmEvent, CmId, CmIdRef, ConnectParams, ConnectStatus, DisconnectMode,
    Disposition, IwCm,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

const CLIENT_THREADS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Mode {
    /// Destroy right after connect returns, before any reply.
    BeforeReply,
    /// The handler returns Destroy from the ConnectReply(Ok) delivery.
    DuringEstablished,
    /// Destroy while established, without disconnecting (abortive teardown).
    WhileEstablished,
    /// Disconnect, wait for Close, then destroy.
    AfterClose,
}

#[derive(Default)]
struct Tally {
    cycles: AtomicUsize,
    by_mode: Mutex<HashMap<Mode, usize>>,
    replies: Mutex<HashMap<String, usize>>,
    server_destroy_at_established: AtomicUsize,
    server_rejects: AtomicUsize,
    server_destroy_at_request: AtomicUsize,
}

/// Server side: one listener, its handler shared by every child.
struct Server {
    rng: Mutex<Rng>,
    qps: Arc<Fake>,
    children: Mutex<HashMap<u64, CmId<Fake>>>,
    /// Per child: 1 request delivered, 2 established. Removed at Close/destroy.
    phase: Mutex<HashMap<u64, u8>>,
    checker: Arc<Checker>,
    tally: Arc<Tally>,
}

impl Server {
    fn on_event(&self, id: &CmIdRef<Fake>, ev: CmEvent<Fake>) -> Disposition {
        let serial = id.serial();
        self.checker.enter(serial);
        let roll = self.rng.lock().unwrap().below(100);
        let disp = match ev {
            CmEvent::ConnectRequest(req) => {
                self.phase.lock().unwrap().insert(serial, 1);
                if roll < 7 {
                    self.tally.server_rejects.fetch_add(1, SeqCst);
                    req.id.reject(b"no").unwrap();
                    self.phase.lock().unwrap().remove(&serial);
                    Disposition::Keep // the child is dropped here: destroy in IDLE
                } else if roll < 14 {
                    self.tally.server_destroy_at_request.fetch_add(1, SeqCst);
                    self.phase.lock().unwrap().remove(&serial);
                    Disposition::Destroy // rejects the request
                } else if roll < 20 {
                    self.phase.lock().unwrap().remove(&serial);
                    drop(req.id); // dropping the child destroys it: reject
                    Disposition::Keep
                } else {
                    req.id
                        .accept(AcceptParams {
                            qp: self.qps.new_qp(""),
                            private_data: b"ok".to_vec(),
                            ird: 4,
                            ord: 4,
                        })
                        .unwrap();
                    self.children.lock().unwrap().insert(serial, req.id);
                    Disposition::Keep
                }
            }
            CmEvent::Established => {
                let mut phase = self.phase.lock().unwrap();
                match phase.get_mut(&serial) {
                    Some(p) if *p == 1 => *p = 2,
                    other => self
                        .checker
                        .violation(format!("child #{serial}: Established in phase {other:?}")),
                }
                drop(phase);
                if roll < 10 {
                    self.tally
                        .server_destroy_at_established
                        .fetch_add(1, SeqCst);
                    self.phase.lock().unwrap().remove(&serial);
                    let me = self.children.lock().unwrap().remove(&serial);
                    drop(me); // destroy from inside the handler...
                    Disposition::Destroy // ...and by return: idempotent
                } else {
                    if roll < 15 {
                        id.disconnect(DisconnectMode::Graceful).unwrap();
                    }
                    Disposition::Keep
                }
            }
            CmEvent::Close => {
                if self.phase.lock().unwrap().remove(&serial).is_none() {
                    self.checker
                        .violation(format!("child #{serial}: Close without a connection"));
                }
                let me = self.children.lock().unwrap().remove(&serial);
                drop(me); // destroy after CLOSE, from inside the handler
                Disposition::Keep
            }
            CmEvent::ConnectReply(_) => {
                self.checker
                    .violation(format!("server #{serial} got a ConnectReply"));
                Disposition::Keep
            }
        };
        self.checker.exit(serial);
        disp
    }
}

/// One client cycle's view of its id.
struct Cycle {
    mode: Mode,
    events: Mutex<Vec<String>>,
    /// Set when destroy returned with no delivery in progress: the handler must never
    /// run again.
    quiet_destroyed: AtomicBool,
}

/// What every client thread shares.
#[derive(Clone)]
struct Ctx {
    seed: u64,
    cm: Arc<IwCm<Fake>>,
    qps: Arc<Fake>,
    server_addr: SocketAddr,
    checker: Arc<Checker>,
    tally: Arc<Tally>,
}

fn client_thread(t: usize, cycles: usize, ctx: Ctx) {
    let Ctx {
        seed,
        cm,
        qps: net_qps,
        server_addr,
        checker,
        tally,
    } = ctx;
    let mut rng = Rng::new(seed ^ (t as u64).wrapping_mul(0x9E37_79B9));
    let wait = Duration::from_secs(20);
    for n in 0..cycles {
        let mode = match rng.below(100) {
            0..=19 => Mode::BeforeReply,
            20..=39 => Mode::DuringEstablished,
            40..=54 => Mode::WhileEstablished,
            _ => Mode::AfterClose,
        };
        let cyc = Arc::new(Cycle {
            mode,
            events: Mutex::new(Vec::new()),
            quiet_destroyed: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel::<String>();
        let tx = Mutex::new(tx);
        let (c2, ck) = (cyc.clone(), checker.clone());
        let id = cm.create_id(move |id: &CmIdRef<Fake>, ev: CmEvent<Fake>| {
            ck.enter(id.serial());
            if c2.quiet_destroyed.load(SeqCst) {
                ck.violation(format!("#{} delivered after destroy returned", id.serial()));
            }
            let name = ev_name(&ev);
            {
                let mut evs = c2.events.lock().unwrap();
                match &ev {
                    CmEvent::ConnectReply(_) if evs.is_empty() => {}
                    CmEvent::Close if evs.len() == 1 && evs[0] == "ConnectReply(Ok)" => {}
                    _ => ck.violation(format!("#{}: {name} after {evs:?}", id.serial())),
                }
                evs.push(name.clone());
            }
            let disp = match (&ev, c2.mode) {
                (CmEvent::ConnectReply(r), Mode::DuringEstablished)
                    if r.status == ConnectStatus::Ok =>
                {
                    Disposition::Destroy
                }
                _ => Disposition::Keep,
            };
            let _ = tx.lock().unwrap().send(name);
            ck.exit(id.serial());
            disp
        });
        // 3% of the connects go where nothing listens.
        let remote = if rng.chance(3) {
            "198.51.100.200:9".parse().unwrap()
        } else {
            server_addr
        };
        id.connect(ConnectParams {
            qp: net_qps.new_qp(""),
            local_addr: None,
            remote_addr: remote,
            private_data: vec![t as u8, n as u8],
            ird: 4,
            ord: 4,
        })
        .unwrap();
        let reply = |rx: &mpsc::Receiver<String>| -> String {
            rx.recv_timeout(wait)
                .unwrap_or_else(|_| panic!("client {t} cycle {n}: no reply\n{}", cm.dump_state()))
        };
        match mode {
            Mode::BeforeReply => {
                if rng.chance(50) {
                    std::thread::sleep(Duration::from_micros(rng.below(100)));
                }
                let d = id.destroy();
                if !d.delivery_in_progress() {
                    cyc.quiet_destroyed.store(true, SeqCst);
                }
            }
            Mode::DuringEstablished => {
                let r = reply(&rx);
                *tally.replies.lock().unwrap().entry(r).or_default() += 1;
                let d = id.destroy(); // already destroyed by the handler if Ok
                d.wait().unwrap();
                cyc.quiet_destroyed.store(true, SeqCst);
            }
            Mode::WhileEstablished => {
                let r = reply(&rx);
                *tally.replies.lock().unwrap().entry(r).or_default() += 1;
                let d = id.destroy();
                if !d.delivery_in_progress() {
                    cyc.quiet_destroyed.store(true, SeqCst);
                }
            }
            Mode::AfterClose => {
                let r = reply(&rx);
                let ok = r == "ConnectReply(Ok)";
                *tally.replies.lock().unwrap().entry(r).or_default() += 1;
                if ok {
                    if rng.chance(50) {
                        std::thread::sleep(Duration::from_micros(rng.below(50)));
                    }
                    let mode = if rng.chance(50) {
                        DisconnectMode::Graceful
                    } else {
                        DisconnectMode::Abortive
                    };
                    id.disconnect(mode).unwrap();
                    let close = reply(&rx);
                    assert_eq!(close, "Close");
                }
                let d = id.destroy();
                d.wait().unwrap();
                cyc.quiet_destroyed.store(true, SeqCst);
            }
        }
        *tally.by_mode.lock().unwrap().entry(mode).or_default() += 1;
        tally.cycles.fetch_add(1, SeqCst);
    }
}

#[test]
fn ten_thousand_cycles_with_random_destroys_no_deadlock_no_leak() {
    let cycles: usize = std::env::var("IWCM_STRESS_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let seed: u64 = std::env::var("IWCM_STRESS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x1d_2016);
    let net = FakeNet::new(testkit::Rng::delays(seed), 100);
    let cm = Arc::new(
        IwCm::new(
            net.provider.clone(),
            CmConfig {
                name: "stress".into(),
                workers: 2,
                // `IWCM_BREAK=<rule>` breaks a rule on purpose (README.md): the checker
                // or the watchdog must then fail the run.
                rule_break: std::env::var("IWCM_BREAK")
                    .ok()
                    .and_then(|n| iw_cm::RuleBreak::from_name(&n)),
                ..CmConfig::default()
            },
        )
        .unwrap(),
    );
    let cm_for_dog = cm.clone();
    let dog = Watchdog::arm("stress", Duration::from_secs(50), move || {
        cm_for_dog.dump_state()
    });

    let checker = Arc::new(Checker::default());
    let tally = Arc::new(Tally::default());
    let server = Arc::new(Server {
        rng: Mutex::new(Rng::new(seed ^ 0xabcdef)),
        qps: net.provider.clone(),
        children: Mutex::new(HashMap::new()),
        phase: Mutex::new(HashMap::new()),
        checker: checker.clone(),
        tally: tally.clone(),
    });
    let s2 = server.clone();
    let listener = cm.create_id(move |id: &CmIdRef<Fake>, ev: CmEvent<Fake>| s2.on_event(id, ev));
    let server_addr: SocketAddr = "198.51.100.1:4791".parse().unwrap();
    listener.listen(server_addr, 4096).unwrap();

    let started = Instant::now();
    let per_thread = cycles.div_ceil(CLIENT_THREADS);
    let ctx = Ctx {
        seed,
        cm: cm.clone(),
        qps: net.provider.clone(),
        server_addr,
        checker: checker.clone(),
        tally: tally.clone(),
    };
    let threads: Vec<_> = (0..CLIENT_THREADS)
        .map(|t| {
            let ctx = ctx.clone();
            std::thread::Builder::new()
                .name(format!("client-{t}"))
                .spawn(move || client_thread(t, per_thread, ctx))
                .unwrap()
        })
        .collect();
    drop(ctx);
    for th in threads {
        th.join().expect("client thread panicked");
    }
    let elapsed = started.elapsed();

    // Server children still open (their client destroyed them abortively: a Close is
    // on its way, or they were never told) go away with the listener's teardown.
    drop(listener);
    assert!(net.wait_idle(Duration::from_secs(10)));
    cm.flush().unwrap();
    let leftover: Vec<_> = server.children.lock().unwrap().drain().collect();
    let open_children = leftover.len();
    drop(leftover);
    assert_quiescent_and_clean(&net, &cm);
    drop(dog);

    checker.assert_clean();
    let s = cm.stats();
    let total = tally.cycles.load(SeqCst);
    eprintln!(
        "stress: {total} cycles in {elapsed:?} ({:.0}/s), {CLIENT_THREADS} client threads, 2 CM workers",
        total as f64 / elapsed.as_secs_f64()
    );
    eprintln!("stress: modes {:?}", tally.by_mode.lock().unwrap());
    eprintln!("stress: replies {:?}", tally.replies.lock().unwrap());
    eprintln!(
        "stress: server rejects {}, destroy at request {}, destroy at established {}, children open at end {open_children}",
        tally.server_rejects.load(SeqCst),
        tally.server_destroy_at_request.load(SeqCst),
        tally.server_destroy_at_established.load(SeqCst),
    );
    eprintln!(
        "stress: handler calls {}, {s:?}",
        checker.calls.load(SeqCst)
    );
    assert!(total >= cycles);
    assert_eq!(s.ids_alive, 0);
    assert_eq!(
        s.unexpected_events, 0,
        "the fake provider keeps the contract"
    );
    assert_eq!(s.handler_panics, 0);
    assert_eq!(open_children, 0, "every server child heard its Close");
    for m in [
        Mode::BeforeReply,
        Mode::DuringEstablished,
        Mode::WhileEstablished,
        Mode::AfterClose,
    ] {
        assert!(tally.by_mode.lock().unwrap()[&m] > cycles / 10);
    }
}
