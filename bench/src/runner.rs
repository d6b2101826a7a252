//! The transport benchmark runner: for each MTU, one two-namespace topology; in each
//! round every variant runs once, in turn (A B A B ...), each run a fresh pair of
//! `bench-peer` processes: the server in namespace A (pinned to CPU 1), then, once it
//! printed `READY`, the client in namespace B (pinned to CPU 0). The server's figure is
//! the measurement. Needs root.

use std::path::PathBuf;
use std::time::Duration;

use netlab::{wait_all, PeerOutput, Side, Topology};

use crate::stats::Measurement;
use crate::tcp::TransferReport;
use crate::BenchError;

/// What is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// Raw smoltcp TCP (the baseline).
    Tcp,
    /// ULPDUs over an MPA connection of the soft iWARP device, MPA CRC32c on.
    FpduCrc,
    /// The same with MPA CRC off.
    FpduNoCrc,
    /// The same ULPDUs over softiwarp's sans-IO stack in one thread, CRC on.
    InlineCrc,
    /// The same, CRC off.
    InlineNoCrc,
}

impl Variant {
    /// Every variant, in the order runs alternate.
    pub const ALL: [Variant; 5] = [
        Variant::Tcp,
        Variant::FpduCrc,
        Variant::FpduNoCrc,
        Variant::InlineCrc,
        Variant::InlineNoCrc,
    ];

    /// The name used in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Tcp => "tcp",
            Variant::FpduCrc => "fpdu-crc",
            Variant::FpduNoCrc => "fpdu-nocrc",
            Variant::InlineCrc => "fpdu-inline-crc",
            Variant::InlineNoCrc => "fpdu-inline-nocrc",
        }
    }

    /// Parses [`Variant::name`].
    pub fn from_name(s: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == s)
    }

    /// The `bench-peer` subcommand and its variant-specific arguments.
    fn peer_args(self) -> Vec<String> {
        match self {
            Variant::Tcp => vec!["tcp".into()],
            Variant::FpduCrc => vec!["fpdu".into(), "--crc".into(), "on".into()],
            Variant::FpduNoCrc => vec!["fpdu".into(), "--crc".into(), "off".into()],
            Variant::InlineCrc => vec!["inline".into(), "--crc".into(), "on".into()],
            Variant::InlineNoCrc => vec!["inline".into(), "--crc".into(), "off".into()],
        }
    }
}

/// How much each run moves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RunLength {
    /// The client sends for this many seconds.
    Seconds(f64),
    /// The client sends exactly this many bytes.
    Bytes(u64),
}

/// Settings of a benchmark.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Path of the `bench-peer` binary.
    pub peer: PathBuf,
    /// MTUs in bytes, one topology each.
    pub mtus: Vec<usize>,
    /// Variants, alternated in this order within each round.
    pub variants: Vec<Variant>,
    /// Rounds (runs per variant and MTU).
    pub rounds: usize,
    /// Length of each run.
    pub length: RunLength,
    /// Pin server and client to CPUs 1 and 0.
    pub pin: bool,
    /// Verify every byte (CRC32c on both sides; slower).
    pub verify: bool,
    /// Echo the peers' output.
    pub echo: bool,
    /// Extra arguments for every `bench-peer` invocation (e.g. `--spin-us 0`).
    pub extra_args: Vec<String>,
}

impl RunnerConfig {
    /// Defaults: `bench-peer` next to the running executable, MTU 1500 and 65000, every
    /// variant, 5 rounds of 4 s, pinned, no verification, quiet.
    pub fn new() -> RunnerConfig {
        RunnerConfig {
            peer: sibling_binary("bench-peer"),
            mtus: vec![1500, 65000],
            variants: Variant::ALL.to_vec(),
            rounds: 5,
            length: RunLength::Seconds(4.0),
            pin: true,
            verify: false,
            echo: false,
            extra_args: Vec::new(),
        }
    }
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig::new()
    }
}

/// The path of binary `name` in the directory of the running executable (cargo puts a
/// package's binaries side by side; test executables live one level deeper, in `deps/`).
pub fn sibling_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(name)
}

/// One run's outcome.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The variant.
    pub variant: Variant,
    /// IP MTU in bytes.
    pub mtu: usize,
    /// Round number.
    pub round: usize,
    /// The server's report (the measurement).
    pub server: TransferReport,
    /// The client's report.
    pub client: TransferReport,
}

impl Sample {
    /// As a [`Measurement`] for [`crate::stats::summarize`].
    pub fn measurement(&self) -> Measurement {
        let busiest = (self.server.cpu_user + self.server.cpu_sys)
            .max(self.client.cpu_user + self.client.cpu_sys);
        Measurement {
            variant: self.variant.name().to_owned(),
            mtu: self.mtu,
            round: self.round,
            gbit_per_s: self.server.gbit_per_s,
            gbit_per_cpu_s: TransferReport::rate(self.server.bytes, busiest),
        }
    }
}

/// The `RESULT <json>` report a peer printed.
///
/// Errors: [`BenchError::Report`] if there is none or it does not parse.
pub fn parse_report(out: &PeerOutput) -> Result<TransferReport, BenchError> {
    let line = out
        .lines_with_prefix("RESULT ")
        .last()
        .ok_or_else(|| BenchError::Report {
            peer: out.name.clone(),
            message: "no RESULT line".into(),
        })?;
    serde_json::from_str(line).map_err(|e| BenchError::Report {
        peer: out.name.clone(),
        message: format!("bad RESULT line {line:?}: {e}"),
    })
}

fn ip_args(topo: &Topology, side: Side, peer: Side) -> Vec<String> {
    let me = topo.side(side);
    let mac = me
        .mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    vec![
        "--tap".into(),
        me.tap.clone(),
        "--ip".into(),
        format!("{}/{}", me.ip, me.prefix_len),
        "--mac".into(),
        mac,
        "--peer-ip".into(),
        topo.side(peer).ip.to_string(),
    ]
}

/// Runs one transfer of `variant` on `topo` and returns both reports.
///
/// Errors: a peer failed or timed out ([`BenchError::Harness`]), or its report is
/// missing ([`BenchError::Report`]).
pub fn run_one(
    topo: &Topology,
    cfg: &RunnerConfig,
    variant: Variant,
    round: usize,
) -> Result<Sample, BenchError> {
    let common = |side: Side, peer: Side, role: &str, cpu: usize| {
        let mut a = variant.peer_args();
        a.extend(["--role".into(), role.into()]);
        a.extend(ip_args(topo, side, peer));
        if cfg.pin {
            a.extend(["--cpu".into(), cpu.to_string()]);
        }
        if cfg.verify {
            a.push("--verify".into());
        }
        a.extend(cfg.extra_args.iter().cloned());
        a
    };
    let (length_flag, length_value, guard) = match cfg.length {
        RunLength::Seconds(s) => (
            "--seconds",
            s.to_string(),
            Duration::from_secs_f64(s + 30.0),
        ),
        RunLength::Bytes(n) => ("--bytes", n.to_string(), Duration::from_secs(120)),
    };
    let timeout_arg = ["--timeout".to_owned(), guard.as_secs().to_string()];
    let mut server = topo
        .peer(Side::A, &format!("server-{}", variant.name()), &cfg.peer)
        .args(common(Side::A, Side::B, "server", 1))
        .args(timeout_arg.clone())
        .echo(cfg.echo)
        .spawn()?;
    server.wait_for_line(|l| l == "READY", Duration::from_secs(15))?;
    let client = topo
        .peer(Side::B, &format!("client-{}", variant.name()), &cfg.peer)
        .args(common(Side::B, Side::A, "client", 0))
        .args([length_flag.to_owned(), length_value])
        .args(timeout_arg)
        .echo(cfg.echo)
        .spawn()?;
    let outs = wait_all(vec![server, client], guard + Duration::from_secs(10))?;
    let server = parse_report(&outs[0])?;
    let client = parse_report(&outs[1])?;
    if cfg.verify && (server.crc32c != client.crc32c || server.bytes != client.bytes) {
        return Err(BenchError::Mismatch(format!(
            "{}: client sent {} bytes crc {:?}, server got {} bytes crc {:?}",
            variant.name(),
            client.bytes,
            client.crc32c,
            server.bytes,
            server.crc32c
        )));
    }
    Ok(Sample {
        variant,
        mtu: topo.mtu(),
        round,
        server,
        client,
    })
}

/// Runs the whole benchmark, calling `progress` after each run.
///
/// Errors: as [`run_one`]; [`BenchError::Harness`] if a topology cannot be built.
pub fn run(
    cfg: &RunnerConfig,
    mut progress: impl FnMut(&Sample),
) -> Result<Vec<Sample>, BenchError> {
    if !cfg.peer.is_file() {
        return Err(BenchError::Config(format!(
            "peer binary {} not found (build it: cargo build --release -p bench)",
            cfg.peer.display()
        )));
    }
    let mut samples = Vec::new();
    for &mtu in &cfg.mtus {
        let topo = Topology::create(mtu)?;
        for round in 0..cfg.rounds {
            for &variant in &cfg.variants {
                let s = run_one(&topo, cfg, variant, round)?;
                progress(&s);
                samples.push(s);
            }
        }
    }
    Ok(samples)
}
