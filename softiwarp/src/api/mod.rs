//! The public surface (siw_verbs.c's role), re-exported at the crate root: [`Device`]
//! and its connections (`device.rs`), and the verbs objects [`Pd`], [`Mr`], [`Cq`] and
//! [`Qp`] (`verbs_objects.rs`).
//!
//! **Room.** Calls run on the application's threads: they validate, then hand the work
//! to the engine thread through its [`Handle`](crate::engine::Handle) (commands, QP work
//! queues and doorbells) and wait on one-shot replies or queues; nothing here runs on the
//! engine thread. It touches every folder below it (`engine`, `rdmap`, `resources`,
//! `transport`, `link`); only `cm` sits above it.
//!
//! [`Device`]: crate::Device
//! [`Pd`]: crate::Pd
//! [`Mr`]: crate::Mr
//! [`Cq`]: crate::Cq
//! [`Qp`]: crate::Qp

pub(crate) mod device;
pub(crate) mod verbs_objects;
