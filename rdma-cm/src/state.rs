//! The states of an rdma_cm id: the kernel's `enum rdma_cm_state` (cma_priv.h), with
//! the same names.

use core::fmt;

/// The state of an rdma_cm id (`enum rdma_cm_state`).
///
/// The transitions are cma.c's: `bind_addr` IDLE -> ADDR_BOUND; `resolve_addr`
/// IDLE/ADDR_BOUND -> ADDR_QUERY -> ADDR_RESOLVED (or back to ADDR_BOUND with
/// `AddrError`); `resolve_route` ADDR_RESOLVED -> ROUTE_QUERY -> ROUTE_RESOLVED (or
/// back with `RouteError`); `connect` ROUTE_RESOLVED -> CONNECT; a new id made for a
/// connect request starts in CONNECT; `listen` ADDR_BOUND (or IDLE, binding the
/// wildcard address) -> LISTEN; device removal -> DEVICE_REMOVAL; destroy ->
/// DESTROYING. Two departures, both bookkeeping only: the kernel's iWARP path stays in
/// CONNECT once connected, here [`IdState::Established`] records it; and after a
/// disconnect or a failed connect the id moves to [`IdState::Disconnect`] (the
/// kernel's IB path does the same), where only `destroy` remains useful.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdState {
    /// `RDMA_CM_IDLE`: fresh.
    Idle,
    /// `RDMA_CM_ADDR_QUERY`: `resolve_addr` in progress.
    AddrQuery,
    /// `RDMA_CM_ADDR_RESOLVED`: bound to a device, source address chosen.
    AddrResolved,
    /// `RDMA_CM_ROUTE_QUERY`: `resolve_route` in progress.
    RouteQuery,
    /// `RDMA_CM_ROUTE_RESOLVED`: ready to connect.
    RouteResolved,
    /// `RDMA_CM_CONNECT`: connect issued, or a new id made for a connect request
    /// (waiting for accept/reject, or, after accept, for `Established`).
    Connect,
    /// `RDMA_CM_DISCONNECT`: disconnected, or the connection attempt failed.
    Disconnect,
    /// `RDMA_CM_ADDR_BOUND`: `bind_addr` done (or an address query failed).
    AddrBound,
    /// `RDMA_CM_LISTEN`: listening (on one device, or on every device for the
    /// wildcard address).
    Listen,
    /// `RDMA_CM_DEVICE_REMOVAL`: the id's device is being removed; one
    /// `DeviceRemoval` event is (or was) delivered and no other event will be.
    DeviceRemoval,
    /// `RDMA_CM_DESTROYING`: destroy was asked (by a call or a callback's return); no
    /// callback starts any more.
    Destroying,
    /// `RDMA_CM_ESTABLISHED`: connected.
    Established,
}

impl IdState {
    /// Every state, in declaration order.
    pub const ALL: [IdState; 12] = [
        IdState::Idle,
        IdState::AddrQuery,
        IdState::AddrResolved,
        IdState::RouteQuery,
        IdState::RouteResolved,
        IdState::Connect,
        IdState::Disconnect,
        IdState::AddrBound,
        IdState::Listen,
        IdState::DeviceRemoval,
        IdState::Destroying,
        IdState::Established,
    ];

    /// The kernel's name (`RDMA_CM_...`).
    pub const fn kernel_name(self) -> &'static str {
        match self {
            IdState::Idle => "RDMA_CM_IDLE",
            IdState::AddrQuery => "RDMA_CM_ADDR_QUERY",
            IdState::AddrResolved => "RDMA_CM_ADDR_RESOLVED",
            IdState::RouteQuery => "RDMA_CM_ROUTE_QUERY",
            IdState::RouteResolved => "RDMA_CM_ROUTE_RESOLVED",
            IdState::Connect => "RDMA_CM_CONNECT",
            IdState::Disconnect => "RDMA_CM_DISCONNECT",
            IdState::AddrBound => "RDMA_CM_ADDR_BOUND",
            IdState::Listen => "RDMA_CM_LISTEN",
            IdState::DeviceRemoval => "RDMA_CM_DEVICE_REMOVAL",
            IdState::Destroying => "RDMA_CM_DESTROYING",
            IdState::Established => "RDMA_CM_ESTABLISHED",
        }
    }
}

impl fmt::Display for IdState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kernel_name())
    }
}
