//! `iwping`: rping (rdma-core's `librdmacm/examples/rping.c`) on the soft iWARP device.
//!
//! Its room: the tool and its engine. It touches softiwarp, rdma-cm, verbs, mpa (the MPA
//! options of the command line) and netlab (link options, signals, logging); nothing
//! depends on it.
//!
//! The engine ([`run`]): rping's client and server ([`crate::rping`]) on softiwarp's
//! public RDMA CM ([`softiwarp::cm::rdmacm::SoftRdmaCm`]) and verbs objects, with rping's options
//! and output. The binary (`src/main.rs`) opens the soft device on a TAP and calls
//! [`run`]; tests call [`run`] on devices over memory links.
//!
//! What the two roles do, call by call (librdmacm's names):
//!
//! - **client**: `rdma_resolve_addr` -> ADDR_RESOLVED, `rdma_resolve_route` ->
//!   ROUTE_RESOLVED, PD/CQ/QP on the id's device (`id->verbs`), four MRs (receive and
//!   send buffers of [`INFO_LEN`] bytes, the source and the sink of `size` bytes, the
//!   latter two with remote read and write access), one receive posted,
//!   `rdma_connect` (responder_resources = initiator_depth = 1, as rping) -> ESTABLISHED;
//!   then the pings ([`crate::rping`]), then `rdma_disconnect` and a wait for
//!   DISCONNECTED (so the FIN is out before the process, and the engine, ends).
//! - **server**: `rdma_bind_addr`, `rdma_listen` (backlog 3) -> CONNECT_REQUEST; PD/CQ/QP,
//!   three MRs (receive, send, the `size`-byte buffer), one receive, `rdma_accept` with the
//!   request's own resources mirrored (what librdmacm's `rdma_accept(id, NULL)` does) ->
//!   ESTABLISHED; then pings until DISCONNECTED, which ends a successful run.
//!
//! Memory regions are registered at I/O virtual addresses of our choosing ([`IOVA_BASE`]),
//! and the address advertised in [`RdmaInfo::buf`] is the MR's iova: the TO the peer puts
//! in its RDMA Read Request or Write is the address it was given, as with any verbs peer.
//!
//! Beyond rping: the server checks the data it read against the ping pattern with `-V`
//! (rping's server checks nothing), and both sides clear the buffer they receive into
//! before each ping, so a Write or Read that did not happen cannot pass a check.

pub mod rping;

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use rdma_cm::{CmError, CmId, CmIdRef, ConnParam, EventChannel, EventKind};
use softiwarp::cm::rdmacm::{SoftDevice, SoftRdmaCm};
use softiwarp::CqError;
use softiwarp::{Cq, Mr, Pd, QpInitAttr};
use verbs::{
    AccessFlags, QpCap, QpState, RecvWr, SendFlags, SendWr, Stag, VerbsError, WcOpcode, WcStatus,
    WorkCompletion,
};

use crate::rping::{BogusMessage, RdmaInfo, INFO_LEN, SQ_DEPTH};

/// The QP handle rdma-cm gives for the soft device.
type SoftQp = rdma_cm::QpOf<SoftDevice>;

/// I/O virtual address of the first MR; the others follow at 1 MiB steps (receive,
/// send, RDMA buffer, client source buffer). A user-space-looking address, so a peer
/// that mixes up TO and offset shows at once.
pub const IOVA_BASE: u64 = 0x0000_7f3a_5c00_0000;

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
    /// `rdma_accept`. `None`: rping's choice (client 1 and 1; server the request's own
    /// values mirrored, as `rdma_accept(id, NULL)`; with an MPA rev 1 peer that is 0 and
    /// 0, so no RDMA Read is allowed).
    pub ird_ord: Option<(u16, u16)>,
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
    /// An rdma_cm call failed.
    #[error("{op}: {source}")]
    Cm {
        /// The call (`rdma_resolve_addr`, ...).
        op: &'static str,
        /// Why.
        #[source]
        source: CmError,
    },
    /// A verbs call failed.
    #[error("{op}: {source}")]
    Verbs {
        /// The call (`ibv_post_send`, ...).
        op: &'static str,
        /// Why.
        #[source]
        source: VerbsError,
    },
    /// Polling the CQ failed (overrun).
    #[error("ibv_poll_cq: {0}")]
    Cq(#[from] CqError),
    /// An event other than the one waited for (rping: `cma event %s, error %d`).
    #[error("cma event {kind}, error {status} (waiting for {waiting_for})")]
    Event {
        /// The event.
        kind: EventKind,
        /// Its status (0 or a negative errno).
        status: i32,
        /// What was expected.
        waiting_for: &'static str,
    },
    /// The id's device is gone (`id->verbs` is NULL).
    #[error("the rdma_cm id has no device")]
    NoDevice,
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
        /// The soft device's Terminate code (`Layer|EType|ErrCode`), if any.
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

fn cm(op: &'static str) -> impl FnOnce(CmError) -> IwpingError {
    move |source| IwpingError::Cm { op, source }
}

fn vb(op: &'static str) -> impl FnOnce(VerbsError) -> IwpingError {
    move |source| IwpingError::Verbs { op, source }
}

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

/// Runs one rping session as `opts` says on `cm` (which must hold the device to use),
/// writing rping's output lines to `out`.
///
/// Errors: see [`IwpingError`]; the run stops at the first one (the connection and every
/// object are released on the way out).
pub fn run(
    cm: &SoftRdmaCm,
    opts: &PingOptions,
    out: &mut dyn Write,
) -> Result<PingSummary, IwpingError> {
    opts.check()?;
    let channel = cm.create_event_channel();
    match opts.role {
        Role::Client => run_client(cm, &channel, opts, out),
        Role::Server => run_server(cm, &channel, opts, out),
    }
}

fn debug(opts: &PingOptions, out: &mut dyn Write, line: std::fmt::Arguments<'_>) {
    if opts.debug {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Waits for the next event on `channel`, which must be `want`; returns its peer
/// ORD/IRD and, for a ConnectRequest, the new id.
fn expect_event(
    channel: &EventChannel<SoftDevice>,
    want: EventKind,
    timeout: Duration,
    waiting_for: &'static str,
) -> Result<(u16, u16, Option<CmId<SoftDevice>>), IwpingError> {
    let deadline = Instant::now() + timeout;
    let mut ev = loop {
        if netlab::signals::interrupted() {
            return Err(IwpingError::Interrupted);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(IwpingError::Timeout(timeout, waiting_for));
        }
        if let Ok(ev) = channel.get_event_timeout(left.min(SIGNAL_CHECK)) {
            break ev;
        }
    };
    if ev.kind != want {
        return Err(IwpingError::Event {
            kind: ev.kind,
            status: ev.status,
            waiting_for,
        });
    }
    let res = (ev.responder_resources, ev.initiator_depth);
    let new_id = ev.take_new_id();
    Ok((res.0, res.1, new_id))
}

/// The verbs objects of one connection.
struct Session {
    cq: Cq,
    qp: SoftQp,
    recv: Mr,
    send: Mr,
    /// Server: where the Read lands and the Write comes from. Client: the sink.
    rdma: Mr,
    /// Client only: the source.
    start: Option<Mr>,
    _pd: Pd,
}

/// What the wait loop found.
enum Step {
    Wc(WorkCompletion),
    Disconnected,
}

impl Session {
    fn new(id: &CmIdRef<SoftDevice>, opts: &PingOptions) -> Result<Session, IwpingError> {
        let dev = id.device().ok_or(IwpingError::NoDevice)?;
        let device = dev.device();
        let pd = device.alloc_pd().map_err(vb("ibv_alloc_pd"))?;
        let cq = device
            .create_cq(2 * SQ_DEPTH as usize)
            .map_err(vb("ibv_create_cq"))?;
        let cap = QpCap {
            max_send_wr: SQ_DEPTH,
            max_recv_wr: 2,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = id
            .create_qp(
                &pd,
                QpInitAttr {
                    send_cq: &cq,
                    recv_cq: &cq,
                    cap,
                    sq_sig_all: false,
                },
            )
            .map_err(cm("rdma_create_qp"))?;
        // librdmacm's rdma_create_qp leaves the QP in INIT (cma_init_conn_qp), so a
        // receive can be posted before connecting, as rping does. Move it there if the
        // CM left it in RESET.
        if qp.state() == QpState::Reset {
            qp.modify_state(QpState::Init)
                .map_err(vb("ibv_modify_qp (INIT)"))?;
        }
        let remote =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let step = 1u64 << 20;
        let recv = pd
            .reg_mr(INFO_LEN as u64, IOVA_BASE, AccessFlags::LOCAL_WRITE)
            .map_err(vb("ibv_reg_mr"))?;
        let send = pd
            .reg_mr(INFO_LEN as u64, IOVA_BASE + step, AccessFlags::empty())
            .map_err(vb("ibv_reg_mr"))?;
        let rdma = pd
            .reg_mr(opts.size as u64, IOVA_BASE + 2 * step, remote)
            .map_err(vb("ibv_reg_mr"))?;
        let start = match opts.role {
            Role::Client => Some(
                pd.reg_mr(opts.size as u64, IOVA_BASE + 3 * step, remote)
                    .map_err(vb("ibv_reg_mr"))?,
            ),
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
        })
    }

    fn post_recv(&self) -> Result<(), IwpingError> {
        self.qp
            .post_recv(RecvWr::new(1, vec![self.recv.sge(0, INFO_LEN as u32)]))
            .map_err(vb("ibv_post_recv"))
    }

    /// Sends the 16-byte send buffer, holding `info`.
    fn send_info(&self, info: &RdmaInfo) -> Result<(), IwpingError> {
        self.send
            .write(0, &info.encode())
            .map_err(vb("send buffer"))?;
        self.qp
            .post_send(
                SendWr::send(2, vec![self.send.sge(0, INFO_LEN as u32)])
                    .with_flags(SendFlags::SIGNALED),
            )
            .map_err(vb("ibv_post_send"))
    }

    /// The next completion (flushed ones skipped, as rping does) or DISCONNECTED.
    fn next(
        &self,
        channel: &EventChannel<SoftDevice>,
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
            if let Some(ev) = channel.try_get_event() {
                debug(opts, out, format_args!("cma_event type {}", ev.kind));
                match ev.kind {
                    EventKind::Disconnected => return Ok(Step::Disconnected),
                    kind => {
                        return Err(IwpingError::Event {
                            kind,
                            status: ev.status,
                            waiting_for,
                        })
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(IwpingError::Timeout(timeout, waiting_for));
            }
            self.cq
                .wait((deadline - now).min(Duration::from_millis(10)));
        }
    }

    /// Waits for a completion of `want`, skipping Send completions (rping counts them
    /// only in its debug output). `Ok(None)`: DISCONNECTED came first.
    fn wait_for(
        &self,
        channel: &EventChannel<SoftDevice>,
        want: WcOpcode,
        waiting_for: &'static str,
        opts: &PingOptions,
        out: &mut dyn Write,
    ) -> Result<Option<WorkCompletion>, IwpingError> {
        loop {
            match self.next(channel, opts.step_timeout, waiting_for, opts, out)? {
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
        channel: &EventChannel<SoftDevice>,
        waiting_for: &'static str,
        opts: &PingOptions,
        out: &mut dyn Write,
    ) -> Result<Option<RdmaInfo>, IwpingError> {
        let Some(wc) = self.wait_for(channel, WcOpcode::Recv, waiting_for, opts, out)? else {
            return Ok(None);
        };
        let mut b = [0u8; INFO_LEN];
        self.recv.read(0, &mut b).map_err(vb("receive buffer"))?;
        let info = RdmaInfo::decode(&b[..(wc.byte_len as usize).min(INFO_LEN)]);
        if wc.byte_len as usize != INFO_LEN {
            return Err(BogusMessage(wc.byte_len as usize).into());
        }
        self.post_recv()?;
        Ok(Some(info?))
    }

    fn info_of(mr: &Mr, size: usize) -> RdmaInfo {
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

fn run_client(
    cm_: &SoftRdmaCm,
    channel: &EventChannel<SoftDevice>,
    opts: &PingOptions,
    out: &mut dyn Write,
) -> Result<PingSummary, IwpingError> {
    let addr = opts
        .addr
        .ok_or_else(|| IwpingError::Options("the client needs -a ADDR".into()))?;
    let dst = SocketAddr::V4(SocketAddrV4::new(addr, opts.port));
    let id = cm_.create_id_with_channel(channel);
    id.resolve_addr(None, dst, Duration::from_millis(2000))
        .map_err(cm("rdma_resolve_addr"))?;
    expect_event(
        channel,
        EventKind::AddrResolved,
        opts.step_timeout,
        "ADDR_RESOLVED",
    )?;
    id.resolve_route(Duration::from_millis(2000))
        .map_err(cm("rdma_resolve_route"))?;
    expect_event(
        channel,
        EventKind::RouteResolved,
        opts.step_timeout,
        "ROUTE_RESOLVED",
    )?;
    debug(
        opts,
        out,
        format_args!("rdma_resolve_addr - rdma_resolve_route successful"),
    );
    let s = Session::new(&id, opts)?;
    s.post_recv()?;
    let (ird, ord) = opts.ird_ord.unwrap_or((1, 1));
    id.connect(&ConnParam {
        private_data: Vec::new(),
        responder_resources: ird,
        initiator_depth: ord,
        retry_count: 7,
        rnr_retry_count: 7,
    })
    .map_err(cm("rdma_connect"))?;
    let (ord, ird, _) = expect_event(
        channel,
        EventKind::Established,
        opts.step_timeout,
        "ESTABLISHED",
    )?;
    debug(
        opts,
        out,
        format_args!("rdma_connect successful (peer ORD {ord}, IRD {ird})"),
    );
    let start = s.start.as_ref().ok_or(IwpingError::NoDevice)?;
    let mut summary = PingSummary {
        pings: 0,
        peer: id.peer_addr(),
        peer_ord_ird: (ord, ird),
        disconnected: false,
    };
    let mut ping = 0u64;
    while opts.count == 0 || ping < opts.count {
        let data = rping::ping_data(ping, opts.size);
        start.write(0, &data).map_err(vb("source buffer"))?;
        s.rdma
            .write(0, &vec![0u8; opts.size])
            .map_err(vb("sink buffer"))?;
        s.send_info(&Session::info_of(start, opts.size))?;
        if s.recv_msg(channel, "the go-ahead after the RDMA Read", opts, out)?
            .is_none()
        {
            return Err(IwpingError::Disconnected(ping));
        }
        s.send_info(&Session::info_of(&s.rdma, opts.size))?;
        if s.recv_msg(channel, "the go-ahead after the RDMA Write", opts, out)?
            .is_none()
        {
            return Err(IwpingError::Disconnected(ping));
        }
        let mut sink = vec![0u8; opts.size];
        s.rdma.read(0, &mut sink).map_err(vb("sink buffer"))?;
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
    id.disconnect().map_err(cm("rdma_disconnect"))?;
    // Wait for the close, so the FIN leaves before the device does; Send completions
    // and flushes may come first.
    loop {
        match s.next(channel, opts.step_timeout, "DISCONNECTED", opts, out)? {
            Step::Disconnected => break,
            Step::Wc(_) => continue,
        }
    }
    summary.disconnected = true;
    drop(s);
    id.destroy().map_err(|e| IwpingError::Cm {
        op: "rdma_destroy_id",
        source: e.error,
    })?;
    Ok(summary)
}

fn run_server(
    cm_: &SoftRdmaCm,
    channel: &EventChannel<SoftDevice>,
    opts: &PingOptions,
    out: &mut dyn Write,
) -> Result<PingSummary, IwpingError> {
    let listener = cm_.create_id_with_channel(channel);
    let bind = SocketAddrV4::new(opts.addr.unwrap_or(Ipv4Addr::UNSPECIFIED), opts.port);
    listener
        .bind_addr(SocketAddr::V4(bind))
        .map_err(cm("rdma_bind_addr"))?;
    debug(opts, out, format_args!("rdma_bind_addr successful"));
    listener.listen(3).map_err(cm("rdma_listen"))?;
    debug(opts, out, format_args!("rdma_listen"));
    let (ord, ird, child) = expect_event(
        channel,
        EventKind::ConnectRequest,
        opts.step_timeout,
        "CONNECT_REQUEST",
    )?;
    let child = child.ok_or(IwpingError::NoDevice)?;
    debug(
        opts,
        out,
        format_args!("child cma {} (peer ORD {ord}, IRD {ird})", child.serial()),
    );
    let s = Session::new(&child, opts)?;
    s.post_recv()?;
    // rdma_accept(id, NULL): our IRD = the peer's ORD, our ORD = the peer's IRD.
    let (our_ird, our_ord) = opts.ird_ord.unwrap_or((ord, ird));
    debug(
        opts,
        out,
        format_args!("rdma_accept (IRD {our_ird}, ORD {our_ord})"),
    );
    child
        .accept(&ConnParam {
            private_data: Vec::new(),
            responder_resources: our_ird,
            initiator_depth: our_ord,
            retry_count: 7,
            rnr_retry_count: 7,
        })
        .map_err(cm("rdma_accept"))?;
    expect_event(
        channel,
        EventKind::Established,
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
        let Some(source) = s.recv_msg(channel, "the client's source buffer", opts, out)? else {
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
        s.rdma
            .write(0, &vec![0u8; opts.size])
            .map_err(vb("RDMA buffer"))?;
        s.qp.post_send(
            SendWr::rdma_read(
                3,
                vec![s.rdma.sge(0, source.size)],
                source.buf,
                Stag::from_raw(source.rkey),
            )
            .with_flags(SendFlags::SIGNALED),
        )
        .map_err(vb("ibv_post_send (RDMA Read)"))?;
        if s.wait_for(channel, WcOpcode::RdmaRead, "the RDMA Read", opts, out)?
            .is_none()
        {
            return Err(IwpingError::Disconnected(ping));
        }
        let mut data = vec![0u8; source.size as usize];
        s.rdma.read(0, &mut data).map_err(vb("RDMA buffer"))?;
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
        let Some(sink) = s.recv_msg(channel, "the client's sink buffer", opts, out)? else {
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
                vec![s.rdma.sge(0, len as u32)],
                sink.buf,
                Stag::from_raw(sink.rkey),
            )
            .with_flags(SendFlags::SIGNALED),
        )
        .map_err(vb("ibv_post_send (RDMA Write)"))?;
        if s.wait_for(channel, WcOpcode::RdmaWrite, "the RDMA Write", opts, out)?
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
                match s.next(channel, opts.step_timeout, "DISCONNECTED", opts, out)? {
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
    let _ = child.destroy();
    let _ = listener.destroy();
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_cm::RdmaCmConfig;
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
            let r = run(&scm, &opts(Role::Server, count, size), &mut out);
            (r, String::from_utf8_lossy(&out).into_owned())
        });
        // The listener is up within milliseconds; a client that came too early would
        // be refused, so give it a moment.
        std::thread::sleep(Duration::from_millis(300));
        let mut out = Vec::new();
        let c = run(&ccm, &opts(Role::Client, count, size), &mut out);
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
}
