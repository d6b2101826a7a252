//! The client: long-lived connections with load, the churn loop, and the scenarios
//! after a removal (re-add, wildcard).

use super::*;

/// A connection set up by the client: its id, its events, its verbs objects.
pub(super) struct CConn {
    pub(super) id: CmId<SoftDevice>,
    pub(super) rx: Receiver<Note>,
    pub(super) pd: Pd,
    pub(super) cq: Cq,
    pub(super) qp: SoftQp,
    pub(super) remote: (u64, Stag),
    pub(super) target: Ipv4Addr,
    pub(super) purpose: &'static str,
}

/// Why a connection set-up stopped (logged with `Debug`).
#[derive(Debug)]
#[allow(dead_code)] // the fields are read through Debug, in logs and violations
pub(super) enum SetupEnd {
    /// An event ended it (the id was destroyed).
    Event(EventKind),
    /// A call failed or nothing came in time (the id was destroyed).
    Failed(String),
}

/// Resolve, route, QP, connect, Established; on failure the id is destroyed.
pub(super) fn setup_conn(
    p: &Ctx,
    target: Ipv4Addr,
    purpose: &'static str,
    tag: &[u8],
    stop: Option<&AtomicBool>,
    before_connect: impl FnOnce(&CmIdRef<SoftDevice>),
) -> Result<CConn, SetupEnd> {
    let (id, rx) = p.create_id(purpose);
    let rec = &p.rec;
    let fail = |id: CmId<SoftDevice>, e: SetupEnd| {
        rec.destroy(id);
        Err(e)
    };
    let expect = |rx: &Receiver<Note>, kind: EventKind, t: Duration| -> Result<Note, SetupEnd> {
        match wait_note(rx, t, stop) {
            Some(n) if n.kind == kind => Ok(n),
            Some(n) => Err(SetupEnd::Event(n.kind)),
            None => Err(SetupEnd::Failed(format!("no {kind:?}"))),
        }
    };
    let dst = SocketAddr::from((target, PORT));
    if let Err(e) = id.resolve_addr(None, dst, Duration::from_secs(1)) {
        return fail(id, SetupEnd::Failed(e.to_string()));
    }
    if let Err(e) = expect(&rx, EventKind::AddrResolved, Duration::from_secs(3)) {
        return fail(id, e);
    }
    if let Err(e) = id.resolve_route(Duration::from_secs(1)) {
        return fail(id, SetupEnd::Failed(e.to_string()));
    }
    if let Err(e) = expect(&rx, EventKind::RouteResolved, Duration::from_secs(3)) {
        return fail(id, e);
    }
    let Some(sdev) = id.device() else {
        return fail(id, SetupEnd::Failed("no device".into()));
    };
    let dev = sdev.device().clone();
    let verbs = (|| {
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq(CLIENT_CQ)?;
        Ok::<_, verbs::VerbsError>((pd, cq))
    })();
    let (pd, cq) = match verbs {
        Ok(v) => v,
        Err(e) => return fail(id, SetupEnd::Failed(e.to_string())),
    };
    let qp = match id.create_qp(
        &pd,
        QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: cap(LOAD_SQ, CLIENT_RQ),
            sq_sig_all: true,
        },
    ) {
        Ok(qp) => qp,
        Err(e) => return fail(id, SetupEnd::Failed(e.to_string())),
    };
    before_connect(&id);
    if let Err(e) = id.connect(&param(tag.to_vec())) {
        drop(qp);
        return fail(id, SetupEnd::Failed(e.to_string()));
    }
    let t = Duration::from_millis(p.hold_accept_ms + 3000);
    let est = match expect(&rx, EventKind::Established, t) {
        Ok(n) => n,
        Err(e) => {
            drop(qp);
            return fail(id, e);
        }
    };
    let pd8 = &est.private_data;
    if pd8.len() < 12 {
        drop(qp);
        return fail(id, SetupEnd::Failed("short private data".into()));
    }
    let addr = u64::from_be_bytes(pd8[..8].try_into().unwrap_or([0; 8]));
    let rkey = Stag::from_raw(u32::from_be_bytes(pd8[8..12].try_into().unwrap_or([0; 4])));
    Ok(CConn {
        id,
        rx,
        pd,
        cq,
        qp,
        remote: (addr, rkey),
        target,
        purpose,
    })
}

/// Drains `cq` until `acct.completed == acct.posted` or `timeout`. A CQ that overflowed
/// is a violation naming the completions lost ([`poll_into_acct`]).
pub(super) fn drain(rec: &Recorder, cq: &Cq, acct: &mut Acct, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while acct.completed < acct.posted && Instant::now() < deadline {
        if poll_into_acct(rec, cq, acct, Duration::from_millis(10)).is_err() {
            return;
        }
    }
}

/// Waits up to `wait` for completions on `cq` and counts every one taken in `acct`
/// (a flushed load WR is a notice). Returns how many were taken.
///
/// # Errors
///
/// The CQ's own error (an overflow: `lost` completions that did not fit; or a
/// destroyed CQ), after it was recorded as a violation: a test peer never loses a
/// completion silently.
pub(super) fn poll_into_acct(
    rec: &Recorder,
    cq: &Cq,
    acct: &mut Acct,
    wait: Duration,
) -> Result<usize, softiwarp::CqError> {
    match cq.poll_wait(64, wait) {
        Ok(wcs) => {
            for wc in &wcs {
                acct.add(wc.status);
                if !wc.opcode.is_recv() {
                    acct.send_completed += 1;
                }
                if wc.status == WcStatus::WrFlushErr {
                    rec.notice(now_ns(), || format!("flushed WR on QP {}", wc.qp_num));
                }
            }
            Ok(wcs.len())
        }
        Err(e) => {
            rec.violation(format!("CQ {:#x} of this peer: {e}", cq.handle()));
            Err(e)
        }
    }
}

/// The load of one connection: Writes, Reads and Sends kept in flight until `stop` or
/// the QP leaves RTS; then drained. Returns the counts and the verbs objects.
pub(super) fn load_worker(
    rec: Arc<Recorder>,
    c: LoadParts,
    slot: u64,
    stop: Arc<AtomicBool>,
    until_full: bool,
) -> (Acct, LoadParts) {
    let mut acct = Acct::default();
    let e = |e| format!("{e}");
    let mrs = (|| {
        let src =
            c.pd.reg_mr(u64::from(LOAD_LEN), 0x10_0000, AccessFlags::LOCAL_WRITE)?;
        let dst =
            c.pd.reg_mr(u64::from(LOAD_LEN), 0x20_0000, AccessFlags::LOCAL_WRITE)?;
        Ok::<_, verbs::VerbsError>((src, dst))
    })();
    let (src, dst) = match mrs {
        Ok(m) => m,
        // The removal reached this device before the worker's first registration (a
        // worker thread scheduled late on a loaded machine): the error a real program
        // gets then, and its notice of the removal, not a violation.
        Err(verbs::VerbsError::DeviceGone) => {
            rec.notice(now_ns(), || "load MRs: device removed".into());
            return (acct, c);
        }
        Err(err) => {
            rec.violation(format!("load MRs: {}", e(err)));
            return (acct, c);
        }
    };
    // 64 KiB per slot within the server's MR: more than 16 load QPs share slots (a
    // slot past the MR's end was a base-or-bounds Terminate from the server).
    let rbase = c.remote.0 + (slot % (SERVER_MR / (64 * 1024))) * 64 * 1024;
    for i in 0..CLIENT_RQ {
        if c.qp
            .post_recv(RecvWr::new(
                1_000_000 + u64::from(i),
                vec![dst.sge(0, LOAD_LEN)],
            ))
            .is_ok()
        {
            acct.posted += 1;
        }
    }
    // As a real program posts: at most the send queue's depth of signaled WRs
    // outstanding (posted and not yet polled), polling as it goes. A send-queue slot
    // frees when its WR completes, polled or not (as in siw), so QueueFull alone would
    // let completions pile up past the CQ's capacity.
    let mut n: u64 = 0;
    let mut posting = true;
    while posting {
        if stop.load(Ordering::Acquire) || c.qp.state() != QpState::Rts {
            break;
        }
        while until_full || acct.sends_outstanding() < u64::from(LOAD_SQ) {
            let wr = match n % 8 {
                1 | 4 => {
                    SendWr::rdma_read(n, vec![dst.sge(0, LOAD_LEN)], rbase + 32 * 1024, c.remote.1)
                }
                7 => SendWr::send(n, vec![src.sge(0, SEND_LEN)]),
                _ => SendWr::rdma_write(n, vec![src.sge(0, LOAD_LEN)], rbase, c.remote.1),
            };
            match c.qp.post_send(wr.with_flags(SendFlags::SIGNALED)) {
                Ok(()) => {
                    acct.posted += 1;
                    acct.send_posted += 1;
                    n += 1;
                }
                Err(verbs::VerbsError::QueueFull { .. }) => break,
                Err(_) => {
                    posting = false;
                    break;
                }
            }
            if c.qp.state() != QpState::Rts {
                break;
            }
        }
        if poll_into_acct(&rec, &c.cq, &mut acct, Duration::from_millis(20)).is_err() {
            break;
        }
    }
    // Wait for the end of the connection (the QP goes to ERROR), then drain.
    while !stop.load(Ordering::Acquire) && c.qp.state() == QpState::Rts {
        std::thread::sleep(Duration::from_millis(2));
    }
    drain(&rec, &c.cq, &mut acct, Duration::from_millis(1500));
    drop((src, dst));
    (acct, c)
}

/// What a load thread takes and gives back.
pub(super) struct LoadParts {
    pub(super) pd: Pd,
    pub(super) cq: Cq,
    pub(super) qp: SoftQp,
    pub(super) remote: (u64, Stag),
}

/// A long-lived connection while its load runs.
pub(super) struct Running {
    pub(super) id: CmId<SoftDevice>,
    pub(super) rx: Receiver<Note>,
    pub(super) target: Ipv4Addr,
    pub(super) purpose: &'static str,
    pub(super) qpn: u32,
    pub(super) ended: Option<(u64, EventKind)>,
    pub(super) worker: Option<JoinHandle<(Acct, LoadParts)>>,
    pub(super) stop: Arc<AtomicBool>,
}

pub(super) fn run_client(args: &PeerArgs) -> Result<PeerReport, PeerError> {
    let (mut p, _default_rx) = Peer::new(args)?;
    let first = *args
        .peer_ips
        .first()
        .ok_or_else(|| PeerError::Usage("--peer-ip is required".into()))?;
    p.add_device("siw_cli0", &args.link.tap, &args.link.ip)?;
    println!("READY");
    std::thread::sleep(Duration::from_millis(args.start_delay_ms));
    let mut running: Vec<Running> = Vec::new();
    p.rec.set_phase("connect");
    for i in 0..args.load_qps {
        let target = args.peer_ips[i % args.peer_ips.len()];
        match setup_conn(&p.ctx(), target, "load", LOAD_TAG, None, |_| {}) {
            Ok(c) => running.push(start_load(&mut p, c, i as u64)),
            Err(e) => {
                tracing::info!(?e, "load connection not set up");
                p.load_ends.push((now_ns(), format!("setup: {e:?}")));
                break;
            }
        }
    }
    // The scenario's extra connection.
    let mut held: Option<CConn> = None;
    let mut blocked: Option<JoinHandle<(u64, u64)>> = None;
    if matches!(args.scenario, Scenario::Seed | Scenario::DestroyBlocked)
        && running.len() == args.load_qps
    {
        let (dispo, announce) = if args.scenario == Scenario::Seed {
            (Disposition::Destroy, "IN_CALLBACK")
        } else {
            (Disposition::Keep, "HOLDING")
        };
        let rec = p.rec.clone();
        let ms = args.hold_ms;
        let r = setup_conn(&p.ctx(), first, "held", LOAD_TAG, None, |id| {
            *lock(&rec.hold) = Some(Hold {
                serial: id.serial(),
                on: EventKind::Established,
                ms,
                dispo,
                announce,
            });
        });
        match r {
            Ok(c) => held = Some(c),
            Err(e) => p.rec.violation(format!("held connection: {e:?}")),
        }
        if args.scenario == Scenario::DestroyBlocked {
            if let Some(c) = held.take() {
                let (id, rec) = (c.id, p.rec.clone());
                let h = std::thread::Builder::new()
                    .name("destroyer".into())
                    .spawn(move || {
                        let t0 = now_ns();
                        println!("DESTROY_START {} {t0}", id.serial());
                        rec.destroy(id);
                        let t1 = now_ns();
                        println!("DESTROY_DONE {t1}");
                        (t0, t1)
                    })
                    .map_err(PeerError::Thread)?;
                std::thread::sleep(Duration::from_millis(50));
                if h.is_finished() {
                    p.rec.violation(
                        "destroy returned while a callback of its id was running".into(),
                    );
                } else {
                    println!("DESTROY_BLOCKED {}", now_ns());
                }
                blocked = Some(h);
                p.qps.push(QpReport {
                    qpn: c.qp.qp_num(),
                    purpose: "held".into(),
                    final_state: "Error".into(),
                    ..QpReport::default()
                });
                destroy_qp(c.qp);
                drop((c.cq, c.pd));
            }
        }
    }
    p.established = running.len() + usize::from(held.is_some());
    p.rec.set_phase("load");
    // The churn.
    let churn_stop = Arc::new(AtomicBool::new(false));
    let churn = if args.churn && !running.is_empty() {
        Some(spawn_churn(&p, first, churn_stop.clone())?)
    } else {
        None
    };
    // Wait for the long-lived connections to end.
    let wildcard = args.scenario == Scenario::Wildcard;
    loop {
        for r in &mut running {
            while let Ok(n) = r.rx.try_recv() {
                if is_end(n.kind) && r.ended.is_none() {
                    r.ended = Some((n.t_ns, n.kind));
                    p.load_ends.push((n.t_ns, format!("{:?}", n.kind)));
                }
            }
        }
        let waiting = running
            .iter()
            .filter(|r| r.ended.is_none() && !(wildcard && r.target == first))
            .count();
        if waiting == 0 || p.out_of_time() {
            if waiting != 0 {
                p.rec.violation(format!(
                    "{waiting} load connections still up after {} s",
                    args.max_secs
                ));
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if let Some(h) = &held {
        // Seed scenario: the held id was destroyed by its callback's return.
        let _ = h;
    }
    step("loads-ended");
    // Wait a little for our own device's removal (the survivor has none), and for as
    // long as it takes (within --max-secs) once the device has ended or while the
    // harness's action is under way.
    let deadline = Instant::now() + Duration::from_millis(args.linger_ms);
    while p.newly_removed_peek().is_empty()
        && (Instant::now() < deadline || p.removal_pending() || p.action_pending())
        && !p.out_of_time()
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    p.settle_removals();
    // Connections made after the removal (wildcard: to the surviving address).
    for _ in 0..args.after_removal {
        after_conn(&mut p, first, "after");
    }
    step("settled");
    // Stop the churn, then the load; end what is still connected.
    churn_stop.store(true, Ordering::Release);
    if let Some(h) = churn {
        if let Some((cycles, qps)) = join_within(&p.rec, "churn", h, Duration::from_secs(3)) {
            p.report.churn_cycles = cycles;
            p.qps.extend(qps);
        }
    }
    for r in &mut running {
        if r.ended.is_none() {
            if let Err(e) = r.id.disconnect() {
                tracing::debug!(error = %e, "disconnect");
            }
            match wait_note(&r.rx, Duration::from_secs(3), None) {
                Some(n) if is_end(n.kind) => {
                    r.ended = Some((n.t_ns, n.kind));
                }
                other => p.rec.violation(format!(
                    "no Disconnected after disconnect: {:?}",
                    other.map(|n| n.kind)
                )),
            }
        }
        r.stop.store(true, Ordering::Release);
    }
    step("churn-joined");
    for r in running {
        let rec = p.rec.clone();
        let Some((acct, parts)) = r
            .worker
            .and_then(|w| join_within(&rec, "load", w, Duration::from_secs(3)))
        else {
            continue;
        };
        let q = acct.report(r.qpn, r.purpose, parts.qp.state());
        check_qp(&p.rec, &q);
        p.qps.push(q);
        p.rec.destroy(r.id);
        destroy_qp(parts.qp);
        drop((parts.cq, parts.pd));
    }
    if let Some(c) = held.take() {
        // Seed scenario: destroyed by the callback's return; our handle is inert.
        let q = QpReport {
            qpn: c.qp.qp_num(),
            purpose: "held".into(),
            final_state: format!("{:?}", c.qp.state()),
            ..QpReport::default()
        };
        p.qps.push(q);
        p.rec.destroy(c.id);
        destroy_qp(c.qp);
        drop((c.cq, c.pd));
    }
    if let Some(h) = blocked {
        p.report.blocked_destroy_ns = join_within(&p.rec, "destroyer", h, Duration::from_secs(3));
    }
    p.settle_removals();
    if args.scenario == Scenario::Readd {
        p.report.readd_ok = Some(readd(&mut p, first));
    }
    Ok(p.finish())
}

pub(super) fn start_load(p: &mut Peer, c: CConn, slot: u64) -> Running {
    let stop = Arc::new(AtomicBool::new(false));
    let qpn = c.qp.qp_num();
    let parts = LoadParts {
        pd: c.pd,
        cq: c.cq,
        qp: c.qp,
        remote: c.remote,
    };
    let (rec, s, full) = (p.rec.clone(), stop.clone(), p.args.post_until_full);
    let worker = std::thread::Builder::new()
        .name(format!("load-{slot}"))
        .spawn(move || load_worker(rec, parts, slot, s, full))
        .ok();
    if worker.is_none() {
        p.rec.violation("cannot start a load thread".into());
    }
    Running {
        id: c.id,
        rx: c.rx,
        target: c.target,
        purpose: c.purpose,
        qpn,
        ended: None,
        worker,
        stop,
    }
}

/// One short connection: an RDMA Write that must succeed, disconnect, destroy.
/// Returns whether all of it worked.
pub(super) fn after_conn(p: &mut Peer, target: Ipv4Addr, purpose: &'static str) -> bool {
    let c = match setup_conn(&p.ctx(), target, purpose, AFTER_TAG, None, |_| {}) {
        Ok(c) => c,
        Err(e) => {
            p.rec
                .violation(format!("{purpose} connection failed: {e:?}"));
            return false;
        }
    };
    p.established += 1;
    if !p.removed.is_empty() {
        p.established_after += 1;
    }
    let mut acct = Acct::default();
    let ok = (|| {
        let mr = c.pd.reg_mr(4096, 0x7000, AccessFlags::LOCAL_WRITE).ok()?;
        mr.write(0, &[0xab; 4096]).ok()?;
        let wr = SendWr::rdma_write(1, vec![mr.sge(0, 4096)], c.remote.0, c.remote.1);
        c.qp.post_send(wr.with_flags(SendFlags::SIGNALED)).ok()?;
        acct.posted += 1;
        let wcs = c.cq.poll_wait(1, Duration::from_secs(3)).ok()?;
        let ok = wcs.first().map(|w| w.status) == Some(WcStatus::Success);
        for w in wcs {
            acct.add(w.status);
        }
        Some(ok)
    })()
    .unwrap_or(false);
    if !ok {
        p.rec
            .violation(format!("{purpose}: the RDMA Write did not succeed"));
    }
    let _ = c.id.disconnect();
    let ended = wait_note(&c.rx, Duration::from_secs(3), None);
    if !ended
        .as_ref()
        .is_some_and(|n| n.kind == EventKind::Disconnected)
    {
        p.rec.violation(format!(
            "{purpose}: no Disconnected: {:?}",
            ended.map(|n| n.kind)
        ));
    }
    drain(&p.rec, &c.cq, &mut acct, Duration::from_secs(1));
    let q = acct.report(c.qp.qp_num(), purpose, c.qp.state());
    check_qp(&p.rec, &q);
    p.qps.push(q);
    p.rec.destroy(c.id);
    destroy_qp(c.qp);
    ok
}

/// Readd: once the removed device was released, open a new one on the re-created TAP
/// and use it with a new id.
pub(super) fn readd(p: &mut Peer, target: Ipv4Addr) -> bool {
    if p.removed.is_empty() {
        p.rec.violation("readd: our device was not removed".into());
        return false;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while p.cm.stats().devices_held != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    if p.cm.stats().devices_held != 0 {
        p.rec
            .violation("readd: the removed device was not released".into());
        return false;
    }
    println!("WAITING_FOR_TAP {}", now_ns());
    let deadline = Instant::now() + Duration::from_secs(10);
    let dev = loop {
        match open_device(
            "siw_cli0",
            &p.args.link.tap,
            &p.args.link.ip.clone(),
            &p.args,
        ) {
            Ok(d) => break d,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                p.rec.violation(format!("readd: {e}"));
                return false;
            }
        }
    };
    // The removed device's name is free again once released.
    let sdev = match SoftDevice::new(dev) {
        Ok(s) => s,
        Err(e) => {
            p.rec.violation(format!("readd: {e}"));
            return false;
        }
    };
    if let Err(e) = p.cm.add_device(sdev.clone()) {
        p.rec.violation(format!("readd: add_device: {e}"));
        return false;
    }
    p.devices.push(sdev);
    p.added.fetch_add(1, Ordering::AcqRel);
    p.removed.retain(|n| n != "siw_cli0");
    println!("READDED {}", now_ns());
    after_conn(p, target, "readd")
}

/// The churn thread: connection set-up and teardown in a loop until `stop`; returns
/// the cycles started and the QPs it used.
pub(super) fn spawn_churn(
    p: &Peer,
    target: Ipv4Addr,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<(usize, Vec<QpReport>)>, PeerError> {
    let ctx = p.ctx();
    let slow = p.args.slow_resolve;
    std::thread::Builder::new()
        .name("churn".into())
        .spawn(move || churn_loop(&ctx, slow, target, &stop))
        .map_err(PeerError::Thread)
}

pub(super) fn churn_loop(
    ctx: &Ctx,
    slow: bool,
    target: Ipv4Addr,
    stop: &AtomicBool,
) -> (usize, Vec<QpReport>) {
    let mut cycles = 0;
    let mut qps = Vec::new();
    while !stop.load(Ordering::Acquire) {
        cycles += 1;
        if slow && cycles % 3 == 0 {
            // A resolution that stays pending (nobody answers ARP) for 600 ms.
            let (id, rx) = ctx.create_id("churn");
            ctx.rec.set_phase("resolve-slow");
            let dst = SocketAddr::from((SILENT_IP, PORT));
            if id
                .resolve_addr(None, dst, Duration::from_millis(600))
                .is_ok()
            {
                let _ = wait_note(&rx, Duration::from_secs(2), Some(stop));
            } else {
                std::thread::sleep(Duration::from_millis(20));
            }
            ctx.rec.destroy(id);
            continue;
        }
        ctx.rec.set_phase("resolve");
        let c = match setup_conn(ctx, target, "churn", CHURN_TAG, Some(stop), |_| {
            ctx.rec.set_phase("mpa")
        }) {
            Ok(c) => c,
            Err(SetupEnd::Failed(_)) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(SetupEnd::Event(_)) => continue,
        };
        ctx.rec.set_phase("established");
        let mut acct = Acct::default();
        if let Ok(mr) = c.pd.reg_mr(4096, 0x7000, AccessFlags::LOCAL_WRITE) {
            let wr = SendWr::rdma_write(1, vec![mr.sge(0, 4096)], c.remote.0, c.remote.1);
            if c.qp.post_send(wr.with_flags(SendFlags::SIGNALED)).is_ok() {
                acct.posted += 1;
                drain(&ctx.rec, &c.cq, &mut acct, Duration::from_secs(2));
            }
        }
        ctx.rec.set_phase("disconnect");
        let ended = match c.id.disconnect() {
            Ok(()) => {
                wait_note(&c.rx, Duration::from_secs(3), Some(stop)).is_some_and(|n| is_end(n.kind))
            }
            Err(_) => false,
        };
        ctx.rec.set_phase("destroy");
        let state = c.qp.state();
        ctx.rec.destroy(c.id);
        drain(&ctx.rec, &c.cq, &mut acct, Duration::from_secs(1));
        let q = acct.report(c.qp.qp_num(), "churn", state);
        if ended {
            check_qp(&ctx.rec, &q);
        } else if q.posted != q.completed {
            ctx.rec.violation(format!(
                "churn QP {}: {} posted, {} completed",
                q.qpn, q.posted, q.completed
            ));
        }
        qps.push(q);
        destroy_qp(c.qp);
        drop((c.cq, c.pd));
    }
    (cycles, qps)
}
