//! loom model: `destroy` racing a callback in progress on the same id.
//!
//! Rule guarded (design.md section 5, rdma-cm rule 2): `destroy` waits until any
//! callback in progress on that id has returned; after it returns no callback of the
//! id runs, so the user may free the id's context. The model frees the context right
//! after `destroy` returns; the callback checks it on entry and on exit. Broken by
//! `RDMACM_BREAK=destroy-no-wait`.
#![cfg(loom)]

mod loom_support;

use loom_support::*;
use rdma_cm::{CmEvent, CmIdRef, Disposition};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

#[test]
fn destroy_waits_for_the_callback_in_progress() {
    model(|| {
        let cm = cm();
        let dev = Dev::new("d0", [10, 0, 0, 1]);
        cm.add_device(dev.clone()).unwrap();
        let probe = Arc::new(Probe::default());
        let p2 = probe.clone();
        let id = cm.create_id(move |_: &CmIdRef<Dev>, ev: CmEvent<Dev>| {
            let what = ev.kind.librdmacm_name();
            p2.enter(what);
            p2.exit(what);
            Disposition::Keep
        });
        // The worker delivers AddrResolved while this thread destroys the id.
        id.resolve_addr(None, addr("10.0.0.2:1"), T).unwrap();
        id.destroy().unwrap();
        probe.freed.store(true, SeqCst);
        cm.flush().unwrap();
        assert!(probe.calls.load(SeqCst) <= 1);
        cm.remove_device("d0").unwrap().wait().unwrap();
        let s = cm.stats();
        assert_eq!(s.ids_alive, 0, "{s:?}");
        assert_eq!(s.devices_held, 0);
        cm.shutdown().unwrap();
    });
}
