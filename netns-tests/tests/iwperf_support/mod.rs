//! Shared by the root-only `iwperf_*` tests: where the `iwperf` binary is, skipping
//! without root, running it under the harness's watchdog, and its JSON output.
//!
//! `iwperf` is the bench package's binary: it is looked for next to the test
//! executable's directory (`target/<profile>/iwperf`, built by `cargo build --workspace
//! --all-targets` / `cargo test --workspace --all-targets` as CI runs them), or at
//! `$IWPERF_BIN`. Without it a test skips, saying so, except in CI (`CI` set), where it
//! fails.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use netlab::{Peer, PeerOutput, PeerSpec, Side, Topology};

/// The `iwperf` binary, or `None` (with a note) when it is not built outside CI.
pub fn iwperf() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("IWPERF_BIN") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    // target/<profile>/deps/iwperf_x-HASH -> target/<profile>/iwperf
    let p = exe.parent()?.parent()?.join("iwperf");
    if p.is_file() {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "iwperf is not built ({}): CI builds every target first",
        p.display()
    );
    eprintln!("skipping: iwperf not built (cargo build -p bench --bin iwperf)");
    None
}

/// `true` (and a note) when not root: the test then returns at once.
pub fn skip_unless_root(test: &str) -> bool {
    if netlab::netns::is_root() {
        return false;
    }
    eprintln!("skipping {test}: needs root (network namespaces and TAPs)");
    true
}

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
