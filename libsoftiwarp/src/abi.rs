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
/// `IBV_QPS_RESET` .. `IBV_QPS_ERR` (`enum ibv_qp_state`).
pub const IBV_QPS_INIT: c_int = 1;
/// `IBV_QPS_RTS`.
pub const IBV_QPS_RTS: c_int = 3;
/// `IBV_QPS_ERR`.
pub const IBV_QPS_ERR: c_int = 6;
/// `IBV_QP_STATE` bit of `enum ibv_qp_attr_mask`.
pub const IBV_QP_STATE: c_int = 1;
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
/// `RDMA_PS_TCP`.
pub const RDMA_PS_TCP: c_int = 0x0106;
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
