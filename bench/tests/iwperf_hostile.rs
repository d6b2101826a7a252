//! Root-only: a hostile peer with ordinary kernel sockets against a running `iwperf
//! server` over TAP, as a user would see it. The server's smoltcp stack owns
//! 10.234.0.1 on namespace A's TAP; the attacker is the kernel of namespace B with
//! 10.234.0.3 on B's bridge, beside the legitimate `iwperf client` (10.234.0.2, smoltcp
//! on B's TAP). Each case: the attack, the exact answer on the attacker's socket, then a
//! legitimate verified run against the same server process (it kept serving).

mod iwperf_support;

use std::net::SocketAddrV4;
use std::time::Duration;

use std::sync::mpsc;

use bench::iwperf::wire::AcceptInfo;
use ddp_rdmap::terminate::{LlpCode, RdmapProtectionCode};
use ddp_rdmap::{Body, ErrorCause, Ulpdu};
use iwperf_support::attacker::{
    in_netns, request_bytes, send_invalidate_ulpdu, send_params, sniff_accept, terminate_ulpdu,
    write_params, write_ulpdu, Closed, MpaPeer, PORT,
};
use iwperf_support::*;
use mpa::deframer::CrcStatus;
use mpa::wire::{flags, Limits, Repr, REPLY_KEY};
use netlab::{leftover_namespaces, Peer, PeerOutput, Side, Topology};

/// A topology with the attacker's kernel address (10.234.0.3 on B's bridge) and a
/// running `iwperf server` (with `extra` arguments) in A; returns them and the server's
/// address.
fn setup(extra: &[&str]) -> (Topology, netlab::Peer, SocketAddrV4) {
    let topo = Topology::create(1500).expect("topology");
    topo.add_kernel_address(Side::B, 3)
        .expect("attacker address");
    let mut args = vec!["--json", "--timeout", "60"];
    args.extend_from_slice(extra);
    let server = start_server(&topo, &iwperf(), &args);
    let addr = SocketAddrV4::new(topo.a().ip, PORT);
    (topo, server, addr)
}

/// An MPA Request of revision 3 (RFC 5044 section 7.1.1: the receiver MUST check Rev):
/// the reject Reply with our revision and no private data (key, R, Rev 2, PD_Length 0:
/// `mpa::negotiate::unsupported_revision_reply`), then a FIN; the server then serves a
/// legitimate verified run.
#[test]
fn revision_3_request_gets_the_reject_reply_then_fin_and_the_server_serves_on() {
    if skip_unless_root(
        "revision_3_request_gets_the_reject_reply_then_fin_and_the_server_serves_on",
    ) {
        return;
    }
    let (topo, server, addr) = setup(&[]);
    let names = topo.namespaces();
    let (reply, end, rest) = in_netns(&topo.pair().b, 1, move |_| {
        let mut p = MpaPeer::connect(addr).expect("connect");
        let mut req = request_bytes(&send_params(1, 0).encode());
        mpa::wire::Packet::new_unchecked(&mut req[..]).set_rev(3);
        p.send_raw(&req);
        let reply = p.read_reply_bytes(Duration::from_secs(10));
        let (end, rest) = p.wait_closed(Duration::from_secs(10));
        (reply, end, rest)
    })
    .remove(0);
    let mut want = REPLY_KEY.to_vec();
    want.extend_from_slice(&[flags::REJECT, 2, 0, 0]);
    assert_eq!(reply, want, "the reject Reply");
    assert_eq!(
        (end, rest),
        (Closed::Fin, Vec::new()),
        "then a FIN, nothing else"
    );
    legit_run(&topo, &iwperf(), server, 200, Duration::from_secs(60));
    drop(topo);
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
}

/// A 60-byte request for 1 GiB messages on 65,535 QPs, from a kernel socket,
/// and a real `iwperf client` asking for messages over the limit: each gets the Reject
/// with the reason in its private data (the client prints it), the server logs a line
/// naming it, allocates nothing and keeps listening: a legitimate run then passes.
#[test]
fn requests_beyond_the_limits_get_the_reason_in_the_reject_and_the_server_serves_on() {
    if skip_unless_root(
        "requests_beyond_the_limits_get_the_reason_in_the_reject_and_the_server_serves_on",
    ) {
        return;
    }
    let (topo, server, addr) = setup(&[]);
    let names = topo.namespaces();
    // Kernel socket: size 1 GiB, 65,535 QPs.
    let (reply, end) = in_netns(&topo.pair().b, 1, move |_| {
        let mut p = MpaPeer::connect(addr).expect("connect");
        let mut params = send_params(65535, 0);
        params.size = 1 << 30;
        let reply = p.handshake(&params.encode());
        let (end, _) = p.wait_closed(Duration::from_secs(10));
        (reply, end)
    })
    .remove(0);
    let reason = b"iwperf: message size 1073741824 exceeds the server's limit of 67108864 (iwperf server --max-size)";
    assert!(reply.reject, "{reply:?}");
    assert!(reply.crc && reply.enhanced && reply.rev == 2, "{reply:?}");
    assert_eq!(reply.private_data, reason.to_vec(), "{reply:?}");
    assert_eq!(end, Closed::Fin, "the rejected connection is closed");
    // The wire bytes of that Reply, re-emitted, parse back the same (PD_Length covers
    // the IRD/ORD word and the reason).
    let bytes = reply.to_bytes().expect("emit");
    assert_eq!(bytes.len(), 20 + 4 + reason.len());
    assert_eq!(
        Repr::parse_bytes(&bytes, &Limits::default())
            .expect("parse")
            .0,
        reply
    );

    // A real client asking for 64 MiB + 1 byte messages (one slot: what it allocates
    // itself stays small).
    let bin = iwperf();
    let client = start_client(
        &topo,
        &bin,
        &[
            "--op",
            "write",
            "--size",
            "67108865",
            "--tx-depth",
            "1",
            "--iters",
            "1",
        ],
    )
    .wait(Duration::from_secs(60))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(client.status.code(), Some(3), "{client:?}");
    assert!(
        client.stderr.contains("RDMA_CM_EVENT_REJECTED")
            && client.stderr.contains(
                "iwperf: message size 67108865 exceeds the server's limit of 67108864 (iwperf server --max-size)"
            ),
        "{}",
        client.stderr
    );
    let (_, _, sout) = legit_run(&topo, &bin, server, 200, Duration::from_secs(60));
    for reason in [
        "request rejected: message size 1073741824 exceeds the server's limit of 67108864 (iwperf server --max-size)",
        "request rejected: message size 67108865 exceeds the server's limit of 67108864 (iwperf server --max-size)",
    ] {
        assert!(sout.stderr.contains(reason), "{}", sout.stderr);
    }
    drop(topo);
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
}

/// What the attacker saw after its crafted FPDU: the server's next ULPDU (with its
/// CRC status), then how the connection ended and any bytes after the ULPDU.
type Answer = (Result<(Vec<u8>, CrcStatus), Closed>, Closed, Vec<u8>);

/// An attacker joins the legitimate client's test as connection 1 of 2 (a kernel
/// socket with iwperf's Request: Write, unverified) and makes its connection fully
/// operational with a valid RDMA Write into its own buffer; then `attack` runs on its
/// connection, handed the Reply's [`AcceptInfo`] of the legitimate connection 0 that
/// the attacker sniffed on B's bridge (`None` when `sniff` is false). Meanwhile the
/// legitimate `iwperf client --qps 2 --indices 0 --op write --verify` runs for 4 s.
/// Returns the attacker's result and both peers' outputs (the server's run ends with
/// connection 1's failure, so neither is checked here).
fn join_and_attack<T: Send + 'static>(
    sniff: bool,
    attack: impl FnOnce(&mut MpaPeer, Option<AcceptInfo>) -> T + Send + 'static,
) -> (T, PeerOutput, PeerOutput, Vec<String>) {
    let (topo, server, addr) = setup(&[]);
    let names = topo.namespaces();
    let (joined_tx, joined_rx) = mpsc::channel();
    let (legit_tx, legit_rx) = mpsc::channel::<Option<AcceptInfo>>();
    let attacker = topo.pair().b.spawn(move || {
        let mut p = MpaPeer::connect(addr).expect("connect");
        let reply = p.handshake(&write_params(2, 1).encode());
        assert!(!reply.reject, "the server accepts connection 1: {reply:?}");
        let own = AcceptInfo::decode(&reply.private_data).expect("iwperf's accept info");
        // The first FPDU (RFC 6581: the initiator's, after which both sides are in
        // full operation): a valid Write into the attacker's own buffer.
        p.send_ulpdu(&write_ulpdu(own.mr.rkey, own.mr.iova, &[0x5a; 8]), false);
        joined_tx.send(()).expect("main thread");
        let legit = legit_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the legitimate client connected");
        attack(&mut p, legit)
    });
    joined_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the attacker joined");
    let sniffer = sniff.then(|| {
        let (h, open) = sniff_accept(&topo.pair().b, topo.b().ip, Duration::from_secs(30));
        open.recv_timeout(Duration::from_secs(10))
            .expect("sniffer open");
        h
    });
    let mut client = start_client(
        &topo,
        &iwperf(),
        &[
            "--progress",
            "--qps",
            "2",
            "--indices",
            "0",
            "--op",
            "write",
            "--size",
            "4096",
            "--tx-depth",
            "16",
            "--duration",
            "4",
            "--verify",
            "--json",
        ],
    );
    let legit = sniffer.map(|h| {
        h.join()
            .expect("sniffer thread")
            .expect("enter namespace B")
            .expect("the legitimate connection's Reply was seen")
    });
    // The attack comes once the test runs (both connections in; the client reports
    // its first second), so the server does not just drop connection 1 and wait for
    // another (`CmSide::accept_all`).
    client
        .wait_for_line(|l| l.starts_with("PROGRESS"), Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    legit_tx.send(legit).expect("attacker thread");
    let result = attacker
        .join()
        .expect("attacker thread")
        .expect("enter namespace B");
    let client = wait_peer(client);
    let server = wait_peer(server);
    drop(topo);
    (result, client, server, names.to_vec())
}

fn wait_peer(p: Peer) -> PeerOutput {
    p.wait(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The legitimate client of [`join_and_attack`] completed and verified its one
/// connection; the server verified it too, and reports connection 1's failure (exit
/// status 3) with `reason` in its error; no namespace is left.
fn assert_legit_unharmed(client: &PeerOutput, server: &PeerOutput, reason: &str, names: &[String]) {
    let (c, s) = (json(client), json(server));
    assert_eq!(c["exit_code"], 0, "{c}");
    assert_eq!(c["connections"], 1, "{c}");
    assert_eq!(c["bandwidth"][0]["verify"], "passed", "{c}");
    assert_eq!(c["bandwidth"][0]["partial"], false, "{c}");
    assert_eq!(s["connections"], 2, "{s}");
    assert_eq!(s["bandwidth"]["verify"], "passed", "{s}");
    assert_eq!(s["bandwidth"]["mismatches"], 0, "{s}");
    assert!(s["bandwidth"]["checked"].as_u64() > Some(0), "{s}");
    assert_eq!(s["exit_code"], 3, "{s}");
    let err = s["error"].as_str().unwrap_or_default();
    assert!(
        err.starts_with("connection: connection 1 of the test failed") && err.contains(reason),
        "{s}"
    );
    assert!(
        server.stderr.contains("connection 1 failed") && server.stderr.contains("the others go on"),
        "{}",
        server.stderr
    );
    assert_eq!(leftover_namespaces(names), Vec::<String>::new());
}

/// A Send with Invalidate naming the STag of the server's buffer for the legitimate
/// client's connection (sniffed from its MPA Reply on B's bridge), sent by an attacker
/// that joined the same test: the Terminate RDMAP / Remote Protection / 0x09 "STag
/// cannot be invalidated" (RFC 5040 section 4.8; siw's `RDMAP_ECODE_CANNOT_INVALIDATE`)
/// with the offending DDP header copied, exactly, then a reset; the MR stays
/// valid: the legitimate client keeps writing into it and both sides verify the data.
#[test]
fn send_with_invalidate_of_another_connections_mr_gets_the_terminate_and_the_mr_stays_valid() {
    if skip_unless_root(
        "send_with_invalidate_of_another_connections_mr_gets_the_terminate_and_the_mr_stays_valid",
    ) {
        return;
    }
    let ((swi, legit, (t, end, rest)), client, server, names) =
        join_and_attack(true, |p, legit| {
            let legit = legit.expect("sniffed");
            let swi = send_invalidate_ulpdu(legit.mr.rkey, 1, b"hostile!");
            p.send_ulpdu(&swi, false);
            let t = p.next_ulpdu(Duration::from_secs(10));
            let (end, rest) = p.wait_closed(Duration::from_secs(10));
            let answer: Answer = (t, end, rest);
            (swi, legit, answer)
        });
    println!("sniffed the legitimate connection's buffer: {legit:?}");
    let (t, crc) = t.unwrap_or_else(|e| panic!("no Terminate, the connection ended: {e:?}"));
    assert!(matches!(crc, CrcStatus::Good(_)), "{crc:?}");
    let cause = ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::StagCannotBeInvalidated);
    let parsed = Ulpdu::parse(&t).expect("a valid ULPDU");
    let Body::Terminate(repr) = parsed.body else {
        panic!("not a Terminate: {parsed:?}");
    };
    assert_eq!(repr.cause, cause, "{repr:?}");
    assert_eq!((t[18] >> 4, t[18] & 0xf, t[19]), (0, 1, 0x09));
    assert_eq!(
        t,
        terminate_ulpdu(cause, Some(&swi)),
        "exact Terminate bytes"
    );
    // After its Terminate the server aborts the stream (a reset, at most 1 s later;
    // docs/ARCHITECTURE.md, Hostile peers).
    assert_eq!(
        end,
        Closed::Reset,
        "the connection is reset after the Terminate"
    );
    assert!(rest.is_empty(), "{rest:02x?}");
    assert_legit_unharmed(
        &client,
        &server,
        "work completion IBV_WC_REM_INV_REQ_ERR on QP 1 (Recv, vendor_err 0x109)",
        &names,
    );
}

/// A bad MPA CRC after a valid exchange (the attacker's second FPDU, its first was a
/// valid Write): the Terminate LLP (2) / MPA (0) / 0x02 "CRC error" (RFC 5044 section
/// 8; siw's `LLP_ECODE_RECEIVED_CRC`), exactly, then a reset; the legitimate
/// connection of the same test completes and verifies.
#[test]
fn a_bad_crc_gets_the_llp_terminate_and_the_other_connection_completes() {
    if skip_unless_root("a_bad_crc_gets_the_llp_terminate_and_the_other_connection_completes") {
        return;
    }
    let ((t, end, rest), client, server, names) = join_and_attack(false, |p, _| {
        p.send_ulpdu(&send_invalidate_ulpdu(0, 1, b"bad crc!"), true);
        let t = p.next_ulpdu(Duration::from_secs(10));
        let (end, rest) = p.wait_closed(Duration::from_secs(10));
        let answer: Answer = (t, end, rest);
        answer
    });
    let (t, crc) = t.unwrap_or_else(|e| panic!("no Terminate, the connection ended: {e:?}"));
    assert!(matches!(crc, CrcStatus::Good(_)), "{crc:?}");
    let cause = ErrorCause::Llp(LlpCode::CrcError);
    // 4147 00000000 00000002 00000001 00000000 2002 0000
    let golden: [u8; 22] = [
        0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0x20, 0x02, 0, 0,
    ];
    assert_eq!(t, golden, "exact Terminate bytes");
    assert_eq!(t, terminate_ulpdu(cause, None));
    // After its Terminate the server aborts the stream (a reset, at most 1 s later;
    // docs/ARCHITECTURE.md, Hostile peers).
    assert_eq!(
        end,
        Closed::Reset,
        "the connection is reset after the Terminate"
    );
    assert!(rest.is_empty(), "{rest:02x?}");
    assert_legit_unharmed(&client, &server, "flushed: the connection ended", &names);
}

/// A peer that sends a valid Request for connection 0 of a 2-connection test, takes the
/// accepting Reply and resets the connection: the server drops it (a warning naming it)
/// and keeps waiting, and the legitimate client's 2-connection test then runs, both
/// connections verified. (Before, the dead connection kept index 0, so the client's own
/// was refused as busy, or the server's test ended with a failed accept or "a
/// connection failed before it was established", and the server exited: one Request
/// and a reset stopped an `iwperf server`.)
#[test]
fn a_request_then_a_reset_is_dropped_and_the_server_serves_on() {
    if skip_unless_root("a_request_then_a_reset_is_dropped_and_the_server_serves_on") {
        return;
    }
    let (topo, server, addr) = setup(&[]);
    let names = topo.namespaces();
    let reply = in_netns(&topo.pair().b, 1, move |_| {
        let mut p = MpaPeer::connect(addr).expect("connect");
        let reply = p.handshake(&write_params(2, 0).encode());
        p.reset();
        reply
    })
    .remove(0);
    assert!(!reply.reject, "accepted: {reply:?}");
    let (_, _, sout) = legit_run(&topo, &iwperf(), server, 200, Duration::from_secs(60));
    assert!(
        sout.stderr.contains(
            "connection 0 went away before the test started (RDMA_CM_EVENT_DISCONNECTED, status 0): dropped, waiting for another"
        ) || sout.stderr.contains("accept failed: connection dropped, waiting for another"),
        "{}",
        sout.stderr
    );
    drop(topo);
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());
}
