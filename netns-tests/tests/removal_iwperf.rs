//! Root-only (issue 8): `iwperf` (bench) under a device removal. A server and a client
//! run an RDMA Write bandwidth test between two namespaces; the client's TAP is deleted
//! while the client prints progress. `iwperf` must report the `DeviceRemoval`, print its
//! partial results, release everything and exit with its distinct status
//! (`bench::iwperf::EXIT_DEVICE_REMOVAL`, 5) within 2 s of the removal.
//!
//! `iwperf` is another package's binary: the test looks for it next to its own
//! executable's directory (`target/<profile>/iwperf`, built by `cargo test --workspace
//! --all-targets` as CI runs it) and skips, saying so, when it is not built.

use std::path::PathBuf;
use std::time::Duration;

use netns_tests::removal::{wait_exits, Bench, TapAction};

/// `bench::iwperf::EXIT_DEVICE_REMOVAL` (netns-tests does not depend on bench).
const EXIT_DEVICE_REMOVAL: i32 = 5;

fn iwperf() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    // target/<profile>/deps/removal_iwperf-HASH -> target/<profile>/iwperf
    let p = exe.parent()?.parent()?.join("iwperf");
    p.is_file().then_some(p)
}

#[test]
fn iwperf_reports_device_removal_with_its_own_status_within_two_seconds() {
    if !netlab::netns::is_root() {
        eprintln!(
            "skipping iwperf_reports_device_removal...: needs root (network namespaces and TAPs)"
        );
        return;
    }
    let Some(iwperf) = iwperf() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "iwperf is not built in CI"
        );
        eprintln!("skipping: iwperf not built (cargo build -p bench --bin iwperf)");
        return;
    };
    let bench = Bench::create().expect("topology");
    let names = bench.topology().namespaces();
    let (a, b) = (bench.topology().a().clone(), bench.topology().b().clone());
    let cidr = |e: &netlab::Endpoint| format!("{}/{}", e.ip, e.prefix_len);
    let mut server = bench
        .topology()
        .peer(netlab::Side::A, "iwperf-server", &iwperf)
        .args(["server", "--tap", &a.tap, "--ip", &cidr(&a)])
        .spawn()
        .expect("server");
    server
        .wait_for_line(|l| l == "READY", Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    let armed = bench.arm(false, TapAction::Delete).expect("ip");
    let mut client = bench
        .topology()
        .peer(netlab::Side::B, "iwperf-client", &iwperf)
        .args([
            "client",
            "--tap",
            &b.tap,
            "--ip",
            &cidr(&b),
            "--peer",
            &a.ip.to_string(),
        ])
        .args([
            "--op",
            "write",
            "--size",
            "65536",
            "--duration",
            "20",
            "--progress",
        ])
        .spawn()
        .expect("client");
    client
        .wait_for_line(|l| l.starts_with("PROGRESS "), Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    let (t_act, _) = armed.fire().expect("ip link del");
    let exits = wait_exits(&mut [&mut client], Duration::from_secs(20));
    drop(server);
    let out = client
        .wait(Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("{e}"));
    drop(bench);
    assert_eq!(netlab::leftover_namespaces(&names), Vec::<String>::new());
    let exit_ms = exits[0].map(|t| (t as f64 - t_act as f64) / 1e6);
    println!(
        "iwperf client: {} after {exit_ms:?} ms\n{}\n{}",
        out.status, out.stdout, out.stderr
    );
    assert_eq!(
        out.status.code(),
        Some(EXIT_DEVICE_REMOVAL),
        "{}",
        out.stderr
    );
    let ms = exit_ms.expect("exit seen");
    assert!(ms <= 2000.0, "iwperf exited {ms} ms after the removal");
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(
        all.contains("DeviceRemoval"),
        "the removal is reported: {all}"
    );
}
