//! The soft device through the RDMA CM, one connected pair at a time over a memory link
//! (no root): address resolution by ARP, a connection with an RDMA Write and a Send
//! whose bytes are checked, and device removal (link cut, link down, `remove_device`)
//! delivering exactly one `DeviceRemoval` and flushing every posted WR (design.md
//! section 5, rdma-cm rules 3 and 4).

use crate::support::*;
use rdma_cm::{CmId, ConnParam, EventChannel, EventKind};
use softiwarp::cm::rdmacm::SoftDevice;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;
use testkit::{eventually, Watchdog};
use verbs::{AccessFlags, RecvWr, SendFlags, SendWr, Stag, WcStatus};

const WAIT: Duration = Duration::from_secs(10);
const PORT: u16 = 7471;

fn hosts(sub: u8) -> Hosts {
    Hosts::new("p", 61, sub)
}

fn expect(ch: &EventChannel<SoftDevice>, kind: EventKind) -> rdma_cm::ChannelEvent<SoftDevice> {
    let ev = ch.get_event_timeout(WAIT).expect("an event");
    assert_eq!(ev.kind, kind, "status {}", ev.status);
    ev
}

/// No further event on `ch` (after the CMs' queues drained and a pause).
fn no_more_events(h: &Hosts) {
    h.client.flush().unwrap();
    h.server.flush().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for ch in [&h.cch, &h.sch] {
        if let Some(ev) = ch.try_get_event() {
            panic!("unexpected {} on id #{}", ev.kind, ev.id().serial());
        }
    }
}

fn param(private_data: Vec<u8>) -> ConnParam {
    ConnParam {
        private_data,
        responder_resources: 2,
        initiator_depth: 2,
        ..ConnParam::default()
    }
}

/// A connected pair of ids with their verbs objects; the server's MR address and rkey
/// travelled in the accept's private data.
struct Connected {
    id: CmId<SoftDevice>,
    conn: CmId<SoftDevice>,
    listener: CmId<SoftDevice>,
    cv: Verbs,
    sv: Verbs,
}

fn connect(h: &Hosts, server_recvs: usize) -> Connected {
    let server: SocketAddr = (pair_ip(61, sub_of(h), 2), PORT).into();
    let listener = h.server.create_id_with_channel(&h.sch);
    listener.bind_addr(server).unwrap();
    listener.listen(4).unwrap();
    let id = h.client.create_id_with_channel(&h.cch);
    id.resolve_addr(None, server, WAIT).unwrap();
    expect(&h.cch, EventKind::AddrResolved).ack();
    assert_eq!(id.next_hop(), Some(pair_ip(61, sub_of(h), 2)));
    id.resolve_route(WAIT).unwrap();
    expect(&h.cch, EventKind::RouteResolved).ack();
    let cv = Verbs::on(&id).unwrap();
    assert!(std::sync::Arc::ptr_eq(
        id.device().unwrap().device(),
        &h.pair.a
    ));
    id.connect(&param(b"hello".to_vec())).unwrap();
    let mut req = expect(&h.sch, EventKind::ConnectRequest);
    assert_eq!(req.private_data, b"hello");
    let conn = req.take_new_id().unwrap();
    req.ack();
    // id->verbs of the new id: the device the request came in on.
    assert!(std::sync::Arc::ptr_eq(
        conn.device().unwrap().device(),
        &h.pair.b
    ));
    let mut sv = Verbs::on(&conn).unwrap();
    conn.accept(&param(b"welcome".to_vec())).unwrap();
    sv.post_recvs(server_recvs).unwrap();
    let est = expect(&h.cch, EventKind::Established);
    assert_eq!(est.private_data, b"welcome");
    est.ack();
    expect(&h.sch, EventKind::Established).ack();
    Connected {
        id,
        conn,
        listener,
        cv,
        sv,
    }
}

fn sub_of(h: &Hosts) -> u8 {
    h.pair.a.address().octets()[2]
}

#[test]
fn write_and_send_through_the_rdma_cm_with_the_bytes_checked() {
    let _w = Watchdog::arm("write_and_send", Duration::from_secs(60), String::new);
    let h = hosts(1);
    let mut c = connect(&h, 0);
    const LEN: usize = 100_000; // many FPDUs
    let target =
        c.sv.pd
            .reg_mr(
                LEN as u64,
                0x9000_0000,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
    let inbox = c.sv.pd.reg_mr(64, 0, AccessFlags::LOCAL_WRITE).unwrap();
    c.sv.qp
        .post_recv(RecvWr::new(7, vec![inbox.sge(0, 64)]))
        .unwrap();
    c.sv.posted += 1;
    let source =
        c.cv.pd
            .reg_mr(LEN as u64, 0x1000, AccessFlags::LOCAL_WRITE)
            .unwrap();
    let data: Vec<u8> = (0..LEN).map(|i| (i % 253) as u8 ^ 0x5a).collect();
    source.write(0, &data).unwrap();
    let msg =
        c.cv.pd
            .reg_mr(64, 0x8000, AccessFlags::LOCAL_WRITE)
            .unwrap();
    msg.write(0, b"written: 100000 bytes").unwrap();
    let write = SendWr::rdma_write(
        1,
        vec![source.sge(0, LEN as u32)],
        target.iova(),
        target.rkey(),
    );
    c.cv.qp
        .post_send(write.with_flags(SendFlags::SIGNALED))
        .unwrap();
    c.cv.qp
        .post_send(SendWr::send(2, vec![msg.sge(0, 21)]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    c.cv.posted += 2;
    assert!(c.cv.all_completed(WAIT), "{:?}", c.cv.completions);
    assert_eq!(c.cv.count(WcStatus::Success), 2, "{:?}", c.cv.completions);
    assert!(c.sv.all_completed(WAIT));
    let wc = c.sv.completions[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (7, WcStatus::Success, 21)
    );
    assert_eq!(&inbox.to_vec()[..21], b"written: 100000 bytes");
    assert!(target.to_vec() == data, "the RDMA Write's bytes differ");
    // A Write to a wrong rkey: it completes at the client once sent (iWARP Writes are
    // not acknowledged by the peer's RDMAP), the server's QP refuses it with a
    // Terminate, and the connection ends: both ids hear Disconnected.
    let bad_rkey = Stag::from_raw(target.rkey().raw() ^ 0x100);
    let bad = SendWr::rdma_write(3, vec![source.sge(0, 16)], target.iova(), bad_rkey);
    c.cv.qp
        .post_send(bad.with_flags(SendFlags::SIGNALED))
        .unwrap();
    c.cv.posted += 1;
    assert!(c.cv.all_completed(WAIT));
    expect(&h.cch, EventKind::Disconnected).ack();
    expect(&h.sch, EventKind::Disconnected).ack();
    no_more_events(&h);
    for id in [c.id, c.conn, c.listener] {
        id.destroy().unwrap();
    }
    for cm in [&h.client, &h.server] {
        let s = cm.stats();
        assert_eq!((s.ids_alive, s.events_unacked), (0, 0), "{s:?}");
    }
}

/// Cutting the client's link (its memory link end removed, as `ip link del` on a TAP):
/// the connected id hears exactly one `DeviceRemoval` and no `Disconnected` (the
/// connection died with the device, after the removal marked the id); every WR posted on its QP completes flushed; the
/// device leaves the registry and is released once the id is destroyed.
#[test]
fn a_cut_link_delivers_one_device_removal_and_flushes_every_posted_wr() {
    let _w = Watchdog::arm("cut_link", Duration::from_secs(60), String::new);
    let h = hosts(2);
    let mut c = connect(&h, 3);
    c.cv.post_recvs(5).unwrap();
    h.pair.a_link.remove();
    // The kernel's order: the removal marks the id before the connection's end is
    // reported, so the id hears DeviceRemoval and never Disconnected.
    let ev = h.cch.get_event_timeout(WAIT).unwrap();
    assert_eq!(ev.kind, EventKind::DeviceRemoval);
    assert_eq!(ev.id().serial(), c.id.serial());
    ev.ack();
    assert!(c.cv.all_completed(WAIT), "{:?}", c.cv.completions);
    assert_eq!(
        c.cv.count(WcStatus::WrFlushErr),
        5,
        "{:?}",
        c.cv.completions
    );
    assert!(h.pair.a.ended().is_some());
    assert!(h.client.devices().is_empty());
    assert_eq!(
        h.client.stats().devices_held,
        1,
        "the id still holds the device"
    );
    // The server's device: removed by the registry's call (sync), same rule: one
    // DeviceRemoval for the connected id and one for the listener bound to its address
    // (only a wildcard listener's per-device listeners go silently).
    let removal = h.server.remove_device("ps2").unwrap();
    let mut got: Vec<u64> = (0..2)
        .map(|_| {
            let ev = expect(&h.sch, EventKind::DeviceRemoval);
            ev.id().serial()
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, [c.listener.serial(), c.conn.serial()]);
    assert!(c.sv.all_completed(WAIT), "{:?}", c.sv.completions);
    assert_eq!(c.sv.count(WcStatus::WrFlushErr), 3);
    no_more_events(&h);
    c.id.destroy().unwrap();
    c.conn.destroy().unwrap();
    assert!(!removal.is_released(), "the listener is still bound to ps2");
    c.listener.destroy().unwrap();
    removal.wait_timeout(WAIT).unwrap();
    assert!(eventually(WAIT, || h.client.stats().devices_held == 0));
    assert_eq!(h.server.stats().devices_held, 0);
    // Creating verbs objects on a removed, ended device fails; no WR is lost.
    assert!(h.pair.a.alloc_pd().is_err());
}

/// The link going down (`ip link set down`) removes the device from the CM: exactly
/// one `DeviceRemoval`, the QP moved to ERROR with its WRs flushed, although the device
/// itself still runs.
#[test]
fn a_link_going_down_removes_the_device_and_flushes_its_qps() {
    let _w = Watchdog::arm("link_down", Duration::from_secs(60), String::new);
    let h = hosts(3);
    let mut c = connect(&h, 0);
    c.cv.post_recvs(4).unwrap();
    h.pair.a_link.set_down();
    expect(&h.cch, EventKind::DeviceRemoval).ack();
    assert!(c.cv.all_completed(WAIT), "{:?}", c.cv.completions);
    assert_eq!(c.cv.count(WcStatus::WrFlushErr), 4);
    assert!(h.pair.a.ended().is_none(), "the device itself still runs");
    assert!(h.client.devices().is_empty());
    c.id.destroy().unwrap();
    assert!(eventually(WAIT, || h.client.stats().devices_held == 0));
    assert!(
        eventually(WAIT, || h.pair.a.connection_count() == 0),
        "the QP's connection was aborted"
    );
    drop((c.conn, c.listener));
}

/// `resolve_addr` resolves the next hop by ARP through the device: the peer's MAC comes
/// back from the device call, and a host that does not answer gives `AddrError` with
/// `-ETIMEDOUT`.
#[test]
fn neighbours_are_resolved_by_arp_and_silence_is_a_timeout() {
    let _w = Watchdog::arm("arp", Duration::from_secs(60), String::new);
    let h = hosts(4);
    let (tx, rx) = mpsc::channel();
    let t2 = tx.clone();
    h.pair
        .a
        .resolve_neighbor(pair_ip(61, 4, 2), WAIT, move |r| t2.send(r).unwrap());
    assert_eq!(rx.recv_timeout(WAIT).unwrap(), Ok([2, 0, 10, 61, 4, 2]));
    let t2 = tx.clone();
    h.pair
        .a
        .resolve_neighbor(pair_ip(61, 9, 2), WAIT, move |r| t2.send(r).unwrap());
    assert_eq!(
        rx.recv_timeout(WAIT).unwrap(),
        Err(softiwarp::transport::neighbor::NeighborError::NotOnLink(
            pair_ip(61, 9, 2)
        ))
    );
    let id = h.client.create_id_with_channel(&h.cch);
    id.resolve_addr(
        None,
        (pair_ip(61, 4, 77), PORT).into(),
        Duration::from_millis(1500),
    )
    .unwrap();
    let ev = expect(&h.cch, EventKind::AddrError);
    assert_eq!(ev.status, -110, "ETIMEDOUT");
    ev.ack();
    // The peer answered ARP for its own address only.
    id.resolve_addr(None, (pair_ip(61, 4, 2), PORT).into(), WAIT)
        .unwrap();
    expect(&h.cch, EventKind::AddrResolved).ack();
    id.destroy().unwrap();
    // A gone device fails pending and new resolutions with DeviceGone.
    h.pair.b_link.remove();
    h.pair.a_link.remove();
    assert!(eventually(WAIT, || h.pair.a.ended().is_some()));
    h.pair
        .a
        .resolve_neighbor(pair_ip(61, 4, 2), WAIT, move |r| tx.send(r).unwrap());
    assert_eq!(
        rx.recv_timeout(WAIT).unwrap(),
        Err(softiwarp::transport::neighbor::NeighborError::DeviceGone)
    );
}
