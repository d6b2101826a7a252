//! Root-only: real TAPs in network namespaces made by the test (topology of
//! transport-notes.md, via `netlab::netns`), opened from threads that `setns` into them.
//!
//! - frames and a 1 MiB smoltcp TCP echo cross from a TAP in one namespace to a TAP in the
//!   other (bridge, veth, bridge), with a pcap of one side;
//! - link failure: `ip link set down`, `set up` and `ip link del` are each reported as a
//!   link event within 100 ms (the spec), measured from just before `ip` is started;
//! - `TapLink::create` makes a non-persistent TAP with the asked MTU, gone on drop;
//! - segmentation offload: a TCP super-segment written to a TAP with `TapOffload::Tcp4`
//!   reaches a TAP without offload as MSS-sized wire segments with correct checksums (the
//!   kernel cut it), and a TAP with offload as one coalesced frame with its metadata.
//!
//! Each test skips (with a message) when not run as root. Every namespace and interface
//! is removed by Drop guards, also when a test fails; each test checks that at its end.

use crate::support::host as common;

use std::io::Cursor;
use std::sync::mpsc;
use std::time::{Duration, Instant as StdInstant};

use common::{Client, Host, Server, Side};
use netlab::netns::{is_root, run_ip, unique_tag, NetNs, TapPair, TapPairConfig};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use smoltcp::time::Instant;
use softiwarp::link::{
    DownReason, GoneReason, Link, LinkError, LinkEvent, Pcap, RxCsum, TapLink, TapOffload,
    TapOptions, OFFLOAD_MAX_FRAME,
};
use softiwarp::transport::smoltcp_glue::TcpConfig;

/// The spec: a link failure is noticed within this.
const DETECTION_BOUND: Duration = Duration::from_millis(100);

fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    eprintln!("skipping {test}: needs root (network namespaces and TAPs)");
    true
}

/// Waits up to `ms` milliseconds for `link`'s poll fd; returns whether it is readable.
fn wait_readable(link: &impl Link, ms: u16) -> bool {
    let mut fds = [PollFd::new(link.poll_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::from(ms)), Ok(n) if n > 0)
}

/// Two threads meeting at a point; fails (instead of hanging like `Barrier`) when the
/// other thread died or took over 10 s.
struct Rendezvous {
    tx: mpsc::Sender<()>,
    rx: mpsc::Receiver<()>,
}

fn rendezvous() -> (Rendezvous, Rendezvous) {
    let (t1, r1) = mpsc::channel();
    let (t2, r2) = mpsc::channel();
    (Rendezvous { tx: t1, rx: r2 }, Rendezvous { tx: t2, rx: r1 })
}

impl Rendezvous {
    fn meet(&self) -> Result<(), String> {
        self.tx
            .send(())
            .map_err(|_| "the other side is gone".to_owned())?;
        self.rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|e| format!("the other side did not come: {e}"))
    }
}

/// Waits until `link` is up (events drained), at most 5 s; returns how long it took.
/// A TAP just attached is `Down(NoCarrier)` until the kernel's linkwatch work has run.
fn wait_up(link: &mut impl Link) -> Result<Duration, String> {
    let t0 = StdInstant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        while link.poll_event().is_some() {}
        if link.state().is_up() {
            return Ok(t0.elapsed());
        }
        wait_readable(link, 100);
    }
    Err(format!(
        "{} not up after 5 s: {:?}",
        link.name(),
        link.state()
    ))
}

/// A test frame: broadcast, EtherType 0x88b5 (IEEE 802 local experimental), a sequence
/// number, padded to `len` bytes.
fn test_frame(seq: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len.max(64)];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xaa]);
    f[12..14].copy_from_slice(&[0x88, 0xb5]);
    f[14..18].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in f[18..].iter_mut().enumerate() {
        *b = (i as u32).wrapping_add(seq) as u8;
    }
    f
}

/// Asserts that no namespace or interface of `topo` survives it.
fn assert_cleaned(ns_names: &[String], if_names: &[String]) {
    let list = netlab::netns::ip_output(&["netns", "list"]).unwrap();
    for n in ns_names {
        assert!(
            !list.contains(n.as_str()),
            "namespace {n} left behind: {list}"
        );
    }
    for i in if_names {
        assert!(
            run_ip(&["link", "show", i]).is_err(),
            "interface {i} leaked into the root namespace"
        );
    }
}

fn names(topo: &TapPair) -> (Vec<String>, Vec<String>) {
    (
        vec![topo.a.name().to_owned(), topo.b.name().to_owned()],
        vec![topo.tap_a.clone(), topo.tap_b.clone()],
    )
}

fn smol_now(start: StdInstant) -> Instant {
    Instant::from_micros(start.elapsed().as_micros() as i64)
}

/// Runs one side of the echo on real time until `done`, sleeping on the link's poll fd
/// while idle. Fails after 60 s (a hang guard, not a timing assertion).
fn run_side<L: Link>(
    host: &mut Host<L>,
    start: StdInstant,
    side: &mut impl Side,
) -> Result<(), String> {
    let deadline = StdInstant::now() + Duration::from_secs(60);
    loop {
        let now = smol_now(start);
        let before = host.dev.stats();
        host.poll(now);
        let moved = side.step(host.socket());
        if side.done(host.socket()) {
            return Ok(());
        }
        if StdInstant::now() > deadline {
            return Err(format!(
                "not done after 60 s: state {:?}, stats {:?}",
                host.socket().state(),
                host.dev.stats()
            ));
        }
        if let Some(ev) = host.dev.link_mut().poll_event() {
            return Err(format!("unexpected link event {ev:?}"));
        }
        if !moved && before == host.dev.stats() {
            let ms = host
                .iface
                .poll_delay(now, &host.sockets)
                .map_or(50, |d| d.total_millis().min(50)) as u16;
            if ms > 0 {
                wait_readable(host.dev.link(), ms);
            }
        }
    }
}

#[test]
fn tap_frames_and_tcp_echo_across_namespaces() {
    if skip_unless_root("tap_frames_and_tcp_echo_across_namespaces") {
        return;
    }
    let topo = TapPair::create(TapPairConfig::default()).expect("topology");
    let (ns_names, if_names) = names(&topo);
    let pcap_path = std::env::temp_dir().join(format!("sw-tap-{}.pcap", unique_tag()));
    let (bar_a, bar_b) = rendezvous();
    let (probe_tx, probe_rx) = mpsc::channel::<()>();
    const FRAMES: u32 = 200;
    let data = common::payload(1 << 20, 21);

    let (tap_a, path_a, data_a) = (topo.tap_a.clone(), pcap_path.clone(), data.clone());
    let side_a = topo.a.spawn(move || -> Result<(u64, Vec<u8>), String> {
        let mut link = TapLink::open(&tap_a).map_err(|e| e.to_string())?;
        assert_eq!(link.mtu(), 1500);
        let t = wait_up(&mut link)?;
        println!("A up {t:?} after attach");
        let mut link = Pcap::create(link, &path_a).map_err(|e| e.to_string())?;
        bar_a.meet()?; // B's TAP is attached before A sends
                       // Right after a topology is made or a TAP attached, the kernel may drop frames
                       // for up to about a second although every interface reports up (measured; see
                       // the `tap` module docs). Probe until B has seen one frame, then count on all.
        let mut probe = test_frame(0, 64);
        probe[13] = 0xb6;
        let deadline = StdInstant::now() + Duration::from_secs(10);
        let mut probes = 0u64;
        loop {
            link.send(&probe).map_err(|e| e.to_string())?;
            probes += 1;
            if probe_rx.recv_timeout(Duration::from_millis(10)).is_ok() {
                break;
            }
            if StdInstant::now() > deadline {
                return Err("no probe got through in 10 s".into());
            }
        }
        for seq in 0..FRAMES {
            link.send(&test_frame(seq, 60 + seq as usize * 7))
                .map_err(|e| e.to_string())?;
        }
        bar_a.meet()?; // B got the frames; now TCP, B listening
        let start = StdInstant::now();
        let mut host = Host::new(link, 1, TcpConfig::default(), smol_now(start));
        host.connect(2);
        let mut client = Client::new(data_a);
        run_side(&mut host, start, &mut client)?;
        let frames = host.dev.stats().tx_frames + host.dev.stats().rx_frames;
        let mut link = host.dev.into_link();
        link.flush().map_err(|e| e.to_string())?;
        println!("A: {probes} probe(s) before the first got through");
        Ok((frames + u64::from(FRAMES) + probes, client.echoed))
    });

    let tap_b = topo.tap_b.clone();
    let side_b = topo.b.spawn(move || -> Result<Vec<u8>, String> {
        let mut link = TapLink::open(&tap_b).map_err(|e| e.to_string())?;
        let t = wait_up(&mut link)?;
        println!("B up {t:?} after attach");
        bar_b.meet()?;
        let mut buf = vec![0u8; link.max_frame_len()];
        let mut next = 0u32;
        let deadline = StdInstant::now() + Duration::from_secs(10);
        while next < FRAMES && StdInstant::now() < deadline {
            match link.recv(&mut buf).map_err(|e| e.to_string())? {
                Some(_) if buf[12..14] == [0x88, 0xb6] => {
                    let _ = probe_tx.send(());
                }
                Some(n) if buf[12..14] == [0x88, 0xb5] => {
                    let want = test_frame(next, 60 + next as usize * 7);
                    if buf[..n] != want[..] {
                        return Err(format!("frame {next} differs"));
                    }
                    next += 1;
                }
                Some(_) => {} // anything else the kernel may send
                None => {
                    wait_readable(&link, 100);
                }
            }
        }
        if next != FRAMES {
            return Err(format!("got {next} of {FRAMES} frames"));
        }
        let start = StdInstant::now();
        let mut host = Host::new(link, 2, TcpConfig::default(), smol_now(start));
        host.listen();
        bar_b.meet()?;
        let mut server = Server::default();
        run_side(&mut host, start, &mut server)?;
        Ok(server.received)
    });

    let a = side_a.join().expect("thread A").expect("setns A");
    let b = side_b.join().expect("thread B").expect("setns B");
    let (a, b) = match (a, b) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => panic!("side A: {:?}\nside B: {:?}", a.err(), b.err()),
    };
    let (frames_a, echoed) = a;
    let received = b;
    assert!(received == data, "server got different bytes");
    assert!(echoed == data, "client got a different echo");

    // The pcap holds every frame A sent or received, and the TCP segments respect the MSS.
    let bytes = std::fs::read(&pcap_path).unwrap();
    std::fs::remove_file(&pcap_path).unwrap();
    use pcap_parser::traits::PcapReaderIterator;
    let mut reader = pcap_parser::LegacyPcapReader::new(1 << 20, Cursor::new(&bytes)).unwrap();
    let mut count = 0u64;
    let mut max_len = 0usize;
    loop {
        match reader.next() {
            Ok((off, block)) => {
                if let pcap_parser::PcapBlockOwned::Legacy(b) = block {
                    count += 1;
                    max_len = max_len.max(b.caplen as usize);
                }
                reader.consume(off);
            }
            Err(pcap_parser::PcapError::Eof) => break,
            Err(pcap_parser::PcapError::Incomplete(_)) => reader.refill().unwrap(),
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(count, frames_a);
    assert_eq!(max_len, 1514, "full-size frames: MSS 1460 + 40 + 14");
    println!("TAP echo: {count} frames captured on A");

    drop(topo);
    assert_cleaned(&ns_names, &if_names);
}

/// What the watcher thread saw for one event.
#[derive(Debug)]
struct Seen {
    event: LinkEvent,
    at: StdInstant,
    /// Result of a send right after the event.
    send: Result<(), String>,
    /// Whether the poll fd was readable 200 ms after a `Gone` (it must not be).
    quiet_after_gone: Option<bool>,
}

#[test]
fn tap_down_up_del_detected_within_100ms() {
    if skip_unless_root("tap_down_up_del_detected_within_100ms") {
        return;
    }
    let topo = TapPair::create(TapPairConfig {
        mtu: 9000,
        ..Default::default()
    })
    .expect("topology");
    let (ns_names, if_names) = names(&topo);
    let (tx, rx) = mpsc::channel::<Seen>();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(usize, LinkEvent), String>>();
    let tap = topo.tap_a.clone();
    let watcher = topo.a.spawn(move || {
        let mut link = match TapLink::open(&tap) {
            Ok(l) => l,
            Err(e) => return ready_tx.send(Err(e.to_string())).unwrap(),
        };
        if let Err(e) = wait_up(&mut link) {
            return ready_tx.send(Err(e)).unwrap();
        }
        ready_tx.send(Ok((link.mtu(), link.state()))).unwrap();
        let frame = test_frame(0, 64);
        let mut buf = vec![0u8; link.max_frame_len()];
        let deadline = StdInstant::now() + Duration::from_secs(30);
        while StdInstant::now() < deadline {
            // A generous poll: the bound is measured, not slept.
            wait_readable(&link, 1000);
            while let Some(event) = link.poll_event() {
                let at = StdInstant::now();
                let send = link.send(&frame).map_err(|e| match e {
                    LinkError::Down(r) => format!("Down({r:?})"),
                    LinkError::Gone(r) => format!("Gone({r:?})"),
                    e => e.to_string(),
                });
                let quiet_after_gone = event.is_gone().then(|| !wait_readable(&link, 200));
                let gone = event.is_gone();
                tx.send(Seen {
                    event,
                    at,
                    send,
                    quiet_after_gone,
                })
                .unwrap();
                if gone {
                    assert!(matches!(link.recv(&mut buf), Err(LinkError::Gone(_))));
                    return;
                }
            }
            // Drain frames (none expected; nothing else is attached).
            while let Ok(Some(_)) = link.recv(&mut buf) {}
        }
    });
    let (mtu, state) = ready_rx.recv().unwrap().expect("open TAP");
    assert_eq!(mtu, 9000, "MTU read from the interface");
    assert_eq!(state, LinkEvent::Up);

    // Runs `ip -n A ARGS` and collects the events it causes, up to the first one that
    // `last` accepts; returns them with their latency from just before `ip` started.
    let step = |args: &[&str], last: fn(&LinkEvent) -> bool| -> Vec<(Seen, Duration)> {
        let t0 = StdInstant::now();
        topo.a.ip(args).expect("ip");
        let mut all = Vec::new();
        loop {
            let seen = rx
                .recv_timeout(Duration::from_secs(5))
                .expect("no link event");
            let latency = seen.at.saturating_duration_since(t0);
            println!(
                "{args:?}: {:?} after {latency:?}, send -> {:?}",
                seen.event, seen.send
            );
            let end = last(&seen.event);
            all.push((seen, latency));
            if end {
                return all;
            }
        }
    };

    let mut seen = step(&["link", "set", &topo.tap_a, "down"], |_| true);
    let (down, t_down) = seen.remove(0);
    assert_eq!(down.event, LinkEvent::Down(DownReason::AdminDown));
    assert_eq!(
        down.send,
        Err("Down(AdminDown)".to_owned()),
        "write gives EIO"
    );
    assert!(t_down < DETECTION_BOUND, "down noticed after {t_down:?}");

    let mut seen = step(&["link", "set", &topo.tap_a, "up"], |_| true);
    let (up, t_up) = seen.remove(0);
    assert_eq!(up.event, LinkEvent::Up);
    assert_eq!(up.send, Ok(()));
    assert!(t_up < DETECTION_BOUND, "up noticed after {t_up:?}");

    // Deleting an up interface closes it first (dev_close: RTM_NEWLINK without IFF_UP),
    // then unregisters it (RTM_DELLINK): Down(AdminDown) may come before Gone.
    let mut seen = step(&["link", "del", &topo.tap_a], LinkEvent::is_gone);
    let (gone, t_gone) = seen.pop().unwrap();
    for (s, _) in &seen {
        assert_eq!(s.event, LinkEvent::Down(DownReason::AdminDown));
    }
    assert!(
        matches!(
            gone.event,
            LinkEvent::Gone(GoneReason::Deleted | GoneReason::FdError(_))
        ),
        "{gone:?}"
    );
    assert!(gone.send.as_ref().is_err_and(|e| e.starts_with("Gone(")));
    assert_eq!(gone.quiet_after_gone, Some(true), "poll fd quiet once gone");
    assert!(
        t_gone < DETECTION_BOUND,
        "deletion noticed after {t_gone:?}"
    );

    watcher.join().expect("watcher").expect("setns");
    drop(topo);
    assert_cleaned(&ns_names, &if_names);
}

#[test]
fn tap_create_is_not_persistent_and_open_is_exclusive() {
    if skip_unless_root("tap_create_is_not_persistent_and_open_is_exclusive") {
        return;
    }
    let tag = unique_tag();
    let ns = NetNs::create(&format!("swns{tag}c")).expect("namespace");
    let ns_name = ns.name().to_owned();
    let name = format!("swc{tag}");
    let n = name.clone();
    let res = ns
        .spawn(move || -> Result<(), String> {
            let mut link = TapLink::create(
                &n,
                TapOptions {
                    mtu: Some(9000),
                    up: true,
                },
            )
            .map_err(|e| e.to_string())?;
            assert_eq!(link.name(), n);
            assert_eq!(link.mtu(), 9000);
            wait_up(&mut link)?;
            assert!(link.ifindex() > 0);
            // A second create of the same name fails; so does a second attach.
            assert!(TapLink::create(&n, TapOptions::default()).is_err());
            let busy = TapLink::open(&n).map(|_| ()).map_err(|e| e.to_string());
            assert!(busy.is_err_and(|e| e.contains("busy")));
            drop(link);
            // Non-persistent: the kernel deleted it with the fd.
            match TapLink::open(&n) {
                Err(LinkError::NotFound(_)) => {}
                other => return Err(format!("still there after drop: {other:?}")),
            }
            // A kernel-numbered name.
            let numbered =
                TapLink::create("swn%d", TapOptions::default()).map_err(|e| e.to_string())?;
            assert!(numbered.name().starts_with("swn"), "{}", numbered.name());
            assert_ne!(numbered.name(), "swn%d");
            // Not up: admin down.
            assert_eq!(numbered.state(), LinkEvent::Down(DownReason::AdminDown));
            assert_eq!(numbered.mtu(), 1500);
            // The fd path alone: delete the interface and read before looking at events.
            // The read fails with EBADFD, which makes the link gone; the rtnetlink
            // notifications that follow are not reported (gone is terminal).
            let mut fd_only = numbered;
            run_ip(&["link", "del", fd_only.name()]).map_err(|e| e.to_string())?;
            let mut buf = [0u8; 1514];
            let gone = LinkEvent::Gone(GoneReason::FdError(nix::errno::Errno::EBADFD));
            match fd_only.recv(&mut buf) {
                Err(LinkError::Gone(GoneReason::FdError(nix::errno::Errno::EBADFD))) => {}
                other => return Err(format!("recv after del: {other:?}")),
            }
            assert!(matches!(fd_only.send(&buf[..60]), Err(LinkError::Gone(_))));
            assert_eq!(fd_only.poll_event(), Some(gone));
            assert_eq!(fd_only.poll_event(), None);
            assert_eq!(fd_only.state(), gone);
            assert!(!wait_readable(&fd_only, 100), "poll fd quiet once gone");
            Ok(())
        })
        .join()
        .expect("thread")
        .expect("setns");
    res.expect("create");
    // The TAP was made inside the namespace, not here.
    assert!(run_ip(&["link", "show", &name]).is_err());
    drop(ns);
    assert_cleaned(&[ns_name], &[name]);
}

/// An Ethernet/IPv4/TCP frame (broadcast, 10.98.0.1:1000 -> 10.98.0.2:2000, ACK|PSH,
/// sequence number 7000) with `payload`; IPv4 checksum filled, TCP checksum zero, as
/// smoltcp leaves it for a link that offloads it.
fn tcp_frame(payload: &[u8]) -> Vec<u8> {
    use smoltcp::wire::Ipv4Packet;
    let mut f = vec![0u8; 54];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xaa]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((40 + payload.len()) as u16).to_be_bytes());
    f[22] = 64;
    f[23] = 6;
    f[26..30].copy_from_slice(&[10, 98, 0, 1]);
    f[30..34].copy_from_slice(&[10, 98, 0, 2]);
    f[34..36].copy_from_slice(&1000u16.to_be_bytes());
    f[36..38].copy_from_slice(&2000u16.to_be_bytes());
    f[38..42].copy_from_slice(&7000u32.to_be_bytes());
    f[46] = 0x50;
    f[47] = 0x18;
    f[48..50].copy_from_slice(&1024u16.to_be_bytes());
    f.extend_from_slice(payload);
    Ipv4Packet::new_unchecked(&mut f[14..]).fill_checksum();
    f
}

/// A frame read with its metadata.
type Received = (Vec<u8>, softiwarp::link::RxMeta);

#[test]
fn tap_offload_super_segment_is_cut_by_the_kernel_or_delivered_whole() {
    if skip_unless_root("tap_offload_super_segment_is_cut_by_the_kernel_or_delivered_whole") {
        return;
    }
    use smoltcp::wire::{IpAddress, Ipv4Packet, TcpPacket};
    let topo = TapPair::create(TapPairConfig::default()).expect("topology");
    let (ns_names, if_names) = names(&topo);
    let (bar_a, bar_b) = rendezvous();
    let (seen_tx, seen_rx) = mpsc::channel::<()>();
    let payload: Vec<u8> = (0..3000u32).map(|i| (i * 13 + 5) as u8).collect();
    let super_seg = tcp_frame(&payload);

    let (tap_a, frame) = (topo.tap_a.clone(), super_seg.clone());
    let side_a = topo.a.spawn(move || -> Result<(), String> {
        let mut link = TapLink::open_with(&tap_a, TapOffload::Tcp4).map_err(|e| e.to_string())?;
        if !link.tcp_offload() {
            return Err("the kernel refused TUNSETOFFLOAD".into());
        }
        wait_up(&mut link)?;
        // Twice: to B without offload, then to B with it.
        for _ in 0..2 {
            bar_a.meet()?;
            let mut probe = test_frame(0, 64);
            probe[13] = 0xb6;
            let deadline = StdInstant::now() + Duration::from_secs(10);
            while seen_rx.recv_timeout(Duration::from_millis(10)).is_err() {
                link.send(&probe).map_err(|e| e.to_string())?;
                if StdInstant::now() > deadline {
                    return Err("no probe got through in 10 s".into());
                }
            }
            let mut f = frame.clone();
            link.send_tcp_offload(&mut f, Some(1000))
                .map_err(|e| e.to_string())?;
            bar_a.meet()?;
        }
        Ok(())
    });

    let tap_b = topo.tap_b.clone();
    let side_b = topo
        .b
        .spawn(move || -> Result<(Vec<Vec<u8>>, Vec<Received>), String> {
            let mut plain = Vec::new();
            let mut whole = Vec::new();
            for offload in [TapOffload::Off, TapOffload::Tcp4] {
                let mut link = TapLink::open_with(&tap_b, offload).map_err(|e| e.to_string())?;
                wait_up(&mut link)?;
                bar_b.meet()?;
                let mut buf = vec![0u8; OFFLOAD_MAX_FRAME];
                let want = if offload == TapOffload::Off { 3 } else { 1 };
                let deadline = StdInstant::now() + Duration::from_secs(10);
                let mut got = 0;
                while got < want && StdInstant::now() < deadline {
                    match link.recv_meta(&mut buf).map_err(|e| e.to_string())? {
                        Some(_) if buf[12..14] == [0x88, 0xb6] => {
                            let _ = seen_tx.send(());
                        }
                        Some(m) if buf[12..14] == [0x08, 0x00] && buf[23] == 6 => {
                            got += 1;
                            if offload == TapOffload::Off {
                                plain.push(buf[..m.len].to_vec());
                            } else {
                                whole.push((buf[..m.len].to_vec(), m));
                            }
                        }
                        Some(_) => {}
                        None => {
                            wait_readable(&link, 100);
                        }
                    }
                }
                bar_b.meet()?;
            }
            Ok((plain, whole))
        });
    let ra = side_a.join().expect("thread A");
    let rb = side_b.join().expect("thread B");
    drop(topo);
    assert_cleaned(&ns_names, &if_names);
    ra.expect("A entered").expect("A");
    let (plain, whole) = rb.expect("B entered").expect("B");

    // Without offload: the kernel cut the 3000 bytes into 1000-byte segments with
    // complete checksums, sequence numbers advanced, PSH on the last only.
    assert_eq!(plain.len(), 3, "{} wire segments", plain.len());
    let (src, dst) = (IpAddress::v4(10, 98, 0, 1), IpAddress::v4(10, 98, 0, 2));
    let mut joined = Vec::new();
    for (i, f) in plain.iter().enumerate() {
        let ip = Ipv4Packet::new_checked(&f[14..]).expect("IPv4");
        assert!(ip.verify_checksum(), "segment {i}: IPv4 checksum");
        assert_eq!(ip.total_len(), 1040);
        let tcp = TcpPacket::new_checked(ip.payload()).expect("TCP");
        assert!(tcp.verify_checksum(&src, &dst), "segment {i}: TCP checksum");
        assert_eq!(tcp.seq_number().0, 7000 + 1000 * i as i32);
        assert_eq!(tcp.psh(), i == 2);
        joined.extend_from_slice(tcp.payload());
    }
    assert_eq!(joined, payload);
    // With offload: one frame, as written, with a partial checksum and the segment size.
    assert_eq!(whole.len(), 1);
    let (f, m) = &whole[0];
    assert_eq!(m.len, 54 + 3000);
    assert_eq!(m.gso_size, Some(1000));
    assert_eq!(m.csum, RxCsum::Partial);
    assert_eq!(f[54..], payload[..]);
    assert_eq!(f[..48], super_seg[..48], "headers up to the TCP flags");
}
