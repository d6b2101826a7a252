//! The harnesses of softiwarp's integration tests, one module each, shared by every test
//! binary (`#[path = "../support/mod.rs"] mod support;` in its `main.rs`):
//!
//! - [`host`]: a bare smoltcp host over a link and the two ends of a TCP echo;
//! - [`stack`]: transport `Stack`s (and a raw smoltcp TCP peer) on a memory link pair,
//!   stepped on a virtual clock, and seeded ULPDU flows;
//! - [`qp`]: two sans-IO QP engines back to back, moving whole ULPDUs;
//! - [`devices`]: two real devices (engine threads) on a memory link with verbs objects;
//! - [`iwcm`]: two soft devices each with its `SoftProvider` and `IwCm`, a delivery
//!   checker and a raw MPA peer.
#![allow(dead_code)] // each test binary uses a different subset

pub mod devices;
pub mod host;
pub mod iwcm;
pub mod qp;
pub mod stack;

use softiwarp::link::{MemoryConfig, MemoryLink};
use verbs::{AccessFlags, QpCap};

/// Every access right an MR can have.
pub fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

/// A QP capability set: `depth` WRs per queue, `sges` SGEs per WR, 256 inline bytes.
pub fn cap(depth: u32, sges: u32) -> QpCap {
    QpCap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: sges,
        max_recv_sge: sges,
        max_inline_data: 256,
    }
}

/// A memory link pair with `mtu`.
pub fn links(mtu: usize) -> (MemoryLink, MemoryLink) {
    MemoryLink::pair(MemoryConfig {
        mtu,
        ..Default::default()
    })
    .expect("memory link")
}
