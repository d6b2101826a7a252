//! The provider side: what an iWARP device implements for the CM (the kernel's
//! `iw_cm_verbs`: `iw_connect`, `iw_accept`, `iw_reject`, `iw_create_listen`,
//! `iw_destroy_listen`, `iw_add_ref`, `iw_rem_ref`, plus the QP moves of
//! `iw_cm_disconnect`), and the events it reports back through an
//! [`EventSink`].
//!
//! # The contract
//!
//! * **Report, never call up.** The provider reports events only through the
//!   [`EventSink`] it was handed. Reporting only enqueues (design.md
//!   section 5, iw-cm rule 1), so it is safe from any thread, including the device
//!   engine thread and from inside any downcall (for example `disconnect` reporting
//!   `Close` before it returns). User code never runs on the caller's thread.
//! * **Downcalls don't wait for the CM.** A downcall may wait for the provider's own
//!   engine, but never for a CM worker (a handler may be the caller).
//! * **Downcalls may race.** Downcalls for one connection can come from different
//!   threads (a handler on a CM worker and the user's thread) and can arrive after the
//!   connection already failed; each must be tolerated (return an error or do nothing),
//!   never panic. Downcalls on one cm_id are serialized by the CM.
//! * **One reply per connect.** After [`Provider::connect`] returns `Ok`, the provider
//!   reports exactly one `ConnectReply` (even if the attempt was aborted by
//!   [`Provider::disconnect`]; it may be dropped by the CM). After
//!   [`Provider::accept`] returns `Ok`, it reports `Established` or, if the
//!   connection fails first, `Close`. After a connection is established it reports
//!   `Close` once, when the connection is gone and the QP is in ERROR; `Disconnect`
//!   before it when the peer starts an orderly close.
//! * **References.** Each [`EventSink`] clone the provider keeps is a
//!   reference on the cm_id (the kernel's `cm_id->add_ref`); the id's memory is freed
//!   when the last reference, the user's or the provider's, is dropped. A provider
//!   drops its sinks when the connection or listener is finished with.

use core::fmt;
use std::net::SocketAddr;

/// The largest private data the CM accepts in a connect, accept or reject: MPA's
/// limit (RFC 5044 section 7.1: 512 octets).
pub const MAX_PRIVATE_DATA: usize = 512;

/// The largest IRD/ORD value: the 14-bit fields of the MPA rev 2 IRD/ORD word
/// (RFC 6581 section 2; `0x3FFF` means "no limit").
pub const MAX_IRD_ORD: u16 = 0x3FFF;

/// How to disconnect: the `abrupt` argument of the kernel's `iw_cm_disconnect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DisconnectMode {
    /// Orderly close: the kernel moves the QP to SQD (the RDMAC CLOSING state), the
    /// provider sends a FIN after the outstanding work.
    Graceful,
    /// Abortive close: the QP goes to ERROR (outstanding WRs flushed), the provider
    /// resets the connection.
    Abortive,
}

/// The outcome of an active connect, carried by `ConnectReply` (the kernel's
/// `iw_cm_event.status` of `IW_CM_EVENT_CONNECT_REPLY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ConnectStatus {
    /// Accepted: the MPA exchange completed, the QP is in RTS (status 0).
    #[default]
    Ok,
    /// The peer's application rejected the request with an MPA Reply with the Reject
    /// bit set; [`ConnectReply::private_data`] carries its private data
    /// (`-ECONNREFUSED`, "refused by remote application").
    Rejected,
    /// The TCP connection was refused (nothing listens there) (`-ECONNREFUSED`).
    Refused,
    /// No answer in time: no SYN-ACK, or no MPA Reply (`-ETIMEDOUT`, "setup
    /// timeout").
    TimedOut,
    /// The connection was reset during setup, or the attempt was aborted
    /// (`-ECONNRESET`, "reset by remote host").
    Reset,
}

impl ConnectStatus {
    /// Every status.
    pub const ALL: [ConnectStatus; 5] = [
        ConnectStatus::Ok,
        ConnectStatus::Rejected,
        ConnectStatus::Refused,
        ConnectStatus::TimedOut,
        ConnectStatus::Reset,
    ];

    /// The (positive) errno the kernel reports for this status, 0 for [`Self::Ok`].
    pub const fn errno(self) -> i32 {
        match self {
            ConnectStatus::Ok => 0,
            ConnectStatus::Rejected | ConnectStatus::Refused => 111, // ECONNREFUSED
            ConnectStatus::TimedOut => 110,                          // ETIMEDOUT
            ConnectStatus::Reset => 104,                             // ECONNRESET
        }
    }

    /// Whether the connection was established.
    pub const fn is_ok(self) -> bool {
        matches!(self, ConnectStatus::Ok)
    }
}

/// The payload of a `ConnectReply` event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectReply {
    /// The outcome.
    pub status: ConnectStatus,
    /// The peer's private data (MPA Reply or Reject), empty if none.
    pub private_data: Vec<u8>,
    /// The peer's IRD (inbound RDMA Read queue depth) from MPA rev 2, 0 if unknown.
    pub ird: u16,
    /// The peer's ORD (outbound RDMA Read depth) from MPA rev 2, 0 if unknown.
    pub ord: u16,
}

impl ConnectReply {
    /// A reply with `status` and nothing else.
    pub fn with_status(status: ConnectStatus) -> ConnectReply {
        ConnectReply {
            status,
            ..ConnectReply::default()
        }
    }
}

/// An incoming connection request reported on a listener (the kernel's
/// `IW_CM_EVENT_CONNECT_REQUEST` with `provider_data`).
pub struct IncomingRequest<C> {
    /// The provider's handle of the pending connection; it comes back in
    /// [`Provider::accept`] or [`Provider::reject`].
    pub conn: C,
    /// The initiator's private data from its MPA Request.
    pub private_data: Vec<u8>,
    /// The initiator's IRD.
    pub ird: u16,
    /// The initiator's ORD.
    pub ord: u16,
    /// Our address of the connection.
    pub local_addr: SocketAddr,
    /// The initiator's address.
    pub remote_addr: SocketAddr,
}

impl<C> fmt::Debug for IncomingRequest<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IncomingRequest")
            .field("private_data_len", &self.private_data.len())
            .field("ird", &self.ird)
            .field("ord", &self.ord)
            .field("local_addr", &self.local_addr)
            .field("remote_addr", &self.remote_addr)
            .finish_non_exhaustive()
    }
}

/// An event a provider reports through an [`EventSink`]: the
/// kernel's `enum iw_cm_event_type` with its payload.
pub enum ProviderEvent<C> {
    /// `IW_CM_EVENT_CONNECT_REQUEST`: a new connection arrived at a listener.
    ConnectRequest(IncomingRequest<C>),
    /// `IW_CM_EVENT_CONNECT_REPLY`: the outcome of [`Provider::connect`].
    ConnectReply(ConnectReply),
    /// `IW_CM_EVENT_ESTABLISHED`: an accepted connection is in FPDU mode.
    Established,
    /// `IW_CM_EVENT_DISCONNECT`: the peer started an orderly close. Moves
    /// `ESTABLISHED` to `CLOSING`; never delivered to the user.
    Disconnect,
    /// `IW_CM_EVENT_CLOSE`: the connection is gone and the QP is in ERROR.
    Close,
}

impl<C> fmt::Debug for ProviderEvent<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProviderEvent::ConnectRequest(r) => f.debug_tuple("ConnectRequest").field(r).finish(),
            ProviderEvent::ConnectReply(r) => f.debug_tuple("ConnectReply").field(r).finish(),
            ProviderEvent::Established => f.write_str("Established"),
            ProviderEvent::Disconnect => f.write_str("Disconnect"),
            ProviderEvent::Close => f.write_str("Close"),
        }
    }
}

// ------------------------------------------------------------------ the sink

/// Why [`EventSink::report`] did not queue an event. Informational: the CM has
/// already done what is needed (a refused `ConnectRequest` is rejected at the
/// provider by a CM worker, through [`Provider::reject`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// The id is being destroyed; the event was dropped (`IWCM_F_DROP_EVENTS`).
    #[error("the cm_id is being destroyed; event dropped")]
    Destroyed,
    /// A `ConnectRequest` beyond the listener's backlog; it will be rejected.
    #[error("listener backlog full; the request will be rejected")]
    BacklogFull,
    /// More events queued on one connection than any correct provider reports
    /// ([`crate::CmConfig::max_queued_per_id`]); dropped and counted as unexpected.
    #[error("event queue of the cm_id is full; event dropped")]
    QueueFull,
    /// The CM instance's workers have stopped; the event was dropped.
    #[error("the CM instance was shut down; event dropped")]
    Shutdown,
}

/// The provider's handle on one cm_id: where it reports the id's events (the kernel's
/// `cm_id->event_handler`, i.e. `cm_event_handler`).
///
/// Reporting only enqueues; it never runs user code and never calls the provider, so
/// it is safe from any thread and from inside any downcall. Each clone is a reference
/// on the id (the kernel's `cm_id->add_ref`); dropping it is `rem_ref`.
pub struct EventSink<P: Provider> {
    target: std::sync::Arc<dyn ReportTarget<P>>,
}

/// What an [`EventSink`] reports to: a cm_id. Implemented by the id engine
/// (`crate::id`), which sits above this module; a trait object, as reporting is a
/// control path (connection setup and teardown), not the data path.
pub(crate) trait ReportTarget<P: Provider>: Send + Sync + 'static {
    /// Queue `event` on the id (see [`EventSink::report`]).
    fn report(&self, event: ProviderEvent<P::Conn>) -> Result<(), ReportError>;
    /// The id's serial number.
    fn serial(&self) -> u64;
}

impl<P: Provider> Clone for EventSink<P> {
    fn clone(&self) -> Self {
        EventSink {
            target: self.target.clone(),
        }
    }
}

impl<P: Provider> fmt::Debug for EventSink<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventSink")
            .field("cm_id", &self.target.serial())
            .finish()
    }
}

impl<P: Provider> EventSink<P> {
    /// A sink reporting to `target` (the id engine makes one per downcall that hands
    /// the provider a sink).
    pub(crate) fn new(target: std::sync::Arc<dyn ReportTarget<P>>) -> EventSink<P> {
        EventSink { target }
    }

    /// Report an event of this id. Events of one id are delivered in the order they
    /// are reported. A `ConnectRequest` on a listener whose queue holds `backlog`
    /// undelivered requests is refused and rejected at the provider (`cm_event_handler`
    /// returns `-ENOMEM` and the provider rejects; here the CM calls
    /// [`Provider::reject`] from a worker so the provider cannot forget).
    ///
    /// # Errors
    /// [`ReportError`], for information only (see there).
    pub fn report(&self, event: ProviderEvent<P::Conn>) -> Result<(), ReportError> {
        self.target.report(event)
    }

    /// The id's serial number (for logs).
    pub fn cm_id_serial(&self) -> u64 {
        self.target.serial()
    }
}

/// The arguments of [`Provider::connect`] (the kernel's `iw_cm_conn_param` plus the
/// addresses of the cm_id).
#[derive(Debug, Clone, Copy)]
pub struct ConnectArgs<'a, Q> {
    /// The QP to connect (already referenced with [`Provider::qp_add_ref`]).
    pub qp: &'a Q,
    /// The local address to bind, if the user chose one.
    pub local_addr: Option<SocketAddr>,
    /// The peer.
    pub remote_addr: SocketAddr,
    /// Private data for the MPA Request (at most [`MAX_PRIVATE_DATA`]).
    pub private_data: &'a [u8],
    /// Our IRD.
    pub ird: u16,
    /// Our ORD.
    pub ord: u16,
}

/// The arguments of [`Provider::accept`].
#[derive(Debug, Clone, Copy)]
pub struct AcceptArgs<'a, Q> {
    /// The QP to bind to the connection (already referenced with
    /// [`Provider::qp_add_ref`]).
    pub qp: &'a Q,
    /// Private data for the MPA Reply (at most [`MAX_PRIVATE_DATA`]).
    pub private_data: &'a [u8],
    /// Our IRD.
    pub ird: u16,
    /// Our ORD.
    pub ord: u16,
}

/// Why a provider downcall failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The local address is taken (`-EADDRINUSE`).
    #[error("address in use")]
    AddressInUse,
    /// The address is not one of this device's (`-EADDRNOTAVAIL`).
    #[error("address not available on this device")]
    AddressNotAvailable,
    /// The connection is gone or was never there (`-ENOTCONN`).
    #[error("not connected")]
    NotConnected,
    /// The QP cannot be used for this (wrong state or type) (`-EINVAL`).
    #[error("invalid QP: {0}")]
    InvalidQp(String),
    /// Out of connection or listener resources (`-ENOMEM`).
    #[error("out of resources")]
    NoResources,
    /// The device is gone (`-ENODEV`).
    #[error("device removed")]
    DeviceRemoved,
    /// The private data does not fit in what the device's MPA exchange carries
    /// (`-EINVAL`; Linux siw refuses more than 512 octets, 508 with the MPA Rev 2
    /// IRD/ORD word).
    #[error("private data of {len} bytes over the device's limit of {max}")]
    PrivateDataTooLong {
        /// The private data's length, in bytes.
        len: usize,
        /// The most the device takes, in bytes.
        max: usize,
    },
    /// Anything else, described.
    #[error("{0}")]
    Other(String),
}

impl ProviderError {
    /// The (positive) errno the kernel would return.
    pub fn errno(&self) -> i32 {
        match self {
            ProviderError::AddressInUse => 98,
            ProviderError::AddressNotAvailable => 99,
            ProviderError::NotConnected => 107,
            ProviderError::InvalidQp(_) => 22,
            ProviderError::NoResources => 12,
            ProviderError::DeviceRemoved => 19,
            ProviderError::PrivateDataTooLong { .. } => 22,
            ProviderError::Other(_) => 5,
        }
    }
}

/// An iWARP device as the CM sees it: the kernel's `iw_cm_verbs`.
///
/// The soft device (`softiwarp`) implements it over its engine thread; a hardware
/// backend over rdma-core would implement it over librdmacm/libibverbs. See the module
/// documentation for the contract. Every method is called from a thread that is not
/// the provider's engine (a user thread or a CM worker), never while the CM holds a
/// lock.
pub trait Provider: Send + Sync + Sized + 'static {
    /// The provider's QP handle (e.g. an `Arc` of its QP). The CM keeps a clone while
    /// the QP is bound to a cm_id.
    type Qp: Clone + Send + Sync + 'static;
    /// The provider's handle of one connection endpoint (the kernel's
    /// `cm_id->provider_data`, siw's `cep`). Cloned by the CM to issue downcalls.
    type Conn: Clone + Send + Sync + 'static;
    /// The provider's handle of one listener.
    type Listener: Send + Sync + 'static;

    /// Start an active connect (`iw_connect`): TCP connect, send the MPA Request.
    /// Events for the connection go to `sink`: exactly one `ConnectReply`, then, if
    /// it was `Ok`, `Disconnect`/`Close`.
    ///
    /// # Errors
    /// Any [`ProviderError`]; then no event may be reported for this attempt.
    fn connect(
        &self,
        sink: EventSink<Self>,
        args: ConnectArgs<'_, Self::Qp>,
    ) -> Result<Self::Conn, ProviderError>;

    /// Accept a pending request (`iw_accept`): send the MPA Reply, bind `qp`. Events
    /// for the connection from now on go to `sink` (the child cm_id): `Established`,
    /// then `Disconnect`/`Close`; or `Close` if it fails before being established.
    ///
    /// # Errors
    /// Any [`ProviderError`]; then no event may be reported for this accept.
    fn accept(
        &self,
        sink: EventSink<Self>,
        conn: &Self::Conn,
        args: AcceptArgs<'_, Self::Qp>,
    ) -> Result<(), ProviderError>;

    /// Reject a pending request (`iw_reject`): send an MPA Reply with the Reject bit
    /// and `private_data`, then close the connection. Also used by the CM for requests
    /// beyond a listener's backlog and for requests dropped by destroy.
    ///
    /// # Errors
    /// Any [`ProviderError`] (the CM ignores it when it rejects on its own behalf).
    fn reject(&self, conn: &Self::Conn, private_data: &[u8]) -> Result<(), ProviderError>;

    /// Start listening on `local_addr` (`iw_create_listen`); connect requests go to
    /// `sink` as `ConnectRequest` events. `backlog` is the CM's queue bound; the
    /// provider may use it for its own accept queue.
    ///
    /// # Errors
    /// Any [`ProviderError`] (typically [`ProviderError::AddressInUse`]).
    fn create_listen(
        &self,
        sink: EventSink<Self>,
        local_addr: SocketAddr,
        backlog: u32,
    ) -> Result<Self::Listener, ProviderError>;

    /// Stop listening (`iw_destroy_listen`) and drop the listener's sink. Requests not
    /// yet reported are the provider's to refuse.
    fn destroy_listen(&self, listener: Self::Listener);

    /// Disconnect: move the QP to closing (graceful) or ERROR (abortive); also used
    /// to abort a connect or accept in flight when the cm_id is destroyed. `qp` is the
    /// bound QP, if any.
    ///
    /// # Errors
    /// Any [`ProviderError`]; the CM ignores errors here (both sides may be
    /// disconnecting at once, as `iw_cm_disconnect` notes).
    fn disconnect(
        &self,
        conn: &Self::Conn,
        qp: Option<&Self::Qp>,
        mode: DisconnectMode,
    ) -> Result<(), ProviderError>;

    /// Take a reference on `qp` while a cm_id is bound to it (`iw_add_ref`).
    fn qp_add_ref(&self, qp: &Self::Qp);

    /// Drop the reference taken by [`Provider::qp_add_ref`] (`iw_rem_ref`); called
    /// exactly once per `qp_add_ref`.
    fn qp_rem_ref(&self, qp: &Self::Qp);
}
