//! The work-request ledger of one side: every WR iwperf posts and every work
//! completion it polls, counted, so that a run ended by a `DeviceRemoval` can show that
//! every posted WR completed, successfully or flushed ("nothing is lost silently";
//! the removal test on rdma-core, the soft device's rule of design.md section 5).
//!
//! Counts, not timings: the data path adds to them where it posts and polls
//! ([`WrLedger::posted_sends`], [`WrLedger::posted_recvs`], [`WrLedger::completed`]).
//! Unsignaled sends are counted apart: a provider completes them only when it flushes
//! them, so only a run with every send signaled (`--verify`) can account for each WR.

use std::sync::atomic::{AtomicU64, Ordering};

use verbs::{WcStatus, WorkCompletion};

/// Counters of posted WRs and polled completions (shared by a side's QPs; relaxed
/// atomics: one thread posts and polls, the report reads at the end).
#[derive(Debug, Default)]
pub struct WrLedger {
    sends_signaled: AtomicU64,
    sends_unsignaled: AtomicU64,
    recvs: AtomicU64,
    wc_success: AtomicU64,
    wc_flushed: AtomicU64,
    wc_error: AtomicU64,
}

/// A snapshot of a [`WrLedger`], as iwperf reports it after a device removal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WrCounts {
    /// Signaled send-queue WRs posted (Write, Read, Send, control messages).
    pub sends_signaled: u64,
    /// Unsignaled send-queue WRs posted (complete only when flushed).
    pub sends_unsignaled: u64,
    /// Receive WRs posted.
    pub recvs: u64,
    /// Completions with `IBV_WC_SUCCESS`.
    pub completed: u64,
    /// Completions with `IBV_WC_WR_FLUSH_ERR`.
    pub flushed: u64,
    /// Completions with any other error status.
    pub errors: u64,
}

impl WrCounts {
    /// Signaled sends and receives not yet completed (0 when every WR that must
    /// complete did). Flushed completions count against the unsignaled sends first, so
    /// flushed unsignaled sends never hide a missing signaled WR; with unsignaled sends
    /// that a provider never completes the figure is an upper bound, exact when every
    /// send is signaled.
    pub fn outstanding(&self) -> u64 {
        let flushed_signaled = self.flushed.saturating_sub(self.sends_unsignaled);
        let done = self.completed + self.errors + flushed_signaled;
        (self.sends_signaled + self.recvs).saturating_sub(done)
    }
}

impl std::fmt::Display for WrCounts {
    /// `S sends (U unsignaled) and R receives posted, C completed, F flushed, E in error`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} sends ({} unsignaled) and {} receives posted, {} completed, {} flushed, {} in error",
            self.sends_signaled + self.sends_unsignaled,
            self.sends_unsignaled,
            self.recvs,
            self.completed,
            self.flushed,
            self.errors
        )
    }
}

impl WrLedger {
    /// `signaled` and `unsignaled` send-queue WRs were posted.
    pub fn posted_sends(&self, signaled: u64, unsignaled: u64) {
        self.sends_signaled.fetch_add(signaled, Ordering::Relaxed);
        self.sends_unsignaled
            .fetch_add(unsignaled, Ordering::Relaxed);
    }

    /// `n` receive WRs were posted.
    pub fn posted_recvs(&self, n: u64) {
        self.recvs.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts polled completions by status.
    pub fn completed(&self, wcs: &[WorkCompletion]) {
        for wc in wcs {
            let c = match wc.status {
                WcStatus::Success => &self.wc_success,
                WcStatus::WrFlushErr => &self.wc_flushed,
                _ => &self.wc_error,
            };
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts now.
    pub fn counts(&self) -> WrCounts {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WrCounts {
            sends_signaled: l(&self.sends_signaled),
            sends_unsignaled: l(&self.sends_unsignaled),
            recvs: l(&self.recvs),
            completed: l(&self.wc_success),
            flushed: l(&self.wc_flushed),
            errors: l(&self.wc_error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs::WcOpcode;

    fn wc(status: WcStatus) -> WorkCompletion {
        WorkCompletion::new(1, status, WcOpcode::Send, 0)
    }

    #[test]
    fn every_signaled_wr_completed_or_flushed_leaves_none_outstanding() {
        let l = WrLedger::default();
        l.posted_sends(3, 0);
        l.posted_recvs(2);
        l.completed(&[wc(WcStatus::Success), wc(WcStatus::Success)]);
        assert_eq!(l.counts().outstanding(), 3);
        l.completed(&[wc(WcStatus::WrFlushErr), wc(WcStatus::WrFlushErr)]);
        l.completed(&[wc(WcStatus::RemAccessErr)]);
        let c = l.counts();
        assert_eq!((c.completed, c.flushed, c.errors), (2, 2, 1));
        assert_eq!(c.outstanding(), 0);
    }

    #[test]
    fn flushed_unsignaled_sends_do_not_hide_a_missing_signaled_one() {
        let l = WrLedger::default();
        l.posted_sends(2, 4);
        // One signaled completion and four flushed unsignaled ones: one signaled WR is
        // still missing.
        l.completed(&[wc(WcStatus::Success)]);
        l.completed(&[wc(WcStatus::WrFlushErr); 4]);
        assert_eq!(l.counts().outstanding(), 1);
        l.completed(&[wc(WcStatus::WrFlushErr)]);
        assert_eq!(l.counts().outstanding(), 0);
    }
}
