//! Root-only integration tests: network namespaces, TAPs and bridges made and removed by
//! the tests themselves, two peer processes, device removal by tearing the interface down.
//!
//! Filled in from step 2 (issue #3) on. Nothing here yet: see `docs/ARCHITECTURE.md`.
