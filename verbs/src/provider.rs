//! The provider-neutral boundary: the object traits a backend implements, so the same
//! application code runs on the soft device (`softiwarp`) and on rdma-core (`cxgb4`:
//! iw_cxgb4, kernel siw, any kernel iWARP device).
//!
//! The boundary sits at the verbs object level **and** at the RDMA CM, as in libfabric
//! (`fi_ops_msg` + `fi_ops_cm`) and unlike NCCL's opaque handles: an iWARP QP can only
//! be connected by the CM (shared/rdma-core-notes.md section 4). The CM is in
//! event-channel style, as librdmacm (`rdma_get_cm_event`) and `rdma_cm::EventChannel`
//! both are: the application creates ids on a [`Provider`] (the channel), calls them,
//! and takes owned events from [`Provider::get_event`]; an event is acknowledged
//! (`rdma_ack_cm_event`) when it is dropped.
//!
//! | trait | what | libibverbs / librdmacm |
//! |---|---|---|
//! | [`Provider`] | an event channel of one RDMA CM; names every object type | `rdma_create_event_channel`, `rdma_create_id`, `rdma_get_cm_event` |
//! | [`CmId`] | an id: bind, listen, resolve, connect, accept, reject, disconnect, its device and QP | `struct rdma_cm_id`, `rdma_*` |
//! | [`CmEvent`] | an owned event: [`CmEventKind`], status, the id, the new id of a request, [`ConnParam`] | `struct rdma_cm_event`, acked on drop |
//! | [`Device`] | an id's device (`id->verbs`): [`DeviceCaps`], PD, CQ | `struct ibv_context`, `ibv_query_device`, `ibv_alloc_pd`, `ibv_create_cq` |
//! | [`ProtectionDomain`] | registers MRs | `ibv_reg_mr` |
//! | [`MemoryRegion`] | lkey, rkey, iova, its bytes, SGEs over it | `struct ibv_mr` |
//! | [`CompletionQueue`] | poll, and a blocking wait | `ibv_poll_cq`, `ibv_req_notify_cq` + `ibv_get_cq_event` |
//! | [`QueuePair`] | post send / receive WRs, the QP number | `ibv_post_send`, `ibv_post_recv`, `qp->qp_num` |
//!
//! Static dispatch: every object type is an associated type of [`Provider`], so code
//! generic over `P: Provider` has no `dyn` on the data path. Every failure is one
//! [`ProviderError`] (a verbs error with the call it came from, or a CM call's errno
//! and message), so generic code has one error type to carry.
//!
//! The rules of design.md section 5 hold on both backends: events of one id arrive in
//! order; nothing is delivered for an id after it is destroyed (dropped); exactly one
//! [`CmEventKind::DeviceRemoval`] per live id; every WR accepted by a post completes
//! exactly once (the crate's completion-side contract). Drop order on device removal:
//! the QP, then the event, then the id, then the PD/CQ/MRs.
//!
//! Units: lengths and offsets in bytes; addresses are iovas; timeouts are
//! [`Duration`]s.

use std::net::SocketAddr;
use std::time::Duration;

use crate::{AccessFlags, DeviceCaps, QpCap, RecvWr, SendWr, Sge, Stag, VerbsError};

/// Why a call through the boundary failed: one error type for every backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// A verbs call failed (`ibv_post_send`, `ibv_reg_mr`, ...), with the verbs error.
    #[error("{call}: {source}")]
    Verbs {
        /// The libibverbs call it stands for.
        call: &'static str,
        /// Why.
        #[source]
        source: VerbsError,
    },
    /// A CM call (or another backend call without a verbs error) failed.
    #[error("{call}: {message}")]
    Call {
        /// The librdmacm call it stands for (`rdma_listen`, `rdma_get_cm_event`, ...).
        call: &'static str,
        /// The errno it maps to (0 when none applies).
        errno: i32,
        /// The backend's own one-line description.
        message: String,
    },
}

impl ProviderError {
    /// A verbs error of `call`.
    pub fn verbs(call: &'static str, source: VerbsError) -> ProviderError {
        ProviderError::Verbs { call, source }
    }

    /// A failed `call` with `errno` and the backend's message.
    pub fn call(call: &'static str, errno: i32, message: impl Into<String>) -> ProviderError {
        ProviderError::Call {
            call,
            errno,
            message: message.into(),
        }
    }

    /// The errno the failure maps to (as the C call would set it; 0 if none applies).
    pub fn errno(&self) -> i32 {
        match self {
            ProviderError::Verbs { source, .. } => source.errno(),
            ProviderError::Call { errno, .. } => *errno,
        }
    }

    /// The same failure, naming `call` instead (a caller's more precise label, e.g.
    /// `"ibv_post_send (RDMA Read)"`).
    pub fn in_call(self, call: &'static str) -> ProviderError {
        match self {
            ProviderError::Verbs { source, .. } => ProviderError::Verbs { call, source },
            ProviderError::Call { errno, message, .. } => ProviderError::Call {
                call,
                errno,
                message,
            },
        }
    }

    /// The call that failed.
    pub fn call_name(&self) -> &'static str {
        match self {
            ProviderError::Verbs { call, .. } | ProviderError::Call { call, .. } => call,
        }
    }
}

/// The kind of a CM event: librdmacm's `enum rdma_cm_event_type`, same names and
/// numbers ([`CmEventKind::to_raw`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CmEventKind {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED` (0): `resolve_addr` done; the id has a device.
    AddrResolved = 0,
    /// `RDMA_CM_EVENT_ADDR_ERROR` (1): `resolve_addr` failed (status: negative errno).
    AddrError = 1,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED` (2).
    RouteResolved = 2,
    /// `RDMA_CM_EVENT_ROUTE_ERROR` (3).
    RouteError = 3,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST` (4): at a listener; the event carries the new id
    /// ([`CmEvent::take_new_id`]).
    ConnectRequest = 4,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE` (5): only for ids without a QP (not iWARP's).
    ConnectResponse = 5,
    /// `RDMA_CM_EVENT_CONNECT_ERROR` (6).
    ConnectError = 6,
    /// `RDMA_CM_EVENT_UNREACHABLE` (7).
    Unreachable = 7,
    /// `RDMA_CM_EVENT_REJECTED` (8): status is the reject reason; private data the
    /// peer's.
    Rejected = 8,
    /// `RDMA_CM_EVENT_ESTABLISHED` (9).
    Established = 9,
    /// `RDMA_CM_EVENT_DISCONNECTED` (10): the QP is in Error (or SQD).
    Disconnected = 10,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL` (11): once per live id; nothing follows. Drop the
    /// QP, the event, the id, then the PD/CQ/MRs.
    DeviceRemoval = 11,
    /// `RDMA_CM_EVENT_MULTICAST_JOIN` (12) (not used on iWARP).
    MulticastJoin = 12,
    /// `RDMA_CM_EVENT_MULTICAST_ERROR` (13) (not used on iWARP).
    MulticastError = 13,
    /// `RDMA_CM_EVENT_ADDR_CHANGE` (14).
    AddrChange = 14,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT` (15) (InfiniBand; not on iWARP).
    TimewaitExit,
}

impl CmEventKind {
    /// Every kind, in librdmacm's numeric order.
    pub const ALL: [CmEventKind; 16] = [
        CmEventKind::AddrResolved,
        CmEventKind::AddrError,
        CmEventKind::RouteResolved,
        CmEventKind::RouteError,
        CmEventKind::ConnectRequest,
        CmEventKind::ConnectResponse,
        CmEventKind::ConnectError,
        CmEventKind::Unreachable,
        CmEventKind::Rejected,
        CmEventKind::Established,
        CmEventKind::Disconnected,
        CmEventKind::DeviceRemoval,
        CmEventKind::MulticastJoin,
        CmEventKind::MulticastError,
        CmEventKind::AddrChange,
        CmEventKind::TimewaitExit,
    ];

    /// librdmacm's numeric value.
    pub const fn to_raw(self) -> u32 {
        self as u32
    }

    /// The kind of a librdmacm numeric value; `None` for one it does not define.
    pub fn from_raw(v: u32) -> Option<CmEventKind> {
        CmEventKind::ALL.get(v as usize).copied()
    }

    /// librdmacm's name (`RDMA_CM_EVENT_...`, what `rdma_event_str` prints).
    pub const fn librdmacm_name(self) -> &'static str {
        match self {
            CmEventKind::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            CmEventKind::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            CmEventKind::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            CmEventKind::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            CmEventKind::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            CmEventKind::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            CmEventKind::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            CmEventKind::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            CmEventKind::Rejected => "RDMA_CM_EVENT_REJECTED",
            CmEventKind::Established => "RDMA_CM_EVENT_ESTABLISHED",
            CmEventKind::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            CmEventKind::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            CmEventKind::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            CmEventKind::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            CmEventKind::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            CmEventKind::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

impl std::fmt::Display for CmEventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.librdmacm_name())
    }
}

/// Connection parameters (`struct rdma_conn_param`) of `connect` / `accept`, and what
/// an event reports of the peer's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data of the MPA Request / Reply / reject; keep to 56 bytes for
    /// portability (rdma_connect(3)); backends refuse more than they carry
    /// (rdma-core: 255 bytes, `EINVAL`).
    pub private_data: Vec<u8>,
    /// IRD: RDMA Reads the local side accepts in flight (in an event: the peer's ORD).
    /// Clamp with [`DeviceCaps::clamp_ord_ird`]: iw_cxgb4 fails above 32 with `EINVAL`.
    pub responder_resources: u16,
    /// ORD: RDMA Reads the local side issues in flight (in an event: the peer's IRD).
    pub initiator_depth: u16,
}

impl ConnParam {
    /// Parameters with IRD `responder_resources`, ORD `initiator_depth` and no private
    /// data.
    pub fn new(responder_resources: u16, initiator_depth: u16) -> ConnParam {
        ConnParam {
            private_data: Vec::new(),
            responder_resources,
            initiator_depth,
        }
    }
}

/// A memory region over a buffer the MR owns (`struct ibv_mr`). Keep it until the WRs
/// posted on it have completed: WRs name memory by iova and key, not by a borrow.
pub trait MemoryRegion: Send + Sync {
    /// The local key (`ibv_mr.lkey`; on iWARP the STag, equal to [`Self::rkey`]).
    fn lkey(&self) -> Stag;

    /// The remote key to advertise to the peer (`ibv_mr.rkey`).
    fn rkey(&self) -> Stag;

    /// The iova of its first byte (`ibv_mr.addr`): what the peer puts in an RDMA Read
    /// or Write (the Tagged Offset).
    fn iova(&self) -> u64;

    /// Its length, bytes.
    fn len(&self) -> usize;

    /// Always false: backends refuse empty registrations.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `out.len()` bytes from byte `offset` into `out`. The device writes the
    /// buffer (receives, RDMA Writes, Read Responses): read it after the completion.
    ///
    /// # Errors
    ///
    /// [`VerbsError::MrOutOfBounds`] (as [`ProviderError::Verbs`]) past the end.
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), ProviderError>;

    /// Copies `data` into the buffer at byte `offset` (what a Send or Write will send).
    ///
    /// # Errors
    ///
    /// [`VerbsError::MrOutOfBounds`] (as [`ProviderError::Verbs`]) past the end.
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), ProviderError>;

    /// An SGE over `[offset, offset + len)`: iova `iova() + offset`, the lkey. `None`
    /// if the range is not inside the MR.
    fn sge(&self, offset: usize, len: u32) -> Option<Sge> {
        let end = offset.checked_add(len as usize)?;
        if end > self.len() {
            return None;
        }
        Some(Sge::new(
            self.iova().checked_add(offset as u64)?,
            len,
            self.lkey(),
        ))
    }
}

/// A protection domain (`struct ibv_pd`).
pub trait ProtectionDomain: Send + Sync {
    /// Its memory regions.
    type Mr: MemoryRegion;

    /// Registers a zero-filled buffer of `len` bytes that the MR owns, with `access`
    /// (`ibv_reg_mr(3)`); the backend chooses the iova.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidAccessFlags`] (remote write or atomic without local write),
    /// [`VerbsError::InvalidArgument`] for `len` 0 or above the device's limit, out of
    /// resources (`ENOMEM`), the device gone; all as [`ProviderError::Verbs`].
    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Self::Mr, ProviderError>;
}

/// A completion queue (`struct ibv_cq`) with a blocking wait.
pub trait CompletionQueue: Send + Sync {
    /// Takes up to `max` completions (`ibv_poll_cq(3)`), oldest first; empty if none.
    ///
    /// # Errors
    ///
    /// The CQ overflowed or was destroyed (soft), the provider failed (rdma-core).
    fn poll(&self, max: usize) -> Result<Vec<crate::WorkCompletion>, ProviderError>;

    /// Blocks until a completion is ready for [`Self::poll`] or `timeout` passed
    /// (`ibv_req_notify_cq` + `ibv_get_cq_event` + `ibv_ack_cq_events`, or the soft
    /// CQ's own wait). `Ok(true)`: poll now; `Ok(false)`: timed out. May return true
    /// early (a spurious wake-up): poll and wait again.
    ///
    /// # Errors
    ///
    /// The provider failed to arm or wait.
    fn wait(&self, timeout: Duration) -> Result<bool, ProviderError>;

    /// Takes up to `out.len()` completions into `out`, oldest first, and returns how
    /// many (`ibv_poll_cq(3)` with the caller's array): a data path that polls in a
    /// loop allocates nothing per poll. The default goes through [`Self::poll`];
    /// backends with a caller-array poll override it.
    ///
    /// # Errors
    ///
    /// As [`Self::poll`].
    fn poll_into(&self, out: &mut [crate::WorkCompletion]) -> Result<usize, ProviderError> {
        let wcs = self.poll(out.len())?;
        let n = wcs.len().min(out.len());
        for (slot, wc) in out.iter_mut().zip(wcs) {
            *slot = wc;
        }
        Ok(n)
    }
}

/// A connected RC queue pair (`struct ibv_qp`), made on a CM id ([`CmId::create_qp`]);
/// the CM moves it through its states (iWARP has no hand-driven bring-up). Dropping
/// it destroys it (`rdma_destroy_qp`).
pub trait QueuePair: Send + Sync {
    /// The QP number (`qp->qp_num`).
    fn qp_num(&self) -> u32;

    /// The capabilities granted at creation (at least those asked for).
    fn cap(&self) -> QpCap;

    /// Posts one send WR (`ibv_post_send(3)`).
    ///
    /// # Errors
    ///
    /// As [`ProviderError::Verbs`]: the WR breaks the QP's capabilities or the device's
    /// ([`VerbsError::TooManySges`], [`VerbsError::InlineTooLong`],
    /// [`VerbsError::Unsupported`]), the queue is full ([`VerbsError::QueueFull`]), the
    /// QP is in a state that takes no WR. A WR refused here never completes.
    fn post_send(&self, wr: SendWr) -> Result<(), ProviderError>;

    /// Posts one receive WR (`ibv_post_recv(3)`).
    ///
    /// # Errors
    ///
    /// As [`QueuePair::post_send`], for the receive queue.
    fn post_recv(&self, wr: RecvWr) -> Result<(), ProviderError>;

    /// Posts send WRs in order (`ibv_post_send(3)` with a WR list): one doorbell for
    /// the list where the backend can (the soft device drives its engine once per
    /// post, so a batch posted in one call costs one wake-up). Stops at the first WR
    /// refused: the ones before it are posted and complete, it and the rest are not.
    /// The default posts them one by one with [`Self::post_send`].
    ///
    /// # Errors
    ///
    /// As [`Self::post_send`], for the first WR refused.
    fn post_send_list<I>(&self, wrs: I) -> Result<(), ProviderError>
    where
        I: IntoIterator<Item = SendWr>,
        Self: Sized,
    {
        wrs.into_iter().try_for_each(|wr| self.post_send(wr))
    }

    /// Posts receive WRs in order (`ibv_post_recv(3)` with a WR list), as
    /// [`Self::post_send_list`] does send WRs. The default posts them one by one.
    ///
    /// # Errors
    ///
    /// As [`Self::post_recv`], for the first WR refused.
    fn post_recv_list<I>(&self, wrs: I) -> Result<(), ProviderError>
    where
        I: IntoIterator<Item = RecvWr>,
        Self: Sized,
    {
        wrs.into_iter().try_for_each(|wr| self.post_recv(wr))
    }
}

/// The device of a CM id (`id->verbs`): where its PD, CQs and QP are made.
pub trait Device: Send + Sync {
    /// Its protection domains.
    type Pd: ProtectionDomain;
    /// Its completion queues.
    type Cq: CompletionQueue;

    /// The device name (`siw0`, `cxgb4_0`, the soft device's name).
    fn name(&self) -> String;

    /// Its limits and features (`ibv_query_device(3)`, completed with the driver's
    /// known facts).
    ///
    /// # Errors
    ///
    /// The query failed (rdma-core).
    fn caps(&self) -> Result<DeviceCaps, ProviderError>;

    /// Allocates a protection domain (`ibv_alloc_pd(3)`).
    ///
    /// # Errors
    ///
    /// Out of resources, the device gone.
    fn alloc_pd(&self) -> Result<Self::Pd, ProviderError>;

    /// Creates a CQ of at least `cqe` entries (`ibv_create_cq(3)`) that
    /// [`CompletionQueue::wait`] can block on.
    ///
    /// # Errors
    ///
    /// `cqe` 0 or above the device's `max_cqe`, out of resources, the device gone.
    fn create_cq(&self, cqe: u32) -> Result<Self::Cq, ProviderError>;
}

/// An RDMA CM id in the TCP port space (`struct rdma_cm_id`, `RDMA_PS_TCP`). The
/// handle is owned: dropping it destroys the id (`rdma_destroy_id`) once no event of
/// it is held (the backends order this so it never waits on itself).
pub trait CmId: Send + Sync {
    /// The id's device.
    type Device: Device;
    /// Its QP.
    type Qp: QueuePair;

    /// A key naming the id among the live ids of its provider; an event's
    /// [`CmEvent::id_key`] is the key of the id it is for.
    fn key(&self) -> u64;

    /// `rdma_bind_addr(3)`: bind to a local address (port 0: any; address 0.0.0.0:
    /// every device).
    ///
    /// # Errors
    ///
    /// `EADDRINUSE` (98), `EADDRNOTAVAIL` (99), the id's state.
    fn bind_addr(&self, addr: SocketAddr) -> Result<(), ProviderError>;

    /// `rdma_listen(3)` with up to `backlog` pending requests; requests arrive as
    /// [`CmEventKind::ConnectRequest`].
    ///
    /// # Errors
    ///
    /// The id is not bound, or in another state.
    fn listen(&self, backlog: u32) -> Result<(), ProviderError>;

    /// `rdma_resolve_addr(3)`: resolve `dst` (from `src` if given) within `timeout`;
    /// ends with [`CmEventKind::AddrResolved`] or [`CmEventKind::AddrError`].
    ///
    /// # Errors
    ///
    /// The id's state; an address the backend cannot use (not IPv4).
    fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), ProviderError>;

    /// `rdma_resolve_route(3)`; ends with [`CmEventKind::RouteResolved`] or
    /// [`CmEventKind::RouteError`].
    ///
    /// # Errors
    ///
    /// The id's state.
    fn resolve_route(&self, timeout: Duration) -> Result<(), ProviderError>;

    /// `rdma_connect(3)`: ends with [`CmEventKind::Established`], or
    /// [`CmEventKind::Rejected`] / [`CmEventKind::Unreachable`] /
    /// [`CmEventKind::ConnectError`].
    ///
    /// # Errors
    ///
    /// `EINVAL` for private data or an ORD/IRD above what the backend carries, the
    /// id's state.
    fn connect(&self, param: &ConnParam) -> Result<(), ProviderError>;

    /// `rdma_accept(3)` on the new id of a connect request; ends with
    /// [`CmEventKind::Established`].
    ///
    /// # Errors
    ///
    /// As [`CmId::connect`].
    fn accept(&self, param: &ConnParam) -> Result<(), ProviderError>;

    /// `rdma_reject(3)` with `private_data`.
    ///
    /// # Errors
    ///
    /// Too much private data, the id's state.
    fn reject(&self, private_data: &[u8]) -> Result<(), ProviderError>;

    /// `rdma_disconnect(3)`: ends with [`CmEventKind::Disconnected`].
    ///
    /// # Errors
    ///
    /// The id's state (not connected).
    fn disconnect(&self) -> Result<(), ProviderError>;

    /// The local address (`rdma_get_local_addr`), once bound.
    fn local_addr(&self) -> Option<SocketAddr>;

    /// The peer's address (`rdma_get_peer_addr`), once resolved or connected.
    fn peer_addr(&self) -> Option<SocketAddr>;

    /// The id's device (`id->verbs`); `None` until the id is bound to one (resolved,
    /// bound to a device address, or the new id of a request) or once it is gone.
    fn device(&self) -> Option<Self::Device>;

    /// `rdma_create_qp(3)`: the id's RC QP on `pd` (of [`CmId::device`]) completing on
    /// `send_cq` and `recv_cq`, ready for receives before `connect` / `accept`; with
    /// `sq_sig_all` every send WR completes.
    ///
    /// # Errors
    ///
    /// `cap` above the device's, objects of another device, the id's state.
    fn create_qp(
        &self,
        pd: &<Self::Device as Device>::Pd,
        send_cq: &<Self::Device as Device>::Cq,
        recv_cq: &<Self::Device as Device>::Cq,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> Result<Self::Qp, ProviderError>;
}

/// An owned CM event (`struct rdma_cm_event` from `rdma_get_cm_event`); dropping it
/// acknowledges it (`rdma_ack_cm_event`), before it lets go of its ids.
pub trait CmEvent: Send {
    /// The id type of its provider.
    type Id: CmId;

    /// What happened.
    fn kind(&self) -> CmEventKind;

    /// 0, or a negative errno saying why; for [`CmEventKind::Rejected`] the reject
    /// reason the backend reports.
    fn status(&self) -> i32;

    /// The key ([`CmId::key`]) of the id it is for; for a connect request, the
    /// listener's.
    fn id_key(&self) -> u64;

    /// For a [`CmEventKind::ConnectRequest`]: takes the new id (`event->id`) to accept
    /// or reject; `None` for other kinds or once taken. Not taken: it is destroyed with
    /// the event, which rejects the request.
    fn take_new_id(&mut self) -> Option<Self::Id>;

    /// The peer's connection parameters and private data (connect request,
    /// established, rejected), zero and empty otherwise.
    fn conn_param(&self) -> ConnParam;

    /// The peer's private data (a copy; empty if none): that of
    /// [`CmEvent::conn_param`].
    fn private_data(&self) -> Vec<u8> {
        self.conn_param().private_data
    }
}

/// One RDMA CM event channel and the object types of its backend: the entry point of
/// application code generic over the backend.
///
/// ```
/// use std::net::SocketAddr;
/// use std::time::Duration;
/// use verbs::provider::*;
/// use verbs::QpCap;
///
/// /// Connects to `dst` on whichever backend `p` is (compiled, not run, here); the
/// /// caller keeps the objects while the connection lives, and waits for ESTABLISHED.
/// fn client<P: Provider>(
///     p: &P,
///     dst: SocketAddr,
/// ) -> Result<(P::Qp, P::Cq, P::Pd, P::Id), ProviderError> {
///     let step = Duration::from_secs(2);
///     let id = p.create_id()?;
///     id.resolve_addr(None, dst, step)?;
///     assert!(p.get_event(step)?.is_some_and(|e| e.kind() == CmEventKind::AddrResolved));
///     id.resolve_route(step)?;
///     assert!(p.get_event(step)?.is_some_and(|e| e.kind() == CmEventKind::RouteResolved));
///     let dev = id.device().expect("resolved: the id has a device");
///     let (pd, cq) = (dev.alloc_pd()?, dev.create_cq(16)?);
///     let cap = QpCap { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
///     let qp = id.create_qp(&pd, &cq, &cq, cap, false)?;
///     let (ord, ird) = dev.caps()?.clamp_ord_ird(8, 8);
///     id.connect(&ConnParam::new(ird.into(), ord.into()))?;
///     Ok((qp, cq, pd, id))
/// }
/// ```
pub trait Provider: Send + Sync {
    /// Memory regions.
    type Mr: MemoryRegion;
    /// Protection domains.
    type Pd: ProtectionDomain<Mr = Self::Mr>;
    /// Completion queues.
    type Cq: CompletionQueue;
    /// Queue pairs.
    type Qp: QueuePair;
    /// An id's device.
    type Device: Device<Pd = Self::Pd, Cq = Self::Cq>;
    /// CM ids.
    type Id: CmId<Device = Self::Device, Qp = Self::Qp>;
    /// CM events.
    type Event: CmEvent<Id = Self::Id>;

    /// Creates an id on this channel (`rdma_create_id(3)`, `RDMA_PS_TCP`).
    ///
    /// # Errors
    ///
    /// The backend could not make one (rdma-core: out of resources).
    fn create_id(&self) -> Result<Self::Id, ProviderError>;

    /// The next event of this channel's ids, waiting at most `timeout`
    /// (`rdma_get_cm_event(3)`); `Ok(None)` when none came in time. Events of ids
    /// already dropped are never returned.
    ///
    /// # Errors
    ///
    /// The channel failed (rdma-core: the fd).
    fn get_event(&self, timeout: Duration) -> Result<Option<Self::Event>, ProviderError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_kinds_have_librdmacm_numbers_and_names() {
        for (i, k) in CmEventKind::ALL.iter().enumerate() {
            assert_eq!(k.to_raw(), i as u32);
            assert_eq!(CmEventKind::from_raw(i as u32), Some(*k));
        }
        assert_eq!(CmEventKind::from_raw(16), None);
        assert_eq!(CmEventKind::DeviceRemoval.to_raw(), 11);
        assert_eq!(
            CmEventKind::ConnectRequest.to_string(),
            "RDMA_CM_EVENT_CONNECT_REQUEST"
        );
    }

    #[test]
    fn errors_name_the_call_and_keep_the_errno() {
        let e = ProviderError::verbs("ibv_post_send", VerbsError::NoDevice);
        assert_eq!(e.call_name(), "ibv_post_send");
        assert_eq!(e.errno(), 19);
        assert!(e.to_string().starts_with("ibv_post_send: "), "{e}");
        let e = e.in_call("ibv_post_send (RDMA Read)");
        assert_eq!(
            (e.call_name(), e.errno()),
            ("ibv_post_send (RDMA Read)", 19)
        );
        let e = ProviderError::call("rdma_listen", 98, "address in use");
        assert_eq!(e.errno(), 98);
        assert_eq!(e.to_string(), "rdma_listen: address in use");
        let e = e.in_call("rdma_listen (server)");
        assert_eq!(e.to_string(), "rdma_listen (server): address in use");
        assert_eq!(e.errno(), 98);
    }

    struct Buf(Vec<u8>);
    impl MemoryRegion for Buf {
        fn lkey(&self) -> Stag {
            Stag::from_raw(0x1a02)
        }
        fn rkey(&self) -> Stag {
            Stag::from_raw(0x1a02)
        }
        fn iova(&self) -> u64 {
            0x7000
        }
        fn len(&self) -> usize {
            self.0.len()
        }
        fn read(&self, _: usize, _: &mut [u8]) -> Result<(), ProviderError> {
            Ok(())
        }
        fn write(&mut self, _: usize, _: &[u8]) -> Result<(), ProviderError> {
            Ok(())
        }
    }

    #[test]
    fn default_sge_stays_inside_the_region() {
        let mr = Buf(vec![0; 64]);
        let s = mr.sge(16, 48).unwrap();
        assert_eq!(
            (s.addr, s.length, s.lkey),
            (0x7010, 48, Stag::from_raw(0x1a02))
        );
        assert_eq!(mr.sge(16, 49), None);
        assert_eq!(mr.sge(usize::MAX, 1), None);
        assert!(!mr.is_empty());
    }

    /// A QP that takes `limit` WRs and refuses the rest, recording the ids taken.
    struct Counting {
        limit: usize,
        taken: std::sync::Mutex<Vec<u64>>,
    }
    impl QueuePair for Counting {
        fn qp_num(&self) -> u32 {
            7
        }
        fn cap(&self) -> QpCap {
            QpCap::default()
        }
        fn post_send(&self, wr: SendWr) -> Result<(), ProviderError> {
            let mut t = self.taken.lock().unwrap();
            if t.len() == self.limit {
                return Err(ProviderError::verbs(
                    "ibv_post_send",
                    VerbsError::QueueFull {
                        queue: crate::WorkQueue::Send,
                        depth: 3,
                    },
                ));
            }
            t.push(wr.wr_id);
            Ok(())
        }
        fn post_recv(&self, wr: RecvWr) -> Result<(), ProviderError> {
            self.post_send(SendWr::send(wr.wr_id, Vec::new()))
                .map_err(|e| {
                    ProviderError::verbs(
                        "ibv_post_recv",
                        match e {
                            ProviderError::Verbs { source, .. } => source,
                            ProviderError::Call { .. } => VerbsError::NoDevice,
                        },
                    )
                })
        }
    }

    #[test]
    fn default_post_lists_post_in_order_and_stop_at_the_first_refused() {
        let qp = Counting {
            limit: 3,
            taken: std::sync::Mutex::new(Vec::new()),
        };
        qp.post_send_list((10..12).map(|i| SendWr::send(i, Vec::new())))
            .unwrap();
        let e = qp
            .post_recv_list((20..25).map(|i| RecvWr::new(i, Vec::new())))
            .unwrap_err();
        assert_eq!(e.call_name(), "ibv_post_recv");
        assert_eq!(*qp.taken.lock().unwrap(), vec![10, 11, 20]);
    }

    /// A CQ holding `n` completions with ids 0..n.
    struct Held(std::sync::Mutex<Vec<crate::WorkCompletion>>);
    impl CompletionQueue for Held {
        fn poll(&self, max: usize) -> Result<Vec<crate::WorkCompletion>, ProviderError> {
            let mut v = self.0.lock().unwrap();
            let n = v.len().min(max);
            Ok(v.drain(..n).collect())
        }
        fn wait(&self, _: Duration) -> Result<bool, ProviderError> {
            Ok(!self.0.lock().unwrap().is_empty())
        }
    }

    #[test]
    fn default_poll_into_fills_the_array_oldest_first() {
        use crate::{WcOpcode, WcStatus, WorkCompletion};
        let wc = |i| WorkCompletion::new(i, WcStatus::Success, WcOpcode::Send, 7);
        let cq = Held(std::sync::Mutex::new((0..5).map(wc).collect()));
        let mut out = [wc(99); 3];
        assert_eq!(cq.poll_into(&mut out).unwrap(), 3);
        assert_eq!(out.map(|w| w.wr_id), [0, 1, 2]);
        assert_eq!(cq.poll_into(&mut out).unwrap(), 2);
        assert_eq!(out.map(|w| w.wr_id), [3, 4, 2]);
        assert_eq!(cq.poll_into(&mut out).unwrap(), 0);
        assert!(!cq.wait(Duration::ZERO).unwrap());
    }
}
