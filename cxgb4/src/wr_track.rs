//! Every WR posted on a QP, until its completion is polled: so that a device removal
//! loses none ("every posted WR completes, successfully or flushed", design.md
//! section 5).
//!
//! On a device removal the kernel flushes the QPs, but it also disassociates the
//! process's verbs context (ib_uverbs `uverbs_disassociate`, zapping the user mappings
//! of the CQ rings that providers such as siw poll): flushed completions not yet
//! polled can vanish. Measured on kernel siw in the VM: an RDMA Read run removed
//! mid-flight left 4 to 12 of 60 WRs without a completion. So the backend keeps, per
//! QP, the WRs posted and not yet completed, in posting order, and once the QP's id
//! has heard `RDMA_CM_EVENT_DEVICE_REMOVAL` ([`WrTracker::lose`]) its CQ hands out a
//! flushed completion ([`verbs::WcStatus::WrFlushErr`]) for each WR still outstanding
//! when the CQ itself has none left; a real completion for a WR already handed out
//! that way is dropped, so each WR completes exactly once.
//!
//! Matching follows the verbs ordering rules: receives complete in posting order; on
//! the send queue a completion retires its WR and every earlier one (unsignaled WRs
//! complete with the next signaled one). A completion in error carries no valid
//! opcode (ibv_poll_cq(3)), so it is matched by `wr_id`: the receive queue's oldest WR
//! first, then the send queue.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, Weak};

use verbs::{WcOpcode, WcStatus, WorkCompletion};

#[derive(Debug, Default)]
struct Queues {
    /// Send-queue WRs: (wr_id, the opcode of their completion).
    sq: VecDeque<(u64, WcOpcode)>,
    /// Receive WRs' ids.
    rq: VecDeque<u64>,
}

/// The outstanding WRs of one QP.
#[derive(Debug)]
pub(crate) struct WrTracker {
    qp_num: u32,
    queues: Mutex<Queues>,
    lost: AtomicBool,
}

impl WrTracker {
    /// A tracker for QP `qp_num`, nothing outstanding.
    pub(crate) fn new(qp_num: u32) -> WrTracker {
        WrTracker {
            qp_num,
            queues: Mutex::default(),
            lost: AtomicBool::new(false),
        }
    }

    fn queues(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The QP's number.
    pub(crate) fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// A send-queue WR `wr_id` was posted; its completion has `opcode`.
    pub(crate) fn posted_send(&self, wr_id: u64, opcode: WcOpcode) {
        self.queues().sq.push_back((wr_id, opcode));
    }

    /// A receive WR `wr_id` was posted.
    pub(crate) fn posted_recv(&self, wr_id: u64) {
        self.queues().rq.push_back(wr_id);
    }

    /// The device went away under the QP: from now on its CQ completes what is left
    /// ([`WrTracker::take_flushes`]).
    pub(crate) fn lose(&self) {
        self.lost.store(true, Ordering::Release);
    }

    /// True once [`WrTracker::lose`] was called.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Takes `wc` (of this QP) off the outstanding WRs; false if no outstanding WR
    /// matches it (a completion already handed out as a flush).
    pub(crate) fn retire(&self, wc: &WorkCompletion) -> bool {
        let mut q = self.queues();
        let is_recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        if (is_recv || wc.status != WcStatus::Success) && q.rq.front() == Some(&wc.wr_id) {
            q.rq.pop_front();
            return true;
        }
        if is_recv && wc.status == WcStatus::Success {
            return false;
        }
        match q.sq.iter().position(|&(id, _)| id == wc.wr_id) {
            Some(pos) => {
                q.sq.drain(..=pos);
                true
            }
            None => false,
        }
    }

    /// Moves up to `max` flushed completions of the outstanding WRs (send queue first,
    /// in posting order) to `out`; how many.
    pub(crate) fn take_flushes(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let mut q = self.queues();
        let mut n = 0;
        while n < max {
            let wc = if let Some((id, op)) = q.sq.pop_front() {
                WorkCompletion::flushed(id, op, self.qp_num)
            } else if let Some(id) = q.rq.pop_front() {
                WorkCompletion::flushed(id, WcOpcode::Recv, self.qp_num)
            } else {
                break;
            };
            out.push(wc);
            n += 1;
        }
        n
    }
}

/// The QPs completing into one CQ, by QP number (a QP is dropped from it with its last
/// handle; a QP number the device reuses replaces the dead entry).
#[derive(Debug, Default)]
pub(crate) struct CqTrackers {
    qps: Mutex<HashMap<u32, Weak<WrTracker>>>,
}

impl CqTrackers {
    fn map(&self) -> MutexGuard<'_, HashMap<u32, Weak<WrTracker>>> {
        self.qps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `t`'s QP completes into this CQ.
    pub(crate) fn add(&self, t: &std::sync::Arc<WrTracker>) {
        let mut m = self.map();
        m.retain(|_, w| w.strong_count() > 0);
        m.insert(t.qp_num(), std::sync::Arc::downgrade(t));
    }

    /// Filters the completions just polled (`out[from..]`): each retires its WR; one
    /// for a WR already completed as a flush of a lost QP is removed. One map lookup
    /// per completion.
    pub(crate) fn retire(&self, out: &mut Vec<WorkCompletion>, from: usize) {
        let m = self.map();
        let mut keep = from;
        for i in from..out.len() {
            let wc = out[i];
            let t = m.get(&wc.qp_num).and_then(Weak::upgrade);
            let retired = t.as_ref().is_some_and(|t| t.retire(&wc));
            let lost = t.as_ref().is_some_and(|t| t.is_lost());
            if retired || !lost {
                out[keep] = wc;
                keep += 1;
            }
        }
        out.truncate(keep);
    }

    /// After the CQ itself ran dry: up to `max` flushed completions of lost QPs'
    /// outstanding WRs; how many were appended.
    pub(crate) fn flushes(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let m = self.map();
        let mut n = 0;
        for t in m.values().filter_map(Weak::upgrade) {
            if n >= max {
                break;
            }
            if t.is_lost() {
                n += t.take_flushes(max - n, out);
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn ok(wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
        WorkCompletion::new(wr_id, WcStatus::Success, opcode, 7)
    }

    #[test]
    fn a_signaled_completion_retires_the_unsignaled_wrs_before_it() {
        let t = Arc::new(WrTracker::new(7));
        for id in 1..=4 {
            t.posted_send(id, WcOpcode::RdmaWrite);
        }
        t.posted_recv(10);
        assert!(t.retire(&ok(3, WcOpcode::RdmaWrite)));
        assert!(t.retire(&ok(10, WcOpcode::Recv)));
        let mut out = Vec::new();
        t.lose();
        assert_eq!(t.take_flushes(16, &mut out), 1);
        assert_eq!(
            out,
            vec![WorkCompletion::flushed(4, WcOpcode::RdmaWrite, 7)]
        );
    }

    #[test]
    fn a_lost_qp_completes_every_outstanding_wr_exactly_once() {
        let cq = CqTrackers::default();
        let t = Arc::new(WrTracker::new(7));
        cq.add(&t);
        for id in 1..=3 {
            t.posted_send(id, WcOpcode::RdmaRead);
        }
        t.posted_recv(20);
        t.posted_recv(21);
        // The device polled Read 1 and then went away.
        let mut out = vec![ok(1, WcOpcode::RdmaRead)];
        cq.retire(&mut out, 0);
        assert_eq!(out.len(), 1);
        // Not lost yet: nothing is made up.
        assert_eq!(cq.flushes(16, &mut out), 0);
        t.lose();
        assert_eq!(cq.flushes(3, &mut out), 3);
        assert_eq!(cq.flushes(16, &mut out), 1);
        let ids: Vec<(u64, WcStatus)> = out.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(
            ids,
            vec![
                (1, WcStatus::Success),
                (2, WcStatus::WrFlushErr),
                (3, WcStatus::WrFlushErr),
                (20, WcStatus::WrFlushErr),
                (21, WcStatus::WrFlushErr)
            ]
        );
        // The kernel's own flush of Read 3 and receive 21 arrives late: dropped.
        let mut late = vec![
            WorkCompletion::flushed(3, WcOpcode::Send, 7),
            WorkCompletion::flushed(21, WcOpcode::Send, 7),
        ];
        cq.retire(&mut late, 0);
        assert!(late.is_empty());
        assert_eq!(cq.flushes(16, &mut out), 0);
    }

    #[test]
    fn an_error_completion_matches_the_oldest_receive_then_the_send_queue() {
        let t = WrTracker::new(7);
        t.posted_send(5, WcOpcode::Send);
        t.posted_recv(5);
        // Same wr_id on both queues: the receive queue's oldest goes first.
        assert!(t.retire(&WorkCompletion::flushed(5, WcOpcode::Send, 7)));
        assert!(t.retire(&WorkCompletion::flushed(5, WcOpcode::Send, 7)));
        assert!(!t.retire(&WorkCompletion::flushed(5, WcOpcode::Send, 7)));
    }

    /// Two QPs on one CQ: each completion retires its own QP's WR; after one QP is lost
    /// only its WRs are flushed; a dead QP's number reused by a new QP maps to the new one.
    #[test]
    fn completions_go_to_their_own_qp_and_a_reused_qp_number_to_the_new_qp() {
        let cq = CqTrackers::default();
        let (a, b) = (Arc::new(WrTracker::new(1)), Arc::new(WrTracker::new(2)));
        cq.add(&a);
        cq.add(&b);
        a.posted_send(11, WcOpcode::Send);
        b.posted_send(21, WcOpcode::Send);
        b.posted_send(22, WcOpcode::Send);
        let wc = |id, qp| WorkCompletion::new(id, WcStatus::Success, WcOpcode::Send, qp);
        let mut out = vec![wc(21, 2), wc(11, 1)];
        cq.retire(&mut out, 0);
        assert_eq!(out, vec![wc(21, 2), wc(11, 1)]);
        b.lose();
        let mut flushed = Vec::new();
        assert_eq!(cq.flushes(16, &mut flushed), 1);
        assert_eq!(
            flushed,
            vec![WorkCompletion::flushed(22, WcOpcode::Send, 2)]
        );
        // QP 1 goes away; a new QP gets number 1.
        drop(a);
        let c = Arc::new(WrTracker::new(1));
        cq.add(&c);
        c.posted_send(31, WcOpcode::Send);
        c.lose();
        let mut flushed = Vec::new();
        assert_eq!(cq.flushes(16, &mut flushed), 1);
        assert_eq!(
            flushed,
            vec![WorkCompletion::flushed(31, WcOpcode::Send, 1)]
        );
    }
}
