//! `iwperf`: perftest for the soft iWARP device, and the demo that runs it between two
//! network namespaces beside a raw smoltcp TCP baseline. The same code runs on an
//! rdma-core device (`--device siw0`, `--device cxgb4_0`): everything past opening
//! the device is generic over `verbs::provider::Provider`.
//!
//! The layers (only [`conn`] talks to the RDMA CM; only [`datapath`] posts and polls):
//!
//! - [`wire`]: what the peers tell each other (test parameters in the MPA Request's
//!   private data, the server's memory region in the Reply's, control messages) and
//!   the Read depth they ask for ([`wire::MAX_RD_ATOMIC`]).
//! - [`conn`]: opening the soft device and everything RDMA CM, over a provider's event
//!   channel: listen / accept on the server, resolve / connect on the client, the
//!   connection events (a `DeviceRemoval` on any id ends the run), disconnect and
//!   destroy.
//! - [`datapath`]: the verbs side: PD, CQ, MRs, the bandwidth loops (Write, Read, Send
//!   with receive credits) and the ping-pong latency loops, `--verify` patterned data;
//!   every loop posts within a [`window::SendWindow`] of its send queue and polls as it
//!   goes, never waiting for `QueueFull`.
//! - [`report`]: perftest's tables, latency statistics, the demo's table and JSON.
//! - [`peer`]: one whole side (server or client) as the `iwperf server` / `iwperf
//!   client` commands and the demo run it: device ([`peer::Backend`]), connections,
//!   run, teardown.
//! - [`netdev`]: an rdma-core device's IPv4 address (its interface's).
//! - [`demo`]: `iwperf demo`: two namespaces with a TAP each (or, without root, an
//!   in-memory link in one process), the raw TCP baseline, Write, Read, Send and the
//!   latency row, one table.
//!
//! [`datapath`] uses [`conn`] (it implements [`conn::VerbsSetup`], the hooks connection
//! setup calls) and never the other way; what both need is in [`wire`].
//!
//! Exit statuses of the binary: [`IwperfError::exit_code`].

pub mod conn;
pub mod datapath;
pub mod demo;
pub mod ledger;
pub mod netdev;
pub mod peer;
pub mod report;
#[cfg(test)]
mod strict;
pub mod window;
pub mod wire;

/// Exit status: success.
pub const EXIT_OK: u8 = 0;
/// Exit status: any other failure (link, device, namespaces, a peer process).
pub const EXIT_FAILURE: u8 = 1;
/// Exit status: bad command line (clap's own usage errors use it too).
pub const EXIT_USAGE: u8 = 2;
/// Exit status: the connection could not be made or was lost (address or route
/// resolution failed, rejected, unreachable, a work completion in error, the peer went
/// away).
pub const EXIT_CONNECTION: u8 = 3;
/// Exit status: `--device` names no RDMA device, or rdma-core (libibverbs.so.1,
/// librdmacm.so.1) is not installed: one line on stderr says which. The same number as
/// [`EXIT_CONNECTION`] (there is nothing to connect with).
pub const EXIT_NO_DEVICE: u8 = 3;
/// Exit status: `--verify` found data that did not match.
pub const EXIT_VERIFY: u8 = 4;
/// Exit status: the device was removed (`DeviceRemoval` on an id) during the run;
/// partial results were printed.
pub const EXIT_DEVICE_REMOVAL: u8 = 5;
/// Exit status: interrupted by SIGINT / SIGTERM / SIGHUP (128 + SIGINT).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Errors of iwperf, each with its exit status.
#[derive(Debug, thiserror::Error)]
pub enum IwperfError {
    /// A bad option or combination of options.
    #[error("usage: {0}")]
    Usage(String),
    /// `--device` names no RDMA device, or rdma-core is not installed (the message is
    /// cxgb4's one line: "no RDMA device named 'X' (found: ...)", "rdma-core
    /// (libibverbs.so.1) not found").
    #[error("{0}")]
    NoDevice(String),
    /// The device, link or a verbs object could not be set up.
    #[error("setup: {0}")]
    Setup(String),
    /// Connection setup failed, or the connection was lost during the run.
    #[error("connection: {0}")]
    Connection(String),
    /// The data did not match.
    #[error("verify: {0}")]
    Verify(String),
    /// `DeviceRemoval` arrived on an id.
    #[error("device removed: {0}")]
    DeviceRemoved(String),
    /// The demo or a peer process failed.
    #[error(transparent)]
    Bench(#[from] crate::BenchError),
    /// SIGINT, SIGTERM or SIGHUP.
    #[error("interrupted by a signal")]
    Interrupted,
}

impl IwperfError {
    /// The exit status for this error: [`EXIT_USAGE`], [`EXIT_FAILURE`],
    /// [`EXIT_CONNECTION`], [`EXIT_NO_DEVICE`], [`EXIT_VERIFY`],
    /// [`EXIT_DEVICE_REMOVAL`] or [`EXIT_INTERRUPTED`].
    pub fn exit_code(&self) -> u8 {
        match self {
            IwperfError::Usage(_) => EXIT_USAGE,
            IwperfError::Setup(_) | IwperfError::Bench(_) => EXIT_FAILURE,
            IwperfError::Connection(_) => EXIT_CONNECTION,
            IwperfError::NoDevice(_) => EXIT_NO_DEVICE,
            IwperfError::Verify(_) => EXIT_VERIFY,
            IwperfError::DeviceRemoved(_) => EXIT_DEVICE_REMOVAL,
            IwperfError::Interrupted => EXIT_INTERRUPTED,
        }
    }

    /// The error a peer process's exit status stands for, if it is one of ours (the demo
    /// passes a peer's verify / connection / removal failure on with the same status).
    pub fn from_exit_code(code: i32, message: String) -> Option<IwperfError> {
        match u8::try_from(code).ok()? {
            EXIT_CONNECTION => Some(IwperfError::Connection(message)),
            EXIT_VERIFY => Some(IwperfError::Verify(message)),
            EXIT_DEVICE_REMOVAL => Some(IwperfError::DeviceRemoved(message)),
            EXIT_USAGE => Some(IwperfError::Usage(message)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct() {
        assert_eq!(IwperfError::NoDevice("x".into()).exit_code(), 3);
        assert_eq!(IwperfError::NoDevice("x y".into()).to_string(), "x y");
        let errs = [
            IwperfError::Usage(String::new()),
            IwperfError::Setup(String::new()),
            IwperfError::Connection(String::new()),
            IwperfError::Verify(String::new()),
            IwperfError::DeviceRemoved(String::new()),
            IwperfError::Interrupted,
        ];
        let mut codes: Vec<u8> = errs.iter().map(IwperfError::exit_code).collect();
        assert_eq!(codes, vec![2, 1, 3, 4, 5, 130]);
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), errs.len());
        for c in [3, 4, 5] {
            let e = IwperfError::from_exit_code(c, "x".into()).unwrap();
            assert_eq!(i32::from(e.exit_code()), c);
        }
        assert!(IwperfError::from_exit_code(1, String::new()).is_none());
    }
}
