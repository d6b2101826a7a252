//! The dissector: frames -> TCP segments -> reassembled streams -> MPA Request/Reply
//! -> FPDUs -> DDP/RDMAP headers, collected into a [`Report`].

use std::path::Path;

use crate::capture::{Capture, CaptureError, Frame};
use crate::packet::{decode, decode_tcp, PacketError, TcpSegment};
use crate::reassembly::{BeyondFin, Chunk, ConnTable, Connection, Direction, Handled};
use crate::report::{
    ErrorKind, ErrorRecord, FpduInfo, MpaConnectionInfo, MpaFrameInfo, PduKind, PduRecord, Report,
    SkippedConnection, WarningRecord,
};
use crate::wire::{self, DeframeEvent, FpduDecoder, KeyMatch};

/// Why a capture could not be dissected at all (exit status 2).
#[derive(Debug, thiserror::Error)]
pub enum DissectError {
    /// The file could not be read.
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    /// The input is not a capture file.
    #[error("{0}")]
    NotACapture(CaptureError),
}

/// Dissect the capture file at `path`.
///
/// # Errors
/// [`DissectError::Io`] when the file cannot be read, [`DissectError::NotACapture`]
/// when it is neither pcap nor pcapng. Problems inside a readable capture are
/// reported in [`Report::errors`] instead.
pub fn dissect_file(path: impl AsRef<Path>) -> Result<Report, DissectError> {
    let bytes = std::fs::read(path)?;
    dissect(&bytes)
}

/// Dissect a capture held in memory (the bytes of a pcap or pcapng file).
///
/// # Errors
/// [`DissectError::NotACapture`] when `bytes` is neither pcap nor pcapng.
pub fn dissect(bytes: &[u8]) -> Result<Report, DissectError> {
    let capture = Capture::new(bytes).map_err(DissectError::NotACapture)?;
    let mut d = Dissector {
        report: Report {
            format: Some(capture.format()),
            ..Report::default()
        },
        table: ConnTable::new(),
        states: Vec::new(),
    };
    for frame in capture {
        match frame {
            Ok(frame) => {
                d.report.frames += 1;
                match decode(&frame) {
                    Ok(decoded) => {
                        for w in &decoded.warnings {
                            d.warn(Some(frame.number), w.to_string());
                        }
                        if let Some(seg) = decoded.segment {
                            let mut handled = d.table.handle(frame.number, &seg);
                            if handled.new_connection {
                                d.states.push(ConnState::default());
                            }
                            if seg.is_truncated() {
                                d.note_truncated(&frame, &seg, &handled);
                            }
                            for b in std::mem::take(&mut handled.beyond_fin) {
                                d.note_beyond_fin(handled.conn, handled.dir, &b);
                            }
                            for chunk in handled.chunks {
                                d.on_chunk(handled.conn, handled.dir, chunk);
                            }
                        }
                    }
                    Err(e @ PacketError::TcpHeaderCut { .. }) => {
                        d.report.errors.push(ErrorRecord {
                            frame: Some(frame.number),
                            tcp_id: None,
                            src: None,
                            dst: None,
                            offset: None,
                            kind: ErrorKind::Truncated,
                            message: format!(
                                "{e} ({} of {} frame octets captured); its data is missing",
                                frame.data.len(),
                                frame.orig_len
                            ),
                        });
                    }
                    Err(e @ PacketError::UnsupportedLinkType(_)) => {
                        // Said once, not per frame.
                        let message = e.to_string();
                        if !d.report.warnings.iter().any(|w| w.message == message) {
                            d.warn(Some(frame.number), message);
                        }
                    }
                    Err(e) => d.warn(Some(frame.number), e.to_string()),
                }
            }
            Err(e) => {
                let frame = match &e {
                    CaptureError::Truncated { frame } | CaptureError::Malformed { frame, .. } => {
                        Some(*frame)
                    }
                    CaptureError::NotACapture(_) => None,
                };
                d.report.errors.push(ErrorRecord {
                    frame,
                    tcp_id: None,
                    src: None,
                    dst: None,
                    offset: None,
                    kind: ErrorKind::Capture,
                    message: e.to_string(),
                });
            }
        }
    }
    d.finish();
    Ok(d.report)
}

/// One direction of one TCP connection, reassembled: what [`reassemble`] returns.
#[derive(Debug, Clone)]
pub struct ReassembledStream {
    /// Index of the TCP connection (as in [`crate::report::PduRecord::tcp_id`]).
    pub tcp_id: usize,
    /// Sender.
    pub src: std::net::SocketAddr,
    /// Receiver.
    pub dst: std::net::SocketAddr,
    /// The in-order octets, `data[i]` being stream offset `i` (octets since ISN+1).
    pub data: Vec<u8>,
    /// Which frame carried which octets.
    pub frames: crate::reassembly::FrameMap,
    /// The first hole that never filled, as `[start, end)` offsets, if any:
    /// `data` stops at `start`.
    pub gap: Option<(u64, u64)>,
}

/// Reassemble every TCP stream of a capture, keeping the bytes (the dissector
/// itself does not keep them). Streams come in connection order, client to server
/// first. Frames that cannot be decoded are skipped.
///
/// # Errors
/// [`DissectError::NotACapture`] when `bytes` is neither pcap nor pcapng.
pub fn reassemble(bytes: &[u8]) -> Result<Vec<ReassembledStream>, DissectError> {
    let capture = Capture::new(bytes).map_err(DissectError::NotACapture)?;
    let mut table = ConnTable::new();
    let mut data: Vec<[Vec<u8>; 2]> = Vec::new();
    for frame in capture.map_while(Result::ok) {
        if let Ok(Some(seg)) = decode_tcp(&frame) {
            let h = table.handle(frame.number, &seg);
            if h.new_connection {
                data.push([Vec::new(), Vec::new()]);
            }
            for c in h.chunks {
                data[h.conn][h.dir.index()].extend_from_slice(&c.data);
            }
        }
    }
    let mut out = Vec::new();
    for (conn, mut bufs) in table.into_connections().into_iter().zip(data) {
        for dir in [Direction::ClientToServer, Direction::ServerToClient] {
            let (src, dst) = conn.endpoints(dir);
            let stream = conn.stream(dir);
            out.push(ReassembledStream {
                tcp_id: conn.id,
                src,
                dst,
                data: std::mem::take(&mut bufs[dir.index()]),
                frames: stream.frame_map().clone(),
                gap: stream.gap(),
            });
        }
    }
    Ok(out)
}

/// Decoding state of one TCP connection.
#[derive(Default)]
struct ConnState {
    /// Index in `report.connections` once recognised as MPA.
    mpa: Option<usize>,
    /// Set when the connection is not MPA (or decoding of it was given up).
    skipped: bool,
    /// A Terminate was seen on the connection (RFC 5040 7: nothing more should follow).
    terminated: bool,
    /// The direction that sent the MPA Request.
    initiator: Option<Direction>,
    /// Negotiated parameters of the Request and Reply, by direction index.
    params: [Option<mpa::wire::Repr>; 2],
    dirs: [DirState; 2],
    /// TCP-level errors (frames cut by the capture, data past a FIN), held
    /// until the end: errors for MPA (or undecided) connections, warnings for
    /// connections found not to be MPA.
    tcp_errors: Vec<ErrorRecord>,
    /// The connection was found not to be MPA (other data at its start).
    not_mpa: bool,
}

/// Decoding state of one direction.
#[derive(Default)]
struct DirState {
    /// Delivered octets not yet consumed (before and just after the MPA frame).
    buf: Vec<u8>,
    /// Stream offset of `buf[0]`.
    buf_offset: u64,
    phase: Phase,
}

#[derive(Default)]
enum Phase {
    /// Waiting for the MPA Request/Reply.
    #[default]
    Frame,
    /// MPA frame parsed; waiting for the other side's to know CRC/markers.
    Negotiating,
    /// Decoding FPDUs.
    Fpdus(Box<FpduDecoder>),
    /// Nothing more is decoded in this direction (rejected, fatal error).
    Stopped,
}

struct Dissector {
    report: Report,
    table: ConnTable,
    states: Vec<ConnState>,
}

impl Dissector {
    fn warn(&mut self, frame: Option<u64>, message: String) {
        self.report.warnings.push(WarningRecord { frame, message });
    }

    fn conn(&self, id: usize) -> &Connection {
        &self.table.connections()[id]
    }

    fn error(&mut self, id: usize, dir: Direction, offset: u64, kind: ErrorKind, message: String) {
        let conn = self.conn(id);
        let (src, dst) = conn.endpoints(dir);
        let stream = conn.stream(dir);
        let frame = stream
            .frame_at(offset)
            .or_else(|| stream.frame_at(stream.delivered().saturating_sub(1)));
        self.report.errors.push(ErrorRecord {
            frame,
            tcp_id: Some(id),
            src: Some(src),
            dst: Some(dst),
            offset: Some(offset),
            kind,
            message,
        });
    }

    /// A frame whose TCP payload the capture holds only in part (see
    /// [`TcpSegment::is_truncated`]).
    fn note_truncated(&mut self, frame: &Frame<'_>, seg: &TcpSegment<'_>, h: &Handled) {
        let (src, dst) = self.conn(h.conn).endpoints(h.dir);
        let captured = seg.payload.len();
        let cause = if (frame.data.len() as u64) < u64::from(frame.orig_len) {
            format!(
                "cut by the capture's snapshot length ({} of {} frame octets captured)",
                frame.data.len(),
                frame.orig_len
            )
        } else {
            "cut short: the IP length field claims more octets than the frame holds".to_string()
        };
        self.states[h.conn].tcp_errors.push(ErrorRecord {
            frame: Some(frame.number),
            tcp_id: Some(h.conn),
            src: Some(src),
            dst: Some(dst),
            offset: h.offset.map(|o| o + captured as u64),
            kind: ErrorKind::Truncated,
            message: format!(
                "TCP payload {cause}: {captured} of {} payload octets captured; the rest \
                 is a hole in the stream, not data",
                seg.wire_len
            ),
        });
    }

    /// Data of `dir` past its FIN.
    fn note_beyond_fin(&mut self, id: usize, dir: Direction, b: &BeyondFin) {
        let (src, dst) = self.conn(id).endpoints(dir);
        self.states[id].tcp_errors.push(ErrorRecord {
            frame: Some(b.frame),
            tcp_id: Some(id),
            src: Some(src),
            dst: Some(dst),
            offset: Some(b.offset),
            kind: ErrorKind::Tcp,
            message: format!(
                "{} octets of TCP data past the FIN at stream offset {} (frame {}); \
                 not decoded",
                b.octets, b.fin_offset, b.fin_frame
            ),
        });
    }

    fn skip(&mut self, id: usize, reason: String) {
        let conn = self.conn(id);
        let (client, server) = (conn.client, conn.server);
        let st = &mut self.states[id];
        st.skipped = true;
        st.dirs = Default::default();
        self.report.skipped.push(SkippedConnection {
            tcp_id: id,
            client,
            server,
            reason,
        });
    }

    fn on_chunk(&mut self, id: usize, dir: Direction, chunk: Chunk) {
        if self.states[id].skipped {
            return;
        }
        let d = dir.index();
        let ds = &mut self.states[id].dirs[d];
        match &mut ds.phase {
            Phase::Stopped => return,
            Phase::Fpdus(_) => {
                self.feed_fpdus(id, dir, &chunk.data);
                return;
            }
            Phase::Frame | Phase::Negotiating => {
                if ds.buf.is_empty() {
                    ds.buf_offset = chunk.offset;
                }
                ds.buf.extend_from_slice(&chunk.data);
            }
        }
        if matches!(self.states[id].dirs[d].phase, Phase::Frame) {
            self.try_mpa_frame(id, dir);
        }
    }

    /// Look for the MPA Request/Reply at the start of `dir`'s stream.
    fn try_mpa_frame(&mut self, id: usize, dir: Direction) {
        let d = dir.index();
        let ds = &self.states[id].dirs[d];
        let start = ds.buf_offset;
        let key = wire::key_match(&ds.buf);
        let saw_syn = self.conn(id).stream(dir).saw_syn();
        match key {
            KeyMatch::Partial => return,
            KeyMatch::None => {
                let st = &self.states[id];
                if st.mpa.is_none() {
                    let why = if saw_syn {
                        "no MPA Request at the start of the stream (not MPA)"
                    } else {
                        "no MPA Request at the start of the captured stream (SYN not captured)"
                    };
                    let who = if dir == Direction::ClientToServer {
                        "client"
                    } else {
                        "server"
                    };
                    self.states[id].not_mpa = true;
                    self.skip(id, format!("{why}: {who} sent other data first"));
                } else {
                    let expected = if st.initiator == Some(dir) {
                        "Request"
                    } else {
                        "Reply"
                    };
                    self.error(
                        id,
                        dir,
                        start,
                        ErrorKind::MpaFrame,
                        format!("expected an MPA {expected}, found other data"),
                    );
                    self.states[id].dirs[d].phase = Phase::Stopped;
                }
                return;
            }
            KeyMatch::Request | KeyMatch::Reply => {}
        }
        let is_request = key == KeyMatch::Request;
        // The Request comes from the initiator, the Reply from the responder.
        if let Some(init) = self.states[id].initiator {
            if (init == dir) != is_request {
                let msg = if is_request {
                    "MPA Request from the responder side (both sides sent a Request)"
                } else {
                    "MPA Reply from the initiator side"
                };
                self.error(id, dir, start, ErrorKind::MpaFrame, msg.to_string());
                self.states[id].dirs[d].phase = Phase::Stopped;
                return;
            }
        }
        let buf = &self.states[id].dirs[d].buf;
        let total = match wire::mpa_frame_len(buf) {
            Ok(Some(total)) => total,
            Ok(None) => return, // need the 20-byte header
            Err(msg) => {
                self.register_mpa(id, dir, is_request);
                let kind = if is_request { "Request" } else { "Reply" };
                self.error(
                    id,
                    dir,
                    start,
                    ErrorKind::MpaFrame,
                    format!("malformed MPA {kind}: {msg}"),
                );
                self.states[id].dirs[d].phase = Phase::Stopped;
                return;
            }
        };
        if buf.len() < total {
            return;
        }
        let parsed = wire::parse_mpa_frame(&buf[..total]);
        self.register_mpa(id, dir, is_request);
        let (info, params) = match parsed {
            Ok(x) => x,
            Err(msg) => {
                let kind = if is_request { "Request" } else { "Reply" };
                self.error(
                    id,
                    dir,
                    start,
                    ErrorKind::MpaFrame,
                    format!("malformed MPA {kind}: {msg}"),
                );
                self.states[id].dirs[d].phase = Phase::Stopped;
                return;
            }
        };
        let stream = self.conn(id).stream(dir);
        let frame = stream.frame_at(start + total as u64 - 1).unwrap_or(0);
        let first_frame = stream.frame_at(start).unwrap_or(frame);
        let (src, dst) = self.conn(id).endpoints(dir);
        let info = MpaFrameInfo { frame, ..info };
        let mpa_idx = self.states[id].mpa.unwrap_or(0);
        if let Some(c) = self.report.connections.get_mut(mpa_idx) {
            if is_request {
                c.request = Some(info.clone());
            } else {
                c.reply = Some(info.clone());
            }
        }
        self.report.pdus.push(PduRecord {
            frame,
            first_frame,
            tcp_id: id,
            src,
            dst,
            offset: start,
            wire_len: total as u64,
            kind: if is_request {
                PduKind::MpaRequest(info)
            } else {
                PduKind::MpaReply(info)
            },
        });
        let st = &mut self.states[id];
        let ds = &mut st.dirs[d];
        ds.buf.drain(..total);
        ds.buf_offset += total as u64;
        ds.phase = Phase::Negotiating;
        st.params[d] = Some(params);
        self.try_start_fpdus(id);
    }

    /// Register the MPA connection on its first frame (from `dir`, a Request or not).
    fn register_mpa(&mut self, id: usize, dir: Direction, is_request: bool) {
        if self.states[id].mpa.is_some() {
            return;
        }
        let conn = self.conn(id);
        let (a, b) = conn.endpoints(dir);
        let (initiator, responder) = if is_request { (a, b) } else { (b, a) };
        self.report.connections.push(MpaConnectionInfo {
            tcp_id: id,
            initiator,
            responder,
            request: None,
            reply: None,
            crc: None,
            markers_to_responder: None,
            markers_to_initiator: None,
            fpdus_from_initiator: 0,
            fpdus_from_responder: 0,
        });
        let st = &mut self.states[id];
        st.mpa = Some(self.report.connections.len() - 1);
        st.initiator = Some(if is_request { dir } else { dir.reverse() });
    }

    /// Once both the Request and the Reply are known, start FPDU decoding in both
    /// directions with the negotiated CRC and markers.
    fn try_start_fpdus(&mut self, id: usize) {
        let st = &self.states[id];
        let Some(init) = st.initiator else { return };
        let (Some(req), Some(rep)) = (
            st.params[init.index()].clone(),
            st.params[init.reverse().index()].clone(),
        ) else {
            return;
        };
        let neg = wire::negotiate(&req, &rep);
        if let Some(problem) = &neg.problem {
            let reply_dir = init.reverse();
            // The Reply ended right where the responder's FPDUs start.
            let at = self.states[id].dirs[reply_dir.index()].buf_offset;
            let reply_start = self
                .report
                .pdus
                .iter()
                .rev()
                .find(|p| p.tcp_id == id && matches!(p.kind, PduKind::MpaReply(_)))
                .map_or(at, |p| p.offset);
            self.error(
                id,
                reply_dir,
                reply_start,
                ErrorKind::MpaFrame,
                format!("MPA Reply breaks the negotiation rules: {problem}"),
            );
        }
        let st = &self.states[id];
        if let Some(c) = st.mpa.and_then(|i| self.report.connections.get_mut(i)) {
            c.crc = Some(neg.crc);
            c.markers_to_responder = Some(neg.markers_to_responder);
            c.markers_to_initiator = Some(neg.markers_to_initiator);
        }
        for dir in [init, init.reverse()] {
            let markers = if dir == init {
                neg.markers_to_responder
            } else {
                neg.markers_to_initiator
            };
            let ds = &mut self.states[id].dirs[dir.index()];
            if !matches!(ds.phase, Phase::Negotiating) {
                continue;
            }
            if neg.rejected {
                ds.phase = Phase::Stopped;
                if !ds.buf.is_empty() {
                    let off = ds.buf_offset;
                    self.error(
                        id,
                        dir,
                        off,
                        ErrorKind::MpaFrame,
                        "data after a rejected MPA exchange".to_string(),
                    );
                }
                continue;
            }
            ds.phase = Phase::Fpdus(Box::new(FpduDecoder::new(neg.crc, markers, ds.buf_offset)));
            let buf = std::mem::take(&mut ds.buf);
            if !buf.is_empty() {
                self.feed_fpdus(id, dir, &buf);
            }
        }
    }

    fn feed_fpdus(&mut self, id: usize, dir: Direction, data: &[u8]) {
        let d = dir.index();
        let Phase::Fpdus(dec) = &mut self.states[id].dirs[d].phase else {
            return;
        };
        for ev in dec.feed(data) {
            match ev {
                DeframeEvent::Fpdu {
                    offset,
                    wire_len,
                    info,
                    error,
                } => {
                    let terminate = info.opcode == "Terminate";
                    let pad_nonzero = info.pad_nonzero;
                    self.record_fpdu(id, dir, offset, wire_len, info);
                    if let Some((kind, msg)) = error {
                        self.error(id, dir, offset, kind, msg);
                    }
                    if pad_nonzero {
                        let stream = self.conn(id).stream(dir);
                        let frame = stream.frame_at(offset + wire_len.saturating_sub(1));
                        let (src, _) = self.conn(id).endpoints(dir);
                        self.warn(
                            frame,
                            format!(
                                "TCP #{id} {src}: FPDU at stream offset {offset} has non-zero \
                                 PAD octets (RFC 5044 4.1: zero on transmit)"
                            ),
                        );
                    }
                    if terminate {
                        self.states[id].terminated = true;
                    }
                }
                DeframeEvent::Fatal {
                    offset,
                    kind,
                    message,
                } => {
                    self.error(
                        id,
                        dir,
                        offset,
                        kind,
                        format!("{message}; framing lost, decoding of this direction stopped"),
                    );
                    self.states[id].dirs[d].phase = Phase::Stopped;
                    return;
                }
            }
        }
    }

    fn record_fpdu(
        &mut self,
        id: usize,
        dir: Direction,
        offset: u64,
        wire_len: u64,
        info: FpduInfo,
    ) {
        let stream = self.conn(id).stream(dir);
        let frame = stream
            .frame_at(offset + wire_len.saturating_sub(1))
            .unwrap_or(0);
        let first_frame = stream.frame_at(offset).unwrap_or(frame);
        let (src, dst) = self.conn(id).endpoints(dir);
        if self.states[id].terminated {
            self.warn(
                Some(frame),
                format!("TCP #{id} {src}: FPDU after a Terminate (RFC 5040 7: none should follow)"),
            );
        }
        self.report.fpdus += 1;
        *self.report.opcodes.entry(info.opcode.clone()).or_default() += 1;
        if info.last && info.ddp.is_some() {
            *self.report.messages.entry(info.opcode.clone()).or_default() += 1;
        }
        let st = &self.states[id];
        if let Some(c) = st.mpa.and_then(|i| self.report.connections.get_mut(i)) {
            if st.initiator == Some(dir) {
                c.fpdus_from_initiator += 1;
            } else {
                c.fpdus_from_responder += 1;
            }
        }
        self.report.pdus.push(PduRecord {
            frame,
            first_frame,
            tcp_id: id,
            src,
            dst,
            offset,
            wire_len,
            kind: PduKind::Fpdu(info),
        });
    }

    /// End of capture: report what was left unfinished.
    fn finish(&mut self) {
        self.report.tcp_connections = self.table.connections().len();
        for id in 0..self.states.len() {
            let tcp_errors = std::mem::take(&mut self.states[id].tcp_errors);
            let cut = tcp_errors
                .iter()
                .filter(|e| e.kind == ErrorKind::Truncated)
                .count();
            if self.states[id].not_mpa {
                let (client, server) = (self.conn(id).client, self.conn(id).server);
                for e in tcp_errors {
                    self.warn(
                        e.frame,
                        format!("TCP #{id} {client} -> {server} (not MPA): {}", e.message),
                    );
                }
            } else {
                self.report.errors.extend(tcp_errors);
            }
            let st = &self.states[id];
            if st.skipped {
                continue;
            }
            if st.mpa.is_none() {
                // Never saw enough octets to decide.
                let conn = self.conn(id);
                let any = conn.streams.iter().any(|s| s.delivered() > 0);
                let reason = match (any, cut) {
                    (true, 0) => "too little data to recognise MPA".to_string(),
                    (false, 0) => "no payload".to_string(),
                    (_, n) => format!(
                        "too little payload captured to recognise MPA ({n} frames cut by \
                         the capture, reported as errors)"
                    ),
                };
                self.skip(id, reason);
                continue;
            }
            for dir in [Direction::ClientToServer, Direction::ServerToClient] {
                let d = dir.index();
                let stream = self.conn(id).stream(dir);
                let gap = stream.gap();
                let finished = stream.fin().is_some() || stream.rst().is_some();
                let delivered = stream.delivered();
                if let Some((a, b)) = gap {
                    let after = stream.gap_frame();
                    let msg = format!(
                        "TCP data missing from the capture: stream octets {a}..{b} never seen \
                         before this frame (decoding of this direction stopped there)"
                    );
                    self.report.errors.push(ErrorRecord {
                        frame: after,
                        tcp_id: Some(id),
                        src: Some(self.conn(id).endpoints(dir).0),
                        dst: Some(self.conn(id).endpoints(dir).1),
                        offset: Some(a),
                        kind: ErrorKind::MissingData,
                        message: msg,
                    });
                }
                let ds = &self.states[id].dirs[d];
                let (pending_offset, pending) = match &ds.phase {
                    Phase::Fpdus(dec) => (dec.pending_offset(), dec.pending()),
                    Phase::Frame | Phase::Negotiating => (ds.buf_offset, ds.buf.len() as u64),
                    Phase::Stopped => (0, 0),
                };
                let phase_name = match &ds.phase {
                    Phase::Frame => Some("the MPA frame"),
                    Phase::Fpdus(_) => Some("an FPDU"),
                    Phase::Negotiating => None,
                    Phase::Stopped => None,
                };
                if matches!(ds.phase, Phase::Negotiating) && delivered > 0 {
                    let (src, _) = self.conn(id).endpoints(dir);
                    self.warn(
                        None,
                        format!(
                            "TCP #{id} {src}: MPA exchange incomplete at end of capture \
                             ({} octets not decoded)",
                            ds.buf.len()
                        ),
                    );
                }
                if let (Some(what), true) = (phase_name, pending > 0) {
                    let msg = format!("stream ends inside {what} ({pending} octets left over)");
                    if finished && gap.is_none() {
                        self.error(id, dir, pending_offset, ErrorKind::Truncated, msg);
                    } else {
                        let frame = self.conn(id).stream(dir).frame_at(pending_offset);
                        self.warn(frame, format!("TCP #{id}: capture ends: {msg}"));
                    }
                }
            }
        }
        // Frame order: PDUs were recorded as each completed; sort stably by frame.
        self.report.pdus.sort_by_key(|p| p.frame);
        self.report.errors.sort_by_key(|e| e.frame);
    }
}
