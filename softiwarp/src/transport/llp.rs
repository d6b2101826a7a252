//! The LLP socket seam: what one MPA connection's round ([`Conn::service`]) needs of the
//! TCP connection under it (the Lower Layer Protocol of RFC 5044 section 1), so the
//! same connection code runs over smoltcp's socket (this room) and over a kernel TCP
//! socket ([`crate::host`]).
//!
//! The operations are smoltcp's `tcp::Socket` ones, which the connection code was
//! written against; the TCP state is smoltcp's [`tcp::State`] (the RFC 9293 states).
//! A kernel socket emulates them from what its system calls report (see
//! `crate::host::socket`).
//!
//! [`Conn::service`]: super::conn::Conn::service

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::BorrowedFd;

use mpa::negotiate::LocalSettings;
use smoltcp::socket::tcp;
use smoltcp::time::Instant;

use super::neighbor::NeighborReply;
use super::{CloseMode, ConnId, ListenerId, MpaParams, Stack, StackError, StackEvent, Ulp};
use crate::link::{GoneReason, Link};

/// A receive or send on an [`LlpSocket`] that cannot be done: the connection is closed
/// for that direction (smoltcp's `RecvError::Finished` / `SendError::InvalidState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlpClosed;

/// The TCP connection under one MPA connection, as its round sees it. See the [module
/// docs](self).
pub trait LlpSocket {
    /// The TCP state (RFC 9293 section 3.3.2, smoltcp's names).
    fn state(&self) -> tcp::State;
    /// Whether received bytes wait to be read.
    fn can_recv(&self) -> bool;
    /// Received bytes waiting to be read, in octets.
    fn recv_queue(&self) -> usize;
    /// Calls `f` with the received bytes that lie contiguously at the front of the
    /// receive buffer (possibly none); `f` returns how many it consumed and a value,
    /// which is returned. Errors: [`LlpClosed`] when nothing can be received any more.
    fn recv_with<R>(&mut self, f: impl FnOnce(&mut [u8]) -> (usize, R)) -> Result<R, LlpClosed>;
    /// The send buffer's size, in octets.
    fn send_capacity(&self) -> usize;
    /// Octets in the send buffer (queued and, on smoltcp, sent but not acknowledged).
    fn send_queue(&self) -> usize;
    /// Octets written and not yet acknowledged by the peer, wherever they are (the
    /// Terminate linger waits for 0 before the RST, RFC 5040 section 5.3).
    fn unacknowledged(&self) -> usize;
    /// Appends up to `data.len()` octets to the send buffer; returns how many.
    /// Errors: [`LlpClosed`] when the connection cannot send.
    fn send_slice(&mut self, data: &[u8]) -> Result<usize, LlpClosed>;
    /// Calls `f` with the free space at the end of the send buffer (contiguous, possibly
    /// less than all the free space); `f` returns how many octets it wrote and a value,
    /// which is returned. Errors: [`LlpClosed`] when the connection cannot send.
    fn send_with<R>(&mut self, f: impl FnOnce(&mut [u8]) -> (usize, R)) -> Result<R, LlpClosed>;
    /// Whether the connection can still send (established, or the peer closed its side
    /// only).
    fn may_send(&self) -> bool;
    /// Resets the connection (RST; RFC 9293 section 3.10.7.1 ABORT).
    fn abort(&mut self);
    /// Closes this side gracefully (FIN once the send buffer is out; RFC 9293
    /// section 3.10.4 CLOSE).
    fn close(&mut self);
    /// The connection's effective MSS for outgoing segments (EMSS, RFC 9293 section
    /// 3.7.1), in octets, when the socket knows it; `None`: the stack computes it from
    /// the link MTU and the peer's SYN (smoltcp, through the segment tracker).
    fn emss(&self) -> Option<usize>;
    /// Whether the stack's segment tracker follows this socket's segments, so that the
    /// connection keeps one FPDU per TCP segment (RFC 5044 section 4.5; "One FPDU per
    /// TCP segment" in [`crate::transport`]). A kernel socket is not tracked: the
    /// kernel cuts and merges segments as it likes, and the connection writes as many
    /// FPDUs per round as the send buffer takes.
    fn tracked(&self) -> bool;
}

impl LlpSocket for tcp::Socket<'static> {
    fn state(&self) -> tcp::State {
        tcp::Socket::state(self)
    }

    fn can_recv(&self) -> bool {
        tcp::Socket::can_recv(self)
    }

    fn recv_queue(&self) -> usize {
        tcp::Socket::recv_queue(self)
    }

    fn recv_with<R>(&mut self, f: impl FnOnce(&mut [u8]) -> (usize, R)) -> Result<R, LlpClosed> {
        self.recv(f).map_err(|_| LlpClosed)
    }

    fn send_capacity(&self) -> usize {
        tcp::Socket::send_capacity(self)
    }

    fn send_queue(&self) -> usize {
        tcp::Socket::send_queue(self)
    }

    fn unacknowledged(&self) -> usize {
        tcp::Socket::send_queue(self)
    }

    fn send_slice(&mut self, data: &[u8]) -> Result<usize, LlpClosed> {
        tcp::Socket::send_slice(self, data).map_err(|_| LlpClosed)
    }

    fn send_with<R>(&mut self, f: impl FnOnce(&mut [u8]) -> (usize, R)) -> Result<R, LlpClosed> {
        self.send(f).map_err(|_| LlpClosed)
    }

    fn may_send(&self) -> bool {
        tcp::Socket::may_send(self)
    }

    fn abort(&mut self) {
        tcp::Socket::abort(self);
    }

    fn close(&mut self) {
        tcp::Socket::close(self);
    }

    fn emss(&self) -> Option<usize> {
        None
    }

    fn tracked(&self) -> bool {
        true
    }
}

/// The transport of one device as its engine drives it: connections and listeners over
/// one LLP, with MPA and an upper ([`Ulp`]) on each connection. Implemented by the
/// smoltcp [`Stack`] (a TAP, UDP or memory link) and by the host-TCP stack
/// ([`crate::host::HostStack`], kernel TCP sockets on a host interface). Every call has
/// the meaning, the errors and the events of the [`Stack`] method of the same name.
pub trait LlpStack: Send {
    /// [`Stack::listen`].
    fn listen(
        &mut self,
        port: u16,
        backlog: usize,
        settings: Option<LocalSettings>,
    ) -> Result<ListenerId, StackError>;
    /// [`Stack::unlisten`].
    fn unlisten(&mut self, id: ListenerId) -> Result<(), StackError>;
    /// [`Stack::connect`].
    fn connect(
        &mut self,
        remote: SocketAddrV4,
        params: MpaParams,
        upper: Box<dyn Ulp>,
        now: Instant,
    ) -> Result<ConnId, StackError>;
    /// [`Stack::accept`].
    fn accept(
        &mut self,
        conn: ConnId,
        private_data: &[u8],
        ird: u16,
        ord: u16,
        upper: Box<dyn Ulp>,
    ) -> Result<(), StackError>;
    /// [`Stack::reject`].
    fn reject(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), StackError>;
    /// [`Stack::close`].
    fn close(&mut self, conn: ConnId, mode: CloseMode) -> Result<(), StackError>;
    /// [`Stack::poll_rounds`]: the work due at `now` within `max_rounds` connection
    /// rounds; the next deadline.
    fn poll_rounds(&mut self, now: Instant, max_rounds: usize) -> Option<Instant>;
    /// [`Stack::poll_event`].
    fn poll_event(&mut self) -> Option<StackEvent>;
    /// [`Stack::progressed`].
    fn progressed(&self) -> bool;
    /// [`Stack::gone`].
    fn gone(&self) -> Option<GoneReason>;
    /// [`Stack::connection_count`].
    fn connection_count(&self) -> usize;
    /// [`Stack::shutdown`].
    fn shutdown(&mut self, now: Instant);
    /// [`Stack::resolve_neighbor`].
    fn resolve_neighbor(
        &mut self,
        ip: Ipv4Addr,
        timeout_us: u64,
        now: Instant,
        reply: NeighborReply,
    );
    /// [`Stack::set_link_check_interval`].
    fn set_link_check_interval(&mut self, us: u64);
    /// The fd a driver sleeps on: readable when the transport has input (the link's
    /// poll fd; the host stack's epoll fd).
    fn poll_fd(&self) -> BorrowedFd<'_>;
    /// The IP MTU in bytes (the link's; the host interface's).
    fn mtu(&self) -> usize;
}

impl<L: Link + Send> LlpStack for Stack<L> {
    fn listen(
        &mut self,
        port: u16,
        backlog: usize,
        settings: Option<LocalSettings>,
    ) -> Result<ListenerId, StackError> {
        Stack::listen(self, port, backlog, settings)
    }

    fn unlisten(&mut self, id: ListenerId) -> Result<(), StackError> {
        Stack::unlisten(self, id)
    }

    fn connect(
        &mut self,
        remote: SocketAddrV4,
        params: MpaParams,
        upper: Box<dyn Ulp>,
        now: Instant,
    ) -> Result<ConnId, StackError> {
        Stack::connect(self, remote, params, upper, now)
    }

    fn accept(
        &mut self,
        conn: ConnId,
        private_data: &[u8],
        ird: u16,
        ord: u16,
        upper: Box<dyn Ulp>,
    ) -> Result<(), StackError> {
        Stack::accept(self, conn, private_data, ird, ord, upper)
    }

    fn reject(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), StackError> {
        Stack::reject(self, conn, private_data)
    }

    fn close(&mut self, conn: ConnId, mode: CloseMode) -> Result<(), StackError> {
        Stack::close(self, conn, mode)
    }

    fn poll_rounds(&mut self, now: Instant, max_rounds: usize) -> Option<Instant> {
        Stack::poll_rounds(self, now, max_rounds)
    }

    fn poll_event(&mut self) -> Option<StackEvent> {
        Stack::poll_event(self)
    }

    fn progressed(&self) -> bool {
        Stack::progressed(self)
    }

    fn gone(&self) -> Option<GoneReason> {
        Stack::gone(self)
    }

    fn connection_count(&self) -> usize {
        Stack::connection_count(self)
    }

    fn shutdown(&mut self, now: Instant) {
        Stack::shutdown(self, now);
    }

    fn resolve_neighbor(
        &mut self,
        ip: Ipv4Addr,
        timeout_us: u64,
        now: Instant,
        reply: NeighborReply,
    ) {
        Stack::resolve_neighbor(self, ip, timeout_us, now, reply);
    }

    fn set_link_check_interval(&mut self, us: u64) {
        Stack::set_link_check_interval(self, us);
    }

    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.link().poll_fd()
    }

    fn mtu(&self) -> usize {
        self.link().mtu()
    }
}
