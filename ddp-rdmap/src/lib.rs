//! DDP (RFC 5041) and RDMAP (RFC 5040, extended by RFC 7306) for softiwarp: wire
//! formats, the Terminate error tables, TX segmentation and RX checks.
//!
//! Its room: the DDP/RDMAP wire, recognising and building Terminates included. It
//! touches nothing of ours: no MPA, no sockets, no threads.
//!
//! The crate is sans-IO and depends on no other softiwarp crate. Input is one
//! ULPDU as MPA delivers it (the bytes after the 2-byte ULPDU Length, before pad
//! and CRC); output is headers to put in front of payload.
//!
//! * [`ulpdu`]: **the entry point**. [`Ulpdu::parse`] turns ULPDU bytes into the
//!   header fields, opcode, L flag, the typed Read Request / Terminate / RFC 7306
//!   bodies and the payload, or a typed [`Error`] naming the field, mapped by
//!   [`Error::terminate_cause`] to the Terminate error to report. Never panics.
//!   [`ulpdu::terminate_cause`] reads the cause of a peer's Terminate.
//! * [`ddp`]: the DDP header alone (RFC 5041 §4), smoltcp-style `Packet` view and
//!   `Repr`. Byte 1, which DDP leaves to its ULP, is carried opaquely here and
//!   interpreted by [`rdmap`].
//! * [`rdmap`]: the RDMAP control byte and [`Opcode`] table (tagged or not, which
//!   queue), the RDMA Read Request header, RFC 7306 Immediate Data and Atomics.
//! * [`terminate`]: the Terminate header, its Layer / EType / Error Code tables and
//!   [`terminate::Repr::for_error`], which builds the Terminate for an error and
//!   the offending ULPDU.
//! * [`segment`]: a message -> its DDP segment headers for a MULPDU.
//! * [`reassembly`]: per-queue MSN / MO / buffer bookkeeping and the checks a
//!   receiver runs before placing data.
//!
//! All lengths are in bytes; all fields are big-endian on the wire.
//!
//! Each module uses only the ones below it (`scripts/modgraph.py` checks that there is
//! no circle): the byte helpers (`wire`), the opcodes and the [`Error`] type (private
//! modules, re-exported), then [`ddp`], [`rdmap`], [`terminate`], [`ulpdu`], and on
//! top [`segment`] and [`reassembly`].
//!
//! # Example
//!
//! Parse the RDMA Read Request that `rping` sent (`shared/pcaps/rping.pcap`,
//! frame 11), answer it with a Read Response cut for MULPDU 1442, and build the
//! Terminate a receiver would send had its source STag been invalid.
//!
//! ```
//! use ddp_rdmap::{Body, Opcode, Ulpdu};
//! use ddp_rdmap::segment::{Message, Target};
//! use ddp_rdmap::terminate::{self, ErrorCause, RdmapProtectionCode};
//!
//! let bytes: [u8; 46] = [
//!     0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, // DDP: QN 1, MSN 1, MO 0
//!     0x52, 0xa5, 0x3c, 0x00, 0, 0, 0x55, 0x83, 0xa4, 0xe0, 0x0f, 0x30, // sink STag, TO
//!     0, 0, 0, 0x40, // RDMA Read Message Size: 64
//!     0x79, 0xba, 0xa4, 0x00, 0, 0, 0x55, 0xd4, 0x19, 0x28, 0xdd, 0x50, // source STag, TO
//! ];
//! let ulpdu = Ulpdu::parse(&bytes)?;
//! assert_eq!(ulpdu.opcode(), Opcode::ReadRequest);
//! assert_eq!(ulpdu.header.qn(), Some(1));
//! let Body::ReadRequest(rr) = ulpdu.body else { unreachable!() };
//! assert_eq!((rr.size, rr.src_stag), (64, 0x79ba_a400));
//!
//! let response = Message {
//!     opcode: Opcode::ReadResponse,
//!     len: rr.size,
//!     target: Target::Tagged { stag: rr.sink_stag, to: rr.sink_to },
//! };
//! let segs: Vec<_> = response.segments(1442)?.collect();
//! assert_eq!(segs.len(), 1);
//! assert!(segs[0].header.last);
//! let mut wire = [0u8; 14];
//! segs[0].header.emit(&mut wire)?;
//! assert_eq!(wire[..2], [0xc1, 0x42]);
//!
//! let cause = ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::InvalidStag);
//! let term = terminate::Repr::for_error(cause, Some(ulpdu.offending(&bytes)));
//! let control = term.control();
//! assert!(control.m && control.d && control.r); // DDP and Read Request headers copied
//! assert_eq!(term.buffer_len(), 4 + 2 + 18 + 28);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod ddp;
mod error;
mod opcode;
pub mod rdmap;
pub mod reassembly;
pub mod segment;
pub mod terminate;
pub mod ulpdu;
mod wire;

pub use error::{Error, Field, Result};
pub use rdmap::Opcode;
pub use terminate::ErrorCause;
pub use ulpdu::{Body, Header, Ulpdu};
