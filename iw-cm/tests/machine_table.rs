//! The state machine, exhaustively: every machine state (the seven `iw_cm_state`s plus
//! `CONN_RECV` with an accept in flight) x every input (each user downcall, each
//! downcall failure, each provider event with each connect-reply status) has exactly
//! one row below giving the resulting state, the return value, the provider downcalls
//! and the upcall. The table is written from iwcm.c (and the departures documented in
//! `iw_cm::machine`), independently of the implementation's match.

use iw_cm::machine::{Downcall, DropReason, EventKind, Input, Machine, StateError, Step, Upcall};
use iw_cm::{CmState, ConnectStatus, DisconnectMode};
use std::collections::HashSet;

const I: Machine = Machine::at(CmState::Idle);
const L: Machine = Machine::at(CmState::Listen);
const R: Machine = Machine::at(CmState::ConnRecv);
const RA: Machine = Machine::accepting();
const S: Machine = Machine::at(CmState::ConnSent);
const E: Machine = Machine::at(CmState::Established);
const C: Machine = Machine::at(CmState::Closing);
const D: Machine = Machine::at(CmState::Destroying);

const LISTEN: Input = Input::Listen;
const CONNECT: Input = Input::Connect;
const ACCEPT: Input = Input::Accept;
const REJECT: Input = Input::Reject;
const DISC_G: Input = Input::Disconnect(DisconnectMode::Graceful);
const DISC_A: Input = Input::Disconnect(DisconnectMode::Abortive);
const DESTROY: Input = Input::Destroy;
const LISTEN_FAILED: Input = Input::ListenFailed;
const CONNECT_FAILED: Input = Input::ConnectFailed;
const ACCEPT_FAILED: Input = Input::AcceptFailed;
const EV_REQ: Input = Input::Event(EventKind::ConnectRequest);
const EV_REP_OK: Input = Input::Event(EventKind::ConnectReply(ConnectStatus::Ok));
const EV_REP_REJ: Input = Input::Event(EventKind::ConnectReply(ConnectStatus::Rejected));
const EV_REP_REF: Input = Input::Event(EventKind::ConnectReply(ConnectStatus::Refused));
const EV_REP_TO: Input = Input::Event(EventKind::ConnectReply(ConnectStatus::TimedOut));
const EV_REP_RST: Input = Input::Event(EventKind::ConnectReply(ConnectStatus::Reset));
const EV_EST: Input = Input::Event(EventKind::Established);
const EV_DISC: Input = Input::Event(EventKind::Disconnect);
const EV_CLOSE: Input = Input::Event(EventKind::Close);

use Downcall::{
    Accept as DC_ACCEPT, Connect as DC_CONNECT, CreateListen as DC_CREATE_LISTEN,
    DestroyListen as DC_DESTROY_LISTEN, QpAddRef as ADD, QpRemRef as REM, Reject as DC_REJECT,
    RejectRequest as REJ_REQ,
};
const ABORT: Downcall = Downcall::Disconnect(DisconnectMode::Abortive);
const GRACEFUL: Downcall = Downcall::Disconnect(DisconnectMode::Graceful);

/// The expected outcome of one row.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// A user downcall accepted: new state, downcalls.
    Ok(Machine, &'static [Downcall]),
    /// A user downcall refused: state unchanged, no downcall.
    Err(StateError),
    /// An event delivered: new state, downcalls (issued before the upcall).
    Deliver(Machine, &'static [Downcall]),
    /// An event consumed without upcall: new state.
    Consumed(Machine),
    /// An event dropped (state unchanged).
    Dropped(DropReason, &'static [Downcall]),
}

use Want::{Consumed, Deliver, Dropped, Err, Ok};

const fn inval(s: CmState) -> Want {
    Err(StateError::InvalidState(s))
}
const BUSY: Want = Err(StateError::Busy);
const GONE: Want = Err(StateError::Destroyed);
const UNEXPECTED: Want = Dropped(DropReason::Unexpected, &[]);
const UNEXPECTED_REQ: Want = Dropped(DropReason::Unexpected, &[REJ_REQ]);
const DROP: Want = Dropped(DropReason::Destroying, &[]);
const DROP_REQ: Want = Dropped(DropReason::Destroying, &[REJ_REQ]);

#[rustfmt::skip]
fn table() -> Vec<(Machine, Input, Want)> {
    use CmState::*;
    vec![
        // ------------------------------------------------------------------- IDLE
        (I, LISTEN,         Ok(L, &[DC_CREATE_LISTEN])),          // iw_cm_listen
        (I, CONNECT,        Ok(S, &[ADD, DC_CONNECT])),           // iw_cm_connect
        (I, ACCEPT,         inval(Idle)),                         // -EINVAL
        (I, REJECT,         inval(Idle)),
        (I, DISC_G,         Ok(I, &[])),                          // "accept or connect returned !0"
        (I, DISC_A,         Ok(I, &[])),
        (I, DESTROY,        Ok(D, &[])),                          // IDLE -> DESTROYING
        (I, LISTEN_FAILED,  Ok(I, &[])),
        (I, CONNECT_FAILED, Ok(I, &[])),                          // a reply already moved us
        (I, ACCEPT_FAILED,  Ok(I, &[])),
        (I, EV_REQ,         UNEXPECTED_REQ),
        (I, EV_REP_OK,      UNEXPECTED),
        (I, EV_REP_REJ,     UNEXPECTED),
        (I, EV_REP_REF,     UNEXPECTED),
        (I, EV_REP_TO,      UNEXPECTED),
        (I, EV_REP_RST,     UNEXPECTED),
        (I, EV_EST,         UNEXPECTED),
        (I, EV_DISC,        Consumed(I)),                         // cm_disconnect_handler: no-op
        (I, EV_CLOSE,       UNEXPECTED),                          // kernel BUG()
        // ----------------------------------------------------------------- LISTEN
        (L, LISTEN,         inval(Listen)),
        (L, CONNECT,        inval(Listen)),
        (L, ACCEPT,         inval(Listen)),
        (L, REJECT,         inval(Listen)),
        (L, DISC_G,         inval(Listen)),                       // "Disconnect on a listening endpoint returns -EINVAL"
        (L, DISC_A,         inval(Listen)),
        (L, DESTROY,        Ok(D, &[DC_DESTROY_LISTEN])),         // destroy_cm_id: iw_destroy_listen
        (L, LISTEN_FAILED,  Ok(I, &[])),                          // iw_cm_listen error path
        (L, CONNECT_FAILED, Ok(L, &[])),
        (L, ACCEPT_FAILED,  Ok(L, &[])),
        (L, EV_REQ,         Deliver(L, &[])),                     // cm_conn_req_handler
        (L, EV_REP_OK,      UNEXPECTED),
        (L, EV_REP_REJ,     UNEXPECTED),
        (L, EV_REP_REF,     UNEXPECTED),
        (L, EV_REP_TO,      UNEXPECTED),
        (L, EV_REP_RST,     UNEXPECTED),
        (L, EV_EST,         UNEXPECTED),
        (L, EV_DISC,        Consumed(L)),
        (L, EV_CLOSE,       UNEXPECTED),
        // ---------------------------------------------------- CONN_RECV, no accept
        (R, LISTEN,         inval(ConnRecv)),
        (R, CONNECT,        inval(ConnRecv)),
        (R, ACCEPT,         Ok(RA, &[ADD, DC_ACCEPT])),           // iw_cm_accept
        (R, REJECT,         Ok(I, &[DC_REJECT])),                 // iw_cm_reject: -> IDLE
        (R, DISC_G,         Ok(R, &[])),                          // "disconnect before/without calling accept"
        (R, DISC_A,         Ok(R, &[])),
        (R, DESTROY,        Ok(D, &[DC_REJECT])),                 // destroy_cm_id: iw_reject
        (R, LISTEN_FAILED,  Ok(R, &[])),
        (R, CONNECT_FAILED, Ok(R, &[])),
        (R, ACCEPT_FAILED,  Ok(R, &[])),
        (R, EV_REQ,         UNEXPECTED_REQ),
        (R, EV_REP_OK,      UNEXPECTED),
        (R, EV_REP_REJ,     UNEXPECTED),
        (R, EV_REP_REF,     UNEXPECTED),
        (R, EV_REP_TO,      UNEXPECTED),
        (R, EV_REP_RST,     UNEXPECTED),
        (R, EV_EST,         UNEXPECTED),                          // not accepted
        (R, EV_DISC,        Consumed(R)),
        (R, EV_CLOSE,       Deliver(I, &[])),                     // departure: peer left before accept
        // ---------------------------------------------- CONN_RECV, accept in flight
        (RA, LISTEN,        inval(ConnRecv)),
        (RA, CONNECT,       inval(ConnRecv)),
        (RA, ACCEPT,        BUSY),                                // kernel sleeps on CONNECT_WAIT
        (RA, REJECT,        BUSY),
        (RA, DISC_G,        BUSY),
        (RA, DISC_A,        BUSY),
        (RA, DESTROY,       Ok(D, &[ABORT, REM])),                // departure: abort the accept
        (RA, LISTEN_FAILED, Ok(RA, &[])),
        (RA, CONNECT_FAILED,Ok(RA, &[])),
        (RA, ACCEPT_FAILED, Ok(I, &[REM])),                       // iw_cm_accept error path
        (RA, EV_REQ,        UNEXPECTED_REQ),
        (RA, EV_REP_OK,     UNEXPECTED),
        (RA, EV_REP_REJ,    UNEXPECTED),
        (RA, EV_REP_REF,    UNEXPECTED),
        (RA, EV_REP_TO,     UNEXPECTED),
        (RA, EV_REP_RST,    UNEXPECTED),
        (RA, EV_EST,        Deliver(E, &[])),                     // cm_conn_est_handler
        (RA, EV_DISC,       Consumed(RA)),
        (RA, EV_CLOSE,      Deliver(I, &[REM])),                  // departure: accepted conn failed
        // -------------------------------------------------------------- CONN_SENT
        (S, LISTEN,         inval(ConnSent)),
        (S, CONNECT,        inval(ConnSent)),
        (S, ACCEPT,         inval(ConnSent)),
        (S, REJECT,         inval(ConnSent)),
        (S, DISC_G,         BUSY),                                // kernel sleeps on CONNECT_WAIT
        (S, DISC_A,         BUSY),
        (S, DESTROY,        Ok(D, &[ABORT, REM])),                // departure: abort the connect
        (S, LISTEN_FAILED,  Ok(S, &[])),
        (S, CONNECT_FAILED, Ok(I, &[REM])),                       // iw_cm_connect error path
        (S, ACCEPT_FAILED,  Ok(S, &[])),
        (S, EV_REQ,         UNEXPECTED_REQ),
        (S, EV_REP_OK,      Deliver(E, &[])),                     // cm_conn_rep_handler, status 0
        (S, EV_REP_REJ,     Deliver(I, &[REM])),                  // "REJECTED or RESET"
        (S, EV_REP_REF,     Deliver(I, &[REM])),
        (S, EV_REP_TO,      Deliver(I, &[REM])),
        (S, EV_REP_RST,     Deliver(I, &[REM])),
        (S, EV_EST,         UNEXPECTED),
        (S, EV_DISC,        Consumed(S)),
        (S, EV_CLOSE,       UNEXPECTED),                          // kernel BUG()
        // ------------------------------------------------------------ ESTABLISHED
        (E, LISTEN,         inval(Established)),
        (E, CONNECT,        inval(Established)),
        (E, ACCEPT,         inval(Established)),
        (E, REJECT,         inval(Established)),
        (E, DISC_G,         Ok(C, &[GRACEFUL])),                  // QP to SQD
        (E, DISC_A,         Ok(C, &[ABORT])),                     // QP to ERR
        (E, DESTROY,        Ok(D, &[ABORT, REM])),                // "Abrupt close of the connection"
        (E, LISTEN_FAILED,  Ok(E, &[])),
        (E, CONNECT_FAILED, Ok(E, &[])),
        (E, ACCEPT_FAILED,  Ok(E, &[])),
        (E, EV_REQ,         UNEXPECTED_REQ),
        (E, EV_REP_OK,      UNEXPECTED),
        (E, EV_REP_REJ,     UNEXPECTED),
        (E, EV_REP_REF,     UNEXPECTED),
        (E, EV_REP_TO,      UNEXPECTED),
        (E, EV_REP_RST,     UNEXPECTED),
        (E, EV_EST,         UNEXPECTED),
        (E, EV_DISC,        Consumed(C)),                         // ESTABLISHED -> CLOSING, no upcall
        (E, EV_CLOSE,       Deliver(I, &[REM])),                  // cm_close_handler
        // ---------------------------------------------------------------- CLOSING
        (C, LISTEN,         inval(Closing)),
        (C, CONNECT,        inval(Closing)),
        (C, ACCEPT,         inval(Closing)),
        (C, REJECT,         inval(Closing)),
        (C, DISC_G,         Ok(C, &[])),                          // "remote peer closed first"
        (C, DISC_A,         Ok(C, &[])),
        (C, DESTROY,        Ok(D, &[ABORT, REM])),                // departure: abort, don't wait on the peer
        (C, LISTEN_FAILED,  Ok(C, &[])),
        (C, CONNECT_FAILED, Ok(C, &[])),
        (C, ACCEPT_FAILED,  Ok(C, &[])),
        (C, EV_REQ,         UNEXPECTED_REQ),
        (C, EV_REP_OK,      UNEXPECTED),
        (C, EV_REP_REJ,     UNEXPECTED),
        (C, EV_REP_REF,     UNEXPECTED),
        (C, EV_REP_TO,      UNEXPECTED),
        (C, EV_REP_RST,     UNEXPECTED),
        (C, EV_EST,         UNEXPECTED),
        (C, EV_DISC,        Consumed(C)),
        (C, EV_CLOSE,       Deliver(I, &[REM])),                  // cm_close_handler
        // ------------------------------------------------------------- DESTROYING
        (D, LISTEN,         GONE),
        (D, CONNECT,        GONE),
        (D, ACCEPT,         GONE),
        (D, REJECT,         GONE),
        (D, DISC_G,         GONE),
        (D, DISC_A,         GONE),
        (D, DESTROY,        Ok(D, &[])),                          // idempotent
        (D, LISTEN_FAILED,  Ok(D, &[])),
        (D, CONNECT_FAILED, Ok(D, &[])),
        (D, ACCEPT_FAILED,  Ok(D, &[])),
        (D, EV_REQ,         DROP_REQ),                            // IWCM_F_DROP_EVENTS, request rejected
        (D, EV_REP_OK,      DROP),
        (D, EV_REP_REJ,     DROP),
        (D, EV_REP_REF,     DROP),
        (D, EV_REP_TO,      DROP),
        (D, EV_REP_RST,     DROP),
        (D, EV_EST,         DROP),
        (D, EV_DISC,        DROP),
        (D, EV_CLOSE,       DROP),
    ]
}

fn check(m: Machine, input: Input, want: Want, got: Step) {
    let ctx = format!("{m:?} x {input:?}: want {want:?}, got {got:?}");
    match want {
        Ok(next, dc) => {
            assert!(!input.is_event(), "{ctx}");
            assert_eq!(got.result, Result::Ok(()), "{ctx}");
            assert_eq!(got.next, next, "{ctx}");
            assert_eq!(got.downcalls, dc, "{ctx}");
            assert_eq!(got.upcall, Upcall::None, "{ctx}");
        }
        Err(e) => {
            assert_eq!(got.result, Result::Err(e), "{ctx}");
            assert_eq!(got.next, m, "{ctx}");
            assert!(got.downcalls.is_empty(), "{ctx}");
            assert_eq!(got.upcall, Upcall::None, "{ctx}");
        }
        Deliver(next, dc) => {
            assert!(input.is_event(), "{ctx}");
            assert_eq!(got.result, Result::Ok(()), "{ctx}");
            assert_eq!(got.next, next, "{ctx}");
            assert_eq!(got.downcalls, dc, "{ctx}");
            assert_eq!(got.upcall, Upcall::Deliver, "{ctx}");
        }
        Consumed(next) => {
            assert_eq!(got.result, Result::Ok(()), "{ctx}");
            assert_eq!(got.next, next, "{ctx}");
            assert!(got.downcalls.is_empty(), "{ctx}");
            assert_eq!(got.upcall, Upcall::Consumed, "{ctx}");
        }
        Dropped(reason, dc) => {
            assert_eq!(got.result, Result::Ok(()), "{ctx}");
            assert_eq!(got.next, m, "{ctx}");
            assert_eq!(got.downcalls, dc, "{ctx}");
            assert_eq!(got.upcall, Upcall::Dropped(reason), "{ctx}");
        }
    }
}

#[test]
fn table_covers_every_state_and_input_exactly_once() {
    let rows = table();
    let mut seen = HashSet::new();
    for (m, input, _) in &rows {
        assert!(seen.insert((*m, *input)), "duplicate row {m:?} x {input:?}");
    }
    for m in Machine::ALL {
        for input in Input::ALL {
            assert!(seen.contains(&(m, input)), "missing row {m:?} x {input:?}");
        }
    }
    assert_eq!(rows.len(), Machine::ALL.len() * Input::ALL.len());
    // The enumerations themselves are complete.
    assert_eq!(Machine::ALL.len(), CmState::ALL.len() + 1);
    for s in CmState::ALL {
        assert!(Machine::ALL.iter().any(|m| m.state() == s));
    }
    for st in ConnectStatus::ALL {
        assert!(Input::ALL.contains(&Input::Event(EventKind::ConnectReply(st))));
    }
}

#[test]
fn every_transition_matches_the_table() {
    for (m, input, want) in table() {
        check(m, input, want, m.step(input));
    }
}

#[test]
fn the_machine_is_pure() {
    for m in Machine::ALL {
        for input in Input::ALL {
            assert_eq!(m.step(input), m.step(input));
        }
    }
}

/// Walk every path of up to 4 inputs from the fresh and the child machine: the
/// design.md rules hold on every one.
#[test]
fn rules_hold_on_every_short_path() {
    fn walk(
        start: Machine,
        m: Machine,
        depth: usize,
        trace: &mut Vec<(Input, Step)>,
        paths: &mut usize,
    ) {
        check_path(start, trace);
        *paths += 1;
        if depth == 0 {
            return;
        }
        for input in Input::ALL {
            let step = m.step(input);
            trace.push((input, step));
            walk(start, step.next, depth - 1, trace, paths);
            trace.pop();
        }
    }
    fn check_path(start: Machine, trace: &[(Input, Step)]) {
        let mut qp_refs = 0i32;
        let mut established_delivered = false;
        let mut destroyed = false;
        let mut m = start;
        for (input, step) in trace {
            for d in step.downcalls {
                match d {
                    Downcall::QpAddRef => qp_refs += 1,
                    Downcall::QpRemRef => qp_refs -= 1,
                    _ => {}
                }
            }
            assert!((0..=1).contains(&qp_refs), "QP refs {qp_refs} on {trace:?}");
            assert_eq!(qp_refs == 1, step.next.holds_qp(), "{trace:?}");
            if destroyed {
                // Rule 3: nothing is delivered after destroy.
                assert_ne!(step.upcall, Upcall::Deliver, "{trace:?}");
                assert_eq!(step.next.state(), CmState::Destroying);
            }
            if *input == Input::Destroy {
                destroyed = true;
            }
            // Rule 4: DISCONNECT is never delivered; it only moves ESTABLISHED -> CLOSING.
            if *input == Input::Event(EventKind::Disconnect) {
                assert!(
                    matches!(
                        step.upcall,
                        Upcall::Consumed | Upcall::Dropped(DropReason::Destroying)
                    ),
                    "{trace:?}"
                );
                if m.state() == CmState::Established {
                    assert_eq!(step.next.state(), CmState::Closing);
                } else {
                    assert_eq!(step.next, m);
                }
            }
            if step.upcall == Upcall::Deliver {
                match input {
                    Input::Event(EventKind::Established)
                    | Input::Event(EventKind::ConnectReply(ConnectStatus::Ok)) => {
                        established_delivered = true
                    }
                    Input::Event(EventKind::Close) => {
                        // Rule 4: closing a connection that was set up is delivered
                        // only after its Established / ConnectReply(Ok).
                        if matches!(m.state(), CmState::Established | CmState::Closing) {
                            assert!(established_delivered, "{trace:?}");
                        }
                        established_delivered = false;
                    }
                    _ => {}
                }
            }
            m = step.next;
        }
    }
    let mut paths = 0;
    for start in [Machine::new(), Machine::conn_recv()] {
        walk(start, start, 4, &mut Vec::new(), &mut paths);
    }
    assert!(paths > 100_000, "{paths}");
}
