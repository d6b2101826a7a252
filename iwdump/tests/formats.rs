//! The same capture as legacy pcap (little and big endian) and as pcapng decodes
//! to the same report.

mod common;

use iwdump::capture::Capture;

fn frames(bytes: &[u8]) -> Vec<Vec<u8>> {
    Capture::new(bytes)
        .unwrap()
        .map(|f| f.unwrap().data.to_vec())
        .collect()
}

fn pcapng(frames: &[Vec<u8>]) -> Vec<u8> {
    fn block(out: &mut Vec<u8>, kind: u32, body: &[u8]) {
        let padded = body.len().div_ceil(4) * 4;
        let len = (12 + padded) as u32;
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(body);
        out.resize(out.len() + padded - body.len(), 0);
        out.extend_from_slice(&len.to_le_bytes());
    }
    let mut out = Vec::new();
    let mut shb = Vec::new();
    shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
    shb.extend_from_slice(&[1, 0, 0, 0]);
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    block(&mut out, 0x0a0d_0d0a, &shb);
    // Interface 0: Ethernet, snaplen 0 (no limit).
    block(&mut out, 1, &[1, 0, 0, 0, 0, 0, 0, 0]);
    for f in frames {
        let mut epb = Vec::new();
        for w in [0u32, 0, 0, f.len() as u32, f.len() as u32] {
            epb.extend_from_slice(&w.to_le_bytes());
        }
        epb.extend_from_slice(f);
        block(&mut out, 6, &epb);
    }
    out
}

fn pcap_be(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2_c3d4u32.to_be_bytes());
    out.extend_from_slice(&2u16.to_be_bytes());
    out.extend_from_slice(&4u16.to_be_bytes());
    for w in [0u32, 0, 65535, 1] {
        out.extend_from_slice(&w.to_be_bytes());
    }
    for f in frames {
        for w in [0u32, 0, f.len() as u32, f.len() as u32] {
            out.extend_from_slice(&w.to_be_bytes());
        }
        out.extend_from_slice(f);
    }
    out
}

#[test]
fn pcapng_and_big_endian_pcap_give_the_same_report() {
    for name in ["rping.pcap", "bad-crc.pcap"] {
        let bytes = std::fs::read(common::pcap(name)).unwrap();
        let want = iwdump::dissect(&bytes).unwrap();
        let f = frames(&bytes);
        for other in [pcapng(&f), pcap_be(&f)] {
            let got = iwdump::dissect(&other).unwrap();
            assert_eq!(got.frames, want.frames);
            assert_eq!(got.opcodes, want.opcodes);
            assert_eq!(got.messages, want.messages);
            assert_eq!(got.errors, want.errors);
            assert_eq!(got.pdus, want.pdus);
            assert_eq!(got.connections, want.connections);
        }
    }
}
