//! A long seeded randomized run over a faulty memory link (frames dropped,
//! duplicated and reordered once the connection is up): both sides mix Sends, RDMA
//! Writes read back with RDMA Reads, Reads of static memory and Writes with Immediate,
//! with random sizes, offsets and SGE counts, as fast as their queues allow. Every
//! byte is checked, every completion is accounted for (posted == completed, all
//! successful), and the WRs still outstanding at the end are flushed exactly once.

use std::collections::{HashMap, VecDeque};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::devices::*;
use softiwarp::link::{
    Direction, FaultConfig, FaultStats, Faults, Link, LinkError, LinkEvent, MemoryLink,
};
use softiwarp::Mr;
use softiwarp::{LinkConfig, LinkSpec};
use verbs::{QpState, RecvWr, SendFlags, SendOp, SendWr, Sge, VerbsError, WcOpcode, WcStatus};

/// Faults that can be switched on once the connection is up (so ARP and the
/// handshake are not slowed down by one-second retransmission timers).
struct Gated {
    inner: Faults<MemoryLink>,
    on: Arc<AtomicBool>,
    active: bool,
    faults: FaultConfig,
    /// What the faults did so far (sent frames).
    stats: Arc<Mutex<FaultStats>>,
}

impl Gated {
    fn sync(&mut self) {
        if let Ok(mut g) = self.stats.lock() {
            *g = self.inner.stats(Direction::Tx);
        }
        let on = self.on.load(Ordering::Relaxed);
        if on != self.active {
            self.active = on;
            let f = if on { self.faults } else { FaultConfig::none() };
            // Valid probabilities: cannot fail.
            let _ = self.inner.set_config(Direction::Tx, f);
        }
    }
}

impl Link for Gated {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn mtu(&self) -> usize {
        self.inner.mtu()
    }
    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        self.sync();
        self.inner.recv(buf)
    }
    fn send(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        self.sync();
        self.inner.send(frame)
    }
    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.inner.poll_fd()
    }
    fn poll_event(&mut self) -> Option<LinkEvent> {
        self.inner.poll_event()
    }
    fn state(&self) -> LinkEvent {
        self.inner.state()
    }
}

const SLOT: u64 = 64 * 1024;
const SLOTS: u64 = 24;
const DEPTH: u32 = 48;

/// One side's memory.
struct Mem {
    /// Source bytes for Sends and Writes (a fixed pattern).
    src: Mr,
    src_data: Vec<u8>,
    /// Read into here, one slot per outstanding Read.
    sink: Mr,
    /// Receive buffers, one slot per posted receive.
    rbuf: Mr,
    /// Never changed; the peer reads it.
    stat: Mr,
    stat_data: Vec<u8>,
    /// The peer writes here, one slot per outstanding Write.
    target: Mr,
}

impl Mem {
    fn new(e: &End, seed: u64) -> Mem {
        let src_data = pattern(4 * SLOT as usize, seed);
        let stat_data = pattern(4 * SLOT as usize, seed + 1);
        let m = |len, iova| e.pd.reg_mr(len, iova, all_access()).unwrap();
        let mem = Mem {
            src: m(4 * SLOT, 0x1_0000_0003),
            sink: m(SLOTS * SLOT, 0x2_0000_0000),
            rbuf: m(u64::from(DEPTH) * SLOT, 0x3_0000_0005),
            stat: m(4 * SLOT, 0x4_0000_0000),
            target: m(SLOTS * SLOT, 0x5_0000_0001),
            src_data,
            stat_data,
        };
        mem.src.write(0, &mem.src_data).unwrap();
        mem.stat.write(0, &mem.stat_data).unwrap();
        mem
    }
}

/// What a completion must show.
#[derive(Debug)]
enum Expect {
    /// A Send, Write or Write with Immediate: only its status.
    Plain { opcode: WcOpcode, len: u32 },
    /// A Read into `sink` slot `slot` that must equal `data`, except for a 7-byte
    /// gap at `gap` (between two scatter SGEs) where nothing may be checked.
    Read {
        slot: u64,
        data: Vec<u8>,
        gap: Option<usize>,
        /// A slot of the peer's target to free (Write read back).
        frees_target: Option<u64>,
    },
}

/// A message the peer's receive will see, in order.
#[derive(Debug)]
enum Incoming {
    Send(Vec<u8>),
    /// Write with Immediate: the immediate, and the target slot the data landed in.
    Imm {
        imm: u32,
        slot: u64,
        data: Vec<u8>,
    },
}

/// One side's bookkeeping.
struct Driver {
    pending: HashMap<u64, Expect>,
    free_sink: Vec<u64>,
    /// Free slots of the *peer's* target MR (this side writes there).
    free_target: Vec<u64>,
    /// Messages in flight to the peer's receive queue.
    to_peer: VecDeque<Incoming>,
    /// Receive slots posted, in order.
    recv_slots: VecDeque<u64>,
    free_rslots: Vec<u64>,
    next_id: u64,
    posted: u64,
    completed: u64,
    recvs_posted: u64,
    recvs_completed: u64,
    bytes: u64,
}

impl Driver {
    fn new(id_base: u64) -> Driver {
        Driver {
            pending: HashMap::new(),
            free_sink: (0..SLOTS).collect(),
            free_target: (0..SLOTS).collect(),
            to_peer: VecDeque::new(),
            recv_slots: VecDeque::new(),
            free_rslots: (0..u64::from(DEPTH)).collect(),
            next_id: id_base,
            posted: 0,
            completed: 0,
            recvs_posted: 0,
            recvs_completed: 0,
            bytes: 0,
        }
    }
}

/// A random gather list over `mem.src` of `len` bytes at a random offset: the SGEs
/// and the bytes they cover.
fn gather(rng: &mut Rng, mem: &Mem, len: usize) -> (Vec<Sge>, Vec<u8>) {
    let off = rng.below(2 * SLOT) as usize;
    let n = 1 + rng.below(3) as usize;
    let mut sges = Vec::new();
    let mut data = Vec::new();
    let mut left = len;
    let mut at = off;
    for i in 0..n {
        let take = if i + 1 == n {
            left
        } else {
            rng.below(left as u64 + 1) as usize
        };
        sges.push(mem.src.sge(at as u64, take as u32));
        data.extend_from_slice(&mem.src_data[at..at + take]);
        left -= take;
        // A gap between pieces, so the SGEs are not contiguous.
        at += take + rng.below(64) as usize;
    }
    (sges, data)
}

fn random_len(rng: &mut Rng) -> usize {
    match rng.below(4) {
        0 => rng.below(64) as usize,
        1 => rng.below(3000) as usize,
        2 => rng.below(20_000) as usize,
        _ => rng.below(SLOT) as usize,
    }
}

/// Tries to post one random operation from `me` to `peer`; false if the queues or
/// slots are exhausted for the one drawn.
#[allow(clippy::too_many_arguments)]
fn step(
    rng: &mut Rng,
    e: &End,
    mem: &Mem,
    peer_mem: &Mem,
    d: &mut Driver,
    peer_d: &Driver,
    peer_recvs_free: u64,
) -> bool {
    let id = d.next_id;
    let len = random_len(rng);
    let (sges, data) = gather(rng, mem, len);
    let mut wrs = Vec::new();
    let expects;
    match rng.below(4) {
        // Send: needs a receive the peer posted and no message already bound to it.
        0 => {
            if peer_recvs_free == 0 {
                return false;
            }
            let mut wr = SendWr::send(id, sges);
            if rng.chance(30) {
                wr.flags |= SendFlags::SOLICITED;
            }
            wrs.push(wr);
            expects = vec![Expect::Plain {
                opcode: WcOpcode::Send,
                len: len as u32,
            }];
            d.to_peer.push_back(Incoming::Send(data));
        }
        // Write, then Read the same range back.
        1 => {
            let (Some(tslot), Some(sslot)) = (d.free_target.pop(), d.free_sink.pop()) else {
                return false;
            };
            let toff = rng.below(1024);
            let remote = peer_mem.target.iova() + tslot * SLOT + toff;
            let len = len.min((SLOT - toff) as usize);
            let (sges, data) = gather(rng, mem, len);
            d.bytes += len as u64;
            wrs.push(SendWr::rdma_write(id, sges, remote, peer_mem.target.rkey()));
            wrs.push(SendWr::rdma_read(
                id + 1,
                vec![mem.sink.sge(sslot * SLOT, len as u32)],
                remote,
                peer_mem.target.rkey(),
            ));
            expects = vec![
                Expect::Plain {
                    opcode: WcOpcode::RdmaWrite,
                    len: len as u32,
                },
                Expect::Read {
                    slot: sslot,
                    data,
                    gap: None,
                    frees_target: Some(tslot),
                },
            ];
        }
        // Read of the peer's static memory, scattered over 1-2 SGEs.
        2 => {
            let Some(sslot) = d.free_sink.pop() else {
                return false;
            };
            let len = len.min(SLOT as usize - 8);
            let off = rng.below(2 * SLOT);
            let data = peer_mem.stat_data[off as usize..off as usize + len].to_vec();
            let split = rng.below(len as u64 + 1) as u32;
            let base = sslot * SLOT;
            let sink = vec![
                mem.sink.sge(base, split),
                mem.sink
                    .sge(base + u64::from(split) + 7, len as u32 - split),
            ];
            let mut wr =
                SendWr::rdma_read(id, sink, peer_mem.stat.iova() + off, peer_mem.stat.rkey());
            if rng.chance(10) {
                wr.flags |= SendFlags::FENCE;
            }
            wrs.push(wr);
            // The expected bytes are checked through the two pieces.
            let mut laid = vec![0u8; len + 7];
            laid[..split as usize].copy_from_slice(&data[..split as usize]);
            laid[split as usize + 7..].copy_from_slice(&data[split as usize..]);
            expects = vec![Expect::Read {
                slot: sslot,
                data: laid,
                gap: Some(split as usize),
                frees_target: None,
            }];
        }
        // Write with Immediate into a target slot; the peer checks data and value.
        _ => {
            if peer_recvs_free == 0 {
                return false;
            }
            let Some(tslot) = d.free_target.pop() else {
                return false;
            };
            let remote = peer_mem.target.iova() + tslot * SLOT;
            let imm = rng.next_u64() as u32;
            wrs.push(SendWr {
                wr_id: id,
                op: SendOp::RdmaWriteWithImm {
                    remote_addr: remote,
                    rkey: peer_mem.target.rkey(),
                    imm_data: imm,
                },
                flags: SendFlags::empty(),
                payload: verbs::Payload::Sges(sges),
            });
            expects = vec![Expect::Plain {
                opcode: WcOpcode::RdmaWrite,
                len: len as u32,
            }];
            d.to_peer.push_back(Incoming::Imm {
                imm,
                slot: tslot,
                data,
            });
        }
    }
    let _ = peer_d;
    let n = wrs.len() as u64;
    let list: Vec<SendWr> = wrs
        .into_iter()
        .map(|w| w.with_flags(SendFlags::SIGNALED))
        .collect();
    match e.qp.post_send_list(list) {
        Ok(()) => {}
        Err(err) => panic!("post refused: {err}"),
    }
    for (i, x) in expects.into_iter().enumerate() {
        d.pending.insert(id + i as u64, x);
    }
    d.next_id += n;
    d.posted += n;
    d.bytes += len as u64;
    true
}

/// Checks the send completions of `e`.
fn reap_sends(e: &End, mem: &Mem, d: &mut Driver) {
    for wc in e.scq.poll(256).expect("send CQ") {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        let x = d.pending.remove(&wc.wr_id).expect("unknown wr_id");
        match x {
            Expect::Plain { opcode, len } => {
                assert_eq!((wc.opcode, wc.byte_len), (opcode, len), "{wc:?}");
            }
            Expect::Read {
                slot,
                data,
                gap,
                frees_target,
            } => {
                assert_eq!(wc.opcode, WcOpcode::RdmaRead);
                let mut got = vec![0u8; data.len()];
                mem.sink.read((slot * SLOT) as usize, &mut got).unwrap();
                match gap {
                    // The 7 bytes between the two scatter pieces are not written.
                    Some(g) => assert!(
                        got[..g] == data[..g] && got[g + 7..] == data[g + 7..],
                        "read {}",
                        wc.wr_id
                    ),
                    None => assert!(got == data, "write read back {}", wc.wr_id),
                }
                d.free_sink.push(slot);
                if let Some(t) = frees_target {
                    d.free_target.push(t);
                }
            }
        }
        d.completed += 1;
    }
}

/// Checks the receive completions of `e` (messages `peer_d` sent), frees the target
/// slots of Writes with Immediate, and keeps the receive queue full.
fn reap_recvs(e: &End, mem: &Mem, d: &mut Driver, peer_d: &mut Driver, post_more: bool) {
    for wc in e.rcq.poll(256).expect("recv CQ") {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        let slot = d.recv_slots.pop_front().expect("a posted receive");
        assert_eq!(wc.wr_id % 1_000_000, slot, "receive order");
        match peer_d.to_peer.pop_front().expect("an expected message") {
            Incoming::Send(data) => {
                assert_eq!(wc.opcode, WcOpcode::Recv);
                assert_eq!(wc.byte_len as usize, data.len());
                let mut got = vec![0u8; data.len()];
                mem.rbuf.read((slot * SLOT) as usize, &mut got).unwrap();
                assert!(got == data, "send data in receive {}", wc.wr_id);
            }
            Incoming::Imm { imm, slot: t, data } => {
                assert_eq!(
                    (wc.opcode, wc.imm_data),
                    (WcOpcode::RecvRdmaWithImm, Some(imm))
                );
                let mut got = vec![0u8; data.len()];
                mem.target.read((t * SLOT) as usize, &mut got).unwrap();
                assert!(got == data, "write-with-immediate data");
                peer_d.free_target.push(t);
            }
        }
        d.free_rslots.push(slot);
        d.recvs_completed += 1;
    }
    if !post_more {
        return;
    }
    while let Some(slot) = d.free_rslots.pop() {
        let wr = RecvWr::new(
            d.recvs_posted * 1_000_000 + slot,
            vec![mem.rbuf.sge(slot * SLOT, SLOT as u32)],
        );
        match e.qp.post_recv(wr) {
            Ok(()) => {
                d.recv_slots.push_back(slot);
                d.recvs_posted += 1;
            }
            Err(VerbsError::QueueFull { .. }) => {
                d.free_rslots.push(slot);
                break;
            }
            Err(err) => panic!("{err}"),
        }
    }
}

#[test]
fn randomized_operations_over_a_faulty_link() {
    let seed = std::env::var("SW_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2024_u64);
    println!("seed {seed} (set SW_SEED to reproduce another run)");
    let ops_per_side: u64 = std::env::var("SW_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500);
    let faults = FaultConfig {
        drop: 0.003,
        duplicate: 0.003,
        reorder: 0.005,
        ..FaultConfig::default()
    };
    let on = Arc::new(AtomicBool::new(false));
    let stats = [
        Arc::new(Mutex::new(FaultStats::default())),
        Arc::new(Mutex::new(FaultStats::default())),
    ];
    let s = Setup {
        cap: cap(DEPTH, 3),
        ird_ord: (8, 8),
        ..Setup::default()
    };
    let (mut a, mut b) = devices_with(&s, |host, link| {
        let f = Faults::new(
            link,
            seed ^ u64::from(host),
            FaultConfig::none(),
            FaultConfig::none(),
        )
        .expect("faults");
        LinkConfig {
            spec: LinkSpec::Boxed(Box::new(Gated {
                inner: f,
                on: Arc::clone(&on),
                active: false,
                faults,
                stats: Arc::clone(&stats[usize::from(host) - 1]),
            })),
            pcap: None,
            faults: None,
        }
    });
    connect_with(&mut a, &mut b, &s, |_, _| {});
    on.store(true, Ordering::Relaxed);
    let (ma, mb) = (Mem::new(&a, seed), Mem::new(&b, seed + 100));
    let (mut da, mut db) = (Driver::new(1 << 40), Driver::new(2 << 40));
    let mut rng = Rng(seed);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(45);
    reap_recvs(&a, &ma, &mut da, &mut db, true);
    reap_recvs(&b, &mb, &mut db, &mut da, true);
    let outstanding = |d: &Driver| d.posted - d.completed;
    while da.posted < ops_per_side || db.posted < ops_per_side {
        assert!(
            Instant::now() < deadline,
            "too slow: {} + {} posted",
            da.posted,
            db.posted
        );
        let mut progressed = false;
        for side in 0..2 {
            let (e, mem, peer_mem, d, peer_d) = if side == 0 {
                (&a, &ma, &mb, &mut da, &db)
            } else {
                (&b, &mb, &ma, &mut db, &da)
            };
            if d.posted >= ops_per_side || outstanding(d) + 2 > u64::from(DEPTH) {
                continue;
            }
            // Receives the peer posted that no message in flight is bound to yet.
            let peer_recvs_free =
                (peer_d.recv_slots.len() as u64).saturating_sub(d.to_peer.len() as u64);
            progressed |= step(&mut rng, e, mem, peer_mem, d, peer_d, peer_recvs_free);
        }
        reap_sends(&a, &ma, &mut da);
        reap_sends(&b, &mb, &mut db);
        reap_recvs(&a, &ma, &mut da, &mut db, true);
        reap_recvs(&b, &mb, &mut db, &mut da, true);
        if !progressed {
            a.scq.wait(Duration::from_millis(5));
        }
    }
    // Drain: everything posted completes, successfully.
    while da.completed < da.posted
        || db.completed < db.posted
        || !da.to_peer.is_empty()
        || !db.to_peer.is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "stuck: A {}/{} B {}/{}",
            da.completed,
            da.posted,
            db.completed,
            db.posted
        );
        reap_sends(&a, &ma, &mut da);
        reap_sends(&b, &mb, &mut db);
        reap_recvs(&a, &ma, &mut da, &mut db, false);
        reap_recvs(&b, &mb, &mut db, &mut da, false);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(da.pending.is_empty() && db.pending.is_empty());
    assert_eq!(a.qp.state(), QpState::Rts);
    assert_eq!(b.qp.state(), QpState::Rts);
    // Static memory the peer only read is unchanged.
    assert!(ma.stat.to_vec() == ma.stat_data && mb.stat.to_vec() == mb.stat_data);
    // The receives still posted are flushed, exactly once each.
    for (e, d) in [(&a, &mut da), (&b, &mut db)] {
        e.qp.modify_state(QpState::Error).unwrap();
        let left = (d.recvs_posted - d.recvs_completed) as usize;
        let flushed = End::wait_n(&e.rcq, left);
        assert!(flushed.iter().all(|w| w.status == WcStatus::WrFlushErr));
        d.recvs_completed += left as u64;
        assert_eq!(d.recvs_posted, d.recvs_completed);
        e.assert_quiet(Duration::from_millis(10));
    }
    assert_eq!(da.posted, da.completed);
    assert_eq!(db.posted, db.completed);
    let f: Vec<FaultStats> = stats.iter().map(|s| *s.lock().unwrap()).collect();
    println!(
        "{} + {} WRs, {} + {} MiB, in {:?}; faults A->B {:?}, B->A {:?}",
        da.posted,
        db.posted,
        da.bytes >> 20,
        db.bytes >> 20,
        t0.elapsed(),
        f[0],
        f[1]
    );
    for f in &f {
        assert!(
            f.dropped > 0 && f.duplicated > 0 && f.reordered > 0,
            "{f:?}"
        );
    }
}
