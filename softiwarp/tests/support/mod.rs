//! The harnesses of softiwarp's integration tests, one module each, shared by every test
//! binary (`#[path = "../support/mod.rs"] mod support;` in its `main.rs`):
//!
//! - [`host`]: a bare smoltcp host over a link and the two ends of a TCP echo;
//! - [`stack`]: transport `Stack`s (and a raw smoltcp TCP peer) on a memory link pair,
//!   stepped on a virtual clock, and seeded ULPDU flows;
//! - [`qp`]: two sans-IO QP engines back to back, moving whole ULPDUs;
//! - [`devices`]: two real devices (engine threads) on a memory link with verbs objects;
//! - [`iwcm`]: two soft devices each with its `SoftProvider` and `IwCm`, a delivery
//!   checker and a raw MPA peer.
#![allow(dead_code)] // each test binary uses a different subset

pub mod devices;
pub mod host;
pub mod iwcm;
pub mod qp;
pub mod stack;

use softiwarp::link::{MemoryConfig, MemoryLink};
use verbs::{AccessFlags, QpCap};

/// The one seeded PRNG of the tests: testkit's splitmix64.
pub use testkit::Rng;

/// What the tests draw from an [`Rng`] besides testkit's `next_u64`, `below` and `chance`.
pub trait RngExt {
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize;
    /// Fills `buf`, eight bytes (one `next_u64`, little-endian) at a time.
    fn fill(&mut self, buf: &mut [u8]);
    /// `n` random bytes, as [`RngExt::fill`] makes them.
    fn bytes(&mut self, n: usize) -> Vec<u8>;
}

impl RngExt for Rng {
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below((hi - lo + 1) as u64) as usize
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill(&mut v);
        v
    }
}

/// `len` deterministic bytes, a function of `seed` only: the data the tests write, send
/// and compare.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

/// Every access right an MR can have.
pub fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

/// [`all_access`] plus `REMOTE_ATOMIC`: a target of RFC 7306 atomics.
#[allow(dead_code)] // each test binary uses a subset
pub fn atomic_access() -> AccessFlags {
    all_access() | AccessFlags::REMOTE_ATOMIC
}

/// A QP capability set: `depth` WRs per queue, `sges` SGEs per WR, 256 inline bytes.
pub fn cap(depth: u32, sges: u32) -> QpCap {
    QpCap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: sges,
        max_recv_sge: sges,
        max_inline_data: 256,
    }
}

/// A memory link pair with `mtu`.
pub fn links(mtu: usize) -> (MemoryLink, MemoryLink) {
    MemoryLink::pair(MemoryConfig {
        mtu,
        ..Default::default()
    })
    .expect("memory link")
}

/// utime + stime of a thread of this process, in clock ticks.
pub fn thread_ticks(tid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses): state is field 3;
    // utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

pub fn ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100, |v| v as u64)
}
