//! loom model: a wildcard listener on two devices; one device is removed while a
//! connection request from it is being delivered.
//!
//! Rules guarded (design.md section 5, rdma-cm rules 1 and 3): the removed device's
//! internal listener is destroyed silently — the user's listener gets no
//! `DeviceRemoval` and keeps listening on the other device; the new id of the request
//! is bound to the removed device before anyone can see it and gets exactly one
//! `DeviceRemoval`, after its `ConnectRequest` callback returned (never during it) —
//! or, if removal came first, the request is rejected and nothing is delivered; the
//! device is released once the new id is destroyed. Broken by
//! `RDMACM_BREAK=removal-hits-wildcard` and `RDMACM_BREAK=unserialized-removal`.
#![cfg(loom)]

mod loom_support;

use iw_cm::{IncomingRequest, ProviderEvent};
use loom_support::*;
use rdma_cm::{CmEvent, CmId, CmIdRef, Disposition, EventKind, IdState};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};

#[test]
fn wildcard_listener_survives_removal_during_a_connect_request() {
    model(|| {
        let cm = cm();
        let d0 = Dev::new("d0", [10, 0, 0, 1]);
        let d1 = Dev::new("d1", [10, 0, 1, 1]);
        cm.add_device(d0.clone()).unwrap();
        cm.add_device(d1.clone()).unwrap();
        let listener_probe = Arc::new(Probe::default());
        let child_probe = Arc::new(Probe::default());
        let kept: Arc<Mutex<Option<CmId<Dev>>>> = Arc::default();
        let listener_serial = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (lp, cp, k2, ls) = (
            listener_probe.clone(),
            child_probe.clone(),
            kept.clone(),
            listener_serial.clone(),
        );
        let listener = cm.create_id(move |id: &CmIdRef<Dev>, mut ev: CmEvent<Dev>| {
            let what = ev.kind.librdmacm_name();
            let is_listener = id.serial() == ls.load(SeqCst);
            let probe = if is_listener { &lp } else { &cp };
            match ev.kind {
                EventKind::ConnectRequest => {
                    // Runs for the new id, under the listener's serialization too.
                    lp.enter(what);
                    cp.enter(what);
                    cp.connect_requests.fetch_add(1, SeqCst);
                    *k2.lock().unwrap() = ev.take_new_id();
                    cp.exit(what);
                    lp.exit(what);
                }
                EventKind::DeviceRemoval => {
                    probe.enter(what);
                    probe.removals.fetch_add(1, SeqCst);
                    probe.exit(what);
                }
                _ => {
                    probe.enter(what);
                    probe.exit(what);
                }
            }
            Disposition::Keep
        });
        listener_serial.store(listener.serial(), SeqCst);
        listener.bind_addr(addr("0.0.0.0:7000")).unwrap();
        listener.listen(4).unwrap();
        assert_eq!(cm.stats().internal_listeners, 2);
        // d0's engine reports a connection request (enqueue only: d0's iWARP CM worker
        // delivers it) while this thread removes d0.
        let _ = d0
            .nic
            .listen_sink()
            .report(ProviderEvent::ConnectRequest(IncomingRequest {
                conn: 5,
                private_data: Vec::new(),
                ird: 1,
                ord: 1,
                local_addr: addr("10.0.0.1:7000"),
                remote_addr: addr("10.0.0.9:4000"),
            }));
        let removal = cm.remove_device("d0").unwrap();
        // Let d0's iWARP CM deliver or drop the request.
        let child = loop {
            if let Some(c) = kept.lock().unwrap().take() {
                break Some(c);
            }
            if d0.nic.rejects.load(SeqCst) > 0 {
                break None;
            }
            loom::thread::yield_now();
        };
        let requests = child_probe.connect_requests.load(SeqCst);
        match child {
            Some(child) => {
                assert_eq!(requests, 1);
                assert_eq!(child.state(), IdState::DeviceRemoval);
                assert_eq!(
                    child_probe.removals.load(SeqCst),
                    1,
                    "the new id of d0 gets exactly one DeviceRemoval"
                );
                assert!(!removal.is_released(), "released while an id is bound");
                child.destroy().unwrap();
            }
            None => assert_eq!(requests, 0, "a rejected request must not be delivered"),
        }
        removal.wait().unwrap();
        assert_eq!(
            listener_probe.removals.load(SeqCst),
            0,
            "the wildcard listener must not get DeviceRemoval"
        );
        assert_eq!(listener.state(), IdState::Listen);
        assert_eq!(cm.stats().internal_listeners, 1, "still listening on d1");
        assert_eq!(d1.nic.listens_live.load(SeqCst), 1);
        assert_eq!(d0.nic.listens_live.load(SeqCst), 0);
        listener.destroy().unwrap();
        cm.remove_device("d1").unwrap().wait().unwrap();
        let s = cm.stats();
        assert_eq!(s.ids_alive, 0, "{s:?}");
        assert_eq!(s.devices_held, 0);
        cm.shutdown().unwrap();
    });
}
