//! The iWARP connection manager (the kernel's `iw_cm`): cm_ids, the provider trait,
//! ordered per-id event delivery, non-blocking destroy and free on last reference.
//!
//! Filled in by step 4 (issue #5). Nothing here yet: see `docs/ARCHITECTURE.md`.
