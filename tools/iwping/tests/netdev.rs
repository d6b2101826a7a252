//! `iwping --netdev lo`: server and client as two processes on the soft device over the
//! host's kernel TCP (`softiwarp::LinkConfig::netdev`), no root: rping's exchange with
//! `-V`, checked line by line; an interface that does not exist is one line and status 3,
//! an option of a frame link with `--netdev` a usage error (status 2).

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::check_pings;

/// A kernel TCP port free on 127.0.0.1 right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether the kernel lists a TCP socket listening on `port` (`/proc/net/tcp`, state
/// 0A): the server's device listens on kernel sockets.
fn listening(port: u16) -> bool {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let want = format!(":{port:04X}");
    tcp.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
    })
}

#[test]
fn five_verified_pings_over_kernel_tcp_on_lo() {
    let iwping = env!("CARGO_BIN_EXE_iwping");
    let port = free_port().to_string();
    let side = |role: &str| {
        let mut c = Command::new(iwping);
        c.args(["--netdev", "lo", role, "-a", "127.0.0.1", "-p", &port])
            .args(["-C", "5", "-v", "-V", "--timeout", "30"])
            .stdin(Stdio::null());
        c
    };
    let mut server = side("-s")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("server");
    let t0 = Instant::now();
    while !listening(port.parse().unwrap()) {
        if let Some(s) = server.try_wait().unwrap() {
            panic!("the server exited before it listened: {s}");
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no listener");
        std::thread::sleep(Duration::from_millis(10));
    }
    let client = side("-c").output().expect("client");
    let server = server.wait_with_output().expect("server exit");
    check_pings(&client, &server, 5);
}

#[test]
fn netdev_errors_are_one_line_with_their_status() {
    let iwping = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_iwping"))
            .args(args)
            .env("RUST_LOG", "off")
            .output()
            .expect("iwping");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.stdout.is_empty(), "{o:?}");
        assert_eq!(err.lines().count(), 1, "{err}");
        (o.status.code(), err)
    };
    let (code, err) = iwping(&["--netdev", "nosuchif9", "-s"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.starts_with("iwping: no interface named 'nosuchif9' (found: "),
        "{err}"
    );
    let (code, err) = iwping(&["--netdev", "lo", "--pcap", "/tmp/x.pcap", "-s"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.trim_end().ends_with("capture with tcpdump -i lo"),
        "{err}"
    );
    let (code, err) = iwping(&["--netdev", "lo", "--ip", "10.0.0.1/24", "-s"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.starts_with("iwping: --ip sets the address"), "{err}");
    let (code, err) = iwping(&["--netdev", "lo", "--device", "siw0", "-s"]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        err.trim_end(),
        "iwping: --netdev lo and --device name two different links: give one"
    );
}
