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
//!   Index 0 is never handed out (siw avoids STag 0 too). A freed index is reused
//!   last (FIFO) and the new registration gets the slot's previous key plus one, so a
//!   stale STag held by a peer stops matching.
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ddp_rdmap::terminate::{DdpTaggedCode, ErrorCause, RdmapOperationCode, RdmapProtectionCode};
use verbs::{AccessFlags, FastReg, ObjectKind, Stag, VerbsError};

/// Largest MR the table registers, in bytes (1 GiB). The buffer is allocated at
/// registration, so this bounds one registration's memory.
pub const MAX_MR_LEN: u64 = 1 << 30;

/// Default number of STag indices an [`MrTable`] hands out.
pub const DEFAULT_MAX_MRS: u32 = 1 << 16;

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
            | ProtectionError::Invalid => ErrorCause::DdpTagged(DdpTaggedCode::InvalidStag),
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
            | ProtectionError::Invalid => RdmapProtectionCode::InvalidStag,
            ProtectionError::PdMismatch { .. } => RdmapProtectionCode::StagNotAssociated,
            ProtectionError::AccessRights { .. } => RdmapProtectionCode::AccessRightsViolation,
            ProtectionError::Bounds { .. } => RdmapProtectionCode::BaseOrBoundsViolation,
        })
    }

    /// The Terminate error for a Send with Invalidate whose Invalidate STag cannot
    /// be invalidated (RFC 5040 §4.8 code 0x09): as a Remote Protection Error when
    /// the STag belongs to another PD, as a Remote Operation Error otherwise (the
    /// split Linux siw makes in `siw_rdmap_complete`).
    pub const fn invalidate_cause(&self) -> ErrorCause {
        match self {
            ProtectionError::PdMismatch { .. } => {
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
    iova: u64,
    length: u64,
    access: AccessFlags,
    pd: PdId,
    state: MrState,
    data: Box<[u8]>,
}

impl MrInner {
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
        if self.key != stag.key() {
            return Err(ProtectionError::KeyMismatch {
                key: stag.key(),
                expected: self.key,
            });
        }
        if self.pd != pd {
            return Err(ProtectionError::PdMismatch { pd, mr_pd: self.pd });
        }
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
        if let Some(dst) = g.data.get_mut(range) {
            dst.copy_from_slice(data);
        }
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
        if let Some(src) = g.data.get(range) {
            out.copy_from_slice(src);
        }
        Ok(())
    }

    /// A copy of the whole buffer ([`MemoryRegion::capacity`] bytes).
    pub fn to_vec(&self) -> Vec<u8> {
        self.lock().data.to_vec()
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
        if let Some(dst) = g.data.get_mut(off..off + data.len()) {
            dst.copy_from_slice(data);
        }
        Ok(())
    }

    /// Copies `data` to buffer offset `off` of a range resolved earlier. Bounded by
    /// the buffer: bytes that would fall outside it are dropped (cannot happen for a
    /// resolved range, whose buffer never shrinks). Returns false if dropped.
    pub(crate) fn store(&self, off: usize, data: &[u8]) -> bool {
        let mut g = self.lock();
        match off
            .checked_add(data.len())
            .and_then(|end| g.data.get_mut(off..end))
        {
            Some(dst) => {
                dst.copy_from_slice(data);
                true
            }
            None => false,
        }
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
        let g = self.lock();
        f(off.checked_add(len).and_then(|end| g.data.get(off..end)))
    }
}

#[derive(Debug, Default)]
struct Slot {
    mr: Option<Arc<MemoryRegion>>,
    /// The key of the slot's latest registration; `None` for a fresh slot.
    last_key: Option<u8>,
}

#[derive(Debug)]
struct Table {
    /// Slot `i` holds the MR of STag index `i`; slot 0 is never used.
    slots: Vec<Slot>,
    free: VecDeque<u32>,
    max_mrs: u32,
    /// Live PDs and the number of MRs in each.
    pds: HashMap<u32, usize>,
    next_pd: u32,
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
    /// An empty table handing out up to [`DEFAULT_MAX_MRS`] STag indices.
    pub fn new() -> MrTable {
        MrTable::with_max_mrs(DEFAULT_MAX_MRS)
    }

    /// An empty table handing out up to `max_mrs` STag indices (clamped to
    /// [`Stag::MAX_INDEX`]).
    pub fn with_max_mrs(max_mrs: u32) -> MrTable {
        MrTable {
            inner: RwLock::new(Table {
                slots: vec![Slot::default()],
                free: VecDeque::new(),
                max_mrs: max_mrs.min(Stag::MAX_INDEX),
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
        access.validate_for_mr()?;
        if length == 0 || length > MAX_MR_LEN {
            return Err(VerbsError::InvalidArgument { what: "length" });
        }
        if iova.checked_add(length).is_none() {
            return Err(VerbsError::InvalidArgument { what: "iova" });
        }
        self.insert(pd, length, false, |key, data| MrInner {
            key,
            iova,
            length,
            access,
            pd,
            state: MrState::Valid,
            data,
        })
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
        self.insert(pd, max_len, true, |key, data| MrInner {
            key,
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
        fast_reg: bool,
        make: impl FnOnce(u8, Box<[u8]>) -> MrInner,
    ) -> Result<Arc<MemoryRegion>, VerbsError> {
        let capacity =
            usize::try_from(len).map_err(|_| VerbsError::OutOfResources { what: "memory" })?;
        // Allocate before taking the table lock.
        let mut buf = Vec::new();
        buf.try_reserve_exact(capacity)
            .map_err(|_| VerbsError::OutOfResources { what: "memory" })?;
        buf.resize(capacity, 0u8);
        let data = buf.into_boxed_slice();

        let mut t = self.write();
        if !t.pds.contains_key(&pd.0) {
            return Err(VerbsError::InvalidHandle {
                object: ObjectKind::Pd,
                handle: pd.0,
            });
        }
        let index = match t.free.pop_front() {
            Some(i) => i,
            None => {
                let i = u32::try_from(t.slots.len()).unwrap_or(u32::MAX);
                if i > t.max_mrs {
                    return Err(VerbsError::OutOfResources {
                        what: "STag indices",
                    });
                }
                t.slots.push(Slot::default());
                i
            }
        };
        let Some(slot) = t.slots.get_mut(index as usize) else {
            return Err(VerbsError::OutOfResources {
                what: "STag indices",
            });
        };
        let key = slot.last_key.map_or(0, |k| k.wrapping_add(1));
        let mr = Arc::new(MemoryRegion {
            index,
            fast_reg,
            capacity,
            dead: AtomicBool::new(false),
            inner: Mutex::new(make(key, data)),
        });
        if let Some(slot) = t.slots.get_mut(index as usize) {
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
            .slots
            .get(mr.index as usize)
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
        if let Some(slot) = t.slots.get_mut(mr.index as usize) {
            slot.mr = None;
        }
        t.free.push_back(mr.index);
        if let Some(n) = t.pds.get_mut(&pd.0) {
            *n = n.saturating_sub(1);
        }
        Ok(())
    }

    /// The MR registered under `stag`'s index, whatever its key and state (check 1
    /// of the module documentation; the other checks are the caller's).
    pub fn lookup(&self, stag: Stag) -> Option<Arc<MemoryRegion>> {
        self.read()
            .slots
            .get(stag.index() as usize)
            .and_then(|s| s.mr.clone())
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
    /// `"MR already valid"` (a valid MR must be invalidated first),
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
        if reg.length > mr.capacity as u64 {
            return Err(VerbsError::MrOutOfBounds {
                addr: reg.iova,
                length: reg.length,
                mr_addr: reg.iova,
                mr_length: mr.capacity as u64,
            });
        }
        g.key = reg.key;
        g.iova = reg.iova;
        g.length = reg.length;
        g.access = reg.access;
        g.state = MrState::Valid;
        drop(g);
        let mut t = self.write();
        if let Some(slot) = t.slots.get_mut(mr.index as usize) {
            slot.last_key = Some(reg.key);
        }
        Ok(())
    }

    /// Invalidates `stag` for a QP of `pd`: a Local Invalidate WR
    /// (`IBV_WR_LOCAL_INV`) when `remote` is false, the Invalidate STag of an
    /// incoming Send with Invalidate (RFC 5040 §5.3) when true. Index, key and PD
    /// must match; an already invalid STag stays invalid without error (siw, and the
    /// verbs definition). A remote invalidation additionally requires the MR to
    /// grant some remote access: an MR never exposed to the peer cannot be
    /// invalidated by it.
    ///
    /// # Errors
    ///
    /// [`ProtectionError::NoSuchIndex`], [`ProtectionError::KeyMismatch`],
    /// [`ProtectionError::PdMismatch`]; [`ProtectionError::AccessRights`] for a
    /// remote invalidation of a local-only MR.
    pub fn invalidate(&self, stag: Stag, pd: PdId, remote: bool) -> Result<(), ProtectionError> {
        let mr = self.lookup(stag).ok_or(ProtectionError::NoSuchIndex {
            index: stag.index(),
        })?;
        let mut g = mr.lock();
        if g.key != stag.key() {
            return Err(ProtectionError::KeyMismatch {
                key: stag.key(),
                expected: g.key,
            });
        }
        if g.pd != pd {
            return Err(ProtectionError::PdMismatch { pd, mr_pd: g.pd });
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
        assert_eq!(a.stag().raw(), 1 << 8);
        assert_eq!(b.stag().raw(), 2 << 8);
        let old = a.stag();
        t.dereg_mr(&a).unwrap();
        assert!(a.is_deregistered());
        assert_eq!(a.state(), MrState::Invalid);
        assert!(t.lookup(old).is_none());
        // Index 1 is reused (FIFO) with the next key; the stale STag does not match.
        let c = t.reg_mr(pd, 0x3000, 64, rw()).unwrap();
        assert_eq!(c.index(), 1);
        assert_eq!(c.stag().raw(), (1 << 8) | 1);
        assert!(matches!(
            t.check(old, pd, 0x3000, 1, AccessFlags::empty()),
            Err(ProtectionError::KeyMismatch {
                key: 0,
                expected: 1
            })
        ));
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
        // Invalidating twice is fine; remote invalidation of a local-only MR is not.
        t.invalidate(s, pd, false).unwrap();
        assert!(matches!(
            t.invalidate(s, pd, true),
            Err(ProtectionError::AccessRights { .. })
        ));
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
        let big = FastReg {
            length: 4097,
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
