//! Steering Tags: the one key of an iWARP memory registration.
//!
//! RFC 5040 §2 defines the STag as the 32-bit identifier of a Tagged Buffer;
//! verbs call the same value the lkey (used in local [`crate::Sge`]s) and the
//! rkey (advertised to the peer and carried in tagged DDP headers, RFC 5041
//! §4.1). In iWARP they are one value: [`Lkey`] and [`Rkey`] are aliases of
//! [`Stag`].
//!
//! Layout, as in Linux siw (`drivers/infiniband/sw/siw`) and the RDMAC verbs:
//! the upper 24 bits are the *index* chosen by the device, naming the memory
//! object (MR or MW); the lower 8 bits are the *key* chosen by the consumer and
//! changed on every fast registration (`ibv_inc_rkey(3)` increments it), so a
//! stale rkey held by a peer stops matching once the region is re-registered.
//!
//! ```text
//!  31                               8 7            0
//! +----------------------------------+--------------+
//! |          index (24 bits)         |  key (8 bits)|
//! +----------------------------------+--------------+
//! ```

use core::fmt;
use thiserror::Error;

/// A 32-bit Steering Tag: `index << 8 | key` (RFC 5040 §2; Linux siw layout).
///
/// The raw value is what goes on the wire (big-endian, in the tagged DDP
/// header) and in `ibv_mr.lkey` / `ibv_mr.rkey` / `ibv_sge.lkey`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Stag(u32);

/// The lkey of a registration (`ibv_mr.lkey`, `ibv_sge.lkey`): in iWARP, the
/// STag itself.
pub type Lkey = Stag;

/// The rkey of a registration (`ibv_mr.rkey`, `ibv_send_wr.wr.rdma.rkey`): in
/// iWARP, the STag itself.
pub type Rkey = Stag;

/// A STag index that does not fit in 24 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
#[error("STag index {index:#x} exceeds 24 bits (max {max:#x})", max = Stag::MAX_INDEX)]
pub struct StagIndexError {
    /// The rejected index.
    pub index: u32,
}

impl Stag {
    /// Largest index: 2^24 - 1.
    pub const MAX_INDEX: u32 = 0x00ff_ffff;
    /// Bits of the key field.
    pub const KEY_MASK: u32 = 0xff;
    /// Shift of the index field.
    pub const INDEX_SHIFT: u32 = 8;

    /// Builds a STag from a 24-bit index and an 8-bit key.
    ///
    /// # Errors
    ///
    /// [`StagIndexError`] if `index` > [`Stag::MAX_INDEX`].
    pub const fn new(index: u32, key: u8) -> Result<Stag, StagIndexError> {
        if index > Stag::MAX_INDEX {
            return Err(StagIndexError { index });
        }
        Ok(Stag((index << Stag::INDEX_SHIFT) | key as u32))
    }

    /// Wraps a raw 32-bit value (as found on the wire or in an `ibv_mr`); every
    /// value is a well-formed STag.
    pub const fn from_raw(raw: u32) -> Stag {
        Stag(raw)
    }

    /// The raw 32-bit value.
    pub const fn raw(self) -> u32 {
        self.0
    }

    /// The 24-bit index (upper 24 bits), naming the MR/MW object.
    pub const fn index(self) -> u32 {
        self.0 >> Stag::INDEX_SHIFT
    }

    /// The 8-bit consumer key (lower 8 bits).
    pub const fn key(self) -> u8 {
        (self.0 & Stag::KEY_MASK) as u8
    }

    /// The same index with another key: the STag a fast registration with
    /// `key` produces.
    pub const fn with_key(self, key: u8) -> Stag {
        Stag((self.0 & !Stag::KEY_MASK) | key as u32)
    }

    /// The same index with the key incremented modulo 256: `ibv_inc_rkey(3)`.
    pub const fn inc_key(self) -> Stag {
        self.with_key(self.key().wrapping_add(1))
    }
}

impl fmt::Debug for Stag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Stag({:#010x}: index {:#x}, key {:#04x})",
            self.0,
            self.index(),
            self.key()
        )
    }
}

/// Formats the raw value as `0x%08x`, as siw and Wireshark print STags.
impl fmt::Display for Stag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

impl From<Stag> for u32 {
    fn from(s: Stag) -> u32 {
        s.0
    }
}

impl From<u32> for Stag {
    fn from(raw: u32) -> Stag {
        Stag(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing() {
        let s = Stag::new(0x12_3456, 0x78).unwrap();
        assert_eq!(s.raw(), 0x1234_5678);
        assert_eq!(s.index(), 0x12_3456);
        assert_eq!(s.key(), 0x78);
        assert_eq!(Stag::new(0, 0).unwrap().raw(), 0);
        assert_eq!(Stag::new(1, 0).unwrap().raw(), 0x100);
        assert_eq!(Stag::new(0, 0xff).unwrap().raw(), 0xff);
        assert_eq!(Stag::new(Stag::MAX_INDEX, 0xff).unwrap().raw(), u32::MAX);
    }

    #[test]
    fn unpacking_raw() {
        let s = Stag::from_raw(0xdead_beef);
        assert_eq!(s.index(), 0xde_adbe);
        assert_eq!(s.key(), 0xef);
        assert_eq!(Stag::new(s.index(), s.key()).unwrap(), s);
        assert_eq!(u32::from(s), 0xdead_beef);
        assert_eq!(Stag::from(0xdead_beefu32), s);
    }

    #[test]
    fn index_too_large() {
        assert_eq!(
            Stag::new(0x100_0000, 0),
            Err(StagIndexError { index: 0x100_0000 })
        );
        assert_eq!(
            StagIndexError { index: 0x100_0000 }.to_string(),
            "STag index 0x1000000 exceeds 24 bits (max 0xffffff)"
        );
    }

    #[test]
    fn with_key_keeps_index() {
        let s = Stag::new(0xabc, 0x01).unwrap();
        let t = s.with_key(0xfe);
        assert_eq!(t.raw(), 0x000a_bcfe);
        assert_eq!(t.index(), s.index());
        assert_eq!(t.key(), 0xfe);
        assert_eq!(t.with_key(0x01), s);
    }

    #[test]
    fn inc_key_wraps() {
        let s = Stag::new(7, 0xfe).unwrap();
        assert_eq!(s.inc_key().raw(), 0x7ff);
        assert_eq!(s.inc_key().inc_key().raw(), 0x700);
    }

    #[test]
    fn formatting() {
        let s = Stag::from_raw(0x0000_1a02);
        assert_eq!(s.to_string(), "0x00001a02");
        assert_eq!(format!("{s:?}"), "Stag(0x00001a02: index 0x1a, key 0x02)");
    }
}
