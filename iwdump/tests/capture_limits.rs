//! The real siw capture `rping.pcap`, edited the ways a capture can lie about or
//! lose TCP data: a FIN in the middle of the data (data past it), a snapshot
//! length that cuts payloads or TCP headers, a record whose captured length
//! exceeds its original length, IP length fields that do not match the frame.
//! Each must show up in the report (an error naming the frame, exit status 1,
//! or a warning), never be decoded as if complete, never be dropped silently.

mod common;

use std::path::PathBuf;
use std::process::Command;

use iwdump::report::ErrorKind;

/// Offsets inside an rping.pcap frame (Ethernet, IPv4 without options).
const IP: usize = 14;
const TCP: usize = 14 + 20;

/// The records of a legacy little-endian pcap: (record header, frame bytes).
struct Records {
    header: Vec<u8>,
    records: Vec<([u8; 16], Vec<u8>)>,
}

impl Records {
    fn read(name: &str) -> Records {
        let bytes = std::fs::read(common::pcap(name)).unwrap();
        assert_eq!(
            &bytes[..4],
            &0xa1b2_c3d4u32.to_le_bytes(),
            "little-endian pcap"
        );
        let mut records = Vec::new();
        let mut at = 24;
        while at < bytes.len() {
            let rh: [u8; 16] = bytes[at..at + 16].try_into().unwrap();
            let incl = u32::from_le_bytes(rh[8..12].try_into().unwrap()) as usize;
            records.push((rh, bytes[at + 16..at + 16 + incl].to_vec()));
            at += 16 + incl;
        }
        Records {
            header: bytes[..24].to_vec(),
            records,
        }
    }

    /// Frame `n` (1-based, as in the report).
    fn frame(&mut self, n: usize) -> &mut Vec<u8> {
        &mut self.records[n - 1].1
    }

    /// Cut every frame to `snaplen` octets, keeping the original lengths (what
    /// `tcpdump -s snaplen` writes).
    fn snap(&mut self, snaplen: usize) {
        self.header[16..20].copy_from_slice(&(snaplen as u32).to_le_bytes());
        for (rh, data) in &mut self.records {
            data.truncate(snaplen);
            rh[8..12].copy_from_slice(&(data.len() as u32).to_le_bytes());
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = self.header.clone();
        for (rh, data) in &self.records {
            let mut rh = *rh;
            rh[8..12].copy_from_slice(&(data.len() as u32).to_le_bytes());
            out.extend_from_slice(&rh);
            out.extend_from_slice(data);
        }
        out
    }

    fn dissect(&self) -> iwdump::Report {
        iwdump::dissect(&self.bytes()).unwrap()
    }

    /// The exit status of the `iwdump` binary on these records.
    fn exit_status(&self, name: &str) -> Option<i32> {
        let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
        std::fs::write(&p, self.bytes()).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_iwdump"))
            .arg(&p)
            .output()
            .expect("run iwdump");
        out.status.code()
    }
}

/// Frames carrying TCP payload (IPv4 total length over the IPv4 and TCP
/// headers), 1-based.
fn data_frames(r: &Records) -> Vec<usize> {
    (1..=r.records.len())
        .filter(|&n| {
            let f = &r.records[n - 1].1;
            let total = usize::from(u16::from_be_bytes([f[IP + 2], f[IP + 3]]));
            f[IP + 9] == 6 && total > 20 + usize::from(f[TCP + 12] >> 4) * 4
        })
        .collect()
}

fn kinds(r: &iwdump::Report) -> Vec<ErrorKind> {
    r.errors.iter().map(|e| e.kind).collect()
}

#[test]
fn unedited_capture_is_clean() {
    let r = Records::read("rping.pcap");
    let report = r.dissect();
    assert!(report.is_clean(), "{:?}", report.errors);
    assert_eq!(report.fpdus, 70);
    assert!(report.warnings.is_empty());
    assert_eq!(data_frames(&r).len(), 72);
}

/// A FIN set on frame 51 (a Send from the server, ending at stream offset
/// 1156): the server's 19 later data frames lie past the end of its stream.
/// Each is an error of kind `tcp` naming its frame; none is decoded.
#[test]
fn data_after_fin_is_an_error() {
    let mut r = Records::read("rping.pcap");
    let f = r.frame(51);
    assert_eq!(f[TCP + 13], 0x18, "frame 51: PSH ACK");
    assert_eq!(&f[TCP..TCP + 2], &7174u16.to_be_bytes(), "from the server");
    f[TCP + 13] |= 0x01;
    let report = r.dissect();
    assert!(!report.is_clean());
    assert_eq!(kinds(&report), vec![ErrorKind::Tcp; 19]);
    let first = &report.errors[0];
    assert_eq!(first.frame, Some(53));
    assert_eq!(first.tcp_id, Some(0));
    assert_eq!(first.src, Some("10.77.0.1:7174".parse().unwrap()));
    assert_eq!(first.offset, Some(1156));
    assert_eq!(
        first.message,
        "40 octets of TCP data past the FIN at stream offset 1156 (frame 51); not decoded"
    );
    assert_eq!(report.errors[1].frame, Some(55));
    assert_eq!(report.errors[1].offset, Some(1196));
    // Only what came before the FIN is decoded: 30 + 21 FPDUs of 70.
    assert_eq!(report.fpdus, 51);
    let c = &report.connections[0];
    assert_eq!((c.fpdus_from_initiator, c.fpdus_from_responder), (30, 21));
    assert!(report
        .fpdu_records()
        .all(|(p, _)| p.src.port() != 7174 || p.frame <= 51));
    let json = report.to_json(false);
    assert!(json.contains("\"kind\": \"tcp\""), "{json}");
    assert!(report.to_text(false).contains(
        "error: frame 53, 10.77.0.1:7174 -> 10.77.0.2:42307, stream offset 1156: 40 octets"
    ));
    assert_eq!(r.exit_status("fin-mid.pcap"), Some(1));
}

/// Snapshot length 66 = Ethernet + IPv4 + TCP with timestamps: every payload
/// octet is cut. Each of the 72 data frames is a `truncated` error naming it;
/// nothing is decoded (before: "no payload", exit status 0).
#[test]
fn snaplen_cutting_every_payload_is_an_error_per_frame() {
    let mut r = Records::read("rping.pcap");
    let frames = data_frames(&r);
    r.snap(66);
    let report = r.dissect();
    assert_eq!(kinds(&report), vec![ErrorKind::Truncated; 72]);
    let named: Vec<usize> = report
        .errors
        .iter()
        .map(|e| e.frame.unwrap() as usize)
        .collect();
    assert_eq!(named, frames);
    let first = &report.errors[0];
    assert_eq!((first.frame, first.offset), (Some(6), Some(0)));
    assert_eq!(
        first.message,
        "TCP payload cut by the capture's snapshot length (66 of 90 frame octets captured): \
         0 of 24 payload octets captured; the rest is a hole in the stream, not data"
    );
    assert_eq!(report.fpdus, 0);
    assert!(report.connections.is_empty());
    assert_eq!(report.skipped.len(), 1);
    assert!(
        report.skipped[0]
            .reason
            .contains("72 frames cut by the capture"),
        "{}",
        report.skipped[0].reason
    );
    assert_eq!(r.exit_status("snap66.pcap"), Some(1));
}

/// Snapshot length 120: the MPA frames and the small FPDUs are whole, the
/// 84-octet Read Response of frame 12 is cut after 54 octets. That frame is
/// an error at the first missing octet (stream offset 64 + 54 = 118), and
/// its FPDU is not decoded from the partial octets.
#[test]
fn snaplen_cutting_some_payloads() {
    let mut r = Records::read("rping.pcap");
    r.snap(120);
    let report = r.dissect();
    let cut: Vec<_> = report
        .errors
        .iter()
        .filter(|e| e.kind == ErrorKind::Truncated)
        .collect();
    assert_eq!(cut[0].frame, Some(12));
    assert_eq!(cut[0].offset, Some(118));
    assert!(cut[0].message.contains("54 of 84 payload octets captured"));
    // Every cut frame is named; the rest are the holes they leave.
    assert!(report
        .errors
        .iter()
        .all(|e| matches!(e.kind, ErrorKind::Truncated | ErrorKind::MissingData)));
    // Decoded: the whole FPDUs in front of the first hole of each direction
    // (frames 10, 11 and 13), nothing from frame 12's partial octets on.
    let decoded: Vec<u64> = report.fpdu_records().map(|(p, _)| p.frame).collect();
    assert_eq!(decoded, vec![10, 11, 13]);
    assert_eq!(r.exit_status("snap120.pcap"), Some(1));
}

/// Snapshot length 54 cuts inside the 32-octet TCP header (options): the
/// segments are still tracked (ports, sequence numbers, flags) and every data
/// frame is a `truncated` error (before: 90 warnings, no connection, exit 0).
#[test]
fn snaplen_cutting_the_tcp_header() {
    let mut r = Records::read("rping.pcap");
    let frames = data_frames(&r);
    r.snap(54);
    let report = r.dissect();
    assert_eq!(report.tcp_connections, 1);
    assert_eq!(kinds(&report), vec![ErrorKind::Truncated; 72]);
    assert_eq!(
        report
            .errors
            .iter()
            .map(|e| e.frame.unwrap() as usize)
            .collect::<Vec<_>>(),
        frames
    );
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    // Cut inside the first 14 octets of the TCP header: no sequence number or
    // flags; still an error naming the frame.
    let mut r = Records::read("rping.pcap");
    r.frame(10).truncate(TCP + 10);
    let report = r.dissect();
    let e = report
        .errors
        .iter()
        .find(|e| e.frame == Some(10) && e.kind == ErrorKind::Truncated)
        .expect("frame 10 reported");
    assert_eq!(e.tcp_id, None);
    assert!(e
        .message
        .starts_with("TCP header cut by the capture: 10 of its first 14"));
}

/// An IPv4 total length beyond the frame (incl_len = orig_len): the payload is
/// incomplete as far as the IP header tells; a `truncated` error.
#[test]
fn ip_total_length_beyond_the_frame() {
    let mut r = Records::read("rping.pcap");
    r.frame(19)[IP + 2..IP + 4].copy_from_slice(&0xffffu16.to_be_bytes());
    let report = r.dissect();
    assert_eq!(kinds(&report), vec![ErrorKind::Truncated]);
    let e = &report.errors[0];
    assert_eq!(e.frame, Some(19));
    assert!(
        e.message
            .contains("the IP length field claims more octets than the frame holds"),
        "{}",
        e.message
    );
    assert!(e.message.contains("52 of 65483 payload octets captured"));
}

/// incl_len > orig_len and an IPv4 total length under the header are warnings
/// naming the frame; decoding goes on (exit status 0).
#[test]
fn odd_lengths_are_warnings() {
    let mut r = Records::read("rping.pcap");
    r.records[30].0[12..16].copy_from_slice(&10u32.to_le_bytes());
    r.frame(19)[IP + 2..IP + 4].copy_from_slice(&10u16.to_be_bytes());
    let report = r.dissect();
    assert!(report.is_clean(), "{:?}", report.errors);
    assert_eq!(report.fpdus, 70);
    let w: Vec<_> = report
        .warnings
        .iter()
        .map(|w| (w.frame, w.message.as_str()))
        .collect();
    assert_eq!(
        w,
        vec![
            (
                Some(19),
                "IPv4 total length 10 is smaller than its 20-octet header \
                 (payload taken from the captured octets)"
            ),
            (
                Some(31),
                "captured length 150 exceeds the original length 10 (corrupt record)"
            ),
        ]
    );
    assert_eq!(r.exit_status("odd-lengths.pcap"), Some(0));
}

/// A connection that is not MPA (here: rping.pcap with the Request key
/// spoiled) is not iwdump's business: its cut frames and data past its FIN
/// are warnings naming the frame, not errors.
#[test]
fn non_mpa_connections_get_warnings_only() {
    let mut r = Records::read("rping.pcap");
    let at = TCP + 32;
    assert_eq!(&r.frame(6)[at..at + 16], b"MPA ID Req Frame");
    r.frame(6)[at] = b'X';
    r.frame(51)[TCP + 13] |= 0x01;
    let cut = r.frame(12).len() - 30;
    r.frame(12).truncate(cut);
    let report = r.dissect();
    assert!(report.is_clean(), "{:?}", report.errors);
    assert_eq!(report.skipped.len(), 1);
    let w: Vec<_> = report
        .warnings
        .iter()
        .filter(|w| w.message.contains("(not MPA)"))
        .collect();
    assert_eq!(w.len(), 1 + 19);
    assert_eq!(w[0].frame, Some(12));
    assert!(w[0].message.contains("54 of 84 payload octets captured"));
    assert!(w[1]
        .message
        .contains("past the FIN at stream offset 1156 (frame 51)"));
}
