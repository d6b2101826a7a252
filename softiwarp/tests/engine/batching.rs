//! Adversarial tests of the stack writing several full-sized FPDUs per connection round
//! ("One FPDU per TCP segment" in `softiwarp::transport`, `StackStats::fpdus_batched`): the
//! peer's window as the segment tracker takes it against the window smoltcp really sends
//! by, under tampered and lost frames, tiny, closed and unscaled windows, odd MTUs with
//! and without Markers, several connections, sequence-number wraparound, and a close or
//! a Terminate behind FPDUs written ahead. Every test checks that each ULPDU arrives
//! intact, in order, exactly once, and classifies the first transmission of every data
//! segment against the FPDUs that `iwdump` dissects from the capture: none may carry
//! bytes of two FPDUs.

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::support::stack::{addr, links, Flow, Pair, Side};
use smoltcp::time::Duration;
use softiwarp::link::{
    Direction, FaultConfig, Faults, Link, LinkError, LinkEvent, MemoryLink, Pcap, PcapClock,
};
use softiwarp::transport::mpa_conn::CallError;
use softiwarp::transport::smoltcp_glue::TcpConfig;
use softiwarp::transport::stream::StreamEnd;
use softiwarp::transport::{
    CloseMode, ConnError, ConnEvent, ConnId, EmitUlpdu, Established, MpaParams, StackConfig,
    StackStats, Ulp,
};

const PORT: u16 = 7180;

/// What a [`Tamper`] hook does with a received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Hand it on (the hook may have changed it).
    Pass,
    /// Lose it.
    Drop,
    /// Hand it on right after the next frame that passes (the two swap places).
    Hold,
}

type Hook = Box<dyn FnMut(&mut [u8]) -> Verdict + Send>;

/// A link wrapper whose hook sees every received frame before the stack (and its
/// segment tracker) does.
struct Tamper<L> {
    inner: L,
    hook: Option<Hook>,
    held: Option<Vec<u8>>,
    ready: VecDeque<Vec<u8>>,
    /// Frames sent.
    sent: u64,
}

impl<L: Link> Link for Tamper<L> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn poll_event(&mut self) -> Option<LinkEvent> {
        self.inner.poll_event()
    }
    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        let frame = loop {
            if let Some(f) = self.ready.pop_front() {
                break f;
            }
            let Some(n) = self.inner.recv(buf)? else {
                return Ok(None);
            };
            let mut f = buf[..n].to_vec();
            match self.hook.as_mut().map_or(Verdict::Pass, |h| h(&mut f)) {
                Verdict::Pass => {
                    self.ready.push_back(f);
                    self.ready.extend(self.held.take());
                }
                Verdict::Drop => {}
                Verdict::Hold => self.ready.extend(self.held.replace(f)),
            }
        };
        buf[..frame.len()].copy_from_slice(&frame);
        Ok(Some(frame.len()))
    }
    fn mtu(&self) -> usize {
        self.inner.mtu()
    }
    fn state(&self) -> LinkEvent {
        self.inner.state()
    }
    fn send(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        self.sent += 1;
        self.inner.send(frame)
    }
    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.inner.poll_fd()
    }
}

/// Each side's link: captured above the tampering, so the capture holds every frame the
/// side sent and every frame it received as its stack saw it; faults below.
type Wire = Pcap<Tamper<Faults<MemoryLink>>, Vec<u8>>;

fn wire(link: MemoryLink, fault_seed: u64) -> Wire {
    let faults = Faults::new(link, fault_seed, FaultConfig::none(), FaultConfig::none()).unwrap();
    let tamper = Tamper {
        inner: faults,
        hook: None,
        held: None,
        ready: VecDeque::new(),
        sent: 0,
    };
    let mut us = 0u64;
    let clock: PcapClock = Box::new(move || {
        us += 1;
        std::time::Duration::from_micros(1_700_000_000_000_000 + us)
    });
    Pcap::with_writer(tamper, Vec::new(), clock).unwrap()
}

type WirePair = Pair<Side<Wire>, Side<Wire>>;

/// Offsets in an Ethernet II / IPv4 (no options) / TCP frame.
const TCP_AT: usize = 34;
const FLAGS_AT: usize = TCP_AT + 13;
const WINDOW_AT: usize = TCP_AT + 14;
const URGENT_AT: usize = TCP_AT + 18;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

/// The TCP flags and payload length of an Ethernet / IPv4 / TCP frame.
fn tcp_of(f: &[u8]) -> Option<(u8, usize)> {
    if f.len() < TCP_AT + 20 || f[12..14] != [8, 0] || f[14] != 0x45 || f[23] != 6 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let doff = usize::from(f[TCP_AT + 12] >> 4) * 4;
    Some((f[FLAGS_AT], total.checked_sub(20 + doff)?))
}

fn is_pure_ack(f: &[u8]) -> bool {
    tcp_of(f) == Some((ACK, 0))
}

/// A hook that applies `what` to every `nth` pure ACK.
fn every_nth_pure_ack(nth: u64, what: impl Fn(&mut [u8]) -> Verdict + Send + 'static) -> Hook {
    let mut n = 0u64;
    Box::new(move |f| {
        if is_pure_ack(f) {
            n += 1;
            if n.is_multiple_of(nth) {
                return what(f);
            }
        }
        Verdict::Pass
    })
}

/// The TCP options of a SYN frame, as (kind, offset in the frame, length) triples.
fn syn_options(f: &[u8]) -> Vec<(u8, usize, usize)> {
    let mut out = Vec::new();
    let end = TCP_AT + usize::from(f[TCP_AT + 12] >> 4) * 4;
    let mut at = TCP_AT + 20;
    while at < end {
        match f[at] {
            0 => break,
            1 => at += 1,
            kind => {
                let len = usize::from(f[at + 1]).max(2);
                out.push((kind, at, len));
                at += len;
            }
        }
    }
    out
}

/// How the first transmissions of one side's data segments lie on its FPDUs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Layout {
    /// FPDUs the dissector found.
    fpdus: u64,
    /// Segments carrying exactly one FPDU.
    whole: usize,
    /// Segments carrying a part of one FPDU.
    part: usize,
    /// Segments carrying bytes of two FPDUs.
    straddling: usize,
    /// Segments starting below the highest byte sent before (retransmissions, which may
    /// cross FPDU boundaries).
    resent: usize,
}

/// The [`Layout`] of everything `host` sent in `pcap`, summed over its connections.
/// A data segment is a first transmission when it starts at or beyond every byte its
/// connection sent before.
fn layout(pcap: &[u8], host: Ipv4Addr) -> Layout {
    type Key = (SocketAddr, SocketAddr);
    let report = iwdump::dissect(pcap).unwrap();
    let mut extents: HashMap<Key, Vec<(u64, u64)>> = HashMap::new();
    let mut sum = Layout::default();
    for (rec, _) in report.fpdu_records().filter(|(r, _)| r.src.ip() == host) {
        sum.fpdus += 1;
        let list = extents.entry((rec.src, rec.dst)).or_default();
        list.push((rec.offset, rec.offset + rec.wire_len));
    }
    let mut isn: HashMap<Key, u32> = HashMap::new();
    let mut high: HashMap<Key, u64> = HashMap::new();
    for frame in iwdump::capture::Capture::new(pcap).unwrap() {
        let frame = frame.unwrap();
        let Ok(Some(seg)) = iwdump::packet::decode_tcp(&frame) else {
            continue;
        };
        let key = (seg.src, seg.dst);
        if seg.flags.syn {
            isn.insert(key, seg.seq);
            continue;
        }
        let (Some(&base), Some(list)) = (isn.get(&key), extents.get(&key)) else {
            continue;
        };
        if seg.wire_len == 0 {
            continue;
        }
        let start = u64::from(seg.seq.wrapping_sub(base).wrapping_sub(1));
        let end = start + u64::from(seg.wire_len);
        let h = high.entry(key).or_default();
        let first = start >= *h;
        *h = (*h).max(end);
        if !first {
            sum.resent += 1;
        } else if end > list[0].0 {
            // (Segments before the first FPDU carry the MPA Request or Reply.)
            let i = list.partition_point(|&(_, e)| e <= start);
            match list.get(i) {
                Some(&(s, e)) if (s, e) == (start, end) => sum.whole += 1,
                Some(&(s, e)) if s <= start && end <= e => sum.part += 1,
                _ => sum.straddling += 1,
            }
        }
    }
    sum
}

/// MPA settings: CRC, and Markers in what each side receives.
fn params(markers: bool, crc: bool) -> MpaParams {
    MpaParams {
        private_data: Vec::new(),
        ird: 1,
        ord: 1,
        settings: Some(mpa::negotiate::LocalSettings {
            markers_rx: markers,
            crc: if crc {
                mpa::negotiate::CrcPolicy::Wanted
            } else {
                mpa::negotiate::CrcPolicy::IfPeerAsks
            },
            ..Default::default()
        }),
    }
}

/// A pair on a memory link of `mtu`, B listening on [`PORT`].
fn wire_pair(
    mtu: usize,
    fault_seed: u64,
    tweak_a: impl FnOnce(&mut StackConfig),
    tweak_b: impl FnOnce(&mut StackConfig),
) -> WirePair {
    let (la, lb) = links(mtu);
    let a = Side::new(wire(la, fault_seed), 1, tweak_a);
    let mut p = Pair::new(a, Side::new(wire(lb, fault_seed + 1), 2, tweak_b));
    p.b.stack.listen(PORT, 8, None).unwrap();
    p
}

/// B accepts the oldest request; steps until A's `ca` is established.
fn accept_until_established(p: &mut WirePair, ca: ConnId) -> (ConnId, StreamEnd) {
    assert!(p.run_until(Duration::from_secs(10), |p| !p.b.requests.is_empty()));
    let (cb, eb) = p.b.accept_next(b"", 1, 1).unwrap().unwrap();
    assert!(p.run_until(Duration::from_secs(10), |p| {
        eb.established().is_some()
            && matches!(p.a.events_of(ca).first(), Some(ConnEvent::Established(_)))
    }));
    (cb, eb)
}

/// Connects A to B; both stream ends once established.
fn connect(p: &mut WirePair, params: MpaParams) -> (StreamEnd, StreamEnd) {
    let now = p.now;
    let (ca, ea) = p.a.connect(2, PORT, params, now).unwrap();
    let (_, eb) = accept_until_established(p, ca);
    (ea, eb)
}

/// Both captures.
fn pcaps(p: WirePair) -> (Vec<u8>, Vec<u8>) {
    let Pair { a, b, .. } = p;
    let take = |l: Wire| l.into_parts().1.unwrap();
    (take(a.stack.into_link()), take(b.stack.into_link()))
}

/// TCP settings with a receive buffer (the advertised window) of `bytes`.
fn rx_buffer(bytes: usize) -> TcpConfig {
    TcpConfig {
        rx_buffer: bytes,
        ..Default::default()
    }
}

/// One transfer between A and B.
struct Scenario {
    mtu: usize,
    a_tcp: TcpConfig,
    b_tcp: TcpConfig,
    /// smoltcp's random seed on A (it picks A's ISN).
    a_seed: Option<u64>,
    /// Each stream end's receive queue in bytes: it bounds what the stack reads, so
    /// the TCP window closes while the reader is slow.
    rx_queue: usize,
    markers: bool,
    crc: bool,
    /// ULPDUs from A to B, and whether every one is MULPDU-sized (else a third are).
    ab: (u64, bool),
    /// ULPDUs from B to A.
    ba: (u64, bool),
    /// The readers take one ULPDU per step for `slow` steps, then everything for `fast`
    /// steps, and so on.
    slow: u64,
    fast: u64,
    /// Every `.0` steps the readers stop for `.1` of virtual time.
    stall: Option<(u64, Duration)>,
    hook_a: Option<Hook>,
    hook_b: Option<Hook>,
    /// Faults on both directions of B's link once the connections are up.
    faults: Option<(u64, FaultConfig)>,
    conns: usize,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            mtu: 1500,
            a_tcp: TcpConfig::default(),
            b_tcp: TcpConfig::default(),
            a_seed: None,
            rx_queue: 16 * 1024,
            markers: false,
            crc: true,
            ab: (1000, true),
            ba: (0, true),
            slow: 25,
            fast: 25,
            stall: None,
            hook_a: None,
            hook_b: None,
            faults: None,
            conns: 1,
        }
    }
}

struct Outcome {
    a: Layout,
    b: Layout,
    sa: StackStats,
    sb: StackStats,
    pcap_a: Vec<u8>,
    /// Frames A sent.
    frames_a: u64,
    /// Faults applied on B's link (both directions).
    faults: [softiwarp::link::FaultStats; 2],
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "A ({} frames) {:?} written ahead {} | B {:?} written ahead {}",
            self.frames_a, self.a, self.sa.fpdus_batched, self.b, self.sb.fpdus_batched
        )
    }
}

impl Outcome {
    fn straddling(&self) -> usize {
        self.a.straddling + self.b.straddling
    }
}

fn flow(seed: u64, end: &StreamEnd, (count, fixed): (u64, bool)) -> Flow {
    let mulpdu = end.established().unwrap().mulpdu;
    if fixed {
        Flow::ddp_fixed(seed, mulpdu, count)
    } else {
        Flow::ddp(seed, mulpdu, count)
    }
}

/// Runs `sc`; panics unless every ULPDU arrived intact, in order, once, and the FPDU
/// counts of the captures match.
fn run(sc: Scenario) -> Outcome {
    let (a_tcp, b_tcp, a_seed, markers) = (sc.a_tcp, sc.b_tcp, sc.a_seed, sc.markers);
    let fault_seed = sc.faults.map_or(1, |f| f.0);
    let mut p = wire_pair(
        sc.mtu,
        fault_seed,
        |c| {
            c.tcp = a_tcp;
            if let Some(s) = a_seed {
                c.interface.random_seed = s;
            }
        },
        |c| {
            c.tcp = b_tcp;
            c.mpa.settings.markers_rx = markers;
        },
    );
    p.a.stream_cfg.rx_queue_bytes = sc.rx_queue;
    p.b.stream_cfg.rx_queue_bytes = sc.rx_queue;
    p.b.stack.link_mut().inner_mut().hook = sc.hook_b;
    let ends: Vec<(StreamEnd, StreamEnd)> = (0..sc.conns)
        .map(|_| connect(&mut p, params(sc.markers, sc.crc)))
        .collect();
    p.a.stack.link_mut().inner_mut().hook = sc.hook_a;
    if let Some((_, f)) = sc.faults {
        let faults = &mut p.b.stack.link_mut().inner_mut().inner;
        faults.set_config(Direction::Tx, f).unwrap();
        faults.set_config(Direction::Rx, f).unwrap();
    }
    let mut flows: Vec<(Flow, Flow)> = (0..)
        .zip(&ends)
        .map(|(i, (ea, eb))| (flow(100 + i, ea, sc.ab), flow(200 + i, eb, sc.ba)))
        .collect();
    let mut step = 0u64;
    let mut stall_until = None;
    let ok = p.run_until(Duration::from_secs(900), |p| {
        step += 1;
        for ((ea, eb), (ab, ba)) in ends.iter().zip(flows.iter_mut()) {
            ab.push(ea);
            ba.push(eb);
        }
        if let Some((every, d)) = sc.stall {
            if step.is_multiple_of(every) {
                stall_until = Some(p.now + d);
            }
        }
        if stall_until.is_some_and(|t| p.now < t) {
            return false;
        }
        let n = if step % (sc.slow + sc.fast) < sc.slow {
            1
        } else {
            usize::MAX
        };
        let mut done = true;
        for ((ea, eb), (ab, ba)) in ends.iter().zip(flows.iter_mut()) {
            ab.pull_n(eb, n);
            ba.pull_n(ea, n);
            done &= ab.done() && ba.done();
        }
        done
    });
    let counts: Vec<_> = flows
        .iter()
        .map(|(ab, ba)| (ab.received, ba.received))
        .collect();
    assert!(ok, "not done at {}: {counts:?}", p.now);
    let (sa, sb) = (p.a.stack.stats(), p.b.stack.stats());
    let faults = &p.b.stack.link().inner().inner;
    let faults = [faults.stats(Direction::Tx), faults.stats(Direction::Rx)];
    p.run_for(Duration::from_millis(300));
    let frames_a = p.a.stack.link().inner().sent;
    let (pcap_a, pcap_b) = pcaps(p);
    let a = layout(&pcap_a, addr(1));
    let b = layout(&pcap_b, addr(2));
    let conns = sc.conns as u64;
    assert_eq!((a.fpdus, b.fpdus), (sc.ab.0 * conns, sc.ba.0 * conns));
    Outcome {
        a,
        b,
        sa,
        sb,
        pcap_a,
        frames_a,
        faults,
    }
}

/// Runs `sc` as `name`: no first transmission from either side may carry bytes of two
/// FPDUs, and A must have written at least `min_ahead` FPDUs ahead.
fn run_checked(name: &str, sc: Scenario, min_ahead: u64) -> Outcome {
    let o = run(sc);
    println!("{name}: {o:?}");
    assert_eq!(o.straddling(), 0, "{name}: {o:?}");
    assert!(o.sa.fpdus_batched >= min_ahead, "{name}: {o:?}");
    o
}

/// A pure ACK whose checksum is wrong is dropped by smoltcp, so its window must not count
/// for the tracker either: one that does (its window field corrupted to 0xffff, i.e. an
/// edge about 512 KiB ahead with the default window scale 3) lets a batch run past the
/// window smoltcp sends by; smoltcp cuts a segment at the real edge, sends zero-window
/// probes, and every later segment of the batch carries the end of one FPDU and the
/// start of the next. Even an intact window in a frame smoltcp dropped (a corrupted
/// urgent pointer) is newer than what smoltcp knows. The control drops the same ACKs.
#[test]
fn a_pure_ack_that_fails_its_checksum_does_not_widen_the_window() {
    let corrupt_window = |f: &mut [u8]| {
        f[WINDOW_AT] = 0xff;
        f[WINDOW_AT + 1] = 0xff;
        Verdict::Pass
    };
    let corrupt_urgent = |f: &mut [u8]| {
        f[URGENT_AT] ^= 0xff;
        Verdict::Pass
    };
    let cases: [(&str, Hook); 4] = [
        (
            "dropped (control)",
            every_nth_pure_ack(3, |_| Verdict::Drop),
        ),
        (
            "window of every 10th",
            every_nth_pure_ack(10, corrupt_window),
        ),
        ("window of every 3rd", every_nth_pure_ack(3, corrupt_window)),
        (
            "urgent pointer of every 3rd",
            every_nth_pure_ack(3, corrupt_urgent),
        ),
    ];
    let mut results = Vec::new();
    for (name, hook) in cases {
        let o = run(Scenario {
            // A transmit ring of whole segments (what `TcpConfig::socket_for_mss` makes of
            // the default): no FPDU wraps around its end, so every round writes ahead.
            a_tcp: TcpConfig {
                tx_buffer: 179 * 1460,
                ..Default::default()
            },
            ab: (2000, true),
            hook_a: Some(hook),
            ..Default::default()
        });
        assert!(o.sa.fpdus_batched > 1000, "{name}: {o:?}");
        results.push((name, o.a.straddling, o));
    }
    println!("{results:#?}");
    assert!(
        results.iter().all(|r| r.1 == 0),
        "segments with bytes of two FPDUs: {:?}",
        results.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>()
    );
}

/// Drops, duplicates, reorders and corrupts frames both ways on B's link while both
/// sides send MULPDU-sized ULPDUs (and, for one seed, ULPDUs of any size): everything
/// arrives, and the first transmissions still carry one FPDU at most.
#[test]
fn faults_on_the_link_keep_ulpdus_intact_and_first_transmissions_whole() {
    let f = FaultConfig {
        drop: 0.02,
        duplicate: 0.02,
        reorder: 0.05,
        corrupt: 0.02,
        corrupt_from: 14,
    };
    for (seed, fixed) in [(1u64, true), (2, true), (3, true), (4, false)] {
        let sc = Scenario {
            faults: Some((seed, f)),
            ab: (600, fixed),
            ba: (600, fixed),
            ..Default::default()
        };
        let o = run_checked(&format!("seed {seed} fixed {fixed}"), sc, 0);
        println!("faults {:?}", o.faults);
        for s in o.faults {
            assert!(
                s.dropped > 0 && s.duplicated > 0 && s.reordered > 0 && s.corrupted > 0,
                "{s:?}"
            );
        }
        assert!(o.a.resent + o.b.resent > 0, "{o:?}");
        assert!(o.sa.fpdus_batched + o.sb.fpdus_batched > 100, "{o:?}");
        assert_eq!(o.sa.crc_errors + o.sb.crc_errors, 0);
    }
}

/// Pure ACKs arrive out of order (every 2nd or 3rd swapped with the next frame, so the
/// tracker also takes windows of ACKs older than smoltcp's), one way and with a little
/// traffic back.
#[test]
fn reordered_pure_acks_keep_one_fpdu_per_segment() {
    for k in [2u64, 3] {
        for ba in [0u64, 200] {
            let sc = Scenario {
                ab: (1500, true),
                ba: (ba, false),
                slow: 10,
                fast: 5,
                hook_a: Some(every_nth_pure_ack(k, |_| Verdict::Hold)),
                ..Default::default()
            };
            run_checked(&format!("every {k}, {ba} back"), sc, 500);
        }
    }
}

/// Receive buffers below two segments, of odd sizes, of exactly three segments, just over
/// 64 KiB (window scale 1) and of 1 MiB (scale 5), one way and both ways.
#[test]
fn tiny_odd_and_scaled_windows() {
    for rx in [3000usize, 4096, 1460 * 2 + 1, 1460 * 3, 70_000, 1 << 20] {
        let tcp = rx_buffer(rx);
        for ba in [0u64, 400] {
            let sc = Scenario {
                a_tcp: tcp,
                b_tcp: tcp,
                ab: (600, true),
                ba: (ba, true),
                ..Default::default()
            };
            let scaled = rx > 64 * 1024 && ba == 0;
            run_checked(
                &format!("rx {rx} back {ba}"),
                sc,
                if scaled { 300 } else { 0 },
            );
        }
    }
}

/// The frames of `pcap` that satisfy `pick`.
fn frames(pcap: &[u8], pick: impl Fn(&[u8]) -> bool) -> Vec<Vec<u8>> {
    let capture = iwdump::capture::Capture::new(pcap).unwrap();
    let data = capture.map(|f| f.unwrap().data.to_vec());
    data.filter(|f| pick(f)).collect()
}

/// The first frame of `pcap` that satisfies `pick`.
fn first_frame(pcap: &[u8], pick: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    frames(pcap, pick).swap_remove(0)
}

/// Pure ACKs from B to A with a zero window in `pcap`.
fn zero_windows(pcap: &[u8]) -> usize {
    let from_b = |f: &[u8]| f[26..30] == addr(2).octets();
    let zero = |f: &[u8]| f[WINDOW_AT..WINDOW_AT + 2] == [0, 0];
    frames(pcap, |f| is_pure_ack(f) && from_b(f) && zero(f)).len()
}

/// The reader stops for three virtual seconds every 200 steps: B's window closes (zero
/// window ACKs, smoltcp's zero-window probes) and reopens with FPDUs written ahead.
#[test]
fn zero_windows_then_resume() {
    for rx in [4096usize, 64 * 1024, 256 * 1024] {
        let tcp = rx_buffer(rx);
        let sc = Scenario {
            a_tcp: tcp,
            b_tcp: tcp,
            ab: (800, true),
            stall: Some((200, Duration::from_secs(3))),
            ..Default::default()
        };
        let min_ahead = if rx >= 64 * 1024 { 300 } else { 0 };
        let o = run_checked(&format!("rx {rx}"), sc, min_ahead);
        let zero = zero_windows(&o.pcap_a);
        assert!(zero > 0, "the window never closed");
    }
}

/// MTUs whose EMSS (MTU - 40) is not a multiple of 4 leave no FPDU of exactly EMSS bytes,
/// so nothing is written ahead; at MTU 1504 and 576 it is. Markers and CRC on and off,
/// MULPDU-sized ULPDUs one way and ULPDUs of any size back.
#[test]
fn odd_mtus_markers_and_no_crc() {
    for mtu in [1499usize, 1501, 1502, 577, 1504, 576] {
        for (markers, crc) in [(false, true), (true, true), (false, false), (true, false)] {
            let sc = Scenario {
                mtu,
                markers,
                crc,
                ab: (400, true),
                ba: (400, false),
                ..Default::default()
            };
            let o = run_checked(&format!("mtu {mtu} markers {markers} crc {crc}"), sc, 0);
            let batched = o.sa.fpdus_batched + o.sb.fpdus_batched;
            if (mtu - 40) % 4 != 0 {
                assert_eq!(batched, 0, "mtu {mtu}: {o:?}");
            } else if !markers {
                assert!(batched > 100, "mtu {mtu}: {o:?}");
            }
        }
    }
}

/// Four connections on one stack, MULPDU-sized one way and any size back.
#[test]
fn four_connections_on_one_stack() {
    let sc = Scenario {
        conns: 4,
        ab: (400, true),
        ba: (150, false),
        ..Default::default()
    };
    let o = run_checked("four connections", sc, 400);
    assert_eq!((o.a.fpdus, o.b.fpdus), (1600, 600));
}

/// A's smoltcp, seeded with 771, picks an ISN 852,126 octets below 2^32: the sequence
/// numbers wrap around after about 580 FPDUs, while FPDUs are written ahead.
#[test]
fn sequence_numbers_wrap_while_fpdus_are_written_ahead() {
    let sc = Scenario {
        a_seed: Some(771),
        ab: (1500, true),
        ..Default::default()
    };
    let o = run_checked("ISN near 2^32", sc, 700);
    let syn = first_frame(&o.pcap_a, |f| tcp_of(f).is_some_and(|t| t.0 == SYN));
    let isn = u32::from_be_bytes(syn[TCP_AT + 4..TCP_AT + 8].try_into().unwrap());
    println!("ISN {isn}");
    assert!(isn > u32::MAX - 1_000_000, "ISN {isn} is not near the wrap");
    assert!(o.sa.stream_tx_bytes > u64::from(u32::MAX - isn) + 500_000);
}

/// Removes the window scale option from a SYN without ACK (A's SYN as B receives it), so
/// that B, with a 1 MiB buffer, neither scales nor is scaled: A's tracker must then
/// take B's windows unscaled.
fn strip_window_scale(f: &mut [u8]) -> Verdict {
    let Some((flags, _)) = tcp_of(f) else {
        return Verdict::Pass;
    };
    if flags & (SYN | ACK) != SYN {
        return Verdict::Pass;
    }
    for (kind, at, len) in syn_options(f) {
        if kind == 3 {
            f[at..at + len].fill(1);
        }
    }
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let src = Ipv4Addr::new(f[26], f[27], f[28], f[29]);
    let dst = Ipv4Addr::new(f[30], f[31], f[32], f[33]);
    let mut seg = smoltcp::wire::TcpPacket::new_unchecked(&mut f[TCP_AT..14 + total]);
    seg.fill_checksum(&src.into(), &dst.into());
    Verdict::Pass
}

/// B (1 MiB buffer) never saw A's window scale option: neither side scales, B's windows
/// are capped at 65,535 and A must take them as they are.
#[test]
fn a_peer_without_window_scaling() {
    let tcp = rx_buffer(1 << 20);
    let sc = Scenario {
        a_tcp: tcp,
        b_tcp: tcp,
        ab: (1500, true),
        rx_queue: 100 * 1024,
        hook_b: Some(Box::new(strip_window_scale)),
        ..Default::default()
    };
    let o = run_checked("no window scaling", sc, 700);
    // B's SYN-ACK carries an MSS option but no window scale option.
    let syn_ack = first_frame(&o.pcap_a, |f| tcp_of(f).is_some_and(|t| t.0 == SYN | ACK));
    let kinds: Vec<u8> = syn_options(&syn_ack).iter().map(|o| o.0).collect();
    assert!(kinds.contains(&2) && !kinds.contains(&3), "{kinds:?}");
}

// ---------------------------------------------------------------------------------------
// A Terminate, a graceful and an abortive close behind FPDUs written ahead.

/// ULPDU number `i` of `len` bytes: 0x80 (never a Terminate's first byte), `i`, then a
/// pattern of `i`.
fn numbered_ulpdu(i: u64, len: usize) -> Vec<u8> {
    let mut u: Vec<u8> = (0..len).map(|j| (j as u64 * 31 + i) as u8).collect();
    u[0] = 0x80;
    u[1..9].copy_from_slice(&i.to_le_bytes());
    u
}

/// A Terminate ULPDU (RFC 5040 4.8): untagged DDP header (L = 1, DV = RV = 1, opcode 7)
/// on QN 2 with MSN 1, then Layer DDP (1), EType 0, error code 0, no headers.
fn terminate() -> Vec<u8> {
    let mut t = vec![0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1];
    t.extend_from_slice(&[0, 0, 0, 0, 0x10, 0, 0, 0]);
    t
}

/// An upper that sends `count` MULPDU-sized numbered ULPDUs, then a Terminate.
struct WriteThenTerminate {
    count: u64,
    sent: Arc<AtomicU64>,
    terminated: bool,
}

impl Ulp for WriteThenTerminate {
    fn on_established(&mut self, _: &Established) {}
    fn rx_room(&mut self) -> usize {
        usize::MAX
    }
    fn on_ulpdu(&mut self, _: Vec<u8>) {}
    fn poll_ulpdu(&mut self, mulpdu: usize, emit: &mut EmitUlpdu<'_>) -> Result<bool, CallError> {
        let i = self.sent.load(Ordering::Relaxed);
        if i == self.count {
            return Ok(false);
        }
        emit(&[&numbered_ulpdu(i, mulpdu)])?;
        self.sent.store(i + 1, Ordering::Relaxed);
        Ok(true)
    }
    fn poll_terminate(&mut self) -> Option<Vec<u8>> {
        let due = self.sent.load(Ordering::Relaxed) == self.count && !self.terminated;
        self.terminated |= due;
        due.then(terminate)
    }
    fn on_closed(&mut self) {}
    fn on_error(&mut self, _: &ConnError) {}
}

/// The Terminate follows FPDUs written ahead in the same round: B gets every ULPDU before
/// it, intact and in order, then the Terminate; A reports it sent one.
#[test]
fn terminate_behind_fpdus_written_ahead() {
    const COUNT: u64 = 301;
    let mut p = wire_pair(1500, 1, |_| {}, |_| {});
    let sent = Arc::new(AtomicU64::new(0));
    let upper = WriteThenTerminate {
        count: COUNT,
        sent: sent.clone(),
        terminated: false,
    };
    let remote = SocketAddrV4::new(addr(2), PORT);
    let now = p.now;
    let ca =
        p.a.stack
            .connect(remote, params(false, true), Box::new(upper), now);
    let ca = ca.unwrap();
    let (cb, eb) = accept_until_established(&mut p, ca);
    let mulpdu = eb.established().unwrap().mulpdu;
    let mut got = Vec::new();
    assert!(p.run_until(Duration::from_secs(30), |p| {
        while let Ok(u) = eb.try_recv() {
            got.push(u);
        }
        p.a.final_of(ca).is_some() && p.b.final_of(cb).is_some()
    }));
    while let Ok(u) = eb.try_recv() {
        got.push(u);
    }
    assert_eq!(sent.load(Ordering::Relaxed), COUNT);
    assert_eq!(got.len() as u64, COUNT);
    for (i, u) in (0..).zip(&got) {
        assert!(*u == numbered_ulpdu(i, mulpdu), "ULPDU {i} differs");
    }
    assert!(matches!(
        p.a.final_of(ca),
        Some(ConnEvent::Failed(ConnError::TerminateSent(Some(_))))
    ));
    assert!(matches!(
        p.b.final_of(cb),
        Some(ConnEvent::Failed(ConnError::TerminateReceived(_)))
    ));
    let batched = p.a.stack.stats().fpdus_batched;
    assert!(batched > 100, "{batched}");
    assert_eq!(p.a.stack.stats().terminates_sent, 1);
    let (pcap_a, _) = pcaps(p);
    let a = layout(&pcap_a, addr(1));
    assert_eq!((a.fpdus, a.straddling), (COUNT + 1, 0), "{a:?}");
}

/// A graceful close asked while FPDUs are written ahead sends all that was queued, then
/// closes; an abortive one resets B, which has a clean prefix of the ULPDUs.
#[test]
fn close_in_the_middle_of_a_batch() {
    for mode in [CloseMode::Graceful, CloseMode::Abortive] {
        let mut p = wire_pair(1500, 1, |_| {}, |_| {});
        let now = p.now;
        let (ca, ea) = p.a.connect(2, PORT, params(false, true), now).unwrap();
        let (cb, eb) = accept_until_established(&mut p, ca);
        let mut ab = flow(5, &ea, (600, true));
        ab.push(&ea);
        assert_eq!(ab.sent, 600);
        // Until FPDUs are being written ahead and B has some.
        assert!(p.run_until(Duration::from_secs(5), |p| {
            ab.pull(&eb);
            p.a.stack.stats().fpdus_batched > 50 && ab.received > 100
        }));
        p.a.stack.close(ca, mode).unwrap();
        assert!(p.run_until(Duration::from_secs(30), |p| {
            ab.pull(&eb);
            p.a.final_of(ca).is_some() && p.b.final_of(cb).is_some()
        }));
        ab.pull(&eb);
        println!("{mode:?}: B got {} of 600", ab.received);
        assert_eq!(p.a.final_of(ca), Some(ConnEvent::Closed));
        match mode {
            CloseMode::Graceful => {
                assert!(ab.done(), "{} of 600", ab.received);
                assert_eq!(p.b.events_of(cb).last(), Some(&ConnEvent::Closed));
                assert!(p.b.events_of(cb).contains(&ConnEvent::Disconnected));
            }
            CloseMode::Abortive => {
                assert!(ab.received < 600, "{}", ab.received);
                assert_eq!(p.b.final_of(cb), Some(ConnEvent::Failed(ConnError::Reset)));
            }
        }
        let (pcap_a, _) = pcaps(p);
        assert_eq!(layout(&pcap_a, addr(1)).straddling, 0);
    }
}
