//! The device under the connection managers (siw_cm.c's role): [`iwcm::SoftProvider`]
//! implements `iw_cm::Provider` over a [`Device`](crate::Device), with its provider
//! thread; [`rdmacm::SoftDevice`] implements `rdma_cm::CmDevice` over a device and its
//! provider, with its link watcher ([`rdmacm::SoftRdmaCm`] is the RDMA CM over soft
//! devices); [`provider::SoftCm`] and its objects put the soft device behind the
//! provider-neutral boundary of `verbs::provider`.
//!
//! **Room.** The only folder that names `iw-cm` and `rdma-cm`: it implements their traits,
//! and their cores never name this crate. It uses the device through the crate's public
//! surface (the root, [`crate::link`], [`crate::transport`]) as any other user would; its
//! threads only enqueue towards the CMs and never run a CM callback.

pub mod iwcm;
// Not under `--cfg loom`: it waits on rdma-cm's event channel with a timeout, which the
// loom build of rdma-cm leaves out (the loom models drive the progress lock, not this).
#[cfg(not(loom))]
pub mod provider;
pub mod rdmacm;
