//! loom model: the provider reports events from inside downcalls.
//!
//! Rule guarded (design.md section 5, iw-cm rule 1): reporting only enqueues and the
//! CM holds no lock across a downcall, so a provider may report from inside any
//! downcall (connect -> CONNECT_REPLY, disconnect -> CLOSE), on any thread, while a
//! handler and a user thread issue downcalls on the same id: no deadlock, events in
//! order (ConnectReply before Close, Close once). Broken by
//! `IWCM_BREAK=locked-downcalls` (the id's lock held across downcalls).
#![cfg(loom)]

mod loom_support;

use iw_cm::{CmEvent, CmIdRef, ConnectStatus, DisconnectMode, Disposition};
use loom_support::*;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};

#[test]
fn provider_upcall_from_inside_a_downcall() {
    model(|| {
        let nic = Arc::new(Nic::default());
        nic.inline.store(true, SeqCst);
        let cm = cm(&nic);
        let seen: Arc<Mutex<Vec<&'static str>>> = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let id = cm.create_id(move |me: &CmIdRef<Nic>, ev: CmEvent<Nic>| {
            match ev {
                CmEvent::ConnectReply(r) => {
                    assert_eq!(r.status, ConnectStatus::Ok);
                    s2.lock().unwrap().push("reply");
                    // A downcall from the handler whose provider reports CLOSE inline.
                    me.disconnect(DisconnectMode::Abortive).unwrap();
                }
                CmEvent::Close => s2.lock().unwrap().push("close"),
                other => panic!("unexpected {other:?}"),
            }
            Disposition::Keep
        });
        // connect reports CONNECT_REPLY from inside the downcall.
        id.connect(connect_params()).unwrap();
        let id = Arc::new(id);
        let id2 = id.clone();
        // A user thread disconnects concurrently (Busy before the reply, a no-op after
        // the handler's disconnect, or the one that closes).
        let user = loom::thread::spawn(move || {
            let _ = id2.disconnect(DisconnectMode::Graceful);
        });
        user.join().unwrap();
        cm.flush().unwrap();
        assert_eq!(*seen.lock().unwrap(), vec!["reply", "close"]);
        drop(id);
        cm.flush().unwrap();
        let s = cm.stats();
        cm.shutdown().unwrap();
        assert_eq!(s.ids_alive, 0);
        assert_eq!(nic.qp_refs.load(SeqCst), 0);
    });
}
