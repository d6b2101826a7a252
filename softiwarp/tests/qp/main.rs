//! The sans-IO per-QP RDMAP engine (`softiwarp::rdmap::engine`), two QPs wired back to back
//! by moving whole ULPDUs: operations, flush and states, a hostile peer, seeded random runs.

#[path = "../support/mod.rs"]
mod support;

mod flush;
mod hostile;
mod ops;
mod random;
