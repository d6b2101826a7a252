//! The per-id part of device removal (cma.c's `cma_remove_id_dev`), and `AddrChange`.

use super::{CmEvent, DevEntry, IdInner, Role};
use crate::device::CmDevice;
use crate::event::EventKind;
use crate::machine::{IdState, Input};
use crate::registry::RuleBreak;
use crate::stats::bump;
use crate::sync::{lock, Arc};

impl<D: CmDevice> IdInner<D> {
    /// The first half of device removal, done as soon as the device reports it
    /// ([`crate::device::DeviceNotifier::removed`]): mark `DEVICE_REMOVAL` unless
    /// destroy was asked, so that no event but the `DeviceRemoval` that
    /// [`Self::remove_id_dev`] delivers reaches the id. Never waits.
    pub(crate) fn mark_device_removal(&self) {
        let mut st = lock(&self.st);
        if let Ok(from) = self.exch(&mut st, Input::DeviceRemovalReported) {
            tracing::debug!(parent: &self.span, %from, "-> RDMA_CM_DEVICE_REMOVAL (device reported removal)");
        }
    }

    /// The per-id step of the removal of `entry` (cma.c's `cma_process_remove` loop
    /// body): an internal listener of a wildcard listen is destroyed silently, a user
    /// id gets [`Self::remove_id_dev`].
    pub(crate) fn device_removed(this: &Arc<Self>, entry: &Arc<DevEntry<D>>) {
        match &this.role {
            Role::Internal { parent } => {
                if this.shared.breaks(RuleBreak::RemovalHitsWildcardListener) {
                    IdInner::remove_id_dev(parent, entry);
                }
                IdInner::internal_teardown(this);
            }
            Role::User => IdInner::remove_id_dev(this, entry),
        }
    }

    /// cma.c's `cma_remove_id_dev` for one id of a device being removed: unless destroy
    /// was asked, mark `DEVICE_REMOVAL`, move the QP to ERROR, wait for a callback in
    /// progress, and if the id was not destroyed meanwhile (by that callback's return
    /// or by `destroy`), deliver exactly one `DeviceRemoval`.
    pub(crate) fn remove_id_dev(this: &Arc<Self>, entry: &DevEntry<D>) {
        let _span = this.span.enter();
        let ignore_destroying = this.shared.breaks(RuleBreak::RemovalIgnoresDestroying);
        let (qp, delivery) = {
            let mut st = lock(&this.st);
            match this.exch(&mut st, Input::RemoveIdDev { ignore_destroying }) {
                Ok(from) => tracing::debug!(%from, "-> RDMA_CM_DEVICE_REMOVAL"),
                Err(_) => {
                    tracing::debug!("device removal: destroy already asked; nothing delivered");
                    bump(&this.shared.counters.removals_skipped);
                    return;
                }
            }
            ([st.qp.clone(), st.user_qp.clone()], st.delivery.clone())
        };
        for qp in qp.iter().flatten() {
            entry.qp_to_error(qp);
        }
        let guard = if this.shared.breaks(RuleBreak::UnserializedRemoval) {
            None
        } else {
            Some(this.lock_handler())
        };
        if this.state() != IdState::DeviceRemoval && !ignore_destroying {
            tracing::debug!(
                "device removal: destroyed by a callback or destroy meanwhile; nothing delivered"
            );
            bump(&this.shared.counters.removals_skipped);
            return;
        }
        bump(&this.shared.counters.device_removals);
        // Read again under the handler lock: a `migrate` may have moved the id.
        let delivery = if guard.is_some() {
            lock(&this.st).delivery.clone()
        } else {
            delivery
        };
        Self::deliver(
            this,
            guard,
            delivery,
            CmEvent::new(EventKind::DeviceRemoval, 0),
        );
    }

    /// `AddrChange` for an id of a device whose addresses changed.
    pub(crate) fn addr_change(this: &Arc<Self>) {
        let guard = this.lock_handler();
        let delivery = {
            let st = lock(&this.st);
            if matches!(st.state.get(), IdState::Destroying | IdState::DeviceRemoval) {
                return;
            }
            st.delivery.clone()
        };
        Self::deliver(
            this,
            Some(guard),
            delivery,
            CmEvent::new(EventKind::AddrChange, 0),
        );
    }
}
