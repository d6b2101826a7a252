//! Shared by the root-only `iwperf_*` tests: where the `iwperf` binary is, skipping
//! without root, running it under the harness's watchdog, and its JSON output.
//!
//! `iwperf` is this package's binary: cargo builds it for the tests and names it in
//! `CARGO_BIN_EXE_iwperf`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use netlab::{Peer, PeerOutput, PeerSpec, Side, Topology};

/// The `iwperf` binary cargo built for these tests.
pub fn iwperf() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_iwperf"))
}

pub use netlab::skip_unless_root;

/// Runs `iwperf ARGS` in this namespace and waits up to `timeout` (the watchdog dumps
/// its stacks and kills it then). Output is echoed (shown for failing tests).
pub fn run(bin: &PathBuf, name: &str, args: &[&str], timeout: Duration) -> PeerOutput {
    PeerSpec::new(name, bin)
        .args(args.iter().copied())
        .spawn()
        .expect("start iwperf")
        .wait(timeout)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The last stdout line of `out` that is a JSON object.
pub fn json(out: &PeerOutput) -> serde_json::Value {
    let line = out
        .stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| {
            panic!(
                "{} printed no JSON:\n{}\n{}",
                out.name, out.stdout, out.stderr
            )
        });
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON {line:?}: {e}"))
}

/// `ADDR/PREFIX` of a topology endpoint.
pub fn cidr(e: &netlab::Endpoint) -> String {
    format!("{}/{}", e.ip, e.prefix_len)
}

/// The `--tap T --ip A/P --mac M` arguments of an endpoint.
pub fn endpoint_args(e: &netlab::Endpoint) -> Vec<String> {
    e.peer_args()
}

/// Starts `iwperf server` (with `extra` arguments) in namespace A of `topo` and waits
/// for its READY line.
pub fn start_server(topo: &Topology, bin: &PathBuf, extra: &[&str]) -> Peer {
    let mut server = topo
        .peer(Side::A, "iwperf-server", bin)
        .arg("server")
        .args(endpoint_args(topo.a()))
        .args(extra.iter().copied())
        .spawn()
        .expect("server");
    server
        .wait_for_line(|l| l == "READY", Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    server
}

/// Starts `iwperf client` (with `extra` arguments) in namespace B of `topo`, aimed at
/// the server in A.
pub fn start_client(topo: &Topology, bin: &PathBuf, extra: &[&str]) -> Peer {
    topo.peer(Side::B, "iwperf-client", bin)
        .arg("client")
        .args(endpoint_args(topo.b()))
        .args(["--peer".to_owned(), topo.a().ip.to_string()])
        .args(extra.iter().copied())
        .spawn()
        .expect("client")
}

pub mod attacker;

/// Starts the legitimate client of the hostile-peer tests: `iwperf client --verify`,
/// Write and Send on two connections, 4 KiB messages, `amount` of them (`--iters N`) or
/// for `amount` seconds (`--duration N`).
pub fn start_legit_client(topo: &Topology, bin: &PathBuf, how: &str, amount: u64) -> Peer {
    let amount = amount.to_string();
    start_client(
        topo,
        bin,
        &[
            "--op",
            "write,send",
            "--qps",
            "2",
            "--size",
            "4096",
            "--tx-depth",
            "16",
            how,
            &amount,
            "--verify",
            "--json",
        ],
    )
}

/// Runs a legitimate `iwperf client --verify` (Write and Send on two connections, 4 KiB
/// messages, `iters` each) against the server in `topo`, waits for both (the server
/// serves this one test and exits), and asserts that both exited 0 with every
/// connection up and torn down and the data verified on both sides. Returns the
/// client's and the server's JSON, and the server's output.
pub fn legit_run(
    topo: &Topology,
    bin: &PathBuf,
    server: Peer,
    iters: u64,
    timeout: Duration,
) -> (serde_json::Value, serde_json::Value, PeerOutput) {
    let client = start_legit_client(topo, bin, "--iters", iters);
    let mut outs =
        netlab::wait_all(vec![server, client], timeout).unwrap_or_else(|e| panic!("{e}"));
    let (s, c) = (json(&outs[0]), json(&outs[1]));
    assert_verified(&c, &s);
    (c, s, outs.swap_remove(0))
}

/// Asserts a client's and a server's JSON of a two-connection verified bandwidth run
/// (Write and Send): both exit 0, 2 connections up and 2 disconnected, no id left,
/// every op's `verify` passed at the client, no mismatch at the server.
pub fn assert_verified(c: &serde_json::Value, s: &serde_json::Value) {
    for (side, j) in [("client", c), ("server", s)] {
        assert_eq!(j["exit_code"], 0, "{side}: {j}");
        assert_eq!(j["connections"], 2, "{side}: {j}");
        assert_eq!(j["disconnected"], 2, "{side}: {j}");
        assert_eq!(j["ids_leaked"], 0, "{side}: {j}");
    }
    let bw = c["bandwidth"].as_array().expect("client bandwidth rows");
    assert_eq!(bw.len(), 2, "{c}");
    for row in bw {
        assert_eq!(row["verify"], "passed", "{c}");
    }
    assert_eq!(s["bandwidth"]["mismatches"], 0, "{s}");
    assert_eq!(s["bandwidth"]["verify"], "passed", "{s}");
}

/// An `iwperf` side's removal line on `stderr` (`iwperf: DeviceRemoval: ...`): `n`
/// live ids, one `DeviceRemoval` each, WRs posted and every one completed or flushed,
/// none outstanding.
pub fn check_removal_line(stderr: &str, n: usize) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("iwperf: DeviceRemoval: "))
        .unwrap_or_else(|| panic!("no removal line in:\n{stderr}"));
    assert!(
        line.contains(&format!("{n} events for {n} ids ({n} live)")),
        "{line}"
    );
    assert!(line.ends_with(" 0 in error, 0 outstanding"), "{line}");
    let num = |after: &str| -> u64 {
        let i = line
            .find(after)
            .unwrap_or_else(|| panic!("{after}: {line}"));
        line[..i].rsplit(' ').next().unwrap().parse().unwrap()
    };
    // Some WRs were in flight at the removal and came back flushed.
    assert!(num(" flushed") > 0, "{line}");
    assert!(num(" sends (") > 0, "{line}");
}

/// The client's load in the removal tests: Write for long enough, progress lines to
/// know it runs, every WR signaled (`--verify`) so that the removal report can account
/// for each one.
pub const REMOVAL_LOAD: &[&str] = &[
    "--op",
    "write",
    "--size",
    "65536",
    "--duration",
    "20",
    "--progress",
    "--verify",
];

/// Once `client` runs (its first PROGRESS line), fires `armed` (the removal); returns
/// [`netlab::now_ns`] just before the removal.
pub fn remove_while_running(client: &mut Peer, armed: netlab::netns::ArmedIp) -> u64 {
    client
        .wait_for_line(|l| l.starts_with("PROGRESS "), Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    armed.fire().expect("the removal").0
}
