//! Shared receive queues (`ibv_create_srq(3)`, `ibv_post_srq_recv(3)`; Linux siw
//! `siw_create_srq`, `siw_post_srq_recv`, and `siw_rqe_get` in `siw_qp_rx.c`).
//!
//! A [`SharedReceiveQueue`] is a bounded FIFO of receive WRs shared
//! (`Arc<SharedReceiveQueue>`) by application threads, which post, and the QP engines
//! of the QPs attached to it, which take. One mutex guards it, held only to move a WR
//! in or out (siw's `srq->lock`).
//!
//! # Taking
//!
//! A QP attached to the SRQ takes a WR when the first DDP segment of an incoming
//! untagged message (a Send or an Immediate Data message on QN 0) arrives, and keeps
//! it for the message's later segments (siw binds the receive WQE of a message at its
//! first segment). So WRs are consumed in SRQ order across QPs, and each QP's messages
//! are placed and completed in MSN order. A WR taken leaves the SRQ at once: its slot
//! is free for a new post (siw clears the RQE's valid flag as it copies it out), and
//! if the QP goes to Error before the message completes, the WR completes flushed on
//! that QP's receive CQ; the WRs still in the SRQ stay there for the other QPs.
//!
//! # The limit
//!
//! An armed limit (non-zero, [`SharedReceiveQueue::modify`] or the creation
//! attributes) is checked each time a WR is taken, as siw checks it: when fewer WRs
//! than the limit remain, [`SharedReceiveQueue::take`] returns
//! [`AsyncEvent::SrqLimitReached`] once and the limit goes back to 0 (disarmed, as
//! `ibv_query_srq(3)` reports it; siw keeps the old value in its query but disarms
//! too). Arming a limit above the WRs present does not fire by itself: the next
//! take does.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use verbs::{AsyncEvent, ObjectKind, RecvWr, SrqAttr, SrqAttrMask, VerbsError, WorkQueue};

use crate::resources::stag_table::PdId;

/// Largest `max_wr` of an SRQ, in WRs (`max_srq_wr`; a power of two, so rounding a
/// request up never exceeds it).
pub const MAX_SRQ_WR: u32 = 1 << 15;

/// Largest `max_sge` of an SRQ's receive WRs (`max_srq_sge`).
pub const MAX_SRQ_SGE: u32 = 16;

#[derive(Debug, Default)]
struct Inner {
    wqes: VecDeque<RecvWr>,
    /// The armed limit; 0: disarmed.
    limit: u32,
    /// Closed by a destroy (posts fail) or by the device's end (posts never get here:
    /// the device's gate refuses them first).
    closed: bool,
}

/// A shared receive queue. See the [module documentation](self).
#[derive(Debug)]
pub struct SharedReceiveQueue {
    handle: u32,
    pd: PdId,
    /// Granted `max_wr` (the request rounded up to a power of two, as siw's
    /// `num_rqe`).
    max_wr: u32,
    max_sge: u32,
    inner: Mutex<Inner>,
}

impl SharedReceiveQueue {
    /// An SRQ named `handle` in PD `pd` (`ibv_create_srq(3)` with
    /// `attr`): `max_wr` is rounded up to a power of two (siw's `num_rqe`), `max_sge`
    /// granted as asked, a non-zero `srq_limit` arms the limit.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidArgument`] (`EINVAL`, as `siw_create_srq`): `"max_wr"` (0 or
    /// above [`MAX_SRQ_WR`]), `"max_sge"` (above [`MAX_SRQ_SGE`]), `"srq_limit"`
    /// (above `max_wr`).
    pub fn new(
        handle: u32,
        pd: PdId,
        attr: SrqAttr,
    ) -> Result<Arc<SharedReceiveQueue>, VerbsError> {
        let bad = |what| Err(VerbsError::InvalidArgument { what });
        if attr.max_wr == 0 || attr.max_wr > MAX_SRQ_WR {
            return bad("max_wr");
        }
        if attr.max_sge > MAX_SRQ_SGE {
            return bad("max_sge");
        }
        if attr.srq_limit > attr.max_wr {
            return bad("srq_limit");
        }
        Ok(Arc::new(SharedReceiveQueue {
            handle,
            pd,
            max_wr: attr.max_wr.next_power_of_two(),
            max_sge: attr.max_sge,
            inner: Mutex::new(Inner {
                limit: attr.srq_limit,
                ..Inner::default()
            }),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The SRQ's handle (the `srq` of [`AsyncEvent::SrqLimitReached`]).
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The SRQ's PD: the lkeys of its receive WRs are checked against it when a
    /// message is placed (the receiving QP's PD may differ).
    pub fn pd(&self) -> PdId {
        self.pd
    }

    /// The attributes now (`ibv_query_srq(3)`): granted `max_wr` and `max_sge`, and the
    /// limit (0 once it fired).
    pub fn query(&self) -> SrqAttr {
        SrqAttr {
            max_wr: self.max_wr,
            max_sge: self.max_sge,
            srq_limit: self.lock().limit,
        }
    }

    /// WRs in the SRQ now (posted, not yet taken by a QP).
    pub fn len(&self) -> usize {
        self.lock().wqes.len()
    }

    /// True if no WR is in the SRQ.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues a receive WR (`ibv_post_srq_recv(3)`), behind every WR posted before it.
    ///
    /// # Errors
    ///
    /// Those of [`SrqAttr::validate_recv`] (more SGEs than `max_sge`, a wrapping SGE,
    /// too long); [`VerbsError::QueueFull`] (`ENOMEM`, siw's "SRQ full") with `max_wr`
    /// WRs in the SRQ; [`VerbsError::InvalidHandle`] once closed. A refused WR is not
    /// queued.
    pub fn post(&self, wr: RecvWr) -> Result<(), VerbsError> {
        self.query_limits().validate_recv(&wr)?;
        let mut g = self.lock();
        self.check_open(&g)?;
        if g.wqes.len() >= self.max_wr as usize {
            return Err(VerbsError::QueueFull {
                queue: WorkQueue::Recv,
                depth: self.max_wr,
            });
        }
        g.wqes.push_back(wr);
        Ok(())
    }

    /// `max_wr` and `max_sge` (no lock: they never change).
    fn query_limits(&self) -> SrqAttr {
        SrqAttr::new(self.max_wr, self.max_sge)
    }

    fn check_open(&self, g: &Inner) -> Result<(), VerbsError> {
        if g.closed {
            return Err(VerbsError::InvalidHandle {
                object: ObjectKind::Srq,
                handle: self.handle,
            });
        }
        Ok(())
    }

    /// Takes the oldest WR for a new message, with the limit event if this take left
    /// fewer WRs than the armed limit (the limit is then disarmed). `None` if the SRQ
    /// is empty.
    pub fn take(&self) -> Option<(RecvWr, Option<AsyncEvent>)> {
        let mut g = self.lock();
        let wr = g.wqes.pop_front()?;
        let event = (g.limit > 0 && g.wqes.len() < g.limit as usize).then(|| {
            g.limit = 0;
            AsyncEvent::SrqLimitReached { srq: self.handle }
        });
        Some((wr, event))
    }

    /// Applies `attr`'s fields named in `mask` (`ibv_modify_srq(3)`).
    ///
    /// # Errors
    ///
    /// [`VerbsError::Unsupported`] (`EOPNOTSUPP`, as `siw_modify_srq`) with
    /// [`SrqAttrMask::MAX_WR`]: the SRQ is not resized; [`VerbsError::InvalidArgument`]
    /// `"srq_limit"` for a limit above `max_wr`; [`VerbsError::InvalidHandle`] once
    /// closed. Nothing changes on error.
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<(), VerbsError> {
        let mut g = self.lock();
        self.check_open(&g)?;
        if mask.contains(SrqAttrMask::MAX_WR) {
            return Err(VerbsError::Unsupported {
                what: "resizing an SRQ",
            });
        }
        if mask.contains(SrqAttrMask::LIMIT) {
            if attr.srq_limit > self.max_wr {
                return Err(VerbsError::InvalidArgument { what: "srq_limit" });
            }
            g.limit = attr.srq_limit;
        }
        Ok(())
    }

    /// Takes every WR still in the SRQ, oldest first (the device's end flushes them).
    pub fn drain(&self) -> Vec<RecvWr> {
        self.lock().wqes.drain(..).collect()
    }

    /// Closes the SRQ (a destroy): posts and modifies fail from now on, and the WRs still
    /// in it are returned (discarded by the caller: an SRQ has no CQ of its own, and
    /// `ibv_destroy_srq(3)` completes nothing).
    pub fn close(&self) -> Vec<RecvWr> {
        let mut g = self.lock();
        g.closed = true;
        g.wqes.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pd() -> PdId {
        let mrs = crate::resources::stag_table::MrTable::new();
        mrs.alloc_pd().unwrap()
    }

    #[test]
    fn creation_checks_and_rounding() {
        let pd = pd();
        let bad = |max_wr, max_sge, srq_limit, what| {
            let attr = SrqAttr {
                max_wr,
                max_sge,
                srq_limit,
            };
            assert_eq!(
                SharedReceiveQueue::new(1, pd, attr).unwrap_err(),
                VerbsError::InvalidArgument { what }
            );
        };
        bad(0, 1, 0, "max_wr");
        bad(MAX_SRQ_WR + 1, 1, 0, "max_wr");
        bad(4, MAX_SRQ_SGE + 1, 0, "max_sge");
        bad(4, 1, 5, "srq_limit");
        let srq = SharedReceiveQueue::new(9, pd, SrqAttr::new(5, 2)).unwrap();
        assert_eq!(srq.query(), SrqAttr::new(8, 2));
        assert_eq!((srq.handle(), srq.pd()), (9, pd));
    }

    #[test]
    fn fifo_full_and_limit_fires_once() {
        let srq = SharedReceiveQueue::new(3, pd(), SrqAttr::new(4, 1)).unwrap();
        for i in 0..4 {
            srq.post(RecvWr::new(i, vec![])).unwrap();
        }
        assert_eq!(
            srq.post(RecvWr::new(4, vec![])),
            Err(VerbsError::QueueFull {
                queue: WorkQueue::Recv,
                depth: 4
            })
        );
        let limit = SrqAttr {
            srq_limit: 2,
            ..SrqAttr::default()
        };
        srq.modify(&limit, SrqAttrMask::LIMIT).unwrap();
        assert_eq!(srq.query().srq_limit, 2);
        // 3 left: not below 2.
        assert_eq!(srq.take().map(|(w, e)| (w.wr_id, e)), Some((0, None)));
        // 2 left: not below 2.
        assert_eq!(srq.take().map(|(w, e)| (w.wr_id, e)), Some((1, None)));
        // 1 left: fires, disarms.
        assert_eq!(
            srq.take().map(|(w, e)| (w.wr_id, e)),
            Some((2, Some(AsyncEvent::SrqLimitReached { srq: 3 })))
        );
        assert_eq!(srq.query().srq_limit, 0);
        assert_eq!(srq.take().map(|(w, e)| (w.wr_id, e)), Some((3, None)));
        assert!(srq.take().is_none());
        assert!(srq.is_empty());
    }

    #[test]
    fn modify_errors_change_nothing_and_close_refuses() {
        let srq = SharedReceiveQueue::new(1, pd(), SrqAttr::new(4, 1)).unwrap();
        let attr = SrqAttr {
            max_wr: 64,
            max_sge: 1,
            srq_limit: 1,
        };
        assert_eq!(
            srq.modify(&attr, SrqAttrMask::MAX_WR | SrqAttrMask::LIMIT),
            Err(VerbsError::Unsupported {
                what: "resizing an SRQ"
            })
        );
        assert_eq!(srq.query().srq_limit, 0);
        let high = SrqAttr {
            srq_limit: 5,
            ..attr
        };
        assert_eq!(
            srq.modify(&high, SrqAttrMask::LIMIT),
            Err(VerbsError::InvalidArgument { what: "srq_limit" })
        );
        srq.post(RecvWr::new(1, vec![])).unwrap();
        let left: Vec<u64> = srq.close().into_iter().map(|w| w.wr_id).collect();
        assert_eq!(left, [1]);
        let gone = VerbsError::InvalidHandle {
            object: ObjectKind::Srq,
            handle: 1,
        };
        assert_eq!(srq.post(RecvWr::new(2, vec![])), Err(gone.clone()));
        assert_eq!(srq.modify(&attr, SrqAttrMask::LIMIT), Err(gone));
    }
}
