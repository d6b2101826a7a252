//! The verbs objects over real devices (engine threads on a memory link): operations, flush,
//! errors, seeded random runs and regressions.

#[path = "../verbs_support/mod.rs"]
mod verbs_support;

mod errors;
mod flush;
mod ops;
mod random;
mod regressions;
