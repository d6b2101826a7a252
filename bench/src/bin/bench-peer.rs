//! `bench-peer`: one side of one benchmark transfer over a TAP, run inside the TAP's
//! network namespace (the `transport-bench` runner starts it with `ip netns exec`).
//!
//! ```text
//! bench-peer tcp --role server --tap TAP --ip 10.234.0.1/24 --mac 02:00:0a:ea:00:01 --peer-ip 10.234.0.2
//! bench-peer tcp --role client --tap TAP --ip 10.234.0.2/24 --mac 02:00:0a:ea:00:02 --peer-ip 10.234.0.1 --seconds 4
//! bench-peer fpdu --crc on --role server ...   # the same over an MPA connection of the device
//! ```
//!
//! `tcp` is raw smoltcp TCP in one thread (`bench::tcp`). `fpdu` opens the soft iWARP
//! device (`softiwarp::device`, its engine thread) on the TAP and moves ULPDUs of MULPDU
//! bytes over one MPA connection (`bench::ulpdu`), with MPA CRCs on or off.
//!
//! The server prints `READY` once it listens; both print `RESULT <json>` (a
//! `bench::tcp::TransferReport`) at the end and exit 0, or print the error and exit 1.
//! Logs go to stderr, filtered by `RUST_LOG` (default `warn`).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;
use std::time::Duration;

use bench::inline::InlineConfig;
use bench::mpa_peer::{self, MpaPeerOptions, PeerRole};
use bench::tcp::{self, Amount, Role, TcpBenchConfig, TransferReport};
use bench::ulpdu::Amount as UlpduAmount;
use bench::BenchError;
use clap::{Args, Parser, Subcommand, ValueEnum};
use mpa::negotiate::CrcPolicy;
use softiwarp::link::TapLink;
use softiwarp::transport::smoltcp_glue::{InterfaceConfig, TcpConfig};

#[derive(Parser, Debug)]
#[command(about = "One side of a benchmark transfer over a TAP (see transport-bench)")]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Raw smoltcp TCP bulk transfer (the baseline).
    Tcp(Common),
    /// ULPDUs over an MPA connection of the soft iWARP device.
    Fpdu(FpduArgs),
    /// The same ULPDUs over softiwarp's sans-IO stack driven in this one thread (no
    /// engine thread, no queues).
    Inline(FpduArgs),
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum OnOff {
    On,
    Off,
}

#[derive(Args, Debug)]
struct FpduArgs {
    /// MPA CRC32c on (both sides set C) or off (neither does).
    #[arg(long, value_enum)]
    crc: OnOff,
    #[command(flatten)]
    common: Common,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
enum RoleArg {
    Server,
    Client,
}

#[derive(Args, Debug)]
struct Common {
    /// Server (listens, receives) or client (connects, sends).
    #[arg(long, value_enum)]
    role: RoleArg,
    /// `--tap --ip --mac` (`--mac` is required here; `--pcap` is refused: a capture
    /// would skew the measurement).
    #[command(flatten)]
    link: netlab::LinkArgs,
    /// The server's address (the client connects to it).
    #[arg(long)]
    peer_ip: Ipv4Addr,
    /// The server's TCP port.
    #[arg(long, default_value_t = 5201)]
    port: u16,
    /// Client: send for this many seconds.
    #[arg(long, conflicts_with = "bytes", value_parser = bench::parse_seconds)]
    seconds: Option<f64>,
    /// Client: send exactly this many bytes (default 1 GiB when --seconds is not given).
    #[arg(long)]
    bytes: Option<u64>,
    /// Bytes per application read/write.
    #[arg(long, default_value_t = tcp::DEFAULT_IO_SIZE)]
    io_size: usize,
    /// TCP send and receive buffer in bytes.
    #[arg(long, default_value_t = 256 * 1024)]
    buffer: usize,
    /// CRC32c over every byte moved (reported; compare the two sides).
    #[arg(long)]
    verify: bool,
    /// Pin the process to this CPU.
    #[arg(long)]
    cpu: Option<usize>,
    /// Busy-poll this many microseconds after the last activity before sleeping (the
    /// device engine's default is 50).
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
}

fn parse_iface(c: &Common) -> Result<InterfaceConfig, BenchError> {
    let (address, prefix_len) = c.link.cidr().map_err(BenchError::Config)?;
    if c.link.pcap.is_some() {
        return Err(BenchError::Config(
            "bench-peer does not capture (--pcap)".into(),
        ));
    }
    Ok(InterfaceConfig {
        mac: c
            .link
            .mac()
            .map_err(BenchError::Config)?
            .ok_or_else(|| BenchError::Config("--mac is required".into()))?,
        address,
        prefix_len,
        gateway: None,
        random_seed: u64::from(std::process::id()),
    })
}

fn print_report(report: &TransferReport) -> Result<(), BenchError> {
    let json = serde_json::to_string(report).map_err(|e| BenchError::Report {
        peer: "self".into(),
        message: e.to_string(),
    })?;
    println!("RESULT {json}");
    Ok(())
}

fn run_fpdu(f: &FpduArgs) -> Result<(), BenchError> {
    let c = &f.common;
    if let Some(cpu) = c.cpu {
        bench::pin_to_cpu(cpu)?;
    }
    let iface = parse_iface(c)?;
    let role = match c.role {
        RoleArg::Server => PeerRole::Server,
        RoleArg::Client => PeerRole::Client,
    };
    let mut opts = MpaPeerOptions::new(role, &c.link.tap, iface.address, iface.mac, c.peer_ip);
    opts.prefix_len = iface.prefix_len;
    opts.port = c.port;
    opts.crc = match f.crc {
        OnOff::On => CrcPolicy::Wanted,
        OnOff::Off => CrcPolicy::IfPeerAsks,
    };
    opts.transfer.amount = match (c.seconds, c.bytes) {
        (Some(s), _) => UlpduAmount::Time(Duration::from_secs_f64(s)),
        (None, Some(b)) => UlpduAmount::Bytes(b),
        (None, None) => UlpduAmount::Bytes(1 << 30),
    };
    opts.transfer.verify = c.verify;
    opts.spin = Duration::from_micros(c.spin_us);
    opts.tcp.rx_buffer = c.buffer;
    opts.tcp.tx_buffer = c.buffer;
    let stats = mpa_peer::run(&opts, || println!("READY"))
        .map_err(|e| BenchError::Tcp(format!("fpdu: {e}")))?;
    if stats.mpa_crc != (f.crc == OnOff::On) {
        return Err(BenchError::Config(format!(
            "MPA CRC negotiated {}, asked {:?}",
            stats.mpa_crc, f.crc
        )));
    }
    let (cpu_user, cpu_sys) = bench::cpu_time();
    print_report(&TransferReport {
        mode: if stats.mpa_crc {
            "fpdu-crc"
        } else {
            "fpdu-nocrc"
        }
        .into(),
        role: match role {
            PeerRole::Server => Role::Server,
            PeerRole::Client => Role::Client,
        },
        mtu: stats.emss + 40,
        bytes: stats.bytes,
        seconds: stats.seconds,
        gbit_per_s: stats.gbit_per_s,
        crc32c: stats.crc32c,
        tx_frames: 0,
        rx_frames: 0,
        cpu_user,
        cpu_sys,
    })
}

fn run_inline(f: &FpduArgs) -> Result<(), BenchError> {
    let c = &f.common;
    if let Some(cpu) = c.cpu {
        bench::pin_to_cpu(cpu)?;
    }
    let iface = parse_iface(c)?;
    let role = match c.role {
        RoleArg::Server => Role::Server,
        RoleArg::Client => Role::Client,
    };
    let server = match role {
        Role::Server => SocketAddrV4::new(iface.address, c.port),
        Role::Client => SocketAddrV4::new(c.peer_ip, c.port),
    };
    let cfg = InlineConfig {
        role,
        iface,
        server,
        amount: match (c.seconds, c.bytes) {
            (Some(s), _) => Amount::Time(Duration::from_secs_f64(s)),
            (None, Some(b)) => Amount::Bytes(b),
            (None, None) => Amount::Bytes(1 << 30),
        },
        crc: match f.crc {
            OnOff::On => CrcPolicy::Wanted,
            OnOff::Off => CrcPolicy::IfPeerAsks,
        },
        tcp: TcpConfig {
            rx_buffer: c.buffer,
            tx_buffer: c.buffer,
            ..TcpConfig::default()
        },
        verify: c.verify,
        spin: Duration::from_micros(c.spin_us),
        timeout: Duration::from_secs(c.timeout),
    };
    let mut link = TapLink::open(&c.link.tap)?;
    tcp::wait_link_up(&mut link, Duration::from_secs(5))?;
    let report = bench::inline::run(link, &cfg, || println!("READY"))?;
    let want = if f.crc == OnOff::On {
        "fpdu-inline-crc"
    } else {
        "fpdu-inline-nocrc"
    };
    if report.mode != want {
        return Err(BenchError::Config(format!(
            "negotiated {}, asked {want}",
            report.mode
        )));
    }
    print_report(&report)
}

fn run_tcp(c: &Common) -> Result<(), BenchError> {
    if let Some(cpu) = c.cpu {
        bench::pin_to_cpu(cpu)?;
    }
    let iface = parse_iface(c)?;
    let role = match c.role {
        RoleArg::Server => Role::Server,
        RoleArg::Client => Role::Client,
    };
    let mut cfg = TcpBenchConfig::new(role, iface, c.peer_ip);
    cfg.port = c.port;
    cfg.amount = match (c.seconds, c.bytes) {
        (Some(s), _) => Amount::Time(Duration::from_secs_f64(s)),
        (None, Some(b)) => Amount::Bytes(b),
        (None, None) => Amount::Bytes(1 << 30),
    };
    cfg.io_size = c.io_size;
    cfg.tcp.rx_buffer = c.buffer;
    cfg.tcp.tx_buffer = c.buffer;
    cfg.verify = c.verify;
    cfg.spin = Duration::from_micros(c.spin_us);
    cfg.timeout = Duration::from_secs(c.timeout);
    let mut link = TapLink::open(&c.link.tap)?;
    tcp::wait_link_up(&mut link, Duration::from_secs(5))?;
    let report = match role {
        Role::Server => tcp::run_server(link, &cfg, || println!("READY"))?,
        Role::Client => tcp::run_client(link, &cfg)?,
    };
    print_report(&report)
}

fn main() -> ExitCode {
    if let Err(e) = netlab::logging::init_peer("warn") {
        eprintln!("bench-peer: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    let res = match &cli.mode {
        Mode::Tcp(c) => run_tcp(c),
        Mode::Fpdu(f) => run_fpdu(f),
        Mode::Inline(f) => run_inline(f),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
