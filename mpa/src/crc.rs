//! CRC32c (Castagnoli) as used by MPA FPDUs.
//!
//! RFC 5044, section 4.4 ("MPA CRC"): the FPDU CRC is the CRC32c of
//! [RFC 3385]/[RFC 3720] (the iSCSI CRC), computed over every octet of the FPDU
//! that precedes the CRC field: ULPDU_Length, ULPDU, PAD and any MPA Markers
//! inside the FPDU (see [`crate::fpdu`] for exactly which Markers).
//!
//! **Byte order on the wire**: the 32-bit CRC value (as returned by
//! [`crc32c()`], the usual reflected CRC32c with initial value and final XOR
//! `0xFFFF_FFFF`) is sent least significant octet first. This is the order
//! RFC 3720 appendix B.4 lists its examples in (`aa 36 91 8a` for the value
//! `0x8a9136aa`), and the order Linux siw puts on the wire: checked against
//! every FPDU of `shared/pcaps/rping-srv_crc-cli_crc.pcap` (first FPDU of the
//! initiator: CRC field octets `2f fb a8 cb`, value `0xcba8fb2f`). Use
//! [`crc_to_wire`] / [`crc_from_wire`] to convert.
//!
//! **Implementation**: one of three, chosen once at run time by what the CPU has
//! ([`Engine::detect`]):
//!
//! * with AVX-512 and VPCLMULQDQ, the `crc-fast` crate's CRC-32/ISCSI (a fusion of the
//!   SSE4.2 `crc32` instruction with carry-less multiplication folding): on a Xeon with
//!   AVX-512 it ran at 57 GB/s on 1460-octet FPDUs and 107 GB/s on 9000 to 64 KiB,
//!   against 16 and 27 GB/s for the `crc32c` crate;
//! * otherwise, with SSE4.2 and PCLMULQDQ, our own three streams of the `crc32`
//!   instruction over the whole buffer (`crc::sse42`, the one `unsafe` module of this
//!   crate, with its contract): on an AMD EPYC with AVX2 but no AVX-512, 21.7 GiB/s at
//!   1450 octets against 11.4 for the `crc32c` crate (which runs half of such an FPDU in
//!   one stream) and 10.8 for `crc-fast`;
//! * elsewhere the `crc32c` crate (a table where there is no `crc32` instruction).
//!
//! All compute the same function; the tests hold each against the bit-at-a-time
//! reference. Why three: docs/ARCHITECTURE.md, "The CRC32c engines"; the measurements:
//! docs/PERFORMANCE.md, "Where the time goes".

#[cfg(target_arch = "x86_64")]
mod sse42;

/// Length of the CRC field at the end of every FPDU, in octets (RFC 5044, section 4.1).
///
/// The field is present even when CRC was not negotiated; it then holds zero.
pub const CRC_LEN: usize = 4;

/// The CRC32c implementation in use ([`Engine::detect`], once per process). More may
/// come with other CPUs, so matches outside this crate need a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Engine {
    /// The `crc-fast` crate (chosen where the CPU has AVX-512 and VPCLMULQDQ).
    CrcFast,
    /// The `crc32c` crate (where the CPU has neither of the others' features).
    Crc32c,
    /// Three streams of the SSE4.2 `crc32` instruction over the whole buffer, joined by
    /// PCLMULQDQ (`crc::sse42`; chosen with SSE4.2 and PCLMULQDQ where the AVX-512 set
    /// of [`Engine::CrcFast`] is missing). On a CPU without those features (or not
    /// x86_64) it computes the same value with the `crc32c` crate.
    Sse42ThreeStreams,
}

impl Engine {
    /// The engine for this CPU: [`Engine::CrcFast`] with AVX-512F, AVX-512VL and VPCLMULQDQ,
    /// [`Engine::Sse42ThreeStreams`] with SSE4.2 and PCLMULQDQ, [`Engine::Crc32c`]
    /// otherwise (the measurements in the module docs).
    pub fn detect() -> Engine {
        #[cfg(target_arch = "x86_64")]
        {
            // What crc-fast 1.10 itself needs for its AVX-512 paths (its
            // `crc32::fusion::x86`); without them it runs a 128-bit fusion that the
            // `crc32c` crate beats.
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("vpclmulqdq")
            {
                return Engine::CrcFast;
            }
            if sse42::available() {
                return Engine::Sse42ThreeStreams;
            }
        }
        Engine::Crc32c
    }

    /// The engine this process uses (detected on the first call, then cached).
    pub fn current() -> Engine {
        static CURRENT: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
        *CURRENT.get_or_init(Engine::detect)
    }

    /// `crc32c_append` with this engine (see [`crc32c_append`]).
    #[inline]
    pub fn append(self, crc: u32, data: &[u8]) -> u32 {
        match self {
            Engine::Crc32c => crc32c::crc32c_append(crc, data),
            #[cfg(target_arch = "x86_64")]
            Engine::Sse42ThreeStreams => sse42::append(crc, data),
            #[cfg(not(target_arch = "x86_64"))]
            Engine::Sse42ThreeStreams => crc32c::crc32c_append(crc, data),
            Engine::CrcFast if crc == 0 => crc_fast::crc32_iscsi(data) as u32,
            Engine::CrcFast => {
                // The digest's state is the CRC register before the final XOR.
                let mut digest = crc_fast::Digest::new_with_init_state(
                    crc_fast::CrcAlgorithm::Crc32Iscsi,
                    u64::from(!crc),
                );
                digest.update(data);
                // A CRC-32 digest's value fits in 32 bits.
                digest.finalize() as u32
            }
        }
    }
}

/// CRC32c of `data`: reflected polynomial `0x82F63B78`, initial value and final
/// XOR `0xFFFF_FFFF` (RFC 3720, appendix B.4).
///
/// Returns the CRC as a `u32` value; see [`crc_to_wire`] for the octet order
/// on the wire. Never fails.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    Engine::current().append(0, data)
}

/// Continues a CRC32c: `crc32c_append(crc32c(a), b) == crc32c(a ++ b)`.
///
/// `crc` is a finished CRC value (as returned by [`crc32c()`]); start with `0`
/// for an empty prefix. Never fails.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    Engine::current().append(crc, data)
}

/// CRC32c over the concatenation of `parts` (for example the ULPDU_Length
/// field, the ULPDU in several pieces, and the pad), without copying them
/// together first.
///
/// Returns the CRC value (RFC 5044, section 4.4); convert with
/// [`crc_to_wire`] before putting it into the FPDU. Never fails.
pub fn fpdu_crc(parts: &[&[u8]]) -> u32 {
    parts.iter().fold(0, |crc, part| crc32c_append(crc, part))
}

/// The four octets of the FPDU CRC field for the CRC value `crc`: least
/// significant octet first (see the module documentation for the evidence).
#[inline]
pub fn crc_to_wire(crc: u32) -> [u8; CRC_LEN] {
    crc.to_le_bytes()
}

/// The CRC value carried by the four octets of an FPDU CRC field (inverse of
/// [`crc_to_wire`]).
#[inline]
pub fn crc_from_wire(field: [u8; CRC_LEN]) -> u32 {
    u32::from_le_bytes(field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_vectors::*;

    /// RFC 3720 appendix B.4: the examples are listed as the CRC octets in
    /// transmission order, e.g. "CRC: aa 36 91 8a" for 32 zero octets.
    #[test]
    fn rfc3720_vectors() {
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc_to_wire(crc32c(&[0u8; 32])), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        assert_eq!(crc_to_wire(crc32c(&[0xffu8; 32])), [0x43, 0xab, 0xa8, 0x62]);
        let incrementing: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&incrementing), 0x46dd_794e);
        assert_eq!(crc_to_wire(crc32c(&incrementing)), [0x4e, 0x79, 0xdd, 0x46]);
        let decrementing: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(crc32c(&decrementing), 0x113f_db5c);
        assert_eq!(crc_to_wire(crc32c(&decrementing)), [0x5c, 0xdb, 0x3f, 0x11]);
        // An iSCSI Read (10) command PDU.
        let read_pdu = unhex(concat!(
            "01c00000", "00000000", "00000000", "00000000", "14000000", "00000400", "00000014",
            "00000018", "28000000", "00000000", "02000000", "00000000",
        ));
        assert_eq!(read_pdu.len(), 48);
        assert_eq!(crc32c(&read_pdu), 0xd996_3a56);
        assert_eq!(crc_to_wire(crc32c(&read_pdu)), [0x56, 0x3a, 0x96, 0xd9]);
    }

    #[test]
    fn append_and_parts_agree_with_whole() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let whole = crc32c(&data);
        assert_eq!(crc32c_append(crc32c(&data[..333]), &data[333..]), whole);
        assert_eq!(
            fpdu_crc(&[&data[..1], &data[1..700], &[], &data[700..]]),
            whole
        );
        assert_eq!(fpdu_crc(&[]), 0);
        assert_eq!(crc32c_append(0, &data), whole);
    }

    /// Bit-at-a-time CRC32c (RFC 3720 B.4 definition), the reference for the fast one.
    fn reference(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// Every length up to past the implementation's size classes (short buffers, 256
    /// octets, folding blocks), at unaligned starts, whole and appended at several
    /// split points, agrees with the reference.
    #[test]
    fn agrees_with_reference_over_lengths_alignments_and_splits() {
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 131 + 17) as u8).collect();
        let lens = (0..=600).chain([1020, 1023, 1024, 1025, 1448, 1460, 2047, 2048, 2900]);
        for len in lens {
            for start in [0usize, 1, 3, 7] {
                let d = &data[start..start + len];
                let want = reference(d);
                assert_eq!(crc32c(d), want, "len {len} start {start}");
                assert_eq!(crc32c_append(0, d), want, "len {len} start {start}");
                for engine in [Engine::CrcFast, Engine::Crc32c, Engine::Sse42ThreeStreams] {
                    assert_eq!(engine.append(0, d), want, "{engine:?} len {len}");
                    let (a, b) = d.split_at(len / 2);
                    assert_eq!(
                        engine.append(engine.append(0, a), b),
                        want,
                        "{engine:?} len {len} split"
                    );
                }
                for split in [1, 2, len / 3, len / 2, len.saturating_sub(3)] {
                    let split = split.min(len);
                    let (a, b) = d.split_at(split);
                    assert_eq!(
                        crc32c_append(crc32c(a), b),
                        want,
                        "len {len} start {start} split {split}"
                    );
                }
            }
        }
    }

    /// The first initiator FPDU of rping-srv_crc-cli_crc.pcap (frame 10):
    /// ULPDU_Length 34, no pad, CRC field `2f fb a8 cb`.
    #[test]
    fn wire_byte_order_matches_capture() {
        let stream = unhex(CRC_INITIATOR_STREAM);
        let fpdu = &stream[24..64];
        assert_eq!(&fpdu[..2], &[0x00, 0x22]);
        let field: [u8; 4] = fpdu[36..40].try_into().unwrap();
        assert_eq!(field, [0x2f, 0xfb, 0xa8, 0xcb]);
        assert_eq!(crc32c(&fpdu[..36]), 0xcba8_fb2f);
        assert_eq!(crc_from_wire(field), crc32c(&fpdu[..36]));
        assert_eq!(crc_to_wire(0xcba8_fb2f), field);
    }
}
