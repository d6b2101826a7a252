//! Test-only helpers shared by the workspace's tests (a dev-dependency only; it depends on
//! nothing of ours): a seeded PRNG, a watchdog that fails a hung test with a state dump
//! and every thread's backtrace, a polling wait, and a check of `#[repr(C)]` layouts
//! against C headers ([`check_c_layout`]).
//!
//! Its room: helpers for tests only, the workspace's one test PRNG ([`Rng`]) among them.
//! It touches nothing of ours, and no crate has it as a normal dependency (checked by
//! `scripts/crate-graph.py`).
#![forbid(unsafe_code)]

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// splitmix64: small, seeded, good enough for choosing sizes, delays and moments in
/// tests (not for anything else). The field is the state; `Rng(seed)` and
/// [`Rng::new`] are the same.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`; `n` must be greater than 0 (panics otherwise: a test bug).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with a probability of `percent` in 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A seeded source of delays for fake networks (`iw_cm::testing::FakeNet::new`):
    /// called with a maximum `max` (microseconds, above 0), returns 0 half of the time and
    /// otherwise a delay uniform in `0..=max`.
    pub fn delays(seed: u64) -> impl FnMut(u64) -> u64 + Send + 'static {
        let mut rng = Rng::new(seed);
        move |max| {
            if rng.chance(50) {
                0
            } else {
                rng.below(max + 1)
            }
        }
    }
}

/// Fails the test process (exit status 101) if it is not dropped within `limit`, after
/// printing `dump()` and every thread's backtrace (through gdb, if installed): a hang
/// becomes a failure with the evidence, never a CI time-out.
pub struct Watchdog {
    done: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Arms a watchdog named `name` (for the message) that fires after `limit`.
    pub fn arm(
        name: &str,
        limit: Duration,
        dump: impl Fn() -> String + Send + 'static,
    ) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        let name = name.to_string();
        let thread = std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                    fail_with_dump(&format!("{name} did not finish in {limit:?}"), &dump());
                }
            })
            .expect("spawn the watchdog thread");
        Watchdog {
            done: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Prints `what`, the state dump and every thread's backtrace (`gdb -batch -p PID -ex
/// "thread apply all bt"`), then exits the process with status 101. It writes straight
/// to the stderr fd: libtest captures the output of threads a test spawns, and the
/// process exits before it would print it.
pub fn fail_with_dump(what: &str, dump: &str) -> ! {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "WATCHDOG: {what}; state:");
    let _ = writeln!(err, "{dump}");
    let _ = err.flush();
    drop(err);
    let pid = std::process::id().to_string();
    if let Err(e) = std::process::Command::new("gdb")
        .args(["-batch", "-p", &pid, "-ex", "thread apply all bt"])
        .stdout(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::inherit())
        .status()
    {
        let _ = writeln!(std::io::stderr(), "(no gdb for backtraces: {e})");
    }
    std::process::exit(101);
}

/// Polls `f` every `step` until it returns true (then true) or `timeout` passes (then
/// false).
pub fn eventually_every(timeout: Duration, step: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(step);
    }
}

/// [`eventually_every`] with a 1 ms step.
pub fn eventually(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    eventually_every(timeout, Duration::from_millis(1), f)
}

/// Compares `#[repr(C)]` layouts with C headers: a C file including `includes` prints
/// each row's C expression (`sizeof(...)`, `offsetof(...)`, a constant), it is compiled
/// with `$CC` (default `cc`) and run, and every number is compared with the row's Rust
/// value. Returns how many rows matched; `Ok(None)` when one of `headers` is missing
/// (skip with a note), which is an error under `CI` (set by the CI runner).
///
/// # Errors
///
/// The compiler or the program failed, or the mismatches (`expr: C x, Rust y`, one per
/// line).
pub fn check_c_layout(headers: &[&str], rows: &[(&str, usize)]) -> Result<Option<usize>, String> {
    if headers.iter().any(|h| !std::path::Path::new(h).exists()) {
        if std::env::var_os("CI").is_some() {
            return Err(format!("CI is set but {headers:?} are missing"));
        }
        return Ok(None);
    }
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n");
    for h in headers {
        c.push_str(&format!("#include \"{h}\"\n"));
    }
    c.push_str("int main(void) {\n");
    for (expr, _) in rows {
        c.push_str(&format!("    printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    c.push_str("    return 0;\n}\n");
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("c-layout-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&src, &c).map_err(|e| e.to_string())?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = std::process::Command::new(&cc)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| format!("running {cc}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cc} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let run = std::process::Command::new(&exe)
        .output()
        .map_err(|e| e.to_string())?;
    std::fs::remove_dir_all(&dir).ok();
    let printed: Vec<usize> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    if !run.status.success() || printed.len() != rows.len() {
        return Err(format!(
            "the layout program printed {} of {} rows",
            printed.len(),
            rows.len()
        ));
    }
    let mismatches: Vec<String> = rows
        .iter()
        .zip(&printed)
        .filter(|((_, rust), c)| rust != *c)
        .map(|((expr, rust), c)| format!("{expr}: C {c}, Rust {rust}"))
        .collect();
    if mismatches.is_empty() {
        Ok(Some(rows.len()))
    } else {
        Err(format!("layout mismatches:\n{}", mismatches.join("\n")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // splitmix64 from seed 0: the reference sequence.
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn eventually_times_out_and_succeeds() {
        assert!(!eventually(Duration::from_millis(5), || false));
        let mut n = 0;
        assert!(eventually(Duration::from_secs(1), || {
            n += 1;
            n == 3
        }));
        assert_eq!(n, 3);
    }

    #[test]
    fn a_dropped_watchdog_does_not_fire() {
        let w = Watchdog::arm("quick", Duration::from_secs(5), String::new);
        drop(w);
    }
}
