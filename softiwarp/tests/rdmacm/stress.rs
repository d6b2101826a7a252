//! Real-thread stress with soft devices on memory links (no root): client threads
//! resolve (ARP), connect, Send, disconnect and destroy ids (callback and event-channel
//! mode) to a wildcard listener of a second RDMA CM, while a chaos thread removes
//! device pairs at random (seeded) — by `remove_device`, by cutting the client's link
//! (its memory link end removed: the device ends) or by setting it down — and adds new
//! ones. A watchdog guards the run: on a hang it prints both CMs' state and every
//! thread's backtrace, then fails.
//!
//! Checked (design.md section 5): callbacks of one id never overlap and never run on a
//! soft device's engine or provider thread; no event after destroy returned or after
//! `DeviceRemoval`; per id at most one `DeviceRemoval`, exactly one if its destroy was
//! asked after the removal of its device was processed, none if it was destroyed
//! before the removal started; every WR posted on every QP completes (success or
//! flush); at the end both registries are empty and every soft device has no
//! connection, no provider connection, listener or QP reference left.
//!
//! `SOFTCM_STRESS_SEED`, `SOFTCM_STRESS_MS` (run time, default 3000),
//! `SOFTCM_STRESS_CLIENTS` (default 3); `RDMACM_BREAK` breaks a rule of both CMs (see
//! rdma-cm/README.md).

use crate::cm_support as support;

use crate::support::*;
use rdma_cm::{
    CmEvent, CmId, CmIdRef, ConnParam, Disposition, EventChannel, EventKind as K, RdmaCmConfig,
    Removal,
};
use softiwarp::cm::rdmacm::{SoftDevice, SoftRdmaCm};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use support::{
    check_removals, env_u64, eventually, fail_with_dump, Checker, RemovalRecord, RemovalTally, Rng,
    Watchdog,
};
use verbs::{QpState, SendFlags, SendWr, WcStatus};

const WAIT: Duration = Duration::from_secs(10);
const PORT: u16 = 7100;
const SLOTS: u8 = 3;
const NET: u8 = 62;

/// A device pair in service: client device in `cli`, server device in `srv`.
struct Live {
    pair: SoftPair,
    client: Arc<SoftDevice>,
    server: Arc<SoftDevice>,
}

#[derive(Default)]
struct Numbers {
    cycles: AtomicUsize,
    established: AtomicUsize,
    failed: AtomicUsize,
    removals_seen: AtomicUsize,
    sends_ok: AtomicUsize,
    flushed: AtomicUsize,
    accepts: AtomicUsize,
    removed: [AtomicUsize; 3],
}

struct Ctx {
    cli: SoftRdmaCm,
    srv: SoftRdmaCm,
    checker: Arc<Checker>,
    slots: Mutex<Vec<(u32, Option<Live>)>>,
    /// Every device pair ever used (for the final checks).
    graveyard: Mutex<Vec<Live>>,
    removals: Mutex<Vec<RemovalRecord>>,
    /// The server's verbs objects of destroyed ids (for the WR accounting).
    server_verbs: Mutex<Vec<Verbs>>,
    stop: AtomicBool,
    n: Numbers,
}

impl Ctx {
    fn dump(&self) -> String {
        format!(
            "client CM:\n{}\nserver CM:\n{}",
            self.cli.dump_state(),
            self.srv.dump_state()
        )
    }

    fn fail(&self, what: &str) -> ! {
        fail_with_dump(what, &self.dump())
    }

    /// Record a callback's start (under the checker's [`key`]): serialized, never on a
    /// device thread.
    fn enter(&self, id: &CmIdRef<SoftDevice>, server: bool, kind: K) {
        if on_device_thread() {
            self.checker
                .violation(format!("{kind} of #{} ran on a device thread", id.serial()));
        }
        self.checker
            .enter(key(id.serial(), server), kind, id.device_name());
    }
}

/// The checker's key of an id: the two CMs number their ids independently.
fn key(serial: u64, server: bool) -> u64 {
    if server {
        serial | 1 << 40
    } else {
        serial
    }
}

// ----------------------------------------------------------------- the server

type Table = Arc<Mutex<HashMap<u64, (CmId<SoftDevice>, Verbs)>>>;

/// The wildcard listener: accepts every request with a QP that has 4 receives posted;
/// destroys the id (by return) on `Disconnected` / `DeviceRemoval`.
fn server(ctx: &Arc<Ctx>) -> (CmId<SoftDevice>, Table) {
    let table: Table = Arc::default();
    let (t2, c2) = (table.clone(), Arc::downgrade(ctx));
    let listener = ctx.srv.create_id(
        move |id: &CmIdRef<SoftDevice>, mut ev: CmEvent<SoftDevice>| {
            let Some(ctx) = c2.upgrade() else {
                return Disposition::Destroy;
            };
            ctx.enter(id, true, ev.kind);
            let mut destroy = false;
            match ev.kind {
                K::ConnectRequest => {
                    let child = ev.take_new_id().expect("new id");
                    let accepted = Verbs::on(&child).ok().and_then(|mut v| {
                        // In INIT the receives can be posted before the accept.
                        v.qp.modify_state(QpState::Init).ok()?;
                        v.post_recvs(4).ok()?;
                        child.accept(&ConnParam::default()).ok().map(|()| v)
                    });
                    match accepted {
                        Some(v) => {
                            ctx.n.accepts.fetch_add(1, SeqCst);
                            t2.lock().unwrap().insert(child.serial(), (child, v));
                        }
                        None => {
                            // Refused (e.g. its device is being removed): `id` is the
                            // new id; destroyed as the callback returns, so no
                            // DeviceRemoval is owed to it (as in tests/stress.rs).
                            destroy = true;
                            drop(child);
                        }
                    }
                }
                K::Disconnected | K::DeviceRemoval => {
                    destroy = true;
                    // A callback that takes a while and returns Destroy: the removal
                    // racing it is the 2007 seed's scenario.
                    if id.serial().is_multiple_of(3) {
                        std::thread::sleep(Duration::from_micros(id.serial() % 4000));
                    }
                    // Dropped inside its own callback: destroyed as it returns.
                    if let Some((child, v)) = t2.lock().unwrap().remove(&id.serial()) {
                        drop(child);
                        ctx.server_verbs.lock().unwrap().push(v);
                    }
                }
                _ => {}
            }
            ctx.checker.exit(key(id.serial(), true), destroy);
            if destroy {
                Disposition::Destroy
            } else {
                Disposition::Keep
            }
        },
    );
    listener
        .bind_addr(format!("0.0.0.0:{PORT}").parse().unwrap())
        .unwrap();
    listener.listen(64).unwrap();
    (listener, table)
}

// ---------------------------------------------------------------- the clients

enum Events {
    Callback(mpsc::Receiver<(K, bool)>),
    Channel(EventChannel<SoftDevice>),
}

/// One id's story: resolve, route, QP, connect, Send, disconnect, destroy; it ends early
/// at any other event (errors, `DeviceRemoval`).
fn client_cycle(ctx: &Ctx, rng: &mut Rng, chan: &EventChannel<SoftDevice>) {
    let live: Vec<u8> = ctx
        .slots
        .lock()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, s)| s.1.is_some())
        .map(|(i, _)| i as u8)
        .collect();
    if live.is_empty() {
        std::thread::sleep(Duration::from_millis(2));
        return;
    }
    let slot = live[rng.below(live.len() as u64) as usize];
    ctx.n.cycles.fetch_add(1, SeqCst);
    let destroy_on_removal = rng.chance(50);
    let (id, events) = if rng.chance(40) {
        (
            ctx.cli.create_id_with_channel(chan),
            Events::Channel(chan.clone()),
        )
    } else {
        let (tx, rx) = mpsc::channel();
        let (tx, ck) = (Mutex::new(tx), ctx.checker.clone());
        let id = ctx
            .cli
            .create_id(move |id: &CmIdRef<SoftDevice>, ev: CmEvent<SoftDevice>| {
                if on_device_thread() {
                    ck.violation(format!(
                        "{} of #{} ran on a device thread",
                        ev.kind,
                        id.serial()
                    ));
                }
                ck.enter(id.serial(), ev.kind, id.device_name());
                let destroy = ev.kind == K::DeviceRemoval && destroy_on_removal;
                if ev.kind == K::Established && id.serial().is_multiple_of(4) {
                    // A slow callback: removal must wait for it.
                    std::thread::sleep(Duration::from_micros(id.serial() % 3000));
                }
                ck.exit(id.serial(), destroy);
                let _ = tx.lock().unwrap().send((ev.kind, destroy));
                if destroy {
                    Disposition::Destroy
                } else {
                    Disposition::Keep
                }
            });
        (id, Events::Callback(rx))
    };
    let serial = id.serial();
    let mut dead = false;
    // The next event; `true` if it is `want` (and the id lives on).
    let mut next = |want: K| -> bool {
        let kind = match &events {
            Events::Callback(rx) => match rx.recv_timeout(WAIT) {
                Ok((k, destroyed)) => {
                    dead |= destroyed;
                    k
                }
                Err(_) => ctx.fail(&format!("client id #{serial} got no event in {WAIT:?}")),
            },
            Events::Channel(ch) => match ch.get_event_timeout(WAIT) {
                Ok(ev) => {
                    ctx.enter(ev.id(), false, ev.kind);
                    ctx.checker.exit(ev.id().serial(), false);
                    ev.kind
                }
                Err(_) => ctx.fail(&format!("client id #{serial} got no event in {WAIT:?}")),
            },
        };
        if kind == K::DeviceRemoval {
            ctx.n.removals_seen.fetch_add(1, SeqCst);
        } else if kind != want {
            ctx.n.failed.fetch_add(1, SeqCst);
        }
        kind == want && !dead
    };
    let dst = (pair_ip(NET, slot, 2), PORT).into();
    let mut verbs = None;
    'story: {
        if id.resolve_addr(None, dst, Duration::from_secs(1)).is_err() || !next(K::AddrResolved) {
            break 'story;
        }
        if id.resolve_route(WAIT).is_err() || !next(K::RouteResolved) {
            break 'story;
        }
        let Ok(v) = Verbs::on(&id) else { break 'story };
        let v = verbs.insert(v);
        if id.connect(&ConnParam::default()).is_err() {
            break 'story;
        }
        let _ = v.post_recvs(2);
        if !next(K::Established) {
            break 'story;
        }
        ctx.n.established.fetch_add(1, SeqCst);
        if v.qp
            .post_send(SendWr::send(1, vec![]).with_flags(SendFlags::SIGNALED))
            .is_ok()
        {
            v.posted += 1;
        }
        // Connected a while: the chaos finds live connections to remove.
        std::thread::sleep(Duration::from_micros(rng.below(40_000)));
        if rng.chance(70) && id.disconnect().is_ok() {
            next(K::Disconnected);
        }
    }
    if rng.chance(50) {
        // Destroy a little later (after a DeviceRemoval: once its removal finished).
        std::thread::sleep(Duration::from_micros(rng.below(20_000)));
    }
    // Events queued on the channel are discarded with the id: take (and record) them
    // first, so that the accounting sees what was delivered before destroy was asked.
    if let Events::Channel(ch) = &events {
        while let Some(ev) = ch.try_get_event() {
            ctx.enter(ev.id(), false, ev.kind);
            ctx.checker.exit(ev.id().serial(), false);
        }
    }
    ctx.checker.destroy_asked(serial);
    if let Err(e) = id.destroy() {
        ctx.fail(&format!("destroy of #{serial} refused: {}", e.error));
    }
    ctx.checker.destroy_done(serial);
    if let Some(mut v) = verbs {
        if !v.all_completed(WAIT) {
            ctx.fail(&format!(
                "#{serial}: {} WRs posted, {:?} completed",
                v.posted, v.completions
            ));
        }
        ctx.n.sends_ok.fetch_add(
            v.completions
                .iter()
                .filter(|w| w.wr_id == 1 && w.status == WcStatus::Success)
                .count(),
            SeqCst,
        );
        ctx.n
            .flushed
            .fetch_add(v.count(WcStatus::WrFlushErr), SeqCst);
    }
}

// ----------------------------------------------------------------- the chaos

fn add_pair(ctx: &Ctx, slot: u8) {
    let mut slots = ctx.slots.lock().unwrap();
    let s = &mut slots[slot as usize];
    s.0 += 1;
    let (c, v) = (format!("c{slot}g{}", s.0), format!("s{slot}g{}", s.0));
    // A peer whose link is cut sends no RST: fail its connections in 1.5 s, not 20 s.
    let pair = soft_pair_tuned(&c, &v, NET, slot, |cfg| {
        cfg.tcp.keep_alive = Some(Duration::from_millis(300));
        cfg.tcp.timeout = Some(Duration::from_millis(1500));
        cfg.connect_timeout = Duration::from_secs(2);
    });
    let client = SoftDevice::new(pair.a.clone()).unwrap();
    let server = SoftDevice::new(pair.b.clone()).unwrap();
    ctx.cli.add_device(client.clone()).unwrap();
    ctx.srv.add_device(server.clone()).unwrap();
    s.1 = Some(Live {
        pair,
        client,
        server,
    });
}

/// Remove slot's pair: the client device by one of three ways, then the server device
/// (`remove_device`). Returns the removals to wait for.
fn remove_pair(ctx: &Ctx, slot: u8, how: u64, out: &mut Vec<Removal<SoftDevice>>) {
    let Some(live) = ctx.slots.lock().unwrap()[slot as usize].1.take() else {
        return;
    };
    ctx.n.removed[how as usize].fetch_add(1, SeqCst);
    let (cname, sname) = (
        live.pair.a.name().to_string(),
        live.pair.b.name().to_string(),
    );
    let start = ctx.checker.tick();
    if how == 0 {
        out.push(ctx.cli.remove_device(&cname).unwrap());
    } else {
        // The device reports it: link removed (the device ends) or link down.
        if how == 1 {
            live.pair.a_link.remove()
        } else {
            live.pair.a_link.set_down()
        }
        if !eventually(WAIT, || !ctx.cli.devices().contains(&cname)) {
            ctx.fail(&format!("{cname}: no removal after its link failed"));
        }
        ctx.cli.flush().unwrap();
    }
    let end = ctx.checker.tick();
    ctx.removals.lock().unwrap().push(RemovalRecord {
        device: cname,
        start,
        end,
        notified: false,
    });
    let start = ctx.checker.tick();
    out.push(ctx.srv.remove_device(&sname).unwrap());
    let end = ctx.checker.tick();
    ctx.removals.lock().unwrap().push(RemovalRecord {
        device: sname,
        start,
        end,
        notified: false,
    });
    ctx.graveyard.lock().unwrap().push(live);
}

/// How to remove the client device: `remove_device` (half the time), link cut, link
/// down.
fn how(rng: &mut Rng) -> u64 {
    if rng.chance(50) {
        0
    } else {
        1 + rng.below(2)
    }
}

fn chaos(ctx: &Ctx, rng: &mut Rng) -> Vec<Removal<SoftDevice>> {
    let mut pending = Vec::new();
    while !ctx.stop.load(SeqCst) {
        std::thread::sleep(Duration::from_millis(20 + rng.below(150)));
        let slot = rng.below(u64::from(SLOTS)) as u8;
        if ctx.slots.lock().unwrap()[slot as usize].1.is_some() {
            remove_pair(ctx, slot, how(rng), &mut pending);
        } else {
            add_pair(ctx, slot);
        }
    }
    pending
}

// ------------------------------------------------------------------- the test

#[test]
fn soft_devices_come_and_go_under_connecting_clients() {
    let seed = env_u64("SOFTCM_STRESS_SEED", 0x50f7_2007);
    let run_ms = env_u64("SOFTCM_STRESS_MS", 3000);
    let clients = env_u64("SOFTCM_STRESS_CLIENTS", 3);
    let t0 = Instant::now();
    let rule_break = std::env::var("RDMACM_BREAK")
        .ok()
        .map(|n| rdma_cm::RuleBreak::from_name(&n).expect("RDMACM_BREAK"));
    let cm = |name: &str| {
        SoftRdmaCm::new(RdmaCmConfig {
            name: name.into(),
            rule_break,
            ..Default::default()
        })
        .unwrap()
    };
    let ctx = Arc::new(Ctx {
        cli: cm("cli"),
        srv: cm("srv"),
        checker: Arc::new(Checker::default()),
        slots: Mutex::new((0..SLOTS).map(|_| (0, None)).collect()),
        graveyard: Mutex::default(),
        removals: Mutex::default(),
        server_verbs: Mutex::default(),
        stop: AtomicBool::new(false),
        n: Numbers::default(),
    });
    for slot in 0..SLOTS {
        add_pair(&ctx, slot);
    }
    let (listener, table) = server(&ctx);
    let c2 = Arc::downgrade(&ctx);
    let watchdog = Watchdog::arm(
        "soft stress",
        Duration::from_millis(run_ms) + Duration::from_secs(60),
        move || c2.upgrade().map_or_else(String::new, |c| c.dump()),
    );
    let threads: Vec<_> = (0..clients)
        .map(|t| {
            let ctx = ctx.clone();
            std::thread::Builder::new()
                .name(format!("client-{t}"))
                .spawn(move || {
                    let mut rng = Rng::new(seed ^ (t + 1).wrapping_mul(0xA24B_AED4_963E_E407));
                    let chan = ctx.cli.create_event_channel();
                    while !ctx.stop.load(SeqCst) {
                        client_cycle(&ctx, &mut rng, &chan);
                    }
                })
                .unwrap()
        })
        .collect();
    let chaos_ctx = ctx.clone();
    let chaos_thread = std::thread::Builder::new()
        .name("chaos".into())
        .spawn(move || chaos(&chaos_ctx, &mut Rng::new(seed ^ 0xC4A0)))
        .unwrap();
    std::thread::sleep(Duration::from_millis(run_ms));
    ctx.stop.store(true, SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let mut pending = chaos_thread.join().unwrap();
    let mut rng = Rng::new(seed ^ 0xE4D);
    for slot in 0..SLOTS {
        remove_pair(&ctx, slot, how(&mut rng), &mut pending);
    }
    for r in pending {
        if let Err(e) = r.wait_timeout(WAIT) {
            ctx.fail(&format!("{} not released: {e}", r.device_name()));
        }
    }
    assert!(
        table.lock().unwrap().is_empty(),
        "server ids left after every device went"
    );
    ctx.checker.destroy_asked(key(listener.serial(), true));
    listener.destroy().unwrap();
    for cm in [&ctx.cli, &ctx.srv] {
        let clean = eventually(WAIT, || {
            let _ = cm.flush();
            let s = cm.stats();
            s.ids_alive == 0 && s.devices_held == 0 && s.events_queued == 0 && s.events_unacked == 0
        });
        if !clean {
            ctx.fail("a registry is not empty at the end");
        }
        assert_eq!(cm.stats().internal_listeners, 0);
    }
    // Every WR the server posted completed; every soft device let go of everything.
    for v in ctx.server_verbs.lock().unwrap().iter_mut() {
        assert!(
            v.all_completed(WAIT),
            "server QP: {} posted, {:?}",
            v.posted,
            v.completions
        );
    }
    let graveyard = ctx.graveyard.lock().unwrap();
    for live in graveyard.iter() {
        for (dev, sd) in [(&live.pair.a, &live.client), (&live.pair.b, &live.server)] {
            // Graceful closes leave TCP TIME-WAIT (smoltcp: 10 s) behind.
            let idle = eventually(Duration::from_secs(15), || {
                let p = sd.provider().stats();
                dev.connection_count() == 0
                    && p.conns_alive == 0
                    && p.qp_refs == 0
                    && p.listeners == 0
            });
            assert!(
                idle,
                "{}: {} connections, {:?}",
                dev.name(),
                dev.connection_count(),
                sd.provider().stats()
            );
        }
    }
    drop(watchdog);

    ctx.checker.assert_clean();
    // Every removal here has a known end (the async ones: after the CM's worker
    // processed them), so the exact rules apply to all of them.
    let RemovalTally {
        told,
        exactly_one,
        none_required,
    } = check_removals(&ctx.checker.logs(), &ctx.removals.lock().unwrap());
    let n = &ctx.n;
    eprintln!(
        "soft stress: seed {seed:#x}, {:.1} s, {clients} clients; {} cycles, {} established, {} accepted, \
         {} other endings, {} DeviceRemoval seen by clients ({told} by all ids; {exactly_one} ids required \
         exactly one, {none_required} none); {} Sends completed, {} WRs flushed; pairs removed by \
         remove_device / link cut / link down: {} / {} / {}; {} device pairs",
        t0.elapsed().as_secs_f64(),
        n.cycles.load(SeqCst), n.established.load(SeqCst), n.accepts.load(SeqCst), n.failed.load(SeqCst),
        n.removals_seen.load(SeqCst), n.sends_ok.load(SeqCst), n.flushed.load(SeqCst),
        n.removed[0].load(SeqCst), n.removed[1].load(SeqCst), n.removed[2].load(SeqCst), graveyard.len(),
    );
    assert!(n.established.load(SeqCst) > 0 && n.sends_ok.load(SeqCst) > 0);
    assert!(exactly_one > 0, "no id was on a removed device");
}
