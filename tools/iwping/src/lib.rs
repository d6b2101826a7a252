//! `iwping`: rping (rdma-core's `librdmacm/examples/rping.c`) on either backend: the soft
//! iWARP device or a kernel RDMA device through rdma-core.
//!
//! Its room: the tool and its engine. It touches softiwarp and cxgb4 (the two backends,
//! in the binary), verbs (the provider-neutral boundary the engine is written against),
//! rdma-cm, mpa (the MPA options of the command line) and netlab (link options, signals,
//! logging); nothing depends on it.
//!
//! The engine ([`run`]): rping's client and server ([`crate::rping`]), written once
//! against [`verbs::provider::Provider`]: an RDMA CM event channel and the verbs objects
//! of its ids' devices. The binary (`src/main.rs`) runs it on the soft device over a TAP
//! (`softiwarp::cm::provider::SoftCm`) or, with `--device NAME`, on an rdma-core device
//! (`cxgb4::EventChannel`: siw0, cxgb4_0); tests run it on soft devices over memory
//! links.
//!
//! What the two roles do, call by call (librdmacm's names):
//!
//! - **client**: `rdma_resolve_addr` -> ADDR_RESOLVED, `rdma_resolve_route` ->
//!   ROUTE_RESOLVED, PD/CQ/QP on the id's device (`id->verbs`), four MRs (receive and
//!   send buffers of [`INFO_LEN`] bytes, the source and the sink of `size` bytes, the
//!   latter two with remote read and write access), one receive posted,
//!   `rdma_connect` (responder_resources = initiator_depth = 1, as rping, clamped to the
//!   device's [`verbs::DeviceCaps`]) -> ESTABLISHED; then the pings ([`crate::rping`]),
//!   then `rdma_disconnect` and a wait for DISCONNECTED (so the FIN is out before the
//!   process, and the engine, ends).
//! - **server**: `rdma_bind_addr`, `rdma_listen` (backlog 3) -> CONNECT_REQUEST; PD/CQ/QP,
//!   three MRs (receive, send, the `size`-byte buffer), one receive, `rdma_accept` with the
//!   request's own resources mirrored (what librdmacm's `rdma_accept(id, NULL)` does),
//!   clamped to the device -> ESTABLISHED; then pings until DISCONNECTED, which ends a
//!   successful run.
//!
//! The address advertised in [`RdmaInfo::buf`] is the MR's iova (the backend chooses it:
//! the soft device from `softiwarp::cm::provider::IOVA_BASE`, rdma-core the buffer's
//! address): the TO the peer puts in its RDMA Read Request or Write is the address it was
//! given, as with any verbs peer.
//!
//! Beyond rping: the server checks the data it read against the ping pattern with `-V`
//! (rping's server checks nothing), and both sides clear the buffer they receive into
//! before each ping, so a Write or Read that did not happen cannot pass a check.

pub mod rping;

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use verbs::provider::{
    CmEvent, CmEventKind, CmId, CompletionQueue, ConnParam, Device, MemoryRegion, ProtectionDomain,
    Provider, ProviderError, QueuePair,
};
use verbs::{
    AccessFlags, DeviceCaps, QpCap, RecvWr, SendFlags, SendWr, Stag, WcOpcode, WcStatus,
    WorkCompletion,
};

use crate::rping::{BogusMessage, RdmaInfo, INFO_LEN, SQ_DEPTH};

/// Which side of rping to play.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `-s`: listen, RDMA-Read the client's data, RDMA-Write it back.
    Server,
    /// `-c`: connect, advertise source and sink, verify.
    Client,
}

/// rping's options (the device's own options are the binary's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PingOptions {
    /// `-s` / `-c`.
    pub role: Role,
    /// `-a`: the server's address (client; required), or the address to bind (server;
    /// `None` or 0.0.0.0: every address).
    pub addr: Option<Ipv4Addr>,
    /// `-p`: port (default [`rping::RPING_PORT`]).
    pub port: u16,
    /// `-C`: pings to make (client) or to expect at most (server); 0: until stopped
    /// (client) or until the client disconnects (server).
    pub count: u64,
    /// `-S`: ping data size in bytes, [`rping::MIN_SIZE`]..=[`rping::MAX_SIZE`].
    pub size: usize,
    /// `-v`: print each ping's data.
    pub verbose: bool,
    /// `-V`: check each ping's data (client: sink equals source; server: the data read
    /// is the ping pattern).
    pub validate: bool,
    /// `-d`: rping's debug lines on the output (`rdma_listen`, `ESTABLISHED`, ...).
    pub debug: bool,
    /// Our IRD and ORD (`responder_resources`, `initiator_depth`) for `rdma_connect` /
    /// `rdma_accept`, clamped to the device's limits ([`DeviceCaps::max_ird`],
    /// [`DeviceCaps::max_ord`]). `None`: rping's choice (client 1 and 1; server the
    /// request's own values mirrored, as `rdma_accept(id, NULL)`; with an MPA rev 1 peer
    /// that is 0 and 0, so no RDMA Read is allowed).
    pub ird_ord: Option<(u16, u16)>,
    /// The device the connection must be on (`--device`): after address resolution
    /// (client) or at the connect request (server), an id on another device fails the
    /// run with [`IwpingError::WrongDevice`]. `None`: any.
    pub device: Option<String>,
    /// How long any one step may take (address resolution, a completion, an event)
    /// before the run fails; the server waits this long for the connection too.
    pub step_timeout: Duration,
}

impl Default for PingOptions {
    fn default() -> Self {
        PingOptions {
            role: Role::Client,
            addr: None,
            port: rping::RPING_PORT,
            count: 0,
            size: rping::DEFAULT_SIZE,
            verbose: false,
            validate: false,
            debug: false,
            ird_ord: None,
            device: None,
            step_timeout: Duration::from_secs(60),
        }
    }
}

/// What a successful run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PingSummary {
    /// Pings completed.
    pub pings: u64,
    /// The peer's address and port.
    pub peer: Option<SocketAddr>,
    /// From ESTABLISHED: the peer's ORD (`responder_resources`) and IRD
    /// (`initiator_depth`) as the CM reported them (client: from the Reply; server: from
    /// the Request).
    pub peer_ord_ird: (u16, u16),
    /// Whether DISCONNECTED was seen before the run ended.
    pub disconnected: bool,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum IwpingError {
    /// Bad options.
    #[error("invalid options: {0}")]
    Options(String),
    /// A verbs or rdma_cm call failed (the error names the call).
    #[error(transparent)]
    Call(#[from] ProviderError),
    /// An event other than the one waited for (rping: `cma event %s, error %d`).
    #[error("cma event {kind}, error {status} (waiting for {waiting_for})")]
    Event {
        /// The event.
        kind: CmEventKind,
        /// Its status (0 or a negative errno).
        status: i32,
        /// What was expected.
        waiting_for: &'static str,
    },
    /// The id's device is gone (`id->verbs` is NULL).
    #[error("the rdma_cm id has no device")]
    NoDevice,
    /// The connection is on another device than `--device` named.
    #[error("the connection is on device {found}, not {want}")]
    WrongDevice {
        /// `--device`.
        want: String,
        /// The id's device.
        found: String,
    },
    /// Nothing happened in time.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, &'static str),
    /// A work request completed in error (rping: `cq completion failed status %d`).
    #[error(
        "cq completion failed status {} ({status:?}) for {opcode:?} wr {wr_id}, vendor_err {vendor_err:#x}",
        *status as u32
    )]
    Completion {
        /// The WR's id.
        wr_id: u64,
        /// Its status.
        status: WcStatus,
        /// What it was.
        opcode: WcOpcode,
        /// The device's vendor error (the soft device: its Terminate code,
        /// `Layer|EType|ErrCode`), if any.
        vendor_err: u32,
    },
    /// A completion that does not belong at this point of the exchange.
    #[error("unexpected {0:?} completion while waiting for {1}")]
    Unexpected(WcOpcode, &'static str),
    /// A message of the wrong length.
    #[error(transparent)]
    Bogus(#[from] BogusMessage),
    /// The peer's buffer does not fit ours.
    #[error("the peer advertised {peer} bytes, our buffer holds {ours}")]
    TooLarge {
        /// Bytes advertised.
        peer: u32,
        /// Our `-S`.
        ours: usize,
    },
    /// `-V` found different data (rping: `data mismatch!`).
    #[error("data mismatch! ping {ping}: first difference at byte {offset} (got {got:#04x}, want {want:#04x})")]
    DataMismatch {
        /// The ping (from 0).
        ping: u64,
        /// Offset of the first wrong byte.
        offset: usize,
        /// The byte found.
        got: u8,
        /// The byte expected.
        want: u8,
    },
    /// The connection ended in the middle of a ping.
    #[error("DISCONNECTED during ping {0}")]
    Disconnected(u64),
    /// Writing the output failed.
    #[error("output: {0}")]
    Output(#[from] std::io::Error),
    /// SIGINT, SIGTERM or SIGHUP arrived (with [`netlab::signals::install_handler`]):
    /// the run stops, and its ids are destroyed so that the peer hears of it at once
    /// (as the kernel closes a killed rping's connection) instead of after its TCP
    /// timeout.
    #[error("interrupted by a signal")]
    Interrupted,
}

/// How often blocking waits look at [`netlab::signals::interrupted`].
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// How long one CQ wait sleeps before the loop looks at the CM channel again.
const CQ_NAP: Duration = Duration::from_millis(10);

impl PingOptions {
    /// Checks the options as rping does.
    ///
    /// Errors: [`IwpingError::Options`]: size out of range, client without `-a`.
    pub fn check(&self) -> Result<(), IwpingError> {
        if !(rping::MIN_SIZE..=rping::MAX_SIZE).contains(&self.size) {
            return Err(IwpingError::Options(format!(
                "Invalid size {} (valid range is {} to {})",
                self.size,
                rping::MIN_SIZE,
                rping::MAX_SIZE
            )));
        }
        if self.role == Role::Client && self.addr.is_none() {
            return Err(IwpingError::Options("the client needs -a ADDR".into()));
        }
        Ok(())
    }
}

/// Our IRD and ORD for `rdma_connect` / `rdma_accept`: `ird_ord` limited to the
/// device's IRD and ORD (iw_cxgb4 refuses more than 32 with `EINVAL`).
pub fn clamp_ird_ord(caps: &DeviceCaps, (ird, ord): (u16, u16)) -> (u16, u16) {
    let c = |v: u16, max: u32| u16::try_from(u32::from(v).min(max)).unwrap_or(v);
    (c(ird, caps.max_ird), c(ord, caps.max_ord))
}

/// Runs one rping session as `opts` says on the event channel `p` (of the soft device's
/// RDMA CM, `softiwarp::cm::provider::SoftCm`, or of rdma-core,
/// `cxgb4::EventChannel`), writing rping's output lines to `out`. One code path for
/// both backends.
///
/// Errors: see [`IwpingError`]; the run stops at the first one (the connection and every
/// object are released on the way out).
pub fn run<P: Provider>(
    p: &P,
    opts: &PingOptions,
    out: &mut dyn Write,
) -> Result<PingSummary, IwpingError> {
    opts.check()?;
    match opts.role {
        Role::Client => run_client(p, opts, out),
        Role::Server => run_server(p, opts, out),
    }
}

fn debug(opts: &PingOptions, out: &mut dyn Write, line: std::fmt::Arguments<'_>) {
    if opts.debug {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Waits for the next event on `p`, which must be `want`; returns its
/// `responder_resources` and `initiator_depth` and, for a ConnectRequest, the new id.
fn expect_event<P: Provider>(
    p: &P,
    want: CmEventKind,
    timeout: Duration,
    waiting_for: &'static str,
) -> Result<(u16, u16, Option<P::Id>), IwpingError> {
    let deadline = Instant::now() + timeout;
    let mut ev = loop {
        if netlab::signals::interrupted() {
            return Err(IwpingError::Interrupted);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(IwpingError::Timeout(timeout, waiting_for));
        }
        if let Some(ev) = p.get_event(left.min(SIGNAL_CHECK))? {
            break ev;
        }
    };
    if ev.kind() != want {
        return Err(IwpingError::Event {
            kind: ev.kind(),
            status: ev.status(),
            waiting_for,
        });
    }
    let param = ev.conn_param();
    let new_id = ev.take_new_id();
    Ok((param.responder_resources, param.initiator_depth, new_id))
}

/// The verbs objects of one connection (dropped in this order: the QP before the MRs
/// its WRs name).
struct Session<P: Provider> {
    cq: P::Cq,
    qp: P::Qp,
    recv: P::Mr,
    send: P::Mr,
    /// Server: where the Read lands and the Write comes from. Client: the sink.
    rdma: P::Mr,
    /// Client only: the source.
    start: Option<P::Mr>,
    _pd: P::Pd,
    /// The device's limits.
    caps: DeviceCaps,
}

/// What the wait loop found.
enum Step {
    Wc(WorkCompletion),
    Disconnected,
}

/// An SGE over `[0, len)` of `mr`.
fn sge<M: MemoryRegion>(mr: &M, len: u32) -> Result<verbs::Sge, IwpingError> {
    mr.sge(0, len).ok_or(IwpingError::TooLarge {
        peer: len,
        ours: mr.len(),
    })
}

impl<P: Provider> Session<P> {
    fn new(id: &P::Id, opts: &PingOptions) -> Result<Session<P>, IwpingError> {
        let dev = id.device().ok_or(IwpingError::NoDevice)?;
        if let Some(want) = &opts.device {
            let found = dev.name();
            if &found != want {
                return Err(IwpingError::WrongDevice {
                    want: want.clone(),
                    found,
                });
            }
        }
        let caps = dev.caps()?;
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq(2 * SQ_DEPTH)?;
        let cap = QpCap {
            max_send_wr: SQ_DEPTH,
            max_recv_wr: 2,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        // rdma_create_qp leaves the QP ready for receives (INIT), so one can be posted
        // before connecting, as rping does.
        let qp = id.create_qp(&pd, &cq, &cq, cap, false)?;
        // REMOTE_WRITE on the RDMA buffers: also what an RDMA Read sink needs on
        // iw_cxgb4 (DeviceCaps::read_sink_needs_remote_write).
        let remote =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let recv = pd.reg_mr(INFO_LEN, AccessFlags::LOCAL_WRITE)?;
        let send = pd.reg_mr(INFO_LEN, AccessFlags::empty())?;
        let rdma = pd.reg_mr(opts.size, remote)?;
        let start = match opts.role {
            Role::Client => Some(pd.reg_mr(opts.size, remote)?),
            Role::Server => None,
        };
        Ok(Session {
            cq,
            qp,
            recv,
            send,
            rdma,
            start,
            _pd: pd,
            caps,
        })
    }

    fn post_recv(&self) -> Result<(), IwpingError> {
        let wr = RecvWr::new(1, vec![sge(&self.recv, INFO_LEN as u32)?]);
        Ok(self.qp.post_recv(wr)?)
    }

    /// Sends the 16-byte send buffer, holding `info`.
    fn send_info(&mut self, info: &RdmaInfo) -> Result<(), IwpingError> {
        self.send.write(0, &info.encode())?;
        let wr = SendWr::send(2, vec![sge(&self.send, INFO_LEN as u32)?])
            .with_flags(SendFlags::SIGNALED);
        Ok(self.qp.post_send(wr)?)
    }

    /// The next completion (flushed ones skipped, as rping does) or DISCONNECTED.
    fn next(
        &self,
        p: &P,
        timeout: Duration,
        waiting_for: &'static str,
        opts: &PingOptions,
        out: &mut dyn Write,
    ) -> Result<Step, IwpingError> {
        let deadline = Instant::now() + timeout;
        loop {
            if netlab::signals::interrupted() {
                return Err(IwpingError::Interrupted);
            }
            if let Some(wc) = self.cq.poll(1)?.pop() {
                match wc.status {
                    WcStatus::Success => return Ok(Step::Wc(wc)),
                    WcStatus::WrFlushErr => continue,
                    status => {
                        return Err(IwpingError::Completion {
                            wr_id: wc.wr_id,
                            status,
                            opcode: wc.opcode,
                            vendor_err: wc.vendor_err,
                        })
                    }
                }
            }
            if let Some(ev) = p.get_event(Duration::ZERO)? {
                debug(opts, out, format_args!("cma_event type {}", ev.kind()));
                match ev.kind() {
                    CmEventKind::Disconnected => return Ok(Step::Disconnected),
                    kind => {
                        return Err(IwpingError::Event {
                            kind,
                            status: ev.status(),
                            waiting_for,
                        })
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(IwpingError::Timeout(timeout, waiting_for));
            }
            self.cq.wait((deadline - now).min(CQ_NAP))?;
        }
    }

    /// Waits for a completion of `want`, skipping Send completions (rping counts them
    /// only in its debug output). `Ok(None)`: DISCONNECTED came first.
    fn wait_for(
        &self,
        p: &P,
        want: WcOpcode,
        waiting_for: &'static str,
        opts: &PingOptions,
        out: &mut dyn Write,
    ) -> Result<Option<WorkCompletion>, IwpingError> {
        loop {
            match self.next(p, opts.step_timeout, waiting_for, opts, out)? {
                Step::Disconnected => return Ok(None),
                Step::Wc(wc) if wc.opcode == want => return Ok(Some(wc)),
                Step::Wc(wc) if wc.opcode == WcOpcode::Send => {
                    debug(opts, out, format_args!("send completion"));
                }
                Step::Wc(wc) => return Err(IwpingError::Unexpected(wc.opcode, waiting_for)),
            }
        }
    }

    /// Waits for a received message, checks its length, reposts the receive.
    fn recv_msg(
        &self,
        p: &P,
        waiting_for: &'static str,
        opts: &PingOptions,
        out: &mut dyn Write,
    ) -> Result<Option<RdmaInfo>, IwpingError> {
        let Some(wc) = self.wait_for(p, WcOpcode::Recv, waiting_for, opts, out)? else {
            return Ok(None);
        };
        let mut b = [0u8; INFO_LEN];
        self.recv.read(0, &mut b)?;
        let info = RdmaInfo::decode(&b[..(wc.byte_len as usize).min(INFO_LEN)]);
        if wc.byte_len as usize != INFO_LEN {
            return Err(BogusMessage(wc.byte_len as usize).into());
        }
        self.post_recv()?;
        Ok(Some(info?))
    }

    fn info_of(mr: &P::Mr, size: usize) -> RdmaInfo {
        RdmaInfo {
            buf: mr.iova(),
            rkey: u32::from(mr.rkey()),
            size: size as u32,
        }
    }
}

fn first_difference(got: &[u8], want: &[u8]) -> Option<(usize, u8, u8)> {
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| g != w)
        .map(|(i, (g, w))| (i, *g, *w))
}

fn run_client<P: Provider>(
    p: &P,
    opts: &PingOptions,
    out: &mut dyn Write,
) -> Result<PingSummary, IwpingError> {
    let addr = opts
        .addr
        .ok_or_else(|| IwpingError::Options("the client needs -a ADDR".into()))?;
    let dst = SocketAddr::V4(SocketAddrV4::new(addr, opts.port));
    let id = p.create_id()?;
    id.resolve_addr(None, dst, Duration::from_millis(2000))?;
    expect_event(
        p,
        CmEventKind::AddrResolved,
        opts.step_timeout,
        "ADDR_RESOLVED",
    )?;
    id.resolve_route(Duration::from_millis(2000))?;
    expect_event(
        p,
        CmEventKind::RouteResolved,
        opts.step_timeout,
        "ROUTE_RESOLVED",
    )?;
    debug(
        opts,
        out,
        format_args!("rdma_resolve_addr - rdma_resolve_route successful"),
    );
    let mut s = Session::<P>::new(&id, opts)?;
    s.post_recv()?;
    let (ird, ord) = clamp_ird_ord(&s.caps, opts.ird_ord.unwrap_or((1, 1)));
    id.connect(&ConnParam::new(ird, ord))?;
    let (ord, ird, _) = expect_event(
        p,
        CmEventKind::Established,
        opts.step_timeout,
        "ESTABLISHED",
    )?;
    debug(
        opts,
        out,
        format_args!("rdma_connect successful (peer ORD {ord}, IRD {ird})"),
    );
    let mut summary = PingSummary {
        pings: 0,
        peer: id.peer_addr(),
        peer_ord_ird: (ord, ird),
        disconnected: false,
    };
    let mut ping = 0u64;
    while opts.count == 0 || ping < opts.count {
        let data = rping::ping_data(ping, opts.size);
        let start = s.start.as_mut().ok_or(IwpingError::NoDevice)?;
        start.write(0, &data)?;
        let start_info = Session::<P>::info_of(start, opts.size);
        s.rdma.write(0, &vec![0u8; opts.size])?;
        s.send_info(&start_info)?;
        if s.recv_msg(p, "the go-ahead after the RDMA Read", opts, out)?
            .is_none()
        {
            return Err(IwpingError::Disconnected(ping));
        }
        let sink_info = Session::<P>::info_of(&s.rdma, opts.size);
        s.send_info(&sink_info)?;
        if s.recv_msg(p, "the go-ahead after the RDMA Write", opts, out)?
            .is_none()
        {
            return Err(IwpingError::Disconnected(ping));
        }
        let mut sink = vec![0u8; opts.size];
        s.rdma.read(0, &mut sink)?;
        if opts.validate {
            if let Some((offset, got, want)) = first_difference(&sink, &data) {
                return Err(IwpingError::DataMismatch {
                    ping,
                    offset,
                    got,
                    want,
                });
            }
        }
        if opts.verbose {
            writeln!(out, "{}", rping::client_line(&sink))?;
            out.flush()?;
        }
        ping += 1;
        summary.pings = ping;
    }
    id.disconnect()?;
    // Wait for the close, so the FIN leaves before the device does; Send completions
    // and flushes may come first.
    loop {
        match s.next(p, opts.step_timeout, "DISCONNECTED", opts, out)? {
            Step::Disconnected => break,
            Step::Wc(_) => continue,
        }
    }
    summary.disconnected = true;
    // rdma_destroy_qp, then rdma_destroy_id.
    drop(s);
    drop(id);
    Ok(summary)
}

fn run_server<P: Provider>(
    p: &P,
    opts: &PingOptions,
    out: &mut dyn Write,
) -> Result<PingSummary, IwpingError> {
    let listener = p.create_id()?;
    let bind = SocketAddrV4::new(opts.addr.unwrap_or(Ipv4Addr::UNSPECIFIED), opts.port);
    listener.bind_addr(SocketAddr::V4(bind))?;
    debug(opts, out, format_args!("rdma_bind_addr successful"));
    listener.listen(3)?;
    debug(opts, out, format_args!("rdma_listen"));
    let (ord, ird, child) = expect_event(
        p,
        CmEventKind::ConnectRequest,
        opts.step_timeout,
        "CONNECT_REQUEST",
    )?;
    let child = child.ok_or(IwpingError::NoDevice)?;
    debug(
        opts,
        out,
        format_args!("child cma {:#x} (peer ORD {ord}, IRD {ird})", child.key()),
    );
    let mut s = Session::<P>::new(&child, opts)?;
    s.post_recv()?;
    // rdma_accept(id, NULL): our IRD = the peer's ORD, our ORD = the peer's IRD.
    let (our_ird, our_ord) = clamp_ird_ord(&s.caps, opts.ird_ord.unwrap_or((ord, ird)));
    debug(
        opts,
        out,
        format_args!("rdma_accept (IRD {our_ird}, ORD {our_ord})"),
    );
    child.accept(&ConnParam::new(our_ird, our_ord))?;
    expect_event(
        p,
        CmEventKind::Established,
        opts.step_timeout,
        "ESTABLISHED",
    )?;
    debug(opts, out, format_args!("ESTABLISHED"));
    let mut summary = PingSummary {
        pings: 0,
        peer: child.peer_addr(),
        peer_ord_ird: (ord, ird),
        disconnected: false,
    };
    let go_ahead = RdmaInfo {
        buf: 0,
        rkey: 0,
        size: 0,
    };
    let mut ping = 0u64;
    loop {
        let Some(source) = s.recv_msg(p, "the client's source buffer", opts, out)? else {
            summary.disconnected = true;
            break;
        };
        debug(
            opts,
            out,
            format_args!(
                "Received rkey {:x} addr {:x} len {} from peer",
                source.rkey, source.buf, source.size
            ),
        );
        if source.size as usize > opts.size {
            return Err(IwpingError::TooLarge {
                peer: source.size,
                ours: opts.size,
            });
        }
        s.rdma.write(0, &vec![0u8; opts.size])?;
        s.qp.post_send(
            SendWr::rdma_read(
                3,
                vec![sge(&s.rdma, source.size)?],
                source.buf,
                Stag::from_raw(source.rkey),
            )
            .with_flags(SendFlags::SIGNALED),
        )
        .map_err(|e| e.in_call("ibv_post_send (RDMA Read)"))?;
        if s.wait_for(p, WcOpcode::RdmaRead, "the RDMA Read", opts, out)?
            .is_none()
        {
            return Err(IwpingError::Disconnected(ping));
        }
        let mut data = vec![0u8; source.size as usize];
        s.rdma.read(0, &mut data)?;
        if opts.verbose {
            writeln!(out, "{}", rping::server_line(&data))?;
            out.flush()?;
        }
        if opts.validate {
            let want = rping::ping_data(ping, data.len());
            if let Some((offset, got, want)) = first_difference(&data, &want) {
                return Err(IwpingError::DataMismatch {
                    ping,
                    offset,
                    got,
                    want,
                });
            }
        }
        s.send_info(&go_ahead)?;
        let Some(sink) = s.recv_msg(p, "the client's sink buffer", opts, out)? else {
            return Err(IwpingError::Disconnected(ping));
        };
        // strlen(rdma_buf) + 1, as rping.
        let len = (rping::c_string(&data).len() + 1).min(data.len());
        if len > sink.size as usize {
            return Err(IwpingError::TooLarge {
                peer: sink.size,
                ours: len,
            });
        }
        s.qp.post_send(
            SendWr::rdma_write(
                3,
                vec![sge(&s.rdma, len as u32)?],
                sink.buf,
                Stag::from_raw(sink.rkey),
            )
            .with_flags(SendFlags::SIGNALED),
        )
        .map_err(|e| e.in_call("ibv_post_send (RDMA Write)"))?;
        if s.wait_for(p, WcOpcode::RdmaWrite, "the RDMA Write", opts, out)?
            .is_none()
        {
            return Err(IwpingError::Disconnected(ping));
        }
        s.send_info(&go_ahead)?;
        ping += 1;
        summary.pings = ping;
        if opts.count != 0 && ping >= opts.count {
            // Wait for the client's disconnect, as rping's server does.
            loop {
                match s.next(p, opts.step_timeout, "DISCONNECTED", opts, out)? {
                    Step::Disconnected => break,
                    Step::Wc(wc) if wc.opcode == WcOpcode::Send => continue,
                    Step::Wc(wc) => return Err(IwpingError::Unexpected(wc.opcode, "DISCONNECTED")),
                }
            }
            summary.disconnected = true;
            break;
        }
    }
    // rping_disconnect: the peer closed already; our side of the close may still be due.
    let _ = child.disconnect();
    drop(s);
    drop(child);
    drop(listener);
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_cm::RdmaCmConfig;
    use softiwarp::cm::provider::SoftCm;
    use softiwarp::cm::rdmacm::{SoftDevice, SoftRdmaCm};
    use softiwarp::link::{MemoryConfig, MemoryLink};
    use softiwarp::{Device, DeviceConfig, LinkConfig};
    use std::sync::Arc;

    const SERVER: Ipv4Addr = Ipv4Addr::new(10, 8, 0, 2);
    const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 8, 0, 1);

    /// Two hosts on a memory link, each with its own RDMA CM.
    fn pair() -> (SoftRdmaCm, SoftRdmaCm) {
        let (l1, l2) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let host = |name: &str, link, ip| {
            let dev =
                Device::open(DeviceConfig::new(name, LinkConfig::memory(link), ip, 24)).unwrap();
            let cm = SoftRdmaCm::new(RdmaCmConfig {
                name: name.into(),
                ..RdmaCmConfig::default()
            })
            .unwrap();
            cm.add_device(SoftDevice::new(Arc::new(dev)).unwrap())
                .unwrap();
            cm
        };
        (host("srv", l2, SERVER), host("cli", l1, CLIENT))
    }

    fn opts(role: Role, count: u64, size: usize) -> PingOptions {
        PingOptions {
            role,
            addr: (role == Role::Client).then_some(SERVER),
            count,
            size,
            verbose: true,
            validate: true,
            debug: role == Role::Server,
            step_timeout: Duration::from_secs(20),
            ..PingOptions::default()
        }
    }

    /// One side's result and output.
    type Side = (Result<PingSummary, IwpingError>, String);

    /// Runs a server and a client; returns their results and outputs.
    fn session(count: u64, size: usize) -> (Side, Side) {
        let (scm, ccm) = pair();
        let server = std::thread::spawn(move || {
            let mut out = Vec::new();
            let r = run(
                &SoftCm::new(&scm),
                &opts(Role::Server, count, size),
                &mut out,
            );
            (r, String::from_utf8_lossy(&out).into_owned())
        });
        // The listener is up within milliseconds; a client that came too early would
        // be refused, so give it a moment.
        std::thread::sleep(Duration::from_millis(300));
        let mut out = Vec::new();
        let c = run(
            &SoftCm::new(&ccm),
            &opts(Role::Client, count, size),
            &mut out,
        );
        let client = (c, String::from_utf8_lossy(&out).into_owned());
        (server.join().unwrap(), client)
    }

    #[test]
    fn client_and_server_ping_each_other_with_rpings_output() {
        let ((s, sout), (c, cout)) = session(5, 64);
        let s = s.unwrap_or_else(|e| panic!("server: {e}\n{sout}\nclient: {c:?}\n{cout}"));
        let c = c.unwrap_or_else(|e| panic!("client: {e}\n{cout}"));
        assert_eq!((s.pings, c.pings), (5, 5));
        assert!(s.disconnected && c.disconnected);
        // rping's client asks IRD 1 / ORD 1; the server mirrors it.
        assert_eq!(s.peer_ord_ird, (1, 1));
        assert_eq!(c.peer_ord_ird, (1, 1));
        let want_c: Vec<String> = (0..5)
            .map(|i| rping::client_line(&rping::ping_data(i, 64)))
            .collect();
        let want_s: Vec<String> = (0..5)
            .map(|i| rping::server_line(&rping::ping_data(i, 64)))
            .collect();
        assert_eq!(cout.lines().collect::<Vec<_>>(), want_c);
        let got_s: Vec<&str> = sout
            .lines()
            .filter(|l| l.starts_with("server ping data: "))
            .collect();
        assert_eq!(got_s, want_s);
        assert!(
            sout.contains("rdma_listen\n") && sout.contains("rdma_accept (IRD 1, ORD 1)"),
            "{sout}"
        );
    }

    #[test]
    fn sixty_four_kib_pings_cross_many_fpdus() {
        let ((s, sout), (c, cout)) = session(2, rping::MAX_SIZE);
        assert_eq!(s.unwrap_or_else(|e| panic!("server: {e}\n{sout}")).pings, 2);
        assert_eq!(c.unwrap_or_else(|e| panic!("client: {e}\n{cout}")).pings, 2);
        assert_eq!(cout.lines().count(), 2);
    }

    #[test]
    fn options_are_checked_as_rping_does() {
        let mut o = PingOptions::default();
        assert!(matches!(o.check(), Err(IwpingError::Options(m)) if m.contains("-a")));
        o.addr = Some(SERVER);
        o.check().unwrap();
        o.size = rping::MIN_SIZE - 1;
        assert!(matches!(o.check(), Err(IwpingError::Options(m)) if m.contains("Invalid size 25")));
        o.size = rping::MAX_SIZE + 1;
        assert!(o.check().is_err());
        o.role = Role::Server;
        o.addr = None;
        o.size = rping::MAX_SIZE;
        o.check().unwrap();
    }

    #[test]
    fn ird_ord_are_clamped_to_the_device() {
        let t5 = verbs::DeviceCaps::CHELSIO_T5;
        assert_eq!(clamp_ird_ord(&t5, (128, 64)), (32, 32));
        assert_eq!(clamp_ird_ord(&t5, (1, 0)), (1, 0));
        let soft = verbs::DeviceCaps {
            max_ord: 0x3fff,
            max_ird: 0x3fff,
            ..t5
        };
        assert_eq!(clamp_ird_ord(&soft, (300, 0x3fff)), (300, 0x3fff));
        let siw = verbs::DeviceCaps {
            max_ord: 128,
            max_ird: 16,
            ..t5
        };
        assert_eq!(clamp_ird_ord(&siw, (200, 200)), (16, 128));
    }

    #[test]
    fn a_connection_on_another_device_than_named_fails_the_run() {
        let (scm, ccm) = pair();
        let server = std::thread::spawn(move || {
            let mut out = Vec::new();
            let o = PingOptions {
                step_timeout: Duration::from_secs(5),
                ..opts(Role::Server, 1, 64)
            };
            run(&SoftCm::new(&scm), &o, &mut out)
        });
        std::thread::sleep(Duration::from_millis(300));
        let o = PingOptions {
            device: Some("siw0".into()),
            ..opts(Role::Client, 1, 64)
        };
        let e = run(&SoftCm::new(&ccm), &o, &mut Vec::new()).unwrap_err();
        assert!(
            matches!(&e, IwpingError::WrongDevice { want, found } if want == "siw0" && found == "cli"),
            "{e}"
        );
        assert_eq!(e.to_string(), "the connection is on device cli, not siw0");
        // The server never gets its connection.
        assert!(server.join().unwrap().is_err());
    }
}
