//! Device capabilities from `ibv_query_device(3)`: [`from_device_attr`] fills
//! the provider-neutral [`DeviceCaps`] (moved to `verbs`, where the soft device
//! states its own), completed with what a driver is known to do (the Chelsio facts
//! of shared/rdma-core-notes.md section 2).

use crate::ffi::types::{IbvDeviceAttr, IBV_ATOMIC_NONE};
pub use verbs::DeviceCaps;

/// Chelsio's IEEE vendor id (`ibv_device_attr.vendor_id`), 0x1425.
pub const CHELSIO_VENDOR_ID: u32 = 0x1425;

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

#[cfg(test)]
mod tests {
    use super::*;
    use verbs::AccessFlags;

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
    fn from_attr_generic_device() {
        let mut a = attr();
        a.atomic_cap = 1; // IBV_ATOMIC_HCA
        let c = from_device_attr(&a);
        assert_eq!((c.max_sge, c.max_recv_sge, c.max_sge_rd), (6, 6, 6));
        assert_eq!(
            (c.max_ord, c.max_ird, c.max_qp_wr, c.max_cqe),
            (64, 128, 1024, 4096)
        );
        assert!(c.atomics && !c.write_imm && !c.read_sink_needs_remote_write);
        assert_eq!(c.max_inline, 0);
        a.max_cqe = -1;
        assert_eq!(from_device_attr(&a).max_cqe, 0);
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
        let c = from_device_attr(&a);
        assert_eq!(
            (c.max_sge, c.max_recv_sge, c.max_sge_rd, c.max_inline),
            (17, 4, 1, 280)
        );
        assert_eq!((c.max_ord, c.max_ird), (16, 32));
        assert!(!c.write_imm && c.read_sink_needs_remote_write && !c.atomics);
        a.vendor_part_id = 0x6408; // T6 (25608, the fixture of the notes)
        assert!(from_device_attr(&a).write_imm);
    }

    #[test]
    fn a_generic_device_has_no_read_sink_rule() {
        let siw_like = from_device_attr(&attr());
        siw_like.check_read_sink(AccessFlags::LOCAL_WRITE).unwrap();
    }
}
