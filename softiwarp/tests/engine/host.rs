//! Devices on the host's kernel TCP (`LinkConfig::netdev`, no root): two devices bound
//! to `lo` in one process, listen and connect on 127.0.0.1 through kernel sockets, 8 MiB
//! of ULPDUs verified by checksum in each direction, a graceful close seen by both
//! sides; a listening port is a kernel TCP port.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::Duration;

use softiwarp::transport::{CloseMode, MpaParams};
use softiwarp::{Device, DeviceConfig, LinkConfig};

use crate::support::{Rng, RngExt};

const T: Duration = Duration::from_secs(20);

/// A kernel TCP port free on 127.0.0.1 right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn checksum(data: &[u8], h: u64) -> u64 {
    data.iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
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
        let mut rng = Rng::new(seed);
        let (mut sent, mut h_sent) = (0usize, 0u64);
        std::thread::scope(|scope| {
            let rx = scope.spawn(|| {
                let (mut got, mut h) = (0usize, 0u64);
                while got < TOTAL {
                    let u = to.recv_ulpdu(T).unwrap();
                    h = checksum(&u, h);
                    got += u.len();
                }
                h
            });
            while sent < TOTAL {
                let len = mulpdu.min(TOTAL - sent);
                let mut u = vec![0u8; len];
                rng.fill(&mut u);
                h_sent = checksum(&u, h_sent);
                from.send_ulpdu_vec(u, T).unwrap();
                sent += len;
            }
            assert_eq!(rx.join().unwrap(), h_sent, "seed {seed}: checksum mismatch");
        });
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
