//! Connection setup: the soft device and everything iwperf does through rdma-cm. This
//! is the only module that talks to rdma-cm (`softiwarp::cm::rdmacm::SoftDevice`,
//! `rdma_cm::RdmaCm`, ids and their events), in the order librdmacm programs use:
//!
//! - server: `create_id`, `bind_addr`, `listen`; per `ConnectRequest`: read the test
//!   parameters from the private data, `create_qp` on the new id's device (`id->verbs`),
//!   let the data path register its buffers and post its receives, `accept` with the
//!   server's buffer (iova, rkey, length) as private data; wait for `Established`.
//! - client: per connection `create_id`, `resolve_addr`, `resolve_route`,
//!   `create_qp`, `connect` with the parameters (and the client's buffer) as private
//!   data; all connections at once, each driven by its events; `Established` carries
//!   the server's buffer.
//! - both: `disconnect`, wait for `Disconnected`, destroy the ids, shut the CM down.
//!
//! Events arrive in callback mode (on rdma-cm's and iw-cm's workers) and are handed to
//! the thread that set up the connections through a channel; [`CmStatus`] counts the
//! ones the data path must know about while it runs. A `DeviceRemoval` on any id marks
//! the status removed: the data path ends the run (the CM has moved every QP to ERROR,
//! so waiting calls wake up with flushed completions) and reports it
//! ([`IwperfError::DeviceRemoved`]).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mpa::negotiate::{CrcPolicy, LocalSettings};
use rdma_cm::{CmEvent, CmId, CmIdRef, ConnParam, Disposition, EventKind, RdmaCmConfig};
use softiwarp::cm::rdmacm::{SoftDevice, SoftRdmaCm};
use softiwarp::link::{Link, MemoryLink, Pcap, TapLink};
use softiwarp::{Cq, Pd, Qp, QpInitAttr};
use softiwarp::{Device, DeviceConfig, LinkConfig, LinkSpec};
use verbs::QpCap;

use super::datapath::MAX_RD_ATOMIC;
use super::wire::{AcceptInfo, MrInfo, TestParams};
use super::IwperfError;

/// Which link the device runs on.
#[derive(Debug)]
pub enum LinkChoice {
    /// A TAP interface (in the namespace of the calling process).
    Tap(String),
    /// One end of an in-process memory link pair.
    Memory(MemoryLink),
}

/// How to open a side's soft device.
#[derive(Debug)]
pub struct DeviceOptions {
    /// Device name (logs, thread names).
    pub name: String,
    /// The link.
    pub link: LinkChoice,
    /// This side's IPv4 address.
    pub ip: Ipv4Addr,
    /// Prefix length of the subnet.
    pub prefix_len: u8,
    /// MAC address; `None`: `02:00:` + the address bytes.
    pub mac: Option<[u8; 6]>,
    /// Ask for MPA CRC32c (the C bit; RFC 5044 says a side must use it when either asks).
    pub crc: bool,
    /// Ask for MPA markers in the data this side receives (the M bit).
    pub markers: bool,
    /// MPA revision, 1 or 2.
    pub mpa_rev: u8,
    /// The MPA defaults the other settings start from.
    pub profile: MpaProfile,
    /// Capture the link to this pcap file, keeping at most this many bytes (whole
    /// records, [`netlab::capture::CappedPcap`]).
    pub pcap: Option<(PathBuf, u64)>,
    /// Engine busy-poll time after activity.
    pub engine_spin: Duration,
    /// Who drives the device (`softiwarp::ProgressMode`).
    pub progress: softiwarp::ProgressMode,
    /// TCP send and receive buffer in bytes.
    pub tcp_buffer: usize,
}

/// Whose MPA defaults the soft device starts from (`--mpa-profile`); `crc`, `markers`
/// and `mpa_rev` of [`DeviceOptions`] apply on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MpaProfile {
    /// Linux siw's (`LocalSettings::default()`): no peer-to-peer mode.
    #[default]
    Siw,
    /// Chelsio iw_cxgb4's (`LocalSettings::chelsio()`): peer-to-peer mode with a Read RTR.
    Chelsio,
}

/// Opens the soft device as `opts` says (a TAP is waited for until it reports up, at
/// most 5 s).
///
/// Errors: [`IwperfError::Setup`] (no such TAP, link not up, bad settings, the engine
/// thread could not start).
pub fn open_device(opts: DeviceOptions) -> Result<Arc<Device>, IwperfError> {
    let setup = |what: &str, e: &dyn std::fmt::Display| IwperfError::Setup(format!("{what}: {e}"));
    if !matches!(opts.mpa_rev, 1 | 2) {
        return Err(IwperfError::Usage(format!(
            "--mpa-rev {} (1 or 2)",
            opts.mpa_rev
        )));
    }
    let link: Box<dyn Link> = match opts.link {
        LinkChoice::Tap(name) => {
            let mut tap =
                TapLink::open(&name).map_err(|e| setup(&format!("open TAP {name}"), &e))?;
            crate::tcp::wait_link_up(&mut tap, Duration::from_secs(5))
                .map_err(|e| setup("TAP", &e))?;
            Box::new(tap)
        }
        LinkChoice::Memory(m) => Box::new(m),
    };
    let link: Box<dyn Link> = match &opts.pcap {
        None => link,
        Some((path, limit)) => {
            let file = std::fs::File::create(path)
                .map_err(|e| setup(&format!("create {}", path.display()), &e))?;
            let out = netlab::capture::CappedPcap::new(
                std::io::BufWriter::with_capacity(1 << 16, file),
                *limit,
            );
            let clock = Box::new(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
            });
            Box::new(Pcap::with_writer(link, out, clock).map_err(|e| setup("pcap", &e))?)
        }
    };
    let mut cfg = DeviceConfig::new(
        &opts.name,
        LinkConfig {
            spec: LinkSpec::Boxed(link),
            pcap: None,
            faults: None,
        },
        opts.ip,
        opts.prefix_len,
    );
    if let Some(mac) = opts.mac {
        cfg.interface.mac = mac;
    }
    cfg.interface.random_seed ^= u64::from(std::process::id()) << 20;
    cfg.mpa.settings = match opts.profile {
        MpaProfile::Siw => LocalSettings::default(),
        MpaProfile::Chelsio => LocalSettings::chelsio(),
    };
    cfg.mpa.settings.rev = opts.mpa_rev;
    cfg.mpa.settings.crc = if opts.crc {
        CrcPolicy::Wanted
    } else {
        CrcPolicy::IfPeerAsks
    };
    cfg.mpa.settings.markers_rx = opts.markers;
    cfg.engine.spin = opts.engine_spin;
    cfg.engine.progress = opts.progress;
    cfg.tcp.rx_buffer = opts.tcp_buffer;
    cfg.tcp.tx_buffer = opts.tcp_buffer;
    Device::open(cfg)
        .map(Arc::new)
        .map_err(|e| setup("open the device", &e))
}

/// What the data path provides when a QP is made: its PD, CQ and capabilities, its
/// buffers and receives.
pub trait VerbsSetup {
    /// The PD, the CQ (send and receive) and the QP capabilities for a connection with
    /// `params`, on `device` (the id's device: `id->verbs`).
    ///
    /// Errors: the PD or CQ could not be made.
    fn qp_resources(
        &mut self,
        device: &Arc<Device>,
        params: &TestParams,
    ) -> Result<(&Pd, &Cq, QpCap), IwperfError>;

    /// Server: whether a request with `params` (read from the network) is within the
    /// server's limits, before anything is made for it.
    ///
    /// Errors: the limit exceeded, as one line (sent back in the Reject).
    fn admit(&self, params: &TestParams) -> Result<(), String>;

    /// Server: the connection of QP `qp_num` went away before the test started (the
    /// peer reset it after its Request, or the accept failed): the run leaves it out.
    fn retire_qp(&mut self, qp_num: u32);

    /// Server: register the connection's buffers and post its receives (before the
    /// accept: the client may send at once); return what the client is told.
    ///
    /// Errors: registration or posting failed.
    fn server_qp(&mut self, params: &TestParams, qp: &Arc<Qp>) -> Result<AcceptInfo, IwperfError>;

    /// Client: register the connection's buffers and post its receives (before the
    /// connect); return the client's data buffer (sent in the parameters).
    ///
    /// Errors: registration or posting failed.
    fn client_qp(&mut self, params: &TestParams, qp: &Arc<Qp>) -> Result<MrInfo, IwperfError>;

    /// Client: the server's answer for QP `qp_num`.
    ///
    /// Errors: the answer does not fit the parameters.
    fn client_accepted(&mut self, qp_num: u32, accept: AcceptInfo) -> Result<(), IwperfError>;
}

/// `rdma_create_qp` on `id` with the data path's PD, CQ and capabilities, then the QP
/// to INIT so receives can be posted before the connection is made (librdmacm's
/// `rdma_create_qp` leaves an iWARP QP in INIT: cma.c `cma_init_conn_qp`).
fn make_qp(
    id: &CmIdRef<SoftDevice>,
    device: &Arc<Device>,
    params: &TestParams,
    setup: &mut dyn VerbsSetup,
) -> Result<Arc<Qp>, IwperfError> {
    let (pd, cq, cap) = setup.qp_resources(device, params)?;
    let qp = id
        .create_qp(
            pd,
            QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                cap,
                sq_sig_all: false,
            },
        )
        .map_err(cm_err("create_qp"))?;
    if qp.state() == verbs::QpState::Reset {
        qp.modify_state(verbs::QpState::Init)
            .map_err(|e| IwperfError::Setup(format!("QP to INIT: {e}")))?;
    }
    Ok(qp)
}

/// Connection events the data path must know about while it runs, counted by the
/// callbacks.
#[derive(Debug, Default)]
pub struct CmStatus {
    removed: AtomicBool,
    established: AtomicUsize,
    disconnected: AtomicUsize,
}

impl CmStatus {
    /// `true` once a `DeviceRemoval` arrived on any id.
    pub fn removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// `Established` events so far.
    pub fn established(&self) -> usize {
        self.established.load(Ordering::Acquire)
    }

    /// `Disconnected` events so far.
    pub fn disconnected(&self) -> usize {
        self.disconnected.load(Ordering::Acquire)
    }
}

/// An event as the setup thread receives it.
struct Ev {
    serial: u64,
    kind: EventKind,
    status: i32,
    private_data: Vec<u8>,
    /// The peer's ORD (`responder_resources`) and IRD (`initiator_depth`).
    ord_ird: (u16, u16),
    new_id: Option<CmId<SoftDevice>>,
}

/// A client connection being made: (id, parameters, QP once made, established).
type Pending = (CmId<SoftDevice>, TestParams, Option<Arc<Qp>>, bool);

/// One established connection.
pub struct Conn {
    /// The test parameters.
    pub params: TestParams,
    /// The QP (also held by the id).
    pub qp: Arc<Qp>,
    id: CmId<SoftDevice>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("index", &self.params.index)
            .field("qp", &self.qp.qp_num())
            .field("id", &self.id.serial())
            .finish()
    }
}

/// One side's RDMA CM with its soft device: makes and ends the connections.
pub struct CmSide {
    cm: Option<SoftRdmaCm>,
    device: Arc<Device>,
    status: Arc<CmStatus>,
    rx: Receiver<Ev>,
    tx: Arc<Mutex<Sender<Ev>>>,
    listener: Option<CmId<SoftDevice>>,
}

impl std::fmt::Debug for CmSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmSide")
            .field("device", &self.device.name())
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// Server: drops `conn`, a connection that went away before the test started: its
/// QP is retired from the data path ([`VerbsSetup::retire_qp`]), its id destroyed; when
/// no other connection of the test is left, the next request may announce another
/// test (`expected` is cleared).
fn retire(
    conn: Conn,
    setup: &mut dyn VerbsSetup,
    pending: &[Conn],
    established: &[Conn],
    expected: &mut Option<usize>,
) {
    let Conn { id, qp, .. } = conn;
    setup.retire_qp(qp.qp_num());
    drop(qp);
    if let Err(e) = id.destroy() {
        tracing::debug!(error = %e, "destroy id");
    }
    if pending.is_empty() && established.is_empty() {
        *expected = None;
    }
}

fn cm_err(what: &str) -> impl Fn(rdma_cm::CmError) -> IwperfError + '_ {
    move |e| IwperfError::Connection(format!("{what}: {e}"))
}

impl CmSide {
    /// An RDMA CM with `device` registered as a `SoftDevice`.
    ///
    /// Errors: [`IwperfError::Setup`] if the CM or the device's provider cannot start.
    pub fn new(device: Arc<Device>) -> Result<CmSide, IwperfError> {
        let cm = SoftRdmaCm::new(RdmaCmConfig::default())
            .map_err(|e| IwperfError::Setup(format!("rdma-cm: {e}")))?;
        let soft = SoftDevice::new(device.clone())
            .map_err(|e| IwperfError::Setup(format!("soft device: {e}")))?;
        cm.add_device(soft)
            .map_err(|e| IwperfError::Setup(format!("add the device to rdma-cm: {e}")))?;
        let (tx, rx) = mpsc::channel();
        Ok(CmSide {
            cm: Some(cm),
            device,
            status: Arc::new(CmStatus::default()),
            rx,
            tx: Arc::new(Mutex::new(tx)),
            listener: None,
        })
    }

    /// The counters of the connection events.
    pub fn status(&self) -> Arc<CmStatus> {
        self.status.clone()
    }

    /// The soft device.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    fn cm(&self) -> &SoftRdmaCm {
        self.cm.as_ref().expect("CM alive until close")
    }

    /// A new id whose events go to this side's channel.
    fn create_id(&self) -> CmId<SoftDevice> {
        let tx = self.tx.clone();
        let status = self.status.clone();
        self.cm()
            .create_id(move |id: &CmIdRef<SoftDevice>, mut ev: CmEvent<SoftDevice>| {
                match ev.kind {
                    EventKind::DeviceRemoval => status.removed.store(true, Ordering::Release),
                    EventKind::Established => {
                        status.established.fetch_add(1, Ordering::AcqRel);
                    }
                    EventKind::Disconnected => {
                        status.disconnected.fetch_add(1, Ordering::AcqRel);
                    }
                    _ => {}
                }
                tracing::debug!(id = id.serial(), kind = %ev.kind, status = ev.status, "rdma-cm event");
                let e = Ev {
                    serial: id.serial(),
                    kind: ev.kind,
                    status: ev.status,
                    private_data: std::mem::take(&mut ev.private_data),
                    ord_ird: (ev.responder_resources, ev.initiator_depth),
                    new_id: ev.take_new_id(),
                };
                let tx = tx.lock().unwrap_or_else(|p| p.into_inner());
                // A closed channel (setup thread gone): the new id, if any, is dropped
                // here, which rejects the request.
                let _ = tx.send(e);
                Disposition::Keep
            })
    }

    /// The next event, waiting until `deadline`.
    fn next_event(&self, deadline: Instant, what: &str) -> Result<Ev, IwperfError> {
        loop {
            if self.status.removed() {
                return Err(IwperfError::DeviceRemoved(format!(
                    "DeviceRemoval while {what}"
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(IwperfError::Connection(format!("timed out {what}")));
            }
            match self
                .rx
                .recv_timeout((deadline - now).min(Duration::from_millis(100)))
            {
                Ok(ev) => return Ok(ev),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(IwperfError::Setup("event channel closed".into()))
                }
            }
        }
    }

    /// Server: binds to `port` on the device's address and listens with `backlog`
    /// (rdma-cm queues that many requests not yet delivered; beyond, they are rejected).
    ///
    /// Errors: [`IwperfError::Connection`] (address in use, ...).
    pub fn listen(&mut self, port: u16, backlog: u32) -> Result<(), IwperfError> {
        let id = self.create_id();
        let addr = SocketAddr::V4(SocketAddrV4::new(self.device.address(), port));
        id.bind_addr(addr).map_err(cm_err("bind_addr"))?;
        id.listen(backlog).map_err(cm_err("listen"))?;
        self.listener = Some(id);
        Ok(())
    }

    /// Server: accepts connections until as many as the first request's parameters
    /// announce are established (requests whose parameters cannot be read, or exceed
    /// the server's limits ([`VerbsSetup::admit`]), or would go beyond the test's
    /// connections (an index already in, more requests than announced), are rejected
    /// with the reason in the Reject's private data, and the server keeps waiting; a
    /// connection that goes away before all are established, e.g. reset by its peer
    /// right after its Request, is dropped and another awaited). Waits up to `first_timeout`
    /// for the first request, then up to 20 s for the rest.
    ///
    /// Errors: [`IwperfError::Connection`] (timeout), [`IwperfError::DeviceRemoved`], or
    /// the data path's setup error.
    pub fn accept_all(
        &mut self,
        first_timeout: Duration,
        setup: &mut dyn VerbsSetup,
    ) -> Result<Vec<Conn>, IwperfError> {
        let mut deadline = Instant::now() + first_timeout;
        let mut pending: Vec<Conn> = Vec::new();
        let mut established: Vec<Conn> = Vec::new();
        let mut expected: Option<usize> = None;
        while expected != Some(established.len()) {
            let what = match expected {
                None => "waiting for a connection request".to_owned(),
                Some(n) => format!("waiting for {n} connections ({} up)", established.len()),
            };
            let mut ev = self.next_event(deadline, &what)?;
            match ev.kind {
                EventKind::ConnectRequest => {
                    let Some(id) = ev.new_id.take() else { continue };
                    let params = match TestParams::decode(&ev.private_data) {
                        Ok(p) if expected.is_none_or(|n| usize::from(p.qps) == n) => p,
                        Ok(p) => {
                            tracing::warn!(qps = p.qps, "request of another test: rejected");
                            let _ = id.reject(b"iwperf: busy");
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "unreadable request: rejected");
                            let _ = id.reject(b"iwperf: bad parameters");
                            continue;
                        }
                    };
                    // At most the announced number of connections, each index once: a
                    // client cannot make the server set up more than its test needs
                    // (each connection is bounded by `admit`, so the test is too).
                    let taken = pending
                        .iter()
                        .chain(&established)
                        .any(|c| c.params.index == params.index);
                    let full = expected.is_some_and(|n| pending.len() + established.len() >= n);
                    if taken || full {
                        tracing::warn!(
                            index = params.index,
                            "request beyond the test's connections: rejected"
                        );
                        let _ =
                            id.reject(b"iwperf: busy (a connection of this test is already in)");
                        continue;
                    }
                    if let Err(reason) = setup.admit(&params) {
                        tracing::warn!(index = params.index, "request rejected: {reason}");
                        let _ = id.reject(format!("iwperf: {reason}").as_bytes());
                        continue;
                    }
                    if expected.is_none() {
                        expected = Some(usize::from(params.qps));
                        deadline = Instant::now() + Duration::from_secs(20);
                    }
                    let device = id
                        .device()
                        .ok_or_else(|| IwperfError::Connection("new id without a device".into()))?;
                    let qp = make_qp(&id, device.device(), &params, setup)?;
                    let info = setup.server_qp(&params, &qp)?;
                    // Our IRD = the peer's ORD, our ORD = the peer's IRD (rdma_accept).
                    let (peer_ord, peer_ird) = ev.ord_ird;
                    let accepted = id.accept(&ConnParam {
                        private_data: info.encode(),
                        responder_resources: peer_ord.min(MAX_RD_ATOMIC),
                        initiator_depth: peer_ird.min(MAX_RD_ATOMIC),
                        ..ConnParam::default()
                    });
                    let conn = Conn { params, qp, id };
                    if let Err(e) = accepted {
                        // The peer went away after its Request (e.g. reset it): forget
                        // it and wait for another (a peer must not end the test so).
                        tracing::warn!(index = params.index, error = %e, "accept failed: connection dropped, waiting for another");
                        retire(conn, setup, &pending, &established, &mut expected);
                        continue;
                    }
                    pending.push(conn);
                }
                EventKind::Established => {
                    if let Some(i) = pending.iter().position(|c| c.id.serial() == ev.serial) {
                        established.push(pending.swap_remove(i));
                    }
                }
                EventKind::Disconnected | EventKind::ConnectError | EventKind::Rejected => {
                    // Gone before the test started (a peer that resets right after its
                    // Request): forget it and wait for another, so that it cannot end
                    // the test of the clients that do connect.
                    let of = |c: &Conn| c.id.serial() == ev.serial;
                    let conn = if let Some(i) = pending.iter().position(of) {
                        pending.swap_remove(i)
                    } else if let Some(i) = established.iter().position(of) {
                        established.swap_remove(i)
                    } else {
                        continue;
                    };
                    tracing::warn!(
                        index = conn.params.index,
                        "connection {} went away before the test started ({}, status {}): dropped, waiting for another",
                        conn.params.index,
                        ev.kind,
                        ev.status
                    );
                    retire(conn, setup, &pending, &established, &mut expected);
                }
                _ => {}
            }
        }
        established.sort_by_key(|c| c.params.index);
        Ok(established)
    }

    /// Client: opens one connection per element of `params` to `server`, all at once
    /// (resolve, route, QP, connect as each id's events come), and waits until every
    /// one is established (at most `timeout`).
    ///
    /// Errors: [`IwperfError::Connection`] for a failed resolution (`AddrError`,
    /// `RouteError`), `Rejected`, `Unreachable`, `ConnectError`, or the timeout;
    /// [`IwperfError::DeviceRemoved`]; the data path's setup error.
    pub fn connect_all(
        &mut self,
        server: SocketAddrV4,
        params: &[TestParams],
        timeout: Duration,
        setup: &mut dyn VerbsSetup,
    ) -> Result<Vec<Conn>, IwperfError> {
        let deadline = Instant::now() + timeout;
        let resolve = Duration::from_secs(5).min(timeout);
        let mut ids: Vec<Pending> = Vec::new();
        for p in params {
            let id = self.create_id();
            id.resolve_addr(None, SocketAddr::V4(server), resolve)
                .map_err(cm_err("resolve_addr"))?;
            ids.push((id, *p, None, false));
        }
        let mut up = 0;
        while up < ids.len() {
            let ev =
                self.next_event(deadline, &format!("connecting ({up} of {} up)", ids.len()))?;
            let Some(i) = ids.iter().position(|c| c.0.serial() == ev.serial) else {
                continue;
            };
            let (id, p, qp, est) = &mut ids[i];
            match ev.kind {
                EventKind::AddrResolved => {
                    id.resolve_route(resolve).map_err(cm_err("resolve_route"))?
                }
                EventKind::RouteResolved => {
                    let device = id.device().ok_or_else(|| {
                        IwperfError::Connection("resolved id without a device".into())
                    })?;
                    let q = make_qp(id, device.device(), p, setup)?;
                    p.client_mr = setup.client_qp(p, &q)?;
                    id.connect(&ConnParam {
                        private_data: p.encode(),
                        responder_resources: MAX_RD_ATOMIC,
                        initiator_depth: MAX_RD_ATOMIC,
                        ..ConnParam::default()
                    })
                    .map_err(cm_err("connect"))?;
                    *qp = Some(q);
                }
                EventKind::Established => {
                    let accept = AcceptInfo::decode(&ev.private_data)
                        .map_err(|e| IwperfError::Connection(format!("server's answer: {e}")))?;
                    let q = qp.as_ref().ok_or_else(|| {
                        IwperfError::Connection("Established before the QP was made".into())
                    })?;
                    setup.client_accepted(q.qp_num(), accept)?;
                    *est = true;
                    up += 1;
                }
                EventKind::AddrError
                | EventKind::RouteError
                | EventKind::Rejected
                | EventKind::Unreachable
                | EventKind::ConnectError
                | EventKind::Disconnected => {
                    return Err(IwperfError::Connection(format!(
                        "connection {} to {server}: {} (status {}{})",
                        p.index,
                        ev.kind,
                        ev.status,
                        if ev.private_data.is_empty() {
                            String::new()
                        } else {
                            format!(", {:?}", String::from_utf8_lossy(&ev.private_data))
                        }
                    )))
                }
                _ => {}
            }
        }
        Ok(ids
            .into_iter()
            .filter_map(|(id, params, qp, _)| qp.map(|qp| Conn { params, qp, id }))
            .collect())
    }

    /// Disconnects every connection (gracefully) and waits up to `timeout` for all
    /// their `Disconnected` events (ours and the peer's disconnects alike), on top of
    /// `already` events counted before. Returns the count of `Disconnected` events in
    /// all (`already` included).
    pub fn disconnect_all(&self, conns: &[Conn], already: usize, timeout: Duration) -> usize {
        for c in conns {
            if let Err(e) = c.id.disconnect() {
                tracing::debug!(id = c.id.serial(), error = %e, "disconnect");
            }
        }
        self.wait_disconnected(conns.len() + already, timeout)
    }

    /// Waits up to `timeout` until `n` `Disconnected` events arrived in all (the peer
    /// disconnects). Returns how many did.
    pub fn wait_disconnected(&self, n: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        while self.status.disconnected() < n && Instant::now() < deadline {
            if self.status.removed() {
                break;
            }
            // Drain the channel (the counters are kept by the callbacks).
            let _ = self.rx.recv_timeout(Duration::from_millis(10));
        }
        self.status.disconnected()
    }

    /// Destroys `conns`' ids (their QPs go to ERROR and are released with the last
    /// handle), the listener, and shuts the CM down (the device is released after its
    /// last id). Returns the CM's count of ids still alive before shutdown (0 when
    /// everything was destroyed).
    pub fn close(mut self, conns: Vec<Conn>) -> usize {
        for c in conns {
            let Conn { id, qp, .. } = c;
            // Ours first: the id's handle is then the last and destroys the QP.
            drop(qp);
            if let Err(e) = id.destroy() {
                tracing::debug!(error = %e, "destroy id");
            }
        }
        if let Some(l) = self.listener.take() {
            let _ = l.destroy();
        }
        // Ids handed to us by requests we did not keep.
        while let Ok(ev) = self.rx.try_recv() {
            drop(ev.new_id);
        }
        // An id is freed on its last reference, which a CM worker may hold a moment
        // after destroy returned: wait (at most 1 s) before counting what is left.
        let alive =
            self.cm
                .as_ref()
                .map_or(0, |cm| match cm.wait_ids_freed(Duration::from_secs(1)) {
                    Ok(s) => s.ids_alive,
                    Err(e) => {
                        tracing::debug!(error = %e, "rdma-cm flush");
                        cm.stats().ids_alive
                    }
                });
        if let Some(cm) = self.cm.take() {
            // Remove the device before the shutdown: the registry then lets it go
            // (`released`), which ends the SoftDevice's hold on the CM and the device's
            // engine can stop (a capture is flushed). Shutdown alone keeps devices.
            for name in cm.devices() {
                match cm.remove_device(&name) {
                    Ok(removal) => {
                        if let Err(e) = removal.wait_timeout(Duration::from_secs(2)) {
                            tracing::debug!(device = %name, error = %e, "device removal");
                        }
                    }
                    Err(e) => tracing::debug!(device = %name, error = %e, "remove device"),
                }
            }
            if let Err(e) = cm.shutdown() {
                tracing::debug!(error = %e, "rdma-cm shutdown");
            }
        }
        alive
    }
}
