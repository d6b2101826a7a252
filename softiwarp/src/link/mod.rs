//! Links: whole Ethernet frames in and out of the soft device.
//!
//! **Room.** The bottom layer: frames, link state and the fds to sleep on (TAP ioctls,
//! rtnetlink, the in-memory pair, the pcap and fault middlewares). It touches nothing
//! else of the crate; `transport` carries its frames, the engine reads its events.
//!
//! A [`Link`] moves complete Ethernet II frames (destination MAC, source MAC, EtherType,
//! payload; no preamble, no FCS) between the device and "the wire". Two implementations:
//!
//! - [`TapLink`]: a Linux TAP interface (`/dev/net/tun`, `IFF_TAP | IFF_NO_PI`), opened by
//!   name or created; the fd is non-blocking.
//! - [`MemoryLink`]: two in-process endpoints joined back to back, for tests and for
//!   running with no privileges.
//!
//! and two middlewares that wrap any link and stack in any order:
//!
//! - [`Pcap`]: writes every frame of both directions to a legacy pcap file.
//! - [`Faults`]: drops, duplicates, reorders or corrupts frames with a seeded RNG.
//!
//! # Driving a link
//!
//! Every link is pollable through one file descriptor ([`Link::poll_fd`]): it is readable
//! whenever a frame can be received or a link event is pending, so an idle engine thread
//! can sleep in `poll(2)`/`epoll_wait(2)` on it. After it wakes, the engine calls
//! [`Link::poll_event`] until `None`, then [`Link::recv`] until `Ok(None)`.
//!
//! # Link failure
//!
//! Link state changes are first-class events ([`LinkEvent`]): `Up`, `Down` with a
//! [`DownReason`], and the terminal `Gone` with a [`GoneReason`]. What a TAP fd does when
//! its interface goes away, and how each case is detected, is in the [`tap`] module docs.
//!
//! # Example
//!
//! ```
//! use softiwarp::link::{FaultConfig, Faults, Link, LinkError, MemoryConfig, MemoryLink, Pcap};
//!
//! # fn main() -> Result<(), LinkError> {
//! let (a, mut b) = MemoryLink::pair(MemoryConfig::default())?;
//! // A's device sees (and captures) what is left after 1% loss on receive.
//! let rx_loss = FaultConfig { drop: 0.01, ..FaultConfig::none() };
//! let a = Faults::new(a, 42, FaultConfig::none(), rx_loss)?;
//! let mut a = Pcap::with_writer(a, Vec::new(), Box::new(|| std::time::Duration::ZERO))?;
//! a.send(&[0xff; 60])?;
//! let mut buf = vec![0u8; b.max_frame_len()];
//! assert_eq!(b.recv(&mut buf)?, Some(60));
//! assert_eq!(b.recv(&mut buf)?, None);
//! assert_eq!(a.frames_written(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! # Frame sizes
//!
//! `mtu()` is the IP MTU in bytes (the Ethernet payload limit), as the kernel reports it
//! for the interface; the longest frame a link carries is `mtu() + 14` bytes
//! ([`ETHERNET_HEADER_LEN`]). Receive buffers should be at least
//! [`Link::max_frame_len`] bytes long.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;

use nix::errno::Errno;

pub mod faults;
pub mod memory;
pub mod offload;
pub mod pcap;
pub(crate) mod rtnl;
pub mod tap;
pub mod udp;

pub use faults::{CorruptedFrame, Direction, FaultConfig, FaultStats, Faults};
pub use memory::{MemoryConfig, MemoryControl, MemoryLink};
pub use offload::{segment_tcp4, RxCsum, RxMeta, OFFLOAD_MAX_FRAME};
pub use pcap::{Pcap, PcapClock, PCAP_LINKTYPE_ETHERNET, PCAP_SNAPLEN};
pub use tap::{TapLink, TapOffload, TapOptions, TAP_MAX_MTU};
pub use udp::{UdpConfig, UdpLink, UDP_MAX_MTU};

/// Length in bytes of an Ethernet II header (two 6-byte MACs and a 2-byte EtherType),
/// IEEE 802.3 clause 3.1.1; TAP frames carry no preamble and no FCS.
pub const ETHERNET_HEADER_LEN: usize = 14;

/// Smallest IP MTU in bytes a link accepts: 68, the IPv4 minimum (RFC 791).
pub const MIN_MTU: usize = 68;

/// Largest IP MTU in bytes any link accepts: 65535, the largest IPv4 datagram (RFC 791);
/// a TAP is further limited to [`TAP_MAX_MTU`].
pub const MAX_MTU: usize = 65535;

/// Why a link is down (it may come back up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DownReason {
    /// The interface is administratively down (`ip link set DEV down`: `IFF_UP` cleared in
    /// an rtnetlink `RTM_NEWLINK` notification).
    AdminDown,
    /// The interface is up but not operational (`IFF_RUNNING` clear: RFC 2863 operstate
    /// not UP): no carrier, e.g. a TAP that no process has open.
    NoCarrier,
    /// Set down on demand through a [`MemoryControl`] (tests).
    Injected,
}

/// Why a link is gone for good. A gone link never comes back: the device is being removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoneReason {
    /// The interface left this network namespace: deleted (`ip link del`) or moved to
    /// another namespace; reported by an rtnetlink `RTM_DELLINK` notification.
    Deleted,
    /// The TAP fd reported an error: `EPOLLERR` from poll or `EBADFD` from read/write,
    /// which the kernel's tun driver returns once the interface is detached from the fd
    /// (`drivers/net/tun.c`: `tun_chr_poll`, `tun_get` returning NULL).
    FdError(Errno),
    /// Removed on demand through a [`MemoryControl`] (tests).
    Injected,
}

/// A link state change, and the link state itself ([`Link::state`] returns the last one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEvent {
    /// Frames flow: administratively up and operational.
    Up,
    /// Frames do not flow for now; sends fail with [`LinkError::Down`].
    Down(DownReason),
    /// The link is gone; terminal. Sends and receives fail with [`LinkError::Gone`] and the
    /// poll fd never becomes readable again.
    Gone(GoneReason),
}

impl LinkEvent {
    /// `true` for [`LinkEvent::Up`].
    pub fn is_up(&self) -> bool {
        matches!(self, LinkEvent::Up)
    }

    /// `true` for [`LinkEvent::Gone`].
    pub fn is_gone(&self) -> bool {
        matches!(self, LinkEvent::Gone(_))
    }
}

/// Errors of link operations.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The link is down; the frame was not sent.
    #[error("link is down ({0:?})")]
    Down(DownReason),
    /// The link is gone; nothing will be sent or received any more.
    #[error("link is gone ({0:?})")]
    Gone(GoneReason),
    /// A frame longer than [`Link::max_frame_len`] was offered to `send`.
    #[error("frame of {len} bytes exceeds the link's maximum of {max} bytes")]
    FrameTooLarge {
        /// Length of the offered frame in bytes.
        len: usize,
        /// The link's maximum frame length in bytes (MTU + 14).
        max: usize,
    },
    /// No interface of that name exists in the calling thread's network namespace.
    #[error("no network interface named {0:?}")]
    NotFound(String),
    /// A configuration value is out of range (the message says which).
    #[error("invalid link configuration: {0}")]
    Config(String),
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl LinkError {
    pub(crate) fn io(context: &'static str, source: impl Into<std::io::Error>) -> Self {
        LinkError::Io {
            context,
            source: source.into(),
        }
    }
}

/// A source and sink of whole Ethernet frames, pollable by one fd.
///
/// Implementations never block: `recv` returns `Ok(None)` when no frame is pending. They
/// are `Send` so a link can be built on one thread and handed to the engine thread.
pub trait Link: Send {
    /// The interface name (TAP) or endpoint name (memory link), for logs.
    fn name(&self) -> &str;

    /// IP MTU in bytes: the largest Ethernet payload (68..=65535; a TAP at most 65521).
    fn mtu(&self) -> usize;

    /// Largest frame in bytes this link carries: `mtu() + 14`.
    fn max_frame_len(&self) -> usize {
        self.mtu() + ETHERNET_HEADER_LEN
    }

    /// Receives one frame into `buf` and returns its length in bytes, or `Ok(None)` when
    /// no frame is pending (also while the link is down).
    ///
    /// `buf` should hold [`Link::max_frame_len`] bytes; a longer frame is cut to
    /// `buf.len()` (what a TAP read does). Errors: [`LinkError::Gone`] once the link is
    /// gone, [`LinkError::Io`] for an unexpected OS error.
    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, LinkError>;

    /// Sends one whole frame (`14..=max_frame_len()` bytes).
    ///
    /// Like a NIC, a link may drop a frame silently (queue full, peer down); the caller's
    /// transport retransmits. Errors: [`LinkError::FrameTooLarge`], [`LinkError::Down`]
    /// (TAP: `write` returns `EIO` while the interface is down), [`LinkError::Gone`],
    /// [`LinkError::Io`].
    fn send(&mut self, frame: &[u8]) -> Result<(), LinkError>;

    /// An fd that is readable while a frame or an event is pending; poll it for `POLLIN`.
    fn poll_fd(&self) -> BorrowedFd<'_>;

    /// Whether the link does the TCP/IPv4 offloads of the [`offload`] module: checksum
    /// offload both ways, segmentation of [`Link::send_tcp_offload`] super-segments,
    /// and coalesced received frames of up to [`OFFLOAD_MAX_FRAME`] bytes. `false` by
    /// default (memory and UDP links); a TAP opened with offload says `true` when the
    /// kernel accepted it (`TUNSETOFFLOAD`).
    fn tcp_offload(&self) -> bool {
        false
    }

    /// As [`Link::recv`], with what the link knows about the frame's checksum and
    /// coalescing ([`RxMeta`]). With [`Link::tcp_offload`], `buf` should hold
    /// [`OFFLOAD_MAX_FRAME`] bytes. Default: `recv`, every frame
    /// [`RxCsum::Unverified`] and not coalesced.
    ///
    /// Errors: as [`Link::recv`].
    fn recv_meta(&mut self, buf: &mut [u8]) -> Result<Option<RxMeta>, LinkError> {
        Ok(self.recv(buf)?.map(|len| RxMeta {
            len,
            ..RxMeta::default()
        }))
    }

    /// Sends an Ethernet II / IPv4 / TCP `frame` whose TCP checksum is not computed, and
    /// whose payload, with `gso_size`, is cut into pieces of `gso_size` bytes on the way
    /// (TSO; [`offload`] module docs); `frame` is at most [`OFFLOAD_MAX_FRAME`] bytes and
    /// may be changed (its checksum field). Default: the cutting and the checksums in
    /// software ([`segment_tcp4`]), each piece through [`Link::send`].
    ///
    /// Errors: as [`Link::send`], for the first piece that fails.
    fn send_tcp_offload(
        &mut self,
        frame: &mut [u8],
        gso_size: Option<u16>,
    ) -> Result<(), LinkError> {
        let mut scratch = Vec::new();
        segment_tcp4(frame, gso_size, &mut scratch, |piece| self.send(piece))
    }

    /// Takes the next pending state change, oldest first. Call it after each wake-up.
    fn poll_event(&mut self) -> Option<LinkEvent>;

    /// The current state: the last event reported or pending (initially the state found
    /// when the link was opened).
    fn state(&self) -> LinkEvent;
}

impl<L: Link + ?Sized> Link for Box<L> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn mtu(&self) -> usize {
        (**self).mtu()
    }
    fn max_frame_len(&self) -> usize {
        (**self).max_frame_len()
    }
    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        (**self).recv(buf)
    }
    fn send(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        (**self).send(frame)
    }
    fn poll_fd(&self) -> BorrowedFd<'_> {
        (**self).poll_fd()
    }
    fn tcp_offload(&self) -> bool {
        (**self).tcp_offload()
    }
    fn recv_meta(&mut self, buf: &mut [u8]) -> Result<Option<RxMeta>, LinkError> {
        (**self).recv_meta(buf)
    }
    fn send_tcp_offload(
        &mut self,
        frame: &mut [u8],
        gso_size: Option<u16>,
    ) -> Result<(), LinkError> {
        (**self).send_tcp_offload(frame, gso_size)
    }
    fn poll_event(&mut self) -> Option<LinkEvent> {
        (**self).poll_event()
    }
    fn state(&self) -> LinkEvent {
        (**self).state()
    }
}

/// Link state with a queue of changes: records an event only on a real change, and
/// treats `Gone` as terminal.
#[derive(Debug)]
pub(crate) struct StateTracker {
    state: LinkEvent,
    events: VecDeque<LinkEvent>,
}

impl StateTracker {
    pub(crate) fn new(initial: LinkEvent) -> Self {
        StateTracker {
            state: initial,
            events: VecDeque::new(),
        }
    }

    pub(crate) fn state(&self) -> LinkEvent {
        self.state
    }

    /// Moves to `next`; returns `true` (and queues an event) if the state changed.
    pub(crate) fn set(&mut self, next: LinkEvent) -> bool {
        if self.state.is_gone() || self.state == next {
            return false;
        }
        self.state = next;
        self.events.push_back(next);
        true
    }

    pub(crate) fn pop(&mut self) -> Option<LinkEvent> {
        self.events.pop_front()
    }

    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The error a send/recv gets in the current state, if any.
    pub(crate) fn error(&self) -> Option<LinkError> {
        match self.state {
            LinkEvent::Up => None,
            LinkEvent::Down(r) => Some(LinkError::Down(r)),
            LinkEvent::Gone(r) => Some(LinkError::Gone(r)),
        }
    }
}

/// Checks an MTU against [`MIN_MTU`]..=`max`.
pub(crate) fn check_mtu(mtu: usize, max: usize) -> Result<(), LinkError> {
    if (MIN_MTU..=max).contains(&mtu) {
        Ok(())
    } else {
        Err(LinkError::Config(format!(
            "MTU {mtu} bytes is outside {MIN_MTU}..={max}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracker_dedupes_and_gone_is_terminal() {
        let mut t = StateTracker::new(LinkEvent::Up);
        assert!(!t.set(LinkEvent::Up));
        assert!(t.set(LinkEvent::Down(DownReason::AdminDown)));
        assert!(!t.set(LinkEvent::Down(DownReason::AdminDown)));
        assert!(t.set(LinkEvent::Up));
        assert!(t.set(LinkEvent::Gone(GoneReason::Deleted)));
        assert!(!t.set(LinkEvent::Up));
        assert!(!t.set(LinkEvent::Gone(GoneReason::FdError(Errno::EBADFD))));
        assert_eq!(t.pop(), Some(LinkEvent::Down(DownReason::AdminDown)));
        assert_eq!(t.pop(), Some(LinkEvent::Up));
        assert_eq!(t.pop(), Some(LinkEvent::Gone(GoneReason::Deleted)));
        assert_eq!(t.pop(), None);
        assert_eq!(t.state(), LinkEvent::Gone(GoneReason::Deleted));
        assert!(matches!(
            t.error(),
            Some(LinkError::Gone(GoneReason::Deleted))
        ));
    }

    #[test]
    fn mtu_bounds() {
        assert!(check_mtu(68, MAX_MTU).is_ok());
        assert!(check_mtu(65535, MAX_MTU).is_ok());
        assert!(check_mtu(67, MAX_MTU).is_err());
        assert!(check_mtu(65522, TAP_MAX_MTU).is_err());
    }
}
