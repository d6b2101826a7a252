//! `transport-bench`: the transport benchmark (root only). Builds two network namespaces
//! with a TAP each, joined by bridges and a veth, and runs `bench-peer` server/client
//! pairs in them for each variant and MTU, alternating variants run by run; prints one
//! line per run and a table of medians and ratios. Everything it creates is removed at
//! the end, on error, and on Ctrl-C.
//!
//! ```text
//! cargo build --release -p bench
//! sudo target/release/transport-bench --mtu 1500,65000 --rounds 5 --seconds 4
//! ```
//!
//! Logs go to stderr, filtered by `RUST_LOG` (default `info`).

use std::process::ExitCode;

use bench::runner::{self, RunLength, RunnerConfig, Variant};
use bench::stats::{summarize, table, Measurement};
use bench::BenchError;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Raw smoltcp TCP vs the MPA FPDU stream over TAPs in two namespaces")]
struct Cli {
    /// MTUs in bytes (TAP maximum 65521), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1500,65000")]
    mtu: Vec<usize>,
    /// Variants, comma-separated, alternated in this order within each round.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tcp,fpdu-crc,fpdu-nocrc,fpdu-inline-crc,fpdu-inline-nocrc"
    )]
    variants: Vec<String>,
    /// Rounds: runs per variant and MTU.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds per run (the client sends for this long).
    #[arg(long, default_value_t = 4.0, conflicts_with = "bytes", value_parser = bench::parse_seconds)]
    seconds: f64,
    /// Bytes per run instead of a time.
    #[arg(long)]
    bytes: Option<u64>,
    /// Do not pin server and client to CPUs 1 and 0.
    #[arg(long)]
    no_pin: bool,
    /// Verify every byte with a CRC32c on both sides (slower; not for figures).
    #[arg(long)]
    verify: bool,
    /// Echo the peers' output.
    #[arg(long)]
    echo: bool,
    /// Print every run as a JSON line too.
    #[arg(long)]
    json: bool,
    /// Extra arguments passed to every bench-peer (e.g. --peer-arg=--spin-us=0).
    #[arg(long = "peer-arg", allow_hyphen_values = true)]
    peer_args: Vec<String>,
}

/// The first three fields of `/proc/loadavg` (other processes on the machine skew the
/// figures; the runner reports the load so a noisy run can be recognised).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn run(cli: &Cli) -> Result<(), BenchError> {
    let mut cfg = RunnerConfig::new();
    cfg.mtus = cli.mtu.clone();
    cfg.variants = cli
        .variants
        .iter()
        .map(|v| {
            Variant::from_name(v)
                .ok_or_else(|| BenchError::Config(format!("unknown variant {v:?}")))
        })
        .collect::<Result<_, _>>()?;
    cfg.rounds = cli.rounds;
    cfg.length = match cli.bytes {
        Some(b) => RunLength::Bytes(b),
        None => RunLength::Seconds(cli.seconds),
    };
    cfg.pin = !cli.no_pin;
    cfg.verify = cli.verify;
    cfg.echo = cli.echo;
    cfg.extra_args = cli.peer_args.clone();
    let json = cli.json;
    println!(
        "# {} ; load average at start: {}",
        std::env::args().collect::<Vec<_>>().join(" "),
        loadavg()
    );
    let samples = runner::run(&cfg, |s| {
        println!(
            "mtu {:>5}  round {}  {:<12} {:>7.2} Gbit/s  ({} bytes in {:.2} s; server cpu {:.2}u+{:.2}s, client cpu {:.2}u+{:.2}s)",
            s.mtu,
            s.round,
            s.variant.name(),
            s.server.gbit_per_s,
            s.server.bytes,
            s.server.seconds,
            s.server.cpu_user,
            s.server.cpu_sys,
            s.client.cpu_user,
            s.client.cpu_sys,
        );
        if json {
            let j = serde_json::json!({
                "variant": s.variant.name(), "mtu": s.mtu, "round": s.round,
                "server": s.server, "client": s.client,
            });
            println!("JSON {j}");
        }
    })?;
    let data: Vec<Measurement> = samples.iter().map(|s| s.measurement()).collect();
    println!("# load average at end: {}", loadavg());
    println!();
    print!("{}", table(&summarize(&data, "tcp"), "tcp"));
    Ok(())
}

fn main() -> ExitCode {
    netlab::logging::init_tracing("info");
    if let Err(e) = netlab::signals::install_handler() {
        eprintln!("transport-bench: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("transport-bench: {e}");
            if netlab::signals::interrupted() {
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
