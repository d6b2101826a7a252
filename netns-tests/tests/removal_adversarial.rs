//! Root-only adversarial tests of device removal, at moments
//! the other removal tests do not cover: `ip link set down` followed at once by `up`
//! (a link flap: the device must still be removed exactly once, not half-removed and
//! not resurrected), and removal under many QPs (32) with deep queues, on either side.
//!
//! The last test checks the checker: a load peer that posts until its send queue is
//! full before it polls (the mistake a real program must not make) overruns its CQ,
//! and the peer reports the overrun with the number of completions lost.
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
    let (o, reports) = pair(server_side, action, up_again, load_qps, &[], None);
    let (removed, survivor) = if server_side {
        (&reports[0], &reports[1])
    } else {
        (&reports[1], &reports[0])
    };
    let o = check_outcome(&o, removed, survivor)
        .map_err(|w| format!("{w}\n{o:?}\nremoved: {removed:?}\nsurvivor: {survivor:?}"))
        .unwrap_or_else(|e| panic!("{e}"));
    println!("{o:?}");
    (o, removed.clone())
}

/// The run of [`run`] without its checks, with `client_args` added to the client's
/// command line and the client's progress mode forced to `progress` if given. Returns
/// the outcome and the reports (server, client); panics if the pair could not run.
fn pair(
    server_side: bool,
    action: TapAction,
    up_again: bool,
    load_qps: usize,
    client_args: &[&str],
    progress: Option<&str>,
) -> (Outcome, Vec<PeerReport>) {
    let bench = Bench::create().expect("topology");
    let names = bench.topology().namespaces();
    let result = (|| -> Result<(Outcome, Vec<PeerReport>), String> {
        let e = |e: netlab::HarnessError| e.to_string();
        let (mut server, mut client) = start_pair(&bench, load_qps, client_args, progress, true)?;
        let armed = bench.arm(server_side, action).map_err(|e| e.to_string())?;
        client
            .wait_for_line(|l| l.starts_with("PHASE load "), Duration::from_secs(60))
            .map_err(e)?;
        std::thread::sleep(Duration::from_millis(300));
        let (t_act, t_done) = armed.fire().map_err(|e| e.to_string())?;
        bench.acted().map_err(|e| e.to_string())?;
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
        Ok((o, reports))
    })();
    drop(bench);
    assert_eq!(netlab::leftover_namespaces(&names), Vec::<String>::new());
    result.unwrap_or_else(|e| panic!("{e}"))
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

/// The checker catches a peer that lets completions pile up: with `--post-until-full`
/// the load threads post until `QueueFull` before polling. With application threads
/// driving the device inside `post_send` (hybrid progress), every Write completes while
/// it is posted, so the send queue never fills and the CQ, sized for what a correct
/// peer leaves unpolled, overruns. The client must report it as a violation that names
/// the completions lost (the old peer ignored the CQ's error and reported only
/// "posted != completed", or nothing); the same run without the flag is clean.
#[test]
fn a_load_peer_that_waits_for_queue_full_to_poll_is_caught() {
    if skip_unless_root("a_load_peer_that_waits_for_queue_full_to_poll_is_caught") {
        return;
    }
    let client = overrunning_client(2);
    let overruns: Vec<&String> = client
        .violations
        .iter()
        .filter(|v| v.contains("overflowed") && v.contains("completions lost"))
        .collect();
    assert!(
        !overruns.is_empty(),
        "no CQ overrun reported: {:?}",
        client.violations
    );
    for v in &overruns {
        let lost: u64 = v
            .rsplit("overflowed: ")
            .next()
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count in {v:?}"));
        assert!(lost > 0, "{v}");
    }
    println!("reported: {overruns:?}");
    // The same pair, posting as a real program does, with a removal under load: clean.
    let (o, reports) = pair(false, TapAction::Delete, false, 2, &[], Some("hybrid"));
    check_outcome(&o, &reports[1], &reports[0])
        .unwrap_or_else(|w| panic!("{w}\n{o:?}\nclient: {:?}", reports[1]));
}

/// A server and a `--post-until-full` client with `load_qps` load connections under
/// hybrid progress, nothing removed: the client's CQs overrun at once, its connections
/// end (the QPs go to Error), and it exits with its report (returned).
fn overrunning_client(load_qps: usize) -> PeerReport {
    let bench = Bench::create().expect("topology");
    let names = bench.topology().namespaces();
    let result = (|| -> Result<PeerReport, String> {
        let (mut server, mut client) = start_pair(
            &bench,
            load_qps,
            &["--post-until-full"],
            Some("hybrid"),
            false,
        )?;
        wait_exits(&mut [&mut server, &mut client], Duration::from_secs(30));
        // The client's failure (exit 1, its violations) is what this run is for.
        let stdout = match netlab::wait_all(vec![client], Duration::from_secs(1)) {
            Ok(mut outs) => outs.remove(0).stdout,
            Err(netlab::HarnessError::Peer(f)) => f.stdout,
            Err(other) => return Err(other.to_string()),
        };
        PeerReport::from_stdout(&stdout).map_err(|e| format!("client: {e}\n{stdout}"))
    })();
    drop(bench);
    assert_eq!(netlab::leftover_namespaces(&names), Vec::<String>::new());
    result.unwrap_or_else(|e| panic!("{e}"))
}

/// Starts the server, waits for its `READY`, then starts the client with `load_qps`
/// load connections, `client_args` added and its progress mode forced to `progress` if
/// given; with `removal`, both wait for the harness's action ([`Bench::awaits_action`]).
/// Returns (server, client).
fn start_pair(
    bench: &Bench,
    load_qps: usize,
    client_args: &[&str],
    progress: Option<&str>,
    removal: bool,
) -> Result<(netlab::Peer, netlab::Peer), String> {
    let spec = |server_side: bool| {
        let spec = bench.peer(PEER.as_ref(), server_side);
        if removal {
            bench.awaits_action(spec)
        } else {
            spec
        }
    };
    let e = |e: netlab::HarnessError| e.to_string();
    let timeout = TCP_TIMEOUT_MS.to_string();
    let mut server = spec(true)
        .args(["--tcp-timeout-ms", &timeout])
        .spawn()
        .map_err(e)?;
    server
        .wait_for_line(|l| l == "READY", Duration::from_secs(20))
        .map_err(e)?;
    let mut client = spec(false)
        .args(["--tcp-timeout-ms", &timeout])
        .args(["--load-qps", &load_qps.to_string()])
        .args(client_args);
    if let Some(mode) = progress {
        client = client.env("SOFTIWARP_PROGRESS", mode);
    }
    let client = client.spawn().map_err(e)?;
    Ok((server, client))
}
