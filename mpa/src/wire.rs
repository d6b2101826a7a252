//! MPA Request / Reply frames (RFC 5044, section 7.1.1; RFC 6581).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                                                               |
//! +        Key (16 octets: "MPA ID Req Frame" or                  +
//! |                        "MPA ID Rep Frame")                    |
//! +                                                               +
//! |                                                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |M|C|R|E|  Res  |     Rev       |          PD_Length            |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~   Private Data (PD_Length octets, at most 512)                ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! * `M` (0x80): the sender of this frame wants MPA Markers in the data it
//!   *receives*; the peer must insert Markers when it transmits.
//! * `C` (0x40): CRC. If either the Request or the Reply has `C` set, the
//!   CRC is used in both directions.
//! * `R` (0x20): reject; only meaningful in a Reply.
//! * `E` (0x10): the RFC 6581 "enhanced RDMA connection establishment" bit
//!   (Linux: `MPA_RR_FLAG_ENHANCED`, `MPA_ENHANCED_RDMA_CONN`): with Rev 2 the
//!   private data starts with the 4-octet IRD/ORD word ([`Rev2Params`]).
//! * `Res` (0x0F; in Rev 1 also 0x10): reserved, zero on transmit and not
//!   checked on receipt (RFC 5044, section 7.1.1). Linux siw uses 0x08 for
//!   its private "GSO" extension when `try_gso` is on. The default [`Limits`]
//!   accept them; [`Repr::reserved`] keeps them so a parsed frame re-emits
//!   octet for octet; frames built by this crate set them to zero.
//! * `Rev`: 1 (RFC 5044) or 2 (RFC 6581).
//!
//! The wire types follow the smoltcp pattern: [`Packet`] is a zero-copy view
//! with field offsets as constants; [`Repr`] is the validated, owned
//! representation with [`Repr::parse`] / [`Repr::emit`] / [`Repr::buffer_len`].
//! [`StartupReader`] reads one frame from the front of a TCP byte stream and
//! hands back the octets behind it (FPDUs may follow a Reply in the same read;
//! RFC 5044, section 7.1.2).

use thiserror::Error;

/// Length of the key field, in octets.
pub const KEY_LEN: usize = 16;
/// Length of the fixed part of a Request/Reply frame (key, flags, Rev,
/// PD_Length), in octets. The frame is `HEADER_LEN + PD_Length` octets long.
pub const HEADER_LEN: usize = 20;
/// The key of an MPA Request frame, "MPA ID Req Frame" (RFC 5044, section 7.1.1).
pub const REQUEST_KEY: [u8; KEY_LEN] = *b"MPA ID Req Frame";
/// The key of an MPA Reply frame, "MPA ID Rep Frame" (RFC 5044, section 7.1.1).
pub const REPLY_KEY: [u8; KEY_LEN] = *b"MPA ID Rep Frame";
/// Largest private data length allowed on the wire, in octets (RFC 5044,
/// section 7.1.1: PD_Length MUST NOT exceed 512). With Rev 2 this includes
/// the 4-octet IRD/ORD word.
pub const MAX_PRIVATE_DATA_LEN: usize = 512;
/// Length of the RFC 6581 IRD/ORD word at the start of the private data, in octets.
pub const REV2_PARAMS_LEN: usize = 4;
/// IRD/ORD value meaning "no limit" (RFC 6581: `0x3FFF`).
pub const IRD_ORD_NO_LIMIT: u16 = 0x3FFF;
/// Mask of the 14-bit IRD and ORD fields of the IRD/ORD word.
pub const IRD_ORD_MASK: u16 = 0x3FFF;

/// Byte offsets of the frame fields (RFC 5044, section 7.1.1).
mod field {
    pub type Field = core::ops::Range<usize>;
    pub const KEY: Field = 0..16;
    pub const FLAGS: usize = 16;
    pub const REV: usize = 17;
    pub const PD_LEN: Field = 18..20;
    pub const PRIVATE_DATA: usize = 20;
}

/// Bits of the flags octet (octet 16 of the frame).
pub mod flags {
    /// `M`: the frame's sender wants Markers in the data it receives (RFC 5044, section 7.1.1).
    pub const MARKERS: u8 = 0x80;
    /// `C`: CRC wanted; CRC is used in both directions if either frame sets it (RFC 5044, section 7.1.1).
    pub const CRC: u8 = 0x40;
    /// `R`: the connection is rejected; only legal in a Reply (RFC 5044, section 7.1.1).
    pub const REJECT: u8 = 0x20;
    /// Enhanced RDMA connection establishment (RFC 6581): with Rev 2 the
    /// private data starts with the IRD/ORD word.
    pub const ENHANCED: u8 = 0x10;
    /// Reserved bits, zero on transmit, not checked on receipt (RFC 5044,
    /// section 7.1.1). In a Rev 1 frame [`ENHANCED`] is reserved as well (see
    /// [`super::reserved_mask`]).
    pub const RESERVED: u8 = 0x0F;
}

/// The bits of the flags octet that are reserved in a frame of revision
/// `rev`: [`flags::RESERVED`] (0x0F), plus [`flags::ENHANCED`] (0x10) in Rev 1,
/// where RFC 6581's enhanced bit does not exist (RFC 5044, section 7.1.1).
pub fn reserved_mask(rev: u8) -> u8 {
    if rev == 1 {
        flags::RESERVED | flags::ENHANCED
    } else {
        flags::RESERVED
    }
}

/// Which of the two startup frames a frame is, told apart by its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// MPA Request, sent by the initiator ("MPA ID Req Frame").
    Request,
    /// MPA Reply, sent by the responder ("MPA ID Rep Frame"), also used to reject.
    Reply,
}

impl FrameKind {
    /// The 16-octet key of this kind of frame.
    pub fn key(self) -> &'static [u8; KEY_LEN] {
        match self {
            FrameKind::Request => &REQUEST_KEY,
            FrameKind::Reply => &REPLY_KEY,
        }
    }

    /// The kind whose key is `key`, or `None` if `key` is neither key.
    pub fn from_key(key: &[u8]) -> Option<FrameKind> {
        if key == REQUEST_KEY {
            Some(FrameKind::Request)
        } else if key == REPLY_KEY {
            Some(FrameKind::Reply)
        } else {
            None
        }
    }
}

/// The zero-length RTR (ready-to-receive) message kinds of RFC 6581
/// peer-to-peer mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RtrKind {
    /// Zero-length Send (flag `B` of the IRD/ORD word).
    Send,
    /// Zero-length RDMA Write (flag `C`).
    Write,
    /// Zero-length RDMA Read Request (flag `D`).
    Read,
}

/// A set of [`RtrKind`]s, as carried by the `B`, `C` and `D` flags of the
/// RFC 6581 IRD/ORD word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtrKinds {
    /// `B`: zero-length Send.
    pub send: bool,
    /// `C`: zero-length RDMA Write.
    pub write: bool,
    /// `D`: zero-length RDMA Read.
    pub read: bool,
}

impl RtrKinds {
    /// The empty set.
    pub const NONE: RtrKinds = RtrKinds {
        send: false,
        write: false,
        read: false,
    };
    /// All three kinds.
    pub const ALL: RtrKinds = RtrKinds {
        send: true,
        write: true,
        read: true,
    };

    /// The set holding only `kind` (or the empty set for `None`).
    pub fn only(kind: Option<RtrKind>) -> RtrKinds {
        match kind {
            None => RtrKinds::NONE,
            Some(RtrKind::Send) => RtrKinds {
                send: true,
                ..RtrKinds::NONE
            },
            Some(RtrKind::Write) => RtrKinds {
                write: true,
                ..RtrKinds::NONE
            },
            Some(RtrKind::Read) => RtrKinds {
                read: true,
                ..RtrKinds::NONE
            },
        }
    }

    /// Whether no kind is in the set.
    pub fn is_empty(self) -> bool {
        !(self.send || self.write || self.read)
    }

    /// Whether `kind` is in the set.
    pub fn contains(self, kind: RtrKind) -> bool {
        match kind {
            RtrKind::Send => self.send,
            RtrKind::Write => self.write,
            RtrKind::Read => self.read,
        }
    }

    /// The kinds in both sets.
    pub fn intersection(self, other: RtrKinds) -> RtrKinds {
        RtrKinds {
            send: self.send && other.send,
            write: self.write && other.write,
            read: self.read && other.read,
        }
    }

    /// The preferred kind of the set: Write, then Read, then Send (the order
    /// Linux siw prefers; a zero-length Send would consume a posted Receive).
    pub fn preferred(self) -> Option<RtrKind> {
        if self.write {
            Some(RtrKind::Write)
        } else if self.read {
            Some(RtrKind::Read)
        } else if self.send {
            Some(RtrKind::Send)
        } else {
            None
        }
    }
}

/// The RFC 6581 "Enhanced RDMA Connection Establishment Data": the first
/// four octets of the private data of a Rev 2 frame with the enhanced bit.
///
/// ```text
///  0                   1                   2                   3
///  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
/// +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
/// |A|B|           IRD             |C|D|           ORD             |
/// +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
/// ```
///
/// `A`: peer-to-peer mode; `B`/`C`/`D`: zero-length Send / Write / Read RTR
/// ([`RtrKinds`]); IRD / ORD: inbound / outbound RDMA Read queue depth, 14
/// bits each, [`IRD_ORD_NO_LIMIT`] (`0x3FFF`) meaning no limit. In a Request
/// the RTR flags are the kinds the initiator can send; in a Reply the one kind
/// the responder chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rev2Params {
    /// `A`: peer-to-peer connection model.
    pub peer_to_peer: bool,
    /// The `B`, `C` and `D` RTR flags.
    pub rtr: RtrKinds,
    /// Inbound RDMA Read queue depth of the frame's sender (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth of the frame's sender (14 bits).
    pub ord: u16,
}

impl Rev2Params {
    const A_PEER_TO_PEER: u16 = 0x8000;
    const B_SEND_RTR: u16 = 0x4000;
    const C_WRITE_RTR: u16 = 0x8000;
    const D_READ_RTR: u16 = 0x4000;

    /// Parses the IRD/ORD word from the first four octets of `buf`.
    ///
    /// Errors: [`WireError::Truncated`] if `buf` is shorter than 4 octets.
    pub fn parse(buf: &[u8]) -> Result<Rev2Params, WireError> {
        if buf.len() < REV2_PARAMS_LEN {
            return Err(WireError::Truncated {
                needed: REV2_PARAMS_LEN,
                available: buf.len(),
            });
        }
        let hi = u16::from_be_bytes([buf[0], buf[1]]);
        let lo = u16::from_be_bytes([buf[2], buf[3]]);
        Ok(Rev2Params {
            peer_to_peer: hi & Self::A_PEER_TO_PEER != 0,
            rtr: RtrKinds {
                send: hi & Self::B_SEND_RTR != 0,
                write: lo & Self::C_WRITE_RTR != 0,
                read: lo & Self::D_READ_RTR != 0,
            },
            ird: hi & IRD_ORD_MASK,
            ord: lo & IRD_ORD_MASK,
        })
    }

    /// The four wire octets. IRD and ORD are masked to 14 bits; use
    /// [`Rev2Params::check`] first to reject larger values.
    pub fn to_bytes(&self) -> [u8; REV2_PARAMS_LEN] {
        let mut hi = self.ird & IRD_ORD_MASK;
        let mut lo = self.ord & IRD_ORD_MASK;
        if self.peer_to_peer {
            hi |= Self::A_PEER_TO_PEER;
        }
        if self.rtr.send {
            hi |= Self::B_SEND_RTR;
        }
        if self.rtr.write {
            lo |= Self::C_WRITE_RTR;
        }
        if self.rtr.read {
            lo |= Self::D_READ_RTR;
        }
        let [h0, h1] = hi.to_be_bytes();
        let [l0, l1] = lo.to_be_bytes();
        [h0, h1, l0, l1]
    }

    /// Checks that IRD and ORD fit in 14 bits.
    ///
    /// Errors: [`WireError::IrdOrdOutOfRange`] naming the offending value.
    pub fn check(&self) -> Result<(), WireError> {
        for value in [self.ird, self.ord] {
            if value > IRD_ORD_MASK {
                return Err(WireError::IrdOrdOutOfRange { value });
            }
        }
        Ok(())
    }
}

/// Parser limits and leniency for received frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted PD_Length, in octets (default 512, the RFC 5044
    /// maximum; includes the RFC 6581 IRD/ORD word).
    pub max_private_data_len: usize,
    /// Accept reserved flag bits, and the enhanced bit in a Rev 1 frame (where
    /// it is reserved), instead of failing with [`WireError::ReservedBits`] /
    /// [`WireError::EnhancedInRev1`] (default `true`: RFC 5044, section
    /// 7.1.1, says reserved bits are not checked on receipt, and Linux siw
    /// sets 0x08 for its private "GSO" extension when `try_gso` is on). The
    /// bits are otherwise ignored and kept in [`Repr::reserved`]. `false`
    /// (see [`Limits::strict`]) is for tests and picky peers.
    pub allow_reserved_bits: bool,
}

impl Default for Limits {
    /// PD_Length up to 512 octets, reserved bits accepted.
    fn default() -> Limits {
        Limits {
            max_private_data_len: MAX_PRIVATE_DATA_LEN,
            allow_reserved_bits: true,
        }
    }
}

impl Limits {
    /// Like the default, but reserved flag bits (and the enhanced bit in a
    /// Rev 1 frame) are errors: [`WireError::ReservedBits`],
    /// [`WireError::EnhancedInRev1`].
    pub fn strict() -> Limits {
        Limits {
            allow_reserved_bits: false,
            ..Limits::default()
        }
    }
}

/// What is wrong with a Request/Reply frame (or a [`Repr`] to emit).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// Fewer octets than the frame (or the buffer to emit into) needs.
    #[error("truncated MPA frame: {needed} octets needed, {available} available")]
    Truncated {
        /// Octets needed.
        needed: usize,
        /// Octets available.
        available: usize,
    },
    /// The key field is neither "MPA ID Req Frame" nor "MPA ID Rep Frame".
    #[error("bad MPA key: neither \"MPA ID Req Frame\" nor \"MPA ID Rep Frame\"")]
    BadKey,
    /// A valid key, but not the kind of frame the reader expected.
    #[error("unexpected MPA frame: expected a {expected:?}, found a {found:?}")]
    UnexpectedKind {
        /// The kind the reader waited for.
        expected: FrameKind,
        /// The kind that arrived.
        found: FrameKind,
    },
    /// The Rev field is neither 1 nor 2.
    #[error("bad MPA Rev {0}: only 1 and 2 are supported")]
    BadRevision(u8),
    /// Reserved bits (0x0F) of the flags octet are set, when parsing with
    /// [`Limits::allow_reserved_bits`] off ([`Limits::strict`]).
    #[error("reserved bits set in the MPA flags octet: {0:#04x}")]
    ReservedBits(u8),
    /// A Repr to emit has [`Repr::reserved`] bits that are not reserved in a
    /// frame of its Rev (see [`reserved_mask`]): they would overwrite `M`,
    /// `C`, `R` or the enhanced bit.
    #[error(
        "Repr::reserved {value:#04x} has bits outside the reserved bits {mask:#04x} of its Rev"
    )]
    NotReserved {
        /// The `reserved` field.
        value: u8,
        /// The reserved bits of the frame's Rev.
        mask: u8,
    },
    /// The R (reject) bit is set in a Request.
    #[error("R (reject) bit set in an MPA Request")]
    RejectInRequest,
    /// The enhanced bit (0x10) is set in a Rev 1 frame, where it is reserved
    /// (when parsing with [`Limits::strict`]; or a Repr to emit has `rev` 1
    /// and `enhanced` set: a Rev 1 frame carries a received 0x10 in
    /// [`Repr::reserved`] instead).
    #[error("enhanced bit (0x10) set in an MPA Rev 1 frame")]
    EnhancedInRev1,
    /// PD_Length (or the private data of a Repr) is over the limit.
    #[error("private data length {len} over the limit of {limit} octets")]
    PrivateDataTooLong {
        /// PD_Length, in octets.
        len: usize,
        /// The limit, in octets.
        limit: usize,
    },
    /// A Rev 2 frame has the enhanced bit but the private data is shorter than
    /// the 4-octet IRD/ORD word (or a Repr to emit has the bit but no
    /// [`Rev2Params`]).
    #[error(
        "enhanced MPA Rev 2 frame without the 4-octet IRD/ORD word ({len} octets of private data)"
    )]
    Rev2ParamsMissing {
        /// PD_Length, in octets.
        len: usize,
    },
    /// A Repr to emit has [`Rev2Params`] but not the enhanced bit with Rev 2.
    #[error("IRD/ORD word given for a frame without the enhanced bit and Rev 2")]
    Rev2ParamsUnexpected,
    /// An IRD or ORD value to emit does not fit in 14 bits.
    #[error("IRD/ORD value {value:#x} does not fit in 14 bits")]
    IrdOrdOutOfRange {
        /// The offending value.
        value: u16,
    },
}

impl WireError {
    /// The LLP error code for a Terminate about a malformed Request/Reply:
    /// always 0x04, "Invalid MPA Request or Reply frame" (RFC 5044, section 8).
    pub fn llp_error_code(&self) -> crate::LlpErrorCode {
        crate::LlpErrorCode::InvalidRequestReply
    }
}

/// A read/write view of an MPA Request/Reply frame in a byte buffer.
///
/// [`Packet::new_checked`] guarantees that the buffer holds the whole frame
/// (header and PD_Length octets of private data), so no accessor panics.
/// The buffer may be longer than the frame (FPDUs may follow a Reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checking its length; accessors may panic on a
    /// short buffer. Prefer [`Packet::new_checked`].
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after [`Packet::check_len`].
    ///
    /// Errors: [`WireError::Truncated`] if the buffer is shorter than the
    /// 20-octet header or than `20 + PD_Length`.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds the header and all the private data.
    ///
    /// Errors: [`WireError::Truncated`] with the octets needed so far.
    pub fn check_len(&self) -> Result<(), WireError> {
        let available = self.buffer.as_ref().len();
        if available < HEADER_LEN {
            return Err(WireError::Truncated {
                needed: HEADER_LEN,
                available,
            });
        }
        let needed = self.frame_len();
        if available < needed {
            return Err(WireError::Truncated { needed, available });
        }
        Ok(())
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The 16-octet key field.
    pub fn key(&self) -> &[u8] {
        &self.buffer.as_ref()[field::KEY]
    }

    /// The frame kind told by the key, `None` for a bad key.
    pub fn kind(&self) -> Option<FrameKind> {
        FrameKind::from_key(self.key())
    }

    /// The whole flags octet (see [`flags`]).
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// `M`: the sender wants Markers in the data it receives.
    pub fn markers(&self) -> bool {
        self.flags() & flags::MARKERS != 0
    }

    /// `C`: the sender wants CRC.
    pub fn crc(&self) -> bool {
        self.flags() & flags::CRC != 0
    }

    /// `R`: reject.
    pub fn reject(&self) -> bool {
        self.flags() & flags::REJECT != 0
    }

    /// The RFC 6581 enhanced bit (0x10).
    pub fn enhanced(&self) -> bool {
        self.flags() & flags::ENHANCED != 0
    }

    /// The reserved bits of the flags octet (`flags & 0x0F`).
    pub fn reserved_bits(&self) -> u8 {
        self.flags() & flags::RESERVED
    }

    /// The Rev field.
    pub fn rev(&self) -> u8 {
        self.buffer.as_ref()[field::REV]
    }

    /// PD_Length: the private data length, in octets.
    pub fn private_data_len(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::PD_LEN];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// Length of the whole frame, `20 + PD_Length`, in octets. Needs only the
    /// 20-octet header.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + usize::from(self.private_data_len())
    }

    /// The private data (including the RFC 6581 IRD/ORD word, if any); cut
    /// short if the buffer is.
    pub fn private_data(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        let end = self.frame_len().min(buf.len());
        &buf[field::PRIVATE_DATA.min(end)..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes the key of `kind`.
    pub fn set_key(&mut self, kind: FrameKind) {
        self.buffer.as_mut()[field::KEY].copy_from_slice(kind.key());
    }

    /// Writes the flags octet.
    pub fn set_flags(&mut self, value: u8) {
        self.buffer.as_mut()[field::FLAGS] = value;
    }

    /// Writes the Rev field.
    pub fn set_rev(&mut self, value: u8) {
        self.buffer.as_mut()[field::REV] = value;
    }

    /// Writes PD_Length, in octets.
    pub fn set_private_data_len(&mut self, value: u16) {
        self.buffer.as_mut()[field::PD_LEN].copy_from_slice(&value.to_be_bytes());
    }

    /// The private data, mutable; cut short if the buffer is.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        let end = self.frame_len();
        let buf = self.buffer.as_mut();
        let end = end.min(buf.len());
        &mut buf[field::PRIVATE_DATA.min(end)..end]
    }
}

/// Validates the 20-octet header; returns the frame kind and the frame length.
fn check_header(header: &[u8], limits: &Limits) -> Result<(FrameKind, usize), WireError> {
    if header.len() < HEADER_LEN {
        return Err(WireError::Truncated {
            needed: HEADER_LEN,
            available: header.len(),
        });
    }
    let packet = Packet::new_unchecked(header);
    let kind = packet.kind().ok_or(WireError::BadKey)?;
    let rev = packet.rev();
    if rev != 1 && rev != 2 {
        return Err(WireError::BadRevision(rev));
    }
    if !limits.allow_reserved_bits {
        if packet.reserved_bits() != 0 {
            return Err(WireError::ReservedBits(packet.reserved_bits()));
        }
        if rev == 1 && packet.enhanced() {
            return Err(WireError::EnhancedInRev1);
        }
    }
    if kind == FrameKind::Request && packet.reject() {
        return Err(WireError::RejectInRequest);
    }
    let len = usize::from(packet.private_data_len());
    if len > limits.max_private_data_len {
        return Err(WireError::PrivateDataTooLong {
            len,
            limit: limits.max_private_data_len,
        });
    }
    Ok((kind, HEADER_LEN + len))
}

/// How many octets the frame at the front of `buf` takes, once its 20-octet
/// header is there: `Ok(None)` while fewer than 20 octets are buffered,
/// `Ok(Some(20 + PD_Length))` after. The header is validated on the way, so a
/// stream of garbage fails after 20 octets instead of after PD_Length more.
///
/// Errors: as [`Repr::parse`] for the header fields (bad key, Rev, reserved
/// bits, R in a Request, PD_Length over the limit).
pub fn needed_len(buf: &[u8], limits: &Limits) -> Result<Option<usize>, WireError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    check_header(buf, limits).map(|(_, len)| Some(len))
}

/// An MPA Request or Reply frame, validated (RFC 5044, section 7.1.1; RFC 6581).
///
/// Invariant of a parsed frame: `rev2` is `Some` exactly when `rev == 2`,
/// `enhanced` is set and the private data holds the 4-octet IRD/ORD word
/// (a Rev 2 enhanced frame without it is an error, except in a reject Reply,
/// where it is tolerated and `rev2` is `None`). `private_data` is the ULP
/// private data behind the IRD/ORD word. `reserved` holds the reserved flag
/// bits as received (see [`Limits::allow_reserved_bits`]), so that
/// [`Repr::emit`] gives back the parsed octets exactly.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Request or Reply (the key).
    pub kind: FrameKind,
    /// `M`: the sender wants Markers in the data it receives.
    pub markers: bool,
    /// `C`: the sender wants CRC.
    pub crc: bool,
    /// `R`: the connection is rejected (Reply only).
    pub reject: bool,
    /// The RFC 6581 enhanced bit.
    pub enhanced: bool,
    /// The reserved bits of the flags octet (within [`reserved_mask`] of
    /// `rev`: 0x0F, and 0x10 in Rev 1) as received, emitted as they are. Zero
    /// in every frame this crate builds (RFC 5044, section 7.1.1: zero on
    /// transmit); a non-zero value is only for re-emitting a received frame.
    pub reserved: u8,
    /// Rev: 1 or 2.
    pub rev: u8,
    /// The RFC 6581 IRD/ORD word, when present.
    pub rev2: Option<Rev2Params>,
    /// The ULP private data (behind the IRD/ORD word, if any), in octets.
    pub private_data: Vec<u8>,
}

impl Repr {
    /// Parses and validates the frame in `packet`.
    ///
    /// Errors (each names the field): [`WireError::Truncated`],
    /// [`WireError::BadKey`], [`WireError::BadRevision`],
    /// [`WireError::ReservedBits`] and [`WireError::EnhancedInRev1`] (only
    /// with [`Limits::allow_reserved_bits`] off),
    /// [`WireError::RejectInRequest`], [`WireError::PrivateDataTooLong`]
    /// (PD_Length over `limits.max_private_data_len`),
    /// [`WireError::Rev2ParamsMissing`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>, limits: &Limits) -> Result<Repr, WireError> {
        let (kind, frame_len) = check_header(packet.buffer.as_ref(), limits)?;
        packet.check_len()?;
        debug_assert_eq!(frame_len, packet.frame_len());
        let rev = packet.rev();
        let enhanced = packet.enhanced() && !(rev == 1 && limits.allow_reserved_bits);
        let reject = packet.reject();
        let pd = packet.private_data();
        let (rev2, ulp) = if rev == 2 && enhanced {
            if pd.len() >= REV2_PARAMS_LEN {
                (Some(Rev2Params::parse(pd)?), &pd[REV2_PARAMS_LEN..])
            } else if reject {
                (None, pd)
            } else {
                return Err(WireError::Rev2ParamsMissing { len: pd.len() });
            }
        } else {
            (None, pd)
        };
        Ok(Repr {
            kind,
            markers: packet.markers(),
            crc: packet.crc(),
            reject,
            enhanced,
            reserved: packet.flags() & reserved_mask(rev),
            rev,
            rev2,
            private_data: ulp.to_vec(),
        })
    }

    /// Parses the frame at the front of `buf`; returns it and its length in
    /// octets (octets behind it, e.g. FPDUs after a Reply, are not touched).
    ///
    /// Errors: as [`Repr::parse`].
    pub fn parse_bytes(buf: &[u8], limits: &Limits) -> Result<(Repr, usize), WireError> {
        let (_, frame_len) = check_header(buf, limits)?;
        let packet = Packet::new_checked(buf)?;
        Ok((Repr::parse(&packet, limits)?, frame_len))
    }

    /// The flags octet this Repr emits: `M`, `C`, `R`, the enhanced bit and
    /// the [`Repr::reserved`] bits.
    pub fn flags(&self) -> u8 {
        let mut value = self.reserved;
        if self.markers {
            value |= flags::MARKERS;
        }
        if self.crc {
            value |= flags::CRC;
        }
        if self.reject {
            value |= flags::REJECT;
        }
        if self.enhanced {
            value |= flags::ENHANCED;
        }
        value
    }

    /// PD_Length this Repr emits: the IRD/ORD word (if any) plus the ULP
    /// private data, in octets.
    pub fn private_data_len(&self) -> usize {
        self.rev2.map_or(0, |_| REV2_PARAMS_LEN) + self.private_data.len()
    }

    /// Length of the emitted frame, `20 + PD_Length`, in octets.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.private_data_len()
    }

    /// Checks that the Repr can be emitted as a valid frame (what
    /// [`Repr::parse`] with default [`Limits`] would accept back unchanged).
    ///
    /// Errors: [`WireError::BadRevision`], [`WireError::NotReserved`],
    /// [`WireError::RejectInRequest`], [`WireError::EnhancedInRev1`],
    /// [`WireError::PrivateDataTooLong`] (over 512 octets),
    /// [`WireError::Rev2ParamsMissing`], [`WireError::Rev2ParamsUnexpected`],
    /// [`WireError::IrdOrdOutOfRange`].
    pub fn check(&self) -> Result<(), WireError> {
        if self.rev != 1 && self.rev != 2 {
            return Err(WireError::BadRevision(self.rev));
        }
        let mask = reserved_mask(self.rev);
        if self.reserved & !mask != 0 {
            return Err(WireError::NotReserved {
                value: self.reserved,
                mask,
            });
        }
        if self.kind == FrameKind::Request && self.reject {
            return Err(WireError::RejectInRequest);
        }
        if self.rev == 1 && self.enhanced {
            return Err(WireError::EnhancedInRev1);
        }
        let len = self.private_data_len();
        if len > MAX_PRIVATE_DATA_LEN {
            return Err(WireError::PrivateDataTooLong {
                len,
                limit: MAX_PRIVATE_DATA_LEN,
            });
        }
        match self.rev2 {
            Some(params) => {
                if !(self.enhanced && self.rev == 2) {
                    return Err(WireError::Rev2ParamsUnexpected);
                }
                params.check()?;
            }
            None => {
                // Only a reject Reply may carry the enhanced bit without the
                // word, and then only with too little private data to hold one
                // (otherwise it would parse back as an IRD/ORD word).
                let tolerated = self.reject && self.private_data.len() < REV2_PARAMS_LEN;
                if self.enhanced && self.rev == 2 && !tolerated {
                    return Err(WireError::Rev2ParamsMissing {
                        len: self.private_data.len(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Writes the frame into `packet`, whose buffer must hold
    /// [`Repr::buffer_len`] octets (more is fine and left untouched).
    ///
    /// Errors: as [`Repr::check`], and [`WireError::Truncated`] if the buffer
    /// is too short. Nothing is written on error.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut Packet<T>,
    ) -> Result<(), WireError> {
        self.check()?;
        let needed = self.buffer_len();
        let available = packet.buffer.as_ref().len();
        if available < needed {
            return Err(WireError::Truncated { needed, available });
        }
        packet.set_key(self.kind);
        packet.set_flags(self.flags());
        packet.set_rev(self.rev);
        // check() bounds the private data length by 512.
        packet.set_private_data_len(self.private_data_len() as u16);
        let pd = packet.private_data_mut();
        let ulp_start = match self.rev2 {
            Some(params) => {
                pd[..REV2_PARAMS_LEN].copy_from_slice(&params.to_bytes());
                REV2_PARAMS_LEN
            }
            None => 0,
        };
        pd[ulp_start..].copy_from_slice(&self.private_data);
        Ok(())
    }

    /// The frame as a new vector of [`Repr::buffer_len`] octets.
    ///
    /// Errors: as [`Repr::check`].
    pub fn to_bytes(&self) -> Result<Vec<u8>, WireError> {
        let mut buf = vec![0u8; self.buffer_len()];
        self.emit(&mut Packet::new_unchecked(&mut buf[..]))?;
        Ok(buf)
    }
}

/// The outcome of [`StartupReader::push`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Startup<'a> {
    /// All offered octets were taken; the frame is not complete yet.
    Incomplete,
    /// The frame is complete.
    Complete {
        /// The parsed frame.
        frame: Repr,
        /// The octets of the pushed chunk behind the frame: the start of the
        /// FPDU stream (RFC 5044, section 7.1.2), to be fed to a
        /// [`crate::deframer::Deframer`].
        rest: &'a [u8],
    },
}

/// Reads one MPA Request or Reply from the front of a TCP byte stream fed in
/// arbitrary chunks, and hands back the octets behind it.
///
/// It buffers at most the frame itself (`20 + PD_Length` octets, PD_Length
/// bounded by [`Limits::max_private_data_len`]); when a whole frame arrives in
/// one chunk it is parsed in place. After a [`Startup::Complete`] the reader
/// is empty and could read another frame; after an error the connection
/// should be closed (RFC 5044, section 7.1.2).
#[derive(Debug, Clone)]
pub struct StartupReader {
    expect: Option<FrameKind>,
    limits: Limits,
    buf: Vec<u8>,
}

impl StartupReader {
    /// A reader expecting a frame of kind `expect` (`None`: either kind),
    /// checked against `limits`.
    pub fn new(expect: Option<FrameKind>, limits: Limits) -> StartupReader {
        StartupReader {
            expect,
            limits,
            buf: Vec::new(),
        }
    }

    /// Octets of an incomplete frame buffered so far.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Takes octets from `data` until the frame is complete.
    ///
    /// Returns [`Startup::Incomplete`] if all of `data` was taken and more is
    /// needed, or [`Startup::Complete`] with the frame and the rest of `data`.
    ///
    /// Errors: as [`Repr::parse`], plus [`WireError::UnexpectedKind`] when
    /// the key is valid but not the expected kind. Header errors are reported
    /// as soon as the 20-octet header is in.
    pub fn push<'a>(&mut self, data: &'a [u8]) -> Result<Startup<'a>, WireError> {
        if self.buf.is_empty() && data.len() >= HEADER_LEN {
            // Fast path: the whole frame in this chunk, parse it in place. The
            // key is checked first, so that a [`WireError::BadRevision`] from a
            // reader that expects one kind is known to be of that kind (a
            // responder answers a Request of an unsupported Rev with a reject).
            self.check_kind(data)?;
            if let Some(frame_len) = needed_len(data, &self.limits)? {
                if data.len() >= frame_len {
                    let (frame, len) = Repr::parse_bytes(data, &self.limits)?;
                    return Ok(Startup::Complete {
                        frame,
                        rest: &data[len..],
                    });
                }
            }
        }
        let mut data = data;
        if self.buf.len() < HEADER_LEN {
            let take = (HEADER_LEN - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.buf.len() < HEADER_LEN {
                return Ok(Startup::Incomplete);
            }
        }
        self.check_kind(&self.buf)?;
        let frame_len = match needed_len(&self.buf, &self.limits) {
            Ok(Some(len)) => len,
            Ok(None) => return Ok(Startup::Incomplete),
            Err(e) => return Err(e),
        };
        let take = (frame_len - self.buf.len()).min(data.len());
        self.buf.extend_from_slice(&data[..take]);
        data = &data[take..];
        if self.buf.len() < frame_len {
            return Ok(Startup::Incomplete);
        }
        let result = Repr::parse_bytes(&self.buf, &self.limits);
        self.buf.clear();
        let (frame, _) = result?;
        Ok(Startup::Complete { frame, rest: data })
    }

    fn check_kind(&self, header: &[u8]) -> Result<(), WireError> {
        let found = FrameKind::from_key(&header[field::KEY]).ok_or(WireError::BadKey)?;
        match self.expect {
            Some(expected) if expected != found => {
                Err(WireError::UnexpectedKind { expected, found })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_vectors::*;

    fn limits() -> Limits {
        Limits::default()
    }

    /// rping.pcap frame 6.
    #[test]
    fn deconstruct() {
        let bytes = unhex(RPING_REQUEST);
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.key(), b"MPA ID Req Frame");
        assert_eq!(packet.kind(), Some(FrameKind::Request));
        assert_eq!(packet.flags(), 0x10);
        assert!(!packet.markers());
        assert!(!packet.crc());
        assert!(!packet.reject());
        assert!(packet.enhanced());
        assert_eq!(packet.reserved_bits(), 0);
        assert_eq!(packet.rev(), 2);
        assert_eq!(packet.private_data_len(), 4);
        assert_eq!(packet.frame_len(), 24);
        assert_eq!(packet.private_data(), &[0x00, 0x01, 0x00, 0x01]);
        let repr = Repr::parse(&packet, &limits()).unwrap();
        assert_eq!(
            repr,
            Repr {
                kind: FrameKind::Request,
                markers: false,
                crc: false,
                reject: false,
                enhanced: true,
                reserved: 0,
                rev: 2,
                rev2: Some(Rev2Params {
                    peer_to_peer: false,
                    rtr: RtrKinds::NONE,
                    ird: 1,
                    ord: 1
                }),
                private_data: vec![],
            }
        );
    }

    #[test]
    fn construct() {
        let repr = Repr {
            kind: FrameKind::Reply,
            markers: false,
            crc: false,
            reject: false,
            enhanced: true,
            reserved: 0,
            rev: 2,
            rev2: Some(Rev2Params {
                peer_to_peer: false,
                rtr: RtrKinds::NONE,
                ird: 1,
                ord: 1,
            }),
            private_data: vec![],
        };
        assert_eq!(repr.buffer_len(), 24);
        let mut buf = [0xa5u8; 30];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(&buf[..24], &unhex(RPING_REPLY)[..]);
        assert_eq!(&buf[24..], &[0xa5; 6], "octets behind the frame untouched");
        assert_eq!(repr.to_bytes().unwrap(), unhex(RPING_REPLY));
    }

    /// All six captured Request/Reply frames: parse gives the right fields,
    /// emit gives the same bytes back.
    #[test]
    fn captured_frames_round_trip() {
        let cases: [(&str, FrameKind, bool, Rev2Params); 6] = [
            (
                RPING_REQUEST,
                FrameKind::Request,
                false,
                Rev2Params {
                    ird: 1,
                    ord: 1,
                    ..Default::default()
                },
            ),
            (
                RPING_REPLY,
                FrameKind::Reply,
                false,
                Rev2Params {
                    ird: 1,
                    ord: 1,
                    ..Default::default()
                },
            ),
            (
                P2P_REQUEST,
                FrameKind::Request,
                false,
                Rev2Params {
                    peer_to_peer: true,
                    rtr: RtrKinds {
                        send: false,
                        write: true,
                        read: true,
                    },
                    ird: 1,
                    ord: 1,
                },
            ),
            (
                P2P_REPLY,
                FrameKind::Reply,
                false,
                Rev2Params {
                    peer_to_peer: true,
                    rtr: RtrKinds::only(Some(RtrKind::Write)),
                    ird: 1,
                    ord: 1,
                },
            ),
            (
                CRC_REQUEST,
                FrameKind::Request,
                true,
                Rev2Params {
                    ird: 1,
                    ord: 1,
                    ..Default::default()
                },
            ),
            (
                CRC_REPLY,
                FrameKind::Reply,
                true,
                Rev2Params {
                    ird: 1,
                    ord: 1,
                    ..Default::default()
                },
            ),
        ];
        for (hex, kind, crc, params) in cases {
            let bytes = unhex(hex);
            let (repr, len) = Repr::parse_bytes(&bytes, &limits()).unwrap();
            assert_eq!(len, 24);
            assert_eq!(repr.kind, kind, "{hex}");
            assert_eq!(repr.crc, crc, "{hex}");
            assert!(!repr.markers && !repr.reject && repr.enhanced);
            assert_eq!(repr.rev, 2);
            assert_eq!(repr.rev2, Some(params), "{hex}");
            assert!(repr.private_data.is_empty());
            assert_eq!(repr.to_bytes().unwrap(), bytes, "{hex}");
        }
        // The IRD/ORD words of the p2p capture, field by field.
        assert_eq!(
            Rev2Params::parse(&[0x80, 0x01, 0xc0, 0x01])
                .unwrap()
                .to_bytes(),
            [0x80, 0x01, 0xc0, 0x01]
        );
        assert_eq!(
            Rev2Params::parse(&[0x80, 0x01, 0x80, 0x01])
                .unwrap()
                .rtr
                .preferred(),
            Some(RtrKind::Write)
        );
    }

    #[test]
    fn rev2_params_fields() {
        let p = Rev2Params::parse(&[0xff, 0xff, 0xff, 0xff]).unwrap();
        assert_eq!(
            p,
            Rev2Params {
                peer_to_peer: true,
                rtr: RtrKinds::ALL,
                ird: 0x3fff,
                ord: 0x3fff
            }
        );
        let p = Rev2Params::parse(&[0x40, 0x00, 0x00, 0x00]).unwrap();
        assert_eq!(p.rtr, RtrKinds::only(Some(RtrKind::Send)));
        assert!(!p.peer_to_peer);
        let p = Rev2Params::parse(&[0x00, 0x00, 0x40, 0x05]).unwrap();
        assert_eq!(p.rtr, RtrKinds::only(Some(RtrKind::Read)));
        assert_eq!(p.ord, 5);
        assert_eq!(
            Rev2Params {
                ird: 0x4000,
                ..Default::default()
            }
            .check(),
            Err(WireError::IrdOrdOutOfRange { value: 0x4000 })
        );
        assert_eq!(
            Rev2Params::parse(&[1, 2, 3]),
            Err(WireError::Truncated {
                needed: 4,
                available: 3
            })
        );
    }

    #[test]
    fn rev1_with_private_data_and_flags() {
        let repr = Repr {
            kind: FrameKind::Request,
            markers: true,
            crc: true,
            reject: false,
            enhanced: false,
            reserved: 0,
            rev: 1,
            rev2: None,
            private_data: b"hello".to_vec(),
        };
        let bytes = repr.to_bytes().unwrap();
        let mut expected = b"MPA ID Req Frame".to_vec();
        expected.extend_from_slice(&[0xc0, 0x01, 0x00, 0x05]);
        expected.extend_from_slice(b"hello");
        assert_eq!(bytes, expected);
        assert_eq!(Repr::parse_bytes(&bytes, &limits()).unwrap(), (repr, 25));
    }

    #[test]
    fn truncated() {
        let bytes = unhex(P2P_REQUEST);
        for len in 0..bytes.len() {
            let needed = if len < HEADER_LEN { HEADER_LEN } else { 24 };
            assert_eq!(
                Packet::new_checked(&bytes[..len]).unwrap_err(),
                WireError::Truncated {
                    needed,
                    available: len
                }
            );
            assert_eq!(
                Repr::parse_bytes(&bytes[..len], &limits()).unwrap_err(),
                WireError::Truncated {
                    needed,
                    available: len
                }
            );
        }
        // Rev 2 enhanced with fewer than 4 octets of private data.
        let mut short = unhex(RPING_REQUEST);
        short[19] = 3;
        short.truncate(23);
        assert_eq!(
            Repr::parse_bytes(&short, &limits()),
            Err(WireError::Rev2ParamsMissing { len: 3 })
        );
        // ... tolerated in a reject Reply.
        let mut reject = unhex(RPING_REPLY);
        reject[16] |= flags::REJECT;
        reject[19] = 0;
        reject.truncate(20);
        let (repr, _) = Repr::parse_bytes(&reject, &limits()).unwrap();
        assert!(repr.reject && repr.enhanced && repr.rev2.is_none());
        assert_eq!(repr.to_bytes().unwrap(), reject);
        // A too short emit buffer.
        let repr = Repr::parse_bytes(&unhex(RPING_REPLY), &limits()).unwrap().0;
        let mut buf = [0u8; 23];
        assert_eq!(
            repr.emit(&mut Packet::new_unchecked(&mut buf[..])),
            Err(WireError::Truncated {
                needed: 24,
                available: 23
            })
        );
        assert_eq!(buf, [0u8; 23], "nothing written on error");
    }

    #[test]
    fn impossible_len() {
        let mut bytes = unhex(RPING_REQUEST);
        bytes[18..20].copy_from_slice(&513u16.to_be_bytes());
        assert_eq!(
            Repr::parse_bytes(&bytes, &limits()),
            Err(WireError::PrivateDataTooLong {
                len: 513,
                limit: 512
            })
        );
        assert_eq!(
            needed_len(&bytes, &limits()),
            Err(WireError::PrivateDataTooLong {
                len: 513,
                limit: 512
            })
        );
        bytes[18..20].copy_from_slice(&0xffffu16.to_be_bytes());
        let tight = Limits {
            max_private_data_len: 4,
            ..Limits::default()
        };
        assert_eq!(
            Repr::parse_bytes(&bytes, &tight),
            Err(WireError::PrivateDataTooLong {
                len: 0xffff,
                limit: 4
            })
        );
        // Within the limit but beyond the buffer.
        bytes[18..20].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(
            Repr::parse_bytes(&bytes, &limits()),
            Err(WireError::Truncated {
                needed: 120,
                available: 24
            })
        );
        // Emitting more than 512 octets of private data.
        let mut repr = Repr::parse_bytes(&unhex(RPING_REQUEST), &limits())
            .unwrap()
            .0;
        repr.private_data = vec![0; 509];
        assert_eq!(
            repr.to_bytes(),
            Err(WireError::PrivateDataTooLong {
                len: 513,
                limit: 512
            })
        );
        repr.private_data = vec![7; 508];
        let bytes = repr.to_bytes().unwrap();
        assert_eq!(bytes.len(), 532);
        assert_eq!(Repr::parse_bytes(&bytes, &limits()).unwrap().0, repr);
    }

    #[test]
    fn malformed_headers_name_the_field() {
        let good = unhex(RPING_REQUEST);
        let with = |i: usize, v: u8| {
            let mut b = good.clone();
            b[i] = v;
            b
        };
        assert_eq!(
            Repr::parse_bytes(&with(0, b'X'), &limits()),
            Err(WireError::BadKey)
        );
        assert_eq!(
            Repr::parse_bytes(&with(13, b'x'), &limits()),
            Err(WireError::BadKey)
        );
        assert_eq!(
            Repr::parse_bytes(&with(17, 0), &limits()),
            Err(WireError::BadRevision(0))
        );
        assert_eq!(
            Repr::parse_bytes(&with(17, 3), &limits()),
            Err(WireError::BadRevision(3))
        );
        // Strict limits: reserved bits are errors.
        let strict = Limits::strict();
        assert_eq!(
            Repr::parse_bytes(&with(16, 0x11), &strict),
            Err(WireError::ReservedBits(0x01))
        );
        assert_eq!(
            Repr::parse_bytes(&with(16, 0x18), &strict),
            Err(WireError::ReservedBits(0x08))
        );
        assert_eq!(
            Repr::parse_bytes(&with(16, 0x30), &limits()),
            Err(WireError::RejectInRequest)
        );
        let rev1 = with(17, 1);
        assert_eq!(
            Repr::parse_bytes(&rev1, &strict),
            Err(WireError::EnhancedInRev1)
        );
        // Lenient parsing ignores the reserved bits and the Rev 1 enhanced bit
        // (apart from keeping them in `reserved`).
        let lenient = Limits {
            allow_reserved_bits: true,
            ..Limits::default()
        };
        let (repr, _) = Repr::parse_bytes(&with(16, 0x18), &lenient).unwrap();
        assert_eq!(repr.reserved, 0x08);
        assert_eq!(
            Repr {
                reserved: 0,
                ..repr
            },
            Repr::parse_bytes(&good, &limits()).unwrap().0
        );
        let (repr, _) = Repr::parse_bytes(&rev1, &lenient).unwrap();
        assert!(!repr.enhanced && repr.rev2.is_none());
        assert_eq!(repr.reserved, 0x10);
        assert_eq!(repr.private_data, vec![0, 1, 0, 1]);
        // Emit-side checks.
        let base = Repr::parse_bytes(&good, &limits()).unwrap().0;
        assert_eq!(
            Repr {
                reject: true,
                ..base.clone()
            }
            .to_bytes(),
            Err(WireError::RejectInRequest)
        );
        assert_eq!(
            Repr {
                rev: 3,
                ..base.clone()
            }
            .to_bytes(),
            Err(WireError::BadRevision(3))
        );
        assert_eq!(
            Repr {
                rev: 1,
                ..base.clone()
            }
            .to_bytes(),
            Err(WireError::EnhancedInRev1)
        );
        assert_eq!(
            Repr {
                enhanced: false,
                ..base.clone()
            }
            .to_bytes(),
            Err(WireError::Rev2ParamsUnexpected)
        );
        assert_eq!(
            Repr {
                rev2: None,
                ..base.clone()
            }
            .to_bytes(),
            Err(WireError::Rev2ParamsMissing { len: 0 })
        );
    }

    /// RFC 5044 7.1.1: Res bits are not checked on reception. The default
    /// limits accept them (Linux siw's 0x08 "GSO" bit included), the parsed
    /// Repr keeps them, and emitting it gives back the received octets; the
    /// strict limits still reject them.
    #[test]
    fn reserved_bits_accepted_by_default_and_re_emitted() {
        assert_eq!(
            Limits::default(),
            Limits {
                max_private_data_len: 512,
                allow_reserved_bits: true,
            }
        );
        assert!(!Limits::strict().allow_reserved_bits);
        for (hex, flags) in [
            (RPING_REQUEST, 0x18u8),
            (RPING_REPLY, 0x1f),
            (CRC_REPLY, 0x58),
            (P2P_REQUEST, 0x11),
        ] {
            let mut bytes = unhex(hex);
            bytes[16] = flags;
            let (repr, len) = Repr::parse_bytes(&bytes, &Limits::default()).unwrap();
            assert_eq!(len, 24);
            assert_eq!(repr.reserved, flags & 0x0f, "{hex}");
            assert!(repr.enhanced);
            assert_eq!(repr.crc, flags & 0x40 != 0);
            assert_eq!(repr.flags(), flags);
            assert_eq!(
                repr.to_bytes().unwrap(),
                bytes,
                "re-emitted octet for octet"
            );
            assert_eq!(needed_len(&bytes, &Limits::default()), Ok(Some(24)));
            let mut reader = StartupReader::new(None, Limits::default());
            assert!(matches!(
                reader.push(&bytes),
                Ok(Startup::Complete { frame, .. }) if frame == repr
            ));
            assert_eq!(
                Repr::parse_bytes(&bytes, &Limits::strict()),
                Err(WireError::ReservedBits(flags & 0x0f))
            );
        }
        // Rev 1: 0x10 is reserved too.
        let repr = Repr {
            kind: FrameKind::Request,
            markers: false,
            crc: true,
            reject: false,
            enhanced: false,
            reserved: 0x18,
            rev: 1,
            rev2: None,
            private_data: vec![],
        };
        let bytes = repr.to_bytes().unwrap();
        assert_eq!(bytes[16], 0x58);
        assert_eq!(
            Repr::parse_bytes(&bytes, &Limits::default()),
            Ok((repr.clone(), 20))
        );
        // A `reserved` with non-reserved bits cannot be emitted.
        assert_eq!(
            Repr {
                reserved: 0x20,
                ..repr.clone()
            }
            .to_bytes(),
            Err(WireError::NotReserved {
                value: 0x20,
                mask: 0x1f
            })
        );
        let rev2 = Repr::parse_bytes(&unhex(RPING_REQUEST), &Limits::default())
            .unwrap()
            .0;
        assert_eq!(rev2.reserved, 0);
        assert_eq!(
            Repr {
                reserved: 0x10,
                ..rev2
            }
            .check(),
            Err(WireError::NotReserved {
                value: 0x10,
                mask: 0x0f
            })
        );
    }

    #[test]
    fn needed_len_after_header() {
        let bytes = unhex(P2P_REQUEST);
        for len in 0..HEADER_LEN {
            assert_eq!(needed_len(&bytes[..len], &limits()), Ok(None));
        }
        assert_eq!(needed_len(&bytes[..HEADER_LEN], &limits()), Ok(Some(24)));
        assert_eq!(needed_len(&bytes, &limits()), Ok(Some(24)));
        assert_eq!(needed_len(&[0u8; 20], &limits()), Err(WireError::BadKey));
    }

    /// The Reply and the first FPDUs of rping-srv_crc-cli_crc.pcap in one
    /// chunk, and one octet at a time.
    #[test]
    fn startup_reader_hands_back_fpdus() {
        let stream = unhex(CRC_RESPONDER_STREAM);
        let mut reader = StartupReader::new(Some(FrameKind::Reply), limits());
        match reader.push(&stream).unwrap() {
            Startup::Complete { frame, rest } => {
                assert_eq!(frame.kind, FrameKind::Reply);
                assert!(frame.crc);
                assert_eq!(rest, &stream[24..]);
            }
            Startup::Incomplete => panic!("complete frame not recognised"),
        }
        let mut reader = StartupReader::new(None, limits());
        for (i, byte) in stream.iter().enumerate() {
            match reader.push(std::slice::from_ref(byte)).unwrap() {
                Startup::Incomplete => assert!(i < 23, "still incomplete at octet {i}"),
                Startup::Complete { frame, rest } => {
                    assert_eq!(i, 23);
                    assert!(rest.is_empty());
                    assert_eq!(frame.to_bytes().unwrap(), unhex(CRC_REPLY));
                    break;
                }
            }
            assert_eq!(reader.buffered(), i + 1);
        }
        // Split after the header, with FPDU octets in the second chunk.
        let mut reader = StartupReader::new(Some(FrameKind::Reply), limits());
        assert_eq!(reader.push(&stream[..21]).unwrap(), Startup::Incomplete);
        match reader.push(&stream[21..30]).unwrap() {
            Startup::Complete { rest, .. } => assert_eq!(rest, &stream[24..30]),
            Startup::Incomplete => panic!("incomplete"),
        }
        assert_eq!(reader.buffered(), 0);
    }

    #[test]
    fn startup_reader_errors() {
        let mut reader = StartupReader::new(Some(FrameKind::Reply), limits());
        assert_eq!(
            reader.push(&unhex(RPING_REQUEST)),
            Err(WireError::UnexpectedKind {
                expected: FrameKind::Reply,
                found: FrameKind::Request
            })
        );
        let mut reader = StartupReader::new(Some(FrameKind::Request), limits());
        assert_eq!(
            reader.push(&unhex(RPING_REQUEST)[..10]).unwrap(),
            Startup::Incomplete
        );
        assert_eq!(reader.push(b"garbage garbage"), Err(WireError::BadKey));
        let mut reader = StartupReader::new(None, limits());
        let mut bad = unhex(RPING_REQUEST);
        bad[18] = 0x10;
        assert_eq!(
            reader.push(&bad[..20]),
            Err(WireError::PrivateDataTooLong {
                len: 4100,
                limit: 512
            })
        );
    }
}
