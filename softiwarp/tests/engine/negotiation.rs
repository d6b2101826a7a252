//! Every MPA negotiation family end to end through smoltcp TCP, two [`Stack`]s (or a
//! stack and a raw TCP peer) on a memory link pair with a virtual clock: revisions, CRC
//! policies, markers per direction, peer-to-peer with each RTR kind, IRD/ORD, private
//! data, rejects, bad keys, refused and silent peers. Each case asserts the agreed settings
//! (and a short data exchange) or the typed errors on both sides.

use crate::support::stack::{links, Flow, Pair, RawHost, Side};
use mpa::negotiate::{CrcPolicy, LocalSettings, NegotiationError, SettingsError};
use mpa::wire::{RtrKind, RtrKinds};
use smoltcp::time::Duration;
use softiwarp::link::MemoryLink;
use softiwarp::transport::mpa_conn::{CallError, MpaError, State};
use softiwarp::transport::stream::StreamEnd;
use softiwarp::transport::{
    ConnError, ConnEvent, ConnId, Established, MpaParams, StackError, TimeoutPhase,
};

const PORT: u16 = 7174;

type MemPair = Pair<Side<MemoryLink>, Side<MemoryLink>>;

fn mem_pair() -> MemPair {
    let (la, lb) = links(1500);
    Pair::new(Side::new(la, 1, |_| {}), Side::new(lb, 2, |_| {}))
}

/// What the responder does with the request.
#[derive(Clone)]
enum Answer {
    Accept { pd: Vec<u8>, ird: u16, ord: u16 },
    Reject(Vec<u8>),
}

fn accept() -> Answer {
    Answer::Accept {
        pd: b"rsp".to_vec(),
        ird: 1,
        ord: 1,
    }
}

struct Outcome {
    p: MemPair,
    a: ConnId,
    ea: StreamEnd,
    /// The responder's connection, if a request reached it.
    b: Option<(ConnId, StreamEnd)>,
    request: Option<mpa::wire::Repr>,
}

impl Outcome {
    fn a_established(&self) -> Established {
        match self.p.a.events_of(self.a).first() {
            Some(ConnEvent::Established(e)) => e.clone(),
            other => panic!("initiator not established: {other:?}"),
        }
    }
    fn b_established(&self) -> Established {
        let (b, _) = self.b.as_ref().expect("no responder connection");
        match self.p.b.events_of(*b).first() {
            Some(ConnEvent::Established(e)) => e.clone(),
            other => panic!("responder not established: {other:?}"),
        }
    }
    fn a_final(&self) -> Option<ConnEvent> {
        self.p.a.final_of(self.a)
    }
    fn b_final(&self) -> Option<ConnEvent> {
        self.b.as_ref().and_then(|(b, _)| self.p.b.final_of(*b))
    }

    /// 50 ULPDUs each way must arrive intact.
    fn exchange(&mut self) {
        let (_, eb) = self.b.clone().expect("no responder connection");
        let ea = self.ea.clone();
        let mut ab = Flow::new(11, self.a_established().mulpdu, 50);
        let mut ba = Flow::new(12, self.b_established().mulpdu, 50);
        let ok = self.p.run_until(Duration::from_secs(10), |_| {
            ab.push(&ea);
            ba.push(&eb);
            ab.pull(&eb);
            ba.pull(&ea);
            ab.done() && ba.done()
        });
        assert!(ok, "exchange: ab {} ba {}", ab.received, ba.received);
    }
}

/// Connects with `ini` settings to a listener with `rsp` settings, answers the request
/// with `answer`, runs until both sides settled.
fn negotiate(ini: LocalSettings, rsp: LocalSettings, answer: Answer) -> Outcome {
    let mut p = mem_pair();
    p.b.stack.listen(PORT, 4, Some(rsp)).unwrap();
    let now = p.now;
    let params = MpaParams {
        private_data: ini.private_data.clone(),
        ird: ini.ird,
        ord: ini.ord,
        settings: Some(ini),
    };
    let (a, ea) = p.a.connect(2, PORT, params, now).unwrap();
    let settled = |p: &mut MemPair| !p.b.requests.is_empty() || !p.a.events_of(a).is_empty();
    assert!(
        p.run_until(Duration::from_secs(5), settled),
        "nothing happened"
    );
    let mut b = None;
    let mut request = None;
    if let Some(r) = p.b.requests.front().cloned() {
        request = Some(r.request.clone());
        match &answer {
            Answer::Accept { pd, ird, ord } => {
                b = Some(p.b.accept_next(pd, *ird, *ord).unwrap().unwrap());
            }
            Answer::Reject(pd) => {
                p.b.requests.pop_front();
                p.b.stack.reject(r.conn, pd).unwrap();
            }
        }
    }
    // Settle: the initiator established or failed, the responder too.
    p.run_until(Duration::from_secs(5), |p| {
        let a_done = !p.a.events_of(a).is_empty();
        let b_done = b
            .as_ref()
            .is_none_or(|(b, _)| !p.b.events_of(*b).is_empty());
        a_done && b_done
    });
    p.run_for(Duration::from_millis(50));
    Outcome {
        p,
        a,
        ea,
        b,
        request,
    }
}

fn rev(rev: u8) -> LocalSettings {
    LocalSettings {
        rev,
        ..LocalSettings::default()
    }
}

#[test]
fn revisions() {
    for (ri, rr, want) in [(2, 2, 2), (1, 1, 1), (2, 1, 1), (1, 2, 1)] {
        let mut o = negotiate(rev(ri), rev(rr), accept());
        let a = o.a_established();
        let b = o.b_established();
        assert_eq!((a.agreed.rev, b.agreed.rev), (want, want), "{ri}/{rr}");
        assert_eq!(a.agreed.enhanced, want == 2, "{ri}/{rr}");
        assert_eq!(o.request.as_ref().unwrap().rev, ri);
        assert_eq!(a.agreed.peer_private_data, b"rsp");
        o.exchange();
    }
}

fn crc(policy: CrcPolicy) -> LocalSettings {
    LocalSettings {
        crc: policy,
        ..LocalSettings::default()
    }
}

#[test]
fn crc_on_and_off_each_side() {
    use CrcPolicy::*;
    for (ci, cr, want) in [
        (IfPeerAsks, IfPeerAsks, false),
        (Wanted, IfPeerAsks, true),
        (IfPeerAsks, Wanted, true),
        (Required, IfPeerAsks, true),
        (Wanted, Wanted, true),
    ] {
        let mut o = negotiate(crc(ci), crc(cr), accept());
        assert_eq!(o.a_established().agreed.crc, want, "{ci:?}/{cr:?}");
        assert_eq!(o.b_established().agreed.crc, want, "{ci:?}/{cr:?}");
        o.exchange();
    }
}

#[test]
fn crc_refused_by_the_responder_is_a_reject() {
    // The responder refuses CRC before any ConnectRequest (as siw_proc_mpareq does).
    let o = negotiate(crc(CrcPolicy::Wanted), crc(CrcPolicy::Refused), accept());
    assert!(o.request.is_none());
    assert_eq!(
        o.a_final(),
        Some(ConnEvent::Failed(ConnError::Rejected {
            private_data: vec![]
        }))
    );
    assert_eq!(o.p.b.stack.stats().startup_failures, 1);
}

#[test]
fn crc_refused_by_the_initiator_terminates() {
    // The responder turns CRC on; the initiator refuses it after the Reply: it sends a
    // Terminate (LLP, Invalid MPA Request/Reply) and aborts; the responder, which had
    // accepted, gets the Terminate.
    let o = negotiate(crc(CrcPolicy::Refused), crc(CrcPolicy::Wanted), accept());
    assert_eq!(
        o.a_final(),
        Some(ConnEvent::Failed(ConnError::Mpa(MpaError::Negotiation(
            NegotiationError::CrcRefused
        ))))
    );
    match o.b_final() {
        Some(ConnEvent::Failed(ConnError::TerminateReceived(cause))) => {
            assert_eq!(
                cause,
                ddp_rdmap::terminate::ErrorCause::Llp(
                    ddp_rdmap::terminate::LlpCode::InvalidRequestReply
                )
            );
        }
        other => panic!("responder: {other:?}"),
    }
    assert_eq!(o.p.a.stack.stats().terminates_sent, 1);
    assert_eq!(o.p.b.stack.stats().terminates_received, 1);
}

fn markers(rx: bool, tx_ok: bool) -> LocalSettings {
    LocalSettings {
        markers_rx: rx,
        markers_tx_ok: tx_ok,
        crc: CrcPolicy::Wanted,
        ..LocalSettings::default()
    }
}

#[test]
fn markers_each_direction() {
    for (mi, mr) in [(true, false), (false, true), (true, true), (false, false)] {
        let mut o = negotiate(markers(mi, true), markers(mr, true), accept());
        let a = o.a_established();
        let b = o.b_established();
        assert_eq!((a.agreed.markers_rx, a.agreed.markers_tx), (mi, mr));
        assert_eq!((b.agreed.markers_rx, b.agreed.markers_tx), (mr, mi));
        // MULPDU shrinks for the side that inserts markers (RFC 5044 4.5).
        assert_eq!(a.mulpdu, mpa::fpdu::mulpdu(1460, mr));
        assert_eq!(b.mulpdu, mpa::fpdu::mulpdu(1460, mi));
        o.exchange();
    }
}

#[test]
fn markers_refused_is_a_reject() {
    let o = negotiate(markers(true, true), markers(false, false), accept());
    assert!(o.request.is_none());
    assert!(matches!(
        o.a_final(),
        Some(ConnEvent::Failed(ConnError::Rejected { .. }))
    ));
}

fn p2p(kinds: RtrKinds) -> LocalSettings {
    LocalSettings {
        p2p: true,
        rtr: kinds,
        ..LocalSettings::default()
    }
}

fn only(kind: RtrKind) -> RtrKinds {
    RtrKinds {
        send: kind == RtrKind::Send,
        write: kind == RtrKind::Write,
        read: kind == RtrKind::Read,
    }
}

#[test]
fn peer_to_peer_with_each_rtr_kind() {
    let all = RtrKinds {
        send: true,
        write: true,
        read: true,
    };
    for kind in [RtrKind::Write, RtrKind::Read, RtrKind::Send] {
        let rsp = LocalSettings {
            rtr: all,
            ..LocalSettings::default()
        };
        let mut o = negotiate(p2p(only(kind)), rsp, accept());
        let a = o.a_established();
        let b = o.b_established();
        assert_eq!(a.agreed.rtr, Some(kind));
        assert_eq!(b.agreed.rtr, Some(kind));
        // A Send or Read RTR takes MSN 1 of its queue (RFC 5041 4.3).
        let (send, read) = (kind == RtrKind::Send, kind == RtrKind::Read);
        assert_eq!(a.initial_msn.send_tx, if send { 2 } else { 1 });
        assert_eq!(b.initial_msn.send_rx, if send { 2 } else { 1 });
        assert_eq!(a.initial_msn.read_tx, if read { 2 } else { 1 });
        assert_eq!(b.initial_msn.read_rx, if read { 2 } else { 1 });
        // The RTR (and the Read RTR's Read Response) are consumed by MPA, never delivered.
        o.exchange();
        assert_eq!(o.p.a.stack.stats().ulpdus_rx, 50, "{kind:?}");
        assert_eq!(o.p.b.stack.stats().ulpdus_rx, 50, "{kind:?}");
    }
}

#[test]
fn peer_to_peer_without_a_common_rtr_is_a_reject() {
    let o = negotiate(p2p(only(RtrKind::Send)), LocalSettings::default(), accept());
    assert!(o.request.is_none());
    assert!(matches!(
        o.a_final(),
        Some(ConnEvent::Failed(ConnError::Rejected { .. }))
    ));
}

fn ird_ord(ird: u16, ord: u16, relaxed: bool) -> LocalSettings {
    LocalSettings {
        ird,
        ord,
        relaxed_ird_ord: relaxed,
        ..LocalSettings::default()
    }
}

#[test]
fn ird_ord_lowered_when_relaxed() {
    let o = negotiate(
        ird_ord(16, 8, true),
        ird_ord(1, 1, true),
        Answer::Accept {
            pd: vec![],
            ird: 4,
            ord: 2,
        },
    );
    let r = o.request.as_ref().unwrap().rev2.unwrap();
    assert_eq!((r.ird, r.ord), (16, 8));
    let a = o.a_established();
    let b = o.b_established();
    assert_eq!(
        a.agreed.ord, 4,
        "the initiator's ORD drops to the responder's IRD"
    );
    assert_eq!(b.agreed.ird, 4);
    assert!(b.agreed.ord <= 16);
}

#[test]
fn ird_ord_mismatch_when_strict() {
    let o = negotiate(
        ird_ord(16, 8, true),
        ird_ord(1, 1, false),
        Answer::Accept {
            pd: vec![],
            ird: 4,
            ord: 2,
        },
    );
    assert!(matches!(
        o.b_final(),
        Some(ConnEvent::Failed(ConnError::Mpa(MpaError::Negotiation(
            NegotiationError::InsufficientIrd { .. }
        ))))
    ));
    assert!(matches!(
        o.a_final(),
        Some(ConnEvent::Failed(ConnError::Rejected { .. }))
    ));
}

#[test]
fn private_data_both_ways_and_reject_with_private_data() {
    let ini = LocalSettings {
        private_data: vec![0xab; 256],
        ..LocalSettings::default()
    };
    let o = negotiate(
        ini.clone(),
        LocalSettings::default(),
        Answer::Accept {
            pd: vec![0xcd; 508],
            ird: 1,
            ord: 1,
        },
    );
    assert_eq!(o.request.as_ref().unwrap().private_data, vec![0xab; 256]);
    assert_eq!(o.a_established().agreed.peer_private_data, vec![0xcd; 508]);
    assert_eq!(o.b_established().agreed.peer_private_data, vec![0xab; 256]);

    let o = negotiate(
        ini,
        LocalSettings::default(),
        Answer::Reject(b"go away".to_vec()),
    );
    assert_eq!(
        o.a_final(),
        Some(ConnEvent::Failed(ConnError::Rejected {
            private_data: b"go away".to_vec()
        }))
    );
    // A rejected request produces no further event on the responder.
    assert!(o.p.b.log.is_empty());
}

#[test]
fn private_data_too_long() {
    let mut p = mem_pair();
    p.b.stack.listen(PORT, 4, None).unwrap();
    let now = p.now;
    let long = MpaParams {
        private_data: vec![0; 509],
        ird: 1,
        ord: 1,
        settings: None,
    };
    match p.a.connect(2, PORT, long, now) {
        Err(StackError::Settings(SettingsError::PrivateDataTooLong {
            len: 509,
            limit: 508,
        })) => {}
        other => panic!("{:?}", other.map(|(c, _)| c)),
    }
    // Rev 1 has no IRD/ORD word: 512 bytes fit.
    let rev1 = MpaParams {
        private_data: vec![0; 512],
        ird: 1,
        ord: 1,
        settings: Some(rev(1)),
    };
    let (a, _ea) = p.a.connect(2, PORT, rev1, now).unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| !p.b.requests.is_empty()));
    let r = p.b.requests.front().unwrap().clone();
    assert_eq!(r.request.private_data.len(), 512);
    // The accept's private data is checked too; nothing changes on error.
    match p.b.stack.accept(
        r.conn,
        &[0; 513],
        1,
        1,
        Box::new(softiwarp::transport::stream::pair(Default::default(), Default::default()).0),
    ) {
        Err(StackError::Mpa(CallError::Settings(SettingsError::PrivateDataTooLong { .. }))) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(p.b.stack.mpa_state(r.conn), Some(State::AwaitingDecision));
    let (_b, _eb) = p.b.accept_next(&[1; 100], 1, 1).unwrap().unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| !p.a.events_of(a).is_empty()));
    assert!(matches!(
        p.a.events_of(a).first(),
        Some(ConnEvent::Established(_))
    ));
}

#[test]
fn bad_key_from_a_raw_tcp_client() {
    let (la, lb) = links(1500);
    let mut p = Pair::new(RawHost::new(la, 1), Side::new(lb, 2, |_| {}));
    p.b.stack.listen(PORT, 4, None).unwrap();
    p.a.connect(2, PORT);
    assert!(p.run_until(Duration::from_secs(5), |p| p.a.socket().may_send()));
    p.a.socket()
        .send_slice(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n")
        .unwrap();
    // The responder refuses the garbage and resets the connection, silently.
    assert!(p.run_until(Duration::from_secs(5), |p| {
        p.a.socket().state() == smoltcp::socket::tcp::State::Closed
    }));
    assert!(p.b.requests.is_empty());
    assert!(p.b.log.is_empty());
    assert_eq!(p.b.stack.stats().startup_failures, 1);
    p.run_for(Duration::from_millis(100));
    assert_eq!(p.b.stack.connection_count(), 0);
}

#[test]
fn silent_responder_times_out() {
    let (la, lb) = links(1500);
    let mut p = Pair::new(Side::new(la, 1, |_| {}), RawHost::new(lb, 2));
    p.b.listen(PORT);
    let now = p.now;
    let (a, _) = p.a.connect(2, PORT, MpaParams::default(), now).unwrap();
    assert!(p.run_until(Duration::from_secs(30), |p| p.a.final_of(a).is_some()));
    assert_eq!(
        p.a.final_of(a),
        Some(ConnEvent::Failed(ConnError::TimedOut(
            TimeoutPhase::MpaReply
        )))
    );
    // The MPA startup timeout (10 s) counts from TCP establishment.
    let took = p.now - now;
    assert!(
        took >= Duration::from_secs(10) && took < Duration::from_secs(11),
        "{took}"
    );
    // What the silent peer got: the Request, then a RST.
    let got = p.b.drain();
    assert!(got.starts_with(b"MPA ID Req Frame"), "{got:?}");
}

#[test]
fn silent_initiator_is_dropped() {
    let (la, lb) = links(1500);
    let mut p = Pair::new(RawHost::new(la, 1), Side::new(lb, 2, |_| {}));
    p.b.stack.listen(PORT, 1, None).unwrap();
    p.a.connect(2, PORT);
    assert!(p.run_until(Duration::from_secs(30), |p| {
        p.a.socket().state() == smoltcp::socket::tcp::State::Closed
    }));
    assert_eq!(p.b.stack.stats().startup_failures, 1);
    assert!(p.b.log.is_empty() && p.b.requests.is_empty());
}

#[test]
fn refused_and_unreachable() {
    let mut p = mem_pair();
    let now = p.now;
    // Nothing listens on the port: RST.
    let (a, _) = p.a.connect(2, PORT, MpaParams::default(), now).unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| p.a.final_of(a).is_some()));
    assert_eq!(p.a.final_of(a), Some(ConnEvent::Failed(ConnError::Refused)));
    assert!(p.now - now < Duration::from_millis(100));

    // No such host: nobody answers ARP.
    let (la, lb) = links(1500);
    let mut p = Pair::new(
        Side::new(la, 1, |c| c.connect_timeout_us = 3_000_000),
        Side::new(lb, 2, |_| {}),
    );
    let now = p.now;
    let (a, _) = p.a.connect(9, PORT, MpaParams::default(), now).unwrap();
    assert!(p.run_until(Duration::from_secs(10), |p| p.a.final_of(a).is_some()));
    assert_eq!(
        p.a.final_of(a),
        Some(ConnEvent::Failed(ConnError::TimedOut(
            TimeoutPhase::TcpConnect
        )))
    );
    let took = p.now - now;
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_millis(3100),
        "{took}"
    );
}

/// siw's default MPA Request (rping.pcap frame 6) with its Rev octet replaced.
fn request_of_rev(rev: u8) -> Vec<u8> {
    let mut req = b"MPA ID Req Frame".to_vec();
    req.extend_from_slice(&[0x10, rev, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01]);
    req
}

/// A raw TCP client sends an MPA Request of Rev 3: it gets the reject Reply with the
/// responder's Rev 2 (the Reply key, flags 0x20, Rev 2, PD_Length 0) and then a FIN
/// (not a reset); no ConnectRequest reaches the application. The listener then serves
/// a valid Rev 2 Request from the same client.
#[test]
fn revision_3_request_gets_a_reject_reply_then_fin() {
    let (la, lb) = links(1500);
    let mut p = Pair::new(RawHost::new(la, 1), Side::new(lb, 2, |_| {}));
    p.b.stack.listen(PORT, 4, None).unwrap();
    p.a.connect(2, PORT);
    assert!(p.run_until(Duration::from_secs(5), |p| p.a.socket().may_send()));
    p.a.socket().send_slice(&request_of_rev(3)).unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| {
        use smoltcp::socket::tcp::State as S;
        matches!(p.a.socket().state(), S::CloseWait | S::Closed)
    }));
    assert_eq!(
        p.a.socket().state(),
        smoltcp::socket::tcp::State::CloseWait,
        "FIN, not RST"
    );
    let mut golden = b"MPA ID Rep Frame".to_vec();
    golden.extend_from_slice(&[0x20, 0x02, 0x00, 0x00]);
    assert_eq!(p.a.drain(), golden);
    assert!(p.b.requests.is_empty() && p.b.log.is_empty());
    assert_eq!(p.b.stack.stats().startup_failures, 1);
    p.a.socket().close();
    assert!(
        p.run_until(Duration::from_secs(30), |p| p.b.stack.connection_count()
            == 0)
    );

    // The same client, a new connection with a valid Request: served.
    p.a.socket().abort();
    p.a.host
        .connect_to(crate::support::stack::addr(2), PORT, 40_001);
    assert!(p.run_until(Duration::from_secs(5), |p| p.a.socket().may_send()));
    p.a.socket().send_slice(&request_of_rev(2)).unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| !p.b.requests.is_empty()));
    let (_b, _eb) = p.b.accept_next(b"", 1, 1).unwrap().unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| p.a.socket().can_recv()));
    let reply = p.a.drain();
    assert!(reply.starts_with(b"MPA ID Rep Frame"), "{reply:?}");
    assert_eq!(reply[16] & 0x20, 0, "accepted");
}

/// `LocalSettings::chelsio()` (iw_cxgb4's module defaults) on both sides: revision 2,
/// CRC on, no Markers, peer-to-peer with a zero-length Read RTR (whose Read Response MPA
/// consumes: Read MSN 2 next), IRD = ORD = 1, and data flows. Against Linux siw's
/// defaults as responder (which accepts Write and Read RTRs and CRC when asked) the same;
/// a siw-default initiator (no P2P) is accepted in client-server mode.
#[test]
fn chelsio_profile_against_itself_and_siw_defaults() {
    let cases = [
        (LocalSettings::chelsio(), LocalSettings::chelsio(), true),
        (LocalSettings::chelsio(), LocalSettings::default(), true),
        (LocalSettings::default(), LocalSettings::chelsio(), false),
    ];
    for (i, (ini, rsp, p2p)) in cases.into_iter().enumerate() {
        let mut o = negotiate(ini, rsp, accept());
        let a = o.a_established();
        let b = o.b_established();
        for (side, e) in [("initiator", &a), ("responder", &b)] {
            assert_eq!(e.agreed.rev, 2, "case {i} {side}");
            assert!(e.agreed.crc, "case {i} {side}: CRC");
            assert!(
                !e.agreed.markers_rx && !e.agreed.markers_tx,
                "case {i} {side}"
            );
            assert_eq!(
                e.agreed.rtr,
                p2p.then_some(RtrKind::Read),
                "case {i} {side}: RTR"
            );
        }
        assert_eq!(a.initial_msn.read_tx, if p2p { 2 } else { 1 }, "case {i}");
        assert_eq!(b.initial_msn.read_rx, if p2p { 2 } else { 1 }, "case {i}");
        o.exchange();
        assert_eq!(o.p.a.stack.stats().ulpdus_rx, 50, "case {i}");
    }
}
