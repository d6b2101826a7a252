//! The hostile peer of the root-only `iwperf_hostile*` tests: ordinary kernel TCP
//! sockets (std::net) in namespace B, from a kernel address on B's bridge
//! ([`netlab::Topology::add_kernel_address`]), aimed at an `iwperf server` whose
//! smoltcp stack owns 10.234.0.1 on A's TAP, as an attacker on the network would do it
//! (docs/ARCHITECTURE.md, "Hostile peers").
//!
//! Two kinds of attacker:
//!
//! - Floods: [`open_flood`] opens many TCP connections as fast as it can (several
//!   threads, each having entered the namespace with `setns(2)`), which then never send
//!   or dribble an MPA Request a byte at a time ([`Held`]).
//! - [`MpaPeer`]: one connection that speaks MPA itself, built from the `mpa` and
//!   `ddp-rdmap` crates' emitters: the Request (RFC 5044 section 7.1.1, RFC 6581
//!   enhanced mode with the IRD/ORD word, C set, iwperf's test parameters as private
//!   data), FPDUs with a right or a wrong CRC, and it reads the Reply, FPDUs (the
//!   Terminate) and how the server closes.

#![allow(dead_code)]

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use bench::iwperf::wire::{AcceptInfo, Mode, MrInfo, Op, TestParams};
use ddp_rdmap::ddp::BufferModel;
use ddp_rdmap::terminate::{Offending, Repr as TerminateRepr};
use ddp_rdmap::{Body, ErrorCause, Header, Opcode, Ulpdu};
use mpa::deframer::{CrcStatus, Deframer, DeframerConfig};
use mpa::fpdu::{Framer, Framing};
use mpa::negotiate::{self, CrcPolicy, LocalSettings};
use mpa::wire::{Limits, Repr, HEADER_LEN, REPLY_KEY};
use netlab::netns::NetNs;
use nix::sys::socket::{
    setsockopt, socket, sockopt, AddressFamily, SockFlag, SockProtocol, SockType,
};
use nix::sys::time::TimeVal;

/// iwperf's TCP port (`iwperf server --port`'s default).
pub const PORT: u16 = bench::iwperf::demo::IWARP_PORT;

/// The framing both directions use with an `iwperf server`: CRC on (it sets C), no
/// Markers.
pub const FRAMING: Framing = Framing {
    crc: true,
    markers: false,
};

/// Runs `f` on `threads` threads that have each entered `ns` (`setns(2)`: their
/// sockets are that namespace's) and returns their results in order.
///
/// Panics if a thread cannot enter the namespace or panicked.
pub fn in_netns<T, F>(ns: &NetNs, threads: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> T + Send + Sync + 'static,
{
    let f = Arc::new(f);
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let f = Arc::clone(&f);
            ns.spawn(move || f(i))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .expect("attacker thread panicked")
                .expect("enter the namespace")
        })
        .collect()
}

/// What a flood connection does once it is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Never sends anything.
    Silent,
    /// Sends its MPA Request one byte at a time (see [`Held::dribble`]), never all.
    Dribble,
}

/// The connections a flood holds open.
#[derive(Debug, Default)]
pub struct Held {
    /// Each connection with its behaviour and how many Request bytes it has sent.
    pub conns: Vec<(TcpStream, Behaviour, usize)>,
    /// Connection attempts refused (RST to the SYN) or timed out.
    pub refused: usize,
}

impl Held {
    /// Sends the next byte of an MPA Request on every dribbling connection still open
    /// (never the last byte, so the Request is never complete), and drops the
    /// connections the server has closed (a failed write, or EOF / reset on a
    /// non-blocking read). Returns how many are still open.
    pub fn dribble(&mut self, request: &[u8]) -> usize {
        self.conns.retain_mut(|(s, how, sent)| {
            if !alive(s) {
                return false;
            }
            if *how == Behaviour::Dribble && *sent + 1 < request.len() {
                if s.write_all(&request[*sent..*sent + 1]).is_err() {
                    return false;
                }
                *sent += 1;
            }
            true
        });
        self.conns.len()
    }

    /// Drops the connections the server has closed; returns how many are still open.
    pub fn prune(&mut self) -> usize {
        self.conns.retain(|(s, _, _)| alive(s));
        self.conns.len()
    }
}

/// False once the peer has closed or reset `s` (a non-blocking peek sees EOF or an
/// error); true while it is open and quiet (or has sent data, which a server here never
/// does on a connection whose Request is incomplete).
fn alive(s: &TcpStream) -> bool {
    let _ = s.set_nonblocking(true);
    let mut b = [0u8; 1];
    let open = match s.peek(&mut b) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => e.kind() == ErrorKind::WouldBlock,
    };
    let _ = s.set_nonblocking(false);
    open
}

/// Opens `n` TCP connections to `server` from `threads` threads in namespace `ns`, as
/// fast as the server answers (each attempt waits at most `connect_timeout`); the
/// first half of each thread's share stay silent, the rest dribble. Returns what is
/// held (the refused attempts counted).
pub fn open_flood(
    ns: &NetNs,
    server: SocketAddrV4,
    n: usize,
    threads: usize,
    connect_timeout: Duration,
) -> Held {
    let parts = in_netns(ns, threads, move |t| {
        let share = n / threads + usize::from(t < n % threads);
        let mut held = Held::default();
        for i in 0..share {
            let how = if i < share / 2 {
                Behaviour::Silent
            } else {
                Behaviour::Dribble
            };
            match TcpStream::connect_timeout(&SocketAddr::V4(server), connect_timeout) {
                Ok(s) => held.conns.push((s, how, 0)),
                Err(_) => held.refused += 1,
            }
        }
        held
    });
    let mut all = Held::default();
    for mut p in parts {
        all.conns.append(&mut p.conns);
        all.refused += p.refused;
    }
    all
}

/// Iwperf test parameters for one connection of a Send bandwidth test of `qps`
/// connections (what the attacker's Request carries so that the server accepts it).
pub fn send_params(qps: u16, index: u16) -> TestParams {
    TestParams {
        op: Op::Send,
        mode: Mode::Bandwidth,
        verify: false,
        size: 64,
        qps,
        index,
        tx_depth: 4,
        client_mr: MrInfo::default(),
        rd_depth: 0,
    }
}

/// The MPA Request an `iwperf client` would send: Rev 2 with the enhanced bit and the
/// IRD/ORD word (RFC 6581 section 5), C set (RFC 5044 section 7.1.1), no Markers,
/// `private_data` after the IRD/ORD word.
pub fn request_bytes(private_data: &[u8]) -> Vec<u8> {
    let local = LocalSettings {
        crc: CrcPolicy::Wanted,
        private_data: private_data.to_vec(),
        ..LocalSettings::default()
    };
    negotiate::request(&local)
        .expect("valid settings")
        .to_bytes()
        .expect("emit the Request")
}

/// How the server ended a connection, as the attacker's socket sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// A FIN: reads return 0.
    Fin,
    /// A reset (`ECONNRESET`).
    Reset,
    /// Still open when the wait ended.
    Open,
}

/// An attacker connection that speaks MPA over a kernel socket.
#[derive(Debug)]
pub struct MpaPeer {
    /// The socket.
    pub stream: TcpStream,
    /// Bytes received and not yet taken.
    buf: Vec<u8>,
    /// The FPDU framer of this side's direction (created once the Reply is in).
    framer: Framer,
    /// The deframer of the server's direction.
    deframer: Deframer,
    /// ULPDUs deframed and not yet taken, with their CRC status.
    ulpdus: Vec<(Vec<u8>, CrcStatus)>,
}

impl MpaPeer {
    /// Connects to `server` (the calling thread must be in the attacker's namespace).
    ///
    /// Errors: the connection attempt's.
    pub fn connect(server: SocketAddrV4) -> io::Result<MpaPeer> {
        let stream = TcpStream::connect_timeout(&SocketAddr::V4(server), Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        Ok(MpaPeer {
            stream,
            buf: Vec::new(),
            framer: Framer::new(FRAMING),
            deframer: Deframer::new(DeframerConfig::new(FRAMING)),
            ulpdus: Vec::new(),
        })
    }

    /// Sends raw bytes.
    ///
    /// Panics if the write fails.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("attacker write");
    }

    /// Reads until `pred(buffered bytes)` holds, EOF, a reset or `timeout`. Returns how
    /// the connection stands ([`Closed::Open`] when `pred` held first).
    fn read_until(&mut self, timeout: Duration, pred: impl Fn(&[u8]) -> bool) -> Closed {
        let deadline = Instant::now() + timeout;
        let mut chunk = [0u8; 4096];
        while !pred(&self.buf) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Closed::Open;
            }
            self.stream
                .set_read_timeout(Some(left))
                .expect("read timeout");
            match self.stream.read(&mut chunk) {
                Ok(0) => return Closed::Fin,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Closed::Reset,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => panic!("attacker read: {e}"),
            }
        }
        Closed::Open
    }

    /// Reads the server's Reply frame (key, flags, Rev, PD_Length and private data)
    /// and returns its raw bytes; bytes behind it stay buffered as FPDU data.
    ///
    /// Panics if the connection ends or `timeout` passes first.
    pub fn read_reply_bytes(&mut self, timeout: Duration) -> Vec<u8> {
        let len = |b: &[u8]| {
            (b.len() >= HEADER_LEN)
                .then(|| HEADER_LEN + usize::from(u16::from_be_bytes([b[18], b[19]])))
        };
        let end = self.read_until(timeout, |b| len(b).is_some_and(|l| b.len() >= l));
        let l = len(&self.buf)
            .filter(|l| self.buf.len() >= *l)
            .unwrap_or_else(|| panic!("no whole Reply ({end:?}): {:02x?}", self.buf));
        self.buf.drain(..l).collect()
    }

    /// Sends the Request with `private_data` (see [`request_bytes`]) and reads the
    /// Reply; returns it parsed.
    ///
    /// Panics if no valid Reply arrives within 10 s.
    pub fn handshake(&mut self, private_data: &[u8]) -> Repr {
        self.send_raw(&request_bytes(private_data));
        let raw = self.read_reply_bytes(Duration::from_secs(10));
        Repr::parse_bytes(&raw, &Limits::default())
            .unwrap_or_else(|e| panic!("bad Reply {raw:02x?}: {e}"))
            .0
    }

    /// Sends `ulpdu` as one FPDU (CRC on); with `corrupt_crc` the CRC field is wrong
    /// (its last byte flipped).
    pub fn send_ulpdu(&mut self, ulpdu: &[u8], corrupt_crc: bool) {
        let mut out = Vec::new();
        self.framer
            .append(ulpdu, &mut out)
            .expect("frame the ULPDU");
        if corrupt_crc {
            *out.last_mut().expect("an FPDU") ^= 0xff;
        }
        self.send_raw(&out);
    }

    /// Deframes what is buffered into [`MpaPeer::ulpdus`].
    fn deframe(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let mut got = Vec::new();
        let used = self.deframer.feed(&buf, |r| {
            let f = r.expect("the server's FPDU stream deframes");
            got.push((f.ulpdu.to_vec(), f.crc));
        });
        self.buf = buf[used..].to_vec();
        self.ulpdus.append(&mut got);
    }

    /// Waits up to `timeout` for the next whole FPDU from the server; returns its ULPDU
    /// and CRC status, or how the connection ended first.
    pub fn next_ulpdu(&mut self, timeout: Duration) -> Result<(Vec<u8>, CrcStatus), Closed> {
        let deadline = Instant::now() + timeout;
        loop {
            self.deframe();
            if !self.ulpdus.is_empty() {
                return Ok(self.ulpdus.remove(0));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Closed::Open);
            }
            let before = self.buf.len();
            match self.read_until(left, |b| b.len() > before) {
                Closed::Open => {}
                end => {
                    self.deframe();
                    return if self.ulpdus.is_empty() {
                        Err(end)
                    } else {
                        Ok(self.ulpdus.remove(0))
                    };
                }
            }
        }
    }

    /// Waits up to `timeout` for the server to end the connection; returns how it did
    /// and any bytes that came before the end.
    pub fn wait_closed(&mut self, timeout: Duration) -> (Closed, Vec<u8>) {
        let end = self.read_until(timeout, |_| false);
        (end, std::mem::take(&mut self.buf))
    }

    /// Ends the connection from this side (FIN).
    pub fn close(self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Ends the connection from this side with a reset (`SO_LINGER` 0, then close).
    pub fn reset(self) {
        let linger = nix::libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        setsockopt(&self.stream, sockopt::Linger, &linger).expect("SO_LINGER");
        drop(self.stream);
    }
}

/// Samples the resident set size of process `pid` (`VmRSS` of `/proc/PID/status`,
/// KiB) every `every` on a thread, keeping the largest value, until the returned guard
/// is stopped.
#[derive(Debug)]
pub struct RssPeak {
    peak: Arc<Mutex<(u64, bool)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// `VmRSS` of process `pid` in KiB, or `None` once it has exited.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

impl RssPeak {
    /// Starts sampling `pid` every `every`.
    pub fn start(pid: u32, every: Duration) -> RssPeak {
        let peak = Arc::new(Mutex::new((0u64, false)));
        let p = Arc::clone(&peak);
        let thread = std::thread::spawn(move || loop {
            let rss = vm_rss_kib(pid).unwrap_or(0);
            {
                let mut g = p.lock().expect("rss lock");
                g.0 = g.0.max(rss);
                if g.1 {
                    return;
                }
            }
            std::thread::sleep(every);
        });
        RssPeak {
            peak,
            thread: Some(thread),
        }
    }

    /// Stops sampling; returns the largest `VmRSS` seen, KiB.
    pub fn stop(mut self) -> u64 {
        self.peak.lock().expect("rss lock").1 = true;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let peak = self.peak.lock().expect("rss lock").0;
        peak
    }
}

/// Iwperf test parameters for connection `index` of a Write bandwidth test of `qps`
/// connections, unverified (the server posts no data receives for it, only its
/// control receives).
pub fn write_params(qps: u16, index: u16) -> TestParams {
    TestParams {
        op: Op::Write,
        ..send_params(qps, index)
    }
}

/// The ULPDU of a one-segment RDMA Write of `payload` to `stag` at tagged offset `to`
/// (RFC 5040 section 4.3; DDP tagged, L set).
pub fn write_ulpdu(stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    ulpdu(Opcode::Write, BufferModel::Tagged { stag, to }, payload)
}

/// The ULPDU of a one-segment Send with Invalidate naming `stag` (RFC 5040 section
/// 4.6: the Invalidate STag in DDP's RsvdULP word; untagged, QN 0, MSN `msn`, MO 0).
pub fn send_invalidate_ulpdu(stag: u32, msn: u32, payload: &[u8]) -> Vec<u8> {
    let buffer = BufferModel::Untagged {
        rsvd_ulp: stag,
        qn: 0,
        msn,
        mo: 0,
    };
    ulpdu(Opcode::SendInvalidate, buffer, payload)
}

fn ulpdu(opcode: Opcode, buffer: BufferModel, payload: &[u8]) -> Vec<u8> {
    let header = Header {
        opcode,
        last: true,
        buffer,
    };
    let mut out = header.to_bytes().expect("header")[..header.buffer_len()].to_vec();
    out.extend_from_slice(payload);
    out
}

/// The Terminate ULPDU a responder sends for `cause` (the first message of its
/// Terminate queue, MSN 1), with the offending segment's DDP header copied when
/// `offending` is given (RFC 5040 section 4.8), as `ddp-rdmap` emits it.
pub fn terminate_ulpdu(cause: ErrorCause, offending: Option<&[u8]>) -> Vec<u8> {
    let mut t = Ulpdu::terminate(cause, 1);
    t.body = Body::Terminate(TerminateRepr::for_error(
        cause,
        offending.map(|bytes| Offending {
            ulpdu_len: u16::try_from(bytes.len()).expect("short ULPDU"),
            bytes,
        }),
    ));
    let mut out = vec![0u8; t.buffer_len()];
    t.emit(&mut out).expect("emit the Terminate");
    out
}

/// Sniffs every frame namespace `ns` sees (an `AF_PACKET` socket on all its
/// interfaces, as an attacker on the legitimate client's layer-2 segment can) for an
/// MPA Reply sent to `client` that accepts and carries iwperf's [`AcceptInfo`] (the
/// server's buffer: iova, STag, length); returns it, or `None` after `timeout`. The
/// returned receiver gets `()` once the socket is open, so the caller can start the
/// connection to watch after it.
///
/// iWARP has no encryption: the STag a responder hands out in its Reply is on the wire
/// in clear. An attacker off the path has to guess it: 32 bits (a random 24-bit
/// index and an 8-bit key fresh per registration).
pub fn sniff_accept(
    ns: &NetNs,
    client: Ipv4Addr,
    timeout: Duration,
) -> (
    std::thread::JoinHandle<io::Result<Option<AcceptInfo>>>,
    mpsc::Receiver<()>,
) {
    let (ready_tx, ready_rx) = mpsc::channel();
    let handle = ns.spawn(move || {
        let fd = socket(
            AddressFamily::Packet,
            SockType::Raw,
            SockFlag::empty(),
            SockProtocol::EthAll,
        )
        .expect("AF_PACKET socket");
        setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(0, 100_000)).expect("SO_RCVTIMEO");
        let _ = ready_tx.send(());
        let deadline = Instant::now() + timeout;
        let mut frame = vec![0u8; 65536];
        while Instant::now() < deadline {
            let Ok(n) = nix::unistd::read(&fd, &mut frame) else {
                continue;
            };
            if let Some(info) = accept_in_frame(&frame[..n], client) {
                return Some(info);
            }
        }
        None
    });
    (handle, ready_rx)
}

/// The [`AcceptInfo`] of an accepting MPA Reply in Ethernet `frame` (IPv4, TCP) sent
/// to `client`, if the frame holds one.
fn accept_in_frame(frame: &[u8], client: Ipv4Addr) -> Option<AcceptInfo> {
    // Ethernet (14 bytes), IPv4 with its destination at 16..20.
    if frame.len() < 34
        || frame[12..14] != [0x08, 0x00]
        || frame[14 + 16..14 + 20] != client.octets()
    {
        return None;
    }
    let at = frame
        .windows(REPLY_KEY.len())
        .position(|w| w == REPLY_KEY)?;
    let (reply, _) = Repr::parse_bytes(&frame[at..], &Limits::default()).ok()?;
    if reply.reject {
        return None;
    }
    AcceptInfo::decode(&reply.private_data).ok()
}
