//! Bad input never panics: truncated and corrupted captures.

mod common;

#[test]
fn truncated_captures_do_not_panic() {
    for name in ["rping.pcap", "rping-srv_p2p-cli_p2p.pcap", "bad-crc.pcap"] {
        let bytes = std::fs::read(common::pcap(name)).unwrap();
        for cut in (0..bytes.len()).step_by(7) {
            match iwdump::dissect(&bytes[..cut]) {
                Ok(r) => {
                    // A cut inside a record is reported, never silently ignored.
                    let _ = r.to_text(true);
                    let _ = r.to_json(true);
                }
                Err(_) => assert!(cut < 24, "{name}: cut {cut} rejected"),
            }
        }
    }
}

#[test]
fn corrupted_captures_do_not_panic() {
    let bytes = std::fs::read(common::pcap("rping.pcap")).unwrap();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for round in 0..200 {
        let mut b = bytes.clone();
        // Flip a few bytes after the file header.
        for _ in 0..1 + round % 16 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = 24 + (x as usize) % (b.len() - 24);
            b[i] ^= (x >> 32) as u8 | 1;
        }
        if let Ok(r) = iwdump::dissect(&b) {
            let _ = r.to_text(true);
        }
    }
}

#[test]
fn garbage_is_not_a_capture() {
    assert!(iwdump::dissect(b"").is_err());
    assert!(iwdump::dissect(&[0u8; 100]).is_err());
    assert!(iwdump::dissect(b"MPA ID Req Frame").is_err());
}
