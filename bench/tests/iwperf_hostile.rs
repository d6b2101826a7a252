//! Root-only: a hostile peer with ordinary kernel sockets against a running `iwperf
//! server` over TAP, as a user would see it (issue 15). The server's smoltcp stack owns
//! 10.234.0.1 on namespace A's TAP; the attacker is the kernel of namespace B with
//! 10.234.0.3 on B's bridge, beside the legitimate `iwperf client` (10.234.0.2, smoltcp
//! on B's TAP). Each case: the attack, the exact answer on the attacker's socket, then a
//! legitimate verified run against the same server process (it kept serving).

mod iwperf_support;

use std::net::SocketAddrV4;
use std::time::Duration;

use iwperf_support::attacker::{in_netns, request_bytes, send_params, Closed, MpaPeer, PORT};
use iwperf_support::*;
use mpa::wire::{flags, Limits, Repr, REPLY_KEY};
use netlab::{leftover_namespaces, Side, Topology};

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

/// The 60-byte request for 1 GiB messages on 65,535 QPs, from a kernel socket,
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
