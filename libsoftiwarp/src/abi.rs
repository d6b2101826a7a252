//! rdma-core 44 C layouts this library needs beyond `cxgb4::ffi::types` (which holds
//! the shared ones), and the enum values of `<infiniband/verbs.h>` and
//! `<rdma/rdma_cma.h>` it uses. Checked against Debian's headers by
//! `tests/layout.rs`.

use std::ffi::{c_char, c_int, c_uint, c_void};

pub use cxgb4::ffi::types::{IbvGid, IbvQpCap};

/// `IBV_NODE_RNIC`: an iWARP RNIC (`enum ibv_node_type`).
pub const IBV_NODE_RNIC: c_int = 4;
/// `IBV_PORT_ACTIVE` (`enum ibv_port_state`).
pub const IBV_PORT_ACTIVE: c_int = 4;
/// `IBV_LINK_LAYER_ETHERNET`.
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_QPS_RESET` (`enum ibv_qp_state`).
pub const IBV_QPS_RESET: c_int = 0;
/// `IBV_QPS_INIT`.
pub const IBV_QPS_INIT: c_int = 1;
/// `IBV_QPS_RTR`.
pub const IBV_QPS_RTR: c_int = 2;
/// `IBV_QPS_RTS`.
pub const IBV_QPS_RTS: c_int = 3;
/// `IBV_QPS_ERR`.
pub const IBV_QPS_ERR: c_int = 6;
/// `IBV_QP_STATE` bit of `enum ibv_qp_attr_mask`.
pub const IBV_QP_STATE: c_int = 1;
/// `IBV_QP_ACCESS_FLAGS` bit.
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
/// `IBV_QP_PORT` bit.
pub const IBV_QP_PORT: c_int = 1 << 5;
/// `IBV_ACCESS_REMOTE_WRITE` (`enum ibv_access_flags`).
pub const IBV_ACCESS_REMOTE_WRITE: c_uint = 1 << 1;
/// `IBV_ACCESS_REMOTE_READ`.
pub const IBV_ACCESS_REMOTE_READ: c_uint = 1 << 2;
/// `IBV_QPT_UC` (`enum ibv_qp_type`; `IBV_QPT_RC` is in `cxgb4::ffi::types`).
pub const IBV_QPT_UC: c_int = 3;
/// `IBV_QPT_UD`.
pub const IBV_QPT_UD: c_int = 4;
/// `IBV_QPT_XRC_SEND`.
pub const IBV_QPT_XRC_SEND: c_int = 9;
/// `IBV_QPT_XRC_RECV`.
pub const IBV_QPT_XRC_RECV: c_int = 10;
/// `IBV_SEND_FENCE` .. `IBV_SEND_INLINE` (`enum ibv_send_flags`).
pub const IBV_SEND_FENCE: c_uint = 1;
/// `IBV_SEND_SIGNALED`.
pub const IBV_SEND_SIGNALED: c_uint = 2;
/// `IBV_SEND_SOLICITED`.
pub const IBV_SEND_SOLICITED: c_uint = 4;
/// `IBV_SEND_INLINE`.
pub const IBV_SEND_INLINE: c_uint = 8;
/// `IBV_WR_RDMA_WRITE` (`enum ibv_wr_opcode`).
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
/// `IBV_WR_RDMA_WRITE_WITH_IMM`.
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
/// `IBV_WR_SEND`.
pub const IBV_WR_SEND: c_uint = 2;
/// `IBV_WR_SEND_WITH_IMM`.
pub const IBV_WR_SEND_WITH_IMM: c_uint = 3;
/// `IBV_WR_RDMA_READ`.
pub const IBV_WR_RDMA_READ: c_uint = 4;
/// `IBV_WR_ATOMIC_CMP_AND_SWP`: RFC 7306 Compare-and-Swap (`wr.atomic`).
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
/// `IBV_WR_ATOMIC_FETCH_AND_ADD`: RFC 7306 Fetch-and-Add (`wr.atomic`).
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;
/// `IBV_WR_LOCAL_INV`.
pub const IBV_WR_LOCAL_INV: c_uint = 7;
/// `IBV_ATOMIC_HCA` (`enum ibv_atomic_cap`): atomics are atomic with respect to the
/// other atomics of the device (through any QP), not to the host CPU's accesses.
pub const IBV_ATOMIC_HCA: c_int = 1;
/// `IBV_WR_SEND_WITH_INV`.
pub const IBV_WR_SEND_WITH_INV: c_uint = 9;
/// `IBV_ACCESS_OPTIONAL_RANGE`: access bits a provider may ignore (relaxed ordering ...).
pub const IBV_ACCESS_OPTIONAL_RANGE: c_uint = 0x3ff0_0000;
/// `RDMA_PS_TCP` (`enum rdma_port_space`).
pub const RDMA_PS_TCP: c_int = 0x0106;
/// `RDMA_PS_IPOIB`.
pub const RDMA_PS_IPOIB: c_int = 0x0002;
/// `RDMA_PS_IB`.
pub const RDMA_PS_IB: c_int = 0x013F;
/// `RDMA_PS_UDP`.
pub const RDMA_PS_UDP: c_int = 0x0111;
/// `RAI_PASSIVE` (`rdma_getaddrinfo` hint flag).
pub const RAI_PASSIVE: c_int = 1;
/// `IBV_MTU_256` .. `IBV_MTU_4096` are 1 ..= 5 (`enum ibv_mtu`).
pub fn ibv_mtu(ip_mtu: usize) -> c_int {
    match ip_mtu {
        0..512 => 1,
        512..1024 => 2,
        1024..2048 => 3,
        2048..4096 => 4,
        _ => 5,
    }
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvGlobalRoute {
    /// `dgid`.
    pub dgid: IbvGid,
    /// `flow_label`.
    pub flow_label: u32,
    /// `sgid_index`.
    pub sgid_index: u8,
    /// `hop_limit`.
    pub hop_limit: u8,
    /// `traffic_class`.
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvAhAttr {
    /// `grh`.
    pub grh: IbvGlobalRoute,
    /// `dlid`.
    pub dlid: u16,
    /// `sl`.
    pub sl: u8,
    /// `src_path_bits`.
    pub src_path_bits: u8,
    /// `static_rate`.
    pub static_rate: u8,
    /// `is_global`.
    pub is_global: u8,
    /// `port_num`.
    pub port_num: u8,
}

/// `struct ibv_qp_attr` (`ibv_query_qp(3)`, `ibv_modify_qp(3)`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvQpAttr {
    /// `qp_state` (`enum ibv_qp_state`).
    pub qp_state: c_int,
    /// `cur_qp_state`.
    pub cur_qp_state: c_int,
    /// `path_mtu` (`enum ibv_mtu`).
    pub path_mtu: c_int,
    /// `path_mig_state`.
    pub path_mig_state: c_int,
    /// `qkey`.
    pub qkey: u32,
    /// `rq_psn`.
    pub rq_psn: u32,
    /// `sq_psn`.
    pub sq_psn: u32,
    /// `dest_qp_num`.
    pub dest_qp_num: u32,
    /// `qp_access_flags`.
    pub qp_access_flags: c_uint,
    /// `cap`.
    pub cap: IbvQpCap,
    /// `ah_attr`.
    pub ah_attr: IbvAhAttr,
    /// `alt_ah_attr`.
    pub alt_ah_attr: IbvAhAttr,
    /// `pkey_index`.
    pub pkey_index: u16,
    /// `alt_pkey_index`.
    pub alt_pkey_index: u16,
    /// `en_sqd_async_notify`.
    pub en_sqd_async_notify: u8,
    /// `sq_draining`.
    pub sq_draining: u8,
    /// `max_rd_atomic`: ORD.
    pub max_rd_atomic: u8,
    /// `max_dest_rd_atomic`: IRD.
    pub max_dest_rd_atomic: u8,
    /// `min_rnr_timer`.
    pub min_rnr_timer: u8,
    /// `port_num`.
    pub port_num: u8,
    /// `timeout`.
    pub timeout: u8,
    /// `retry_cnt`.
    pub retry_cnt: u8,
    /// `rnr_retry`.
    pub rnr_retry: u8,
    /// `alt_port_num`.
    pub alt_port_num: u8,
    /// `alt_timeout`.
    pub alt_timeout: u8,
    /// `rate_limit`.
    pub rate_limit: u32,
}

/// `struct ibv_gid_entry` (`ibv_query_gid_ex(3)`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvGidEntry {
    /// `gid`.
    pub gid: IbvGid,
    /// `gid_index`.
    pub gid_index: u32,
    /// `port_num`.
    pub port_num: u32,
    /// `gid_type` (`IBV_GID_TYPE_IB` 0).
    pub gid_type: u32,
    /// `ndev_ifindex`.
    pub ndev_ifindex: u32,
}

/// `struct rdma_addrinfo` (`rdma_getaddrinfo(3)`).
#[repr(C)]
pub struct RdmaAddrinfo {
    /// `ai_flags` (`RAI_*`).
    pub ai_flags: c_int,
    /// `ai_family`.
    pub ai_family: c_int,
    /// `ai_qp_type`.
    pub ai_qp_type: c_int,
    /// `ai_port_space`.
    pub ai_port_space: c_int,
    /// `ai_src_len`.
    pub ai_src_len: libc::socklen_t,
    /// `ai_dst_len`.
    pub ai_dst_len: libc::socklen_t,
    /// `ai_src_addr`.
    pub ai_src_addr: *mut libc::sockaddr,
    /// `ai_dst_addr`.
    pub ai_dst_addr: *mut libc::sockaddr,
    /// `ai_src_canonname`.
    pub ai_src_canonname: *mut c_char,
    /// `ai_dst_canonname`.
    pub ai_dst_canonname: *mut c_char,
    /// `ai_route_len`.
    pub ai_route_len: usize,
    /// `ai_route`.
    pub ai_route: *mut c_void,
    /// `ai_connect_len`.
    pub ai_connect_len: usize,
    /// `ai_connect`.
    pub ai_connect: *mut c_void,
    /// `ai_next`.
    pub ai_next: *mut RdmaAddrinfo,
}

/// `struct ibv_srq` (`ibv_create_srq(3)`): the SRQ handle the application holds.
#[repr(C)]
pub struct IbvSrq {
    /// `context`: whose `ops.post_srq_recv` serves this SRQ.
    pub context: *mut cxgb4::ffi::types::IbvContext,
    /// `srq_context`: the application's, as created.
    pub srq_context: *mut c_void,
    /// `pd`.
    pub pd: *mut cxgb4::ffi::types::IbvPd,
    /// `handle`: for logs only.
    pub handle: u32,
    /// `mutex` (libibverbs' own; unused here).
    pub mutex: libc::pthread_mutex_t,
    /// `cond` (unused here).
    pub cond: libc::pthread_cond_t,
    /// `events_completed`.
    pub events_completed: u32,
}

/// `struct ibv_srq_attr`: `max_wr` (WRs), `max_sge`, `srq_limit` (WRs; 0 = not armed).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvSrqAttr {
    /// `max_wr`.
    pub max_wr: u32,
    /// `max_sge`.
    pub max_sge: u32,
    /// `srq_limit`.
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct IbvSrqInitAttr {
    /// `srq_context`.
    pub srq_context: *mut c_void,
    /// `attr`: requested on input, granted on output.
    pub attr: IbvSrqAttr,
}

/// `IBV_SRQ_MAX_WR` (`enum ibv_srq_attr_mask`).
pub const IBV_SRQ_MAX_WR: c_int = 1;
/// `IBV_SRQ_LIMIT`.
pub const IBV_SRQ_LIMIT: c_int = 2;

/// `post_srq_recv` of `struct ibv_context_ops` (what the header inline
/// `ibv_post_srq_recv` calls).
pub type PostSrqRecvFn = unsafe extern "C" fn(
    srq: *mut IbvSrq,
    wr: *mut cxgb4::ffi::types::IbvRecvWr,
    bad_wr: *mut *mut cxgb4::ffi::types::IbvRecvWr,
) -> c_int;

/// Slot of `post_srq_recv` in `struct ibv_context_ops` (index 20), as an index into
/// `IbvContextOps::_slots_13_24` (which starts at slot 13).
pub const POST_SRQ_RECV_SLOT: usize = 20 - 13;

// ---------------------------------------------------------------- extended verbs

use cxgb4::ffi::types::{IbvContext, IbvCq, IbvDeviceAttr, IbvPd, IbvPortAttr, IbvQp, IbvSge};

/// `verbs_context.query_port`: the extended `ibv_query_port` (`port_attr_len` bytes of
/// `struct ibv_port_attr`).
pub type QueryPortFn = unsafe extern "C" fn(
    context: *mut IbvContext,
    port_num: u8,
    port_attr: *mut IbvPortAttr,
    port_attr_len: usize,
) -> c_int;
/// `verbs_context.create_cq_ex`.
pub type CreateCqExFn =
    unsafe extern "C" fn(context: *mut IbvContext, attr: *mut IbvCqInitAttrEx) -> *mut IbvCqEx;
/// `verbs_context.query_device_ex` (`attr_size` bytes of `struct ibv_device_attr_ex`).
pub type QueryDeviceExFn = unsafe extern "C" fn(
    context: *mut IbvContext,
    input: *const c_void,
    attr: *mut IbvDeviceAttrEx,
    attr_size: usize,
) -> c_int;
/// `verbs_context.create_qp_ex`.
pub type CreateQpExFn =
    unsafe extern "C" fn(context: *mut IbvContext, attr: *mut IbvQpInitAttrEx) -> *mut IbvQp;

/// The part of `struct verbs_context` before its `struct ibv_context` (which is its last
/// field): 39 operation slots, most of them NULL (no operation: rdma-core's
/// `verbs_get_ctx_op` then finds nothing and the header inline fails with
/// `EOPNOTSUPP`), and `sz`. rdma-core's `verbs_get_ctx(ctx)` finds it just before the
/// context when `ctx->abi_compat` is [`VERBS_ABI_IS_EXTENDED`]; offsets checked against
/// verbs.h by `tests/layout.rs`.
#[repr(C)]
pub struct VerbsContextPrefix {
    /// `query_port` (slot 0).
    pub query_port: Option<QueryPortFn>,
    /// `advise_mr` .. `query_rt_values` (slots 1..=24): NULL.
    pub _slots_1_24: [*mut c_void; 24],
    /// `create_cq_ex` (slot 25).
    pub create_cq_ex: Option<CreateCqExFn>,
    /// `priv` (libibverbs' own; NULL: nothing of libibverbs runs on our contexts).
    pub priv_: *mut c_void,
    /// `query_device_ex` (slot 27).
    pub query_device_ex: Option<QueryDeviceExFn>,
    /// `ibv_destroy_flow`, two ABI placeholders, `ibv_create_flow`, `open_qp`: NULL.
    pub _slots_28_32: [*mut c_void; 5],
    /// `create_qp_ex` (slot 33).
    pub create_qp_ex: Option<CreateQpExFn>,
    /// `get_srq_num`, `create_srq_ex`, `open_xrcd`, `close_xrcd`, `_ABI_placeholder3`:
    /// NULL.
    pub _slots_34_38: [*mut c_void; 5],
    /// `sz`: the size of the whole `struct verbs_context` ([`VERBS_CONTEXT_SIZE`]).
    pub sz: usize,
}

/// `sizeof(struct verbs_context)` in rdma-core 44, bytes.
pub const VERBS_CONTEXT_SIZE: usize = 648;

/// `__VERBS_ABI_IS_EXTENDED`: `ibv_context.abi_compat` of a `verbs_context`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// `struct ibv_device_attr_ex` (`ibv_query_device_ex(3)`): the legacy attributes, the
/// extended ones this library leaves 0 (ODP, TSO, RSS, packet pacing, tag matching,
/// CQ moderation, device memory, PCI atomics: none), and `phys_port_cnt_ex`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvDeviceAttrEx {
    /// `orig_attr`.
    pub orig_attr: IbvDeviceAttr,
    /// `comp_mask`.
    pub comp_mask: u32,
    /// `odp_caps` .. `xrc_odp_caps`: 0.
    pub _ext: [u32; 40],
    /// `phys_port_cnt_ex`: the ports (1).
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_cq_ex`: `struct ibv_cq`'s fields, then the extended poll API. Every CQ
/// of this library has this layout (a legacy CQ's extended fields are NULL).
#[repr(C)]
pub struct IbvCqEx {
    /// The fields of `struct ibv_cq` (`ibv_cq_ex_to_cq` is a cast).
    pub cq: IbvCq,
    /// `comp_mask`.
    pub comp_mask: u32,
    /// `status` of the completion `start_poll` / `next_poll` made current.
    pub status: u32,
    /// `wr_id` of that completion.
    pub wr_id: u64,
    /// `start_poll`: 0 with a completion current, `ENOENT` with none.
    pub start_poll: Option<unsafe extern "C" fn(*mut IbvCqEx, *mut c_void) -> c_int>,
    /// `next_poll`.
    pub next_poll: Option<unsafe extern "C" fn(*mut IbvCqEx) -> c_int>,
    /// `end_poll`.
    pub end_poll: Option<unsafe extern "C" fn(*mut IbvCqEx)>,
    /// `read_opcode` (`enum ibv_wc_opcode`).
    pub read_opcode: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    /// `read_vendor_err`.
    pub read_vendor_err: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    /// `read_byte_len`.
    pub read_byte_len: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    /// `read_imm_data` (big-endian).
    pub read_imm_data: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    /// `read_qp_num`.
    pub read_qp_num: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    /// `read_src_qp`.
    pub read_src_qp: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    /// `read_wc_flags`.
    pub read_wc_flags: Option<unsafe extern "C" fn(*mut IbvCqEx) -> c_uint>,
    /// `read_slid`.
    pub read_slid: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    /// `read_sl`.
    pub read_sl: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u8>,
    /// `read_dlid_path_bits`.
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u8>,
    /// `read_completion_ts`, `read_cvlan`, `read_flow_tag`, `read_tm_info`,
    /// `read_completion_wallclock_ns`: NULL (creation asking for them is `EOPNOTSUPP`).
    pub _read_unsupported: [*mut c_void; 5],
}

/// `struct ibv_cq_init_attr_ex` (`ibv_create_cq_ex(3)`).
#[repr(C)]
pub struct IbvCqInitAttrEx {
    /// `cqe`.
    pub cqe: u32,
    /// `cq_context`.
    pub cq_context: *mut c_void,
    /// `channel`.
    pub channel: *mut cxgb4::ffi::types::IbvCompChannel,
    /// `comp_vector`.
    pub comp_vector: u32,
    /// `wc_flags` (`enum ibv_create_cq_wc_flags`).
    pub wc_flags: u64,
    /// `comp_mask` (`IBV_CQ_INIT_ATTR_MASK_*`).
    pub comp_mask: u32,
    /// `flags` (`IBV_CREATE_CQ_ATTR_*`).
    pub flags: u32,
    /// `parent_domain`.
    pub parent_domain: *mut IbvPd,
}

/// `IBV_WC_STANDARD_FLAGS`: byte length, immediate data, QP number, source QP, SLID,
/// SL, DLID path bits: the `wc_flags` an extended CQ of this library takes.
pub const IBV_WC_STANDARD_FLAGS: u64 = 127;
/// `IBV_CQ_INIT_ATTR_MASK_FLAGS`.
pub const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1;
/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`: a hint, accepted.
pub const IBV_CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1;

/// `struct ibv_rx_hash_conf`.
#[repr(C)]
pub struct IbvRxHashConf {
    /// `rx_hash_function`.
    pub rx_hash_function: u8,
    /// `rx_hash_key_len`.
    pub rx_hash_key_len: u8,
    /// `rx_hash_key`.
    pub rx_hash_key: *mut u8,
    /// `rx_hash_fields_mask`.
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex` (`ibv_create_qp_ex(3)`).
#[repr(C)]
pub struct IbvQpInitAttrEx {
    /// `qp_context` (this and the next six fields are those of `struct
    /// ibv_qp_init_attr`, packed: `comp_mask` follows `sq_sig_all` at offset 60, inside
    /// the padding a Rust `IbvQpInitAttr` would end with).
    pub qp_context: *mut c_void,
    /// `send_cq`.
    pub send_cq: *mut IbvCq,
    /// `recv_cq`.
    pub recv_cq: *mut IbvCq,
    /// `srq`.
    pub srq: *mut c_void,
    /// `cap`: requested on input, granted on output.
    pub cap: IbvQpCap,
    /// `qp_type`.
    pub qp_type: c_int,
    /// `sq_sig_all`.
    pub sq_sig_all: c_int,
    /// `comp_mask` (`IBV_QP_INIT_ATTR_*`).
    pub comp_mask: u32,
    /// `pd`.
    pub pd: *mut IbvPd,
    /// `xrcd`.
    pub xrcd: *mut c_void,
    /// `create_flags`.
    pub create_flags: u32,
    /// `max_tso_header`.
    pub max_tso_header: u16,
    /// `rwq_ind_tbl`.
    pub rwq_ind_tbl: *mut c_void,
    /// `rx_hash_conf`.
    pub rx_hash_conf: IbvRxHashConf,
    /// `source_qpn`.
    pub source_qpn: u32,
    /// `send_ops_flags` (`IBV_QP_EX_WITH_*`).
    pub send_ops_flags: u64,
}

impl IbvQpInitAttrEx {
    /// Its `struct ibv_qp_init_attr` part.
    pub fn base(&self) -> cxgb4::ffi::types::IbvQpInitAttr {
        cxgb4::ffi::types::IbvQpInitAttr {
            qp_context: self.qp_context,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            srq: self.srq,
            cap: self.cap,
            qp_type: self.qp_type,
            sq_sig_all: self.sq_sig_all,
        }
    }
}

/// `IBV_QP_INIT_ATTR_PD`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1;
/// `IBV_QP_INIT_ATTR_CREATE_FLAGS` (taken with no flag set).
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 4;
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 64;
/// `IBV_QP_EX_WITH_RDMA_WRITE`.
pub const IBV_QP_EX_WITH_RDMA_WRITE: u64 = 1;
/// `IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM`.
pub const IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM: u64 = 2;
/// `IBV_QP_EX_WITH_SEND`.
pub const IBV_QP_EX_WITH_SEND: u64 = 4;
/// `IBV_QP_EX_WITH_SEND_WITH_IMM`.
pub const IBV_QP_EX_WITH_SEND_WITH_IMM: u64 = 8;
/// `IBV_QP_EX_WITH_RDMA_READ`.
pub const IBV_QP_EX_WITH_RDMA_READ: u64 = 16;
/// `IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP`.
pub const IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP: u64 = 32;
/// `IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD`.
pub const IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD: u64 = 64;
/// `IBV_QP_EX_WITH_LOCAL_INV`.
pub const IBV_QP_EX_WITH_LOCAL_INV: u64 = 128;
/// `IBV_QP_EX_WITH_SEND_WITH_INV`.
pub const IBV_QP_EX_WITH_SEND_WITH_INV: u64 = 512;

/// `struct ibv_data_buf` (`ibv_wr_set_inline_data_list`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvDataBuf {
    /// `addr`.
    pub addr: *mut c_void,
    /// `length`, bytes.
    pub length: usize,
}

/// A `wr_*` function of `struct ibv_qp_ex` taking only the QP.
pub type WrFn = unsafe extern "C" fn(*mut IbvQpEx);

/// `struct ibv_qp_ex`: `struct ibv_qp`, then the WR-building post API (`ibv_wr_*`, header
/// inlines that call these pointers). Every QP of this library has this layout; the
/// pointers are set on a QP made by `ibv_create_qp_ex` with `send_ops_flags`
/// (`ibv_qp_to_qp_ex` returns it), for the operations those flags ask for.
#[repr(C)]
pub struct IbvQpEx {
    /// `qp_base`.
    pub qp_base: IbvQp,
    /// `comp_mask`.
    pub comp_mask: u64,
    /// `wr_id` of the next WR, set by the application before `wr_send` & co.
    pub wr_id: u64,
    /// `wr_flags` (`enum ibv_send_flags`) of the next WR.
    pub wr_flags: c_uint,
    /// `wr_atomic_cmp_swp`.
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut IbvQpEx, u32, u64, u64, u64)>,
    /// `wr_atomic_fetch_add`.
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut IbvQpEx, u32, u64, u64)>,
    /// `wr_bind_mw`: NULL (no memory windows).
    pub wr_bind_mw: *mut c_void,
    /// `wr_local_inv`.
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut IbvQpEx, u32)>,
    /// `wr_rdma_read`.
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut IbvQpEx, u32, u64)>,
    /// `wr_rdma_write`.
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut IbvQpEx, u32, u64)>,
    /// `wr_rdma_write_imm`.
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut IbvQpEx, u32, u64, u32)>,
    /// `wr_send`.
    pub wr_send: Option<WrFn>,
    /// `wr_send_imm`.
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut IbvQpEx, u32)>,
    /// `wr_send_inv`.
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut IbvQpEx, u32)>,
    /// `wr_send_tso`, `wr_set_ud_addr`, `wr_set_xrc_srqn`: NULL (RC only, no TSO).
    pub _wr_unsupported: [*mut c_void; 3],
    /// `wr_set_inline_data`.
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut IbvQpEx, *mut c_void, usize)>,
    /// `wr_set_inline_data_list`.
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut IbvQpEx, usize, *const IbvDataBuf)>,
    /// `wr_set_sge`.
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut IbvQpEx, u32, u64, u32)>,
    /// `wr_set_sge_list`.
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut IbvQpEx, usize, *const IbvSge)>,
    /// `wr_start`.
    pub wr_start: Option<WrFn>,
    /// `wr_complete`: posts the WRs built since `wr_start`; 0 or an errno.
    pub wr_complete: Option<unsafe extern "C" fn(*mut IbvQpEx) -> c_int>,
    /// `wr_abort`.
    pub wr_abort: Option<WrFn>,
    /// `wr_atomic_write`: NULL.
    pub wr_atomic_write: *mut c_void,
}

/// A `struct ibv_device` followed by the zeroed tail of libibverbs' private `struct
/// verbs_device` (`ops`, `refcount`, `entry`, `sysfs`, `core_support`: 48 bytes in
/// rdma-core 44, 64 reserved): other providers' direct-verbs calls
/// (`mlx5dv_is_supported`, `efadv_query_device`, ...) read `verbs_get_device(dev)->ops`
/// to tell their own devices, and find NULL here, not memory past the struct.
#[repr(C)]
pub struct IbvDeviceWithTail {
    /// The device.
    pub dev: cxgb4::ffi::types::IbvDevice,
    /// The zeroed `struct verbs_device` tail.
    pub tail: [u64; 8],
}
