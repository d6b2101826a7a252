//! Support for the loom models: a thread-less iWARP provider and a device over it
//! (the model's threads play the device engine), a callback checker made of loom
//! atomics (so that the checks are scheduling points), and the rule-break switch.
#![allow(dead_code)]

use iw_cm::{AcceptArgs, ConnectArgs, DisconnectMode, EventSink, Provider, ProviderError};
use loom::sync::atomic::{AtomicBool, AtomicUsize};
use rdma_cm::{
    CmDevice, Ipv4Subnet, NeighborDone, NeighborRequest, RdmaCm, RdmaCmConfig, RuleBreak,
};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};

/// The rule to break, from `RDMACM_BREAK` (see README.md); `None` normally.
pub fn rule_break() -> Option<RuleBreak> {
    let name = std::env::var("RDMACM_BREAK").ok()?;
    Some(RuleBreak::from_name(&name).unwrap_or_else(|| panic!("unknown RDMACM_BREAK={name}")))
}

pub fn cm() -> RdmaCm<Dev> {
    RdmaCm::new(RdmaCmConfig {
        name: "loom".into(),
        rule_break: rule_break(),
        ..RdmaCmConfig::default()
    })
    .unwrap()
}

/// A provider with no threads: listen sinks are kept for the model to report on.
#[derive(Default)]
pub struct Nic {
    pub listen_sinks: Mutex<Vec<EventSink<Nic>>>,
    pub listens_live: std::sync::atomic::AtomicI64,
    pub rejects: std::sync::atomic::AtomicUsize,
}

impl Nic {
    pub fn listen_sink(&self) -> EventSink<Nic> {
        self.listen_sinks.lock().unwrap()[0].clone()
    }
}

impl Provider for Nic {
    type Qp = u32;
    type Conn = u32;
    type Listener = ();

    fn connect(&self, _: EventSink<Self>, _: ConnectArgs<'_, u32>) -> Result<u32, ProviderError> {
        Ok(1)
    }
    fn accept(
        &self,
        _: EventSink<Self>,
        _: &u32,
        _: AcceptArgs<'_, u32>,
    ) -> Result<(), ProviderError> {
        Ok(())
    }
    fn reject(&self, _: &u32, _: &[u8]) -> Result<(), ProviderError> {
        self.rejects.fetch_add(1, SeqCst);
        Ok(())
    }
    fn create_listen(
        &self,
        sink: EventSink<Self>,
        _: SocketAddr,
        _: u32,
    ) -> Result<(), ProviderError> {
        self.listen_sinks.lock().unwrap().push(sink);
        self.listens_live.fetch_add(1, SeqCst);
        Ok(())
    }
    fn destroy_listen(&self, _: ()) {
        self.listen_sinks.lock().unwrap().clear();
        self.listens_live.fetch_sub(1, SeqCst);
    }
    fn disconnect(&self, _: &u32, _: Option<&u32>, _: DisconnectMode) -> Result<(), ProviderError> {
        Ok(())
    }
    fn qp_add_ref(&self, _: &u32) {}
    fn qp_rem_ref(&self, _: &u32) {}
}

/// A device: one /24 address, neighbour resolution completes inline.
pub struct Dev {
    pub name: String,
    pub addr: Ipv4Addr,
    pub nic: Arc<Nic>,
    pub qps_errored: std::sync::atomic::AtomicUsize,
}

impl Dev {
    pub fn new(name: &str, addr: [u8; 4]) -> Arc<Dev> {
        Arc::new(Dev {
            name: name.to_string(),
            addr: addr.into(),
            nic: Arc::new(Nic::default()),
            qps_errored: Default::default(),
        })
    }
}

impl CmDevice for Dev {
    type Provider = Nic;
    type Pd = ();
    type QpInitAttr<'a> = ();

    fn name(&self) -> &str {
        &self.name
    }
    fn addresses(&self) -> Vec<Ipv4Subnet> {
        vec![Ipv4Subnet::new(self.addr, 24)]
    }
    fn provider(&self) -> Arc<Nic> {
        self.nic.clone()
    }
    fn resolve_neighbor(&self, _: NeighborRequest, done: NeighborDone<Self>) {
        done.complete(Ok(None));
    }
    fn create_qp(&self, _: &(), _: ()) -> Result<u32, verbs::VerbsError> {
        Ok(7)
    }
    fn qp_to_error(&self, _: &u32) {
        self.qps_errored.fetch_add(1, SeqCst);
    }
}

/// Per-id callback checks made of loom atomics: "a callback of this id is running",
/// "the user freed the id's context" (after destroy returned, or after a callback
/// returned Destroy), and counts.
#[derive(Default)]
pub struct Probe {
    pub inside: AtomicBool,
    pub freed: AtomicBool,
    pub calls: AtomicUsize,
    pub removals: AtomicUsize,
    pub connect_requests: AtomicUsize,
}

impl Probe {
    /// A callback starts: it must be alone on its id, and the id's context must still
    /// be the user's.
    pub fn enter(&self, what: &str) {
        assert!(
            !self.freed.load(SeqCst),
            "{what} delivered after the user was told no callback would follow (destroy returned, or a callback returned Destroy)"
        );
        assert!(
            !self.inside.swap(true, SeqCst),
            "{what} delivered while another callback of the same id was running"
        );
        self.calls.fetch_add(1, SeqCst);
    }

    /// The callback ends (a scheduling point between enter and exit).
    pub fn exit(&self, what: &str) {
        assert!(
            !self.freed.load(SeqCst),
            "the user freed the id's context while its {what} callback was still running"
        );
        self.inside.store(false, SeqCst);
    }
}

/// Loom's model builder with a preemption bound (`LOOM_MAX_PREEMPTIONS`, default 2
/// here) and a report of how many interleavings were explored.
pub fn model(f: impl Fn() + Sync + Send + 'static) {
    static ITERATIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    ITERATIONS.store(0, SeqCst);
    b.check(move || {
        ITERATIONS.fetch_add(1, SeqCst);
        f()
    });
    eprintln!(
        "loom: {} interleavings explored (preemption bound {:?})",
        ITERATIONS.load(SeqCst),
        b.preemption_bound
    );
}

pub fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

pub const T: std::time::Duration = std::time::Duration::from_secs(1);
