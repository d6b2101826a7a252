//! iw_cxgb4's rule that the sink of an RDMA Read (the local scatter list) lies in an MR
//! registered with `IBV_ACCESS_REMOTE_WRITE` (the adapter places the Read Response as
//! an inbound tagged write; kernel siw does not check). Posting such a Read on a
//! Chelsio adapter fails late and obscurely (the QP goes to ERROR with a protection
//! error), so the backend refuses it at `post_send` with the same clear error as
//! [`DeviceCaps::check_read_sink`].
//!
//! A PD's MRs registered without `REMOTE_WRITE` are remembered by lkey; a QP made on
//! the PD checks each RDMA Read's scatter list against them when the device has the
//! rule (its [`DeviceCaps::read_sink_needs_remote_write`]), or when the application
//! asked for it on any device ([`crate::Pd::set_strict_read_sink`]), as the soft
//! device's `DeviceConfig::strict_read_sink` does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use verbs::{AccessFlags, DeviceCaps, Payload, SendOp, SendWr, VerbsError};

/// The PD's record: lkeys of its MRs that lack `REMOTE_WRITE`, and whether the rule
/// is enforced. Shared by the PD, its MRs and its QPs.
#[derive(Debug, Default)]
pub(crate) struct ReadSinkRule {
    enforce: AtomicBool,
    no_remote_write: Mutex<HashMap<u32, AccessFlags>>,
}

impl ReadSinkRule {
    /// A record that enforces the rule when `enforce` (the device's caps say so).
    pub(crate) fn new(enforce: bool) -> ReadSinkRule {
        ReadSinkRule {
            enforce: AtomicBool::new(enforce),
            no_remote_write: Mutex::default(),
        }
    }

    /// Turns the check on or off for every QP of the PD.
    pub(crate) fn set_enforce(&self, on: bool) {
        self.enforce.store(on, Ordering::Relaxed);
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<u32, AccessFlags>> {
        self.no_remote_write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An MR `lkey` was registered with `access`.
    pub(crate) fn registered(&self, lkey: u32, access: AccessFlags) {
        if !access.contains(AccessFlags::REMOTE_WRITE) {
            self.keys().insert(lkey, access);
        }
    }

    /// The MR `lkey` was deregistered.
    pub(crate) fn deregistered(&self, lkey: u32) {
        self.keys().remove(&lkey);
    }

    /// Checks `wr`: an RDMA Read whose scatter list names an MR of this PD without
    /// `REMOTE_WRITE` is refused while the rule is enforced.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidArgument`] ("RDMA Read sink MR without REMOTE_WRITE
    /// (iw_cxgb4 requires it)").
    pub(crate) fn check(&self, wr: &SendWr) -> Result<(), VerbsError> {
        if !self.enforce.load(Ordering::Relaxed) || !matches!(wr.op, SendOp::RdmaRead { .. }) {
            return Ok(());
        }
        let Payload::Sges(sges) = &wr.payload else {
            return Ok(());
        };
        let keys = self.keys();
        for s in sges {
            if let Some(&access) = keys.get(&s.lkey.raw()) {
                DeviceCaps::CHELSIO_T5.check_read_sink(access)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs::{Sge, Stag};

    fn read_into(lkey: u32) -> SendWr {
        SendWr::rdma_read(
            7,
            vec![Sge::new(0x1000, 64, Stag::from_raw(lkey))],
            0x2000,
            Stag::from_raw(9),
        )
    }

    #[test]
    fn a_read_into_an_mr_without_remote_write_is_refused_when_enforced() {
        let r = ReadSinkRule::new(true);
        r.registered(0x100, AccessFlags::LOCAL_WRITE);
        r.registered(0x200, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
        let e = r.check(&read_into(0x100)).unwrap_err();
        assert_eq!(
            e,
            VerbsError::InvalidArgument {
                what: "RDMA Read sink MR without REMOTE_WRITE (iw_cxgb4 requires it)"
            }
        );
        r.check(&read_into(0x200)).unwrap();
        // A Send or Write from the same MR is fine; so is any MR once deregistered.
        r.check(&SendWr::send(
            1,
            vec![Sge::new(0x1000, 8, Stag::from_raw(0x100))],
        ))
        .unwrap();
        r.deregistered(0x100);
        r.check(&read_into(0x100)).unwrap();
    }

    #[test]
    fn the_rule_is_off_unless_the_device_or_the_application_asks() {
        let r = ReadSinkRule::new(false);
        r.registered(0x100, AccessFlags::LOCAL_WRITE);
        r.check(&read_into(0x100)).unwrap();
        r.set_enforce(true);
        assert!(r.check(&read_into(0x100)).is_err());
    }
}
