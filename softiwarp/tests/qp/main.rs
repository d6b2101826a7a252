//! The sans-IO per-QP RDMAP engine (`softiwarp::rdmap::engine`), two QPs wired back to back
//! by moving whole ULPDUs: operations, flush and states, a hostile peer, seeded random runs;
//! and the whole receive path (MPA exchange, binding, engine) under a hostile byte stream;
//! QPs sharing a receive queue.

#[path = "../support/mod.rs"]
mod support;

mod atomics;
mod flush;
mod hostile;
mod ops;
mod random;
mod rx_path_fuzz;
mod srq;
