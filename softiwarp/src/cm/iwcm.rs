//! The soft device as an iWARP CM provider: [`SoftProvider`] implements
//! [`iw_cm::Provider`] over a [`Device`] (the kernel's `iw_cm_verbs` of siw).
//!
//! ```text
//!  user threads / CM workers ──downcalls──> SoftProvider ──commands──> engine thread
//!                                                                         │ events queued per
//!                                                                         │ connection / listener,
//!                                                                         │ activity signal raised
//!  CM workers <──EventSink::report (enqueue)── provider thread <──────────┘
//! ```
//!
//! # Threads
//!
//! * **Downcalls** ([`Provider::connect`], `accept`, `reject`, `create_listen`,
//!   `destroy_listen`, `disconnect`) run on the caller's thread (a user thread or a CM
//!   worker). They issue device commands and wait for the engine's answer (microseconds;
//!   the engine never waits for anyone), and never report events.
//! * **The engine thread** (one per device) queues each connection's events on its
//!   connection, connection requests on their listener, and raises the device's
//!   activity signal. It runs no provider code and no user code.
//! * **The provider thread** (one per `SoftProvider`, named `iwp-<device>`) sleeps on that
//!   signal, drains the queues of the connections and listeners it watches, turns what it
//!   finds into [`ProviderEvent`]s (table below) and hands them to the cm_id's
//!   [`EventSink`], which only enqueues (design.md section 5, iw-cm rule 1). The CM's
//!   workers deliver them to the user. So user code never runs on the engine or the
//!   provider thread, and per connection the events keep the engine's order (one thread
//!   reports them all).
//!
//! # Event mapping
//!
//! | device ([`ConnEvent`]) | initiator (connect) | responder (accepted) |
//! |---|---|---|
//! | `Established` | `ConnectReply(Ok)` with the peer's private data and IRD/ORD | `Established` |
//! | `Disconnected` (peer's FIN) after `Established` | `Disconnect` | `Disconnect` |
//! | `Closed` / `Failed(_)` after `Established` | `Close` | `Close` |
//! | `Closed` / `Failed(e)` before `Established` | `ConnectReply(connect_status(e))` | `Close` |
//! | a valid MPA Request on a listener | - | `ConnectRequest` on the listener's id (private data, IRD/ORD, addresses) |
//! | device gone or shut down, connection not ended | `Close` (or `ConnectReply(Reset)` while connecting) | `Close` |
//!
//! [`connect_status`] maps a failure before establishment to the `ConnectReply` status:
//!
//! | [`ConnError`] | [`ConnectStatus`] | why |
//! |---|---|---|
//! | `Rejected { private_data }` | `Rejected` (+ the reject Reply's private data) | MPA Reply with R set (`-ECONNREFUSED`) |
//! | `Refused` | `Refused` | RST answered the SYN: nothing listens, or the listener's device backlog is full (`-ECONNREFUSED`) |
//! | `TimedOut(TcpConnect)`, `TimedOut(MpaReply)`, `Mpa(Timeout)` | `TimedOut` | no SYN-ACK, or no MPA Reply within the startup timeout (`-ETIMEDOUT`) |
//! | `Reset` | `Reset` | RST or TCP user timeout during setup (`-ECONNRESET`) |
//! | `Mpa(_)` (bad Reply, negotiation failed, peer closed during startup, ...), `TerminateReceived`, `TerminateSent`, `Ulp`, `Setup` | `Reset` | the connection was torn down during setup; iw-cm has no finer status (siw reports `-EINVAL`/`-EPROTO`/`-ECONNRESET` here) |
//! | `DeviceGone`, `DeviceClosed` | `Reset` | the device ended under the attempt |
//! | `Closed` (no error: the attempt was aborted locally, `disconnect`/destroy) | `Reset` | "the attempt was aborted" |
//!
//! # The QP type
//!
//! The provider's `Qp` is [`SoftQp`] (`Arc<Qp>`): create the QP with
//! [`Device::create_qp`](crate::api::device::Device::create_qp), wrap it in an `Arc`, and pass it as
//! `ConnectParams::qp` / `AcceptParams::qp` (each connection needs its own QP). `QpCap`
//! comes from the `verbs` crate. The initiator hears `ConnectReply { status: Ok, .. }`
//! when connected, the accepted child `Established`.
//!
//! # Downcalls
//!
//! | [`Provider`] | device |
//! |---|---|
//! | `connect` | [`Device::connect_qp`] (the QP moves to RTS with the negotiated ORD/IRD) |
//! | `accept` | [`ConnectRequest::accept_qp`] |
//! | `reject` | [`ConnectRequest::reject`] (MPA Reply with R set and the private data, then FIN) |
//! | `create_listen(addr, backlog)` | [`Device::listen`] with a device backlog of `2 * backlog` (at most [`MAX_BACKLOG`]) |
//! | `destroy_listen` | dropping the [`Listener`] (untaken requests are rejected) |
//! | `disconnect(Graceful / Abortive)` | [`QpConnection::close`] with [`CloseMode::Graceful`] (FIN after what is queued) / [`CloseMode::Abortive`] (RST) |
//! | `qp_add_ref` / `qp_rem_ref` | a counted reference (an `Arc` of the [`Qp`]) kept by the provider |
//!
//! Backlog: the CM queues at most `backlog` undelivered requests and rejects the excess
//! at the provider ([`Provider::reject`]: the client sees `ConnectReply(Rejected)`, as
//! with Linux iw_cm, whose TCP backlog is not the limit). The device listener gets twice
//! that room (requests delivered but not yet answered count too); beyond it the
//! device answers SYNs with RST and the client sees `ConnectReply(Refused)`.
//!
//! Addresses: IPv4 only. A listen or local address must be one of the device's
//! addresses or unspecified ([`ProviderError::AddressNotAvailable`] otherwise); a
//! host-TCP device listens on every address of its interface whichever was named. The local port of an
//! active connection is always an ephemeral one the device picks; a port in
//! [`ConnectArgs::local_addr`] is not honoured.
//!
//! Lifetime: a [`SoftProvider`] owns a reference on its [`Device`] and its provider thread.
//! Each connection or listener it watches holds the cm_id's [`EventSink`] until the final
//! event is reported (or the listener destroyed); the sinks hold the CM, which holds the
//! provider, so a provider and its device live as long as any cm_id of theirs does.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use iw_cm::{
    AcceptArgs, ConnectArgs, ConnectReply, ConnectStatus, DisconnectMode, EventSink,
    IncomingRequest, Provider, ProviderError, ProviderEvent,
};
use verbs::VerbsError;

use crate::transport::mpa_conn::{CallError, MpaError};
use crate::transport::{CloseMode, ConnError, ConnEvent, MpaParams, StackError, MAX_BACKLOG};
use crate::Qp;
use crate::{ConnectRequest, Device, DeviceEnd, DeviceError, Listener, QpConnection};
use mpa::negotiate::SettingsError;

/// The provider's QP handle: a shared [`Qp`] (create it with [`Device::create_qp`] and
/// wrap it in an `Arc`). The CM keeps a clone while the QP is bound to a cm_id, and the
/// provider keeps one per [`Provider::qp_add_ref`].
pub type SoftQp = Arc<Qp>;

/// How often the provider thread looks at its queues when nothing signalled (a safety
/// net; every event is signalled).
const RESCAN: Duration = Duration::from_millis(200);

/// The [`ConnectReply`] status of a connection that failed with `error` before it was
/// established (see the [module docs](self) for the table).
pub fn connect_status(error: &ConnError) -> ConnectStatus {
    match error {
        ConnError::Rejected { .. } => ConnectStatus::Rejected,
        ConnError::Refused => ConnectStatus::Refused,
        ConnError::TimedOut(_) | ConnError::Mpa(MpaError::Timeout { .. }) => {
            ConnectStatus::TimedOut
        }
        ConnError::Reset
        | ConnError::Mpa(_)
        | ConnError::TerminateReceived(_)
        | ConnError::TerminateSent(_)
        | ConnError::Ulp(_)
        | ConnError::Setup(_)
        | ConnError::DeviceGone(_)
        | ConnError::DeviceClosed => ConnectStatus::Reset,
    }
}

/// The [`ProviderError`] of a failed device call.
pub fn provider_error(error: DeviceError) -> ProviderError {
    match error {
        DeviceError::Gone(_) | DeviceError::Closed | DeviceError::Verbs(VerbsError::DeviceGone) => {
            ProviderError::DeviceRemoved
        }
        DeviceError::Verbs(e) => ProviderError::InvalidQp(e.to_string()),
        DeviceError::Stack(e) => match e {
            StackError::PortInUse(_) => ProviderError::AddressInUse,
            StackError::NoFreePort => ProviderError::NoResources,
            StackError::NoSuchConnection(_)
            | StackError::NoSuchListener(_)
            | StackError::WrongState { .. } => ProviderError::NotConnected,
            StackError::Gone(_) => ProviderError::DeviceRemoved,
            StackError::Settings(SettingsError::PrivateDataTooLong { len, limit })
            | StackError::Mpa(CallError::Settings(SettingsError::PrivateDataTooLong {
                len,
                limit,
            })) => ProviderError::PrivateDataTooLong { len, max: limit },
            other => ProviderError::Other(other.to_string()),
        },
        other => ProviderError::Other(other.to_string()),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here leaves its data consistent (no user code runs under
    // these locks), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Live-object and event counters of a [`SoftProvider`] ([`SoftProvider::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProviderStats {
    /// Connection handles ([`SoftConn`]) not yet freed: incoming requests not yet
    /// released by the CM, and connections (active or accepted) not yet finished.
    pub conns_alive: usize,
    /// Connections the provider thread watches: connected or connecting, final event
    /// not reported yet.
    pub conns_watched: usize,
    /// Listeners not yet destroyed.
    pub listeners: usize,
    /// References taken by `qp_add_ref` and not yet dropped by `qp_rem_ref`.
    pub qp_refs: usize,
    /// `ConnectRequest`s reported.
    pub requests: usize,
    /// `ConnectReply`s reported (any status).
    pub replies: usize,
    /// `Established` reported.
    pub established: usize,
    /// `Disconnect` reported.
    pub disconnects: usize,
    /// `Close` reported.
    pub closes: usize,
    /// Reports the CM refused (id destroyed, backlog full, CM shut down); the CM
    /// already did what was needed (a refused request is rejected at the provider).
    pub refused_reports: usize,
    /// Connections whose end was synthesized because the device ended without
    /// reporting it.
    pub synthesized_ends: usize,
}

#[derive(Debug, Default)]
struct Counters {
    conns_alive: AtomicUsize,
    requests: AtomicUsize,
    replies: AtomicUsize,
    established: AtomicUsize,
    disconnects: AtomicUsize,
    closes: AtomicUsize,
    refused_reports: AtomicUsize,
    synthesized_ends: AtomicUsize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Active,
    Passive,
}

#[derive(Default)]
struct ConnState {
    /// Passive, before accept/reject: the device's pending request.
    request: Option<ConnectRequest>,
    /// The connection once connecting (active) or accepted (passive).
    conn: Option<Arc<QpConnection>>,
    /// Where its events go, while they may still come.
    sink: Option<EventSink<SoftProvider>>,
    established: bool,
    finished: bool,
}

struct ConnEntry {
    key: u64,
    role: Role,
    local: SocketAddr,
    remote: SocketAddr,
    st: Mutex<ConnState>,
    counters: Arc<Counters>,
}

impl Drop for ConnEntry {
    fn drop(&mut self) {
        self.counters.conns_alive.fetch_sub(1, Relaxed);
    }
}

/// The provider's handle of one connection endpoint (`Provider::Conn`, siw's `cep`): an
/// incoming request on a listener, or a connection being set up or established.
#[derive(Clone)]
pub struct SoftConn(Arc<ConnEntry>);

impl std::fmt::Debug for SoftConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftConn")
            .field("key", &self.0.key)
            .field("role", &self.0.role)
            .field("local", &self.0.local)
            .field("remote", &self.0.remote)
            .finish_non_exhaustive()
    }
}

impl SoftConn {
    /// Our address of the connection (for an active connection: the device's address
    /// and port 0 until established).
    pub fn local_addr(&self) -> SocketAddr {
        self.0.local
    }

    /// The peer's address.
    pub fn remote_addr(&self) -> SocketAddr {
        self.0.remote
    }

    /// The device connection's id, once connecting or accepted.
    pub fn conn_id(&self) -> Option<crate::transport::ConnId> {
        lock(&self.0.st).conn.as_ref().map(|c| c.id())
    }
}

struct ListenEntry {
    key: u64,
    local: SocketAddrV4,
    listener: Mutex<Option<Listener>>,
    sink: Mutex<Option<EventSink<SoftProvider>>>,
}

/// The provider's handle of one listener (`Provider::Listener`).
pub struct SoftListener(Arc<ListenEntry>);

impl std::fmt::Debug for SoftListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftListener")
            .field("key", &self.0.key)
            .field("local", &self.0.local)
            .finish_non_exhaustive()
    }
}

impl SoftListener {
    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.0.local
    }
}

#[derive(Default)]
struct Tables {
    conns: HashMap<u64, Arc<ConnEntry>>,
    listeners: HashMap<u64, Arc<ListenEntry>>,
    next_key: u64,
}

type EndHook = Box<dyn FnOnce(DeviceEnd) + Send>;

struct Inner {
    device: Arc<Device>,
    tables: Mutex<Tables>,
    qp_refs: Mutex<HashMap<u32, (SoftQp, usize)>>,
    counters: Arc<Counters>,
    stop: AtomicBool,
    end_hook: Mutex<Option<EndHook>>,
}

impl Inner {
    fn next_key(&self) -> u64 {
        let mut t = lock(&self.tables);
        t.next_key += 1;
        t.next_key
    }

    fn report(&self, sink: &EventSink<SoftProvider>, event: ProviderEvent<SoftConn>) {
        let counter = match &event {
            ProviderEvent::ConnectRequest(_) => &self.counters.requests,
            ProviderEvent::ConnectReply(_) => &self.counters.replies,
            ProviderEvent::Established => &self.counters.established,
            ProviderEvent::Disconnect => &self.counters.disconnects,
            ProviderEvent::Close => &self.counters.closes,
        };
        counter.fetch_add(1, Relaxed);
        tracing::trace!(cm_id = sink.cm_id_serial(), ?event, "report");
        if let Err(e) = sink.report(event) {
            self.counters.refused_reports.fetch_add(1, Relaxed);
            tracing::debug!(cm_id = sink.cm_id_serial(), error = %e, "report refused by the CM");
        }
    }

    /// Watch a connection: the provider thread drains its events from now on.
    fn watch(&self, entry: Arc<ConnEntry>) {
        lock(&self.tables).conns.insert(entry.key, entry);
        self.device.activity().notify();
    }

    /// Report the requests that reached a listener.
    fn pump_listener(&self, l: &ListenEntry) {
        let mut requests = Vec::new();
        {
            let guard = lock(&l.listener);
            let Some(listener) = guard.as_ref() else {
                return;
            };
            // Until `Timeout` (nothing more now), `Closed` or `Gone` (the device ended).
            while let Ok(r) = listener.next_request(Duration::ZERO) {
                requests.push(r);
            }
        }
        if requests.is_empty() {
            return;
        }
        let Some(sink) = lock(&l.sink).clone() else {
            // Destroyed meanwhile: dropping the requests rejects them.
            return;
        };
        for r in requests {
            let (ird, ord) = r.ird_ord().unwrap_or((0, 0));
            let private_data = r.private_data().to_vec();
            let (local, remote) = (SocketAddr::V4(r.local()), SocketAddr::V4(r.remote()));
            self.counters.conns_alive.fetch_add(1, Relaxed);
            let entry = Arc::new(ConnEntry {
                key: self.next_key(),
                role: Role::Passive,
                local,
                remote,
                st: Mutex::new(ConnState {
                    request: Some(r),
                    ..ConnState::default()
                }),
                counters: self.counters.clone(),
            });
            tracing::debug!(%remote, %local, cm_id = sink.cm_id_serial(), "connect request");
            self.report(
                &sink,
                ProviderEvent::ConnectRequest(IncomingRequest {
                    conn: SoftConn(entry),
                    private_data,
                    ird,
                    ord,
                    local_addr: local,
                    remote_addr: remote,
                }),
            );
        }
    }

    /// Report a watched connection's new events. Returns whether it is finished (its
    /// final event reported): then it is no longer watched.
    fn pump_conn(&self, e: &ConnEntry, device_ended: bool) -> bool {
        let mut events = Vec::new();
        let (sink, spent) = {
            let mut st = lock(&e.st);
            if st.finished {
                return true;
            }
            let Some(conn) = st.conn.clone() else {
                return false;
            };
            while let Some(ev) = conn.next_event(Duration::ZERO) {
                let last = ev.is_final();
                if let Some(out) = translate(e.role, &mut st.established, ev) {
                    events.push(out);
                }
                if last {
                    st.finished = true;
                    break;
                }
            }
            if !st.finished && device_ended {
                // Every event the engine will ever queue was queued before it recorded
                // the end, which was read before this drain: nothing more will come.
                self.counters.synthesized_ends.fetch_add(1, Relaxed);
                tracing::debug!(key = e.key, "device ended: ending the connection");
                let ev = ConnEvent::Failed(ConnError::DeviceClosed);
                if let Some(out) = translate(e.role, &mut st.established, ev) {
                    events.push(out);
                }
                st.finished = true;
            }
            let sink = st.sink.clone();
            let spent = if st.finished {
                Some((st.sink.take(), st.conn.take()))
            } else {
                None
            };
            (sink, spent)
        };
        if !events.is_empty() && self.device.ended().is_some() {
            // These may be the device end's own failures: the end hook (rdma-cm's
            // device removal) goes first, as the kernel's cma_remove_one precedes the
            // driver tearing its connections down.
            self.run_end_hook();
        }
        if let Some(sink) = &sink {
            for ev in events {
                self.report(sink, ev);
            }
        }
        // The sink (maybe the last reference on the cm_id) and the connection go
        // outside every lock.
        drop(sink);
        spent.is_some()
    }

    /// Run the end hook if it is still there (once per hook).
    fn run_end_hook(&self) {
        let hook = lock(&self.end_hook).take();
        if let Some(hook) = hook {
            if let Some(end) = self.device.ended() {
                tracing::debug!(?end, "device ended: end hook");
                hook(end);
            }
        }
    }

    /// One pass over everything watched.
    fn pump(&self, device_ended: bool) {
        let (listeners, conns): (Vec<_>, Vec<_>) = {
            let t = lock(&self.tables);
            (
                t.listeners.values().cloned().collect(),
                t.conns.values().cloned().collect(),
            )
        };
        for l in &listeners {
            self.pump_listener(l);
        }
        let mut done = Vec::new();
        for c in &conns {
            if self.pump_conn(c, device_ended) {
                done.push(c.key);
            }
        }
        if !done.is_empty() {
            let removed: Vec<_> = {
                let mut t = lock(&self.tables);
                done.iter().filter_map(|k| t.conns.remove(k)).collect()
            };
            drop(removed);
        }
    }
}

/// Turn one device event of a connection into the CM event it means (module table).
fn translate(
    role: Role,
    established: &mut bool,
    event: ConnEvent,
) -> Option<ProviderEvent<SoftConn>> {
    match event {
        ConnEvent::Established(info) => {
            *established = true;
            Some(match role {
                Role::Active => {
                    let (ird, ord) = info.agreed.peer.map_or((0, 0), |p| (p.ird, p.ord));
                    ProviderEvent::ConnectReply(ConnectReply {
                        status: ConnectStatus::Ok,
                        private_data: info.agreed.peer_private_data,
                        ird,
                        ord,
                    })
                }
                Role::Passive => ProviderEvent::Established,
            })
        }
        ConnEvent::Disconnected => (*established).then_some(ProviderEvent::Disconnect),
        ConnEvent::Closed | ConnEvent::Failed(_) if *established || role == Role::Passive => {
            Some(ProviderEvent::Close)
        }
        ConnEvent::Closed => Some(ProviderEvent::ConnectReply(ConnectReply::with_status(
            ConnectStatus::Reset,
        ))),
        ConnEvent::Failed(e) => {
            let status = connect_status(&e);
            let private_data = match e {
                ConnError::Rejected { private_data } => private_data,
                _ => Vec::new(),
            };
            Some(ProviderEvent::ConnectReply(ConnectReply {
                status,
                private_data,
                ird: 0,
                ord: 0,
            }))
        }
    }
}

fn provider_thread(inner: Arc<Inner>) {
    let signal = inner.device.activity();
    loop {
        let seen = signal.current();
        if inner.stop.load(Relaxed) {
            break;
        }
        let ended = inner.device.ended();
        if ended.is_some() {
            // Before any connection's end is reported (see `pump_conn`).
            inner.run_end_hook();
        }
        inner.pump(ended.is_some());
        signal.wait_past(seen, RESCAN);
    }
}

/// The soft device as an [`iw_cm::Provider`]: see the [module docs](self).
///
/// ```
/// use std::net::{Ipv4Addr, SocketAddr};
/// use std::sync::Arc;
/// use iw_cm::{CmConfig, CmEvent, CmIdRef, Disposition, IwCm};
/// use softiwarp::{Device, DeviceConfig, LinkConfig};
/// use softiwarp::cm::iwcm::SoftProvider;
/// use softiwarp::link::{MemoryConfig, MemoryLink};
///
/// let (a, _b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
/// let dev = Device::open(DeviceConfig::new(
///     "srv", LinkConfig::memory(a), Ipv4Addr::new(10, 9, 0, 2), 24)).unwrap();
/// let provider = Arc::new(SoftProvider::new(Arc::new(dev)).unwrap());
/// let cm = IwCm::new(provider.clone(), CmConfig::default()).unwrap();
/// let listener = cm.create_id(|_: &CmIdRef<SoftProvider>, _: CmEvent<SoftProvider>| {
///     Disposition::Keep
/// });
/// listener.listen(SocketAddr::from((Ipv4Addr::new(10, 9, 0, 2), 4791)), 8).unwrap();
/// assert_eq!(provider.stats().listeners, 1);
/// drop(listener);
/// assert_eq!(provider.stats().listeners, 0);
/// ```
pub struct SoftProvider {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for SoftProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftProvider")
            .field("device", &self.inner.device.name())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl SoftProvider {
    /// A provider over `device`, with its provider thread (`iwp-<device name>`).
    ///
    /// # Errors
    /// [`DeviceError::Thread`] if the thread cannot be started.
    pub fn new(device: Arc<Device>) -> Result<SoftProvider, DeviceError> {
        let name: String = format!("iwp-{}", device.name()).chars().take(15).collect();
        let inner = Arc::new(Inner {
            device,
            tables: Mutex::new(Tables::default()),
            qp_refs: Mutex::new(HashMap::new()),
            counters: Arc::new(Counters::default()),
            stop: AtomicBool::new(false),
            end_hook: Mutex::new(None),
        });
        let t_inner = inner.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || provider_thread(t_inner))
            .map_err(DeviceError::Thread)?;
        Ok(SoftProvider {
            inner,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The device.
    pub fn device(&self) -> &Arc<Device> {
        &self.inner.device
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ProviderStats {
        let c = &self.inner.counters;
        let (conns_watched, listeners) = {
            let t = lock(&self.inner.tables);
            (t.conns.len(), t.listeners.len())
        };
        ProviderStats {
            conns_alive: c.conns_alive.load(Relaxed),
            conns_watched,
            listeners,
            qp_refs: lock(&self.inner.qp_refs).values().map(|(_, n)| n).sum(),
            requests: c.requests.load(Relaxed),
            replies: c.replies.load(Relaxed),
            established: c.established.load(Relaxed),
            disconnects: c.disconnects.load(Relaxed),
            closes: c.closes.load(Relaxed),
            refused_reports: c.refused_reports.load(Relaxed),
            synthesized_ends: c.synthesized_ends.load(Relaxed),
        }
    }

    /// References `qp_add_ref` holds on QP `qp_num`.
    pub fn qp_refs(&self, qp_num: u32) -> usize {
        lock(&self.inner.qp_refs)
            .get(&qp_num)
            .map_or(0, |(_, n)| *n)
    }

    /// Run `hook` once the device has ended (gone or shut down), *before* the provider
    /// reports any connection end that it drains after the end was recorded (`Close`,
    /// or `ConnectReply(Reset)` while connecting): the point where rdma-cm's device
    /// removal starts (design.md section 5), ahead of the connections' ends as in the
    /// kernel (`ib_unregister_device` calls `cma_remove_one` before the driver tears
    /// its connections down), so that rdma-cm can mark its ids first and deliver
    /// `DeviceRemoval` instead of `Disconnected`. It runs on the provider thread, so it
    /// must not block (never call a CM user or wait for a CM worker; brief locks are
    /// fine). Replaces an earlier hook; runs at once (on the provider thread's next
    /// pass) if the device has already ended.
    pub fn on_device_end(&self, hook: impl FnOnce(DeviceEnd) + Send + 'static) {
        *lock(&self.inner.end_hook) = Some(Box::new(hook));
        self.inner.device.activity().notify();
    }

    fn check_local(&self, ip: Ipv4Addr) -> Result<(), ProviderError> {
        if ip.is_unspecified()
            || ip == self.inner.device.address()
            || self.inner.device.addresses().iter().any(|a| a.addr == ip)
        {
            Ok(())
        } else {
            Err(ProviderError::AddressNotAvailable)
        }
    }
}

impl Drop for SoftProvider {
    fn drop(&mut self) {
        self.inner.stop.store(true, Relaxed);
        self.inner.device.activity().notify();
        let thread = lock(&self.thread).take();
        if let Some(t) = thread {
            // The provider thread may drop the last reference itself (the last sink of
            // a cm_id): it then exits on its own.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl Provider for SoftProvider {
    type Qp = SoftQp;
    type Conn = SoftConn;
    type Listener = SoftListener;

    fn connect(
        &self,
        sink: EventSink<Self>,
        args: ConnectArgs<'_, SoftQp>,
    ) -> Result<SoftConn, ProviderError> {
        let SocketAddr::V4(remote) = args.remote_addr else {
            return Err(ProviderError::AddressNotAvailable);
        };
        if let Some(local) = args.local_addr {
            let SocketAddr::V4(local) = local else {
                return Err(ProviderError::AddressNotAvailable);
            };
            self.check_local(*local.ip())?;
        }
        let params = MpaParams {
            private_data: args.private_data.to_vec(),
            ird: args.ird,
            ord: args.ord,
            settings: None,
        };
        let inner = &self.inner;
        let conn = inner
            .device
            .connect_qp(*remote.ip(), remote.port(), params, args.qp)
            .map_err(provider_error)?;
        inner.counters.conns_alive.fetch_add(1, Relaxed);
        let entry = Arc::new(ConnEntry {
            key: inner.next_key(),
            role: Role::Active,
            local: SocketAddr::from((inner.device.address(), 0)),
            remote: args.remote_addr,
            st: Mutex::new(ConnState {
                conn: Some(Arc::new(conn)),
                sink: Some(sink),
                ..ConnState::default()
            }),
            counters: inner.counters.clone(),
        });
        tracing::debug!(%remote, key = entry.key, qpn = args.qp.qp_num(), "connect");
        inner.watch(entry.clone());
        Ok(SoftConn(entry))
    }

    fn accept(
        &self,
        sink: EventSink<Self>,
        conn: &SoftConn,
        args: AcceptArgs<'_, SoftQp>,
    ) -> Result<(), ProviderError> {
        let e = &conn.0;
        let request = lock(&e.st)
            .request
            .take()
            .ok_or(ProviderError::NotConnected)?;
        // On error the request is dropped, which rejects it.
        let qpc = request
            .accept_qp(args.qp, args.private_data, args.ird, args.ord)
            .map_err(provider_error)?;
        {
            let mut st = lock(&e.st);
            st.conn = Some(Arc::new(qpc));
            st.sink = Some(sink);
        }
        tracing::debug!(key = e.key, qpn = args.qp.qp_num(), "accept");
        self.inner.watch(e.clone());
        Ok(())
    }

    fn reject(&self, conn: &SoftConn, private_data: &[u8]) -> Result<(), ProviderError> {
        let request = lock(&conn.0.st)
            .request
            .take()
            .ok_or(ProviderError::NotConnected)?;
        tracing::debug!(key = conn.0.key, "reject");
        request.reject(private_data).map_err(provider_error)
    }

    fn create_listen(
        &self,
        sink: EventSink<Self>,
        local_addr: SocketAddr,
        backlog: u32,
    ) -> Result<SoftListener, ProviderError> {
        let SocketAddr::V4(local) = local_addr else {
            return Err(ProviderError::AddressNotAvailable);
        };
        self.check_local(*local.ip())?;
        let cm_backlog = usize::try_from(backlog).unwrap_or(MAX_BACKLOG).max(1);
        let device_backlog = cm_backlog.saturating_mul(2).min(MAX_BACKLOG);
        let listener = self
            .inner
            .device
            .listen(local.port(), device_backlog)
            .map_err(provider_error)?;
        let entry = Arc::new(ListenEntry {
            key: self.inner.next_key(),
            local,
            listener: Mutex::new(Some(listener)),
            sink: Mutex::new(Some(sink)),
        });
        tracing::debug!(%local, backlog, device_backlog, "listen");
        lock(&self.inner.tables)
            .listeners
            .insert(entry.key, entry.clone());
        self.inner.device.activity().notify();
        Ok(SoftListener(entry))
    }

    fn destroy_listen(&self, listener: SoftListener) {
        let e = listener.0;
        let removed = lock(&self.inner.tables).listeners.remove(&e.key);
        let device_listener = lock(&e.listener).take();
        let sink = lock(&e.sink).take();
        tracing::debug!(local = %e.local, "destroy listen");
        // Dropping the device listener stops listening and rejects untaken requests.
        drop(device_listener);
        drop(sink);
        drop(removed);
    }

    fn disconnect(
        &self,
        conn: &SoftConn,
        _qp: Option<&SoftQp>,
        mode: DisconnectMode,
    ) -> Result<(), ProviderError> {
        let (c, request) = {
            let mut st = lock(&conn.0.st);
            match st.conn.clone() {
                Some(c) => (Some(c), None),
                None => (None, st.request.take()),
            }
        };
        let mode = match mode {
            DisconnectMode::Graceful => CloseMode::Graceful,
            DisconnectMode::Abortive => CloseMode::Abortive,
        };
        tracing::debug!(key = conn.0.key, ?mode, "disconnect");
        match (c, request) {
            (Some(c), _) => c.close(mode).map_err(provider_error),
            // Not accepted: nothing is connected; refuse the request.
            (None, Some(r)) => r.reject(&[]).map_err(provider_error),
            (None, None) => Err(ProviderError::NotConnected),
        }
    }

    fn qp_add_ref(&self, qp: &SoftQp) {
        lock(&self.inner.qp_refs)
            .entry(qp.qp_num())
            .or_insert_with(|| (qp.clone(), 0))
            .1 += 1;
    }

    fn qp_rem_ref(&self, qp: &SoftQp) {
        let released = {
            let mut refs = lock(&self.inner.qp_refs);
            match refs.get_mut(&qp.qp_num()) {
                Some((_, n)) if *n > 1 => {
                    *n -= 1;
                    None
                }
                Some(_) => refs.remove(&qp.qp_num()),
                None => {
                    tracing::warn!(qpn = qp.qp_num(), "qp_rem_ref without a reference");
                    None
                }
            }
        };
        // The provider's `Arc` of the QP goes outside the lock.
        drop(released);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::GoneReason;
    use crate::transport::TimeoutPhase;

    #[test]
    fn failures_before_establishment_map_to_connect_statuses() {
        let cases = [
            (
                ConnError::Rejected {
                    private_data: b"no".to_vec(),
                },
                ConnectStatus::Rejected,
            ),
            (ConnError::Refused, ConnectStatus::Refused),
            (
                ConnError::TimedOut(TimeoutPhase::TcpConnect),
                ConnectStatus::TimedOut,
            ),
            (
                ConnError::TimedOut(TimeoutPhase::MpaReply),
                ConnectStatus::TimedOut,
            ),
            (ConnError::Reset, ConnectStatus::Reset),
            (
                ConnError::DeviceGone(GoneReason::Injected),
                ConnectStatus::Reset,
            ),
            (ConnError::DeviceClosed, ConnectStatus::Reset),
            (ConnError::Setup("emss".into()), ConnectStatus::Reset),
        ];
        for (e, want) in cases {
            assert_eq!(connect_status(&e), want, "{e:?}");
        }
        let mut est = false;
        let Some(ProviderEvent::ConnectReply(r)) = translate(
            Role::Active,
            &mut est,
            ConnEvent::Failed(ConnError::Rejected {
                private_data: b"busy".to_vec(),
            }),
        ) else {
            panic!("a reply")
        };
        assert_eq!(r.status, ConnectStatus::Rejected);
        assert_eq!(r.private_data, b"busy");
        let Some(ProviderEvent::ConnectReply(r)) =
            translate(Role::Active, &mut est, ConnEvent::Closed)
        else {
            panic!("a reply")
        };
        assert_eq!(r.status, ConnectStatus::Reset, "a locally aborted attempt");
    }

    #[test]
    fn after_establishment_every_end_is_close() {
        for role in [Role::Active, Role::Passive] {
            let mut est = true;
            assert!(matches!(
                translate(role, &mut est, ConnEvent::Disconnected),
                Some(ProviderEvent::Disconnect)
            ));
            assert!(matches!(
                translate(role, &mut est, ConnEvent::Failed(ConnError::Reset)),
                Some(ProviderEvent::Close)
            ));
            assert!(matches!(
                translate(role, &mut est, ConnEvent::Closed),
                Some(ProviderEvent::Close)
            ));
        }
        // An accepted connection failing before Established ends with Close.
        let mut est = false;
        assert!(matches!(
            translate(Role::Passive, &mut est, ConnEvent::Failed(ConnError::Reset)),
            Some(ProviderEvent::Close)
        ));
    }

    #[test]
    fn device_errors_map_to_provider_errors() {
        assert_eq!(
            provider_error(DeviceError::Stack(StackError::PortInUse(1))),
            ProviderError::AddressInUse
        );
        assert_eq!(
            provider_error(DeviceError::Gone(GoneReason::Injected)),
            ProviderError::DeviceRemoved
        );
        assert_eq!(
            provider_error(DeviceError::Verbs(VerbsError::DeviceGone)),
            ProviderError::DeviceRemoved
        );
        assert!(matches!(
            provider_error(DeviceError::Verbs(VerbsError::InUse {
                object: verbs::ObjectKind::Qp
            })),
            ProviderError::InvalidQp(_)
        ));
    }
}
