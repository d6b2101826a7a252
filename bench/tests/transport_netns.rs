//! Root-only: every benchmark variant across two namespaces, as `transport-bench` runs it
//! (two `bench-peer` processes, TAPs, bridges, veth), verified byte for byte (CRC32c of
//! everything moved) at MTU 1500 and 65000; and `transport-bench` cleaning up after
//! SIGINT. Each test skips (with a
//! message) when not run as root.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bench::runner::{run_one, RunLength, RunnerConfig, Variant};
use bench::tcp::{pattern, PATTERN_LEN};
use netlab::{leftover_namespaces, skip_unless_root, Topology};
use softiwarp::transport::smoltcp_glue::mss_for_mtu;

/// CRC32c of the first `n` bytes of the client's repeating pattern.
fn expected_crc(n: u64) -> u32 {
    let pat = pattern(PATTERN_LEN, 0x5eed);
    let mut crc = 0u32;
    let mut left = n;
    while left > 0 {
        let k = left.min(PATTERN_LEN as u64) as usize;
        crc = crc32c::crc32c_append(crc, &pat[..k]);
        left -= k as u64;
    }
    crc
}

#[test]
fn tcp_baseline_is_verified_across_namespaces() {
    if skip_unless_root("tcp_baseline_is_verified_across_namespaces") {
        return;
    }
    const BYTES: u64 = 48 << 20;
    let mut cfg = RunnerConfig::new();
    cfg.peer = PathBuf::from(env!("CARGO_BIN_EXE_bench-peer"));
    cfg.length = RunLength::Bytes(BYTES);
    cfg.verify = true;
    cfg.pin = false;
    cfg.echo = true;
    for mtu in [1500, 65000] {
        let topo = Topology::create(mtu).expect("topology");
        let names = topo.namespaces();
        let s = run_one(&topo, &cfg, Variant::Tcp, 0).unwrap_or_else(|e| panic!("{e}"));
        drop(topo);
        assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
        assert_eq!(s.mtu, mtu);
        assert_eq!((s.server.mtu, s.client.mtu), (mtu, mtu));
        assert_eq!(s.client.bytes, BYTES);
        assert_eq!(s.server.bytes, BYTES);
        let crc = expected_crc(BYTES);
        assert_eq!(s.client.crc32c, Some(crc));
        assert_eq!(s.server.crc32c, Some(crc));
        // The MSS follows the MTU: at least BYTES / MSS data segments, and (no loss
        // expected on this path) not many more.
        let min_frames = BYTES / mss_for_mtu(mtu) as u64;
        assert!(
            (min_frames..min_frames * 2).contains(&s.client.tx_frames),
            "mtu {mtu}: {} frames sent, expected about {min_frames}",
            s.client.tx_frames
        );
        assert!(s.server.gbit_per_s > 0.0);
        println!(
            "mtu {mtu}: {:.2} Gbit/s (debug builds are slow; see transport-bench)",
            s.server.gbit_per_s
        );
    }
}

#[test]
fn fpdu_variants_are_verified_across_namespaces() {
    if skip_unless_root("fpdu_variants_are_verified_across_namespaces") {
        return;
    }
    const BYTES: u64 = 16 << 20;
    let mut cfg = RunnerConfig::new();
    cfg.peer = PathBuf::from(env!("CARGO_BIN_EXE_bench-peer"));
    cfg.length = RunLength::Bytes(BYTES);
    cfg.verify = true;
    cfg.pin = false;
    cfg.echo = true;
    for mtu in [1500, 65000] {
        let topo = Topology::create(mtu).expect("topology");
        let names = topo.namespaces();
        for variant in [
            Variant::FpduCrc,
            Variant::FpduNoCrc,
            Variant::InlineCrc,
            Variant::InlineNoCrc,
        ] {
            let s = run_one(&topo, &cfg, variant, 0).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(s.server.mode, variant.name(), "the CRC agreement asked for");
            assert_eq!(s.client.mode, variant.name());
            assert_eq!(
                (s.client.bytes, s.server.bytes),
                (BYTES, BYTES),
                "{variant:?}"
            );
            assert!(s.client.crc32c.is_some());
            assert_eq!(s.server.crc32c, s.client.crc32c, "{variant:?} at {mtu}");
            assert_eq!((s.server.mtu, s.client.mtu), (mtu, mtu));
            println!(
                "mtu {mtu} {}: {:.2} Gbit/s",
                variant.name(),
                s.server.gbit_per_s
            );
        }
        drop(topo);
        assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
    }
}

/// Pids of the processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

fn namespaces_of(pid: u32) -> Vec<String> {
    let prefix = format!("swns{}x", pid % 10_000_000);
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn transport_bench_cleans_up_on_sigint() {
    if skip_unless_root("transport_bench_cleans_up_on_sigint") {
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_transport-bench"))
        .args([
            "--mtu",
            "1500",
            "--rounds",
            "100",
            "--seconds",
            "20",
            "--no-pin",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start transport-bench");
    let pid = child.id();
    // Wait until it runs a transfer: its namespaces exist and its peers run.
    let t0 = Instant::now();
    let (names, peers) = loop {
        let names = namespaces_of(pid);
        let peers = children_of(pid);
        if names.len() == 2 && peers.len() == 2 {
            break (names, peers);
        }
        if t0.elapsed() > Duration::from_secs(30) || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "no transfer running: namespaces {names:?}, peers {peers:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let t1 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t1.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("transport-bench still running 30 s after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        status.code(),
        Some(130),
        "{status:?} {:?}; stderr: {stderr}",
        status.signal()
    );
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
    for p in peers {
        // The peers were killed and reaped by transport-bench (a zombie would mean not).
        assert!(
            !std::path::Path::new(&format!("/proc/{p}")).exists(),
            "peer {p} survived"
        );
    }
    // Unwound in time, well before the handler's 10 s emergency cleanup.
    assert!(t1.elapsed() < Duration::from_secs(8), "{:?}", t1.elapsed());
}
