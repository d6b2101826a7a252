//! Two devices with real engine threads joined by a UDP link on the loopback interface
//! (`LinkConfig::udp`: Ethernet frames as datagrams, no root): listen, connect, 8 MiB
//! of ULPDUs verified by checksum in each direction with 1% of the client's sent frames
//! dropped and the server's link captured; the capture holds the MPA Request and Reply
//! and every frame parses as Ethernet.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use softiwarp::link::{FaultConfig, UdpConfig};
use softiwarp::transport::{CloseMode, MpaParams};
use softiwarp::{Device, DeviceConfig, FaultSpec, LinkConfig};

use crate::support::devices::stream_verified;

const PORT: u16 = 4791;
const T: Duration = Duration::from_secs(20);

/// Two free UDP ports on 127.0.0.1.
fn ports() -> (SocketAddr, SocketAddr) {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    (a.local_addr().unwrap(), b.local_addr().unwrap())
}

#[test]
fn devices_over_a_udp_link_move_verified_ulpdus_through_loss_with_a_capture() {
    let (pa, pb) = ports();
    let dir = std::env::temp_dir().join(format!("swudp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("server.pcap");
    let mut lc = LinkConfig::udp(UdpConfig::new(pa, pb));
    lc.faults = Some(FaultSpec {
        seed: 7,
        tx: FaultConfig {
            drop: 0.01,
            ..FaultConfig::none()
        },
        rx: FaultConfig::none(),
    });
    let client = Device::open(DeviceConfig::new(
        "udpc",
        lc,
        Ipv4Addr::new(10, 89, 0, 1),
        24,
    ))
    .unwrap();
    let server = Device::open(DeviceConfig::new(
        "udps",
        LinkConfig::udp(UdpConfig::new(pb, pa)).with_pcap(&pcap),
        Ipv4Addr::new(10, 89, 0, 2),
        24,
    ))
    .unwrap();
    let listener = server.listen(PORT, 4).unwrap();
    let c = client
        .connect(
            Ipv4Addr::new(10, 89, 0, 2),
            PORT,
            MpaParams {
                private_data: b"over udp".to_vec(),
                ird: 1,
                ord: 1,
                settings: None,
            },
        )
        .unwrap();
    let r = listener.next_request(T).unwrap();
    assert_eq!(r.private_data(), b"over udp");
    let s = r.accept(b"ok", 1, 1).unwrap();
    c.wait_established(T).unwrap();
    s.wait_established(T).unwrap();
    let mulpdu = c.mulpdu().unwrap();
    assert_eq!(mulpdu, 1454, "MTU 1500 on the UDP link");

    const TOTAL: usize = 8 << 20;
    for (from, to, seed) in [(&c, &s, 1u64), (&s, &c, 2)] {
        stream_verified(from, to, TOTAL, mulpdu, seed, T);
    }
    c.close(CloseMode::Graceful).unwrap();
    assert_eq!(c.wait_ended(T), Some(None));
    assert_eq!(s.wait_ended(T), Some(None));
    drop((c, s, listener));
    drop(server);
    drop(client);

    // The capture: Ethernet frames, the MPA Request and Reply among them.
    let bytes = std::fs::read(&pcap).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("MPA ID Req Frame"), "no MPA Request captured");
    assert!(text.contains("MPA ID Rep Frame"), "no MPA Reply captured");
    assert!(bytes.len() > TOTAL, "capture of {} bytes", bytes.len());
    let _ = std::fs::remove_dir_all(&dir);
}
