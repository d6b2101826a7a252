//! The soft iWARP device: PD/MR/CQ/QP objects, the STag table, the per-QP protocol
//! engine, the smoltcp transport over a TAP or in-memory link, and the engine thread.
//!
//! Filled in by steps 2 (transport, issue #3) and 3 (verbs and QP engine, issue #4).
//! Nothing here yet: see `docs/ARCHITECTURE.md` for the plan.
