//! Root-only: `iwperf` server and client in two namespaces with eight QPs, RDMA Write
//! and RDMA Read at once (QPs alternate), every byte checked (`--verify`: the server
//! checks each slot's last Write, the client each Read against the server's patterns);
//! and a client whose connection is refused exits with the connection-failure status.

mod iwperf_support;

use std::time::Duration;

use iwperf_support::*;
use netlab::{leftover_namespaces, wait_all, Topology};

#[test]
fn eight_qps_write_and_read_at_once_verified() {
    if skip_unless_root("eight_qps_write_and_read_at_once_verified") {
        return;
    }
    let bin = iwperf();
    let topo = Topology::create(9000).expect("topology");
    let names = topo.namespaces();
    let server = start_server(&topo, &bin, &["--json", "--timeout", "60"]);
    let client = start_client(
        &topo,
        &bin,
        &[
            "--qps",
            "8",
            "--op",
            "write,read",
            "--size",
            "20000",
            "--tx-depth",
            "16",
            "--duration",
            "0.5",
            "--verify",
            "--json",
        ],
    );
    let outs =
        wait_all(vec![server, client], Duration::from_secs(120)).unwrap_or_else(|e| panic!("{e}"));
    drop(topo);
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
    let (s, c) = (json(&outs[0]), json(&outs[1]));
    assert_eq!(c["connections"], 8, "{c}");
    assert_eq!(c["disconnected"], 8, "{c}");
    assert_eq!(c["ids_leaked"], 0, "{c}");
    assert_eq!(c["exit_code"], 0, "{c}");
    let bw = c["bandwidth"].as_array().expect("bandwidth");
    assert_eq!(bw.len(), 2, "{c}");
    for (r, op) in bw.iter().zip(["write", "read"]) {
        assert_eq!(r["op"], op, "{r}");
        assert_eq!(r["qps"], 4, "{r}");
        assert_eq!(r["verify"], "passed", "{r}");
        assert_eq!(r["mismatches"], 0, "{r}");
        assert_eq!(r["partial"], false, "{r}");
        let iters = r["iterations"].as_u64().unwrap();
        assert!(iters > 4 * 16, "{r}");
        assert_eq!(r["bytes"].as_u64().unwrap(), iters * 20000, "{r}");
    }
    assert_eq!(s["connections"], 8, "{s}");
    assert_eq!(s["disconnected"], 8, "{s}");
    assert_eq!(s["ids_leaked"], 0, "{s}");
    let sb = &s["bandwidth"];
    assert_eq!(sb["verify"], "passed", "{s}");
    assert_eq!(sb["mismatches"], 0, "{s}");
    // The server checked all 16 slots of each Write QP (more Writes than slots ran).
    assert_eq!(sb["checked"], 4 * 16, "{s}");
    // The clients' WR counts reached the server in their Done messages.
    let client_wrs: u64 = bw.iter().map(|r| r["iterations"].as_u64().unwrap()).sum();
    assert_eq!(sb["client_wrs"].as_u64().unwrap(), client_wrs, "{s}");
}

#[test]
fn a_refused_connection_exits_with_the_connection_status() {
    if skip_unless_root("a_refused_connection_exits_with_the_connection_status") {
        return;
    }
    let bin = iwperf();
    let topo = Topology::create(1500).expect("topology");
    // A server on another port answers ARP; the client's SYN gets a RST.
    let server = start_server(&topo, &bin, &["--port", "18600", "--timeout", "20"]);
    let client = start_client(&topo, &bin, &["--port", "18601", "--json"])
        .wait(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    drop(server);
    assert_eq!(
        client.status.code(),
        Some(3),
        "{}\n{}",
        client.stdout,
        client.stderr
    );
    let c = json(&client);
    assert_eq!(c["exit_code"], 3, "{c}");
    assert_eq!(c["connections"], 0, "{c}");
    let err = c["error"].as_str().unwrap();
    assert!(err.contains("REJECTED"), "{err}");
}
