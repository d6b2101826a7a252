//! Every FPDU of every capture in `shared/pcaps` (Linux siw talking to itself):
//! each ULPDU parses, and emitting the parse result reproduces its bytes exactly.
//! The captures are found at `$SOFTIWARP_PCAPS`, or `../shared/pcaps` next to the
//! workspace; if they are absent the test says so and passes.

use ddp_rdmap::{Body, Opcode, Ulpdu};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn pcap_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("SOFTIWARP_PCAPS") {
        return Some(PathBuf::from(d));
    }
    let ws = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let d = ws.join("shared/pcaps");
    d.is_dir().then_some(d)
}

fn be16(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([b[at], b[at + 1]]))
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// One TCP direction: (src ip, src port, dst ip, dst port).
type FlowKey = ([u8; 4], u16, [u8; 4], u16);

/// Per TCP direction: the in-order byte stream.
fn streams(pcap: &[u8]) -> BTreeMap<FlowKey, Vec<u8>> {
    let le = pcap[..4] == [0xd4, 0xc3, 0xb2, 0xa1];
    let rd = |at: usize| {
        let b = [pcap[at], pcap[at + 1], pcap[at + 2], pcap[at + 3]];
        if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    let mut next: BTreeMap<_, u32> = BTreeMap::new();
    let mut data: BTreeMap<_, Vec<u8>> = BTreeMap::new();
    let mut off = 24;
    while off + 16 <= pcap.len() {
        let incl = rd(off + 8) as usize;
        let f = &pcap[off + 16..off + 16 + incl];
        off += 16 + incl;
        if f.len() < 34 || f[12..14] != [0x08, 0x00] || f[23] != 6 {
            continue;
        }
        let ip = &f[14..];
        let ihl = usize::from(ip[0] & 0xf) * 4;
        let tot = be16(ip, 2);
        let tcp = &ip[ihl..tot];
        let key = (
            [ip[12], ip[13], ip[14], ip[15]],
            be16(tcp, 0) as u16,
            [ip[16], ip[17], ip[18], ip[19]],
            be16(tcp, 2) as u16,
        );
        let seq = be32(tcp, 4);
        let doff = usize::from(tcp[12] >> 4) * 4;
        let payload = &tcp[doff..];
        if tcp[13] & 0x02 != 0 {
            next.insert(key, seq.wrapping_add(1));
            continue;
        }
        let Some(exp) = next.get_mut(&key) else {
            continue;
        };
        // Keep only new in-order bytes (the captures have no loss).
        let skip = exp.wrapping_sub(seq) as usize;
        if payload.is_empty() || skip >= payload.len() || skip > 1 << 30 {
            continue;
        }
        data.entry(key)
            .or_default()
            .extend_from_slice(&payload[skip..]);
        *exp = seq.wrapping_add(payload.len() as u32);
    }
    data
}

/// The ULPDUs of one MPA stream: skip the 20-byte Request/Reply and its private
/// data, then FPDUs of length | ULPDU | pad | CRC (no markers in these captures).
fn ulpdus(stream: &[u8]) -> Vec<&[u8]> {
    let mut v = Vec::new();
    if !stream.starts_with(b"MPA ID R") {
        return v;
    }
    let mut off = 20 + be16(stream, 18);
    while off + 2 <= stream.len() {
        let len = be16(stream, off);
        let end = off + 2 + len;
        if end > stream.len() {
            break;
        }
        v.push(&stream[off + 2..end]);
        off = end + (4 - (2 + len) % 4) % 4 + 4;
    }
    v
}

#[test]
fn every_captured_ulpdu_parses_and_re_emits() {
    let dir = pcap_dir()
        .expect("../shared/pcaps (the kernel siw captures) must sit beside the repository");
    let mut seen: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut total = 0;
    for name in [
        "rping.pcap",
        "rping-srv_crc-cli_crc.pcap",
        "rping-srv_p2p-cli_p2p.pcap",
        "ib_write_bw.pcap",
        "ib_send_bw.pcap",
    ] {
        let pcap = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (_, stream) in streams(&pcap) {
            for bytes in ulpdus(&stream) {
                let u = Ulpdu::parse(bytes).unwrap_or_else(|e| panic!("{name}: {e}: {bytes:02x?}"));
                let mut out = vec![0; u.buffer_len()];
                u.emit(&mut out).unwrap();
                assert_eq!(out, bytes, "{name}: re-emit differs");
                if u.opcode() == Opcode::ReadRequest {
                    assert!(matches!(u.body, Body::ReadRequest(_)));
                }
                *seen.entry(u.opcode().name()).or_default() += 1;
                total += 1;
            }
        }
    }
    if total == 0 {
        return;
    }
    eprintln!("{total} ULPDUs: {seen:?}");
    for op in ["Write", "ReadRequest", "ReadResponse", "Send"] {
        assert!(seen.get(op).copied().unwrap_or(0) > 0, "no {op} seen");
    }
    assert!(total > 2000, "only {total} ULPDUs");
}

#[test]
fn bad_crc_capture_never_panics() {
    let Some(dir) = pcap_dir() else { return };
    let Ok(pcap) = std::fs::read(dir.join("bad-crc.pcap")) else {
        return;
    };
    for (_, stream) in streams(&pcap) {
        for bytes in ulpdus(&stream) {
            let _ = Ulpdu::parse(bytes);
        }
    }
}
