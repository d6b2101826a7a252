//! TAP link: a Linux TAP interface read and written as whole Ethernet frames.
//!
//! The interface is attached with `TUNSETIFF` (`IFF_TAP | IFF_NO_PI`, no packet-info
//! prefix) on a non-blocking `/dev/net/tun` fd. [`TapLink::open`] attaches to an existing
//! interface (made by `ip tuntap add` or a harness); [`TapLink::create`] makes a new,
//! non-persistent one (`IFF_TUN_EXCL`), which the kernel deletes when the fd is closed.
//! The MTU is read from the interface once, at open (what smoltcp does too; set it
//! before opening). A TAP's MTU is at most [`TAP_MAX_MTU`].
//!
//! The `TUNSETIFF` ioctl is done here (one small `unsafe` call through `nix`) rather than
//! with the `tun-tap` crate: that crate compiles a C helper with `cc`, cannot tell "open
//! an existing TAP" from "create one" (`IFF_TUN_EXCL`), does not report the MTU, and its
//! default features pull in tokio-core 0.1 and mio 0.6. The MTU and the link state come
//! from rtnetlink, which the failure detection needs anyway.
//!
//! All of this is done in the calling thread's network namespace: open a TAP from a
//! thread that has `setns(2)`-ed into the TAP's namespace.
//!
//! # What a TAP fd does when its interface fails (measured)
//!
//! Measured on Linux 6.18 with a non-blocking TAP fd (and consistent with
//! `drivers/net/tun.c`):
//!
//! | event | `poll` on the fd | `read` | `write` |
//! |---|---|---|---|
//! | up, idle | `POLLOUT` | `EAGAIN` | ok |
//! | `ip link set DEV down` | nothing at all (`POLLOUT` is only reported while `IFF_UP`) | `EAGAIN` | `EIO` |
//! | `ip link set DEV up` again | `POLLOUT` | `EAGAIN` | ok |
//! | `ip link del DEV` | `POLLERR` at once (also to a `POLLIN`-only poller) | `EBADFD` | `EBADFD` |
//!
//! So the fd alone reports a deletion promptly, but a set-down is invisible to a thread
//! sleeping on it (it only shows as `EIO` on the next write). Detection therefore uses
//! both sources:
//!
//! - an rtnetlink socket subscribed to `RTMGRP_LINK` (rtnetlink(7)), opened in the same
//!   namespace: `RTM_NEWLINK` for our interface index gives `Down(AdminDown)` when
//!   `IFF_UP` is cleared, `Down(NoCarrier)` when `IFF_RUNNING` (operstate UP) is cleared,
//!   and `Up` when both are set again; `RTM_DELLINK` gives `Gone(Deleted)` (deleted, or
//!   moved to another namespace). Deleting an up interface first closes it, so
//!   `ip link del` is reported as `Down(AdminDown)` then `Gone(Deleted)`, about 2-5 ms
//!   after `ip` is started (measured, from a thread sleeping in `poll` on the link);
//! - the TAP fd: `EPOLLERR` or `EBADFD` gives `Gone(FdError(EBADFD))`. This is what a
//!   caller sees if it reads or writes before looking at events, and the safety net if
//!   notifications were lost. `Gone` is terminal, so whichever source is seen first
//!   names the reason (rtnetlink wins when both are ready at once).
//!
//! Both fds sit in one epoll instance, which is the link's [`Link::poll_fd`]: it becomes
//! readable when a frame arrives, when a link notification arrives, or when the TAP fd
//! errors, so an engine sleeping on it wakes within microseconds of the change. If the
//! netlink socket overflows (`ENOBUFS`, notifications lost), the state is re-read with
//! `RTM_GETLINK`. Once gone, both fds leave the epoll set, so the poll fd stays quiet.
//!
//! # Start-up
//!
//! The kernel applies carrier changes (qdisc activation, bridge port state) in its
//! linkwatch work, which it runs at most once a second for "non-urgent" devices; a
//! single-device `RTM_GETLINK` makes it apply a device's pending change at once
//! (`rtnl_getlink` -> `linkwatch_sync_dev`). Opening a TAP attaches it (carrier on) and
//! then queries it with `RTM_GETLINK`, so its state is committed when `open` returns.
//! (Without that, frames were measured to be lost for up to 0.9 s after a topology was
//! built, although every interface already reported up; `netlab::netns::TapPair` does
//! the same for its veths and bridges.)

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;

use nix::errno::Errno;
use nix::net::if_::if_nametoindex;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use super::rtnl::{LinkMsg, RtnlBody, RtnlSocket, RTMGRP_LINK};
use super::{check_mtu, GoneReason, Link, LinkError, LinkEvent, StateTracker};

/// Largest MTU in bytes of a TAP interface: 65521 = 65535 - 14, the tun driver's
/// `max_mtu` (`MAX_MTU - dev->hard_header_len` in `drivers/net/tun.c`; also
/// transport-notes.md).
pub const TAP_MAX_MTU: usize = 65_521;

/// Interface names are at most 15 bytes plus a NUL (`IFNAMSIZ`, `linux/if.h`).
const IFNAMSIZ: usize = 16;

const TOKEN_TAP: u64 = 0;
const TOKEN_RTNL: u64 = 1;

/// `struct ifreq` as `TUNSETIFF` uses it: the name and the `ifr_flags` member of the
/// union (40 bytes on 64-bit Linux, `linux/if.h`).
#[repr(C)]
struct IfReqFlags {
    name: [u8; IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

mod ioctl {
    // `TUNSETIFF` reads the requested name and flags and writes the chosen name back.
    nix::ioctl_readwrite_bad!(tun_set_iff, libc::TUNSETIFF, super::IfReqFlags);
}

/// Options for [`TapLink::create`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TapOptions {
    /// MTU in bytes to set on the new interface (68..=65521); `None` keeps the kernel's
    /// default (1500).
    pub mtu: Option<usize>,
    /// Bring the interface administratively up after creating it.
    pub up: bool,
}

/// A TAP interface as a [`Link`]. See the [module docs](self).
#[derive(Debug)]
pub struct TapLink {
    file: File,
    name: String,
    ifindex: u32,
    mtu: usize,
    rtnl: Option<RtnlSocket>,
    epoll: Epoll,
    tracker: StateTracker,
    span: tracing::Span,
}

fn check_name(name: &str) -> Result<(), LinkError> {
    if name.len() >= IFNAMSIZ || name.bytes().any(|b| b == 0 || b == b'/') {
        return Err(LinkError::Config(format!(
            "interface name {name:?} must be at most 15 bytes, without NUL or '/'"
        )));
    }
    Ok(())
}

/// Opens `/dev/net/tun` non-blocking and attaches it to TAP `name` (created if absent;
/// with `exclusive`, failing if it exists). Returns the fd and the kernel's name for it.
fn attach(name: &str, exclusive: bool) -> Result<(File, String), LinkError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/net/tun")
        .map_err(|e| LinkError::io("open /dev/net/tun", e))?;
    let mut req = IfReqFlags {
        name: [0; IFNAMSIZ],
        flags: 0,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    let mut flags = libc::IFF_TAP | libc::IFF_NO_PI;
    if exclusive {
        flags |= libc::IFF_TUN_EXCL;
    }
    // All flag values fit in the C short the kernel reads (0x0002 | 0x1000 | 0x8000).
    req.flags = flags as libc::c_short;
    // SAFETY: `file` is an open /dev/net/tun fd, and `req` is a live, properly aligned
    // `struct ifreq`-sized buffer (40 bytes) that the kernel reads and writes back for the
    // duration of the call only. This is the one ioctl of the crate.
    #[allow(unsafe_code)]
    let res = unsafe { ioctl::tun_set_iff(file.as_raw_fd(), &mut req) };
    res.map_err(|e| {
        let context = match e {
            Errno::EBUSY if exclusive => "TUNSETIFF: interface already exists",
            Errno::EBUSY => "TUNSETIFF: interface busy (attached by another fd)",
            Errno::EPERM => "TUNSETIFF: not permitted (CAP_NET_ADMIN or TAP owner needed)",
            Errno::EINVAL => "TUNSETIFF: not a TAP interface, or bad name",
            _ => "TUNSETIFF",
        };
        LinkError::io(context, e)
    })?;
    let end = req.name.iter().position(|&c| c == 0).unwrap_or(IFNAMSIZ);
    Ok((file, String::from_utf8_lossy(&req.name[..end]).into_owned()))
}

fn index_of(name: &str) -> Result<u32, LinkError> {
    match if_nametoindex(name) {
        Ok(i) => Ok(i),
        Err(Errno::ENODEV) => Err(LinkError::NotFound(name.to_owned())),
        Err(e) => Err(LinkError::io("if_nametoindex", e)),
    }
}

impl TapLink {
    /// Attaches to the existing TAP interface `name` in the calling thread's network
    /// namespace. The interface keeps its MTU and state; the link starts in the state
    /// found (`Up` if the interface is administratively up, since a TAP is running once
    /// an fd is attached; else `Down(AdminDown)`).
    ///
    /// Errors: [`LinkError::Config`] for a bad name; [`LinkError::NotFound`] if there is
    /// no such interface; [`LinkError::Io`] if it is not a TAP, is attached elsewhere
    /// (`EBUSY`), we lack `CAP_NET_ADMIN` (`EPERM`), or a netlink query fails.
    pub fn open(name: &str) -> Result<TapLink, LinkError> {
        check_name(name)?;
        let before = index_of(name)?;
        let rtnl =
            RtnlSocket::open(RTMGRP_LINK).map_err(|e| LinkError::io("rtnetlink socket", e))?;
        let (file, actual) = attach(name, false)?;
        // TUNSETIFF creates the interface if it vanished in between; that one is ours,
        // not persistent, and goes away when `file` is dropped here.
        if index_of(&actual)? != before {
            return Err(LinkError::NotFound(name.to_owned()));
        }
        TapLink::finish(file, actual, rtnl, None)
    }

    /// Creates a new TAP interface `name` (at most 15 bytes; may contain `%d` for the
    /// kernel to number it, e.g. `"swtap%d"`) in the calling thread's network namespace,
    /// sets its MTU and brings it up as `options` say. The interface is not persistent:
    /// the kernel deletes it when this link is dropped.
    ///
    /// Errors: [`LinkError::Config`] for a bad name or MTU; [`LinkError::Io`] if the name
    /// exists (`EBUSY`), we lack `CAP_NET_ADMIN`, or a netlink request fails.
    pub fn create(name: &str, options: TapOptions) -> Result<TapLink, LinkError> {
        check_name(name)?;
        if let Some(mtu) = options.mtu {
            check_mtu(mtu, TAP_MAX_MTU)?;
        }
        let rtnl =
            RtnlSocket::open(RTMGRP_LINK).map_err(|e| LinkError::io("rtnetlink socket", e))?;
        let (file, name) = attach(name, true)?;
        TapLink::finish(file, name, rtnl, Some(options))
    }

    fn finish(
        file: File,
        name: String,
        mut rtnl: RtnlSocket,
        options: Option<TapOptions>,
    ) -> Result<TapLink, LinkError> {
        let ifindex = index_of(&name)?;
        let mut req = RtnlSocket::open(0).map_err(|e| LinkError::io("rtnetlink socket", e))?;
        if let Some(o) = options.filter(|o| o.up || o.mtu.is_some()) {
            // check_mtu bounded it to 65521, so the cast is lossless.
            req.set_link(ifindex, o.up.then_some(true), o.mtu.map(|m| m as u32))
                .map_err(|e| LinkError::io("RTM_SETLINK", e))?;
        }
        // Discard notifications older than the query below (they would replay stale
        // transitions); anything arriving after this is at least as new as the query.
        while let Ok(Some(_)) = rtnl.recv() {}
        let info: LinkMsg = req
            .get_link(ifindex)
            .map_err(|e| LinkError::io("RTM_GETLINK", e))?;
        let mtu = info.mtu.map_or(0, |m| m as usize);
        check_mtu(mtu, TAP_MAX_MTU)?;
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(|e| LinkError::io("epoll_create", e))?;
        epoll
            .add(&file, EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_TAP))
            .map_err(|e| LinkError::io("epoll_ctl", e))?;
        epoll
            .add(&rtnl, EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_RTNL))
            .map_err(|e| LinkError::io("epoll_ctl", e))?;
        let state = info.state();
        let span = tracing::info_span!("tap", name = %name, ifindex);
        span.in_scope(|| tracing::info!(mtu, ?state, "TAP attached"));
        Ok(TapLink {
            file,
            name,
            ifindex,
            mtu,
            rtnl: Some(rtnl),
            epoll,
            tracker: StateTracker::new(state),
            span,
        })
    }

    /// The interface index in its namespace.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    fn set_state(&mut self, next: LinkEvent) {
        if self.tracker.set(next) {
            let _e = self.span.enter();
            tracing::info!(event = ?next, "TAP state change");
            if next.is_gone() {
                // Quiet the poll fd for good: the TAP fd would report EPOLLERR forever.
                let _ = self.epoll.delete(&self.file);
                if let Some(rtnl) = self.rtnl.take() {
                    let _ = self.epoll.delete(&rtnl);
                }
            }
        }
    }

    /// Reads pending notifications and fd errors into the state tracker.
    fn check(&mut self) {
        if self.tracker.state().is_gone() {
            return;
        }
        let mut evs = [EpollEvent::empty(); 2];
        let n = match self.epoll.wait(&mut evs, EpollTimeout::ZERO) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(error = %e, "epoll_wait");
                return;
            }
        };
        let mut fd_error = false;
        let mut notified = false;
        for e in &evs[..n] {
            match e.data() {
                TOKEN_TAP => {
                    fd_error |= e
                        .events()
                        .intersects(EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP)
                }
                _ => notified = true,
            }
        }
        if notified {
            self.drain_rtnl();
        }
        if fd_error {
            self.set_state(LinkEvent::Gone(GoneReason::FdError(Errno::EBADFD)));
        }
    }

    fn drain_rtnl(&mut self) {
        loop {
            let Some(rtnl) = self.rtnl.as_mut() else {
                return;
            };
            match rtnl.recv() {
                Ok(Some(msgs)) => {
                    for m in msgs {
                        match m.body {
                            RtnlBody::NewLink(l) if l.index == self.ifindex => {
                                if let Some(mtu) = l.mtu.filter(|&m| m as usize != self.mtu) {
                                    let _e = self.span.enter();
                                    tracing::info!(
                                        mtu,
                                        "interface MTU changed; link keeps the MTU it opened with"
                                    );
                                }
                                self.set_state(l.state());
                            }
                            RtnlBody::DelLink(l) if l.index == self.ifindex => {
                                self.set_state(LinkEvent::Gone(GoneReason::Deleted));
                            }
                            _ => {}
                        }
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "rtnetlink receive failed; re-reading link state");
                    self.resync();
                    if e.raw_os_error() != Some(libc::ENOBUFS) {
                        return;
                    }
                }
            }
        }
    }

    /// Re-reads the state with `RTM_GETLINK` after lost notifications.
    fn resync(&mut self) {
        let res = RtnlSocket::open(0).and_then(|mut s| s.get_link(self.ifindex));
        match res {
            Ok(info) => self.set_state(info.state()),
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {
                self.set_state(LinkEvent::Gone(GoneReason::Deleted))
            }
            Err(e) => {
                let _e = self.span.enter();
                tracing::warn!(error = %e, "cannot re-read link state");
            }
        }
    }

    fn fd_gone(&mut self) -> LinkError {
        let reason = GoneReason::FdError(Errno::EBADFD);
        self.set_state(LinkEvent::Gone(reason));
        match self.tracker.state() {
            LinkEvent::Gone(r) => LinkError::Gone(r),
            _ => LinkError::Gone(reason),
        }
    }
}

impl Link for TapLink {
    fn name(&self) -> &str {
        &self.name
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        if let LinkEvent::Gone(r) = self.tracker.state() {
            return Err(LinkError::Gone(r));
        }
        loop {
            match (&self.file).read(buf) {
                Ok(0) => return Ok(None),
                Ok(n) => return Ok(Some(n)),
                Err(e) => match e.raw_os_error() {
                    Some(libc::EAGAIN) => return Ok(None),
                    Some(libc::EINTR) => continue,
                    Some(libc::EBADFD) => return Err(self.fd_gone()),
                    _ => return Err(LinkError::io("read TAP", e)),
                },
            }
        }
    }

    fn send(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        let max = self.max_frame_len();
        if frame.len() > max {
            return Err(LinkError::FrameTooLarge {
                len: frame.len(),
                max,
            });
        }
        if let LinkEvent::Gone(r) = self.tracker.state() {
            return Err(LinkError::Gone(r));
        }
        loop {
            match (&self.file).write(frame) {
                Ok(n) if n == frame.len() => return Ok(()),
                Ok(_) => {
                    return Err(LinkError::io(
                        "write TAP",
                        std::io::Error::from(ErrorKind::WriteZero),
                    ))
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // tun_get_user: EIO while the interface is not IFF_UP.
                    Some(libc::EIO) => {
                        return Err(match self.tracker.state() {
                            LinkEvent::Down(r) => LinkError::Down(r),
                            _ => LinkError::Down(super::DownReason::AdminDown),
                        })
                    }
                    Some(libc::EBADFD) => return Err(self.fd_gone()),
                    _ => return Err(LinkError::io("write TAP", e)),
                },
            }
        }
    }

    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.epoll.0.as_fd()
    }

    fn poll_event(&mut self) -> Option<LinkEvent> {
        if !self.tracker.has_events() {
            self.check();
        }
        self.tracker.pop()
    }

    fn state(&self) -> LinkEvent {
        self.tracker.state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("tapA").is_ok());
        assert!(check_name("swtap%d").is_ok());
        assert!(check_name("0123456789abcde").is_ok());
        assert!(matches!(
            check_name("0123456789abcdef"),
            Err(LinkError::Config(_))
        ));
        assert!(check_name("a\0b").is_err());
        assert!(check_name("a/b").is_err());
        assert!(matches!(
            TapLink::create(
                "x",
                TapOptions {
                    mtu: Some(65522),
                    up: false
                }
            ),
            Err(LinkError::Config(_))
        ));
        assert_eq!(std::mem::size_of::<IfReqFlags>(), 40);
    }

    #[test]
    fn missing_interface_is_not_found() {
        // Needs no privileges: the name lookup fails before /dev/net/tun is opened.
        assert!(matches!(
            TapLink::open("swnosuch0"),
            Err(LinkError::NotFound(n)) if n == "swnosuch0"
        ));
    }
}
