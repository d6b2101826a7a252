//! Listeners and their backlog (see "Listeners and the backlog" in the [module
//! docs](super)): the pool of listening sockets of each [`Listener`], re-armed at every
//! poll, and the harvest of sockets that became connections.

use smoltcp::iface::SocketSet;
use smoltcp::socket::tcp;
use smoltcp::time::Instant;

use std::collections::BTreeMap;

use super::conn::{leave_backlog_of, undecided_of, v4, Abort, Conn};
use super::mpa_conn::{MpaConn, Role, State};
use super::{ConnId, Listener, ListenerId, Stack, StackError, StackStats};
use crate::link::Link;

/// The occupancy of one listener (see [`Stack::listener_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ListenerStats {
    /// Listening sockets (LISTEN or SYN-RECEIVED).
    pub armed: usize,
    /// Half-open connections: TCP established, MPA Request not yet valid. At most
    /// [`super::StackConfig::half_open_max`] after each poll.
    pub half_open: usize,
    /// Connection requests reported ([`super::StackEvent::ConnectRequest`]) and neither
    /// accepted nor rejected: at most the backlog.
    pub requests: usize,
}

impl<L: Link> Stack<L> {
    pub(super) fn arm(
        sockets: &mut SocketSet<'static>,
        l: &mut Listener,
        mut s: tcp::Socket<'static>,
    ) {
        // Cannot fail: the socket is new and the port is not 0.
        if s.listen(l.port).is_ok() {
            l.armed.push(sockets.add(s));
        }
    }

    /// Arms listening sockets (and closes surplus ones still in LISTEN): none while the
    /// backlog is full (a SYN is then refused); else sockets in LISTEN up to the
    /// backlog's free room, at most [`super::MAX_ARMED`], whether or not the half-open
    /// pool is full (a connection one takes may push the oldest half-open one out, see
    /// [`Stack::sweep_half_open`]). Sockets a SYN took (SYN-RECEIVED) do not count
    /// against that: they are bounded apart, by the half-open pool's size, and when
    /// more are waiting for the handshake's last ACK the oldest is dropped (counted in
    /// [`super::StackStats::syn_received_dropped`]), so a SYN flood that never completes
    /// a handshake cannot leave the listener without a socket in LISTEN.
    pub(super) fn rearm(&mut self) {
        let mss = self.mss();
        for l in self.listeners.values_mut() {
            let target = (l.backlog - l.pending.min(l.backlog)).min(super::MAX_ARMED);
            let state = |sockets: &SocketSet<'static>, h| sockets.get::<tcp::Socket>(h).state();
            // Oldest first: `armed` keeps the order sockets were armed in.
            let mut syn_received = l
                .armed
                .iter()
                .filter(|&&h| state(&self.sockets, h) == tcp::State::SynReceived)
                .count();
            let mut i = 0;
            while syn_received > l.half_open_max && i < l.armed.len() {
                let h = l.armed[i];
                if state(&self.sockets, h) == tcp::State::SynReceived {
                    l.armed.remove(i);
                    self.sockets.remove(h);
                    syn_received -= 1;
                    self.stats.syn_received_dropped += 1;
                } else {
                    i += 1;
                }
            }
            let mut listening = l.armed.len() - syn_received;
            while listening < target {
                match self.cfg.tcp.socket_for_mss(mss) {
                    Ok(s) => Self::arm(&mut self.sockets, l, s),
                    Err(_) => break,
                }
                listening += 1;
            }
            // Surplus sockets still in LISTEN go (one in SYN-RECEIVED is a connection
            // under way and stays), so a full backlog refuses the next SYN.
            let mut i = 0;
            while listening > target && i < l.armed.len() {
                let h = l.armed[i];
                if state(&self.sockets, h) == tcp::State::Listen {
                    l.armed.remove(i);
                    self.sockets.remove(h);
                    listening -= 1;
                } else {
                    i += 1;
                }
            }
        }
    }

    /// Sets the [`SynGate`](super::seg_tracker::SynGate)'s budgets for the next poll:
    /// per listener with room in its backlog, its sockets in LISTEN. A listener whose
    /// backlog is full gets no entry: its SYNs are refused at once, as the module docs
    /// say.
    pub(super) fn set_syn_budget(&mut self) {
        let sockets = &self.sockets;
        let budget = self
            .listeners
            .values()
            .filter(|l| l.pending < l.backlog)
            .map(|l| {
                let listening = l
                    .armed
                    .iter()
                    .filter(|&&h| sockets.get::<tcp::Socket>(h).state() == tcp::State::Listen)
                    .count();
                (l.port, listening)
            });
        self.dev.gate.set_budget(budget);
    }

    /// Keeps each listener's half-open pool: connections whose Request came in (they
    /// moved to the backlog, or were rejected when it was full: `Conn::on_mpa_event`)
    /// and ones that failed or closed leave, and while more than
    /// `half_open_max` remain the oldest is reset (counted in
    /// [`super::StackStats::half_open_dropped`]) so that a new connection, which may
    /// be a client about to send its Request, gets in. O(pool size) per poll.
    pub(super) fn sweep_half_open(&mut self) {
        sweep_half_open_of(&mut self.listeners, &mut self.conns, &mut self.stats);
    }

    /// The occupancy of a listener, or `None` if there is no such listener.
    pub fn listener_stats(&self, id: ListenerId) -> Option<ListenerStats> {
        let l = self.listeners.get(&id)?;
        Some(ListenerStats {
            armed: l.armed.len(),
            half_open: l.half_open.len(),
            requests: l.pending,
        })
    }

    pub(super) fn leave_backlog(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            leave_backlog_of(c, &mut self.listeners);
        }
    }

    pub(super) fn undecided(
        &mut self,
        conn: ConnId,
        call: &'static str,
    ) -> Result<&mut Conn, StackError> {
        undecided_of(self.conns.get_mut(&conn), conn, call)
    }

    /// Moves listening sockets that became connections into the connection table.
    pub(super) fn harvest(&mut self, now: Instant) {
        let mut born = Vec::new();
        for (&lid, l) in self.listeners.iter_mut() {
            let mut i = 0;
            while i < l.armed.len() {
                let h = l.armed[i];
                let s = self.sockets.get_mut::<tcp::Socket>(h);
                match s.state() {
                    tcp::State::Listen | tcp::State::SynReceived => i += 1,
                    tcp::State::Closed => {
                        l.armed.remove(i);
                        self.sockets.remove(h);
                    }
                    _ => {
                        l.armed.remove(i);
                        match (s.local_endpoint(), s.remote_endpoint()) {
                            (Some(local), Some(remote)) => {
                                born.push((lid, h, v4(local), v4(remote), l.settings.clone()));
                            }
                            _ => {
                                s.abort();
                            }
                        }
                    }
                }
            }
        }
        for (lid, h, local, remote, settings) in born {
            let id = ConnId(self.next_id());
            tracing::debug!(conn = id.0, %remote, "TCP connection accepted");
            if let Some(l) = self.listeners.get_mut(&lid) {
                l.half_open.push_back(id);
            }
            self.conns.insert(
                id,
                Conn::new(
                    id,
                    h,
                    Role::Responder,
                    local,
                    remote,
                    Some(lid),
                    settings,
                    now,
                ),
            );
        }
    }
}

/// Keeps each listener's half-open pool to the connections still half-open (responder,
/// MPA Request not yet valid, not ended) and resets the oldest beyond its bound (see
/// "Listeners and the backlog" in the [module docs](super)). Shared by the smoltcp stack
/// and the host-TCP stack (`crate::host`), whose connections hold a `Conn<H>`.
pub(crate) fn sweep_half_open_of<H, C: AsMut<Conn<H>>>(
    listeners: &mut BTreeMap<ListenerId, Listener>,
    conns: &mut BTreeMap<ConnId, C>,
    stats: &mut StackStats,
) {
    for l in listeners.values_mut() {
        l.half_open.retain(|id| {
            let Some(c) = conns.get_mut(id) else {
                return false;
            };
            let c = c.as_mut();
            let still = c.half_open
                && !c.visible
                && !c.final_sent
                && !c.life.is_zombie()
                && c.abort == Abort::No
                && c.mpa.as_ref().map(MpaConn::state) == Some(State::AwaitingRequest);
            if !still {
                c.half_open = false;
            }
            still
        });
        while l.half_open.len() > l.half_open_max {
            let Some(id) = l.half_open.pop_front() else {
                break;
            };
            if let Some(c) = conns.get_mut(&id) {
                let c = c.as_mut();
                tracing::debug!(conn = id.0, remote = %c.remote, "half-open pool full: oldest reset");
                c.half_open = false;
                c.ask_abort();
                stats.half_open_dropped += 1;
            }
        }
    }
}
