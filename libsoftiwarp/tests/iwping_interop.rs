//! Unmodified rdma-core `rping` under libsoftiwarp against our own `iwping`,
//! both directions, as an unprivileged user (`nobody` when the tests run as
//! root), on one UDP link on 127.0.0.1 (iwping's `--udp`, the library's `link=udp:`):
//! ten pings with `-V` each way, every ping line checked on both sides.
//!
//! `iwping` is the workspace's binary (`tools/iwping`), found next to this test's
//! `deps/` directory: `scripts/test.sh` builds every binary first; alone, build it with
//! `cargo build -p iwping` (the test skips with a note, and fails under `CI`).

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::{check_pings, is_root, require, spawn, LibDir, Mode};

/// The built `iwping`, if there is one.
fn iwping() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?;
    let p = dir.join("iwping");
    if p.is_file() {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} not built (cargo build -p iwping)",
        p.display()
    );
    eprintln!(
        "skipping: {} not built (cargo build -p iwping)",
        p.display()
    );
    None
}

/// iwping on the UDP link `local` -> `peer` (ports on 127.0.0.1) with address `ip`/24,
/// as `nobody` when root.
fn iwping_cmd(bin: &PathBuf, local: u16, peer: u16, ip: &str, role: &[&str]) -> Command {
    let mut c = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    c.args(["--udp", &format!("127.0.0.1:{local}")])
        .args(["--udp-peer", &format!("127.0.0.1:{peer}")])
        .args(["--ip", &format!("{ip}/24"), "--timeout", "30"])
        .args(role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

#[test]
fn rping_under_the_library_serves_iwping() {
    let (Some(bin), true) = (iwping(), require("rping")) else {
        return;
    };
    let lib = LibDir::new("iwp-srv");
    let (a, b) = (7400, 7401);
    let dev = format!("link=udp:127.0.0.1:{a},peer=127.0.0.1:{b},ip=10.77.40.1/24");
    let server = spawn(
        &lib,
        Mode::DropIn,
        &dev,
        "rping",
        &["-s", "-a", "10.77.40.1", "-v", "-C", "10"],
    );
    std::thread::sleep(Duration::from_millis(700));
    let client = iwping_cmd(
        &bin,
        b,
        a,
        "10.77.40.2",
        &["-c", "-a", "10.77.40.1", "-C", "10", "-v", "-V"],
    )
    .output()
    .expect("iwping");
    let s = server.wait(Duration::from_secs(30));
    let c = String::from_utf8_lossy(&client.stdout);
    assert!(
        client.status.success(),
        "iwping client {}:\n{c}\n{}\nrping server: {s:?}",
        client.status,
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(s.ok(), "rping server: {s:?}");
    check_pings(&c, "ping data: ", 10, "iwping client");
    check_pings(&s.stdout, "server ping data: ", 10, "rping server");
}

#[test]
fn iwping_serves_rping_under_the_library() {
    let (Some(bin), true) = (iwping(), require("rping")) else {
        return;
    };
    let lib = LibDir::new("iwp-cli");
    let (a, b) = (7410, 7411);
    let server = iwping_cmd(
        &bin,
        a,
        b,
        "10.77.41.1",
        &["-s", "-a", "10.77.41.1", "-C", "10", "-v"],
    )
    .spawn()
    .expect("iwping");
    std::thread::sleep(Duration::from_millis(500));
    let dev = format!("link=udp:127.0.0.1:{b},peer=127.0.0.1:{a},ip=10.77.41.2/24");
    let c = spawn(
        &lib,
        Mode::Preload,
        &dev,
        "rping",
        &["-c", "-a", "10.77.41.1", "-C", "10", "-v", "-V"],
    )
    .wait(Duration::from_secs(60));
    let s = server.wait_with_output().expect("iwping server");
    let st = String::from_utf8_lossy(&s.stdout);
    assert!(
        c.ok(),
        "rping client: {c:?}\niwping server {}:\n{st}\n{}",
        s.status,
        String::from_utf8_lossy(&s.stderr)
    );
    assert!(s.status.success(), "iwping server {}: {st}", s.status);
    check_pings(&c.stdout, "ping data: ", 10, "rping client");
    check_pings(&st, "server ping data: ", 10, "iwping server");
}
