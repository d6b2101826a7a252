//! `iwperf server` bounds what a client's test may make it allocate (a
//! 60-byte request for 1 GiB Reads made it allocate about 2 GiB). Over the in-memory
//! link, no root: a request beyond each limit is rejected with the reason in the
//! Reject's private data, which the client reports with the connection-failure status;
//! the server keeps listening and then serves a test within its limits.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::mpsc;
use std::time::Duration;

use bench::iwperf::conn::DeviceOptions;
use bench::iwperf::datapath::{RunLength, ServerLimits, Tuning};
use bench::iwperf::peer::{run_client, run_server, ClientTest};
use bench::iwperf::wire::{Mode, Op, TestParams};
use bench::iwperf::{IwperfError, EXIT_CONNECTION};
use softiwarp::link::{MemoryConfig, MemoryLink};

const PORT: u16 = 18515;
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 236, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 236, 0, 2);

fn options(name: &str, link: MemoryLink, ip: Ipv4Addr) -> DeviceOptions {
    DeviceOptions {
        progress: softiwarp::ProgressMode::Engine,
        ..DeviceOptions::memory(name, link, ip)
    }
}

fn test(op: Op, size: u32, qps: u16, tx_depth: u16) -> ClientTest {
    ClientTest {
        server: SocketAddrV4::new(SERVER, PORT),
        ops: vec![op],
        mode: Mode::Bandwidth,
        size,
        qps,
        tx_depth,
        verify: true,
        length: RunLength::Iters(50),
        connect_timeout: Duration::from_secs(10),
        indices: None,
    }
}

/// Runs a server with `limits` (waiting at most 3 s for a test it accepts) and one
/// client with `t` against it, each with its own soft device on one memory link.
/// Returns the client's error text and exit status, and the server's connection count
/// and error text.
fn refused(tag: &str, limits: ServerLimits, t: &ClientTest) -> (String, u8, usize, String) {
    let (a, b) = MemoryLink::pair(MemoryConfig {
        mtu: 9000,
        names: (format!("{tag}-a"), format!("{tag}-b")),
        ..MemoryConfig::default()
    })
    .expect("memory link");
    let tuning = Tuning {
        limits,
        ..Tuning::default()
    };
    let (ready_tx, ready_rx) = mpsc::channel();
    let sdev = options(&format!("{tag}s"), a, SERVER);
    let server = std::thread::spawn(move || {
        run_server(sdev, PORT, 16, tuning, Duration::from_secs(3), move |_| {
            let _ = ready_tx.send(());
        })
    });
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server ready");
    let cdev = options(&format!("{tag}c"), b, CLIENT);
    let (report, err) = run_client(cdev, t, Tuning::default(), &mut |_| {});
    let err = err.expect("a refused test fails");
    assert!(matches!(err, IwperfError::Connection(_)), "{err}");
    let (summary, serr) = server.join().expect("server thread");
    let serr = serr.expect("the server waited for a test within its limits, then timed out");
    (
        err.to_string(),
        report.exit_code,
        summary.connections,
        serr.to_string(),
    )
}

const LIMITS: ServerLimits = ServerLimits {
    max_size: 4096,
    max_qps: 2,
    max_tx_depth: 32,
    max_memory: 1 << 20,
};

#[test]
fn a_message_size_beyond_the_limit_is_rejected_with_the_reason_and_the_server_goes_on_listening() {
    let (client, code, served, server) = refused("lsz", LIMITS, &test(Op::Read, 8192, 1, 16));
    assert_eq!(code, EXIT_CONNECTION);
    assert!(
        client.contains("RDMA_CM_EVENT_REJECTED")
            && client.contains(
                "iwperf: message size 8192 exceeds the server's limit of 4096 (iwperf server --max-size)"
            ),
        "{client}"
    );
    // The server made nothing for it and kept listening until its own timeout.
    assert_eq!(served, 0);
    assert!(
        server.contains("waiting for a connection request"),
        "{server}"
    );
}

#[test]
fn a_test_needing_more_buffer_memory_than_the_limit_is_rejected() {
    // Write, verified: the server keeps tx_depth slots of `size` bytes and as many
    // patterns per connection: 2 x 32 x 4096 = 256 KiB, times 2 QPs = 512 KiB. With a
    // 256 KiB limit that is refused.
    let limits = ServerLimits {
        max_memory: 256 << 10,
        ..LIMITS
    };
    let (client, code, served, _) = refused("lmem", limits, &test(Op::Write, 4096, 2, 32));
    assert_eq!(code, EXIT_CONNECTION);
    assert!(
        client.contains(
            "iwperf: buffer memory (bytes) 524288 exceeds the server's limit of 262144 (iwperf server --max-memory)"
        ),
        "{client}"
    );
    assert_eq!(served, 0);
}

#[test]
fn limits_name_the_first_limit_exceeded() {
    let limits = ServerLimits {
        max_size: 4096,
        max_qps: 2,
        max_tx_depth: 32,
        max_memory: 1 << 20,
    };
    let p = |size, qps, tx_depth| TestParams {
        op: Op::Write,
        mode: Mode::Bandwidth,
        verify: true,
        size,
        qps,
        index: 0,
        tx_depth,
        client_mr: Default::default(),
        rd_depth: 0,
    };
    assert_eq!(limits.check(&p(4096, 2, 32), 1 << 19), Ok(()));
    assert_eq!(limits, LIMITS);
    assert_eq!(
        limits.check(&p(4097, 2, 32), 0),
        Err(
            "message size 4097 exceeds the server's limit of 4096 (iwperf server --max-size)"
                .into()
        )
    );
    assert_eq!(
        limits.check(&p(1, 3, 32), 0),
        Err("QP count 3 exceeds the server's limit of 2 (iwperf server --max-qps)".into())
    );
    assert_eq!(
        limits.check(&p(1, 1, 33), 0),
        Err(
            "send-queue depth 33 exceeds the server's limit of 32 (iwperf server --max-tx-depth)"
                .into()
        )
    );
    assert_eq!(
        limits.check(&p(1, 2, 32), (1 << 19) + 1),
        Err(
            "buffer memory (bytes) 1048578 exceeds the server's limit of 1048576 (iwperf server --max-memory)"
                .into()
        )
    );
    // A 60-byte request for 1 GiB Reads on 65,535 QPs, as the attacker sent,
    // against the defaults.
    let d = ServerLimits::default();
    assert!(d
        .check(&p(1 << 30, 1, 16), 0)
        .unwrap_err()
        .contains("--max-size"));
    assert!(d
        .check(&p(4096, 65535, 16), 0)
        .unwrap_err()
        .contains("--max-qps"));
}

#[test]
fn a_second_request_for_an_index_already_in_is_rejected_as_busy() {
    // A client announcing 2 connections but asking twice for index 0: the server sets up
    // one connection for it, never a third buffer set; the duplicate is refused.
    use bench::iwperf::conn::{close_soft_cm, open_device, soft_cm, CmSide};
    use bench::iwperf::datapath::{Role, Side};
    use bench::iwperf::wire::MrInfo;

    let (a, b) = MemoryLink::pair(MemoryConfig {
        mtu: 9000,
        names: ("ldup-a".into(), "ldup-b".into()),
        ..MemoryConfig::default()
    })
    .expect("memory link");
    let (ready_tx, ready_rx) = mpsc::channel();
    let sdev = options("ldups", a, SERVER);
    let server = std::thread::spawn(move || {
        run_server(
            sdev,
            PORT,
            16,
            Tuning::default(),
            Duration::from_secs(3),
            move |_| {
                let _ = ready_tx.send(());
            },
        )
    });
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server ready");
    let device = open_device(options("ldupc", b, CLIENT)).expect("client device");
    let soft = soft_cm(device).expect("client CM");
    let provider = softiwarp::cm::provider::SoftCm::new(&soft);
    let p = TestParams {
        op: Op::Write,
        mode: Mode::Bandwidth,
        verify: false,
        size: 1024,
        qps: 2,
        index: 0,
        tx_depth: 4,
        client_mr: MrInfo::default(),
        rd_depth: 0,
    };
    let err = CmSide::run(&provider, |mut cm| {
        let mut side = Side::new(Role::Client, Tuning::default());
        let r = cm.connect_all(
            SocketAddrV4::new(SERVER, PORT),
            &[p, p],
            Duration::from_secs(10),
            &mut side,
        );
        side.release();
        cm.close(Vec::new());
        r.err()
    });
    drop(provider);
    assert_eq!(close_soft_cm(soft), 0, "ids left alive");
    let Some(err) = err else {
        panic!("the duplicate was accepted");
    };
    let text = err.to_string();
    assert!(
        text.contains("RDMA_CM_EVENT_REJECTED")
            && text.contains("iwperf: busy (a connection of this test is already in)"),
        "{text}"
    );
    let (summary, serr) = server.join().expect("server thread");
    // The server never saw its second connection, so it gave up waiting for it.
    assert_eq!(summary.connections, 0);
    assert!(serr.is_some());
}
