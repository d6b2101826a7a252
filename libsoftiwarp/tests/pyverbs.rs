//! rdma-core's own Python suite (python3-pyverbs 44, `/usr/share/doc/rdma-core/tests`)
//! over the library (LD_PRELOAD, one host-TCP device on lo: `--dev siw_lo --port 1
//! --gid 0`, as `nobody` when root; issue 30).
//!
//! - The device-only tests (every test of test_device, test_cq's and test_cqex's API
//!   tests, test_qp's QP creation and query tests, test_pd, test_mr's registration tests,
//!   test_qpex's bad-flow tests) must all pass or skip: the counts are asserted (27
//!   passed, 0 failed, 0 errors; the skips are features the soft device does not have,
//!   such as device memory, UD/UC/XRC QPs, memory windows, ODP).
//! - The whole suite must have no failure, and its only errors those kernel siw gives
//!   too: tests that connect two QPs with `ibv_modify_qp` to RTS by GID and QP number,
//!   without the CM, which no iWARP device can do ("Failed to modify QP state to RTS.
//!   Errno: 22"), and test_shared_pd's import, which dups the context's uverbs command
//!   fd (a userspace device has none) before it imports the context and then connects
//!   the same way. The counts are printed (docs: libsoftiwarp/README.md).
//!
//! Debian ships the suite's modules gzipped: they are copied and unpacked into the
//! test's directory first. Skipped with a note when python3-pyverbs is missing (a
//! failure under `CI`, which installs it).

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{spawn_with, LibDir, Mode};

/// The suite as Debian installs it.
const SUITE: &str = "/usr/share/doc/rdma-core/tests";

/// Debian's Python, which python3-pyverbs installs into (not a `python3` earlier on
/// `PATH`).
const PYTHON: &str = "/usr/bin/python3";

/// The suite's outcome: tests run, failed, errored, skipped; and its output.
struct Counts {
    ran: usize,
    failures: usize,
    errors: usize,
    skipped: usize,
    out: String,
}

impl Counts {
    fn passed(&self) -> usize {
        self.ran - self.failures - self.errors - self.skipped
    }
}

/// The count `key=N` in unittest's last line (`OK (skipped=38)`, `FAILED (errors=14,
/// skipped=231)`), 0 if absent.
fn count(summary: &str, key: &str) -> usize {
    summary
        .split(['(', ')', ',', ' '])
        .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// True if python3-pyverbs and its suite are installed; a skip note otherwise (a
/// failure under `CI`).
fn have_pyverbs() -> bool {
    let ok = Path::new(SUITE).join("run_tests.py").exists()
        && Command::new(PYTHON)
            .args(["-c", "import pyverbs.device"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3-pyverbs is not installed (CI installs it)"
        );
        eprintln!("skipping: python3-pyverbs is not installed (apt-get install python3-pyverbs)");
    }
    ok
}

/// Copies the suite into `lib`'s directory and unpacks its gzipped modules.
fn unpack_suite(lib: &LibDir) -> std::path::PathBuf {
    let dir = lib.dir.join("tests");
    let st = Command::new("cp")
        .args(["-r", SUITE])
        .arg(&dir)
        .status()
        .expect("cp");
    assert!(st.success(), "cp -r {SUITE}");
    let gz: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gz"))
        .collect();
    if !gz.is_empty() {
        let st = Command::new("gzip")
            .arg("-d")
            .args(&gz)
            .status()
            .expect("gzip");
        assert!(st.success(), "gzip -d");
    }
    let st = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&dir)
        .status()
        .expect("chmod");
    assert!(st.success());
    dir
}

/// Runs the suite (`filters`: unittest `-k` patterns, none for all) over the library.
fn run_suite(lib: &LibDir, suite: &Path, filters: &[&str]) -> Counts {
    let runner = suite.join("run_tests.py");
    let mut args = vec![
        runner.to_str().unwrap(),
        "--dev",
        "siw_lo",
        "--port",
        "1",
        "--gid",
        "0",
        "-v",
    ];
    for f in filters {
        args.extend(["-k", f]);
    }
    let o = spawn_with(lib, Mode::Preload, Some("netdev=lo"), PYTHON, &args)
        .wait(Duration::from_secs(300));
    let out = format!("{}{}", o.stdout, o.stderr);
    let ran = out
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no \"Ran N tests\" line: {out}"));
    let summary = out
        .lines()
        .rev()
        .find(|l| l.starts_with("OK") || l.starts_with("FAILED"))
        .unwrap_or_else(|| panic!("no summary line: {out}"))
        .to_owned();
    Counts {
        ran,
        failures: count(&summary, "failures"),
        errors: count(&summary, "errors"),
        skipped: count(&summary, "skipped"),
        out,
    }
}

/// The tests that need only the device (no connection between two QPs).
const DEVICE_ONLY: [&str; 11] = [
    "tests.test_device.",
    "tests.test_cq.CQAPITest",
    "tests.test_cqex.CQEXAPITest",
    "tests.test_qp.QPTest",
    "tests.test_pd.",
    "tests.test_mr.MRTest.test_reg_mr",
    "tests.test_mr.MRTest.test_dereg_mr",
    "tests.test_mr.DeviceMemoryAPITest",
    "tests.test_qpex.QpExTestCase.test_post",
    "tests.test_qpex.QpExTestCase.test_full",
    "tests.test_qpex.QpExTestCase.test_rq",
];

#[test]
fn rdma_core_python_suite_device_only_tests_pass_and_the_rest_fail_only_as_on_iwarp() {
    if !have_pyverbs() {
        return;
    }
    let lib = LibDir::new("pyverbs");
    let suite = unpack_suite(&lib);

    let d = run_suite(&lib, &suite, &DEVICE_ONLY);
    println!(
        "pyverbs device-only: {} run, {} passed, {} failed, {} errors, {} skipped",
        d.ran,
        d.passed(),
        d.failures,
        d.errors,
        d.skipped
    );
    assert_eq!((d.failures, d.errors), (0, 0), "{}", d.out);
    assert_eq!(d.passed(), 27, "{}", d.out);
    // The library says nothing but its one line per refused QP type (UD, UC, raw
    // packet: iWARP is RC only).
    let said: Vec<&str> = d
        .out
        .lines()
        .filter_map(|l| l.split_once("libsoftiwarp: ").map(|(_, m)| m))
        .filter(|m| !m.starts_with("iWARP has no "))
        .collect();
    assert!(said.is_empty(), "library warnings: {said:?}\n{}", d.out);

    let all = run_suite(&lib, &suite, &[]);
    println!(
        "pyverbs whole suite: {} run, {} passed, {} failed, {} errors, {} skipped",
        all.ran,
        all.passed(),
        all.failures,
        all.errors,
        all.skipped
    );
    assert_eq!(all.failures, 0, "{}", all.out);
    // Every error is one kernel siw gives too (see the module docs).
    let blocks: Vec<&str> = all.out.split("\nERROR: ").skip(1).collect();
    assert_eq!(blocks.len(), all.errors, "{}", all.out);
    for b in blocks {
        let b = b.split("\n=====").next().unwrap_or(b);
        let iwarp = b.contains("Failed to modify QP state to RTS. Errno: 22")
            || (b.starts_with("test_imported_rc_ex_rdma_write")
                && b.contains("os.dup(self.server_res.ctx.cmd_fd)"));
        assert!(iwarp, "an error kernel siw would not give:\n{b}");
    }
    assert!(all.passed() >= d.passed(), "{}", all.out);
}
