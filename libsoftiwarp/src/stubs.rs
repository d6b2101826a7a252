//! The entry points of libibverbs and librdmacm (rdma-core 44) this library does not
//! implement. Each is exported under its rdma-core symbol version, so a program
//! linked against rdma-core loads and runs until it calls one; the call prints one
//! warning line (once per entry point) and fails as its man page says a provider
//! without the feature does: `-1` with `errno` `ENOSYS`, an errno value
//! (`EOPNOTSUPP`) for the verbs calls that return one, NULL with `errno`
//! `EOPNOTSUPP` for the ones that return an object. Never a crash.
//!
//! The C prototypes differ; these definitions take no arguments (the System V ABI
//! lets a callee ignore its argument registers) and return a 64-bit value whose low
//! half is the `int` result, so one shape serves `int`, `ssize_t`, pointer and `void`
//! callers alike.

#![allow(unsafe_code)]

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use crate::boundary::{c_fn, set_errno};

/// How an unimplemented entry point fails.
#[derive(Clone, Copy)]
enum Fail {
    /// `-1`, `errno` = `ENOSYS` (librdmacm and rsocket calls, `int` verbs helpers).
    MinusOne,
    /// Returns `EOPNOTSUPP` (verbs calls that return an errno), `errno` set too.
    Errno,
    /// NULL, `errno` = `EOPNOTSUPP` (calls that return an object).
    Null,
    /// Nothing to return (`void`), or a harmless success (`0`).
    Zero,
    /// `-1`, `errno` = `ENOENT`, no warning: `ibv_read_sysfs_file` (there is no sysfs
    /// entry; ibv_devinfo asks for `board_id` and prints nothing on failure).
    Quiet,
}

/// Prints `libsoftiwarp: {name}: {what}` the first time `name` reports something.
pub fn warn_once(name: &'static str, what: &str) {
    static WARNED: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    if crate::objects::lock(WARNED.get_or_init(Default::default)).insert(name) {
        eprintln!("libsoftiwarp: {name}: {what}");
    }
}

/// Prints the warning once per entry point and returns the failure value.
fn fail(name: &'static str, how: Fail) -> i64 {
    // The warning's write(2) is a cancellation point: none acts inside Rust code.
    let _no_cancel = crate::boundary::NoCancel::new();
    if !matches!(how, Fail::Zero | Fail::Quiet) {
        warn_once(name, "not implemented by the soft device");
    }
    match how {
        Fail::MinusOne => {
            set_errno(libc::ENOSYS);
            -1
        }
        Fail::Errno => {
            set_errno(libc::EOPNOTSUPP);
            i64::from(libc::EOPNOTSUPP)
        }
        Fail::Null => {
            set_errno(libc::EOPNOTSUPP);
            0
        }
        Fail::Zero => 0,
        Fail::Quiet => {
            set_errno(libc::ENOENT);
            -1
        }
    }
}

macro_rules! stubs {
    ($ver:literal: $($name:ident => $how:ident),* $(,)?) => {
        $(
            c_fn!($ver;
            #[doc = concat!("`", stringify!($name), "`: not implemented (see the module docs).")]
            pub unsafe extern "C" fn $name() -> i64 {
                fail(stringify!($name), Fail::$how)
            });
        )*
    };
}

stubs!("IBVERBS_1.0":
    ibv_copy_path_rec_from_kern => Zero,
    ibv_copy_path_rec_to_kern => Zero,
    ibv_copy_qp_attr_from_kern => Zero,
    ibv_get_sysfs_path => Null,
    ibv_rate_to_mult => MinusOne,
    mult_to_ibv_rate => Zero,
    ibv_read_sysfs_file => Quiet,
);

stubs!("IBVERBS_1.1":
    ibv_attach_mcast => Errno,
    ibv_detach_mcast => Errno,
    ibv_copy_ah_attr_from_kern => Zero,
    ibv_create_ah => Null,
    ibv_create_ah_from_wc => Null,
    ibv_init_ah_from_wc => MinusOne,
    ibv_destroy_ah => Errno,
    ibv_dofork_range => Zero,
    ibv_dontfork_range => Zero,
    ibv_rate_to_mbps => Zero,
    mbps_to_ibv_rate => Zero,
    ibv_rereg_mr => Errno,
    ibv_resize_cq => Errno,
    ibv_resolve_eth_l2_from_gid => MinusOne,
);

stubs!("IBVERBS_1.5": ibv_get_pkey_index => MinusOne);
stubs!("IBVERBS_1.10":
    ibv_import_device => Null,
    ibv_import_mr => Null,
    ibv_import_pd => Null,
    ibv_unimport_mr => Zero,
    ibv_unimport_pd => Zero,
    ibv_query_ece => Errno,
    ibv_set_ece => Errno,
);
stubs!("IBVERBS_1.12": ibv_reg_dmabuf_mr => Null);
stubs!("IBVERBS_1.13": ibv_import_dm => Null, ibv_unimport_dm => Zero);
stubs!("IBVERBS_1.14": ibv_query_qp_data_in_order => Zero);

stubs!("RDMACM_1.0":
    rdma_create_srq => MinusOne,
    rdma_create_srq_ex => MinusOne,
    rdma_destroy_srq => Zero,
    rdma_join_multicast => MinusOne,
    rdma_leave_multicast => MinusOne,
    rdma_notify => MinusOne,
    raccept => MinusOne,
    rbind => MinusOne,
    rclose => MinusOne,
    rconnect => MinusOne,
    rfcntl => MinusOne,
    rgetpeername => MinusOne,
    rgetsockname => MinusOne,
    rgetsockopt => MinusOne,
    riomap => MinusOne,
    riounmap => MinusOne,
    riowrite => MinusOne,
    rlisten => MinusOne,
    rpoll => MinusOne,
    rread => MinusOne,
    rreadv => MinusOne,
    rrecv => MinusOne,
    rrecvfrom => MinusOne,
    rrecvmsg => MinusOne,
    rselect => MinusOne,
    rsend => MinusOne,
    rsendmsg => MinusOne,
    rsendto => MinusOne,
    rsetsockopt => MinusOne,
    rshutdown => MinusOne,
    rsocket => MinusOne,
    rwrite => MinusOne,
    rwritev => MinusOne,
);
stubs!("RDMACM_1.1": rdma_join_multicast_ex => MinusOne);
stubs!("RDMACM_1.3":
    rdma_get_remote_ece => MinusOne,
    rdma_reject_ece => MinusOne,
    rdma_set_local_ece => MinusOne,
);

// rdma-core's provider interface (IBVERBS_PRIVATE_34): Debian's perftest binaries are
// linked against libmlx5 and libefa, which need these from libibverbs.so.1 at load time
// (BIND_NOW) and call `verbs_register_driver_34` from their constructors. Nothing calls
// the rest with a soft device; `verbs_register_driver_34` and `__verbs_log` are no-ops.
stubs!("IBVERBS_PRIVATE_34":
    __verbs_log => Zero,
    _verbs_init_and_alloc_context => Null,
    execute_ioctl => MinusOne,
    ibv_cmd_advise_mr => MinusOne,
    ibv_cmd_alloc_dm => MinusOne,
    ibv_cmd_alloc_mw => MinusOne,
    ibv_cmd_alloc_pd => MinusOne,
    ibv_cmd_attach_mcast => MinusOne,
    ibv_cmd_close_xrcd => MinusOne,
    ibv_cmd_create_ah => MinusOne,
    ibv_cmd_create_counters => MinusOne,
    ibv_cmd_create_cq => MinusOne,
    ibv_cmd_create_cq_ex => MinusOne,
    ibv_cmd_create_flow => MinusOne,
    ibv_cmd_create_flow_action_esp => MinusOne,
    ibv_cmd_create_qp => MinusOne,
    ibv_cmd_create_qp_ex => MinusOne,
    ibv_cmd_create_qp_ex2 => MinusOne,
    ibv_cmd_create_rwq_ind_table => MinusOne,
    ibv_cmd_create_srq => MinusOne,
    ibv_cmd_create_srq_ex => MinusOne,
    ibv_cmd_create_wq => MinusOne,
    ibv_cmd_dealloc_mw => MinusOne,
    ibv_cmd_dealloc_pd => MinusOne,
    ibv_cmd_dereg_mr => MinusOne,
    ibv_cmd_destroy_ah => MinusOne,
    ibv_cmd_destroy_counters => MinusOne,
    ibv_cmd_destroy_cq => MinusOne,
    ibv_cmd_destroy_flow => MinusOne,
    ibv_cmd_destroy_flow_action => MinusOne,
    ibv_cmd_destroy_qp => MinusOne,
    ibv_cmd_destroy_rwq_ind_table => MinusOne,
    ibv_cmd_destroy_srq => MinusOne,
    ibv_cmd_destroy_wq => MinusOne,
    ibv_cmd_detach_mcast => MinusOne,
    ibv_cmd_free_dm => MinusOne,
    ibv_cmd_get_context => MinusOne,
    ibv_cmd_modify_cq => MinusOne,
    ibv_cmd_modify_flow_action_esp => MinusOne,
    ibv_cmd_modify_qp => MinusOne,
    ibv_cmd_modify_qp_ex => MinusOne,
    ibv_cmd_modify_srq => MinusOne,
    ibv_cmd_modify_wq => MinusOne,
    ibv_cmd_open_qp => MinusOne,
    ibv_cmd_open_xrcd => MinusOne,
    ibv_cmd_poll_cq => MinusOne,
    ibv_cmd_post_recv => MinusOne,
    ibv_cmd_post_send => MinusOne,
    ibv_cmd_post_srq_recv => MinusOne,
    ibv_cmd_query_context => MinusOne,
    ibv_cmd_query_device_any => MinusOne,
    ibv_cmd_query_mr => MinusOne,
    ibv_cmd_query_port => MinusOne,
    ibv_cmd_query_qp => MinusOne,
    ibv_cmd_query_srq => MinusOne,
    ibv_cmd_read_counters => MinusOne,
    ibv_cmd_reg_dm_mr => MinusOne,
    ibv_cmd_reg_dmabuf_mr => MinusOne,
    ibv_cmd_reg_mr => MinusOne,
    ibv_cmd_req_notify_cq => MinusOne,
    ibv_cmd_rereg_mr => MinusOne,
    ibv_cmd_resize_cq => MinusOne,
    ibv_read_ibdev_sysfs_file => MinusOne,
    verbs_init_cq => MinusOne,
    verbs_open_device => Null,
    verbs_set_ops => Zero,
    verbs_uninit_context => Zero,
    verbs_register_driver_34 => Zero,
);

/// `verbs_allow_disassociate_destroy` (IBVERBS_PRIVATE_34): a bool that libmlx5 reads;
/// false.
#[export_name = "sw_verbs_allow_disassociate_destroy"]
pub static VERBS_ALLOW_DISASSOCIATE_DESTROY: u8 = 0;
std::arch::global_asm!(
    ".symver sw_verbs_allow_disassociate_destroy, verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34"
);
