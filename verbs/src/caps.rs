//! Device capabilities as data: what a device allows, that applications size and
//! check their work against, whichever backend runs it. The soft device states its
//! own; the rdma-core backend reads `ibv_query_device(3)` and completes it with what
//! a driver is known to do (the Chelsio facts of shared/rdma-core-notes.md section
//! 2, [`DeviceCaps::CHELSIO_T5`] / [`DeviceCaps::CHELSIO_T6`]).

use crate::{AccessFlags, Payload, SendOp, SendWr, VerbsError};

/// The limits and features of one RDMA device that applications size and
/// check their work against. Counts are per WR / per QP / per CQ as named;
/// lengths in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceCaps {
    /// SGEs per send WR (Send, RDMA Write).
    pub max_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// SGEs per RDMA Read WR (the Read's local sink).
    pub max_sge_rd: u32,
    /// Inline data per send WR, bytes; 0 when not known (the QP's created
    /// capabilities give the real figure).
    pub max_inline: u32,
    /// Outgoing RDMA Reads in flight per QP (ORD; `max_qp_init_rd_atom`).
    pub max_ord: u32,
    /// Incoming RDMA Reads in flight per QP (IRD; `max_qp_rd_atom`).
    pub max_ird: u32,
    /// WRs per work queue.
    pub max_qp_wr: u32,
    /// Entries per CQ.
    pub max_cqe: u32,
    /// RFC 7306 atomics (`atomic_cap` != `IBV_ATOMIC_NONE`).
    pub atomics: bool,
    /// RDMA Write with Immediate (`IBV_WR_RDMA_WRITE_WITH_IMM`).
    pub write_imm: bool,
    /// Send with Immediate (`IBV_WR_SEND_WITH_IMM`; no iWARP device has it).
    pub send_imm: bool,
    /// The local sink of an RDMA Read must be registered with
    /// `IBV_ACCESS_REMOTE_WRITE` (iw_cxgb4; siw does not check).
    pub read_sink_needs_remote_write: bool,
}

/// iw_cxgb4 facts shared by T5 and T6 (shared/rdma-core-notes.md section 2,
/// from kernel `hw/cxgb4/provider.c` and rdma-core `providers/cxgb4/t4.h`).
const CHELSIO_BASE: DeviceCaps = DeviceCaps {
    // (T4_SQ_NUM_BYTES 320 - fw_ri_send_wr 32 - fw_ri_isgl 8) / fw_ri_sge 16
    // [computed in the notes; Steve Wise's kernel commit 33023fb85a42 says 16].
    max_sge: 17,
    // c4iw_query_device: max_recv_sge = 4.
    max_recv_sge: 4,
    // libcxgb4 build_rdma_read: EINVAL if num_sge > 1.
    max_sge_rd: 1,
    // T4_MAX_SEND_INLINE = 320 - 32 - 8 = 280 [computed].
    max_inline: 280,
    // min(firmware max_ordird_qp, c4iw_max_read_depth = 32); the firmware
    // figure is unconfirmed, 32 is the upper bound (EINVAL above).
    max_ord: 32,
    max_ird: 32,
    // t4_max_qp_depth = 8192 - eq status entries - 1 (64-byte status page).
    max_qp_wr: 8190,
    // 65520 - 2 [computed].
    max_cqe: 65518,
    // atomic_cap not set: IBV_ATOMIC_NONE.
    atomics: false,
    write_imm: false,
    // libcxgb4 post_send: SEND_WITH_IMM -> EINVAL.
    send_imm: false,
    read_sink_needs_remote_write: true,
};

impl DeviceCaps {
    /// Chelsio T5 (iw_cxgb4): 17 send / 4 receive SGEs, 1 SGE per RDMA Read,
    /// 280 bytes inline, ORD/IRD at most 32, 8190 WRs, 65518 CQEs, no
    /// atomics, no Send or Write with Immediate, Read sinks need
    /// REMOTE_WRITE.
    pub const CHELSIO_T5: DeviceCaps = CHELSIO_BASE;

    /// Chelsio T6 (iw_cxgb4): as T5, plus RDMA Write with Immediate (only
    /// when the kernel flags the QP `C4IW_QPF_WRITE_W_IMM`, which needs a
    /// capable firmware).
    pub const CHELSIO_T6: DeviceCaps = DeviceCaps {
        write_imm: true,
        ..CHELSIO_BASE
    };

    /// ORD and IRD for `rdma_connect` / `rdma_accept`
    /// (`initiator_depth`, `responder_resources`): the requested values
    /// limited to the device's (iw_cxgb4 fails with `EINVAL` above its 32)
    /// and to 255 (the `uint8_t` fields).
    pub fn clamp_ord_ird(&self, ord: u32, ird: u32) -> (u8, u8) {
        let c = |v: u32, max: u32| v.min(max).min(u8::MAX as u32) as u8;
        (c(ord, self.max_ord), c(ird, self.max_ird))
    }

    /// Checks that a registration with `access` may be the local sink of an
    /// RDMA Read on this device.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidArgument`] when the device needs
    /// `REMOTE_WRITE` on Read sinks (iw_cxgb4) and `access` lacks it.
    pub fn check_read_sink(&self, access: AccessFlags) -> Result<(), VerbsError> {
        if self.read_sink_needs_remote_write && !access.contains(AccessFlags::REMOTE_WRITE) {
            return Err(VerbsError::InvalidArgument {
                what: "RDMA Read sink MR without REMOTE_WRITE (iw_cxgb4 requires it)",
            });
        }
        Ok(())
    }

    /// Checks a send WR against the device's features and limits (what
    /// libcxgb4 would refuse with `EINVAL` at post time, refused here with a
    /// named error first).
    ///
    /// # Errors
    ///
    /// [`VerbsError::Unsupported`] for atomics without [`DeviceCaps::atomics`]
    /// and Write with Immediate without [`DeviceCaps::write_imm`];
    /// [`VerbsError::TooManySges`] above `max_sge` (or `max_sge_rd` for a
    /// Read); [`VerbsError::InlineTooLong`] above `max_inline` (when known).
    pub fn check_send_wr(&self, wr: &SendWr) -> Result<(), VerbsError> {
        if wr.op.is_atomic() && !self.atomics {
            return Err(VerbsError::Unsupported {
                what: "atomics on this device",
            });
        }
        if matches!(wr.op, SendOp::RdmaWriteWithImm { .. }) && !self.write_imm {
            return Err(VerbsError::Unsupported {
                what: "RDMA Write with Immediate on this device",
            });
        }
        match &wr.payload {
            Payload::Sges(sges) => {
                let max = if matches!(wr.op, SendOp::RdmaRead { .. }) {
                    self.max_sge_rd
                } else {
                    self.max_sge
                };
                if sges.len() > max as usize {
                    return Err(VerbsError::TooManySges {
                        num_sge: sges.len(),
                        max,
                    });
                }
            }
            Payload::Inline(data) => {
                if self.max_inline != 0 && data.len() > self.max_inline as usize {
                    return Err(VerbsError::InlineTooLong {
                        len: data.len(),
                        max: self.max_inline,
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Sge, Stag};

    #[test]
    fn chelsio_constants_are_the_notes_facts() {
        let t5 = DeviceCaps::CHELSIO_T5;
        assert_eq!(
            (t5.max_sge, t5.max_recv_sge, t5.max_sge_rd, t5.max_inline),
            (17, 4, 1, 280)
        );
        assert_eq!(
            (t5.max_ord, t5.max_ird, t5.max_qp_wr, t5.max_cqe),
            (32, 32, 8190, 65518)
        );
        assert!(!t5.atomics && !t5.write_imm && !t5.send_imm && t5.read_sink_needs_remote_write);
        let t6 = DeviceCaps::CHELSIO_T6;
        assert!(t6.write_imm && !t6.send_imm && !t6.atomics);
        assert_eq!(
            DeviceCaps {
                write_imm: false,
                ..t6
            },
            t5
        );
    }

    #[test]
    fn clamp_ord_ird_to_device_and_u8() {
        let t5 = DeviceCaps::CHELSIO_T5;
        assert_eq!(t5.clamp_ord_ird(128, 64), (32, 32));
        assert_eq!(t5.clamp_ord_ird(8, 0), (8, 0));
        let big = DeviceCaps {
            max_ord: 1000,
            max_ird: 1000,
            ..t5
        };
        assert_eq!(big.clamp_ord_ird(300, 255), (255, 255));
    }

    #[test]
    fn read_sink_rule_and_send_checks() {
        let t5 = DeviceCaps::CHELSIO_T5;
        let e = t5.check_read_sink(AccessFlags::LOCAL_WRITE).unwrap_err();
        assert_eq!(e.errno(), 22);
        assert!(e.to_string().contains("REMOTE_WRITE"), "{e}");
        t5.check_read_sink(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        let siw_like = DeviceCaps {
            read_sink_needs_remote_write: false,
            ..t5
        };
        siw_like.check_read_sink(AccessFlags::LOCAL_WRITE).unwrap();

        let s = |n| vec![Sge::new(0x1000, 8, Stag::from_raw(1)); n];
        let read2 = SendWr::rdma_read(1, s(2), 0, Stag::from_raw(2));
        assert_eq!(
            t5.check_send_wr(&read2).unwrap_err(),
            VerbsError::TooManySges { num_sge: 2, max: 1 }
        );
        t5.check_send_wr(&SendWr::rdma_read(1, s(1), 0, Stag::from_raw(2)))
            .unwrap();
        t5.check_send_wr(&SendWr::send(1, s(17))).unwrap();
        assert!(t5.check_send_wr(&SendWr::send(1, s(18))).is_err());
        t5.check_send_wr(&SendWr::send_inline(1, vec![0; 280]))
            .unwrap();
        assert_eq!(
            t5.check_send_wr(&SendWr::send_inline(1, vec![0; 281]))
                .unwrap_err(),
            VerbsError::InlineTooLong { len: 281, max: 280 }
        );
        let mut imm = SendWr::rdma_write(1, s(1), 0, Stag::from_raw(2));
        imm.op = SendOp::RdmaWriteWithImm {
            remote_addr: 0,
            rkey: Stag::from_raw(2),
            imm_data: 1,
        };
        assert_eq!(t5.check_send_wr(&imm).unwrap_err().errno(), 95);
        DeviceCaps::CHELSIO_T6.check_send_wr(&imm).unwrap();
        let mut cas = SendWr::send(1, s(1));
        cas.op = SendOp::AtomicCmpSwap {
            remote_addr: 0,
            rkey: Stag::from_raw(2),
            compare: 0,
            swap: 1,
        };
        assert_eq!(t5.check_send_wr(&cas).unwrap_err().errno(), 95);
    }
}
