//! CRC32c with the SSE4.2 `crc32` instruction in three streams over the whole buffer,
//! joined with one carry-less multiplication (PCLMULQDQ): x86_64 only.
//!
//! **Why our own**: MPA checks a CRC32c over every FPDU, and at MTU 1500 an FPDU is about
//! 1,454 octets. The `crc32c` crate runs its three streams only over whole blocks of 768
//! octets and the rest (about half of such an FPDU) in one stream, whose `crc32`
//! instructions wait on each other (latency 3 cycles, throughput 1 a cycle); `crc-fast`
//! is slower still at that size on CPUs without AVX-512 (docs/ARCHITECTURE.md, "The
//! CRC32c engines"). Here the buffer is cut into three equal blocks whatever its length,
//! so one stream runs only over what is left after them (0-23 octets, or a whole
//! remainder under 48, where the join would cost more than it saves): 21.7 against
//! 11.4 GiB/s for the `crc32c` crate at 1450 octets on an AMD EPYC (2.45 GHz;
//! criterion, `cargo bench -p softiwarp --bench fpdu_path -- crc32c_engine`).
//!
//! **The arithmetic**: `crc32 c, w` turns the CRC register `c` (reflected, no inversion)
//! into `(c * x^64 + w * x^32) mod P`. After three streams over blocks A, B, C of L octets
//! each (B and C starting from 0), the register over A ++ B ++ C is
//! `s0 * x^(16L) + s1 * x^(8L) + s2 (mod P)`. `crc32(0, clmul(s, K))` with
//! `K = x^(8L - 33) mod P` (reflected; the 33 rather than 32 because the carry-less
//! product of two reflected 32-bit values comes out one bit short of a reflected 64-bit
//! one) is `s * x^(8L) mod P`. The constants for every block length this module uses are
//! computed at compile time ([`SHIFT`]).
//!
//! **The `unsafe` contract** (the only `unsafe` in `mpa`): [`register`] and its helpers
//! are `#[target_feature(enable = "sse4.2,pclmulqdq")]`, so calling them on a CPU without
//! either feature is undefined behaviour. The one call, in [`append`], is made only after
//! `is_x86_feature_detected!` has seen both (a cached load after the first call);
//! otherwise [`append`] computes the same value with the `crc32c` crate. Everything else
//! here is safe code: slices are read through bounds-checked `u64::from_le_bytes`, never
//! through pointers.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    _mm_clmulepi64_si128, _mm_crc32_u64, _mm_crc32_u8, _mm_cvtsi128_si64, _mm_cvtsi32_si128,
};

/// The CRC32c polynomial, reflected (RFC 3720, appendix B.4).
const POLY: u32 = 0x82F6_3B78;

/// Longest block, in 8-octet words: buffers longer than three such blocks (12 KiB) go
/// through in chunks of `3 * MAX_WORDS` words.
const MAX_WORDS: usize = 512;

/// Fewest words per block worth the join (two multiplications and a `crc32`); shorter
/// remainders go through one stream.
const MIN_WORDS: usize = 2;

/// `SHIFT[k]` = `x^(64k - 33) mod P`, reflected: the constant that moves a CRC register
/// past `k` words (`8k` octets), for `k` in `1..=2 * MAX_WORDS` (`SHIFT[0]` is unused).
static SHIFT: [u32; 2 * MAX_WORDS + 1] = shift_table();

const fn shift_table() -> [u32; 2 * MAX_WORDS + 1] {
    let mut table = [0u32; 2 * MAX_WORDS + 1];
    // x^31, reflected: bit 0 holds the coefficient of x^31.
    let mut power: u32 = 1;
    let mut k = 1;
    while k <= 2 * MAX_WORDS {
        table[k] = power;
        // Times x^64: 64 times times x (a right shift in the reflected order).
        let mut i = 0;
        while i < 64 {
            power = (power >> 1) ^ if power & 1 != 0 { POLY } else { 0 };
            i += 1;
        }
        k += 1;
    }
    table
}

/// Continues the CRC32c `crc` (a finished value, as `crc32c::crc32c_append` takes) over
/// `data`. Same value as the `crc32c` crate, on every CPU; fast where the CPU has SSE4.2
/// and PCLMULQDQ. Never fails.
#[inline]
pub(super) fn append(crc: u32, data: &[u8]) -> u32 {
    if available() {
        // SAFETY: `available()` has just seen SSE4.2 and PCLMULQDQ on this CPU, the
        // features `register` is compiled for (the module's contract).
        !unsafe { register(!crc, data) }
    } else {
        crc32c::crc32c_append(crc, data)
    }
}

/// Whether this CPU has what [`register`] needs (cached by the standard library after
/// the first call).
#[inline]
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("sse4.2")
        && std::arch::is_x86_feature_detected!("pclmulqdq")
}

/// The CRC register (no inversions) after `data`, from `reg`.
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn register(mut reg: u32, mut data: &[u8]) -> u32 {
    while data.len() >= 24 * MAX_WORDS {
        let (chunk, rest) = data.split_at(24 * MAX_WORDS);
        reg = three_streams(reg, chunk, MAX_WORDS);
        data = rest;
    }
    let words = data.len() / 24;
    if words >= MIN_WORDS {
        let (chunk, rest) = data.split_at(24 * words);
        reg = three_streams(reg, chunk, words);
        data = rest;
    }
    let mut reg64 = u64::from(reg);
    let mut tail = data.chunks_exact(8);
    for word in &mut tail {
        reg64 = _mm_crc32_u64(reg64, le_word(word));
    }
    // `crc32` leaves the upper half of its 64-bit register zero.
    let mut reg = reg64 as u32;
    for &octet in tail.remainder() {
        reg = _mm_crc32_u8(reg, octet);
    }
    reg
}

/// The register after `chunk` (exactly `3 * words` words), from `reg`: three streams of
/// `words` words each, joined.
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn three_streams(reg: u32, chunk: &[u8], words: usize) -> u32 {
    let len = 8 * words;
    let (a, rest) = chunk.split_at(len);
    let (b, c) = rest.split_at(len);
    let (mut s0, mut s1, mut s2) = (u64::from(reg), 0u64, 0u64);
    for ((wa, wb), wc) in a
        .chunks_exact(8)
        .zip(b.chunks_exact(8))
        .zip(c.chunks_exact(8))
    {
        s0 = _mm_crc32_u64(s0, le_word(wa));
        s1 = _mm_crc32_u64(s1, le_word(wb));
        s2 = _mm_crc32_u64(s2, le_word(wc));
    }
    // s0 moves past B and C, s1 past C; `crc32(0, .)` is linear, so one reduction serves
    // both products.
    let moved = times_shift(s0 as u32, SHIFT[2 * words]) ^ times_shift(s1 as u32, SHIFT[words]);
    (_mm_crc32_u64(0, moved) ^ s2) as u32
}

/// The carry-less product of two 32-bit values (at most 63 bits).
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn times_shift(reg: u32, shift: u32) -> u64 {
    let product = _mm_clmulepi64_si128(
        _mm_cvtsi32_si128(reg as i32),
        _mm_cvtsi32_si128(shift as i32),
        0x00,
    );
    _mm_cvtsi128_si64(product) as u64
}

/// The little-endian 64-bit word at the start of `octets` (at least 8 long).
#[inline(always)]
fn le_word(octets: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&octets[..8]);
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants agree with multiplying out `x^(64k - 33) mod P` bit by bit from x^0.
    #[test]
    fn shift_constants_are_the_powers_of_x() {
        let mut power: u32 = 0x8000_0000; // x^0, reflected
        for n in 1..=(64 * 2 * MAX_WORDS - 33) {
            power = (power >> 1) ^ if power & 1 != 0 { POLY } else { 0 };
            if (n + 33) % 64 == 0 {
                assert_eq!(SHIFT[(n + 33) / 64], power, "k {}", (n + 33) / 64);
            }
        }
    }

    /// Lengths around every block boundary this module uses (the join's minimum, the
    /// 12 KiB chunks) agree with the `crc32c` crate, whole and appended.
    #[test]
    fn agrees_with_the_crc32c_crate_around_the_block_boundaries() {
        let data: Vec<u8> = (0..40_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let chunk = 24 * MAX_WORDS;
        let lens = (0..200).chain((1400..1500).step_by(3)).chain([
            chunk - 1,
            chunk,
            chunk + 1,
            chunk + 47,
            chunk + 48,
            2 * chunk + 25,
            36_000,
        ]);
        for len in lens {
            for start in [0usize, 3] {
                let d = &data[start..start + len];
                let want = crc32c::crc32c(d);
                assert_eq!(append(0, d), want, "len {len} start {start}");
                let (x, y) = d.split_at(len / 3);
                assert_eq!(append(append(0, x), y), want, "len {len} split");
                assert_eq!(
                    append(0x1234_5678, d),
                    crc32c::crc32c_append(0x1234_5678, d)
                );
            }
        }
    }
}
