//! Root-only: `iwperf` (bench) under a device removal. A server and a client
//! run an RDMA Write bandwidth test between two namespaces; the client's TAP is deleted
//! while the client prints progress. `iwperf` must report the `DeviceRemoval`, print its
//! partial results, release everything and exit with its distinct status
//! (`bench::iwperf::EXIT_DEVICE_REMOVAL`, 5) within 2 s of the removal.

mod iwperf_support;

use std::time::Duration;

use bench::iwperf::EXIT_DEVICE_REMOVAL;
use iwperf_support::{check_removal_line, remove_while_running, skip_unless_root, REMOVAL_LOAD};
use netlab::netns::ArmedIp;
use netlab::{wait_exits, Topology};

#[test]
fn iwperf_reports_device_removal_with_its_own_status_within_two_seconds() {
    if skip_unless_root("iwperf_reports_device_removal_with_its_own_status_within_two_seconds") {
        return;
    }
    let iwperf = env!("CARGO_BIN_EXE_iwperf");
    let topo = Topology::create(1500).expect("topology");
    let names = topo.namespaces();
    let (a, b) = (topo.a().clone(), topo.b().clone());
    let cidr = |e: &netlab::Endpoint| format!("{}/{}", e.ip, e.prefix_len);
    let mut server = topo
        .peer(netlab::Side::A, "iwperf-server", iwperf)
        .args(["server", "--tap", &a.tap, "--ip", &cidr(&a)])
        .spawn()
        .expect("server");
    server
        .wait_for_line(|l| l == "READY", Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    let armed = ArmedIp::arm(&b.netns, &format!("link del {}", b.tap)).expect("ip");
    let mut client = topo
        .peer(netlab::Side::B, "iwperf-client", iwperf)
        .args([
            "client",
            "--tap",
            &b.tap,
            "--ip",
            &cidr(&b),
            "--peer",
            &a.ip.to_string(),
        ])
        .args(REMOVAL_LOAD.iter().copied())
        .spawn()
        .expect("client");
    let t_act = remove_while_running(&mut client, armed);
    let exits = wait_exits(&mut [&mut client], Duration::from_secs(20));
    drop(server);
    let out = client
        .wait(Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("{e}"));
    drop(topo);
    assert_eq!(netlab::leftover_namespaces(&names), Vec::<String>::new());
    let exit_ms = exits[0].map(|t| (t as f64 - t_act as f64) / 1e6);
    println!(
        "iwperf client: {} after {exit_ms:?} ms\n{}\n{}",
        out.status, out.stdout, out.stderr
    );
    assert_eq!(
        out.status.code(),
        Some(i32::from(EXIT_DEVICE_REMOVAL)),
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
    check_removal_line(&out.stderr, 1);
}
