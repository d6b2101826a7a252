//! QPs made outside the RDMA CM and librdmacm's synchronous endpoint API (issue 30),
//! with Debian's unmodified programs over libsoftiwarp as `nobody` (through runuser
//! when the tests run as root), each in its own process group with a deadline:
//!
//! - rping `-q` (each side makes its QP with `ibv_create_qp`, moves it with
//!   `rdma_init_qp_attr`, and names it by `conn_param.qp_num`), on lo's host-TCP device
//!   with no `SOFTIWARP_DEVICE`, and as the drop-in on a UDP link of a device line;
//! - cmtime (100 ids, `rdma_create_qp` with a NULL PD and no CQs);
//! - rdma_server / rdma_client and rdma_xserver / rdma_xclient (`rdma_create_ep`,
//!   `rdma_get_request`, the `<rdma/rdma_verbs.h>` helpers), and the XRC mode of the
//!   latter refused with one line;
//! - udaddy and mckey (UD) refused with one line;
//! - `tests/outside_cm.c`: a QP from `ibv_create_qp` flushed by `ibv_modify_qp(ERR)`
//!   and by a disconnect with WRs posted, `rdma_create_qp(id, NULL, attr without CQs)`,
//!   synchronous ids.

mod support;

use std::time::Duration;

use support::{
    build_c, c_toolchain, free_port, host_rping, host_server as server, link_rping, quiet, require,
    spawn_with, LibDir, Mode, Outcome,
};

/// `prog args` with no device line, as `nobody`, to its end (within `limit`).
fn run(lib: &LibDir, prog: &str, args: &[&str], limit: Duration) -> Outcome {
    spawn_with(lib, Mode::Preload, None, prog, args).wait(limit)
}

/// The library's lines in `o`'s stderr.
fn ours(o: &Outcome) -> Vec<&str> {
    o.stderr
        .lines()
        .filter(|l| l.starts_with("libsoftiwarp:"))
        .collect()
}

#[test]
fn rping_q_connects_qps_made_with_ibv_create_qp() {
    host_rping("ep-rping-q", "127.0.0.1", 10, &["-q"]);
}

#[test]
fn rping_q_as_the_drop_in_on_a_udp_link() {
    link_rping(Mode::DropIn, 7380, 10, &["-q"]);
}

#[test]
fn cmtime_times_20_connections_on_qps_with_the_cm_defaults() {
    if !require("cmtime") {
        return;
    }
    let lib = LibDir::new("ep-cmtime");
    let port = free_port();
    let p = port.to_string();
    // The server never ends by itself (it serves until killed).
    let mut srv = server(&lib, "cmtime", &["-p", &p], port);
    let c = run(
        &lib,
        "cmtime",
        // 20 connections: cmtime's default 100, all connected at once, exceed what a
        // loaded server (CI) decides before the listener's bound on undecided
        // connections resets the oldest (REJECTED -104, then -111), a bound against
        // hostile peers that this test is not about.
        &["-s", "127.0.0.1", "-p", &p, "-c", "20"],
        Duration::from_secs(120),
    );
    assert!(
        srv.child.try_wait().unwrap().is_none(),
        "the cmtime server ended"
    );
    srv.kill();
    let s = srv.wait(Duration::from_secs(10));
    assert!(c.ok(), "client: {c:?}");
    // Every step ran for every connection: a table row each with its total, no error
    // printed.
    for step in [
        "create id",
        "resolve addr",
        "resolve route",
        "create qp",
        "connect",
        "disconnect",
        "destroy",
    ] {
        let row = c
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{step:<13}:")))
            .unwrap_or_else(|| panic!("no {step} row: {c:?}"));
        let total: f64 = row[14..]
            .split_whitespace()
            .next()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{row}"));
        // A step of 100 fast calls can total under the table's 0.01 ms resolution
        // (disconnect printed 0.00 once): the row's number is what is checked.
        assert!(total >= 0.0, "{row}");
    }
    for o in [&c, &s] {
        let all = format!("{}{}", o.stdout, o.stderr);
        for bad in ["fail", "error", "event:"] {
            assert!(!all.contains(bad), "{bad}: {o:?}");
        }
    }
    quiet(&c, "client");
    quiet(&s, "server");
}

/// A server and a client of librdmacm's endpoint examples on a free port: both end
/// with `PROG: end 0` and say nothing else.
fn endpoint_pair(tag: &str, server_prog: &str, client_prog: &str, server_args: &[&str]) {
    if !require(server_prog) || !require(client_prog) {
        return;
    }
    let lib = LibDir::new(tag);
    let port = free_port();
    let p = port.to_string();
    let mut sargs = server_args.to_vec();
    sargs.extend(["-p", &p]);
    let srv = server(&lib, server_prog, &sargs, port);
    let c = run(
        &lib,
        client_prog,
        &["-s", "127.0.0.1", "-p", &p],
        Duration::from_secs(60),
    );
    let s = srv.wait(Duration::from_secs(20));
    for (prog, o) in [(client_prog, &c), (server_prog, &s)] {
        assert!(o.ok(), "{prog}: {o:?}");
        assert_eq!(
            o.stdout,
            format!("{prog}: start\n{prog}: end 0\n"),
            "{prog}: {o:?}"
        );
        assert_eq!(o.stderr, "", "{prog}: {o:?}");
    }
}

#[test]
fn rdma_server_and_rdma_client_over_the_synchronous_endpoint_api() {
    endpoint_pair(
        "ep-rdma-server",
        "rdma_server",
        "rdma_client",
        &["-s", "0.0.0.0"],
    );
}

#[test]
fn rdma_xserver_and_rdma_xclient_over_rc() {
    endpoint_pair("ep-rdma-xserver", "rdma_xserver", "rdma_xclient", &[]);
}

/// Asserts `o` stopped with an error exit and exactly one line of the library, which
/// contains `line`, and printed `perror` (the program's own reason).
fn refused(o: &Outcome, line: &str, perror: &str, who: &str) {
    assert!(o.exited().is_some_and(|c| c != 0), "{who}: {o:?}");
    let lines = ours(o);
    assert_eq!(lines.len(), 1, "{who}: {o:?}");
    assert!(lines[0].contains(line), "{who}: {o:?}");
    assert!(
        o.stdout.contains(perror) || o.stderr.contains(perror),
        "{who}: {o:?}"
    );
}

#[test]
fn rdma_xclient_and_rdma_xserver_in_xrc_mode_say_iwarp_has_no_xrc() {
    if !require("rdma_xclient") || !require("rdma_xserver") {
        return;
    }
    let lib = LibDir::new("ep-xrc");
    let p = free_port().to_string();
    let t = Duration::from_secs(30);
    let c = run(
        &lib,
        "rdma_xclient",
        &["-c", "x", "-s", "127.0.0.1", "-p", &p],
        t,
    );
    refused(
        &c,
        "iWARP has no XRC",
        "rdma_create_ep: Operation not supported",
        "rdma_xclient -c x",
    );
    let s = run(&lib, "rdma_xserver", &["-c", "x", "-p", &p], t);
    refused(
        &s,
        "iWARP has no XRC",
        "rdma_create_ep: Operation not supported",
        "rdma_xserver -c x",
    );
}

#[test]
fn udaddy_and_mckey_say_iwarp_has_no_ud() {
    if !require("udaddy") || !require("mckey") {
        return;
    }
    let lib = LibDir::new("ep-ud");
    let t = Duration::from_secs(30);
    // (Their `-p` is the port space; both fail before any port is used.)
    let s = run(&lib, "udaddy", &[], t);
    refused(
        &s,
        "iWARP has no UD",
        "udaddy: listen request failed: Protocol not supported",
        "udaddy server",
    );
    let c = run(&lib, "udaddy", &["-s", "127.0.0.1"], t);
    refused(&c, "iWARP has no UD", "iWARP has no UD", "udaddy client");
    let m = run(&lib, "mckey", &["-m", "239.1.1.1"], t);
    refused(&m, "iWARP has no UD", "iWARP has no UD", "mckey");
}

#[test]
fn qps_outside_the_cm_and_the_cm_defaults_from_c() {
    let Some(cc) = c_toolchain() else { return };
    let lib = LibDir::new("ep-outside-cm");
    let bin = build_c(&lib, cc, "outside_cm", &[]);
    let bin = bin.to_str().unwrap();
    let port = free_port();
    let p = port.to_string();
    let srv = server(&lib, bin, &["server", &p], port);
    let c = run(
        &lib,
        bin,
        &["client", "127.0.0.1", &p],
        Duration::from_secs(60),
    );
    let s = srv.wait(Duration::from_secs(30));
    for (who, o) in [("client", &c), ("server", &s)] {
        assert!(o.ok(), "{who}: {o:?}");
        assert!(!o.stdout.contains("FAILED"), "{who}: {o:?}");
        assert!(o.stdout.ends_with("done\n"), "{who}: {o:?}");
    }
    for check in [
        "ok: the receives flushed by modify(ERR)",
        "ok: a Send posted in ERR is flushed",
        "ok: rdma_get_recv_comp: the echo",
        "ok: the CM's CQ was destroyed with the QP",
    ] {
        assert!(c.stdout.contains(check), "client: {check}: {c:?}");
    }
    for check in [
        "ok: the receives flushed by the disconnect",
        "ok: rdma_accept(conn_param.qp_num)",
        "ok: rdma_get_recv_comp: the client's message",
    ] {
        assert!(s.stdout.contains(check), "server: {check}: {s:?}");
    }
    // The client's refusals: one line each kind (a UDP port space, a UD QP).
    assert_eq!(
        ours(&c),
        [
            "libsoftiwarp: iWARP has no UD: rdma_create_id refused: iWARP is reliable connected only (RDMA_PS_TCP)"
        ],
        "{c:?}"
    );
    quiet(&s, "server");
}
