//! FPDU framing (RFC 5044, section 4 "MPA Full Operation Phase").
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |          ULPDU_Length         |                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+                               +
//! ~                             ULPDU                             ~
//! |                               +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                               |          PAD (0-3 octets)     |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                              CRC                              |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! * ULPDU_Length (16 bits, big endian): octets of ULPDU, not counting the
//!   length field, PAD, CRC or Markers (section 4.1).
//! * PAD: 0-3 zero octets so that `(2 + ULPDU_Length + PAD) % 4 == 0`.
//! * CRC: CRC32c over everything of the FPDU before the CRC field (length,
//!   ULPDU, PAD and the Markers in the FPDU), least significant octet first
//!   (see [`crate::crc`]); all zero when CRC was not negotiated (the field is
//!   always there).
//!
//! **Markers** (section 4.2 "Marker Format", 4.3 "MPA Markers"), when
//! negotiated for a direction: a 4-octet Marker (`u16` reserved = 0, `u16`
//! FPDUPTR, big endian) sits at every TCP stream position `P` with
//! `(P - SeqStart) % 512 == 0`, where `SeqStart` is the sequence number of
//! the first octet of the first FPDU of full operation (the octet right behind
//! the MPA Request or Reply of that direction). So the first Marker
//! immediately precedes the first FPDU, and Markers are part of TCP sequence
//! space. This crate counts *stream positions* in octets since `SeqStart`;
//! Markers therefore sit at positions `0, 512, 1024, ...`. Positions are `u64`
//! and wrap modulo 2^64 (a [`Framer`] or
//! [`crate::deframer::Deframer`] resumed near `u64::MAX` keeps going); since
//! 2^64 is a multiple of 512, wrapping does not move a Marker.
//!
//! Which FPDU a Marker belongs to, and what its FPDUPTR holds:
//! * a Marker at the position where an FPDU begins is that FPDU's first four
//!   octets (a *leading* Marker, as the very first Marker is); its FPDUPTR is 0;
//! * any other Marker inside an FPDU (in the ULPDU, in the PAD or right before
//!   the CRC field) has FPDUPTR = the number of octets from the first octet of
//!   the FPDU's ULPDU_Length field to the first octet of the Marker;
//! * a Marker right behind an FPDU's CRC field is the next FPDU's leading Marker.
//!
//! All Markers of an FPDU, a leading one included, are covered by its CRC. A
//! receiver treats the two low bits of FPDUPTR as zero (section 4.2). Since
//! FPDUs are multiples of 4 octets long, FPDUs and Markers are 4-aligned
//! relative to `SeqStart`, and a Marker never splits a field.
//!
//! **MULPDU** (section 4.5 "FPDU Size Considerations"): the largest ULPDU that
//! fits in one TCP segment of EMSS octets (EMSS: the MSS less TCP options),
//! see [`mulpdu`].

use thiserror::Error;

use crate::crc::{crc32c_append, crc_to_wire, CRC_LEN};

/// Length of the ULPDU_Length field, in octets.
pub const ULPDU_LENGTH_LEN: usize = 2;
/// Length of an MPA Marker, in octets (RFC 5044, section 4.2).
pub const MARKER_LEN: usize = 4;
/// Distance between two Markers, in octets of TCP sequence space (RFC 5044, section 4.3).
pub const MARKER_INTERVAL: u64 = 512;
/// Largest ULPDU_Length, in octets.
pub const MAX_ULPDU_LEN: usize = u16::MAX as usize;
/// Octets of FPDU content between two Markers (`512 - 4`).
const MARKER_PAYLOAD: usize = MARKER_INTERVAL as usize - MARKER_LEN;

/// The framing options of one direction of a connection, as negotiated
/// (see [`crate::negotiate::Agreed::tx_framing`] / `rx_framing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Framing {
    /// CRC32c in the CRC field (else the field is zero).
    pub crc: bool,
    /// Markers every 512 octets of the stream.
    pub markers: bool,
}

/// A 4-octet MPA Marker (RFC 5044, section 4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Marker {
    /// Reserved; zero on transmit, ignored on receive (except by the CRC).
    pub reserved: u16,
    /// Octets from the first octet of the ULPDU_Length field of the FPDU the
    /// Marker is in to the first octet of the Marker; 0 for a Marker right in
    /// front of an FPDU.
    pub fpduptr: u16,
}

impl Marker {
    /// Parses the four wire octets (big endian fields).
    pub fn from_bytes(bytes: [u8; MARKER_LEN]) -> Marker {
        Marker {
            reserved: u16::from_be_bytes([bytes[0], bytes[1]]),
            fpduptr: u16::from_be_bytes([bytes[2], bytes[3]]),
        }
    }

    /// The four wire octets.
    pub fn to_bytes(self) -> [u8; MARKER_LEN] {
        let [r0, r1] = self.reserved.to_be_bytes();
        let [f0, f1] = self.fpduptr.to_be_bytes();
        [r0, r1, f0, f1]
    }
}

/// Octets of PAD behind a ULPDU of `ulpdu_len` octets: 0-3, such that
/// `(2 + ulpdu_len + pad) % 4 == 0` (RFC 5044, section 4.1).
pub fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (ULPDU_LENGTH_LEN + ulpdu_len) % 4) % 4
}

/// Octets of an FPDU without Markers: ULPDU_Length field, ULPDU, PAD, CRC.
pub fn unmarked_len(ulpdu_len: usize) -> usize {
    ULPDU_LENGTH_LEN + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

/// Number of Markers inside an FPDU of `unmarked_len` octets (see
/// [`unmarked_len`]) that starts at `stream_pos` (octets of sequence space
/// since `SeqStart`, see the module documentation), when Markers are on.
///
/// A Marker at `stream_pos` itself counts (leading Marker); one right behind
/// the FPDU does not.
pub fn markers_in(unmarked_len: usize, stream_pos: u64) -> usize {
    // Octets of FPDU content that fit before the next Marker position.
    let room = ((MARKER_INTERVAL - stream_pos % MARKER_INTERVAL) % MARKER_INTERVAL) as usize;
    if unmarked_len <= room {
        0
    } else {
        (unmarked_len - room).div_ceil(MARKER_PAYLOAD)
    }
}

/// Total octets on the wire of an FPDU carrying `ulpdu_len` octets of ULPDU
/// and starting at `stream_pos` (octets since `SeqStart`): ULPDU_Length,
/// ULPDU, PAD, CRC and, if `markers`, the Markers inside it (RFC 5044,
/// sections 4.1 and 4.3). `stream_pos` is ignored without Markers.
pub fn fpdu_len(ulpdu_len: usize, markers: bool, stream_pos: u64) -> usize {
    let len = unmarked_len(ulpdu_len);
    if markers {
        len + MARKER_LEN * markers_in(len, stream_pos)
    } else {
        len
    }
}

/// MULPDU: the largest ULPDU, in octets, whose FPDU fits in a TCP segment of
/// `emss` octets (the effective MSS: MSS less TCP options), wherever the
/// segment starts in the stream (RFC 5044, section 4.5):
///
/// * with Markers: `EMSS - (6 + 4 * ceil(EMSS / 512) + EMSS % 4)`;
/// * without: `EMSS - (6 + EMSS % 4)`.
///
/// Example: the captures in `shared/pcaps` (MSS 1460, 12 octets of TCP
/// timestamps, EMSS 1448, no Markers) carry ULPDUs of 1442 octets. Saturates
/// at 0 for an absurdly small `emss`.
pub fn mulpdu(emss: usize, markers: bool) -> usize {
    let overhead = ULPDU_LENGTH_LEN + CRC_LEN + emss % 4;
    let overhead = if markers {
        overhead + MARKER_LEN * emss.div_ceil(MARKER_INTERVAL as usize)
    } else {
        overhead
    };
    emss.saturating_sub(overhead)
}

/// The largest FPDUPTR (octets from the ULPDU_Length field to the Marker) of
/// the Markers inside an FPDU of `fpdu_len` octets (Markers included, see
/// [`fpdu_len`]) that starts at `stream_pos` (octets since `SeqStart`), when
/// Markers are on; `None` when the FPDU holds no Marker besides a leading
/// one (whose FPDUPTR is 0). RFC 5044, section 4.2: FPDUPTR is a 16-bit field,
/// so an FPDU can be sent with Markers only if this is at most 65535.
pub fn max_fpduptr(fpdu_len: usize, stream_pos: u64) -> Option<u64> {
    if fpdu_len == 0 {
        return None;
    }
    // Positions relative to the 512-octet interval the FPDU starts in: 2^64 is
    // a multiple of 512, so this is right for every `stream_pos`.
    let start = stream_pos % MARKER_INTERVAL;
    let header = if start == 0 { MARKER_LEN as u64 } else { start };
    let end = start + fpdu_len as u64;
    let last_marker = (end - 1) / MARKER_INTERVAL * MARKER_INTERVAL;
    (last_marker >= header).then(|| last_marker - header)
}

/// Why an FPDU could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    /// The ULPDU is empty or longer than 65535 octets.
    #[error("ULPDU of {len} octets: ULPDU_Length must be 1..=65535")]
    UlpduLength {
        /// The ULPDU length, in octets.
        len: usize,
    },
    /// The FPDU does not fit in the caller's buffer.
    #[error("buffer too small: the FPDU needs {needed} octets, {available} available")]
    BufferTooSmall {
        /// FPDU length, in octets.
        needed: usize,
        /// Buffer length, in octets.
        available: usize,
    },
    /// With Markers, a Marker inside the FPDU would lie more than 65535
    /// octets past the FPDU's ULPDU_Length field, so its FPDUPTR would not fit
    /// in 16 bits (RFC 5044, section 4.2). Which ULPDUs this hits depends on
    /// where the FPDU starts: e.g. at stream position 4 a ULPDU of 65526
    /// octets (FPDU of 66044 octets, last FPDUPTR 65532) is framed and one of
    /// 65527 octets (last FPDUPTR 66044) is refused; see [`max_fpduptr`].
    #[error("FPDU of {len} octets is too long for 16-bit FPDUPTR values")]
    TooLongForMarkers {
        /// FPDU length, in octets.
        len: usize,
    },
}

/// Builds FPDUs for one direction of a connection, keeping the stream
/// position so Markers land where RFC 5044 section 4.3 puts them.
///
/// Create it when the MPA Request/Reply of the direction has been sent (stream
/// position 0 is the first octet of the first FPDU); every FPDU built must
/// then really be sent, in order. The CRC is computed right after the
/// copy, in one pass over the FPDU just written, while it is hot in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Framer {
    framing: Framing,
    stream_pos: u64,
}

impl Framer {
    /// A framer for a direction with `framing`, at stream position 0.
    pub fn new(framing: Framing) -> Framer {
        Framer::with_stream_pos(framing, 0)
    }

    /// A framer at `stream_pos` octets of sequence space since `SeqStart`
    /// (for resuming; FPDUs keep positions 4-aligned, so this should be too).
    /// Any value works, `u64::MAX - 3` included: positions wrap modulo 2^64.
    pub fn with_stream_pos(framing: Framing, stream_pos: u64) -> Framer {
        Framer {
            framing,
            stream_pos,
        }
    }

    /// The framing options.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// Stream position of the next FPDU, in octets since `SeqStart` (modulo 2^64).
    pub fn stream_pos(&self) -> u64 {
        self.stream_pos
    }

    /// Octets on the wire of the next FPDU if it carries `ulpdu_len` octets
    /// of ULPDU (see [`fpdu_len`]).
    pub fn next_fpdu_len(&self, ulpdu_len: usize) -> usize {
        fpdu_len(ulpdu_len, self.framing.markers, self.stream_pos)
    }

    /// Appends the FPDU carrying `ulpdu` to `out`; returns its length in octets.
    ///
    /// Errors: [`FrameError::UlpduLength`], [`FrameError::TooLongForMarkers`];
    /// `out` and the stream position are unchanged on error.
    pub fn append(&mut self, ulpdu: &[u8], out: &mut Vec<u8>) -> Result<usize, FrameError> {
        self.append_parts(&[ulpdu], out)
    }

    /// Appends the FPDU whose ULPDU is the concatenation of `parts` (e.g. a
    /// DDP/RDMAP header and a payload) to `out`; returns its length in octets.
    ///
    /// Errors: as [`Framer::append`].
    pub fn append_parts(
        &mut self,
        parts: &[&[u8]],
        out: &mut Vec<u8>,
    ) -> Result<usize, FrameError> {
        let ulpdu_len = check_ulpdu_len(parts)?;
        let len = self.next_fpdu_len(ulpdu_len);
        let start = out.len();
        out.resize(start + len, 0);
        match self.write_parts(parts, &mut out[start..]) {
            Ok(written) => Ok(written),
            Err(e) => {
                out.truncate(start);
                Err(e)
            }
        }
    }

    /// Writes the FPDU carrying `ulpdu` at the start of `buf` (e.g. straight
    /// into a TCP send buffer); returns its length in octets.
    ///
    /// Errors: [`FrameError::UlpduLength`], [`FrameError::BufferTooSmall`]
    /// (see [`Framer::next_fpdu_len`]), [`FrameError::TooLongForMarkers`];
    /// the stream position is unchanged on error.
    pub fn write(&mut self, ulpdu: &[u8], buf: &mut [u8]) -> Result<usize, FrameError> {
        self.write_parts(&[ulpdu], buf)
    }

    /// Writes the FPDU whose ULPDU is the concatenation of `parts` at the
    /// start of `buf`; returns its length in octets.
    ///
    /// Errors: as [`Framer::write`].
    pub fn write_parts(&mut self, parts: &[&[u8]], buf: &mut [u8]) -> Result<usize, FrameError> {
        let ulpdu_len = check_ulpdu_len(parts)?;
        let len = self.next_fpdu_len(ulpdu_len);
        if self.framing.markers
            && max_fpduptr(len, self.stream_pos).is_some_and(|p| p > u64::from(u16::MAX))
        {
            return Err(FrameError::TooLongForMarkers { len });
        }
        if buf.len() < len {
            return Err(FrameError::BufferTooSmall {
                needed: len,
                available: buf.len(),
            });
        }
        if !self.framing.markers {
            write_unmarked(parts, ulpdu_len, self.framing.crc, &mut buf[..len]);
            self.stream_pos = self.stream_pos.wrapping_add(len as u64);
            return Ok(len);
        }
        let mut w = Writer {
            buf: &mut buf[..len],
            at: 0,
            pos: self.stream_pos,
            fpdu_start: self.stream_pos,
            header_pos: None,
            markers: self.framing.markers,
        };
        // The ULPDU_Length field fits: checked above.
        w.put(&(ulpdu_len as u16).to_be_bytes());
        for part in parts {
            w.put(part);
        }
        w.put(&[0u8; 3][..pad_len(ulpdu_len)]);
        // A Marker right before the CRC field is covered by the CRC.
        w.marker_if_due();
        // Every octet before the CRC field is covered (Markers included): one CRC32c
        // pass over what was just written (hot in the cache) instead of one call per
        // piece, which costs much more for the short ULPDU_Length and header pieces.
        let crc = if self.framing.crc {
            crc32c_append(0, &w.buf[..w.at])
        } else {
            0
        };
        w.put(&crc_to_wire(crc));
        debug_assert_eq!(w.at, len);
        self.stream_pos = self.stream_pos.wrapping_add(len as u64);
        Ok(len)
    }
}

fn check_ulpdu_len(parts: &[&[u8]]) -> Result<usize, FrameError> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len == 0 || len > MAX_ULPDU_LEN {
        return Err(FrameError::UlpduLength { len });
    }
    Ok(len)
}

/// Writes an FPDU without Markers into `fpdu` (exactly its length: ULPDU_Length,
/// the `parts` of `ulpdu_len` octets, PAD, CRC): straight copies, then one CRC32c
/// pass over what was just written (hot in the cache).
fn write_unmarked(parts: &[&[u8]], ulpdu_len: usize, crc: bool, fpdu: &mut [u8]) {
    let (body, crc_field) = fpdu.split_at_mut(fpdu.len() - CRC_LEN);
    let (length, mut rest) = body.split_at_mut(ULPDU_LENGTH_LEN);
    // ULPDU_Length fits in 16 bits: checked by the caller.
    length.copy_from_slice(&(ulpdu_len as u16).to_be_bytes());
    for part in parts {
        let (dst, tail) = rest.split_at_mut(part.len());
        dst.copy_from_slice(part);
        rest = tail;
    }
    // What is left is the PAD.
    rest.fill(0);
    let value = if crc { crc32c_append(0, body) } else { 0 };
    crc_field.copy_from_slice(&crc_to_wire(value));
}

/// Copies FPDU content into a buffer, inserting Markers and keeping the CRC.
struct Writer<'b> {
    buf: &'b mut [u8],
    at: usize,
    pos: u64,
    fpdu_start: u64,
    header_pos: Option<u64>,
    markers: bool,
}

impl Writer<'_> {
    fn marker_if_due(&mut self) {
        if !self.markers || !self.pos.is_multiple_of(MARKER_INTERVAL) {
            return;
        }
        let fpduptr = match self.header_pos {
            // The caller checks `max_fpduptr`, so the distance fits.
            Some(header) => self.pos.wrapping_sub(header) as u16,
            None => {
                debug_assert_eq!(self.pos, self.fpdu_start);
                0
            }
        };
        let bytes = Marker {
            reserved: 0,
            fpduptr,
        }
        .to_bytes();
        self.copy(&bytes);
    }

    fn put(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            self.marker_if_due();
            if self.header_pos.is_none() {
                self.header_pos = Some(self.pos);
            }
            let n = if self.markers {
                let room = (MARKER_INTERVAL - self.pos % MARKER_INTERVAL) as usize;
                room.min(data.len())
            } else {
                data.len()
            };
            self.copy(&data[..n]);
            data = &data[n..];
        }
    }

    fn copy(&mut self, data: &[u8]) {
        let dst = &mut self.buf[self.at..self.at + data.len()];
        dst.copy_from_slice(data);
        self.at += data.len();
        self.pos = self.pos.wrapping_add(data.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crc::crc32c;
    use crate::test_vectors::*;

    const CRC: Framing = Framing {
        crc: true,
        markers: false,
    };
    const PLAIN: Framing = Framing {
        crc: false,
        markers: false,
    };
    const MARKED: Framing = Framing {
        crc: true,
        markers: true,
    };

    #[test]
    fn pad_and_lengths() {
        assert_eq!(
            (0..8).map(pad_len).collect::<Vec<_>>(),
            vec![2, 1, 0, 3, 2, 1, 0, 3]
        );
        assert_eq!(unmarked_len(14), 20);
        assert_eq!(unmarked_len(34), 40);
        assert_eq!(unmarked_len(1), 8);
        assert_eq!(fpdu_len(34, false, 12345), 40);
        assert_eq!(fpdu_len(1442, false, 0), 1448);
    }

    #[test]
    fn marker_counts() {
        // Leading Marker at position 0: 508 octets of content per Marker.
        assert_eq!(markers_in(8, 0), 1);
        assert_eq!(markers_in(508, 0), 1);
        assert_eq!(markers_in(509, 0), 2);
        // 492 octets of room before the Marker at 512.
        assert_eq!(markers_in(492, 20), 0);
        assert_eq!(markers_in(496, 20), 1);
        assert_eq!(markers_in(1008, 20), 2);
        assert_eq!(fpdu_len(10, true, 0), 20);
        assert_eq!(fpdu_len(1000, true, 20), 1016);
        assert_eq!(fpdu_len(506, true, 0), 520);
    }

    /// MULPDU (RFC 5044, section 4.5), and that the FPDU of a MULPDU-sized
    /// ULPDU fits EMSS at every 4-aligned stream position.
    #[test]
    fn mulpdu_formula() {
        assert_eq!(mulpdu(1448, false), 1442);
        assert_eq!(mulpdu(1448, true), 1448 - (6 + 4 * 3));
        assert_eq!(mulpdu(1460, false), 1454);
        assert_eq!(mulpdu(1461, false), 1454);
        assert_eq!(mulpdu(536, true), 536 - (6 + 8));
        assert_eq!(mulpdu(9000, true), 9000 - (6 + 4 * 18));
        assert_eq!(mulpdu(3, true), 0);
        for emss in [536usize, 1000, 1448, 1460, 4096, 8960] {
            let m = mulpdu(emss, true);
            for pos in (0..512u64).step_by(4) {
                assert!(fpdu_len(m, true, pos) <= emss, "emss {emss} pos {pos}");
            }
            assert!(fpdu_len(mulpdu(emss, false), false, 0) <= emss);
        }
    }

    /// The RTR of rping-srv_p2p-cli_p2p.pcap frame 10 (no CRC).
    #[test]
    fn construct() {
        let rtr = unhex(P2P_RTR_FPDU);
        let mut framer = Framer::new(PLAIN);
        let mut out = Vec::new();
        assert_eq!(framer.append(&rtr[2..16], &mut out), Ok(20));
        assert_eq!(out, rtr);
        assert_eq!(framer.stream_pos(), 20);
        // rping.pcap frame 10, written into a caller buffer.
        let send = unhex(RPING_FPDU_FRAME10);
        let mut buf = [0xeeu8; 64];
        assert_eq!(framer.write(&send[2..36], &mut buf), Ok(40));
        assert_eq!(&buf[..40], &send[..]);
        assert_eq!(&buf[40..], &[0xee; 24]);
        assert_eq!(framer.stream_pos(), 60);
    }

    /// Every FPDU of rping-srv_crc-cli_crc.pcap, rebuilt with CRC, in order.
    #[test]
    fn construct_with_crc_matches_capture() {
        for (stream, table) in [
            (unhex(CRC_INITIATOR_STREAM), CRC_INITIATOR_FPDUS),
            (unhex(CRC_RESPONDER_STREAM), CRC_RESPONDER_FPDUS),
        ] {
            let fpdus = &stream[24..];
            let mut framer = Framer::new(CRC);
            let mut out = Vec::new();
            for &(offset, len, wire_len, crc) in table {
                let start = offset as usize;
                let ulpdu = &fpdus[start + 2..start + 2 + usize::from(len)];
                // Split into a "header" and a "payload" part.
                let split = ulpdu.len().min(14);
                let n = framer
                    .append_parts(&[&ulpdu[..split], &ulpdu[split..]], &mut out)
                    .unwrap();
                assert_eq!(n, wire_len);
                assert_eq!(
                    &out[start + wire_len - 4..start + wire_len],
                    &crc.to_le_bytes()
                );
            }
            assert_eq!(out, fpdus);
        }
    }

    /// Markers, hand-checked: a leading Marker at 0, then Markers at 512 and
    /// 1024 inside the second FPDU (FPDUPTR 492 and 1004 from its header at 20).
    #[test]
    fn construct_with_markers() {
        let mut framer = Framer::new(MARKED);
        let mut out = Vec::new();
        let first: Vec<u8> = (1..=10).collect();
        assert_eq!(framer.append(&first, &mut out), Ok(20));
        let mut expected = vec![0, 0, 0, 0, 0, 10];
        expected.extend_from_slice(&first);
        // 2 + 10 octets: no PAD.
        let crc = crc32c(&expected);
        expected.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(out, expected);

        let second: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(framer.append(&second, &mut out), Ok(1016));
        let fpdu = &out[20..];
        assert_eq!(&fpdu[..2], &1000u16.to_be_bytes());
        assert_eq!(
            &fpdu[492..496],
            &[0, 0, 0x01, 0xec],
            "marker at 512, FPDUPTR 492"
        );
        assert_eq!(
            &fpdu[1004..1008],
            &[0, 0, 0x03, 0xec],
            "marker at 1024, FPDUPTR 1004"
        );
        let mut stripped = fpdu[..492].to_vec();
        stripped.extend_from_slice(&fpdu[496..1004]);
        stripped.extend_from_slice(&fpdu[1008..1012]);
        assert_eq!(&stripped[2..1002], &second[..]);
        assert_eq!(&stripped[1002..], &[0, 0], "pad");
        assert_eq!(
            &fpdu[1012..],
            &crc32c(&fpdu[..1012]).to_le_bytes(),
            "CRC covers the markers"
        );
        assert_eq!(framer.stream_pos(), 1036);
    }

    /// A Marker that lands right before the CRC field is inside the FPDU and
    /// covered by the CRC; one right behind the FPDU belongs to the next.
    #[test]
    fn marker_before_crc_and_after_fpdu() {
        let mut framer = Framer::new(MARKED);
        let mut out = Vec::new();
        assert_eq!(framer.append(&[7u8; 506], &mut out), Ok(520));
        assert_eq!(&out[..4], &[0, 0, 0, 0]);
        assert_eq!(&out[512..516], &[0, 0, 0x01, 0xfc], "FPDUPTR 508 = 512 - 4");
        assert_eq!(&out[516..520], &crc32c(&out[..516]).to_le_bytes());

        let mut framer = Framer::with_stream_pos(MARKED, 4);
        let mut out = Vec::new();
        // 2 + 502 + 0 + 4 = 508 octets: ends exactly at 512, no Marker inside.
        assert_eq!(framer.append(&[1u8; 502], &mut out), Ok(508));
        assert_eq!(framer.stream_pos(), 512);
        assert_eq!(framer.append(&[2u8; 2], &mut out), Ok(12));
        assert_eq!(
            &out[508..512],
            &[0, 0, 0, 0],
            "leading marker of the next FPDU"
        );
        assert_eq!(&out[512..514], &[0, 2]);
    }

    #[test]
    fn errors() {
        let mut framer = Framer::new(CRC);
        let mut out = vec![9u8];
        assert_eq!(
            framer.append(&[], &mut out),
            Err(FrameError::UlpduLength { len: 0 })
        );
        let big = vec![0u8; 65536];
        assert_eq!(
            framer.append(&big, &mut out),
            Err(FrameError::UlpduLength { len: 65536 })
        );
        assert_eq!(
            framer.append_parts(&[&big[..40000], &big[..30000]], &mut out),
            Err(FrameError::UlpduLength { len: 70000 })
        );
        let mut buf = [0u8; 39];
        assert_eq!(
            framer.write(&[0u8; 34], &mut buf),
            Err(FrameError::BufferTooSmall {
                needed: 40,
                available: 39
            })
        );
        let mut marked = Framer::new(MARKED);
        let mut out2 = Vec::new();
        assert_eq!(
            marked.append(&big[..65535], &mut out2),
            Err(FrameError::TooLongForMarkers {
                len: fpdu_len(65535, true, 0)
            })
        );
        assert!(out2.is_empty());
        assert_eq!(out, vec![9u8]);
        assert_eq!(framer.stream_pos(), 0);
        // The largest ULPDU without Markers.
        assert_eq!(framer.append(&big[..65535], &mut out), Ok(65544));
    }

    /// Stream positions wrap modulo 2^64 (no overflow panic): at
    /// `u64::MAX - 3` (= 508 mod 512) the Marker due at 2^64 (= 0) lands four
    /// octets into the FPDU, with FPDUPTR 4.
    #[test]
    fn stream_position_wraps_near_u64_max() {
        let start = u64::MAX - 3;
        let mut framer = Framer::with_stream_pos(MARKED, start);
        assert_eq!(framer.next_fpdu_len(6), 16);
        let mut out = Vec::new();
        assert_eq!(framer.append(b"abcdef", &mut out), Ok(16));
        assert_eq!(
            &out[..12],
            &[0, 6, b'a', b'b', 0, 0, 0, 4, b'c', b'd', b'e', b'f']
        );
        assert_eq!(&out[12..], &crc32c(&out[..12]).to_le_bytes());
        assert_eq!(framer.stream_pos(), 12);
        // The next FPDU is an ordinary one at position 12.
        assert_eq!(framer.append(b"g", &mut out), Ok(8));
        assert_eq!(framer.stream_pos(), 20);

        let mut framer = Framer::with_stream_pos(CRC, start);
        let mut out = Vec::new();
        assert_eq!(framer.append(b"abcdef", &mut out), Ok(12));
        assert_eq!(&out[..8], &[0, 6, b'a', b'b', b'c', b'd', b'e', b'f']);
        assert_eq!(framer.stream_pos(), 8);
        let mut framer = Framer::with_stream_pos(MARKED, u64::MAX);
        assert_eq!(framer.append(b"x", &mut out), Ok(12));
        assert_eq!(framer.stream_pos(), 11);
    }

    /// RFC 5044 4.2 only needs every FPDUPTR to fit in 16 bits: an FPDU longer
    /// than 65536 octets is fine when its last Marker is close enough to its
    /// header. From stream position 4 (header at 4, Markers at 512..=65536),
    /// a ULPDU of 65526 octets makes an FPDU of 66044 octets whose last
    /// FPDUPTR is 65536 - 4 = 65532; one more octet of ULPDU adds a Marker
    /// at 66048 (FPDUPTR 66044), which does not fit.
    #[test]
    fn long_marked_fpdu_with_representable_fpduptr() {
        assert_eq!(max_fpduptr(66044, 4), Some(65532));
        assert_eq!(max_fpduptr(66052, 4), Some(66044));
        assert_eq!(max_fpduptr(20, 0), None, "leading Marker only");
        assert_eq!(max_fpduptr(520, 0), Some(508));
        assert_eq!(max_fpduptr(508, 4), None, "ends right at 512");
        assert_eq!(max_fpduptr(512, 4), Some(508));
        assert_eq!(max_fpduptr(16, u64::MAX - 3), Some(4));
        assert_eq!(max_fpduptr(0, 7), None);

        let ulpdu: Vec<u8> = (0..65526u32).map(|i| (i % 253) as u8).collect();
        let mut framer = Framer::with_stream_pos(MARKED, 4);
        let mut out = Vec::new();
        assert_eq!(framer.append(&ulpdu, &mut out), Ok(66044));
        assert_eq!(framer.stream_pos(), 4 + 66044);
        // The Marker at 65536 is at out[65532..] and points back 65532 octets.
        assert_eq!(&out[65532..65536], &[0, 0, 0xff, 0xfc]);
        assert_eq!(&out[66040..], &crc32c(&out[..66040]).to_le_bytes());

        let mut framer = Framer::with_stream_pos(MARKED, 4);
        let mut out = Vec::new();
        assert_eq!(
            framer.append(&[0u8; 65527], &mut out),
            Err(FrameError::TooLongForMarkers { len: 66052 })
        );
        assert!(out.is_empty());
        assert_eq!(framer.stream_pos(), 4);
    }

    #[test]
    fn marker_bytes() {
        let m = Marker::from_bytes([0x00, 0x00, 0x01, 0xec]);
        assert_eq!(
            m,
            Marker {
                reserved: 0,
                fpduptr: 492
            }
        );
        assert_eq!(m.to_bytes(), [0, 0, 1, 0xec]);
    }
}
