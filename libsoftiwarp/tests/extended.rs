//! The extended verbs through the C ABI (issue 30): `tests/extended_verbs.c` over the
//! library (LD_PRELOAD, a host-TCP device on lo, as `nobody` when root). The context is
//! a `verbs_context` (`verbs_get_ctx`, `sz`); `ibv_query_device_ex` (`phys_port_cnt_ex`
//! 1), `ibv_query_port` through it, `ibv_query_gid_table` (1 entry; `-EINVAL` for 0);
//! `mlx5dv_is_supported` false and `mlx5dv_query_device` `EOPNOTSUPP` (libmlx5's probes
//! find "not this provider", no crash); `ibv_create_cq_ex` refusing timestamps
//! (`EOPNOTSUPP`) and a `comp_vector` out of range (`EINVAL`, as `ibv_create_cq`);
//! `ibv_create_qp_ex` refusing atomics; one `ibv_wr_*` batch of Send (inline), RDMA
//! Write, Write with Immediate and RDMA Read over an RDMA CM connection, each
//! completion read back with `ibv_start_poll` / `ibv_next_poll` and the `ibv_wc_read_*`
//! calls (opcode, byte length, immediate data, QP number, flags) and the data checked; a
//! batch built wrong (`EINVAL`, nothing posted) and an aborted one.

mod support;

use support::{free_port, run_c_program};

#[test]
fn extended_verbs_reach_a_c_program() {
    let port = free_port().to_string();
    let Some(o) = run_c_program("extended_verbs", &["-lmlx5"], &[&port]) else {
        return;
    };
    assert_eq!(o.exited(), Some(0), "{o:?}");
    for line in [
        "verbs_get_ctx finds the verbs_context: 1",
        "  its sz: 648",
        "  phys_port_cnt_ex: 1",
        "  gid_tbl_len: 1",
        "ibv_query_gid_table(4 entries): 1",
        "ibv_query_gid_table(0 entries): -22",
        "mlx5dv_is_supported: 0",
        "mlx5dv_query_device: 95",
        "ibv_create_qp_ex asking for Fetch-and-Add only: 1",
        "  wr_atomic_fetch_add set: 1",
        "  wr_atomic_cmp_swp left NULL: 1",
        "ibv_wr_complete of a WR with too many SGEs: 22",
        "ibv_wr_complete: 0",
        "client completions: wr_id 1..4, SEND, RDMA_WRITE, RDMA_WRITE, RDMA_READ",
        "  the read's data: 0",
        "  opcode IBV_WC_RECV_RDMA_WITH_IMM: 129",
        "  imm_data: 4660",
        "the written bytes: 1",
        "ibv_wr_complete of the atomics: 0",
        "  opcode IBV_WC_FETCH_ADD: 4",
        "  opcode IBV_WC_COMP_SWAP: 3",
        "the target after both: 7",
        "ibv_start_poll on an empty CQ: 2",
        "ok",
    ] {
        assert!(o.stdout.lines().any(|l| l == line), "{line:?} in {o:?}");
    }
    assert!(!o.stderr.contains("libsoftiwarp:"), "{o:?}");
}
