//! loom model: destroy from inside the id's own handler, racing the provider's
//! reports.
//!
//! Rule guarded (design.md section 5, iw-cm rule 3): destroy never blocks on the event
//! path, so destroying an id from inside its own handler (by `CmId::destroy` or by
//! returning `Disposition::Destroy`) cannot deadlock; waiting there is refused with
//! `InDeliveryContext`; nothing is delivered afterwards; memory freed at the last
//! reference. Broken by `IWCM_BREAK=blocking-destroy` (destroy waits for the delivery
//! in progress, as the kernel's iw_destroy_cm_id did before 2016).
#![cfg(loom)]

mod loom_support;

use iw_cm::{CmError, CmEvent, CmId, CmIdRef, Disposition, ProviderEvent};
use loom_support::*;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

#[test]
fn destroy_from_inside_the_handler() {
    model(|| {
        let nic = Arc::new(Nic::default());
        let cm = cm(&nic);
        let slot: Arc<Mutex<Option<CmId<Nic>>>> = Arc::new(Mutex::new(None));
        let calls = Arc::new(AtomicUsize::new(0));
        let (s2, c2) = (slot.clone(), calls.clone());
        let id = cm.create_id(move |me: &CmIdRef<Nic>, _: CmEvent<Nic>| {
            c2.fetch_add(1, SeqCst);
            let mine = s2.lock().unwrap().take();
            let mine = mine.expect("delivered after the handler destroyed the id");
            assert_eq!(mine.serial(), me.serial());
            let d = mine.destroy();
            assert!(d.delivery_in_progress());
            assert_eq!(
                d.wait(),
                Err(CmError::InDeliveryContext {
                    op: "Destroyed::wait"
                })
            );
            Disposition::Keep
        });
        id.connect(connect_params()).unwrap();
        let sink = nic.take_sink();
        *slot.lock().unwrap() = Some(id);
        let engine = loom::thread::spawn(move || {
            let _ = sink.report(ok_reply());
            let _ = sink.report(ProviderEvent::Close);
        });
        engine.join().unwrap();
        cm.flush().unwrap();
        let s = cm.stats();
        cm.shutdown().unwrap();
        assert_eq!(calls.load(SeqCst), 1, "exactly one delivery, then nothing");
        assert_eq!(s.ids_freed, 1);
        assert_eq!(s.ids_alive, 0);
        assert_eq!(nic.qp_refs.load(SeqCst), 0);
    });
}

#[test]
fn handler_returning_destroy() {
    model(|| {
        let nic = Arc::new(Nic::default());
        let cm = cm(&nic);
        let calls = Arc::new(AtomicUsize::new(0));
        let c2 = calls.clone();
        let id = cm.create_id(move |_: &CmIdRef<Nic>, _: CmEvent<Nic>| {
            c2.fetch_add(1, SeqCst);
            Disposition::Destroy
        });
        id.connect(connect_params()).unwrap();
        let sink = nic.take_sink();
        let engine = loom::thread::spawn(move || {
            let _ = sink.report(ok_reply());
            let _ = sink.report(ProviderEvent::Close);
        });
        // The user drops its handle at any moment: destroy is idempotent.
        drop(id);
        engine.join().unwrap();
        cm.flush().unwrap();
        let s = cm.stats();
        cm.shutdown().unwrap();
        assert!(calls.load(SeqCst) <= 1);
        assert_eq!(s.ids_freed, 1);
        assert_eq!(s.ids_alive, 0);
        assert_eq!(nic.qp_refs.load(SeqCst), 0);
    });
}
