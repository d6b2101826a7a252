//! Root-only: the two transports talk to each other. A smoltcp device on namespace A's
//! TAP (10.99.0.1) and a host-TCP device on namespace B's bridge, whose kernel holds
//! 10.99.0.2 (`LinkConfig::netdev`): MPA negotiated between smoltcp's TCP and the
//! kernel's, 4 MiB of ULPDUs verified in each direction, each side once the listener,
//! and a graceful close seen by both.

use std::net::Ipv4Addr;
use std::time::Duration;

use softiwarp::transport::{CloseMode, MpaParams};
use softiwarp::{Device, DeviceConfig, LinkConfig};

use crate::engine::{ns_path, with_topology};
use crate::support::devices::stream_verified;

const T: Duration = Duration::from_secs(20);
const TOTAL: usize = 4 << 20;

fn interop(host_listens: bool) {
    let name = if host_listens {
        "host_tcp_listener_and_smoltcp_client"
    } else {
        "smoltcp_listener_and_host_tcp_client"
    };
    with_topology(name, |topo, _| {
        let (ip_a, ip_b) = (Ipv4Addr::new(10, 99, 0, 1), Ipv4Addr::new(10, 99, 0, 2));
        let bridge_b = topo.bridges()[1].to_owned();
        topo.b
            .ip(&["addr", "add", "10.99.0.2/24", "dev", &bridge_b])
            .unwrap();
        let mut ca = DeviceConfig::new("itapA", LinkConfig::tap(&topo.tap_a), ip_a, 24);
        ca.netns = Some(ns_path(topo.a.name()));
        let mut cb = DeviceConfig::new(
            "ihostB",
            LinkConfig::netdev(&bridge_b),
            Ipv4Addr::UNSPECIFIED,
            0,
        );
        cb.netns = Some(ns_path(topo.b.name()));
        let smol = Device::open(ca).expect("smoltcp device");
        let host = Device::open(cb).expect("host-TCP device");
        assert_eq!(host.address(), ip_b, "the bridge's kernel address");
        let port = 4800 + u16::from(host_listens);
        let (server, client, server_ip) = if host_listens {
            (&host, &smol, ip_b)
        } else {
            (&smol, &host, ip_a)
        };
        let listener = server.listen(port, 4).unwrap();
        let c = client
            .connect(
                server_ip,
                port,
                MpaParams {
                    private_data: b"interop".to_vec(),
                    ird: 1,
                    ord: 1,
                    settings: None,
                },
            )
            .unwrap();
        let r = listener.next_request(T).unwrap();
        assert_eq!(r.private_data(), b"interop");
        let s = r.accept(b"ok", 1, 1).unwrap();
        c.wait_established(T).unwrap();
        s.wait_established(T).unwrap();
        let mulpdu = c.mulpdu().unwrap().min(s.mulpdu().unwrap());
        for (from, to, seed) in [(&c, &s, 11u64), (&s, &c, 12)] {
            stream_verified(from, to, TOTAL, mulpdu, seed, T);
        }
        c.close(CloseMode::Graceful).unwrap();
        assert_eq!(c.wait_ended(T), Some(None));
        assert_eq!(s.wait_ended(T), Some(None));
    });
}

#[test]
fn a_host_tcp_listener_serves_a_smoltcp_client() {
    interop(true);
}

#[test]
fn a_smoltcp_listener_serves_a_host_tcp_client() {
    interop(false);
}
