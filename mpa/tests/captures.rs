//! End to end over the real captures, through the public API only, the way a
//! dissector would: read the Request and the Reply from the front of each
//! direction's byte stream, work out the framing from them, deframe the rest.

#[path = "../src/test_vectors.rs"]
mod test_vectors;

use mpa::deframer::{CrcStatus, Deframer, DeframerConfig};
use mpa::negotiate::{self, CrcPolicy, LocalSettings, Response};
use mpa::wire::{FrameKind, Limits, Startup, StartupReader};
use test_vectors::*;

/// Reads the MPA frame at the front of `stream` (fed in `chunk`-sized
/// pieces); returns it and the octets behind it.
fn split_startup(stream: &[u8], kind: FrameKind, chunk: usize) -> (mpa::wire::Repr, Vec<u8>) {
    let mut reader = StartupReader::new(Some(kind), Limits::default());
    for (i, piece) in stream.chunks(chunk).enumerate() {
        if let Startup::Complete { frame, rest } = reader.push(piece).unwrap() {
            let mut tail = rest.to_vec();
            tail.extend_from_slice(&stream[((i + 1) * chunk).min(stream.len())..]);
            return (frame, tail);
        }
    }
    panic!("no complete frame");
}

#[test]
fn crc_capture_end_to_end() {
    let ini_stream = unhex(CRC_INITIATOR_STREAM);
    let rsp_stream = unhex(CRC_RESPONDER_STREAM);
    for chunk in [1usize, 7, 24, 100, 4096] {
        let (request, ini_fpdus) = split_startup(&ini_stream, FrameKind::Request, chunk);
        let (reply, rsp_fpdus) = split_startup(&rsp_stream, FrameKind::Reply, chunk);
        assert_eq!(ini_fpdus, &ini_stream[24..]);
        assert_eq!(rsp_fpdus, &rsp_stream[24..]);

        // Our responder, asked the same, answers with the captured Reply.
        let Response::Accept {
            agreed: responder,
            reply: ours,
        } = negotiate::respond(&LocalSettings::default(), &request).unwrap()
        else {
            panic!("rejected")
        };
        assert_eq!(ours, reply);
        // The initiator's view of the captured Reply.
        let initiator_settings = LocalSettings {
            crc: CrcPolicy::Wanted,
            ..LocalSettings::default()
        };
        let initiator = negotiate::complete(&initiator_settings, &reply).unwrap();
        assert!(initiator.crc && responder.crc);
        assert!(!initiator.markers_rx && !initiator.markers_tx);

        for (fpdus, framing, table) in [
            (&ini_fpdus, responder.rx_framing(), CRC_INITIATOR_FPDUS),
            (&rsp_fpdus, initiator.rx_framing(), CRC_RESPONDER_FPDUS),
        ] {
            let mut cfg = DeframerConfig::new(framing);
            cfg.offset_base = 24;
            let mut deframer = Deframer::new(cfg);
            let mut got = Vec::new();
            for piece in fpdus.chunks(chunk) {
                deframer.feed(piece, |item| {
                    let fpdu = item.unwrap();
                    got.push((
                        fpdu.offset - 24,
                        fpdu.ulpdu.len() as u16,
                        fpdu.wire_len,
                        fpdu.crc,
                    ));
                });
            }
            let want: Vec<_> = table
                .iter()
                .map(|&(o, l, w, c)| (o, l, w, CrcStatus::Good(c)))
                .collect();
            assert_eq!(got, want, "chunk {chunk}");
        }
    }
}

/// bad-crc.pcap through the same path: exactly the first initiator FPDU fails.
#[test]
fn bad_crc_capture_end_to_end() {
    let stream = unhex(BAD_CRC_INITIATOR_STREAM);
    let (request, fpdus) = split_startup(&stream, FrameKind::Request, 24);
    assert!(request.crc);
    let Response::Accept { agreed, .. } =
        negotiate::respond(&LocalSettings::default(), &request).unwrap()
    else {
        panic!("rejected")
    };
    let mut deframer = Deframer::new(DeframerConfig::new(agreed.rx_framing()));
    let mut results = Vec::new();
    deframer.feed(&fpdus, |item| {
        results.push(item.map(|f| f.offset).map_err(|e| e.offset()))
    });
    assert_eq!(results.len(), CRC_INITIATOR_FPDUS.len());
    assert_eq!(results[0], Err(0));
    let good: Vec<_> = CRC_INITIATOR_FPDUS[1..].iter().map(|r| Ok(r.0)).collect();
    assert_eq!(&results[1..], &good[..]);
}

/// The p2p capture: the initiator's first FPDU after the Request is the RTR
/// (a zero-length tagged RDMA Write, ULPDU_Length 14), no CRC.
#[test]
fn p2p_capture_rtr() {
    let mut stream = unhex(P2P_REQUEST);
    stream.extend_from_slice(&unhex(P2P_RTR_FPDU));
    let (request, rest) = split_startup(&stream, FrameKind::Request, 5);
    let Response::Accept { agreed, reply } =
        negotiate::respond(&LocalSettings::default(), &request).unwrap()
    else {
        panic!("rejected")
    };
    assert_eq!(reply.to_bytes().unwrap(), unhex(P2P_REPLY));
    assert_eq!(agreed.rtr, Some(mpa::wire::RtrKind::Write));
    let mut deframer = Deframer::new(DeframerConfig::new(agreed.rx_framing()));
    let mut ulpdus = Vec::new();
    deframer.feed(&rest, |item| ulpdus.push(item.unwrap().ulpdu.to_vec()));
    assert_eq!(
        ulpdus,
        vec![vec![0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]]
    );
}
