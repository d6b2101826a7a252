//! Root-only tests of the harness itself: peers run inside the namespaces, output and
//! exit status are collected, the watchdog dumps stacks and kills, a failing peer stops
//! the others, and everything is removed, also when a test panics.
//!
//! Each test skips (with a message) when not run as root.

use std::time::{Duration, Instant};

use netlab::{
    leftover_namespaces, skip_unless_root, wait_all_with_grace, FailureKind, HarnessError,
    PeerSpec, Side, Topology,
};

fn failure(e: HarnessError) -> Box<netlab::PeerFailure> {
    match e {
        HarnessError::Peer(f) => f,
        other => panic!("expected a peer failure, got {other}"),
    }
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn peers_run_in_their_namespace_with_output_and_status() {
    if skip_unless_root("peers_run_in_their_namespace_with_output_and_status") {
        return;
    }
    let topo = Topology::create(9000).expect("topology");
    let names = topo.namespaces();
    let (a, b) = (topo.a().clone(), topo.b().clone());
    assert_ne!(a.netns, b.netns);
    assert_eq!((a.ip.octets()[3], b.ip.octets()[3]), (1, 2));
    assert_ne!(a.mac, b.mac);
    assert_eq!(topo.mtu(), 9000);

    let script = "ip -o link show; echo to-stderr >&2; echo \"env=$NETNS_TESTS_PEER\"; exit 0";
    let peer = topo
        .peer(Side::A, "lister", "/bin/sh")
        .args(["-c", script])
        .spawn()
        .expect("spawn");
    let out = peer.wait(Duration::from_secs(20)).expect("wait");
    assert!(out.status.success(), "{out:?}");
    // The peer sees A's TAP (at the topology's MTU) and not B's.
    let tap_line = out
        .stdout
        .lines()
        .find(|l| l.contains(&format!(": {}:", a.tap)))
        .unwrap_or_else(|| panic!("TAP {} not listed: {}", a.tap, out.stdout));
    assert!(tap_line.contains("mtu 9000"), "{tap_line}");
    assert!(!out.stdout.contains(&b.tap), "{}", out.stdout);
    assert_eq!(out.stderr.trim(), "to-stderr");
    assert_eq!(
        out.lines_with_prefix("env=").collect::<Vec<_>>(),
        vec![std::process::id().to_string()]
    );
    assert!(out
        .command
        .starts_with(&format!("ip netns exec {} /bin/sh", a.netns)));

    drop(topo);
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
}

#[test]
fn watchdog_dumps_stacks_and_kills() {
    if skip_unless_root("watchdog_dumps_stacks_and_kills") {
        return;
    }
    let topo = Topology::create(1500).expect("topology");
    let names = topo.namespaces();
    let peer = topo
        .peer(Side::B, "sleeper", "/bin/sleep")
        .arg("600")
        .spawn()
        .expect("spawn");
    let pid = peer.pid();
    let t0 = Instant::now();
    let f = failure(peer.wait(Duration::from_millis(500)).unwrap_err());
    assert_eq!(f.kind, FailureKind::Timeout(Duration::from_millis(500)));
    assert_eq!(f.name, "sleeper");
    // Killed by the watchdog (SIGKILL) and reaped.
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(f.status.and_then(|s| s.signal()), Some(9), "{f}");
    assert!(!pid_alive(pid), "pid {pid} still there");
    let stacks = f.stacks.as_deref().expect("stacks");
    // The kernel's view is always there: one task, `sleep`, waiting in a sleep call.
    assert!(
        stacks.contains(&format!("task {pid} comm=sleep")),
        "{stacks}"
    );
    assert!(stacks.contains("state=S"), "{stacks}");
    if std::path::Path::new("/usr/bin/gdb").exists() {
        assert!(stacks.contains("#0 "), "gdb backtrace missing:\n{stacks}");
    }
    println!("{f}");
    let msg = f.to_string();
    assert!(msg.contains("did not finish within 500ms"), "{msg}");
    assert!(t0.elapsed() < Duration::from_secs(60));
    drop(topo);
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
}

#[test]
fn a_failing_peer_stops_the_others_soon() {
    if skip_unless_root("a_failing_peer_stops_the_others_soon") {
        return;
    }
    let topo = Topology::create(1500).expect("topology");
    let names = topo.namespaces();
    let server = topo
        .peer(Side::A, "server", "/bin/sleep")
        .arg("600")
        .spawn()
        .expect("spawn");
    let server_pid = server.pid();
    let client = topo
        .peer(Side::B, "client", "/bin/sh")
        .args(["-c", "echo giving up >&2; exit 3"])
        .spawn()
        .expect("spawn");
    let t0 = Instant::now();
    let err = wait_all_with_grace(
        vec![server, client],
        Duration::from_secs(60),
        Duration::from_millis(300),
    )
    .unwrap_err();
    let waited = t0.elapsed();
    let f = failure(err);
    assert_eq!(f.name, "client");
    assert_eq!(f.kind, FailureKind::Exited);
    assert_eq!(f.status.and_then(|s| s.code()), Some(3));
    assert_eq!(f.stderr.trim(), "giving up");
    assert_eq!(f.others.len(), 1);
    assert!(
        f.others[0].contains("peer server was stopped because another peer failed"),
        "{:?}",
        f.others
    );
    assert!(!pid_alive(server_pid));
    // Stopped after the grace, not after the 60 s timeout (gdb may take a few seconds).
    assert!(waited < Duration::from_secs(45), "{waited:?}");
    drop(topo);
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
}

#[test]
fn waiting_for_a_line() {
    if skip_unless_root("waiting_for_a_line") {
        return;
    }
    let topo = Topology::create(1500).expect("topology");
    let mut peer = topo
        .peer(Side::A, "announcer", "/bin/sh")
        .args(["-c", "echo starting; echo READY 42; sleep 0.2; echo after"])
        .spawn()
        .expect("spawn");
    let line = peer
        .wait_for_line(|l| l.starts_with("READY"), Duration::from_secs(10))
        .expect("line");
    assert_eq!(line, "READY 42");
    let out = peer.wait(Duration::from_secs(10)).expect("wait");
    assert_eq!(out.stdout, "starting\nREADY 42\nafter\n");

    // A peer that exits without the line.
    let mut quitter = topo
        .peer(Side::B, "quitter", "/bin/sh")
        .args(["-c", "echo nope; exit 0"])
        .spawn()
        .expect("spawn");
    let f = failure(
        quitter
            .wait_for_line(|l| l == "READY", Duration::from_secs(10))
            .unwrap_err(),
    );
    assert_eq!(f.kind, FailureKind::ExitedEarly);
    assert_eq!(f.stdout, "nope\n");

    // A peer that never prints it: the watchdog fires.
    let mut silent = topo
        .peer(Side::B, "silent", "/bin/sleep")
        .arg("600")
        .echo(false)
        .spawn()
        .expect("spawn");
    let pid = silent.pid();
    let f = failure(
        silent
            .wait_for_line(|l| l == "READY", Duration::from_millis(300))
            .unwrap_err(),
    );
    assert_eq!(f.kind, FailureKind::Timeout(Duration::from_millis(300)));
    assert!(!pid_alive(pid));
}

#[test]
fn dropping_a_running_peer_kills_it_and_a_panic_removes_the_namespaces() {
    if skip_unless_root("dropping_a_running_peer_kills_it_and_a_panic_removes_the_namespaces") {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let res = std::thread::spawn(move || {
        let topo = Topology::create(1500).expect("topology");
        let peer = topo
            .peer(Side::A, "orphan", "/bin/sleep")
            .arg("600")
            .spawn()
            .expect("spawn");
        tx.send((topo.namespaces(), peer.pid())).unwrap();
        panic!("test failure while a peer runs");
    })
    .join();
    assert!(res.is_err(), "the thread panicked");
    let (names, pid) = rx.recv().unwrap();
    assert!(!pid_alive(pid), "peer {pid} survived the panic");
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
}

#[test]
fn spawn_errors_are_typed() {
    // Needs no root: no namespace involved.
    let err = PeerSpec::new("missing", "/nonexistent/program")
        .spawn()
        .unwrap_err();
    match err {
        HarnessError::Spawn { name, source, .. } => {
            assert_eq!(name, "missing");
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other}"),
    }
    let out = PeerSpec::new("plain", "/bin/sh")
        .args(["-c", "exit 7"])
        .spawn()
        .unwrap()
        .wait(Duration::from_secs(10))
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
}
