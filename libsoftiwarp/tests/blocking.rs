//! The blocking calls under signals and `pthread_cancel` (issue 30): `tests/blocking_calls.c`
//! over the library (LD_PRELOAD, a host-TCP device on lo, as `nobody` when root). A
//! SIGALRM without `SA_RESTART` ends `ibv_get_cq_event`, `ibv_get_async_event` and
//! `rdma_get_cm_event` with -1 / `EINTR`; with `SA_RESTART` `ibv_get_cq_event` waits on
//! through two signals; a thread cancelled while blocked in `ibv_get_cq_event` or
//! `rdma_get_cm_event` is joined with `PTHREAD_CANCELED`, its cleanup handler run and
//! no fd left behind, and the process exits 0 (it aborted with "FATAL: exception not
//! rethrown" when the wait was inside the library's `catch_unwind`).

mod support;

use support::run_c_program;

#[test]
fn signals_end_blocking_calls_with_eintr_and_cancellation_ends_their_threads() {
    let Some(o) = run_c_program("blocking_calls", &["-lpthread"], &[]) else {
        return;
    };
    assert_eq!(o.exited(), Some(0), "{o:?}");
    let lines: Vec<&str> = o.stdout.lines().collect();
    for want in [
        "ibv_get_cq_event interrupted: -1",
        "ibv_get_async_event interrupted: -1",
        "rdma_get_cm_event interrupted: -1",
        "alarms so far: 3",
        "ibv_get_cq_event across two SA_RESTART signals: 0",
        "  alarms: 5",
        "  status IBV_WC_WR_FLUSH_ERR: 5",
        "ibv_get_cq_event: cancelled (PTHREAD_CANCELED): 1",
        "ibv_get_cq_event: its cleanup handler ran: 1",
        "rdma_get_cm_event: cancelled (PTHREAD_CANCELED): 1",
        "rdma_get_cm_event: its cleanup handler ran: 1",
        "ibv_get_cq_event after the cancellations: 0",
        "ok",
    ] {
        assert!(lines.contains(&want), "{want:?} in {o:?}");
    }
    // Each interrupted call: errno EINTR (4).
    let eintr = lines.iter().filter(|l| **l == "  errno EINTR: 4").count();
    assert_eq!(eintr, 3, "{o:?}");
    assert!(!o.stderr.contains("FATAL"), "{o:?}");
}
