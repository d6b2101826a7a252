//! The iWARP CM over soft devices (`SoftProvider`), in the shapes real peers take:
//!
//! - connect / accept with private data and IRD/ORD both ways, a Send over the QPs,
//!   graceful disconnect; reject with private data;
//! - a peer that writes an FPDU right behind its MPA Reply (what kernel siw does): the
//!   FPDU is delivered into the receive posted before connect;
//! - a peer that accepts TCP but never answers the MPA Request: `ConnectReply(TimedOut)`,
//!   and the id destroyable, also while it waits;
//! - a listener with a full backlog: the excess is rejected at the provider and the
//!   client sees `ConnectReply(Rejected)`;
//! - nothing listening: `ConnectReply(Refused)`;
//! - device gone: `Close` for the connected id, the end hook runs, later calls fail.
//!
//! Every test ends with every live-object count back to zero.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use crate::support::iwcm::*;
use iw_cm::{
    AcceptParams, CmError, CmEvent, CmIdRef, ConnectParams, ConnectStatus, DisconnectMode,
    Disposition, ProviderError,
};
use softiwarp::cm::iwcm::SoftProvider;
use softiwarp::link::{GoneReason, MemoryConfig, MemoryLink};
use verbs::{AccessFlags, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus};

const WAIT: Duration = Duration::from_secs(10);

/// What a handler saw: the event name and, for requests and replies, the details.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Request {
        private_data: Vec<u8>,
        ird: u16,
        ord: u16,
        remote_ip: std::net::IpAddr,
    },
    Reply {
        status: ConnectStatus,
        private_data: Vec<u8>,
        ird: u16,
        ord: u16,
    },
    Established,
    Close,
}

type Tx = Mutex<mpsc::Sender<Seen>>;

fn seen(ev: &CmEvent<SoftProvider>) -> Seen {
    match ev {
        CmEvent::ConnectRequest(r) => Seen::Request {
            private_data: r.private_data.clone(),
            ird: r.ird,
            ord: r.ord,
            remote_ip: r.remote_addr.ip(),
        },
        CmEvent::ConnectReply(r) => Seen::Reply {
            status: r.status,
            private_data: r.private_data.clone(),
            ird: r.ird,
            ord: r.ord,
        },
        CmEvent::Established => Seen::Established,
        CmEvent::Close => Seen::Close,
    }
}

/// A client handler forwarding what it sees.
fn recorder(
    checker: Arc<Checker>,
    side: usize,
    tx: mpsc::Sender<Seen>,
) -> impl Fn(&CmIdRef<SoftProvider>, CmEvent<SoftProvider>) -> Disposition + Send + Sync {
    let tx: Tx = Mutex::new(tx);
    move |id, ev| {
        checker.enter(side, id.serial());
        let _ = tx.lock().unwrap().send(seen(&ev));
        checker.exit(side, id.serial());
        Disposition::Keep
    }
}

/// `SocketAddr` from an IPv4 address and a port.
fn sa(ip: std::net::Ipv4Addr, port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from((ip, port))
}

fn reply(rx: &mpsc::Receiver<Seen>) -> Seen {
    rx.recv_timeout(WAIT).expect("an event")
}

#[test]
fn connect_accept_send_disconnect_and_reject_with_private_data() {
    let (server, client) = pair(1, 1, |_| {}, |_| {});
    let checker = Arc::new(Checker::default());
    // Server: accept requests whose private data starts with 'a', reject the others.
    let children = Arc::new(Mutex::new(Vec::new()));
    let (stx, srx) = mpsc::channel();
    let (ck, kids, stx) = (checker.clone(), children.clone(), Mutex::new(stx));
    let sqp = server.qp(8);
    let sqp2 = sqp.clone();
    let listener = server.cm.create_id(
        move |id: &CmIdRef<SoftProvider>, ev: CmEvent<SoftProvider>| {
            ck.enter(0, id.serial());
            let _ = stx.lock().unwrap().send(seen(&ev));
            if let CmEvent::ConnectRequest(req) = ev {
                if req.private_data.starts_with(b"a") {
                    req.id
                        .accept(AcceptParams {
                            qp: sqp2.clone(),
                            private_data: b"welcome".to_vec(),
                            ird: 7,
                            ord: 2,
                        })
                        .unwrap();
                    kids.lock().unwrap().push(req.id);
                } else {
                    req.id.reject(b"go away").unwrap();
                }
            }
            ck.exit(0, id.serial());
            Disposition::Keep
        },
    );
    listener.listen(server.addr(4791), 8).unwrap();

    // The server posts a receive; the client's Send lands in it once connected.
    let smr = server
        .pd
        .reg_mr(64, 0x1000, AccessFlags::LOCAL_WRITE)
        .unwrap();
    sqp.modify_state(verbs::QpState::Init).unwrap();
    sqp.post_recv(RecvWr::new(11, vec![smr.sge(0, 64)]))
        .unwrap();

    let (ctx, crx) = mpsc::channel();
    let cqp = client.qp(8);
    let id = client.cm.create_id(recorder(checker.clone(), 1, ctx));
    id.connect(ConnectParams {
        qp: cqp.clone(),
        local_addr: Some(client.addr(0)),
        remote_addr: server.addr(4791),
        private_data: b"accept me".to_vec(),
        ird: 3,
        ord: 5,
    })
    .unwrap();
    assert_eq!(
        srx.recv_timeout(WAIT).unwrap(),
        Seen::Request {
            private_data: b"accept me".to_vec(),
            ird: 3,
            ord: 5,
            remote_ip: client.ip.into(),
        }
    );
    assert_eq!(
        reply(&crx),
        Seen::Reply {
            status: ConnectStatus::Ok,
            private_data: b"welcome".to_vec(),
            ird: 7,
            ord: 2,
        }
    );
    assert_eq!(srx.recv_timeout(WAIT).unwrap(), Seen::Established);
    assert_eq!(client.provider.qp_refs(cqp.qp_num()), 1);
    assert_eq!(server.provider.qp_refs(sqp.qp_num()), 1);

    // The QPs are in RTS: a Send goes through.
    let cmr = client
        .pd
        .reg_mr(64, 0x2000, AccessFlags::LOCAL_WRITE)
        .unwrap();
    cmr.write(0, b"over the CM").unwrap();
    cqp.post_send(SendWr::send(1, vec![cmr.sge(0, 11)]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    let wc = server.cq.poll_wait(1, WAIT).unwrap()[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (11, WcStatus::Success, 11)
    );
    let mut got = [0u8; 11];
    smr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"over the CM");
    assert_eq!(
        client.cq.poll_wait(1, WAIT).unwrap()[0].status,
        WcStatus::Success
    );

    // Graceful disconnect from the client: Close on both sides.
    id.disconnect(DisconnectMode::Graceful).unwrap();
    assert_eq!(reply(&crx), Seen::Close);
    assert_eq!(srx.recv_timeout(WAIT).unwrap(), Seen::Close);
    assert_eq!(
        client.provider.qp_refs(cqp.qp_num()),
        0,
        "released at Close"
    );
    drop(id);

    // A rejected request: the reject's private data reaches the client.
    let (ctx, crx) = mpsc::channel();
    let id = client.cm.create_id(recorder(checker.clone(), 1, ctx));
    id.connect(ConnectParams {
        qp: client.qp(1),
        local_addr: None,
        remote_addr: server.addr(4791),
        private_data: b"reject me".to_vec(),
        ird: 1,
        ord: 1,
    })
    .unwrap();
    assert!(matches!(
        srx.recv_timeout(WAIT).unwrap(),
        Seen::Request { .. }
    ));
    assert_eq!(
        reply(&crx),
        Seen::Reply {
            status: ConnectStatus::Rejected,
            private_data: b"go away".to_vec(),
            ird: 0,
            ord: 0,
        }
    );
    drop(id);

    // Listening on an address of another host, or twice on one port, fails.
    let other = server
        .cm
        .create_id(|_: &CmIdRef<SoftProvider>, _| Disposition::Keep);
    assert_eq!(
        other.listen(client.addr(4792), 4),
        Err(CmError::Provider(ProviderError::AddressNotAvailable))
    );
    assert_eq!(
        other.listen(server.addr(4791), 4),
        Err(CmError::Provider(ProviderError::AddressInUse))
    );
    drop(other);

    drop(listener);
    children.lock().unwrap().clear();
    drop((sqp, cqp));
    assert_clean(&[&server, &client]);
    checker.assert_clean();
}

#[test]
fn an_fpdu_right_behind_the_mpa_reply_is_delivered() {
    let (a, b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
    let client = Side::open("c2", a, ip(2, 1), 1, |_| {});
    let peer = RawResponder::start(
        b,
        ip(2, 2),
        4791,
        RawBehaviour::ReplyThenFpdu {
            pd: b"raw".to_vec(),
            payload: b"right behind the reply".to_vec(),
        },
    );
    // The receive is posted before connect: the FPDU may land before the CM user even
    // hears of the connection.
    let qp = client.qp(4);
    let mr = client
        .pd
        .reg_mr(256, 0x3000, AccessFlags::LOCAL_WRITE)
        .unwrap();
    qp.modify_state(verbs::QpState::Init).unwrap();
    qp.post_recv(RecvWr::new(5, vec![mr.sge(0, 256)])).unwrap();
    let checker = Arc::new(Checker::default());
    let (tx, rx) = mpsc::channel();
    let id = client.cm.create_id(recorder(checker.clone(), 1, tx));
    id.connect(ConnectParams {
        qp: qp.clone(),
        local_addr: None,
        remote_addr: sa(ip(2, 2), 4791),
        private_data: b"hello raw".to_vec(),
        ird: 4,
        ord: 4,
    })
    .unwrap();
    assert_eq!(
        reply(&rx),
        Seen::Reply {
            status: ConnectStatus::Ok,
            private_data: b"raw".to_vec(),
            ird: 4,
            ord: 4,
        }
    );
    let wc = client.cq.poll_wait(1, WAIT).unwrap()[0];
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    assert_eq!((wc.wr_id, wc.opcode), (5, WcOpcode::Recv));
    assert_eq!(wc.byte_len as usize, b"right behind the reply".len());
    let mut got = vec![0u8; wc.byte_len as usize];
    mr.read(0, &mut got).unwrap();
    assert_eq!(got, b"right behind the reply");
    let log = peer.log();
    assert_eq!(log.requests.len(), 1);
    assert_eq!(&log.requests[0][..16], b"MPA ID Req Frame");
    assert!(log.requests[0].ends_with(b"hello raw"));
    // Reply and FPDU went out in one write.
    assert_eq!(log.sent[0][..16], *b"MPA ID Rep Frame");

    // Tear down: abortive (destroy while established), then nothing is left.
    drop(id);
    drop(peer);
    drop(qp);
    assert_clean(&[&client]);
    checker.assert_clean();
}

#[test]
fn a_peer_that_never_answers_times_out_and_the_id_is_destroyable() {
    let (a, b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
    let client = Side::open("c3", a, ip(3, 1), 1, |cfg| {
        cfg.mpa.startup_timeout_us = 300_000;
    });
    let peer = RawResponder::start(b, ip(3, 2), 4791, RawBehaviour::Silent);
    let checker = Arc::new(Checker::default());
    let remote = sa(ip(3, 2), 4791);

    // Waits out the MPA startup timeout.
    let (tx, rx) = mpsc::channel();
    let id = client.cm.create_id(recorder(checker.clone(), 1, tx));
    let started = std::time::Instant::now();
    id.connect(ConnectParams {
        qp: client.qp(1),
        local_addr: None,
        remote_addr: remote,
        private_data: vec![],
        ird: 1,
        ord: 1,
    })
    .unwrap();
    assert_eq!(
        reply(&rx),
        Seen::Reply {
            status: ConnectStatus::TimedOut,
            private_data: vec![],
            ird: 0,
            ord: 0,
        }
    );
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(id.state(), iw_cm::CmState::Idle);
    id.destroy().wait().unwrap();
    assert!(eventually(WAIT, || peer.log().accepted == 1));

    // Destroyed while it waits: nothing is delivered, the attempt is aborted.
    let quiet = Arc::new(AtomicBool::new(false));
    let (q2, ck) = (quiet.clone(), checker.clone());
    let id = client.cm.create_id(
        move |id: &CmIdRef<SoftProvider>, ev: CmEvent<SoftProvider>| {
            if q2.load(SeqCst) {
                ck.violation(format!("{} delivered after destroy", ev_name(&ev)));
            }
            let _ = id;
            Disposition::Keep
        },
    );
    id.connect(ConnectParams {
        qp: client.qp(1),
        local_addr: None,
        remote_addr: remote,
        private_data: vec![],
        ird: 1,
        ord: 1,
    })
    .unwrap();
    assert!(eventually(WAIT, || peer.log().requests.len() == 2));
    let d = id.destroy();
    if !d.delivery_in_progress() {
        quiet.store(true, SeqCst);
    }
    d.wait().unwrap();
    std::thread::sleep(Duration::from_millis(400)); // past the startup timeout
    drop(peer);
    assert_clean(&[&client]);
    checker.assert_clean();
}

#[test]
fn a_full_backlog_is_rejected_at_the_provider_and_the_client_sees_it() {
    // Two CM workers on the server: one sits in the first request's handler, the other
    // runs the provider reject of the excess request.
    let (server, client) = pair(4, 2, |_| {}, |_| {});
    let checker = Arc::new(Checker::default());
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let gate = Mutex::new((entered_tx, release_rx));
    let children = Arc::new(Mutex::new(Vec::new()));
    let first = AtomicBool::new(true);
    let (kids, sqps) = (children.clone(), Arc::new(Mutex::new(Vec::new())));
    let sq = sqps.clone();
    let server_qps: Vec<_> = (0..3).map(|_| server.qp(1)).collect();
    sq.lock().unwrap().extend(server_qps);
    let listener = server.cm.create_id(
        move |_: &CmIdRef<SoftProvider>, ev: CmEvent<SoftProvider>| {
            if let CmEvent::ConnectRequest(req) = ev {
                if first.swap(false, SeqCst) {
                    let g = gate.lock().unwrap();
                    g.0.send(()).unwrap();
                    g.1.recv_timeout(WAIT).unwrap();
                }
                let qp = sq.lock().unwrap().pop().expect("a QP per accepted request");
                req.id
                    .accept(AcceptParams {
                        qp,
                        private_data: vec![],
                        ird: 1,
                        ord: 1,
                    })
                    .unwrap();
                kids.lock().unwrap().push(req.id);
            }
            Disposition::Keep
        },
    );
    listener.listen(server.addr(4791), 2).unwrap();

    let connect = |tag: u8| {
        let (tx, rx) = mpsc::channel();
        let id = client.cm.create_id(recorder(checker.clone(), 1, tx));
        id.connect(ConnectParams {
            qp: client.qp(1),
            local_addr: None,
            remote_addr: server.addr(4791),
            private_data: vec![tag],
            ird: 1,
            ord: 1,
        })
        .unwrap();
        (id, rx)
    };
    // #1 is delivered and holds one worker in its handler.
    let c1 = connect(1);
    entered_rx.recv_timeout(WAIT).unwrap();
    // #2 and #3 fill the listener's queue (backlog 2).
    let c2 = connect(2);
    let c3 = connect(3);
    assert!(
        eventually(WAIT, || server.cm.stats().events_queued == 2),
        "{}",
        server.describe()
    );
    // #4 is beyond the backlog: rejected at the provider, seen by the client.
    let c4 = connect(4);
    assert_eq!(
        reply(&c4.1),
        Seen::Reply {
            status: ConnectStatus::Rejected,
            private_data: vec![],
            ird: 0,
            ord: 0,
        }
    );
    assert_eq!(server.cm.stats().backlog_rejects, 1);
    // Released, the handler accepts #1..#3.
    release_tx.send(()).unwrap();
    for c in [&c1, &c2, &c3] {
        assert!(matches!(
            reply(&c.1),
            Seen::Reply {
                status: ConnectStatus::Ok,
                ..
            }
        ));
    }
    // Client destroys (abortive): the server children hear Close... and are destroyed
    // with the listener's handler state here.
    drop((c1, c2, c3, c4));
    assert!(eventually(WAIT, || server.provider.stats().conns_watched == 0));
    children.lock().unwrap().clear();
    drop(listener);
    drop(sqps);
    assert_clean(&[&server, &client]);
    checker.assert_clean();
}

#[test]
fn nothing_listening_is_refused() {
    let (server, client) = pair(5, 1, |_| {}, |_| {});
    let checker = Arc::new(Checker::default());
    let (tx, rx) = mpsc::channel();
    let id = client.cm.create_id(recorder(checker.clone(), 1, tx));
    id.connect(ConnectParams {
        qp: client.qp(1),
        local_addr: None,
        remote_addr: server.addr(9),
        private_data: vec![],
        ird: 1,
        ord: 1,
    })
    .unwrap();
    assert_eq!(
        reply(&rx),
        Seen::Reply {
            status: ConnectStatus::Refused,
            private_data: vec![],
            ird: 0,
            ord: 0,
        }
    );
    drop(id);
    assert_clean(&[&server, &client]);
    checker.assert_clean();
}

#[test]
fn device_gone_closes_connected_ids_and_runs_the_end_hook() {
    let (server, client) = pair(6, 1, |_| {}, |_| {});
    let checker = Arc::new(Checker::default());
    let children = Arc::new(Mutex::new(Vec::new()));
    let kids = children.clone();
    let sqp = server.qp(1);
    let listener = server.cm.create_id(
        move |_: &CmIdRef<SoftProvider>, ev: CmEvent<SoftProvider>| {
            if let CmEvent::ConnectRequest(req) = ev {
                req.id
                    .accept(AcceptParams {
                        qp: sqp.clone(),
                        private_data: vec![],
                        ird: 1,
                        ord: 1,
                    })
                    .unwrap();
                kids.lock().unwrap().push(req.id);
            }
            Disposition::Keep
        },
    );
    listener.listen(server.addr(4791), 4).unwrap();
    let (end_tx, end_rx) = mpsc::channel();
    let end_tx = Mutex::new(end_tx);
    client.provider.on_device_end(move |end| {
        let _ = end_tx.lock().unwrap().send(end);
    });
    let (tx, rx) = mpsc::channel();
    let id = client.cm.create_id(recorder(checker.clone(), 1, tx));
    let cqp = client.qp(1);
    id.connect(ConnectParams {
        qp: cqp.clone(),
        local_addr: None,
        remote_addr: server.addr(4791),
        private_data: vec![],
        ird: 1,
        ord: 1,
    })
    .unwrap();
    assert!(matches!(
        reply(&rx),
        Seen::Reply {
            status: ConnectStatus::Ok,
            ..
        }
    ));

    client.control.remove();
    assert_eq!(reply(&rx), Seen::Close);
    assert_eq!(
        end_rx.recv_timeout(WAIT).unwrap(),
        softiwarp::DeviceEnd::Gone(GoneReason::Injected)
    );
    assert_eq!(cqp.state(), verbs::QpState::Error);
    assert_eq!(client.provider.qp_refs(cqp.qp_num()), 0);
    // Later calls fail with DeviceRemoved.
    let again = client
        .cm
        .create_id(|_: &CmIdRef<SoftProvider>, _| Disposition::Keep);
    assert_eq!(
        again.connect(ConnectParams {
            qp: cqp.clone(),
            local_addr: None,
            remote_addr: server.addr(4791),
            private_data: vec![],
            ird: 1,
            ord: 1,
        }),
        Err(CmError::Provider(ProviderError::DeviceRemoved))
    );
    drop((again, id, cqp));
    // The server side never heard of it (the client vanished): destroying aborts.
    children.lock().unwrap().clear();
    drop(listener);
    assert_clean(&[&server, &client]);
    checker.assert_clean();
}
