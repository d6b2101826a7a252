//! The synchronization primitives shared by the progress protocol
//! ([`crate::engine::progress`]) and the completion queues
//! ([`crate::resources::completion_queue`]): `std`'s normally, loom's model-checked ones
//! when the crate is built with `RUSTFLAGS="--cfg loom"`, so that the loom models
//! (`softiwarp/tests/loom_progress.rs`) check the real code, as rdma-cm's `sync` module
//! does for the connection manager.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
