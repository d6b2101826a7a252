//! The id state machine, exhaustively: every input (each user call, each undo, each
//! event, each iWARP event kind) x every `rdma_cm_state` has exactly one cell below
//! giving the resulting state or a refusal. The table is written from cma.c and the
//! departures documented on `IdState` and in `rdma_cm::machine`, independently of the
//! implementation's match. It also checks the error a refused user call returns and
//! where the handler lock is asserted.

use rdma_cm::machine::{needs_handler_lock, step, Input, IwInput, Refused};
use rdma_cm::{CmError, IdState};
use std::collections::HashSet;

/// Refused (the state is unchanged).
const X: Option<IdState> = None;
const ID: Option<IdState> = Some(IdState::Idle);
const AQ: Option<IdState> = Some(IdState::AddrQuery);
const AR: Option<IdState> = Some(IdState::AddrResolved);
const RQ: Option<IdState> = Some(IdState::RouteQuery);
const RR: Option<IdState> = Some(IdState::RouteResolved);
const CO: Option<IdState> = Some(IdState::Connect);
const DI: Option<IdState> = Some(IdState::Disconnect);
const AB: Option<IdState> = Some(IdState::AddrBound);
const LI: Option<IdState> = Some(IdState::Listen);
const DR: Option<IdState> = Some(IdState::DeviceRemoval);
const DE: Option<IdState> = Some(IdState::Destroying);
const ES: Option<IdState> = Some(IdState::Established);

const fn iw(ev: IwInput) -> Input {
    Input::IwEvent(ev)
}

/// One row per input; the columns are the states in `IdState::ALL` order.
#[rustfmt::skip]
fn table() -> Vec<(Input, [Option<IdState>; 12])> {
    use IdState::*;
    vec![
        //                                          IDLE ADDR_Q ADDR_R ROUTE_Q ROUTE_R CONNECT DISCONN ADDR_B LISTEN DEV_REM DESTROY ESTAB
        (Input::BindAddr,                           [AB,  X,     X,     X,      X,      X,      X,      X,     X,     X,      X,      X ]),
        (Input::ResolveAddr,                        [AQ,  X,     X,     X,      X,      X,      X,      AQ,    X,     X,      X,      X ]),
        (Input::ResolveAddrUndo(Idle),              [X,   ID,    X,     X,      X,      X,      X,      X,     X,     X,      X,      X ]),
        (Input::ResolveAddrUndo(AddrBound),         [X,   AB,    X,     X,      X,      X,      X,      X,     X,     X,      X,      X ]),
        (Input::ResolveAddrUndo(Listen),            [X,   X,     X,     X,      X,      X,      X,      X,     X,     X,      X,      X ]),
        (Input::AddrResolved,                       [X,   AR,    X,     X,      X,      X,      X,      X,     X,     X,      X,      X ]),
        (Input::AddrError,                          [X,   AB,    X,     X,      X,      X,      X,      X,     X,     X,      X,      X ]),
        (Input::ResolveRoute,                       [X,   X,     RQ,    X,      X,      X,      X,      X,     X,     X,      X,      X ]),
        (Input::RouteResolved,                      [X,   X,     X,     RR,     X,      X,      X,      X,     X,     X,      X,      X ]),
        (Input::RouteError,                         [X,   X,     X,     AR,     X,      X,      X,      X,     X,     X,      X,      X ]),
        (Input::CreateQp,                           [ID,  AQ,    AR,    RQ,     RR,     CO,     DI,     AB,    X,     X,      X,      ES]),
        (Input::Connect,                            [X,   X,     X,     X,      CO,     X,      X,      X,     X,     X,      X,      X ]),
        (Input::ConnectUndo,                        [X,   X,     X,     X,      X,      RR,     X,      X,     X,     X,      X,      X ]),
        (Input::Listen,                             [LI,  X,     X,     X,      X,      X,      X,      LI,    X,     X,      X,      X ]),
        (Input::ListenUndo,                         [X,   X,     X,     X,      X,      X,      X,      X,     AB,    X,      X,      X ]),
        (Input::Accept,                             [X,   X,     X,     X,      X,      CO,     X,      X,     X,     X,      X,      X ]),
        (Input::Reject,                             [X,   X,     X,     X,      X,      DI,     X,      X,     X,     X,      X,      X ]),
        (Input::Disconnect,                         [X,   X,     X,     X,      X,      DI,     X,      X,     X,     X,      X,      DI]),
        (iw(IwInput::ConnectRequest),               [X,   X,     X,     X,      X,      CO,     DI,     X,     X,     X,      X,      ES]),
        (iw(IwInput::ConnectReply { ok: true }),    [X,   X,     X,     X,      X,      ES,     ES,     X,     X,     X,      X,      ES]),
        (iw(IwInput::ConnectReply { ok: false }),   [X,   X,     X,     X,      X,      DI,     DI,     X,     X,     X,      X,      DI]),
        (iw(IwInput::Established),                  [X,   X,     X,     X,      X,      ES,     ES,     X,     X,     X,      X,      ES]),
        (iw(IwInput::Close),                        [X,   X,     X,     X,      X,      DI,     DI,     X,     X,     X,      X,      DI]),
        (Input::Destroy,                            [DE,  DE,    DE,    DE,     DE,     DE,     DE,     DE,    DE,    DE,     X,      DE]),
        (Input::DeviceRemovalReported,              [DR,  DR,    DR,    DR,     DR,     DR,     DR,     DR,    DR,    X,      X,      DR]),
        (Input::RemoveIdDev { ignore_destroying: false }, [DR, DR, DR,  DR,     DR,     DR,     DR,     DR,    DR,    DR,     X,      DR]),
        (Input::RemoveIdDev { ignore_destroying: true },  [DR, DR, DR,  DR,     DR,     DR,     DR,     DR,    DR,    DR,     DR,     DR]),
    ]
}

/// Every `Input` variant is named here: adding one fails to compile until the table
/// has its row.
fn variant_covered(i: Input) -> bool {
    match i {
        Input::BindAddr
        | Input::ResolveAddr
        | Input::ResolveAddrUndo(_)
        | Input::AddrResolved
        | Input::AddrError
        | Input::ResolveRoute
        | Input::RouteResolved
        | Input::RouteError
        | Input::CreateQp
        | Input::Connect
        | Input::ConnectUndo
        | Input::Listen
        | Input::ListenUndo
        | Input::Accept
        | Input::Reject
        | Input::Disconnect
        | Input::Destroy
        | Input::DeviceRemovalReported
        | Input::RemoveIdDev { .. } => true,
        Input::IwEvent(
            IwInput::ConnectRequest
            | IwInput::ConnectReply { .. }
            | IwInput::Established
            | IwInput::Close,
        ) => true,
    }
}

#[test]
fn every_state_by_every_input() {
    let rows = table();
    let inputs: HashSet<Input> = rows.iter().map(|(i, _)| *i).collect();
    assert_eq!(inputs.len(), rows.len(), "an input has two rows");
    let mut cells = 0;
    for (input, row) in &rows {
        assert!(variant_covered(*input));
        for (state, want) in IdState::ALL.iter().zip(row) {
            let got = step(*state, *input);
            match want {
                Some(to) => assert_eq!(got, Ok(*to), "{state} x {input:?}"),
                None => assert_eq!(
                    got,
                    Err(Refused {
                        state: *state,
                        input: *input
                    }),
                    "{state} x {input:?}"
                ),
            }
            cells += 1;
        }
    }
    assert_eq!(cells, 27 * 12);
}

/// A refused user call returns `DeviceRemoved` during device removal and
/// `InvalidState` (with the call's name and the state) otherwise; the names are those
/// the calls used before the machine existed.
#[test]
fn refusals_are_the_calls_errors() {
    let ops = [
        (Input::BindAddr, "bind_addr"),
        (Input::ResolveAddr, "resolve_addr"),
        (Input::ResolveRoute, "resolve_route"),
        (Input::CreateQp, "create_qp"),
        (Input::Connect, "connect"),
        (Input::Listen, "listen"),
        (Input::Accept, "accept"),
        (Input::Reject, "reject"),
        (Input::Disconnect, "disconnect"),
    ];
    for (input, op) in ops {
        assert_eq!(input.op(), op);
        for state in IdState::ALL {
            if let Err(r) = step(state, input) {
                let want = if state == IdState::DeviceRemoval {
                    CmError::DeviceRemoved { op }
                } else {
                    CmError::InvalidState { op, state }
                };
                assert_eq!(r.error(), want, "{state} x {input:?}");
                assert_eq!(CmError::from(r), want);
            }
        }
    }
}

/// cma.c's `cma_comp_exch` asserts the handler lock when the old or new state is
/// CONNECT; here the transitions made by events are asserted, which are exactly the
/// iWARP events on a CONNECT id.
#[test]
fn handler_lock_asserted_for_connect_events() {
    for (input, _) in table() {
        for state in IdState::ALL {
            let Ok(to) = step(state, input) else { continue };
            let want = matches!(input, Input::IwEvent(_)) && state == IdState::Connect;
            assert_eq!(
                needs_handler_lock(state, to, input),
                want,
                "{state} -> {to} on {input:?}"
            );
            assert_eq!(
                input.is_event(),
                matches!(
                    input,
                    Input::IwEvent(_)
                        | Input::AddrResolved
                        | Input::AddrError
                        | Input::RouteResolved
                        | Input::RouteError
                )
            );
        }
    }
}

#[test]
fn kernel_names() {
    let names: Vec<&str> = IdState::ALL.iter().map(|s| s.kernel_name()).collect();
    assert_eq!(
        names,
        [
            "RDMA_CM_IDLE",
            "RDMA_CM_ADDR_QUERY",
            "RDMA_CM_ADDR_RESOLVED",
            "RDMA_CM_ROUTE_QUERY",
            "RDMA_CM_ROUTE_RESOLVED",
            "RDMA_CM_CONNECT",
            "RDMA_CM_DISCONNECT",
            "RDMA_CM_ADDR_BOUND",
            "RDMA_CM_LISTEN",
            "RDMA_CM_DEVICE_REMOVAL",
            "RDMA_CM_DESTROYING",
            "RDMA_CM_ESTABLISHED",
        ]
    );
    assert_eq!(IdState::Connect.to_string(), "RDMA_CM_CONNECT");
}
