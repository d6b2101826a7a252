//! `iwperf` server and client as two processes on the UDP link (`--udp`/`--udp-peer`:
//! Ethernet frames as UDP datagrams on 127.0.0.1, `softiwarp::link::UdpLink`), which
//! needs neither root nor a TAP. Write, Read and
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

/// `iwperf ROLE` on one end of the UDP link of ports `ports(k)` (the server on the
/// first, the client on the second), with its address, piped.
fn side(k: u16, role: &str) -> Command {
    let (a, b) = ports(k);
    let (local, peer, ip) = if role == "server" {
        (a, b, "10.77.0.1/24")
    } else {
        (b, a, "10.77.0.2/24")
    };
    let mut c = Command::new(env!("CARGO_BIN_EXE_iwperf"));
    c.args([role, "--ip", ip])
        .args(["--udp", &format!("127.0.0.1:{local}")])
        .args(["--udp-peer", &format!("127.0.0.1:{peer}")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if role == "client" {
        c.args(["--peer", "10.77.0.1"]);
    }
    c
}

/// Starts the server of link `k` with `extra` options and waits for its READY; the
/// process and the rest of its stdout.
fn server(
    k: u16,
    extra: &[&str],
) -> (
    std::process::Child,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let mut server = side(k, "server")
        .args(["--timeout", "60"])
        .args(extra)
        .spawn()
        .expect("server");
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let ready = lines.next().and_then(Result::ok);
    assert_eq!(ready.as_deref(), Some("READY"), "the server's first line");
    (server, lines)
}

#[test]
fn write_read_send_verified_over_the_udp_link_between_two_processes() {
    for (k, op) in ["write", "read", "send"].into_iter().enumerate() {
        let (mut server, lines) = server(k as u16, &["--json"]);
        let client = side(k as u16, "client")
            .args(["--json", "--op", op, "--size", "65536", "--verify"])
            .args(["--iters", &ITERS.to_string()])
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

/// A server and a client on the UDP link, the client writing for `secs` seconds with
/// progress lines; (server, client). Ports from `k` as [`ports`].
fn write_pair(k: u16, secs: &str) -> (std::process::Child, std::process::Child) {
    let (server, lines) = server(k, &[]);
    let mut client = side(k, "client")
        .args([
            "--op",
            "write",
            "--size",
            "65536",
            "--duration",
            secs,
            "--progress",
        ])
        .spawn()
        .expect("client");
    let mut out = BufReader::new(client.stdout.take().unwrap()).lines();
    // Running once it reports progress.
    assert!(out.any(|l| l.is_ok_and(|l| l.starts_with("PROGRESS "))));
    std::thread::spawn(move || out.for_each(drop));
    std::thread::spawn(move || lines.for_each(drop));
    (server, client)
}

/// Waits up to `limit` for `c` to exit; its status, or it is killed and the test fails.
fn exit_within(c: &mut std::process::Child, limit: std::time::Duration, what: &str) -> i32 {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s.code().unwrap_or(-1);
        }
        if t0.elapsed() > limit {
            let _ = c.kill();
            panic!("{what} did not exit within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn sigint_ends_a_client_with_status_130_and_its_server_sees_the_end() {
    let (mut server, mut client) = write_pair(3, "30");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(client.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    let c = exit_within(&mut client, std::time::Duration::from_secs(10), "client");
    assert_eq!(c, 130, "the client's status after SIGINT");
    // The client disconnected on its way out: the server ends too, not at its timeout.
    let s = exit_within(&mut server, std::time::Duration::from_secs(10), "server");
    assert_eq!(s, 3, "the server's status (its client went away mid-run)");
    assert!(t0.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn a_server_killed_outright_ends_its_client_by_the_stall_limit() {
    let (mut server, mut client) = write_pair(4, "300");
    // SIGKILL: no FIN, no RST; the client's transport retransmits into the void.
    server.kill().unwrap();
    let _ = server.wait();
    let limit = bench::iwperf::datapath::STALL_LIMIT + std::time::Duration::from_secs(15);
    let c = exit_within(&mut client, limit, "client");
    let mut err = String::new();
    std::io::Read::read_to_string(client.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(c, 3, "{err}");
    assert!(
        err.contains("no completion in 30 s") || err.contains("connection"),
        "{err}"
    );
}

#[test]
fn soft_device_options_with_device_are_a_usage_error() {
    let o = Command::new(env!("CARGO_BIN_EXE_iwperf"))
        .args(["client", "--device", "siw0", "--peer", "10.0.0.1"])
        .args([
            "--mpa-rev",
            "1",
            "--markers",
            "on",
            "--first-fpdu-delay-ms",
            "0",
        ])
        .output()
        .expect("iwperf");
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.trim(),
        "iwperf: usage: --markers, --mpa-rev, --first-fpdu-delay-ms set(s) the soft device only; with --device the kernel driver decides"
    );
}
