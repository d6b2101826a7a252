//! Devices on the host's kernel TCP (`LinkConfig::netdev`, no root): two devices bound
//! to `lo` in one process, listen and connect on 127.0.0.1 through kernel sockets, 8 MiB
//! of ULPDUs verified by checksum in each direction, a graceful close seen by both
//! sides; a listening port is a kernel TCP port.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::Duration;

use softiwarp::transport::{CloseMode, MpaParams};
use softiwarp::{Device, DeviceConfig, LinkConfig};

use crate::support::devices::stream_verified;

const T: Duration = Duration::from_secs(20);

/// A kernel TCP port free on 127.0.0.1 right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn lo_device(name: &str) -> Device {
    Device::open(DeviceConfig::new(
        name,
        LinkConfig::netdev("lo"),
        Ipv4Addr::UNSPECIFIED,
        0,
    ))
    .unwrap()
}

#[test]
fn two_devices_on_lo_move_verified_ulpdus_over_kernel_tcp() {
    let client = lo_device("hostc");
    let server = lo_device("hosts");
    assert_eq!(server.address(), Ipv4Addr::LOCALHOST);
    assert!(server.is_host_tcp());
    assert!(
        server
            .addresses()
            .iter()
            .any(|s| s.addr == Ipv4Addr::LOCALHOST && s.prefix_len == 8),
        "lo's addresses: {:?}",
        server.addresses()
    );
    let port = free_port();
    let listener = server.listen(port, 4).unwrap();
    // The port is the kernel's now: a plain bind to it fails.
    assert!(
        TcpListener::bind(("127.0.0.1", port)).is_err(),
        "port {port} not taken"
    );
    let c = client
        .connect(
            Ipv4Addr::LOCALHOST,
            port,
            MpaParams {
                private_data: b"over kernel tcp".to_vec(),
                ird: 1,
                ord: 1,
                settings: None,
            },
        )
        .unwrap();
    let r = listener.next_request(T).unwrap();
    assert_eq!(r.private_data(), b"over kernel tcp");
    assert_eq!(r.local().port(), port);
    assert_eq!(*r.remote().ip(), Ipv4Addr::LOCALHOST);
    let s = r.accept(b"ok", 1, 1).unwrap();
    c.wait_established(T).unwrap();
    s.wait_established(T).unwrap();
    let mulpdu = c.mulpdu().unwrap();
    assert!(mulpdu > 1400, "MULPDU {mulpdu} from lo's MSS");

    const TOTAL: usize = 8 << 20;
    for (from, to, seed) in [(&c, &s, 1u64), (&s, &c, 2)] {
        stream_verified(from, to, TOTAL, mulpdu, seed, T);
    }
    c.close(CloseMode::Graceful).unwrap();
    assert_eq!(c.wait_ended(T), Some(None));
    assert_eq!(s.wait_ended(T), Some(None));
    drop((c, s, listener));
    // The listener is gone (the engine closes its kernel socket): the port is free again.
    let freed = std::time::Instant::now();
    while TcpListener::bind(("127.0.0.1", port)).is_err() {
        assert!(
            freed.elapsed() < T,
            "port {port} still taken after the listener was dropped"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(server);
    drop(client);
}

#[test]
fn a_kernel_tcp_client_sending_garbage_is_dropped_and_the_listener_goes_on() {
    let server = lo_device("hostg");
    let port = free_port();
    let listener = server.listen(port, 4).unwrap();
    let mut junk = TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::io::Write::write_all(&mut junk, &[0x55; 200]).unwrap();
    junk.set_read_timeout(Some(T)).unwrap();
    // The device reads a broken MPA Request and closes the connection.
    let mut buf = [0u8; 64];
    let r = std::io::Read::read(&mut junk, &mut buf);
    assert!(
        matches!(r, Ok(0) | Err(_)),
        "the device answered garbage with {r:?}"
    );
    assert!(listener.next_request(Duration::from_millis(200)).is_err());
    // A proper client still gets through.
    let client = lo_device("hostg2");
    let c = client
        .connect(Ipv4Addr::LOCALHOST, port, MpaParams::default())
        .unwrap();
    let r = listener.next_request(T).unwrap();
    let s = r.accept(b"", 1, 1).unwrap();
    c.wait_established(T).unwrap();
    s.wait_established(T).unwrap();
}

// ---- a hostile peer with plain kernel sockets against a host-TCP listener: the
// ---- bounds of the smoltcp listener (`engine/listener.rs`, bench's iwperf_hostile)

/// A host device on `lo` with a half-open pool of `half_open_max` and an MPA startup
/// timeout of `startup_ms`, listening on a free port.
fn hostile_server(
    name: &str,
    half_open_max: usize,
    startup_ms: u64,
) -> (Device, softiwarp::Listener, u16) {
    let mut cfg = DeviceConfig::new(name, LinkConfig::netdev("lo"), Ipv4Addr::UNSPECIFIED, 0);
    cfg.half_open_max = half_open_max;
    cfg.mpa.startup_timeout_us = startup_ms * 1000;
    let dev = Device::open(cfg).unwrap();
    let port = free_port();
    let l = dev.listen(port, 4).unwrap();
    (dev, l, port)
}

/// How the device ended a kernel connection, as its socket sees it within `limit`:
/// `Ok(bytes read before the FIN)`, or the read error (a reset).
fn read_to_end(s: &mut TcpStream, limit: Duration) -> Result<Vec<u8>, std::io::ErrorKind> {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match std::io::Read::read(s, &mut buf) {
            Ok(0) => return Ok(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return Err(e.kind()),
        }
    }
}

/// A device client connects, is accepted and established: the listener still serves.
fn legit_connects(listener: &softiwarp::Listener, port: u16) {
    let client = lo_device("hostlegit");
    let c = client
        .connect(Ipv4Addr::LOCALHOST, port, MpaParams::default())
        .unwrap();
    let r = listener.next_request(T).unwrap();
    let s = r.accept(b"", 1, 1).unwrap();
    c.wait_established(T).unwrap();
    s.wait_established(T).unwrap();
}

fn mpa_request(private_data: &[u8]) -> Vec<u8> {
    let local = mpa::negotiate::LocalSettings {
        private_data: private_data.to_vec(),
        ..mpa::negotiate::LocalSettings::default()
    };
    mpa::negotiate::request(&local).unwrap().to_bytes().unwrap()
}

#[test]
fn half_open_connections_beyond_the_pool_are_reset_oldest_first() {
    let (_dev, listener, port) = hostile_server("hosthalf", 4, 10_000);
    // Six connections that never send their MPA Request; the pool keeps four.
    let mut silent: Vec<TcpStream> = (0..6)
        .map(|_| {
            let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            // One at a time, so "oldest" is well defined.
            std::thread::sleep(Duration::from_millis(50));
            s
        })
        .collect();
    let ends: Vec<_> = silent
        .iter_mut()
        .map(|s| read_to_end(s, Duration::from_millis(1500)))
        .collect();
    assert_eq!(
        ends[0],
        Err(std::io::ErrorKind::ConnectionReset),
        "oldest: {ends:?}"
    );
    assert_eq!(
        ends[1],
        Err(std::io::ErrorKind::ConnectionReset),
        "second: {ends:?}"
    );
    for (i, e) in ends.iter().enumerate().skip(2) {
        assert!(
            matches!(
                e,
                Err(std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
            ),
            "connection {i} should still be open: {ends:?}"
        );
    }
    legit_connects(&listener, port);
}

#[test]
fn a_silent_connection_is_closed_after_the_mpa_startup_timeout() {
    let (_dev, listener, port) = hostile_server("hostsilent", 64, 300);
    let started = std::time::Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let end = read_to_end(&mut s, Duration::from_secs(5));
    let waited = started.elapsed();
    assert!(
        matches!(end, Ok(ref b) if b.is_empty()) || end == Err(std::io::ErrorKind::ConnectionReset),
        "closed without a word: {end:?}"
    );
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "closed after {waited:?} (startup timeout 300 ms)"
    );
    assert!(listener.next_request(Duration::from_millis(100)).is_err());
    legit_connects(&listener, port);
}

#[test]
fn a_revision_3_request_gets_the_reject_reply_then_a_fin() {
    let (_dev, listener, port) = hostile_server("hostrev3", 64, 10_000);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut req = mpa_request(b"");
    mpa::wire::Packet::new_unchecked(&mut req[..]).set_rev(3);
    std::io::Write::write_all(&mut s, &req).unwrap();
    let got = read_to_end(&mut s, T).unwrap();
    let mut want = mpa::wire::REPLY_KEY.to_vec();
    want.extend_from_slice(&[mpa::wire::flags::REJECT, 2, 0, 0]);
    assert_eq!(got, want, "the reject Reply, then the FIN");
    assert!(listener.next_request(Duration::from_millis(100)).is_err());
    legit_connects(&listener, port);
}

#[test]
fn a_request_then_a_reset_is_dropped_and_the_listener_serves_on() {
    let (dev, listener, port) = hostile_server("hostrst", 64, 10_000);
    {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        std::io::Write::write_all(&mut s, &mpa_request(b"gone")).unwrap();
        // A reset right behind the Request (SO_LINGER 0).
        nix::sys::socket::setsockopt(
            &s,
            nix::sys::socket::sockopt::Linger,
            &libc::linger {
                l_onoff: 1,
                l_linger: 0,
            },
        )
        .unwrap();
    }
    // The request may be reported before the reset is seen; deciding it then fails
    // or succeeds, but the connection ends and leaves nothing behind.
    if let Ok(r) = listener.next_request(Duration::from_millis(500)) {
        assert_eq!(r.private_data(), b"gone");
        let _ = r.reject(b"");
    }
    legit_connects(&listener, port);
    let deadline = std::time::Instant::now() + T;
    while dev.connection_count() > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} connections left",
            dev.connection_count()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Nothing spins when idle: two host devices with a listener and an established,
/// idle connection use under 3% of a CPU each over one second (the engine sleeps on the
/// epoll set until a socket, the interface watch or a deadline wakes it).
#[test]
fn idle_host_devices_sleep() {
    use crate::support::{thread_ticks, ticks_per_second};
    let (client, server) = (lo_device("hidlec"), lo_device("hidles"));
    let port = free_port();
    let listener = server.listen(port, 4).unwrap();
    let c = client
        .connect(Ipv4Addr::LOCALHOST, port, MpaParams::default())
        .unwrap();
    let s = listener.next_request(T).unwrap().accept(b"", 1, 1).unwrap();
    c.wait_established(T).unwrap();
    s.wait_established(T).unwrap();
    c.send_ulpdu(b"ping", T).unwrap();
    assert_eq!(s.recv_ulpdu(T).unwrap(), b"ping");
    std::thread::sleep(Duration::from_millis(200));
    let hz = ticks_per_second();
    let tids = [client.engine_tid(), server.engine_tid()];
    let before: Vec<u64> = tids.iter().map(|&t| thread_ticks(t)).collect();
    let wall = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let wall = wall.elapsed();
    for (i, &t) in tids.iter().enumerate() {
        let cpu = (thread_ticks(t) - before[i]) as f64 / hz as f64;
        let share = cpu / wall.as_secs_f64();
        assert!(
            share < 0.03,
            "idle host engine {t} used {:.1}% CPU",
            share * 100.0
        );
    }
    s.send_ulpdu(b"pong", T).unwrap();
    assert_eq!(c.recv_ulpdu(T).unwrap(), b"pong");
}
