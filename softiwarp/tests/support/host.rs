//! Harness of `smoke_memory` and `tap::netns`: a smoltcp host over a link, a deterministic
//! payload, and the two ends of a TCP echo (client sends, server echoes, both verify).

use std::net::Ipv4Addr;

use smoltcp::iface::{Interface, SocketHandle, SocketSet};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use softiwarp::link::Link;
use softiwarp::transport::smoltcp_glue::{build_interface, InterfaceConfig, LinkDevice, TcpConfig};

/// TCP port the echo server listens on.
pub const SERVER_PORT: u16 = 5001;
/// TCP port the client connects from.
pub const CLIENT_PORT: u16 = 40001;

/// One smoltcp stack: device, interface, one TCP socket.
pub struct Host<L: Link> {
    pub dev: LinkDevice<L>,
    pub iface: Interface,
    pub sockets: SocketSet<'static>,
    pub tcp: SocketHandle,
}

impl<L: Link> Host<L> {
    /// A host at `10.233.0.<host>/24` with MAC `02:00:00:00:00:<host>`.
    pub fn new(link: L, host: u8, tcp: TcpConfig, now: Instant) -> Self {
        let cfg = InterfaceConfig {
            mac: [0x02, 0, 0, 0, 0, host],
            address: addr(host),
            prefix_len: 24,
            gateway: None,
            random_seed: u64::from(host),
        };
        Host::with_interface(link, &cfg, tcp, now)
    }

    /// A host with the interface `cfg` and one TCP socket made from `tcp`.
    pub fn with_interface(link: L, cfg: &InterfaceConfig, tcp: TcpConfig, now: Instant) -> Self {
        let mut dev = LinkDevice::new(link);
        let iface = build_interface(cfg, &mut dev, now).expect("interface");
        let mut sockets = SocketSet::new(Vec::new());
        let tcp = sockets.add(tcp.socket().expect("socket"));
        Host {
            dev,
            iface,
            sockets,
            tcp,
        }
    }

    /// Polls the interface once; returns whether smoltcp reported socket changes.
    pub fn poll(&mut self, now: Instant) -> bool {
        self.iface.poll(now, &mut self.dev, &mut self.sockets) != smoltcp::iface::PollResult::None
    }

    pub fn socket(&mut self) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(self.tcp)
    }

    /// Listens on [`SERVER_PORT`].
    pub fn listen(&mut self) {
        self.listen_on(SERVER_PORT);
    }

    /// Listens on `port`.
    pub fn listen_on(&mut self, port: u16) {
        self.socket().listen(port).expect("listen");
    }

    /// Connects from [`CLIENT_PORT`] to [`SERVER_PORT`] of host `server`.
    pub fn connect(&mut self, server: u8) {
        self.connect_to(addr(server), SERVER_PORT, CLIENT_PORT);
    }

    /// Connects from `local_port` to `ip:port`.
    pub fn connect_to(&mut self, ip: Ipv4Addr, port: u16, local_port: u16) {
        let cx = self.iface.context();
        let sock = self.sockets.get_mut::<tcp::Socket>(self.tcp);
        sock.connect(cx, (ip, port), local_port).expect("connect");
    }
}

/// The IPv4 address of host number `host` in the test subnet.
pub fn addr(host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 233, 0, host)
}

/// `n` pseudo-random bytes from `seed`, the same on every run: [`super::pattern`].
#[allow(unused_imports)] // each test binary uses a subset
pub use super::pattern as payload;

/// One end of the echo, stepped by a poll loop.
pub trait Side {
    /// Moves what it can; returns whether any byte moved.
    fn step(&mut self, s: &mut tcp::Socket) -> bool;
    /// Whether this end is finished.
    fn done(&self, s: &tcp::Socket) -> bool;
}

impl Side for Client {
    fn step(&mut self, s: &mut tcp::Socket) -> bool {
        Client::step(self, s)
    }
    fn done(&self, s: &tcp::Socket) -> bool {
        Client::done(self, s)
    }
}

impl Side for Server {
    fn step(&mut self, s: &mut tcp::Socket) -> bool {
        Server::step(self, s)
    }
    fn done(&self, s: &tcp::Socket) -> bool {
        Server::done(self, s)
    }
}

/// The client end: sends `data`, reads the echo back, closes when all came back.
pub struct Client {
    pub data: Vec<u8>,
    pub sent: usize,
    pub echoed: Vec<u8>,
    pub closed: bool,
}

impl Client {
    pub fn new(data: Vec<u8>) -> Self {
        Client {
            echoed: Vec::with_capacity(data.len()),
            data,
            sent: 0,
            closed: false,
        }
    }

    /// Moves what it can; returns whether any byte moved.
    pub fn step(&mut self, s: &mut tcp::Socket) -> bool {
        let mut moved = false;
        if s.can_send() && self.sent < self.data.len() {
            let n = s.send_slice(&self.data[self.sent..]).unwrap_or(0);
            self.sent += n;
            moved |= n > 0;
        }
        while s.can_recv() {
            let before = self.echoed.len();
            let _ = s.recv(|buf| {
                self.echoed.extend_from_slice(buf);
                (buf.len(), ())
            });
            if self.echoed.len() == before {
                break;
            }
            moved = true;
        }
        if !self.closed && self.echoed.len() == self.data.len() {
            s.close();
            self.closed = true;
            moved = true;
        }
        moved
    }

    pub fn done(&self, s: &tcp::Socket) -> bool {
        self.closed && matches!(s.state(), tcp::State::TimeWait | tcp::State::Closed)
    }
}

/// The server end: echoes everything back, keeps a copy, closes after the client did.
#[derive(Default)]
pub struct Server {
    pub received: Vec<u8>,
    pub echoed: usize,
    pub closed: bool,
}

impl Server {
    pub fn step(&mut self, s: &mut tcp::Socket) -> bool {
        let mut moved = false;
        while s.can_recv() {
            let before = self.received.len();
            let _ = s.recv(|buf| {
                self.received.extend_from_slice(buf);
                (buf.len(), ())
            });
            if self.received.len() == before {
                break;
            }
            moved = true;
        }
        if s.can_send() && self.echoed < self.received.len() {
            let n = s.send_slice(&self.received[self.echoed..]).unwrap_or(0);
            self.echoed += n;
            moved |= n > 0;
        }
        if !self.closed && s.state() == tcp::State::CloseWait && self.echoed == self.received.len()
        {
            s.close();
            self.closed = true;
            moved = true;
        }
        moved
    }

    pub fn done(&self, s: &tcp::Socket) -> bool {
        self.closed && matches!(s.state(), tcp::State::Closed | tcp::State::TimeWait)
    }
}
