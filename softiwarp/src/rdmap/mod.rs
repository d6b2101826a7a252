//! The sans-IO per-QP RDMAP/DDP engine (RFC 5040, RFC 5041) and its binding to a
//! connection: [`engine::QpEngine`] (siw_qp.c; its transmit and receive paths in
//! `engine/tx.rs` and `engine/rx.rs`, siw_qp_tx.c and siw_qp_rx.c) and [`binding`] (the
//! QP as a connection's upper layer, the state it shares with the verbs objects).
//!
//! **Room.** No threads, no clock, no socket: ULPDUs in, ULPDUs out, completions into
//! CQs. It touches `resources` (the STag table for placement and gathering, the CQs, the
//! event queues) and `transport` (the [`Ulp`](crate::transport::Ulp) trait and connection
//! errors); the engine thread drives it. Public for the crate's tests and benchmarks.

pub mod binding;
pub mod engine;
