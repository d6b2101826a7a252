//! Root-only: connection floods from ordinary kernel sockets against a running `iwperf
//! server` over TAP while a legitimate `iwperf client --verify` runs (256
//! silent connections used to lock every client out for the whole MPA timeout, and the
//! server's memory grew from 8 to about 200 MiB and stayed there).
//!
//! The attacker is the kernel of namespace B with 10.234.0.3 on B's bridge, beside the
//! legitimate client (smoltcp, 10.234.0.2 on B's TAP); the server's smoltcp owns
//! 10.234.0.1 on A's TAP. The server's resident memory (`VmRSS`) is sampled before the
//! flood (idle), every 100 ms during it (peak) and 30 s after its sockets were closed;
//! the bounds: peak <= idle + 64 MiB, after <= idle + 16 MiB.
//!
//! An `iwperf server` serves one test and exits, so the legitimate client runs long
//! enough to keep it alive past the "after" sample (its own connections and buffers,
//! about 2 MiB, are in both later figures).

mod iwperf_support;

use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

use iwperf_support::attacker::{
    open_flood, request_bytes, send_params, vm_rss_kib, Held, RssPeak, PORT,
};
use iwperf_support::*;
use netlab::{leftover_namespaces, wait_all, Peer, Side, Topology};

const MIB: u64 = 1024;

/// A topology with the attacker's kernel address and a running `iwperf server` in A;
/// returns them, the server's address and its pid.
fn setup() -> (Topology, Peer, SocketAddrV4, u32) {
    let topo = Topology::create(1500).expect("topology");
    topo.add_kernel_address(Side::B, 3)
        .expect("attacker address");
    let server = start_server(&topo, &iwperf(), &["--json", "--timeout", "120"]);
    let addr = SocketAddrV4::new(topo.a().ip, PORT);
    let pid = server.pid();
    (topo, server, addr, pid)
}

/// Starts the legitimate client: Write and Send on two connections, 4 KiB messages,
/// verified, for `seconds`.
fn start_legit(topo: &Topology, seconds: u64) -> Peer {
    start_legit_client(topo, &iwperf(), "--duration", seconds)
}

/// The server's `VmRSS` after it settled: the smallest of a few samples 200 ms apart.
fn idle_rss(pid: u32) -> u64 {
    (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(200));
            vm_rss_kib(pid).expect("server alive")
        })
        .min()
        .expect("samples")
}

/// Prints the three figures and asserts the bounds.
fn check_rss(test: &str, idle: u64, peak: u64, after: u64) {
    println!(
        "{test}: server VmRSS idle {:.1} MiB, peak during the flood {:.1} MiB, 30 s after {:.1} MiB",
        idle as f64 / 1024.0,
        peak as f64 / 1024.0,
        after as f64 / 1024.0
    );
    assert!(
        peak <= idle + 64 * MIB,
        "peak {peak} KiB > idle {idle} KiB + 64 MiB"
    );
    assert!(
        after <= idle + 16 * MIB,
        "after {after} KiB > idle {idle} KiB + 16 MiB"
    );
}

/// 2,000 connections opened as fast as the server answers (eight threads), half of
/// them silent, half dribbling one byte of an MPA Request a second, held for 10 s while
/// the legitimate client connects and runs: it completes and verifies, and the server's
/// memory stays within the bounds.
#[test]
fn two_thousand_silent_or_dribbling_connections_do_not_lock_out_a_client() {
    if skip_unless_root("two_thousand_silent_or_dribbling_connections_do_not_lock_out_a_client") {
        return;
    }
    const HOLD: Duration = Duration::from_secs(10);
    let (topo, server, addr, pid) = setup();
    let names = topo.namespaces();
    let idle = idle_rss(pid);
    let peak = RssPeak::start(pid, Duration::from_millis(100));
    let t0 = Instant::now();
    let mut held = open_flood(&topo.pair().b, addr, 2000, 8, Duration::from_secs(1));
    println!(
        "flood: 2000 attempts in {:.1} s: {} connected ({} still open), {} refused",
        t0.elapsed().as_secs_f64(),
        2000 - held.refused,
        held.prune(),
        held.refused
    );
    // Long enough to keep the server up until the "after" sample.
    let client = start_legit(&topo, HOLD.as_secs() + 38);
    let request = request_bytes(&send_params(1, 0).encode());
    let hold_start = Instant::now();
    let mut most = 0;
    while hold_start.elapsed() < HOLD {
        most = most.max(held.dribble(&request));
        std::thread::sleep(Duration::from_secs(1));
    }
    println!(
        "flood held {:.0} s: at most {most} attacker connections open at a time, {} at the end",
        HOLD.as_secs_f64(),
        held.prune()
    );
    drop(held);
    let flood_end = Instant::now();
    let peak = peak.stop();
    std::thread::sleep(Duration::from_secs(30).saturating_sub(flood_end.elapsed()));
    let after = vm_rss_kib(pid).expect("the server is still serving the client");
    let outs =
        wait_all(vec![server, client], Duration::from_secs(120)).unwrap_or_else(|e| panic!("{e}"));
    let (s, c) = (json(&outs[0]), json(&outs[1]));
    assert_verified(&c, &s);
    drop(topo);
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
    check_rss("2000-connection flood", idle, peak, after);
}

/// A sustained flood: a new silent connection every 40 ms (25 a second) for 60 s, each
/// held until the server drops it, while the legitimate client connects and runs: it
/// completes and verifies, and the server's memory stays within the bounds.
#[test]
fn sustained_reopening_flood_for_sixty_seconds_does_not_lock_out_a_client() {
    if skip_unless_root("sustained_reopening_flood_for_sixty_seconds_does_not_lock_out_a_client") {
        return;
    }
    const FLOOD: Duration = Duration::from_secs(60);
    const START_CLIENT_AFTER: Duration = Duration::from_secs(5);
    let (topo, server, addr, pid) = setup();
    let names = topo.namespaces();
    let idle = idle_rss(pid);
    let peak = RssPeak::start(pid, Duration::from_millis(100));
    let attacker = topo.pair().b.spawn(move || {
        let start = Instant::now();
        let mut held = Held::default();
        let (mut opened, mut most, mut next) = (0usize, 0usize, start);
        let mut last_prune = start;
        while start.elapsed() < FLOOD {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            next += Duration::from_millis(40);
            match TcpStream::connect_timeout(&SocketAddr::V4(addr), Duration::from_millis(500)) {
                Ok(s) => {
                    held.conns
                        .push((s, iwperf_support::attacker::Behaviour::Silent, 0));
                    opened += 1;
                }
                Err(_) => held.refused += 1,
            }
            if last_prune.elapsed() >= Duration::from_secs(1) {
                most = most.max(held.prune());
                last_prune = Instant::now();
            }
        }
        (opened, held.refused, most)
    });
    std::thread::sleep(START_CLIENT_AFTER);
    // Long enough to keep the server up until the "after" sample.
    let client = start_legit(&topo, (FLOOD - START_CLIENT_AFTER).as_secs() + 34);
    let (opened, refused, most) = attacker
        .join()
        .expect("attacker thread")
        .expect("enter namespace B");
    let flood_end = Instant::now();
    println!(
        "sustained flood: {} attempts in {:.0} s: {opened} connected, {refused} refused; at most {most} open at a time",
        opened + refused,
        FLOOD.as_secs_f64()
    );
    let peak = peak.stop();
    std::thread::sleep(Duration::from_secs(30).saturating_sub(flood_end.elapsed()));
    let after = vm_rss_kib(pid).expect("the server is still serving the client");
    let outs =
        wait_all(vec![server, client], Duration::from_secs(150)).unwrap_or_else(|e| panic!("{e}"));
    let (s, c) = (json(&outs[0]), json(&outs[1]));
    assert_verified(&c, &s);
    drop(topo);
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
    check_rss("sustained flood", idle, peak, after);
}
