//! Golden bytes: ULPDUs taken from the Linux siw captures in `shared/pcaps`
//! (hand-checked against Wireshark's decoding and the RFC layouts), and Terminate
//! messages built by hand from RFC 5040 §4.8.
//!
//! Each case: `deconstruct` (parse gives the right fields), `construct` (emit
//! reproduces the bytes exactly), `truncated` and `impossible_len` (every shorter
//! or longer length fails with the error naming the field).

use ddp_rdmap::ddp::BufferModel;
use ddp_rdmap::rdmap::ReadRequestRepr;
use ddp_rdmap::terminate::{
    self, DdpHeaderCopy, DdpTaggedCode, DdpUntaggedCode, ErrorCause, LlpCode, Offending,
    RdmapOperationCode, RdmapProtectionCode, TerminatedDdp,
};
use ddp_rdmap::{ulpdu, Body, Error, Field, Header, Opcode, Ulpdu};

/// rping.pcap frame 10 (client -> server): Send, L, QN 0, MSN 1, MO 0, 16 bytes of
/// rping's buffer advertisement (addr 0x55d41928dd50, rkey 0x79baa400, size 64).
const RPING_SEND_F10: [u8; 34] = [
    0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x55, 0xd4, 0x19, 0x28, 0xdd, 0x50, 0x79, 0xba, 0xa4, 0x00, 0x00, 0x00,
    0x00, 0x40,
];

/// rping.pcap frame 11 (server -> client): RDMA Read Request, QN 1, MSN 1, MO 0.
const RPING_READ_REQUEST_F11: [u8; 46] = [
    0x41, 0x41, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
    0x00, 0x00, 0x52, 0xa5, 0x3c, 0x00, 0x00, 0x00, 0x55, 0x83, 0xa4, 0xe0, 0x0f, 0x30, 0x00, 0x00,
    0x00, 0x40, 0x79, 0xba, 0xa4, 0x00, 0x00, 0x00, 0x55, 0xd4, 0x19, 0x28, 0xdd, 0x50,
];

/// rping.pcap frame 12 (client -> server): RDMA Read Response, L, STag 0x52a53c00,
/// TO 0x5583a4e00f30, 64 bytes.
const RPING_READ_RESPONSE_F12: [u8; 78] = [
    0xc1, 0x42, 0x52, 0xa5, 0x3c, 0x00, 0x00, 0x00, 0x55, 0x83, 0xa4, 0xe0, 0x0f, 0x30, 0x72, 0x64,
    0x6d, 0x61, 0x2d, 0x70, 0x69, 0x6e, 0x67, 0x2d, 0x30, 0x3a, 0x20, 0x41, 0x42, 0x43, 0x44, 0x45,
    0x46, 0x47, 0x48, 0x49, 0x4a, 0x4b, 0x4c, 0x4d, 0x4e, 0x4f, 0x50, 0x51, 0x52, 0x53, 0x54, 0x55,
    0x56, 0x57, 0x58, 0x59, 0x5a, 0x5b, 0x5c, 0x5d, 0x5e, 0x5f, 0x60, 0x61, 0x62, 0x63, 0x64, 0x65,
    0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f, 0x70, 0x71, 0x72, 0x00,
];

/// rping.pcap frame 15 (server -> client): RDMA Write, L, STag 0xd294a400,
/// TO 0x55d41928df30, 64 bytes.
const RPING_WRITE_F15: [u8; 78] = [
    0xc1, 0x40, 0xd2, 0x94, 0xa4, 0x00, 0x00, 0x00, 0x55, 0xd4, 0x19, 0x28, 0xdf, 0x30, 0x72, 0x64,
    0x6d, 0x61, 0x2d, 0x70, 0x69, 0x6e, 0x67, 0x2d, 0x30, 0x3a, 0x20, 0x41, 0x42, 0x43, 0x44, 0x45,
    0x46, 0x47, 0x48, 0x49, 0x4a, 0x4b, 0x4c, 0x4d, 0x4e, 0x4f, 0x50, 0x51, 0x52, 0x53, 0x54, 0x55,
    0x56, 0x57, 0x58, 0x59, 0x5a, 0x5b, 0x5c, 0x5d, 0x5e, 0x5f, 0x60, 0x61, 0x62, 0x63, 0x64, 0x65,
    0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f, 0x70, 0x71, 0x72, 0x00,
];

/// rping-srv_p2p-cli_p2p.pcap frame 10: the initiator's RTR, a zero-length RDMA
/// Write to STag 1, TO 0 (ULPDU length 14).
const P2P_RTR_F10: [u8; 14] = [
    0xc1, 0x40, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

/// ib_write_bw.pcap frame 35: second segment of a 64 KiB Write, L = 0,
/// STag 0xba442800, TO 0x7f7ff9f3f594 (first TO + 1428).
const WRITE_BW_F35_HEADER: [u8; 14] = [
    0x81, 0x40, 0xba, 0x44, 0x28, 0x00, 0x00, 0x00, 0x7f, 0x7f, 0xf9, 0xf3, 0xf5, 0x94,
];

/// ib_send_bw.pcap frame 38: second segment of a 64 KiB Send, L = 0, QN 0, MSN 1,
/// MO 0x590 (1424).
const SEND_BW_F38_HEADER: [u8; 18] = [
    0x01, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
    0x05, 0x90,
];

const RPING_PAYLOAD: &[u8] = b"rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr\0";

fn emit(u: &Ulpdu<'_>) -> Vec<u8> {
    let mut out = vec![0xee; u.buffer_len()];
    u.emit(&mut out).unwrap();
    out
}

fn assert_all_shorter_fail(bytes: &[u8]) {
    let hlen = if bytes[0] & 0x80 != 0 { 14 } else { 18 };
    for n in 0..bytes.len() {
        let r = Ulpdu::parse(&bytes[..n]);
        if n < hlen || single(bytes) {
            assert!(r.is_err(), "prefix of {n} bytes parsed");
        } else {
            // Data-carrying messages: a shorter ULPDU is a shorter payload.
            assert_eq!(r.unwrap().payload.len(), n - hlen);
        }
    }
}

fn single(bytes: &[u8]) -> bool {
    Opcode::from_u8(bytes[1] & 0xf).is_some_and(Opcode::is_single_segment)
}

#[test]
fn deconstruct_send() {
    let u = Ulpdu::parse(&RPING_SEND_F10).unwrap();
    assert_eq!(u.opcode(), Opcode::Send);
    assert!(u.last());
    assert_eq!(
        u.header.buffer,
        BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: 0,
            msn: 1,
            mo: 0
        }
    );
    assert_eq!(u.header.invalidate_stag(), None);
    assert_eq!(u.body, Body::None);
    assert_eq!(u.payload_range(), 18..34);
    assert_eq!(
        u.payload,
        &[0, 0, 0x55, 0xd4, 0x19, 0x28, 0xdd, 0x50, 0x79, 0xba, 0xa4, 0, 0, 0, 0, 0x40]
    );
    assert_eq!(u.ddp_payload_len(), 16);
}

#[test]
fn construct_send() {
    let u = Ulpdu::parse(&RPING_SEND_F10).unwrap();
    assert_eq!(emit(&u), RPING_SEND_F10);
    let h = Header {
        opcode: Opcode::Send,
        last: true,
        buffer: BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: 0,
            msn: 1,
            mo: 0,
        },
    };
    let mut b = [0u8; 18];
    h.emit(&mut b).unwrap();
    assert_eq!(b, RPING_SEND_F10[..18]);
}

#[test]
fn deconstruct_read_request() {
    let u = Ulpdu::parse(&RPING_READ_REQUEST_F11).unwrap();
    assert_eq!(u.opcode(), Opcode::ReadRequest);
    assert_eq!(
        (u.header.qn(), u.header.msn(), u.header.mo()),
        (Some(1), Some(1), Some(0))
    );
    assert_eq!(
        u.body,
        Body::ReadRequest(ReadRequestRepr {
            sink_stag: 0x52a5_3c00,
            sink_to: 0x5583_a4e0_0f30,
            size: 64,
            src_stag: 0x79ba_a400,
            src_to: 0x55d4_1928_dd50,
        })
    );
    assert!(u.payload.is_empty());
    assert_eq!(u.payload_range(), 46..46);
    assert_eq!(u.ddp_payload_len(), 28);
}

#[test]
fn construct_read_request() {
    let u = Ulpdu::parse(&RPING_READ_REQUEST_F11).unwrap();
    assert_eq!(emit(&u), RPING_READ_REQUEST_F11);
}

#[test]
fn deconstruct_read_response_and_write() {
    let u = Ulpdu::parse(&RPING_READ_RESPONSE_F12).unwrap();
    assert_eq!(u.opcode(), Opcode::ReadResponse);
    assert!(u.last());
    // The Read Response goes to the Read Request's sink.
    assert_eq!(
        (u.header.stag(), u.header.to()),
        (Some(0x52a5_3c00), Some(0x5583_a4e0_0f30))
    );
    assert_eq!(u.payload, RPING_PAYLOAD);
    assert_eq!(u.payload_range(), 14..78);

    let u = Ulpdu::parse(&RPING_WRITE_F15).unwrap();
    assert_eq!(u.opcode(), Opcode::Write);
    assert_eq!(
        u.header.buffer,
        BufferModel::Tagged {
            stag: 0xd294_a400,
            to: 0x55d4_1928_df30
        }
    );
    assert_eq!(u.payload, RPING_PAYLOAD);
}

#[test]
fn construct_read_response_and_write() {
    assert_eq!(
        emit(&Ulpdu::parse(&RPING_READ_RESPONSE_F12).unwrap()),
        RPING_READ_RESPONSE_F12
    );
    assert_eq!(
        emit(&Ulpdu::parse(&RPING_WRITE_F15).unwrap()),
        RPING_WRITE_F15
    );
}

#[test]
fn deconstruct_construct_zero_length_write_rtr() {
    let u = Ulpdu::parse(&P2P_RTR_F10).unwrap();
    assert_eq!(u.opcode(), Opcode::Write);
    assert!(u.last());
    assert_eq!((u.header.stag(), u.header.to()), (Some(1), Some(0)));
    assert!(u.payload.is_empty());
    assert_eq!(u.len, 14);
    assert_eq!(emit(&u), P2P_RTR_F10);
}

#[test]
fn deconstruct_construct_middle_segments() {
    let h = Header::parse(&WRITE_BW_F35_HEADER).unwrap();
    assert_eq!(h.opcode, Opcode::Write);
    assert!(!h.last);
    assert_eq!(
        (h.stag(), h.to()),
        (Some(0xba44_2800), Some(0x7f7f_f9f3_f000 + 1428))
    );
    assert_eq!(h.to_bytes().unwrap()[..14], WRITE_BW_F35_HEADER);

    let h = Header::parse(&SEND_BW_F38_HEADER).unwrap();
    assert_eq!(h.opcode, Opcode::Send);
    assert!(!h.last);
    assert_eq!((h.qn(), h.msn(), h.mo()), (Some(0), Some(1), Some(1424)));
    assert_eq!(h.to_bytes().unwrap(), SEND_BW_F38_HEADER);
}

#[test]
fn truncated() {
    // Every proper prefix shorter than the header, or of a ULPDU with a fixed-size
    // body, fails; a longer prefix of a Write/Send/Read Response is a shorter one.
    for bytes in [
        &RPING_SEND_F10[..],
        &RPING_READ_REQUEST_F11,
        &RPING_READ_RESPONSE_F12,
        &RPING_WRITE_F15,
        &P2P_RTR_F10,
    ] {
        assert_all_shorter_fail(bytes);
    }
    assert_eq!(
        Ulpdu::parse(&RPING_SEND_F10[..17]),
        Err(Error::Truncated {
            field: Field::DdpHeader,
            needed: 18,
            len: 17
        })
    );
    assert_eq!(
        Ulpdu::parse(&P2P_RTR_F10[..13]),
        Err(Error::Truncated {
            field: Field::DdpHeader,
            needed: 14,
            len: 13
        })
    );
    assert_eq!(
        Ulpdu::parse(&RPING_READ_REQUEST_F11[..40]),
        Err(Error::Truncated {
            field: Field::ReadRequest,
            needed: 28,
            len: 22
        })
    );
    // An untagged Send prefix that holds the header is a valid shorter Send.
    assert_eq!(
        Ulpdu::parse(&RPING_SEND_F10[..18]).unwrap().payload.len(),
        0
    );
}

#[test]
fn impossible_len() {
    // A Read Request with a byte of payload after its 28-byte header.
    let mut long = RPING_READ_REQUEST_F11.to_vec();
    long.push(0);
    let e = Ulpdu::parse(&long).unwrap_err();
    assert_eq!(
        e,
        Error::TrailingBytes {
            field: Field::ReadRequest,
            extra: 1
        }
    );
    assert_eq!(
        e.terminate_cause(),
        Some(ErrorCause::RdmapRemoteOperation(
            RdmapOperationCode::Unspecified
        ))
    );
    // The untagged Send header with T set claims a tagged layout: Send is not tagged.
    let mut b = RPING_SEND_F10;
    b[0] |= 0x80;
    assert_eq!(
        Ulpdu::parse(&b),
        Err(Error::TaggedMismatch {
            opcode: Opcode::Send,
            tagged: true
        })
    );
    // A Write with T clear.
    let mut b = RPING_WRITE_F15;
    b[0] &= !0x80;
    let e = Ulpdu::parse(&b).unwrap_err();
    assert_eq!(
        e.terminate_cause(),
        Some(ErrorCause::RdmapRemoteOperation(
            RdmapOperationCode::UnexpectedOpcode
        ))
    );
}

#[test]
fn version_errors_map_to_terminate_codes() {
    let mut b = RPING_WRITE_F15;
    b[0] = 0xc2; // DV 2
    let e = Ulpdu::parse(&b).unwrap_err();
    assert_eq!(
        e,
        Error::DdpVersion {
            dv: 2,
            tagged: true
        }
    );
    assert_eq!(
        e.terminate_cause(),
        Some(ErrorCause::DdpTagged(DdpTaggedCode::InvalidVersion))
    );
    let mut b = RPING_SEND_F10;
    b[0] = 0x40; // DV 0
    assert_eq!(
        Ulpdu::parse(&b).unwrap_err().terminate_cause(),
        Some(ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidVersion))
    );
    let mut b = RPING_SEND_F10;
    b[1] = 0x83; // RV 2
    let e = Ulpdu::parse(&b).unwrap_err();
    assert_eq!(e, Error::RdmapVersion { rv: 2 });
    assert_eq!(
        e.terminate_cause(),
        Some(ErrorCause::RdmapRemoteOperation(
            RdmapOperationCode::InvalidVersion
        ))
    );
    let mut b = RPING_SEND_F10;
    b[1] = 0x4e; // opcode 0xE
    assert_eq!(
        Ulpdu::parse(&b).unwrap_err().terminate_cause(),
        Some(ErrorCause::RdmapRemoteOperation(
            RdmapOperationCode::UnexpectedOpcode
        ))
    );
}

// ---- Terminate, built by hand from RFC 5040 §4.8 -------------------------------

/// Terminate for "DDP Untagged Buffer Error: Invalid MSN - MSN range is not valid"
/// on the Send of rping frame 10 (ULPDU length 34): QN 2, MSN 1, MO 0; control
/// 0x12 (layer 1, etype 2), 0x03, M|D; segment length 0x0022; the 18-byte header.
const TERM_DDP_MSN_RANGE: [u8; 42] = [
    0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, // DDP/RDMAP header
    0x12, 0x03, 0xc0, 0x00, // Layer 1 | EType 2, code 3, M D
    0x00, 0x22, // DDP Segment Length 34
    0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, // Terminated DDP Header
];

/// Terminate for "RDMAP Remote Protection Error: Invalid STag" on the Read Request
/// of rping frame 11 (length 46): control 0x01 0x00 M|D|R, length 0x002e, the
/// 18-byte DDP header, the 28-byte Read Request header.
fn term_rdmap_invalid_stag() -> Vec<u8> {
    let mut v = vec![0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0];
    v.extend_from_slice(&[0x01, 0x00, 0xe0, 0x00, 0x00, 0x2e]);
    v.extend_from_slice(&RPING_READ_REQUEST_F11);
    v
}

/// Terminate for an MPA CRC error: control 0x20 0x02, no flags.
const TERM_LLP_CRC: [u8; 22] = [
    0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0x20, 0x02, 0x00, 0x00,
];

/// Terminate for "DDP Tagged Buffer Error: Base or bounds violation" on the Write
/// of rping frame 15 (length 78 = 0x4e): 0x11 0x01 M|D, 0x004e, 14-byte header.
const TERM_DDP_TAGGED_BOUNDS: [u8; 38] = [
    0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0x11, 0x01, 0xc0, 0x00, 0x00, 0x4e,
    0xc1, 0x40, 0xd2, 0x94, 0xa4, 0x00, 0x00, 0x00, 0x55, 0xd4, 0x19, 0x28, 0xdf, 0x30,
];

/// What Linux siw sends for an RDMAP local catastrophic error: 0x00 0xff, no flags.
const TERM_SIW_LOCAL_CATASTROPHIC: [u8; 22] = [
    0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0x00, 0xff, 0x00, 0x00,
];

fn terminate_body(u: &Ulpdu<'_>) -> terminate::Repr {
    assert_eq!(u.opcode(), Opcode::Terminate);
    assert_eq!(
        (u.header.qn(), u.header.msn(), u.header.mo()),
        (Some(2), Some(1), Some(0))
    );
    match u.body {
        Body::Terminate(t) => t,
        other => panic!("not a Terminate body: {other:?}"),
    }
}

#[test]
fn terminate_deconstruct() {
    let u = Ulpdu::parse(&TERM_DDP_MSN_RANGE).unwrap();
    let t = terminate_body(&u);
    assert_eq!(
        t.cause,
        ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidMsnRange)
    );
    assert_eq!(
        (t.cause.layer_value(), t.cause.etype(), t.cause.code()),
        (1, 2, 3)
    );
    let ddp = t.ddp.unwrap();
    assert_eq!(ddp.segment_length, Some(34));
    assert_eq!(ddp.header.as_bytes(), &RPING_SEND_F10[..18]);
    assert_eq!(t.rdma_header, None);

    let bytes = term_rdmap_invalid_stag();
    let t = terminate_body(&Ulpdu::parse(&bytes).unwrap());
    assert_eq!(
        t.cause,
        ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::InvalidStag)
    );
    assert_eq!(t.ddp.unwrap().segment_length, Some(46));
    assert_eq!(t.rdma_header.unwrap(), RPING_READ_REQUEST_F11[18..]);

    let t = terminate_body(&Ulpdu::parse(&TERM_LLP_CRC).unwrap());
    assert_eq!(t, terminate::Repr::new(ErrorCause::Llp(LlpCode::CrcError)));

    let t = terminate_body(&Ulpdu::parse(&TERM_DDP_TAGGED_BOUNDS).unwrap());
    assert_eq!(
        t.cause,
        ErrorCause::DdpTagged(DdpTaggedCode::BaseOrBoundsViolation)
    );
    assert!(
        matches!(t.ddp.unwrap().header, DdpHeaderCopy::Tagged(h) if h == RPING_WRITE_F15[..14])
    );

    let t = terminate_body(&Ulpdu::parse(&TERM_SIW_LOCAL_CATASTROPHIC).unwrap());
    assert_eq!(t.cause, ErrorCause::RdmapLocalCatastrophic { code: 0xff });
}

#[test]
fn terminate_construct_with_builder() {
    let send = Ulpdu::parse(&RPING_SEND_F10).unwrap();
    let cases: Vec<(ErrorCause, Option<Offending<'_>>, Vec<u8>)> = vec![
        (
            ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidMsnRange),
            Some(send.offending(&RPING_SEND_F10)),
            TERM_DDP_MSN_RANGE.to_vec(),
        ),
        (
            ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::InvalidStag),
            Some(Offending {
                ulpdu_len: 46,
                bytes: &RPING_READ_REQUEST_F11,
            }),
            term_rdmap_invalid_stag(),
        ),
        (
            ErrorCause::Llp(LlpCode::CrcError),
            Some(Offending {
                ulpdu_len: 34,
                bytes: &RPING_SEND_F10,
            }),
            TERM_LLP_CRC.to_vec(),
        ),
        (
            ErrorCause::DdpTagged(DdpTaggedCode::BaseOrBoundsViolation),
            // Only the header of the Write is needed.
            Some(Offending {
                ulpdu_len: 78,
                bytes: &RPING_WRITE_F15[..14],
            }),
            TERM_DDP_TAGGED_BOUNDS.to_vec(),
        ),
        (
            ErrorCause::RdmapLocalCatastrophic { code: 0xff },
            Some(Offending {
                ulpdu_len: 34,
                bytes: &RPING_SEND_F10,
            }),
            TERM_SIW_LOCAL_CATASTROPHIC.to_vec(),
        ),
    ];
    for (cause, off, want) in cases {
        let body = terminate::Repr::for_error(cause, off);
        let u = Ulpdu {
            header: Header {
                opcode: Opcode::Terminate,
                last: true,
                buffer: BufferModel::Untagged {
                    rsvd_ulp: 0,
                    qn: 2,
                    msn: 1,
                    mo: 0,
                },
            },
            body: Body::Terminate(body),
            payload: &[],
            len: 0,
        };
        assert_eq!(emit(&u), want, "{cause}");
        assert_eq!(Ulpdu::parse(&want).unwrap().body, Body::Terminate(body));
    }
}

#[test]
fn terminate_builder_rules() {
    let rr = Offending {
        ulpdu_len: 46,
        bytes: &RPING_READ_REQUEST_F11,
    };
    // DDP errors never copy the RDMAP header, even for a Read Request.
    let t = terminate::Repr::for_error(
        ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidMsnRange),
        Some(rr),
    );
    assert!(t.ddp.is_some() && t.rdma_header.is_none());
    // RDMAP remote operation errors on a Read Request copy both.
    let t = terminate::Repr::for_error(
        ErrorCause::RdmapRemoteOperation(RdmapOperationCode::CatastrophicStream),
        Some(rr),
    );
    assert!(t.ddp.is_some() && t.rdma_header.is_some());
    // Only the DDP header of the Read Request available: D without R.
    let short = Offending {
        ulpdu_len: 46,
        bytes: &RPING_READ_REQUEST_F11[..18],
    };
    let t = terminate::Repr::for_error(
        ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::AccessRightsViolation),
        Some(short),
    );
    assert_eq!(
        t.ddp,
        Some(TerminatedDdp {
            segment_length: Some(46),
            header: DdpHeaderCopy::Untagged(RPING_READ_REQUEST_F11[..18].try_into().unwrap())
        })
    );
    assert_eq!(t.rdma_header, None);
    // Invalid DDP version: the layout is unknown, nothing is copied.
    let t = terminate::Repr::for_error(
        ErrorCause::DdpTagged(DdpTaggedCode::InvalidVersion),
        Some(rr),
    );
    assert_eq!(
        t,
        terminate::Repr::new(ErrorCause::DdpTagged(DdpTaggedCode::InvalidVersion))
    );
    // Not enough bytes for the header: no D.
    let t = terminate::Repr::for_error(
        ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidQn),
        Some(Offending {
            ulpdu_len: 46,
            bytes: &RPING_READ_REQUEST_F11[..10],
        }),
    );
    assert_eq!(
        t.control(),
        terminate::Control {
            cause: ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidQn),
            m: false,
            d: false,
            r: false
        }
    );
    // No offending bytes at all.
    assert_eq!(
        terminate::Repr::for_error(ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidMo), None)
            .buffer_len(),
        4
    );
}

#[test]
fn terminate_truncated_and_impossible_len() {
    // Cut inside every announced field.
    let full = term_rdmap_invalid_stag();
    let body = &full[18..];
    for n in 0..body.len() {
        let e = terminate::Repr::parse_bytes(&body[..n]).unwrap_err();
        let want = match n {
            0..=3 => Field::TerminateControl,
            4..=5 => Field::TerminateDdpSegmentLength,
            6..=23 => Field::TerminatedDdpHeader,
            _ => Field::TerminatedRdmaHeader,
        };
        assert!(
            matches!(e, Error::Truncated { field, .. } if field == want),
            "{n}: {e:?}"
        );
    }
    // One byte too many.
    let mut long = body.to_vec();
    long.push(0);
    assert_eq!(
        terminate::Repr::parse_bytes(&long),
        Err(Error::TrailingBytes {
            field: Field::Terminate,
            extra: 1
        })
    );
    // M without D.
    assert_eq!(
        terminate::Repr::parse_bytes(&[0x20, 0x02, 0x80, 0x00]),
        Err(Error::TerminateLengthWithoutHeader)
    );
    // The Control word alone still tells why.
    let c = terminate::Control::parse(&body[..4]).unwrap();
    assert_eq!(
        c.cause,
        ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::InvalidStag)
    );
    assert!(c.m && c.d && c.r);
    // A Terminate that is not the last segment.
    let mut b = TERM_LLP_CRC;
    b[0] = 0x01;
    assert_eq!(
        Ulpdu::parse(&b),
        Err(Error::NotLast {
            opcode: Opcode::Terminate
        })
    );
}

// ---- Terminate recognition and the error-only Terminate -------------------------

#[test]
fn terminates_are_recognised_by_their_control_bytes() {
    // Terminates: what Linux siw sends, and the hand-built ones above.
    let invalid_stag = term_rdmap_invalid_stag();
    let terminates: [(&[u8], ErrorCause); 5] = [
        (
            &TERM_SIW_LOCAL_CATASTROPHIC,
            ErrorCause::RdmapLocalCatastrophic { code: 0xff },
        ),
        (
            &TERM_DDP_MSN_RANGE,
            ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidMsnRange),
        ),
        (
            &invalid_stag,
            ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::InvalidStag),
        ),
        (&TERM_LLP_CRC, ErrorCause::Llp(LlpCode::CrcError)),
        (
            &TERM_DDP_TAGGED_BOUNDS,
            ErrorCause::DdpTagged(DdpTaggedCode::BaseOrBoundsViolation),
        ),
    ];
    for (t, cause) in terminates {
        assert!(Header::is_terminate(t), "{cause}");
        assert_eq!(ulpdu::terminate_cause(t), Some(cause));
    }
    // Not Terminates: a tagged RDMA Write (rping frame 15), an untagged Send (frame
    // 10), a Read Request and a Read Response.
    for other in [
        &RPING_WRITE_F15[..],
        &RPING_SEND_F10,
        &RPING_READ_REQUEST_F11,
        &RPING_READ_RESPONSE_F12,
    ] {
        assert!(!Header::is_terminate(other));
        assert_eq!(ulpdu::terminate_cause(other), None);
    }
    // The two control bytes alone decide; L and the reserved bits do not count.
    assert!(Header::is_terminate(&[0x01, 0x47]));
    assert!(Header::is_terminate(&[0x41, 0x77]));
    assert!(!Header::is_terminate(&[0x81, 0x40]));
    assert!(!Header::is_terminate(&[0x81, 0x47])); // tagged
    assert!(!Header::is_terminate(&[0x02, 0x47])); // DDP version 2
    assert!(!Header::is_terminate(&[0x01, 0x87])); // RDMAP version 2
    assert!(!Header::is_terminate(&[0x01]));
    assert!(!Header::is_terminate(b""));
}

#[test]
fn terminates_are_built_and_recognised() {
    for cause in [
        ErrorCause::Llp(LlpCode::CrcError),
        ErrorCause::Llp(LlpCode::InvalidRequestReply),
        ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidQn),
    ] {
        let t = emit(&Ulpdu::terminate(cause, 1));
        // Untagged header on QN 2, MSN 1, MO 0; then the Terminate control word.
        assert_eq!(&t[..2], &[0x41, 0x47]);
        assert_eq!(&t[6..18], &[0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(ulpdu::terminate_cause(&t), Some(cause));
    }
    assert_eq!(
        emit(&Ulpdu::terminate(ErrorCause::Llp(LlpCode::CrcError), 1)),
        TERM_LLP_CRC
    );
    assert_eq!(ulpdu::terminate_cause(&[0x41, 0x47, 0, 0]), None);
    assert_eq!(ulpdu::terminate_cause(b""), None);
    let send = [
        0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 9,
    ];
    assert_eq!(ulpdu::terminate_cause(&send), None);
    // Malformed Terminates still end the stream: the raw triple, or 0xf/0xf/0xff.
    let mut short = TERM_LLP_CRC[..20].to_vec();
    assert_eq!(
        ulpdu::terminate_cause(&short),
        Some(ErrorCause::Llp(LlpCode::CrcError))
    );
    short.truncate(18);
    assert_eq!(
        ulpdu::terminate_cause(&short),
        Some(ErrorCause::Unrecognized {
            layer: 0x0f,
            etype: 0x0f,
            code: 0xff
        })
    );
}

// ---------------------------------------------------------------- RFC 7306 atomics

/// An Atomic Request built by hand from the RFC 7306 §5 layout (no capture of one
/// exists: kernel siw and iw_cxgb4 send none): DDP untagged, L, QN 1, MSN 1, MO 0;
/// RDMAP opcode 0xA; AtomicOpcode CmpSwap (0x2); Request Identifier 1; Remote STag
/// 0x12345600; Remote Tagged Offset 0x7f3a5c000008; Swap Data 0x1122334455667788 and
/// Mask all ones; Compare Data 7 and Mask all ones (what `IBV_WR_ATOMIC_CMP_AND_SWP`
/// sends).
const ATOMIC_REQUEST_CMP_SWAP: [u8; 70] = [
    0x41, 0x4a, 0x00, 0x00, 0x00, 0x00, // DDP control, RDMAP control, RsvdULP
    0x00, 0x00, 0x00, 0x01, // QN 1
    0x00, 0x00, 0x00, 0x01, // MSN 1
    0x00, 0x00, 0x00, 0x00, // MO 0
    0x00, 0x00, 0x00, 0x02, // Reserved | AtomicOpcode CmpSwap
    0x00, 0x00, 0x00, 0x01, // Request Identifier
    0x12, 0x34, 0x56, 0x00, // Remote STag
    0x00, 0x00, 0x7f, 0x3a, 0x5c, 0x00, 0x00, 0x08, // Remote Tagged Offset
    0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // Swap Data
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // Swap Mask
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, // Compare Data
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // Compare Mask
];

/// A FetchAdd of 5 (`IBV_WR_ATOMIC_FETCH_AND_ADD`: Add Mask 0), Request Identifier 2,
/// MSN 2, same target.
const ATOMIC_REQUEST_FETCH_ADD: [u8; 70] = [
    0x41, 0x4a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00,
    0x00, 0x00, // DDP untagged header: QN 1, MSN 2, MO 0
    0x00, 0x00, 0x00, 0x00, // AtomicOpcode FetchAdd
    0x00, 0x00, 0x00, 0x02, // Request Identifier
    0x12, 0x34, 0x56, 0x00, 0x00, 0x00, 0x7f, 0x3a, 0x5c, 0x00, 0x00, 0x08, // STag, TO
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, // Add Data
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // Add Mask
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // Compare Data (unused)
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // Compare Mask (unused)
];

/// The Atomic Response to the CmpSwap: DDP untagged, L, QN 3, MSN 1, MO 0; RDMAP
/// opcode 0xB; Original Request Identifier 1; Original Remote Data Value 7.
const ATOMIC_RESPONSE_1: [u8; 30] = [
    0x41, 0x4b, 0x00, 0x00, 0x00, 0x00, // DDP control, RDMAP control, RsvdULP
    0x00, 0x00, 0x00, 0x03, // QN 3
    0x00, 0x00, 0x00, 0x01, // MSN 1
    0x00, 0x00, 0x00, 0x00, // MO 0
    0x00, 0x00, 0x00, 0x01, // Original Request Identifier
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, // Original Remote Data Value
];

#[test]
fn deconstruct_atomic_request_and_response() {
    use ddp_rdmap::rdmap::{AtomicOpcode, AtomicRequestRepr, AtomicResponseRepr};
    let u = Ulpdu::parse(&ATOMIC_REQUEST_CMP_SWAP).unwrap();
    assert_eq!(u.opcode(), Opcode::AtomicRequest);
    assert!(u.last());
    assert_eq!(
        (u.header.qn(), u.header.msn(), u.header.mo()),
        (Some(1), Some(1), Some(0))
    );
    assert_eq!(
        u.body,
        Body::AtomicRequest(AtomicRequestRepr::cmp_swap(
            1,
            0x1234_5600,
            0x7f3a_5c00_0008,
            7,
            0x1122_3344_5566_7788
        ))
    );
    assert!(u.payload.is_empty());
    assert_eq!(u.ddp_payload_len(), 52);

    let u = Ulpdu::parse(&ATOMIC_REQUEST_FETCH_ADD).unwrap();
    let Body::AtomicRequest(fa) = u.body else {
        panic!("not an Atomic Request: {:?}", u.body)
    };
    assert_eq!(fa.opcode, AtomicOpcode::FetchAdd);
    assert_eq!(
        fa,
        AtomicRequestRepr::fetch_add(2, 0x1234_5600, 0x7f3a_5c00_0008, 5)
    );
    assert_eq!(u.header.msn(), Some(2));

    let u = Ulpdu::parse(&ATOMIC_RESPONSE_1).unwrap();
    assert_eq!(u.opcode(), Opcode::AtomicResponse);
    assert_eq!(
        (u.header.qn(), u.header.msn(), u.header.mo()),
        (Some(3), Some(1), Some(0))
    );
    assert_eq!(
        u.body,
        Body::AtomicResponse(AtomicResponseRepr {
            request_id: 1,
            original_value: 7
        })
    );
    assert_eq!(u.ddp_payload_len(), 12);
}

#[test]
fn construct_atomic_request_and_response() {
    use ddp_rdmap::rdmap::{AtomicRequestRepr, AtomicResponseRepr};
    for golden in [&ATOMIC_REQUEST_CMP_SWAP[..], &ATOMIC_REQUEST_FETCH_ADD[..]] {
        let u = Ulpdu::parse(golden).unwrap();
        assert_eq!(emit(&u), golden);
    }
    assert_eq!(
        emit(&Ulpdu::parse(&ATOMIC_RESPONSE_1).unwrap()),
        ATOMIC_RESPONSE_1
    );
    // From the parts, as a requester builds them.
    let header = Header {
        opcode: Opcode::AtomicRequest,
        last: true,
        buffer: BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: ddp_rdmap::rdmap::QN_READ_REQUEST,
            msn: 1,
            mo: 0,
        },
    };
    let mut b = [0u8; 70];
    header.emit(&mut b).unwrap();
    let body =
        AtomicRequestRepr::cmp_swap(1, 0x1234_5600, 0x7f3a_5c00_0008, 7, 0x1122_3344_5566_7788);
    b[18..].copy_from_slice(&body.to_bytes());
    assert_eq!(b, ATOMIC_REQUEST_CMP_SWAP);
    let header = Header {
        opcode: Opcode::AtomicResponse,
        last: true,
        buffer: BufferModel::Untagged {
            rsvd_ulp: 0,
            qn: ddp_rdmap::rdmap::QN_ATOMIC_RESPONSE,
            msn: 1,
            mo: 0,
        },
    };
    let mut b = [0u8; 30];
    header.emit(&mut b).unwrap();
    let body = AtomicResponseRepr {
        request_id: 1,
        original_value: 7,
    };
    b[18..].copy_from_slice(&body.to_bytes());
    assert_eq!(b, ATOMIC_RESPONSE_1);
}

#[test]
fn atomic_truncated_and_impossible_len() {
    assert_all_shorter_fail(&ATOMIC_REQUEST_CMP_SWAP);
    assert_all_shorter_fail(&ATOMIC_RESPONSE_1);
    assert_eq!(
        Ulpdu::parse(&ATOMIC_REQUEST_CMP_SWAP[..69]),
        Err(Error::Truncated {
            field: Field::AtomicRequest,
            needed: 52,
            len: 51
        })
    );
    let mut long = ATOMIC_RESPONSE_1.to_vec();
    long.push(0);
    let e = Ulpdu::parse(&long).unwrap_err();
    assert_eq!(
        e,
        Error::TrailingBytes {
            field: Field::AtomicResponse,
            extra: 1
        }
    );
    // An undefined AtomicOpcode (0x3) is a malformed request: a Terminate, not a panic.
    let mut bad = ATOMIC_REQUEST_CMP_SWAP;
    bad[21] = 0x03;
    let e = Ulpdu::parse(&bad).unwrap_err();
    assert_eq!(e, Error::UnknownAtomicOpcode { atomic_opcode: 3 });
    assert!(e.terminate_cause().is_some());
    // An Atomic Request with L clear (it must be one segment).
    let mut split = ATOMIC_REQUEST_CMP_SWAP;
    split[0] &= !0x40;
    assert!(Ulpdu::parse(&split).is_err());
}

#[test]
fn atomic_request_checks_give_the_terminate_codes() {
    use ddp_rdmap::reassembly::check_atomic_request;
    let Body::AtomicRequest(mut ar) = Ulpdu::parse(&ATOMIC_REQUEST_CMP_SWAP).unwrap().body else {
        unreachable!()
    };
    assert_eq!(check_atomic_request(&ar), Ok(()));
    ar.remote_to += 4;
    let cause = check_atomic_request(&ar).unwrap_err();
    assert_eq!(
        cause,
        ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::BaseOrBoundsViolation)
    );
    // The Terminate for it: RDMAP (0) / Remote Protection (1) / 0x01, with the DDP
    // header of the Atomic Request copied (M, D).
    let bytes = ATOMIC_REQUEST_CMP_SWAP;
    let u = Ulpdu::parse(&bytes).unwrap();
    let t = terminate::Repr::for_error(cause, Some(u.offending(&bytes)));
    let mut out = vec![0u8; t.buffer_len()];
    t.emit(&mut out).unwrap();
    assert_eq!(&out[..4], &[0x01, 0x01, 0xc0, 0x00]);
    assert_eq!(&out[4..6], &[0x00, 70]);
    assert_eq!(&out[6..24], &bytes[..18]);
    assert_eq!(out.len(), 24);
}
