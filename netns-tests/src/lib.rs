//! Root-only two-process tests, and what their peer binaries run. The lab they use
//! (namespaces, TAPs and bridges made and removed by the harness itself, peer processes
//! run inside them under a watchdog) is the `netlab` crate.
//!
//! The ULPDU stream the `iwarp-peer` binary moves ([`bench::ulpdu`], [`bench::mpa_peer`])
//! is bench's.
//!
//! The tests (`tests/`): `harness.rs` tests the lab itself; `iwarp_two_process.rs`
//! moves 1 GiB of ULPDUs between two `iwarp-peer` processes in two namespaces, verified
//! ULPDU by ULPDU and by a CRC32c of everything, with a capture of the first 20 MB checked
//! by `iwdump` and tshark, and checks that an aborted transfer fails loudly and leaves
//! nothing behind. They need root and skip (saying so) without it; tshark is required when
//! `CI` is set.

pub mod removal;
