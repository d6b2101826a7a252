//! One whole side of an iwperf test, as `iwperf server` / `iwperf client` and the
//! demo run it: open the device ([`Backend`]: the soft device, or an rdma-core device
//! by name), make the connections ([`super::conn`]), run ([`super::datapath`]),
//! disconnect, destroy, close the device (which flushes a capture). Everything past
//! opening the device is one code path, generic over `verbs::provider::Provider`.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use softiwarp::cm::provider::SoftCm;
use verbs::provider::Provider;

use super::conn::{close_soft_cm, open_device, soft_cm, CmSide, Conn, DeviceOptions};
use super::datapath::{
    client_bandwidth, client_latency, server_bandwidth, server_latency, Progress, Role, RunLength,
    ServerReport, Side, Tuning,
};
use super::ledger::WrCounts;
use super::report::{BwResult, LatStats};
use super::wire::{Mode, MrInfo, Op, TestParams, VerifyStatus};
use super::IwperfError;

/// The device a side runs on.
#[derive(Debug)]
pub enum Backend {
    /// The soft device, opened as the options say (a TAP, a memory or UDP link, or a
    /// host interface's kernel TCP).
    Soft(DeviceOptions),
    /// An rdma-core device (`siw0`, `cxgb4_0`) through libibverbs and librdmacm,
    /// loaded at run time.
    RdmaCore {
        /// The device name.
        device: String,
        /// The local address: the server listens on it, the client connects from it;
        /// `None`: the device's own IPv4 address (the client then lets the route pick
        /// if the device has none).
        bind: Option<Ipv4Addr>,
    },
}

impl From<DeviceOptions> for Backend {
    fn from(d: DeviceOptions) -> Backend {
        Backend::Soft(d)
    }
}

/// An rdma-core device opened by name: the libraries, its event channel, the
/// device's IPv4 address if it has one.
struct RdmaCoreDevice {
    channel: cxgb4::EventChannel,
    addr: Option<Ipv4Addr>,
}

/// Loads rdma-core and checks that `name` is one of its devices (one line if not:
/// "rdma-core (libibverbs.so.1) not found", "no RDMA device named 'X' (found: ...)",
/// both [`IwperfError::NoDevice`]); opens an event channel.
fn open_rdma_core(name: &str) -> Result<RdmaCoreDevice, IwperfError> {
    let no_device = |e: cxgb4::Error| IwperfError::NoDevice(e.to_string());
    let core = Arc::new(cxgb4::RdmaCore::load().map_err(|e| no_device(cxgb4::Error::from(e)))?);
    let ctx = cxgb4::Context::open(&core, name).map_err(no_device)?;
    let addr = super::netdev::device_ipv4(&ctx.name());
    drop(ctx);
    // ENODEV here: the device went away between the check above and now (a removal
    // racing the start), which is "no such device" (status 3) too.
    let channel = cxgb4::EventChannel::new(&core).map_err(|e| {
        if e.errno() == nix::libc::ENODEV {
            IwperfError::NoDevice(format!("{name} went away: rdma_create_event_channel: {e}"))
        } else {
            IwperfError::Setup(format!("rdma_create_event_channel: {e}"))
        }
    })?;
    Ok(RdmaCoreDevice { channel, addr })
}

/// What the client runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientTest {
    /// The server's address and port.
    pub server: SocketAddrV4,
    /// Operations; connection `i` runs `ops[i % ops.len()]`.
    pub ops: Vec<Op>,
    /// Bandwidth or latency.
    pub mode: Mode,
    /// Message size in bytes.
    pub size: u32,
    /// Connections (QPs).
    pub qps: u16,
    /// WRs in flight per QP.
    pub tx_depth: u16,
    /// Check the data.
    pub verify: bool,
    /// How long.
    pub length: RunLength,
    /// How long connection setup may take.
    pub connect_timeout: Duration,
    /// Open only these connection indices of the `qps` announced (`None`: all). The
    /// server waits for the others from elsewhere: the root-only hostile-peer tests
    /// (`bench/tests/iwperf_hostile.rs`) let an attacker join a legitimate test so.
    pub indices: Option<Vec<u16>>,
}

impl ClientTest {
    /// Checks the combination of options.
    ///
    /// Errors: [`IwperfError::Usage`].
    pub fn validate(&self) -> Result<(), IwperfError> {
        let usage = |m: &str| Err(IwperfError::Usage(m.to_owned()));
        if self.ops.is_empty() {
            return usage("--op: at least one operation");
        }
        if self.size == 0 || u64::from(self.size) > 1 << 30 {
            return usage("--size: 1 byte to 1 GiB");
        }
        if self.qps == 0 || self.qps > 1024 {
            return usage("--qps: 1 to 1024");
        }
        if self.tx_depth == 0 || self.tx_depth > 8192 {
            return usage("--tx-depth: 1 to 8192");
        }
        if self.mode == Mode::Latency && (self.qps != 1 || self.ops.len() != 1) {
            return usage("--lat: one QP and one operation");
        }
        if let RunLength::Iters(0) = self.length {
            return usage("--iters: at least 1");
        }
        if let Some(only) = &self.indices {
            let mut sorted = only.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if only.is_empty()
                || sorted.len() != only.len()
                || sorted.iter().any(|&i| i >= self.qps)
            {
                return usage("--indices: distinct connection indices below --qps");
            }
        }
        Ok(())
    }

    fn params(&self) -> Vec<TestParams> {
        (0..self.qps)
            .filter(|i| self.indices.as_ref().is_none_or(|only| only.contains(i)))
            .map(|i| TestParams {
                op: self.ops[usize::from(i) % self.ops.len()],
                mode: self.mode,
                verify: self.verify,
                size: self.size,
                qps: self.qps,
                index: i,
                tx_depth: self.tx_depth,
                client_mr: MrInfo::default(),
                // Set with the CM's ConnParam (`connect_all`).
                rd_depth: 0,
            })
            .collect()
    }
}

/// What a client run produced (also what `iwperf client --json` prints).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientReport {
    /// Bandwidth results, one per operation.
    pub bandwidth: Vec<BwResult>,
    /// Latency statistics (latency runs).
    pub latency: Option<LatStats>,
    /// Connections established.
    pub connections: usize,
    /// `Disconnected` events seen at the end (one per connection when the teardown was
    /// clean).
    pub disconnected: usize,
    /// rdma-cm ids still alive when the CM was shut down (0 when clean).
    pub ids_leaked: usize,
    /// Seconds connection setup took.
    pub connect_seconds: f64,
    /// What ended the run early, if anything.
    pub error: Option<String>,
    /// The exit status this run stands for.
    pub exit_code: u8,
    /// CPU time (user + system) of this process at the end, in seconds.
    #[serde(default)]
    pub cpu_seconds: f64,
    /// When a `DeviceRemoval` ended the run: its events and the WRs' fate.
    #[serde(default)]
    pub removal: Option<RemovalReport>,
}

/// What a server run saw (also what `iwperf server --json` prints).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerSummary {
    /// Bandwidth runs: the server's counts and checks.
    pub bandwidth: Option<ServerReport>,
    /// Latency runs: round trips answered.
    pub answered: Option<u64>,
    /// Connections established.
    pub connections: usize,
    /// `Disconnected` events seen at the end.
    pub disconnected: usize,
    /// rdma-cm ids still alive when the CM was shut down (0 when clean).
    pub ids_leaked: usize,
    /// What ended the run early, if anything.
    pub error: Option<String>,
    /// The exit status this run stands for.
    pub exit_code: u8,
    /// CPU time (user + system) of this process at the end, in seconds.
    #[serde(default)]
    pub cpu_seconds: f64,
    /// When a `DeviceRemoval` ended the run: its events and the WRs' fate.
    #[serde(default)]
    pub removal: Option<RemovalReport>,
}

/// How a run ended by a `DeviceRemoval` ended, as iwperf reports it (the JSON's
/// `removal`, and one line on stderr). The rules it shows: exactly one `DeviceRemoval`
/// per live id, and every posted WR completes, successfully or flushed (design.md
/// section 5; librdmacm's `RDMA_CM_EVENT_DEVICE_REMOVAL`, rdma_get_cm_event(3)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovalReport {
    /// `DeviceRemoval` events received.
    pub events: usize,
    /// Distinct ids those events were for.
    pub ids: usize,
    /// The most events one id received (1 when the rule holds).
    pub most_per_id: usize,
    /// Ids alive when the removal ended the run (connections, and a server's listener).
    pub live_ids: usize,
    /// WRs posted and completions polled, after draining the CQ ([`DRAIN_LIMIT`]).
    pub wrs: WrCounts,
    /// Signaled WRs never completed ([`WrCounts::outstanding`]; 0 when none was lost).
    pub outstanding: u64,
    /// Why the CQ could not be drained, if it failed (an overrun: the completions
    /// lost, which are among the outstanding ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cq_error: Option<String>,
    /// The soft device's threads and file descriptors still there once the side closed
    /// it (`None` for an rdma-core device, whose library keeps its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leftovers: Option<Leftovers>,
}

/// Threads and file descriptors of this process that were not there before a side
/// opened its device and still are after it closed it (the device's engine, its CM's
/// workers and provider, sockets, epoll and netlink fds, a TAP).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leftovers {
    /// Names of the threads left.
    pub threads: Vec<String>,
    /// The fds left, as `N -> what /proc/self/fd/N links to`.
    pub fds: Vec<String>,
}

impl Leftovers {
    /// Nothing left.
    pub fn is_empty(&self) -> bool {
        self.threads.is_empty() && self.fds.is_empty()
    }
}

impl std::fmt::Display for Leftovers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return write!(f, "no thread or fd left");
        }
        write!(
            f,
            "{} thread(s) left {:?}, {} fd(s) left {:?}",
            self.threads.len(),
            self.threads,
            self.fds.len(),
            self.fds
        )
    }
}

/// This process's threads (by id) and open fds (as `N -> target`) at one moment, to
/// find what a side left behind ([`Snapshot::leftovers`]).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    threads: std::collections::BTreeSet<String>,
    fds: std::collections::BTreeSet<String>,
}

/// The entries of a `/proc/self` directory.
fn proc_entries(dir: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

impl Snapshot {
    /// Now. An fd is named with what it links to, so that a number closed and reused
    /// since counts as new; the fd that reads `/proc/self/fd` is left out.
    pub fn now() -> Snapshot {
        let me = format!("/proc/{}/fd", std::process::id());
        let fds = proc_entries("/proc/self/fd")
            .into_iter()
            .filter_map(|fd| {
                let to = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
                (to.as_os_str() != me.as_str()).then(|| format!("{fd} -> {}", to.display()))
            })
            .collect();
        Snapshot {
            threads: proc_entries("/proc/self/task").into_iter().collect(),
            fds,
        }
    }

    /// What is there now and was not at the snapshot, waiting up to `wait` for it to
    /// go (a thread may take a moment to exit after it was told to).
    pub fn leftovers(&self, wait: Duration) -> Leftovers {
        let deadline = Instant::now() + wait;
        loop {
            let now = Snapshot::now();
            let threads: Vec<String> = now
                .threads
                .difference(&self.threads)
                .map(|t| {
                    std::fs::read_to_string(format!("/proc/self/task/{t}/comm"))
                        .map_or_else(|_| t.clone(), |c| c.trim().to_owned())
                })
                .collect();
            let fds: Vec<String> = now.fds.difference(&self.fds).cloned().collect();
            let left = Leftovers { threads, fds };
            if left.is_empty() || Instant::now() >= deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// How long a side waits for its device's threads to end before it counts them as
/// left over ([`Snapshot::leftovers`]).
const LEFTOVER_WAIT: Duration = Duration::from_millis(500);

impl std::fmt::Display for RemovalReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceRemoval: {} events for {} ids ({} live); WRs: {}, {} outstanding",
            self.events, self.ids, self.live_ids, self.wrs, self.outstanding
        )?;
        match &self.cq_error {
            Some(e) => write!(f, "; {e}"),
            None => Ok(()),
        }
    }
}

/// How long a side drains its CQ after a `DeviceRemoval` (for the flushes of every WR
/// still posted).
pub const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// Ends a side: disconnect (or wait for the peer's), then destroy: the QPs, their
/// ids, then the MRs, CQ and PD. `already` is the count of `Disconnected` events
/// before (of connections dropped before the test started), left out. Returns the
/// `Disconnected` events counted, and the removal's report when a `DeviceRemoval`
/// ended the run (the CQ drained first: [`Side::drain_after_removal`]).
fn teardown<P: Provider>(
    cm: CmSide<'_, P>,
    conns: Vec<Conn<P>>,
    mut side: Side<P>,
    initiate: bool,
    already: usize,
) -> (usize, Option<RemovalReport>) {
    let n = conns.len();
    let t0 = Instant::now();
    let status = cm.status();
    let drained = status
        .removed()
        .then(|| (cm.live_ids(&conns), side.drain_after_removal(DRAIN_LIMIT)));
    let disconnected = if initiate {
        cm.disconnect_all(&conns, already, Duration::from_secs(2))
    } else {
        let got = cm.wait_disconnected(n + already, Duration::from_secs(3));
        if got < n + already {
            cm.disconnect_all(&conns, already, Duration::from_secs(1))
        } else {
            got
        }
    }
    .saturating_sub(already);
    tracing::debug!(elapsed = ?t0.elapsed(), disconnected, "disconnected");
    // The data path's QP handles and MRs, then the QPs and ids, then the CQ and PD
    // (rdma-core refuses to destroy a CQ that a QP still uses).
    side.qps.clear();
    cm.close(conns);
    side.release();
    tracing::debug!(elapsed = ?t0.elapsed(), "ids and verbs objects destroyed");
    let removal = drained.map(|(live_ids, (wrs, cq_error))| {
        let (events, ids, most_per_id) = status.removals();
        RemovalReport {
            events,
            ids,
            most_per_id,
            live_ids,
            wrs,
            outstanding: wrs.outstanding(),
            cq_error,
            leftovers: None,
        }
    });
    (disconnected, removal)
}

/// Opens the soft device of `opts` and its RDMA CM, runs `run` on them (the server or
/// the client), then tears both down in order: the CM (its ids counted into
/// `ids_leaked`), then the device. Returns `run`'s error, or the setup's.
pub(super) fn on_soft_device(
    opts: DeviceOptions,
    ids_leaked: &mut usize,
    run: impl FnOnce(&SoftCm<'_>, &Arc<softiwarp::Device>) -> Option<IwperfError>,
) -> Option<IwperfError> {
    let device = match open_device(opts) {
        Ok(d) => d,
        Err(e) => return Some(e),
    };
    let cm = match soft_cm(device.clone()) {
        Ok(cm) => cm,
        Err(e) => return Some(e),
    };
    let p = SoftCm::new(&cm);
    let err = run(&p, &device);
    drop(p);
    *ids_leaked = close_soft_cm(cm);
    close_device(device);
    err
}

/// Drops the last handle of the device (its engine stops and its link, with a capture,
/// is flushed and closed), waiting up to 2 s for other holders (rdma-cm's provider
/// thread) to let go.
fn close_device(device: Arc<softiwarp::Device>) {
    let t0 = Instant::now();
    let mut device = device;
    loop {
        match Arc::try_unwrap(device) {
            Ok(d) => {
                d.close();
                return;
            }
            Err(d) if t0.elapsed() < Duration::from_secs(2) => {
                device = d;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(d) => {
                tracing::debug!(
                    holders = Arc::strong_count(&d),
                    "device still held; dropping our handle"
                );
                return;
            }
        }
    }
}

/// Runs a server: opens the device, listens on `port`, calls `ready` with the address
/// it listens on, serves one test
/// (as many connections as the client announces), tears down.
///
/// Returns the summary and the error that ended it, if any (setup errors before any
/// connection return an empty summary with the error).
pub fn run_server(
    dev: impl Into<Backend>,
    port: u16,
    backlog: u32,
    tuning: Tuning,
    first_timeout: Duration,
    ready: impl FnOnce(SocketAddrV4),
) -> (ServerSummary, Option<IwperfError>) {
    let mut summary = ServerSummary::default();
    let err = match dev.into() {
        Backend::Soft(opts) => {
            let mut leaked = 0;
            let before = Snapshot::now();
            let err = on_soft_device(opts, &mut leaked, |p, device| {
                let addr = SocketAddrV4::new(device.address(), port);
                serve(p, addr, backlog, tuning, first_timeout, ready, &mut summary)
            });
            summary.ids_leaked = leaked;
            if let Some(r) = &mut summary.removal {
                r.leftovers = Some(before.leftovers(LEFTOVER_WAIT));
            }
            err
        }
        Backend::RdmaCore { device, bind } => match open_rdma_core(&device) {
            Err(e) => Some(e),
            Ok(d) => match bind.or(d.addr) {
                None => Some(IwperfError::Usage(format!(
                    "RDMA device '{device}' has no IPv4 address: give --bind ADDR"
                ))),
                Some(ip) => {
                    let addr = SocketAddrV4::new(ip, port);
                    serve(
                        &d.channel,
                        addr,
                        backlog,
                        tuning,
                        first_timeout,
                        ready,
                        &mut summary,
                    )
                }
            },
        },
    };
    let (u, sys) = crate::cpu_time();
    summary.cpu_seconds = u + sys;
    match err {
        Some(e) => {
            summary.error = Some(e.to_string());
            summary.exit_code = e.exit_code();
            (summary, Some(e))
        }
        None => (summary, None),
    }
}

/// The server's one code path on either backend: listen on `addr`, `ready`, accept
/// the test's connections, run, tear down; fills `summary` and returns the error that
/// ended it, if any.
pub(super) fn serve<P: Provider>(
    p: &P,
    addr: SocketAddrV4,
    backlog: u32,
    tuning: Tuning,
    first_timeout: Duration,
    ready: impl FnOnce(SocketAddrV4),
    summary: &mut ServerSummary,
) -> Option<IwperfError> {
    CmSide::run(p, |mut cm| {
        if let Err(e) = cm.listen(addr, backlog) {
            cm.close(Vec::new());
            return Some(e);
        }
        ready(addr);
        let status = cm.status();
        let mut side = Side::new(Role::Server, tuning);
        let conns = match cm.accept_all(first_timeout, &mut side) {
            Ok(c) => c,
            Err(e) => {
                side.release();
                cm.close(Vec::new());
                return Some(e);
            }
        };
        summary.connections = conns.len();
        let already = status.disconnected();
        let mode = conns.first().map_or(Mode::Bandwidth, |c| c.params.mode);
        let err = match mode {
            Mode::Bandwidth => {
                let (report, err) = server_bandwidth(&side, &status);
                let verify_failed = report.verify == VerifyStatus::Failed;
                summary.bandwidth = Some(report);
                err.or_else(|| {
                    verify_failed.then(|| {
                        IwperfError::Verify("the server found data that did not match".into())
                    })
                })
            }
            Mode::Latency => match server_latency(&mut side, &status) {
                Ok(n) => {
                    summary.answered = Some(n);
                    None
                }
                Err(e) => Some(e),
            },
        };
        let removed = status.removed();
        (summary.disconnected, summary.removal) = teardown(cm, conns, side, removed, already);
        err
    })
}

/// Runs a client: opens the device, connects `test.qps` connections, runs, tears down.
/// `progress` is called about once a second during the run.
///
/// Returns the report (partial when the run ended early) and the error, if any.
pub fn run_client(
    dev: impl Into<Backend>,
    test: &ClientTest,
    tuning: Tuning,
    progress: &mut dyn FnMut(&Progress),
) -> (ClientReport, Option<IwperfError>) {
    let mut report = ClientReport::default();
    let err = if let Err(e) = test.validate() {
        Some(e)
    } else {
        match dev.into() {
            Backend::Soft(opts) => {
                let mut leaked = 0;
                let before = Snapshot::now();
                let err = on_soft_device(opts, &mut leaked, |p, _| {
                    drive(p, None, test, tuning, progress, &mut report)
                });
                report.ids_leaked = leaked;
                if let Some(r) = &mut report.removal {
                    r.leftovers = Some(before.leftovers(LEFTOVER_WAIT));
                }
                err
            }
            Backend::RdmaCore { device, bind } => match open_rdma_core(&device) {
                Err(e) => Some(e),
                Ok(d) => {
                    let src = bind.or(d.addr);
                    drive(&d.channel, src, test, tuning, progress, &mut report)
                }
            },
        }
    };
    let (u, sys) = crate::cpu_time();
    report.cpu_seconds = u + sys;
    match err {
        Some(e) => {
            report.error = Some(e.to_string());
            report.exit_code = e.exit_code();
            (report, Some(e))
        }
        None => (report, None),
    }
}

/// The client's one code path on either backend: connect (from `source` if given),
/// run, tear down; fills `report` and returns the error that ended the run, if any.
pub(super) fn drive<P: Provider>(
    p: &P,
    source: Option<Ipv4Addr>,
    test: &ClientTest,
    tuning: Tuning,
    progress: &mut dyn FnMut(&Progress),
    report: &mut ClientReport,
) -> Option<IwperfError> {
    CmSide::run(p, |mut cm| {
        if let Some(ip) = source {
            cm.set_source(ip);
        }
        let status = cm.status();
        let mut side = Side::new(Role::Client, tuning);
        let t0 = Instant::now();
        let conns =
            match cm.connect_all(test.server, &test.params(), test.connect_timeout, &mut side) {
                Ok(c) => c,
                Err(e) => {
                    side.release();
                    cm.close(Vec::new());
                    return Some(e);
                }
            };
        report.connect_seconds = t0.elapsed().as_secs_f64();
        report.connections = conns.len();
        let err = match test.mode {
            Mode::Bandwidth => {
                let (results, err) = client_bandwidth(&mut side, &status, test.length, progress);
                let failed = results.iter().any(|r| r.verify == VerifyStatus::Failed);
                report.bandwidth = results;
                err.or_else(|| {
                    failed.then(|| {
                        IwperfError::Verify("data did not match (see the mismatches per op)".into())
                    })
                })
            }
            Mode::Latency => {
                let (stats, err) = client_latency(&mut side, &status, test.length, progress);
                report.latency = stats;
                err
            }
        };
        (report.disconnected, report.removal) = teardown(cm, conns, side, true, 0);
        err
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_are_what_came_after_the_snapshot() {
        let path = std::env::temp_dir().join(format!("iwperf-leftover-{}", std::process::id()));
        let before = Snapshot::now();
        let f = std::fs::File::create(&path).unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (up_tx, up_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("leftover-test".into())
            .spawn(move || {
                // Named by now (the name is set as the thread starts).
                let _ = up_tx.send(());
                rx.recv()
            })
            .unwrap();
        up_rx.recv().unwrap();
        // Other tests' threads and fds come and go: look for ours only.
        let left = before.leftovers(Duration::ZERO);
        let name = path.display().to_string();
        assert!(left.fds.iter().any(|f| f.ends_with(&name)), "{left:?}");
        assert!(
            left.threads.iter().any(|t| t == "leftover-test"),
            "{left:?}"
        );
        assert!(left.to_string().contains("thread(s) left"), "{left}");
        drop((f, tx));
        let _ = t.join();
        let left = before.leftovers(Duration::ZERO);
        assert!(!left.fds.iter().any(|f| f.ends_with(&name)), "{left:?}");
        assert!(
            !left.threads.iter().any(|t| t == "leftover-test"),
            "{left:?}"
        );
        assert_eq!(Leftovers::default().to_string(), "no thread or fd left");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_removal_line_counts_every_wr_and_names_a_failed_cq() {
        let mut r = RemovalReport {
            events: 1,
            ids: 1,
            most_per_id: 1,
            live_ids: 1,
            wrs: WrCounts {
                sends_signaled: 10,
                sends_unsignaled: 2,
                recvs: 16,
                completed: 20,
                flushed: 8,
                errors: 0,
            },
            outstanding: 0,
            cq_error: None,
            leftovers: None,
        };
        assert_eq!(
            r.to_string(),
            "DeviceRemoval: 1 events for 1 ids (1 live); WRs: 12 sends (2 unsignaled) and 16 receives posted, 20 completed, 8 flushed, 0 in error, 0 outstanding"
        );
        // A CQ that overran while it was drained: said, with what the poll said.
        r.outstanding = 3;
        r.cq_error = Some("poll CQ: ibv_poll_cq: CQ 0x1 overflowed: 3 completions lost".into());
        assert!(r.to_string().ends_with(
            ", 3 outstanding; poll CQ: ibv_poll_cq: CQ 0x1 overflowed: 3 completions lost"
        ));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["cq_error"], r.cq_error.clone().unwrap().as_str());
        r.cq_error = None;
        // Absent when the CQ drained, so earlier readers see the same object.
        assert!(serde_json::to_value(&r).unwrap().get("cq_error").is_none());
    }
}
