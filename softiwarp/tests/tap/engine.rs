//! Root-only: two devices on real TAPs in two network namespaces made by the test
//! (`netlab::netns::TapPair`); each engine thread enters its namespace with `setns(2)`
//! before opening its TAP. Connect, move 64 MiB of ULPDUs (valid DDP segments) verified
//! by checksum, close, and decode the pcap written by one side with `iwdump`: zero errors.
//!
//! A second run moves 1 MiB the same way with TCP segmentation offload on both TAPs (the default) and
//! the fault middleware on one side, both directions: 1% loss, reordering and corruption
//! of wire segments (the middleware cuts the super-segments first); every ULPDU must
//! arrive intact and in order, and the connection must survive (a corruption that got
//! past the TCP checksum would fail MPA's CRC and end it).
//!
//! Skips (with a message) when not run as root. The namespaces and interfaces are removed
//! by `TapPair`'s `Drop`, also when the test fails; the test checks that at its end.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use netlab::netns::{is_root, unique_tag, TapPair, TapPairConfig};
use softiwarp::link::FaultConfig;
use softiwarp::transport::{CloseMode, ConnEvent, MpaParams};
use softiwarp::{Device, DeviceConfig, FaultSpec, LinkConfig};

const PORT: u16 = 4791;
const T: Duration = Duration::from_secs(20);
const TOTAL: usize = 64 << 20;

pub(crate) fn ns_path(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/netns/{name}"))
}

/// A word-wise 64-bit hash of a byte stream.
fn feed(h: &mut u64, data: &[u8]) {
    for c in data.chunks(8) {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        *h = (*h ^ u64::from_le_bytes(w))
            .wrapping_mul(0x0100_0000_01b3)
            .rotate_left(17);
    }
}

/// An RDMA Write ULPDU (tagged header, STag 0x42, TO = `to`) of `len` bytes with
/// payload from a xorshift generator.
fn write_ulpdu(state: &mut u64, to: u64, len: usize) -> Vec<u8> {
    let mut u = vec![0u8; len];
    for chunk in u[14..].chunks_mut(8) {
        let mut x = *state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *state = x;
        let v = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    ddp_rdmap::Header {
        opcode: ddp_rdmap::Opcode::Write,
        last: true,
        buffer: ddp_rdmap::ddp::BufferModel::Tagged { stag: 0x42, to },
    }
    .emit(&mut u)
    .expect("header");
    u
}

#[test]
fn tap_64mib_across_namespaces_with_clean_pcap() {
    with_topology(
        "tap_64mib_across_namespaces_with_clean_pcap",
        |topo, pcap| run(topo, Some(pcap), None, TOTAL),
    );
}

#[test]
fn tap_1mib_with_offload_through_loss_reordering_and_corruption() {
    let faults = FaultConfig {
        drop: 0.01,
        reorder: 0.01,
        corrupt: 0.01,
        corrupt_from: 14,
        ..FaultConfig::none()
    };
    let spec = FaultSpec {
        seed: 19,
        tx: faults,
        rx: faults,
    };
    with_topology(
        "tap_1mib_with_offload_through_loss_reordering_and_corruption",
        |topo, _| run(topo, None, Some(spec), 1 << 20),
    );
}

/// Runs `f` on a new topology (skipping without root), then checks nothing of it is
/// left, also when `f` panicked.
pub(crate) fn with_topology(
    name: &str,
    f: impl FnOnce(&TapPair, &PathBuf) + std::panic::UnwindSafe,
) {
    if !is_root() {
        eprintln!("skipping {name}: needs root");
        return;
    }
    let topo = TapPair::create(TapPairConfig::default()).expect("topology");
    let names = [topo.a.name().to_owned(), topo.b.name().to_owned()];
    let pcap = std::env::temp_dir().join(format!("sw-engine-tap-{}.pcap", unique_tag()));
    let outcome = std::panic::catch_unwind(|| f(&topo, &pcap));
    drop(topo);
    let _ = std::fs::remove_file(&pcap);
    // Nothing of the topology survives it.
    let list = netlab::netns::ip_output(&["netns", "list"]).unwrap();
    for n in &names {
        assert!(!list.contains(n.as_str()), "namespace {n} left behind");
    }
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}

/// Moves `total` bytes of ULPDUs from A to B; with `pcap`, A's capture is checked; with
/// `faults`, A's link injects them.
fn run(topo: &TapPair, pcap: Option<&PathBuf>, faults: Option<FaultSpec>, total: usize) {
    let (ip_a, ip_b) = (Ipv4Addr::new(10, 99, 0, 1), Ipv4Addr::new(10, 99, 0, 2));
    let mut link_a = LinkConfig::tap(&topo.tap_a);
    if let Some(p) = pcap {
        link_a = link_a.with_pcap(p);
    }
    if let Some(f) = faults {
        link_a = link_a.with_faults(f);
    }
    let mut ca = DeviceConfig::new("tapA", link_a, ip_a, 24);
    ca.netns = Some(ns_path(topo.a.name()));
    let mut cb = DeviceConfig::new("tapB", LinkConfig::tap(&topo.tap_b), ip_b, 24);
    cb.netns = Some(ns_path(topo.b.name()));
    let a = Device::open(ca).expect("device A");
    let b = Device::open(cb).expect("device B");
    assert_eq!(a.mtu(), 1500);
    let listener = b.listen(PORT, 4).unwrap();
    let t0 = Instant::now();
    let conn = a
        .connect(
            ip_b,
            PORT,
            MpaParams {
                private_data: b"over the TAP".to_vec(),
                ird: 8,
                ord: 8,
                settings: Some(mpa::negotiate::LocalSettings {
                    crc: mpa::negotiate::CrcPolicy::Wanted,
                    ..Default::default()
                }),
            },
        )
        .unwrap();
    let req = listener.next_request(T).expect("connect request");
    assert_eq!(req.private_data(), b"over the TAP");
    let served = req.accept(b"ok", 8, 8).unwrap();
    let est = conn.wait_established(T).unwrap();
    println!("established in {:?}", t0.elapsed());
    assert!(est.agreed.crc);
    let mulpdu = est.mulpdu;

    let start = Instant::now();
    let sender = std::thread::spawn(move || {
        let (mut h, mut state, mut to, mut sent, mut n) = (0u64, 0x9e37_79b9u64, 0u64, 0, 0u64);
        while sent < total {
            let len = if n % 5 == 4 {
                14 + (n as usize * 97) % (mulpdu - 14)
            } else {
                mulpdu
            };
            let len = len.min(total - sent).max(14);
            let u = write_ulpdu(&mut state, to, len);
            feed(&mut h, &u);
            to += (len - 14) as u64;
            sent += len;
            n += 1;
            conn.send_ulpdu_vec(u, T).unwrap();
        }
        (conn, h, n)
    });
    let (mut h, mut got, mut n) = (0u64, 0usize, 0u64);
    while got < total {
        let u = served.recv_ulpdu(T).expect("receive");
        feed(&mut h, &u);
        got += u.len();
        n += 1;
    }
    let elapsed = start.elapsed();
    let (conn, sent_h, sent_n) = sender.join().unwrap();
    assert_eq!((got, n), (total, sent_n));
    assert_eq!(h, sent_h, "checksum mismatch");
    println!(
        "{} MiB in {n} ULPDUs over TAP/bridge/veth: {elapsed:?}, {:.0} MB/s",
        total >> 20,
        total as f64 / elapsed.as_secs_f64() / 1e6
    );
    conn.close(CloseMode::Graceful).unwrap();
    assert_eq!(conn.wait_ended(T), Some(None));
    assert_eq!(served.wait_ended(T), Some(None));
    let ev: Vec<ConnEvent> = std::iter::from_fn(|| served.next_event(Duration::ZERO)).collect();
    assert_eq!(&ev[1..], &[ConnEvent::Disconnected, ConnEvent::Closed]);
    // Closing the devices flushes the capture.
    drop((a, b));

    let Some(pcap) = pcap else {
        return;
    };
    let report = iwdump::dissect_file(pcap).expect("pcap");
    assert!(
        report.errors.is_empty(),
        "{} errors, first: {:?}",
        report.errors.len(),
        report.errors.first()
    );
    assert_eq!(report.connections.len(), 1);
    let c = &report.connections[0];
    assert_eq!(c.crc, Some(true));
    assert_eq!(c.fpdus_from_initiator, n);
    println!(
        "pcap: {} frames, {} FPDUs, {} warnings",
        report.frames,
        report.fpdus,
        report.warnings.len()
    );
}
