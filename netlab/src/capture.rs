//! Capturing the first megabytes of a long transfer, and reading a capture with tshark.
//!
//! [`CappedPcap`] is a `Write` that sits under `softiwarp::link::Pcap` (through
//! `Pcap::with_writer`) and passes the pcap stream through until a byte limit, then
//! drops every further record. It cuts only at record boundaries (it parses the record
//! headers as they go by), so the file stays a valid pcap: a 1 GiB transfer leaves a
//! capture of its connection setup and first FPDUs, small enough to check with
//! `iwdump` and tshark.
//!
//! [`remove_stale_files`] deletes captures that killed runs left behind.
//!
//! [`tshark_summary`] runs `tshark` on a capture and counts what its iWARP dissectors
//! (`iwarp_mpa`, `iwarp_ddp_rdmap`) recognised, and what it found malformed.

use std::io::{self, Write};
use std::path::Path;
use std::process::Command;

/// Deletes files in `dir` named `PREFIX<pid>x...` (the [`crate::netns::unique_tag`]
/// scheme) whose process is gone: captures a killed test run left behind. Files of live
/// processes are left alone. Returns the paths deleted.
pub fn remove_stale_files(dir: &Path, prefix: &str) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|r| r.split_once('x'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if std::fs::remove_file(e.path()).is_ok() {
            removed.push(e.path());
        }
    }
    removed
}

/// Length in bytes of the pcap global header.
const GLOBAL_HEADER_LEN: usize = 24;
/// Length in bytes of a pcap record header.
const RECORD_HEADER_LEN: usize = 16;

/// A pcap stream writer that keeps whole records up to a byte limit and drops the rest.
/// See the [module docs](self).
#[derive(Debug)]
pub struct CappedPcap<W: Write> {
    inner: W,
    cap: u64,
    written: u64,
    global: Vec<u8>,
    big_endian: bool,
    header: [u8; RECORD_HEADER_LEN],
    header_len: usize,
    body_left: u64,
    keeping: bool,
    full: bool,
    kept: u64,
    dropped: u64,
}

impl<W: Write> CappedPcap<W> {
    /// Writes at most `cap` bytes (global header included) of whole records to `inner`.
    pub fn new(inner: W, cap: u64) -> CappedPcap<W> {
        CappedPcap {
            inner,
            cap,
            written: 0,
            global: Vec::with_capacity(GLOBAL_HEADER_LEN),
            big_endian: false,
            header: [0; RECORD_HEADER_LEN],
            header_len: 0,
            body_left: 0,
            keeping: false,
            full: false,
            kept: 0,
            dropped: 0,
        }
    }

    /// Records written so far.
    pub fn records_kept(&self) -> u64 {
        self.kept
    }

    /// Records dropped because the limit was reached.
    pub fn records_dropped(&self) -> u64 {
        self.dropped
    }

    /// Bytes written to the inner writer so far.
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// The inner writer.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for CappedPcap<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut rest = buf;
        while !rest.is_empty() {
            if self.global.len() < GLOBAL_HEADER_LEN {
                let n = (GLOBAL_HEADER_LEN - self.global.len()).min(rest.len());
                self.global.extend_from_slice(&rest[..n]);
                self.inner.write_all(&rest[..n])?;
                self.written += n as u64;
                rest = &rest[n..];
                if self.global.len() == GLOBAL_HEADER_LEN {
                    // Magic 0xa1b2c3d4 (us) or 0xa1b23c4d (ns), in the writer's byte order.
                    self.big_endian = self.global[0] == 0xa1;
                }
                continue;
            }
            if self.body_left > 0 {
                let n = self.body_left.min(rest.len() as u64) as usize;
                if self.keeping {
                    self.inner.write_all(&rest[..n])?;
                    self.written += n as u64;
                }
                self.body_left -= n as u64;
                rest = &rest[n..];
                continue;
            }
            let n = (RECORD_HEADER_LEN - self.header_len).min(rest.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&rest[..n]);
            self.header_len += n;
            rest = &rest[n..];
            if self.header_len == RECORD_HEADER_LEN {
                self.header_len = 0;
                let field = [
                    self.header[8],
                    self.header[9],
                    self.header[10],
                    self.header[11],
                ];
                let incl = if self.big_endian {
                    u32::from_be_bytes(field)
                } else {
                    u32::from_le_bytes(field)
                };
                self.body_left = u64::from(incl);
                let size = (RECORD_HEADER_LEN as u64) + u64::from(incl);
                self.keeping = !self.full && self.written + size <= self.cap;
                if self.keeping {
                    self.inner.write_all(&self.header)?;
                    self.written += RECORD_HEADER_LEN as u64;
                    self.kept += 1;
                } else {
                    self.full = true;
                    self.dropped += 1;
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// What tshark recognised in a capture.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TsharkSummary {
    /// Frames in the capture.
    pub frames: u64,
    /// Frames with an MPA Request.
    pub mpa_requests: u64,
    /// Frames with an MPA Reply.
    pub mpa_replies: u64,
    /// Frames with at least one FPDU.
    pub fpdu_frames: u64,
    /// Frames the DDP/RDMAP dissector decoded.
    pub ddp_frames: u64,
    /// Frames with an FPDU whose CRC tshark found bad (only when it checks CRCs).
    pub bad_crc_frames: u64,
    /// Frames tshark marked malformed (`_ws.malformed`).
    pub malformed: u64,
    /// Frames with an expert-info error (`_ws.expert.severity == error`).
    pub expert_errors: u64,
}

/// Errors of [`tshark_summary`].
#[derive(Debug, thiserror::Error)]
pub enum TsharkError {
    /// tshark is not installed (`apt-get install tshark`).
    #[error("tshark not found: {0}")]
    NotInstalled(#[source] io::Error),
    /// tshark failed.
    #[error("`tshark {args}` failed: {stderr}")]
    Failed {
        /// Its arguments.
        args: String,
        /// Its stderr.
        stderr: String,
    },
}

/// `PI_ERROR`, the expert-info severity of errors (epan/proto.h).
const PI_ERROR: u64 = 0x0080_0000;

fn tshark(args: &[String]) -> Result<String, TsharkError> {
    let out = Command::new("tshark")
        .args(args)
        .output()
        .map_err(TsharkError::NotInstalled)?;
    // tshark warns on stderr when run as root; only the exit status tells a failure.
    if !out.status.success() {
        return Err(TsharkError::Failed {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs tshark over `path` and counts iWARP frames and problems (see [`TsharkSummary`]):
/// one pass printing the fields of every frame, one printing the MPA layer of each MPA
/// frame in detail (tshark 4.0 has no field for a failed CRC check, only the text "Bad
/// CRC32"). The MPA dissector is heuristic: the capture must include the MPA
/// Request/Reply for the FPDUs behind them to be recognised.
///
/// Errors: tshark missing or failing.
pub fn tshark_summary(path: &Path) -> Result<TsharkSummary, TsharkError> {
    let file = path.display().to_string();
    let mut args: Vec<String> = [
        "-n",
        "-r",
        &file,
        "-T",
        "fields",
        "-E",
        "separator=|",
        "-E",
        "occurrence=a",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for f in [
        "frame.number",
        "iwarp_mpa.key.req",
        "iwarp_mpa.key.rep",
        "iwarp_mpa.fpdu",
        "iwarp_ddp_rdmap",
        "_ws.malformed",
        "_ws.expert.severity",
    ] {
        args.push("-e".into());
        args.push(f.into());
    }
    let mut s = TsharkSummary::default();
    for line in tshark(&args)?.lines() {
        let f: Vec<&str> = line.split('|').collect();
        if f.len() < 7 {
            continue;
        }
        let has = |i: usize| !f[i].is_empty();
        s.frames += 1;
        s.mpa_requests += u64::from(has(1));
        s.mpa_replies += u64::from(has(2));
        s.fpdu_frames += u64::from(has(3));
        s.ddp_frames += u64::from(has(4));
        s.malformed += u64::from(has(5));
        let error = f[6]
            .split(',')
            .filter_map(|v| v.trim().parse::<u64>().ok())
            .any(|v| v >= PI_ERROR);
        s.expert_errors += u64::from(error);
    }
    let detail: Vec<String> = ["-n", "-r", &file, "-Y", "iwarp_mpa.fpdu", "-O", "iwarp_mpa"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let text = tshark(&detail)?;
    // One "Frame N:" line per frame; count frames with at least one bad CRC.
    let mut bad_in_frame = false;
    for line in text.lines() {
        if line.starts_with("Frame ") {
            s.bad_crc_frames += u64::from(bad_in_frame);
            bad_in_frame = false;
        } else if line.contains("Bad CRC32") {
            bad_in_frame = true;
        }
    }
    s.bad_crc_frames += u64::from(bad_in_frame);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(len: usize, fill: u8) -> Vec<u8> {
        let mut r = vec![0u8; 8];
        r.extend_from_slice(&(len as u32).to_le_bytes());
        r.extend_from_slice(&(len as u32).to_le_bytes());
        r.extend(std::iter::repeat_n(fill, len));
        r
    }

    fn global() -> Vec<u8> {
        let mut g = 0xa1b2_c3d4u32.to_le_bytes().to_vec();
        g.extend_from_slice(&[2, 0, 4, 0]);
        g.extend_from_slice(&[0; 16]);
        g
    }

    #[test]
    fn keeps_whole_records_up_to_the_cap_whatever_the_chunking() {
        let mut stream = global();
        for i in 0..10u8 {
            stream.extend(record(100 + usize::from(i), i));
        }
        // 24 + 116 + 117 + 118 = 375 fits in 400; the fourth record (119 + 16) does not.
        for chunk in [1usize, 3, 7, 16, 50, 1000] {
            let mut w = CappedPcap::new(Vec::new(), 400);
            for c in stream.chunks(chunk) {
                w.write_all(c).unwrap();
            }
            assert_eq!(w.records_kept(), 3, "chunk {chunk}");
            assert_eq!(w.records_dropped(), 7);
            assert_eq!(w.bytes_written(), 375);
            let out = w.into_inner();
            assert_eq!(out[..], stream[..375], "chunk {chunk}");
        }
    }

    #[test]
    fn a_large_cap_passes_everything_and_big_endian_is_read() {
        let mut stream = 0xa1b2_c3d4u32.to_be_bytes().to_vec();
        stream.extend_from_slice(&[0; 20]);
        let mut rec = vec![0u8; 8];
        rec.extend_from_slice(&5u32.to_be_bytes());
        rec.extend_from_slice(&5u32.to_be_bytes());
        rec.extend_from_slice(b"hello");
        stream.extend_from_slice(&rec);
        stream.extend_from_slice(&rec);
        let mut w = CappedPcap::new(Vec::new(), 1 << 20);
        w.write_all(&stream).unwrap();
        assert_eq!(w.records_kept(), 2);
        assert_eq!(w.into_inner(), stream);
        // Cap between the two records.
        let mut w = CappedPcap::new(Vec::new(), 24 + 21 + 10);
        w.write_all(&stream).unwrap();
        assert_eq!((w.records_kept(), w.records_dropped()), (1, 1));
    }

    #[test]
    fn stale_files_of_dead_processes_are_removed() {
        let dir = std::env::temp_dir().join(format!("sw-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Pid 0x7fffffff never exists (above pid_max); ours does.
        let dead = dir.join("cap-2147483647x0.pcap");
        let live = dir.join(format!("cap-{}x0.pcap", std::process::id()));
        let other = dir.join("unrelated-2147483647x0.pcap");
        for f in [&dead, &live, &other] {
            std::fs::write(f, b"x").unwrap();
        }
        assert_eq!(remove_stale_files(&dir, "cap-"), vec![dead.clone()]);
        assert!(!dead.exists() && live.exists() && other.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tshark_on_a_kernel_siw_capture() {
        let pcap = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/pcaps/rping-srv_crc-cli_crc.pcap");
        if Command::new("tshark").arg("-v").output().is_err() {
            // CI installs tshark (.ci/run); elsewhere it is optional.
            assert!(std::env::var_os("CI").is_none(), "tshark missing in CI");
            eprintln!("skipping: tshark not installed");
            return;
        }
        let s = tshark_summary(&pcap).unwrap();
        assert_eq!((s.mpa_requests, s.mpa_replies), (1, 1), "{s:?}");
        assert!(s.fpdu_frames > 0 && s.ddp_frames > 0, "{s:?}");
        assert_eq!(
            (s.malformed, s.bad_crc_frames, s.expert_errors),
            (0, 0, 0),
            "{s:?}"
        );
        // The capture with a corrupted CRC is flagged.
        let bad = pcap.with_file_name("bad-crc.pcap");
        let b = tshark_summary(&bad).unwrap();
        assert_eq!(b.bad_crc_frames, 1, "{b:?}");
        assert_eq!(b.malformed, 0, "{b:?}");
    }
}
