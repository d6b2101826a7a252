//! Root-only: `iwperf demo --json` as README runs it, short: two namespaces with a TAP
//! each, the raw TCP baseline, iWARP Write, Read and Send with `--verify`, the latency
//! pair, the same on the host's kernel TCP (`--netdev`) against kernel TCP, and a
//! capture of every TAP iWARP run. Checks: exit 0; the kernel TCP (veth)
//! reference measured and the TAP offload on; every operation present, on the TAPs and
//! on host TCP, with Gbit/s > 0 and verify `passed`; both latency rows, the host-TCP
//! one against kernel TCP ping-pong; nothing left behind (the
//! namespaces it reports, and no TAP, bridge or veth of its naming scheme anywhere);
//! every capture decodes with `iwdump` with zero errors and holds the run's MPA
//! connection and its FPDUs.

mod iwperf_support;

use std::time::Duration;

use iwperf_support::*;
use netlab::leftover_namespaces;

/// Interfaces in this (the root) namespace whose names use the harness's scheme
/// (`swt`/`swb`/`swv` + the pid of `pid`'s tag).
fn interfaces_of(pid: u32) -> Vec<String> {
    let out = netlab::netns::ip_output(&["-o", "link", "show"]).expect("ip link");
    let tag = format!("{pid}x");
    out.lines()
        .filter_map(|l| l.split(':').nth(1).map(|n| n.trim().to_owned()))
        .filter(|n| {
            ["swt", "swb", "swv"]
                .iter()
                .any(|p| n.starts_with(&format!("{p}{tag}")))
        })
        .collect()
}

#[test]
fn demo_json_verified_clean_and_its_captures_decode() {
    if skip_unless_root("demo_json_verified_clean_and_its_captures_decode") {
        return;
    }
    let bin = iwperf();
    let dir =
        TempDir(std::env::temp_dir().join(format!("iwperf-demo-test-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let prefix = dir.0.join("run");
    let prefix_s = prefix.display().to_string();
    let out = run(
        &bin,
        "iwperf demo",
        &[
            "demo",
            "--json",
            "--duration",
            "0.5",
            "--verify",
            "--lat-iters",
            "300",
            "--pcap",
            &prefix_s,
            "--pcap-limit",
            "3000000",
        ],
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "iwperf demo failed ({}):\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    let j = json(&out);
    assert_eq!(j["link"], "tap", "{j}");
    assert_eq!(j["mtu"], 65000);
    assert!(j["baseline_tcp_gbps"].as_f64().unwrap() > 0.0, "{j}");
    // The absolute reference (kernel TCP over the veth), and the TAP offload on by default.
    assert!(j["kernel_tcp_gbps"].as_f64().unwrap() > 0.0, "{j}");
    assert_eq!(j["offload"], true, "{j}");
    let results = j["results"].as_array().expect("results");
    let ops: Vec<&str> = results.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["write", "read", "send"], "{j}");
    for r in results {
        assert!(r["gbps"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["mpps"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["size"], 65536, "{r}");
        assert_eq!(r["verify"], "passed", "{r}");
        assert!(r["ratio"].as_f64().unwrap() > 0.0, "{r}");
    }
    let lat = &j["latency_us"];
    assert_eq!(lat["op"], "send", "{j}");
    assert_eq!(lat["size"], 8);
    assert_eq!(lat["iterations"], 300);
    let (t_min, t_typ, t_max) = (
        lat["t_min"].as_f64().unwrap(),
        lat["t_typical"].as_f64().unwrap(),
        lat["t_max"].as_f64().unwrap(),
    );
    assert!(0.0 < t_min && t_min <= t_typ && t_typ <= t_max, "{lat}");
    assert!(lat["baseline_tcp_typical"].as_f64().unwrap() > 0.0, "{lat}");

    // The host-TCP rows: the same operations, against kernel TCP over the same veth.
    let host = &j["host_tcp"];
    let rows = host["results"].as_array().expect("host_tcp results");
    let ops: Vec<&str> = rows.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["write", "read", "send"], "{host}");
    for r in rows {
        assert!(r["gbps"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["verify"], "passed", "{r}");
        assert_eq!(r["baseline_gbps"], j["kernel_tcp_gbps"], "{r}");
        assert!(r["ratio"].as_f64().unwrap() > 0.0, "{r}");
    }
    let hl = &host["latency_us"];
    assert_eq!(hl["size"], 8, "{host}");
    assert_eq!(hl["iterations"], 300, "{host}");
    assert!(hl["t_typical"].as_f64().unwrap() > 0.0, "{hl}");
    assert!(hl["baseline_tcp_typical"].as_f64().unwrap() > 0.0, "{hl}");

    nothing_left(&j);

    // Every capture decodes cleanly and holds the run.
    let pcaps: Vec<String> = j["pcaps"]
        .as_array()
        .expect("pcaps")
        .iter()
        .map(|p| p.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(pcaps.len(), 3, "{j}");
    for (p, op) in pcaps.iter().zip(["Write", "ReadResponse", "Send"]) {
        let report = iwdump::dissect_file(p).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert!(
            report.errors.is_empty(),
            "{p}: iwdump errors: {:?}",
            &report.errors[..report.errors.len().min(5)]
        );
        assert_eq!(report.connections.len(), 1, "{p}: {:?}", report.connections);
        assert!(report.fpdus > 20, "{p}: {} FPDUs", report.fpdus);
        assert!(
            report.opcodes.get(op).copied().unwrap_or(0) > 0,
            "{p}: no {op} FPDUs: {:?}",
            report.opcodes
        );
    }
}

/// A directory removed when dropped (also when the test fails).
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The pid in the harness's namespace names (`swns<pid>x<n>a`).
fn out_pid(names: &[String]) -> u32 {
    names[0]
        .strip_prefix("swns")
        .and_then(|r| r.split_once('x'))
        .and_then(|(p, _)| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected namespace name {}", names[0]))
}

/// `--transport host-tcp`: the host-TCP rows alone, over one veth between two namespaces
/// (`--netdev` on its ends) against kernel TCP between the same ends; no TAP rows.
#[test]
fn demo_host_tcp_alone_runs_over_one_veth_and_leaves_nothing() {
    if skip_unless_root("demo_host_tcp_alone_runs_over_one_veth_and_leaves_nothing") {
        return;
    }
    let out = run(
        &iwperf(),
        "iwperf demo",
        &[
            "demo",
            "--json",
            "--transport",
            "host-tcp",
            "--duration",
            "0.3",
            "--verify",
            "--lat-iters",
            "200",
        ],
        Duration::from_secs(300),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let j = json(&out);
    assert_eq!(j["link"], "veth", "{j}");
    assert_eq!(j["results"], serde_json::json!([]), "{j}");
    assert!(j["latency_us"].is_null(), "{j}");
    assert!(j["kernel_tcp_gbps"].as_f64().unwrap() > 0.0, "{j}");
    let rows = j["host_tcp"]["results"].as_array().expect("host rows");
    assert_eq!(rows.len(), 3, "{j}");
    for r in rows {
        assert!(r["gbps"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["verify"], "passed", "{r}");
    }
    assert_eq!(j["host_tcp"]["latency_us"]["iterations"], 200, "{j}");
    nothing_left(&j);
}

/// Nothing of a demo is left behind: the two namespaces its JSON names, and no TAP,
/// bridge or veth of its naming scheme anywhere.
fn nothing_left(j: &serde_json::Value) {
    let names: Vec<String> = j["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names.len(), 2, "{j}");
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
    assert_eq!(interfaces_of(out_pid(&names)), Vec::<String>::new());
}
