//! The context's ops table: the data-path functions rdma-core's header inlines call
//! through `ctx->ops` (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`,
//! `ibv_req_notify_cq`, `ibv_post_srq_recv` are `static inline` in
//! `<infiniband/verbs.h>`), and [`install`], which puts them in a new context's table
//! ([`crate::context::new_context`]). The C work requests become the soft device's
//! here ([`crate::ex`]'s `ibv_wr_*` API shares `sges` and `send_flags`).
//!
//! Pointer rules: [`crate::boundary`]'s contract. Every function runs in [`guard`];
//! handles are looked up among the live ones ([`crate::handles`]) first.

#![allow(unsafe_code)]

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;

use cxgb4::ffi::types::{IbvContextOps, IbvCq, IbvQp, IbvRecvWr, IbvSendWr, IbvWc};
use verbs::{
    Payload, QpCap, RecvWr, SendFlags, SendOp, SendWr, Sge, Stag, WcOpcode, WcStatus,
    WorkCompletion,
};

use crate::abi::*;
use crate::boundary::{err_ret, guard, minus_one, obj, slice, slice_mut, write_out};
use crate::objects::{lock, to_ibv_wc, CqObj, QpObj, SrqObj, POLL_CHUNK};

/// Puts this library's data path into the ops table of a new context: `poll_cq`,
/// `req_notify_cq`, `post_send`, `post_recv`, and `post_srq_recv` in its slot of
/// `_slots_13_24`.
pub fn install(ops: &mut IbvContextOps) {
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    let post_srq_recv: PostSrqRecvFn = post_srq_recv;
    ops._slots_13_24[POST_SRQ_RECV_SLOT] = post_srq_recv as *mut c_void;
}

// ------------------------------------------------------------------ CQ

/// `ibv_req_notify_cq` (ops slot): arms the CQ's event; one event for the next
/// completion (or at once if one is queued: the event is level-checked, so a
/// completion that raced the arm is never missed; it can be an event with nothing new
/// to poll, which the verbs loop tolerates). `EINVAL` if not a live CQ.
///
/// # Safety
///
/// The pointer contract of [`crate::boundary`].
pub unsafe extern "C" fn req_notify_cq(cq: *mut IbvCq, _solicited_only: c_int) -> c_int {
    guard("ibv_req_notify_cq", libc::EIO, || {
        let Some(c) = CqObj::get(cq.cast()) else {
            return err_ret(libc::EINVAL);
        };
        let Some(soft_cq) = c.s.cq() else {
            return err_ret(libc::EINVAL);
        };
        let Some(n) = lock(&c.s.notify).clone() else {
            // No channel: there is nowhere to deliver the event (libibverbs arms anyway).
            return 0;
        };
        n.armed.store(true, Ordering::Release);
        let waker = std::task::Waker::from(n.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let mut fut = soft_cq.wait_async();
        if std::future::Future::poll(std::pin::Pin::new(&mut fut), &mut cx).is_ready() {
            n.fire();
        }
        0
    })
}

/// `ibv_poll_cq` (ops slot): up to `num_entries` completions; -1 on a CQ in error
/// (overrun) and, with `errno` `EINVAL`, on a handle that is not a live CQ.
///
/// # Safety
///
/// The pointer contract of [`crate::boundary`].
pub unsafe extern "C" fn poll_cq(cq: *mut IbvCq, num_entries: c_int, wc: *mut IbvWc) -> c_int {
    guard("ibv_poll_cq", -1, || {
        let Some(c) = CqObj::get(cq.cast()).and_then(|c| c.s.cq()) else {
            return minus_one(libc::EINVAL);
        };
        let Ok(n) = usize::try_from(num_entries) else {
            return minus_one(libc::EINVAL);
        };
        // SAFETY: contract 3: `wc` has `num_entries` writable entries.
        let Some(out) = (unsafe { slice_mut(wc, n) }) else {
            return minus_one(libc::EINVAL);
        };
        let blank = WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0);
        let mut buf = [blank; POLL_CHUNK];
        let mut done = 0usize;
        while done < n {
            let want = (n - done).min(POLL_CHUNK);
            match c.poll_into(&mut buf[..want]) {
                Ok(got) => {
                    for (o, w) in out[done..].iter_mut().zip(&buf[..got]) {
                        *o = to_ibv_wc(w);
                    }
                    done += got;
                    if got < want {
                        break;
                    }
                }
                Err(_) if done > 0 => break,
                // Destroyed by a destroy that raced this call (README: it fails with
                // EINVAL).
                Err(sw::CqError::Destroyed { .. }) => return minus_one(libc::EINVAL),
                Err(e) => {
                    crate::stubs::warn_once("ibv_poll_cq", &e.to_string());
                    return minus_one(libc::EIO);
                }
            }
        }
        c_int::try_from(done).unwrap_or(c_int::MAX)
    })
}

// ------------------------------------------------------------------ QP

/// The soft SGE list of a C one.
pub(crate) fn sges(list: &[cxgb4::ffi::types::IbvSge]) -> Vec<Sge> {
    list.iter()
        .map(|s| Sge::new(s.addr, s.length, Stag::from_raw(s.lkey)))
        .collect()
}

/// The `num_sge` SGEs at `sg_list`, `EINVAL` for a negative count or one above `max`
/// (checked before the array is read, as rdma-core's providers do, so a count larger
/// than the array is refused and not read past it).
fn sge_list<'a>(
    sg_list: *mut cxgb4::ffi::types::IbvSge,
    num_sge: c_int,
    max: u32,
) -> Result<&'a [cxgb4::ffi::types::IbvSge], c_int> {
    let n = usize::try_from(num_sge).map_err(|_| libc::EINVAL)?;
    if n > max as usize {
        return Err(libc::EINVAL);
    }
    // SAFETY: contract 3: `sg_list` has `num_sge` readable entries.
    unsafe { slice(sg_list, n) }.ok_or(libc::EINVAL)
}

/// The soft send WR of a C one on a QP with capabilities `cap`; `Err(errno)` for an
/// opcode the device does not do, or SGEs / inline data beyond the QP's limits.
fn send_wr(wr: &IbvSendWr, cap: &QpCap) -> Result<SendWr, c_int> {
    let inline = wr.send_flags & IBV_SEND_INLINE != 0;
    // Inline data is limited by `max_inline_data` (below), not `max_send_sge`.
    let max_sge = if inline {
        sw::DeviceAttr::SOFT.max_sge
    } else {
        cap.max_send_sge
    };
    let list = sge_list(wr.sg_list, wr.num_sge, max_sge)?;
    let flags = send_flags(wr.send_flags);
    let rdma = wr.rdma();
    let rkey = Stag::from_raw(rdma.rkey);
    let op = match wr.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
            invalidate_rkey: Stag::from_raw(wr.imm_data_or_invalidate_rkey),
        },
        IBV_WR_RDMA_WRITE => SendOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey,
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey,
            imm_data: u32::from_be(wr.imm_data_or_invalidate_rkey),
        },
        IBV_WR_RDMA_READ => SendOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey,
        },
        IBV_WR_LOCAL_INV => SendOp::LocalInv {
            invalidate_stag: Stag::from_raw(wr.imm_data_or_invalidate_rkey),
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => {
            let a = wr.atomic();
            SendOp::AtomicCmpSwap {
                remote_addr: a.remote_addr,
                rkey: Stag::from_raw(a.rkey),
                compare: a.compare_add,
                swap: a.swap,
            }
        }
        IBV_WR_ATOMIC_FETCH_AND_ADD => {
            let a = wr.atomic();
            SendOp::AtomicFetchAdd {
                remote_addr: a.remote_addr,
                rkey: Stag::from_raw(a.rkey),
                add: a.compare_add,
            }
        }
        _ => return Err(libc::EINVAL),
    };
    let payload = if inline {
        let total: u64 = list.iter().map(|s| u64::from(s.length)).sum();
        if total > u64::from(cap.max_inline_data) {
            // Refused before the SGEs' memory is read.
            return Err(libc::EINVAL);
        }
        // SAFETY: contract 3: inline data is read from the SGEs' addresses at post
        // time (ibv_post_send(3): "the buffers can be reused after the call").
        Payload::Inline(unsafe { crate::boundary::gather(list) }.ok_or(libc::EINVAL)?)
    } else {
        Payload::Sges(sges(list))
    };
    Ok(SendWr {
        wr_id: wr.wr_id,
        op,
        flags,
        payload,
    })
}

/// The soft send flags of C ones (`enum ibv_send_flags`; other bits are ignored).
pub(crate) fn send_flags(bits: c_uint) -> SendFlags {
    let mut flags = SendFlags::empty();
    for (bit, f) in [
        (IBV_SEND_FENCE, SendFlags::FENCE),
        (IBV_SEND_SIGNALED, SendFlags::SIGNALED),
        (IBV_SEND_SOLICITED, SendFlags::SOLICITED),
        (IBV_SEND_INLINE, SendFlags::INLINE),
    ] {
        if bits & bit != 0 {
            flags |= f;
        }
    }
    flags
}

/// A C work request list (`struct ibv_send_wr` or `struct ibv_recv_wr`).
trait CWr: Sized {
    /// `next`.
    fn next(&self) -> *mut Self;
}

impl CWr for IbvSendWr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

impl CWr for IbvRecvWr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

/// Posts the C WR list at `first` in order, at most `depth` WRs (the queue's depth: a
/// longer list, a cyclic one included, cannot fit): each is converted by `convert`,
/// and the converted ones are posted by `post` (which reports the index and errno of
/// the WR it refused). On a refused WR, `*bad_wr` names it (the ones before it are
/// posted) and its errno is returned: `EINVAL` for a WR `convert` refuses or a
/// misaligned pointer, `ENOMEM` for the first WR beyond `depth` (as rdma-core's
/// providers report a full queue).
fn post_c_list<W: CWr, T>(
    first: *mut W,
    bad_wr: *mut *mut W,
    depth: usize,
    mut convert: impl FnMut(&W) -> Result<T, c_int>,
    post: impl FnOnce(Vec<T>) -> Result<(), (usize, c_int)>,
) -> c_int {
    let mut ptrs: Vec<*mut W> = Vec::new();
    let mut wrs = Vec::new();
    let mut cur = first;
    let mut refused = None;
    while !cur.is_null() {
        if ptrs.len() >= depth {
            refused = Some((cur, libc::ENOMEM));
            break;
        }
        // SAFETY: contract 3: a NULL-terminated list of readable WRs (a misaligned
        // pointer is refused).
        let Some(w) = (unsafe { obj(cur) }) else {
            refused = Some((cur, libc::EINVAL));
            break;
        };
        match convert(w) {
            Ok(t) => wrs.push(t),
            Err(e) => {
                refused = Some((cur, e));
                break;
            }
        }
        ptrs.push(cur);
        cur = w.next();
    }
    // Post the ones before the refused WR, then report it.
    if !wrs.is_empty() {
        if let Err((index, e)) = post(wrs) {
            if let Some(&p) = ptrs.get(index) {
                // SAFETY: contract 3.
                unsafe { write_out(bad_wr, p) };
            }
            return e;
        }
    }
    match refused {
        Some((p, e)) => {
            // SAFETY: contract 3.
            unsafe { write_out(bad_wr, p) };
            e
        }
        None => 0,
    }
}

/// `ibv_post_send` (ops slot): the WR list in order, at most the send queue's depth;
/// on a refused WR, `*bad_wr` names it (the ones before it are posted) and its errno is
/// returned; `EINVAL` if not a live QP.
///
/// # Safety
///
/// The pointer contract of [`crate::boundary`].
pub unsafe extern "C" fn post_send(
    qp: *mut IbvQp,
    wr: *mut IbvSendWr,
    bad_wr: *mut *mut IbvSendWr,
) -> c_int {
    guard("ibv_post_send", libc::EIO, || {
        let Some((o, q)) = QpObj::get(qp.cast()).and_then(|o| o.s.qp().map(|q| (o, q))) else {
            return err_ret(libc::EINVAL);
        };
        let cap = o.s.cap;
        post_c_list(
            wr,
            bad_wr,
            cap.max_send_wr as usize,
            |w| send_wr(w, &cap),
            |wrs| {
                q.post_send_list(wrs).map_err(|e| {
                    tracing::debug!(qpn = q.qp_num(), index = e.index, error = %e.error, "ibv_post_send refused a WR");
                    (e.index, e.error.errno())
                })
            },
        )
    })
}

/// `ibv_post_recv` (ops slot), as [`post_send`]; `EINVAL` on a QP that takes its
/// receive WRs from an SRQ (`*bad_wr` is the first WR).
///
/// # Safety
///
/// The pointer contract of [`crate::boundary`].
pub unsafe extern "C" fn post_recv(
    qp: *mut IbvQp,
    wr: *mut IbvRecvWr,
    bad_wr: *mut *mut IbvRecvWr,
) -> c_int {
    guard("ibv_post_recv", libc::EIO, || {
        let Some((o, q)) = QpObj::get(qp.cast()).and_then(|o| o.s.qp().map(|q| (o, q))) else {
            return err_ret(libc::EINVAL);
        };
        let cap = o.s.cap;
        if cap.max_recv_wr == 0 {
            // A QP on an SRQ has no receive queue of its own (siw: EINVAL).
            // SAFETY: contract 3.
            unsafe { write_out(bad_wr, wr) };
            return err_ret(libc::EINVAL);
        }
        post_c_list(
            wr,
            bad_wr,
            cap.max_recv_wr as usize,
            |w| {
                let list = sge_list(w.sg_list, w.num_sge, cap.max_recv_sge)?;
                Ok(RecvWr::new(w.wr_id, sges(list)))
            },
            |wrs| {
                q.post_recv_list(wrs)
                    .map_err(|e| (e.index, e.error.errno()))
            },
        )
    })
}

// ------------------------------------------------------------------ SRQ

/// `ibv_post_srq_recv` (ops slot): the WR list in order, at most the SRQ's `max_wr`;
/// on a refused WR, `*bad_recv_wr` names it (the ones before it are posted) and its
/// errno is returned (`ENOMEM` when the SRQ is full, `EINVAL` for more SGEs than its
/// `max_sge`); `EINVAL` if not a live SRQ.
///
/// # Safety
///
/// The pointer contract of [`crate::boundary`].
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut IbvSrq,
    wr: *mut IbvRecvWr,
    bad_wr: *mut *mut IbvRecvWr,
) -> c_int {
    guard("ibv_post_srq_recv", libc::EIO, || {
        let Some((o, soft)) = SrqObj::get(srq).and_then(|o| o.s.srq().map(|q| (o, q))) else {
            return err_ret(libc::EINVAL);
        };
        let max_sge = o.s.max_sge;
        post_c_list(
            wr,
            bad_wr,
            o.s.max_wr as usize,
            |w| {
                let list = sge_list(w.sg_list, w.num_sge, max_sge)?;
                Ok(RecvWr::new(w.wr_id, sges(list)))
            },
            |wrs| {
                soft.post_recv_list(wrs)
                    .map_err(|e| (e.index, e.error.errno()))
            },
        )
    })
}
