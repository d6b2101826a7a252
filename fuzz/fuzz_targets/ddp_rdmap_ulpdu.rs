//! DDP/RDMAP ULPDU parser (RFC 5040, 5041, 7306) and the Terminate parser: arbitrary
//! bytes give a typed error or a value that re-emits and re-parses to itself.
#![no_main]
use ddp_rdmap::{terminate, Ulpdu};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(u) = Ulpdu::parse(data) {
        let mut buf = vec![0u8; u.buffer_len()];
        u.emit(&mut buf).expect("emit of a parsed ULPDU");
        let again = Ulpdu::parse(&buf).expect("re-parse of an emitted ULPDU");
        assert_eq!(again.header, u.header);
        assert_eq!(again.payload, u.payload);
        let _ = u.payload_range();
    }
    if let Ok(t) = terminate::Repr::parse_bytes(data) {
        let mut buf = vec![0u8; t.buffer_len()];
        t.emit(&mut buf).expect("emit of a parsed Terminate");
        assert_eq!(terminate::Repr::parse_bytes(&buf).expect("re-parse"), t);
    }
});
