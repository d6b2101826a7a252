//! `iwarp-peer`: one side of an MPA ULPDU transfer on the soft iWARP device, over a TAP,
//! run inside the TAP's namespace by the tests (`ip netns exec NS iwarp-peer ...`).
//!
//! ```text
//! iwarp-peer server --tap T --ip 10.234.0.1/24 --mac 02:00:0a:ea:00:01 --peer-ip 10.234.0.2
//! iwarp-peer client --tap T --ip 10.234.0.2/24 --mac 02:00:0a:ea:00:02 --peer-ip 10.234.0.1 --bytes 1073741824
//! ```
//!
//! The server prints `READY` once it listens; both print `RESULT <json>` (a
//! `bench::ulpdu::TransferStats`) and exit 0, or print the error and exit 1. Logs
//! go to stderr, filtered by `RUST_LOG` (default `warn`).

use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::time::Duration;

use bench::mpa_peer::{self, MpaPeerOptions, PeerRole};
use bench::ulpdu::Amount;
use clap::{Parser, ValueEnum};
use mpa::negotiate::CrcPolicy;

#[derive(ValueEnum, Debug, Clone, Copy)]
enum Role {
    Server,
    Client,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
enum Crc {
    /// Set C: CRC in both directions.
    Wanted,
    /// Use CRC only if the peer sets C.
    IfPeerAsks,
    /// Refuse CRC.
    Refused,
}

#[derive(Parser, Debug)]
#[command(about = "One side of an MPA ULPDU transfer over a TAP (soft iWARP device)")]
struct Cli {
    /// Server (listens, receives) or client (connects, sends).
    #[arg(value_enum)]
    role: Role,
    /// `--tap --ip --mac --pcap` (`--mac` is required here).
    #[command(flatten)]
    link: netlab::LinkArgs,
    /// The server's address.
    #[arg(long)]
    peer_ip: Ipv4Addr,
    /// The server's TCP port.
    #[arg(long, default_value_t = 7174)]
    port: u16,
    /// MPA CRC policy of this side.
    #[arg(long, value_enum, default_value = "wanted")]
    crc: Crc,
    /// Client: ULPDU bytes to send.
    #[arg(long, default_value_t = 1 << 30)]
    bytes: u64,
    /// Client: send for this many seconds instead of a byte count.
    #[arg(long)]
    seconds: Option<f64>,
    /// ULPDU size in bytes (default: MULPDU).
    #[arg(long)]
    ulpdu_size: Option<usize>,
    /// Do not verify (receiver: count only; sender: no CRC32c).
    #[arg(long)]
    no_verify: bool,
    /// Client: abort the connection (RST) after this many bytes (failure-path tests).
    #[arg(long)]
    abort_after: Option<u64>,
    /// Keep at most this many bytes of the capture (whole frames).
    #[arg(long, default_value_t = 20 << 20)]
    pcap_limit: u64,
    /// Engine busy-poll time in microseconds after activity.
    #[arg(long)]
    spin_us: Option<u64>,
    /// Open the TAP without checksum and segmentation offload: the kernel then cuts
    /// the peer's super-segments before this side reads them (and captures them).
    #[arg(long)]
    no_offload: bool,
}

fn main() -> ExitCode {
    if let Err(e) = netlab::logging::init_peer("warn") {
        eprintln!("iwarp-peer: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    let (ip, prefix_len) = match cli.link.cidr() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("iwarp-peer: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mac = match cli.link.mac() {
        Ok(Some(m)) => m,
        Ok(None) => {
            eprintln!("iwarp-peer: --mac is required");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("iwarp-peer: {e}");
            return ExitCode::FAILURE;
        }
    };
    let role = match cli.role {
        Role::Server => PeerRole::Server,
        Role::Client => PeerRole::Client,
    };
    let mut opts = MpaPeerOptions::new(role, &cli.link.tap, ip, mac, cli.peer_ip);
    opts.prefix_len = prefix_len;
    opts.port = cli.port;
    opts.crc = match cli.crc {
        Crc::Wanted => CrcPolicy::Wanted,
        Crc::IfPeerAsks => CrcPolicy::IfPeerAsks,
        Crc::Refused => CrcPolicy::Refused,
    };
    opts.transfer.amount = match cli.seconds {
        Some(s) => Amount::Time(Duration::from_secs_f64(s)),
        None => Amount::Bytes(cli.bytes),
    };
    opts.transfer.verify = !cli.no_verify;
    opts.transfer.ulpdu_size = cli.ulpdu_size;
    opts.transfer.abort_after = cli.abort_after;
    opts.pcap = cli.link.pcap.map(|p| (p, cli.pcap_limit));
    opts.offload = !cli.no_offload;
    if let Some(us) = cli.spin_us {
        opts.spin = Duration::from_micros(us);
    }
    match mpa_peer::run(&opts, || println!("READY")) {
        Ok(stats) => match serde_json::to_string(&stats) {
            Ok(json) => {
                println!("RESULT {json}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("iwarp-peer: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("iwarp-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
