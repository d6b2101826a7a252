//! The rdma_cm id state machine, sans-IO: the states ([`IdState`], the kernel's
//! `enum rdma_cm_state` of cma_priv.h, with the same names) and a pure transition
//! function [`step`]`(state, input) -> Result<new state, Refused>`.
//!
//! [`step`] locks nothing and calls nothing. The threaded code (`crate::id`) keeps an
//! id's state in a `StateCell`, whose `StateCell::exch` is the only writer of an
//! id's state (cma.c's `cma_comp_exch` role): it applies [`step`] and writes the result,
//! or leaves the state unchanged on a refusal. A user call that checks first and writes
//! after other work (`bind_addr`, `connect`, `reject`, ...) asks [`step`] for the check
//! and `StateCell::exch` for the write, under the same hold of the id's `st` lock.
//!
//! # The handler lock (cma.c's `lockdep_assert_held`)
//!
//! cma.c's `cma_comp_exch` asserts `lockdep_assert_held(&id_priv->handler_mutex)` when
//! the old or the new state is `RDMA_CM_CONNECT` ("The FSM uses a funny double locking
//! where state is protected by both the handler_mutex and the spinlock. State is not
//! allowed to change to/from a handler_mutex protected value without also holding
//! handler_mutex."). `StateCell::exch` debug-asserts the same, through the
//! thread's record of the handler locks it holds (`crate::sync::holds`, kept for std
//! and loom alike), for every transition to or from CONNECT that an *event* makes
//! ([`Input::is_event`]: the iWARP events of `cma_iw_handler`, address and route
//! completion). The user calls that move to or from CONNECT (`connect` and its undo,
//! `reject`, `disconnect`) are serialized by the id's `ops` lock instead, and
//! `destroy` and device removal mark the id *before* taking the handler lock (the
//! rule "mark, then wait for a callback in progress", `crate::id`): departures
//! recorded here, not asserted.
//!
//! The transitions are cma.c's, with the bookkeeping departures listed on [`IdState`].

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

/// An input to the machine: a user call (the check it makes and the state it writes),
/// the undo of a user call that failed after its write, or an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Input {
    /// `rdma_bind_addr`: IDLE -> ADDR_BOUND.
    BindAddr,
    /// `rdma_resolve_addr`: IDLE/ADDR_BOUND -> ADDR_QUERY.
    ResolveAddr,
    /// `rdma_resolve_addr` failed before the query started (bad source or destination):
    /// ADDR_QUERY -> the state it started from (IDLE or ADDR_BOUND).
    ResolveAddrUndo(IdState),
    /// The address query ended well (cma.c's `addr_handler`): ADDR_QUERY ->
    /// ADDR_RESOLVED.
    AddrResolved,
    /// The address query failed: ADDR_QUERY -> ADDR_BOUND.
    AddrError,
    /// `rdma_resolve_route`: ADDR_RESOLVED -> ROUTE_QUERY.
    ResolveRoute,
    /// The route query ended well: ROUTE_QUERY -> ROUTE_RESOLVED.
    RouteResolved,
    /// The route query failed (the device is going away): ROUTE_QUERY -> ADDR_RESOLVED.
    RouteError,
    /// `rdma_create_qp`: a check only (refused on a listener, a destroyed id, or during
    /// device removal); the state does not change.
    CreateQp,
    /// `rdma_connect`: ROUTE_RESOLVED -> CONNECT.
    Connect,
    /// `rdma_connect` failed after its write (no iWARP id, the iWARP CM refused):
    /// CONNECT -> ROUTE_RESOLVED.
    ConnectUndo,
    /// `rdma_listen`: ADDR_BOUND (or IDLE, which binds the wildcard) -> LISTEN.
    Listen,
    /// `rdma_listen` failed on the device: LISTEN -> ADDR_BOUND.
    ListenUndo,
    /// `rdma_accept`: a check only (CONNECT); the state does not change.
    Accept,
    /// `rdma_reject`: CONNECT -> DISCONNECT.
    Reject,
    /// `rdma_disconnect`: CONNECT/ESTABLISHED -> DISCONNECT.
    Disconnect,
    /// An iWARP CM event on a connecting or connected id (cma.c's `cma_iw_handler`):
    /// accepted in CONNECT, ESTABLISHED and DISCONNECT; `CONNECT_REPLY` ->
    /// ESTABLISHED (success) or DISCONNECT, `ESTABLISHED` -> ESTABLISHED, `CLOSE` ->
    /// DISCONNECT, `CONNECT_REQUEST` changes nothing.
    IwEvent(IwInput),
    /// Destroy (a call, a callback's return, a failed setup): any state but DESTROYING
    /// -> DESTROYING.
    Destroy,
    /// The device reported its removal (the first half of removal, before the id's
    /// turn): -> DEVICE_REMOVAL unless DESTROYING or already DEVICE_REMOVAL.
    DeviceRemovalReported,
    /// cma.c's `cma_remove_id_dev`: -> DEVICE_REMOVAL unless DESTROYING.
    /// `ignore_destroying` is [`crate::RuleBreak::RemovalIgnoresDestroying`]'s broken
    /// variant, which marks a DESTROYING id too.
    RemoveIdDev {
        /// Break rule 3 (for the checker tests only).
        ignore_destroying: bool,
    },
}

/// An iWARP CM event, as the machine sees it ([`Input::IwEvent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IwInput {
    /// `IW_CM_EVENT_CONNECT_REQUEST` on a connection's id (never on a listener's).
    ConnectRequest,
    /// `IW_CM_EVENT_CONNECT_REPLY`, successful or not.
    ConnectReply {
        /// The status was `ConnectStatus::Ok`.
        ok: bool,
    },
    /// `IW_CM_EVENT_ESTABLISHED`.
    Established,
    /// `IW_CM_EVENT_CLOSE`.
    Close,
}

impl Input {
    /// Whether the input is an event (delivered under the id's handler lock) rather
    /// than a user call or its undo.
    pub const fn is_event(self) -> bool {
        matches!(
            self,
            Input::AddrResolved
                | Input::AddrError
                | Input::RouteResolved
                | Input::RouteError
                | Input::IwEvent(_)
        )
    }

    /// The name of the operation, as [`crate::CmError::InvalidState`] gives it (`op`).
    pub const fn op(self) -> &'static str {
        match self {
            Input::BindAddr => "bind_addr",
            Input::ResolveAddr | Input::ResolveAddrUndo(_) => "resolve_addr",
            Input::AddrResolved | Input::AddrError => "addr_done",
            Input::ResolveRoute => "resolve_route",
            Input::RouteResolved | Input::RouteError => "route_done",
            Input::CreateQp => "create_qp",
            Input::Connect | Input::ConnectUndo => "connect",
            Input::Listen | Input::ListenUndo => "listen",
            Input::Accept => "accept",
            Input::Reject => "reject",
            Input::Disconnect => "disconnect",
            Input::IwEvent(_) => "iw_event",
            Input::Destroy => "destroy",
            Input::DeviceRemovalReported | Input::RemoveIdDev { .. } => "device_removal",
        }
    }
}

/// The machine refused an input in this state; the state is unchanged. For a user call
/// this is its error ([`Refused::error`], in `error.rs`); for an event or an undo it means "stale:
/// nothing to do".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Refused {
    /// The state that refused.
    pub state: IdState,
    /// What was refused.
    pub input: Input,
}

/// The transition function: the state `input` moves `state` to, or why not.
///
/// # Errors
/// [`Refused`] when `state` does not accept `input` (see each [`Input`]).
pub const fn step(state: IdState, input: Input) -> Result<IdState, Refused> {
    use IdState as S;
    let to = match (state, input) {
        (S::Idle, Input::BindAddr) => S::AddrBound,
        (S::Idle | S::AddrBound, Input::ResolveAddr) => S::AddrQuery,
        (S::AddrQuery, Input::ResolveAddrUndo(prev @ (S::Idle | S::AddrBound))) => prev,
        (S::AddrQuery, Input::AddrResolved) => S::AddrResolved,
        (S::AddrQuery, Input::AddrError) => S::AddrBound,
        (S::AddrResolved, Input::ResolveRoute) => S::RouteQuery,
        (S::RouteQuery, Input::RouteResolved) => S::RouteResolved,
        (S::RouteQuery, Input::RouteError) => S::AddrResolved,
        (S::Destroying | S::DeviceRemoval | S::Listen, Input::CreateQp) => {
            return refuse(state, input)
        }
        (s, Input::CreateQp) => s,
        (S::RouteResolved, Input::Connect) => S::Connect,
        (S::Connect, Input::ConnectUndo) => S::RouteResolved,
        (S::Idle | S::AddrBound, Input::Listen) => S::Listen,
        (S::Listen, Input::ListenUndo) => S::AddrBound,
        (S::Connect, Input::Accept) => S::Connect,
        (S::Connect, Input::Reject) => S::Disconnect,
        (S::Connect | S::Established, Input::Disconnect) => S::Disconnect,
        (s @ (S::Connect | S::Established | S::Disconnect), Input::IwEvent(ev)) => match ev {
            IwInput::ConnectRequest => s,
            IwInput::ConnectReply { ok: true } | IwInput::Established => S::Established,
            IwInput::ConnectReply { ok: false } | IwInput::Close => S::Disconnect,
        },
        (S::Destroying, Input::Destroy) => return refuse(state, input),
        (_, Input::Destroy) => S::Destroying,
        (S::Destroying | S::DeviceRemoval, Input::DeviceRemovalReported) => {
            return refuse(state, input)
        }
        (_, Input::DeviceRemovalReported) => S::DeviceRemoval,
        (
            S::Destroying,
            Input::RemoveIdDev {
                ignore_destroying: false,
            },
        ) => return refuse(state, input),
        (_, Input::RemoveIdDev { .. }) => S::DeviceRemoval,
        _ => return refuse(state, input),
    };
    Ok(to)
}

const fn refuse(state: IdState, input: Input) -> Result<IdState, Refused> {
    Err(Refused { state, input })
}

/// Whether cma.c's `cma_comp_exch` would assert the handler lock for this transition
/// (old or new state CONNECT) and this crate holds it there (an event: see the module
/// doc for the user calls and the mark-first paths).
pub const fn needs_handler_lock(from: IdState, to: IdState, input: Input) -> bool {
    input.is_event() && (matches!(from, IdState::Connect) || matches!(to, IdState::Connect))
}

/// An id's state, written only by [`StateCell::exch`].
#[derive(Debug)]
pub(crate) struct StateCell {
    state: IdState,
}

impl StateCell {
    /// A new id's state (IDLE; CONNECT for a connect request's new id; LISTEN for an
    /// internal listener).
    pub(crate) const fn new(state: IdState) -> StateCell {
        StateCell { state }
    }

    /// The current state.
    pub(crate) const fn get(&self) -> IdState {
        self.state
    }

    /// cma.c's `cma_comp_exch`: apply [`step`] to the current state and write the
    /// result; the state the id left on success, the refusal (state unchanged)
    /// otherwise. `serial` names the id for the handler-lock assertion (see the module
    /// doc); `span` is the id's tracing span.
    pub(crate) fn exch(
        &mut self,
        input: Input,
        serial: u64,
        span: &tracing::Span,
    ) -> Result<IdState, Refused> {
        let from = self.state;
        let to = step(from, input)?;
        debug_assert!(
            !needs_handler_lock(from, to, input) || crate::sync::holds(serial),
            "rdma_cm id #{serial}: {from} -> {to} on {input:?} without its handler lock"
        );
        if from != to {
            tracing::trace!(parent: span, %from, %to, ?input, "state");
        }
        self.state = to;
        Ok(from)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn span() -> tracing::Span {
        tracing::Span::none()
    }

    #[test]
    fn exch_writes_accepted_inputs_only() {
        let mut cell = StateCell::new(IdState::Idle);
        assert_eq!(cell.exch(Input::BindAddr, 1, &span()), Ok(IdState::Idle));
        assert_eq!(cell.get(), IdState::AddrBound);
        let refused = cell.exch(Input::Connect, 1, &span());
        assert_eq!(
            refused,
            Err(Refused {
                state: IdState::AddrBound,
                input: Input::Connect
            })
        );
        assert_eq!(cell.get(), IdState::AddrBound);
    }

    #[test]
    fn connect_event_with_the_handler_lock() {
        let mut cell = StateCell::new(IdState::Connect);
        crate::sync::push_held(7);
        let r = cell.exch(Input::IwEvent(IwInput::Established), 7, &span());
        crate::sync::pop_held(7);
        assert_eq!(r, Ok(IdState::Connect));
        assert_eq!(cell.get(), IdState::Established);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "without its handler lock")]
    fn connect_event_without_the_handler_lock_asserts() {
        let mut cell = StateCell::new(IdState::Connect);
        let _ = cell.exch(Input::IwEvent(IwInput::Close), 8, &span());
    }
}
