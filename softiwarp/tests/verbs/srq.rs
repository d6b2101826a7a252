//! Shared receive queues on real devices (two soft devices on a memory link): server
//! QPs sharing one SRQ, each connected to a client QP on the other device. Interleaved
//! Sends of every size land in SRQ WRs taken in posting order, completed on the
//! receiving QP's CQ with its number and in its peer's order; the limit event; Last WQE
//! Reached when an SRQ QP leaves service; device removal with SRQ receives outstanding;
//! the errors and their errnos.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::support::devices::*;
use softiwarp::transport::{CloseMode, MpaParams};
use softiwarp::{Cq, Device, DeviceEvent, Listener, Mr, Qp, QpConnection, QpInitAttr, Srq};
use verbs::{
    errno, AsyncEvent, ObjectKind, QpState, RecvWr, SendFlags, SendWr, SrqAttr, SrqAttrMask,
    VerbsError, WcOpcode, WcStatus, WorkCompletion, WorkQueue,
};

/// Bytes of each SRQ buffer slot and of each client message slot.
const SLOT: u64 = 64 * 1024;
/// Client message slots (each message of a test has its own).
const CLIENT_SLOTS: u64 = 128;

/// The server side: an SRQ, its buffer, QPs created on it completing on one receive
/// CQ.
struct Server {
    qps: Vec<Qp>,
    conns: Vec<QpConnection>,
    srq: Srq,
    buf: Mr,
    scq: Cq,
    rcq: Cq,
}

/// The client side: one QP per server QP, one send CQ, one MR with a slot per message.
struct Client {
    qps: Vec<Qp>,
    conns: Vec<QpConnection>,
    mr: Mr,
    scq: Cq,
    rcq: Cq,
}

/// `n` server QPs on an SRQ of `attr` on `b`, each connected to a client QP on `a`.
fn srq_pairs(a: &End, b: &End, n: usize, attr: SrqAttr, slots: u64) -> (Client, Server) {
    let srq = b.dev.create_srq(&b.pd, attr).unwrap();
    let server_cq = |d: &Device| d.create_cq(1 << 14).unwrap();
    let (sscq, srcq) = (server_cq(&b.dev), server_cq(&b.dev));
    let (cscq, crcq) = (server_cq(&a.dev), server_cq(&a.dev));
    let buf = b.pd.reg_mr(slots * SLOT, 0x100_0000, all_access()).unwrap();
    let mr =
        a.pd.reg_mr(CLIENT_SLOTS * SLOT, 0x1000_0000, all_access())
            .unwrap();
    let listener = b.dev.listen(PORT, 8).unwrap();
    let mut client = Client {
        qps: Vec::new(),
        conns: Vec::new(),
        mr,
        scq: cscq,
        rcq: crcq,
    };
    let mut server = Server {
        qps: Vec::new(),
        conns: Vec::new(),
        srq,
        buf,
        scq: sscq,
        rcq: srcq,
    };
    for _ in 0..n {
        let attr_of = |scq, rcq| QpInitAttr {
            send_cq: scq,
            recv_cq: rcq,
            cap: cap(64, 1),
            sq_sig_all: false,
        };
        let cqp = a
            .dev
            .create_qp(&a.pd, attr_of(&client.scq, &client.rcq))
            .unwrap();
        let sqp = b
            .dev
            .create_qp_with_srq(&b.pd, attr_of(&server.scq, &server.rcq), &server.srq)
            .unwrap();
        let (cc, sc) = connect(&a.dev, &cqp, &listener, &sqp);
        client.qps.push(cqp);
        client.conns.push(cc);
        server.qps.push(sqp);
        server.conns.push(sc);
    }
    (client, server)
}

fn connect(a: &Device, aq: &Qp, listener: &Listener, bq: &Qp) -> (QpConnection, QpConnection) {
    let params = MpaParams {
        ird: 16,
        ord: 16,
        ..MpaParams::default()
    };
    let conn = a.connect_qp(addr(2), PORT, params, aq).unwrap();
    let served = listener
        .next_request(WAIT)
        .unwrap()
        .accept_qp(bq, b"", 16, 16)
        .unwrap();
    conn.wait_established(WAIT).unwrap();
    served.wait_established(WAIT).unwrap();
    for qp in [aq, bq] {
        let deadline = Instant::now() + WAIT;
        while qp.state() != QpState::Rts {
            assert!(Instant::now() < deadline, "QP {} not in RTS", qp.qp_num());
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    (conn, served)
}

impl Server {
    /// Posts WR `wr_id` over buffer slot `wr_id`.
    fn post(&self, wr_id: u64) {
        let wr = RecvWr::new(wr_id, vec![self.buf.sge(wr_id * SLOT, SLOT as u32)]);
        self.srq.post_recv(wr).unwrap();
    }

    fn slot(&self, wr_id: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.buf.read((wr_id * SLOT) as usize, &mut v).unwrap();
        v
    }

    /// Index of the server QP numbered `qp_num`.
    fn index_of(&self, qp_num: u32) -> usize {
        self.qps
            .iter()
            .position(|q| q.qp_num() == qp_num)
            .unwrap_or_else(|| panic!("completion of QP {qp_num}, not an SRQ QP"))
    }
}

impl Client {
    /// Client QP `c` sends `data` from message slot `slot`, signaled.
    fn send(&self, c: usize, slot: u64, wr_id: u64, data: &[u8]) {
        self.mr.write((slot * SLOT) as usize, data).unwrap();
        let sge = self.mr.sge(slot * SLOT, data.len() as u32);
        self.qps[c]
            .post_send(SendWr::send(wr_id, vec![sge]).with_flags(SendFlags::SIGNALED))
            .unwrap();
    }
}

/// Waits for the device's [`DeviceEvent::DeviceGone`].
fn wait_device_gone(dev: &Device) {
    loop {
        match dev.next_event(WAIT) {
            Some(DeviceEvent::DeviceGone(_)) => return,
            Some(_) => continue,
            None => panic!("no DeviceGone"),
        }
    }
}

/// Every async event within `d`.
fn async_events(dev: &Device, d: Duration) -> Vec<AsyncEvent> {
    let deadline = Instant::now() + d;
    let mut out = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match dev.next_async_event(left) {
            Some(e) => out.push(e),
            None => break,
        }
    }
    out
}

/// Length of message `k` of client `c`: 1 byte to about 4.2 segments, spread.
fn msg_len(c: usize, k: usize) -> usize {
    1 + (c * 7919 + k * 1543) % 6000
}

fn msg(c: usize, k: usize) -> Vec<u8> {
    pattern(msg_len(c, k), (c * 1000 + k) as u64)
}

#[test]
fn qps_sharing_an_srq_get_interleaved_sends_each_in_its_peers_order() {
    const QPS: usize = 3;
    const N: usize = 40;
    const EXTRA: u64 = 4;
    let (a, b) = devices(&Setup::default());
    let (client, server) = srq_pairs(&a, &b, QPS, SrqAttr::new(128, 1), 128);
    let total = (QPS * N) as u64;
    for id in 0..total + EXTRA {
        server.post(id);
    }
    assert_eq!(server.srq.len() as u64, total + EXTRA);
    // Each client QP sends from its own thread: the peers' messages interleave on the
    // server, segment by segment across its connections.
    std::thread::scope(|s| {
        for c in 0..QPS {
            let client = &client;
            s.spawn(move || {
                for k in 0..N {
                    let id = (c * N + k) as u64;
                    client.send(c, id, id, &msg(c, k));
                }
            });
        }
    });
    let sent = End::wait_n(&client.scq, QPS * N);
    assert!(
        sent.iter().all(|w| w.status == WcStatus::Success),
        "{sent:?}"
    );
    let wcs = End::wait_n(&server.rcq, QPS * N);
    let mut per_qp: HashMap<usize, Vec<WorkCompletion>> = HashMap::new();
    for w in wcs {
        assert_eq!(
            (w.status, w.opcode),
            (WcStatus::Success, WcOpcode::Recv),
            "{w:?}"
        );
        per_qp.entry(server.index_of(w.qp_num)).or_default().push(w);
    }
    let mut taken = BTreeSet::new();
    for (i, wcs) in &per_qp {
        // Server QP i is connected to client QP i: its completions come in that
        // peer's send order, each with the right length and bytes.
        assert_eq!(wcs.len(), N, "QP {i}");
        for (k, w) in wcs.iter().enumerate() {
            let want = msg(*i, k);
            assert_eq!(w.byte_len as usize, want.len(), "QP {i} message {k}");
            assert_eq!(server.slot(w.wr_id, want.len()), want, "QP {i} message {k}");
            assert!(taken.insert(w.wr_id), "WR {} completed twice", w.wr_id);
        }
        // One QP takes the SRQ's WRs in the SRQ's order.
        assert!(
            wcs.windows(2).all(|p| p[0].wr_id < p[1].wr_id),
            "QP {i}: {:?}",
            wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>()
        );
    }
    // Across QPs, the SRQ's oldest WRs were taken: exactly the first `total`, and the
    // last `EXTRA` are still there.
    assert_eq!(taken, (0..total).collect::<BTreeSet<_>>());
    assert_eq!(server.srq.len() as u64, EXTRA);
    assert!(async_events(&b.dev, Duration::from_millis(20)).is_empty());
    assert!(client.rcq.is_empty() && server.scq.is_empty());
}

#[test]
fn the_srq_limit_fires_once_until_it_is_armed_again() {
    let (a, b) = devices(&Setup::default());
    let attr = SrqAttr {
        max_wr: 8,
        max_sge: 1,
        srq_limit: 3,
    };
    let (client, server) = srq_pairs(&a, &b, 1, attr, 16);
    assert_eq!(server.srq.query().unwrap(), attr);
    for id in 0..6 {
        server.post(id);
    }
    let srq = server.srq.handle();
    let mut k = 0u64;
    let mut one = || {
        client.send(0, 0, k, b"ping");
        let w = End::wait_n(&server.rcq, 1)[0];
        assert_eq!((w.wr_id, w.status), (k % 16, WcStatus::Success));
        k += 1;
        async_events(&b.dev, Duration::from_millis(30))
    };
    // 5, 4, 3 left: not below the limit.
    for _ in 0..3 {
        assert_eq!(one(), []);
    }
    // 2 left: once.
    assert_eq!(one(), [AsyncEvent::SrqLimitReached { srq }]);
    assert_eq!(server.srq.query().unwrap().srq_limit, 0, "disarmed");
    assert_eq!(one(), []);
    assert_eq!(one(), []);
    assert!(server.srq.is_empty());
    // Armed again at 2 with 4 WRs in: the take that leaves 1 fires it.
    for id in 6..10 {
        server.post(id);
    }
    let limit = SrqAttr {
        srq_limit: 2,
        ..SrqAttr::default()
    };
    server.srq.modify(&limit, SrqAttrMask::LIMIT).unwrap();
    assert_eq!(server.srq.query().unwrap().srq_limit, 2);
    assert_eq!(one(), []);
    assert_eq!(one(), []);
    assert_eq!(one(), [AsyncEvent::SrqLimitReached { srq }]);
    assert_eq!(one(), []);
    // Disarming with 0 keeps it quiet.
    for id in 10..13 {
        server.post(id);
    }
    server
        .srq
        .modify(
            &SrqAttr {
                srq_limit: 3,
                ..SrqAttr::default()
            },
            SrqAttrMask::LIMIT,
        )
        .unwrap();
    server
        .srq
        .modify(&SrqAttr::default(), SrqAttrMask::LIMIT)
        .unwrap();
    for _ in 0..3 {
        assert_eq!(one(), []);
    }
    drop(client);
}

#[test]
fn last_wqe_reached_when_an_srq_qp_leaves_service_and_the_srq_serves_on() {
    let (a, b) = devices(&Setup::default());
    let (client, server) = srq_pairs(&a, &b, 3, SrqAttr::new(16, 1), 16);
    for id in 0..6 {
        server.post(id);
    }
    let qpn: Vec<u32> = server.qps.iter().map(Qp::qp_num).collect();
    let recv_one = |c: usize, id: u64| {
        client.send(c, 0, id, b"one");
        let w = End::wait_n(&server.rcq, 1)[0];
        assert_eq!((w.wr_id, w.qp_num, w.byte_len), (id, qpn[c], 3));
    };
    recv_one(0, 0);
    recv_one(1, 1);
    // Modify to Error: Last WQE Reached, once; it held no WR, so nothing is flushed,
    // and the SRQ keeps its WRs.
    server.qps[0].modify_state(QpState::Error).unwrap();
    assert_eq!(
        async_events(&b.dev, Duration::from_millis(50)),
        [AsyncEvent::QpLastWqeReached { qp_num: qpn[0] }]
    );
    server.qps[0].modify_state(QpState::Error).unwrap();
    assert_eq!(async_events(&b.dev, Duration::from_millis(20)), []);
    assert!(server.rcq.is_empty());
    assert_eq!(server.srq.len(), 4);
    // The peer of the second disconnects: the same.
    client.conns[1].close(CloseMode::Graceful).unwrap();
    let deadline = Instant::now() + WAIT;
    while server.qps[1].state() != QpState::Error {
        assert!(Instant::now() < deadline, "server QP 1 still up");
        std::thread::sleep(Duration::from_millis(1));
    }
    let evs = async_events(&b.dev, Duration::from_millis(50));
    assert_eq!(
        evs.iter()
            .filter(|e| **e == AsyncEvent::QpLastWqeReached { qp_num: qpn[1] })
            .count(),
        1,
        "{evs:?}"
    );
    assert!(evs.iter().all(|e| e.qp_num() == Some(qpn[1])), "{evs:?}");
    assert!(server.rcq.is_empty());
    // The third QP takes the rest, in the SRQ's order.
    for id in 2..6 {
        recv_one(2, id);
    }
    assert!(server.srq.is_empty());
    // Destroying an SRQ QP reports nothing (siw: no event for a QP being destroyed).
    let Server { qps, srq, .. } = server;
    for qp in qps {
        qp.destroy().unwrap();
    }
    assert_eq!(async_events(&b.dev, Duration::from_millis(20)), []);
    srq.destroy().unwrap();
}

#[test]
fn device_removal_with_srq_receives_outstanding_completes_every_wr_once() {
    const QPS: usize = 2;
    const PER_QP: usize = 40;
    const POSTED: u64 = 100;
    let (a, b) = devices(&Setup::default());
    let (client, server) = srq_pairs(&a, &b, QPS, SrqAttr::new(128, 1), POSTED);
    for id in 0..POSTED {
        server.post(id);
    }
    let len = |c: usize, k: usize| 20_000 + (c * 31 + k * 977) % 40_000;
    let mut got = Vec::new();
    std::thread::scope(|s| {
        for c in 0..QPS {
            let client = &client;
            s.spawn(move || {
                for k in 0..PER_QP {
                    let data = pattern(len(c, k), (c * 1000 + k) as u64);
                    client.send(c, (c * PER_QP + k) as u64, k as u64, &data);
                }
            });
        }
        // Cut the server's link with messages in flight.
        got = End::wait_n(&server.rcq, 10);
        b.control.remove();
    });
    wait_device_gone(&b.dev);
    // Every WR posted to the SRQ completes exactly once: the ones done, the ones
    // taken by a message in progress and the ones still in the SRQ (flushed on the
    // receive CQ of its lowest-numbered QP).
    let deadline = Instant::now() + WAIT;
    while (got.len() as u64) < POSTED {
        assert!(
            Instant::now() < deadline,
            "{} of {POSTED} completions",
            got.len()
        );
        got.extend(
            server
                .rcq
                .poll_wait(256, Duration::from_millis(100))
                .unwrap(),
        );
    }
    std::thread::sleep(Duration::from_millis(20));
    assert!(server.rcq.is_empty(), "{:?}", server.rcq.poll(8));
    let ids: BTreeSet<u64> = got.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..POSTED).collect::<BTreeSet<_>>(), "each WR once");
    let mut per_qp = [0usize; QPS];
    let (mut ok, mut flushed, mut taken_flushed) = (0, 0, 0);
    for w in &got {
        let i = server.index_of(w.qp_num);
        match w.status {
            WcStatus::Success => {
                // Completed in order per QP: the k-th success of QP i is message k.
                let k = per_qp[i];
                per_qp[i] += 1;
                let want = pattern(len(i, k), (i * 1000 + k) as u64);
                assert_eq!(w.byte_len as usize, want.len());
                assert_eq!(server.slot(w.wr_id, want.len()), want, "QP {i} message {k}");
                ok += 1;
            }
            WcStatus::WrFlushErr => {
                // The WRs left in the SRQ go to its lowest-numbered QP (the first
                // created); any other QP flushes at most the WR its message in
                // progress had taken.
                if i > 0 {
                    taken_flushed += 1;
                }
                flushed += 1;
            }
            other => panic!("unexpected status {other:?} in {w:?}"),
        }
    }
    assert_eq!(ok + flushed, POSTED as usize);
    assert!(ok >= 10 && flushed > 0, "ok {ok}, flushed {flushed}");
    assert!(
        taken_flushed < QPS,
        "{taken_flushed} flushed off the lowest QP"
    );
    assert_eq!(server.srq.len(), 0);
    // The device is gone: posts refused, destroys still work (the SRQ once its QPs are
    // gone), and nothing completes after them.
    assert_eq!(
        server.srq.post_recv(RecvWr::new(999, vec![])),
        Err(VerbsError::DeviceGone)
    );
    assert_eq!(
        server.srq.destroy(),
        Err(VerbsError::InUse {
            object: ObjectKind::Srq
        })
    );
    let Server {
        qps, srq, rcq, scq, ..
    } = server;
    for qp in qps {
        assert_eq!(qp.state(), QpState::Error);
        qp.destroy().unwrap();
    }
    srq.destroy().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(rcq.is_empty() && scq.is_empty());
    drop(client);
}

#[test]
fn srq_errors_are_typed_and_carry_the_errno() {
    let (a, b) = devices(&Setup::default());
    let attr = a.dev.query_device();
    assert_eq!(
        (attr.max_srq, attr.max_srq_wr, attr.max_srq_sge),
        (1024, 1 << 15, 16)
    );
    let create = |max_wr, max_sge, srq_limit| {
        a.dev.create_srq(
            &a.pd,
            SrqAttr {
                max_wr,
                max_sge,
                srq_limit,
            },
        )
    };
    for (max_wr, max_sge, limit, what) in [
        (attr.max_srq_wr + 1, 1, 0, "max_wr"),
        (0, 1, 0, "max_wr"),
        (16, attr.max_srq_sge + 1, 0, "max_sge"),
        (16, 1, 17, "srq_limit"),
    ] {
        let e = create(max_wr, max_sge, limit).unwrap_err();
        assert_eq!(e, VerbsError::InvalidArgument { what });
        assert_eq!(e.errno(), errno::EINVAL);
    }
    // max_wr is rounded up to a power of two, as siw's.
    let srq = create(5, 2, 0).unwrap();
    assert_eq!(srq.query().unwrap(), SrqAttr::new(8, 2));
    assert_eq!(srq.pd(), a.pd.id());
    // Not resizable (siw: EOPNOTSUPP); a limit above max_wr is EINVAL.
    let e = srq
        .modify(&SrqAttr::new(16, 2), SrqAttrMask::MAX_WR)
        .unwrap_err();
    assert_eq!(
        e,
        VerbsError::Unsupported {
            what: "resizing an SRQ"
        }
    );
    assert_eq!(e.errno(), errno::EOPNOTSUPP);
    let high = SrqAttr {
        srq_limit: 9,
        ..SrqAttr::default()
    };
    assert_eq!(
        srq.modify(&high, SrqAttrMask::LIMIT).unwrap_err().errno(),
        errno::EINVAL
    );
    assert_eq!(srq.query().unwrap(), SrqAttr::new(8, 2), "unchanged");
    // Posts: SGEs beyond max_sge, then full at max_wr (ENOMEM); a list stops at the
    // first WR refused.
    let mr = a.pd.reg_mr(4096, 0, all_access()).unwrap();
    let e = srq
        .post_recv(RecvWr::new(1, vec![mr.sge(0, 8); 3]))
        .unwrap_err();
    assert_eq!(e, VerbsError::TooManySges { num_sge: 3, max: 2 });
    assert_eq!(e.errno(), errno::EINVAL);
    let e = srq
        .post_recv_list((0..9).map(|i| RecvWr::new(i, vec![mr.sge(i * 8, 8)])))
        .unwrap_err();
    assert_eq!(e.index, 8);
    assert_eq!(
        e.error,
        VerbsError::QueueFull {
            queue: WorkQueue::Recv,
            depth: 8
        }
    );
    assert_eq!(e.error.errno(), errno::ENOMEM);
    assert_eq!(srq.len(), 8);
    // A QP on the SRQ has no receive queue of its own: EINVAL.
    let cq = a.dev.create_cq(16).unwrap();
    let qp_attr = QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: cap(8, 1),
        sq_sig_all: false,
    };
    let qp = a.dev.create_qp_with_srq(&a.pd, qp_attr, &srq).unwrap();
    assert_eq!(qp.srq(), Some(srq.handle()));
    let q = qp.query_qp();
    assert_eq!((q.cap.max_recv_wr, q.cap.max_recv_sge), (0, 0));
    qp.modify_state(QpState::Init).unwrap();
    let e = qp.post_recv(RecvWr::new(1, vec![])).unwrap_err();
    assert_eq!(
        e,
        VerbsError::InvalidArgument {
            what: "qp with an SRQ"
        }
    );
    assert_eq!(e.errno(), errno::EINVAL);
    // In use: the SRQ cannot be destroyed (EBUSY), nor its PD deallocated.
    let e = srq.destroy().unwrap_err();
    assert_eq!(
        e,
        VerbsError::InUse {
            object: ObjectKind::Srq
        }
    );
    assert_eq!(e.errno(), errno::EBUSY);
    let pd = a.dev.alloc_pd().unwrap();
    let srq2 = a.dev.create_srq(&pd, SrqAttr::new(4, 1)).unwrap();
    assert_eq!(
        pd.dealloc(),
        Err(VerbsError::InUse {
            object: ObjectKind::Pd
        })
    );
    // Objects of another device are refused.
    assert!(matches!(
        b.dev.create_qp_with_srq(&b.pd, b_attr(&b), &srq),
        Err(VerbsError::NotPermitted { .. })
    ));
    assert!(matches!(
        b.dev.create_srq(&a.pd, SrqAttr::new(4, 1)),
        Err(VerbsError::NotPermitted { .. })
    ));
    // Once its QP is gone the SRQ is destroyed; its WRs are discarded, never completed.
    qp.destroy().unwrap();
    assert!(cq.is_empty());
    srq.destroy().unwrap();
    let gone = VerbsError::InvalidHandle {
        object: ObjectKind::Srq,
        handle: srq.handle(),
    };
    assert_eq!(srq.destroy(), Err(gone.clone()));
    assert_eq!(srq.query(), Err(gone.clone()));
    assert_eq!(srq.post_recv(RecvWr::new(1, vec![])), Err(gone.clone()));
    assert_eq!(
        srq.modify(&SrqAttr::default(), SrqAttrMask::LIMIT),
        Err(gone)
    );
    assert!(matches!(
        a.dev.create_qp_with_srq(&a.pd, qp_attr, &srq),
        Err(VerbsError::InvalidHandle {
            object: ObjectKind::Srq,
            ..
        })
    ));
    assert!(cq.is_empty());
    srq2.destroy().unwrap();
    pd.dealloc().unwrap();
    // After the device ended: DeviceGone.
    let srq3 = b.dev.create_srq(&b.pd, SrqAttr::new(4, 1)).unwrap();
    b.control.remove();
    wait_device_gone(&b.dev);
    assert_eq!(
        srq3.post_recv(RecvWr::new(1, vec![])),
        Err(VerbsError::DeviceGone)
    );
    assert!(matches!(
        b.dev.create_srq(&b.pd, SrqAttr::new(4, 1)),
        Err(VerbsError::DeviceGone)
    ));
    srq3.destroy().unwrap();
}

fn b_attr(b: &End) -> QpInitAttr<'_> {
    QpInitAttr {
        send_cq: &b.scq,
        recv_cq: &b.rcq,
        cap: cap(8, 1),
        sq_sig_all: false,
    }
}
