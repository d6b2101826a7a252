//! iwdump: an iWARP dissector for pcap files.
//!
//! Its room: reading captures and reporting the iWARP in them. It touches the wire
//! crates `mpa` and `ddp_rdmap` only, never the soft device.
//!
//! It reads a capture, rebuilds every TCP stream, finds the MPA connections by
//! their Request/Reply (RFC 5044 7.1, RFC 6581), works out CRC and Markers per
//! direction from them, deframes the FPDUs (CRC check, Markers) and decodes each
//! ULPDU's DDP/RDMAP headers (RFC 5041, RFC 5040, RFC 7306). The wire formats come
//! from the workspace crates `mpa` and `ddp_rdmap`; capture files are read with
//! `pcap-parser` and packets parsed with `etherparse`.
//!
//! Entry points:
//! * [`dissect()`] (bytes of a capture) / [`dissect_file`] (a path) -> [`Report`]:
//!   connections with their MPA parameters, per-PDU records, FPDU and message
//!   counts per opcode, errors located by frame number and stream offset. The
//!   report is serde-serializable ([`Report::to_json`]) and printable
//!   ([`Report::to_text`]). `Err` only for unusable input ([`DissectError`]).
//! * [`reassemble`]: the reassembled byte streams themselves, for tools and tests
//!   that want the octets behind a [`report::PduRecord`].
//!
//! Layers, bottom up: [`capture`] (pcap/pcapng frames, numbered from 1 like
//! Wireshark), [`packet`] (the TCP segment of a frame), [`reassembly`] (per
//! direction byte streams, with the frame of every octet), [`mod@dissect`] (MPA and
//! FPDU decoding), [`report`] (the result).
//!
//! Units: stream offsets are octets since ISN+1 of their direction; lengths are
//! octets.

pub mod capture;
pub mod dissect;
pub mod packet;
pub mod reassembly;
pub mod report;
mod wire;

pub use dissect::{dissect, dissect_file, reassemble, DissectError, ReassembledStream};
pub use report::Report;
