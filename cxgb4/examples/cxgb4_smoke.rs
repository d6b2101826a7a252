//! End-to-end smoke run of the crate on a real rdma-core device (the
//! kernel's siw in the VM of shared/tools/siwvm, or a Chelsio port): a server
//! and a client thread in one process connect over the device's address
//! through librdmacm; the client RDMA Writes 4 KiB into the server's MR,
//! reads it back with an RDMA Read, and Sends 5 inline bytes; both sides
//! check the data and disconnect; everything is dropped in order and
//! librdmacm's device cache is released.
//!
//! Usage: `cxgb4_smoke DEVICE IP [PORT]` (e.g. `cxgb4_smoke siw0 10.99.0.1`).
//! Exit status 0 and a last line `SMOKE OK` on success; 3 with one line when
//! rdma-core or the device is missing; 1 on any other failure.

use cxgb4::{CmEventKind, ConnParam, Context, EventChannel, Mr, RdmaCore};
use std::net::{IpAddr, SocketAddr};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use verbs::{AccessFlags, QpCap, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus, WorkCompletion};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const LEN: usize = 4096;
const QP_CAP: QpCap = QpCap {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 32,
};

fn expect(chan: &EventChannel, kind: CmEventKind) -> Res<cxgb4::CmEvent> {
    let ev = chan.get_event()?;
    if ev.kind() != kind {
        return Err(format!(
            "expected {kind}, got {} (status {})",
            ev.kind(),
            ev.status()
        )
        .into());
    }
    Ok(ev)
}

/// Polls `cq` until one completion arrives (5 s at most).
fn one_wc(cq: &cxgb4::Cq) -> Res<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::new();
    while Instant::now() < deadline {
        if cq.poll(1, &mut out)? == 1 {
            let wc = out.pop().unwrap();
            if wc.status != WcStatus::Success {
                return Err(format!("completion failed: {wc:?}").into());
            }
            return Ok(wc);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Err("no completion within 5 s".into())
}

fn pattern(i: usize) -> u8 {
    (i * 7 + 3) as u8
}

fn server(core: Arc<RdmaCore>, addr: SocketAddr, ready: mpsc::Sender<()>) -> Res<()> {
    let chan = EventChannel::new(&core)?;
    let listener = chan.create_id()?;
    listener.bind_addr(addr)?;
    listener.listen(4)?;
    ready.send(())?;
    let req = expect(&chan, CmEventKind::ConnectRequest)?;
    let id = req.id().clone();
    assert_eq!(req.listen_id(), Some(&listener));
    let ctx = id.context().ok_or("connect request id without a device")?;
    let caps = ctx.caps()?;
    let pd = ctx.alloc_pd()?;
    let cc = ctx.create_comp_channel()?;
    let cq = ctx.create_cq(64, Some(&cc))?;
    match ctx.create_cq(8, Some(&cc)) {
        Err(cxgb4::Error::Verbs(verbs::VerbsError::InvalidArgument { what })) => {
            println!("server: a second CQ on the channel refused: {what}")
        }
        other => return Err(format!("second CQ on one channel: {other:?}").into()),
    }
    let qp = id.create_qp(&pd, &cq, &cq, QP_CAP, true)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let target: Mr = pd.reg_mr(LEN, access)?;
    let recv: Mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE)?;
    qp.post_recv(&RecvWr::new(1, vec![recv.sge(0, 64).unwrap()]))?;
    let mut private = target.addr().to_be_bytes().to_vec();
    private.extend_from_slice(&target.rkey().raw().to_be_bytes());
    let (ord, ird) = caps.clamp_ord_ird(8, 8);
    let param = ConnParam {
        private_data: private,
        initiator_depth: ord,
        responder_resources: ird,
        ..ConnParam::default()
    };
    id.accept(&param)?;
    drop(req); // ack
    expect(&chan, CmEventKind::Established)?;
    // Arm, then poll; sleep on the channel only if nothing is there yet (the
    // usual pattern: a completion before the arm raises no event).
    cq.req_notify(false)?;
    let mut got = Vec::new();
    if cq.poll(1, &mut got)? == 0 {
        cq.get_event()?;
        println!(
            "server: completion event taken from the channel (fd {})",
            cc.fd()
        );
    }
    let wc = match got.pop() {
        Some(wc) => wc,
        None => one_wc(&cq)?,
    };
    if wc.opcode != WcOpcode::Recv || wc.byte_len != 5 || &recv.as_slice()[..5] != b"done!" {
        return Err(format!("bad receive {wc:?}").into());
    }
    let bad = (0..LEN).find(|&i| target.as_slice()[i] != pattern(i));
    if let Some(i) = bad {
        return Err(format!("server MR byte {i} wrong after the RDMA Write").into());
    }
    println!(
        "server: receive of {} bytes, 4 KiB written by the peer verified",
        wc.byte_len
    );
    id.disconnect()?;
    expect(&chan, CmEventKind::Disconnected)?;
    // Order: QP, then MRs/CQ/PD, then the id; events are acked already.
    drop(qp);
    drop((target, recv, cq, cc, pd, ctx, id, listener));
    Ok(())
}

fn client(core: Arc<RdmaCore>, addr: SocketAddr) -> Res<()> {
    let chan = EventChannel::new(&core)?;
    let id = chan.create_id()?;
    id.resolve_addr(None, addr, 2000)?;
    expect(&chan, CmEventKind::AddrResolved)?;
    id.resolve_route(2000)?;
    expect(&chan, CmEventKind::RouteResolved)?;
    let ctx = id.context().ok_or("resolved id without a device")?;
    let caps = ctx.caps()?;
    println!("client: device {} caps {caps:?}", ctx.name());
    println!(
        "client: transport {:?}, port 1 max message {} bytes",
        ctx.transport(),
        ctx.max_msg_size(1)?
    );
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64, None)?;
    let qp = id.create_qp(&pd, &cq, &cq, QP_CAP, true)?;
    println!("client: QP {} granted {:?}", qp.qp_num(), qp.cap());
    // LOCAL_WRITE for the Read's sink; REMOTE_WRITE too, as iw_cxgb4 needs.
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    caps.check_read_sink(access)?;
    let mut src = pd.reg_mr(2 * LEN, access)?;
    for (i, b) in src.as_mut_slice()[..LEN].iter_mut().enumerate() {
        *b = pattern(i);
    }
    let (ord, ird) = caps.clamp_ord_ird(8, 8);
    id.connect(&ConnParam {
        initiator_depth: ord,
        responder_resources: ird,
        ..ConnParam::default()
    })?;
    let est = expect(&chan, CmEventKind::Established)?;
    let pd_bytes = est.private_data().to_vec();
    drop(est);
    if pd_bytes.len() < 12 {
        return Err(format!("private data of {} bytes", pd_bytes.len()).into());
    }
    let raddr = u64::from_be_bytes(pd_bytes[..8].try_into().unwrap());
    let rkey = verbs::Stag::from_raw(u32::from_be_bytes(pd_bytes[8..12].try_into().unwrap()));
    let sig = SendFlags::SIGNALED;
    qp.post_send(
        &SendWr::rdma_write(10, vec![src.sge(0, LEN).unwrap()], raddr, rkey).with_flags(sig),
    )?;
    let wc = one_wc(&cq)?;
    assert_eq!((wc.wr_id, wc.opcode), (10, WcOpcode::RdmaWrite));
    qp.post_send(
        &SendWr::rdma_read(11, vec![src.sge(LEN, LEN).unwrap()], raddr, rkey).with_flags(sig),
    )?;
    let wc = one_wc(&cq)?;
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.byte_len),
        (11, WcOpcode::RdmaRead, LEN as u32)
    );
    let (a, b) = src.as_slice().split_at(LEN);
    if a != b {
        return Err("RDMA Read returned other bytes than were written".into());
    }
    println!("client: RDMA Write and Read of 4 KiB verified");
    let send = SendWr::send_inline(12, b"done!".to_vec());
    let send = SendWr {
        flags: send.flags | sig,
        ..send
    };
    qp.post_send(&send)?;
    let wc = one_wc(&cq)?;
    assert_eq!((wc.wr_id, wc.opcode), (12, WcOpcode::Send));
    expect(&chan, CmEventKind::Disconnected)?;
    // Nothing pending: non-blocking fds say EAGAIN (11) instead of blocking.
    chan.set_nonblocking(true)?;
    let e = chan
        .get_event()
        .err()
        .ok_or("an event after the disconnect")?;
    ctx.set_async_nonblocking(true)?;
    let a = ctx.get_async_event().err().ok_or("an async event")?;
    println!(
        "client: idle CM channel errno {}, idle async fd errno {}",
        e.errno(),
        a.errno()
    );
    drop(qp);
    drop((src, cq, pd, ctx, id));
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: cxgb4_smoke DEVICE IP [PORT]");
        std::process::exit(2);
    }
    let ip: IpAddr = args[2].parse().expect("IP");
    let port: u16 = args.get(3).map_or(7471, |p| p.parse().expect("PORT"));
    let addr = SocketAddr::new(ip, port);
    let core = match RdmaCore::load() {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(3);
        }
    };
    let devs = cxgb4::devices(&core).unwrap_or_default();
    println!("devices: {devs:?}");
    if let Err(e) = Context::open(&core, &args[1]) {
        eprintln!("{e}");
        std::process::exit(3);
    }
    let (tx, rx) = mpsc::channel();
    let sc = core.clone();
    let srv = std::thread::spawn(move || server(sc, addr, tx));
    let cli = match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(()) => client(core.clone(), addr),
        Err(_) => Err("server did not start".into()),
    };
    let srv = srv.join().expect("server thread");
    let released = cxgb4::release_cached_devices(&core);
    println!("client: {cli:?}; server: {srv:?}; librdmacm devices after release: {released:?}");
    if cli.is_ok() && srv.is_ok() {
        println!("SMOKE OK");
    } else {
        std::process::exit(1);
    }
}
