//! Two [`Stack`]s on a memory link pair, one virtual clock, no threads: MPA connection
//! setup end to end through smoltcp TCP, and ULPDU streams in both directions.

use crate::support::stack::{addr, links, Flow, Pair, Side};
use smoltcp::time::Duration;
use softiwarp::link::MemoryLink;
use softiwarp::transport::{ConnEvent, MpaParams};

const PORT: u16 = 7174;

fn params(pd: &[u8], ird: u16, ord: u16) -> MpaParams {
    MpaParams {
        private_data: pd.to_vec(),
        ird,
        ord,
        settings: None,
    }
}

type MemPair = Pair<Side<MemoryLink>, Side<MemoryLink>>;

fn mem_pair(mtu: usize) -> MemPair {
    let (la, lb) = links(mtu);
    Pair::new(Side::new(la, 1, |_| {}), Side::new(lb, 2, |_| {}))
}

#[test]
fn connect_accept_exchange_close() {
    let mut p = mem_pair(1500);
    p.b.stack.listen(PORT, 4, None).unwrap();
    let now = p.now;
    let (ca, ea) = p.a.connect(2, PORT, params(b"hello", 4, 4), now).unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| !p.b.requests.is_empty()));
    let req = p.b.requests.front().unwrap().clone();
    assert_eq!(req.request.private_data, b"hello");
    assert_eq!(req.remote.ip(), &addr(1));
    let (cb, eb) = p.b.accept_next(b"welcome", 2, 2).unwrap().unwrap();
    assert!(p.run_until(Duration::from_secs(5), |_| ea.established().is_some()));
    let est_a = ea.established().unwrap();
    let est_b = eb.established().unwrap();
    assert_eq!(est_a.agreed.peer_private_data, b"welcome");
    assert_eq!(est_a.mulpdu, 1454, "EMSS 1460 without markers");
    assert_eq!(est_b.mulpdu, 1454);
    assert_eq!((est_a.agreed.ird, est_a.agreed.ord), (4, 2));

    let mut ab = Flow::new(1, est_a.mulpdu, 2000);
    let mut ba = Flow::new(2, est_b.mulpdu, 2000);
    let ok = p.run_until(Duration::from_secs(60), |_| {
        ab.push(&ea);
        ba.push(&eb);
        ab.pull(&eb);
        ba.pull(&ea);
        ab.done() && ba.done()
    });
    assert!(
        ok,
        "ab {}/{} ba {}/{}",
        ab.received, ab.sent, ba.received, ba.sent
    );
    println!(
        "exchanged 2x{} ULPDUs ({} + {} bytes) in {} steps, virtual {}",
        ab.count, ab.bytes, ba.bytes, p.steps, p.now
    );

    p.a.stack
        .close(ca, softiwarp::transport::CloseMode::Graceful)
        .unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| {
        p.a.final_of(ca).is_some() && p.b.final_of(cb).is_some()
    }));
    assert_eq!(p.a.final_of(ca), Some(ConnEvent::Closed));
    assert_eq!(p.b.events_of(cb).last(), Some(&ConnEvent::Closed));
    assert!(p.b.events_of(cb).contains(&ConnEvent::Disconnected));
    let sa = p.a.stack.stats();
    let sb = p.b.stack.stats();
    println!("{sa:?}\n{sb:?}");
    p.run_for(Duration::from_secs(15));
    assert_eq!(p.a.stack.connection_count(), 0);
    assert_eq!(p.b.stack.connection_count(), 0);
}

// ---------------------------------------------------------------------------------------

use std::io::Cursor;

use softiwarp::link::{Direction, FaultConfig, Faults, Link, MemoryControl, Pcap, PcapClock};
use softiwarp::transport::stream::StreamEnd;
use softiwarp::transport::{CloseMode, ConnError, ConnId};

/// Connects A to B and accepts; returns both connections once established.
fn establish<A: Link, B: Link>(
    p: &mut Pair<Side<A>, Side<B>>,
    settings: Option<mpa::negotiate::LocalSettings>,
) -> ((ConnId, StreamEnd), (ConnId, StreamEnd)) {
    let now = p.now;
    let params = MpaParams {
        settings,
        ..params(b"", 1, 1)
    };
    let (ca, ea) = p.a.connect(2, PORT, params, now).unwrap();
    assert!(p.run_until(Duration::from_secs(10), |p| !p.b.requests.is_empty()));
    let (cb, eb) = p.b.accept_next(b"", 1, 1).unwrap().unwrap();
    assert!(p.run_until(Duration::from_secs(10), |_| ea.established().is_some()));
    ((ca, ea), (cb, eb))
}

fn with_crc() -> Option<mpa::negotiate::LocalSettings> {
    Some(mpa::negotiate::LocalSettings {
        crc: mpa::negotiate::CrcPolicy::Wanted,
        ..Default::default()
    })
}

#[test]
fn random_ulpdus_through_loss_duplication_reordering_and_corruption() {
    // With about 3% of the frames lost each way and a receiver whose window changes with
    // every ACK (smoltcp counts no duplicate ACKs then, so there is no fast retransmit),
    // every loss costs a retransmission timeout, and smoltcp doubles the RTO up to 32 s
    // and more before a new RTT sample resets it; the default 20 s user timeout can then
    // abort the connection before its retransmission. This test is about integrity, so
    // both sides wait as long as the test does.
    let patient = |c: &mut softiwarp::transport::StackConfig| {
        c.tcp.timeout = Some(std::time::Duration::from_secs(600));
    };
    for (seed, markers) in [(5u64, false), (6, true)] {
        let (la, lb) = links(1500);
        let la = Faults::new(la, seed, FaultConfig::none(), FaultConfig::none()).unwrap();
        let mut p = Pair::new(Side::new(la, 1, patient), Side::new(lb, 2, patient));
        p.b.stack.listen(PORT, 4, None).unwrap();
        let settings = mpa::negotiate::LocalSettings {
            markers_rx: markers,
            crc: mpa::negotiate::CrcPolicy::Wanted,
            ..Default::default()
        };
        let ((_, ea), (_, eb)) = establish(&mut p, Some(settings));
        // Faults from now on (ARP and the handshake are done), both directions of A's link.
        let f = FaultConfig {
            drop: 0.01,
            duplicate: 0.01,
            reorder: 0.01,
            corrupt: 0.01,
            corrupt_from: 14,
        };
        p.a.stack.link_mut().set_config(Direction::Tx, f).unwrap();
        p.a.stack.link_mut().set_config(Direction::Rx, f).unwrap();
        let mulpdu_a = ea.established().unwrap().mulpdu;
        let mulpdu_b = eb.established().unwrap().mulpdu;
        let mut ab = Flow::new(seed * 10 + 1, mulpdu_a, 3000);
        let mut ba = Flow::new(seed * 10 + 2, mulpdu_b, 3000);
        let ok = p.run_until(Duration::from_secs(600), |_| {
            ab.push(&ea);
            ba.push(&eb);
            ab.pull(&eb);
            ba.pull(&ea);
            ab.done() && ba.done()
        });
        let tx = p.a.stack.link().stats(Direction::Tx);
        let rx = p.a.stack.link().stats(Direction::Rx);
        assert!(
            ok,
            "ab {}/{} ba {}/{}; tx {tx:?} rx {rx:?}",
            ab.received, ab.sent, ba.received, ba.sent
        );
        for s in [tx, rx] {
            assert!(
                s.dropped > 0 && s.duplicated > 0 && s.reordered > 0 && s.corrupted > 0,
                "{s:?}"
            );
        }
        // TCP caught every corruption (the TCP checksum covers every byte after the
        // Ethernet header): no MPA CRC error, nothing failed.
        assert_eq!(
            p.a.stack.stats().crc_errors + p.b.stack.stats().crc_errors,
            0
        );
        println!(
            "markers {markers}: {} + {} bytes, virtual {}, tx {tx:?}, rx {rx:?}",
            ab.bytes, ba.bytes, p.now
        );
    }
}

/// Flips one byte of the receive stream at stream offset `at` (a CRC error that TCP's
/// checksum missed).
fn flip_at(at: u64) -> softiwarp::transport::RxHook {
    Box::new(move |offset, buf| {
        if (offset..offset + buf.len() as u64).contains(&at) {
            buf[(at - offset) as usize] ^= 0x5a;
        }
    })
}

#[test]
fn corruption_above_tcp_is_caught_by_the_mpa_crc_and_a_second_connection_survives() {
    let mut p = mem_pair(1500);
    p.b.stack.listen(PORT, 4, None).unwrap();
    let ((c1a, e1a), (c1b, e1b)) = establish(&mut p, with_crc());
    let ((_, e2a), (_, e2b)) = establish(&mut p, with_crc());
    // Corrupt the stream of connection 1 as B receives it, 200 000 bytes in.
    p.b.stack.set_rx_hook(c1b, flip_at(200_000)).unwrap();
    let m = e1a.established().unwrap().mulpdu;
    let mut f1 = Flow::new(21, m, 1000);
    let mut f2 = Flow::new(22, m, 1000);
    let mut f2back = Flow::new(23, m, 1000);
    let ok = p.run_until(Duration::from_secs(60), |p| {
        f1.push(&e1a);
        f2.push(&e2a);
        f2back.push(&e2b);
        // Every ULPDU connection 1 delivers must be the right one: pull() checks.
        f1.pull(&e1b);
        f2.pull(&e2b);
        f2back.pull(&e2a);
        f2.done() && f2back.done() && p.b.final_of(c1b).is_some() && p.a.final_of(c1a).is_some()
    });
    assert!(
        ok,
        "f1 {} f2 {} f2back {}",
        f1.received, f2.received, f2back.received
    );
    match p.b.final_of(c1b) {
        Some(ConnEvent::Failed(ConnError::Mpa(
            softiwarp::transport::mpa_conn::MpaError::Crc { .. },
        ))) => {}
        other => panic!("receiver: {other:?}"),
    }
    assert_eq!(
        p.a.final_of(c1a),
        Some(ConnEvent::Failed(ConnError::TerminateReceived(
            ddp_rdmap::terminate::ErrorCause::Llp(ddp_rdmap::terminate::LlpCode::CrcError)
        )))
    );
    assert!(
        f1.received < 1000 && f1.bytes < 200_000,
        "{} {}",
        f1.received,
        f1.bytes
    );
    assert_eq!(p.b.stack.stats().crc_errors, 1);
    assert_eq!(p.b.stack.stats().terminates_sent, 1);
    assert_eq!(p.a.stack.stats().terminates_received, 1);
    // After the failure, the receiving end reports it once the queue is drained.
    assert!(matches!(
        e1b.try_recv(),
        Err(softiwarp::transport::stream::RecvError::Failed(
            ConnError::Mpa(_)
        ))
    ));
}

/// A bad CRC in the initiator's very first FPDU (the responder still holds its own
/// FPDUs, RFC 5044 section 7.1.2): the responder sends the Terminate anyway (Layer LLP,
/// EType MPA, code 0x02 CRC error, as siw's `siw_rx_data` does) and then resets; the
/// initiator reports exactly that cause; a second connection keeps flowing.
#[test]
fn bad_crc_in_the_first_fpdu_gets_the_crc_terminate() {
    let mut p = mem_pair(1500);
    p.b.stack.listen(PORT, 4, None).unwrap();
    let ((c1a, e1a), (c1b, _e1b)) = establish(&mut p, with_crc());
    let ((_, e2a), (_, e2b)) = establish(&mut p, with_crc());
    // The MPA Request is 24 octets (20 + IRD/ORD): offset 34 is inside the first FPDU.
    p.b.stack.set_rx_hook(c1b, flip_at(34)).unwrap();
    let m = e1a.established().unwrap().mulpdu;
    let mut f1 = Flow::new(41, m, 1);
    let mut f2 = Flow::new(42, m, 300);
    let mut f2back = Flow::new(43, m, 300);
    assert!(p.run_until(Duration::from_secs(30), |p| {
        f1.push(&e1a);
        f2.push(&e2a);
        f2back.push(&e2b);
        f2.pull(&e2b);
        f2back.pull(&e2a);
        f2.done() && f2back.done() && p.b.final_of(c1b).is_some() && p.a.final_of(c1a).is_some()
    }));
    assert!(matches!(
        p.b.final_of(c1b),
        Some(ConnEvent::Failed(ConnError::Mpa(
            softiwarp::transport::mpa_conn::MpaError::Crc { .. }
        )))
    ));
    assert_eq!(
        p.a.final_of(c1a),
        Some(ConnEvent::Failed(ConnError::TerminateReceived(
            ddp_rdmap::terminate::ErrorCause::Llp(ddp_rdmap::terminate::LlpCode::CrcError)
        )))
    );
    assert_eq!(p.b.stack.stats().crc_errors, 1);
    assert_eq!(p.b.stack.stats().terminates_sent, 1);
    assert_eq!(p.a.stack.stats().terminates_received, 1);
}

#[test]
fn garbage_instead_of_an_fpdu_fails_only_that_connection() {
    let mut p = mem_pair(1500);
    p.b.stack.listen(PORT, 4, None).unwrap();
    let ((c1a, e1a), (c1b, _e1b)) = establish(&mut p, with_crc());
    let ((_, e2a), (_, e2b)) = establish(&mut p, with_crc());
    // 64 bytes of 0xff over the stream of connection 1 from offset 10 000.
    p.b.stack
        .set_rx_hook(
            c1b,
            Box::new(|offset, buf| {
                for (i, b) in buf.iter_mut().enumerate() {
                    if (10_000..10_064).contains(&(offset + i as u64)) {
                        *b = 0xff;
                    }
                }
            }),
        )
        .unwrap();
    let m = e1a.established().unwrap().mulpdu;
    let mut f1 = Flow::new(31, m, 100);
    let mut f2 = Flow::new(32, m, 500);
    assert!(p.run_until(Duration::from_secs(30), |p| {
        f1.push(&e1a);
        f2.push(&e2a);
        f2.pull(&e2b);
        f2.done() && p.b.final_of(c1b).is_some() && p.a.final_of(c1a).is_some()
    }));
    assert!(matches!(
        p.b.final_of(c1b),
        Some(ConnEvent::Failed(ConnError::Mpa(_)))
    ));
    assert!(matches!(
        p.a.final_of(c1a),
        Some(ConnEvent::Failed(ConnError::TerminateReceived(_)))
    ));
}

fn fixed_clock() -> PcapClock {
    let mut t = std::time::Duration::from_secs(1_700_000_000);
    Box::new(move || {
        t += std::time::Duration::from_micros(1);
        t
    })
}

/// A pair on a memory link of `mtu` whose side A captures every frame, B listening on
/// [`PORT`].
type CapturedPair = Pair<Side<Pcap<MemoryLink, Vec<u8>>>, Side<MemoryLink>>;

fn captured_pair(mtu: usize) -> CapturedPair {
    let (la, lb) = links(mtu);
    let la = Pcap::with_writer(la, Vec::new(), fixed_clock()).unwrap();
    let mut p = Pair::new(Side::new(la, 1, |_| {}), Side::new(lb, 2, |_| {}));
    p.b.stack.listen(PORT, 4, None).unwrap();
    p
}

/// Closes A's connection `ca` gracefully and returns A's capture.
fn close_and_capture(mut p: CapturedPair, ca: ConnId) -> Vec<u8> {
    p.a.stack.close(ca, CloseMode::Graceful).unwrap();
    p.run_for(Duration::from_secs(1));
    let Pair { a, .. } = p;
    let (_, pcap) = a.stack.into_link().into_parts();
    pcap.unwrap()
}

/// (source port, stream offset from ISN + 1, payload length) of every TCP segment with
/// payload, first transmissions only (a segment starting below the highest sequence
/// number already seen from its source is a retransmission).
fn data_segments(pcap: &[u8]) -> Vec<(u16, u64, usize)> {
    use pcap_parser::traits::PcapReaderIterator;
    use pcap_parser::{LegacyPcapReader, PcapBlockOwned, PcapError};
    let mut reader = LegacyPcapReader::new(1 << 20, Cursor::new(pcap)).unwrap();
    let mut isn: std::collections::HashMap<u16, u32> = Default::default();
    let mut high: std::collections::HashMap<u16, u64> = Default::default();
    let mut out = Vec::new();
    loop {
        match reader.next() {
            Ok((off, block)) => {
                if let PcapBlockOwned::Legacy(b) = block {
                    let f = b.data;
                    if f.len() > 54 && f[12..14] == [8, 0] && f[23] == 6 {
                        let ihl = usize::from(f[14] & 15) * 4;
                        let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
                        let t = &f[14 + ihl..14 + total];
                        let sport = u16::from_be_bytes([t[0], t[1]]);
                        let seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
                        let doff = usize::from(t[12] >> 4) * 4;
                        let len = t.len() - doff;
                        if t[13] & 0x02 != 0 {
                            isn.insert(sport, seq);
                        } else if len > 0 {
                            let off = u64::from(seq.wrapping_sub(isn[&sport]).wrapping_sub(1));
                            let h = high.entry(sport).or_default();
                            if off >= *h {
                                *h = off + len as u64;
                                out.push((sport, off, len));
                            }
                        }
                    }
                }
                reader.consume(off);
            }
            Err(PcapError::Eof) => break,
            Err(PcapError::Incomplete(_)) => reader.refill().unwrap(),
            Err(e) => panic!("{e:?}"),
        }
    }
    out
}

/// Classifies the first transmissions of data segments in `pcap` against the FPDUs that
/// `iwdump` finds (which must be `fpdus`, with no dissection error): (segments carrying
/// exactly one FPDU, segments carrying part of one, segments carrying bytes of two).
fn segments_per_fpdu(pcap: &[u8], fpdus_expected: u64) -> (usize, usize, usize) {
    let report = iwdump::dissect(pcap).unwrap();
    assert!(
        report.errors.is_empty(),
        "{} errors, first {:?}",
        report.errors.len(),
        report.errors.first()
    );
    assert_eq!(report.fpdus, fpdus_expected);
    // FPDU extents per sender port.
    let mut fpdus: std::collections::HashMap<u16, Vec<(u64, u64)>> = Default::default();
    for (rec, _) in report.fpdu_records() {
        fpdus
            .entry(rec.src.port())
            .or_default()
            .push((rec.offset, rec.offset + rec.wire_len));
    }
    let segs = data_segments(pcap);
    let (mut whole, mut split_parts, mut straddling) = (0, 0, 0);
    for (port, off, len) in &segs {
        let end = off + *len as u64;
        let Some(list) = fpdus.get(port).filter(|l| end > l[0].0) else {
            continue; // the MPA Request or Reply
        };
        let i = list.partition_point(|&(_, e)| e <= *off);
        let (s, e) = list[i];
        if (s, e) == (*off, end) {
            whole += 1;
        } else if s <= *off && end <= e {
            split_parts += 1;
        } else {
            straddling += 1;
        }
    }
    println!(
        "{} data segments: {whole} carry exactly one FPDU, {split_parts} part of one, \
         {straddling} bytes of two",
        segs.len()
    );
    (whole, split_parts, straddling)
}

#[test]
fn one_fpdu_per_segment() {
    let mut p = captured_pair(1500);
    // B's queue is small and B reads slowly, so B's TCP window closes and reopens in
    // pieces smaller than an FPDU: smoltcp then sends what fits.
    p.b.stream_cfg.rx_queue_bytes = 16 * 1024;
    let ((ca, ea), (_, eb)) = establish(&mut p, with_crc());
    let m = ea.established().unwrap().mulpdu;
    let mut ab = Flow::ddp(41, m, 3000);
    let mut ba = Flow::ddp(42, m, 3000);
    assert!(p.run_until(Duration::from_secs(600), |_| {
        ab.push(&ea);
        ba.push(&eb);
        // One ULPDU per step: B's window reopens by less than an FPDU at a time.
        ab.pull_n(&eb, 1);
        ba.pull(&ea);
        ab.done() && ba.done()
    }));
    let pcap = close_and_capture(p, ca);
    let (whole, _, straddling) = segments_per_fpdu(&pcap, 6000);
    assert_eq!(straddling, 0, "a segment carried bytes of two FPDUs");
    assert!(whole >= 3000, "{whole}");
}

/// MULPDU-sized ULPDUs one way at MTU 1500: the sender writes several FPDUs per round
/// (`StackStats::fpdus_batched`), and while the receiver reads slowly its window binds:
/// the sender writes ahead only what the window takes in whole segments, so no segment
/// carries bytes of two FPDUs. (Writing ahead without looking at the window put bytes of
/// two FPDUs in 2,370 of 3,375 segments here.)
#[test]
fn fpdus_written_ahead_stay_one_per_segment_when_the_window_binds() {
    const COUNT: u64 = 3000;
    let mut p = captured_pair(1500);
    p.b.stream_cfg.rx_queue_bytes = 16 * 1024;
    let ((ca, ea), (_, eb)) = establish(&mut p, with_crc());
    let m = ea.established().unwrap().mulpdu;
    let mut ab = Flow::ddp_fixed(44, m, COUNT);
    let mut step = 0u64;
    assert!(p.run_until(Duration::from_secs(600), |_| {
        step += 1;
        ab.push(&ea);
        // Bursts: B reads nothing for a while (its window closes), then everything.
        if step % 50 < 25 {
            ab.pull_n(&eb, 1);
        } else {
            ab.pull(&eb);
        }
        ab.done()
    }));
    let batched = p.a.stack.stats().fpdus_batched;
    let pcap = close_and_capture(p, ca);
    let (whole, _, straddling) = segments_per_fpdu(&pcap, COUNT);
    assert_eq!(straddling, 0, "a segment carried bytes of two FPDUs");
    assert!(batched >= COUNT / 4, "only {batched} FPDUs written ahead");
    assert!(whole as u64 >= COUNT * 3 / 4, "{whole} whole of {COUNT}");
    println!("{batched} FPDUs written ahead");
}

/// Bulk MULPDU-sized ULPDUs at MTU 65000 with the default 256 KiB socket buffers (a
/// window of four segments) and a receiver that keeps up: the receiver's ACKs leave after
/// its stack handed the bytes to the upper, so they advertise the window that reopened,
/// and the sender's window edge seldom falls inside an FPDU: FPDUs leave whole. (When the
/// ACKs left before the consumption, 170 of these 400 FPDUs left as two segments.)
#[test]
fn full_sized_fpdus_leave_whole_at_a_large_mtu() {
    const COUNT: u64 = 400;
    let mut p = captured_pair(65000);
    let ((ca, ea), (_, eb)) = establish(&mut p, with_crc());
    let m = ea.established().unwrap().mulpdu;
    let mut ab = Flow::ddp_fixed(43, m, COUNT);
    assert!(p.run_until(Duration::from_secs(60), |_| {
        ab.push(&ea);
        ab.pull(&eb);
        ab.done()
    }));
    let pcap = close_and_capture(p, ca);
    let (whole, split_parts, straddling) = segments_per_fpdu(&pcap, COUNT);
    assert_eq!(straddling, 0, "a segment carried bytes of two FPDUs");
    assert!(
        whole as u64 * 100 >= COUNT * 95,
        "{whole} of {COUNT} FPDUs left whole ({split_parts} pieces of split ones)"
    );
}

/// Backlog 2: three connections at once all get TCP (the third SYN is held for the
/// next poll, when the backlog still has room), but the third Request finds the
/// backlog full and gets the reject Reply; a connection opened while the backlog is
/// full is refused (no socket in LISTEN); deciding a request frees a place again.
#[test]
fn backlog_full_rejects_or_refuses_then_rearms() {
    let mut p = mem_pair(1500);
    p.b.stack.listen(PORT, 2, None).unwrap();
    let now = p.now;
    let c: Vec<ConnId> = (0..3)
        .map(|_| p.a.connect(2, PORT, params(b"", 1, 1), now).unwrap().0)
        .collect();
    assert!(p.run_until(Duration::from_secs(5), |p| {
        p.b.requests.len() == 2 && p.a.final_of(c[2]).is_some()
    }));
    assert_eq!(
        p.a.final_of(c[2]),
        Some(ConnEvent::Failed(ConnError::Rejected {
            private_data: Vec::new()
        }))
    );
    assert_eq!(p.b.stack.stats().backlog_rejects, 1);
    assert_eq!(p.b.stack.stats().syns_held, 1);
    let now = p.now;
    let (full, _) = p.a.connect(2, PORT, params(b"", 1, 1), now).unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| p.a.final_of(full).is_some()));
    assert_eq!(
        p.a.final_of(full),
        Some(ConnEvent::Failed(ConnError::Refused))
    );
    // Deciding one frees a place in the backlog.
    let (_b0, _) = p.b.accept_next(b"", 1, 1).unwrap().unwrap();
    let now = p.now;
    let (c3, _) = p.a.connect(2, PORT, params(b"", 1, 1), now).unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| p.b.requests.len() == 2));
    let r = p.b.requests.pop_back().unwrap();
    assert_eq!(r.remote.ip(), &addr(1));
    assert!(p.a.final_of(c3).is_none(), "the new connection is pending");
    // Rejecting frees one too.
    let r1 = p.b.requests.pop_front().unwrap();
    p.b.stack.reject(r1.conn, b"no").unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| p.a.final_of(c[1]).is_some()));
    assert_eq!(
        p.a.final_of(c[1]),
        Some(ConnEvent::Failed(ConnError::Rejected {
            private_data: b"no".to_vec()
        }))
    );
}

#[test]
fn abortive_close_resets_the_peer_and_responder_close_disconnects() {
    let mut p = mem_pair(1500);
    p.b.stack.listen(PORT, 4, None).unwrap();
    let ((ca, _), (cb, _)) = establish(&mut p, None);
    p.a.stack.close(ca, CloseMode::Abortive).unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| p.b.final_of(cb).is_some()));
    assert_eq!(p.a.final_of(ca), Some(ConnEvent::Closed));
    assert_eq!(p.b.final_of(cb), Some(ConnEvent::Failed(ConnError::Reset)));
    assert!(p.a.stack.close(ca, CloseMode::Graceful).is_err());

    let ((ca, ea), (cb, eb)) = establish(&mut p, None);
    // The responder may send only after the initiator's first FPDU (RFC 5044 7.1.2).
    ea.send(b"first", std::time::Duration::ZERO).unwrap();
    assert!(p.run_until(Duration::from_secs(5), |_| eb.try_recv().is_ok()));
    eb.send(b"last words", std::time::Duration::ZERO).unwrap();
    eb.mark_closed();
    p.b.stack.close(cb, CloseMode::Graceful).unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| {
        p.a.final_of(ca).is_some() && p.b.final_of(cb).is_some()
    }));
    let ev: Vec<ConnEvent> = p.a.events_of(ca).into_iter().skip(1).collect();
    assert_eq!(ev, vec![ConnEvent::Disconnected, ConnEvent::Closed]);
    assert_eq!(p.b.events_of(cb).last(), Some(&ConnEvent::Closed));
    assert_eq!(ea.try_recv().unwrap(), b"last words");
    assert_eq!(
        ea.try_recv(),
        Err(softiwarp::transport::stream::RecvError::Closed)
    );
}

#[test]
fn link_gone_fails_every_connection() {
    let mut p = mem_pair(1500);
    let ctl: MemoryControl = p.a.stack.link().control();
    p.b.stack.listen(PORT, 4, None).unwrap();
    let ((c1, _), _) = establish(&mut p, None);
    let ((c2, e2), _) = establish(&mut p, None);
    p.a.stack.listen(PORT, 4, None).unwrap();
    ctl.remove();
    p.step();
    assert!(p
        .a
        .link_events
        .iter()
        .any(|e| matches!(e, softiwarp::link::LinkEvent::Gone(_))));
    for c in [c1, c2] {
        assert!(matches!(
            p.a.final_of(c),
            Some(ConnEvent::Failed(ConnError::DeviceGone(_)))
        ));
    }
    assert!(matches!(
        e2.try_send(b"x"),
        Err(softiwarp::transport::stream::SendError::Failed(
            ConnError::DeviceGone(_)
        ))
    ));
    assert_eq!(p.a.stack.connection_count(), 0);
    assert!(p.a.stack.poll(p.now).is_none());
    assert!(matches!(
        p.a.stack.listen(PORT + 1, 1, None),
        Err(softiwarp::transport::StackError::Gone(_))
    ));
}

#[test]
fn close_while_connecting() {
    let mut p = mem_pair(1500);
    let now = p.now;
    // Nobody answers ARP for host 9: the SYN never leaves; close ends it at once.
    let (c, e) = p.a.connect(9, PORT, params(b"", 1, 1), now).unwrap();
    p.run_for(Duration::from_millis(50));
    assert_eq!(
        p.a.stack.tcp_state(c),
        Some(smoltcp::socket::tcp::State::SynSent)
    );
    p.a.stack.close(c, CloseMode::Graceful).unwrap();
    p.step();
    assert_eq!(p.a.final_of(c), Some(ConnEvent::Closed));
    assert_eq!(e.ended(), Some(None));
    // Its RST cannot be sent (no ARP answer): the socket goes after a second anyway.
    p.run_for(Duration::from_millis(1100));
    assert_eq!(p.a.stack.connection_count(), 0);
    // An abortive close of a pending connect:
    let now = p.now;
    let (c, _) = p.a.connect(9, PORT, params(b"", 1, 1), now).unwrap();
    p.a.stack.close(c, CloseMode::Abortive).unwrap();
    p.step();
    assert_eq!(p.a.final_of(c), Some(ConnEvent::Closed));
}

/// An upper that, like a QP, ends its stream at the first ULPDU that starts like a
/// Terminate (RDMAP opcode 7), and at the first other ULPDU finds an error and queues
/// `own` (its Terminate) if it has one.
struct EndsItsStream {
    ended: bool,
    own: Option<Vec<u8>>,
    queued: Option<Vec<u8>>,
}

impl softiwarp::transport::Ulp for EndsItsStream {
    fn on_established(&mut self, _: &softiwarp::transport::Established) {}
    fn rx_room(&mut self) -> usize {
        usize::MAX
    }
    fn on_ulpdu(&mut self, ulpdu: Vec<u8>) {
        if !self.ended {
            self.ended = true;
            if !ddp_rdmap::Header::is_terminate(&ulpdu) {
                self.queued = self.own.take();
            }
        }
    }
    fn on_ulpdu_in_place(&mut self, ulpdu: &[u8]) -> bool {
        self.on_ulpdu(ulpdu.to_vec());
        true
    }
    fn poll_ulpdu(
        &mut self,
        _: usize,
        _: &mut softiwarp::transport::EmitUlpdu<'_>,
    ) -> Result<bool, softiwarp::transport::mpa_conn::CallError> {
        Ok(false)
    }
    fn poll_terminate(&mut self) -> Option<Vec<u8>> {
        self.queued.take()
    }
    fn stream_ended(&mut self) -> bool {
        self.ended
    }
    fn on_closed(&mut self) {}
    fn on_error(&mut self, _: &ConnError) {}
}

/// An untagged ULPDU (DDP `T=0 L DV=1`, RDMAP `RV=1 opcode`) on `qn`, MSN 1, MO 0.
fn untagged_ulpdu(opcode: u8, qn: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0x41, 0x40 | opcode, 0, 0, 0, 0];
    v.extend(qn.to_be_bytes());
    v.extend(1u32.to_be_bytes());
    v.extend(0u32.to_be_bytes());
    v.extend(payload);
    v
}

/// A (a stream) sends `first`, then an 18-octet ULPDU whose FPDU B's receive hook
/// corrupts; B's upper is [`EndsItsStream`] with `own`. Returns A's final event and
/// B's count of Terminates sent.
fn bad_fpdu_behind(first: &[u8], own: Option<Vec<u8>>) -> (Option<ConnEvent>, u64) {
    assert_eq!(first.len(), 18, "the second FPDU starts at 24 + 24");
    let mut p = mem_pair(1500);
    p.b.stack.listen(PORT, 4, None).unwrap();
    let now = p.now;
    let params = MpaParams {
        settings: with_crc(),
        ..params(b"", 1, 1)
    };
    let (ca, ea) = p.a.connect(2, PORT, params, now).unwrap();
    assert!(p.run_until(Duration::from_secs(10), |p| !p.b.requests.is_empty()));
    let cb = p.b.requests.pop_front().unwrap().conn;
    let upper = EndsItsStream {
        ended: false,
        own,
        queued: None,
    };
    p.b.stack.accept(cb, b"", 1, 1, Box::new(upper)).unwrap();
    assert!(p.run_until(Duration::from_secs(10), |_| ea.established().is_some()));
    // A's stream to B: the 24-octet Request, the first FPDU (2 + 18 + CRC 4 octets),
    // then the second FPDU, whose ULPDU's 7th octet is flipped.
    p.b.stack.set_rx_hook(cb, flip_at(24 + 24 + 8)).unwrap();
    ea.try_send(first).unwrap();
    ea.try_send(&untagged_ulpdu(3, 0, &[])).unwrap();
    assert!(p.run_until(Duration::from_secs(30), |p| {
        p.a.final_of(ca).is_some() && p.b.final_of(cb).is_some()
    }));
    (p.a.final_of(ca), p.b.stack.stats().terminates_sent)
}

/// Found by the rx_path fuzz target: a Terminate the stack cannot read (opcode 7 on
/// QN 0: `ulpdu::terminate_cause` wants QN 2, but a QP takes it as the peer's
/// Terminate, RFC 5040 §7) followed by an FPDU with a bad CRC. The stack answered the bad FPDU with the LLP CRC
/// Terminate, so the peer's Terminate got one; now nothing is sent (then the RST).
#[test]
fn a_bad_fpdu_behind_a_terminate_the_upper_took_is_not_answered() {
    let (a_final, sent) = bad_fpdu_behind(&untagged_ulpdu(7, 0, &[]), None);
    assert_eq!(sent, 0);
    assert_eq!(a_final, Some(ConnEvent::Failed(ConnError::Reset)));
}

/// The upper found an error in the ULPDU before the bad FPDU and queued its Terminate:
/// that one goes out (the first error in the stream), not MPA's CRC Terminate.
#[test]
fn a_bad_fpdu_behind_the_uppers_own_error_sends_the_uppers_terminate() {
    use ddp_rdmap::terminate::{ErrorCause, RdmapProtectionCode};
    let cause = ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::AccessRightsViolation);
    let t = ddp_rdmap::Ulpdu::terminate(cause, 1);
    let mut own = vec![0u8; t.buffer_len()];
    t.emit(&mut own).unwrap();
    let (a_final, sent) = bad_fpdu_behind(&untagged_ulpdu(3, 0, &[]), Some(own));
    assert_eq!(sent, 1);
    assert_eq!(
        a_final,
        Some(ConnEvent::Failed(ConnError::TerminateReceived(cause)))
    );
}
