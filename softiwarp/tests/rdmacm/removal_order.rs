//! Breaking the order of device removal (the kernel's: `DeviceRemoval` before, and
//! instead of, the connections' ends) with soft devices on memory links (no root): the
//! link is cut (its memory link end removed: the device ends, as `ip link del` on a
//! TAP) or set down (the link watcher reports removal) at awkward moments: while a
//! connect is in flight (before the MPA Reply, racing the accept that sends it), while
//! an accept is in progress on the other side, while the id is inside its
//! `Established` or `Disconnected` callback, while another thread destroys the id,
//! with events un-acked on an event channel, and under a wildcard listener while
//! connection requests arrive. Both delivery styles.
//!
//! Checked (design.md section 5, docs/ARCHITECTURE.md "Removal"): each id bound to the
//! removed device hears exactly one `DeviceRemoval` unless its destroy was asked
//! first, and no `Disconnected` / `ConnectError` / `Rejected` / `Unreachable` caused
//! by the removal; nothing after `DeviceRemoval` or after destroy returned; callbacks
//! of one id never overlap nor run on a device thread; every posted WR completes
//! flushed; the device is released once its ids are gone; nothing hangs (watchdogs).

use crate::support::*;
use rdma_cm::{CmEvent, CmId, CmIdRef, ConnParam, Disposition, EventChannel, EventKind, IdState};
use softiwarp::cm::rdmacm::SoftDevice;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::Watchdog;
use verbs::WcStatus;

const WAIT: Duration = Duration::from_secs(10);
const PORT: u16 = 7700;
const NET: u8 = 76;

/// Devices `oc<sub>` / `os<sub>` in 10.76.`sub`.0/24.
fn hosts(sub: u8) -> Hosts {
    Hosts::new("o", NET, sub)
}

fn server_addr(h: &Hosts) -> SocketAddr {
    SocketAddr::new(pair_ip(NET, h.sub, 2).into(), PORT)
}

/// How the link ends.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// The memory link end removed: the device ends (engine -> provider end hook).
    Remove,
    /// The link set down: the device runs on, the CM's link watcher reports removal.
    Down,
}

impl Cut {
    fn of(round: u8) -> Cut {
        if round.is_multiple_of(2) {
            Cut::Remove
        } else {
            Cut::Down
        }
    }
    fn apply(self, link: &softiwarp::link::MemoryControl) {
        match self {
            Cut::Remove => link.remove(),
            Cut::Down => link.set_down(),
        }
    }
}

/// Events that a removal must never cause (they would be the connection's end
/// reaching the id instead of, or before, `DeviceRemoval`).
fn is_connection_end(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::Disconnected
            | EventKind::ConnectError
            | EventKind::Rejected
            | EventKind::Unreachable
    )
}

fn param() -> ConnParam {
    ConnParam {
        responder_resources: 2,
        initiator_depth: 2,
        ..Default::default()
    }
}

fn expect(ch: &EventChannel<SoftDevice>, kind: EventKind) -> rdma_cm::ChannelEvent<SoftDevice> {
    expect_within(ch, kind, WAIT)
}

/// Every event left on `ch` within a short pause, as (id, kind), acked.
fn drain(ch: &EventChannel<SoftDevice>) -> Vec<(u64, EventKind)> {
    drain_within(ch, Duration::from_millis(300))
}

/// The events of id `serial` in `evs`.
fn of(evs: &[(u64, EventKind)], serial: u64) -> Vec<EventKind> {
    evs.iter().filter(|e| e.0 == serial).map(|e| e.1).collect()
}

/// The removal's events of one id that must hear it: exactly one `DeviceRemoval`,
/// last, and no connection end. `before` are the kinds allowed ahead of it.
fn assert_one_removal(what: &str, kinds: &[EventKind], before: &[EventKind]) {
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == EventKind::DeviceRemoval)
            .count(),
        1,
        "{what}: {kinds:?}"
    );
    assert_eq!(
        kinds.last(),
        Some(&EventKind::DeviceRemoval),
        "{what}: {kinds:?}"
    );
    for k in &kinds[..kinds.len() - 1] {
        assert!(
            before.contains(k) && !is_connection_end(*k),
            "{what}: {k} before DeviceRemoval: {kinds:?}"
        );
    }
}

fn listener(h: &Hosts) -> CmId<SoftDevice> {
    let l = h.server.create_id_with_channel(&h.sch);
    l.bind_addr(server_addr(h)).unwrap();
    l.listen(8).unwrap();
    l
}

/// Resolve address and route of a client id (any delivery) whose events come on
/// `next` (a channel pop or a callback log).
fn resolve(id: &CmIdRef<SoftDevice>, dst: SocketAddr, next: &dyn Fn() -> EventKind) {
    id.resolve_addr(None, dst, WAIT).unwrap();
    assert_eq!(next(), EventKind::AddrResolved);
    id.resolve_route(WAIT).unwrap();
    assert_eq!(next(), EventKind::RouteResolved);
}

/// A listener on the server's address and a channel-mode client id whose connect it
/// holds (ConnectRequest taken, not accepted): (listener, client id, its verbs with
/// `client_recvs` receives, the new id, its verbs with `server_recvs`).
fn requested(
    h: &Hosts,
    client_recvs: usize,
    server_recvs: usize,
) -> (
    CmId<SoftDevice>,
    CmId<SoftDevice>,
    Verbs,
    CmId<SoftDevice>,
    Verbs,
) {
    let l = listener(h);
    let id = h.client.create_id_with_channel(&h.cch);
    resolve(&id, server_addr(h), &|| {
        h.cch.get_event_timeout(WAIT).unwrap().kind
    });
    let mut cv = Verbs::on(&id).unwrap();
    cv.post_recvs(client_recvs).unwrap();
    id.connect(&param()).unwrap();
    let conn = expect(&h.sch, EventKind::ConnectRequest)
        .take_new_id()
        .unwrap();
    let mut sv = Verbs::on(&conn).unwrap();
    sv.post_recvs(server_recvs).unwrap();
    (l, id, cv, conn, sv)
}

/// The CM `cm` of the side whose link ended: waits until it holds no device (every
/// id bound to it is gone), then checks nothing is left.
fn assert_released(cm: &softiwarp::cm::rdmacm::SoftRdmaCm, what: &str) {
    assert!(
        testkit::eventually(WAIT, || {
            let _ = cm.flush();
            cm.stats().devices_held == 0
        }),
        "{what}: device not released: {:?}",
        cm.stats()
    );
    assert!(cm.devices().is_empty(), "{what}: {:?}", cm.devices());
    assert_idle(cm, what);
}

/// The CM `cm` has no id, event or job left (its device may still be registered).
fn assert_idle(cm: &softiwarp::cm::rdmacm::SoftRdmaCm, what: &str) {
    cm.flush().unwrap();
    let s = cm.stats();
    assert_eq!(
        (
            s.ids_alive,
            s.events_queued,
            s.events_unacked,
            s.handler_panics,
            s.jobs_pending
        ),
        (0, 0, 0, 0, 0),
        "{what}: {s:?}"
    );
}

/// New ids kept by a listener's callback, with their verbs objects if made and the
/// outcome of their accept.
type Kept = Arc<Mutex<Vec<(CmId<SoftDevice>, Option<Verbs>, Result<(), String>)>>>;

/// Bind `id` to the wildcard address on [`PORT`] and listen.
fn listen_any(id: &CmId<SoftDevice>) {
    let wild: SocketAddr = format!("0.0.0.0:{PORT}").parse().unwrap();
    id.bind_addr(wild).unwrap();
    id.listen(16).unwrap();
}

/// `n` channel-mode client ids routed to the server, each with a QP and one receive.
fn routed_clients(h: &Hosts, n: usize) -> Vec<(CmId<SoftDevice>, Verbs)> {
    (0..n)
        .map(|_| {
            let id = h.client.create_id_with_channel(&h.cch);
            resolve(&id, server_addr(h), &|| {
                h.cch.get_event_timeout(WAIT).unwrap().kind
            });
            let mut v = Verbs::on(&id).unwrap();
            v.post_recvs(1).unwrap();
            (id, v)
        })
        .collect()
}

/// Let `cm`'s callbacks and jobs run for `time`.
fn settle(cm: &softiwarp::cm::rdmacm::SoftRdmaCm, time: Duration) {
    let t0 = Instant::now();
    while t0.elapsed() < time {
        let _ = cm.flush();
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// End of a wildcard round: destroy the kept new ids (their WRs all flushed), the
/// listener and the clients (their WRs complete); the server's device is released,
/// the client CM is idle, and no callback broke a rule.
fn destroy_all(
    h: &Hosts,
    log: &Log,
    kept: &Kept,
    wild: CmId<SoftDevice>,
    clients: Vec<(CmId<SoftDevice>, Verbs)>,
    what: &str,
) {
    for (id, v, _) in kept.lock().unwrap().drain(..) {
        let serial = id.serial();
        id.destroy().unwrap();
        log.destroyed(serial);
        if let Some(mut v) = v {
            assert!(v.all_completed(WAIT), "{what}: {:?}", v.completions);
            assert_eq!(
                v.count(WcStatus::WrFlushErr),
                v.posted,
                "{what}: {:?}",
                v.completions
            );
        }
    }
    let serial = wild.serial();
    wild.destroy().unwrap();
    log.destroyed(serial);
    for (id, mut v) in clients {
        id.destroy().unwrap();
        assert!(v.all_completed(WAIT), "{what}: {:?}", v.completions);
    }
    let _ = drain(&h.cch);
    assert_released(&h.server, &format!("{what} server"));
    assert_idle(&h.client, &format!("{what} client"));
    log.assert_clean();
}

/// A per-id record of callbacks: order, overlap, thread, after-destroy.
#[derive(Default)]
struct Log {
    events: Mutex<Vec<(u64, EventKind)>>,
    inside: Mutex<HashSet<u64>>,
    destroyed: Mutex<HashSet<u64>>,
    violations: Mutex<Vec<String>>,
}

impl Log {
    fn enter(&self, serial: u64, kind: EventKind) {
        let mut v = Vec::new();
        if on_device_thread() {
            v.push(format!("{kind} of #{serial} on a device thread"));
        }
        if self.destroyed.lock().unwrap().contains(&serial) {
            v.push(format!("{kind} of #{serial} after its destroy returned"));
        }
        if !self.inside.lock().unwrap().insert(serial) {
            v.push(format!("{kind} of #{serial} overlaps another callback"));
        }
        if let Some(last) = of(&self.events.lock().unwrap(), serial).last() {
            if *last == EventKind::DeviceRemoval {
                v.push(format!("{kind} of #{serial} after DeviceRemoval"));
            }
        }
        self.events.lock().unwrap().push((serial, kind));
        self.violations.lock().unwrap().extend(v);
    }
    fn exit(&self, serial: u64) {
        self.inside.lock().unwrap().remove(&serial);
    }
    fn destroyed(&self, serial: u64) {
        self.destroyed.lock().unwrap().insert(serial);
    }
    fn kinds(&self, serial: u64) -> Vec<EventKind> {
        of(&self.events.lock().unwrap(), serial)
    }
    fn assert_clean(&self) {
        let v = self.violations.lock().unwrap();
        assert!(v.is_empty(), "{v:?}");
    }
}

/// A client connect in flight when the client's link ends: the server holds the
/// request (no MPA Reply yet), or accepts it racing the cut at varied delays. The
/// client id hears `Established` at most (if the reply won) and then exactly one
/// `DeviceRemoval`, never the connection's failure; its receives are flushed; its
/// device is released once it is destroyed.
#[test]
fn client_link_ends_while_connecting() {
    let _w = Watchdog::arm("connecting", Duration::from_secs(120), String::new);
    for round in 0..8u8 {
        let cut = Cut::of(round);
        let h = hosts(1 + round);
        let (l, id, mut cv, conn, mut sv) = requested(&h, 3, 2);
        let accept = if round < 4 {
            // Before the MPA Reply.
            cut.apply(&h.pair.a_link);
            std::thread::sleep(Duration::from_millis(50));
            conn.accept(&param())
        } else {
            let delay = Duration::from_micros(u64::from(round - 4) * 400);
            std::thread::scope(|s| {
                let t = s.spawn(|| conn.accept(&param()));
                std::thread::sleep(delay);
                cut.apply(&h.pair.a_link);
                t.join().unwrap()
            })
        };
        let c = drain(&h.cch);
        eprintln!("round {round} ({cut:?}): accept {accept:?}; client {c:?}");
        assert_one_removal(
            &format!("round {round} client"),
            &of(&c, id.serial()),
            &[EventKind::Established],
        );
        assert_eq!(c.len(), of(&c, id.serial()).len(), "{c:?}");
        assert!(cv.all_completed(WAIT), "{:?}", cv.completions);
        assert_eq!(cv.count(WcStatus::WrFlushErr), 3, "{:?}", cv.completions);
        assert!(h.client.devices().is_empty());
        id.destroy().unwrap();
        assert_released(&h.client, &format!("round {round} client"));
        conn.destroy().unwrap();
        l.destroy().unwrap();
        assert!(sv.all_completed(WAIT), "{:?}", sv.completions);
        let _ = drain(&h.sch);
        assert_idle(&h.server, &format!("round {round} server"));
    }
}

/// The server's link ends while the new id accepts (before, during and after the
/// accept call): the new id and the listener bound to the device's address hear
/// exactly one `DeviceRemoval` each (the new id maybe after `Established`), never
/// `Disconnected`; the server's WRs are flushed.
#[test]
fn server_link_ends_while_accepting() {
    let _w = Watchdog::arm("accepting", Duration::from_secs(120), String::new);
    for round in 0..8u8 {
        let cut = Cut::of(round);
        let h = hosts(20 + round);
        let (l, id, mut cv, conn, mut sv) = requested(&h, 1, 4);
        let delay = Duration::from_micros(u64::from(round) * 250);
        let accept = std::thread::scope(|s| {
            let t = s.spawn(|| {
                std::thread::sleep(delay);
                cut.apply(&h.pair.b_link);
            });
            let r = conn.accept(&param());
            t.join().unwrap();
            r
        });
        let s = drain(&h.sch);
        eprintln!("round {round} ({cut:?}): accept {accept:?}; server {s:?}");
        assert_one_removal(
            &format!("round {round} new id"),
            &of(&s, conn.serial()),
            &[EventKind::Established],
        );
        assert_one_removal(&format!("round {round} listener"), &of(&s, l.serial()), &[]);
        assert!(sv.all_completed(WAIT), "{:?}", sv.completions);
        assert_eq!(sv.count(WcStatus::WrFlushErr), 4, "{:?}", sv.completions);
        conn.destroy().unwrap();
        l.destroy().unwrap();
        assert_released(&h.server, &format!("round {round} server"));
        id.destroy().unwrap();
        assert!(cv.all_completed(WAIT), "{:?}", cv.completions);
        let _ = drain(&h.cch);
        assert_idle(&h.client, &format!("round {round} client"));
    }
}

/// What the test does while the client's callback is held.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Held {
    /// Inside `Established`: cut, release, callback returns Keep.
    Established,
    /// Inside `Disconnected` (the server disconnected): cut, release, Keep.
    DisconnectedKeep,
    /// Inside `Disconnected`: cut, release, the callback returns Destroy.
    DisconnectedDestroy,
    /// Inside `Established`: another thread calls destroy (waits), then cut, release.
    DestroyThenCut,
    /// Inside `Established`: cut, then another thread calls destroy, release.
    CutThenDestroy,
}

/// Callback mode: the client's link ends while its id is inside a callback (held on a
/// channel by the test), with the callback's return and a destroy from another thread
/// varied. `DeviceRemoval` follows the held callback exactly once (never overlapping
/// it) unless destroy was asked (by the return or the call): then nothing; nothing
/// after destroy returned; the receives are flushed; the device is released.
#[test]
fn link_ends_while_a_callback_runs() {
    let _w = Watchdog::arm("in_callback", Duration::from_secs(150), String::new);
    let cases = [
        Held::Established,
        Held::DisconnectedKeep,
        Held::DisconnectedDestroy,
        Held::DestroyThenCut,
        Held::CutThenDestroy,
    ];
    for (i, held) in cases.iter().copied().enumerate() {
        for cut in [Cut::Remove, Cut::Down] {
            let sub = 40 + 2 * i as u8 + matches!(cut, Cut::Down) as u8;
            one_held_callback(sub, held, cut);
        }
    }
}

fn one_held_callback(sub: u8, held: Held, cut: Cut) {
    let h = hosts(sub);
    let l = listener(&h);
    let log = Arc::new(Log::default());
    let (kinds_tx, kinds) = mpsc::channel();
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let hold_on = if matches!(held, Held::DisconnectedKeep | Held::DisconnectedDestroy) {
        EventKind::Disconnected
    } else {
        EventKind::Established
    };
    let destroy_on_return = held == Held::DisconnectedDestroy;
    let (kinds_tx, entered_tx, release_rx) = (
        Mutex::new(kinds_tx),
        Mutex::new(entered_tx),
        Mutex::new(release_rx),
    );
    let lg = log.clone();
    let id = h
        .client
        .create_id(move |r: &CmIdRef<SoftDevice>, ev: CmEvent<SoftDevice>| {
            lg.enter(r.serial(), ev.kind);
            let _ = kinds_tx.lock().unwrap().send(ev.kind);
            let mut d = Disposition::Keep;
            if ev.kind == hold_on {
                entered_tx.lock().unwrap().send(()).unwrap();
                release_rx.lock().unwrap().recv_timeout(WAIT).unwrap();
                if destroy_on_return {
                    d = Disposition::Destroy;
                }
            }
            lg.exit(r.serial());
            d
        });
    let serial = id.serial();
    resolve(&id, server_addr(&h), &|| kinds.recv_timeout(WAIT).unwrap());
    let mut cv = Verbs::on(&id).unwrap();
    cv.post_recvs(3).unwrap();
    id.connect(&param()).unwrap();
    let conn = expect(&h.sch, EventKind::ConnectRequest)
        .take_new_id()
        .unwrap();
    let _sv = Verbs::on(&conn).unwrap();
    conn.accept(&param()).unwrap();
    expect(&h.sch, EventKind::Established).ack();
    if hold_on == EventKind::Disconnected {
        assert_eq!(kinds.recv_timeout(WAIT).unwrap(), EventKind::Established);
        conn.disconnect().unwrap();
    }
    entered.recv_timeout(WAIT).expect("the held callback");
    let what = format!("{held:?} {cut:?}");
    // A second handle to watch the id's state: each step waits until the previous
    // one took effect (a loaded machine may delay the destroyer or the link watcher).
    let watch: CmIdRef<SoftDevice> = (*id).clone();
    let state_is = |s: IdState| testkit::eventually(WAIT, || watch.state() == s);
    let mut id = Some(id);
    let mut destroyer = None;
    if held == Held::DestroyThenCut {
        let (own, lg) = (id.take().unwrap(), log.clone());
        destroyer = Some(std::thread::spawn(move || {
            own.destroy().unwrap();
            lg.destroyed(serial);
        }));
        assert!(state_is(IdState::Destroying), "{what}");
    }
    cut.apply(&h.pair.a_link);
    if held == Held::DestroyThenCut {
        // The removal must leave a destroying id alone: nothing to wait for.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(watch.state(), IdState::Destroying, "{what}");
    } else {
        assert!(
            state_is(IdState::DeviceRemoval),
            "{what}: {:?}",
            watch.state()
        );
    }
    if held == Held::CutThenDestroy {
        let (own, lg) = (id.take().unwrap(), log.clone());
        destroyer = Some(std::thread::spawn(move || {
            own.destroy().unwrap();
            lg.destroyed(serial);
        }));
        assert!(state_is(IdState::Destroying), "{what}");
    }
    if let Some(d) = &destroyer {
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !d.is_finished(),
            "{what}: destroy must wait for the callback"
        );
    }
    release.send(()).unwrap();
    if let Some(d) = destroyer {
        d.join().unwrap();
    }
    // Whatever removal delivers: DeviceRemoval only if the id is kept.
    if matches!(held, Held::Established | Held::DisconnectedKeep) {
        assert!(
            testkit::eventually(WAIT, || log
                .kinds(serial)
                .contains(&EventKind::DeviceRemoval)),
            "{what}: no DeviceRemoval: {:?}",
            log.kinds(serial)
        );
    }
    let _ = h.client.flush();
    std::thread::sleep(Duration::from_millis(200));
    drop(watch);
    let got = log.kinds(serial);
    eprintln!("{what}: {got:?}");
    log.assert_clean();
    let expected_before = &got[..2];
    assert_eq!(
        expected_before,
        [EventKind::AddrResolved, EventKind::RouteResolved],
        "{what}"
    );
    let after_route = &got[2..];
    match held {
        Held::Established => assert_eq!(
            after_route,
            [EventKind::Established, EventKind::DeviceRemoval],
            "{what}"
        ),
        Held::DisconnectedKeep => assert_eq!(
            after_route,
            [
                EventKind::Established,
                EventKind::Disconnected,
                EventKind::DeviceRemoval
            ],
            "{what}"
        ),
        Held::DisconnectedDestroy => assert_eq!(
            after_route,
            [EventKind::Established, EventKind::Disconnected],
            "{what}"
        ),
        // Destroy was asked before the removal was delivered: nothing.
        Held::DestroyThenCut | Held::CutThenDestroy => {
            assert_eq!(after_route, [EventKind::Established], "{what}")
        }
    }
    assert!(cv.all_completed(WAIT), "{what}: {:?}", cv.completions);
    assert_eq!(cv.count(WcStatus::WrFlushErr), 3, "{what}");
    if let Some(id) = id {
        id.destroy().unwrap();
    }
    log.destroyed(serial);
    assert_released(&h.client, &what);
    conn.destroy().unwrap();
    l.destroy().unwrap();
    let _ = drain(&h.sch);
    assert_idle(&h.server, &what);
    log.assert_clean();
}

/// Channel mode with events handed out and not acked when the link ends: the
/// `DeviceRemoval` is queued behind them (delivery does not wait for acks), exactly
/// once; a destroy from another thread waits for the acks and then returns; nothing
/// comes after; the device is released.
#[test]
fn link_ends_with_unacked_channel_events() {
    let _w = Watchdog::arm("unacked", Duration::from_secs(120), String::new);
    for round in 0..4u8 {
        let cut = Cut::of(round);
        let disconnected_first = round >= 2;
        let h = hosts(60 + round);
        let (l, id, mut cv, conn, _sv) = requested(&h, 2, 0);
        conn.accept(&param()).unwrap();
        expect(&h.sch, EventKind::Established).ack();
        let mut held = vec![expect(&h.cch, EventKind::Established)];
        if disconnected_first {
            conn.disconnect().unwrap();
            held.push(expect(&h.cch, EventKind::Disconnected));
        }
        cut.apply(&h.pair.a_link);
        let rem = expect(&h.cch, EventKind::DeviceRemoval);
        assert_eq!(rem.id().serial(), id.serial());
        let serial = id.serial();
        let destroyer = std::thread::spawn(move || id.destroy().unwrap());
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !destroyer.is_finished(),
            "round {round}: destroy must wait for the acks"
        );
        drop(held);
        rem.ack();
        destroyer.join().unwrap();
        assert!(
            h.cch.get_event_timeout(Duration::from_millis(300)).is_err(),
            "round {round}: an event of #{serial} after DeviceRemoval / destroy"
        );
        assert!(cv.all_completed(WAIT), "{:?}", cv.completions);
        assert_eq!(cv.count(WcStatus::WrFlushErr), 2);
        assert_released(&h.client, &format!("round {round}"));
        conn.destroy().unwrap();
        l.destroy().unwrap();
        let _ = drain(&h.sch);
        assert_idle(&h.server, &format!("round {round} server"));
    }
}

/// A wildcard listener (callback mode) on the server while several clients connect at
/// once and the server's link ends at varied moments: the user's listener hears
/// nothing from the removal (its per-device listener goes silently); each new id hears
/// exactly one `DeviceRemoval`, last, unless its ConnectRequest callback destroyed it
/// (every third is rejected by returning Destroy); callbacks never overlap; the
/// server's WRs are flushed; the device is released.
#[test]
fn server_link_ends_under_a_wildcard_listener_with_requests_arriving() {
    let _w = Watchdog::arm("wildcard", Duration::from_secs(150), String::new);
    const CLIENTS: usize = 4;
    for round in 0..5u8 {
        let cut = Cut::of(round);
        let h = hosts(80 + round);
        let log = Arc::new(Log::default());
        let kept: Kept = Arc::default();
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (lg, kp, rq) = (log.clone(), kept.clone(), requests.clone());
        let wild = h.server.create_id(
            move |r: &CmIdRef<SoftDevice>, mut ev: CmEvent<SoftDevice>| {
                lg.enter(r.serial(), ev.kind);
                let mut d = Disposition::Keep;
                if let Some(new) = ev.take_new_id() {
                    let n = rq.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if n % 3 == 2 {
                        lg.destroyed(r.serial());
                        d = Disposition::Destroy;
                        drop(new);
                    } else {
                        // The QP or its receives may be refused once the device
                        // is going (typed errors); what was posted must complete.
                        let v = Verbs::on(&new).ok().map(|mut v| {
                            if let Err(e) = v.post_recvs(2) {
                                eprintln!("post_recv on #{}: {e}", r.serial());
                            }
                            v
                        });
                        let a = new.accept(&param()).map_err(|e| e.to_string());
                        kp.lock().unwrap().push((new, v, a));
                    }
                }
                lg.exit(r.serial());
                d
            },
        );
        listen_any(&wild);
        let clients = routed_clients(&h, CLIENTS);
        let delay = Duration::from_micros(800 + u64::from(round) * 600);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(delay);
                cut.apply(&h.pair.b_link);
            });
            for (id, _) in &clients {
                id.connect(&param()).unwrap();
            }
        });
        // Let requests and the removal settle.
        settle(&h.server, Duration::from_millis(600));
        log.assert_clean();
        let evs = log.events.lock().unwrap().clone();
        let n = requests.load(std::sync::atomic::Ordering::SeqCst);
        eprintln!("round {round} ({cut:?}): {n} requests; server {evs:?}");
        assert!(
            of(&evs, wild.serial()).is_empty(),
            "the wildcard listener hears nothing: {evs:?}"
        );
        let by_id: HashMap<u64, Vec<EventKind>> = evs.iter().fold(HashMap::new(), |mut m, e| {
            m.entry(e.0).or_default().push(e.1);
            m
        });
        let kept_serials: HashSet<u64> =
            kept.lock().unwrap().iter().map(|k| k.0.serial()).collect();
        for (serial, kinds) in &by_id {
            if kept_serials.contains(serial) {
                assert_one_removal(
                    &format!("round {round} new id #{serial}"),
                    kinds,
                    &[EventKind::ConnectRequest, EventKind::Established],
                );
            } else {
                assert_eq!(kinds, &[EventKind::ConnectRequest], "destroyed by return");
            }
        }
        destroy_all(&h, &log, &kept, wild, clients, &format!("round {round}"));
    }
}

/// The widest window of the new order: the server's link is cut while its RDMA CM's
/// worker is busy (another id's `AddrResolved` callback sleeps), so the removal job
/// (which stops new ids from binding to the device) runs late, and while connection
/// requests wait in the iWARP CM behind a slow `ConnectRequest` callback of a wildcard
/// listener. Requests reported before the end are delivered after the end hook marked
/// the device's ids: their new ids are not marked. Each new id that saw its
/// `ConnectRequest` still hears exactly one `DeviceRemoval`, last, and no connection
/// end; the busy id hears `DeviceRemoval` after its callback; every WR completes.
#[test]
fn requests_delivered_between_the_end_hook_and_the_removal_job() {
    let _w = Watchdog::arm("late_job", Duration::from_secs(150), String::new);
    for round in 0..4u8 {
        let cut = Cut::of(round);
        let h = hosts(100 + round);
        let log = Arc::new(Log::default());
        let kept: Kept = Arc::default();
        let (lg, kp) = (log.clone(), kept.clone());
        let wild = h.server.create_id(
            move |r: &CmIdRef<SoftDevice>, mut ev: CmEvent<SoftDevice>| {
                lg.enter(r.serial(), ev.kind);
                if let Some(new) = ev.take_new_id() {
                    std::thread::sleep(Duration::from_millis(60));
                    let v = Verbs::on(&new).ok().map(|mut v| {
                        let _ = v.post_recvs(2);
                        v
                    });
                    let a = new.accept(&param()).map_err(|e| e.to_string());
                    kp.lock().unwrap().push((new, v, a));
                }
                lg.exit(r.serial());
                Disposition::Keep
            },
        );
        listen_any(&wild);
        // The server CM's worker, busy in a callback when the link ends.
        let (busy_tx, busy) = mpsc::channel();
        let busy_tx = Mutex::new(busy_tx);
        let lg = log.clone();
        let blocker =
            h.server
                .create_id(move |r: &CmIdRef<SoftDevice>, ev: CmEvent<SoftDevice>| {
                    lg.enter(r.serial(), ev.kind);
                    if ev.kind == EventKind::AddrResolved {
                        busy_tx.lock().unwrap().send(()).unwrap();
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    lg.exit(r.serial());
                    Disposition::Keep
                });
        let clients = routed_clients(&h, 4);
        for (id, _) in &clients {
            id.connect(&param()).unwrap();
        }
        // Requests arrive; the first callback sleeps, the others wait in the iWARP CM.
        std::thread::sleep(Duration::from_millis(20 + 15 * u64::from(round)));
        let client_ip = SocketAddr::new(pair_ip(NET, h.sub, 1).into(), 1);
        blocker.resolve_addr(None, client_ip, WAIT).unwrap();
        busy.recv_timeout(WAIT).unwrap();
        cut.apply(&h.pair.b_link);
        // Everything settles: the busy callback, the slow request callbacks, removal.
        settle(&h.server, Duration::from_millis(1200));
        log.assert_clean();
        let evs = log.events.lock().unwrap().clone();
        let outcomes: Vec<_> = kept
            .lock()
            .unwrap()
            .iter()
            .map(|k| (k.0.serial(), k.2.clone()))
            .collect();
        eprintln!("round {round} ({cut:?}): server {evs:?}; accepts {outcomes:?}");
        assert!(of(&evs, wild.serial()).is_empty(), "{evs:?}");
        assert_one_removal(
            &format!("round {round} busy id"),
            &of(&evs, blocker.serial()),
            &[EventKind::AddrResolved],
        );
        for (serial, _) in &outcomes {
            assert_one_removal(
                &format!("round {round} new id #{serial}"),
                &of(&evs, *serial),
                &[EventKind::ConnectRequest, EventKind::Established],
            );
        }
        let blocker_serial = blocker.serial();
        blocker.destroy().unwrap();
        log.destroyed(blocker_serial);
        destroy_all(&h, &log, &kept, wild, clients, &format!("round {round}"));
    }
}
