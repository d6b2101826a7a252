//! [`HostStack`]: the transport of a device bound to a host interface, over kernel TCP.
//!
//! The same MPA connections ([`Conn`]: MPA, the upper, closing, Terminates) as the
//! smoltcp [`Stack`](crate::transport::Stack), each over a [`KernelSock`] instead of a
//! smoltcp socket; the listeners' backlog and half-open pool are the same
//! ([`crate::transport::Listener`]), counted over kernel listening sockets.
//!
//! **Readiness.** One epoll set per device holds every connection's socket
//! (edge-triggered), every listening socket and the interface watch
//! ([`NetdevWatch`]). A [`poll_rounds`](LlpStack::poll_rounds) takes what epoll has
//! ready without waiting, reads only the sockets the kernel reported readable, services
//! every connection in rounds as the smoltcp stack does, and writes each connection's
//! framed FPDUs to the kernel once per round. The driver sleeps on the epoll fd
//! ([`LlpStack::poll_fd`]), which is readable while any member is ready.
//!
//! **Addresses.** The device's addresses are the interface's IPv4 addresses, followed
//! through rtnetlink. A listener on port P listens on every one of them (a kernel
//! listening socket per address, added and closed as addresses come and go), so two
//! devices of one process (`lo` and `eth0`) can both listen on P, and a connection
//! reaches the device that owns the address it was made to, as the kernel's rdma_cm
//! binds a listener to its device's addresses. Outgoing connections take the source
//! address the kernel's route gives; their ports are the kernel's ephemeral ports.
//!
//! **Removal.** The interface deleted (or moved out of the namespace) ends the device:
//! every connection fails with [`ConnError::DeviceGone`], every listener closes, as a
//! TAP's deletion does; down and up are reported as link events
//! ([`StackEvent::Link`]), on which the RDMA CM removes the device (its
//! `remove_on_link_down` setting).

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use mpa::negotiate::LocalSettings;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
use smoltcp::time::Instant;

use super::netdev::{Ipv4Subnet, NetdevEvent, NetdevWatch};
use super::netns::Netns;
use super::socket::KernelSock;
use crate::link::{DownReason, GoneReason, LinkEvent};
use crate::transport::conn::{
    from_micros, leave_backlog_of, undecided_of, Abort, Conn, Cx, Life, LocalClose, Timer,
};
use crate::transport::llp::{LlpSocket, LlpStack};
use crate::transport::mpa_conn::{MpaConn, Role, State};
use crate::transport::neighbor::NeighborReply;
use crate::transport::{
    sweep_half_open_of, CloseMode, ConnError, ConnId, Listener, ListenerId, MpaParams, StackConfig,
    StackError, StackEvent, StackStats, Ulp, MAX_BACKLOG, MAX_ROUNDS,
};

/// Epoll token of the interface watch.
const TOKEN_WATCH: u64 = u64::MAX;
/// Epoll tokens of listening sockets: this bit and the listener id.
const TOKEN_LISTENER: u64 = 1 << 62;
/// Epoll events taken per system call.
const EVENTS_PER_WAIT: usize = 64;
/// Bytes of FPDUs a connection writes in one round at most: the kernel cuts and merges
/// segments as it likes (no one-FPDU-per-segment rule to keep), so a round fills the
/// kernel's buffer in large writes.
const HOST_TX_BATCH_BYTES: usize = 256 * 1024;

/// What a host-TCP device's users read of its interface (the RDMA CM's route,
/// `Device::addresses`), kept current by the stack: its addresses and its network
/// namespace.
#[derive(Debug, Default)]
pub struct HostInfo {
    addrs: Mutex<Vec<Ipv4Subnet>>,
    netns: OnceLock<Netns>,
}

impl HostInfo {
    /// The interface's IPv4 addresses now (none once it is gone).
    pub fn addresses(&self) -> Vec<Ipv4Subnet> {
        self.addrs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_addresses(&self, f: impl FnOnce(&mut Vec<Ipv4Subnet>)) {
        f(&mut self.addrs.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// The source address of the kernel's route to `dst` in the device's namespace
    /// ([`super::netdev::route_source`]); `None` if there is none (or the namespace
    /// cannot be entered).
    pub fn route_source(&self, dst: Ipv4Addr) -> Option<Ipv4Addr> {
        match self.netns.get() {
            Some(ns) => ns.run(|| super::netdev::route_source(dst)).ok()?.ok(),
            None => super::netdev::route_source(dst).ok(),
        }
    }

    /// Runs `f` in the device's namespace ([`Netns::run`]).
    fn in_netns<T>(&self, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        match self.netns.get() {
            Some(ns) => ns.run(f)?,
            None => f(),
        }
    }
}

/// A host-TCP device's [`HostInfo`], shared by its stack and its handles.
pub type SharedAddrs = Arc<HostInfo>;

/// One connection: the MPA connection and its kernel socket.
struct HostConn {
    conn: Conn<()>,
    sock: KernelSock,
}

impl AsMut<Conn<()>> for HostConn {
    fn as_mut(&mut self) -> &mut Conn<()> {
        &mut self.conn
    }
}

/// The kernel listening sockets of one listener, one per device address.
struct ListenSockets {
    port: u16,
    backlog: usize,
    socks: Vec<(Ipv4Addr, TcpListener)>,
    /// The last accept ran out of file descriptors (`EMFILE`/`ENFILE`): connections wait
    /// in the kernel's queue, and accepting is tried again when a connection of this
    /// stack ends (the sockets are edge-triggered, so a full process does not spin).
    starved: bool,
}

/// The transport of a device on a host interface. See the [module docs](self).
pub struct HostStack {
    ifname: String,
    epoll: Epoll,
    watch: NetdevWatch,
    addrs: SharedAddrs,
    mtu: usize,
    up: bool,
    cfg: StackConfig,
    conns: BTreeMap<ConnId, HostConn>,
    listeners: BTreeMap<ListenerId, Listener>,
    lsocks: BTreeMap<ListenerId, ListenSockets>,
    events: VecDeque<StackEvent>,
    stats: StackStats,
    /// Empty: kernel sockets are not tracked ([`LlpSocket::tracked`]); the connections'
    /// context wants one.
    tracker: RefCell<crate::transport::seg_tracker::SegTracker>,
    next_id: u64,
    /// Progress in the last poll ([`LlpStack::progressed`]).
    progress: bool,
    /// A command (connect, accept, reject, close) came since the last poll.
    commanded: bool,
    gone: Option<GoneReason>,
}

impl std::fmt::Debug for HostStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostStack")
            .field("interface", &self.ifname)
            .field("connections", &self.conns.len())
            .field("listeners", &self.listeners.len())
            .field("gone", &self.gone)
            .finish()
    }
}

fn io_err(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

impl HostStack {
    /// A stack on the host interface `ifname` (in the calling thread's network
    /// namespace), its addresses published in `addrs` and kept current.
    ///
    /// Errors: [`StackError::Config`] when the interface does not exist or the epoll set
    /// or netlink socket cannot be made (the message says which), or `cfg`'s TCP or MPA
    /// settings are invalid ([`StackError::Link`], [`StackError::Settings`]).
    pub fn open(ifname: &str, cfg: StackConfig, addrs: SharedAddrs) -> Result<Self, StackError> {
        cfg.tcp.validate()?;
        cfg.mpa.settings.validate()?;
        let (watch, info) = NetdevWatch::open(ifname)
            .map_err(|e| StackError::Config(format!("interface {ifname}: {e}")))?;
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(|e| StackError::Config(format!("epoll_create: {e}")))?;
        epoll
            .add(
                watch.fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_WATCH),
            )
            .map_err(|e| StackError::Config(format!("epoll_ctl: {e}")))?;
        addrs.set_addresses(|a| *a = info.addrs.clone());
        if let Ok(ns) = Netns::current() {
            let _ = addrs.netns.set(ns);
        }
        tracing::debug!(interface = ifname, addresses = ?info.addrs, mtu = info.mtu, up = info.up, "host stack up");
        Ok(HostStack {
            ifname: ifname.to_owned(),
            epoll,
            watch,
            addrs,
            mtu: usize::try_from(info.mtu).unwrap_or(1500).max(68),
            up: info.up,
            cfg,
            conns: BTreeMap::new(),
            listeners: BTreeMap::new(),
            lsocks: BTreeMap::new(),
            events: VecDeque::new(),
            stats: StackStats::default(),
            tracker: RefCell::default(),
            next_id: 1,
            progress: false,
            commanded: false,
            gone: None,
        })
    }

    /// The interface's name.
    pub fn interface(&self) -> &str {
        &self.ifname
    }

    /// Counters (as [`Stack::stats`](crate::transport::Stack::stats); `fpdus_batched`
    /// and the SYN counters stay 0: the kernel keeps SYNs).
    pub fn stats(&self) -> StackStats {
        self.stats
    }

    fn addresses(&self) -> Vec<Ipv4Subnet> {
        self.addrs.addresses()
    }

    fn check_gone(&self) -> Result<(), StackError> {
        match self.gone {
            Some(r) => Err(StackError::Gone(r)),
            None => Ok(()),
        }
    }

    fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn cx_parts(&mut self) -> (&mut BTreeMap<ConnId, HostConn>, Cx<'_>) {
        (
            &mut self.conns,
            Cx {
                events: &mut self.events,
                tracker: &self.tracker,
                stats: &mut self.stats,
                cfg: &self.cfg,
                progress: &mut self.progress,
                listeners: &mut self.listeners,
                mtu: self.mtu,
                tx_batch_max: HOST_TX_BATCH_BYTES,
                short_last: false,
            },
        )
    }

    /// A kernel listening socket on `addr:port`, non-blocking, in the epoll set.
    fn listen_on(
        &self,
        lid: ListenerId,
        addr: Ipv4Addr,
        port: u16,
        backlog: usize,
    ) -> io::Result<TcpListener> {
        let fd = self.addrs.in_netns(|| {
            socket(
                AddressFamily::Inet,
                SockType::Stream,
                SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                None,
            )
            .map_err(io_err)
        })?;
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReuseAddr, &true)
            .map_err(io_err)?;
        nix::sys::socket::bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrIn::from(SocketAddrV4::new(addr, port)),
        )
        .map_err(io_err)?;
        let backlog = nix::sys::socket::Backlog::new(i32::try_from(backlog).unwrap_or(128))
            .map_err(io_err)?;
        nix::sys::socket::listen(&fd, backlog).map_err(io_err)?;
        let l = TcpListener::from(fd);
        self.epoll
            .add(
                &l,
                EpollEvent::new(
                    EpollFlags::EPOLLIN | EpollFlags::EPOLLET,
                    TOKEN_LISTENER | lid.0,
                ),
            )
            .map_err(io_err)?;
        Ok(l)
    }

    fn register(&self, id: ConnId, sock: &KernelSock) -> io::Result<()> {
        let Some(fd) = sock.fd() else { return Ok(()) };
        let flags = EpollFlags::EPOLLIN
            | EpollFlags::EPOLLOUT
            | EpollFlags::EPOLLRDHUP
            | EpollFlags::EPOLLET;
        self.epoll
            .add(fd, EpollEvent::new(flags, id.0))
            .map_err(io_err)
    }

    /// Accepts every connection waiting on listener `lid`'s sockets.
    fn accept_ready(&mut self, lid: ListenerId, now: Instant) {
        let Some(ls) = self.lsocks.get_mut(&lid) else {
            return;
        };
        let mut born = Vec::new();
        let was_starved = std::mem::take(&mut ls.starved);
        for (_, l) in &ls.socks {
            // Edge-triggered: accept until the queue is empty (or no fd is left).
            loop {
                match l.accept() {
                    Ok((stream, peer)) => born.push((stream, peer)),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                        if !was_starved {
                            tracing::warn!(port = ls.port, error = %e, "cannot accept: out of file descriptors; connections wait until one of ours ends");
                        }
                        ls.starved = true;
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "accept failed");
                        break;
                    }
                }
            }
        }
        let Some(settings) = self.listeners.get(&lid).map(|l| l.settings.clone()) else {
            return;
        };
        for (stream, peer) in born {
            let (std::net::SocketAddr::V4(remote), Ok(std::net::SocketAddr::V4(local))) =
                (peer, stream.local_addr())
            else {
                continue;
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let sock = KernelSock::new(stream, false, &self.cfg.tcp);
            let id = ConnId(self.next_id());
            if self.register(id, &sock).is_err() {
                continue;
            }
            let conn = Conn::new(
                id,
                (),
                Role::Responder,
                local,
                remote,
                Some(lid),
                settings.clone(),
                now,
            );
            tracing::debug!(conn = id.0, %remote, %local, "TCP connection accepted");
            if let Some(l) = self.listeners.get_mut(&lid) {
                l.half_open.push_back(id);
            }
            self.conns.insert(id, HostConn { conn, sock });
            self.progress = true;
        }
    }

    /// Takes what the epoll set has ready, without waiting.
    fn take_ready(&mut self, now: Instant) {
        let mut evs = [EpollEvent::empty(); EVENTS_PER_WAIT];
        loop {
            let n = match self.epoll.wait(&mut evs, EpollTimeout::ZERO) {
                Ok(n) => n,
                Err(nix::Error::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "epoll_wait failed");
                    return;
                }
            };
            for ev in &evs[..n] {
                let flags = ev.events();
                match ev.data() {
                    TOKEN_WATCH => self.watch_events(),
                    t if t & TOKEN_LISTENER != 0 => {
                        self.accept_ready(ListenerId(t & !TOKEN_LISTENER), now);
                    }
                    t => {
                        if let Some(c) = self.conns.get_mut(&ConnId(t)) {
                            c.sock.on_ready(
                                flags.intersects(
                                    EpollFlags::EPOLLIN
                                        | EpollFlags::EPOLLRDHUP
                                        | EpollFlags::EPOLLHUP,
                                ),
                                flags.contains(EpollFlags::EPOLLOUT),
                                flags.contains(EpollFlags::EPOLLERR),
                            );
                            self.progress = true;
                        }
                    }
                }
                if self.gone.is_some() {
                    return;
                }
            }
            if n < EVENTS_PER_WAIT {
                return;
            }
        }
    }

    /// The interface's changes: addresses (listening sockets follow), up and down, gone.
    fn watch_events(&mut self) {
        let evs = match self.watch.poll() {
            Ok(evs) => evs,
            Err(e) => {
                tracing::warn!(interface = %self.ifname, error = %e, "interface watch failed");
                return;
            }
        };
        for ev in evs {
            tracing::debug!(interface = %self.ifname, event = ?ev, "interface event");
            self.progress = true;
            match ev {
                NetdevEvent::AddressAdded(s) => {
                    self.addrs.set_addresses(|a| a.push(s));
                    let ids: Vec<ListenerId> = self.lsocks.keys().copied().collect();
                    for lid in ids {
                        let (port, backlog) = {
                            let l = &self.lsocks[&lid];
                            (l.port, l.backlog)
                        };
                        match self.listen_on(lid, s.addr, port, backlog) {
                            Ok(sock) => {
                                if let Some(l) = self.lsocks.get_mut(&lid) {
                                    l.socks.push((s.addr, sock));
                                }
                            }
                            Err(e) => {
                                tracing::warn!(address = %s.addr, port, error = %e, "cannot listen on a new address");
                            }
                        }
                    }
                }
                NetdevEvent::AddressRemoved(s) => {
                    self.addrs.set_addresses(|a| a.retain(|x| *x != s));
                    for l in self.lsocks.values_mut() {
                        l.socks.retain(|(a, _)| *a != s.addr);
                    }
                }
                NetdevEvent::Up => {
                    self.up = true;
                    self.events.push_back(StackEvent::Link(LinkEvent::Up));
                }
                NetdevEvent::Down => {
                    self.up = false;
                    self.events
                        .push_back(StackEvent::Link(LinkEvent::Down(DownReason::AdminDown)));
                }
                NetdevEvent::Mtu(m) => {
                    self.mtu = usize::try_from(m).unwrap_or(self.mtu).max(68);
                }
                NetdevEvent::Gone => {
                    let reason = GoneReason::Deleted;
                    self.events
                        .push_back(StackEvent::Link(LinkEvent::Gone(reason)));
                    self.fail_all(ConnError::DeviceGone(reason));
                    self.gone = Some(reason);
                    self.addrs.set_addresses(Vec::clear);
                    return;
                }
            }
        }
    }

    /// Fails every connection with `error` (final events reported), closes every socket
    /// and listener.
    fn fail_all(&mut self, error: ConnError) {
        let (conns, mut cx) = self.cx_parts();
        for c in conns.values_mut() {
            if c.conn.life == Life::Active && !c.conn.final_sent {
                c.conn.fail(&mut cx, error.clone());
            }
            c.sock.abort();
        }
        self.conns.clear();
        self.listeners.clear();
        self.lsocks.clear();
    }

    /// Removes finished connections (their sockets are closed: aborted, or the kernel
    /// finishes the close).
    fn reap(&mut self) {
        let listeners = &mut self.listeners;
        self.conns.retain(|_, c| {
            if !c.conn.life.is_zombie() {
                return true;
            }
            if std::mem::take(&mut c.conn.in_backlog) {
                if let Some(l) = c.conn.listener.and_then(|l| listeners.get_mut(&l)) {
                    l.pending = l.pending.saturating_sub(1);
                }
            }
            false
        });
    }
}

impl LlpStack for HostStack {
    fn listen(
        &mut self,
        port: u16,
        backlog: usize,
        settings: Option<LocalSettings>,
    ) -> Result<ListenerId, StackError> {
        self.check_gone()?;
        if port == 0 {
            return Err(StackError::InvalidPort);
        }
        if backlog == 0 || backlog > MAX_BACKLOG {
            return Err(StackError::InvalidBacklog(backlog));
        }
        if self.cfg.half_open_max == 0 {
            return Err(StackError::Config(
                "half_open_max must be at least 1".into(),
            ));
        }
        if self.lsocks.values().any(|l| l.port == port) {
            return Err(StackError::PortInUse(port));
        }
        let settings = settings.unwrap_or_else(|| self.cfg.mpa.settings.clone());
        settings.validate()?;
        let id = ListenerId(self.next_id());
        let mut socks = Vec::new();
        for a in self.addresses() {
            match self.listen_on(id, a.addr, port, backlog) {
                Ok(s) => socks.push((a.addr, s)),
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {
                    return Err(StackError::PortInUse(port));
                }
                Err(e) => {
                    return Err(StackError::Config(format!(
                        "listen on {}:{port}: {e}",
                        a.addr
                    )));
                }
            }
        }
        self.lsocks.insert(
            id,
            ListenSockets {
                port,
                backlog,
                socks,
                starved: false,
            },
        );
        self.listeners.insert(
            id,
            Listener {
                port,
                backlog,
                settings,
                armed: Vec::new(),
                pending: 0,
                half_open: VecDeque::new(),
                half_open_max: self.cfg.half_open_max,
            },
        );
        tracing::debug!(port, backlog, "listening (kernel TCP)");
        Ok(id)
    }

    fn unlisten(&mut self, id: ListenerId) -> Result<(), StackError> {
        self.listeners
            .remove(&id)
            .ok_or(StackError::NoSuchListener(id))?;
        self.lsocks.remove(&id);
        for c in self.conns.values_mut() {
            if c.conn.listener == Some(id) {
                c.conn.in_backlog = false;
                if !c.conn.visible {
                    c.conn.ask_abort();
                }
            }
        }
        Ok(())
    }

    fn connect(
        &mut self,
        remote: SocketAddrV4,
        params: MpaParams,
        upper: Box<dyn Ulp>,
        now: Instant,
    ) -> Result<ConnId, StackError> {
        self.check_gone()?;
        if remote.port() == 0 {
            return Err(StackError::InvalidPort);
        }
        let mut settings = params
            .settings
            .unwrap_or_else(|| self.cfg.mpa.settings.clone());
        settings.private_data = params.private_data;
        settings.ird = params.ird;
        settings.ord = params.ord;
        settings.validate()?;
        let fd: OwnedFd = self
            .addrs
            .in_netns(|| {
                socket(
                    AddressFamily::Inet,
                    SockType::Stream,
                    SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                    None,
                )
                .map_err(io_err)
            })
            .map_err(|e| StackError::Config(format!("socket: {e}")))?;
        match connect(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrIn::from(remote),
        ) {
            Ok(()) | Err(nix::Error::EINPROGRESS) => {}
            Err(nix::Error::ENETUNREACH | nix::Error::EHOSTUNREACH | nix::Error::EADDRNOTAVAIL) => {
                return Err(StackError::Unaddressable(remote));
            }
            Err(nix::Error::EAGAIN) => return Err(StackError::NoFreePort),
            Err(e) => return Err(StackError::Config(format!("connect to {remote}: {e}"))),
        }
        let stream = TcpStream::from(fd);
        let sock = KernelSock::new(stream, true, &self.cfg.tcp);
        let local = sock
            .local_addr()
            .unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
        let id = ConnId(self.next_id());
        self.register(id, &sock)
            .map_err(|e| StackError::Config(format!("epoll_ctl: {e}")))?;
        let mut conn = Conn::new(id, (), Role::Initiator, local, remote, None, settings, now);
        conn.timer = Timer::Connect {
            deadline: now + smoltcp::time::Duration::from_micros(self.cfg.connect_timeout_us),
        };
        conn.upper = Some(upper);
        self.conns.insert(id, HostConn { conn, sock });
        self.commanded = true;
        tracing::debug!(conn = id.0, %remote, %local, "connecting (kernel TCP)");
        Ok(id)
    }

    fn accept(
        &mut self,
        conn: ConnId,
        private_data: &[u8],
        ird: u16,
        ord: u16,
        upper: Box<dyn Ulp>,
    ) -> Result<(), StackError> {
        let c = undecided_of(
            self.conns.get_mut(&conn).map(|c| &mut c.conn),
            conn,
            "accept",
        )?;
        if let Some(m) = c.mpa.as_mut() {
            m.accept(private_data, ird, ord)?;
        }
        c.upper = Some(upper);
        if let Some(c) = self.conns.get_mut(&conn) {
            leave_backlog_of(&mut c.conn, &mut self.listeners);
        }
        let (conns, mut cx) = self.cx_parts();
        if let Some(c) = conns.get_mut(&conn) {
            c.conn.drain_mpa(&mut cx);
        }
        self.commanded = true;
        Ok(())
    }

    fn reject(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), StackError> {
        let c = undecided_of(
            self.conns.get_mut(&conn).map(|c| &mut c.conn),
            conn,
            "reject",
        )?;
        if let Some(m) = c.mpa.as_mut() {
            m.reject(private_data)?;
        }
        c.final_sent = true;
        if let Some(c) = self.conns.get_mut(&conn) {
            leave_backlog_of(&mut c.conn, &mut self.listeners);
        }
        self.commanded = true;
        Ok(())
    }

    fn close(&mut self, conn: ConnId, mode: CloseMode) -> Result<(), StackError> {
        let undecided = undecided_of(
            self.conns.get_mut(&conn).map(|c| &mut c.conn),
            conn,
            "close",
        )
        .is_ok();
        if undecided && mode == CloseMode::Graceful {
            return self.reject(conn, &[]);
        }
        let c = &mut self
            .conns
            .get_mut(&conn)
            .ok_or(StackError::NoSuchConnection(conn))?
            .conn;
        if c.final_sent || c.life.is_zombie() {
            return Err(StackError::WrongState {
                call: "close",
                why: "the connection already ended",
            });
        }
        if c.close == LocalClose::No {
            c.close = LocalClose::Asked;
        }
        match (mode, c.mpa.as_mut()) {
            (CloseMode::Graceful, Some(m)) => {
                if m.state() == State::FullOperation && c.upper.is_some() {
                    c.close = LocalClose::Draining;
                } else {
                    let _ = m.close();
                }
            }
            _ => c.ask_abort(),
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            leave_backlog_of(&mut c.conn, &mut self.listeners);
        }
        self.commanded = true;
        Ok(())
    }

    fn poll_rounds(&mut self, now: Instant, max_rounds: usize) -> Option<Instant> {
        let max_rounds = max_rounds.clamp(1, MAX_ROUNDS);
        // A command since the last poll counts as this poll's progress.
        self.progress = std::mem::take(&mut self.commanded);
        if self.gone.is_some() {
            return None;
        }
        self.take_ready(now);
        if self.gone.is_some() {
            self.progress = true;
            return None;
        }
        let mut rounds = 0;
        let mut more = false;
        loop {
            let (conns, mut cx) = self.cx_parts();
            let mut moved = false;
            for c in conns.values_mut() {
                let read = c.sock.fill();
                let wrote = c.conn.service(&mut c.sock, &mut cx, now);
                let flushed = c.sock.flush();
                moved |= read > 0 || wrote || flushed > 0;
            }
            if !moved {
                break;
            }
            self.progress = true;
            rounds += 1;
            if rounds >= max_rounds {
                more = true;
                break;
            }
        }
        let before = self.conns.len();
        self.reap();
        sweep_half_open_of(&mut self.listeners, &mut self.conns, &mut self.stats);
        if self.conns.len() < before {
            // File descriptors came free: listeners that ran out try again.
            let starved: Vec<ListenerId> = self
                .lsocks
                .iter()
                .filter(|(_, l)| l.starved)
                .map(|(id, _)| *id)
                .collect();
            for lid in starved {
                self.accept_ready(lid, now);
            }
        }
        if more {
            return Some(now);
        }
        let mut next: Option<Instant> = None;
        for c in self.conns.values() {
            let t = [
                c.conn
                    .mpa
                    .as_ref()
                    .and_then(MpaConn::poll_timeout)
                    .map(from_micros),
                c.conn.poll_at(),
                // A zombie-to-be whose abort waits for the next service.
                (c.conn.abort == Abort::Asked).then_some(now),
            ];
            for t in t.into_iter().flatten() {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        }
        next
    }

    fn poll_event(&mut self) -> Option<StackEvent> {
        self.events.pop_front()
    }

    fn progressed(&self) -> bool {
        self.progress
    }

    fn gone(&self) -> Option<GoneReason> {
        self.gone
    }

    fn connection_count(&self) -> usize {
        self.conns.len()
    }

    fn shutdown(&mut self, _now: Instant) {
        if self.gone.is_some() {
            return;
        }
        self.fail_all(ConnError::DeviceClosed);
    }

    /// The kernel resolves neighbours itself when a connection is made: completes at
    /// once (an all-zero hardware address) for a destination the kernel has a route to,
    /// else with `NotOnLink` (the kernel's `-ENETUNREACH`).
    fn resolve_neighbor(
        &mut self,
        ip: Ipv4Addr,
        _timeout_us: u64,
        _now: Instant,
        reply: NeighborReply,
    ) {
        match self.addrs.route_source(ip) {
            Some(_) => reply.complete(Ok([0; 6])),
            None => reply.complete(Err(crate::transport::neighbor::NeighborError::NotOnLink(
                ip,
            ))),
        }
    }

    fn set_link_check_interval(&mut self, _us: u64) {}

    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.epoll.0.as_fd()
    }

    fn mtu(&self) -> usize {
        self.mtu
    }
}
