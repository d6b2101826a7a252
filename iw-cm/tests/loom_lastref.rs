//! loom model: the last reference is dropped on either side.
//!
//! Rule guarded (design.md section 5, iw-cm rule 3, Steve Wise 2016): an id is freed
//! when its last reference goes, whichever side drops it: the user (destroy / drop of
//! `CmId`) or the provider (its `EventSink`, after reporting), with a worker job in
//! between. Nothing touches the id after it is freed, and it is freed exactly once.
//! Broken by `IWCM_BREAK=eager-free` (storage released at destroy while the provider
//! still holds a reference: the provider's later report is a use-after-free).
#![cfg(loom)]

mod loom_support;

use iw_cm::{CmEvent, CmIdRef, ConnectReply, ConnectStatus, Disposition, ProviderEvent};
use loom_support::*;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

#[test]
fn last_reference_dropped_on_either_side() {
    model(|| {
        let nic = Arc::new(Nic::default());
        let cm = cm(&nic);
        let id = cm.create_id(|_: &CmIdRef<Nic>, _: CmEvent<Nic>| Disposition::Keep);
        id.connect(connect_params()).unwrap();
        let sink = nic.take_sink();
        // The engine answers (the attempt was reset) and lets go of its reference...
        let engine = loom::thread::spawn(move || {
            let _ = sink.report(ProviderEvent::ConnectReply(ConnectReply::with_status(
                ConnectStatus::Reset,
            )));
            drop(sink);
        });
        // ...while the user drops its handle (destroy + creator's reference).
        drop(id);
        engine.join().unwrap();
        cm.flush().unwrap();
        let s = cm.stats();
        cm.shutdown().unwrap();
        assert_eq!(s.ids_created, 1);
        assert_eq!(s.ids_freed, 1, "freed exactly once");
        assert_eq!(s.ids_alive, 0);
        assert_eq!(s.events_queued, 0);
        assert_eq!(nic.qp_refs.load(SeqCst), 0);
    });
}
