//! MPA deframer (RFC 5044 4-6): any byte stream, cut into any chunks, with any framing,
//! must never panic, and must yield the same items however it is chunked.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mpa::deframer::{Deframer, DeframerConfig};
use mpa::fpdu::Framing;

fn run(cfg: DeframerConfig, data: &[u8], chunk: usize) -> Vec<Result<(u64, Vec<u8>), String>> {
    let mut d = Deframer::new(cfg);
    let mut out = Vec::new();
    for piece in data.chunks(chunk.max(1)) {
        let mut fatal = false;
        d.feed(piece, |item| match item {
            Ok(f) => out.push(Ok((f.offset, f.ulpdu.to_vec()))),
            Err(e) => {
                fatal |= e.is_fatal();
                out.push(Err(e.to_string()));
            }
        });
        if fatal {
            break;
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let framing = Framing { crc: data[0] & 1 != 0, markers: data[0] & 2 != 0 };
    let mut cfg = DeframerConfig::new(framing);
    cfg.deliver_bad_crc = data[0] & 4 != 0;
    cfg.stream_pos = u64::from(data[1]) * 4;
    let chunk = usize::from(data[2]);
    let stream = &data[3..];
    let whole = run(cfg, stream, stream.len());
    let chunked = run(cfg, stream, chunk);
    assert_eq!(whole, chunked);
});
