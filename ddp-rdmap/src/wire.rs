//! Private big-endian field helpers.
//!
//! Every read goes through `slice::get`, so a read outside the buffer yields zero
//! instead of panicking: the `Packet` views call these after `new_checked` has
//! proved the range is present, and a `new_unchecked` view on a short buffer reads
//! zeros rather than aborting. Writes outside the buffer are dropped the same way;
//! every `emit` checks the buffer length first and reports `Error::BufferTooSmall`.

use core::ops::Range;

/// `N` bytes at `at`, or zeros if the buffer is too short.
pub(crate) fn array<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    at.checked_add(N)
        .and_then(|end| buf.get(at..end))
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .unwrap_or([0; N])
}

/// Byte at `at`, or zero.
pub(crate) fn u8_at(buf: &[u8], at: usize) -> u8 {
    buf.get(at).copied().unwrap_or(0)
}

/// Big-endian u16 at `at`, or zero.
pub(crate) fn u16_at(buf: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(array(buf, at))
}

/// Big-endian u32 in `range` (4 bytes), or zero.
pub(crate) fn u32_in(buf: &[u8], range: Range<usize>) -> u32 {
    u32::from_be_bytes(array(buf, range.start))
}

/// Big-endian u64 in `range` (8 bytes), or zero.
pub(crate) fn u64_in(buf: &[u8], range: Range<usize>) -> u64 {
    u64::from_be_bytes(array(buf, range.start))
}

/// Copies `bytes` to `at`; silently does nothing if it does not fit (callers check).
pub(crate) fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(dst) = at
        .checked_add(bytes.len())
        .and_then(|end| buf.get_mut(at..end))
    {
        dst.copy_from_slice(bytes);
    }
}

/// Writes a big-endian u32 into `range`.
pub(crate) fn put_u32(buf: &mut [u8], range: Range<usize>, v: u32) {
    put(buf, range.start, &v.to_be_bytes());
}

/// Writes a big-endian u64 into `range`.
pub(crate) fn put_u64(buf: &mut [u8], range: Range<usize>, v: u64) {
    put(buf, range.start, &v.to_be_bytes());
}

/// Sub-slice `range` of `buf`, or an empty slice if it is out of bounds.
pub(crate) fn slice(buf: &[u8], range: Range<usize>) -> &[u8] {
    buf.get(range).unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_reads_are_zero_not_panics() {
        let b = [0x12u8, 0x34];
        assert_eq!(u16_at(&b, 0), 0x1234);
        assert_eq!(u16_at(&b, 1), 0);
        assert_eq!(u32_in(&b, 0..4), 0);
        assert_eq!(u64_in(&b, usize::MAX - 2..usize::MAX), 0);
        assert_eq!(u8_at(&b, 5), 0);
        assert_eq!(slice(&b, 1..9), &[] as &[u8]);
        let mut w = [0u8; 2];
        put_u32(&mut w, 0..4, 0xdead_beef);
        assert_eq!(w, [0, 0]);
        put(&mut w, usize::MAX, &[1]);
        assert_eq!(w, [0, 0]);
    }
}
