//! The harness side of the device-removal tests, shared by `removal_*.rs`:
//! plans of seeded removal moments ([`Plan`], drawn with `testkit::Rng`, the tests' one
//! PRNG), the topology with what the tests do to it ([`Bench`]: tear a TAP down at a
//! chosen moment, re-create it, add a second one, all through netlab's `ip` runner),
//! running a server/client pair of `removal-peer`s ([`run_iteration`], [`run_pair`]),
//! and the checks of their reports ([`check_outcome`]). Errors are
//! [`RemovalTestError`]. The peer program itself is `netns_tests::removal`.
//!
//! Times are `CLOCK_REALTIME` nanoseconds ([`netlab::now_ns`]), comparable across the harness
//! and the peers (one machine).

#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::time::Duration;

use netlab::netns::ArmedIp;
use netlab::wait_exits;
use netns_tests::removal::{EndStats, PeerReport, ReportError};
use serde::{Deserialize, Serialize};
use testkit::Rng;

/// Why a removal test run failed: the message says what, with both peers' output
/// where there is one.
#[derive(Debug, thiserror::Error)]
pub enum RemovalTestError {
    /// The topology or a peer failed (a peer's failure carries its output and stacks).
    #[error(transparent)]
    Harness(#[from] netlab::HarnessError),
    /// Arming or firing the `ip` teardown failed.
    #[error("{0}")]
    Ip(#[from] std::io::Error),
    /// A peer's report could not be read.
    #[error("{peer}: {source}")]
    Report {
        /// The peer's name.
        peer: String,
        /// Why.
        #[source]
        source: ReportError,
    },
    /// One of the removal checks failed on the reports (the message says which).
    #[error("{0}")]
    Check(String),
    /// An iteration of the random test failed: its plan, the check, the outcome and both
    /// reports.
    #[error("iteration {iteration} ({plan}): {check}\n{context}")]
    Iteration {
        /// The iteration number.
        iteration: u64,
        /// The plan, as `{:?}`.
        plan: String,
        /// What failed.
        check: Box<RemovalTestError>,
        /// The outcome and both reports, as `{:?}`.
        context: String,
    },
    /// Re-creating the TAP after an iteration failed (after the iteration's own error,
    /// if any).
    #[error("{}\nre-creating the TAP failed: {source}", .first.as_ref().map(ToString::to_string).unwrap_or_default())]
    Restore {
        /// The iteration's own error.
        first: Option<Box<RemovalTestError>>,
        /// Why the TAP could not be re-created.
        #[source]
        source: std::io::Error,
    },
}

/// The report in a peer's output.
fn report_of(o: &netlab::PeerOutput) -> Result<PeerReport, RemovalTestError> {
    PeerReport::from_stdout(&o.stdout).map_err(|source| RemovalTestError::Report {
        peer: o.name.clone(),
        source,
    })
}

/// When, in a peer's life, the harness tears the interface down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Moment {
    /// The client's device is open, nothing connected yet.
    BeforeConnect,
    /// A churn address resolution is pending (a silent neighbour).
    Resolve,
    /// A churn connection waits for its MPA Reply (the server holds the request).
    Mpa,
    /// The load runs on every long-lived connection.
    Load,
    /// A churn connection is being disconnected.
    Disconnect,
    /// A churn id is being destroyed.
    Destroy,
}

impl Moment {
    /// Every moment, in the order the random test cycles through them.
    pub const ALL: [Moment; 6] = [
        Moment::BeforeConnect,
        Moment::Resolve,
        Moment::Mpa,
        Moment::Load,
        Moment::Disconnect,
        Moment::Destroy,
    ];

    /// The client's stdout line (prefix) the harness acts on.
    pub fn trigger(self) -> &'static str {
        match self {
            Moment::BeforeConnect => "READY",
            Moment::Resolve => "PHASE resolve-slow ",
            Moment::Mpa => "PHASE mpa ",
            Moment::Load => "PHASE load ",
            Moment::Disconnect => "PHASE disconnect ",
            Moment::Destroy => "PHASE destroy ",
        }
    }
}

/// How the interface is torn down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TapAction {
    /// `ip link del TAP`: the device ends (the TAP fd fails).
    Delete,
    /// `ip link set TAP down`: the link goes down; the device is removed from the CM.
    Down,
}

/// One iteration of the random test: a seeded choice of moment, side, action, delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Iteration number.
    pub iteration: u64,
    /// When.
    pub moment: Moment,
    /// Whose TAP: `true` for the server's (namespace A), `false` for the client's.
    pub server_side: bool,
    /// How.
    pub action: TapAction,
    /// Which occurrence of the trigger line (1-based).
    pub occurrence: usize,
    /// Extra delay after the trigger line, microseconds.
    pub delay_us: u64,
    /// The peers' seed.
    pub seed: u64,
}

impl Plan {
    /// The plan of iteration `i` under `seed`: moments cycle through [`Moment::ALL`]
    /// (so every moment is hit equally often); side, action, occurrence and delay are
    /// drawn from the seed.
    pub fn new(seed: u64, i: u64) -> Plan {
        let mut s = Rng::new(seed ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let moment = Moment::ALL[(i % 6) as usize];
        let server_side = s.next_u64().is_multiple_of(2);
        let action = if s.next_u64().is_multiple_of(3) {
            TapAction::Down
        } else {
            TapAction::Delete
        };
        let occurrence = match moment {
            Moment::BeforeConnect | Moment::Load => 1,
            _ => 1 + (s.next_u64() % 3) as usize,
        };
        let delay_us = match moment {
            Moment::Load => 50_000 + s.next_u64() % 400_000,
            Moment::Mpa | Moment::Resolve => s.next_u64() % 150_000,
            Moment::BeforeConnect => s.next_u64() % 100_000,
            Moment::Disconnect | Moment::Destroy => s.next_u64() % 1_000,
        };
        Plan {
            iteration: i,
            moment,
            server_side,
            action,
            occurrence,
            delay_us,
            seed: s.next_u64(),
        }
    }
}

/// The two-namespace [`Topology`](netlab::Topology) of the removal tests, plus what they
/// do to it: tear a TAP down, re-create it, add a second TAP in namespace A. Dropping
/// it removes everything (the extra TAP, then the topology's interfaces and
/// namespaces), also while a failing test unwinds.
#[derive(Debug)]
pub struct Bench {
    topo: netlab::Topology,
    bridges: [String; 2],
    extra: Option<String>,
    /// The peers' `--acted-file` ([`Bench::awaits_action`], [`Bench::acted`]).
    acted: std::path::PathBuf,
    /// Held while the bench exists (dropped last, after the topology's clean-up): one
    /// bench per test process at a time. These tests bound how fast a removal is
    /// noticed and a peer exits; two pairs of peers under load at once on two cores
    /// (cargo runs a file's tests in parallel) measured each other, not the device.
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

/// The lock behind [`Bench`]'s one-at-a-time rule.
static BENCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The address/prefix of the second server device (wildcard test).
pub const EXTRA_IP: Ipv4Addr = Ipv4Addr::new(10, 234, 0, 3);

impl Bench {
    /// Builds the topology (MTU 1500).
    ///
    /// Errors: as [`netlab::Topology::create`]; a bridge that cannot be found.
    pub fn create() -> Result<Bench, netlab::HarnessError> {
        // A test that failed while holding it poisoned it; the next may still run.
        let one_at_a_time = BENCH
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let topo = netlab::Topology::create(1500)?;
        let bridge = |ns: &str| -> Result<String, netlab::HarnessError> {
            let out = netlab::netns::ip_output(&["-n", ns, "-o", "link", "show", "type", "bridge"])
                .map_err(netlab::HarnessError::Setup)?;
            out.lines()
                .find_map(|l| l.split(": ").nth(1).map(|n| n.trim().to_owned()))
                .ok_or_else(|| {
                    netlab::HarnessError::Setup(std::io::Error::other(format!("no bridge in {ns}")))
                })
        };
        let bridges = [bridge(&topo.a().netns)?, bridge(&topo.b().netns)?];
        Ok(Bench {
            topo,
            bridges,
            extra: None,
            acted: std::env::temp_dir().join(format!(
                "removal-acted-{}-{}",
                std::process::id(),
                netlab::now_ns()
            )),
            _one_at_a_time: one_at_a_time,
        })
    }

    /// The topology.
    pub fn topology(&self) -> &netlab::Topology {
        &self.topo
    }

    /// Namespace and TAP of the server (A) or the client (B) side.
    pub fn endpoint(&self, server_side: bool) -> &netlab::Endpoint {
        if server_side {
            self.topo.a()
        } else {
            self.topo.b()
        }
    }

    /// Readies a teardown of `tap` in `ns`: an `ip -n NS -batch -` process is started
    /// now and waits for its command on stdin, so that [`ArmedIp::fire`] costs a pipe
    /// write rather than a process start (which took up to 400 ms on a loaded 2-core
    /// machine).
    ///
    /// Errors: `ip` cannot be started.
    pub fn arm_on(&self, ns: &str, tap: &str, action: TapAction) -> std::io::Result<ArmedIp> {
        let cmd = match action {
            TapAction::Delete => format!("link del {tap}"),
            TapAction::Down => format!("link set {tap} down"),
        };
        ArmedIp::arm(ns, &cmd)
    }

    /// [`Bench::arm_on`] for the server's or the client's TAP.
    ///
    /// Errors: as [`Bench::arm_on`].
    pub fn arm(&self, server_side: bool, action: TapAction) -> std::io::Result<ArmedIp> {
        let e = self.endpoint(server_side);
        self.arm_on(&e.netns, &e.tap, action)
    }

    /// Creates (or re-creates: deletes first if it exists) TAP `tap` in namespace
    /// `ns` on the side's bridge, up, pending link changes committed.
    ///
    /// Errors: an `ip` step failed.
    pub fn make_tap(&self, server_side: bool, tap: &str) -> std::io::Result<()> {
        let ns = &self.endpoint(server_side).netns;
        let br = &self.bridges[usize::from(!server_side)];
        let _ = netlab::netns::run_ip(&["-n", ns, "link", "del", tap]);
        netlab::netns::add_tap_on_bridge(ns, tap, br, self.topo.mtu(), 10_000)
    }

    /// Re-creates the server's or the client's TAP after an iteration.
    ///
    /// Errors: as [`Bench::make_tap`].
    pub fn restore(&self, server_side: bool) -> std::io::Result<()> {
        let tap = self.endpoint(server_side).tap.clone();
        self.make_tap(server_side, &tap)
    }

    /// A second TAP in namespace A (for a second server device); its name.
    ///
    /// Errors: as [`Bench::make_tap`].
    pub fn add_extra_tap(&mut self) -> std::io::Result<String> {
        let name = format!("{}c", self.topo.a().tap.trim_end_matches('a'));
        self.make_tap(true, &name)?;
        self.extra = Some(name.clone());
        Ok(name)
    }

    /// `spec` with `--acted-file`: the peer will not conclude that its device was not
    /// removed before [`Bench::acted`] (call it once the action on the TAP returned).
    /// Forgets an earlier iteration's action.
    pub fn awaits_action(&self, spec: netlab::PeerSpec) -> netlab::PeerSpec {
        let _ = std::fs::remove_file(&self.acted);
        spec.arg("--acted-file").arg(&self.acted)
    }

    /// Tells the peers started with [`Bench::awaits_action`] that the action on the TAP
    /// has returned.
    ///
    /// Errors: the file cannot be created.
    pub fn acted(&self) -> std::io::Result<()> {
        std::fs::File::create(&self.acted).map(drop)
    }

    /// A [`netlab::PeerSpec`] for `removal-peer` at `program` on a side, with the
    /// side's `--tap --ip` and, for the client, `--peer-ip` of the server; output not
    /// echoed (it is long; failures carry its tail).
    pub fn peer(&self, program: &std::path::Path, server_side: bool) -> netlab::PeerSpec {
        let e = self.endpoint(server_side);
        let side = if server_side {
            netlab::Side::A
        } else {
            netlab::Side::B
        };
        let role = if server_side { "server" } else { "client" };
        let mut spec = self
            .topo
            .peer(side, role, program)
            .arg(role)
            .args([
                "--tap",
                e.tap.as_str(),
                "--ip",
                &format!("{}/{}", e.ip, e.prefix_len),
            ])
            .echo(std::env::var_os("REMOVAL_ECHO").is_some());
        if !server_side {
            spec = spec.args(["--peer-ip".to_owned(), self.topo.a().ip.to_string()]);
        }
        spec
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        if let Some(t) = self.extra.take() {
            let _ = netlab::netns::ip_output(&["-n", &self.topo.a().netns, "link", "del", &t]);
        }
        let _ = std::fs::remove_file(&self.acted);
    }
}

/// What one iteration of the random test measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    /// The plan.
    pub plan: Plan,
    /// From the harness's action (the command written to the waiting `ip`) to the
    /// removed side's first notice, ms.
    pub notice_ms: f64,
    /// From the end of the action (`ip` exited: the kernel had acted) to the first
    /// notice, ms (negative when the peer noticed before `ip` exited).
    pub notice_after_ip_ms: f64,
    /// How long the `ip` command took, ms (the kernel acted within it).
    pub ip_ms: f64,
    /// From the `ip` call to the first `DeviceRemoval` callback on the removed side, ms
    /// (none when no id was bound to the device).
    pub removal_event_ms: Option<f64>,
    /// From the `ip` call to the removed side's exit, ms.
    pub removed_exit_ms: f64,
    /// From the `ip` call to the surviving side's exit, ms.
    pub survivor_exit_ms: f64,
    /// From the `ip` call to the survivor's last long-lived connection end, ms.
    pub survivor_disconnected_ms: Option<f64>,
    /// The churn's phase when the removed side first noticed.
    pub phase_at_notice: Option<String>,
    /// The client's phase (its last `PHASE` line) when the action started.
    pub client_phase_at_action: Option<String>,
    /// `DeviceRemoval` events on the removed side.
    pub device_removals: usize,
    /// Ids destroyed by a `DeviceRemoval` callback's Destroy return.
    pub destroyed_by_return: usize,
    /// WRs posted over both sides (all completed).
    pub wrs: u64,
    /// Of those, flushed.
    pub flushed: u64,
}

impl Outcome {
    /// The outcome of `plan` from both peers' reports (`reports`: server, then client),
    /// when each exited (`exits`, ns, same order), and when the action started and when
    /// `ip` returned (`action`, ns); `client_phase_at_action` as [`phase_at`] reads it.
    pub fn measure(
        plan: Plan,
        reports: &[PeerReport],
        exits: &[Option<u64>],
        action: (u64, u64),
        client_phase_at_action: Option<String>,
    ) -> Outcome {
        let (t_act, t_done) = action;
        let (ri, si) = if plan.server_side { (0, 1) } else { (1, 0) };
        let (removed, survivor) = (&reports[ri], &reports[si]);
        Outcome {
            plan,
            notice_ms: removed.first_notice_ns.map_or(f64::NAN, |n| ms(n, t_act)),
            ip_ms: ms(t_done, t_act),
            notice_after_ip_ms: removed.first_notice_ns.map_or(f64::NAN, |n| ms(n, t_done)),
            removal_event_ms: removed.first_removal_ns.map(|n| ms(n, t_act)),
            removed_exit_ms: exits[ri].map_or(f64::NAN, |t| ms(t, t_act)),
            survivor_exit_ms: exits[si].map_or(f64::NAN, |t| ms(t, t_act)),
            survivor_disconnected_ms: survivor
                .load_ends
                .iter()
                .map(|(t, _)| ms(*t, t_act))
                .reduce(f64::max),
            phase_at_notice: removed.phase_at_notice.clone(),
            client_phase_at_action,
            device_removals: removed.device_removals,
            destroyed_by_return: removed.destroyed_by_return,
            wrs: reports.iter().flat_map(|r| &r.qps).map(|q| q.posted).sum(),
            flushed: reports.iter().flat_map(|r| &r.qps).map(|q| q.flushed).sum(),
        }
    }
}

/// The last `PHASE <name> <t_ns>` line of `stdout` at or before `t`.
pub fn phase_at(stdout: &str, t: u64) -> Option<String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("PHASE "))
        .filter_map(|l| l.split_once(' '))
        .rfind(|(_, ts)| ts.parse::<u64>().is_ok_and(|ts| ts <= t))
        .map(|(p, _)| p.to_owned())
}

/// A peer's `STEP <name> <t_ns>` and `PHASE <name> <t_ns>` lines as `name@ms` (ms after
/// `t0`, ns since the epoch), in order: where a slow peer spent its time.
pub fn timeline(stdout: &str, t0: u64) -> String {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("STEP ").or_else(|| l.strip_prefix("PHASE ")))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(name, ts)| Some(format!("{name}@{:.1}", ms(ts.parse().ok()?, t0))))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Milliseconds from `from` to `ns` (both ns since the epoch; negative if `ns` is earlier).
pub fn ms(ns: u64, from: u64) -> f64 {
    (ns as f64 - from as f64) / 1e6
}

/// Runs one iteration of the random test on `bench`: server and client, the trigger,
/// the teardown, both exits, the removal checks. The TAP is re-created afterwards
/// (also on failure). `tcp_timeout_ms` is the peers' TCP user timeout.
///
/// Errors: a message with what failed and both peers' output (stacks if one hung).
pub fn run_iteration(
    bench: &Bench,
    program: &std::path::Path,
    plan: &Plan,
) -> Result<Outcome, RemovalTestError> {
    let r = iteration(bench, program, plan);
    if let Err(source) = bench.restore(plan.server_side) {
        return Err(RemovalTestError::Restore {
            first: r.err().map(Box::new),
            source,
        });
    }
    r
}

/// The peers' TCP user timeout in the random test, ms.
pub const TCP_TIMEOUT_MS: u64 = 1500;

fn iteration(
    bench: &Bench,
    program: &std::path::Path,
    plan: &Plan,
) -> Result<Outcome, RemovalTestError> {
    let seed = plan.seed.to_string();
    let mut sspec = bench.awaits_action(bench.peer(program, true)).args([
        "--seed",
        &seed,
        "--tcp-timeout-ms",
        &TCP_TIMEOUT_MS.to_string(),
    ]);
    if plan.moment == Moment::Mpa {
        sspec = sspec.args(["--hold-accept-ms", "300"]);
    }
    if plan.moment == Moment::BeforeConnect {
        sspec = sspec.args(["--first-connection-ms", "2500"]);
    }
    let mut server = sspec.spawn()?;
    server.wait_for_line(|l| l == "READY", Duration::from_secs(20))?;
    let mut cspec = bench.awaits_action(bench.peer(program, false)).args([
        "--seed",
        &seed,
        "--tcp-timeout-ms",
        &TCP_TIMEOUT_MS.to_string(),
    ]);
    cspec = match plan.moment {
        Moment::BeforeConnect => cspec.args(["--start-delay-ms", "300"]),
        Moment::Resolve => cspec.args(["--churn", "--slow-resolve"]),
        Moment::Mpa => cspec.args(["--churn", "--hold-accept-ms", "300"]),
        _ => cspec.arg("--churn"),
    };
    let mut client = cspec.spawn()?;
    let armed = bench.arm(plan.server_side, plan.action)?;
    let mut seen = 0;
    let trigger = plan.moment.trigger();
    client.wait_for_line(
        |l| {
            if l.starts_with(trigger) {
                seen += 1;
            }
            seen >= plan.occurrence
        },
        Duration::from_secs(30),
    )?;
    std::thread::sleep(Duration::from_micros(plan.delay_us));
    let (t_act, t_done) = armed.fire()?;
    bench.acted()?;
    let exits = wait_exits(&mut [&mut server, &mut client], Duration::from_secs(30));
    let outs = netlab::wait_all(vec![server, client], Duration::from_secs(1))?;
    let reports: Vec<PeerReport> = outs.iter().map(report_of).collect::<Result<_, _>>()?;
    let (ri, si) = if plan.server_side { (0, 1) } else { (1, 0) };
    let (removed, survivor) = (&reports[ri], &reports[si]);
    let outcome = Outcome::measure(
        *plan,
        &reports,
        &exits,
        (t_act, t_done),
        phase_at(&outs[1].stdout, t_act),
    );
    let fail = |check: RemovalTestError| {
        Err(RemovalTestError::Iteration {
            iteration: plan.iteration,
            plan: format!("{plan:?}"),
            check: Box::new(check),
            context: format!(
                "{outcome:?}\nremoved side report: {removed:?}\nsurvivor report: {survivor:?}\n\
                 server steps (ms after the action): {}\nclient steps (ms after the action): {}",
                timeline(&outs[0].stdout, t_act),
                timeline(&outs[1].stdout, t_act)
            ),
        })
    };
    check_outcome(&outcome, removed, survivor).or_else(fail)
}

/// The checks of one random iteration, on the two reports.
///
/// Errors: the first check that failed.
pub fn check_outcome(
    o: &Outcome,
    removed: &PeerReport,
    survivor: &PeerReport,
) -> Result<Outcome, RemovalTestError> {
    for r in [removed, survivor] {
        if !r.violations.is_empty() {
            return Err(RemovalTestError::Check(format!(
                "{} violations: {:?}",
                r.role, r.violations
            )));
        }
        if let Some(q) = r.lost_completions().first() {
            return Err(RemovalTestError::Check(format!(
                "{}: lost completions on {q:?}",
                r.role
            )));
        }
        if r.stats != EndStats::default() || !r.threads_left.is_empty() {
            return Err(RemovalTestError::Check(format!(
                "{}: leaked {:?} {:?}",
                r.role, r.stats, r.threads_left
            )));
        }
    }
    if removed.removed_devices.is_empty() {
        return Err(RemovalTestError::Check(
            "the removed side's device was not removed".into(),
        ));
    }
    if !survivor.removed_devices.is_empty() || survivor.device_removals != 0 {
        return Err(RemovalTestError::Check(
            "the surviving side saw a removal".into(),
        ));
    }
    // Nothing is noticed before the action; the device notices within 100 ms of it
    // (counted from the end of the `ip` command: how long `ip` itself takes to run on a
    // loaded machine is not the device's).
    if o.notice_ms.is_nan() || o.notice_ms < 0.0 {
        return Err(RemovalTestError::Check(format!(
            "noticed {} ms after the action started",
            o.notice_ms
        )));
    }
    if o.notice_after_ip_ms > 100.0 {
        return Err(RemovalTestError::Check(format!(
            "noticed {} ms after the action ended (bound 100 ms)",
            o.notice_after_ip_ms
        )));
    }
    // The removed side exits within 2 s of learning of the removal: counted from its
    // first `DeviceRemoval` event (else from its first notice). Not from the action's
    // start: with busy loops on both cores the kernel itself took up to 4.5 s to carry
    // out an `ip link del` (the device's removal event came 35 ms before `ip` returned,
    // the connections had ended on the peer's TCP timeout long before), and `ip link
    // del` of a TAP returns only once its last fd is closed, i.e. when the peer exits.
    let learned_ms = o.removal_event_ms.unwrap_or(o.notice_ms);
    let exit_after = o.removed_exit_ms - learned_ms;
    if exit_after > 2000.0 {
        return Err(RemovalTestError::Check(format!(
            "the removed side exited {exit_after} ms after it learned of the removal \
             (bound 2 s; {} ms after the action started)",
            o.removed_exit_ms
        )));
    }
    // The survivor's long-lived connections end within its TCP timeout (plus the
    // keep-alive probe's wait and a loaded machine's slack: in a 500-iteration run at
    // load 7-9 on 2 cores, one survivor of 500 heard of it after 3.8 s, its three
    // connections ending within 5 ms of each other, i.e. its engine thread was not
    // scheduled; the median was 1.9 s).
    let bound = (TCP_TIMEOUT_MS + 3000) as f64;
    if let Some(d) = o.survivor_disconnected_ms {
        if d > bound {
            return Err(RemovalTestError::Check(format!(
                "the survivor heard of the end after {d} ms (bound {bound} ms)"
            )));
        }
    }
    for (_, how) in &survivor.load_ends {
        if how != "Disconnected" && !how.starts_with("setup") {
            return Err(RemovalTestError::Check(format!(
                "a surviving long-lived connection ended with {how}"
            )));
        }
    }
    Ok(o.clone())
}

/// Summary of a list of values: count, min, median, 95th percentile, max.
pub fn distribution(values: &[f64]) -> String {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return "n=0".into();
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!(
        "n={} min={:.1} median={:.1} p95={:.1} max={:.1}",
        v.len(),
        v[0],
        at(0.5),
        at(0.95),
        v[v.len() - 1]
    )
}

/// What [`run_pair`] gives back: both reports, the action's times, when each peer
/// exited.
#[derive(Debug, Clone)]
pub struct PairRun {
    /// The server's report.
    pub server: PeerReport,
    /// The client's report.
    pub client: PeerReport,
    /// [`netlab::now_ns`] when the action started and when `ip` exited.
    pub action: (u64, u64),
    /// When the server and the client exited, ms after the action started.
    pub exit_ms: [f64; 2],
}

/// What [`run_pair`] runs.
#[derive(Debug, Clone, Default)]
pub struct PairSpec {
    /// Extra arguments of the server.
    pub server_args: Vec<String>,
    /// Extra arguments of the client.
    pub client_args: Vec<String>,
    /// The client's stdout line (prefix) that fires the action.
    pub trigger: String,
    /// Wait this long after the trigger line.
    pub delay: Duration,
}

/// Runs one server/client pair on `bench` with extra arguments, fires `armed` when the
/// client prints a line starting with `trigger` (after `delay`), runs `after_fire` on
/// the client (e.g. re-create its TAP when it asks), and waits for both (30 s
/// watchdog: stacks dumped, killed, failed).
///
/// Errors: a peer failed (its output and the other's summary), or no report.
pub fn run_pair(
    bench: &Bench,
    program: &std::path::Path,
    spec: &PairSpec,
    armed: ArmedIp,
    after_fire: impl FnOnce(&mut netlab::Peer) -> Result<(), netlab::HarnessError>,
) -> Result<PairRun, RemovalTestError> {
    let PairSpec {
        server_args,
        client_args,
        trigger,
        delay,
    } = spec;
    let trigger = trigger.as_str();
    let mut server = bench
        .awaits_action(bench.peer(program, true))
        .args(server_args.iter().cloned())
        .spawn()?;
    server.wait_for_line(|l| l == "READY", Duration::from_secs(20))?;
    let mut client = bench
        .awaits_action(bench.peer(program, false))
        .args(client_args.iter().cloned())
        .spawn()?;
    client.wait_for_line(|l| l.starts_with(trigger), Duration::from_secs(30))?;
    std::thread::sleep(*delay);
    let action = armed.fire()?;
    bench.acted()?;
    after_fire(&mut client)?;
    let exits = wait_exits(&mut [&mut server, &mut client], Duration::from_secs(30));
    let outs = netlab::wait_all(vec![server, client], Duration::from_secs(1))?;
    Ok(PairRun {
        server: report_of(&outs[0])?,
        client: report_of(&outs[1])?,
        action,
        exit_ms: [0, 1].map(|i| exits[i].map_or(f64::NAN, |t| ms(t, action.0))),
    })
}
