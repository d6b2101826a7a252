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
