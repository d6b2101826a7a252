//! `iwdump [--json] [-v] FILE`: decode the iWARP (MPA, DDP, RDMAP) traffic of a
//! pcap/pcapng capture. Exit status: 0 clean, 1 errors found, 2 unusable input.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Command-line options.
#[derive(Debug, Parser)]
#[command(
    name = "iwdump",
    version,
    about = "iWARP dissector: MPA Request/Reply, FPDUs (CRC, markers), DDP and RDMAP headers",
    long_about = "Decodes the iWARP traffic of a pcap or pcapng capture: one line per MPA \
                  Request/Reply and per FPDU, then a summary.\n\nExit status: 0 when every \
                  stream decodes cleanly, 1 when an error was found (bad CRC, bad length, \
                  unknown opcode, bad marker, malformed MPA frame, missing data, TCP data \
                  past a FIN, a frame cut by the snapshot length), 2 when the input is \
                  unusable."
)]
struct Args {
    /// Print one JSON object instead of text (with -v: include every PDU).
    #[arg(long)]
    json: bool,
    /// More detail: MPA parameters per connection, warnings; with --json, per-PDU records.
    #[arg(short, long)]
    verbose: bool,
    /// The capture file (pcap or pcapng).
    file: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let report = match iwdump::dissect_file(&args.file) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("iwdump: {}: {e}", args.file.display());
            return ExitCode::from(2);
        }
    };
    let text = if args.json {
        let mut j = report.to_json(args.verbose);
        j.push('\n');
        j
    } else {
        report.to_text(args.verbose)
    };
    // A closed pipe (`iwdump f | head`) is not an error worth a panic.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
