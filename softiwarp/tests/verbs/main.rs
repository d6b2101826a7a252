//! The verbs objects over real devices (engine threads on a memory link): operations, flush,
//! errors, seeded random runs and regressions; shared receive queues.

#[path = "../support/mod.rs"]
mod support;

mod atomics;
mod errors;
mod flush;
mod ops;
mod progress;
mod random;
mod regressions;
mod srq;
mod user_memory;
