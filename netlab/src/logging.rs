//! `tracing` for the harness's tools and peer binaries, filtered by `RUST_LOG`
//! (`tracing-subscriber`'s `EnvFilter` syntax, e.g. `RUST_LOG=softiwarp=debug,info`).
//! Peers inherit the harness's environment, so one `RUST_LOG` reaches every process.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::peer::PEER_ENV;

/// Sends `tracing` events to stderr, filtered by `RUST_LOG`, or by `default_filter` when
/// `RUST_LOG` is unset or invalid. A second call (or another subscriber already set) is
/// a no-op.
pub fn init_tracing(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Errors of [`init_peer`].
#[derive(Debug, thiserror::Error)]
pub enum PeerInitError {
    /// `prctl(PR_SET_PDEATHSIG)` failed.
    #[error("cannot set the parent-death signal: {0}")]
    Pdeathsig(#[source] nix::Error),
    /// The harness that started this peer is already gone.
    #[error("the harness that started this peer has exited")]
    Orphaned,
}

/// Start-up of a peer binary: [`init_tracing`], and, when started by the harness (the
/// [`PEER_ENV`] variable is set), a parent-death signal (SIGKILL) so the peer never
/// outlives a harness that was killed. The kernel sends it when the *thread* that started
/// the peer exits, so harness code starts peers from a thread that outlives them.
///
/// Errors: the `prctl` failed, or the parent already exited ([`PeerInitError::Orphaned`]).
pub fn init_peer(default_filter: &str) -> Result<(), PeerInitError> {
    init_tracing(default_filter);
    if std::env::var_os(PEER_ENV).is_some() {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(PeerInitError::Pdeathsig)?;
        // The parent may have died before the prctl: then we were re-parented.
        let expected = std::env::var(PEER_ENV)
            .ok()
            .and_then(|v| v.parse::<i32>().ok());
        if let Some(ppid) = expected {
            if nix::unistd::getppid().as_raw() != ppid {
                return Err(PeerInitError::Orphaned);
            }
        }
    }
    Ok(())
}
