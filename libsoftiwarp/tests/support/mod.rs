//! Helpers for running unmodified rdma-core programs over libsoftiwarp: the built .so
//! in a world-readable temp dir with the `libibverbs.so.1` / `librdmacm.so.1` drop-in
//! links, `SOFTIWARP_DEVICE` lines for the two ends of a UDP link, and programs
//! spawned (as `nobody` when root) in their own process group, waited for with a
//! deadline and killed by their group id.
//!
//! Programs missing (no rdmacm-utils / ibverbs-utils / perftest): [`require`] skips
//! with a note, except under `CI`, where it fails.

#![allow(dead_code)]

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the library is put under the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `LD_PRELOAD=.../libsoftiwarp.so` (rdma-core's own libraries still load).
    Preload,
    /// `LD_LIBRARY_PATH=dir` with `libibverbs.so.1` and `librdmacm.so.1` -> libsoftiwarp.so.
    DropIn,
}

/// The built `libsoftiwarp.so`: next to the test binary's `deps/` directory.
pub fn built_so() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    // cargo builds the library for the tests in deps/ and copies it up a level only on
    // `cargo build`: the newer of the two is this test run's (an older copy up there
    // once ran the tests against a library from hours before).
    [deps.parent().unwrap_or(deps), deps]
        .iter()
        .map(|dir| dir.join("libsoftiwarp.so"))
        .filter_map(|p| {
            let modified = std::fs::metadata(&p).and_then(|m| m.modified()).ok()?;
            Some((modified, p))
        })
        .max_by_key(|(modified, _)| *modified)
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("libsoftiwarp.so not found next to {}", deps.display()))
}

/// A temp dir (mode 755) holding libsoftiwarp.so (mode 755) and the drop-in links;
/// removed on drop.
pub struct LibDir {
    /// The directory.
    pub dir: PathBuf,
}

impl LibDir {
    /// Makes one under /tmp named after `tag`, the process and a count of the
    /// process's directories (tests of one binary run at once: each gets its own, since
    /// one's removal at its end must not take the library from under another).
    pub fn new(tag: &str) -> LibDir {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("libsoftiwarp-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let so = dir.join("libsoftiwarp.so");
        std::fs::copy(built_so(), &so).unwrap();
        std::fs::set_permissions(&so, std::fs::Permissions::from_mode(0o755)).unwrap();
        for link in ["libibverbs.so.1", "librdmacm.so.1"] {
            std::os::unix::fs::symlink("libsoftiwarp.so", dir.join(link)).unwrap();
        }
        LibDir { dir }
    }

    /// The environment that puts the library under a program in `mode`.
    pub fn env(&self, mode: Mode) -> (&'static str, String) {
        match mode {
            Mode::Preload => (
                "LD_PRELOAD",
                self.dir.join("libsoftiwarp.so").display().to_string(),
            ),
            Mode::DropIn => ("LD_LIBRARY_PATH", self.dir.display().to_string()),
        }
    }
}

impl Drop for LibDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `SOFTIWARP_DEVICE` line of one end of a UDP link on 127.0.0.1: bound to `port`,
/// peer at `peer_port`, address `ip`/24.
pub fn device_line(port: u16, peer_port: u16, ip: &str) -> String {
    format!("link=udp:127.0.0.1:{port},peer=127.0.0.1:{peer_port},ip={ip}/24")
}

/// The two ends of a UDP link using ports `base` and `base + 1`: (server line at
/// 10.77.x.1, client line at 10.77.x.2, the server's address), x from `base`.
pub fn link_pair(base: u16) -> (String, String, String) {
    let net = base % 200;
    let srv = format!("10.77.{net}.1");
    (
        device_line(base, base + 1, &srv),
        device_line(base + 1, base, &format!("10.77.{net}.2")),
        srv,
    )
}

/// True when running as root (then programs run as `nobody` through runuser).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// True if `prog` is installed; otherwise prints a skip note (and panics under `CI`).
pub fn require(prog: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).exists()));
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "{prog} is not installed (CI installs rdmacm-utils, ibverbs-utils, perftest)"
        );
        eprintln!("skipping: {prog} is not installed (apt-get install rdmacm-utils ibverbs-utils perftest)");
    }
    found
}

/// A spawned program: its process group is its pid.
pub struct Proc {
    /// The child (runuser, or the program itself when not root).
    pub child: Child,
    /// What it is, for messages.
    pub what: String,
    /// Readers of its stdout and stderr, drained while it runs (a program that writes
    /// more than a pipe holds must not block on a full pipe).
    readers: Option<(JoinHandle<String>, JoinHandle<String>)>,
}

/// A thread that reads `pipe` to its end.
fn drain(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut p) = pipe {
            let mut bytes = Vec::new();
            let _ = p.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    })
}

/// Spawns `prog args` with `SOFTIWARP_DEVICE=device` (plus the library's environment),
/// as `nobody` when root, in a new process group, stdout and stderr piped.
pub fn spawn(lib: &LibDir, mode: Mode, device: &str, prog: &str, args: &[&str]) -> Proc {
    spawn_with(lib, mode, Some(device), prog, args)
}

/// [`spawn`] with `SOFTIWARP_DEVICE` set to `device`, or unset (`None`: the library
/// makes a device of each host interface).
pub fn spawn_with(
    lib: &LibDir,
    mode: Mode,
    device: Option<&str>,
    prog: &str,
    args: &[&str],
) -> Proc {
    let (k, v) = lib.env(mode);
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--", "env", "-u", "SOFTIWARP_DEVICE"]);
        c.arg(format!("{k}={v}"));
        if let Some(d) = device {
            c.arg(format!("SOFTIWARP_DEVICE={d}"));
        }
        c.arg(prog);
        c
    } else {
        let mut c = Command::new(prog);
        c.env(k, v).env_remove("SOFTIWARP_DEVICE");
        if let Some(d) = device {
            c.env("SOFTIWARP_DEVICE", d);
        }
        c
    };
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {prog}: {e}"));
    Proc::new(child, format!("{prog} {}", args.join(" ")))
}

/// How a program ended.
#[derive(Debug)]
pub struct Outcome {
    /// Its status; `None` if it was killed at the deadline.
    pub status: Option<ExitStatus>,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl Outcome {
    /// Exit code 0.
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// Ended by itself with an exit code (not a signal, not killed at the deadline).
    pub fn exited(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    /// The signal that ended it, if one did.
    pub fn signal(&self) -> Option<i32> {
        self.status.and_then(|s| s.signal())
    }
}

/// A program still running when its `Proc` goes (a test that failed before it waited for
/// or killed it) is killed with its group, so no server outlives its test (a failed CI
/// run once left an `rping -s -P` holding its port).
impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
            let _ = self.child.wait();
        }
    }
}

impl Proc {
    /// `child` (spawned in a process group of its own), described as `what`; its piped
    /// stdout and stderr are read from now on.
    pub fn new(mut child: Child, what: String) -> Proc {
        let readers = Some((drain(child.stdout.take()), drain(child.stderr.take())));
        Proc {
            child,
            what,
            readers,
        }
    }

    /// Kills the process group (SIGKILL) by its id: the program and runuser.
    pub fn kill(&mut self) {
        let pgid = self.child.id();
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pgid}")])
            .status();
    }

    /// Waits up to `limit`; kills the group at the deadline. Collects the output.
    pub fn wait(mut self, limit: Duration) -> Outcome {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break Some(s);
            }
            if Instant::now() >= deadline {
                self.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let (stdout, stderr) = match self.readers.take() {
            Some((o, e)) => (o.join().unwrap_or_default(), e.join().unwrap_or_default()),
            None => Default::default(),
        };
        Outcome {
            status,
            stdout,
            stderr,
        }
    }
}

/// Path of a file in `dir`, for messages.
pub fn show(p: &Path) -> String {
    p.display().to_string()
}

/// rping's ping line `n` at the default size (64 bytes): "rdma-ping-N: " and then
/// 'A'.. rotated by `n`, the NUL at size - 1 not printed (rping.c).
pub fn ping_line(n: usize) -> String {
    let prefix = format!("rdma-ping-{n}: ");
    let body: String = (0..64 - 1 - prefix.len())
        .map(|i| char::from(b'A' + ((n + i) % (b'z' - b'A' + 1) as usize) as u8))
        .collect();
    format!("{prefix}{body}")
}

/// Asserts that an rping client passed: exit 0 or rping's own teardown race, and, given
/// `pings` (a client run with `-v`), that many pings printed in order. rping's CM thread loops back into
/// `rdma_get_cm_event` after the DISCONNECTED event while main destroys the channel and
/// returns; if the thread gets there first it does `perror("rdma_get_cm_event")` and
/// `exit(-1)` (255). With rdma-core it reads the closed fd (`Bad file descriptor`), here
/// the channel is gone (`Invalid argument`); either way every ping was done (docs/
/// ARCHITECTURE.md, the rping traps). Anything else fails the test.
pub fn assert_rping_client(o: &Outcome, pings: Option<usize>, who: &str) {
    assert!(
        o.ok() || rping_teardown_race(o.exited(), &o.stderr),
        "{who}: {o:?}"
    );
    if let Some(count) = pings {
        check_pings(&o.stdout, "ping data: ", count, who);
    }
}

/// Whether an rping client's exit `code` and `output` (its stderr, or all it printed)
/// are rping's own teardown race ([`assert_rping_client`]): 255, its last line
/// `rdma_get_cm_event: <error>`.
pub fn rping_teardown_race(code: Option<i32>, output: &str) -> bool {
    code == Some(255)
        && output
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("rdma_get_cm_event: "))
}

/// Asserts that `text`'s lines starting with `prefix` (trimmed) are exactly pings
/// 0..`count` in order; `who` names the program in the message.
pub fn check_pings(text: &str, prefix: &str, count: usize, who: &str) {
    let got: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with(prefix))
        .collect();
    let want: Vec<String> = (0..count)
        .map(|n| format!("{prefix}{}", ping_line(n)))
        .collect();
    assert_eq!(got, want, "{who}:\n{text}");
}

/// One end of a perftest run: its `SOFTIWARP_DEVICE` (`None`: unset) and its arguments
/// after `-R`.
pub struct PerftestEnd<'a> {
    /// The device line, if any.
    pub device: Option<&'a str>,
    /// The arguments after `-R` (the client's end with the server's address).
    pub args: &'a [&'a str],
}

/// Runs perftest's `prog -R` as server and client in drop-in mode (perftest's
/// libmlx5/libefa need rdma-core's provider symbols at load time); both must exit 0,
/// say nothing of failures or of the library, and the client must print its result
/// row for `size` bytes with `iters` iterations. Returns the client's stdout; `None`,
/// with nothing asserted, if the client connected before the server listened and
/// `may_retry` (the caller runs it again on new ports).
///
/// perftest's server creates its data listener only after a handshake on the control
/// connection, and its client connects right after that handshake: a client that wins
/// the race is refused (`RDMA_CM_EVENT_REJECTED`, error -111; kernel devices refuse it
/// the same way) and perftest then gives up (its retry path reuses freed ids).
pub fn perftest_pair<'a>(
    lib: &LibDir,
    prog: &str,
    server: PerftestEnd<'a>,
    client: PerftestEnd<'a>,
    (size, iters): (u64, u64),
    may_retry: bool,
) -> Option<String> {
    let with_r = |args: &[&'a str]| -> Vec<&'a str> {
        std::iter::once("-R").chain(args.iter().copied()).collect()
    };
    let srv = spawn_with(lib, Mode::DropIn, server.device, prog, &with_r(server.args));
    std::thread::sleep(Duration::from_millis(700));
    let cli = spawn_with(lib, Mode::DropIn, client.device, prog, &with_r(client.args));
    let c = cli.wait(Duration::from_secs(180));
    let raced = c.stdout.contains("RDMA_CM_EVENT_REJECTED; error: -111")
        || c.stderr.contains("RDMA_CM_EVENT_REJECTED; error: -111");
    let s = srv.wait(Duration::from_secs(if raced { 3 } else { 30 }));
    let what = format!("{prog} {:?}", client.args);
    if raced && may_retry {
        eprintln!("{what}: the client connected before the server listened; again");
        return None;
    }
    assert!(c.ok(), "{what} client: {c:?}");
    assert!(s.ok(), "{what} server: {s:?}");
    assert!(c.stdout.contains("Transport type : IW"), "{}", c.stdout);
    for (side, o) in [("client", &c), ("server", &s)] {
        let all = format!("{}{}", o.stdout, o.stderr);
        assert!(
            !all.contains("Failed") && !all.contains("libsoftiwarp:"),
            "{what} {side}: {all}"
        );
    }
    let row = c
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&size.to_string()))
        .unwrap_or_else(|| panic!("{what}: no result row: {}", c.stdout));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], iters.to_string(), "{row}");
    Some(c.stdout)
}

/// A kernel TCP port free on every address right now (for the host-TCP devices, whose
/// ports are the kernel's).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits up to `limit` until a kernel TCP socket listens on `port` at 127.0.0.1 or the
/// wildcard address (`/proc/net/tcp`, state `0A`): a host-TCP server is up. Looking
/// does not touch the port (a probe bind or connect would race the server or reach
/// its listener).
pub fn wait_listening(port: u16, limit: Duration) -> bool {
    let want = [
        format!("0100007F:{port:04X}"),
        format!("00000000:{port:04X}"),
    ];
    let deadline = Instant::now() + limit;
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let listening = table.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[3] == "0A" && want.iter().any(|w| w == f[1])
        });
        if listening {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The first C compiler found (`cc`, `gcc`, `gcc-12`), and rdma-core's headers: else a
/// skip note (a failure under `CI`, which installs them).
pub fn c_toolchain() -> Option<&'static str> {
    let headers = [
        "/usr/include/infiniband/verbs.h",
        "/usr/include/rdma/rdma_cma.h",
    ];
    let cc = ["cc", "gcc", "gcc-12"].into_iter().find(|cc| {
        Command::new(cc)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let missing = match cc {
        None => Some("a C compiler (cc)".to_owned()),
        Some(_) => headers
            .iter()
            .find(|h| !Path::new(h).exists())
            .map(|h| format!("{h} (libibverbs-dev, librdmacm-dev)")),
    };
    if let Some(m) = missing {
        assert!(std::env::var_os("CI").is_none(), "{m} is missing");
        eprintln!("skipping: {m} is missing");
        return None;
    }
    cc
}

/// Builds `tests/NAME.c` into `lib`'s directory as `NAME`, linked against rdma-core
/// (`-lrdmacm -libverbs`: the library comes in by LD_PRELOAD, as under rping) and
/// `extra` (such as `-lpthread`); asserts that it compiles with `-Wall -Werror`.
pub fn build_c(lib: &LibDir, cc: &str, name: &str, extra: &[&str]) -> PathBuf {
    let bin = lib.dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/{name}.c"));
    let out = Command::new(cc)
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .args(extra)
        .output()
        .expect("the C compiler");
    assert!(
        out.status.success(),
        "{cc} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// How long a server may take to listen (the library opens a device per interface on
/// first use).
pub const LISTEN: Duration = Duration::from_secs(30);

/// Starts a program that listens on `port` with no device line, as `nobody`, and waits
/// until it does.
pub fn host_server(lib: &LibDir, prog: &str, args: &[&str], port: u16) -> Proc {
    let p = spawn_with(lib, Mode::Preload, None, prog, args);
    assert!(
        wait_listening(port, LISTEN),
        "{prog} {args:?} is not listening on port {port}"
    );
    p
}

/// Asserts the library said nothing (no device was left out, no warning).
pub fn quiet(o: &Outcome, who: &str) {
    let all = format!("{}{}", o.stdout, o.stderr);
    assert!(!all.contains("libsoftiwarp:"), "{who}: {all}");
}

/// `rping -s -a 0.0.0.0 -C count -V` and `rping -c -a dst -C count -V -v`, each with
/// `extra` (`-q`: the QP made outside the CM), on a free port, both with no device
/// line: both end well, the client verified every byte (`-V`) and printed every ping,
/// the library said nothing.
pub fn host_rping(tag: &str, dst: &str, count: usize, extra: &[&str]) {
    if !require("rping") {
        return;
    }
    let lib = LibDir::new(tag);
    let port = free_port();
    let (p, n) = (port.to_string(), count.to_string());
    let mut sargs = vec!["-s", "-a", "0.0.0.0", "-V", "-p", &p, "-C", &n];
    sargs.extend(extra);
    let mut cargs = vec!["-c", "-V", "-v", "-a", dst, "-p", &p, "-C", &n];
    cargs.extend(extra);
    let srv = host_server(&lib, "rping", &sargs, port);
    let cli = spawn_with(&lib, Mode::Preload, None, "rping", &cargs);
    let c = cli.wait(Duration::from_secs(90));
    let s = srv.wait(Duration::from_secs(20));
    assert_rping_client(&c, Some(count), "client");
    assert!(s.ok(), "server: {s:?}");
    quiet(&c, "client");
    quiet(&s, "server");
}

/// Server and client rping on the two ends of a UDP link (ports `base`, `base + 1`),
/// `count` pings with `-V` (the client compares every byte it got back by RDMA Write
/// with what the server read by RDMA Read), each with `extra` (`-q`: the QP made
/// outside the CM): every line of both is a ping line, all in order, and the client
/// has no warning.
pub fn link_rping(mode: Mode, base: u16, count: usize, extra: &[&str]) {
    if !require("rping") {
        return;
    }
    let lib = LibDir::new(&format!("rping{base}"));
    let (srv_dev, cli_dev, addr) = link_pair(base);
    let n = count.to_string();
    let mut sargs = vec!["-s", "-a", &addr, "-v", "-C", &n];
    sargs.extend(extra);
    let server = spawn(&lib, mode, &srv_dev, "rping", &sargs);
    std::thread::sleep(Duration::from_millis(700));
    let mut cargs = vec!["-c", "-a", &addr, "-C", &n, "-v", "-V"];
    cargs.extend(extra);
    let client = spawn(&lib, mode, &cli_dev, "rping", &cargs);
    let c = client.wait(Duration::from_secs(90));
    let s = server.wait(Duration::from_secs(20));
    assert!(s.ok(), "server: {s:?}");
    // Every line of both is a ping line, all in order (the client's exit may be
    // rping's own teardown race).
    assert_eq!(
        c.stdout.lines().count(),
        count,
        "client output: {}",
        c.stdout
    );
    assert_rping_client(&c, Some(count), "client");
    assert_eq!(
        s.stdout.lines().count(),
        count,
        "server output: {}",
        s.stdout
    );
    check_pings(&s.stdout, "server ping data: ", count, "server");
    // (rping's "client DISCONNECT EVENT" line is not asserted: its CM thread prints it
    // only if the event beats the process's exit, a race rping itself has; it lost once
    // under CI's load.)
    assert!(
        !c.stderr.contains("libsoftiwarp"),
        "no warning expected: {}",
        c.stderr
    );
}

/// Builds `tests/NAME.c` ([`build_c`], with `extra` libraries) and runs it with `args`
/// over the library (LD_PRELOAD, `SOFTIWARP_DEVICE=netdev=lo`, as `nobody` when root)
/// for up to 60 s; `None` (a skip note) without a C toolchain or rdma-core's headers.
pub fn run_c_program(name: &str, extra: &[&str], args: &[&str]) -> Option<Outcome> {
    let cc = c_toolchain()?;
    let lib = LibDir::new(name);
    let bin = build_c(&lib, cc, name, extra);
    let prog = bin.to_str().expect("a UTF-8 temp path");
    Some(
        spawn_with(&lib, Mode::Preload, Some("netdev=lo"), prog, args)
            .wait(Duration::from_secs(60)),
    )
}
