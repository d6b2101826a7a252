//! The three calls that block (`ibv_get_cq_event`, `ibv_get_async_event`,
//! `rdma_get_cm_event`): where they wait, and what a signal or `pthread_cancel` does to a
//! thread waiting there.
//!
//! # Contract
//!
//! rdma-core's calls block in `read(2)` on the channel's fd, so:
//!
//! 1. **Signals.** A signal whose handler was installed without `SA_RESTART` ends the
//!    wait: the call returns -1 with `errno` `EINTR` (a latency test's timer, for one,
//!    relies on it). With `SA_RESTART` the kernel restarts the read and the call goes on
//!    waiting. Ours block in the same `read(2)`, so both hold as they do for rdma-core.
//! 2. **Cancellation.** The wait is a cancellation point (`read(2)` is one): a thread
//!    blocked there and cancelled with `pthread_cancel` (deferred) ends, its cleanup
//!    handlers run, and `pthread_join` gives `PTHREAD_CANCELED`. glibc cancels by a forced
//!    unwind, which must not pass a Rust frame that catches it (`catch_unwind`, which
//!    every entry point has: glibc then aborts, "FATAL: exception not rethrown") or that
//!    has destructors to run (undefined in Rust). So the wait is in C, with no Rust frame
//!    on the stack: `src/blocking.c` defines the three entry points, each a loop of
//!    - the Rust step (`swi_get_cq_event_try` in [`crate::ibv`], `swi_get_async_event_try`
//!      in [`crate::events`], `swi_get_cm_event_try` in [`crate::cm`]), which runs in
//!      [`crate::boundary::guard`] and returns: 0 (an event written), -1 (`errno` set:
//!      `EINVAL`, `EAGAIN` for an `O_NONBLOCK` fd with nothing queued), or [`WAIT`] with
//!      an fd of the caller's own ([`wait_on`], [`wait_forever`]);
//!    - `read(2)` on that fd, in C (built with `-fexceptions`; a cleanup handler closes the
//!      fd if the thread is cancelled there), then `close(2)`.
//!
//!    Every Rust step, and every other entry point, runs with cancellation disabled
//!    ([`crate::boundary::guard`] sets `PTHREAD_CANCEL_DISABLE` for its duration and
//!    restores the caller's state): a cancellation request is acted on only at the
//!    `read(2)` of `src/blocking.c` or in the application's own code, never inside Rust
//!    code. A cancelled wait has taken nothing: the event it waited for stays queued.
//! 3. **The fd.** The fd handed to C is a duplicate (`F_DUPFD_CLOEXEC`) of the channel's
//!    eventfd, so a destroy of the channel on another thread meanwhile closes nothing
//!    under the waiting thread (the counter is shared: an event queued after the Rust step
//!    makes the read return). The read takes the counter; the next Rust step restores the
//!    rule that the channel's fd is readable exactly while an event waits
//!    ([`crate::objects::FdQueue::pop`], `ChanShared::take`). A CM channel destroyed under
//!    a waiting `rdma_get_cm_event` leaves it waiting for ever, as a read of librdmacm's
//!    closed fd: its next step hands out a new eventfd that nothing signals
//!    ([`wait_forever`]), where a signal or a cancellation still ends the wait.

#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::os::fd::IntoRawFd;

use crate::boundary::{is_nonblocking, new_eventfd, set_errno, write_out};

/// What a Rust step returns when the C side is to wait on the fd it wrote.
pub const WAIT: c_int = 1;

/// Ends a Rust step that found nothing: -1 with `EAGAIN` if `fd` is `O_NONBLOCK` (the
/// call never blocks then), else [`WAIT`] with a duplicate of `fd` written to `out` for
/// the C side to read and close (or -1 with the errno of `fcntl`, `EMFILE` out of fds;
/// `EINVAL` for a NULL `out`).
pub fn wait_on(fd: c_int, out: *mut c_int) -> c_int {
    if is_nonblocking(fd) {
        set_errno(libc::EAGAIN);
        return -1;
    }
    // SAFETY: F_DUPFD_CLOEXEC has no pointer argument; `fd` is the channel's, open for
    // the step (the step holds the channel's state).
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        set_errno(crate::boundary::errno());
        return -1;
    }
    hand_out(dup, out)
}

/// Ends a Rust step whose channel was destroyed under the call: [`WAIT`] with a new
/// eventfd that nothing signals written to `out` (or -1 with its errno).
pub fn wait_forever(out: *mut c_int) -> c_int {
    match new_eventfd() {
        Ok(fd) => hand_out(fd.into_raw_fd(), out),
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// Writes the fd `fd`, now the C side's, to `out`: [`WAIT`]; closes it and returns -1
/// with `EINVAL` if `out` is NULL or misaligned (never from `src/blocking.c`).
fn hand_out(fd: c_int, out: *mut c_int) -> c_int {
    // SAFETY: `out` is the C side's local `int` (contract 3 for any other caller).
    if unsafe { write_out(out, fd) } {
        return WAIT;
    }
    // SAFETY: `fd` is ours and nobody else's.
    unsafe { libc::close(fd) };
    set_errno(libc::EINVAL);
    -1
}

extern "C-unwind" {
    fn sw_ibv_get_cq_event(
        channel: *mut cxgb4::ffi::types::IbvCompChannel,
        cq: *mut *mut cxgb4::ffi::types::IbvCq,
        cq_context: *mut *mut c_void,
    ) -> c_int;
    fn sw_ibv_get_async_event(
        context: *mut cxgb4::ffi::types::IbvContext,
        event: *mut cxgb4::ffi::types::IbvAsyncEvent,
    ) -> c_int;
    fn sw_rdma_get_cm_event(
        channel: *mut cxgb4::ffi::types::RdmaEventChannel,
        event: *mut *mut cxgb4::ffi::types::RdmaCmEvent,
    ) -> c_int;
}

/// `ibv_get_cq_event(3)` for Rust callers (tests): the C entry point.
///
/// # Safety
///
/// The pointer contract of [`crate::boundary`].
pub unsafe fn ibv_get_cq_event(
    channel: *mut cxgb4::ffi::types::IbvCompChannel,
    cq: *mut *mut cxgb4::ffi::types::IbvCq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe { sw_ibv_get_cq_event(channel, cq, cq_context) }
}

/// `ibv_get_async_event(3)` for Rust callers (tests): the C entry point.
///
/// # Safety
///
/// The pointer contract of [`crate::boundary`].
pub unsafe fn ibv_get_async_event(
    context: *mut cxgb4::ffi::types::IbvContext,
    event: *mut cxgb4::ffi::types::IbvAsyncEvent,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe { sw_ibv_get_async_event(context, event) }
}

/// `rdma_get_cm_event(3)` for Rust callers (tests): the C entry point.
///
/// # Safety
///
/// The pointer contract of [`crate::boundary`].
pub unsafe fn rdma_get_cm_event(
    channel: *mut cxgb4::ffi::types::RdmaEventChannel,
    event: *mut *mut cxgb4::ffi::types::RdmaCmEvent,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe { sw_rdma_get_cm_event(channel, event) }
}
