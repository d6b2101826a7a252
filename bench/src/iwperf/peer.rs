//! One whole side of an iwperf test, as `iwperf server` / `iwperf client` and the
//! demo run it: open the device, make the connections ([`super::conn`]), run
//! ([`super::datapath`]), disconnect, destroy, close the device (which flushes a
//! capture).

use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::conn::{open_device, CmSide, Conn, DeviceOptions};
use super::datapath::{
    client_bandwidth, client_latency, server_bandwidth, server_latency, Progress, Role, RunLength,
    ServerReport, Side, Tuning,
};
use super::report::{BwResult, LatStats};
use super::wire::{Mode, MrInfo, Op, TestParams, VerifyStatus};
use super::IwperfError;

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
            })
            .collect()
    }
}

/// What a client run produced (also what `iwperf client --json` prints).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

/// What a server run saw (also what `iwperf server --json` prints).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

/// Ends a side: disconnect (or wait for the peer's), destroy, release, close the
/// device. `already` is the count of `Disconnected` events before (of connections
/// dropped before the test started), left out. Returns (disconnected, ids alive at
/// shutdown).
fn teardown(
    cm: CmSide,
    conns: Vec<Conn>,
    mut side: Side,
    initiate: bool,
    device: Arc<softiwarp::Device>,
    already: usize,
) -> (usize, usize) {
    let n = conns.len();
    let t0 = Instant::now();
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
    side.release();
    let alive = cm.close(conns);
    tracing::debug!(elapsed = ?t0.elapsed(), alive, "rdma-cm closed");
    close_device(device);
    tracing::debug!(elapsed = ?t0.elapsed(), "device closed");
    (disconnected, alive)
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

/// Runs a server: opens the device, listens on `port`, calls `ready`, serves one test
/// (as many connections as the client announces), tears down.
///
/// Returns the summary and the error that ended it, if any (setup errors before any
/// connection return an empty summary with the error).
pub fn run_server(
    dev: DeviceOptions,
    port: u16,
    backlog: u32,
    tuning: Tuning,
    first_timeout: Duration,
    ready: impl FnOnce(),
) -> (ServerSummary, Option<IwperfError>) {
    let mut summary = ServerSummary {
        bandwidth: None,
        answered: None,
        connections: 0,
        disconnected: 0,
        ids_leaked: 0,
        error: None,
        exit_code: 0,
        cpu_seconds: 0.0,
    };
    let fail = |mut s: ServerSummary, e: IwperfError| {
        s.error = Some(e.to_string());
        s.exit_code = e.exit_code();
        (s, Some(e))
    };
    let device = match open_device(dev) {
        Ok(d) => d,
        Err(e) => return fail(summary, e),
    };
    let mut cm = match CmSide::new(device.clone()) {
        Ok(c) => c,
        Err(e) => return fail(summary, e),
    };
    if let Err(e) = cm.listen(port, backlog) {
        cm.close(Vec::new());
        return fail(summary, e);
    }
    ready();
    let status = cm.status();
    let mut side = Side::new(Role::Server, tuning);
    let conns = match cm.accept_all(first_timeout, &mut side) {
        Ok(c) => c,
        Err(e) => {
            side.release();
            cm.close(Vec::new());
            return fail(summary, e);
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
                verify_failed
                    .then(|| IwperfError::Verify("the server found data that did not match".into()))
            })
        }
        Mode::Latency => match server_latency(&side, &status) {
            Ok(n) => {
                summary.answered = Some(n);
                None
            }
            Err(e) => Some(e),
        },
    };
    let removed = status.removed();
    let (disconnected, alive) = teardown(cm, conns, side, removed, device, already);
    summary.disconnected = disconnected;
    summary.ids_leaked = alive;
    let (u, sys) = crate::cpu_time();
    summary.cpu_seconds = u + sys;
    match err {
        Some(e) => fail(summary, e),
        None => (summary, None),
    }
}

/// Runs a client: opens the device, connects `test.qps` connections, runs, tears down.
/// `progress` is called about once a second during the run.
///
/// Returns the report (partial when the run ended early) and the error, if any.
pub fn run_client(
    dev: DeviceOptions,
    test: &ClientTest,
    tuning: Tuning,
    progress: &mut dyn FnMut(&Progress),
) -> (ClientReport, Option<IwperfError>) {
    let mut report = ClientReport {
        bandwidth: Vec::new(),
        latency: None,
        connections: 0,
        disconnected: 0,
        ids_leaked: 0,
        connect_seconds: 0.0,
        error: None,
        exit_code: 0,
        cpu_seconds: 0.0,
    };
    let fail = |mut r: ClientReport, e: IwperfError| {
        r.error = Some(e.to_string());
        r.exit_code = e.exit_code();
        (r, Some(e))
    };
    if let Err(e) = test.validate() {
        return fail(report, e);
    }
    let device = match open_device(dev) {
        Ok(d) => d,
        Err(e) => return fail(report, e),
    };
    let mut cm = match CmSide::new(device.clone()) {
        Ok(c) => c,
        Err(e) => return fail(report, e),
    };
    let status = cm.status();
    let mut side = Side::new(Role::Client, tuning);
    let t0 = Instant::now();
    let conns = match cm.connect_all(test.server, &test.params(), test.connect_timeout, &mut side) {
        Ok(c) => c,
        Err(e) => {
            side.release();
            cm.close(Vec::new());
            close_device(device);
            return fail(report, e);
        }
    };
    report.connect_seconds = t0.elapsed().as_secs_f64();
    report.connections = conns.len();
    let err = match test.mode {
        Mode::Bandwidth => {
            let (results, err) = client_bandwidth(&side, &status, test.length, progress);
            let failed = results.iter().any(|r| r.verify == VerifyStatus::Failed);
            report.bandwidth = results;
            err.or_else(|| {
                failed.then(|| {
                    IwperfError::Verify("data did not match (see the mismatches per op)".into())
                })
            })
        }
        Mode::Latency => {
            let (stats, err) = client_latency(&side, &status, test.length, progress);
            report.latency = stats;
            err
        }
    };
    let (disconnected, alive) = teardown(cm, conns, side, true, device, 0);
    report.disconnected = disconnected;
    report.ids_leaked = alive;
    let (u, sys) = crate::cpu_time();
    report.cpu_seconds = u + sys;
    match err {
        Some(e) => fail(report, e),
        None => (report, None),
    }
}
