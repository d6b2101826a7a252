//! Test support: the shared fake iWARP network (`iw_cm::testing`: one engine thread,
//! seeded random delays, a provider per device, listeners per device, connections
//! between devices), a fake `CmDevice` over each provider, a per-id callback checker, a
//! watchdog, a small PRNG.
#![allow(dead_code)]

use rdma_cm::{
    CmDevice, CmEvent, CmIdRef, DeviceNotifier, Disposition, EventKind, Ipv4Subnet, NeighborDone,
    NeighborRequest, RdmaCm, ResolveError,
};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

// ---------------------------------------------------------------- the network

#[allow(unused_imports)] // each test binary uses a subset
pub use iw_cm::testing::{
    on_engine_thread, FakeConn, FakeCounters, FakeNet, FakeProvider, FakeQp, NetInner, QpObj, Side,
};

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
        // The peers of these tests report IRD 16, ORD 8 (tests/api.rs checks them).
        net.set_ord(8);
        let provider = net.provider_for(addrs.iter().map(|a| a.0).collect());
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
        if !self.provider.alive() {
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
