//! Devices and accounting: opening a soft device on a TAP, QP work counted and checked,
//! the peer's shared state ([`run_peer`]) and its end-of-run checks.

use super::*;

pub(super) fn parse_ip(s: &str) -> Result<(Ipv4Addr, u8), PeerError> {
    netlab::parse_cidr(s).map_err(PeerError::Usage)
}

/// Opens a soft device on `tap` with a short TCP timeout (the peer on the other side
/// must notice a vanished device quickly) and a per-process random seed (a re-added
/// device must not reuse the old connections' ports).
pub(super) fn open_device(
    name: &str,
    tap: &str,
    ip: &str,
    a: &PeerArgs,
) -> Result<Arc<Device>, PeerError> {
    let (addr, prefix) = parse_ip(ip)?;
    let mut cfg = DeviceConfig::new(name, LinkConfig::tap(tap), addr, prefix);
    cfg.tcp = TcpConfig {
        keep_alive: Some(Duration::from_millis(a.keepalive_ms)),
        timeout: Some(Duration::from_millis(a.tcp_timeout_ms)),
        ..TcpConfig::default()
    };
    cfg.interface.random_seed ^= now_ns() ^ a.seed.rotate_left(17);
    Device::open(cfg)
        .map(Arc::new)
        .map_err(|source| PeerError::Open {
            tap: tap.to_owned(),
            source,
        })
}

pub(super) fn param(private_data: Vec<u8>) -> ConnParam {
    ConnParam {
        private_data,
        responder_resources: 4,
        initiator_depth: 4,
        ..ConnParam::default()
    }
}

pub(super) fn cap(sq: u32, rq: u32) -> QpCap {
    QpCap {
        max_send_wr: sq,
        max_recv_wr: rq,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Counts completions of one QP.
#[derive(Default, Clone)]
pub(super) struct Acct {
    pub(super) posted: u64,
    pub(super) completed: u64,
    pub(super) success: u64,
    pub(super) flushed: u64,
    pub(super) errors: u64,
    /// Of `posted`: send-queue WRs (all signaled).
    pub(super) send_posted: u64,
    /// Of `completed`: completions of send-queue WRs.
    pub(super) send_completed: u64,
}

impl Acct {
    /// Send-queue WRs posted and not yet polled: what the CQ may have to hold for
    /// them.
    pub(super) fn sends_outstanding(&self) -> u64 {
        self.send_posted.saturating_sub(self.send_completed)
    }

    pub(super) fn add(&mut self, status: WcStatus) {
        self.completed += 1;
        match status {
            WcStatus::Success => self.success += 1,
            WcStatus::WrFlushErr => self.flushed += 1,
            _ => self.errors += 1,
        }
    }

    pub(super) fn report(&self, qpn: u32, purpose: &str, state: QpState) -> QpReport {
        QpReport {
            qpn,
            purpose: purpose.to_owned(),
            posted: self.posted,
            completed: self.completed,
            success: self.success,
            flushed: self.flushed,
            errors: self.errors,
            final_state: format!("{state:?}"),
        }
    }
}

/// Destroys our handle of a QP (the CM dropped its own with the id): `ibv_destroy_qp`
/// when it is the last, else just dropped.
pub(super) fn destroy_qp(qp: SoftQp) {
    if let Ok(qp) = Arc::try_unwrap(qp) {
        let _ = qp.destroy();
    }
}

/// The QP-level check of a QP whose connection ended: drained and in ERROR.
pub(super) fn check_qp(rec: &Recorder, q: &QpReport) {
    if q.posted != q.completed {
        rec.violation(format!(
            "QP {} ({}): {} WRs posted, {} completed",
            q.qpn, q.purpose, q.posted, q.completed
        ));
    }
    if q.final_state != "Error" {
        rec.violation(format!(
            "QP {} ({}) in {} after its connection ended",
            q.qpn, q.purpose, q.final_state
        ));
    }
}

/// Threads of this process other than the calling (main) one, by name; waits up to
/// `wait` for them to end.
pub(super) fn threads_left(wait: Duration) -> Vec<String> {
    let me = nix::unistd::gettid().as_raw().to_string();
    let deadline = Instant::now() + wait;
    loop {
        let names: Vec<String> = std::fs::read_dir("/proc/self/task")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|t| *t != me)
                    .map(|t| {
                        std::fs::read_to_string(format!("/proc/self/task/{t}/comm"))
                            .map(|s| s.trim().to_owned())
                            .unwrap_or(t)
                    })
                    .collect()
            })
            .unwrap_or_default();
        if names.is_empty() || Instant::now() >= deadline {
            return names;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Joins `h` within `timeout`; `None` (and a violation) if it is still running.
pub(super) fn join_within<T>(
    rec: &Recorder,
    what: &str,
    h: JoinHandle<T>,
    timeout: Duration,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    while !h.is_finished() {
        if Instant::now() >= deadline {
            rec.violation(format!("{what} thread still blocked after {timeout:?}"));
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    match h.join() {
        Ok(v) => Some(v),
        Err(_) => {
            rec.violation(format!("{what} thread panicked"));
            None
        }
    }
}

/// What the threads that make ids share: the CM, the recorder, the handler.
#[derive(Clone)]
pub(super) struct Ctx {
    pub(super) cm: Arc<SoftRdmaCm>,
    pub(super) rec: Arc<Recorder>,
    pub(super) handler: Arc<dyn Handler<SoftDevice>>,
    pub(super) hold_accept_ms: u64,
}

impl Ctx {
    pub(super) fn create_id(&self, purpose: &str) -> (CmId<SoftDevice>, Receiver<Note>) {
        let id = self.cm.create_id_shared(self.handler.clone());
        let rx = self.rec.track(&id, purpose);
        (id, rx)
    }
}

/// What both roles hold: the CM, the recorder, the devices, what the report needs.
pub(super) struct Peer {
    pub(super) args: PeerArgs,
    pub(super) cm: Arc<SoftRdmaCm>,
    pub(super) rec: Arc<Recorder>,
    pub(super) handler: Arc<dyn Handler<SoftDevice>>,
    pub(super) devices: Vec<Arc<SoftDevice>>,
    pub(super) qps: Vec<QpReport>,
    pub(super) load_ends: Vec<(u64, String)>,
    pub(super) established: usize,
    pub(super) established_after: usize,
    pub(super) started: Instant,
    pub(super) removed: Vec<String>,
    pub(super) report: PeerReport,
    /// Devices we added; the monitor notices when the CM lists fewer.
    pub(super) added: Arc<AtomicUsize>,
    pub(super) monitor: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

impl Peer {
    pub(super) fn new(args: &PeerArgs) -> Result<(Peer, Receiver<Note>), PeerError> {
        let (rec, default_rx) = Recorder::new(args.seed);
        let cm = Arc::new(SoftRdmaCm::new(RdmaCmConfig {
            name: format!("{:?}", args.role).to_lowercase(),
            ..RdmaCmConfig::default()
        })?);
        let handler: Arc<dyn Handler<SoftDevice>> = Arc::new(RecHandler(rec.clone()));
        Ok((
            Peer {
                args: args.clone(),
                cm,
                rec,
                handler,
                devices: Vec::new(),
                qps: Vec::new(),
                load_ends: Vec::new(),
                established: 0,
                established_after: 0,
                started: Instant::now(),
                removed: Vec::new(),
                report: PeerReport::default(),
                added: Arc::new(AtomicUsize::new(0)),
                monitor: None,
            },
            default_rx,
        ))
    }

    /// The monitor thread: notices (to the millisecond) when the CM stops listing one
    /// of our devices, also when no id is there to hear a `DeviceRemoval`.
    pub(super) fn start_monitor(&mut self) {
        let (cm, rec, added) = (self.cm.clone(), self.rec.clone(), self.added.clone());
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let h = std::thread::Builder::new()
            .name("removal-monitor".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    if cm.devices().len() < added.load(Ordering::Acquire) {
                        rec.notice(now_ns(), || "device removed from the CM".into());
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
        match h {
            Ok(h) => self.monitor = Some((stop, h)),
            Err(e) => self.rec.violation(format!("no monitor thread: {e}")),
        }
    }

    pub(super) fn stop_monitor(&mut self) {
        if let Some((stop, h)) = self.monitor.take() {
            stop.store(true, Ordering::Release);
            join_within(&self.rec, "monitor", h, Duration::from_secs(1));
        }
    }

    pub(super) fn add_device(
        &mut self,
        name: &str,
        tap: &str,
        ip: &str,
    ) -> Result<Arc<SoftDevice>, PeerError> {
        let dev = open_device(name, tap, ip, &self.args)?;
        let sdev = SoftDevice::new(dev)?;
        self.cm.add_device(sdev.clone())?;
        self.devices.push(sdev.clone());
        self.added.fetch_add(1, Ordering::AcqRel);
        if self.monitor.is_none() {
            self.start_monitor();
        }
        Ok(sdev)
    }

    pub(super) fn ctx(&self) -> Ctx {
        Ctx {
            cm: self.cm.clone(),
            rec: self.rec.clone(),
            handler: self.handler.clone(),
            hold_accept_ms: self.args.hold_accept_ms,
        }
    }

    pub(super) fn out_of_time(&self) -> bool {
        self.started.elapsed().as_secs_f64() > self.args.max_secs
    }

    /// Names of our devices the CM no longer lists (removed).
    pub(super) fn newly_removed(&mut self) -> Vec<String> {
        let listed = self.cm.devices();
        let mut new = Vec::new();
        for d in &self.devices {
            let n = d.device().name().to_owned();
            if !listed.contains(&n) && !self.removed.contains(&n) {
                self.removed.push(n.clone());
                new.push(n);
            }
        }
        new
    }

    /// After a removal: let the CM deliver it, then check rule 3.
    pub(super) fn settle_removals(&mut self) {
        let new = self.newly_removed();
        if new.is_empty() {
            return;
        }
        if let Err(e) = self.cm.flush() {
            self.rec.violation(format!("flush: {e}"));
        }
        for n in &new {
            self.rec.check_exactly_one(n);
        }
    }

    /// The orderly end: every device removed (ours by us if the link did not), released,
    /// counters read, everything dropped, threads gone; the report.
    pub(super) fn finish(mut self) -> PeerReport {
        step("finish");
        self.settle_removals();
        // Remove (by name) what the CM still lists: a device re-added under the name of
        // a removed one is listed once.
        let listed = self.cm.devices();
        for name in listed {
            match self.cm.remove_device(&name) {
                Ok(r) => {
                    if let Err(e) = r.wait_timeout(Duration::from_secs(2)) {
                        self.rec.violation(format!("{name} not released: {e}"));
                    }
                }
                Err(e) => self.rec.violation(format!("remove {name}: {e}")),
            }
        }
        // A removed device is released once its last id is gone (by the worker).
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.cm.stats().devices_held != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        step("released");
        // The providers' threads (`iwp-*`) forget a connection when they handle its end,
        // which may come a moment after the release on a loaded machine: wait (at most
        // 1 s) for their tables to empty before reading them; a real leak stays.
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline
            && self.devices.iter().any(|d| {
                let p = d.provider().stats();
                p.conns_alive != 0 || p.conns_watched != 0
            })
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut end = EndStats::default();
        for d in &self.devices {
            let p = d.provider().stats();
            end.conns_alive += p.conns_alive;
            end.conns_watched += p.conns_watched;
            end.listeners += p.listeners;
            end.qp_refs += p.qp_refs;
        }
        // Close the devices: a device still running (link down) completes the address
        // resolutions it still holds, and with them the last references of their ids.
        // (The soft device's link watcher may hold the device up to one tick, 100 ms,
        // after its release: wait until it is really closed.)
        let weak: Vec<std::sync::Weak<Device>> = self
            .devices
            .iter()
            .map(|d| Arc::downgrade(d.device()))
            .collect();
        self.devices.clear();
        let deadline = Instant::now() + Duration::from_secs(1);
        while weak.iter().any(|w| w.strong_count() > 0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if weak.iter().any(|w| w.strong_count() > 0) {
            self.rec
                .violation("a device was still open 1 s after its release".into());
        }
        self.stop_monitor();
        // A device's strong count drops to 0 when its `Drop` *starts*: the engine's
        // shutdown then completes the address resolutions it held (the last references
        // of their ids) and queues their ends for the CM's worker. So wait (at most 1 s)
        // until the worker has taken them all.
        let s = match self.cm.wait_ids_freed(Duration::from_secs(1)) {
            Ok(s) => s,
            Err(e) => {
                self.rec.violation(format!("flush: {e}"));
                self.cm.stats()
            }
        };
        end.ids_alive = s.ids_alive;
        end.devices_held = s.devices_held;
        end.events_unacked = s.events_unacked;
        end.internal_listeners = s.internal_listeners;
        end.timers_pending = s.timers_pending;
        if end != EndStats::default() {
            self.rec
                .violation(format!("leaked objects: {end:?} ({s:?})"));
        }
        let cm_removals = s.device_removals;
        let skipped = s.removals_skipped;
        let delivered = self.rec.removals.load(Ordering::Relaxed);
        if cm_removals != delivered {
            self.rec.violation(format!(
                "the CM counted {cm_removals} DeviceRemoval, the callbacks {delivered}"
            ));
        }
        match Arc::try_unwrap(self.cm) {
            Ok(cm) => {
                if let Err(e) = cm.shutdown() {
                    self.rec.violation(format!("CM shutdown: {e}"));
                }
            }
            Err(_) => self
                .rec
                .violation("the CM is still shared at the end".into()),
        }
        step("cm-shut-down");
        // The CM's link watcher ends at its next 100 ms tick; with busy loops and builds
        // on both cores it was once still alive after 1 s (1.35 s).
        let left = threads_left(Duration::from_secs(3));
        step("threads-checked");
        if !left.is_empty() {
            self.rec.violation(format!("threads left: {left:?}"));
        }
        let (ids, by_user, by_return) = self.rec.report_ids();
        let notice = lock(&self.rec.first_notice).clone();
        let mut r = self.report;
        r.role = format!("{:?}", self.args.role).to_lowercase();
        r.scenario = format!("{:?}", self.args.scenario).to_lowercase();
        r.removed_devices = self.removed;
        r.first_notice_ns = notice.as_ref().map(|n| n.0);
        r.first_notice = notice.as_ref().map(|n| n.1.clone());
        r.phase_at_notice = notice.and_then(|n| n.2);
        r.first_removal_ns = *lock(&self.rec.first_removal);
        r.qps = self.qps;
        r.ids = ids;
        r.device_removals = delivered;
        r.cm_device_removals = cm_removals;
        r.removals_skipped = skipped;
        r.destroyed_by_user = by_user;
        r.destroyed_by_return = by_return;
        r.load_ends = self.load_ends;
        r.established = self.established;
        r.established_after_removal = self.established_after;
        r.hold_returned_ns = *lock(&self.rec.hold_returned);
        r.stats = end;
        r.threads_left = left;
        r.violations = lock(&self.rec.violations).clone();
        r.done_ns = now_ns();
        r
    }
}

/// Runs the peer: the role's work, then `Peer::finish`. Prints `READY`, `PHASE`,
/// `EVENT`, `NOTICE` lines as it goes; the caller prints the report.
///
/// Errors: set-up failures before anything ran (the TAP cannot be opened, bad
/// arguments): [`PeerError`].
pub fn run_peer(args: &PeerArgs) -> Result<PeerReport, PeerError> {
    match args.role {
        Role::Server => run_server(args),
        Role::Client => run_client(args),
    }
}
