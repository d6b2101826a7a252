//! Peer processes under a watchdog: start in a namespace, collect output, wait with a
//! timeout, dump stacks and kill on timeout.
//!
//! A peer is started as `ip netns exec NS PROGRAM ARGS...` (or `PROGRAM ARGS...` with no
//! namespace). `ip netns exec` enters the namespace and `exec`s the program in place, so
//! the pid the harness holds is the program's own, which is what the watchdog kills and
//! what gdb attaches to. Two reader threads collect stdout and stderr; stdout is also
//! offered line by line to [`Peer::wait_for_line`] (a peer announces readiness by
//! printing a line). Output is echoed to the harness's stderr with a `[name]` prefix
//! unless [`PeerSpec::echo`] turns it off (the test harness captures it and shows it
//! for failing tests only).
//!
//! Every peer carries the environment variable [`PEER_ENV`] (the harness's pid); a peer
//! binary calling [`crate::logging::init_peer`] then dies with the harness.

use std::ffi::OsString;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::signals::{interrupted, registry};
use crate::HarnessError;

/// Environment variable set in every peer: the harness's pid.
pub const PEER_ENV: &str = "NETNS_TESTS_PEER";

/// How long [`wait_all`] lets the other peers finish after one failed before it stops
/// them (their stacks are dumped too).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3);

/// Lines of stdout/stderr kept in a failure's message (the whole output is in the
/// [`PeerFailure`] fields).
const TAIL_LINES: usize = 40;

/// How a peer is started. Build with [`PeerSpec::new`] or [`crate::Topology::peer`].
#[derive(Debug, Clone)]
pub struct PeerSpec {
    name: String,
    program: PathBuf,
    args: Vec<OsString>,
    netns: Option<String>,
    env: Vec<(OsString, OsString)>,
    echo: bool,
}

impl PeerSpec {
    /// A peer named `name` (for messages) running `program` in the harness's namespace.
    pub fn new(name: impl Into<String>, program: impl AsRef<Path>) -> PeerSpec {
        PeerSpec {
            name: name.into(),
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            netns: None,
            env: Vec::new(),
            echo: true,
        }
    }

    /// Runs the peer in namespace `ns` (a name under `/run/netns`).
    pub fn netns(mut self, ns: impl Into<String>) -> PeerSpec {
        self.netns = Some(ns.into());
        self
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> PeerSpec {
        self.args.push(arg.into());
        self
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> PeerSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable for the peer (the rest is inherited).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> PeerSpec {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Whether to echo the peer's output to stderr as it comes (default on).
    pub fn echo(mut self, on: bool) -> PeerSpec {
        self.echo = on;
        self
    }

    /// The peer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The command line, for messages.
    pub fn command_line(&self) -> String {
        let mut parts = Vec::new();
        if let Some(ns) = &self.netns {
            parts.push(format!("ip netns exec {ns}"));
        }
        parts.push(self.program.display().to_string());
        parts.extend(self.args.iter().map(|a| a.to_string_lossy().into_owned()));
        parts.join(" ")
    }

    /// Starts the peer, stdin from `/dev/null`, stdout and stderr collected. Start it from
    /// a thread that outlives it (see [`crate::logging::init_peer`]).
    ///
    /// Errors: [`HarnessError::Interrupted`] after a signal (see [`crate::signals`]);
    /// [`HarnessError::Spawn`] if the process cannot be started.
    pub fn spawn(&self) -> Result<Peer, HarnessError> {
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns.as_str()]).arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        cmd.args(&self.args)
            .env(PEER_ENV, std::process::id().to_string())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let command = self.command_line();
        let spawn_err = |source| HarnessError::Spawn {
            name: self.name.clone(),
            command: command.clone(),
            source,
        };
        // Spawn and register under the registry lock: the signal thread kills what is
        // registered, and refuses nothing it has not seen.
        let mut child = {
            let mut reg = registry();
            if interrupted() {
                return Err(HarnessError::Interrupted);
            }
            let child = cmd.spawn().map_err(spawn_err)?;
            reg.pids.insert(child.id());
            child
        };
        let pid = child.id();
        tracing::debug!(peer = %self.name, pid, command = %command, "peer started");
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let (line_tx, lines) = mpsc::channel();
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(reader(
                out,
                stdout.clone(),
                Some(line_tx),
                self.echo.then(|| self.name.clone()),
            ));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(reader(
                err,
                stderr.clone(),
                None,
                self.echo.then(|| format!("{} stderr", self.name)),
            ));
        }
        Ok(Peer {
            name: self.name.clone(),
            command,
            child,
            pid,
            started: Instant::now(),
            lines,
            stdout,
            stderr,
            readers,
            status: None,
        })
    }
}

fn reader(
    stream: impl Read + Send + 'static,
    buf: Arc<Mutex<String>>,
    lines: Option<mpsc::Sender<String>>,
    echo: Option<String>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(stream);
        let mut raw = Vec::new();
        loop {
            raw.clear();
            match r.read_until(b'\n', &mut raw) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&raw);
            let line = line.trim_end_matches(['\n', '\r']);
            if let Some(prefix) = &echo {
                eprintln!("[{prefix}] {line}");
            }
            if let Ok(mut b) = buf.lock() {
                b.push_str(line);
                b.push('\n');
            }
            if let Some(tx) = &lines {
                let _ = tx.send(line.to_owned());
            }
        }
    })
}

/// A running (or finished, not yet collected) peer process. Dropping it kills the
/// process if it still runs and reaps it.
#[derive(Debug)]
pub struct Peer {
    name: String,
    command: String,
    child: Child,
    pid: u32,
    started: Instant,
    lines: mpsc::Receiver<String>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

/// The output of a finished peer.
#[derive(Debug, Clone)]
pub struct PeerOutput {
    /// The peer's name.
    pub name: String,
    /// The command line.
    pub command: String,
    /// How it ended.
    pub status: ExitStatus,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
    /// From start to exit.
    pub elapsed: Duration,
}

impl PeerOutput {
    /// The lines of stdout that start with `prefix`, with the prefix removed.
    pub fn lines_with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a str> {
        self.stdout
            .lines()
            .filter_map(move |l| l.strip_prefix(prefix))
    }
}

/// Why a peer failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Still running at its deadline; stacks dumped, killed.
    Timeout(Duration),
    /// Exited non-zero or by a signal.
    Exited,
    /// Exited (or closed stdout) before printing the line waited for.
    ExitedEarly,
    /// Stopped by [`wait_all`] because another peer failed first.
    StoppedAfterOtherFailed,
}

/// A failed peer: what happened, its output, and (when it was killed by the watchdog)
/// the stacks of its threads.
#[derive(Debug, Clone)]
pub struct PeerFailure {
    /// The peer's name.
    pub name: String,
    /// The command line.
    pub command: String,
    /// What went wrong.
    pub kind: FailureKind,
    /// Exit status, if it was reaped.
    pub status: Option<ExitStatus>,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
    /// Stack dump taken before it was killed ([`dump_stacks`]).
    pub stacks: Option<String>,
    /// Short reports of the other peers of the same [`wait_all`], if any.
    pub others: Vec<String>,
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    let start = lines.len().saturating_sub(n);
    let mut out = String::new();
    if start > 0 {
        out.push_str(&format!("    ... ({start} lines before)\n"));
    }
    for l in &lines[start..] {
        out.push_str("    ");
        out.push_str(l);
        out.push('\n');
    }
    out
}

impl fmt::Display for PeerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            FailureKind::Timeout(t) => format!("did not finish within {t:?} and was killed"),
            FailureKind::Exited => "failed".to_owned(),
            FailureKind::ExitedEarly => "exited before printing the expected line".to_owned(),
            FailureKind::StoppedAfterOtherFailed => {
                "was stopped because another peer failed".to_owned()
            }
        };
        writeln!(f, "peer {} {what} (`{}`)", self.name, self.command)?;
        if let Some(s) = self.status {
            writeln!(f, "  status: {s}")?;
        }
        writeln!(f, "  stdout:\n{}", tail(&self.stdout, TAIL_LINES))?;
        writeln!(f, "  stderr:\n{}", tail(&self.stderr, TAIL_LINES))?;
        if let Some(st) = &self.stacks {
            writeln!(f, "  stacks:\n{st}")?;
        }
        for o in &self.others {
            writeln!(f, "  {o}")?;
        }
        Ok(())
    }
}

impl Peer {
    /// The peer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id (of the program itself: `ip netns exec` execs in place).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Reaps the process if it exited; returns its status. Reaping and unregistering
    /// happen under the registry lock, so the signal thread never kills a recycled pid.
    ///
    /// Errors: `waitpid` failed (not expected for our own child).
    pub fn try_status(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            let mut reg = registry();
            if let Some(s) = self.child.try_wait()? {
                reg.pids.remove(&self.pid);
                self.status = Some(s);
            }
        }
        Ok(self.status)
    }

    /// Kills the process (SIGKILL) if it still runs and reaps it.
    pub fn kill(&mut self) {
        if self.status.is_none() {
            let mut reg = registry();
            let _ = self.child.kill();
            if let Ok(s) = self.child.wait() {
                self.status = Some(s);
            }
            reg.pids.remove(&self.pid);
        }
    }

    fn snapshot(&self) -> (String, String) {
        let get = |b: &Arc<Mutex<String>>| b.lock().map(|s| s.clone()).unwrap_or_default();
        (get(&self.stdout), get(&self.stderr))
    }

    /// Joins the reader threads (after the process ended: its pipes then close, unless a
    /// grandchild still holds them; then give up after 2 s).
    fn join_readers(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        for r in self.readers.drain(..) {
            while !r.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if r.is_finished() {
                let _ = r.join();
            }
        }
    }

    fn failure(&mut self, kind: FailureKind, stacks: Option<String>) -> PeerFailure {
        self.join_readers();
        let (stdout, stderr) = self.snapshot();
        PeerFailure {
            name: self.name.clone(),
            command: self.command.clone(),
            kind,
            status: self.status,
            stdout,
            stderr,
            stacks,
            others: Vec::new(),
        }
    }

    /// The watchdog's action: dump the stacks, kill, describe.
    fn stop_hung(&mut self, kind: FailureKind) -> PeerFailure {
        let stacks = dump_stacks(self.pid);
        self.kill();
        self.failure(kind, Some(stacks))
    }

    /// Waits up to `timeout` for a stdout line that `pred` accepts and returns it (earlier
    /// lines are skipped; all stay in the collected output).
    ///
    /// Errors: the peer exited or closed stdout first ([`FailureKind::ExitedEarly`]);
    /// the timeout passed ([`FailureKind::Timeout`]: stacks dumped, peer killed);
    /// [`HarnessError::Interrupted`].
    pub fn wait_for_line(
        &mut self,
        mut pred: impl FnMut(&str) -> bool,
        timeout: Duration,
    ) -> Result<String, HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            if interrupted() {
                self.kill();
                return Err(HarnessError::Interrupted);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let f = self.stop_hung(FailureKind::Timeout(timeout));
                return Err(HarnessError::Peer(Box::new(f)));
            }
            match self
                .lines
                .recv_timeout(left.min(Duration::from_millis(100)))
            {
                Ok(line) if pred(&line) => return Ok(line),
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    if interrupted() {
                        self.kill();
                        return Err(HarnessError::Interrupted);
                    }
                    // stdout closed: the process is exiting; give it a moment to be reaped.
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_secs(1) {
                        if matches!(self.try_status(), Ok(Some(_)) | Err(_)) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    let f = self.failure(FailureKind::ExitedEarly, None);
                    self.kill();
                    return Err(HarnessError::Peer(Box::new(f)));
                }
            }
        }
    }

    /// Waits up to `timeout` (from now) for the peer to exit and returns its output,
    /// whatever the exit status (see [`PeerOutput::status`]; [`wait_all`] checks it).
    ///
    /// Errors: the timeout passed ([`FailureKind::Timeout`]: stacks dumped, peer killed);
    /// [`HarnessError::Interrupted`].
    pub fn wait(mut self, timeout: Duration) -> Result<PeerOutput, HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            if interrupted() {
                self.kill();
                return Err(HarnessError::Interrupted);
            }
            if let Some(status) = self.try_status().unwrap_or(None) {
                return Ok(self.output(status));
            }
            if Instant::now() >= deadline {
                let f = self.stop_hung(FailureKind::Timeout(timeout));
                return Err(HarnessError::Peer(Box::new(f)));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn output(&mut self, status: ExitStatus) -> PeerOutput {
        self.join_readers();
        let (stdout, stderr) = self.snapshot();
        PeerOutput {
            name: self.name.clone(),
            command: self.command.clone(),
            status,
            stdout,
            stderr,
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
        self.join_readers();
    }
}

/// [`wait_all_with_grace`] with [`DEFAULT_GRACE`].
///
/// Errors: as [`wait_all_with_grace`].
pub fn wait_all(peers: Vec<Peer>, timeout: Duration) -> Result<Vec<PeerOutput>, HarnessError> {
    wait_all_with_grace(peers, timeout, DEFAULT_GRACE)
}

/// Waits for every peer to exit successfully within `timeout` (from now) and returns
/// their outputs in the order given.
///
/// When one peer fails (exits non-zero or by a signal), the others get `grace` to finish
/// (a server whose client died usually hangs); those still running then have their stacks
/// dumped and are killed. Peers still running at the deadline are handled the same way.
///
/// Errors: [`HarnessError::Peer`] for the first peer that failed (the others' outcomes
/// are summarized in [`PeerFailure::others`]); [`HarnessError::Interrupted`].
pub fn wait_all_with_grace(
    mut peers: Vec<Peer>,
    timeout: Duration,
    grace: Duration,
) -> Result<Vec<PeerOutput>, HarnessError> {
    let deadline = Instant::now() + timeout;
    let mut stop_at = deadline;
    let mut first_failed: Option<usize> = None;
    loop {
        if interrupted() {
            for p in &mut peers {
                p.kill();
            }
            return Err(HarnessError::Interrupted);
        }
        let mut running = 0;
        for (i, p) in peers.iter_mut().enumerate() {
            match p.try_status() {
                Ok(Some(s)) if !s.success() && first_failed.is_none() => {
                    first_failed = Some(i);
                    stop_at = stop_at.min(Instant::now() + grace);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => running += 1,
            }
        }
        if running == 0 || Instant::now() >= stop_at {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if interrupted() {
        for p in &mut peers {
            p.kill();
        }
        return Err(HarnessError::Interrupted);
    }
    // Stop what still runs, then build the outcome of each peer.
    let mut outcomes: Vec<Result<PeerOutput, PeerFailure>> = Vec::new();
    for p in &mut peers {
        let out = match p.status {
            Some(s) if s.success() => Ok(p.output(s)),
            Some(_) => Err(p.failure(FailureKind::Exited, None)),
            None => {
                let kind = if first_failed.is_some() {
                    FailureKind::StoppedAfterOtherFailed
                } else {
                    FailureKind::Timeout(timeout)
                };
                Err(p.stop_hung(kind))
            }
        };
        outcomes.push(out);
    }
    let first = first_failed.or_else(|| outcomes.iter().position(Result::is_err));
    match first {
        None => Ok(outcomes.into_iter().flatten().collect()),
        Some(i) => {
            let summaries: Vec<String> = outcomes
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, o)| match o {
                    Ok(out) => format!("other peer {}: exited with {}", out.name, out.status),
                    Err(f) => format!("other peer: {f}"),
                })
                .collect();
            let mut failure = match outcomes.swap_remove(i) {
                Err(f) => f,
                Ok(out) => PeerFailure {
                    name: out.name,
                    command: out.command,
                    kind: FailureKind::Exited,
                    status: Some(out.status),
                    stdout: out.stdout,
                    stderr: out.stderr,
                    stacks: None,
                    others: Vec::new(),
                },
            };
            failure.others = summaries;
            Err(HarnessError::Peer(Box::new(failure)))
        }
    }
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

/// Runs `cmd` with its output collected, killing it after `timeout`.
fn output_with_timeout(cmd: &mut Command, timeout: Duration) -> Option<(String, String)> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let out = child.stdout.take()?;
    let err = child.stderr.take()?;
    let read = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            s.push_str(&String::from_utf8_lossy(&v));
            s
        })
    };
    let (o, e) = (read(Box::new(out)), read(Box::new(err)));
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
        }
    }
    Some((o.join().unwrap_or_default(), e.join().unwrap_or_default()))
}

/// The stacks of every thread of process `pid`, as text: user-space backtraces from
/// `gdb -p PID -batch -ex "thread apply all bt"` when gdb is installed (60 s limit),
/// then the kernel's view of each thread from `/proc/PID/task/TID/`: name, state, wait
/// channel and kernel stack. Best effort: what cannot be read is said so, never an error.
pub fn dump_stacks(pid: u32) -> String {
    let mut out = String::new();
    match find_in_path("gdb") {
        Some(gdb) => {
            let res = output_with_timeout(
                Command::new(gdb).args([
                    "-p",
                    &pid.to_string(),
                    "-batch",
                    "-nx",
                    "-ex",
                    "set pagination off",
                    "-ex",
                    "thread apply all bt",
                ]),
                Duration::from_secs(60),
            );
            match res {
                Some((stdout, stderr)) => {
                    out.push_str(&format!("--- gdb -p {pid}: thread apply all bt\n"));
                    // gdb's chatter about symbol loading is noise; keep threads and frames.
                    for l in stdout.lines() {
                        let t = l.trim_start();
                        if t.starts_with('#') || t.starts_with("Thread ") || t.is_empty() {
                            out.push_str(l);
                            out.push('\n');
                        }
                    }
                    if !stderr.trim().is_empty() {
                        out.push_str(&tail(&stderr, 5));
                    }
                }
                None => out.push_str("--- gdb could not be started\n"),
            }
        }
        None => out.push_str("--- gdb not installed: kernel stacks only\n"),
    }
    out.push_str(&format!("--- /proc/{pid}/task/*\n"));
    let dir = format!("/proc/{pid}/task");
    match std::fs::read_dir(&dir) {
        Ok(entries) => {
            let mut tids: Vec<String> = entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            tids.sort_by_key(|t| t.parse::<u64>().unwrap_or(u64::MAX));
            for tid in tids {
                let read = |f: &str| {
                    std::fs::read_to_string(format!("{dir}/{tid}/{f}"))
                        .map(|s| s.trim().to_owned())
                        .unwrap_or_else(|e| format!("({e})"))
                };
                let stat = read("stat");
                // Field 3 of stat (after the parenthesized comm) is the state letter.
                let state = stat
                    .rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().next())
                    .unwrap_or("?")
                    .to_owned();
                out.push_str(&format!(
                    "task {tid} comm={} state={state} wchan={}\n",
                    read("comm"),
                    read("wchan")
                ));
                for l in read("stack").lines() {
                    out.push_str("    ");
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
        Err(e) => out.push_str(&format!("cannot read {dir}: {e}\n")),
    }
    out
}

/// Waits until every peer exited, or `timeout`; returns when each exit was seen
/// ([`crate::now_ns`], polled every millisecond). Once one peer failed, the others get
/// 3 s. Peers still running are left to the caller ([`wait_all`] dumps their stacks).
pub fn wait_exits(peers: &mut [&mut Peer], timeout: Duration) -> Vec<Option<u64>> {
    let mut exits = vec![None; peers.len()];
    let mut deadline = Instant::now() + timeout;
    while exits.iter().any(Option::is_none) && Instant::now() < deadline {
        for (i, p) in peers.iter_mut().enumerate() {
            if exits[i].is_none() {
                if let Ok(Some(st)) = p.try_status() {
                    exits[i] = Some(crate::now_ns());
                    if !st.success() {
                        deadline = deadline.min(Instant::now() + Duration::from_secs(3));
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    exits
}
