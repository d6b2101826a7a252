//! Root-only: device removal in the exact scenarios of the seeds, across two
//! processes in two namespaces (`removal-peer`, see `netns_tests::removal`):
//!
//! - the 2007 seed: a callback returns Destroy while removal starts; no
//!   `DeviceRemoval` reaches that id, the device is released;
//! - removal while a destroy from another thread waits for a callback in progress;
//! - a wildcard listener on two devices (two TAPs in one namespace) loses one device
//!   and keeps accepting on the other;
//! - a new device added afterwards (the TAP re-created) and used by a new id in the
//!   same process.
//!
//! Each peer checks its own invariants (every QP drained and in ERROR, exactly one
//! `DeviceRemoval` per id not destroyed by its user, nothing after destroy, no leaked
//! object, no thread left) and exits non-zero otherwise; the tests check the
//! scenario. Every namespace, bridge and TAP is removed afterwards, also on failure.

use std::time::Duration;

mod removal_support;

use netns_tests::removal::PeerReport;
use removal_support::{run_pair, Bench, PairRun, PairSpec, TapAction, EXTRA_IP};

use netlab::skip_unless_root;

const PEER: &str = env!("CARGO_BIN_EXE_removal-peer");

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

/// What every run must show on both sides.
fn clean(r: &PeerReport) {
    assert!(r.violations.is_empty(), "{}: {:?}", r.role, r.violations);
    assert!(
        r.lost_completions().is_empty(),
        "{}: {:?}",
        r.role,
        r.lost_completions()
    );
    assert_eq!(r.stats, Default::default(), "{}", r.role);
    assert!(
        r.threads_left.is_empty(),
        "{}: {:?}",
        r.role,
        r.threads_left
    );
}

fn ms(ns: u64, from: u64) -> f64 {
    (ns as f64 - from as f64) / 1e6
}

/// The removed client: its device noticed within 100 ms of the action's end, and it
/// exited within 2 s of the action.
fn removed_in_time(run: &PairRun) {
    let n = run
        .client
        .first_notice_ns
        .expect("the client noticed the removal");
    assert!(n >= run.action.0, "noticed before the action");
    let after = ms(n, run.action.1);
    println!(
        "notice {:.1} ms after the action ({after:.1} ms after ip exited); client exit {:.0} ms, server exit {:.0} ms",
        ms(n, run.action.0),
        run.exit_ms[1],
        run.exit_ms[0]
    );
    assert!(after <= 100.0, "noticed {after} ms after the action");
    assert!(
        run.exit_ms[1] <= 2000.0,
        "client exit {} ms after the removal",
        run.exit_ms[1]
    );
}

/// Runs a pair whose client TAP is deleted when the client prints `trigger` (after
/// `delay`); `after_fire` runs on the client then. Checks that every namespace is gone
/// afterwards and that both peers ended clean.
fn client_removal(
    server_args: &[&str],
    client_args: &[&str],
    trigger: &str,
    delay: Duration,
    after_fire: impl FnOnce(&Bench, &mut netlab::Peer) -> Result<(), netlab::HarnessError>,
) -> PairRun {
    let bench = Bench::create().expect("topology");
    let names = bench.topology().namespaces();
    let armed = bench.arm(false, TapAction::Delete).expect("ip");
    let spec = PairSpec {
        server_args: args(server_args),
        client_args: args(client_args),
        trigger: trigger.into(),
        delay,
    };
    let run = run_pair(&bench, PEER.as_ref(), &spec, armed, |c| {
        after_fire(&bench, c)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    drop(bench);
    assert_eq!(netlab::leftover_namespaces(&names), Vec::<String>::new());
    clean(&run.client);
    clean(&run.server);
    run
}

#[test]
fn a_callback_returning_destroy_while_removal_starts_gets_no_device_removal() {
    if skip_unless_root("a_callback_returning_destroy_while_removal_starts_gets_no_device_removal")
    {
        return;
    }
    let run = client_removal(
        &["--expect-connections", "2"],
        &["--scenario", "seed", "--load-qps", "1", "--hold-ms", "600"],
        "IN_CALLBACK",
        Duration::ZERO,
        |_, _| Ok(()),
    );
    removed_in_time(&run);
    let c = &run.client;
    assert_eq!(c.removed_devices, ["siw_cli0"]);
    let held: Vec<_> = c.ids_of("held").collect();
    assert_eq!(held.len(), 1);
    assert_eq!(
        held[0].events,
        ["AddrResolved", "RouteResolved", "Established"],
        "{held:?}"
    );
    assert_eq!(held[0].removals, 0);
    assert_eq!(held[0].destroyed, "return");
    // The removal reached the id while its callback ran (the CM stopped listing the
    // device before the callback returned), waited for it, and delivered nothing.
    let returned = c.hold_returned_ns.expect("the held callback returned");
    assert!(
        c.first_notice_ns.expect("notice") < returned,
        "the removal started after the callback returned"
    );
    assert_eq!(c.removals_skipped, 1, "{c:?}");
    // The other id got exactly one.
    let load: Vec<_> = c.ids_of("load").collect();
    assert_eq!(load.len(), 1);
    assert_eq!(load[0].removals, 1, "{load:?}");
    assert_eq!(c.device_removals, 1);
    // The server heard both connections end.
    assert_eq!(run.server.load_ends.len(), 2, "{:?}", run.server.load_ends);
    assert!(run
        .server
        .load_ends
        .iter()
        .all(|(_, how)| how == "Disconnected"));
}

#[test]
fn removal_while_a_destroy_waits_for_a_callback_in_progress() {
    if skip_unless_root("removal_while_a_destroy_waits_for_a_callback_in_progress") {
        return;
    }
    let run = client_removal(
        &["--expect-connections", "2"],
        &[
            "--scenario",
            "destroy-blocked",
            "--load-qps",
            "1",
            "--hold-ms",
            "800",
        ],
        "DESTROY_BLOCKED",
        Duration::ZERO,
        |_, _| Ok(()),
    );
    removed_in_time(&run);
    let c = &run.client;
    let held: Vec<_> = c.ids_of("held").collect();
    assert_eq!(held.len(), 1);
    assert_eq!(
        held[0].events,
        ["AddrResolved", "RouteResolved", "Established"],
        "{held:?}"
    );
    assert_eq!((held[0].removals, held[0].destroyed.as_str()), (0, "user"));
    // The destroy started before the removal, returned only after the callback did,
    // and the removal came while it was blocked.
    let (start, done) = c.blocked_destroy_ns.expect("the blocked destroy returned");
    let returned = c.hold_returned_ns.expect("the held callback returned");
    assert!(
        start < run.action.0 && run.action.0 < done,
        "{start} {:?} {done}",
        run.action
    );
    assert!(done >= returned, "destroy returned before the callback did");
    assert_eq!(c.removals_skipped, 1, "{c:?}");
    assert_eq!(
        c.ids_of("load").map(|i| i.removals).collect::<Vec<_>>(),
        [1]
    );
}

#[test]
fn a_wildcard_listener_loses_one_device_and_keeps_accepting_on_the_other() {
    if skip_unless_root("a_wildcard_listener_loses_one_device_and_keeps_accepting_on_the_other") {
        return;
    }
    let mut bench = Bench::create().expect("topology");
    let names = bench.topology().namespaces();
    let extra = bench.add_extra_tap().expect("second TAP");
    let ns = bench.topology().a().netns.clone();
    let armed = bench.arm_on(&ns, &extra, TapAction::Delete).expect("ip");
    let extra_ip = format!("{EXTRA_IP}/24");
    let run = run_pair(
        &bench,
        PEER.as_ref(),
        &PairSpec {
            server_args: args(&[
                "--scenario",
                "wildcard",
                "--extra-tap",
                &extra,
                "--extra-ip",
                &extra_ip,
                "--expect-connections",
                "6",
            ]),
            client_args: args(&[
                "--scenario",
                "wildcard",
                "--load-qps",
                "4",
                "--peer-ip",
                &EXTRA_IP.to_string(),
                "--after-removal",
                "2",
            ]),
            trigger: "PHASE load ".into(),
            delay: Duration::from_millis(200),
        },
        armed,
        |_| Ok(()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    drop(bench);
    assert_eq!(netlab::leftover_namespaces(&names), Vec::<String>::new());
    clean(&run.client);
    clean(&run.server);
    let s = &run.server;
    assert_eq!(s.removed_devices, ["siw_srv1"]);
    let n = s.first_notice_ns.expect("the server noticed");
    assert!(
        ms(n, run.action.1) <= 100.0,
        "noticed {} ms after the action",
        ms(n, run.action.1)
    );
    // The wildcard listener heard nothing; the two connections on the removed device
    // got one DeviceRemoval each; two new connections came in on the other device.
    let listener: Vec<_> = s.ids_of("listener").collect();
    assert_eq!(listener.len(), 1);
    assert!(listener[0].events.is_empty(), "{listener:?}");
    let removed: Vec<_> = s.ids.iter().filter(|i| i.removals > 0).collect();
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert!(removed
        .iter()
        .all(|i| i.purpose == "load" && i.removals == 1));
    assert_eq!(s.device_removals, 2);
    assert_eq!(s.established_after_removal, 2, "{s:?}");
    // The client: the two connections to the removed address ended (TCP timeout),
    // the two new ones carried an RDMA Write each.
    let c = &run.client;
    assert!(c.removed_devices.is_empty());
    let after: Vec<_> = c.qps.iter().filter(|q| q.purpose == "after").collect();
    assert_eq!(after.len(), 2, "{:?}", c.qps);
    assert!(after.iter().all(|q| q.success == 1), "{after:?}");
    let ended: Vec<_> = c
        .load_ends
        .iter()
        .filter(|(_, how)| how == "Disconnected")
        .collect();
    assert!(ended.len() >= 2, "{:?}", c.load_ends);
}

#[test]
fn a_new_device_on_the_recreated_tap_serves_a_new_id() {
    if skip_unless_root("a_new_device_on_the_recreated_tap_serves_a_new_id") {
        return;
    }
    let run = client_removal(
        &["--expect-connections", "3"],
        &["--scenario", "readd", "--load-qps", "2"],
        "PHASE load ",
        Duration::from_millis(200),
        |bench, client| {
            client.wait_for_line(
                |l| l.starts_with("WAITING_FOR_TAP"),
                Duration::from_secs(10),
            )?;
            bench.restore(false).map_err(netlab::HarnessError::Setup)
        },
    );
    let c = &run.client;
    assert_eq!(c.readd_ok, Some(true), "{c:?}");
    assert_eq!(
        c.ids_of("load").map(|i| i.removals).collect::<Vec<_>>(),
        [1, 1]
    );
    let readd: Vec<_> = c.qps.iter().filter(|q| q.purpose == "readd").collect();
    assert_eq!(readd.len(), 1);
    assert_eq!(readd[0].success, 1, "{readd:?}");
    let r: Vec<_> = c.ids_of("readd").collect();
    assert_eq!(r.len(), 1);
    assert_eq!(
        r[0].events,
        [
            "AddrResolved",
            "RouteResolved",
            "Established",
            "Disconnected"
        ]
    );
    assert_eq!(run.server.established, 3);
}
