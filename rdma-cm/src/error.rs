//! Errors of RDMA CM calls.

use crate::machine::{IdState, Refused};
use std::net::{IpAddr, SocketAddr};

/// Why an RDMA CM call failed. Each variant names the errno librdmacm would set
/// ([`CmError::errno`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// The call is not allowed in the id's state (`-EINVAL`, as `cma_comp_exch`
    /// failures in cma.c), e.g. `connect` before `resolve_route` completed.
    #[error("{op}: not allowed in state {state}")]
    InvalidState {
        /// The call.
        op: &'static str,
        /// The state the id was in.
        state: IdState,
    },
    /// `destroy` was called on an id from inside one of that id's own callbacks (for a
    /// `ConnectRequest`: the new id or its listener). It would wait for the callback
    /// that is calling it. Nothing was destroyed: return [`crate::Disposition::Destroy`]
    /// from the callback instead (the kernel's "return non-zero"), or drop the
    /// [`crate::CmId`] there, which destroys it when the callback returns.
    #[error("destroy of rdma_cm id #{id} from inside its own callback would wait for itself; return Disposition::Destroy instead")]
    DestroyInOwnCallback {
        /// The id.
        id: u64,
    },
    /// `destroy` was called on an id while the calling thread still holds `count`
    /// un-acked events of it from an event channel. librdmacm's `rdma_destroy_id`
    /// waits for those acks and hangs forever here; nothing was destroyed. Ack (drop)
    /// the events first. An event counts as held by the thread that took it from the
    /// channel (`get_event`, or polling the stream), even if it was handed to another
    /// thread since.
    #[error("destroy of rdma_cm id #{id} while this thread holds {count} un-acked event(s) of it (librdmacm would hang); ack them first")]
    UnackedEvents {
        /// The id.
        id: u64,
        /// Un-acked events of the id held by the calling thread.
        count: usize,
    },
    /// A call that waits for callbacks to finish (`remove_device`, `Removal::wait`,
    /// `RdmaCm::flush`) was made from inside a callback, where it could wait for
    /// itself (`-EDEADLK`). Nothing was waited for.
    #[error("{op}: called from inside an rdma_cm callback, which would wait for itself")]
    InCallback {
        /// The call.
        op: &'static str,
    },
    /// The id's device is being removed (state `DEVICE_REMOVAL`; `-ENODEV`). Destroy
    /// the id.
    #[error("{op}: the id's device is being removed")]
    DeviceRemoved {
        /// The call.
        op: &'static str,
    },
    /// The id is not bound to a device yet (no `bind_addr` to a device's address, no
    /// resolved address; `-ENODEV` in `rdma_create_qp`).
    #[error("{op}: the id is not bound to a device")]
    NoDevice {
        /// The call.
        op: &'static str,
    },
    /// No device owns this address (`-EADDRNOTAVAIL` from `rdma_bind_addr`, or from
    /// `rdma_resolve_addr` with a source address).
    #[error("no device has the address {0}")]
    AddressNotAvailable(IpAddr),
    /// The address and port are already bound by another id (`-EADDRINUSE`).
    #[error("address {0} is already in use")]
    AddressInUse(SocketAddr),
    /// No ephemeral port is free (`-EADDRNOTAVAIL`).
    #[error("no free ephemeral port")]
    NoPorts,
    /// Only IPv4 is supported (`-EAFNOSUPPORT`).
    #[error("{0}: only IPv4 is supported")]
    AddressFamily(SocketAddr),
    /// An argument is invalid (`-EINVAL`); `what` names it.
    #[error("invalid argument: {what}")]
    InvalidArgument {
        /// The argument.
        what: &'static str,
    },
    /// `connect`/`accept` on an id without a QP (iWARP needs one; create it with
    /// `create_qp` first).
    #[error("{op}: the id has no QP (create_qp first)")]
    NoQp {
        /// The call.
        op: &'static str,
    },
    /// `create_qp` on an id that already has one (`-EINVAL`).
    #[error("the id already has a QP")]
    QpExists,
    /// No device with this name is registered (`-ENODEV`).
    #[error("no device named {0:?}")]
    NoSuchDevice(String),
    /// A device with this name is already registered (`-EEXIST`).
    #[error("a device named {0:?} is already registered")]
    DuplicateDevice(String),
    /// The iWARP CM refused the call.
    #[error("iw_cm: {0}")]
    Iw(#[from] iw_cm::CmError),
    /// The device refused a verbs call (`create_qp`).
    #[error("verbs: {0}")]
    Verbs(#[from] verbs::VerbsError),
    /// The RDMA CM's worker thread could not be started or has stopped.
    #[error("rdma_cm worker: {0}")]
    Worker(String),
    /// A bounded wait expired.
    #[error("timed out waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
    },
}

impl CmError {
    /// The (positive) errno librdmacm / the kernel would report for this error.
    pub fn errno(&self) -> i32 {
        match self {
            CmError::InvalidState { .. }
            | CmError::InvalidArgument { .. }
            | CmError::QpExists
            | CmError::NoQp { .. } => 22, // EINVAL
            CmError::DestroyInOwnCallback { .. }
            | CmError::UnackedEvents { .. }
            | CmError::InCallback { .. } => 35, // EDEADLK
            CmError::DeviceRemoved { .. } | CmError::NoDevice { .. } | CmError::NoSuchDevice(_) => {
                19 // ENODEV
            }
            CmError::AddressNotAvailable(_) | CmError::NoPorts => 99, // EADDRNOTAVAIL
            CmError::AddressInUse(_) => 98,                           // EADDRINUSE
            CmError::AddressFamily(_) => 97,                          // EAFNOSUPPORT
            CmError::DuplicateDevice(_) => 17,                        // EEXIST
            CmError::Iw(e) => e.errno(),
            CmError::Verbs(e) => e.errno(),
            CmError::Worker(_) => 11,       // EAGAIN
            CmError::Timeout { .. } => 110, // ETIMEDOUT
        }
    }
}

impl Refused {
    /// The user call's error: [`CmError::DeviceRemoved`] during device removal,
    /// [`CmError::InvalidState`] (with [`crate::machine::Input::op`] and the state)
    /// otherwise.
    pub fn error(self) -> CmError {
        let op = self.input.op();
        match self.state {
            IdState::DeviceRemoval => CmError::DeviceRemoved { op },
            state => CmError::InvalidState { op, state },
        }
    }
}

impl From<Refused> for CmError {
    fn from(r: Refused) -> CmError {
        r.error()
    }
}
