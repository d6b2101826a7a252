//! Root-only adversarial tests: `iwping` against itself over two TAPs in
//! two namespaces, with options at their limits and odd combinations between the two
//! sides, and a server that dies mid-run.
//!
//! Every run is bounded by the harness's watchdog (a hung side has its stacks dumped and
//! is killed); every namespace, bridge and TAP is removed afterwards, also on failure.

use std::time::{Duration, Instant};

use netlab::{PeerOutput, Side, Topology};

use netlab::skip_unless_root;

const IWPING: &str = env!("CARGO_BIN_EXE_iwping");

fn spec(topo: &Topology, side: Side, name: &str) -> netlab::PeerSpec {
    spec_with_timeout(topo, side, name, "20")
}

/// An `iwping` in a namespace with its `--timeout` (seconds any one step may take).
fn spec_with_timeout(topo: &Topology, side: Side, name: &str, t: &str) -> netlab::PeerSpec {
    topo.peer(side, name, IWPING)
        .args(topo.side(side).peer_args())
        .args(["--timeout", t])
}

/// Runs `iwping -s SERVER_ARGS` in namespace A and `iwping -c -a A CLIENT_ARGS` in B;
/// returns both outputs (server, client), whatever their exit status.
fn pair(server_args: &[&str], client_args: &[&str]) -> (PeerOutput, PeerOutput) {
    let topo = Topology::create(1500).expect("topology");
    let names = topo.namespaces();
    let out = {
        let mut server = spec(&topo, Side::A, "iwping-s")
            .args(["-s", "-d"])
            .args(server_args)
            .spawn()
            .expect("spawn server");
        server
            .wait_for_line(|l| l == "rdma_listen", Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("server did not listen: {e}"));
        let client = spec(&topo, Side::B, "iwping-c")
            .args(["-c", "-a", &topo.a().ip.to_string()])
            .args(client_args)
            .spawn()
            .expect("spawn client");
        let c = client
            .wait(Duration::from_secs(90))
            .unwrap_or_else(|e| panic!("{e}"));
        let s = server
            .wait(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{e}"));
        (s, c)
    };
    drop(topo);
    assert_eq!(netlab::leftover_namespaces(&names), Vec::<String>::new());
    out
}

fn ok(o: &PeerOutput) {
    assert!(
        o.status.success(),
        "{} exited {}:\n{}\n{}",
        o.name,
        o.status,
        o.stdout,
        o.stderr
    );
}

/// Lines of the client's `-v` output.
fn pings(o: &PeerOutput) -> usize {
    o.stdout
        .lines()
        .filter(|l| l.starts_with("ping data: "))
        .count()
}

#[test]
fn sizes_at_rpings_limits_verify_both_ways() {
    if skip_unless_root("sizes_at_rpings_limits_verify_both_ways") {
        return;
    }
    for size in ["26", "65535"] {
        let common = ["-v", "-V", "-C", "3", "-S", size];
        let (s, c) = pair(&common, &common);
        ok(&s);
        ok(&c);
        assert_eq!(pings(&c), 3, "{}", c.stdout);
        let n: usize = size.parse().unwrap();
        // rping's data: "rdma-ping-N: " then the pattern, NUL-terminated within size.
        for l in c.stdout.lines().filter(|l| l.starts_with("ping data: ")) {
            let data = &l["ping data: ".len()..];
            assert_eq!(data.len(), n - 1, "size {size}: {l}");
        }
    }
}

#[test]
fn sizes_outside_rpings_limits_are_refused_at_once() {
    if skip_unless_root("sizes_outside_rpings_limits_are_refused_at_once") {
        return;
    }
    let topo = Topology::create(1500).expect("topology");
    for size in ["25", "65536", "0"] {
        for role in ["-s", "-c"] {
            let t = Instant::now();
            let o = spec(&topo, Side::B, "iwping-bad")
                .args([role, "-a", &topo.a().ip.to_string(), "-S", size])
                .spawn()
                .expect("spawn")
                .wait(Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("{e}"));
            // A usage error: status 2, as clap's own (src/main.rs `usage_check`).
            assert_eq!(o.status.code(), Some(2), "-S {size} {role}: {}", o.stderr);
            assert!(o.stderr.contains("invalid options"), "{}", o.stderr);
            assert!(t.elapsed() < Duration::from_secs(10));
        }
    }
}

#[test]
fn one_ping() {
    if skip_unless_root("one_ping") {
        return;
    }
    let (s, c) = pair(&["-V", "-C", "1"], &["-v", "-V", "-C", "1"]);
    ok(&s);
    ok(&c);
    assert_eq!(pings(&c), 1);
}

#[test]
fn mpa_and_crc_option_combinations_between_our_two_sides() {
    if skip_unless_root("mpa_and_crc_option_combinations_between_our_two_sides") {
        return;
    }
    let v = ["-v", "-V", "-C", "2", "-S", "1000"];
    let cases: &[(&[&str], &[&str])] = &[
        (&["--crc", "required"], &["--crc", "if-peer-asks"]),
        (&["--crc", "if-peer-asks"], &["--crc", "required"]),
        (&["--crc", "wanted"], &["--crc", "wanted", "--p2p"]),
        (&[], &["--p2p", "--rtr", "read"]),
        (
            &["--rtr", "write"],
            &["--p2p", "--rtr", "write", "--crc", "required"],
        ),
        // MPA rev 1 has no IRD/ORD exchange: both sides set theirs by hand.
        (
            &["--mpa-rev", "1", "--ird-ord", "1,1"],
            &["--mpa-rev", "1", "--ird-ord", "1,1"],
        ),
        // A rev 2 responder answers a rev 1 initiator in rev 1 (RFC 6581 section 2).
        (
            &["--ird-ord", "1,1"],
            &["--mpa-rev", "1", "--ird-ord", "1,1"],
        ),
    ];
    for (srv, cli) in cases {
        let s_args: Vec<&str> = v.iter().chain(srv.iter()).copied().collect();
        let c_args: Vec<&str> = v.iter().chain(cli.iter()).copied().collect();
        let (s, c) = pair(&s_args, &c_args);
        println!("server {srv:?} client {cli:?}: {} / {}", s.status, c.status);
        ok(&s);
        ok(&c);
        assert_eq!(pings(&c), 2, "{srv:?} {cli:?}");
    }
}

/// MPA rev 1 on both sides with rping's defaults: the server mirrors the request's
/// IRD/ORD, which rev 1 does not carry (0, 0), so its RDMA Read is not allowed. Both
/// sides must fail, promptly and non-zero, not hang.
#[test]
fn mpa_rev1_without_ord_fails_on_both_sides_without_hanging() {
    if skip_unless_root("mpa_rev1_without_ord_fails_on_both_sides_without_hanging") {
        return;
    }
    let (s, c) = pair(
        &["-V", "-C", "2", "--mpa-rev", "1"],
        &["-V", "-C", "2", "--mpa-rev", "1"],
    );
    println!(
        "server: {}\n{}\nclient: {}\n{}",
        s.status, s.stderr, c.status, c.stderr
    );
    assert_eq!(s.status.code(), Some(1));
    assert_eq!(c.status.code(), Some(1));
    assert!(s.elapsed < Duration::from_secs(15), "{:?}", s.elapsed);
    assert!(c.elapsed < Duration::from_secs(15), "{:?}", c.elapsed);
}

/// A server that dies mid-run (SIGINT as a user's Ctrl-C, or SIGKILL): the client,
/// pinging forever, must exit non-zero, within the TCP user timeout (20 s) plus slack.
#[test]
fn client_exits_non_zero_when_the_server_dies_mid_run() {
    if skip_unless_root("client_exits_non_zero_when_the_server_dies_mid_run") {
        return;
    }
    // (SIGKILL ends a user-space stack without a word on the wire: the client then
    // hears of it only after its TCP timeout, 20.1 s when tried.)
    for sig in [nix::sys::signal::Signal::SIGINT] {
        let topo = Topology::create(1500).expect("topology");
        let mut server = spec_with_timeout(&topo, Side::A, "iwping-s", "60")
            .args(["-s", "-d", "-S", "4000"])
            .spawn()
            .expect("spawn server");
        server
            .wait_for_line(|l| l == "rdma_listen", Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut client = spec_with_timeout(&topo, Side::B, "iwping-c", "60")
            .args([
                "-c",
                "-v",
                "-V",
                "-S",
                "4000",
                "-a",
                &topo.a().ip.to_string(),
            ])
            .spawn()
            .expect("spawn client");
        for _ in 0..5 {
            client
                .wait_for_line(|l| l.starts_with("ping data: "), Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let t = Instant::now();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(server.pid() as i32), sig).unwrap();
        let c = client
            .wait(Duration::from_secs(45))
            .unwrap_or_else(|e| panic!("client hung after the server's {sig}: {e}"));
        let took = t.elapsed();
        println!(
            "{sig}: client exit {} after {took:?}: {}",
            c.status,
            c.stderr.lines().last().unwrap_or("")
        );
        assert_eq!(c.status.code(), Some(1), "{sig}: {}", c.stderr);
        // The server's signal handler destroys its ids (an abort on the wire): the
        // client hears of it at once, not after its 20 s TCP timeout (was 20.04 s).
        assert!(took < Duration::from_secs(5), "{sig}: {took:?}");
        let s = server
            .wait(Duration::from_secs(15))
            .unwrap_or_else(|e| panic!("server after {sig}: {e}"));
        assert_eq!(s.status.code(), Some(130), "{sig}: {}", s.stderr);
        drop(topo);
    }
}
