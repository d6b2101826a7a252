//! Completion channels and completion queues.

use crate::error::Result;
use crate::ffi::handles::{RawCompChannel, RawCq};
use crate::ffi::types::IbvWc;
use crate::translate::{verbs_error, wc_from_ibv};
use std::sync::{Arc, Mutex, Weak};
use verbs::{VerbsError, WorkCompletion};

/// How many completions one `ibv_poll_cq` call takes at most (a stack array).
pub const POLL_BATCH: usize = 16;

/// A completion event channel (`struct ibv_comp_channel`): its fd is
/// readable when the CQ bound to it has an event. Destroyed after its CQ.
///
/// One live CQ per channel (enforced by [`crate::Context::create_cq`]):
/// [`Cq::get_event`] acknowledges each event on the CQ it is for, which it
/// can only do for its own; an event of another CQ would stay unacknowledged
/// and make that CQ's `ibv_destroy_cq` wait for ever.
#[derive(Clone)]
pub struct CompChannel {
    pub(crate) raw: Arc<RawCompChannel>,
    /// The CQ bound to the channel, if it lives.
    pub(crate) bound: Arc<Mutex<Weak<RawCq>>>,
}

impl std::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

impl CompChannel {
    /// The fd to `poll()` for readability.
    pub fn fd(&self) -> i32 {
        self.raw.fd()
    }

    /// Makes [`Cq::get_event`] return `EAGAIN` (errno 11) instead of
    /// blocking when no event is pending.
    ///
    /// # Errors
    ///
    /// The OS error of `fcntl`.
    pub fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        crate::ffi::set_nonblocking(self.fd(), on)
    }
}

/// A completion queue (`struct ibv_cq`). Cloning shares it; destroyed after
/// the last clone and the QPs that use it.
#[derive(Clone)]
pub struct Cq {
    pub(crate) raw: Arc<RawCq>,
    pub(crate) channel: Option<Arc<RawCompChannel>>,
    /// The WRs of the QPs completing here ([`crate::wr_track`]).
    pub(crate) trackers: Arc<crate::wr_track::CqTrackers>,
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq").field("cqe", &self.cqe()).finish()
    }
}

impl Cq {
    /// The actual number of entries (at least what was asked).
    pub fn cqe(&self) -> u32 {
        self.raw.cqe().max(0) as u32
    }

    /// Polls up to `max` completions (`ibv_poll_cq(3)`), appending them to
    /// `out` as [`WorkCompletion`]s; returns how many were appended. Once a QP of
    /// this CQ lost its device (`DeviceRemoval` on its id), its WRs that the kernel's
    /// flush did not bring follow as flushed completions, each WR exactly once
    /// ([`crate::wr_track`]).
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`](crate::Error::Verbs) if the provider reports a
    /// failure (a negative return).
    pub fn poll(&self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        let mut wcs = [IbvWc::default(); POLL_BATCH];
        let mut total = 0;
        while total < max {
            let want = (max - total).min(POLL_BATCH);
            let n = self
                .raw
                .poll(&mut wcs[..want])
                .map_err(|e| verbs_error("ibv_poll_cq", e))?;
            let from = out.len();
            out.extend(wcs[..n].iter().map(wc_from_ibv));
            self.trackers.retire(out, from);
            total += out.len() - from;
            if n < want {
                total += self.trackers.flushes(max - total, out);
                break;
            }
        }
        Ok(total)
    }

    /// Arms the CQ (`ibv_req_notify_cq(3)`): the next completion (or the
    /// next solicited one) raises an event on the channel.
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`](crate::Error::Verbs).
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.raw
            .req_notify(solicited_only)
            .map_err(|e| verbs_error("ibv_req_notify_cq", e).into())
    }

    /// Waits for this CQ's next event on its channel (`ibv_get_cq_event(3)`;
    /// blocks unless the channel's fd is non-blocking) and acknowledges it
    /// (`ibv_ack_cq_events(3)`), so destroying the CQ never waits for an
    /// unacknowledged event. Re-arm with [`Cq::req_notify`].
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidArgument`] if the CQ has no channel (or, which
    /// one CQ per channel rules out, the event was for another CQ);
    /// [`Error::Verbs`](crate::Error::Verbs) with `EAGAIN` (11) on a
    /// non-blocking fd with nothing pending.
    pub fn get_event(&self) -> Result<()> {
        let Some(channel) = &self.channel else {
            return Err(VerbsError::InvalidArgument {
                what: "CQ without a completion channel",
            }
            .into());
        };
        let cq = channel
            .get_cq_event()
            .map_err(|e| verbs_error("ibv_get_cq_event", e))?;
        if cq != self.raw.addr() {
            return Err(VerbsError::InvalidArgument {
                what: "event of another CQ on this channel",
            }
            .into());
        }
        self.raw.ack_events(1);
        Ok(())
    }
}
