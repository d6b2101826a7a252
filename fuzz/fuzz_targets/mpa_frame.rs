//! MPA Request/Reply parser (RFC 5044 7.1, RFC 6581): arbitrary bytes must give a typed
//! error or a frame that re-emits to the same bytes; the streaming StartupReader must
//! agree with the one-shot parser for any split point.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mpa::wire::{FrameKind, Limits, Repr, Startup, StartupReader};

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let split = usize::from(data[0]);
    let data = &data[1..];
    let limits = Limits::default();
    let one_shot = Repr::parse_bytes(data, &limits);
    if let Ok((repr, used)) = &one_shot {
        // A parsed frame re-emits byte for byte.
        assert_eq!(&repr.to_bytes().expect("re-emit of a parsed frame")[..], &data[..*used]);
        assert_eq!(repr.buffer_len(), *used);
    }
    // The same bytes fed in two chunks.
    let split = split.min(data.len());
    for expect in [None, Some(FrameKind::Request), Some(FrameKind::Reply)] {
        let mut reader = StartupReader::new(expect, limits);
        let first = reader.push(&data[..split]);
        let outcome = match first {
            Ok(Startup::Incomplete) => reader.push(&data[split..]).map(|s| match s {
                Startup::Complete { frame, rest } => Some((frame, rest.len())),
                Startup::Incomplete => None,
            }),
            Ok(Startup::Complete { frame, rest }) => Ok(Some((frame, rest.len() + data.len() - split))),
            Err(e) => Err(e),
        };
        if expect.is_none() {
            match (&one_shot, &outcome) {
                (Ok((repr, used)), Ok(Some((frame, rest)))) => {
                    assert_eq!(repr, frame);
                    assert_eq!(used + rest, data.len());
                }
                (Ok(_), other) => panic!("one-shot parsed, streaming gave {other:?}"),
                _ => {}
            }
        }
    }
});
