//! TX: send queue processing, Read Responses, segmentation, and the zero-copy hand
//! over of each ULPDU to the driver (siw `siw_qp_tx.c`).

use ddp_rdmap::ddp::BufferModel;
use ddp_rdmap::rdmap::{
    AtomicRequestRepr, AtomicResponseRepr, ImmediateDataRepr, ReadRequestRepr, QN_READ_REQUEST,
};
use ddp_rdmap::segment::{Message, Segments, Target};
use ddp_rdmap::{Header, Opcode};
use verbs::{AccessFlags, Payload, QpState, SendFlags, SendOp, Sge, WcStatus};

use super::{IrqEntry, OrqEntry, OrqRead, Phase, Piece, QpEngine, TxError, MIN_MULPDU};

/// Where [`QpEngine::poll_transmit`] writes one ULPDU: typically the driver's MPA FPDU
/// framer, which writes the ULPDU Length, then each part (computing the CRC32c as it
/// copies into the TCP send buffer), then pad and CRC.
///
/// For each ULPDU the engine calls [`TxSink::begin`] once, [`TxSink::put`] one or
/// more times with consecutive parts (DDP/RDMAP header first, then payload pieces),
/// and [`TxSink::end`] once. Payload parts are slices of MR memory handed over
/// *while that MR's lock is held* — the one copy from the MR to the transport. An
/// implementation must therefore not call into the MR or MR table API from
/// [`TxSink::put`] (it would deadlock on the MR lock).
pub trait TxSink {
    /// A ULPDU of `len` bytes begins (the MPA ULPDU Length, RFC 5044 §4.1).
    fn begin(&mut self, len: usize);
    /// The next `bytes` of the ULPDU.
    fn put(&mut self, bytes: &[u8]);
    /// The ULPDU is complete; exactly `len` bytes were put.
    fn end(&mut self);
}

/// Appends each ULPDU to the vector (tests, simple drivers).
impl TxSink for Vec<u8> {
    fn begin(&mut self, len: usize) {
        self.reserve(len);
    }

    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn end(&mut self) {}
}

/// Where a message's bytes come from.
#[derive(Debug)]
pub(super) enum Source {
    /// Bytes owned by the job: inline data, a Read Request or Immediate Data body.
    Owned(Vec<u8>),
    /// Registered memory, resolved and checked when the message started.
    Pieces(Vec<Piece>),
}

/// Which WR (or stream) a message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MsgKind {
    /// The message of send WR `seq` (Send, Write, or the Write of a Write with
    /// Immediate).
    Wr(u64),
    /// The Immediate Data that follows the Write of Write with Immediate WR `seq`.
    Imm(u64),
    /// A Read Response or an Atomic Response (the responder's stream).
    ReadResponse,
}

/// One message being segmented.
#[derive(Debug)]
pub(super) struct MsgJob {
    pub(super) kind: MsgKind,
    pub(super) segs: Segments,
    pub(super) tagged: bool,
    pub(super) src: Source,
    /// Cursor in `src`: piece index and offset within it (for `Owned`: byte
    /// offset in `.0`).
    pub(super) piece: usize,
    pub(super) piece_off: usize,
}

/// One Read Request to send for a Read WR.
#[derive(Debug, Clone, Copy)]
pub(super) struct SubRead {
    pub(super) sink_stag: u32,
    pub(super) sink_to: u64,
    pub(super) size: u32,
    pub(super) src_stag: u32,
    pub(super) src_to: u64,
}

/// Work in progress on one TX stream.
#[derive(Debug)]
pub(super) enum Job {
    /// A segmented message.
    Message(MsgJob),
    /// The Read Requests of Read WR `seq`, sent one per ORD credit.
    ReadRequests {
        seq: u64,
        subs: Vec<SubRead>,
        next: usize,
    },
    /// The Atomic Request of atomic WR `seq` (one ORD credit); `req`'s Request
    /// Identifier is set when it is sent. The result goes to `sink` (8 bytes, checked
    /// when the WR started).
    Atomic {
        seq: u64,
        req: AtomicRequestRepr,
        sink: Sge,
    },
}

impl Job {
    /// True for a tagged message (RDMA Write or Read Response) in progress.
    pub(super) fn is_tagged(&self) -> bool {
        matches!(self, Job::Message(m) if m.tagged)
    }
}

/// Zeros put in place of bytes that cannot be read (never happens for resolved
/// ranges; keeps the framing intact if it did).
static ZEROS: [u8; 256] = [0; 256];

fn put_zeros<S: TxSink + ?Sized>(sink: &mut S, mut n: usize) {
    while n > 0 {
        let k = n.min(ZEROS.len());
        sink.put(&ZEROS[..k]);
        n -= k;
    }
}

impl MsgJob {
    fn new(kind: MsgKind, msg: Message, mulpdu: usize, src: Source) -> Option<MsgJob> {
        let segs = msg.segments(mulpdu).ok()?;
        Some(MsgJob {
            kind,
            segs,
            tagged: msg.opcode.is_tagged(),
            src,
            piece: 0,
            piece_off: 0,
        })
    }

    /// Emits the next segment; returns its L flag, or `None` if the message had no
    /// segment left (cannot happen: finished jobs are dropped). `remainder_first`: this
    /// one may be the message's short segment ([`Segments::next_remainder_first`]).
    fn emit<S: TxSink + ?Sized>(&mut self, sink: &mut S, remainder_first: bool) -> Option<bool> {
        let seg = if remainder_first {
            self.segs.next_remainder_first()?
        } else {
            self.segs.next()?
        };
        let mut hdr = [0u8; ddp_rdmap::ddp::UNTAGGED_HEADER_LEN];
        let hlen = seg.header.buffer_len();
        if seg.header.emit(&mut hdr).is_err() {
            return None;
        }
        let len = seg.len as usize;
        sink.begin(hlen + len);
        sink.put(&hdr[..hlen]);
        self.copy(sink, len);
        sink.end();
        Some(seg.header.last)
    }

    /// Puts the next `n` payload bytes, piece by piece, each under its MR lock.
    fn copy<S: TxSink + ?Sized>(&mut self, sink: &mut S, mut n: usize) {
        match &self.src {
            Source::Owned(bytes) => {
                let start = self.piece_off;
                let end = start.saturating_add(n);
                match bytes.get(start..end) {
                    Some(b) => sink.put(b),
                    None => put_zeros(sink, n),
                }
                self.piece_off = end;
            }
            Source::Pieces(pieces) => {
                while n > 0 {
                    let Some(p) = pieces.get(self.piece) else {
                        put_zeros(sink, n);
                        return;
                    };
                    let left = p.len.saturating_sub(self.piece_off);
                    if left == 0 {
                        self.piece += 1;
                        self.piece_off = 0;
                        continue;
                    }
                    let take = left.min(n);
                    p.mr.with_bytes(p.off + self.piece_off, take, |bytes| match bytes {
                        Some(b) => sink.put(b),
                        None => put_zeros(sink, take),
                    });
                    self.piece_off += take;
                    n -= take;
                }
            }
        }
    }
}

impl QpEngine {
    /// Produces the next ULPDU to send, if any, into `sink` and returns true; false
    /// if there is nothing to send now. `mulpdu` is the largest ULPDU the driver's
    /// FPDU can carry, in bytes (RFC 5044 §4.1 MULPDU; one FPDU per TCP segment).
    ///
    /// Order: a queued Terminate first (and nothing after it); otherwise the next
    /// segment of the SQ stream or of the Read Response stream, alternating when
    /// both are ready (see the [module documentation](super)). A message started
    /// with one MULPDU keeps it for all its segments.
    ///
    /// # Errors
    ///
    /// [`TxError::MulpduTooSmall`] if `mulpdu` < [`MIN_MULPDU`].
    pub fn poll_transmit<S: TxSink + ?Sized>(
        &mut self,
        mulpdu: usize,
        sink: &mut S,
    ) -> Result<bool, TxError> {
        self.poll_transmit_at(mulpdu, false, sink)
    }

    /// [`QpEngine::poll_transmit`], told whether this ULPDU ends a run of FPDUs that
    /// must all be full but the last (`ends_run`: a TCP super-segment that the link cuts
    /// every MSS bytes, see `transport`'s "One FPDU per TCP segment"). When it does, a
    /// message segment emitted now carries the message's remainder
    /// ([`Segments::next_remainder_first`]), so the message's later segments are all full
    /// and the next run can go on into the next message. Same errors.
    pub fn poll_transmit_at<S: TxSink + ?Sized>(
        &mut self,
        mulpdu: usize,
        ends_run: bool,
        sink: &mut S,
    ) -> Result<bool, TxError> {
        if mulpdu < MIN_MULPDU {
            return Err(TxError::MulpduTooSmall {
                mulpdu,
                min: MIN_MULPDU,
            });
        }
        let sent = self.transmit(mulpdu, ends_run, sink);
        self.after_op();
        // A failure while starting a WR queues a Terminate: send it now.
        let sent = sent || self.emit_terminate(sink);
        Ok(sent)
    }

    fn emit_terminate<S: TxSink + ?Sized>(&mut self, sink: &mut S) -> bool {
        match self.terminate_out.take() {
            Some(t) => {
                sink.begin(t.len());
                sink.put(&t);
                sink.end();
                true
            }
            None => false,
        }
    }

    fn transmit<S: TxSink + ?Sized>(
        &mut self,
        mulpdu: usize,
        ends_run: bool,
        sink: &mut S,
    ) -> bool {
        if self.emit_terminate(sink) {
            return true;
        }
        if self.stream_closed || !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return false;
        }
        // At a message boundary the stream that did not send last starts first, so
        // a run of Writes cannot starve Read Responses (nor the reverse): a
        // started Read Response holds back the next Write until it is done.
        if !self.last_was_rr && self.tx_rr.is_none() && !self.sq_job_tagged() {
            self.start_read_response(mulpdu);
        }
        if self.tx_sq.is_none() {
            self.start_next(mulpdu);
            if self.state == QpState::Error {
                return false;
            }
        }
        if self.tx_rr.is_none() && !self.sq_job_tagged() {
            self.start_read_response(mulpdu);
        }
        let sq_ready = self.tx_sq.as_ref().is_some_and(|j| self.job_ready(j));
        let rr_ready = self.tx_rr.is_some();
        let use_rr = match (sq_ready, rr_ready) {
            (true, true) => !self.last_was_rr,
            (false, true) => true,
            (true, false) => false,
            (false, false) => return false,
        };
        self.last_was_rr = use_rr;
        if use_rr {
            self.emit_read_response(sink, ends_run)
        } else {
            self.emit_sq(mulpdu, sink, ends_run)
        }
    }

    /// Starts send WRs until one produces a message (or Read Requests), one is
    /// blocked, the SQ is empty, or one fails.
    fn start_next(&mut self, mulpdu: usize) {
        while self.tx_sq.is_none() && self.state == QpState::Rts {
            let Some(seq) = self.next_startable() else {
                return;
            };
            let Some(i) = self.index_of(seq) else { return };
            self.start_seq = seq + 1;
            let (op, flags, payload, len) = {
                let e = &mut self.sq[i];
                e.phase = Phase::Started;
                (e.wr.op, e.wr.flags, e.wr.payload.clone(), e.len)
            };
            match op {
                SendOp::Send | SendOp::SendWithInv { .. } => {
                    let inv = match op {
                        SendOp::SendWithInv { invalidate_rkey } => Some(invalidate_rkey.raw()),
                        _ => None,
                    };
                    let se = flags.contains(SendFlags::SOLICITED);
                    let opcode = match (inv.is_some(), se) {
                        (false, false) => Opcode::Send,
                        (false, true) => Opcode::SendSE,
                        (true, false) => Opcode::SendInvalidate,
                        (true, true) => Opcode::SendSEInvalidate,
                    };
                    let Some(src) = self.source(&payload) else {
                        return self.local_failure(Some((seq, WcStatus::LocProtErr)), None);
                    };
                    let msg = Message {
                        opcode,
                        len,
                        target: Target::Untagged {
                            msn: self.send_msn,
                            inv_stag: inv.unwrap_or(0),
                        },
                    };
                    self.send_msn = self.send_msn.wrapping_add(1);
                    self.start_message(MsgKind::Wr(seq), msg, mulpdu, src);
                }
                SendOp::RdmaWrite { remote_addr, rkey }
                | SendOp::RdmaWriteWithImm {
                    remote_addr, rkey, ..
                } => {
                    let Some(src) = self.source(&payload) else {
                        return self.local_failure(Some((seq, WcStatus::LocProtErr)), None);
                    };
                    let msg = Message {
                        opcode: Opcode::Write,
                        len,
                        target: Target::Tagged {
                            stag: rkey.raw(),
                            to: remote_addr,
                        },
                    };
                    self.start_message(MsgKind::Wr(seq), msg, mulpdu, src);
                }
                SendOp::RdmaRead { remote_addr, rkey } => {
                    let Payload::Sges(sges) = &payload else {
                        return self.local_failure(Some((seq, WcStatus::LocQpOpErr)), None);
                    };
                    if self
                        .resolve_sges(sges, self.init.read_sink_access)
                        .is_none()
                    {
                        return self.local_failure(Some((seq, WcStatus::LocProtErr)), None);
                    }
                    let mut subs = Vec::new();
                    let mut to = remote_addr;
                    for s in sges.iter().filter(|s| s.length > 0) {
                        subs.push(SubRead {
                            sink_stag: s.lkey.raw(),
                            sink_to: s.addr,
                            size: s.length,
                            src_stag: rkey.raw(),
                            src_to: to,
                        });
                        to = to.wrapping_add(u64::from(s.length));
                    }
                    if subs.is_empty() {
                        // A zero-length Read: one Read Request of size 0 (the
                        // sink STag is not used by the responder).
                        let sink = sges.first();
                        subs.push(SubRead {
                            sink_stag: sink.map_or(0, |s| s.lkey.raw()),
                            sink_to: sink.map_or(0, |s| s.addr),
                            size: 0,
                            src_stag: rkey.raw(),
                            src_to: remote_addr,
                        });
                    }
                    self.tx_sq = Some(Job::ReadRequests { seq, subs, next: 0 });
                }
                SendOp::LocalInv { invalidate_stag } => {
                    match self.mrs.invalidate(invalidate_stag, self.init.pd, false) {
                        Ok(()) => self.finish(seq),
                        Err(_) => {
                            return self.local_failure(Some((seq, WcStatus::MwBindErr)), None)
                        }
                    }
                }
                SendOp::FastReg(reg) => match self.mrs.fast_reg(&reg, self.init.pd) {
                    Ok(()) => self.finish(seq),
                    Err(_) => return self.local_failure(Some((seq, WcStatus::MwBindErr)), None),
                },
                SendOp::AtomicCmpSwap {
                    remote_addr,
                    rkey,
                    compare,
                    swap,
                } => {
                    let req =
                        AtomicRequestRepr::cmp_swap(0, rkey.raw(), remote_addr, compare, swap);
                    if let Err(st) = self.start_atomic(seq, req, &payload) {
                        return self.local_failure(Some((seq, st)), None);
                    }
                }
                SendOp::AtomicFetchAdd {
                    remote_addr,
                    rkey,
                    add,
                } => {
                    let req = AtomicRequestRepr::fetch_add(0, rkey.raw(), remote_addr, add);
                    if let Err(st) = self.start_atomic(seq, req, &payload) {
                        return self.local_failure(Some((seq, st)), None);
                    }
                }
            }
        }
    }

    /// Starts atomic WR `seq`: its one 8-byte SGE (checked by post_send) must be local
    /// memory the QP may write (`LOCAL_WRITE`), where the Original Remote Data Value
    /// lands; the Atomic Request then waits for an ORD credit. The status to fail the
    /// WR with otherwise.
    fn start_atomic(
        &mut self,
        seq: u64,
        req: AtomicRequestRepr,
        payload: &Payload,
    ) -> Result<(), WcStatus> {
        let Payload::Sges(sges) = payload else {
            return Err(WcStatus::LocQpOpErr);
        };
        let [sink] = sges.as_slice() else {
            return Err(WcStatus::LocQpOpErr);
        };
        if self
            .resolve_sges(sges, AccessFlags::LOCAL_WRITE)
            .is_none_or(|p| p.len() != 1)
        {
            return Err(WcStatus::LocProtErr);
        }
        self.tx_sq = Some(Job::Atomic {
            seq,
            req,
            sink: *sink,
        });
        Ok(())
    }

    /// The data source of a Send or Write: inline bytes, or the SGEs resolved
    /// against the MR table (no rights needed to read local memory).
    fn source(&self, payload: &Payload) -> Option<Source> {
        match payload {
            Payload::Inline(data) => Some(Source::Owned(data.clone())),
            Payload::Sges(sges) => self
                .resolve_sges(sges, AccessFlags::empty())
                .map(Source::Pieces),
        }
    }

    fn start_message(&mut self, kind: MsgKind, msg: Message, mulpdu: usize, src: Source) {
        match MsgJob::new(kind, msg, mulpdu, src) {
            Some(job) => self.tx_sq = Some(Job::Message(job)),
            None => {
                // Only a TO wrap gets here, and post_send refuses those.
                let seq = match kind {
                    MsgKind::Wr(s) | MsgKind::Imm(s) => Some((s, WcStatus::LocQpOpErr)),
                    MsgKind::ReadResponse => None,
                };
                self.local_failure(seq, None);
            }
        }
    }

    /// Starts the response to the oldest queued request: its Read Response, or its
    /// Atomic Response after executing the atomic if that did not happen on arrival.
    fn start_read_response(&mut self, mulpdu: usize) {
        let Some(entry) = self.irq.pop_front() else {
            return;
        };
        let (msg, src) = match entry {
            IrqEntry::Read {
                sink_stag,
                sink_to,
                size,
                src,
            } => {
                let msg = Message {
                    opcode: Opcode::ReadResponse,
                    len: size,
                    target: Target::Tagged {
                        stag: sink_stag,
                        to: sink_to,
                    },
                };
                (msg, Source::Pieces(src.into_iter().collect()))
            }
            IrqEntry::Atomic {
                req,
                mr,
                off,
                original,
            } => {
                let original = match original.or_else(|| mr.atomic_update(off, |v| req.apply(v))) {
                    Some(v) => v,
                    // Resolved on arrival: cannot be outside the buffer.
                    None => return self.local_failure(None, None),
                };
                let body = AtomicResponseRepr {
                    request_id: req.request_id,
                    original_value: original,
                };
                let msg = Message {
                    opcode: Opcode::AtomicResponse,
                    len: body.buffer_len() as u32,
                    target: Target::Untagged {
                        msn: self.aresp_msn,
                        inv_stag: 0,
                    },
                };
                self.aresp_msn = self.aresp_msn.wrapping_add(1);
                (msg, Source::Owned(body.to_bytes().to_vec()))
            }
        };
        match MsgJob::new(MsgKind::ReadResponse, msg, mulpdu, src) {
            Some(job) => self.tx_rr = Some(Job::Message(job)),
            // The Read Request was checked for TO wrap on receipt.
            None => self.local_failure(None, None),
        }
    }

    fn emit_read_response<S: TxSink + ?Sized>(&mut self, sink: &mut S, ends_run: bool) -> bool {
        let Some(Job::Message(job)) = self.tx_rr.as_mut() else {
            return false;
        };
        match job.emit(sink, ends_run) {
            Some(true) => {
                self.tx_rr = None;
                // The IRD credit comes back once the response is sent.
                self.q1.post_buffer(super::READ_REQUEST_BUFFER);
                true
            }
            Some(false) => true,
            None => {
                self.tx_rr = None;
                false
            }
        }
    }

    fn emit_sq<S: TxSink + ?Sized>(&mut self, mulpdu: usize, sink: &mut S, ends_run: bool) -> bool {
        match self.tx_sq.as_mut() {
            Some(Job::Message(job)) => {
                let kind = job.kind;
                match job.emit(sink, ends_run) {
                    Some(true) => {
                        self.tx_sq = None;
                        self.message_sent(kind, mulpdu);
                        true
                    }
                    Some(false) => true,
                    None => {
                        self.tx_sq = None;
                        false
                    }
                }
            }
            Some(Job::Atomic {
                seq,
                req,
                sink: result_to,
            }) => {
                let (seq, req, result_to) = (*seq, *req, *result_to);
                self.tx_sq = None;
                self.emit_atomic_request(seq, req, result_to, sink);
                true
            }
            Some(Job::ReadRequests { seq, subs, next }) => {
                let seq = *seq;
                let Some(sub) = subs.get(*next).copied() else {
                    self.tx_sq = None;
                    return false;
                };
                *next += 1;
                if *next >= subs.len() {
                    self.tx_sq = None;
                }
                self.emit_read_request(seq, sub, sink);
                true
            }
            None => false,
        }
    }

    fn emit_read_request<S: TxSink + ?Sized>(&mut self, seq: u64, sub: SubRead, sink: &mut S) {
        let header = Header {
            opcode: Opcode::ReadRequest,
            last: true,
            buffer: BufferModel::Untagged {
                rsvd_ulp: 0,
                qn: QN_READ_REQUEST,
                msn: self.rreq_msn,
                mo: 0,
            },
        };
        self.rreq_msn = self.rreq_msn.wrapping_add(1);
        let body = ReadRequestRepr {
            sink_stag: sub.sink_stag,
            sink_to: sub.sink_to,
            size: sub.size,
            src_stag: sub.src_stag,
            src_to: sub.src_to,
        }
        .to_bytes();
        let mut hdr = [0u8; ddp_rdmap::ddp::UNTAGGED_HEADER_LEN];
        let hlen = header.buffer_len();
        // Cannot fail: opcode and buffer model agree, buffer is 18 bytes.
        let _ = header.emit(&mut hdr);
        sink.begin(hlen + body.len());
        sink.put(&hdr[..hlen]);
        sink.put(&body);
        sink.end();
        self.orq.push_back(OrqEntry::Read(OrqRead {
            seq,
            sink_stag: sub.sink_stag,
            sink_to: sub.sink_to,
            size: sub.size,
            placed: 0,
        }));
    }

    /// Sends the Atomic Request of WR `seq` (RFC 7306 §5): untagged, QN 1 with the
    /// next Read Request MSN, which is also its Request Identifier (unique among the
    /// requests outstanding). Takes an ORD credit (ORQ entry) and posts the QN 3
    /// buffer its Atomic Response will consume.
    fn emit_atomic_request<S: TxSink + ?Sized>(
        &mut self,
        seq: u64,
        mut req: AtomicRequestRepr,
        result_to: Sge,
        sink: &mut S,
    ) {
        let msn = self.rreq_msn;
        self.rreq_msn = self.rreq_msn.wrapping_add(1);
        req.request_id = msn;
        let header = Header {
            opcode: Opcode::AtomicRequest,
            last: true,
            buffer: BufferModel::Untagged {
                rsvd_ulp: 0,
                qn: QN_READ_REQUEST,
                msn,
                mo: 0,
            },
        };
        let mut hdr = [0u8; ddp_rdmap::ddp::UNTAGGED_HEADER_LEN];
        let hlen = header.buffer_len();
        // Cannot fail: opcode and buffer model agree, buffer is 18 bytes.
        let _ = header.emit(&mut hdr);
        let body = req.to_bytes();
        sink.begin(hlen + body.len());
        sink.put(&hdr[..hlen]);
        sink.put(&body);
        sink.end();
        self.q3.post_buffer(super::ATOMIC_RESPONSE_BUFFER);
        self.orq.push_back(OrqEntry::Atomic {
            seq,
            request_id: msn,
            sink: result_to,
        });
    }

    /// The last segment of a message left: complete the WR, or follow a Write with
    /// Immediate's Write with its Immediate Data.
    fn message_sent(&mut self, kind: MsgKind, mulpdu: usize) {
        match kind {
            MsgKind::Wr(seq) => {
                let imm = self.index_of(seq).and_then(|i| match self.sq[i].wr.op {
                    SendOp::RdmaWriteWithImm { imm_data, .. } => {
                        Some((imm_data, self.sq[i].wr.flags.contains(SendFlags::SOLICITED)))
                    }
                    _ => None,
                });
                match imm {
                    Some((imm_data, se)) => {
                        // RFC 7306 §6: 8 bytes of Immediate Data; the 32-bit verbs
                        // immediate is the low half of the big-endian 64-bit value.
                        let data = ImmediateDataRepr {
                            data: u64::from(imm_data).to_be_bytes(),
                        };
                        let msg = Message {
                            opcode: if se {
                                Opcode::ImmediateDataSE
                            } else {
                                Opcode::ImmediateData
                            },
                            len: data.data.len() as u32,
                            target: Target::Untagged {
                                msn: self.send_msn,
                                inv_stag: 0,
                            },
                        };
                        self.send_msn = self.send_msn.wrapping_add(1);
                        self.start_message(
                            MsgKind::Imm(seq),
                            msg,
                            mulpdu,
                            Source::Owned(data.data.to_vec()),
                        );
                    }
                    None => self.finish(seq),
                }
            }
            MsgKind::Imm(seq) => self.finish(seq),
            MsgKind::ReadResponse => {}
        }
    }
}
