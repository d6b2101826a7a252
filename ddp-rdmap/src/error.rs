//! The crate's parse and emit error, below every wire module (it names only an
//! [`Opcode`]); the mapping of each receive-side error to the Terminate error the
//! receiver must report ([`Error::terminate_cause`]) is in [`crate::terminate`], with
//! the Terminate codes.

use crate::opcode::Opcode;
use core::fmt;

/// A wire field or region, named as the RFCs name it; used by [`Error`] to say
/// where a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// The DDP header (RFC 5041 §4): 14 bytes tagged, 18 bytes untagged, counting
    /// the DDP control byte and the RDMAP control byte.
    DdpHeader,
    /// The RDMA Read Request header (RFC 5040 §4.4), 28 bytes after the DDP header.
    ReadRequest,
    /// The Terminate header (RFC 5040 §4.8) as a whole.
    Terminate,
    /// The Terminate Control word (RFC 5040 §4.8): Layer, EType, Error Code,
    /// M/D/R flags, reserved; 4 bytes.
    TerminateControl,
    /// The Terminate "DDP Segment Length" field (RFC 5040 §4.8), 2 bytes.
    TerminateDdpSegmentLength,
    /// The Terminate "Terminated DDP Header" field (RFC 5040 §4.8), 14 or 18 bytes.
    TerminatedDdpHeader,
    /// The Terminate "Terminated RDMA Header" field (RFC 5040 §4.8), 28 bytes.
    TerminatedRdmaHeader,
    /// The Atomic Request header (RFC 7306 §5), 52 bytes.
    AtomicRequest,
    /// The Atomic Response header (RFC 7306 §5), 12 bytes.
    AtomicResponse,
    /// The Immediate Data field (RFC 7306 §6), 8 bytes.
    ImmediateData,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::DdpHeader => "DDP header",
            Field::ReadRequest => "RDMA Read Request header",
            Field::Terminate => "Terminate header",
            Field::TerminateControl => "Terminate Control",
            Field::TerminateDdpSegmentLength => "Terminate DDP Segment Length",
            Field::TerminatedDdpHeader => "Terminated DDP Header",
            Field::TerminatedRdmaHeader => "Terminated RDMA Header",
            Field::AtomicRequest => "Atomic Request header",
            Field::AtomicResponse => "Atomic Response header",
            Field::ImmediateData => "Immediate Data",
        })
    }
}

/// Everything that can be wrong with DDP/RDMAP bytes, or with a buffer handed to an
/// `emit`. Parsing never panics; it returns one of these.
///
/// [`Error::terminate_cause`] gives the Terminate error (layer / error type / error
/// code) a receiver reports for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `field` needs `needed` bytes (counted from its start) but only `len` are there.
    #[error("{field} truncated: needs {needed} bytes, {len} present")]
    Truncated {
        /// The field that does not fit.
        field: Field,
        /// Bytes the field needs.
        needed: usize,
        /// Bytes available.
        len: usize,
    },
    /// Bytes follow a fixed-length RDMAP header that must end the ULPDU (Read
    /// Request, Terminate, Atomic Request/Response, Immediate Data).
    #[error("{extra} unexpected bytes after the {field}")]
    TrailingBytes {
        /// The header that must be last.
        field: Field,
        /// Number of extra bytes.
        extra: usize,
    },
    /// DDP Version (DV) is not 1 (RFC 5041 §4.1).
    #[error("DDP version {dv} is not 1")]
    DdpVersion {
        /// The DV value received (2 bits).
        dv: u8,
        /// The T flag of the segment: picks the Terminate error type (RFC 5041 §7).
        tagged: bool,
    },
    /// RDMAP Version (RV) is not 1 (RFC 5040 §4.1).
    #[error("RDMAP version {rv} is not 1")]
    RdmapVersion {
        /// The RV value received (2 bits).
        rv: u8,
    },
    /// RDMAP opcode not defined by RFC 5040 §4.2 or RFC 7306 (0xC..=0xF).
    #[error("unknown RDMAP opcode {opcode:#x}")]
    UnknownOpcode {
        /// The 4-bit opcode received.
        opcode: u8,
    },
    /// The DDP T flag does not match the buffer model the opcode uses (RFC 5040
    /// §4.2: Write and Read Response are tagged, all others untagged).
    #[error("{opcode} sent with T flag {tagged}")]
    TaggedMismatch {
        /// The opcode received.
        opcode: Opcode,
        /// The T flag received.
        tagged: bool,
    },
    /// A message that must fit one DDP segment (Read Request, Terminate, Atomic,
    /// Immediate Data) arrived with L = 0.
    #[error("{opcode} is a single-segment message but L is 0")]
    NotLast {
        /// The opcode received.
        opcode: Opcode,
    },
    /// A single-segment message arrived with a non-zero MO.
    #[error("{opcode} is a single-segment message but MO is {mo}")]
    NonZeroMo {
        /// The opcode received.
        opcode: Opcode,
        /// The MO received.
        mo: u32,
    },
    /// Terminate Control has M set but D clear: the DDP Segment Length field only
    /// exists together with the Terminated DDP Header (RFC 5040 §4.8).
    #[error("Terminate has M set without D")]
    TerminateLengthWithoutHeader,
    /// Atomic Request with an AtomicOpcode not defined by RFC 7306 §5.
    #[error("unknown atomic opcode {atomic_opcode:#x}")]
    UnknownAtomicOpcode {
        /// The 4-bit AtomicOpcode received.
        atomic_opcode: u8,
    },
    /// A `Repr` cannot be emitted as it is (for example an opcode put on the wrong
    /// buffer model); `what` says which rule.
    #[error("invalid representation: {what}")]
    InvalidRepr {
        /// The rule that is broken.
        what: &'static str,
    },
    /// The output buffer handed to `emit` is shorter than `buffer_len()`.
    #[error("output buffer too small: needs {needed} bytes, {len} given")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        len: usize,
    },
}

/// Result alias for this crate.
pub type Result<T> = core::result::Result<T, Error>;

/// Checks that an output buffer of `len` bytes holds `needed` bytes.
pub(crate) fn check_out(needed: usize, len: usize) -> Result<()> {
    if len < needed {
        Err(Error::BufferTooSmall { needed, len })
    } else {
        Ok(())
    }
}

/// Checks that `len` input bytes hold `needed` bytes of `field`.
pub(crate) fn check_in(field: Field, needed: usize, len: usize) -> Result<()> {
    if len < needed {
        Err(Error::Truncated { field, needed, len })
    } else {
        Ok(())
    }
}
