//! Errors of CM calls.

use crate::machine::{CmState, StateError};
use crate::provider::ProviderError;

/// Why a CM call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// The call is not allowed in the id's state (the kernel's `-EINVAL`), e.g.
    /// `accept` on an id that did not receive a connect request.
    #[error("{op}: not allowed in state {state}")]
    InvalidState {
        /// The call.
        op: &'static str,
        /// The state the id was in.
        state: CmState,
    },
    /// A connect or accept on this id is in flight; retry after its `ConnectReply` /
    /// `Established`, or destroy the id. (The kernel sleeps on `IWCM_F_CONNECT_WAIT`
    /// here; we never block.)
    #[error("{op}: a connect or accept is in flight")]
    Busy {
        /// The call.
        op: &'static str,
    },
    /// The id is being destroyed (state `DESTROYING`).
    #[error("{op}: the cm_id is being destroyed")]
    Destroyed {
        /// The call.
        op: &'static str,
    },
    /// A call that waits for event delivery was made on a CM worker thread (from a
    /// handler): it would wait for itself. Nothing was waited for.
    #[error("{op}: called from a CM event handler, which would wait for itself")]
    InDeliveryContext {
        /// The call.
        op: &'static str,
    },
    /// Private data longer than [`crate::MAX_PRIVATE_DATA`].
    #[error("private data is {len} bytes, more than {max}")]
    PrivateDataTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An IRD or ORD above [`crate::MAX_IRD_ORD`].
    #[error("{what} {value} is above the 14-bit MPA limit")]
    IrdOrdTooLarge {
        /// "IRD" or "ORD".
        what: &'static str,
        /// The value.
        value: u16,
    },
    /// The provider refused the downcall; the id's state was rolled back as the
    /// kernel does (`iw_cm_connect`/`iw_cm_accept`/`iw_cm_listen` error paths).
    #[error("provider: {0}")]
    Provider(#[from] ProviderError),
    /// The CM instance was shut down: no worker delivers events any more.
    #[error("the CM instance was shut down")]
    Shutdown,
    /// A bounded wait expired.
    #[error("timed out waiting for the CM workers")]
    Timeout,
    /// The CM could not start a worker thread.
    #[error("could not spawn a CM worker thread: {0}")]
    Spawn(String),
}

impl CmError {
    pub(crate) fn from_state(op: &'static str, e: StateError) -> CmError {
        match e {
            StateError::InvalidState(state) => CmError::InvalidState { op, state },
            StateError::Busy => CmError::Busy { op },
            StateError::Destroyed => CmError::Destroyed { op },
        }
    }

    /// The (positive) errno the kernel would return for this error.
    pub fn errno(&self) -> i32 {
        match self {
            CmError::InvalidState { .. }
            | CmError::PrivateDataTooLong { .. }
            | CmError::IrdOrdTooLarge { .. }
            | CmError::Destroyed { .. } => 22, // EINVAL
            CmError::Busy { .. } => 16,              // EBUSY
            CmError::InDeliveryContext { .. } => 35, // EDEADLK
            CmError::Provider(e) => e.errno(),
            CmError::Shutdown => 19, // ENODEV
            CmError::Timeout => 110, // ETIMEDOUT
            CmError::Spawn(_) => 11, // EAGAIN
        }
    }
}
