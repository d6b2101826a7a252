//! loom model: destroy racing event delivery.
//!
//! Rule guarded (design.md section 5, iw-cm rule 3): once `destroy` has returned with
//! no delivery in progress, the id's handler never runs again (`IWCM_F_DROP_EVENTS`),
//! and the memory is freed exactly once, at the last reference, with the QP released
//! and the handler's context dropped exactly once. Broken by
//! `IWCM_BREAK=deliver-after-destroy`.
#![cfg(loom)]

mod loom_support;

use iw_cm::{CmEvent, CmIdRef, Disposition, ProviderEvent};
use loom_support::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

#[test]
fn destroy_racing_delivery() {
    model(|| {
        let nic = Arc::new(Nic::default());
        let cm = cm(&nic);
        let quiet = Arc::new(AtomicBool::new(false));
        let late = Arc::new(AtomicUsize::new(0));
        let ctx_drops = Arc::new(AtomicUsize::new(0));
        let (q2, l2, ctx) = (quiet.clone(), late.clone(), DropCount(ctx_drops.clone()));
        let id = cm.create_id(move |_: &CmIdRef<Nic>, _: CmEvent<Nic>| {
            let _ = &ctx;
            if q2.load(SeqCst) {
                l2.fetch_add(1, SeqCst);
            }
            Disposition::Keep
        });
        id.connect(connect_params()).unwrap();
        let sink = nic.take_sink();
        // The device engine reports the reply and the close while the user destroys.
        let engine = loom::thread::spawn(move || {
            let _ = sink.report(ok_reply());
            let _ = sink.report(ProviderEvent::Close);
        });
        let d = id.destroy();
        if !d.delivery_in_progress() {
            quiet.store(true, SeqCst);
        }
        drop(d);
        engine.join().unwrap();
        cm.flush().unwrap();
        let stats_cm = cm.stats();
        cm.shutdown().unwrap();
        assert_eq!(
            late.load(SeqCst),
            0,
            "an event was delivered after destroy returned"
        );
        assert_eq!(
            ctx_drops.load(SeqCst),
            1,
            "handler context dropped exactly once"
        );
        assert_eq!(nic.qp_refs.load(SeqCst), 0, "QP reference released");
        assert_eq!(stats_cm.ids_created, 1);
        assert_eq!(
            stats_cm.ids_freed, 1,
            "freed exactly once, at the last reference"
        );
        assert_eq!(stats_cm.ids_alive, 0);
        assert_eq!(stats_cm.events_queued, 0);
    });
}
