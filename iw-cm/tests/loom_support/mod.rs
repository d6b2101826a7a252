//! Support for the loom models: a provider with no threads of its own (the models'
//! threads play the device engine), and the rule-break switch.
#![allow(dead_code)]

use iw_cm::{
    AcceptArgs, CmConfig, ConnectArgs, ConnectReply, ConnectStatus, DisconnectMode, EventSink,
    IwCm, Provider, ProviderError, ProviderEvent, RuleBreak,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// The rule to break, from `IWCM_BREAK` (see README.md); `None` normally.
pub fn rule_break() -> Option<RuleBreak> {
    let name = std::env::var("IWCM_BREAK").ok()?;
    Some(RuleBreak::from_name(&name).unwrap_or_else(|| panic!("unknown IWCM_BREAK={name}")))
}

pub fn cm(nic: &Arc<Nic>) -> IwCm<Nic> {
    IwCm::new(
        nic.clone(),
        CmConfig {
            name: "loom".into(),
            workers: 1,
            rule_break: rule_break(),
            ..CmConfig::default()
        },
    )
    .unwrap()
}

/// A provider whose sinks are handed to the model's threads. With `inline`, connect
/// reports `ConnectReply(Ok)` and disconnect reports `Close` from inside the downcall.
#[derive(Default)]
pub struct Nic {
    pub inline: AtomicBool,
    /// The sink of the last connect.
    pub sink: Mutex<Option<EventSink<Nic>>>,
    pub qp_refs: AtomicI64,
    pub disconnects: AtomicUsize,
    pub closed: AtomicBool,
}

impl Nic {
    pub fn take_sink(&self) -> EventSink<Nic> {
        self.sink.lock().unwrap().take().expect("no connect yet")
    }
}

pub fn ok_reply() -> ProviderEvent<u32> {
    ProviderEvent::ConnectReply(ConnectReply::with_status(ConnectStatus::Ok))
}

impl Provider for Nic {
    type Qp = u32;
    type Conn = u32;
    type Listener = ();

    fn connect(
        &self,
        sink: EventSink<Self>,
        _: ConnectArgs<'_, u32>,
    ) -> Result<u32, ProviderError> {
        if self.inline.load(SeqCst) {
            let _ = sink.report(ok_reply());
            // Keep the sink for the inline close.
        }
        *self.sink.lock().unwrap() = Some(sink);
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
        Ok(())
    }
    fn create_listen(
        &self,
        _: EventSink<Self>,
        _: SocketAddr,
        _: u32,
    ) -> Result<(), ProviderError> {
        Ok(())
    }
    fn destroy_listen(&self, _: ()) {}
    fn disconnect(&self, _: &u32, _: Option<&u32>, _: DisconnectMode) -> Result<(), ProviderError> {
        self.disconnects.fetch_add(1, SeqCst);
        if self.inline.load(SeqCst) && !self.closed.swap(true, SeqCst) {
            // Report CLOSE from inside the downcall, then let go of the sink.
            let sink = self.sink.lock().unwrap().take();
            if let Some(sink) = sink {
                let _ = sink.report(ProviderEvent::Close);
            }
        }
        Ok(())
    }
    fn qp_add_ref(&self, _: &u32) {
        self.qp_refs.fetch_add(1, SeqCst);
    }
    fn qp_rem_ref(&self, _: &u32) {
        let before = self.qp_refs.fetch_sub(1, SeqCst);
        assert!(before > 0, "qp_rem_ref without a reference");
    }
}

pub fn connect_params() -> iw_cm::ConnectParams<u32> {
    iw_cm::ConnectParams {
        qp: 7,
        local_addr: None,
        remote_addr: "192.0.2.2:4791".parse().unwrap(),
        private_data: Vec::new(),
        ird: 1,
        ord: 1,
    }
}

/// Counts drops of a handler's captured context.
pub struct DropCount(pub Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// Loom's model builder with a preemption bound (`LOOM_MAX_PREEMPTIONS`, default 3).
pub fn model(f: impl Fn() + Sync + Send + 'static) {
    static ITERATIONS: AtomicUsize = AtomicUsize::new(0);
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
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
