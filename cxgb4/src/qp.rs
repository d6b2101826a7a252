//! Queue pairs made by `rdma_create_qp` on a CM id, and the post calls.

use crate::error::Result;
use crate::ffi::handles::RawQp;
use crate::translate::{post_error, recv_sges, send_wr_to_ibv};
use verbs::{QpCap, RecvWr, SendWr, WorkQueue};

/// An RC queue pair (`struct ibv_qp`) made on a [`crate::CmId`] by
/// [`crate::CmId::create_qp`]. It holds its id, PD and CQs; dropping it is
/// `rdma_destroy_qp` (before the id, which it keeps alive). On iWARP the CM
/// moves it to RTS when the connection is established and to Error (or SQD
/// on `rdma_disconnect`) on close; it is never modified by hand.
pub struct Qp {
    pub(crate) raw: RawQp,
    pub(crate) cap: QpCap,
    /// Its WRs not yet completed ([`crate::wr_track`]).
    pub(crate) wrs: std::sync::Arc<crate::wr_track::WrTracker>,
    /// The PD's Read-sink record ([`crate::read_sink`]).
    pub(crate) sinks: std::sync::Arc<crate::read_sink::ReadSinkRule>,
    /// The device does RFC 7306 atomics (`atomic_cap` != `IBV_ATOMIC_NONE` when the
    /// QP was made); iw_cxgb4 and kernel siw do not.
    pub(crate) atomics: bool,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qp_num", &self.qp_num())
            .field("cap", &self.cap)
            .finish()
    }
}

impl Qp {
    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.raw.qp_num()
    }

    /// The capabilities the provider granted (at least those asked for;
    /// `max_inline_data` is the real inline limit, 280 on iw_cxgb4).
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// Posts one send WR (`ibv_post_send(3)`), after checking it against the
    /// QP's capabilities ([`SendWr::validate`]). The SGEs go in a stack
    /// array; inline data is copied by the provider during the call.
    ///
    /// # Errors
    ///
    /// The [`verbs::VerbsError`] of the validation or translation
    /// ([`crate::translate::send_wr_to_ibv`]); `InvalidArgument` for an RDMA Read
    /// into an MR of the PD without `REMOTE_WRITE` where the rule holds
    /// ([`crate::Pd::set_strict_read_sink`]); from the provider, `ENOMEM`
    /// as [`verbs::VerbsError::QueueFull`], others by
    /// [`crate::translate::verbs_error`] (libcxgb4: `EINVAL` for an opcode
    /// it lacks or more than one SGE in a Read); [`verbs::VerbsError::Unsupported`]
    /// (`EOPNOTSUPP`) for an atomic on a device whose `atomic_cap` is
    /// `IBV_ATOMIC_NONE` (iw_cxgb4, kernel siw).
    pub fn post_send(&self, wr: &SendWr) -> Result<()> {
        wr.validate(&self.cap)?;
        if wr.op.is_atomic() && !self.atomics {
            return Err(verbs::VerbsError::Unsupported {
                what: "atomics on this device (atomic_cap IBV_ATOMIC_NONE)",
            }
            .into());
        }
        self.sinks.check(wr)?;
        let (ibv_wr, payload) = send_wr_to_ibv(wr)?;
        self.raw
            .post_send(ibv_wr, payload.as_send_payload())
            .map_err(|e| post_error(WorkQueue::Send, self.cap.max_send_wr, e))?;
        self.wrs.posted_send(wr.wr_id, wr.op.wc_opcode());
        Ok(())
    }

    /// Posts one receive WR (`ibv_post_recv(3)`), after [`RecvWr::validate`].
    ///
    /// # Errors
    ///
    /// As [`Qp::post_send`], for the receive queue.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        wr.validate(&self.cap)?;
        let sges = recv_sges(wr)?;
        self.raw
            .post_recv(wr.wr_id, sges.as_slice())
            .map_err(|e| post_error(WorkQueue::Recv, self.cap.max_recv_wr, e))?;
        self.wrs.posted_recv(wr.wr_id);
        Ok(())
    }

    /// Destroys the QP now (`rdma_destroy_qp(3)`); the same as dropping it.
    /// On a device removal: destroy the QP, then drop the event (ack), then
    /// the id.
    pub fn destroy(self) {}
}
