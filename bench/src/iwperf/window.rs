//! The send-queue window of one kind of WR on one QP: how many may be outstanding, which
//! ones are signaled, and when a slot is free again, as verbs counts them (not as the
//! soft device happens to).
//!
//! A send-queue slot is free once its WR has completed and the provider knows it: for a
//! signaled WR, once its completion was polled; for an unsignaled one, once the
//! completion of a later signaled WR was polled (send-queue completions are in order).
//! The soft device and Linux siw free an unsignaled WR's slot as soon as it completes,
//! but iw_cxgb4 and the InfiniBand providers only when a later signaled completion is
//! polled: a program that posts only unsignaled WRs fills its send queue for good, and
//! one that waits for `QueueFull` before it polls overruns its CQ on the soft device
//! (see docs/ARCHITECTURE.md, "Test peers poll as real programs do"). So the window:
//!
//! - counts a WR outstanding from its post until a signaled completion at or after it
//!   is polled ([`SendWindow::completed`]);
//! - admits a WR only while fewer than `depth` are outstanding ([`SendWindow::take`]),
//!   never by trying the post and catching `QueueFull`;
//! - signals every `every`-th WR (`every <= depth`), so that `depth` outstanding WRs
//!   always include a signaled one whose completion frees them all (perftest signals
//!   every `cq_mod`-th WR for the same reason).
//!
//! At most `depth` WRs are outstanding, so at most `depth` of its completions can wait
//! in the CQ: the CQ is sized for the windows of every QP that shares it (plus their
//! receive queues), never for what a post might accept.

/// The window of one QP's WRs of one kind (data or control messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWindow {
    depth: u64,
    every: u64,
    posted: u64,
    done: u64,
}

impl SendWindow {
    /// A window of `depth` outstanding WRs (at least 1) that signals every `every`-th
    /// (clamped to `1..=depth`).
    pub fn new(depth: u64, every: u64) -> SendWindow {
        let depth = depth.max(1);
        SendWindow {
            depth,
            every: every.clamp(1, depth),
            posted: 0,
            done: 0,
        }
    }

    /// The most WRs outstanding at once.
    pub fn depth(&self) -> u64 {
        self.depth
    }

    /// WRs taken so far (the next one's sequence number).
    pub fn posted(&self) -> u64 {
        self.posted
    }

    /// WRs known complete: every one before the last signaled WR whose completion was
    /// polled, and that one.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// WRs posted and not yet known complete.
    pub fn outstanding(&self) -> u64 {
        self.posted - self.done
    }

    /// Whether another WR may be posted now.
    pub fn has_room(&self) -> bool {
        self.outstanding() < self.depth
    }

    /// Takes a slot for the next WR: its sequence number and whether it must be
    /// signaled (every `every`-th, and when `signal` asks: the last WR of a run, an
    /// RDMA Read whose completion is awaited). `None` when the window is full: poll
    /// first. A slot taken is a WR posted; a post that fails ends the run.
    pub fn take(&mut self, signal: bool) -> Option<(u64, bool)> {
        if !self.has_room() {
            return None;
        }
        let seq = self.posted;
        self.posted += 1;
        Some((seq, signal || self.posted.is_multiple_of(self.every)))
    }

    /// The completion of WR `seq` (signaled, or flushed) was polled: it and every WR
    /// before it are done. Returns how many became done.
    pub fn completed(&mut self, seq: u64) -> u64 {
        let upto = (seq + 1).min(self.posted);
        let newly = upto.saturating_sub(self.done);
        self.done = self.done.max(upto);
        newly
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Posts as the data path does: take a slot while there is one, complete the
    /// signaled ones only when the test says; returns the WRs taken and the signaled
    /// ones among them.
    fn fill(w: &mut SendWindow, signaled: &mut Vec<u64>) -> u64 {
        let mut n = 0;
        while let Some((seq, sig)) = w.take(false) {
            if sig {
                signaled.push(seq);
            }
            n += 1;
        }
        n
    }

    #[test]
    fn a_full_window_refuses_until_a_signaled_completion_frees_it() {
        let mut w = SendWindow::new(8, 4);
        let mut sig = Vec::new();
        assert_eq!(fill(&mut w, &mut sig), 8);
        assert_eq!(sig, vec![3, 7]);
        assert_eq!(w.take(false), None);
        // The first signaled completion frees the four WRs up to it, unsignaled ones
        // included, and no more.
        assert_eq!(w.completed(3), 4);
        assert_eq!((w.outstanding(), w.done()), (4, 4));
        assert_eq!(fill(&mut w, &mut sig), 4);
        assert_eq!(sig, vec![3, 7, 11]);
        // Completions in order: an older one changes nothing.
        assert_eq!(w.completed(7), 4);
        assert_eq!(w.completed(3), 0);
        assert_eq!(w.outstanding(), 4);
    }

    #[test]
    fn every_full_window_holds_a_signaled_wr() {
        // Whatever the depth and the signaling interval, a window that is full holds a
        // signaled WR: polling its completion frees a slot, so a poster that waits for
        // room never waits for good (an all-unsignaled send queue never frees on
        // iw_cxgb4).
        for depth in 1..40 {
            for every in 0..50 {
                let mut w = SendWindow::new(depth, every);
                let mut sig = Vec::new();
                for _round in 0..5 {
                    fill(&mut w, &mut sig);
                    assert_eq!(w.outstanding(), depth);
                    let pending: Vec<u64> =
                        sig.iter().copied().filter(|&s| s >= w.done()).collect();
                    let Some(&first) = pending.first() else {
                        panic!("depth {depth}, every {every}: a full window without a signaled WR");
                    };
                    assert!(w.completed(first) > 0);
                }
            }
        }
    }

    #[test]
    fn signaled_on_request_and_bounded() {
        let mut w = SendWindow::new(4, 100);
        assert_eq!(w.take(true), Some((0, true)));
        assert_eq!(w.take(false), Some((1, false)));
        assert_eq!(w.take(false), Some((2, false)));
        // every is clamped to the depth.
        assert_eq!(w.take(false), Some((3, true)));
        assert_eq!(SendWindow::new(0, 0).depth(), 1);
        // A completion beyond what was posted counts only what was.
        assert_eq!(w.completed(99), 4);
        assert_eq!(w.posted(), 4);
    }
}
