//! A connect request that no worker will ever deliver (the CM was shut down) is still
//! rejected at the provider: design.md section 5, iw-cm rule 2 ("never dropped
//! silently"). Found by an adversarial run: before the fix the provider's `reject` was
//! never called and the peer's half-open connection hung. And it is rejected off the
//! reporting thread, which may be the provider's engine (`EventSink`: a report never
//! calls the provider): the rdma-cm stress test's fake engine once caught a reject
//! made on it.
#![cfg(not(loom))]

use iw_cm::*;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// A provider that only logs its downcalls and keeps the sinks it is given.
#[derive(Default)]
struct Logger {
    sinks: Mutex<Vec<EventSink<Logger>>>,
    log: Mutex<Vec<String>>,
    reject_threads: Mutex<Vec<std::thread::ThreadId>>,
}

impl Logger {
    fn push(&self, s: String) {
        self.log.lock().unwrap().push(s);
    }
    fn rejects(&self) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter()
            .filter(|s| s.starts_with("reject"))
            .cloned()
            .collect()
    }
}

impl Provider for Logger {
    type Qp = u32;
    type Conn = u32;
    type Listener = ();
    fn connect(&self, s: EventSink<Self>, _: ConnectArgs<'_, u32>) -> Result<u32, ProviderError> {
        self.sinks.lock().unwrap().push(s);
        Ok(100)
    }
    fn accept(
        &self,
        s: EventSink<Self>,
        _: &u32,
        _: AcceptArgs<'_, u32>,
    ) -> Result<(), ProviderError> {
        self.sinks.lock().unwrap().push(s);
        Ok(())
    }
    fn reject(&self, c: &u32, _: &[u8]) -> Result<(), ProviderError> {
        self.push(format!("reject {c}"));
        self.reject_threads
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        Ok(())
    }
    fn create_listen(
        &self,
        s: EventSink<Self>,
        _: SocketAddr,
        _: u32,
    ) -> Result<(), ProviderError> {
        self.sinks.lock().unwrap().push(s);
        Ok(())
    }
    fn destroy_listen(&self, _: ()) {}
    fn disconnect(&self, _: &u32, _: Option<&u32>, _: DisconnectMode) -> Result<(), ProviderError> {
        Ok(())
    }
    fn qp_add_ref(&self, _: &u32) {}
    fn qp_rem_ref(&self, _: &u32) {}
}

fn request(conn: u32) -> ProviderEvent<u32> {
    ProviderEvent::ConnectRequest(IncomingRequest {
        conn,
        private_data: vec![],
        ird: 1,
        ord: 1,
        local_addr: "10.0.0.1:1".parse().unwrap(),
        remote_addr: "10.0.0.2:2".parse().unwrap(),
    })
}

#[test]
fn a_request_reported_after_shutdown_is_rejected_at_the_provider() {
    let p = Arc::new(Logger::default());
    let cm = IwCm::new(
        p.clone(),
        CmConfig {
            workers: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let listener = cm.create_id(|_: &CmIdRef<Logger>, _: CmEvent<Logger>| Disposition::Keep);
    listener.listen("10.0.0.1:1".parse().unwrap(), 8).unwrap();
    let sink = p.sinks.lock().unwrap()[0].clone();
    drop(cm); // the workers exit
    assert!(sink.report(request(9)).is_err(), "the CM is shut down");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while p.rejects().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(p.rejects(), vec!["reject 9".to_string()]);
    let threads = p.reject_threads.lock().unwrap().clone();
    assert_eq!(threads.len(), 1);
    assert_ne!(
        threads[0],
        std::thread::current().id(),
        "rejected on the reporting thread"
    );
    drop(listener);
}
