//! Root-only: 64 clients (one `iwperf client` with 64 connections, all resolved,
//! connected and accepted at once) to one listener: every connection established, every
//! message of every connection received and checked, every connection torn down
//! cleanly on both sides (one `Disconnected` each, no rdma-cm id left) — perftest's
//! backlog bug was connections refused when many arrive together.

mod iwperf_support;

use std::time::Duration;

use iwperf_support::*;
use netlab::{leftover_namespaces, wait_all, Topology};

#[test]
fn sixty_four_connections_to_one_listener() {
    if skip_unless_root("sixty_four_connections_to_one_listener") {
        return;
    }
    let bin = iwperf();
    const QPS: u64 = 64;
    const ITERS: u64 = 20;
    let topo = Topology::create(1500).expect("topology");
    let names = topo.namespaces();
    let server = start_server(
        &topo,
        &bin,
        &["--json", "--timeout", "60", "--rx-depth", "16"],
    );
    let (qps, iters) = (QPS.to_string(), ITERS.to_string());
    let client = start_client(
        &topo,
        &bin,
        &[
            "--qps",
            &qps,
            "--op",
            "send",
            "--size",
            "1000",
            "--tx-depth",
            "4",
            "--iters",
            &iters,
            "--verify",
            "--json",
        ],
    );
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
