//! Pcap middleware: every frame of both directions into a legacy pcap file.
//!
//! Format: the classic libpcap file format (draft-ietf-opsawg-pcap): a 24-byte global
//! header (magic `0xa1b2c3d4` written little-endian, so readers see microsecond
//! timestamps; version 2.4; snaplen [`PCAP_SNAPLEN`]; link type [`PCAP_LINKTYPE_ETHERNET`])
//! then, per frame, a 16-byte record header (seconds, microseconds, captured length,
//! original length, all little-endian u32) and the frame bytes. Wireshark, tcpdump and
//! `iwdump` (via `pcap-parser`) read it.
//!
//! A frame is recorded when `recv` returns it or when `send` accepted it, in the order the
//! wrapped link sees them; stacked over [`Faults`](super::Faults), the file shows the
//! frames after fault injection on the receive side and before it on the send side, and
//! the other way round when stacked under it. A write error disables the capture (logged
//! once at `warn`) but never fails the link.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{segment_tcp4, Link, LinkError, LinkEvent, RxCsum, RxMeta};

/// Pcap link type for Ethernet II frames (`LINKTYPE_ETHERNET`, tcpdump.org link-layer
/// header types).
pub const PCAP_LINKTYPE_ETHERNET: u32 = 1;

/// Snapshot length in bytes written in the global header: 262144, tcpdump's default;
/// larger than any frame a link carries (65535 + 14), so frames are never cut.
pub const PCAP_SNAPLEN: u32 = 262_144;

/// Wall clock for record timestamps: time since the Unix epoch (microseconds are kept).
pub type PcapClock = Box<dyn FnMut() -> Duration + Send>;

fn system_clock() -> PcapClock {
    Box::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    })
}

/// A [`Link`] wrapper that writes every frame to a pcap stream. See the
/// [module docs](self).
pub struct Pcap<L, W: Write + Send = BufWriter<File>> {
    inner: L,
    out: Option<W>,
    clock: PcapClock,
    frames: u64,
    /// Segments of an offloaded frame being recorded.
    scratch: Vec<u8>,
}

impl<L, W: Write + Send> std::fmt::Debug for Pcap<L, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pcap")
            .field("writing", &self.out.is_some())
            .field("frames", &self.frames)
            .finish()
    }
}

impl<L: Link> Pcap<L> {
    /// Wraps `inner`, writing to a new file at `path` (truncated if it exists) through a
    /// 64 KiB buffer, with wall-clock timestamps. Call [`Pcap::flush`] to see frames in
    /// the file before the wrapper is dropped (dropping flushes).
    ///
    /// Errors: [`LinkError::Io`] if the file cannot be created or the header written.
    pub fn create(inner: L, path: impl AsRef<Path>) -> Result<Self, LinkError> {
        let file = File::create(path.as_ref()).map_err(|e| LinkError::io("create pcap file", e))?;
        Pcap::with_writer(
            inner,
            BufWriter::with_capacity(64 * 1024, file),
            system_clock(),
        )
    }
}

impl<L: Link, W: Write + Send> Pcap<L, W> {
    /// Wraps `inner`, writing the pcap global header now and a record per frame to `out`,
    /// stamped by `clock`.
    ///
    /// Errors: [`LinkError::Io`] if the global header cannot be written.
    pub fn with_writer(inner: L, mut out: W, clock: PcapClock) -> Result<Self, LinkError> {
        out.write_all(&global_header())
            .map_err(|e| LinkError::io("write pcap header", e))?;
        Ok(Pcap {
            inner,
            out: Some(out),
            clock,
            frames: 0,
            scratch: Vec::new(),
        })
    }

    /// Flushes buffered records to the writer.
    ///
    /// Errors: [`LinkError::Io`] if the writer fails (the capture is then disabled).
    pub fn flush(&mut self) -> Result<(), LinkError> {
        if let Some(out) = self.out.as_mut() {
            if let Err(e) = out.flush() {
                self.out = None;
                return Err(LinkError::io("flush pcap", e));
            }
        }
        Ok(())
    }

    /// Frames written so far.
    pub fn frames_written(&self) -> u64 {
        self.frames
    }

    /// The wrapped link.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped link, mutably.
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    /// Unwraps into the link and the writer (`None` if a write error disabled it). The
    /// writer is not flushed.
    pub fn into_parts(self) -> (L, Option<W>) {
        (self.inner, self.out)
    }

    /// Records an offloaded TCP frame as the wire carries it: cut into segments of
    /// `gso_size` payload bytes with complete checksums ([`segment_tcp4`]).
    fn record_wire(&mut self, frame: &[u8], gso_size: Option<u16>) {
        let mut scratch = std::mem::take(&mut self.scratch);
        let _ = segment_tcp4(frame, gso_size, &mut scratch, |piece| {
            self.record(piece);
            Ok(())
        });
        self.scratch = scratch;
    }

    fn record(&mut self, frame: &[u8]) {
        let Some(out) = self.out.as_mut() else {
            return;
        };
        let ts = (self.clock)();
        let hdr = record_header(ts, frame.len());
        let res = out.write_all(&hdr).and_then(|()| out.write_all(frame));
        match res {
            Ok(()) => self.frames += 1,
            Err(e) => {
                tracing::warn!(link = self.inner.name(), error = %e, "pcap write failed; capture disabled");
                self.out = None;
            }
        }
    }
}

/// The 24-byte pcap global header (little-endian, microsecond magic).
fn global_header() -> [u8; 24] {
    let mut h = [0u8; 24];
    h[0..4].copy_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    h[4..6].copy_from_slice(&2u16.to_le_bytes());
    h[6..8].copy_from_slice(&4u16.to_le_bytes());
    // thiszone (i32) and sigfigs (u32) stay 0.
    h[16..20].copy_from_slice(&PCAP_SNAPLEN.to_le_bytes());
    h[20..24].copy_from_slice(&PCAP_LINKTYPE_ETHERNET.to_le_bytes());
    h
}

/// The 16-byte record header for a frame of `len` bytes captured at `ts` since the epoch.
/// Seconds saturate at `u32::MAX` (year 2106).
fn record_header(ts: Duration, len: usize) -> [u8; 16] {
    let secs = u32::try_from(ts.as_secs()).unwrap_or(u32::MAX);
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&secs.to_le_bytes());
    h[4..8].copy_from_slice(&ts.subsec_micros().to_le_bytes());
    h[8..12].copy_from_slice(&len.to_le_bytes());
    h[12..16].copy_from_slice(&len.to_le_bytes());
    h
}

impl<L: Link, W: Write + Send> Link for Pcap<L, W> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn mtu(&self) -> usize {
        self.inner.mtu()
    }

    fn max_frame_len(&self) -> usize {
        self.inner.max_frame_len()
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        Ok(self.recv_meta(buf)?.map(|m| m.len))
    }

    fn send(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        self.inner.send(frame)?;
        self.record(frame);
        Ok(())
    }

    fn tcp_offload(&self) -> bool {
        self.inner.tcp_offload()
    }

    fn recv_meta(&mut self, buf: &mut [u8]) -> Result<Option<RxMeta>, LinkError> {
        let got = self.inner.recv_meta(buf)?;
        if let Some(m) = got {
            if m.csum == RxCsum::Partial || m.gso_size.is_some() {
                self.record_wire(&buf[..m.len], m.gso_size);
            } else {
                self.record(&buf[..m.len]);
            }
        }
        Ok(got)
    }

    fn send_tcp_offload(
        &mut self,
        frame: &mut [u8],
        gso_size: Option<u16>,
    ) -> Result<(), LinkError> {
        // Recorded first: the link may change the frame (its partial checksum).
        let capture = self.out.is_some().then(|| frame.to_vec());
        self.inner.send_tcp_offload(frame, gso_size)?;
        if let Some(c) = capture {
            self.record_wire(&c, gso_size);
        }
        Ok(())
    }

    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.inner.poll_fd()
    }

    fn poll_event(&mut self) -> Option<LinkEvent> {
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

    fn fixed_clock() -> PcapClock {
        let mut t = Duration::new(1_700_000_000, 123_456_000);
        Box::new(move || {
            let now = t;
            t += Duration::from_micros(1_000_001);
            now
        })
    }

    #[test]
    fn golden_bytes() {
        let (a, mut b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let mut p = Pcap::with_writer(a, Vec::new(), fixed_clock()).unwrap();
        let frame: Vec<u8> = (0u8..20).collect();
        p.send(&frame).unwrap();
        b.send(&[0xee; 14]).unwrap();
        let mut buf = [0u8; 1514];
        assert_eq!(p.recv(&mut buf).unwrap(), Some(14));
        assert_eq!(p.recv(&mut buf).unwrap(), None);
        assert_eq!(p.frames_written(), 2);
        let (_, out) = p.into_parts();
        let out = out.unwrap();
        let mut want = vec![
            0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x04, 0x00, 1,
            0, 0, 0,
        ];
        // 1_700_000_000 = 0x6553f100, 123456 us = 0x0001e240, len 20
        want.extend_from_slice(&[0x00, 0xf1, 0x53, 0x65, 0x40, 0xe2, 0x01, 0x00]);
        want.extend_from_slice(&[20, 0, 0, 0, 20, 0, 0, 0]);
        want.extend_from_slice(&frame);
        // + 1.000001 s: 1_700_000_001 s, 123457 us, len 14
        want.extend_from_slice(&[0x01, 0xf1, 0x53, 0x65, 0x41, 0xe2, 0x01, 0x00]);
        want.extend_from_slice(&[14, 0, 0, 0, 14, 0, 0, 0]);
        want.extend_from_slice(&[0xee; 14]);
        assert_eq!(out, want);
    }

    #[test]
    fn file_parses_with_pcap_parser() {
        use pcap_parser::traits::PcapReaderIterator;
        use pcap_parser::{LegacyPcapReader, PcapBlockOwned, PcapError};

        let dir = std::env::temp_dir().join(format!("sw-pcap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.pcap");
        let (a, mut b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let mut p = Pcap::create(a, &path).unwrap();
        let sizes = [60usize, 1514, 200];
        for (i, &n) in sizes.iter().enumerate() {
            p.send(&vec![i as u8; n]).unwrap();
        }
        let mut buf = [0u8; 1514];
        while b.recv(&mut buf).unwrap().is_some() {}
        drop(p); // flushes

        let file = File::open(&path).unwrap();
        let mut reader = LegacyPcapReader::new(65536, file).unwrap();
        let mut lens = Vec::new();
        let mut linktype = None;
        loop {
            match reader.next() {
                Ok((off, block)) => {
                    match block {
                        PcapBlockOwned::LegacyHeader(h) => {
                            linktype = Some(h.network.0);
                            assert_eq!(h.version_major, 2);
                            assert_eq!(h.version_minor, 4);
                            assert_eq!(h.snaplen, PCAP_SNAPLEN);
                        }
                        PcapBlockOwned::Legacy(b) => {
                            assert_eq!(b.caplen, b.origlen);
                            assert!(b.data.iter().all(|&x| x == lens.len() as u8));
                            lens.push(b.caplen as usize);
                        }
                        PcapBlockOwned::NG(_) => panic!("not pcapng"),
                    }
                    reader.consume(off);
                }
                Err(PcapError::Eof) => break,
                Err(PcapError::Incomplete(_)) => reader.refill().unwrap(),
                Err(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(linktype, Some(1));
        assert_eq!(lens, sizes);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
