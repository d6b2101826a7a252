//! Shared receive queues: `struct ibv_srq_attr`, `struct ibv_srq_init_attr` and
//! `enum ibv_srq_attr_mask` of `<infiniband/verbs.h>` (`ibv_create_srq(3)`,
//! `ibv_modify_srq(3)`, `ibv_query_srq(3)`, `ibv_post_srq_recv(3)`).
//!
//! An SRQ is a receive queue that several QPs of a device draw from: a QP created
//! with one has no receive queue of its own (its `max_recv_wr` and `max_recv_sge`
//! are ignored and `ibv_post_recv` on it fails), and each message it receives takes
//! the oldest receive WR of the SRQ. The completion goes to the receiving QP's
//! receive CQ with that QP's `qp_num`.
//!
//! # The limit ("low watermark")
//!
//! With a non-zero [`SrqAttr::srq_limit`] the SRQ is *armed*: when the number of
//! WRs in it drops below the limit, `IBV_EVENT_SRQ_LIMIT_REACHED`
//! ([`crate::AsyncEvent::SrqLimitReached`]) is reported once and the SRQ disarms
//! itself: `ibv_query_srq(3)` then shows limit 0 ("not (or no longer) armed"),
//! and no further event comes until the limit is set again with
//! [`SrqAttrMask::LIMIT`].

use bitflags::bitflags;

use crate::error::VerbsError;
use crate::wr::RecvWr;
use crate::QpCap;

/// The attributes of an SRQ: `struct ibv_srq_attr`.
///
/// Given to `create_srq` as the consumer's minimums (a backend may round
/// `max_wr` and `max_sge` up; it reports the granted values on query), to
/// `modify_srq` with a [`SrqAttrMask`] naming the fields to apply, and returned
/// by `query_srq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SrqAttr {
    /// Most receive WRs the SRQ holds at once (`max_wr`), in WRs. WRs a QP
    /// took for a message in progress no longer count.
    pub max_wr: u32,
    /// Most SGEs in one receive WR (`max_sge`).
    pub max_sge: u32,
    /// The limit, in WRs (`srq_limit`): 0 is disarmed; otherwise the limit
    /// event fires once when fewer WRs than this remain (see the
    /// [module documentation](self)).
    pub srq_limit: u32,
}

/// What `create_srq` takes: `struct ibv_srq_init_attr` without its
/// `srq_context` (the attributes are its `attr` member).
pub type SrqInitAttr = SrqAttr;

impl SrqAttr {
    /// The attributes of an SRQ of `max_wr` WRs of `max_sge` SGEs each, limit
    /// disarmed.
    pub const fn new(max_wr: u32, max_sge: u32) -> SrqAttr {
        SrqAttr {
            max_wr,
            max_sge,
            srq_limit: 0,
        }
    }

    /// The checks `ibv_post_srq_recv(3)` makes on `wr` before it is queued on
    /// an SRQ with these attributes.
    ///
    /// # Errors
    ///
    /// As [`RecvWr::validate`] with `max_sge` as the SGE limit:
    /// [`VerbsError::TooManySges`], [`VerbsError::InvalidArgument`]
    /// `"sg_list"`, [`VerbsError::MessageTooLong`].
    pub fn validate_recv(&self, wr: &RecvWr) -> Result<(), VerbsError> {
        wr.validate(&QpCap {
            max_recv_sge: self.max_sge,
            ..QpCap::default()
        })
    }
}

bitflags! {
    /// Which [`SrqAttr`] fields a `modify_srq` applies: `enum
    /// ibv_srq_attr_mask`, with its libibverbs bit values.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SrqAttrMask: u32 {
        /// `IBV_SRQ_MAX_WR` (1 << 0): resize the SRQ to `max_wr`.
        const MAX_WR = 1 << 0;
        /// `IBV_SRQ_LIMIT` (1 << 1): set (arm, or with 0 disarm) the limit.
        const LIMIT = 1 << 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Sge, Stag};

    #[test]
    fn mask_bits_are_libibverbs_values() {
        assert_eq!(SrqAttrMask::MAX_WR.bits(), 1);
        assert_eq!(SrqAttrMask::LIMIT.bits(), 2);
        assert_eq!(SrqAttrMask::from_bits(4), None);
    }

    #[test]
    fn recv_wrs_are_checked_against_max_sge() {
        let attr = SrqAttr::new(16, 2);
        assert_eq!(attr.srq_limit, 0);
        let sge = Sge::new(0x1000, 64, Stag::from_raw(0x100));
        assert!(attr.validate_recv(&RecvWr::new(1, vec![sge; 2])).is_ok());
        assert_eq!(
            attr.validate_recv(&RecvWr::new(1, vec![sge; 3])),
            Err(VerbsError::TooManySges { num_sge: 3, max: 2 })
        );
        let wraps = Sge::new(u64::MAX - 2, 8, Stag::from_raw(0x100));
        assert_eq!(
            attr.validate_recv(&RecvWr::new(1, vec![wraps])),
            Err(VerbsError::InvalidArgument { what: "sg_list" })
        );
    }
}
