//! rdma-core behind the provider-neutral boundary ([`verbs::provider`]): the
//! same application code runs here and on the soft device.
//!
//! | trait | here |
//! |---|---|
//! | [`Provider`] | [`EventChannel`]: `get_event(timeout)` polls the channel's fd, then takes the event non-blocking |
//! | [`CmId`](verbs::provider::CmId) | [`CmId`]: the `rdma_*` calls; `device()` is librdmacm's `id->verbs` |
//! | [`CmEvent`](verbs::provider::CmEvent) | [`Event`]: a [`CmEvent`] whose new id (of a request) can be taken |
//! | [`Device`] | [`Context`]: caps, PD, and CQs with their own completion channel |
//! | [`CompletionQueue`] | [`WaitCq`]: a [`Cq`] bound to its own [`CompChannel`], so `wait` can block |
//! | [`ProtectionDomain`], [`MemoryRegion`], [`QueuePair`] | [`Pd`], [`Mr`], [`Qp`] |
//!
//! Errors become [`ProviderError`]: a [`VerbsError`] keeps its call; a library
//! that would not load or an unknown device name becomes
//! [`ProviderError::Call`] with its one-line message.

use crate::cm::{CmEvent, CmId, ConnParam as RawConnParam, EventChannel};
use crate::cq::{CompChannel, Cq};
use crate::device::Context;
use crate::error::Error;
use crate::pd::{Mr, Pd};
use crate::qp::Qp;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use verbs::provider::{
    self, CmEventKind, CompletionQueue, ConnParam, Device, MemoryRegion, ProtectionDomain,
    Provider, ProviderError, QueuePair,
};
use verbs::{AccessFlags, DeviceCaps, QpCap, RecvWr, SendWr, Stag, VerbsError, WorkCompletion};

/// `EAGAIN`: a non-blocking get-event found nothing.
const EAGAIN: i32 = libc::EAGAIN;

/// The [`ProviderError`] of a failed `call`.
pub fn provider_error(call: &'static str, e: Error) -> ProviderError {
    match e {
        Error::Verbs(source) => ProviderError::verbs(call, source),
        other => ProviderError::call(call, other.errno(), other.to_string()),
    }
}

fn pe(call: &'static str) -> impl Fn(Error) -> ProviderError {
    move |e| provider_error(call, e)
}

/// librdmacm's `uint8_t` ORD/IRD of a neutral value.
fn depth(v: u16, what: &'static str) -> Result<u8, ProviderError> {
    u8::try_from(v).map_err(|_| ProviderError::verbs(what, VerbsError::InvalidArgument { what }))
}

/// The rdma-core connection parameters of neutral ones: ORD/IRD above 255 (the
/// `uint8_t` fields) are refused with `EINVAL`; iWARP ignores the retry counts.
///
/// # Errors
///
/// [`VerbsError::InvalidArgument`] naming the field.
pub fn conn_param_to_raw(p: &ConnParam) -> Result<RawConnParam, ProviderError> {
    Ok(RawConnParam {
        private_data: p.private_data.clone(),
        responder_resources: depth(p.responder_resources, "responder_resources (at most 255)")?,
        initiator_depth: depth(p.initiator_depth, "initiator_depth (at most 255)")?,
        flow_control: 0,
        retry_count: 7,
        rnr_retry_count: 7,
    })
}

/// The neutral connection parameters of rdma-core ones.
pub fn conn_param_from_raw(p: &RawConnParam) -> ConnParam {
    ConnParam {
        private_data: p.private_data.clone(),
        responder_resources: p.responder_resources.into(),
        initiator_depth: p.initiator_depth.into(),
    }
}

fn ms(timeout: Duration) -> i32 {
    i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX)
}

fn out_of_bounds(mr: &Mr, offset: usize, len: usize) -> ProviderError {
    ProviderError::verbs(
        "MR buffer",
        VerbsError::MrOutOfBounds {
            addr: mr.addr().wrapping_add(offset as u64),
            length: len as u64,
            mr_addr: mr.addr(),
            mr_length: mr.len() as u64,
        },
    )
}

impl MemoryRegion for Mr {
    fn lkey(&self) -> Stag {
        Mr::lkey(self)
    }

    fn rkey(&self) -> Stag {
        Mr::rkey(self)
    }

    fn iova(&self) -> u64 {
        self.addr()
    }

    fn len(&self) -> usize {
        Mr::len(self)
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), ProviderError> {
        // A raw copy: the device may be writing this memory (iwperf polls a byte an
        // RDMA Write lands in), so no Rust reference to it is formed.
        if self.copy_out(offset, out) {
            Ok(())
        } else {
            Err(out_of_bounds(self, offset, out.len()))
        }
    }

    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), ProviderError> {
        if self.copy_in(offset, data) {
            Ok(())
        } else {
            Err(out_of_bounds(self, offset, data.len()))
        }
    }
}

impl ProtectionDomain for Pd {
    type Mr = Mr;

    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Mr, ProviderError> {
        Pd::reg_mr(self, len, access).map_err(pe("ibv_reg_mr"))
    }
}

/// A CQ bound to a completion channel of its own, so [`CompletionQueue::wait`]
/// can block on the channel's fd (arm, poll the fd, take and acknowledge the
/// event). Completions found while arming are kept for the next poll, so a
/// completion that raced the arming is never waited for.
pub struct WaitCq {
    cq: Cq,
    channel: CompChannel,
    stash: Mutex<VecDeque<WorkCompletion>>,
}

impl std::fmt::Debug for WaitCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitCq")
            .field("cq", &self.cq)
            .field("channel", &self.channel)
            .finish()
    }
}

impl WaitCq {
    /// The CQ (to pass to [`CmId::create_qp`]).
    pub fn cq(&self) -> &Cq {
        &self.cq
    }

    fn stash(&self) -> std::sync::MutexGuard<'_, VecDeque<WorkCompletion>> {
        self.stash.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl CompletionQueue for WaitCq {
    fn poll(&self, max: usize) -> Result<Vec<WorkCompletion>, ProviderError> {
        let mut out: Vec<WorkCompletion> = {
            let mut stash = self.stash();
            let n = stash.len().min(max);
            stash.drain(..n).collect()
        };
        if out.len() < max {
            self.cq
                .poll(max - out.len(), &mut out)
                .map_err(pe("ibv_poll_cq"))?;
        }
        Ok(out)
    }

    fn wait(&self, timeout: Duration) -> Result<bool, ProviderError> {
        if !self.stash().is_empty() {
            return Ok(true);
        }
        self.cq.req_notify(false).map_err(pe("ibv_req_notify_cq"))?;
        // A completion queued before the arming raises no event: look once more.
        let mut found = Vec::new();
        self.cq
            .poll(crate::cq::POLL_BATCH, &mut found)
            .map_err(pe("ibv_poll_cq"))?;
        if !found.is_empty() {
            self.stash().extend(found);
            return Ok(true);
        }
        let ready = crate::ffi::wait_readable(self.channel.fd(), timeout).map_err(|e| {
            ProviderError::call("poll", e.raw_os_error().unwrap_or(0), e.to_string())
        })?;
        if ready {
            match self.cq.get_event() {
                Ok(()) => {}
                Err(e) if e.errno() == EAGAIN => {}
                Err(e) => return Err(provider_error("ibv_get_cq_event", e)),
            }
        }
        Ok(ready)
    }
}

impl Device for Context {
    type Pd = Pd;
    type Cq = WaitCq;

    fn name(&self) -> String {
        Context::name(self)
    }

    fn caps(&self) -> Result<DeviceCaps, ProviderError> {
        Context::caps(self).map_err(pe("ibv_query_device"))
    }

    fn alloc_pd(&self) -> Result<Pd, ProviderError> {
        Context::alloc_pd(self).map_err(pe("ibv_alloc_pd"))
    }

    fn create_cq(&self, cqe: u32) -> Result<WaitCq, ProviderError> {
        let channel = self
            .create_comp_channel()
            .map_err(pe("ibv_create_comp_channel"))?;
        channel.set_nonblocking(true).map_err(|e| {
            ProviderError::call("fcntl", e.raw_os_error().unwrap_or(0), e.to_string())
        })?;
        let cq = Context::create_cq(self, cqe, Some(&channel)).map_err(pe("ibv_create_cq"))?;
        Ok(WaitCq {
            cq,
            channel,
            stash: Mutex::new(VecDeque::new()),
        })
    }
}

impl QueuePair for Qp {
    fn qp_num(&self) -> u32 {
        Qp::qp_num(self)
    }

    fn cap(&self) -> QpCap {
        Qp::cap(self)
    }

    fn post_send(&self, wr: SendWr) -> Result<(), ProviderError> {
        Qp::post_send(self, &wr).map_err(pe("ibv_post_send"))
    }

    fn post_recv(&self, wr: RecvWr) -> Result<(), ProviderError> {
        Qp::post_recv(self, &wr).map_err(pe("ibv_post_recv"))
    }
}

impl provider::CmId for CmId {
    type Device = Context;
    type Qp = Qp;

    fn key(&self) -> u64 {
        CmId::key(self)
    }

    fn bind_addr(&self, addr: SocketAddr) -> Result<(), ProviderError> {
        CmId::bind_addr(self, addr).map_err(pe("rdma_bind_addr"))
    }

    fn listen(&self, backlog: u32) -> Result<(), ProviderError> {
        let backlog = i32::try_from(backlog).unwrap_or(i32::MAX);
        CmId::listen(self, backlog).map_err(pe("rdma_listen"))
    }

    fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), ProviderError> {
        CmId::resolve_addr(self, src, dst, ms(timeout)).map_err(pe("rdma_resolve_addr"))
    }

    fn resolve_route(&self, timeout: Duration) -> Result<(), ProviderError> {
        CmId::resolve_route(self, ms(timeout)).map_err(pe("rdma_resolve_route"))
    }

    fn connect(&self, param: &ConnParam) -> Result<(), ProviderError> {
        CmId::connect(self, &conn_param_to_raw(param)?).map_err(pe("rdma_connect"))
    }

    fn accept(&self, param: &ConnParam) -> Result<(), ProviderError> {
        CmId::accept(self, &conn_param_to_raw(param)?).map_err(pe("rdma_accept"))
    }

    fn reject(&self, private_data: &[u8]) -> Result<(), ProviderError> {
        CmId::reject(self, private_data).map_err(pe("rdma_reject"))
    }

    fn disconnect(&self) -> Result<(), ProviderError> {
        CmId::disconnect(self).map_err(pe("rdma_disconnect"))
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        CmId::local_addr(self)
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        CmId::peer_addr(self)
    }

    fn device(&self) -> Option<Context> {
        self.context()
    }

    fn create_qp(
        &self,
        pd: &Pd,
        send_cq: &WaitCq,
        recv_cq: &WaitCq,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> Result<Qp, ProviderError> {
        CmId::create_qp(self, pd, &send_cq.cq, &recv_cq.cq, cap, sq_sig_all)
            .map_err(pe("rdma_create_qp"))
    }
}

/// A [`CmEvent`] behind the boundary: acknowledged on drop (after any new id
/// taken from it is out of its hands; the event keeps its own handle of the id
/// until the ack).
#[derive(Debug)]
pub struct Event {
    ev: CmEvent,
    new_id_taken: bool,
}

impl Event {
    /// The rdma-core event.
    pub fn inner(&self) -> &CmEvent {
        &self.ev
    }
}

impl provider::CmEvent for Event {
    type Id = CmId;

    fn kind(&self) -> CmEventKind {
        self.ev.kind()
    }

    fn status(&self) -> i32 {
        self.ev.status()
    }

    fn id_key(&self) -> u64 {
        self.ev.listen_id().unwrap_or(self.ev.id()).key()
    }

    fn take_new_id(&mut self) -> Option<CmId> {
        if self.ev.kind() != CmEventKind::ConnectRequest || self.new_id_taken {
            return None;
        }
        self.new_id_taken = true;
        Some(self.ev.id().clone())
    }

    fn conn_param(&self) -> ConnParam {
        conn_param_from_raw(self.ev.conn_param())
    }
}

impl Provider for EventChannel {
    type Mr = Mr;
    type Pd = Pd;
    type Cq = WaitCq;
    type Qp = Qp;
    type Device = Context;
    type Id = CmId;
    type Event = Event;

    fn create_id(&self) -> Result<CmId, ProviderError> {
        EventChannel::create_id(self).map_err(pe("rdma_create_id"))
    }

    /// Polls the channel's fd for up to `timeout`, then takes the event with the
    /// fd non-blocking (set here), so an event skipped by
    /// [`EventChannel::get_event`] (of an id already dropped) never blocks.
    fn get_event(&self, timeout: Duration) -> Result<Option<Event>, ProviderError> {
        let fd_error = |e: std::io::Error| {
            ProviderError::call("poll", e.raw_os_error().unwrap_or(0), e.to_string())
        };
        self.set_nonblocking(true).map_err(fd_error)?;
        let deadline = Instant::now() + timeout;
        loop {
            match EventChannel::get_event(self) {
                Ok(ev) => {
                    return Ok(Some(Event {
                        ev,
                        new_id_taken: false,
                    }))
                }
                Err(e) if e.errno() == EAGAIN => {}
                Err(e) => return Err(provider_error("rdma_get_cm_event", e)),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !crate::ffi::wait_readable(self.fd(), left).map_err(fd_error)? {
                return Ok(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_params_cross_and_refuse_depths_above_u8() {
        let p = ConnParam {
            private_data: vec![9, 8],
            responder_resources: 32,
            initiator_depth: 16,
        };
        let raw = conn_param_to_raw(&p).unwrap();
        assert_eq!(
            (
                raw.responder_resources,
                raw.initiator_depth,
                raw.private_data.as_slice()
            ),
            (32, 16, &[9u8, 8][..])
        );
        assert_eq!(conn_param_from_raw(&raw), p);
        let e = conn_param_to_raw(&ConnParam::new(256, 1)).unwrap_err();
        assert_eq!(e.errno(), 22);
        assert!(e.to_string().contains("responder_resources"), "{e}");
        assert!(conn_param_to_raw(&ConnParam::new(1, 300)).is_err());
    }

    #[test]
    fn errors_keep_verbs_errors_and_one_line_messages() {
        let e = provider_error(
            "rdma_listen",
            Error::Verbs(VerbsError::Os {
                call: "rdma_listen",
                errno: 98,
            }),
        );
        assert_eq!((e.call_name(), e.errno()), ("rdma_listen", 98));
        let e = provider_error(
            "ibv_open_device",
            Error::NoSuchDevice {
                name: "cxgb4_0".into(),
                found: vec!["siw0".into()],
            },
        );
        assert_eq!(e.errno(), 19);
        assert_eq!(
            e.to_string(),
            "ibv_open_device: no RDMA device named 'cxgb4_0' (found: siw0)"
        );
    }
}
