//! The soft device behind the provider-neutral boundary ([`verbs::provider`]): the
//! same application code runs here and on rdma-core (`cxgb4`).
//!
//! | trait | here | over |
//! |---|---|---|
//! | [`Provider`] | [`SoftCm`] | an [`EventChannel`] of a [`SoftRdmaCm`] |
//! | [`CmId`](verbs::provider::CmId) | [`SoftId`] | [`rdma_cm::CmId`] (dropping it destroys the id) |
//! | [`CmEvent`](verbs::provider::CmEvent) | [`SoftEvent`] | [`ChannelEvent`] (acked on drop) |
//! | [`Device`] | [`SoftDev`] | the id's [`SoftDevice`]: [`soft_caps`], [`Device::alloc_pd`](crate::Device::alloc_pd), [`Device::create_cq`](crate::Device::create_cq) |
//! | [`ProtectionDomain`] | [`SoftPd`] | [`Pd`], choosing iovas from [`IOVA_BASE`] |
//! | [`MemoryRegion`] | [`SoftMr`] | [`Mr`] |
//! | [`CompletionQueue`] | [`SoftCq`] | [`Cq`] (`poll`, `wait`) |
//! | [`QueuePair`] | [`SoftQpHandle`] | the id's QP; dropping it is `rdma_destroy_qp` |
//!
//! Errors become [`ProviderError`]: a [`VerbsError`] keeps its call; a [`CmError`] or
//! [`CqError`] becomes [`ProviderError::Call`] with its errno and message.
//!
//! ```
//! use std::net::Ipv4Addr;
//! use std::sync::Arc;
//! use softiwarp::cm::provider::SoftCm;
//! use softiwarp::cm::rdmacm::{SoftDevice, SoftRdmaCm};
//! use softiwarp::link::{MemoryConfig, MemoryLink};
//! use softiwarp::{Device, DeviceConfig, LinkConfig};
//! use verbs::provider::{CmId, Provider};
//!
//! let (a, _b) = MemoryLink::pair(MemoryConfig::default())?;
//! let dev = Device::open(DeviceConfig::new("siw0", LinkConfig::memory(a), Ipv4Addr::new(10, 7, 0, 1), 24))?;
//! let cm = SoftRdmaCm::new(rdma_cm::RdmaCmConfig::default())?;
//! cm.add_device(SoftDevice::new(Arc::new(dev))?)?;
//! let p = SoftCm::new(&cm);
//! let id = p.create_id()?;
//! id.bind_addr("10.7.0.1:7174".parse()?)?;
//! assert_eq!(id.device().map(|d| verbs::provider::Device::name(&d)).as_deref(), Some("siw0"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdma_cm::{ChannelEvent, CmError, CmIdRef, EventChannel, EventKind, QpOf};
use verbs::provider::{
    self, CmEventKind, CompletionQueue, ConnParam, Device, MemoryRegion, ProtectionDomain,
    Provider, ProviderError, QueuePair,
};
use verbs::{AccessFlags, DeviceCaps, QpCap, RecvWr, SendWr, Stag, VerbsError, WorkCompletion};

use crate::cm::rdmacm::{SoftDevice, SoftRdmaCm};
use crate::{Cq, CqError, DeviceAttr, Mr, Pd, QpInitAttr};

/// The iova of a [`SoftPd`]'s first MR; the next ones follow, each at a 1 MiB
/// boundary past the end of the last. A user-space-looking address, so a peer that
/// mixes up TO and offset shows at once.
pub const IOVA_BASE: u64 = 0x0000_7f3a_5c00_0000;

/// The iova step unit of [`SoftPd::reg_mr`], bytes.
const IOVA_ALIGN: u64 = 1 << 20;

/// The soft device's [`DeviceCaps`] of its [`DeviceAttr`]: the same SGE limit for
/// sends, receives and RDMA Read sinks, RFC 7306 atomics (Fetch-and-Add and
/// Compare-and-Swap, `IBV_ATOMIC_HCA`), RDMA Write with Immediate (RFC 7306 Immediate
/// Data), no Send with Immediate (no iWARP encoding), no Read-sink rule (that is
/// iw_cxgb4's).
pub fn soft_caps(attr: &DeviceAttr) -> DeviceCaps {
    DeviceCaps {
        max_sge: attr.max_sge,
        max_recv_sge: attr.max_sge,
        max_sge_rd: attr.max_sge,
        max_inline: attr.max_inline_data,
        max_ord: attr.max_ord_ird,
        max_ird: attr.max_ord_ird,
        max_qp_wr: attr.max_qp_wr,
        max_cqe: u32::try_from(attr.max_cqe).unwrap_or(u32::MAX),
        atomics: true,
        write_imm: true,
        send_imm: false,
        read_sink_needs_remote_write: false,
    }
}

/// The neutral kind of an rdma-cm event kind.
pub fn kind_to_neutral(k: EventKind) -> CmEventKind {
    match k {
        EventKind::AddrResolved => CmEventKind::AddrResolved,
        EventKind::AddrError => CmEventKind::AddrError,
        EventKind::RouteResolved => CmEventKind::RouteResolved,
        EventKind::RouteError => CmEventKind::RouteError,
        EventKind::ConnectRequest => CmEventKind::ConnectRequest,
        EventKind::ConnectError => CmEventKind::ConnectError,
        EventKind::Unreachable => CmEventKind::Unreachable,
        EventKind::Rejected => CmEventKind::Rejected,
        EventKind::Established => CmEventKind::Established,
        EventKind::Disconnected => CmEventKind::Disconnected,
        EventKind::DeviceRemoval => CmEventKind::DeviceRemoval,
        EventKind::AddrChange => CmEventKind::AddrChange,
    }
}

/// The [`ProviderError`] of a failed rdma-cm `call`.
pub fn cm_error(call: &'static str, e: CmError) -> ProviderError {
    ProviderError::call(call, e.errno(), e.to_string())
}

fn cm(call: &'static str) -> impl Fn(CmError) -> ProviderError {
    move |e| cm_error(call, e)
}

fn vb(call: &'static str) -> impl Fn(VerbsError) -> ProviderError {
    move |e| ProviderError::verbs(call, e)
}

/// rdma-cm's connection parameters of neutral ones (iWARP ignores the retry counts;
/// rping's 7 and 7).
fn conn_param(p: &ConnParam) -> rdma_cm::ConnParam {
    rdma_cm::ConnParam {
        private_data: p.private_data.clone(),
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        retry_count: 7,
        rnr_retry_count: 7,
    }
}

/// A memory region of the soft device.
#[derive(Debug)]
pub struct SoftMr(pub Mr);

impl MemoryRegion for SoftMr {
    fn lkey(&self) -> Stag {
        self.0.lkey()
    }

    fn rkey(&self) -> Stag {
        self.0.rkey()
    }

    fn iova(&self) -> u64 {
        self.0.iova()
    }

    fn len(&self) -> usize {
        usize::try_from(self.0.length()).unwrap_or(usize::MAX)
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), ProviderError> {
        self.0.read(offset, out).map_err(vb("MR buffer"))
    }

    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), ProviderError> {
        self.0.write(offset, data).map_err(vb("MR buffer"))
    }
}

/// A protection domain of the soft device; it places each MR at its own iova
/// ([`IOVA_BASE`], then 1 MiB-aligned past the previous one).
#[derive(Debug)]
pub struct SoftPd {
    pd: Pd,
    next_iova: Mutex<u64>,
}

impl SoftPd {
    /// The soft PD.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }
}

impl ProtectionDomain for SoftPd {
    type Mr = SoftMr;

    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<SoftMr, ProviderError> {
        let bad_len =
            || ProviderError::verbs("ibv_reg_mr", VerbsError::InvalidArgument { what: "length" });
        let len64 = u64::try_from(len).map_err(|_| bad_len())?;
        let span = len64
            .checked_add(IOVA_ALIGN - 1)
            .map(|v| v & !(IOVA_ALIGN - 1))
            .ok_or_else(bad_len)?
            .max(IOVA_ALIGN);
        // A refused registration takes no iova space.
        let mut next = self
            .next_iova
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mr = self
            .pd
            .reg_mr(len64, *next, access)
            .map_err(vb("ibv_reg_mr"))?;
        *next = next.checked_add(span).ok_or_else(bad_len)?;
        Ok(SoftMr(mr))
    }
}

/// The [`ProviderError`] of a failed poll.
fn cq_error(e: CqError) -> ProviderError {
    let errno = match e {
        CqError::Overflow { .. } => libc::EOVERFLOW,
        CqError::Destroyed { .. } => libc::EINVAL,
    };
    ProviderError::call("ibv_poll_cq", errno, e.to_string())
}

/// A completion queue of the soft device.
#[derive(Debug)]
pub struct SoftCq(pub Cq);

impl CompletionQueue for SoftCq {
    fn poll(&self, max: usize) -> Result<Vec<WorkCompletion>, ProviderError> {
        self.0.poll(max).map_err(cq_error)
    }

    fn wait(&self, timeout: Duration) -> Result<bool, ProviderError> {
        Ok(self.0.wait(timeout))
    }

    /// [`Cq::poll_into`]: no allocation per poll.
    fn poll_into(&self, out: &mut [WorkCompletion]) -> Result<usize, ProviderError> {
        self.0.poll_into(out).map_err(cq_error)
    }
}

/// The QP of a [`SoftId`]. Dropping it destroys it (`rdma_destroy_qp` on its id).
pub struct SoftQpHandle {
    qp: QpOf<SoftDevice>,
    id: CmIdRef<SoftDevice>,
}

impl std::fmt::Debug for SoftQpHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftQpHandle")
            .field("qp_num", &self.qp.qp_num())
            .finish()
    }
}

impl SoftQpHandle {
    /// The soft QP (its state, statistics).
    pub fn qp(&self) -> &QpOf<SoftDevice> {
        &self.qp
    }
}

impl Drop for SoftQpHandle {
    fn drop(&mut self) {
        self.id.destroy_qp();
    }
}

impl QueuePair for SoftQpHandle {
    fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    fn cap(&self) -> QpCap {
        self.qp.query_qp().cap
    }

    fn post_send(&self, wr: SendWr) -> Result<(), ProviderError> {
        self.qp.post_send(wr).map_err(vb("ibv_post_send"))
    }

    fn post_recv(&self, wr: RecvWr) -> Result<(), ProviderError> {
        self.qp.post_recv(wr).map_err(vb("ibv_post_recv"))
    }

    /// [`crate::Qp::post_send_list`]: the whole list with one doorbell (one engine
    /// wake-up).
    fn post_send_list<I>(&self, wrs: I) -> Result<(), ProviderError>
    where
        I: IntoIterator<Item = SendWr>,
    {
        self.qp
            .post_send_list(wrs)
            .map_err(|e| ProviderError::verbs("ibv_post_send", e.error))
    }

    /// [`crate::Qp::post_recv_list`]: the whole list with one doorbell.
    fn post_recv_list<I>(&self, wrs: I) -> Result<(), ProviderError>
    where
        I: IntoIterator<Item = RecvWr>,
    {
        self.qp
            .post_recv_list(wrs)
            .map_err(|e| ProviderError::verbs("ibv_post_recv", e.error))
    }
}

/// The soft device of an id (`id->verbs`).
#[derive(Debug, Clone)]
pub struct SoftDev(pub Arc<SoftDevice>);

impl Device for SoftDev {
    type Pd = SoftPd;
    type Cq = SoftCq;

    fn name(&self) -> String {
        self.0.device().name().to_string()
    }

    fn caps(&self) -> Result<DeviceCaps, ProviderError> {
        Ok(soft_caps(&self.0.device().query_device()))
    }

    fn alloc_pd(&self) -> Result<SoftPd, ProviderError> {
        let pd = self.0.device().alloc_pd().map_err(vb("ibv_alloc_pd"))?;
        Ok(SoftPd {
            pd,
            next_iova: Mutex::new(IOVA_BASE),
        })
    }

    fn create_cq(&self, cqe: u32) -> Result<SoftCq, ProviderError> {
        let cqe = usize::try_from(cqe).map_err(|_| {
            ProviderError::verbs("ibv_create_cq", VerbsError::InvalidArgument { what: "cqe" })
        })?;
        self.0
            .device()
            .create_cq(cqe)
            .map(SoftCq)
            .map_err(vb("ibv_create_cq"))
    }
}

/// An rdma-cm id of the soft device; dropping it destroys it (`rdma_destroy_id`).
#[derive(Debug)]
pub struct SoftId(pub rdma_cm::CmId<SoftDevice>);

impl provider::CmId for SoftId {
    type Device = SoftDev;
    type Qp = SoftQpHandle;

    fn key(&self) -> u64 {
        self.0.serial()
    }

    fn bind_addr(&self, addr: SocketAddr) -> Result<(), ProviderError> {
        self.0.bind_addr(addr).map_err(cm("rdma_bind_addr"))
    }

    fn listen(&self, backlog: u32) -> Result<(), ProviderError> {
        self.0.listen(backlog).map_err(cm("rdma_listen"))
    }

    fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), ProviderError> {
        self.0
            .resolve_addr(src, dst, timeout)
            .map_err(cm("rdma_resolve_addr"))
    }

    fn resolve_route(&self, timeout: Duration) -> Result<(), ProviderError> {
        self.0
            .resolve_route(timeout)
            .map_err(cm("rdma_resolve_route"))
    }

    fn connect(&self, param: &ConnParam) -> Result<(), ProviderError> {
        self.0
            .connect(&conn_param(param))
            .map_err(cm("rdma_connect"))
    }

    fn accept(&self, param: &ConnParam) -> Result<(), ProviderError> {
        self.0.accept(&conn_param(param)).map_err(cm("rdma_accept"))
    }

    fn reject(&self, private_data: &[u8]) -> Result<(), ProviderError> {
        self.0.reject(private_data).map_err(cm("rdma_reject"))
    }

    fn disconnect(&self) -> Result<(), ProviderError> {
        self.0.disconnect().map_err(cm("rdma_disconnect"))
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.0.local_addr()
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.0.peer_addr()
    }

    fn device(&self) -> Option<SoftDev> {
        self.0.device().map(SoftDev)
    }

    fn create_qp(
        &self,
        pd: &SoftPd,
        send_cq: &SoftCq,
        recv_cq: &SoftCq,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> Result<SoftQpHandle, ProviderError> {
        let qp = self
            .0
            .create_qp(
                &pd.pd,
                QpInitAttr {
                    send_cq: &send_cq.0,
                    recv_cq: &recv_cq.0,
                    cap,
                    sq_sig_all,
                },
            )
            .map_err(cm("rdma_create_qp"))?;
        Ok(SoftQpHandle {
            qp,
            id: self.0.as_ref(),
        })
    }
}

/// An event of a [`SoftCm`]'s channel; acked when dropped.
#[derive(Debug)]
pub struct SoftEvent(pub ChannelEvent<SoftDevice>);

impl provider::CmEvent for SoftEvent {
    type Id = SoftId;

    fn kind(&self) -> CmEventKind {
        kind_to_neutral(self.0.kind)
    }

    fn status(&self) -> i32 {
        self.0.status
    }

    fn id_key(&self) -> u64 {
        self.0
            .listener()
            .unwrap_or_else(|| self.0.id().clone())
            .serial()
    }

    fn take_new_id(&mut self) -> Option<SoftId> {
        self.0.take_new_id().map(SoftId)
    }

    fn conn_param(&self) -> ConnParam {
        ConnParam {
            private_data: self.0.private_data.clone(),
            responder_resources: self.0.responder_resources,
            initiator_depth: self.0.initiator_depth,
        }
    }
}

/// An event channel of a [`SoftRdmaCm`]: the soft device's [`Provider`].
pub struct SoftCm<'a> {
    cm: &'a SoftRdmaCm,
    channel: EventChannel<SoftDevice>,
}

impl std::fmt::Debug for SoftCm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftCm")
            .field("devices", &self.cm.devices())
            .field("channel", &self.channel)
            .finish()
    }
}

impl<'a> SoftCm<'a> {
    /// A new event channel of `cm` (`rdma_create_event_channel`).
    pub fn new(cm: &'a SoftRdmaCm) -> SoftCm<'a> {
        SoftCm {
            cm,
            channel: cm.create_event_channel(),
        }
    }

    /// The rdma-cm channel.
    pub fn channel(&self) -> &EventChannel<SoftDevice> {
        &self.channel
    }
}

impl Provider for SoftCm<'_> {
    type Mr = SoftMr;
    type Pd = SoftPd;
    type Cq = SoftCq;
    type Qp = SoftQpHandle;
    type Device = SoftDev;
    type Id = SoftId;
    type Event = SoftEvent;

    fn create_id(&self) -> Result<SoftId, ProviderError> {
        Ok(SoftId(self.cm.create_id_with_channel(&self.channel)))
    }

    fn get_event(&self, timeout: Duration) -> Result<Option<SoftEvent>, ProviderError> {
        match self.channel.get_event_timeout(timeout) {
            Ok(ev) => Ok(Some(SoftEvent(ev))),
            Err(CmError::Timeout { .. }) => Ok(None),
            Err(e) => Err(cm_error("rdma_get_cm_event", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::{MemoryConfig, MemoryLink};
    use crate::{DeviceConfig, LinkConfig};
    use std::net::Ipv4Addr;
    use verbs::provider::{CmEvent as _, CmId as _};
    use verbs::{SendFlags, WcOpcode, WcStatus};

    const SERVER: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
    const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
    const STEP: Duration = Duration::from_secs(20);

    /// Two hosts on a memory link, each with its own RDMA CM.
    fn pair() -> (SoftRdmaCm, SoftRdmaCm) {
        let (s, c, _) = pair_with_control();
        (s, c)
    }

    /// [`pair`], with the control of the client's link end.
    fn pair_with_control() -> (SoftRdmaCm, SoftRdmaCm, crate::link::MemoryControl) {
        let (l1, l2) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let control = l1.control();
        let host = |name: &str, link, ip| {
            let dev =
                crate::Device::open(DeviceConfig::new(name, LinkConfig::memory(link), ip, 24))
                    .unwrap();
            let cm = SoftRdmaCm::new(rdma_cm::RdmaCmConfig {
                name: name.into(),
                ..rdma_cm::RdmaCmConfig::default()
            })
            .unwrap();
            cm.add_device(SoftDevice::new(Arc::new(dev)).unwrap())
                .unwrap();
            cm
        };
        (host("psrv", l2, SERVER), host("pcli", l1, CLIENT), control)
    }

    /// The next event, which must be `want`.
    fn expect<P: Provider>(p: &P, want: CmEventKind) -> P::Event {
        let ev = p
            .get_event(STEP)
            .unwrap()
            .unwrap_or_else(|| panic!("no event, waiting for {want}"));
        assert_eq!(ev.kind(), want, "status {}", ev.status());
        ev
    }

    /// The next successful completion on `cq`.
    fn completion<C: CompletionQueue>(cq: &C) -> WorkCompletion {
        let deadline = std::time::Instant::now() + STEP;
        loop {
            if let Some(wc) = cq.poll(1).unwrap().pop() {
                return wc;
            }
            assert!(std::time::Instant::now() < deadline, "no completion");
            cq.wait(Duration::from_millis(50)).unwrap();
        }
    }

    const CAP: QpCap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    const REMOTE: AccessFlags = AccessFlags::LOCAL_WRITE
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_READ);

    /// Server, generic over the backend: accept one connection, receive the client's
    /// (iova, rkey) in a Send, RDMA Write `payload` there, Send a go-ahead, wait for
    /// DISCONNECTED. Returns the request's `responder_resources` and `initiator_depth`.
    fn serve<P: Provider>(p: &P, port: u16, payload: &[u8]) -> (u16, u16) {
        let listener = p.create_id().unwrap();
        listener
            .bind_addr(SocketAddr::from((SERVER, port)))
            .unwrap();
        listener.listen(4).unwrap();
        let mut req = expect(p, CmEventKind::ConnectRequest);
        assert_eq!(req.id_key(), listener.key());
        let peer = req.conn_param();
        let id = req.take_new_id().expect("the new id");
        assert!(req.take_new_id().is_none(), "taken once");
        drop(req);
        let dev = id.device().expect("the new id has a device");
        let caps = dev.caps().unwrap();
        // The request's responder_resources is the peer's ORD, its initiator_depth the
        // peer's IRD (librdmacm's, so rdma_accept(id, NULL) mirrors them): our ORD at
        // most the peer's IRD, our IRD 64.
        let (ord, ird) = caps.clamp_ord_ird(peer.initiator_depth.into(), 64);
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let qp = id.create_qp(&pd, &cq, &cq, CAP, false).unwrap();
        let info = pd.reg_mr(16, AccessFlags::LOCAL_WRITE).unwrap();
        let mut data = pd.reg_mr(payload.len(), AccessFlags::empty()).unwrap();
        data.write(0, payload).unwrap();
        qp.post_recv(RecvWr::new(1, vec![info.sge(0, 16).unwrap()]))
            .unwrap();
        id.accept(&ConnParam::new(ird.into(), ord.into())).unwrap();
        expect(p, CmEventKind::Established);
        let wc = completion(&cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (1, WcStatus::Success, 12)
        );
        let mut b = [0u8; 12];
        info.read(0, &mut b).unwrap();
        let iova = u64::from_le_bytes(b[..8].try_into().unwrap());
        let rkey = Stag::from_raw(u32::from_le_bytes(b[8..].try_into().unwrap()));
        let sge = data.sge(0, payload.len() as u32).unwrap();
        qp.post_send(SendWr::rdma_write(2, vec![sge], iova, rkey).with_flags(SendFlags::SIGNALED))
            .unwrap();
        let wc = completion(&cq);
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status),
            (2, WcOpcode::RdmaWrite, WcStatus::Success)
        );
        qp.post_send(SendWr::send(3, vec![]).with_flags(SendFlags::SIGNALED))
            .unwrap();
        assert_eq!(completion(&cq).wr_id, 3);
        expect(p, CmEventKind::Disconnected);
        (peer.responder_resources, peer.initiator_depth)
    }

    /// Client, generic over the backend: connect, advertise a sink, wait for the
    /// server's go-ahead, return the sink's bytes and the server's IRD/ORD.
    fn fetch<P: Provider>(p: &P, port: u16, len: usize) -> (Vec<u8>, ConnParam) {
        let id = p.create_id().unwrap();
        id.resolve_addr(None, SocketAddr::from((SERVER, port)), STEP)
            .unwrap();
        expect(p, CmEventKind::AddrResolved);
        id.resolve_route(STEP).unwrap();
        expect(p, CmEventKind::RouteResolved);
        let dev = id.device().expect("resolved: a device");
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let qp = id.create_qp(&pd, &cq, &cq, CAP, false).unwrap();
        let sink = pd.reg_mr(len, REMOTE).unwrap();
        let mut info = pd.reg_mr(16, AccessFlags::empty()).unwrap();
        let go = pd.reg_mr(16, AccessFlags::LOCAL_WRITE).unwrap();
        assert!(sink.iova().is_multiple_of(IOVA_ALIGN) && info.iova() > sink.iova());
        qp.post_recv(RecvWr::new(9, vec![go.sge(0, 16).unwrap()]))
            .unwrap();
        id.connect(&ConnParam::new(2, 3)).unwrap();
        let est = expect(p, CmEventKind::Established);
        let server = est.conn_param();
        drop(est);
        let mut msg = sink.iova().to_le_bytes().to_vec();
        msg.extend_from_slice(&u32::from(sink.rkey()).to_le_bytes());
        info.write(0, &msg).unwrap();
        qp.post_send(SendWr::send(4, vec![info.sge(0, 12).unwrap()]))
            .unwrap();
        let wc = completion(&cq);
        assert_eq!((wc.wr_id, wc.opcode, wc.byte_len), (9, WcOpcode::Recv, 0));
        let mut got = vec![0u8; len];
        sink.read(0, &mut got).unwrap();
        id.disconnect().unwrap();
        expect(p, CmEventKind::Disconnected);
        drop(qp);
        (got, server)
    }

    #[test]
    fn one_generic_code_path_connects_writes_and_disconnects_on_the_soft_device() {
        let (scm, ccm) = pair();
        let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
        let want = payload.clone();
        let server = std::thread::spawn(move || serve(&SoftCm::new(&scm), 7001, &payload));
        std::thread::sleep(Duration::from_millis(300));
        let (got, server_param) = fetch(&SoftCm::new(&ccm), 7001, 3000);
        let request = server.join().unwrap();
        assert_eq!(got, want);
        // The client asked IRD 2, ORD 3: the request carries its ORD 3 as
        // responder_resources and its IRD 2 as initiator_depth; the server accepts with
        // ORD 2 and IRD 64, which the client's ESTABLISHED reports the same way round.
        assert_eq!(request, (3, 2));
        assert_eq!(
            (
                server_param.responder_resources,
                server_param.initiator_depth
            ),
            (2, 64)
        );
    }

    #[test]
    fn a_rejected_request_reaches_the_client_with_its_private_data() {
        let (scm, ccm) = pair();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel::<()>();
        let server = std::thread::spawn(move || {
            let p = SoftCm::new(&scm);
            let l = p.create_id().unwrap();
            l.bind_addr(SocketAddr::from((SERVER, 7002))).unwrap();
            l.listen(1).unwrap();
            let mut req = expect(&p, CmEventKind::ConnectRequest);
            assert_eq!(req.private_data(), b"hi");
            let new = req.take_new_id().unwrap();
            new.reject(b"busy").unwrap();
            drop(new);
            // The server's CM (and with it its device) lives until the client saw the
            // reject: ending this thread at once drops them, which can abort the
            // connection before the reject Reply's private data is read.
            let _ = seen_rx.recv_timeout(STEP);
        });
        std::thread::sleep(Duration::from_millis(300));
        let p = SoftCm::new(&ccm);
        let id = p.create_id().unwrap();
        id.resolve_addr(None, SocketAddr::from((SERVER, 7002)), STEP)
            .unwrap();
        expect(&p, CmEventKind::AddrResolved);
        id.resolve_route(STEP).unwrap();
        expect(&p, CmEventKind::RouteResolved);
        let dev = id.device().unwrap();
        let (pd, cq) = (dev.alloc_pd().unwrap(), dev.create_cq(4).unwrap());
        let _qp = id.create_qp(&pd, &cq, &cq, CAP, false).unwrap();
        let mut param = ConnParam::new(1, 1);
        param.private_data = b"hi".to_vec();
        id.connect(&param).unwrap();
        let ev = expect(&p, CmEventKind::Rejected);
        assert_eq!(ev.id_key(), id.key());
        // -ECONNREFUSED, and the reject Reply's private data.
        assert_eq!(ev.status(), -111);
        assert_eq!(ev.private_data(), b"busy");
        seen_tx.send(()).unwrap();
        server.join().unwrap();
    }

    #[test]
    fn errors_timeouts_and_caps_are_the_soft_devices() {
        let (_scm, ccm) = pair();
        let p = SoftCm::new(&ccm);
        let t = std::time::Instant::now();
        assert!(p.get_event(Duration::from_millis(50)).unwrap().is_none());
        assert!(t.elapsed() >= Duration::from_millis(50));
        let id = p.create_id().unwrap();
        assert!(id.device().is_none(), "unbound: no device");
        // A route before an address is refused with EINVAL, naming the call.
        let e = id.resolve_route(STEP).unwrap_err();
        assert_eq!((e.call_name(), e.errno()), ("rdma_resolve_route", 22));
        // A local address no device owns.
        let e = id
            .bind_addr(SocketAddr::from((Ipv4Addr::new(10, 99, 9, 9), 1)))
            .unwrap_err();
        assert_eq!(e.errno(), 99, "{e}");
        id.bind_addr(SocketAddr::from((CLIENT, 0))).unwrap();
        let dev = id.device().unwrap();
        assert_eq!(dev.name(), "pcli");
        let caps = dev.caps().unwrap();
        assert_eq!(caps, soft_caps(&DeviceAttr::SOFT));
        assert_eq!(
            (caps.max_sge, caps.max_sge_rd, caps.max_inline, caps.max_ord),
            (16, 16, 4096, 0x3fff)
        );
        assert!(caps.write_imm && caps.atomics && !caps.read_sink_needs_remote_write);
        let pd = dev.alloc_pd().unwrap();
        let e = pd.reg_mr(0, AccessFlags::LOCAL_WRITE).unwrap_err();
        assert_eq!((e.call_name(), e.errno()), ("ibv_reg_mr", 22));
        let e = pd.reg_mr(8, AccessFlags::REMOTE_WRITE).unwrap_err();
        assert_eq!(e.errno(), 22, "remote write without local write: {e}");
        let a = pd.reg_mr(1, AccessFlags::LOCAL_WRITE).unwrap();
        let mut b = pd.reg_mr((1 << 20) + 1, AccessFlags::LOCAL_WRITE).unwrap();
        let c = pd.reg_mr(4, AccessFlags::LOCAL_WRITE).unwrap();
        assert_eq!(a.iova(), IOVA_BASE);
        assert_eq!(b.iova(), IOVA_BASE + (1 << 20));
        assert_eq!(c.iova(), IOVA_BASE + (3 << 20));
        assert_eq!(a.lkey(), a.rkey());
        let e = b.write(1 << 20, &[1, 2]).unwrap_err();
        assert_eq!(e.errno(), 22);
        b.write(1 << 20, &[7]).unwrap();
        let mut one = [0u8];
        b.read(1 << 20, &mut one).unwrap();
        assert_eq!(one, [7]);
        assert_eq!(c.sge(0, 5), None);
        assert!(dev.create_cq(0).is_err());
        let cq = dev.create_cq(4).unwrap();
        assert!(cq.poll(4).unwrap().is_empty());
        assert!(!cq.wait(Duration::from_millis(20)).unwrap());
    }

    #[test]
    fn every_rdma_cm_kind_maps_to_the_librdmacm_kind_of_its_name() {
        for k in EventKind::ALL {
            assert_eq!(kind_to_neutral(k).librdmacm_name(), k.librdmacm_name());
        }
    }

    /// Cutting the client's link under a live connection, seen through the boundary:
    /// exactly one `DeviceRemoval`, for the connected id, nothing after it, and every
    /// posted receive completes flushed, in order; then the QP, the event and the id are
    /// dropped in the order the boundary documents.
    #[test]
    fn a_cut_link_is_one_device_removal_and_flushes_every_receive() {
        let (scm, ccm, cut) = pair_with_control();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let server = std::thread::spawn(move || {
            let p = SoftCm::new(&scm);
            let l = p.create_id().unwrap();
            l.bind_addr(SocketAddr::from((SERVER, 7003))).unwrap();
            l.listen(1).unwrap();
            let id = expect(&p, CmEventKind::ConnectRequest)
                .take_new_id()
                .unwrap();
            let dev = id.device().unwrap();
            let (pd, cq) = (dev.alloc_pd().unwrap(), dev.create_cq(8).unwrap());
            let _qp = id.create_qp(&pd, &cq, &cq, CAP, false).unwrap();
            id.accept(&ConnParam::new(1, 1)).unwrap();
            expect(&p, CmEventKind::Established);
            ready_tx.send(()).unwrap();
            let _ = done_rx.recv_timeout(STEP);
        });
        let p = SoftCm::new(&ccm);
        std::thread::sleep(Duration::from_millis(300));
        let id = p.create_id().unwrap();
        id.resolve_addr(None, SocketAddr::from((SERVER, 7003)), STEP)
            .unwrap();
        expect(&p, CmEventKind::AddrResolved);
        id.resolve_route(STEP).unwrap();
        expect(&p, CmEventKind::RouteResolved);
        let dev = id.device().unwrap();
        let (pd, cq) = (dev.alloc_pd().unwrap(), dev.create_cq(8).unwrap());
        let qp = id.create_qp(&pd, &cq, &cq, CAP, false).unwrap();
        let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        for wr_id in 1..=3 {
            qp.post_recv(RecvWr::new(wr_id, vec![mr.sge(0, 64).unwrap()]))
                .unwrap();
        }
        id.connect(&ConnParam::new(1, 1)).unwrap();
        expect(&p, CmEventKind::Established);
        ready_rx.recv_timeout(STEP).unwrap();
        cut.remove();
        let ev = expect(&p, CmEventKind::DeviceRemoval);
        assert_eq!(ev.id_key(), id.key());
        assert!(
            p.get_event(Duration::from_millis(500)).unwrap().is_none(),
            "nothing after DeviceRemoval"
        );
        let mut flushed = Vec::new();
        while flushed.len() < 3 {
            let wc = completion(&cq);
            assert_eq!(wc.status, WcStatus::WrFlushErr, "{wc:?}");
            flushed.push(wc.wr_id);
        }
        assert_eq!(flushed, [1, 2, 3]);
        assert!(cq.poll(8).unwrap().is_empty(), "each WR completes once");
        drop(qp);
        drop(ev);
        drop(id);
        assert!(dev.alloc_pd().is_err(), "the device is gone");
        done_tx.send(()).unwrap();
        server.join().unwrap();
    }
}
