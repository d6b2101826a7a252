//! API tests over the fake network: address and route resolution, connect / accept /
//! reject / disconnect in both usage styles, wildcard listen across devices, device
//! removal, and the two destroy mistakes that librdmacm hangs on.
#![cfg(not(loom))]

mod support;

use rdma_cm::{
    CmError, CmEvent, CmId, CmIdRef, ConnParam, Disposition, EventChannel, EventKind, IdState,
    RdmaCm, RdmaCmConfig, ResolveError,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;

const T: Duration = Duration::from_secs(5);

type Ev = (u64, EventKind, i32);

fn cm() -> RdmaCm<FakeDevice> {
    RdmaCm::new(RdmaCmConfig::default()).unwrap()
}

fn next(rx: &mpsc::Receiver<Ev>) -> Ev {
    rx.recv_timeout(T).expect("no event within 5 s")
}

fn next_kind(rx: &mpsc::Receiver<Ev>) -> EventKind {
    next(rx).1
}

fn quiet(rx: &mpsc::Receiver<Ev>) {
    if let Ok(e) = rx.recv_timeout(Duration::from_millis(50)) {
        panic!("unexpected event {e:?}");
    }
}

/// A server on `dev` listening on `addr` that accepts every request (with a QP) and
/// keeps the new ids; events of the listener and its new ids go to the returned channel.
struct Server {
    listener: CmId<FakeDevice>,
    children: Arc<Mutex<Vec<CmId<FakeDevice>>>>,
    rx: mpsc::Receiver<Ev>,
}

fn server(cm: &RdmaCm<FakeDevice>, bind: &str, accept: bool) -> Server {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let children: Arc<Mutex<Vec<CmId<FakeDevice>>>> = Arc::default();
    let kids = children.clone();
    let listener = cm.create_id(
        move |id: &CmIdRef<FakeDevice>, mut ev: CmEvent<FakeDevice>| {
            let _ = tx.lock().unwrap().send((id.serial(), ev.kind, ev.status));
            if ev.kind == EventKind::ConnectRequest {
                let child = ev.take_new_id().unwrap();
                assert_eq!(child.serial(), id.serial());
                if accept {
                    child.create_qp(&(), ()).unwrap();
                    child
                        .accept(&ConnParam::new(4, 4).with_private_data(b"welcome".to_vec()))
                        .unwrap();
                } else {
                    child.reject(b"go away").unwrap();
                }
                kids.lock().unwrap().push(child);
            }
            Disposition::Keep
        },
    );
    listener.bind_addr(addr(bind)).unwrap();
    listener.listen(8).unwrap();
    Server {
        listener,
        children,
        rx,
    }
}

/// A client id with a recording callback.
fn client(cm: &RdmaCm<FakeDevice>) -> (CmId<FakeDevice>, mpsc::Receiver<Ev>) {
    let (tx, rx) = mpsc::channel();
    (cm.create_id(recording_handler(tx)), rx)
}

/// resolve_addr + resolve_route + create_qp + connect.
fn connect(id: &CmId<FakeDevice>, rx: &mpsc::Receiver<Ev>, dst: &str, pd: &[u8]) {
    connect_from(id, rx, None, dst, pd)
}

fn connect_from(
    id: &CmId<FakeDevice>,
    rx: &mpsc::Receiver<Ev>,
    src: Option<&str>,
    dst: &str,
    pd: &[u8],
) {
    resolve_from(id, rx, src, dst);
    id.create_qp(&(), ()).unwrap();
    id.connect(
        &ConnParam::new(2, 3)
            .with_private_data(pd.to_vec())
            .with_retry_count(7),
    )
    .unwrap();
}

/// A listener on `bind` whose events (and its new ids') go to the returned channel.
fn channel_listener(
    cm: &RdmaCm<FakeDevice>,
    bind: &str,
    backlog: u32,
) -> (EventChannel<FakeDevice>, CmId<FakeDevice>) {
    let ch = cm.create_event_channel();
    let l = cm.create_id_with_channel(&ch);
    l.bind_addr(addr(bind)).unwrap();
    l.listen(backlog).unwrap();
    (ch, l)
}

/// resolve_addr + resolve_route, each event awaited.
fn resolve_from(id: &CmId<FakeDevice>, rx: &mpsc::Receiver<Ev>, src: Option<&str>, dst: &str) {
    id.resolve_addr(src.map(addr), addr(dst), T).unwrap();
    assert_eq!(next_kind(rx), EventKind::AddrResolved);
    id.resolve_route(T).unwrap();
    assert_eq!(next_kind(rx), EventKind::RouteResolved);
}

struct World {
    net: FakeNet,
    cm: RdmaCm<FakeDevice>,
    a: Arc<FakeDevice>,
    b: Arc<FakeDevice>,
}

/// Device a: 10.0.0.1/16; device b: 10.0.1.1/24 (inside a's subnet: b wins by the
/// longer prefix for 10.0.1.x, a is reached from b's subnet with source 10.0.0.1).
fn world() -> World {
    let net = FakeNet::new(testkit::Rng::delays(1), 200);
    let cm = cm();
    let a = FakeDevice::new(&net, "a", &[(ip("10.0.0.1"), 16)]);
    let b = FakeDevice::new(&net, "b", &[(ip("10.0.1.1"), 24)]);
    cm.add_device(a.clone()).unwrap();
    cm.add_device(b.clone()).unwrap();
    World { net, cm, a, b }
}

fn finish(w: World) {
    for d in w.cm.devices() {
        let r = w.cm.remove_device(&d).unwrap();
        if let Err(e) = r.wait_timeout(T) {
            panic!("{d}: {e}\n{}", dump(&w.cm, &w.net));
        }
    }
    assert_clean(&w.cm, &w.net);
    assert!(w.a.released.load(SeqCst) && w.b.released.load(SeqCst));
}

#[test]
fn resolve_addr_binds_the_id_to_the_routed_device() {
    let w = world();
    let (id, rx) = client(&w.cm);
    assert_eq!(id.state(), IdState::Idle);
    id.resolve_addr(None, addr("10.0.1.7:5000"), T).unwrap();
    assert_eq!(next(&rx), (id.serial(), EventKind::AddrResolved, 0));
    assert_eq!(id.state(), IdState::AddrResolved);
    assert_eq!(id.device_name().as_deref(), Some("b"));
    assert_eq!(id.local_addr(), Some(addr("10.0.1.1:0")));
    assert_eq!(id.peer_addr(), Some(addr("10.0.1.7:5000")));
    assert_eq!(id.next_hop(), Some(ip("10.0.1.7")));
    let req = w.b.neighbor_requests.lock().unwrap()[0];
    assert_eq!((req.src, req.next_hop), (ip("10.0.1.1"), ip("10.0.1.7")));
    id.resolve_route(T).unwrap();
    assert_eq!(next_kind(&rx), EventKind::RouteResolved);
    assert_eq!(id.state(), IdState::RouteResolved);
    // A second resolve is refused by state.
    assert!(matches!(
        id.resolve_addr(None, addr("10.0.1.7:5000"), T),
        Err(CmError::InvalidState { .. })
    ));
    id.destroy().unwrap();
    finish(w);
}

#[test]
fn resolve_addr_errors_are_addr_error_events() {
    let w = world();
    // No device reaches it.
    let (id, rx) = client(&w.cm);
    id.resolve_addr(None, addr("172.16.0.1:1"), T).unwrap();
    assert_eq!(next(&rx), (id.serial(), EventKind::AddrError, -101));
    drop(id);
    // The device fails it.
    *w.a.neighbor.lock().unwrap() = Neighbor::Fail(ResolveError::HostUnreachable);
    let (id, rx) = client(&w.cm);
    id.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
    assert_eq!(next(&rx), (id.serial(), EventKind::AddrError, -113));
    assert_eq!(id.state(), IdState::AddrBound);
    assert_eq!(id.device_name(), None);
    // Retry from ADDR_BOUND after the device recovers, from another thread.
    *w.a.neighbor.lock().unwrap() = Neighbor::Thread(Duration::from_millis(5));
    id.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
    assert_eq!(next(&rx), (id.serial(), EventKind::AddrResolved, 0));
    drop(id);
    // The device never answers: the CM's timeout fires.
    *w.a.neighbor.lock().unwrap() = Neighbor::Never;
    let (id, rx) = client(&w.cm);
    let t0 = Instant::now();
    id.resolve_addr(None, addr("10.0.0.9:1"), Duration::from_millis(30))
        .unwrap();
    assert_eq!(next(&rx), (id.serial(), EventKind::AddrError, -110));
    assert!(t0.elapsed() >= Duration::from_millis(30));
    // ...and its late completion is ignored.
    let parked: Vec<_> = std::mem::take(&mut *w.a.parked.lock().unwrap());
    for d in parked {
        d.complete(Ok(None));
    }
    quiet(&rx);
    drop(id);
    // The device drops the completion.
    *w.a.neighbor.lock().unwrap() = Neighbor::Drop;
    let (id, rx) = client(&w.cm);
    id.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
    assert_eq!(next(&rx), (id.serial(), EventKind::AddrError, -5));
    drop(id);
    assert_eq!(w.cm.stats().timers_pending, 0);
    finish(w);
}

#[test]
fn resolve_addr_argument_errors_are_synchronous() {
    let w = world();
    let (id, _rx) = client(&w.cm);
    assert_eq!(
        id.resolve_addr(Some(addr("10.9.9.9:0")), addr("10.0.0.9:1"), T),
        Err(CmError::AddressNotAvailable(ip("10.9.9.9").into()))
    );
    assert_eq!(id.state(), IdState::Idle);
    assert!(matches!(
        id.resolve_addr(None, addr("[::1]:1"), T),
        Err(CmError::AddressFamily(_))
    ));
    assert!(matches!(
        id.resolve_addr(None, addr("255.255.255.255:1"), T),
        Err(CmError::InvalidArgument { .. })
    ));
    // A source on device b routes through b even toward a's subnet.
    let (id2, rx2) = client(&w.cm);
    id2.resolve_addr(Some(addr("10.0.1.1:0")), addr("10.0.1.50:1"), T)
        .unwrap();
    assert_eq!(next_kind(&rx2), EventKind::AddrResolved);
    assert_eq!(id2.device_name().as_deref(), Some("b"));
    drop((id, id2));
    finish(w);
}

#[test]
fn bind_addr_rules() {
    let w = world();
    let (x, _) = client(&w.cm);
    let (y, _) = client(&w.cm);
    let (z, _) = client(&w.cm);
    x.bind_addr(addr("10.0.0.1:7000")).unwrap();
    assert_eq!(x.state(), IdState::AddrBound);
    assert_eq!(x.device_name().as_deref(), Some("a"));
    assert_eq!(
        y.bind_addr(addr("10.0.0.1:7000")),
        Err(CmError::AddressInUse(addr("10.0.0.1:7000")))
    );
    // The wildcard conflicts with any address on the same port.
    assert_eq!(
        y.bind_addr(addr("0.0.0.0:7000")),
        Err(CmError::AddressInUse(addr("0.0.0.0:7000")))
    );
    y.bind_addr(addr("10.0.1.1:7000")).unwrap();
    assert_eq!(
        z.bind_addr(addr("10.7.7.7:1")),
        Err(CmError::AddressNotAvailable(ip("10.7.7.7").into()))
    );
    z.bind_addr(addr("0.0.0.0:0")).unwrap();
    let port = z.local_addr().unwrap().port();
    assert!(port >= 49152, "ephemeral port {port}");
    assert_eq!(z.device_name(), None);
    assert!(matches!(
        z.bind_addr(addr("0.0.0.0:0")),
        Err(CmError::InvalidState { .. })
    ));
    // Destroying frees the port.
    x.destroy().unwrap();
    let (x2, _) = client(&w.cm);
    x2.bind_addr(addr("10.0.0.1:7000")).unwrap();
    drop((x2, y, z));
    finish(w);
}

#[test]
fn connect_accept_disconnect_in_callback_mode() {
    let w = world();
    let srv = server(&w.cm, "10.0.1.1:7471", true);
    let (id, rx) = client(&w.cm);
    connect(&id, &rx, "10.0.1.1:7471", b"hello");
    let (child, kind, _) = next(&srv.rx);
    assert_eq!(kind, EventKind::ConnectRequest);
    let (s, kind, status) = next(&rx);
    assert_eq!((s, kind, status), (id.serial(), EventKind::Established, 0));
    assert_eq!(next(&srv.rx), (child, EventKind::Established, 0));
    assert_eq!(id.state(), IdState::Established);
    {
        let kids = srv.children.lock().unwrap();
        assert_eq!(kids[0].state(), IdState::Established);
        assert_eq!(kids[0].device_name().as_deref(), Some("b"));
        assert_eq!(kids[0].local_addr(), Some(addr("10.0.1.1:7471")));
        assert_eq!(kids[0].peer_addr(), Some(addr("10.0.1.1:0")));
    }
    id.disconnect().unwrap();
    assert_eq!(next_kind(&rx), EventKind::Disconnected);
    assert_eq!(next(&srv.rx), (child, EventKind::Disconnected, 0));
    assert_eq!(id.state(), IdState::Disconnect);
    id.destroy().unwrap();
    srv.children.lock().unwrap().clear();
    srv.listener.destroy().unwrap();
    finish(w);
}

#[test]
fn connect_request_carries_private_data_and_ird_ord() {
    let w = world();
    let (ch, listener) = channel_listener(&w.cm, "10.0.0.1:9000", 0);
    let (id, rx) = client(&w.cm);
    connect(&id, &rx, "10.0.0.1:9000", b"pd-123");
    let mut ev = ch.get_event_timeout(T).unwrap();
    assert_eq!(ev.kind, EventKind::ConnectRequest);
    assert_eq!(ev.private_data, b"pd-123");
    // The fake provider reports the initiator's IRD 16 / ORD 8.
    assert_eq!((ev.initiator_depth, ev.responder_resources), (16, 8));
    assert_eq!(ev.listen_id(), Some(listener.serial()));
    assert_eq!(ev.listener().unwrap().serial(), listener.serial());
    let child = ev.take_new_id().unwrap();
    assert_eq!(ev.id().serial(), child.serial());
    ev.ack();
    child.create_qp(&(), ()).unwrap();
    child.accept(&ConnParam::default()).unwrap();
    let est = ch.get_event_timeout(T).unwrap();
    assert_eq!(
        (est.kind, est.id().serial()),
        (EventKind::Established, child.serial())
    );
    drop(est);
    assert_eq!(next_kind(&rx), EventKind::Established);
    // Destroying the child aborts the connection: the client hears Disconnected.
    child.destroy().unwrap();
    assert_eq!(next_kind(&rx), EventKind::Disconnected);
    drop((id, listener));
    finish(w);
}

#[test]
fn reject_is_rejected_with_private_data() {
    let w = world();
    let srv = server(&w.cm, "10.0.0.1:7000", false);
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let id =
        w.cm.create_id(move |_: &CmIdRef<FakeDevice>, ev: CmEvent<FakeDevice>| {
            let _ = tx
                .lock()
                .unwrap()
                .send((ev.kind, ev.status, ev.private_data.clone()));
            Disposition::Keep
        });
    id.resolve_addr(None, addr("10.0.0.1:7000"), T).unwrap();
    assert_eq!(rx.recv_timeout(T).unwrap().0, EventKind::AddrResolved);
    id.resolve_route(T).unwrap();
    assert_eq!(rx.recv_timeout(T).unwrap().0, EventKind::RouteResolved);
    id.create_qp(&(), ()).unwrap();
    id.connect(&ConnParam::default()).unwrap();
    assert_eq!(
        rx.recv_timeout(T).unwrap(),
        (EventKind::Rejected, -111, b"go away".to_vec())
    );
    assert_eq!(id.state(), IdState::Disconnect);
    assert_eq!(srv.children.lock().unwrap()[0].state(), IdState::Disconnect);
    drop(id);
    // The new ids share the listener's callback, which owns them: break the cycle.
    srv.children.lock().unwrap().clear();
    drop(srv);
    finish(w);
}

#[test]
fn connect_without_listener_is_rejected_and_param_checks() {
    let w = world();
    let (id, rx) = client(&w.cm);
    id.resolve_addr(None, addr("10.0.0.1:1234"), T).unwrap();
    assert_eq!(next_kind(&rx), EventKind::AddrResolved);
    assert!(matches!(
        id.connect(&ConnParam::default()),
        Err(CmError::InvalidState { .. })
    ));
    id.resolve_route(T).unwrap();
    assert_eq!(next_kind(&rx), EventKind::RouteResolved);
    assert_eq!(
        id.connect(&ConnParam::default()),
        Err(CmError::NoQp { op: "connect" })
    );
    id.create_qp(&(), ()).unwrap();
    assert_eq!(id.create_qp(&(), ()).err(), Some(CmError::QpExists));
    assert!(matches!(
        id.connect(&ConnParam {
            retry_count: 8,
            ..ConnParam::default()
        }),
        Err(CmError::InvalidArgument { .. })
    ));
    assert!(matches!(
        id.connect(&ConnParam {
            private_data: vec![0; 513],
            ..ConnParam::default()
        }),
        Err(CmError::InvalidArgument { .. })
    ));
    id.connect(&ConnParam::default()).unwrap();
    // TCP refused: ECONNREFUSED -> REJECTED (cma_iw_handler).
    assert_eq!(next(&rx), (id.serial(), EventKind::Rejected, -111));
    id.destroy().unwrap();
    finish(w);
}

#[test]
fn destroy_from_inside_its_own_callback_is_a_typed_error() {
    let w = world();
    let slot: Arc<Mutex<Option<CmId<FakeDevice>>>> = Arc::default();
    let results: Arc<Mutex<Vec<String>>> = Arc::default();
    let (s2, r2) = (slot.clone(), results.clone());
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let id =
        w.cm.create_id(move |me: &CmIdRef<FakeDevice>, ev: CmEvent<FakeDevice>| {
            if let Some(mine) = s2.lock().unwrap().take() {
                match mine.destroy() {
                    Ok(()) => r2.lock().unwrap().push("destroyed".into()),
                    Err(refused) => {
                        assert_eq!(
                            refused.error,
                            CmError::DestroyInOwnCallback { id: me.serial() }
                        );
                        assert_eq!(refused.error.errno(), 35);
                        r2.lock().unwrap().push(refused.to_string());
                        // The id is alive and given back.
                        assert_eq!(refused.id.state(), IdState::AddrResolved);
                        // Dropping it here takes the destroy-by-return path.
                        drop(refused.id);
                    }
                }
            }
            let _ = tx.lock().unwrap().send(ev.kind);
            // ...the right way: destroy by return.
            Disposition::Destroy
        });
    let serial = id.serial();
    let r = id.as_ref();
    *slot.lock().unwrap() = Some(id);
    r.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
    assert_eq!(rx.recv_timeout(T).unwrap(), EventKind::AddrResolved);
    drop(r);
    let res = results.lock().unwrap().clone();
    assert_eq!(res.len(), 1);
    assert!(res[0].contains("own callback"), "{res:?}");
    assert!(
        eventually(T, || w.cm.stats().ids_alive == 0),
        "id #{serial} not freed\n{}",
        dump(&w.cm, &w.net)
    );
    finish(w);
}

#[test]
fn dropping_the_id_inside_its_callback_destroys_it_on_return() {
    let w = world();
    let slot: Arc<Mutex<Option<CmId<FakeDevice>>>> = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let (s2, c2) = (slot.clone(), calls.clone());
    let id =
        w.cm.create_id(move |_: &CmIdRef<FakeDevice>, _: CmEvent<FakeDevice>| {
            c2.fetch_add(1, SeqCst);
            drop(s2.lock().unwrap().take());
            Disposition::Keep
        });
    let r = id.as_ref();
    *slot.lock().unwrap() = Some(id);
    r.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
    drop(r);
    assert!(eventually(T, || w.cm.stats().ids_alive == 0));
    assert_eq!(calls.load(SeqCst), 1);
    finish(w);
}

#[test]
fn destroy_with_an_unacked_event_on_this_thread_is_a_typed_error() {
    let w = world();
    let ch = w.cm.create_event_channel();
    let id = w.cm.create_id_with_channel(&ch);
    id.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
    let ev = ch.get_event_timeout(T).unwrap();
    assert_eq!(ev.kind, EventKind::AddrResolved);
    assert_eq!(w.cm.stats().events_unacked, 1);
    let refused = id.destroy().unwrap_err();
    assert_eq!(
        refused.error,
        CmError::UnackedEvents {
            id: refused.id.serial(),
            count: 1
        }
    );
    let id = refused.id;
    assert_eq!(id.state(), IdState::AddrResolved);
    ev.ack();
    id.resolve_route(T).unwrap();
    // Taken and held by another thread instead: destroy waits for that thread's ack.
    let acked = Arc::new(AtomicBool::new(false));
    let (a2, ch2) = (acked.clone(), ch.clone());
    let (took_tx, took_rx) = mpsc::channel();
    let holder = std::thread::spawn(move || {
        let ev = ch2.get_event_timeout(T).unwrap();
        assert_eq!(ev.kind, EventKind::RouteResolved);
        took_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        a2.store(true, SeqCst);
        ev.ack();
    });
    took_rx.recv_timeout(T).unwrap();
    id.destroy().unwrap();
    assert!(acked.load(SeqCst), "destroy returned before the ack");
    holder.join().unwrap();
    assert_eq!(w.cm.stats().events_unacked, 0);
    finish(w);
}

#[test]
fn destroy_waits_for_a_callback_in_progress() {
    let w = world();
    let inside = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let (i2, f2) = (inside.clone(), finished.clone());
    let id =
        w.cm.create_id(move |_: &CmIdRef<FakeDevice>, _: CmEvent<FakeDevice>| {
            i2.store(true, SeqCst);
            std::thread::sleep(Duration::from_millis(100));
            f2.store(true, SeqCst);
            Disposition::Keep
        });
    id.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
    assert!(eventually(T, || inside.load(SeqCst)));
    id.destroy().unwrap();
    assert!(
        finished.load(SeqCst),
        "destroy returned while the callback ran"
    );
    finish(w);
}

#[test]
fn events_of_a_destroyed_channel_id_are_discarded() {
    let w = world();
    let ch = w.cm.create_event_channel();
    let id = w.cm.create_id_with_channel(&ch);
    id.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
    assert!(eventually(T, || ch.queued() == 1));
    id.destroy().unwrap();
    assert_eq!(ch.queued(), 0);
    assert!(ch.try_get_event().is_none());
    finish(w);
}

#[test]
fn wildcard_listen_spans_devices_added_before_and_after() {
    let w = world();
    let srv = server(&w.cm, "0.0.0.0:7000", true);
    assert_eq!(w.cm.stats().internal_listeners, 2);
    assert_eq!(w.net.listeners(), 2);
    let c = FakeDevice::new(&w.net, "c", &[(ip("10.0.2.1"), 24)]);
    w.cm.add_device(c.clone()).unwrap();
    assert_eq!(w.cm.stats().internal_listeners, 3);
    let mut ids = Vec::new();
    for dst in ["10.0.0.1:7000", "10.0.1.1:7000", "10.0.2.1:7000"] {
        let (id, rx) = client(&w.cm);
        connect(&id, &rx, dst, b"");
        assert_eq!(next_kind(&rx), EventKind::Established);
        ids.push((id, rx));
    }
    let devs: Vec<_> = srv
        .children
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.device_name().unwrap())
        .collect();
    assert_eq!(devs.len(), 3);
    for d in ["a", "b", "c"] {
        assert!(devs.contains(&d.to_string()), "{devs:?}");
    }
    // Remove device a: its connections (server side and client side) get exactly one
    // DeviceRemoval; the listener gets nothing and keeps listening on b and c.
    let removal = w.cm.remove_device("a").unwrap();
    assert_eq!(w.cm.stats().internal_listeners, 2);
    assert_eq!(w.cm.devices(), vec!["b", "c"]);
    let mut seen = Vec::new();
    while let Ok(e) = srv.rx.recv_timeout(Duration::from_millis(100)) {
        seen.push(e);
    }
    let removals: Vec<_> = seen
        .iter()
        .filter(|e| e.1 == EventKind::DeviceRemoval)
        .collect();
    assert_eq!(removals.len(), 1, "{seen:?}");
    assert_ne!(removals[0].0, srv.listener.serial());
    assert_eq!(srv.listener.state(), IdState::Listen);
    assert_eq!(next_kind(&ids[0].1), EventKind::DeviceRemoval);
    assert!(w.a.qps_errored.load(SeqCst) >= 2);
    assert!(!removal.is_released());
    // Still listening on b.
    let (id, rx) = client(&w.cm);
    connect(&id, &rx, "10.0.1.1:7000", b"");
    assert_eq!(next_kind(&rx), EventKind::Established);
    drop(id);
    // a is released once its ids are gone.
    srv.children
        .lock()
        .unwrap()
        .retain(|c| c.device_name().as_deref() != Some("a"));
    drop(ids.remove(0));
    removal.wait_timeout(T).unwrap();
    assert!(w.a.released.load(SeqCst));
    assert_eq!(w.cm.stats().devices_held, 2);
    drop(ids);
    srv.children.lock().unwrap().clear();
    drop(srv);
    for d in w.cm.devices() {
        w.cm.remove_device(&d).unwrap().wait_timeout(T).unwrap();
    }
    assert_clean(&w.cm, &w.net);
}

#[test]
fn removal_delivers_one_device_removal_and_releases_after_destroy() {
    let w = world();
    let (x, rx) = client(&w.cm);
    x.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
    assert_eq!(next_kind(&rx), EventKind::AddrResolved);
    let qp = x.create_qp(&(), ()).unwrap();
    // A listener bound to the device's address gets DeviceRemoval too.
    let (l, lrx) = client(&w.cm);
    l.bind_addr(addr("10.0.0.1:7777")).unwrap();
    l.listen(1).unwrap();
    // An id that destroys itself by return on DeviceRemoval.
    let y =
        w.cm.create_id(|_: &CmIdRef<FakeDevice>, ev: CmEvent<FakeDevice>| {
            if ev.kind == EventKind::DeviceRemoval {
                Disposition::Destroy
            } else {
                Disposition::Keep
            }
        });
    y.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
    assert!(eventually(T, || y.state() == IdState::AddrResolved));
    let before = w.cm.stats().device_removals;
    let removal = w.cm.remove_device("a").unwrap();
    assert_eq!(next(&rx), (x.serial(), EventKind::DeviceRemoval, 0));
    assert_eq!(next(&lrx), (l.serial(), EventKind::DeviceRemoval, 0));
    assert_eq!(w.cm.stats().device_removals - before, 3);
    assert!(qp.errored.load(SeqCst), "QP not moved to ERROR");
    assert_eq!(y.state(), IdState::Destroying);
    assert_eq!(x.state(), IdState::DeviceRemoval);
    // Calls on a removed id fail with DeviceRemoved.
    assert_eq!(
        x.resolve_route(T),
        Err(CmError::DeviceRemoved {
            op: "resolve_route"
        })
    );
    assert!(w.cm.remove_device("a").is_err());
    assert_eq!(removal.ids_bound(), 2);
    quiet(&rx);
    x.destroy().unwrap();
    assert!(!removal.is_released());
    drop(l);
    removal.wait_timeout(T).unwrap();
    assert!(qp.destroyed.load(SeqCst));
    drop(y);
    // New resolutions no longer pick a.
    let (z, zrx) = client(&w.cm);
    z.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
    assert_eq!(next(&zrx), (z.serial(), EventKind::AddrError, -101));
    drop(z);
    finish(w);
}

#[test]
fn a_device_reports_its_own_removal_through_the_notifier() {
    let w = world();
    let srv = server(&w.cm, "10.0.1.1:7000", true);
    let (id, rx) = client(&w.cm);
    connect_from(&id, &rx, Some("10.0.0.1:0"), "10.0.1.1:7000", b"");
    assert_eq!(next_kind(&rx), EventKind::Established);
    assert_eq!(id.device_name().as_deref(), Some("a"));
    // b's link dies: the connection closes, the server side's ids get DeviceRemoval.
    w.b.unplug();
    let mut got = Vec::new();
    while let Ok(e) = srv.rx.recv_timeout(Duration::from_millis(200)) {
        got.push(e.1);
    }
    assert_eq!(
        got.iter()
            .filter(|k| **k == EventKind::DeviceRemoval)
            .count(),
        2,
        "{got:?}"
    );
    assert_eq!(next_kind(&rx), EventKind::Disconnected);
    srv.children.lock().unwrap().clear();
    drop(srv);
    drop(id);
    assert!(eventually(T, || w.b.released.load(SeqCst)));
    finish(w);
}

#[test]
fn addr_change_reaches_ids_of_the_device() {
    let w = world();
    let (id, rx) = client(&w.cm);
    id.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
    assert_eq!(next_kind(&rx), EventKind::AddrResolved);
    let (other, orx) = client(&w.cm);
    other.resolve_addr(None, addr("10.0.1.9:1"), T).unwrap();
    assert_eq!(next_kind(&orx), EventKind::AddrResolved);
    w.a.notifier
        .lock()
        .unwrap()
        .as_ref()
        .unwrap()
        .address_changed();
    assert_eq!(next(&rx), (id.serial(), EventKind::AddrChange, 0));
    quiet(&orx);
    drop((id, other));
    finish(w);
}

#[test]
fn waiting_calls_are_refused_inside_callbacks_and_panics_destroy() {
    let w = world();
    let cm = Arc::new(w.cm);
    let errs: Arc<Mutex<Vec<CmError>>> = Arc::default();
    let (c2, e2) = (Arc::downgrade(&cm), errs.clone());
    let id = cm.create_id(move |_: &CmIdRef<FakeDevice>, _: CmEvent<FakeDevice>| {
        let cm = c2.upgrade().unwrap();
        e2.lock().unwrap().push(cm.remove_device("a").unwrap_err());
        e2.lock().unwrap().push(cm.flush().unwrap_err());
        panic!("a buggy callback");
    });
    id.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
    assert!(eventually(T, || cm.stats().handler_panics == 1));
    assert!(eventually(T, || id.state() == IdState::Destroying));
    assert_eq!(
        *errs.lock().unwrap(),
        vec![
            CmError::InCallback {
                op: "remove_device"
            },
            CmError::InCallback { op: "flush" }
        ]
    );
    drop(id);
    let w = World {
        net: w.net,
        cm: Arc::try_unwrap(cm).ok().unwrap(),
        a: w.a,
        b: w.b,
    };
    finish(w);
}

#[test]
fn async_stream_of_a_channel() {
    let w = world();
    let ch = w.cm.create_event_channel();
    let id = w.cm.create_id_with_channel(&ch);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut stream = ch.stream();
    let kinds = rt.block_on(async {
        id.resolve_addr(None, addr("10.0.0.9:1"), T).unwrap();
        let mut kinds = Vec::new();
        let ev = tokio::time::timeout(T, next_item(&mut stream))
            .await
            .unwrap()
            .unwrap();
        kinds.push(ev.kind);
        drop(ev);
        id.resolve_route(T).unwrap();
        let ev = tokio::time::timeout(T, next_item(&mut stream))
            .await
            .unwrap()
            .unwrap();
        kinds.push(ev.kind);
        kinds
    });
    assert_eq!(
        kinds,
        vec![EventKind::AddrResolved, EventKind::RouteResolved]
    );
    id.destroy().unwrap();
    finish(w);
}

/// `StreamExt::next` without futures-util.
async fn next_item<S: futures_core::Stream + Unpin>(s: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *s).poll_next(cx)).await
}

#[test]
fn wait_ids_freed_counts_only_ids_still_referenced() {
    let w = world();
    let (kept, _rx) = client(&w.cm);
    let (gone, _rx2) = client(&w.cm);
    gone.destroy().expect("destroy");
    // One id is still held by its user: after the timeout it is counted.
    let t0 = std::time::Instant::now();
    let s =
        w.cm.wait_ids_freed(Duration::from_millis(50))
            .expect("wait");
    assert_eq!(s.ids_alive, 1);
    assert!(t0.elapsed() >= Duration::from_millis(50));
    kept.destroy().expect("destroy");
    let s = w.cm.wait_ids_freed(Duration::from_secs(5)).expect("wait");
    assert_eq!(s.ids_alive, 0);
    finish(w);
}

/// librdmacm's `rdma_connect` / `rdma_accept` naming a QP by `conn_param->qp_num` on ids
/// without a QP of their own (rping `-q`): the connection uses it, the ids never
/// destroy it, and device removal moves it to ERROR as an id's own QP.
#[test]
fn a_qp_named_at_connect_and_accept_is_used_but_never_destroyed() {
    let w = world();
    let (ch, l) = channel_listener(&w.cm, "10.0.1.1:7100", 4);
    let (id, rx) = client(&w.cm);
    resolve_from(&id, &rx, Some("10.0.0.1:0"), "10.0.1.1:7100");
    assert_eq!(
        id.connect(&ConnParam::new(1, 1)),
        Err(CmError::NoQp { op: "connect" })
    );
    assert!(!id.has_iw_id(), "no iWARP CM id before connect");
    let cqp = w.a.provider.new_qp("a");
    id.connect_with_qp(&ConnParam::new(1, 1), cqp.clone())
        .unwrap();
    assert!(id.has_iw_id());
    assert!(id.qp().is_none(), "the named QP is not the id's own");
    assert_eq!(id.conn_qp().map(|q| q.num), Some(cqp.num));

    let mut req = ch.get_event_timeout(T).unwrap();
    assert_eq!(req.kind, EventKind::ConnectRequest);
    let child = req.take_new_id().unwrap();
    req.ack();
    assert!(child.has_iw_id(), "a request's new id has its iWARP CM id");
    let sqp = w.b.provider.new_qp("b");
    child
        .accept_with_qp(&ConnParam::new(1, 1), sqp.clone())
        .unwrap();
    assert_eq!(next_kind(&rx), EventKind::Established);
    let est = ch.get_event_timeout(T).unwrap();
    assert_eq!(
        (est.kind, est.id().serial()),
        (EventKind::Established, child.serial())
    );
    est.ack();
    assert_eq!(child.conn_qp().map(|q| q.num), Some(sqp.num));

    id.disconnect().unwrap();
    assert_eq!(next_kind(&rx), EventKind::Disconnected);
    let d = ch.get_event_timeout(T).unwrap();
    assert_eq!(d.kind, EventKind::Disconnected);
    d.ack();
    id.destroy().unwrap();
    child.destroy().unwrap();
    assert!(!cqp.destroyed.load(SeqCst) && !sqp.destroyed.load(SeqCst));
    assert_eq!(
        w.a.qps_destroyed.load(SeqCst) + w.b.qps_destroyed.load(SeqCst),
        0
    );

    // Device removal moves a named QP to ERROR, as the id's own.
    let (x, xrx) = client(&w.cm);
    resolve_from(&x, &xrx, Some("10.0.0.1:0"), "10.0.1.1:7100");
    let xqp = w.a.provider.new_qp("a");
    x.connect_with_qp(&ConnParam::new(1, 1), xqp.clone())
        .unwrap();
    let req = ch.get_event_timeout(T).unwrap();
    assert_eq!(req.kind, EventKind::ConnectRequest);
    req.id().reject(b"").unwrap();
    drop(req);
    assert_eq!(next_kind(&xrx), EventKind::Rejected);
    let removal = w.cm.remove_device("a").unwrap();
    assert_eq!(next_kind(&xrx), EventKind::DeviceRemoval);
    assert!(xqp.errored.load(SeqCst), "named QP not moved to ERROR");
    assert!(!xqp.destroyed.load(SeqCst));
    drop(x);
    removal.wait_timeout(T).unwrap();
    drop(l);
    drop(cqp);
    drop(sqp);
    drop(xqp);
    finish(w);
}

/// `rdma_migrate_id`: an id's events not yet taken move to the new channel in order,
/// later ones are queued there; a callback id cannot move.
#[test]
fn migrate_moves_queued_and_later_events_to_the_new_channel() {
    let w = world();
    let (ch, l) = channel_listener(&w.cm, "10.0.1.1:7200", 4);
    let (a, arx) = client(&w.cm);
    connect_from(&a, &arx, Some("10.0.0.1:0"), "10.0.1.1:7200", b"one");
    let (b, brx) = client(&w.cm);
    connect_from(&b, &brx, Some("10.0.0.1:0"), "10.0.1.1:7200", b"two");
    assert!(eventually(T, || ch.queued() == 2));
    let ch2 = w.cm.create_event_channel();
    l.migrate(&ch2).unwrap();
    assert_eq!((ch.queued(), ch2.queued()), (0, 2));
    let mut kids = Vec::new();
    for want in [b"one", b"two"] {
        let mut ev = ch2.get_event_timeout(T).unwrap();
        assert_eq!(ev.kind, EventKind::ConnectRequest);
        assert_eq!(ev.private_data, want.to_vec(), "order kept");
        kids.push(ev.take_new_id().unwrap());
    }
    // A new id moved before its accept: its Established comes on its new channel.
    let ch3 = w.cm.create_event_channel();
    kids[0].migrate(&ch3).unwrap();
    kids[0].create_qp(&(), ()).unwrap();
    kids[0].accept(&ConnParam::new(1, 1)).unwrap();
    assert_eq!(next_kind(&arx), EventKind::Established);
    let est = ch3.get_event_timeout(T).unwrap();
    assert_eq!(
        (est.kind, est.id().serial()),
        (EventKind::Established, kids[0].serial())
    );
    drop(est);
    assert_eq!(ch2.queued(), 0);
    kids[1].reject(b"").unwrap();
    assert_eq!(next_kind(&brx), EventKind::Rejected);
    assert!(matches!(
        a.migrate(&ch3),
        Err(CmError::InvalidArgument { .. })
    ));
    drop(kids);
    drop((a, b, l));
    finish(w);
}
