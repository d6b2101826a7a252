//! The `#[repr(C)]` layouts of `cxgb4::ffi::types` against rdma-core's own
//! headers: a C file that includes `<infiniband/verbs.h>` and
//! `<rdma/rdma_cma.h>` prints `sizeof` / `offsetof` of every struct and field
//! the crate declares; it is compiled with `cc`, run, and each number is
//! compared with `size_of` / `offset_of!`.
//!
//! Needs libibverbs-dev and librdmacm-dev (Debian); without them the test
//! prints one line and passes, except under `CI` (set by the CI runner), where
//! missing headers are a failure.

use core::mem::{align_of, offset_of, size_of};
use cxgb4::ffi::types::*;

/// `(C expression, the Rust value)`: the C program prints each expression.
fn table() -> Vec<(&'static str, usize)> {
    vec![
        // struct ibv_device
        ("sizeof(struct ibv_device)", size_of::<IbvDevice>()),
        (
            "offsetof(struct ibv_device, node_type)",
            offset_of!(IbvDevice, node_type),
        ),
        (
            "offsetof(struct ibv_device, transport_type)",
            offset_of!(IbvDevice, transport_type),
        ),
        (
            "offsetof(struct ibv_device, name)",
            offset_of!(IbvDevice, name),
        ),
        (
            "offsetof(struct ibv_device, dev_name)",
            offset_of!(IbvDevice, dev_name),
        ),
        (
            "offsetof(struct ibv_device, dev_path)",
            offset_of!(IbvDevice, dev_path),
        ),
        (
            "offsetof(struct ibv_device, ibdev_path)",
            offset_of!(IbvDevice, ibdev_path),
        ),
        // struct ibv_context and its ops
        ("sizeof(struct ibv_context_ops)", size_of::<IbvContextOps>()),
        (
            "offsetof(struct ibv_context_ops, poll_cq)",
            offset_of!(IbvContextOps, poll_cq),
        ),
        (
            "offsetof(struct ibv_context_ops, req_notify_cq)",
            offset_of!(IbvContextOps, req_notify_cq),
        ),
        (
            "offsetof(struct ibv_context_ops, post_send)",
            offset_of!(IbvContextOps, post_send),
        ),
        (
            "offsetof(struct ibv_context_ops, post_recv)",
            offset_of!(IbvContextOps, post_recv),
        ),
        ("sizeof(struct ibv_context)", size_of::<IbvContext>()),
        (
            "offsetof(struct ibv_context, device)",
            offset_of!(IbvContext, device),
        ),
        (
            "offsetof(struct ibv_context, ops)",
            offset_of!(IbvContext, ops),
        ),
        (
            "offsetof(struct ibv_context, ops.poll_cq)",
            offset_of!(IbvContext, ops.poll_cq),
        ),
        (
            "offsetof(struct ibv_context, ops.req_notify_cq)",
            offset_of!(IbvContext, ops.req_notify_cq),
        ),
        (
            "offsetof(struct ibv_context, ops.post_send)",
            offset_of!(IbvContext, ops.post_send),
        ),
        (
            "offsetof(struct ibv_context, ops.post_recv)",
            offset_of!(IbvContext, ops.post_recv),
        ),
        (
            "offsetof(struct ibv_context, cmd_fd)",
            offset_of!(IbvContext, cmd_fd),
        ),
        (
            "offsetof(struct ibv_context, async_fd)",
            offset_of!(IbvContext, async_fd),
        ),
        (
            "offsetof(struct ibv_context, num_comp_vectors)",
            offset_of!(IbvContext, num_comp_vectors),
        ),
        (
            "offsetof(struct ibv_context, mutex)",
            offset_of!(IbvContext, mutex),
        ),
        (
            "offsetof(struct ibv_context, abi_compat)",
            offset_of!(IbvContext, abi_compat),
        ),
        // struct ibv_device_attr
        ("sizeof(struct ibv_device_attr)", size_of::<IbvDeviceAttr>()),
        (
            "offsetof(struct ibv_device_attr, node_guid)",
            offset_of!(IbvDeviceAttr, node_guid),
        ),
        (
            "offsetof(struct ibv_device_attr, max_mr_size)",
            offset_of!(IbvDeviceAttr, max_mr_size),
        ),
        (
            "offsetof(struct ibv_device_attr, page_size_cap)",
            offset_of!(IbvDeviceAttr, page_size_cap),
        ),
        (
            "offsetof(struct ibv_device_attr, vendor_id)",
            offset_of!(IbvDeviceAttr, vendor_id),
        ),
        (
            "offsetof(struct ibv_device_attr, vendor_part_id)",
            offset_of!(IbvDeviceAttr, vendor_part_id),
        ),
        (
            "offsetof(struct ibv_device_attr, hw_ver)",
            offset_of!(IbvDeviceAttr, hw_ver),
        ),
        (
            "offsetof(struct ibv_device_attr, max_qp)",
            offset_of!(IbvDeviceAttr, max_qp),
        ),
        (
            "offsetof(struct ibv_device_attr, max_qp_wr)",
            offset_of!(IbvDeviceAttr, max_qp_wr),
        ),
        (
            "offsetof(struct ibv_device_attr, device_cap_flags)",
            offset_of!(IbvDeviceAttr, device_cap_flags),
        ),
        (
            "offsetof(struct ibv_device_attr, max_sge)",
            offset_of!(IbvDeviceAttr, max_sge),
        ),
        (
            "offsetof(struct ibv_device_attr, max_sge_rd)",
            offset_of!(IbvDeviceAttr, max_sge_rd),
        ),
        (
            "offsetof(struct ibv_device_attr, max_cq)",
            offset_of!(IbvDeviceAttr, max_cq),
        ),
        (
            "offsetof(struct ibv_device_attr, max_cqe)",
            offset_of!(IbvDeviceAttr, max_cqe),
        ),
        (
            "offsetof(struct ibv_device_attr, max_mr)",
            offset_of!(IbvDeviceAttr, max_mr),
        ),
        (
            "offsetof(struct ibv_device_attr, max_pd)",
            offset_of!(IbvDeviceAttr, max_pd),
        ),
        (
            "offsetof(struct ibv_device_attr, max_qp_rd_atom)",
            offset_of!(IbvDeviceAttr, max_qp_rd_atom),
        ),
        (
            "offsetof(struct ibv_device_attr, max_ee_rd_atom)",
            offset_of!(IbvDeviceAttr, max_ee_rd_atom),
        ),
        (
            "offsetof(struct ibv_device_attr, max_res_rd_atom)",
            offset_of!(IbvDeviceAttr, max_res_rd_atom),
        ),
        (
            "offsetof(struct ibv_device_attr, max_qp_init_rd_atom)",
            offset_of!(IbvDeviceAttr, max_qp_init_rd_atom),
        ),
        (
            "offsetof(struct ibv_device_attr, max_ee_init_rd_atom)",
            offset_of!(IbvDeviceAttr, max_ee_init_rd_atom),
        ),
        (
            "offsetof(struct ibv_device_attr, atomic_cap)",
            offset_of!(IbvDeviceAttr, atomic_cap),
        ),
        (
            "offsetof(struct ibv_device_attr, max_ee)",
            offset_of!(IbvDeviceAttr, _max_ee_to_max_srq_sge),
        ),
        (
            "offsetof(struct ibv_device_attr, max_pkeys)",
            offset_of!(IbvDeviceAttr, max_pkeys),
        ),
        (
            "offsetof(struct ibv_device_attr, local_ca_ack_delay)",
            offset_of!(IbvDeviceAttr, local_ca_ack_delay),
        ),
        (
            "offsetof(struct ibv_device_attr, phys_port_cnt)",
            offset_of!(IbvDeviceAttr, phys_port_cnt),
        ),
        // struct ibv_port_attr
        ("sizeof(struct ibv_port_attr)", size_of::<IbvPortAttr>()),
        (
            "offsetof(struct ibv_port_attr, state)",
            offset_of!(IbvPortAttr, state),
        ),
        (
            "offsetof(struct ibv_port_attr, active_mtu)",
            offset_of!(IbvPortAttr, active_mtu),
        ),
        (
            "offsetof(struct ibv_port_attr, gid_tbl_len)",
            offset_of!(IbvPortAttr, gid_tbl_len),
        ),
        (
            "offsetof(struct ibv_port_attr, max_msg_sz)",
            offset_of!(IbvPortAttr, max_msg_sz),
        ),
        (
            "offsetof(struct ibv_port_attr, pkey_tbl_len)",
            offset_of!(IbvPortAttr, pkey_tbl_len),
        ),
        (
            "offsetof(struct ibv_port_attr, lmc)",
            offset_of!(IbvPortAttr, lmc),
        ),
        (
            "offsetof(struct ibv_port_attr, phys_state)",
            offset_of!(IbvPortAttr, phys_state),
        ),
        (
            "offsetof(struct ibv_port_attr, link_layer)",
            offset_of!(IbvPortAttr, link_layer),
        ),
        (
            "offsetof(struct ibv_port_attr, flags)",
            offset_of!(IbvPortAttr, flags),
        ),
        (
            "offsetof(struct ibv_port_attr, port_cap_flags2)",
            offset_of!(IbvPortAttr, port_cap_flags2),
        ),
        // PD, MR, completion channel, CQ, QP
        ("sizeof(struct ibv_pd)", size_of::<IbvPd>()),
        ("offsetof(struct ibv_pd, handle)", offset_of!(IbvPd, handle)),
        ("sizeof(struct ibv_mr)", size_of::<IbvMr>()),
        ("offsetof(struct ibv_mr, addr)", offset_of!(IbvMr, addr)),
        ("offsetof(struct ibv_mr, length)", offset_of!(IbvMr, length)),
        ("offsetof(struct ibv_mr, handle)", offset_of!(IbvMr, handle)),
        ("offsetof(struct ibv_mr, lkey)", offset_of!(IbvMr, lkey)),
        ("offsetof(struct ibv_mr, rkey)", offset_of!(IbvMr, rkey)),
        (
            "sizeof(struct ibv_comp_channel)",
            size_of::<IbvCompChannel>(),
        ),
        (
            "offsetof(struct ibv_comp_channel, fd)",
            offset_of!(IbvCompChannel, fd),
        ),
        (
            "offsetof(struct ibv_comp_channel, refcnt)",
            offset_of!(IbvCompChannel, refcnt),
        ),
        ("sizeof(struct ibv_cq)", size_of::<IbvCq>()),
        (
            "offsetof(struct ibv_cq, channel)",
            offset_of!(IbvCq, channel),
        ),
        ("offsetof(struct ibv_cq, handle)", offset_of!(IbvCq, handle)),
        ("offsetof(struct ibv_cq, cqe)", offset_of!(IbvCq, cqe)),
        ("offsetof(struct ibv_cq, mutex)", offset_of!(IbvCq, mutex)),
        ("offsetof(struct ibv_cq, cond)", offset_of!(IbvCq, cond)),
        (
            "offsetof(struct ibv_cq, comp_events_completed)",
            offset_of!(IbvCq, comp_events_completed),
        ),
        (
            "offsetof(struct ibv_cq, async_events_completed)",
            offset_of!(IbvCq, async_events_completed),
        ),
        ("sizeof(struct ibv_qp)", size_of::<IbvQp>()),
        ("offsetof(struct ibv_qp, pd)", offset_of!(IbvQp, pd)),
        (
            "offsetof(struct ibv_qp, send_cq)",
            offset_of!(IbvQp, send_cq),
        ),
        (
            "offsetof(struct ibv_qp, recv_cq)",
            offset_of!(IbvQp, recv_cq),
        ),
        ("offsetof(struct ibv_qp, srq)", offset_of!(IbvQp, srq)),
        ("offsetof(struct ibv_qp, handle)", offset_of!(IbvQp, handle)),
        ("offsetof(struct ibv_qp, qp_num)", offset_of!(IbvQp, qp_num)),
        ("offsetof(struct ibv_qp, state)", offset_of!(IbvQp, state)),
        (
            "offsetof(struct ibv_qp, qp_type)",
            offset_of!(IbvQp, qp_type),
        ),
        ("offsetof(struct ibv_qp, mutex)", offset_of!(IbvQp, mutex)),
        (
            "offsetof(struct ibv_qp, events_completed)",
            offset_of!(IbvQp, events_completed),
        ),
        // work requests and completions
        ("sizeof(struct ibv_sge)", size_of::<IbvSge>()),
        (
            "offsetof(struct ibv_sge, length)",
            offset_of!(IbvSge, length),
        ),
        ("offsetof(struct ibv_sge, lkey)", offset_of!(IbvSge, lkey)),
        ("sizeof(struct ibv_send_wr)", size_of::<IbvSendWr>()),
        (
            "offsetof(struct ibv_send_wr, next)",
            offset_of!(IbvSendWr, next),
        ),
        (
            "offsetof(struct ibv_send_wr, sg_list)",
            offset_of!(IbvSendWr, sg_list),
        ),
        (
            "offsetof(struct ibv_send_wr, num_sge)",
            offset_of!(IbvSendWr, num_sge),
        ),
        (
            "offsetof(struct ibv_send_wr, opcode)",
            offset_of!(IbvSendWr, opcode),
        ),
        (
            "offsetof(struct ibv_send_wr, send_flags)",
            offset_of!(IbvSendWr, send_flags),
        ),
        (
            "offsetof(struct ibv_send_wr, imm_data)",
            offset_of!(IbvSendWr, imm_data_or_invalidate_rkey),
        ),
        (
            "offsetof(struct ibv_send_wr, invalidate_rkey)",
            offset_of!(IbvSendWr, imm_data_or_invalidate_rkey),
        ),
        (
            "offsetof(struct ibv_send_wr, wr)",
            offset_of!(IbvSendWr, wr),
        ),
        (
            "sizeof(((struct ibv_send_wr *)0)->wr)",
            size_of::<IbvSendWrWr>(),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
            offset_of!(IbvSendWr, wr.rdma.remote_addr),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
            offset_of!(IbvSendWr, wr.rdma.rkey),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.atomic.compare_add)",
            offset_of!(IbvSendWr, wr.atomic.compare_add),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.atomic.swap)",
            offset_of!(IbvSendWr, wr.atomic.swap),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.atomic.rkey)",
            offset_of!(IbvSendWr, wr.atomic.rkey),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.ud.remote_qpn)",
            offset_of!(IbvSendWr, wr.ud.remote_qpn),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.ud.remote_qkey)",
            offset_of!(IbvSendWr, wr.ud.remote_qkey),
        ),
        (
            "offsetof(struct ibv_send_wr, qp_type)",
            offset_of!(IbvSendWr, qp_type_xrc_remote_srqn),
        ),
        (
            "offsetof(struct ibv_send_wr, bind_mw)",
            offset_of!(IbvSendWr, _bind_mw_tso),
        ),
        ("sizeof(struct ibv_recv_wr)", size_of::<IbvRecvWr>()),
        (
            "offsetof(struct ibv_recv_wr, next)",
            offset_of!(IbvRecvWr, next),
        ),
        (
            "offsetof(struct ibv_recv_wr, sg_list)",
            offset_of!(IbvRecvWr, sg_list),
        ),
        (
            "offsetof(struct ibv_recv_wr, num_sge)",
            offset_of!(IbvRecvWr, num_sge),
        ),
        ("sizeof(struct ibv_wc)", size_of::<IbvWc>()),
        ("offsetof(struct ibv_wc, status)", offset_of!(IbvWc, status)),
        ("offsetof(struct ibv_wc, opcode)", offset_of!(IbvWc, opcode)),
        (
            "offsetof(struct ibv_wc, vendor_err)",
            offset_of!(IbvWc, vendor_err),
        ),
        (
            "offsetof(struct ibv_wc, byte_len)",
            offset_of!(IbvWc, byte_len),
        ),
        (
            "offsetof(struct ibv_wc, imm_data)",
            offset_of!(IbvWc, imm_data_or_invalidated_rkey),
        ),
        (
            "offsetof(struct ibv_wc, invalidated_rkey)",
            offset_of!(IbvWc, imm_data_or_invalidated_rkey),
        ),
        ("offsetof(struct ibv_wc, qp_num)", offset_of!(IbvWc, qp_num)),
        ("offsetof(struct ibv_wc, src_qp)", offset_of!(IbvWc, src_qp)),
        (
            "offsetof(struct ibv_wc, wc_flags)",
            offset_of!(IbvWc, wc_flags),
        ),
        (
            "offsetof(struct ibv_wc, pkey_index)",
            offset_of!(IbvWc, pkey_index),
        ),
        ("offsetof(struct ibv_wc, slid)", offset_of!(IbvWc, slid)),
        ("offsetof(struct ibv_wc, sl)", offset_of!(IbvWc, sl)),
        (
            "offsetof(struct ibv_wc, dlid_path_bits)",
            offset_of!(IbvWc, dlid_path_bits),
        ),
        ("sizeof(struct ibv_qp_cap)", size_of::<IbvQpCap>()),
        (
            "offsetof(struct ibv_qp_cap, max_recv_wr)",
            offset_of!(IbvQpCap, max_recv_wr),
        ),
        (
            "offsetof(struct ibv_qp_cap, max_send_sge)",
            offset_of!(IbvQpCap, max_send_sge),
        ),
        (
            "offsetof(struct ibv_qp_cap, max_recv_sge)",
            offset_of!(IbvQpCap, max_recv_sge),
        ),
        (
            "offsetof(struct ibv_qp_cap, max_inline_data)",
            offset_of!(IbvQpCap, max_inline_data),
        ),
        (
            "sizeof(struct ibv_qp_init_attr)",
            size_of::<IbvQpInitAttr>(),
        ),
        (
            "offsetof(struct ibv_qp_init_attr, send_cq)",
            offset_of!(IbvQpInitAttr, send_cq),
        ),
        (
            "offsetof(struct ibv_qp_init_attr, recv_cq)",
            offset_of!(IbvQpInitAttr, recv_cq),
        ),
        (
            "offsetof(struct ibv_qp_init_attr, srq)",
            offset_of!(IbvQpInitAttr, srq),
        ),
        (
            "offsetof(struct ibv_qp_init_attr, cap)",
            offset_of!(IbvQpInitAttr, cap),
        ),
        (
            "offsetof(struct ibv_qp_init_attr, qp_type)",
            offset_of!(IbvQpInitAttr, qp_type),
        ),
        (
            "offsetof(struct ibv_qp_init_attr, sq_sig_all)",
            offset_of!(IbvQpInitAttr, sq_sig_all),
        ),
        ("sizeof(struct ibv_async_event)", size_of::<IbvAsyncEvent>()),
        (
            "offsetof(struct ibv_async_event, element)",
            offset_of!(IbvAsyncEvent, element),
        ),
        (
            "offsetof(struct ibv_async_event, event_type)",
            offset_of!(IbvAsyncEvent, event_type),
        ),
        // librdmacm
        (
            "sizeof(struct rdma_event_channel)",
            size_of::<RdmaEventChannel>(),
        ),
        (
            "offsetof(struct rdma_event_channel, fd)",
            offset_of!(RdmaEventChannel, fd),
        ),
        ("sizeof(union ibv_gid)", size_of::<IbvGid>()),
        ("_Alignof(union ibv_gid)", align_of::<IbvGid>()),
        ("sizeof(struct rdma_ib_addr)", size_of::<RdmaIbAddr>()),
        (
            "offsetof(struct rdma_ib_addr, dgid)",
            offset_of!(RdmaIbAddr, dgid),
        ),
        (
            "offsetof(struct rdma_ib_addr, pkey)",
            offset_of!(RdmaIbAddr, pkey),
        ),
        ("sizeof(struct rdma_addr)", size_of::<RdmaAddr>()),
        (
            "offsetof(struct rdma_addr, src_addr)",
            offset_of!(RdmaAddr, src_addr),
        ),
        (
            "offsetof(struct rdma_addr, src_sin6)",
            offset_of!(RdmaAddr, src_addr),
        ),
        (
            "offsetof(struct rdma_addr, dst_addr)",
            offset_of!(RdmaAddr, dst_addr),
        ),
        (
            "offsetof(struct rdma_addr, dst_storage)",
            offset_of!(RdmaAddr, dst_addr),
        ),
        (
            "offsetof(struct rdma_addr, addr.ibaddr)",
            offset_of!(RdmaAddr, ibaddr),
        ),
        ("sizeof(struct rdma_route)", size_of::<RdmaRoute>()),
        (
            "offsetof(struct rdma_route, path_rec)",
            offset_of!(RdmaRoute, path_rec),
        ),
        (
            "offsetof(struct rdma_route, num_paths)",
            offset_of!(RdmaRoute, num_paths),
        ),
        ("sizeof(struct rdma_cm_id)", size_of::<RdmaCmId>()),
        (
            "offsetof(struct rdma_cm_id, verbs)",
            offset_of!(RdmaCmId, verbs),
        ),
        (
            "offsetof(struct rdma_cm_id, channel)",
            offset_of!(RdmaCmId, channel),
        ),
        (
            "offsetof(struct rdma_cm_id, context)",
            offset_of!(RdmaCmId, context),
        ),
        ("offsetof(struct rdma_cm_id, qp)", offset_of!(RdmaCmId, qp)),
        (
            "offsetof(struct rdma_cm_id, route)",
            offset_of!(RdmaCmId, route),
        ),
        (
            "offsetof(struct rdma_cm_id, route.addr.src_addr)",
            offset_of!(RdmaCmId, route.addr.src_addr),
        ),
        (
            "offsetof(struct rdma_cm_id, route.addr.dst_addr)",
            offset_of!(RdmaCmId, route.addr.dst_addr),
        ),
        ("offsetof(struct rdma_cm_id, ps)", offset_of!(RdmaCmId, ps)),
        (
            "offsetof(struct rdma_cm_id, port_num)",
            offset_of!(RdmaCmId, port_num),
        ),
        (
            "offsetof(struct rdma_cm_id, event)",
            offset_of!(RdmaCmId, event),
        ),
        (
            "offsetof(struct rdma_cm_id, send_cq_channel)",
            offset_of!(RdmaCmId, send_cq_channel),
        ),
        (
            "offsetof(struct rdma_cm_id, recv_cq)",
            offset_of!(RdmaCmId, recv_cq),
        ),
        ("offsetof(struct rdma_cm_id, pd)", offset_of!(RdmaCmId, pd)),
        (
            "offsetof(struct rdma_cm_id, qp_type)",
            offset_of!(RdmaCmId, qp_type),
        ),
        ("sizeof(struct rdma_conn_param)", size_of::<RdmaConnParam>()),
        (
            "offsetof(struct rdma_conn_param, private_data_len)",
            offset_of!(RdmaConnParam, private_data_len),
        ),
        (
            "offsetof(struct rdma_conn_param, responder_resources)",
            offset_of!(RdmaConnParam, responder_resources),
        ),
        (
            "offsetof(struct rdma_conn_param, initiator_depth)",
            offset_of!(RdmaConnParam, initiator_depth),
        ),
        (
            "offsetof(struct rdma_conn_param, flow_control)",
            offset_of!(RdmaConnParam, flow_control),
        ),
        (
            "offsetof(struct rdma_conn_param, retry_count)",
            offset_of!(RdmaConnParam, retry_count),
        ),
        (
            "offsetof(struct rdma_conn_param, rnr_retry_count)",
            offset_of!(RdmaConnParam, rnr_retry_count),
        ),
        (
            "offsetof(struct rdma_conn_param, srq)",
            offset_of!(RdmaConnParam, srq),
        ),
        (
            "offsetof(struct rdma_conn_param, qp_num)",
            offset_of!(RdmaConnParam, qp_num),
        ),
        ("sizeof(struct rdma_cm_event)", size_of::<RdmaCmEvent>()),
        (
            "offsetof(struct rdma_cm_event, listen_id)",
            offset_of!(RdmaCmEvent, listen_id),
        ),
        (
            "offsetof(struct rdma_cm_event, event)",
            offset_of!(RdmaCmEvent, event),
        ),
        (
            "offsetof(struct rdma_cm_event, status)",
            offset_of!(RdmaCmEvent, status),
        ),
        (
            "offsetof(struct rdma_cm_event, param)",
            offset_of!(RdmaCmEvent, param),
        ),
        (
            "offsetof(struct rdma_cm_event, param.conn.qp_num)",
            offset_of!(RdmaCmEvent, param.conn.qp_num),
        ),
        (
            "sizeof(((struct rdma_cm_event *)0)->param)",
            size_of::<RdmaCmEventParam>(),
        ),
        // sockaddr handling
        (
            "sizeof(struct sockaddr_storage)",
            size_of::<libc::sockaddr_storage>(),
        ),
        (
            "sizeof(struct sockaddr_in6)",
            size_of::<libc::sockaddr_in6>(),
        ),
        // constants passed to the libraries
        ("RDMA_PS_TCP", RDMA_PS_TCP as usize),
        ("IBV_QPT_RC", IBV_QPT_RC as usize),
        ("IBV_TRANSPORT_IWARP", IBV_TRANSPORT_IWARP as usize),
        ("IBV_TRANSPORT_IB", IBV_TRANSPORT_IB as usize),
        ("IBV_TRANSPORT_USNIC_UDP", IBV_TRANSPORT_USNIC_UDP as usize),
        (
            "IBV_TRANSPORT_UNSPECIFIED",
            IBV_TRANSPORT_UNSPECIFIED as usize,
        ),
        ("IBV_ATOMIC_NONE", IBV_ATOMIC_NONE as usize),
        ("IBV_SYSFS_NAME_MAX", IBV_SYSFS_NAME_MAX),
        ("IBV_SYSFS_PATH_MAX", IBV_SYSFS_PATH_MAX),
        (
            "IBV_SEND_INLINE",
            cxgb4::ffi::handles::IBV_SEND_INLINE as usize,
        ),
    ]
}

const HEADERS: [&str; 2] = [
    "/usr/include/infiniband/verbs.h",
    "/usr/include/rdma/rdma_cma.h",
];

#[test]
fn repr_c_layouts_match_rdma_core_headers() {
    let rows = table();
    match testkit::check_c_layout(&HEADERS, &rows) {
        Ok(Some(_)) => {}
        Ok(None) => {
            println!("skipped: libibverbs-dev/librdmacm-dev not installed");
            return;
        }
        Err(e) => panic!("{e} (install libibverbs-dev librdmacm-dev)"),
    }
    // The offsets the notes computed for the inline verbs (x86-64).
    assert_eq!(offset_of!(IbvContext, ops.poll_cq), 96);
    assert_eq!(offset_of!(IbvContext, ops.req_notify_cq), 104);
    assert_eq!(offset_of!(IbvContext, ops.post_send), 208);
    assert_eq!(offset_of!(IbvContext, ops.post_recv), 216);
    println!(
        "{} sizes, offsets and constants match rdma-core's headers",
        rows.len()
    );
}
