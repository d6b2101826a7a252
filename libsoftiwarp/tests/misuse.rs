//! A C program's misuse of the library must not corrupt memory:
//! `tests/misuse.c`, built with gcc `-fsanitize=address` and linked straight against
//! the built `libsoftiwarp.so` (so libasan is first in its library list and its
//! `malloc`/`free` serve the library too: a double free inside the library is a
//! report), destroys every object kind twice, destroys objects in use, posts and polls
//! after destroy, passes foreign handles and handles of another kind, overruns a CQ,
//! destroys CM ids with unacked events, posts negative and too large counts, misaligned
//! pointers and cyclic WR lists, races creations, calls and non-blocking reads against
//! destroys on other threads, reads its own completion channel's fd, and runs out of
//! fds. Each check is one line of its output; it exits non-zero on any mismatch, and
//! AddressSanitizer must report nothing. AddressSanitizer instruments the C side only
//! (the Rust library is not built with it): it sees the program's own accesses,
//! including those of rdma-core's header inlines, and the allocations of both sides.
//!
//! LeakSanitizer is on (`detect_leaks=1`): the program frees everything it made, and
//! what the library keeps on purpose (the process's device, the bounded graveyard of
//! destroyed handles, `boundary::handles`) is reachable from statics, so a report is a
//! real leak. Skipped with a note when gcc or libasan is missing (rdma-core's headers
//! too, except under `CI`, which installs them).

mod support;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{device_line, LibDir, Proc};

const HEADERS: [&str; 2] = [
    "/usr/include/infiniband/verbs.h",
    "/usr/include/rdma/rdma_cma.h",
];

/// True if gcc and its libasan are installed (a skip note otherwise).
fn have_asan() -> bool {
    let out = Command::new("gcc")
        .arg("-print-file-name=libasan.so")
        .output();
    let found = match out {
        Ok(o) if o.status.success() => {
            let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
            Path::new(&p).is_absolute() && Path::new(&p).exists()
        }
        _ => {
            eprintln!("skipping: gcc is not installed");
            return false;
        }
    };
    if !found {
        eprintln!("skipping: gcc's libasan is not installed (apt-get install libasan8)");
    }
    found
}

#[test]
fn c_misuse_under_address_sanitizer_is_errors_not_memory_corruption() {
    if !have_asan() {
        return;
    }
    if let Some(h) = HEADERS.iter().find(|h| !Path::new(h).exists()) {
        assert!(
            std::env::var_os("CI").is_none(),
            "{h} is missing (CI installs libibverbs-dev librdmacm-dev)"
        );
        eprintln!("skipping: {h} is missing (apt-get install libibverbs-dev librdmacm-dev)");
        return;
    }
    let lib = LibDir::new("misuse");
    let bin = lib.dir.join("misuse");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/misuse.c");
    let cc = Command::new("gcc")
        .args(["-fsanitize=address", "-fno-omit-frame-pointer", "-g", "-O1"])
        .args(["-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg(format!("-L{}", lib.dir.display()))
        .arg("-l:libsoftiwarp.so")
        .arg(format!("-Wl,-rpath,{}", lib.dir.display()))
        .arg("-lpthread")
        .output()
        .expect("gcc");
    assert!(
        cc.status.success(),
        "gcc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    // One end of a UDP link with no peer: the WRs complete by flushing, and nobody
    // answers ARP for .9 (the CM's ADDR_ERROR).
    let device = device_line(7460, 7461, "10.77.60.1");
    let child = Command::new(&bin)
        .arg("10.77.60.9")
        .env("SOFTIWARP_DEVICE", device)
        .env(
            "ASAN_OPTIONS",
            "detect_leaks=1:halt_on_error=1:abort_on_error=0:exitcode=99",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("spawn the misuse program");
    let out = Proc::new(child, "misuse".into()).wait(Duration::from_secs(120));
    println!("{}", out.stdout);
    eprintln!("{}", out.stderr);
    assert!(
        !out.stderr.contains("AddressSanitizer") && !out.stderr.contains("LeakSanitizer"),
        "AddressSanitizer reported:\n{}",
        out.stderr
    );
    assert!(
        out.ok(),
        "the misuse program failed ({:?}):\n{}",
        out.status,
        out.stdout
    );
    assert!(out.stdout.contains("\n0 failed"), "{}", out.stdout);
    let checks = out.stdout.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(checks >= 130, "only {checks} checks ran:\n{}", out.stdout);
    // A call racing a destroy fails with EINVAL silently (the CQ overrun's one line is
    // expected).
    assert!(
        !out.stderr
            .lines()
            .any(|l| l.contains("ibv_poll_cq") && l.contains("destroyed")),
        "{}",
        out.stderr
    );
}
