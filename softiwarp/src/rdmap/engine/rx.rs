//! RX: one ULPDU at a time, checked completely before any byte is placed (siw
//! `siw_qp_rx.c`, RFC 5040 §5 and §7, RFC 5041 §5 and §7).

use ddp_rdmap::ddp::BufferModel;
use ddp_rdmap::rdmap::{ATOMIC_OPERAND_LEN, QN_ATOMIC_RESPONSE, QN_READ_REQUEST, QN_SEND};
use ddp_rdmap::reassembly::{check_atomic_request, check_read_request, check_tagged};
use ddp_rdmap::terminate::{
    self, DdpTaggedCode, DdpUntaggedCode, ErrorCause, RdmapOperationCode, RdmapProtectionCode,
};
use ddp_rdmap::{Body, Header, Opcode, Ulpdu};
use verbs::{AccessFlags, AsyncEvent, QpState, Stag, WcOpcode, WcStatus, WorkCompletion};

use super::{
    status_for_terminate, vendor_err_for, IrqEntry, OrqEntry, Phase, Piece, QpEngine, QpEvent,
    RxError,
};

/// Which local WR a protocol error concerns.
#[derive(Debug, Clone, Copy)]
enum Culprit {
    /// No WR: everything is flushed.
    None,
    /// The oldest receive WR completes with this status.
    Recv(WcStatus),
    /// Send WR `seq` completes with this status.
    Send(u64, WcStatus),
}

fn op_error(code: RdmapOperationCode) -> ErrorCause {
    ErrorCause::RdmapRemoteOperation(code)
}

impl QpEngine {
    /// Processes one incoming ULPDU: the bytes MPA delivers after the ULPDU Length
    /// field, before pad and CRC (RFC 5044 §4.1), already CRC-checked by the driver.
    ///
    /// Accepted in RTR, RTS and SQD (in RTR the first ULPDU also reports
    /// [`AsyncEvent::CommEst`]). Every check runs before any byte is placed:
    /// DDP/RDMAP header parsing (versions, opcode, T flag, lengths), the untagged
    /// queue rules (QN, MSN, MO, buffer length; RFC 5041 §5.3) and, for tagged and
    /// Read Request messages, the STag checks of [`crate::resources::stag_table`]. A failing check
    /// queues the Terminate (see the [module documentation](super)).
    ///
    /// # Errors
    ///
    /// [`RxError::NotReady`] in Reset / Init; [`RxError::Terminated`] after a
    /// Terminate or in Error; [`RxError::Protocol`] when the ULPDU broke a rule;
    /// [`RxError::Local`] when a receive WR's SGE failed its check;
    /// [`RxError::PeerTerminated`] for a Terminate.
    pub fn handle_ulpdu(&mut self, bytes: &[u8]) -> Result<(), RxError> {
        if self.stream_closed || self.state == QpState::Error {
            return Err(RxError::Terminated);
        }
        if matches!(self.state, QpState::Reset | QpState::Init) {
            return Err(RxError::NotReady { state: self.state });
        }
        if self.state == QpState::Rtr && !self.comm_est {
            self.comm_est = true;
            self.events.push_back(QpEvent::Async(AsyncEvent::CommEst {
                qp_num: self.qp_num(),
            }));
        }
        let r = self.rx(bytes);
        self.after_op();
        r
    }

    fn rx(&mut self, bytes: &[u8]) -> Result<(), RxError> {
        let u = match Ulpdu::parse(bytes) {
            Ok(u) => u,
            Err(e) => {
                // A Terminate whose own header is malformed is still the peer
                // ending the stream: never answer it with a Terminate (RFC 5040 §7).
                if matches!(Header::parse(bytes), Ok(h) if h.opcode == Opcode::Terminate) {
                    return Err(self.peer_terminated(None));
                }
                let cause = e
                    .terminate_cause()
                    .unwrap_or(op_error(RdmapOperationCode::Unspecified));
                return Err(self.violation(cause, bytes, Culprit::None));
            }
        };
        if let Body::Terminate(t) = u.body {
            return Err(self.peer_terminated(Some(t.cause)));
        }
        // Untagged: the QN must be the opcode's queue (RFC 5041 §5.3 "Invalid QN").
        if let Some(qn) = u.header.qn() {
            if Some(qn) != u.opcode().queue() {
                return Err(self.violation(
                    ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidQn),
                    bytes,
                    Culprit::None,
                ));
            }
        }
        match u.opcode() {
            Opcode::Write => self.rx_write(&u, bytes),
            Opcode::ReadResponse => self.rx_read_response(&u, bytes),
            Opcode::ReadRequest => self.rx_read_request(&u, bytes),
            Opcode::Send | Opcode::SendSE | Opcode::SendInvalidate | Opcode::SendSEInvalidate => {
                self.rx_send(&u, bytes)
            }
            Opcode::ImmediateData | Opcode::ImmediateDataSE => self.rx_immediate(&u, bytes),
            Opcode::AtomicRequest => self.rx_atomic_request(&u, bytes),
            Opcode::AtomicResponse => self.rx_atomic_response(&u, bytes),
            // Handled above.
            Opcode::Terminate => Err(self.violation(
                op_error(RdmapOperationCode::UnexpectedOpcode),
                bytes,
                Culprit::None,
            )),
        }
    }

    /// RDMA Write (RFC 5040 §5.1): tagged placement at (STag, TO) with
    /// `REMOTE_WRITE`. A zero-length Write places nothing and is not checked (the
    /// MPA peer-to-peer Write RTR uses STag 1, TO 0; siw skips it the same way).
    fn rx_write(&mut self, u: &Ulpdu<'_>, bytes: &[u8]) -> Result<(), RxError> {
        let BufferModel::Tagged { stag, to } = u.header.buffer else {
            return Ok(());
        };
        let data = u.payload;
        if data.is_empty() {
            return Ok(());
        }
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        if let Err(cause) = check_tagged(to, len) {
            return Err(self.violation(cause, bytes, Culprit::None));
        }
        if !self.init.access.contains(AccessFlags::REMOTE_WRITE) {
            return Err(self.violation(
                ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::AccessRightsViolation),
                bytes,
                Culprit::None,
            ));
        }
        let stag = Stag::from_raw(stag);
        match self.place_tagged(stag, to, data, AccessFlags::REMOTE_WRITE) {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(self.violation(e.tagged_cause(), bytes, Culprit::None)),
            None => Err(self.violation(
                ErrorCause::DdpTagged(DdpTaggedCode::InvalidStag),
                bytes,
                Culprit::None,
            )),
        }
    }

    /// RDMA Read Response (RFC 5040 §5.2): must continue the oldest outstanding Read
    /// Request exactly (same sink STag, next TO, within its size; the last segment
    /// ends it). A Read Response with no Read outstanding is an RDMAP "Unexpected
    /// OpCode"; a mismatching one a DDP Tagged Buffer Error ("Invalid STag" for the
    /// STag, "Base or bounds violation" for TO and length, as siw
    /// `siw_rresp_check_ntoh`), and the Read WR completes with
    /// [`WcStatus::BadRespErr`]. Placement needs `LOCAL_WRITE` on our sink MR
    /// ([`QpInit::read_sink_access`](super::QpInit::read_sink_access)); a
    /// failure there completes the Read WR with [`WcStatus::LocProtErr`].
    fn rx_read_response(&mut self, u: &Ulpdu<'_>, bytes: &[u8]) -> Result<(), RxError> {
        let BufferModel::Tagged { stag, to } = u.header.buffer else {
            return Ok(());
        };
        // A Read Response answers the oldest outstanding request, which must be a Read.
        let Some(OrqEntry::Read(head)) = self.orq.front().copied() else {
            return Err(self.violation(
                op_error(RdmapOperationCode::UnexpectedOpcode),
                bytes,
                Culprit::None,
            ));
        };
        let data = u.payload;
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let bad = |code| ErrorCause::DdpTagged(code);
        let culprit = Culprit::Send(head.seq, WcStatus::BadRespErr);
        if let Err(cause) = check_tagged(to, len) {
            return Err(self.violation(cause, bytes, culprit));
        }
        if head.size > 0 && stag != head.sink_stag {
            return Err(self.violation(bad(DdpTaggedCode::InvalidStag), bytes, culprit));
        }
        let end = u64::from(head.placed) + u64::from(len);
        let expected_to = head.sink_to.wrapping_add(u64::from(head.placed));
        if (head.size > 0 && to != expected_to)
            || end > u64::from(head.size)
            || (u.last() && end != u64::from(head.size))
        {
            return Err(self.violation(bad(DdpTaggedCode::BaseOrBoundsViolation), bytes, culprit));
        }
        if !data.is_empty() {
            let stag = Stag::from_raw(stag);
            let placed = match self.place_tagged(stag, to, data, self.init.read_sink_access) {
                Some(r) => r.map_err(|e| e.tagged_cause()),
                None => Err(bad(DdpTaggedCode::InvalidStag)),
            };
            if let Err(cause) = placed {
                let culprit = Culprit::Send(head.seq, WcStatus::LocProtErr);
                return Err(self.violation(cause, bytes, culprit));
            }
        }
        if let Some(OrqEntry::Read(h)) = self.orq.front_mut() {
            h.placed = h.placed.saturating_add(len);
        }
        if u.last() {
            self.orq.pop_front();
            let done = match self.entry_mut(head.seq) {
                Some(e) => {
                    e.reads_done += 1;
                    e.reads_done >= e.reads_total
                }
                None => false,
            };
            if done {
                self.finish(head.seq);
            }
        }
        Ok(())
    }

    /// RDMA Read Request (RFC 5040 §5.2, §4.4): consumes one QN 1 buffer, i.e. one
    /// IRD credit ("Invalid MSN - no buffer available" beyond IRD: the buffer model
    /// RFC 5041 §5.3 applies to QN 1; siw reports RDMAP "Catastrophic error,
    /// localized" instead), then the Data Source is checked (RDMAP Remote
    /// Protection Errors, the Read Request header copied with R = 1) and the
    /// Read Response is queued. A zero-length Read is not checked.
    fn rx_read_request(&mut self, u: &Ulpdu<'_>, bytes: &[u8]) -> Result<(), RxError> {
        let (BufferModel::Untagged { msn, mo, .. }, Body::ReadRequest(rr)) =
            (u.header.buffer, u.body)
        else {
            return Ok(());
        };
        self.accept_qn1_request(u, (msn, mo), bytes, AccessFlags::REMOTE_READ)?;
        if let Err(cause) = check_read_request(&rr) {
            return Err(self.violation(cause, bytes, Culprit::None));
        }
        let src = if rr.size > 0 {
            let stag = Stag::from_raw(rr.src_stag);
            match self.mrs.check(
                stag,
                self.init.pd,
                rr.src_to,
                u64::from(rr.size),
                AccessFlags::REMOTE_READ,
            ) {
                Ok((mr, off)) => Some(Piece {
                    mr,
                    off,
                    len: rr.size as usize,
                }),
                Err(e) => return Err(self.violation(e.rdmap_cause(), bytes, Culprit::None)),
            }
        } else {
            None
        };
        self.irq.push_back(IrqEntry::Read {
            sink_stag: rr.sink_stag,
            sink_to: rr.sink_to,
            size: rr.size,
            src,
        });
        Ok(())
    }

    /// The first checks of a request on QN 1 (Read Request, Atomic Request): it takes
    /// one QN 1 buffer, i.e. one IRD credit (the untagged queue rules, RFC 5041 §5.3),
    /// and the QP must accept the operation (`qp_access_flags` contains `needed`, else
    /// RDMAP Remote Protection "Access rights violation").
    fn accept_qn1_request(
        &mut self,
        u: &Ulpdu<'_>,
        (msn, mo): (u32, u32),
        bytes: &[u8],
        needed: AccessFlags,
    ) -> Result<(), RxError> {
        let body_len = u32::try_from(u.ddp_payload_len()).unwrap_or(u32::MAX);
        if let Err(cause) = self.q1.accept(QN_READ_REQUEST, msn, mo, body_len, u.last()) {
            return Err(self.violation(cause, bytes, Culprit::None));
        }
        if !self.init.access.contains(needed) {
            return Err(self.violation(
                ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::AccessRightsViolation),
                bytes,
                Culprit::None,
            ));
        }
        Ok(())
    }

    /// Atomic Request (RFC 7306 §5), the responder's side. Like a Read Request it
    /// consumes one QN 1 buffer, i.e. one IRD credit ("Invalid MSN - no buffer
    /// available" beyond IRD), given back when its Atomic Response is sent. Then, each
    /// failure a Terminate (RDMAP Remote Protection Error, the DDP header copied): the
    /// QP must accept remote atomics (`REMOTE_ATOMIC` in `qp_access_flags`: "Access
    /// rights violation"); the Remote Tagged Offset must be 8-byte aligned
    /// ([`check_atomic_request`]: "Base or bounds violation"); the 8-byte target must
    /// pass the MR checks with `REMOTE_ATOMIC` ("Invalid STag", "STag not associated
    /// with RDMAP Stream", "Access rights violation", "Base or bounds violation").
    ///
    /// Order (RFC 7306 §5, RFC 5040 §5.5): the request joins the Read Requests' queue,
    /// so its Atomic Response follows the Read Responses of earlier Read Requests and
    /// precedes later ones. The operation itself executes at once when nothing is
    /// queued ahead of it, i.e. in arrival order with the Writes and Sends placed
    /// around it; behind queued Read Requests it executes when its turn comes, after
    /// their Read Responses have read their data (which therefore never sees its
    /// effect).
    fn rx_atomic_request(&mut self, u: &Ulpdu<'_>, bytes: &[u8]) -> Result<(), RxError> {
        let (BufferModel::Untagged { msn, mo, .. }, Body::AtomicRequest(req)) =
            (u.header.buffer, u.body)
        else {
            return Ok(());
        };
        self.accept_qn1_request(u, (msn, mo), bytes, AccessFlags::REMOTE_ATOMIC)?;
        if let Err(cause) = check_atomic_request(&req) {
            return Err(self.violation(cause, bytes, Culprit::None));
        }
        let stag = Stag::from_raw(req.remote_stag);
        let (mr, off) = match self.mrs.check(
            stag,
            self.init.pd,
            req.remote_to,
            ATOMIC_OPERAND_LEN,
            AccessFlags::REMOTE_ATOMIC,
        ) {
            Ok(found) => found,
            Err(e) => return Err(self.violation(e.rdmap_cause(), bytes, Culprit::None)),
        };
        let original = if self.irq.is_empty() && self.tx_rr.is_none() {
            match mr.atomic_update(off, |v| req.apply(v)) {
                Some(v) => Some(v),
                // Resolved just above: the word is inside the buffer.
                None => {
                    return Err(self.violation(
                        ErrorCause::RdmapRemoteProtection(
                            RdmapProtectionCode::BaseOrBoundsViolation,
                        ),
                        bytes,
                        Culprit::None,
                    ))
                }
            }
        } else {
            None
        };
        self.irq.push_back(IrqEntry::Atomic {
            req,
            mr,
            off,
            original,
        });
        Ok(())
    }

    /// Atomic Response (RFC 7306 §5), the requester's side: it must answer the oldest
    /// outstanding request, which must be an Atomic Request (else RDMAP "Unexpected
    /// OpCode", as a Read Response with no Read outstanding), follow the QN 3 rules
    /// (one buffer posted per Atomic Request sent, MSN order) and carry that request's
    /// Identifier (else RDMAP Remote Operation "Unspecified Error" and the WR
    /// completes with [`WcStatus::BadRespErr`]). The Original Remote Data Value is
    /// stored in native byte order in the WR's 8-byte SGE, checked again for
    /// `LOCAL_WRITE` (a failure there is local: the WR completes with
    /// [`WcStatus::LocProtErr`] and a Local Catastrophic Terminate goes out); then the
    /// WR is done and its ORD credit free.
    fn rx_atomic_response(&mut self, u: &Ulpdu<'_>, bytes: &[u8]) -> Result<(), RxError> {
        let (BufferModel::Untagged { msn, mo, .. }, Body::AtomicResponse(resp)) =
            (u.header.buffer, u.body)
        else {
            return Ok(());
        };
        let Some(OrqEntry::Atomic {
            seq,
            request_id,
            sink,
        }) = self.orq.front().copied()
        else {
            return Err(self.violation(
                op_error(RdmapOperationCode::UnexpectedOpcode),
                bytes,
                Culprit::None,
            ));
        };
        let culprit = Culprit::Send(seq, WcStatus::BadRespErr);
        let body_len = u32::try_from(u.ddp_payload_len()).unwrap_or(u32::MAX);
        if let Err(cause) = self
            .q3
            .accept(QN_ATOMIC_RESPONSE, msn, mo, body_len, u.last())
        {
            return Err(self.violation(cause, bytes, culprit));
        }
        if resp.request_id != request_id {
            return Err(self.violation(op_error(RdmapOperationCode::Unspecified), bytes, culprit));
        }
        let placed = self
            .mrs
            .check(
                sink.lkey,
                self.init.pd,
                sink.addr,
                ATOMIC_OPERAND_LEN,
                AccessFlags::LOCAL_WRITE,
            )
            .ok()
            .is_some_and(|(mr, off)| mr.store(off, &resp.original_value.to_ne_bytes()));
        if !placed {
            let event = AsyncEvent::QpAccessErr {
                qp_num: self.qp_num(),
            };
            self.local_failure_with(Some((seq, WcStatus::LocProtErr)), None, event);
            return Err(RxError::Local {
                status: WcStatus::LocProtErr,
            });
        }
        self.orq.pop_front();
        self.finish(seq);
        Ok(())
    }

    /// Send, Send with SE, with Invalidate, with SE and Invalidate (RFC 5040 §5.3):
    /// untagged placement at MO into the receive WR for (QN 0, MSN), scattered over
    /// its SGEs (with an SRQ, the WR the message's first segment took from it). Each
    /// SGE is checked (lkey, PD, valid, `LOCAL_WRITE`, bounds) before the first byte
    /// lands in it. The last segment completes the receive WR, after
    /// invalidating the Invalidate STag for the Invalidate variants: only an MR of
    /// the QP's PD that allows remote invalidation (fast-registered, or registered
    /// with `MrOptions::remote_invalidate`; `MrTable::invalidate`); anything else is
    /// the Terminate "STag cannot be Invalidated" (RFC 5040 §4.8, code 0x09) and
    /// leaves the MR valid.
    fn rx_send(&mut self, u: &Ulpdu<'_>, bytes: &[u8]) -> Result<(), RxError> {
        let BufferModel::Untagged { msn, mo, .. } = u.header.buffer else {
            return Ok(());
        };
        let data = u.payload;
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        self.take_srq_wqe(msn, mo);
        // The queue check needs no state change to report; run it first so that
        // nothing is placed for a bad MSN / MO / length.
        if let Err(cause) = self.q0.check(msn, mo, len) {
            let culprit = if cause == ErrorCause::DdpUntagged(DdpUntaggedCode::MessageTooLong) {
                Culprit::Recv(WcStatus::LocLenErr)
            } else {
                Culprit::None
            };
            return Err(self.violation(cause, bytes, culprit));
        }
        if !data.is_empty() {
            let pieces = match self.recv_pieces(mo as usize, data.len()) {
                Some(p) => p,
                None => {
                    let event = AsyncEvent::QpAccessErr {
                        qp_num: self.qp_num(),
                    };
                    self.local_failure_with(None, Some(WcStatus::LocProtErr), event);
                    return Err(RxError::Local {
                        status: WcStatus::LocProtErr,
                    });
                }
            };
            let mut at = 0usize;
            for (mr, off, n) in pieces {
                let part = data.get(at..at + n).unwrap_or(&[]);
                mr.store(off, part);
                at += n;
            }
        }
        // Cannot fail: checked above with the same arguments.
        if let Err(cause) = self.q0.accept(QN_SEND, msn, mo, len, u.last()) {
            return Err(self.violation(cause, bytes, Culprit::None));
        }
        if !u.last() {
            return Ok(());
        }
        let byte_len = mo.saturating_add(len);
        let mut invalidated = None;
        if let Some(inv) = u.header.invalidate_stag() {
            let stag = Stag::from_raw(inv);
            if let Err(e) = self.mrs.invalidate(stag, self.init.pd, true) {
                return Err(self.violation(
                    e.invalidate_cause(),
                    bytes,
                    Culprit::Recv(WcStatus::RemInvReqErr),
                ));
            }
            invalidated = Some(stag);
        }
        if let Some(r) = self.rq.pop_front() {
            self.retire_recv(1);
            let mut wc =
                WorkCompletion::new(r.wr_id, WcStatus::Success, WcOpcode::Recv, self.qp_num());
            wc.byte_len = byte_len;
            wc.invalidated_stag = invalidated;
            self.push_recv_wc(wc);
        }
        Ok(())
    }

    /// The pieces of the oldest receive WR covering message bytes `[mo, mo + len)`,
    /// each SGE resolved (checked) on first use. `None` if an SGE fails its check.
    fn recv_pieces(
        &mut self,
        mo: usize,
        len: usize,
    ) -> Option<
        Vec<(
            std::sync::Arc<crate::resources::stag_table::MemoryRegion>,
            usize,
            usize,
        )>,
    > {
        let pd = self.recv_pd();
        let mrs = std::sync::Arc::clone(&self.mrs);
        let r = self.rq.front_mut()?;
        let mut out = Vec::new();
        let mut start = 0usize; // message offset of the current SGE
        let end = mo.checked_add(len)?;
        for (i, sge) in r.sges.iter().enumerate() {
            let sge_len = sge.length as usize;
            let sge_end = start + sge_len;
            if sge_len > 0 && sge_end > mo && start < end {
                if r.resolved[i].is_none() {
                    let (mr, off) = mrs
                        .check(
                            sge.lkey,
                            pd,
                            sge.addr,
                            sge.length.into(),
                            AccessFlags::LOCAL_WRITE,
                        )
                        .ok()?;
                    r.resolved[i] = Some((mr, off));
                }
                let (mr, base) = r.resolved[i].clone()?;
                let from = mo.max(start);
                let to = end.min(sge_end);
                out.push((mr, base + (from - start), to - from));
            }
            start = sge_end;
            if start >= end {
                break;
            }
        }
        Some(out)
    }

    /// Immediate Data / with SE (RFC 7306 §6): consumes the receive WR for its MSN
    /// without placing anything; completes it as [`WcOpcode::RecvRdmaWithImm`],
    /// `byte_len` 0, with the low 32 bits of the big-endian 64-bit Immediate Data.
    fn rx_immediate(&mut self, u: &Ulpdu<'_>, bytes: &[u8]) -> Result<(), RxError> {
        let (BufferModel::Untagged { msn, mo, .. }, Body::ImmediateData(imm)) =
            (u.header.buffer, u.body)
        else {
            return Ok(());
        };
        self.take_srq_wqe(msn, mo);
        if let Err(cause) = self.q0.accept(QN_SEND, msn, mo, 0, u.last()) {
            return Err(self.violation(cause, bytes, Culprit::None));
        }
        let value = u64::from_be_bytes(imm.data) as u32;
        if let Some(r) = self.rq.pop_front() {
            self.retire_recv(1);
            let mut wc = WorkCompletion::new(
                r.wr_id,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                self.qp_num(),
            );
            wc.imm_data = Some(value);
            self.push_recv_wc(wc);
        }
        Ok(())
    }

    /// A rule was broken by the ULPDU `bytes`: queue the Terminate RFC 5040 §4.8 /
    /// RFC 5041 §7 prescribe (with the offending headers as
    /// [`terminate::Repr::for_error`] copies them), complete the WR concerned, flush
    /// the rest, move to Error.
    fn violation(&mut self, cause: ErrorCause, bytes: &[u8], culprit: Culprit) -> RxError {
        tracing::debug!(qp = self.qp_num(), %cause, "protocol error, sending Terminate");
        let offending = terminate::Offending {
            ulpdu_len: u16::try_from(bytes.len()).unwrap_or(u16::MAX),
            bytes,
        };
        self.queue_terminate(&terminate::Repr::for_error(cause, Some(offending)));
        let vendor = vendor_err_for(cause);
        match culprit {
            Culprit::None => self.enter_error(None, None),
            Culprit::Recv(st) => self.enter_error(None, Some((st, vendor))),
            Culprit::Send(seq, st) => self.enter_error(Some((seq, st, vendor)), None),
        }
        let event = match cause {
            ErrorCause::RdmapRemoteProtection(_) | ErrorCause::DdpTagged(_) => {
                AsyncEvent::QpAccessErr {
                    qp_num: self.qp_num(),
                }
            }
            ErrorCause::RdmapLocalCatastrophic { .. } | ErrorCause::DdpLocalCatastrophic { .. } => {
                AsyncEvent::QpFatal {
                    qp_num: self.qp_num(),
                }
            }
            _ => AsyncEvent::QpReqErr {
                qp_num: self.qp_num(),
            },
        };
        self.events.push_back(QpEvent::Async(event));
        RxError::Protocol { cause }
    }

    /// The peer's Terminate: no answer; the oldest started send WR completes with
    /// the mapped status, everything else is flushed.
    fn peer_terminated(&mut self, cause: Option<ErrorCause>) -> RxError {
        tracing::debug!(qp = self.qp_num(), ?cause, "Terminate received");
        let status = cause.map_or(WcStatus::GeneralErr, status_for_terminate);
        let vendor = cause.map_or(0, vendor_err_for);
        let started = self
            .sq
            .iter()
            .find(|e| e.phase == Phase::Started)
            .map(|e| (e.seq, status, vendor));
        self.enter_error(started, None);
        self.events.push_back(QpEvent::TerminateReceived { cause });
        self.events.push_back(QpEvent::Async(AsyncEvent::QpFatal {
            qp_num: self.qp_num(),
        }));
        RxError::PeerTerminated { cause }
    }
}
