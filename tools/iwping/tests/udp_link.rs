//! `iwping` server and client as two processes on the UDP link (`--udp`/`--udp-peer`,
//! loopback datagrams): rping's exchange with `-V` verification needs neither root nor
//! a TAP. The pings are checked line by line, as rping prints them.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::check_pings;

#[test]
fn ten_verified_pings_between_two_processes_on_the_udp_link() {
    let iwping = env!("CARGO_BIN_EXE_iwping");
    let a = 30_000 + (std::process::id() % 10_000) as u16 * 2;
    let b = a + 1;
    // One side's command: its UDP ports, its address, its role's options.
    let side = |local: u16, remote: u16, ip: &str, role: &str| {
        let mut c = Command::new(iwping);
        c.args(["--udp", &format!("127.0.0.1:{local}")])
            .args(["--udp-peer", &format!("127.0.0.1:{remote}")])
            .args(["--ip", ip, role, "-a", "10.77.1.1", "-C", "10", "-v", "-V"])
            .args(["--timeout", "30"])
            .stdin(Stdio::null());
        c
    };
    let server = side(a, b, "10.77.1.1/24", "-s")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("server");
    std::thread::sleep(Duration::from_millis(300));
    let client = side(b, a, "10.77.1.2/24", "-c").output().expect("client");
    let server = server.wait_with_output().expect("server exit");
    check_pings(&client, &server, 10);
}
