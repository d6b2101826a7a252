//! Root-only two-process tests, and what their peer binaries run.
//!
//! Its room: tests only (nothing depends on it). The library is what the peer binaries
//! `iwarp-peer` and `removal-peer` run ([`removal`]); the tests are in `tests/`. It
//! touches softiwarp, rdma-cm, verbs, bench (the ULPDU stream) and netlab (the lab:
//! namespaces, TAPs and bridges made and removed by the tests themselves, peer processes
//! run inside them under a watchdog); testkit only as a dev-dependency.
//!
//! The ULPDU stream the `iwarp-peer` binary moves ([`bench::ulpdu`], [`bench::mpa_peer`])
//! is bench's.
//!
//! The tests (`tests/`): `harness.rs` tests the lab itself; `iwarp_two_process.rs`
//! moves 1 GiB of ULPDUs between two `iwarp-peer` processes in two namespaces, verified
//! ULPDU by ULPDU and by a CRC32c of everything, with a capture of the first 20 MB checked
//! by `iwdump` and tshark, and checks that an aborted transfer fails loudly and leaves
//! nothing behind. They need root and skip (saying so) without it; tshark is required when
//! `CI` is set. The `removal_*.rs` tests run pairs of `removal-peer`s and tear a TAP
//! down at chosen moments (their harness is `tests/removal_support`).

pub mod removal;
