//! End-to-end smoke run of the crate on a real rdma-core device (the
//! kernel's siw in the VM of shared/tools/siwvm, or a Chelsio port): a server
//! and a client thread in one process connect over the device's address
//! through librdmacm; the client RDMA Writes 4 KiB into the server's MR,
//! reads it back with an RDMA Read, and Sends 5 inline bytes; both sides
//! check the data and disconnect; everything is dropped in order and
//! librdmacm's device cache is released.
//!
//! With `--removal`, once both sides are connected (4 receives posted on
//! each) the device is deleted from another process (`rdma link delete
//! DEVICE`, in the background, under `timeout 120`): each side must get
//! exactly one `RDMA_CM_EVENT_DEVICE_REMOVAL` per live id (the time is
//! printed; each wait is bounded by 20 s for slow emulated VMs), drain
//! its CQ (every posted receive completes, flushed), destroy the QP, ack,
//! destroy the ids; the delete, which waits for every uverbs fd and
//! librdmacm keeps one open, finishes once the process exits (the caller
//! checks that).
//!
//! Usage: `cxgb4_smoke DEVICE IP [PORT] [--removal]` (e.g. `cxgb4_smoke siw0
//! 10.99.0.1`). Exit status 0 and a last line `SMOKE OK` (or `REMOVAL OK`) on
//! success; 3 with one line when rdma-core or the device is missing; 1 on
//! any other failure.

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

/// How long a step may take: generous, since a software-emulated VM on a
/// loaded host is slow (10 to 20 times slower than idle, measured).
const STEP: Duration = Duration::from_secs(20);

/// Polls `cq` until one completion arrives ([`STEP`] at most).
fn one_wc(cq: &cxgb4::Cq) -> Res<WorkCompletion> {
    let deadline = Instant::now() + STEP;
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
    Err(format!("no completion within {STEP:?}").into())
}

fn pattern(i: usize) -> u8 {
    (i * 7 + 3) as u8
}

/// Receives posted per side in the removal run.
const REMOVAL_RECVS: u64 = 4;

/// Takes `n` events on a non-blocking channel within [`STEP`], all of them
/// `DEVICE_REMOVAL` (anything else first is printed and dropped).
fn wait_removals(chan: &EventChannel, n: usize) -> Res<Vec<cxgb4::CmEvent>> {
    chan.set_nonblocking(true)?;
    let deadline = Instant::now() + STEP;
    let mut evs = Vec::new();
    while evs.len() < n {
        match chan.get_event() {
            Ok(ev) if ev.kind() == CmEventKind::DeviceRemoval => evs.push(ev),
            Ok(ev) => println!("removal: {} before the removal event", ev.kind()),
            Err(e) if e.errno() == 11 => {
                if Instant::now() > deadline {
                    return Err(
                        format!("{} of {n} removal events within {STEP:?}", evs.len()).into(),
                    );
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(evs)
}

/// Polls `cq` empty; returns (completions, of which flushed).
fn drain(cq: &cxgb4::Cq) -> Res<(usize, usize)> {
    let mut all = Vec::new();
    while cq.poll(16, &mut all)? > 0 {}
    let flushed = all
        .iter()
        .filter(|wc| wc.status == WcStatus::WrFlushErr)
        .count();
    Ok((all.len(), flushed))
}

/// The removal run's end on one side: one removal event per id in `ids`,
/// drain, then QP, events (ack), ids, in that order.
fn on_removal(
    side: &str,
    chan: &EventChannel,
    ids: Vec<cxgb4::CmId>,
    qp: cxgb4::Qp,
    cq: &cxgb4::Cq,
) -> Res<()> {
    let t0 = Instant::now();
    let evs = wait_removals(chan, ids.len())?;
    for id in &ids {
        let n = evs.iter().filter(|e| e.id() == id).count();
        if n != 1 {
            return Err(format!("{side}: {n} removal events for one id").into());
        }
    }
    std::thread::sleep(Duration::from_millis(100)); // let flushes land
    let (wcs, flushed) = drain(cq)?;
    println!(
        "{side}: {} removal events (one per id) after {:?}; {wcs} completions, {flushed} flushed",
        evs.len(),
        t0.elapsed()
    );
    // The trap of librdmacm: rdma_destroy_id waits for the id's events to be
    // acked. Drop our id handles first, while the events still hold them: the
    // last reference goes inside each event's drop, after its ack, so this
    // returns (with the order reversed in CmEvent it would hang here).
    drop(qp);
    drop(ids);
    drop(evs);
    Ok(())
}

fn server(
    core: Arc<RdmaCore>,
    addr: SocketAddr,
    ready: mpsc::Sender<()>,
    removal: bool,
) -> Res<()> {
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
    if removal {
        for i in 1..REMOVAL_RECVS {
            qp.post_recv(&RecvWr::new(1 + i, vec![recv.sge(0, 64).unwrap()]))?;
        }
    }
    id.accept(&param)?;
    drop(req); // ack
    expect(&chan, CmEventKind::Established)?;
    if removal {
        ready.send(())?;
        on_removal("server", &chan, vec![id, listener], qp, &cq)?;
        drop((target, recv, cq, cc, pd, ctx));
        return Ok(());
    }
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

fn client(core: Arc<RdmaCore>, addr: SocketAddr, connected: Option<mpsc::Sender<()>>) -> Res<()> {
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
    // A CQ of another context (our own open of the same device) is refused.
    let own = Context::open(&core, &ctx.name())?;
    let foreign = own.create_cq(8, None)?;
    match id.create_qp(&pd, &foreign, &cq, QP_CAP, true) {
        Err(e) if e.errno() == 22 => println!("client: QP with another context's CQ refused: {e}"),
        other => return Err(format!("QP with a foreign CQ: {other:?}").into()),
    }
    drop((foreign, own));
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
    if connected.is_some() {
        for i in 0..REMOVAL_RECVS {
            qp.post_recv(&RecvWr::new(100 + i, vec![src.sge(0, 64).unwrap()]))?;
        }
    }
    let est = expect(&chan, CmEventKind::Established)?;
    if let Some(tx) = connected {
        drop(est);
        tx.send(())?;
        on_removal("client", &chan, vec![id], qp, &cq)?;
        drop((src, cq, pd, ctx));
        return Ok(());
    }
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
    // iw_cxgb4's Read-sink rule, asked for on siw (which does not check): a Read into
    // an MR without REMOTE_WRITE is refused at post_send, nothing posted.
    let local_only = pd.reg_mr(LEN, AccessFlags::LOCAL_WRITE)?;
    pd.set_strict_read_sink(true);
    match qp.post_send(
        &SendWr::rdma_read(13, vec![local_only.sge(0, LEN).unwrap()], raddr, rkey).with_flags(sig),
    ) {
        Err(e) => println!("client: strict Read sink without REMOTE_WRITE refused: {e}"),
        Ok(()) => return Err("a Read into an MR without REMOTE_WRITE was posted".into()),
    }
    drop(local_only);
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
    let removal = args.iter().any(|a| a == "--removal");
    let (tx, rx) = mpsc::channel();
    let sc = core.clone();
    let stx = tx.clone();
    let srv = std::thread::spawn(move || server(sc, addr, stx, removal));
    let cli = match rx.recv_timeout(STEP) {
        Ok(()) if removal => {
            let cc = core.clone();
            let cli = std::thread::spawn(move || client(cc, addr, Some(tx)));
            // Both sides connected: delete the device from another process.
            let both = rx.recv_timeout(STEP).and(rx.recv_timeout(STEP));
            let t0 = Instant::now();
            let del = both.map_err(|e| e.to_string()).and_then(|()| {
                std::process::Command::new("timeout")
                    .args(["120", "rdma", "link", "delete", &args[1]])
                    .spawn()
                    .map_err(|e| e.to_string())
            });
            let cli = cli.join().expect("client thread");
            let srv_done = t0.elapsed();
            println!("removal: both sides done {srv_done:?} after the delete started");
            // librdmacm keeps its cached context of the device open (v44's
            // sync_devices_list gives up on an empty device list before
            // closing a removed device's context), and the kernel's delete
            // waits for every uverbs fd: it finishes when this process exits.
            let released = cxgb4::release_cached_devices(&core);
            let listed = cxgb4::devices(&core).map(|d| d.len());
            println!("removal: after release: librdmacm {released:?}, libibverbs lists {listed:?}");
            match del {
                Ok(mut child) => match child.try_wait() {
                    Ok(None) => {
                        println!("removal: rdma link delete still waiting (our fds), as expected");
                        cli
                    }
                    other => Err(format!("rdma link delete ended early: {other:?}").into()),
                },
                Err(e) => Err(e.into()),
            }
        }
        Ok(()) => client(core.clone(), addr, None),
        Err(_) => Err("server did not start".into()),
    };
    let srv = srv.join().expect("server thread");
    let released = cxgb4::release_cached_devices(&core);
    println!("client: {cli:?}; server: {srv:?}; librdmacm devices after release: {released:?}");
    match (cli.is_ok() && srv.is_ok(), removal) {
        (true, false) => println!("SMOKE OK"),
        (true, true) => println!("REMOVAL OK"),
        (false, _) => std::process::exit(1),
    }
}
