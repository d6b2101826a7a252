//! The result of a dissection: [`Report`], serde-serializable (the `--json` output)
//! and printable as text (the default output).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;

use serde::Serialize;

use crate::capture::Format;

/// Everything iwdump found in one capture.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Container format, when the input was recognised.
    pub format: Option<Format>,
    /// Frames read.
    pub frames: u64,
    /// TCP connections seen (MPA or not).
    pub tcp_connections: usize,
    /// The MPA connections, in order of first appearance.
    pub connections: Vec<MpaConnectionInfo>,
    /// TCP connections that were not decoded, with the reason (no MPA Request key
    /// at the start of the stream, ...). Not errors.
    pub skipped: Vec<SkippedConnection>,
    /// FPDUs decoded (good or bad CRC), all connections and directions.
    pub fpdus: u64,
    /// FPDUs per RDMAP opcode name (`Write`, `ReadRequest`, `Send`, ...).
    pub opcodes: BTreeMap<String, u64>,
    /// Complete messages per RDMAP opcode name: FPDUs whose DDP segment has the
    /// Last flag set.
    pub messages: BTreeMap<String, u64>,
    /// Protocol errors: bad CRC, bad length, unknown opcode, bad marker, malformed
    /// MPA frame, missing TCP data, data past a FIN, a stream or frame cut short,
    /// truncated capture. Empty for a clean capture.
    pub errors: Vec<ErrorRecord>,
    /// Oddities that are not protocol errors (undecodable non-iWARP frames, a
    /// capture ending inside an FPDU without a FIN, a record whose captured
    /// length exceeds its original length, an IPv4 total length smaller than
    /// its header, truncated frames or data past a FIN of a connection that is
    /// not MPA, ...).
    pub warnings: Vec<WarningRecord>,
    /// Every MPA frame and FPDU, in the order they were decoded (frame order).
    /// Left out of the JSON output unless asked for (see [`Report::to_json`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pdus: Vec<PduRecord>,
}

/// One MPA connection: its endpoints and the Request/Reply exchange.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MpaConnectionInfo {
    /// Index of the TCP connection (order of first appearance in the capture).
    pub tcp_id: usize,
    /// The MPA initiator (sender of the Request) address and port.
    pub initiator: SocketAddr,
    /// The MPA responder (sender of the Reply) address and port.
    pub responder: SocketAddr,
    /// The Request, once decoded.
    pub request: Option<MpaFrameInfo>,
    /// The Reply (or Reject), once decoded.
    pub reply: Option<MpaFrameInfo>,
    /// Whether FPDUs carry a CRC32c (negotiated: on when either side sets C).
    pub crc: Option<bool>,
    /// Whether the initiator-to-responder direction carries markers.
    pub markers_to_responder: Option<bool>,
    /// Whether the responder-to-initiator direction carries markers.
    pub markers_to_initiator: Option<bool>,
    /// FPDUs sent by the initiator.
    pub fpdus_from_initiator: u64,
    /// FPDUs sent by the responder.
    pub fpdus_from_responder: u64,
}

/// The fields of one MPA Request or Reply (RFC 5044 7.1, RFC 6581).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MpaFrameInfo {
    /// Frame that completed the MPA frame.
    pub frame: u64,
    /// MPA revision (1 or 2).
    pub revision: u8,
    /// M: markers wanted in the data this sender receives.
    pub markers: bool,
    /// C: CRC wanted.
    pub crc: bool,
    /// R: reject (Reply only).
    pub reject: bool,
    /// RFC 6581 enhanced connection establishment (0x10): IRD/ORD word present.
    pub enhanced: bool,
    /// The other flag bits (reserved), as a number; 0 normally.
    pub reserved_flags: u8,
    /// Private data length field, octets (including the IRD/ORD word when enhanced).
    pub private_data_len: u16,
    /// Rev 2 enhanced only: the IRD/ORD words as on the wire, `"8001 c001"`.
    pub ird_ord_words: Option<String>,
    /// Rev 2 enhanced only: IRD (14 bits; 0x3FFF = no limit).
    pub ird: Option<u16>,
    /// Rev 2 enhanced only: ORD (14 bits; 0x3FFF = no limit).
    pub ord: Option<u16>,
    /// Rev 2 enhanced only: A, peer-to-peer mode.
    pub p2p: Option<bool>,
    /// Rev 2 enhanced only: B, zero-length Send RTR offered/chosen.
    pub rtr_send: Option<bool>,
    /// Rev 2 enhanced only: C, zero-length Write RTR offered/chosen.
    pub rtr_write: Option<bool>,
    /// Rev 2 enhanced only: D, zero-length Read RTR offered/chosen.
    pub rtr_read: Option<bool>,
}

/// A TCP connection that was not decoded as MPA.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedConnection {
    /// Index of the TCP connection.
    pub tcp_id: usize,
    /// Client (SYN sender, else first sender seen).
    pub client: SocketAddr,
    /// Server.
    pub server: SocketAddr,
    /// Why it was skipped.
    pub reason: String,
}

/// What kind of error an [`ErrorRecord`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The CRC32c of an FPDU does not match.
    Crc,
    /// An FPDU's ULPDU length is impossible (zero), or the ULPDU is too short or
    /// too long for its DDP/RDMAP headers.
    Length,
    /// A marker's FPDU pointer is wrong.
    Marker,
    /// The MPA Request or Reply is malformed.
    MpaFrame,
    /// Unknown RDMAP opcode, or an opcode on the wrong DDP buffer model.
    Opcode,
    /// DDP or RDMAP header invalid otherwise: bad version, a single-segment
    /// message without L or with a non-zero MO, ...
    Ddp,
    /// TCP data missing from the capture (a gap that never filled).
    MissingData,
    /// TCP misuse: data past the FIN of its direction (RFC 9293: a FIN ends
    /// the sender's data). The data is not decoded.
    Tcp,
    /// A stream ended (FIN or RST) inside an FPDU, or a frame's TCP payload
    /// (or header) was cut short in the capture: by the snapshot length
    /// (incl_len < orig_len) or by an IP length beyond the captured octets.
    /// The missing octets are a hole in the stream, not data.
    Truncated,
    /// The capture file itself is truncated or malformed after some frames.
    Capture,
}

/// One error, located as precisely as possible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorRecord {
    /// Frame that carried the offending octet (`None` when it was never captured).
    pub frame: Option<u64>,
    /// Index of the TCP connection, when the error belongs to one.
    pub tcp_id: Option<usize>,
    /// Sender, when the error belongs to a stream.
    pub src: Option<SocketAddr>,
    /// Receiver, when the error belongs to a stream.
    pub dst: Option<SocketAddr>,
    /// Stream offset (octets since ISN+1) of the offending PDU's first octet.
    pub offset: Option<u64>,
    /// Category.
    pub kind: ErrorKind,
    /// What is wrong, in words.
    pub message: String,
}

/// A remark that is not an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WarningRecord {
    /// Frame concerned, if any.
    pub frame: Option<u64>,
    /// What happened, in words.
    pub message: String,
}

/// CRC state of an FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CrcStatus {
    /// CRC negotiated and correct.
    Good,
    /// CRC negotiated and wrong.
    Bad,
    /// CRC not negotiated (the field is present but not checked).
    Off,
}

/// DDP header fields of an FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "model", rename_all = "lowercase")]
pub enum DdpInfo {
    /// Tagged buffer model.
    Tagged {
        /// Steering tag.
        stag: u32,
        /// Tagged offset, octets.
        to: u64,
    },
    /// Untagged buffer model.
    Untagged {
        /// Queue number (0 Send, 1 Read Request, 2 Terminate).
        qn: u32,
        /// Message sequence number (from 1).
        msn: u32,
        /// Message offset, octets.
        mo: u32,
    },
}

/// What kind of PDU a [`PduRecord`] describes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PduKind {
    /// An MPA Request.
    MpaRequest(MpaFrameInfo),
    /// An MPA Reply (or Reject when its R flag is set).
    MpaReply(MpaFrameInfo),
    /// An FPDU.
    Fpdu(FpduInfo),
}

/// The fields of one FPDU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FpduInfo {
    /// RDMAP opcode name as `ddp_rdmap::Opcode::name` spells it (`Write`,
    /// `ReadRequest`, `ReadResponse`, `Send`, `SendInvalidate`, `SendSE`,
    /// `SendSEInvalidate`, `Terminate`, `ImmediateData`, ...), or `Unknown(0xN)`.
    pub opcode: String,
    /// DDP Last flag.
    pub last: bool,
    /// DDP header fields; `None` when the ULPDU could not be decoded.
    pub ddp: Option<DdpInfo>,
    /// MPA ULPDU length field, octets (DDP header + payload).
    pub ulpdu_len: u16,
    /// Payload octets after the DDP/RDMAP headers.
    pub payload_len: usize,
    /// CRC state.
    pub crc: CrcStatus,
    /// The PAD octets are not all zero (RFC 5044 4.1: MUST be zero on transmit;
    /// harmless, Linux siw does it). Also listed in [`Report::warnings`].
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pad_nonzero: bool,
    /// Opcode-specific details (Read Request fields, Terminate codes, RFC 7306 Atomic
    /// Request operation and operands, Atomic Response identifier and original value),
    /// in words.
    pub detail: Option<String>,
}

/// One decoded MPA frame or FPDU, located in its stream and capture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PduRecord {
    /// Frame that carried the PDU's last octet (where decoding completed).
    pub frame: u64,
    /// Frame that carried its first octet.
    pub first_frame: u64,
    /// Index of the TCP connection.
    pub tcp_id: usize,
    /// Sender.
    pub src: SocketAddr,
    /// Receiver.
    pub dst: SocketAddr,
    /// Stream offset of the PDU's first octet (octets since ISN+1).
    pub offset: u64,
    /// Octets the PDU occupies in the stream (for an FPDU: length field, ULPDU, pad,
    /// CRC and any markers inside it).
    pub wire_len: u64,
    /// The PDU.
    #[serde(flatten)]
    pub kind: PduKind,
}

impl Report {
    /// Whether no error was found (exit status 0).
    pub fn is_clean(&self) -> bool {
        self.errors.is_empty()
    }

    /// The FPDU records only.
    pub fn fpdu_records(&self) -> impl Iterator<Item = (&PduRecord, &FpduInfo)> {
        self.pdus.iter().filter_map(|p| match &p.kind {
            PduKind::Fpdu(f) => Some((p, f)),
            _ => None,
        })
    }

    /// The report as pretty JSON; per-PDU records are included only when
    /// `with_pdus` (they are long).
    pub fn to_json(&self, with_pdus: bool) -> String {
        let result = if with_pdus || self.pdus.is_empty() {
            serde_json::to_string_pretty(self)
        } else {
            let short = Report {
                pdus: Vec::new(),
                ..self.clone()
            };
            serde_json::to_string_pretty(&short)
        };
        // Plain data with string map keys: serialization cannot fail.
        result.unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// The default text output: one line per MPA frame and FPDU, then a summary.
    /// `verbose` adds connection details and warnings.
    pub fn to_text(&self, verbose: bool) -> String {
        let mut s = String::new();
        for p in &self.pdus {
            let _ = writeln!(s, "{}", pdu_line(p));
        }
        if !self.pdus.is_empty() {
            s.push('\n');
        }
        let _ = writeln!(
            s,
            "{} frames, {} TCP connections, {} MPA connections, {} skipped, {} FPDUs, {} errors",
            self.frames,
            self.tcp_connections,
            self.connections.len(),
            self.skipped.len(),
            self.fpdus,
            self.errors.len()
        );
        for c in &self.connections {
            let _ = write!(
                s,
                "  MPA #{} {} -> {}: CRC {}, markers {}/{}, FPDUs {} + {}",
                c.tcp_id,
                c.initiator,
                c.responder,
                onoff(c.crc),
                onoff(c.markers_to_responder),
                onoff(c.markers_to_initiator),
                c.fpdus_from_initiator,
                c.fpdus_from_responder
            );
            if verbose {
                if let Some(r) = &c.request {
                    let _ = write!(s, "; request [{}]", mpa_fields(r));
                }
                if let Some(r) = &c.reply {
                    let _ = write!(s, "; reply [{}]", mpa_fields(r));
                }
            }
            s.push('\n');
        }
        for k in &self.skipped {
            let _ = writeln!(
                s,
                "  skipped TCP #{} {} -> {}: {}",
                k.tcp_id, k.client, k.server, k.reason
            );
        }
        let _ = writeln!(s, "  FPDUs per opcode:    {}", counts(&self.opcodes));
        let _ = writeln!(s, "  messages per opcode: {}", counts(&self.messages));
        for e in &self.errors {
            let _ = writeln!(s, "  error: {}", error_line(e));
        }
        if verbose {
            for w in &self.warnings {
                match w.frame {
                    Some(f) => {
                        let _ = writeln!(s, "  warning: frame {f}: {}", w.message);
                    }
                    None => {
                        let _ = writeln!(s, "  warning: {}", w.message);
                    }
                }
            }
        } else if !self.warnings.is_empty() {
            let _ = writeln!(s, "  {} warnings (-v shows them)", self.warnings.len());
        }
        s
    }
}

fn onoff(b: Option<bool>) -> &'static str {
    match b {
        Some(true) => "on",
        Some(false) => "off",
        None => "?",
    }
}

fn counts(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "-".to_string();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `rev 2 flags [C enhanced] IRD 1 ORD 1 P2P RTR [write,read] pd 4`.
fn mpa_fields(m: &MpaFrameInfo) -> String {
    let mut flags = Vec::new();
    if m.markers {
        flags.push("M");
    }
    if m.crc {
        flags.push("C");
    }
    if m.reject {
        flags.push("R");
    }
    if m.enhanced {
        flags.push("enhanced");
    }
    let mut s = format!("rev {} flags [{}]", m.revision, flags.join(" "));
    if m.reserved_flags != 0 {
        let _ = write!(s, " reserved 0x{:02x}", m.reserved_flags);
    }
    if let (Some(ird), Some(ord)) = (m.ird, m.ord) {
        let _ = write!(s, " IRD {ird} ORD {ord}");
        if m.p2p == Some(true) {
            s.push_str(" P2P");
        }
        let rtr: Vec<&str> = [
            (m.rtr_send, "send"),
            (m.rtr_write, "write"),
            (m.rtr_read, "read"),
        ]
        .iter()
        .filter(|(b, _)| *b == Some(true))
        .map(|(_, n)| *n)
        .collect();
        if !rtr.is_empty() {
            let _ = write!(s, " RTR [{}]", rtr.join(","));
        }
        if let Some(w) = &m.ird_ord_words {
            let _ = write!(s, " ({w})");
        }
    }
    let _ = write!(s, " pd_len {}", m.private_data_len);
    s
}

/// One output line for a PDU.
pub fn pdu_line(p: &PduRecord) -> String {
    let head = format!("{:>6}  {} -> {}  ", p.frame, p.src, p.dst);
    match &p.kind {
        PduKind::MpaRequest(m) => format!("{head}MPA Request  {}", mpa_fields(m)),
        PduKind::MpaReply(m) => format!(
            "{head}MPA {}  {}",
            if m.reject { "Reject" } else { "Reply" },
            mpa_fields(m)
        ),
        PduKind::Fpdu(f) => {
            let ddp = match f.ddp {
                Some(DdpInfo::Tagged { stag, to }) => format!("STag 0x{stag:08x} TO 0x{to:x}"),
                Some(DdpInfo::Untagged { qn, msn, mo }) => format!("QN {qn} MSN {msn} MO {mo}"),
                None => "(malformed)".to_string(),
            };
            let crc = match f.crc {
                CrcStatus::Good => "good",
                CrcStatus::Bad => "BAD",
                CrcStatus::Off => "off",
            };
            let mut line = format!(
                "{head}{}  {ddp} L={} ulpdu {} payload {} CRC {crc}",
                f.opcode,
                u8::from(f.last),
                f.ulpdu_len,
                f.payload_len
            );
            if let Some(d) = &f.detail {
                let _ = write!(line, "  {d}");
            }
            line
        }
    }
}

/// One line describing an error.
pub fn error_line(e: &ErrorRecord) -> String {
    let mut s = String::new();
    match e.frame {
        Some(f) => {
            let _ = write!(s, "frame {f}");
        }
        None => s.push_str("frame ?"),
    }
    if let (Some(a), Some(b)) = (e.src, e.dst) {
        let _ = write!(s, ", {a} -> {b}");
    }
    if let Some(o) = e.offset {
        let _ = write!(s, ", stream offset {o}");
    }
    let _ = write!(s, ": {}", e.message);
    s
}
