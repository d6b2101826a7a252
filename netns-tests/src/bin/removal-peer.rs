//! `removal-peer`: one side of the device-removal tests, run inside a
//! namespace by `tests/removal_*.rs` and `scripts/removal-long.sh`:
//!
//! ```text
//! removal-peer server --tap T --ip 10.234.0.1/24
//! removal-peer client --tap T --ip 10.234.0.2/24 --peer-ip 10.234.0.1 --load-qps 3 --churn
//! ```
//!
//! It prints `READY` once its device is open (server: listening), `PHASE`, `EVENT`,
//! `NOTICE` lines as it goes (times in ns since the epoch), and one
//! `RESULT <json>` line (`netns_tests::removal::PeerReport`). Exit status: 0 when no
//! invariant was violated, 1 otherwise (the violations are in the report and on
//! stderr), 2 when it could not start. Logs go to stderr, filtered by `RUST_LOG`
//! (default `warn`). See `netns_tests::removal` for what it does and checks.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use netns_tests::removal::{run_peer, PeerArgs};

#[derive(Parser, Debug)]
#[command(about = "One side of the device-removal tests (soft iWARP device over a TAP)")]
struct Cli {
    #[command(flatten)]
    args: PeerArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = netlab::logging::init_peer("warn") {
        eprintln!("removal-peer: {e}");
        return ExitCode::from(2);
    }
    if cli.args.link.pcap.is_some() {
        eprintln!("removal-peer: does not capture (--pcap)");
        return ExitCode::from(2);
    }
    match run_peer(&cli.args) {
        Ok(report) => {
            let json =
                serde_json::to_string(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
            println!("RESULT {json}");
            let _ = std::io::stdout().flush();
            if report.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                for v in &report.violations {
                    eprintln!("removal-peer: violation: {v}");
                }
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("removal-peer: {e}");
            ExitCode::from(2)
        }
    }
}
