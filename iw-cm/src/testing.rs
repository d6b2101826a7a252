//! A fake iWARP network for tests (cargo feature `testing`): the one fake [`Provider`]
//! that the iw-cm and rdma-cm tests share.
//!
//! [`FakeNet`] is an in-memory network with one engine thread of its own (the
//! providers' "firmware"), which runs every provider action after a delay drawn from the
//! test's own seeded source ([`Delays`]; the tests use `testkit::Rng::delays`: half at
//! once, the rest after `0..=max_delay_us` microseconds), keeping the order of
//! the actions of one connection. Providers ([`FakeProvider`]) sit on it: the network's
//! own [`FakeNet::provider`] answers every address (an iw-cm test's single device), and
//! [`FakeNet::provider_for`] makes one per device with its own addresses, which can go
//! down ([`FakeProvider::go_down`]: its connections fail, its listeners stop).
//!
//! What a connection does, as the engine sees it: the SYN + MPA Request reaches the
//! listener of the remote address (on the provider owning it; the exact address, or
//! the wildcard with the same port) as `ConnectRequest`, or is refused (`Refused`), or
//! reset (`Reset`: aborted, or its device is down), or, for a [`FakeNet::blackhole`]d
//! address, times out after `connect_timeout` (`TimedOut`). Accept gives
//! `ConnectReply(Ok)` and `Established`; reject `ConnectReply(Rejected)`; a disconnect
//! `Disconnect` (graceful) and `Close` to the peer, and `Close` to its own end.
//!
//! Every downcall asserts that it is not made on the engine thread (the CMs never call
//! a provider from the provider's own thread). [`FakeCounters`] count what happened,
//! for leak checks. Not for production: nothing here is tuned, and the engine's queue
//! is a vector scanned per action.

use crate::{
    AcceptArgs, ConnectArgs, ConnectReply, ConnectStatus, DisconnectMode, EventSink,
    IncomingRequest, Provider, ProviderError, ProviderEvent,
};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU16, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where a [`FakeNet`] takes its delays: called with the maximum (microseconds, above 0),
/// returns an action's delay in microseconds. The crate has no PRNG of its own: tests
/// pass `testkit::Rng::delays(seed)`, the workspace's one test PRNG.
pub type Delays = Box<dyn FnMut(u64) -> u64 + Send>;

thread_local! {
    static ON_ENGINE: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread is a fake network's engine thread.
pub fn on_engine_thread() -> bool {
    ON_ENGINE.with(|c| c.get())
}

/// A QP of the fake provider: counts the CM's references; records what was done to it.
#[derive(Debug)]
pub struct QpObj {
    /// A number unique within its network.
    pub num: u64,
    /// The device that made it (empty for [`FakeNet::new_qp`]).
    pub device: String,
    refs: AtomicI64,
    /// Moved to ERROR (an abortive disconnect, or a device's `qp_to_error`).
    pub errored: AtomicBool,
    /// Destroyed by its device.
    pub destroyed: AtomicBool,
}

/// The fake provider's QP handle.
pub type FakeQp = Arc<QpObj>;

/// Which end of a connection a [`FakeConn`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The end that connected.
    Active,
    /// The end made for a connect request.
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
    active: Option<EventSink<FakeProvider>>,
    passive: Option<EventSink<FakeProvider>>,
    /// The active side aborted (destroy while connecting).
    aborted: bool,
    /// Provider ids of both ends (passive known once requested).
    active_dev: u64,
    passive_dev: Option<u64>,
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

impl FakeConn {
    /// Which end this is.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The connection's number (unique within its network).
    pub fn num(&self) -> u64 {
        self.link.num
    }
}

/// The fake provider's listener handle.
pub struct FakeListener {
    key: (u64, SocketAddr),
    num: u64,
}

struct ListenEntry {
    num: u64,
    sink: EventSink<FakeProvider>,
}

type Action = Box<dyn FnOnce() + Send>;

struct EngineQueue {
    pending: Vec<(Instant, u64, Action)>,
    running: bool,
    stop: bool,
    seq: u64,
}

/// Counters of a fake network, for leak checks.
#[derive(Default)]
pub struct FakeCounters {
    /// QP references the CMs hold now (`qp_add_ref` - `qp_rem_ref`).
    pub qp_refs: AtomicI64,
    /// `qp_add_ref` calls.
    pub qp_add_refs: AtomicU64,
    /// `connect` calls.
    pub connects: AtomicU64,
    /// `accept` calls.
    pub accepts: AtomicU64,
    /// `reject` calls.
    pub rejects: AtomicU64,
    /// `disconnect` calls.
    pub disconnects: AtomicU64,
    /// Listeners alive.
    pub listens_live: AtomicI64,
    /// `ConnectReply` events reported.
    pub replies: AtomicU64,
    /// `Close` events reported.
    pub closes: AtomicU64,
    /// Reports the CM refused (`EventSink::report` errors).
    pub report_errors: AtomicU64,
}

/// The id of the provider that answers every address ([`FakeNet::provider`]); the
/// providers of [`FakeNet::provider_for`] are numbered from 1.
const ANY: u64 = 0;

/// The shared state of a fake network (what its providers and its engine hold).
pub struct NetInner {
    queue: Mutex<EngineQueue>,
    cv: Condvar,
    idle_cv: Condvar,
    /// (provider id, listen address) -> listener.
    listeners: Mutex<HashMap<(u64, SocketAddr), ListenEntry>>,
    /// provider id -> (its addresses, alive), for the providers of devices.
    devices: Mutex<HashMap<u64, (Vec<Ipv4Addr>, bool)>>,
    links: Mutex<Vec<std::sync::Weak<Link>>>,
    blackholes: Mutex<HashSet<SocketAddr>>,
    delays: Mutex<Delays>,
    max_delay_us: AtomicU64,
    inline: AtomicBool,
    /// The ORD a passive end reports (in `ConnectRequest` and in the accept's reply).
    ord: AtomicU16,
    next_num: AtomicU64,
    /// Connections not freed yet.
    pub links_live: AtomicI64,
    /// What happened.
    pub counters: FakeCounters,
    /// How long a connect to a blackholed address waits before `TimedOut`.
    pub connect_timeout: Mutex<Duration>,
}

/// A fake network and its engine thread; stops the engine when dropped.
pub struct FakeNet {
    /// The shared state.
    pub net: Arc<NetInner>,
    /// The provider that answers every address (id 0; never goes down).
    pub provider: Arc<FakeProvider>,
    engine: Option<JoinHandle<()>>,
}

impl FakeNet {
    /// A network whose engine delays each action by `delays(max_delay_us)` microseconds
    /// (a seeded source of the test's, e.g. `testkit::Rng::delays(seed)`; values above
    /// the maximum are clamped to it), keeping per-connection order. Passive ends report
    /// ORD 16 ([`FakeNet::set_ord`]).
    pub fn new(delays: impl FnMut(u64) -> u64 + Send + 'static, max_delay_us: u64) -> FakeNet {
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
            devices: Mutex::new(HashMap::new()),
            links: Mutex::new(Vec::new()),
            blackholes: Mutex::new(HashSet::new()),
            delays: Mutex::new(Box::new(delays)),
            max_delay_us: AtomicU64::new(max_delay_us),
            inline: AtomicBool::new(false),
            ord: AtomicU16::new(16),
            next_num: AtomicU64::new(1),
            links_live: AtomicI64::new(0),
            counters: FakeCounters::default(),
            connect_timeout: Mutex::new(Duration::from_millis(50)),
        });
        let engine_net = net.clone();
        let engine = std::thread::Builder::new()
            .name("fake-engine".into())
            .spawn(move || engine_main(engine_net))
            .expect("spawn the fake engine");
        FakeNet {
            provider: Arc::new(FakeProvider {
                net: net.clone(),
                id: ANY,
            }),
            net,
            engine: Some(engine),
        }
    }

    /// The shared state.
    pub fn net(&self) -> &Arc<NetInner> {
        &self.net
    }

    /// A provider for a device with these addresses (connections to them reach its
    /// listeners).
    pub fn provider_for(&self, addrs: Vec<Ipv4Addr>) -> Arc<FakeProvider> {
        let id = self.net.next_num.fetch_add(1, SeqCst);
        self.net.devices.lock().unwrap().insert(id, (addrs, true));
        Arc::new(FakeProvider {
            net: self.net.clone(),
            id,
        })
    }

    /// Run every action immediately on the calling thread (inside the downcall)
    /// instead of on the engine: the "provider reports from inside a downcall" mode.
    pub fn set_inline(&self, on: bool) {
        self.net.inline.store(on, SeqCst);
    }

    /// The ORD a passive end reports (default 16).
    pub fn set_ord(&self, ord: u16) {
        self.net.ord.store(ord, SeqCst);
    }

    /// Connects to `addr` get no answer until the connect timeout.
    pub fn blackhole(&self, addr: SocketAddr) {
        self.net.blackholes.lock().unwrap().insert(addr);
    }

    /// A QP of no device.
    pub fn new_qp(&self) -> FakeQp {
        self.provider.new_qp("")
    }

    /// Wait until the engine has nothing pending or running; `false` on timeout.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut q = self.net.queue.lock().unwrap();
        while !q.pending.is_empty() || q.running {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            q = self.net.idle_cv.wait_timeout(q, deadline - now).unwrap().0;
        }
        true
    }

    /// Listeners alive.
    pub fn listeners(&self) -> usize {
        self.net.listeners.lock().unwrap().len()
    }

    /// What happened.
    pub fn counters(&self) -> &FakeCounters {
        &self.net.counters
    }

    /// Connections not freed yet.
    pub fn links_live(&self) -> i64 {
        self.net.links_live.load(SeqCst)
    }

    /// QP references the CMs hold now.
    pub fn qp_refs(&self) -> i64 {
        self.net.counters.qp_refs.load(SeqCst)
    }
}

impl Drop for FakeNet {
    fn drop(&mut self) {
        self.net.queue.lock().unwrap().stop = true;
        self.net.cv.notify_all();
        if let Some(e) = self.engine.take() {
            let _ = e.join();
        }
        let pending: Vec<_> = std::mem::take(&mut self.net.queue.lock().unwrap().pending);
        drop(pending);
        let listeners: Vec<_> = self.net.listeners.lock().unwrap().drain().collect();
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
        if max == 0 {
            return Duration::ZERO;
        }
        let us = (self.delays.lock().unwrap())(max);
        Duration::from_micros(us.min(max))
    }

    /// Run `action` on the engine after a random delay plus `extra`, after every
    /// earlier action of the same link (or inline, in inline mode).
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

    fn report(&self, sink: &EventSink<FakeProvider>, ev: ProviderEvent<FakeConn>) {
        match &ev {
            ProviderEvent::ConnectReply(_) => self.counters.replies.fetch_add(1, SeqCst),
            ProviderEvent::Close => self.counters.closes.fetch_add(1, SeqCst),
            _ => 0,
        };
        if sink.report(ev).is_err() {
            self.counters.report_errors.fetch_add(1, SeqCst);
        }
    }

    fn alive(&self, dev: u64) -> bool {
        dev == ANY || self.devices.lock().unwrap().get(&dev).is_some_and(|d| d.1)
    }

    /// The live provider of a device that owns `addr`'s IP, or else the provider that
    /// answers every address.
    fn owner_of(&self, addr: SocketAddr) -> u64 {
        let SocketAddr::V4(a) = addr else { return ANY };
        self.devices
            .lock()
            .unwrap()
            .iter()
            .find(|(_, (addrs, alive))| *alive && addrs.contains(a.ip()))
            .map_or(ANY, |(id, _)| *id)
    }
}

/// One provider on the fake network: the network's own (every address) or a device's.
pub struct FakeProvider {
    /// The network.
    pub net: Arc<NetInner>,
    /// 0 for [`FakeNet::provider`], else the device's number.
    pub id: u64,
}

impl FakeProvider {
    /// A QP made by `device`.
    pub fn new_qp(&self, device: &str) -> FakeQp {
        Arc::new(QpObj {
            num: self.net.next_num.fetch_add(1, SeqCst),
            device: device.to_string(),
            refs: AtomicI64::new(0),
            errored: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
        })
    }

    /// Whether the provider is up (a device's until [`Self::go_down`]).
    pub fn alive(&self) -> bool {
        self.net.alive(self.id)
    }

    /// The device's link is gone: its connections close (both ends hear CLOSE, or a
    /// Reset reply while connecting), its listeners stop taking requests, its connect
    /// and listen calls fail with `DeviceRemoved`.
    pub fn go_down(&self) {
        if let Some(d) = self.net.devices.lock().unwrap().get_mut(&self.id) {
            d.1 = false;
        }
        let links: Vec<Arc<Link>> = {
            let mut l = self.net.links.lock().unwrap();
            l.retain(|w| w.strong_count() > 0);
            l.iter().filter_map(|w| w.upgrade()).collect()
        };
        let me = self.id;
        for link in links {
            let involved = {
                let st = link.st.lock().unwrap();
                st.active_dev == me || st.passive_dev == Some(me)
            };
            if involved {
                let (n2, l2) = (self.net.clone(), link.clone());
                self.net.schedule(
                    Some(&link),
                    Duration::ZERO,
                    Box::new(move || fail_link(&n2, &l2)),
                );
            }
        }
    }
}

fn reply(status: ConnectStatus) -> ProviderEvent<FakeConn> {
    ProviderEvent::ConnectReply(ConnectReply::with_status(status))
}

/// A link fails (device gone): CLOSE for established ends, a Reset reply for a
/// connect in flight.
fn fail_link(net: &Arc<NetInner>, link: &Arc<Link>) {
    let mut reports = Vec::new();
    {
        let mut st = link.st.lock().unwrap();
        match st.phase {
            Phase::Connecting | Phase::Requested => {
                st.phase = Phase::Closed;
                if let Some(a) = st.active.take() {
                    reports.push((a, reply(ConnectStatus::Reset)));
                }
                // A passive end that was requested but not accepted holds no sink.
            }
            Phase::Established => {
                st.phase = Phase::Closed;
                for s in [st.active.take(), st.passive.take()].into_iter().flatten() {
                    reports.push((s, ProviderEvent::Close));
                }
            }
            Phase::Closed => {}
        }
    }
    for (s, ev) in reports {
        net.report(&s, ev);
    }
}

/// The engine processes the SYN + MPA Request of a new link.
fn syn_arrives(net: &Arc<NetInner>, link: &Arc<Link>) {
    let mut reports: Vec<(EventSink<FakeProvider>, ProviderEvent<FakeConn>)> = Vec::new();
    {
        let mut st = link.st.lock().unwrap();
        if st.phase != Phase::Connecting {
            return;
        }
        let reset = |st: &mut LinkState, status| {
            st.phase = Phase::Closed;
            st.active.take().map(|s| (s, reply(status)))
        };
        if st.aborted || !net.alive(st.active_dev) {
            reports.extend(reset(&mut st, ConnectStatus::Reset));
        } else if net.blackholes.lock().unwrap().contains(&link.remote) {
            drop(st);
            let timeout = *net.connect_timeout.lock().unwrap();
            let (n2, l2) = (net.clone(), link.clone());
            net.schedule(None, timeout, Box::new(move || connect_timed_out(&n2, &l2)));
            return;
        } else {
            let dev = net.owner_of(link.remote);
            let wildcard =
                SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, link.remote.port()));
            let listener = {
                let l = net.listeners.lock().unwrap();
                l.get(&(dev, link.remote))
                    .or_else(|| l.get(&(dev, wildcard)))
                    .map(|e| e.sink.clone())
            };
            match listener {
                None => reports.extend(reset(&mut st, ConnectStatus::Refused)),
                Some(ls) => {
                    st.phase = Phase::Requested;
                    st.passive_dev = Some(dev);
                    reports.push((
                        ls,
                        ProviderEvent::ConnectRequest(IncomingRequest {
                            conn: FakeConn {
                                link: link.clone(),
                                side: Side::Passive,
                            },
                            private_data: link.private_data.clone(),
                            ird: 16,
                            ord: net.ord.load(SeqCst),
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

/// A blackholed connect's timeout: `TimedOut` (or `Reset` if aborted meanwhile).
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
        net.report(&s, reply(status));
    }
}

impl Provider for FakeProvider {
    type Qp = FakeQp;
    type Conn = FakeConn;
    type Listener = FakeListener;

    fn connect(
        &self,
        sink: EventSink<Self>,
        args: ConnectArgs<'_, FakeQp>,
    ) -> Result<FakeConn, ProviderError> {
        assert!(!on_engine_thread());
        if !self.alive() {
            return Err(ProviderError::DeviceRemoved);
        }
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
                active_dev: self.id,
                passive_dev: None,
                last_deadline: Instant::now(),
            }),
        });
        self.net.links.lock().unwrap().push(Arc::downgrade(&link));
        let (n2, l2) = (self.net.clone(), link.clone());
        self.net.schedule(
            Some(&link),
            Duration::ZERO,
            Box::new(move || syn_arrives(&n2, &l2)),
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
        let me = self.id;
        self.net.schedule(
            Some(&conn.link),
            Duration::ZERO,
            Box::new(move || {
                let mut reports = Vec::new();
                {
                    let mut st = link.st.lock().unwrap();
                    let peer_alive = net.alive(st.active_dev);
                    if st.phase == Phase::Requested && !st.aborted && net.alive(me) && peer_alive {
                        st.phase = Phase::Established;
                        st.passive = Some(sink.clone());
                        if let Some(a) = &st.active {
                            reports.push((
                                a.clone(),
                                ProviderEvent::ConnectReply(ConnectReply {
                                    status: ConnectStatus::Ok,
                                    private_data: pd,
                                    ird: 16,
                                    ord: net.ord.load(SeqCst),
                                }),
                            ));
                        }
                        reports.push((sink, ProviderEvent::Established));
                    } else {
                        // The initiator (or a device) went away before the accept got
                        // through.
                        st.phase = Phase::Closed;
                        reports.push((sink, ProviderEvent::Close));
                        if let Some(a) = st.active.take() {
                            reports.push((a, reply(ConnectStatus::Reset)));
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
        if !self.alive() {
            return Err(ProviderError::DeviceRemoved);
        }
        let mut l = self.net.listeners.lock().unwrap();
        let key = (self.id, local_addr);
        if l.contains_key(&key) {
            return Err(ProviderError::AddressInUse);
        }
        let num = self.net.next_num.fetch_add(1, SeqCst);
        l.insert(key, ListenEntry { num, sink });
        self.net.counters.listens_live.fetch_add(1, SeqCst);
        Ok(FakeListener { key, num })
    }

    fn destroy_listen(&self, listener: FakeListener) {
        assert!(!on_engine_thread());
        let removed = {
            let mut l = self.net.listeners.lock().unwrap();
            match l.get(&listener.key) {
                Some(e) if e.num == listener.num => l.remove(&listener.key),
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
        qp: Option<&FakeQp>,
        mode: DisconnectMode,
    ) -> Result<(), ProviderError> {
        assert!(!on_engine_thread());
        self.net.counters.disconnects.fetch_add(1, SeqCst);
        if let (Some(qp), DisconnectMode::Abortive) = (qp, mode) {
            qp.errored.store(true, SeqCst);
        }
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
                                        reports.push((a, reply(ConnectStatus::Reset)));
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
