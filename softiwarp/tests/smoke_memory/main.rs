//! smoltcp TCP over the memory link, driven step by step on a virtual clock: a 1 MiB
//! echo (so 1 MiB each way), byte-exact, with no faults, with drop/duplicate/reorder, and
//! with byte corruption. Deterministic: the link, the fault RNG and smoltcp's seeds are
//! fixed, and time only moves when the loop moves it. No root needed.

#[path = "../support/mod.rs"]
mod support;

use std::io::Cursor;

use pcap_parser::traits::PcapReaderIterator;
use pcap_parser::{LegacyPcapReader, PcapBlockOwned, PcapError};
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Packet, TcpPacket,
    TcpRepr,
};
use softiwarp::link::{CorruptedFrame, Direction, FaultConfig, Faults, Link, Pcap, PcapClock};
use softiwarp::transport::smoltcp_glue::{mss_for_mtu, TcpConfig};
use support::host::{Client, Host, Server};
use support::links;

const MIB: usize = 1 << 20;

/// Result of one echo run.
struct Outcome {
    /// Virtual time the run took.
    elapsed: Duration,
    /// Loop iterations.
    steps: u64,
}

/// Runs the echo of `data` from host 1 (client, over `a`) to host 2 (server, over `b`)
/// until both sockets are closed, or fails after `limit` of virtual time. `on_established`
/// runs once when the client's connection is established.
fn echo<A: Link, B: Link>(
    a: &mut Host<A>,
    b: &mut Host<B>,
    data: &[u8],
    limit: Duration,
    mut on_established: impl FnMut(&mut Host<A>),
) -> Outcome {
    let start = Instant::from_secs(1);
    let mut now = start;
    b.listen();
    a.connect(2);
    let mut client = Client::new(data.to_vec());
    let mut server = Server::default();
    let mut established = false;
    let mut steps = 0u64;
    loop {
        steps += 1;
        let before = (a.dev.stats(), b.dev.stats());
        a.poll(now);
        b.poll(now);
        if !established && a.socket().state() == smoltcp::socket::tcp::State::Established {
            established = true;
            on_established(a);
        }
        let mut moved = client.step(a.socket());
        moved |= server.step(b.socket());
        if client.done(a.socket()) && server.done(b.socket()) {
            break;
        }
        let frames_moved = before != (a.dev.stats(), b.dev.stats());
        if moved || frames_moved {
            now += Duration::from_micros(10);
        } else {
            // Idle: jump to the next timer (delayed ACK, retransmission, ...).
            let da = a.iface.poll_delay(now, &a.sockets);
            let db = b.iface.poll_delay(now, &b.sockets);
            let d = match (da, db) {
                (Some(x), Some(y)) => x.min(y),
                (Some(x), None) | (None, Some(x)) => x,
                (None, None) => panic!(
                    "stalled at {now}: client {:?} sent {} echoed {}, server {:?} got {}",
                    a.socket().state(),
                    client.sent,
                    client.echoed.len(),
                    b.socket().state(),
                    server.received.len()
                ),
            };
            now += d.max(Duration::from_micros(1));
        }
        assert!(
            now - start < limit,
            "not done after {limit}: client {:?} sent {} echoed {}, server {:?} got {}",
            a.socket().state(),
            client.sent,
            client.echoed.len(),
            b.socket().state(),
            server.received.len()
        );
    }
    assert_eq!(server.received.len(), data.len());
    assert!(server.received == data, "server got different bytes");
    assert!(client.echoed == data, "client got a different echo");
    Outcome {
        elapsed: now - start,
        steps,
    }
}

fn fixed_clock() -> PcapClock {
    let mut t = std::time::Duration::from_secs(1_700_000_000);
    Box::new(move || {
        t += std::time::Duration::from_micros(1);
        t
    })
}

/// Every frame of a pcap in memory.
fn frames_of(pcap: &[u8]) -> Vec<Vec<u8>> {
    let mut reader = LegacyPcapReader::new(1 << 20, Cursor::new(pcap)).unwrap();
    let mut out = Vec::new();
    loop {
        match reader.next() {
            Ok((off, block)) => {
                if let PcapBlockOwned::Legacy(b) = block {
                    assert_eq!(b.caplen, b.origlen);
                    out.push(b.data.to_vec());
                }
                reader.consume(off);
            }
            Err(PcapError::Eof) => break,
            Err(PcapError::Incomplete(_)) => reader.refill().unwrap(),
            Err(e) => panic!("{e:?}"),
        }
    }
    out
}

/// The TCP segment in an Ethernet frame, if it holds one.
fn tcp_of(frame: &[u8]) -> Option<TcpRepr<'_>> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(&frame[14..]).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let (src, dst) = (
        IpAddress::Ipv4(ip.src_addr()),
        IpAddress::Ipv4(ip.dst_addr()),
    );
    let hl = usize::from(ip.header_len());
    let tl = usize::from(ip.total_len());
    let tcp = TcpPacket::new_checked(&frame[14 + hl..14 + tl]).ok()?;
    TcpRepr::parse(&tcp, &src, &dst, &ChecksumCapabilities::default()).ok()
}

fn clean_echo(mtu: usize) {
    let data = support::pattern(MIB, 7);
    let (la, lb) = links(mtu);
    let la = Pcap::with_writer(la, Vec::new(), fixed_clock()).unwrap();
    let t0 = Instant::from_secs(1);
    let mut a = Host::new(la, 1, TcpConfig::default(), t0);
    let mut b = Host::new(lb, 2, TcpConfig::default(), t0);
    let out = echo(&mut a, &mut b, &data, Duration::from_secs(60), |_| {});
    let sa = a.dev.stats();
    let sb = b.dev.stats();
    assert_eq!(
        (sa.tx_errors, sa.rx_errors, sb.tx_errors, sb.rx_errors),
        (0, 0, 0, 0)
    );
    assert_eq!(sa.tx_frames, sb.rx_frames);
    assert_eq!(sb.tx_frames, sa.rx_frames);
    assert_eq!(b.dev.link().dropped(), 0);
    let (la, pcap) = a.dev.into_link().into_parts();
    assert_eq!(la.dropped(), 0);
    let frames = frames_of(&pcap.unwrap());
    assert_eq!(frames.len() as u64, sa.tx_frames + sa.rx_frames);

    // The SYN and SYN-ACK announce MSS = MTU - 40 and window scale 3 (256 KiB buffers).
    let segs: Vec<TcpRepr> = frames.iter().filter_map(|f| tcp_of(f)).collect();
    let syns: Vec<&TcpRepr> = segs
        .iter()
        .filter(|s| s.control == smoltcp::wire::TcpControl::Syn)
        .collect();
    assert_eq!(syns.len(), 2, "one SYN, one SYN-ACK");
    for s in &syns {
        assert_eq!(s.max_seg_size, Some(mss_for_mtu(mtu) as u16));
        assert_eq!(s.window_scale, Some(3));
    }
    // Bulk data fills segments to the MSS and never beyond; every frame fits the MTU.
    let max_payload = segs.iter().map(|s| s.payload.len()).max().unwrap();
    assert_eq!(max_payload, mss_for_mtu(mtu));
    assert!(frames.iter().all(|f| f.len() <= mtu + 14));
    // Payload bytes on the wire, both directions: each byte once (no loss, no
    // retransmission on a clean link).
    let payload_bytes: usize = segs.iter().map(|s| s.payload.len()).sum();
    assert_eq!(payload_bytes, 2 * MIB);
    println!(
        "clean echo at MTU {mtu}: {} frames, {} steps, {} virtual",
        frames.len(),
        out.steps,
        out.elapsed
    );
}

#[test]
fn echo_1mib_mtu_1500() {
    clean_echo(1500);
}

#[test]
fn echo_1mib_mtu_9000() {
    clean_echo(9000);
}

#[test]
fn echo_1mib_with_drop_duplicate_reorder() {
    let data = support::pattern(MIB, 11);
    let (la, lb) = links(1500);
    let f = FaultConfig {
        drop: 0.02,
        duplicate: 0.02,
        reorder: 0.02,
        ..Default::default()
    };
    let la = Faults::new(la, 1, f, f).unwrap();
    let t0 = Instant::from_secs(1);
    let mut a = Host::new(la, 1, TcpConfig::default(), t0);
    let mut b = Host::new(lb, 2, TcpConfig::default(), t0);
    let out = echo(&mut a, &mut b, &data, Duration::from_secs(600), |_| {});
    let tx = a.dev.link().stats(Direction::Tx);
    let rx = a.dev.link().stats(Direction::Rx);
    println!(
        "faults: tx {tx:?} rx {rx:?}; {} virtual, {} steps",
        out.elapsed, out.steps
    );
    // The faults happened, at about the configured rate, in both directions.
    for s in [tx, rx] {
        assert!(
            s.dropped > 0 && s.duplicated > 0 && s.reordered > 0,
            "{s:?}"
        );
        let total = s.passed + s.dropped + s.reordered;
        assert!(s.dropped * 100 < total * 5, "{s:?}");
    }
}

/// Where a corrupted byte was caught, if it was.
#[derive(Debug, Default)]
struct Catch {
    /// Destination MAC no longer ours (and not group): smoltcp's MAC filter drops it.
    dst_mac: u64,
    /// Byte in the source MAC, or a destination MAC turned into a group address: smoltcp
    /// accepts the frame, whose IP packet is intact; harmless.
    harmless_mac: u64,
    /// EtherType changed: dropped as unknown, or fails to parse as the other protocol.
    ethertype: u64,
    /// IPv4 header failed to parse or its checksum is wrong.
    ipv4_header: u64,
    /// TCP checksum wrong (pseudo-header, TCP header or payload byte changed).
    tcp_checksum: u64,
    /// Inside an ARP packet: nothing would catch it.
    arp: u64,
    /// Passed every check: would reach TCP corrupted.
    undetected: u64,
}

fn classify(c: &CorruptedFrame, ours: EthernetAddress, catch: &mut Catch) {
    let f = &c.frame;
    let eth = EthernetFrame::new_checked(&f[..]).unwrap();
    let dst = eth.dst_addr();
    match c.offset {
        0..=5 if dst != ours && !dst.is_broadcast() && !dst.is_multicast() => {
            return catch.dst_mac += 1
        }
        0..=11 => return catch.harmless_mac += 1,
        12 | 13 => return catch.ethertype += 1,
        _ => {}
    }
    if eth.ethertype() == EthernetProtocol::Arp {
        return catch.arp += 1;
    }
    assert_eq!(eth.ethertype(), EthernetProtocol::Ipv4);
    let ip = match Ipv4Packet::new_checked(&f[14..]) {
        Ok(ip) if ip.verify_checksum() => ip,
        _ => return catch.ipv4_header += 1,
    };
    let (src, dstip) = (
        IpAddress::Ipv4(ip.src_addr()),
        IpAddress::Ipv4(ip.dst_addr()),
    );
    let hl = usize::from(ip.header_len());
    let tl = usize::from(ip.total_len());
    match TcpPacket::new_checked(&f[14 + hl..14 + tl]) {
        Ok(t) if t.verify_checksum(&src, &dstip) => catch.undetected += 1,
        _ => catch.tcp_checksum += 1,
    }
}

#[test]
fn echo_1mib_with_corruption() {
    let data = support::pattern(MIB, 13);
    let (la, lb) = links(1500);
    // Corruption starts once the connection is established: ARP (exchanged before) has no
    // checksum, and a corrupted sender MAC in an ARP reply would poison smoltcp's neighbor
    // cache for 60 s and stall the transfer (an Ethernet FCS prevents that on real wires;
    // TAP and memory links have none).
    let mut la = Faults::new(la, 5, FaultConfig::none(), FaultConfig::none()).unwrap();
    la.record_corruptions(true);
    let t0 = Instant::from_secs(1);
    let mut a = Host::new(la, 1, TcpConfig::default(), t0);
    let mut b = Host::new(lb, 2, TcpConfig::default(), t0);
    let f = FaultConfig {
        corrupt: 0.03,
        ..Default::default()
    };
    let out = echo(&mut a, &mut b, &data, Duration::from_secs(600), |a| {
        let l = a.dev.link_mut();
        l.set_config(Direction::Tx, f).unwrap();
        l.set_config(Direction::Rx, f).unwrap();
    });
    let tx = a.dev.link().stats(Direction::Tx);
    let rx = a.dev.link().stats(Direction::Rx);
    let recs = a.dev.link_mut().take_corruptions();
    assert_eq!(recs.len() as u64, tx.corrupted + rx.corrupted);
    assert!(
        tx.corrupted > 10 && rx.corrupted > 10,
        "tx {tx:?} rx {rx:?}"
    );
    let mac_a = EthernetAddress([2, 0, 0, 0, 0, 1]);
    let mac_b = EthernetAddress([2, 0, 0, 0, 0, 2]);
    let mut catch = Catch::default();
    for r in &recs {
        let ours = match r.direction {
            Direction::Tx => mac_b, // sent by A, addressed to B
            Direction::Rx => mac_a,
        };
        classify(r, ours, &mut catch);
    }
    println!(
        "corruption: {} frames corrupted ({tx:?} / {rx:?}) -> {catch:?}; {} virtual",
        recs.len(),
        out.elapsed
    );
    // The transfer was byte-exact (checked in `echo`), and no corrupted byte could have
    // reached TCP's stream: every corruption of an IPv4 packet fails the IPv4 or the TCP
    // checksum (a one-byte change always changes a 16-bit ones' complement sum).
    assert_eq!(catch.undetected, 0, "{catch:?}");
    assert_eq!(catch.arp, 0, "no ARP after the handshake: {catch:?}");
    assert!(catch.tcp_checksum > 0 && catch.ipv4_header > 0, "{catch:?}");
    // Most bytes of a full frame are TCP payload, so most corruptions land there.
    assert!(catch.tcp_checksum > recs.len() as u64 / 2, "{catch:?}");
}

#[test]
fn same_seed_same_run() {
    // Determinism: two runs with faults take exactly the same steps and virtual time.
    let run = || {
        let data = support::pattern(256 * 1024, 3);
        let (la, lb) = links(1500);
        let f = FaultConfig {
            drop: 0.03,
            duplicate: 0.01,
            reorder: 0.03,
            ..Default::default()
        };
        let la = Faults::new(la, 99, f, f).unwrap();
        let t0 = Instant::from_secs(1);
        let mut a = Host::new(la, 1, TcpConfig::default(), t0);
        let mut b = Host::new(lb, 2, TcpConfig::default(), t0);
        let out = echo(&mut a, &mut b, &data, Duration::from_secs(600), |_| {});
        (out.steps, out.elapsed, a.dev.stats(), b.dev.stats())
    };
    assert_eq!(run(), run());
}
