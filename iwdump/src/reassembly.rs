//! TCP stream reassembly, one [`Reassembler`] per direction of each connection,
//! and a [`ConnTable`] that finds the connection and direction of each segment.
//!
//! Stream offsets are octets since ISN+1: offset 0 is the first data octet after the
//! SYN. When the SYN was not captured, offset 0 is the first octet of the first
//! segment seen (and [`Reassembler::saw_syn`] is false). Sequence numbers are
//! unwrapped to 64 bits relative to the delivery point, so streams longer than
//! 4 GiB are fine as long as no segment lies 2 GiB away from it.
//!
//! What the reassembler handles: in-order data; retransmissions and duplicates
//! (dropped, counted); partial overlaps (the part already delivered or already
//! buffered is trimmed: first arrival wins); out-of-order segments (buffered until the
//! gap fills); a frame cut short by the snapshot length (its captured prefix is used,
//! the rest is a gap); SYN (ISN), FIN (end of data) and RST. Data past the FIN
//! (sent later, buffered before the FIN was seen, or even delivered before a FIN
//! that lies below it) is never delivered after the FIN is known and is reported
//! as [`BeyondFin`] records, so a dissector can flag it.
//!
//! Every delivered octet's frame is remembered as a short list of
//! `(first stream offset, frame number)` entries, one per segment, so
//! [`Reassembler::frame_at`] names the frame that carried any delivered octet.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use crate::packet::TcpSegment;

/// A run of in-order stream octets handed out by [`Reassembler::handle_segment`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Stream offset of `data[0]` (octets since ISN+1).
    pub offset: u64,
    /// Number of the frame that carried these octets.
    pub frame: u64,
    /// The octets.
    pub data: Vec<u8>,
}

/// Which frame carried which stream octets: sorted `(first offset, frame)` runs, each
/// run extending to the next one's start (the last to the delivery point).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrameMap {
    runs: Vec<(u64, u64)>,
    end: u64,
}

impl FrameMap {
    /// Record that octets `[offset, offset + len)` came in frame `frame`. Offsets must
    /// be added in increasing, contiguous order (the delivery order).
    pub fn push(&mut self, offset: u64, len: u64, frame: u64) {
        if len == 0 {
            return;
        }
        match self.runs.last() {
            Some(&(_, f)) if f == frame && offset == self.end => {}
            _ => self.runs.push((offset, frame)),
        }
        self.end = offset + len;
    }

    /// The frame that carried the octet at `offset`, or `None` when `offset` has not
    /// been delivered (beyond the end, or before the first run).
    pub fn frame_at(&self, offset: u64) -> Option<u64> {
        if offset >= self.end {
            return None;
        }
        let i = self.runs.partition_point(|&(o, _)| o <= offset);
        i.checked_sub(1).map(|i| self.runs[i].1)
    }

    /// Distinct frames carrying octets of `[start, end)`, in stream order.
    pub fn frames_in(&self, start: u64, end: u64) -> Vec<u64> {
        let end = end.min(self.end);
        if start >= end {
            return Vec::new();
        }
        let first = self
            .runs
            .partition_point(|&(o, _)| o <= start)
            .saturating_sub(1);
        let mut out: Vec<u64> = Vec::new();
        for &(o, f) in &self.runs[first..] {
            if o >= end {
                break;
            }
            if out.last() != Some(&f) {
                out.push(f);
            }
        }
        out
    }

    /// The `(first offset, frame)` runs, in stream order.
    pub fn runs(&self) -> &[(u64, u64)] {
        &self.runs
    }
}

/// Counters kept by a [`Reassembler`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReassemblyStats {
    /// Segments (with data, SYN, FIN or RST) handed to the reassembler.
    pub segments: u64,
    /// Octets dropped because they had already been delivered or buffered.
    pub duplicate_octets: u64,
    /// Segments that arrived ahead of a gap and had to be buffered.
    pub out_of_order_segments: u64,
    /// Octets (on the wire) lying past the FIN: see [`BeyondFin`].
    pub octets_after_fin: u64,
}

/// TCP data past the end of a stream that a FIN fixed (RFC 9293: a FIN
/// ends the sender's data; nothing may follow it in sequence space).
/// The octets are not delivered (except those already delivered before the
/// FIN was seen, which are reported as well).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeyondFin {
    /// The frame that carried the octets.
    pub frame: u64,
    /// Stream offset of the first of them (at or past `fin_offset`).
    pub offset: u64,
    /// How many octets (on the wire; a snapped frame's uncaptured part counts).
    pub octets: u64,
    /// Stream offset of the FIN (the stream's length).
    pub fin_offset: u64,
    /// The frame that carried the FIN.
    pub fin_frame: u64,
}

/// What one segment did to a [`Reassembler`]: see
/// [`Reassembler::handle_segment_detailed`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentOutcome {
    /// Stream offset of the segment's first data octet (the octet after the
    /// SYN for a SYN); `None` for a RST, or when it lies before offset 0.
    pub offset: Option<u64>,
    /// Octets that became deliverable in order, possibly none.
    pub chunks: Vec<Chunk>,
    /// Data found past the FIN because of this segment: octets of the segment
    /// itself past a FIN seen before, or, when the segment carries the FIN,
    /// octets already buffered or delivered past it.
    pub beyond_fin: Vec<BeyondFin>,
}

/// Reassembly of one direction of one TCP connection.
#[derive(Debug, Clone, Default)]
pub struct Reassembler {
    /// Initial sequence number (from the SYN), when the SYN was seen.
    isn: Option<u32>,
    /// Sequence number of stream offset 0.
    base: Option<u32>,
    /// Next stream offset to deliver: everything before it has been delivered.
    delivered: u64,
    /// Out-of-order data, non-overlapping, keyed by stream offset: (frame, octets).
    pending: BTreeMap<u64, (u64, Vec<u8>)>,
    /// Stream offset of the FIN (= the stream's length) and its frame.
    fin: Option<(u64, u64)>,
    /// Frame of the first RST.
    rst: Option<u64>,
    map: FrameMap,
    stats: ReassemblyStats,
}

impl Reassembler {
    /// A reassembler that has seen nothing yet.
    pub fn new() -> Reassembler {
        Reassembler::default()
    }

    // ---- getters ----

    /// The ISN, when the SYN was captured.
    pub fn isn(&self) -> Option<u32> {
        self.isn
    }

    /// Whether offset 0 is really ISN+1 (the SYN was captured).
    pub fn saw_syn(&self) -> bool {
        self.isn.is_some()
    }

    /// Octets delivered so far: every offset below this one has been delivered.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Stream length and FIN frame, once a FIN was seen: `(offset of the FIN, frame)`.
    pub fn fin(&self) -> Option<(u64, u64)> {
        self.fin
    }

    /// Frame of the first RST sent in this direction, if any.
    pub fn rst(&self) -> Option<u64> {
        self.rst
    }

    /// Whether every octet up to the FIN has been delivered.
    pub fn is_complete(&self) -> bool {
        matches!(self.fin, Some((end, _)) if self.delivered >= end)
    }

    /// The first hole, as `[start, end)` stream offsets, when data is missing: octets
    /// after it are buffered (or the FIN lies after it) but it was never captured.
    pub fn gap(&self) -> Option<(u64, u64)> {
        if let Some((&start, _)) = self.pending.iter().next() {
            return Some((self.delivered, start));
        }
        match self.fin {
            Some((end, _)) if end > self.delivered => Some((self.delivered, end)),
            _ => None,
        }
    }

    /// The frame that revealed the first hole: the frame of the first octet buffered
    /// after it, or of the FIN when nothing is buffered.
    pub fn gap_frame(&self) -> Option<u64> {
        match self.pending.values().next() {
            Some(&(frame, _)) => Some(frame),
            None => self.fin.map(|(_, f)| f).filter(|_| self.gap().is_some()),
        }
    }

    /// Octets buffered out of order behind a gap.
    pub fn buffered(&self) -> u64 {
        self.pending.values().map(|(_, d)| d.len() as u64).sum()
    }

    /// The frame that carried the delivered octet at stream offset `offset`.
    pub fn frame_at(&self, offset: u64) -> Option<u64> {
        self.map.frame_at(offset)
    }

    /// The whole offset-to-frame map.
    pub fn frame_map(&self) -> &FrameMap {
        &self.map
    }

    /// Counters.
    pub fn stats(&self) -> ReassemblyStats {
        self.stats
    }

    // ---- input ----

    /// Stream offset of sequence number `seq`, unwrapped near the delivery point.
    /// Negative when `seq` lies before offset 0.
    fn offset_of(&self, base: u32, seq: u32) -> i64 {
        let rel = seq.wrapping_sub(base);
        // Truncation intended: the low 32 bits of the delivery point.
        let cur_lo = self.delivered as u32;
        let diff = i64::from(rel.wrapping_sub(cur_lo) as i32);
        i64::try_from(self.delivered).unwrap_or(i64::MAX) + diff
    }

    /// Take one segment of this direction, captured in frame `frame`.
    ///
    /// `seq` is the segment's sequence number, `syn`/`fin`/`rst` its flags,
    /// `payload` the captured payload and `wire_len` the payload's length on the wire
    /// (more than `payload.len()` when the frame was truncated by the snapshot length).
    /// Returns the octets that became deliverable in order, possibly none; data
    /// past the FIN is dropped (see [`Reassembler::handle_segment_detailed`] to
    /// learn about it).
    #[allow(clippy::too_many_arguments)]
    pub fn handle_segment(
        &mut self,
        frame: u64,
        seq: u32,
        syn: bool,
        fin: bool,
        rst: bool,
        payload: &[u8],
        wire_len: u32,
    ) -> Vec<Chunk> {
        self.handle_segment_detailed(frame, seq, syn, fin, rst, payload, wire_len)
            .chunks
    }

    /// [`Reassembler::handle_segment`], also telling which data lay past the
    /// FIN ([`SegmentOutcome::beyond_fin`]). The first FIN seen fixes the
    /// stream's end.
    #[allow(clippy::too_many_arguments)]
    pub fn handle_segment_detailed(
        &mut self,
        frame: u64,
        seq: u32,
        syn: bool,
        fin: bool,
        rst: bool,
        payload: &[u8],
        wire_len: u32,
    ) -> SegmentOutcome {
        self.stats.segments += 1;
        let mut outcome = SegmentOutcome::default();
        let data_seq = if syn {
            if self.base.is_none() {
                self.isn = Some(seq);
                self.base = Some(seq.wrapping_add(1));
            }
            seq.wrapping_add(1)
        } else {
            seq
        };
        if rst {
            self.rst.get_or_insert(frame);
            return outcome;
        }
        let base = *self.base.get_or_insert(data_seq);
        let start = self.offset_of(base, data_seq);
        outcome.offset = u64::try_from(start).ok();
        let wire_len = i64::from(wire_len.max(u32::try_from(payload.len()).unwrap_or(u32::MAX)));
        if fin && self.fin.is_none() {
            if let Ok(end) = u64::try_from(start + wire_len) {
                self.fin = Some((end, frame));
                self.cut_at_fin(end, frame, &mut outcome.beyond_fin);
            }
        }
        // This segment's octets past the FIN (on the wire).
        if let Some((end, fin_frame)) = self.fin {
            let end_i = i64::try_from(end).unwrap_or(i64::MAX);
            let first = start.max(end_i);
            if let (Ok(offset), Ok(octets)) = (
                u64::try_from(first),
                u64::try_from(start + wire_len - first),
            ) {
                if octets > 0 {
                    self.stats.octets_after_fin += octets;
                    outcome.beyond_fin.push(BeyondFin {
                        frame,
                        offset,
                        octets,
                        fin_offset: end,
                        fin_frame,
                    });
                }
            }
        }
        if payload.is_empty() {
            return outcome;
        }
        let out = &mut outcome.chunks;
        // Clip to [0, FIN).
        let mut lo = start;
        let mut hi = start + i64::try_from(payload.len()).unwrap_or(i64::MAX);
        if let Some((end, _)) = self.fin {
            hi = hi.min(i64::try_from(end).unwrap_or(i64::MAX));
        }
        let delivered = i64::try_from(self.delivered).unwrap_or(i64::MAX);
        if lo < delivered {
            self.stats.duplicate_octets += u64::try_from(hi.min(delivered) - lo).unwrap_or(0);
            lo = delivered;
        }
        if lo >= hi {
            return outcome;
        }
        // Both non-negative from here on.
        let skip = usize::try_from(lo - start).unwrap_or(0);
        let take = usize::try_from(hi - lo).unwrap_or(0);
        let data = &payload[skip..skip + take];
        let lo = u64::try_from(lo).unwrap_or(0);
        if lo == self.delivered {
            // Deliver up to the first buffered piece; the rest goes through the
            // buffer so that octets already buffered win (first arrival wins).
            let hi = lo + data.len() as u64;
            let cut = match self.pending.keys().next() {
                Some(&k) if k < hi => k,
                _ => hi,
            };
            let (now, later) = data.split_at(usize::try_from(cut - lo).unwrap_or(0));
            if !now.is_empty() {
                self.deliver(out, lo, frame, now.to_vec());
            }
            if !later.is_empty() {
                self.buffer(cut, frame, later);
            }
            self.drain(out);
        } else {
            self.stats.out_of_order_segments += 1;
            self.buffer(lo, frame, data);
        }
        outcome
    }

    /// A FIN at stream offset `end` (in frame `fin_frame`) was just seen: drop
    /// buffered data past it and report that and any data already delivered
    /// past it.
    fn cut_at_fin(&mut self, end: u64, fin_frame: u64, beyond: &mut Vec<BeyondFin>) {
        let mut note = |frame: u64, offset: u64, octets: u64, stats: &mut ReassemblyStats| {
            stats.octets_after_fin += octets;
            beyond.push(BeyondFin {
                frame,
                offset,
                octets,
                fin_offset: end,
                fin_frame,
            });
        };
        if self.delivered > end {
            let frame = self.map.frame_at(end).unwrap_or(fin_frame);
            note(frame, end, self.delivered - end, &mut self.stats);
        }
        let past: Vec<u64> = self
            .pending
            .iter()
            .filter(|(&s, (_, d))| s + d.len() as u64 > end)
            .map(|(&s, _)| s)
            .collect();
        for s in past {
            let Some((frame, mut data)) = self.pending.remove(&s) else {
                continue;
            };
            let first = s.max(end);
            note(frame, first, s + data.len() as u64 - first, &mut self.stats);
            if s < end {
                data.truncate(usize::try_from(end - s).unwrap_or(0));
                self.pending.insert(s, (frame, data));
            }
        }
    }

    /// Convenience wrapper: [`Reassembler::handle_segment`] for a decoded segment.
    pub fn handle(&mut self, frame: u64, seg: &TcpSegment<'_>) -> Vec<Chunk> {
        self.handle_detailed(frame, seg).chunks
    }

    /// Convenience wrapper: [`Reassembler::handle_segment_detailed`] for a
    /// decoded segment.
    pub fn handle_detailed(&mut self, frame: u64, seg: &TcpSegment<'_>) -> SegmentOutcome {
        self.handle_segment_detailed(
            frame,
            seg.seq,
            seg.flags.syn,
            seg.flags.fin,
            seg.flags.rst,
            seg.payload,
            seg.wire_len,
        )
    }

    fn deliver(&mut self, out: &mut Vec<Chunk>, offset: u64, frame: u64, data: Vec<u8>) {
        let len = data.len() as u64;
        self.map.push(offset, len, frame);
        self.delivered = offset + len;
        out.push(Chunk {
            offset,
            frame,
            data,
        });
    }

    /// Deliver buffered data that the delivery point has reached.
    fn drain(&mut self, out: &mut Vec<Chunk>) {
        while let Some(entry) = self.pending.first_entry() {
            let start = *entry.key();
            if start > self.delivered {
                break;
            }
            let (frame, data) = entry.remove();
            let end = start + data.len() as u64;
            if end <= self.delivered {
                continue;
            }
            let skip = usize::try_from(self.delivered - start).unwrap_or(0);
            self.deliver(out, self.delivered, frame, data[skip..].to_vec());
        }
    }

    /// Buffer `[lo, lo + data.len())` out of order, keeping only the parts not
    /// already buffered (first arrival wins).
    fn buffer(&mut self, lo: u64, frame: u64, data: &[u8]) {
        let hi = lo + data.len() as u64;
        // Existing pieces overlapping [lo, hi): the one starting before lo (if it
        // reaches past lo) and all starting inside.
        let mut covered: Vec<(u64, u64)> = Vec::new();
        if let Some((&s, (_, d))) = self.pending.range(..lo).next_back() {
            let e = s + d.len() as u64;
            if e > lo {
                covered.push((s, e));
            }
        }
        for (&s, (_, d)) in self.pending.range(lo..hi) {
            covered.push((s, s + d.len() as u64));
        }
        let mut cursor = lo;
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        for (s, e) in covered {
            if s > cursor {
                pieces.push((cursor, s.min(hi)));
            }
            cursor = cursor.max(e);
            if cursor >= hi {
                break;
            }
        }
        if cursor < hi {
            pieces.push((cursor, hi));
        }
        let kept: u64 = pieces.iter().map(|(s, e)| e - s).sum();
        self.stats.duplicate_octets += (hi - lo) - kept;
        for (s, e) in pieces {
            let a = usize::try_from(s - lo).unwrap_or(0);
            let b = usize::try_from(e - lo).unwrap_or(0);
            self.pending.insert(s, (frame, data[a..b].to_vec()));
        }
    }
}

/// Direction of a segment within its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// From the connection's client (the SYN sender, or the first sender seen) to its
    /// server.
    ClientToServer,
    /// From the server to the client.
    ServerToClient,
}

impl Direction {
    /// Index 0 for client-to-server, 1 for server-to-client.
    pub fn index(self) -> usize {
        match self {
            Direction::ClientToServer => 0,
            Direction::ServerToClient => 1,
        }
    }

    /// The other direction.
    pub fn reverse(self) -> Direction {
        match self {
            Direction::ClientToServer => Direction::ServerToClient,
            Direction::ServerToClient => Direction::ClientToServer,
        }
    }
}

/// One TCP connection: its two endpoints and one reassembler per direction.
#[derive(Debug, Clone)]
pub struct Connection {
    /// Index in [`ConnTable::connections`], in order of first appearance.
    pub id: usize,
    /// The client: the sender of the SYN without ACK, else the sender of the first
    /// segment seen.
    pub client: SocketAddr,
    /// The server.
    pub server: SocketAddr,
    /// Frame number of the connection's first segment.
    pub first_frame: u64,
    /// Frame number of its last segment so far.
    pub last_frame: u64,
    /// Reassemblers, indexed by [`Direction::index`].
    pub streams: [Reassembler; 2],
}

impl Connection {
    /// Source and destination of `dir`.
    pub fn endpoints(&self, dir: Direction) -> (SocketAddr, SocketAddr) {
        match dir {
            Direction::ClientToServer => (self.client, self.server),
            Direction::ServerToClient => (self.server, self.client),
        }
    }

    /// The reassembler of `dir`.
    pub fn stream(&self, dir: Direction) -> &Reassembler {
        &self.streams[dir.index()]
    }

    fn closed(&self) -> bool {
        self.streams.iter().any(|s| s.rst().is_some())
            || self.streams.iter().all(|s| s.fin().is_some())
    }
}

/// What [`ConnTable::handle`] did with a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// The connection's id.
    pub conn: usize,
    /// The segment's direction.
    pub dir: Direction,
    /// Whether this segment opened a new connection entry.
    pub new_connection: bool,
    /// Stream offset of the segment's first data octet in `dir` (see
    /// [`SegmentOutcome::offset`]).
    pub offset: Option<u64>,
    /// Octets that became deliverable in order in `dir`.
    pub chunks: Vec<Chunk>,
    /// Data of `dir` found past its FIN because of this segment (see
    /// [`SegmentOutcome::beyond_fin`]).
    pub beyond_fin: Vec<BeyondFin>,
}

/// All TCP connections of a capture, keyed by their address/port 4-tuple.
///
/// A SYN without ACK on a 4-tuple whose connection has closed (FIN both ways or a
/// RST) and with a new ISN starts a new connection entry (port reuse).
#[derive(Debug, Clone, Default)]
pub struct ConnTable {
    by_tuple: HashMap<(SocketAddr, SocketAddr), usize>,
    conns: Vec<Connection>,
}

impl ConnTable {
    /// An empty table.
    pub fn new() -> ConnTable {
        ConnTable::default()
    }

    /// Connections in order of first appearance.
    pub fn connections(&self) -> &[Connection] {
        &self.conns
    }

    /// Consume the table, returning its connections.
    pub fn into_connections(self) -> Vec<Connection> {
        self.conns
    }

    fn key(a: SocketAddr, b: SocketAddr) -> (SocketAddr, SocketAddr) {
        if a <= b {
            (a, b)
        } else {
            (b, a)
        }
    }

    /// Route a segment captured in frame `frame` to its connection and direction
    /// and reassemble it.
    pub fn handle(&mut self, frame: u64, seg: &TcpSegment<'_>) -> Handled {
        let key = Self::key(seg.src, seg.dst);
        let pure_syn = seg.flags.syn && !seg.flags.ack;
        let existing = self.by_tuple.get(&key).copied().filter(|&id| {
            let c = &self.conns[id];
            let new_isn = c.streams[0].isn().is_some_and(|isn| isn != seg.seq);
            !(pure_syn && c.closed() && new_isn)
        });
        let (id, new_connection) = match existing {
            Some(id) => (id, false),
            None => {
                let id = self.conns.len();
                // The SYN-ACK sender is the server.
                let (client, server) = if seg.flags.syn && seg.flags.ack {
                    (seg.dst, seg.src)
                } else {
                    (seg.src, seg.dst)
                };
                self.conns.push(Connection {
                    id,
                    client,
                    server,
                    first_frame: frame,
                    last_frame: frame,
                    streams: [Reassembler::new(), Reassembler::new()],
                });
                self.by_tuple.insert(key, id);
                (id, true)
            }
        };
        let conn = &mut self.conns[id];
        conn.last_frame = frame;
        let dir = if seg.src == conn.client {
            Direction::ClientToServer
        } else {
            Direction::ServerToClient
        };
        let outcome = conn.streams[dir.index()].handle_detailed(frame, seg);
        Handled {
            conn: id,
            dir,
            new_connection,
            offset: outcome.offset,
            chunks: outcome.chunks,
            beyond_fin: outcome.beyond_fin,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::TcpFlags;

    const ISN: u32 = 1000;

    /// Feed `(frame, seq, payload)` data segments after a SYN with ISN `isn`;
    /// return the reassembler and the concatenated delivered bytes.
    fn run(isn: u32, segs: &[(u64, u32, &[u8])]) -> (Reassembler, Vec<u8>) {
        let mut r = Reassembler::new();
        let mut out = Vec::new();
        assert!(r
            .handle_segment(1, isn, true, false, false, &[], 0)
            .is_empty());
        for &(frame, seq, data) in segs {
            for c in r.handle_segment(frame, seq, false, false, false, data, data.len() as u32) {
                assert_eq!(c.offset, out.len() as u64, "chunks are contiguous");
                out.extend_from_slice(&c.data);
            }
        }
        (r, out)
    }

    #[test]
    fn in_order() {
        let (r, out) = run(ISN, &[(2, ISN + 1, b"abc"), (3, ISN + 4, b"defg")]);
        assert_eq!(out, b"abcdefg");
        assert_eq!(r.delivered(), 7);
        assert_eq!(r.isn(), Some(ISN));
        assert_eq!(r.frame_at(0), Some(2));
        assert_eq!(r.frame_at(2), Some(2));
        assert_eq!(r.frame_at(3), Some(3));
        assert_eq!(r.frame_at(6), Some(3));
        assert_eq!(r.frame_at(7), None);
        assert_eq!(r.gap(), None);
    }

    #[test]
    fn reordering() {
        let (r, out) = run(
            ISN,
            &[
                (2, ISN + 8, b"hij"),
                (3, ISN + 4, b"defg"),
                (4, ISN + 1, b"abc"),
                (5, ISN + 11, b"k"),
            ],
        );
        assert_eq!(out, b"abcdefghijk");
        assert_eq!(r.stats().out_of_order_segments, 2);
        assert_eq!(r.frame_at(0), Some(4));
        assert_eq!(r.frame_at(3), Some(3));
        assert_eq!(r.frame_at(7), Some(2));
        assert_eq!(r.frame_at(10), Some(5));
        assert_eq!(r.frame_map().frames_in(0, 11), vec![4, 3, 2, 5]);
    }

    #[test]
    fn duplicates_dropped() {
        let (r, out) = run(
            ISN,
            &[
                (2, ISN + 1, b"abc"),
                (3, ISN + 1, b"abc"),
                (4, ISN + 4, b"def"),
                (5, ISN + 4, b"def"),
                (6, ISN + 1, b"abc"),
            ],
        );
        assert_eq!(out, b"abcdef");
        assert_eq!(r.stats().duplicate_octets, 9);
        assert_eq!(r.frame_at(4), Some(4));
    }

    #[test]
    fn overlap_trimmed() {
        // Retransmission that repacketizes: "cdefgh" overlaps "abcd" by two octets.
        let (r, out) = run(
            ISN,
            &[
                (2, ISN + 1, b"abcd"),
                (3, ISN + 3, b"cdefgh"),
                (4, ISN + 8, b"hij"),
            ],
        );
        assert_eq!(out, b"abcdefghij");
        assert_eq!(r.frame_at(3), Some(2));
        assert_eq!(r.frame_at(4), Some(3));
        assert_eq!(r.frame_at(7), Some(3));
        assert_eq!(r.frame_at(8), Some(4));
        assert_eq!(r.stats().duplicate_octets, 3);
    }

    #[test]
    fn overlapping_out_of_order_first_arrival_wins() {
        // Buffered "ghij" and "mn", then "fghijklm" overlapping both, then the head.
        let (r, out) = run(
            ISN,
            &[
                (2, ISN + 7, b"ghij"),
                (3, ISN + 13, b"mn"),
                (4, ISN + 6, b"fGHIJklM"),
                (5, ISN + 1, b"abcde"),
            ],
        );
        assert_eq!(out, b"abcdefghijklmn");
        assert_eq!(r.frame_at(5), Some(4));
        assert_eq!(r.frame_at(6), Some(2));
        assert_eq!(r.frame_at(10), Some(4));
        assert_eq!(r.frame_at(12), Some(3));
        assert_eq!(r.frame_map().frames_in(0, 14), vec![5, 4, 2, 4, 3]);
    }

    #[test]
    fn gap_stays_open() {
        let (r, out) = run(ISN, &[(2, ISN + 1, b"ab"), (3, ISN + 5, b"ef")]);
        assert_eq!(out, b"ab");
        assert_eq!(r.gap(), Some((2, 4)));
        assert_eq!(r.gap_frame(), Some(3));
        assert_eq!(r.buffered(), 2);
        assert_eq!(r.frame_at(4), None);
    }

    #[test]
    fn gap_filled_by_overlapping_retransmission() {
        let (r, out) = run(
            ISN,
            &[
                (2, ISN + 1, b"ab"),
                (3, ISN + 5, b"ef"),
                (4, ISN + 2, b"bcdefg"),
            ],
        );
        assert_eq!(out, b"abcdefg");
        assert_eq!(r.gap(), None);
        assert_eq!(r.frame_at(3), Some(4));
        assert_eq!(r.frame_at(4), Some(3));
        assert_eq!(r.frame_at(6), Some(4));
    }

    #[test]
    fn sequence_wraparound() {
        let isn = u32::MAX - 2;
        let (r, out) = run(
            isn,
            &[
                (2, isn.wrapping_add(1), b"ab"),
                (3, isn.wrapping_add(3), b"cd"),
                (4, isn.wrapping_add(5), b"ef"),
            ],
        );
        assert_eq!(out, b"abcdef");
        assert_eq!(r.frame_at(4), Some(4));
    }

    #[test]
    fn old_data_before_syn_is_ignored() {
        let (_, out) = run(ISN, &[(2, ISN - 5, b"zzzzzzab"), (3, ISN + 3, b"cd")]);
        assert_eq!(out, b"abcd");
    }

    #[test]
    fn fin_and_data_after_fin() {
        let mut r = Reassembler::new();
        r.handle_segment(1, ISN, true, false, false, &[], 0);
        let c = r.handle_segment(2, ISN + 1, false, true, false, b"abc", 3);
        assert_eq!(c.len(), 1);
        assert_eq!(r.fin(), Some((3, 2)));
        assert!(r.is_complete());
        assert!(r
            .handle_segment(3, ISN + 4, false, false, false, b"x", 1)
            .is_empty());
        assert_eq!(r.stats().octets_after_fin, 1);
        // FIN ahead of missing data: a gap up to the FIN.
        let mut r = Reassembler::new();
        r.handle_segment(1, ISN, true, false, false, &[], 0);
        r.handle_segment(2, ISN + 4, false, true, false, &[], 0);
        assert_eq!(r.gap(), Some((0, 3)));
        assert!(!r.is_complete());
    }

    /// Data past the FIN is reported with the frame that carried it, whether
    /// it comes after the FIN, was buffered before it, straddles it or was
    /// even delivered before a FIN that lies below it; a pure ACK after the
    /// FIN (sequence number FIN + 1, no data) is not data past the FIN.
    #[test]
    fn data_beyond_fin_is_reported() {
        let beyond = |frame, offset, octets, fin_offset, fin_frame| BeyondFin {
            frame,
            offset,
            octets,
            fin_offset,
            fin_frame,
        };
        // Sent after the FIN.
        let mut r = Reassembler::new();
        r.handle_segment(1, ISN, true, false, false, &[], 0);
        let o = r.handle_segment_detailed(2, ISN + 1, false, true, false, b"abc", 3);
        assert_eq!((o.chunks.len(), o.beyond_fin.len()), (1, 0));
        let o = r.handle_segment_detailed(3, ISN + 4, false, false, false, b"xy", 2);
        assert!(o.chunks.is_empty());
        assert_eq!(o.beyond_fin, vec![beyond(3, 3, 2, 3, 2)]);
        // Straddling it: only the part past the FIN.
        let o = r.handle_segment_detailed(4, ISN + 2, false, false, false, b"bcde", 4);
        assert_eq!(o.beyond_fin, vec![beyond(4, 3, 2, 3, 2)]);
        // A pure ACK after the FIN, and a retransmitted FIN.
        let o = r.handle_segment_detailed(5, ISN + 5, false, false, false, &[], 0);
        assert_eq!(
            (o.offset, o.chunks, o.beyond_fin),
            (Some(4), vec![], vec![])
        );
        let o = r.handle_segment_detailed(6, ISN + 4, false, true, false, &[], 0);
        assert_eq!(
            (o.offset, o.chunks, o.beyond_fin),
            (Some(3), vec![], vec![])
        );
        assert_eq!(r.stats().octets_after_fin, 4);

        // Buffered ahead of a gap before the FIN was seen: not delivered.
        let mut r = Reassembler::new();
        r.handle_segment(1, ISN, true, false, false, &[], 0);
        assert!(r
            .handle_segment(2, ISN + 4, false, false, false, b"x", 1)
            .is_empty());
        let o = r.handle_segment_detailed(3, ISN + 1, false, true, false, b"abc", 3);
        assert_eq!(o.chunks.len(), 1);
        assert_eq!(o.chunks[0].data, b"abc");
        assert_eq!(o.beyond_fin, vec![beyond(2, 3, 1, 3, 3)]);
        assert_eq!((r.delivered(), r.buffered(), r.gap()), (3, 0, None));
        assert!(r.is_complete());

        // A buffered piece straddling a FIN that comes alone: trimmed.
        let mut r = Reassembler::new();
        r.handle_segment(1, ISN, true, false, false, &[], 0);
        r.handle_segment(2, ISN + 3, false, false, false, b"cdef", 4);
        let o = r.handle_segment_detailed(3, ISN + 5, false, true, false, &[], 0);
        assert_eq!(o.beyond_fin, vec![beyond(2, 4, 2, 4, 3)]);
        let c = r.handle_segment(4, ISN + 1, false, false, false, b"ab", 2);
        let got: Vec<u8> = c.iter().flat_map(|c| c.data.clone()).collect();
        assert_eq!(got, b"abcd");
        assert!(r.is_complete());

        // Delivered before a FIN that lies below it.
        let mut r = Reassembler::new();
        r.handle_segment(1, ISN, true, false, false, &[], 0);
        r.handle_segment(2, ISN + 1, false, false, false, b"abcdef", 6);
        let o = r.handle_segment_detailed(3, ISN + 4, false, true, false, &[], 0);
        assert_eq!(o.beyond_fin, vec![beyond(2, 3, 3, 3, 3)]);
        assert_eq!(r.stats().octets_after_fin, 3);
    }

    #[test]
    fn rst_recorded() {
        let mut r = Reassembler::new();
        r.handle_segment(1, ISN, true, false, false, &[], 0);
        r.handle_segment(2, ISN + 1, false, false, true, &[], 0);
        assert_eq!(r.rst(), Some(2));
    }

    #[test]
    fn no_syn_starts_at_first_segment() {
        let mut r = Reassembler::new();
        let c = r.handle_segment(7, 5000, false, false, false, b"xyz", 3);
        assert_eq!(c[0].offset, 0);
        assert!(!r.saw_syn());
        let c = r.handle_segment(8, 5003, false, false, false, b"w", 1);
        assert_eq!(c[0].offset, 3);
    }

    #[test]
    fn snapped_segment_leaves_gap() {
        let mut r = Reassembler::new();
        r.handle_segment(1, ISN, true, false, false, &[], 0);
        // 10 octets on the wire, 4 captured.
        r.handle_segment(2, ISN + 1, false, false, false, b"abcd", 10);
        r.handle_segment(3, ISN + 11, false, false, false, b"k", 1);
        assert_eq!(r.delivered(), 4);
        assert_eq!(r.gap(), Some((4, 10)));
    }

    #[test]
    fn retransmitted_syn_keeps_isn() {
        let mut r = Reassembler::new();
        r.handle_segment(1, ISN, true, false, false, &[], 0);
        r.handle_segment(2, ISN, true, false, false, &[], 0);
        let c = r.handle_segment(3, ISN + 1, false, false, false, b"a", 1);
        assert_eq!(c[0].offset, 0);
        assert_eq!(r.isn(), Some(ISN));
    }

    fn seg<'a>(
        src: &str,
        dst: &str,
        seq: u32,
        flags: TcpFlags,
        payload: &'a [u8],
    ) -> TcpSegment<'a> {
        TcpSegment {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            seq,
            flags,
            payload,
            wire_len: payload.len() as u32,
        }
    }

    #[test]
    fn conn_table_directions_and_reuse() {
        let syn = TcpFlags {
            syn: true,
            ..Default::default()
        };
        let synack = TcpFlags {
            syn: true,
            ack: true,
            ..Default::default()
        };
        let ack = TcpFlags {
            ack: true,
            ..Default::default()
        };
        let fin = TcpFlags {
            ack: true,
            fin: true,
            ..Default::default()
        };
        let (c, s) = ("10.0.0.2:5000", "10.0.0.1:7174");
        let mut t = ConnTable::new();
        let h = t.handle(1, &seg(c, s, 100, syn, b""));
        assert!(h.new_connection);
        assert_eq!(h.dir, Direction::ClientToServer);
        let h = t.handle(2, &seg(s, c, 900, synack, b""));
        assert!(!h.new_connection);
        assert_eq!(h.dir, Direction::ServerToClient);
        let h = t.handle(3, &seg(c, s, 101, ack, b"req"));
        assert_eq!(h.chunks[0].data, b"req");
        let h = t.handle(4, &seg(s, c, 901, ack, b"rep"));
        assert_eq!(h.chunks[0].offset, 0);
        t.handle(5, &seg(c, s, 104, fin, b""));
        t.handle(6, &seg(s, c, 904, fin, b""));
        // Same 4-tuple, new ISN after close: a new connection.
        let h = t.handle(7, &seg(c, s, 7777, syn, b""));
        assert!(h.new_connection);
        assert_eq!(h.conn, 1);
        let h = t.handle(8, &seg(s, c, 1, synack, b""));
        assert_eq!((h.conn, h.dir), (1, Direction::ServerToClient));
        assert_eq!(t.connections().len(), 2);
        assert_eq!(
            t.connections()[0].stream(Direction::ClientToServer).fin(),
            Some((3, 5))
        );
        // A connection first seen at its SYN-ACK: the SYN-ACK sender is the server.
        let mut t = ConnTable::new();
        let h = t.handle(1, &seg(s, c, 900, synack, b""));
        assert_eq!(h.dir, Direction::ServerToClient);
        assert_eq!(t.connections()[0].client, c.parse().unwrap());
    }

    /// Random segmentations of a stream, shuffled, with duplicates and
    /// re-segmented retransmissions: the delivered bytes are always the stream, and
    /// each octet's frame is the first frame that carried it (or a later one only
    /// when the first arrived ahead of a gap and a later in-order one covered it).
    #[test]
    fn randomized_reassembly() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for round in 0..300 {
            let len = 1 + rnd(3000) as usize;
            let stream: Vec<u8> = (0..len).map(|i| (i * 7 + round) as u8).collect();
            let isn = rnd(u64::from(u32::MAX)) as u32;
            let mut segs: Vec<(usize, usize)> = Vec::new();
            let mut at = 0;
            while at < len {
                let n = (1 + rnd(200) as usize).min(len - at);
                segs.push((at, n));
                at += n;
            }
            // Extra re-segmented retransmissions.
            for _ in 0..rnd(10) {
                let a = rnd(len as u64) as usize;
                let n = (1 + rnd(400) as usize).min(len - a);
                segs.push((a, n));
            }
            // Shuffle.
            for i in (1..segs.len()).rev() {
                let j = rnd(i as u64 + 1) as usize;
                segs.swap(i, j);
            }
            let mut r = Reassembler::new();
            r.handle_segment(1, isn, true, false, false, &[], 0);
            let mut out = Vec::new();
            for (k, &(a, n)) in segs.iter().enumerate() {
                let seq = isn.wrapping_add(1).wrapping_add(a as u32);
                let frame = 2 + k as u64;
                for c in
                    r.handle_segment(frame, seq, false, false, false, &stream[a..a + n], n as u32)
                {
                    assert_eq!(c.offset, out.len() as u64);
                    let (sa, sn) = segs[(c.frame - 2) as usize];
                    assert!(
                        sa as u64 <= c.offset && c.offset + c.data.len() as u64 <= (sa + sn) as u64
                    );
                    out.extend_from_slice(&c.data);
                }
            }
            assert_eq!(out, stream, "round {round}");
            assert_eq!(r.gap(), None);
            for off in (0..len).step_by(37) {
                let f = r.frame_at(off as u64).unwrap();
                let (sa, sn) = segs[(f - 2) as usize];
                assert!(sa <= off && off < sa + sn);
            }
        }
    }
}
