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
