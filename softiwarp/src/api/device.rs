//! The device and its connections: [`Device`] (where the calls, their mapping onto the
//! iw-cm provider interface and an example are documented), [`Listener`],
//! [`ConnectRequest`], [`Connection`] and [`QpConnection`], re-exported at the crate root.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant as StdInstant};

use mpa::negotiate::{Agreed, LocalSettings};
use mpa::wire::Repr;
use nix::sys::eventfd::{EfdFlags, EventFd};

use verbs::{AsyncEvent, VerbsError};

use crate::api::verbs_objects::{Cq, CqInner, DeviceAttr, Pd, PdInner, Qp, QpInitAttr, Srq};
use crate::engine::{
    run_engine, Command, DeviceError, DeviceEvent, Driving, Engine, EngineConfig, Handle,
    PendingRequest, Shared,
};
use crate::host::netdev::Ipv4Subnet;
use crate::host::{HostStack, SharedAddrs};
use crate::link::{
    FaultConfig, Faults, GoneReason, Link, LinkError, MemoryLink, Pcap, TapLink, TapOffload,
};
use crate::resources::event_queue::{DeviceEnd, EventQueue};
use crate::transport::llp::LlpStack;
use crate::transport::smoltcp_glue::{InterfaceConfig, TcpConfig};
use crate::transport::stream::{self, RecvError, SendError, StreamConfig, StreamEnd, Waker};
use crate::transport::{
    CloseMode, ConnError, ConnEvent, ConnId, ConnectRequestInfo, Established, ListenerId,
    MpaDefaults, MpaParams, Stack, StackConfig, DEFAULT_CONNECT_TIMEOUT_US,
    DEFAULT_TERMINATE_LINGER_US,
};

/// Which link a device runs on.
pub enum LinkSpec {
    /// A TAP interface opened by name (`TapLink::open`) on the engine thread, inside
    /// [`DeviceConfig::netns`] if set.
    Tap(String),
    /// One end of an in-process [`MemoryLink`] pair.
    Memory(MemoryLink),
    /// A UDP link (`UdpLink::open`, Ethernet frames as datagrams to a fixed peer; no
    /// root), opened on the engine thread.
    Udp(crate::link::UdpConfig),
    /// Any other link, built by the caller.
    Boxed(Box<dyn Link>),
    /// A host network interface by name (`lo`, `eth0`): the device runs on the host's
    /// kernel TCP ([`crate::host`]), its addresses are the interface's IPv4 addresses
    /// (followed as they change), its ports kernel TCP ports; no root needed. The
    /// interface's deletion removes the device. The link's `pcap` and `faults` do not
    /// apply (capture with `tcpdump -i IF`).
    Netdev(String),
}

impl std::fmt::Debug for LinkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkSpec::Tap(n) => write!(f, "Tap({n:?})"),
            LinkSpec::Memory(m) => write!(f, "Memory({})", m.name()),
            LinkSpec::Udp(c) => write!(f, "Udp({} -> {})", c.bind, c.peer),
            LinkSpec::Boxed(l) => write!(f, "Boxed({})", l.name()),
            LinkSpec::Netdev(n) => write!(f, "Netdev({n:?})"),
        }
    }
}

/// Fault injection on a device's link ([`Faults`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultSpec {
    /// Seed of the fault RNG (same seed, same faults).
    pub seed: u64,
    /// Faults on frames the device sends.
    pub tx: FaultConfig,
    /// Faults on frames the device receives.
    pub rx: FaultConfig,
}

/// The link of a device and its middlewares.
#[derive(Debug)]
pub struct LinkConfig {
    /// The link.
    pub spec: LinkSpec,
    /// Write every frame (both directions, as the stack sees them: after receive faults,
    /// before send faults) to a pcap file at this path.
    pub pcap: Option<PathBuf>,
    /// Inject faults.
    pub faults: Option<FaultSpec>,
}

impl LinkConfig {
    /// A TAP interface by name; no capture, no faults.
    pub fn tap(name: &str) -> Self {
        LinkConfig {
            spec: LinkSpec::Tap(name.to_owned()),
            pcap: None,
            faults: None,
        }
    }

    /// A memory link end; no capture, no faults.
    pub fn memory(link: MemoryLink) -> Self {
        LinkConfig {
            spec: LinkSpec::Memory(link),
            pcap: None,
            faults: None,
        }
    }

    /// A UDP link ([`crate::link::udp`]); no capture, no faults.
    pub fn udp(cfg: crate::link::UdpConfig) -> Self {
        LinkConfig {
            spec: LinkSpec::Udp(cfg),
            pcap: None,
            faults: None,
        }
    }

    /// A host interface by name ([`LinkSpec::Netdev`]): kernel TCP on the interface's
    /// addresses.
    pub fn netdev(name: &str) -> Self {
        LinkConfig {
            spec: LinkSpec::Netdev(name.to_owned()),
            pcap: None,
            faults: None,
        }
    }

    /// With a pcap capture at `path`.
    pub fn with_pcap(mut self, path: impl Into<PathBuf>) -> Self {
        self.pcap = Some(path.into());
        self
    }

    /// With fault injection.
    pub fn with_faults(mut self, faults: FaultSpec) -> Self {
        self.faults = Some(faults);
        self
    }
}

/// Configuration of a [`Device`].
#[derive(Debug)]
pub struct DeviceConfig {
    /// Device name, for logs and the engine thread's name (`sw-<name>`, cut to 15 bytes).
    pub name: String,
    /// The link.
    pub link: LinkConfig,
    /// Interface: MAC, IPv4 address and prefix, gateway, smoltcp's random seed.
    pub interface: InterfaceConfig,
    /// TCP settings (default: 256 KiB buffers, Nagle off, keep-alive 5 s, timeout 20 s).
    pub tcp: TcpConfig,
    /// MPA defaults (default: Linux siw compatible).
    pub mpa: MpaDefaults,
    /// TCP connect timeout. Default 20 s.
    pub connect_timeout: Duration,
    /// Half-open connections (TCP up, MPA Request not yet valid) kept per listener
    /// before the oldest is reset ([`StackConfig::half_open_max`]). Default
    /// [`DEFAULT_HALF_OPEN_MAX`](crate::transport::DEFAULT_HALF_OPEN_MAX).
    pub half_open_max: usize,
    /// Engine loop settings (spin time, stream queue bounds).
    pub engine: EngineConfig,
    /// A network namespace file (e.g. `/run/netns/NAME`) the engine thread enters with
    /// `setns(2)` before it opens the link; `None`: the namespace of the thread calling
    /// [`Device::open`].
    pub netns: Option<PathBuf>,
    /// The iWARP hardware rule for an RDMA Read's sink: its MR needs `REMOTE_WRITE` as
    /// well as `LOCAL_WRITE` (iw_cxgb4, and the kernel's `rdma_rw` and svcrdma, which add
    /// it for iWARP: "iWARP requires remote write access for the data sink of an
    /// RDMA_READ"); a Read whose sink lacks it completes with
    /// [`WcStatus::LocProtErr`](verbs::WcStatus::LocProtErr) and the QP goes to Error,
    /// as one without `LOCAL_WRITE` does. Default `false`, as Linux siw
    /// (`siw_proc_rresp` checks `LOCAL_WRITE` only); turn it on to find, on the soft
    /// device, the applications that would fail on Chelsio hardware.
    pub strict_read_sink: bool,
    /// TCP checksum and segmentation offload on a TAP link ([`TapOffload::Tcp4`]):
    /// smoltcp hands TCP super-segments of up to 64 KiB to the kernel, which cuts them
    /// into MSS-sized segments (each still one FPDU: "One FPDU per TCP segment" in
    /// [`crate::transport`]), and reads coalesced frames. Default `true`; a kernel that
    /// refuses it is logged once and the device runs without. Other links ignore it.
    pub offload: bool,
}

impl DeviceConfig {
    /// A configuration with every default: MAC `02:00:` + the four address bytes, no
    /// gateway, a random seed derived from the address.
    pub fn new(name: &str, link: LinkConfig, address: Ipv4Addr, prefix_len: u8) -> Self {
        let o = address.octets();
        DeviceConfig {
            name: name.to_owned(),
            link,
            interface: InterfaceConfig {
                mac: [0x02, 0x00, o[0], o[1], o[2], o[3]],
                address,
                prefix_len,
                gateway: None,
                random_seed: u64::from(u32::from(address)) ^ 0x5eed_0000_0000,
            },
            tcp: TcpConfig::default(),
            mpa: MpaDefaults::default(),
            connect_timeout: Duration::from_micros(DEFAULT_CONNECT_TIMEOUT_US),
            half_open_max: crate::transport::DEFAULT_HALF_OPEN_MAX,
            engine: EngineConfig::default(),
            netns: None,
            strict_read_sink: false,
            offload: true,
        }
    }
}

/// Errors of [`Connection::wait_established`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// Not established within the timeout (the connection attempt goes on).
    #[error("not established within the timeout")]
    Timeout,
    /// The connection failed (rejected, refused, timed out, reset, MPA error, ...).
    #[error("{0}")]
    Failed(ConnError),
    /// The connection was closed (locally) before it was established.
    #[error("closed before establishment")]
    Closed,
}

/// Errors of [`Listener::next_request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ListenError {
    /// No request within the timeout.
    #[error("no connection request within the timeout")]
    Timeout,
    /// The listener was closed or the device shut down.
    #[error("listener closed")]
    Closed,
    /// The device is gone.
    #[error("device gone ({0:?})")]
    Gone(GoneReason),
}

/// A soft iWARP device: an engine thread running a [`Stack`] on a link. Dropping it
/// shuts the device down (connections are reset) and joins the engine thread.
///
/// As applications (and the iw-cm provider) see it: open a device on a link, listen, connect, accept or reject, move ULPDUs, close; and make
/// verbs objects ([`Device::alloc_pd`], [`Device::create_cq`], [`Device::create_qp`],
/// see the [crate documentation](crate)) and bind QPs to connections ([`Device::connect_qp`],
/// [`ConnectRequest::accept_qp`], giving a [`QpConnection`]).
///
/// [`Device::open`] starts the device's engine thread, which opens the
/// link (entering a network namespace first if asked) and runs the [`Stack`]. Every call
/// below enqueues a command for the engine and wakes it; results come back on one-shot
/// channels, events on queues. Nothing here runs on the engine thread and the engine
/// never waits on a caller.
///
/// # How this maps onto the iw-cm provider interface ([`crate::cm::iwcm`])
///
/// | iw-cm provider | here |
/// |---|---|
/// | `create_listen(port, backlog)` | [`Device::listen`] |
/// | `destroy_listen` | dropping the [`Listener`] / [`Listener::close`] |
/// | `connect(addr, private data, ird, ord)` | [`Device::connect`]; with the QP: [`Device::connect_qp`] |
/// | `accept(private data, ird, ord)` | [`ConnectRequest::accept`]; with the QP: [`ConnectRequest::accept_qp`] |
/// | QP ref/deref (the CM holds the QP while connected) | the engine holds the QP's protocol state; [`Qp::destroy`] is safe at any time |
/// | `reject(private data)` | [`ConnectRequest::reject`] |
/// | `disconnect(abrupt?)` | [`Connection::close`] with [`CloseMode`] |
/// | `CONNECT_REQUEST` | [`Listener::next_request`] |
/// | `CONNECT_REPLY` (0 / `ECONNREFUSED` / `ETIMEDOUT` / `ECONNRESET`) | [`ConnEvent::Established`] / [`ConnEvent::Failed`] with [`ConnError::Rejected`] (with the reply's private data) or [`ConnError::Refused`], [`ConnError::TimedOut`], [`ConnError::Reset`] |
/// | `ESTABLISHED` | [`ConnEvent::Established`] (responder) |
/// | `DISCONNECT`, `CLOSE` | [`ConnEvent::Disconnected`], [`ConnEvent::Closed`] / [`ConnEvent::Failed`] |
/// | device removal | [`DeviceEvent::DeviceGone`], every connection `Failed(DeviceGone)` |
///
/// Events are enqueued per connection in order, never called up: the provider's event
/// worker drains them.
///
/// # QPs on connections
///
/// A QP bound by [`Device::connect_qp`] / [`ConnectRequest::accept_qp`] is the
/// connection's upper layer ([`crate::rdmap::binding`]): it moves to RTS with the negotiated
/// ORD/IRD when MPA reaches full operation, runs its RDMAP traffic on the connection,
/// sends its Terminates on it, and goes to Error (flushing every WR) when the
/// connection fails or closes, or the device goes away. The connection's events still
/// come through the [`QpConnection`]. See `lib.rs` for a complete example.
///
/// # Example (memory link, no privileges)
///
/// ```
/// use std::net::Ipv4Addr;
/// use std::time::Duration;
/// use softiwarp::{Device, DeviceConfig, LinkConfig};
/// use softiwarp::link::{MemoryConfig, MemoryLink};
/// use softiwarp::transport::MpaParams;
///
/// let (a, b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
/// let server = Device::open(DeviceConfig::new(
///     "srv", LinkConfig::memory(b), Ipv4Addr::new(10, 9, 0, 2), 24)).unwrap();
/// let client = Device::open(DeviceConfig::new(
///     "cli", LinkConfig::memory(a), Ipv4Addr::new(10, 9, 0, 1), 24)).unwrap();
/// let listener = server.listen(4791, 8).unwrap();
/// let conn = client.connect(Ipv4Addr::new(10, 9, 0, 2), 4791, MpaParams {
///     private_data: b"hi".to_vec(), ird: 1, ord: 1, settings: None }).unwrap();
/// let request = listener.next_request(Duration::from_secs(5)).unwrap();
/// assert_eq!(request.private_data(), b"hi");
/// let served = request.accept(b"", 1, 1).unwrap();
/// conn.wait_established(Duration::from_secs(5)).unwrap();
/// conn.send_ulpdu(b"a DDP segment", Duration::from_secs(1)).unwrap();
/// assert_eq!(served.recv_ulpdu(Duration::from_secs(5)).unwrap(), b"a DDP segment");
/// ```
#[derive(Debug)]
pub struct Device {
    handle: Arc<Handle>,
    thread: Option<JoinHandle<()>>,
    name: String,
    address: Ipv4Addr,
    mtu: usize,
    tid: i32,
    stream: StreamConfig,
    /// The interface settings it was opened with (address, prefix, gateway, MAC).
    interface: InterfaceConfig,
    /// A host-TCP device's addresses, kept current by its stack ([`LinkSpec::Netdev`]).
    host_addrs: Option<SharedAddrs>,
}

struct Started {
    mtu: usize,
    tid: i32,
    driving: Arc<Driving>,
}

fn open_link(cfg: LinkConfig, offload: bool) -> Result<Box<dyn Link>, LinkError> {
    let mut link: Box<dyn Link> = match cfg.spec {
        LinkSpec::Tap(name) => {
            let o = if offload {
                TapOffload::Tcp4
            } else {
                TapOffload::Off
            };
            Box::new(TapLink::open_with(&name, o)?)
        }
        LinkSpec::Memory(m) => Box::new(m),
        LinkSpec::Udp(c) => Box::new(crate::link::UdpLink::open(&c)?),
        LinkSpec::Boxed(l) => l,
        LinkSpec::Netdev(name) => {
            return Err(LinkError::Config(format!(
                "{name} is a host interface: it has no frame link (the device runs on kernel TCP)"
            )))
        }
    };
    if let Some(f) = cfg.faults {
        link = Box::new(Faults::new(link, f.seed, f.tx, f.rx)?);
    }
    if let Some(path) = cfg.pcap {
        link = Box::new(Pcap::create(link, path)?);
    }
    Ok(link)
}

fn enter_netns(path: &PathBuf) -> std::io::Result<()> {
    let f = std::fs::File::open(path)?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)?;
    Ok(())
}

impl Device {
    /// Opens a device: starts its engine thread, which enters `config.netns` (if set),
    /// opens the link and builds the stack. Returns once the device runs.
    ///
    /// Errors: [`DeviceError::Thread`] (thread or eventfd creation, `setns`),
    /// [`DeviceError::Link`] (the TAP cannot be opened, the pcap file cannot be created,
    /// bad fault or interface settings), [`DeviceError::Stack`] (TCP or MPA settings).
    pub fn open(config: DeviceConfig) -> Result<Device, DeviceError> {
        let wake = Arc::new(
            EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|e| DeviceError::Thread(e.into()))?,
        );
        let (cmd_tx, cmd_rx) = mpsc::channel();
        let shared = Arc::new(Shared::new());
        let (start_tx, start_rx) = mpsc::channel::<Result<Started, DeviceError>>();
        let DeviceConfig {
            name,
            link,
            interface,
            tcp,
            mpa,
            connect_timeout,
            half_open_max,
            engine,
            netns,
            strict_read_sink,
            offload,
        } = config;
        let stack_cfg = StackConfig {
            interface,
            tcp,
            mpa,
            connect_timeout_us: u64::try_from(connect_timeout.as_micros()).unwrap_or(u64::MAX),
            terminate_linger_us: DEFAULT_TERMINATE_LINGER_US,
            half_open_max,
        };
        let host_addrs: Option<SharedAddrs> =
            matches!(link.spec, LinkSpec::Netdev(_)).then(SharedAddrs::default);
        let t_addrs = host_addrs.clone().unwrap_or_default();
        let thread_name: String = format!("sw-{name}").chars().take(15).collect();
        let (t_wake, t_shared, t_name) = (wake.clone(), shared.clone(), name.clone());
        let thread = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                let setup = || -> Result<Box<dyn LlpStack>, DeviceError> {
                    if let Some(ns) = &netns {
                        enter_netns(ns).map_err(DeviceError::Thread)?;
                    }
                    if let LinkSpec::Netdev(ifname) = &link.spec {
                        let host = HostStack::open(ifname, stack_cfg, t_addrs)
                            .map_err(DeviceError::Stack)?;
                        return Ok(Box::new(host));
                    }
                    let link = open_link(link, offload)?;
                    Ok(Box::new(Stack::new(
                        link,
                        stack_cfg,
                        smoltcp::time::Instant::ZERO,
                    )?))
                };
                let start = StdInstant::now();
                match setup().and_then(|stack| {
                    // The engine thread sleeps on a duplicate of the link's poll fd: it
                    // stays valid after the stack (and its link) are dropped at the end.
                    let link_fd = stack
                        .poll_fd()
                        .try_clone_to_owned()
                        .map_err(DeviceError::Thread)?;
                    Ok((stack, link_fd))
                }) {
                    Ok((stack, link_fd)) => {
                        let mtu = stack.mtu();
                        let driver = Engine::new(
                            stack,
                            cmd_rx,
                            t_wake.clone(),
                            t_shared.clone(),
                            engine,
                            start,
                            t_name.clone(),
                        );
                        let driving = Arc::new(Driving::new(
                            driver,
                            link_fd,
                            t_wake.clone(),
                            t_shared.clone(),
                            start,
                            engine,
                        ));
                        let started = Started {
                            mtu,
                            tid: nix::unistd::gettid().as_raw(),
                            driving: driving.clone(),
                        };
                        if start_tx.send(Ok(started)).is_err() {
                            return;
                        }
                        run_engine(driving, t_name);
                    }
                    Err(e) => {
                        let _ = start_tx.send(Err(e));
                    }
                }
            })
            .map_err(DeviceError::Thread)?;
        let started = match start_rx.recv() {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(DeviceError::Thread(std::io::Error::other(
                    "the engine thread died while starting",
                )));
            }
        };
        let address = host_addrs
            .as_ref()
            .and_then(|a| a.addresses().first().map(|s| s.addr))
            .unwrap_or(interface.address);
        tracing::info!(device = %name, %address, mtu = started.mtu, "device open");
        Ok(Device {
            handle: Arc::new(
                Handle::new(cmd_tx, Waker::engine(wake), shared, started.driving)
                    .with_strict_read_sink(strict_read_sink),
            ),
            thread: Some(thread),
            name,
            address,
            mtu: started.mtu,
            tid: started.tid,
            stream: engine.stream,
            interface,
            host_addrs,
        })
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's IPv4 address.
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// The device's IPv4 addresses with their prefix lengths: the one it was opened with,
    /// or a host-TCP device's interface addresses as they are now (none once the
    /// interface is gone).
    pub fn addresses(&self) -> Vec<Ipv4Subnet> {
        match &self.host_addrs {
            Some(a) => a.addresses(),
            None => vec![Ipv4Subnet::new(
                self.interface.address,
                self.interface.prefix_len,
            )],
        }
    }

    /// For a host-TCP device, the source address of the kernel's route to `dst` in the
    /// device's network namespace ([`crate::host::netdev::route_source`]); `None` for
    /// other devices, or when the kernel has no route.
    pub fn route_source(&self, dst: Ipv4Addr) -> Option<Ipv4Addr> {
        self.host_addrs.as_ref()?.route_source(dst)
    }

    /// Whether the device runs on a host interface's kernel TCP ([`LinkSpec::Netdev`]).
    pub fn is_host_tcp(&self) -> bool {
        self.host_addrs.is_some()
    }

    /// The interface settings the device was opened with: MAC, IPv4 address, prefix
    /// length (bits), gateway ([`DeviceConfig::interface`]).
    pub fn interface(&self) -> &InterfaceConfig {
        &self.interface
    }

    /// Resolves the Ethernet address of `ip`, an on-link neighbour (the peer or the
    /// gateway), by ARP through the device's stack, giving up after `timeout`
    /// (`rdma_resolve_addr`'s neighbour step; see [`crate::transport::neighbor`]). `done` is
    /// called exactly once: on the engine thread when the ARP Reply comes or the time
    /// is up ([`NeighborError::TimedOut`](crate::transport::neighbor::NeighborError::TimedOut)), or
    /// on the engine thread / this thread with
    /// [`NeighborError::NotOnLink`](crate::transport::neighbor::NeighborError::NotOnLink) (not a
    /// unicast address of the subnet) or
    /// [`NeighborError::DeviceGone`](crate::transport::neighbor::NeighborError::DeviceGone) (the
    /// device ended first). It must only enqueue (hand the result to a queue or a
    /// channel): the engine never runs user code or waits for it.
    pub fn resolve_neighbor(
        &self,
        ip: Ipv4Addr,
        timeout: Duration,
        done: impl FnOnce(crate::transport::neighbor::NeighborResult) + Send + 'static,
    ) {
        let reply = crate::transport::neighbor::NeighborReply::new(done);
        // On failure the command is dropped, which completes `done` with DeviceGone.
        let _ = self
            .handle
            .post(Command::ResolveNeighbor { ip, timeout, reply });
    }

    /// The link's IP MTU in bytes.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The Linux thread id of the engine thread (for `/proc/self/task/<tid>/stat`).
    pub fn engine_tid(&self) -> i32 {
        self.tid
    }

    /// The next device event, waiting up to `timeout`; `None` on timeout, or once the
    /// device has ended and every event was taken.
    pub fn next_event(&self, timeout: Duration) -> Option<DeviceEvent> {
        self.handle.shared.events.pop(timeout).ok()
    }

    /// `Some` once the device is gone or shut down.
    pub fn ended(&self) -> Option<DeviceEnd> {
        self.handle.shared.ended()
    }

    /// Connections in the device's transport table, including ones still closing in
    /// the background (e.g. in TCP TIME-WAIT), as of the engine's last pass; 0 once the
    /// device ended. For leak checks.
    pub fn connection_count(&self) -> usize {
        if self.ended().is_some() {
            return 0;
        }
        self.handle
            .shared
            .connections
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Raised by the engine after it queued connection, listener or device events.
    pub(crate) fn activity(&self) -> &crate::engine::event_signal::EventSignal {
        &self.handle.shared.activity
    }

    /// Listens on TCP `port` with room for `backlog` undecided connections (1..=1024),
    /// negotiating with the device's MPA defaults (see [`crate::transport`] for how the
    /// backlog works with smoltcp: beyond it, SYNs are answered with RST).
    ///
    /// Errors: [`DeviceError::Stack`] with `InvalidPort`, `InvalidBacklog`, `PortInUse`;
    /// [`DeviceError::Gone`], [`DeviceError::Closed`].
    pub fn listen(&self, port: u16, backlog: usize) -> Result<Listener, DeviceError> {
        self.listen_with(port, backlog, None)
    }

    /// As [`Device::listen`], negotiating with `settings` instead of the device defaults
    /// (`accept` supplies private data, IRD and ORD).
    ///
    /// Errors: as [`Device::listen`], and [`DeviceError::Stack`] with `Settings`.
    pub fn listen_with(
        &self,
        port: u16,
        backlog: usize,
        settings: Option<LocalSettings>,
    ) -> Result<Listener, DeviceError> {
        let queue = Arc::new(EventQueue::new());
        let q = queue.clone();
        let id = self.handle.call(|reply| Command::Listen {
            port,
            backlog,
            settings,
            queue: q,
            reply,
        })?;
        Ok(Listener {
            id,
            port,
            queue,
            handle: self.handle.clone(),
        })
    }

    /// Connects to `address:port` with `params` (private data, IRD/ORD, optional
    /// settings): TCP then MPA, in the background. Returns the pending connection at
    /// once; its [`ConnEvent`]s tell the outcome ([`Connection::wait_established`]).
    ///
    /// Errors: [`DeviceError::Stack`] with `Settings` (e.g. private data too long),
    /// `InvalidPort`, `NoFreePort`, `Unaddressable`; [`DeviceError::Gone`],
    /// [`DeviceError::Closed`].
    pub fn connect(
        &self,
        address: Ipv4Addr,
        port: u16,
        params: MpaParams,
    ) -> Result<Connection, DeviceError> {
        let (_, end) = stream::pair(self.stream, self.handle.waker.clone());
        let e = end.clone();
        let id = self.handle.call(|reply| Command::Connect {
            remote: SocketAddrV4::new(address, port),
            params,
            end: e,
            reply,
        })?;
        Ok(Connection::new(id, end, self.handle.clone(), UlpduStream))
    }

    /// Shuts the device down: every connection is reset and fails with
    /// [`ConnError::DeviceClosed`], listeners end, every QP goes to Error (its WRs
    /// flushed), the engine thread exits (the pcap file, if any, is flushed). Same as
    /// dropping the device. Verbs objects outlive it: CQs can still be polled, MRs
    /// read and written, QPs queried and destroyed; other calls fail with
    /// [`VerbsError::DeviceGone`].
    pub fn close(self) {}

    // ---- verbs ------------------------------------------------------------------

    /// The device's limits (`ibv_query_device(3)`).
    pub fn query_device(&self) -> DeviceAttr {
        DeviceAttr::SOFT
    }

    /// Allocates a protection domain (`ibv_alloc_pd(3)`).
    ///
    /// Errors: [`VerbsError::DeviceGone`] once the device ended;
    /// [`VerbsError::OutOfResources`] when PD handles are exhausted.
    pub fn alloc_pd(&self) -> Result<Pd, VerbsError> {
        self.handle.alive()?;
        let id = self.handle.mrs.alloc_pd()?;
        Ok(Pd::new(PdInner::new(id, Arc::clone(&self.handle))))
    }

    /// Creates a completion queue holding up to `capacity` completions
    /// (`ibv_create_cq(3)` `cqe`).
    ///
    /// Errors: [`VerbsError::InvalidArgument`] `"cqe"` for 0 or above
    /// [`crate::resources::completion_queue::MAX_CQE`]; [`VerbsError::DeviceGone`].
    pub fn create_cq(&self, capacity: usize) -> Result<Cq, VerbsError> {
        self.handle.alive()?;
        let cq = crate::resources::completion_queue::CompletionQueue::new(
            self.handle.next_cq(),
            capacity,
        )?;
        Ok(Cq::new(CqInner::new(cq, Arc::clone(&self.handle))))
    }

    /// Creates an RC queue pair in Reset in `pd`, completing on `attr.send_cq` and
    /// `attr.recv_cq` (`ibv_create_qp(3)`). Bind it to a connection with
    /// [`Device::connect_qp`] or [`ConnectRequest::accept_qp`] (which move it through
    /// Init, RTR and RTS), or drive its states with [`Qp::modify_qp`].
    ///
    /// Errors: [`VerbsError::InvalidArgument`] naming a `cap` field out of
    /// [`DeviceAttr`]'s range (`max_send_wr` must be at least 1);
    /// [`VerbsError::InvalidHandle`] (PD deallocated, CQ destroyed);
    /// [`VerbsError::NotPermitted`] (PD or CQ of another device);
    /// [`VerbsError::DeviceGone`].
    pub fn create_qp(&self, pd: &Pd, attr: QpInitAttr<'_>) -> Result<Qp, VerbsError> {
        Qp::create(&self.handle, pd, attr, None)
    }

    /// Creates a shared receive queue in `pd` (`ibv_create_srq(3)`, basic type):
    /// `attr.max_wr` WRs (rounded up to a power of two, as siw; [`Srq::query`] reports
    /// the granted figures) of at most `attr.max_sge` SGEs, the limit armed with a
    /// non-zero `attr.srq_limit`. See [`Srq`].
    ///
    /// Errors: [`VerbsError::InvalidArgument`] (`EINVAL`, as siw) `"max_wr"` (0 or above
    /// [`DeviceAttr::max_srq_wr`]), `"max_sge"` (above [`DeviceAttr::max_srq_sge`]),
    /// `"srq_limit"` (above `max_wr`); [`VerbsError::OutOfResources`] with
    /// [`DeviceAttr::max_srq`] SRQs; [`VerbsError::InvalidHandle`] (PD deallocated);
    /// [`VerbsError::NotPermitted`] (PD of another device); [`VerbsError::DeviceGone`].
    pub fn create_srq(&self, pd: &Pd, attr: verbs::SrqInitAttr) -> Result<Srq, VerbsError> {
        Srq::create(&self.handle, pd, attr)
    }

    /// [`Device::create_qp`] for a QP that takes its receive WRs from `srq`
    /// (`ibv_qp_init_attr.srq`): `attr.cap`'s `max_recv_wr` and `max_recv_sge` are
    /// ignored (0 in [`Qp::query_qp`]), [`Qp::post_recv`] fails with `EINVAL`, and its
    /// receive completions (of WRs posted to `srq`) go to `attr.recv_cq`. The SRQ's
    /// [`Srq::destroy`] fails with `EBUSY` while the QP exists.
    ///
    /// A separate call rather than a `srq` field of [`QpInitAttr`], which would break
    /// every struct literal of it.
    ///
    /// Errors: as [`Device::create_qp`]; [`VerbsError::InvalidHandle`] for a destroyed
    /// SRQ; [`VerbsError::NotPermitted`] for an SRQ of another device.
    pub fn create_qp_with_srq(
        &self,
        pd: &Pd,
        attr: QpInitAttr<'_>,
        srq: &Srq,
    ) -> Result<Qp, VerbsError> {
        Qp::create(&self.handle, pd, attr, Some(srq))
    }

    /// The next verbs asynchronous event of the device (`ibv_get_async_event(3)`):
    /// QP errors ([`AsyncEvent::QpFatal`], [`AsyncEvent::QpAccessErr`],
    /// [`AsyncEvent::QpReqErr`]), [`AsyncEvent::SqDrained`], CQ overruns
    /// ([`AsyncEvent::CqErr`]), SRQ events ([`AsyncEvent::SrqLimitReached`],
    /// [`AsyncEvent::QpLastWqeReached`]), and [`AsyncEvent::DeviceFatal`] when the
    /// link is gone. Waits up to `timeout`; `None` on timeout or once the device ended and
    /// every event was taken.
    pub fn next_async_event(&self, timeout: Duration) -> Option<AsyncEvent> {
        self.handle.shared.async_events.pop(timeout).ok()
    }

    /// Connects to `address:port` with `params` (private data, IRD/ORD, optional MPA
    /// settings) and binds `qp` to the connection (iWARP hands the QP to the CM at
    /// connect time; `rdma_connect(3)`). The QP must be in Reset or Init and not
    /// bound; it moves to Init now (post receives before or after), and to RTR and RTS
    /// when MPA negotiation succeeds, with ORD and IRD as negotiated (RFC 6581 §3). It
    /// moves to Error, flushing every WR, when the connection fails or closes.
    ///
    /// Errors: as [`Device::connect`]; [`DeviceError::Verbs`] with
    /// [`VerbsError::InvalidQpState`], [`VerbsError::InUse`] (already bound),
    /// [`VerbsError::NotPermitted`] (a QP of another device).
    pub fn connect_qp(
        &self,
        address: Ipv4Addr,
        port: u16,
        params: MpaParams,
        qp: &Qp,
    ) -> Result<QpConnection, DeviceError> {
        qp.check_device(&self.handle)?;
        let (_, end) = stream::pair(self.stream, self.handle.waker.clone());
        let e = end.clone();
        let qpn = qp.qp_num();
        let id = self.handle.call_dev(|reply| Command::ConnectQp {
            remote: SocketAddrV4::new(address, port),
            params,
            end: e,
            qpn,
            reply,
        })?;
        Ok(Connection::new(
            id,
            end,
            self.handle.clone(),
            QpBound { qp_num: qpn },
        ))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let _ = self.handle.cmds.send(Command::Shutdown);
        self.handle.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A listening port. Dropping it (or [`Listener::close`]) stops listening (iw-cm
/// `destroy_listen`); requests already taken stay valid.
#[derive(Debug)]
pub struct Listener {
    id: ListenerId,
    port: u16,
    queue: Arc<EventQueue<PendingRequest>>,
    handle: Arc<Handle>,
}

impl Listener {
    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The next connection request (a valid MPA Request), waiting up to `timeout`.
    ///
    /// Errors: [`ListenError::Timeout`], [`ListenError::Closed`] (listener closed or
    /// device shut down), [`ListenError::Gone`].
    pub fn next_request(&self, timeout: Duration) -> Result<ConnectRequest, ListenError> {
        match self.queue.pop(timeout) {
            Ok(p) => Ok(ConnectRequest {
                info: p.info,
                end: p.end,
                handle: self.handle.clone(),
                decided: false,
            }),
            Err(None) => Err(ListenError::Timeout),
            Err(Some(DeviceEnd::Gone(r))) => Err(ListenError::Gone(r)),
            Err(Some(DeviceEnd::Closed)) => Err(ListenError::Closed),
        }
    }

    /// Stops listening.
    pub fn close(self) {}
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.handle.post(Command::Unlisten { id: self.id });
    }
}

/// A connection request: the peer's MPA Request on a listener. Answer with
/// [`ConnectRequest::accept`] or [`ConnectRequest::reject`]; dropping it unanswered
/// rejects it with no private data.
#[derive(Debug)]
pub struct ConnectRequest {
    info: ConnectRequestInfo,
    end: StreamEnd,
    handle: Arc<Handle>,
    decided: bool,
}

impl ConnectRequest {
    /// The peer's MPA Request (revision, flags, IRD/ORD word, private data).
    pub fn request(&self) -> &Repr {
        &self.info.request
    }

    /// The peer's ULP private data, in bytes.
    pub fn private_data(&self) -> &[u8] {
        &self.info.request.private_data
    }

    /// The peer's IRD and ORD (RFC 6581), when it sent them (MPA Rev 2).
    pub fn ird_ord(&self) -> Option<(u16, u16)> {
        self.info.request.rev2.map(|r| (r.ird, r.ord))
    }

    /// The MPA revision of the Request.
    pub fn rev(&self) -> u8 {
        self.info.request.rev
    }

    /// Local address and port.
    pub fn local(&self) -> SocketAddrV4 {
        self.info.local
    }

    /// Peer address and port.
    pub fn remote(&self) -> SocketAddrV4 {
        self.info.remote
    }

    /// Accepts with `private_data` (bytes), `ird` and `ord` (14 bits): the MPA Reply is
    /// sent and the connection is established (its first event is
    /// [`ConnEvent::Established`], or [`ConnEvent::Failed`] if the IRD/ORD rules of
    /// RFC 6581 refuse it).
    ///
    /// Errors: [`DeviceError::Stack`] with `Mpa` (private data too long, IRD/ORD over 14
    /// bits; the request stays undecided and is rejected when dropped) or `WrongState`
    /// (the peer went away meanwhile); [`DeviceError::Gone`], [`DeviceError::Closed`].
    pub fn accept(
        mut self,
        private_data: &[u8],
        ird: u16,
        ord: u16,
    ) -> Result<Connection, DeviceError> {
        let conn = self.info.conn;
        let pd = private_data.to_vec();
        self.handle.call(|reply| Command::Accept {
            conn,
            private_data: pd,
            ird,
            ord,
            reply,
        })?;
        self.decided = true;
        Ok(Connection::new(
            conn,
            self.end.clone(),
            self.handle.clone(),
            UlpduStream,
        ))
    }

    /// Accepts with `private_data` (bytes), `ird` and `ord` (14 bits) and binds `qp`
    /// to the connection (`rdma_accept(3)`; iWARP hands the QP to the CM at accept):
    /// the MPA Reply is sent, and the QP moves to RTS at once with the negotiated ORD
    /// and IRD (its first FPDU still waits for the initiator's, RFC 5044 7.1.2). The
    /// QP must be in Reset or Init and not bound; it moves to Error, flushing every
    /// WR, when the connection fails or closes.
    ///
    /// Errors: as [`ConnectRequest::accept`]; [`DeviceError::Verbs`] with
    /// [`VerbsError::InvalidQpState`], [`VerbsError::InUse`],
    /// [`VerbsError::NotPermitted`] (a QP of another device). On error the request
    /// stays undecided and is rejected when dropped.
    pub fn accept_qp(
        mut self,
        qp: &Qp,
        private_data: &[u8],
        ird: u16,
        ord: u16,
    ) -> Result<QpConnection, DeviceError> {
        qp.check_device(&self.handle)?;
        let conn = self.info.conn;
        let pd = private_data.to_vec();
        let qpn = qp.qp_num();
        self.handle.call_dev(|reply| Command::AcceptQp {
            conn,
            private_data: pd,
            ird,
            ord,
            qpn,
            reply,
        })?;
        self.decided = true;
        Ok(Connection::new(
            conn,
            self.end.clone(),
            self.handle.clone(),
            QpBound { qp_num: qpn },
        ))
    }

    /// Rejects with `private_data` (bytes): a reject Reply (R set, RFC 5044 7.1.1) is
    /// sent and the TCP connection closed.
    ///
    /// Errors: as [`ConnectRequest::accept`].
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), DeviceError> {
        let conn = self.info.conn;
        let pd = private_data.to_vec();
        self.handle.call(|reply| Command::Reject {
            conn,
            private_data: pd,
            reply: Some(reply),
        })?;
        self.decided = true;
        Ok(())
    }
}

impl Drop for ConnectRequest {
    fn drop(&mut self) {
        if !self.decided {
            let _ = self.handle.post(Command::Reject {
                conn: self.info.conn,
                private_data: Vec::new(),
                reply: None,
            });
        }
    }
}

/// One connection (pending, established, or ended); events come in order
/// ([`Connection::next_event`]). `K` is what runs on it: the stream upper
/// ([`UlpduStream`], the default: the application's ULPDUs go through bounded queues,
/// [`StreamConfig`]) or a QP ([`QpBound`]: a [`QpConnection`]). Dropping it closes it
/// gracefully if it is still open.
#[derive(Debug)]
pub struct Connection<K = UlpduStream> {
    id: ConnId,
    end: StreamEnd,
    handle: Arc<Handle>,
    closed: AtomicBool,
    /// When a send of this connection last drove the device (microseconds of the
    /// device's clock), for [`SEND_DRIVE_INTERVAL_US`].
    last_send_drive_us: AtomicU64,
    kind: K,
}

/// What runs on a [`Connection`] of the stream upper: ULPDUs the application sends
/// ([`Connection::send_ulpdu`]) and receives ([`Connection::recv_ulpdu`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UlpduStream;

/// What runs on a [`QpConnection`]: the RDMAP traffic of the QP numbered
/// [`QpConnection::qp_num`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpBound {
    qp_num: u32,
}

/// A connection bound to a QP ([`Device::connect_qp`], [`ConnectRequest::accept_qp`]):
/// the QP's RDMAP traffic runs on it, so unlike a stream [`Connection`] it moves no
/// ULPDUs of its own; it carries the connection's events ([`ConnEvent::Established`],
/// [`ConnEvent::Disconnected`], [`ConnEvent::Closed`], [`ConnEvent::Failed`]) and closes
/// it. Dropping it closes the connection gracefully if it is still open (the QP then
/// goes to Error).
pub type QpConnection = Connection<QpBound>;

/// Least time between two drives by the sends of one stream [`Connection`] in
/// [`crate::ProgressMode::Hybrid`]: 20 microseconds (about 14 ULPDUs of 1,448 bytes at
/// 8 Gbit/s). A request-response exchange sends less often than that, so each of its
/// sends drives at once.
pub const SEND_DRIVE_INTERVAL_US: u64 = 20;

/// Queued bytes at which a send of a stream [`Connection`] drives however recently the
/// last one did: 32 KiB, so that every ULPDU of a large MULPDU drives (at MTU 65000 a
/// 64,940-byte ULPDU takes about the interval to send, and leaving it for the next
/// send starved TCP: 42% of raw TCP instead of 86%).
pub const SEND_DRIVE_BYTES: usize = 32 * 1024;

/// The calls of every connection, whatever runs on it.
impl<K> Connection<K> {
    fn new(id: ConnId, end: StreamEnd, handle: Arc<Handle>, kind: K) -> Self {
        Connection {
            id,
            end,
            handle,
            closed: AtomicBool::new(false),
            last_send_drive_us: AtomicU64::new(0),
            kind,
        }
    }

    /// The connection's id on its device.
    pub fn id(&self) -> ConnId {
        self.id
    }

    /// Waits up to `timeout` until the connection is established (a bound QP is then in
    /// RTS) and returns its parameters. Events are not consumed.
    ///
    /// Errors: [`ConnectError::Timeout`], [`ConnectError::Failed`] (rejected with the
    /// reply's private data, refused, timed out, reset, MPA error, device gone),
    /// [`ConnectError::Closed`].
    pub fn wait_established(&self, timeout: Duration) -> Result<Established, ConnectError> {
        match self.end.wait_established(timeout) {
            Ok(e) => Ok(e),
            Err(Some(e)) => Err(ConnectError::Failed(e)),
            Err(None) => match self.end.ended() {
                Some(Some(e)) => Err(ConnectError::Failed(e)),
                Some(None) => Err(ConnectError::Closed),
                None => Err(ConnectError::Timeout),
            },
        }
    }

    /// The next event, waiting up to `timeout`; `None` if none came. Every connection
    /// ends with exactly one [`ConnEvent::Closed`] or [`ConnEvent::Failed`].
    pub fn next_event(&self, timeout: Duration) -> Option<ConnEvent> {
        self.end.next_event(timeout)
    }

    /// The parameters, once established.
    pub fn established(&self) -> Option<Established> {
        self.end.established()
    }

    /// The agreed MPA settings (with the negotiated IRD and ORD), once established.
    pub fn agreed(&self) -> Option<Agreed> {
        self.end.established().map(|e| e.agreed)
    }

    /// MULPDU: the largest ULPDU this side may send, in bytes, once established.
    pub fn mulpdu(&self) -> Option<usize> {
        self.end.established().map(|e| e.mulpdu)
    }

    /// The outcome once ended: `Some(None)` closed, `Some(Some(e))` failed.
    pub fn ended(&self) -> Option<Option<ConnError>> {
        self.end.ended()
    }

    /// Waits up to `timeout` for the connection to end; the outcome, or `None` on timeout.
    pub fn wait_ended(&self, timeout: Duration) -> Option<Option<ConnError>> {
        self.end.wait_ended(timeout)
    }

    /// Closes the connection (`rdma_disconnect(3)` for a QP's). Graceful: ULPDUs already
    /// queued (or what the QP is sending) are sent, then MPA/TCP close (FIN); abortive:
    /// RST now. [`ConnEvent::Closed`] follows (unless it failed first). Sends fail from
    /// now on; a bound QP goes to Error and its outstanding WRs are flushed once the
    /// connection has ended.
    ///
    /// Errors: [`DeviceError::Stack`] with `WrongState` if it already ended,
    /// `NoSuchConnection` if it is gone; [`DeviceError::Gone`], [`DeviceError::Closed`].
    pub fn close(&self, mode: CloseMode) -> Result<(), DeviceError> {
        self.closed.store(true, Ordering::Relaxed);
        self.end.mark_closed();
        let conn = self.id;
        self.handle.call(|reply| Command::Close {
            conn,
            mode,
            reply: Some(reply),
        })
    }
}

/// The ULPDU calls of a stream connection.
impl Connection {
    /// Queues one ULPDU (1..=MULPDU bytes) to send, waiting up to `timeout` for room in
    /// the send queue (backpressure).
    ///
    /// Errors: [`SendError`] (`Timeout`, `NotEstablished`, `Closed`, `Failed`, `Empty`,
    /// `TooLong`).
    pub fn send_ulpdu(&self, ulpdu: &[u8], timeout: Duration) -> Result<(), SendError> {
        self.sent(self.end.send(ulpdu, timeout))
    }

    /// [`crate::ProgressMode::Hybrid`]: a queued ULPDU is driven out by the sender, at
    /// most once per [`SEND_DRIVE_INTERVAL_US`] unless [`SEND_DRIVE_BYTES`] are queued:
    /// a sender that queues faster leaves the ULPDUs of that interval to its next
    /// drive, so that one pass frames a batch (a
    /// pass per ULPDU, with its link read, cost the device variant of the transport
    /// benchmark 30% of its throughput at MTU 1500). What the last sends of a burst
    /// queued goes out on the next call that drives (a receive, a close, a CQ poll),
    /// or when the engine thread takes the link back (at most [`crate::engine::LEASE`]).
    fn sent(&self, r: Result<(), SendError>) -> Result<(), SendError> {
        if r.is_ok() && self.handle.drives() {
            let now = self.handle.driving.now_us();
            let last = self.last_send_drive_us.load(Ordering::Relaxed);
            if now.wrapping_sub(last) >= SEND_DRIVE_INTERVAL_US
                || self.end.tx_queued_bytes() >= SEND_DRIVE_BYTES
            {
                self.last_send_drive_us.store(now, Ordering::Relaxed);
                self.handle.drive(crate::engine::POST_BUDGET);
            }
        }
        r
    }

    /// [`crate::ProgressMode::Hybrid`]: before a receive blocks, the receiver drives for
    /// up to the spin time while nothing is queued (as a CQ wait does).
    fn drive_until_received(&self, timeout: Duration) {
        if !self.handle.drives() {
            return;
        }
        let begin = StdInstant::now();
        let spin = self.handle.driving.spin_time().min(timeout);
        while !self.end.has_received() && begin.elapsed() < spin {
            self.handle.drive(crate::engine::POLL_BUDGET);
        }
    }

    /// As [`Connection::send_ulpdu`], taking the buffer (no copy into the queue).
    ///
    /// Errors: as [`Connection::send_ulpdu`].
    pub fn send_ulpdu_vec(&self, ulpdu: Vec<u8>, timeout: Duration) -> Result<(), SendError> {
        self.sent(self.end.send_vec(ulpdu, timeout))
    }

    /// Zero-copy send: queues the ULPDU `head` (copied, e.g. a DDP header) followed by
    /// `body[range]`, which the engine frames straight from `body` into the TCP send
    /// buffer (CRC in that copy), as a QP sends from a memory region. Waits up to
    /// `timeout` for room in the send queue.
    ///
    /// Errors: as [`Connection::send_ulpdu`].
    pub fn send_ulpdu_shared(
        &self,
        head: &[u8],
        body: std::sync::Arc<[u8]>,
        range: std::ops::Range<usize>,
        timeout: Duration,
    ) -> Result<(), SendError> {
        self.sent(self.end.send_shared(head, body, range, timeout))
    }

    /// An empty buffer to build a ULPDU in for [`Connection::send_ulpdu_vec`]: one
    /// recycled from ULPDUs sent before or given back with [`Connection::recycle`], else
    /// a new one of `capacity` bytes. A steady stream then allocates nothing per ULPDU.
    pub fn ulpdu_buffer(&self, capacity: usize) -> Vec<u8> {
        self.end.buffer(capacity)
    }

    /// Gives a buffer (e.g. a ULPDU from [`Connection::recv_ulpdu`], once read) back
    /// for reuse by the receive path and [`Connection::ulpdu_buffer`] (bounded; the
    /// rest is freed).
    pub fn recycle(&self, buf: Vec<u8>) {
        self.end.recycle(buf);
    }

    /// Queues one ULPDU without waiting.
    ///
    /// Errors: [`SendError::WouldBlock`] when the queue is full, and as
    /// [`Connection::send_ulpdu`].
    pub fn try_send_ulpdu(&self, ulpdu: &[u8]) -> Result<(), SendError> {
        self.sent(self.end.try_send(ulpdu))
    }

    /// The next received ULPDU, waiting up to `timeout`.
    ///
    /// Errors: [`RecvError::Timeout`]; [`RecvError::Closed`] / [`RecvError::Failed`] once
    /// the connection ended (or the peer closed) and everything received was read.
    pub fn recv_ulpdu(&self, timeout: Duration) -> Result<Vec<u8>, RecvError> {
        self.drive_until_received(timeout);
        self.end.recv(timeout)
    }

    /// Every received ULPDU queued now, up to `max`, appended to `out` in order, waiting
    /// up to `timeout` for the first; returns how many (at least 1; 0 only when `max` is
    /// 0). One lock for the batch instead of one per ULPDU (the receive side of a bulk
    /// stream); give the buffers back with [`Connection::recycle_all`].
    ///
    /// Errors: as [`Connection::recv_ulpdu`].
    pub fn recv_ulpdus(
        &self,
        out: &mut Vec<Vec<u8>>,
        max: usize,
        timeout: Duration,
    ) -> Result<usize, RecvError> {
        self.drive_until_received(timeout);
        self.end.recv_batch(out, max, timeout)
    }

    /// [`Connection::recycle`] for every buffer in `bufs` (left empty), under one lock.
    pub fn recycle_all(&self, bufs: &mut Vec<Vec<u8>>) {
        self.end.recycle_all(bufs);
    }

    /// The next received ULPDU if one is queued.
    ///
    /// Errors: [`RecvError::WouldBlock`], and as [`Connection::recv_ulpdu`].
    pub fn try_recv_ulpdu(&self) -> Result<Vec<u8>, RecvError> {
        self.end.try_recv()
    }
}

impl<K> Drop for Connection<K> {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Relaxed) && self.end.ended().is_none() {
            let _ = self.handle.post(Command::Close {
                conn: self.id,
                mode: CloseMode::Graceful,
                reply: None,
            });
        }
    }
}

impl QpConnection {
    /// The number of the QP bound to it.
    pub fn qp_num(&self) -> u32 {
        self.kind.qp_num
    }
}
