//! Shared receive queues through the C ABI (issue 30): Debian's unmodified
//! `ib_send_bw --use-srq` and `ib_send_lat --use-srq` over the library (rdma_cm, the
//! host's kernel TCP on 127.0.0.1, as `nobody` when root), and `tests/srq_events.c`,
//! a C program that checks the SRQ verbs' values and errnos, the limit event
//! (`IBV_EVENT_SRQ_LIMIT_REACHED`, once, then the limit reads 0) and
//! `IBV_EVENT_QP_LAST_WQE_REACHED` when an SRQ QP goes to Error.

mod support;

use support::{free_port, perftest_pair, require, run_c_program, LibDir, PerftestEnd};

#[test]
fn perftest_send_bw_and_lat_with_use_srq_complete() {
    let progs = [("ib_send_bw", 65536, 1000), ("ib_send_lat", 2, 1000)];
    if !progs.iter().all(|(p, _, _)| require(p)) {
        return;
    }
    let lib = LibDir::new("srq-perftest");
    for (prog, size, iters) in progs {
        for attempt in 1..=3 {
            let port = free_port().to_string();
            let server = PerftestEnd {
                device: Some("netdev=lo"),
                args: &["--use-srq", "-p", &port],
            };
            let client = PerftestEnd {
                device: Some("netdev=lo"),
                args: &["--use-srq", "-p", &port, "127.0.0.1"],
            };
            if let Some(out) = perftest_pair(&lib, prog, server, client, (size, iters), attempt < 3)
            {
                assert!(out.contains("Using SRQ      : ON"), "{prog}: {out}");
                break;
            }
        }
    }
}

#[test]
fn srq_limit_and_last_wqe_reached_reach_a_c_program() {
    let port = free_port().to_string();
    let Some(o) = run_c_program("srq_events", &[], &[&port]) else {
        return;
    };
    assert!(o.ok(), "{o:?}");
    for line in [
        "granted max_wr >= asked: 1",
        "ibv_post_srq_recv with 2 SGEs on a max_sge 1 SRQ: 22",
        "ibv_post_recv on an SRQ QP: 22",
        "ibv_modify_srq(IBV_SRQ_MAX_WR): no resize: 95",
        "  srq_limit armed: 6",
        "completions: the SRQ's WRs in posting order, on the server QP, data placed",
        "async event SRQ limit reached (the one awaited)",
        "  srq_limit after the event (disarmed): 0",
        "ibv_destroy_srq while the QP uses it: 16",
        "async event last WQE reached (the one awaited)",
        "ibv_destroy_srq once its QP is gone: 0",
        "ibv_destroy_srq again: 22",
    ] {
        assert!(o.stdout.lines().any(|l| l == line), "{line:?} in {o:?}");
    }
    assert!(o.stdout.ends_with("ok\n"), "{o:?}");
    assert!(!o.stderr.contains("libsoftiwarp:"), "{o:?}");
}
