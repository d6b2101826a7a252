//! Receive-side checks: every error path with its exact Terminate layer / error
//! type / error code (RFC 5041 §7, RFC 5040 §4.8).

use ddp_rdmap::ddp::BufferModel;
use ddp_rdmap::rdmap::ReadRequestRepr;
use ddp_rdmap::reassembly::{check_read_request, check_tagged, Accepted, Receiver, UntaggedQueue};
use ddp_rdmap::terminate::{
    DdpTaggedCode, DdpUntaggedCode, ErrorCause, RdmapOperationCode, RdmapProtectionCode,
};
use ddp_rdmap::{Header, Opcode, Ulpdu};

fn untagged(opcode: Opcode, qn: u32, msn: u32, mo: u32, last: bool) -> Header {
    Header {
        opcode,
        last,
        buffer: BufferModel::Untagged {
            rsvd_ulp: 0,
            qn,
            msn,
            mo,
        },
    }
}

fn tagged(opcode: Opcode, to: u64, last: bool) -> Header {
    Header {
        opcode,
        last,
        buffer: BufferModel::Tagged { stag: 0x100, to },
    }
}

/// (layer, etype, code) of a cause.
fn triple(c: ErrorCause) -> (u8, u8, u8) {
    (c.layer_value(), c.etype(), c.code())
}

#[test]
fn error_table() {
    // Each case: a receiver with one 100-byte QN 0 buffer, the segments fed before,
    // the offending segment, the expected (layer, etype, code).
    type Seg = (Header, u32);
    type Case = (&'static str, Vec<Seg>, Seg, (u8, u8, u8));
    let cases: Vec<Case> = vec![
        (
            "QN 5 does not exist",
            vec![],
            (untagged(Opcode::Send, 5, 1, 0, true), 1),
            (1, 2, 0x01),
        ),
        (
            "QN 3 without atomics",
            vec![],
            (untagged(Opcode::Send, 3, 1, 0, true), 1),
            (1, 2, 0x01),
        ),
        (
            "Send on QN 1",
            vec![],
            (untagged(Opcode::Send, 1, 1, 0, true), 1),
            (1, 2, 0x01),
        ),
        (
            "Read Request on QN 0",
            vec![],
            (untagged(Opcode::ReadRequest, 0, 1, 0, true), 28),
            (1, 2, 0x01),
        ),
        (
            "Terminate on QN 0",
            vec![],
            (untagged(Opcode::Terminate, 0, 1, 0, true), 4),
            (1, 2, 0x01),
        ),
        (
            "MSN 0 is behind MSN 1",
            vec![],
            (untagged(Opcode::Send, 0, 0, 0, true), 1),
            (1, 2, 0x03),
        ),
        (
            "MSN 1 again after it completed",
            vec![(untagged(Opcode::Send, 0, 1, 0, true), 10)],
            (untagged(Opcode::Send, 0, 1, 0, true), 1),
            (1, 2, 0x03),
        ),
        (
            "MSN 2 beyond the one posted buffer",
            vec![],
            (untagged(Opcode::Send, 0, 2, 0, true), 1),
            (1, 2, 0x02),
        ),
        (
            "MSN 2 after the only buffer was used",
            vec![(untagged(Opcode::Send, 0, 1, 0, true), 10)],
            (untagged(Opcode::Send, 0, 2, 0, true), 1),
            (1, 2, 0x02),
        ),
        (
            "continuation without first segment",
            vec![],
            (untagged(Opcode::Send, 0, 1, 50, true), 1),
            (1, 2, 0x04),
        ),
        (
            "MO gap",
            vec![(untagged(Opcode::Send, 0, 1, 0, false), 10)],
            (untagged(Opcode::Send, 0, 1, 11, true), 1),
            (1, 2, 0x04),
        ),
        (
            "MO overlap",
            vec![(untagged(Opcode::Send, 0, 1, 0, false), 10)],
            (untagged(Opcode::Send, 0, 1, 9, true), 1),
            (1, 2, 0x04),
        ),
        (
            "new message restarts MO 0 mid-message",
            vec![(untagged(Opcode::Send, 0, 1, 0, false), 10)],
            (untagged(Opcode::Send, 0, 1, 0, true), 1),
            (1, 2, 0x04),
        ),
        (
            "message too long at once",
            vec![],
            (untagged(Opcode::Send, 0, 1, 0, true), 101),
            (1, 2, 0x05),
        ),
        (
            "message too long on its last segment",
            vec![(untagged(Opcode::Send, 0, 1, 0, false), 60)],
            (untagged(Opcode::Send, 0, 1, 60, true), 41),
            (1, 2, 0x05),
        ),
        (
            "Read Request with no IRD buffer",
            vec![],
            (untagged(Opcode::ReadRequest, 1, 1, 0, true), 28),
            (1, 2, 0x02),
        ),
        (
            "TO wrap",
            vec![],
            (tagged(Opcode::Write, u64::MAX - 1, true), 3),
            (1, 1, 0x03),
        ),
        (
            "atomic opcode without atomics",
            vec![],
            (untagged(Opcode::AtomicRequest, 1, 1, 0, true), 52),
            (0, 2, 0x06),
        ),
        (
            "atomic response without atomics",
            vec![],
            (untagged(Opcode::AtomicResponse, 3, 1, 0, true), 12),
            (0, 2, 0x06),
        ),
    ];
    for (name, before, (h, len), want) in cases {
        let mut r = Receiver::new(false);
        r.post_buffer(0, 100).unwrap();
        for (bh, blen) in before {
            r.handle(&bh, blen)
                .unwrap_or_else(|e| panic!("{name}: setup failed: {e}"));
        }
        let snapshot = r.clone();
        let err = r.handle(&h, len).expect_err(name);
        assert_eq!(triple(err), want, "{name}: {err}");
        assert_eq!(r, snapshot, "{name}: state changed on error");
    }
}

#[test]
fn named_causes() {
    let mut r = Receiver::new(false);
    assert_eq!(
        r.handle(&untagged(Opcode::Send, 0, 1, 0, true), 0),
        Err(ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidMsnNoBuffer))
    );
    assert_eq!(
        r.handle(&untagged(Opcode::Send, 7, 1, 0, true), 0),
        Err(ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidQn))
    );
    assert_eq!(
        check_tagged(u64::MAX, 2),
        Err(ErrorCause::DdpTagged(DdpTaggedCode::ToWrap))
    );
    assert_eq!(check_tagged(u64::MAX, 1), Ok(()));
    assert_eq!(check_tagged(u64::MAX, 0), Ok(()));
    assert_eq!(
        r.handle(&untagged(Opcode::AtomicRequest, 1, 1, 0, true), 52),
        Err(ErrorCause::RdmapRemoteOperation(
            RdmapOperationCode::UnexpectedOpcode
        ))
    );
    let rr = ReadRequestRepr {
        sink_stag: 1,
        sink_to: 0,
        size: 16,
        src_stag: 2,
        src_to: u64::MAX - 8,
    };
    assert_eq!(
        check_read_request(&rr),
        Err(ErrorCause::RdmapRemoteProtection(
            RdmapProtectionCode::ToWrap
        ))
    );
    let rr = ReadRequestRepr {
        src_to: 0,
        sink_to: u64::MAX,
        ..rr
    };
    assert_eq!(
        check_read_request(&rr),
        Err(ErrorCause::RdmapRemoteProtection(
            RdmapProtectionCode::ToWrap
        ))
    );
    let rr = ReadRequestRepr {
        sink_to: u64::MAX - 15,
        ..rr
    };
    assert_eq!(check_read_request(&rr), Ok(()));
    let rr = ReadRequestRepr {
        size: 0,
        sink_to: u64::MAX,
        src_to: u64::MAX,
        ..rr
    };
    assert_eq!(check_read_request(&rr), Ok(()));
}

#[test]
fn multi_segment_send_and_msn_advance() {
    let mut r = Receiver::new(false);
    r.post_buffer(0, 3000).unwrap();
    r.post_buffer(0, 10).unwrap();
    let a = r
        .handle(&untagged(Opcode::Send, 0, 1, 0, false), 1424)
        .unwrap();
    let Accepted::Untagged {
        placement: p,
        opcode,
    } = a
    else {
        panic!()
    };
    assert_eq!(opcode, Opcode::Send);
    assert!(p.first && !p.last);
    assert_eq!(
        (p.qn, p.msn, p.mo, p.len, p.buffer_len),
        (0, 1, 0, 1424, 3000)
    );
    assert_eq!(r.queue(0).unwrap().expected_mo(), Some(1424));
    let Accepted::Untagged { placement: p, .. } = r
        .handle(&untagged(Opcode::Send, 0, 1, 1424, true), 1000)
        .unwrap()
    else {
        panic!()
    };
    assert!(!p.first && p.last);
    let q = r.queue(0).unwrap();
    assert_eq!((q.next_msn(), q.posted(), q.expected_mo()), (2, 1, None));
    // Next message uses the second buffer (10 bytes), an 8-byte Immediate Data.
    let Accepted::Untagged { placement: p, .. } = r
        .handle(&untagged(Opcode::ImmediateData, 0, 2, 0, true), 8)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!((p.msn, p.buffer_len), (2, 10));
    assert_eq!(r.queue(0).unwrap().posted(), 0);
}

#[test]
fn queues_are_independent() {
    let mut r = Receiver::new(true);
    r.post_buffer(0, 100).unwrap();
    r.post_buffer(1, 28).unwrap();
    r.post_buffer(3, 12).unwrap();
    assert!(r.post_buffer(4, 1).is_err());
    r.handle(&untagged(Opcode::ReadRequest, 1, 1, 0, true), 28)
        .unwrap();
    r.handle(&untagged(Opcode::Send, 0, 1, 0, true), 5).unwrap();
    r.handle(&untagged(Opcode::AtomicResponse, 3, 1, 0, true), 12)
        .unwrap();
    // QN 2 has its Terminate buffer posted from the start.
    assert_eq!(r.queue(2).unwrap().posted(), 1);
    r.handle(&untagged(Opcode::Terminate, 2, 1, 0, true), 4)
        .unwrap();
    for qn in 0..4 {
        assert_eq!(r.queue(qn).unwrap().next_msn(), 2, "qn {qn}");
    }
    assert!(r.queue(4).is_none());
    assert!(Receiver::new(false).queue(3).is_none());
}

#[test]
fn tagged_segments_pass_through() {
    let mut r = Receiver::new(false);
    let a = r
        .handle(&tagged(Opcode::ReadResponse, 0x1000, false), 1428)
        .unwrap();
    assert_eq!(
        a,
        Accepted::Tagged {
            opcode: Opcode::ReadResponse,
            stag: 0x100,
            to: 0x1000,
            len: 1428,
            last: false
        }
    );
}

#[test]
fn handle_ulpdu_counts_body_bytes() {
    // rping.pcap frame 11: a Read Request is 28 bytes after its DDP header.
    let rr: [u8; 46] = [
        0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0x52, 0xa5, 0x3c, 0, 0, 0,
        0x55, 0x83, 0xa4, 0xe0, 0x0f, 0x30, 0, 0, 0, 0x40, 0x79, 0xba, 0xa4, 0, 0, 0, 0x55, 0xd4,
        0x19, 0x28, 0xdd, 0x50,
    ];
    let u = Ulpdu::parse(&rr).unwrap();
    let mut r = Receiver::new(false);
    r.post_buffer(1, 27).unwrap();
    assert_eq!(
        r.handle_ulpdu(&u),
        Err(ErrorCause::DdpUntagged(DdpUntaggedCode::MessageTooLong))
    );
    let mut r = Receiver::new(false);
    r.post_buffer(1, 28).unwrap();
    assert!(r.handle_ulpdu(&u).is_ok());
}

#[test]
fn msn_wraps_modulo_2_32() {
    let mut q = UntaggedQueue::new();
    for _ in 0..3 {
        q.post_buffer(1);
    }
    assert_eq!(q.accept(0, 1, 0, 1, true).unwrap().msn, 1);
    // An MSN 2^31 away from the expected one counts as behind: out of range.
    assert_eq!(
        q.check(2u32.wrapping_add(1 << 31), 0, 1),
        Err(ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidMsnRange))
    );
    // A later posted buffer while MSN 2 is expected: skipped message.
    assert_eq!(
        q.check(3, 0, 1),
        Err(ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidMsnRange))
    );
    assert_eq!(q.check(2, 0, 1), Ok(1));
}
