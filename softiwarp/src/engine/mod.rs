//! The engine thread: one per device, owning the device's [`Stack`] and [`Link`] the way a
//! NIC owns its firmware state.
//!
//! **Room.** The device's engine thread and what crosses into it: the engine loop, the
//! commands other threads send it, the [`Handle`] every device object holds (with
//! [`DeviceError`] and [`COMMAND_TIMEOUT`]), and the device's events ([`DeviceEvent`]).
//! It drives `transport`'s stack, `rdmap`'s QPs and `resources`' queues over a `link`;
//! it never names the API objects above it (a QP's hold on its PD and CQs is an opaque
//! guard here).
//!
//! Other threads never touch the stack. They talk to the engine through
//!
//! - a **command queue** (`std::sync::mpsc`, unbounded, so a sender never blocks) for
//!   listen, connect, accept, reject, close and shutdown, each with a one-shot reply
//!   channel where a result is expected, and for the verbs work of the QPs: create,
//!   modify, destroy, bind to a connection;
//! - each QP's **work queues** (posted WRs, already validated on the caller's thread)
//!   and the device's **doorbell** list of QPs with new WRs: the engine takes a QP's
//!   WRs at every doorbell pass and before every ULPDU it receives for the QP;
//! - the **stream queues** of each connection ([`crate::transport::stream`]), shared under a mutex,
//!   for ULPDUs in both directions;
//! - one **wake-up eventfd** (`eventfd(2)` through nix, non-blocking): anyone who queues a
//!   command, rings a doorbell, queues a ULPDU into an empty send queue, or frees receive
//!   room the engine waits for writes 1 to it.
//!
//! The loop: run every queued command, [`Stack::poll`] with the time since the device
//! started (one clock read per pass), route the stack's events, wake the receivers
//! waiting for ULPDUs queued in batches ([`StreamEnd::flush_wakeups`]), then decide how
//! to wait (the eventfd is reset right after each sleep, before the queues are looked
//! at, so a later wake-up is never lost; a wake-up written while the engine is awake
//! keeps it readable and the next sleep returns at once: no system call per pass):
//!
//! - after a pass that did something, loop at once;
//! - for [`EngineConfig::spin`] after the last activity, keep polling without sleeping
//!   (busy polling was 21% faster than blocking at MTU 1500, transport-notes.md),
//!   yielding the core between passes to an application thread that shares it;
//! - then sleep in `poll(2)` on the link's poll fd and the eventfd, with the timeout the
//!   stack's deadline gives (rounded up to whole milliseconds), or forever when nothing is
//!   timed. An idle device therefore costs nothing but its timers (TCP keep-alive).
//!   When the stack asks to be polled "now" but the last pass did nothing (smoltcp can ask
//!   for that while it cannot send), the engine sleeps at least 1 ms.
//!
//! Events leave the engine through queues only: [`ConnEvent`]s go to each connection's
//! [`StreamEnd`], connection requests to their listener's queue, device events
//! ([`DeviceEvent`]) to the device's queue. No user code ever runs on the engine thread,
//! and the engine never waits for a user: every lock it takes is held only by short
//! critical sections that never block.
//!
//! QPs: the engine keeps every QP's protocol state (`rdmap::binding::QpCore`) in its
//! table; a QP bound to a connection is also that connection's upper layer inside the
//! stack, so the stack's poll drives its transmit and receive paths. Verbs asynchronous
//! events go to the device's queue. When the engine stops (shutdown or link gone) every
//! QP goes to Error (its WRs flushed): first a gate closes so that no further QP work
//! is accepted (posters hold it while they queue), then every QP's work queues are
//! taken one last time (those WRs complete flushed), so no WR a post call accepted is
//! lost; modify calls still queued are answered `DeviceGone`.
//!
//! Link failure: `LinkEvent::Down` / `Up` become [`DeviceEvent::LinkDown`] /
//! [`DeviceEvent::LinkUp`] (connections stay; TCP retransmits and its user timeout
//! decides). `LinkEvent::Gone` fails every connection with
//! [`ConnError::DeviceGone`](crate::transport::ConnError::DeviceGone), ends every listener,
//! reports [`DeviceEvent::DeviceGone`] and ends the engine thread.
//!
//! Tracing: an `info`-level span per device (`device{name}`), a `debug`-level span per
//! connection inside the stack; state changes at `debug`, nothing per FPDU above `trace`.

pub(crate) mod event_signal;
mod handle;
pub mod progress;

pub use handle::{DeviceError, COMMAND_TIMEOUT};
pub(crate) use handle::{Handle, POLL_BUDGET, POST_BUDGET};

use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant as StdInstant};

use mpa::negotiate::LocalSettings;
use nix::poll::{ppoll, PollFd, PollFlags};
use std::os::fd::AsFd;

use nix::sys::eventfd::EventFd;
use progress::{Budget, Drive, Drove, EngineView, Outbox, Owner, Pass, Progress};
use smoltcp::time::Instant;

use verbs::{check_transition, AsyncEvent, ObjectKind, QpAttr, QpState, VerbsError};

use crate::link::{DownReason, GoneReason, LinkEvent};
use crate::rdmap::binding::{self, CoreRef, QpUlp};
use crate::resources::event_queue::{DeviceEnd, EventQueue};
use crate::transport::llp::LlpStack;
use crate::transport::stream::{self, StreamConfig, StreamEnd, Waker};
use crate::transport::{
    CloseMode, ConnEvent, ConnId, ConnectRequestInfo, ListenerId, MpaParams, StackError, StackEvent,
};

/// Settings of the engine loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// How long to keep polling without sleeping after the last activity. Default 50 us;
    /// zero sleeps as soon as a pass does nothing.
    pub spin: Duration,
    /// Queue bounds of each stream connection.
    pub stream: StreamConfig,
    /// Who drives the device: the engine thread alone (the default), or application
    /// threads too, inside their verbs calls.
    pub progress: ProgressMode,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            spin: Duration::from_micros(50),
            stream: StreamConfig::default(),
            progress: ProgressMode::from_env(),
        }
    }
}

/// Who drives a device's protocol state (shared/progress-design.md, design.md section 5
/// "Progress"). Both modes use the same progress lock; they differ in whether verbs
/// calls take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressMode {
    /// Only the engine thread drives; a post rings its wake-up (an eventfd write) and a
    /// CQ waiter sleeps until the engine pushes a completion (the device's first model,
    /// kept for comparison).
    Engine,
    /// Application threads drive too, inside verbs calls, as Linux siw transmits in the
    /// caller's context: `post_send` runs one budgeted pass (one pass of the stack, at
    /// most 16 rounds of every connection; `post_recv` only queues, as siw's),
    /// `poll_cq` on an empty CQ runs one, and a blocking CQ wait drives for
    /// [`EngineConfig::spin`] before it becomes the link's poller. The engine
    /// thread keeps the link, timers, commands and passive targets whenever no
    /// application thread drives. The default: the 8-byte ping-pong halves and bulk
    /// stays level (docs/ARCHITECTURE.md, "Threads").
    #[default]
    Hybrid,
}

impl ProgressMode {
    /// The mode named by the `SOFTIWARP_PROGRESS` environment variable (`engine` or
    /// `hybrid`, case-insensitive), the default ([`ProgressMode::Hybrid`]) when unset or
    /// unknown (an unknown name is logged): how a whole test suite or an unmodified
    /// program is run in either mode.
    pub fn from_env() -> ProgressMode {
        match std::env::var("SOFTIWARP_PROGRESS") {
            Ok(v) if v.eq_ignore_ascii_case("engine") => ProgressMode::Engine,
            Ok(v) if v.eq_ignore_ascii_case("hybrid") || v.is_empty() => ProgressMode::Hybrid,
            Ok(v) => {
                tracing::warn!(value = %v, "SOFTIWARP_PROGRESS: unknown mode (engine|hybrid); using hybrid");
                ProgressMode::Hybrid
            }
            Err(_) => ProgressMode::default(),
        }
    }
}

/// A device-level event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEvent {
    /// The link is up (again).
    LinkUp,
    /// The link went down; connections stay, TCP retransmits (its user timeout aborts
    /// them if the link stays down).
    LinkDown(DownReason),
    /// The link is gone: every connection failed, every listener ended, the engine
    /// stopped. Terminal (rdma_cm `DEVICE_REMOVAL` is built on it).
    DeviceGone(GoneReason),
}

/// A connection request waiting in a listener's queue.
#[derive(Debug)]
pub(crate) struct PendingRequest {
    pub(crate) info: ConnectRequestInfo,
    pub(crate) end: StreamEnd,
}

/// A command to the engine.
pub(crate) enum Command {
    Listen {
        port: u16,
        backlog: usize,
        settings: Option<LocalSettings>,
        queue: Arc<EventQueue<PendingRequest>>,
        reply: Sender<Result<ListenerId, StackError>>,
    },
    Unlisten {
        id: ListenerId,
    },
    Connect {
        remote: SocketAddrV4,
        params: MpaParams,
        end: StreamEnd,
        reply: Sender<Result<ConnId, StackError>>,
    },
    Accept {
        conn: ConnId,
        private_data: Vec<u8>,
        ird: u16,
        ord: u16,
        reply: Sender<Result<(), StackError>>,
    },
    Reject {
        conn: ConnId,
        private_data: Vec<u8>,
        reply: Option<Sender<Result<(), StackError>>>,
    },
    Close {
        conn: ConnId,
        mode: CloseMode,
        reply: Option<Sender<Result<(), StackError>>>,
    },
    Shutdown,
    /// A new QP (in Reset) joins the engine's table.
    CreateQp {
        core: CoreRef,
    },
    ModifyQp {
        qpn: u32,
        attr: QpAttr,
        reply: Sender<Result<(), VerbsError>>,
    },
    /// To Error (flush), close the connection, leave the table.
    DestroyQp {
        qpn: u32,
        reply: Option<Sender<()>>,
    },
    ConnectQp {
        remote: SocketAddrV4,
        params: MpaParams,
        end: StreamEnd,
        qpn: u32,
        reply: Sender<Result<ConnId, DeviceError>>,
    },
    AcceptQp {
        conn: ConnId,
        private_data: Vec<u8>,
        ird: u16,
        ord: u16,
        qpn: u32,
        reply: Sender<Result<(), DeviceError>>,
    },
    /// Resolve a neighbour by ARP (`Stack::resolve_neighbor`).
    ResolveNeighbor {
        ip: std::net::Ipv4Addr,
        timeout: Duration,
        reply: crate::transport::neighbor::NeighborReply,
    },
}

/// What the engine shares with the device handle.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) events: EventQueue<DeviceEvent>,
    pub(crate) ended: Mutex<Option<DeviceEnd>>,
    /// Verbs asynchronous events (`ibv_get_async_event(3)`).
    pub(crate) async_events: Arc<EventQueue<AsyncEvent>>,
    /// True once the engine took its last command: QP work is refused from then on
    /// (posters hold it for reading while they enqueue, so nothing enqueued is lost).
    pub(crate) gate: progress::Gate,
    /// A QP asks the engine to poll the stack again at once.
    pub(crate) kick: Arc<AtomicBool>,
    /// QPs with newly posted WRs (rung by the post calls).
    pub(crate) doorbell: Mutex<Vec<u32>>,
    /// Raised after the engine queued connection, listener or device events (the iw-cm
    /// provider's thread sleeps on it, [`crate::cm::iwcm`]).
    pub(crate) activity: crate::engine::event_signal::EventSignal,
    /// The stack's connection count after the engine's last pass (`Device::connection_count`).
    pub(crate) connections: std::sync::atomic::AtomicUsize,
    /// The stack's next deadline after the last pass, in microseconds since the device
    /// started (`u64::MAX`: none): the engine thread's sleep timeout.
    pub(crate) deadline_us: std::sync::atomic::AtomicU64,
}

impl Shared {
    pub(crate) fn new() -> Self {
        Shared {
            events: EventQueue::new(),
            ended: Mutex::new(None),
            async_events: Arc::new(EventQueue::new()),
            gate: progress::Gate::new(),
            kick: Arc::new(AtomicBool::new(false)),
            doorbell: Mutex::new(Vec::new()),
            activity: crate::engine::event_signal::EventSignal::default(),
            connections: std::sync::atomic::AtomicUsize::new(0),
            deadline_us: std::sync::atomic::AtomicU64::new(u64::MAX),
        }
    }

    pub(crate) fn ended(&self) -> Option<DeviceEnd> {
        *self.ended.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the end (before the last event is queued, so whoever sees the event sees
    /// the state too).
    fn set_ended(&self, end: DeviceEnd) {
        self.ended
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(end);
    }
}

/// The engine: the stack, the command queue, the wake-up fd and the routing tables.
pub(crate) struct Engine {
    pub(crate) stack: Box<dyn LlpStack>,
    pub(crate) cmds: Receiver<Command>,
    pub(crate) wake: Arc<EventFd>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) cfg: EngineConfig,
    pub(crate) start: StdInstant,
    /// The `device{name}` span, entered by every pass whichever thread runs it.
    span: tracing::Span,
    conns: HashMap<ConnId, StreamEnd>,
    listeners: HashMap<ListenerId, Arc<EventQueue<PendingRequest>>>,
    /// Every QP of the device, by QP number.
    qps: HashMap<u32, CoreRef>,
    /// Raised by a QP that went to Error by itself while bound (`QpCore::orphaned`).
    qp_errored: Arc<AtomicBool>,
}

/// Microseconds since `start`, as a smoltcp instant.
fn elapsed(start: StdInstant) -> Instant {
    Instant::from_micros(i64::try_from(start.elapsed().as_micros()).unwrap_or(i64::MAX))
}

impl Engine {
    pub(crate) fn new(
        stack: Box<dyn LlpStack>,
        cmds: Receiver<Command>,
        wake: Arc<EventFd>,
        shared: Arc<Shared>,
        cfg: EngineConfig,
        start: StdInstant,
        name: String,
    ) -> Self {
        let mut stack = stack;
        // Link events (notifications, fd errors) need no system call on every pass.
        stack.set_link_check_interval(1000);
        Engine {
            stack,
            cmds,
            wake,
            shared,
            cfg,
            start,
            span: tracing::info_span!("device", name = %name),
            conns: HashMap::new(),
            listeners: HashMap::new(),
            qps: HashMap::new(),
            qp_errored: Arc::new(AtomicBool::new(false)),
        }
    }

    fn waker(&self) -> Waker {
        Waker::engine(self.wake.clone())
    }

    /// One pass (the body of the old engine loop, now run by whoever holds the device's
    /// progress lock): every queued command, the rung doorbells, [`Stack::poll`] with
    /// the time since the device started (one clock read per pass), the stack's events
    /// routed, QPs that went to Error by themselves aborted, receivers of ULPDUs queued
    /// in batches woken. Ends the device on shutdown (or when every handle is gone) and
    /// when the link is gone; then it writes the wake-up so a sleeping engine thread
    /// notices.
    fn pass_once(&mut self, rounds: u32) -> Pass {
        let span = self.span.clone();
        let _entered = span.enter();
        let mut active = false;
        loop {
            match self.cmds.try_recv() {
                Ok(Command::Shutdown) | Err(TryRecvError::Disconnected) => {
                    self.shutdown();
                    let _ = self.wake.write(1);
                    return Pass {
                        active: true,
                        more: false,
                        ended: true,
                    };
                }
                Ok(cmd) => {
                    active = true;
                    self.handle(cmd);
                }
                Err(TryRecvError::Empty) => break,
            }
        }
        active |= self.doorbells();
        // One clock read per pass.
        let t = StdInstant::now();
        let now = Instant::from_micros(
            i64::try_from(t.duration_since(self.start).as_micros()).unwrap_or(i64::MAX),
        );
        let deadline = self
            .stack
            .poll_rounds(now, usize::try_from(rounds).unwrap_or(usize::MAX));
        self.shared.deadline_us.store(
            deadline.map_or(u64::MAX, |d| u64::try_from(d.total_micros()).unwrap_or(0)),
            Ordering::Release,
        );
        active |= self.stack.progressed();
        active |= self.shared.kick.swap(false, Ordering::AcqRel);
        if let Some(reason) = self.stack.gone() {
            // Recorded before the connections' failures are routed, so that whoever
            // drains one of them sees the end already (the iw-cm provider then runs
            // its end hook, rdma-cm's device removal, before reporting them).
            self.shared.set_ended(DeviceEnd::Gone(reason));
        }
        self.route();
        if self.qp_errored.swap(false, Ordering::AcqRel) {
            active |= self.abort_orphaned();
        }
        if let Some(reason) = self.stack.gone() {
            self.gone(reason);
            let _ = self.wake.write(1);
            return Pass {
                active: true,
                more: false,
                ended: true,
            };
        }
        // Receivers waiting for ULPDUs queued in this pass are woken in batches:
        // half the receive queue, `RX_WAKE_DELAY`, or before the engine sleeps.
        for end in self.conns.values() {
            end.flush_wakeups(false, t);
        }
        Pass {
            active,
            more: false,
            ended: false,
        }
    }

    /// Before the engine thread sleeps: wake every receiver with ULPDUs queued.
    fn before_sleep(&mut self) {
        let t = StdInstant::now();
        for end in self.conns.values() {
            end.flush_wakeups(true, t);
        }
    }

    fn handle(&mut self, cmd: Command) {
        let now = elapsed(self.start);
        match cmd {
            Command::Listen {
                port,
                backlog,
                settings,
                queue,
                reply,
            } => {
                let r = self.stack.listen(port, backlog, settings);
                if let Ok(id) = r {
                    self.listeners.insert(id, queue);
                }
                let _ = reply.send(r);
            }
            Command::Unlisten { id } => {
                if let Some(q) = self.listeners.remove(&id) {
                    q.end(DeviceEnd::Closed);
                    // Requests nobody took are rejected (taken ones are answered by their
                    // handles, or rejected when those are dropped).
                    for p in q.drain() {
                        let _ = self.stack.reject(p.info.conn, &[]);
                        self.conns.remove(&p.info.conn);
                    }
                }
                let _ = self.stack.unlisten(id);
            }
            Command::Connect {
                remote,
                params,
                end,
                reply,
            } => {
                let r = self.stack.connect(remote, params, Box::new(end.ulp()), now);
                if let Ok(id) = r {
                    self.conns.insert(id, end);
                }
                let _ = reply.send(r);
            }
            Command::Accept {
                conn,
                private_data,
                ird,
                ord,
                reply,
            } => {
                let r = match self.conns.get(&conn) {
                    Some(end) => {
                        let ulp = end.ulp();
                        self.stack
                            .accept(conn, &private_data, ird, ord, Box::new(ulp))
                    }
                    None => Err(StackError::NoSuchConnection(conn)),
                };
                let _ = reply.send(r);
            }
            Command::Reject {
                conn,
                private_data,
                reply,
            } => {
                let r = self.stack.reject(conn, &private_data);
                if r.is_ok() {
                    if let Some(end) = self.conns.remove(&conn) {
                        end.deliver_event(ConnEvent::Closed);
                    }
                }
                if let Some(reply) = reply {
                    let _ = reply.send(r);
                }
            }
            Command::Close { conn, mode, reply } => {
                let r = self.stack.close(conn, mode);
                if let Some(reply) = reply {
                    let _ = reply.send(r);
                }
            }
            Command::Shutdown => {}
            Command::CreateQp { core } => {
                let qpn = {
                    let mut c = binding::lock(&core);
                    c.errored = Some(Arc::clone(&self.qp_errored));
                    c.qp.qp_num()
                };
                self.qps.insert(qpn, core);
            }
            Command::ModifyQp { qpn, attr, reply } => {
                let _ = reply.send(self.modify_qp(qpn, &attr));
            }
            Command::DestroyQp { qpn, reply } => {
                self.destroy_qp(qpn);
                if let Some(reply) = reply {
                    let _ = reply.send(());
                }
            }
            Command::ConnectQp {
                remote,
                params,
                end,
                qpn,
                reply,
            } => {
                let _ = reply.send(self.connect_qp(remote, params, end, qpn, now));
            }
            Command::AcceptQp {
                conn,
                private_data,
                ird,
                ord,
                qpn,
                reply,
            } => {
                let _ = reply.send(self.accept_qp(conn, &private_data, ird, ord, qpn));
            }
            Command::ResolveNeighbor { ip, timeout, reply } => {
                let us = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
                self.stack.resolve_neighbor(ip, us, now, reply);
            }
        }
    }

    // ---- QP work ----------------------------------------------------------------

    /// Takes the WRs posted on the QPs whose doorbell rang.
    fn doorbells(&mut self) -> bool {
        let rung = std::mem::take(
            &mut *self
                .shared
                .doorbell
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for qpn in &rung {
            if let Some(core) = self.qps.get(qpn) {
                let mut c = binding::lock(core);
                c.take_posted();
                c.after();
            }
        }
        !rung.is_empty()
    }

    /// `ibv_modify_qp(3)`: every check first, then the changes (access, ORD/IRD,
    /// state). Entering Error or Reset while connected closes the connection
    /// (abortive: the QP has nothing more to say on it). RTS is refused to a QP not
    /// bound to a connection.
    fn modify_qp(&mut self, qpn: u32, attr: &QpAttr) -> Result<(), VerbsError> {
        let core = self
            .qps
            .get(&qpn)
            .cloned()
            .ok_or(VerbsError::InvalidHandle {
                object: ObjectKind::Qp,
                handle: qpn,
            })?;
        let close = {
            let mut c = binding::lock(&core);
            let span = c.span.clone();
            let _e = span.enter();
            // WRs posted before this call are the QP's before it changes.
            c.take_posted_now();
            let state = c.qp.state();
            if attr.cur_qp_state.is_some_and(|cur| cur != state) {
                return Err(VerbsError::InvalidArgument {
                    what: "cur_qp_state",
                });
            }
            if attr.cap.is_some() {
                return Err(VerbsError::Unsupported {
                    what: "resizing a QP",
                });
            }
            if let Some(to) = attr.qp_state {
                check_transition(state, to)?;
                // As kernel siw: RTS needs the LLP connection (a QP enters it through
                // `connect_qp` / `accept_qp`); an unbound QP never would send anything.
                if to == QpState::Rts && c.conn.is_none() {
                    return Err(VerbsError::InvalidQpState {
                        op: "modify_qp to RTS without a connection",
                        state,
                    });
                }
            }
            let ord_ird = attr.max_rd_atomic.is_some() || attr.max_dest_rd_atomic.is_some();
            if ord_ird && !matches!(state, QpState::Reset | QpState::Init) {
                return Err(VerbsError::InvalidQpState {
                    op: "modify_qp (ORD/IRD)",
                    state,
                });
            }
            if let Some(access) = attr.qp_access_flags {
                c.qp.set_access(access);
            }
            if ord_ird {
                let init = *c.qp.init();
                let ord = attr.max_rd_atomic.map_or(init.ord, u32::from);
                let ird = attr.max_dest_rd_atomic.map_or(init.ird, u32::from);
                c.qp.set_ord_ird(ord, ird)?;
            }
            if let Some(to) = attr.qp_state {
                c.qp.modify_state(to)?;
                tracing::debug!(from = %state, %to, "modify_qp");
            }
            let close = if matches!(c.qp.state(), QpState::Error | QpState::Reset) {
                c.unbind()
            } else {
                None
            };
            c.after();
            close
        };
        if let Some(conn) = close {
            let _ = self.stack.close(conn, CloseMode::Abortive);
        }
        Ok(())
    }

    /// Flushes and removes the QP, closes its connection, then releases its uses of
    /// its PD and CQs (so `Cq::destroy` / `Pd::dealloc` succeed only after every
    /// flushed completion is in place).
    fn destroy_qp(&mut self, qpn: u32) {
        let Some(core) = self.qps.remove(&qpn) else {
            return;
        };
        let (close, uses) = {
            let mut c = binding::lock(&core);
            let span = c.span.clone();
            let _e = span.enter();
            tracing::debug!("destroy_qp");
            c.take_posted_now();
            c.in_destroy = true;
            c.enter_error();
            let close = c.unbind();
            c.after();
            (close, c.uses.take())
        };
        if let Some(conn) = close {
            let _ = self.stack.close(conn, CloseMode::Abortive);
        }
        drop(uses);
    }

    /// Aborts the connection of every QP that went to Error by itself while bound
    /// (a QP in Error never keeps a live connection). Returns whether one was found.
    fn abort_orphaned(&mut self) -> bool {
        let mut close = Vec::new();
        for core in self.qps.values() {
            let mut c = binding::lock(core);
            if c.orphaned() {
                let span = c.span.clone();
                let _e = span.enter();
                tracing::debug!("QP in Error: aborting its connection");
                close.extend(c.unbind());
                c.after();
            }
        }
        let found = !close.is_empty();
        for conn in close {
            let _ = self.stack.close(conn, CloseMode::Abortive);
        }
        found
    }

    /// Checks that QP `qpn` may be bound to a new connection (in Reset or Init, not
    /// bound), moves it to Init and returns it with the new binding's generation.
    fn bindable(&mut self, qpn: u32) -> Result<(CoreRef, u64), DeviceError> {
        let core =
            self.qps
                .get(&qpn)
                .cloned()
                .ok_or(DeviceError::Verbs(VerbsError::InvalidHandle {
                    object: ObjectKind::Qp,
                    handle: qpn,
                }))?;
        let generation = {
            let mut c = binding::lock(&core);
            c.take_posted_now();
            if c.conn.is_some() {
                return Err(DeviceError::Verbs(VerbsError::InUse {
                    object: ObjectKind::Qp,
                }));
            }
            match c.qp.state() {
                QpState::Reset => c.qp.modify_state(QpState::Init)?,
                QpState::Init => {}
                state => {
                    return Err(DeviceError::Verbs(VerbsError::InvalidQpState {
                        op: "connect/accept",
                        state,
                    }))
                }
            }
            c.generation += 1;
            c.after();
            c.generation
        };
        Ok((core, generation))
    }

    fn connect_qp(
        &mut self,
        remote: SocketAddrV4,
        params: MpaParams,
        end: StreamEnd,
        qpn: u32,
        now: Instant,
    ) -> Result<ConnId, DeviceError> {
        let (core, generation) = self.bindable(qpn)?;
        let ulp = QpUlp::new(Arc::clone(&core), generation);
        let id = self.stack.connect(remote, params, Box::new(ulp), now)?;
        {
            let mut c = binding::lock(&core);
            c.conn = Some(id);
            c.after();
        }
        self.conns.insert(id, end);
        Ok(id)
    }

    fn accept_qp(
        &mut self,
        conn: ConnId,
        private_data: &[u8],
        ird: u16,
        ord: u16,
        qpn: u32,
    ) -> Result<(), DeviceError> {
        if !self.conns.contains_key(&conn) {
            return Err(StackError::NoSuchConnection(conn).into());
        }
        let (core, generation) = self.bindable(qpn)?;
        // Bound before the accept: the stack reports Established (or a failure)
        // from inside it.
        binding::lock(&core).conn = Some(conn);
        let ulp = QpUlp::new(Arc::clone(&core), generation);
        match self
            .stack
            .accept(conn, private_data, ird, ord, Box::new(ulp))
        {
            Ok(()) => Ok(()),
            Err(e) => {
                let mut c = binding::lock(&core);
                if c.generation == generation {
                    c.unbind();
                    c.after();
                }
                Err(e.into())
            }
        }
    }

    /// The engine stops: every QP goes to Error (flushing), then the gate closes and
    /// the commands still queued are run (posts complete flushed; modify calls fail
    /// with `DeviceGone`), so no WR accepted by a post call is lost; last, the WRs left
    /// in the SRQs of the QPs are flushed (SRQ posts hold the gate too).
    fn end_qps(&mut self) {
        // Close the gate first: after it no WR can be posted, so taking the queues
        // once more gets every WR a post call accepted.
        self.shared.gate.close();
        for core in self.qps.values() {
            let mut c = binding::lock(core);
            c.unbind();
            c.take_posted_now();
            c.enter_error();
            c.after();
        }
        while let Ok(cmd) = self.cmds.try_recv() {
            match cmd {
                Command::CreateQp { core } => {
                    let qpn = {
                        let mut c = binding::lock(&core);
                        c.take_posted_now();
                        c.enter_error();
                        c.after();
                        c.qp.qp_num()
                    };
                    self.qps.insert(qpn, core);
                }
                Command::ModifyQp { reply, .. } => {
                    let _ = reply.send(Err(VerbsError::DeviceGone));
                }
                Command::DestroyQp { qpn, reply } => {
                    if let Some(core) = self.qps.remove(&qpn) {
                        // Flushed above: its uses of the PD and CQs end here.
                        drop(binding::lock(&core).uses.take());
                    }
                    if let Some(reply) = reply {
                        let _ = reply.send(());
                    }
                }
                // Every other reply channel is dropped: the caller sees the end.
                _ => {}
            }
        }
        // The WRs still in an SRQ complete flushed on the receive CQ of its attached QP
        // with the lowest number (the first to take the SRQ's WRs drains it; an SRQ has
        // no CQ of its own). An SRQ no QP uses keeps them: its destroy discards them.
        let mut qpns: Vec<u32> = self.qps.keys().copied().collect();
        qpns.sort_unstable();
        for qpn in qpns {
            if let Some(core) = self.qps.get(&qpn) {
                let mut c = binding::lock(core);
                let n = c.qp.flush_srq();
                if n > 0 {
                    tracing::debug!(qpn, n, "SRQ flushed at the device's end");
                }
                c.after();
            }
        }
    }

    /// Hands the stack's events to their queues.
    fn route(&mut self) {
        let mut routed = false;
        while let Some(ev) = self.stack.poll_event() {
            routed = true;
            match ev {
                StackEvent::ConnectRequest(info) => match self.listeners.get(&info.listener) {
                    Some(q) => {
                        let (_, end) = stream::pair(self.cfg.stream, self.waker());
                        self.conns.insert(info.conn, end.clone());
                        q.push(PendingRequest { info, end });
                    }
                    None => {
                        let _ = self.stack.reject(info.conn, &[]);
                    }
                },
                StackEvent::Conn { conn, event } => {
                    let last = event.is_final();
                    if let Some(end) = self.conns.get(&conn) {
                        end.deliver_event(event);
                    }
                    if last {
                        self.conns.remove(&conn);
                    }
                }
                StackEvent::Link(LinkEvent::Up) => self.shared.events.push(DeviceEvent::LinkUp),
                StackEvent::Link(LinkEvent::Down(r)) => {
                    self.shared.events.push(DeviceEvent::LinkDown(r));
                }
                StackEvent::Link(LinkEvent::Gone(_)) => {}
            }
        }
        self.shared
            .connections
            .store(self.stack.connection_count(), Ordering::Relaxed);
        if routed {
            self.shared.activity.notify();
        }
    }

    fn end_everything(&mut self, end: DeviceEnd) {
        self.shared.set_ended(end);
        self.end_qps();
        for (_, q) in self.listeners.drain() {
            q.end(end);
        }
        self.conns.clear();
        if let DeviceEnd::Gone(reason) = end {
            self.shared.async_events.push(AsyncEvent::DeviceFatal);
            self.shared.events.push(DeviceEvent::DeviceGone(reason));
        }
        self.shared.async_events.end(end);
        self.shared.events.end(end);
        self.shared.activity.notify();
    }

    fn gone(&mut self, reason: GoneReason) {
        tracing::info!(?reason, "device gone");
        self.route();
        self.end_everything(DeviceEnd::Gone(reason));
    }

    fn shutdown(&mut self) {
        tracing::debug!("engine shutting down");
        let now = elapsed(self.start);
        self.stack.shutdown(now);
        self.route();
        self.end_everything(DeviceEnd::Closed);
    }
}

/// Deferred actions of a device pass: the executor wakers and neighbour closures queued
/// with [`progress::defer_wake`] / [`progress::defer_call`] while the pass ran. They run
/// once the progress lock is released.
#[derive(Default)]
pub(crate) struct DeviceOutbox;

impl Outbox for DeviceOutbox {
    fn run(&mut self) {
        progress::run_deferred();
    }
}

impl Drive for Engine {
    type Outbox = DeviceOutbox;
    fn pass(&mut self, rounds: u32, _out: &mut DeviceOutbox) -> Pass {
        self.pass_once(rounds)
    }
}

/// The progress lock of a device over any link.
pub(crate) type DeviceProgress = Progress<Engine>;

/// One engine pass's budget: a single pass (the loop repeats while there is work).
const ENGINE_BUDGET: Budget = Budget {
    passes: 1,
    rounds: u32::MAX,
};

/// How long the engine thread sleeps on its wake-up alone while an application thread
/// polls the link (a safety net: the poller hands the link back when it leaves).
const POLLER_SAFETY_SLEEP: Duration = Duration::from_millis(10);

/// Longest sleep of an application poller on the link fd before it looks at its CQ
/// again (a completion pushed by another driver does not wake it).
const POLLER_MAX_SLEEP: Duration = Duration::from_millis(1);

/// How long an application thread keeps the link after it drove
/// ([`crate::ProgressMode::Hybrid`]; progress-design.md section 3.3).
pub(crate) const LEASE: Duration = Duration::from_micros(200);

/// Longest nap of the engine thread while application threads keep renewing the lease:
/// 3.2 ms. Each time the engine wakes at a lapse and finds the lease renewed (within
/// its last quarter: a thread driving without pause) it naps
/// twice as long (200, 400, 800, 1,600, 3,200 us), and back to the lease once it drove
/// or was woken. At one wake-up per lease (200 us) the engine's context switches
/// delayed about one 8-byte ping-pong round trip in twenty on a shared core (p99 about
/// 4x the typical round trip); the cost is that an application thread that stops
/// driving leaves the link unread for at most this long before the engine takes over.
const LEASE_NAP_MAX: Duration = Duration::from_micros(3200);

/// Everything about who drives a device, shared by the engine thread and every handle:
/// the progress lock around the device's state, the [`Owner`] of the link, a duplicate
/// of the link's poll fd (valid after the stack is dropped), the engine's wake-up and
/// the clock base.
pub(crate) struct Driving {
    pub(crate) progress: DeviceProgress,
    pub(crate) owner: Owner,
    link_fd: std::os::fd::OwnedFd,
    wake: Arc<EventFd>,
    shared: Arc<Shared>,
    start: StdInstant,
    mode: ProgressMode,
    spin: Duration,
}

impl std::fmt::Debug for Driving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driving")
            .field("owner", &self.owner)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Driving {
    pub(crate) fn new(
        engine: Engine,
        link_fd: std::os::fd::OwnedFd,
        wake: Arc<EventFd>,
        shared: Arc<Shared>,
        start: StdInstant,
        cfg: EngineConfig,
    ) -> Driving {
        Driving {
            progress: Progress::new(engine),
            owner: Owner::new(),
            link_fd,
            wake,
            shared,
            start,
            mode: cfg.progress,
            spin: cfg.spin,
        }
    }

    /// Microseconds since the device started.
    pub(crate) fn now_us(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// How long a blocking wait drives before it sleeps ([`EngineConfig::spin`]).
    pub(crate) fn spin_time(&self) -> Duration {
        self.spin
    }

    /// True if the engine thread covers the link now (no application thread holds the
    /// lease or polls).
    pub(crate) fn engine_covers_link(&self) -> bool {
        self.owner.is_engine(self.now_us())
    }

    /// True if verbs calls drive ([`ProgressMode::Hybrid`]).
    pub(crate) fn hybrid(&self) -> bool {
        self.mode == ProgressMode::Hybrid
    }

    /// An application thread drives within `budget` (Hybrid mode), then holds the
    /// link's lease for [`LEASE`]. Work left at the budget's end goes to the engine
    /// (woken). Returns what the drive did.
    pub(crate) fn app_drive(&self, budget: Budget) -> Drove {
        let d = self.progress.drive(budget);
        if let Drove::Drove {
            left_pending: true, ..
        } = d
        {
            let _ = self.wake.write(1);
        }
        if d == Drove::Ended {
            self.ended_by_app();
        } else {
            self.owner
                .lease(self.now_us().saturating_add(LEASE.as_micros() as u64));
        }
        d
    }

    /// An application thread's drive found the device ended: the engine thread frees
    /// the driver ([`Progress::drop_retired`]), so it is woken; the verbs call returns
    /// without waiting for the link to close.
    fn ended_by_app(&self) {
        let _ = self.wake.write(1);
    }

    /// A blocking wait of an application thread (Hybrid mode), until `ready()` or
    /// `timeout`: drive for the spin time; then become the one poller of the link
    /// (sleeping on the link fd, driving on every frame or deadline) or, if another
    /// thread polls, return false at once so the caller sleeps on its CQ's condition
    /// variable. Returns `Some(ready())` if this thread waited as the poller.
    pub(crate) fn app_wait(&self, timeout: Duration, ready: &dyn Fn() -> bool) -> Option<bool> {
        let begin = StdInstant::now();
        let spin = self.spin.min(timeout);
        loop {
            if ready() {
                return Some(true);
            }
            if self.app_drive(POLL_BUDGET) == Drove::Ended {
                return Some(ready());
            }
            if begin.elapsed() >= spin {
                break;
            }
        }
        let took = self.owner.try_poll()?;
        if took {
            // The engine leaves the link fd.
            let _ = self.wake.write(1);
        }
        let mut active = true;
        let mut last_activity = StdInstant::now();
        let result = loop {
            if ready() {
                break true;
            }
            let Some(left) = timeout
                .checked_sub(begin.elapsed())
                .filter(|l| !l.is_zero())
            else {
                break false;
            };
            // As the engine: busy-poll for the spin time after the last activity (a
            // sleep and wake-up per frame costs more than the frame at high rates);
            // then sleep on the link fd. A deadline of "now" after a pass that did
            // nothing (smoltcp asks for that while it cannot send) sleeps until a
            // frame or the cap.
            if last_activity.elapsed() >= self.spin {
                let deadline = if active {
                    self.progress_deadline()
                } else {
                    POLLER_MAX_SLEEP
                };
                let nap = left.min(POLLER_MAX_SLEEP).min(deadline);
                sleep(Some(self.link_fd.as_fd()), None, Some(nap));
            }
            match self.progress.drive(POLL_BUDGET) {
                Drove::Ended => {
                    self.ended_by_app();
                    break ready();
                }
                Drove::Drove { active: a, .. } => active = a,
                Drove::Busy => active = true,
            }
            if active {
                last_activity = StdInstant::now();
            }
        };
        self.owner
            .stop_polling(self.now_us().saturating_add(LEASE.as_micros() as u64));
        Some(result)
    }

    /// Time to the stack's next deadline (none: a long time).
    fn progress_deadline(&self) -> Duration {
        let d = self.shared.deadline_us.load(Ordering::Acquire);
        if d == u64::MAX {
            return Duration::from_secs(3600);
        }
        Duration::from_micros(d.saturating_sub(self.now_us()))
    }
}

/// The engine thread: drives the device whenever no application thread does, spins for
/// [`EngineConfig::spin`] after the last activity, then sleeps in `ppoll(2)` on the
/// link's poll fd (a duplicate taken when the device opened, so that it outlives the
/// stack) and the wake-up eventfd, with the timeout of the stack's next deadline. In
/// [`ProgressMode::Hybrid`], while an application thread holds the link's lease or polls
/// it ([`Owner`]), the engine sleeps on its wake-up alone (commands, a lapsed lease).
/// Returns when the device ended (shutdown, every handle gone, link gone), whichever
/// thread ran the ending pass, after freeing the ended driver (its link and sockets:
/// [`Progress::drop_retired`]), so no application thread waits for the link to close.
pub(crate) fn run_engine(driving: Arc<Driving>, name: String) {
    let shared = &driving.shared;
    let span = tracing::info_span!("device", name = %name);
    let _entered = span.enter();
    tracing::debug!(mode = ?driving.mode, "engine running");
    let progress = &driving.progress;
    let wake = &*driving.wake;
    let mut last_activity = StdInstant::now();
    let mut woken = true;
    // Consecutive naps that ended at a lapse and found the lease renewed.
    let mut renewed_naps = 0u32;
    loop {
        // The wake-up is reset after each sleep (before the queues are read): a
        // wake-up written while the engine is awake keeps the eventfd readable, so
        // the next sleep returns at once. No system call per pass.
        match driving.owner.engine_view(driving.now_us()) {
            EngineView::Engine => renewed_naps = 0,
            view @ (EngineView::Lease(_) | EngineView::AppPolling) => {
                // An application thread drives: stay off the link until its lease
                // lapses or the poller leaves; a wake-up (commands, work left at a
                // budget's end) or published work is driven at once.
                if (woken || progress.pending()) && progress.drive(ENGINE_BUDGET) == Drove::Ended {
                    progress.drop_retired();
                    return;
                }
                let nap = match view {
                    EngineView::Lease(until) => {
                        let left = Duration::from_micros(until.saturating_sub(driving.now_us()));
                        // Only a lease renewed within its last quarter (a thread driving
                        // without pause, as a ping-pong's) lets the naps grow; one left to
                        // run out is taken back when it lapses.
                        if left < LEASE - LEASE / 4 {
                            renewed_naps = 0;
                        }
                        lease_nap(left, renewed_naps)
                    }
                    _ => POLLER_SAFETY_SLEEP,
                };
                woken = sleep(None, Some(wake), Some(nap));
                if woken {
                    let _ = wake.read();
                    renewed_naps = 0;
                } else if matches!(view, EngineView::Lease(_)) {
                    renewed_naps = renewed_naps.saturating_add(1);
                }
                continue;
            }
        }
        match progress.drive(ENGINE_BUDGET) {
            Drove::Ended => {
                tracing::debug!("engine ended");
                progress.drop_retired();
                return;
            }
            Drove::Busy => {
                // An application thread drives right now: it reads the link; the
                // engine waits on its wake-up alone, briefly, and tries again.
                sleep(None, Some(wake), Some(Duration::from_micros(100)));
                let _ = wake.read();
                continue;
            }
            Drove::Drove {
                active,
                left_pending,
                ..
            } => {
                let t = StdInstant::now();
                if active || left_pending {
                    last_activity = t;
                    continue;
                }
                if t.duration_since(last_activity) < driving.spin {
                    // Application threads often share this core: let a runnable one go
                    // first rather than spin against it.
                    std::thread::yield_now();
                    continue;
                }
            }
        }
        if !progress.with_driver(Engine::before_sleep) || progress.pending() {
            continue;
        }
        let deadline = shared.deadline_us.load(Ordering::Acquire);
        let timeout = (deadline != u64::MAX).then(|| {
            // When the stack asks for "now" but the last pass did nothing (smoltcp can
            // ask for that while it cannot send), sleep at least 1 ms.
            Duration::from_micros(deadline.saturating_sub(driving.now_us()).max(1000))
        });
        sleep(Some(driving.link_fd.as_fd()), Some(wake), timeout);
        let _ = wake.read();
    }
}

/// How long the engine naps while an application thread holds the lease, `left` before
/// it lapses, after `renewed_naps` naps in a row that found it renewed: the lease's
/// remainder, but at least [`LEASE`] doubled per renewed nap, at most [`LEASE_NAP_MAX`].
fn lease_nap(left: Duration, renewed_naps: u32) -> Duration {
    let backoff = LEASE.saturating_mul(1 << renewed_naps.min(5));
    left.max(backoff.min(LEASE_NAP_MAX))
}

/// `ppoll(2)` on the link fd and the wake-up (either may be left out), for `timeout`
/// (forever if `None`). EINTR and the like just end the sleep early. Returns true if the
/// wake-up was readable.
fn sleep(
    link: Option<std::os::fd::BorrowedFd<'_>>,
    wake: Option<&EventFd>,
    timeout: Option<Duration>,
) -> bool {
    let mut fds = Vec::with_capacity(2);
    if let Some(fd) = link {
        fds.push(PollFd::new(fd, PollFlags::POLLIN));
    }
    if let Some(w) = wake {
        fds.push(PollFd::new(std::os::fd::AsFd::as_fd(w), PollFlags::POLLIN));
    }
    let _ = ppoll(
        &mut fds,
        timeout.map(nix::sys::time::TimeSpec::from_duration),
        None,
    );
    wake.is_some()
        && fds
            .last()
            .and_then(PollFd::revents)
            .is_some_and(|r| r.contains(PollFlags::POLLIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_naps_double_up_to_the_cap_and_never_end_before_the_lease() {
        let us = Duration::from_micros;
        let naps: Vec<Duration> = (0..7).map(|n| lease_nap(us(150), n)).collect();
        assert_eq!(
            naps,
            [
                us(200),
                us(400),
                us(800),
                us(1600),
                us(3200),
                us(3200),
                us(3200)
            ]
        );
        // A lease renewed further ahead than the backoff: its remainder.
        assert_eq!(lease_nap(us(5000), 0), us(5000));
        assert_eq!(lease_nap(us(5000), 9), us(5000));
        assert_eq!(lease_nap(Duration::ZERO, u32::MAX), LEASE_NAP_MAX);
    }
}
