//! A minimal rtnetlink (`NETLINK_ROUTE`, rtnetlink(7)) client for one network interface:
//! parse `RTM_NEWLINK` / `RTM_DELLINK`, query a link by index, set its MTU and `IFF_UP`.
//!
//! Layouts from `linux/netlink.h` and `linux/rtnetlink.h`; all integers are in host byte
//! order (netlink(7)). Parsing is bounds-checked and never panics on malformed input.
//!
//! A netlink socket belongs to the network namespace of the thread that created it, so a
//! thread that `setns(2)`-ed into a namespace sees that namespace's interfaces.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    bind, recvfrom, sendto, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
    SockType,
};

use super::{DownReason, LinkEvent};

/// `struct nlmsghdr`: len u32, type u16, flags u16, seq u32, pid u32.
const NLMSG_HDR_LEN: usize = 16;
/// `struct ifinfomsg`: family u8, pad u8, type u16, index i32, flags u32, change u32.
const IFINFOMSG_LEN: usize = 16;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
/// `NLA_TYPE_MASK`: attribute type without the nested / byte-order flags.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// `IFF_UP` (`linux/if.h`): administratively up.
pub(crate) const IFF_UP: u32 = 0x1;
/// `IFF_RUNNING` (`linux/if.h`): operationally up (RFC 2863 operstate UP), as the kernel's
/// linkwatch has processed the carrier; reported by `dev_get_flags`.
pub(crate) const IFF_RUNNING: u32 = 0x40;
/// `IFF_LOWER_UP` (`linux/if.h`): the driver signals L1 up (carrier), immediately.
#[cfg(test)]
pub(crate) const IFF_LOWER_UP: u32 = 0x1_0000;
/// `RTMGRP_LINK`: the multicast group of link notifications.
pub(crate) const RTMGRP_LINK: u32 = 0x1;

/// How long a request waits for the kernel's answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// The parts of an `RTM_NEWLINK` / `RTM_DELLINK` message that a link cares about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkMsg {
    /// Interface index.
    pub index: u32,
    /// `IFF_*` flags.
    pub flags: u32,
    /// `IFLA_MTU` in bytes, if present.
    pub mtu: Option<u32>,
    /// `IFLA_IFNAME`, if present.
    pub name: Option<String>,
}

impl LinkMsg {
    /// The link state these flags mean: down without `IFF_UP`, no carrier without
    /// `IFF_RUNNING`, else up.
    ///
    /// `IFF_RUNNING` (RFC 2863 operstate UP) rather than `IFF_LOWER_UP` (raw carrier): the
    /// kernel acts on a carrier change (qdisc activation, bridge port state) in its
    /// linkwatch work, which also sets the operstate; the carrier bit alone can run ahead
    /// of that by up to a second.
    pub(crate) fn state(&self) -> LinkEvent {
        if self.flags & IFF_UP == 0 {
            LinkEvent::Down(DownReason::AdminDown)
        } else if self.flags & IFF_RUNNING == 0 {
            LinkEvent::Down(DownReason::NoCarrier)
        } else {
            LinkEvent::Up
        }
    }
}

/// One parsed netlink message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RtnlBody {
    NewLink(LinkMsg),
    DelLink(LinkMsg),
    /// `NLMSG_ERROR`: `errno` is 0 for an ACK, else a negative errno.
    Error(i32),
    Done,
    Overrun,
    Other(u16),
}

/// A netlink message: its sequence number and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RtnlMsg {
    pub seq: u32,
    pub body: RtnlBody,
}

/// Why a netlink buffer could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed(pub &'static str);

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(off..off + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// Parses every netlink message in `buf` (one datagram). Messages before a malformed one
/// are lost with it; the caller re-queries state on error.
pub(crate) fn parse(buf: &[u8]) -> Result<Vec<RtnlMsg>, Malformed> {
    let mut out = Vec::new();
    let mut off = 0;
    while buf.len() - off >= NLMSG_HDR_LEN {
        let len = u32_at(buf, off).ok_or(Malformed("header"))? as usize;
        if len < NLMSG_HDR_LEN || len > buf.len() - off {
            return Err(Malformed("nlmsg_len out of range"));
        }
        let ty = u16_at(buf, off + 4).ok_or(Malformed("header"))?;
        let seq = u32_at(buf, off + 8).ok_or(Malformed("header"))?;
        let payload = &buf[off + NLMSG_HDR_LEN..off + len];
        let body = match ty {
            RTM_NEWLINK => RtnlBody::NewLink(parse_ifinfo(payload)?),
            RTM_DELLINK => RtnlBody::DelLink(parse_ifinfo(payload)?),
            NLMSG_ERROR => {
                RtnlBody::Error(u32_at(payload, 0).ok_or(Malformed("short NLMSG_ERROR"))? as i32)
            }
            NLMSG_DONE => RtnlBody::Done,
            NLMSG_OVERRUN => RtnlBody::Overrun,
            other => RtnlBody::Other(other),
        };
        out.push(RtnlMsg { seq, body });
        off = (off + align4(len)).min(buf.len());
    }
    Ok(out)
}

fn parse_ifinfo(p: &[u8]) -> Result<LinkMsg, Malformed> {
    if p.len() < IFINFOMSG_LEN {
        return Err(Malformed("short ifinfomsg"));
    }
    let short = Malformed("short ifinfomsg");
    let mut msg = LinkMsg {
        index: u32_at(p, 4).ok_or(short)?,
        flags: u32_at(p, 8).ok_or(short)?,
        mtu: None,
        name: None,
    };
    let mut off = IFINFOMSG_LEN;
    while p.len() - off >= 4 {
        let alen = u16_at(p, off).ok_or(Malformed("attr"))? as usize;
        let aty = u16_at(p, off + 2).ok_or(Malformed("attr"))? & NLA_TYPE_MASK;
        if alen < 4 || alen > p.len() - off {
            return Err(Malformed("rta_len out of range"));
        }
        let data = &p[off + 4..off + alen];
        match aty {
            IFLA_MTU => msg.mtu = u32_at(data, 0),
            IFLA_IFNAME => {
                let end = data.iter().position(|&c| c == 0).unwrap_or(data.len());
                msg.name = Some(String::from_utf8_lossy(&data[..end]).into_owned());
            }
            _ => {}
        }
        off = (off + align4(alen)).min(p.len());
    }
    Ok(msg)
}

fn header(out: &mut Vec<u8>, ty: u16, flags: u16, seq: u32) {
    out.extend_from_slice(&0u32.to_ne_bytes()); // length, patched by `finish`
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes()); // pid: 0 = to the kernel
}

fn ifinfo(out: &mut Vec<u8>, index: u32, flags: u32, change: u32) {
    out.extend_from_slice(&[0, 0]); // AF_UNSPEC, pad
    out.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    out.extend_from_slice(&index.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&change.to_ne_bytes());
}

fn finish(mut out: Vec<u8>) -> Vec<u8> {
    let len = out.len() as u32;
    out[0..4].copy_from_slice(&len.to_ne_bytes());
    out
}

/// `RTM_GETLINK` for one interface index.
pub(crate) fn get_link_request(seq: u32, index: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(32);
    header(&mut m, RTM_GETLINK, NLM_F_REQUEST, seq);
    ifinfo(&mut m, index, 0, 0);
    finish(m)
}

/// `RTM_SETLINK` with an ACK request: `up` sets or clears `IFF_UP`, `mtu` sets `IFLA_MTU`.
pub(crate) fn set_link_request(
    seq: u32,
    index: u32,
    up: Option<bool>,
    mtu: Option<u32>,
) -> Vec<u8> {
    let mut m = Vec::with_capacity(40);
    header(&mut m, RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, seq);
    let (flags, change) = match up {
        Some(true) => (IFF_UP, IFF_UP),
        Some(false) => (0, IFF_UP),
        None => (0, 0),
    };
    ifinfo(&mut m, index, flags, change);
    if let Some(mtu) = mtu {
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&IFLA_MTU.to_ne_bytes());
        m.extend_from_slice(&mtu.to_ne_bytes());
    }
    finish(m)
}

/// A `NETLINK_ROUTE` socket (non-blocking, close-on-exec) in the calling thread's network
/// namespace.
#[derive(Debug)]
pub(crate) struct RtnlSocket {
    fd: OwnedFd,
    buf: Vec<u8>,
    seq: u32,
}

impl RtnlSocket {
    /// Opens a socket subscribed to the multicast `groups` (e.g. [`RTMGRP_LINK`]; 0 for a
    /// request-only socket).
    pub(crate) fn open(groups: u32) -> io::Result<Self> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups))?;
        Ok(RtnlSocket {
            fd,
            // Larger than any link message (a few KiB with stats and attributes).
            buf: vec![0u8; 64 * 1024],
            seq: 0,
        })
    }

    /// Receives one datagram; `Ok(None)` when none is pending. Datagrams not from the
    /// kernel (port id 0) are ignored. `ENOBUFS` (the socket overflowed and
    /// notifications were lost) is returned as an error for the caller to re-query.
    pub(crate) fn recv(&mut self) -> io::Result<Option<Vec<RtnlMsg>>> {
        loop {
            match recvfrom::<NetlinkAddr>(self.fd.as_raw_fd(), &mut self.buf) {
                Ok((n, from)) => {
                    if from.is_some_and(|a| a.pid() != 0) {
                        continue;
                    }
                    let n = n.min(self.buf.len());
                    return parse(&self.buf[..n])
                        .map(Some)
                        .map_err(|m| io::Error::new(io::ErrorKind::InvalidData, m.0));
                }
                Err(Errno::EAGAIN) => return Ok(None),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sends `msg` (built with sequence number `seq`) and returns the answers carrying that
    /// sequence number, up to and including the first `NewLink` or `Error`.
    fn request(&mut self, msg: &[u8], seq: u32) -> io::Result<Vec<RtnlMsg>> {
        sendto(
            self.fd.as_raw_fd(),
            msg,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let mut answers = Vec::new();
        loop {
            while let Some(msgs) = self.recv()? {
                for m in msgs.into_iter().filter(|m| m.seq == seq) {
                    let last = matches!(m.body, RtnlBody::NewLink(_) | RtnlBody::Error(_));
                    answers.push(m);
                    if last {
                        return Ok(answers);
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no rtnetlink answer",
                ));
            }
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms.max(1))) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Queries one interface by index.
    ///
    /// Errors: the kernel's errno (e.g. `ENODEV` when the index no longer exists),
    /// `TimedOut` after 2 s without an answer, socket errors.
    pub(crate) fn get_link(&mut self, index: u32) -> io::Result<LinkMsg> {
        let seq = self.next_seq();
        let answers = self.request(&get_link_request(seq, index), seq)?;
        for a in answers {
            match a.body {
                RtnlBody::NewLink(l) if l.index == index => return Ok(l),
                RtnlBody::Error(e) if e < 0 => return Err(io::Error::from_raw_os_error(-e)),
                _ => {}
            }
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "RTM_GETLINK answered without the link",
        ))
    }

    /// Sets `IFF_UP` (if `up` is given) and the MTU in bytes (if `mtu` is given).
    ///
    /// Errors: the kernel's errno (e.g. `EINVAL` for an MTU above the device maximum),
    /// `TimedOut`, socket errors.
    pub(crate) fn set_link(
        &mut self,
        index: u32,
        up: Option<bool>,
        mtu: Option<u32>,
    ) -> io::Result<()> {
        let seq = self.next_seq();
        let answers = self.request(&set_link_request(seq, index, up, mtu), seq)?;
        match answers.last().map(|a| &a.body) {
            Some(RtnlBody::Error(0)) => Ok(()),
            Some(RtnlBody::Error(e)) => Err(io::Error::from_raw_os_error(-e)),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "RTM_SETLINK answered without an ACK",
            )),
        }
    }
}

impl AsFd for RtnlSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nlmsg(ty: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        header(&mut m, ty, 0, seq);
        m.extend_from_slice(payload);
        let m = finish(m);
        let mut padded = m.clone();
        padded.resize(align4(m.len()), 0);
        padded
    }

    fn attr(ty: u16, data: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&ty.to_ne_bytes());
        a.extend_from_slice(data);
        a.resize(align4(a.len()), 0);
        a
    }

    fn newlink_payload(index: u32, flags: u32) -> Vec<u8> {
        let mut p = Vec::new();
        ifinfo(&mut p, index, flags, 0);
        p.extend(attr(IFLA_IFNAME, b"tapA\0"));
        p.extend(attr(IFLA_MTU, &9000u32.to_ne_bytes()));
        p.extend(attr(0x8000 | 99, &[1, 2, 3, 4])); // nested, unknown: skipped
        p
    }

    #[test]
    fn get_link_request_bytes() {
        let m = get_link_request(7, 42);
        let mut want = Vec::new();
        want.extend_from_slice(&32u32.to_ne_bytes());
        want.extend_from_slice(&18u16.to_ne_bytes());
        want.extend_from_slice(&1u16.to_ne_bytes());
        want.extend_from_slice(&7u32.to_ne_bytes());
        want.extend_from_slice(&0u32.to_ne_bytes());
        want.extend_from_slice(&[0, 0, 0, 0]);
        want.extend_from_slice(&42u32.to_ne_bytes());
        want.extend_from_slice(&[0; 8]);
        assert_eq!(m, want);
    }

    #[test]
    fn set_link_request_bytes() {
        let m = set_link_request(3, 5, Some(true), Some(1500));
        assert_eq!(m.len(), 40);
        assert_eq!(u32_at(&m, 0), Some(40));
        assert_eq!(u16_at(&m, 4), Some(RTM_SETLINK));
        assert_eq!(u16_at(&m, 6), Some(NLM_F_REQUEST | NLM_F_ACK));
        assert_eq!(u32_at(&m, 20), Some(5)); // index
        assert_eq!(u32_at(&m, 24), Some(IFF_UP)); // flags
        assert_eq!(u32_at(&m, 28), Some(IFF_UP)); // change
        assert_eq!(u16_at(&m, 32), Some(8));
        assert_eq!(u16_at(&m, 34), Some(IFLA_MTU));
        assert_eq!(u32_at(&m, 36), Some(1500));
        let m = set_link_request(3, 5, None, None);
        assert_eq!(m.len(), 32);
        assert_eq!(u32_at(&m, 28), Some(0));
    }

    #[test]
    fn parses_new_del_error_done() {
        let mut buf = nlmsg(RTM_NEWLINK, 0, &newlink_payload(4, IFF_UP | IFF_RUNNING));
        buf.extend(nlmsg(RTM_DELLINK, 0, &newlink_payload(4, 0)));
        buf.extend(nlmsg(NLMSG_ERROR, 9, &(-19i32).to_ne_bytes()));
        buf.extend(nlmsg(NLMSG_DONE, 9, &[0; 4]));
        buf.extend(nlmsg(24, 1, &[])); // RTM_NEWROUTE: other
        let msgs = parse(&buf).unwrap();
        let link = LinkMsg {
            index: 4,
            flags: IFF_UP | IFF_RUNNING,
            mtu: Some(9000),
            name: Some("tapA".into()),
        };
        assert_eq!(msgs[0].body, RtnlBody::NewLink(link.clone()));
        assert_eq!(link.state(), LinkEvent::Up);
        assert_eq!(
            msgs[1].body,
            RtnlBody::DelLink(LinkMsg { flags: 0, ..link })
        );
        assert_eq!(
            msgs[2],
            RtnlMsg {
                seq: 9,
                body: RtnlBody::Error(-19)
            }
        );
        assert_eq!(msgs[3].body, RtnlBody::Done);
        assert_eq!(msgs[4].body, RtnlBody::Other(24));
        assert_eq!(msgs.len(), 5);
    }

    #[test]
    fn state_from_flags() {
        let l = |flags| {
            LinkMsg {
                index: 1,
                flags,
                mtu: None,
                name: None,
            }
            .state()
        };
        assert_eq!(l(0), LinkEvent::Down(DownReason::AdminDown));
        assert_eq!(l(IFF_RUNNING), LinkEvent::Down(DownReason::AdminDown));
        assert_eq!(l(IFF_UP), LinkEvent::Down(DownReason::NoCarrier));
        // Carrier without the operstate: not up yet (linkwatch has not run).
        assert_eq!(
            l(IFF_UP | IFF_LOWER_UP),
            LinkEvent::Down(DownReason::NoCarrier)
        );
        assert_eq!(l(IFF_UP | IFF_RUNNING | IFF_LOWER_UP), LinkEvent::Up);
    }

    #[test]
    fn malformed_never_panics() {
        let good = nlmsg(RTM_NEWLINK, 0, &newlink_payload(4, 1));
        // Every truncation and every single-byte corruption parses or errors, no panic.
        for cut in 0..good.len() {
            let _ = parse(&good[..cut]);
        }
        for i in 0..good.len() {
            for x in [0x01u8, 0x80, 0xff] {
                let mut b = good.clone();
                b[i] ^= x;
                let _ = parse(&b);
            }
        }
        // A length field pointing past the buffer is an error.
        let mut b = good.clone();
        b[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(parse(&b).is_err());
        // An attribute length below 4 is an error.
        let mut p = Vec::new();
        ifinfo(&mut p, 1, 0, 0);
        p.extend_from_slice(&[2, 0, 3, 0]);
        assert!(parse(&nlmsg(RTM_NEWLINK, 0, &p)).is_err());
        // A short ifinfomsg is an error; a short tail under 16 bytes is ignored.
        assert!(parse(&nlmsg(RTM_NEWLINK, 0, &[0; 8])).is_err());
        assert_eq!(parse(&[0u8; 15]).unwrap(), vec![]);
    }
}
