//! Raw smoltcp TCP bulk transfer, the baseline: one side of one connection over any
//! [`Link`], with a simple poll loop (the shape of `softiwarp/tests/tap/netns.rs`).
//!
//! The client connects, writes a repeating pseudo-random pattern for a byte count or a
//! time, then closes; the server accepts, reads everything, and closes after the
//! client's FIN. Both sides move data the way an application does: the client copies
//! from its own buffer into the socket, the server copies out of the socket into its own
//! buffer (`io_size` bytes at a time), so one copy each way is charged to the
//! application, as for the iWARP path. With `verify`, both run a CRC32c over every byte
//! (the server's must equal the client's); that costs time and is off for figures.
//!
//! The loop spins while there is activity and for `spin` after the last, then sleeps on
//! the link's poll fd until smoltcp's next deadline (at most 10 ms): an idle side does not
//! burn a core (transport-notes.md: busy polling is about 20% faster than sleeping).
//!
//! Throughput is taken at the server, from the first to the last data byte received;
//! the client reports from connection establishment to the ACK of its last byte.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant as StdInstant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::{Deserialize, Serialize};
use softiwarp::link::Link;
use softiwarp::smoltcp::iface::{Interface, SocketHandle, SocketSet};
use softiwarp::smoltcp::socket::tcp;
use softiwarp::smoltcp::time::Instant;
use softiwarp::transport::smoltcp_glue::{build_interface, InterfaceConfig, LinkDevice, TcpConfig};

use crate::BenchError;

/// Which end of the transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Listens, receives.
    Server,
    /// Connects, sends.
    Client,
}

/// How much the client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// Exactly this many bytes.
    Bytes(u64),
    /// As much as it can in this time (measured from connection establishment).
    Time(Duration),
}

/// Settings of one side.
#[derive(Debug, Clone)]
pub struct TcpBenchConfig {
    /// Server or client.
    pub role: Role,
    /// This side's address, prefix, MAC (and smoltcp's random seed).
    pub iface: InterfaceConfig,
    /// The server's address (the client connects to it; unused by the server).
    pub peer: Ipv4Addr,
    /// The server's TCP port.
    pub port: u16,
    /// What the client sends (unused by the server).
    pub amount: Amount,
    /// TCP socket settings (buffers; Nagle is off).
    pub tcp: TcpConfig,
    /// Bytes per application read/write, 1..=16 MiB. Default 64 KiB.
    pub io_size: usize,
    /// Run a CRC32c over every byte moved.
    pub verify: bool,
    /// Busy-poll for this long after the last activity before sleeping on the fd.
    pub spin: Duration,
    /// Hang guard for the whole run, connection setup included.
    pub timeout: Duration,
}

/// Default bytes per application read/write.
pub const DEFAULT_IO_SIZE: usize = 64 * 1024;

/// Length of the client's send pattern: 1 MiB, so the data is not one repeated block.
pub const PATTERN_LEN: usize = 1 << 20;

impl TcpBenchConfig {
    /// A configuration with the defaults: port 5201, 64 KiB I/O, no verification, 500 us
    /// spin, 60 s hang guard, 256 KiB socket buffers, and 1 GiB for the client.
    pub fn new(role: Role, iface: InterfaceConfig, peer: Ipv4Addr) -> TcpBenchConfig {
        TcpBenchConfig {
            role,
            iface,
            peer,
            port: 5201,
            amount: Amount::Bytes(1 << 30),
            tcp: TcpConfig {
                keep_alive: None,
                timeout: Some(Duration::from_secs(10)),
                ..TcpConfig::default()
            },
            io_size: DEFAULT_IO_SIZE,
            verify: false,
            spin: Duration::from_micros(500),
            timeout: Duration::from_secs(60),
        }
    }

    fn validate(&self) -> Result<(), BenchError> {
        if !(1..=16 << 20).contains(&self.io_size) {
            return Err(BenchError::Config(format!(
                "io_size {} outside 1..=16 MiB",
                self.io_size
            )));
        }
        self.tcp.validate()?;
        Ok(())
    }
}

/// What one side measured; printed by `bench-peer` as `RESULT <json>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferReport {
    /// `"tcp"` or an FPDU variant name.
    pub mode: String,
    /// Which side measured this.
    pub role: Role,
    /// The link's IP MTU in bytes.
    pub mtu: usize,
    /// Payload bytes moved (application bytes; for FPDU modes, ULPDU bytes).
    pub bytes: u64,
    /// Seconds the measurement spans (see the module docs).
    pub seconds: f64,
    /// `bytes * 8 / seconds / 1e9`.
    pub gbit_per_s: f64,
    /// CRC32c of every byte moved, when verifying.
    pub crc32c: Option<u32>,
    /// Frames sent on the link.
    pub tx_frames: u64,
    /// Frames received from the link.
    pub rx_frames: u64,
    /// Process CPU time, user, in seconds (whole run).
    pub cpu_user: f64,
    /// Process CPU time, system, in seconds (whole run).
    pub cpu_sys: f64,
}

impl TransferReport {
    /// Gbit/s for `bytes` over `seconds` (0 when `seconds` is 0).
    pub fn rate(bytes: u64, seconds: f64) -> f64 {
        if seconds > 0.0 {
            bytes as f64 * 8.0 / seconds / 1e9
        } else {
            0.0
        }
    }
}

/// `n` pseudo-random bytes from `seed` (xorshift64*), the same on every run and machine.
pub fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// The TAP offloads for `on` (`--no-offload` gives `false`): TCP checksum and
/// segmentation offload (`TapOffload::Tcp4`) or none.
pub fn tap_offload(on: bool) -> softiwarp::link::TapOffload {
    if on {
        softiwarp::link::TapOffload::Tcp4
    } else {
        softiwarp::link::TapOffload::Off
    }
}

/// Waits until `link` reports up (draining its events), at most `timeout`. A TAP just
/// attached is down (no carrier) until the kernel's linkwatch work has run.
///
/// Errors: [`BenchError::LinkNotUp`]; [`BenchError::Link`] if the link is gone.
pub fn wait_link_up(link: &mut impl Link, timeout: Duration) -> Result<(), BenchError> {
    let t0 = StdInstant::now();
    loop {
        while link.poll_event().is_some() {}
        let state = link.state();
        if state.is_up() {
            return Ok(());
        }
        if let softiwarp::link::LinkEvent::Gone(r) = state {
            return Err(softiwarp::link::LinkError::Gone(r).into());
        }
        if t0.elapsed() >= timeout {
            return Err(BenchError::LinkNotUp {
                name: link.name().to_owned(),
                waited: timeout,
                state: format!("{state:?}"),
            });
        }
        wait_fd(link, 50);
    }
}

fn wait_fd(link: &impl Link, ms: u16) {
    let mut fds = [PollFd::new(link.poll_fd(), PollFlags::POLLIN)];
    let _ = poll(&mut fds, PollTimeout::from(ms));
}

/// One smoltcp stack with one TCP socket (also used by [`crate::tcp_lat`]).
pub(crate) struct Stack<L: Link> {
    dev: LinkDevice<L>,
    iface: Interface,
    sockets: SocketSet<'static>,
    handle: SocketHandle,
    epoch: StdInstant,
    spin: Duration,
    last_activity: StdInstant,
    frames: u64,
}

impl<L: Link> Stack<L> {
    pub(crate) fn new(link: L, cfg: &TcpBenchConfig) -> Result<Stack<L>, BenchError> {
        let epoch = StdInstant::now();
        let mut dev = LinkDevice::new(link);
        let iface = build_interface(&cfg.iface, &mut dev, Instant::from_micros(0))?;
        let mut sockets = SocketSet::new(Vec::new());
        let handle = sockets.add(cfg.tcp.socket()?);
        Ok(Stack {
            dev,
            iface,
            sockets,
            handle,
            epoch,
            spin: cfg.spin,
            last_activity: epoch,
            frames: 0,
        })
    }

    fn now(&self) -> Instant {
        Instant::from_micros(self.epoch.elapsed().as_micros() as i64)
    }

    pub(crate) fn poll(&mut self) {
        let now = self.now();
        self.iface.poll(now, &mut self.dev, &mut self.sockets);
    }

    /// Starts connecting the socket to `peer:port` from `local_port`.
    pub(crate) fn connect(
        &mut self,
        peer: Ipv4Addr,
        port: u16,
        local_port: u16,
    ) -> Result<(), BenchError> {
        let cx = self.iface.context();
        self.sockets
            .get_mut::<tcp::Socket>(self.handle)
            .connect(cx, (peer, port), local_port)
            .map_err(|e| BenchError::Tcp(format!("connect: {e}")))
    }

    /// Polls (politely) until `done(state)` or `limit` passed.
    pub(crate) fn linger(
        &mut self,
        done: impl Fn(tcp::State) -> bool,
        limit: Duration,
    ) -> Result<(), BenchError> {
        let until = StdInstant::now() + limit;
        while !done(self.socket().state()) && StdInstant::now() < until {
            self.poll();
            self.idle(false)?;
        }
        Ok(())
    }

    pub(crate) fn socket(&mut self) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(self.handle)
    }

    /// Call after each poll + application step: spins while active, else sleeps on the
    /// fd until smoltcp's next deadline (at most 10 ms). Fails on a link event other
    /// than up.
    pub(crate) fn idle(&mut self, app_moved: bool) -> Result<(), BenchError> {
        let s = self.dev.stats();
        let frames = s.rx_frames + s.tx_frames;
        let t = StdInstant::now();
        if app_moved || frames != self.frames {
            self.frames = frames;
            self.last_activity = t;
            return Ok(());
        }
        if t.duration_since(self.last_activity) < self.spin {
            return Ok(());
        }
        if let Some(ev) = self.dev.link_mut().poll_event() {
            if !ev.is_up() {
                return Err(BenchError::Tcp(format!("link event {ev:?}")));
            }
        }
        let now = self.now();
        let ms = self
            .iface
            .poll_delay(now, &self.sockets)
            .map_or(10, |d| d.total_millis().min(10)) as u16;
        if ms > 0 {
            wait_fd(self.dev.link(), ms);
        }
        Ok(())
    }

    fn report(
        &self,
        mode: &str,
        role: Role,
        bytes: u64,
        seconds: f64,
        crc: Option<u32>,
    ) -> TransferReport {
        let s = self.dev.stats();
        let (cpu_user, cpu_sys) = crate::cpu_time();
        TransferReport {
            mode: mode.to_owned(),
            role,
            mtu: self.dev.link().mtu(),
            bytes,
            seconds,
            gbit_per_s: TransferReport::rate(bytes, seconds),
            crc32c: crc,
            tx_frames: s.tx_frames,
            rx_frames: s.rx_frames,
            cpu_user,
            cpu_sys,
        }
    }
}

pub(crate) fn check_alive(s: &tcp::Socket, what: &str) -> Result<(), BenchError> {
    if s.state() == tcp::State::Closed {
        return Err(BenchError::Tcp(format!(
            "connection closed (reset or timed out) while {what}"
        )));
    }
    Ok(())
}

/// Runs the server side on `link` (which should be up, see [`wait_link_up`]): listens,
/// calls `ready` once listening, receives until the client's FIN, closes.
///
/// Errors: link or TCP failure, [`BenchError::Timeout`] after `cfg.timeout`.
pub fn run_server<L: Link>(
    link: L,
    cfg: &TcpBenchConfig,
    ready: impl FnOnce(),
) -> Result<TransferReport, BenchError> {
    cfg.validate()?;
    let mut st = Stack::new(link, cfg)?;
    st.socket()
        .listen(cfg.port)
        .map_err(|e| BenchError::Tcp(format!("listen: {e}")))?;
    st.poll();
    ready();
    let deadline = StdInstant::now() + cfg.timeout;
    let mut buf = vec![0u8; cfg.io_size];
    let mut crc = 0u32;
    let mut bytes = 0u64;
    let mut first: Option<StdInstant> = None;
    let mut last = StdInstant::now();
    let mut seen_peer = false;
    loop {
        st.poll();
        let mut moved = false;
        let s = st.socket();
        while s.can_recv() {
            let n = s
                .recv_slice(&mut buf)
                .map_err(|e| BenchError::Tcp(format!("recv: {e}")))?;
            if n == 0 {
                break;
            }
            if cfg.verify {
                crc = crc32c::crc32c_append(crc, &buf[..n]);
            }
            bytes += n as u64;
            moved = true;
        }
        if moved {
            last = StdInstant::now();
            first.get_or_insert(last);
        }
        // `may_recv` is false in SynReceived too: count the connection from Established.
        seen_peer |= !matches!(
            s.state(),
            tcp::State::Listen | tcp::State::SynReceived | tcp::State::Closed
        );
        if seen_peer && !s.may_recv() && s.recv_queue() == 0 {
            if s.state() == tcp::State::Closed {
                return Err(BenchError::Tcp(format!(
                    "connection reset after {bytes} bytes"
                )));
            }
            break;
        }
        if StdInstant::now() > deadline {
            return Err(BenchError::Timeout(
                cfg.timeout,
                format!("server: {bytes} bytes received, state {}", s.state()),
            ));
        }
        st.idle(moved)?;
    }
    // The client's FIN is in: close and wait (briefly) for the ACK of ours.
    st.socket().close();
    let linger = StdInstant::now() + Duration::from_secs(2);
    while !matches!(
        st.socket().state(),
        tcp::State::Closed | tcp::State::TimeWait
    ) && StdInstant::now() < linger
    {
        st.poll();
        st.idle(false)?;
    }
    if st.socket().state() != tcp::State::Closed {
        tracing::debug!(state = %st.socket().state(), "server: close not acknowledged in 2 s");
    }
    let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    Ok(st.report("tcp", Role::Server, bytes, secs, cfg.verify.then_some(crc)))
}

/// Runs the client side on `link` (which should be up): connects to `cfg.peer`, sends
/// `cfg.amount`, closes, waits for the server's close.
///
/// Errors: link or TCP failure, [`BenchError::Timeout`] after `cfg.timeout`.
pub fn run_client<L: Link>(link: L, cfg: &TcpBenchConfig) -> Result<TransferReport, BenchError> {
    cfg.validate()?;
    let mut st = Stack::new(link, cfg)?;
    let deadline = StdInstant::now() + cfg.timeout;
    let local_port = 40000 + (cfg.iface.random_seed % 20000) as u16;
    st.connect(cfg.peer, cfg.port, local_port)?;
    // Connection establishment.
    while st.socket().state() != tcp::State::Established {
        st.poll();
        let s = st.socket();
        check_alive(s, "connecting")?;
        if StdInstant::now() > deadline {
            return Err(BenchError::Timeout(
                cfg.timeout,
                format!("client: connect, state {}", s.state()),
            ));
        }
        st.idle(false)?;
    }
    let pat = pattern(PATTERN_LEN, 0x5eed);
    let start = StdInstant::now();
    let (limit, until) = match cfg.amount {
        Amount::Bytes(n) => (n, None),
        Amount::Time(d) => (u64::MAX, Some(start + d)),
    };
    let mut sent = 0u64;
    let mut crc = 0u32;
    let mut closed = false;
    loop {
        st.poll();
        let mut moved = false;
        let s = st.socket();
        check_alive(s, "sending")?;
        if !closed {
            let time_up = until.is_some_and(|u| StdInstant::now() >= u);
            while !time_up && sent < limit && s.can_send() {
                let off = (sent % PATTERN_LEN as u64) as usize;
                let want = ((limit - sent) as usize)
                    .min(cfg.io_size)
                    .min(PATTERN_LEN - off);
                let chunk = &pat[off..off + want];
                let n = s
                    .send_slice(chunk)
                    .map_err(|e| BenchError::Tcp(format!("send: {e}")))?;
                if n == 0 {
                    break;
                }
                if cfg.verify {
                    crc = crc32c::crc32c_append(crc, &chunk[..n]);
                }
                sent += n as u64;
                moved = true;
            }
            if time_up || sent >= limit {
                s.close();
                closed = true;
                moved = true;
            }
        }
        // FIN acknowledged: every byte arrived.
        if closed
            && s.send_queue() == 0
            && matches!(
                s.state(),
                tcp::State::FinWait2 | tcp::State::TimeWait | tcp::State::Closing
            )
        {
            break;
        }
        if StdInstant::now() > deadline {
            return Err(BenchError::Timeout(
                cfg.timeout,
                format!("client: {sent} bytes sent, state {}", s.state()),
            ));
        }
        st.idle(moved)?;
    }
    let secs = start.elapsed().as_secs_f64();
    // Wait for the server's FIN and ACK it (TimeWait), then a few more polls so the ACK
    // leaves before the process exits.
    let linger = StdInstant::now() + Duration::from_secs(2);
    while !matches!(
        st.socket().state(),
        tcp::State::TimeWait | tcp::State::Closed
    ) && StdInstant::now() < linger
    {
        st.poll();
        st.idle(false)?;
    }
    let t = StdInstant::now();
    while t.elapsed() < Duration::from_millis(20) {
        st.poll();
        st.idle(false)?;
    }
    Ok(st.report("tcp", Role::Client, sent, secs, cfg.verify.then_some(crc)))
}

/// Host `n` on test subnet 10.9.`net`.0/24: address 10.9.`net`.`n`, MAC
/// 02:00:00:00:`net`:`n`, no gateway (unit tests and `examples/stack_path.rs`, over memory
/// links).
pub fn test_iface(net: u8, n: u8) -> InterfaceConfig {
    InterfaceConfig {
        mac: [0x02, 0, 0, 0, net, n],
        address: Ipv4Addr::new(10, 9, net, n),
        prefix_len: 24,
        gateway: None,
        random_seed: u64::from(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softiwarp::link::{MemoryConfig, MemoryLink};

    fn iface(n: u8) -> InterfaceConfig {
        test_iface(0, n)
    }

    #[test]
    fn pattern_is_deterministic() {
        let a = pattern(1000, 7);
        assert_eq!(a.len(), 1000);
        assert_eq!(a, pattern(1000, 7));
        assert_ne!(a, pattern(1000, 8));
        assert_eq!(&pattern(8, 7)[..], &a[..8]);
        // Not degenerate: many distinct byte values.
        let distinct: std::collections::BTreeSet<u8> = a.iter().copied().collect();
        assert!(distinct.len() > 200);
    }

    #[test]
    fn rate_is_gbit_per_s() {
        assert_eq!(TransferReport::rate(1_000_000_000, 8.0), 1.0);
        assert_eq!(TransferReport::rate(5, 0.0), 0.0);
    }

    fn transfer(mtu: usize, amount: Amount, io_size: usize) -> (TransferReport, TransferReport) {
        let (a, b) = MemoryLink::pair(MemoryConfig {
            mtu,
            ..MemoryConfig::default()
        })
        .unwrap();
        let mut scfg = TcpBenchConfig::new(Role::Server, iface(1), Ipv4Addr::new(10, 9, 0, 2));
        scfg.verify = true;
        scfg.io_size = io_size;
        scfg.spin = Duration::from_millis(5);
        let mut ccfg = TcpBenchConfig::new(Role::Client, iface(2), Ipv4Addr::new(10, 9, 0, 1));
        ccfg.verify = true;
        ccfg.amount = amount;
        ccfg.io_size = io_size;
        ccfg.spin = Duration::from_millis(5);
        let (tx, rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || run_server(a, &scfg, move || tx.send(()).unwrap()));
        rx.recv_timeout(Duration::from_secs(10))
            .expect("server ready");
        let client = run_client(b, &ccfg).expect("client");
        let server = server.join().unwrap().expect("server");
        (server, client)
    }

    #[test]
    fn memory_link_transfer_is_verified_byte_for_byte() {
        // An odd byte count and an I/O size that does not divide the pattern.
        let n = 3 * PATTERN_LEN as u64 + 12_345;
        let (server, client) = transfer(1500, Amount::Bytes(n), 10_007);
        assert_eq!(client.bytes, n);
        assert_eq!(server.bytes, n);
        let mut want = 0u32;
        let pat = pattern(PATTERN_LEN, 0x5eed);
        let mut left = n as usize;
        while left > 0 {
            let k = left.min(PATTERN_LEN);
            want = crc32c::crc32c_append(want, &pat[..k]);
            left -= k;
        }
        assert_eq!(client.crc32c, Some(want));
        assert_eq!(server.crc32c, Some(want));
        assert_eq!(server.mtu, 1500);
        assert_eq!(server.role, Role::Server);
        assert!(server.gbit_per_s > 0.0 && client.seconds > 0.0);
        // Full-size segments: at least n / MSS data frames.
        assert!(client.tx_frames >= n / 1460, "{}", client.tx_frames);
    }

    #[test]
    fn timed_transfer_stops_and_matches() {
        let (server, client) = transfer(
            9000,
            Amount::Time(Duration::from_millis(300)),
            DEFAULT_IO_SIZE,
        );
        assert!(client.bytes > 0);
        assert_eq!(server.bytes, client.bytes);
        assert_eq!(server.crc32c, client.crc32c);
        assert!(client.seconds >= 0.3, "{}", client.seconds);
    }

    #[test]
    fn bad_io_size_is_refused() {
        let (a, _b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let mut cfg = TcpBenchConfig::new(Role::Server, iface(1), Ipv4Addr::new(10, 9, 0, 2));
        cfg.io_size = 0;
        assert!(matches!(
            run_server(a, &cfg, || ()),
            Err(BenchError::Config(_))
        ));
    }

    #[test]
    fn connect_to_nobody_fails_typed() {
        // Nothing listens on the other end: smoltcp answers the SYN with a RST.
        let (a, b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let peer = std::thread::spawn(move || {
            // A stack with no listening socket on B's side.
            let cfg = TcpBenchConfig::new(Role::Server, iface(1), Ipv4Addr::new(10, 9, 0, 2));
            let mut st = Stack::new(a, &cfg).unwrap();
            let t = StdInstant::now();
            while t.elapsed() < Duration::from_secs(2) {
                st.poll();
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let mut cfg = TcpBenchConfig::new(Role::Client, iface(2), Ipv4Addr::new(10, 9, 0, 1));
        cfg.timeout = Duration::from_secs(5);
        let err = run_client(b, &cfg).unwrap_err();
        assert!(matches!(err, BenchError::Tcp(_)), "{err}");
        peer.join().unwrap();
    }
}
