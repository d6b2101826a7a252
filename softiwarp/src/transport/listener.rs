//! Listeners and their backlog (see "Listeners and the backlog" in the [module
//! docs](super)): the pool of listening sockets of each [`Listener`], re-armed at every
//! poll, and the harvest of sockets that became connections.

use mpa::negotiate::LocalSettings;
use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;

use super::conn::{v4, Conn};
use super::mpa_conn::{MpaConn, Role, State};
use super::{ConnId, Stack, StackError};
use crate::link::Link;

/// One listener: a port, its backlog and its pool of listening sockets.
pub(super) struct Listener {
    pub(super) port: u16,
    pub(super) backlog: usize,
    pub(super) settings: LocalSettings,
    pub(super) armed: Vec<SocketHandle>,
    /// Connections of this listener not yet decided (see the module docs).
    pub(super) pending: usize,
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

    pub(super) fn rearm(&mut self) {
        let mss = self.mss();
        for l in self.listeners.values_mut() {
            while l.armed.len() + l.pending < l.backlog {
                match self.cfg.tcp.socket_for_mss(mss) {
                    Ok(s) => Self::arm(&mut self.sockets, l, s),
                    Err(_) => break,
                }
            }
        }
    }

    pub(super) fn leave_backlog(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if std::mem::take(&mut c.in_backlog) {
            if let Some(l) = c.listener.and_then(|l| self.listeners.get_mut(&l)) {
                l.pending = l.pending.saturating_sub(1);
            }
        }
    }

    pub(super) fn undecided(
        &mut self,
        conn: ConnId,
        call: &'static str,
    ) -> Result<&mut Conn, StackError> {
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(StackError::NoSuchConnection(conn))?;
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
                        l.armed.swap_remove(i);
                        self.sockets.remove(h);
                    }
                    _ => {
                        l.armed.swap_remove(i);
                        match (s.local_endpoint(), s.remote_endpoint()) {
                            (Some(local), Some(remote)) => {
                                l.pending += 1;
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
