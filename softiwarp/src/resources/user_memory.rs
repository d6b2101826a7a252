//! Memory an application registered by address (`ibv_reg_mr(pd, addr, length, access)`):
//! the one place where the soft device touches memory it does not own.
//!
//! A NIC places RDMA Writes, Read Responses and Sends straight into the application's
//! buffers and reads its send buffers straight out of them, by DMA. The soft device does
//! the same with [`UserMemory`]: a base pointer and a length, copied into and out of with
//! raw-pointer copies (`ptr::copy_nonoverlapping`). No Rust reference into the region is
//! ever formed, so the application (or C code) may keep pointers to it and read or write
//! it as it likes without aliasing a `&`/`&mut` of ours.
//!
//! # Contract (what [`UserMemory::new`] requires of its caller)
//!
//! 1. `ptr .. ptr + len` is one allocation (or mapping) of the calling process, readable
//!    and writable, and stays so until the [`UserMemory`] is dropped: the MR that holds
//!    it is deregistered and every WR and placement that could use it has finished
//!    (the table drops it only then; a C caller's `ibv_dereg_mr` is that point, as in
//!    `ibv_reg_mr(3)`: "the memory buffer must remain valid ... until deregistered").
//! 2. `len > 0` and `ptr + len` does not wrap.
//!
//! What the contract does not cover, as with a NIC: the application reading a region
//! while a Write lands in it sees old bytes, new bytes or a mix (the verbs rule is to
//! read it after the completion, or after polling a byte the sender wrote last); a
//! send buffer changed before its WR completed sends either. Concurrent access by the
//! application and the device is a data race on plain bytes in the C sense; the device's
//! side of it is a raw copy under the MR's lock, never a Rust reference, and a copy of
//! `u8`s has no invalid values, so no Rust-level invariant can break.

#![allow(unsafe_code)]

use std::ptr::NonNull;

/// A region of the application's own memory (see the [module docs](self)).
#[derive(Debug)]
pub struct UserMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a UserMemory is a pointer to plain bytes whose validity the creator promised
// for the object's whole life (contract 1); every access copies under the MR's lock,
// so moving or sharing the handle between threads adds no access the contract does not
// already allow.
unsafe impl Send for UserMemory {}
// SAFETY: as for `Send`: `&UserMemory` only allows copies in and out, serialized by the
// owner's lock.
unsafe impl Sync for UserMemory {}

impl UserMemory {
    /// Wraps `len` bytes of this process's memory at `ptr`, to be registered as an MR
    /// with [`Pd::reg_user_mr`](crate::Pd::reg_user_mr) (or
    /// [`MrTable::reg_user_memory`](super::stag_table::MrTable::reg_user_memory)): the
    /// one unsafe step of registering application memory; the registration itself is
    /// safe. A C application's `ibv_reg_mr(pd, addr, len, access)` is this with
    /// `ptr = addr`, then `reg_user_mr` with `iova = addr`.
    ///
    /// # Safety
    ///
    /// The contract of the [module docs](self): `ptr .. ptr + len` is valid for reads
    /// and writes until the returned value is dropped. Returns `None` for a null `ptr`,
    /// `len == 0`, or a range that wraps the address space.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Option<UserMemory> {
        let ptr = NonNull::new(ptr)?;
        if len == 0 || (ptr.as_ptr() as usize).checked_add(len).is_none() {
            return None;
        }
        Some(UserMemory { ptr, len })
    }

    /// Length of the region, in bytes.
    #[allow(clippy::len_without_is_empty)] // never empty: `new` refuses 0
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if `off .. off + n` lies inside the region.
    fn fits(&self, off: usize, n: usize) -> bool {
        off.checked_add(n).is_some_and(|end| end <= self.len)
    }

    /// Copies `data` to byte `off` of the region. Returns false (and copies nothing) if
    /// it does not fit.
    pub(crate) fn copy_in(&self, off: usize, data: &[u8]) -> bool {
        if !self.fits(off, data.len()) {
            return false;
        }
        // SAFETY: `off + data.len() <= len` (checked above), so the destination range is
        // inside the region the contract keeps valid for writes; `data` is a Rust slice,
        // which cannot overlap the region (no reference into it exists: module docs).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len());
        }
        true
    }

    /// Copies `out.len()` bytes from byte `off` of the region into `out`. Returns false
    /// (and copies nothing) if the range does not fit.
    pub(crate) fn copy_out(&self, off: usize, out: &mut [u8]) -> bool {
        if !self.fits(off, out.len()) {
            return false;
        }
        // SAFETY: the source range is inside the region (checked above), valid for
        // reads by the contract; `out` is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len());
        }
        true
    }
}

impl UserMemory {
    /// Replaces the 64-bit word (native byte order) at byte `off` of the region by
    /// `f(old)` and returns `old`: an RFC 7306 atomic's read-modify-write. When the
    /// word's address is 8-byte aligned it is one atomic operation on the application's
    /// memory (a compare-and-swap loop through `AtomicU64`), so it is atomic also
    /// against the application's own atomic instructions on that word; a misaligned
    /// word (possible only where the MR's iova and address differ modulo 8) is a copy
    /// out and a copy in, atomic only against the device's other accesses (the caller
    /// holds the MR's lock). `None` (nothing touched) if the word does not fit.
    pub(crate) fn atomic_update(&self, off: usize, f: impl Fn(u64) -> u64) -> Option<u64> {
        if !self.fits(off, 8) {
            return None;
        }
        // SAFETY: `off + 8 <= len` (checked above): the pointer stays inside the region.
        let p = unsafe { self.ptr.as_ptr().add(off) };
        if (p as usize).is_multiple_of(std::mem::align_of::<u64>()) {
            // SAFETY: `p` is 8-byte aligned and the 8 bytes are inside the region,
            // valid for reads and writes for the object's life (contract 1); the
            // reference lives only for this call. An `AtomicU64` has interior
            // mutability, so the application reading or writing the same word meanwhile
            // breaks no Rust aliasing rule: at worst it races as plain C code would
            // with a NIC's atomic.
            let word = unsafe { std::sync::atomic::AtomicU64::from_ptr(p.cast::<u64>()) };
            let old = word.fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |v| Some(f(v)),
            );
            // `fetch_update` with a closure that always answers `Some` cannot fail.
            return Some(old.unwrap_or_else(|v| v));
        }
        let mut b = [0u8; 8];
        self.copy_out(off, &mut b);
        let old = u64::from_ne_bytes(b);
        self.copy_in(off, &f(old).to_ne_bytes());
        Some(old)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_stay_inside_the_region() {
        let mut backing = vec![0u8; 64];
        // SAFETY: `backing` outlives `m` (its last use is the block below, before
        // `backing` is read) and is not otherwise used while `m` is in use.
        let m = unsafe { UserMemory::new(backing.as_mut_ptr(), 64) }.unwrap();
        assert!(m.copy_in(60, &[1, 2, 3, 4]));
        assert!(!m.copy_in(61, &[1, 2, 3, 4]), "one byte past the end");
        assert!(!m.copy_in(usize::MAX, &[1]), "offset overflow");
        let mut out = [0u8; 6];
        assert!(m.copy_out(58, &mut out));
        assert_eq!(out, [0, 0, 1, 2, 3, 4]);
        assert!(!m.copy_out(59, &mut out));
        assert_eq!(m.len(), 64);
        assert_eq!(&backing[60..], &[1, 2, 3, 4]);
    }

    #[test]
    fn atomic_update_changes_one_word_and_returns_the_old_value() {
        let mut backing = vec![0u64; 4];
        backing[1] = 40;
        let ptr = backing.as_mut_ptr().cast::<u8>();
        // SAFETY: `backing` (32 bytes) outlives `m` and is only read after `m`'s uses.
        let m = unsafe { UserMemory::new(ptr, 32) }.unwrap();
        assert_eq!(
            m.atomic_update(8, |v| v + 2),
            Some(40),
            "aligned: AtomicU64"
        );
        assert_eq!(m.atomic_update(8, |v| v * 10), Some(42));
        assert_eq!(m.atomic_update(25, |_| 1), None, "does not fit");
        // A misaligned word (offset 4) is updated by copies.
        let mut word = [0u8; 8];
        assert!(m.copy_out(4, &mut word));
        assert_eq!(
            m.atomic_update(4, |_| u64::MAX),
            Some(u64::from_ne_bytes(word))
        );
        assert!(m.copy_out(4, &mut word));
        assert_eq!(word, [0xff; 8]);
        assert!(m.copy_out(0, &mut word[..4]));
        assert_eq!(
            &word[..4],
            &[0, 0, 0, 0],
            "the bytes around it are untouched"
        );
        assert_eq!(backing[1].to_ne_bytes()[4..], 420u64.to_ne_bytes()[4..]);
    }

    #[test]
    fn null_empty_and_wrapping_regions_are_refused() {
        let mut b = [0u8; 4];
        // SAFETY: none of these is ever accessed: `new` refuses them all.
        unsafe {
            assert!(UserMemory::new(std::ptr::null_mut(), 4).is_none());
            assert!(UserMemory::new(b.as_mut_ptr(), 0).is_none());
            assert!(UserMemory::new(usize::MAX as *mut u8, 2).is_none());
        }
    }
}
