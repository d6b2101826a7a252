//! Stress with real threads over real soft devices: two devices back to back on a
//! memory link, each with its `SoftProvider` and `IwCm`; 10,000 connect / accept /
//! disconnect / destroy cycles (full TCP + MPA each), 16 at a time, with destroy at
//! seeded random moments on both sides: right after connect (before the reply, maybe
//! after a random delay), from inside the `ConnectReply(Ok)` / `Established` delivery,
//! while established, after `Close`; server-side rejects (with private data), destroys
//! at the request, graceful disconnects; connects where nothing listens.
//!
//! Checked: every handler call runs on a CM worker, one at a time per id, never after a
//! quiet destroy; event sequences are legal (`ConnectReply` first, `Close` only after
//! `ConnectReply(Ok)` / `Established`); private data and IRD/ORD arrive as sent. A
//! watchdog fails the run with both CMs' state dumps, the providers' counters and every
//! thread's backtrace (gdb) if it hangs. At the end every live-object count is zero:
//! cm_ids, queued events and jobs (both CMs), provider connections, listeners and QP
//! references, device connections.
//!
//! `IWCM_SOFT_CYCLES`, `IWCM_SOFT_SEED` and `IWCM_SOFT_WATCHDOG_SECS` (default 150)
//! override the defaults.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::iwcm::*;
use iw_cm::{
    AcceptParams, CmEvent, CmId, CmIdRef, ConnectParams, ConnectStatus, DisconnectMode, Disposition,
};
use softiwarp::cm::iwcm::SoftProvider;

const CLIENT_THREADS: usize = 16;
const PORT: u16 = 4791;
const SERVER: usize = 0;
const CLIENT: usize = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Mode {
    /// Destroy right after connect returns (maybe after a short random delay), before
    /// the reply in most cases.
    BeforeReply,
    /// The handler returns Destroy from the ConnectReply(Ok) delivery.
    DuringEstablished,
    /// Destroy while established, without disconnecting (abortive teardown).
    WhileEstablished,
    /// Disconnect (graceful or abortive), wait for Close, then destroy.
    AfterClose,
}

#[derive(Default)]
struct Tally {
    cycles: AtomicUsize,
    by_mode: Mutex<HashMap<Mode, usize>>,
    replies: Mutex<HashMap<String, usize>>,
    server: Mutex<HashMap<&'static str, usize>>,
}

impl Tally {
    fn server(&self, what: &'static str) {
        *self.server.lock().unwrap().entry(what).or_default() += 1;
    }
}

/// The server: one listener; its handler is shared by every child.
struct Server {
    rng: Mutex<Rng>,
    side: Arc<Side>,
    children: Mutex<HashMap<u64, CmId<SoftProvider>>>,
    /// Per child: 1 request delivered (accepted), 2 established.
    phase: Mutex<HashMap<u64, u8>>,
    checker: Arc<Checker>,
    tally: Arc<Tally>,
}

impl Server {
    fn on_event(&self, id: &CmIdRef<SoftProvider>, ev: CmEvent<SoftProvider>) -> Disposition {
        let serial = id.serial();
        self.checker.enter(SERVER, serial);
        let roll = self.rng.lock().unwrap().below(100);
        let disp = match ev {
            CmEvent::ConnectRequest(req) => {
                if req.private_data.len() != 8 || (req.ird, req.ord) != (4, 6) {
                    self.checker.violation(format!(
                        "request with private data {:?}, IRD/ORD {}/{}",
                        req.private_data, req.ird, req.ord
                    ));
                }
                let child = req.id.serial();
                if roll < 5 {
                    self.tally.server("reject");
                    let _ = req.id.reject(b"busy");
                    Disposition::Keep // the child is dropped here: destroy in IDLE
                } else if roll < 9 {
                    self.tally.server("destroy at request");
                    Disposition::Destroy // destroys the child: rejects the request
                } else {
                    // The reply's private data: the request's, reversed.
                    let mut pd = req.private_data.clone();
                    pd.reverse();
                    let qp = self.side.qp(1);
                    self.phase.lock().unwrap().insert(child, 1);
                    match req.id.accept(AcceptParams {
                        qp,
                        private_data: pd,
                        ird: 6,
                        ord: 4,
                    }) {
                        Ok(()) => {
                            self.tally.server("accept");
                            self.children.lock().unwrap().insert(child, req.id);
                        }
                        Err(_) => {
                            // The initiator went away meanwhile.
                            self.tally.server("accept failed");
                            self.phase.lock().unwrap().remove(&child);
                        }
                    }
                    Disposition::Keep
                }
            }
            CmEvent::Established => {
                let ok = {
                    let mut phase = self.phase.lock().unwrap();
                    match phase.get_mut(&serial) {
                        Some(p) if *p == 1 => {
                            *p = 2;
                            true
                        }
                        _ => false,
                    }
                };
                if !ok {
                    self.checker
                        .violation(format!("child #{serial}: Established out of order"));
                }
                if roll < 8 {
                    self.tally.server("destroy at established");
                    self.phase.lock().unwrap().remove(&serial);
                    let me = self.children.lock().unwrap().remove(&serial);
                    drop(me); // destroy from inside the handler...
                    Disposition::Destroy // ...and by return: idempotent
                } else {
                    if roll < 14 {
                        self.tally.server("disconnect at established");
                        let _ = id.disconnect(DisconnectMode::Graceful);
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
        self.checker.exit(SERVER, serial);
        disp
    }
}

/// One client cycle's view of its id.
struct Cycle {
    mode: Mode,
    expect_pd: Vec<u8>,
    events: Mutex<Vec<String>>,
    /// Set when destroy returned with no delivery in progress: no call may follow.
    quiet_destroyed: AtomicBool,
}

#[derive(Clone)]
struct Ctx {
    seed: u64,
    client: Arc<ClientSide>,
    checker: Arc<Checker>,
    tally: Arc<Tally>,
}

struct ClientSide {
    side: Arc<Side>,
    server: std::net::SocketAddr,
    nowhere: std::net::SocketAddr,
}

fn client_thread(t: usize, cycles: usize, ctx: Ctx) {
    let Ctx {
        seed,
        client,
        checker,
        tally,
    } = ctx;
    let mut rng = Rng::new(seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9));
    let wait = Duration::from_secs(20);
    for n in 0..cycles {
        let mode = match rng.below(100) {
            0..=14 => Mode::BeforeReply,
            15..=34 => Mode::DuringEstablished,
            35..=54 => Mode::WhileEstablished,
            _ => Mode::AfterClose,
        };
        let tag = ((t as u64) << 32 | n as u64).to_be_bytes().to_vec();
        let mut expect_pd = tag.clone();
        expect_pd.reverse();
        let cyc = Arc::new(Cycle {
            mode,
            expect_pd,
            events: Mutex::new(Vec::new()),
            quiet_destroyed: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel::<String>();
        let tx = Mutex::new(tx);
        let (c2, ck) = (cyc.clone(), checker.clone());
        let id = client.side.cm.create_id(
            move |id: &CmIdRef<SoftProvider>, ev: CmEvent<SoftProvider>| {
                ck.enter(CLIENT, id.serial());
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
                if let CmEvent::ConnectReply(r) = &ev {
                    if r.status == ConnectStatus::Ok
                        && (r.private_data != c2.expect_pd || (r.ird, r.ord) != (6, 4))
                    {
                        ck.violation(format!(
                            "reply private data {:?} IRD/ORD {}/{}",
                            r.private_data, r.ird, r.ord
                        ));
                    }
                    if r.status == ConnectStatus::Rejected && !r.private_data.is_empty() {
                        // Only the server's explicit reject carries private data.
                        if r.private_data != b"busy" {
                            ck.violation(format!("reject private data {:?}", r.private_data));
                        }
                    }
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
                ck.exit(CLIENT, id.serial());
                disp
            },
        );
        let remote = if rng.chance(2) {
            client.nowhere
        } else {
            client.server
        };
        id.connect(ConnectParams {
            qp: client.side.qp(1),
            local_addr: None,
            remote_addr: remote,
            private_data: tag,
            ird: 4,
            ord: 6,
        })
        .unwrap();
        let next = |rx: &mpsc::Receiver<String>| -> String {
            rx.recv_timeout(wait).unwrap_or_else(|_| {
                panic!(
                    "client {t} cycle {n} ({mode:?}): no event\n{}",
                    client.side.cm.dump_state()
                )
            })
        };
        match mode {
            Mode::BeforeReply => {
                if rng.chance(50) {
                    std::thread::sleep(Duration::from_micros(rng.below(1500)));
                }
                let d = id.destroy();
                if !d.delivery_in_progress() {
                    cyc.quiet_destroyed.store(true, SeqCst);
                }
            }
            Mode::DuringEstablished => {
                let r = next(&rx);
                *tally.replies.lock().unwrap().entry(r).or_default() += 1;
                let d = id.destroy(); // already destroyed by the handler if Ok
                d.wait().unwrap();
                cyc.quiet_destroyed.store(true, SeqCst);
            }
            Mode::WhileEstablished => {
                let r = next(&rx);
                *tally.replies.lock().unwrap().entry(r).or_default() += 1;
                if rng.chance(50) {
                    std::thread::sleep(Duration::from_micros(rng.below(500)));
                }
                let d = id.destroy();
                if !d.delivery_in_progress() {
                    cyc.quiet_destroyed.store(true, SeqCst);
                }
            }
            Mode::AfterClose => {
                let r = next(&rx);
                let ok = r == "ConnectReply(Ok)";
                *tally.replies.lock().unwrap().entry(r).or_default() += 1;
                if ok {
                    if rng.chance(50) {
                        std::thread::sleep(Duration::from_micros(rng.below(300)));
                    }
                    // Mostly abortive: a graceful close leaves the connection in TCP
                    // TIME-WAIT for 10 s on the side that closed first.
                    let how = if rng.chance(20) {
                        DisconnectMode::Graceful
                    } else {
                        DisconnectMode::Abortive
                    };
                    // The server may have disconnected first: then this is a no-op.
                    id.disconnect(how).unwrap();
                    let close = next(&rx);
                    assert_eq!(close, "Close", "client {t} cycle {n}");
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
fn ten_thousand_cycles_over_soft_devices_no_deadlock_no_leak() {
    let cycles: usize = std::env::var("IWCM_SOFT_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let seed: u64 = std::env::var("IWCM_SOFT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_2016);
    let (server, client) = pair(40, 2, |_| {}, |_| {});
    let server = Arc::new(server);
    let client = Arc::new(client);

    let (s_dog, c_dog) = (server.clone(), client.clone());
    let limit: u64 = std::env::var("IWCM_SOFT_WATCHDOG_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let dog = Watchdog::arm("iwcm soft stress", Duration::from_secs(limit), move || {
        format!("server: {}\nclient: {}", s_dog.describe(), c_dog.describe())
    });

    let checker = Arc::new(Checker::default());
    let tally = Arc::new(Tally::default());
    let srv = Arc::new(Server {
        rng: Mutex::new(Rng::new(seed ^ 0xabcdef)),
        side: server.clone(),
        children: Mutex::new(HashMap::new()),
        phase: Mutex::new(HashMap::new()),
        checker: checker.clone(),
        tally: tally.clone(),
    });
    let s2 = srv.clone();
    let listener = server.cm.create_id(
        move |id: &CmIdRef<SoftProvider>, ev: CmEvent<SoftProvider>| s2.on_event(id, ev),
    );
    listener.listen(server.addr(PORT), 64).unwrap();

    let ctx = Ctx {
        seed,
        client: Arc::new(ClientSide {
            side: client.clone(),
            server: server.addr(PORT),
            nowhere: server.addr(PORT + 1),
        }),
        checker: checker.clone(),
        tally: tally.clone(),
    };
    let started = Instant::now();
    let per_thread = cycles.div_ceil(CLIENT_THREADS);
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

    // Server children still open hear their Close (the client aborted them), or go
    // with this cleanup; then the listener.
    assert!(eventually(Duration::from_secs(10), || {
        server.provider.stats().conns_watched == 0 && client.provider.stats().conns_watched == 0
    }));
    server.cm.flush().unwrap();
    let leftover: Vec<_> = srv.children.lock().unwrap().drain().collect();
    let open_children = leftover.len();
    drop(leftover);
    drop(listener);
    let settle = Instant::now();
    // Connections closed gracefully sit in TCP TIME-WAIT for 10 s.
    assert_clean_within(&[&server, &client], Duration::from_secs(20));
    let settled = settle.elapsed();
    drop(dog);
    checker.assert_clean();

    let total = tally.cycles.load(SeqCst);
    let (ss, cs) = (server.cm.stats(), client.cm.stats());
    let (sp, cp) = (server.provider.stats(), client.provider.stats());
    eprintln!(
        "soft stress: {total} cycles in {elapsed:.2?} ({:.0}/s), {CLIENT_THREADS} client threads \
         (connections in flight at once), 2 CM workers per side; then {settled:.2?} until \
         every count was zero",
        total as f64 / elapsed.as_secs_f64()
    );
    eprintln!("soft stress: modes {:?}", tally.by_mode.lock().unwrap());
    eprintln!(
        "soft stress: client replies {:?}",
        tally.replies.lock().unwrap()
    );
    eprintln!(
        "soft stress: server {:?}, children open at end {open_children}",
        tally.server.lock().unwrap()
    );
    eprintln!("soft stress: server CM {ss:?}");
    eprintln!("soft stress: client CM {cs:?}");
    eprintln!("soft stress: server provider {sp:?}");
    eprintln!("soft stress: client provider {cp:?}");
    eprintln!(
        "soft stress: device connections {} / {}, handler calls {}",
        server.device().connection_count(),
        client.device().connection_count(),
        checker.calls.load(SeqCst)
    );
    assert!(total >= cycles);
    assert_eq!(open_children, 0, "every server child heard its Close");
    assert_eq!(sp.synthesized_ends + cp.synthesized_ends, 0);
    for m in [
        Mode::BeforeReply,
        Mode::DuringEstablished,
        Mode::WhileEstablished,
        Mode::AfterClose,
    ] {
        assert!(tally.by_mode.lock().unwrap()[&m] > cycles / 10);
    }
    let replies = tally.replies.lock().unwrap();
    for r in [
        "ConnectReply(Ok)",
        "ConnectReply(Rejected)",
        "ConnectReply(Refused)",
    ] {
        assert!(replies.get(r).copied().unwrap_or(0) > 0, "{r} never seen");
    }
}
