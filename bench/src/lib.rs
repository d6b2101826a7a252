//! iwperf and the benchmarks of the soft device's transport.
//!
//! Its room: the measuring tools (iwperf, the raw TCP baselines, the transport benchmark)
//! and the verifiable ULPDU stream they and the two-process tests move. It touches
//! softiwarp, rdma-cm and netlab (the lab: namespaces, peers, captures); never
//! netns-tests, which may use it.
//!
//! - [`tcp`]: raw smoltcp TCP bulk transfer over any [`Link`](softiwarp::link::Link), one
//!   process per side: the baseline every iWARP figure is compared with.
//! - [`inline`]: the MPA FPDU stream over softiwarp's sans-IO stack in one thread (no
//!   engine thread), to split the device's cost into hand-off and MPA path.
//! - [`runner`]: the transport benchmark: builds the two-namespace TAP topology
//!   (`netlab`), runs the `bench-peer` binary as server in namespace A and client in
//!   namespace B for each variant and MTU, alternating variants run by run (A B A B), and
//!   reports medians and ratios.
//! - [`stats`]: medians and the result table.
//! - [`iwperf`]: perftest for the soft device through rdma-cm and verbs, and the demo
//!   (`iwperf demo`: two namespaces, the raw TCP baseline, Write, Read, Send, latency).
//! - [`tcp_lat`]: raw smoltcp TCP ping-pong, the latency baseline.
//! - [`ulpdu`] and [`mpa_peer`]: a verifiable stream of ULPDUs (RDMA Write DDP segments
//!   carrying a known pattern) over one MPA connection of the soft iWARP device's public
//!   API, and one side of such a transfer on a TAP: what `bench-peer fpdu` and
//!   netns-tests' `iwarp-peer` run.
//!
//! Binaries: `iwperf` (see [`iwperf`]), `bench-peer` (one side of one transfer; prints `READY` when listening and
//! `RESULT <json>` at the end) and `transport-bench` (the runner; needs root).
//! `docs/PERFORMANCE.md` has the figures and the command that reproduces them.

use std::time::Duration;

pub mod inline;
pub mod iwperf;
pub mod mpa_peer;
pub mod runner;
pub mod stats;
pub mod tcp;
pub mod tcp_lat;
pub mod ulpdu;

/// Errors of the benchmarks.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The link failed or could not be opened.
    #[error("link: {0}")]
    Link(#[from] softiwarp::link::LinkError),
    /// The link did not come up.
    #[error("link {name} not up after {waited:?}: {state}")]
    LinkNotUp {
        /// Interface name.
        name: String,
        /// How long we waited.
        waited: Duration,
        /// The state it was in.
        state: String,
    },
    /// The TCP connection failed (reset, timed out, refused, or an API call failed).
    #[error("TCP: {0}")]
    Tcp(String),
    /// The transfer did not finish before the hang guard.
    #[error("not finished after {0:?}: {1}")]
    Timeout(Duration, String),
    /// The received data did not match what was sent.
    #[error("data mismatch: {0}")]
    Mismatch(String),
    /// A setting is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The namespace harness failed (topology or a peer process).
    #[error(transparent)]
    Harness(#[from] netlab::HarnessError),
    /// A peer's `RESULT` line was missing or unreadable.
    #[error("peer {peer}: {message}")]
    Report {
        /// The peer's name.
        peer: String,
        /// What was wrong.
        message: String,
    },
    /// An OS call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Longest run a benchmark takes, in seconds: one year (`Duration` holds far more, but
/// a run length beyond this is a typo, and `f64` seconds beyond about 1.8e19 do not fit a
/// `Duration` at all).
pub const MAX_SECONDS: f64 = 365.0 * 86_400.0;

/// The `--duration` / `--seconds` parser of the benchmark binaries: a finite number of
/// seconds above 0 and at most [`MAX_SECONDS`] (so that turning it into a `Duration`,
/// with a margin added, never panics).
///
/// Errors: a message naming the value and the range (clap prints it as a usage error).
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if v.is_finite() && v > 0.0 && v <= MAX_SECONDS {
        Ok(v)
    } else {
        Err(format!(
            "{s} seconds is outside (0, {MAX_SECONDS}] (one year)"
        ))
    }
}

/// Pins the calling thread (and the threads it starts later) to CPU `cpu`.
///
/// Errors: [`BenchError::Io`] if `sched_setaffinity` fails (e.g. no such CPU).
pub fn pin_to_cpu(cpu: usize) -> Result<(), BenchError> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(|e| BenchError::Io {
        context: "CPU set",
        source: e.into(),
    })?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(|e| BenchError::Io {
        context: "sched_setaffinity",
        source: e.into(),
    })
}

/// CPU time (user, system) in seconds this process has used so far.
pub fn cpu_time() -> (f64, f64) {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            (secs(u.user_time()), secs(u.system_time()))
        }
        Err(_) => (0.0, 0.0),
    }
}
