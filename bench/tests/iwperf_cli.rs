//! `iwperf` without privileges: the demo over the in-memory link (`--memory`, what a
//! non-root user gets) with every operation verified, and the exit statuses of usage
//! and setup errors. Short runs: a few seconds in all.

use std::process::{Command, Output};

fn iwperf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iwperf"))
        .args(args)
        .output()
        .expect("run iwperf")
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn memory_demo_json_every_op_verified() {
    let o = iwperf(&[
        "demo",
        "--memory",
        "--json",
        "--mtu",
        "9000",
        "--duration",
        "0.3",
        "--verify",
        "--lat-iters",
        "200",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let line = stdout.lines().last().expect("a JSON line");
    let j: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(j["link"], "memory", "{j}");
    assert_eq!(j["mtu"], 9000);
    assert_eq!(j["namespaces"], serde_json::json!([]));
    assert!(j["baseline_tcp_gbps"].as_f64().unwrap() > 0.0, "{j}");
    let results = j["results"].as_array().unwrap();
    let ops: Vec<&str> = results.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["write", "read", "send"]);
    for r in results {
        assert!(r["gbps"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["verify"], "passed", "{r}");
        // No CPU-normalized ratio in one process.
        assert!(r["cpu_ratio"].is_null(), "{r}");
    }
    assert_eq!(j["latency_us"]["iterations"], 200, "{j}");
    assert!(j["latency_us"]["t_typical"].as_f64().unwrap() > 0.0, "{j}");
}

#[test]
fn memory_demo_table_and_one_line_note() {
    let o = iwperf(&[
        "demo",
        "--memory",
        "--op",
        "write",
        "--duration",
        "0.2",
        "--no-lat",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("| op    |    size | Gbit/s |"), "{out}");
    assert!(out.contains("| write |   65536 |"), "{out}");
    assert!(out.contains("an in-memory link in one process"), "{out}");
}

#[test]
fn usage_and_setup_errors_have_their_statuses() {
    // Usage: clap's own errors and our checks are 2.
    for args in [
        &[
            "client",
            "--tap",
            "t",
            "--ip",
            "10.0.0.2/24",
            "--peer",
            "10.0.0.1",
            "--op",
            "atomic",
        ][..],
        &[
            "client",
            "--tap",
            "t",
            "--ip",
            "10.0.0.2/24",
            "--peer",
            "10.0.0.1",
            "--lat",
            "--qps",
            "2",
        ],
        &[
            "client", "--tap", "t", "--ip", "10.0.0.2", "--peer", "10.0.0.1",
        ],
        &["demo", "--memory", "--rounds", "0"],
        &[
            "server",
            "--mpa-rev",
            "3",
            "--tap",
            "t",
            "--ip",
            "10.0.0.1/24",
        ],
        &["frobnicate"],
    ] {
        let o = iwperf(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
    }
    // A TAP that does not exist (or no permission to open one): setup failure, 1.
    let o = iwperf(&[
        "client",
        "--tap",
        "iwpnosuchtap0",
        "--ip",
        "10.0.0.2/24",
        "--peer",
        "10.0.0.1",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("iwpnosuchtap0"),
        "{}",
        text(&o)
    );
}

/// The one line iwperf must print for `--device nosuch` on this machine: the missing
/// library's, or the device list's (as the cxgb4 crate words them).
fn no_device_line() -> String {
    let msg = match cxgb4::RdmaCore::load() {
        Err(e) => cxgb4::Error::from(e).to_string(),
        Ok(core) => {
            let core = std::sync::Arc::new(core);
            match cxgb4::Context::open(&core, "nosuch") {
                Err(e) => e.to_string(),
                Ok(_) => panic!("this machine has an RDMA device named 'nosuch'"),
            }
        }
    };
    assert!(
        msg.starts_with("no RDMA device named 'nosuch' (found: ")
            || msg.starts_with("rdma-core (lib"),
        "{msg}"
    );
    format!("iwperf: {msg}\n")
}

#[test]
fn a_device_that_does_not_exist_is_one_line_and_status_3() {
    let want = no_device_line();
    for args in [
        &["server", "--device", "nosuch"][..],
        &[
            "server", "--device", "nosuch", "--bind", "10.9.9.9", "--port", "7999",
        ][..],
        &[
            "client", "--device", "nosuch", "--peer", "10.9.9.9", "--op", "read",
        ][..],
    ] {
        let o = iwperf(args);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {}", text(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stderr),
            want,
            "{args:?}: {}",
            text(&o)
        );
    }
}

#[test]
fn device_and_tap_options_exclude_each_other() {
    for args in [
        // --device with the soft device's link options.
        &["server", "--device", "siw0", "--tap", "tap0"][..],
        &[
            "client",
            "--device",
            "siw0",
            "--ip",
            "10.0.0.1/24",
            "--peer",
            "10.0.0.2",
        ][..],
        // --bind only goes with --device; neither --tap/--ip nor --device.
        &[
            "server",
            "--tap",
            "tap0",
            "--ip",
            "10.0.0.1/24",
            "--bind",
            "10.0.0.1",
        ][..],
        &["server"][..],
    ] {
        let o = iwperf(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
    }
}

/// A run length that is not a finite number of seconds in (0, one year] is a usage error
/// (status 2, one line naming the value), never a panic: `--duration 1e300` used to panic
/// turning it into a `Duration`.
#[test]
fn a_duration_out_of_range_is_a_usage_error_not_a_panic() {
    for d in ["1e300", "inf", "nan", "0", "-1", "1e20", "soon"] {
        for args in [
            vec!["client", "--peer", "10.0.0.1", "--device", "nosuch"],
            vec!["demo", "--memory"],
        ] {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_iwperf"))
                .args(&args)
                .arg(format!("--duration={d}"))
                .output()
                .expect("run iwperf");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?} --duration={d}: {err}");
            assert!(!err.contains("panicked"), "{args:?} --duration={d}: {err}");
            assert!(err.contains("--duration"), "{args:?} --duration={d}: {err}");
        }
    }
}
