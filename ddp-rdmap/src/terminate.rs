//! The Terminate message (RFC 5040 §4.8) and the error code tables it carries.
//!
//! A Terminate is an untagged RDMAP message on QN 2 (MO 0, L = 1). After its
//! 18-byte DDP header comes the Terminate header:
//!
//! ```text
//!  0       4       8              16 17 18 19                     31
//! | Layer | EType |  Error Code    | M| D| R|       Reserved         |  Terminate Control
//! | DDP Segment Length (16) |  Terminated DDP Header (14 or 18 bytes) ...   (if D)
//! | Terminated RDMA Header (28 bytes) ...                                    (if R)
//! ```
//!
//! * M: the DDP Segment Length field holds the valid length (MPA ULPDU Length) of
//!   the segment that caused the error.
//! * D: the DDP Segment Length field and the DDP header of that segment follow.
//!   The copied header is 14 bytes if its own T flag is set, else 18.
//! * R: the 28-byte RDMAP header of that message follows (the RDMA Read Request
//!   header; RFC 5040 §4.4).
//!
//! The DDP Segment Length field is present exactly when D is set; Linux siw and
//! Wireshark's dissector read it the same way (siw copies the MPA length field and
//! the DDP header together). M without D is rejected.
//!
//! Error values (Layer / EType / Error Code), checked against the IANA "RDMAP
//! Errors" registry (RFC 6580), Linux siw `iwarp.h` and Wireshark:
//!
//! | layer | etype | codes |
//! |---|---|---|
//! | 0 RDMAP | 0 Local Catastrophic | any (sent as 0x00) |
//! | 0 RDMAP | 1 Remote Protection | 00 Invalid STag, 01 Base or bounds, 02 Access rights, 03 STag not associated with RDMAP Stream, 04 TO wrap, 09 STag cannot be Invalidated, FF Unspecified |
//! | 0 RDMAP | 2 Remote Operation | 05 Invalid RDMAP version, 06 Unexpected OpCode, 07 Catastrophic localized to RDMAP Stream, 08 Catastrophic global, 09 STag cannot be Invalidated, FF Unspecified |
//! | 1 DDP | 0 Local Catastrophic | any (sent as 0x00) |
//! | 1 DDP | 1 Tagged Buffer | 00 Invalid STag, 01 Base or bounds, 02 STag not associated with DDP Stream, 03 TO wrap, 04 Invalid DDP version |
//! | 1 DDP | 2 Untagged Buffer | 01 Invalid QN, 02 Invalid MSN - no buffer available, 03 Invalid MSN - MSN range is not valid, 04 Invalid MO, 05 DDP Message too long for available buffer, 06 Invalid DDP version |
//! | 2 LLP | 0 MPA | 01 TCP connection closed, terminated or lost, 02 MPA CRC error, 03 MPA Marker and ULPDU Length field mismatch, 04 Invalid MPA Request/Reply Frame (RFC 5044); 05 Local Catastrophic, 06 Insufficient IRD resources, 07 No matching RTR option (RFC 6581) |
//!
//! RFC 7306 (atomics, Immediate Data) adds no code: the IANA registry, updated when it
//! was published, holds the RFC 5040 codes only. A bad Atomic Request is answered with
//! the Remote Protection codes above (see
//! [`crate::reassembly::check_atomic_request`]).

use crate::ddp;
use crate::error::{check_in, check_out, Error, Field, Result};
use crate::rdmap::{Opcode, READ_REQUEST_LEN};
use crate::wire;
use core::fmt;

/// Length in bytes of the Terminate Control word.
pub const CONTROL_LEN: usize = 4;
/// Length in bytes of the DDP Segment Length field.
pub const SEGMENT_LENGTH_LEN: usize = 2;
/// Length in bytes of the Terminated RDMA Header field.
pub const RDMA_HEADER_LEN: usize = READ_REQUEST_LEN;
/// Largest Terminate header in bytes: control, segment length, untagged DDP header,
/// RDMA header (4 + 2 + 18 + 28 = 52).
pub const MAX_LEN: usize =
    CONTROL_LEN + SEGMENT_LENGTH_LEN + ddp::UNTAGGED_HEADER_LEN + RDMA_HEADER_LEN;

/// M flag in byte 2 of the Terminate Control word: DDP Segment Length valid.
pub const FLAG_M: u8 = 0x80;
/// D flag in byte 2: DDP header included.
pub const FLAG_D: u8 = 0x40;
/// R flag in byte 2: RDMAP header included.
pub const FLAG_R: u8 = 0x20;

/// The layer that detected the error (RFC 5040 §4.8, Terminate Control "Layer").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Layer {
    /// RDMAP (0x0).
    Rdmap = 0x0,
    /// DDP (0x1).
    Ddp = 0x1,
    /// The lower layer protocol, MPA here (0x2).
    Llp = 0x2,
}

/// RDMAP error types (Layer 0 EType; RFC 5040 §4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RdmapErrorType {
    /// Local Catastrophic Error (0x0).
    LocalCatastrophic = 0x0,
    /// Remote Protection Error (0x1).
    RemoteProtection = 0x1,
    /// Remote Operation Error (0x2).
    RemoteOperation = 0x2,
}

/// Error codes of RDMAP Remote Protection Errors (Layer 0, EType 1; RFC 5040 §4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RdmapProtectionCode {
    /// Invalid STag (0x00).
    InvalidStag = 0x00,
    /// Base or bounds violation (0x01).
    BaseOrBoundsViolation = 0x01,
    /// Access rights violation (0x02).
    AccessRightsViolation = 0x02,
    /// STag not associated with RDMAP Stream (0x03).
    StagNotAssociated = 0x03,
    /// TO wrap (0x04).
    ToWrap = 0x04,
    /// STag cannot be Invalidated (0x09).
    StagCannotBeInvalidated = 0x09,
    /// Unspecified Error (0xFF).
    Unspecified = 0xff,
}

/// Error codes of RDMAP Remote Operation Errors (Layer 0, EType 2; RFC 5040 §4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RdmapOperationCode {
    /// Invalid RDMAP version (0x05).
    InvalidVersion = 0x05,
    /// Unexpected OpCode (0x06).
    UnexpectedOpcode = 0x06,
    /// Catastrophic error, localized to RDMAP Stream (0x07).
    CatastrophicStream = 0x07,
    /// Catastrophic error, global (0x08).
    CatastrophicGlobal = 0x08,
    /// STag cannot be Invalidated (0x09).
    StagCannotBeInvalidated = 0x09,
    /// Unspecified Error (0xFF).
    Unspecified = 0xff,
}

/// DDP error types (Layer 1 EType; RFC 5041 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DdpErrorType {
    /// Local Catastrophic Error (0x0).
    LocalCatastrophic = 0x0,
    /// Tagged Buffer Error (0x1).
    TaggedBuffer = 0x1,
    /// Untagged Buffer Error (0x2).
    UntaggedBuffer = 0x2,
    /// Reserved (0x3); never sent by this crate, parsed as
    /// [`ErrorCause::Unrecognized`].
    Reserved = 0x3,
}

/// Error codes of DDP Tagged Buffer Errors (Layer 1, EType 1; RFC 5041 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DdpTaggedCode {
    /// Invalid STag (0x00).
    InvalidStag = 0x00,
    /// Base or bounds violation (0x01).
    BaseOrBoundsViolation = 0x01,
    /// STag not associated with DDP Stream (0x02).
    StagNotAssociated = 0x02,
    /// TO wrap (0x03).
    ToWrap = 0x03,
    /// Invalid DDP version (0x04).
    InvalidVersion = 0x04,
}

/// Error codes of DDP Untagged Buffer Errors (Layer 1, EType 2; RFC 5041 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DdpUntaggedCode {
    /// Invalid QN (0x01).
    InvalidQn = 0x01,
    /// Invalid MSN - no buffer available (0x02).
    InvalidMsnNoBuffer = 0x02,
    /// Invalid MSN - MSN range is not valid (0x03).
    InvalidMsnRange = 0x03,
    /// Invalid MO (0x04).
    InvalidMo = 0x04,
    /// DDP Message too long for available buffer (0x05).
    MessageTooLong = 0x05,
    /// Invalid DDP version (0x06).
    InvalidVersion = 0x06,
}

/// LLP (MPA) error types (Layer 2 EType; RFC 5044).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LlpErrorType {
    /// MPA error (0x0), the only one defined.
    Mpa = 0x0,
}

/// Error codes of LLP errors when the LLP is MPA (Layer 2, EType 0; RFC 5044 for
/// 0x01-0x04, RFC 6581 for 0x05-0x07).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LlpCode {
    /// TCP connection closed, terminated or lost (0x01).
    ConnectionLost = 0x01,
    /// MPA CRC error (0x02).
    CrcError = 0x02,
    /// MPA Marker and ULPDU Length field mismatch (0x03).
    MarkerMismatch = 0x03,
    /// Invalid MPA Request Frame or MPA Reply Frame (0x04).
    InvalidRequestReply = 0x04,
    /// Local catastrophic error (0x05, RFC 6581).
    LocalCatastrophic = 0x05,
    /// Insufficient IRD resources (0x06, RFC 6581).
    InsufficientIrd = 0x06,
    /// No matching RTR option (0x07, RFC 6581).
    NoMatchingRtr = 0x07,
}

impl RdmapProtectionCode {
    /// The code for a byte, if it is a Remote Protection Error code.
    pub const fn from_u8(v: u8) -> Option<Self> {
        use RdmapProtectionCode::*;
        Some(match v {
            0x00 => InvalidStag,
            0x01 => BaseOrBoundsViolation,
            0x02 => AccessRightsViolation,
            0x03 => StagNotAssociated,
            0x04 => ToWrap,
            0x09 => StagCannotBeInvalidated,
            0xff => Unspecified,
            _ => return None,
        })
    }
}

impl RdmapOperationCode {
    /// The code for a byte, if it is a Remote Operation Error code.
    pub const fn from_u8(v: u8) -> Option<Self> {
        use RdmapOperationCode::*;
        Some(match v {
            0x05 => InvalidVersion,
            0x06 => UnexpectedOpcode,
            0x07 => CatastrophicStream,
            0x08 => CatastrophicGlobal,
            0x09 => StagCannotBeInvalidated,
            0xff => Unspecified,
            _ => return None,
        })
    }
}

impl DdpTaggedCode {
    /// The code for a byte, if it is a Tagged Buffer Error code.
    pub const fn from_u8(v: u8) -> Option<Self> {
        use DdpTaggedCode::*;
        Some(match v {
            0x00 => InvalidStag,
            0x01 => BaseOrBoundsViolation,
            0x02 => StagNotAssociated,
            0x03 => ToWrap,
            0x04 => InvalidVersion,
            _ => return None,
        })
    }
}

impl DdpUntaggedCode {
    /// The code for a byte, if it is an Untagged Buffer Error code.
    pub const fn from_u8(v: u8) -> Option<Self> {
        use DdpUntaggedCode::*;
        Some(match v {
            0x01 => InvalidQn,
            0x02 => InvalidMsnNoBuffer,
            0x03 => InvalidMsnRange,
            0x04 => InvalidMo,
            0x05 => MessageTooLong,
            0x06 => InvalidVersion,
            _ => return None,
        })
    }
}

impl LlpCode {
    /// The code for a byte, if it is an MPA error code.
    pub const fn from_u8(v: u8) -> Option<Self> {
        use LlpCode::*;
        Some(match v {
            0x01 => ConnectionLost,
            0x02 => CrcError,
            0x03 => MarkerMismatch,
            0x04 => InvalidRequestReply,
            0x05 => LocalCatastrophic,
            0x06 => InsufficientIrd,
            0x07 => NoMatchingRtr,
            _ => return None,
        })
    }
}

/// One Terminate error: a legal (Layer, EType, Error Code) triple from the tables
/// above, or an unrecognized one kept as raw values so that a received Terminate
/// always parses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCause {
    /// RDMAP Local Catastrophic Error (0x0/0x0/`code`); any code is legal, 0x00 is
    /// what this crate sends (Linux siw sends 0xFF).
    RdmapLocalCatastrophic {
        /// The Error Code byte.
        code: u8,
    },
    /// RDMAP Remote Protection Error (0x0/0x1/code).
    RdmapRemoteProtection(RdmapProtectionCode),
    /// RDMAP Remote Operation Error (0x0/0x2/code).
    RdmapRemoteOperation(RdmapOperationCode),
    /// DDP Local Catastrophic Error (0x1/0x0/`code`); any code, 0x00 sent.
    DdpLocalCatastrophic {
        /// The Error Code byte.
        code: u8,
    },
    /// DDP Tagged Buffer Error (0x1/0x1/code).
    DdpTagged(DdpTaggedCode),
    /// DDP Untagged Buffer Error (0x1/0x2/code).
    DdpUntagged(DdpUntaggedCode),
    /// LLP (MPA) error (0x2/0x0/code).
    Llp(LlpCode),
    /// A triple outside the tables (received only).
    Unrecognized {
        /// Layer nibble.
        layer: u8,
        /// EType nibble.
        etype: u8,
        /// Error Code byte.
        code: u8,
    },
}

impl ErrorCause {
    /// Interprets raw Layer / EType / Error Code values; never fails (unknown
    /// triples become [`ErrorCause::Unrecognized`]). `layer` and `etype` are
    /// 4-bit values; higher bits make the triple unrecognized.
    pub const fn from_raw(layer: u8, etype: u8, code: u8) -> ErrorCause {
        let unrecognized = ErrorCause::Unrecognized { layer, etype, code };
        match (layer, etype) {
            (0, 0) => ErrorCause::RdmapLocalCatastrophic { code },
            (0, 1) => match RdmapProtectionCode::from_u8(code) {
                Some(c) => ErrorCause::RdmapRemoteProtection(c),
                None => unrecognized,
            },
            (0, 2) => match RdmapOperationCode::from_u8(code) {
                Some(c) => ErrorCause::RdmapRemoteOperation(c),
                None => unrecognized,
            },
            (1, 0) => ErrorCause::DdpLocalCatastrophic { code },
            (1, 1) => match DdpTaggedCode::from_u8(code) {
                Some(c) => ErrorCause::DdpTagged(c),
                None => unrecognized,
            },
            (1, 2) => match DdpUntaggedCode::from_u8(code) {
                Some(c) => ErrorCause::DdpUntagged(c),
                None => unrecognized,
            },
            (2, 0) => match LlpCode::from_u8(code) {
                Some(c) => ErrorCause::Llp(c),
                None => unrecognized,
            },
            _ => unrecognized,
        }
    }

    /// The Layer nibble.
    pub const fn layer_value(&self) -> u8 {
        match self {
            ErrorCause::RdmapLocalCatastrophic { .. }
            | ErrorCause::RdmapRemoteProtection(_)
            | ErrorCause::RdmapRemoteOperation(_) => Layer::Rdmap as u8,
            ErrorCause::DdpLocalCatastrophic { .. }
            | ErrorCause::DdpTagged(_)
            | ErrorCause::DdpUntagged(_) => Layer::Ddp as u8,
            ErrorCause::Llp(_) => Layer::Llp as u8,
            ErrorCause::Unrecognized { layer, .. } => *layer,
        }
    }

    /// The typed layer, `None` for an unrecognized layer value.
    pub const fn layer(&self) -> Option<Layer> {
        match self.layer_value() {
            0 => Some(Layer::Rdmap),
            1 => Some(Layer::Ddp),
            2 => Some(Layer::Llp),
            _ => None,
        }
    }

    /// The EType nibble.
    pub const fn etype(&self) -> u8 {
        match self {
            ErrorCause::RdmapLocalCatastrophic { .. } => RdmapErrorType::LocalCatastrophic as u8,
            ErrorCause::RdmapRemoteProtection(_) => RdmapErrorType::RemoteProtection as u8,
            ErrorCause::RdmapRemoteOperation(_) => RdmapErrorType::RemoteOperation as u8,
            ErrorCause::DdpLocalCatastrophic { .. } => DdpErrorType::LocalCatastrophic as u8,
            ErrorCause::DdpTagged(_) => DdpErrorType::TaggedBuffer as u8,
            ErrorCause::DdpUntagged(_) => DdpErrorType::UntaggedBuffer as u8,
            ErrorCause::Llp(_) => LlpErrorType::Mpa as u8,
            ErrorCause::Unrecognized { etype, .. } => *etype,
        }
    }

    /// The Error Code byte.
    pub const fn code(&self) -> u8 {
        match self {
            ErrorCause::RdmapLocalCatastrophic { code }
            | ErrorCause::DdpLocalCatastrophic { code } => *code,
            ErrorCause::RdmapRemoteProtection(c) => *c as u8,
            ErrorCause::RdmapRemoteOperation(c) => *c as u8,
            ErrorCause::DdpTagged(c) => *c as u8,
            ErrorCause::DdpUntagged(c) => *c as u8,
            ErrorCause::Llp(c) => *c as u8,
            ErrorCause::Unrecognized { code, .. } => *code,
        }
    }

    /// True for local catastrophic errors (RDMAP or DDP, or LLP code 0x05).
    pub const fn is_local_catastrophic(&self) -> bool {
        matches!(
            self,
            ErrorCause::RdmapLocalCatastrophic { .. }
                | ErrorCause::DdpLocalCatastrophic { .. }
                | ErrorCause::Llp(LlpCode::LocalCatastrophic)
        )
    }

    /// The error's name as the RFC tables word it.
    pub const fn description(&self) -> &'static str {
        match self {
            ErrorCause::RdmapLocalCatastrophic { .. } => "RDMAP Local Catastrophic Error",
            ErrorCause::RdmapRemoteProtection(c) => match c {
                RdmapProtectionCode::InvalidStag => "RDMAP Remote Protection Error: Invalid STag",
                RdmapProtectionCode::BaseOrBoundsViolation => {
                    "RDMAP Remote Protection Error: Base or bounds violation"
                }
                RdmapProtectionCode::AccessRightsViolation => {
                    "RDMAP Remote Protection Error: Access rights violation"
                }
                RdmapProtectionCode::StagNotAssociated => {
                    "RDMAP Remote Protection Error: STag not associated with RDMAP Stream"
                }
                RdmapProtectionCode::ToWrap => "RDMAP Remote Protection Error: TO wrap",
                RdmapProtectionCode::StagCannotBeInvalidated => {
                    "RDMAP Remote Protection Error: STag cannot be Invalidated"
                }
                RdmapProtectionCode::Unspecified => {
                    "RDMAP Remote Protection Error: Unspecified Error"
                }
            },
            ErrorCause::RdmapRemoteOperation(c) => match c {
                RdmapOperationCode::InvalidVersion => {
                    "RDMAP Remote Operation Error: Invalid RDMAP version"
                }
                RdmapOperationCode::UnexpectedOpcode => {
                    "RDMAP Remote Operation Error: Unexpected OpCode"
                }
                RdmapOperationCode::CatastrophicStream => {
                    "RDMAP Remote Operation Error: Catastrophic error, localized to RDMAP Stream"
                }
                RdmapOperationCode::CatastrophicGlobal => {
                    "RDMAP Remote Operation Error: Catastrophic error, global"
                }
                RdmapOperationCode::StagCannotBeInvalidated => {
                    "RDMAP Remote Operation Error: STag cannot be Invalidated"
                }
                RdmapOperationCode::Unspecified => {
                    "RDMAP Remote Operation Error: Unspecified Error"
                }
            },
            ErrorCause::DdpLocalCatastrophic { .. } => "DDP Local Catastrophic Error",
            ErrorCause::DdpTagged(c) => match c {
                DdpTaggedCode::InvalidStag => "DDP Tagged Buffer Error: Invalid STag",
                DdpTaggedCode::BaseOrBoundsViolation => {
                    "DDP Tagged Buffer Error: Base or bounds violation"
                }
                DdpTaggedCode::StagNotAssociated => {
                    "DDP Tagged Buffer Error: STag not associated with DDP Stream"
                }
                DdpTaggedCode::ToWrap => "DDP Tagged Buffer Error: TO wrap",
                DdpTaggedCode::InvalidVersion => "DDP Tagged Buffer Error: Invalid DDP version",
            },
            ErrorCause::DdpUntagged(c) => match c {
                DdpUntaggedCode::InvalidQn => "DDP Untagged Buffer Error: Invalid QN",
                DdpUntaggedCode::InvalidMsnNoBuffer => {
                    "DDP Untagged Buffer Error: Invalid MSN - no buffer available"
                }
                DdpUntaggedCode::InvalidMsnRange => {
                    "DDP Untagged Buffer Error: Invalid MSN - MSN range is not valid"
                }
                DdpUntaggedCode::InvalidMo => "DDP Untagged Buffer Error: Invalid MO",
                DdpUntaggedCode::MessageTooLong => {
                    "DDP Untagged Buffer Error: DDP Message too long for available buffer"
                }
                DdpUntaggedCode::InvalidVersion => "DDP Untagged Buffer Error: Invalid DDP version",
            },
            ErrorCause::Llp(c) => match c {
                LlpCode::ConnectionLost => {
                    "LLP (MPA) Error: TCP connection closed, terminated or lost"
                }
                LlpCode::CrcError => "LLP (MPA) Error: MPA CRC Error",
                LlpCode::MarkerMismatch => {
                    "LLP (MPA) Error: MPA Marker and ULPDU Length field mismatch"
                }
                LlpCode::InvalidRequestReply => {
                    "LLP (MPA) Error: Invalid MPA Request Frame or MPA Reply Frame"
                }
                LlpCode::LocalCatastrophic => "LLP (MPA) Error: Local Catastrophic Error",
                LlpCode::InsufficientIrd => "LLP (MPA) Error: Insufficient IRD Resources",
                LlpCode::NoMatchingRtr => "LLP (MPA) Error: No Matching RTR Option",
            },
            ErrorCause::Unrecognized { .. } => "unrecognized Terminate error",
        }
    }
}

impl fmt::Display for ErrorCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({:#x}/{:#x}/{:#04x})",
            self.description(),
            self.layer_value(),
            self.etype(),
            self.code()
        )
    }
}

/// The Terminate Control word alone (first 4 bytes of the Terminate header).
/// Enough to learn why the peer terminated even when the rest is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Control {
    /// Layer / EType / Error Code.
    pub cause: ErrorCause,
    /// M flag: DDP Segment Length valid.
    pub m: bool,
    /// D flag: DDP Segment Length and DDP header included.
    pub d: bool,
    /// R flag: RDMAP header included.
    pub r: bool,
}

impl Control {
    /// Parses the first 4 bytes of `bytes` (reserved bits ignored).
    ///
    /// # Errors
    /// [`Error::Truncated`] with [`Field::TerminateControl`].
    pub fn parse(bytes: &[u8]) -> Result<Control> {
        check_in(Field::TerminateControl, CONTROL_LEN, bytes.len())?;
        let b0 = wire::u8_at(bytes, 0);
        let flags = wire::u8_at(bytes, 2);
        Ok(Control {
            cause: ErrorCause::from_raw(b0 >> 4, b0 & 0x0f, wire::u8_at(bytes, 1)),
            m: flags & FLAG_M != 0,
            d: flags & FLAG_D != 0,
            r: flags & FLAG_R != 0,
        })
    }

    /// The 4 bytes of the word (reserved bits zero). Layer and EType are masked to
    /// 4 bits.
    pub fn to_bytes(&self) -> [u8; CONTROL_LEN] {
        let mut flags = 0;
        if self.m {
            flags |= FLAG_M;
        }
        if self.d {
            flags |= FLAG_D;
        }
        if self.r {
            flags |= FLAG_R;
        }
        [
            (self.cause.layer_value() & 0xf) << 4 | (self.cause.etype() & 0xf),
            self.cause.code(),
            flags,
            0,
        ]
    }
}

/// A zero-copy view of a Terminate header (the bytes after the Terminate's DDP
/// header). After [`Packet::new_checked`] every field the flags announce is
/// present; accessors never panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps `buffer` and checks it holds the control word and every field its D
    /// and R flags announce.
    ///
    /// # Errors
    /// [`Error::Truncated`] naming the field that does not fit.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Packet { buffer };
        p.check_len()?;
        Ok(p)
    }

    /// See [`Packet::new_checked`].
    ///
    /// # Errors
    /// [`Error::Truncated`].
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        check_in(Field::TerminateControl, CONTROL_LEN, len)?;
        if self.d() {
            check_in(
                Field::TerminateDdpSegmentLength,
                CONTROL_LEN + SEGMENT_LENGTH_LEN,
                len,
            )?;
            check_in(Field::TerminatedDdpHeader, self.ddp_header_start() + 1, len)?;
        }
        check_in(Field::TerminatedDdpHeader, self.rdma_header_start(), len)?;
        if self.r() {
            check_in(
                Field::TerminatedRdmaHeader,
                self.rdma_header_start() + RDMA_HEADER_LEN,
                len,
            )?;
        }
        Ok(())
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The Terminate Control word, decoded.
    pub fn control(&self) -> Control {
        let b = self.buffer.as_ref();
        let b0 = wire::u8_at(b, 0);
        let flags = wire::u8_at(b, 2);
        Control {
            cause: ErrorCause::from_raw(b0 >> 4, b0 & 0x0f, wire::u8_at(b, 1)),
            m: flags & FLAG_M != 0,
            d: flags & FLAG_D != 0,
            r: flags & FLAG_R != 0,
        }
    }

    /// Layer nibble.
    pub fn layer(&self) -> u8 {
        wire::u8_at(self.buffer.as_ref(), 0) >> 4
    }

    /// EType nibble.
    pub fn etype(&self) -> u8 {
        wire::u8_at(self.buffer.as_ref(), 0) & 0x0f
    }

    /// Error Code byte.
    pub fn code(&self) -> u8 {
        wire::u8_at(self.buffer.as_ref(), 1)
    }

    /// M flag.
    pub fn m(&self) -> bool {
        wire::u8_at(self.buffer.as_ref(), 2) & FLAG_M != 0
    }

    /// D flag.
    pub fn d(&self) -> bool {
        wire::u8_at(self.buffer.as_ref(), 2) & FLAG_D != 0
    }

    /// R flag.
    pub fn r(&self) -> bool {
        wire::u8_at(self.buffer.as_ref(), 2) & FLAG_R != 0
    }

    /// The 13 reserved bits (should be 0).
    pub fn reserved(&self) -> u16 {
        wire::u16_at(self.buffer.as_ref(), 2) & 0x1fff
    }

    fn ddp_header_start(&self) -> usize {
        CONTROL_LEN + SEGMENT_LENGTH_LEN
    }

    /// Length of the copied DDP header (by its own T flag), 0 if D is clear.
    fn ddp_header_len(&self) -> usize {
        if self.d() {
            let ctrl = wire::u8_at(self.buffer.as_ref(), self.ddp_header_start());
            ddp::header_len(ctrl & ddp::FLAG_T != 0)
        } else {
            0
        }
    }

    fn rdma_header_start(&self) -> usize {
        if self.d() {
            self.ddp_header_start() + self.ddp_header_len()
        } else {
            CONTROL_LEN
        }
    }

    /// DDP Segment Length field (bytes), present iff D is set; meaningful iff M.
    pub fn ddp_segment_length(&self) -> Option<u16> {
        self.d()
            .then(|| wire::u16_at(self.buffer.as_ref(), CONTROL_LEN))
    }

    /// The Terminated DDP Header bytes (14 or 18), if D is set.
    pub fn terminated_ddp_header(&self) -> Option<&[u8]> {
        let s = self.ddp_header_start();
        self.d()
            .then(|| wire::slice(self.buffer.as_ref(), s..s + self.ddp_header_len()))
    }

    /// The Terminated RDMA Header bytes (28), if R is set.
    pub fn terminated_rdma_header(&self) -> Option<&[u8]> {
        let s = self.rdma_header_start();
        self.r()
            .then(|| wire::slice(self.buffer.as_ref(), s..s + RDMA_HEADER_LEN))
    }

    /// Length in bytes of the Terminate header the flags announce.
    pub fn header_len(&self) -> usize {
        self.rdma_header_start() + if self.r() { RDMA_HEADER_LEN } else { 0 }
    }
}

/// A copy of the DDP header of the segment that caused the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DdpHeaderCopy {
    /// A tagged header (T set in its first byte), 14 bytes.
    Tagged([u8; ddp::TAGGED_HEADER_LEN]),
    /// An untagged header, 18 bytes.
    Untagged([u8; ddp::UNTAGGED_HEADER_LEN]),
}

impl DdpHeaderCopy {
    /// Copies the DDP header at the start of `bytes`, sized by its T flag; `None`
    /// if `bytes` is shorter than that.
    pub fn from_prefix(bytes: &[u8]) -> Option<DdpHeaderCopy> {
        let ctrl = *bytes.first()?;
        if ctrl & ddp::FLAG_T != 0 {
            bytes
                .get(..ddp::TAGGED_HEADER_LEN)
                .map(|b| DdpHeaderCopy::Tagged(wire::array(b, 0)))
        } else {
            bytes
                .get(..ddp::UNTAGGED_HEADER_LEN)
                .map(|b| DdpHeaderCopy::Untagged(wire::array(b, 0)))
        }
    }

    /// The copied bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            DdpHeaderCopy::Tagged(b) => b,
            DdpHeaderCopy::Untagged(b) => b,
        }
    }
}

/// The Terminated DDP part of a Terminate: D is set; M is set iff
/// `segment_length` is `Some`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminatedDdp {
    /// The DDP Segment Length (the MPA ULPDU Length of the offending segment,
    /// bytes) when known valid (M flag); sent as 0 when `None`.
    pub segment_length: Option<u16>,
    /// The copied DDP header.
    pub header: DdpHeaderCopy,
}

/// What the receiver had of the ULPDU that caused an error, for
/// [`Repr::for_error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offending<'a> {
    /// The ULPDU Length from its MPA framing, bytes.
    pub ulpdu_len: u16,
    /// The ULPDU's first bytes (from the DDP control byte): at least its DDP header
    /// for the header to be copied, plus the 28-byte Read Request header for R.
    pub bytes: &'a [u8],
}

/// A validated Terminate header (RFC 5040 §4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Layer / EType / Error Code.
    pub cause: ErrorCause,
    /// DDP Segment Length and DDP header of the offending segment (D, M flags).
    pub ddp: Option<TerminatedDdp>,
    /// The RDMAP header of the offending message (R flag): the 28-byte RDMA Read
    /// Request header.
    pub rdma_header: Option<[u8; RDMA_HEADER_LEN]>,
}

/// The Terminate error of each receive-side [`Error`] (RFC 5040 §4.8, RFC 5041 §7).
impl Error {
    /// The Terminate error a receiver reports for this error (RFC 5040 §4.8 /
    /// RFC 5041 §7 tables), or `None` for errors that are not about received bytes
    /// (`InvalidRepr`, `BufferTooSmall`).
    ///
    /// Mapping: DDP version -> DDP Tagged/Untagged Buffer Error "Invalid DDP
    /// version" (by the T flag); RDMAP version -> RDMAP Remote Operation Error
    /// "Invalid RDMAP version"; unknown opcode or opcode on the wrong buffer model
    /// -> "Unexpected OpCode"; non-zero MO on a single-segment message -> DDP
    /// Untagged "Invalid MO"; every malformed length (truncated or over-long
    /// headers, L = 0 on a single-segment message, M without D, unknown atomic
    /// opcode) -> RDMAP Remote Operation Error "Unspecified Error" (0xFF): the RFCs
    /// have no more specific code for a malformed ULPDU. Never answer a received
    /// Terminate with a Terminate (RFC 5040 §7), whatever this returns.
    pub const fn terminate_cause(&self) -> Option<ErrorCause> {
        Some(match *self {
            Error::DdpVersion { tagged: true, .. } => {
                ErrorCause::DdpTagged(DdpTaggedCode::InvalidVersion)
            }
            Error::DdpVersion { tagged: false, .. } => {
                ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidVersion)
            }
            Error::RdmapVersion { .. } => {
                ErrorCause::RdmapRemoteOperation(RdmapOperationCode::InvalidVersion)
            }
            Error::UnknownOpcode { .. } | Error::TaggedMismatch { .. } => {
                ErrorCause::RdmapRemoteOperation(RdmapOperationCode::UnexpectedOpcode)
            }
            Error::NonZeroMo { .. } => ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidMo),
            Error::Truncated { .. }
            | Error::TrailingBytes { .. }
            | Error::NotLast { .. }
            | Error::TerminateLengthWithoutHeader
            | Error::UnknownAtomicOpcode { .. } => {
                ErrorCause::RdmapRemoteOperation(RdmapOperationCode::Unspecified)
            }
            Error::InvalidRepr { .. } | Error::BufferTooSmall { .. } => return None,
        })
    }
}

impl Repr {
    /// A Terminate carrying only the error (M = D = R = 0).
    pub const fn new(cause: ErrorCause) -> Repr {
        Repr {
            cause,
            ddp: None,
            rdma_header: None,
        }
    }

    /// Parses the Terminate header from a checked packet. The header must end the
    /// packet.
    ///
    /// # Errors
    /// [`Error::Truncated`] (a field announced by D or R is cut);
    /// [`Error::TerminateLengthWithoutHeader`] (M set without D);
    /// [`Error::TrailingBytes`] with [`Field::Terminate`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        let ctrl = packet.control();
        if ctrl.m && !ctrl.d {
            return Err(Error::TerminateLengthWithoutHeader);
        }
        let len = packet.buffer.as_ref().len();
        let hlen = packet.header_len();
        if len > hlen {
            return Err(Error::TrailingBytes {
                field: Field::Terminate,
                extra: len - hlen,
            });
        }
        let ddp = match packet.terminated_ddp_header() {
            Some(bytes) => Some(TerminatedDdp {
                segment_length: if ctrl.m {
                    packet.ddp_segment_length()
                } else {
                    None
                },
                header: DdpHeaderCopy::from_prefix(bytes).ok_or(Error::Truncated {
                    field: Field::TerminatedDdpHeader,
                    needed: packet.ddp_header_len(),
                    len: bytes.len(),
                })?,
            }),
            None => None,
        };
        let rdma_header = packet.terminated_rdma_header().map(|b| wire::array(b, 0));
        Ok(Repr {
            cause: ctrl.cause,
            ddp,
            rdma_header,
        })
    }

    /// Parses a whole Terminate header from bytes (checks, then [`Repr::parse`]).
    ///
    /// # Errors
    /// As [`Packet::new_checked`] and [`Repr::parse`].
    pub fn parse_bytes(bytes: &[u8]) -> Result<Repr> {
        Repr::parse(&Packet::new_checked(bytes)?)
    }

    /// The Terminate Control word this Repr emits.
    pub fn control(&self) -> Control {
        Control {
            cause: self.cause,
            m: matches!(
                self.ddp,
                Some(TerminatedDdp {
                    segment_length: Some(_),
                    ..
                })
            ),
            d: self.ddp.is_some(),
            r: self.rdma_header.is_some(),
        }
    }

    /// Length in bytes of the emitted Terminate header: 4, plus 2 + 14/18 with D,
    /// plus 28 with R.
    pub fn buffer_len(&self) -> usize {
        CONTROL_LEN
            + self
                .ddp
                .map_or(0, |d| SEGMENT_LENGTH_LEN + d.header.as_bytes().len())
            + self.rdma_header.map_or(0, |_| RDMA_HEADER_LEN)
    }

    /// Writes the Terminate header into the start of `buf`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`]; [`Error::InvalidRepr`] if the cause's Layer or
    /// EType does not fit in 4 bits.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(self.buffer_len(), buf.len())?;
        if self.cause.layer_value() > 0xf || self.cause.etype() > 0xf {
            return Err(Error::InvalidRepr {
                what: "Terminate Layer and EType are 4-bit fields",
            });
        }
        wire::put(buf, 0, &self.control().to_bytes());
        let mut at = CONTROL_LEN;
        if let Some(d) = &self.ddp {
            wire::put(buf, at, &d.segment_length.unwrap_or(0).to_be_bytes());
            at += SEGMENT_LENGTH_LEN;
            wire::put(buf, at, d.header.as_bytes());
            at += d.header.as_bytes().len();
        }
        if let Some(r) = &self.rdma_header {
            wire::put(buf, at, r);
        }
        Ok(())
    }

    /// Builds the Terminate a receiver sends for `cause`, copying what RFC 5040
    /// §4.8 / §7 ask for from the offending ULPDU:
    ///
    /// * LLP errors, local catastrophic errors and unrecognized causes: no headers
    ///   (M = D = R = 0): the error is not tied to one trustworthy segment.
    /// * "Invalid DDP version" (tagged or untagged): no headers, as the layout of a
    ///   segment of an unknown DDP version is unknown (Linux siw does the same).
    /// * Every other DDP error and every RDMAP Remote Protection / Remote Operation
    ///   error: the DDP header (D = 1) with the DDP Segment Length (M = 1).
    /// * RDMAP errors on an RDMA Read Request: also its 28-byte header (R = 1).
    ///
    /// A header is copied only if `offending` holds all of its bytes (a DDP header
    /// whose control byte has DV = 1); otherwise the flag stays clear. Never panics.
    pub fn for_error(cause: ErrorCause, offending: Option<Offending<'_>>) -> Repr {
        let mut repr = Repr::new(cause);
        let copy_ddp = match cause {
            ErrorCause::DdpTagged(DdpTaggedCode::InvalidVersion)
            | ErrorCause::DdpUntagged(DdpUntaggedCode::InvalidVersion) => false,
            ErrorCause::DdpTagged(_)
            | ErrorCause::DdpUntagged(_)
            | ErrorCause::RdmapRemoteProtection(_)
            | ErrorCause::RdmapRemoteOperation(_) => true,
            ErrorCause::RdmapLocalCatastrophic { .. }
            | ErrorCause::DdpLocalCatastrophic { .. }
            | ErrorCause::Llp(_)
            | ErrorCause::Unrecognized { .. } => false,
        };
        let Some(off) = offending else {
            return repr;
        };
        if !copy_ddp || wire::u8_at(off.bytes, 0) & ddp::DV_MASK != ddp::DDP_VERSION {
            return repr;
        }
        let Some(header) = DdpHeaderCopy::from_prefix(off.bytes) else {
            return repr;
        };
        repr.ddp = Some(TerminatedDdp {
            segment_length: Some(off.ulpdu_len),
            header,
        });
        let rdmap_error = matches!(
            cause,
            ErrorCause::RdmapRemoteProtection(_) | ErrorCause::RdmapRemoteOperation(_)
        );
        let is_read_request = matches!(header, DdpHeaderCopy::Untagged(_))
            && Opcode::parse_control(wire::u8_at(off.bytes, 1)) == Ok(Opcode::ReadRequest);
        if rdmap_error && is_read_request {
            let start = ddp::UNTAGGED_HEADER_LEN;
            if let Some(b) = off.bytes.get(start..start + RDMA_HEADER_LEN) {
                repr.rdma_header = Some(wire::array(b, 0));
            }
        }
        repr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_values() {
        // RFC 5040 §4.8 / IANA RDMAP Errors.
        assert_eq!(
            ErrorCause::from_raw(0, 1, 0x00),
            ErrorCause::RdmapRemoteProtection(RdmapProtectionCode::InvalidStag)
        );
        assert_eq!(RdmapProtectionCode::ToWrap as u8, 0x04);
        assert_eq!(RdmapProtectionCode::StagCannotBeInvalidated as u8, 0x09);
        assert_eq!(RdmapOperationCode::InvalidVersion as u8, 0x05);
        assert_eq!(RdmapOperationCode::UnexpectedOpcode as u8, 0x06);
        assert_eq!(RdmapOperationCode::CatastrophicStream as u8, 0x07);
        assert_eq!(RdmapOperationCode::CatastrophicGlobal as u8, 0x08);
        assert_eq!(RdmapOperationCode::Unspecified as u8, 0xff);
        // RFC 5041 §7.
        assert_eq!(DdpTaggedCode::InvalidVersion as u8, 0x04);
        assert_eq!(DdpUntaggedCode::InvalidQn as u8, 0x01);
        assert_eq!(DdpUntaggedCode::MessageTooLong as u8, 0x05);
        assert_eq!(DdpUntaggedCode::InvalidVersion as u8, 0x06);
        // RFC 5044 / RFC 6581.
        assert_eq!(LlpCode::CrcError as u8, 0x02);
        assert_eq!(LlpCode::NoMatchingRtr as u8, 0x07);
        // Codes that belong to the other RDMAP error type are not accepted.
        assert_eq!(
            ErrorCause::from_raw(0, 1, 0x05),
            ErrorCause::Unrecognized {
                layer: 0,
                etype: 1,
                code: 5
            }
        );
        assert_eq!(
            ErrorCause::from_raw(0, 2, 0x00),
            ErrorCause::Unrecognized {
                layer: 0,
                etype: 2,
                code: 0
            }
        );
        assert_eq!(
            ErrorCause::from_raw(1, 3, 0x00),
            ErrorCause::Unrecognized {
                layer: 1,
                etype: 3,
                code: 0
            }
        );
        assert_eq!(ErrorCause::from_raw(3, 0, 0).layer(), None);
        assert_eq!(
            ErrorCause::Llp(LlpCode::CrcError).to_string(),
            "LLP (MPA) Error: MPA CRC Error (0x2/0x0/0x02)"
        );
    }

    #[test]
    fn every_cause_round_trips_through_raw() {
        for layer in 0..16u8 {
            for etype in 0..16u8 {
                for code in 0..=255u8 {
                    let c = ErrorCause::from_raw(layer, etype, code);
                    assert_eq!((c.layer_value(), c.etype(), c.code()), (layer, etype, code));
                }
            }
        }
    }
}
