//! A hostile peer: raw, hand-built ULPDUs injected into a QP. For every Terminate
//! cause the engine can be provoked into, the test checks the exact Terminate ULPDU
//! (DDP header on QN 2, Terminate Control, copied DDP header with its ULPDU length,
//! copied Read Request header), the completions, the events, that the QP is in
//! Error and produces and accepts nothing more, and that no MR byte changed.
//!
//! The expected bytes are written out here by hand from RFC 5040 §4.8 and RFC 5041
//! §7, independently of `ddp_rdmap::terminate`.

use std::sync::Arc;

use crate::support::qp::*;
use ddp_rdmap::terminate::{
    DdpTaggedCode, DdpUntaggedCode, ErrorCause, RdmapOperationCode, RdmapProtectionCode,
};
use softiwarp::rdmap::engine::{QpEvent, QpInit, RxError};
use softiwarp::resources::stag_table::MemoryRegion;
use softiwarp::MrState;
use verbs::{AccessFlags, AsyncEvent, QpState, WcOpcode, WcStatus};

// Opcodes (RFC 5040 §4.2, RFC 7306).
const WRITE: u8 = 0x0;
const READ_REQ: u8 = 0x1;
const READ_RESP: u8 = 0x2;
const SEND: u8 = 0x3;
const SEND_INV: u8 = 0x4;
const IMM: u8 = 0x8;

/// A tagged segment: DDP control `T=1 L DV=1`, RDMAP control `RV=1 opcode`, STag,
/// TO, payload.
fn tagged(opcode: u8, last: bool, stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0x81 | if last { 0x40 } else { 0 }, 0x40 | opcode];
    v.extend(stag.to_be_bytes());
    v.extend(to.to_be_bytes());
    v.extend(payload);
    v
}

/// An untagged segment: RsvdULP word (Invalidate STag), QN, MSN, MO, payload.
fn untagged(
    opcode: u8,
    last: bool,
    inv: u32,
    qn: u32,
    msn: u32,
    mo: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut v = vec![0x01 | if last { 0x40 } else { 0 }, 0x40 | opcode];
    v.extend(inv.to_be_bytes());
    v.extend(qn.to_be_bytes());
    v.extend(msn.to_be_bytes());
    v.extend(mo.to_be_bytes());
    v.extend(payload);
    v
}

/// An RDMA Read Request (QN 1) body.
fn read_request(
    msn: u32,
    sink_stag: u32,
    sink_to: u64,
    size: u32,
    src_stag: u32,
    src_to: u64,
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(sink_stag.to_be_bytes());
    b.extend(sink_to.to_be_bytes());
    b.extend(size.to_be_bytes());
    b.extend(src_stag.to_be_bytes());
    b.extend(src_to.to_be_bytes());
    untagged(READ_REQ, true, 0, 1, msn, 0, &b)
}

/// The Terminate ULPDU the victim must send: DDP untagged header (L, QN 2, MSN 1,
/// MO 0), RDMAP opcode 7, Terminate Control, then (D) the DDP Segment Length and the
/// copied DDP header, then (R) the 28-byte Read Request header.
fn terminate(layer: u8, etype: u8, code: u8, offending: Option<&[u8]>, rdma: bool) -> Vec<u8> {
    let mut v = untagged(0x7, true, 0, 2, 1, 0, &[]);
    let mut flags = 0u8;
    if offending.is_some() {
        flags |= 0x80 | 0x40; // M, D
    }
    if rdma {
        flags |= 0x20; // R
    }
    v.extend([layer << 4 | etype, code, flags, 0]);
    if let Some(o) = offending {
        v.extend((o.len() as u16).to_be_bytes());
        let hlen = if o[0] & 0x80 != 0 { 14 } else { 18 };
        v.extend(&o[..hlen]);
        if rdma {
            v.extend(&o[18..18 + 28]);
        }
    }
    v
}

/// The QP under attack and its MRs.
struct Victim {
    side: Side,
    /// All rights, iova 0x1000, 4096 bytes.
    m: Arc<MemoryRegion>,
    /// LOCAL_WRITE | REMOTE_READ: no remote write.
    ro: Arc<MemoryRegion>,
    /// LOCAL_WRITE | REMOTE_WRITE: no remote read.
    wo: Arc<MemoryRegion>,
    /// All rights, but in another PD.
    foreign: Arc<MemoryRegion>,
    /// Receive buffers: `recvs` WRs of 64 bytes each.
    rb: Arc<MemoryRegion>,
    snapshot: Vec<Vec<u8>>,
    recvs: u64,
}

impl Victim {
    fn new(recvs: u64, tweak: impl FnOnce(&mut QpInit)) -> Victim {
        let mut side = Side::new(5, cap(16, 2), tweak);
        side.bring_up();
        let m = side.reg(0x1000, 4096, all_access());
        let ro = side.reg(
            0x10000,
            256,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        );
        let wo = side.reg(
            0x20000,
            256,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        );
        let other_pd = side.mrs.alloc_pd().unwrap();
        let foreign = side
            .mrs
            .reg_mr(other_pd, 0x30000, 256, all_access())
            .unwrap();
        let rb = side.reg(0x40000, 1024, all_access());
        for (i, mr) in [&m, &ro, &wo, &foreign, &rb].into_iter().enumerate() {
            mr.write(0, &pattern(mr.capacity(), i as u64)).unwrap();
        }
        for i in 0..recvs {
            side.post_recv(100 + i, &rb, i * 64, 64);
        }
        let snapshot = [&m, &ro, &wo, &foreign, &rb]
            .iter()
            .map(|mr| mr.to_vec())
            .collect();
        Victim {
            side,
            m,
            ro,
            wo,
            foreign,
            rb,
            snapshot,
            recvs,
        }
    }

    fn mrs_unchanged(&self) -> bool {
        [&self.m, &self.ro, &self.wo, &self.foreign, &self.rb]
            .iter()
            .zip(&self.snapshot)
            .all(|(mr, snap)| &mr.to_vec() == snap)
    }

    /// Injects `ulpdu` and checks the whole outcome. `recv_status` is the status of
    /// the oldest receive WR (the others are flushed).
    fn expect(
        &mut self,
        ulpdu: &[u8],
        cause: ErrorCause,
        want: &[u8],
        recv_status: WcStatus,
        event: AsyncEvent,
    ) {
        let r = self.side.qp.handle_ulpdu(ulpdu);
        assert_eq!(r, Err(RxError::Protocol { cause }), "{cause}");
        assert_eq!(self.side.qp.state(), QpState::Error);
        assert!(self.mrs_unchanged(), "an MR byte changed for {cause}");
        let tx = self.side.drain_tx(MULPDU);
        assert_eq!(
            tx.len(),
            1,
            "exactly one ULPDU after the error: the Terminate"
        );
        assert_eq!(tx[0], want, "Terminate bytes for {cause}");
        // Nothing is processed any more.
        assert_eq!(self.side.qp.handle_ulpdu(ulpdu), Err(RxError::Terminated));
        assert!(self.side.drain_tx(MULPDU).is_empty());
        let events = self.side.events();
        assert_eq!(
            events,
            vec![QpEvent::TerminateQueued { cause }, QpEvent::Async(event)]
        );
        let wcs = self.side.recv_wcs();
        assert_eq!(wcs.len() as u64, self.recvs);
        for (i, wc) in wcs.iter().enumerate() {
            assert_eq!(wc.wr_id, 100 + i as u64);
            assert_eq!(wc.opcode, WcOpcode::Recv);
            if i == 0 {
                assert_eq!(wc.status, recv_status, "{cause}");
                if recv_status != WcStatus::WrFlushErr {
                    let v = (u32::from(cause.layer_value()) << 12)
                        | (u32::from(cause.etype()) << 8)
                        | u32::from(cause.code());
                    assert_eq!(wc.vendor_err, v);
                }
            } else {
                assert_eq!(wc.status, WcStatus::WrFlushErr);
            }
        }
        assert!(self.side.send_wcs().is_empty());
    }
}

fn access_err(qp: u32) -> AsyncEvent {
    AsyncEvent::QpAccessErr { qp_num: qp }
}

fn req_err(qp: u32) -> AsyncEvent {
    AsyncEvent::QpReqErr { qp_num: qp }
}

const QPN: u32 = 5;
const FLUSH: WcStatus = WcStatus::WrFlushErr;

fn ddp_t(c: DdpTaggedCode) -> ErrorCause {
    ErrorCause::DdpTagged(c)
}

fn ddp_u(c: DdpUntaggedCode) -> ErrorCause {
    ErrorCause::DdpUntagged(c)
}

fn prot(c: RdmapProtectionCode) -> ErrorCause {
    ErrorCause::RdmapRemoteProtection(c)
}

fn oper(c: RdmapOperationCode) -> ErrorCause {
    ErrorCause::RdmapRemoteOperation(c)
}

#[test]
fn write_invalid_stag() {
    let mut v = Victim::new(2, |_| {});
    let u = tagged(WRITE, true, 0x0077_7700, 0x1000, &[0xee; 32]);
    let want = terminate(1, 1, 0x00, Some(&u), false);
    v.expect(
        &u,
        ddp_t(DdpTaggedCode::InvalidStag),
        &want,
        FLUSH,
        access_err(QPN),
    );
}

#[test]
fn write_wrong_key() {
    let mut v = Victim::new(1, |_| {});
    let u = tagged(WRITE, true, v.m.stag().inc_key().raw(), 0x1000, &[0xee; 32]);
    let want = terminate(1, 1, 0x00, Some(&u), false);
    v.expect(
        &u,
        ddp_t(DdpTaggedCode::InvalidStag),
        &want,
        FLUSH,
        access_err(QPN),
    );
}

#[test]
fn write_to_invalidated_stag() {
    let mut v = Victim::new(0, |_| {});
    v.side.mrs.invalidate(v.m.stag(), v.side.pd, false).unwrap();
    let u = tagged(WRITE, true, v.m.stag().raw(), 0x1000, &[0xee; 8]);
    let want = terminate(1, 1, 0x00, Some(&u), false);
    v.expect(
        &u,
        ddp_t(DdpTaggedCode::InvalidStag),
        &want,
        FLUSH,
        access_err(QPN),
    );
}

#[test]
fn write_base_and_bounds() {
    // Past the end (4090 + 32 > 4096), before the base, and one byte over.
    for (to, len) in [(0x1000 + 4090, 32usize), (0xfff, 4), (0x1000, 4097)] {
        let mut v = Victim::new(1, |_| {});
        let u = tagged(WRITE, true, v.m.stag().raw(), to, &vec![0xee; len]);
        let want = terminate(1, 1, 0x01, Some(&u), false);
        v.expect(
            &u,
            ddp_t(DdpTaggedCode::BaseOrBoundsViolation),
            &want,
            FLUSH,
            access_err(QPN),
        );
    }
}

#[test]
fn write_to_wrap() {
    let mut v = Victim::new(1, |_| {});
    let u = tagged(WRITE, true, v.m.stag().raw(), u64::MAX - 10, &[0xee; 32]);
    let want = terminate(1, 1, 0x03, Some(&u), false);
    v.expect(
        &u,
        ddp_t(DdpTaggedCode::ToWrap),
        &want,
        FLUSH,
        access_err(QPN),
    );
}

#[test]
fn write_access_rights() {
    let mut v = Victim::new(1, |_| {});
    let u = tagged(WRITE, true, v.ro.stag().raw(), 0x10000, &[0xee; 16]);
    let want = terminate(0, 1, 0x02, Some(&u), false);
    v.expect(
        &u,
        prot(RdmapProtectionCode::AccessRightsViolation),
        &want,
        FLUSH,
        access_err(QPN),
    );
}

#[test]
fn write_refused_by_qp_access_flags() {
    let mut v = Victim::new(0, |i| i.access = AccessFlags::REMOTE_READ);
    let u = tagged(WRITE, true, v.m.stag().raw(), 0x1000, &[0xee; 16]);
    let want = terminate(0, 1, 0x02, Some(&u), false);
    v.expect(
        &u,
        prot(RdmapProtectionCode::AccessRightsViolation),
        &want,
        FLUSH,
        access_err(QPN),
    );
}

#[test]
fn write_wrong_pd() {
    let mut v = Victim::new(1, |_| {});
    let u = tagged(WRITE, true, v.foreign.stag().raw(), 0x30000, &[0xee; 16]);
    let want = terminate(1, 1, 0x02, Some(&u), false);
    v.expect(
        &u,
        ddp_t(DdpTaggedCode::StagNotAssociated),
        &want,
        FLUSH,
        access_err(QPN),
    );
}

/// Read Request Data Source checks: RDMAP Remote Protection Errors, with the Read
/// Request header copied (R = 1).
#[test]
fn read_request_source_checks() {
    type Case = (fn(&Victim) -> (u32, u64, u32), u8, RdmapProtectionCode);
    let cases: [Case; 6] = [
        (
            |_| (0x00ab_cd00, 0x1000, 16),
            0x00,
            RdmapProtectionCode::InvalidStag,
        ),
        (
            |v| (v.m.stag().inc_key().raw(), 0x1000, 16),
            0x00,
            RdmapProtectionCode::InvalidStag,
        ),
        (
            |v| (v.m.stag().raw(), 0x1000 + 4000, 100),
            0x01,
            RdmapProtectionCode::BaseOrBoundsViolation,
        ),
        (
            |v| (v.wo.stag().raw(), 0x20000, 16),
            0x02,
            RdmapProtectionCode::AccessRightsViolation,
        ),
        (
            |v| (v.foreign.stag().raw(), 0x30000, 16),
            0x03,
            RdmapProtectionCode::StagNotAssociated,
        ),
        (
            |v| (v.m.stag().raw(), u64::MAX - 3, 16),
            0x04,
            RdmapProtectionCode::ToWrap,
        ),
    ];
    for (make, code, c) in cases {
        let mut v = Victim::new(1, |_| {});
        let (src, to, size) = make(&v);
        let u = read_request(1, 0x1234_5600, 0x9000, size, src, to);
        let want = terminate(0, 1, code, Some(&u), true);
        v.expect(&u, prot(c), &want, FLUSH, access_err(QPN));
    }
}

#[test]
fn read_request_refused_by_qp_access_flags() {
    let mut v = Victim::new(0, |i| i.access = AccessFlags::REMOTE_WRITE);
    let u = read_request(1, 0x1234_5600, 0x9000, 16, v.m.stag().raw(), 0x1000);
    let want = terminate(0, 1, 0x02, Some(&u), true);
    v.expect(
        &u,
        prot(RdmapProtectionCode::AccessRightsViolation),
        &want,
        FLUSH,
        access_err(QPN),
    );
}

/// More Read Requests than IRD: DDP "Invalid MSN - no buffer available" on QN 1
/// (no RDMA header copied: it is a DDP error).
#[test]
fn read_requests_beyond_ird() {
    let mut v = Victim::new(1, |i| i.ird = 1);
    let ok = read_request(1, 0x1234_5600, 0x9000, 16, v.m.stag().raw(), 0x1000);
    v.side.qp.handle_ulpdu(&ok).unwrap();
    let u = read_request(2, 0x1234_5600, 0x9000, 16, v.m.stag().raw(), 0x1000);
    let want = terminate(1, 2, 0x02, Some(&u), false);
    v.expect(
        &u,
        ddp_u(DdpUntaggedCode::InvalidMsnNoBuffer),
        &want,
        FLUSH,
        req_err(QPN),
    );
}

#[test]
fn invalid_qn() {
    // QN 5 does not exist; QN 1 exists but is not the Send queue.
    for qn in [5u32, 1] {
        let mut v = Victim::new(2, |_| {});
        let u = untagged(SEND, true, 0, qn, 1, 0, b"hello");
        let want = terminate(1, 2, 0x01, Some(&u), false);
        v.expect(
            &u,
            ddp_u(DdpUntaggedCode::InvalidQn),
            &want,
            FLUSH,
            req_err(QPN),
        );
    }
}

#[test]
fn msn_out_of_range() {
    // Behind (MSN 0 when 1 is expected) and ahead of a posted buffer (MSN 2 with
    // message 1 not sent).
    for msn in [0u32, 2] {
        let mut v = Victim::new(3, |_| {});
        let u = untagged(SEND, true, 0, 0, msn, 0, b"hello");
        let want = terminate(1, 2, 0x03, Some(&u), false);
        v.expect(
            &u,
            ddp_u(DdpUntaggedCode::InvalidMsnRange),
            &want,
            FLUSH,
            req_err(QPN),
        );
    }
}

#[test]
fn no_receive_buffer() {
    // No receive WR at all; and an MSN beyond the posted ones.
    for (recvs, msn) in [(0u64, 1u32), (2, 3)] {
        let mut v = Victim::new(recvs, |_| {});
        let u = untagged(SEND, true, 0, 0, msn, 0, b"hello");
        let want = terminate(1, 2, 0x02, Some(&u), false);
        v.expect(
            &u,
            ddp_u(DdpUntaggedCode::InvalidMsnNoBuffer),
            &want,
            FLUSH,
            req_err(QPN),
        );
    }
    // Immediate Data needs a receive WR too.
    let mut v = Victim::new(0, |_| {});
    let u = untagged(IMM, true, 0, 0, 1, 0, &[0, 0, 0, 0, 0, 0, 0, 7]);
    let want = terminate(1, 2, 0x02, Some(&u), false);
    v.expect(
        &u,
        ddp_u(DdpUntaggedCode::InvalidMsnNoBuffer),
        &want,
        FLUSH,
        req_err(QPN),
    );
}

#[test]
fn message_too_long_for_receive_buffer() {
    let mut v = Victim::new(2, |_| {});
    let u = untagged(SEND, true, 0, 0, 1, 0, &[0xee; 65]);
    let want = terminate(1, 2, 0x05, Some(&u), false);
    v.expect(
        &u,
        ddp_u(DdpUntaggedCode::MessageTooLong),
        &want,
        WcStatus::LocLenErr,
        req_err(QPN),
    );
}

#[test]
fn continuation_without_first_segment() {
    let mut v = Victim::new(1, |_| {});
    let u = untagged(SEND, true, 0, 0, 1, 32, &[0xee; 8]);
    let want = terminate(1, 2, 0x04, Some(&u), false);
    v.expect(
        &u,
        ddp_u(DdpUntaggedCode::InvalidMo),
        &want,
        FLUSH,
        req_err(QPN),
    );
}

#[test]
fn bad_opcodes() {
    // 0xC-0xF are unassigned (untagged and tagged forms).
    let mut v = Victim::new(1, |_| {});
    let u = untagged(0xc, true, 0, 0, 1, 0, &[1, 2, 3]);
    let want = terminate(0, 2, 0x06, Some(&u), false);
    v.expect(
        &u,
        oper(RdmapOperationCode::UnexpectedOpcode),
        &want,
        FLUSH,
        req_err(QPN),
    );

    let mut v = Victim::new(1, |_| {});
    let u = tagged(0xf, true, 1, 0, &[1, 2, 3]);
    let want = terminate(0, 2, 0x06, Some(&u), false);
    v.expect(
        &u,
        oper(RdmapOperationCode::UnexpectedOpcode),
        &want,
        FLUSH,
        req_err(QPN),
    );

    // A Send with the T flag set (wrong buffer model).
    let mut v = Victim::new(1, |_| {});
    let u = tagged(SEND, true, 1, 0, &[1, 2, 3]);
    let want = terminate(0, 2, 0x06, Some(&u), false);
    v.expect(
        &u,
        oper(RdmapOperationCode::UnexpectedOpcode),
        &want,
        FLUSH,
        req_err(QPN),
    );

    // RFC 7306 Atomic Response with no Atomic Request outstanding.
    let mut v = Victim::new(1, |_| {});
    let u = untagged(0xb, true, 0, 3, 1, 0, &[0u8; 12]);
    let want = terminate(0, 2, 0x06, Some(&u), false);
    v.expect(
        &u,
        oper(RdmapOperationCode::UnexpectedOpcode),
        &want,
        FLUSH,
        req_err(QPN),
    );
}

#[test]
fn bad_ddp_version() {
    // No header is copied: the layout of another DDP version is unknown.
    let mut v = Victim::new(1, |_| {});
    let mut u = untagged(SEND, true, 0, 0, 1, 0, b"x");
    u[0] = 0x42; // L, DV = 2
    let want = terminate(1, 2, 0x06, None, false);
    v.expect(
        &u,
        ddp_u(DdpUntaggedCode::InvalidVersion),
        &want,
        FLUSH,
        req_err(QPN),
    );

    let mut v = Victim::new(1, |_| {});
    let mut u = tagged(WRITE, true, v.m.stag().raw(), 0x1000, b"x");
    u[0] = 0xc0; // T, L, DV = 0
    let want = terminate(1, 1, 0x04, None, false);
    v.expect(
        &u,
        ddp_t(DdpTaggedCode::InvalidVersion),
        &want,
        FLUSH,
        access_err(QPN),
    );
}

#[test]
fn bad_rdmap_version() {
    let mut v = Victim::new(1, |_| {});
    let mut u = untagged(SEND, true, 0, 0, 1, 0, b"x");
    u[1] = 0x80 | SEND; // RV = 2
    let want = terminate(0, 2, 0x05, Some(&u), false);
    v.expect(
        &u,
        oper(RdmapOperationCode::InvalidVersion),
        &want,
        FLUSH,
        req_err(QPN),
    );
}

#[test]
fn read_response_matching_no_read() {
    let mut v = Victim::new(1, |_| {});
    let u = tagged(READ_RESP, true, v.m.stag().raw(), 0x1000, &[0xee; 16]);
    let want = terminate(0, 2, 0x06, Some(&u), false);
    v.expect(
        &u,
        oper(RdmapOperationCode::UnexpectedOpcode),
        &want,
        FLUSH,
        req_err(QPN),
    );
}

#[test]
fn truncated_and_malformed_ulpdus() {
    // Shorter than an untagged header: nothing to copy.
    let mut v = Victim::new(1, |_| {});
    let u = untagged(SEND, true, 0, 0, 1, 0, &[])[..10].to_vec();
    let want = terminate(0, 2, 0xff, None, false);
    v.expect(
        &u,
        oper(RdmapOperationCode::Unspecified),
        &want,
        FLUSH,
        req_err(QPN),
    );
    // A Read Request one byte short: header copied, RDMA header cannot be.
    let mut v = Victim::new(1, |_| {});
    let mut u = read_request(1, 1, 0, 4, v.m.stag().raw(), 0x1000);
    u.pop();
    let want = terminate(0, 2, 0xff, Some(&u), false);
    v.expect(
        &u,
        oper(RdmapOperationCode::Unspecified),
        &want,
        FLUSH,
        req_err(QPN),
    );
    // A Read Request with L = 0.
    let mut v = Victim::new(1, |_| {});
    let mut u = read_request(1, 1, 0, 4, v.m.stag().raw(), 0x1000);
    u[0] &= !0x40;
    let want = terminate(0, 2, 0xff, Some(&u), true);
    v.expect(
        &u,
        oper(RdmapOperationCode::Unspecified),
        &want,
        FLUSH,
        req_err(QPN),
    );
    // Empty.
    let mut v = Victim::new(1, |_| {});
    let want = terminate(0, 2, 0xff, None, false);
    v.expect(
        &[],
        oper(RdmapOperationCode::Unspecified),
        &want,
        FLUSH,
        req_err(QPN),
    );
}

/// Send with Invalidate naming an STag that cannot be invalidated: an ordinary
/// (reg_mr, no remote-invalidate option) MR of the QP's own PD (Remote Protection
/// 0x09: the IBTA rule allows remote invalidation of fast-registered MRs only), an
/// MR of another PD (Remote Protection 0x09), unknown (Remote Operation 0x09). The
/// receive WR completes with RemInvReqErr (siw), the MRs stay valid and usable.
#[test]
fn send_with_invalidate_of_foreign_or_unknown_stag() {
    type Case = (fn(&Victim) -> u32, ErrorCause, u8, AsyncEvent);
    let cases: [Case; 3] = [
        (
            |v| v.m.stag().raw(),
            prot(RdmapProtectionCode::StagCannotBeInvalidated),
            1,
            access_err(QPN),
        ),
        (
            |v| v.foreign.stag().raw(),
            prot(RdmapProtectionCode::StagCannotBeInvalidated),
            1,
            access_err(QPN),
        ),
        (
            |_| 0x00ee_ee00,
            oper(RdmapOperationCode::StagCannotBeInvalidated),
            2,
            req_err(QPN),
        ),
    ];
    for (stag, cause, etype, event) in cases {
        let mut v = Victim::new(2, |_| {});
        let u = untagged(SEND_INV, true, stag(&v), 0, 1, 0, &[]);
        let want = terminate(0, etype, 0x09, Some(&u), false);
        v.expect(&u, cause, &want, WcStatus::RemInvReqErr, event);
        assert_eq!(v.foreign.state(), MrState::Valid);
        assert_eq!(v.m.state(), MrState::Valid);
        // Still usable by its STag (by a QP of its PD on another connection).
        let pd = v.side.pd;
        let (mr, off) = v
            .side
            .mrs
            .check(v.m.stag(), pd, 0x1010, 16, AccessFlags::REMOTE_WRITE)
            .unwrap();
        assert!(Arc::ptr_eq(&mr, &v.m));
        assert_eq!(off, 0x10);
    }
}

/// The same hostile ULPDUs arriving at a QP whose peer is a real engine: the
/// Terminate reaches the requester, whose Read WR fails with the mapped status.
#[test]
fn terminate_reaches_the_requester() {
    let mut p = Pair::new(cap(8, 1));
    let dst = p.a.reg(0, 64, all_access());
    p.a.qp
        .post_send(verbs::SendWr::rdma_read(
            1,
            vec![verbs::Sge::new(0, 16, dst.stag())],
            0x1000,
            verbs::Stag::from_raw(0x00ab_cd00),
        ))
        .unwrap();
    p.a.qp
        .post_send(verbs::SendWr::send_inline(2, vec![1]))
        .unwrap();
    p.pump();
    let cause = prot(RdmapProtectionCode::InvalidStag);
    let wcs = p.a.send_wcs();
    let st: Vec<_> = wcs
        .iter()
        .map(|w| (w.wr_id, w.status, w.vendor_err))
        .collect();
    // The Send went out before the Terminate came back; it completes flushed since
    // it waits behind the failed Read.
    assert_eq!(
        st,
        [
            (1, WcStatus::RemAccessErr, 0x0100),
            (2, WcStatus::WrFlushErr, 0)
        ]
    );
    let ev = p.a.events();
    assert_eq!(
        ev,
        vec![
            QpEvent::TerminateReceived { cause: Some(cause) },
            QpEvent::Async(AsyncEvent::QpFatal { qp_num: 1 })
        ]
    );
    assert_eq!(p.a.qp.state(), QpState::Error);
    // The responder got the Send after its Terminate? No: nothing after the
    // Terminate is processed.
    assert!(p.b.recv_wcs().is_empty());
}

/// A Read Response that does not fit the outstanding Read: wrong STag, wrong TO,
/// too long, ends early. The Read WR completes with BadRespErr.
#[test]
fn read_response_mismatch() {
    type Mk = fn(u32) -> Vec<u8>;
    let cases: [(Mk, u8); 4] = [
        (|s| tagged(READ_RESP, true, s ^ 0x100, 0, &[1; 16]), 0x00),
        (|s| tagged(READ_RESP, true, s, 4, &[1; 16]), 0x01),
        (|s| tagged(READ_RESP, true, s, 0, &[1; 17]), 0x01),
        (|s| tagged(READ_RESP, true, s, 0, &[1; 15]), 0x01),
    ];
    for (mk, code) in cases {
        let mut p = Pair::new(cap(8, 1));
        let dst = p.a.reg(0, 64, all_access());
        p.a.qp
            .post_send(verbs::SendWr::rdma_read(
                1,
                vec![verbs::Sge::new(0, 16, dst.stag())],
                0,
                verbs::Stag::from_raw(0x100),
            ))
            .unwrap();
        assert!(p.tx_a());
        let u = mk(dst.stag().raw());
        let c = ErrorCause::DdpTagged(if code == 0 {
            DdpTaggedCode::InvalidStag
        } else {
            DdpTaggedCode::BaseOrBoundsViolation
        });
        assert_eq!(p.a.qp.handle_ulpdu(&u), Err(RxError::Protocol { cause: c }));
        assert_eq!(dst.to_vec(), vec![0; 64], "nothing placed");
        let wc = p.a.send_wcs();
        assert_eq!(wc.len(), 1);
        assert_eq!(wc[0].status, WcStatus::BadRespErr);
        let t = p.a.drain_tx(MULPDU);
        assert_eq!(t, vec![terminate(1, 1, code, Some(&u), false)]);
    }
}

/// A Terminate from the peer is never answered, even a malformed one.
#[test]
fn received_terminate_is_not_answered() {
    for good in [true, false] {
        let mut v = Victim::new(2, |_| {});
        let u = if good {
            terminate(
                1,
                2,
                0x05,
                Some(&untagged(SEND, true, 0, 0, 1, 0, &[0; 70])),
                false,
            )
        } else {
            let mut t = terminate(1, 2, 0x05, None, false);
            t.push(0); // trailing garbage
            t
        };
        let cause = good.then_some(ddp_u(DdpUntaggedCode::MessageTooLong));
        assert_eq!(
            v.side.qp.handle_ulpdu(&u),
            Err(RxError::PeerTerminated { cause })
        );
        assert_eq!(v.side.qp.state(), QpState::Error);
        assert!(v.side.drain_tx(MULPDU).is_empty(), "no Terminate in reply");
        assert_eq!(v.side.recv_wcs().len(), 2);
        assert!(v.mrs_unchanged());
        assert_eq!(v.side.qp.handle_ulpdu(&u), Err(RxError::Terminated));
    }
}

/// Garbage of every length up to 80 bytes and every first byte: never a panic,
/// always exactly one Terminate or a peer Terminate.
#[test]
fn fuzzish_garbage_never_panics() {
    let mut rng = Rng(77);
    for len in 0..80usize {
        for _ in 0..20 {
            let mut v = Victim::new(1, |_| {});
            let mut u: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            if len > 1 && rng.chance(50) {
                u[0] = (u[0] & 0xfc) | 1;
                u[1] = (u[1] & 0x3f) | 0x40;
            }
            let r = v.side.qp.handle_ulpdu(&u);
            match r {
                Ok(()) => {}
                Err(RxError::Protocol { .. }) => {
                    assert_eq!(v.side.drain_tx(MULPDU).len(), 1);
                }
                Err(RxError::PeerTerminated { .. }) => {
                    assert!(v.side.drain_tx(MULPDU).is_empty());
                }
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
    }
}
