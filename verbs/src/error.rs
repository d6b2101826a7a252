//! Errors of verbs calls, each mapped to the errno libibverbs returns for it.
//!
//! A verb that fails synchronously (a post, a registration, a modify) returns
//! [`VerbsError`]; failures discovered while a WR is executed are reported in
//! its [`crate::WorkCompletion`] instead. libibverbs returns an errno for the
//! synchronous failures (`ibv_post_send(3)`: "returns 0 on success, or the
//! value of errno on failure"); [`VerbsError::errno`] gives that value, so the
//! hardware backend can translate in both directions and applications can log
//! the familiar code.

use crate::access::AccessFlagsError;
use crate::qp::{QpState, QpTransitionError};
use crate::stag::{Stag, StagIndexError};
use crate::AccessFlags;
use core::fmt;
use thiserror::Error;

/// Linux errno values used by [`VerbsError::errno`] (`<asm-generic/errno-base.h>`,
/// `<asm-generic/errno.h>`). Defined here so the crate needs no libc.
pub mod errno {
    /// Operation not permitted.
    pub const EPERM: i32 = 1;
    /// I/O error: what uverbs returns once the device is disassociated
    /// (hot-removed).
    pub const EIO: i32 = 5;
    /// Out of memory; also "queue full" from the post calls.
    pub const ENOMEM: i32 = 12;
    /// Permission denied.
    pub const EACCES: i32 = 13;
    /// Bad address.
    pub const EFAULT: i32 = 14;
    /// Device or resource busy: object still in use.
    pub const EBUSY: i32 = 16;
    /// No such device.
    pub const ENODEV: i32 = 19;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Operation not supported.
    pub const EOPNOTSUPP: i32 = 95;
}

/// Which queue a [`VerbsError::QueueFull`] refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkQueue {
    /// The send queue of a QP (`ibv_post_send`).
    Send,
    /// The receive queue of a QP (`ibv_post_recv`).
    Recv,
    /// A completion queue.
    Completion,
}

impl fmt::Display for WorkQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WorkQueue::Send => "send queue",
            WorkQueue::Recv => "receive queue",
            WorkQueue::Completion => "completion queue",
        })
    }
}

/// The kind of verbs object an error names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// Device context (`struct ibv_context`).
    Device,
    /// Protection domain (`struct ibv_pd`).
    Pd,
    /// Memory region (`struct ibv_mr`).
    Mr,
    /// Memory window (`struct ibv_mw`).
    Mw,
    /// Completion queue (`struct ibv_cq`).
    Cq,
    /// Completion event channel (`struct ibv_comp_channel`).
    CompChannel,
    /// Queue pair (`struct ibv_qp`).
    Qp,
    /// Shared receive queue (`struct ibv_srq`).
    Srq,
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ObjectKind::Device => "device",
            ObjectKind::Pd => "PD",
            ObjectKind::Mr => "MR",
            ObjectKind::Mw => "MW",
            ObjectKind::Cq => "CQ",
            ObjectKind::CompChannel => "completion channel",
            ObjectKind::Qp => "QP",
            ObjectKind::Srq => "SRQ",
        })
    }
}

/// A verbs call that failed synchronously. [`VerbsError::errno`] gives the
/// errno libibverbs (with the kernel uverbs layer and the Linux siw / cxgb4
/// providers) returns for the same failure.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VerbsError {
    /// An argument is invalid; `what` names it (for example `"sg_list"`,
    /// `"length"`, `"send_flags"`). `EINVAL`.
    #[error("invalid argument: {what}")]
    InvalidArgument {
        /// The offending argument or field.
        what: &'static str,
    },
    /// Access flags unacceptable for a registration
    /// ([`AccessFlags::for_mr`]). `EINVAL`, as `ibv_reg_mr(3)`.
    #[error("invalid access flags: {0}")]
    InvalidAccessFlags(#[from] AccessFlagsError),
    /// A STag index out of range. `EINVAL`.
    #[error(transparent)]
    InvalidStagIndex(#[from] StagIndexError),
    /// `modify_qp` asked for a transition not in the table
    /// ([`crate::check_transition`]). `EINVAL`, as `ibv_modify_qp(3)`.
    #[error(transparent)]
    IllegalTransition(#[from] QpTransitionError),
    /// The QP's state does not allow the call (posting a send WR in Reset,
    /// Init or RTR; posting a receive in Reset; a send in Error on a backend
    /// that rejects rather than flushes). `EINVAL`, as libcxgb4's and mlx5's
    /// post calls return (Linux siw returns `ENOTCONN` here).
    #[error("{op} not allowed in QP state {state}")]
    InvalidQpState {
        /// The call, e.g. `"post_send"`.
        op: &'static str,
        /// The QP's state at the time of the call.
        state: QpState,
    },
    /// The queue has no free slot: `depth` WRs (or CQEs) are outstanding.
    /// `ENOMEM`, as the post calls of libibverbs providers return.
    #[error("{queue} full ({depth} entries outstanding)")]
    QueueFull {
        /// Which queue.
        queue: WorkQueue,
        /// Its capacity, in entries.
        depth: u32,
    },
    /// A WR has more SGEs than the QP was created for
    /// ([`crate::QpCap::max_send_sge`] / `max_recv_sge`). `EINVAL`.
    #[error("{num_sge} SGEs exceed the QP's maximum of {max}")]
    TooManySges {
        /// SGEs in the WR.
        num_sge: usize,
        /// The QP's limit.
        max: u32,
    },
    /// Inline payload longer than [`crate::QpCap::max_inline_data`]. `EINVAL`.
    #[error("inline data of {len} bytes exceeds the QP's maximum of {max} bytes")]
    InlineTooLong {
        /// Inline payload length, in bytes.
        len: usize,
        /// The QP's limit, in bytes.
        max: u32,
    },
    /// A message longer than the device allows (the SGE lengths of one WR sum
    /// past `max` bytes; at most 2^32 - 1 since `ibv_wc.byte_len` is 32-bit).
    /// `EINVAL`.
    #[error("message of {len} bytes exceeds the maximum of {max} bytes")]
    MessageTooLong {
        /// Total length requested, in bytes.
        len: u64,
        /// The limit, in bytes.
        max: u64,
    },
    /// An address range does not lie within the memory region it refers to
    /// (a fast registration, a window bind, a local range check). `EINVAL`.
    #[error("range [{addr:#x}, +{length}) outside MR [{mr_addr:#x}, +{mr_length})")]
    MrOutOfBounds {
        /// Start of the requested range (iova).
        addr: u64,
        /// Length of the requested range, in bytes.
        length: u64,
        /// Start of the MR (iova).
        mr_addr: u64,
        /// Length of the MR, in bytes.
        mr_length: u64,
    },
    /// The memory object named by `stag` does not grant the rights the call
    /// needs (for example binding a window to an MR without `MW_BIND`, or a
    /// registration asking for write access to read-only memory). `EACCES`.
    #[error("access denied: {stag} lacks {needed:?}")]
    AccessDenied {
        /// The STag (lkey) of the memory object.
        stag: Stag,
        /// The rights the call needed.
        needed: AccessFlags,
    },
    /// The caller may not perform this operation on the object (for example
    /// an object of another device context or PD). `EPERM`.
    #[error("operation not permitted: {what}")]
    NotPermitted {
        /// What was refused.
        what: &'static str,
    },
    /// No object of this kind with this handle (or STag index) exists.
    /// `EINVAL`, as uverbs returns for an unknown handle.
    #[error("no {object} with handle {handle:#x}")]
    InvalidHandle {
        /// The kind of object looked up.
        object: ObjectKind,
        /// The handle (or STag index) that matched nothing.
        handle: u32,
    },
    /// The object cannot be destroyed while other objects use it (a PD with
    /// MRs or QPs, a CQ with QPs, an MR with bound windows). `EBUSY`, as
    /// `ibv_dealloc_pd(3)` / `ibv_destroy_cq(3)`.
    #[error("{object} still in use")]
    InUse {
        /// The kind of object.
        object: ObjectKind,
    },
    /// The device is out of a resource (QP numbers, STag indices, memory);
    /// `what` names it. `ENOMEM`.
    #[error("out of resources: {what}")]
    OutOfResources {
        /// The exhausted resource.
        what: &'static str,
    },
    /// The backend does not implement this operation or option (for example
    /// atomics, memory windows, Send with Immediate). `EOPNOTSUPP`.
    #[error("not supported: {what}")]
    Unsupported {
        /// The unsupported operation or option.
        what: &'static str,
    },
    /// No such device (opening a device that does not exist). `ENODEV`.
    #[error("no such device")]
    NoDevice,
    /// The device was removed while in use; every further call on its objects
    /// fails with this, except destroy calls, which succeed (design.md §5).
    /// `EIO`, as kernel uverbs returns for a disassociated device.
    #[error("device removed")]
    DeviceGone,
    /// An errno from the operating system or rdma-core that none of the other
    /// variants describes (hardware backend pass-through).
    #[error("{call} failed with errno {errno}")]
    Os {
        /// The failing call, e.g. `"ibv_create_qp"`.
        call: &'static str,
        /// The errno it returned (positive).
        errno: i32,
    },
}

impl VerbsError {
    /// The (positive) errno libibverbs returns for this failure.
    pub const fn errno(&self) -> i32 {
        match self {
            VerbsError::InvalidArgument { .. }
            | VerbsError::InvalidAccessFlags(_)
            | VerbsError::InvalidStagIndex(_)
            | VerbsError::IllegalTransition(_)
            | VerbsError::InvalidQpState { .. }
            | VerbsError::TooManySges { .. }
            | VerbsError::InlineTooLong { .. }
            | VerbsError::MessageTooLong { .. }
            | VerbsError::MrOutOfBounds { .. }
            | VerbsError::InvalidHandle { .. } => errno::EINVAL,
            VerbsError::QueueFull { .. } | VerbsError::OutOfResources { .. } => errno::ENOMEM,
            VerbsError::AccessDenied { .. } => errno::EACCES,
            VerbsError::NotPermitted { .. } => errno::EPERM,
            VerbsError::InUse { .. } => errno::EBUSY,
            VerbsError::Unsupported { .. } => errno::EOPNOTSUPP,
            VerbsError::NoDevice => errno::ENODEV,
            VerbsError::DeviceGone => errno::EIO,
            VerbsError::Os { errno, .. } => *errno,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_constants_are_linux_values() {
        assert_eq!(errno::EPERM, 1);
        assert_eq!(errno::EIO, 5);
        assert_eq!(errno::ENOMEM, 12);
        assert_eq!(errno::EACCES, 13);
        assert_eq!(errno::EFAULT, 14);
        assert_eq!(errno::EBUSY, 16);
        assert_eq!(errno::ENODEV, 19);
        assert_eq!(errno::EINVAL, 22);
        assert_eq!(errno::EOPNOTSUPP, 95);
    }

    #[test]
    fn errno_mapping() {
        let cases: Vec<(VerbsError, i32)> = vec![
            (VerbsError::InvalidArgument { what: "wr_id" }, 22),
            (
                VerbsError::InvalidAccessFlags(AccessFlagsError::RemoteWriteWithoutLocalWrite),
                22,
            ),
            (
                VerbsError::InvalidStagIndex(StagIndexError { index: 1 << 24 }),
                22,
            ),
            (
                VerbsError::IllegalTransition(QpTransitionError {
                    from: QpState::Reset,
                    to: QpState::Rts,
                }),
                22,
            ),
            (
                VerbsError::InvalidQpState {
                    op: "post_send",
                    state: QpState::Init,
                },
                22,
            ),
            (
                VerbsError::QueueFull {
                    queue: WorkQueue::Send,
                    depth: 64,
                },
                12,
            ),
            (VerbsError::TooManySges { num_sge: 5, max: 4 }, 22),
            (VerbsError::InlineTooLong { len: 100, max: 64 }, 22),
            (
                VerbsError::MessageTooLong {
                    len: 1 << 32,
                    max: u32::MAX as u64,
                },
                22,
            ),
            (
                VerbsError::MrOutOfBounds {
                    addr: 0,
                    length: 1,
                    mr_addr: 4096,
                    mr_length: 4096,
                },
                22,
            ),
            (
                VerbsError::AccessDenied {
                    stag: Stag::from_raw(0x100),
                    needed: AccessFlags::MW_BIND,
                },
                13,
            ),
            (VerbsError::NotPermitted { what: "foreign PD" }, 1),
            (
                VerbsError::InvalidHandle {
                    object: ObjectKind::Mr,
                    handle: 3,
                },
                22,
            ),
            (
                VerbsError::InUse {
                    object: ObjectKind::Pd,
                },
                16,
            ),
            (
                VerbsError::OutOfResources {
                    what: "STag indices",
                },
                12,
            ),
            (VerbsError::Unsupported { what: "atomics" }, 95),
            (VerbsError::NoDevice, 19),
            (VerbsError::DeviceGone, 5),
            (
                VerbsError::Os {
                    call: "ibv_create_qp",
                    errno: 14,
                },
                14,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.errno(), want, "{e:?}");
        }
    }

    #[test]
    fn display() {
        assert_eq!(
            VerbsError::QueueFull {
                queue: WorkQueue::Recv,
                depth: 8
            }
            .to_string(),
            "receive queue full (8 entries outstanding)"
        );
        assert_eq!(
            VerbsError::from(QpTransitionError {
                from: QpState::Error,
                to: QpState::Rts
            })
            .to_string(),
            "illegal QP state transition ERR -> RTS"
        );
        assert_eq!(
            VerbsError::InvalidQpState {
                op: "post_send",
                state: QpState::Rtr
            }
            .to_string(),
            "post_send not allowed in QP state RTR"
        );
        assert_eq!(
            VerbsError::from(AccessFlagsError::RemoteAtomicWithoutLocalWrite).to_string(),
            "invalid access flags: IBV_ACCESS_REMOTE_ATOMIC requires IBV_ACCESS_LOCAL_WRITE"
        );
        assert_eq!(
            VerbsError::InUse {
                object: ObjectKind::Cq
            }
            .to_string(),
            "CQ still in use"
        );
        assert_eq!(
            VerbsError::MrOutOfBounds {
                addr: 0x2000,
                length: 16,
                mr_addr: 0x1000,
                mr_length: 4096
            }
            .to_string(),
            "range [0x2000, +16) outside MR [0x1000, +4096)"
        );
        assert_eq!(VerbsError::DeviceGone.to_string(), "device removed");
    }
}
