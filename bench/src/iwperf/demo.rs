//! `iwperf demo`: the main job in one command.
//!
//! As root: two network namespaces with a TAP each, joined by bridges and a veth
//! ([`netlab::Topology`], removed afterwards also on failure and Ctrl-C); in each
//! round the raw smoltcp TCP bulk transfer (the baseline, [`crate::tcp`]), kernel TCP
//! between the bridges' kernel addresses (the absolute reference), then iWARP
//! Write, Read and Send (an `iwperf server` process in namespace A, an `iwperf client`
//! in namespace B, pinned to CPUs 1 and 0 like `transport-bench`) on the TAPs, and
//! the same on the host's kernel TCP (`--netdev` on each side's bridge, the interface
//! that holds the kernel address: over the same veth as kernel TCP), then the latency
//! pairs: raw TCP ping-pong and iWARP Send ping-pong of 8 bytes on the TAPs, kernel TCP
//! ping-pong and iWARP Send ping-pong on host TCP. One table at the end: op, size,
//! Gbit/s, Mpps, baseline Gbit/s, ratio to the baseline, and the latency rows; the
//! host-TCP rows (`write (host TCP)`) have kernel TCP as their baseline. With host TCP
//! alone (`--transport host-tcp`) there is no TAP and no bridge: two namespaces joined by
//! one veth ([`netlab::VethPair`]), `--netdev` on its ends, kernel TCP between them.
//!
//! Without root: the same measurements over an in-memory link pair in this one process
//! (server and client in threads), said in one line.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use netlab::{format_mac, Endpoint, Peer, PeerOutput, Side, Topology};
use softiwarp::link::{MemoryConfig, MemoryLink};
use softiwarp::transport::smoltcp_glue::InterfaceConfig;

use super::conn::{DeviceOptions, LinkChoice};
use super::datapath::{Progress, RunLength, Tuning};
use super::peer::{run_client, run_server, ClientReport, ClientTest, ServerSummary};
use super::report::{BwResult, DemoLatency, DemoReport, DemoRow, LatStats};
use super::wire::{Mode, Op, VerifyStatus};
use super::IwperfError;
use crate::stats::median;
use crate::tcp::{self, Amount, Role, TcpBenchConfig, TransferReport};
use crate::tcp_lat::{self, Rounds};
use crate::BenchError;

/// The iWARP port the demo's server listens on (perftest's default).
pub const IWARP_PORT: u16 = 18515;
/// The raw TCP baseline's port.
pub const TCP_PORT: u16 = 5201;

/// Settings of the demo.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// IP MTU in bytes.
    pub mtu: usize,
    /// Seconds per bandwidth run.
    pub seconds: f64,
    /// Rounds (every run once per round; figures are medians).
    pub rounds: usize,
    /// Bandwidth message size in bytes.
    pub size: u32,
    /// Operations, in this order within a round.
    pub ops: Vec<Op>,
    /// Connections per bandwidth run.
    pub qps: u16,
    /// WRs in flight per QP.
    pub tx_depth: u16,
    /// Check the data of every iWARP run.
    pub verify: bool,
    /// MPA CRC32c.
    pub crc: bool,
    /// MPA markers.
    pub markers: bool,
    /// MPA revision.
    pub mpa_rev: u8,
    /// Run the latency pair (raw TCP and iWARP Send ping-pong).
    pub latency: bool,
    /// Ping-pong message size in bytes.
    pub lat_size: u32,
    /// Ping-pong round trips per run.
    pub lat_iters: u64,
    /// Capture every iWARP run's client link to `PREFIX-OP-rROUND.pcap`.
    pub pcap: Option<PathBuf>,
    /// At most this many bytes per capture.
    pub pcap_limit: u64,
    /// Use the in-memory link even as root.
    pub memory: bool,
    /// Pin server and client to CPUs 1 and 0 (TAP mode).
    pub pin: bool,
    /// Busy-poll time of the engines and of the raw TCP peers after activity.
    pub spin: Duration,
    /// Who drives the iWARP peers' devices.
    pub progress: softiwarp::ProgressMode,
    /// TCP socket buffers (both the baseline and the device), bytes.
    pub tcp_buffer: usize,
    /// TAP checksum and segmentation offload for the baseline and the devices
    /// (`--no-offload` turns it off).
    pub offload: bool,
    /// How the iWARP peers wait.
    pub tuning: Tuning,
    /// The iwperf binary run as the peers (TAP mode).
    pub exe: PathBuf,
    /// Echo the peers' output.
    pub echo: bool,
    /// Measure the soft device on the TAPs (against raw smoltcp TCP).
    pub tap_rows: bool,
    /// Measure the soft device on the host's kernel TCP (`--netdev`, against kernel
    /// TCP; TAP mode only).
    pub host_rows: bool,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            mtu: 65000,
            seconds: 3.0,
            rounds: 1,
            size: 65536,
            ops: Op::ALL.to_vec(),
            qps: 1,
            tx_depth: 128,
            verify: false,
            crc: true,
            markers: false,
            mpa_rev: 2,
            latency: true,
            lat_size: 8,
            lat_iters: 10_000,
            pcap: None,
            pcap_limit: 16 << 20,
            memory: false,
            pin: true,
            spin: Duration::from_micros(50),
            progress: softiwarp::ProgressMode::Hybrid,
            tcp_buffer: 256 * 1024,
            offload: true,
            tuning: Tuning::default(),
            exe: std::env::current_exe().unwrap_or_default(),
            echo: false,
            tap_rows: true,
            host_rows: true,
        }
    }
}

/// One round's measurements.
#[derive(Debug, Clone, Default)]
struct RoundResult {
    tcp_gbps: f64,
    /// Kernel TCP over the veth (TAP mode).
    kernel_gbps: Option<f64>,
    /// Raw TCP Gbit per CPU-second of the busier peer (TAP mode).
    tcp_cpu_gbps: Option<f64>,
    ops: Vec<BwResult>,
    /// Per op: Gbit per CPU-second of the busier peer (TAP mode).
    ops_cpu_gbps: Vec<(Op, f64)>,
    lat: Option<(LatStats, LatStats)>,
    /// Kernel TCP Gbit per CPU-second of the busier thread.
    kernel_cpu_gbps: Option<f64>,
    /// The soft device on host TCP: as `ops`, `ops_cpu_gbps` and `lat` (the latency
    /// beside kernel TCP ping-pong).
    host_ops: Vec<BwResult>,
    host_ops_cpu_gbps: CpuRates,
    host_lat: Option<(LatStats, LatStats)>,
}

/// Where output goes: progress lines and notes (stderr with `--json`, else stdout).
pub type Say<'a> = &'a mut dyn FnMut(&str);

/// A progress line per second while a run goes on: the ticker prints the label, the
/// seconds so far and the last rate a peer reported.
struct Ticker {
    stop: Arc<AtomicBool>,
    latest: Arc<Mutex<String>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    fn start(label: String, to_stderr: bool) -> Ticker {
        let stop = Arc::new(AtomicBool::new(false));
        let latest = Arc::new(Mutex::new(String::new()));
        let (s, l) = (stop.clone(), latest.clone());
        let thread = std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut next = 1u64;
            while !s.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(20));
                if t0.elapsed() >= Duration::from_secs(next) {
                    let extra = l.lock().map(|x| x.clone()).unwrap_or_default();
                    let line = format!("  {label}: {next} s{extra}");
                    if to_stderr {
                        eprintln!("{line}");
                    } else {
                        println!("{line}");
                    }
                    next += 1;
                }
            }
        });
        Ticker {
            stop,
            latest,
            thread: Some(thread),
        }
    }

    fn set(&self, s: String) {
        if let Ok(mut l) = self.latest.lock() {
            *l = s;
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn progress_text(p: &Progress) -> String {
    if p.gbps > 0.0 {
        format!(", {:.2} Gbit/s", p.gbps)
    } else {
        format!(", {} round trips", p.amount)
    }
}

/// The pcap path of a run: `PREFIX-NAME-rROUND.pcap`, `ROUND` counted from 1 as the
/// progress lines count them (`round` is the 0-based index).
pub fn pcap_path(prefix: &Path, name: &str, round: usize) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(format!("-{name}-r{}.pcap", round + 1));
    PathBuf::from(s)
}

/// Runs the demo. `say` gets the progress and notes; `to_stderr` says where the
/// per-second ticker prints. Returns the report; with `--verify` a mismatch in any run
/// is [`IwperfError::Verify`] after the report was made (the caller prints it first):
/// see [`DemoOutcome`].
///
/// Errors: setup (namespaces, devices), a peer's connection failure or device removal,
/// [`IwperfError::Interrupted`].
pub fn run(cfg: &DemoConfig, say: Say<'_>, to_stderr: bool) -> Result<DemoOutcome, IwperfError> {
    if cfg.rounds == 0 || cfg.seconds <= 0.0 {
        return Err(IwperfError::Usage(
            "--rounds and --duration must be positive".into(),
        ));
    }
    if !cfg.tap_rows && !cfg.host_rows {
        return Err(IwperfError::Usage(
            "--transport: tap, host-tcp or both".into(),
        ));
    }
    let root = netlab::netns::is_root();
    let memory = cfg.memory || !root;
    if memory && !cfg.tap_rows {
        return Err(IwperfError::Usage(
            "--transport host-tcp runs between two network namespaces: it needs root, and not --memory".into(),
        ));
    }
    if !root && !cfg.memory {
        say("iwperf demo: not running as root (network namespaces and TAPs need it): measuring over an in-memory link in one process instead, without the host-TCP rows");
    }
    let mut rounds = Vec::new();
    let mut namespaces = Vec::new();
    let mut pcaps = Vec::new();
    let mut link = "memory";
    if memory {
        for r in 0..cfg.rounds {
            say(&format!("round {} of {}", r + 1, cfg.rounds));
            rounds.push(memory_round(cfg, r, &mut pcaps, to_stderr)?);
        }
    } else {
        let net = Net::create(cfg)?;
        namespaces = net.namespaces().to_vec();
        link = match net {
            Net::Taps(_) => "tap",
            Net::Veth(_) => "veth",
        };
        say(&match &net {
            Net::Taps(_) => format!(
                "iwperf demo: namespaces {} and {}, a TAP in each on a bridge, joined by a veth; MTU {}",
                namespaces[0], namespaces[1], cfg.mtu
            ),
            Net::Veth(v) => format!(
                "iwperf demo: namespaces {} and {} joined by a veth ({} and {}); MTU {}",
                namespaces[0],
                namespaces[1],
                v.veth(Side::A),
                v.veth(Side::B),
                cfg.mtu
            ),
        });
        for r in 0..cfg.rounds {
            say(&format!("round {} of {}", r + 1, cfg.rounds));
            rounds.push(tap_round(cfg, &net, r, &mut pcaps, to_stderr)?);
        }
        drop(net);
    }
    let report = summarize(cfg, link, &rounds);
    Ok(DemoOutcome {
        report,
        namespaces,
        pcaps,
    })
}

/// The demo's report and what it left for checking.
#[derive(Debug, Clone)]
pub struct DemoOutcome {
    /// The measurements.
    pub report: DemoReport,
    /// The namespaces it made (all removed by the time [`run`] returned).
    pub namespaces: Vec<String>,
    /// The captures it wrote.
    pub pcaps: Vec<PathBuf>,
}

impl DemoOutcome {
    /// [`IwperfError::Verify`] if any row failed its check.
    pub fn verify_error(&self) -> Option<IwperfError> {
        let bad: Vec<&str> = self
            .report
            .results
            .iter()
            .filter(|r| r.verify == VerifyStatus::Failed)
            .map(|r| r.op.name())
            .collect();
        (!bad.is_empty()).then(|| IwperfError::Verify(format!("mismatches in {}", bad.join(", "))))
    }
}

/// What [`op_rows`] reads of a round: its results of one transport, the baseline's
/// Gbit/s, the per-CPU-second rates of the results and of the baseline.
type RoundView<'a> = (&'a [BwResult], f64, &'a [(Op, f64)], Option<f64>);

/// One row per operation of `cfg`, medians over `rounds` as `view` sees each.
fn op_rows<'a>(
    cfg: &DemoConfig,
    rounds: &'a [RoundResult],
    view: impl Fn(&'a RoundResult) -> RoundView<'a>,
) -> Vec<DemoRow> {
    let views: Vec<RoundView<'a>> = rounds.iter().map(view).collect();
    let baseline: Vec<f64> = views.iter().map(|v| v.1).collect();
    cfg.ops
        .iter()
        .filter_map(|&op| {
            let mine: Vec<(&BwResult, f64)> = views
                .iter()
                .filter_map(|v| v.0.iter().find(|b| b.op == op).map(|b| (b, v.1)))
                .collect();
            if mine.is_empty() {
                return None;
            }
            let g: Vec<f64> = mine.iter().map(|(b, _)| b.gbps).collect();
            let m: Vec<f64> = mine.iter().map(|(b, _)| b.mpps).collect();
            let ratios: Vec<f64> = mine
                .iter()
                .filter(|(_, t)| *t > 0.0)
                .map(|(b, t)| b.gbps / t)
                .collect();
            let verify = mine.iter().map(|(b, _)| b.verify).fold(
                if cfg.verify {
                    VerifyStatus::Passed
                } else {
                    VerifyStatus::Off
                },
                |acc, v| {
                    if v == VerifyStatus::Failed || acc == VerifyStatus::Failed {
                        VerifyStatus::Failed
                    } else {
                        acc
                    }
                },
            );
            let cpu_ratios: Vec<f64> = views
                .iter()
                .filter_map(|v| {
                    let mine = v.2.iter().find(|(o, _)| *o == op)?.1;
                    v.3.filter(|t| *t > 0.0).map(|t| mine / t)
                })
                .collect();
            Some(DemoRow {
                cpu_ratio: median(&cpu_ratios),
                op,
                size: cfg.size,
                gbps: median(&g).unwrap_or(0.0),
                mpps: median(&m).unwrap_or(0.0),
                baseline_gbps: median(&baseline).unwrap_or(0.0),
                ratio: median(&ratios).unwrap_or(0.0),
                verify,
            })
        })
        .collect()
}

/// The latency row of `pairs` (iWARP, its baseline) of the rounds: the round with the
/// median iWARP `t_typical`, and the median ratio.
fn lat_row(pairs: Vec<&(LatStats, LatStats)>) -> Option<DemoLatency> {
    if pairs.is_empty() {
        return None;
    }
    let ratios: Vec<f64> = pairs
        .iter()
        .filter(|(_, t)| t.t_typical > 0.0)
        .map(|(i, t)| i.t_typical / t.t_typical)
        .collect();
    let mut by = pairs;
    by.sort_by(|a, b| a.0.t_typical.total_cmp(&b.0.t_typical));
    let mid = by[by.len() / 2];
    Some(DemoLatency {
        iwarp: mid.0.clone(),
        tcp: mid.1.clone(),
        ratio: median(&ratios).unwrap_or(0.0),
    })
}

/// The report of `rounds` on `link` (`"tap"`, `"veth"` or `"memory"`).
fn summarize(cfg: &DemoConfig, link: &str, rounds: &[RoundResult]) -> DemoReport {
    let tcp: Vec<f64> = rounds.iter().map(|r| r.tcp_gbps).collect();
    let kernel: Vec<f64> = rounds.iter().filter_map(|r| r.kernel_gbps).collect();
    let results = op_rows(cfg, rounds, |r| {
        (&r.ops, r.tcp_gbps, &r.ops_cpu_gbps, r.tcp_cpu_gbps)
    });
    let host_results = op_rows(cfg, rounds, |r| {
        (
            &r.host_ops,
            r.kernel_gbps.unwrap_or(0.0),
            &r.host_ops_cpu_gbps,
            r.kernel_cpu_gbps,
        )
    });
    DemoReport {
        link: link.into(),
        mtu: cfg.mtu,
        rounds: rounds.len(),
        seconds: cfg.seconds,
        crc: cfg.crc,
        baseline_tcp_gbps: median(&tcp).unwrap_or(0.0),
        kernel_tcp_gbps: median(&kernel),
        offload: cfg.offload && link == "tap",
        results,
        latency: lat_row(rounds.iter().filter_map(|r| r.lat.as_ref()).collect()),
        host_results,
        host_latency: lat_row(rounds.iter().filter_map(|r| r.host_lat.as_ref()).collect()),
    }
}

fn client_test(cfg: &DemoConfig, server: SocketAddrV4, op: Op, lat: bool) -> ClientTest {
    ClientTest {
        server,
        ops: vec![op],
        mode: if lat { Mode::Latency } else { Mode::Bandwidth },
        size: if lat { cfg.lat_size } else { cfg.size },
        qps: if lat { 1 } else { cfg.qps },
        tx_depth: cfg.tx_depth,
        verify: cfg.verify && !lat,
        length: if lat {
            RunLength::Iters(cfg.lat_iters)
        } else {
            RunLength::Time(Duration::from_secs_f64(cfg.seconds))
        },
        connect_timeout: Duration::from_secs(20),
        indices: None,
    }
}

/// Turns a failed side into the demo's error (connection failure, removal, ...).
fn side_error(what: &str, code: u8, message: Option<String>) -> IwperfError {
    let m = format!("{what}: {}", message.unwrap_or_default());
    IwperfError::from_exit_code(i32::from(code), m.clone()).unwrap_or(IwperfError::Setup(m))
}

// ------------------------------------------------------------------- memory link

fn memory_pair(cfg: &DemoConfig, tag: &str) -> Result<(MemoryLink, MemoryLink), IwperfError> {
    MemoryLink::pair(MemoryConfig {
        mtu: cfg.mtu,
        names: (format!("{tag}-a"), format!("{tag}-b")),
        ..MemoryConfig::default()
    })
    .map_err(|e| IwperfError::Setup(format!("memory link: {e}")))
}

fn mem_iface(n: u8) -> InterfaceConfig {
    InterfaceConfig {
        mac: [0x02, 0x00, 0x0a, 0xeb, 0x00, n],
        address: Ipv4Addr::new(10, 235, 0, n),
        prefix_len: 24,
        gateway: None,
        random_seed: u64::from(n) ^ u64::from(std::process::id()) << 16,
    }
}

fn tcp_cfg(cfg: &DemoConfig, role: Role, me: InterfaceConfig, peer: Ipv4Addr) -> TcpBenchConfig {
    let mut c = TcpBenchConfig::new(role, me, peer);
    c.port = TCP_PORT;
    c.spin = cfg.spin;
    c.tcp.rx_buffer = cfg.tcp_buffer;
    c.tcp.tx_buffer = cfg.tcp_buffer;
    c.amount = Amount::Time(Duration::from_secs_f64(cfg.seconds));
    c.timeout = Duration::from_secs_f64(cfg.seconds + 60.0);
    c
}

fn device_options(
    cfg: &DemoConfig,
    name: &str,
    link: LinkChoice,
    ip: Ipv4Addr,
    mac: [u8; 6],
    pcap: Option<PathBuf>,
) -> DeviceOptions {
    DeviceOptions {
        name: name.into(),
        link,
        ip,
        prefix_len: 24,
        mac: Some(mac),
        crc: cfg.crc,
        markers: cfg.markers,
        mpa_rev: cfg.mpa_rev,
        profile: Default::default(),
        pcap: pcap.map(|p| (p, cfg.pcap_limit)),
        engine_spin: cfg.spin,
        progress: cfg.progress,
        tcp_buffer: cfg.tcp_buffer,
        offload: cfg.offload,
        // Both ends are ours: no siw responder to wait for.
        first_fpdu_delay: Duration::ZERO,
    }
}

/// One iWARP run in this process: server thread, client here.
fn memory_iwarp(
    cfg: &DemoConfig,
    op: Op,
    lat: bool,
    pcap: Option<PathBuf>,
    ticker: &Ticker,
) -> Result<ClientReport, IwperfError> {
    let (a, b) = memory_pair(cfg, "iwp")?;
    let (sa, sb) = (mem_iface(1), mem_iface(2));
    let sdev = device_options(cfg, "iwps", LinkChoice::Memory(a), sa.address, sa.mac, None);
    let cdev = device_options(cfg, "iwpc", LinkChoice::Memory(b), sb.address, sb.mac, pcap);
    let (tx, rx) = std::sync::mpsc::channel();
    let tuning = cfg.tuning;
    let server = std::thread::spawn(move || {
        run_server(
            sdev,
            IWARP_PORT,
            128,
            tuning,
            Duration::from_secs(30),
            move |_| {
                let _ = tx.send(());
            },
        )
    });
    let t0 = Instant::now();
    let ready = loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(()) => break true,
            Err(_) if server.is_finished() || t0.elapsed() > Duration::from_secs(30) => {
                break false
            }
            Err(_) => {}
        }
    };
    if !ready {
        let (s, e) = server
            .join()
            .map_err(|_| IwperfError::Setup("server thread panicked".into()))?;
        return Err(e.unwrap_or_else(|| side_error("server", s.exit_code, s.error)));
    }
    let test = client_test(cfg, SocketAddrV4::new(sa.address, IWARP_PORT), op, lat);
    let (report, cerr) = run_client(cdev, &test, cfg.tuning, &mut |p| {
        ticker.set(progress_text(p))
    });
    let (summary, serr) = server
        .join()
        .map_err(|_| IwperfError::Setup("server thread panicked".into()))?;
    check_sides(&report, cerr, &summary, serr)?;
    Ok(report)
}

/// The outcome of a run from both sides' reports: a verify failure is kept in the
/// report (the row says so); anything else is the run's error.
fn check_sides(
    client: &ClientReport,
    cerr: Option<IwperfError>,
    server: &ServerSummary,
    serr: Option<IwperfError>,
) -> Result<(), IwperfError> {
    match (cerr, serr) {
        (Some(IwperfError::Verify(_)), _) | (None, Some(IwperfError::Verify(_))) | (None, None) => {
            let _ = (client, server);
            Ok(())
        }
        (Some(e), _) | (None, Some(e)) => Err(e),
    }
}

fn memory_round(
    cfg: &DemoConfig,
    round: usize,
    pcaps: &mut Vec<PathBuf>,
    to_stderr: bool,
) -> Result<RoundResult, IwperfError> {
    let mut out = RoundResult::default();
    {
        let _t = Ticker::start("tcp baseline".into(), to_stderr);
        let (a, b) = memory_pair(cfg, "tcp")?;
        let (sa, sb) = (mem_iface(1), mem_iface(2));
        let scfg = tcp_cfg(cfg, Role::Server, sa, sb.address);
        let ccfg = tcp_cfg(cfg, Role::Client, sb, sa.address);
        let (tx, rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            tcp::run_server(a, &scfg, move || {
                let _ = tx.send(());
            })
        });
        let _ = rx.recv_timeout(Duration::from_secs(10));
        let client = tcp::run_client(b, &ccfg);
        let server = server
            .join()
            .map_err(|_| IwperfError::Setup("TCP server thread panicked".into()))?;
        let _ = client?;
        out.tcp_gbps = server?.gbit_per_s;
    }
    for &op in &cfg.ops {
        let _t = Ticker::start(format!("iWARP {op}"), to_stderr);
        let pcap = cfg.pcap.as_ref().map(|p| pcap_path(p, op.name(), round));
        let rep = memory_iwarp(cfg, op, false, pcap.clone(), &_t)?;
        pcaps.extend(pcap);
        out.ops
            .extend(rep.bandwidth.into_iter().filter(|b| b.op == op));
    }
    if cfg.latency {
        let tcp_lat = {
            let _t = Ticker::start("tcp ping-pong".into(), to_stderr);
            let (a, b) = memory_pair(cfg, "tcpl")?;
            let (sa, sb) = (mem_iface(1), mem_iface(2));
            let scfg = tcp_cfg(cfg, Role::Server, sa, sb.address);
            let ccfg = tcp_cfg(cfg, Role::Client, sb, sa.address);
            let size = cfg.lat_size as usize;
            let (tx, rx) = std::sync::mpsc::channel();
            let server = std::thread::spawn(move || {
                tcp_lat::run_echo_server(a, &scfg, size, move || {
                    let _ = tx.send(());
                })
            });
            let _ = rx.recv_timeout(Duration::from_secs(10));
            let samples = tcp_lat::run_ping_client(b, &ccfg, size, Rounds::Count(cfg.lat_iters));
            let _ = server.join();
            LatStats::from_samples(Op::Send, cfg.lat_size, &samples?)
        };
        let _t = Ticker::start("iWARP send ping-pong".into(), to_stderr);
        let rep = memory_iwarp(cfg, Op::Send, true, None, &_t)?;
        if let (Some(i), Some(t)) = (rep.latency, tcp_lat) {
            out.lat = Some((i, t));
        }
    }
    Ok(out)
}

// ------------------------------------------------------------------- TAP peers

/// Host numbers ([`netlab::host_ip`]) of the kernel addresses on the bridges.
const KERNEL_HOST_A: u8 = 3;
const KERNEL_HOST_B: u8 = 4;
/// The kernel TCP reference's port.
const KERNEL_TCP_PORT: u16 = 5202;

/// The namespaces a TAP-mode demo runs in: the TAP topology (TAPs on bridges joined by a
/// veth; the kernel's addresses on the bridges), or, when only host TCP is measured, two
/// namespaces joined by one veth with the kernel's addresses on its ends. Dropping it
/// removes everything.
#[derive(Debug)]
enum Net {
    Taps(Box<Topology>),
    Veth(netlab::VethPair),
}

impl Net {
    /// The TAP topology when `cfg` measures the TAPs, else the veth pair.
    fn create(cfg: &DemoConfig) -> Result<Net, IwperfError> {
        let lab = |e: netlab::HarnessError| IwperfError::Bench(e.into());
        if !cfg.tap_rows {
            return netlab::VethPair::create(cfg.mtu)
                .map(Net::Veth)
                .map_err(lab);
        }
        let topo = Topology::create(cfg.mtu).map_err(lab)?;
        // Kernel addresses on the bridges, for kernel TCP and the host-TCP rows.
        for (side, n) in [(Side::A, KERNEL_HOST_A), (Side::B, KERNEL_HOST_B)] {
            topo.add_kernel_address(side, n).map_err(lab)?;
        }
        Ok(Net::Taps(Box::new(topo)))
    }

    fn namespaces(&self) -> [String; 2] {
        match self {
            Net::Taps(t) => t.namespaces(),
            Net::Veth(v) => v.namespaces(),
        }
    }

    fn netns(&self, side: Side) -> &netlab::netns::NetNs {
        match (self, side) {
            (Net::Taps(t), Side::A) => &t.pair().a,
            (Net::Taps(t), Side::B) => &t.pair().b,
            (Net::Veth(v), side) => v.netns(side),
        }
    }

    /// The kernel's address on `side`.
    fn kernel_ip(&self, side: Side) -> Ipv4Addr {
        match (self, side) {
            (Net::Taps(_), Side::A) => netlab::host_ip(KERNEL_HOST_A),
            (Net::Taps(_), Side::B) => netlab::host_ip(KERNEL_HOST_B),
            (Net::Veth(v), side) => v.ip(side),
        }
    }

    /// The interface that holds the kernel's address on `side` (the bridge: the veth
    /// ends of the TAP topology are its ports and have no address of their own).
    fn kernel_interface(&self, side: Side) -> &str {
        match (self, side) {
            (Net::Taps(t), Side::A) => t.pair().bridges()[0],
            (Net::Taps(t), Side::B) => t.pair().bridges()[1],
            (Net::Veth(v), side) => v.veth(side),
        }
    }

    fn peer(&self, side: Side, name: &str, program: &Path) -> netlab::PeerSpec {
        match self {
            Net::Taps(t) => t.peer(side, name, program),
            Net::Veth(v) => v.peer(side, name, program),
        }
    }

    /// The TAP topology; an error in veth mode (a TAP run asked of it: a bug).
    fn taps(&self) -> Result<&Topology, IwperfError> {
        match self {
            Net::Taps(t) => Ok(t),
            Net::Veth(_) => Err(IwperfError::Setup("no TAPs in this topology".into())),
        }
    }
}

/// Kernel TCP over the veth, the absolute reference ("kernel TCP (veth)"): a
/// `std::net` bulk transfer from a thread in namespace B to one in namespace A, between
/// the kernel addresses on the two bridges (so over the same bridges and veth as the
/// TAP runs, but no TAP), pinned like the peers, for `cfg.seconds`. Returns the
/// receiver's Gbit/s, and Gbit per CPU-second of the busier of the two threads.
///
/// Errors: [`IwperfError::Setup`] if a socket call fails.
fn kernel_tcp(cfg: &DemoConfig, net: &Net, to_stderr: bool) -> Result<(f64, f64), IwperfError> {
    use std::io::{Read, Write};
    let setup = |e: std::io::Error| IwperfError::Setup(format!("kernel TCP reference: {e}"));
    let a_ip = net.kernel_ip(Side::A);
    let (pin, seconds) = (cfg.pin, cfg.seconds);
    let _ticker = Ticker::start("kernel TCP (veth)".into(), to_stderr);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = net
        .netns(Side::A)
        .spawn(move || -> std::io::Result<(u64, f64, f64)> {
            if pin {
                let _ = crate::pin_to_cpu(1);
            }
            let l = std::net::TcpListener::bind((a_ip, KERNEL_TCP_PORT))?;
            let _ = ready_tx.send(());
            let (mut s, _) = l.accept()?;
            let mut buf = vec![0u8; 1 << 17];
            let mut n = 0u64;
            let mut t0 = None;
            let cpu0 = thread_cpu_seconds();
            loop {
                let k = s.read(&mut buf)?;
                if k == 0 {
                    break;
                }
                t0.get_or_insert_with(Instant::now);
                n += k as u64;
            }
            let secs = t0.map_or(0.0, |t| t.elapsed().as_secs_f64());
            Ok((n, secs, thread_cpu_seconds() - cpu0))
        });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| IwperfError::Setup("kernel TCP reference: no listener".into()))?;
    let client = net.netns(Side::B).spawn(move || -> std::io::Result<f64> {
        if pin {
            let _ = crate::pin_to_cpu(0);
        }
        let mut s = std::net::TcpStream::connect((a_ip, KERNEL_TCP_PORT))?;
        let buf = vec![0x5au8; 1 << 17];
        let cpu0 = thread_cpu_seconds();
        let end = Instant::now() + Duration::from_secs_f64(seconds);
        while Instant::now() < end {
            s.write_all(&buf)?;
        }
        Ok(thread_cpu_seconds() - cpu0)
    });
    let client_cpu = joined(client).map_err(setup)?;
    let (bytes, secs, server_cpu) = joined(server).map_err(setup)?;
    Ok((
        TransferReport::rate(bytes, secs),
        TransferReport::rate(bytes, client_cpu.max(server_cpu)),
    ))
}

/// CPU time (user + system) of the calling thread, in seconds.
fn thread_cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_THREAD).map_or(0.0, |u| {
        let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
        secs(u.user_time()) + secs(u.system_time())
    })
}

/// Reads exactly `buf.len()` bytes from `s`, polling (non-blocking reads, yielding
/// between them) for up to `spin` after it starts waiting, then blocking in `poll(2)`,
/// as the iWARP peers wait on their CQ. `Ok(false)` at the end of the stream.
fn read_polling(s: &std::net::TcpStream, buf: &mut [u8], spin: Duration) -> std::io::Result<bool> {
    use nix::errno::Errno;
    use std::os::fd::{AsFd, AsRawFd};
    let mut got = 0;
    let mut since: Option<Instant> = None;
    while got < buf.len() {
        match nix::sys::socket::recv(
            s.as_raw_fd(),
            &mut buf[got..],
            nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(0) => return Ok(false),
            Ok(k) => {
                got += k;
                since = None;
            }
            Err(Errno::EAGAIN) => {
                if since.get_or_insert_with(Instant::now).elapsed() < spin {
                    std::thread::yield_now();
                } else {
                    let mut fds = [nix::poll::PollFd::new(
                        s.as_fd(),
                        nix::poll::PollFlags::POLLIN,
                    )];
                    nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(1000u16))?;
                }
            }
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// Kernel TCP ping-pong over the veth, the host-TCP latency row's baseline: `cfg.lat_iters`
/// round trips of `cfg.lat_size` bytes (`TCP_NODELAY`) from a thread in namespace B to an
/// echo thread in namespace A, between the bridges' kernel addresses, pinned like the
/// peers, both waiting as the iWARP peers do (polling for `cfg.tuning.lat_spin`, then
/// blocking); statistics of half round trips, as the iWARP ping-pong's.
///
/// Errors: [`IwperfError::Setup`] if a socket call fails or nothing was measured.
fn kernel_ping_pong(cfg: &DemoConfig, net: &Net, to_stderr: bool) -> Result<LatStats, IwperfError> {
    use std::io::Write;
    let setup = |e: std::io::Error| IwperfError::Setup(format!("kernel TCP ping-pong: {e}"));
    let a_ip = net.kernel_ip(Side::A);
    let (pin, size, iters, spin) = (
        cfg.pin,
        cfg.lat_size as usize,
        cfg.lat_iters,
        cfg.tuning.lat_spin,
    );
    let _ticker = Ticker::start("kernel TCP ping-pong".into(), to_stderr);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = net.netns(Side::A).spawn(move || -> std::io::Result<()> {
        if pin {
            let _ = crate::pin_to_cpu(1);
        }
        let l = std::net::TcpListener::bind((a_ip, KERNEL_TCP_PORT + 1))?;
        let _ = ready_tx.send(());
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; size];
        while read_polling(&s, &mut buf, spin)? {
            s.write_all(&buf)?;
        }
        Ok(())
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| IwperfError::Setup("kernel TCP ping-pong: no listener".into()))?;
    let client = net
        .netns(Side::B)
        .spawn(move || -> std::io::Result<Vec<u64>> {
            if pin {
                let _ = crate::pin_to_cpu(0);
            }
            let mut s = std::net::TcpStream::connect((a_ip, KERNEL_TCP_PORT + 1))?;
            s.set_nodelay(true)?;
            let mut buf = vec![0x5au8; size];
            let mut samples = Vec::with_capacity(iters as usize);
            for _ in 0..iters {
                let t0 = Instant::now();
                s.write_all(&buf)?;
                if !read_polling(&s, &mut buf, spin)? {
                    return Err(std::io::Error::other("the echo server closed"));
                }
                // Half round trips, as the iWARP ping-pong and the raw TCP one (perftest's).
                samples.push(u64::try_from(t0.elapsed().as_nanos() / 2).unwrap_or(u64::MAX));
            }
            Ok(samples)
        });
    let samples = joined(client).map_err(setup)?;
    joined(server).map_err(setup)?;
    LatStats::from_samples(Op::Send, cfg.lat_size, &samples)
        .ok_or_else(|| IwperfError::Setup("kernel TCP ping-pong: no round trips".into()))
}

/// The result of a thread spawned in a namespace (`NetNs::spawn`): entering it, then
/// what the thread returned; a panic is an error too.
fn joined<T>(
    h: std::thread::JoinHandle<std::io::Result<std::io::Result<T>>>,
) -> std::io::Result<T> {
    h.join()
        .map_err(|_| std::io::Error::other("thread panicked"))
        .and_then(|r| r.and_then(|r| r))
}

fn cpu_args(cfg: &DemoConfig, cpu: usize) -> Vec<String> {
    if cfg.pin {
        vec!["--cpu".into(), cpu.to_string()]
    } else {
        Vec::new()
    }
}

fn endpoint_args(e: &Endpoint) -> Vec<String> {
    vec![
        "--tap".into(),
        e.tap.clone(),
        "--ip".into(),
        format!("{}/{}", e.ip, e.prefix_len),
        "--mac".into(),
        format_mac(&e.mac),
    ]
}

fn common_args(cfg: &DemoConfig) -> Vec<String> {
    let mut v = vec![
        "--spin-us".into(),
        cfg.spin.as_micros().to_string(),
        "--tcp-buffer".into(),
        cfg.tcp_buffer.to_string(),
    ];
    if !cfg.offload {
        v.push("--no-offload".into());
    }
    v
}

fn harness(e: netlab::HarnessError) -> IwperfError {
    match e {
        netlab::HarnessError::Interrupted => IwperfError::Interrupted,
        e => IwperfError::Bench(BenchError::Harness(e)),
    }
}

/// The last stdout line of `out` that is a JSON object.
fn json_line<T: serde::de::DeserializeOwned>(out: &PeerOutput) -> Result<T, IwperfError> {
    let line = out
        .stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| {
            IwperfError::Setup(format!(
                "peer {} ({}) printed no result; stderr:\n{}",
                out.name, out.status, out.stderr
            ))
        })?;
    serde_json::from_str(line)
        .map_err(|e| IwperfError::Setup(format!("peer {}: bad result {line:?}: {e}", out.name)))
}

/// Starts `server` and, once it printed READY, `client`; shows the client's PROGRESS
/// lines on the ticker; waits for both. Returns both outputs whatever their status.
fn run_pair(
    net: &Net,
    cfg: &DemoConfig,
    label: &str,
    server_args: Vec<String>,
    client_args: Vec<String>,
    seconds: f64,
    to_stderr: bool,
) -> Result<(PeerOutput, PeerOutput), IwperfError> {
    let ticker = Ticker::start(label.to_owned(), to_stderr);
    let mut server: Peer = net
        .peer(Side::A, &format!("{label} server"), &cfg.exe)
        .args(server_args)
        .echo(cfg.echo)
        .spawn()
        .map_err(harness)?;
    server
        .wait_for_line(|l| l == "READY", Duration::from_secs(30))
        .map_err(harness)?;
    let mut client: Peer = net
        .peer(Side::B, &format!("{label} client"), &cfg.exe)
        .args(client_args)
        .echo(cfg.echo)
        .spawn()
        .map_err(harness)?;
    let guard = Duration::from_secs_f64(seconds + 60.0);
    // Every stdout line passes the predicate: show progress, stop at the result.
    let seen = client.wait_for_line(
        |l| {
            if let Some(p) = l.strip_prefix("PROGRESS ") {
                // "PROGRESS <seconds> s <rate>": the ticker shows its own seconds.
                let rate = p.split_once(" s ").map_or(p, |(_, r)| r);
                ticker.set(format!(", {rate}"));
            }
            l.starts_with('{')
        },
        guard,
    );
    if let Err(e) = seen {
        // The client exited without a result: collect both outputs for the message.
        if !matches!(e, netlab::HarnessError::Peer(ref f) if f.kind == netlab::FailureKind::ExitedEarly)
        {
            return Err(harness(e));
        }
    }
    let cout = client.wait(Duration::from_secs(30)).map_err(harness)?;
    let sout = server.wait(Duration::from_secs(30)).map_err(harness)?;
    drop(ticker);
    Ok((sout, cout))
}

/// Where a pair of iWARP peers runs: each side's link options and the server's address.
struct PeerLinks {
    server: Vec<String>,
    client: Vec<String>,
    server_ip: Ipv4Addr,
    /// On the TAPs (else on host TCP: no capture, no TAP offload option).
    tap: bool,
}

impl PeerLinks {
    /// The soft device on the topology's TAPs (smoltcp, the peers' own addresses).
    fn taps(topo: &Topology) -> PeerLinks {
        PeerLinks {
            server: endpoint_args(topo.a()),
            client: endpoint_args(topo.b()),
            server_ip: topo.a().ip,
            tap: true,
        }
    }

    /// The soft device on the host's kernel TCP (`--netdev`) on the interface that holds
    /// each side's kernel address ([`Net::kernel_interface`]).
    fn host_tcp(net: &Net) -> PeerLinks {
        let netdev = |side| vec!["--netdev".into(), net.kernel_interface(side).to_owned()];
        PeerLinks {
            server: netdev(Side::A),
            client: netdev(Side::B),
            server_ip: net.kernel_ip(Side::A),
            tap: false,
        }
    }
}

/// What every run of a TAP-mode round shares: the settings, the namespaces, where the
/// ticker prints.
#[derive(Clone, Copy)]
struct Lab<'a> {
    cfg: &'a DemoConfig,
    net: &'a Net,
    to_stderr: bool,
}

/// Per operation, Gbit per CPU-second of the busier peer.
type CpuRates = Vec<(Op, f64)>;

/// One iWARP run of `op` (bandwidth, or with `lat` the Send ping-pong) between an
/// `iwperf server` in namespace A and an `iwperf client` in B on `links`, capturing
/// the client's link to `pcap` if given. Returns the client's report and the CPU
/// seconds of the busier peer.
///
/// Errors: a peer failed other than by a verify mismatch (kept in the report).
fn iwarp_run(
    lab: Lab<'_>,
    links: &PeerLinks,
    op: Op,
    lat: bool,
    pcap: Option<&Path>,
    label: &str,
) -> Result<(ClientReport, f64), IwperfError> {
    let Lab {
        cfg,
        net,
        to_stderr,
    } = lab;
    let mut s = vec!["server".into()];
    s.extend(links.server.iter().cloned());
    s.extend(["--port".into(), IWARP_PORT.to_string(), "--json".into()]);
    s.extend(iwarp_args(cfg, links.tap));
    s.extend(cpu_args(cfg, 1));
    let t = client_test(cfg, SocketAddrV4::new(links.server_ip, IWARP_PORT), op, lat);
    let mut c = vec![
        "client".into(),
        "--peer".into(),
        links.server_ip.to_string(),
    ];
    c.extend(links.client.iter().cloned());
    c.extend([
        "--port".into(),
        IWARP_PORT.to_string(),
        "--op".into(),
        op.name().into(),
        "--size".into(),
        t.size.to_string(),
        "--qps".into(),
        t.qps.to_string(),
        "--tx-depth".into(),
        t.tx_depth.to_string(),
        "--json".into(),
        "--progress".into(),
    ]);
    match t.length {
        RunLength::Iters(n) => c.extend(["--iters".into(), n.to_string()]),
        RunLength::Time(d) => c.extend(["--duration".into(), d.as_secs_f64().to_string()]),
    }
    if lat {
        c.push("--lat".into());
    }
    if t.verify {
        c.push("--verify".into());
    }
    if let Some(p) = pcap {
        c.extend([
            "--pcap".into(),
            p.display().to_string(),
            "--pcap-limit".into(),
            cfg.pcap_limit.to_string(),
        ]);
    }
    c.extend(iwarp_args(cfg, links.tap));
    c.extend(cpu_args(cfg, 0));
    let (so, co) = run_pair(net, cfg, label, s, c, cfg.seconds, to_stderr)?;
    let creport: ClientReport = json_line(&co)?;
    let sreport: ServerSummary = json_line(&so)?;
    for (rep_code, rep_err, who) in [
        (creport.exit_code, creport.error.clone(), "client"),
        (sreport.exit_code, sreport.error.clone(), "server"),
    ] {
        if rep_code != 0 && u32::from(rep_code) != u32::from(super::EXIT_VERIFY) {
            return Err(side_error(&format!("{label} {who}"), rep_code, rep_err));
        }
    }
    let cpu = creport.cpu_seconds.max(sreport.cpu_seconds);
    Ok((creport, cpu))
}

/// The bandwidth runs of every op of `cfg` on `links`: the results and, per op, Gbit
/// per CPU-second of the busier peer. `pcap_round`: capture each run as
/// [`pcap_path`] names it for that round (TAP runs).
fn iwarp_ops(
    lab: Lab<'_>,
    links: &PeerLinks,
    suffix: &str,
    pcap_round: Option<usize>,
    pcaps: &mut Vec<PathBuf>,
) -> Result<(Vec<BwResult>, CpuRates), IwperfError> {
    let cfg = lab.cfg;
    let (mut results, mut cpu_rates) = (Vec::new(), Vec::new());
    for &op in &cfg.ops {
        let pcap = cfg
            .pcap
            .as_ref()
            .zip(pcap_round)
            .map(|(p, round)| pcap_path(p, op.name(), round));
        let label = format!("iWARP {op}{suffix}");
        let (rep, cpu) = iwarp_run(lab, links, op, false, pcap.as_deref(), &label)?;
        pcaps.extend(pcap);
        for r in rep.bandwidth.into_iter().filter(|r| r.op == op) {
            cpu_rates.push((op, TransferReport::rate(r.bytes, cpu)));
            results.push(r);
        }
    }
    Ok((results, cpu_rates))
}

/// The raw smoltcp TCP peers on the TAPs (`iwperf tcp-peer`), bulk for `cfg.seconds`
/// or, with `ping_pong`, that many round trips' ping-pong; (server, client) output.
fn raw_tcp_pair(
    cfg: &DemoConfig,
    net: &Net,
    ping_pong: bool,
    to_stderr: bool,
) -> Result<(PeerOutput, PeerOutput), IwperfError> {
    let topo = net.taps()?;
    let (a, b) = (topo.a(), topo.b());
    let mut s = vec!["tcp-peer".into(), "--role".into(), "server".into()];
    s.extend(endpoint_args(a));
    s.extend(["--peer-ip".into(), b.ip.to_string()]);
    let mut c = vec!["tcp-peer".into(), "--role".into(), "client".into()];
    c.extend(endpoint_args(b));
    c.extend(["--peer-ip".into(), a.ip.to_string()]);
    if ping_pong {
        s.extend(["--ping-pong".into(), cfg.lat_size.to_string()]);
        c.extend(["--ping-pong".into(), cfg.lat_size.to_string()]);
        c.extend(["--iters".into(), cfg.lat_iters.to_string()]);
    } else {
        c.extend(["--duration".into(), cfg.seconds.to_string()]);
    }
    s.extend(cpu_args(cfg, 1));
    s.extend(common_args(cfg));
    c.extend(cpu_args(cfg, 0));
    c.extend(common_args(cfg));
    let (label, seconds) = if ping_pong {
        ("tcp ping-pong", 10.0)
    } else {
        ("tcp baseline", cfg.seconds)
    };
    run_pair(net, cfg, label, s, c, seconds, to_stderr)
}

fn tap_round(
    cfg: &DemoConfig,
    net: &Net,
    round: usize,
    pcaps: &mut Vec<PathBuf>,
    to_stderr: bool,
) -> Result<RoundResult, IwperfError> {
    let mut out = RoundResult::default();
    if cfg.tap_rows {
        // Raw TCP bulk transfer.
        let (so, co) = raw_tcp_pair(cfg, net, false, to_stderr)?;
        for o in [&so, &co] {
            if !o.status.success() {
                return Err(IwperfError::Setup(format!(
                    "TCP baseline peer {} failed ({}): {}",
                    o.name, o.status, o.stderr
                )));
            }
        }
        let server: TransferReport = json_line(&so)?;
        let client: TransferReport = json_line(&co)?;
        out.tcp_gbps = server.gbit_per_s;
        out.tcp_cpu_gbps = Some(TransferReport::rate(
            server.bytes,
            (server.cpu_user + server.cpu_sys).max(client.cpu_user + client.cpu_sys),
        ));
    }
    let (kernel, kernel_cpu) = kernel_tcp(cfg, net, to_stderr)?;
    out.kernel_gbps = Some(kernel);
    out.kernel_cpu_gbps = Some(kernel_cpu);
    let host = PeerLinks::host_tcp(net);
    let lab = Lab {
        cfg,
        net,
        to_stderr,
    };
    if cfg.tap_rows {
        let taps = PeerLinks::taps(net.taps()?);
        (out.ops, out.ops_cpu_gbps) = iwarp_ops(lab, &taps, "", Some(round), pcaps)?;
    }
    if cfg.host_rows {
        (out.host_ops, out.host_ops_cpu_gbps) = iwarp_ops(lab, &host, " (host TCP)", None, pcaps)?;
    }
    if !cfg.latency {
        return Ok(out);
    }
    let ping_pong = |links: &PeerLinks, label: &str| {
        iwarp_run(lab, links, Op::Send, true, None, label).map(|(rep, _)| rep.latency)
    };
    if cfg.tap_rows {
        let (_so, co) = raw_tcp_pair(cfg, net, true, to_stderr)?;
        if !co.status.success() {
            return Err(IwperfError::Setup(format!(
                "TCP ping-pong client failed ({}): {}",
                co.status, co.stderr
            )));
        }
        let tcp: LatStats = json_line(&co)?;
        let taps = PeerLinks::taps(net.taps()?);
        out.lat = ping_pong(&taps, "iWARP send ping-pong")?.map(|i| (i, tcp));
    }
    if cfg.host_rows {
        let kernel = kernel_ping_pong(cfg, net, to_stderr)?;
        out.host_lat = ping_pong(&host, "iWARP send ping-pong (host TCP)")?.map(|i| (i, kernel));
    }
    Ok(out)
}

/// The MPA and device options every iWARP peer gets (`tap`: on a TAP, which takes
/// `--no-offload`; host TCP does not).
fn iwarp_args(cfg: &DemoConfig, tap: bool) -> Vec<String> {
    let mut v = vec![
        "--crc".into(),
        if cfg.crc { "on" } else { "off" }.into(),
        "--markers".into(),
        if cfg.markers { "on" } else { "off" }.into(),
        "--mpa-rev".into(),
        cfg.mpa_rev.to_string(),
        "--poll-spin-us".into(),
        cfg.tuning.spin.as_micros().to_string(),
        "--lat-poll-spin-us".into(),
        cfg.tuning.lat_spin.as_micros().to_string(),
        "--poll-nap-us".into(),
        cfg.tuning.nap.as_micros().to_string(),
        "--progress-mode".into(),
        match cfg.progress {
            softiwarp::ProgressMode::Engine => "engine",
            softiwarp::ProgressMode::Hybrid => "hybrid",
        }
        .into(),
    ];
    v.extend(
        common_args(cfg)
            .into_iter()
            .filter(|a| tap || a != "--no-offload"),
    );
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn pcap_paths_count_rounds_from_one() {
        assert_eq!(
            super::pcap_path(std::path::Path::new("/tmp/x/demo"), "write", 0),
            std::path::PathBuf::from("/tmp/x/demo-write-r1.pcap")
        );
    }
}
