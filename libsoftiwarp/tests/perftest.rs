//! Unmodified perftest (Debian 12, 4.5) over libsoftiwarp with `-R` (rdma_cm), as an
//! unprivileged user, two processes on one UDP link (issue 18, test 1): write, read and
//! send bandwidth and write and send latency, at the default sizes and at
//! `-s 1048576 -n 200`. Drop-in mode (the harder one: perftest's libmlx5/libefa need
//! rdma-core's provider symbols at load time).

mod support;

use std::time::Duration;
use support::{link_pair, require, spawn, LibDir, Mode};

/// Runs `prog -R extra` as server and client; both must exit 0 and the client must
/// print its result row for `size` bytes with `iters` iterations.
fn run(lib: &LibDir, base: u16, prog: &str, extra: &[&str], size: u64, iters: u64) {
    let (srv_dev, cli_dev, addr) = link_pair(base);
    let mut sargs = vec!["-R"];
    sargs.extend_from_slice(extra);
    let mut cargs = sargs.clone();
    cargs.push(&addr);
    let server = spawn(lib, Mode::DropIn, &srv_dev, prog, &sargs);
    std::thread::sleep(Duration::from_millis(700));
    let client = spawn(lib, Mode::DropIn, &cli_dev, prog, &cargs);
    let c = client.wait(Duration::from_secs(180));
    let s = server.wait(Duration::from_secs(30));
    assert!(c.ok(), "{prog} {extra:?} client: {c:?}");
    assert!(s.ok(), "{prog} {extra:?} server: {s:?}");
    assert!(c.stdout.contains("Transport type : IW"), "{}", c.stdout);
    for (side, o) in [("client", &c), ("server", &s)] {
        let all = format!("{}{}", o.stdout, o.stderr);
        assert!(
            !all.contains("Failed") && !all.contains("libsoftiwarp:"),
            "{prog} {extra:?} {side}: {all}"
        );
    }
    let row = c
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&size.to_string()))
        .unwrap_or_else(|| panic!("{prog} {extra:?}: no result row: {}", c.stdout));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], iters.to_string(), "{row}");
}

#[test]
fn perftest_rdma_cm_tests_complete_at_default_sizes_and_at_1_mib() {
    let progs = [
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_write_lat",
        "ib_send_lat",
    ];
    if !progs.iter().all(|p| require(p)) {
        return;
    }
    let lib = LibDir::new("perftest");
    // (program, default size, default iterations)
    let defaults = [
        ("ib_write_bw", 65536, 5000),
        ("ib_read_bw", 65536, 1000),
        ("ib_send_bw", 65536, 1000),
        ("ib_write_lat", 2, 1000),
        ("ib_send_lat", 2, 1000),
    ];
    let mut base = 7400;
    for (prog, size, iters) in defaults {
        run(&lib, base, prog, &[], size, iters);
        base += 2;
        run(
            &lib,
            base,
            prog,
            &["-s", "1048576", "-n", "200"],
            1_048_576,
            200,
        );
        base += 2;
    }
}
