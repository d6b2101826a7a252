//! The host transport's one system call that nix does not wrap: `SIOCOUTQ`.
//!
//! Contract: [`kernel_outq`] takes a raw fd that the caller keeps open for the whole
//! call (it borrows it from a live `TcpStream`); the ioctl writes one `int` into a
//! local. Nothing else here is unsafe.

/// Octets in the kernel's send queue not yet acknowledged (`SIOCOUTQ`, tcp(7)); 0 if the
/// kernel does not say.
#[allow(unsafe_code)]
pub(crate) fn kernel_outq(fd: std::os::fd::RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (tcp(7)) writes one int through the pointer, which points at `n`,
    // alive and writable for the call; `fd` is an open socket owned by the caller's
    // TcpStream for the whole call. A failure leaves `n` as it was.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    if r < 0 {
        0
    } else {
        usize::try_from(n).unwrap_or(0)
    }
}
