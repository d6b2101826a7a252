//! Test support: an in-memory fake provider with its own engine thread and seeded
//! random delays, a per-id delivery checker, a watchdog, a small PRNG.
#![allow(dead_code)]

use iw_cm::{
    AcceptArgs, CmEvent, CmIdRef, ConnectArgs, ConnectReply, ConnectStatus, DisconnectMode,
    EventSink, IncomingRequest, IwCm, Provider, ProviderError, ProviderEvent,
};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------ fake provider

thread_local! {
    static ON_ENGINE: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread is the fake provider's engine thread.
pub fn on_engine_thread() -> bool {
    ON_ENGINE.with(|c| c.get())
}

/// A QP of the fake provider; counts the CM's references.
#[derive(Debug)]
pub struct QpObj {
    pub num: u64,
    refs: AtomicI64,
}

pub type FakeQp = Arc<QpObj>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Active,
    Passive,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// SYN + MPA Request on the way.
    Connecting,
    /// The request was reported to a listener; waiting for accept/reject.
    Requested,
    Established,
    Closed,
}

struct LinkState {
    phase: Phase,
    active: Option<EventSink<Fake>>,
    passive: Option<EventSink<Fake>>,
    /// The active side aborted (destroy while connecting).
    aborted: bool,
    last_deadline: Instant,
}

/// One connection, both ends.
pub struct Link {
    num: u64,
    net: Arc<NetInner>,
    local: SocketAddr,
    remote: SocketAddr,
    private_data: Vec<u8>,
    st: Mutex<LinkState>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.net.links_live.fetch_sub(1, SeqCst);
    }
}

/// The fake provider's connection handle: a link and which end of it.
#[derive(Clone)]
pub struct FakeConn {
    link: Arc<Link>,
    side: Side,
}

/// The fake provider's listener handle.
pub struct FakeListener {
    addr: SocketAddr,
    num: u64,
}

struct ListenEntry {
    num: u64,
    sink: EventSink<Fake>,
}

type Action = Box<dyn FnOnce() + Send>;

struct EngineQueue {
    pending: Vec<(Instant, u64, Action)>,
    running: bool,
    stop: bool,
    seq: u64,
}

/// Counters of the fake provider, for leak checks.
#[derive(Default)]
pub struct FakeCounters {
    pub qp_refs: AtomicI64,
    pub qp_add_refs: AtomicU64,
    pub connects: AtomicU64,
    pub accepts: AtomicU64,
    pub rejects: AtomicU64,
    pub disconnects: AtomicU64,
    pub listens_live: AtomicI64,
    pub replies: AtomicU64,
    pub closes: AtomicU64,
    pub report_errors: AtomicU64,
}

pub struct NetInner {
    queue: Mutex<EngineQueue>,
    cv: Condvar,
    idle_cv: Condvar,
    listeners: Mutex<HashMap<SocketAddr, ListenEntry>>,
    blackholes: Mutex<HashSet<SocketAddr>>,
    rng: Mutex<Rng>,
    max_delay_us: AtomicU64,
    inline: AtomicBool,
    next_num: AtomicU64,
    pub links_live: AtomicI64,
    pub counters: FakeCounters,
    /// How long a connect to a blackholed address waits before `TimedOut`.
    pub connect_timeout: Mutex<Duration>,
}

/// The provider: a handle on the fake network.
#[derive(Clone)]
pub struct Fake {
    pub net: Arc<NetInner>,
}

/// The fake network and its engine thread.
pub struct FakeNet {
    pub provider: Arc<Fake>,
    engine: Option<JoinHandle<()>>,
}

impl FakeNet {
    /// A network whose engine delays each action by 0..=max_delay_us microseconds
    /// (seeded), keeping per-connection order.
    pub fn new(seed: u64, max_delay_us: u64) -> FakeNet {
        let net = Arc::new(NetInner {
            queue: Mutex::new(EngineQueue {
                pending: Vec::new(),
                running: false,
                stop: false,
                seq: 0,
            }),
            cv: Condvar::new(),
            idle_cv: Condvar::new(),
            listeners: Mutex::new(HashMap::new()),
            blackholes: Mutex::new(HashSet::new()),
            rng: Mutex::new(Rng::new(seed)),
            max_delay_us: AtomicU64::new(max_delay_us),
            inline: AtomicBool::new(false),
            next_num: AtomicU64::new(1),
            links_live: AtomicI64::new(0),
            counters: FakeCounters::default(),
            connect_timeout: Mutex::new(Duration::from_millis(50)),
        });
        let engine_net = net.clone();
        let engine = std::thread::Builder::new()
            .name("fake-engine".into())
            .spawn(move || engine_main(engine_net))
            .unwrap();
        FakeNet {
            provider: Arc::new(Fake { net }),
            engine: Some(engine),
        }
    }

    pub fn net(&self) -> &Arc<NetInner> {
        &self.provider.net
    }

    /// Run every action immediately on the calling thread (inside the downcall)
    /// instead of on the engine: the "provider reports from inside a downcall" mode.
    pub fn set_inline(&self, on: bool) {
        self.net().inline.store(on, SeqCst);
    }

    /// Connects to `addr` get no answer until the connect timeout.
    pub fn blackhole(&self, addr: SocketAddr) {
        self.net().blackholes.lock().unwrap().insert(addr);
    }

    pub fn new_qp(&self) -> FakeQp {
        self.provider.new_qp()
    }

    /// Wait until the engine has nothing pending or running.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let net = self.net();
        let mut q = net.queue.lock().unwrap();
        while !q.pending.is_empty() || q.running {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            q = net.idle_cv.wait_timeout(q, deadline - now).unwrap().0;
        }
        true
    }

    pub fn listeners(&self) -> usize {
        self.net().listeners.lock().unwrap().len()
    }

    pub fn counters(&self) -> &FakeCounters {
        &self.net().counters
    }

    pub fn links_live(&self) -> i64 {
        self.net().links_live.load(SeqCst)
    }
}

impl Drop for FakeNet {
    fn drop(&mut self) {
        {
            let mut q = self.net().queue.lock().unwrap();
            q.stop = true;
        }
        self.net().cv.notify_all();
        if let Some(e) = self.engine.take() {
            let _ = e.join();
        }
        let pending: Vec<_> = std::mem::take(&mut self.net().queue.lock().unwrap().pending);
        drop(pending);
        let listeners: Vec<_> = self.net().listeners.lock().unwrap().drain().collect();
        drop(listeners);
    }
}

fn engine_main(net: Arc<NetInner>) {
    ON_ENGINE.with(|c| c.set(true));
    loop {
        let action = {
            let mut q = net.queue.lock().unwrap();
            loop {
                if q.stop {
                    return;
                }
                let next = q
                    .pending
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, (t, s, _))| (*t, *s))
                    .map(|(i, (t, _, _))| (i, *t));
                match next {
                    None => {
                        net.idle_cv.notify_all();
                        q = net.cv.wait(q).unwrap();
                    }
                    Some((i, t)) => {
                        let now = Instant::now();
                        if t <= now {
                            let (_, _, a) = q.pending.swap_remove(i);
                            q.running = true;
                            break a;
                        }
                        q = net.cv.wait_timeout(q, t - now).unwrap().0;
                    }
                }
            }
        };
        action();
        let mut q = net.queue.lock().unwrap();
        q.running = false;
        if q.pending.is_empty() {
            net.idle_cv.notify_all();
        }
    }
}

impl NetInner {
    fn delay(&self) -> Duration {
        let max = self.max_delay_us.load(SeqCst);
        let mut rng = self.rng.lock().unwrap();
        // Half of the actions run at once, the rest after 0..=max us.
        if max == 0 || rng.chance(50) {
            Duration::ZERO
        } else {
            Duration::from_micros(rng.below(max + 1))
        }
    }

    /// Run `action` on the engine after a random delay, after every earlier action
    /// of the same link (or inline, in inline mode).
    fn schedule(&self, link: Option<&Link>, extra: Duration, action: Action) {
        if self.inline.load(SeqCst) && extra.is_zero() {
            action();
            return;
        }
        let mut t = Instant::now() + self.delay() + extra;
        if let Some(link) = link {
            let mut st = link.st.lock().unwrap();
            if st.last_deadline > t {
                t = st.last_deadline;
            }
            st.last_deadline = t;
        }
        let mut q = self.queue.lock().unwrap();
        q.seq += 1;
        let seq = q.seq;
        q.pending.push((t, seq, action));
        drop(q);
        self.cv.notify_all();
    }

    fn report(&self, sink: &EventSink<Fake>, ev: ProviderEvent<FakeConn>) {
        match &ev {
            ProviderEvent::ConnectReply(_) => self.counters.replies.fetch_add(1, SeqCst),
            ProviderEvent::Close => self.counters.closes.fetch_add(1, SeqCst),
            _ => 0,
        };
        if sink.report(ev).is_err() {
            self.counters.report_errors.fetch_add(1, SeqCst);
        }
    }
}

impl Fake {
    pub fn new_qp(&self) -> FakeQp {
        Arc::new(QpObj {
            num: self.net.next_num.fetch_add(1, SeqCst),
            refs: AtomicI64::new(0),
        })
    }

    /// The engine processes the SYN + MPA Request of a new link.
    fn syn_arrives(net: &Arc<NetInner>, link: &Arc<Link>) {
        let mut reports: Vec<(EventSink<Fake>, ProviderEvent<FakeConn>)> = Vec::new();
        {
            let mut st = link.st.lock().unwrap();
            if st.phase != Phase::Connecting {
                return;
            }
            if st.aborted {
                st.phase = Phase::Closed;
                if let Some(s) = st.active.take() {
                    reports.push((
                        s,
                        ProviderEvent::ConnectReply(ConnectReply::with_status(
                            ConnectStatus::Reset,
                        )),
                    ));
                }
            } else if net.blackholes.lock().unwrap().contains(&link.remote) {
                drop(st);
                let timeout = *net.connect_timeout.lock().unwrap();
                let (n2, l2) = (net.clone(), link.clone());
                net.schedule(
                    None,
                    timeout,
                    Box::new(move || Fake::connect_timed_out(&n2, &l2)),
                );
                return;
            } else {
                let listener = net
                    .listeners
                    .lock()
                    .unwrap()
                    .get(&link.remote)
                    .map(|e| e.sink.clone());
                match listener {
                    None => {
                        st.phase = Phase::Closed;
                        if let Some(s) = st.active.take() {
                            reports.push((
                                s,
                                ProviderEvent::ConnectReply(ConnectReply::with_status(
                                    ConnectStatus::Refused,
                                )),
                            ));
                        }
                    }
                    Some(ls) => {
                        st.phase = Phase::Requested;
                        reports.push((
                            ls,
                            ProviderEvent::ConnectRequest(IncomingRequest {
                                conn: FakeConn {
                                    link: link.clone(),
                                    side: Side::Passive,
                                },
                                private_data: link.private_data.clone(),
                                ird: 16,
                                ord: 16,
                                local_addr: link.remote,
                                remote_addr: link.local,
                            }),
                        ));
                    }
                }
            }
        }
        for (s, ev) in reports {
            net.report(&s, ev);
        }
    }

    fn connect_timed_out(net: &Arc<NetInner>, link: &Arc<Link>) {
        let sink = {
            let mut st = link.st.lock().unwrap();
            if st.phase != Phase::Connecting {
                return;
            }
            st.phase = Phase::Closed;
            let status = if st.aborted {
                ConnectStatus::Reset
            } else {
                ConnectStatus::TimedOut
            };
            st.active.take().map(|s| (s, status))
        };
        if let Some((s, status)) = sink {
            net.report(
                &s,
                ProviderEvent::ConnectReply(ConnectReply::with_status(status)),
            );
        }
    }
}

impl Provider for Fake {
    type Qp = FakeQp;
    type Conn = FakeConn;
    type Listener = FakeListener;

    fn connect(
        &self,
        sink: EventSink<Self>,
        args: ConnectArgs<'_, FakeQp>,
    ) -> Result<FakeConn, ProviderError> {
        assert!(!on_engine_thread());
        self.net.counters.connects.fetch_add(1, SeqCst);
        self.net.links_live.fetch_add(1, SeqCst);
        let link = Arc::new(Link {
            num: self.net.next_num.fetch_add(1, SeqCst),
            net: self.net.clone(),
            local: args
                .local_addr
                .unwrap_or_else(|| "192.0.2.1:40000".parse().unwrap()),
            remote: args.remote_addr,
            private_data: args.private_data.to_vec(),
            st: Mutex::new(LinkState {
                phase: Phase::Connecting,
                active: Some(sink),
                passive: None,
                aborted: false,
                last_deadline: Instant::now(),
            }),
        });
        let (n2, l2) = (self.net.clone(), link.clone());
        self.net.schedule(
            Some(&link),
            Duration::ZERO,
            Box::new(move || Fake::syn_arrives(&n2, &l2)),
        );
        Ok(FakeConn {
            link,
            side: Side::Active,
        })
    }

    fn accept(
        &self,
        sink: EventSink<Self>,
        conn: &FakeConn,
        args: AcceptArgs<'_, FakeQp>,
    ) -> Result<(), ProviderError> {
        assert!(!on_engine_thread());
        assert_eq!(conn.side, Side::Passive);
        self.net.counters.accepts.fetch_add(1, SeqCst);
        let pd = args.private_data.to_vec();
        let link = conn.link.clone();
        let net = self.net.clone();
        self.net.schedule(
            Some(&conn.link),
            Duration::ZERO,
            Box::new(move || {
                let mut reports = Vec::new();
                {
                    let mut st = link.st.lock().unwrap();
                    if st.phase == Phase::Requested && !st.aborted {
                        st.phase = Phase::Established;
                        st.passive = Some(sink.clone());
                        if let Some(a) = &st.active {
                            reports.push((
                                a.clone(),
                                ProviderEvent::ConnectReply(ConnectReply {
                                    status: ConnectStatus::Ok,
                                    private_data: pd,
                                    ird: 16,
                                    ord: 16,
                                }),
                            ));
                        }
                        reports.push((sink, ProviderEvent::Established));
                    } else {
                        // The initiator went away before the accept got through.
                        st.phase = Phase::Closed;
                        reports.push((sink, ProviderEvent::Close));
                        if let Some(a) = st.active.take() {
                            reports.push((
                                a,
                                ProviderEvent::ConnectReply(ConnectReply::with_status(
                                    ConnectStatus::Reset,
                                )),
                            ));
                        }
                    }
                }
                for (s, ev) in reports {
                    net.report(&s, ev);
                }
            }),
        );
        Ok(())
    }

    fn reject(&self, conn: &FakeConn, private_data: &[u8]) -> Result<(), ProviderError> {
        assert!(!on_engine_thread());
        self.net.counters.rejects.fetch_add(1, SeqCst);
        let pd = private_data.to_vec();
        let link = conn.link.clone();
        let net = self.net.clone();
        self.net.schedule(
            Some(&conn.link),
            Duration::ZERO,
            Box::new(move || {
                let sink = {
                    let mut st = link.st.lock().unwrap();
                    if st.phase != Phase::Requested {
                        return;
                    }
                    st.phase = Phase::Closed;
                    st.active.take()
                };
                if let Some(s) = sink {
                    net.report(
                        &s,
                        ProviderEvent::ConnectReply(ConnectReply {
                            status: ConnectStatus::Rejected,
                            private_data: pd,
                            ird: 0,
                            ord: 0,
                        }),
                    );
                }
            }),
        );
        Ok(())
    }

    fn create_listen(
        &self,
        sink: EventSink<Self>,
        local_addr: SocketAddr,
        _backlog: u32,
    ) -> Result<FakeListener, ProviderError> {
        assert!(!on_engine_thread());
        let mut l = self.net.listeners.lock().unwrap();
        if l.contains_key(&local_addr) {
            return Err(ProviderError::AddressInUse);
        }
        let num = self.net.next_num.fetch_add(1, SeqCst);
        l.insert(local_addr, ListenEntry { num, sink });
        self.net.counters.listens_live.fetch_add(1, SeqCst);
        Ok(FakeListener {
            addr: local_addr,
            num,
        })
    }

    fn destroy_listen(&self, listener: FakeListener) {
        assert!(!on_engine_thread());
        let removed = {
            let mut l = self.net.listeners.lock().unwrap();
            match l.get(&listener.addr) {
                Some(e) if e.num == listener.num => l.remove(&listener.addr),
                _ => None,
            }
        };
        if removed.is_some() {
            self.net.counters.listens_live.fetch_sub(1, SeqCst);
        }
        drop(removed);
    }

    fn disconnect(
        &self,
        conn: &FakeConn,
        _qp: Option<&FakeQp>,
        mode: DisconnectMode,
    ) -> Result<(), ProviderError> {
        assert!(!on_engine_thread());
        self.net.counters.disconnects.fetch_add(1, SeqCst);
        let link = conn.link.clone();
        let side = conn.side;
        let net = self.net.clone();
        self.net.schedule(
            Some(&conn.link),
            Duration::ZERO,
            Box::new(move || {
                let mut reports = Vec::new();
                {
                    let mut st = link.st.lock().unwrap();
                    match st.phase {
                        Phase::Connecting | Phase::Requested => {
                            // Abort of a connect in flight: the reply (Reset) comes from
                            // the SYN / timeout / accept path, which sees `aborted`.
                            if side == Side::Active {
                                st.aborted = true;
                                if st.phase == Phase::Requested {
                                    // The passive side may never accept: answer now.
                                    if let Some(a) = st.active.take() {
                                        reports.push((
                                            a,
                                            ProviderEvent::ConnectReply(ConnectReply::with_status(
                                                ConnectStatus::Reset,
                                            )),
                                        ));
                                    }
                                }
                            }
                        }
                        Phase::Established => {
                            st.phase = Phase::Closed;
                            let (me, peer) = match side {
                                Side::Active => (st.active.take(), st.passive.take()),
                                Side::Passive => (st.passive.take(), st.active.take()),
                            };
                            if let Some(p) = peer {
                                if mode == DisconnectMode::Graceful {
                                    reports.push((p.clone(), ProviderEvent::Disconnect));
                                }
                                reports.push((p, ProviderEvent::Close));
                            }
                            if let Some(m) = me {
                                reports.push((m, ProviderEvent::Close));
                            }
                        }
                        Phase::Closed => {}
                    }
                }
                for (s, ev) in reports {
                    net.report(&s, ev);
                }
            }),
        );
        Ok(())
    }

    fn qp_add_ref(&self, qp: &FakeQp) {
        assert!(!on_engine_thread());
        qp.refs.fetch_add(1, SeqCst);
        self.net.counters.qp_refs.fetch_add(1, SeqCst);
        self.net.counters.qp_add_refs.fetch_add(1, SeqCst);
    }

    fn qp_rem_ref(&self, qp: &FakeQp) {
        assert!(!on_engine_thread());
        let before = qp.refs.fetch_sub(1, SeqCst);
        assert!(
            before > 0,
            "qp_rem_ref without a reference on QP {}",
            qp.num
        );
        self.net.counters.qp_refs.fetch_sub(1, SeqCst);
    }
}

// --------------------------------------------------------------- delivery checker

/// Checks, at every handler call, that no other handler call for the same id is
/// running (one at a time), that it runs on a CM worker (not the provider's engine
/// thread, not a user thread).
#[derive(Default)]
pub struct Checker {
    active: Mutex<HashSet<u64>>,
    pub calls: AtomicUsize,
    pub violations: Mutex<Vec<String>>,
}

impl Checker {
    pub fn enter(&self, serial: u64) {
        self.calls.fetch_add(1, SeqCst);
        if on_engine_thread() {
            self.violation(format!("handler of #{serial} ran on the provider's engine"));
        }
        if !iw_cm::in_delivery_context() {
            self.violation(format!("handler of #{serial} ran outside a CM worker"));
        }
        if !self.active.lock().unwrap().insert(serial) {
            self.violation(format!("two deliveries at once for #{serial}"));
        }
    }
    pub fn exit(&self, serial: u64) {
        self.active.lock().unwrap().remove(&serial);
    }
    pub fn violation(&self, s: String) {
        eprintln!("VIOLATION: {s}");
        self.violations.lock().unwrap().push(s);
    }
    pub fn assert_clean(&self) {
        let v = self.violations.lock().unwrap();
        assert!(
            v.is_empty(),
            "{} violations, first: {:?}",
            v.len(),
            v.first()
        );
    }
}

/// A short description of an event, for recording sequences.
pub fn ev_name(ev: &CmEvent<Fake>) -> String {
    match ev {
        CmEvent::ConnectRequest(_) => "ConnectRequest".into(),
        CmEvent::ConnectReply(r) => format!("ConnectReply({:?})", r.status),
        CmEvent::Established => "Established".into(),
        CmEvent::Close => "Close".into(),
    }
}

/// Forward every event of an id to a channel (name and status).
pub type EvTx = mpsc::Sender<(u64, String)>;

pub fn forwarding_handler(
    tx: EvTx,
) -> impl Fn(&CmIdRef<Fake>, CmEvent<Fake>) -> iw_cm::Disposition + Send + Sync + 'static {
    let tx = Mutex::new(tx);
    move |id, ev| {
        let _ = tx.lock().unwrap().send((id.serial(), ev_name(&ev)));
        iw_cm::Disposition::Keep
    }
}

// ------------------------------------------------- watchdog, PRNG, polling wait

#[allow(unused_imports)] // each test binary uses a subset
pub use testkit::{eventually, Rng, Watchdog};

/// Wait for the fake engine and the CM to go quiet, then check that nothing leaked:
/// no cm_id alive, no queued event, no pending job, no QP reference, no link, no
/// listener.
pub fn assert_quiescent_and_clean(net: &FakeNet, cm: &IwCm<Fake>) {
    let ok = eventually(Duration::from_secs(10), || {
        net.wait_idle(Duration::from_millis(100));
        let _ = cm.flush_timeout(Duration::from_millis(100));
        let s = cm.stats();
        s.ids_alive == 0 && s.events_queued == 0 && s.jobs_pending == 0 && net.links_live() == 0
    });
    let s = cm.stats();
    assert!(
        ok,
        "not quiescent: {s:?}, links {}\n{}",
        net.links_live(),
        cm.dump_state()
    );
    assert_eq!(s.ids_freed, s.ids_created, "{s:?}");
    assert_eq!(
        net.counters().qp_refs.load(SeqCst),
        0,
        "QP references leaked"
    );
    assert_eq!(
        net.counters().listens_live.load(SeqCst),
        0,
        "listeners leaked"
    );
    assert_eq!(net.listeners(), 0);
}
