//! Helpers of the rdma-cm-over-soft-device tests (`pair`, `stress`, `adversarial`,
//! `removal_order`): soft devices on memory links, verbs objects on an id's device, WR
//! accounting.

use rdma_cm::{ChannelEvent, CmIdRef, EventChannel, EventKind, RdmaCmConfig};
use softiwarp::cm::iwcm::SoftQp;
use softiwarp::cm::rdmacm::{SoftDevice, SoftRdmaCm};
use softiwarp::link::{MemoryConfig, MemoryControl, MemoryLink};
use softiwarp::{Cq, Pd, QpInitAttr};
use softiwarp::{Device, DeviceConfig, LinkConfig};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;
use verbs::{QpCap, RecvWr, WcStatus, WorkCompletion};

/// QP capabilities of every test QP.
pub const CAP: QpCap = QpCap {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
};

/// Two soft devices joined by a memory link: `a` at 10.`net`.`sub`.1/24, `b` at .2,
/// and the controls of their link ends.
pub struct SoftPair {
    pub a: Arc<Device>,
    pub b: Arc<Device>,
    pub a_link: MemoryControl,
    pub b_link: MemoryControl,
}

/// Address `host` (1 or 2) of a pair's subnet.
pub fn pair_ip(net: u8, sub: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, net, sub, host)
}

/// Opens a [`SoftPair`] named `<a_name>` / `<b_name>`.
pub fn soft_pair(a_name: &str, b_name: &str, net: u8, sub: u8) -> SoftPair {
    soft_pair_tuned(a_name, b_name, net, sub, |_| {})
}

/// [`soft_pair`] with each device's configuration changed by `tune` first.
pub fn soft_pair_tuned(
    a_name: &str,
    b_name: &str,
    net: u8,
    sub: u8,
    tune: impl Fn(&mut DeviceConfig),
) -> SoftPair {
    let (la, lb) = MemoryLink::pair(MemoryConfig::default()).expect("memory link");
    let (a_link, b_link) = (la.control(), lb.control());
    let open = |name: &str, link, host| {
        let mut cfg =
            DeviceConfig::new(name, LinkConfig::memory(link), pair_ip(net, sub, host), 24);
        tune(&mut cfg);
        Arc::new(Device::open(cfg).expect("device"))
    };
    SoftPair {
        a: open(a_name, la, 1),
        b: open(b_name, lb, 2),
        a_link,
        b_link,
    }
}

/// The verbs objects of one id (librdmacm's `id->pd`, `id->send_cq`, `id->qp`), and
/// how many WRs were posted on the QP.
pub struct Verbs {
    pub pd: Pd,
    pub cq: Cq,
    pub qp: SoftQp,
    pub posted: usize,
    pub completions: Vec<WorkCompletion>,
}

impl Verbs {
    /// PD, CQ and QP on the device `id` is bound to (`id->verbs`), the QP through
    /// `rdma_create_qp`.
    pub fn on(id: &CmIdRef<SoftDevice>) -> Result<Verbs, String> {
        let dev = id.device().ok_or("the id has no device")?;
        let pd = dev.device().alloc_pd().map_err(|e| e.to_string())?;
        let cq = dev.device().create_cq(64).map_err(|e| e.to_string())?;
        let attr = QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: CAP,
            sq_sig_all: false,
        };
        let qp = id.create_qp(&pd, attr).map_err(|e| e.to_string())?;
        Ok(Verbs {
            pd,
            cq,
            qp,
            posted: 0,
            completions: Vec::new(),
        })
    }

    /// Posts `n` receive WRs without buffers (`wr_id` 1000.., for zero-length Sends).
    pub fn post_recvs(&mut self, n: usize) -> Result<(), verbs::VerbsError> {
        for _ in 0..n {
            let wr = RecvWr::new(1000 + self.posted as u64, vec![]);
            self.qp.post_recv(wr)?;
            self.posted += 1;
        }
        Ok(())
    }

    /// Takes what the CQ holds now.
    pub fn poll(&mut self) {
        while let Ok(wcs) = self.cq.poll(16) {
            if wcs.is_empty() {
                break;
            }
            self.completions.extend(wcs);
        }
    }

    /// Waits up to `timeout` until every posted WR completed (success or flush):
    /// design.md section 5, "every posted WR completes".
    pub fn all_completed(&mut self, timeout: Duration) -> bool {
        testkit::eventually(timeout, || {
            self.poll();
            self.completions.len() >= self.posted
        }) && self.completions.len() == self.posted
    }

    /// Completions with `status`.
    pub fn count(&self, status: WcStatus) -> usize {
        self.completions
            .iter()
            .filter(|w| w.status == status)
            .count()
    }
}

/// Whether the current thread is a soft device's engine (`sw-*`) or provider
/// (`iwp-*`) thread, where no user callback may ever run (design.md section 5).
pub fn on_device_thread() -> bool {
    let t = std::thread::current();
    let name = t.name().unwrap_or("");
    name.starts_with("sw-") || name.starts_with("iwp-")
}

/// Two hosts: a [`SoftPair`] (`a` named `{prefix}c{sub}`, `b` `{prefix}s{sub}`, in
/// 10.`net`.`sub`.0/24), each device registered with its own RDMA CM, and one event
/// channel per CM.
pub struct Hosts {
    pub pair: SoftPair,
    pub client: SoftRdmaCm,
    pub server: SoftRdmaCm,
    pub cch: EventChannel<SoftDevice>,
    pub sch: EventChannel<SoftDevice>,
    pub prefix: &'static str,
    pub net: u8,
    pub sub: u8,
}

impl Hosts {
    pub fn new(prefix: &'static str, net: u8, sub: u8) -> Hosts {
        let pair = soft_pair(
            &format!("{prefix}c{sub}"),
            &format!("{prefix}s{sub}"),
            net,
            sub,
        );
        let client = SoftRdmaCm::new(RdmaCmConfig::default()).unwrap();
        let server = SoftRdmaCm::new(RdmaCmConfig::default()).unwrap();
        client
            .add_device(SoftDevice::new(pair.a.clone()).unwrap())
            .unwrap();
        server
            .add_device(SoftDevice::new(pair.b.clone()).unwrap())
            .unwrap();
        let (cch, sch) = (client.create_event_channel(), server.create_event_channel());
        Hosts {
            pair,
            client,
            server,
            cch,
            sch,
            prefix,
            net,
            sub,
        }
    }

    /// The client device's name.
    pub fn client_dev(&self) -> String {
        format!("{}c{}", self.prefix, self.sub)
    }

    /// The server device's name.
    pub fn server_dev(&self) -> String {
        format!("{}s{}", self.prefix, self.sub)
    }
}

/// The next event on `ch` within `wait`, which must be of `kind` (panics naming the
/// event's status and id otherwise).
pub fn expect_within(
    ch: &EventChannel<SoftDevice>,
    kind: EventKind,
    wait: Duration,
) -> ChannelEvent<SoftDevice> {
    let ev = ch.get_event_timeout(wait).expect("an event");
    assert_eq!(
        ev.kind,
        kind,
        "status {} of #{}",
        ev.status,
        ev.id().serial()
    );
    ev
}

/// Every event left on `ch`, each arriving within `pause` of the one before, as (id
/// serial, kind); each is acknowledged when dropped here.
pub fn drain_within(ch: &EventChannel<SoftDevice>, pause: Duration) -> Vec<(u64, EventKind)> {
    let mut out = Vec::new();
    while let Ok(ev) = ch.get_event_timeout(pause) {
        out.push((ev.id().serial(), ev.kind));
    }
    out
}
