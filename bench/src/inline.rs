//! The FPDU stream without the engine thread: one thread drives softiwarp's sans-IO
//! [`Stack`] directly, with an upper layer ([`Ulp`]) that makes ULPDUs in place (a
//! 14-byte DDP header and a slice of the pattern, framed by the stack in one copy with
//! the CRC) and consumes them in place in the TCP receive buffer.
//!
//! The receiver copies each ULPDU into its own buffer (as the TCP baseline's receiver
//! copies out of the socket, and as RDMA placement copies into a memory region).
//!
//! This is the `fpdu-inline-*` variants of the benchmark: the same wire bytes as the
//! device variants (the same ULPDUs as `crate::ulpdu`), but no threads, no queues
//! and no per-ULPDU allocation, so the difference between the two tells what the
//! engine-thread hand-off costs, and the difference to raw TCP what the MPA path itself
//! (framing, CRC, the stack's one-FPDU-per-segment discipline) costs.

use std::net::SocketAddrV4;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant as StdInstant};

use crate::ulpdu::{HEADER_LEN, PATTERN_LEN, STAG};
use mpa::negotiate::CrcPolicy;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use softiwarp::link::Link;
use softiwarp::smoltcp::time::Instant;
use softiwarp::transport::mpa_conn::CallError;
use softiwarp::transport::smoltcp_glue::{InterfaceConfig, TcpConfig};
use softiwarp::transport::{
    CloseMode, ConnEvent, EmitUlpdu, Established, MpaParams, Stack, StackConfig, StackEvent, Ulp,
};

use crate::tcp::{Amount, Role, TransferReport};
use crate::BenchError;

/// Settings of one side.
#[derive(Debug, Clone)]
pub struct InlineConfig {
    /// Server (receives) or client (sends).
    pub role: Role,
    /// This side's interface.
    pub iface: InterfaceConfig,
    /// The server's address and port.
    pub server: SocketAddrV4,
    /// What the client sends.
    pub amount: Amount,
    /// MPA CRC policy (`Wanted`: on; `IfPeerAsks` on both sides: off).
    pub crc: CrcPolicy,
    /// TCP settings.
    pub tcp: TcpConfig,
    /// CRC32c over every ULPDU byte (reported).
    pub verify: bool,
    /// Busy-poll time after activity.
    pub spin: Duration,
    /// Hang guard.
    pub timeout: Duration,
}

#[derive(Debug, Default)]
struct Counters {
    ulpdus: u64,
    bytes: u64,
    crc: u32,
    first: Option<StdInstant>,
    last: Option<StdInstant>,
    /// Sender: no more ULPDUs to send.
    sent_all: bool,
    established: Option<Established>,
    error: Option<String>,
}

#[derive(Debug, Clone, Default)]
struct Shared(Arc<Mutex<Counters>>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Counters> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The upper layer: sends (client) or receives (server) the ULPDU stream.
struct BenchUlp {
    shared: Shared,
    sender: bool,
    verify: bool,
    /// The pattern followed by its first MULPDU bytes again, so a payload is always one
    /// contiguous slice.
    pattern: Vec<u8>,
    limit: u64,
    until: Option<StdInstant>,
    amount: Amount,
    to: u64,
    /// The receiver's application buffer.
    placed: Vec<u8>,
    /// This side's counts, published to `shared` in batches (see [`PUBLISH_EVERY`]).
    ulpdus: u64,
    bytes: u64,
    crc: u32,
    /// Bytes received in the current receive pass.
    pass_bytes: u64,
}

/// The sender looks at the clock and publishes its counts once per this many ULPDUs, and
/// the receiver once per receive pass, not per ULPDU: the TCP baseline reads the clock
/// once per poll (up to 64 KiB), and a clock read and a lock per 1.4 KiB ULPDU were 3%
/// of the FPDU client's samples, charged to the MPA path by the harness alone.
const PUBLISH_EVERY: u64 = 64;

impl BenchUlp {
    fn receive(&mut self, ulpdu: &[u8]) {
        // "Placement": copy the ULPDU into the application's memory, as the TCP
        // baseline's receiver copies out of the socket (and as RDMA placement will).
        self.placed.clear();
        self.placed.extend_from_slice(ulpdu);
        self.ulpdus += 1;
        self.bytes += ulpdu.len() as u64;
        self.pass_bytes += ulpdu.len() as u64;
        if self.verify {
            self.crc = crc32c::crc32c_append(self.crc, ulpdu);
        }
    }

    /// Copies this side's counts into `shared`.
    fn publish(&self, c: &mut Counters) {
        c.ulpdus = self.ulpdus;
        c.bytes = self.bytes;
        c.crc = self.crc;
    }
}

impl Ulp for BenchUlp {
    fn on_established(&mut self, info: &Established) {
        if let Amount::Time(d) = self.amount {
            self.until = Some(StdInstant::now() + d);
        }
        self.shared.lock().established = Some(info.clone());
    }

    fn rx_room(&mut self) -> usize {
        usize::MAX / 2
    }

    fn on_ulpdu(&mut self, ulpdu: Vec<u8>) {
        // Not in place (rare: a ULPDU queued behind an MPA event), and possibly outside a
        // receive pass: published at once.
        self.receive(&ulpdu);
        self.rx_done();
    }

    fn on_ulpdu_in_place(&mut self, ulpdu: &[u8]) -> bool {
        self.receive(ulpdu);
        true
    }

    fn rx_done(&mut self) {
        if std::mem::take(&mut self.pass_bytes) == 0 {
            return;
        }
        // The pass's end stands for the time of its ULPDUs (a pass is at most 64 KiB).
        let now = StdInstant::now();
        let mut c = self.shared.lock();
        c.first.get_or_insert(now);
        c.last = Some(now);
        self.publish(&mut c);
    }

    fn poll_ulpdu(&mut self, mulpdu: usize, emit: &mut EmitUlpdu<'_>) -> Result<bool, CallError> {
        if !self.sender {
            return Ok(false);
        }
        if self.ulpdus.is_multiple_of(PUBLISH_EVERY) {
            let time_up = self.until.is_some_and(|u| StdInstant::now() >= u);
            let mut c = self.shared.lock();
            self.publish(&mut c);
            if time_up {
                c.sent_all = true;
            }
            if c.sent_all {
                return Ok(false);
            }
        }
        if self.bytes >= self.limit {
            let mut c = self.shared.lock();
            self.publish(&mut c);
            c.sent_all = true;
            return Ok(false);
        }
        let left = self.limit - self.bytes;
        let len = if left < mulpdu as u64 {
            (left as usize).max(HEADER_LEN + 1)
        } else {
            mulpdu
        };
        let n = len - HEADER_LEN;
        let mut hdr = [0u8; HEADER_LEN];
        hdr[0] = 0xc1; // DDP: tagged, last, version 1
        hdr[1] = 0x40; // RDMAP: version 1, RDMA Write
        hdr[2..6].copy_from_slice(&STAG.to_be_bytes());
        hdr[6..14].copy_from_slice(&self.to.to_be_bytes());
        let off = (self.to % PATTERN_LEN as u64) as usize;
        let payload = &self.pattern[off..off + n];
        emit(&[&hdr, payload])?;
        if self.verify {
            self.crc = crc32c::crc32c_append(self.crc, &hdr);
            self.crc = crc32c::crc32c_append(self.crc, payload);
        }
        self.ulpdus += 1;
        self.bytes += len as u64;
        self.to += n as u64;
        Ok(true)
    }

    fn on_closed(&mut self) {
        self.rx_done();
        let mut c = self.shared.lock();
        self.publish(&mut c);
    }

    fn on_error(&mut self, error: &softiwarp::transport::ConnError) {
        self.shared.lock().error = Some(error.to_string());
    }
}

fn wait_fd(link: &impl Link, ms: u16) {
    let mut fds = [PollFd::new(link.poll_fd(), PollFlags::POLLIN)];
    let _ = poll(&mut fds, PollTimeout::from(ms));
}

/// Runs one side on `link` (up), calling `ready` once the server listens.
///
/// Errors: stack or connection failures, [`BenchError::Timeout`].
pub fn run<L: Link>(
    link: L,
    cfg: &InlineConfig,
    ready: impl FnOnce(),
) -> Result<TransferReport, BenchError> {
    let mtu = link.mtu();
    let epoch = StdInstant::now();
    let now = || Instant::from_micros(epoch.elapsed().as_micros() as i64);
    let mut scfg = StackConfig::new(cfg.iface);
    scfg.tcp = cfg.tcp;
    scfg.mpa.settings.crc = cfg.crc;
    let mut stack = Stack::new(link, scfg, now()).map_err(|e| BenchError::Tcp(e.to_string()))?;
    // Link events once a millisecond, as the device's engine asks (not an epoll_wait per
    // poll; the TCP baseline looks at them only when idle).
    stack.set_link_check_interval(1000);
    let shared = Shared::default();
    let mut pattern = crate::ulpdu::pattern();
    pattern.extend_from_within(..65536);
    let make_ulp = |sender: bool| {
        Box::new(BenchUlp {
            shared: shared.clone(),
            sender,
            verify: cfg.verify,
            pattern: pattern.clone(),
            limit: match cfg.amount {
                Amount::Bytes(n) => n,
                Amount::Time(_) => u64::MAX,
            },
            until: None,
            amount: cfg.amount,
            to: 0,
            placed: Vec::with_capacity(1 << 16),
            ulpdus: 0,
            bytes: 0,
            crc: 0,
            pass_bytes: 0,
        })
    };
    let stack_err = |e: softiwarp::transport::StackError| BenchError::Tcp(e.to_string());
    let mut conn = None;
    match cfg.role {
        Role::Server => {
            stack
                .listen(cfg.server.port(), 1, None)
                .map_err(stack_err)?;
            stack.poll(now());
            ready();
        }
        Role::Client => {
            let params = MpaParams {
                private_data: Vec::new(),
                ird: 1,
                ord: 1,
                settings: None,
            };
            conn = Some(
                stack
                    .connect(cfg.server, params, make_ulp(true), now())
                    .map_err(stack_err)?,
            );
        }
    }
    let deadline = StdInstant::now() + cfg.timeout;
    let mut last_activity = StdInstant::now();
    let mut closing = false;
    let mut established_at = None;
    let ended_at;
    'run: loop {
        let t = now();
        let next = stack.poll(t);
        let mut active = stack.progressed();
        while let Some(ev) = stack.poll_event() {
            active = true;
            match ev {
                StackEvent::ConnectRequest(info) if conn.is_none() => {
                    stack
                        .accept(info.conn, b"", 1, 1, make_ulp(false))
                        .map_err(stack_err)?;
                    conn = Some(info.conn);
                }
                StackEvent::ConnectRequest(info) => {
                    let _ = stack.reject(info.conn, b"");
                }
                StackEvent::Conn { event, .. } => match event {
                    ConnEvent::Established(_) => {
                        established_at = Some(StdInstant::now());
                    }
                    ConnEvent::Disconnected => {}
                    ConnEvent::Closed => {
                        ended_at = Some(StdInstant::now());
                        break 'run;
                    }
                    ConnEvent::Failed(e) => {
                        return Err(BenchError::Tcp(format!("connection failed: {e}")));
                    }
                },
                StackEvent::Link(ev) if !ev.is_up() => {
                    return Err(BenchError::Tcp(format!("link event {ev:?}")));
                }
                StackEvent::Link(_) => {}
            }
        }
        if cfg.role == Role::Client && !closing && shared.lock().sent_all {
            if let Some(c) = conn {
                stack.close(c, CloseMode::Graceful).map_err(stack_err)?;
                closing = true;
                active = true;
            }
        }
        if StdInstant::now() > deadline {
            let c = shared.lock();
            return Err(BenchError::Timeout(
                cfg.timeout,
                format!("{:?}: {} ULPDUs, {} bytes", cfg.role, c.ulpdus, c.bytes),
            ));
        }
        if active {
            last_activity = StdInstant::now();
            continue;
        }
        if last_activity.elapsed() < cfg.spin {
            continue;
        }
        let ms = next.map_or(10, |n| {
            if n > t {
                (n - t).total_millis().min(10)
            } else {
                0
            }
        }) as u16;
        if ms > 0 {
            wait_fd(stack.link(), ms);
        }
    }
    // Let the last ACK leave before the process exits.
    let t = StdInstant::now();
    while t.elapsed() < Duration::from_millis(20) {
        stack.poll(now());
    }
    let c = shared.lock();
    if let Some(e) = &c.error {
        return Err(BenchError::Tcp(e.clone()));
    }
    let est = c
        .established
        .clone()
        .ok_or_else(|| BenchError::Tcp("never established".into()))?;
    let seconds = match cfg.role {
        Role::Server => match (c.first, c.last) {
            (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
            _ => 0.0,
        },
        Role::Client => match (established_at, ended_at) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
            _ => 0.0,
        },
    };
    let dstats = stack.device_stats();
    let (cpu_user, cpu_sys) = crate::cpu_time();
    Ok(TransferReport {
        mode: if est.agreed.crc {
            "fpdu-inline-crc"
        } else {
            "fpdu-inline-nocrc"
        }
        .into(),
        role: cfg.role,
        mtu,
        bytes: c.bytes,
        seconds,
        gbit_per_s: TransferReport::rate(c.bytes, seconds),
        crc32c: cfg.verify.then_some(c.crc),
        tx_frames: dstats.tx_frames,
        rx_frames: dstats.rx_frames,
        cpu_user,
        cpu_sys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use softiwarp::link::{MemoryConfig, MemoryLink};
    use std::net::Ipv4Addr;

    fn iface(n: u8) -> InterfaceConfig {
        InterfaceConfig {
            mac: [0x02, 0, 0, 0, 0, n],
            address: Ipv4Addr::new(10, 9, 0, n),
            prefix_len: 24,
            gateway: None,
            random_seed: u64::from(n),
        }
    }

    fn config(role: Role, n: u8, crc: CrcPolicy, amount: Amount) -> InlineConfig {
        InlineConfig {
            role,
            iface: iface(n),
            server: SocketAddrV4::new(Ipv4Addr::new(10, 9, 0, 1), 7174),
            amount,
            crc,
            tcp: TcpConfig::default(),
            verify: true,
            spin: Duration::from_millis(2),
            timeout: Duration::from_secs(60),
        }
    }

    fn transfer(mtu: usize, crc: CrcPolicy, amount: Amount) -> (TransferReport, TransferReport) {
        let (a, b) = MemoryLink::pair(MemoryConfig {
            mtu,
            ..MemoryConfig::default()
        })
        .unwrap();
        let scfg = config(Role::Server, 1, crc, amount);
        let ccfg = config(Role::Client, 2, crc, amount);
        let (tx, rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || run(a, &scfg, move || tx.send(()).unwrap()));
        rx.recv_timeout(Duration::from_secs(10))
            .expect("server ready");
        let client = run(b, &ccfg, || ()).expect("client");
        (server.join().unwrap().expect("server"), client)
    }

    #[test]
    fn inline_stream_over_a_memory_link_is_complete() {
        let n = 8 << 20;
        let (server, client) = transfer(1500, CrcPolicy::Wanted, Amount::Bytes(n));
        assert_eq!(client.mode, "fpdu-inline-crc");
        assert_eq!(server.mode, "fpdu-inline-crc");
        assert_eq!((client.bytes, server.bytes), (n, n));
        assert_eq!(server.crc32c, client.crc32c);
        assert!(client.crc32c.is_some());
        // One FPDU of MULPDU (1454) bytes per full segment: about n / 1454 data frames.
        let min = n / 1454;
        assert!(
            (min..min + min / 10).contains(&client.tx_frames),
            "{} frames for {min} FPDUs",
            client.tx_frames
        );
    }

    #[test]
    fn inline_stream_without_crc_and_by_time() {
        let (server, client) = transfer(
            9000,
            CrcPolicy::IfPeerAsks,
            Amount::Time(Duration::from_millis(300)),
        );
        assert_eq!(client.mode, "fpdu-inline-nocrc");
        assert!(client.bytes > 0);
        assert_eq!(server.bytes, client.bytes);
        assert_eq!(server.crc32c, client.crc32c);
        assert_eq!(server.mtu, 9000);
    }
}
