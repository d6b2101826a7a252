//! The CM API against the in-memory fake provider: the connection life cycle, the
//! delivery rules, destroy semantics, typed errors, and the interop-shaped cases (a
//! peer that never answers, a listener with a full backlog).
#![cfg(not(loom))]

mod common;

use common::*;
use iw_cm::{
    AcceptParams, CmConfig, CmError, CmEvent, CmId, CmIdRef, CmState, ConnectParams, ConnectStatus,
    DisconnectMode, Disposition, IwCm, ProviderError,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn setup(workers: usize) -> (FakeNet, IwCm<Fake>) {
    let net = FakeNet::new(testkit::Rng::delays(0x5eed), 200);
    let cm = IwCm::new(
        net.provider.clone(),
        CmConfig {
            name: "test".into(),
            workers,
            ..CmConfig::default()
        },
    )
    .unwrap();
    (net, cm)
}

fn connect_params(net: &FakeNet, to: SocketAddr, pd: &[u8]) -> ConnectParams<FakeQp> {
    ConnectParams {
        qp: net.new_qp(),
        local_addr: Some(addr("192.0.2.1:50000")),
        remote_addr: to,
        private_data: pd.to_vec(),
        ird: 8,
        ord: 8,
    }
}

/// A server that accepts every request and keeps the children; on Close it drops them.
struct Server {
    qp_source: Arc<Fake>,
    children: Mutex<Vec<CmId<Fake>>>,
    events: Mutex<mpsc::Sender<(u64, String)>>,
    checker: Arc<Checker>,
}

impl Server {
    fn handler(
        self: Arc<Self>,
    ) -> impl Fn(&CmIdRef<Fake>, CmEvent<Fake>) -> Disposition + Send + Sync + 'static {
        move |id, ev| {
            self.checker.enter(id.serial());
            let _ = self
                .events
                .lock()
                .unwrap()
                .send((id.serial(), ev_name(&ev)));
            match ev {
                CmEvent::ConnectRequest(req) => {
                    assert_eq!(req.id.state(), CmState::ConnRecv);
                    assert_eq!(req.id.serial(), id.serial(), "handler runs for the child");
                    req.id
                        .accept(AcceptParams {
                            qp: self.qp_source.new_qp(""),
                            private_data: b"welcome".to_vec(),
                            ird: 4,
                            ord: 4,
                        })
                        .unwrap();
                    self.children.lock().unwrap().push(req.id);
                }
                CmEvent::Close => {
                    let mine = {
                        let mut c = self.children.lock().unwrap();
                        let i = c.iter().position(|c| c.serial() == id.serial());
                        i.map(|i| c.remove(i))
                    };
                    drop(mine); // destroy after CLOSE, from inside the handler
                }
                _ => {}
            }
            self.checker.exit(id.serial());
            Disposition::Keep
        }
    }
}

fn recv(rx: &mpsc::Receiver<(u64, String)>) -> (u64, String) {
    rx.recv_timeout(T).expect("event not delivered in time")
}

#[test]
fn connect_accept_disconnect_close_in_order_and_nothing_leaks() {
    let (net, cm) = setup(2);
    let checker = Arc::new(Checker::default());
    let (stx, srx) = mpsc::channel();
    let server = Arc::new(Server {
        qp_source: net.provider.clone(),
        children: Mutex::new(Vec::new()),
        events: Mutex::new(stx),
        checker: checker.clone(),
    });
    let listener = cm.create_id(server.clone().handler());
    let laddr = addr("198.51.100.1:4791");
    listener.listen(laddr, 8).unwrap();
    assert_eq!(listener.state(), CmState::Listen);
    assert_eq!(listener.local_addr(), Some(laddr));

    let (ctx, crx) = mpsc::channel();
    let client = cm.create_id(forwarding_handler(ctx));
    client
        .connect(connect_params(&net, laddr, b"hello"))
        .unwrap();
    assert_eq!(client.state(), CmState::ConnSent);

    assert_eq!(recv(&crx).1, "ConnectReply(Ok)");
    let (child, ev) = recv(&srx);
    assert_eq!(ev, "ConnectRequest");
    assert_eq!(recv(&srx), (child, "Established".to_string()));
    assert_eq!(client.state(), CmState::Established);
    assert_eq!(net.counters().qp_refs.load(SeqCst), 2);

    client.disconnect(DisconnectMode::Graceful).unwrap();
    // CLOSING until the provider's CLOSE is processed (it may already be).
    assert!(matches!(client.state(), CmState::Closing | CmState::Idle));
    assert_eq!(recv(&crx).1, "Close");
    // The passive side got DISCONNECT (consumed, never delivered), then CLOSE.
    assert_eq!(recv(&srx), (child, "Close".to_string()));
    assert_eq!(client.state(), CmState::Idle);
    assert!(cm.stats().events_consumed >= 1);

    // A second disconnect after the close is a no-op, as in the kernel.
    client.disconnect(DisconnectMode::Abortive).unwrap();
    cm.flush().unwrap(); // the Close handler has returned
    let d = client.destroy();
    assert!(!d.delivery_in_progress());
    d.wait().unwrap();
    let _ = listener.destroy();
    assert_quiescent_and_clean(&net, &cm);
    checker.assert_clean();
    assert!(crx.try_recv().is_err(), "nothing after Close");
    assert_eq!(cm.stats().unexpected_events, 0);
    drop(server);
}

#[test]
fn reports_from_inside_downcalls_are_queued_not_delivered_inline() {
    // Inline mode: the fake reports every event from inside the downcall that causes
    // it (connect -> request -> accept -> reply; disconnect -> close).
    let (net, cm) = setup(1);
    net.set_inline(true);
    let checker = Arc::new(Checker::default());
    let (stx, srx) = mpsc::channel();
    let server = Arc::new(Server {
        qp_source: net.provider.clone(),
        children: Mutex::new(Vec::new()),
        events: Mutex::new(stx),
        checker: checker.clone(),
    });
    let listener = cm.create_id(server.clone().handler());
    let laddr = addr("198.51.100.2:4791");
    listener.listen(laddr, 8).unwrap();

    // The client's handler disconnects from inside ConnectReply: the disconnect
    // downcall reports CLOSE inline, on the worker, from inside the downcall.
    let (ctx, crx) = mpsc::channel();
    let ctx = Mutex::new(ctx);
    let c2 = checker.clone();
    let client = cm.create_id(move |id: &CmIdRef<Fake>, ev: CmEvent<Fake>| {
        c2.enter(id.serial());
        let name = ev_name(&ev);
        if let CmEvent::ConnectReply(r) = &ev {
            if r.status == ConnectStatus::Ok {
                id.disconnect(DisconnectMode::Abortive).unwrap();
            }
        }
        ctx.lock().unwrap().send(name).unwrap();
        c2.exit(id.serial());
        Disposition::Keep
    });
    client.connect(connect_params(&net, laddr, b"")).unwrap();
    assert_eq!(crx.recv_timeout(T).unwrap(), "ConnectReply(Ok)");
    assert_eq!(crx.recv_timeout(T).unwrap(), "Close");
    assert_eq!(recv(&srx).1, "ConnectRequest");
    assert_eq!(recv(&srx).1, "Established");
    assert_eq!(recv(&srx).1, "Close");
    drop(client);
    drop(listener);
    assert_quiescent_and_clean(&net, &cm);
    checker.assert_clean();
}

#[test]
fn destroy_returns_while_the_handler_runs_and_queued_events_are_dropped() {
    // Two workers: one is held by the client's blocked handler, the other serves the
    // server's child.
    let (net, cm) = setup(2);
    let laddr = addr("198.51.100.3:4791");
    let (stx, _srx) = mpsc::channel();
    let server = Arc::new(Server {
        qp_source: net.provider.clone(),
        children: Mutex::new(Vec::new()),
        events: Mutex::new(stx),
        checker: Arc::new(Checker::default()),
    });
    let listener = cm.create_id(server.clone().handler());
    listener.listen(laddr, 8).unwrap();

    // The client's handler blocks in ConnectReply until released.
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let entered_tx = Mutex::new(entered_tx);
    let release_rx = Mutex::new(release_rx);
    let calls = Arc::new(AtomicUsize::new(0));
    let calls2 = calls.clone();
    let client = cm.create_id(move |_: &CmIdRef<Fake>, ev: CmEvent<Fake>| {
        calls2.fetch_add(1, SeqCst);
        if matches!(ev, CmEvent::ConnectReply(_)) {
            entered_tx.lock().unwrap().send(()).unwrap();
            release_rx.lock().unwrap().recv().unwrap();
        }
        Disposition::Keep
    });
    client.connect(connect_params(&net, laddr, b"")).unwrap();
    entered_rx.recv_timeout(T).unwrap();
    // The server closes the connection while the client's handler is blocked: the
    // client's CLOSE queues behind the blocked delivery.
    let child_up = eventually(T, || {
        let c = server.children.lock().unwrap();
        c.len() == 1 && c[0].state() == CmState::Established
    });
    assert!(child_up);
    {
        let c = server.children.lock().unwrap();
        c[0].disconnect(DisconnectMode::Abortive).unwrap();
    }
    assert!(eventually(T, || cm.stats().events_queued >= 1));

    let started = std::time::Instant::now();
    let d = client.destroy();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "destroy blocked"
    );
    assert!(d.delivery_in_progress());
    // flush and Destroyed::wait from outside the handler may wait; release the
    // handler from another thread while we wait.
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        release_tx.send(()).unwrap();
    });
    d.wait().unwrap();
    releaser.join().unwrap();
    cm.flush().unwrap();
    assert_eq!(
        calls.load(SeqCst),
        1,
        "the queued CLOSE was dropped, not delivered"
    );
    assert!(cm.stats().events_dropped >= 1);
    drop(listener);
    assert_quiescent_and_clean(&net, &cm);
}

#[test]
fn destroy_from_inside_the_handler_and_waits_there_are_refused() {
    let (net, cm) = setup(1);
    let cm = Arc::new(cm);
    let slot: Arc<Mutex<Option<CmId<Fake>>>> = Arc::new(Mutex::new(None));
    let (tx, rx) = mpsc::channel::<String>();
    let tx = Mutex::new(tx);
    let slot2 = slot.clone();
    let cm_weak = Arc::downgrade(&cm);
    let id = cm.create_id(move |me: &CmIdRef<Fake>, ev: CmEvent<Fake>| {
        let cm = cm_weak.upgrade().unwrap();
        let flush = cm.flush();
        let mine = slot2.lock().unwrap().take().unwrap();
        assert_eq!(mine.serial(), me.serial());
        let d = mine.destroy();
        assert!(d.delivery_in_progress(), "we are the delivery in progress");
        let wait = d.wait();
        assert_eq!(me.state(), CmState::Destroying);
        let again = me.disconnect(DisconnectMode::Graceful);
        tx.lock()
            .unwrap()
            .send(format!(
                "{} {:?} {:?} {:?}",
                ev_name(&ev),
                flush,
                wait,
                again
            ))
            .unwrap();
        Disposition::Keep
    });
    // Park the owned id where the handler can take it, then connect through it (the
    // slot stays locked until connect returns, so the handler finds it filled).
    let mut parked = slot.lock().unwrap();
    *parked = Some(id);
    parked
        .as_ref()
        .unwrap()
        .connect(connect_params(&net, addr("203.0.113.9:1"), b""))
        .unwrap();
    drop(parked);
    let got = rx.recv_timeout(T).unwrap();
    assert_eq!(
        got,
        "ConnectReply(Refused) Err(InDeliveryContext { op: \"flush\" }) \
         Err(InDeliveryContext { op: \"Destroyed::wait\" }) \
         Err(Destroyed { op: \"disconnect\" })"
    );
    assert_quiescent_and_clean(&net, &cm);
}

#[test]
fn handler_returning_destroy_destroys_and_drops_later_events() {
    let (net, cm) = setup(1);
    let laddr = addr("198.51.100.4:4791");
    let (stx, srx) = mpsc::channel();
    let server = Arc::new(Server {
        qp_source: net.provider.clone(),
        children: Mutex::new(Vec::new()),
        events: Mutex::new(stx),
        checker: Arc::new(Checker::default()),
    });
    let listener = cm.create_id(server.clone().handler());
    listener.listen(laddr, 8).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let calls2 = calls.clone();
    let client = cm.create_id(move |_: &CmIdRef<Fake>, _: CmEvent<Fake>| {
        calls2.fetch_add(1, SeqCst);
        Disposition::Destroy
    });
    client.connect(connect_params(&net, laddr, b"")).unwrap();
    // The client's destroy (abortive) closes the server's child.
    assert_eq!(recv(&srx).1, "ConnectRequest");
    assert_eq!(recv(&srx).1, "Established");
    assert_eq!(recv(&srx).1, "Close");
    assert!(eventually(T, || client.state() == CmState::Destroying));
    net.wait_idle(T);
    cm.flush().unwrap();
    assert_eq!(calls.load(SeqCst), 1);
    drop(client);
    drop(listener);
    assert_quiescent_and_clean(&net, &cm);
}

#[test]
fn a_peer_that_never_answers_times_out_and_the_id_is_destroyable() {
    let (net, cm) = setup(1);
    let silent = addr("203.0.113.50:4791");
    net.blackhole(silent);
    *net.net().connect_timeout.lock().unwrap() = Duration::from_millis(30);
    let (tx, rx) = mpsc::channel();
    let id = cm.create_id(forwarding_handler(tx));
    id.connect(connect_params(&net, silent, b"anyone?"))
        .unwrap();
    // While the connect is in flight: disconnect is refused (the kernel would sleep).
    assert_eq!(
        id.disconnect(DisconnectMode::Graceful),
        Err(CmError::Busy { op: "disconnect" })
    );
    assert_eq!(recv(&rx).1, "ConnectReply(TimedOut)");
    assert_eq!(id.state(), CmState::Idle);
    assert_eq!(
        net.counters().qp_refs.load(SeqCst),
        0,
        "QP released on failure"
    );
    // The id can be used again, then destroyed.
    id.connect(connect_params(&net, silent, b"")).unwrap();
    let _ = id.destroy(); // destroy while the second attempt is pending
    assert_quiescent_and_clean(&net, &cm);
    assert!(rx.try_recv().is_err());
}

#[test]
fn a_full_backlog_rejects_the_excess_at_the_provider() {
    let (net, cm) = setup(2);
    let laddr = addr("198.51.100.5:4791");
    // The listener's handler blocks on the first request, so the next ones queue.
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let entered_tx = Mutex::new(entered_tx);
    let release_rx = Mutex::new(release_rx);
    let children = Arc::new(Mutex::new(Vec::new()));
    let children2 = children.clone();
    let qps = net.provider.clone();
    let first = AtomicUsize::new(0);
    let listener = cm.create_id(move |_: &CmIdRef<Fake>, ev: CmEvent<Fake>| {
        if let CmEvent::ConnectRequest(req) = ev {
            if first.fetch_add(1, SeqCst) == 0 {
                entered_tx.lock().unwrap().send(()).unwrap();
                release_rx.lock().unwrap().recv().unwrap();
            }
            req.id
                .accept(AcceptParams {
                    qp: qps.new_qp(""),
                    private_data: vec![],
                    ird: 1,
                    ord: 1,
                })
                .unwrap();
            children2.lock().unwrap().push(req.id);
        }
        Disposition::Keep
    });
    listener.listen(laddr, 2).unwrap();
    let (tx, rx) = mpsc::channel();
    let mut clients = Vec::new();
    let c = cm.create_id(forwarding_handler(tx.clone()));
    c.connect(connect_params(&net, laddr, b"0")).unwrap();
    clients.push(c);
    entered_rx.recv_timeout(T).unwrap();
    for i in 1..=5u8 {
        let c = cm.create_id(forwarding_handler(tx.clone()));
        c.connect(connect_params(&net, laddr, &[i])).unwrap();
        clients.push(c);
    }
    // One request in delivery, two queued (the backlog), three rejected by the CM
    // through the provider's reject.
    assert!(
        eventually(T, || cm.stats().backlog_rejects == 3),
        "{:?}",
        cm.stats()
    );
    assert!(eventually(T, || net.counters().rejects.load(SeqCst) == 3));
    let mut rejected = 0;
    for _ in 0..3 {
        let (_, ev) = recv(&rx);
        assert_eq!(ev, "ConnectReply(Rejected)");
        rejected += 1;
    }
    assert_eq!(rejected, 3);
    release_tx.send(()).unwrap();
    for _ in 0..3 {
        assert_eq!(recv(&rx).1, "ConnectReply(Ok)");
    }
    assert_eq!(children.lock().unwrap().len(), 3);
    drop(clients);
    children.lock().unwrap().clear();
    drop(listener);
    assert_quiescent_and_clean(&net, &cm);
}

#[test]
fn reject_carries_private_data_and_refused_connects_report_refused() {
    let (net, cm) = setup(1);
    let laddr = addr("198.51.100.6:4791");
    let listener = cm.create_id(|_: &CmIdRef<Fake>, ev: CmEvent<Fake>| {
        if let CmEvent::ConnectRequest(req) = ev {
            assert_eq!(req.private_data, b"let me in");
            req.id.reject(b"go away").unwrap();
            assert_eq!(req.id.state(), CmState::Idle);
            assert_eq!(
                req.id.reject(b""),
                Err(CmError::InvalidState {
                    op: "reject",
                    state: CmState::Idle
                })
            );
        }
        Disposition::Keep
    });
    listener.listen(laddr, 0).unwrap();
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let client = cm.create_id(move |_: &CmIdRef<Fake>, ev: CmEvent<Fake>| {
        if let CmEvent::ConnectReply(r) = ev {
            tx.lock().unwrap().send(r).unwrap();
        }
        Disposition::Keep
    });
    client
        .connect(connect_params(&net, laddr, b"let me in"))
        .unwrap();
    let r = rx.recv_timeout(T).unwrap();
    assert_eq!(r.status, ConnectStatus::Rejected);
    assert_eq!(r.private_data, b"go away");
    assert_eq!(r.status.errno(), 111);
    // Nothing listens on this port.
    client
        .connect(connect_params(&net, addr("198.51.100.6:9"), b""))
        .unwrap();
    assert_eq!(rx.recv_timeout(T).unwrap().status, ConnectStatus::Refused);
    drop(client);
    drop(listener);
    assert_quiescent_and_clean(&net, &cm);
}

#[test]
fn calls_in_the_wrong_state_and_bad_arguments_are_typed_errors() {
    let (net, cm) = setup(1);
    let id = cm.create_id(|_: &CmIdRef<Fake>, _: CmEvent<Fake>| Disposition::Keep);
    let qp = net.new_qp();
    let accept = AcceptParams {
        qp: qp.clone(),
        private_data: vec![],
        ird: 1,
        ord: 1,
    };
    assert_eq!(
        id.accept(accept.clone()),
        Err(CmError::InvalidState {
            op: "accept",
            state: CmState::Idle
        })
    );
    assert_eq!(id.disconnect(DisconnectMode::Graceful), Ok(()));
    let mut p = connect_params(&net, addr("198.51.100.7:1"), &[0; 513]);
    assert_eq!(
        id.connect(p.clone()),
        Err(CmError::PrivateDataTooLong { len: 513, max: 512 })
    );
    p.private_data = vec![0; 512];
    p.ord = 0x4000;
    assert_eq!(
        id.connect(p.clone()),
        Err(CmError::IrdOrdTooLarge {
            what: "ORD",
            value: 0x4000
        })
    );
    let laddr = addr("198.51.100.7:4791");
    id.listen(laddr, 1).unwrap();
    assert_eq!(
        id.listen(laddr, 1),
        Err(CmError::InvalidState {
            op: "listen",
            state: CmState::Listen
        })
    );
    assert_eq!(
        id.disconnect(DisconnectMode::Abortive),
        Err(CmError::InvalidState {
            op: "disconnect",
            state: CmState::Listen
        })
    );
    // The provider refuses a second listener on the address: back to IDLE.
    let other = cm.create_id(|_: &CmIdRef<Fake>, _: CmEvent<Fake>| Disposition::Keep);
    let e = other.listen(laddr, 1).unwrap_err();
    assert_eq!(e, CmError::Provider(ProviderError::AddressInUse));
    assert_eq!(e.errno(), 98);
    assert_eq!(other.state(), CmState::Idle);
    drop(other);
    drop(id);
    assert_quiescent_and_clean(&net, &cm);
}

#[test]
fn destroying_a_listener_rejects_its_queued_requests() {
    let (net, cm) = setup(1);
    let laddr = addr("198.51.100.8:4791");
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let entered_tx = Mutex::new(entered_tx);
    let release_rx = Mutex::new(release_rx);
    let delivered = Arc::new(AtomicUsize::new(0));
    let delivered2 = delivered.clone();
    let listener = cm.create_id(move |_: &CmIdRef<Fake>, ev: CmEvent<Fake>| {
        if let CmEvent::ConnectRequest(req) = ev {
            delivered2.fetch_add(1, SeqCst);
            entered_tx.lock().unwrap().send(()).unwrap();
            release_rx.lock().unwrap().recv().unwrap();
            drop(req.id); // dropping the child rejects the request
        }
        Disposition::Keep
    });
    listener.listen(laddr, 8).unwrap();
    let (tx, rx) = mpsc::channel();
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let c = cm.create_id(forwarding_handler(tx.clone()));
            c.connect(connect_params(&net, laddr, b"")).unwrap();
            c
        })
        .collect();
    entered_rx.recv_timeout(T).unwrap();
    assert!(eventually(T, || cm.stats().events_queued >= 2));
    let d = listener.destroy();
    assert!(d.delivery_in_progress());
    release_tx.send(()).unwrap();
    d.wait().unwrap();
    // All three initiators hear a reject: two from the destroy, one from the child.
    let mut n = 0;
    while n < 3 {
        let (_, ev) = rx.recv_timeout(T).unwrap();
        if ev.starts_with("ConnectReply(Rejected") {
            n += 1;
        }
    }
    assert_eq!(delivered.load(SeqCst), 1);
    assert_eq!(cm.stats().requests_rejected_on_destroy, 2);
    drop(clients);
    assert_quiescent_and_clean(&net, &cm);
}

#[test]
fn a_panicking_handler_destroys_its_id() {
    let (net, cm) = setup(1);
    let id = cm
        .create_id(|_: &CmIdRef<Fake>, _: CmEvent<Fake>| -> Disposition { panic!("handler bug") });
    id.connect(connect_params(&net, addr("198.51.100.9:9"), b""))
        .unwrap();
    assert!(eventually(T, || id.state() == CmState::Destroying));
    assert_eq!(cm.stats().handler_panics, 1);
    drop(id);
    assert_quiescent_and_clean(&net, &cm);
}

#[test]
fn the_last_reference_can_be_the_providers() {
    let (net, cm) = setup(1);
    let silent = addr("203.0.113.51:4791");
    net.blackhole(silent);
    *net.net().connect_timeout.lock().unwrap() = Duration::from_millis(300);
    struct Ctx(Arc<AtomicUsize>);
    impl Drop for Ctx {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }
    let drops = Arc::new(AtomicUsize::new(0));
    let ctx = Ctx(drops.clone());
    let id = cm.create_id(move |_: &CmIdRef<Fake>, _: CmEvent<Fake>| {
        let _ = &ctx;
        Disposition::Keep
    });
    id.connect(connect_params(&net, silent, b"")).unwrap();
    // Let the SYN reach the silent peer (the provider then waits for its timeout,
    // holding the id's sink), then destroy.
    std::thread::sleep(Duration::from_millis(20));
    let _ = id.destroy();
    // The handler (and its context) is dropped at destroy; the id's memory stays while
    // the provider still holds its sink (the pending connect).
    assert_eq!(drops.load(SeqCst), 1);
    assert_eq!(cm.stats().ids_alive, 1);
    // The provider answers Reset (aborted) after the timeout and drops its sink.
    assert!(eventually(T, || cm.stats().ids_alive == 0));
    assert_eq!(cm.stats().ids_freed, 1);
    assert_quiescent_and_clean(&net, &cm);
}

#[test]
fn a_child_can_get_its_own_handler_and_events_wait_for_the_request_delivery() {
    let (net, cm) = setup(2);
    net.set_inline(true);
    let laddr = addr("198.51.100.10:4791");
    let (tx, rx) = mpsc::channel::<String>();
    let child_tx = Mutex::new(tx.clone());
    let tx = Mutex::new(tx);
    let qps = net.provider.clone();
    let keep = Arc::new(Mutex::new(Vec::new()));
    let keep2 = keep.clone();
    let listener = cm.create_id(move |_: &CmIdRef<Fake>, ev: CmEvent<Fake>| {
        if let CmEvent::ConnectRequest(req) = ev {
            let t = child_tx.lock().unwrap().clone();
            let t = Mutex::new(t);
            req.id
                .set_handler(Arc::new(move |_: &CmIdRef<Fake>, ev: CmEvent<Fake>| {
                    t.lock()
                        .unwrap()
                        .send(format!("child {}", ev_name(&ev)))
                        .unwrap();
                    Disposition::Keep
                }));
            // Inline mode: ESTABLISHED is reported from inside accept, yet it is
            // delivered only after this ConnectRequest delivery returns.
            req.id
                .accept(AcceptParams {
                    qp: qps.new_qp(""),
                    private_data: vec![],
                    ird: 1,
                    ord: 1,
                })
                .unwrap();
            std::thread::sleep(Duration::from_millis(20));
            tx.lock().unwrap().send("request done".into()).unwrap();
            keep2.lock().unwrap().push(req.id);
        }
        Disposition::Keep
    });
    listener.listen(laddr, 4).unwrap();
    let client = cm.create_id(|_: &CmIdRef<Fake>, _: CmEvent<Fake>| Disposition::Keep);
    client.connect(connect_params(&net, laddr, b"")).unwrap();
    assert_eq!(rx.recv_timeout(T).unwrap(), "request done");
    assert_eq!(rx.recv_timeout(T).unwrap(), "child Established");
    drop(client);
    assert_eq!(rx.recv_timeout(T).unwrap(), "child Close");
    keep.lock().unwrap().clear();
    drop(listener);
    assert_quiescent_and_clean(&net, &cm);
}

#[test]
fn shutdown_stops_workers_and_later_events_are_dropped() {
    let (net, cm) = setup(2);
    let id = cm.create_id(|_: &CmIdRef<Fake>, _: CmEvent<Fake>| Disposition::Keep);
    let stats_before = cm.stats();
    assert_eq!(stats_before.ids_alive, 1);
    cm.flush().unwrap();
    let r = cm.shutdown();
    assert_eq!(r, Ok(()));
    // The id outlives the CM instance; its calls still work, its events are dropped.
    id.connect(connect_params(&net, addr("198.51.100.11:9"), b""))
        .unwrap();
    net.wait_idle(T);
    drop(id);
    assert_eq!(net.counters().qp_refs.load(SeqCst), 0);
}
