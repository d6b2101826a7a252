//! loom model: the 2007 seed scenario — device removal racing a callback that returns
//! "destroy".
//!
//! Rule guarded (design.md section 5, rdma-cm rules 1-3; Sean Hefty: "once the user
//! has returned a non-zero value no further callbacks can occur"): removal takes the
//! id's callback serialization; if the callback in progress returned Destroy, no
//! `DeviceRemoval` is delivered; the device is released once the id is gone. Broken by
//! `RDMACM_BREAK=removal-after-destroy` (removal ignores DESTROYING) and by
//! `RDMACM_BREAK=unserialized-removal` (removal does not take the handler lock).
#![cfg(loom)]

mod loom_support;

use loom_support::*;
use rdma_cm::{CmEvent, CmIdRef, Disposition, EventKind};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

#[test]
fn removal_racing_a_callback_that_returns_destroy() {
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
            // The user frees its context as it returns Destroy: nothing may follow.
            p2.freed.store(true, SeqCst);
            Disposition::Destroy
        });
        // The worker delivers AddrResolved (or AddrError if removal came first) and
        // the callback returns Destroy, while this thread removes the device.
        id.resolve_addr(None, addr("10.0.0.2:1"), T).unwrap();
        let removal = cm.remove_device("d0").unwrap();
        cm.flush().unwrap();
        assert_eq!(
            probe.calls.load(SeqCst),
            1,
            "exactly one callback, then nothing"
        );
        assert_eq!(probe.removals.load(SeqCst), 0);
        drop(id); // the user's handle: the id is already destroyed
        removal.wait().unwrap();
        let s = cm.stats();
        assert_eq!(s.ids_alive, 0, "{s:?}");
        assert_eq!(s.devices_held, 0);
        assert_eq!(
            s.device_removals, 0,
            "DeviceRemoval delivered to an id destroyed by its callback's return"
        );
        cm.shutdown().unwrap();
    });
}
