//! One connection ([`Conn`]): its TCP socket, its [`MpaConn`], its upper layer, and
//! [`Conn::service`], one round of work on it (see "A connection" in the [module
//! docs](super)).

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};

use ddp_rdmap::terminate::ErrorCause;
use ddp_rdmap::{ulpdu, Header, Ulpdu};
use mpa::negotiate::LocalSettings;
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{IpAddress, IpEndpoint};

use super::llp::LlpSocket;
use super::mpa_conn::{InitialMsn, LlpClose, MpaConfig, MpaConn, MpaError, MpaEvent, Role, State};
use super::seg_tracker::{tuple_key, SegTracker};
use super::smoltcp_glue::mss_for_mtu;
use super::Listener;
use super::{
    ConnError, ConnEvent, ConnId, ConnectRequestInfo, Established, ListenerId, RxHook, StackConfig,
    StackError, StackEvent, StackStats, TimeoutPhase, Ulp, MAX_HELD_ULPDUS, RX_CHUNK,
};

/// Where a connection is in its life, as far as the stack's bookkeeping goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Life {
    /// Being serviced.
    Active,
    /// Final event given (or never visible); waiting for the socket to finish (RST sent,
    /// TIME-WAIT over) before removal.
    Zombie {
        /// When the reaper first saw it a zombie (`Stack::reap` sets it; a socket
        /// that cannot send its RST is dropped [`ZOMBIE_LINGER_MS`](super::ZOMBIE_LINGER_MS)
        /// after it).
        since: Option<Instant>,
    },
}

impl Life {
    /// A zombie not yet seen by the reaper.
    pub(crate) const ZOMBIE: Life = Life::Zombie { since: None };

    /// Whether the connection is a zombie.
    pub(crate) fn is_zombie(self) -> bool {
        matches!(self, Life::Zombie { .. })
    }
}

/// How far a connection's abort (RST, `tcp::Socket::abort`) has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Abort {
    /// None asked for.
    No,
    /// Asked for (a user close, its listener removed, an error): the next service of
    /// the connection aborts the socket.
    Asked,
    /// The socket was aborted, or closed for good: nothing more goes out.
    Done,
}

/// The user's close of a connection ([`Stack::close`](super::Stack::close)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalClose {
    /// Not asked for.
    No,
    /// Asked for (graceful or abortive): the final event is [`ConnEvent::Closed`]
    /// unless a failure came first, and the peer's FIN is not reported.
    Asked,
    /// A graceful close asked in full operation: MPA closes once the upper's queue is
    /// empty (`Conn::finish_close`), then it is `Asked`.
    Draining,
}

/// A Terminate on its way out (RFC 5040 5.3): the socket is reset once it is
/// acknowledged, or when the linger ends ([`Timer::Linger`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TerminateOut {
    /// None queued.
    No,
    /// The stack queued one after an MPA error.
    Queued,
    /// The upper sent one ([`Ulp::poll_terminate`]): the connection aborts once it is out.
    FromUpper,
}

/// The connection's own pending deadline, besides MPA's timers and smoltcp's (as
/// smoltcp's `tcp::Timer`): at most one is pending, since the connect deadline ends when
/// TCP is established and the linger starts only once MPA runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// Nothing timed.
    Idle,
    /// An initiator's TCP must be established by `deadline`
    /// ([`StackConfig::connect_timeout_us`] after [`Stack::connect`](super::Stack::connect)),
    /// else the connection fails with [`TimeoutPhase::TcpConnect`].
    Connect {
        /// When the connect times out.
        deadline: Instant,
    },
    /// A queued Terminate gets until `until` to be acknowledged
    /// ([`StackConfig::terminate_linger_us`]); then the RST goes anyway.
    Linger {
        /// When the RST goes.
        until: Instant,
    },
}

pub(crate) struct Conn<H = SocketHandle> {
    pub(crate) id: ConnId,
    /// The socket's handle in the stack's socket set (smoltcp), or `()` where the
    /// stack keeps the socket beside the connection (`crate::host`).
    pub(crate) handle: H,
    pub(crate) role: Role,
    pub(crate) key: u64,
    pub(crate) local: SocketAddrV4,
    pub(crate) remote: SocketAddrV4,
    pub(crate) listener: Option<ListenerId>,
    pub(crate) settings: LocalSettings,
    /// `debug` span of this connection (id, role, peer), entered while it is serviced.
    pub(crate) span: tracing::Span,
    pub(crate) connect_started: Instant,
    /// The pending connect or Terminate linger deadline.
    pub(crate) timer: Timer,
    pub(crate) mpa: Option<MpaConn>,
    pub(crate) upper: Option<Box<dyn Ulp>>,
    pub(crate) emss: usize,
    pub(crate) life: Life,
    /// The user knows of this connection (initiator; responder after ConnectRequest).
    pub(crate) visible: bool,
    /// Counts against its listener's backlog (its ConnectRequest was reported and is
    /// not yet decided).
    pub(crate) in_backlog: bool,
    /// In its listener's half-open pool (responder, MPA Request not yet valid).
    pub(crate) half_open: bool,
    /// The final event was given ([`ConnEvent::Closed`] or [`ConnEvent::Failed`]), or the
    /// connection ended without one (a startup failure, a rejected request).
    pub(crate) final_sent: bool,
    /// The user's close.
    pub(crate) close: LocalClose,
    /// How far an abort has gone.
    pub(crate) abort: Abort,
    /// The socket's state showed the peer's FIN (CLOSE-WAIT, CLOSING, LAST-ACK,
    /// TIME-WAIT).
    pub(crate) peer_fin_seen: bool,
    /// MPA was told that TCP closed ([`MpaConn::handle_tcp_closed`]), or the socket
    /// closed before it could be.
    pub(crate) tcp_closed_reported: bool,
    /// The TCP connection is closed: nothing can be sent any more.
    pub(crate) tcp_dead: bool,
    /// The socket was closed (FIN queued) after MPA's graceful close.
    pub(crate) fin_sent: bool,
    /// No more received bytes go to MPA (after an MPA error, or a Terminate received
    /// or sent).
    pub(crate) rx_stopped: bool,
    /// A Terminate queued, and by whom.
    pub(crate) terminate: TerminateOut,
    pub(crate) written: u64,
    pub(crate) snd_base: Option<u32>,
    pub(crate) rx_offset: u64,
    pub(crate) hooked_upto: u64,
    pub(crate) hook: Option<RxHook>,
}

/// Borrowed stack state a connection works with.
pub(crate) struct Cx<'a> {
    pub(crate) events: &'a mut VecDeque<StackEvent>,
    pub(crate) tracker: &'a RefCell<SegTracker>,
    pub(crate) stats: &'a mut StackStats,
    pub(crate) cfg: &'a StackConfig,
    pub(crate) progress: &'a mut bool,
    /// The listeners, for the backlog count of a connection request.
    pub(crate) listeners: &'a mut std::collections::BTreeMap<ListenerId, Listener>,
    /// The link's IP MTU in bytes.
    pub(crate) mtu: usize,
    /// Bytes of FPDUs a connection writes in one round at most: [`TX_BATCH_BYTES`](super::TX_BATCH_BYTES), or
    /// with TCP segmentation offload at most what smoltcp puts in one super-segment, so
    /// that all a round wrote leaves as one super-segment the link cuts where smoltcp
    /// would have (one FPDU per wire segment; "One FPDU per TCP segment" in the module
    /// docs).
    pub(crate) tx_batch_max: usize,
    /// Rounds of more than one FPDU leave as one super-segment (TCP segmentation offload
    /// with room for at least two FPDUs): the upper is told which FPDU ends a round
    /// (`Conn::pull_from_upper`'s `ends_run`), where a short one may go.
    pub(crate) short_last: bool,
}

pub(crate) fn micros(t: Instant) -> u64 {
    u64::try_from(t.total_micros()).unwrap_or(0)
}

pub(crate) fn from_micros(us: u64) -> Instant {
    Instant::from_micros(i64::try_from(us).unwrap_or(i64::MAX))
}

pub(crate) fn v4(ep: IpEndpoint) -> SocketAddrV4 {
    #[allow(unreachable_patterns)] // IPv6 exists only if another crate turns it on
    match ep.addr {
        IpAddress::Ipv4(a) => SocketAddrV4::new(a, ep.port),
        _ => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, ep.port),
    }
}

/// The ULPDU of a Terminate with only the error ([`Ulpdu::terminate`]: M = D = R = 0;
/// RFC 5040 4.8), on the Terminate queue (QN 2) with MSN 1: the first and only message
/// of that queue.
pub(crate) fn terminate_ulpdu(cause: ErrorCause) -> Option<Vec<u8>> {
    let u = Ulpdu::terminate(cause, 1);
    let mut out = vec![0u8; u.buffer_len()];
    u.emit(&mut out).ok()?;
    Some(out)
}

impl<H> Conn<H> {
    pub(crate) fn emit(&mut self, cx: &mut Cx, event: ConnEvent) {
        if !self.visible || self.final_sent {
            return;
        }
        *cx.progress = true;
        if event.is_final() {
            self.final_sent = true;
            if let Some(u) = self.upper.as_mut() {
                match &event {
                    ConnEvent::Failed(e) => u.on_error(e),
                    _ => u.on_closed(),
                }
            }
        }
        cx.events.push_back(StackEvent::Conn {
            conn: self.id,
            event,
        });
    }

    pub(crate) fn fail(&mut self, cx: &mut Cx, error: ConnError) {
        if !self.visible && !self.final_sent {
            cx.stats.startup_failures += 1;
            self.final_sent = true;
            return;
        }
        self.emit(cx, ConnEvent::Failed(error));
    }

    /// Bytes written into the socket and not yet transmitted, by the connection's
    /// tracker entry (its highest sequence number sent).
    pub(crate) fn unsent<S: LlpSocket>(&self, sock: &S, cx: &Cx) -> usize {
        if !sock.tracked() {
            return 0;
        }
        let Some(snd_max) = cx.tracker.borrow().get(self.key).snd_max else {
            return 0;
        };
        let Some(base) = self.snd_base else {
            return 0;
        };
        let sent = snd_max.wrapping_sub(base);
        let unsent = (self.written as u32).wrapping_sub(sent);
        // A FIN counts in snd_max; anything absurd means "nothing to wait for".
        if unsent as i32 <= 0 {
            0
        } else {
            unsent as usize
        }
    }

    /// Whether another FPDU may be written behind the one just written, whose `direct`
    /// bytes went straight into the socket, before that one is on the wire ("One FPDU per
    /// TCP segment" in the module docs): only if that FPDU fills a segment exactly (so
    /// smoltcp, which cuts segments of EMSS from the first unsent byte, ends a segment
    /// at its end), MPA holds nothing, the connection is still in full operation, and the
    /// peer's window takes all that is unsent plus one more full segment (so no segment
    /// is cut short by the window). `room`: the peer's window beyond what was sent, in
    /// octets, as the round found it (`Track::window_room`; nothing is received or sent
    /// during a round, so it holds for the whole round); `unsent`: the bytes written in
    /// this round (nothing was unsent when it began).
    pub(crate) fn may_batch(&self, direct: usize, room: Option<u32>, unsent: usize) -> bool {
        // smoltcp takes an MSS option below 48 as 48 (`MIN_REMOTE_MSS`): its segments would
        // then not end where our EMSS-sized FPDUs do.
        if direct != self.emss
            || self.emss < 48
            || self.final_sent
            || self.abort != Abort::No
            || self.close == LocalClose::Draining
        {
            return false;
        }
        if !self
            .mpa
            .as_ref()
            .is_some_and(|m| m.transmit_pending() == 0 && m.state() == State::FullOperation)
        {
            return false;
        }
        let Some(room) = room else {
            return false;
        };
        unsent + self.emss <= room as usize
    }

    /// Creates the MPA endpoint once TCP is established.
    pub(crate) fn start_mpa<S: LlpSocket>(&mut self, sock: &S, cx: &mut Cx, now: Instant) {
        self.emss = sock.emss().unwrap_or_else(|| {
            let local_mss = mss_for_mtu(cx.mtu);
            let remote_mss = cx
                .tracker
                .borrow()
                .get(self.key)
                .remote_mss
                .map_or(local_mss, usize::from);
            local_mss.min(remote_mss)
        });
        self.snd_base = cx.tracker.borrow().get(self.key).snd_max;
        cx.stats.tcp_established += 1;
        *cx.progress = true;
        let cfg = MpaConfig {
            settings: self.settings.clone(),
            limits: cx.cfg.mpa.limits,
            emss: self.emss,
            startup_timeout_us: cx.cfg.mpa.startup_timeout_us,
            first_fpdu_delay_us: cx.cfg.mpa.first_fpdu_delay_us,
        };
        let made = match self.role {
            Role::Initiator => MpaConn::initiator(cfg, micros(now)),
            Role::Responder => MpaConn::responder(cfg, micros(now)),
        };
        match made {
            Ok(m) => {
                tracing::debug!(conn = self.id.0, emss = self.emss, role = ?self.role, "TCP established");
                self.timer = Timer::Idle;
                self.mpa = Some(m);
            }
            Err(e) => {
                self.ask_abort();
                self.fail(cx, ConnError::Setup(e.to_string()));
            }
        }
    }

    pub(crate) fn drain_mpa(&mut self, cx: &mut Cx) {
        while let Some(ev) = self.mpa.as_mut().and_then(MpaConn::poll_event) {
            self.on_mpa_event(cx, ev);
        }
    }

    pub(crate) fn on_mpa_event(&mut self, cx: &mut Cx, ev: MpaEvent) {
        *cx.progress = true;
        match ev {
            MpaEvent::ConnectRequest { request } => {
                let listener = self.listener.unwrap_or(ListenerId(0));
                // The Request is valid: the connection leaves the half-open pool for
                // the backlog, or is rejected (reject Reply, FIN) when the backlog is
                // full, so that at most `backlog` requests wait for a decision.
                self.half_open = false;
                match cx.listeners.get_mut(&listener) {
                    Some(l) if l.pending < l.backlog => {
                        l.pending += 1;
                        self.in_backlog = true;
                    }
                    _ => {
                        tracing::debug!(conn = self.id.0, "backlog full: request rejected");
                        if let Some(m) = self.mpa.as_mut() {
                            // Only fails if not AwaitingDecision, which it is here.
                            let _ = m.reject(b"");
                        }
                        self.final_sent = true;
                        cx.stats.startup_failures += 1;
                        cx.stats.backlog_rejects += 1;
                        return;
                    }
                }
                self.visible = true;
                tracing::debug!(conn = self.id.0, remote = %self.remote, "MPA Request received");
                cx.events
                    .push_back(StackEvent::ConnectRequest(ConnectRequestInfo {
                        listener,
                        conn: self.id,
                        local: self.local,
                        remote: self.remote,
                        request,
                    }));
            }
            MpaEvent::Established { agreed } => {
                let Some(mpa) = self.mpa.as_ref() else { return };
                let info = Established {
                    role: self.role,
                    mulpdu: mpa.mulpdu().unwrap_or(0),
                    emss: self.emss,
                    initial_msn: mpa.initial_msn().unwrap_or(InitialMsn {
                        send_tx: 1,
                        send_rx: 1,
                        read_tx: 1,
                        read_rx: 1,
                    }),
                    agreed,
                    local: self.local,
                    remote: self.remote,
                };
                cx.stats.mpa_established += 1;
                tracing::debug!(conn = self.id.0, mulpdu = info.mulpdu, "MPA established");
                if let Some(u) = self.upper.as_mut() {
                    u.on_established(&info);
                }
                self.emit(cx, ConnEvent::Established(info));
            }
            MpaEvent::Rejected { private_data } => {
                self.fail(cx, ConnError::Rejected { private_data });
            }
            MpaEvent::Ulpdu(ulpdu) => {
                if self.rx_stopped || self.final_sent {
                    return;
                }
                cx.stats.ulpdus_rx += 1;
                if let Some(cause) = ulpdu::terminate_cause(&ulpdu) {
                    cx.stats.terminates_received += 1;
                    tracing::debug!(conn = self.id.0, %cause, "Terminate received");
                    self.rx_stopped = true;
                    self.ask_abort();
                    if let Some(u) = self.upper.as_mut() {
                        u.on_terminate(&ulpdu);
                    }
                    self.fail(cx, ConnError::TerminateReceived(cause));
                } else if let Some(u) = self.upper.as_mut() {
                    u.on_ulpdu(ulpdu);
                }
            }
            MpaEvent::Error(e) => {
                tracing::debug!(conn = self.id.0, error = %e, "MPA error");
                if matches!(e, MpaError::Crc { .. }) {
                    cx.stats.crc_errors += 1;
                }
                let reading = !self.rx_stopped;
                self.rx_stopped = true;
                // The bad bytes may come behind ULPDUs of the same read that already
                // ended the upper's stream (`Ulp::stream_ended`): the upper's own
                // Terminate for the first error goes out then, or none at all (never
                // one answering the peer's Terminate, RFC 5040 §7).
                let (own, ended) = match self.upper.as_mut() {
                    Some(u) if reading => (u.poll_terminate(), u.stream_ended()),
                    _ => (None, false),
                };
                let terminate = match own {
                    Some(t) => Some(t),
                    None if ended => None,
                    None => e.terminate_cause().and_then(terminate_ulpdu),
                };
                if let (Some(t), Some(mpa)) = (terminate, self.mpa.as_mut()) {
                    if mpa.can_send_terminate()
                        && !self.tcp_dead
                        && mpa.send_terminate(&[&t]).is_ok()
                    {
                        if self.terminate == TerminateOut::No {
                            self.terminate = TerminateOut::Queued;
                        }
                        cx.stats.terminates_sent += 1;
                    }
                }
                let error = match e {
                    MpaError::Timeout { .. } => ConnError::TimedOut(TimeoutPhase::MpaReply),
                    MpaError::PeerClosedDuringStartup { graceful: false }
                    | MpaError::ConnectionLost {
                        graceful: false, ..
                    } => ConnError::Reset,
                    e => ConnError::Mpa(e),
                };
                self.fail(cx, error);
            }
            MpaEvent::Closed => {
                if self.close == LocalClose::No && !self.final_sent && self.visible {
                    if let Some(u) = self.upper.as_mut() {
                        u.on_disconnected();
                    }
                    cx.events.push_back(StackEvent::Conn {
                        conn: self.id,
                        event: ConnEvent::Disconnected,
                    });
                }
            }
        }
    }

    /// The receive path: socket bytes into MPA while the upper has room; then the upper
    /// is told the pass is over ([`Ulp::rx_done`]).
    pub(crate) fn rx<S: LlpSocket>(&mut self, sock: &mut S, cx: &mut Cx, now_us: u64) {
        self.rx_pass(sock, cx, now_us);
        if let Some(u) = self.upper.as_mut() {
            u.rx_done();
        }
    }

    pub(crate) fn rx_pass<S: LlpSocket>(&mut self, sock: &mut S, cx: &mut Cx, now_us: u64) {
        loop {
            if self.rx_stopped || !sock.can_recv() {
                return;
            }
            let room = match self.upper.as_mut() {
                Some(u) => u.rx_room(),
                None => usize::MAX,
            };
            if room == 0 {
                return;
            }
            let limit = room.min(RX_CHUNK);
            let Some(mpa) = self.mpa.as_mut() else { return };
            let offset = self.rx_offset;
            let hooked_upto = &mut self.hooked_upto;
            let hook = &mut self.hook;
            // ULPDUs go to the upper in place while the connection is live; a
            // Terminate takes the event path (the connection ends there).
            let upper = if self.final_sent {
                None
            } else {
                self.upper.as_mut()
            };
            let stats = &mut *cx.stats;
            let used = sock.recv_with(|buf| {
                let n = buf.len().min(limit);
                let buf = &mut buf[..n];
                if let Some(hook) = hook.as_mut() {
                    let end = offset + n as u64;
                    if end > *hooked_upto {
                        let from = (*hooked_upto).max(offset);
                        hook(from, &mut buf[(from - offset) as usize..]);
                        *hooked_upto = end;
                    }
                }
                let used = match upper {
                    Some(u) => mpa.handle_rx_in_place(buf, now_us, &mut |ulpdu: &[u8]| {
                        if Header::is_terminate(ulpdu) || !u.on_ulpdu_in_place(ulpdu) {
                            return false;
                        }
                        stats.ulpdus_rx += 1;
                        true
                    }),
                    None => mpa.handle_rx(buf, now_us),
                };
                (used, used)
            });
            match used {
                Ok(0) | Err(_) => {
                    self.drain_mpa(cx);
                    return;
                }
                Ok(n) => {
                    self.rx_offset += n as u64;
                    cx.stats.stream_rx_bytes += n as u64;
                    *cx.progress = true;
                    self.drain_mpa(cx);
                }
            }
        }
    }

    /// Writes MPA's pending bytes into the socket if they fit whole (or if they could
    /// never fit). Returns the bytes written.
    pub(crate) fn write_pending<S: LlpSocket>(&mut self, sock: &mut S, cx: &mut Cx) -> usize {
        let Some(mpa) = self.mpa.as_mut() else {
            return 0;
        };
        let Some(data) = mpa.poll_transmit() else {
            return 0;
        };
        let free = sock.send_capacity() - sock.send_queue();
        if data.len() > free && data.len() <= sock.send_capacity() {
            return 0;
        }
        match sock.send_slice(data) {
            Ok(n) if n > 0 => {
                // Cannot fail: n <= what poll_transmit offered.
                let _ = mpa.transmit_done(n);
                self.written += n as u64;
                cx.stats.stream_tx_bytes += n as u64;
                *cx.progress = true;
                n
            }
            _ => 0,
        }
    }

    /// The transmit and closing path; returns whether bytes went into the socket.
    pub(crate) fn tx<S: LlpSocket>(&mut self, sock: &mut S, cx: &mut Cx, now: Instant) -> bool {
        if self.abort == Abort::Done {
            return false;
        }
        if self.abort == Abort::Asked {
            sock.abort();
            self.abort = Abort::Done;
            *cx.progress = true;
            return false;
        }
        let Some(mpa) = self.mpa.as_ref() else {
            return false;
        };
        let close = if self.terminate == TerminateOut::FromUpper {
            Some(LlpClose::Abort)
        } else {
            mpa.llp_close()
        };
        let pending = mpa.transmit_pending();
        let mpa_state = mpa.state();
        let mut wrote = false;
        match close {
            Some(LlpClose::Abort) => {
                if self.terminate == TerminateOut::No {
                    sock.abort();
                    self.abort = Abort::Done;
                    *cx.progress = true;
                    return false;
                }
                let deadline = match self.timer {
                    Timer::Linger { until } => until,
                    _ => {
                        let until =
                            now + smoltcp::time::Duration::from_micros(cx.cfg.terminate_linger_us);
                        self.timer = Timer::Linger { until };
                        until
                    }
                };
                if pending > 0 && self.unsent(sock, cx) == 0 {
                    wrote = self.write_pending(sock, cx) > 0;
                }
                let pending = self.mpa.as_ref().map_or(0, MpaConn::transmit_pending);
                if (pending == 0 && sock.unacknowledged() == 0)
                    || now >= deadline
                    || !sock.may_send()
                {
                    sock.abort();
                    self.abort = Abort::Done;
                    *cx.progress = true;
                }
            }
            Some(LlpClose::Graceful) => {
                if pending > 0 && self.unsent(sock, cx) == 0 {
                    wrote = self.write_pending(sock, cx) > 0;
                }
                let pending = self.mpa.as_ref().map_or(0, MpaConn::transmit_pending);
                if (pending == 0 || !sock.may_send()) && !self.fin_sent {
                    sock.close();
                    self.fin_sent = true;
                    *cx.progress = true;
                }
            }
            None => {
                if pending > 0 {
                    if self.unsent(sock, cx) == 0 {
                        wrote = self.write_pending(sock, cx) > 0;
                    }
                    return wrote;
                }
                // A responder waiting for the initiator's first FPDU may still take
                // a few ULPDUs from the upper: MPA holds them (RFC 5044 7.1.2) and the
                // upper's local work (a QP's Fast Register, Local Invalidate) goes on.
                let hold = mpa_state == State::AwaitingFirstFpdu
                    && self.close != LocalClose::Draining
                    && self
                        .mpa
                        .as_ref()
                        .is_some_and(|m| m.held_ulpdus() < MAX_HELD_ULPDUS);
                if (mpa_state != State::FullOperation && !hold) || self.final_sent {
                    // Nothing can be sent in this state: a pending close goes ahead.
                    self.finish_close(cx);
                    return false;
                }
                if self.unsent(sock, cx) != 0 {
                    return false;
                }
                let mut batch = 0;
                // The peer's window as the round begins (one tracker lookup per round).
                let room = if sock.tracked() {
                    cx.tracker.borrow().get(self.key).window_room()
                } else {
                    Some(u32::MAX)
                };
                let mut first = true;
                loop {
                    let free = sock.send_capacity() - sock.send_queue();
                    // The round's last FPDU (no room for another after it) may be short.
                    let ends_run = cx.short_last && batch + 2 * self.emss > cx.tx_batch_max;
                    match self.pull_from_upper(sock, cx, free, first, ends_run) {
                        Pulled::Sent(w, direct) => {
                            wrote |= w;
                            first = false;
                            if batch > 0 {
                                cx.stats.fpdus_batched += 1;
                            }
                            batch += direct;
                            if batch + self.emss > cx.tx_batch_max
                                || !self.may_batch(direct, room, batch)
                            {
                                break;
                            }
                        }
                        Pulled::Empty => {
                            self.finish_close(cx);
                            break;
                        }
                        Pulled::NoRoom => break,
                    }
                }
            }
        }
        wrote
    }

    /// A graceful close waits for the upper's queue to drain; then MPA closes.
    pub(crate) fn finish_close(&mut self, cx: &mut Cx) {
        if self.close == LocalClose::Draining {
            self.close = LocalClose::Asked;
            if let Some(m) = self.mpa.as_mut() {
                // Err only in Closed/Failed, where the close is under way anyway.
                let _ = m.close();
            }
            *cx.progress = true;
        }
    }

    /// Asks the upper for a Terminate (`first`: at the round's first FPDU only) or one
    /// ULPDU and writes the FPDU; `ends_run`: the FPDU is the last a round can write
    /// ([`Ulp::poll_ulpdu_ending_run`]).
    ///
    /// A Terminate the upper queues during a round (a WR that fails as it starts) makes
    /// its `poll_ulpdu` report nothing, which ends the round; the next round asks first.
    pub(crate) fn pull_from_upper<S: LlpSocket>(
        &mut self,
        sock: &mut S,
        cx: &mut Cx,
        free: usize,
        first: bool,
        ends_run: bool,
    ) -> Pulled {
        let (Some(mpa), Some(upper)) = (self.mpa.as_mut(), self.upper.as_mut()) else {
            return Pulled::Empty;
        };
        if let Some(t) = first.then(|| upper.poll_terminate()).flatten() {
            let cause = ulpdu::terminate_cause(&t);
            match mpa.send_terminate(&[&t]) {
                Ok(()) => {
                    cx.stats.terminates_sent += 1;
                    self.rx_stopped = true;
                    self.fail(cx, ConnError::TerminateSent(cause));
                    // The Terminate goes out, then the RST (as after an MPA error).
                    self.timer = Timer::Idle;
                    let wrote = self.write_pending(sock, cx) > 0;
                    self.terminate = TerminateOut::FromUpper;
                    return Pulled::Sent(wrote, 0);
                }
                Err(e) => {
                    self.ask_abort();
                    self.fail(cx, ConnError::Ulp(e));
                    return Pulled::Sent(false, 0);
                }
            }
        }
        if free < self.emss.max(1) {
            return Pulled::NoRoom;
        }
        let Some(mulpdu) = mpa.mulpdu() else {
            return Pulled::Empty;
        };
        // Nothing is pending (checked by `tx`), so the FPDU goes straight into the
        // socket's send buffer, CRC in that copy; MPA's own queue only when the free
        // room wraps around the end of the ring (or the ULPDU is held).
        let mut direct = 0;
        let mut emit = |parts: &[&[u8]]| {
            if mpa.transmit_pending() == 0 {
                let mut framed = Ok(None);
                let _ = sock.send_with(|buf| {
                    framed = mpa.frame_into(buf, parts);
                    (framed.as_ref().map_or(0, |n| n.unwrap_or(0)), ())
                });
                if let Some(n) = framed? {
                    direct += n;
                    return Ok(());
                }
            }
            mpa.send_ulpdu(parts)
        };
        let polled = if ends_run {
            upper.poll_ulpdu_ending_run(mulpdu, &mut emit)
        } else {
            upper.poll_ulpdu(mulpdu, &mut emit)
        };
        if direct > 0 {
            self.written += direct as u64;
            cx.stats.stream_tx_bytes += direct as u64;
            *cx.progress = true;
        }
        match polled {
            Ok(true) => {
                cx.stats.ulpdus_tx += 1;
                Pulled::Sent(self.write_pending(sock, cx) > 0 || direct > 0, direct)
            }
            Ok(false) => Pulled::Empty,
            Err(e) => {
                self.ask_abort();
                self.fail(cx, ConnError::Ulp(e));
                Pulled::Sent(false, 0)
            }
        }
    }
}

/// What asking the upper for a ULPDU gave.
pub(crate) enum Pulled {
    /// A ULPDU (or Terminate) was framed; whether bytes went into the socket, and how
    /// many bytes of it went straight into the socket's send buffer.
    Sent(bool, usize),
    /// The upper had nothing to send.
    Empty,
    /// The socket had no room for a whole FPDU; the upper was not asked.
    NoRoom,
}

impl<H> Conn<H> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: ConnId,
        handle: H,
        role: Role,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        listener: Option<ListenerId>,
        settings: LocalSettings,
        now: Instant,
    ) -> Conn<H> {
        Conn {
            id,
            handle,
            role,
            key: tuple_key(local.port(), *remote.ip(), remote.port()),
            local,
            remote,
            listener,
            settings,
            span: tracing::debug_span!("conn", id = id.0, ?role, %remote),
            connect_started: now,
            timer: Timer::Idle,
            mpa: None,
            upper: None,
            emss: 0,
            life: Life::Active,
            visible: role == Role::Initiator,
            in_backlog: false,
            half_open: role == Role::Responder,
            final_sent: false,
            close: LocalClose::No,
            abort: Abort::No,
            peer_fin_seen: false,
            tcp_closed_reported: false,
            tcp_dead: false,
            fin_sent: false,
            rx_stopped: false,
            terminate: TerminateOut::No,
            written: 0,
            snd_base: None,
            rx_offset: 0,
            hooked_upto: 0,
            hook: None,
        }
    }

    /// Asks for an abort (RST at the next service); one already done stays done.
    pub(crate) fn ask_abort(&mut self) {
        if self.abort == Abort::No {
            self.abort = Abort::Asked;
        }
    }

    /// The connection's own next deadline ([`Timer`]), while its socket is not aborted.
    pub(crate) fn poll_at(&self) -> Option<Instant> {
        if self.abort == Abort::Done {
            return None;
        }
        match self.timer {
            Timer::Connect { deadline } if self.mpa.is_none() => Some(deadline),
            Timer::Linger { until } => Some(until),
            _ => None,
        }
    }

    /// Whether MPA still takes received bytes.
    pub(crate) fn mpa_consumes(&self) -> bool {
        !self.rx_stopped
            && self.mpa.as_ref().is_some_and(|m| {
                !matches!(
                    m.state(),
                    State::AwaitingDecision | State::Closed | State::Failed
                )
            })
    }

    /// One round of work on this connection; returns whether bytes went into the socket.
    pub(crate) fn service<S: LlpSocket>(
        &mut self,
        sock: &mut S,
        cx: &mut Cx,
        now: Instant,
    ) -> bool {
        use tcp::State as T;
        if self.life.is_zombie() {
            return false;
        }
        let span = self.span.clone();
        let _entered = span.enter();
        let state = sock.state();
        if matches!(state, T::CloseWait | T::Closing | T::LastAck | T::TimeWait) {
            self.peer_fin_seen = true;
        }
        if self.mpa.is_none() && self.abort == Abort::Asked {
            // Closed by the user (or its listener) before TCP was established.
            sock.abort();
            self.abort = Abort::Done;
            *cx.progress = true;
        }
        if self.mpa.is_none() && self.abort != Abort::Done {
            match state {
                T::Established | T::CloseWait => {
                    self.start_mpa(sock, cx, now);
                    if self.mpa.is_none() {
                        self.tx(sock, cx, now);
                        self.life = Life::ZOMBIE;
                        return false;
                    }
                }
                T::SynSent | T::SynReceived => {
                    if matches!(self.timer, Timer::Connect { deadline } if now >= deadline) {
                        sock.abort();
                        self.abort = Abort::Done;
                        self.fail(cx, ConnError::TimedOut(TimeoutPhase::TcpConnect));
                        self.life = Life::ZOMBIE;
                    }
                    return false;
                }
                _ => {
                    // Closed before MPA started: refused, timed out, or closed by the user.
                    if self.close != LocalClose::No {
                        self.emit(cx, ConnEvent::Closed);
                    } else if self.role == Role::Initiator {
                        let waited = micros(now).saturating_sub(micros(self.connect_started));
                        let tcp_timeout = cx.cfg.tcp.timeout.map_or(u64::MAX, |t| {
                            u64::try_from(t.as_micros()).unwrap_or(u64::MAX)
                        });
                        let limit = tcp_timeout.min(cx.cfg.connect_timeout_us);
                        let e = if waited >= limit {
                            ConnError::TimedOut(TimeoutPhase::TcpConnect)
                        } else {
                            ConnError::Refused
                        };
                        self.fail(cx, e);
                    } else {
                        self.fail(cx, ConnError::Reset);
                    }
                    if state != T::Closed {
                        sock.abort();
                    }
                    self.abort = Abort::Done;
                    self.life = Life::ZOMBIE;
                    return false;
                }
            }
        }
        if self.mpa.is_none() {
            // Aborted before MPA started (user close of a pending connect).
            if !self.final_sent {
                self.emit(cx, ConnEvent::Closed);
            }
            self.life = Life::ZOMBIE;
            return false;
        }
        let now_us = micros(now);
        if let Some(m) = self.mpa.as_mut() {
            m.handle_timeout(now_us);
        }
        self.drain_mpa(cx);
        self.rx(sock, cx, now_us);
        let tcp_gone = matches!(sock.state(), T::Closed | T::TimeWait);
        if self.peer_fin_seen
            && !self.tcp_closed_reported
            && !tcp_gone
            && (sock.recv_queue() == 0 || !self.mpa_consumes())
        {
            self.tcp_closed_reported = true;
            if let Some(m) = self.mpa.as_mut() {
                m.handle_tcp_closed(true);
            }
            self.drain_mpa(cx);
        }
        let wrote = self.tx(sock, cx, now);
        if matches!(sock.state(), T::Closed | T::TimeWait) {
            if !self.tcp_closed_reported {
                self.tcp_closed_reported = true;
                // No Terminate can go out on a dead connection.
                self.tcp_dead = true;
                if self.abort != Abort::Done {
                    let graceful = self.peer_fin_seen;
                    if let Some(m) = self.mpa.as_mut() {
                        m.handle_tcp_closed(graceful);
                    }
                    self.drain_mpa(cx);
                }
            }
            if !self.final_sent {
                let mpa_closed = self
                    .mpa
                    .as_ref()
                    .is_some_and(|m| m.state() == State::Closed);
                if self.close != LocalClose::No || mpa_closed {
                    self.emit(cx, ConnEvent::Closed);
                } else {
                    self.fail(cx, ConnError::Reset);
                }
            }
            self.life = Life::ZOMBIE;
        }
        wrote
    }
}

impl<H> AsMut<Conn<H>> for Conn<H> {
    fn as_mut(&mut self) -> &mut Conn<H> {
        self
    }
}

/// Leaves the backlog of its listener (a connection request decided, closed or ended).
pub(crate) fn leave_backlog_of<H>(c: &mut Conn<H>, listeners: &mut BTreeMap<ListenerId, Listener>) {
    if std::mem::take(&mut c.in_backlog) {
        if let Some(l) = c.listener.and_then(|l| listeners.get_mut(&l)) {
            l.pending = l.pending.saturating_sub(1);
        }
    }
}

/// The connection `conn` (`c`) if it is an undecided connection request (reported, not
/// accepted or rejected, MPA awaiting the decision).
///
/// Errors: [`StackError::NoSuchConnection`] (`c` is `None`), [`StackError::WrongState`]
/// naming `call`.
pub(crate) fn undecided_of<'c, H>(
    c: Option<&'c mut Conn<H>>,
    conn: ConnId,
    call: &'static str,
) -> Result<&'c mut Conn<H>, StackError> {
    let c = c.ok_or(StackError::NoSuchConnection(conn))?;
    let ok = c.visible
        && !c.final_sent
        && c.upper.is_none()
        && c.mpa.as_ref().map(MpaConn::state) == Some(State::AwaitingDecision);
    if ok {
        Ok(c)
    } else {
        Err(StackError::WrongState {
            call,
            why: "the connection is not an undecided connection request",
        })
    }
}
