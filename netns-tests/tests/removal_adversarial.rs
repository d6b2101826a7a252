//! Root-only adversarial tests (written by helper breaker89) of device removal (issue 8), at moments
//! the other removal tests do not cover: `ip link set down` followed at once by `up`
//! (a link flap: the device must still be removed exactly once, not half-removed and
//! not resurrected), and removal under many QPs (32) with deep queues, on either side.
//!
//! Each run checks what the random test checks ([`check_outcome`]): on both sides no
//! invariant violated, posted == completed, no leaked object or thread; the removed
//! side noticed within 100 ms and exited within 2 s; exactly one `DeviceRemoval` per
//! long-lived id; the survivor saw no removal and heard `Disconnected` in time.
//! Every namespace, bridge and TAP is removed afterwards, also on failure.

use std::time::Duration;

mod removal_support;

use netlab::{now_ns, wait_exits};
use netns_tests::removal::PeerReport;
use removal_support::{check_outcome, ms, Bench, Moment, Outcome, Plan, TapAction, TCP_TIMEOUT_MS};

use netlab::skip_unless_root;

const PEER: &str = env!("CARGO_BIN_EXE_removal-peer");

/// One pair under load (`load_qps` long-lived connections, no churn), the action on
/// `server_side`'s TAP 300 ms into the load, then (with `up_again`) `ip link set up` at
/// once. Returns the outcome (checked) and the removed side's report.
fn run(
    server_side: bool,
    action: TapAction,
    up_again: bool,
    load_qps: usize,
) -> (Outcome, PeerReport) {
    let bench = Bench::create().expect("topology");
    let names = bench.topology().namespaces();
    let result = (|| -> Result<(Outcome, PeerReport), String> {
        let e = |e: netlab::HarnessError| e.to_string();
        let timeout = TCP_TIMEOUT_MS.to_string();
        let mut server = bench
            .peer(PEER.as_ref(), true)
            .args(["--tcp-timeout-ms", &timeout])
            .spawn()
            .map_err(e)?;
        server
            .wait_for_line(|l| l == "READY", Duration::from_secs(20))
            .map_err(e)?;
        let mut client = bench
            .peer(PEER.as_ref(), false)
            .args(["--tcp-timeout-ms", &timeout])
            .args(["--load-qps", &load_qps.to_string()])
            .spawn()
            .map_err(e)?;
        let armed = bench.arm(server_side, action).map_err(|e| e.to_string())?;
        client
            .wait_for_line(|l| l.starts_with("PHASE load "), Duration::from_secs(60))
            .map_err(e)?;
        std::thread::sleep(Duration::from_millis(300));
        let (t_act, t_done) = armed.fire().map_err(|e| e.to_string())?;
        if up_again {
            let ep = bench.endpoint(server_side);
            let st = netlab::netns::run_ip(&["-n", &ep.netns, "link", "set", &ep.tap, "up"]);
            assert!(st.is_ok(), "ip link set up: {st:?}");
            println!(
                "link up again {:.1} ms after the down",
                ms(now_ns(), t_done)
            );
        }
        let exits = wait_exits(&mut [&mut server, &mut client], Duration::from_secs(30));
        let outs = netlab::wait_all(vec![server, client], Duration::from_secs(1)).map_err(e)?;
        let reports: Vec<PeerReport> = outs
            .iter()
            .map(|o| PeerReport::from_stdout(&o.stdout).map_err(|e| format!("{}: {e}", o.name)))
            .collect::<Result<_, _>>()?;
        let plan = Plan {
            iteration: 0,
            moment: Moment::Load,
            server_side,
            action,
            occurrence: 1,
            delay_us: 300_000,
            seed: 1,
        };
        let o = Outcome::measure(plan, &reports, &exits, (t_act, t_done), None);
        let (removed, survivor) = if server_side {
            (&reports[0], &reports[1])
        } else {
            (&reports[1], &reports[0])
        };
        let o = check_outcome(&o, removed, survivor)
            .map_err(|w| format!("{w}\n{o:?}\nremoved: {removed:?}\nsurvivor: {survivor:?}"))?;
        Ok((o, removed.clone()))
    })();
    drop(bench);
    assert_eq!(netlab::leftover_namespaces(&names), Vec::<String>::new());
    let (o, removed) = result.unwrap_or_else(|e| panic!("{e}"));
    println!("{o:?}");
    (o, removed)
}

/// At most one `DeviceRemoval` per id, the callbacks' count is the CM's, and at least
/// `ids` were delivered (the peer itself checks that every id not destroyed by its
/// user got one).
fn one_removal_per_id(removed: &PeerReport, ids: usize) {
    let removals: Vec<u32> = removed.ids.iter().map(|i| i.removals).collect();
    assert!(removals.iter().all(|&r| r <= 1), "{removals:?}");
    assert_eq!(removed.device_removals, removed.cm_device_removals);
    assert!(
        removed.device_removals >= ids,
        "DeviceRemoval events: {removals:?}"
    );
}

#[test]
fn a_client_link_flap_down_then_up_removes_the_device_once() {
    if skip_unless_root("a_client_link_flap_down_then_up_removes_the_device_once") {
        return;
    }
    let (o, removed) = run(false, TapAction::Down, true, 4);
    one_removal_per_id(&removed, 4);
    assert!(o.flushed > 0, "{o:?}");
}

#[test]
fn a_server_link_flap_down_then_up_removes_the_device_once() {
    if skip_unless_root("a_server_link_flap_down_then_up_removes_the_device_once") {
        return;
    }
    let (_, removed) = run(true, TapAction::Down, true, 4);
    // The listener at least (accepted ids may be destroyed by the server first).
    one_removal_per_id(&removed, 1);
}

#[test]
fn removal_under_32_loaded_qps_on_either_side() {
    if skip_unless_root("removal_under_32_loaded_qps_on_either_side") {
        return;
    }
    let (o, removed) = run(false, TapAction::Delete, false, 32);
    one_removal_per_id(&removed, 32);
    assert!(o.flushed > 0, "{o:?}");
    let (_, removed) = run(true, TapAction::Delete, false, 32);
    one_removal_per_id(&removed, 1);
}
