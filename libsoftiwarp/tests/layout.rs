//! The `#[repr(C)]` layouts of `libsoftiwarp::abi` (the structs beyond
//! `cxgb4::ffi::types`, whose own test covers those) against Debian's rdma-core headers,
//! and that a handle is the address of its object (the C struct first).

use core::mem::{offset_of, size_of};
use softiwarp::abi::*;

const HEADERS: [&str; 2] = [
    "/usr/include/infiniband/verbs.h",
    "/usr/include/rdma/rdma_cma.h",
];

#[test]
fn abi_layouts_match_rdma_core_headers() {
    let rows = vec![
        (
            "sizeof(struct ibv_global_route)",
            size_of::<IbvGlobalRoute>(),
        ),
        ("sizeof(struct ibv_ah_attr)", size_of::<IbvAhAttr>()),
        (
            "offsetof(struct ibv_ah_attr, port_num)",
            offset_of!(IbvAhAttr, port_num),
        ),
        ("sizeof(struct ibv_qp_attr)", size_of::<IbvQpAttr>()),
        (
            "offsetof(struct ibv_qp_attr, qp_access_flags)",
            offset_of!(IbvQpAttr, qp_access_flags),
        ),
        (
            "offsetof(struct ibv_qp_attr, cap)",
            offset_of!(IbvQpAttr, cap),
        ),
        (
            "offsetof(struct ibv_qp_attr, ah_attr)",
            offset_of!(IbvQpAttr, ah_attr),
        ),
        (
            "offsetof(struct ibv_qp_attr, alt_ah_attr)",
            offset_of!(IbvQpAttr, alt_ah_attr),
        ),
        (
            "offsetof(struct ibv_qp_attr, pkey_index)",
            offset_of!(IbvQpAttr, pkey_index),
        ),
        (
            "offsetof(struct ibv_qp_attr, max_rd_atomic)",
            offset_of!(IbvQpAttr, max_rd_atomic),
        ),
        (
            "offsetof(struct ibv_qp_attr, max_dest_rd_atomic)",
            offset_of!(IbvQpAttr, max_dest_rd_atomic),
        ),
        (
            "offsetof(struct ibv_qp_attr, port_num)",
            offset_of!(IbvQpAttr, port_num),
        ),
        (
            "offsetof(struct ibv_qp_attr, alt_timeout)",
            offset_of!(IbvQpAttr, alt_timeout),
        ),
        (
            "offsetof(struct ibv_qp_attr, rate_limit)",
            offset_of!(IbvQpAttr, rate_limit),
        ),
        ("sizeof(struct ibv_gid_entry)", size_of::<IbvGidEntry>()),
        (
            "offsetof(struct ibv_gid_entry, gid_type)",
            offset_of!(IbvGidEntry, gid_type),
        ),
        ("sizeof(struct rdma_addrinfo)", size_of::<RdmaAddrinfo>()),
        (
            "offsetof(struct rdma_addrinfo, ai_src_len)",
            offset_of!(RdmaAddrinfo, ai_src_len),
        ),
        (
            "offsetof(struct rdma_addrinfo, ai_src_addr)",
            offset_of!(RdmaAddrinfo, ai_src_addr),
        ),
        (
            "offsetof(struct rdma_addrinfo, ai_dst_addr)",
            offset_of!(RdmaAddrinfo, ai_dst_addr),
        ),
        (
            "offsetof(struct rdma_addrinfo, ai_connect_len)",
            offset_of!(RdmaAddrinfo, ai_connect_len),
        ),
        (
            "offsetof(struct rdma_addrinfo, ai_next)",
            offset_of!(RdmaAddrinfo, ai_next),
        ),
        // rdma_create_qp_ex reads these two at fixed offsets.
        ("offsetof(struct ibv_qp_init_attr_ex, comp_mask)", 60),
        ("offsetof(struct ibv_qp_init_attr_ex, pd)", 64),
        // ibv_query_port writes the compat struct: up to and including `flags`.
        (
            "offsetof(struct ibv_port_attr, flags) + 1",
            offset_of!(cxgb4::ffi::types::IbvPortAttr, flags) + 1,
        ),
        ("sizeof(struct ibv_srq)", size_of::<IbvSrq>()),
        (
            "offsetof(struct ibv_srq, handle)",
            offset_of!(IbvSrq, handle),
        ),
        (
            "offsetof(struct ibv_srq, events_completed)",
            offset_of!(IbvSrq, events_completed),
        ),
        ("sizeof(struct ibv_srq_attr)", size_of::<IbvSrqAttr>()),
        (
            "sizeof(struct ibv_srq_init_attr)",
            size_of::<IbvSrqInitAttr>(),
        ),
        (
            "offsetof(struct ibv_srq_init_attr, attr)",
            offset_of!(IbvSrqInitAttr, attr),
        ),
        ("IBV_SRQ_MAX_WR", IBV_SRQ_MAX_WR as usize),
        ("IBV_SRQ_LIMIT", IBV_SRQ_LIMIT as usize),
        // The header inline ibv_post_srq_recv calls this slot.
        (
            "offsetof(struct ibv_context, ops.post_srq_recv)",
            offset_of!(cxgb4::ffi::types::IbvContext, ops)
                + offset_of!(cxgb4::ffi::types::IbvContextOps, _slots_13_24)
                + POST_SRQ_RECV_SLOT * size_of::<usize>(),
        ),
        (
            "PTHREAD_CANCEL_DISABLE",
            softiwarp::boundary::PTHREAD_CANCEL_DISABLE as usize,
        ),
        // The extended verbs.
        (
            "offsetof(struct verbs_context, context)",
            size_of::<VerbsContextPrefix>(),
        ),
        (
            "offsetof(struct verbs_context, create_cq_ex)",
            offset_of!(VerbsContextPrefix, create_cq_ex),
        ),
        (
            "offsetof(struct verbs_context, priv)",
            offset_of!(VerbsContextPrefix, priv_),
        ),
        (
            "offsetof(struct verbs_context, query_device_ex)",
            offset_of!(VerbsContextPrefix, query_device_ex),
        ),
        (
            "offsetof(struct verbs_context, create_qp_ex)",
            offset_of!(VerbsContextPrefix, create_qp_ex),
        ),
        (
            "offsetof(struct verbs_context, sz)",
            offset_of!(VerbsContextPrefix, sz),
        ),
        ("sizeof(struct verbs_context)", VERBS_CONTEXT_SIZE),
        (
            "(uintptr_t)__VERBS_ABI_IS_EXTENDED",
            VERBS_ABI_IS_EXTENDED as usize,
        ),
        (
            "sizeof(struct ibv_device_attr_ex)",
            size_of::<IbvDeviceAttrEx>(),
        ),
        (
            "offsetof(struct ibv_device_attr_ex, comp_mask)",
            offset_of!(IbvDeviceAttrEx, comp_mask),
        ),
        (
            "offsetof(struct ibv_device_attr_ex, phys_port_cnt_ex)",
            offset_of!(IbvDeviceAttrEx, phys_port_cnt_ex),
        ),
        ("sizeof(struct ibv_cq_ex)", size_of::<IbvCqEx>()),
        (
            "offsetof(struct ibv_cq_ex, comp_mask)",
            offset_of!(IbvCqEx, comp_mask),
        ),
        (
            "offsetof(struct ibv_cq_ex, status)",
            offset_of!(IbvCqEx, status),
        ),
        (
            "offsetof(struct ibv_cq_ex, wr_id)",
            offset_of!(IbvCqEx, wr_id),
        ),
        (
            "offsetof(struct ibv_cq_ex, start_poll)",
            offset_of!(IbvCqEx, start_poll),
        ),
        (
            "offsetof(struct ibv_cq_ex, read_opcode)",
            offset_of!(IbvCqEx, read_opcode),
        ),
        (
            "offsetof(struct ibv_cq_ex, read_dlid_path_bits)",
            offset_of!(IbvCqEx, read_dlid_path_bits),
        ),
        (
            "offsetof(struct ibv_cq_ex, read_completion_ts)",
            offset_of!(IbvCqEx, _read_unsupported),
        ),
        (
            "sizeof(struct ibv_cq_init_attr_ex)",
            size_of::<IbvCqInitAttrEx>(),
        ),
        (
            "offsetof(struct ibv_cq_init_attr_ex, comp_vector)",
            offset_of!(IbvCqInitAttrEx, comp_vector),
        ),
        (
            "offsetof(struct ibv_cq_init_attr_ex, wc_flags)",
            offset_of!(IbvCqInitAttrEx, wc_flags),
        ),
        (
            "offsetof(struct ibv_cq_init_attr_ex, flags)",
            offset_of!(IbvCqInitAttrEx, flags),
        ),
        ("IBV_WC_STANDARD_FLAGS", IBV_WC_STANDARD_FLAGS as usize),
        (
            "IBV_CQ_INIT_ATTR_MASK_FLAGS",
            IBV_CQ_INIT_ATTR_MASK_FLAGS as usize,
        ),
        (
            "IBV_CREATE_CQ_ATTR_SINGLE_THREADED",
            IBV_CREATE_CQ_ATTR_SINGLE_THREADED as usize,
        ),
        (
            "sizeof(struct ibv_qp_init_attr_ex)",
            size_of::<IbvQpInitAttrEx>(),
        ),
        (
            "offsetof(struct ibv_qp_init_attr_ex, cap)",
            offset_of!(IbvQpInitAttrEx, cap),
        ),
        (
            "offsetof(struct ibv_qp_init_attr_ex, comp_mask)",
            offset_of!(IbvQpInitAttrEx, comp_mask),
        ),
        (
            "offsetof(struct ibv_qp_init_attr_ex, pd)",
            offset_of!(IbvQpInitAttrEx, pd),
        ),
        (
            "offsetof(struct ibv_qp_init_attr_ex, create_flags)",
            offset_of!(IbvQpInitAttrEx, create_flags),
        ),
        (
            "offsetof(struct ibv_qp_init_attr_ex, rx_hash_conf)",
            offset_of!(IbvQpInitAttrEx, rx_hash_conf),
        ),
        (
            "offsetof(struct ibv_qp_init_attr_ex, send_ops_flags)",
            offset_of!(IbvQpInitAttrEx, send_ops_flags),
        ),
        ("IBV_QP_INIT_ATTR_PD", IBV_QP_INIT_ATTR_PD as usize),
        (
            "IBV_QP_INIT_ATTR_CREATE_FLAGS",
            IBV_QP_INIT_ATTR_CREATE_FLAGS as usize,
        ),
        (
            "IBV_QP_INIT_ATTR_SEND_OPS_FLAGS",
            IBV_QP_INIT_ATTR_SEND_OPS_FLAGS as usize,
        ),
        (
            "IBV_QP_EX_WITH_RDMA_WRITE",
            IBV_QP_EX_WITH_RDMA_WRITE as usize,
        ),
        (
            "IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM",
            IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM as usize,
        ),
        ("IBV_QP_EX_WITH_SEND", IBV_QP_EX_WITH_SEND as usize),
        (
            "IBV_QP_EX_WITH_SEND_WITH_IMM",
            IBV_QP_EX_WITH_SEND_WITH_IMM as usize,
        ),
        (
            "IBV_QP_EX_WITH_RDMA_READ",
            IBV_QP_EX_WITH_RDMA_READ as usize,
        ),
        (
            "IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP",
            IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP as usize,
        ),
        (
            "IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD",
            IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD as usize,
        ),
        (
            "IBV_QP_EX_WITH_LOCAL_INV",
            IBV_QP_EX_WITH_LOCAL_INV as usize,
        ),
        (
            "IBV_QP_EX_WITH_SEND_WITH_INV",
            IBV_QP_EX_WITH_SEND_WITH_INV as usize,
        ),
        ("sizeof(struct ibv_data_buf)", size_of::<IbvDataBuf>()),
        ("sizeof(struct ibv_qp_ex)", size_of::<IbvQpEx>()),
        (
            "offsetof(struct ibv_qp_ex, comp_mask)",
            offset_of!(IbvQpEx, comp_mask),
        ),
        (
            "offsetof(struct ibv_qp_ex, wr_id)",
            offset_of!(IbvQpEx, wr_id),
        ),
        (
            "offsetof(struct ibv_qp_ex, wr_flags)",
            offset_of!(IbvQpEx, wr_flags),
        ),
        (
            "offsetof(struct ibv_qp_ex, wr_atomic_cmp_swp)",
            offset_of!(IbvQpEx, wr_atomic_cmp_swp),
        ),
        (
            "offsetof(struct ibv_qp_ex, wr_local_inv)",
            offset_of!(IbvQpEx, wr_local_inv),
        ),
        (
            "offsetof(struct ibv_qp_ex, wr_send)",
            offset_of!(IbvQpEx, wr_send),
        ),
        (
            "offsetof(struct ibv_qp_ex, wr_send_tso)",
            offset_of!(IbvQpEx, _wr_unsupported),
        ),
        (
            "offsetof(struct ibv_qp_ex, wr_set_inline_data)",
            offset_of!(IbvQpEx, wr_set_inline_data),
        ),
        (
            "offsetof(struct ibv_qp_ex, wr_set_sge_list)",
            offset_of!(IbvQpEx, wr_set_sge_list),
        ),
        (
            "offsetof(struct ibv_qp_ex, wr_start)",
            offset_of!(IbvQpEx, wr_start),
        ),
        (
            "offsetof(struct ibv_qp_ex, wr_abort)",
            offset_of!(IbvQpEx, wr_abort),
        ),
        (
            "offsetof(struct ibv_qp_ex, wr_atomic_write)",
            offset_of!(IbvQpEx, wr_atomic_write),
        ),
        ("IBV_QPS_RESET", IBV_QPS_RESET as usize),
        ("IBV_NODE_RNIC", IBV_NODE_RNIC as usize),
        ("IBV_PORT_ACTIVE", IBV_PORT_ACTIVE as usize),
        ("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET as usize),
        ("IBV_QPS_INIT", IBV_QPS_INIT as usize),
        ("IBV_QPS_RTS", IBV_QPS_RTS as usize),
        ("IBV_QPS_ERR", IBV_QPS_ERR as usize),
        ("IBV_QPS_RTR", IBV_QPS_RTR as usize),
        ("IBV_QP_STATE", IBV_QP_STATE as usize),
        ("IBV_QP_ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS as usize),
        ("IBV_QP_PORT", IBV_QP_PORT as usize),
        ("IBV_ACCESS_REMOTE_WRITE", IBV_ACCESS_REMOTE_WRITE as usize),
        ("IBV_ACCESS_REMOTE_READ", IBV_ACCESS_REMOTE_READ as usize),
        ("IBV_QPT_UC", IBV_QPT_UC as usize),
        ("IBV_QPT_UD", IBV_QPT_UD as usize),
        ("IBV_QPT_XRC_SEND", IBV_QPT_XRC_SEND as usize),
        ("IBV_QPT_XRC_RECV", IBV_QPT_XRC_RECV as usize),
        ("IBV_SEND_FENCE", IBV_SEND_FENCE as usize),
        ("IBV_SEND_SIGNALED", IBV_SEND_SIGNALED as usize),
        ("IBV_SEND_SOLICITED", IBV_SEND_SOLICITED as usize),
        ("IBV_SEND_INLINE", IBV_SEND_INLINE as usize),
        ("IBV_WR_RDMA_WRITE", IBV_WR_RDMA_WRITE as usize),
        (
            "IBV_WR_RDMA_WRITE_WITH_IMM",
            IBV_WR_RDMA_WRITE_WITH_IMM as usize,
        ),
        ("IBV_WR_SEND", IBV_WR_SEND as usize),
        ("IBV_WR_SEND_WITH_IMM", IBV_WR_SEND_WITH_IMM as usize),
        ("IBV_WR_RDMA_READ", IBV_WR_RDMA_READ as usize),
        ("IBV_WR_LOCAL_INV", IBV_WR_LOCAL_INV as usize),
        ("IBV_WR_SEND_WITH_INV", IBV_WR_SEND_WITH_INV as usize),
        (
            "IBV_ACCESS_OPTIONAL_RANGE",
            IBV_ACCESS_OPTIONAL_RANGE as usize,
        ),
        ("RDMA_PS_TCP", RDMA_PS_TCP as usize),
        ("RDMA_PS_IPOIB", RDMA_PS_IPOIB as usize),
        ("RDMA_PS_IB", RDMA_PS_IB as usize),
        ("RDMA_PS_UDP", RDMA_PS_UDP as usize),
        ("RAI_PASSIVE", RAI_PASSIVE as usize),
        ("IBV_MTU_1024", ibv_mtu(1500) as usize),
        ("IBV_MTU_4096", ibv_mtu(9000) as usize),
    ];
    match testkit::check_c_layout(&HEADERS, &rows) {
        Ok(Some(n)) => assert_eq!(n, rows.len()),
        Ok(None) => println!("skipped: libibverbs-dev/librdmacm-dev not installed"),
        Err(e) => panic!("{e} (install libibverbs-dev librdmacm-dev)"),
    }
}

#[test]
fn a_handle_is_the_address_of_its_object() {
    use cxgb4::ffi::types::*;
    use softiwarp::boundary::zeroed;
    use softiwarp::handles::Obj;
    use std::sync::Arc;
    /// The C struct is the object's first field: the handle handed out is the address
    /// of the whole object, whatever our state after it.
    fn check<C: 'static>(c: C) {
        let o = Obj::new(c, [0u64; 3]);
        assert_eq!(o.ptr() as usize, Arc::as_ptr(&o) as usize);
    }
    // A context has the `struct verbs_context` head right before it.
    let ctx = Obj::with_prefix(
        softiwarp::ex::verbs_context_prefix(),
        zeroed::<IbvContext>(),
        [0u64; 3],
    );
    assert_eq!(
        ctx.ptr() as usize - Arc::as_ptr(&ctx) as usize,
        size_of::<VerbsContextPrefix>()
    );
    check::<IbvPd>(zeroed());
    check::<IbvMr>(zeroed());
    check::<IbvCqEx>(zeroed());
    check::<IbvQpEx>(zeroed());
    check::<IbvCompChannel>(zeroed());
    check::<IbvSrq>(zeroed());
    check::<RdmaEventChannel>(zeroed());
    check::<RdmaCmId>(zeroed());
    check::<RdmaCmEvent>(zeroed());
}
