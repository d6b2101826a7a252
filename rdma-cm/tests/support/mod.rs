//! Test support: an in-memory network of fake iWARP providers (one engine thread,
//! seeded random delays, listeners per device, connections between devices), a fake
//! `CmDevice` over each, a per-id callback checker, a watchdog, a small PRNG.
#![allow(dead_code)]

use iw_cm::{
    AcceptArgs, ConnectArgs, ConnectReply, ConnectStatus, DisconnectMode, EventSink,
    IncomingRequest, Provider, ProviderError, ProviderEvent,
};
use rdma_cm::{
    CmDevice, CmEvent, CmIdRef, DeviceNotifier, Disposition, EventKind, Ipv4Subnet, NeighborDone,
    NeighborRequest, RdmaCm, ResolveError,
};
use std::cell::Cell;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- the network

thread_local! {
    static ON_ENGINE: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread is the fake network's engine.
pub fn on_engine_thread() -> bool {
    ON_ENGINE.with(|c| c.get())
}

/// A QP of a fake device.
#[derive(Debug)]
pub struct QpObj {
    pub num: u64,
    pub device: String,
    refs: AtomicI64,
    pub errored: AtomicBool,
    pub destroyed: AtomicBool,
}

pub type FakeQp = Arc<QpObj>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Active,
    Passive,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connecting,
    Requested,
    Established,
    Closed,
}

struct LinkState {
    phase: Phase,
    active: Option<EventSink<FakeProvider>>,
    passive: Option<EventSink<FakeProvider>>,
    aborted: bool,
    /// Provider ids of both ends (passive known once requested).
    active_dev: u64,
    passive_dev: Option<u64>,
    last_deadline: Instant,
}

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

#[derive(Clone)]
pub struct FakeConn {
    link: Arc<Link>,
    side: Side,
}

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

#[derive(Default)]
pub struct NetCounters {
    pub qp_refs: AtomicI64,
    pub connects: AtomicU64,
    pub accepts: AtomicU64,
    pub rejects: AtomicU64,
    pub disconnects: AtomicU64,
    pub listens_live: AtomicI64,
    pub report_errors: AtomicU64,
}

pub struct NetInner {
    queue: Mutex<EngineQueue>,
    cv: Condvar,
    idle_cv: Condvar,
    /// (provider id, listen address) -> listener.
    listeners: Mutex<HashMap<(u64, SocketAddr), ListenEntry>>,
    /// provider id -> (its addresses, alive).
    devices: Mutex<HashMap<u64, (Vec<Ipv4Addr>, bool)>>,
    links: Mutex<Vec<std::sync::Weak<Link>>>,
    rng: Mutex<Rng>,
    max_delay_us: AtomicU64,
    next_num: AtomicU64,
    pub links_live: AtomicI64,
    pub counters: NetCounters,
}

/// The fake network and its engine thread.
pub struct FakeNet {
    pub net: Arc<NetInner>,
    engine: Option<JoinHandle<()>>,
}

impl FakeNet {
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
            devices: Mutex::new(HashMap::new()),
            links: Mutex::new(Vec::new()),
            rng: Mutex::new(Rng::new(seed)),
            max_delay_us: AtomicU64::new(max_delay_us),
            next_num: AtomicU64::new(1),
            links_live: AtomicI64::new(0),
            counters: NetCounters::default(),
        });
        let n2 = net.clone();
        let engine = std::thread::Builder::new()
            .name("fake-engine".into())
            .spawn(move || engine_main(n2))
            .unwrap();
        FakeNet {
            net,
            engine: Some(engine),
        }
    }

    /// A provider for a device with these addresses.
    pub fn provider(&self, addrs: Vec<Ipv4Addr>) -> Arc<FakeProvider> {
        let id = self.net.next_num.fetch_add(1, SeqCst);
        self.net.devices.lock().unwrap().insert(id, (addrs, true));
        Arc::new(FakeProvider {
            net: self.net.clone(),
            id,
        })
    }

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

    pub fn listeners(&self) -> usize {
        self.net.listeners.lock().unwrap().len()
    }

    pub fn links_live(&self) -> i64 {
        self.net.links_live.load(SeqCst)
    }

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
        let l: Vec<_> = self.net.listeners.lock().unwrap().drain().collect();
        drop(l);
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
        if max == 0 || rng.chance(50) {
            Duration::ZERO
        } else {
            Duration::from_micros(rng.below(max + 1))
        }
    }

    /// Run `action` on the engine after a random delay, after every earlier action of
    /// the same link.
    fn schedule(&self, link: Option<&Link>, action: Action) {
        let mut t = Instant::now() + self.delay();
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
        if sink.report(ev).is_err() {
            self.counters.report_errors.fetch_add(1, SeqCst);
        }
    }

    fn alive(&self, dev: u64) -> bool {
        self.devices.lock().unwrap().get(&dev).is_some_and(|d| d.1)
    }

    /// The provider that owns `ip` and is alive.
    fn owner_of(&self, ip: Ipv4Addr) -> Option<u64> {
        self.devices
            .lock()
            .unwrap()
            .iter()
            .find(|(_, (addrs, alive))| *alive && addrs.contains(&ip))
            .map(|(id, _)| *id)
    }
}

/// One device's iWARP provider on the fake network.
pub struct FakeProvider {
    pub net: Arc<NetInner>,
    pub id: u64,
}

impl FakeProvider {
    pub fn new_qp(&self, device: &str) -> FakeQp {
        Arc::new(QpObj {
            num: self.net.next_num.fetch_add(1, SeqCst),
            device: device.to_string(),
            refs: AtomicI64::new(0),
            errored: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
        })
    }

    /// The device's link is gone: its connections close (both ends hear CLOSE, or a
    /// Reset reply while connecting), its listeners stop taking requests.
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
                self.net
                    .schedule(Some(&link), Box::new(move || fail_link(&n2, &l2)));
            }
        }
    }
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
                    reports.push((
                        a,
                        ProviderEvent::ConnectReply(ConnectReply::with_status(
                            ConnectStatus::Reset,
                        )),
                    ));
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

fn syn_arrives(net: &Arc<NetInner>, link: &Arc<Link>) {
    let mut reports: Vec<(EventSink<FakeProvider>, ProviderEvent<FakeConn>)> = Vec::new();
    {
        let mut st = link.st.lock().unwrap();
        if st.phase != Phase::Connecting {
            return;
        }
        let reset = |st: &mut LinkState, status| {
            st.phase = Phase::Closed;
            st.active.take().map(|s| {
                (
                    s,
                    ProviderEvent::ConnectReply(ConnectReply::with_status(status)),
                )
            })
        };
        if st.aborted || !net.alive(st.active_dev) {
            reports.extend(reset(&mut st, ConnectStatus::Reset));
        } else {
            let SocketAddr::V4(remote) = link.remote else {
                return;
            };
            let owner = net.owner_of(*remote.ip());
            let listener = owner.and_then(|dev| {
                let l = net.listeners.lock().unwrap();
                l.get(&(dev, link.remote))
                    .or_else(|| {
                        l.get(&(
                            dev,
                            SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, remote.port())),
                        ))
                    })
                    .map(|e| (dev, e.sink.clone()))
            });
            match listener {
                None => reports.extend(reset(&mut st, ConnectStatus::Refused)),
                Some((dev, ls)) => {
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
                            ord: 8,
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
        if !self.net.alive(self.id) {
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
        self.net
            .schedule(Some(&link), Box::new(move || syn_arrives(&n2, &l2)));
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
                                    ord: 8,
                                }),
                            ));
                        }
                        reports.push((sink, ProviderEvent::Established));
                    } else {
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
        if !self.net.alive(self.id) {
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
            Box::new(move || {
                let mut reports = Vec::new();
                {
                    let mut st = link.st.lock().unwrap();
                    match st.phase {
                        Phase::Connecting | Phase::Requested => {
                            if side == Side::Active {
                                st.aborted = true;
                                if st.phase == Phase::Requested {
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

// -------------------------------------------------------------- fake device

/// How a fake device answers neighbour resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Neighbor {
    /// Complete inside `resolve_neighbor`.
    Inline,
    /// Complete from another thread after a short delay.
    Thread(Duration),
    /// Fail with this error, inline.
    Fail(ResolveError),
    /// Never complete (keep the handle): the CM's timeout must fire.
    Never,
    /// Drop the handle without completing.
    Drop,
}

/// A device on the fake network.
pub struct FakeDevice {
    pub name: String,
    pub addrs: Vec<Ipv4Subnet>,
    pub gateway: Option<Ipv4Addr>,
    pub provider: Arc<FakeProvider>,
    pub neighbor: Mutex<Neighbor>,
    pub parked: Mutex<Vec<NeighborDone<FakeDevice>>>,
    pub notifier: Mutex<Option<DeviceNotifier<FakeDevice>>>,
    pub qps_created: AtomicUsize,
    pub qps_errored: AtomicUsize,
    pub qps_destroyed: AtomicUsize,
    pub neighbor_requests: Mutex<Vec<NeighborRequest>>,
    pub released: AtomicBool,
}

impl FakeDevice {
    pub fn new(net: &FakeNet, name: &str, addrs: &[(Ipv4Addr, u8)]) -> Arc<FakeDevice> {
        let provider = net.provider(addrs.iter().map(|a| a.0).collect());
        Arc::new(FakeDevice {
            name: name.to_string(),
            addrs: addrs.iter().map(|&(a, p)| Ipv4Subnet::new(a, p)).collect(),
            gateway: None,
            provider,
            neighbor: Mutex::new(Neighbor::Inline),
            parked: Mutex::new(Vec::new()),
            notifier: Mutex::new(None),
            qps_created: AtomicUsize::new(0),
            qps_errored: AtomicUsize::new(0),
            qps_destroyed: AtomicUsize::new(0),
            neighbor_requests: Mutex::new(Vec::new()),
            released: AtomicBool::new(false),
        })
    }

    pub fn with_gateway(
        net: &FakeNet,
        name: &str,
        addrs: &[(Ipv4Addr, u8)],
        gw: Ipv4Addr,
    ) -> Arc<FakeDevice> {
        let d = FakeDevice::new(net, name, addrs);
        let mut d = Arc::try_unwrap(d).ok().unwrap();
        d.gateway = Some(gw);
        Arc::new(d)
    }

    /// The link goes away: connections fail, then the device reports its removal.
    pub fn unplug(&self) {
        self.provider.go_down();
        if let Some(n) = self.notifier.lock().unwrap().as_ref() {
            n.removed();
        }
    }
}

impl CmDevice for FakeDevice {
    type Provider = FakeProvider;
    type Pd = ();
    type QpInitAttr<'a> = ();

    fn name(&self) -> &str {
        &self.name
    }
    fn addresses(&self) -> Vec<Ipv4Subnet> {
        self.addrs.clone()
    }
    fn gateway(&self) -> Option<Ipv4Addr> {
        self.gateway
    }
    fn provider(&self) -> Arc<FakeProvider> {
        self.provider.clone()
    }
    fn resolve_neighbor(&self, request: NeighborRequest, done: NeighborDone<Self>) {
        assert!(!on_engine_thread());
        self.neighbor_requests.lock().unwrap().push(request);
        let mode = self.neighbor.lock().unwrap().clone();
        match mode {
            Neighbor::Inline => done.complete(Ok(Some([2, 0, 0, 0, 0, 1]))),
            Neighbor::Thread(d) => {
                std::thread::spawn(move || {
                    std::thread::sleep(d);
                    done.complete(Ok(None));
                });
            }
            Neighbor::Fail(e) => done.complete(Err(e)),
            Neighbor::Never => self.parked.lock().unwrap().push(done),
            Neighbor::Drop => drop(done),
        }
    }
    fn create_qp(&self, _: &(), _: ()) -> Result<FakeQp, verbs::VerbsError> {
        if !self.provider.net.alive(self.provider.id) {
            return Err(verbs::VerbsError::DeviceGone);
        }
        self.qps_created.fetch_add(1, SeqCst);
        Ok(self.provider.new_qp(&self.name))
    }
    fn qp_to_error(&self, qp: &FakeQp) {
        self.qps_errored.fetch_add(1, SeqCst);
        qp.errored.store(true, SeqCst);
    }
    fn destroy_qp(&self, qp: FakeQp) {
        self.qps_destroyed.fetch_add(1, SeqCst);
        qp.destroyed.store(true, SeqCst);
    }
    fn attached(&self, notifier: DeviceNotifier<Self>) {
        *self.notifier.lock().unwrap() = Some(notifier);
    }
    fn released(&self) {
        self.released.store(true, SeqCst);
        // The device is gone for good: its address no longer answers.
        self.provider.go_down();
        // Break the device -> notifier -> registry cycle.
        self.notifier.lock().unwrap().take();
        self.parked.lock().unwrap().clear();
    }
}

// ------------------------------------------------------------------ checker

/// Checks that callbacks of one id never overlap and never run on the engine thread,
/// and records every event per id, with a global sequence number.
#[derive(Default)]
pub struct Checker {
    pub seq: AtomicU64,
    state: Mutex<CheckerState>,
    pub violations: Mutex<Vec<String>>,
}

#[derive(Default)]
pub struct CheckerState {
    active: HashMap<u64, u64>,
    pub ids: HashMap<u64, IdLog>,
}

#[derive(Default, Debug, Clone)]
pub struct IdLog {
    /// (seq at entry, event)
    pub events: Vec<(u64, EventKind)>,
    /// Device the id got bound to (AddrResolved / ConnectRequest), by name.
    pub device: Option<String>,
    /// Seq when destroy was asked (destroy entered, or Destroy returned).
    pub destroy_asked: Option<u64>,
    /// Seq when destroy returned (or the Destroy-returning callback returned).
    pub destroyed: Option<u64>,
}

impl Checker {
    pub fn tick(&self) -> u64 {
        self.seq.fetch_add(1, SeqCst) + 1
    }

    /// A callback starts for `id` with `kind`.
    pub fn enter(&self, id: u64, kind: EventKind, device: Option<String>) -> u64 {
        let s = self.tick();
        if on_engine_thread() {
            self.violation(format!("callback of #{id} ran on the engine thread"));
        }
        let mut st = self.state.lock().unwrap();
        if let Some(other) = st.active.insert(id, s) {
            drop(st);
            self.violation(format!(
                "two callbacks at once for #{id} ({kind} while one entered at {other})"
            ));
            st = self.state.lock().unwrap();
        }
        let log = st.ids.entry(id).or_default();
        if let Some(d) = log.destroyed {
            let msg = format!("{kind} delivered to #{id} after its destroy completed (at {d})");
            drop(st);
            self.violation(msg);
            st = self.state.lock().unwrap();
        }
        let log = st.ids.entry(id).or_default();
        if log
            .events
            .iter()
            .any(|(_, k)| *k == EventKind::DeviceRemoval)
        {
            let msg = format!("{kind} delivered to #{id} after its DeviceRemoval");
            drop(st);
            self.violation(msg);
            st = self.state.lock().unwrap();
        }
        let log = st.ids.entry(id).or_default();
        log.events.push((s, kind));
        if matches!(kind, EventKind::AddrResolved | EventKind::ConnectRequest) {
            log.device = device;
        }
        s
    }

    /// The callback returns; `destroy`: it returned Destroy.
    pub fn exit(&self, id: u64, destroy: bool) {
        let mut st = self.state.lock().unwrap();
        st.active.remove(&id);
        if destroy {
            let s = self.tick();
            let log = st.ids.entry(id).or_default();
            log.destroy_asked.get_or_insert(s);
            log.destroyed.get_or_insert(s);
        }
    }

    pub fn destroy_asked(&self, id: u64) {
        let s = self.tick();
        let mut st = self.state.lock().unwrap();
        st.ids.entry(id).or_default().destroy_asked.get_or_insert(s);
    }

    pub fn destroy_done(&self, id: u64) {
        let s = self.tick();
        let mut st = self.state.lock().unwrap();
        st.ids.entry(id).or_default().destroyed.get_or_insert(s);
    }

    pub fn logs(&self) -> HashMap<u64, IdLog> {
        self.state.lock().unwrap().ids.clone()
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

/// A callback that records every event in a channel.
pub fn recording_handler(
    tx: mpsc::Sender<(u64, EventKind, i32)>,
) -> impl Fn(&CmIdRef<FakeDevice>, CmEvent<FakeDevice>) -> Disposition + Send + Sync + 'static {
    let tx = Mutex::new(tx);
    move |id, ev| {
        let _ = tx.lock().unwrap().send((id.serial(), ev.kind, ev.status));
        Disposition::Keep
    }
}

// ------------------------------------------------------- removal accounting

/// A number from the environment (test knobs), or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One device removal, in the checker's sequence numbers.
pub struct RemovalRecord {
    pub device: String,
    pub start: u64,
    pub end: u64,
    /// Reported by the device's notifier with no known end: only "at most one" is
    /// checked.
    pub notified: bool,
}

/// What [`check_removals`] found.
#[derive(Debug, Default)]
pub struct RemovalTally {
    /// `DeviceRemoval` events seen by all ids.
    pub told: usize,
    /// Ids that had to get exactly one (destroy asked after their device's removal).
    pub exactly_one: usize,
    /// Ids that had to get none (destroyed before the removal started).
    pub none_required: usize,
}

/// design.md section 5, rdma-cm rule 3, per id: at most one `DeviceRemoval`; exactly
/// one if its destroy was asked after its device's removal ended; none if it was
/// destroyed before the removal started, or if its device was never removed. Panics
/// naming the id otherwise.
pub fn check_removals(logs: &HashMap<u64, IdLog>, removals: &[RemovalRecord]) -> RemovalTally {
    let mut t = RemovalTally::default();
    for (serial, log) in logs {
        let count = log
            .events
            .iter()
            .filter(|(_, k)| *k == EventKind::DeviceRemoval)
            .count();
        assert!(count <= 1, "#{serial} got {count} DeviceRemoval: {log:?}");
        t.told += count;
        let Some(dev) = &log.device else { continue };
        let Some(r) = removals.iter().find(|r| &r.device == dev) else {
            assert_eq!(
                count, 0,
                "#{serial}: DeviceRemoval of a device never removed"
            );
            continue;
        };
        if r.notified {
            continue;
        }
        let asked = log.destroy_asked.unwrap_or(u64::MAX);
        let done = log.destroyed.unwrap_or(u64::MAX);
        if asked > r.end {
            t.exactly_one += 1;
            assert_eq!(
                count, 1,
                "#{serial} on {dev} (removed {}..{}), destroy asked at {asked}: {log:?}",
                r.start, r.end
            );
        }
        if done < r.start {
            t.none_required += 1;
            assert_eq!(
                count, 0,
                "#{serial} destroyed at {done} before {dev}'s removal at {}: {log:?}",
                r.start
            );
        }
    }
    t
}

// ------------------------------------------------- watchdog, PRNG, polling wait

#[allow(unused_imports)] // each test binary uses a subset
pub use testkit::{eventually, fail_with_dump, Rng, Watchdog};

/// The RDMA CM's dump plus the fake network's counters.
pub fn dump(cm: &RdmaCm<FakeDevice>, net: &FakeNet) -> String {
    format!(
        "{}\nfake net: links {} listeners {} qp_refs {}",
        cm.dump_state(),
        net.links_live(),
        net.listeners(),
        net.qp_refs()
    )
}

/// Wait for quiescence, then check that nothing leaked anywhere.
pub fn assert_clean(cm: &RdmaCm<FakeDevice>, net: &FakeNet) {
    let ok = eventually(Duration::from_secs(10), || {
        net.wait_idle(Duration::from_millis(100));
        let _ = cm.flush();
        let s = cm.stats();
        s.ids_alive == 0
            && s.devices_held == 0
            && s.events_queued == 0
            && s.events_unacked == 0
            && s.jobs_pending == 0
            && net.links_live() == 0
    });
    if !ok {
        panic!("not clean:\n{}", dump(cm, net));
    }
    assert_eq!(net.qp_refs(), 0, "QP references leaked");
    assert_eq!(net.listeners(), 0, "listeners leaked");
    assert_eq!(cm.stats().internal_listeners, 0);
}

pub fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

pub fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}
