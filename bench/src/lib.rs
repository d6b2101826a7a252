//! `iwperf`, the perftest-like throughput and latency tool, its `demo` (the main job),
//! and criterion micro-benchmarks.
//!
//! Filled in from step 2 (issue #3) on. Nothing here yet: see `docs/ARCHITECTURE.md`.
