//! rping in miniature, without root: two hosts (each a soft iWARP device with its own
//! RDMA CM) on an in-memory Ethernet link. The client resolves the server's address
//! (ARP) and route, connects, RDMA Writes 64 KiB into the server's MR (address and rkey
//! from the accept's private data), Sends "done", and disconnects; the server checks.
use rdma_cm::{CmIdRef, ConnParam, EventChannel, EventKind as K, RdmaCmConfig};
use softiwarp::cm::iwcm::SoftQp;
use softiwarp::cm::rdmacm::{SoftDevice, SoftRdmaCm};
use softiwarp::link::{MemoryConfig, MemoryLink};
use softiwarp::{Cq, Pd, QpInitAttr};
use softiwarp::{Device, DeviceConfig, LinkConfig};
use std::{error::Error, net::SocketAddr, sync::Arc, time::Duration};
use verbs::{AccessFlags as A, QpCap, RecvWr, SendFlags, SendWr, Stag, WcStatus};
type R<T> = Result<T, Box<dyn Error>>;
const T: Duration = Duration::from_secs(10);
const LEN: usize = 64 * 1024;
const CAP: QpCap =
    QpCap { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
/// One host: a soft device on `link` with address 10.77.0.`n`/24, and its RDMA CM.
fn host(name: &str, link: MemoryLink, n: u8) -> R<SoftRdmaCm> {
    let cfg = DeviceConfig::new(name, LinkConfig::memory(link), [10, 77, 0, n].into(), 24);
    let cm = SoftRdmaCm::new(RdmaCmConfig::default())?;
    cm.add_device(SoftDevice::new(Arc::new(Device::open(cfg)?))?)?;
    Ok(cm)
}
/// `rdma_get_cm_event`, expecting `kind`.
fn expect(ch: &EventChannel<SoftDevice>, kind: K) -> R<rdma_cm::ChannelEvent<SoftDevice>> {
    let ev = ch.get_event_timeout(T)?;
    println!("  id #{}: {} (status {})", ev.id().serial(), ev.kind, ev.status);
    (ev.kind == kind).then_some(ev).ok_or(format!("expected {kind}").into())
}
/// PD, CQ and QP on the device the id is bound to (`id->verbs`, `rdma_create_qp`).
fn verbs_of(id: &CmIdRef<SoftDevice>) -> R<(Pd, Cq, SoftQp)> {
    let dev = id.device().ok_or("the id has no device")?;
    let (pd, cq) = (dev.device().alloc_pd()?, dev.device().create_cq(16)?);
    let qp =
        id.create_qp(&pd, QpInitAttr { send_cq: &cq, recv_cq: &cq, cap: CAP, sq_sig_all: false })?;
    Ok((pd, cq, qp))
}
fn param(private_data: Vec<u8>) -> ConnParam {
    ConnParam { private_data, responder_resources: 1, initiator_depth: 1, ..Default::default() }
}
fn main() -> R<()> {
    let (l1, l2) = MemoryLink::pair(MemoryConfig::default())?;
    let (client_cm, server_cm) = (host("siw_cli", l1, 1)?, host("siw_srv", l2, 2)?);
    let (cch, sch) = (client_cm.create_event_channel(), server_cm.create_event_channel());
    let server: SocketAddr = "10.77.0.2:7471".parse()?;
    let listener = server_cm.create_id_with_channel(&sch); // rdma_bind_addr, rdma_listen
    listener.bind_addr(server)?;
    listener.listen(8)?;
    let id = client_cm.create_id_with_channel(&cch); // rdma_resolve_addr, _route
    id.resolve_addr(None, server, T)?;
    expect(&cch, K::AddrResolved)?.ack();
    id.resolve_route(T)?;
    expect(&cch, K::RouteResolved)?.ack();
    let (pd, cq, qp) = verbs_of(&id)?;
    let src = pd.reg_mr(LEN as u64, 0x1000_0000, A::LOCAL_WRITE)?; // ibv_reg_mr
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
    src.write(0, &data)?;
    id.connect(&param(Vec::new()))?; // rdma_connect
    println!("client {:?} connecting to {server}", id.local_addr().ok_or("no address")?);
    // Server: the ConnectRequest's new id; its QP and MRs; rdma_accept with addr+rkey.
    let conn = expect(&sch, K::ConnectRequest)?.take_new_id().ok_or("no new id")?;
    let (spd, scq, sqp) = verbs_of(&conn)?;
    let dst = spd.reg_mr(LEN as u64, 0x2000_0000, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let msg = spd.reg_mr(16, 0x3000_0000, A::LOCAL_WRITE)?;
    let pdata = [dst.iova().to_be_bytes(), u64::from(dst.rkey().raw()).to_be_bytes()].concat();
    conn.accept(&param(pdata))?;
    sqp.post_recv(RecvWr::new(1, vec![msg.sge(0, 16)]))?; // in RTS once accepted
    let est = expect(&cch, K::Established)?;
    let addr = u64::from_be_bytes(est.private_data[..8].try_into()?);
    let rkey = Stag::from_raw(u64::from_be_bytes(est.private_data[8..16].try_into()?) as u32);
    est.ack();
    expect(&sch, K::Established)?.ack();
    // RDMA Write, then a Send behind it (RDMAP delivers them in order).
    let write = SendWr::rdma_write(1, vec![src.sge(0, LEN as u32)], addr, rkey);
    qp.post_send(write.with_flags(SendFlags::SIGNALED))?;
    let done = pd.reg_mr(16, 0x4000_0000, A::LOCAL_WRITE)?;
    done.write(0, b"done")?;
    qp.post_send(SendWr::send(2, vec![done.sge(0, 4)]).with_flags(SendFlags::SIGNALED))?;
    for wc in [cq.poll_wait(1, T)?, cq.poll_wait(1, T)?].concat() {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        println!("client: WR {} completed: {:?}", wc.wr_id, wc.opcode);
    }
    let wc = scq.poll_wait(1, T)?.pop().ok_or("no receive completion")?;
    assert_eq!((wc.status, wc.byte_len, &msg.to_vec()[..4]), (WcStatus::Success, 4, &b"done"[..]));
    assert!(dst.to_vec() == data, "the bytes the RDMA Write placed differ");
    println!("server: received \"done\"; the {LEN} bytes of the RDMA Write are right");
    id.disconnect()?; // rdma_disconnect: both sides see Disconnected
    expect(&cch, K::Disconnected)?.ack();
    expect(&sch, K::Disconnected)?.ack();
    for i in [id, conn, listener] {
        i.destroy().map_err(|e| e.to_string())?; // rdma_destroy_id (the QP with it)
    }
    assert_eq!(client_cm.stats().ids_alive + server_cm.stats().ids_alive, 0);
    println!("disconnected; every id destroyed");
    Ok(())
}
