//! The server: listeners on one or two devices, accepts with receives kept posted, and
//! each connection ended when it ends.

use super::*;

/// Per QP of a server device: the QP, its purpose, its counts, whether to re-post
/// receives.
pub(super) type Accts = Arc<Mutex<HashMap<u32, (SoftQp, String, Acct, bool)>>>;

/// The verbs objects of one server device and its CQ poller.
pub(super) struct ServerDev {
    pub(super) name: String,
    pub(super) pd: Pd,
    pub(super) mr: Mr,
    pub(super) rmr: Mr,
    pub(super) cq: Arc<Cq>,
    pub(super) accts: Accts,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) poller: Option<JoinHandle<()>>,
}

pub(super) fn start_server_dev(
    rec: &Arc<Recorder>,
    sdev: &SoftDevice,
) -> Result<ServerDev, PeerError> {
    let dev = sdev.device();
    let e = PeerError::Verbs;
    let pd = dev.alloc_pd().map_err(e)?;
    let mr = pd
        .reg_mr(
            SERVER_MR,
            0x4000_0000,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .map_err(e)?;
    let rmr = pd
        .reg_mr(4096, 0x1000, AccessFlags::LOCAL_WRITE)
        .map_err(e)?;
    // One CQ for every QP of the device: it must hold every WR that can be outstanding
    // at once (64 load QPs of LOAD_RQ receives and 4 sends), since a disconnect flushes
    // them all in one pass of whichever thread drives (with ProgressMode::Hybrid the
    // poller itself, before it polls again: 16 Ki entries overflowed with 32 QPs).
    let cq = Arc::new(dev.create_cq(64 * (LOAD_RQ as usize + 4)).map_err(e)?);
    let accts: Accts = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let (c, a, s, r) = (cq.clone(), accts.clone(), stop.clone(), rec.clone());
    let sge = rmr.sge(0, 4096);
    let poller = std::thread::Builder::new()
        .name("cq-poller".into())
        .spawn(move || {
            while !s.load(Ordering::Acquire) {
                let wcs = match c.poll_wait(256, Duration::from_millis(20)) {
                    Ok(w) => w,
                    Err(e) => {
                        r.violation(format!("server CQ: {e}"));
                        return;
                    }
                };
                let mut accts = lock(&a);
                for wc in wcs {
                    let Some((qp, purpose, acct, repost)) = accts.get_mut(&wc.qp_num) else {
                        r.violation(format!("completion of unknown QP {}: {wc:?}", wc.qp_num));
                        continue;
                    };
                    acct.add(wc.status);
                    if wc.status == WcStatus::WrFlushErr && purpose == "load" {
                        r.notice(now_ns(), || format!("flushed WR on load QP {}", wc.qp_num));
                    }
                    if wc.status == WcStatus::Success
                        && *repost
                        && qp.post_recv(RecvWr::new(wc.wr_id, vec![sge])).is_ok()
                    {
                        acct.posted += 1;
                    }
                }
            }
        })
        .map_err(PeerError::Thread)?;
    Ok(ServerDev {
        name: dev.name().to_owned(),
        pd,
        mr,
        rmr,
        cq,
        accts,
        stop,
        poller: Some(poller),
    })
}

/// One incoming connection on the server.
pub(super) struct SConn {
    pub(super) id: Option<CmId<SoftDevice>>,
    pub(super) purpose: String,
    pub(super) qp: Option<(SoftQp, usize)>,
    pub(super) accept_at: Option<Instant>,
    pub(super) ended: Option<Instant>,
}

pub(super) fn run_server(args: &PeerArgs) -> Result<PeerReport, PeerError> {
    let (mut p, rx) = Peer::new(args)?;
    let mut devs = Vec::new();
    let first = p.add_device("siw_srv0", &args.link.tap, &args.link.ip)?;
    devs.push(start_server_dev(&p.rec, &first)?);
    drop(first);
    let wildcard = args.scenario == Scenario::Wildcard;
    if wildcard {
        let (tap, ip) = match (&args.extra_tap, &args.extra_ip) {
            (Some(t), Some(i)) => (t.clone(), i.clone()),
            _ => {
                return Err(PeerError::Usage(
                    "wildcard needs --extra-tap and --extra-ip".into(),
                ))
            }
        };
        let second = p.add_device("siw_srv1", &tap, &ip)?;
        devs.push(start_server_dev(&p.rec, &second)?);
        drop(second);
    }
    let listener = p.cm.create_id_shared(p.handler.clone());
    p.rec.track_ref(&listener, "listener");
    let bind_ip = if wildcard {
        Ipv4Addr::UNSPECIFIED
    } else {
        parse_ip(&args.link.ip)?.0
    };
    listener.bind_addr(SocketAddr::from((bind_ip, PORT)))?;
    listener.listen(64)?;
    let mut listener = Some(listener);
    println!("READY");
    let ready = Instant::now();
    let mut conns: HashMap<u64, SConn> = HashMap::new();
    let mut idle_since = Some(Instant::now());
    loop {
        while let Ok(n) = rx.try_recv() {
            server_note(&mut p, &mut conns, &mut listener, n);
        }
        if !p.newly_removed_peek().is_empty() {
            step("settle");
            p.settle_removals();
            step("settled");
        }
        let now = Instant::now();
        for c in conns.values_mut() {
            if c.accept_at.is_some_and(|t| t <= now) {
                c.accept_at = None;
                step(&format!("accept {}", c.purpose));
                server_accept(&p, &devs, c);
            }
        }
        // Finish the connections that ended: drain the QP, destroy the id and the QP.
        let ended: Vec<u64> = conns
            .iter()
            .filter(|(_, c)| c.ended.is_some())
            .map(|(s, _)| *s)
            .collect();
        for s in ended {
            if let Some(c) = conns.remove(&s) {
                step(&format!("finish {}", c.purpose));
                server_finish(&mut p, &devs, c);
            }
        }
        if conns.is_empty() {
            idle_since.get_or_insert(now);
        } else {
            idle_since = None;
        }
        let idle = idle_since.is_some_and(|t| t.elapsed() >= Duration::from_millis(args.idle_ms));
        let done = (idle && (p.established >= args.expect_connections || listener.is_none()))
            || (p.established == 0
                && conns.is_empty()
                && ready.elapsed() >= Duration::from_millis(args.first_connection_ms));
        if done && !p.removal_pending() && !p.action_pending() {
            step("idle");
            break;
        }
        if p.out_of_time() {
            p.rec.violation(format!(
                "server still has {} connections after {} s",
                conns.len(),
                args.max_secs
            ));
            for c in conns.values_mut() {
                c.ended.get_or_insert(now);
            }
            for (_, c) in conns.drain() {
                server_finish(&mut p, &devs, c);
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if let Some(l) = listener.take() {
        p.rec.destroy(l);
    }
    // Late notes (a request that came in as we stopped): destroy their ids.
    while let Ok(n) = rx.try_recv() {
        if let Some(id) = n.new_id {
            p.rec.destroy(id);
        }
    }
    for mut d in devs {
        d.stop.store(true, Ordering::Release);
        if let Some(h) = d.poller.take() {
            join_within(&p.rec, "CQ poller", h, Duration::from_secs(2));
        }
        let left = lock(&d.accts).len();
        if left != 0 {
            p.rec
                .violation(format!("{}: {left} QPs never finished", d.name));
        }
        drop((d.mr, d.rmr, d.cq, d.pd));
    }
    step("pollers-joined");
    Ok(p.finish())
}

impl Peer {
    /// True while one of our devices has ended (its link is gone: the engine noticed)
    /// and the CM still lists it: its removal is under way and its `DeviceRemoval`
    /// events are still to come. On a loaded machine this can last longer than any
    /// linger: a peer must not take it for "no removal".
    pub(super) fn removal_pending(&self) -> bool {
        let listed = self.cm.devices();
        self.devices
            .iter()
            .any(|d| d.device().ended().is_some() && listed.contains(&d.device().name().to_owned()))
    }

    /// True while the harness's action may still be under way: `--acted-file` given and
    /// not created yet, and none of our devices removed (a removal seen is the action's
    /// end for this peer; waiting on would also wait for itself, since `ip link del` of
    /// a TAP returns only once the peer's device closed the TAP's fd).
    pub(super) fn action_pending(&self) -> bool {
        self.args.acted_file.as_ref().is_some_and(|f| !f.exists())
            && self.removed.is_empty()
            && self.newly_removed_peek().is_empty()
    }

    pub(super) fn newly_removed_peek(&self) -> Vec<String> {
        let listed = self.cm.devices();
        self.devices
            .iter()
            .map(|d| d.device().name().to_owned())
            .filter(|n| !listed.contains(n) && !self.removed.contains(n))
            .collect()
    }
}

pub(super) fn server_note(
    p: &mut Peer,
    conns: &mut HashMap<u64, SConn>,
    listener: &mut Option<CmId<SoftDevice>>,
    n: Note,
) {
    let now = Instant::now();
    if let Some(id) = n.new_id {
        let purpose = match n.private_data.first() {
            Some(b'L') => "load",
            Some(b'C') => "churn",
            Some(b'A') => "after",
            _ => "passive",
        };
        let hold = purpose == "churn" && p.args.hold_accept_ms > 0;
        let accept_at = Some(if hold {
            now + Duration::from_millis(p.args.hold_accept_ms)
        } else {
            now
        });
        conns.insert(
            id.serial(),
            SConn {
                id: Some(id),
                purpose: purpose.into(),
                qp: None,
                accept_at,
                ended: None,
            },
        );
        return;
    }
    if listener.as_ref().is_some_and(|l| l.serial() == n.serial) {
        if n.kind == EventKind::DeviceRemoval {
            if let Some(l) = listener.take() {
                p.rec.destroy(l);
            }
        }
        return;
    }
    let Some(c) = conns.get_mut(&n.serial) else {
        return;
    };
    match n.kind {
        EventKind::Established => {
            p.established += 1;
            if !p.removed.is_empty() || !p.newly_removed_peek().is_empty() {
                p.established_after += 1;
            }
        }
        k if is_end(k) => {
            if c.purpose == "load" {
                p.load_ends.push((n.t_ns, format!("{k:?}")));
            }
            c.ended.get_or_insert(now);
        }
        _ => {}
    }
}

pub(super) fn server_accept(p: &Peer, devs: &[ServerDev], c: &mut SConn) {
    let Some(id) = &c.id else { return };
    let fail = |c: &mut SConn, why: String| {
        tracing::debug!(why, "accept failed");
        c.ended.get_or_insert(Instant::now());
    };
    let Some(di) = id
        .device_name()
        .and_then(|n| devs.iter().position(|d| d.name == n))
    else {
        return fail(c, "no device".into());
    };
    let d = &devs[di];
    let rq = if c.purpose == "load" { LOAD_RQ } else { 8 };
    let qp = match id.create_qp(
        &d.pd,
        QpInitAttr {
            send_cq: &d.cq,
            recv_cq: &d.cq,
            cap: cap(4, rq),
            sq_sig_all: true,
        },
    ) {
        Ok(qp) => qp,
        Err(e) => return fail(c, e.to_string()),
    };
    lock(&d.accts).insert(
        qp.qp_num(),
        (qp.clone(), c.purpose.clone(), Acct::default(), true),
    );
    c.qp = Some((qp.clone(), di));
    let sge = d.rmr.sge(0, 4096);
    let post = |from: u32| {
        let mut accts = lock(&d.accts);
        let mut n = from;
        if let Some((_, _, acct, _)) = accts.get_mut(&qp.qp_num()) {
            while n < rq && qp.post_recv(RecvWr::new(u64::from(n), vec![sge])).is_ok() {
                acct.posted += 1;
                n += 1;
            }
        }
        n
    };
    // Receives first (rdma_create_qp leaves the QP in INIT), so that the client's
    // first Send finds one; if this QP refuses them before accept, after it.
    let posted = post(0);
    let pdata = [
        d.mr.iova().to_be_bytes().as_slice(),
        d.mr.rkey().raw().to_be_bytes().as_slice(),
    ]
    .concat();
    if let Err(e) = id.accept(&param(pdata)) {
        return fail(c, e.to_string());
    }
    if posted < rq {
        post(posted);
    }
    let _ = p;
}

pub(super) fn server_finish(p: &mut Peer, devs: &[ServerDev], mut c: SConn) {
    if let Some((qp, di)) = c.qp.take() {
        let d = &devs[di];
        let qpn = qp.qp_num();
        if let Some(e) = lock(&d.accts).get_mut(&qpn) {
            e.3 = false;
        }
        // The connection ended: the QP is in ERROR and flushes what it holds.
        let deadline = Instant::now() + Duration::from_millis(1500);
        let acct = loop {
            let a = lock(&d.accts).get(&qpn).map(|e| e.2.clone());
            match a {
                Some(a) if a.posted == a.completed || Instant::now() >= deadline => break a,
                None => break Acct::default(),
                _ => std::thread::sleep(Duration::from_millis(2)),
            }
        };
        let state = qp.state();
        lock(&d.accts).remove(&qpn);
        let q = acct.report(qpn, &c.purpose, state);
        check_qp(&p.rec, &q);
        p.qps.push(q);
        if let Some(id) = c.id.take() {
            p.rec.destroy(id);
        }
        destroy_qp(qp);
    } else if let Some(id) = c.id.take() {
        p.rec.destroy(id);
    }
}
