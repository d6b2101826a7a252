//! `iwperf --mpa-profile chelsio` (the soft device as a Chelsio-like peer):
//! the soft device starts from iw_cxgb4's MPA defaults (`LocalSettings::chelsio()`:
//! revision 2, CRC, peer-to-peer mode with a zero-length Read RTR). Over the in-memory
//! link, no root: Write, Read and Send of 64 KiB, verified, between two soft devices with
//! that profile, and between a Chelsio-profile client and a siw-profile server (which
//! accepts the Read RTR). The wire of the negotiation itself is asserted in
//! `softiwarp/tests/engine/negotiation.rs` (`chelsio_profile_against_itself_and_siw_defaults`).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::mpsc;
use std::time::Duration;

use bench::iwperf::conn::{DeviceOptions, MpaProfile};
use bench::iwperf::datapath::{RunLength, Tuning};
use bench::iwperf::peer::{run_client, run_server, ClientTest};
use bench::iwperf::wire::{Mode, Op, VerifyStatus};
use softiwarp::link::{MemoryConfig, MemoryLink};

const PORT: u16 = 18515;
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 237, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 237, 0, 2);

fn options(
    name: &str,
    link: MemoryLink,
    ip: Ipv4Addr,
    profile: MpaProfile,
    mpa_rev: u8,
) -> DeviceOptions {
    DeviceOptions {
        mpa_rev,
        profile,
        ..DeviceOptions::memory(name, link, ip)
    }
}

/// One server and one client with the given profiles and MPA revision; every op verified.
fn run(tag: &str, server: MpaProfile, client: MpaProfile, mpa_rev: u8) {
    let (a, b) = MemoryLink::pair(MemoryConfig {
        mtu: 9000,
        names: (format!("{tag}-a"), format!("{tag}-b")),
        ..MemoryConfig::default()
    })
    .expect("memory link");
    let (ready_tx, ready_rx) = mpsc::channel();
    let sdev = options(&format!("{tag}s"), a, SERVER, server, mpa_rev);
    let srv = std::thread::spawn(move || {
        run_server(
            sdev,
            PORT,
            16,
            Tuning::default(),
            Duration::from_secs(30),
            move |_| {
                let _ = ready_tx.send(());
            },
        )
    });
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server ready");
    let t = ClientTest {
        server: SocketAddrV4::new(SERVER, PORT),
        ops: vec![Op::Write, Op::Read, Op::Send],
        mode: Mode::Bandwidth,
        size: 65536,
        // One QP per op (iwperf gives the ops to the QPs in turn).
        qps: 3,
        tx_depth: 16,
        verify: true,
        length: RunLength::Iters(64),
        connect_timeout: Duration::from_secs(10),
        indices: None,
    };
    let cdev = options(&format!("{tag}c"), b, CLIENT, client, mpa_rev);
    let (report, err) = run_client(cdev, &t, Tuning::default(), &mut |_| {});
    assert!(err.is_none(), "{tag}: {err:?}");
    assert_eq!(report.exit_code, 0, "{tag}");
    let ops: Vec<Op> = report.bandwidth.iter().map(|r| r.op).collect();
    assert_eq!(ops, [Op::Write, Op::Read, Op::Send], "{tag}");
    for r in &report.bandwidth {
        assert_eq!(r.bytes, 64 * 65536, "{tag} {:?}", r.op);
        assert_eq!(r.verify, VerifyStatus::Passed, "{tag} {:?}", r.op);
    }
    let _ = srv.join().expect("server thread");
}

#[test]
fn chelsio_profile_against_itself_verifies_write_read_and_send() {
    run("chc", MpaProfile::Chelsio, MpaProfile::Chelsio, 2);
}

#[test]
fn chelsio_profile_client_against_a_siw_profile_server_verifies() {
    run("chs", MpaProfile::Siw, MpaProfile::Chelsio, 2);
}

/// MPA revision 1 carries no IRD/ORD (the CM reports 0/0 to the server): the iwperf
/// ends agree on their depth out of band, so Reads work (they failed with
/// `IBV_WC_REM_INV_REQ_ERR` when the server mirrored the 0).
#[test]
fn mpa_rev_1_verifies_write_read_and_send() {
    run("rv1", MpaProfile::Siw, MpaProfile::Siw, 1);
}
