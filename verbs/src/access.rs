//! Memory access rights: `enum ibv_access_flags` of `<infiniband/verbs.h>`.
//!
//! The same flags serve two purposes in libibverbs, with different rules:
//!
//! - On a memory registration (`ibv_reg_mr(3)`, a fast registration, a memory
//!   window bind) they say what the local and remote peers may do with the
//!   memory. There the verbs rule applies: granting a remote peer the right to
//!   write ([`AccessFlags::REMOTE_WRITE`]) or to perform atomics
//!   ([`AccessFlags::REMOTE_ATOMIC`]) requires local write access
//!   ([`AccessFlags::LOCAL_WRITE`]); `ibv_reg_mr(3)` fails with `EINVAL`
//!   otherwise. Use [`AccessFlags::for_mr`] / [`AccessFlags::validate_for_mr`].
//! - On a QP (`ibv_qp_attr.qp_access_flags`) they say which incoming remote
//!   operations the QP accepts at all (RDMA Read / Write / Atomic as the Data
//!   Source or Sink); the local-write rule does not apply there, and
//!   [`AccessFlags::LOCAL_WRITE`] has no meaning.

use bitflags::bitflags;
use thiserror::Error;

bitflags! {
    /// Access rights of a memory region, window or QP: `enum ibv_access_flags`
    /// (`<infiniband/verbs.h>`), with the libibverbs bit values.
    ///
    /// In iWARP terms (RFC 5040 §2): `REMOTE_WRITE` lets the peer use the
    /// region's STag as the Data Sink of an RDMA Write, `REMOTE_READ` as the
    /// Data Source of an RDMA Read; `LOCAL_WRITE` lets the local RNIC place
    /// incoming data into it (receive buffers, Read Response sinks).
    ///
    /// Construct registrations with [`AccessFlags::for_mr`], which enforces the
    /// verbs rule; the plain bitflags constructors do not check it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE` (1): the local device may write the memory.
        const LOCAL_WRITE = 1;
        /// `IBV_ACCESS_REMOTE_WRITE` (1 << 1): a peer may RDMA Write into it.
        /// On an MR, requires [`AccessFlags::LOCAL_WRITE`].
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ` (1 << 2): a peer may RDMA Read from it.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC` (1 << 3): a peer may perform RFC 7306
        /// atomics on it. On an MR, requires [`AccessFlags::LOCAL_WRITE`].
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND` (1 << 4): memory windows may be bound to the MR.
        const MW_BIND = 1 << 4;
    }
}

/// Why a set of access flags is not acceptable for a memory registration.
///
/// Every variant makes `ibv_reg_mr(3)` fail with `EINVAL`
/// ([`crate::VerbsError::InvalidAccessFlags`] maps to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum AccessFlagsError {
    /// Bits outside the five flags this crate supports (for example
    /// `IBV_ACCESS_ZERO_BASED` (1 << 5) or `IBV_ACCESS_ON_DEMAND` (1 << 6),
    /// which no iWARP backend here implements).
    #[error("unsupported access flag bits {bits:#x}")]
    UnknownBits {
        /// The unsupported bits, as found in the raw value.
        bits: u32,
    },
    /// `REMOTE_WRITE` without `LOCAL_WRITE` on a registration.
    #[error("IBV_ACCESS_REMOTE_WRITE requires IBV_ACCESS_LOCAL_WRITE")]
    RemoteWriteWithoutLocalWrite,
    /// `REMOTE_ATOMIC` without `LOCAL_WRITE` on a registration.
    #[error("IBV_ACCESS_REMOTE_ATOMIC requires IBV_ACCESS_LOCAL_WRITE")]
    RemoteAtomicWithoutLocalWrite,
}

impl AccessFlags {
    /// The flags as the libibverbs `int access` / `qp_access_flags` value.
    pub const fn to_ibv(self) -> u32 {
        self.bits()
    }

    /// Parses a libibverbs access value for use on a QP
    /// (`ibv_qp_attr.qp_access_flags`): only unknown bits are rejected.
    ///
    /// # Errors
    ///
    /// [`AccessFlagsError::UnknownBits`] if `bits` has a bit outside the five
    /// supported flags.
    pub const fn from_ibv(bits: u32) -> Result<AccessFlags, AccessFlagsError> {
        let unknown = bits & !AccessFlags::all().bits();
        if unknown != 0 {
            return Err(AccessFlagsError::UnknownBits { bits: unknown });
        }
        Ok(AccessFlags::from_bits_retain(bits))
    }

    /// Validating constructor for a memory registration (`ibv_reg_mr(3)`,
    /// fast registration, memory window bind): parses a libibverbs access
    /// value and applies the verbs rule that `REMOTE_WRITE` and
    /// `REMOTE_ATOMIC` require `LOCAL_WRITE` (the kernel's
    /// `ib_check_mr_access`).
    ///
    /// # Errors
    ///
    /// [`AccessFlagsError::UnknownBits`],
    /// [`AccessFlagsError::RemoteWriteWithoutLocalWrite`],
    /// [`AccessFlagsError::RemoteAtomicWithoutLocalWrite`], checked in that
    /// order.
    pub const fn for_mr(bits: u32) -> Result<AccessFlags, AccessFlagsError> {
        match AccessFlags::from_ibv(bits) {
            Ok(flags) => flags.validate_for_mr(),
            Err(e) => Err(e),
        }
    }

    /// Applies the registration rule to already-typed flags; returns `self`
    /// when it holds.
    ///
    /// # Errors
    ///
    /// [`AccessFlagsError::RemoteWriteWithoutLocalWrite`] or
    /// [`AccessFlagsError::RemoteAtomicWithoutLocalWrite`].
    pub const fn validate_for_mr(self) -> Result<AccessFlags, AccessFlagsError> {
        if !self.contains(AccessFlags::LOCAL_WRITE) {
            if self.contains(AccessFlags::REMOTE_WRITE) {
                return Err(AccessFlagsError::RemoteWriteWithoutLocalWrite);
            }
            if self.contains(AccessFlags::REMOTE_ATOMIC) {
                return Err(AccessFlagsError::RemoteAtomicWithoutLocalWrite);
            }
        }
        Ok(self)
    }

    /// True if any remote access is granted (`REMOTE_WRITE`, `REMOTE_READ` or
    /// `REMOTE_ATOMIC`): the registration's STag may be advertised to a peer
    /// as an rkey.
    pub const fn is_remote(self) -> bool {
        self.intersects(
            AccessFlags::REMOTE_WRITE
                .union(AccessFlags::REMOTE_READ)
                .union(AccessFlags::REMOTE_ATOMIC),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values of `enum ibv_access_flags` in rdma-core's `libibverbs/verbs.h`.
    #[test]
    fn bit_values_match_verbs_h() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_WRITE.bits(), 2);
        assert_eq!(AccessFlags::REMOTE_READ.bits(), 4);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(AccessFlags::MW_BIND.bits(), 16);
        assert_eq!(AccessFlags::all().to_ibv(), 0x1f);
    }

    #[test]
    fn mr_rule_exhaustive_over_all_32_combinations() {
        for bits in 0u32..32 {
            let lw = bits & 1 != 0;
            let rw = bits & 2 != 0;
            let ra = bits & 8 != 0;
            let got = AccessFlags::for_mr(bits);
            let want = if !lw && rw {
                Err(AccessFlagsError::RemoteWriteWithoutLocalWrite)
            } else if !lw && ra {
                Err(AccessFlagsError::RemoteAtomicWithoutLocalWrite)
            } else {
                Ok(AccessFlags::from_bits_retain(bits))
            };
            assert_eq!(got, want, "bits {bits:#x}");
        }
    }

    #[test]
    fn mr_rule_examples() {
        assert_eq!(
            AccessFlags::for_mr(0x2),
            Err(AccessFlagsError::RemoteWriteWithoutLocalWrite)
        );
        assert_eq!(
            AccessFlags::for_mr(0x8),
            Err(AccessFlagsError::RemoteAtomicWithoutLocalWrite)
        );
        assert_eq!(
            AccessFlags::for_mr(0x4),
            Ok(AccessFlags::REMOTE_READ),
            "remote read alone is fine"
        );
        assert_eq!(
            AccessFlags::for_mr(0x7),
            Ok(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ)
        );
        assert_eq!(AccessFlags::for_mr(0), Ok(AccessFlags::empty()));
    }

    #[test]
    fn unknown_bits_rejected_before_rule() {
        // IBV_ACCESS_ZERO_BASED | REMOTE_WRITE: unknown bit reported first.
        assert_eq!(
            AccessFlags::for_mr(0x20 | 0x2),
            Err(AccessFlagsError::UnknownBits { bits: 0x20 })
        );
        assert_eq!(
            AccessFlags::from_ibv(0x40),
            Err(AccessFlagsError::UnknownBits { bits: 0x40 })
        );
        assert_eq!(
            AccessFlags::from_ibv(0x8000_0001),
            Err(AccessFlagsError::UnknownBits { bits: 0x8000_0000 })
        );
    }

    #[test]
    fn qp_access_has_no_local_write_rule() {
        assert_eq!(AccessFlags::from_ibv(0x2), Ok(AccessFlags::REMOTE_WRITE));
        assert_eq!(AccessFlags::from_ibv(0xe).unwrap().to_ibv(), 0xe);
    }

    #[test]
    fn is_remote() {
        assert!(!AccessFlags::LOCAL_WRITE.is_remote());
        assert!(!AccessFlags::MW_BIND.is_remote());
        assert!(AccessFlags::REMOTE_READ.is_remote());
        assert!((AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC).is_remote());
    }

    #[test]
    fn error_display() {
        assert_eq!(
            AccessFlagsError::RemoteWriteWithoutLocalWrite.to_string(),
            "IBV_ACCESS_REMOTE_WRITE requires IBV_ACCESS_LOCAL_WRITE"
        );
        assert_eq!(
            AccessFlagsError::UnknownBits { bits: 0x20 }.to_string(),
            "unsupported access flag bits 0x20"
        );
    }
}
