//! Harness of the `engine` tests: stacks (and a raw smoltcp TCP peer) on a memory link
//! pair, driven step by step on a virtual clock; stream ends routed by connection; seeded
//! ULPDU flows that verify order and content.

use std::collections::{BTreeMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};

use super::host::Host;
use smoltcp::socket::tcp;
use smoltcp::time::{Duration, Instant};
use softiwarp::link::{Link, LinkEvent};
use softiwarp::transport::smoltcp_glue::{InterfaceConfig, TcpConfig};
use softiwarp::transport::stream::{self, StreamConfig, StreamEnd, Waker};
use softiwarp::transport::{
    ConnEvent, ConnId, ConnectRequestInfo, MpaParams, Stack, StackConfig, StackError, StackEvent,
};

/// The IPv4 address of host number `host` in the test subnet.
pub fn addr(host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, host)
}

/// Interface settings of host number `host`.
pub fn iface(host: u8) -> InterfaceConfig {
    InterfaceConfig {
        mac: [0x02, 0, 0, 0, 1, host],
        address: addr(host),
        prefix_len: 24,
        gateway: None,
        random_seed: u64::from(host) * 7919,
    }
}

#[allow(unused_imports)] // each test binary uses a subset
pub use super::{links, Rng, RngExt};

/// Something a [`Pair`] can drive.
pub trait Node {
    /// Does the work due at `now`; returns the next deadline.
    fn poll(&mut self, now: Instant) -> Option<Instant>;
    /// Whether the last poll did anything.
    fn progressed(&self) -> bool;
}

/// A stack with its stream ends and what it reported.
pub struct Side<L: Link> {
    pub stack: Stack<L>,
    pub ends: BTreeMap<ConnId, StreamEnd>,
    pub requests: VecDeque<ConnectRequestInfo>,
    pub log: Vec<(ConnId, ConnEvent)>,
    pub link_events: Vec<LinkEvent>,
    pub stream_cfg: StreamConfig,
}

impl<L: Link> Side<L> {
    pub fn new(link: L, host: u8, tweak: impl FnOnce(&mut StackConfig)) -> Self {
        let mut cfg = StackConfig::new(iface(host));
        tweak(&mut cfg);
        Side {
            stack: Stack::new(link, cfg, Instant::from_secs(1)).expect("stack"),
            ends: BTreeMap::new(),
            requests: VecDeque::new(),
            log: Vec::new(),
            link_events: Vec::new(),
            stream_cfg: StreamConfig::default(),
        }
    }

    /// Routes the stack's events.
    pub fn pump(&mut self) {
        while let Some(ev) = self.stack.poll_event() {
            match ev {
                StackEvent::ConnectRequest(r) => self.requests.push_back(r),
                StackEvent::Conn { conn, event } => {
                    if let Some(end) = self.ends.get(&conn) {
                        end.deliver_event(event.clone());
                    }
                    self.log.push((conn, event));
                }
                StackEvent::Link(l) => self.link_events.push(l),
            }
        }
    }

    pub fn connect(
        &mut self,
        host: u8,
        port: u16,
        params: MpaParams,
        now: Instant,
    ) -> Result<(ConnId, StreamEnd), StackError> {
        let (ulp, end) = stream::pair(self.stream_cfg, Waker::none());
        let id = self.stack.connect(
            SocketAddrV4::new(addr(host), port),
            params,
            Box::new(ulp),
            now,
        )?;
        self.ends.insert(id, end.clone());
        Ok((id, end))
    }

    /// Accepts the oldest connection request.
    pub fn accept_next(
        &mut self,
        private_data: &[u8],
        ird: u16,
        ord: u16,
    ) -> Option<Result<(ConnId, StreamEnd), StackError>> {
        let r = self.requests.pop_front()?;
        let (ulp, end) = stream::pair(self.stream_cfg, Waker::none());
        self.ends.insert(r.conn, end.clone());
        Some(
            self.stack
                .accept(r.conn, private_data, ird, ord, Box::new(ulp))
                .map(|()| (r.conn, end)),
        )
    }

    /// Every event of `conn`, in order.
    pub fn events_of(&self, conn: ConnId) -> Vec<ConnEvent> {
        self.log
            .iter()
            .filter(|(c, _)| *c == conn)
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// The final event of `conn`, once reported.
    pub fn final_of(&self, conn: ConnId) -> Option<ConnEvent> {
        self.events_of(conn).into_iter().find(ConnEvent::is_final)
    }
}

impl<L: Link> Node for Side<L> {
    fn poll(&mut self, now: Instant) -> Option<Instant> {
        let d = self.stack.poll(now);
        self.pump();
        d
    }
    fn progressed(&self) -> bool {
        self.stack.progressed()
    }
}

/// A bare smoltcp host with one TCP socket: the peer that speaks no MPA.
pub struct RawHost<L: Link> {
    pub host: Host<L>,
    progressed: bool,
}

impl<L: Link> RawHost<L> {
    pub fn new(link: L, host: u8) -> Self {
        RawHost {
            host: Host::with_interface(
                link,
                &iface(host),
                TcpConfig::default(),
                Instant::from_secs(1),
            ),
            progressed: false,
        }
    }

    pub fn socket(&mut self) -> &mut tcp::Socket<'static> {
        self.host.socket()
    }

    pub fn listen(&mut self, port: u16) {
        self.host.listen_on(port);
    }

    pub fn connect(&mut self, host: u8, port: u16) {
        self.host.connect_to(addr(host), port, 40_000);
    }

    /// Everything received so far.
    pub fn drain(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let s = self.socket();
        while s.can_recv() {
            let _ = s.recv(|b| {
                out.extend_from_slice(b);
                (b.len(), ())
            });
        }
        out
    }
}

impl<L: Link> Node for RawHost<L> {
    fn poll(&mut self, now: Instant) -> Option<Instant> {
        let h = &mut self.host;
        let before = h.dev.stats();
        h.iface.poll(now, &mut h.dev, &mut h.sockets);
        self.progressed = before != h.dev.stats();
        h.iface.poll_at(now, &h.sockets)
    }
    fn progressed(&self) -> bool {
        self.progressed
    }
}

/// Two nodes on one virtual clock.
pub struct Pair<A, B> {
    pub a: A,
    pub b: B,
    pub now: Instant,
    pub steps: u64,
}

/// Virtual time a step takes when something happened: 10 us.
pub const STEP: Duration = Duration::from_micros(10);

impl<A: Node, B: Node> Pair<A, B> {
    pub fn new(a: A, b: B) -> Self {
        Pair {
            a,
            b,
            now: Instant::from_secs(1),
            steps: 0,
        }
    }

    /// Polls both; advances the clock by [`STEP`] after activity, else to the next
    /// deadline (at most 100 ms ahead when nothing is timed).
    pub fn step(&mut self) {
        self.steps += 1;
        let da = self.a.poll(self.now);
        let db = self.b.poll(self.now);
        if self.a.progressed() || self.b.progressed() {
            self.now += STEP;
            return;
        }
        let next = match (da, db) {
            (Some(x), Some(y)) => x.min(y),
            (Some(x), None) | (None, Some(x)) => x,
            (None, None) => self.now + Duration::from_millis(100),
        };
        self.now = next.max(self.now + Duration::from_micros(1));
    }

    /// Steps until `done` or until `limit` of virtual time passed; returns whether done.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Self) -> bool) -> bool {
        let end = self.now + limit;
        while self.now < end {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }

    /// Steps for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        self.run_until(d, |_| false);
    }
}

/// A seeded sequence of ULPDUs of random lengths (`1..=max_len` bytes) and contents;
/// with `ddp`, each is a valid DDP segment (an RDMA Write, tagged header with STag
/// 0x1234 and a running TO, then random payload) so that a dissector decodes it cleanly.
#[derive(Debug, Clone)]
pub struct UlpduSeq {
    rng: Rng,
    max_len: usize,
    ddp: bool,
    to: u64,
    /// Every ULPDU `max_len` bytes long.
    fixed: bool,
}

/// Length of the tagged DDP/RDMAP header of an RDMA Write (RFC 5041 4.2).
pub const TAGGED_HEADER_LEN: usize = 14;

impl UlpduSeq {
    pub fn new(seed: u64, max_len: usize) -> Self {
        UlpduSeq {
            rng: Rng::new(seed),
            max_len,
            ddp: false,
            to: 0,
            fixed: false,
        }
    }
    pub fn ddp(seed: u64, max_len: usize) -> Self {
        UlpduSeq {
            ddp: true,
            ..UlpduSeq::new(seed, max_len)
        }
    }
    pub fn next_ulpdu(&mut self) -> Vec<u8> {
        let min = if self.ddp { TAGGED_HEADER_LEN } else { 1 };
        // A third of them full-sized, the rest anywhere in min..=max.
        let len = if self.fixed || self.rng.next_u64().is_multiple_of(3) {
            self.max_len
        } else {
            self.rng.range(min, self.max_len)
        };
        let mut v = vec![0u8; len];
        self.rng.fill(&mut v);
        if self.ddp {
            let h = ddp_rdmap::Header {
                opcode: ddp_rdmap::Opcode::Write,
                last: true,
                buffer: ddp_rdmap::ddp::BufferModel::Tagged {
                    stag: 0x1234,
                    to: self.to,
                },
            };
            h.emit(&mut v).expect("header");
            self.to += (len - TAGGED_HEADER_LEN) as u64;
        }
        v
    }
}

/// One direction of seeded ULPDUs: the sender side pushes, the receiver side checks.
pub struct Flow {
    pub count: u64,
    tx: UlpduSeq,
    rx: UlpduSeq,
    pending: Option<Vec<u8>>,
    pub sent: u64,
    pub received: u64,
    pub bytes: u64,
}

impl Flow {
    pub fn new(seed: u64, max_len: usize, count: u64) -> Self {
        Self::with(UlpduSeq::new(seed, max_len), count)
    }

    /// ULPDUs that are valid DDP segments (see [`UlpduSeq::ddp`]).
    pub fn ddp(seed: u64, max_len: usize, count: u64) -> Self {
        Self::with(UlpduSeq::ddp(seed, max_len), count)
    }

    /// DDP segments all `len` bytes long (bulk data at MULPDU).
    #[allow(dead_code)]
    pub fn ddp_fixed(seed: u64, len: usize, count: u64) -> Self {
        Self::with(
            UlpduSeq {
                fixed: true,
                ..UlpduSeq::ddp(seed, len)
            },
            count,
        )
    }

    fn with(seq: UlpduSeq, count: u64) -> Self {
        Flow {
            count,
            tx: seq.clone(),
            rx: seq,
            pending: None,
            sent: 0,
            received: 0,
            bytes: 0,
        }
    }

    /// Queues what fits.
    pub fn push(&mut self, end: &StreamEnd) {
        while self.sent < self.count {
            let u = self.pending.take().unwrap_or_else(|| self.tx.next_ulpdu());
            match end.try_send(&u) {
                Ok(()) => self.sent += 1,
                Err(softiwarp::transport::stream::SendError::WouldBlock) => {
                    self.pending = Some(u);
                    return;
                }
                Err(e) => panic!("send {}: {e}", self.sent),
            }
        }
    }

    /// Takes and checks what arrived; panics on a wrong ULPDU.
    pub fn pull(&mut self, end: &StreamEnd) {
        self.pull_n(end, usize::MAX);
    }

    /// Takes and checks at most `n` of the ULPDUs that arrived.
    pub fn pull_n(&mut self, end: &StreamEnd, n: usize) {
        for _ in 0..n {
            let Ok(u) = end.try_recv() else { break };
            let want = self.rx.next_ulpdu();
            assert!(
                u == want,
                "ULPDU {} differs: got {} bytes, want {}",
                self.received,
                u.len(),
                want.len()
            );
            self.received += 1;
            self.bytes += u.len() as u64;
        }
    }

    pub fn done(&self) -> bool {
        self.received == self.count
    }
}
