//! Host network interfaces as the host-TCP transport sees them (design.md §4.1): each
//! interface's name, index, state, MTU and IPv4 addresses, read over rtnetlink
//! (rtnetlink(7)) and followed as they change; and the source address the kernel's route
//! to a destination uses.
//!
//! A host-TCP device is one interface, as a Linux siw device is one netdev (`rdma link add
//! siw0 type siw netdev eth0`): its addresses are the interface's IPv4 addresses, and the
//! interface going down or away ends the device (siw's `NETDEV_DOWN` /
//! `NETDEV_UNREGISTER`). [`interfaces`] / [`interface`] read the facts once;
//! [`NetdevWatch`] follows one interface through `RTM_NEWLINK` / `RTM_DELLINK` /
//! `RTM_NEWADDR` / `RTM_DELADDR` notifications (`RTNLGRP_LINK`, `RTNLGRP_IPV4_IFADDR`);
//! [`route_source`] is the first half of rdma_cm's address resolution (the device is then
//! the one whose interface holds that source address; `lo` holds 127.0.0.1/8).
//!
//! Nothing here needs privilege: dumps and multicast groups of `NETLINK_ROUTE` are open
//! to every user.
//!
//! # Network namespaces
//!
//! A netlink or UDP socket belongs to the network namespace of the thread that creates it
//! (`CLONE_NEWNET` / `setns(2)` move one thread), and keeps it for its life. So every
//! function here answers for the calling thread's namespace, and a [`NetdevWatch`] follows
//! the interface of the namespace its [`NetdevWatch::open`] ran in, whichever thread polls
//! it later.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};

pub use rdma_cm::Ipv4Subnet;

use crate::link::rtnl::{
    AddrMsg, LinkMsg, RtnlBody, RtnlSocket, AF_INET, AF_UNSPEC, IFF_RUNNING, IFF_UP,
    RTMGRP_IPV4_IFADDR, RTMGRP_LINK,
};

/// One network interface: what `ip -4 addr show` prints of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetdevInfo {
    /// The interface name (`IFLA_IFNAME`, at most 15 bytes).
    pub name: String,
    /// The interface index in its namespace (`ifi_index`; `lo` is 1).
    pub index: u32,
    /// Administratively up and operational: both `IFF_UP` and `IFF_RUNNING` (RFC 2863
    /// operstate UP or UNKNOWN, as the kernel's `dev_get_flags` reports it; `lo` and
    /// other carrier-less devices report `IFF_RUNNING` once up). A veth whose peer is
    /// down, or a NIC without carrier, is not up.
    pub up: bool,
    /// The IP MTU in bytes (`IFLA_MTU`; 0 if the kernel did not report one).
    pub mtu: u32,
    /// The interface's IPv4 addresses with their prefix lengths (`IFA_LOCAL`, else
    /// `IFA_ADDRESS`, and `ifa_prefixlen`), in the kernel's order (primary addresses
    /// first) for a fresh read; a [`NetdevWatch`] appends addresses as they are added.
    pub addrs: Vec<Ipv4Subnet>,
}

impl NetdevInfo {
    fn from_link(l: &LinkMsg) -> NetdevInfo {
        NetdevInfo {
            name: l.name.clone().unwrap_or_default(),
            index: l.index,
            up: is_up(l.flags),
            mtu: l.mtu.unwrap_or(0),
            addrs: Vec::new(),
        }
    }
}

/// `IFF_UP` and `IFF_RUNNING` both set.
fn is_up(flags: u32) -> bool {
    flags & (IFF_UP | IFF_RUNNING) == IFF_UP | IFF_RUNNING
}

/// The IPv4 address an address message is about, with its prefix length.
fn subnet(a: &AddrMsg) -> Option<Ipv4Subnet> {
    if a.family != AF_INET {
        return None;
    }
    a.local_addr().map(|ip| Ipv4Subnet::new(ip, a.prefix_len))
}

/// Every interface of `sock`'s namespace with its IPv4 addresses, sorted by index.
fn snapshot(sock: &mut RtnlSocket) -> io::Result<Vec<NetdevInfo>> {
    let mut infos: Vec<NetdevInfo> = sock
        .dump_links()?
        .iter()
        .filter(|l| l.family == AF_UNSPEC)
        .map(NetdevInfo::from_link)
        .collect();
    infos.sort_by_key(|i| i.index);
    // An interface created between the two dumps has no entry; its addresses are dropped
    // (a watch hears of them, and a later read sees both).
    for a in sock.dump_addrs_v4()? {
        let Some(s) = subnet(&a) else { continue };
        if let Ok(i) = infos.binary_search_by_key(&a.index, |i| i.index) {
            if !infos[i].addrs.contains(&s) {
                infos[i].addrs.push(s);
            }
        }
    }
    Ok(infos)
}

/// Every network interface of the calling thread's namespace with its state, MTU and IPv4
/// addresses, sorted by index: one `RTM_GETLINK` dump and one `RTM_GETADDR` dump for
/// `AF_INET`, joined by interface index. Needs no privilege.
///
/// Errors: the netlink socket cannot be opened (e.g. `EMFILE`), the kernel's errno for a
/// dump, `TimedOut` if a dump is not answered within 2 s, `Interrupted` if the interface
/// set changed during 5 dumps in a row (`NLM_F_DUMP_INTR`).
pub fn interfaces() -> io::Result<Vec<NetdevInfo>> {
    snapshot(&mut RtnlSocket::open(0)?)
}

/// The interface named `name` in the calling thread's namespace, or `None` if there is
/// none (names are compared exactly, as the kernel does).
///
/// Errors: as [`interfaces`].
pub fn interface(name: &str) -> io::Result<Option<NetdevInfo>> {
    Ok(interfaces()?.into_iter().find(|i| i.name == name))
}

/// UDP port the route lookup "connects" to: discard (RFC 863). Nothing is sent.
const DISCARD_PORT: u16 = 9;

/// The source address the kernel's route to `dst` uses in the calling thread's namespace,
/// as `ip route get DST` prints it after `src`: a UDP socket is `connect(2)`ed to
/// `dst`, port 9, which makes the kernel choose the route and the source address
/// (`ip4_datagram_connect`), and `getsockname(2)` reads it back. No datagram is sent.
/// rdma_cm resolves an address the same way (`rdma_resolve_addr`: route lookup, then the
/// device holding the source address). A local address is its own source; any address in
/// 127.0.0.0/8 gives 127.0.0.1 on a usual `lo`.
///
/// Errors: `ENETUNREACH` (no route), `EACCES` (`dst` is a broadcast address), or socket
/// errors, as [`io::Error`]s carrying the errno.
pub fn route_source(dst: Ipv4Addr) -> io::Result<Ipv4Addr> {
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    sock.connect((dst, DISCARD_PORT))?;
    match sock.local_addr()? {
        SocketAddr::V4(a) => Ok(*a.ip()),
        SocketAddr::V6(a) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("IPv4 socket bound to IPv6 address {a}"),
        )),
    }
}

/// A change of the watched interface, relative to [`NetdevWatch::current`] before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NetdevEvent {
    /// An IPv4 address was added (`RTM_NEWADDR`, e.g. `ip addr add`).
    AddressAdded(Ipv4Subnet),
    /// An IPv4 address was removed (`RTM_DELADDR`, e.g. `ip addr del`; the kernel also
    /// removes every address of an interface being deleted, before the interface).
    AddressRemoved(Ipv4Subnet),
    /// The interface became up: `IFF_UP` and `IFF_RUNNING` both set (see
    /// [`NetdevInfo::up`]).
    Up,
    /// The interface is no longer up: `IFF_UP` (`ip link set down`) or `IFF_RUNNING` (no
    /// carrier) cleared. IPv4 addresses stay while it is down.
    Down,
    /// The interface left the namespace: deleted (`ip link del`) or moved to another one
    /// (`RTM_DELLINK` of its index). Terminal: no event follows.
    Gone,
    /// The MTU changed to this many bytes (`ip link set mtu`).
    Mtu(u32),
}

/// Follows one interface, by index, through rtnetlink notifications, as siw follows its
/// netdev through the kernel's netdevice notifier.
///
/// It holds a non-blocking `NETLINK_ROUTE` socket subscribed to `RTMGRP_LINK |
/// RTMGRP_IPV4_IFADDR`, opened before the interface is read, so no change after the read
/// is missed; put [`NetdevWatch::fd`] in a poll or epoll set and call
/// [`NetdevWatch::poll`] when it is readable. A second, request-only socket of the same
/// namespace serves the re-reads, so the watch can be polled from any thread (see the
/// module docs on namespaces).
///
/// Events are changes relative to [`NetdevWatch::current`], which the watch keeps: a
/// notification that changes nothing (an address or state it already knows, or one of
/// another interface) makes no event. Notifications queued between the open and the read
/// may replay a transition the read already saw (a `Down` and `Up` pair); the state
/// after every `poll` is the kernel's as of the last notification read.
#[derive(Debug)]
pub struct NetdevWatch {
    notifications: RtnlSocket,
    requests: RtnlSocket,
    current: NetdevInfo,
    gone: bool,
    /// An error met after events were read, returned by the next `poll`.
    deferred: Option<io::Error>,
    /// How many times notifications were lost and the interface re-read.
    resyncs: u64,
}

/// Whether a receive error means notifications were lost: `ENOBUFS` (the socket's receive
/// buffer overflowed and the kernel dropped some) or a datagram that does not parse.
fn lost_notifications(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOBUFS) || e.kind() == io::ErrorKind::InvalidData
}

impl NetdevWatch {
    /// Starts following the interface `name` of the calling thread's namespace. Returns
    /// the watch and the interface as it was read (also [`NetdevWatch::current`]).
    ///
    /// Errors: `NotFound` if no interface is named `name`; else as [`interfaces`].
    pub fn open(name: &str) -> io::Result<(NetdevWatch, NetdevInfo)> {
        let notifications = RtnlSocket::open(RTMGRP_LINK | RTMGRP_IPV4_IFADDR)?;
        let mut requests = RtnlSocket::open(0)?;
        let current = snapshot(&mut requests)?
            .into_iter()
            .find(|i| i.name == name)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no network interface named {name:?}"),
                )
            })?;
        let watch = NetdevWatch {
            notifications,
            requests,
            current: current.clone(),
            gone: false,
            deferred: None,
            resyncs: 0,
        };
        Ok((watch, current))
    }

    /// The notification socket, readable when [`NetdevWatch::poll`] has something to read
    /// (level-triggered; also for notifications of other interfaces, which `poll`
    /// consumes and ignores).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.notifications.as_fd()
    }

    /// The interface as the watch last knew it. After [`NetdevEvent::Gone`], as it was
    /// before it went.
    pub fn current(&self) -> &NetdevInfo {
        &self.current
    }

    /// Reads every pending notification without blocking and returns the watched
    /// interface's changes, in the order they happened. After [`NetdevEvent::Gone`] it
    /// only drains the socket and returns no events.
    ///
    /// Lost notifications (`ENOBUFS`: the kernel dropped some because the socket's
    /// buffer was full; or a datagram that does not parse) are recovered by discarding
    /// what is queued, re-reading the interface and reporting the differences from
    /// [`NetdevWatch::current`] (addresses removed, then added, then MTU, then `Up` /
    /// `Down`; `Gone` if the index is no longer there).
    ///
    /// Errors: a socket error other than `EAGAIN` / `EINTR` / `ENOBUFS`, or a failed
    /// re-read (as [`interfaces`]). An error met after some events were read is returned
    /// by the next call, and these events now.
    pub fn poll(&mut self) -> io::Result<Vec<NetdevEvent>> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        let mut events = Vec::new();
        loop {
            let res = match self.notifications.recv() {
                Ok(Some(msgs)) => {
                    for m in msgs {
                        self.apply(m.body, &mut events);
                    }
                    continue;
                }
                Ok(None) => return Ok(events),
                Err(e) if lost_notifications(&e) => self.resync(&mut events),
                Err(e) => Err(e),
            };
            if let Err(e) = res {
                if events.is_empty() {
                    return Err(e);
                }
                self.deferred = Some(e);
                return Ok(events);
            }
        }
    }

    /// Applies one notification.
    fn apply(&mut self, body: RtnlBody, events: &mut Vec<NetdevEvent>) {
        if self.gone {
            return;
        }
        let index = self.current.index;
        let mut next = self.current.clone();
        match body {
            // AF_BRIDGE link messages describe a bridge port, not the interface.
            RtnlBody::NewLink(l) if l.index == index && l.family == AF_UNSPEC => {
                next.up = is_up(l.flags);
                next.mtu = l.mtu.unwrap_or(next.mtu);
                next.name = l.name.unwrap_or(next.name);
            }
            RtnlBody::DelLink(l) if l.index == index && l.family == AF_UNSPEC => {
                self.gone = true;
                events.push(NetdevEvent::Gone);
                return;
            }
            RtnlBody::NewAddr(a) if a.index == index => match subnet(&a) {
                Some(s) if !next.addrs.contains(&s) => next.addrs.push(s),
                _ => return,
            },
            RtnlBody::DelAddr(a) if a.index == index => match subnet(&a) {
                Some(s) => next.addrs.retain(|&x| x != s),
                None => return,
            },
            _ => return,
        }
        self.update(next, events);
    }

    /// Makes `next` current, reporting what differs.
    fn update(&mut self, next: NetdevInfo, events: &mut Vec<NetdevEvent>) {
        let old = &self.current;
        events.extend(
            old.addrs
                .iter()
                .filter(|a| !next.addrs.contains(a))
                .map(|&a| NetdevEvent::AddressRemoved(a)),
        );
        events.extend(
            next.addrs
                .iter()
                .filter(|a| !old.addrs.contains(a))
                .map(|&a| NetdevEvent::AddressAdded(a)),
        );
        if next.mtu != old.mtu {
            events.push(NetdevEvent::Mtu(next.mtu));
        }
        if next.up != old.up {
            events.push(if next.up {
                NetdevEvent::Up
            } else {
                NetdevEvent::Down
            });
        }
        self.current = next;
    }

    /// Recovers from lost notifications: discards what is queued (older than the re-read,
    /// and what followed it may be what was lost, so replaying it could leave a stale
    /// state), re-reads the interface and reports the differences. Notifications arriving
    /// after the discard are kept and applied afterwards: they are at least as new as the
    /// re-read.
    fn resync(&mut self, events: &mut Vec<NetdevEvent>) -> io::Result<()> {
        self.resyncs += 1;
        loop {
            match self.notifications.recv() {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) if lost_notifications(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if self.gone {
            return Ok(());
        }
        let index = self.current.index;
        match snapshot(&mut self.requests)?
            .into_iter()
            .find(|i| i.index == index)
        {
            Some(now) => self.update(now, events),
            None => {
                self.gone = true;
                events.push(NetdevEvent::Gone);
            }
        }
        Ok(())
    }
}

impl AsFd for NetdevWatch {
    /// As [`NetdevWatch::fd`].
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use netlab::netns::{is_root, unique_tag, NetNs};
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

    const LO: Ipv4Subnet = Ipv4Subnet::new(Ipv4Addr::new(127, 0, 0, 1), 8);

    /// What `/sys/class/net/NAME/FILE` holds, as a number (`None` if the interface is gone
    /// or sysfs shows another namespace's).
    fn sysfs(name: &str, file: &str) -> Option<u32> {
        std::fs::read_to_string(format!("/sys/class/net/{name}/{file}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    #[test]
    fn interfaces_lists_lo_up_with_its_address() {
        let all = interfaces().unwrap();
        let lo = all.iter().find(|i| i.name == "lo").expect("no lo");
        assert_eq!(lo.index, 1, "LOOPBACK_IFINDEX");
        assert!(lo.up, "lo is down: {lo:?}");
        assert!(lo.addrs.contains(&LO), "{lo:?}");
        assert_eq!(Some(lo.mtu), sysfs("lo", "mtu"));
        let indexes: Vec<u32> = all.iter().map(|i| i.index).collect();
        let mut sorted = indexes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(indexes, sorted, "not sorted by index, or an index twice");
        for i in &all {
            // The kernel's own view, where sysfs shows this namespace.
            if let Some(index) = sysfs(&i.name, "ifindex") {
                assert_eq!(index, i.index, "{i:?}");
                assert_eq!(sysfs(&i.name, "mtu"), Some(i.mtu), "{i:?}");
            }
        }
    }

    #[test]
    fn interface_by_name() {
        let lo = interface("lo").unwrap().expect("no lo");
        assert_eq!((lo.name.as_str(), lo.index), ("lo", 1));
        assert!(lo.addrs.contains(&LO));
        assert_eq!(interface("no-such-if0").unwrap(), None);
    }

    #[test]
    fn route_source_of_local_addresses() {
        assert_eq!(
            route_source(Ipv4Addr::LOCALHOST).unwrap(),
            Ipv4Addr::LOCALHOST
        );
        assert_eq!(
            route_source(Ipv4Addr::new(127, 1, 2, 3)).unwrap(),
            Ipv4Addr::LOCALHOST
        );
        // Every local address routes through the local table with itself as source.
        for i in interfaces().unwrap() {
            for a in &i.addrs {
                assert_eq!(route_source(a.addr).unwrap(), a.addr, "{i:?}");
            }
        }
    }

    #[test]
    fn watch_lo_is_quiet() {
        let (mut w, info) = NetdevWatch::open("lo").unwrap();
        assert_eq!((info.name.as_str(), info.index, info.up), ("lo", 1, true));
        assert!(info.addrs.contains(&LO));
        assert_eq!(w.current(), &info);
        assert_eq!(w.poll().unwrap(), vec![]);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(w.poll().unwrap(), vec![]);
        assert_eq!(w.current(), &info);
        assert_eq!(w.resyncs, 0);
        fn send<T: Send>(_: &T) {}
        send(&w);
    }

    #[test]
    fn watch_missing_interface_is_not_found() {
        let err = NetdevWatch::open("no-such-if0").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("no-such-if0"), "{err}");
    }

    /// Polls `w` until `done(events so far, current)` holds; fails after 5 s.
    fn events_until(
        w: &mut NetdevWatch,
        done: impl Fn(&[NetdevEvent], &NetdevInfo) -> bool,
    ) -> Vec<NetdevEvent> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = Vec::new();
        loop {
            seen.extend(w.poll().expect("poll"));
            if done(&seen, w.current()) {
                return seen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out; events {seen:?}, current {:?}",
                w.current()
            );
            let mut fds = [PollFd::new(w.fd(), PollFlags::POLLIN)];
            poll(&mut fds, PollTimeout::from(100u16)).expect("poll(2)");
        }
    }

    /// Polls `w` until it has reported as many events as `want` holds, then checks they
    /// are `want`.
    fn expect_events(w: &mut NetdevWatch, want: &[NetdevEvent]) {
        let got = events_until(w, |e, _| e.len() >= want.len());
        assert_eq!(got, want);
    }

    /// Checks that `got` is `event(s)` for each of `subnets`, each once, in any order.
    fn assert_each_once(
        mut got: Vec<NetdevEvent>,
        subnets: &[Ipv4Subnet],
        event: fn(Ipv4Subnet) -> NetdevEvent,
    ) {
        let mut want: Vec<_> = subnets.iter().map(|&s| event(s)).collect();
        got.sort_by_key(|e| format!("{e:?}"));
        want.sort_by_key(|e| format!("{e:?}"));
        assert_eq!(got, want);
    }

    /// Runs `ip -n NS -batch -` with `commands` on its stdin (one change after another,
    /// faster than a notification socket is read).
    fn ip_batch(ns: &NetNs, commands: &str) {
        let mut child = Command::new("ip")
            .args(["-n", ns.name(), "-batch", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("ip");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(commands.as_bytes()).expect("write");
        drop(stdin);
        assert!(child.wait().expect("wait").success(), "ip -batch failed");
    }

    /// Runs `f` on a thread in `ns`.
    fn in_ns<T: Send + 'static>(ns: &NetNs, f: impl FnOnce() -> T + Send + 'static) -> T {
        ns.spawn(f).join().expect("thread").expect("setns")
    }

    /// In a namespace of its own (removed by `NetNs`'s `Drop`, with every interface in
    /// it, whatever the test's outcome): a veth pair, changed with `ip`, followed by a
    /// watch opened in the namespace and polled from the test thread.
    #[test]
    fn watch_follows_veth_in_own_namespace() {
        if !is_root() {
            eprintln!("skipped: needs root (creates a network namespace and a veth pair)");
            return;
        }
        let ns = NetNs::create(&format!("swns{}", unique_tag())).expect("netns");
        let ip = |args: &[&str]| ns.ip(args).unwrap_or_else(|e| panic!("{e}"));
        ip(&["link", "add", "nd0", "type", "veth", "peer", "name", "nd1"]);

        let (mut w, info) = in_ns(&ns, || NetdevWatch::open("nd0")).expect("open");
        assert_eq!(
            (info.name.as_str(), info.up, info.mtu),
            ("nd0", false, 1500)
        );
        assert_eq!(info.addrs, vec![]);
        assert_eq!(
            in_ns(&ns, || route_source(Ipv4Addr::new(10, 9, 9, 7)))
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ENETUNREACH)
        );

        // Up without carrier (the peer is down) is not up.
        ip(&["link", "set", "nd0", "up"]);
        ip(&["link", "show", "dev", "nd0"]); // runs the pending linkwatch work
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(w.poll().unwrap(), vec![]);
        assert!(!w.current().up);
        ip(&["link", "set", "nd1", "up"]);
        expect_events(&mut w, &[NetdevEvent::Up]);

        let a = Ipv4Subnet::new(Ipv4Addr::new(10, 9, 9, 1), 24);
        ip(&["addr", "add", "10.9.9.1/24", "dev", "nd0"]);
        expect_events(&mut w, &[NetdevEvent::AddressAdded(a)]);
        assert_eq!(w.current().addrs, vec![a]);
        assert_eq!(
            in_ns(&ns, || route_source(Ipv4Addr::new(10, 9, 9, 7))).unwrap(),
            Ipv4Addr::new(10, 9, 9, 1)
        );

        ip(&["link", "set", "nd0", "mtu", "1400"]);
        expect_events(&mut w, &[NetdevEvent::Mtu(1400)]);
        ip(&["addr", "del", "10.9.9.1/24", "dev", "nd0"]);
        expect_events(&mut w, &[NetdevEvent::AddressRemoved(a)]);
        ip(&["link", "set", "nd0", "down"]);
        expect_events(&mut w, &[NetdevEvent::Down]);
        assert_eq!(
            w.current(),
            &NetdevInfo {
                mtu: 1400,
                ..info.clone()
            }
        );

        // Lost notifications: with the smallest receive buffer the kernel drops most of
        // 64 quick additions (ENOBUFS); the re-read reports each address exactly once.
        nix::sys::socket::setsockopt(&w.fd(), nix::sys::socket::sockopt::RcvBuf, &1)
            .expect("SO_RCVBUF");
        let subnets: Vec<Ipv4Subnet> = (1..=64)
            .map(|n| Ipv4Subnet::new(Ipv4Addr::new(10, 9, 8, n), 32))
            .collect();
        let adds: String = subnets
            .iter()
            .map(|s| format!("addr add {s} dev nd0\n"))
            .collect();
        ip_batch(&ns, &adds);
        let got = events_until(&mut w, |_, cur| cur.addrs.len() == 64);
        assert!(
            w.resyncs >= 1,
            "no ENOBUFS: the test did not lose notifications"
        );
        let resyncs = w.resyncs;
        assert_each_once(got, &subnets, NetdevEvent::AddressAdded);
        ip(&["addr", "flush", "dev", "nd0"]);
        let got = events_until(&mut w, |_, cur| cur.addrs.is_empty());
        assert!(w.resyncs > resyncs, "no ENOBUFS on the flush");
        assert_each_once(got, &subnets, NetdevEvent::AddressRemoved);

        ip(&["link", "del", "nd0"]);
        expect_events(&mut w, &[NetdevEvent::Gone]);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(w.poll().unwrap(), vec![]);
        assert_eq!(w.current().index, info.index);
    }
}
