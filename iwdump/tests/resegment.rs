//! End to end through reassembly: the reference captures re-cut into smaller TCP
//! segments, with duplicates, overlapping retransmissions and reordering, decode
//! to the same FPDUs.

mod common;

use etherparse::PacketBuilder;
use iwdump::capture::Capture;
use iwdump::packet::{decode_tcp, TcpSegment};

struct Rng(u64);

impl Rng {
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn ip4(a: std::net::SocketAddr) -> [u8; 4] {
    match a.ip() {
        std::net::IpAddr::V4(v) => v.octets(),
        std::net::IpAddr::V6(_) => panic!("IPv4 only"),
    }
}

fn build(seg: &TcpSegment<'_>, seq: u32, syn: bool, fin: bool, payload: &[u8]) -> Vec<u8> {
    let mut b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(ip4(seg.src), ip4(seg.dst), 64)
        .tcp(seg.src.port(), seg.dst.port(), seq, 1000);
    if syn {
        b = b.syn();
    }
    if seg.flags.ack {
        b = b.ack(1);
    }
    if fin {
        b = b.fin();
    }
    if seg.flags.rst {
        b = b.rst();
    }
    let mut out = Vec::new();
    b.write(&mut out, payload).unwrap();
    out
}

/// Re-cut every TCP payload of `bytes` into pieces, add duplicates and overlapping
/// retransmissions, swap neighbours; return a new pcap.
fn mangle(bytes: &[u8], seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    // (frame bytes, may_move)
    let mut frames: Vec<(Vec<u8>, bool)> = Vec::new();
    for f in Capture::new(bytes).unwrap() {
        let f = f.unwrap();
        let Some(seg) = decode_tcp(&f).unwrap() else {
            frames.push((f.data.to_vec(), false));
            continue;
        };
        if seg.payload.is_empty() {
            frames.push((f.data.to_vec(), !seg.flags.syn));
            continue;
        }
        let data_seq = seg.seq.wrapping_add(u32::from(seg.flags.syn));
        let mut at = 0;
        while at < seg.payload.len() {
            let n = (1 + rng.next(600)).min(seg.payload.len() - at);
            let last = at + n == seg.payload.len();
            let piece = &seg.payload[at..at + n];
            let seq = data_seq.wrapping_add(at as u32);
            let syn = seg.flags.syn && at == 0;
            let syn_seq = if syn { seq.wrapping_sub(1) } else { seq };
            frames.push((
                build(&seg, syn_seq, syn, seg.flags.fin && last, piece),
                !syn,
            ));
            if rng.next(5) == 0 {
                // A duplicate, or a retransmission overlapping the previous piece.
                let back = rng.next(at + 1).min(at);
                let from = at - back;
                let dup = &seg.payload[from..at + n];
                let seq = data_seq.wrapping_add(from as u32);
                frames.push((build(&seg, seq, false, false, dup), true));
            }
            at += n;
        }
    }
    // Swap some neighbours (never moving SYNs or non-TCP frames).
    for i in 1..frames.len() {
        if frames[i].1 && frames[i - 1].1 && rng.next(3) == 0 {
            frames.swap(i, i - 1);
        }
    }
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    for (i, (f, _)) in frames.iter().enumerate() {
        out.extend_from_slice(&(i as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

#[test]
fn resegmented_captures_decode_the_same() {
    for name in common::ALL {
        let bytes = std::fs::read(common::pcap(name)).unwrap();
        let want = iwdump::dissect(&bytes).unwrap();
        for seed in 1..4u64 {
            let mangled = mangle(&bytes, seed * 0x9e37_79b9);
            let got = iwdump::dissect(&mangled).unwrap();
            assert_eq!(got.opcodes, want.opcodes, "{name} seed {seed}");
            assert_eq!(got.messages, want.messages, "{name} seed {seed}");
            assert_eq!(got.fpdus, want.fpdus, "{name} seed {seed}");
            assert_eq!(got.connections.len(), want.connections.len());
            let kinds = |r: &iwdump::Report| r.errors.iter().map(|e| e.kind).collect::<Vec<_>>();
            assert_eq!(
                kinds(&got),
                kinds(&want),
                "{name} seed {seed}: {:#?}",
                got.errors
            );
            // Same FPDUs at the same stream offsets.
            let key = |r: &iwdump::Report| {
                let mut v: Vec<_> = r
                    .fpdu_records()
                    .map(|(p, f)| (p.tcp_id, p.src, p.offset, p.wire_len, f.opcode.clone()))
                    .collect();
                v.sort();
                v
            };
            assert_eq!(key(&got), key(&want), "{name} seed {seed}");
        }
    }
}
