//! Devices with real engine threads on a memory link: listen / connect / accept, 64 MiB
//! of ULPDUs verified by checksum, close; link removal reported as a device event with
//! every connection failed within 100 ms; an idle engine does not spin.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use softiwarp::link::{GoneReason, MemoryControl};
use softiwarp::transport::stream::{RecvError, SendError};
use softiwarp::transport::{CloseMode, ConnError, ConnEvent, MpaParams, StackError};
use softiwarp::{ConnectError, Connection, Device, DeviceConfig, LinkConfig, ListenError};
use softiwarp::{DeviceEnd, DeviceEvent};

use crate::support::{links, thread_ticks, ticks_per_second, Rng, RngExt};

const PORT: u16 = 4791;
const T: Duration = Duration::from_secs(10);

fn addr(host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 88, 0, host)
}

/// Two devices on a memory link pair: (client .1, server .2, control of the client's end).
fn devices(mtu: usize) -> (Device, Device, MemoryControl) {
    let (a, b) = links(mtu);
    let ctl = a.control();
    let client =
        Device::open(DeviceConfig::new("cli", LinkConfig::memory(a), addr(1), 24)).unwrap();
    let server =
        Device::open(DeviceConfig::new("srv", LinkConfig::memory(b), addr(2), 24)).unwrap();
    (client, server, ctl)
}

fn params(pd: &[u8]) -> MpaParams {
    MpaParams {
        private_data: pd.to_vec(),
        ird: 4,
        ord: 4,
        settings: None,
    }
}

/// Connects `client` to `server`'s listener and accepts: (client side, server side).
fn pair(client: &Device, listener: &softiwarp::Listener) -> (Connection, Connection) {
    let c = client.connect(addr(2), PORT, params(b"x")).unwrap();
    let r = listener.next_request(T).unwrap();
    let s = r.accept(b"y", 4, 4).unwrap();
    c.wait_established(T).unwrap();
    s.wait_established(T).unwrap();
    (c, s)
}

/// A word-wise 64-bit hash of a byte stream; each ULPDU is fed whole.
#[derive(Default)]
struct Hash {
    h: u64,
}

impl Hash {
    fn feed(&mut self, data: &[u8]) {
        for c in data.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.h = (self.h ^ u64::from_le_bytes(w))
                .wrapping_mul(0x0100_0000_01b3)
                .rotate_left(17);
        }
        self.h ^= data.len() as u64;
    }
}

#[test]
fn listen_connect_accept_64mib_close() {
    let (client, server, _ctl) = devices(1500);
    let listener = server.listen(PORT, 8).unwrap();
    let c = client.connect(addr(2), PORT, params(b"client pd")).unwrap();
    let r = listener.next_request(T).unwrap();
    assert_eq!(r.private_data(), b"client pd");
    assert_eq!(r.ird_ord(), Some((4, 4)));
    assert_eq!(r.remote().ip(), &addr(1));
    let s = r.accept(b"server pd", 2, 2).unwrap();
    let est = c.wait_established(T).unwrap();
    assert_eq!(est.agreed.peer_private_data, b"server pd");
    assert_eq!(c.agreed().unwrap().ord, 2);
    let mulpdu = c.mulpdu().unwrap();
    assert_eq!(mulpdu, 1454);
    assert!(matches!(c.next_event(T), Some(ConnEvent::Established(_))));

    const TOTAL: usize = 64 << 20;
    let start = Instant::now();
    let sender = std::thread::spawn(move || {
        let mut hash = Hash::default();
        let mut rng = Rng::new(0x1234_5678_9abc_def1);
        let mut sent = 0usize;
        let mut n = 0u64;
        while sent < TOTAL {
            // Mostly full-sized ULPDUs, every 7th a short one.
            let len = if n % 7 == 6 {
                1 + (n as usize * 131) % mulpdu
            } else {
                mulpdu
            };
            let len = len.min(TOTAL - sent);
            let mut u = vec![0u8; len];
            rng.fill(&mut u);
            hash.feed(&u);
            c.send_ulpdu_vec(u, T).unwrap();
            sent += len;
            n += 1;
        }
        (c, hash.h, n)
    });
    let mut hash = Hash::default();
    let mut got = 0usize;
    let mut ulpdus = 0u64;
    while got < TOTAL {
        let u = s.recv_ulpdu(T).unwrap();
        hash.feed(&u);
        got += u.len();
        ulpdus += 1;
    }
    let elapsed = start.elapsed();
    let (c, sent_hash, sent_ulpdus) = sender.join().unwrap();
    assert_eq!(got, TOTAL);
    assert_eq!(ulpdus, sent_ulpdus);
    assert_eq!(hash.h, sent_hash, "checksum mismatch");
    println!(
        "64 MiB in {ulpdus} ULPDUs over the memory link: {elapsed:?}, {:.0} MB/s",
        TOTAL as f64 / elapsed.as_secs_f64() / 1e6
    );

    c.close(CloseMode::Graceful).unwrap();
    assert_eq!(c.wait_ended(T), Some(None));
    assert_eq!(s.wait_ended(T), Some(None));
    let ev: Vec<ConnEvent> = std::iter::from_fn(|| s.next_event(Duration::ZERO)).collect();
    assert!(matches!(ev.first(), Some(ConnEvent::Established(_))));
    assert_eq!(&ev[1..], &[ConnEvent::Disconnected, ConnEvent::Closed]);
    assert_eq!(s.recv_ulpdu(Duration::ZERO), Err(RecvError::Closed));
    assert_eq!(c.try_send_ulpdu(b"late"), Err(SendError::Closed));
    assert!(matches!(
        c.close(CloseMode::Graceful),
        Err(softiwarp::DeviceError::Stack(StackError::WrongState { .. }))
            | Err(softiwarp::DeviceError::Stack(StackError::NoSuchConnection(
                _
            )))
    ));
}

#[test]
fn link_removal_fails_every_connection_within_100ms() {
    let (client, server, ctl) = devices(1500);
    let listener = server.listen(PORT, 8).unwrap();
    let conns: Vec<(Connection, Connection)> = (0..4).map(|_| pair(&client, &listener)).collect();
    // One connection attempt still pending, one listener on the client.
    let pending = client.connect(addr(3), PORT, params(b"")).unwrap();
    let own = client.listen(PORT, 4).unwrap();
    // Traffic in flight while the link goes.
    for (c, _) in &conns {
        c.send_ulpdu(&[7u8; 1000], T).unwrap();
    }
    let t0 = Instant::now();
    ctl.remove();
    let mut worst = Duration::ZERO;
    for c in conns.iter().map(|(c, _)| c).chain([&pending]) {
        let outcome = c
            .wait_ended(Duration::from_secs(1))
            .expect("not failed in 1 s");
        worst = worst.max(t0.elapsed());
        assert!(
            matches!(outcome, Some(ConnError::DeviceGone(GoneReason::Injected))),
            "{outcome:?}"
        );
    }
    let ev = client.next_event(Duration::from_secs(1));
    let reported = t0.elapsed();
    assert_eq!(ev, Some(DeviceEvent::DeviceGone(GoneReason::Injected)));
    println!("connections failed after {worst:?}, device event after {reported:?}");
    assert!(worst < Duration::from_millis(100), "{worst:?}");
    assert!(reported < Duration::from_millis(100), "{reported:?}");
    assert_eq!(client.ended(), Some(DeviceEnd::Gone(GoneReason::Injected)));
    assert_eq!(
        own.next_request(Duration::ZERO).err(),
        Some(ListenError::Gone(GoneReason::Injected))
    );
    assert!(matches!(
        client.connect(addr(2), PORT, params(b"")),
        Err(softiwarp::DeviceError::Gone(GoneReason::Injected))
    ));
    // Sends and receives report the failure.
    let (c0, _) = &conns[0];
    assert!(matches!(
        c0.try_send_ulpdu(b"x"),
        Err(SendError::Failed(ConnError::DeviceGone(_)))
    ));
    // The server keeps running; its side of the connections dies with TCP's timeout.
    assert!(server.ended().is_none());
}

/// Hybrid mode: a sender's burst queues faster than one drive per
/// `SEND_DRIVE_INTERVAL_US` (20 us), so its last ULPDUs are left for a later drive;
/// with the sender making no further call they still go out once the engine thread
/// takes the link back (the lease, 200 us): every ULPDU arrives, in order, well
/// within 100 ms of the last send.
#[test]
fn a_burst_tail_left_by_send_batching_goes_out_without_another_call() {
    let (client, server, _ctl) = devices(1500);
    let listener = server.listen(PORT, 8).unwrap();
    let (c, s) = pair(&client, &listener);
    assert_eq!(softiwarp::SEND_DRIVE_INTERVAL_US, 20);
    for round in 0..20u32 {
        let n = 50u32;
        for i in 0..n {
            let mut u = round.to_be_bytes().to_vec();
            u.extend_from_slice(&i.to_be_bytes());
            u.resize(100, i as u8);
            c.send_ulpdu_vec(u, T).unwrap();
        }
        let last_send = Instant::now();
        for i in 0..n {
            let u = s.recv_ulpdu(T).unwrap();
            assert_eq!(
                &u[..8],
                &[round.to_be_bytes(), i.to_be_bytes()].concat()[..]
            );
        }
        let took = last_send.elapsed();
        assert!(
            took < Duration::from_millis(100),
            "round {round}: the burst's tail took {took:?}"
        );
        // The client makes no call for a while: the next burst starts after its lease.
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn idle_engine_does_not_spin() {
    let (client, server, _ctl) = devices(1500);
    let listener = server.listen(PORT, 8).unwrap();
    let (c, s) = pair(&client, &listener);
    c.send_ulpdu(b"ping", T).unwrap();
    assert_eq!(s.recv_ulpdu(T).unwrap(), b"ping");
    // Let delayed ACKs and the spin window pass, then measure one idle second.
    std::thread::sleep(Duration::from_millis(200));
    let hz = ticks_per_second();
    let tids = [client.engine_tid(), server.engine_tid()];
    let before: Vec<u64> = tids.iter().map(|&t| thread_ticks(t)).collect();
    let wall = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let wall = wall.elapsed();
    for (i, &t) in tids.iter().enumerate() {
        let used = thread_ticks(t) - before[i];
        let cpu = Duration::from_secs_f64(used as f64 / hz as f64);
        let share = cpu.as_secs_f64() / wall.as_secs_f64();
        println!(
            "engine {t}: {cpu:?} CPU in {wall:?} idle ({:.1}%)",
            share * 100.0
        );
        assert!(share < 0.03, "idle engine used {:.1}% CPU", share * 100.0);
    }
    // Still alive after the idle second.
    s.send_ulpdu(b"pong", T).unwrap();
    assert_eq!(c.recv_ulpdu(T).unwrap(), b"pong");
}

#[test]
fn refused_rejected_backpressure_and_shutdown() {
    let (client, server, _ctl) = devices(1500);
    // Nobody listens: refused.
    let c = client.connect(addr(2), PORT, params(b"")).unwrap();
    assert_eq!(
        c.wait_established(T).unwrap_err(),
        ConnectError::Failed(ConnError::Refused)
    );
    // Rejected with private data; a dropped request is rejected too.
    let listener = server.listen(PORT, 8).unwrap();
    let c = client.connect(addr(2), PORT, params(b"")).unwrap();
    listener
        .next_request(T)
        .unwrap()
        .reject(b"not today")
        .unwrap();
    assert_eq!(
        c.wait_established(T).unwrap_err(),
        ConnectError::Failed(ConnError::Rejected {
            private_data: b"not today".to_vec()
        })
    );
    let c = client.connect(addr(2), PORT, params(b"")).unwrap();
    drop(listener.next_request(T).unwrap());
    assert!(matches!(
        c.wait_established(T),
        Err(ConnectError::Failed(ConnError::Rejected { .. }))
    ));
    // Too much private data is refused at once.
    assert!(matches!(
        client.connect(addr(2), PORT, params(&[0; 600])),
        Err(softiwarp::DeviceError::Stack(StackError::Settings(_)))
    ));
    // Backpressure: the server does not read; the client's queues fill up.
    let (c, s) = pair(&client, &listener);
    let m = c.mulpdu().unwrap();
    let big = vec![1u8; m];
    let mut queued = 0usize;
    let t0 = Instant::now();
    loop {
        match c.try_send_ulpdu(&big) {
            Ok(()) => queued += m,
            Err(SendError::WouldBlock) => {
                // Let the engine move what it can into TCP, then try again; stop once
                // nothing moves any more.
                std::thread::sleep(Duration::from_millis(50));
                if c.try_send_ulpdu(&big).is_err() {
                    break;
                }
                queued += m;
            }
            Err(e) => panic!("{e}"),
        }
        assert!(t0.elapsed() < T, "never blocked");
    }
    assert_eq!(
        c.send_ulpdu(&big, Duration::from_millis(20)),
        Err(SendError::Timeout)
    );
    assert!(c.try_send_ulpdu(&vec![0; m + 1]).is_err());
    println!("{queued} bytes queued before the sender blocked");
    // Two send queues, two TCP buffers and the receive queue hold at most a few MiB.
    assert!(queued < 4 << 20, "{queued}");
    // Drain everything: nothing was lost.
    let mut got = 0;
    while got < queued {
        got += s.recv_ulpdu(T).unwrap().len();
    }
    assert_eq!(got, queued);

    // Shutdown of the server resets its connections and ends the listener.
    drop(server);
    assert!(matches!(
        s.wait_ended(T),
        Some(Some(ConnError::DeviceClosed))
    ));
    assert!(matches!(c.wait_ended(T), Some(Some(ConnError::Reset))));
    assert_eq!(
        listener.next_request(Duration::ZERO).err(),
        Some(ListenError::Closed)
    );
}
