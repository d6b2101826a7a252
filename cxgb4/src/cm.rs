//! The RDMA CM over librdmacm: event channels, ids, owned events, and the
//! QP of an id.
//!
//! # Lifetimes and the librdmacm traps
//!
//! - An [`EventChannel`] lives while any id or event made on it does.
//! - A [`CmId`] is shared (`Clone`); `rdma_destroy_id` runs when the last
//!   clone, the last [`CmEvent`] naming it, the [`Qp`] made on it and the
//!   [`Context`] taken from it are gone.
//! - A [`CmEvent`] acknowledges itself (`rdma_ack_cm_event`) on drop, and
//!   holds the id it names; its fields drop ack first, id second. So an id
//!   is never destroyed with an event of its own unacknowledged, which would
//!   make `rdma_destroy_id` wait forever (shared/rdma-core-notes.md section
//!   3, step 2; librdmacm/cma.c v44 `rdma_destroy_id` waits while
//!   `events_completed` < the kernel's `events_reported`). A connect request
//!   is accounted to the listening id, so that event holds the listener too.
//!   An event for an id whose last handle is already gone is acknowledged at
//!   once and not returned ("nothing after destroy").
//! - On [`CmEventKind::DeviceRemoval`]: drop the [`Qp`], then the event,
//!   then the id (and the PD, CQs, MRs made on its context); finally call
//!   [`crate::release_cached_devices`] so librdmacm closes its cached device
//!   context, which it does only while another device is still listed: the
//!   kernel's removal finishes when the process exits otherwise. Measured on
//!   kernel siw (tests/siw_vm.rs): one removal event per live id (listener
//!   included) about 150 ms after `rdma link delete` started, a
//!   `DISCONNECTED` before it on the connection's passive side, every posted
//!   receive flushed, and the delete done as soon as the process exited.

use crate::cq::Cq;
use crate::device::Context;
use crate::error::{Error, Result};
use crate::ffi::handles::{RawCmChannel, RawCmEvent, RawCmId, RawContext, RawQp};
use crate::ffi::types::{IbvQpCap, RdmaConnParam, RDMA_PS_TCP};
use crate::ffi::RdmaCore;
use crate::pd::Pd;
use crate::qp::Qp;
use crate::translate::{verbs_error, CmEventKind};
use crate::wr_track::WrTracker;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use verbs::QpCap;

/// The shared state of a channel: the librdmacm channel and which of our
/// ids each `rdma_cm_id` address belongs to.
struct ChannelShared {
    raw: Arc<RawCmChannel>,
    ids: Mutex<HashMap<usize, Weak<IdShared>>>,
}

impl ChannelShared {
    fn register(self: &Arc<Self>, raw: RawCmId) -> CmId {
        let raw = Arc::new(raw);
        let addr = raw.addr();
        let shared = Arc::new(IdShared {
            raw,
            chan: self.clone(),
            qp_wrs: Mutex::default(),
        });
        self.ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, Arc::downgrade(&shared));
        CmId { shared }
    }

    fn lookup(&self, addr: usize) -> Option<CmId> {
        let ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        ids.get(&addr)?.upgrade().map(|shared| CmId { shared })
    }
}

/// A CM event channel (`struct rdma_event_channel`): where the events of
/// its ids arrive. Cloning shares it.
#[derive(Clone)]
pub struct EventChannel {
    shared: Arc<ChannelShared>,
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

impl EventChannel {
    /// `rdma_create_event_channel(3)`.
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`] (`ENODEV` as [`verbs::VerbsError::NoDevice`] when
    /// the kernel has no `rdma_ucm`, i.e. no `/dev/infiniband/rdma_cm`).
    pub fn new(core: &Arc<RdmaCore>) -> Result<EventChannel> {
        let raw =
            RawCmChannel::create(core).map_err(|e| verbs_error("rdma_create_event_channel", e))?;
        Ok(EventChannel {
            shared: Arc::new(ChannelShared {
                raw: Arc::new(raw),
                ids: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The fd to `poll()` for readability.
    pub fn fd(&self) -> i32 {
        self.shared.raw.fd()
    }

    /// Makes [`EventChannel::get_event`] return `EAGAIN` (errno 11) instead
    /// of blocking when no event is pending.
    ///
    /// # Errors
    ///
    /// The OS error of `fcntl`.
    pub fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        crate::ffi::set_nonblocking(self.fd(), on)
    }

    /// Creates an id in the TCP port space (`rdma_create_id(3)` with
    /// `RDMA_PS_TCP`, the iWARP one).
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`].
    pub fn create_id(&self) -> Result<CmId> {
        let raw = RawCmId::create(&self.shared.raw, RDMA_PS_TCP)
            .map_err(|e| verbs_error("rdma_create_id", e))?;
        Ok(self.shared.register(raw))
    }

    /// Takes the next event (`rdma_get_cm_event(3)`; blocks unless the fd is
    /// non-blocking). Events for ids already dropped, and of kinds this crate
    /// does not know, are acknowledged and skipped. A connect request's new
    /// id is registered on this channel and returned in the event.
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`] (`EAGAIN`, errno 11, on a non-blocking fd with
    /// nothing pending).
    pub fn get_event(&self) -> Result<CmEvent> {
        loop {
            let raw = self
                .shared
                .raw
                .get_event()
                .map_err(|e| verbs_error("rdma_get_cm_event", e))?;
            let Some(kind) = CmEventKind::from_raw(raw.event()) else {
                tracing::warn!(event = raw.event(), "unknown rdma_cm event; acked");
                continue;
            };
            // A connect request is accounted to the listener in librdmacm
            // (cma.c v44: `evt->id_priv = resp.uid`, the listening id): its
            // ack must come before the listener's rdma_destroy_id, so the
            // event holds the listener, and a request for a listener whose
            // last handle is gone is acked (and its new id destroyed, which
            // rejects it) at once.
            let listen_id = match raw.listen_id_addr() {
                0 => None,
                addr => self.shared.lookup(addr),
            };
            let id = if kind == CmEventKind::ConnectRequest {
                let new = raw.take_new_id().map(|new| self.shared.register(new));
                if listen_id.is_none() {
                    tracing::debug!("connect request for a destroyed listener; acked");
                    continue;
                }
                new
            } else {
                self.shared.lookup(raw.id_addr())
            };
            let Some(id) = id else {
                tracing::debug!(%kind, "event for a destroyed id; acked");
                continue;
            };
            if kind == CmEventKind::DeviceRemoval {
                // Its QP's flushes may never reach the CQ ring (see wr_track).
                let qp = id.shared.qp_wrs.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(t) = qp.upgrade() {
                    t.lose();
                }
            }
            let (param, private_data) = raw.conn_param();
            return Ok(CmEvent {
                status: raw.status(),
                raw,
                kind,
                id,
                listen_id,
                conn: ConnParam::from_c(&param, private_data),
            });
        }
    }
}

/// Connection parameters: `struct rdma_conn_param` with owned private data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data (at most 255 bytes here; keep to 56 for portability,
    /// rdma_connect(3)).
    pub private_data: Vec<u8>,
    /// IRD: incoming RDMA Reads the local side accepts in flight.
    pub responder_resources: u8,
    /// ORD: outgoing RDMA Reads in flight. Clamp both with
    /// [`crate::DeviceCaps::clamp_ord_ird`] (iw_cxgb4: at most 32).
    pub initiator_depth: u8,
    /// `flow_control` (ignored by iWARP).
    pub flow_control: u8,
    /// `retry_count` (ignored by iWARP).
    pub retry_count: u8,
    /// `rnr_retry_count` (ignored by iWARP).
    pub rnr_retry_count: u8,
}

impl ConnParam {
    fn from_c(c: &RdmaConnParam, private_data: Vec<u8>) -> ConnParam {
        ConnParam {
            private_data,
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            flow_control: c.flow_control,
            retry_count: c.retry_count,
            rnr_retry_count: c.rnr_retry_count,
        }
    }

    fn to_c(&self) -> RdmaConnParam {
        RdmaConnParam {
            private_data: core::ptr::null(),
            private_data_len: 0,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num: 0,
        }
    }
}

struct IdShared {
    // `Drop` removes the registry entry first; then this handle goes, and
    // with its last reference rdma_destroy_id runs.
    raw: Arc<RawCmId>,
    chan: Arc<ChannelShared>,
    /// The WRs of the id's QP ([`crate::wr_track`]): lost with a `DeviceRemoval`.
    qp_wrs: Mutex<Weak<WrTracker>>,
}

impl Drop for IdShared {
    fn drop(&mut self) {
        let mut ids = self.chan.ids.lock().unwrap_or_else(|p| p.into_inner());
        ids.remove(&self.raw.addr());
    }
}

/// An RDMA CM id (`struct rdma_cm_id`) in the TCP port space. Cloning
/// shares it; see the module docs for when it is destroyed.
#[derive(Clone)]
pub struct CmId {
    shared: Arc<IdShared>,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

impl PartialEq for CmId {
    /// The same librdmacm id.
    fn eq(&self, other: &CmId) -> bool {
        self.shared.raw.addr() == other.shared.raw.addr()
    }
}

impl Eq for CmId {}

/// Maps a librdmacm errno to the crate error, naming the call.
fn cm(call: &'static str) -> impl Fn(i32) -> Error {
    move |e| verbs_error(call, e).into()
}

impl CmId {
    /// `rdma_bind_addr(3)`: bind to a local address (and with it a device).
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`] (`EADDRINUSE` 98, `EADDRNOTAVAIL` 99 as OS errors).
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        self.shared
            .raw
            .bind_addr(addr)
            .map_err(cm("rdma_bind_addr"))
    }

    /// `rdma_resolve_addr(3)`: resolve `dst` (optionally from `src`) within
    /// `timeout_ms`; completes with [`CmEventKind::AddrResolved`] or
    /// [`CmEventKind::AddrError`].
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`].
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout_ms: i32,
    ) -> Result<()> {
        self.shared
            .raw
            .resolve_addr(src, dst, timeout_ms)
            .map_err(cm("rdma_resolve_addr"))
    }

    /// `rdma_resolve_route(3)`; completes with
    /// [`CmEventKind::RouteResolved`] or [`CmEventKind::RouteError`].
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`].
    pub fn resolve_route(&self, timeout_ms: i32) -> Result<()> {
        self.shared
            .raw
            .resolve_route(timeout_ms)
            .map_err(cm("rdma_resolve_route"))
    }

    /// `rdma_listen(3)` with `backlog` pending requests.
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`].
    pub fn listen(&self, backlog: i32) -> Result<()> {
        self.shared.raw.listen(backlog).map_err(cm("rdma_listen"))
    }

    /// `rdma_connect(3)`.
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`]: `EINVAL` for more than 255 bytes of private data or
    /// an ORD/IRD the device refuses.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        self.shared
            .raw
            .connect(param.to_c(), &param.private_data)
            .map_err(cm("rdma_connect"))
    }

    /// `rdma_accept(3)` (on the new id of a connect request).
    ///
    /// # Errors
    ///
    /// As [`CmId::connect`].
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        self.shared
            .raw
            .accept(param.to_c(), &param.private_data)
            .map_err(cm("rdma_accept"))
    }

    /// `rdma_reject(3)` with private data.
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`] (`EINVAL` above 255 bytes).
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        self.shared
            .raw
            .reject(private_data)
            .map_err(cm("rdma_reject"))
    }

    /// `rdma_disconnect(3)` (on iWARP the QP goes to SQD: a graceful close).
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`].
    pub fn disconnect(&self) -> Result<()> {
        self.shared.raw.disconnect().map_err(cm("rdma_disconnect"))
    }

    /// A key naming this id among the live ids of the process (the address
    /// of its `struct rdma_cm_id`; clones share it).
    pub fn key(&self) -> u64 {
        self.shared.raw.addr() as u64
    }

    /// The local address (`rdma_get_local_addr`), once bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.raw.local_addr()
    }

    /// The peer address (`rdma_get_peer_addr`), once resolved or connected.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.shared.raw.peer_addr()
    }

    /// The device context librdmacm opened for this id (`id->verbs`), on
    /// which the id's PD and CQs must be made; `None` until the id is bound
    /// to a device (bind to a device address, resolve, or a connect
    /// request's new id). The context keeps the id alive.
    pub fn context(&self) -> Option<Context> {
        RawContext::of_cm_id(&self.shared.raw).map(|raw| Context { raw: Arc::new(raw) })
    }

    /// Creates the id's RC QP (`rdma_create_qp(3)`) on `pd` with the CQs;
    /// `cap` is what is asked (the provider may grant more: see
    /// [`Qp::cap`]); `sq_sig_all` signals every send WR.
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`]: `EINVAL` if `pd` is not of this id's context or
    /// `cap` exceeds the device; `EOPNOTSUPP` if the provider has no post
    /// calls.
    pub fn create_qp(
        &self,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> Result<Qp> {
        let want = IbvQpCap {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        };
        let (raw, got) = RawQp::create(
            &self.shared.raw,
            &pd.raw,
            &send_cq.raw,
            &recv_cq.raw,
            want,
            sq_sig_all,
        )
        .map_err(cm("rdma_create_qp"))?;
        let wrs = Arc::new(WrTracker::new(raw.qp_num()));
        send_cq.trackers.add(&wrs);
        recv_cq.trackers.add(&wrs);
        *self.shared.qp_wrs.lock().unwrap_or_else(|p| p.into_inner()) = Arc::downgrade(&wrs);
        // iw_cxgb4 and kernel siw report IBV_ATOMIC_NONE: atomics are refused at post
        // time with a named error instead of whatever the provider would do with them.
        // A device that cannot be asked is taken to have none.
        let atomics = self
            .context()
            .and_then(|c| c.caps().ok())
            .is_some_and(|c| c.atomics);
        Ok(Qp {
            raw,
            wrs,
            atomics,
            sinks: pd.sinks.clone(),
            cap: QpCap {
                max_send_wr: got.max_send_wr,
                max_recv_wr: got.max_recv_wr,
                max_send_sge: got.max_send_sge,
                max_recv_sge: got.max_recv_sge,
                max_inline_data: got.max_inline_data,
            },
        })
    }

    /// Drops this handle (`rdma_destroy_id(3)` once the last holder is gone;
    /// see the module docs).
    pub fn destroy(self) {}
}

/// One CM event, owned: acknowledged when dropped. Carries the id it is for
/// (for a connect request: the new id, to accept or reject), the listening
/// id of a connect request, the status and a copy of the connection
/// parameters and private data.
pub struct CmEvent {
    // Declared first: dropped (acked) before `id` and `listen_id`.
    raw: RawCmEvent,
    kind: CmEventKind,
    status: i32,
    id: CmId,
    listen_id: Option<CmId>,
    conn: ConnParam,
}

impl std::fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmEvent")
            .field("kind", &self.kind)
            .field("status", &self.status)
            .field("conn", &self.conn)
            .finish()
    }
}

impl CmEvent {
    /// What happened.
    pub fn kind(&self) -> CmEventKind {
        self.kind
    }

    /// `status`: 0 on success; for errors a negative errno, for
    /// [`CmEventKind::Rejected`] the transport's reject reason.
    pub fn status(&self) -> i32 {
        self.status
    }

    /// The id the event is for (a clone shares it).
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The listening id of a connect request.
    pub fn listen_id(&self) -> Option<&CmId> {
        self.listen_id.as_ref()
    }

    /// The connection parameters (connect request, established, rejected
    /// events), with the private data copied.
    pub fn conn_param(&self) -> &ConnParam {
        &self.conn
    }

    /// The private data (a copy; empty if none).
    pub fn private_data(&self) -> &[u8] {
        &self.conn.private_data
    }

    /// Acknowledges the event now (`rdma_ack_cm_event(3)`); the same as
    /// dropping it.
    pub fn ack(self) {
        drop(self.raw);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_param_round_trip_keeps_the_numbers() {
        let p = ConnParam {
            private_data: vec![1, 2, 3],
            responder_resources: 32,
            initiator_depth: 16,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 6,
        };
        let c = p.to_c();
        assert!(
            c.private_data.is_null(),
            "set by the FFI from the Vec at call time"
        );
        assert_eq!(
            (
                c.responder_resources,
                c.initiator_depth,
                c.flow_control,
                c.retry_count,
                c.rnr_retry_count
            ),
            (32, 16, 1, 7, 6)
        );
        assert_eq!(ConnParam::from_c(&c, vec![1, 2, 3]), p);
    }
}
