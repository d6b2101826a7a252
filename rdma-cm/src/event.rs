//! Events: their kinds (librdmacm's names), what a callback returns, and the mapping of
//! iWARP CM events onto them (cma.c's `cma_iw_handler`). What a callback receives
//! ([`crate::CmEvent`]) and the callback itself ([`crate::Handler`]) live with the ids
//! (`crate::id`).

use core::fmt;
use iw_cm::ConnectStatus;

/// The kind of an event: librdmacm's `enum rdma_cm_event_type`, with the same names
/// (less the IB-only ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`: `resolve_addr` succeeded; the id is bound to a
    /// device.
    AddrResolved,
    /// `RDMA_CM_EVENT_ADDR_ERROR`: `resolve_addr` failed (`status` says why:
    /// `-ENETUNREACH`, `-ETIMEDOUT`, `-EHOSTUNREACH`, `-ENODEV`).
    AddrError,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`: `resolve_route` succeeded.
    RouteResolved,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`: `resolve_route` failed.
    RouteError,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`: a connection request arrived at a listener; the
    /// event carries the new id ([`crate::CmEvent::take_new_id`]).
    ConnectRequest,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`: the connection attempt failed for another reason.
    ConnectError,
    /// `RDMA_CM_EVENT_UNREACHABLE`: the peer did not answer (`-ETIMEDOUT`).
    Unreachable,
    /// `RDMA_CM_EVENT_REJECTED`: the peer rejected the request, or the connection was
    /// refused or reset during setup (`-ECONNREFUSED`, `-ECONNRESET`); `private_data`
    /// carries the peer's reject data, if any.
    Rejected,
    /// `RDMA_CM_EVENT_ESTABLISHED`: connected.
    Established,
    /// `RDMA_CM_EVENT_DISCONNECTED`: the connection is closed; the QP is in ERROR.
    Disconnected,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`: the id's device is going away. Delivered once;
    /// nothing follows. Destroy the id (or return [`Disposition::Destroy`]); the device
    /// is released when every id bound to it is gone.
    DeviceRemoval,
    /// `RDMA_CM_EVENT_ADDR_CHANGE`: the address configuration of the id's device
    /// changed.
    AddrChange,
}

impl EventKind {
    /// Every kind, in declaration order.
    pub const ALL: [EventKind; 12] = [
        EventKind::AddrResolved,
        EventKind::AddrError,
        EventKind::RouteResolved,
        EventKind::RouteError,
        EventKind::ConnectRequest,
        EventKind::ConnectError,
        EventKind::Unreachable,
        EventKind::Rejected,
        EventKind::Established,
        EventKind::Disconnected,
        EventKind::DeviceRemoval,
        EventKind::AddrChange,
    ];

    /// librdmacm's name (`RDMA_CM_EVENT_...`, what `rdma_event_str` prints).
    pub const fn librdmacm_name(self) -> &'static str {
        match self {
            EventKind::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            EventKind::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            EventKind::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            EventKind::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            EventKind::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            EventKind::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            EventKind::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            EventKind::Rejected => "RDMA_CM_EVENT_REJECTED",
            EventKind::Established => "RDMA_CM_EVENT_ESTABLISHED",
            EventKind::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            EventKind::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            EventKind::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.librdmacm_name())
    }
}

/// The event (and its status) that cma.c's `cma_iw_handler` makes of an
/// `IW_CM_EVENT_CONNECT_REPLY` with this status: 0 -> `ESTABLISHED`; `-ECONNRESET`
/// and `-ECONNREFUSED` -> `REJECTED`; `-ETIMEDOUT` -> `UNREACHABLE`; anything else ->
/// `CONNECT_ERROR`. The status is the kernel's: 0 or a negative errno.
pub fn map_connect_reply(status: ConnectStatus) -> (EventKind, i32) {
    const ECONNRESET: i32 = 104;
    const ECONNREFUSED: i32 = 111;
    const ETIMEDOUT: i32 = 110;
    let errno = status.errno();
    let kind = match errno {
        0 => EventKind::Established,
        ECONNRESET | ECONNREFUSED => EventKind::Rejected,
        ETIMEDOUT => EventKind::Unreachable,
        _ => EventKind::ConnectError,
    };
    (kind, -errno)
}

/// The kind of iWARP CM event, as [`map_iw_event`] takes it (the payload-free part of
/// [`iw_cm::CmEvent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IwEventKind {
    /// `IW_CM_EVENT_CONNECT_REQUEST`.
    ConnectRequest,
    /// `IW_CM_EVENT_CONNECT_REPLY` with its status.
    ConnectReply(ConnectStatus),
    /// `IW_CM_EVENT_ESTABLISHED`.
    Established,
    /// `IW_CM_EVENT_CLOSE`.
    Close,
}

impl IwEventKind {
    /// The kind of an iw-cm event.
    pub fn of<P: iw_cm::Provider>(ev: &iw_cm::CmEvent<P>) -> IwEventKind {
        match ev {
            iw_cm::CmEvent::ConnectRequest(_) => IwEventKind::ConnectRequest,
            iw_cm::CmEvent::ConnectReply(r) => IwEventKind::ConnectReply(r.status),
            iw_cm::CmEvent::Established => IwEventKind::Established,
            iw_cm::CmEvent::Close => IwEventKind::Close,
        }
    }
}

/// The RDMA CM event (and status) for an iWARP CM event, as cma.c's `cma_iw_handler`
/// and `iw_conn_req_handler` map them: `CLOSE` -> `DISCONNECTED`; `CONNECT_REPLY` by
/// [`map_connect_reply`]; `ESTABLISHED` -> `ESTABLISHED`; `CONNECT_REQUEST` ->
/// `CONNECT_REQUEST`.
pub fn map_iw_event(kind: IwEventKind) -> (EventKind, i32) {
    match kind {
        IwEventKind::ConnectRequest => (EventKind::ConnectRequest, 0),
        IwEventKind::ConnectReply(s) => map_connect_reply(s),
        IwEventKind::Established => (EventKind::Established, 0),
        IwEventKind::Close => (EventKind::Disconnected, 0),
    }
}

/// What a callback wants done with its id: the return value of the kernel's
/// `rdma_cm_event_handler` (0 or non-zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// Keep the id.
    Keep,
    /// Destroy the id now, as `destroy` would, without waiting for anything: after
    /// the callback returns, no further callback runs on it. For a `ConnectRequest`
    /// the new id is destroyed (the request is rejected); the listener stays.
    Destroy,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_reply_mapping_is_cma_iw_handlers() {
        let expect = [
            (ConnectStatus::Ok, EventKind::Established, 0),
            (ConnectStatus::Rejected, EventKind::Rejected, -111),
            (ConnectStatus::Refused, EventKind::Rejected, -111),
            (ConnectStatus::Reset, EventKind::Rejected, -104),
            (ConnectStatus::TimedOut, EventKind::Unreachable, -110),
        ];
        for (status, kind, st) in expect {
            assert_eq!(map_connect_reply(status), (kind, st), "{status:?}");
        }
        // Every status is covered.
        assert_eq!(expect.len(), ConnectStatus::ALL.len());
    }

    #[test]
    fn iw_event_mapping() {
        assert_eq!(
            map_iw_event(IwEventKind::Close),
            (EventKind::Disconnected, 0)
        );
        assert_eq!(
            map_iw_event(IwEventKind::Established),
            (EventKind::Established, 0)
        );
        assert_eq!(
            map_iw_event(IwEventKind::ConnectRequest),
            (EventKind::ConnectRequest, 0)
        );
        assert_eq!(
            map_iw_event(IwEventKind::ConnectReply(ConnectStatus::TimedOut)),
            (EventKind::Unreachable, -110)
        );
    }

    #[test]
    fn librdmacm_names() {
        let names: Vec<_> = EventKind::ALL.iter().map(|k| k.librdmacm_name()).collect();
        assert_eq!(names[0], "RDMA_CM_EVENT_ADDR_RESOLVED");
        assert_eq!(names[10], "RDMA_CM_EVENT_DEVICE_REMOVAL");
        assert!(names.iter().all(|n| n.starts_with("RDMA_CM_EVENT_")));
        let mut dedup = names.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), names.len());
        assert_eq!(
            crate::IdState::DeviceRemoval.to_string(),
            "RDMA_CM_DEVICE_REMOVAL"
        );
    }
}
