//! The C boundary's raw-pointer steps, in one place: catching panics, `errno`, turning
//! the pointers an application passes into references, and reading the arrays and
//! sockaddrs it points to.
//!
//! # Contract (what every caller in [`crate::ibv`] and [`crate::cm`] relies on)
//!
//! The application keeps the rules of the man pages (ibv_*(3), rdma_*(3)):
//!
//! 1. An object pointer it passes (`struct ibv_pd *`, `struct rdma_cm_id *`, ...) is
//!    looked up among the live handles ([`crate::handles`]) and never dereferenced by
//!    this library otherwise: NULL, destroyed, foreign (never ours) and wrong-kind
//!    handles are `EINVAL`. What the library cannot check is what rdma-core's header
//!    inlines read in the application before calling it (`qp->context->ops` in
//!    `ibv_post_send`, ...): a destroyed object's struct stays readable for the next
//!    [`crate::handles::GRAVEYARD`] destroys, so the inline reaches the library and gets
//!    `EINVAL`; a foreign pointer there, or one used after its struct left the
//!    graveyard, is the application's undefined behaviour, as with rdma-core. The
//!    `struct ibv_device *` of the device list and `rdma_addrinfo` / device lists are
//!    not handles: they are compared with ours or freed as the man pages say.
//! 2. A call on an object racing its destroy on another thread is undefined in
//!    rdma-core; here the call holds the object (an `Arc`), so it completes or fails
//!    with `EINVAL`, and no memory is freed under it.
//! 3. An input array (`sg_list` with `num_sge` entries, a WR list ending in NULL,
//!    `private_data` of `private_data_len` bytes) is readable for the call; an output
//!    pointer (`struct ibv_wc *` of `num_entries`, `struct ibv_port_attr *`, ...) is
//!    writable for the call.
//!
//! What the library checks before it relies on contract 3, so that a wrong count or
//! pointer is an error and never a panic that aborts (Rust's debug checks of
//! `slice::from_raw_parts` and of a misaligned dereference cannot unwind, so
//! [`guard`] cannot catch them): a negative count is `EINVAL` before any slice is
//! made; a count is checked against the object's limit where it has one (`num_sge`
//! against the QP's `max_send_sge` / `max_recv_sge`, inline bytes against
//! `max_inline_data`, a WR list against the queue's depth) before the array is read;
//! [`slice`], [`slice_mut`], [`obj`], [`obj_mut`] and [`write_out`] refuse a
//! misaligned pointer, and [`slice`] / [`slice_mut`] an array larger than
//! `isize::MAX` bytes. That a pointer which passes these checks is readable or
//! writable is the application's part of the contract.
//!
//! Every object this library hands out is a [`crate::handles::Obj`]: a `#[repr(C)]`
//! pair whose first field is the C struct (in an `UnsafeCell`), so the C pointer is the
//! object's address; its rules for the C view are in [`crate::handles`].
//!
//! No panic crosses the boundary: every entry point runs in [`guard`], which turns a
//! panic into the call's error value with `EIO` in `errno` and one line on stderr.
//! No cancellation crosses Rust code either: [`guard`] disables the thread's
//! cancellation while it runs, and the three blocking calls wait in C, outside any
//! Rust frame (the contract is in [`crate::blocking`]).

#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, CStr};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`, returning `on_panic` (after setting `errno` to `EIO` and printing one line)
/// if it panics. `call` names the entry point in that line. `f` runs with the thread's
/// cancellation disabled ([`NoCancel`]): no cancellation request is acted on inside Rust
/// code (see [`crate::blocking`] for where the blocking calls are cancellation points).
pub fn guard<R>(call: &str, on_panic: R, f: impl FnOnce() -> R) -> R {
    let _no_cancel = NoCancel::new();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            eprintln!("libsoftiwarp: {call}: internal error (panic caught at the C boundary)");
            set_errno(libc::EIO);
            on_panic
        }
    }
}

extern "C" {
    /// glibc's `pthread_setcancelstate(3)` (not in the `libc` crate).
    fn pthread_setcancelstate(state: c_int, oldstate: *mut c_int) -> c_int;
}

/// `PTHREAD_CANCEL_DISABLE` (glibc's `<pthread.h>`).
pub const PTHREAD_CANCEL_DISABLE: c_int = 1;

/// The calling thread's cancellation disabled while this lives (the state before it is
/// restored when it drops): a `pthread_cancel` meanwhile stays pending until the
/// application's next cancellation point. glibc cancels by a forced unwind that must
/// not pass Rust frames ([`crate::blocking`]), and the library's code calls
/// cancellation points (`write(2)`, `poll(2)` on eventfds, `eprintln!`).
pub struct NoCancel(c_int);

impl NoCancel {
    /// Disables cancellation for the calling thread.
    pub fn new() -> NoCancel {
        let mut old = 0;
        // SAFETY: `old` is writable; the call has no other pointer and cannot fail
        // with a valid state.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
        NoCancel(old)
    }
}

impl Default for NoCancel {
    fn default() -> Self {
        NoCancel::new()
    }
}

impl Drop for NoCancel {
    fn drop(&mut self) {
        // SAFETY: the state saved by `new`; glibc accepts a NULL `oldstate`.
        unsafe { pthread_setcancelstate(self.0, std::ptr::null_mut()) };
    }
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Returns NULL with `errno` = `e`.
pub fn null_err<T>(e: c_int) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// Returns `e` (the errno-returning calls) and sets `errno` to it too.
pub fn err_ret(e: c_int) -> c_int {
    set_errno(e);
    e
}

/// -1 with `errno` = `e`.
pub fn minus_one(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// The calling thread's `errno`.
pub fn errno() -> c_int {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}

/// The struct at `p`: an input struct of the application (contract 3), or our own
/// `struct ibv_device` (checked to be ours first).
///
/// `None` for NULL or a pointer misaligned for `T`.
///
/// # Safety
///
/// `p` is NULL, misaligned, or readable for a `T` for the call.
pub unsafe fn obj<'a, T>(p: *const T) -> Option<&'a T> {
    if !p.is_aligned() {
        return None;
    }
    // SAFETY: the caller's contract: NULL or readable; aligned (checked).
    unsafe { p.as_ref() }
}

/// The object at `p`, writable (an input/output struct the application passes, such
/// as `struct ibv_qp_init_attr`, whose `cap` is written back).
///
/// `None` for NULL or a pointer misaligned for `T`.
///
/// # Safety
///
/// Contract 3: `p` is NULL, misaligned, or readable and writable for a `T`, not
/// otherwise referenced for the call.
pub unsafe fn obj_mut<'a, T>(p: *mut T) -> Option<&'a mut T> {
    if !p.is_aligned() {
        return None;
    }
    // SAFETY: the caller's contract; aligned (checked).
    unsafe { p.as_mut() }
}

/// Moves `v` to the heap and returns its address (the C pointer handed out).
pub fn into_raw<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// Takes back an object handed out by [`into_raw`] (to free it).
///
/// # Safety
///
/// `p` came from [`into_raw`] with the same `T`, is not NULL, and is not used again.
pub unsafe fn from_raw<T>(p: *mut T) -> Box<T> {
    // SAFETY: the caller's contract.
    unsafe { Box::from_raw(p) }
}

/// Hands out a NULL-terminated array of the pointers `items` (the device lists of
/// `ibv_get_device_list` and `rdma_get_devices`); the count is kept in the word before
/// the array, for [`free_list`].
pub fn into_raw_list(items: &[usize]) -> *mut usize {
    let mut v = Vec::with_capacity(items.len() + 2);
    v.push(items.len());
    v.extend_from_slice(items);
    v.push(0);
    let p = Box::into_raw(v.into_boxed_slice()).cast::<usize>();
    // SAFETY: the allocation holds `items.len() + 2` words: one past the count is in it.
    unsafe { p.add(1) }
}

/// Frees a list handed out by [`into_raw_list`].
///
/// # Safety
///
/// `list` came from [`into_raw_list`], is not NULL, and is not used again.
pub unsafe fn free_list(list: *mut usize) {
    // SAFETY: the caller's contract: the count is the word before `list`, and the
    // allocation is the boxed slice of count + 2 words that starts there.
    unsafe {
        let base = list.sub(1);
        let n = *base;
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            base,
            n + 2,
        )));
    }
}

/// Writes `v` to `*p`; false if `p` is NULL or misaligned for `T`.
///
/// # Safety
///
/// Contract 3: `p` is NULL, misaligned, or writable for a `T`.
pub unsafe fn write_out<T>(p: *mut T, v: T) -> bool {
    if p.is_null() || !p.is_aligned() {
        return false;
    }
    // SAFETY: non-null, aligned, and writable by the caller's contract; `write` drops
    // nothing.
    unsafe { p.write(v) };
    true
}

/// Writes the first `n` bytes of `v` to `p` (a C struct whose older, shorter layout the
/// caller may have passed).
///
/// # Safety
///
/// Contract 3: `p` is writable for `n` bytes; `n <= size_of::<T>()` is enforced.
pub unsafe fn write_prefix<T>(p: *mut T, v: &T, n: usize) {
    let n = n.min(std::mem::size_of::<T>());
    // SAFETY: `v` is `size_of::<T>() >= n` readable bytes; `p` writable for `n` by the
    // caller's contract; a Rust value and the caller's buffer do not overlap.
    unsafe { std::ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), p.cast::<u8>(), n) };
}

/// The bytes the SGEs point at, concatenated (inline send data, read at post time).
/// `None` if an SGE with a length has a NULL address.
///
/// # Safety
///
/// Contract 3: each SGE's `[addr, addr + length)` is readable (ibv_post_send(3) with
/// `IBV_SEND_INLINE`).
pub unsafe fn gather(list: &[cxgb4::ffi::types::IbvSge]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for s in list {
        // SAFETY: the caller's contract.
        let bytes = unsafe { slice(s.addr as usize as *const u8, s.length as usize) }?;
        out.extend_from_slice(bytes);
    }
    Some(out)
}

/// The `n` elements at `p` (empty for `n == 0`); `None` for a NULL or misaligned `p`
/// with `n > 0`, or `n` elements larger than `isize::MAX` bytes.
///
/// # Safety
///
/// Contract 3: `p` points to `n` readable `T`s (unless refused as above).
pub unsafe fn slice<'a, T>(p: *const T, n: usize) -> Option<&'a [T]> {
    if n == 0 {
        return Some(&[]);
    }
    if !array_ok(p, n) {
        return None;
    }
    // SAFETY: the caller's contract; `p` is non-null and aligned, and `n` elements
    // fit in `isize::MAX` bytes (`array_ok`): `from_raw_parts`' preconditions.
    Some(unsafe { std::slice::from_raw_parts(p, n) })
}

/// The `n` writable elements at `p`; `None` as for [`slice`].
///
/// # Safety
///
/// Contract 3: `p` points to `n` writable `T`s, not otherwise referenced for the call.
pub unsafe fn slice_mut<'a, T>(p: *mut T, n: usize) -> Option<&'a mut [T]> {
    if n == 0 {
        return Some(&mut []);
    }
    if !array_ok(p, n) {
        return None;
    }
    // SAFETY: as in `slice`.
    Some(unsafe { std::slice::from_raw_parts_mut(p, n) })
}

/// True if `p` is non-null and aligned for `T`, and `n` `T`s fit in `isize::MAX`
/// bytes (what `slice::from_raw_parts` requires besides readability).
fn array_ok<T>(p: *const T, n: usize) -> bool {
    !p.is_null()
        && p.is_aligned()
        && n.checked_mul(std::mem::size_of::<T>().max(1))
            .is_some_and(|b| b <= isize::MAX as usize)
}

/// The NUL-terminated string at `p`, if not NULL and UTF-8.
///
/// # Safety
///
/// Contract 3: `p` is NULL or a readable NUL-terminated string.
pub unsafe fn c_str<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// The IPv4 address at `p` (`struct sockaddr *`): `Ok(None)` for NULL, `Err(errno)` for
/// another family (`EAFNOSUPPORT`).
///
/// # Safety
///
/// Contract 3: `p` is NULL or a readable sockaddr of the size its family implies.
pub unsafe fn read_sockaddr(p: *const libc::sockaddr) -> Result<Option<SocketAddr>, c_int> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: every sockaddr starts with its family (at offset 0; read unaligned: `p`
    // may be any address the application passed).
    let family = unsafe { std::ptr::read_unaligned(p.cast::<libc::sa_family_t>()) };
    match c_int::from(family) {
        libc::AF_INET => {
            // SAFETY: AF_INET: the caller's sockaddr is a sockaddr_in; read unaligned.
            let sin = unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr_in>()) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Ok(Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            ))))
        }
        libc::AF_INET6 => {
            // SAFETY: AF_INET6: the caller's sockaddr is a sockaddr_in6.
            let sin6 = unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr_in6>()) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            // A v4-mapped address (::ffff:a.b.c.d) is the IPv4 one.
            match ip.to_ipv4_mapped() {
                Some(v4) => Ok(Some(SocketAddr::V4(SocketAddrV4::new(
                    v4,
                    u16::from_be(sin6.sin6_port),
                )))),
                None => Err(libc::EAFNOSUPPORT),
            }
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// `addr` as a `sockaddr_storage` (AF_INET; IPv6 is never produced here).
pub fn sockaddr_storage(addr: Option<SocketAddr>) -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain bytes; all-zero is its "no address" value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    if let Some(SocketAddr::V4(a)) = addr {
        let sin = sockaddr_in(a);
        // SAFETY: a sockaddr_in fits in a sockaddr_storage (that is its purpose); both
        // are plain data.
        unsafe {
            std::ptr::write_unaligned(std::ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in>(), sin)
        };
    }
    ss
}

/// `a` as a `sockaddr_in`.
pub fn sockaddr_in(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// An all-zero `T` (C structs of plain integers and pointers, where zero is "unset").
pub fn zeroed<T: Zeroable>() -> T {
    // SAFETY: `Zeroable` is implemented only for C structs of integers, raw pointers,
    // arrays and unions of them, and `Option<extern fn>`: all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Types whose all-zero bit pattern is a valid value (see [`zeroed`]).
pub trait Zeroable {}

macro_rules! zeroable {
    ($($t:ty),* $(,)?) => { $(impl Zeroable for $t {})* };
}

zeroable!(
    cxgb4::ffi::types::IbvContext,
    cxgb4::ffi::types::IbvDevice,
    cxgb4::ffi::types::IbvDeviceAttr,
    cxgb4::ffi::types::IbvPortAttr,
    cxgb4::ffi::types::IbvPd,
    cxgb4::ffi::types::IbvMr,
    cxgb4::ffi::types::IbvCq,
    cxgb4::ffi::types::IbvQp,
    cxgb4::ffi::types::IbvCompChannel,
    cxgb4::ffi::types::IbvWc,
    cxgb4::ffi::types::RdmaCmId,
    cxgb4::ffi::types::RdmaCmEvent,
    cxgb4::ffi::types::RdmaEventChannel,
    crate::abi::IbvQpAttr,
    crate::abi::IbvSrq,
    crate::abi::IbvCqEx,
    crate::abi::IbvQpEx,
    crate::abi::IbvDeviceAttrEx,
    crate::abi::VerbsContextPrefix,
    crate::abi::RdmaAddrinfo,
);

/// Reads up to 8 bytes from `fd` (an eventfd): the counter, or `Err(errno)`.
pub fn read_eventfd(fd: c_int) -> Result<u64, c_int> {
    let mut v = 0u64;
    loop {
        // SAFETY: `v` is 8 writable bytes for the call.
        let n = unsafe { libc::read(fd, std::ptr::addr_of_mut!(v).cast(), 8) };
        if n == 8 {
            return Ok(v);
        }
        let e = errno();
        if n < 0 && e == libc::EINTR {
            continue;
        }
        return Err(if n < 0 { e } else { libc::EIO });
    }
}

/// Resets the eventfd `fd` to not readable (reads its counter if it is readable, without
/// blocking whatever the fd's `O_NONBLOCK`; an fd the application read itself is
/// already reset). Only a reader of the application taking the counter between the
/// `poll` and the `read` here could make the read wait: the fd's `O_NONBLOCK` is the
/// application's to set, so it cannot be set for this read alone.
pub fn drain_eventfd(fd: c_int) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, writable for the call.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n > 0 && p.revents & libc::POLLIN != 0 {
        let _ = read_eventfd(fd);
    }
}

/// Adds 1 to the eventfd `fd`'s counter (makes it readable).
pub fn signal_eventfd(fd: c_int) {
    let one = 1u64;
    // SAFETY: `one` is 8 readable bytes; a full counter (EAGAIN) is still readable,
    // which is all the signal needs.
    let _ = unsafe { libc::write(fd, std::ptr::addr_of!(one).cast(), 8) };
}

/// A new eventfd (`EFD_CLOEXEC`, blocking, counter 0).
pub fn new_eventfd() -> Result<std::os::fd::OwnedFd, c_int> {
    // SAFETY: eventfd has no pointer arguments.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Waits until `fd` is readable (`poll`, no timeout), retrying on `EINTR`.
pub fn wait_readable(fd: c_int) -> Result<(), c_int> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one pollfd, writable for the call.
        let n = unsafe { libc::poll(&mut p, 1, -1) };
        if n > 0 {
            return Ok(());
        }
        let e = errno();
        if n < 0 && e != libc::EINTR {
            return Err(e);
        }
    }
}

/// True if `fd` has `O_NONBLOCK` set (an application may set it on a channel's fd).
pub fn is_nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL has no pointer argument.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// Copies `s` into the C char array `dst`, NUL-terminated (truncated to fit).
pub fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as c_char;
    }
    if let Some(z) = dst.get_mut(n) {
        *z = 0;
    }
}

/// Defines a C entry point `$name` exported as `$name@@$ver` (rdma-core's version node):
/// the function's own symbol is `sw_$name`, and a `.symver` alias gives the versioned
/// name (rustc's cdylib version script would otherwise leave every symbol unversioned,
/// and a binary linked against Debian's libibverbs asks for `ibv_reg_mr@IBVERBS_1.1`).
macro_rules! c_fn {
    ($ver:literal; $(#[$m:meta])* pub unsafe extern "C" fn $name:ident $($rest:tt)*) => {
        $(#[$m])*
        ///
        /// # Safety
        ///
        /// The pointer contract of [`crate::boundary`] (C callers: the man page's rules).
        #[export_name = concat!("sw_", stringify!($name))]
        pub unsafe extern "C" fn $name $($rest)*
        std::arch::global_asm!(concat!(
            ".symver sw_", stringify!($name), ", ", stringify!($name), "@@", $ver
        ));
    };
}
pub(crate) use c_fn;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_the_error_value_with_eio() {
        set_errno(0);
        let r = guard("test_call", -7, || -> c_int { panic!("boom") });
        assert_eq!((r, errno()), (-7, libc::EIO));
        assert_eq!(guard("test_call", -7, || 3), 3);
    }

    #[test]
    fn sockaddrs_round_trip_and_other_families_are_refused() {
        let a: SocketAddrV4 = "10.9.0.1:7174".parse().unwrap();
        let sin = sockaddr_in(a);
        assert_eq!(sin.sin_port.to_ne_bytes(), [0x1c, 0x06], "network order");
        // SAFETY: a live sockaddr_in.
        let back = unsafe { read_sockaddr(std::ptr::addr_of!(sin).cast()) };
        assert_eq!(back, Ok(Some(SocketAddr::V4(a))));
        let ss = sockaddr_storage(Some(SocketAddr::V4(a)));
        // SAFETY: a live sockaddr_storage.
        let back = unsafe { read_sockaddr(std::ptr::addr_of!(ss).cast()) };
        assert_eq!(back, Ok(Some(SocketAddr::V4(a))));
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { read_sockaddr(std::ptr::null()) }, Ok(None));
        let mut un: libc::sockaddr_storage = zeroed_storage();
        un.ss_family = libc::AF_UNIX as libc::sa_family_t;
        // SAFETY: a live sockaddr_storage.
        let r = unsafe { read_sockaddr(std::ptr::addr_of!(un).cast()) };
        assert_eq!(r, Err(libc::EAFNOSUPPORT));
        // A v4-mapped IPv6 address is the IPv4 one.
        let mut s6: libc::sockaddr_in6 = {
            // SAFETY: plain data; zero is "unset".
            unsafe { std::mem::zeroed() }
        };
        s6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        s6.sin6_port = 7174u16.to_be();
        s6.sin6_addr.s6_addr = std::net::Ipv4Addr::new(10, 9, 0, 1)
            .to_ipv6_mapped()
            .octets();
        // SAFETY: a live sockaddr_in6.
        let r = unsafe { read_sockaddr(std::ptr::addr_of!(s6).cast()) };
        assert_eq!(r, Ok(Some(SocketAddr::V4(a))));
    }

    fn zeroed_storage() -> libc::sockaddr_storage {
        sockaddr_storage(None)
    }

    #[test]
    fn counts_and_pointers_that_would_abort_are_refused() {
        let v = [1u64, 2, 3];
        // SAFETY: `v` is 3 readable u64s; the refused cases are never read.
        unsafe {
            assert_eq!(slice(v.as_ptr(), 3), Some(&v[..]));
            assert_eq!(slice(std::ptr::null::<u64>(), 0), Some(&[][..]));
            assert_eq!(slice(std::ptr::null::<u64>(), 1), None);
            // More than isize::MAX bytes (what a negative num_sge made).
            assert_eq!(slice(v.as_ptr(), usize::MAX), None);
            assert_eq!(slice(v.as_ptr(), usize::MAX / 8), None);
            // Misaligned.
            let odd = v.as_ptr().cast::<u8>().add(1).cast::<u64>();
            assert_eq!(slice(odd, 1), None);
            assert!(obj(odd).is_none());
            let odd_mut = odd.cast_mut();
            assert!(obj_mut(odd_mut).is_none());
            assert!(slice_mut(odd_mut, 1).is_none());
            assert!(!write_out(odd_mut, 5));
            assert!(!write_out(std::ptr::null_mut::<u64>(), 5));
        }
    }

    #[test]
    fn c_strings_are_truncated_and_terminated() {
        let mut b = [7 as c_char; 6];
        copy_cstr(&mut b, "softiwarp0");
        assert_eq!(b, [115, 111, 102, 116, 105, 0].map(|v| v as c_char));
        copy_cstr(&mut b, "ab");
        assert_eq!(&b[..3], &[97, 98, 0].map(|v| v as c_char));
    }

    #[test]
    fn an_eventfd_is_readable_after_a_signal_and_not_after_a_drain() {
        let fd = new_eventfd().unwrap();
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        let ready = |fd| {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd for the call.
            unsafe { libc::poll(&mut p, 1, 0) == 1 }
        };
        assert!(!ready(raw));
        drain_eventfd(raw); // does not block on a zero counter
        signal_eventfd(raw);
        signal_eventfd(raw);
        assert!(ready(raw));
        drain_eventfd(raw);
        assert!(!ready(raw));
        assert!(!is_nonblocking(raw));
    }
}
