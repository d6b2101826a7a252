//! TX segmentation (RFC 5041 §5): lengths around the segment size, the 64 KiB
//! messages of `shared/pcaps/ib_write_bw.pcap` and `ib_send_bw.pcap`, and errors.

use ddp_rdmap::segment::{
    allowed_lengths, segment_count, Message, Segment, SegmentError, Target, MAX_MULPDU,
};
use ddp_rdmap::{Header, Opcode};

/// MULPDU for a 1460-byte MSS (1448 with TCP timestamps): 1448 - 2 - 4 = 1442.
const MULPDU: usize = 1442;
const TAGGED_ROOM: u32 = 1442 - 14; // 1428
const UNTAGGED_ROOM: u32 = 1442 - 18; // 1424

fn write(len: u32) -> Message {
    Message {
        opcode: Opcode::Write,
        len,
        target: Target::Tagged {
            stag: 0xba44_2800,
            to: 0x7f7f_f9f3_f000,
        },
    }
}

fn send(len: u32) -> Message {
    Message {
        opcode: Opcode::Send,
        len,
        target: Target::Untagged {
            msn: 1,
            inv_stag: 0,
        },
    }
}

fn segs(m: Message) -> Vec<Segment> {
    m.segments(MULPDU).unwrap().collect()
}

fn bytes(h: &Header) -> Vec<u8> {
    h.to_bytes().unwrap()[..h.buffer_len()].to_vec()
}

#[test]
fn zero_length_is_one_last_segment() {
    let s = segs(write(0));
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].offset, s[0].len, s[0].ulpdu_len()), (0, 0, 14));
    assert!(s[0].header.last);
    let s = segs(send(0));
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].header.mo(), s[0].ulpdu_len()), (Some(0), 18));
    assert!(s[0].header.last);
    // The MPA peer-to-peer RTR: zero-length Write to STag 1, TO 0.
    let rtr = Message {
        opcode: Opcode::Write,
        len: 0,
        target: Target::Tagged { stag: 1, to: 0 },
    };
    let s = segs(rtr);
    assert_eq!(
        bytes(&s[0].header),
        [0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    );
}

#[test]
fn lengths_around_one_segment() {
    for (len, count) in [
        (1, 1),
        (TAGGED_ROOM - 1, 1),
        (TAGGED_ROOM, 1),
        (TAGGED_ROOM + 1, 2),
        (2 * TAGGED_ROOM, 2),
        (2 * TAGGED_ROOM + 1, 3),
    ] {
        let s = segs(write(len));
        assert_eq!(s.len(), count, "len {len}");
        assert_eq!(s.last().unwrap().offset + s.last().unwrap().len, len);
        assert!(s.iter().all(|g| g.ulpdu_len() <= MULPDU));
    }
    for (len, count) in [
        (1, 1),
        (UNTAGGED_ROOM - 1, 1),
        (UNTAGGED_ROOM, 1),
        (UNTAGGED_ROOM + 1, 2),
    ] {
        let s = segs(send(len));
        assert_eq!(s.len(), count, "len {len}");
    }
    // MULPDU - header - 1 payload bytes: one segment one byte short of full.
    let s = segs(write(TAGGED_ROOM - 1));
    assert_eq!(s[0].ulpdu_len(), MULPDU - 1);
    // Exactly full.
    let s = segs(write(TAGGED_ROOM));
    assert_eq!(s[0].ulpdu_len(), MULPDU);
    // One more byte: a full segment and a 1-byte last one.
    let s = segs(write(TAGGED_ROOM + 1));
    assert_eq!((s[0].len, s[1].len), (TAGGED_ROOM, 1));
    assert_eq!((s[0].header.last, s[1].header.last), (false, true));
    assert_eq!(
        s[1].header.to(),
        Some(0x7f7f_f9f3_f000 + u64::from(TAGGED_ROOM))
    );
}

#[test]
fn write_64k_matches_ib_write_bw_capture() {
    let s = segs(write(65536));
    assert_eq!(s.len(), 46);
    assert!(s[..45]
        .iter()
        .all(|g| g.len == 1428 && g.ulpdu_len() == 1442 && !g.header.last));
    assert_eq!(s[45].len, 65536 - 45 * 1428);
    assert_eq!(s[45].ulpdu_len(), 1290);
    // Headers exactly as siw sent them (ib_write_bw.pcap frames 34, 35, 99).
    assert_eq!(
        bytes(&s[0].header),
        [0x81, 0x40, 0xba, 0x44, 0x28, 0x00, 0, 0, 0x7f, 0x7f, 0xf9, 0xf3, 0xf0, 0x00]
    );
    assert_eq!(
        bytes(&s[1].header),
        [0x81, 0x40, 0xba, 0x44, 0x28, 0x00, 0, 0, 0x7f, 0x7f, 0xf9, 0xf3, 0xf5, 0x94]
    );
    assert_eq!(
        bytes(&s[45].header),
        [0xc1, 0x40, 0xba, 0x44, 0x28, 0x00, 0, 0, 0x7f, 0x7f, 0xf9, 0xf4, 0xeb, 0x04]
    );
}

#[test]
fn send_64k_matches_ib_send_bw_capture() {
    let s = segs(send(65536));
    assert_eq!(s.len(), 47);
    assert!(s[..46]
        .iter()
        .all(|g| g.len == 1424 && g.ulpdu_len() == 1442));
    assert_eq!((s[46].len, s[46].ulpdu_len()), (32, 50));
    for (i, g) in s.iter().enumerate() {
        assert_eq!(g.header.mo(), Some(i as u32 * 1424));
        assert_eq!((g.header.qn(), g.header.msn()), (Some(0), Some(1)));
    }
    // ib_send_bw.pcap frames 38 and 104.
    assert_eq!(
        bytes(&s[1].header),
        [0x01, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0x05, 0x90]
    );
    assert_eq!(
        bytes(&s[46].header),
        [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0xff, 0xe0]
    );
}

#[test]
fn invalidate_stag_and_queues() {
    let m = Message {
        opcode: Opcode::SendSEInvalidate,
        len: 10,
        target: Target::Untagged {
            msn: 9,
            inv_stag: 0x1234_5678,
        },
    };
    let s = segs(m);
    assert_eq!(s[0].header.invalidate_stag(), Some(0x1234_5678));
    assert_eq!(
        bytes(&s[0].header),
        [0x41, 0x46, 0x12, 0x34, 0x56, 0x78, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0]
    );
    // Non-invalidate opcodes send the reserved word as 0.
    let m = Message {
        opcode: Opcode::Send,
        ..m
    };
    assert_eq!(
        segs(m)[0].header.buffer,
        ddp_rdmap::ddp::BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: 0,
            msn: 9,
            mo: 0
        }
    );
    // Queue numbers follow the opcode.
    for (op, len, qn) in [
        (Opcode::ReadRequest, 28, 1),
        (Opcode::Terminate, 4, 2),
        (Opcode::ImmediateData, 8, 0),
        (Opcode::AtomicRequest, 52, 1),
        (Opcode::AtomicResponse, 12, 3),
    ] {
        let m = Message {
            opcode: op,
            len,
            target: Target::Untagged {
                msn: 1,
                inv_stag: 0,
            },
        };
        let s = segs(m);
        assert_eq!(
            (s.len(), s[0].header.qn(), s[0].header.last),
            (1, Some(qn), true)
        );
    }
}

#[test]
fn errors() {
    assert_eq!(
        write(1).segments(14).unwrap_err(),
        SegmentError::MulpduTooSmall {
            mulpdu: 14,
            header_len: 14
        }
    );
    assert_eq!(
        send(1).segments(18).unwrap_err(),
        SegmentError::MulpduTooSmall {
            mulpdu: 18,
            header_len: 18
        }
    );
    assert!(send(1).segments(19).is_ok());
    let bad = Message {
        opcode: Opcode::Write,
        len: 1,
        target: Target::Untagged {
            msn: 1,
            inv_stag: 0,
        },
    };
    assert_eq!(
        bad.segments(MULPDU).unwrap_err(),
        SegmentError::TargetMismatch {
            opcode: Opcode::Write
        }
    );
    let bad = Message {
        opcode: Opcode::Send,
        len: 1,
        target: Target::Tagged { stag: 1, to: 0 },
    };
    assert_eq!(
        bad.segments(MULPDU).unwrap_err(),
        SegmentError::TargetMismatch {
            opcode: Opcode::Send
        }
    );
    let rr = Message {
        opcode: Opcode::ReadRequest,
        len: 28,
        target: Target::Untagged {
            msn: 1,
            inv_stag: 0,
        },
    };
    assert_eq!(
        rr.segments(18 + 27).unwrap_err(),
        SegmentError::TooLongForOneSegment {
            opcode: Opcode::ReadRequest,
            len: 28,
            max: 27
        }
    );
    let wrap = Message {
        opcode: Opcode::Write,
        len: 2,
        target: Target::Tagged {
            stag: 1,
            to: u64::MAX,
        },
    };
    assert_eq!(
        wrap.segments(MULPDU).unwrap_err(),
        SegmentError::ToWrap {
            to: u64::MAX,
            len: 2
        }
    );
    // The last byte exactly at 2^64 - 1 is fine.
    let edge = Message {
        opcode: Opcode::Write,
        len: 1,
        target: Target::Tagged {
            stag: 1,
            to: u64::MAX,
        },
    };
    assert_eq!(edge.segments(MULPDU).unwrap().count(), 1);
}

#[test]
fn count_helper_and_exact_size() {
    assert_eq!(segment_count(0, 1428), 1);
    assert_eq!(segment_count(1428, 1428), 1);
    assert_eq!(segment_count(1429, 1428), 2);
    assert_eq!(segment_count(u32::MAX, 1), u32::MAX as usize);
    let it = write(65536).segments(MULPDU).unwrap();
    assert_eq!(it.len(), 46);
    // Largest message, 1-byte segments: the iterator is lazy.
    let m = Message {
        opcode: Opcode::Send,
        len: u32::MAX,
        target: Target::Untagged {
            msn: 1,
            inv_stag: 0,
        },
    };
    let mut it = m.segments(19).unwrap();
    assert_eq!(it.len(), u32::MAX as usize);
    assert_eq!(it.next().unwrap().len, 1);
}

/// MPA's ULPDU_Length is 16 bits (RFC 5044 §4.1): a MULPDU over 65535 is
/// refused with a typed error naming it, not used to build ULPDUs no FPDU
/// can carry.
#[test]
fn mulpdu_over_65535_is_rejected() {
    assert_eq!(MAX_MULPDU, 65535);
    assert_eq!(
        write(100_000).segments(65536).unwrap_err(),
        SegmentError::MulpduTooLarge {
            mulpdu: 65536,
            max: 65535
        }
    );
    assert_eq!(
        send(u32::MAX).segments(usize::MAX).unwrap_err(),
        SegmentError::MulpduTooLarge {
            mulpdu: usize::MAX,
            max: 65535
        }
    );
    assert_eq!(
        SegmentError::MulpduTooLarge {
            mulpdu: 65536,
            max: 65535
        }
        .to_string(),
        "MULPDU 65536 over 65535, the largest MPA ULPDU_Length"
    );
    // 65535 itself is fine: full segments of exactly 65535 bytes of ULPDU.
    let s: Vec<_> = write(100_000).segments(65535).unwrap().collect();
    assert_eq!(s.len(), 2);
    assert_eq!((s[0].len, s[0].ulpdu_len()), (65521, 65535));
    assert_eq!((s[1].offset, s[1].len), (65521, 100_000 - 65521));
    assert!(s.iter().all(|g| g.ulpdu_len() <= 65535));
}

/// The single-segment messages are one fixed RDMAP header: a Read Request is
/// 28 bytes (RFC 5040 §4.4), a Terminate 4, 20, 24, 32, 48 or 52 (RFC 5040
/// §4.8: control word, then DDP Segment Length and a 14- or 18-byte DDP header
/// with D, then a 28-byte RDMA header with R), Immediate Data 8, Atomic
/// Request 52 and Atomic Response 12 (RFC 7306). Other lengths are refused.
#[test]
fn single_segment_messages_have_fixed_lengths() {
    let untagged = Target::Untagged {
        msn: 1,
        inv_stag: 0,
    };
    let msg = |opcode, len| Message {
        opcode,
        len,
        target: untagged,
    };
    assert_eq!(allowed_lengths(Opcode::ReadRequest), Some(&[28u32][..]));
    assert_eq!(
        allowed_lengths(Opcode::Terminate),
        Some(&[4u32, 20, 24, 32, 48, 52][..])
    );
    assert_eq!(allowed_lengths(Opcode::ImmediateData), Some(&[8u32][..]));
    assert_eq!(allowed_lengths(Opcode::ImmediateDataSE), Some(&[8u32][..]));
    assert_eq!(allowed_lengths(Opcode::AtomicRequest), Some(&[52u32][..]));
    assert_eq!(allowed_lengths(Opcode::AtomicResponse), Some(&[12u32][..]));
    for op in [
        Opcode::Write,
        Opcode::ReadResponse,
        Opcode::Send,
        Opcode::SendInvalidate,
        Opcode::SendSE,
        Opcode::SendSEInvalidate,
    ] {
        assert_eq!(allowed_lengths(op), None, "{op}");
    }
    for (op, bad) in [
        (Opcode::ReadRequest, &[0u32, 1, 27, 29, 46, 1000][..]),
        (Opcode::Terminate, &[0, 3, 5, 19, 28, 53, 100, 1442][..]),
        (Opcode::ImmediateData, &[0, 7, 9][..]),
        (Opcode::ImmediateDataSE, &[4, 16][..]),
        (Opcode::AtomicRequest, &[0, 51, 53][..]),
        (Opcode::AtomicResponse, &[0, 11, 13][..]),
    ] {
        let allowed = allowed_lengths(op).unwrap();
        for &len in bad {
            assert_eq!(
                msg(op, len).segments(MULPDU).unwrap_err(),
                SegmentError::WrongLength {
                    opcode: op,
                    len,
                    allowed
                },
                "{op} len {len}"
            );
        }
        for &len in allowed {
            let s = segs(msg(op, len));
            assert_eq!((s.len(), s[0].len, s[0].header.last), (1, len, true));
        }
    }
    assert_eq!(
        msg(Opcode::ReadRequest, 0)
            .segments(MULPDU)
            .unwrap_err()
            .to_string(),
        format!(
            "{} of 0 bytes: its RDMAP header must be [28] bytes",
            Opcode::ReadRequest
        )
    );
}

/// `next_remainder_first` moves the message's one short segment to where it is asked
/// for: 64 KiB at 1428 payload bytes per segment is 45 full segments and 1276 bytes.
#[test]
fn remainder_first_moves_the_short_segment_and_keeps_the_count() {
    let m = write(65536);
    let mut it = m.segments(MULPDU).unwrap();
    assert_eq!(it.len(), 46);
    // Three full segments, then the remainder asked for, then the rest: all full.
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(it.next().unwrap());
    }
    got.push(it.next_remainder_first().unwrap());
    assert_eq!(it.len(), 42, "the count does not change");
    got.extend(it.by_ref());
    assert_eq!(got.len(), 46);
    assert_eq!(
        (got[3].offset, got[3].len),
        (3 * TAGGED_ROOM, 65536 - 45 * TAGGED_ROOM)
    );
    assert_eq!(got[3].len, 1276);
    assert!(!got[3].header.last);
    for (i, s) in got.iter().enumerate() {
        if i != 3 {
            assert_eq!(s.len, TAGGED_ROOM, "segment {i}");
        }
        // Contiguous and TO-consistent.
        let expected_offset = got[..i].iter().map(|s| s.len).sum::<u32>();
        assert_eq!(s.offset, expected_offset);
        assert_eq!(s.header.to(), Some(0x7f7f_f9f3_f000 + u64::from(s.offset)));
        assert_eq!(s.header.last, i == 45);
    }
    // Asking again once the rest is whole segments gives full ones.
    let mut it = m.segments(MULPDU).unwrap();
    let first = it.next_remainder_first().unwrap();
    assert_eq!((first.offset, first.len), (0, 1276));
    let second = it.next_remainder_first().unwrap();
    assert_eq!((second.offset, second.len), (1276, TAGGED_ROOM));
}

/// A message that is whole segments, one segment or empty is not changed; an untagged
/// message's short segment carries its MO.
#[test]
fn remainder_first_edges() {
    let whole = write(3 * TAGGED_ROOM);
    let mut it = whole.segments(MULPDU).unwrap();
    let s: Vec<_> = std::iter::from_fn(|| it.next_remainder_first()).collect();
    assert_eq!(s, segs(whole));
    for len in [0, 1, TAGGED_ROOM - 1, TAGGED_ROOM] {
        let mut it = write(len).segments(MULPDU).unwrap();
        let s: Vec<_> = std::iter::from_fn(|| it.next_remainder_first()).collect();
        assert_eq!(s, segs(write(len)), "len {len}");
    }
    let m = send(UNTAGGED_ROOM + 100);
    let mut it = m.segments(MULPDU).unwrap();
    let a = it.next_remainder_first().unwrap();
    let b = it.next_remainder_first().unwrap();
    assert!(it.next_remainder_first().is_none());
    assert_eq!((a.header.mo(), a.len, a.header.last), (Some(0), 100, false));
    assert_eq!(
        (b.header.mo(), b.len, b.header.last),
        (Some(100), UNTAGGED_ROOM, true)
    );
}
