//! The lab: what softiwarp's tools, benchmarks and root-only tests need to run peers on
//! real kernel interfaces, and nothing of the iWARP stack itself.
//!
//! Its room: network namespaces, TAPs, bridges and veths made (with `ip(8)`) and removed
//! by the lab itself, child processes started inside them under a watchdog, signal
//! clean-up, logging set-up, captures, the siw VM, and the shared link options. It
//! touches std, nix, clap and tracing; nothing of ours (every tool, benchmark and test
//! crate may use it; it never names softiwarp, rdma-cm or their types).
//!
//! The pieces:
//!
//! - [`netns`]: namespaces ([`netns::NetNs`]), the two-TAP topology ([`netns::TapPair`]),
//!   the one `ip` runner ([`netns::run_ip`], [`netns::ip_output`], [`netns::ArmedIp`]),
//!   TAPs on a bridge ([`netns::add_tap_on_bridge`]),
//!   [`netns::is_root`], and the removal of what a killed run left behind.
//! - [`Topology`]: two namespaces A and B, each with a TAP on a bridge, joined by a veth
//!   pair (the topology of `shared/transport-notes.md`, built by [`netns::TapPair`]), plus
//!   an addressing plan for the userspace stacks that own the IP addresses
//!   ([`Endpoint`]). Dropping it removes everything.
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
//! - [`capture`]: a pcap writer that keeps only the first megabytes of whole frames, and a
//!   tshark check of what Wireshark's iWARP dissectors make of a capture.
//! - [`siwvm`]: a small VM running the kernel's siw driver, for interoperability tests.
//! - [`LinkArgs`]: the `--tap --ip --mac --pcap` options every tool and peer binary
//!   flattens into its command line, with [`parse_cidr`] and [`parse_mac`].
//! - [`HostInterface`]: the host interface a tool's `--netdev IF` names (the soft device
//!   on kernel TCP), its IPv4 addresses, and [`netdev_conflict`], the message for an
//!   option that does not go with it.
//! - [`VethPair`]: two namespaces joined by one veth with the kernel's addresses on its
//!   ends (for `--netdev`); dropping it removes everything.
//!
//! What is left behind by a run that was killed outright (SIGKILL) is removed by the next
//! one: [`Topology::create`] calls [`netns::remove_stale`], which deletes namespaces of the
//! lab's naming scheme whose process is gone.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use netlab::{wait_all, Side, Topology};
//!
//! # fn main() -> Result<(), netlab::HarnessError> {
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
    if netns::is_root() {
        return false;
    }
    eprintln!("skipping {test}: needs root (network namespaces and TAPs)");
    true
}

/// Nanoseconds since the Unix epoch (`CLOCK_REALTIME`): the one clock the harness and
/// every peer share.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub mod capture;
pub mod host_if;
pub mod link_args;
pub mod logging;
pub mod netns;
pub mod peer;
pub mod signals;
pub mod siwvm;
pub mod topology;
pub mod veth;

pub use host_if::{netdev_conflict, HostInterface, InterfaceError};
pub use link_args::{format_mac, parse_cidr, parse_mac, LinkArgs};
pub use peer::{
    dump_stacks, wait_all, wait_all_with_grace, wait_exits, FailureKind, Peer, PeerFailure,
    PeerOutput, PeerSpec, PEER_ENV,
};
pub use topology::{host_ip, host_mac, leftover_namespaces, Endpoint, Side, Topology};
pub use veth::VethPair;

/// Errors of the lab.
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
