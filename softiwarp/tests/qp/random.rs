//! Seeded randomized traffic in both directions: Sends (plain, SE, with
//! Invalidate, inline), RDMA Writes (plain, with Immediate, inline), RDMA Reads,
//! multi-SGE on both ends, signaled or not, fenced or not, random MULPDU, ORD and
//! IRD, and a random interleaving of the two directions. Checks completion
//! accounting (every signaled WR and every receive completes once, in order,
//! successfully) and byte-exact integrity of every transfer.

use std::sync::Arc;

use crate::support::qp::*;
use softiwarp::resources::stag_table::MemoryRegion;
use softiwarp::MrState;
use verbs::{Payload, RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus};

const REGION: u64 = 4 << 20;

/// One side's memory: a constant source pattern, a target for the peer's Writes,
/// receive buffers, and a destination for its own Reads. Regions are handed out
/// by bump allocation so every transfer lands in fresh bytes.
struct Mem {
    src: Arc<MemoryRegion>,
    src_data: Vec<u8>,
    write_target: Arc<MemoryRegion>,
    recv: Arc<MemoryRegion>,
    read_dst: Arc<MemoryRegion>,
    next_write: u64,
    next_recv: u64,
    next_read: u64,
}

impl Mem {
    fn new(side: &Side, seed: u64) -> Mem {
        let src = side.reg(0x1000_0000 + seed, REGION, all_access());
        let src_data = pattern(REGION as usize, seed);
        src.write(0, &src_data).unwrap();
        Mem {
            src,
            src_data,
            write_target: side.reg(0x2000_0000, REGION, all_access()),
            recv: side.reg(0x3000_0000, REGION, all_access()),
            read_dst: side.reg(0x4000_0000, REGION, all_access()),
            next_write: 0,
            next_recv: 0,
            next_read: 0,
        }
    }
}

fn bump(next: &mut u64, len: u64) -> Option<u64> {
    let at = *next;
    let end = at.checked_add(len + 8)?;
    if end > REGION {
        return None;
    }
    *next = end;
    Some(at + 3) // keep offsets unaligned
}

/// Splits `[off, off + len)` of `mr` into 1..=3 SGEs.
fn split(rng: &mut Rng, mr: &MemoryRegion, off: u64, len: u32) -> Vec<Sge> {
    let n = 1 + rng.below(3) as u32;
    let mut out = Vec::new();
    let mut at = 0u32;
    for i in 0..n {
        let left = len - at;
        let l = if i == n - 1 {
            left
        } else {
            rng.below(u64::from(left) + 1) as u32
        };
        out.push(Sge::new(mr.iova() + off + u64::from(at), l, mr.stag()));
        at += l;
    }
    out
}

/// What a check at the end must find.
enum Check {
    /// `len` bytes at `dst_off` of `dst` equal the sender's source at `src_off`.
    Bytes {
        dst: Arc<MemoryRegion>,
        dst_off: u64,
        src_data_of: char,
        src_off: u64,
        len: u64,
    },
    /// The MR was invalidated by a Send with Invalidate.
    Invalidated(Arc<MemoryRegion>),
}

#[derive(Default)]
struct Ledger {
    /// Signaled send WR ids in posting order, with their opcode and length.
    sends: Vec<(u64, WcOpcode, u32)>,
    /// Receive WR ids in posting order with the expected completion.
    recvs: Vec<(u64, WcOpcode, u32, Option<u32>, bool)>,
}

struct World {
    p: Pair,
    rng: Rng,
    mem_a: Mem,
    mem_b: Mem,
    ledger_a: Ledger,
    ledger_b: Ledger,
    checks: Vec<Check>,
    next_id: u64,
}

impl World {
    /// Posts one random operation from side `from` ('a' or 'b'). Returns false if
    /// there was no room.
    fn post_random(&mut self, from: char) -> bool {
        let id = self.next_id;
        self.next_id += 1;
        let World {
            p,
            rng,
            mem_a,
            mem_b,
            ledger_a,
            ledger_b,
            checks,
            ..
        } = self;
        let (me, peer, mem, peer_mem, ledger, peer_ledger) = if from == 'a' {
            (&mut p.a, &mut p.b, mem_a, mem_b, ledger_a, ledger_b)
        } else {
            (&mut p.b, &mut p.a, mem_b, mem_a, ledger_b, ledger_a)
        };
        if me.qp.sq_outstanding() >= 60 || peer.qp.rq_outstanding() >= 60 {
            return false;
        }
        let max = [0u64, 1, 64, 1500, 6000][rng.below(5) as usize];
        let len = rng.below(max + 1) as u32;
        let src_off = rng.below(REGION - 8192);
        let signaled = rng.chance(60);
        let mut flags = if signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        if rng.chance(10) {
            flags |= SendFlags::FENCE;
        }
        let inline = len <= 256 && rng.chance(20);
        let payload = if inline {
            let o = src_off as usize;
            Payload::Inline(mem.src_data[o..o + len as usize].to_vec())
        } else {
            Payload::Sges(split(rng, &mem.src, src_off, len))
        };
        if inline {
            flags |= SendFlags::INLINE;
        }
        let kind = rng.below(6);
        let (op, wc_op) = match kind {
            // Send / Send with SE / Send with Invalidate.
            0..=2 => {
                let Some(roff) = bump(&mut peer_mem.next_recv, u64::from(len) + 16) else {
                    return false;
                };
                let slack = rng.below(16) as u32;
                let rsges = split(rng, &peer_mem.recv, roff, len + slack);
                peer.qp.post_recv(RecvWr::new(id, rsges)).unwrap();
                checks.push(Check::Bytes {
                    dst: Arc::clone(&peer_mem.recv),
                    dst_off: roff,
                    src_data_of: from,
                    src_off,
                    len: u64::from(len),
                });
                let mut op = SendOp::Send;
                let mut inv = false;
                if kind == 1 {
                    flags |= SendFlags::SOLICITED;
                } else if kind == 2 {
                    let victim = peer.reg_invalidatable(0x9000_0000, 64, all_access());
                    op = SendOp::SendWithInv {
                        invalidate_rkey: victim.stag(),
                    };
                    checks.push(Check::Invalidated(victim));
                    inv = true;
                }
                peer_ledger.recvs.push((id, WcOpcode::Recv, len, None, inv));
                (op, WcOpcode::Send)
            }
            // RDMA Write / with Immediate.
            3 | 4 => {
                let Some(toff) = bump(&mut peer_mem.next_write, u64::from(len)) else {
                    return false;
                };
                checks.push(Check::Bytes {
                    dst: Arc::clone(&peer_mem.write_target),
                    dst_off: toff,
                    src_data_of: from,
                    src_off,
                    len: u64::from(len),
                });
                let remote_addr = peer_mem.write_target.iova() + toff;
                let rkey = peer_mem.write_target.stag();
                let op = if kind == 4 {
                    let imm = rng.next_u64() as u32;
                    peer.qp.post_recv(RecvWr::new(id, vec![])).unwrap();
                    peer_ledger
                        .recvs
                        .push((id, WcOpcode::RecvRdmaWithImm, 0, Some(imm), false));
                    if rng.chance(50) {
                        flags |= SendFlags::SOLICITED;
                    }
                    SendOp::RdmaWriteWithImm {
                        remote_addr,
                        rkey,
                        imm_data: imm,
                    }
                } else {
                    SendOp::RdmaWrite { remote_addr, rkey }
                };
                (op, WcOpcode::RdmaWrite)
            }
            // RDMA Read of the peer's source into our read destination.
            _ => {
                if inline {
                    flags.remove(SendFlags::INLINE);
                }
                let Some(doff) = bump(&mut mem.next_read, u64::from(len)) else {
                    return false;
                };
                let psrc = rng.below(REGION - 8192);
                checks.push(Check::Bytes {
                    dst: Arc::clone(&mem.read_dst),
                    dst_off: doff,
                    src_data_of: if from == 'a' { 'b' } else { 'a' },
                    src_off: psrc,
                    len: u64::from(len),
                });
                let sges = split(rng, &mem.read_dst, doff, len);
                let op = SendOp::RdmaRead {
                    remote_addr: peer_mem.src.iova() + psrc,
                    rkey: peer_mem.src.stag(),
                };
                let wr = SendWr {
                    wr_id: id,
                    op,
                    flags,
                    payload: Payload::Sges(sges),
                };
                me.qp.post_send(wr).unwrap();
                if signaled {
                    ledger.sends.push((id, WcOpcode::RdmaRead, len));
                }
                return true;
            }
        };
        let wr = SendWr {
            wr_id: id,
            op,
            flags,
            payload,
        };
        me.qp.post_send(wr).unwrap();
        if signaled {
            ledger.sends.push((id, wc_op, len));
        }
        true
    }
}

fn check_ledger(side: &Side, ledger: &Ledger, who: char, seed: u64) {
    let sends = side.send_wcs();
    let got: Vec<_> = sends
        .iter()
        .map(|w| (w.wr_id, w.opcode, w.byte_len))
        .collect();
    assert_eq!(got, ledger.sends, "seed {seed}: {who} send completions");
    assert!(sends.iter().all(|w| w.status == WcStatus::Success));
    let recvs = side.recv_wcs();
    assert_eq!(
        recvs.len(),
        ledger.recvs.len(),
        "seed {seed}: {who} receives"
    );
    for (w, &(id, op, len, imm, inv)) in recvs.iter().zip(&ledger.recvs) {
        assert_eq!(w.status, WcStatus::Success, "seed {seed}");
        assert_eq!(
            (w.wr_id, w.opcode, w.byte_len, w.imm_data),
            (id, op, len, imm)
        );
        assert_eq!(w.invalidated_stag.is_some(), inv);
    }
}

fn run(seed: u64) {
    let mut rng = Rng(seed);
    let mulpdu = [80usize, 200, 1442, 4096][rng.below(4) as usize];
    let ord_a = 1 + rng.below(8) as u32;
    let ord_b = 1 + rng.below(8) as u32;
    let mut p = Pair::with(
        cap(64, 3),
        |i| {
            i.ord = ord_a;
            i.ird = ord_b;
        },
        |i| {
            i.ord = ord_b;
            i.ird = ord_a;
        },
    );
    p.mulpdu = mulpdu;
    let mem_a = Mem::new(&p.a, seed * 2 + 1);
    let mem_b = Mem::new(&p.b, seed * 2 + 2);
    let mut w = World {
        p,
        rng,
        mem_a,
        mem_b,
        ledger_a: Ledger::default(),
        ledger_b: Ledger::default(),
        checks: Vec::new(),
        next_id: 1,
    };
    for _ in 0..300 {
        match w.rng.below(10) {
            0..=3 => {
                w.post_random('a');
            }
            4..=7 => {
                w.post_random('b');
            }
            _ => {
                let steps = w.rng.below(40);
                for _ in 0..steps {
                    match w.rng.below(4) {
                        0 => w.p.tx_a(),
                        1 => w.p.rx_b(),
                        2 => w.p.tx_b(),
                        _ => w.p.rx_a(),
                    };
                }
            }
        }
    }
    assert!(
        w.checks.len() > 150,
        "seed {seed}: only {} operations",
        w.checks.len()
    );
    let mut rng = Rng(seed ^ 0xabcdef);
    w.p.pump_random(&mut rng);
    assert!(w.p.rx_errors.is_empty(), "seed {seed}: {:?}", w.p.rx_errors);
    assert!(w.p.a.events().is_empty() && w.p.b.events().is_empty());
    eprintln!(
        "seed {seed}: mulpdu {mulpdu}, {} ops, {} ULPDUs, {}+{} signaled, {}+{} receives",
        w.checks.len(),
        w.p.moved,
        w.ledger_a.sends.len(),
        w.ledger_b.sends.len(),
        w.ledger_a.recvs.len(),
        w.ledger_b.recvs.len()
    );
    check_ledger(&w.p.a, &w.ledger_a, 'a', seed);
    check_ledger(&w.p.b, &w.ledger_b, 'b', seed);
    assert_eq!(w.p.a.qp.sq_outstanding() + w.p.b.qp.sq_outstanding(), 0);
    assert_eq!(w.p.a.qp.rq_outstanding() + w.p.b.qp.rq_outstanding(), 0);
    for c in &w.checks {
        match c {
            Check::Bytes {
                dst,
                dst_off,
                src_data_of,
                src_off,
                len,
            } => {
                let src = if *src_data_of == 'a' {
                    &w.mem_a.src_data
                } else {
                    &w.mem_b.src_data
                };
                let mut got = vec![0u8; *len as usize];
                dst.read(*dst_off as usize, &mut got).unwrap();
                let s = *src_off as usize;
                assert!(
                    got == src[s..s + *len as usize],
                    "seed {seed}: data mismatch at {dst_off:#x} (+{len})"
                );
            }
            Check::Invalidated(mr) => assert_eq!(mr.state(), MrState::Invalid),
        }
    }
}

#[test]
fn randomized_mixed_traffic() {
    for seed in 1..=12 {
        run(seed);
    }
}
