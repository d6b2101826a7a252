//! rdma-core loads on this machine (libibverbs1 and librdmacm1 44 are
//! installed here and in CI), the device list is readable (empty without a
//! kernel RDMA device), and a device name that matches nothing is a one-line
//! error naming what was found. Where rdma-core is not installed (and `CI` is
//! not set) the test prints one line and passes.

use cxgb4::{Context, Error, EventChannel, LoadError, RdmaCore};
use std::sync::Arc;
use verbs::VerbsError;

fn load() -> Option<Arc<RdmaCore>> {
    match RdmaCore::load() {
        Ok(core) => Some(Arc::new(core)),
        Err(e @ LoadError::NotFound { .. }) if std::env::var_os("CI").is_none() => {
            assert_eq!(e.to_string(), "rdma-core (libibverbs.so.1) not found");
            println!("skipped: {e}");
            None
        }
        Err(e) => panic!("RdmaCore::load failed: {e}"),
    }
}

#[test]
fn loads_and_lists_devices() {
    let Some(core) = load() else { return };
    let devs = cxgb4::devices(&core).expect("device list readable");
    for d in &devs {
        assert!(!d.name.is_empty());
        println!(
            "device {} {:?} node type {}",
            d.name, d.transport, d.node_type
        );
    }
    // Twice gives the same list (the list is copied and freed each time).
    assert_eq!(cxgb4::devices(&core).unwrap(), devs);
}

#[test]
fn unknown_device_name_is_one_line_with_the_names_found() {
    let Some(core) = load() else { return };
    let found: Vec<String> = cxgb4::devices(&core)
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    let err = Context::open(&core, "nonexistent_rdma9").unwrap_err();
    assert_eq!(
        err,
        Error::NoSuchDevice {
            name: "nonexistent_rdma9".into(),
            found: found.clone()
        }
    );
    let line = err.to_string();
    assert!(
        line.starts_with("no RDMA device named 'nonexistent_rdma9' (found: "),
        "{line}"
    );
    if found.is_empty() {
        assert_eq!(
            line,
            "no RDMA device named 'nonexistent_rdma9' (found: none)"
        );
    } else {
        assert!(line.ends_with(&format!("{})", found.join(", "))), "{line}");
    }
    assert!(!line.contains('\n'));
    assert_eq!(err.errno(), 19);
}

#[test]
fn cm_without_a_device_is_an_error_not_a_panic() {
    let Some(core) = load() else { return };
    // Without rdma_ucm (as here) librdmacm fails with ENODEV; with it, the
    // channel opens and an id can be made and dropped.
    match EventChannel::new(&core) {
        Ok(chan) => {
            assert!(chan.fd() >= 0);
            let id = chan.create_id().unwrap();
            assert_eq!(id.local_addr(), None, "not bound yet");
            assert!(id.context().is_none());
        }
        Err(e) => assert_eq!(e, Error::Verbs(VerbsError::NoDevice), "{e}"),
    }
    // librdmacm's device sync: no device (ENODEV) counts as 0.
    let n = cxgb4::release_cached_devices(&core).unwrap();
    assert_eq!(n, cxgb4::devices(&core).unwrap().len());
}
