//! The RDMA CM over host-TCP devices (`LinkConfig::netdev`, no root): two CMs, each
//! with a device on `lo`, an RDMA Write of 1 MiB and a Send through kernel TCP with the
//! bytes checked, and address resolution over every interface that is up: each
//! interface's address resolves to its own device.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use rdma_cm::{ConnParam, EventChannel, EventKind, RdmaCmConfig};
use softiwarp::cm::rdmacm::{SoftDevice, SoftRdmaCm};
use softiwarp::{Device, DeviceConfig, LinkConfig};
use testkit::Watchdog;
use verbs::{AccessFlags, RecvWr, SendFlags, SendWr, WcStatus};

const WAIT: Duration = Duration::from_secs(10);

fn host_device(name: &str, ifname: &str) -> Arc<Device> {
    Arc::new(
        Device::open(DeviceConfig::new(
            name,
            LinkConfig::netdev(ifname),
            Ipv4Addr::UNSPECIFIED,
            0,
        ))
        .unwrap(),
    )
}

fn cm_with(devices: &[Arc<Device>]) -> SoftRdmaCm {
    let cm = SoftRdmaCm::new(RdmaCmConfig::default()).unwrap();
    for d in devices {
        cm.add_device(SoftDevice::new(d.clone()).unwrap()).unwrap();
    }
    cm
}

fn expect(ch: &EventChannel<SoftDevice>, kind: EventKind) -> rdma_cm::ChannelEvent<SoftDevice> {
    let ev = ch.get_event_timeout(WAIT).expect("an event");
    assert_eq!(ev.kind, kind, "status {}", ev.status);
    ev
}

#[test]
fn rdma_write_and_send_over_kernel_tcp_on_lo_with_the_bytes_checked() {
    let _w = Watchdog::arm("host_write_send", Duration::from_secs(60), String::new);
    let (cdev, sdev) = (host_device("hcl", "lo"), host_device("hsl", "lo"));
    let (client, server) = (
        cm_with(std::slice::from_ref(&cdev)),
        cm_with(std::slice::from_ref(&sdev)),
    );
    let (cch, sch) = (client.create_event_channel(), server.create_event_channel());
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = (Ipv4Addr::LOCALHOST, port).into();
    let listener = server.create_id_with_channel(&sch);
    listener.bind_addr(addr).unwrap();
    listener.listen(4).unwrap();
    let id = client.create_id_with_channel(&cch);
    id.resolve_addr(None, addr, WAIT).unwrap();
    expect(&cch, EventKind::AddrResolved).ack();
    id.resolve_route(WAIT).unwrap();
    expect(&cch, EventKind::RouteResolved).ack();
    assert!(Arc::ptr_eq(id.device().unwrap().device(), &cdev));
    let mut cv = Verbs::on(&id).unwrap();
    let param = ConnParam {
        private_data: b"hello".to_vec(),
        responder_resources: 2,
        initiator_depth: 2,
        ..ConnParam::default()
    };
    id.connect(&param).unwrap();
    let mut req = expect(&sch, EventKind::ConnectRequest);
    assert_eq!(req.private_data, b"hello");
    let conn = req.take_new_id().unwrap();
    req.ack();
    assert!(Arc::ptr_eq(conn.device().unwrap().device(), &sdev));
    let mut sv = Verbs::on(&conn).unwrap();
    const LEN: usize = 1 << 20;
    let target = sv
        .pd
        .reg_mr(
            LEN as u64,
            0x9000_0000,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let inbox = sv.pd.reg_mr(64, 0, AccessFlags::LOCAL_WRITE).unwrap();
    sv.qp
        .post_recv(RecvWr::new(7, vec![inbox.sge(0, 64)]))
        .unwrap();
    sv.posted += 1;
    conn.accept(&ConnParam {
        private_data: b"welcome".to_vec(),
        ..param.clone()
    })
    .unwrap();
    let est = expect(&cch, EventKind::Established);
    assert_eq!(est.private_data, b"welcome");
    est.ack();
    expect(&sch, EventKind::Established).ack();

    let source = cv
        .pd
        .reg_mr(LEN as u64, 0x1000, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let data: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8 ^ 0xa5).collect();
    source.write(0, &data).unwrap();
    let msg = cv.pd.reg_mr(64, 0x8000, AccessFlags::LOCAL_WRITE).unwrap();
    msg.write(0, b"written: 1 MiB").unwrap();
    let write = SendWr::rdma_write(
        1,
        vec![source.sge(0, LEN as u32)],
        target.iova(),
        target.rkey(),
    );
    cv.qp
        .post_send(write.with_flags(SendFlags::SIGNALED))
        .unwrap();
    cv.qp
        .post_send(SendWr::send(2, vec![msg.sge(0, 14)]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    cv.posted += 2;
    assert!(cv.all_completed(WAIT), "{:?}", cv.completions);
    assert_eq!(cv.count(WcStatus::Success), 2, "{:?}", cv.completions);
    assert!(sv.all_completed(WAIT), "{:?}", sv.completions);
    let wc = sv.completions[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (7, WcStatus::Success, 14)
    );
    assert_eq!(&inbox.to_vec()[..14], b"written: 1 MiB");
    assert!(target.to_vec() == data, "the RDMA Write's bytes differ");
    id.disconnect().unwrap();
    expect(&cch, EventKind::Disconnected).ack();
    expect(&sch, EventKind::Disconnected).ack();
    for i in [id, conn, listener] {
        i.destroy().unwrap();
    }
}

#[test]
fn every_interface_address_resolves_to_its_own_device() {
    let up: Vec<_> = softiwarp::host::netdev::interfaces()
        .unwrap()
        .into_iter()
        .filter(|i| i.up && !i.addrs.is_empty())
        .collect();
    assert!(
        up.iter().any(|i| i.name == "lo"),
        "lo is up with 127.0.0.1: {up:?}"
    );
    let devices: Vec<Arc<Device>> = up
        .iter()
        .map(|i| host_device(&format!("h{}", i.index), &i.name))
        .collect();
    let cm = cm_with(&devices);
    let ch = cm.create_event_channel();
    for (i, dev) in up.iter().zip(&devices) {
        for a in &i.addrs {
            let id = cm.create_id_with_channel(&ch);
            id.resolve_addr(None, (a.addr, 9).into(), WAIT).unwrap();
            expect(&ch, EventKind::AddrResolved).ack();
            assert!(
                Arc::ptr_eq(id.device().unwrap().device(), dev),
                "{} of {} resolved to {:?}",
                a.addr,
                i.name,
                id.device().map(|d| d.device().name().to_owned())
            );
            id.destroy().unwrap();
        }
    }
}

/// Root: host-TCP devices opened inside a namespace of the test's own
/// (`DeviceConfig::netns`) make their kernel sockets there, although the test's thread
/// (outside it) resolves, listens and connects: the kernel's route is asked in the
/// namespace, the connection to an address only the namespace has reaches the
/// namespace's listener, and a decoy listening on the same port in the test's namespace
/// gets nothing. (Which thread carries out the connect and listen is the progress
/// engine's choice; the route query runs on the test's thread.)
#[test]
fn devices_in_a_namespace_make_their_sockets_there_whichever_thread_calls() {
    if !netlab::netns::is_root() {
        eprintln!("skipped: creating a network namespace needs root");
        return;
    }
    let _w = Watchdog::arm("host_netns", Duration::from_secs(60), String::new);
    let ns = netlab::netns::NetNs::create(&format!("swh{}", netlab::netns::unique_tag())).unwrap();
    // An address only the namespace has: reached through the namespace's sockets only.
    let ns_ip = Ipv4Addr::new(10, 231, 7, 1);
    ns.ip(&["addr", "add", "10.231.7.1/32", "dev", "lo"])
        .unwrap();
    let open_in_ns = |name: &str| {
        let mut cfg = DeviceConfig::new(name, LinkConfig::netdev("lo"), Ipv4Addr::UNSPECIFIED, 0);
        cfg.netns = Some(format!("/run/netns/{}", ns.name()).into());
        Arc::new(Device::open(cfg).unwrap())
    };
    let (cdev, sdev) = (open_in_ns("hnc"), open_in_ns("hns"));
    let decoy = TcpListener::bind("127.0.0.1:0").unwrap();
    decoy.set_nonblocking(true).unwrap();
    let port = decoy.local_addr().unwrap().port();
    let (client, server) = (cm_with(std::slice::from_ref(&cdev)), cm_with(&[sdev]));
    let (cch, sch) = (client.create_event_channel(), server.create_event_channel());
    assert!(
        cdev.addresses().iter().any(|a| a.addr == ns_ip),
        "the namespace's lo: {:?}",
        cdev.addresses()
    );
    assert_eq!(
        cdev.route_source(ns_ip),
        Some(ns_ip),
        "the namespace's route"
    );
    let addr: SocketAddr = (ns_ip, port).into();
    let listener = server.create_id_with_channel(&sch);
    listener
        .bind_addr((Ipv4Addr::UNSPECIFIED, port).into())
        .unwrap();
    listener.listen(4).unwrap();
    let id = client.create_id_with_channel(&cch);
    id.resolve_addr(None, addr, WAIT).unwrap();
    expect(&cch, EventKind::AddrResolved).ack();
    id.resolve_route(WAIT).unwrap();
    expect(&cch, EventKind::RouteResolved).ack();
    let _cv = Verbs::on(&id).unwrap();
    id.connect(&ConnParam::default()).unwrap();
    let mut req = expect(&sch, EventKind::ConnectRequest);
    let conn = req.take_new_id().unwrap();
    req.ack();
    let _sv = Verbs::on(&conn).unwrap();
    conn.accept(&ConnParam::default()).unwrap();
    expect(&cch, EventKind::Established).ack();
    expect(&sch, EventKind::Established).ack();
    assert!(
        matches!(decoy.accept(), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a socket was made in the test's namespace"
    );
    for i in [id, conn, listener] {
        i.destroy().unwrap();
    }
    drop((client, server, cdev));
}

/// A wildcard `rdma_listen` on a port another program holds fails (as cma.c's
/// `cma_listen_on_all` since Linux 5.11: one device's failed listen fails the listen),
/// instead of listening on no device; once the port is free the same id listens.
#[test]
fn a_wildcard_listen_on_a_port_in_use_fails_and_can_be_retried() {
    let dev = host_device("hbusy", "lo");
    let cm = cm_with(std::slice::from_ref(&dev));
    let ch = cm.create_event_channel();
    let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = squatter.local_addr().unwrap().port();
    let id = cm.create_id_with_channel(&ch);
    id.bind_addr((Ipv4Addr::UNSPECIFIED, port).into()).unwrap();
    let err = id
        .listen(4)
        .expect_err("the port is taken by a kernel socket");
    assert_eq!(err.errno(), libc::EADDRINUSE, "{err}");
    assert_eq!(
        cm.stats().internal_listeners,
        0,
        "nothing listens after the failure"
    );
    drop(squatter);
    id.listen(4).expect("the port is free now");
    id.destroy().unwrap();
}
