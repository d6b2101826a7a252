//! A verifiable stream of ULPDUs over one MPA connection of a
//! [`softiwarp::Device`], for the two-process tests and the FPDU benchmark.
//!
//! Every ULPDU is a real DDP segment, so a capture of the stream decodes cleanly in
//! Wireshark's `iwarp_ddp_rdmap` dissector: an RDMAP RDMA Write (RFC 5040 4.3, opcode 0),
//! tagged DDP header (RFC 5041 4.2: control `T=1 L=1 DV=01`, RDMAP control `RV=01`,
//! STag [`STAG`], 64-bit tagged offset), 14 bytes, then the payload. The tagged offsets
//! run through one virtual buffer: ULPDU `k` carries the bytes at offset `TO` of the
//! stream, and its payload is the [`pattern`] at that offset. So a receiver checks every
//! ULPDU on its own (header, `TO` = bytes received so far, payload = the pattern there),
//! and both sides run a CRC32c over every ULPDU byte (the totals must match).
//!
//! The sender sends ULPDUs of MULPDU bytes (the largest that fit one TCP segment) until the
//! byte count or time is reached (the last one may be shorter), then closes gracefully;
//! the receiver reads until the connection closes.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use softiwarp::transport::stream::{RecvError, SendError};
use softiwarp::Connection;

/// Length in bytes of the tagged DDP + RDMAP header at the start of each ULPDU.
pub const HEADER_LEN: usize = 14;

/// The STag every ULPDU carries (any value: nothing is placed).
pub const STAG: u32 = 0x0000_5a01;

/// DDP control byte: tagged, last segment, DDP version 1 (RFC 5041 4.2).
const DDP_CONTROL: u8 = 0x80 | 0x40 | 0x01;
/// RDMAP control byte: RDMAP version 1, opcode 0 = RDMA Write (RFC 5040 4.2).
const RDMAP_CONTROL: u8 = 0x40;

/// Length of the payload pattern: 1 MiB + 7, so payload boundaries drift across it.
pub const PATTERN_LEN: usize = (1 << 20) + 7;

/// How long a single send or receive may block before the transfer is declared stuck.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(20);

/// The payload pattern: [`PATTERN_LEN`] pseudo-random bytes (xorshift64*, fixed seed).
///
/// A fixed data pattern, not a PRNG: both peers of a transfer (separate processes, the
/// `bench-peer` and `iwarp-peer` binaries) compute the same bytes from the same constant,
/// and a capture of it can be checked against it. It stays here, deterministic and
/// seedless, because binaries use it (the tests' one PRNG, `testkit::Rng`, is test-only).
pub fn pattern() -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(PATTERN_LEN + 8);
    while out.len() < PATTERN_LEN {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(PATTERN_LEN);
    out
}

/// Appends to `out` the ULPDU of `len` bytes (more than [`HEADER_LEN`]) carrying the
/// stream bytes at tagged offset `to`.
pub fn build_ulpdu(out: &mut Vec<u8>, pattern: &[u8], to: u64, len: usize) {
    out.push(DDP_CONTROL);
    out.push(RDMAP_CONTROL);
    out.extend_from_slice(&STAG.to_be_bytes());
    out.extend_from_slice(&to.to_be_bytes());
    let mut left = len.saturating_sub(HEADER_LEN);
    let mut off = (to % pattern.len() as u64) as usize;
    while left > 0 {
        let n = left.min(pattern.len() - off);
        out.extend_from_slice(&pattern[off..off + n]);
        left -= n;
        off = 0;
    }
}

/// Checks one received ULPDU: the header, the tagged offset `expected_to`, the payload
/// against the pattern. Returns the payload length.
///
/// Errors: a description of the first difference.
pub fn check_ulpdu(ulpdu: &[u8], pattern: &[u8], expected_to: u64) -> Result<usize, String> {
    if ulpdu.len() <= HEADER_LEN {
        return Err(format!("ULPDU of {} bytes has no payload", ulpdu.len()));
    }
    if ulpdu[0] != DDP_CONTROL || ulpdu[1] != RDMAP_CONTROL {
        return Err(format!("control bytes {:02x} {:02x}", ulpdu[0], ulpdu[1]));
    }
    let stag = u32::from_be_bytes([ulpdu[2], ulpdu[3], ulpdu[4], ulpdu[5]]);
    if stag != STAG {
        return Err(format!("STag {stag:#x}"));
    }
    let mut to_bytes = [0u8; 8];
    to_bytes.copy_from_slice(&ulpdu[6..14]);
    let to = u64::from_be_bytes(to_bytes);
    if to != expected_to {
        return Err(format!(
            "tagged offset {to}, expected {expected_to} (lost or reordered ULPDU)"
        ));
    }
    let payload = &ulpdu[HEADER_LEN..];
    let mut off = (to % pattern.len() as u64) as usize;
    let mut done = 0;
    while done < payload.len() {
        let n = (payload.len() - done).min(pattern.len() - off);
        if payload[done..done + n] != pattern[off..off + n] {
            let i = (0..n)
                .find(|&i| payload[done + i] != pattern[off + i])
                .unwrap_or(0);
            return Err(format!(
                "payload byte {} (stream offset {}) differs",
                done + i,
                to + (done + i) as u64
            ));
        }
        done += n;
        off = 0;
    }
    Ok(payload.len())
}

/// How much the sender sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// ULPDU bytes in total (headers included).
    Bytes(u64),
    /// For this long after establishment.
    Time(Duration),
}

/// Settings of one side of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferConfig {
    /// What the sender sends (unused by the receiver).
    pub amount: Amount,
    /// Check every ULPDU and run the CRC32c (the receiver), or build ULPDUs from the
    /// pattern and run the CRC32c (the sender). Without it the sender still sends valid
    /// ULPDUs (headers and pattern) and the receiver only counts.
    pub verify: bool,
    /// ULPDU size in bytes; `None`: MULPDU of the connection.
    pub ulpdu_size: Option<usize>,
    /// Sender: abort the connection (RST) after this many bytes, to test failure paths.
    pub abort_after: Option<u64>,
}

/// What one side of a transfer saw; peers print it as `RESULT <json>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferStats {
    /// ULPDUs moved.
    pub ulpdus: u64,
    /// ULPDU bytes moved (headers included).
    pub bytes: u64,
    /// CRC32c over every ULPDU byte, in order, when verifying.
    pub crc32c: Option<u32>,
    /// Seconds measured: receiver from the first to the last ULPDU, sender from
    /// establishment to the end of the graceful close.
    pub seconds: f64,
    /// `bytes * 8 / seconds / 1e9`.
    pub gbit_per_s: f64,
    /// Whether MPA CRCs were in use (the agreement).
    pub mpa_crc: bool,
    /// MULPDU of the connection in bytes.
    pub mulpdu: usize,
    /// EMSS of the TCP connection in bytes (the link MTU minus 40 here).
    pub emss: usize,
    /// ULPDU size used by the sender in bytes.
    pub ulpdu_size: usize,
}

/// Errors of a transfer.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The connection is not established (or its parameters are unknown).
    #[error("connection not established")]
    NotEstablished,
    /// The ULPDU size is out of range.
    #[error("ULPDU size {size} outside {min}..={max}")]
    BadSize {
        /// Asked size.
        size: usize,
        /// Smallest: header + 1.
        min: usize,
        /// MULPDU.
        max: usize,
    },
    /// Sending failed.
    #[error("send of ULPDU {index} failed: {source}")]
    Send {
        /// ULPDU index.
        index: u64,
        /// The error.
        #[source]
        source: SendError,
    },
    /// Receiving failed (connection failed, or nothing arrived for [`STALL_TIMEOUT`]).
    #[error("receive after {ulpdus} ULPDUs ({bytes} bytes) failed: {source}")]
    Recv {
        /// ULPDUs received so far.
        ulpdus: u64,
        /// Bytes received so far.
        bytes: u64,
        /// The error.
        #[source]
        source: RecvError,
    },
    /// A ULPDU was not what the sender sent.
    #[error("ULPDU {index}: {detail}")]
    Corrupt {
        /// ULPDU index.
        index: u64,
        /// What differs.
        detail: String,
    },
    /// Closing failed or did not complete.
    #[error("close: {0}")]
    Close(String),
}

fn rate(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 * 8.0 / seconds / 1e9
    } else {
        0.0
    }
}

/// Sends the stream on an established `conn`, then closes it gracefully and waits for
/// the close to complete.
///
/// Errors: [`TransferError`]: not established, bad size, a send failed (or blocked for
/// [`STALL_TIMEOUT`]), the close failed.
pub fn send_stream(
    conn: &Connection,
    cfg: &TransferConfig,
) -> Result<TransferStats, TransferError> {
    let est = conn.established().ok_or(TransferError::NotEstablished)?;
    let mulpdu = est.mulpdu;
    let size = cfg.ulpdu_size.unwrap_or(mulpdu);
    if !(HEADER_LEN + 1..=mulpdu).contains(&size) {
        return Err(TransferError::BadSize {
            size,
            min: HEADER_LEN + 1,
            max: mulpdu,
        });
    }
    let pat = pattern();
    // The pattern followed by its first MULPDU bytes again, so that every payload is
    // one slice of it, sent without a copy (`send_ulpdu_shared`).
    let mut wrapped = pat.clone();
    wrapped.extend_from_within(..mulpdu.min(pat.len()));
    let wrapped: std::sync::Arc<[u8]> = wrapped.into();
    let start = Instant::now();
    let (limit, until) = match cfg.amount {
        Amount::Bytes(n) => (n, None),
        Amount::Time(d) => (u64::MAX, Some(start + d)),
    };
    let mut crc = 0u32;
    let (mut bytes, mut to, mut index) = (0u64, 0u64, 0u64);
    // The clock is read once per 64 ULPDUs (about 93 KB at MULPDU 1454), not per ULPDU:
    // the TCP baseline reads it once per poll of up to 64 KiB.
    while bytes < limit && (!index.is_multiple_of(64) || until.is_none_or(|u| Instant::now() < u)) {
        if cfg.abort_after.is_some_and(|a| bytes >= a) {
            conn.close(softiwarp::transport::CloseMode::Abortive)
                .map_err(|e| TransferError::Close(e.to_string()))?;
            return Err(TransferError::Close(format!(
                "aborted on request after {bytes} bytes"
            )));
        }
        // The last ULPDU takes what is left, but never leaves less than a header + 1.
        let left = limit - bytes;
        let len = if left < size as u64 {
            (left as usize).max(HEADER_LEN + 1)
        } else {
            size
        };
        let mut head = [0u8; HEADER_LEN];
        head[0] = DDP_CONTROL;
        head[1] = RDMAP_CONTROL;
        head[2..6].copy_from_slice(&STAG.to_be_bytes());
        head[6..14].copy_from_slice(&to.to_be_bytes());
        let off = (to % pat.len() as u64) as usize;
        let range = off..off + (len - HEADER_LEN);
        if cfg.verify {
            crc = crc32c::crc32c_append(crc, &head);
            crc = crc32c::crc32c_append(crc, &wrapped[range.clone()]);
        }
        conn.send_ulpdu_shared(&head, wrapped.clone(), range, STALL_TIMEOUT)
            .map_err(|source| TransferError::Send { index, source })?;
        bytes += len as u64;
        to += (len - HEADER_LEN) as u64;
        index += 1;
    }
    conn.close(softiwarp::transport::CloseMode::Graceful)
        .map_err(|e| TransferError::Close(e.to_string()))?;
    match conn.wait_ended(STALL_TIMEOUT + Duration::from_secs(10)) {
        Some(None) => {}
        Some(Some(e)) => return Err(TransferError::Close(format!("connection failed: {e}"))),
        None => return Err(TransferError::Close("close did not complete".into())),
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(TransferStats {
        ulpdus: index,
        bytes,
        crc32c: cfg.verify.then_some(crc),
        seconds,
        gbit_per_s: rate(bytes, seconds),
        mpa_crc: est.agreed.crc,
        mulpdu,
        emss: est.emss,
        ulpdu_size: size,
    })
}

/// ULPDUs [`recv_stream`] takes from the receive queue at a time.
const RECV_BATCH: usize = 64;

/// Receives the stream on an established `conn` until the peer closes.
///
/// Errors: [`TransferError`]: not established, the connection failed or stalled for
/// [`STALL_TIMEOUT`], a ULPDU differs (when verifying).
pub fn recv_stream(
    conn: &Connection,
    cfg: &TransferConfig,
) -> Result<TransferStats, TransferError> {
    let est = conn.established().ok_or(TransferError::NotEstablished)?;
    let pat = if cfg.verify { pattern() } else { Vec::new() };
    let mut crc = 0u32;
    let (mut bytes, mut to, mut index) = (0u64, 0u64, 0u64);
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut size = 0usize;
    let mut batch = Vec::new();
    loop {
        match conn.recv_ulpdus(&mut batch, RECV_BATCH, STALL_TIMEOUT) {
            Ok(_) => {
                last = Instant::now();
                first.get_or_insert(last);
                for u in &batch {
                    if cfg.verify {
                        let n = check_ulpdu(u, &pat, to)
                            .map_err(|detail| TransferError::Corrupt { index, detail })?;
                        to += n as u64;
                        crc = crc32c::crc32c_append(crc, u);
                    }
                    size = size.max(u.len());
                    bytes += u.len() as u64;
                    index += 1;
                }
                conn.recycle_all(&mut batch);
            }
            Err(RecvError::Closed) => break,
            Err(source) => {
                return Err(TransferError::Recv {
                    ulpdus: index,
                    bytes,
                    source,
                })
            }
        }
    }
    let seconds = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    Ok(TransferStats {
        ulpdus: index,
        bytes,
        crc32c: cfg.verify.then_some(crc),
        seconds,
        gbit_per_s: rate(bytes, seconds),
        mpa_crc: est.agreed.crc,
        mulpdu: est.mulpdu,
        emss: est.emss,
        ulpdu_size: size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulpdus_round_trip_and_are_checked() {
        let pat = pattern();
        assert_eq!(pat.len(), PATTERN_LEN);
        let mut u = Vec::new();
        // A ULPDU whose payload wraps around the end of the pattern.
        let to = PATTERN_LEN as u64 - 100;
        build_ulpdu(&mut u, &pat, to, 1454);
        assert_eq!(u.len(), 1454);
        assert_eq!(&u[..6], &[0xc1, 0x40, 0x00, 0x00, 0x5a, 0x01]);
        assert_eq!(&u[6..14], &to.to_be_bytes());
        assert_eq!(&u[14..114], &pat[PATTERN_LEN - 100..]);
        assert_eq!(&u[114..], &pat[..1340]);
        assert_eq!(check_ulpdu(&u, &pat, to), Ok(1440));
        // The tagged header parses as an RDMA Write with the ddp-rdmap crate too.
        let p = ddp_rdmap::ddp::Packet::new_checked(&u[..]).unwrap();
        assert!(p.tagged() && p.last());
        assert_eq!(p.stag(), Some(STAG));
        assert_eq!(p.tagged_offset(), Some(to));
        assert_eq!(p.header_len(), HEADER_LEN);

        let err = check_ulpdu(&u, &pat, to + 1).unwrap_err();
        assert!(err.contains("lost or reordered"), "{err}");
        let mut bad = u.clone();
        bad[500] ^= 1;
        let err = check_ulpdu(&bad, &pat, to).unwrap_err();
        assert!(err.contains("payload byte 486"), "{err}");
        let mut bad = u.clone();
        bad[0] = 0x41;
        assert!(check_ulpdu(&bad, &pat, to).is_err());
        assert!(check_ulpdu(&u[..14], &pat, to).is_err());
    }
}
