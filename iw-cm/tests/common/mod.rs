//! Test support: the shared fake provider (`iw_cm::testing`, named `Fake` here), a
//! per-id delivery checker, a watchdog, a small PRNG.
#![allow(dead_code)]

use iw_cm::{CmEvent, CmIdRef, IwCm};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

// ------------------------------------------------------------------ fake provider

#[allow(unused_imports)] // each test binary uses a subset
pub use iw_cm::testing::{
    on_engine_thread, FakeConn, FakeCounters, FakeNet, FakeProvider as Fake, FakeQp, QpObj, Side,
};

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
