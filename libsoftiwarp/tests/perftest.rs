//! Unmodified perftest (Debian 12, 4.5) over libsoftiwarp with `-R` (rdma_cm), as an
//! unprivileged user, two processes on one UDP link: write, read and
//! send bandwidth and write and send latency, at the default sizes and at
//! `-s 1048576 -n 200`. Drop-in mode (the harder one: perftest's libmlx5/libefa need
//! rdma-core's provider symbols at load time).

mod support;

use support::{link_pair, perftest_pair, require, LibDir, PerftestEnd};

/// Runs `prog -R extra` as server and client ([`perftest_pair`]) on a UDP link from
/// port `base`, repeated on new ports up to twice if the client raced the server's
/// listen. Returns the next free port base.
fn run(lib: &LibDir, mut base: u16, prog: &str, extra: &[&str], size: u64, iters: u64) -> u16 {
    for attempt in 1..=3 {
        let (srv_dev, cli_dev, addr) = link_pair(base);
        // MPA peer-to-peer mode: ib_write_lat's passive side writes first, which plain
        // MPA forbids until the initiator's first FPDU (RFC 5044 7.1.2); the RTR is it.
        let (srv_dev, cli_dev) = (format!("{srv_dev},p2p=on"), format!("{cli_dev},p2p=on"));
        base += 2;
        let mut cargs = extra.to_vec();
        cargs.push(&addr);
        let server = PerftestEnd {
            device: Some(&srv_dev),
            args: extra,
        };
        let client = PerftestEnd {
            device: Some(&cli_dev),
            args: &cargs,
        };
        if perftest_pair(lib, prog, server, client, (size, iters), attempt < 3).is_some() {
            return base;
        }
    }
    unreachable!("the last attempt asserts")
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

/// RFC 7306 atomics (issue 30): `ib_atomic_bw` and `ib_atomic_lat`, Fetch-and-Add and
/// Compare-and-Swap, 8-byte operations at perftest's default iteration counts. The
/// device reports `atomic_cap` `IBV_ATOMIC_HCA`; perftest registers its buffers with
/// `IBV_ACCESS_REMOTE_ATOMIC` and posts `IBV_WR_ATOMIC_*` WRs with `wr.atomic`.
#[test]
fn perftest_atomic_tests_complete_with_fetch_and_add_and_compare_and_swap() {
    let progs = ["ib_atomic_bw", "ib_atomic_lat"];
    if !progs.iter().all(|p| require(p)) {
        return;
    }
    let lib = LibDir::new("perftest-atomic");
    let mut base = 7500;
    for prog in progs {
        for kind in ["FETCH_AND_ADD", "CMP_AND_SWAP"] {
            base = run(&lib, base, prog, &["-A", kind], 8, 1000);
        }
    }
}
