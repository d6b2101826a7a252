//! Every RDMAP operation through the verbs API between two real devices (engine
//! threads, memory link, MPA with CRC): Send, Send with SE, Send with Invalidate, RDMA
//! Write, Write with Immediate, RDMA Read, inline Sends and Writes, Fast Register and
//! Local Invalidate; sizes 0, 1, MULPDU - 1, MULPDU, MULPDU + 1, the segment payload
//! room +-1, 64 KiB and 16 MiB; aligned and unaligned offsets; single and multi-SGE;
//! byte-exact checks. Many WRs in flight with queue-full back-pressure, and the ORD /
//! IRD limits of the MPA negotiation reached and respected.

use std::time::Duration;

use crate::support::devices::*;
use softiwarp::{Mr, MrState};
use verbs::{
    AccessFlags, FastReg, QpState, RecvWr, SendFlags, SendOp, SendWr, Sge, VerbsError, WcOpcode,
    WcStatus, WorkCompletion,
};

/// The payload operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Send,
    SendSe,
    SendInv,
    Write,
    WriteImm,
    Read,
}

const OPS: [Op; 6] = [
    Op::Send,
    Op::SendSe,
    Op::SendInv,
    Op::Write,
    Op::WriteImm,
    Op::Read,
];

/// Where the bytes sit on each side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// One SGE at offset 0 on both sides.
    Aligned,
    /// One SGE at odd offsets (and odd remote addresses).
    Unaligned,
    /// Three SGEs over two MRs at odd offsets on both sides.
    Multi,
}

/// MR room per side and case: 64 KiB plus slack.
const ROOM: u64 = 64 * 1024 + 4096;

/// The MRs of one side: two, at odd iovas, so SGEs cross MRs.
struct Bufs {
    m1: Mr,
    m2: Mr,
}

impl Bufs {
    fn new(e: &End, base: u64, room: u64) -> Bufs {
        Bufs {
            m1: e.pd.reg_mr(room, base + 3, all_access()).unwrap(),
            m2: e.pd.reg_mr(room, base + 0x1000_0001, all_access()).unwrap(),
        }
    }

    /// SGE lengths and the buffer offset the SGEs start at, for `len` bytes.
    fn shape(layout: Layout, len: usize, offset: usize, rotate: bool) -> ([usize; 3], usize) {
        match layout {
            Layout::Aligned => ([len, 0, 0], 0),
            Layout::Unaligned => ([len, 0, 0], offset),
            Layout::Multi => {
                let a = len / 3;
                let b = len / 5;
                let l = [a, b, len - a - b];
                (if rotate { [l[2], l[0], l[1]] } else { l }, offset)
            }
        }
    }

    /// SGEs for `lens` at buffer offset `off`: piece 0 and 2 in `m1` (back to back),
    /// piece 1 in `m2`. Single-SGE shapes give one SGE (none for length 0).
    fn sges(&self, lens: [usize; 3], off: usize, layout: Layout) -> Vec<Sge> {
        if layout != Layout::Multi {
            if lens[0] == 0 {
                return vec![];
            }
            return vec![self.m1.sge(off as u64, lens[0] as u32)];
        }
        vec![
            self.m1.sge(off as u64, lens[0] as u32),
            self.m2.sge(off as u64, lens[1] as u32),
            self.m1.sge((off + lens[0]) as u64, lens[2] as u32),
        ]
    }

    fn scatter(&self, lens: [usize; 3], off: usize, data: &[u8]) {
        self.m1.write(off, &data[..lens[0]]).unwrap();
        self.m2
            .write(off, &data[lens[0]..lens[0] + lens[1]])
            .unwrap();
        self.m1
            .write(off + lens[0], &data[lens[0] + lens[1]..])
            .unwrap();
    }

    fn gather(&self, lens: [usize; 3], off: usize) -> Vec<u8> {
        let mut out = vec![0u8; lens.iter().sum()];
        self.m1.read(off, &mut out[..lens[0]]).unwrap();
        self.m2
            .read(off, &mut out[lens[0]..lens[0] + lens[1]])
            .unwrap();
        self.m1
            .read(off + lens[0], &mut out[lens[0] + lens[1]..])
            .unwrap();
        out
    }

    fn clear(&self) {
        let z = vec![0u8; self.m1.capacity()];
        self.m1.write(0, &z).unwrap();
        self.m2.write(0, &z[..self.m2.capacity()]).unwrap();
    }
}

fn one(wcs: Vec<WorkCompletion>) -> WorkCompletion {
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    wcs[0]
}

/// The two sides and their buffers.
#[derive(Clone, Copy)]
struct Sides<'x> {
    a: &'x End,
    b: &'x End,
    ab: &'x Bufs,
    bb: &'x Bufs,
}

/// Runs one operation from A to B (Read: A reads B's memory) and checks every byte
/// and every completion field.
fn case(sides: &Sides<'_>, op: Op, len: usize, layout: Layout, id: u64) {
    let Sides { a, b, ab, bb } = *sides;
    let data = pattern(len, id);
    ab.clear();
    bb.clear();
    let (slens, soff) = Bufs::shape(layout, len, 5, false);
    let (dlens, doff) = Bufs::shape(layout, len, 7, true);
    let imm = 0xdead_0000 | id as u32;
    let inv_mr = (op == Op::SendInv).then(|| {
        let options = softiwarp::MrOptions {
            remote_invalidate: true,
        };
        b.pd.reg_mr_with(64, 0x7700_0000 + id * 0x100, all_access(), options)
            .unwrap()
    });
    let what = format!("{op:?} len {len} {layout:?}");
    match op {
        Op::Read => {
            // Source at B (remote), sink SGEs at A.
            bb.m1.write(soff, &data).unwrap();
            let remote = bb.m1.iova() + soff as u64;
            let wr = SendWr::rdma_read(id, ab.sges(dlens, doff, layout), remote, bb.m1.rkey())
                .with_flags(SendFlags::SIGNALED);
            a.qp.post_send(wr).unwrap();
            let wc = one(a.send_wcs(1));
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode, wc.byte_len as usize),
                (id, WcStatus::Success, WcOpcode::RdmaRead, len),
                "{what}"
            );
            assert!(ab.gather(dlens, doff) == data, "{what}: data");
        }
        Op::Write | Op::WriteImm => {
            ab.scatter(slens, soff, &data);
            let remote = bb.m1.iova() + doff as u64;
            let mut wr = SendWr::rdma_write(id, ab.sges(slens, soff, layout), remote, bb.m1.rkey());
            if op == Op::WriteImm {
                b.qp.post_recv(RecvWr::new(id + 1, vec![])).unwrap();
                wr.op = SendOp::RdmaWriteWithImm {
                    remote_addr: remote,
                    rkey: bb.m1.rkey(),
                    imm_data: imm,
                };
            }
            a.qp.post_send(wr.with_flags(SendFlags::SIGNALED)).unwrap();
            let wc = one(a.send_wcs(1));
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode, wc.byte_len as usize),
                (id, WcStatus::Success, WcOpcode::RdmaWrite, len),
                "{what}"
            );
            if op == Op::WriteImm {
                let r = one(b.recv_wcs(1));
                assert_eq!(
                    (r.wr_id, r.status, r.opcode, r.byte_len, r.imm_data),
                    (
                        id + 1,
                        WcStatus::Success,
                        WcOpcode::RecvRdmaWithImm,
                        0,
                        Some(imm)
                    ),
                    "{what}"
                );
                assert_eq!(r.wc_flags(), verbs::WcFlags::WITH_IMM);
            } else {
                // Placement is visible once a later message completes: a Send
                // behind the Write (RFC 5040 §5.5 ordering).
                b.qp.post_recv(RecvWr::new(id + 1, vec![])).unwrap();
                a.qp.post_send(SendWr::send(id + 2, vec![])).unwrap();
                one(b.recv_wcs(1));
            }
            let mut got = vec![0u8; len];
            bb.m1.read(doff, &mut got).unwrap();
            assert!(got == data, "{what}: data");
            // Nothing around the target range was touched.
            let mut edge = [0u8; 1];
            if doff > 0 {
                bb.m1.read(doff - 1, &mut edge).unwrap();
                assert_eq!(edge[0], 0, "{what}: byte before");
            }
            bb.m1.read(doff + len, &mut edge).unwrap();
            assert_eq!(edge[0], 0, "{what}: byte after");
        }
        Op::Send | Op::SendSe | Op::SendInv => {
            ab.scatter(slens, soff, &data);
            b.qp.post_recv(RecvWr::new(id + 1, bb.sges(dlens, doff, layout)))
                .unwrap();
            let mut wr = SendWr::send(id, ab.sges(slens, soff, layout));
            if let Some(m) = &inv_mr {
                wr.op = SendOp::SendWithInv {
                    invalidate_rkey: m.rkey(),
                };
            }
            if op == Op::SendSe {
                wr.flags |= SendFlags::SOLICITED;
            }
            a.qp.post_send(wr.with_flags(SendFlags::SIGNALED)).unwrap();
            let wc = one(a.send_wcs(1));
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode, wc.byte_len as usize),
                (id, WcStatus::Success, WcOpcode::Send, len),
                "{what}"
            );
            let r = one(b.recv_wcs(1));
            assert_eq!(
                (r.wr_id, r.status, r.opcode, r.byte_len as usize),
                (id + 1, WcStatus::Success, WcOpcode::Recv, len),
                "{what}"
            );
            match &inv_mr {
                Some(m) => {
                    assert_eq!(r.invalidated_stag, Some(m.stag()), "{what}");
                    assert_eq!(m.state(), MrState::Invalid, "{what}");
                }
                None => assert_eq!(r.invalidated_stag, None),
            }
            assert!(bb.gather(dlens, doff) == data, "{what}: data");
        }
    }
}

#[test]
fn every_opcode_every_size_every_layout() {
    let s = Setup::default();
    let (a, b) = pair(&s);
    let m = a.conn.as_ref().unwrap().mulpdu().unwrap();
    assert!(m > 1400, "MULPDU {m}");
    let tagged = m - 14;
    let untagged = m - 18;
    let sizes = [
        0,
        1,
        m - 1,
        m,
        m + 1,
        tagged - 1,
        tagged,
        tagged + 1,
        untagged - 1,
        untagged,
        untagged + 1,
        64 * 1024,
    ];
    let ab = Bufs::new(&a, 0x1000_0000, ROOM);
    let bb = Bufs::new(&b, 0x5000_0000, ROOM);
    let sides = Sides {
        a: &a,
        b: &b,
        ab: &ab,
        bb: &bb,
    };
    let mut id = 1000u64;
    for op in OPS {
        for &len in &sizes {
            for layout in [Layout::Aligned, Layout::Unaligned, Layout::Multi] {
                case(&sides, op, len, layout, id);
                id += 10;
            }
        }
    }
    assert_eq!(a.qp.state(), QpState::Rts);
    assert_eq!(b.qp.state(), QpState::Rts);
    assert_eq!(a.dev.next_async_event(Duration::ZERO), None);
    assert_eq!(b.dev.next_async_event(Duration::ZERO), None);
    a.assert_quiet(Duration::from_millis(20));
    b.assert_quiet(Duration::ZERO);
}

#[test]
fn sixteen_mib_write_read_send_multi_sge_unaligned() {
    const LEN: usize = 16 << 20;
    let s = Setup::default();
    let (a, b) = pair(&s);
    let room = LEN as u64 + 4096;
    let ab = Bufs::new(&a, 0x1_0000_0000, room);
    let bb = Bufs::new(&b, 0x2_0000_0000, room);
    let sides = Sides {
        a: &a,
        b: &b,
        ab: &ab,
        bb: &bb,
    };
    for (i, op) in [Op::Write, Op::Read, Op::Send].into_iter().enumerate() {
        case(&sides, op, LEN, Layout::Multi, 7 + i as u64 * 10);
    }
    let stats = a.qp.stats();
    // 16 MiB each way at ~1.4 KiB per FPDU.
    assert!(stats.ulpdus_tx > 20_000, "{stats:?}");
    // B placed (nearly) everything straight from the TCP receive buffer.
    let rx = b.qp.stats();
    assert!(
        rx.ulpdus_rx_in_place * 10 >= rx.ulpdus_rx * 9,
        "in place: {rx:?}"
    );
    println!("B: {rx:?}");
}

#[test]
fn inline_sends_and_writes() {
    let (a, b) = pair(&Setup::default());
    let rbuf = b.pd.reg_mr(4096, 0x3000, all_access()).unwrap();
    b.qp.post_recv(RecvWr::new(50, vec![rbuf.sge(0, 2048)]))
        .unwrap();
    let small = pattern(256, 1);
    a.qp.post_send(SendWr::send_inline(1, small.clone()).with_flags(SendFlags::SIGNALED))
        .unwrap();
    a.qp.post_send(
        SendWr::rdma_write_inline(2, b"inline write".to_vec(), rbuf.iova() + 3000, rbuf.rkey())
            .with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    // Too long for the QP's inline limit: refused on the caller's thread.
    assert!(matches!(
        a.qp.post_send(SendWr::send_inline(3, vec![0; 257])),
        Err(VerbsError::InlineTooLong { len: 257, max: 256 })
    ));
    let w = a.send_wcs(2);
    assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    let r = one(b.recv_wcs(1));
    assert_eq!((r.wr_id, r.byte_len), (50, 256));
    let got = rbuf.to_vec();
    assert_eq!(&got[..256], &small[..]);
    // The Write went before the Send's completion was seen? Not guaranteed: check
    // after one more message.
    b.qp.post_recv(RecvWr::new(51, vec![])).unwrap();
    a.qp.post_send(SendWr::send(4, vec![])).unwrap();
    one(b.recv_wcs(1));
    assert_eq!(&rbuf.to_vec()[3000..3012], b"inline write");
}

#[test]
fn fast_register_and_local_invalidate() {
    let (a, b) = pair(&Setup::default());
    // B allocates an MR for fast registration and registers it with a send WR.
    let fr = b.pd.alloc_mr(64 * 1024).unwrap();
    assert_eq!(fr.state(), MrState::Invalid);
    let reg = FastReg {
        mr: fr.stag(),
        key: 0x42,
        access: all_access(),
        iova: 0x7000_0000,
        length: 64 * 1024,
    };
    b.qp.post_send(SendWr::fast_reg(1, reg).with_flags(SendFlags::SIGNALED))
        .unwrap();
    let wc = one(b.send_wcs(1));
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::RegMr));
    assert_eq!(fr.stag(), reg.new_stag());
    assert_eq!(fr.state(), MrState::Valid);
    // A writes into it by the new rkey, then reads it back.
    let src = a.pd.reg_mr(64 * 1024, 0x10_0000, all_access()).unwrap();
    let data = pattern(10_000, 9);
    src.write(0, &data).unwrap();
    a.qp.post_send(
        SendWr::rdma_write(2, vec![src.sge(0, 10_000)], 0x7000_0000 + 333, fr.rkey())
            .with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    a.qp.post_send(
        SendWr::rdma_read(
            3,
            vec![src.sge(20_000, 10_000)],
            0x7000_0000 + 333,
            fr.rkey(),
        )
        .with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    let w = a.send_wcs(2);
    assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    assert!(src.to_vec()[20_000..30_000] == data[..]);
    // B invalidates it locally; a second Local Invalidate of an invalid STag is fine.
    for id in [4, 5] {
        b.qp.post_send(SendWr::local_inv(id, fr.stag()).with_flags(SendFlags::SIGNALED))
            .unwrap();
        let wc = one(b.send_wcs(1));
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (id, WcStatus::Success, WcOpcode::LocalInv)
        );
    }
    assert_eq!(fr.state(), MrState::Invalid);
    // Registered again with the next key: valid again, the old rkey is stale.
    let again = FastReg {
        mr: fr.stag(),
        key: 0x43,
        ..reg
    };
    b.qp.post_send(SendWr::fast_reg(6, again).with_flags(SendFlags::SIGNALED))
        .unwrap();
    assert_eq!(one(b.send_wcs(1)).status, WcStatus::Success);
    assert_eq!(fr.stag(), again.new_stag());
    assert_ne!(fr.stag(), reg.new_stag());
    // A failing local operation (Local Invalidate of an unknown STag) completes with
    // an error and takes the QP to Error (siw: MW bind error).
    b.qp.post_send(
        SendWr::local_inv(7, verbs::Stag::new(0xabcd, 1).unwrap()).with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    let wc = one(b.send_wcs(1));
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::MwBindErr));
    b.wait_state(QpState::Error);
}

#[test]
fn many_wrs_in_flight_with_queue_full_backpressure() {
    const DEPTH: u32 = 32;
    const TOTAL: u64 = 3000;
    let s = Setup {
        cap: cap(DEPTH, 2),
        ..Setup::default()
    };
    let (a, b) = pair(&s);
    let src = a.pd.reg_mr(1 << 20, 0x100_0000, all_access()).unwrap();
    let back = a.pd.reg_mr(1 << 20, 0x200_0000, all_access()).unwrap();
    let dst = b.pd.reg_mr(1 << 20, 0x300_0000, all_access()).unwrap();
    let rbuf =
        b.pd.reg_mr(DEPTH as u64 * 4096, 0x400_0000, all_access())
            .unwrap();
    let data = pattern(1 << 20, 77);
    src.write(0, &data).unwrap();
    dst.write(0, &data).unwrap();
    let mut recv_slot = 0u64;
    let mut recvs_posted = 0u64;
    let mut recvs_done = 0u64;
    let mut sends_posted = 0u64;
    let (mut posted, mut done, mut full) = (0u64, 0u64, 0u64);
    let mut next_id = 0u64;
    let mut last_send_id = None::<u64>;
    let mut last_recv_id = None::<u64>;
    while done < TOTAL {
        // Keep B's receive queue full.
        loop {
            let wr = RecvWr::new(
                1_000_000 + recvs_posted,
                vec![rbuf.sge((recv_slot % DEPTH as u64) * 4096, 4096)],
            );
            match b.qp.post_recv(wr) {
                Ok(()) => {
                    recvs_posted += 1;
                    recv_slot += 1;
                }
                Err(VerbsError::QueueFull { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        // Post on A until its SQ is full; Sends only while B has receives for them.
        while posted < TOTAL {
            let off = (next_id % 200) * 4096;
            let op = next_id % 3;
            if op == 0 && sends_posted >= recvs_posted {
                break;
            }
            let wr = match op {
                0 => {
                    let mut wr = SendWr::send(next_id, vec![src.sge(off, 4096)]);
                    wr.flags |= SendFlags::SIGNALED;
                    wr
                }
                1 => SendWr::rdma_write(
                    next_id,
                    vec![src.sge(off, 4096)],
                    dst.iova() + off,
                    dst.rkey(),
                )
                .with_flags(SendFlags::SIGNALED),
                _ => SendWr::rdma_read(
                    next_id,
                    vec![back.sge(off, 4096)],
                    dst.iova() + off,
                    dst.rkey(),
                )
                .with_flags(SendFlags::SIGNALED),
            };
            match a.qp.post_send(wr) {
                Ok(()) => {
                    if op == 0 {
                        sends_posted += 1;
                    }
                    posted += 1;
                    next_id += 1;
                }
                Err(VerbsError::QueueFull { depth, .. }) => {
                    assert_eq!(depth, DEPTH);
                    // The engine may have retired some since.
                    assert!(a.qp.query_qp().sq_outstanding <= u64::from(DEPTH));
                    full += 1;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        for wc in a.scq.poll_wait(64, WAIT).unwrap() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            assert!(
                last_send_id.is_none_or(|l| wc.wr_id == l + 1),
                "order: {wc:?}"
            );
            last_send_id = Some(wc.wr_id);
            if wc.opcode == WcOpcode::RdmaRead {
                let off = ((wc.wr_id % 200) * 4096) as usize;
                let mut got = vec![0u8; 4096];
                back.read(off, &mut got).unwrap();
                assert!(got[..] == data[off..off + 4096], "read {}", wc.wr_id);
            }
            done += 1;
        }
        for wc in b.rcq.poll(usize::MAX).unwrap() {
            assert_eq!(wc.status, WcStatus::Success);
            assert!(last_recv_id.is_none_or(|l| wc.wr_id == l + 1));
            last_recv_id = Some(wc.wr_id);
            recvs_done += 1;
        }
    }
    assert!(full > 0, "the SQ never filled");
    let rest = End::wait_n(&b.rcq, (sends_posted - recvs_done) as usize);
    assert!(rest.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(a.qp.query_qp().sq_outstanding, 0);
    assert_eq!(b.qp.query_qp().rq_outstanding, recvs_posted - sends_posted);
}

#[test]
fn ord_and_ird_limits_are_negotiated_and_reached() {
    let s = Setup {
        ird_ord: (2, 2),
        cap: cap(64, 1),
        ..Setup::default()
    };
    let (a, b) = pair(&s);
    let qa = a.qp.query_qp();
    assert_eq!((qa.ord, qa.ird), (2, 2));
    let agreed = a.conn.as_ref().unwrap().agreed().unwrap();
    assert_eq!((agreed.ord, agreed.ird), (2, 2));
    let remote = b.pd.reg_mr(1 << 20, 0x900_0000, all_access()).unwrap();
    let data = pattern(1 << 20, 5);
    remote.write(0, &data).unwrap();
    let local = a.pd.reg_mr(1 << 20, 0x100_0000, all_access()).unwrap();
    // 32 Reads of 32 KiB at once: at most ORD = 2 may be outstanding; B's IRD of 2
    // would terminate the connection at the third.
    let wrs: Vec<SendWr> = (0..32u64)
        .map(|i| {
            SendWr::rdma_read(
                i,
                vec![local.sge(i * 32768, 32768)],
                remote.iova() + i * 32768,
                remote.rkey(),
            )
            .with_flags(SendFlags::SIGNALED)
        })
        .collect();
    a.qp.post_send_list(wrs).unwrap();
    let w = a.send_wcs(32);
    for (i, wc) in w.iter().enumerate() {
        assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success));
    }
    assert!(local.to_vec() == data);
    assert_ord_ird_respected(&a, &b, 2);
}

#[test]
fn post_calls_validate_on_the_callers_thread() {
    let (a, b) = pair(&Setup {
        cap: cap(4, 2),
        ..Setup::default()
    });
    let mr = a.pd.reg_mr(4096, 0x1000, all_access()).unwrap();
    let sge = mr.sge(0, 8);
    assert!(matches!(
        a.qp.post_send(SendWr::send(1, vec![sge; 3])),
        Err(VerbsError::TooManySges { num_sge: 3, max: 2 })
    ));
    assert!(matches!(
        a.qp.post_recv(RecvWr::new(1, vec![sge; 3])),
        Err(VerbsError::TooManySges { .. })
    ));
    // An atomic's target must be 8-byte aligned, its result buffer one 8-byte SGE.
    let atomic = |remote_addr, len| SendWr {
        wr_id: 1,
        op: SendOp::AtomicFetchAdd {
            remote_addr,
            rkey: mr.rkey(),
            add: 1,
        },
        flags: SendFlags::empty(),
        payload: verbs::Payload::Sges(vec![mr.sge(0, len)]),
    };
    assert!(matches!(
        a.qp.post_send(atomic(0x1004, 8)),
        Err(VerbsError::InvalidArgument {
            what: "remote_addr"
        })
    ));
    assert!(matches!(
        a.qp.post_send(atomic(0x1000, 4)),
        Err(VerbsError::InvalidArgument { what: "sg_list" })
    ));
    assert!(matches!(
        a.qp.post_send(SendWr::rdma_write(1, vec![sge], u64::MAX - 2, mr.rkey())),
        Err(VerbsError::InvalidArgument {
            what: "remote_addr"
        })
    ));
    assert!(matches!(
        a.qp.post_send(SendWr::send(1, vec![]).with_flags(SendFlags::INLINE)),
        Err(VerbsError::InvalidArgument { what: "send_flags" })
    ));
    // A WR refused never completes; nothing went to the engine.
    a.assert_quiet(Duration::from_millis(20));
    // The receive queue fills at max_recv_wr.
    for i in 0..4 {
        b.qp.post_recv(RecvWr::new(i, vec![])).unwrap();
    }
    assert!(matches!(
        b.qp.post_recv(RecvWr::new(9, vec![])),
        Err(VerbsError::QueueFull {
            queue: verbs::WorkQueue::Recv,
            depth: 4
        })
    ));
    assert_eq!(b.qp.query_qp().rq_outstanding, 4);
    // A bad lkey passes the post call and fails when the WR runs (local protection
    // error), taking the QP to Error.
    let bad = Sge::new(0x1000, 8, verbs::Stag::new(0x777, 0).unwrap());
    a.qp.post_send(SendWr::send(5, vec![bad]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    let wc = one(a.send_wcs(1));
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::LocProtErr));
    a.wait_state(QpState::Error);
    // MR rights: remote write without local write is refused at registration.
    assert!(matches!(
        a.pd.reg_mr(64, 0, AccessFlags::REMOTE_WRITE),
        Err(VerbsError::InvalidAccessFlags(_))
    ));
}

/// MPA peer-to-peer mode with each RTR kind (RFC 6581): the QPs start their MSNs after
/// the RTR's (a Send RTR takes MSN 1 of QN 0, a Read RTR MSN 1 of QN 1), receives posted
/// in Init before the connection are kept, and Sends and Reads flow both ways.
#[test]
fn peer_to_peer_rtr_kinds_with_receives_posted_before_the_connection() {
    use mpa::negotiate::{CrcPolicy, LocalSettings};
    use mpa::wire::{RtrKind, RtrKinds};
    for kind in [RtrKind::Write, RtrKind::Read, RtrKind::Send] {
        let (a, b) = devices(&Setup::default());
        let responder = LocalSettings {
            crc: CrcPolicy::Wanted,
            rtr: RtrKinds::ALL,
            ..LocalSettings::default()
        };
        let offer = RtrKinds {
            send: kind == RtrKind::Send,
            write: kind == RtrKind::Write,
            read: kind == RtrKind::Read,
        };
        let initiator = LocalSettings {
            crc: CrcPolicy::Wanted,
            p2p: true,
            rtr: offer,
            ..LocalSettings::default()
        };
        let listener = b.dev.listen_with(PORT, 4, Some(responder)).unwrap();
        let params = softiwarp::transport::MpaParams {
            private_data: vec![],
            ird: 4,
            ord: 4,
            settings: Some(initiator),
        };
        let ca = a.dev.connect_qp(addr(2), PORT, params, &a.qp).unwrap();
        // Bound: A's QP is in Init; receives go in before anything arrives.
        assert_eq!(a.qp.state(), QpState::Init);
        for i in 0..3 {
            a.qp.post_recv(RecvWr::new(10 + i, vec![])).unwrap();
        }
        let req = listener.next_request(WAIT).unwrap();
        b.qp.modify_state(QpState::Init).unwrap();
        let rb = b.pd.reg_mr(4096, 0x9000, all_access()).unwrap();
        for i in 0..3 {
            b.qp.post_recv(RecvWr::new(20 + i, vec![rb.sge(i * 100, 100)]))
                .unwrap();
        }
        let cb = req.accept_qp(&b.qp, b"", 4, 4).unwrap();
        let est = ca.wait_established(WAIT).unwrap();
        cb.wait_established(WAIT).unwrap();
        assert_eq!(est.agreed.rtr, Some(kind), "{kind:?}");
        let expected_msn = if kind == RtrKind::Send { 2 } else { 1 };
        assert_eq!(est.initial_msn.send_tx, expected_msn);
        a.wait_state(QpState::Rts);
        b.wait_state(QpState::Rts);
        // A -> B Send (MSN 2 after a Send RTR), B -> A Send, Reads both ways.
        let ra = a.pd.reg_mr(4096, 0x1000, all_access()).unwrap();
        ra.write(0, b"from A").unwrap();
        rb.write(1000, b"from B").unwrap();
        a.qp.post_send(SendWr::send(1, vec![ra.sge(0, 6)]).with_flags(SendFlags::SIGNALED))
            .unwrap();
        b.qp.post_send(SendWr::send(2, vec![]).with_flags(SendFlags::SIGNALED))
            .unwrap();
        a.qp.post_send(
            SendWr::rdma_read(3, vec![ra.sge(100, 6)], rb.iova() + 1000, rb.rkey())
                .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
        b.qp.post_send(
            SendWr::rdma_read(4, vec![rb.sge(2000, 6)], ra.iova(), ra.rkey())
                .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
        let wa = a.send_wcs(2);
        let wb = b.send_wcs(2);
        assert!(
            wa.iter().chain(&wb).all(|w| w.status == WcStatus::Success),
            "{kind:?}: {wa:?} {wb:?}"
        );
        assert_eq!(one(b.recv_wcs(1)).wr_id, 20);
        assert_eq!(one(a.recv_wcs(1)).wr_id, 10);
        let got = rb.to_vec();
        assert_eq!(&got[..6], b"from A");
        assert_eq!(&got[2000..2006], b"from A");
        assert_eq!(&ra.to_vec()[100..106], b"from B");
        assert_eq!(a.qp.state(), QpState::Rts, "{kind:?}");
        assert_eq!(b.qp.state(), QpState::Rts, "{kind:?}");
    }
}

/// Verbs ordering across devices: a receive posted before the peer was told to send is
/// there when the Send arrives, even if the engine is busy receiving (the post call
/// queues the WR where the engine looks before every received ULPDU).
#[test]
fn a_receive_posted_before_the_peer_sends_is_always_there() {
    let (a, b) = pair(&Setup::default());
    let src = a.pd.reg_mr(1 << 16, 0x10_0000, all_access()).unwrap();
    let dst = b.pd.reg_mr(1 << 16, 0x90_0000, all_access()).unwrap();
    for i in 0..1000u64 {
        // B's engine is still receiving the Write when A has completed it and the
        // receive is posted.
        let len = 1 + (i * 7919 % (1 << 16)) as u32;
        a.qp.post_send(
            SendWr::rdma_write(i, vec![src.sge(0, len)], dst.iova(), dst.rkey())
                .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
        assert_eq!(one(a.send_wcs(1)).status, WcStatus::Success);
        b.qp.post_recv(RecvWr::new(i, vec![])).unwrap();
        a.qp.post_send(SendWr::send(i, vec![])).unwrap();
        let r = one(b.recv_wcs(1));
        assert_eq!((r.wr_id, r.status), (i, WcStatus::Success));
    }
    assert_eq!(b.qp.state(), QpState::Rts);
}
