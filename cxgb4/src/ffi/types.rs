//! `#[repr(C)]` layouts of rdma-core 44 (Debian 12 "bookworm", tag v44.0) for
//! exactly the structs and fields this crate uses, and the numeric constants
//! it passes to or reads from the libraries.
//!
//! Sources: `/usr/include/infiniband/verbs.h` and `/usr/include/rdma/rdma_cma.h`
//! of libibverbs-dev / librdmacm-dev 44.0-2. Names follow the C names (minus
//! the `struct` keyword, in Rust case); a field the crate never reads is kept
//! (as a padding or opaque member) only where a later field's offset or the
//! struct's size depends on it. `cxgb4/tests/layout.rs` compiles a C file
//! against those headers and compares every size and offset declared here.
//!
//! Sizes on x86-64 (LP64): `ibv_context` 328, `ibv_context_ops` 256,
//! `ibv_send_wr` 128, `ibv_wc` 48, `ibv_device_attr` 232, `ibv_port_attr` 52,
//! `rdma_cm_id` 416, `rdma_cm_event` 80, `rdma_conn_param` 24.

use core::ffi::{c_char, c_int, c_uint, c_void};

/// `IBV_SYSFS_NAME_MAX` (64): the size of `ibv_device.name` and `dev_name`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX` (256): the size of `ibv_device.dev_path` and `ibdev_path`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `enum ibv_transport_type`: `IBV_TRANSPORT_UNKNOWN` (-1).
pub const IBV_TRANSPORT_UNKNOWN: c_int = -1;
/// `IBV_TRANSPORT_IB` (0): InfiniBand or RoCE.
pub const IBV_TRANSPORT_IB: c_int = 0;
/// `IBV_TRANSPORT_IWARP` (1): iWARP (iw_cxgb4, siw, irdma in iWARP mode).
pub const IBV_TRANSPORT_IWARP: c_int = 1;
/// `IBV_TRANSPORT_USNIC` (2).
pub const IBV_TRANSPORT_USNIC: c_int = 2;
/// `IBV_TRANSPORT_USNIC_UDP` (3).
pub const IBV_TRANSPORT_USNIC_UDP: c_int = 3;
/// `IBV_TRANSPORT_UNSPECIFIED` (4).
pub const IBV_TRANSPORT_UNSPECIFIED: c_int = 4;

/// `enum ibv_atomic_cap`: `IBV_ATOMIC_NONE` (0), the value iw_cxgb4 and siw report.
pub const IBV_ATOMIC_NONE: c_int = 0;

/// `IBV_QPT_RC` (2) of `enum ibv_qp_type`: the only QP type iWARP has.
pub const IBV_QPT_RC: c_int = 2;

/// `RDMA_PS_TCP` (0x0106) of `enum rdma_port_space`: reliable connected, the
/// port space of iWARP connections.
pub const RDMA_PS_TCP: c_int = 0x0106;

/// `struct _ibv_device_ops`: two reserved function pointers at the head of
/// `struct ibv_device`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbvDeviceOps {
    /// `_dummy1`, never called.
    pub _dummy1: *mut c_void,
    /// `_dummy2`, never called.
    pub _dummy2: *mut c_void,
}

/// `struct ibv_device`: one entry of `ibv_get_device_list(3)`; read-only here.
#[repr(C)]
pub struct IbvDevice {
    /// `_ops`: reserved.
    pub _ops: IbvDeviceOps,
    /// `node_type` (`enum ibv_node_type`; 4 = `IBV_NODE_RNIC`).
    pub node_type: c_int,
    /// `transport_type` (`enum ibv_transport_type`; see `IBV_TRANSPORT_*`).
    pub transport_type: c_int,
    /// `name`: the kernel device name, NUL-terminated (`cxgb4_0`, `siw0`).
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    /// `dev_name`: the uverbs device name (`uverbs0`).
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    /// `dev_path`: sysfs path of the infiniband_verbs class device.
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    /// `ibdev_path`: sysfs path of the infiniband class device.
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// `poll_cq` of `struct ibv_context_ops` (what `ibv_poll_cq`, a static
/// inline function of verbs.h, calls).
pub type PollCqFn =
    unsafe extern "C" fn(cq: *mut IbvCq, num_entries: c_int, wc: *mut IbvWc) -> c_int;
/// `req_notify_cq` of `struct ibv_context_ops` (`ibv_req_notify_cq`).
pub type ReqNotifyCqFn = unsafe extern "C" fn(cq: *mut IbvCq, solicited_only: c_int) -> c_int;
/// `post_send` of `struct ibv_context_ops` (`ibv_post_send`).
pub type PostSendFn =
    unsafe extern "C" fn(qp: *mut IbvQp, wr: *mut IbvSendWr, bad_wr: *mut *mut IbvSendWr) -> c_int;
/// `post_recv` of `struct ibv_context_ops` (`ibv_post_recv`).
pub type PostRecvFn =
    unsafe extern "C" fn(qp: *mut IbvQp, wr: *mut IbvRecvWr, bad_wr: *mut *mut IbvRecvWr) -> c_int;

/// `struct ibv_context_ops`: 32 function pointers. The four the data path
/// calls are named (indices 11, 12, 25, 26: offsets 88, 96, 200, 208 inside
/// the ops, 96, 104, 208, 216 inside `ibv_context`); the others are opaque
/// slots kept for the layout.
#[repr(C)]
pub struct IbvContextOps {
    /// Slots 0..=10 (`_compat_query_device` .. `_compat_create_cq`).
    pub _slots_0_10: [*mut c_void; 11],
    /// Slot 11: `poll_cq`.
    pub poll_cq: Option<PollCqFn>,
    /// Slot 12: `req_notify_cq`.
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    /// Slots 13..=24 (`_compat_cq_event` .. `_compat_destroy_qp`).
    pub _slots_13_24: [*mut c_void; 12],
    /// Slot 25: `post_send`.
    pub post_send: Option<PostSendFn>,
    /// Slot 26: `post_recv`.
    pub post_recv: Option<PostRecvFn>,
    /// Slots 27..=31 (`_compat_create_ah` .. `_compat_async_event`).
    pub _slots_27_31: [*mut c_void; 5],
}

/// `struct ibv_context`: an open device (`ibv_open_device(3)`, or the one
/// librdmacm opened for a cm_id).
#[repr(C)]
pub struct IbvContext {
    /// `device`.
    pub device: *mut IbvDevice,
    /// `ops`.
    pub ops: IbvContextOps,
    /// `cmd_fd`: the uverbs command fd.
    pub cmd_fd: c_int,
    /// `async_fd`: readable when `ibv_get_async_event` has an event.
    pub async_fd: c_int,
    /// `num_comp_vectors`.
    pub num_comp_vectors: c_int,
    /// `mutex`.
    pub mutex: libc::pthread_mutex_t,
    /// `abi_compat`.
    pub abi_compat: *mut c_void,
}

/// `struct ibv_device_attr` (`ibv_query_device(3)`). Integer types as in C:
/// `int` fields are `i32`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvDeviceAttr {
    /// `fw_ver`: firmware version string, NUL-terminated.
    pub fw_ver: [c_char; 64],
    /// `node_guid` (big-endian).
    pub node_guid: u64,
    /// `sys_image_guid` (big-endian).
    pub sys_image_guid: u64,
    /// `max_mr_size`, bytes.
    pub max_mr_size: u64,
    /// `page_size_cap`: bit mask of supported page sizes.
    pub page_size_cap: u64,
    /// `vendor_id` (IEEE OUI; Chelsio 0x1425).
    pub vendor_id: u32,
    /// `vendor_part_id` (PCI device id; T5 0x54xx, T6 0x64xx).
    pub vendor_part_id: u32,
    /// `hw_ver`.
    pub hw_ver: u32,
    /// `max_qp`.
    pub max_qp: c_int,
    /// `max_qp_wr`: WRs per work queue.
    pub max_qp_wr: c_int,
    /// `device_cap_flags`.
    pub device_cap_flags: c_uint,
    /// `max_sge`: SGEs per WR (uverbs reports min(send, recv)).
    pub max_sge: c_int,
    /// `max_sge_rd`: SGEs per RDMA Read WR.
    pub max_sge_rd: c_int,
    /// `max_cq`.
    pub max_cq: c_int,
    /// `max_cqe`: entries per CQ.
    pub max_cqe: c_int,
    /// `max_mr`.
    pub max_mr: c_int,
    /// `max_pd`.
    pub max_pd: c_int,
    /// `max_qp_rd_atom`: incoming RDMA Reads per QP (IRD).
    pub max_qp_rd_atom: c_int,
    /// `max_ee_rd_atom`.
    pub max_ee_rd_atom: c_int,
    /// `max_res_rd_atom`: IRD resources of the adapter.
    pub max_res_rd_atom: c_int,
    /// `max_qp_init_rd_atom`: outgoing RDMA Reads per QP (ORD).
    pub max_qp_init_rd_atom: c_int,
    /// `max_ee_init_rd_atom`.
    pub max_ee_init_rd_atom: c_int,
    /// `atomic_cap` (`enum ibv_atomic_cap`; 0 = none).
    pub atomic_cap: c_int,
    /// `max_ee` .. `max_srq_sge`: 14 `int`s this crate does not read.
    pub _max_ee_to_max_srq_sge: [c_int; 14],
    /// `max_pkeys`.
    pub max_pkeys: u16,
    /// `local_ca_ack_delay`.
    pub local_ca_ack_delay: u8,
    /// `phys_port_cnt`.
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr` (`ibv_query_port(3)`). The exported
/// `ibv_query_port@@IBVERBS_1.1` fills the older, shorter
/// `struct _compat_ibv_port_attr` into it; verbs.h's inline wrapper zeroes the
/// whole struct first, and so does this crate.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvPortAttr {
    /// `state` (`enum ibv_port_state`; 4 = `IBV_PORT_ACTIVE`).
    pub state: c_int,
    /// `max_mtu` (`enum ibv_mtu`).
    pub max_mtu: c_int,
    /// `active_mtu` (`enum ibv_mtu`).
    pub active_mtu: c_int,
    /// `gid_tbl_len`.
    pub gid_tbl_len: c_int,
    /// `port_cap_flags`.
    pub port_cap_flags: u32,
    /// `max_msg_sz`, bytes.
    pub max_msg_sz: u32,
    /// `bad_pkey_cntr`.
    pub bad_pkey_cntr: u32,
    /// `qkey_viol_cntr`.
    pub qkey_viol_cntr: u32,
    /// `pkey_tbl_len`.
    pub pkey_tbl_len: u16,
    /// `lid`.
    pub lid: u16,
    /// `sm_lid`.
    pub sm_lid: u16,
    /// `lmc`.
    pub lmc: u8,
    /// `max_vl_num`.
    pub max_vl_num: u8,
    /// `sm_sl`.
    pub sm_sl: u8,
    /// `subnet_timeout`.
    pub subnet_timeout: u8,
    /// `init_type_reply`.
    pub init_type_reply: u8,
    /// `active_width`.
    pub active_width: u8,
    /// `active_speed`.
    pub active_speed: u8,
    /// `phys_state`.
    pub phys_state: u8,
    /// `link_layer` (1 = `IBV_LINK_LAYER_INFINIBAND`, 2 = `IBV_LINK_LAYER_ETHERNET`).
    pub link_layer: u8,
    /// `flags`.
    pub flags: u8,
    /// `port_cap_flags2`.
    pub port_cap_flags2: u16,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct IbvPd {
    /// `context`.
    pub context: *mut IbvContext,
    /// `handle`.
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    /// `context`.
    pub context: *mut IbvContext,
    /// `pd`.
    pub pd: *mut IbvPd,
    /// `addr`: first byte registered.
    pub addr: *mut c_void,
    /// `length`, bytes.
    pub length: usize,
    /// `handle`.
    pub handle: u32,
    /// `lkey` (= `rkey` in iWARP: the STag).
    pub lkey: u32,
    /// `rkey`.
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct IbvCompChannel {
    /// `context`.
    pub context: *mut IbvContext,
    /// `fd`: readable when `ibv_get_cq_event` has an event.
    pub fd: c_int,
    /// `refcnt`.
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct IbvCq {
    /// `context`: whose `ops.poll_cq` / `req_notify_cq` serve this CQ.
    pub context: *mut IbvContext,
    /// `channel`.
    pub channel: *mut IbvCompChannel,
    /// `cq_context`.
    pub cq_context: *mut c_void,
    /// `handle`.
    pub handle: u32,
    /// `cqe`: the actual number of entries.
    pub cqe: c_int,
    /// `mutex`.
    pub mutex: libc::pthread_mutex_t,
    /// `cond`.
    pub cond: libc::pthread_cond_t,
    /// `comp_events_completed`.
    pub comp_events_completed: u32,
    /// `async_events_completed`.
    pub async_events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct IbvQp {
    /// `context`: whose `ops.post_send` / `post_recv` serve this QP.
    pub context: *mut IbvContext,
    /// `qp_context`.
    pub qp_context: *mut c_void,
    /// `pd`.
    pub pd: *mut IbvPd,
    /// `send_cq`.
    pub send_cq: *mut IbvCq,
    /// `recv_cq`.
    pub recv_cq: *mut IbvCq,
    /// `srq`.
    pub srq: *mut c_void,
    /// `handle`.
    pub handle: u32,
    /// `qp_num`.
    pub qp_num: u32,
    /// `state` (`enum ibv_qp_state`).
    pub state: c_int,
    /// `qp_type` (`enum ibv_qp_type`).
    pub qp_type: c_int,
    /// `mutex`.
    pub mutex: libc::pthread_mutex_t,
    /// `cond`.
    pub cond: libc::pthread_cond_t,
    /// `events_completed`.
    pub events_completed: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvSge {
    /// `addr`: first byte (an address inside a registered MR; for inline data
    /// any readable address).
    pub addr: u64,
    /// `length`, bytes.
    pub length: u32,
    /// `lkey` (ignored for inline data).
    pub lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`: RDMA Write / Read.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvRdmaWr {
    /// `remote_addr`: the peer's iova.
    pub remote_addr: u64,
    /// `rkey`: the peer's STag.
    pub rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvAtomicWr {
    /// `remote_addr`.
    pub remote_addr: u64,
    /// `compare_add`: compare value (CAS) or addend (FAA).
    pub compare_add: u64,
    /// `swap`.
    pub swap: u64,
    /// `rkey`.
    pub rkey: u32,
}

/// `wr.ud` of `struct ibv_send_wr` (unused by iWARP; kept for the union's size).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbvUdWr {
    /// `ah`.
    pub ah: *mut c_void,
    /// `remote_qpn`.
    pub remote_qpn: u32,
    /// `remote_qkey`.
    pub remote_qkey: u32,
}

/// The `wr` union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union IbvSendWrWr {
    /// `wr.rdma`.
    pub rdma: IbvRdmaWr,
    /// `wr.atomic`.
    pub atomic: IbvAtomicWr,
    /// `wr.ud`.
    pub ud: IbvUdWr,
}

/// `struct ibv_send_wr` (`ibv_post_send(3)`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvSendWr {
    /// `wr_id`.
    pub wr_id: u64,
    /// `next`: the next WR of the list, or null.
    pub next: *mut IbvSendWr,
    /// `sg_list`.
    pub sg_list: *mut IbvSge,
    /// `num_sge`.
    pub num_sge: c_int,
    /// `opcode` (`enum ibv_wr_opcode`).
    pub opcode: c_uint,
    /// `send_flags` (`enum ibv_send_flags`).
    pub send_flags: c_uint,
    /// The anonymous union `{ __be32 imm_data; uint32_t invalidate_rkey; }`:
    /// the immediate in network byte order for `*_WITH_IMM`, the rkey to
    /// invalidate (host order) for `*_INV`.
    pub imm_data_or_invalidate_rkey: u32,
    /// `wr`.
    pub wr: IbvSendWrWr,
    /// `qp_type` union (`xrc.remote_srqn`).
    pub qp_type_xrc_remote_srqn: u32,
    /// The trailing anonymous union (`bind_mw`, `tso`): 48 bytes, unused.
    pub _bind_mw_tso: [u64; 6],
}

/// `struct ibv_recv_wr` (`ibv_post_recv(3)`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvRecvWr {
    /// `wr_id`.
    pub wr_id: u64,
    /// `next`.
    pub next: *mut IbvRecvWr,
    /// `sg_list`.
    pub sg_list: *mut IbvSge,
    /// `num_sge`.
    pub num_sge: c_int,
}

/// `struct ibv_wc` (`ibv_poll_cq(3)`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvWc {
    /// `wr_id`.
    pub wr_id: u64,
    /// `status` (`enum ibv_wc_status`).
    pub status: c_uint,
    /// `opcode` (`enum ibv_wc_opcode`).
    pub opcode: c_uint,
    /// `vendor_err`.
    pub vendor_err: u32,
    /// `byte_len`, bytes.
    pub byte_len: u32,
    /// The anonymous union `{ __be32 imm_data; uint32_t invalidated_rkey; }`.
    pub imm_data_or_invalidated_rkey: u32,
    /// `qp_num`.
    pub qp_num: u32,
    /// `src_qp`.
    pub src_qp: u32,
    /// `wc_flags` (`enum ibv_wc_flags`).
    pub wc_flags: c_uint,
    /// `pkey_index`.
    pub pkey_index: u16,
    /// `slid`.
    pub slid: u16,
    /// `sl`.
    pub sl: u8,
    /// `dlid_path_bits`.
    pub dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvQpCap {
    /// `max_send_wr`.
    pub max_send_wr: u32,
    /// `max_recv_wr`.
    pub max_recv_wr: u32,
    /// `max_send_sge`.
    pub max_send_sge: u32,
    /// `max_recv_sge`.
    pub max_recv_sge: u32,
    /// `max_inline_data`, bytes.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (`rdma_create_qp(3)`).
#[repr(C)]
pub struct IbvQpInitAttr {
    /// `qp_context`.
    pub qp_context: *mut c_void,
    /// `send_cq`.
    pub send_cq: *mut IbvCq,
    /// `recv_cq`.
    pub recv_cq: *mut IbvCq,
    /// `srq`.
    pub srq: *mut c_void,
    /// `cap`: requested on input, actual on output.
    pub cap: IbvQpCap,
    /// `qp_type` (`IBV_QPT_RC`).
    pub qp_type: c_int,
    /// `sq_sig_all`: nonzero to signal every send WR.
    pub sq_sig_all: c_int,
}

/// `struct ibv_async_event` (`ibv_get_async_event(3)`).
#[repr(C)]
pub struct IbvAsyncEvent {
    /// `element`: a union of `cq`, `qp`, `srq`, `wq` pointers and `port_num`.
    pub element: *mut c_void,
    /// `event_type` (`enum ibv_event_type`).
    pub event_type: c_uint,
}

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct RdmaEventChannel {
    /// `fd`: readable when `rdma_get_cm_event` has an event.
    pub fd: c_int,
}

/// `union ibv_gid`: 16 bytes, 8-byte aligned (its `global` member holds two
/// `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct IbvGid {
    /// The raw GID.
    pub raw: [u8; 16],
}

/// `struct rdma_ib_addr` (only its size matters here).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RdmaIbAddr {
    /// `sgid`.
    pub sgid: IbvGid,
    /// `dgid`.
    pub dgid: IbvGid,
    /// `pkey` (big-endian).
    pub pkey: u16,
}

/// `struct rdma_addr`. Each of the first two anonymous unions has
/// `struct sockaddr_storage` as its largest member, so it is declared as one.
#[repr(C)]
pub struct RdmaAddr {
    /// The `src_addr` / `src_sin` / `src_sin6` / `src_storage` union.
    pub src_addr: libc::sockaddr_storage,
    /// The `dst_addr` / ... / `dst_storage` union.
    pub dst_addr: libc::sockaddr_storage,
    /// `addr.ibaddr`.
    pub ibaddr: RdmaIbAddr,
}

/// `struct rdma_route`.
#[repr(C)]
pub struct RdmaRoute {
    /// `addr`.
    pub addr: RdmaAddr,
    /// `path_rec` (`struct ibv_sa_path_rec *`, IB only).
    pub path_rec: *mut c_void,
    /// `num_paths`.
    pub num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct RdmaCmId {
    /// `verbs`: the device context librdmacm opened (null until bound).
    pub verbs: *mut IbvContext,
    /// `channel`.
    pub channel: *mut RdmaEventChannel,
    /// `context`: the user's pointer.
    pub context: *mut c_void,
    /// `qp`: set by `rdma_create_qp`.
    pub qp: *mut IbvQp,
    /// `route`.
    pub route: RdmaRoute,
    /// `ps` (`enum rdma_port_space`).
    pub ps: c_int,
    /// `port_num`.
    pub port_num: u8,
    /// `event`.
    pub event: *mut RdmaCmEvent,
    /// `send_cq_channel`.
    pub send_cq_channel: *mut IbvCompChannel,
    /// `send_cq`.
    pub send_cq: *mut IbvCq,
    /// `recv_cq_channel`.
    pub recv_cq_channel: *mut IbvCompChannel,
    /// `recv_cq`.
    pub recv_cq: *mut IbvCq,
    /// `srq`.
    pub srq: *mut c_void,
    /// `pd`.
    pub pd: *mut IbvPd,
    /// `qp_type` (`enum ibv_qp_type`).
    pub qp_type: c_int,
}

/// `struct rdma_conn_param` (`rdma_connect(3)`, `rdma_accept(3)`, and the
/// `param.conn` of connection events).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RdmaConnParam {
    /// `private_data`.
    pub private_data: *const c_void,
    /// `private_data_len`, bytes.
    pub private_data_len: u8,
    /// `responder_resources`: IRD.
    pub responder_resources: u8,
    /// `initiator_depth`: ORD.
    pub initiator_depth: u8,
    /// `flow_control`.
    pub flow_control: u8,
    /// `retry_count` (ignored by iWARP).
    pub retry_count: u8,
    /// `rnr_retry_count` (ignored by iWARP).
    pub rnr_retry_count: u8,
    /// `srq`.
    pub srq: u8,
    /// `qp_num`.
    pub qp_num: u32,
}

/// The `param` union of `struct rdma_cm_event`: `conn` (24 bytes) or `ud`
/// (`struct rdma_ud_param`, 56 bytes, unused by iWARP).
#[repr(C)]
#[derive(Clone, Copy)]
pub union RdmaCmEventParam {
    /// `param.conn`.
    pub conn: RdmaConnParam,
    /// `param.ud`, opaque.
    pub ud: [u64; 7],
}

/// `struct rdma_cm_event` (`rdma_get_cm_event(3)`).
#[repr(C)]
pub struct RdmaCmEvent {
    /// `id`: the id the event is for (for a connect request: the new id).
    pub id: *mut RdmaCmId,
    /// `listen_id`: for a connect request, the listening id.
    pub listen_id: *mut RdmaCmId,
    /// `event` (`enum rdma_cm_event_type`).
    pub event: c_uint,
    /// `status`: 0, or a negative errno / a transport reject reason.
    pub status: c_int,
    /// `param`.
    pub param: RdmaCmEventParam,
}

impl IbvSendWr {
    /// `wr.rdma`, read as integers (sound whichever member was written: every
    /// bit pattern is a valid `IbvRdmaWr`).
    pub fn rdma(&self) -> IbvRdmaWr {
        // SAFETY: plain-integer member of a `Copy` union, fully initialized
        // (the union's 32 bytes cover it).
        unsafe { self.wr.rdma }
    }

    /// `wr.atomic`, read as integers (sound as for [`IbvSendWr::rdma`]).
    pub fn atomic(&self) -> IbvAtomicWr {
        // SAFETY: as above; `atomic` is the union's largest member.
        unsafe { self.wr.atomic }
    }
}
