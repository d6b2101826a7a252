//! Every operation between two QP engines wired back to back, byte-exact: Send (and
//! SE / Invalidate / inline), RDMA Write (and with Immediate, inline), RDMA Read,
//! Local Invalidate, Fast Register; sizes 0, 1, MULPDU - 1, MULPDU, MULPDU + 1, the
//! segment payload room +-1, 64 KiB and 16 MiB; unaligned offsets and iovas;
//! multi-SGE on both ends.

use crate::support::qp::*;
use softiwarp::rdmap::engine::QpEvent;
use softiwarp::resources::stag_table::MemoryRegion;
use softiwarp::MrState;
use verbs::{AccessFlags, FastReg, RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus};

const SIZES: &[usize] = &[
    0,
    1,
    MULPDU - 1,
    MULPDU,
    MULPDU + 1,
    TAGGED_ROOM - 1,
    TAGGED_ROOM,
    TAGGED_ROOM + 1,
    UNTAGGED_ROOM - 1,
    UNTAGGED_ROOM,
    UNTAGGED_ROOM + 1,
    2 * UNTAGGED_ROOM + 1,
    64 * 1024,
];

/// Splits `len` bytes into three SGE lengths (some may be 0 for tiny lengths).
fn split3(len: usize) -> [usize; 3] {
    let a = len / 3;
    let b = len / 5;
    [a, b, len - a - b]
}

/// SGEs covering `lens` consecutive pieces: the middle one in `mr2`, the others in
/// `mr1`, starting at buffer offset `off` in each.
fn sges(mr1: &MemoryRegion, mr2: &MemoryRegion, off: usize, lens: [usize; 3]) -> Vec<Sge> {
    let s0 = Sge::new(mr1.iova() + off as u64, lens[0] as u32, mr1.stag());
    let s1 = Sge::new(mr2.iova() + off as u64, lens[1] as u32, mr2.stag());
    let s2 = Sge::new(
        mr1.iova() + (off + lens[0]) as u64,
        lens[2] as u32,
        mr1.stag(),
    );
    vec![s0, s1, s2]
}

/// Writes `data` into the two MRs as [`sges`] lays it out.
fn scatter(mr1: &MemoryRegion, mr2: &MemoryRegion, off: usize, lens: [usize; 3], data: &[u8]) {
    mr1.write(off, &data[..lens[0]]).unwrap();
    mr2.write(off, &data[lens[0]..lens[0] + lens[1]]).unwrap();
    mr1.write(off + lens[0], &data[lens[0] + lens[1]..])
        .unwrap();
}

/// Reads back what [`scatter`] wrote.
fn gather(mr1: &MemoryRegion, mr2: &MemoryRegion, off: usize, lens: [usize; 3]) -> Vec<u8> {
    let v1 = mr1.to_vec();
    let v2 = mr2.to_vec();
    let mut out = v1[off..off + lens[0]].to_vec();
    out.extend_from_slice(&v2[off..off + lens[1]]);
    out.extend_from_slice(&v1[off + lens[0]..off + lens[0] + lens[2]]);
    out
}

fn assert_quiet(p: &mut Pair) {
    assert!(p.rx_errors.is_empty(), "rx errors: {:?}", p.rx_errors);
    assert_eq!(p.a.events(), vec![]);
    assert_eq!(p.b.events(), vec![]);
}

fn one_wc(wcs: Vec<verbs::WorkCompletion>) -> verbs::WorkCompletion {
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    wcs[0]
}

fn send_case(len: usize, multi: bool) {
    let mut p = Pair::new(cap(8, 4));
    let (src_off, dst_off) = (3usize, 5usize);
    let room = (len + 64) as u64;
    let s1 = p.a.reg(0x1000_0003, room, all_access());
    let s2 = p.a.reg(0x2000_0001, room, all_access());
    let r1 = p.b.reg(0x3000_0007, room, all_access());
    let r2 = p.b.reg(0x4000_0005, room, all_access());
    let data = pattern(len, len as u64 + 1);
    let (slens, rlens) = if multi {
        (split3(len), {
            let [a, b, c] = split3(len);
            [c, a, b]
        })
    } else {
        ([len, 0, 0], [len, 0, 0])
    };
    scatter(&s1, &s2, src_off, slens, &data);
    p.b.qp
        .post_recv(RecvWr::new(9, sges(&r1, &r2, dst_off, rlens)))
        .unwrap();
    let wr = SendWr::send(1, sges(&s1, &s2, src_off, slens)).with_flags(SendFlags::SIGNALED);
    p.a.qp.post_send(wr).unwrap();
    p.pump();
    assert_quiet(&mut p);
    let wc = one_wc(p.a.send_wcs());
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(wc.byte_len as usize, len);
    let wc = one_wc(p.b.recv_wcs());
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (9, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(wc.byte_len as usize, len);
    assert_eq!((wc.imm_data, wc.invalidated_stag), (None, None));
    assert_eq!(gather(&r1, &r2, dst_off, rlens), data, "len {len}");
    // Bytes before the receive buffer are untouched.
    assert!(r1.to_vec()[..dst_off].iter().all(|&b| b == 0));
}

#[test]
fn send_every_size_single_and_multi_sge() {
    for &len in SIZES {
        send_case(len, false);
        send_case(len, true);
    }
}

fn write_case(len: usize, multi: bool, with_imm: bool) {
    let mut p = Pair::new(cap(8, 4));
    let room = (len + 64) as u64;
    let s1 = p.a.reg(0x1000_0003, room, all_access());
    let s2 = p.a.reg(0x2000_0001, room, all_access());
    let target = p.b.reg(0x7000_0009, room + 16, all_access());
    let data = pattern(len, len as u64 + 7);
    let slens = if multi { split3(len) } else { [len, 0, 0] };
    scatter(&s1, &s2, 1, slens, &data);
    let raddr = target.iova() + 11;
    let op = if with_imm {
        p.b.post_recv(4, &target, 0, 0);
        SendOp::RdmaWriteWithImm {
            remote_addr: raddr,
            rkey: target.stag(),
            imm_data: 0xdead_beef,
        }
    } else {
        SendOp::RdmaWrite {
            remote_addr: raddr,
            rkey: target.stag(),
        }
    };
    let wr = SendWr {
        wr_id: 2,
        op,
        flags: SendFlags::SIGNALED,
        payload: verbs::Payload::Sges(sges(&s1, &s2, 1, slens)),
    };
    p.a.qp.post_send(wr).unwrap();
    p.pump();
    assert_quiet(&mut p);
    let wc = one_wc(p.a.send_wcs());
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(wc.byte_len as usize, len);
    let got = target.to_vec();
    assert_eq!(&got[11..11 + len], &data[..], "len {len}");
    assert!(got[..11].iter().all(|&b| b == 0));
    assert!(got[11 + len..].iter().all(|&b| b == 0));
    let rwcs = p.b.recv_wcs();
    if with_imm {
        let wc = one_wc(rwcs);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data),
            (
                4,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                0,
                Some(0xdead_beef)
            )
        );
    } else {
        assert!(rwcs.is_empty());
    }
}

#[test]
fn write_every_size_single_and_multi_sge() {
    for &len in SIZES {
        write_case(len, false, false);
        write_case(len, true, false);
    }
}

#[test]
fn write_with_immediate_every_size() {
    for &len in SIZES {
        write_case(len, len % 2 == 0, true);
    }
}

fn read_case(len: usize, multi: bool) {
    let mut p = Pair::new(cap(8, 4));
    let room = (len + 64) as u64;
    let src = p.b.reg(0x5000_0001, room, all_access());
    let d1 = p.a.reg(0x6000_0003, room, all_access());
    let d2 = p.a.reg(0x6100_0005, room, all_access());
    let data = pattern(len, len as u64 + 13);
    src.write(7, &data).unwrap();
    let dlens = if multi { split3(len) } else { [len, 0, 0] };
    let wr = SendWr::rdma_read(3, sges(&d1, &d2, 2, dlens), src.iova() + 7, src.stag())
        .with_flags(SendFlags::SIGNALED);
    p.a.qp.post_send(wr).unwrap();
    p.pump();
    assert_quiet(&mut p);
    let wc = one_wc(p.a.send_wcs());
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (3, WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(wc.byte_len as usize, len);
    assert_eq!(gather(&d1, &d2, 2, dlens), data, "len {len}");
    assert!(p.b.send_wcs().is_empty() && p.b.recv_wcs().is_empty());
    assert_eq!(p.a.qp.reads_outstanding(), 0);
    assert_eq!(p.b.qp.read_responses_pending(), 0);
}

#[test]
fn read_every_size_single_and_multi_sge() {
    for &len in SIZES {
        read_case(len, false);
        read_case(len, true);
    }
}

/// 16 MiB each way for Send, Write and Read, byte-exact.
#[test]
fn sixteen_mib_send_write_read() {
    const LEN: usize = 16 << 20;
    let data = pattern(LEN, 16);
    let mut p = Pair::new(cap(8, 1));
    let src = p.a.reg(0x1_0000_0000, LEN as u64, all_access());
    src.write(0, &data).unwrap();
    let rbuf = p.b.reg(0x2_0000_0000, LEN as u64, all_access());
    let wbuf = p.b.reg(0x3_0000_0000, LEN as u64, all_access());
    let back = p.a.reg(0x4_0000_0000, LEN as u64, all_access());
    p.b.post_recv(1, &rbuf, 0, LEN as u32);
    let full = |mr: &MemoryRegion| vec![Sge::new(mr.iova(), LEN as u32, mr.stag())];
    p.a.qp
        .post_send(SendWr::send(10, full(&src)).with_flags(SendFlags::SIGNALED))
        .unwrap();
    p.a.qp
        .post_send(
            SendWr::rdma_write(11, full(&src), wbuf.iova(), wbuf.stag())
                .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
    p.a.qp
        .post_send(
            SendWr::rdma_read(12, full(&back), wbuf.iova(), wbuf.stag())
                .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
    p.pump();
    assert_quiet(&mut p);
    let ids: Vec<_> = p.a.send_wcs().iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        ids,
        [
            (10, WcStatus::Success),
            (11, WcStatus::Success),
            (12, WcStatus::Success)
        ]
    );
    assert_eq!(one_wc(p.b.recv_wcs()).byte_len as usize, LEN);
    assert!(rbuf.to_vec() == data, "send data");
    assert!(wbuf.to_vec() == data, "write data");
    assert!(back.to_vec() == data, "read data");
    // 16 MiB Send at 1424 bytes per segment + Write at 1428 + Read Response at 1428,
    // plus one Read Request.
    let expected = LEN.div_ceil(UNTAGGED_ROOM) + 2 * LEN.div_ceil(TAGGED_ROOM) + 1;
    assert_eq!(p.moved, expected);
}

#[test]
fn send_variants_se_inline_and_invalidate() {
    let mut p = Pair::new(cap(8, 2));
    let rbuf = p.b.reg(0x1000, 4096, all_access());
    let exposed = p.b.reg_invalidatable(0x9000, 64, all_access());
    for i in 0..4 {
        p.b.post_recv(100 + i, &rbuf, i * 1024, 1024);
    }
    // Inline Send with SE.
    p.a.qp
        .post_send(
            SendWr::send_inline(1, b"hello".to_vec())
                .with_flags(SendFlags::SIGNALED | SendFlags::SOLICITED),
        )
        .unwrap();
    // Send with Invalidate of B's exposed MR, with and without SE.
    for (id, se) in [(2u64, false), (3, true)] {
        let mut wr = SendWr::send_inline(id, vec![id as u8; 10]);
        wr.op = SendOp::SendWithInv {
            invalidate_rkey: exposed.stag(),
        };
        if se {
            wr.flags |= SendFlags::SOLICITED;
        }
        p.a.qp
            .post_send(wr.with_flags(SendFlags::SIGNALED))
            .unwrap();
    }
    // Zero-length Send.
    p.a.qp
        .post_send(SendWr::send(4, vec![]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    p.pump();
    assert_quiet(&mut p);
    assert_eq!(p.a.send_wcs().len(), 4);
    let r = p.b.recv_wcs();
    let summary: Vec<_> = r
        .iter()
        .map(|w| (w.wr_id, w.status, w.byte_len, w.invalidated_stag))
        .collect();
    assert_eq!(
        summary,
        [
            (100, WcStatus::Success, 5, None),
            (101, WcStatus::Success, 10, Some(exposed.stag())),
            (102, WcStatus::Success, 10, Some(exposed.stag())),
            (103, WcStatus::Success, 0, None),
        ]
    );
    assert_eq!(r[1].wc_flags(), verbs::WcFlags::WITH_INV);
    assert_eq!(exposed.state(), MrState::Invalid);
    let got = rbuf.to_vec();
    assert_eq!(&got[..5], b"hello");
    assert_eq!(&got[1024..1034], &[2u8; 10]);
    assert_eq!(&got[2048..2058], &[3u8; 10]);
}

#[test]
fn inline_write_and_zero_length_write_rtr() {
    let mut p = Pair::new(cap(8, 2));
    let t = p.b.reg(0x4000, 64, all_access());
    p.a.qp
        .post_send(
            SendWr::rdma_write_inline(1, b"inline!".to_vec(), t.iova() + 3, t.stag())
                .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
    // The MPA peer-to-peer Write RTR: zero-length Write to STag 1, TO 0, which
    // names no MR: it must be accepted without a check.
    p.a.qp
        .post_send(
            SendWr::rdma_write(2, vec![], 0, verbs::Stag::from_raw(1))
                .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
    p.pump();
    assert_quiet(&mut p);
    assert_eq!(p.a.send_wcs().len(), 2);
    assert_eq!(&t.to_vec()[3..10], b"inline!");
}

/// A zero-length Read (the MPA Read RTR) is answered by a zero-length Read
/// Response, whatever STags it names.
#[test]
fn zero_length_read() {
    let mut p = Pair::new(cap(8, 2));
    p.a.qp
        .post_send(
            SendWr::rdma_read(1, vec![], 0, verbs::Stag::from_raw(0x1234_5600))
                .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
    p.tx_a();
    let rr = p.a_to_b[0].clone();
    assert_eq!(rr.len(), 46);
    p.pump();
    assert_quiet(&mut p);
    let wc = one_wc(p.a.send_wcs());
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 0));
}

#[test]
fn many_wrs_in_flight_complete_in_order() {
    let mut p = Pair::new(cap(256, 2));
    let src = p.a.reg(0x10_0000, 1 << 20, all_access());
    let dst = p.b.reg(0x20_0000, 1 << 20, all_access());
    let rd = p.a.reg(0x30_0000, 1 << 20, all_access());
    let data = pattern(1 << 20, 5);
    src.write(0, &data).unwrap();
    dst.write(0, &data).unwrap();
    let rbuf = p.b.reg(0x40_0000, 1 << 20, all_access());
    for i in 0..64u64 {
        p.b.post_recv(1000 + i, &rbuf, i * 4096, 4096);
    }
    let mut expected = Vec::new();
    for i in 0..192u64 {
        let off = i * 4096;
        let len = 1 + (i as u32 * 37) % 4000;
        let s = vec![Sge::new(src.iova() + off, len, src.stag())];
        let wr = match i % 3 {
            0 => SendWr::send(i, s),
            1 => SendWr::rdma_write(i, s, dst.iova() + off, dst.stag()),
            _ => SendWr::rdma_read(
                i,
                vec![Sge::new(rd.iova() + off, len, rd.stag())],
                dst.iova() + off + 1,
                dst.stag(),
            ),
        };
        // Every other WR unsignaled: only the signaled ones complete.
        let wr = if i % 2 == 0 {
            wr.with_flags(SendFlags::SIGNALED)
        } else {
            wr
        };
        if i % 2 == 0 {
            expected.push(i);
        }
        p.a.qp.post_send(wr).unwrap();
    }
    p.pump();
    assert_quiet(&mut p);
    let got: Vec<u64> = p.a.send_wcs().iter().map(|w| w.wr_id).collect();
    assert_eq!(got, expected, "signaled completions in posting order");
    let r: Vec<u64> = p.b.recv_wcs().iter().map(|w| w.wr_id).collect();
    assert_eq!(r, (1000..1064).collect::<Vec<_>>());
    let rdv = rd.to_vec();
    let rbv = rbuf.to_vec();
    for (k, i) in (0..192u64).step_by(3).enumerate() {
        let off = (i * 4096) as usize;
        let len = 1 + (i as usize * 37) % 4000;
        assert_eq!(
            &rbv[k * 4096..k * 4096 + len],
            &data[off..off + len],
            "send {i}"
        );
    }
    for i in (2..192u64).step_by(3) {
        let off = (i * 4096) as usize;
        let len = 1 + (i as usize * 37) % 4000;
        assert_eq!(
            &rdv[off..off + len],
            &data[off + 1..off + 1 + len],
            "read {i}"
        );
    }
    assert_eq!(p.a.qp.sq_outstanding(), 0);
}

#[test]
fn sq_sig_all_signals_everything() {
    let mut p = Pair::with(cap(8, 1), |i| i.sq_sig_all = true, |_| {});
    let t = p.b.reg(0, 64, all_access());
    p.a.qp
        .post_send(SendWr::rdma_write_inline(1, vec![1], 0, t.stag()))
        .unwrap();
    p.pump();
    assert_eq!(one_wc(p.a.send_wcs()).wr_id, 1);
}

/// ORD: at most `ord` Read Requests leave before a response returns; the rest wait
/// and go as responses come back.
#[test]
fn ord_limit_reached() {
    let mut p = Pair::with(cap(16, 1), |i| i.ord = 2, |_| {});
    let src = p.b.reg(0, 4096, all_access());
    let dst = p.a.reg(0, 4096, all_access());
    src.write(0, &pattern(4096, 3)).unwrap();
    for i in 0..5u64 {
        let s = vec![Sge::new(i * 100, 100, dst.stag())];
        p.a.qp
            .post_send(SendWr::rdma_read(i, s, i * 100, src.stag()).with_flags(SendFlags::SIGNALED))
            .unwrap();
    }
    while p.tx_a() {}
    assert_eq!(p.a_to_b.len(), 2, "ORD 2: two Read Requests");
    assert_eq!(p.a.qp.reads_outstanding(), 2);
    assert!(!p.a.qp.wants_transmit());
    // One request answered: exactly one more leaves.
    p.rx_b();
    while p.tx_b() {}
    while p.rx_a() {}
    while p.tx_a() {}
    assert_eq!(p.a_to_b.len(), 2);
    p.pump();
    assert_quiet(&mut p);
    assert_eq!(p.a.send_wcs().len(), 5);
    assert_eq!(&dst.to_vec()[..500], &src.to_vec()[..500]);
}

/// A Read WR with more scatter SGEs than ORD: its Read Requests go one ORD credit
/// at a time.
#[test]
fn multi_sge_read_with_ord_one() {
    let mut p = Pair::with(cap(16, 4), |i| i.ord = 1, |_| {});
    let src = p.b.reg(0, 4096, all_access());
    let dst = p.a.reg(0, 4096, all_access());
    src.write(0, &pattern(4096, 8)).unwrap();
    let s: Vec<Sge> = (0..4)
        .map(|k| Sge::new(1000 * k, 300, dst.stag()))
        .collect();
    p.a.qp
        .post_send(SendWr::rdma_read(1, s, 10, src.stag()).with_flags(SendFlags::SIGNALED))
        .unwrap();
    p.pump();
    assert_quiet(&mut p);
    assert_eq!(one_wc(p.a.send_wcs()).byte_len, 1200);
    let d = dst.to_vec();
    let sv = src.to_vec();
    for k in 0..4usize {
        assert_eq!(
            &d[1000 * k..1000 * k + 300],
            &sv[10 + 300 * k..10 + 300 * (k + 1)]
        );
    }
}

/// IRD: the responder queues up to IRD Read Requests; with ORD <= IRD many Reads
/// flow; one more than IRD outstanding is "Invalid MSN - no buffer available".
#[test]
fn ird_limit_reached() {
    let mut p = Pair::with(cap(32, 1), |i| i.ord = 3, |i| i.ird = 3);
    let src = p.b.reg(0, 4096, all_access());
    let dst = p.a.reg(0, 4096, all_access());
    for i in 0..20u64 {
        let s = vec![Sge::new(i * 10, 10, dst.stag())];
        p.a.qp
            .post_send(SendWr::rdma_read(i, s, 0, src.stag()).with_flags(SendFlags::SIGNALED))
            .unwrap();
    }
    p.pump();
    assert_quiet(&mut p);
    assert_eq!(p.a.send_wcs().len(), 20);

    // A requester that ignores the negotiated IRD.
    let mut p = Pair::with(cap(32, 1), |i| i.ord = 3, |i| i.ird = 2);
    let src = p.b.reg(0, 4096, all_access());
    let dst = p.a.reg(0, 4096, all_access());
    for i in 0..3u64 {
        let s = vec![Sge::new(i * 10, 10, dst.stag())];
        p.a.qp
            .post_send(SendWr::rdma_read(i, s, 0, src.stag()).with_flags(SendFlags::SIGNALED))
            .unwrap();
    }
    while p.tx_a() {}
    assert_eq!(p.a_to_b.len(), 3);
    while p.rx_b() {}
    assert_eq!(p.b.qp.read_responses_pending(), 0, "flushed by the error");
    let cause = ddp_rdmap::ErrorCause::DdpUntagged(
        ddp_rdmap::terminate::DdpUntaggedCode::InvalidMsnNoBuffer,
    );
    assert_eq!(
        p.rx_errors,
        vec![('b', softiwarp::rdmap::engine::RxError::Protocol { cause })]
    );
    assert!(p.b.events().contains(&QpEvent::TerminateQueued { cause }));
    // The requester learns of it: its Reads fail with a remote error / flush.
    p.pump();
    let st: Vec<_> = p.a.send_wcs().iter().map(|w| w.status).collect();
    assert_eq!(
        st,
        [
            WcStatus::RemInvReqErr,
            WcStatus::WrFlushErr,
            WcStatus::WrFlushErr
        ]
    );
}

/// IBV_SEND_FENCE: a fenced WR does not start until every earlier RDMA Read has
/// completed; without the fence it goes right behind the Read Request.
#[test]
fn fence_after_read() {
    for fence in [false, true] {
        let mut p = Pair::new(cap(8, 1));
        let src = p.b.reg(0, 4096, all_access());
        let rbuf = p.b.reg(0x10000, 4096, all_access());
        let dst = p.a.reg(0, 4096, all_access());
        p.b.post_recv(7, &rbuf, 0, 4096);
        p.a.qp
            .post_send(
                SendWr::rdma_read(1, vec![Sge::new(0, 2000, dst.stag())], 0, src.stag())
                    .with_flags(SendFlags::SIGNALED),
            )
            .unwrap();
        let mut send = SendWr::send_inline(2, b"after".to_vec()).with_flags(SendFlags::SIGNALED);
        if fence {
            send.flags |= SendFlags::FENCE;
        }
        p.a.qp.post_send(send).unwrap();
        while p.tx_a() {}
        let ops: Vec<u8> = p.a_to_b.iter().map(|u| u[1] & 0xf).collect();
        if fence {
            assert_eq!(ops, [0x1], "only the Read Request before the response");
            assert!(!p.a.qp.wants_transmit());
            // Deliver the request and the response; now the Send goes.
            while p.rx_b() {}
            while p.tx_b() {}
            while p.rx_a() {}
            assert!(p.a.qp.wants_transmit());
            assert!(p.tx_a());
            assert_eq!(p.a_to_b.back().unwrap()[1] & 0xf, 0x3);
        } else {
            assert_eq!(ops, [0x1, 0x3]);
        }
        p.pump();
        assert_quiet(&mut p);
        let ids: Vec<u64> = p.a.send_wcs().iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, [1, 2], "completions stay in posting order");
    }
}

/// Read Responses interleave with a long untagged Send segment by segment, but
/// never with a Write (tagged) message.
#[test]
fn read_responses_interleave_with_sends_not_writes() {
    let mut p = Pair::new(cap(8, 1));
    let big = p.b.reg(0, 64 * 1024, all_access());
    let a_dst = p.a.reg(0, 64 * 1024, all_access());
    let a_src = p.a.reg(0x100000, 64 * 1024, all_access());
    p.a.post_recv(1, &a_dst, 0, 64 * 1024);
    // A asks B for 8 KiB; B meanwhile sends 64 KiB and then writes 64 KiB.
    p.a.qp
        .post_send(SendWr::rdma_read(
            1,
            vec![Sge::new(0x100000, 8192, a_src.stag())],
            0,
            big.stag(),
        ))
        .unwrap();
    p.b.qp
        .post_send(SendWr::send(2, vec![Sge::new(0, 65536, big.stag())]))
        .unwrap();
    p.b.qp
        .post_send(SendWr::rdma_write(
            3,
            vec![Sge::new(0, 65536, big.stag())],
            0,
            a_dst.stag(),
        ))
        .unwrap();
    // B starts its Send, then the Read Request arrives.
    assert!(p.tx_b());
    assert!(p.tx_a());
    assert!(p.rx_b());
    while p.tx_b() {}
    let ops: Vec<u8> = p.b_to_a.iter().map(|u| u[1] & 0xf).collect();
    let first_rr = ops.iter().position(|&o| o == 0x2).unwrap();
    let last_send = ops.iter().rposition(|&o| o == 0x3).unwrap();
    assert!(
        first_rr < last_send,
        "Read Response interleaved with the Send"
    );
    // No Write segment between the first and last Read Response segment.
    let last_rr = ops.iter().rposition(|&o| o == 0x2).unwrap();
    assert!(ops[first_rr..=last_rr].iter().all(|&o| o != 0x0));
    p.pump();
    assert!(p.rx_errors.is_empty(), "{:?}", p.rx_errors);
}

/// Send with Invalidate of a fast-registered MR of the QP's PD (allowed without
/// any option): the MR is invalidated before the receive completes, the receive's
/// WC carries its STag with `IBV_WC_WITH_INV`, and a Write by the old rkey then
/// fails with Invalid STag.
#[test]
fn send_with_invalidate_of_fast_registered_mr() {
    let mut p = Pair::new(cap(8, 2));
    let rbuf = p.b.reg(0x1000, 64, all_access());
    p.b.post_recv(100, &rbuf, 0, 64);
    let fr = p.b.mrs.alloc_mr(p.b.pd, 256).unwrap();
    let reg = FastReg {
        mr: fr.stag(),
        key: p.b.mrs.fresh_key(&fr),
        access: all_access(),
        iova: 0x5000,
        length: 256,
    };
    p.b.mrs.fast_reg(&reg, p.b.pd).unwrap();
    assert_eq!(fr.state(), MrState::Valid);
    let mut wr = SendWr::send_inline(1, vec![7; 8]);
    wr.op = SendOp::SendWithInv {
        invalidate_rkey: reg.new_stag(),
    };
    p.a.qp
        .post_send(wr.with_flags(SendFlags::SIGNALED))
        .unwrap();
    p.pump();
    assert_quiet(&mut p);
    let r = p.b.recv_wcs();
    let got: Vec<_> = r
        .iter()
        .map(|w| (w.wr_id, w.status, w.byte_len, w.invalidated_stag))
        .collect();
    assert_eq!(got, [(100, WcStatus::Success, 8, Some(reg.new_stag()))]);
    assert!(r[0].wc_flags().contains(verbs::WcFlags::WITH_INV));
    assert_eq!(fr.state(), MrState::Invalid);
    assert_eq!(&rbuf.to_vec()[..8], &[7; 8]);
    assert_write_refused_as_invalid_stag(&mut p, 2, 0x5000, reg.new_stag());
}

/// A one-byte RDMA Write from A to `to` by `stag` is refused by B with DDP
/// "Invalid STag".
fn assert_write_refused_as_invalid_stag(p: &mut Pair, wr_id: u64, to: u64, stag: verbs::Stag) {
    p.a.qp
        .post_send(SendWr::rdma_write_inline(wr_id, vec![1], to, stag))
        .unwrap();
    p.pump();
    let cause = ddp_rdmap::ErrorCause::DdpTagged(ddp_rdmap::terminate::DdpTaggedCode::InvalidStag);
    assert!(p
        .rx_errors
        .contains(&('b', softiwarp::rdmap::engine::RxError::Protocol { cause })));
}

/// Local Invalidate and Fast Register through the SQ; a remote access with the old
/// key fails, with the new key succeeds.
#[test]
fn fast_register_and_local_invalidate() {
    let mut p = Pair::new(cap(8, 1));
    let fr = p.b.mrs.alloc_mr(p.b.pd, 8192).unwrap();
    let reg = FastReg {
        mr: fr.stag(),
        key: 0x42,
        access: all_access(),
        iova: 0xabc0_0000,
        length: 8192,
    };
    p.b.qp
        .post_send(SendWr::fast_reg(1, reg).with_flags(SendFlags::SIGNALED))
        .unwrap();
    p.pump();
    let wc = one_wc(p.b.send_wcs());
    assert_eq!((wc.opcode, wc.status), (WcOpcode::RegMr, WcStatus::Success));
    assert_eq!(fr.stag(), reg.new_stag());
    p.a.qp
        .post_send(
            SendWr::rdma_write_inline(1, b"fastreg".to_vec(), 0xabc0_0010, reg.new_stag())
                .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
    p.pump();
    assert_quiet(&mut p);
    assert_eq!(&fr.to_vec()[16..23], b"fastreg");
    p.b.qp
        .post_send(SendWr::local_inv(2, reg.new_stag()).with_flags(SendFlags::SIGNALED))
        .unwrap();
    p.pump();
    let wc = one_wc(p.b.send_wcs());
    assert_eq!(
        (wc.opcode, wc.status),
        (WcOpcode::LocalInv, WcStatus::Success)
    );
    assert_eq!(fr.state(), MrState::Invalid);
    // Now a Write to the invalidated STag is refused by B.
    assert_write_refused_as_invalid_stag(&mut p, 3, 0xabc0_0000, reg.new_stag());
}

#[test]
fn failed_local_operations_complete_with_mw_bind_err() {
    let mut p = Pair::new(cap(8, 1));
    let mr = p.a.reg(0, 64, all_access());
    // Local Invalidate with a wrong key.
    p.a.qp
        .post_send(SendWr::local_inv(1, mr.stag().inc_key()))
        .unwrap();
    p.a.qp.post_send(SendWr::send_inline(2, vec![1])).unwrap();
    p.pump();
    let wcs = p.a.send_wcs();
    let st: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(st, [(1, WcStatus::MwBindErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(p.a.qp.state(), verbs::QpState::Error);
    // The peer got an RDMAP Local Catastrophic Terminate.
    assert!(p.b.events().contains(&QpEvent::TerminateReceived {
        cause: Some(ddp_rdmap::ErrorCause::RdmapLocalCatastrophic { code: 0 })
    }));
}

/// An SGE whose lkey fails its check completes with LocProtErr and the QP goes to
/// Error; the peer receives a Terminate.
#[test]
fn bad_lkey_is_a_local_protection_error() {
    let mut p = Pair::new(cap(8, 2));
    let mr = p.a.reg(0x1000, 64, all_access());
    let bad = [
        Sge::new(0x1000, 8, mr.stag().inc_key()), // wrong key
        Sge::new(0x1000, 65, mr.stag()),          // beyond the MR
        Sge::new(0x0fff, 8, mr.stag()),           // below the MR
    ];
    for sge in bad {
        let mut p2 = Pair::new(cap(8, 2));
        let mr2 = p2.a.reg(0x1000, 64, all_access());
        let sge = Sge::new(sge.addr, sge.length, mr2.stag().with_key(sge.lkey.key()));
        p2.a.qp.post_send(SendWr::send(1, vec![sge])).unwrap();
        p2.pump();
        let wc = one_wc(p2.a.send_wcs());
        assert_eq!(wc.status, WcStatus::LocProtErr, "{sge:?}");
        assert_eq!(p2.a.qp.state(), verbs::QpState::Error);
    }
    // A Read into an MR without LOCAL_WRITE.
    let ro = p.a.reg(0x8000, 64, AccessFlags::REMOTE_READ);
    let src = p.b.reg(0, 64, all_access());
    p.a.qp
        .post_send(SendWr::rdma_read(
            1,
            vec![Sge::new(0x8000, 8, ro.stag())],
            0,
            src.stag(),
        ))
        .unwrap();
    p.pump();
    assert_eq!(one_wc(p.a.send_wcs()).status, WcStatus::LocProtErr);
    drop(mr);
}

/// A run of large Writes does not starve the peer's Read: its Read Response goes
/// out between two Writes, not after all of them.
#[test]
fn writes_do_not_starve_read_responses() {
    let mut p = Pair::new(cap(8, 1));
    let big = p.b.reg(0, 256 * 1024, all_access());
    let a_dst = p.a.reg(0, 256 * 1024, all_access());
    let a_rd = p.a.reg(0x100000, 4096, all_access());
    for i in 0..4u64 {
        p.b.qp
            .post_send(SendWr::rdma_write(
                i,
                vec![Sge::new(i * 65536, 65536, big.stag())],
                i * 65536,
                a_dst.stag(),
            ))
            .unwrap();
    }
    p.a.qp
        .post_send(
            SendWr::rdma_read(
                9,
                vec![Sge::new(0x100000, 4096, a_rd.stag())],
                0,
                big.stag(),
            )
            .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
    assert!(p.tx_b(), "the first Write starts");
    assert!(p.tx_a());
    assert!(p.rx_b(), "the Read Request arrives mid-Write");
    while p.tx_b() {}
    let ops: Vec<u8> = p.b_to_a.iter().map(|u| u[1] & 0xf).collect();
    let first_rr = ops.iter().position(|&o| o == 0x2).unwrap();
    let writes_before = ops[..first_rr].len();
    assert_eq!(
        writes_before,
        65536usize.div_ceil(TAGGED_ROOM),
        "the Read Response follows the first Write"
    );
    p.pump();
    assert_quiet(&mut p);
    assert_eq!(one_wc(p.a.send_wcs()).wr_id, 9);
}
