//! The hardware backend over rdma-core (libibverbs + librdmacm, loaded at run time).

pub mod ffi;

pub use ffi::{LoadError, RdmaCore};
pub mod caps;
pub mod translate;
