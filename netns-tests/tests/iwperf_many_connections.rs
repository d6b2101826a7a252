//! Root-only: 64 clients (one `iwperf client` with 64 connections, all resolved,
//! connected and accepted at once) to one listener: every connection established, every
//! message of every connection received and checked, every connection torn down
//! cleanly on both sides (one `Disconnected` each, no rdma-cm id left) — perftest's
//! backlog bug was connections refused when many arrive together.

mod iwperf_support;

use std::time::Duration;

use iwperf_support::*;
use netns_tests::{leftover_namespaces, wait_all, Side, Topology};

#[test]
fn sixty_four_connections_to_one_listener() {
    if skip_unless_root("sixty_four_connections_to_one_listener") {
        return;
    }
    let Some(bin) = iwperf() else { return };
    const QPS: u64 = 64;
    const ITERS: u64 = 20;
    let topo = Topology::create(1500).expect("topology");
    let names = topo.namespaces();
    let (a, b) = (topo.a().clone(), topo.b().clone());
    let mut server = topo
        .peer(Side::A, "iwperf-server", &bin)
        .arg("server")
        .args(endpoint_args(&a))
        .args(["--json", "--timeout", "60", "--rx-depth", "16"])
        .spawn()
        .expect("server");
    server
        .wait_for_line(|l| l == "READY", Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    let client = topo
        .peer(Side::B, "iwperf-client", &bin)
        .arg("client")
        .args(endpoint_args(&b))
        .args(["--peer", &a.ip.to_string()])
        .args([
            "--qps",
            &QPS.to_string(),
            "--op",
            "send",
            "--size",
            "1000",
            "--tx-depth",
            "4",
            "--iters",
            &ITERS.to_string(),
            "--verify",
            "--json",
        ])
        .spawn()
        .expect("client");
    let outs =
        wait_all(vec![server, client], Duration::from_secs(180)).unwrap_or_else(|e| panic!("{e}"));
    drop(topo);
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
    let (s, c) = (json(&outs[0]), json(&outs[1]));
    for (side, j) in [("client", &c), ("server", &s)] {
        assert_eq!(j["connections"], QPS, "{side}: {j}");
        assert_eq!(j["disconnected"], QPS, "{side}: {j}");
        assert_eq!(j["ids_leaked"], 0, "{side}: {j}");
        assert_eq!(j["exit_code"], 0, "{side}: {j}");
    }
    let bw = &c["bandwidth"][0];
    assert_eq!(bw["op"], "send", "{c}");
    assert_eq!(bw["qps"], QPS, "{c}");
    assert_eq!(bw["iterations"], QPS * ITERS, "{c}");
    assert_eq!(bw["verify"], "passed", "{c}");
    let sb = &s["bandwidth"];
    assert_eq!(sb["messages"], QPS * ITERS, "{s}");
    assert_eq!(sb["checked"], QPS * ITERS, "{s}");
    assert_eq!(sb["mismatches"], 0, "{s}");
    assert_eq!(sb["client_wrs"], QPS * ITERS, "{s}");
}
