//! Protection domains and memory regions over buffers the MR owns.

use crate::error::Result;
use crate::ffi::handles::{RawMr, RawPd};
use crate::read_sink::ReadSinkRule;
use crate::translate::{mr_access_to_ibv, verbs_error};
use std::sync::Arc;
use verbs::{AccessFlags, Sge, Stag, VerbsError};

/// A protection domain (`struct ibv_pd`). Cloning shares it; it is
/// deallocated when the last clone, MR and QP made on it are gone.
#[derive(Clone)]
pub struct Pd {
    pub(crate) raw: Arc<RawPd>,
    /// Its MRs without `REMOTE_WRITE`, for the Read-sink rule of its QPs.
    pub(crate) sinks: Arc<ReadSinkRule>,
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pd")
    }
}

impl Pd {
    /// Refuses (`true`) or allows (`false`) RDMA Reads into this PD's MRs registered
    /// without `REMOTE_WRITE`, on every QP made on it, whatever the device. On by
    /// default where the device needs it (iw_cxgb4:
    /// [`verbs::DeviceCaps::read_sink_needs_remote_write`]); on elsewhere it makes an
    /// application fail on kernel siw as it would on Chelsio hardware (the soft
    /// device's `DeviceConfig::strict_read_sink`).
    pub fn set_strict_read_sink(&self, on: bool) {
        self.sinks.set_enforce(on);
    }

    /// Registers a zero-filled buffer of `len` bytes that the MR owns
    /// (`ibv_reg_mr(3)`).
    ///
    /// # Errors
    ///
    /// As [`Pd::reg_mr_with`]; [`VerbsError::OutOfResources`] (`ENOMEM`) when the
    /// buffer cannot be allocated.
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        // A length from the network (a client's test) must not abort the process:
        // a buffer that cannot be had is ENOMEM.
        let mut buf = Vec::new();
        buf.try_reserve_exact(len)
            .map_err(|_| VerbsError::OutOfResources {
                what: "memory for the MR's buffer",
            })?;
        buf.resize(len, 0u8);
        self.reg_mr_with(buf.into_boxed_slice(), access)
    }

    /// Registers `buf` (`ibv_reg_mr(3)`); the MR owns it from now on, so it
    /// cannot move or be freed while registered, and frees it after
    /// deregistration.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidAccessFlags`] if `access` breaks the verbs rule
    /// (remote write or atomic without local write);
    /// [`VerbsError::InvalidArgument`] for an empty buffer or what the
    /// provider refuses with `EINVAL`; `ENOMEM` (RLIMIT_MEMLOCK) as out of
    /// resources.
    pub fn reg_mr_with(&self, buf: Box<[u8]>, access: AccessFlags) -> Result<Mr> {
        let bits = mr_access_to_ibv(access)?;
        if buf.is_empty() {
            return Err(VerbsError::InvalidArgument { what: "length" }.into());
        }
        let raw =
            RawMr::register(&self.raw, buf, bits).map_err(|e| verbs_error("ibv_reg_mr", e))?;
        self.sinks.registered(raw.lkey(), access);
        Ok(Mr {
            raw,
            access,
            sinks: self.sinks.clone(),
        })
    }
}

/// A memory region (`struct ibv_mr`) over a buffer it owns. Holds its PD;
/// on drop it deregisters, then frees the buffer. Drop it only after the WRs
/// posted on it have completed (or their QP is gone): see the crate's
/// contract on memory.
pub struct Mr {
    raw: RawMr,
    access: AccessFlags,
    sinks: Arc<ReadSinkRule>,
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.sinks.deregistered(self.raw.lkey());
    }
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .field("access", &self.access)
            .finish()
    }
}

impl Mr {
    /// The local key (the STag; equal to [`Mr::rkey`] on iWARP).
    pub fn lkey(&self) -> Stag {
        Stag::from_raw(self.raw.lkey())
    }

    /// The remote key to advertise to a peer.
    pub fn rkey(&self) -> Stag {
        Stag::from_raw(self.raw.rkey())
    }

    /// The iova of the first byte (the buffer's address).
    pub fn addr(&self) -> u64 {
        self.raw.addr()
    }

    /// The length, bytes.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Always false (empty registrations are refused).
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The access rights it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The buffer. The device writes it (receives, RDMA Writes, Read
    /// Responses) outside Rust's knowledge: read it after the completion.
    pub fn as_slice(&self) -> &[u8] {
        self.raw.bytes()
    }

    /// The buffer, writable (to fill what will be sent).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.raw.bytes_mut()
    }

    /// Copies `out.len()` bytes from byte `offset` with a raw copy: the way to read
    /// memory the device may still be writing (a byte polled for an RDMA Write's
    /// arrival). False if out of range.
    pub fn copy_out(&self, offset: usize, out: &mut [u8]) -> bool {
        self.raw.copy_out(offset, out)
    }

    /// Copies `data` to byte `offset` with a raw copy. False if out of range.
    pub fn copy_in(&mut self, offset: usize, data: &[u8]) -> bool {
        self.raw.copy_in(offset, data)
    }

    /// An SGE over `[offset, offset + len)` of the MR; `None` if the range
    /// is not inside it or `len` exceeds `u32`.
    pub fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        let end = offset.checked_add(len)?;
        if end > self.len() {
            return None;
        }
        Some(Sge::new(
            self.addr() + offset as u64,
            u32::try_from(len).ok()?,
            self.lkey(),
        ))
    }
}
