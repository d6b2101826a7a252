//! Whether a range of the process's address space is mapped with the access an MR
//! needs, from `/proc/self/maps` (proc(5)): what the kernel's `ibv_reg_mr` checks by
//! pinning the pages (`get_user_pages`, EFAULT when a page is not mapped, or not
//! writable for an MR the device writes). The soft device places data straight into
//! the application's memory from its own threads, so a registration over memory that
//! is not there would turn into a fault inside the library later; it is refused at
//! `ibv_reg_mr` instead. (Memory unmapped while registered breaks the contract of
//! `UserMemory::new`, as it would leave a kernel device writing pinned pages nobody
//! owns.)

/// True if every byte of `[addr, addr + len)` lies in mappings that are readable and,
/// when `write`, writable. `len` 0 is true. A `/proc/self/maps` that cannot be read is
/// true (no check is better than refusing every registration).
pub fn is_mapped(addr: usize, len: usize, write: bool) -> bool {
    match std::fs::read_to_string("/proc/self/maps") {
        Ok(maps) => covers(&maps, addr, len, write),
        Err(_) => true,
    }
}

/// [`is_mapped`] against the text of a maps file.
fn covers(maps: &str, addr: usize, len: usize, write: bool) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let mut ranges: Vec<(usize, usize)> = maps
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (lo, hi) = f.next()?.split_once('-')?;
            let perms = f.next()?.as_bytes();
            let ok = perms.first() == Some(&b'r') && (!write || perms.get(1) == Some(&b'w'));
            ok.then(|| {
                Some((
                    usize::from_str_radix(lo, 16).ok()?,
                    usize::from_str_radix(hi, 16).ok()?,
                ))
            })?
        })
        .collect();
    ranges.sort_unstable();
    let mut at = addr;
    for (lo, hi) in ranges {
        if at >= end {
            break;
        }
        if hi <= at {
            continue;
        }
        if lo > at {
            return false;
        }
        at = hi;
    }
    at >= end
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00401000 r--p 00000000 08:01 1 /bin/x
00401000-00403000 rw-p 00000000 00:00 0
00403000-00404000 rw-p 00000000 00:00 0 [heap]
00500000-00501000 ---p 00000000 00:00 0
7ffd0000-7ffd1000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn a_range_over_adjacent_writable_mappings_is_mapped() {
        assert!(covers(MAPS, 0x401000, 0x3000, true));
        assert!(covers(MAPS, 0x402fff, 2, true));
        assert!(covers(MAPS, 0x7ffd0000, 0x1000, true));
        assert!(covers(MAPS, 0x1234, 0, true));
    }

    #[test]
    fn unmapped_read_only_or_inaccessible_memory_is_refused() {
        // Unmapped (the page at 0x1000, a hole after the heap).
        assert!(!covers(MAPS, 0x1000, 8, false));
        assert!(!covers(MAPS, 0x403f00, 0x200, false));
        // Read-only: fine to read from, not for an MR the device writes.
        assert!(covers(MAPS, 0x400000, 0x1000, false));
        assert!(!covers(MAPS, 0x400000, 0x1000, true));
        assert!(!covers(MAPS, 0x400800, 0x1000, true));
        // PROT_NONE.
        assert!(!covers(MAPS, 0x500000, 16, false));
        // Wrapping past the top of the address space.
        assert!(!covers(MAPS, usize::MAX - 4, 16, false));
    }

    #[test]
    fn this_process_has_its_own_stack_and_heap_mapped() {
        let v = vec![7u8; 1 << 16];
        assert!(is_mapped(v.as_ptr() as usize, v.len(), true));
        let x = 5u64;
        assert!(is_mapped(std::ptr::addr_of!(x) as usize, 8, true));
        assert!(!is_mapped(0x1000, 8, false));
    }
}
