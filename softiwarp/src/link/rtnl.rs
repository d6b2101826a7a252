//! A minimal rtnetlink (`NETLINK_ROUTE`, rtnetlink(7)) client: parse `RTM_NEWLINK` /
//! `RTM_DELLINK` and `RTM_NEWADDR` / `RTM_DELADDR`, query a link by index, set its MTU and
//! `IFF_UP`, dump every link (`RTM_GETLINK`) or every IPv4 address (`RTM_GETADDR`) with
//! `NLM_F_DUMP`, the multi-part answer read up to `NLMSG_DONE`.
//!
//! Layouts from `linux/netlink.h`, `linux/rtnetlink.h` and `linux/if_addr.h`; all integers
//! are in host byte order (netlink(7)), IPv4 addresses in network byte order (`__be32`,
//! as `ip(7)`). Parsing is bounds-checked and never panics on malformed input.
//!
//! A netlink socket belongs to the network namespace of the thread that created it, so a
//! thread that `setns(2)`-ed into a namespace sees that namespace's interfaces.

use std::io;
use std::net::Ipv4Addr;
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
/// `struct ifaddrmsg` (`linux/if_addr.h`): family u8, prefixlen u8, flags u8, scope u8,
/// index u32.
const IFADDRMSG_LEN: usize = 8;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_MULTI`: part of a multi-part answer ended by `NLMSG_DONE`.
#[cfg(test)]
const NLM_F_MULTI: u16 = 0x2;
const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_DUMP_INTR`: the dump was inconsistent (the set changed while it ran); redo it.
const NLM_F_DUMP_INTR: u16 = 0x10;
/// `NLM_F_DUMP` = `NLM_F_ROOT | NLM_F_MATCH`: every object, not one.
const NLM_F_DUMP: u16 = 0x100 | 0x200;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
/// `IFA_ADDRESS`: the prefix address; on a point-to-point link the peer's (`if_addr.h`).
const IFA_ADDRESS: u16 = 1;
/// `IFA_LOCAL`: the interface's own address, when it differs from `IFA_ADDRESS`.
const IFA_LOCAL: u16 = 2;
/// `AF_INET` (`linux/socket.h`).
pub(crate) const AF_INET: u8 = 2;
/// `AF_UNSPEC`: the family of the generic link messages (`AF_BRIDGE` ones describe a
/// bridge port, and a port leaving its bridge is an `AF_BRIDGE` `RTM_DELLINK`).
pub(crate) const AF_UNSPEC: u8 = 0;
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
/// `RTMGRP_IPV4_IFADDR`: the multicast group of IPv4 address notifications.
pub(crate) const RTMGRP_IPV4_IFADDR: u32 = 0x10;

/// How long a request (a whole dump) waits for the kernel's answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How many times a dump is redone when the kernel marks it `NLM_F_DUMP_INTR`.
const DUMP_ATTEMPTS: usize = 5;

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// The parts of an `RTM_NEWLINK` / `RTM_DELLINK` message that a link cares about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkMsg {
    /// `ifi_family`: [`AF_UNSPEC`] for the interface itself.
    pub family: u8,
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

/// The parts of an `RTM_NEWADDR` / `RTM_DELADDR` message (`struct ifaddrmsg` and its
/// attributes, `linux/if_addr.h`) that an interface's address list needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddrMsg {
    /// `ifa_family`: [`AF_INET`] for the addresses decoded here.
    pub family: u8,
    /// `ifa_prefixlen`: the prefix length in bits.
    pub prefix_len: u8,
    /// `ifa_index`: the interface index.
    pub index: u32,
    /// `IFA_ADDRESS`, if present and the family is `AF_INET`.
    pub address: Option<Ipv4Addr>,
    /// `IFA_LOCAL`, if present and the family is `AF_INET`.
    pub local: Option<Ipv4Addr>,
}

impl AddrMsg {
    /// The interface's own IPv4 address: `IFA_LOCAL`, else `IFA_ADDRESS` (`if_addr.h`:
    /// on a broadcast interface both are the local address; on a point-to-point one
    /// `IFA_ADDRESS` is the peer's and `IFA_LOCAL` ours). `None` for other families.
    pub(crate) fn local_addr(&self) -> Option<Ipv4Addr> {
        self.local.or(self.address)
    }
}

/// One parsed netlink message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RtnlBody {
    NewLink(LinkMsg),
    DelLink(LinkMsg),
    NewAddr(AddrMsg),
    DelAddr(AddrMsg),
    /// `NLMSG_ERROR`: `errno` is 0 for an ACK, else a negative errno.
    Error(i32),
    /// `NLMSG_DONE`: the end of a dump, with the dump's result (0, or a negative errno;
    /// 0 if the message carries none).
    Done(i32),
    Overrun,
    Other(u16),
}

/// A netlink message: its sequence number, `nlmsg_flags` and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RtnlMsg {
    pub seq: u32,
    pub flags: u16,
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
        let flags = u16_at(buf, off + 6).ok_or(Malformed("header"))?;
        let seq = u32_at(buf, off + 8).ok_or(Malformed("header"))?;
        let payload = &buf[off + NLMSG_HDR_LEN..off + len];
        let body = match ty {
            RTM_NEWLINK => RtnlBody::NewLink(parse_ifinfo(payload)?),
            RTM_DELLINK => RtnlBody::DelLink(parse_ifinfo(payload)?),
            RTM_NEWADDR => RtnlBody::NewAddr(parse_ifaddr(payload)?),
            RTM_DELADDR => RtnlBody::DelAddr(parse_ifaddr(payload)?),
            NLMSG_ERROR => {
                RtnlBody::Error(u32_at(payload, 0).ok_or(Malformed("short NLMSG_ERROR"))? as i32)
            }
            NLMSG_DONE => RtnlBody::Done(u32_at(payload, 0).map_or(0, |e| e as i32)),
            NLMSG_OVERRUN => RtnlBody::Overrun,
            other => RtnlBody::Other(other),
        };
        out.push(RtnlMsg { seq, flags, body });
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
        family: p[0],
        index: u32_at(p, 4).ok_or(short)?,
        flags: u32_at(p, 8).ok_or(short)?,
        mtu: None,
        name: None,
    };
    for_each_attr(&p[IFINFOMSG_LEN..], |aty, data| {
        match aty {
            IFLA_MTU => msg.mtu = u32_at(data, 0),
            IFLA_IFNAME => {
                let end = data.iter().position(|&c| c == 0).unwrap_or(data.len());
                msg.name = Some(String::from_utf8_lossy(&data[..end]).into_owned());
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(msg)
}

/// `struct ifaddrmsg` and its `IFA_ADDRESS` / `IFA_LOCAL` attributes (`linux/if_addr.h`).
/// For `AF_INET` an address attribute must be 4 bytes; other families' addresses are not
/// decoded.
fn parse_ifaddr(p: &[u8]) -> Result<AddrMsg, Malformed> {
    if p.len() < IFADDRMSG_LEN {
        return Err(Malformed("short ifaddrmsg"));
    }
    let mut msg = AddrMsg {
        family: p[0],
        prefix_len: p[1],
        index: u32_at(p, 4).ok_or(Malformed("short ifaddrmsg"))?,
        address: None,
        local: None,
    };
    let inet = msg.family == AF_INET;
    for_each_attr(&p[IFADDRMSG_LEN..], |aty, data| {
        let slot = match aty {
            IFA_ADDRESS if inet => &mut msg.address,
            IFA_LOCAL if inet => &mut msg.local,
            _ => return Ok(()),
        };
        let octets: [u8; 4] = data
            .try_into()
            .map_err(|_| Malformed("IPv4 address attribute not 4 bytes"))?;
        *slot = Some(Ipv4Addr::from(octets));
        Ok(())
    })?;
    Ok(msg)
}

/// Calls `f(type, data)` for each `struct rtattr` (len u16, type u16, data, padded to 4)
/// in `p`, the type without the nested / byte-order flags. A tail under 4 bytes is ignored.
fn for_each_attr(
    p: &[u8],
    mut f: impl FnMut(u16, &[u8]) -> Result<(), Malformed>,
) -> Result<(), Malformed> {
    let mut off = 0;
    while p.len() - off >= 4 {
        let alen = u16_at(p, off).ok_or(Malformed("attr"))? as usize;
        let aty = u16_at(p, off + 2).ok_or(Malformed("attr"))? & NLA_TYPE_MASK;
        if alen < 4 || alen > p.len() - off {
            return Err(Malformed("rta_len out of range"));
        }
        f(aty, &p[off + 4..off + alen])?;
        off = (off + align4(alen)).min(p.len());
    }
    Ok(())
}

fn header(out: &mut Vec<u8>, ty: u16, flags: u16, seq: u32) {
    out.extend_from_slice(&0u32.to_ne_bytes()); // length, patched by `finish`
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes()); // pid: 0 = to the kernel
}

/// `struct ifaddrmsg` of `family`, the rest zero (a dump request's filter).
fn ifaddr(out: &mut Vec<u8>, family: u8) {
    out.extend_from_slice(&[family, 0, 0, 0]); // family, prefixlen, flags, scope
    out.extend_from_slice(&0u32.to_ne_bytes()); // index
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

/// `RTM_GETLINK` with `NLM_F_DUMP`: every interface of the namespace (`AF_UNSPEC`).
pub(crate) fn dump_links_request(seq: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(32);
    header(&mut m, RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq);
    ifinfo(&mut m, 0, 0, 0);
    finish(m)
}

/// `RTM_GETADDR` with `NLM_F_DUMP` for `AF_INET`: every IPv4 address of the namespace.
pub(crate) fn dump_addrs_v4_request(seq: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(24);
    header(&mut m, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, seq);
    ifaddr(&mut m, AF_INET);
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
    /// sequence number, up to and including the first one for which `last` holds (across
    /// as many datagrams as the answer takes). Other messages are discarded, so this is for
    /// sockets without multicast groups.
    fn request(
        &mut self,
        msg: &[u8],
        seq: u32,
        last: fn(&RtnlBody) -> bool,
    ) -> io::Result<Vec<RtnlMsg>> {
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
                    let done = last(&m.body);
                    answers.push(m);
                    if done {
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
        let last = |b: &RtnlBody| matches!(b, RtnlBody::NewLink(_) | RtnlBody::Error(_));
        let answers = self.request(&get_link_request(seq, index), seq, last)?;
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
        let last = |b: &RtnlBody| matches!(b, RtnlBody::Error(_));
        let answers = self.request(&set_link_request(seq, index, up, mtu), seq, last)?;
        match answers.last().map(|a| &a.body) {
            Some(RtnlBody::Error(0)) => Ok(()),
            Some(RtnlBody::Error(e)) => Err(io::Error::from_raw_os_error(-e)),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "RTM_SETLINK answered without an ACK",
            )),
        }
    }

    /// Runs the dump `build(seq)` asks for and returns the bodies of its multi-part answer
    /// (without the final `NLMSG_DONE`). A dump the kernel marks `NLM_F_DUMP_INTR` (the set
    /// changed while it ran) is redone, up to 5 times in all.
    ///
    /// Errors: the kernel's errno (`NLMSG_ERROR`, or a negative `NLMSG_DONE` result),
    /// `Interrupted` if every attempt was inconsistent, `TimedOut` after 2 s without the
    /// end of the answer, socket errors.
    fn dump(&mut self, build: fn(u32) -> Vec<u8>) -> io::Result<Vec<RtnlBody>> {
        let last = |b: &RtnlBody| matches!(b, RtnlBody::Done(_) | RtnlBody::Error(_));
        for _ in 0..DUMP_ATTEMPTS {
            let seq = self.next_seq();
            let answers = self.request(&build(seq), seq, last)?;
            if answers.iter().any(|a| a.flags & NLM_F_DUMP_INTR != 0) {
                continue;
            }
            let mut bodies: Vec<RtnlBody> = answers.into_iter().map(|a| a.body).collect();
            return match bodies.pop() {
                Some(RtnlBody::Done(e) | RtnlBody::Error(e)) if e < 0 => {
                    Err(io::Error::from_raw_os_error(-e))
                }
                _ => Ok(bodies),
            };
        }
        Err(io::Error::new(
            io::ErrorKind::Interrupted,
            "rtnetlink dump inconsistent 5 times in a row (NLM_F_DUMP_INTR)",
        ))
    }

    /// Every interface of the socket's namespace (`RTM_GETLINK` dump), in the kernel's
    /// order (by index).
    ///
    /// Errors: as [`RtnlSocket::dump`].
    pub(crate) fn dump_links(&mut self) -> io::Result<Vec<LinkMsg>> {
        let bodies = self.dump(dump_links_request)?;
        Ok(bodies
            .into_iter()
            .filter_map(|b| match b {
                RtnlBody::NewLink(l) => Some(l),
                _ => None,
            })
            .collect())
    }

    /// Every IPv4 address of the socket's namespace (`RTM_GETADDR` dump for `AF_INET`),
    /// in the kernel's order (by interface, primary addresses first).
    ///
    /// Errors: as [`RtnlSocket::dump`].
    pub(crate) fn dump_addrs_v4(&mut self) -> io::Result<Vec<AddrMsg>> {
        let bodies = self.dump(dump_addrs_v4_request)?;
        Ok(bodies
            .into_iter()
            .filter_map(|b| match b {
                RtnlBody::NewAddr(a) if a.family == AF_INET => Some(a),
                _ => None,
            })
            .collect())
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
        nlmsg_flags(ty, 0, seq, payload)
    }

    fn nlmsg_flags(ty: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        header(&mut m, ty, flags, seq);
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
            family: AF_UNSPEC,
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
                flags: 0,
                body: RtnlBody::Error(-19)
            }
        );
        assert_eq!(msgs[3].body, RtnlBody::Done(0));
        assert_eq!(msgs[4].body, RtnlBody::Other(24));
        assert_eq!(msgs.len(), 5);
    }

    #[test]
    fn state_from_flags() {
        let l = |flags| {
            LinkMsg {
                family: AF_UNSPEC,
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

    /// `RTM_NEWADDR` for 10.1.2.3/24 on index 7, byte by byte as `linux/netlink.h` and
    /// `linux/if_addr.h` lay it out (what `ip addr add 10.1.2.3/24 dev eth7` notifies).
    fn newaddr_10_1_2_3() -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&52u32.to_ne_bytes()); // nlmsg_len: 16 + 8 + 8 + 8 + 12
        m.extend_from_slice(&20u16.to_ne_bytes()); // nlmsg_type: RTM_NEWADDR
        m.extend_from_slice(&0u16.to_ne_bytes()); // nlmsg_flags
        m.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_seq
        m.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid
        m.extend_from_slice(&[2, 24, 0x80, 0]); // AF_INET, /24, IFA_F_PERMANENT, RT_SCOPE_UNIVERSE
        m.extend_from_slice(&7u32.to_ne_bytes()); // ifa_index
        m.extend_from_slice(&8u16.to_ne_bytes()); // rta_len
        m.extend_from_slice(&1u16.to_ne_bytes()); // IFA_ADDRESS
        m.extend_from_slice(&[10, 1, 2, 3]); // network byte order
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&2u16.to_ne_bytes()); // IFA_LOCAL
        m.extend_from_slice(&[10, 1, 2, 3]);
        m.extend_from_slice(&9u16.to_ne_bytes());
        m.extend_from_slice(&3u16.to_ne_bytes()); // IFA_LABEL
        m.extend_from_slice(b"eth7\0\0\0\0"); // 5 bytes and 3 of padding
        assert_eq!(m.len(), 52);
        m
    }

    const ADDR_10_1_2_3: AddrMsg = AddrMsg {
        family: AF_INET,
        prefix_len: 24,
        index: 7,
        address: Some(Ipv4Addr::new(10, 1, 2, 3)),
        local: Some(Ipv4Addr::new(10, 1, 2, 3)),
    };

    #[test]
    fn parses_newaddr_golden_bytes() {
        let msgs = parse(&newaddr_10_1_2_3()).unwrap();
        assert_eq!(
            msgs,
            vec![RtnlMsg {
                seq: 0,
                flags: 0,
                body: RtnlBody::NewAddr(ADDR_10_1_2_3)
            }]
        );
        assert_eq!(ADDR_10_1_2_3.local_addr(), Some(Ipv4Addr::new(10, 1, 2, 3)));
        // RTM_DELADDR: the same layout.
        let mut del = newaddr_10_1_2_3();
        del[4..6].copy_from_slice(&RTM_DELADDR.to_ne_bytes());
        assert_eq!(
            parse(&del).unwrap()[0].body,
            RtnlBody::DelAddr(ADDR_10_1_2_3)
        );
    }

    #[test]
    fn local_addr_prefers_ifa_local() {
        // Point-to-point: IFA_ADDRESS is the peer, IFA_LOCAL ours.
        let mut p = Vec::new();
        ifaddr(&mut p, AF_INET);
        p[1] = 32;
        p.extend(attr(IFA_ADDRESS, &[10, 0, 0, 2]));
        p.extend(attr(IFA_LOCAL, &[10, 0, 0, 1]));
        let RtnlBody::NewAddr(a) = parse(&nlmsg(RTM_NEWADDR, 0, &p)).unwrap()[0].body.clone()
        else {
            panic!("not an address message");
        };
        assert_eq!(a.address, Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(a.local_addr(), Some(Ipv4Addr::new(10, 0, 0, 1)));
        // Only IFA_ADDRESS: that one.
        let mut p = Vec::new();
        ifaddr(&mut p, AF_INET);
        p.extend(attr(IFA_ADDRESS, &[192, 0, 2, 1]));
        let msgs = parse(&nlmsg(RTM_NEWADDR, 0, &p)).unwrap();
        let RtnlBody::NewAddr(a) = &msgs[0].body else {
            panic!("not an address message");
        };
        assert_eq!(a.local_addr(), Some(Ipv4Addr::new(192, 0, 2, 1)));
        // AF_INET6: 16-byte addresses are not decoded and not an error.
        let mut p = Vec::new();
        ifaddr(&mut p, 10);
        p.extend(attr(IFA_ADDRESS, &[0xfe; 16]));
        let msgs = parse(&nlmsg(RTM_NEWADDR, 0, &p)).unwrap();
        let RtnlBody::NewAddr(a) = &msgs[0].body else {
            panic!("not an address message");
        };
        assert_eq!((a.family, a.local_addr()), (10, None));
    }

    #[test]
    fn dump_request_bytes() {
        let m = dump_addrs_v4_request(5);
        let mut want = Vec::new();
        want.extend_from_slice(&24u32.to_ne_bytes());
        want.extend_from_slice(&22u16.to_ne_bytes()); // RTM_GETADDR
        want.extend_from_slice(&0x301u16.to_ne_bytes()); // NLM_F_REQUEST | NLM_F_DUMP
        want.extend_from_slice(&5u32.to_ne_bytes());
        want.extend_from_slice(&0u32.to_ne_bytes());
        want.extend_from_slice(&[2, 0, 0, 0]); // AF_INET
        want.extend_from_slice(&0u32.to_ne_bytes());
        assert_eq!(m, want);
        let m = dump_links_request(6);
        assert_eq!(m.len(), 32);
        assert_eq!(u16_at(&m, 4), Some(18)); // RTM_GETLINK
        assert_eq!(u16_at(&m, 6), Some(0x301));
        assert_eq!(u32_at(&m, 8), Some(6));
        assert_eq!(&m[16..], &[0u8; 16]); // AF_UNSPEC, every index
    }

    #[test]
    fn parses_multi_part_dump() {
        let multi = NLM_F_MULTI;
        let mut buf = nlmsg_flags(RTM_NEWLINK, multi, 3, &newlink_payload(7, IFF_UP));
        let mut addr = newaddr_10_1_2_3();
        addr[6..8].copy_from_slice(&multi.to_ne_bytes());
        addr[8..12].copy_from_slice(&3u32.to_ne_bytes());
        buf.extend(&addr);
        buf.extend(nlmsg_flags(
            RTM_NEWADDR,
            multi | NLM_F_DUMP_INTR,
            3,
            &addr[NLMSG_HDR_LEN..],
        ));
        buf.extend(nlmsg_flags(NLMSG_DONE, multi, 3, &(-4i32).to_ne_bytes()));
        buf.extend(nlmsg_flags(NLMSG_DONE, multi, 4, &[]));
        let msgs = parse(&buf).unwrap();
        let bodies: Vec<_> = msgs
            .iter()
            .map(|m| (m.seq, m.flags, m.body.clone()))
            .collect();
        assert_eq!(
            bodies,
            vec![
                (
                    3,
                    multi,
                    RtnlBody::NewLink(LinkMsg {
                        family: AF_UNSPEC,
                        index: 7,
                        flags: IFF_UP,
                        mtu: Some(9000),
                        name: Some("tapA".into()),
                    })
                ),
                (3, multi, RtnlBody::NewAddr(ADDR_10_1_2_3)),
                (3, multi | NLM_F_DUMP_INTR, RtnlBody::NewAddr(ADDR_10_1_2_3)),
                (3, multi, RtnlBody::Done(-4)),
                (4, multi, RtnlBody::Done(0)),
            ]
        );
    }

    #[test]
    fn malformed_addr_never_panics() {
        let good = newaddr_10_1_2_3();
        // A truncated datagram: under one header it is nothing, from there on the length
        // field points past the end.
        for cut in 0..good.len() {
            let r = parse(&good[..cut]);
            if cut < NLMSG_HDR_LEN {
                assert_eq!(r, Ok(vec![]), "cut {cut}");
            } else {
                assert_eq!(r, Err(Malformed("nlmsg_len out of range")), "cut {cut}");
            }
        }
        // A message (and datagram) whose length cuts its body short: the ifaddrmsg or an
        // attribute. Payload offsets: ifaddrmsg 0..8, IFA_ADDRESS 8..16, IFA_LOCAL 16..24,
        // IFA_LABEL 24..33 (rta_len 9).
        for len in NLMSG_HDR_LEN..good.len() {
            let mut b = good[..len].to_vec();
            b[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
            let r = parse(&b);
            match len - NLMSG_HDR_LEN {
                0..=7 => assert_eq!(r, Err(Malformed("short ifaddrmsg")), "len {len}"),
                // Whole attributes (and a tail under 4 bytes, ignored) parse.
                8..=11 | 16..=19 | 24..=27 | 33..=35 => assert!(r.is_ok(), "len {len}: {r:?}"),
                _ => assert_eq!(r, Err(Malformed("rta_len out of range")), "len {len}"),
            }
        }
        // Every single-byte corruption parses or errors, no panic.
        for i in 0..good.len() {
            for x in [0x01u8, 0x04, 0x80, 0xff] {
                let mut b = good.clone();
                b[i] ^= x;
                let _ = parse(&b);
            }
        }
        // An AF_INET address attribute of 3 or 5 bytes is an error.
        for n in [3, 5] {
            let mut p = Vec::new();
            ifaddr(&mut p, AF_INET);
            p.extend(attr(IFA_LOCAL, &[10, 1, 2, 3, 4][..n]));
            assert_eq!(
                parse(&nlmsg(RTM_DELADDR, 0, &p)),
                Err(Malformed("IPv4 address attribute not 4 bytes"))
            );
        }
        // A short NLMSG_DONE (no result) is a result of 0.
        assert_eq!(
            parse(&nlmsg(NLMSG_DONE, 1, &[])).unwrap()[0].body,
            RtnlBody::Done(0)
        );
    }
}
