//! The C entry points called in-process, as a C program would: NULL and bad arguments
//! get `EINVAL`, the channels' fds are readable exactly while an event waits and honour
//! `O_NONBLOCK`, a completion event carries the CQ and its context, and a flushed WR
//! polls out in libibverbs' layout. The device is this process's (one UDP end with no
//! peer: nothing here needs one).

#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::Once;

use cxgb4::ffi::types::*;
use softiwarp::abi::{IbvQpAttr, IBV_QPS_ERR, IBV_QPS_INIT, IBV_QP_STATE};
use softiwarp::boundary::errno;
use softiwarp::{cm, context, events, ibv, ops};

fn device() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var(
            "SOFTIWARP_DEVICE",
            "link=udp:127.0.0.1:7360,peer=127.0.0.1:7361,ip=10.77.60.1/24",
        );
    });
}

/// True if `fd` is readable now.
fn readable(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd for the call.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

fn set_nonblocking(fd: i32) {
    // SAFETY: fcntl on our own fd.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK), 0);
    }
}

fn open() -> *mut IbvContext {
    device();
    let mut n = 0;
    // SAFETY: the C API as a C program uses it.
    unsafe {
        let list = context::ibv_get_device_list(&mut n);
        assert_eq!(n, 1);
        let ctx = context::ibv_open_device(*list);
        context::ibv_free_device_list(list);
        assert!(!ctx.is_null());
        ctx
    }
}

/// Polls `cq` as a program does until `n` completions came (at most 10 s), into `wc`;
/// returns how many came.
///
/// # Safety
///
/// `cq` is a live CQ of the library.
unsafe fn poll_n(cq: *mut IbvCq, n: usize, wc: &mut [IbvWc]) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut got = 0;
    while got < n && std::time::Instant::now() < deadline {
        let room = c_int::try_from(wc.len() - got).unwrap();
        // SAFETY: `wc[got..]` has `room` entries (the caller's contract for `cq`).
        let r = unsafe { ops::poll_cq(cq, room, wc[got..].as_mut_ptr()) };
        assert!(r >= 0, "ibv_poll_cq: {r}");
        got += r as usize;
        if r == 0 {
            std::thread::yield_now();
        }
    }
    got
}

/// An RC QP of `pd` on `cq` (`depth` WRs per queue, one SGE), moved to INIT then to
/// ERR: every post is flushed (the completions come from the device: poll for them).
///
/// # Safety
///
/// `pd` and `cq` are live objects of the library.
unsafe fn qp_in_error(pd: *mut IbvPd, cq: *mut IbvCq, depth: u32) -> *mut IbvQp {
    let mut attr = IbvQpInitAttr {
        qp_context: null_mut(),
        send_cq: cq,
        recv_cq: cq,
        srq: null_mut(),
        cap: IbvQpCap {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: IBV_QPT_RC,
        sq_sig_all: 0,
    };
    // SAFETY: the C API as a C program uses it (the caller's contract).
    unsafe {
        let qp = ibv::ibv_create_qp(pd, &mut attr);
        assert!(!qp.is_null());
        let mut qa = std::mem::zeroed::<IbvQpAttr>();
        qa.qp_state = IBV_QPS_INIT;
        assert_eq!(ibv::ibv_modify_qp(qp, &mut qa, IBV_QP_STATE), 0);
        qa.qp_state = IBV_QPS_ERR;
        assert_eq!(ibv::ibv_modify_qp(qp, &mut qa, IBV_QP_STATE), 0);
        qp
    }
}

#[test]
fn null_and_bad_arguments_are_einval() {
    let ctx = open();
    // SAFETY: the C API, with the NULLs the test is about.
    unsafe {
        assert!(ibv::ibv_alloc_pd(null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(ibv::ibv_dealloc_pd(null_mut()), libc::EINVAL);
        assert_eq!(ibv::ibv_dereg_mr(null_mut()), libc::EINVAL);
        assert_eq!(ibv::ibv_destroy_cq(null_mut()), libc::EINVAL);
        assert_eq!(ibv::ibv_destroy_qp(null_mut()), libc::EINVAL);
        assert_eq!(
            ops::post_send(null_mut(), null_mut(), null_mut()),
            libc::EINVAL
        );
        assert_eq!(
            ops::post_recv(null_mut(), null_mut(), null_mut()),
            libc::EINVAL
        );
        assert_eq!(ops::poll_cq(null_mut(), 1, null_mut()), -1);
        let mut attr = std::mem::zeroed::<IbvPortAttr>();
        assert_eq!(ibv::ibv_query_port(ctx, 2, &mut attr), libc::EINVAL);
        assert_eq!(ibv::ibv_query_port(ctx, 1, &mut attr), 0);
        assert_eq!(attr.state, 4, "PORT_ACTIVE");
        let pd = ibv::ibv_alloc_pd(ctx);
        assert!(!pd.is_null());
        // A NULL buffer, a zero length, remote write without local write.
        let mut buf = vec![0u8; 64];
        let p = buf.as_mut_ptr().cast::<c_void>();
        assert!(ibv::ibv_reg_mr(pd, null_mut(), 64, 1).is_null());
        assert!(ibv::ibv_reg_mr(pd, p, 0, 1).is_null());
        assert!(ibv::ibv_reg_mr(pd, p, 64, 2).is_null());
        assert_eq!(errno(), libc::EINVAL);
        // Memory that is not mapped, or not writable for an MR the device writes: EFAULT,
        // as the kernel's pinning says (the device would fault in it later).
        assert!(ibv::ibv_reg_mr(pd, 0x1000 as *mut c_void, 64, 1).is_null());
        assert_eq!(errno(), libc::EFAULT);
        let text = ibv::ibv_wc_status_str as *const () as *mut c_void;
        assert!(ibv::ibv_reg_mr(pd, text, 64, 1).is_null());
        assert_eq!(errno(), libc::EFAULT);
        let ro = ibv::ibv_reg_mr(pd, text, 64, 0);
        assert!(
            !ro.is_null(),
            "code pages are readable: a send-only MR over them is fine"
        );
        assert_eq!(ibv::ibv_dereg_mr(ro), 0);
        // Relaxed ordering (an optional-range bit) is accepted and ignored.
        let mr = ibv::ibv_reg_mr_iova2(pd, p, 64, p as u64, 1 | 2 | 0x10_0000);
        assert!(!mr.is_null());
        assert_eq!((*mr).addr, p);
        assert_eq!((*mr).lkey, (*mr).rkey);
        // A PD with an MR is busy.
        assert_eq!(ibv::ibv_dealloc_pd(pd), libc::EBUSY);
        assert_eq!(ibv::ibv_dereg_mr(mr), 0);
        assert_eq!(ibv::ibv_dealloc_pd(pd), 0);
        assert_eq!(cm::rdma_bind_addr(null_mut(), null_mut()), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(cm::rdma_get_cm_event(null_mut(), null_mut()), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(cm::rdma_ack_cm_event(null_mut()), -1);
        assert_eq!(context::ibv_close_device(ctx), 0);
    }
}

#[test]
fn a_cm_channel_fd_is_readable_exactly_while_an_event_waits() {
    device();
    // SAFETY: the C API as a C program uses it.
    unsafe {
        let ch = cm::rdma_create_event_channel();
        assert!(!ch.is_null());
        let fd = (*ch).fd;
        set_nonblocking(fd);
        let mut ev: *mut RdmaCmEvent = null_mut();
        assert_eq!(cm::rdma_get_cm_event(ch, &mut ev), -1);
        assert_eq!(errno(), libc::EAGAIN);
        assert!(!readable(fd));
        let mut id: *mut RdmaCmId = null_mut();
        let ctx_marker = 0x5eed_usize as *mut c_void;
        assert_eq!(cm::rdma_create_id(ch, &mut id, ctx_marker, 0x0106), 0);
        assert_eq!((*id).context, ctx_marker);
        assert_eq!((*id).channel, ch);
        // A UDP-port-space id is refused.
        let mut id2: *mut RdmaCmId = null_mut();
        assert_eq!(cm::rdma_create_id(ch, &mut id2, null_mut(), 0x0111), -1);
        // Nobody answers ARP for .9 on the link: ADDR_ERROR after the timeout.
        let dst = softiwarp::boundary::sockaddr_in("10.77.60.9:7000".parse().unwrap());
        let dst_p = std::ptr::addr_of!(dst) as *mut libc::sockaddr;
        assert_eq!(cm::rdma_resolve_addr(id, null_mut(), dst_p, 200), 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !readable(fd) {
            assert!(std::time::Instant::now() < deadline, "no event");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(cm::rdma_get_cm_event(ch, &mut ev), 0);
        assert_eq!((*ev).id, id);
        assert_eq!((*ev).event, 1, "RDMA_CM_EVENT_ADDR_ERROR");
        assert!((*ev).status < 0);
        assert!(!readable(fd), "one event, taken");
        assert_eq!(cm::rdma_ack_cm_event(ev), 0);
        let s = std::ffi::CStr::from_ptr(cm::rdma_event_str(1));
        assert_eq!(s.to_str().unwrap(), "RDMA_CM_EVENT_ADDR_ERROR");
        assert_eq!(cm::rdma_destroy_id(id), 0);
        // A destroyed id or channel is refused, not read (perftest's retry path reuses
        // freed ones).
        assert_eq!(cm::rdma_resolve_addr(id, null_mut(), dst_p, 200), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(cm::rdma_destroy_id(id), -1);
        assert_eq!(errno(), libc::EINVAL);
        cm::rdma_destroy_event_channel(ch);
        assert_eq!(cm::rdma_get_cm_event(ch, &mut ev), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(cm::rdma_create_id(ch, &mut id, null_mut(), 0x0106), -1);
        assert_eq!(errno(), libc::EINVAL);
        cm::rdma_destroy_event_channel(ch); // twice: nothing happens
    }
}

#[test]
fn a_flushed_receive_is_one_cq_event_and_one_wc() {
    let ctx = open();
    // SAFETY: the C API as a C program uses it.
    unsafe {
        let pd = ibv::ibv_alloc_pd(ctx);
        let chan = ibv::ibv_create_comp_channel(ctx);
        assert!(!chan.is_null());
        let fd = (*chan).fd;
        let marker = 0xc0ffee_usize as *mut c_void;
        let cq = ibv::ibv_create_cq(ctx, 4, marker, chan, 0);
        assert!(!cq.is_null());
        // The errno value itself, as libibverbs returns it (and in errno too).
        assert_eq!(
            ibv::ibv_destroy_comp_channel(chan),
            libc::EBUSY,
            "a CQ uses it"
        );
        assert_eq!(errno(), libc::EBUSY);
        let qp = qp_in_error(pd, cq, 2);
        assert_eq!(ops::req_notify_cq(cq, 0), 0);
        assert!(!readable(fd));
        let mut buf = [0u8; 16];
        let mr = ibv::ibv_reg_mr(pd, buf.as_mut_ptr().cast(), 16, 1);
        let mut sge = IbvSge {
            addr: buf.as_ptr() as u64,
            length: 16,
            lkey: (*mr).lkey,
        };
        let mut wr = IbvRecvWr {
            wr_id: 77,
            next: null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad: *mut IbvRecvWr = null_mut();
        assert_eq!(ops::post_recv(qp, &mut wr, &mut bad), 0);
        let (mut ev_cq, mut ev_ctx) = (null_mut(), null_mut());
        assert_eq!(ibv::ibv_get_cq_event(chan, &mut ev_cq, &mut ev_ctx), 0);
        assert_eq!((ev_cq, ev_ctx), (cq, marker));
        ibv::ibv_ack_cq_events(cq, 1);
        assert!(!readable(fd), "one event per arm");
        let mut wc = [std::mem::zeroed::<IbvWc>(); 4];
        assert_eq!(poll_n(cq, 1, &mut wc), 1);
        assert_eq!(
            (wc[0].wr_id, wc[0].status, wc[0].opcode),
            (77, 5, 128),
            "FLUSH_ERR, RECV"
        );
        assert_eq!(wc[0].qp_num, (*qp).qp_num);
        set_nonblocking(fd);
        assert_eq!(ibv::ibv_get_cq_event(chan, &mut ev_cq, &mut ev_ctx), -1);
        assert_eq!(errno(), libc::EAGAIN);
        assert_eq!(ibv::ibv_destroy_qp(qp), 0);
        assert_eq!(ibv::ibv_dereg_mr(mr), 0);
        assert_eq!(ibv::ibv_destroy_cq(cq), 0);
        assert_eq!(ibv::ibv_destroy_comp_channel(chan), 0);
        assert_eq!(ibv::ibv_dealloc_pd(pd), 0);
        assert_eq!(context::ibv_close_device(ctx), 0);
    }
}

#[test]
fn a_closed_context_leaves_nothing_in_the_list_of_contexts() {
    let before = events::event_contexts();
    for _ in 0..500 {
        let ctx = open();
        // SAFETY: the C API as a C program uses it.
        assert_eq!(unsafe { context::ibv_close_device(ctx) }, 0);
    }
    // Other tests of this binary open a few contexts meanwhile; 500 closed ones used
    // to stay listed (each keeping its context's memory) until a port event.
    let after = events::event_contexts();
    assert!(
        after <= before + 8,
        "{before} contexts listed before, {after} after"
    );
}

/// One atomic `struct ibv_send_wr` (`opcode` 5 Compare-and-Swap or 6 Fetch-and-Add).
fn atomic_wr(wr_id: u64, opcode: u32, sge: &mut IbvSge, remote_addr: u64) -> IbvSendWr {
    IbvSendWr {
        wr_id,
        next: null_mut(),
        sg_list: sge,
        num_sge: 1,
        opcode,
        send_flags: 2, // IBV_SEND_SIGNALED
        imm_data_or_invalidate_rkey: 0,
        wr: IbvSendWrWr {
            atomic: IbvAtomicWr {
                remote_addr,
                compare_add: 1,
                swap: 2,
                rkey: 0x1234,
            },
        },
        qp_type_xrc_remote_srqn: 0,
        _bind_mw_tso: [0; 6],
    }
}

#[test]
fn atomics_are_reported_accepted_and_complete_with_their_opcodes() {
    let ctx = open();
    // SAFETY: the C API as a C program uses it.
    unsafe {
        let mut attr = std::mem::zeroed::<IbvDeviceAttr>();
        assert_eq!(ibv::ibv_query_device(ctx, &mut attr), 0);
        assert_eq!(attr.atomic_cap, 1, "IBV_ATOMIC_HCA");
        let pd = ibv::ibv_alloc_pd(ctx);
        let mut buf = [0u64; 4];
        let addr = buf.as_mut_ptr().cast::<c_void>();
        // IBV_ACCESS_REMOTE_ATOMIC (8) needs IBV_ACCESS_LOCAL_WRITE (1).
        assert!(ibv::ibv_reg_mr(pd, addr, 32, 8).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mr = ibv::ibv_reg_mr(pd, addr, 32, 1 | 8);
        assert!(!mr.is_null());
        let cq = ibv::ibv_create_cq(ctx, 8, null_mut(), null_mut(), 0);
        let qp = qp_in_error(pd, cq, 4);
        let mut sge = IbvSge {
            addr: buf.as_ptr() as u64,
            length: 8,
            lkey: (*mr).lkey,
        };
        let mut bad: *mut IbvSendWr = null_mut();
        // A misaligned target, and a result buffer that is not 8 bytes: EINVAL, the
        // WR named in bad_wr, nothing completes.
        let mut wr = atomic_wr(1, 6, &mut sge, 0x1004);
        assert_eq!(ops::post_send(qp, &mut wr, &mut bad), libc::EINVAL);
        assert_eq!(bad, &mut wr as *mut IbvSendWr);
        let mut short = IbvSge { length: 4, ..sge };
        let mut wr = atomic_wr(2, 5, &mut short, 0x1000);
        assert_eq!(ops::post_send(qp, &mut wr, &mut bad), libc::EINVAL);
        // In Error both are accepted and flushed, with the atomic WC opcodes.
        let mut cas = atomic_wr(3, 5, &mut sge, 0x1000);
        let mut faa = atomic_wr(4, 6, &mut sge, 0x1008);
        cas.next = &mut faa;
        assert_eq!(ops::post_send(qp, &mut cas, &mut bad), 0);
        let mut wc = [std::mem::zeroed::<IbvWc>(); 4];
        assert_eq!(poll_n(cq, 2, &mut wc), 2);
        assert_eq!(
            [wc[0], wc[1]].map(|w| (w.wr_id, w.status, w.opcode)),
            [(3, 5, 3), (4, 5, 4)],
            "WR_FLUSH_ERR; IBV_WC_COMP_SWAP, IBV_WC_FETCH_ADD"
        );
        assert_eq!(ops::poll_cq(cq, 4, wc.as_mut_ptr()), 0);
        assert_eq!(ibv::ibv_destroy_qp(qp), 0);
        assert_eq!(ibv::ibv_dereg_mr(mr), 0);
        assert_eq!(ibv::ibv_destroy_cq(cq), 0);
        assert_eq!(ibv::ibv_dealloc_pd(pd), 0);
        assert_eq!(context::ibv_close_device(ctx), 0);
    }
}
