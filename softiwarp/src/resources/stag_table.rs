//! Protection domains, memory regions and the STag table of the soft device.
//!
//! # Model
//!
//! - A **PD** ([`PdId`]) groups MRs and QPs: an MR is usable by a QP only if both
//!   belong to the same PD (`ibv_alloc_pd(3)`; RFC 5040 §2 "Protection Domain").
//! - An **MR** ([`MemoryRegion`]) is memory owned by the library: a zero-initialised buffer of
//!   [`MemoryRegion::capacity`] bytes allocated at registration, plus the registration: iova
//!   base, length in bytes, access rights, PD, STag and state (valid / invalid).
//!   Byte `i` of the buffer is the byte at iova `iova + i`, which is also its
//!   Tagged Offset (TO) on the wire (RFC 5040 §2; RFC 5041 §4.1).
//! - The **STag** is `index << 8 | key` as in Linux siw (`siw_mem.c`): the 24-bit
//!   index names the MR's slot in the [`MrTable`], the 8-bit key is the consumer key.
//!   Index 0 is never handed out (siw avoids STag 0 too).
//!
//! # Unguessable STags
//!
//! A peer that could predict STags could aim Writes and Reads at MRs never
//! advertised to it. As Linux siw (`siw_mem_add` / `siw_mr_add_mem` draw a random
//! start for `xa_alloc_cyclic` over indices 1..2^24 - 1 on every registration), the
//! table draws its STags at random:
//!
//! - **Index.** Slot `s` of the table (a dense array, so a lookup is one multiply,
//!   one add and one array access: O(1)) answers to STag index
//!   `(mul * s + add) mod 2^24`, a bijection on 24 bits with `add` random (the
//!   random starting index) and `mul` random, odd and neither 1 nor 2^24 - 1, so two
//!   consecutively created slots never have adjacent indices. The lookup applies the
//!   inverse map, `(mul^-1 * (index - add)) mod 2^24`. The slot that would map to
//!   index 0 is skipped.
//! - **Key.** Every registration ([`MrTable::reg_mr`], [`MrTable::alloc_mr`]) draws
//!   a fresh random 8-bit key, different from the key of the slot's previous
//!   registration, so a stale STag held by a peer never matches a reused slot. A
//!   freed slot is reused last (FIFO).
//! - **Fast registration** takes the key the consumer puts in the [`FastReg`] WR (the
//!   verbs rule: `ib_update_fast_reg_key` / `ibv_inc_rkey`, siw `siw_fastreg` copies
//!   it), but refuses to re-register with the key of the MR's previous registration,
//!   so re-keying really changes the STag a peer holds; [`MrTable::fresh_key`] draws
//!   a random key for it.
//!
//! The generator is a ChaCha8 stream owned by the table, seeded from the OS through
//! std's `RandomState` ([`MrTable::new`]) or from a fixed seed for tests
//! ([`MrTable::with_seed`]).
//!
//! # Checks
//!
//! Every access by STag runs the same checks, in this order (the order the project
//! brief fixes; Linux siw `siw_check_mem` checks state, PD, rights, bounds in that
//! order after the index and key):
//!
//! 1. index names a registered MR, else [`ProtectionError::NoSuchIndex`];
//! 2. the key matches, else [`ProtectionError::KeyMismatch`];
//! 3. the PD matches the QP's, else [`ProtectionError::PdMismatch`];
//! 4. the MR is valid (registered, not invalidated), else [`ProtectionError::Invalid`];
//! 5. the access rights include the ones needed, else [`ProtectionError::AccessRights`];
//! 6. `[TO, TO + len)` lies in `[iova, iova + length)`, computed without overflow
//!    (a range that would wrap past 2^64 is out of bounds), else
//!    [`ProtectionError::Bounds`].
//!
//! # Remote invalidation
//!
//! A peer's Send with Invalidate (RFC 5040 §5.3) names an STag to invalidate. Only
//! an MR that allows it may be invalidated this way, as the IBTA rule (and Linux rxe,
//! `rxe_invalidate_mr`, which refuses MRs that are not of the fast-registration
//! type) have it: otherwise any peer holding one rkey of the PD could cut off every
//! other connection using the PD's MRs. [`MrTable::invalidate`] with `remote`
//! requires, after index, key and PD (siw `siw_invalidate_stag` checks the PD):
//!
//! - the MR is a fast-registration MR ([`MrTable::alloc_mr`]), or was registered
//!   with [`MrOptions::remote_invalidate`] (verbs has no access flag for this, so
//!   the choice is a registration option of this library), else
//!   [`ProtectionError::NotInvalidatable`];
//! - it grants some remote access (an MR never exposed cannot be named by the
//!   peer), else [`ProtectionError::AccessRights`].
//!
//! A refusal is a Terminate "STag cannot be Invalidated" (code 0x09,
//! [`ProtectionError::invalidate_cause`]) and leaves the MR valid.
//!
//! [`ProtectionError::tagged_cause`] and [`ProtectionError::rdmap_cause`] map a
//! failure to the Terminate error the RFCs prescribe for tagged placement (RFC 5041
//! §7, DDP Tagged Buffer Errors) and for the Data Source of an RDMA Read Request
//! (RFC 5040 §4.8, RDMAP Remote Protection Errors).
//!
//! # Concurrency and soundness
//!
//! MR memory is shared between application threads ([`MemoryRegion::write`], [`MemoryRegion::read`]) and
//! the engine thread (placement of incoming Writes, Sends and Read Responses; gathering
//! outgoing payload). Each MR keeps its registration *and* its bytes behind one
//! `std::sync::Mutex`. Every access, by either side, takes that lock, checks, and
//! copies; the engine takes it once per DDP segment and MR (one acquisition per FPDU
//! in the common single-MR case). No `unsafe` is used, so no data race and no
//! undefined behaviour is reachable even while a hostile peer writes into an MR that
//! the application is reading: the two copies are serialised by the lock; the
//! application may observe a mix of old and new *messages* (as with real RDMA, it
//! must wait for the completion before reading a buffer), but never a torn byte or
//! memory outside the buffer. The buffer never moves or changes size after
//! registration, and an `Arc<MemoryRegion>` keeps it alive after deregistration, so an engine
//! that resolved an MR for a message in flight never touches freed memory.
//!
//! No zero-copy accessor is offered to the application; the engine's own
//! zero-copy path (payload handed to the transport while the lock is held) is
//! crate-private.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use ddp_rdmap::terminate::{DdpTaggedCode, ErrorCause, RdmapOperationCode, RdmapProtectionCode};
use verbs::{AccessFlags, FastReg, ObjectKind, Stag, VerbsError};

/// Largest MR the table registers, in bytes (1 GiB). The buffer is allocated at
/// registration, so this bounds one registration's memory.
pub const MAX_MR_LEN: u64 = 1 << 30;

/// Default number of STag indices an [`MrTable`] hands out.
pub const DEFAULT_MAX_MRS: u32 = 1 << 16;

/// Registration options of [`MrTable::reg_mr_with`] beyond the verbs access flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MrOptions {
    /// Allow the peer to invalidate the MR with a Send with Invalidate (RFC 5040
    /// §5.3). Off by default: the IBTA rule lets a peer invalidate only
    /// fast-registered MRs (and type 2 memory windows), and verbs has no
    /// `IBV_ACCESS_*` bit to allow it for an ordinary registration, so this library
    /// offers it as an explicit option (see "Remote invalidation" in the
    /// [module documentation](self)). [`MrTable::alloc_mr`] MRs always allow it.
    pub remote_invalidate: bool,
}

/// A protection domain identifier (`struct ibv_pd`; RFC 5040 §2). Allocated by
/// [`MrTable::alloc_pd`]; the raw value is never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(u32);

impl PdId {
    /// The raw handle (never 0 for a PD from [`MrTable::alloc_pd`]).
    pub const fn raw(self) -> u32 {
        self.0
    }
}

/// Registration state of an MR (siw `stag_valid`; RFC 5040 §2: an invalidated STag
/// must not be used for placement until it is registered again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MrState {
    /// The STag may be used within the MR's rights and bounds.
    Valid,
    /// Allocated for fast registration, invalidated, or deregistered: every access
    /// by STag fails.
    Invalid,
}

/// Why an access by STag was refused. The variants follow the check order of the
/// [module documentation](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ProtectionError {
    /// No MR is registered under the STag's index.
    #[error("no MR with STag index {index:#x}")]
    NoSuchIndex {
        /// The 24-bit index looked up.
        index: u32,
    },
    /// The MR at this index answers to another key (stale or forged STag).
    #[error("STag key {key:#04x} does not match the MR's key {expected:#04x}")]
    KeyMismatch {
        /// The key presented.
        key: u8,
        /// The MR's current key.
        expected: u8,
    },
    /// The MR belongs to another PD than the QP (RFC 5040 §2: STag not associated
    /// with this stream).
    #[error("MR belongs to PD {mr_pd:?}, not {pd:?}")]
    PdMismatch {
        /// The QP's PD.
        pd: PdId,
        /// The MR's PD.
        mr_pd: PdId,
    },
    /// The MR is not valid (invalidated, not yet fast-registered, or deregistered).
    #[error("STag is invalid")]
    Invalid,
    /// A remote invalidation (Send with Invalidate) named an MR that does not allow
    /// one: neither fast-registered nor registered with
    /// [`MrOptions::remote_invalidate`] (see "Remote invalidation" in the
    /// [module documentation](self)). Only [`MrTable::invalidate`] reports it.
    #[error("MR does not allow remote invalidation")]
    NotInvalidatable,
    /// The MR does not grant the rights the access needs.
    #[error("access {needed:?} not granted (MR grants {granted:?})")]
    AccessRights {
        /// Rights the access needs.
        needed: AccessFlags,
        /// Rights the MR grants.
        granted: AccessFlags,
    },
    /// `[to, to + len)` is not inside `[iova, iova + length)` (or wraps past 2^64).
    #[error("range [{to:#x}, +{len}) outside MR [{iova:#x}, +{length})")]
    Bounds {
        /// First TO / iova accessed.
        to: u64,
        /// Bytes accessed.
        len: u64,
        /// The MR's base iova.
        iova: u64,
        /// The MR's length in bytes.
        length: u64,
    },
}

impl ProtectionError {
    /// The Terminate error for a failed tagged placement (incoming RDMA Write or
    /// RDMA Read Response): DDP Tagged Buffer Error "Invalid STag" (no such index,
    /// wrong key, invalid state), "STag not associated with DDP Stream" (PD
    /// mismatch), "Base or bounds violation" (RFC 5041 §7). RFC 5041 has no code for
    /// access rights, which RDMAP owns: that one is RDMAP Remote Protection Error
    /// "Access rights violation" (RFC 5040 §4.8). (Linux siw sends DDP "Invalid
    /// STag" for it instead, `siw_tagged_error`.)
    pub const fn tagged_cause(&self) -> ErrorCause {
        match self {
            ProtectionError::NoSuchIndex { .. }
            | ProtectionError::KeyMismatch { .. }
            | ProtectionError::Invalid
            | ProtectionError::NotInvalidatable => {
                ErrorCause::DdpTagged(DdpTaggedCode::InvalidStag)
            }
            ProtectionError::PdMismatch { .. } => {
                ErrorCause::DdpTagged(DdpTaggedCode::StagNotAssociated)
            }
            ProtectionError::Bounds { .. } => {
                ErrorCause::DdpTagged(DdpTaggedCode::BaseOrBoundsViolation)
            }
            ProtectionError::AccessRights { .. } => {
                ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::AccessRightsViolation)
            }
        }
    }

    /// The Terminate error for a failed check of an RDMA Read Request's Data Source
    /// (RFC 5040 §4.8, RDMAP Remote Protection Error): "Invalid STag", "STag not
    /// associated with RDMAP Stream", "Access rights violation", "Base or bounds
    /// violation" (Linux siw `siw_rdmap_error` maps the same way).
    pub const fn rdmap_cause(&self) -> ErrorCause {
        ErrorCause::RdmapRemoteProtection(match self {
            ProtectionError::NoSuchIndex { .. }
            | ProtectionError::KeyMismatch { .. }
            | ProtectionError::Invalid
            | ProtectionError::NotInvalidatable => RdmapProtectionCode::InvalidStag,
            ProtectionError::PdMismatch { .. } => RdmapProtectionCode::StagNotAssociated,
            ProtectionError::AccessRights { .. } => RdmapProtectionCode::AccessRightsViolation,
            ProtectionError::Bounds { .. } => RdmapProtectionCode::BaseOrBoundsViolation,
        })
    }

    /// The Terminate error for a Send with Invalidate whose Invalidate STag cannot
    /// be invalidated (RFC 5040 §4.8 code 0x09, Layer RDMAP): as a Remote
    /// Protection Error (EType 1) when the STag belongs to another PD (the split
    /// Linux siw makes in `siw_rdmap_complete`: `-EACCES` from
    /// `siw_invalidate_stag`) or names an MR that does not allow remote
    /// invalidation (a protection decision too: the peer lacks the right), as a
    /// Remote Operation Error (EType 2) otherwise (unknown index, wrong key,
    /// local-only MR).
    pub const fn invalidate_cause(&self) -> ErrorCause {
        match self {
            ProtectionError::PdMismatch { .. } | ProtectionError::NotInvalidatable => {
                ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::StagCannotBeInvalidated)
            }
            _ => ErrorCause::RdmapRemoteOperation(RdmapOperationCode::StagCannotBeInvalidated),
        }
    }
}

/// The registration and the bytes of one MR, behind the MR's lock.
#[derive(Debug)]
struct MrInner {
    key: u8,
    /// The key of the latest fast registration, which a fast registration may not
    /// reuse (`None` before the first one, and for [`MrTable::reg_mr`] MRs).
    fast_reg_key: Option<u8>,
    iova: u64,
    length: u64,
    access: AccessFlags,
    pd: PdId,
    state: MrState,
    data: MrBuffer,
}

/// The bytes of an MR: a zeroed buffer the library allocated ([`MrTable::reg_mr`],
/// [`MrTable::alloc_mr`]), or the application's own memory
/// ([`MrTable::reg_user_memory`], reached only through [`super::user_memory`]).
#[derive(Debug)]
enum MrBuffer {
    Owned(Box<[u8]>),
    User {
        mem: super::user_memory::UserMemory,
        /// What [`MrBuffer::with_bytes`] copies a send's bytes into: kept, so that a
        /// stream of FPDUs from user memory allocates nothing per FPDU.
        scratch: Vec<u8>,
    },
}

impl MrBuffer {
    fn len(&self) -> usize {
        match self {
            MrBuffer::Owned(b) => b.len(),
            MrBuffer::User { mem, .. } => mem.len(),
        }
    }

    /// Copies `data` to byte `off`; false (nothing copied) if it does not fit.
    fn copy_in(&mut self, off: usize, data: &[u8]) -> bool {
        match self {
            MrBuffer::Owned(b) => match off.checked_add(data.len()).and_then(|e| b.get_mut(off..e))
            {
                Some(dst) => {
                    dst.copy_from_slice(data);
                    true
                }
                None => false,
            },
            MrBuffer::User { mem, .. } => mem.copy_in(off, data),
        }
    }

    /// Copies `out.len()` bytes from byte `off`; false (nothing copied) if out of range.
    fn copy_out(&self, off: usize, out: &mut [u8]) -> bool {
        match self {
            MrBuffer::Owned(b) => match off.checked_add(out.len()).and_then(|e| b.get(off..e)) {
                Some(src) => {
                    out.copy_from_slice(src);
                    true
                }
                None => false,
            },
            MrBuffer::User { mem, .. } => mem.copy_out(off, out),
        }
    }

    /// Hands `len` bytes at `off` to `f` (`None` if out of range). Owned: in place;
    /// user memory: a copy into the kept scratch buffer, so that no reference into the
    /// application's memory is formed (the [`super::user_memory`] contract).
    fn with_bytes<R>(&mut self, off: usize, len: usize, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
        match self {
            MrBuffer::Owned(b) => f(off.checked_add(len).and_then(|e| b.get(off..e))),
            MrBuffer::User { mem, scratch } => {
                scratch.resize(len, 0);
                if mem.copy_out(off, scratch) {
                    f(Some(scratch))
                } else {
                    f(None)
                }
            }
        }
    }
}

impl MrBuffer {
    /// An RDMA atomic on the 64-bit word (native byte order) at `off`: replaces it by
    /// `f(old)` and returns `old`; `None` if out of range. Owned: under the MR's lock
    /// (the caller holds it), which every other access of the word takes too. User
    /// memory: [`super::user_memory::UserMemory::atomic_update`].
    fn atomic_update(&mut self, off: usize, f: impl Fn(u64) -> u64) -> Option<u64> {
        match self {
            MrBuffer::Owned(b) => {
                let word = off.checked_add(8).and_then(|e| b.get_mut(off..e))?;
                let mut bytes = [0u8; 8];
                bytes.copy_from_slice(word);
                let old = u64::from_ne_bytes(bytes);
                word.copy_from_slice(&f(old).to_ne_bytes());
                Some(old)
            }
            MrBuffer::User { mem, .. } => mem.atomic_update(off, f),
        }
    }
}

impl MrInner {
    /// Whether `stag` (its key) and `pd` name this MR: the first two checks of every
    /// access and of an invalidation (RFC 5040 section 7, Invalid STag; siw's
    /// `siw_check_mem` and `siw_invalidate_stag`).
    ///
    /// Errors: [`ProtectionError::KeyMismatch`], then [`ProtectionError::PdMismatch`].
    fn names(&self, stag: Stag, pd: PdId) -> Result<(), ProtectionError> {
        if self.key != stag.key() {
            return Err(ProtectionError::KeyMismatch {
                key: stag.key(),
                expected: self.key,
            });
        }
        if self.pd != pd {
            return Err(ProtectionError::PdMismatch { pd, mr_pd: self.pd });
        }
        Ok(())
    }

    /// Checks 2-6 of the module documentation (the index already matched).
    /// Returns the buffer offset of `to`.
    fn check(
        &self,
        stag: Stag,
        pd: PdId,
        to: u64,
        len: u64,
        needed: AccessFlags,
    ) -> Result<usize, ProtectionError> {
        self.names(stag, pd)?;
        if self.state != MrState::Valid {
            return Err(ProtectionError::Invalid);
        }
        if !self.access.contains(needed) {
            return Err(ProtectionError::AccessRights {
                needed,
                granted: self.access,
            });
        }
        self.bounds(to, len)
    }

    /// Check 6 alone: the buffer offset of `[to, to + len)` if it lies within the
    /// registration (and therefore within the buffer).
    fn bounds(&self, to: u64, len: u64) -> Result<usize, ProtectionError> {
        let err = ProtectionError::Bounds {
            to,
            len,
            iova: self.iova,
            length: self.length,
        };
        let off = to.checked_sub(self.iova).ok_or(err)?;
        let end = off.checked_add(len).ok_or(err)?;
        if end > self.length || end > self.data.len() as u64 {
            return Err(err);
        }
        usize::try_from(off).map_err(|_| err)
    }
}

/// One memory region: a library-owned buffer plus its registration (see the
/// [module documentation](self)). Shared as `Arc<MemoryRegion>` by the application, the
/// [`MrTable`] and the engine.
#[derive(Debug)]
pub struct MemoryRegion {
    index: u32,
    fast_reg: bool,
    remote_inv: bool,
    capacity: usize,
    dead: AtomicBool,
    inner: Mutex<MrInner>,
}

impl MemoryRegion {
    fn lock(&self) -> MutexGuard<'_, MrInner> {
        // A panic while the lock is held cannot leave the registration half
        // updated (updates are single assignments), so a poisoned lock is usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The 24-bit STag index naming this MR in its table.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The current STag (`index << 8 | key`): the MR's lkey and rkey
    /// (`ibv_mr.lkey` / `rkey`). Changes when a fast registration sets a new key.
    pub fn stag(&self) -> Stag {
        let key = self.lock().key;
        Stag::from_raw((self.index << Stag::INDEX_SHIFT) | u32::from(key))
    }

    /// The iova of the first registered byte (its Tagged Offset).
    pub fn iova(&self) -> u64 {
        self.lock().iova
    }

    /// Length of the registered range, in bytes (0 before a fast registration).
    pub fn length(&self) -> u64 {
        self.lock().length
    }

    /// Size of the buffer, in bytes: the registered length for [`MrTable::reg_mr`],
    /// the maximum length for [`MrTable::alloc_mr`].
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The access rights of the registration.
    pub fn access(&self) -> AccessFlags {
        self.lock().access
    }

    /// The PD the MR belongs to.
    pub fn pd(&self) -> PdId {
        self.lock().pd
    }

    /// Registration state.
    pub fn state(&self) -> MrState {
        self.lock().state
    }

    /// True if the MR came from [`MrTable::alloc_mr`] and may be fast-registered.
    pub fn is_fast_reg(&self) -> bool {
        self.fast_reg
    }

    /// True if a peer's Send with Invalidate may invalidate the MR: a
    /// fast-registration MR, or one registered with [`MrOptions::remote_invalidate`].
    pub fn allows_remote_invalidate(&self) -> bool {
        self.fast_reg || self.remote_inv
    }

    /// True once the MR was deregistered ([`MrTable::dereg_mr`]).
    pub fn is_deregistered(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Copies `data` into the buffer at byte `offset` (the byte at iova
    /// `iova + offset`), under the MR's lock. Works in any state: the buffer belongs
    /// to the application whether or not the STag is valid.
    ///
    /// # Errors
    ///
    /// [`VerbsError::MrOutOfBounds`] if `offset + data.len()` exceeds
    /// [`MemoryRegion::capacity`] bytes.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), VerbsError> {
        let mut g = self.lock();
        let range = self.buffer_range(&g, offset, data.len())?;
        g.data.copy_in(range.start, data);
        Ok(())
    }

    /// Copies `out.len()` bytes from byte `offset` of the buffer into `out`, under
    /// the MR's lock.
    ///
    /// # Errors
    ///
    /// [`VerbsError::MrOutOfBounds`] if `offset + out.len()` exceeds
    /// [`MemoryRegion::capacity`] bytes.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), VerbsError> {
        let g = self.lock();
        let range = self.buffer_range(&g, offset, out.len())?;
        g.data.copy_out(range.start, out);
        Ok(())
    }

    /// A copy of the whole buffer ([`MemoryRegion::capacity`] bytes).
    pub fn to_vec(&self) -> Vec<u8> {
        let g = self.lock();
        let mut v = vec![0u8; g.data.len()];
        g.data.copy_out(0, &mut v);
        v
    }

    fn buffer_range(
        &self,
        g: &MrInner,
        offset: usize,
        len: usize,
    ) -> Result<core::ops::Range<usize>, VerbsError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.capacity => Ok(offset..end),
            _ => Err(VerbsError::MrOutOfBounds {
                addr: g.iova.wrapping_add(offset as u64),
                length: len as u64,
                mr_addr: g.iova,
                mr_length: self.capacity as u64,
            }),
        }
    }

    /// Runs the checks 2-6 for `[to, to + len)` and returns the buffer offset of
    /// `to`. The index is assumed to match.
    pub(crate) fn resolve(
        &self,
        stag: Stag,
        pd: PdId,
        to: u64,
        len: u64,
        needed: AccessFlags,
    ) -> Result<usize, ProtectionError> {
        self.lock().check(stag, pd, to, len, needed)
    }

    /// Tagged placement: checks 2-6 and copies `data` to `to`, under one lock
    /// acquisition. Nothing is written unless every check passes.
    pub(crate) fn place(
        &self,
        stag: Stag,
        pd: PdId,
        to: u64,
        data: &[u8],
        needed: AccessFlags,
    ) -> Result<(), ProtectionError> {
        let mut g = self.lock();
        let off = g.check(stag, pd, to, data.len() as u64, needed)?;
        g.data.copy_in(off, data);
        Ok(())
    }

    /// Copies `data` to buffer offset `off` of a range resolved earlier. Bounded by
    /// the buffer: bytes that would fall outside it are dropped (cannot happen for a
    /// resolved range, whose buffer never shrinks). Returns false if dropped.
    pub(crate) fn store(&self, off: usize, data: &[u8]) -> bool {
        self.lock().data.copy_in(off, data)
    }

    /// Executes an RFC 7306 atomic on the 64-bit word (native byte order) at buffer
    /// offset `off` of a range resolved earlier, under the MR's lock: the word becomes
    /// `f(old)`; returns `old`, the Original Remote Data Value. `None` (nothing
    /// changed) if the word is outside the buffer (cannot happen for a resolved range).
    pub(crate) fn atomic_update(&self, off: usize, f: impl Fn(u64) -> u64) -> Option<u64> {
        self.lock().data.atomic_update(off, f)
    }

    /// Hands `len` bytes at buffer offset `off` to `f` while the lock is held (the
    /// engine's zero-copy TX path). `f` gets `None` if the range is outside the
    /// buffer (cannot happen for a resolved range).
    pub(crate) fn with_bytes<R>(
        &self,
        off: usize,
        len: usize,
        f: impl FnOnce(Option<&[u8]>) -> R,
    ) -> R {
        self.lock().data.with_bytes(off, len, f)
    }
}

/// What kind of registration [`MrTable::insert`] makes.
#[derive(Debug, Clone, Copy)]
struct MrKind {
    fast_reg: bool,
    remote_inv: bool,
}

#[derive(Debug, Default)]
struct Slot {
    mr: Option<Arc<MemoryRegion>>,
    /// The key of the slot's latest registration; `None` for a fresh slot.
    last_key: Option<u8>,
}

/// Number of STag indices (24 bits).
const INDEX_SPACE: u32 = 1 << 24;
const INDEX_MASK: u32 = INDEX_SPACE - 1;

/// The random bijection between slot numbers and STag indices (see "Unguessable
/// STags" in the [module documentation](self)): `index = (mul * slot + add) mod 2^24`.
#[derive(Debug, Clone, Copy)]
struct IndexMap {
    /// Odd, neither 1 nor 2^24 - 1.
    mul: u32,
    /// `mul`'s inverse modulo 2^24.
    inv: u32,
    /// The index of slot 0: the random starting index.
    add: u32,
}

impl IndexMap {
    fn random(rng: &mut ChaCha8Rng) -> IndexMap {
        let mul = loop {
            let m = (rng.next_u32() & INDEX_MASK) | 1;
            if m != 1 && m != INDEX_MASK {
                break m;
            }
        };
        // Newton's iteration for the inverse modulo 2^24: each step doubles the
        // number of correct low bits (an odd `mul` is its own inverse mod 8).
        let mut inv = mul;
        for _ in 0..4 {
            inv = inv.wrapping_mul(2u32.wrapping_sub(mul.wrapping_mul(inv)));
        }
        IndexMap {
            mul,
            inv: inv & INDEX_MASK,
            add: rng.next_u32() & INDEX_MASK,
        }
    }

    /// The STag index of slot `slot`.
    fn index(self, slot: u32) -> u32 {
        self.mul.wrapping_mul(slot).wrapping_add(self.add) & INDEX_MASK
    }

    /// The slot of STag index `index` (any 24-bit value; the slot may not exist).
    fn slot(self, index: u32) -> u32 {
        self.inv.wrapping_mul(index.wrapping_sub(self.add)) & INDEX_MASK
    }
}

#[derive(Debug)]
struct Table {
    /// Slot `s` holds the MR of STag index `map.index(s)`; the slot mapping to
    /// index 0 is never used.
    slots: Vec<Slot>,
    /// Freed slot numbers, reused first in, first out.
    free: VecDeque<u32>,
    /// Slots handed out so far (the slot of index 0 not counted).
    made: u32,
    max_mrs: u32,
    map: IndexMap,
    rng: ChaCha8Rng,
    /// Live PDs and the number of MRs in each.
    pds: HashMap<u32, usize>,
    next_pd: u32,
}

impl Table {
    /// A random key other than `avoid`.
    fn key_other_than(&mut self, avoid: Option<u8>) -> u8 {
        loop {
            let k = (self.rng.next_u32() & 0xff) as u8;
            if Some(k) != avoid {
                return k;
            }
        }
    }

    /// The slot holding STag index `index`, if the table made it.
    fn slot(&self, index: u32) -> Option<&Slot> {
        if index == 0 || index > INDEX_MASK {
            return None;
        }
        self.slots.get(self.map.slot(index) as usize)
    }

    fn slot_mut(&mut self, index: u32) -> Option<&mut Slot> {
        if index == 0 || index > INDEX_MASK {
            return None;
        }
        let s = self.map.slot(index) as usize;
        self.slots.get_mut(s)
    }
}

/// A seed from the OS: std's `RandomState` keys its hashers with random bytes the
/// OS provides (once per thread, then varied per `RandomState`).
fn os_seed() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(0x5749_4152_5053_5441u64)
}

/// The STag table of one device: PDs, and the MRs by STag index (siw's `mem_xa`).
///
/// Shared (`Arc<MrTable>`) by the application threads, which register and
/// deregister, and the engine, which looks STags up for placement. Lookups take a
/// read lock on the table; registration changes take the write lock.
#[derive(Debug)]
pub struct MrTable {
    inner: RwLock<Table>,
}

impl Default for MrTable {
    fn default() -> Self {
        MrTable::new()
    }
}

impl MrTable {
    /// An empty table handing out up to [`DEFAULT_MAX_MRS`] STag indices, its STags
    /// drawn from a generator seeded by the OS.
    pub fn new() -> MrTable {
        MrTable::with_max_mrs(DEFAULT_MAX_MRS)
    }

    /// An empty table handing out up to `max_mrs` STag indices (clamped to
    /// [`Stag::MAX_INDEX`]), its STags drawn from a generator seeded by the OS.
    pub fn with_max_mrs(max_mrs: u32) -> MrTable {
        MrTable::with_seed(max_mrs, os_seed())
    }

    /// As [`MrTable::with_max_mrs`] with the STag generator seeded by `seed`: the
    /// same seed and the same calls give the same STags (for tests).
    pub fn with_seed(max_mrs: u32, seed: u64) -> MrTable {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let map = IndexMap::random(&mut rng);
        MrTable {
            inner: RwLock::new(Table {
                slots: Vec::new(),
                free: VecDeque::new(),
                made: 0,
                max_mrs: max_mrs.min(Stag::MAX_INDEX),
                map,
                rng,
                pds: HashMap::new(),
                next_pd: 1,
            }),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Table> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Table> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Allocates a PD (`ibv_alloc_pd(3)`).
    ///
    /// # Errors
    ///
    /// [`VerbsError::OutOfResources`] `"PD handles"` once 2^32 - 1 PDs were handed
    /// out.
    pub fn alloc_pd(&self) -> Result<PdId, VerbsError> {
        let mut t = self.write();
        let id = t.next_pd;
        if id == 0 {
            return Err(VerbsError::OutOfResources { what: "PD handles" });
        }
        t.next_pd = id.wrapping_add(1);
        t.pds.insert(id, 0);
        Ok(PdId(id))
    }

    /// Frees a PD (`ibv_dealloc_pd(3)`).
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidHandle`] for an unknown PD; [`VerbsError::InUse`] while
    /// MRs are registered in it (`EBUSY`, as `ibv_dealloc_pd(3)`).
    pub fn dealloc_pd(&self, pd: PdId) -> Result<(), VerbsError> {
        let mut t = self.write();
        match t.pds.get(&pd.0) {
            None => Err(VerbsError::InvalidHandle {
                object: ObjectKind::Pd,
                handle: pd.0,
            }),
            Some(&n) if n > 0 => Err(VerbsError::InUse {
                object: ObjectKind::Pd,
            }),
            Some(_) => {
                t.pds.remove(&pd.0);
                Ok(())
            }
        }
    }

    /// True if `pd` is allocated.
    pub fn pd_exists(&self, pd: PdId) -> bool {
        self.read().pds.contains_key(&pd.0)
    }

    /// Registers a new MR of `length` bytes at iova `iova` with `access` rights in
    /// `pd` (`ibv_reg_mr(3)`; the library allocates the zeroed buffer). The MR is
    /// valid at once; its key is the slot's previous key plus one (0 for a fresh
    /// slot).
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidHandle`] (unknown PD), [`VerbsError::InvalidAccessFlags`]
    /// (the verbs rule, [`AccessFlags::validate_for_mr`]),
    /// [`VerbsError::InvalidArgument`] `"length"` (0 or above [`MAX_MR_LEN`]) or
    /// `"iova"` (`iova + length` wraps past 2^64), [`VerbsError::OutOfResources`]
    /// (`"STag indices"`, or `"memory"` if the buffer cannot be allocated).
    pub fn reg_mr(
        &self,
        pd: PdId,
        iova: u64,
        length: u64,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>, VerbsError> {
        self.reg_mr_with(pd, iova, length, access, MrOptions::default())
    }

    /// [`MrTable::reg_mr`] with registration options: with
    /// [`MrOptions::remote_invalidate`] the peer may invalidate the MR by a Send
    /// with Invalidate.
    ///
    /// # Errors
    ///
    /// As [`MrTable::reg_mr`].
    pub fn reg_mr_with(
        &self,
        pd: PdId,
        iova: u64,
        length: u64,
        access: AccessFlags,
        options: MrOptions,
    ) -> Result<Arc<MemoryRegion>, VerbsError> {
        self.reg_valid(pd, iova, length, access, options, None)
    }

    /// Registers `mem`, the application's own memory (wrapped by the unsafe
    /// [`UserMemory::new`](super::user_memory::UserMemory::new) under its contract), as
    /// an MR at iova `iova` with `access` in `pd`: placement writes straight into that
    /// memory and sends read from it. Otherwise as [`MrTable::reg_mr_with`].
    ///
    /// # Errors
    ///
    /// As [`MrTable::reg_mr`].
    pub fn reg_user_memory(
        &self,
        pd: PdId,
        mem: super::user_memory::UserMemory,
        iova: u64,
        access: AccessFlags,
        options: MrOptions,
    ) -> Result<Arc<MemoryRegion>, VerbsError> {
        let length = mem.len() as u64;
        let buffer = MrBuffer::User {
            mem,
            scratch: Vec::new(),
        };
        self.reg_valid(pd, iova, length, access, options, Some(buffer))
    }

    /// The checks and the registration of [`MrTable::reg_mr_with`] and
    /// [`MrTable::reg_user_memory`]: a zeroed buffer of `length` bytes when `data` is
    /// `None`.
    fn reg_valid(
        &self,
        pd: PdId,
        iova: u64,
        length: u64,
        access: AccessFlags,
        options: MrOptions,
        data: Option<MrBuffer>,
    ) -> Result<Arc<MemoryRegion>, VerbsError> {
        access.validate_for_mr()?;
        if length == 0 || length > MAX_MR_LEN {
            return Err(VerbsError::InvalidArgument { what: "length" });
        }
        if iova.checked_add(length).is_none() {
            return Err(VerbsError::InvalidArgument { what: "iova" });
        }
        let kind = MrKind {
            fast_reg: false,
            remote_inv: options.remote_invalidate,
        };
        let make = |key, data| MrInner {
            key,
            fast_reg_key: None,
            iova,
            length,
            access,
            pd,
            state: MrState::Valid,
            data,
        };
        match data {
            None => self.insert(pd, length, kind, make),
            Some(buffer) => self.insert_buffer(pd, buffer, kind, make),
        }
    }

    /// Allocates an MR of up to `max_len` bytes for fast registration (kernel
    /// `ib_alloc_mr`, siw `siw_alloc_mr`): invalid, no rights, length 0, until a
    /// [`FastReg`] WR (or [`MrTable::fast_reg`]) registers it.
    ///
    /// # Errors
    ///
    /// As [`MrTable::reg_mr`] (`"length"` for 0 or above [`MAX_MR_LEN`]).
    pub fn alloc_mr(&self, pd: PdId, max_len: u64) -> Result<Arc<MemoryRegion>, VerbsError> {
        if max_len == 0 || max_len > MAX_MR_LEN {
            return Err(VerbsError::InvalidArgument { what: "length" });
        }
        let kind = MrKind {
            fast_reg: true,
            remote_inv: true,
        };
        self.insert(pd, max_len, kind, |key, data| MrInner {
            key,
            fast_reg_key: None,
            iova: 0,
            length: 0,
            access: AccessFlags::empty(),
            pd,
            state: MrState::Invalid,
            data,
        })
    }

    fn insert(
        &self,
        pd: PdId,
        len: u64,
        kind: MrKind,
        make: impl FnOnce(u8, MrBuffer) -> MrInner,
    ) -> Result<Arc<MemoryRegion>, VerbsError> {
        let capacity =
            usize::try_from(len).map_err(|_| VerbsError::OutOfResources { what: "memory" })?;
        // Allocate before taking the table lock.
        let mut buf = Vec::new();
        buf.try_reserve_exact(capacity)
            .map_err(|_| VerbsError::OutOfResources { what: "memory" })?;
        buf.resize(capacity, 0u8);
        self.insert_buffer(pd, MrBuffer::Owned(buf.into_boxed_slice()), kind, make)
    }

    /// [`MrTable::insert`] with the buffer given: `data.len()` bytes of capacity.
    fn insert_buffer(
        &self,
        pd: PdId,
        data: MrBuffer,
        kind: MrKind,
        make: impl FnOnce(u8, MrBuffer) -> MrInner,
    ) -> Result<Arc<MemoryRegion>, VerbsError> {
        let capacity = data.len();

        let mut t = self.write();
        if !t.pds.contains_key(&pd.0) {
            return Err(VerbsError::InvalidHandle {
                object: ObjectKind::Pd,
                handle: pd.0,
            });
        }
        let slot = match t.free.pop_front() {
            Some(s) => s,
            None => {
                if t.made >= t.max_mrs {
                    return Err(VerbsError::OutOfResources {
                        what: "STag indices",
                    });
                }
                let mut s = u32::try_from(t.slots.len()).unwrap_or(u32::MAX);
                if t.map.index(s) == 0 {
                    // The slot of index 0 stays empty forever.
                    t.slots.push(Slot::default());
                    s += 1;
                }
                t.slots.push(Slot::default());
                t.made += 1;
                s
            }
        };
        let index = t.map.index(slot);
        let last_key = t.slots.get(slot as usize).and_then(|s| s.last_key);
        let key = t.key_other_than(last_key);
        let mr = Arc::new(MemoryRegion {
            index,
            fast_reg: kind.fast_reg,
            remote_inv: kind.remote_inv,
            capacity,
            dead: AtomicBool::new(false),
            inner: Mutex::new(make(key, data)),
        });
        if let Some(slot) = t.slots.get_mut(slot as usize) {
            slot.mr = Some(Arc::clone(&mr));
            slot.last_key = Some(key);
        }
        if let Some(n) = t.pds.get_mut(&pd.0) {
            *n += 1;
        }
        Ok(mr)
    }

    /// Deregisters `mr` (`ibv_dereg_mr(3)`): its STag stops resolving at once and
    /// the MR becomes invalid. The buffer lives on while `Arc<MemoryRegion>` handles exist.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidHandle`] if `mr` is not registered in this table.
    pub fn dereg_mr(&self, mr: &MemoryRegion) -> Result<(), VerbsError> {
        let mut t = self.write();
        let registered = t
            .slot(mr.index)
            .and_then(|s| s.mr.as_ref())
            .is_some_and(|m| core::ptr::eq(Arc::as_ptr(m), mr));
        if !registered {
            return Err(VerbsError::InvalidHandle {
                object: ObjectKind::Mr,
                handle: mr.index,
            });
        }
        let pd = {
            let mut g = mr.lock();
            g.state = MrState::Invalid;
            g.pd
        };
        mr.dead.store(true, Ordering::Release);
        if let Some(slot) = t.slot_mut(mr.index) {
            slot.mr = None;
        }
        let slot = t.map.slot(mr.index);
        t.free.push_back(slot);
        if let Some(n) = t.pds.get_mut(&pd.0) {
            *n = n.saturating_sub(1);
        }
        Ok(())
    }

    /// The MR registered under `stag`'s index, whatever its key and state (check 1
    /// of the module documentation; the other checks are the caller's).
    pub fn lookup(&self, stag: Stag) -> Option<Arc<MemoryRegion>> {
        self.read().slot(stag.index()).and_then(|s| s.mr.clone())
    }

    /// Number of registered MRs.
    pub fn len(&self) -> usize {
        self.read().slots.iter().filter(|s| s.mr.is_some()).count()
    }

    /// True if no MR is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs all six checks of the module documentation for an access of `len` bytes
    /// at TO `to` through `stag` by a QP of `pd` needing `needed`, and returns the
    /// MR and the buffer offset of `to`. A zero-length access is checked like any
    /// other here; callers skip the check where the RFCs allow (zero-length Writes,
    /// Read Requests, Read Responses).
    ///
    /// # Errors
    ///
    /// The first failing check, as a [`ProtectionError`].
    pub fn check(
        &self,
        stag: Stag,
        pd: PdId,
        to: u64,
        len: u64,
        needed: AccessFlags,
    ) -> Result<(Arc<MemoryRegion>, usize), ProtectionError> {
        let mr = self.lookup(stag).ok_or(ProtectionError::NoSuchIndex {
            index: stag.index(),
        })?;
        let off = mr.resolve(stag, pd, to, len, needed)?;
        Ok((mr, off))
    }

    /// Fast registration (the [`FastReg`] WR, siw `SIW_OP_REG_MR`): makes the MR
    /// named by `reg.mr`'s index valid with key `reg.key`, range
    /// `[reg.iova, +reg.length)` and `reg.access`. The MR's buffer keeps its bytes;
    /// byte 0 of the buffer becomes iova `reg.iova`.
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidHandle`] (no MR at that index),
    /// [`VerbsError::NotPermitted`] (`"fast registration of a reg_mr MR"`, or
    /// `"foreign PD"` when the MR is not in `pd`), [`VerbsError::InvalidArgument`]
    /// `"MR already valid"` (a valid MR must be invalidated first) or `"key"`
    /// (`reg.key` is the key of the MR's previous fast registration: re-keying is
    /// required, see "Unguessable STags" in the [module documentation](self)),
    /// [`VerbsError::InvalidAccessFlags`], [`VerbsError::InvalidArgument`]
    /// `"length"` / `"iova"`, [`VerbsError::MrOutOfBounds`] (`length` above the
    /// MR's capacity).
    pub fn fast_reg(&self, reg: &FastReg, pd: PdId) -> Result<(), VerbsError> {
        let mr = self.lookup(reg.mr).ok_or(VerbsError::InvalidHandle {
            object: ObjectKind::Mr,
            handle: reg.mr.index(),
        })?;
        if !mr.fast_reg {
            return Err(VerbsError::NotPermitted {
                what: "fast registration of a reg_mr MR",
            });
        }
        reg.access.validate_for_mr()?;
        if reg.length == 0 {
            return Err(VerbsError::InvalidArgument { what: "length" });
        }
        if reg.iova.checked_add(reg.length).is_none() {
            return Err(VerbsError::InvalidArgument { what: "iova" });
        }
        let mut g = mr.lock();
        if g.pd != pd {
            return Err(VerbsError::NotPermitted { what: "foreign PD" });
        }
        if g.state == MrState::Valid {
            return Err(VerbsError::InvalidArgument {
                what: "MR already valid",
            });
        }
        if g.fast_reg_key == Some(reg.key) {
            return Err(VerbsError::InvalidArgument { what: "key" });
        }
        if reg.length > mr.capacity as u64 {
            return Err(VerbsError::MrOutOfBounds {
                addr: reg.iova,
                length: reg.length,
                mr_addr: reg.iova,
                mr_length: mr.capacity as u64,
            });
        }
        g.key = reg.key;
        g.fast_reg_key = Some(reg.key);
        g.iova = reg.iova;
        g.length = reg.length;
        g.access = reg.access;
        g.state = MrState::Valid;
        drop(g);
        let mut t = self.write();
        if let Some(slot) = t.slot_mut(mr.index) {
            slot.last_key = Some(reg.key);
        }
        Ok(())
    }

    /// A random 8-bit key for the next fast registration of `mr` ([`FastReg::key`]):
    /// different from `mr`'s current key, so the registration re-keys the STag.
    pub fn fresh_key(&self, mr: &MemoryRegion) -> u8 {
        let current = mr.lock().key;
        self.write().key_other_than(Some(current))
    }

    /// Invalidates `stag` for a QP of `pd`: a Local Invalidate WR
    /// (`IBV_WR_LOCAL_INV`) when `remote` is false, the Invalidate STag of an
    /// incoming Send with Invalidate (RFC 5040 §5.3) when true. Index, key and PD
    /// must match; an already invalid STag stays invalid without error (siw, and the
    /// verbs definition). A remote invalidation additionally requires the MR to
    /// allow it ([`MemoryRegion::allows_remote_invalidate`]) and to grant some
    /// remote access: see "Remote invalidation" in the
    /// [module documentation](self). On any error the MR is left as it was.
    ///
    /// # Errors
    ///
    /// [`ProtectionError::NoSuchIndex`], [`ProtectionError::KeyMismatch`],
    /// [`ProtectionError::PdMismatch`]; for a remote invalidation also
    /// [`ProtectionError::NotInvalidatable`] (an ordinary registration) and
    /// [`ProtectionError::AccessRights`] (a local-only MR).
    pub fn invalidate(&self, stag: Stag, pd: PdId, remote: bool) -> Result<(), ProtectionError> {
        let mr = self.lookup(stag).ok_or(ProtectionError::NoSuchIndex {
            index: stag.index(),
        })?;
        let mut g = mr.lock();
        g.names(stag, pd)?;
        if remote && !mr.allows_remote_invalidate() {
            return Err(ProtectionError::NotInvalidatable);
        }
        if remote && !g.access.is_remote() {
            return Err(ProtectionError::AccessRights {
                needed: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
                granted: g.access,
            });
        }
        g.state = MrState::Invalid;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw() -> AccessFlags {
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
    }

    #[test]
    fn stag_layout_and_index_reuse() {
        let t = MrTable::new();
        let pd = t.alloc_pd().unwrap();
        let a = t.reg_mr(pd, 0x1000, 64, rw()).unwrap();
        let b = t.reg_mr(pd, 0x2000, 64, rw()).unwrap();
        for m in [&a, &b] {
            assert_eq!(m.stag().index(), m.index());
            assert_ne!(m.index(), 0);
            assert!(Arc::ptr_eq(&t.lookup(m.stag()).unwrap(), m));
        }
        let gap = b.index().wrapping_sub(a.index()) & INDEX_MASK;
        assert!(gap > 1 && gap < INDEX_MASK, "adjacent indices {gap:#x}");
        let old = a.stag();
        t.dereg_mr(&a).unwrap();
        assert!(a.is_deregistered());
        assert_eq!(a.state(), MrState::Invalid);
        assert!(t.lookup(old).is_none());
        // A's index is reused (FIFO) with another key; the stale STag does not match.
        let c = t.reg_mr(pd, 0x3000, 64, rw()).unwrap();
        assert_eq!(c.index(), a.index());
        assert_ne!(c.stag().key(), old.key());
        let (key, expected) = (old.key(), c.stag().key());
        assert_eq!(
            t.check(old, pd, 0x3000, 1, AccessFlags::empty())
                .unwrap_err(),
            ProtectionError::KeyMismatch { key, expected }
        );
        assert!(t.dereg_mr(&a).is_err(), "double deregistration");
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn check_order() {
        let t = MrTable::new();
        let pd = t.alloc_pd().unwrap();
        let other = t.alloc_pd().unwrap();
        let mr = t.reg_mr(pd, 0x1000, 100, AccessFlags::LOCAL_WRITE).unwrap();
        let s = mr.stag();
        let none = AccessFlags::empty();
        assert!(matches!(
            t.check(Stag::new(99, 0).unwrap(), pd, 0, 0, none),
            Err(ProtectionError::NoSuchIndex { index: 99 })
        ));
        // Wrong key reported before wrong PD, wrong PD before rights.
        assert!(matches!(
            t.check(s.inc_key(), other, 0x1000, 1, AccessFlags::REMOTE_WRITE),
            Err(ProtectionError::KeyMismatch { .. })
        ));
        assert!(matches!(
            t.check(s, other, 0x1000, 1, AccessFlags::REMOTE_WRITE),
            Err(ProtectionError::PdMismatch { .. })
        ));
        assert!(matches!(
            t.check(s, pd, 0x1000, 1, AccessFlags::REMOTE_WRITE),
            Err(ProtectionError::AccessRights { .. })
        ));
        // Bounds: below, above, exact fit, wrap.
        assert!(matches!(
            t.check(s, pd, 0xfff, 1, none),
            Err(ProtectionError::Bounds { .. })
        ));
        assert!(matches!(
            t.check(s, pd, 0x1000, 101, none),
            Err(ProtectionError::Bounds { .. })
        ));
        assert_eq!(t.check(s, pd, 0x1000, 100, none).unwrap().1, 0);
        assert_eq!(t.check(s, pd, 0x1063, 1, none).unwrap().1, 99);
        assert!(matches!(
            t.check(s, pd, u64::MAX, 2, none),
            Err(ProtectionError::Bounds { .. })
        ));
        t.invalidate(s, pd, false).unwrap();
        assert!(matches!(
            t.check(s, pd, 0x1000, 1, none),
            Err(ProtectionError::Invalid)
        ));
        // Invalidating twice is fine; remote invalidation of a reg_mr MR is not.
        t.invalidate(s, pd, false).unwrap();
        assert_eq!(
            t.invalidate(s, pd, true),
            Err(ProtectionError::NotInvalidatable)
        );
        // With the option but local-only, still not: the peer never saw it.
        let opt = MrOptions {
            remote_invalidate: true,
        };
        let local = t
            .reg_mr_with(pd, 0, 8, AccessFlags::LOCAL_WRITE, opt)
            .unwrap();
        assert!(matches!(
            t.invalidate(local.stag(), pd, true),
            Err(ProtectionError::AccessRights { .. })
        ));
        assert_eq!(local.state(), MrState::Valid);
    }

    #[test]
    fn place_copies_nothing_on_failure() {
        let t = MrTable::new();
        let pd = t.alloc_pd().unwrap();
        let mr = t.reg_mr(pd, 0x1000, 8, rw()).unwrap();
        let s = mr.stag();
        assert!(mr
            .place(s, pd, 0x1004, &[1, 2, 3, 4, 5], AccessFlags::REMOTE_WRITE)
            .is_err());
        assert_eq!(mr.to_vec(), vec![0; 8]);
        mr.place(s, pd, 0x1004, &[1, 2, 3, 4], AccessFlags::REMOTE_WRITE)
            .unwrap();
        assert_eq!(mr.to_vec(), vec![0, 0, 0, 0, 1, 2, 3, 4]);
    }

    #[test]
    fn app_read_write_bounds() {
        let t = MrTable::new();
        let pd = t.alloc_pd().unwrap();
        let mr = t.reg_mr(pd, 0, 16, rw()).unwrap();
        mr.write(14, &[7, 8]).unwrap();
        assert!(matches!(
            mr.write(15, &[1, 2]),
            Err(VerbsError::MrOutOfBounds { .. })
        ));
        assert!(mr.write(usize::MAX, &[1]).is_err());
        let mut b = [0u8; 2];
        mr.read(14, &mut b).unwrap();
        assert_eq!(b, [7, 8]);
        assert!(mr.read(15, &mut b).is_err());
    }

    #[test]
    fn registration_errors_and_pd_lifetime() {
        let t = MrTable::with_max_mrs(2);
        let pd = t.alloc_pd().unwrap();
        assert!(matches!(
            t.reg_mr(pd, 0, 0, rw()),
            Err(VerbsError::InvalidArgument { what: "length" })
        ));
        assert!(matches!(
            t.reg_mr(pd, u64::MAX, 2, rw()),
            Err(VerbsError::InvalidArgument { what: "iova" })
        ));
        assert!(matches!(
            t.reg_mr(pd, 0, 1, AccessFlags::REMOTE_WRITE),
            Err(VerbsError::InvalidAccessFlags(_))
        ));
        assert!(matches!(
            t.reg_mr(PdId(77), 0, 1, rw()),
            Err(VerbsError::InvalidHandle { .. })
        ));
        let a = t.reg_mr(pd, 0, 1, rw()).unwrap();
        let _b = t.reg_mr(pd, 0, 1, rw()).unwrap();
        assert!(matches!(
            t.reg_mr(pd, 0, 1, rw()),
            Err(VerbsError::OutOfResources { .. })
        ));
        assert!(matches!(t.dealloc_pd(pd), Err(VerbsError::InUse { .. })));
        t.dereg_mr(&a).unwrap();
        t.dereg_mr(&_b).unwrap();
        t.dealloc_pd(pd).unwrap();
        assert!(!t.pd_exists(pd));
        assert!(t.dealloc_pd(pd).is_err());
    }

    #[test]
    fn fast_registration() {
        let t = MrTable::new();
        let pd = t.alloc_pd().unwrap();
        let mr = t.alloc_mr(pd, 4096).unwrap();
        assert_eq!(mr.state(), MrState::Invalid);
        let reg = FastReg {
            mr: mr.stag(),
            key: 0x5a,
            access: rw(),
            iova: 0x7000,
            length: 4096,
        };
        t.fast_reg(&reg, pd).unwrap();
        assert_eq!(mr.stag(), reg.new_stag());
        assert_eq!((mr.iova(), mr.length()), (0x7000, 4096));
        assert!(matches!(
            t.fast_reg(&reg, pd),
            Err(VerbsError::InvalidArgument {
                what: "MR already valid"
            })
        ));
        t.invalidate(reg.new_stag(), pd, true).unwrap();
        // Re-registering needs a new key (siw and the verbs rule: re-key).
        assert!(matches!(
            t.fast_reg(&reg, pd),
            Err(VerbsError::InvalidArgument { what: "key" })
        ));
        assert_eq!(mr.state(), MrState::Invalid);
        let big = FastReg {
            length: 4097,
            key: 0x5b,
            ..reg
        };
        assert!(matches!(
            t.fast_reg(&big, pd),
            Err(VerbsError::MrOutOfBounds { .. })
        ));
        let plain = t.reg_mr(pd, 0, 8, rw()).unwrap();
        let re = FastReg {
            mr: plain.stag(),
            ..reg
        };
        assert!(matches!(
            t.fast_reg(&re, pd),
            Err(VerbsError::NotPermitted { .. })
        ));
    }

    /// The slot <-> index map is a bijection on 24 bits: the inverse undoes it for
    /// slots across the whole range, and the multiplier is never 1 or -1.
    #[test]
    fn index_map_is_a_bijection() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..100 {
            let m = IndexMap::random(&mut rng);
            assert_eq!(m.mul.wrapping_mul(m.inv) & INDEX_MASK, 1);
            assert!(m.mul % 2 == 1 && m.mul != 1 && m.mul != INDEX_MASK);
            for s in [0, 1, 2, 77, 0xffff, INDEX_MASK - 1, INDEX_MASK] {
                assert_eq!(m.slot(m.index(s)), s);
                assert!(m.index(s) <= INDEX_MASK);
            }
        }
    }

    /// Over 1,000 registrations in one table: no two consecutive STag indices are
    /// equal or adjacent (differ by 0 or +-1 modulo 2^24); the consecutive STags do
    /// not all differ by the same amount (keys vary), and the keys take more than
    /// 128 of the 256 values; every STag is distinct and index 0 never appears.
    /// Two tables seeded by the OS start at different STags; two tables with the
    /// same fixed seed hand out the same STags.
    #[test]
    fn stags_are_not_sequential() {
        let run = |t: &MrTable| {
            let pd = t.alloc_pd().unwrap();
            (0..1000)
                .map(|_| t.reg_mr(pd, 0, 1, rw()).unwrap())
                .collect::<Vec<_>>()
        };
        let t = MrTable::new();
        let mrs = run(&t);
        let stags: Vec<u32> = mrs.iter().map(|m| m.stag().raw()).collect();
        for w in stags.windows(2) {
            let gap = (w[1] >> 8).wrapping_sub(w[0] >> 8) & INDEX_MASK;
            assert!(gap > 1 && gap < INDEX_MASK, "{:#x} then {:#x}", w[0], w[1]);
        }
        let diffs: std::collections::HashSet<u32> =
            stags.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        assert!(diffs.len() > 1, "constant STag step");
        let keys: std::collections::HashSet<u8> = stags.iter().map(|s| *s as u8).collect();
        assert!(keys.len() > 128, "only {} keys", keys.len());
        let distinct: std::collections::HashSet<u32> = stags.iter().copied().collect();
        assert_eq!(distinct.len(), 1000);
        assert!(stags.iter().all(|s| s >> 8 != 0));
        // Another OS-seeded table starts elsewhere (equal with odds 2^-32).
        let u = MrTable::new();
        assert_ne!(run(&u)[0].stag(), mrs[0].stag());
        // A fixed seed reproduces the sequence.
        let (x, y) = (
            MrTable::with_seed(1 << 16, 9),
            MrTable::with_seed(1 << 16, 9),
        );
        let sx: Vec<Stag> = run(&x).iter().map(|m| m.stag()).collect();
        let sy: Vec<Stag> = run(&y).iter().map(|m| m.stag()).collect();
        assert_eq!(sx, sy);
    }

    /// Every live STag resolves to its MR; every stale one (deregistered, or its
    /// slot reused with a new key) fails with the RFC 5040 / 5041 "Invalid STag"
    /// error, for tagged placement and for an RDMA Read Request alike.
    #[test]
    fn live_stags_resolve_stale_ones_fail() {
        let t = MrTable::with_seed(1 << 16, 5);
        let pd = t.alloc_pd().unwrap();
        let mrs: Vec<_> = (0..600)
            .map(|_| t.reg_mr(pd, 0x40, 8, rw()).unwrap())
            .collect();
        let mut stale = Vec::new();
        for (i, m) in mrs.iter().enumerate() {
            if i % 2 == 0 {
                stale.push(m.stag());
                t.dereg_mr(m).unwrap();
            }
        }
        // Half of the freed slots are reused, by new registrations with new keys.
        let again: Vec<_> = (0..150)
            .map(|_| t.reg_mr(pd, 0x40, 8, rw()).unwrap())
            .collect();
        let live = mrs.iter().skip(1).step_by(2).chain(again.iter());
        let mut n = 0;
        for m in live {
            let (found, off) = t
                .check(m.stag(), pd, 0x44, 4, AccessFlags::REMOTE_WRITE)
                .unwrap();
            assert!(Arc::ptr_eq(&found, m));
            assert_eq!(off, 4);
            n += 1;
        }
        assert_eq!(n, 450);
        let mut reused = 0;
        for s in stale {
            let e = t
                .check(s, pd, 0x44, 4, AccessFlags::REMOTE_WRITE)
                .unwrap_err();
            match e {
                ProtectionError::KeyMismatch { .. } => reused += 1,
                ProtectionError::NoSuchIndex { .. } => {}
                other => panic!("{other:?}"),
            }
            assert_eq!(
                e.tagged_cause(),
                ErrorCause::DdpTagged(DdpTaggedCode::InvalidStag)
            );
            assert_eq!(
                e.rdmap_cause(),
                ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::InvalidStag)
            );
        }
        assert_eq!(reused, 150);
    }

    /// Fast registration re-keys: the key must differ from the previous
    /// registration's, [`MrTable::fresh_key`] gives one that does, and after the
    /// re-registration the old STag no longer resolves (Invalid STag) while the new
    /// one does.
    #[test]
    fn fast_register_rekeys() {
        let t = MrTable::with_seed(1 << 16, 11);
        let pd = t.alloc_pd().unwrap();
        let mr = t.alloc_mr(pd, 64).unwrap();
        let mut seen = std::collections::HashSet::new();
        let mut old: Option<Stag> = None;
        for _ in 0..200 {
            let key = t.fresh_key(&mr);
            assert_ne!(key, mr.stag().key());
            let reg = FastReg {
                mr: mr.stag(),
                key,
                access: rw(),
                iova: 0x9000,
                length: 64,
            };
            t.fast_reg(&reg, pd).unwrap();
            let new = reg.new_stag();
            assert_eq!(mr.stag(), new);
            seen.insert(key);
            t.check(new, pd, 0x9000, 64, AccessFlags::REMOTE_READ)
                .unwrap();
            if let Some(o) = old {
                assert_ne!(o, new);
                let e = t
                    .check(o, pd, 0x9000, 1, AccessFlags::REMOTE_READ)
                    .unwrap_err();
                assert!(matches!(e, ProtectionError::KeyMismatch { .. }), "{e:?}");
                assert_eq!(
                    e.tagged_cause(),
                    ErrorCause::DdpTagged(DdpTaggedCode::InvalidStag)
                );
            }
            t.invalidate(new, pd, false).unwrap();
            // The same key again is refused, and leaves the MR invalid.
            assert!(matches!(
                t.fast_reg(&reg, pd),
                Err(VerbsError::InvalidArgument { what: "key" })
            ));
            assert_eq!(mr.state(), MrState::Invalid);
            old = Some(new);
        }
        assert!(seen.len() > 100, "fresh keys vary: {}", seen.len());
    }

    /// Remote invalidation: refused (MR left valid) for an ordinary registration
    /// and for another PD's MR, both as RDMAP Remote Protection "STag cannot be
    /// Invalidated" (0x09); allowed for an MR registered with the option and for a
    /// fast-registered one. Local invalidation of the ordinary MR stays allowed.
    #[test]
    fn remote_invalidation_rules() {
        let t = MrTable::with_seed(1 << 16, 13);
        let pd = t.alloc_pd().unwrap();
        let other = t.alloc_pd().unwrap();
        let cannot =
            ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::StagCannotBeInvalidated);
        let plain = t.reg_mr(pd, 0, 8, rw()).unwrap();
        assert!(!plain.allows_remote_invalidate());
        let e = t.invalidate(plain.stag(), pd, true).unwrap_err();
        assert_eq!(e, ProtectionError::NotInvalidatable);
        assert_eq!(e.invalidate_cause(), cannot);
        assert_eq!(plain.state(), MrState::Valid);
        let opt = MrOptions {
            remote_invalidate: true,
        };
        let flagged = t.reg_mr_with(other, 0, 8, rw(), opt).unwrap();
        let e = t.invalidate(flagged.stag(), pd, true).unwrap_err();
        assert!(matches!(e, ProtectionError::PdMismatch { .. }), "{e:?}");
        assert_eq!(e.invalidate_cause(), cannot);
        assert_eq!(flagged.state(), MrState::Valid);
        t.invalidate(flagged.stag(), other, true).unwrap();
        assert_eq!(flagged.state(), MrState::Invalid);
        let fr = t.alloc_mr(pd, 8).unwrap();
        assert!(fr.allows_remote_invalidate());
        let reg = FastReg {
            mr: fr.stag(),
            key: t.fresh_key(&fr),
            access: rw(),
            iova: 0,
            length: 8,
        };
        t.fast_reg(&reg, pd).unwrap();
        t.invalidate(reg.new_stag(), pd, true).unwrap();
        assert_eq!(fr.state(), MrState::Invalid);
        t.invalidate(plain.stag(), pd, false).unwrap();
        assert_eq!(plain.state(), MrState::Invalid);
    }

    /// An application thread writes and reads an MR while another thread places
    /// into it as the engine would: no torn segment is ever observed, and the run
    /// is sound by construction (no `unsafe`).
    #[test]
    fn concurrent_app_and_engine_access() {
        let t = Arc::new(MrTable::new());
        let pd = t.alloc_pd().unwrap();
        let mr = t.reg_mr(pd, 0, 4096, rw()).unwrap();
        let stag = mr.stag();
        let engine = {
            let mr = Arc::clone(&mr);
            std::thread::spawn(move || {
                for i in 0..2000u32 {
                    let b = (i % 251) as u8;
                    mr.place(stag, pd, 0, &[b; 4096], AccessFlags::REMOTE_WRITE)
                        .unwrap();
                }
            })
        };
        let mut buf = vec![0u8; 4096];
        for _ in 0..2000 {
            mr.read(0, &mut buf).unwrap();
            assert!(buf.iter().all(|&x| x == buf[0]), "torn placement observed");
        }
        engine.join().unwrap();
    }
}
