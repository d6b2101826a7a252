//! Harness of the `verbs` tests: two real Devices (engine threads) on a memory
//! link, each with a PD, CQs and a QP bound to one connection; helpers to wait for
//! completions (patterns: [`super::pattern`]).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use softiwarp::link::{MemoryControl, MemoryLink};
use softiwarp::transport::MpaParams;
use softiwarp::{Cq, Pd, Qp, QpInitAttr};
use softiwarp::{Device, DeviceConfig, FaultSpec, LinkConfig, QpConnection};
use verbs::{QpCap, QpState, WorkCompletion};

/// Server port of the tests.
pub const PORT: u16 = 4791;
/// How long any single wait may take before a test fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// The IPv4 address of host `n`.
pub fn addr(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 66, 0, n)
}

#[allow(unused_imports)] // each test binary uses a subset
pub use super::{all_access, atomic_access, cap, links, pattern, Rng, RngExt};

/// How to build a pair.
pub struct Setup {
    pub mtu: usize,
    pub cap: QpCap,
    pub cqe: usize,
    /// (IRD, ORD) the client offers; the server accepts with the same numbers.
    pub ird_ord: (u16, u16),
    pub faults: Option<(FaultSpec, FaultSpec)>,
    /// pcap of the server's link.
    pub pcap: Option<PathBuf>,
    /// A zero spin makes the engines sleep as soon as they are idle.
    pub spin: Option<Duration>,
    /// Who drives the devices (`None`: the default, `SOFTIWARP_PROGRESS`).
    pub progress: Option<softiwarp::ProgressMode>,
    /// `DeviceConfig::strict_read_sink` of both devices.
    pub strict_read_sink: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            mtu: 1500,
            cap: cap(64, 4),
            cqe: 1 << 16,
            ird_ord: (16, 16),
            faults: None,
            pcap: None,
            spin: None,
            progress: None,
            strict_read_sink: false,
        }
    }
}

/// One side: its device and verbs objects. Field order is drop order: the QP goes
/// before the CQs and the PD, and the device last.
pub struct End {
    pub conn: Option<QpConnection>,
    pub qp: Qp,
    pub scq: Cq,
    pub rcq: Cq,
    pub pd: Pd,
    pub dev: Device,
    /// Fails or removes this device's end of the memory link.
    pub control: MemoryControl,
}

impl End {
    /// Waits for `n` completions on `cq` (send or receive), failing the test after
    /// [`WAIT`].
    pub fn wait_n(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
        let deadline = Instant::now() + WAIT;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "timed out with {} of {n} completions: {:?}",
                out.len(),
                out.last()
            );
            out.extend(cq.poll_wait(n - out.len(), left).expect("CQ overflow"));
        }
        out
    }

    pub fn send_wcs(&self, n: usize) -> Vec<WorkCompletion> {
        End::wait_n(&self.scq, n)
    }

    pub fn recv_wcs(&self, n: usize) -> Vec<WorkCompletion> {
        End::wait_n(&self.rcq, n)
    }

    /// Waits until the QP reports `state`.
    pub fn wait_state(&self, state: QpState) {
        let deadline = Instant::now() + WAIT;
        while self.qp.state() != state {
            assert!(
                Instant::now() < deadline,
                "QP {} stuck in {} (waiting for {state})",
                self.qp.qp_num(),
                self.qp.state()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Asserts no completion arrives within `d`.
    pub fn assert_quiet(&self, d: Duration) {
        std::thread::sleep(d);
        assert!(self.scq.is_empty(), "{:?}", self.scq.poll(8));
        assert!(self.rcq.is_empty(), "{:?}", self.rcq.poll(8));
    }
}

/// The link configuration [`devices`] uses: the setup's faults and pcap.
pub fn default_link(host: u8, link: MemoryLink, s: &Setup) -> LinkConfig {
    let mut lc = LinkConfig::memory(link);
    if let Some((a, b)) = &s.faults {
        lc = lc.with_faults(if host == 1 { *a } else { *b });
    }
    if host == 2 {
        if let Some(p) = &s.pcap {
            lc = lc.with_pcap(p.clone());
        }
    }
    lc
}

fn device(name: &str, host: u8, lc: LinkConfig, s: &Setup) -> Device {
    let mut cfg = DeviceConfig::new(name, lc, addr(host), 24);
    // CRC32c on every FPDU.
    cfg.mpa.settings.crc = mpa::negotiate::CrcPolicy::Wanted;
    if let Some(spin) = s.spin {
        cfg.engine.spin = spin;
    }
    if let Some(mode) = s.progress {
        cfg.engine.progress = mode;
    }
    cfg.strict_read_sink = s.strict_read_sink;
    Device::open(cfg).expect("device")
}

/// Two devices on a memory link, verbs objects on each, and an unconnected QP on
/// each (in Reset).
pub fn devices(s: &Setup) -> (End, End) {
    devices_with(s, |host, link| default_link(host, link, s))
}

/// As [`devices`], with each link configured by `make(host, link)` (host 1: the
/// client, 2: the server).
pub fn devices_with(s: &Setup, mut make: impl FnMut(u8, MemoryLink) -> LinkConfig) -> (End, End) {
    let (la, lb) = links(s.mtu);
    let (ca, cb) = (la.control(), lb.control());
    let b = device("srv", 2, make(2, lb), s);
    let a = device("cli", 1, make(1, la), s);
    (end(a, ca, s), end(b, cb, s))
}

fn end(dev: Device, control: MemoryControl, s: &Setup) -> End {
    let pd = dev.alloc_pd().expect("pd");
    let scq = dev.create_cq(s.cqe).expect("cq");
    let rcq = dev.create_cq(s.cqe).expect("cq");
    let qp = dev
        .create_qp(
            &pd,
            QpInitAttr {
                send_cq: &scq,
                recv_cq: &rcq,
                cap: s.cap,
                sq_sig_all: false,
            },
        )
        .expect("qp");
    End {
        conn: None,
        qp,
        scq,
        rcq,
        pd,
        dev,
        control,
    }
}

/// Connects the QPs of `a` (client) and `b` (server): `before` runs once both QPs are
/// bound (in Init; post receives there) and before the server accepts.
pub fn connect_with(a: &mut End, b: &mut End, s: &Setup, before: impl FnOnce(&End, &End)) {
    let listener = b.dev.listen(PORT, 4).expect("listen");
    let (ird, ord) = s.ird_ord;
    let conn = a
        .dev
        .connect_qp(
            addr(2),
            PORT,
            MpaParams {
                private_data: b"verbs".to_vec(),
                ird,
                ord,
                settings: None,
            },
            &a.qp,
        )
        .expect("connect_qp");
    let req = listener.next_request(WAIT).expect("request");
    assert_eq!(req.private_data(), b"verbs");
    before(a, b);
    let served = req.accept_qp(&b.qp, b"ok", ird, ord).expect("accept_qp");
    conn.wait_established(WAIT).expect("client established");
    served.wait_established(WAIT).expect("server established");
    a.wait_state(QpState::Rts);
    b.wait_state(QpState::Rts);
    assert!(conn.agreed().expect("agreed").crc, "CRC negotiated");
    a.conn = Some(conn);
    b.conn = Some(served);
}

/// Two connected QPs in RTS.
pub fn pair(s: &Setup) -> (End, End) {
    let (mut a, mut b) = devices(s);
    connect_with(&mut a, &mut b, s, |_, _| {});
    (a, b)
}

/// FNV-1a over `data`, continuing from `h`: the checksum of a verified stream.
pub fn checksum(data: &[u8], h: u64) -> u64 {
    data.iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Sends `total` bytes of seeded random ULPDUs of at most `mulpdu` bytes from `from` to
/// `to` (a receiver thread alongside) and asserts the receiver's checksum is the
/// sender's: every byte arrived, once, in order.
pub fn stream_verified(
    from: &softiwarp::Connection,
    to: &softiwarp::Connection,
    total: usize,
    mulpdu: usize,
    seed: u64,
    timeout: std::time::Duration,
) {
    use super::RngExt;
    let mut rng = testkit::Rng::new(seed);
    let (mut sent, mut h_sent) = (0usize, 0u64);
    std::thread::scope(|scope| {
        let rx = scope.spawn(|| {
            let (mut got, mut h) = (0usize, 0u64);
            while got < total {
                let u = to.recv_ulpdu(timeout).unwrap();
                h = checksum(&u, h);
                got += u.len();
            }
            h
        });
        while sent < total {
            let len = mulpdu.min(total - sent);
            let mut u = vec![0u8; len];
            rng.fill(&mut u);
            h_sent = checksum(&u, h_sent);
            from.send_ulpdu_vec(u, timeout).unwrap();
            sent += len;
        }
        assert_eq!(rx.join().unwrap(), h_sent, "seed {seed}: checksum mismatch");
    });
}

/// After a run of RDMA Reads and/or atomics from `a` to `b` with ORD = IRD = `ord`:
/// `a` had exactly `ord` requests outstanding at most (ORD reached, not passed), `b`
/// queued between 1 and `ord` responses (IRD respected), and `a` is still in RTS.
pub fn assert_ord_ird_respected(a: &End, b: &End, ord: u32) {
    assert_eq!(
        u64::from(ord),
        a.qp.stats().reads_outstanding_max as u64,
        "ORD reached, not passed"
    );
    let rr = b.qp.stats().read_responses_pending_max as u64;
    assert!((1..=u64::from(ord)).contains(&rr), "IRD respected: {rr}");
    assert_eq!(a.qp.state(), verbs::QpState::Rts);
}
