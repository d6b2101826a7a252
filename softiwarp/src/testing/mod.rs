//! Test support compiled only with the cargo feature `testing` (tests, fuzz targets):
//! harnesses that need the crate's internals (the QP binding, [`crate::rdmap::binding`])
//! and so cannot live in a test crate.
//!
//! **Why a feature of the product crate.** The whole-receive-path harness
//! ([`rx_path`]) drives the real `QpUlp` / `QpCore` binding, which is `pub(crate)`:
//! a file included into the fuzz target by `#[path]` could not reach it. So, as
//! `iw-cm`'s `testing` feature does, the harness is an optional module of the product
//! crate, off by default: `softiwarp`'s own tests enable it through a self
//! dev-dependency, and `fuzz/Cargo.toml` enables it on its path dependency. No product
//! crate depends on it.

pub mod rx_path;
