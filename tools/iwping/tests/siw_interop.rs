//! Root-only: `iwping` (our rping, on softiwarp's RDMA CM and verbs) against rdma-core's
//! rping on the Linux kernel's siw, in a QEMU VM (`shared/tools/siwvm/siw-peer-vm.sh`,
//! harness [`netlab::siwvm`]), for each siw build (variant) and both directions:
//!
//! - `iwping -c` against kernel `rping -s`, and kernel `rping -c` against `iwping -s`,
//!   with `-v -V`: both sides exit 0, every ping's data is the rping pattern on both
//!   sides (our client and kernel rping's compare sink with source; our server checks
//!   what it read);
//! - every run captured by our device (`--pcap`): `iwdump` decodes it with no error, one
//!   MPA connection, the exact message counts of the exchange, no Terminate; every FPDU
//!   we sent is alone in its TCP segment and no larger than the MSS; tshark finds the
//!   Request and Reply, nothing malformed, no bad CRC; the close is FINs, no RST.
//!
//! One VM per variant (booted once, about 7 s under software emulation; both directions
//! run in it), one VM at a time. The traps of interop and the runs that cover
//! them are listed in docs/ARCHITECTURE.md, "Interop with kernel siw".
//!
//! Each test skips (saying so) when not root; when the VM cannot be built or booted it
//! skips too, except in CI (`CI` set), where that is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use iwping::rping::{client_line, ping_data, server_line};
use netlab::capture::tshark_summary;
use netlab::siwvm::{ensure_built, SiwVm, Variant, HOST_IP, VM_IP};
use netlab::{format_mac, PeerOutput, PeerSpec};

const IWPING: &str = env!("CARGO_BIN_EXE_iwping");

/// One VM at a time: a TCG guest takes a core while it works.
static ONE_VM: Mutex<()> = Mutex::new(());

/// Boots `variant`'s VM, or says why the test is skipped (`None`).
fn vm_or_skip(test: &str, variant: Variant) -> Option<SiwVm> {
    if !netlab::netns::is_root() {
        eprintln!("skipping {test}: needs root (namespaces, TAPs, a VM)");
        return None;
    }
    let in_ci = std::env::var_os("CI").is_some();
    let t0 = Instant::now();
    if let Err(e) = ensure_built() {
        assert!(!in_ci, "{test}: the siw VM must build in CI: {e}");
        eprintln!("skipping {test}: cannot build the siw VM: {e}");
        return None;
    }
    match SiwVm::start(variant) {
        Ok(vm) => {
            println!(
                "{test}: VM ({}) up in {:.1?} ({:.1?} with the build check)",
                variant.name(),
                vm.boot_time(),
                t0.elapsed()
            );
            Some(vm)
        }
        Err(e) => {
            assert!(!in_ci, "{test}: the siw VM must boot in CI: {e}");
            eprintln!("skipping {test}: cannot boot the siw VM: {e}");
            None
        }
    }
}

/// Removes a file when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn pcap_file(label: &str) -> TempFile {
    netlab::capture::remove_stale_files(&std::env::temp_dir(), "siw-interop-");
    TempFile(std::env::temp_dir().join(format!(
        "siw-interop-{}-{label}.pcap",
        netlab::netns::unique_tag()
    )))
}

/// Which program plays which role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// `iwping -c` against kernel `rping -s`.
    OursClient,
    /// Kernel `rping -c` against `iwping -s`.
    OursServer,
}

/// One run's setup.
struct RunSpec<'a> {
    label: &'a str,
    direction: Direction,
    pings: u64,
    size: usize,
    /// Extra iwping options.
    iwping_args: &'a [&'a str],
}

/// One run's outcome.
struct RunOutcome {
    ours: PeerOutput,
    kernel_rc: i32,
    kernel_out: String,
    pcap: TempFile,
    took: Duration,
}

/// Which transport our side runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Via {
    /// A smoltcp device on the VM's TAP ([`netlab::siwvm::Endpoint`]), captured.
    Tap,
    /// A host-TCP device on this interface (the bridge, whose kernel holds
    /// [`HOST_IP`]: [`SiwVm::host_tcp_interface`]); no capture of our own.
    HostTcp(String),
}

fn iwping(vm: &SiwVm, name: &str, pcap: &Path, via: &Via) -> PeerSpec {
    let ep = vm.endpoint();
    if let Via::HostTcp(ifname) = via {
        return PeerSpec::new(name, IWPING).netns(ep.netns.clone()).args([
            "--netdev",
            ifname,
            "--timeout",
            "30",
        ]);
    }
    PeerSpec::new(name, IWPING).netns(ep.netns.clone()).args([
        "--tap".to_owned(),
        ep.tap.clone(),
        "--ip".to_owned(),
        format!("{}/{}", ep.ip, ep.prefix_len),
        "--mac".to_owned(),
        format_mac(&ep.mac),
        "--pcap".to_owned(),
        pcap.display().to_string(),
        "--timeout".to_owned(),
        "30".to_owned(),
    ])
}

/// Runs both sides of one rping session and collects what they said. Panics (with both
/// sides' output and the guest console) when a side cannot be started or hangs.
fn run(vm: &SiwVm, spec: &RunSpec<'_>) -> RunOutcome {
    run_via(vm, spec, &Via::Tap)
}

/// [`run`] with our side on `via`.
fn run_via(vm: &SiwVm, spec: &RunSpec<'_>, via: &Via) -> RunOutcome {
    let pcap = pcap_file(spec.label);
    let t0 = Instant::now();
    let common = [
        "-v",
        "-V",
        "-C",
        &spec.pings.to_string(),
        "-S",
        &spec.size.to_string(),
    ]
    .map(str::to_owned);
    let (ours, kernel_rc, kernel_out) = match spec.direction {
        Direction::OursClient => {
            let tag = format!("srv-{}", spec.label);
            vm.spawn(&tag, &format!("rping -s -a 0.0.0.0 {}", common.join(" ")))
                .expect("start kernel rping -s");
            // rping listens on a kernel TCP socket: 0.0.0.0:7174.
            vm.wait_listening(7174, Duration::from_secs(60))
                .unwrap_or_else(|e| {
                    panic!("kernel rping -s never listened: {e}\n{}", vm.console())
                });
            let client = iwping(vm, "iwping-c", &pcap.0, via)
                .args(["-c", "-a", &VM_IP.to_string()])
                .args(common.iter())
                .args(spec.iwping_args.iter())
                .spawn()
                .expect("start iwping -c");
            let ours = client.wait(Duration::from_secs(120));
            let kernel = vm.wait_spawned(&tag, Duration::from_secs(60));
            let ours =
                ours.unwrap_or_else(|e| panic!("iwping -c: {e}\nguest console:\n{}", vm.console()));
            let (rc, out) = kernel.unwrap_or_else(|e| panic!("kernel rping -s: {e}"));
            (ours, rc, out)
        }
        Direction::OursServer => {
            let mut server = iwping(vm, "iwping-s", &pcap.0, via)
                .args(["-s", "-d"])
                .args(common.iter())
                .args(spec.iwping_args.iter())
                .spawn()
                .expect("start iwping -s");
            server
                .wait_for_line(|l| l == "rdma_listen", Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("iwping -s did not listen: {e}"));
            let kernel = vm.exec(
                &format!("rping -c -a {HOST_IP} {}", common.join(" ")),
                Duration::from_secs(120),
            );
            let ours = server.wait(Duration::from_secs(60));
            let ours =
                ours.unwrap_or_else(|e| panic!("iwping -s: {e}\nguest console:\n{}", vm.console()));
            let (rc, out) = kernel.unwrap_or_else(|e| panic!("kernel rping -c: {e}"));
            (ours, rc, out)
        }
    };
    let took = t0.elapsed();
    println!(
        "run {} ({:?}, {} x {} bytes, iwping {:?}): {:.1?}; iwping {}, kernel rping rc {kernel_rc}",
        spec.label, spec.direction, spec.pings, spec.size, spec.iwping_args, took, ours.status
    );
    RunOutcome {
        ours,
        kernel_rc,
        kernel_out,
        pcap,
        took,
    }
}

/// Both sides exited 0 and printed every ping's data as rping prints it.
fn assert_pings_ok(spec: &RunSpec<'_>, r: &RunOutcome) {
    let context = || {
        format!(
            "iwping ({}):\n{}\n{}\nkernel rping (rc {}):\n{}",
            r.ours.status, r.ours.stdout, r.ours.stderr, r.kernel_rc, r.kernel_out
        )
    };
    assert!(r.ours.status.success(), "{}", context());
    // rping's client can lose a teardown race of its own: its CM thread reads the
    // event channel after main destroyed it ("rdma_get_cm_event: Bad file
    // descriptor", exit 255), after every ping was done and checked (-V). That alone
    // is not a failure of the exchange; the ping lines below are still checked.
    let teardown_race = spec.direction == Direction::OursServer
        && r.kernel_rc == 255
        && r.kernel_out
            .contains("rdma_get_cm_event: Bad file descriptor")
        && !r.kernel_out.contains("data mismatch");
    if teardown_race {
        println!(
            "{}: kernel rping -c lost its teardown race (exit 255 after the pings)",
            spec.label
        );
    } else {
        assert_eq!(r.kernel_rc, 0, "{}", context());
    }
    let client: Vec<String> = (0..spec.pings)
        .map(|i| client_line(&ping_data(i, spec.size)))
        .collect();
    let server: Vec<String> = (0..spec.pings)
        .map(|i| server_line(&ping_data(i, spec.size)))
        .collect();
    let lines = |text: &str, prefix: &str| -> Vec<String> {
        text.lines()
            .map(|l| l.trim_end_matches('\r'))
            .filter(|l| l.starts_with(prefix))
            .map(str::to_owned)
            .collect()
    };
    // The guest's lines come through its serial console, which cuts long lines: the
    // kernel side's lines are compared on their first 120 characters (the prefix and
    // the ping number; the data itself is checked by rping's -V and ours).
    let cut = |v: Vec<String>| -> Vec<String> {
        v.into_iter()
            .map(|l| l.chars().take(120).collect())
            .collect()
    };
    let (ours_client, ours_server, theirs_client, theirs_server) = match spec.direction {
        Direction::OursClient => (
            lines(&r.ours.stdout, "ping data: "),
            None,
            None,
            Some(lines(&r.kernel_out, "server ping data: ")),
        ),
        Direction::OursServer => (
            Vec::new(),
            Some(lines(&r.ours.stdout, "server ping data: ")),
            Some(lines(&r.kernel_out, "ping data: ")),
            None,
        ),
    };
    if spec.direction == Direction::OursClient {
        assert_eq!(ours_client, client, "{}", context());
    }
    if let Some(ours) = ours_server {
        assert_eq!(ours, server, "{}", context());
    }
    if let Some(theirs) = theirs_client {
        assert_eq!(cut(theirs), cut(client), "{}", context());
    }
    if let Some(theirs) = theirs_server {
        assert_eq!(cut(theirs), cut(server), "{}", context());
    }
}

/// What the capture of a run must show.
#[derive(Debug, Clone, Copy)]
struct Expect {
    pings: u64,
    crc: bool,
    /// MPA revision of both frames.
    rev: u8,
    /// The RTR of P2P mode: `Some("Write")` / `Some("ReadRequest")`, sent by the initiator.
    rtr: Option<&'static str>,
    /// 64 KiB pings: our FPDUs may be re-cut by TCP when the guest's window fills.
    large: bool,
}

/// The checks of every capture (see the module docs).
fn check_capture(label: &str, path: &Path, ours_initiator: bool, e: Expect) {
    let report = iwdump::dissect_file(path).unwrap_or_else(|err| panic!("{label}: iwdump: {err}"));
    assert!(
        report.errors.is_empty(),
        "{label}: iwdump errors: {:?}",
        &report.errors[..report.errors.len().min(5)]
    );
    assert_eq!(
        report.connections.len(),
        1,
        "{label}: {:?}",
        report.connections
    );
    let conn = &report.connections[0];
    let ours = std::net::IpAddr::V4(HOST_IP);
    assert_eq!(
        conn.initiator.ip() == ours,
        ours_initiator,
        "{label}: {conn:?}"
    );
    assert_eq!(conn.crc, Some(e.crc), "{label}: CRC: {conn:?}");
    let (req, rep) = (conn.request.as_ref(), conn.reply.as_ref());
    assert_eq!(req.map(|f| f.revision), Some(e.rev), "{label}: {conn:?}");
    assert_eq!(rep.map(|f| f.revision), Some(e.rev), "{label}: {conn:?}");
    assert_eq!(rep.map(|f| f.reject), Some(false), "{label}: {conn:?}");
    // Messages: per ping two Sends each way, one Read (Request + Response), one Write;
    // plus the RTR.
    let mut want = std::collections::BTreeMap::new();
    want.insert("Send".to_owned(), 4 * e.pings);
    want.insert("ReadRequest".to_owned(), e.pings);
    want.insert("ReadResponse".to_owned(), e.pings);
    want.insert("Write".to_owned(), e.pings);
    match e.rtr {
        Some("Write") => *want.get_mut("Write").unwrap() += 1,
        Some("ReadRequest") => {
            *want.get_mut("ReadRequest").unwrap() += 1;
            *want.get_mut("ReadResponse").unwrap() += 1;
        }
        _ => {}
    }
    assert_eq!(
        report.messages, want,
        "{label}: messages (Terminate or stray FPDUs?)"
    );
    // The RTR is the initiator's first FPDU: zero-length; a Write RTR has STag 1, TO 0
    // (siw); a Read RTR is answered by a zero-length Read Response.
    if let Some(rtr) = e.rtr {
        let first = report
            .fpdu_records()
            .find(|(p, _)| p.src == conn.initiator)
            .unwrap_or_else(|| panic!("{label}: no FPDU from the initiator"));
        assert_eq!(first.1.opcode, rtr, "{label}: first FPDU {first:?}");
        assert_eq!(first.1.payload_len, 0, "{label}: {first:?}");
        if rtr == "Write" && !ours_initiator {
            assert!(
                matches!(
                    first.1.ddp,
                    Some(iwdump::report::DdpInfo::Tagged { stag: 1, to: 0 })
                ),
                "{label}: siw's Write RTR is STag 1, TO 0: {first:?}"
            );
        }
        if rtr == "ReadRequest" {
            let resp = report
                .fpdu_records()
                .find(|(p, f)| p.src == conn.responder && f.opcode == "ReadResponse")
                .unwrap_or_else(|| panic!("{label}: no Read Response"));
            assert_eq!(
                resp.1.payload_len, 0,
                "{label}: the RTR's Read Response: {resp:?}"
            );
        }
    }
    // One FPDU per TCP segment from us, never larger than the MSS (1460 at MTU 1500).
    let mut per_frame = std::collections::HashMap::<u64, u32>::new();
    let (mut ours_n, mut kernel_multi, mut split) = (0u64, 0u64, 0u64);
    for (p, f) in report.fpdu_records() {
        if p.src.ip() == ours {
            ours_n += 1;
            if p.first_frame != p.frame {
                // smoltcp re-cuts a segment when the peer's window is smaller than the
                // FPDU, or on retransmission (documented in softiwarp/src/transport/mod.rs): counted, and
                // allowed only in the 64 KiB runs, where the guest's window fills.
                split += 1;
                assert!(e.large, "{label}: our FPDU spans frames: {p:?} {f:?}");
                continue;
            }
            assert!(
                p.wire_len <= 1460,
                "{label}: our FPDU exceeds the MSS: {p:?}"
            );
            *per_frame.entry(p.frame).or_default() += 1;
        }
    }
    // Known gap: ULPDUs held during startup (our RTR and what was sent during the
    // initiator's first-FPDU hold) are framed back to back when released and may share
    // the first data segment; every later FPDU is alone.
    let first_data_frame = report
        .fpdu_records()
        .find(|(p, _)| p.src.ip() == ours)
        .map(|(p, _)| p.frame);
    for (frame, n) in &per_frame {
        if e.rtr.is_some() && ours_initiator && Some(*frame) == first_data_frame {
            assert!(*n <= 2, "{label}: {n} of our FPDUs in frame {frame}");
            continue;
        }
        assert_eq!(*n, 1, "{label}: {n} of our FPDUs in frame {frame}");
    }
    {
        let mut kernel_frames = std::collections::HashMap::<u64, u32>::new();
        for (p, _) in report.fpdu_records().filter(|(p, _)| p.src.ip() != ours) {
            *kernel_frames.entry(p.frame).or_default() += 1;
        }
        kernel_multi += kernel_frames.values().filter(|&&n| n > 1).count() as u64;
    }
    println!(
        "{label}: iwdump: {} frames, {} FPDUs ({ours_n} ours, {split} of them re-cut by TCP; kernel frames with several FPDUs: {kernel_multi}), {} warnings, messages {:?}",
        report.frames,
        report.fpdus,
        report.warnings.len(),
        report.messages
    );
    if !tshark_installed() {
        assert!(std::env::var_os("CI").is_none(), "tshark missing in CI");
        eprintln!("tshark not installed: skipping the Wireshark checks");
        return;
    }
    let t = tshark_summary(path).expect("tshark");
    println!("{label}: tshark: {t:?}");
    assert_eq!((t.mpa_requests, t.mpa_replies), (1, 1), "{label}: {t:?}");
    assert!(t.fpdu_frames > 0 && t.ddp_frames > 0, "{label}: {t:?}");
    assert_eq!(t.malformed, 0, "{label}: {t:?}");
    assert_eq!(t.bad_crc_frames, 0, "{label}: {t:?}");
    assert_eq!(t.expert_errors, 0, "{label}: {t:?}");
    // A clean close: both sides send a FIN. The only RST allowed is ours after the FIN
    // exchange completed: our device's shutdown aborts the connection in TIME-WAIT.
    let (fins, rsts) = tcp_fins_and_rsts(path);
    let from = |v: &[(u64, String)], ip: std::net::Ipv4Addr| {
        v.iter()
            .find(|(_, s)| *s == ip.to_string())
            .map(|(f, _)| *f)
    };
    let (Some(our_fin), Some(their_fin)) = (from(&fins, HOST_IP), from(&fins, VM_IP)) else {
        panic!("{label}: FINs {fins:?}");
    };
    for (frame, src) in &rsts {
        assert!(
            *src == HOST_IP.to_string() && *frame > our_fin.max(their_fin) + 1,
            "{label}: RST in frame {frame} from {src} (FINs {fins:?})"
        );
    }
}

fn tshark_installed() -> bool {
    Command::new("tshark").arg("-v").output().is_ok()
}

/// Frame numbers and source addresses.
type Flagged = Vec<(u64, String)>;

/// The frames with FIN and with RST segments in a capture, with their sources (tshark).
fn tcp_fins_and_rsts(path: &Path) -> (Flagged, Flagged) {
    let out = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(path)
        .args([
            "-T",
            "fields",
            "-e",
            "frame.number",
            "-e",
            "ip.src",
            "-e",
            "tcp.flags.fin",
            "-e",
            "tcp.flags.reset",
        ])
        .output()
        .expect("tshark");
    let (mut fins, mut rsts) = (Vec::new(), Vec::new());
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() < 4 {
            continue;
        }
        let set = |v: &str| v == "1" || v == "True";
        let frame = f[0].parse().unwrap_or(0);
        if set(f[2]) {
            fins.push((frame, f[1].to_owned()));
        }
        if set(f[3]) {
            rsts.push((frame, f[1].to_owned()));
        }
    }
    (fins, rsts)
}

/// Runs `spec`, checks both sides and the capture.
fn pass(vm: &SiwVm, spec: RunSpec<'_>, expect: Expect) -> Duration {
    pass_via(vm, spec, expect, &Via::Tap)
}

/// [`pass`] with our side on `via`; a host-TCP run has no capture of ours to check.
fn pass_via(vm: &SiwVm, spec: RunSpec<'_>, expect: Expect, via: &Via) -> Duration {
    let r = run_via(vm, &spec, via);
    if *via != Via::Tap {
        assert_pings_ok(&spec, &r);
        return r.took;
    }
    assert_pings_ok(&spec, &r);
    check_capture(
        spec.label,
        &r.pcap.0,
        spec.direction == Direction::OursClient,
        expect,
    );
    r.took
}

fn plain(pings: u64) -> Expect {
    Expect {
        pings,
        crc: false,
        rev: 2,
        rtr: None,
        large: false,
    }
}

#[test]
fn default_siw_both_directions_small_and_64k_pings() {
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    let Some(vm) = vm_or_skip("default_siw", Variant::Default) else {
        return;
    };
    for (label, direction, pings, size) in [
        ("default-c", Direction::OursClient, 10, 64),
        ("default-s", Direction::OursServer, 10, 64),
        ("default-c-64k", Direction::OursClient, 3, 65_535),
        ("default-s-64k", Direction::OursServer, 3, 65_535),
    ] {
        let spec = RunSpec {
            label,
            direction,
            pings,
            size,
            iwping_args: &[],
        };
        let expect = Expect {
            large: size > 1400,
            ..plain(pings)
        };
        pass(&vm, spec, expect);
    }
}

#[test]
fn crc_siw_both_directions() {
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    let Some(vm) = vm_or_skip("crc_siw", Variant::Crc) else {
        return;
    };
    let crc = Expect {
        crc: true,
        ..plain(10)
    };
    // Kernel siw asks for CRC only as initiator; as responder it uses it when asked.
    pass(
        &vm,
        RunSpec {
            label: "crc-c",
            direction: Direction::OursClient,
            pings: 10,
            size: 64,
            iwping_args: &["--crc", "required"],
        },
        crc,
    );
    pass(
        &vm,
        RunSpec {
            label: "crc-s",
            direction: Direction::OursServer,
            pings: 10,
            size: 64,
            iwping_args: &[],
        },
        crc,
    );
}

#[test]
fn p2p_siw_both_directions_with_write_and_read_rtr() {
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    let Some(vm) = vm_or_skip("p2p_siw", Variant::P2p) else {
        return;
    };
    // Kernel initiator: P2P, Write RTR (zero-length, STag 1, TO 0).
    pass(
        &vm,
        RunSpec {
            label: "p2p-s",
            direction: Direction::OursServer,
            pings: 10,
            size: 64,
            iwping_args: &[],
        },
        Expect {
            rtr: Some("Write"),
            ..plain(10)
        },
    );
    // We initiate P2P offering Write and Read: siw picks Write.
    pass(
        &vm,
        RunSpec {
            label: "p2p-c-write",
            direction: Direction::OursClient,
            pings: 10,
            size: 64,
            iwping_args: &["--p2p"],
        },
        Expect {
            rtr: Some("Write"),
            ..plain(10)
        },
    );
    // Offering only a Read RTR: a zero-length Read that siw answers with a zero-length
    // Read Response.
    pass(
        &vm,
        RunSpec {
            label: "p2p-c-read",
            direction: Direction::OursClient,
            pings: 10,
            size: 64,
            iwping_args: &["--p2p", "--rtr", "read"],
        },
        Expect {
            rtr: Some("ReadRequest"),
            ..plain(10)
        },
    );
    // The Chelsio iw_cxgb4 defaults (`LocalSettings::chelsio()`, iwperf's
    // `--mpa-profile chelsio`): P2P with a Read RTR and CRC asked for; siw's p2p build
    // answers the Read RTR and uses CRC because we asked.
    pass(
        &vm,
        RunSpec {
            label: "p2p-c-chelsio",
            direction: Direction::OursClient,
            pings: 10,
            size: 64,
            iwping_args: &["--p2p", "--rtr", "read", "--crc", "wanted"],
        },
        Expect {
            rtr: Some("ReadRequest"),
            crc: true,
            ..plain(10)
        },
    );
}

#[test]
fn mpa_rev1_siw_reads_need_an_ord_set_by_hand() {
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    let Some(vm) = vm_or_skip("mpav1_siw", Variant::MpaV1) else {
        return;
    };
    let v1 = Expect {
        rev: 1,
        ..plain(10)
    };
    // Rev 1 carries no IRD/ORD: the CM reports 0/0 for the request, and rping's server
    // (rdma_accept(id, NULL)) mirrors that, so its RDMA Read has ORD 0 and is refused
    // at ibv_post_send: the error users see.
    let spec = RunSpec {
        label: "mpav1-s-mirror",
        direction: Direction::OursServer,
        pings: 10,
        size: 64,
        iwping_args: &[],
    };
    let r = run(&vm, &spec);
    assert!(!r.ours.status.success(), "{}", r.ours.stdout);
    assert!(
        r.ours.stderr.contains("ibv_post_send (RDMA Read)") && r.ours.stderr.contains("ORD"),
        "iwping -s: {}",
        r.ours.stderr
    );
    assert!(
        r.ours.stdout.contains("rdma_accept (IRD 0, ORD 0)"),
        "{}",
        r.ours.stdout
    );
    // rping's client exits 0 whenever the run ends in DISCONNECTED, even with no ping
    // done: what shows the failure is its output.
    assert!(
        r.kernel_out.contains("DISCONNECT EVENT") && !r.kernel_out.contains("ping data:"),
        "kernel rping -c (rc {}): {}",
        r.kernel_rc,
        r.kernel_out
    );
    // With IRD/ORD set by hand (what a rev-1 ULP must agree on out of band) the Reads
    // run, up to the ORD we set: the kernel client's IRD is its own setting (1).
    pass(
        &vm,
        RunSpec {
            label: "mpav1-s",
            direction: Direction::OursServer,
            pings: 10,
            size: 64,
            iwping_args: &["--ird-ord", "1,1"],
        },
        v1,
    );
    // We initiate with rev 1: siw's responder mirrors rev 1 and its rping server, by the
    // same rdma_accept(id, NULL), gets ORD 0 and fails its first RDMA Read; our client
    // sees the disconnect and says so (kernel siw fails the same way against itself).
    let spec = RunSpec {
        label: "mpav1-c",
        direction: Direction::OursClient,
        pings: 10,
        size: 64,
        iwping_args: &["--mpa-rev", "1"],
    };
    let r = run(&vm, &spec);
    println!(
        "mpav1-c: iwping {}: {}\nkernel rping -s (rc {}): {}",
        r.ours.status, r.ours.stderr, r.kernel_rc, r.kernel_out
    );
    assert!(!r.ours.status.success());
    assert!(
        r.ours.stderr.contains("DISCONNECTED during ping 0"),
        "{}",
        r.ours.stderr
    );
    assert!(r.kernel_out.contains("post send error"), "{}", r.kernel_out);
}

/// Our side on the host's kernel TCP (`iwping --netdev` on the VM's bridge, whose kernel
/// holds [`HOST_IP`]) against kernel siw, in each siw build: both directions, plain,
/// CRC and peer-to-peer (siw's Write RTR; ours offering Write and Read).
#[test]
fn host_tcp_against_siw_default_crc_and_p2p_both_directions() {
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    for (variant, runs) in [
        (
            Variant::Default,
            vec![
                ("host-default-c", Direction::OursClient, 3, 65_535, &[][..]),
                ("host-default-s", Direction::OursServer, 10, 64, &[][..]),
            ],
        ),
        (
            Variant::Crc,
            vec![
                (
                    "host-crc-c",
                    Direction::OursClient,
                    10,
                    64,
                    &["--crc", "required"][..],
                ),
                ("host-crc-s", Direction::OursServer, 10, 64, &[][..]),
            ],
        ),
        (
            Variant::P2p,
            vec![
                ("host-p2p-s", Direction::OursServer, 10, 64, &[][..]),
                ("host-p2p-c", Direction::OursClient, 10, 64, &["--p2p"][..]),
            ],
        ),
    ] {
        let Some(vm) = vm_or_skip("host_tcp_against_siw", variant) else {
            return;
        };
        let via = Via::HostTcp(vm.host_tcp_interface().expect("HOST_IP on the bridge"));
        for (label, direction, pings, size, iwping_args) in runs {
            let spec = RunSpec {
                label,
                direction,
                pings,
                size,
                iwping_args,
            };
            pass_via(&vm, spec, plain(pings), &via);
        }
    }
}
