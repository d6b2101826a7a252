//! Root-only: device removal at seeded random moments under load. One
//! namespace pair is reused; each iteration starts a `removal-peer` server in A and a
//! client in B (three QPs with RDMA Writes, Reads and Sends in flight, plus a churn
//! of connection set-up and teardown), tears the server's or the client's TAP down
//! (`ip link del` or `ip link set down`) at the iteration's moment — before connect,
//! during address resolution, during the MPA exchange, under full load, during
//! disconnect, during destroy —, waits for both to exit, checks the removal rules
//! (`removal_support::check_outcome` and each peer's own invariants), and
//! re-creates the TAP.
//!
//! `REMOVAL_ITERATIONS` (default 50), `REMOVAL_SEED` (default: fixed) change the run;
//! `scripts/removal-long.sh` runs 500. A peer that hangs is killed by the harness's
//! watchdog after its stacks were dumped (gdb), and the iteration fails with them.

use std::time::Instant;

mod removal_support;

use removal_support::{distribution, run_iteration, Bench, Moment, Outcome, Plan};

const PEER: &str = env!("CARGO_BIN_EXE_removal-peer");

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn removal_at_random_moments_under_load() {
    if !netlab::netns::is_root() {
        eprintln!("skipping removal_at_random_moments_under_load: needs root (network namespaces and TAPs)");
        return;
    }
    let iterations = env_u64("REMOVAL_ITERATIONS", 50);
    let seed = env_u64("REMOVAL_SEED", 0x5eed_0008);
    let bench = Bench::create().expect("topology");
    let names = bench.topology().namespaces();
    let t0 = Instant::now();
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut failures = Vec::new();
    let from = env_u64("REMOVAL_FROM", 0);
    for i in from..from + iterations {
        let plan = Plan::new(seed, i);
        match run_iteration(&bench, PEER.as_ref(), &plan) {
            Ok(o) => {
                println!(
                    "#{i} {:?} {} {:?}: notice {:.1} ms (ip {:.1} ms), removed side exit {:.0} ms, survivor exit {:.0} ms, client phase {:?}, {} WRs ({} flushed), {} DeviceRemoval ({} destroyed by return)",
                    o.plan.moment,
                    if o.plan.server_side { "server" } else { "client" },
                    o.plan.action,
                    o.notice_ms,
                    o.ip_ms,
                    o.removed_exit_ms,
                    o.survivor_exit_ms,
                    o.client_phase_at_action,
                    o.wrs,
                    o.flushed,
                    o.device_removals,
                    o.destroyed_by_return
                );
                outcomes.push(o);
            }
            Err(e) => {
                eprintln!("#{i} FAILED: {e}");
                failures.push(format!("#{i}: {e}"));
                if failures.len() >= 3 {
                    break;
                }
            }
        }
    }
    drop(bench);
    assert_eq!(netlab::leftover_namespaces(&names), Vec::<String>::new());
    let col = |f: fn(&Outcome) -> f64| outcomes.iter().map(f).collect::<Vec<f64>>();
    println!(
        "{} iterations in {:?} (seed {seed:#x})",
        outcomes.len(),
        t0.elapsed()
    );
    println!(
        "detection latency ms: {}",
        distribution(&col(|o| o.notice_ms))
    );
    println!(
        "removed side exit ms: {}",
        distribution(&col(|o| o.removed_exit_ms))
    );
    println!(
        "survivor exit ms: {}",
        distribution(&col(|o| o.survivor_exit_ms))
    );
    for m in Moment::ALL {
        let n = outcomes.iter().filter(|o| o.plan.moment == m).count();
        let phases: Vec<_> = outcomes
            .iter()
            .filter(|o| o.plan.moment == m)
            .map(|o| o.client_phase_at_action.clone().unwrap_or_default())
            .collect();
        println!("{m:?}: {n} iterations, client phase at the action {phases:?}");
    }
    assert!(
        failures.is_empty(),
        "{} failed iterations:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert_eq!(outcomes.len() as u64, iterations);
    // Every kind of moment was exercised.
    if iterations >= Moment::ALL.len() as u64 {
        for m in Moment::ALL {
            assert!(
                outcomes.iter().any(|o| o.plan.moment == m),
                "{m:?} never ran"
            );
        }
    }
    let wrs: u64 = outcomes.iter().map(|o| o.wrs).sum();
    assert!(wrs > 0, "no work request was posted");
}
