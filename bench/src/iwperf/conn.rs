//! Connection setup: everything iwperf does through the RDMA CM, over either backend
//! (`verbs::provider::Provider`: the soft device's rdma-cm, or rdma-core's librdmacm),
//! and opening the soft device. This is the only module that talks to the CM, in the
//! order librdmacm programs use:
//!
//! - server: `create_id`, `bind_addr`, `listen`; per `ConnectRequest`: read the test
//!   parameters from the private data, `create_qp` on the new id's device (`id->verbs`),
//!   let the data path register its buffers and post its receives, `accept` with the
//!   server's buffer (iova, rkey, length) as private data; wait for `Established`.
//! - client: per connection `create_id`, `resolve_addr`, `resolve_route`,
//!   `create_qp`, `connect` with the parameters (and the client's buffer) as private
//!   data; all connections at once, each driven by its events; `Established` carries
//!   the server's buffer.
//! - both: `disconnect`, wait for `Disconnected`, destroy the QPs and ids.
//!
//! Events come from the provider's event channel (`rdma_get_cm_event`), taken by a
//! pump thread ([`CmSide::run`]) that acknowledges each and hands what it said to the
//! thread that sets up the connections; [`CmStatus`] counts the ones the data path
//! must know about while it runs. A `DeviceRemoval` on any id marks the status
//! removed: the data path ends the run (the CM has moved every QP to ERROR, so waiting
//! calls wake up with flushed completions) and reports it
//! ([`IwperfError::DeviceRemoved`]). ORD/IRD are clamped to the device's
//! [`DeviceCaps`].

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mpa::negotiate::{CrcPolicy, LocalSettings};
use rdma_cm::RdmaCmConfig;
use softiwarp::cm::rdmacm::{SoftDevice, SoftRdmaCm};
use softiwarp::link::{Link, MemoryLink, Pcap, TapLink};
use softiwarp::{Device, DeviceConfig, LinkConfig, LinkSpec};
use verbs::provider::{
    CmEvent as _, CmEventKind, CmId as _, ConnParam, Provider, ProviderError, QueuePair as _,
};
use verbs::{DeviceCaps, QpCap};

use super::wire::{AcceptInfo, MrInfo, TestParams, MAX_RD_ATOMIC};
use super::IwperfError;

/// Which link the device runs on.
#[derive(Debug)]
pub enum LinkChoice {
    /// A TAP interface (in the namespace of the calling process).
    Tap(String),
    /// One end of an in-process memory link pair.
    Memory(MemoryLink),
    /// A UDP link (Ethernet frames as UDP datagrams, `softiwarp::link::UdpLink`): no
    /// root, no TAP.
    Udp(softiwarp::link::UdpConfig),
    /// A host interface by name (`LinkConfig::netdev`): the device runs on the host's
    /// kernel TCP with the interface's addresses (the options' `ip`, `prefix_len`, `mac`,
    /// `pcap` and `offload` do not apply); no root.
    Netdev(String),
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
    /// TAP checksum and segmentation offload (`softiwarp::link::TapOffload::Tcp4`;
    /// `--no-offload` turns it off). Memory links ignore it.
    pub offload: bool,
    /// As the connecting side, hold the first FPDU this long after the MPA Reply
    /// (`MpaConfig::first_fpdu_delay_us`; a Linux siw responder can leave an FPDU that
    /// arrives right behind its Reply unread). Zero: send at once.
    pub first_fpdu_delay: Duration,
}

impl DeviceOptions {
    /// A soft device named `name` at `ip`/24 on one end of an in-process memory link,
    /// as the tests and the rootless demo open it: MPA rev 2 with CRC (siw's defaults),
    /// no markers, application threads driving the device (`ProgressMode::Hybrid`),
    /// 256 KiB TCP buffers, no capture, no engine spin, no first-FPDU delay.
    pub fn memory(name: &str, link: MemoryLink, ip: Ipv4Addr) -> DeviceOptions {
        DeviceOptions {
            name: name.into(),
            link: LinkChoice::Memory(link),
            ip,
            prefix_len: 24,
            mac: None,
            crc: true,
            markers: false,
            mpa_rev: 2,
            profile: MpaProfile::Siw,
            pcap: None,
            engine_spin: Duration::ZERO,
            progress: softiwarp::ProgressMode::Hybrid,
            tcp_buffer: 256 << 10,
            offload: true,
            first_fpdu_delay: Duration::ZERO,
        }
    }
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
/// most 5 s; a host interface is the kernel's, the caller checked it exists).
///
/// Errors: [`IwperfError::Setup`] (no such TAP or interface, link not up, bad settings,
/// the engine thread could not start); [`IwperfError::Usage`] (a bad MPA revision, a
/// capture asked of a host interface).
pub fn open_device(opts: DeviceOptions) -> Result<Arc<Device>, IwperfError> {
    let setup = |what: &str, e: &dyn std::fmt::Display| IwperfError::Setup(format!("{what}: {e}"));
    if !matches!(opts.mpa_rev, 1 | 2) {
        return Err(IwperfError::Usage(format!(
            "--mpa-rev {} (1 or 2)",
            opts.mpa_rev
        )));
    }
    let (link, ip, prefix_len) = match opts.link {
        LinkChoice::Netdev(ifname) => {
            if opts.pcap.is_some() {
                return Err(IwperfError::Usage(netlab::netdev_conflict(
                    &ifname, "--pcap",
                )));
            }
            // The interface's addresses, not ours: the device follows them.
            (LinkConfig::netdev(&ifname), Ipv4Addr::UNSPECIFIED, 0)
        }
        choice => (
            LinkConfig {
                spec: LinkSpec::Boxed(frame_link(choice, opts.offload, &opts.pcap)?),
                pcap: None,
                faults: None,
            },
            opts.ip,
            opts.prefix_len,
        ),
    };
    let mut cfg = DeviceConfig::new(&opts.name, link, ip, prefix_len);
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
    cfg.mpa.first_fpdu_delay_us =
        u64::try_from(opts.first_fpdu_delay.as_micros()).unwrap_or(u64::MAX);
    Device::open(cfg)
        .map(Arc::new)
        .map_err(|e| setup("open the device", &e))
}

/// The frame link `choice` (a TAP, memory or UDP link; `offload`: the TAP's), with a
/// capture if `pcap` asks for one.
fn frame_link(
    choice: LinkChoice,
    offload: bool,
    pcap: &Option<(PathBuf, u64)>,
) -> Result<Box<dyn Link>, IwperfError> {
    let setup = |what: &str, e: &dyn std::fmt::Display| IwperfError::Setup(format!("{what}: {e}"));
    let link: Box<dyn Link> = match choice {
        LinkChoice::Tap(name) => {
            let mut tap = TapLink::open_with(&name, crate::tcp::tap_offload(offload))
                .map_err(|e| setup(&format!("open TAP {name}"), &e))?;
            crate::tcp::wait_link_up(&mut tap, Duration::from_secs(5))
                .map_err(|e| setup("TAP", &e))?;
            Box::new(tap)
        }
        LinkChoice::Memory(m) => Box::new(m),
        LinkChoice::Udp(cfg) => Box::new(
            softiwarp::link::UdpLink::open(&cfg)
                .map_err(|e| setup(&format!("open the UDP link {}", cfg.bind), &e))?,
        ),
        LinkChoice::Netdev(ifname) => {
            return Err(IwperfError::Setup(format!(
                "{ifname} is a host interface, not a frame link"
            )))
        }
    };
    let Some((path, limit)) = pcap else {
        return Ok(link);
    };
    let file = std::fs::File::create(path)
        .map_err(|e| setup(&format!("create {}", path.display()), &e))?;
    let out =
        netlab::capture::CappedPcap::new(std::io::BufWriter::with_capacity(1 << 16, file), *limit);
    let clock = Box::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    });
    Ok(Box::new(
        Pcap::with_writer(link, out, clock).map_err(|e| setup("pcap", &e))?,
    ))
}

/// An RDMA CM with `device` registered as a `SoftDevice` (the soft backend's
/// provider is a `softiwarp::cm::provider::SoftCm` channel of it).
///
/// Errors: [`IwperfError::Setup`] if the CM or the device's provider cannot start.
pub fn soft_cm(device: Arc<Device>) -> Result<SoftRdmaCm, IwperfError> {
    let cm = SoftRdmaCm::new(RdmaCmConfig::default())
        .map_err(|e| IwperfError::Setup(format!("rdma-cm: {e}")))?;
    let soft =
        SoftDevice::new(device).map_err(|e| IwperfError::Setup(format!("soft device: {e}")))?;
    cm.add_device(soft)
        .map_err(|e| IwperfError::Setup(format!("add the device to rdma-cm: {e}")))?;
    Ok(cm)
}

/// Shuts a soft RDMA CM down once its ids were destroyed: waits (at most 1 s) for
/// the ids to be freed, removes the device (the registry then lets it go, which ends
/// the `SoftDevice`'s hold on it and its engine can stop, flushing a capture) and
/// shuts the CM down. Returns the CM's count of ids still alive before the shutdown
/// (0 when everything was destroyed).
pub fn close_soft_cm(cm: SoftRdmaCm) -> usize {
    // An id is freed on its last reference, which a CM worker may hold a moment after
    // it was destroyed: wait before counting what is left.
    let alive = match cm.wait_ids_freed(Duration::from_secs(1)) {
        Ok(s) => s.ids_alive,
        Err(e) => {
            tracing::debug!(error = %e, "rdma-cm flush");
            cm.stats().ids_alive
        }
    };
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
    alive
}

/// What the data path provides when a QP is made: its PD, CQ and capabilities, its
/// buffers and receives, on a device of provider `P`.
pub trait VerbsSetup<P: Provider> {
    /// The PD, the CQ (send and receive) and the QP capabilities for a connection with
    /// `params`, on `device` (the id's device: `id->verbs`), within the device's
    /// limits.
    ///
    /// Errors: the PD or CQ could not be made, the device could not be queried.
    fn qp_resources(
        &mut self,
        device: &P::Device,
        params: &TestParams,
    ) -> Result<(&P::Pd, &P::Cq, QpCap), IwperfError>;

    /// The device's limits, once [`VerbsSetup::qp_resources`] read them (ORD/IRD are
    /// clamped to them).
    fn caps(&self) -> Option<DeviceCaps>;

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
    fn server_qp(
        &mut self,
        params: &TestParams,
        qp: &Arc<P::Qp>,
    ) -> Result<AcceptInfo, IwperfError>;

    /// Client: register the connection's buffers and post its receives (before the
    /// connect); return the client's data buffer (sent in the parameters).
    ///
    /// Errors: registration or posting failed.
    fn client_qp(&mut self, params: &TestParams, qp: &Arc<P::Qp>) -> Result<MrInfo, IwperfError>;

    /// Client: the server's answer for QP `qp_num`, and the RDMA Reads the client may
    /// have in flight on it (`ord`: its negotiated ORD).
    ///
    /// Errors: the answer does not fit the parameters.
    fn client_accepted(
        &mut self,
        qp_num: u32,
        accept: AcceptInfo,
        ord: u16,
    ) -> Result<(), IwperfError>;
}

/// `rdma_create_qp` on `id` with the data path's PD, CQ and capabilities (the QP is
/// left in INIT, so receives can be posted before the connection is made: librdmacm's
/// `cma_init_conn_qp`, and the soft device's `create_qp` alike).
fn make_qp<P: Provider>(
    id: &P::Id,
    params: &TestParams,
    setup: &mut dyn VerbsSetup<P>,
) -> Result<Arc<P::Qp>, IwperfError> {
    let device = id
        .device()
        .ok_or_else(|| IwperfError::Connection("an id without a device".into()))?;
    let (pd, cq, cap) = setup.qp_resources(&device, params)?;
    id.create_qp(pd, cq, cq, cap, false)
        .map(Arc::new)
        .map_err(cm_err("create_qp"))
}

/// The ORD/IRD of `want`, within the device's limits ([`DeviceCaps::clamp_ord_ird`]:
/// iw_cxgb4 fails above 32 with `EINVAL`) and [`MAX_RD_ATOMIC`].
fn clamp_depth(caps: Option<DeviceCaps>, want: u16) -> u16 {
    let want = want.min(MAX_RD_ATOMIC);
    match caps {
        Some(c) => {
            let (ord, ird) = c.clamp_ord_ird(u32::from(want), u32::from(want));
            u16::from(ord.min(ird))
        }
        None => want,
    }
}

/// `Err(IwperfError::Interrupted)` once SIGINT, SIGTERM or SIGHUP arrived (netlab's
/// signal thread, installed by the binary): every wait of iwperf checks it, so the run
/// ends through its teardown (the peer sees a disconnect) and exits with 130.
pub fn check_interrupted() -> Result<(), IwperfError> {
    if netlab::signals::interrupted() {
        return Err(IwperfError::Interrupted);
    }
    Ok(())
}

/// Connection events the data path must know about while it runs, counted as the
/// events arrive.
#[derive(Debug, Default)]
pub struct CmStatus {
    removed: AtomicBool,
    established: AtomicUsize,
    disconnected: AtomicUsize,
    /// The id of each `DeviceRemoval` event, in arrival order.
    removals: std::sync::Mutex<Vec<u64>>,
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

    /// `DeviceRemoval` events so far: (events, distinct ids, most events for one id).
    /// design.md section 5 (and librdmacm) promise exactly one per live id.
    pub fn removals(&self) -> (usize, usize, usize) {
        let keys = self.removals.lock().unwrap_or_else(|p| p.into_inner());
        let mut per_id: std::collections::HashMap<u64, usize> = Default::default();
        for k in keys.iter() {
            *per_id.entry(*k).or_default() += 1;
        }
        let most = per_id.values().copied().max().unwrap_or(0);
        (keys.len(), per_id.len(), most)
    }

    fn count(&self, kind: CmEventKind, id: u64) {
        match kind {
            CmEventKind::DeviceRemoval => {
                self.removals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(id);
                self.removed.store(true, Ordering::Release);
            }
            CmEventKind::Established => {
                self.established.fetch_add(1, Ordering::AcqRel);
            }
            CmEventKind::Disconnected => {
                self.disconnected.fetch_add(1, Ordering::AcqRel);
            }
            _ => {}
        }
    }
}

/// An event as the setup thread receives it (the provider's event itself was
/// acknowledged by the pump once this was taken out of it).
struct Ev<P: Provider> {
    key: u64,
    kind: CmEventKind,
    status: i32,
    /// The peer's connection parameters: private data, its ORD
    /// (`responder_resources`) and IRD (`initiator_depth`).
    param: ConnParam,
    new_id: Option<P::Id>,
}

/// A client connection being made: (id, parameters, QP once made, established).
type Pending<P> = (
    <P as Provider>::Id,
    TestParams,
    Option<Arc<<P as Provider>::Qp>>,
    bool,
);

/// One established connection.
pub struct Conn<P: Provider> {
    /// The test parameters.
    pub params: TestParams,
    /// The QP.
    pub qp: Arc<P::Qp>,
    id: P::Id,
}

impl<P: Provider> std::fmt::Debug for Conn<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("index", &self.params.index)
            .field("qp", &self.qp.qp_num())
            .field("id", &self.id.key())
            .finish()
    }
}

/// One side's RDMA CM over a provider's event channel: makes and ends the
/// connections. Lives inside [`CmSide::run`], whose pump thread takes the channel's
/// events, counts them in [`CmStatus`] and hands them to the setup thread.
pub struct CmSide<'p, P: Provider> {
    p: &'p P,
    status: Arc<CmStatus>,
    rx: Receiver<Ev<P>>,
    listener: Option<P::Id>,
    /// Client: the local address to connect from ([`CmSide::set_source`]).
    source: Option<Ipv4Addr>,
}

impl<P: Provider> std::fmt::Debug for CmSide<'_, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmSide")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// Server: drops `conn`, a connection that went away before the test started: its
/// QP is retired from the data path ([`VerbsSetup::retire_qp`]), its id destroyed; when
/// no other connection of the test is left, the next request may announce another
/// test (`expected` is cleared).
fn retire<P: Provider>(
    conn: Conn<P>,
    setup: &mut dyn VerbsSetup<P>,
    pending: &[Conn<P>],
    established: &[Conn<P>],
    expected: &mut Option<usize>,
) {
    let Conn { id, qp, .. } = conn;
    setup.retire_qp(qp.qp_num());
    // The QP before its id (rdma_destroy_qp, rdma_destroy_id).
    drop(qp);
    drop(id);
    if pending.is_empty() && established.is_empty() {
        *expected = None;
    }
}

fn cm_err(what: &str) -> impl Fn(ProviderError) -> IwperfError + '_ {
    move |e| IwperfError::Connection(format!("{what}: {e}"))
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// How long the pump waits for an event before it looks whether to stop.
const PUMP_WAIT: Duration = Duration::from_millis(20);

/// Takes the events of `p`'s channel until `stop`: counts them in `status`, takes
/// what the setup thread needs (and a request's new id) out of each, acknowledges it
/// (drops it) and sends the rest to `tx`.
fn pump<P: Provider>(p: &P, status: &CmStatus, stop: &AtomicBool, tx: Sender<Ev<P>>) {
    while !stop.load(Ordering::Acquire) {
        let mut ev = match p.get_event(PUMP_WAIT) {
            Ok(Some(ev)) => ev,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "get_cm_event");
                std::thread::sleep(PUMP_WAIT);
                continue;
            }
        };
        let kind = ev.kind();
        status.count(kind, ev.id_key());
        tracing::debug!(id = ev.id_key(), %kind, status = ev.status(), "rdma-cm event");
        let e = Ev {
            key: ev.id_key(),
            kind,
            status: ev.status(),
            param: ev.conn_param(),
            new_id: ev.take_new_id(),
        };
        drop(ev);
        // A closed channel (setup thread gone): the new id, if any, is dropped here,
        // which rejects the request.
        let _ = tx.send(e);
    }
}

impl<'p, P: Provider> CmSide<'p, P> {
    /// Runs `f` with a side on `p`'s channel, its events taken by a pump thread
    /// meanwhile; the pump stops when `f` returns (after `f` dropped or closed its
    /// ids).
    pub fn run<R>(p: &'p P, f: impl FnOnce(CmSide<'p, P>) -> R) -> R {
        let status = Arc::new(CmStatus::default());
        let stop = AtomicBool::new(false);
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            let pumped = std::thread::Builder::new()
                .name("iwperf-cm".into())
                .spawn_scoped(s, || pump(p, &status, &stop, tx));
            if let Err(e) = &pumped {
                tracing::warn!(error = %e, "no CM event thread: events are not seen");
            }
            // The pump stops when `f` returns or unwinds (the scope waits for it).
            let _stop = StopOnDrop(&stop);
            f(CmSide {
                p,
                status: status.clone(),
                rx,
                listener: None,
                source: None,
            })
        })
    }

    /// Client: connect from `ip` (`rdma_resolve_addr` with it as the source), which
    /// picks the device whose address it is; without it the route to the server picks.
    pub fn set_source(&mut self, ip: Ipv4Addr) {
        self.source = Some(ip);
    }

    /// The counters of the connection events.
    pub fn status(&self) -> Arc<CmStatus> {
        self.status.clone()
    }

    /// A new id on this side's channel.
    fn create_id(&self) -> Result<P::Id, IwperfError> {
        self.p.create_id().map_err(cm_err("create_id"))
    }

    /// The next event, waiting until `deadline`.
    fn next_event(&self, deadline: Instant, what: &str) -> Result<Ev<P>, IwperfError> {
        loop {
            check_interrupted()?;
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

    /// Server: binds to `addr` (the device's address and the port) and listens with
    /// `backlog` (the CM queues that many requests not yet delivered; beyond, they are
    /// rejected).
    ///
    /// Errors: [`IwperfError::Connection`] (address in use, not a device's, ...).
    pub fn listen(&mut self, addr: SocketAddrV4, backlog: u32) -> Result<(), IwperfError> {
        let id = self.create_id()?;
        id.bind_addr(SocketAddr::V4(addr))
            .map_err(cm_err("bind_addr"))?;
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
        setup: &mut dyn VerbsSetup<P>,
    ) -> Result<Vec<Conn<P>>, IwperfError> {
        let mut deadline = Instant::now() + first_timeout;
        let mut pending: Vec<Conn<P>> = Vec::new();
        let mut established: Vec<Conn<P>> = Vec::new();
        let mut expected: Option<usize> = None;
        while expected != Some(established.len()) {
            let what = match expected {
                None => "waiting for a connection request".to_owned(),
                Some(n) => format!("waiting for {n} connections ({} up)", established.len()),
            };
            let mut ev = self.next_event(deadline, &what)?;
            match ev.kind {
                CmEventKind::ConnectRequest => {
                    let Some(id) = ev.new_id.take() else { continue };
                    let params = match TestParams::decode(&ev.param.private_data) {
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
                    let qp = make_qp(&id, &params, setup)?;
                    let mut info = setup.server_qp(&params, &qp)?;
                    // Our IRD = the peer's ORD, our ORD = the peer's IRD (rdma_accept),
                    // within the device's limits. MPA rev 1 carries neither, and the CM
                    // reports 0/0 (ARCHITECTURE.md, "MPA rev 1: no IRD/ORD"): then the
                    // depth the client put in its parameters, and our IRD goes back in
                    // our answer, so that the client's ORD stays within it.
                    let caps = setup.caps();
                    let (ird, ord) = match (ev.param.responder_resources, ev.param.initiator_depth)
                    {
                        (0, 0) => (params.rd_depth, params.rd_depth),
                        asked => asked,
                    };
                    info.ird = clamp_depth(caps, ird);
                    let accepted = id.accept(&ConnParam {
                        private_data: info.encode(),
                        responder_resources: info.ird,
                        initiator_depth: clamp_depth(caps, ord),
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
                CmEventKind::Established => {
                    if let Some(i) = pending.iter().position(|c| c.id.key() == ev.key) {
                        established.push(pending.swap_remove(i));
                    }
                }
                CmEventKind::Disconnected | CmEventKind::ConnectError | CmEventKind::Rejected => {
                    // Gone before the test started (a peer that resets right after its
                    // Request): forget it and wait for another, so that it cannot end
                    // the test of the clients that do connect.
                    let of = |c: &Conn<P>| c.id.key() == ev.key;
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
        setup: &mut dyn VerbsSetup<P>,
    ) -> Result<Vec<Conn<P>>, IwperfError> {
        let deadline = Instant::now() + timeout;
        let resolve = Duration::from_secs(5).min(timeout);
        let mut ids: Vec<Pending<P>> = Vec::new();
        for p in params {
            let id = self.create_id()?;
            let src = self
                .source
                .map(|ip| SocketAddr::V4(SocketAddrV4::new(ip, 0)));
            id.resolve_addr(src, SocketAddr::V4(server), resolve)
                .map_err(cm_err("resolve_addr"))?;
            ids.push((id, *p, None, false));
        }
        let mut up = 0;
        while up < ids.len() {
            let ev =
                self.next_event(deadline, &format!("connecting ({up} of {} up)", ids.len()))?;
            let Some(i) = ids.iter().position(|c| c.0.key() == ev.key) else {
                continue;
            };
            let (id, p, qp, est) = &mut ids[i];
            match ev.kind {
                CmEventKind::AddrResolved => {
                    id.resolve_route(resolve).map_err(cm_err("resolve_route"))?
                }
                CmEventKind::RouteResolved => {
                    let q = make_qp::<P>(id, p, setup)?;
                    p.client_mr = setup.client_qp(p, &q)?;
                    let depth = clamp_depth(setup.caps(), MAX_RD_ATOMIC);
                    p.rd_depth = depth;
                    id.connect(&ConnParam {
                        private_data: p.encode(),
                        responder_resources: depth,
                        initiator_depth: depth,
                    })
                    .map_err(cm_err("connect"))?;
                    *qp = Some(q);
                }
                CmEventKind::Established => {
                    let accept = AcceptInfo::decode(&ev.param.private_data)
                        .map_err(|e| IwperfError::Connection(format!("server's answer: {e}")))?;
                    let q = qp.as_ref().ok_or_else(|| {
                        IwperfError::Connection("Established before the QP was made".into())
                    })?;
                    // Our ORD: what we asked for, and no more than the server's IRD
                    // (the event's `initiator_depth` when the backend reports it, and
                    // the server's answer when it gives it: MPA rev 1 carries none).
                    let asked = clamp_depth(setup.caps(), MAX_RD_ATOMIC);
                    let ord = [ev.param.initiator_depth, accept.ird]
                        .into_iter()
                        .filter(|&ird| ird > 0)
                        .fold(asked, u16::min);
                    setup.client_accepted(q.qp_num(), accept, ord)?;
                    *est = true;
                    up += 1;
                }
                CmEventKind::AddrError
                | CmEventKind::RouteError
                | CmEventKind::Rejected
                | CmEventKind::Unreachable
                | CmEventKind::ConnectError
                | CmEventKind::Disconnected => {
                    return Err(IwperfError::Connection(format!(
                        "connection {} to {server}: {} (status {}{})",
                        p.index,
                        ev.kind,
                        ev.status,
                        if ev.param.private_data.is_empty() {
                            String::new()
                        } else {
                            format!(", {:?}", String::from_utf8_lossy(&ev.param.private_data))
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
    pub fn disconnect_all(&self, conns: &[Conn<P>], already: usize, timeout: Duration) -> usize {
        for c in conns {
            if let Err(e) = c.id.disconnect() {
                tracing::debug!(id = c.id.key(), error = %e, "disconnect");
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

    /// The ids alive now: one per connection in `conns`, and the listener's.
    pub fn live_ids(&self, conns: &[Conn<P>]) -> usize {
        conns.len() + usize::from(self.listener.is_some())
    }

    /// Destroys `conns`' QPs and ids (each QP before its id), the listener, and the
    /// ids of requests not kept; the pump stops when [`CmSide::run`]'s closure returns.
    pub fn close(mut self, conns: Vec<Conn<P>>) {
        for c in conns {
            let Conn { id, qp, .. } = c;
            drop(qp);
            drop(id);
        }
        self.listener = None;
        // Ids handed to us by requests we did not keep.
        while let Ok(ev) = self.rx.try_recv() {
            drop(ev.new_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softiwarp::cm::provider::SoftCm;
    use softiwarp::link::MemoryConfig;

    #[test]
    fn ord_ird_are_clamped_to_the_device_and_to_max_rd_atomic() {
        let t5 = DeviceCaps::CHELSIO_T5;
        assert_eq!(clamp_depth(None, 40), MAX_RD_ATOMIC);
        assert_eq!(clamp_depth(None, 4), 4);
        assert_eq!(clamp_depth(Some(t5), 40), MAX_RD_ATOMIC.min(32));
        let small = DeviceCaps {
            max_ord: 8,
            max_ird: 2,
            ..t5
        };
        assert_eq!(clamp_depth(Some(small), 16), 2);
        assert_eq!(clamp_depth(Some(small), 0), 0);
    }

    #[test]
    fn the_pump_stops_when_the_side_returns_or_panics() {
        let (a, _b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let dev = Device::open(DeviceConfig::new(
            "cmrun",
            LinkConfig::memory(a),
            Ipv4Addr::new(10, 9, 4, 1),
            24,
        ))
        .unwrap();
        let cm = soft_cm(Arc::new(dev)).unwrap();
        let p = SoftCm::new(&cm);
        // A listener on the device's address; nothing else happens.
        let n = CmSide::run(&p, |mut side| {
            side.listen(SocketAddrV4::new(Ipv4Addr::new(10, 9, 4, 1), 7300), 4)
                .unwrap();
            let established = side.status().established();
            side.close(Vec::new());
            established
        });
        assert_eq!(n, 0);
        // A panic inside: run unwinds (the pump thread stops) instead of hanging.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            CmSide::run(&p, |_side| panic!("data path bug"))
        }));
        assert!(r.is_err());
        drop(p);
        assert_eq!(close_soft_cm(cm), 0);
    }
}
