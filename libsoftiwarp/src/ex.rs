//! The extended verbs (rdma-core 44's `verbs_context` operations and the exported calls
//! beside them): `ibv_query_device_ex`, `ibv_query_port` with the whole `struct
//! ibv_port_attr`, `ibv_query_gid_table`, `ibv_create_cq_ex` with the `ibv_start_poll`
//! API, `ibv_create_qp_ex` with `send_ops_flags` and the `ibv_wr_*` API,
//! `ibv_qp_to_qp_ex`.
//!
//! **How programs reach them.** Most are header inlines that call an operation of the
//! context's `struct verbs_context` (`verbs_get_ctx_op(ctx, create_cq_ex)`), or of the
//! CQ's and QP's extended structs (`cq->start_poll(cq, attr)`, `qp->wr_send(qp)`). Every
//! context of this library is a `verbs_context` ([`verbs_context_prefix`]: the prefix
//! lies right before the `struct ibv_context`, and `abi_compat` says so); the operations
//! it does not have are NULL, so `verbs_get_ctx_op` finds nothing and the inline fails
//! with `EOPNOTSUPP` (flows, work queues, XRC, device memory, counters, ...), and other
//! providers' direct-verbs probes (`mlx5dv_*`, `efadv_*`) check the device's driver
//! (`verbs_get_device(dev)->ops`, NULL here: `struct ibv_device` is followed by a
//! zeroed `struct verbs_device` tail, [`crate::device`]) and answer "not this provider".
//!
//! **Extended CQ.** `start_poll` takes one completion from the soft CQ and makes it
//! current (its `status` and `wr_id` written into the C view, the `read_*` functions
//! read the rest), `ENOENT` if there is none; `next_poll` the next; `end_poll` ends.
//! `wc_flags` beyond `IBV_WC_STANDARD_FLAGS` (completion timestamps, CVLAN, flow tag,
//! tag matching) are `EOPNOTSUPP` at creation; `read_slid`, `read_sl`,
//! `read_dlid_path_bits` and `read_src_qp` read 0 (iWARP has no LIDs; RC).
//!
//! **Extended QP.** `wr_start` opens a batch; each `wr_<op>` appends a WR (its `wr_id`
//! and `wr_flags` read from the QP's C view, as the man page says to set them first),
//! `wr_set_sge` / `_sge_list` / `_inline_data` / `_inline_data_list` give the last one
//! its payload (inline data copied at once); `wr_complete` posts the batch and returns 0
//! or the errno of the first WR built wrong (then nothing is posted, as rdma-core's
//! providers) or refused; `wr_abort` drops it. An operation not asked for in
//! `send_ops_flags` has no function (NULL). Send with Immediate has no soft device
//! operation: `IBV_QP_EX_WITH_SEND_WITH_IMM` is `EOPNOTSUPP`.
//!
//! Pointer rules: [`crate::boundary`]'s contract. Every function runs in
//! [`guard`](crate::boundary::guard).

#![allow(unsafe_code)]

use cxgb4::ffi::types::{IbvContext, IbvPortAttr, IbvQp, IbvSge, IbvWc};
use std::ffi::{c_int, c_uint, c_void};
use verbs::{Payload, SendFlags, SendOp, SendWr, Stag};

use crate::abi::*;
use crate::boundary::{c_fn, guard, obj, obj_mut, slice, write_out, write_prefix};
use crate::ibv::{
    ctx_obj, device_attr, err_ret, gid_entry, new_cq, new_soft_qp, null_err, port_attr, qp_obj_ex,
};
use crate::objects::{lock, to_ibv_wc, CqObj, PdObj, QpObj, WrBatch};
use crate::ops::{send_flags, sges};

/// The `struct verbs_context` head of a new context: the operations of this module,
/// the rest NULL, `sz` the size of rdma-core 44's `struct verbs_context`.
pub fn verbs_context_prefix() -> VerbsContextPrefix {
    let mut p: VerbsContextPrefix = crate::boundary::zeroed();
    p.query_port = Some(query_port_ex);
    p.create_cq_ex = Some(create_cq_ex);
    p.query_device_ex = Some(query_device_ex);
    p.create_qp_ex = Some(create_qp_ex);
    p.sz = VERBS_CONTEXT_SIZE;
    p
}

// ------------------------------------------------------------------ device, port, GIDs

/// `verbs_context.query_device_ex` (`ibv_query_device_ex(3)`): the legacy attributes,
/// `phys_port_cnt_ex` 1, the extended capabilities 0 (none); the first `attr_size`
/// bytes of `struct ibv_device_attr_ex` are written. `EINVAL` for a context that is not
/// open, an `input` with a `comp_mask`, or an `attr_size` below the legacy struct.
unsafe extern "C" fn query_device_ex(
    context: *mut IbvContext,
    input: *const c_void,
    attr: *mut IbvDeviceAttrEx,
    attr_size: usize,
) -> c_int {
    guard("ibv_query_device_ex", libc::EIO, || {
        let s = match ctx_obj(context) {
            Ok((_, s)) => s,
            Err(e) => return err_ret(e),
        };
        // SAFETY: contract 3: NULL or the application's input struct (one u32).
        if unsafe { obj(input.cast::<u32>()) }.is_some_and(|m| *m != 0) {
            return err_ret(libc::EINVAL);
        }
        if attr.is_null()
            || !attr.is_aligned()
            || attr_size < std::mem::size_of::<cxgb4::ffi::types::IbvDeviceAttr>()
        {
            return err_ret(libc::EINVAL);
        }
        let mut d: IbvDeviceAttrEx = crate::boundary::zeroed();
        d.orig_attr = device_attr(s);
        d.phys_port_cnt_ex = 1;
        // SAFETY: contract 3: `attr` is writable for `attr_size` bytes (at most ours are
        // written).
        unsafe { write_prefix(attr, &d, attr_size) };
        0
    })
}

/// `verbs_context.query_port` (what `ibv_query_port`, a header macro, calls on a
/// `verbs_context`): the whole `struct ibv_port_attr`, its first `port_attr_len` bytes.
/// `EINVAL` for a context that is not open, a port other than 1, or NULL.
unsafe extern "C" fn query_port_ex(
    context: *mut IbvContext,
    port_num: u8,
    port_attr_out: *mut IbvPortAttr,
    port_attr_len: usize,
) -> c_int {
    guard("ibv_query_port", libc::EIO, || {
        let s = match ctx_obj(context) {
            Ok((_, s)) => s,
            Err(e) => return err_ret(e),
        };
        if port_num != 1 || port_attr_out.is_null() || !port_attr_out.is_aligned() {
            return err_ret(libc::EINVAL);
        }
        // SAFETY: contract 3: writable for `port_attr_len` bytes (at most ours).
        unsafe { write_prefix(port_attr_out, &port_attr(s), port_attr_len) };
        0
    })
}

c_fn!("IBVERBS_1.11";
/// `ibv_query_gid_table(3)` (what the header inline calls): the one GID entry, returning
/// 1; as rdma-core, errors are negative errnos: `-EINVAL` for a context that is not
/// open, `max_entries` 0 (too small a buffer), an `entry_size` below `struct
/// ibv_gid_entry` or a NULL `entries`; `-EOPNOTSUPP` for `flags`.
pub unsafe extern "C" fn _ibv_query_gid_table(context: *mut IbvContext, entries: *mut IbvGidEntry, max_entries: usize, flags: u32, entry_size: usize) -> isize {
    guard("ibv_query_gid_table", -(libc::EIO as isize), || {
        let s = match ctx_obj(context) {
            Ok((_, s)) => s,
            Err(e) => return -(e as isize),
        };
        if flags != 0 {
            return -(libc::EOPNOTSUPP as isize);
        }
        if max_entries < 1 || entry_size < std::mem::size_of::<IbvGidEntry>() {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: contract 3: `entries` holds `max_entries` entries of `entry_size`
        // bytes; the first is written.
        if !unsafe { write_out(entries, gid_entry(s)) } {
            return -(libc::EINVAL as isize);
        }
        1
    })
});

// ------------------------------------------------------------------ extended CQ

/// The `wc_flags` an extended CQ takes ([`IBV_WC_STANDARD_FLAGS`]).
pub const SUPPORTED_WC_FLAGS: u64 = IBV_WC_STANDARD_FLAGS;

/// `verbs_context.create_cq_ex` (`ibv_create_cq_ex(3)`): a CQ whose C view is a
/// `struct ibv_cq_ex` with the poll API. NULL with `EOPNOTSUPP` for `wc_flags` beyond
/// [`SUPPORTED_WC_FLAGS`], a parent domain, or a creation flag other than
/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED` (a hint); otherwise as `ibv_create_cq`
/// (`EINVAL` for `cqe` 0 or above `max_cqe`, a `comp_vector` out of range, ...).
unsafe extern "C" fn create_cq_ex(
    context: *mut IbvContext,
    attr: *mut IbvCqInitAttrEx,
) -> *mut IbvCqEx {
    guard("ibv_create_cq_ex", std::ptr::null_mut(), || {
        // SAFETY: contract 3.
        let Some(a) = (unsafe { obj(attr) }) else {
            return null_err(libc::EINVAL);
        };
        if a.wc_flags & !SUPPORTED_WC_FLAGS != 0
            || a.comp_mask & !IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
            || (a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
                && a.flags & !IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0)
        {
            return null_err(libc::EOPNOTSUPP);
        }
        let (Ok(cqe), Ok(vector)) = (c_int::try_from(a.cqe), c_int::try_from(a.comp_vector)) else {
            return null_err(libc::EINVAL);
        };
        let made = new_cq(context, cqe, a.cq_context, a.channel, vector, |c| {
            c.start_poll = Some(start_poll);
            c.next_poll = Some(next_poll);
            c.end_poll = Some(end_poll);
            c.read_opcode = Some(read_opcode);
            c.read_vendor_err = Some(read_vendor_err);
            c.read_byte_len = Some(read_byte_len);
            c.read_imm_data = Some(read_imm_data);
            c.read_qp_num = Some(read_qp_num);
            c.read_src_qp = Some(read_src_qp);
            c.read_wc_flags = Some(read_wc_flags);
            c.read_slid = Some(read_slid);
            c.read_sl = Some(read_sl);
            c.read_dlid_path_bits = Some(read_dlid_path_bits);
        });
        made.unwrap_or_else(null_err)
    })
}

/// Makes the next completion of `cq` current: 0, `ENOENT` with none, `EINVAL` for a CQ
/// that is not live, the soft CQ's errno for an overrun CQ.
fn poll_one(cq: *mut IbvCqEx) -> c_int {
    let Some(o) = CqObj::get(cq) else {
        return libc::EINVAL;
    };
    let Some(soft) = o.s.cq() else {
        return libc::EINVAL;
    };
    let blank = verbs::WorkCompletion::new(0, verbs::WcStatus::Success, verbs::WcOpcode::Send, 0);
    let mut one = [blank];
    let mut cur = lock(&o.s.current);
    match soft.poll_into(&mut one) {
        Ok(1) => {
            let wc = to_ibv_wc(&one[0]);
            o.update_c(|c| {
                c.status = wc.status;
                c.wr_id = wc.wr_id;
            });
            *cur = Some(wc);
            0
        }
        Ok(_) => {
            *cur = None;
            libc::ENOENT
        }
        Err(sw::CqError::Destroyed { .. }) => libc::EINVAL,
        Err(_) => libc::EIO,
    }
}

/// `ibv_start_poll` (`cq->start_poll`): the first completion current, or `ENOENT`.
unsafe extern "C" fn start_poll(cq: *mut IbvCqEx, attr: *mut c_void) -> c_int {
    guard("ibv_start_poll", libc::EIO, || {
        // SAFETY: contract 3: `struct ibv_poll_cq_attr` is one u32, `comp_mask`.
        if unsafe { obj(attr.cast::<u32>()) }.is_some_and(|m| *m != 0) {
            return libc::EINVAL;
        }
        poll_one(cq)
    })
}

/// `ibv_next_poll`: the next completion current, or `ENOENT`.
unsafe extern "C" fn next_poll(cq: *mut IbvCqEx) -> c_int {
    guard("ibv_next_poll", libc::EIO, || poll_one(cq))
}

/// `ibv_end_poll`: no completion current any more.
unsafe extern "C" fn end_poll(cq: *mut IbvCqEx) {
    guard("ibv_end_poll", (), || {
        if let Some(o) = CqObj::get(cq) {
            *lock(&o.s.current) = None;
        }
    })
}

/// `f` of the current completion of `cq` (0 with none, or for a CQ that is not live).
fn read_current<R: Default>(cq: *mut IbvCqEx, f: impl FnOnce(&IbvWc) -> R) -> R {
    guard("ibv_wc_read", R::default(), || {
        CqObj::get(cq)
            .and_then(|o| lock(&o.s.current).as_ref().map(f))
            .unwrap_or_default()
    })
}

/// `ibv_wc_read_opcode` (`enum ibv_wc_opcode`).
unsafe extern "C" fn read_opcode(cq: *mut IbvCqEx) -> u32 {
    read_current(cq, |w| w.opcode)
}

/// `ibv_wc_read_vendor_err`.
unsafe extern "C" fn read_vendor_err(cq: *mut IbvCqEx) -> u32 {
    read_current(cq, |w| w.vendor_err)
}

/// `ibv_wc_read_byte_len`.
unsafe extern "C" fn read_byte_len(cq: *mut IbvCqEx) -> u32 {
    read_current(cq, |w| w.byte_len)
}

/// `ibv_wc_read_imm_data` (big-endian) and `ibv_wc_read_invalidated_rkey` (the inline
/// reads the same function for `IBV_WC_WITH_INV`).
unsafe extern "C" fn read_imm_data(cq: *mut IbvCqEx) -> u32 {
    read_current(cq, |w| w.imm_data_or_invalidated_rkey)
}

/// `ibv_wc_read_qp_num`.
unsafe extern "C" fn read_qp_num(cq: *mut IbvCqEx) -> u32 {
    read_current(cq, |w| w.qp_num)
}

/// `ibv_wc_read_src_qp`: 0 (RC).
unsafe extern "C" fn read_src_qp(cq: *mut IbvCqEx) -> u32 {
    read_current(cq, |w| w.src_qp)
}

/// `ibv_wc_read_wc_flags` (`IBV_WC_WITH_IMM`, `IBV_WC_WITH_INV`).
unsafe extern "C" fn read_wc_flags(cq: *mut IbvCqEx) -> c_uint {
    read_current(cq, |w| w.wc_flags)
}

/// `ibv_wc_read_slid`: 0 (iWARP has no LIDs).
unsafe extern "C" fn read_slid(_cq: *mut IbvCqEx) -> u32 {
    0
}

/// `ibv_wc_read_sl`: 0.
unsafe extern "C" fn read_sl(_cq: *mut IbvCqEx) -> u8 {
    0
}

/// `ibv_wc_read_dlid_path_bits`: 0.
unsafe extern "C" fn read_dlid_path_bits(_cq: *mut IbvCqEx) -> u8 {
    0
}

// ------------------------------------------------------------------ extended QP

/// The `send_ops_flags` a QP takes: Send, Send with Invalidate, RDMA Write (with
/// Immediate), RDMA Read, Local Invalidate, and the RFC 7306 atomics (Compare-and-Swap,
/// Fetch-and-Add).
pub const SUPPORTED_SEND_OPS: u64 = IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_SEND_WITH_INV
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

/// The `comp_mask` bits `ibv_create_qp_ex` takes (the PD is required; `create_flags`
/// must be 0).
const SUPPORTED_QP_MASK: u32 =
    IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;

/// `verbs_context.create_qp_ex` (`ibv_create_qp_ex(3)`, reached for any `comp_mask`
/// other than the PD alone): an RC QP as `ibv_create_qp`, with the `ibv_wr_*` API for
/// the operations of `send_ops_flags`. NULL with `EINVAL` without a live PD of this
/// context's device (`IBV_QP_INIT_ATTR_PD`); `EOPNOTSUPP` for another QP type, other
/// `comp_mask` bits (XRC, TSO, RSS), a create flag, or send operations beyond
/// [`SUPPORTED_SEND_OPS`].
unsafe extern "C" fn create_qp_ex(
    context: *mut IbvContext,
    attr: *mut IbvQpInitAttrEx,
) -> *mut IbvQp {
    guard("ibv_create_qp_ex", std::ptr::null_mut(), || {
        // SAFETY: contract 3: the application's attributes, ours for the call.
        let Some(a) = (unsafe { obj_mut(attr) }) else {
            return null_err(libc::EINVAL);
        };
        let s = match ctx_obj(context) {
            Ok((_, s)) => s,
            Err(e) => return null_err(e),
        };
        if a.comp_mask & !SUPPORTED_QP_MASK != 0
            || (a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
            || a.qp_type != cxgb4::ffi::types::IBV_QPT_RC
        {
            return null_err(libc::EOPNOTSUPP);
        }
        let ops = if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
            a.send_ops_flags
        } else {
            0
        };
        if ops & !SUPPORTED_SEND_OPS != 0 {
            return null_err(libc::EOPNOTSUPP);
        }
        let Some(p) = PdObj::get(a.pd).filter(|_| a.comp_mask & IBV_QP_INIT_ATTR_PD != 0) else {
            return null_err(libc::EINVAL);
        };
        if p.s.ctx.s.dev != s.index {
            return null_err(libc::EINVAL);
        }
        let mut base = a.base();
        let (qp, uses) = match new_soft_qp(s, &p, &base) {
            Ok(v) => v,
            Err(e) => return null_err(e),
        };
        let q = qp_obj_ex(qp, &mut base, None, uses, ops, |x| set_wr_ops(x, ops));
        a.cap = base.cap;
        q
    })
}

/// Fills the `wr_*` pointers of `x` for the operations of `ops` (none for 0).
pub(crate) fn set_wr_ops(x: &mut IbvQpEx, ops: u64) {
    if ops == 0 {
        return;
    }
    x.wr_start = Some(wr_start);
    x.wr_complete = Some(wr_complete);
    x.wr_abort = Some(wr_abort);
    x.wr_set_sge = Some(wr_set_sge);
    x.wr_set_sge_list = Some(wr_set_sge_list);
    x.wr_set_inline_data = Some(wr_set_inline_data);
    x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    let has = |bit| ops & bit != 0;
    if has(IBV_QP_EX_WITH_SEND) {
        x.wr_send = Some(wr_send);
    }
    if has(IBV_QP_EX_WITH_SEND_WITH_INV) {
        x.wr_send_inv = Some(wr_send_inv);
    }
    if has(IBV_QP_EX_WITH_RDMA_WRITE) {
        x.wr_rdma_write = Some(wr_rdma_write);
    }
    if has(IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) {
        x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    }
    if has(IBV_QP_EX_WITH_RDMA_READ) {
        x.wr_rdma_read = Some(wr_rdma_read);
    }
    if has(IBV_QP_EX_WITH_LOCAL_INV) {
        x.wr_local_inv = Some(wr_local_inv);
    }
    if has(IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) {
        x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    }
    if has(IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) {
        x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    }
}

c_fn!("IBVERBS_1.6";
/// `ibv_qp_to_qp_ex(3)`: the QP's `struct ibv_qp_ex` (the same address) if it was made
/// by `ibv_create_qp_ex` with `send_ops_flags`; NULL otherwise (as libibverbs, for a
/// QP without the extended post API), with `EOPNOTSUPP` (`EINVAL` for a QP that is not
/// live).
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut IbvQp) -> *mut IbvQpEx {
    guard("ibv_qp_to_qp_ex", std::ptr::null_mut(), || match QpObj::get(qp.cast()) {
        Some(o) if o.s.send_ops != 0 => o.ptr(),
        Some(_) => null_err(libc::EOPNOTSUPP),
        None => null_err(libc::EINVAL),
    })
});

/// Runs `f` on the open batch of the live QP `qp` and its object (under the batch's
/// lock, which also guards the QP's C view); nothing if the QP is not live or no batch
/// is open (`wr_start` not called: rdma-core's providers leave that undefined).
fn with_batch(qp: *mut IbvQpEx, f: impl FnOnce(&mut WrBatch, &QpObj)) {
    let Some(o) = QpObj::get(qp) else { return };
    let mut b = lock(&o.s.batch);
    if let Some(batch) = b.as_mut() {
        if batch.err.is_none() {
            f(batch, &o);
        }
    }
}

/// Appends a WR of `op` to the open batch of `qp`, with the `wr_id` and `wr_flags` the
/// application set in the QP's C view; `EINVAL` in the batch if `op` was not asked
/// for (`bit` not in `send_ops_flags`), `ENOMEM` beyond the send queue's depth.
fn add_wr(qp: *mut IbvQpEx, bit: u64, op: SendOp) {
    with_batch(qp, |b, o| {
        if o.s.send_ops & bit == 0 {
            b.err = Some(libc::EINVAL);
            return;
        }
        if b.wrs.len() >= o.s.cap.max_send_wr as usize {
            b.err = Some(libc::ENOMEM);
            return;
        }
        let (wr_id, flags) = o.with_c(|c| (c.wr_id, c.wr_flags));
        b.wrs.push(SendWr {
            wr_id,
            op,
            flags: send_flags(flags) - SendFlags::INLINE,
            payload: Payload::Sges(Vec::new()),
        });
    });
}

/// Gives the last WR of the open batch of `qp` the payload `make` returns (`Err`: the
/// batch's error); `EINVAL` if no WR was started.
fn set_payload(qp: *mut IbvQpEx, make: impl FnOnce(&QpObj) -> Result<Payload, c_int>) {
    with_batch(qp, |b, o| {
        let r = make(o);
        match (b.wrs.last_mut(), r) {
            (Some(wr), Ok(p)) => {
                if matches!(p, Payload::Inline(_)) {
                    wr.flags |= SendFlags::INLINE;
                }
                wr.payload = p;
            }
            (None, _) => b.err = Some(libc::EINVAL),
            (_, Err(e)) => b.err = Some(e),
        }
    });
}

/// `ibv_wr_start`: opens a batch (dropping one left open).
unsafe extern "C" fn wr_start(qp: *mut IbvQpEx) {
    guard("ibv_wr_start", (), || {
        if let Some(o) = QpObj::get(qp) {
            *lock(&o.s.batch) = Some(WrBatch::default());
        }
    })
}

/// `ibv_wr_complete`: posts the batch in order; 0, the errno of the first WR built
/// wrong (nothing posted), or the errno of the WR the QP refused (the ones before it
/// are posted); `EINVAL` for a QP that is not live or with no batch open.
unsafe extern "C" fn wr_complete(qp: *mut IbvQpEx) -> c_int {
    guard("ibv_wr_complete", libc::EIO, || {
        let Some((o, soft)) = QpObj::get(qp).and_then(|o| o.s.qp().map(|q| (o, q))) else {
            return libc::EINVAL;
        };
        let Some(batch) = lock(&o.s.batch).take() else {
            return libc::EINVAL;
        };
        if let Some(e) = batch.err {
            return e;
        }
        if batch.wrs.is_empty() {
            return 0;
        }
        match soft.post_send_list(batch.wrs) {
            Ok(()) => 0,
            Err(e) => e.error.errno(),
        }
    })
}

/// `ibv_wr_abort`: drops the batch.
unsafe extern "C" fn wr_abort(qp: *mut IbvQpEx) {
    guard("ibv_wr_abort", (), || {
        if let Some(o) = QpObj::get(qp) {
            *lock(&o.s.batch) = None;
        }
    })
}

/// `ibv_wr_send`.
unsafe extern "C" fn wr_send(qp: *mut IbvQpEx) {
    guard("ibv_wr_send", (), || {
        add_wr(qp, IBV_QP_EX_WITH_SEND, SendOp::Send)
    })
}

/// `ibv_wr_send_inv`.
unsafe extern "C" fn wr_send_inv(qp: *mut IbvQpEx, invalidate_rkey: u32) {
    guard("ibv_wr_send_inv", (), || {
        let op = SendOp::SendWithInv {
            invalidate_rkey: Stag::from_raw(invalidate_rkey),
        };
        add_wr(qp, IBV_QP_EX_WITH_SEND_WITH_INV, op)
    })
}

/// `ibv_wr_rdma_write`.
unsafe extern "C" fn wr_rdma_write(qp: *mut IbvQpEx, rkey: u32, remote_addr: u64) {
    guard("ibv_wr_rdma_write", (), || {
        let op = SendOp::RdmaWrite {
            remote_addr,
            rkey: Stag::from_raw(rkey),
        };
        add_wr(qp, IBV_QP_EX_WITH_RDMA_WRITE, op)
    })
}

/// `ibv_wr_rdma_write_imm` (`imm_data` big-endian).
unsafe extern "C" fn wr_rdma_write_imm(
    qp: *mut IbvQpEx,
    rkey: u32,
    remote_addr: u64,
    imm_data: u32,
) {
    guard("ibv_wr_rdma_write_imm", (), || {
        let op = SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey: Stag::from_raw(rkey),
            imm_data: u32::from_be(imm_data),
        };
        add_wr(qp, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, op)
    })
}

/// `ibv_wr_rdma_read`.
unsafe extern "C" fn wr_rdma_read(qp: *mut IbvQpEx, rkey: u32, remote_addr: u64) {
    guard("ibv_wr_rdma_read", (), || {
        let op = SendOp::RdmaRead {
            remote_addr,
            rkey: Stag::from_raw(rkey),
        };
        add_wr(qp, IBV_QP_EX_WITH_RDMA_READ, op)
    })
}

/// `ibv_wr_atomic_cmp_swp`: RFC 7306 Compare-and-Swap of the 8-byte word at
/// `remote_addr` (8-byte aligned) in the peer's region `rkey`; the original value lands
/// in the WR's one 8-byte SGE (`ibv_wr_set_sge`).
unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut IbvQpEx,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    guard("ibv_wr_atomic_cmp_swp", (), || {
        let op = SendOp::AtomicCmpSwap {
            remote_addr,
            rkey: Stag::from_raw(rkey),
            compare,
            swap,
        };
        add_wr(qp, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, op)
    })
}

/// `ibv_wr_atomic_fetch_add`: RFC 7306 Fetch-and-Add of `add` to the 8-byte word at
/// `remote_addr` (8-byte aligned) in the peer's region `rkey`; the original value lands
/// in the WR's one 8-byte SGE.
unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut IbvQpEx, rkey: u32, remote_addr: u64, add: u64) {
    guard("ibv_wr_atomic_fetch_add", (), || {
        let op = SendOp::AtomicFetchAdd {
            remote_addr,
            rkey: Stag::from_raw(rkey),
            add,
        };
        add_wr(qp, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, op)
    })
}

/// `ibv_wr_local_inv`.
unsafe extern "C" fn wr_local_inv(qp: *mut IbvQpEx, invalidate_rkey: u32) {
    guard("ibv_wr_local_inv", (), || {
        let op = SendOp::LocalInv {
            invalidate_stag: Stag::from_raw(invalidate_rkey),
        };
        add_wr(qp, IBV_QP_EX_WITH_LOCAL_INV, op)
    })
}

/// `ibv_wr_set_sge`: one SGE.
unsafe extern "C" fn wr_set_sge(qp: *mut IbvQpEx, lkey: u32, addr: u64, length: u32) {
    guard("ibv_wr_set_sge", (), || {
        set_payload(qp, |_| {
            let sge = IbvSge { addr, length, lkey };
            Ok(Payload::Sges(sges(&[sge])))
        })
    })
}

/// `ibv_wr_set_sge_list`: `num_sge` SGEs (`EINVAL` in the batch above the QP's
/// `max_send_sge`, checked before the array is read).
unsafe extern "C" fn wr_set_sge_list(qp: *mut IbvQpEx, num_sge: usize, sg_list: *const IbvSge) {
    guard("ibv_wr_set_sge_list", (), || {
        set_payload(qp, |o| {
            if num_sge > o.s.cap.max_send_sge as usize {
                return Err(libc::EINVAL);
            }
            // SAFETY: contract 3: `sg_list` has `num_sge` readable entries.
            let list = unsafe { slice(sg_list, num_sge) }.ok_or(libc::EINVAL)?;
            Ok(Payload::Sges(sges(list)))
        })
    })
}

/// The bytes of `bufs`, concatenated; `EINVAL` above `max` bytes (checked before any
/// is read) or for a NULL address with a length.
fn gather_bufs(bufs: &[IbvDataBuf], max: u32) -> Result<Vec<u8>, c_int> {
    let total = bufs
        .iter()
        .try_fold(0usize, |t, b| t.checked_add(b.length))
        .ok_or(libc::EINVAL)?;
    if total > max as usize {
        return Err(libc::EINVAL);
    }
    let mut out = Vec::with_capacity(total);
    for b in bufs {
        // SAFETY: contract 3: each buffer is readable for its length (read at once:
        // ibv_wr_set_inline_data(3) lets the application reuse it after the call).
        out.extend_from_slice(unsafe { slice(b.addr.cast::<u8>(), b.length) }.ok_or(libc::EINVAL)?);
    }
    Ok(out)
}

/// `ibv_wr_set_inline_data`: the bytes, copied now (`EINVAL` in the batch above the
/// QP's `max_inline_data`).
unsafe extern "C" fn wr_set_inline_data(qp: *mut IbvQpEx, addr: *mut c_void, length: usize) {
    guard("ibv_wr_set_inline_data", (), || {
        set_payload(qp, |o| {
            let buf = IbvDataBuf { addr, length };
            gather_bufs(&[buf], o.s.cap.max_inline_data).map(Payload::Inline)
        })
    })
}

/// `ibv_wr_set_inline_data_list`: `num_buf` buffers (at most the device's 16 SGEs),
/// copied now.
unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut IbvQpEx,
    num_buf: usize,
    buf_list: *const IbvDataBuf,
) {
    guard("ibv_wr_set_inline_data_list", (), || {
        set_payload(qp, |o| {
            // At most the device's SGEs, as inline data from SGEs (checked before the
            // list is read).
            if num_buf > sw::DeviceAttr::SOFT.max_sge as usize {
                return Err(libc::EINVAL);
            }
            // SAFETY: contract 3: `buf_list` has `num_buf` readable entries.
            let bufs = unsafe { slice(buf_list, num_buf) }.ok_or(libc::EINVAL)?;
            gather_bufs(bufs, o.s.cap.max_inline_data).map(Payload::Inline)
        })
    })
}
