//! The whole receive path: a QP after a real MPA exchange (CRC on, Markers as the input
//! asks), bound to its connection as the device binds it, fed the peer's TCP payload in
//! arbitrary chunks: raw bytes, valid FPDUs built from fuzzed ULPDUs, or those with one
//! corrupted FPDU. `softiwarp::testing::rx_path::run` documents the input format and
//! panics when an invariant breaks (at most one Terminate, the QP RTS or in Error for a
//! reason, read-only and local MRs and guard bytes unchanged, every WR completes once).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    softiwarp::testing::rx_path::run(data);
});
