//! Per-4-tuple transmit tracking (see "One FPDU per TCP segment" in the [module
//! docs](super)): the smoltcp `Device` wrapper that shows every frame to the
//! [`SegTracker`], and the Ethernet/IPv4/TCP parsing it needs.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::Ipv4Addr;

use rustc_hash::FxHashMap;
use smoltcp::phy::{Device, DeviceCapabilities, RxToken, TxToken};
use smoltcp::time::Instant;
use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Packet, TcpPacket,
};

use super::smoltcp_glue::{LinkDevice, LinkRxToken, LinkTxToken};
use super::DEFAULT_REMOTE_MSS;
use crate::link::Link;

/// What the device wrapper learned about one TCP connection from its frames.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Track {
    /// One past the highest sequence number sent (SYN and FIN count).
    pub(super) snd_max: Option<u32>,
    /// The MSS option of the peer's SYN (536 when absent).
    pub(super) remote_mss: Option<u16>,
    /// Our SYN carried a window scale option (RFC 7323 2.2).
    pub(super) wscale_sent: bool,
    /// The window scale option of the peer's SYN (shift count), if it had one.
    pub(super) peer_wscale: Option<u8>,
    /// Right edge of the peer's receive window: acknowledgment number plus the scaled
    /// window of the latest ACK received (sequence space), once one arrived.
    pub(super) wnd_edge: Option<u32>,
    /// The acknowledgment number of that ACK.
    pub(super) wnd_ack: Option<u32>,
}

impl Track {
    /// Octets of sequence space the peer's window, as of the last pure ACK taken
    /// (`SegTracker::on_rx_ack`), still allows beyond `snd_max`; `None` before one.
    pub(super) fn window_room(&self) -> Option<u32> {
        let room = self.wnd_edge?.wrapping_sub(self.snd_max?);
        // An edge behind what was sent (a shrunk window) leaves no room.
        Some(if (room as i32) < 0 { 0 } else { room })
    }
}

#[derive(Debug, Default)]
pub(crate) struct SegTracker {
    pub(super) map: FxHashMap<u64, Track>,
    pub(super) listen_ports: Vec<u16>,
    /// Senders of the ARP frames received since the last poll (`crate::transport::neighbor`).
    pub(super) arp_seen: Vec<(Ipv4Addr, [u8; 6])>,
}

pub(super) fn tuple_key(local_port: u16, remote: Ipv4Addr, remote_port: u16) -> u64 {
    (u64::from(u32::from(remote)) << 32) | (u64::from(remote_port) << 16) | u64::from(local_port)
}

/// The TCP fields the tracker needs, from an Ethernet/IPv4/TCP frame.
pub(super) struct SegInfo {
    pub(super) src: Ipv4Addr,
    pub(super) dst: Ipv4Addr,
    pub(super) src_port: u16,
    pub(super) dst_port: u16,
    pub(super) seq: u32,
    pub(super) seg_len: u32,
    pub(super) syn: bool,
    pub(super) ack: bool,
    pub(super) mss: Option<u16>,
    /// Window scale option (shift count), SYNs only.
    pub(super) wscale: Option<u8>,
    pub(super) ack_no: u32,
    pub(super) window: u16,
}

/// Byte positions in the frames the tracker reads: Ethernet II, then IPv4, then TCP
/// (RFC 894, RFC 791 3.1, RFC 9293 3.1), named as smoltcp's `wire` names them. The
/// parsers use smoltcp's [`EthernetFrame`], [`Ipv4Packet`] and [`TcpPacket`]; the hot
/// paths ([`quick_tx`], [`carries_data`], the flags peek of `SegTracker::on_rx`) read
/// these positions directly.
pub(super) mod field {
    use core::ops::Range;

    /// EtherType of the Ethernet II header.
    pub const ETHERTYPE: Range<usize> = 12..14;
    /// First byte of the IPv4 header (the Ethernet II header is 14 bytes).
    pub const IPV4: usize = 14;
    /// IPv4 Version (high nibble) and IHL (low nibble, in 32-bit words).
    pub const IPV4_VER_IHL: usize = IPV4;
    /// IPv4 Total Length.
    pub const IPV4_LENGTH: Range<usize> = IPV4 + 2..IPV4 + 4;
    /// IPv4 Protocol.
    pub const IPV4_PROTOCOL: usize = IPV4 + 9;
    /// IPv4 Destination Address.
    pub const IPV4_DST_ADDR: Range<usize> = IPV4 + 16..IPV4 + 20;
    /// First byte of the TCP header behind an IPv4 header without options (IHL 5),
    /// the only IPv4 header smoltcp sends.
    pub const TCP: usize = IPV4 + 20;

    /// TCP Source Port, from the start of the TCP header.
    pub const TCP_SRC_PORT: Range<usize> = 0..2;
    /// TCP Destination Port.
    pub const TCP_DST_PORT: Range<usize> = 2..4;
    /// TCP Sequence Number.
    pub const TCP_SEQ_NUM: Range<usize> = 4..8;
    /// TCP Data Offset (high nibble, in 32-bit words).
    pub const TCP_DATA_OFF: usize = 12;
    /// TCP flags (CWR ECE URG ACK PSH RST SYN FIN).
    pub const TCP_FLAGS: usize = 13;

    /// The fixed-position headers of a frame without IPv4 options, through the TCP
    /// flags: what [`super::quick_tx`] reads (48 bytes).
    pub const FIXED_HEADERS: usize = TCP + TCP_FLAGS + 1;
}

/// EtherType IPv4 (0x0800) as it stands on the wire.
const ETHERTYPE_IPV4: [u8; 2] = 0x0800u16.to_be_bytes();
/// EtherType ARP (0x0806) as it stands on the wire.
const ETHERTYPE_ARP: [u8; 2] = 0x0806u16.to_be_bytes();
/// IPv4 Version 4 with IHL 5: an IPv4 header without options.
const IPV4_NO_OPTIONS: u8 = 0x45;
/// IPv4 Protocol number of TCP.
const IP_PROTOCOL_TCP: u8 = 6;

/// TCP SYN flag.
pub(super) const TCP_SYN: u8 = 0x02;
/// TCP FIN flag.
pub(super) const TCP_FIN: u8 = 0x01;
/// TCP ACK flag.
pub(super) const TCP_ACK: u8 = 0x10;

/// TCP option kinds the tracker reads (RFC 9293 3.2, RFC 7323 2.2).
const OPT_END: u8 = 0;
const OPT_NOP: u8 = 1;
const OPT_MSS: u8 = 2;
const OPT_WS: u8 = 3;

/// A TCP header field's position in a frame without IPv4 options.
#[inline]
fn in_tcp(range: core::ops::Range<usize>) -> core::ops::Range<usize> {
    field::TCP + range.start..field::TCP + range.end
}

/// Big-endian u16 at the start of `range` of the fixed headers.
#[inline]
fn be16_in(h: &[u8; field::FIXED_HEADERS], range: core::ops::Range<usize>) -> u16 {
    u16::from_be_bytes([h[range.start], h[range.start + 1]])
}

/// Parses the TCP header of an Ethernet II / IPv4 frame; `None` for anything else.
/// With `verify`, the IPv4 header and TCP checksums must be right (received frames may be
/// corrupted; smoltcp drops those, and so must the tracker).
pub(super) fn parse_seg(frame: &[u8], verify: bool) -> Option<SegInfo> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    // Checks IHL >= 5 and that the header and Total Length fit; `payload` ends at
    // Total Length.
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.version() != 4 || ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    // Checks that the Data Offset is at least 5 words and fits.
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    if verify
        && !(ip.verify_checksum()
            && tcp.verify_checksum(&IpAddress::Ipv4(src), &IpAddress::Ipv4(dst)))
    {
        return None;
    }
    let (syn, fin) = (tcp.syn(), tcp.fin());
    let mut mss = None;
    let mut wscale = None;
    if syn {
        let mut opts = tcp.options();
        while let Some(&kind) = opts.first() {
            match kind {
                OPT_END => break,
                OPT_NOP => opts = &opts[1..],
                _ => {
                    let len = usize::from(*opts.get(1)?);
                    if len < 2 || len > opts.len() {
                        break;
                    }
                    if kind == OPT_MSS && len == 4 {
                        mss = Some(u16::from_be_bytes([opts[2], opts[3]]));
                    }
                    if kind == OPT_WS && len == 3 {
                        // RFC 7323 2.3: a shift over 14 is taken as 14.
                        wscale = Some(opts[2].min(14));
                    }
                    opts = &opts[len..];
                }
            }
        }
    }
    Some(SegInfo {
        src,
        dst,
        src_port: tcp.src_port(),
        dst_port: tcp.dst_port(),
        seq: tcp.seq_number().0 as u32,
        seg_len: u32::try_from(tcp.payload().len()).ok()? + u32::from(syn) + u32::from(fin),
        syn,
        ack: tcp.ack(),
        mss,
        wscale,
        ack_no: tcp.ack_number().0 as u32,
        window: tcp.window_len(),
    })
}

/// Whether an Ethernet / IPv4 (no options) / TCP frame has payload. Windows are taken
/// from pure ACKs only (`SegTracker::on_rx`): a receiving side skips the work for every
/// data segment, and the window edge of an older ACK is never beyond the current one
/// (windows do not shrink, RFC 9293 3.8.6), so missing one only writes fewer FPDUs ahead.
/// (With traffic both ways most windows ride on data segments, and few FPDUs are written
/// ahead.)
pub(super) fn carries_data(frame: &[u8]) -> bool {
    match (
        frame.get(field::IPV4_VER_IHL),
        frame.get(field::IPV4_LENGTH),
        frame.get(field::TCP + field::TCP_DATA_OFF),
    ) {
        (Some(&IPV4_NO_OPTIONS), Some(&[hi, lo]), Some(&off)) => {
            usize::from(u16::from_be_bytes([hi, lo])) > 20 + usize::from(off >> 4) * 4
        }
        _ => false,
    }
}

/// The sending side's key, sequence number and length in sequence space of a segment
/// without SYN, read at the fixed positions ([`field`]) of an Ethernet II / IPv4 frame
/// without IP options (all that smoltcp sends); `None` for anything else (the caller
/// falls back to [`parse_seg`]). It runs for every frame sent.
#[inline]
pub(super) fn quick_tx(frame: &[u8]) -> Option<(u64, u32, u32)> {
    use field::*;
    let h: &[u8; FIXED_HEADERS] = frame.get(..FIXED_HEADERS)?.try_into().ok()?;
    let flags = h[TCP + TCP_FLAGS];
    if h[ETHERTYPE] != ETHERTYPE_IPV4
        || h[IPV4_VER_IHL] != IPV4_NO_OPTIONS
        || h[IPV4_PROTOCOL] != IP_PROTOCOL_TCP
        || flags & TCP_SYN != 0
    {
        return None;
    }
    let total = u32::from(be16_in(h, IPV4_LENGTH));
    let doff = u32::from(h[TCP + TCP_DATA_OFF] >> 4) * 4;
    let payload = total.checked_sub(20 + doff)?;
    let dst: [u8; 4] = h[IPV4_DST_ADDR].try_into().ok()?;
    let key = tuple_key(
        be16_in(h, in_tcp(TCP_SRC_PORT)),
        Ipv4Addr::from(dst),
        be16_in(h, in_tcp(TCP_DST_PORT)),
    );
    let seq = u32::from_be_bytes(h[in_tcp(TCP_SEQ_NUM)].try_into().ok()?);
    Some((key, seq, payload + u32::from(flags & TCP_FIN != 0)))
}

impl SegTracker {
    pub(super) fn on_tx(&mut self, frame: &[u8]) {
        // The common case (every data segment): no SYN, so the entry exists or the
        // segment is not ours to track.
        if let Some((key, seq, seg_len)) = quick_tx(frame) {
            if let Some(e) = self.map.get_mut(&key) {
                let end = seq.wrapping_add(seg_len);
                if e.snd_max.is_none_or(|m| (end.wrapping_sub(m) as i32) > 0) {
                    e.snd_max = Some(end);
                }
            }
            return;
        }
        let Some(seg) = parse_seg(frame, false) else {
            return;
        };
        let k = tuple_key(seg.src_port, seg.dst, seg.dst_port);
        let entry = if seg.syn {
            self.map.entry(k).or_default()
        } else {
            match self.map.get_mut(&k) {
                Some(e) => e,
                None => return,
            }
        };
        if seg.syn {
            entry.wscale_sent = seg.wscale.is_some();
            entry.wnd_edge = None;
            entry.wnd_ack = None;
        }
        let end = seg.seq.wrapping_add(seg.seg_len);
        entry.snd_max = match entry.snd_max {
            // A SYN (re)starts the sequence space: a new connection on a reused 4-tuple.
            Some(m) if !seg.syn && (end.wrapping_sub(m) as i32) <= 0 => Some(m),
            _ => Some(end),
        };
    }

    pub(super) fn on_rx(&mut self, frame: &[u8]) {
        if frame.get(field::ETHERTYPE) == Some(&ETHERTYPE_ARP) {
            self.arp_seen
                .extend(crate::transport::neighbor::arp_sender(frame));
            return;
        }
        // Look at the flags before verifying anything: SYNs (their options are kept) and
        // pure ACKs (their window decides how many FPDUs `Conn::tx` writes ahead) are
        // verified, as smoltcp verifies them: a window from a frame smoltcp dropped would
        // be ahead of smoltcp's, and every FPDU written ahead into it would straddle two
        // segments (softiwarp/tests/engine/batching.rs). Data segments are not looked at.
        let Some(&flags) = frame
            .get(field::IPV4_VER_IHL)
            .map(|b| usize::from(b & 0x0f) * 4)
            .and_then(|ihl| frame.get(field::IPV4 + ihl + field::TCP_FLAGS))
        else {
            return;
        };
        if flags & TCP_SYN == 0 {
            if flags & TCP_ACK != 0 && !carries_data(frame) {
                self.on_rx_ack(frame);
            }
            return;
        }
        let Some(seg) = parse_seg(frame, true) else {
            return;
        };
        let k = tuple_key(seg.dst_port, seg.src, seg.src_port);
        let mss = Some(seg.mss.unwrap_or(DEFAULT_REMOTE_MSS as u16));
        let entry = if seg.ack {
            self.map.get_mut(&k)
        } else if self.listen_ports.contains(&seg.dst_port) {
            Some(self.map.entry(k).or_default())
        } else {
            None
        };
        if let Some(e) = entry {
            e.remote_mss = mss;
            e.peer_wscale = seg.wscale;
            e.wnd_edge = None;
            e.wnd_ack = None;
        }
    }

    /// Takes the peer's window from a pure ACK of a known connection, as smoltcp does
    /// (RFC 9293 3.10.7.4): checksums right, acknowledging nothing beyond what was sent,
    /// and not older than the ACK the current window came from (a reordered old ACK,
    /// which smoltcp ignores).
    pub(super) fn on_rx_ack(&mut self, frame: &[u8]) {
        let Some(seg) = parse_seg(frame, true) else {
            return;
        };
        let k = tuple_key(seg.dst_port, seg.src, seg.src_port);
        let Some(e) = self.map.get_mut(&k) else {
            return;
        };
        let Some(snd_max) = e.snd_max else { return };
        if (seg.ack_no.wrapping_sub(snd_max) as i32) > 0
            || e.wnd_ack
                .is_some_and(|last| (seg.ack_no.wrapping_sub(last) as i32) < 0)
        {
            return;
        }
        e.wnd_ack = Some(seg.ack_no);
        let shift = match (e.wscale_sent, e.peer_wscale) {
            (true, Some(s)) => s,
            _ => 0,
        };
        e.wnd_edge = Some(seg.ack_no.wrapping_add(u32::from(seg.window) << shift));
    }

    pub(super) fn get(&self, key: u64) -> Track {
        self.map.get(&key).copied().unwrap_or_default()
    }
}

/// Most SYNs held back by the [`SynGate`]; beyond, a SYN is dropped (its sender
/// retransmits it, RFC 9293 3.8.1).
pub(super) const SYN_GATE_MAX: usize = 1024;

/// SYNs to a listening port beyond the sockets in LISTEN there, held for the next poll
/// instead of being refused. A listener keeps only a few sockets in LISTEN
/// ([`super::MAX_ARMED`], so that smoltcp's scans of the socket set stay cheap) and
/// re-arms once a poll; smoltcp answers a SYN that finds no socket in LISTEN with a
/// RST, so a burst of connections (64 at once from one `iwperf client --qps 64`) would
/// be refused. The gate counts the SYNs each poll lets through per port (its budget,
/// set before the poll from the sockets in LISTEN) and defers the rest, oldest first,
/// to the polls after the re-arm. A port without budget entry (no listener, or one
/// whose backlog is full) is not gated: smoltcp refuses as before.
#[derive(Debug, Default)]
pub(super) struct SynGate {
    /// (port, SYNs this poll may still let through).
    budget: Vec<(u16, usize)>,
    /// Held SYN frames with their destination port, oldest first.
    deferred: VecDeque<(u16, Vec<u8>)>,
    /// SYNs dropped because [`SYN_GATE_MAX`] were held.
    pub(super) dropped: u64,
    /// SYNs held so far.
    pub(super) held: u64,
}

impl SynGate {
    /// Sets this poll's budgets: `(port, sockets in LISTEN)` for every listener with
    /// room in its backlog.
    pub(super) fn set_budget(&mut self, budget: impl Iterator<Item = (u16, usize)>) {
        self.budget.clear();
        self.budget.extend(budget);
    }

    /// True if held SYNs wait and one of them could go now: its port has budget, or
    /// is not gated any more (its listener closed or its backlog filled: smoltcp then
    /// refuses it, as it would have at once).
    pub(super) fn ready(&self) -> bool {
        self.deferred.iter().any(|(port, _)| self.may_go(*port))
    }

    fn may_go(&self, port: u16) -> bool {
        self.budget_of(port).is_none_or(|b| b > 0)
    }

    fn budget_of(&self, port: u16) -> Option<usize> {
        self.budget
            .iter()
            .find(|(p, _)| *p == port)
            .map(|(_, b)| *b)
    }

    /// Takes one SYN of `port`'s budget; false if it has none left. Ports without an
    /// entry are not gated (true).
    fn take(&mut self, port: u16) -> bool {
        match self.budget.iter_mut().find(|(p, _)| *p == port) {
            None => true,
            Some((_, 0)) => false,
            Some((_, b)) => {
                *b -= 1;
                true
            }
        }
    }

    /// The destination port of a SYN without ACK (a connection request) in `frame`.
    fn syn_port(frame: &[u8]) -> Option<u16> {
        // Every received frame comes here: look at the TCP flags first (Ethernet type
        // IPv4, protocol TCP, SYN set and ACK clear), parse only a connection request.
        if frame.get(12..14) != Some(&[0x08, 0x00]) || frame.get(23) != Some(&6) {
            return None;
        }
        let ihl = usize::from(frame.get(14)? & 0x0f) * 4;
        if frame.get(14 + ihl + 13)? & 0x12 != 0x02 {
            return None;
        }
        let seg = parse_seg(frame, false)?;
        (seg.syn && !seg.ack).then_some(seg.dst_port)
    }

    /// Decides on a received frame: false to pass it on, true if it was held (or
    /// dropped beyond [`SYN_GATE_MAX`]).
    fn hold(&mut self, frame: &[u8]) -> bool {
        if self.budget.is_empty() {
            return false;
        }
        let Some(port) = Self::syn_port(frame) else {
            return false;
        };
        if self.budget_of(port).is_none() {
            return false;
        }
        // Held SYNs of this port go first: a new one waits behind them.
        let queued = self.deferred.iter().any(|(p, _)| *p == port);
        if !queued && self.take(port) {
            return false;
        }
        if self.deferred.len() >= SYN_GATE_MAX {
            self.dropped += 1;
        } else {
            self.deferred.push_back((port, frame.to_vec()));
            self.held += 1;
        }
        true
    }

    /// The oldest held SYN that may go now (taking one of its port's budget).
    fn release(&mut self) -> Option<Vec<u8>> {
        let i = self
            .deferred
            .iter()
            .position(|(port, _)| self.may_go(*port))?;
        let (port, frame) = self.deferred.remove(i)?;
        self.take(port);
        Some(frame)
    }
}

/// The smoltcp device: a [`LinkDevice`] whose tokens show each frame to the tracker,
/// behind the [`SynGate`].
pub(super) struct TrackedDevice<L> {
    pub(super) inner: LinkDevice<L>,
    pub(super) tracker: RefCell<SegTracker>,
    pub(super) gate: SynGate,
}

/// A received frame: read from the link just now, or a SYN the gate held.
pub(super) enum RxFrame<'a> {
    Link(LinkRxToken<'a>),
    Held(Vec<u8>),
}

pub(super) struct TrackedRx<'a> {
    pub(super) inner: RxFrame<'a>,
    pub(super) tracker: &'a RefCell<SegTracker>,
}

pub(super) struct TrackedTx<'a, L> {
    pub(super) inner: LinkTxToken<'a, L>,
    pub(super) tracker: &'a RefCell<SegTracker>,
}

impl RxToken for TrackedRx<'_> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        let tracker = self.tracker;
        match self.inner {
            RxFrame::Link(rx) => rx.consume(|frame| {
                tracker.borrow_mut().on_rx(frame);
                f(frame)
            }),
            RxFrame::Held(frame) => {
                tracker.borrow_mut().on_rx(&frame);
                f(&frame)
            }
        }
    }
}

impl<L: Link> TxToken for TrackedTx<'_, L> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let tracker = self.tracker;
        self.inner.consume(len, |frame| {
            let r = f(frame);
            tracker.borrow_mut().on_tx(frame);
            r
        })
    }

    fn set_meta(&mut self, meta: smoltcp::phy::PacketMeta) {
        self.inner.set_meta(meta);
    }
}

impl<L: Link> Device for TrackedDevice<L> {
    type RxToken<'a>
        = TrackedRx<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = TrackedTx<'a, L>
    where
        Self: 'a;

    fn receive(&mut self, timestamp: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let TrackedDevice {
            inner,
            tracker,
            gate,
        } = self;
        if gate.ready() {
            // A held SYN first; it needs a transmit token (the link is up) to answer.
            if let Some(tx) = inner.transmit(timestamp) {
                if let Some(frame) = gate.release() {
                    return Some((
                        TrackedRx {
                            inner: RxFrame::Held(frame),
                            tracker,
                        },
                        TrackedTx { inner: tx, tracker },
                    ));
                }
            }
            return None;
        }
        loop {
            let n = inner.fill_rx()?;
            if gate.hold(inner.rx_frame(n)) {
                continue;
            }
            let (rx, tx) = inner.tokens(n);
            return Some((
                TrackedRx {
                    inner: RxFrame::Link(rx),
                    tracker,
                },
                TrackedTx { inner: tx, tracker },
            ));
        }
    }

    fn transmit(&mut self, timestamp: Instant) -> Option<Self::TxToken<'_>> {
        let tracker = &self.tracker;
        let tx = self.inner.transmit(timestamp)?;
        Some(TrackedTx { inner: tx, tracker })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        self.inner.capabilities()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_syn_gate_holds_beyond_the_budget_and_releases_oldest_first() {
        let syn = |sport| frame(sport, 7174, 1, 0x02, Some(1460), &[]);
        let ack = frame(40_000, 7174, 1, 0x10, None, b"data");
        let mut g = SynGate::default();
        g.set_budget([(7174, 2)].into_iter());
        assert!(!g.hold(&syn(1)) && !g.hold(&syn(2)), "two pass");
        assert!(g.hold(&syn(3)) && g.hold(&syn(4)), "then held");
        assert!(!g.hold(&ack), "not a SYN: never held");
        assert!(
            !g.hold(&frame(5, 9999, 1, 0x02, None, &[])),
            "no listener: not gated"
        );
        assert!(!g.ready(), "no budget left");
        assert_eq!(g.held, 2);
        // The next poll: budget 1, and a new SYN waits behind the held ones.
        g.set_budget([(7174, 1)].into_iter());
        assert!(g.hold(&syn(5)));
        assert!(g.ready());
        assert_eq!(g.release(), Some(syn(3)));
        assert!(!g.ready());
        assert_eq!(g.release(), None);
        // The listener went away (no entry): the rest go at once, for smoltcp to refuse.
        g.set_budget(std::iter::empty());
        assert_eq!(
            (g.release(), g.release(), g.release()),
            (Some(syn(4)), Some(syn(5)), None)
        );
    }

    #[test]
    fn the_syn_gate_drops_beyond_its_bound() {
        let mut g = SynGate::default();
        g.set_budget([(7174, 0)].into_iter());
        for i in 0..SYN_GATE_MAX + 3 {
            assert!(g.hold(&frame(i as u16, 7174, 1, 0x02, None, &[])));
        }
        assert_eq!((g.held, g.dropped), (SYN_GATE_MAX as u64, 3));
    }

    /// An Ethernet/IPv4/TCP frame from 10.0.0.1:`sport` to 10.0.0.2:`dport` with
    /// correct checksums, an MSS option when `mss` is given, and `payload`.
    fn frame(
        sport: u16,
        dport: u16,
        seq: u32,
        flags: u8,
        mss: Option<u16>,
        payload: &[u8],
    ) -> Vec<u8> {
        let opts = if mss.is_some() { 4 } else { 0 };
        let tcp_len = 20 + opts + payload.len();
        let mut f = vec![0u8; 14 + 20 + tcp_len];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        {
            let mut ip = Ipv4Packet::new_unchecked(&mut f[14..]);
            ip.set_version(4);
            ip.set_header_len(20);
            ip.set_total_len((20 + tcp_len) as u16);
            ip.set_hop_limit(64);
            ip.set_next_header(smoltcp::wire::IpProtocol::Tcp);
            ip.set_src_addr(Ipv4Addr::new(10, 0, 0, 1));
            ip.set_dst_addr(Ipv4Addr::new(10, 0, 0, 2));
            ip.fill_checksum();
        }
        let t = &mut f[34..];
        t[0..2].copy_from_slice(&sport.to_be_bytes());
        t[2..4].copy_from_slice(&dport.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[12] = (((20 + opts) / 4) as u8) << 4;
        t[13] = flags;
        if let Some(m) = mss {
            t[20..24].copy_from_slice(&[2, 4, (m >> 8) as u8, m as u8]);
        }
        t[20 + opts..].copy_from_slice(payload);
        let mut tcp = TcpPacket::new_unchecked(&mut f[34..]);
        tcp.fill_checksum(
            &IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 1)),
            &IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 2)),
        );
        f
    }

    #[test]
    fn segments_are_parsed_and_checked() {
        let syn = frame(5000, 80, 100, TCP_SYN, Some(1460), &[]);
        let s = parse_seg(&syn, true).unwrap();
        assert!(s.syn && !s.ack);
        assert_eq!(
            (s.src_port, s.dst_port, s.seq, s.seg_len, s.mss),
            (5000, 80, 100, 1, Some(1460))
        );
        let data = frame(5000, 80, 101, TCP_ACK | TCP_FIN, None, &[7; 100]);
        let s = parse_seg(&data, true).unwrap();
        assert_eq!((s.seg_len, s.mss, s.ack), (101, None, true));
        let mut bad = data.clone();
        bad[60] ^= 1;
        assert!(parse_seg(&bad, true).is_none(), "TCP checksum");
        assert!(parse_seg(&bad, false).is_some());
        let mut arp = data.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(parse_seg(&arp, false).is_none());
        for cut in [0, 13, 20, 40, 53] {
            assert!(parse_seg(&syn[..cut], false).is_none(), "{cut}");
        }
    }

    #[test]
    fn tracker_keeps_the_highest_sequence_sent_and_the_peer_mss() {
        let mut t = SegTracker::default();
        let key = tuple_key(5000, Ipv4Addr::new(10, 0, 0, 2), 80);
        // Data of an unknown connection is ignored; a SYN registers it.
        t.on_tx(&frame(5000, 80, 10, TCP_ACK, None, &[0; 5]));
        assert!(t.map.is_empty());
        t.on_tx(&frame(5000, 80, 100, TCP_SYN, Some(1460), &[]));
        assert_eq!(t.get(key).snd_max, Some(101));
        t.on_tx(&frame(5000, 80, 101, TCP_ACK, None, &[0; 1000]));
        assert_eq!(t.get(key).snd_max, Some(1101));
        // A retransmission does not move it back.
        t.on_tx(&frame(5000, 80, 101, TCP_ACK, None, &[0; 500]));
        assert_eq!(t.get(key).snd_max, Some(1101));
        // Wrapping sequence numbers.
        t.on_tx(&frame(5000, 80, u32::MAX - 10, TCP_SYN, None, &[]));
        t.on_tx(&frame(5000, 80, u32::MAX - 9, TCP_ACK, None, &[0; 20]));
        assert_eq!(t.get(key).snd_max, Some(10));
        // The peer's SYN-ACK (it comes from 10.0.0.2:80 in a real exchange; here the
        // frame builder's addresses are fixed, so look at the mirrored key).
        let mirrored = tuple_key(80, Ipv4Addr::new(10, 0, 0, 1), 5000);
        t.on_rx(&frame(5000, 80, 7, TCP_SYN | TCP_ACK, Some(536), &[]));
        assert_eq!(t.get(mirrored).remote_mss, None, "unknown connection");
        t.listen_ports.push(80);
        t.on_rx(&frame(5000, 80, 7, TCP_SYN, None, &[]));
        assert_eq!(t.get(mirrored).remote_mss, Some(536), "default MSS");
        t.on_rx(&frame(5000, 80, 7, TCP_SYN, Some(9000), &[]));
        assert_eq!(t.get(mirrored).remote_mss, Some(9000));
    }

    /// `frame` with the acknowledgment number and window set (checksums not redone:
    /// `mirrored` in the test below redoes them).
    fn with_ack(mut f: Vec<u8>, ack: u32, window: u16) -> Vec<u8> {
        f[42..46].copy_from_slice(&ack.to_be_bytes());
        f[48..50].copy_from_slice(&window.to_be_bytes());
        f
    }

    /// A SYN from 10.0.0.1:`sport` with the MSS 1460 and window scale `shift` options.
    fn syn_with_wscale(sport: u16, dport: u16, seq: u32, flags: u8, shift: u8) -> Vec<u8> {
        let mut f = frame(sport, dport, seq, flags, Some(1460), &[0; 4]);
        // Turn the 4 payload bytes into options: NOP, window scale (kind 3, length 3).
        f[34 + 12] = (28 / 4) << 4;
        f[34 + 24..34 + 28].copy_from_slice(&[1, 3, 3, shift]);
        TcpPacket::new_unchecked(&mut f[34..]).fill_checksum(
            &IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 1)),
            &IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 2)),
        );
        f
    }

    #[test]
    fn the_quick_transmit_parse_agrees_with_the_full_one() {
        for (flags, payload) in [
            (TCP_ACK, 0usize),
            (TCP_ACK, 1),
            (TCP_ACK, 1460),
            (TCP_ACK | TCP_FIN, 0),
            (TCP_ACK | TCP_FIN, 100),
        ] {
            let f = frame(5000, 80, 0xffff_fff0, flags, None, &vec![7; payload]);
            let full = parse_seg(&f, true).unwrap();
            let quick = quick_tx(&f).unwrap();
            assert_eq!(
                quick,
                (
                    tuple_key(full.src_port, full.dst, full.dst_port),
                    full.seq,
                    full.seg_len
                ),
                "flags {flags:#x}, {payload} bytes"
            );
            assert_eq!(carries_data(&f), payload > 0);
        }
        // SYNs, short frames and other protocols take the full parse.
        assert!(quick_tx(&frame(5000, 80, 1, TCP_SYN, Some(1460), &[])).is_none());
        let f = frame(5000, 80, 1, TCP_ACK, None, &[1; 10]);
        assert!(quick_tx(&f[..47]).is_none());
        let mut udp = f.clone();
        udp[23] = 17;
        assert!(quick_tx(&udp).is_none());
    }

    #[test]
    fn the_tracker_takes_the_peer_window_from_pure_acks() {
        let mut t = SegTracker::default();
        let key = tuple_key(5000, Ipv4Addr::new(10, 0, 0, 2), 80);
        let mirrored = |f: &[u8]| {
            // The builder's frames go 10.0.0.1:sport -> 10.0.0.2:dport; a frame from the
            // peer swaps the addresses.
            let mut f = f.to_vec();
            f[26..30].copy_from_slice(&[10, 0, 0, 2]);
            f[30..34].copy_from_slice(&[10, 0, 0, 1]);
            Ipv4Packet::new_unchecked(&mut f[14..]).fill_checksum();
            TcpPacket::new_unchecked(&mut f[34..]).fill_checksum(
                &IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 2)),
                &IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 1)),
            );
            f
        };
        // Our SYN and the peer's SYN-ACK, both with window scaling: shift 3 applies.
        t.on_tx(&syn_with_wscale(5000, 80, 99, TCP_SYN, 7));
        t.on_rx(&mirrored(&syn_with_wscale(
            80,
            5000,
            7,
            TCP_SYN | TCP_ACK,
            3,
        )));
        assert_eq!(
            t.get(key).window_room(),
            None,
            "no window before the first ACK"
        );
        t.on_tx(&frame(5000, 80, 100, TCP_ACK, None, &[0; 1000]));
        // Pure ACK of the first 500 bytes, window 100 (x 8).
        t.on_rx(&mirrored(&with_ack(
            frame(80, 5000, 8, TCP_ACK, None, &[]),
            600,
            100,
        )));
        assert_eq!(t.get(key).wnd_edge, Some(600 + 800));
        assert_eq!(t.get(key).window_room(), Some(1400 - 1100));
        // An ACK carrying data is not looked at; an ACK of more than was sent neither.
        t.on_rx(&mirrored(&with_ack(
            frame(80, 5000, 8, TCP_ACK, None, &[1; 10]),
            1100,
            1000,
        )));
        t.on_rx(&mirrored(&with_ack(
            frame(80, 5000, 8, TCP_ACK, None, &[]),
            1101,
            1000,
        )));
        assert_eq!(t.get(key).wnd_edge, Some(1400));
        // A pure ACK smoltcp would drop (bad checksum) or ignore (older than the last
        // one) is not looked at either.
        let mut bad = mirrored(&with_ack(
            frame(80, 5000, 8, TCP_ACK, None, &[]),
            1100,
            1000,
        ));
        bad[34 + 16] ^= 0xff;
        t.on_rx(&bad);
        t.on_rx(&mirrored(&with_ack(
            frame(80, 5000, 8, TCP_ACK, None, &[]),
            599,
            1000,
        )));
        assert_eq!(t.get(key).wnd_edge, Some(1400));
        // A window behind what was sent leaves no room.
        t.on_tx(&frame(5000, 80, 1100, TCP_ACK, None, &[0; 400]));
        assert_eq!(t.get(key).window_room(), Some(0));
        // Without the option in the peer's SYN the window is not scaled.
        let key2 = tuple_key(5001, Ipv4Addr::new(10, 0, 0, 2), 80);
        t.on_tx(&syn_with_wscale(5001, 80, 0, TCP_SYN, 7));
        t.on_rx(&mirrored(&frame(
            80,
            5001,
            7,
            TCP_SYN | TCP_ACK,
            Some(1460),
            &[],
        )));
        t.on_tx(&frame(5001, 80, 1, TCP_ACK, None, &[0; 10]));
        t.on_rx(&mirrored(&with_ack(
            frame(80, 5001, 8, TCP_ACK, None, &[]),
            11,
            100,
        )));
        assert_eq!(t.get(key2).window_room(), Some(100));
    }
}
