//! Device capabilities as data: what a device allows, read from
//! `ibv_query_device(3)` and completed with what a driver is known to do
//! (the Chelsio facts of shared/rdma-core-notes.md section 2).

use crate::ffi::types::{IbvDeviceAttr, IBV_ATOMIC_NONE};
use verbs::{AccessFlags, Payload, SendOp, SendWr, VerbsError};

/// Chelsio's IEEE vendor id (`ibv_device_attr.vendor_id`), 0x1425.
pub const CHELSIO_VENDOR_ID: u32 = 0x1425;

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

    /// The capabilities an `ibv_query_device(3)` result states. Negative
    /// counts read as 0. Inline size, Write/Send with Immediate and the Read
    /// sink rule are not in `ibv_device_attr`: they are 0 / false here,
    /// except for a Chelsio device (`vendor_id` 0x1425), where the T5 or T6
    /// facts fill them (T6 when `vendor_part_id` is 0x6xxx) and the SGE
    /// limits are the driver's (uverbs reports `max_sge` = min(send, recv)).
    pub fn from_device_attr(attr: &IbvDeviceAttr) -> DeviceCaps {
        let n = |v: i32| v.max(0) as u32;
        let mut caps = DeviceCaps {
            max_sge: n(attr.max_sge),
            max_recv_sge: n(attr.max_sge),
            max_sge_rd: n(attr.max_sge_rd),
            max_inline: 0,
            max_ord: n(attr.max_qp_init_rd_atom),
            max_ird: n(attr.max_qp_rd_atom),
            max_qp_wr: n(attr.max_qp_wr),
            max_cqe: n(attr.max_cqe),
            atomics: attr.atomic_cap != IBV_ATOMIC_NONE,
            write_imm: false,
            send_imm: false,
            read_sink_needs_remote_write: false,
        };
        if attr.vendor_id == CHELSIO_VENDOR_ID {
            let facts = if attr.vendor_part_id >> 12 == 6 {
                DeviceCaps::CHELSIO_T6
            } else {
                DeviceCaps::CHELSIO_T5
            };
            caps.max_sge = facts.max_sge;
            caps.max_recv_sge = facts.max_recv_sge.min(caps.max_recv_sge);
            caps.max_sge_rd = facts.max_sge_rd;
            caps.max_inline = facts.max_inline;
            caps.max_ord = caps.max_ord.min(facts.max_ord);
            caps.max_ird = caps.max_ird.min(facts.max_ird);
            caps.atomics = false;
            caps.write_imm = facts.write_imm;
            caps.send_imm = false;
            caps.read_sink_needs_remote_write = true;
        }
        caps
    }

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
    use verbs::{Sge, Stag};

    fn attr() -> IbvDeviceAttr {
        // A siw-like device (siw_main.c / siw.h figures are not asserted).
        IbvDeviceAttr {
            fw_ver: [0; 64],
            node_guid: 0,
            sys_image_guid: 0,
            max_mr_size: u64::MAX - 1,
            page_size_cap: 0xffff000,
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 1024,
            max_qp_wr: 1024,
            device_cap_flags: 0,
            max_sge: 6,
            max_sge_rd: 6,
            max_cq: 1024,
            max_cqe: 4096,
            max_mr: 1024,
            max_pd: 1024,
            max_qp_rd_atom: 128,
            max_ee_rd_atom: 0,
            max_res_rd_atom: 0,
            max_qp_init_rd_atom: 64,
            max_ee_init_rd_atom: 0,
            atomic_cap: 0,
            _max_ee_to_max_srq_sge: [0; 14],
            max_pkeys: 0,
            local_ca_ack_delay: 0,
            phys_port_cnt: 1,
        }
    }

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
    fn from_attr_generic_device() {
        let mut a = attr();
        a.atomic_cap = 1; // IBV_ATOMIC_HCA
        let c = DeviceCaps::from_device_attr(&a);
        assert_eq!((c.max_sge, c.max_recv_sge, c.max_sge_rd), (6, 6, 6));
        assert_eq!(
            (c.max_ord, c.max_ird, c.max_qp_wr, c.max_cqe),
            (64, 128, 1024, 4096)
        );
        assert!(c.atomics && !c.write_imm && !c.read_sink_needs_remote_write);
        assert_eq!(c.max_inline, 0);
        a.max_cqe = -1;
        assert_eq!(DeviceCaps::from_device_attr(&a).max_cqe, 0);
    }

    #[test]
    fn from_attr_chelsio_t5_and_t6() {
        let mut a = attr();
        a.vendor_id = 0x1425;
        a.vendor_part_id = 0x5410; // T5
        a.max_sge = 4; // what uverbs reports: min(17, 4)
        a.max_sge_rd = 1;
        a.max_qp_rd_atom = 32;
        a.max_qp_init_rd_atom = 16; // firmware below the 32 cap
        let c = DeviceCaps::from_device_attr(&a);
        assert_eq!(
            (c.max_sge, c.max_recv_sge, c.max_sge_rd, c.max_inline),
            (17, 4, 1, 280)
        );
        assert_eq!((c.max_ord, c.max_ird), (16, 32));
        assert!(!c.write_imm && c.read_sink_needs_remote_write && !c.atomics);
        a.vendor_part_id = 0x6408; // T6 (25608, the fixture of the notes)
        assert!(DeviceCaps::from_device_attr(&a).write_imm);
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
        let siw_like = DeviceCaps::from_device_attr(&attr());
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
