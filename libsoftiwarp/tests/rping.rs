//! Unmodified rdma-core programs over libsoftiwarp, as an unprivileged user (`nobody`
//! through runuser when the tests run as root), two processes on one UDP link: rping
//! in both ways of loading the library, ibv_devinfo, a bad `SOFTIWARP_DEVICE`, an entry
//! point the library does not implement, and a peer killed with SIGKILL mid-run.

mod support;

use std::time::Duration;
use support::{link_pair, link_rping, require, spawn, LibDir, Mode};

/// Server and client rping, 100 pings with `-V` ([`link_rping`]).
fn rping_pair(mode: Mode, base: u16) {
    link_rping(mode, base, 100, &[]);
}

#[test]
fn rping_100_pings_pass_with_ld_preload() {
    rping_pair(Mode::Preload, 7300);
}

#[test]
fn rping_100_pings_pass_as_the_libibverbs_and_librdmacm_drop_in() {
    rping_pair(Mode::DropIn, 7310);
}

#[test]
fn ibv_devinfo_prints_the_device_as_iwarp() {
    if !require("ibv_devinfo") {
        return;
    }
    let lib = LibDir::new("devinfo");
    for mode in [Mode::Preload, Mode::DropIn] {
        let (dev, _, _) = link_pair(7320);
        let o = spawn(&lib, mode, &dev, "ibv_devinfo", &["-v"]).wait(Duration::from_secs(20));
        assert!(o.ok(), "{mode:?}: {o:?}");
        assert!(o.stdout.contains("hca_id:\tsoftiwarp0"), "{}", o.stdout);
        assert!(
            o.stdout.contains("transport:\t\t\tiWARP (1)"),
            "{}",
            o.stdout
        );
        assert!(o.stdout.contains("PORT_ACTIVE (4)"), "{}", o.stdout);
        assert!(o.stdout.contains("link_layer:\t\tEthernet"), "{}", o.stdout);
        assert!(
            o.stdout.contains("max_qp_rd_atom:\t\t\t16383"),
            "{}",
            o.stdout
        );
        assert_eq!(o.stderr, "", "{mode:?}");
    }
}

#[test]
fn a_bad_device_line_is_no_device_and_one_line_naming_the_key() {
    if !require("rping") || !require("ibv_devinfo") {
        return;
    }
    let lib = LibDir::new("badcfg");
    let bad = "link=udp:127.0.0.1:7330,peer=127.0.0.1:7331,ip=10.77.1.300/24";
    for mode in [Mode::Preload, Mode::DropIn] {
        let o = spawn(&lib, mode, bad, "rping", &["-s", "-a", "10.77.1.1"])
            .wait(Duration::from_secs(20));
        // rping: ENODEV (19) after "No RDMA devices were detected".
        assert_eq!(o.exited(), Some(19), "{mode:?}: {o:?}");
        let ours: Vec<&str> = o
            .stderr
            .lines()
            .filter(|l| l.starts_with("libsoftiwarp:"))
            .collect();
        assert_eq!(ours.len(), 1, "{}", o.stderr);
        assert!(ours[0].contains("SOFTIWARP_DEVICE: ip:"), "{}", ours[0]);
        let o = spawn(&lib, mode, "name=x", "ibv_devinfo", &[]).wait(Duration::from_secs(20));
        assert!(o.exited().is_some_and(|c| c != 0), "{mode:?}: {o:?}");
        assert!(o.stderr.contains("SOFTIWARP_DEVICE: link:"), "{}", o.stderr);
    }
}

#[test]
fn a_peer_killed_mid_run_ends_the_survivor_with_an_error_not_a_hang() {
    if !require("rping") {
        return;
    }
    let lib = LibDir::new("kill9");
    let (srv_dev, cli_dev, addr) = link_pair(7340);
    let server = spawn(
        &lib,
        Mode::DropIn,
        &srv_dev,
        "rping",
        &["-s", "-a", &addr, "-C", "1000000"],
    );
    std::thread::sleep(Duration::from_millis(700));
    let mut client = spawn(
        &lib,
        Mode::DropIn,
        &cli_dev,
        "rping",
        &["-c", "-a", &addr, "-C", "1000000"],
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        client.child.try_wait().unwrap().is_none(),
        "client still pinging"
    );
    client.kill();
    let c = client.wait(Duration::from_secs(5));
    assert_eq!(c.signal(), Some(9));
    // The server learns of the vanished peer from its TCP (keep-alive 5 s, user timeout
    // 20 s) and ends by itself, without a crash.
    let s = server.wait(Duration::from_secs(60));
    assert!(s.exited().is_some(), "server hung or crashed: {s:?}");
}

#[test]
fn an_unimplemented_call_is_one_warning_and_the_man_page_error_not_a_crash() {
    if !require("rstream") {
        return;
    }
    let lib = LibDir::new("unimpl");
    let (dev, _, addr) = link_pair(7350);
    for mode in [Mode::Preload, Mode::DropIn] {
        // rstream's rsockets are not implemented.
        let o = spawn(&lib, mode, &dev, "rstream", &["-b", &addr]).wait(Duration::from_secs(20));
        assert!(
            o.exited().is_some_and(|c| c != 0),
            "{mode:?}: a clean failure exit: {o:?}"
        );
        let warnings: Vec<&str> = o
            .stderr
            .lines()
            .filter(|l| l.starts_with("libsoftiwarp:"))
            .collect();
        assert_eq!(
            warnings,
            ["libsoftiwarp: rsocket: not implemented by the soft device"],
            "{mode:?}: {}",
            o.stderr
        );
        assert!(
            o.stderr
                .contains("rsocket failed: Function not implemented"),
            "{o:?}"
        );
    }
}
