//! Root-only test harness: network namespaces, TAPs and bridges made and removed by the
//! harness itself, peer processes run inside them under a watchdog, and the two-process
//! tests built on it (`tests/`).
//!
//! The pieces:
//!
//! - [`Topology`]: two namespaces A and B, each with a TAP on a bridge, joined by a veth
//!   pair (the topology of `shared/transport-notes.md`, built by
//!   [`softiwarp::netns::TapPair`]), plus an addressing plan for the userspace stacks
//!   that own the IP addresses ([`Endpoint`]). Dropping it removes everything.
//! - [`PeerSpec`] / [`Peer`]: a child process started inside a namespace
//!   (`ip netns exec NS PROGRAM ARGS`, which `exec`s in place, so the child's pid is the
//!   program's), its stdout and stderr collected (and echoed, line by line, with the
//!   peer's name), its exit status, and a watchdog: a peer that outlives its timeout has
//!   its threads' stacks dumped (gdb when installed, and the kernel's view from
//!   `/proc/PID/task/*`) and is killed. [`wait_all`] watches several peers at once and
//!   stops the others soon after one fails.
//! - [`signals`]: for long-running tools, a handler for SIGINT/SIGTERM/SIGHUP that kills
//!   the peers this process started (by pid) and makes the main thread unwind through its
//!   `Drop` guards; if it does not within 10 s, the handler deletes the namespaces itself.
//! - [`logging`]: `tracing` set up from `RUST_LOG`, and [`logging::init_peer`] for peer
//!   binaries (which also asks the kernel to kill a peer whose harness died).
//! - [`ulpdu`] and [`mpa_peer`]: a verifiable stream of ULPDUs (RDMA Write DDP segments
//!   carrying a known pattern) over one MPA connection of the soft iWARP device's public
//!   API, and one side of such a transfer on a TAP: what the `iwarp-peer` binary runs.
//! - [`capture`]: a pcap writer that keeps only the first megabytes of whole frames, and a
//!   tshark check of what Wireshark's iWARP dissectors make of a capture.
//!
//! The tests (`tests/`): `harness.rs` tests the harness itself; `iwarp_two_process.rs`
//! moves 1 GiB of ULPDUs between two `iwarp-peer` processes in two namespaces, verified
//! ULPDU by ULPDU and by a CRC32c of everything, with a capture of the first 20 MB checked
//! by `iwdump` and tshark, and checks that an aborted transfer fails loudly and leaves
//! nothing behind. They need root and skip (saying so) without it; tshark is required when
//! `CI` is set.
//!
//! What is left behind by a run that was killed outright (SIGKILL) is removed by the next
//! one: [`Topology::create`] calls [`softiwarp::netns::remove_stale`], which deletes
//! namespaces of the harness's naming scheme whose process is gone.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use netns_tests::{wait_all, Side, Topology};
//!
//! # fn main() -> Result<(), netns_tests::HarnessError> {
//! let topo = Topology::create(1500)?;
//! let mut server = topo.peer(Side::A, "server", "/bin/sh").args(["-c", "echo READY; sleep 1"]).spawn()?;
//! server.wait_for_line(|l| l == "READY", Duration::from_secs(5))?;
//! let client = topo.peer(Side::B, "client", "/bin/true").spawn()?;
//! let outputs = wait_all(vec![server, client], Duration::from_secs(10))?;
//! assert!(outputs.iter().all(|o| o.status.success()));
//! # Ok(())
//! # }
//! ```

/// For root-only tests: true (after a note on stderr naming `test`) when this process is
/// not root, so the test returns early and passes as skipped; false as root.
pub fn skip_unless_root(test: &str) -> bool {
    if softiwarp::netns::is_root() {
        return false;
    }
    eprintln!("skipping {test}: needs root (network namespaces and TAPs)");
    true
}

pub mod capture;
pub mod iwping;
pub mod logging;
pub mod mpa_peer;
pub mod peer;
pub mod removal;
pub mod rping;
pub mod signals;
pub mod siwvm;
pub mod topology;
pub mod ulpdu;

pub use peer::{
    dump_stacks, wait_all, wait_all_with_grace, FailureKind, Peer, PeerFailure, PeerOutput,
    PeerSpec, PEER_ENV,
};
pub use topology::{
    format_mac, host_ip, host_mac, leftover_namespaces, parse_cidr, parse_mac, Endpoint, Side,
    Topology,
};

/// Errors of the harness.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// Not running as root: namespaces and TAPs need `CAP_SYS_ADMIN`/`CAP_NET_ADMIN`.
    #[error("needs root (network namespaces and TAPs)")]
    NotRoot,
    /// Building the namespaces, TAPs or bridges failed (the message has `ip`'s stderr).
    #[error("setting up the network topology failed: {0}")]
    Setup(#[source] std::io::Error),
    /// A peer process could not be started.
    #[error("cannot start peer {name} (`{command}`): {source}")]
    Spawn {
        /// The peer's name.
        name: String,
        /// The command line.
        command: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A peer failed: exited non-zero or by a signal, timed out, exited before printing
    /// what was waited for, or was stopped because another peer failed.
    #[error("{0}")]
    Peer(Box<PeerFailure>),
    /// SIGINT, SIGTERM or SIGHUP arrived (see [`signals`]); peers were killed.
    #[error("interrupted by a signal")]
    Interrupted,
}
