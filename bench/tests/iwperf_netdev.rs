//! `iwperf --netdev IF`: the soft device on the host's kernel TCP, bound to a host
//! interface (`softiwarp::LinkConfig::netdev`, design.md section 4.1).
//!
//! Unprivileged, on `lo`: server and client as two processes, Write, Read and Send of
//! 64 KiB with `--verify` for a short time, the client's result lines (a row with
//! iterations and a non-zero rate, `verify passed`) and the server's (it serves one test
//! and exits 0); the options that do not go with `--netdev` and an interface that does
//! not exist are one-line errors with their statuses.
//!
//! Root-only, two namespaces joined by one veth with the kernel's addresses on its ends
//! ([`netlab::VethPair`], removed also on failure): a verified Write run over the veth;
//! and the veth deleted (`ip link del`) under a verified Write load: client and server
//! report the `DeviceRemoval` with their status 5 within 1 s, every WR of the client
//! completed or flushed (its ledger line, as `iwperf_device_removal.rs` checks it for a
//! TAP), the device's threads and fds gone before exit.

mod iwperf_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use bench::iwperf::EXIT_DEVICE_REMOVAL;
use iwperf_support::*;
use netlab::netns::ArmedIp;
use netlab::{wait_exits, Side, VethPair};

/// A kernel TCP port free on 127.0.0.1 right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn lo_side(role: &str, port: u16) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_iwperf"));
    c.args([role, "--netdev", "lo", "--port", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The row of a bandwidth table under its header: (iterations, average Gbit/s).
fn bw_row(out: &str) -> (u64, f64) {
    let mut lines = out.lines().skip_while(|l| !l.contains("#iterations"));
    let row = lines
        .nth(1)
        .unwrap_or_else(|| panic!("no result row in:\n{out}"));
    let f: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(f.len(), 5, "{row}");
    assert_eq!(f[0], "65536", "{row}");
    (f[1].parse().unwrap(), f[3].parse().unwrap())
}

#[test]
fn write_read_send_verified_over_kernel_tcp_on_lo() {
    for op in ["write", "read", "send"] {
        let port = free_port();
        let mut server = lo_side("server", port).spawn().expect("server");
        let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
        assert_eq!(
            lines.next().and_then(Result::ok).as_deref(),
            Some("READY"),
            "{op}: the server's first line"
        );
        let listening = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(
            listening,
            format!("iwperf server listening on port {port} of lo (127.0.0.1/8), kernel TCP")
        );
        let client = lo_side("client", port)
            .args(["--peer", "127.0.0.1", "--op", op, "--size", "65536"])
            .args(["--duration", "0.5", "--verify"])
            .output()
            .expect("client");
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let status = server.wait().expect("server exit");
        let out = String::from_utf8_lossy(&client.stdout);
        let err = String::from_utf8_lossy(&client.stderr);
        assert!(
            client.status.success(),
            "{op}: {}\n{out}\n{err}",
            client.status
        );
        assert!(
            out.starts_with(&format!(
                "iwperf: {op} bandwidth test to 127.0.0.1:{port} (1 QP(s), 65536 bytes, tx depth 128, kernel TCP on lo, MPA CRC on"
            )),
            "{out}"
        );
        let (iters, gbps) = bw_row(&out);
        assert!(iters > 0 && gbps > 0.0, "{op}: {out}");
        assert!(
            out.contains(&format!(" {op}: verify passed")),
            "{op}: {out}"
        );
        // The server serves the one test and exits 0, saying what it served.
        assert!(status.success(), "{op}: server {status}");
        let served = rest
            .iter()
            .find(|l| l.starts_with("served 1 connection(s): "))
            .unwrap_or_else(|| panic!("{op}: no served line in {rest:?}"));
        assert!(
            served.contains(&format!("{iters} WRs reported by the client")),
            "{op}: {served}"
        );
        if op != "read" {
            assert!(served.contains("verify passed"), "{op}: {served}");
        }
    }
}

fn iwperf_err(args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_iwperf"))
        .args(args)
        .output()
        .expect("iwperf");
    assert!(o.stdout.is_empty(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "{err}");
    (o.status.code(), err)
}

#[test]
fn netdev_errors_say_what_went_wrong() {
    let (code, err) = iwperf_err(&["server", "--netdev", "nosuchif9"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.starts_with("iwperf: no interface named 'nosuchif9' (found: "),
        "{err}"
    );
    assert!(err.contains("lo"), "{err}");
    let cases: &[(&[&str], &str)] = &[
        (
            &["--pcap", "/tmp/x.pcap"],
            "iwperf: usage: --pcap captures a TAP or UDP link's frames; a --netdev device's traffic is the kernel's TCP on lo: capture with tcpdump -i lo",
        ),
        (
            &["--tap", "tap0"],
            "iwperf: usage: --netdev lo and --tap name two different links: give one",
        ),
        (
            &["--udp", "127.0.0.1:9", "--udp-peer", "127.0.0.1:10"],
            "iwperf: usage: --netdev lo and --udp name two different links: give one",
        ),
        (
            &["--device", "siw0"],
            "iwperf: usage: --netdev lo and --device name two different links: give one",
        ),
        (&["--ip", "10.0.0.1/24"], "iwperf: usage: --ip sets the address"),
        (&["--mac", "02:00:00:00:00:01"], "iwperf: usage: --mac sets the address"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["client", "--netdev", "lo", "--peer", "127.0.0.1"];
        args.extend_from_slice(extra);
        let (code, err) = iwperf_err(&args);
        assert_eq!(code, Some(2), "{extra:?}: {err}");
        assert!(err.starts_with(want), "{extra:?}: {err}");
    }
}

/// (server, client) `iwperf --netdev` peers on the two veth ends of `pair`; the client
/// runs `client_args` after its `--peer`.
fn veth_pair_peers(pair: &VethPair, client_args: &[&str]) -> (netlab::Peer, netlab::Peer) {
    let bin = iwperf();
    let mut server = pair
        .peer(Side::A, "iwperf-server", &bin)
        .args(["server", "--netdev", pair.veth(Side::A)])
        .spawn()
        .expect("server");
    server
        .wait_for_line(|l| l == "READY", Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    let client = pair
        .peer(Side::B, "iwperf-client", &bin)
        .args(["client", "--netdev", pair.veth(Side::B)])
        .args(["--peer".to_owned(), pair.ip(Side::A).to_string()])
        .args(client_args.iter().copied())
        .spawn()
        .expect("client");
    (server, client)
}

#[test]
fn netdev_over_a_veth_between_two_namespaces() {
    if skip_unless_root("netdev_over_a_veth_between_two_namespaces") {
        return;
    }
    let pair = VethPair::create(1500).expect("veth pair");
    let names = pair.namespaces();
    let veth_a = pair.veth(Side::A).to_owned();
    let (server, client) =
        veth_pair_peers(&pair, &["--op", "write", "--duration", "0.5", "--verify"]);
    let out = client
        .wait(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    let sout = server
        .wait(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    drop(pair);
    assert_eq!(netlab::leftover_namespaces(&names), Vec::<String>::new());
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(sout.status.success(), "{}\n{}", sout.stdout, sout.stderr);
    let (iters, gbps) = bw_row(&out.stdout);
    assert!(iters > 0 && gbps > 0.0, "{}", out.stdout);
    assert!(
        out.stdout.contains(" write: verify passed"),
        "{}",
        out.stdout
    );
    assert!(
        sout.stdout.contains(&format!(
            "listening on port 18515 of {veth_a} (10.234.0.1/24), kernel TCP"
        )),
        "{}",
        sout.stdout
    );
}

#[test]
fn deleting_the_veth_ends_a_netdev_run_with_device_removal_within_one_second() {
    if skip_unless_root("deleting_the_veth_ends_a_netdev_run_with_device_removal_within_one_second")
    {
        return;
    }
    let pair = VethPair::create(1500).expect("veth pair");
    let names = pair.namespaces();
    let b = pair.netns(Side::B).name().to_owned();
    let armed = ArmedIp::arm(&b, &format!("link del {}", pair.veth(Side::B))).expect("ip");
    let (mut server, mut client) = veth_pair_peers(&pair, REMOVAL_LOAD);
    let t_act = remove_while_running(&mut client, armed);
    let exits = wait_exits(&mut [&mut client, &mut server], Duration::from_secs(20));
    let out = client
        .wait(Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("{e}"));
    let sout = server
        .wait(Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("{e}"));
    drop(pair);
    assert_eq!(netlab::leftover_namespaces(&names), Vec::<String>::new());
    let ms: Vec<Option<f64>> = exits
        .iter()
        .map(|e| e.map(|t| (t as f64 - t_act as f64) / 1e6))
        .collect();
    println!(
        "iwperf client: {} after {:?} ms\n{}\n{}\niwperf server: {} after {:?} ms\n{}\n{}",
        out.status, ms[0], out.stdout, out.stderr, sout.status, ms[1], sout.stdout, sout.stderr
    );
    for (o, ms, who) in [(&out, ms[0], "client"), (&sout, ms[1], "server")] {
        assert_eq!(
            o.status.code(),
            Some(i32::from(EXIT_DEVICE_REMOVAL)),
            "{who}: {}",
            o.stderr
        );
        let ms = ms.unwrap_or_else(|| panic!("{who}: exit not seen"));
        assert!(ms <= 1000.0, "{who} exited {ms} ms after the removal");
        assert!(
            o.stderr
                .lines()
                .any(|l| l == "iwperf: device closed: no thread or fd left"),
            "{who}: {}",
            o.stderr
        );
    }
    // The client: one live id, one DeviceRemoval; every WR completed or flushed.
    check_removal_line(&out.stderr, 1);
}

/// CPU ticks (user + system) the process `pid` used so far (`/proc/PID/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the comm.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// A server that runs out of file descriptors while connections keep coming (a peer
/// opening more than `ulimit -n` allows) does not spin on its listening socket: under
/// 25% of a CPU while the connections wait (it spun at about 80% when the listener was
/// level-triggered), and once they go a legitimate client is served.
#[test]
fn a_server_out_of_file_descriptors_does_not_spin_and_serves_on() {
    let port = free_port();
    let iwperf = env!("CARGO_BIN_EXE_iwperf");
    let mut server = Command::new("bash")
        .args([
            "-c",
            &format!("ulimit -n 40; exec {iwperf} server --netdev lo --port {port} --timeout 60"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("server");
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("READY"));
    let pid = server.id();
    let hogs: Vec<std::net::TcpStream> = (0..60)
        .filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    assert!(hogs.len() >= 40, "only {} connections made", hogs.len());
    std::thread::sleep(Duration::from_millis(300));
    let hz = 100.0; // USER_HZ on Linux
    let (t0, w0) = (cpu_ticks(pid), std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let share = (cpu_ticks(pid) - t0) as f64 / hz / w0.elapsed().as_secs_f64();
    assert!(
        share < 0.25,
        "the server used {:.0}% of a CPU while out of fds",
        share * 100.0
    );
    drop(hogs);
    let client = lo_side("client", port)
        .args([
            "--peer",
            "127.0.0.1",
            "--op",
            "write",
            "--duration",
            "0.3",
            "--verify",
        ])
        .output()
        .expect("client");
    let out = String::from_utf8_lossy(&client.stdout);
    assert!(
        client.status.success() && out.contains("verify passed"),
        "client after the fd squeeze: {}\n{out}\n{}",
        client.status,
        String::from_utf8_lossy(&client.stderr)
    );
    let _ = server.wait();
}
