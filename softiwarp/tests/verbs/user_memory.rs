//! MRs over the application's own memory (`UserMemory::new` then `Pd::reg_user_mr`, what
//! `ibv_reg_mr(pd, addr, len, access)` of a C application becomes): an RDMA Write and a Send from the peer
//! land straight in that memory, an RDMA Read of it and a Send from it carry its bytes,
//! all checked byte for byte in the memory itself; the bytes around the region are
//! never touched.

#![allow(unsafe_code)] // wrapping memory is unsafe by contract; each use says why it holds

use crate::support::devices::*;
use softiwarp::resources::stag_table::MrOptions;
use softiwarp::resources::user_memory::UserMemory;
use verbs::{AccessFlags, RecvWr, SendFlags, SendWr, WcStatus};

const LEN: usize = 64 << 10;
/// Guard bytes on each side of the registered range.
const GUARD: usize = 4096;

#[test]
fn writes_reads_and_sends_go_straight_to_and_from_user_memory() {
    let (a, b) = pair(&Setup::default());
    // B's "application memory": a guard, the region, a guard.
    let mut backing = vec![0xEEu8; GUARD + LEN + GUARD];
    let base = backing.as_mut_ptr();
    // SAFETY: `backing` is not moved, resized or dropped until after `umr` and every WR
    // naming it are gone (the end of this function, after the last completion and the
    // explicit drops below), and this test reads it only through `base` after
    // completions.
    let mem = unsafe { UserMemory::new(base.add(GUARD), LEN) }.unwrap();
    let umr =
        b.pd.reg_user_mr(
            mem,
            base as u64 + GUARD as u64,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            MrOptions::default(),
        )
        .unwrap();
    assert_eq!(umr.iova(), base as u64 + GUARD as u64);
    let view = |off: usize, n: usize| -> Vec<u8> {
        // SAFETY: inside `backing`; no WR is outstanding when this is called.
        unsafe { std::slice::from_raw_parts(base.add(off), n) }.to_vec()
    };
    let src = a.pd.reg_mr(LEN as u64, 0x1000, all_access()).unwrap();
    let sink = a.pd.reg_mr(LEN as u64, 0x10_0000, all_access()).unwrap();
    let data = pattern(LEN, 11);
    src.write(0, &data).unwrap();

    // 1. A writes into B's user memory.
    a.qp.post_send(
        SendWr::rdma_write(1, vec![src.sge(0, LEN as u32)], umr.iova(), umr.rkey())
            .with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    assert_eq!(a.send_wcs(1)[0].status, WcStatus::Success);
    // The Write completed at A once passed to TCP; a Read behind it (fenced by
    // ordering on the same QP) returns only after B placed the Write.
    a.qp.post_send(
        SendWr::rdma_read(2, vec![sink.sge(0, LEN as u32)], umr.iova(), umr.rkey())
            .with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    assert_eq!(a.send_wcs(1)[0].status, WcStatus::Success);
    assert_eq!(view(GUARD, LEN), data, "the Write landed in user memory");
    assert_eq!(sink.to_vec(), data, "the Read carried user memory's bytes");

    // 2. B's application changes its memory directly; a Send from it carries the change.
    let changed = pattern(LEN, 12);
    // SAFETY: inside `backing`; no WR is outstanding.
    unsafe { std::ptr::copy_nonoverlapping(changed.as_ptr(), base.add(GUARD), LEN) };
    a.qp.post_recv(RecvWr::new(3, vec![sink.sge(0, LEN as u32)]))
        .unwrap();
    b.qp.post_send(SendWr::send(4, vec![umr.sge(0, LEN as u32)]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    assert_eq!(b.send_wcs(1)[0].status, WcStatus::Success);
    let r = a.recv_wcs(1);
    assert_eq!(
        (r[0].status, r[0].byte_len),
        (WcStatus::Success, LEN as u32)
    );
    assert_eq!(sink.to_vec(), changed);

    // 3. A Send from A lands in a receive posted on user memory.
    let third = pattern(LEN, 13);
    src.write(0, &third).unwrap();
    b.qp.post_recv(RecvWr::new(5, vec![umr.sge(0, LEN as u32)]))
        .unwrap();
    a.qp.post_send(SendWr::send(6, vec![src.sge(0, LEN as u32)]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    assert_eq!(a.send_wcs(1)[0].status, WcStatus::Success);
    assert_eq!(b.recv_wcs(1)[0].status, WcStatus::Success);
    assert_eq!(view(GUARD, LEN), third);
    // The guards were never touched.
    assert!(view(0, GUARD).iter().all(|&x| x == 0xEE));
    assert!(view(GUARD + LEN, GUARD).iter().all(|&x| x == 0xEE));
    umr.dereg().unwrap();
    drop(umr);
    drop((a, b));
    drop(backing);
}
