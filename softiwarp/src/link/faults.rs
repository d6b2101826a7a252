//! Fault-injection middleware: drop, duplicate, reorder and corrupt frames, per direction,
//! with a seeded RNG (ChaCha8), so a run is reproducible from its seed.
//!
//! Per frame, in this order, each with its own probability (a draw is made only for a
//! probability strictly between 0 and 1):
//!
//! 1. **drop**: the frame vanishes;
//! 2. **corrupt**: one byte at a uniformly chosen offset in `corrupt_from..len` is XORed
//!    with a uniformly chosen non-zero value (frames no longer than `corrupt_from` bytes
//!    are left alone);
//! 3. **reorder**: the frame is held back and handed on right after the next frame (at
//!    most one frame is held per direction);
//! 4. **duplicate**: the frame is handed on twice in a row.
//!
//! Held and duplicated frames never outlive a quiet moment: on receive, `recv` returns
//! `Ok(None)` only when nothing is held, so the poll-fd contract of [`Link`] still holds;
//! on send, a held frame goes out after the next sent frame, or at the next `recv` or
//! `poll_event` call, whichever comes first.
//!
//! Over a link with TCP offload ([`Link::tcp_offload`]) the faults still hit wire
//! segments: received offloaded frames (partial checksums, coalesced segments) are cut
//! into their segments with complete checksums first, every frame then reaches the
//! device unverified ([`RxMeta`](super::RxMeta)'s default); super-segments sent are cut
//! in software (the default [`Link::send_tcp_offload`]) and each piece goes through the
//! faults.
//!
//! There is no Ethernet FCS on a TAP or memory link, so a corrupted frame reaches the
//! stack as is: what catches it is the IPv4 header checksum, the TCP checksum, or
//! (for the Ethernet header) a destination MAC that no longer matches; an ARP frame has
//! no checksum at all. The smoke tests measure which.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;

use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{segment_tcp4, Link, LinkError, LinkEvent, RxCsum};

/// Which way a frame travels, seen from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the device to the wire (`send`).
    Tx,
    /// From the wire to the device (`recv`).
    Rx,
}

/// Fault probabilities for one direction; each in `0.0..=1.0`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FaultConfig {
    /// Probability that a frame is dropped.
    pub drop: f64,
    /// Probability that a frame is handed on twice.
    pub duplicate: f64,
    /// Probability that a frame is swapped with the next one.
    pub reorder: f64,
    /// Probability that one byte of a frame is corrupted.
    pub corrupt: f64,
    /// First byte offset eligible for corruption: 0 for the whole frame, 14 to spare the
    /// Ethernet header.
    pub corrupt_from: usize,
}

impl FaultConfig {
    /// No faults.
    pub fn none() -> Self {
        FaultConfig::default()
    }

    /// Checks every probability is a finite number in `0.0..=1.0`.
    ///
    /// Errors: [`LinkError::Config`] naming the first bad field.
    pub fn validate(&self) -> Result<(), LinkError> {
        for (name, p) in [
            ("drop", self.drop),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(LinkError::Config(format!(
                    "fault probability {name} = {p} is outside 0..=1"
                )));
            }
        }
        Ok(())
    }
}

/// Counters of one direction, in frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Frames handed on at their turn (a held frame counts in `reordered` instead, an
    /// extra copy in `duplicated`).
    pub passed: u64,
    /// Frames dropped.
    pub dropped: u64,
    /// Extra copies handed on.
    pub duplicated: u64,
    /// Frames held back behind the next one.
    pub reordered: u64,
    /// Frames with one byte corrupted.
    pub corrupted: u64,
}

/// One corruption, recorded when [`Faults::record_corruptions`] is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptedFrame {
    /// Direction of the frame.
    pub direction: Direction,
    /// Byte offset of the corrupted byte in the frame.
    pub offset: usize,
    /// The non-zero value the byte was XORed with.
    pub xor: u8,
    /// The frame after corruption.
    pub frame: Vec<u8>,
}

/// A [`Link`] wrapper that injects faults. See the [module docs](self).
#[derive(Debug)]
pub struct Faults<L> {
    inner: L,
    rng: ChaCha8Rng,
    tx: FaultConfig,
    rx: FaultConfig,
    tx_stats: FaultStats,
    rx_stats: FaultStats,
    /// Frames to return from `recv` before reading the inner link.
    ready: VecDeque<Vec<u8>>,
    /// Wire segments of an offloaded frame received from the inner link, not yet
    /// through the faults.
    wire: VecDeque<Vec<u8>>,
    held_rx: Option<Vec<u8>>,
    held_tx: Option<Vec<u8>>,
    scratch: Vec<u8>,
    pool: Vec<Vec<u8>>,
    record: bool,
    corruptions: Vec<CorruptedFrame>,
}

impl<L: Link> Faults<L> {
    /// Wraps `inner` with fault probabilities `tx` (frames sent) and `rx` (frames
    /// received), drawing from a ChaCha8 RNG seeded with `seed`.
    ///
    /// Errors: [`LinkError::Config`] if a probability is outside `0.0..=1.0` or NaN.
    pub fn new(inner: L, seed: u64, tx: FaultConfig, rx: FaultConfig) -> Result<Self, LinkError> {
        tx.validate()?;
        rx.validate()?;
        Ok(Faults {
            inner,
            rng: ChaCha8Rng::seed_from_u64(seed),
            tx,
            rx,
            tx_stats: FaultStats::default(),
            rx_stats: FaultStats::default(),
            ready: VecDeque::new(),
            wire: VecDeque::new(),
            held_rx: None,
            held_tx: None,
            scratch: Vec::new(),
            pool: Vec::new(),
            record: false,
            corruptions: Vec::new(),
        })
    }

    /// Starts or stops recording a copy of every corrupted frame (see
    /// [`Faults::take_corruptions`]).
    pub fn record_corruptions(&mut self, on: bool) {
        self.record = on;
    }

    /// Takes the corruptions recorded so far, oldest first.
    pub fn take_corruptions(&mut self) -> Vec<CorruptedFrame> {
        std::mem::take(&mut self.corruptions)
    }

    /// Counters of one direction.
    pub fn stats(&self, direction: Direction) -> FaultStats {
        match direction {
            Direction::Tx => self.tx_stats,
            Direction::Rx => self.rx_stats,
        }
    }

    /// Replaces the probabilities of one direction.
    ///
    /// Errors: [`LinkError::Config`] as for [`Faults::new`].
    pub fn set_config(
        &mut self,
        direction: Direction,
        config: FaultConfig,
    ) -> Result<(), LinkError> {
        config.validate()?;
        match direction {
            Direction::Tx => self.tx = config,
            Direction::Rx => self.rx = config,
        }
        Ok(())
    }

    /// The wrapped link.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped link, mutably.
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    fn hit(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            false
        } else if p >= 1.0 {
            true
        } else {
            // 53 random bits as a uniform f64 in [0, 1).
            ((self.rng.next_u64() >> 11) as f64) * (1.0 / (1u64 << 53) as f64) < p
        }
    }

    /// Corrupts one byte of `frame` if it is longer than `from`; returns whether it did.
    fn corrupt(&mut self, direction: Direction, frame: &mut [u8], from: usize) -> bool {
        let Some(span) = frame.len().checked_sub(from).filter(|&s| s > 0) else {
            return false;
        };
        let offset = from + (self.rng.next_u64() % span as u64) as usize;
        let xor = 1 + (self.rng.next_u64() % 255) as u8;
        frame[offset] ^= xor;
        if self.record {
            self.corruptions.push(CorruptedFrame {
                direction,
                offset,
                xor,
                frame: frame.to_vec(),
            });
        }
        true
    }

    fn copy_of(&mut self, frame: &[u8]) -> Vec<u8> {
        let mut v = self.pool.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(frame);
        v
    }

    /// Copies a queued frame into `buf` (cut to its length), keeps its buffer for
    /// reuse, and returns the length copied.
    fn hand_out(&mut self, f: Vec<u8>, buf: &mut [u8]) -> usize {
        let n = f.len().min(buf.len());
        buf[..n].copy_from_slice(&f[..n]);
        self.pool.push(f);
        n
    }

    /// The next frame of the inner link into `buf`, as the wire carries it: a frame
    /// the link offloaded (a partial checksum, several segments coalesced) is cut into
    /// its segments with complete checksums first ([`segment_tcp4`]), so that every
    /// fault hits one wire segment and a corruption is caught by the TCP checksum.
    fn next_inner(&mut self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        loop {
            if let Some(f) = self.wire.pop_front() {
                return Ok(Some(self.hand_out(f, buf)));
            }
            let Some(m) = self.inner.recv_meta(buf)? else {
                return Ok(None);
            };
            if m.csum != RxCsum::Partial && m.gso_size.is_none() {
                return Ok(Some(m.len));
            }
            let mut scratch = std::mem::take(&mut self.scratch);
            let _ = segment_tcp4(&buf[..m.len], m.gso_size, &mut scratch, |piece| {
                let copy = self.copy_of(piece);
                self.wire.push_back(copy);
                Ok(())
            });
            self.scratch = scratch;
        }
    }

    /// Sends a held TX frame, if any. A failure loses it, like a frame lost on the wire.
    fn release_tx(&mut self) {
        if let Some(held) = self.held_tx.take() {
            if let Err(e) = self.inner.send(&held) {
                tracing::trace!(error = %e, "held frame lost");
            }
            self.pool.push(held);
        }
    }
}

impl<L: Link> Link for Faults<L> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn mtu(&self) -> usize {
        self.inner.mtu()
    }

    fn max_frame_len(&self) -> usize {
        self.inner.max_frame_len()
    }

    fn tcp_offload(&self) -> bool {
        self.inner.tcp_offload()
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        self.release_tx();
        loop {
            if let Some(f) = self.ready.pop_front() {
                return Ok(Some(self.hand_out(f, buf)));
            }
            let Some(n) = self.next_inner(buf)? else {
                if let Some(h) = self.held_rx.take() {
                    self.ready.push_back(h);
                    continue;
                }
                return Ok(None);
            };
            let cfg = self.rx;
            if self.hit(cfg.drop) {
                self.rx_stats.dropped += 1;
                continue;
            }
            if self.hit(cfg.corrupt) && self.corrupt(Direction::Rx, &mut buf[..n], cfg.corrupt_from)
            {
                self.rx_stats.corrupted += 1;
            }
            if self.held_rx.is_none() && self.hit(cfg.reorder) {
                self.held_rx = Some(self.copy_of(&buf[..n]));
                self.rx_stats.reordered += 1;
                continue;
            }
            if self.hit(cfg.duplicate) {
                let dup = self.copy_of(&buf[..n]);
                self.ready.push_back(dup);
                self.rx_stats.duplicated += 1;
            }
            if let Some(h) = self.held_rx.take() {
                self.ready.push_back(h);
            }
            self.rx_stats.passed += 1;
            return Ok(Some(n));
        }
    }

    fn send(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        let max = self.inner.max_frame_len();
        if frame.len() > max {
            return Err(LinkError::FrameTooLarge {
                len: frame.len(),
                max,
            });
        }
        let cfg = self.tx;
        if self.hit(cfg.drop) {
            self.tx_stats.dropped += 1;
            return Ok(());
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut out = frame;
        if self.hit(cfg.corrupt) {
            scratch.clear();
            scratch.extend_from_slice(frame);
            if self.corrupt(Direction::Tx, &mut scratch, cfg.corrupt_from) {
                self.tx_stats.corrupted += 1;
                out = &scratch;
            }
        }
        let result = if self.held_tx.is_none() && self.hit(cfg.reorder) {
            self.held_tx = Some(self.copy_of(out));
            self.tx_stats.reordered += 1;
            Ok(())
        } else {
            let mut r = self.inner.send(out);
            if r.is_ok() {
                self.tx_stats.passed += 1;
                if self.hit(cfg.duplicate) {
                    self.tx_stats.duplicated += 1;
                    r = self.inner.send(out);
                }
            }
            self.release_tx();
            r
        };
        self.scratch = scratch;
        result
    }

    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.inner.poll_fd()
    }

    fn poll_event(&mut self) -> Option<LinkEvent> {
        self.release_tx();
        self.inner.poll_event()
    }

    fn state(&self) -> LinkEvent {
        self.inner.state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::{MemoryConfig, MemoryLink};

    fn frame(seq: u16) -> Vec<u8> {
        let mut f = vec![0u8; 64];
        f[12] = 0x88;
        f[13] = 0xb5;
        f[14..16].copy_from_slice(&seq.to_be_bytes());
        f
    }

    fn drain(l: &mut impl Link) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; l.max_frame_len()];
        let mut out = Vec::new();
        while let Some(n) = l.recv(&mut buf).unwrap() {
            out.push(buf[..n].to_vec());
        }
        out
    }

    fn seq(f: &[u8]) -> u16 {
        u16::from_be_bytes([f[14], f[15]])
    }

    #[test]
    fn rejects_bad_probabilities() {
        let (a, _b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let bad = FaultConfig {
            drop: f64::NAN,
            ..Default::default()
        };
        assert!(matches!(
            Faults::new(a, 1, bad, FaultConfig::none()),
            Err(LinkError::Config(_))
        ));
        let (a, _b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let bad = FaultConfig {
            reorder: 1.5,
            ..Default::default()
        };
        assert!(Faults::new(a, 1, FaultConfig::none(), bad).is_err());
    }

    #[test]
    fn certain_faults_do_exactly_that() {
        // drop = 1 on TX: nothing arrives.
        let (a, mut b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let all_drop = FaultConfig {
            drop: 1.0,
            ..Default::default()
        };
        let mut f = Faults::new(a, 7, all_drop, FaultConfig::none()).unwrap();
        for i in 0..10 {
            f.send(&frame(i)).unwrap();
        }
        assert!(drain(&mut b).is_empty());
        assert_eq!(f.stats(Direction::Tx).dropped, 10);

        // duplicate = 1 on RX: every frame twice, in order.
        let (mut a, b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let dup = FaultConfig {
            duplicate: 1.0,
            ..Default::default()
        };
        let mut f = Faults::new(b, 7, FaultConfig::none(), dup).unwrap();
        for i in 0..3 {
            a.send(&frame(i)).unwrap();
        }
        let got: Vec<u16> = drain(&mut f).iter().map(|x| seq(x)).collect();
        assert_eq!(got, [0, 0, 1, 1, 2, 2]);

        // reorder = 1 on RX: pairs swapped; a lone last frame still comes out.
        let (mut a, b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let re = FaultConfig {
            reorder: 1.0,
            ..Default::default()
        };
        let mut f = Faults::new(b, 7, FaultConfig::none(), re).unwrap();
        for i in 0..5 {
            a.send(&frame(i)).unwrap();
        }
        let got: Vec<u16> = drain(&mut f).iter().map(|x| seq(x)).collect();
        assert_eq!(got, [1, 0, 3, 2, 4]);

        // reorder = 1 on TX: the held frame follows the next one, the last at next recv.
        let (a, mut b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let mut f = Faults::new(a, 7, re, FaultConfig::none()).unwrap();
        for i in 0..3 {
            f.send(&frame(i)).unwrap();
        }
        let got: Vec<u16> = drain(&mut b).iter().map(|x| seq(x)).collect();
        assert_eq!(got, [1, 0]);
        assert_eq!(f.recv(&mut [0u8; 64]).unwrap(), None);
        let got: Vec<u16> = drain(&mut b).iter().map(|x| seq(x)).collect();
        assert_eq!(got, [2]);

        // corrupt = 1 from offset 16: exactly one byte past the sequence number differs.
        let (mut a, b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let cor = FaultConfig {
            corrupt: 1.0,
            corrupt_from: 16,
            ..Default::default()
        };
        let mut f = Faults::new(b, 7, FaultConfig::none(), cor).unwrap();
        f.record_corruptions(true);
        for i in 0..20 {
            a.send(&frame(i)).unwrap();
        }
        let got = drain(&mut f);
        let recs = f.take_corruptions();
        assert_eq!(got.len(), 20);
        assert_eq!(recs.len(), 20);
        for (i, (g, r)) in got.iter().zip(&recs).enumerate() {
            let orig = frame(i as u16);
            let diffs: Vec<usize> = (0..64).filter(|&k| g[k] != orig[k]).collect();
            assert_eq!(diffs, [r.offset]);
            assert!(r.offset >= 16);
            assert_eq!(g[r.offset] ^ orig[r.offset], r.xor);
            assert_eq!(&r.frame, g);
            assert_eq!(r.direction, Direction::Rx);
        }
    }

    #[test]
    fn same_seed_same_faults() {
        let run = |seed: u64| {
            let (mut a, b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
            let cfg = FaultConfig {
                drop: 0.1,
                duplicate: 0.1,
                reorder: 0.1,
                corrupt: 0.1,
                corrupt_from: 14,
            };
            let mut f = Faults::new(b, seed, FaultConfig::none(), cfg).unwrap();
            let mut out = Vec::new();
            for i in 0..500 {
                a.send(&frame(i)).unwrap();
                if i % 7 == 0 {
                    out.extend(drain(&mut f));
                }
            }
            out.extend(drain(&mut f));
            (out, f.stats(Direction::Rx))
        };
        let (x, sx) = run(42);
        let (y, sy) = run(42);
        let (z, _) = run(43);
        assert_eq!(x, y);
        assert_eq!(sx, sy);
        assert_ne!(x, z);
        // Every frame is accounted for: a frame is passed, dropped or held (reordered);
        // what comes out is the passed and held frames plus the duplicates.
        assert_eq!(sx.passed + sx.dropped + sx.reordered, 500);
        assert_eq!(x.len() as u64, sx.passed + sx.duplicated + sx.reordered);
        // Roughly 10% each (binomial, n = 500: far outside 3 sigma would be < 25 or > 75).
        for n in [sx.dropped, sx.duplicated, sx.reordered, sx.corrupted] {
            assert!((25..=75).contains(&n), "{sx:?}");
        }
    }
}
