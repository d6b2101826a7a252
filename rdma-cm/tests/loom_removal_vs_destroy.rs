//! loom model: device removal racing `destroy` from another thread.
//!
//! Rule guarded (design.md section 5, rdma-cm rule 3): for an id on a device being
//! removed, if destroy was asked, nothing is delivered; otherwise exactly one
//! `DeviceRemoval`, serialized with destroy (destroy waits for it); never a callback
//! after `destroy` returned; the device is released only after the id is gone. Broken
//! by `RDMACM_BREAK=removal-after-destroy`.
#![cfg(loom)]

mod loom_support;

use loom_support::*;
use rdma_cm::{CmEvent, CmIdRef, Disposition, EventKind, IdState};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

#[test]
fn removal_racing_destroy_from_another_thread() {
    model(|| {
        let cm = cm();
        let dev = Dev::new("d0", [10, 0, 0, 1]);
        cm.add_device(dev.clone()).unwrap();
        let probe = Arc::new(Probe::default());
        let p2 = probe.clone();
        let id = cm.create_id(move |_: &CmIdRef<Dev>, ev: CmEvent<Dev>| {
            let what = ev.kind.librdmacm_name();
            p2.enter(what);
            if ev.kind == EventKind::DeviceRemoval {
                p2.removals.fetch_add(1, SeqCst);
            }
            p2.exit(what);
            Disposition::Keep
        });
        id.resolve_addr(None, addr("10.0.0.2:1"), T).unwrap();
        cm.flush().unwrap();
        assert_eq!(id.state(), IdState::AddrResolved);
        assert_eq!(probe.calls.load(SeqCst), 1);
        let p3 = probe.clone();
        let user = loom::thread::spawn(move || {
            id.destroy().unwrap();
            p3.freed.store(true, SeqCst);
        });
        let removal = cm.remove_device("d0").unwrap();
        user.join().unwrap();
        assert!(probe.removals.load(SeqCst) <= 1);
        removal.wait().unwrap();
        let s = cm.stats();
        // Visited by the removal (told, or skipped because destroy was asked), or
        // already unbound by destroy when the removal looked: never both, never twice.
        assert!(
            s.device_removals + s.removals_skipped <= 1,
            "the id was visited twice: {s:?}"
        );
        assert_eq!(s.device_removals, probe.removals.load(SeqCst));
        assert_eq!(s.ids_alive, 0, "{s:?}");
        assert_eq!(s.devices_held, 0);
        cm.shutdown().unwrap();
    });
}
