//! What the user's handler receives and returns.

use crate::id::{CmId, CmIdRef};
use crate::provider::{ConnectReply, Provider};
use core::fmt;
use std::net::SocketAddr;

/// An event delivered to a cm_id's handler, on a CM worker thread, in the order the
/// provider reported it, one at a time per id (the kernel's `cm_handler` upcalls).
///
/// The provider's `DISCONNECT` is never delivered: it only moves `ESTABLISHED` to
/// `CLOSING` (`cm_disconnect_handler`); the user hears about the end of a connection
/// from [`CmEvent::Close`]. `Established` (passive) or `ConnectReply` with
/// [`ConnectStatus::Ok`](crate::ConnectStatus::Ok) (active) is always delivered before
/// `Close`.
pub enum CmEvent<P: Provider> {
    /// A connection request arrived at a listener (`IW_CM_EVENT_CONNECT_REQUEST`,
    /// `cm_conn_req_handler`). The handler runs for the new child id (`CONN_RECV`),
    /// which inherits the listener's handler.
    ConnectRequest(ConnectRequest<P>),
    /// The outcome of `connect` (`IW_CM_EVENT_CONNECT_REPLY`, `cm_conn_rep_handler`).
    /// On success the id is `ESTABLISHED`; otherwise it is back to `IDLE` and the QP
    /// has been released.
    ConnectReply(ConnectReply),
    /// An accepted connection is established (`IW_CM_EVENT_ESTABLISHED`,
    /// `cm_conn_est_handler`).
    Established,
    /// The connection is closed and the QP is in ERROR (`IW_CM_EVENT_CLOSE`,
    /// `cm_close_handler`); the id is back to `IDLE` and the QP has been released.
    Close,
}

impl<P: Provider> CmEvent<P> {
    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            CmEvent::ConnectRequest(_) => "ConnectRequest",
            CmEvent::ConnectReply(_) => "ConnectReply",
            CmEvent::Established => "Established",
            CmEvent::Close => "Close",
        }
    }
}

impl<P: Provider> fmt::Debug for CmEvent<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmEvent::ConnectRequest(r) => f.debug_tuple("ConnectRequest").field(r).finish(),
            CmEvent::ConnectReply(r) => f.debug_tuple("ConnectReply").field(r).finish(),
            CmEvent::Established => f.write_str("Established"),
            CmEvent::Close => f.write_str("Close"),
        }
    }
}

/// A connection request delivered to a listener's handler.
pub struct ConnectRequest<P: Provider> {
    /// The new child id, owned by the user from now on: keep it to accept or reject
    /// later, or drop it (dropping destroys it, which rejects the request, as
    /// `destroy_cm_id` does in `CONN_RECV`).
    pub id: CmId<P>,
    /// The initiator's private data.
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

impl<P: Provider> fmt::Debug for ConnectRequest<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectRequest")
            .field("id", &self.id.serial())
            .field("private_data_len", &self.private_data.len())
            .field("ird", &self.ird)
            .field("ord", &self.ord)
            .field("local_addr", &self.local_addr)
            .field("remote_addr", &self.remote_addr)
            .finish()
    }
}

/// What a handler wants done with its id after an event: the kernel's handler return
/// value (0 or non-zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// Keep the id.
    Keep,
    /// Destroy the id, as [`CmId::destroy`] does (`cm_work_handler` calls
    /// `destroy_cm_id` when the handler returns non-zero). For a `ConnectRequest` the
    /// child is destroyed, which rejects the request unless it was accepted (then the
    /// connection is aborted). No further event of the id is delivered.
    Destroy,
}

/// A cm_id's event handler (the kernel's `iw_cm_handler`).
///
/// Called on a CM worker thread, never on the provider's thread and never with a CM
/// lock held, so it may call any downcall on any id ([`CmIdRef::accept`],
/// [`CmIdRef::disconnect`], ...), including destroying ids (its own included). It must
/// not wait for CM delivery: [`crate::IwCm::flush`] and [`crate::Destroyed::wait`]
/// return [`crate::CmError::InDeliveryContext`] there. A child id made for a
/// `ConnectRequest` inherits its listener's handler (`cm_conn_req_handler`); use
/// [`CmIdRef::set_handler`] to give it its own.
///
/// Closures `Fn(&CmIdRef<P>, CmEvent<P>) -> Disposition + Send + Sync + 'static`
/// implement it.
pub trait EventHandler<P: Provider>: Send + Sync + 'static {
    /// Handle one event of `id`.
    fn on_event(&self, id: &CmIdRef<P>, event: CmEvent<P>) -> Disposition;
}

impl<P, F> EventHandler<P> for F
where
    P: Provider,
    F: Fn(&CmIdRef<P>, CmEvent<P>) -> Disposition + Send + Sync + 'static,
{
    fn on_event(&self, id: &CmIdRef<P>, event: CmEvent<P>) -> Disposition {
        self(id, event)
    }
}
