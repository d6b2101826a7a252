//! Real-thread stress: client threads connect, disconnect and destroy ids (callback
//! and event-channel mode, destroying at random points) through a wildcard listener
//! that spans every device, while a chaos thread removes devices (with or without
//! their links failing first, synchronously or through the device's own notifier) and
//! adds new ones, at random (seeded). A watchdog guards every wait: it prints the CM's
//! state dump and every thread's backtrace (gdb) and fails.
//!
//! Checked: callbacks of one id never overlap and never run on the engine thread; no
//! event after destroy returned, after a callback returned Destroy, or after
//! `DeviceRemoval`; for every id bound to a device removed by `remove_device`: at most
//! one `DeviceRemoval`, exactly one if its destroy was asked after the removal
//! returned, none if it was destroyed before the removal started; destroying with an
//! un-acked event on the same thread is refused; at the end every id, device, event,
//! listener, link and QP reference is gone.
//!
//! `RDMACM_STRESS_SEED`, `RDMACM_STRESS_MS` (run time, default 4000),
//! `RDMACM_STRESS_CLIENTS` (default 4); `RDMACM_BREAK` breaks a rule (see README.md).
#![cfg(not(loom))]

mod support;

use rdma_cm::{
    CmError, CmEvent, CmId, CmIdRef, ConnParam, Disposition, EventChannel, EventKind, RdmaCm,
    RdmaCmConfig, Removal, RuleBreak,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;

const WAIT: Duration = Duration::from_secs(10);
const PORT: u16 = 7000;
const SLOTS: usize = 4;

#[derive(Default)]
struct Numbers {
    cycles: AtomicUsize,
    established: AtomicUsize,
    rejected: AtomicUsize,
    addr_errors: AtomicUsize,
    client_removals: AtomicUsize,
    aborted: AtomicUsize,
    unacked_refusals: AtomicUsize,
    server_accepts: AtomicUsize,
    devices_removed: AtomicUsize,
    devices_added: AtomicUsize,
}

struct Slot {
    addr: std::net::Ipv4Addr,
    current: Option<Arc<FakeDevice>>,
    gen: u32,
}

struct Ctx {
    cm: RdmaCm<FakeDevice>,
    net: FakeNet,
    checker: Arc<Checker>,
    slots: Mutex<Vec<Slot>>,
    removals: Mutex<Vec<RemovalRecord>>,
    stop: AtomicBool,
    n: Numbers,
}

impl Ctx {
    fn dump(&self) -> String {
        dump(&self.cm, &self.net)
    }

    fn fail(&self, what: &str) -> ! {
        fail_with_dump(what, &self.dump())
    }

    /// Two live devices' addresses: a source device and a destination, if any.
    fn pick(&self, rng: &mut Rng) -> Option<(std::net::Ipv4Addr, std::net::Ipv4Addr)> {
        let slots = self.slots.lock().unwrap();
        let live: Vec<_> = slots
            .iter()
            .filter(|s| s.current.is_some())
            .map(|s| s.addr)
            .collect();
        if live.is_empty() {
            return None;
        }
        let src = live[rng.below(live.len() as u64) as usize];
        let dst = live[rng.below(live.len() as u64) as usize];
        Some((src, dst))
    }
}

// ----------------------------------------------------------------- the server

type Table = Arc<Mutex<HashMap<u64, CmId<FakeDevice>>>>;

fn server(ctx: &Arc<Ctx>) -> (CmId<FakeDevice>, Table) {
    let table: Table = Arc::default();
    let listener_serial = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (t2, ck, c2, ls) = (
        table.clone(),
        ctx.checker.clone(),
        Arc::downgrade(ctx),
        listener_serial.clone(),
    );
    let listener = ctx.cm.create_id(
        move |id: &CmIdRef<FakeDevice>, mut ev: CmEvent<FakeDevice>| {
            let serial = id.serial();
            if serial == ls.load(SeqCst) {
                // The wildcard listener is bound to no device: it hears nothing, ever
                // (its ConnectRequests are delivered for the new ids).
                ck.violation(format!("the wildcard listener got {}", ev.kind));
            }
            ck.enter(serial, ev.kind, id.device_name());
            let mut rng = Rng::new(serial.wrapping_mul(0x9E37) ^ ev.kind as u64);
            let mut destroy = false;
            match ev.kind {
                EventKind::ConnectRequest => {
                    let child = ev.take_new_id().expect("new id");
                    let refuse = rng.chance(5);
                    if rng.chance(10) {
                        let _ = child.reject(b"busy");
                        t2.lock().unwrap().insert(serial, child);
                    } else if refuse
                        || child.create_qp(&(), ()).is_err()
                        || child.accept(&ConnParam::new(4, 4)).is_err()
                    {
                        destroy = true;
                        drop(child);
                    } else {
                        if let Some(c) = c2.upgrade() {
                            c.n.server_accepts.fetch_add(1, SeqCst);
                        }
                        t2.lock().unwrap().insert(serial, child);
                    }
                }
                EventKind::Established if rng.chance(10) => {
                    let _ = id.disconnect();
                }
                EventKind::Disconnected | EventKind::DeviceRemoval => {
                    destroy = true;
                    // Dropped inside its own callback: destroyed as it returns.
                    drop(t2.lock().unwrap().remove(&serial));
                }
                _ => {}
            }
            ck.exit(serial, destroy);
            if destroy {
                Disposition::Destroy
            } else {
                Disposition::Keep
            }
        },
    );
    listener_serial.store(listener.serial(), SeqCst);
    listener
        .bind_addr(addr(&format!("0.0.0.0:{PORT}")))
        .unwrap();
    listener.listen(64).unwrap();
    (listener, table)
}

// ---------------------------------------------------------------- the clients

enum Events {
    Callback(mpsc::Receiver<(EventKind, i32, bool)>),
    Channel(EventChannel<FakeDevice>),
}

struct Client<'a> {
    ctx: &'a Ctx,
    id: Option<CmId<FakeDevice>>,
    serial: u64,
    events: Events,
    /// Destroyed by a callback's return.
    dead: bool,
    /// Got DeviceRemoval.
    removed: bool,
}

impl Client<'_> {
    /// The next event of the id; channel events are acked unless `hold`.
    fn next(&mut self, hold: bool) -> (EventKind, i32, Option<rdma_cm::ChannelEvent<FakeDevice>>) {
        let r = match &self.events {
            Events::Callback(rx) => match rx.recv_timeout(WAIT) {
                Ok((k, st, destroyed)) => {
                    if destroyed {
                        self.dead = true;
                    }
                    (k, st, None)
                }
                Err(_) => self.ctx.fail(&format!(
                    "client id #{} got no event in {WAIT:?}",
                    self.serial
                )),
            },
            Events::Channel(ch) => match ch.get_event_timeout(WAIT) {
                Ok(ev) => {
                    let s = ev.id().serial();
                    if s != self.serial {
                        self.ctx
                            .checker
                            .violation(format!("event of #{s} on the channel of #{}", self.serial));
                    }
                    self.ctx.checker.enter(s, ev.kind, ev.id().device_name());
                    self.ctx.checker.exit(s, false);
                    let (k, st) = (ev.kind, ev.status);
                    (k, st, if hold { Some(ev) } else { None })
                }
                Err(_) => self.ctx.fail(&format!(
                    "client id #{} got no event in {WAIT:?}",
                    self.serial
                )),
            },
        };
        if r.0 == EventKind::DeviceRemoval {
            self.removed = true;
            self.ctx.n.client_removals.fetch_add(1, SeqCst);
        }
        r
    }

    /// Wait for one of `want`; `None` if the id's story ended (removal, failure).
    fn expect(&mut self, want: &[EventKind], rng: &mut Rng) -> Option<EventKind> {
        let hold = matches!(self.events, Events::Channel(_)) && rng.chance(15);
        let (k, _, held) = self.next(hold);
        if let Some(ev) = held {
            // Destroying now would hang librdmacm: it must be refused, id intact.
            let id = self.id.take().expect("id");
            match id.destroy() {
                Err(refused) => {
                    if !matches!(refused.error, CmError::UnackedEvents { .. }) {
                        self.ctx
                            .checker
                            .violation(format!("unexpected refusal {}", refused.error));
                    }
                    self.ctx.n.unacked_refusals.fetch_add(1, SeqCst);
                    self.id = Some(refused.id);
                }
                Ok(()) => self.ctx.checker.violation(format!(
                    "#{} destroyed while this thread held an un-acked event",
                    self.serial
                )),
            }
            ev.ack();
        }
        if want.contains(&k) && !self.dead {
            Some(k)
        } else {
            if matches!(
                k,
                EventKind::Rejected | EventKind::Unreachable | EventKind::ConnectError
            ) {
                self.ctx.n.rejected.fetch_add(1, SeqCst);
            }
            if k == EventKind::AddrError {
                self.ctx.n.addr_errors.fetch_add(1, SeqCst);
            }
            None
        }
    }

    fn destroy(&mut self) {
        // Events queued for an id are discarded when it is destroyed: take (and
        // record) what is already queued, so that the accounting sees every event the
        // CM delivered before destroy was asked.
        if let Events::Channel(ch) = &self.events {
            while let Some(ev) = ch.try_get_event() {
                let s = ev.id().serial();
                self.ctx.checker.enter(s, ev.kind, ev.id().device_name());
                self.ctx.checker.exit(s, false);
                if ev.kind == EventKind::DeviceRemoval {
                    self.removed = true;
                    self.ctx.n.client_removals.fetch_add(1, SeqCst);
                }
            }
        }
        if let Some(id) = self.id.take() {
            self.ctx.checker.destroy_asked(self.serial);
            if let Err(e) = id.destroy() {
                self.ctx
                    .fail(&format!("destroy of #{} refused: {}", self.serial, e.error));
            }
            self.ctx.checker.destroy_done(self.serial);
        }
    }
}

fn client_cycle(ctx: &Ctx, rng: &mut Rng, chan: &EventChannel<FakeDevice>) {
    let Some((src, dst)) = ctx.pick(rng) else {
        std::thread::sleep(Duration::from_millis(1));
        return;
    };
    ctx.n.cycles.fetch_add(1, SeqCst);
    let channel = rng.chance(40);
    let destroy_on_removal = rng.chance(50);
    let (id, events) = if channel {
        (
            ctx.cm.create_id_with_channel(chan),
            Events::Channel(chan.clone()),
        )
    } else {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let ck = ctx.checker.clone();
        let id = ctx
            .cm
            .create_id(move |id: &CmIdRef<FakeDevice>, ev: CmEvent<FakeDevice>| {
                let s = id.serial();
                ck.enter(s, ev.kind, id.device_name());
                let destroy = ev.kind == EventKind::DeviceRemoval && destroy_on_removal;
                ck.exit(s, destroy);
                let _ = tx.lock().unwrap().send((ev.kind, ev.status, destroy));
                if destroy {
                    Disposition::Destroy
                } else {
                    Disposition::Keep
                }
            });
        (id, Events::Callback(rx))
    };
    let serial = id.serial();
    let mut c = Client {
        ctx,
        id: Some(id),
        serial,
        events,
        dead: false,
        removed: false,
    };
    let abort = |rng: &mut Rng, c: &mut Client<'_>| {
        if rng.chance(8) {
            c.ctx.n.aborted.fetch_add(1, SeqCst);
            true
        } else {
            false
        }
    };
    'story: {
        let id = c.id.as_ref().unwrap();
        if id
            .resolve_addr(
                Some(std::net::SocketAddr::from((src, 0))),
                std::net::SocketAddr::from((dst, PORT)),
                Duration::from_secs(2),
            )
            .is_err()
        {
            break 'story;
        }
        if abort(rng, &mut c) || c.expect(&[EventKind::AddrResolved], rng).is_none() {
            break 'story;
        }
        let Some(id) = c.id.as_ref() else {
            break 'story;
        };
        if id.resolve_route(WAIT).is_err() {
            break 'story;
        }
        if c.expect(&[EventKind::RouteResolved], rng).is_none() {
            break 'story;
        }
        let Some(id) = c.id.as_ref() else {
            break 'story;
        };
        if id.create_qp(&(), ()).is_err()
            || id
                .connect(
                    &ConnParam::new(2, 2)
                        .with_private_data(serial.to_be_bytes().to_vec())
                        .with_retry_count(7),
                )
                .is_err()
        {
            break 'story;
        }
        if abort(rng, &mut c) || c.expect(&[EventKind::Established], rng).is_none() {
            break 'story;
        }
        ctx.n.established.fetch_add(1, SeqCst);
        if rng.chance(30) {
            std::thread::sleep(Duration::from_micros(rng.below(2000)));
        }
        if abort(rng, &mut c) {
            break 'story;
        }
        let Some(id) = c.id.as_ref() else {
            break 'story;
        };
        let _ = id.disconnect();
        let _ = c.expect(&[EventKind::Disconnected], rng);
    }
    c.destroy();
}

// ----------------------------------------------------------------- the chaos

fn add_device(ctx: &Ctx, slot: usize) {
    let mut slots = ctx.slots.lock().unwrap();
    let s = &mut slots[slot];
    s.gen += 1;
    let name = format!("d{slot}g{}", s.gen);
    let dev = FakeDevice::new(&ctx.net, &name, &[(s.addr, 24)]);
    s.current = Some(dev.clone());
    drop(slots);
    ctx.cm.add_device(dev).unwrap();
    ctx.n.devices_added.fetch_add(1, SeqCst);
}

fn remove_device(ctx: &Ctx, slot: usize, rng: &mut Rng) -> Option<Removal<FakeDevice>> {
    let dev = ctx.slots.lock().unwrap()[slot].current.take()?;
    ctx.n.devices_removed.fetch_add(1, SeqCst);
    if rng.chance(25) {
        // The device notices its link is gone and reports it.
        let start = ctx.checker.tick();
        dev.unplug();
        ctx.removals.lock().unwrap().push(RemovalRecord {
            device: dev.name.clone(),
            start,
            end: u64::MAX,
            notified: true,
        });
        let ok = eventually(WAIT, || dev.released.load(SeqCst));
        if !ok {
            ctx.fail(&format!("{} (unplugged) not released", dev.name));
        }
        return None;
    }
    if rng.chance(50) {
        // The link fails first: connections close, connects are reset.
        dev.provider.go_down();
    }
    let start = ctx.checker.tick();
    let removal = ctx.cm.remove_device(&dev.name).unwrap();
    let end = ctx.checker.tick();
    ctx.removals.lock().unwrap().push(RemovalRecord {
        device: dev.name.clone(),
        start,
        end,
        notified: false,
    });
    Some(removal)
}

fn chaos(ctx: &Ctx, rng: &mut Rng) {
    let mut pending: Vec<(usize, Removal<FakeDevice>)> = Vec::new();
    while !ctx.stop.load(SeqCst) {
        std::thread::sleep(Duration::from_millis(2 + rng.below(15)));
        // Released devices' slots can take a new device.
        pending.retain(|(_, r)| !r.is_released());
        let slot = rng.below(SLOTS as u64) as usize;
        let present = ctx.slots.lock().unwrap()[slot].current.is_some();
        let busy = pending.iter().any(|(s, _)| *s == slot);
        if present {
            if let Some(r) = remove_device(ctx, slot, rng) {
                pending.push((slot, r));
            }
        } else if !busy {
            add_device(ctx, slot);
        }
    }
    for slot in 0..SLOTS {
        if let Some(r) = remove_device(ctx, slot, rng) {
            pending.push((slot, r));
        }
    }
    for (_, r) in pending {
        if let Err(e) = r.wait_timeout(WAIT) {
            ctx.fail(&format!("{} not released: {e}", r.device_name()));
        }
    }
}

// ------------------------------------------------------------------- the test

#[test]
fn clients_servers_and_device_churn() {
    let seed = env_u64("RDMACM_STRESS_SEED", 0x5eed_2007);
    let run_ms = env_u64("RDMACM_STRESS_MS", 4000);
    let clients = env_u64("RDMACM_STRESS_CLIENTS", 4);
    let rule_break = std::env::var("RDMACM_BREAK")
        .ok()
        .map(|n| RuleBreak::from_name(&n).expect("RDMACM_BREAK"));
    let t0 = Instant::now();
    let ctx = Arc::new(Ctx {
        cm: RdmaCm::new(RdmaCmConfig {
            name: "stress".into(),
            rule_break,
            ..RdmaCmConfig::default()
        })
        .unwrap(),
        net: FakeNet::new(testkit::Rng::delays(seed), 300),
        checker: Arc::new(Checker::default()),
        slots: Mutex::new(
            (0..SLOTS)
                .map(|i| Slot {
                    addr: std::net::Ipv4Addr::new(10, 0, 0, 1 + i as u8),
                    current: None,
                    gen: 0,
                })
                .collect(),
        ),
        removals: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        n: Numbers::default(),
    });
    for slot in 0..SLOTS {
        add_device(&ctx, slot);
    }
    let (listener, table) = server(&ctx);
    let c2 = Arc::downgrade(&ctx);
    let watchdog = Watchdog::arm(
        "rdma-cm stress",
        Duration::from_millis(run_ms) + Duration::from_secs(40),
        move || c2.upgrade().map_or_else(String::new, |c| c.dump()),
    );

    let mut threads = Vec::new();
    for t in 0..clients {
        let ctx = ctx.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("client-{t}"))
                .spawn(move || {
                    let mut rng = Rng::new(seed ^ (t + 1).wrapping_mul(0xA24B_AED4_963E_E407));
                    let chan = ctx.cm.create_event_channel();
                    while !ctx.stop.load(SeqCst) {
                        client_cycle(&ctx, &mut rng, &chan);
                    }
                })
                .unwrap(),
        );
    }
    let chaos_ctx = ctx.clone();
    let chaos_thread = std::thread::Builder::new()
        .name("chaos".into())
        .spawn(move || {
            let mut rng = Rng::new(seed ^ 0xC4A0);
            chaos(&chaos_ctx, &mut rng)
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(run_ms));
    let stop_at = ctx.checker.tick();
    ctx.stop.store(true, SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    chaos_thread.join().unwrap();

    // Every device is gone: the wildcard listener has no internal listener left, and
    // still listens (for devices added later).
    assert_eq!(listener.state(), rdma_cm::IdState::Listen);
    assert_eq!(ctx.cm.stats().internal_listeners, 0);
    table.lock().unwrap().clear();
    ctx.checker.destroy_asked(listener.serial());
    listener.destroy().unwrap();
    assert_clean(&ctx.cm, &ctx.net);
    drop(watchdog);

    ctx.checker.assert_clean();
    let removals = ctx.removals.lock().unwrap();
    let RemovalTally {
        told,
        exactly_one,
        none_required,
    } = check_removals(&ctx.checker.logs(), &removals);
    let s = ctx.cm.stats();
    // Delivered by the CM >= seen: a channel id's queued DeviceRemoval is discarded if
    // the id is destroyed before the event is taken (a race with the client's drain).
    assert!(s.device_removals >= told, "{s:?}, seen {told}");
    let n = &ctx.n;
    eprintln!(
        "rdma-cm stress: seed {seed:#x}, {:.1} s, {clients} clients; {} cycles, {} established, \
         {} rejected/unreachable, {} addr errors, {} aborted, {} server accepts; \
         {} devices added, {} removed ({} tracked); {} DeviceRemoval delivered \
         ({} ids required exactly one, {} required none), {} skipped as destroying; \
         {} un-acked destroy refusals; {} ids, {} callbacks; stop at seq {stop_at}",
        t0.elapsed().as_secs_f64(),
        n.cycles.load(SeqCst),
        n.established.load(SeqCst),
        n.rejected.load(SeqCst),
        n.addr_errors.load(SeqCst),
        n.aborted.load(SeqCst),
        n.server_accepts.load(SeqCst),
        n.devices_added.load(SeqCst),
        n.devices_removed.load(SeqCst),
        removals.len(),
        s.device_removals,
        exactly_one,
        none_required,
        s.removals_skipped,
        n.unacked_refusals.load(SeqCst),
        s.ids_created,
        s.callbacks,
    );
    assert!(n.established.load(SeqCst) > 0);
    assert!(s.device_removals > 0);
}
