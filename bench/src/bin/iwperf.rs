//! `iwperf`: perftest for the soft iWARP device (over TAPs, through rdma-cm and verbs),
//! and `iwperf demo`, the main job in one command.
//!
//! ```text
//! iwperf demo                                  # as root: two namespaces, TAPs, a bridge; baseline + Write/Read/Send + latency
//! iwperf demo --json --duration 1              # one JSON object
//! iwperf server --tap tap0 --ip 10.0.0.1/24    # one side (in the TAP's namespace)
//! iwperf client --tap tap1 --ip 10.0.0.2/24 --peer 10.0.0.1 --op write --size 65536 --duration 5
//! iwperf client ... --lat --op send --size 8 --iters 10000
//! iwperf server --device siw0                  # an rdma-core device (siw0, cxgb4_0) instead of the soft device
//! iwperf client --device siw0 --peer 10.0.0.1 --op read --verify
//! iwperf server --netdev lo                    # the soft device on the host's kernel TCP (no root)
//! iwperf client --netdev lo --peer 127.0.0.1 --op write,read,send --verify
//! ```
//!
//! Exit statuses: 0 success, 1 other failure, 2 usage, 3 connection failure (resolve,
//! reject, unreachable, lost), no such `--device` / no rdma-core, or a `--netdev`
//! interface that does not exist or has no IPv4 address, 4 `--verify` found
//! mismatches, 5 device removal (partial results printed), 130 interrupted. Logs go to stderr, filtered by `RUST_LOG`
//! (default `warn`).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bench::iwperf::conn::{DeviceOptions, LinkChoice, MpaProfile};
use bench::iwperf::datapath::{Progress, RunLength, ServerLimits, Tuning};
use bench::iwperf::demo::{self, DemoConfig};
use bench::iwperf::peer::{run_client, run_server, Backend, ClientTest, RemovalReport};
use bench::iwperf::report::{bw_table, lat_table, verify_name};
use bench::iwperf::wire::{Mode, Op};
use bench::iwperf::{IwperfError, EXIT_OK};
use bench::tcp::{self, Amount, Role, TcpBenchConfig};
use bench::tcp_lat::{self, Rounds};
use clap::{Args, Parser, Subcommand, ValueEnum};
use netlab::{HostInterface, InterfaceError};
use softiwarp::link::TapLink;
use softiwarp::transport::smoltcp_glue::InterfaceConfig;

#[derive(Parser, Debug)]
#[command(
    name = "iwperf",
    about = "perftest for the soft iWARP device: RDMA Write/Read/Send bandwidth and latency over TAPs, through rdma-cm",
    after_help = "Exit status: 0 ok, 1 failure, 2 usage, 3 connection failure, 4 verify mismatch, 5 device removal, 130 interrupted."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Two namespaces, a TAP in each on a bridge, joined by a veth: iWARP Write, Read,
    /// Send and Send ping-pong on the TAPs against raw smoltcp TCP, and on the host's
    /// kernel TCP against kernel TCP; one table (needs root; without it, the TAP rows
    /// over an in-memory link in one process).
    Demo(DemoArgs),
    /// Accept one test (any number of connections) and serve it.
    Server(ServerArgs),
    /// Connect to a server and run a test.
    Client(ClientArgs),
    /// One side of the raw smoltcp TCP baseline (bulk or ping-pong); used by the demo.
    #[command(hide = true)]
    TcpPeer(TcpPeerArgs),
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum ProgressArg {
    /// Only the engine thread drives.
    Engine,
    /// Verbs calls drive too (run to completion).
    Hybrid,
}

impl ProgressArg {
    fn mode(self) -> softiwarp::ProgressMode {
        match self {
            ProgressArg::Engine => softiwarp::ProgressMode::Engine,
            ProgressArg::Hybrid => softiwarp::ProgressMode::Hybrid,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Args, Debug, Clone)]
struct MpaArgs {
    /// MPA CRC32c (asked for with the C bit; used when either side asks).
    #[arg(long, value_enum, default_value = "on")]
    crc: OnOff,
    /// MPA markers in the data this side receives.
    #[arg(long, value_enum, default_value = "off")]
    markers: OnOff,
    /// MPA revision (2 carries IRD/ORD; 1 is RFC 5044).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    mpa_rev: u8,
    /// MPA defaults to start from: Linux siw's (no peer-to-peer mode), or Chelsio
    /// iw_cxgb4's (peer-to-peer mode with a zero-length Read as the RTR); --crc,
    /// --markers and --mpa-rev apply on top.
    #[arg(long, value_enum, default_value = "siw")]
    mpa_profile: MpaProfile,
    /// Engine busy-poll time after activity, in microseconds.
    #[arg(long, default_value_t = DEFAULT_SPIN_US)]
    spin_us: u64,
    /// Who drives the soft device: the engine thread alone, or the application's
    /// verbs calls too (`softiwarp::ProgressMode`; the device's `SOFTIWARP_PROGRESS`).
    #[arg(long, value_enum, default_value = "hybrid", env = "SOFTIWARP_PROGRESS")]
    progress_mode: ProgressArg,
    /// Bandwidth runs: how long the application polls its CQ (yielding) before it
    /// blocks, in microseconds.
    #[arg(long, default_value_t = 0)]
    poll_spin_us: u64,
    /// Latency runs: the same.
    #[arg(long, default_value_t = 200)]
    lat_poll_spin_us: u64,
    /// Bandwidth runs: when idle, sleep this many microseconds instead of waiting on
    /// the CQ (0: wait on the CQ).
    #[arg(long, default_value_t = 0)]
    poll_nap_us: u64,
    /// TCP send and receive buffer, bytes [default: 262144 (256 KiB); for `demo`
    /// 1048576 (1 MiB), where the window of 256 KiB held the bulk runs back, see
    /// docs/PERFORMANCE.md]
    #[arg(long)]
    tcp_buffer: Option<usize>,
    /// Open the TAP without checksum and segmentation offload (IFF_VNET_HDR,
    /// TUNSETOFFLOAD): every frame one MTU, one system call each.
    #[arg(long)]
    no_offload: bool,
    /// As client, hold the first FPDU this many milliseconds after the MPA Reply: a
    /// Linux siw responder (6.1) may leave an FPDU that arrives right behind its Reply
    /// unread (docs/ARCHITECTURE.md, "Interop with kernel siw"). 0: send at once.
    #[arg(long, default_value_t = DEFAULT_FIRST_FPDU_DELAY_MS)]
    first_fpdu_delay_ms: u64,
}

/// One side's device: the soft device on a TAP (netlab's `--tap --ip --mac --pcap`), on
/// a UDP link, or on a host interface's kernel TCP (`--netdev`), or an rdma-core device
/// (`--device`), and iwperf's own extras.
#[derive(Args, Debug, Clone)]
struct SideArgs {
    /// The TAP interface the soft device opens (in this process's namespace).
    #[arg(long, required_unless_present_any = ["device", "udp", "netdev"], conflicts_with_all = ["device", "udp"])]
    tap: Option<String>,
    /// The soft device on the host's kernel TCP, bound to this interface (as `rdma link
    /// add NAME type siw netdev IF`), no root needed: its addresses are the interface's
    /// (the server listens on them; the client connects from the kernel's route to
    /// --peer). No --ip, --mac or --pcap (capture with `tcpdump -i IF`).
    #[arg(long, value_name = "IF")]
    netdev: Option<String>,
    /// A UDP link instead of a TAP, no root needed: the local ADDR:PORT to bind
    /// (Ethernet frames as UDP datagrams, as QEMU's `-netdev dgram`); needs
    /// --udp-peer, the other end's ADDR:PORT.
    #[arg(long, requires = "udp_peer", conflicts_with = "device")]
    udp: Option<std::net::SocketAddr>,
    /// The UDP link's other end, ADDR:PORT (with --udp).
    #[arg(long, requires = "udp")]
    udp_peer: Option<std::net::SocketAddr>,
    /// This side's IPv4 address and prefix length on the TAP or UDP link, e.g.
    /// 10.234.0.1/24.
    #[arg(long, required_unless_present_any = ["device", "netdev"], conflicts_with = "device")]
    ip: Option<String>,
    /// This side's MAC address on the TAP, six hex octets (e.g. 02:00:0a:ea:00:01).
    #[arg(long, conflicts_with = "device")]
    mac: Option<String>,
    /// Capture this side's link to a pcap file.
    #[arg(long, conflicts_with = "device")]
    pcap: Option<PathBuf>,
    /// An rdma-core device (siw0, cxgb4_0) instead of the soft device on --tap/--ip:
    /// libibverbs and librdmacm are loaded at run time.
    #[arg(long)]
    device: Option<String>,
    /// With --device: the local address (the server listens on it, the client connects
    /// from it); default: the device's IPv4 address.
    #[arg(long, requires = "device")]
    bind: Option<Ipv4Addr>,
    /// Set the TAP's MTU first (`ip link set TAP mtu N`).
    #[arg(long)]
    mtu: Option<usize>,
    /// Keep at most this many bytes of capture (whole frames).
    #[arg(long, default_value_t = 64 << 20)]
    pcap_limit: u64,
    /// Pin the process to this CPU.
    #[arg(long)]
    cpu: Option<usize>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ServerArgs {
    #[command(flatten)]
    side: SideArgs,
    #[command(flatten)]
    mpa: MpaArgs,
    /// Port to listen on.
    #[arg(long, default_value_t = demo::IWARP_PORT)]
    port: u16,
    /// Connection requests rdma-cm queues before rejecting.
    #[arg(long, default_value_t = 128)]
    backlog: u32,
    /// Receives posted per connection for Send tests.
    #[arg(long, default_value_t = 512)]
    rx_depth: u32,
    /// Give up if no client connects within this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Reject tests with messages larger than this many bytes.
    #[arg(long, default_value_t = ServerLimits::default().max_size)]
    max_size: u32,
    /// Reject tests with more QPs (connections) than this.
    #[arg(long, default_value_t = ServerLimits::default().max_qps)]
    max_qps: u16,
    /// Reject tests with a deeper send queue than this.
    #[arg(long, default_value_t = ServerLimits::default().max_tx_depth)]
    max_tx_depth: u16,
    /// Reject tests that would make the server allocate more than this many bytes of
    /// buffers in all.
    #[arg(long, default_value_t = ServerLimits::default().max_memory)]
    max_memory: u64,
}

#[derive(Args, Debug)]
struct ClientArgs {
    #[command(flatten)]
    side: SideArgs,
    #[command(flatten)]
    mpa: MpaArgs,
    /// The server's address.
    #[arg(long)]
    peer: Ipv4Addr,
    /// The server's port.
    #[arg(long, default_value_t = demo::IWARP_PORT)]
    port: u16,
    /// Operation(s), comma-separated; QP i runs op i mod the list (e.g. write,read).
    #[arg(long, value_delimiter = ',', default_value = "write")]
    op: Vec<String>,
    /// Message size in bytes; default 65536 (bandwidth) / 2 (latency, as perftest's
    /// `ib_send_lat`).
    #[arg(long)]
    size: Option<u32>,
    /// Iterations (WRs per QP, or round trips); default 5000 (bandwidth) / 1000 (latency).
    #[arg(long, conflicts_with = "duration")]
    iters: Option<u64>,
    /// Run for this many seconds instead.
    #[arg(long, value_parser = bench::parse_seconds)]
    duration: Option<f64>,
    /// Connections (QPs), all to the same server at once.
    #[arg(long, default_value_t = 1)]
    qps: u16,
    /// WRs in flight per QP.
    #[arg(long, default_value_t = 128)]
    tx_depth: u16,
    /// Latency test (ping-pong) instead of bandwidth.
    #[arg(long)]
    lat: bool,
    /// Check the data at the receiver (patterned data, sequence numbers).
    #[arg(long)]
    verify: bool,
    /// Print a PROGRESS line a second (for the demo).
    #[arg(long, hide = true)]
    progress: bool,
    /// Open only these connection indices (comma-separated) of the --qps announced; the
    /// server waits for the others from elsewhere (for the hostile-peer tests).
    #[arg(long, value_delimiter = ',', hide = true)]
    indices: Option<Vec<u16>>,
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// IP MTU of every interface.
    #[arg(long, default_value_t = 65000)]
    mtu: usize,
    /// Seconds per bandwidth run.
    #[arg(long, default_value_t = 3.0, value_parser = bench::parse_seconds)]
    duration: f64,
    /// Rounds (figures are medians; each run alternates with the baseline).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Message size of the bandwidth runs, bytes.
    #[arg(long, default_value_t = 65536)]
    size: u32,
    /// Operations, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "write,read,send")]
    op: Vec<String>,
    /// Connections per bandwidth run.
    #[arg(long, default_value_t = 1)]
    qps: u16,
    /// WRs in flight per QP.
    #[arg(long, default_value_t = 128)]
    tx_depth: u16,
    /// Ping-pong message size, bytes.
    #[arg(long, default_value_t = 8)]
    lat_size: u32,
    /// Ping-pong round trips.
    #[arg(long, default_value_t = 10_000)]
    lat_iters: u64,
    /// Skip the latency row.
    #[arg(long)]
    no_lat: bool,
    /// Check the data of every iWARP run.
    #[arg(long)]
    verify: bool,
    /// Capture each iWARP run to PREFIX-OP-rROUND.pcap.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Keep at most this many bytes per capture.
    #[arg(long, default_value_t = 16 << 20)]
    pcap_limit: u64,
    /// Use the in-memory link even as root.
    #[arg(long)]
    memory: bool,
    /// The soft device's transports to measure, comma-separated: `tap` (smoltcp on the
    /// TAPs, against raw smoltcp TCP) and `host-tcp` (the host's kernel TCP, `--netdev`,
    /// against kernel TCP over the same veth; needs root, not with --memory). `host-tcp`
    /// alone runs over one veth between the namespaces, no TAP and no bridge.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tap,host-tcp"
    )]
    transport: Vec<Transport>,
    /// Do not pin the peers to CPUs.
    #[arg(long)]
    no_pin: bool,
    /// Echo the peers' output.
    #[arg(long)]
    echo: bool,
    /// Print one JSON object (progress goes to stderr).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    mpa: MpaArgs,
}

/// A transport of the soft device the demo measures.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// smoltcp on a TAP.
    Tap,
    /// The host's kernel TCP (`--netdev`).
    HostTcp,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum RoleArg {
    Server,
    Client,
}

#[derive(Args, Debug)]
struct TcpPeerArgs {
    #[arg(long, value_enum)]
    role: RoleArg,
    #[arg(long)]
    tap: String,
    #[arg(long)]
    ip: String,
    #[arg(long)]
    mac: String,
    #[arg(long)]
    peer_ip: Ipv4Addr,
    #[arg(long, default_value_t = demo::TCP_PORT)]
    port: u16,
    /// Bulk: the client sends for this many seconds.
    #[arg(long, default_value_t = 3.0, value_parser = bench::parse_seconds)]
    duration: f64,
    /// Ping-pong of this many bytes instead of bulk.
    #[arg(long)]
    ping_pong: Option<usize>,
    /// Ping-pong round trips.
    #[arg(long, default_value_t = 10_000)]
    iters: u64,
    #[arg(long)]
    cpu: Option<usize>,
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    #[arg(long, default_value_t = 256 * 1024)]
    tcp_buffer: usize,
    /// Open the TAP without checksum and segmentation offload.
    #[arg(long)]
    no_offload: bool,
}

fn usage(m: impl Into<String>) -> IwperfError {
    IwperfError::Usage(m.into())
}

fn parse_ops(list: &[String]) -> Result<Vec<Op>, IwperfError> {
    list.iter()
        .map(|s| {
            Op::from_name(s.trim()).ok_or_else(|| usage(format!("--op {s:?}: write, read or send")))
        })
        .collect()
}

fn tuning(m: &MpaArgs, rx_depth: u32) -> Tuning {
    Tuning {
        spin: Duration::from_micros(m.poll_spin_us),
        lat_spin: Duration::from_micros(m.lat_poll_spin_us),
        nap: Duration::from_micros(m.poll_nap_us),
        rx_depth,
        limits: ServerLimits::default(),
    }
}

fn pin(cpu: Option<usize>) -> Result<(), IwperfError> {
    if let Some(c) = cpu {
        bench::pin_to_cpu(c).map_err(|e| IwperfError::Setup(e.to_string()))?;
    }
    Ok(())
}

/// `--spin-us`'s default (also what [`soft_only_options`] compares against).
const DEFAULT_SPIN_US: u64 = 50;
/// `--tcp-buffer`'s default for `server` and `client`, bytes (each connection holds a
/// send and a receive buffer of this size; a server may hold many).
const DEFAULT_TCP_BUFFER: usize = 256 * 1024;
/// `--tcp-buffer`'s default for `demo`, bytes (applied to the raw TCP baseline as well):
/// at MTU 1500 with the offload, iWARP Write ran 15-25% faster than with 256 KiB
/// (docs/ARCHITECTURE.md, "TAP segmentation offload").
const DEMO_TCP_BUFFER: usize = 1024 * 1024;
/// `--first-fpdu-delay-ms`'s default, milliseconds (as iwping's and `SOFTIWARP_DEVICE`'s).
const DEFAULT_FIRST_FPDU_DELAY_MS: u64 = softiwarp::spec::DEFAULT_FIRST_FPDU_DELAY_MS;

/// With `--device`, the soft device's options that were moved off their defaults:
/// the kernel driver sets those (MPA revision, CRC, markers, profile) or they have no
/// object there (the engine's polling, TCP buffers, the TAP's MTU).
fn soft_only_options(l: &SideArgs, m: &MpaArgs) -> Vec<&'static str> {
    let mut v = Vec::new();
    let mut given = |on: bool, name: &'static str| {
        if on {
            v.push(name);
        }
    };
    given(m.crc != OnOff::On, "--crc");
    given(m.markers != OnOff::Off, "--markers");
    given(m.mpa_rev != 2, "--mpa-rev");
    given(m.mpa_profile != MpaProfile::Siw, "--mpa-profile");
    given(m.spin_us != DEFAULT_SPIN_US, "--spin-us");
    given(m.tcp_buffer.is_some(), "--tcp-buffer");
    given(l.mtu.is_some(), "--mtu");
    given(m.no_offload, "--no-offload");
    given(
        m.first_fpdu_delay_ms != DEFAULT_FIRST_FPDU_DELAY_MS,
        "--first-fpdu-delay-ms",
    );
    v
}

/// The options that do not go with `--netdev IF`, each checked in this order: the other
/// links, then what sets a TAP or UDP link's own stack, capture or offload.
fn netdev_conflicts(l: &SideArgs, m: &MpaArgs) -> Option<&'static str> {
    [
        ("--device", l.device.is_some()),
        ("--tap", l.tap.is_some()),
        ("--udp", l.udp.is_some()),
        ("--ip", l.ip.is_some()),
        ("--mac", l.mac.is_some()),
        ("--pcap", l.pcap.is_some()),
        ("--mtu", l.mtu.is_some()),
        ("--no-offload", m.no_offload),
    ]
    .into_iter()
    .find_map(|(option, given)| given.then_some(option))
}

/// The host interface of `--netdev IF`, checked: the options that do not go with it
/// are usage errors; an interface that does not exist or has no IPv4 address is
/// [`IwperfError::NoDevice`] (status 3, as a `--device` that does not exist).
fn host_interface(ifname: &str, l: &SideArgs, m: &MpaArgs) -> Result<HostInterface, IwperfError> {
    if let Some(option) = netdev_conflicts(l, m) {
        return Err(usage(netlab::netdev_conflict(ifname, option)));
    }
    HostInterface::find(ifname).map_err(|e| match e {
        InterfaceError::Lookup(_) => IwperfError::Setup(e.to_string()),
        _ => IwperfError::NoDevice(e.to_string()),
    })
}

fn backend(name: &str, l: &SideArgs, m: &MpaArgs) -> Result<Backend, IwperfError> {
    if let Some(ifname) = &l.netdev {
        host_interface(ifname, l, m)?;
        return Ok(Backend::Soft(soft_options(
            name,
            LinkChoice::Netdev(ifname.clone()),
            (Ipv4Addr::UNSPECIFIED, 0),
            None,
            l,
            m,
        )));
    }
    if let Some(device) = &l.device {
        let soft = soft_only_options(l, m);
        if !soft.is_empty() {
            return Err(usage(format!(
                "{} set(s) the soft device only; with --device the kernel driver decides",
                soft.join(", ")
            )));
        }
        return Ok(Backend::RdmaCore {
            device: device.clone(),
            bind: l.bind,
        });
    }
    if l.bind.is_some() {
        return Err(usage("--bind goes with --device"));
    }
    let Some(ip) = &l.ip else {
        return Err(usage("--tap and --ip, --udp and --ip, or --device"));
    };
    let (ip, prefix_len) = netlab::parse_cidr(ip).map_err(usage)?;
    let mac = l
        .mac
        .as_deref()
        .map(netlab::parse_mac)
        .transpose()
        .map_err(usage)?;
    let link = match (&l.tap, l.udp, l.udp_peer) {
        (Some(tap), _, _) => {
            if let Some(mtu) = l.mtu {
                netlab::netns::run_ip(&["link", "set", "dev", tap, "mtu", &mtu.to_string()])
                    .map_err(|e| IwperfError::Setup(format!("set the MTU: {e}")))?;
            }
            LinkChoice::Tap(tap.clone())
        }
        (None, Some(bind), Some(peer)) => {
            let mut cfg = softiwarp::link::UdpConfig::new(bind, peer);
            if let Some(mtu) = l.mtu {
                if !(68..=softiwarp::link::UDP_MAX_MTU).contains(&mtu) {
                    return Err(usage(format!(
                        "--mtu {mtu} on a UDP link (68..={})",
                        softiwarp::link::UDP_MAX_MTU
                    )));
                }
                cfg.mtu = mtu;
            }
            LinkChoice::Udp(cfg)
        }
        _ => return Err(usage("--tap and --ip, --udp and --ip, or --device")),
    };
    Ok(Backend::Soft(soft_options(
        name,
        link,
        (ip, prefix_len),
        mac,
        l,
        m,
    )))
}

/// The soft device's options: `link` with this side's address and MAC (a frame link's
/// own stack), the MPA and engine settings of `m`, the capture of `l`.
fn soft_options(
    name: &str,
    link: LinkChoice,
    (ip, prefix_len): (Ipv4Addr, u8),
    mac: Option<[u8; 6]>,
    l: &SideArgs,
    m: &MpaArgs,
) -> DeviceOptions {
    DeviceOptions {
        name: name.into(),
        link,
        ip,
        prefix_len,
        mac,
        crc: m.crc == OnOff::On,
        markers: m.markers == OnOff::On,
        mpa_rev: m.mpa_rev,
        profile: m.mpa_profile,
        pcap: l.pcap.clone().map(|p| (p, l.pcap_limit)),
        engine_spin: Duration::from_micros(m.spin_us),
        progress: m.progress_mode.mode(),
        tcp_buffer: m.tcp_buffer.unwrap_or(DEFAULT_TCP_BUFFER),
        offload: !m.no_offload,
        first_fpdu_delay: Duration::from_millis(m.first_fpdu_delay_ms),
    }
}

/// A removal's lines on stderr: the events and WRs, then what the device left behind.
fn print_removal(r: Option<&RemovalReport>) {
    let Some(r) = r else { return };
    eprintln!("iwperf: {r}");
    if let Some(left) = &r.leftovers {
        eprintln!("iwperf: device closed: {left}");
    }
}

fn print_json(v: &impl serde::Serialize) {
    match serde_json::to_string(v) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("iwperf: cannot print JSON: {e}"),
    }
}

fn server(a: &ServerArgs) -> Result<(), IwperfError> {
    pin(a.side.cpu)?;
    let dev = backend("iwps", &a.side, &a.mpa)?;
    let json = a.side.json;
    let (summary, err) = run_server(
        dev,
        a.port,
        a.backlog,
        Tuning {
            limits: ServerLimits {
                max_size: a.max_size,
                max_qps: a.max_qps,
                max_tx_depth: a.max_tx_depth,
                max_memory: a.max_memory,
            },
            ..tuning(&a.mpa, a.rx_depth)
        },
        Duration::from_secs(a.timeout),
        |addr| {
            println!("READY");
            if !json {
                match (&a.side.device, &a.side.netdev) {
                    (Some(d), _) => println!("iwperf server listening on {addr} ({d})"),
                    (None, Some(ifname)) => println!(
                        "iwperf server listening on port {} of {ifname} ({}), kernel TCP",
                        addr.port(),
                        HostInterface::find(ifname)
                            .map_or_else(|e| e.to_string(), |h| h.addrs_text())
                    ),
                    (None, None) => println!("iwperf server listening on {addr}"),
                }
            }
        },
    );
    print_removal(summary.removal.as_ref());
    if json {
        print_json(&summary);
    } else {
        if let Some(b) = &summary.bandwidth {
            // A run that ended before anything was checked passed nothing.
            let verify = if b.checked == 0 && b.verify == bench::iwperf::wire::VerifyStatus::Passed
            {
                "not done"
            } else {
                verify_name(b.verify)
            };
            println!(
                "served {} connection(s): {} Send messages received, {} WRs reported by the client; verify {} ({} checked, {} mismatches)",
                b.connections, b.messages, b.client_wrs, verify, b.checked, b.mismatches
            );
        }
        if let Some(n) = summary.answered {
            println!("answered {n} round trips");
        }
    }
    err.map_or(Ok(()), Err)
}

fn client(a: &ClientArgs) -> Result<(), IwperfError> {
    pin(a.side.cpu)?;
    let ops = parse_ops(&a.op)?;
    let mode = if a.lat {
        Mode::Latency
    } else {
        Mode::Bandwidth
    };
    let length = match (a.iters, a.duration) {
        (_, Some(d)) if d > 0.0 => RunLength::Time(Duration::from_secs_f64(d)),
        (_, Some(_)) => return Err(usage("--duration must be positive")),
        (Some(n), None) => RunLength::Iters(n),
        (None, None) => RunLength::Iters(if a.lat { 1000 } else { 5000 }),
    };
    let test = ClientTest {
        server: SocketAddrV4::new(a.peer, a.port),
        ops,
        mode,
        size: a.size.unwrap_or(if a.lat { 2 } else { 65536 }),
        qps: a.qps,
        tx_depth: a.tx_depth,
        verify: a.verify,
        length,
        connect_timeout: Duration::from_secs(30),
        indices: a.indices.clone(),
    };
    test.validate()?;
    let dev = backend("iwpc", &a.side, &a.mpa)?;
    let json = a.side.json;
    let show = a.progress;
    let lat = a.lat;
    let mut progress = |p: &Progress| {
        if show {
            if lat {
                println!("PROGRESS {:.1} s {} round trips", p.seconds, p.amount);
            } else {
                println!("PROGRESS {:.1} s {:.2} Gbit/s", p.seconds, p.gbps);
            }
        }
    };
    if !json {
        let mpa = match &a.side.device {
            Some(d) => format!("MPA as {d}'s kernel driver sets it"),
            None => format!(
                "{}MPA CRC {}, markers {}, rev {}",
                a.side
                    .netdev
                    .as_ref()
                    .map_or(String::new(), |i| format!("kernel TCP on {i}, ")),
                if a.mpa.crc == OnOff::On { "on" } else { "off" },
                if a.mpa.markers == OnOff::On {
                    "on"
                } else {
                    "off"
                },
                a.mpa.mpa_rev,
            ),
        };
        println!(
            "iwperf: {} {} test to {} ({} QP(s), {} bytes, tx depth {}, {mpa})",
            test.ops
                .iter()
                .map(|o| o.name())
                .collect::<Vec<_>>()
                .join("+"),
            if a.lat { "latency" } else { "bandwidth" },
            test.server,
            test.qps,
            test.size,
            test.tx_depth,
        );
    }
    let (report, err) = run_client(dev, &test, tuning(&a.mpa, 512), &mut progress);
    print_removal(report.removal.as_ref());
    if json {
        print_json(&report);
    } else {
        if !report.bandwidth.is_empty() {
            print!("{}", bw_table(&report.bandwidth));
            for r in &report.bandwidth {
                if r.verify != bench::iwperf::wire::VerifyStatus::Off || r.partial {
                    println!(
                        " {}: verify {}{}",
                        r.op,
                        verify_name(r.verify),
                        if r.partial { " (partial run)" } else { "" }
                    );
                }
            }
        }
        if let Some(l) = &report.latency {
            print!("{}", lat_table(std::slice::from_ref(l)));
        }
    }
    err.map_or(Ok(()), Err)
}

fn tcp_peer(a: &TcpPeerArgs) -> Result<(), IwperfError> {
    pin(a.cpu)?;
    let (address, prefix_len) = netlab::parse_cidr(&a.ip).map_err(usage)?;
    let iface = InterfaceConfig {
        mac: netlab::parse_mac(&a.mac).map_err(usage)?,
        address,
        prefix_len,
        gateway: None,
        random_seed: u64::from(std::process::id()),
    };
    let role = match a.role {
        RoleArg::Server => Role::Server,
        RoleArg::Client => Role::Client,
    };
    let mut cfg = TcpBenchConfig::new(role, iface, a.peer_ip);
    cfg.port = a.port;
    cfg.spin = Duration::from_micros(a.spin_us);
    cfg.tcp.rx_buffer = a.tcp_buffer;
    cfg.tcp.tx_buffer = a.tcp_buffer;
    cfg.amount = Amount::Time(Duration::from_secs_f64(a.duration));
    cfg.timeout = Duration::from_secs_f64(a.duration + 60.0);
    let bench = |e: bench::BenchError| IwperfError::Bench(e);
    let mut link = TapLink::open_with(&a.tap, tcp::tap_offload(!a.no_offload))
        .map_err(|e| IwperfError::Setup(e.to_string()))?;
    tcp::wait_link_up(&mut link, Duration::from_secs(5)).map_err(bench)?;
    match (a.ping_pong, role) {
        (None, Role::Server) => {
            print_json(&tcp::run_server(link, &cfg, || println!("READY")).map_err(bench)?)
        }
        (None, Role::Client) => print_json(&tcp::run_client(link, &cfg).map_err(bench)?),
        (Some(size), Role::Server) => {
            let n =
                tcp_lat::run_echo_server(link, &cfg, size, || println!("READY")).map_err(bench)?;
            println!("{{\"echoed\": {n}}}");
        }
        (Some(size), Role::Client) => {
            let samples = tcp_lat::run_ping_client(link, &cfg, size, Rounds::Count(a.iters))
                .map_err(bench)?;
            let stats =
                bench::iwperf::report::LatStats::from_samples(Op::Send, size as u32, &samples)
                    .ok_or_else(|| IwperfError::Setup("no round trips".into()))?;
            print_json(&stats);
        }
    }
    Ok(())
}

fn run_demo(a: &DemoArgs) -> Result<(), IwperfError> {
    let cfg = DemoConfig {
        mtu: a.mtu,
        seconds: a.duration,
        rounds: a.rounds,
        size: a.size,
        ops: parse_ops(&a.op)?,
        qps: a.qps,
        tx_depth: a.tx_depth,
        verify: a.verify,
        crc: a.mpa.crc == OnOff::On,
        markers: a.mpa.markers == OnOff::On,
        mpa_rev: a.mpa.mpa_rev,
        latency: !a.no_lat,
        lat_size: a.lat_size,
        lat_iters: a.lat_iters,
        pcap: a.pcap.clone(),
        pcap_limit: a.pcap_limit,
        memory: a.memory,
        pin: !a.no_pin,
        spin: Duration::from_micros(a.mpa.spin_us),
        progress: a.mpa.progress_mode.mode(),
        tcp_buffer: a.mpa.tcp_buffer.unwrap_or(DEMO_TCP_BUFFER),
        offload: !a.mpa.no_offload,
        tuning: tuning(&a.mpa, 512),
        exe: std::env::current_exe().map_err(|e| IwperfError::Setup(format!("own path: {e}")))?,
        echo: a.echo,
        tap_rows: a.transport.contains(&Transport::Tap),
        host_rows: a.transport.contains(&Transport::HostTcp),
    };
    let json = a.json;
    let mut say = |s: &str| {
        if json {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    let outcome = demo::run(&cfg, &mut say, json)?;
    if json {
        let mut j = outcome.report.to_json();
        j["namespaces"] = serde_json::json!(outcome.namespaces);
        j["pcaps"] = serde_json::json!(outcome.pcaps);
        println!("{j}");
    } else {
        println!();
        print!("{}", outcome.report.table());
        for p in &outcome.pcaps {
            println!("capture: {}", p.display());
        }
    }
    outcome.verify_error().map_or(Ok(()), Err)
}

/// Makes glibc's malloc serve every allocation of 128 KiB or more (each TCP socket's
/// send and receive buffers: 256 KiB by default) from fresh `mmap`s and give it back to
/// the kernel on free, by fixing its mmap threshold (`mallopt(M_MMAP_THRESHOLD)`,
/// mallopt(3)).
///
/// Without it glibc raises the threshold to the size of the largest mmapped chunk freed,
/// so once the listener has dropped a half-open connection, later socket buffers come
/// from the heap: `calloc` then writes every page of them (a silent connection costs
/// its whole 512 KiB of resident memory) and freed heap memory stays with the process.
/// Measured by the root-only flood test (`bench/tests/iwperf_flood.rs`, 2,000 silent or
/// dribbling connections): server `VmRSS` idle 9.2 MiB, peak 29.2 MiB, 30 s after the
/// flood still 29.2 MiB; with the threshold fixed 9.4 / 12.6 / 12.6 MiB.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn return_large_buffers_to_the_kernel() {
    // SAFETY: mallopt only changes malloc's tuning parameters; it takes no pointer and
    // is called before any thread of ours starts.
    let ok = unsafe { nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, 128 * 1024) };
    if ok != 1 {
        tracing::debug!("mallopt(M_MMAP_THRESHOLD) refused");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_large_buffers_to_the_kernel() {}

fn main() -> ExitCode {
    return_large_buffers_to_the_kernel();
    let cli = Cli::parse();
    // SIGINT, SIGTERM and SIGHUP end every command through its teardown (the demo
    // removes its namespaces; a server or client disconnects, so the peer sees the end,
    // and prints its partial report) with status 130.
    if let Err(e) = netlab::signals::install_handler() {
        eprintln!("iwperf: {e}");
        return ExitCode::FAILURE;
    }
    if matches!(cli.cmd, Cmd::Demo(_)) {
        netlab::logging::init_tracing("warn");
    } else if let Err(e) = netlab::logging::init_peer("warn") {
        eprintln!("iwperf: {e}");
        return ExitCode::FAILURE;
    }
    let res = match &cli.cmd {
        Cmd::Demo(a) => run_demo(a),
        Cmd::Server(a) => server(a),
        Cmd::Client(a) => client(a),
        Cmd::TcpPeer(a) => tcp_peer(a),
    };
    match res {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(e) => {
            let e = if netlab::signals::interrupted() {
                IwperfError::Interrupted
            } else {
                e
            };
            eprintln!("iwperf: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
