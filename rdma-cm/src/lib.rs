//! The RDMA connection manager (the kernel's `rdma_cm` / librdmacm API): ids, event
//! channels, serialized callbacks, destroy semantics and device removal.
//!
//! Filled in by step 5 (issue #6). Nothing here yet: see `docs/ARCHITECTURE.md`.
