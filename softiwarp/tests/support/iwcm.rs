//! Harness of the `iwcm` tests: two soft devices back to back on a memory
//! link, each with its `SoftProvider` and `IwCm`; verbs objects for QPs; a per-id
//! delivery checker; a watchdog (CM state dumps + gdb backtraces); a raw smoltcp peer
//! driven by hand-written MPA bytes; the seeded PRNG.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iw_cm::{CmConfig, CmEvent, IwCm};
use smoltcp::iface::{Interface, SocketSet};
use smoltcp::socket::tcp;
use softiwarp::cm::iwcm::{SoftProvider, SoftQp};
use softiwarp::link::{MemoryConfig, MemoryControl, MemoryLink};
use softiwarp::transport::smoltcp_glue::{build_interface, InterfaceConfig, LinkDevice, TcpConfig};
use softiwarp::{Cq, Pd, QpInitAttr};
use softiwarp::{Device, DeviceConfig, LinkConfig};
use verbs::QpCap;

pub type Cm = IwCm<SoftProvider>;

/// Host `host` of test subnet `net`.
pub fn ip(net: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 60, net, host)
}

/// Small TCP buffers: many connections, little data.
pub fn small_tcp() -> TcpConfig {
    TcpConfig {
        rx_buffer: 32 * 1024,
        tx_buffer: 32 * 1024,
        ..TcpConfig::default()
    }
}

/// One soft device with its provider, CM and verbs objects.
pub struct Side {
    pub provider: Arc<SoftProvider>,
    pub cm: Arc<Cm>,
    pub pd: Pd,
    pub cq: Cq,
    pub control: MemoryControl,
    pub ip: Ipv4Addr,
}

impl Side {
    pub fn open(
        name: &str,
        link: MemoryLink,
        ip: Ipv4Addr,
        workers: usize,
        tweak: impl FnOnce(&mut DeviceConfig),
    ) -> Side {
        let control = link.control();
        let mut cfg = DeviceConfig::new(name, LinkConfig::memory(link), ip, 24);
        cfg.tcp = small_tcp();
        tweak(&mut cfg);
        let dev = Arc::new(Device::open(cfg).expect("device"));
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(1024).unwrap();
        let provider = Arc::new(SoftProvider::new(dev).expect("provider"));
        let cm = Arc::new(
            IwCm::new(
                provider.clone(),
                CmConfig {
                    name: format!("cm-{name}"),
                    workers,
                    ..CmConfig::default()
                },
            )
            .unwrap(),
        );
        Side {
            provider,
            cm,
            pd,
            cq,
            control,
            ip,
        }
    }

    pub fn device(&self) -> &Arc<Device> {
        self.provider.device()
    }

    /// A new QP (Reset) on the shared CQ.
    pub fn qp(&self, depth: u32) -> SoftQp {
        let cap = QpCap {
            max_send_wr: depth.max(1),
            max_recv_wr: depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        Arc::new(
            self.device()
                .create_qp(
                    &self.pd,
                    QpInitAttr {
                        send_cq: &self.cq,
                        recv_cq: &self.cq,
                        cap,
                        sq_sig_all: false,
                    },
                )
                .expect("create_qp"),
        )
    }

    pub fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.ip, port))
    }

    /// Everything this side still holds, for leak checks.
    pub fn describe(&self) -> String {
        format!(
            "{}\nprovider: {:?}\ndevice connections: {}",
            self.cm.dump_state(),
            self.provider.stats(),
            self.device().connection_count()
        )
    }

    /// Whether every live-object count is back to zero (CM ids, queued events, jobs;
    /// provider connections, listeners, QP references; device connections).
    pub fn is_clean(&self) -> bool {
        let _ = self.cm.flush_timeout(Duration::from_millis(50));
        let s = self.cm.stats();
        let p = self.provider.stats();
        s.ids_alive == 0
            && s.events_queued == 0
            && s.jobs_pending == 0
            && p.conns_alive == 0
            && p.conns_watched == 0
            && p.listeners == 0
            && p.qp_refs == 0
            && self.device().connection_count() == 0
    }
}

/// Two sides back to back on a memory link: `server` is host 2, `client` host 1.
pub fn pair(
    net: u8,
    server_workers: usize,
    tweak_server: impl FnOnce(&mut DeviceConfig),
    tweak_client: impl FnOnce(&mut DeviceConfig),
) -> (Side, Side) {
    let (a, b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
    let server = Side::open(
        &format!("s{net}"),
        b,
        ip(net, 2),
        server_workers,
        tweak_server,
    );
    let client = Side::open(&format!("c{net}"), a, ip(net, 1), 2, tweak_client);
    (server, client)
}

/// Wait until every side is clean, else fail with their dumps. 20 s: a connection
/// closed gracefully stays in the device (TCP TIME-WAIT) for 10 s.
pub fn assert_clean(sides: &[&Side]) {
    assert_clean_within(sides, Duration::from_secs(20));
}

/// [`assert_clean`] with a time limit.
pub fn assert_clean_within(sides: &[&Side], limit: Duration) {
    let ok = eventually(limit, || sides.iter().all(|s| s.is_clean()));
    if !ok {
        let dumps: Vec<_> = sides.iter().map(|s| s.describe()).collect();
        panic!("objects left:\n{}", dumps.join("\n"));
    }
    for s in sides {
        let st = s.cm.stats();
        assert_eq!(st.ids_freed, st.ids_created, "{st:?}");
        assert_eq!(
            st.unexpected_events, 0,
            "the provider keeps the contract: {st:?}"
        );
        assert_eq!(st.handler_panics, 0);
    }
}

/// Poll `f` every 2 ms until it is true or `timeout` passes.
pub fn eventually(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    testkit::eventually_every(timeout, Duration::from_millis(2), f)
}

/// A short description of an event.
pub fn ev_name(ev: &CmEvent<SoftProvider>) -> String {
    match ev {
        CmEvent::ConnectRequest(_) => "ConnectRequest".into(),
        CmEvent::ConnectReply(r) => format!("ConnectReply({:?})", r.status),
        CmEvent::Established => "Established".into(),
        CmEvent::Close => "Close".into(),
    }
}

// --------------------------------------------------------------- delivery checker

/// Checks at every handler call that it runs on a CM worker (not an engine thread
/// `sw-*`, not a provider thread `iwp-*`, not a user thread) and that no other call for
/// the same id is running.
#[derive(Default)]
pub struct Checker {
    active: Mutex<HashSet<(usize, u64)>>,
    pub calls: AtomicUsize,
    pub violations: Mutex<Vec<String>>,
}

impl Checker {
    /// `side` tells the two CMs' ids apart (serials are per CM).
    pub fn enter(&self, side: usize, serial: u64) {
        self.calls.fetch_add(1, SeqCst);
        let name = std::thread::current().name().unwrap_or("").to_string();
        if name.starts_with("sw-") || name.starts_with("iwp-") {
            self.violation(format!("handler of #{serial} ran on thread {name}"));
        }
        if !iw_cm::in_delivery_context() {
            self.violation(format!(
                "handler of #{serial} ran outside a CM worker ({name})"
            ));
        }
        if !self.active.lock().unwrap().insert((side, serial)) {
            self.violation(format!("two deliveries at once for #{serial}"));
        }
    }
    pub fn exit(&self, side: usize, serial: u64) {
        self.active.lock().unwrap().remove(&(side, serial));
    }
    pub fn violation(&self, s: String) {
        eprintln!("VIOLATION: {s}");
        self.violations.lock().unwrap().push(s);
    }
    pub fn assert_clean(&self) {
        let v = self.violations.lock().unwrap();
        assert!(
            v.is_empty(),
            "{} violations, first: {:?}",
            v.len(),
            v.first()
        );
    }
}

// ---------------------------------------------------------------------- watchdog

#[allow(unused_imports)] // each test binary uses a subset
pub use testkit::Watchdog;

// ------------------------------------------------------------------------- PRNG

/// The seeded PRNG of the tests (testkit's splitmix64).
#[allow(unused_imports)] // each test binary uses a subset
pub use super::Rng;

// --------------------------------------------------------------------- raw peer

/// What a [`RawResponder`] does once it has read an MPA Request.
#[derive(Debug, Clone)]
pub enum RawBehaviour {
    /// Write an MPA Reply (Rev 2, CRC, IRD/ORD 4/4, private data `pd`) immediately
    /// followed, in the same TCP write, by one FPDU: an RDMA Send (QN 0, MSN 1, MO 0)
    /// carrying `payload`. Kernel siw does this: it does not hold its first FPDU.
    ReplyThenFpdu { pd: Vec<u8>, payload: Vec<u8> },
    /// Accept TCP and never answer.
    Silent,
}

/// What a [`RawResponder`] saw.
#[derive(Debug, Default, Clone)]
pub struct RawLog {
    /// TCP connections accepted.
    pub accepted: usize,
    /// The MPA Requests read (whole frames).
    pub requests: Vec<Vec<u8>>,
    /// The bytes written after the first Request (Reply + FPDU).
    pub sent: Vec<Vec<u8>>,
}

/// A bare smoltcp host on a memory link end that listens on one port and speaks MPA by
/// hand-written bytes, in real time on its own thread.
pub struct RawResponder {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<RawLog>>,
    thread: Option<JoinHandle<()>>,
}

/// The MPA Reply of [`RawBehaviour::ReplyThenFpdu`], by hand (RFC 5044 7.1.1, RFC 6581
/// section 2): key, flags `C` + enhanced, Rev 2, PD_Length (4 + private data), IRD/ORD
/// word (IRD 4, ORD 4, no P2P bits), private data.
pub fn reply_bytes(pd: &[u8]) -> Vec<u8> {
    let mut v = b"MPA ID Rep Frame".to_vec();
    v.push(0x40 | 0x10);
    v.push(2);
    v.extend(((4 + pd.len()) as u16).to_be_bytes());
    v.extend([0x00, 0x04, 0x00, 0x04]);
    v.extend(pd);
    v
}

/// One FPDU with CRC holding an untagged RDMA Send (RFC 5041 4.3, RFC 5040 4.3; QN 0,
/// MSN 1, MO 0, last): ULPDU_Length, DDP/RDMAP header, payload, pad to 4, CRC32c
/// (least significant octet first).
pub fn send_fpdu(payload: &[u8]) -> Vec<u8> {
    let mut ulpdu = vec![0x41, 0x43];
    ulpdu.extend(0u32.to_be_bytes()); // RsvdULP (Invalidate STag)
    ulpdu.extend(0u32.to_be_bytes()); // QN 0: Send
    ulpdu.extend(1u32.to_be_bytes()); // MSN 1
    ulpdu.extend(0u32.to_be_bytes()); // MO 0
    ulpdu.extend(payload);
    let mut v = (ulpdu.len() as u16).to_be_bytes().to_vec();
    v.extend(&ulpdu);
    while !v.len().is_multiple_of(4) {
        v.push(0);
    }
    let crc = softiwarp_mpa_crc(&v);
    v.extend(crc);
    v
}

fn softiwarp_mpa_crc(bytes: &[u8]) -> [u8; 4] {
    mpa::crc::crc_to_wire(mpa::crc::crc32c(bytes))
}

impl RawResponder {
    /// Starts the host `ip` on `link`, listening on `port`.
    pub fn start(link: MemoryLink, ip: Ipv4Addr, port: u16, behaviour: RawBehaviour) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(RawLog::default()));
        let (s, l) = (stop.clone(), log.clone());
        let thread = std::thread::Builder::new()
            .name("raw-peer".into())
            .spawn(move || raw_loop(link, ip, port, behaviour, s, l))
            .unwrap();
        RawResponder {
            stop,
            log,
            thread: Some(thread),
        }
    }

    pub fn log(&self) -> RawLog {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for RawResponder {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn raw_loop(
    link: MemoryLink,
    ip: Ipv4Addr,
    port: u16,
    behaviour: RawBehaviour,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<RawLog>>,
) {
    let start = Instant::now();
    let now = || smoltcp::time::Instant::from_micros(start.elapsed().as_micros() as i64);
    let o = ip.octets();
    let cfg = InterfaceConfig {
        mac: [0x02, 0x00, o[0], o[1], o[2], o[3]],
        address: ip,
        prefix_len: 24,
        gateway: None,
        random_seed: 77,
    };
    let mut dev = LinkDevice::new(link);
    let mut iface: Interface = build_interface(&cfg, &mut dev, now()).unwrap();
    let mut sockets = SocketSet::new(Vec::new());
    // Like a listen backlog: a listening socket is always armed; each connection has
    // its own socket and receive buffer.
    struct Conn {
        h: smoltcp::iface::SocketHandle,
        rx: Vec<u8>,
        answered: bool,
        counted: bool,
    }
    let mut conns: Vec<Conn> = Vec::new();
    while !stop.load(SeqCst) {
        let listening = conns
            .iter()
            .any(|c| sockets.get::<tcp::Socket>(c.h).state() == tcp::State::Listen);
        if !listening {
            let mut sock = small_tcp().socket().unwrap();
            sock.listen(port).unwrap();
            conns.push(Conn {
                h: sockets.add(sock),
                rx: Vec::new(),
                answered: false,
                counted: false,
            });
        }
        iface.poll(now(), &mut dev, &mut sockets);
        for c in &mut conns {
            let s = sockets.get_mut::<tcp::Socket>(c.h);
            if s.state() == tcp::State::Established && !c.counted {
                c.counted = true;
                log.lock().unwrap().accepted += 1;
            }
            while s.can_recv() {
                let _ = s.recv(|b| {
                    c.rx.extend_from_slice(b);
                    (b.len(), ())
                });
            }
            if !c.answered && c.rx.len() >= 20 {
                let frame_len = 20 + usize::from(u16::from_be_bytes([c.rx[18], c.rx[19]]));
                if c.rx.len() >= frame_len {
                    c.answered = true;
                    log.lock()
                        .unwrap()
                        .requests
                        .push(c.rx[..frame_len].to_vec());
                    if let RawBehaviour::ReplyThenFpdu { pd, payload } = &behaviour {
                        let mut out = reply_bytes(pd);
                        out.extend(send_fpdu(payload));
                        // One write: the FPDU is right behind the Reply in the stream
                        // (and in one TCP segment).
                        let n = s.send_slice(&out).unwrap_or(0);
                        assert_eq!(n, out.len(), "the raw peer's send buffer holds it");
                        log.lock().unwrap().sent.push(out);
                    }
                }
            }
            if s.state() == tcp::State::CloseWait {
                // The initiator went away: so do we.
                s.abort();
            }
        }
        conns.retain(|c| {
            let closed = sockets.get::<tcp::Socket>(c.h).state() == tcp::State::Closed;
            if closed {
                sockets.remove(c.h);
            }
            !closed
        });
        std::thread::sleep(Duration::from_micros(200));
    }
}
