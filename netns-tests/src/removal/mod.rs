//! Device removal by tearing down the interface, end to end: the peer program
//! that `removal-peer` runs and its machine-readable report. The harness side (plans of
//! seeded removal moments, acting on TAPs, checking reports) is test code:
//! `tests/removal_support`, shared by the `tests/removal_*.rs` tests (and so by
//! `scripts/removal-long.sh`). The peer draws nothing at random: the harness passes it
//! a seed (`--seed`) and any delays on its command line.
//!
//! The modules: the options ([`PeerArgs`]), the report ([`PeerReport`]), the
//! recording handler ([`Recorder`]), devices and accounting ([`run_peer`]), the server
//! and the client; errors are [`PeerError`].
//!
//! # The peer
//!
//! One process in one namespace, on the public APIs only: a soft iWARP device
//! ([`softiwarp::Device`]) on a TAP, registered with an RDMA CM
//! ([`SoftRdmaCm`]); every id in callback mode with one recording [`Handler`].
//!
//! - **Server**: listens (on its address, or on `0.0.0.0` over two devices), accepts
//!   every request with a QP whose receives it keeps posted (a CQ poller thread per
//!   device), gives its MR's address and rkey in the accept's private data, optionally
//!   holds churn requests before accepting (`--hold-accept-ms`: the initiator then sits
//!   in the MPA exchange), and ends each connection when it ends: QP drained
//!   (posted == completed), id destroyed, QP destroyed.
//! - **Client**: `--load-qps` connections, each with a thread keeping RDMA Writes, RDMA
//!   Reads and Sends in flight (all signaled), plus a churn thread that sets up and
//!   tears down connections in a loop (resolve, route, MPA, one RDMA Write, disconnect,
//!   destroy), printing `PHASE <name> <t_ns>` at each step (`resolve-slow` resolves a
//!   silent address: the resolution is pending for 600 ms).
//!
//! Both end when their long-lived connections ended (by `DeviceRemoval`, or by
//! `Disconnected` when the other side's device went away and TCP gave up after
//! `--tcp-timeout-ms`), destroy every id and QP (a `DeviceRemoval` callback returns
//! [`Disposition::Destroy`] for a seeded half of the ids), wait for the device's
//! release, check their own invariants, and print one `RESULT <json>` line
//! ([`PeerReport`]); the exit status is 0 when no invariant was violated.
//!
//! Invariants each peer checks ([`PeerReport::violations`]): callbacks of one id never
//! overlap; no callback after destroy returned or after `DeviceRemoval`; at most one
//! `DeviceRemoval` per id, and exactly one for every id bound to the removed device and
//! not destroyed by its user; every QP drained (posted == completed, flushes counted)
//! and in ERROR before it is destroyed; no live object at the end ([`EndStats`]: ids,
//! devices, un-acked events, internal listeners, provider connections and QP
//! references); no thread left but the main one.
//!
//! Scenarios ([`Scenario`]): `load` (the random-moment test), `seed` (the 2007 seed:
//! a callback returns Destroy while removal starts), `destroy-blocked` (removal while a
//! destroy from another thread waits for a callback in progress), `readd` (a new device
//! on the re-created TAP, used by a new id), `wildcard` (a wildcard listener on two
//! devices loses one and keeps accepting on the other).
//!
//! Times are `CLOCK_REALTIME` nanoseconds ([`now_ns`]), comparable across the harness
//! and the peers (one machine).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdma_cm::{
    CmEvent, CmId, CmIdRef, ConnParam, Disposition, EventKind, Handler, IdState, RdmaCmConfig,
};
use serde::{Deserialize, Serialize};
use softiwarp::cm::iwcm::SoftQp;
use softiwarp::cm::rdmacm::{SoftDevice, SoftRdmaCm};
use softiwarp::transport::smoltcp_glue::TcpConfig;
use softiwarp::{Cq, Mr, Pd, QpInitAttr};
use softiwarp::{Device, DeviceConfig, LinkConfig};
use verbs::{AccessFlags, QpCap, QpState, RecvWr, SendFlags, SendWr, Stag, WcStatus};

/// The TCP port the server listens on.
pub const PORT: u16 = 7480;

/// An address on the harness's subnet that nobody answers ARP for (`resolve-slow`).
pub const SILENT_IP: Ipv4Addr = Ipv4Addr::new(10, 234, 0, 200);

/// Bytes of each RDMA Write and RDMA Read of the load.
const LOAD_LEN: u32 = 16 * 1024;
/// Bytes of each Send of the load (the server's receive buffers hold 4 KiB).
const SEND_LEN: u32 = 1024;
/// Send queue depth of a load QP.
const LOAD_SQ: u32 = 16;
/// Receives the server keeps posted on a load QP.
const LOAD_RQ: u32 = 1024;
/// Receives the client posts on a load QP (never consumed: flushed at the end).
const CLIENT_RQ: u32 = 4;
/// Capacity of a client QP's CQ: exactly what it may leave unpolled (every signaled
/// send-queue WR outstanding and every receive), so a peer that let more pile up
/// overruns it and is caught.
const CLIENT_CQ: usize = (LOAD_SQ + CLIENT_RQ) as usize;
/// Size of the server's target MR (RDMA Write and Read), bytes.
const SERVER_MR: u64 = 1 << 20;
/// Private data of a load connection request.
const LOAD_TAG: &[u8] = b"L";
/// Private data of a churn connection request.
const CHURN_TAG: &[u8] = b"C";
/// Private data of a connection made after the removal (wildcard, readd).
const AFTER_TAG: &[u8] = b"A";

pub use netlab::now_ns;

/// A progress line on stdout: `STEP <name> <t_ns>` (where an exit's time went).
fn step(name: &str) {
    println!("STEP {name} {}", now_ns());
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

mod args;
mod client;
mod devices;
mod recorder;
mod report;
mod server;

pub use args::*;
#[allow(unused_imports)]
use client::*;
pub use devices::*;
pub use recorder::*;
pub use report::*;
#[allow(unused_imports)]
use server::*;

/// Why a removal peer could not start or run (`removal-peer` exits with status 2 and
/// prints it). Invariant violations are not errors: they are in the [`PeerReport`].
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// A command-line value is missing or malformed (the message says which).
    #[error("{0}")]
    Usage(String),
    /// The soft device could not be opened on its TAP.
    #[error("open {tap}: {source}")]
    Open {
        /// The TAP's name.
        tap: String,
        /// Why.
        #[source]
        source: softiwarp::DeviceError,
    },
    /// The device could not be wrapped for the RDMA CM.
    #[error("{0}")]
    Device(#[from] softiwarp::DeviceError),
    /// The RDMA CM could not be created, or refused the device, the bind or the listen.
    #[error("{0}")]
    Cm(#[from] rdma_cm::CmError),
    /// A verbs object (PD, MR, CQ) of the server could not be made.
    #[error("{0}")]
    Verbs(#[source] verbs::VerbsError),
    /// A thread could not be started.
    #[error("{0}")]
    Thread(#[source] std::io::Error),
}
