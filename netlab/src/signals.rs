//! Cleanup on SIGINT, SIGTERM and SIGHUP for long-running tools, and the registry of what
//! this process made (peer pids, namespace names) that the cleanup works from.
//!
//! [`install_handler`] blocks the three signals in the calling thread (call it first
//! thing in `main`, before any thread is started, so every thread inherits the mask;
//! children get a clean mask, `std::process::Command` resets it) and starts a thread that
//! waits for them with `sigwait(3)`. No code runs in signal context. On the first
//! signal the thread:
//!
//! 1. sets the flag [`interrupted`] (so [`crate::wait_all`] and [`Peer::wait`] return
//!    [`HarnessError::Interrupted`](crate::HarnessError::Interrupted), and new spawns are
//!    refused),
//! 2. sends SIGKILL to every registered peer pid (a pid stays registered until its
//!    process is reaped, under the same lock, so a recycled pid is never hit),
//! 3. gives the main thread 10 s to unwind through its `Drop` guards and exit; if it has
//!    not, deletes every registered namespace itself and exits with 128 + the signal.
//!
//! A second signal skips the wait. Without the handler (as in `cargo test`), a signal ends
//! the process at once: peers die with it (they set a parent-death signal, see
//! [`crate::logging::init_peer`]) and the next [`crate::Topology::create`] removes the
//! namespaces left behind.
//!
//! [`Peer::wait`]: crate::Peer::wait

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::Pid;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// What this process made and has not removed yet.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// Pids of peer processes not reaped yet.
    pub(crate) pids: BTreeSet<u32>,
    /// Names of namespaces not deleted yet.
    pub(crate) namespaces: BTreeSet<String>,
}

pub(crate) fn registry() -> MutexGuard<'static, Registry> {
    static REG: OnceLock<Mutex<Registry>> = OnceLock::new();
    REG.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// `true` once SIGINT, SIGTERM or SIGHUP arrived (only with [`install_handler`]).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Errors of [`install_handler`].
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// `pthread_sigmask` failed.
    #[error("cannot block signals: {0}")]
    Mask(#[source] nix::Error),
    /// The handler thread could not be started.
    #[error("cannot start the signal thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The handler is already installed.
    #[error("the signal handler is already installed")]
    AlreadyInstalled,
}

fn kill_peers(reg: &Registry) {
    for &pid in &reg.pids {
        if let Ok(p) = i32::try_from(pid) {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
    }
}

fn emergency_cleanup(sig: Signal) -> ! {
    let reg = registry();
    kill_peers(&reg);
    for ns in &reg.namespaces {
        // Deleting the namespace removes its interfaces once its last user is gone.
        let _ = crate::netns::run_ip(&["netns", "del", ns]);
        eprintln!("removed namespace {ns}");
    }
    std::process::exit(128 + sig as i32)
}

/// Installs the handler described in the [module docs](self). Call it at the start of
/// `main`, before starting threads.
///
/// Errors: [`SignalError::AlreadyInstalled`] on a second call; the mask or thread could
/// not be set up.
pub fn install_handler() -> Result<(), SignalError> {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return Err(SignalError::AlreadyInstalled);
    }
    let mut mask = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        mask.add(s);
    }
    mask.thread_block().map_err(SignalError::Mask)?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let Ok(first) = mask.wait() else { return };
            INTERRUPTED.store(true, Ordering::SeqCst);
            eprintln!("interrupted by {first}: stopping peers and removing namespaces");
            kill_peers(&registry());
            // Wait for the main thread to unwind; a second signal cuts it short.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                if let Ok(s) = mask.wait() {
                    let _ = tx.send(s);
                }
            });
            let sig = rx.recv_timeout(Duration::from_secs(10)).unwrap_or(first);
            emergency_cleanup(sig)
        })
        .map_err(SignalError::Thread)?;
    Ok(())
}
