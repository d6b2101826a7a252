//! Breaking the RDMA CM with soft devices (memory links, no root): calls in the wrong
//! state or without a device, bad private data, connecting to nothing, device removal
//! at awkward moments (during address resolution, before the MPA Reply, during accept,
//! during disconnect, while a destroy waits for a callback), destroy with posted WRs,
//! a Destroy return from DeviceRemoval, many ids. Every case expects typed errors,
//! exactly-once events, every posted WR completed and nothing left in the registries
//! (design.md section 5, rdma-cm).

use crate::support::*;
use iw_cm::ProviderError;
use rdma_cm::{CmError, CmEvent, CmId, CmIdRef, ConnParam, Disposition, EventChannel, EventKind};
use softiwarp::cm::rdmacm::SoftDevice;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testkit::Watchdog;
use verbs::{QpState, WcStatus};

const WAIT: Duration = Duration::from_secs(10);
const PORT: u16 = 7600;

/// Devices `bc<sub>` / `bs<sub>` in 10.73.`sub`.0/24.
fn hosts(sub: u8) -> Hosts {
    Hosts::new("b", 73, sub)
}

/// The adversarial tests' calls on [`Hosts`].
impl Hosts {
    fn server_addr(&self) -> SocketAddr {
        SocketAddr::new(pair_ip(73, self.sub, 2).into(), PORT)
    }
    /// A client id in channel mode with its route resolved to `dst`.
    fn routed(&self, dst: SocketAddr) -> CmId<SoftDevice> {
        let id = self.client.create_id_with_channel(&self.cch);
        id.resolve_addr(None, dst, WAIT).unwrap();
        expect(&self.cch, EventKind::AddrResolved).ack();
        id.resolve_route(WAIT).unwrap();
        expect(&self.cch, EventKind::RouteResolved).ack();
        id
    }
    fn listener(&self) -> CmId<SoftDevice> {
        let l = self.server.create_id_with_channel(&self.sch);
        l.bind_addr(self.server_addr()).unwrap();
        l.listen(8).unwrap();
        l
    }
    /// Both registries empty once every id is gone.
    fn assert_clean(&self) {
        for cm in [&self.client, &self.server] {
            cm.flush().unwrap();
            let s = cm.stats();
            assert_eq!(
                (s.ids_alive, s.events_queued, s.events_unacked),
                (0, 0, 0),
                "{s:?}"
            );
            assert_eq!(
                (s.handler_panics, s.jobs_pending, s.timers_pending),
                (0, 0, 0),
                "{s:?}"
            );
        }
    }
}

fn expect(ch: &EventChannel<SoftDevice>, kind: EventKind) -> rdma_cm::ChannelEvent<SoftDevice> {
    expect_within(ch, kind, WAIT)
}

/// Every event left on `ch` within a short pause, as (id, kind).
fn drain(ch: &EventChannel<SoftDevice>) -> Vec<(u64, EventKind)> {
    drain_within(ch, Duration::from_millis(500))
}

fn param(private_data: Vec<u8>) -> ConnParam {
    ConnParam {
        private_data,
        responder_resources: 2,
        initiator_depth: 2,
        ..Default::default()
    }
}

/// Verbs on `id`: `create_qp` leaves the QP in Init, as librdmacm's `rdma_create_qp`
/// does, so receives can be posted before connect/accept (rping's order).
fn verbs_init(id: &CmIdRef<SoftDevice>) -> Verbs {
    let v = Verbs::on(id).unwrap();
    assert_eq!(v.qp.state(), QpState::Init);
    v
}

/// Client connected to the server's listener: (client id, its verbs, server id, its
/// verbs, listener); `recvs` receives posted on each side before connect/accept.
fn connected(
    h: &Hosts,
    recvs: usize,
) -> (
    CmId<SoftDevice>,
    Verbs,
    CmId<SoftDevice>,
    Verbs,
    CmId<SoftDevice>,
) {
    let listener = h.listener();
    let id = h.routed(h.server_addr());
    let mut cv = verbs_init(&id);
    cv.post_recvs(recvs).unwrap();
    id.connect(&param(Vec::new())).unwrap();
    let conn = expect(&h.sch, EventKind::ConnectRequest)
        .take_new_id()
        .unwrap();
    let mut sv = verbs_init(&conn);
    sv.post_recvs(recvs).unwrap();
    conn.accept(&param(Vec::new())).unwrap();
    expect(&h.cch, EventKind::Established).ack();
    expect(&h.sch, EventKind::Established).ack();
    (id, cv, conn, sv, listener)
}

#[test]
fn calls_without_a_device_or_in_the_wrong_state_are_typed_errors() {
    let _w = Watchdog::arm("wrong_calls", Duration::from_secs(60), String::new);
    let h = hosts(1);
    let pd = h.pair.a.alloc_pd().unwrap();
    let cq = h.pair.a.create_cq(4).unwrap();
    let attr = || softiwarp::QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: CAP,
        sq_sig_all: false,
    };
    let id = h.client.create_id_with_channel(&h.cch);
    assert!(matches!(
        id.create_qp(&pd, attr()),
        Err(CmError::NoDevice { op: "create_qp" })
    ));
    assert!(matches!(
        id.connect(&param(vec![])),
        Err(CmError::InvalidState { .. })
    ));
    assert!(matches!(
        id.accept(&param(vec![])),
        Err(CmError::InvalidState { .. })
    ));
    assert!(matches!(id.disconnect(), Err(CmError::InvalidState { .. })));
    // A wildcard-bound id has no device either.
    id.bind_addr("0.0.0.0:0".parse().unwrap()).unwrap();
    assert!(matches!(
        id.create_qp(&pd, attr()),
        Err(CmError::NoDevice { .. })
    ));
    // Not a local address.
    let other = h.client.create_id_with_channel(&h.cch);
    assert!(matches!(
        other.bind_addr(h.server_addr()),
        Err(CmError::AddressNotAvailable(_))
    ));
    // Listen twice on one port: the second bind fails; listen twice on one id fails.
    let l1 = h.listener();
    let l2 = h.server.create_id_with_channel(&h.sch);
    assert_eq!(
        l2.bind_addr(h.server_addr()),
        Err(CmError::AddressInUse(h.server_addr()))
    );
    let wild: SocketAddr = format!("0.0.0.0:{PORT}").parse().unwrap();
    assert!(
        matches!(l2.bind_addr(wild), Err(CmError::AddressInUse(_))),
        "wildcard over a bound port"
    );
    assert!(matches!(l1.listen(8), Err(CmError::InvalidState { .. })));
    // A huge backlog is accepted (capped by the device), not a panic or an allocation.
    let l3 = h.server.create_id_with_channel(&h.sch);
    l3.bind_addr(SocketAddr::new(h.server_addr().ip(), PORT + 1))
        .unwrap();
    l3.listen(u32::MAX).unwrap();
    // Private data over MPA's 512 bytes.
    let big = param(vec![0; 513]);
    assert!(matches!(
        id.connect(&big),
        Err(CmError::InvalidArgument { .. })
    ));
    assert!(matches!(
        id.reject(&[0; 513]),
        Err(CmError::InvalidArgument { .. })
    ));
    assert!(matches!(
        id.connect(&ConnParam {
            retry_count: 8,
            ..param(vec![])
        }),
        Err(CmError::InvalidArgument { .. })
    ));
    // IPv6.
    assert!(matches!(
        other.resolve_addr(None, "[::1]:1".parse().unwrap(), WAIT),
        Err(CmError::AddressFamily(_))
    ));
    for i in [id, other, l1, l2, l3] {
        i.destroy().unwrap();
    }
    assert!(h.cch.try_get_event().is_none() && h.sch.try_get_event().is_none());
    h.assert_clean();
}

#[test]
fn connecting_to_nothing_gives_one_error_event_and_flushes_the_qp() {
    let _w = Watchdog::arm("nothing", Duration::from_secs(90), String::new);
    let h = hosts(2);
    // No host at .9: ARP times out.
    let id = h.client.create_id_with_channel(&h.cch);
    let nobody = SocketAddr::new(pair_ip(73, 2, 9).into(), PORT);
    id.resolve_addr(None, nobody, Duration::from_millis(1500))
        .unwrap();
    let ev = expect(&h.cch, EventKind::AddrError);
    assert_eq!(ev.status, -110);
    ev.ack();
    // Off every subnet, no gateway.
    id.resolve_addr(None, "192.0.2.1:1".parse().unwrap(), WAIT)
        .unwrap();
    let ev = expect(&h.cch, EventKind::AddrError);
    assert_eq!(ev.status, -101, "ENETUNREACH");
    ev.ack();
    id.destroy().unwrap();
    // The host exists, nothing listens: Rejected, -ECONNREFUSED.
    let id = h.routed(h.server_addr());
    let mut v = verbs_init(&id);
    v.post_recvs(3).unwrap();
    id.connect(&param(b"anyone?".to_vec())).unwrap();
    let ev = expect(&h.cch, EventKind::Rejected);
    assert_eq!(ev.status, -111);
    ev.ack();
    assert_eq!(drain(&h.cch), []);
    id.destroy().unwrap();
    assert!(v.all_completed(WAIT), "{:?}", v.completions);
    assert_eq!(v.count(WcStatus::WrFlushErr), 3);
    h.assert_clean();
}

#[test]
fn private_data_of_509_to_512_bytes_does_not_fit_mpa_rev2() {
    let _w = Watchdog::arm("pdata", Duration::from_secs(60), String::new);
    let h = hosts(3);
    let listener = h.listener();
    let id = h.routed(h.server_addr());
    let _v = verbs_init(&id);
    // 512 bytes pass the CM's check, but MPA rev 2 carries 4 bytes of IRD/ORD in the
    // 512 (RFC 6581 section 3): the soft device allows 508.
    let r = id.connect(&param(vec![7; 510]));
    let evs = drain(&h.cch);
    eprintln!("client events: {evs:?}; server events: {:?}", drain(&h.sch));
    match r {
        Err(
            ref e @ CmError::Iw(iw_cm::CmError::Provider(ProviderError::PrivateDataTooLong {
                len: 510,
                max: 508,
            })),
        ) => {
            assert_eq!(e.errno(), 22, "EINVAL, as siw_connect returns");
            assert_eq!(evs, []);
        }
        other => panic!("connect with 510 bytes: {other:?}"),
    }
    id.destroy().unwrap();
    // Accept with 510 bytes.
    let id = h.routed(h.server_addr());
    let _v = verbs_init(&id);
    id.connect(&param(vec![1; 508])).unwrap();
    let ev = expect(&h.sch, EventKind::ConnectRequest);
    assert_eq!(ev.private_data, vec![1; 508]);
    let conn = {
        let mut ev = ev;
        ev.take_new_id().unwrap()
    };
    let _sv = verbs_init(&conn);
    let r = conn.accept(&param(vec![2; 510]));
    let (c, s) = (drain(&h.cch), drain(&h.sch));
    eprintln!("client events: {c:?}; server events: {s:?}");
    assert!(
        matches!(
            r,
            Err(CmError::Iw(iw_cm::CmError::Provider(
                ProviderError::PrivateDataTooLong { len: 510, max: 508 }
            )))
        ),
        "accept with 510 bytes: {r:?}"
    );
    for i in [id, conn, listener] {
        i.destroy().unwrap();
    }
    h.assert_clean();
}

#[test]
fn destroy_return_from_device_removal_destroys_the_id_and_releases_the_device() {
    let _w = Watchdog::arm("removal_return", Duration::from_secs(60), String::new);
    let h = hosts(4);
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let id = h
        .client
        .create_id(move |_: &CmIdRef<SoftDevice>, ev: CmEvent<SoftDevice>| {
            tx.lock().unwrap().send(ev.kind).unwrap();
            if ev.kind == EventKind::DeviceRemoval {
                Disposition::Destroy
            } else {
                Disposition::Keep
            }
        });
    id.resolve_addr(None, h.server_addr(), WAIT).unwrap();
    assert_eq!(rx.recv_timeout(WAIT).unwrap(), EventKind::AddrResolved);
    let _v = Verbs::on(&id).unwrap();
    let removal = h.client.remove_device(&h.client_dev()).unwrap();
    assert_eq!(rx.recv_timeout(WAIT).unwrap(), EventKind::DeviceRemoval);
    removal.wait_timeout(WAIT).unwrap();
    // The user's handle keeps the id's memory (ids_alive) but the id is destroyed:
    // calls fail, destroying it again is a no-op, and no more callbacks.
    assert!(matches!(
        id.resolve_route(WAIT),
        Err(CmError::InvalidState { .. })
    ));
    id.destroy().unwrap();
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    let s = h.client.stats();
    assert_eq!(
        (s.device_removals, s.devices_held, s.callbacks),
        (1, 0, 2),
        "{s:?}"
    );
    h.assert_clean();
}

#[test]
fn self_destroy_and_unacked_destroy_are_refused_on_soft_devices() {
    let _w = Watchdog::arm("self_destroy", Duration::from_secs(60), String::new);
    let h = hosts(5);
    let slot: Arc<Mutex<Option<CmId<SoftDevice>>>> = Arc::default();
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let s2 = slot.clone();
    let id = h
        .client
        .create_id(move |_: &CmIdRef<SoftDevice>, ev: CmEvent<SoftDevice>| {
            let own = s2.lock().unwrap().take().unwrap();
            let r = own.destroy().map_err(|refused| {
                let e = refused.error.clone();
                *s2.lock().unwrap() = Some(refused.id);
                e
            });
            tx.lock().unwrap().send((ev.kind, r)).unwrap();
            Disposition::Keep
        });
    let dst = h.server_addr();
    *slot.lock().unwrap() = Some(id);
    slot.lock()
        .unwrap()
        .as_ref()
        .unwrap()
        .resolve_addr(None, dst, WAIT)
        .unwrap();
    let (kind, r) = rx.recv_timeout(WAIT).unwrap();
    assert_eq!(kind, EventKind::AddrResolved);
    assert!(
        matches!(r, Err(CmError::DestroyInOwnCallback { .. })),
        "{r:?}"
    );
    slot.lock().unwrap().take().unwrap().destroy().unwrap();
    // Channel mode: an un-acked event held by this thread.
    let id = h.client.create_id_with_channel(&h.cch);
    id.resolve_addr(None, dst, WAIT).unwrap();
    let ev = expect(&h.cch, EventKind::AddrResolved);
    let refused = id.destroy().unwrap_err();
    assert!(
        matches!(refused.error, CmError::UnackedEvents { count: 1, .. }),
        "{refused:?}"
    );
    ev.ack();
    refused.id.destroy().unwrap();
    h.assert_clean();
}

#[test]
fn removal_during_address_resolution_gives_exactly_one_event() {
    let _w = Watchdog::arm("removal_resolve", Duration::from_secs(60), String::new);
    let h = hosts(6);
    let id = h.client.create_id_with_channel(&h.cch);
    let nobody = SocketAddr::new(pair_ip(73, 6, 9).into(), PORT);
    id.resolve_addr(None, nobody, Duration::from_secs(5))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let removal = h.client.remove_device(&h.client_dev()).unwrap();
    // The id is not bound to the device before its address resolved (cma.c binds in
    // addr_handler): the removal does not touch it; the resolution ends with one
    // AddrError (the device's ARP keeps running until the timeout).
    let ev = h
        .cch
        .get_event_timeout(Duration::from_secs(8))
        .expect("AddrError");
    assert_eq!(ev.kind, EventKind::AddrError, "status {}", ev.status);
    eprintln!("AddrError status {}", ev.status);
    ev.ack();
    assert_eq!(drain(&h.cch), []);
    removal.wait_timeout(WAIT).unwrap();
    id.destroy().unwrap();
    h.assert_clean();
}

#[test]
fn removal_before_the_mpa_reply_flushes_and_delivers_one_device_removal() {
    let _w = Watchdog::arm("removal_connect", Duration::from_secs(90), String::new);
    let h = hosts(7);
    let listener = h.listener();
    let id = h.routed(h.server_addr());
    let mut v = verbs_init(&id);
    v.post_recvs(4).unwrap();
    id.connect(&param(vec![])).unwrap();
    // The server holds the request: no MPA Reply yet.
    let conn = expect(&h.sch, EventKind::ConnectRequest)
        .take_new_id()
        .unwrap();
    let removal = h.client.remove_device(&h.client_dev()).unwrap();
    let evs = drain(&h.cch);
    eprintln!("client events: {evs:?}");
    let removals = evs
        .iter()
        .filter(|e| e.1 == EventKind::DeviceRemoval)
        .count();
    assert_eq!(removals, 1, "{evs:?}");
    assert_eq!(
        evs.last().unwrap().1,
        EventKind::DeviceRemoval,
        "nothing after DeviceRemoval"
    );
    assert!(v.all_completed(WAIT), "{:?}", v.completions);
    assert_eq!(v.count(WcStatus::WrFlushErr), 4);
    id.destroy().unwrap();
    removal.wait_timeout(WAIT).unwrap();
    // The server may still accept (the peer is gone) or not: no hang, one outcome.
    let mut sv = verbs_init(&conn);
    sv.post_recvs(2).unwrap();
    let r = conn.accept(&param(vec![]));
    let s = drain(&h.sch);
    eprintln!("server accept after the client's removal: {r:?}, events {s:?}");
    assert!(s.len() <= 2, "{s:?}");
    for i in [conn, listener] {
        i.destroy().unwrap();
    }
    assert!(sv.all_completed(WAIT), "{:?}", sv.completions);
    h.assert_clean();
}

#[test]
fn removal_racing_accept_disconnect_and_destroy() {
    let _w = Watchdog::arm("removal_races", Duration::from_secs(180), String::new);
    for round in 0..6u8 {
        let h = hosts(20 + round);
        let listener = h.listener();
        let id = h.routed(h.server_addr());
        let mut cv = verbs_init(&id);
        cv.post_recvs(3).unwrap();
        id.connect(&param(vec![])).unwrap();
        let conn = expect(&h.sch, EventKind::ConnectRequest)
            .take_new_id()
            .unwrap();
        let mut sv = verbs_init(&conn);
        sv.post_recvs(3).unwrap();
        let delay = Duration::from_micros(u64::from(round) * 300);
        let (server, name) = (&h.server, h.server_dev());
        let (r, removal) = std::thread::scope(|s| {
            let t = s.spawn(move || {
                std::thread::sleep(delay);
                server.remove_device(&name).unwrap()
            });
            let r = if round % 2 == 0 {
                conn.accept(&param(vec![]))
            } else {
                conn.accept(&param(vec![])).and_then(|()| {
                    std::thread::sleep(Duration::from_millis(20));
                    conn.disconnect()
                })
            };
            (r, t.join().unwrap())
        });
        let (c, s) = (drain(&h.cch), drain(&h.sch));
        eprintln!("round {round}: accept/disconnect {r:?}; client {c:?}; server {s:?}");
        let of = |evs: &[(u64, EventKind)], serial: u64, k: EventKind| {
            evs.iter().filter(|e| e.0 == serial && e.1 == k).count()
        };
        // The listener bound to the device's address and the new id: one each.
        assert_eq!(of(&s, conn.serial(), EventKind::DeviceRemoval), 1, "{s:?}");
        assert_eq!(
            of(&s, listener.serial(), EventKind::DeviceRemoval),
            1,
            "{s:?}"
        );
        assert_eq!(
            s.iter().rfind(|e| e.0 == conn.serial()).unwrap().1,
            EventKind::DeviceRemoval
        );
        assert!(of(&c, id.serial(), EventKind::Established) <= 1, "{c:?}");
        assert!(of(&c, id.serial(), EventKind::Disconnected) <= 1, "{c:?}");
        for i in [id, conn, listener] {
            i.destroy().unwrap();
        }
        removal.wait_timeout(WAIT).unwrap();
        assert!(cv.all_completed(WAIT), "client {:?}", cv.completions);
        assert!(sv.all_completed(WAIT), "server {:?}", sv.completions);
        assert_eq!(sv.count(WcStatus::WrFlushErr), 3);
        h.assert_clean();
    }
}

#[test]
fn removal_while_destroy_waits_for_a_callback_delivers_nothing() {
    let _w = Watchdog::arm(
        "removal_vs_blocked_destroy",
        Duration::from_secs(60),
        String::new,
    );
    let h = hosts(8);
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let (seen_tx, seen) = mpsc::channel();
    let (entered_tx, release_rx, seen_tx) = (
        Mutex::new(entered_tx),
        Mutex::new(release_rx),
        Mutex::new(seen_tx),
    );
    let id = h
        .client
        .create_id(move |_: &CmIdRef<SoftDevice>, ev: CmEvent<SoftDevice>| {
            seen_tx.lock().unwrap().send(ev.kind).unwrap();
            if ev.kind == EventKind::AddrResolved {
                entered_tx.lock().unwrap().send(()).unwrap();
                release_rx.lock().unwrap().recv_timeout(WAIT).unwrap();
            }
            Disposition::Keep
        });
    id.resolve_addr(None, h.server_addr(), WAIT).unwrap();
    entered.recv_timeout(WAIT).unwrap();
    let removal = std::thread::scope(|s| {
        let d = s.spawn(|| id.destroy().unwrap());
        std::thread::sleep(Duration::from_millis(100));
        let name = h.client_dev();
        let client = &h.client;
        let r = s.spawn(move || client.remove_device(&name).unwrap());
        std::thread::sleep(Duration::from_millis(100));
        assert!(!d.is_finished(), "destroy must wait for the callback");
        release.send(()).unwrap();
        d.join().unwrap();
        r.join().unwrap()
    });
    removal.wait_timeout(WAIT).unwrap();
    assert_eq!(
        seen.try_iter().collect::<Vec<_>>(),
        [EventKind::AddrResolved]
    );
    let s = h.client.stats();
    assert_eq!((s.device_removals, s.devices_held), (0, 0), "{s:?}");
    h.assert_clean();
}

#[test]
fn destroying_connected_ids_flushes_every_posted_wr() {
    let _w = Watchdog::arm("destroy_flush", Duration::from_secs(60), String::new);
    let h = hosts(9);
    let (id, mut cv, conn, mut sv, listener) = connected(&h, 5);
    // Sends the peer has no receive for beyond its 5, and more receives.
    for _ in 0..3 {
        let wr = verbs::SendWr::send(1, vec![]).with_flags(verbs::SendFlags::SIGNALED);
        cv.qp.post_send(wr).unwrap();
        cv.posted += 1;
    }
    sv.post_recvs(4).unwrap();
    // No disconnect: destroy with everything outstanding.
    id.destroy().unwrap();
    assert!(cv.all_completed(WAIT), "client {:?}", cv.completions);
    let evs = drain(&h.sch);
    assert!(evs.len() <= 1, "{evs:?}");
    conn.destroy().unwrap();
    listener.destroy().unwrap();
    assert!(sv.all_completed(WAIT), "server {:?}", sv.completions);
    eprintln!(
        "client {:?}",
        cv.completions.iter().map(|w| w.status).collect::<Vec<_>>()
    );
    h.assert_clean();
}

#[test]
fn a_thousand_ids() {
    let _w = Watchdog::arm("many_ids", Duration::from_secs(120), String::new);
    let h = hosts(10);
    let ids: Vec<_> = (0..1000)
        .map(|_| h.client.create_id_with_channel(&h.cch))
        .collect();
    for id in &ids {
        id.resolve_addr(None, h.server_addr(), WAIT).unwrap();
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..1000 {
        let ev = expect(&h.cch, EventKind::AddrResolved);
        assert!(
            seen.insert(ev.id().serial()),
            "twice for #{}",
            ev.id().serial()
        );
    }
    assert_eq!(h.client.stats().ids_alive, 1000);
    let removal = h.client.remove_device(&h.client_dev()).unwrap();
    let mut removed = std::collections::HashSet::new();
    for _ in 0..1000 {
        let ev = expect(&h.cch, EventKind::DeviceRemoval);
        assert!(removed.insert(ev.id().serial()));
    }
    assert_eq!(drain(&h.cch), []);
    assert_eq!(removal.ids_bound(), 1000);
    for id in ids {
        id.destroy().unwrap();
    }
    removal.wait_timeout(WAIT).unwrap();
    h.assert_clean();
}
