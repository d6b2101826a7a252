//! `iwperf` server and client as two processes on the UDP link (`--udp`/`--udp-peer`:
//! Ethernet frames as UDP datagrams on 127.0.0.1, `softiwarp::link::UdpLink`), which
//! needs neither root nor a TAP (issue 18: "iwperf can use it too"). Write, Read and
//! Send of 64 KiB with `--verify`, every message counted on both sides; and a UDP
//! link's MTU outside what a datagram can carry is a usage error (status 2).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const ITERS: u64 = 200;

/// Two loopback UDP ports of this test (from the PID: parallel test binaries differ).
fn ports(k: u16) -> (u16, u16) {
    let base = 20_000 + (std::process::id() % 10_000) as u16 * 4 + k * 2;
    (base, base + 1)
}

fn json_of(out: &str) -> serde_json::Value {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in:\n{out}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn write_read_send_verified_over_the_udp_link_between_two_processes() {
    let iwperf = env!("CARGO_BIN_EXE_iwperf");
    for (k, op) in ["write", "read", "send"].into_iter().enumerate() {
        let (a, b) = ports(k as u16);
        let mut server = Command::new(iwperf)
            .args([
                "server",
                "--timeout",
                "60",
                "--json",
                "--ip",
                "10.77.0.1/24",
            ])
            .args(["--udp", &format!("127.0.0.1:{a}")])
            .args(["--udp-peer", &format!("127.0.0.1:{b}")])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("server");
        let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
        let ready = lines.next().and_then(Result::ok);
        assert_eq!(
            ready.as_deref(),
            Some("READY"),
            "{op}: the server's first line"
        );
        let client = Command::new(iwperf)
            .args([
                "client",
                "--json",
                "--ip",
                "10.77.0.2/24",
                "--peer",
                "10.77.0.1",
            ])
            .args(["--udp", &format!("127.0.0.1:{b}")])
            .args(["--udp-peer", &format!("127.0.0.1:{a}")])
            .args(["--op", op, "--size", "65536", "--verify"])
            .args(["--iters", &ITERS.to_string()])
            .stdin(Stdio::null())
            .output()
            .expect("client");
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let status = server.wait().expect("server exit");
        let out = String::from_utf8_lossy(&client.stdout);
        assert!(
            client.status.success(),
            "{op}: client {}\n{out}\n{}",
            client.status,
            String::from_utf8_lossy(&client.stderr)
        );
        assert!(status.success(), "{op}: server {status}");
        let r = json_of(&out);
        let row = &r["bandwidth"][0];
        assert_eq!(row["op"], op, "{r}");
        assert_eq!(row["iterations"], ITERS, "{r}");
        assert_eq!(row["verify"], "passed", "{r}");
        assert_eq!(row["mismatches"], 0, "{r}");
        let s = json_of(&rest.join("\n"));
        assert_eq!(s["connections"], 1, "{s}");
        assert_eq!(s["bandwidth"]["client_wrs"], ITERS, "{s}");
        if op != "read" {
            assert_eq!(s["bandwidth"]["verify"], "passed", "{s}");
        }
    }
}

#[test]
fn a_udp_mtu_beyond_a_datagram_is_a_usage_error() {
    let o = Command::new(env!("CARGO_BIN_EXE_iwperf"))
        .args(["server", "--ip", "10.77.0.1/24", "--udp", "127.0.0.1:9"])
        .args(["--udp-peer", "127.0.0.1:10", "--mtu", "70000"])
        .output()
        .expect("iwperf");
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--mtu 70000 on a UDP link"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
