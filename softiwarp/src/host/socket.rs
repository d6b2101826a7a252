//! A kernel TCP socket as an [`LlpSocket`]: the connection under one MPA connection of
//! a host-TCP device ([`crate::host`]).
//!
//! The socket is non-blocking. Received bytes are read into a buffer of the
//! connection's own ([`KernelSock::fill`]), where the MPA deframer checks and places
//! them in place, as it does in smoltcp's receive buffer; FPDUs are framed into a send
//! buffer of the connection's own and written to the kernel in one `write(2)` per round
//! ([`KernelSock::flush`]), so several FPDUs go in one system call (Linux siw writes
//! them with `MSG_MORE` set while more follow; one write of all of them gives the
//! kernel the same chance to fill segments).
//!
//! Readiness is edge-triggered (`EPOLLET`): [`KernelSock::on_ready`] records what the
//! device's epoll reported, and the socket is read or written only when the kernel said
//! it may be, so an idle connection costs no system call.
//!
//! The TCP state ([`tcp::State`]) is emulated from what the system calls reported:
//! `SynSent` until the non-blocking connect completes; `Established`; `CloseWait` once a
//! read returned end of stream (every byte before the peer's FIN is then in the buffer);
//! `FinWait1` after this side's `shutdown(SHUT_WR)`; `TimeWait` when both FINs are
//! through (the kernel keeps the real TIME-WAIT); `Closed` after an error (refused,
//! reset, timed out) or an abort.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddrV4, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use nix::sys::socket::{getsockopt, setsockopt, sockopt};
use smoltcp::socket::tcp;

use super::sys::kernel_outq;
use crate::transport::llp::{LlpClosed, LlpSocket};
use crate::transport::smoltcp_glue::TcpConfig;

/// A byte buffer read from the front and written at the back, compacted when the back
/// runs out of room.
#[derive(Debug)]
struct Buf {
    data: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Buf {
    fn new(cap: usize) -> Buf {
        Buf {
            data: vec![0u8; cap].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    fn len(&self) -> usize {
        self.end - self.start
    }

    fn cap(&self) -> usize {
        self.data.len()
    }

    /// Moves the bytes to the front so the free space is contiguous.
    fn compact(&mut self) {
        if self.start > 0 {
            self.data.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }
}

/// One kernel TCP connection with its receive and send buffers. See the [module
/// docs](self).
#[derive(Debug)]
pub(crate) struct KernelSock {
    stream: Option<TcpStream>,
    rx: Buf,
    tx: Buf,
    connecting: bool,
    /// The kernel reported input (or an error) since the last read that came back short.
    readable: bool,
    /// The kernel takes more bytes (no `EAGAIN` since the last `EPOLLOUT`).
    writable: bool,
    /// A read returned end of stream.
    peer_fin: bool,
    /// `close` was asked: `shutdown(SHUT_WR)` once the send buffer is out.
    fin_wanted: bool,
    fin_sent: bool,
    emss: Option<usize>,
}

impl KernelSock {
    /// A socket around `stream` (non-blocking), connecting (`connecting`: a connect in
    /// progress) or established, with buffers of `cfg.rx_buffer` and `cfg.tx_buffer`
    /// bytes; applies `cfg`'s Nagle, keep-alive and user timeout to the kernel socket
    /// (`TCP_NODELAY`, `SO_KEEPALIVE` + `TCP_KEEPIDLE`/`TCP_KEEPINTVL`,
    /// `TCP_USER_TIMEOUT`). Options the kernel refuses are logged and skipped.
    pub(crate) fn new(stream: TcpStream, connecting: bool, cfg: &TcpConfig) -> KernelSock {
        apply_options(&stream, cfg);
        let mut s = KernelSock {
            stream: Some(stream),
            rx: Buf::new(cfg.rx_buffer),
            tx: Buf::new(cfg.tx_buffer),
            connecting,
            readable: !connecting,
            writable: !connecting,
            peer_fin: false,
            fin_wanted: false,
            fin_sent: false,
            emss: None,
        };
        if !connecting {
            s.established();
        }
        s
    }

    fn established(&mut self) {
        self.connecting = false;
        self.emss = self
            .stream
            .as_ref()
            .and_then(|st| getsockopt(st, sockopt::TcpMaxSeg).ok())
            .and_then(|m| usize::try_from(m).ok())
            .filter(|&m| m > 0);
    }

    /// The socket's fd, while it is open (for the device's epoll set).
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.stream.as_ref().map(AsFd::as_fd)
    }

    /// The local address the kernel gave the connection.
    pub(crate) fn local_addr(&self) -> Option<SocketAddrV4> {
        match self.stream.as_ref()?.local_addr().ok()? {
            std::net::SocketAddr::V4(a) => Some(a),
            std::net::SocketAddr::V6(_) => None,
        }
    }

    /// Records readiness from the device's epoll (`EPOLLIN`/`EPOLLRDHUP`/`EPOLLHUP`:
    /// readable; `EPOLLOUT`: writable, which also completes a connect; `EPOLLERR`: both,
    /// so the next read or write reports the error).
    pub(crate) fn on_ready(&mut self, readable: bool, writable: bool, error: bool) {
        if readable || error {
            self.readable = true;
        }
        if writable || error {
            self.writable = true;
        }
        if self.connecting && (writable || error) {
            let so_error = self
                .stream
                .as_ref()
                .and_then(|st| getsockopt(st, sockopt::SocketError).ok())
                .unwrap_or(libc::ECONNREFUSED);
            if so_error == 0 {
                self.established();
            } else {
                self.fail(io::Error::from_raw_os_error(so_error));
            }
        }
    }

    /// Whether a read may find bytes.
    pub(crate) fn wants_read(&self) -> bool {
        self.readable && !self.connecting && self.stream.is_some() && !self.peer_fin
    }

    /// The connection ended with `e` (refused, reset, timed out): the fd is closed and
    /// the state is `Closed` from now on.
    fn fail(&mut self, e: io::Error) {
        tracing::debug!(error = %e, "kernel TCP connection ended");
        self.connecting = false;
        self.stream = None;
    }

    /// Reads what the kernel has into the receive buffer, until the buffer is full or
    /// the kernel has no more (a short read). Returns the bytes read.
    pub(crate) fn fill(&mut self) -> usize {
        let mut total = 0;
        while self.wants_read() {
            if self.rx.end == self.rx.cap() {
                self.rx.compact();
                if self.rx.end == self.rx.cap() {
                    break;
                }
            }
            let Some(stream) = self.stream.as_mut() else {
                break;
            };
            let want = self.rx.cap() - self.rx.end;
            match stream.read(&mut self.rx.data[self.rx.end..]) {
                Ok(0) => {
                    self.peer_fin = true;
                    self.readable = false;
                }
                Ok(n) => {
                    self.rx.end += n;
                    total += n;
                    if n < want {
                        // Drained for now: the next input raises a new edge.
                        self.readable = false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.readable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => self.fail(e),
            }
        }
        total
    }

    /// Writes the send buffer to the kernel while it takes bytes, then sends the FIN if
    /// a close waits for it. Returns the bytes written.
    pub(crate) fn flush(&mut self) -> usize {
        let mut total = 0;
        while self.tx.len() > 0 && self.writable {
            let Some(stream) = self.stream.as_mut() else {
                break;
            };
            match stream.write(&self.tx.data[self.tx.start..self.tx.end]) {
                Ok(0) => self.writable = false,
                Ok(n) => {
                    self.tx.consume(n);
                    total += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.writable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail(e);
                    self.tx = Buf::new(0);
                }
            }
        }
        if self.fin_wanted && !self.fin_sent && self.tx.len() == 0 {
            if let Some(stream) = self.stream.as_ref() {
                if let Err(e) = stream.shutdown(Shutdown::Write) {
                    self.fail(e);
                }
            }
            self.fin_sent = true;
        }
        total
    }
}

impl LlpSocket for KernelSock {
    fn state(&self) -> tcp::State {
        use tcp::State as T;
        if self.stream.is_none() {
            return T::Closed;
        }
        if self.connecting {
            return T::SynSent;
        }
        match (self.fin_sent, self.peer_fin) {
            (false, false) => T::Established,
            (false, true) => T::CloseWait,
            (true, false) => T::FinWait1,
            (true, true) => T::TimeWait,
        }
    }

    fn can_recv(&self) -> bool {
        self.rx.len() > 0
    }

    fn recv_queue(&self) -> usize {
        self.rx.len()
    }

    fn recv_with<R>(&mut self, f: impl FnOnce(&mut [u8]) -> (usize, R)) -> Result<R, LlpClosed> {
        if self.rx.len() == 0 && (self.peer_fin || self.stream.is_none()) {
            return Err(LlpClosed);
        }
        let (n, r) = f(&mut self.rx.data[self.rx.start..self.rx.end]);
        self.rx.consume(n);
        Ok(r)
    }

    fn send_capacity(&self) -> usize {
        self.tx.cap()
    }

    fn send_queue(&self) -> usize {
        self.tx.len()
    }

    fn unacknowledged(&self) -> usize {
        let Some(stream) = self.stream.as_ref() else {
            return 0;
        };
        self.tx.len() + kernel_outq(stream.as_raw_fd())
    }

    fn send_slice(&mut self, data: &[u8]) -> Result<usize, LlpClosed> {
        self.send_with(|buf| {
            let n = buf.len().min(data.len());
            buf[..n].copy_from_slice(&data[..n]);
            (n, n)
        })
    }

    fn send_with<R>(&mut self, f: impl FnOnce(&mut [u8]) -> (usize, R)) -> Result<R, LlpClosed> {
        if !self.may_send() {
            return Err(LlpClosed);
        }
        if self.tx.end == self.tx.cap() || self.tx.start > self.tx.cap() / 2 {
            self.tx.compact();
        }
        let end = self.tx.end;
        let (n, r) = f(&mut self.tx.data[end..]);
        self.tx.end = (end + n).min(self.tx.cap());
        Ok(r)
    }

    fn may_send(&self) -> bool {
        self.stream.is_some() && !self.connecting && !self.fin_wanted
    }

    fn abort(&mut self) {
        if let Some(stream) = self.stream.take() {
            // SO_LINGER with a zero timeout: close(2) sends a RST (socket(7)).
            let _ = setsockopt(
                &stream,
                sockopt::Linger,
                &libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                },
            );
            drop(stream);
        }
        self.connecting = false;
    }

    fn close(&mut self) {
        self.fin_wanted = true;
        self.flush();
    }

    fn emss(&self) -> Option<usize> {
        self.emss
    }

    fn tracked(&self) -> bool {
        false
    }
}

/// Sets Nagle, keep-alive and the user timeout on a kernel socket.
fn apply_options(stream: &TcpStream, cfg: &TcpConfig) {
    let secs = |d: std::time::Duration| u32::try_from(d.as_secs().max(1)).unwrap_or(u32::MAX);
    let mut failed = Vec::new();
    if setsockopt(stream, sockopt::TcpNoDelay, &!cfg.nagle).is_err() {
        failed.push("TCP_NODELAY");
    }
    if let Some(k) = cfg.keep_alive {
        if setsockopt(stream, sockopt::KeepAlive, &true).is_err()
            || setsockopt(stream, sockopt::TcpKeepIdle, &secs(k)).is_err()
            || setsockopt(stream, sockopt::TcpKeepInterval, &secs(k)).is_err()
        {
            failed.push("keep-alive");
        }
    }
    if let Some(t) = cfg.timeout {
        let ms = u32::try_from(t.as_millis()).unwrap_or(u32::MAX);
        if setsockopt(stream, sockopt::TcpUserTimeout, &ms).is_err() {
            failed.push("TCP_USER_TIMEOUT");
        }
    }
    if !failed.is_empty() {
        tracing::warn!(?failed, "the kernel refused TCP options");
    }
}
