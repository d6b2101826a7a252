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
//! [`TapLink::open_with`] with [`TapOffload::Tcp4`] attaches with `IFF_VNET_HDR` as well
//! and asks for checksum and TCP segmentation offload (`TUNSETOFFLOAD`, `TUN_F_CSUM |
//! TUN_F_TSO4`): every read and write then starts with a 10-byte `virtio_net_hdr`, a
//! write may carry a TCP super-segment for the kernel to cut, and a read may return a
//! coalesced one (see [`super::offload`]). A refusal is logged once and the link runs
//! without the offload.
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
//! `RTM_GETLINK`. A third member, an `eventfd(2)`, is readable exactly while an event is
//! queued and not yet taken by [`Link::poll_event`]: a read or write that meets
//! `EBADFD` queues `Gone` without any notification (`ip link del` detaches the TAP fd
//! before it sends `RTM_DELLINK`), and a caller that then sleeps on the poll fd must
//! still wake for it. Once gone, the TAP and netlink fds leave the epoll set, so the
//! poll fd stays quiet after `Gone` was taken.
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
use std::io::{ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;

use nix::errno::Errno;
use nix::net::if_::if_nametoindex;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::offload::{fill_partial_csum, RxCsum, RxMeta, OFFLOAD_MAX_FRAME};
use super::rtnl::{LinkMsg, RtnlBody, RtnlSocket, AF_UNSPEC, RTMGRP_LINK};
use super::{check_mtu, GoneReason, Link, LinkError, LinkEvent, StateTracker};

/// Largest MTU in bytes of a TAP interface: 65521 = 65535 - 14, the tun driver's
/// `max_mtu` (`MAX_MTU - dev->hard_header_len` in `drivers/net/tun.c`; also
/// transport-notes.md).
pub const TAP_MAX_MTU: usize = 65_521;

/// Interface names are at most 15 bytes plus a NUL (`IFNAMSIZ`, `linux/if.h`).
const IFNAMSIZ: usize = 16;

const TOKEN_TAP: u64 = 0;
const TOKEN_RTNL: u64 = 1;
const TOKEN_QUEUED: u64 = 2;

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
    // `TUNSETOFFLOAD` takes the `TUN_F_*` offload bits by value.
    nix::ioctl_write_int_bad!(tun_set_offload, libc::TUNSETOFFLOAD);
}

/// Length in bytes of `struct virtio_net_hdr` (`include/uapi/linux/virtio_net.h`), which
/// starts every read and write of a TAP attached with `IFF_VNET_HDR` (the default
/// `TUNSETVNETHDRSZ`): flags (u8), gso_type (u8), hdr_len, gso_size, csum_start,
/// csum_offset (u16 each, in the host's byte order for a legacy header as tun uses it).
pub const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum at `csum_start + csum_offset` is partial.
const VNET_F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the kernel verified the checksum.
const VNET_F_DATA_VALID: u8 = 2;
/// `VIRTIO_NET_HDR_GSO_NONE` and `VIRTIO_NET_HDR_GSO_TCPV4`.
const VNET_GSO_NONE: u8 = 0;
const VNET_GSO_TCPV4: u8 = 1;
/// Byte offset of the checksum field in a TCP header (RFC 9293 3.1).
const TCP_CSUM_OFFSET: u16 = 16;
/// Length in bytes of the Ethernet II header before `csum_start`'s IPv4 header.
const ETH_HLEN: usize = super::ETHERNET_HEADER_LEN;

/// A `virtio_net_hdr` for a frame we write.
fn vnet_hdr(
    flags: u8,
    gso_type: u8,
    hdr_len: u16,
    gso_size: u16,
    csum_start: u16,
) -> [u8; VNET_HDR_LEN] {
    let mut h = [0u8; VNET_HDR_LEN];
    h[0] = flags;
    h[1] = gso_type;
    h[2..4].copy_from_slice(&hdr_len.to_ne_bytes());
    h[4..6].copy_from_slice(&gso_size.to_ne_bytes());
    if flags & VNET_F_NEEDS_CSUM != 0 {
        h[6..8].copy_from_slice(&csum_start.to_ne_bytes());
        h[8..10].copy_from_slice(&TCP_CSUM_OFFSET.to_ne_bytes());
    }
    h
}

/// What a received `virtio_net_hdr` says about its frame of `len` bytes.
fn rx_meta(h: &[u8; VNET_HDR_LEN], len: usize) -> RxMeta {
    let csum = if h[0] & VNET_F_NEEDS_CSUM != 0 {
        RxCsum::Partial
    } else if h[0] & VNET_F_DATA_VALID != 0 {
        RxCsum::Valid
    } else {
        RxCsum::Unverified
    };
    let gso = u16::from_ne_bytes([h[4], h[5]]);
    RxMeta {
        len,
        csum,
        gso_size: (h[1] & 0x7f != VNET_GSO_NONE && gso > 0).then_some(gso),
    }
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

/// Offloads asked of a TAP ([`TapLink::open_with`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TapOffload {
    /// None: frames without a `virtio_net_hdr`, every one at most the MTU (what
    /// [`TapLink::open`] does).
    #[default]
    Off,
    /// `IFF_VNET_HDR` and `TUNSETOFFLOAD` with `TUN_F_CSUM | TUN_F_TSO4`: checksum
    /// offload both ways, TCP super-segments of up to 64 KiB written and read
    /// ([`Link::tcp_offload`]). If the kernel refuses `TUNSETOFFLOAD`, the link says so
    /// once in its log and runs without (the header stays, always empty).
    Tcp4,
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
    /// In `epoll`; readable exactly while `tracker` holds an event not yet taken.
    queued: EventFd,
    tracker: StateTracker,
    span: tracing::Span,
    /// Attached with `IFF_VNET_HDR`: every read and write starts with a header.
    vnet: bool,
    /// The kernel accepted `TUN_F_CSUM | TUN_F_TSO4`.
    offload: bool,
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
fn attach(name: &str, exclusive: bool, vnet: bool) -> Result<(File, String), LinkError> {
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
    if vnet {
        flags |= libc::IFF_VNET_HDR;
    }
    // All flag values fit in the C short the kernel reads (0x0002 | 0x1000 | 0x4000 |
    // 0x8000).
    req.flags = flags as libc::c_short;
    // SAFETY: `file` is an open /dev/net/tun fd, and `req` is a live, properly aligned
    // `struct ifreq`-sized buffer (40 bytes) that the kernel reads and writes back for the
    // duration of the call only.
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

/// Asks the kernel for checksum offload and TSO4 on an fd attached with
/// `IFF_VNET_HDR` (`TUNSETOFFLOAD`, `drivers/net/tun.c` `set_offload`).
fn set_offload(file: &File) -> Result<(), Errno> {
    let bits = libc::TUN_F_CSUM | libc::TUN_F_TSO4;
    // SAFETY: `file` is an open, attached /dev/net/tun fd; TUNSETOFFLOAD reads only its
    // integer argument (the offload bits, passed by value) and touches no memory of ours.
    #[allow(unsafe_code)]
    let res = unsafe { ioctl::tun_set_offload(file.as_raw_fd(), bits as libc::c_int) };
    res.map(|_| ())
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
        TapLink::open_with(name, TapOffload::Off)
    }

    /// As [`TapLink::open`], asking for the offloads `offload` says. With
    /// [`TapOffload::Tcp4`] the fd is attached with `IFF_VNET_HDR` and the link reports
    /// [`Link::tcp_offload`] if the kernel accepts `TUNSETOFFLOAD`; otherwise it logs
    /// the refusal once and runs as without.
    ///
    /// Errors: as [`TapLink::open`].
    pub fn open_with(name: &str, offload: TapOffload) -> Result<TapLink, LinkError> {
        check_name(name)?;
        let before = index_of(name)?;
        let rtnl =
            RtnlSocket::open(RTMGRP_LINK).map_err(|e| LinkError::io("rtnetlink socket", e))?;
        let vnet = offload == TapOffload::Tcp4;
        let (file, actual) = attach(name, false, vnet)?;
        // TUNSETIFF creates the interface if it vanished in between; that one is ours,
        // not persistent, and goes away when `file` is dropped here.
        if index_of(&actual)? != before {
            return Err(LinkError::NotFound(name.to_owned()));
        }
        TapLink::finish(file, actual, rtnl, None, vnet)
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
        let (file, name) = attach(name, true, false)?;
        TapLink::finish(file, name, rtnl, Some(options), false)
    }

    fn finish(
        file: File,
        name: String,
        mut rtnl: RtnlSocket,
        options: Option<TapOptions>,
        vnet: bool,
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
        let queued = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| LinkError::io("eventfd", e))?;
        epoll
            .add(&queued, EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_QUEUED))
            .map_err(|e| LinkError::io("epoll_ctl", e))?;
        let state = info.state();
        let span = tracing::info_span!("tap", name = %name, ifindex);
        let offload = vnet
            && match set_offload(&file) {
                Ok(()) => true,
                Err(e) => {
                    span.in_scope(|| {
                        tracing::warn!(error = %e,
                            "TUNSETOFFLOAD refused: running without checksum and segmentation offload")
                    });
                    false
                }
            };
        span.in_scope(|| tracing::info!(mtu, ?state, offload, "TAP attached"));
        Ok(TapLink {
            file,
            name,
            ifindex,
            mtu,
            rtnl: Some(rtnl),
            epoll,
            queued,
            tracker: StateTracker::new(state),
            span,
            vnet,
            offload,
        })
    }

    /// The interface index in its namespace.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    fn set_state(&mut self, next: LinkEvent) {
        if self.tracker.set(next) {
            // The poll fd is readable until the event is taken (`poll_event`). An
            // eventfd write fails only on counter overflow, which one write per state
            // change cannot reach.
            let _ = self.queued.write(1);
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
        let mut evs = [EpollEvent::empty(); 3];
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
                TOKEN_RTNL => notified = true,
                // The queued-event eventfd: nothing to read from the kernel.
                _ => {}
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
                            // AF_BRIDGE messages describe the TAP as a bridge port (one with
                            // RTM_DELLINK when it leaves a bridge), not the interface.
                            RtnlBody::NewLink(l)
                                if l.index == self.ifindex && l.family == AF_UNSPEC =>
                            {
                                if let Some(mtu) = l.mtu.filter(|&m| m as usize != self.mtu) {
                                    let _e = self.span.enter();
                                    tracing::info!(
                                        mtu,
                                        "interface MTU changed; link keeps the MTU it opened with"
                                    );
                                }
                                self.set_state(l.state());
                            }
                            RtnlBody::DelLink(l)
                                if l.index == self.ifindex && l.family == AF_UNSPEC =>
                            {
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

    /// Writes `frame` behind `hdr` (the header only when attached with `IFF_VNET_HDR`).
    fn write_frame(&mut self, hdr: &[u8; VNET_HDR_LEN], frame: &[u8]) -> Result<(), LinkError> {
        if let LinkEvent::Gone(r) = self.tracker.state() {
            return Err(LinkError::Gone(r));
        }
        let want = frame.len() + if self.vnet { VNET_HDR_LEN } else { 0 };
        loop {
            let res = if self.vnet {
                (&self.file).write_vectored(&[IoSlice::new(hdr), IoSlice::new(frame)])
            } else {
                (&self.file).write(frame)
            };
            match res {
                Ok(n) if n == want => return Ok(()),
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
        Ok(self.recv_meta(buf)?.map(|m| m.len))
    }

    fn tcp_offload(&self) -> bool {
        self.offload
    }

    fn recv_meta(&mut self, buf: &mut [u8]) -> Result<Option<RxMeta>, LinkError> {
        if let LinkEvent::Gone(r) = self.tracker.state() {
            return Err(LinkError::Gone(r));
        }
        let mut hdr = [0u8; VNET_HDR_LEN];
        loop {
            let res = if self.vnet {
                let mut iov = [IoSliceMut::new(&mut hdr), IoSliceMut::new(buf)];
                (&self.file).read_vectored(&mut iov)
            } else {
                (&self.file).read(buf)
            };
            match res {
                Ok(0) => return Ok(None),
                Ok(n) if self.vnet => {
                    // A read shorter than the header carries no frame.
                    let Some(len) = n.checked_sub(VNET_HDR_LEN).filter(|&l| l > 0) else {
                        return Ok(None);
                    };
                    return Ok(Some(rx_meta(&hdr, len)));
                }
                Ok(n) => {
                    return Ok(Some(RxMeta {
                        len: n,
                        ..RxMeta::default()
                    }))
                }
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
        let hdr = [0u8; VNET_HDR_LEN];
        self.write_frame(&hdr, frame)
    }

    fn send_tcp_offload(
        &mut self,
        frame: &mut [u8],
        gso_size: Option<u16>,
    ) -> Result<(), LinkError> {
        if !self.offload {
            let mut scratch = Vec::new();
            return super::segment_tcp4(frame, gso_size, &mut scratch, |p| self.send(p));
        }
        if frame.len() > OFFLOAD_MAX_FRAME {
            return Err(LinkError::FrameTooLarge {
                len: frame.len(),
                max: OFFLOAD_MAX_FRAME,
            });
        }
        let Some((ihl, doff)) = fill_partial_csum(frame) else {
            // Not IPv4/TCP: nothing to offload.
            return self.send(frame);
        };
        let csum_start = (ETH_HLEN + ihl) as u16;
        let hdr_len = csum_start + doff as u16;
        let (gso_type, gso) = match gso_size {
            Some(g) if frame.len() > usize::from(hdr_len) + usize::from(g) => (VNET_GSO_TCPV4, g),
            _ => (VNET_GSO_NONE, 0),
        };
        let hdr = vnet_hdr(VNET_F_NEEDS_CSUM, gso_type, hdr_len, gso, csum_start);
        self.write_frame(&hdr, frame)
    }

    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.epoll.0.as_fd()
    }

    fn poll_event(&mut self) -> Option<LinkEvent> {
        if !self.tracker.has_events() {
            self.check();
        }
        let ev = self.tracker.pop();
        if ev.is_some() && !self.tracker.has_events() {
            // Every event taken: the poll fd no longer reports one. EAGAIN when the
            // counter is zero already; nothing else can fail on a valid eventfd.
            let _ = self.queued.read();
        }
        ev
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
    fn virtio_net_headers() {
        // A TSO write: NEEDS_CSUM, GSO_TCPV4, hdr_len 54, gso_size 1460, csum_start 34,
        // csum_offset 16 (host byte order, little-endian here).
        let h = vnet_hdr(VNET_F_NEEDS_CSUM, VNET_GSO_TCPV4, 54, 1460, 34);
        if cfg!(target_endian = "little") {
            assert_eq!(h, [1, 1, 54, 0, 0xb4, 0x05, 34, 0, 16, 0]);
        }
        // A plain frame's header is all zero.
        assert_eq!(vnet_hdr(0, VNET_GSO_NONE, 0, 0, 0), [0; VNET_HDR_LEN]);
        // Received: coalesced with a partial checksum; verified; nothing said.
        let m = rx_meta(&h, 9000);
        assert_eq!(
            (m.len, m.csum, m.gso_size),
            (9000, RxCsum::Partial, Some(1460))
        );
        let mut v = [0u8; VNET_HDR_LEN];
        v[0] = VNET_F_DATA_VALID;
        assert_eq!(rx_meta(&v, 60).csum, RxCsum::Valid);
        assert_eq!(
            rx_meta(&[0; VNET_HDR_LEN], 60),
            RxMeta {
                len: 60,
                ..RxMeta::default()
            }
        );
        // The ECN bit of gso_type does not hide the TCPv4 type.
        let mut e = h;
        e[1] |= 0x80;
        assert_eq!(rx_meta(&e, 9000).gso_size, Some(1460));
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
