//! The cm_id state machine, sans-IO: a pure transition function
//! `(Machine, Input) -> Step`.
//!
//! Nothing here locks, allocates a thread or calls a provider. [`Machine::step`] says
//! what the new state is, what the downcall returns to the user, which provider
//! downcalls to issue (in order) and whether the event is delivered, consumed or
//! dropped. The threaded wrapper ([`crate::CmId`], the worker pool) applies a [`Step`]
//! under the id's lock and issues the downcalls after releasing it.
//!
//! The transitions are those of the Linux kernel's `drivers/infiniband/core/iwcm.c`
//! (`iw_cm_listen`, `iw_cm_connect`, `iw_cm_accept`, `iw_cm_reject`,
//! `iw_cm_disconnect`, `destroy_cm_id`, `cm_conn_req_handler`, `cm_conn_rep_handler`,
//! `cm_conn_est_handler`, `cm_disconnect_handler`, `cm_close_handler`), with these
//! departures, all forced by "destroy and the other downcalls never block":
//!
//! * The kernel makes `iw_cm_disconnect` and `iw_destroy_cm_id` *sleep* while a
//!   connect or accept is in flight (`IWCM_F_CONNECT_WAIT`), so it never has to tear
//!   down `CONN_SENT` or an accepted `CONN_RECV` (it `BUG()`s there). Here those two
//!   situations are states of their own ([`CmState::ConnSent`], and
//!   [`CmState::ConnRecv`] with [`Machine::accept_pending`]): `disconnect` returns
//!   [`StateError::Busy`] and `destroy` aborts the attempt
//!   ([`Downcall::Disconnect`] with [`DisconnectMode::Abortive`]).
//! * Events that the kernel `BUG()`s on (a provider breaking its contract) are
//!   [`Upcall::Dropped`] with [`DropReason::Unexpected`] and counted; a
//!   `CONNECT_REQUEST` dropped that way is also rejected at the provider
//!   ([`Downcall::RejectRequest`]) so that no request is ever dropped silently.
//! * `CLOSE` in `CONN_RECV` (the peer went away before the user accepted, or the
//!   accepted connection failed before it was established) moves to `IDLE` and is
//!   delivered, so the user always hears the end of a connection it was offered.
//! * `destroy` in `CLOSING` also aborts the connection (the kernel leaves it to the
//!   peer), so a destroyed id never waits on the peer.
//!
//! Module order: this module sits above `provider` (it speaks the provider's
//! vocabulary, [`ConnectStatus`] and [`DisconnectMode`], and classifies its events:
//! [`ProviderEvent::kind`]) and below everything else but `sync`.

use crate::provider::{ConnectStatus, DisconnectMode, ProviderEvent};
use core::fmt;

/// The state of a cm_id: the kernel's `enum iw_cm_state`, with the same names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmState {
    /// `IW_CM_STATE_IDLE`: fresh, or a connection ended (rejected, refused, closed).
    Idle,
    /// `IW_CM_STATE_LISTEN`: a provider listener exists; connect requests arrive.
    Listen,
    /// `IW_CM_STATE_CONN_RECV`: a child id made for an incoming connect request,
    /// waiting for accept or reject (or, after accept, for `ESTABLISHED`).
    ConnRecv,
    /// `IW_CM_STATE_CONN_SENT`: connect issued, waiting for `CONNECT_REPLY`.
    ConnSent,
    /// `IW_CM_STATE_ESTABLISHED`: connected; the QP is in RTS.
    Established,
    /// `IW_CM_STATE_CLOSING`: a disconnect started (local call, or the provider's
    /// `DISCONNECT`); waiting for `CLOSE`.
    Closing,
    /// `IW_CM_STATE_DESTROYING`: destroyed by the user; every event is dropped
    /// (`IWCM_F_DROP_EVENTS`). Terminal.
    Destroying,
}

impl CmState {
    /// All seven states, in declaration order (for exhaustive tests).
    pub const ALL: [CmState; 7] = [
        CmState::Idle,
        CmState::Listen,
        CmState::ConnRecv,
        CmState::ConnSent,
        CmState::Established,
        CmState::Closing,
        CmState::Destroying,
    ];

    /// The kernel's name of the state (`IW_CM_STATE_...`).
    pub const fn kernel_name(self) -> &'static str {
        match self {
            CmState::Idle => "IW_CM_STATE_IDLE",
            CmState::Listen => "IW_CM_STATE_LISTEN",
            CmState::ConnRecv => "IW_CM_STATE_CONN_RECV",
            CmState::ConnSent => "IW_CM_STATE_CONN_SENT",
            CmState::Established => "IW_CM_STATE_ESTABLISHED",
            CmState::Closing => "IW_CM_STATE_CLOSING",
            CmState::Destroying => "IW_CM_STATE_DESTROYING",
        }
    }
}

impl fmt::Display for CmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kernel_name())
    }
}

/// The full state of one cm_id's machine: the [`CmState`] plus whether an accept is in
/// flight (the kernel's `IWCM_F_CONNECT_WAIT` bit while in `CONN_RECV`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Machine {
    state: CmState,
    accept_pending: bool,
}

impl Default for Machine {
    fn default() -> Self {
        Machine::new()
    }
}

/// Which provider downcall a [`Step`] asks for. The wrapper issues them in the order
/// given, after releasing the id's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Downcall {
    /// `iw_create_listen`: [`crate::Provider::create_listen`].
    CreateListen,
    /// `iw_destroy_listen`: [`crate::Provider::destroy_listen`].
    DestroyListen,
    /// `iw_add_ref(qp)`: bind the user's QP to the id ([`crate::Provider::qp_add_ref`]).
    QpAddRef,
    /// `iw_connect`: [`crate::Provider::connect`].
    Connect,
    /// `iw_accept`: [`crate::Provider::accept`].
    Accept,
    /// `iw_reject` of the id's own pending request: [`crate::Provider::reject`].
    Reject,
    /// Move the QP to closing (graceful, the kernel's SQD) or ERROR (abortive):
    /// [`crate::Provider::disconnect`].
    Disconnect(DisconnectMode),
    /// `iw_rem_ref(qp)`: unbind the QP ([`crate::Provider::qp_rem_ref`]); exactly one per
    /// [`Downcall::QpAddRef`].
    QpRemRef,
    /// Reject the incoming connection carried by the `CONNECT_REQUEST` being dropped
    /// ([`crate::Provider::reject`] on the request's connection).
    RejectRequest,
}

/// Why an event was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The id is being destroyed (`IWCM_F_DROP_EVENTS`).
    Destroying,
    /// The provider reported an event that is impossible in this state (the kernel
    /// `BUG()`s); counted in [`crate::CmStats::unexpected_events`].
    Unexpected,
}

/// What happens to the user's handler for this input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Upcall {
    /// The input was a user downcall: no event involved.
    None,
    /// Deliver the event to the handler.
    Deliver,
    /// The event changed the state but is never delivered (`DISCONNECT`:
    /// `cm_disconnect_handler` has no upcall).
    Consumed,
    /// The event is discarded.
    Dropped(DropReason),
}

/// Why a user downcall was refused by the state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateError {
    /// Not allowed in this state (the kernel's `-EINVAL`).
    InvalidState(CmState),
    /// A connect or accept is in flight and its reply has not been processed yet.
    /// The kernel sleeps here (`IWCM_F_CONNECT_WAIT`); we never block, so the caller
    /// retries after `ConnectReply` / `Established`, or destroys the id.
    Busy,
    /// The id is being destroyed.
    Destroyed,
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::InvalidState(s) => write!(f, "not allowed in state {s}"),
            StateError::Busy => f.write_str("a connect or accept is in flight"),
            StateError::Destroyed => f.write_str("the cm_id is being destroyed"),
        }
    }
}

/// A provider event, reduced to what the state machine needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// `IW_CM_EVENT_CONNECT_REQUEST` (listeners).
    ConnectRequest,
    /// `IW_CM_EVENT_CONNECT_REPLY` with its status (active side).
    ConnectReply(ConnectStatus),
    /// `IW_CM_EVENT_ESTABLISHED` (passive side, after accept).
    Established,
    /// `IW_CM_EVENT_DISCONNECT`: the peer started an orderly close.
    Disconnect,
    /// `IW_CM_EVENT_CLOSE`: the connection is gone; the provider has moved the QP to
    /// ERROR.
    Close,
}

impl EventKind {
    /// Every event kind (each connect-reply status counts as one).
    pub const ALL: [EventKind; 9] = [
        EventKind::ConnectRequest,
        EventKind::ConnectReply(ConnectStatus::Ok),
        EventKind::ConnectReply(ConnectStatus::Rejected),
        EventKind::ConnectReply(ConnectStatus::Refused),
        EventKind::ConnectReply(ConnectStatus::TimedOut),
        EventKind::ConnectReply(ConnectStatus::Reset),
        EventKind::Established,
        EventKind::Disconnect,
        EventKind::Close,
    ];
}

/// How the machine sees a provider event (defined here, above `provider`, which
/// names no machine type).
impl<C> ProviderEvent<C> {
    /// The event kind, as the state machine sees it.
    pub fn kind(&self) -> EventKind {
        match self {
            ProviderEvent::ConnectRequest(_) => EventKind::ConnectRequest,
            ProviderEvent::ConnectReply(r) => EventKind::ConnectReply(r.status),
            ProviderEvent::Established => EventKind::Established,
            ProviderEvent::Disconnect => EventKind::Disconnect,
            ProviderEvent::Close => EventKind::Close,
        }
    }
}

/// One input to the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Input {
    /// User: `iw_cm_listen`.
    Listen,
    /// User: `iw_cm_connect`.
    Connect,
    /// User: `iw_cm_accept`.
    Accept,
    /// User: `iw_cm_reject`.
    Reject,
    /// User: `iw_cm_disconnect` (`abrupt` = [`DisconnectMode::Abortive`]).
    Disconnect(DisconnectMode),
    /// User: `iw_destroy_cm_id`, or a handler returning
    /// [`crate::Disposition::Destroy`].
    Destroy,
    /// The provider's `create_listen` downcall failed.
    ListenFailed,
    /// The provider's `connect` downcall failed (no event will follow).
    ConnectFailed,
    /// The provider's `accept` downcall failed (no event will follow).
    AcceptFailed,
    /// An event reported by the provider, taken from the id's queue by a CM worker.
    Event(EventKind),
}

impl Input {
    /// Every input: the user downcalls (each disconnect mode counts as one), the
    /// downcall failures and every [`EventKind`].
    pub const ALL: [Input; 19] = [
        Input::Listen,
        Input::Connect,
        Input::Accept,
        Input::Reject,
        Input::Disconnect(DisconnectMode::Graceful),
        Input::Disconnect(DisconnectMode::Abortive),
        Input::Destroy,
        Input::ListenFailed,
        Input::ConnectFailed,
        Input::AcceptFailed,
        Input::Event(EventKind::ALL[0]),
        Input::Event(EventKind::ALL[1]),
        Input::Event(EventKind::ALL[2]),
        Input::Event(EventKind::ALL[3]),
        Input::Event(EventKind::ALL[4]),
        Input::Event(EventKind::ALL[5]),
        Input::Event(EventKind::ALL[6]),
        Input::Event(EventKind::ALL[7]),
        Input::Event(EventKind::ALL[8]),
    ];

    /// Whether this input is a provider event.
    pub const fn is_event(self) -> bool {
        matches!(self, Input::Event(_))
    }
}

/// The outcome of one transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Step {
    /// The machine after the input.
    pub next: Machine,
    /// What the user downcall returns (always `Ok` for events and failures).
    pub result: Result<(), StateError>,
    /// Provider downcalls to issue, in order, outside the id's lock.
    pub downcalls: &'static [Downcall],
    /// What happens to the event.
    pub upcall: Upcall,
}

const NONE: &[Downcall] = &[];
const REM: &[Downcall] = &[Downcall::QpRemRef];
const ABORT_AND_REM: &[Downcall] = &[
    Downcall::Disconnect(DisconnectMode::Abortive),
    Downcall::QpRemRef,
];
const REJECT_REQ: &[Downcall] = &[Downcall::RejectRequest];

impl Machine {
    /// A fresh id: `IDLE` (`iw_create_cm_id`).
    pub const fn new() -> Machine {
        Machine {
            state: CmState::Idle,
            accept_pending: false,
        }
    }

    /// A child id made for an incoming request: `CONN_RECV`, no accept yet
    /// (`cm_conn_req_handler`).
    pub const fn conn_recv() -> Machine {
        Machine {
            state: CmState::ConnRecv,
            accept_pending: false,
        }
    }

    /// Every reachable machine: the seven states, plus `CONN_RECV` with an accept in
    /// flight.
    pub const ALL: [Machine; 8] = [
        Machine::at(CmState::Idle),
        Machine::at(CmState::Listen),
        Machine::at(CmState::ConnRecv),
        Machine {
            state: CmState::ConnRecv,
            accept_pending: true,
        },
        Machine::at(CmState::ConnSent),
        Machine::at(CmState::Established),
        Machine::at(CmState::Closing),
        Machine::at(CmState::Destroying),
    ];

    /// The machine in `state` with no accept in flight.
    pub const fn at(state: CmState) -> Machine {
        Machine {
            state,
            accept_pending: false,
        }
    }

    /// The machine in `CONN_RECV` with an accept in flight.
    pub const fn accepting() -> Machine {
        Machine {
            state: CmState::ConnRecv,
            accept_pending: true,
        }
    }

    /// The current state.
    pub const fn state(self) -> CmState {
        self.state
    }

    /// Whether an accept downcall was issued and `ESTABLISHED` (or `CLOSE`) has not
    /// been processed yet (only in `CONN_RECV`).
    pub const fn accept_pending(self) -> bool {
        self.accept_pending
    }

    /// Whether the id holds a QP reference in this machine state (a
    /// [`Downcall::QpAddRef`] not yet matched by a [`Downcall::QpRemRef`]).
    pub const fn holds_qp(self) -> bool {
        matches!(
            self.state,
            CmState::ConnSent | CmState::Established | CmState::Closing
        ) || (matches!(self.state, CmState::ConnRecv) && self.accept_pending)
    }

    /// Whether events are dropped (`IWCM_F_DROP_EVENTS`).
    pub const fn drops_events(self) -> bool {
        matches!(self.state, CmState::Destroying)
    }

    /// The transition function. Pure: same input, same output.
    pub fn step(self, input: Input) -> Step {
        use CmState::*;
        let me = self;
        let ok = |next: Machine, downcalls: &'static [Downcall]| Step {
            next,
            result: Ok(()),
            downcalls,
            upcall: Upcall::None,
        };
        let refuse = |e: StateError| Step {
            next: me,
            result: Err(e),
            downcalls: NONE,
            upcall: Upcall::None,
        };
        let invalid = || refuse(StateError::InvalidState(me.state));
        let unchanged = || ok(me, NONE);
        let event = |next: Machine, downcalls: &'static [Downcall], upcall: Upcall| Step {
            next,
            result: Ok(()),
            downcalls,
            upcall,
        };
        let unexpected = |downcalls: &'static [Downcall]| {
            event(me, downcalls, Upcall::Dropped(DropReason::Unexpected))
        };

        if self.state == Destroying {
            return match input {
                // destroy is idempotent: the second call finds DESTROYING and does nothing.
                Input::Destroy => unchanged(),
                Input::Listen
                | Input::Connect
                | Input::Accept
                | Input::Reject
                | Input::Disconnect(_) => refuse(StateError::Destroyed),
                // destroy_cm_id already took the QP and the listener.
                Input::ListenFailed | Input::ConnectFailed | Input::AcceptFailed => unchanged(),
                Input::Event(EventKind::ConnectRequest) => {
                    event(me, REJECT_REQ, Upcall::Dropped(DropReason::Destroying))
                }
                Input::Event(_) => event(me, NONE, Upcall::Dropped(DropReason::Destroying)),
            };
        }

        // DISCONNECT never reaches the user (cm_disconnect_handler): ESTABLISHED ->
        // CLOSING, anything else unchanged.
        if input == Input::Event(EventKind::Disconnect) {
            let next = if self.state == Established {
                Machine::at(Closing)
            } else {
                me
            };
            return event(next, NONE, Upcall::Consumed);
        }
        // A CONNECT_REQUEST on anything but a listener is a provider bug; reject it.
        if input == Input::Event(EventKind::ConnectRequest) && self.state != Listen {
            return unexpected(REJECT_REQ);
        }

        match (self.state, self.accept_pending, input) {
            // ---------------------------------------------------------------- IDLE
            (Idle, _, Input::Listen) => ok(Machine::at(Listen), &[Downcall::CreateListen]),
            (Idle, _, Input::Connect) => ok(
                Machine::at(ConnSent),
                &[Downcall::QpAddRef, Downcall::Connect],
            ),
            (Idle, _, Input::Accept | Input::Reject) => invalid(),
            // "accept or connect returned !0": nothing to do.
            (Idle, _, Input::Disconnect(_)) => unchanged(),
            (Idle, _, Input::Destroy) => ok(Machine::at(Destroying), NONE),
            (Idle, _, Input::ListenFailed | Input::ConnectFailed | Input::AcceptFailed) => {
                unchanged()
            }
            (Idle, _, Input::Event(_)) => unexpected(NONE),

            // -------------------------------------------------------------- LISTEN
            (Listen, _, Input::Listen | Input::Connect | Input::Accept | Input::Reject) => {
                invalid()
            }
            (Listen, _, Input::Disconnect(_)) => invalid(),
            (Listen, _, Input::Destroy) => ok(Machine::at(Destroying), &[Downcall::DestroyListen]),
            (Listen, _, Input::ListenFailed) => ok(Machine::at(Idle), NONE),
            (Listen, _, Input::ConnectFailed | Input::AcceptFailed) => unchanged(),
            (Listen, _, Input::Event(EventKind::ConnectRequest)) => {
                event(me, NONE, Upcall::Deliver)
            }
            (Listen, _, Input::Event(_)) => unexpected(NONE),

            // ------------------------------------------------- CONN_RECV (no accept)
            (ConnRecv, false, Input::Listen | Input::Connect) => invalid(),
            (ConnRecv, false, Input::Accept) => ok(
                Machine::accepting(),
                &[Downcall::QpAddRef, Downcall::Accept],
            ),
            (ConnRecv, false, Input::Reject) => ok(Machine::at(Idle), &[Downcall::Reject]),
            // "App called disconnect before/without calling accept": nothing to do.
            (ConnRecv, false, Input::Disconnect(_)) => unchanged(),
            (ConnRecv, false, Input::Destroy) => ok(Machine::at(Destroying), &[Downcall::Reject]),
            (ConnRecv, false, Input::ListenFailed | Input::ConnectFailed | Input::AcceptFailed) => {
                unchanged()
            }
            (ConnRecv, false, Input::Event(EventKind::Close)) => {
                event(Machine::at(Idle), NONE, Upcall::Deliver)
            }
            (ConnRecv, false, Input::Event(_)) => unexpected(NONE),

            // ------------------------------------------- CONN_RECV (accept in flight)
            (ConnRecv, true, Input::Listen | Input::Connect) => invalid(),
            (ConnRecv, true, Input::Accept | Input::Reject | Input::Disconnect(_)) => {
                refuse(StateError::Busy)
            }
            (ConnRecv, true, Input::Destroy) => ok(Machine::at(Destroying), ABORT_AND_REM),
            // iw_cm_accept: "An error on accept precludes provider events" -> IDLE.
            (ConnRecv, true, Input::AcceptFailed) => ok(Machine::at(Idle), REM),
            (ConnRecv, true, Input::ListenFailed | Input::ConnectFailed) => unchanged(),
            (ConnRecv, true, Input::Event(EventKind::Established)) => {
                event(Machine::at(Established), NONE, Upcall::Deliver)
            }
            (ConnRecv, true, Input::Event(EventKind::Close)) => {
                event(Machine::at(Idle), REM, Upcall::Deliver)
            }
            (ConnRecv, true, Input::Event(_)) => unexpected(NONE),

            // ----------------------------------------------------------- CONN_SENT
            (ConnSent, _, Input::Listen | Input::Connect | Input::Accept | Input::Reject) => {
                invalid()
            }
            (ConnSent, _, Input::Disconnect(_)) => refuse(StateError::Busy),
            (ConnSent, _, Input::Destroy) => ok(Machine::at(Destroying), ABORT_AND_REM),
            (ConnSent, _, Input::ConnectFailed) => ok(Machine::at(Idle), REM),
            (ConnSent, _, Input::ListenFailed | Input::AcceptFailed) => unchanged(),
            (ConnSent, _, Input::Event(EventKind::ConnectReply(ConnectStatus::Ok))) => {
                event(Machine::at(Established), NONE, Upcall::Deliver)
            }
            // "REJECTED or RESET": back to IDLE, QP released, reply delivered.
            (ConnSent, _, Input::Event(EventKind::ConnectReply(_))) => {
                event(Machine::at(Idle), REM, Upcall::Deliver)
            }
            (ConnSent, _, Input::Event(_)) => unexpected(NONE),

            // --------------------------------------------------------- ESTABLISHED
            (Established, _, Input::Listen | Input::Connect | Input::Accept | Input::Reject) => {
                invalid()
            }
            (Established, _, Input::Disconnect(mode)) => match mode {
                DisconnectMode::Graceful => ok(
                    Machine::at(Closing),
                    &[Downcall::Disconnect(DisconnectMode::Graceful)],
                ),
                DisconnectMode::Abortive => ok(
                    Machine::at(Closing),
                    &[Downcall::Disconnect(DisconnectMode::Abortive)],
                ),
            },
            // "Abrupt close of the connection": QP to ERROR, QP released.
            (Established, _, Input::Destroy) => ok(Machine::at(Destroying), ABORT_AND_REM),
            (Established, _, Input::ListenFailed | Input::ConnectFailed | Input::AcceptFailed) => {
                unchanged()
            }
            (Established, _, Input::Event(EventKind::Close)) => {
                event(Machine::at(Idle), REM, Upcall::Deliver)
            }
            (Established, _, Input::Event(_)) => unexpected(NONE),

            // ------------------------------------------------------------- CLOSING
            (Closing, _, Input::Listen | Input::Connect | Input::Accept | Input::Reject) => {
                invalid()
            }
            // "remote peer closed first": nothing to do.
            (Closing, _, Input::Disconnect(_)) => unchanged(),
            (Closing, _, Input::Destroy) => ok(Machine::at(Destroying), ABORT_AND_REM),
            (Closing, _, Input::ListenFailed | Input::ConnectFailed | Input::AcceptFailed) => {
                unchanged()
            }
            (Closing, _, Input::Event(EventKind::Close)) => {
                event(Machine::at(Idle), REM, Upcall::Deliver)
            }
            (Closing, _, Input::Event(_)) => unexpected(NONE),

            (Destroying, _, _) => unreachable_destroying(me),
        }
    }
}

/// `Destroying` is handled before the match; this keeps the match exhaustive without a
/// wildcard arm (so adding a state is a compile error here).
fn unreachable_destroying(me: Machine) -> Step {
    Step {
        next: me,
        result: Err(StateError::Destroyed),
        downcalls: NONE,
        upcall: Upcall::Dropped(DropReason::Destroying),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every QpAddRef is matched by exactly one QpRemRef along any path, and
    /// `holds_qp` agrees with the downcalls issued.
    #[test]
    fn qp_reference_accounting_is_consistent_with_holds_qp() {
        for m in Machine::ALL {
            for input in Input::ALL {
                let step = m.step(input);
                let adds = step
                    .downcalls
                    .iter()
                    .filter(|d| **d == Downcall::QpAddRef)
                    .count() as i32;
                let rems = step
                    .downcalls
                    .iter()
                    .filter(|d| **d == Downcall::QpRemRef)
                    .count() as i32;
                let before = m.holds_qp() as i32;
                let after = step.next.holds_qp() as i32;
                assert_eq!(before + adds - rems, after, "{m:?} x {input:?} -> {step:?}");
            }
        }
    }

    #[test]
    fn destroying_is_terminal_and_delivers_nothing() {
        let m = Machine::at(CmState::Destroying);
        for input in Input::ALL {
            let step = m.step(input);
            assert_eq!(step.next, m);
            assert_ne!(step.upcall, Upcall::Deliver);
        }
    }
}
