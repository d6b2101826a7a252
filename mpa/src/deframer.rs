//! Streaming FPDU deframer (RFC 5044, sections 4 and 6).
//!
//! A [`Deframer`] is fed one direction of the TCP byte stream, from the first
//! octet behind the MPA Request/Reply (`SeqStart`, see [`crate::fpdu`]), in
//! chunks of any size (one octet at a time works). It strips and checks
//! Markers, checks the CRC when it is on, and yields one [`Fpdu`] per FPDU.
//!
//! Error policy:
//! * a bad CRC ([`DeframeError::BadCrc`]) is reported for that FPDU, and the
//!   deframer stays in sync (the ULPDU_Length field told where the FPDU
//!   ends): the caller decides whether to tear the connection down (an RDMA
//!   engine must: RFC 5044 section 8, LLP error 0x02) or to keep going (a
//!   dissector). With [`DeframerConfig::deliver_bad_crc`] such FPDUs are
//!   yielded as `Ok` with [`CrcStatus::Bad`] instead.
//! * a bad ULPDU_Length ([`DeframeError::BadUlpduLength`]) or a bad Marker
//!   ([`DeframeError::BadMarker`]) is fatal: framing is lost. The deframer is
//!   poisoned and returns the same error, consuming nothing, from then on.
//!
//! Whole FPDUs without Markers that sit in one input chunk are yielded
//! without copying; otherwise the ULPDU is gathered in an internal buffer that
//! is reused (no per-octet or per-FPDU allocation once it has grown).

use thiserror::Error;

use crate::crc::{crc32c_append, crc_from_wire, CRC_LEN};
use crate::fpdu::{
    pad_len, unmarked_len, Framing, Marker, MARKER_INTERVAL, MARKER_LEN, MAX_ULPDU_LEN,
};
use crate::LlpErrorCode;

/// Configuration of a [`Deframer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeframerConfig {
    /// CRC and Markers, as negotiated for this direction.
    pub framing: Framing,
    /// Largest accepted ULPDU_Length, in octets (default 65535). An engine
    /// sets its MULPDU-based receive limit here.
    pub max_ulpdu_len: u16,
    /// Stream position of the first octet fed, in octets of sequence space
    /// since `SeqStart` (default 0: feeding starts at the first FPDU). Any
    /// value works: positions wrap modulo 2^64, which moves no Marker (2^64 is
    /// a multiple of 512).
    pub stream_pos: u64,
    /// Added (modulo 2^64) to every reported offset (default 0). With `base` =
    /// the TCP sequence number of `SeqStart`, `(offset as u32)` is the
    /// sequence number of an FPDU's first octet.
    pub offset_base: u64,
    /// Yield FPDUs with a bad CRC as `Ok` with [`CrcStatus::Bad`] instead of
    /// as [`DeframeError::BadCrc`] (default `false`; a dissector wants `true`).
    pub deliver_bad_crc: bool,
}

impl DeframerConfig {
    /// The default configuration for `framing`.
    pub fn new(framing: Framing) -> DeframerConfig {
        DeframerConfig {
            framing,
            max_ulpdu_len: u16::MAX,
            stream_pos: 0,
            offset_base: 0,
            deliver_bad_crc: false,
        }
    }
}

/// The CRC check of one FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrcStatus {
    /// CRC on and correct; the CRC value.
    Good(u32),
    /// CRC on and wrong.
    Bad {
        /// The value in the CRC field (see [`crate::crc::crc_from_wire`]).
        received: u32,
        /// The CRC32c of the received FPDU.
        computed: u32,
    },
    /// CRC not negotiated; the field was not checked.
    Off,
}

/// One FPDU taken from the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fpdu<'a> {
    /// Stream offset of the FPDU's first octet (its leading Marker, if any):
    /// `offset_base` + octets since `SeqStart`, modulo 2^64.
    pub offset: u64,
    /// The ULPDU (DDP segment), without Markers and PAD.
    pub ulpdu: &'a [u8],
    /// The CRC check.
    pub crc: CrcStatus,
    /// Octets the FPDU took on the wire: ULPDU_Length, ULPDU, PAD, Markers, CRC.
    pub wire_len: usize,
}

/// What is wrong in the FPDU stream. Every variant carries the stream offset
/// (`offset_base` + octets since `SeqStart`, modulo 2^64) where it was found.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeframeError {
    /// The CRC field does not match the FPDU (not fatal).
    #[error("MPA CRC error in the FPDU at stream offset {offset}: received {received:#010x}, computed {computed:#010x}")]
    BadCrc {
        /// Offset of the FPDU's first octet.
        offset: u64,
        /// The value in the CRC field.
        received: u32,
        /// The CRC32c of the received FPDU.
        computed: u32,
        /// ULPDU_Length of the FPDU, in octets.
        ulpdu_len: u16,
        /// Octets the FPDU took on the wire.
        wire_len: usize,
    },
    /// ULPDU_Length is zero or over [`DeframerConfig::max_ulpdu_len`] (fatal).
    #[error("bad ULPDU_Length {len} in the FPDU at stream offset {offset} (allowed 1..={max})")]
    BadUlpduLength {
        /// Offset of the FPDU's first octet.
        offset: u64,
        /// The ULPDU_Length field.
        len: u16,
        /// The configured maximum.
        max: u16,
    },
    /// A Marker's FPDUPTR does not point at its FPDU (fatal).
    #[error("bad MPA Marker at stream offset {offset}: FPDUPTR {found}, expected {expected}")]
    BadMarker {
        /// Offset of the Marker's first octet.
        offset: u64,
        /// The FPDUPTR field.
        found: u16,
        /// The FPDUPTR the position of the FPDU calls for.
        expected: u64,
    },
}

impl DeframeError {
    /// Whether the error is fatal (framing lost, deframer poisoned).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, DeframeError::BadCrc { .. })
    }

    /// The stream offset the error refers to.
    pub fn offset(&self) -> u64 {
        match *self {
            DeframeError::BadCrc { offset, .. }
            | DeframeError::BadUlpduLength { offset, .. }
            | DeframeError::BadMarker { offset, .. } => offset,
        }
    }

    /// The LLP error code for a Terminate message (RFC 5044, section 8; Layer
    /// LLP, Error Type MPA): 0x02 MPA CRC error for a bad CRC, 0x03 "MPA
    /// Marker and ULPDU Length field mismatch" for a bad Marker or ULPDU_Length.
    pub fn llp_error_code(&self) -> LlpErrorCode {
        match self {
            DeframeError::BadCrc { .. } => LlpErrorCode::CrcError,
            DeframeError::BadUlpduLength { .. } | DeframeError::BadMarker { .. } => {
                LlpErrorCode::MarkerMismatch
            }
        }
    }
}

/// Where in the current FPDU the next non-Marker octet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Header,
    Ulpdu,
    Pad,
    Crc,
}

/// A streaming FPDU deframer for one direction of a connection. See the
/// module documentation.
#[derive(Debug, Clone)]
pub struct Deframer {
    cfg: DeframerConfig,
    /// Stream position of the next octet, octets since `SeqStart`.
    pos: u64,
    phase: Phase,
    /// Whether an octet (or Marker) of the current FPDU was consumed.
    started: bool,
    fpdu_start: u64,
    header: [u8; 2],
    header_got: usize,
    header_pos: Option<u64>,
    ulpdu_len: usize,
    buf: Vec<u8>,
    pad_left: usize,
    crc_field: [u8; CRC_LEN],
    crc_got: usize,
    crc: u32,
    marker: [u8; MARKER_LEN],
    marker_got: usize,
    marker_pos: u64,
    marker_in_crc: bool,
    marker_leading: bool,
    poisoned: Option<DeframeError>,
}

impl Deframer {
    /// A deframer configured by `cfg`.
    pub fn new(cfg: DeframerConfig) -> Deframer {
        Deframer {
            cfg,
            pos: cfg.stream_pos,
            phase: Phase::Header,
            started: false,
            fpdu_start: cfg.stream_pos,
            header: [0; 2],
            header_got: 0,
            header_pos: None,
            ulpdu_len: 0,
            buf: Vec::new(),
            pad_left: 0,
            crc_field: [0; CRC_LEN],
            crc_got: 0,
            crc: 0,
            marker: [0; MARKER_LEN],
            marker_got: 0,
            marker_pos: 0,
            marker_in_crc: false,
            marker_leading: false,
            poisoned: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &DeframerConfig {
        &self.cfg
    }

    /// Stream offset of the next octet to be fed (`offset_base` + octets
    /// since `SeqStart`, modulo 2^64).
    pub fn stream_offset(&self) -> u64 {
        self.offset(self.pos)
    }

    /// The reported offset of stream position `pos`.
    fn offset(&self, pos: u64) -> u64 {
        self.cfg.offset_base.wrapping_add(pos)
    }

    /// Whether a fatal error poisoned the deframer.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    /// Whether the deframer is between FPDUs (no partial FPDU held).
    pub fn is_idle(&self) -> bool {
        !self.started && self.marker_got == 0
    }

    /// Takes octets from the front of `input` until one FPDU is complete.
    ///
    /// Returns the number of octets consumed and, if an FPDU completed (or an
    /// error was found), the item. `(input.len(), None)` means all of `input`
    /// was taken and more is needed. Call again with the unconsumed rest.
    /// Once poisoned it returns `(0, Some(Err(e)))` forever.
    ///
    /// Errors: see [`DeframeError`].
    pub fn decode<'a>(
        &'a mut self,
        input: &'a [u8],
    ) -> (usize, Option<Result<Fpdu<'a>, DeframeError>>) {
        if let Some(e) = &self.poisoned {
            return (0, Some(Err(e.clone())));
        }
        if self.is_idle() && input.len() >= 2 {
            let len = u16::from_be_bytes([input[0], input[1]]);
            let total = unmarked_len(usize::from(len));
            if self.no_marker_within(total) && input.len() >= total && self.len_ok(len) {
                return (total, Some(self.fast_path(&input[..total])));
            }
        }
        let mut i = 0;
        while i < input.len() {
            match self.step(&input[i..]) {
                (n, None) => i += n,
                (n, Some(Ok(()))) => {
                    i += n;
                    return (i, Some(self.finish()));
                }
                (n, Some(Err(e))) => {
                    i += n;
                    return (i, Some(Err(e)));
                }
            }
        }
        (i, None)
    }

    /// Feeds all of `input`, calling `f` for every FPDU or error, and stops
    /// after a fatal error. Returns the number of octets consumed (all of
    /// `input` unless a fatal error stopped it).
    pub fn feed<F>(&mut self, mut input: &[u8], mut f: F) -> usize
    where
        F: FnMut(Result<Fpdu<'_>, DeframeError>),
    {
        let mut consumed = 0;
        loop {
            let (n, item) = self.decode(input);
            consumed += n;
            input = &input[n..];
            match item {
                None => return consumed,
                Some(item) => {
                    let fatal = matches!(&item, Err(e) if e.is_fatal());
                    f(item);
                    if fatal {
                        return consumed;
                    }
                }
            }
        }
    }

    fn len_ok(&self, len: u16) -> bool {
        len != 0 && len <= self.cfg.max_ulpdu_len && usize::from(len) <= MAX_ULPDU_LEN
    }

    /// Whether an FPDU of `len` octets starting at the current position would
    /// contain no Marker.
    fn no_marker_within(&self, len: usize) -> bool {
        if !self.cfg.framing.markers {
            return true;
        }
        let room = (MARKER_INTERVAL - self.pos % MARKER_INTERVAL) % MARKER_INTERVAL;
        len as u64 <= room
    }

    /// A whole FPDU without Markers, in `fpdu`.
    fn fast_path<'a>(&mut self, fpdu: &'a [u8]) -> Result<Fpdu<'a>, DeframeError> {
        let offset = self.offset(self.pos);
        let len = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
        let body = fpdu.len() - CRC_LEN;
        let field: [u8; CRC_LEN] = [fpdu[body], fpdu[body + 1], fpdu[body + 2], fpdu[body + 3]];
        self.pos = self.pos.wrapping_add(fpdu.len() as u64);
        let crc = self.crc_status(|| crc32c_append(0, &fpdu[..body]), field);
        self.item(offset, &fpdu[2..2 + len], crc, fpdu.len())
    }

    fn crc_status(&self, computed: impl FnOnce() -> u32, field: [u8; CRC_LEN]) -> CrcStatus {
        if !self.cfg.framing.crc {
            return CrcStatus::Off;
        }
        let computed = computed();
        let received = crc_from_wire(field);
        if computed == received {
            CrcStatus::Good(computed)
        } else {
            CrcStatus::Bad { received, computed }
        }
    }

    fn item<'a>(
        &self,
        offset: u64,
        ulpdu: &'a [u8],
        crc: CrcStatus,
        wire_len: usize,
    ) -> Result<Fpdu<'a>, DeframeError> {
        match crc {
            CrcStatus::Bad { received, computed } if !self.cfg.deliver_bad_crc => {
                Err(DeframeError::BadCrc {
                    offset,
                    received,
                    computed,
                    ulpdu_len: ulpdu.len() as u16,
                    wire_len,
                })
            }
            _ => Ok(Fpdu {
                offset,
                ulpdu,
                crc,
                wire_len,
            }),
        }
    }

    /// Builds the item of the FPDU just completed by [`Deframer::step`] and
    /// resets for the next one.
    fn finish(&mut self) -> Result<Fpdu<'_>, DeframeError> {
        let offset = self.offset(self.fpdu_start);
        let wire_len = self.pos.wrapping_sub(self.fpdu_start) as usize;
        let crc = self.crc;
        let status = self.crc_status(|| crc, self.crc_field);
        self.started = false;
        self.phase = Phase::Header;
        self.header_got = 0;
        self.header_pos = None;
        self.crc_got = 0;
        self.crc = 0;
        self.item(offset, &self.buf, status, wire_len)
    }

    fn begin_fpdu(&mut self) {
        if !self.started {
            self.started = true;
            self.fpdu_start = self.pos;
        }
    }

    fn poison(&mut self, e: DeframeError) -> DeframeError {
        self.poisoned = Some(e.clone());
        e
    }

    /// Consumes octets from `input` (non-empty) within the current FPDU:
    /// returns how many, and `Some(Ok(()))` when the FPDU is complete.
    fn step(&mut self, input: &[u8]) -> (usize, Option<Result<(), DeframeError>>) {
        let markers = self.cfg.framing.markers;
        // Markers: at every position that is a multiple of 512 (section 4.3).
        if markers && (self.marker_got > 0 || self.pos.is_multiple_of(MARKER_INTERVAL)) {
            if self.marker_got == 0 {
                self.marker_leading = !self.started;
                self.begin_fpdu();
                self.marker_pos = self.pos;
                // Markers before the CRC field are covered by the CRC.
                self.marker_in_crc = self.phase != Phase::Crc || self.crc_got == 0;
            }
            let n = (MARKER_LEN - self.marker_got).min(input.len());
            self.marker[self.marker_got..self.marker_got + n].copy_from_slice(&input[..n]);
            if self.marker_in_crc {
                self.crc = crc32c_append(self.crc, &input[..n]);
            }
            self.marker_got += n;
            self.pos = self.pos.wrapping_add(n as u64);
            if self.marker_got < MARKER_LEN {
                return (n, None);
            }
            self.marker_got = 0;
            return match self.check_marker() {
                Ok(()) => (n, None),
                Err(e) => (n, Some(Err(self.poison(e)))),
            };
        }
        self.begin_fpdu();
        let mut avail = input.len();
        if markers {
            let room = (MARKER_INTERVAL - self.pos % MARKER_INTERVAL) as usize;
            avail = avail.min(room);
        }
        match self.phase {
            Phase::Header => {
                if self.header_got == 0 {
                    self.header_pos = Some(self.pos);
                }
                let n = (2 - self.header_got).min(avail);
                self.header[self.header_got..self.header_got + n].copy_from_slice(&input[..n]);
                self.consume_into_crc(&input[..n]);
                self.header_got += n;
                if self.header_got == 2 {
                    let len = u16::from_be_bytes(self.header);
                    if !self.len_ok(len) {
                        let e = DeframeError::BadUlpduLength {
                            offset: self.offset(self.fpdu_start),
                            len,
                            max: self.cfg.max_ulpdu_len,
                        };
                        return (n, Some(Err(self.poison(e))));
                    }
                    self.ulpdu_len = usize::from(len);
                    self.buf.clear();
                    self.buf.reserve(self.ulpdu_len);
                    self.phase = Phase::Ulpdu;
                }
                (n, None)
            }
            Phase::Ulpdu => {
                let n = (self.ulpdu_len - self.buf.len()).min(avail);
                self.buf.extend_from_slice(&input[..n]);
                let start = self.buf.len() - n;
                self.crc = crc32c_append(self.crc, &self.buf[start..]);
                self.pos = self.pos.wrapping_add(n as u64);
                if self.buf.len() == self.ulpdu_len {
                    self.pad_left = pad_len(self.ulpdu_len);
                    self.phase = if self.pad_left == 0 {
                        Phase::Crc
                    } else {
                        Phase::Pad
                    };
                }
                (n, None)
            }
            Phase::Pad => {
                let n = self.pad_left.min(avail);
                self.consume_into_crc(&input[..n]);
                self.pad_left -= n;
                if self.pad_left == 0 {
                    self.phase = Phase::Crc;
                }
                (n, None)
            }
            Phase::Crc => {
                let n = (CRC_LEN - self.crc_got).min(avail);
                self.crc_field[self.crc_got..self.crc_got + n].copy_from_slice(&input[..n]);
                self.crc_got += n;
                self.pos = self.pos.wrapping_add(n as u64);
                if self.crc_got == CRC_LEN {
                    (n, Some(Ok(())))
                } else {
                    (n, None)
                }
            }
        }
    }

    fn consume_into_crc(&mut self, data: &[u8]) {
        self.crc = crc32c_append(self.crc, data);
        self.pos = self.pos.wrapping_add(data.len() as u64);
    }

    fn check_marker(&self) -> Result<(), DeframeError> {
        let found = Marker::from_bytes(self.marker).fpduptr;
        let expected = match (self.marker_leading, self.header_pos) {
            (true, _) | (false, None) => 0,
            (false, Some(header)) => self.marker_pos.wrapping_sub(header),
        };
        // Receivers treat the two low bits of FPDUPTR as zero (section 4.2).
        if u64::from(found & !3) == expected & !3 {
            Ok(())
        } else {
            Err(DeframeError::BadMarker {
                offset: self.offset(self.marker_pos),
                found,
                expected,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fpdu::Framer;
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

    type Owned = Result<(u64, Vec<u8>, CrcStatus, usize), DeframeError>;

    fn collect(deframer: &mut Deframer, chunks: &[&[u8]]) -> Vec<Owned> {
        let mut out = Vec::new();
        for chunk in chunks {
            if deframer.is_poisoned() {
                break;
            }
            deframer.feed(chunk, |item| {
                out.push(item.map(|f| (f.offset, f.ulpdu.to_vec(), f.crc, f.wire_len)))
            });
        }
        out
    }

    fn bytewise(stream: &[u8]) -> Vec<&[u8]> {
        stream.chunks(1).collect()
    }

    /// Every FPDU of both directions of rping-srv_crc-cli_crc.pcap, fed right
    /// behind the MPA frame, in one chunk and one octet at a time.
    #[test]
    fn deconstruct_captured_crc_streams() {
        for (stream, table) in [
            (unhex(CRC_INITIATOR_STREAM), CRC_INITIATOR_FPDUS),
            (unhex(CRC_RESPONDER_STREAM), CRC_RESPONDER_FPDUS),
        ] {
            let fpdus = &stream[24..];
            for chunks in [vec![fpdus], bytewise(fpdus)] {
                let mut cfg = DeframerConfig::new(CRC);
                cfg.offset_base = 24;
                let mut deframer = Deframer::new(cfg);
                let items = collect(&mut deframer, &chunks);
                assert_eq!(items.len(), table.len());
                for (item, &(offset, len, wire_len, crc)) in items.iter().zip(table) {
                    let (off, ulpdu, status, wl) = item.as_ref().unwrap();
                    assert_eq!(*off, offset + 24);
                    assert_eq!(ulpdu.len(), usize::from(len));
                    let start = offset as usize + 2;
                    assert_eq!(&ulpdu[..], &fpdus[start..start + ulpdu.len()]);
                    assert_eq!(*status, CrcStatus::Good(crc));
                    assert_eq!(*wl, wire_len);
                }
                assert!(deframer.is_idle());
                assert_eq!(deframer.stream_offset(), stream.len() as u64);
            }
        }
    }

    /// bad-crc.pcap: one payload octet of the first FPDU flipped. That FPDU,
    /// and only that one, fails; the deframer stays in sync.
    #[test]
    fn bad_crc_capture() {
        let stream = unhex(BAD_CRC_INITIATOR_STREAM);
        let good = unhex(CRC_INITIATOR_STREAM);
        assert_eq!(stream.len(), good.len());
        for chunks in [vec![&stream[24..]], bytewise(&stream[24..])] {
            let mut deframer = Deframer::new(DeframerConfig::new(CRC));
            let items = collect(&mut deframer, &chunks);
            assert_eq!(items.len(), CRC_INITIATOR_FPDUS.len());
            assert_eq!(
                items[0],
                Err(DeframeError::BadCrc {
                    offset: 0,
                    received: 0xcba8_fb2f,
                    computed: 0xe3ab_136d,
                    ulpdu_len: 34,
                    wire_len: 40
                })
            );
            assert_eq!(
                items[0].as_ref().unwrap_err().llp_error_code(),
                LlpErrorCode::CrcError
            );
            assert!(items[1..]
                .iter()
                .all(|i| matches!(i, Ok((_, _, CrcStatus::Good(_), _)))));
            assert!(!deframer.is_poisoned());
        }
        // Dissector mode: the bad FPDU is delivered with its status.
        let mut cfg = DeframerConfig::new(CRC);
        cfg.deliver_bad_crc = true;
        let mut deframer = Deframer::new(cfg);
        let items = collect(&mut deframer, &[&stream[24..]]);
        let (offset, ulpdu, status, wire_len) = items[0].clone().unwrap();
        assert_eq!((offset, wire_len), (0, 40));
        assert_eq!(
            status,
            CrcStatus::Bad {
                received: 0xcba8_fb2f,
                computed: 0xe3ab_136d
            }
        );
        assert_eq!(ulpdu, stream[26..60].to_vec());
        assert_ne!(ulpdu, good[26..60].to_vec());
    }

    /// No CRC: rping.pcap frame 10 and the p2p RTR; the CRC field is not checked.
    #[test]
    fn deconstruct_without_crc() {
        let mut stream = unhex(P2P_RTR_FPDU);
        stream.extend_from_slice(&unhex(RPING_FPDU_FRAME10));
        let mut deframer = Deframer::new(DeframerConfig::new(PLAIN));
        let items = collect(&mut deframer, &[&stream]);
        assert_eq!(
            items,
            vec![
                Ok((0, stream[2..16].to_vec(), CrcStatus::Off, 20)),
                Ok((20, stream[22..56].to_vec(), CrcStatus::Off, 40)),
            ]
        );
        assert_eq!(
            items[0].as_ref().unwrap().1,
            vec![0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    /// A Reply and FPDUs in the same chunk: the startup reader takes the
    /// Reply, the deframer the rest.
    #[test]
    fn fpdus_behind_reply_in_same_chunk() {
        use crate::wire::{FrameKind, Limits, Startup, StartupReader};
        let stream = unhex(CRC_RESPONDER_STREAM);
        let mut reader = StartupReader::new(Some(FrameKind::Reply), Limits::default());
        let Startup::Complete { frame, rest } = reader.push(&stream[..100]).unwrap() else {
            panic!("reply not complete")
        };
        assert!(frame.crc);
        let mut deframer = Deframer::new(DeframerConfig::new(CRC));
        let mut items = collect(&mut deframer, &[rest]);
        items.extend(collect(&mut deframer, &[&stream[100..]]));
        assert_eq!(items.len(), CRC_RESPONDER_FPDUS.len());
        assert!(items
            .iter()
            .all(|i| matches!(i, Ok((_, _, CrcStatus::Good(_), _)))));
    }

    /// An FPDU cut anywhere yields nothing until its last octet arrives.
    #[test]
    fn truncated() {
        let stream = unhex(CRC_INITIATOR_STREAM);
        let fpdu = &stream[24..64];
        for cut in 0..fpdu.len() {
            let mut deframer = Deframer::new(DeframerConfig::new(CRC));
            assert_eq!(deframer.decode(&fpdu[..cut]), (cut, None), "cut {cut}");
            assert_eq!(deframer.is_idle(), cut == 0);
            assert_eq!(deframer.stream_offset(), cut as u64);
            let (n, item) = deframer.decode(&fpdu[cut..]);
            assert_eq!(n, fpdu.len() - cut);
            let item = item.unwrap().unwrap();
            assert_eq!(item.ulpdu, &fpdu[2..36]);
            assert_eq!(item.crc, CrcStatus::Good(0xcba8_fb2f));
            assert_eq!((item.offset, item.wire_len), (0, 40));
        }
    }

    #[test]
    fn impossible_len() {
        let mut stream = unhex(CRC_INITIATOR_STREAM)[24..].to_vec();
        // Second FPDU (offset 40): ULPDU_Length 0.
        stream[40] = 0;
        stream[41] = 0;
        for chunks in [vec![&stream[..]], bytewise(&stream)] {
            let mut deframer = Deframer::new(DeframerConfig::new(CRC));
            let items = collect(&mut deframer, &chunks);
            assert_eq!(items.len(), 2);
            assert!(items[0].is_ok());
            let e = DeframeError::BadUlpduLength {
                offset: 40,
                len: 0,
                max: 65535,
            };
            assert_eq!(items[1], Err(e.clone()));
            assert!(deframer.is_poisoned());
            assert_eq!(deframer.decode(&stream), (0, Some(Err(e.clone()))));
            assert_eq!(e.llp_error_code(), LlpErrorCode::MarkerMismatch);
            assert!(e.is_fatal());
        }
        // Over the configured maximum.
        let stream = unhex(CRC_INITIATOR_STREAM)[24..].to_vec();
        let mut cfg = DeframerConfig::new(CRC);
        cfg.max_ulpdu_len = 40;
        cfg.offset_base = 1000;
        let mut deframer = Deframer::new(cfg);
        let items = collect(&mut deframer, &[&stream]);
        assert_eq!(items.len(), 2);
        assert_eq!(
            items[1],
            Err(DeframeError::BadUlpduLength {
                offset: 1040,
                len: 78,
                max: 40
            })
        );
    }

    #[test]
    fn markers_round_trip_and_checked() {
        let mut framer = Framer::new(MARKED);
        let mut stream = Vec::new();
        let ulpdus: Vec<Vec<u8>> = [10usize, 1000, 506, 3, 1442, 77]
            .iter()
            .map(|&n| (0..n).map(|i| (i * 7 + n) as u8).collect())
            .collect();
        let mut offsets = Vec::new();
        for u in &ulpdus {
            offsets.push(framer.stream_pos());
            framer.append(u, &mut stream).unwrap();
        }
        for chunks in [
            vec![&stream[..]],
            bytewise(&stream),
            stream.chunks(13).collect(),
        ] {
            let mut deframer = Deframer::new(DeframerConfig::new(MARKED));
            let items = collect(&mut deframer, &chunks);
            assert_eq!(items.len(), ulpdus.len());
            for ((item, u), off) in items.iter().zip(&ulpdus).zip(&offsets) {
                let (o, ulpdu, crc, _) = item.as_ref().unwrap();
                assert_eq!(o, off);
                assert_eq!(ulpdu, u);
                assert!(matches!(crc, CrcStatus::Good(_)));
            }
        }
        // Corrupt the FPDUPTR of the Marker at 512 (inside the second FPDU,
        // whose header is at 20: FPDUPTR 492).
        let mut bad = stream.clone();
        assert_eq!(&bad[512..516], &[0, 0, 0x01, 0xec]);
        bad[515] = 0xf0;
        let mut deframer = Deframer::new(DeframerConfig::new(Framing {
            crc: false,
            markers: true,
        }));
        let items = collect(&mut deframer, &[&bad]);
        assert_eq!(items.len(), 2);
        let e = DeframeError::BadMarker {
            offset: 512,
            found: 0x01f0,
            expected: 492,
        };
        assert_eq!(items[1], Err(e.clone()));
        assert_eq!(e.llp_error_code(), LlpErrorCode::MarkerMismatch);
        assert!(deframer.is_poisoned());
        // The low two bits of FPDUPTR are ignored.
        let mut low = stream.clone();
        low[515] |= 0x03;
        let mut deframer = Deframer::new(DeframerConfig::new(Framing {
            crc: false,
            markers: true,
        }));
        assert!(collect(&mut deframer, &[&low]).iter().all(|i| i.is_ok()));
        // A non-zero leading Marker.
        let mut lead = stream.clone();
        lead[3] = 4;
        let mut deframer = Deframer::new(DeframerConfig::new(MARKED));
        assert_eq!(
            collect(&mut deframer, &[&lead]),
            vec![Err(DeframeError::BadMarker {
                offset: 0,
                found: 4,
                expected: 0
            })]
        );
    }

    /// Positions near `u64::MAX` wrap instead of overflowing: the FPDUs the
    /// framer builds from `u64::MAX - 3` (a Marker at 2^64 = 0, four octets
    /// into the first FPDU) come back, in one chunk and octet by octet, and
    /// offsets wrap with `offset_base` = `u64::MAX` too.
    #[test]
    fn stream_position_wraps_near_u64_max() {
        let start = u64::MAX - 3;
        for framing in [MARKED, CRC] {
            let mut framer = Framer::with_stream_pos(framing, start);
            let mut stream = Vec::new();
            framer.append(b"abcdef", &mut stream).unwrap();
            let second = stream.len() as u64;
            framer.append(&[9u8; 700], &mut stream).unwrap();
            for chunks in [vec![&stream[..]], bytewise(&stream)] {
                let mut cfg = DeframerConfig::new(framing);
                cfg.stream_pos = start;
                let mut deframer = Deframer::new(cfg);
                let items = collect(&mut deframer, &chunks);
                assert_eq!(items.len(), 2, "{framing:?}");
                let (off, ulpdu, crc, wire_len) = items[0].clone().unwrap();
                assert_eq!((off, &ulpdu[..]), (start, &b"abcdef"[..]));
                assert!(matches!(crc, CrcStatus::Good(_)));
                assert_eq!(wire_len as u64, second);
                let (off, ulpdu, _, _) = items[1].clone().unwrap();
                assert_eq!(off, start.wrapping_add(second));
                assert_eq!(ulpdu, vec![9u8; 700]);
                assert!(deframer.is_idle());
                assert_eq!(
                    deframer.stream_offset(),
                    start.wrapping_add(stream.len() as u64)
                );
            }
            // offset_base near the top: offsets wrap as well.
            let mut cfg = DeframerConfig::new(framing);
            cfg.stream_pos = start;
            cfg.offset_base = u64::MAX;
            let mut deframer = Deframer::new(cfg);
            let items = collect(&mut deframer, &[&stream]);
            assert_eq!(items[0].as_ref().unwrap().0, u64::MAX - 4);
            assert_eq!(
                items[1].as_ref().unwrap().0,
                (u64::MAX - 4).wrapping_add(second)
            );
        }
        // A bad Marker right at the wrap is reported at its (wrapped) offset.
        let mut framer = Framer::with_stream_pos(MARKED, start);
        let mut stream = Vec::new();
        framer.append(b"abcdef", &mut stream).unwrap();
        assert_eq!(&stream[4..8], &[0, 0, 0, 4]);
        stream[7] = 8;
        let mut cfg = DeframerConfig::new(MARKED);
        cfg.stream_pos = start;
        let mut deframer = Deframer::new(cfg);
        assert_eq!(
            collect(&mut deframer, &[&stream]),
            vec![Err(DeframeError::BadMarker {
                offset: 0,
                found: 8,
                expected: 4
            })]
        );
    }

    /// The longest marked FPDUs the framer builds (over 65536 octets, every
    /// FPDUPTR within 16 bits) deframe with every Marker checked.
    #[test]
    fn long_marked_fpdu_round_trip() {
        let ulpdu: Vec<u8> = (0..65526u32).map(|i| (i % 251) as u8).collect();
        let mut framer = Framer::with_stream_pos(MARKED, 4);
        let mut stream = Vec::new();
        assert_eq!(framer.append(&ulpdu, &mut stream), Ok(66044));
        framer.append(b"next", &mut stream).unwrap();
        let mut cfg = DeframerConfig::new(MARKED);
        cfg.stream_pos = 4;
        for chunks in [vec![&stream[..]], stream.chunks(1000).collect()] {
            let mut deframer = Deframer::new(cfg);
            let items = collect(&mut deframer, &chunks);
            assert_eq!(items.len(), 2);
            let (off, got, crc, wire_len) = items[0].clone().unwrap();
            assert_eq!((off, wire_len), (4, 66044));
            assert_eq!(got, ulpdu);
            assert!(matches!(crc, CrcStatus::Good(_)));
            assert_eq!(items[1].as_ref().unwrap().1, b"next".to_vec());
        }
    }

    /// Reported offsets start at the configured stream position plus base.
    #[test]
    fn offsets_with_stream_pos_and_base() {
        let mut framer = Framer::with_stream_pos(MARKED, 100);
        let mut stream = Vec::new();
        framer.append(&[5u8; 600], &mut stream).unwrap();
        framer.append(&[6u8; 20], &mut stream).unwrap();
        let mut cfg = DeframerConfig::new(MARKED);
        cfg.stream_pos = 100;
        cfg.offset_base = 0xffff_fff0;
        let mut deframer = Deframer::new(cfg);
        let items = collect(&mut deframer, &[&stream]);
        let first_len = crate::fpdu::fpdu_len(600, true, 100);
        assert_eq!(items[0].as_ref().unwrap().0, 0xffff_fff0 + 100);
        assert_eq!(
            items[1].as_ref().unwrap().0,
            0xffff_fff0 + 100 + first_len as u64
        );
        assert_eq!(items[0].as_ref().unwrap().3, first_len);
    }
}
