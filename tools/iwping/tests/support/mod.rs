//! Shared by iwping's two-process tests: the check of a client's and a server's output
//! after an rping exchange with `-v`.

use std::process::Output;

/// Both exited 0; the client printed `n` pings as rping does (the fourth one checked to
/// the byte) and the server `n` served pings.
pub fn check_pings(client: &Output, server: &Output, n: usize) {
    let c = String::from_utf8_lossy(&client.stdout);
    let s = String::from_utf8_lossy(&server.stdout);
    assert!(
        client.status.success(),
        "client {}\n{c}\n{}",
        client.status,
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(
        server.status.success(),
        "server {}\n{s}\n{}",
        server.status,
        String::from_utf8_lossy(&server.stderr)
    );
    let pings: Vec<&str> = c.lines().filter(|l| l.starts_with("ping data: ")).collect();
    assert_eq!(pings.len(), n, "{c}");
    assert_eq!(
        pings[3],
        "ping data: rdma-ping-3: DEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstu"
    );
    let served = s
        .lines()
        .filter(|l| l.starts_with("server ping data: "))
        .count();
    assert_eq!(served, n, "{s}");
}
