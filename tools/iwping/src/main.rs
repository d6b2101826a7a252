//! `iwping`: rping (rdma-core's `librdmacm/examples/rping.c`) on the soft iWARP device
//! over a TAP, or with `--device NAME` on a kernel RDMA device through rdma-core (`siw0`,
//! `cxgb4_0`). One engine ([`iwping::run`]) for both: everything past device selection is
//! the same code. It speaks rping's protocol, so either side can be a real rping (e.g. on
//! Linux's kernel siw).
//!
//! ```text
//! iwping --tap TAP --ip 10.77.0.9/24 -s [-vVd] [-S size] [-C count] [-a addr] [-p port]
//! iwping --tap TAP --ip 10.77.0.9/24 -c [-vVd] [-S size] [-C count] -a addr [-p port]
//! iwping --udp 127.0.0.1:4701 --udp-peer 127.0.0.1:4702 --ip 10.77.0.9/24 -s|-c ...  # no root
//!        [--mac M] [--pcap FILE] [--crc if-peer-asks|wanted|required] [--mpa-rev 1|2] [--p2p]
//! iwping --netdev IF -s|-c ...   # the soft device on IF's kernel TCP, IF's addresses (no root)
//! iwping --device siw0 -s|-c [-vVd] [-S size] [-C count] [-a addr] [-p port] [--ird-ord I,O]
//! ```
//!
//! Output as rping's: `ping data: rdma-ping-N: ...` (client, `-v`), `server ping data:
//! ...` (server, `-v`), rping's debug lines with `-d`. Exit status 0 on success, 1 on
//! failure (the reason on stderr), 3 when `--device` names no device or rdma-core is not
//! installed, or `--netdev` names no interface or one without an IPv4 address (one line
//! on stderr), 2 for usage errors, 130 on a signal. Logs: `RUST_LOG` (default `warn`).

use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use iwping::rping;
use iwping::{run, PingOptions, Role};
use mpa::negotiate::CrcPolicy;
use mpa::wire::RtrKinds;
use rdma_cm::RdmaCmConfig;
use softiwarp::cm::provider::SoftCm;
use softiwarp::cm::rdmacm::{SoftDevice, SoftRdmaCm};
use softiwarp::{Device, DeviceConfig, LinkConfig};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Crc {
    /// Use CRC when the peer asks (Linux siw's default).
    IfPeerAsks,
    /// Ask for CRC.
    Wanted,
    /// Ask for CRC and, as initiator, fail a Reply without it (siw `mpa_crc_required`).
    Required,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Rtr {
    /// Zero-length RDMA Write.
    Write,
    /// Zero-length RDMA Read.
    Read,
    /// Zero-length Send.
    Send,
    /// Write or Read (the default).
    WriteRead,
}

fn parse_ird_ord(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("bad IRD,ORD {s:?} (want two numbers 0..=16383, e.g. 1,1)");
    let (a, b) = s.split_once(',').ok_or_else(bad)?;
    let ird: u16 = a.trim().parse().map_err(|_| bad())?;
    let ord: u16 = b.trim().parse().map_err(|_| bad())?;
    if ird > 0x3fff || ord > 0x3fff {
        return Err(bad());
    }
    Ok((ird, ord))
}

/// rping on the soft iWARP device.
#[derive(Debug, Parser)]
#[command(name = "iwping", disable_version_flag = true)]
struct Cli {
    /// Server side.
    #[arg(
        short = 's',
        conflicts_with = "client",
        required_unless_present = "client"
    )]
    server: bool,
    /// Client side.
    #[arg(short = 'c')]
    client: bool,
    /// Address: the server's (client), or the one to listen on (server; default all).
    #[arg(short = 'a')]
    addr: Option<Ipv4Addr>,
    /// Port.
    #[arg(short = 'p', default_value_t = rping::RPING_PORT)]
    port: u16,
    /// Ping count (0: until stopped).
    #[arg(short = 'C', default_value_t = 0)]
    count: u64,
    /// Ping data size in bytes (26..=65535).
    #[arg(short = 'S', default_value_t = rping::DEFAULT_SIZE)]
    size: usize,
    /// Display ping data.
    #[arg(short = 'v')]
    verbose: bool,
    /// Validate ping data.
    #[arg(short = 'V')]
    validate: bool,
    /// Debug lines.
    #[arg(short = 'd')]
    debug: bool,
    /// An rdma-core device to run on (siw0, cxgb4_0) in place of the soft device on
    /// `--tap`/`--ip`.
    #[arg(long, conflicts_with_all = ["tap", "udp", "ip", "mac", "pcap"])]
    device: Option<String>,
    /// The soft device: the TAP interface to open (in this process's namespace).
    #[arg(long, required_unless_present_any = ["device", "udp", "netdev"], conflicts_with = "udp")]
    tap: Option<String>,
    /// The soft device on the host's kernel TCP, bound to this interface (as `rdma link
    /// add NAME type siw netdev IF`; no root): its addresses are the interface's. No
    /// --ip, --mac or --pcap (capture with `tcpdump -i IF`).
    #[arg(long, value_name = "IF")]
    netdev: Option<String>,
    /// The soft device on a UDP link instead of a TAP (no root): the local ADDR:PORT
    /// to bind; Ethernet frames go as UDP datagrams to --udp-peer (as QEMU's
    /// `-netdev dgram`; libsoftiwarp's `link=udp:`).
    #[arg(long, requires = "udp_peer")]
    udp: Option<std::net::SocketAddr>,
    /// The UDP link's other end, ADDR:PORT (with --udp).
    #[arg(long, requires = "udp")]
    udp_peer: Option<std::net::SocketAddr>,
    /// The soft device: this side's IPv4 address and prefix length, e.g. 10.234.0.1/24.
    #[arg(long, required_unless_present_any = ["device", "netdev"])]
    ip: Option<String>,
    /// The soft device: its MAC address, six hex octets (default 02:00 + the four
    /// address bytes).
    #[arg(long)]
    mac: Option<String>,
    /// The soft device: capture every frame of its link to a pcap file.
    #[arg(long)]
    pcap: Option<std::path::PathBuf>,
    /// MPA CRC policy.
    #[arg(
        long,
        value_enum,
        default_value = "if-peer-asks",
        conflicts_with = "device"
    )]
    crc: Crc,
    /// MPA revision to speak (1: RFC 5044, no IRD/ORD exchange; 2: RFC 6581).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2), conflicts_with = "device")]
    mpa_rev: u8,
    /// As client, ask for MPA peer-to-peer mode (RTR: zero-length Write or Read).
    #[arg(long, conflicts_with = "device")]
    p2p: bool,
    /// RTR kinds: as initiator, those offered with --p2p; as responder, those accepted.
    #[arg(
        long,
        value_enum,
        default_value = "write-read",
        conflicts_with = "device"
    )]
    rtr: Rtr,
    /// Our IRD and ORD for rdma_connect/rdma_accept, as IRD,ORD (default: rping's: client
    /// 1,1; server mirrors the request).
    #[arg(long, value_parser = parse_ird_ord)]
    ird_ord: Option<(u16, u16)>,
    /// As client, hold the first FPDU this many milliseconds after the MPA Reply: a
    /// Linux siw responder (6.1) may leave an FPDU that arrives right behind its Reply
    /// unread (see docs/ARCHITECTURE.md, "Interop with kernel siw"). 0: send at once.
    #[arg(long, default_value_t = softiwarp::spec::DEFAULT_FIRST_FPDU_DELAY_MS, conflicts_with = "device")]
    first_fpdu_delay_ms: u64,
    /// Seconds any one step (a completion, an event, the connection) may take.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
}

fn main() -> ExitCode {
    // First, before any thread starts: SIGINT/SIGTERM/SIGHUP end the run through its
    // destroy path, so the peer sees the connection end at once.
    if let Err(e) = netlab::signals::install_handler() {
        eprintln!("iwping: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = netlab::logging::init_peer("warn") {
        eprintln!("iwping: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    // Usage errors (bad values clap cannot check alone) are status 2, as clap's own.
    if let Err(e) = usage_check(&cli) {
        eprintln!("iwping: {e}");
        return ExitCode::from(2);
    }
    if let Some(ifname) = &cli.netdev {
        // As a --device that does not exist: one line, status 3.
        if let Err(e) = netlab::HostInterface::find(ifname) {
            eprintln!("iwping: {e}");
            return ExitCode::from(3);
        }
    }
    let result = match &cli.device {
        Some(name) => match open_rdma_core(name) {
            Ok(channel) => ping_on(&channel, &cli, Some(name.clone())),
            Err(line) => {
                eprintln!("iwping: {line}");
                return ExitCode::from(3);
            }
        },
        None => ping(&cli),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iwping: {e}");
            if netlab::signals::interrupted() {
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// rdma-core's event channel, once the device `name` is known to exist; the error is
/// the one line to print before exiting with status 3 (`rdma-core (libibverbs.so.1) not
/// found`, `no RDMA device named 'X' (found: ...)`), or the failure to make the channel.
fn open_rdma_core(name: &str) -> Result<cxgb4::EventChannel, String> {
    let core = Arc::new(cxgb4::RdmaCore::load().map_err(|e| e.to_string())?);
    drop(cxgb4::Context::open(&core, name).map_err(|e| e.to_string())?);
    cxgb4::EventChannel::new(&core).map_err(|e| format!("rdma_create_event_channel: {e}"))
}

/// rping's options of the command line.
fn options(cli: &Cli, device: Option<String>) -> PingOptions {
    PingOptions {
        role: if cli.server {
            Role::Server
        } else {
            Role::Client
        },
        addr: cli.addr,
        port: cli.port,
        count: cli.count,
        size: cli.size,
        verbose: cli.verbose,
        validate: cli.validate,
        debug: cli.debug,
        ird_ord: cli.ird_ord,
        device,
        step_timeout: Duration::from_secs(cli.timeout.max(1)),
    }
}

/// The checks of the options that clap cannot do alone: rping's (`PingOptions::check`:
/// size, count, `-a` for the client), on the soft device `--ip ADDR/PREFIX` and
/// `--mac`, with `--netdev` no other link and none of a frame link's options. Errors:
/// the message of the first that fails.
fn usage_check(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    options(cli, cli.device.clone()).check()?;
    if let Some(ifname) = &cli.netdev {
        let given = [
            ("--device", cli.device.is_some()),
            ("--tap", cli.tap.is_some()),
            ("--udp", cli.udp.is_some()),
            ("--ip", cli.ip.is_some()),
            ("--mac", cli.mac.is_some()),
            ("--pcap", cli.pcap.is_some()),
        ];
        if let Some((option, _)) = given.iter().find(|(_, on)| *on) {
            return Err(netlab::netdev_conflict(ifname, option).into());
        }
        return Ok(());
    }
    if cli.device.is_none() {
        let link_args = netlab::LinkArgs {
            tap: cli.tap.clone().unwrap_or_default(),
            ip: cli.ip.clone().unwrap_or_default(),
            mac: cli.mac.clone(),
            pcap: cli.pcap.clone(),
        };
        link_args.cidr()?;
        link_args.mac()?;
    }
    Ok(())
}

/// Runs rping on an rdma-core device's event channel.
fn ping_on(
    channel: &cxgb4::EventChannel,
    cli: &Cli,
    device: Option<String>,
) -> Result<(), Box<dyn std::error::Error>> {
    let opts = options(cli, device);
    let summary = run(channel, &opts, &mut std::io::stdout())?;
    tracing::info!(?summary, "done");
    Ok(())
}

/// The soft device's configuration: on `--netdev`'s kernel TCP with the interface's
/// addresses, or on `--tap` / `--udp` with `--ip`, `--mac` and `--pcap`.
fn device_config(cli: &Cli, name: &str) -> Result<DeviceConfig, Box<dyn std::error::Error>> {
    if let Some(ifname) = &cli.netdev {
        return Ok(DeviceConfig::new(
            name,
            LinkConfig::netdev(ifname),
            Ipv4Addr::UNSPECIFIED,
            0,
        ));
    }
    let link_args = netlab::LinkArgs {
        tap: cli.tap.clone().unwrap_or_default(),
        ip: cli.ip.clone().unwrap_or_default(),
        mac: cli.mac.clone(),
        pcap: cli.pcap.clone(),
    };
    let (ip, prefix_len) = link_args.cidr()?;
    let mut link = match (cli.udp, cli.udp_peer) {
        (Some(bind), Some(peer)) => LinkConfig::udp(softiwarp::link::UdpConfig::new(bind, peer)),
        _ => LinkConfig::tap(&link_args.tap),
    };
    if let Some(p) = &link_args.pcap {
        link = link.with_pcap(p);
    }
    let mut config = DeviceConfig::new(name, link, ip, prefix_len);
    if let Some(m) = link_args.mac()? {
        config.interface.mac = m;
    }
    Ok(config)
}

/// Runs rping on the soft device over `--tap`, `--udp` or `--netdev`.
fn ping(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    let opts = options(cli, None);
    opts.check()?;
    let name = "iwping";
    let mut config = device_config(cli, name)?;
    // A fresh TCP port and ISN each run: a peer may still hold the last run's connection.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    config.interface.random_seed = now.as_nanos() as u64 ^ u64::from(std::process::id());
    config.mpa.first_fpdu_delay_us = cli.first_fpdu_delay_ms.saturating_mul(1000);
    let settings = &mut config.mpa.settings;
    settings.rev = cli.mpa_rev;
    settings.crc = match cli.crc {
        Crc::IfPeerAsks => CrcPolicy::IfPeerAsks,
        Crc::Wanted => CrcPolicy::Wanted,
        Crc::Required => CrcPolicy::Required,
    };
    settings.p2p = cli.p2p;
    settings.rtr = match cli.rtr {
        Rtr::Write => RtrKinds {
            write: true,
            ..RtrKinds::NONE
        },
        Rtr::Read => RtrKinds {
            read: true,
            ..RtrKinds::NONE
        },
        Rtr::Send => RtrKinds {
            send: true,
            ..RtrKinds::NONE
        },
        Rtr::WriteRead => RtrKinds {
            write: true,
            read: true,
            send: false,
        },
    };
    let device = Arc::new(Device::open(config)?);
    let cm = SoftRdmaCm::new(RdmaCmConfig {
        name: "iwping".into(),
        ..RdmaCmConfig::default()
    })?;
    cm.add_device(SoftDevice::new(device.clone())?)?;
    let mut out = std::io::stdout();
    let result = run(&SoftCm::new(&cm), &opts, &mut out);
    // Release the device from the CM (its iWARP CM and provider let go of it), so the
    // engine can be stopped and the capture closed.
    match cm.remove_device(name) {
        Ok(removal) => {
            if let Err(e) = removal.wait_timeout(Duration::from_secs(5)) {
                tracing::warn!(error = %e, "device removal did not finish");
            }
        }
        Err(e) => tracing::warn!(error = %e, "device removal"),
    }
    cm.shutdown()?;
    close_device(device);
    let summary = result?;
    tracing::info!(?summary, "done");
    Ok(())
}

/// Stops the device's engine before the process ends (which flushes and closes the
/// capture): once the CM's threads let go of the device (they check every few hundred
/// milliseconds), the last handle is ours, and dropping it joins the engine thread.
fn close_device(mut device: Arc<Device>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match Arc::try_unwrap(device) {
            Ok(d) => return d.close(),
            Err(shared) if std::time::Instant::now() < deadline => {
                device = shared;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => {
                tracing::warn!(
                    "the device is still in use after 5 s; the capture may be cut short"
                );
                return;
            }
        }
    }
}
