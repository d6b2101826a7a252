//! The raw layer: rdma-core's C ABI, loaded at run time. The only module of
//! the crate with `unsafe` code.
//!
//! - [`types`]: `#[repr(C)]` layouts of rdma-core 44 for what the crate uses
//!   (checked against the C headers by `tests/layout.rs`).
//! - [`loader`]: [`RdmaCore`] opens `libibverbs.so.1` and `librdmacm.so.1`
//!   and resolves every symbol once; a missing library is a [`LoadError`].
//! - [`handles`]: one owned handle per rdma-core object (context, PD, MR,
//!   completion channel, CQ, CM channel, CM event, CM id, QP), each with safe
//!   methods that make one C call, and a `Drop` that frees the object once.
//! - [`sockaddr`]: `SocketAddr` <-> `struct sockaddr_storage`.
//!
//! # Contract
//!
//! What each `unsafe` here relies on:
//!
//! 1. **The ABI.** The libraries are rdma-core's `libibverbs.so.1` and
//!    `librdmacm.so.1`, whose public structs and prototypes are frozen ABI
//!    (rdma-core keeps them compatible across releases); the layouts here are
//!    those of rdma-core 44 on x86-64 and `tests/layout.rs` compares every
//!    size and offset with the C compiler's. Symbols are looked up with
//!    `dlsym`, which gives the default version (for `ibv_query_port`,
//!    `ibv_reg_mr`, `ibv_create_cq`, `ibv_get_device_list`: `@@IBVERBS_1.1`).
//!    Function pointers are used only while the [`RdmaCore`] that resolved
//!    them is alive: every handle holds an `Arc` to it (directly or through
//!    its parent).
//! 2. **Valid pointers.** A handle is made only from a non-null pointer that
//!    a successful create call returned, and frees it only in `Drop`, so every
//!    method sees a live object. Children hold an `Arc` of their parents
//!    (MR -> PD -> context; CQ -> channel, context; QP -> id, PD, CQs;
//!    id -> CM channel; event -> CM channel), so a parent is freed after
//!    its children: the order libibverbs requires (`ibv_dealloc_pd` fails
//!    with `EBUSY` while MRs or QPs exist; `ibv_destroy_cq` while QPs do).
//! 3. **Static inline verbs.** `ibv_poll_cq`, `ibv_req_notify_cq`,
//!    `ibv_post_send` and `ibv_post_recv` are inline in verbs.h and call
//!    through `ctx->ops`; they are read once from the context (after checking
//!    they are not null) when the CQ or QP is made.
//! 4. **Memory the device uses.** Received data and RDMA Writes land in MR
//!    buffers that the handle owns ([`handles::RawMr`] takes the `Box`, so the
//!    memory cannot move or be freed while registered, and frees it only
//!    after `ibv_dereg_mr` succeeded; it leaks it otherwise). The device writes
//!    those bytes outside Rust's knowledge, as with any DMA buffer: read them
//!    after the completion that says they are written. Post calls pass SGEs
//!    whose addresses the device checks against the MR of their `lkey`; the
//!    CPU dereferences an address only for inline data, which
//!    [`handles::RawQp::post_send`] takes as a borrowed slice.
//!    **Not enforced:** an MR must outlive the WRs posted on it. A WR names
//!    memory by address and lkey (`verbs::Sge`), not by a borrow of the
//!    [`handles::RawMr`], and a provider may keep its own reference to the
//!    pinned pages of a WR in flight after `ibv_dereg_mr` returns (siw takes
//!    one per WQE); dropping the MR before that WR completes lets the device
//!    write memory the allocator has reused. Callers drop MRs after the
//!    completions of the WRs that use them (or after the QP is destroyed).
//! 5. **Events and ids (librdmacm).** `rdma_destroy_id` waits until every
//!    event reported for the id has been acked. A [`handles::RawCmEvent`]
//!    acks on drop, and the safe layer keeps the id of an event alive while
//!    the event lives, so an id is destroyed only after its events were
//!    acked; events for an id already being destroyed are acked at once.
//! 6. **Threads.** libibverbs and librdmacm are thread-safe for these calls
//!    (providers lock their queues); handles are `Send + Sync` and keep no
//!    thread-local state. No Rust code runs inside a C call (no callbacks),
//!    so no panic can cross the boundary.
//! 7. **Loading.** `dlopen` runs the libraries' constructors; rdma-core's
//!    only set up their own state. A library of the same soname that is not
//!    rdma-core is outside this contract.

#![allow(unsafe_code)]

pub mod handles;
pub mod loader;
pub mod sockaddr;
pub mod types;

pub use loader::{LoadError, RdmaCore, IBVERBS_SONAME, RDMACM_SONAME};

/// Sets or clears `O_NONBLOCK` on `fd` (`fcntl(F_GETFL / F_SETFL)`), for the
/// fds of a CM event channel, a completion channel or a context's async
/// events: after `poll()` says readable, the matching get-event call then
/// returns `EAGAIN` instead of blocking when another thread took the event.
///
/// # Errors
///
/// The OS error of `fcntl` (`EBADF` for a closed fd).
pub fn set_nonblocking(fd: i32, on: bool) -> std::io::Result<()> {
    // SAFETY: fcntl with F_GETFL/F_SETFL reads and writes only the fd's
    // status flags; an invalid fd is an EBADF error, not undefined behaviour.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let new = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: as above.
    if new != flags && unsafe { libc::fcntl(fd, libc::F_SETFL, new) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Waits up to `timeout` for `fd` to be readable (`poll(2)` with `POLLIN`):
/// `Ok(true)` when it is (or has an error or hang-up to report, which the next
/// read returns), `Ok(false)` on timeout. A timeout above `i32::MAX`
/// milliseconds waits that long; an interrupted wait (`EINTR`) reads as a
/// timeout, so the caller looks again.
///
/// # Errors
///
/// The OS error of `poll` (`EBADF` never: a closed fd reports `POLLNVAL`,
/// read as readable).
pub fn wait_readable(fd: i32, timeout: std::time::Duration) -> std::io::Result<bool> {
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is one valid, initialised pollfd that lives across the
    // call; poll writes only its `revents`.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::EINTR) {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(n > 0)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn wait_readable_sees_a_pipe_become_readable() {
        let mut fds = [0i32; 2];
        // SAFETY: `fds` is a valid two-int array for pipe(2) to fill.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (r, w) = (fds[0], fds[1]);
        assert!(!super::wait_readable(r, Duration::from_millis(20)).unwrap());
        // SAFETY: writes one byte from a live local to the pipe's write end.
        assert_eq!(unsafe { libc::write(w, [1u8].as_ptr().cast(), 1) }, 1);
        assert!(super::wait_readable(r, Duration::from_millis(20)).unwrap());
        // SAFETY: closes the two fds this test opened, once.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }

    #[test]
    fn nonblocking_flag_on_a_pipe() {
        let mut fds = [0i32; 2];
        // SAFETY (test): a valid two-int array for pipe(2).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let get = |fd: i32| -> i32 {
            // SAFETY (test): F_GETFL on our pipe.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
            flags & libc::O_NONBLOCK
        };
        assert_eq!(get(fds[0]), 0);
        super::set_nonblocking(fds[0], true).unwrap();
        assert_eq!(get(fds[0]), libc::O_NONBLOCK);
        let mut b = [0u8; 1];
        // SAFETY (test): read into a 1-byte buffer.
        let n = unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) };
        assert_eq!(n, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EAGAIN)
        );
        super::set_nonblocking(fds[0], false).unwrap();
        assert_eq!(get(fds[0]), 0);
        for fd in fds {
            // SAFETY (test): closing our own fds once.
            unsafe { libc::close(fd) };
        }
        // Not the closed fd's number: another test thread may have reused it.
        let e = super::set_nonblocking(-1, true).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    }
}
