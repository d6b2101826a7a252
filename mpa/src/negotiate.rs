//! MPA connection negotiation as pure functions, for both roles (RFC 5044,
//! section 7.1; RFC 6581).
//!
//! * Initiator: [`request`] builds the MPA Request from its
//!   [`LocalSettings`]; [`complete`] takes the peer's Reply and gives the
//!   [`Agreed`] settings or an [`InitiatorError`].
//! * Responder: [`respond`] takes its settings and the peer's Request and
//!   gives [`Response::Accept`] (agreed settings and the Reply to send) or
//!   [`Response::Reject`] (the reason, its LLP error code and the reject Reply
//!   to send). [`reject_reply`] builds a reject Reply for a ULP-level reject.
//!
//! Rules applied:
//! * Rev: the responder answers with the lower of the two revisions; a Reply
//!   with a higher Rev than the Request is a protocol error. Rev 1 (or Rev 2
//!   without the enhanced bit) means no IRD/ORD exchange: the agreed IRD/ORD
//!   are the local settings.
//! * CRC (RFC 5044, section 7.1.1): if either frame has `C`, CRC is used in
//!   both directions; the responder sets `C` whenever the initiator did.
//! * Markers: `M` in a frame means its sender wants Markers in the data it
//!   receives; each direction is decided separately. A side that cannot send
//!   Markers ([`LocalSettings::markers_tx_ok`] = false, like Linux siw)
//!   refuses a peer's `M`.
//! * IRD/ORD (RFC 6581): neither side's ORD may exceed the other's IRD. Each
//!   side's [`LocalSettings::relaxed_ird_ord`] decides what it does when its
//!   own IRD or ORD does not fit the peer's, the same way for both roles:
//!   * relaxed (the default, as Linux siw): it lowers its own ORD to the
//!     peer's IRD, and leaves a peer ORD over its own IRD to the peer to
//!     lower. The responder replies with its own IRD and its lowered ORD; the
//!     initiator lowers its ORD to the Reply's IRD.
//!   * strict: the connection fails with "Insufficient IRD resources"
//!     (0x06, [`NegotiationError::InsufficientIrd`]) when this side's ORD
//!     exceeds the peer's IRD, or the peer's ORD exceeds this side's IRD.
//!     The responder rejects with a reject Reply; the initiator fails on
//!     the Reply.
//!
//!   A Reply whose ORD exceeds the initiator's IRD always fails with 0x06
//!   (the responder had to lower it).
//! * Peer-to-peer (RFC 6581): the initiator sets `A` and offers the RTR kinds
//!   it can send; the responder picks one it can accept (Write, then Read,
//!   then Send; an offer of none is taken as Write, as Linux siw does) and
//!   replies with `A` and exactly that kind, or rejects with "No matching RTR
//!   option" (0x07). In P2P mode the initiator sends the RTR as its first FPDU
//!   and the responder sends nothing before receiving it (RFC 5044, section
//!   7.1.2).

use thiserror::Error;

use crate::fpdu::Framing;
use crate::wire::{FrameKind, Repr, Rev2Params, RtrKind, RtrKinds};
use crate::wire::{IRD_ORD_MASK, MAX_PRIVATE_DATA_LEN, REV2_PARAMS_LEN};
use crate::LlpErrorCode;

/// How a side deals with the MPA CRC (`C` flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CrcPolicy {
    /// Do not set `C`; use CRC when the peer sets it (RFC 5044: a side MUST
    /// use CRC if the peer asks). Linux siw's default.
    #[default]
    IfPeerAsks,
    /// Set `C`, so CRC is used in both directions.
    Wanted,
    /// Set `C`, and as initiator treat a Reply without `C` as a protocol
    /// error (Linux siw `mpa_crc_required`). As responder, same as `Wanted`.
    Required,
    /// Never use CRC: reject (responder) or fail (initiator) when the peer
    /// sets `C` (Linux siw `mpa_crc_strict` without `mpa_crc_required`; not
    /// what RFC 5044 asks for, useful for tests and odd peers).
    Refused,
}

impl CrcPolicy {
    /// Whether this side sets `C` in its own frame.
    pub fn sets_c(self) -> bool {
        matches!(self, CrcPolicy::Wanted | CrcPolicy::Required)
    }
}

/// What a side wants from the negotiation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LocalSettings {
    /// MPA revision to use: 1 (RFC 5044) or 2 (RFC 6581, with the IRD/ORD word).
    pub rev: u8,
    /// CRC policy.
    pub crc: CrcPolicy,
    /// Want Markers in the data this side receives (sets `M`).
    pub markers_rx: bool,
    /// Able to send Markers when the peer asks (default `true`; Linux siw: `false`).
    pub markers_tx_ok: bool,
    /// Initiator: ask for peer-to-peer mode (needs Rev 2). Ignored by the
    /// responder, which accepts P2P whenever an offered RTR kind is in `rtr`.
    pub p2p: bool,
    /// Initiator: the RTR kinds it can send (offered when `p2p`). Responder:
    /// the RTR kinds it accepts (empty: refuse P2P). Default: Write and Read.
    pub rtr: RtrKinds,
    /// Inbound RDMA Read queue depth this side provides (14 bits,
    /// [`crate::wire::IRD_ORD_NO_LIMIT`] = no limit). Default 1.
    pub ird: u16,
    /// Outbound RDMA Read queue depth this side wants (14 bits). Default 1.
    pub ord: u16,
    /// Lower this side's ORD to the peer's IRD (and leave a peer ORD over
    /// this side's IRD to the peer to lower) instead of failing with
    /// [`NegotiationError::InsufficientIrd`] (default `true`, as Linux siw).
    /// Applies to both roles: see the module documentation.
    pub relaxed_ird_ord: bool,
    /// ULP private data for the Request / Reply, in octets (with Rev 2 at
    /// most 508, the IRD/ORD word taking 4 of the 512).
    pub private_data: Vec<u8>,
}

impl Default for LocalSettings {
    /// Compatible with Linux siw: Rev 2 with the IRD/ORD word, CRC when the
    /// peer asks, Markers only when asked, no P2P request, IRD = ORD = 1.
    fn default() -> LocalSettings {
        LocalSettings {
            rev: 2,
            crc: CrcPolicy::IfPeerAsks,
            markers_rx: false,
            markers_tx_ok: true,
            p2p: false,
            rtr: RtrKinds {
                send: false,
                write: true,
                read: true,
            },
            ird: 1,
            ord: 1,
            relaxed_ird_ord: true,
            private_data: Vec::new(),
        }
    }
}

impl LocalSettings {
    /// The MPA defaults of Chelsio's iw_cxgb4 (T5/T6 iWARP hardware): revision 2 with
    /// the IRD/ORD word (`mpa_rev` = 2), CRC asked for (`crc_enabled` = 1), no Markers
    /// (`markers_enabled` = 0), peer-to-peer mode (`peer2peer` = 1) with a zero-length
    /// RDMA Read as the RTR (`p2p_type` = 1, `FW_RI_INIT_P2PTYPE_READ_REQ`); module
    /// parameters of `drivers/infiniband/hw/cxgb4/cm.c`. As responder it accepts a Read
    /// RTR only. IRD = ORD = 1 (peer-to-peer mode needs at least 1 of each: the RTR is a
    /// Read); the rest as [`LocalSettings::default`].
    pub fn chelsio() -> LocalSettings {
        LocalSettings {
            rev: 2,
            crc: CrcPolicy::Wanted,
            markers_rx: false,
            p2p: true,
            rtr: crate::wire::RtrKinds {
                send: false,
                write: false,
                read: true,
            },
            ird: 1,
            ord: 1,
            ..LocalSettings::default()
        }
    }
}

/// Local settings that cannot be put on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SettingsError {
    /// `rev` is neither 1 nor 2.
    #[error("MPA revision {0} is not supported (1 or 2)")]
    Revision(u8),
    /// IRD or ORD does not fit in 14 bits.
    #[error("IRD/ORD value {0:#x} does not fit in 14 bits")]
    IrdOrdRange(u16),
    /// Peer-to-peer mode asked for with Rev 1.
    #[error("peer-to-peer mode needs MPA Rev 2")]
    P2pNeedsRev2,
    /// Peer-to-peer mode asked for with no RTR kind to offer.
    #[error("peer-to-peer mode with no RTR kind to offer")]
    NoRtrKinds,
    /// The ULP's private data does not fit: MPA carries at most 512 octets of
    /// private data (RFC 5044 section 7.1, PD_Length), and with Rev 2's enhanced
    /// connection setup the IRD/ORD word takes 4 of them (RFC 6581 section 5), which
    /// leaves 508 for the ULP (Linux siw: `MPA_MAX_PRIVDATA - sizeof(mpa_v2_data)`).
    #[error("private data of {len} octets over the limit of {limit} (MPA allows 512 octets, of which the Rev 2 IRD/ORD word takes 4)")]
    PrivateDataTooLong {
        /// The ULP's private data length, in octets.
        len: usize,
        /// What is left for the ULP's private data, in octets: 512, or 508 with the
        /// Rev 2 IRD/ORD word.
        limit: usize,
    },
}

impl LocalSettings {
    /// Checks the settings for either role.
    ///
    /// Errors: see [`SettingsError`].
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.rev != 1 && self.rev != 2 {
            return Err(SettingsError::Revision(self.rev));
        }
        for value in [self.ird, self.ord] {
            if value > IRD_ORD_MASK {
                return Err(SettingsError::IrdOrdRange(value));
            }
        }
        if self.p2p && self.rev != 2 {
            return Err(SettingsError::P2pNeedsRev2);
        }
        if self.p2p && self.rtr.is_empty() {
            return Err(SettingsError::NoRtrKinds);
        }
        check_private_data(self.private_data.len(), self.rev == 2)
    }
}

fn check_private_data(len: usize, with_word: bool) -> Result<(), SettingsError> {
    let limit = MAX_PRIVATE_DATA_LEN - if with_word { REV2_PARAMS_LEN } else { 0 };
    if len > limit {
        return Err(SettingsError::PrivateDataTooLong { len, limit });
    }
    Ok(())
}

/// Why a negotiation failed (responder reject reason or initiator protocol
/// error), with its LLP error code ([`NegotiationError::llp_error_code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum NegotiationError {
    /// The responder got a Reply, or the initiator a Request.
    #[error("wrong MPA frame kind: expected a {expected:?}")]
    WrongFrameKind {
        /// The kind expected.
        expected: FrameKind,
    },
    /// The Reply has a higher Rev than the Request.
    #[error("MPA Reply Rev {got} higher than the Request's {sent}")]
    RevisionMismatch {
        /// Rev of the Request.
        sent: u8,
        /// Rev of the Reply.
        got: u8,
    },
    /// A Rev 2 frame should carry the IRD/ORD word (enhanced bit) but does not.
    #[error("MPA Rev 2 frame without the enhanced bit and IRD/ORD word")]
    MissingRev2Params,
    /// The peer wants Markers, this side cannot send them.
    #[error("peer wants Markers, which this side cannot send")]
    MarkersRefused,
    /// The peer set `C` and this side refuses CRC.
    #[error("peer wants CRC, which this side refuses")]
    CrcRefused,
    /// This side requires CRC and the Reply does not set `C`.
    #[error("CRC required but the MPA Reply does not set C")]
    CrcNotConfirmed,
    /// RFC 6581: the IRD of one side is too small for the other side's ORD.
    ///
    /// The two values always belong to different sides: `ird` is one side's
    /// IRD, `ord` the *other* side's ORD. Which side is which depends on the
    /// check that failed (the role is known to the caller, who called
    /// [`respond`] or [`complete`]):
    /// * the peer's ORD exceeds this side's IRD: `ird` is this side's,
    ///   `ord` the peer's (a strict responder, or an initiator whose Reply
    ///   carries an ORD over its IRD);
    /// * this side's ORD exceeds the peer's IRD: `ird` is the peer's, `ord`
    ///   this side's (a strict initiator or a strict responder, see
    ///   [`LocalSettings::relaxed_ird_ord`]).
    #[error("insufficient IRD resources: an ORD of {ord} exceeds the other side's IRD of {ird}")]
    InsufficientIrd {
        /// The IRD, of one side, that is too small.
        ird: u16,
        /// The ORD, of the other side, that exceeds it.
        ord: u16,
    },
    /// RFC 6581: peer-to-peer mode without an RTR kind both sides support.
    #[error("no matching RTR option for peer-to-peer mode")]
    NoMatchingRtr,
}

impl NegotiationError {
    /// The LLP error code (RFC 5044 section 8, RFC 6581) for a Terminate:
    /// 0x06 Insufficient IRD, 0x07 No matching RTR, 0x04 Invalid MPA Request
    /// or Reply for everything else.
    pub fn llp_error_code(&self) -> LlpErrorCode {
        match self {
            NegotiationError::InsufficientIrd { .. } => LlpErrorCode::InsufficientIrd,
            NegotiationError::NoMatchingRtr => LlpErrorCode::NoMatchingRtr,
            _ => LlpErrorCode::InvalidRequestReply,
        }
    }
}

/// The settings both sides agreed on, seen from one side.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Agreed {
    /// The MPA revision in use (the Reply's).
    pub rev: u8,
    /// CRC in both directions.
    pub crc: bool,
    /// The peer inserts Markers in what this side receives (this side's `M`).
    pub markers_rx: bool,
    /// This side inserts Markers in what it sends (the peer's `M`).
    pub markers_tx: bool,
    /// IRD/ORD were exchanged (Rev 2 with the enhanced bit on both frames).
    pub enhanced: bool,
    /// Inbound RDMA Read queue depth this side must provide.
    pub ird: u16,
    /// Outbound RDMA Read queue depth this side may use.
    pub ord: u16,
    /// The peer's IRD/ORD word, when exchanged.
    pub peer: Option<Rev2Params>,
    /// Peer-to-peer mode with this RTR kind (`None`: no P2P).
    pub rtr: Option<RtrKind>,
    /// The ULP private data of the peer's frame, in octets.
    pub peer_private_data: Vec<u8>,
}

impl Agreed {
    /// Whether peer-to-peer mode was agreed.
    pub fn p2p(&self) -> bool {
        self.rtr.is_some()
    }

    /// Framing of the FPDUs this side sends.
    pub fn tx_framing(&self) -> Framing {
        Framing {
            crc: self.crc,
            markers: self.markers_tx,
        }
    }

    /// Framing of the FPDUs this side receives.
    pub fn rx_framing(&self) -> Framing {
        Framing {
            crc: self.crc,
            markers: self.markers_rx,
        }
    }
}

/// The responder's decision on a Request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Response {
    /// Accept: send `reply`, then run with `agreed`.
    Accept {
        /// The agreed settings.
        agreed: Agreed,
        /// The Reply to send.
        reply: Repr,
    },
    /// Reject: send `reply` (R set) and close the connection.
    Reject {
        /// Why (its LLP error code: [`NegotiationError::llp_error_code`]).
        reason: NegotiationError,
        /// The reject Reply to send.
        reply: Repr,
    },
}

/// Why the initiator cannot use the Reply.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InitiatorError {
    /// The responder rejected the connection (R set).
    #[error("connection rejected by the MPA responder")]
    Rejected {
        /// The ULP private data of the reject Reply, in octets.
        private_data: Vec<u8>,
        /// The IRD/ORD word of the reject Reply, if any.
        rev2: Option<Rev2Params>,
    },
    /// The Reply violates the protocol or the local settings.
    #[error("MPA negotiation failed: {0}")]
    Protocol(NegotiationError),
    /// The local settings are invalid.
    #[error("invalid local MPA settings: {0}")]
    Settings(SettingsError),
}

impl InitiatorError {
    /// The LLP error code to send in a Terminate, if any (none for a reject
    /// or invalid local settings).
    pub fn llp_error_code(&self) -> Option<LlpErrorCode> {
        match self {
            InitiatorError::Protocol(e) => Some(e.llp_error_code()),
            _ => None,
        }
    }
}

/// The initiator's MPA Request for `local` (RFC 5044 section 7.1.1; with Rev 2
/// the enhanced bit and the IRD/ORD word of RFC 6581, `A` and the offered RTR
/// kinds when `local.p2p`).
///
/// Errors: [`SettingsError`] from [`LocalSettings::validate`].
pub fn request(local: &LocalSettings) -> Result<Repr, SettingsError> {
    local.validate()?;
    let enhanced = local.rev == 2;
    let rev2 = enhanced.then_some(Rev2Params {
        peer_to_peer: local.p2p,
        rtr: if local.p2p { local.rtr } else { RtrKinds::NONE },
        ird: local.ird,
        ord: local.ord,
    });
    Ok(Repr {
        kind: FrameKind::Request,
        markers: local.markers_rx,
        crc: local.crc.sets_c(),
        reject: false,
        enhanced,
        reserved: 0,
        rev: local.rev,
        rev2,
        private_data: local.private_data.clone(),
    })
}

/// The responder's answer to `request` under `local` (RFC 5044 section 7.1;
/// RFC 6581). See the module documentation for the rules.
///
/// Errors: [`SettingsError`] if `local` is invalid. A request that cannot be
/// accepted is not an error but [`Response::Reject`].
pub fn respond(local: &LocalSettings, request: &Repr) -> Result<Response, SettingsError> {
    local.validate()?;
    match decide(local, request) {
        Ok((agreed, reply)) => Ok(Response::Accept { agreed, reply }),
        Err(reason) => {
            let mut reply = reject_reply(local, request, &[])?;
            if reason == NegotiationError::CrcRefused {
                reply.crc = false;
            }
            Ok(Response::Reject { reason, reply })
        }
    }
}

fn decide(local: &LocalSettings, req: &Repr) -> Result<(Agreed, Repr), NegotiationError> {
    if req.kind != FrameKind::Request || req.reject {
        return Err(NegotiationError::WrongFrameKind {
            expected: FrameKind::Request,
        });
    }
    let rev = local.rev.min(req.rev);
    let enhanced = rev == 2 && req.enhanced;
    let peer = if enhanced {
        Some(req.rev2.ok_or(NegotiationError::MissingRev2Params)?)
    } else {
        None
    };
    if req.markers && !local.markers_tx_ok {
        return Err(NegotiationError::MarkersRefused);
    }
    if req.crc && local.crc == CrcPolicy::Refused {
        return Err(NegotiationError::CrcRefused);
    }
    let crc = req.crc || local.crc.sets_c();
    let (ird, ord, rtr, reply_word) = match peer {
        Some(p) => {
            if !local.relaxed_ird_ord {
                // The initiator's ORD over this side's IRD.
                if p.ord > local.ird {
                    return Err(NegotiationError::InsufficientIrd {
                        ird: local.ird,
                        ord: p.ord,
                    });
                }
                // This side's ORD over the initiator's IRD: as a strict
                // initiator does in `complete`, fail instead of lowering it.
                if local.ord > p.ird {
                    return Err(NegotiationError::InsufficientIrd {
                        ird: p.ird,
                        ord: local.ord,
                    });
                }
            }
            let ord = local.ord.min(p.ird);
            let rtr = if p.peer_to_peer {
                let offered = if p.rtr.is_empty() {
                    RtrKinds::only(Some(RtrKind::Write))
                } else {
                    p.rtr
                };
                Some(
                    offered
                        .intersection(local.rtr)
                        .preferred()
                        .ok_or(NegotiationError::NoMatchingRtr)?,
                )
            } else {
                None
            };
            let word = Rev2Params {
                peer_to_peer: rtr.is_some(),
                rtr: RtrKinds::only(rtr),
                ird: local.ird,
                ord,
            };
            (local.ird, ord, rtr, Some(word))
        }
        None => (local.ird, local.ord, None, None),
    };
    let reply = Repr {
        kind: FrameKind::Reply,
        markers: local.markers_rx,
        crc,
        reject: false,
        enhanced,
        reserved: 0,
        rev,
        rev2: reply_word,
        private_data: local.private_data.clone(),
    };
    let agreed = Agreed {
        rev,
        crc,
        markers_rx: local.markers_rx,
        markers_tx: req.markers,
        enhanced,
        ird,
        ord,
        peer,
        rtr,
        peer_private_data: req.private_data.clone(),
    };
    Ok((agreed, reply))
}

/// A reject Reply (R set) to `request` carrying `private_data` (e.g. for a
/// reject decided by the ULP): the Rev is the lower of the two, `M` clear,
/// `C` echoed from the Request; with Rev 2 and the enhanced bit in the
/// Request, the IRD/ORD word holds `local`'s IRD and ORD and no P2P flags.
///
/// Errors: [`SettingsError::PrivateDataTooLong`] if `private_data` is over 512
/// octets (508 with the IRD/ORD word).
pub fn reject_reply(
    local: &LocalSettings,
    request: &Repr,
    private_data: &[u8],
) -> Result<Repr, SettingsError> {
    let rev = local.rev.min(request.rev).clamp(1, 2);
    let enhanced = rev == 2 && request.enhanced;
    check_private_data(private_data.len(), enhanced)?;
    let rev2 = enhanced.then_some(Rev2Params {
        peer_to_peer: false,
        rtr: RtrKinds::NONE,
        ird: local.ird & IRD_ORD_MASK,
        ord: local.ord & IRD_ORD_MASK,
    });
    Ok(Repr {
        kind: FrameKind::Reply,
        markers: false,
        crc: request.crc,
        reject: true,
        enhanced,
        reserved: 0,
        rev,
        rev2,
        private_data: private_data.to_vec(),
    })
}

/// The responder's answer to a Request whose Rev it does not support (neither 1
/// nor 2, e.g. 3): a reject Reply (R set) with `local`'s own Rev, `M` and `C`
/// clear, no enhanced bit and no private data, so that the initiator learns the
/// revision this side speaks (20 octets: the Reply key, flags 0x20, Rev,
/// PD_Length 0). The driver then closes the TCP connection gracefully.
///
/// RFC 5044 section 7.1.1 (Rev: receivers MUST check it) and RFC 6581 section 5
/// leave an unsupported Request to the responder; this answers it as a reject, as
/// the other refusals of [`respond`] are, rather than with a bare reset. Linux siw
/// (`siw_proc_mpareq`: `version > MPA_REVISION_2` gives `-EPROTO`) closes the
/// connection without a Reply.
pub fn unsupported_revision_reply(local: &LocalSettings) -> Repr {
    Repr {
        kind: FrameKind::Reply,
        markers: false,
        crc: false,
        reject: true,
        enhanced: false,
        reserved: 0,
        rev: local.rev.clamp(1, 2),
        rev2: None,
        private_data: Vec::new(),
    }
}

/// The initiator's view of the negotiation: `local` is what it sent the
/// Request with (see [`request`]), `reply` the responder's Reply.
///
/// Errors: [`InitiatorError::Rejected`] for a reject Reply (with its private
/// data), [`InitiatorError::Protocol`] with the reason (and, via
/// [`NegotiationError::llp_error_code`], the LLP error code to send in a
/// Terminate), [`InitiatorError::Settings`] if `local` is invalid.
pub fn complete(local: &LocalSettings, reply: &Repr) -> Result<Agreed, InitiatorError> {
    local.validate().map_err(InitiatorError::Settings)?;
    let protocol = InitiatorError::Protocol;
    if reply.kind != FrameKind::Reply {
        return Err(protocol(NegotiationError::WrongFrameKind {
            expected: FrameKind::Reply,
        }));
    }
    if reply.reject {
        return Err(InitiatorError::Rejected {
            private_data: reply.private_data.clone(),
            rev2: reply.rev2,
        });
    }
    if reply.rev > local.rev {
        return Err(protocol(NegotiationError::RevisionMismatch {
            sent: local.rev,
            got: reply.rev,
        }));
    }
    let sent_enhanced = local.rev == 2;
    if sent_enhanced && reply.rev == 2 && (!reply.enhanced || reply.rev2.is_none()) {
        return Err(protocol(NegotiationError::MissingRev2Params));
    }
    let enhanced = sent_enhanced && reply.rev == 2;
    if reply.markers && !local.markers_tx_ok {
        return Err(protocol(NegotiationError::MarkersRefused));
    }
    match local.crc {
        CrcPolicy::Required if !reply.crc => {
            return Err(protocol(NegotiationError::CrcNotConfirmed))
        }
        CrcPolicy::Refused if reply.crc => return Err(protocol(NegotiationError::CrcRefused)),
        _ => {}
    }
    let crc = local.crc.sets_c() || reply.crc;
    let (ord, peer, rtr) = match reply.rev2.filter(|_| enhanced) {
        Some(p) => {
            if p.ord > local.ird {
                return Err(protocol(NegotiationError::InsufficientIrd {
                    ird: local.ird,
                    ord: p.ord,
                }));
            }
            let ord = if local.ord > p.ird {
                if !local.relaxed_ird_ord {
                    return Err(protocol(NegotiationError::InsufficientIrd {
                        ird: p.ird,
                        ord: local.ord,
                    }));
                }
                p.ird
            } else {
                local.ord
            };
            let rtr = if local.p2p {
                if !p.peer_to_peer {
                    return Err(protocol(NegotiationError::NoMatchingRtr));
                }
                let chosen = p.rtr.intersection(local.rtr).preferred();
                Some(chosen.ok_or(protocol(NegotiationError::NoMatchingRtr))?)
            } else {
                None
            };
            (ord, Some(p), rtr)
        }
        None => {
            if local.p2p {
                return Err(protocol(NegotiationError::NoMatchingRtr));
            }
            (local.ord, None, None)
        }
    };
    Ok(Agreed {
        rev: reply.rev,
        crc,
        markers_rx: local.markers_rx,
        markers_tx: reply.markers,
        enhanced,
        ird: local.ird,
        ord,
        peer,
        rtr,
        peer_private_data: reply.private_data.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_vectors::*;
    use crate::wire::{Limits, WireError, IRD_ORD_NO_LIMIT};

    fn parse(hex: &str) -> Repr {
        Repr::parse_bytes(&unhex(hex), &Limits::default())
            .unwrap()
            .0
    }

    /// The captured exchanges, replayed: our Request and Reply bytes equal
    /// siw's for the same settings.
    #[test]
    fn captured_exchanges() {
        let p2p = LocalSettings {
            p2p: true,
            ..LocalSettings::default()
        };
        let crc = LocalSettings {
            crc: CrcPolicy::Wanted,
            ..LocalSettings::default()
        };
        for (settings, req_hex, rep_hex) in [
            (LocalSettings::default(), RPING_REQUEST, RPING_REPLY),
            (p2p, P2P_REQUEST, P2P_REPLY),
            (crc, CRC_REQUEST, CRC_REPLY),
        ] {
            let req = request(&settings).unwrap();
            assert_eq!(req.to_bytes().unwrap(), unhex(req_hex));
            // Our responder, with default settings, answers siw's Request with siw's Reply.
            let Response::Accept { agreed, reply } =
                respond(&LocalSettings::default(), &parse(req_hex)).unwrap()
            else {
                panic!("rejected")
            };
            assert_eq!(reply.to_bytes().unwrap(), unhex(rep_hex));
            // Our initiator accepts siw's Reply.
            let mine = complete(&settings, &parse(rep_hex)).unwrap();
            assert_eq!(mine.crc, agreed.crc);
            assert_eq!(mine.rtr, agreed.rtr);
            assert_eq!((mine.ird, mine.ord, agreed.ird, agreed.ord), (1, 1, 1, 1));
        }
        let Response::Accept { agreed, .. } =
            respond(&LocalSettings::default(), &parse(P2P_REQUEST)).unwrap()
        else {
            panic!()
        };
        assert_eq!(agreed.rtr, Some(RtrKind::Write));
        assert!(agreed.p2p());
    }

    /// Expected outcome of one table row.
    #[derive(Debug)]
    enum Expect {
        /// Accepted: (rev, crc, initiator markers_rx, responder markers_rx,
        /// initiator (ird, ord), responder (ird, ord), rtr, enhanced).
        Agree {
            rev: u8,
            crc: bool,
            ini_markers_rx: bool,
            rsp_markers_rx: bool,
            ini: (u16, u16),
            rsp: (u16, u16),
            rtr: Option<RtrKind>,
            enhanced: bool,
        },
        /// The responder rejects with this reason and code.
        Reject(NegotiationError, LlpErrorCode),
        /// The responder accepts, the initiator fails with this reason and code.
        InitiatorFails(NegotiationError, LlpErrorCode),
    }

    fn s(f: impl FnOnce(&mut LocalSettings)) -> LocalSettings {
        let mut settings = LocalSettings::default();
        f(&mut settings);
        settings
    }

    fn agree(rev: u8, crc: bool) -> Expect {
        Expect::Agree {
            rev,
            crc,
            ini_markers_rx: false,
            rsp_markers_rx: false,
            ini: (1, 1),
            rsp: (1, 1),
            rtr: None,
            enhanced: rev == 2,
        }
    }

    fn p2p_offer(kinds: RtrKinds) -> LocalSettings {
        s(|x| {
            x.p2p = true;
            x.rtr = kinds;
        })
    }

    fn accepts(kinds: RtrKinds) -> LocalSettings {
        s(|x| x.rtr = kinds)
    }

    const SEND: RtrKinds = RtrKinds {
        send: true,
        write: false,
        read: false,
    };
    const WRITE: RtrKinds = RtrKinds {
        send: false,
        write: true,
        read: false,
    };
    const READ: RtrKinds = RtrKinds {
        send: false,
        write: false,
        read: true,
    };

    fn table() -> Vec<(&'static str, LocalSettings, LocalSettings, Expect)> {
        use CrcPolicy::*;
        use NegotiationError as N;
        let rtr = |kind| Expect::Agree {
            rev: 2,
            crc: false,
            ini_markers_rx: false,
            rsp_markers_rx: false,
            ini: (1, 1),
            rsp: (1, 1),
            rtr: Some(kind),
            enhanced: true,
        };
        let ird_ord = |ini, rsp| Expect::Agree {
            rev: 2,
            crc: false,
            ini_markers_rx: false,
            rsp_markers_rx: false,
            ini,
            rsp,
            rtr: None,
            enhanced: true,
        };
        let markers = |i, r| Expect::Agree {
            rev: 2,
            crc: false,
            ini_markers_rx: i,
            rsp_markers_rx: r,
            ini: (1, 1),
            rsp: (1, 1),
            rtr: None,
            enhanced: true,
        };
        let mut rows = vec![
            ("defaults", s(|_| ()), s(|_| ()), agree(2, false)),
            (
                "rev1 initiator, rev2 responder",
                s(|x| x.rev = 1),
                s(|_| ()),
                agree(1, false),
            ),
            (
                "rev2 initiator, rev1 responder",
                s(|_| ()),
                s(|x| x.rev = 1),
                agree(1, false),
            ),
            (
                "rev1 both",
                s(|x| x.rev = 1),
                s(|x| x.rev = 1),
                agree(1, false),
            ),
            (
                "rev1 both with crc",
                s(|x| {
                    x.rev = 1;
                    x.crc = Wanted
                }),
                s(|x| x.rev = 1),
                agree(1, true),
            ),
            (
                "rev1 initiator: no IRD/ORD exchange, local values",
                s(|x| {
                    x.rev = 1;
                    x.ird = 4;
                    x.ord = 8
                }),
                s(|x| {
                    x.ird = 2;
                    x.ord = 3
                }),
                Expect::Agree {
                    rev: 1,
                    crc: false,
                    ini_markers_rx: false,
                    rsp_markers_rx: false,
                    ini: (4, 8),
                    rsp: (2, 3),
                    rtr: None,
                    enhanced: false,
                },
            ),
        ];
        // CRC: every pair of policies.
        for (ini, rsp, expect) in [
            (IfPeerAsks, IfPeerAsks, agree(2, false)),
            (IfPeerAsks, Wanted, agree(2, true)),
            (IfPeerAsks, Required, agree(2, true)),
            (IfPeerAsks, Refused, agree(2, false)),
            (Wanted, IfPeerAsks, agree(2, true)),
            (Wanted, Wanted, agree(2, true)),
            (Wanted, Required, agree(2, true)),
            (
                Wanted,
                Refused,
                Expect::Reject(N::CrcRefused, LlpErrorCode::InvalidRequestReply),
            ),
            (Required, IfPeerAsks, agree(2, true)),
            (Required, Wanted, agree(2, true)),
            (Required, Required, agree(2, true)),
            (
                Required,
                Refused,
                Expect::Reject(N::CrcRefused, LlpErrorCode::InvalidRequestReply),
            ),
            (Refused, IfPeerAsks, agree(2, false)),
            (
                Refused,
                Wanted,
                Expect::InitiatorFails(N::CrcRefused, LlpErrorCode::InvalidRequestReply),
            ),
            (
                Refused,
                Required,
                Expect::InitiatorFails(N::CrcRefused, LlpErrorCode::InvalidRequestReply),
            ),
            (Refused, Refused, agree(2, false)),
        ] {
            rows.push((
                "crc policies",
                s(|x| x.crc = ini),
                s(|x| x.crc = rsp),
                expect,
            ));
        }
        rows.extend([
            // Markers, per direction.
            (
                "markers to initiator",
                s(|x| x.markers_rx = true),
                s(|_| ()),
                markers(true, false),
            ),
            (
                "markers to responder",
                s(|_| ()),
                s(|x| x.markers_rx = true),
                markers(false, true),
            ),
            (
                "markers both ways",
                s(|x| x.markers_rx = true),
                s(|x| x.markers_rx = true),
                markers(true, true),
            ),
            (
                "responder cannot send markers (siw)",
                s(|x| x.markers_rx = true),
                s(|x| x.markers_tx_ok = false),
                Expect::Reject(N::MarkersRefused, LlpErrorCode::InvalidRequestReply),
            ),
            (
                "initiator cannot send markers",
                s(|x| x.markers_tx_ok = false),
                s(|x| x.markers_rx = true),
                Expect::InitiatorFails(N::MarkersRefused, LlpErrorCode::InvalidRequestReply),
            ),
            // Peer-to-peer, each RTR kind.
            (
                "p2p send",
                p2p_offer(SEND),
                accepts(SEND),
                rtr(RtrKind::Send),
            ),
            (
                "p2p write",
                p2p_offer(WRITE),
                accepts(WRITE),
                rtr(RtrKind::Write),
            ),
            (
                "p2p read",
                p2p_offer(READ),
                accepts(READ),
                rtr(RtrKind::Read),
            ),
            (
                "p2p write+read offered, default accept",
                p2p_offer(RtrKinds {
                    read: true,
                    ..WRITE
                }),
                s(|_| ()),
                rtr(RtrKind::Write),
            ),
            (
                "p2p all offered, read+send accepted",
                p2p_offer(RtrKinds::ALL),
                accepts(RtrKinds { send: true, ..READ }),
                rtr(RtrKind::Read),
            ),
            (
                "p2p send+read offered, send accepted",
                p2p_offer(RtrKinds { send: true, ..READ }),
                accepts(SEND),
                rtr(RtrKind::Send),
            ),
            (
                "p2p no matching rtr",
                p2p_offer(SEND),
                s(|_| ()),
                Expect::Reject(N::NoMatchingRtr, LlpErrorCode::NoMatchingRtr),
            ),
            (
                "p2p refused by responder",
                p2p_offer(WRITE),
                accepts(RtrKinds::NONE),
                Expect::Reject(N::NoMatchingRtr, LlpErrorCode::NoMatchingRtr),
            ),
            (
                "p2p initiator, rev1 responder",
                p2p_offer(WRITE),
                s(|x| x.rev = 1),
                Expect::InitiatorFails(N::NoMatchingRtr, LlpErrorCode::NoMatchingRtr),
            ),
            (
                "p2p responder setting alone does nothing",
                s(|_| ()),
                s(|x| x.p2p = true),
                agree(2, false),
            ),
            // IRD/ORD (RFC 6581).
            (
                "ird/ord equal",
                s(|x| {
                    x.ird = 8;
                    x.ord = 8
                }),
                s(|x| {
                    x.ird = 8;
                    x.ord = 8
                }),
                ird_ord((8, 8), (8, 8)),
            ),
            (
                "responder ORD limited by initiator IRD",
                s(|x| {
                    x.ird = 2;
                    x.ord = 4
                }),
                s(|x| {
                    x.ird = 16;
                    x.ord = 16
                }),
                ird_ord((2, 4), (16, 2)),
            ),
            (
                "initiator ORD over responder IRD, relaxed: lowered",
                s(|x| {
                    x.ird = 4;
                    x.ord = 8
                }),
                s(|x| {
                    x.ird = 4;
                    x.ord = 4
                }),
                ird_ord((4, 4), (4, 4)),
            ),
            (
                "initiator ORD over responder IRD, strict responder",
                s(|x| x.ord = 8),
                s(|x| {
                    x.ird = 4;
                    x.relaxed_ird_ord = false
                }),
                Expect::Reject(
                    N::InsufficientIrd { ird: 4, ord: 8 },
                    LlpErrorCode::InsufficientIrd,
                ),
            ),
            (
                "initiator ORD over responder IRD, strict initiator",
                s(|x| {
                    x.ord = 8;
                    x.relaxed_ird_ord = false
                }),
                s(|x| x.ird = 4),
                Expect::InitiatorFails(
                    N::InsufficientIrd { ird: 4, ord: 8 },
                    LlpErrorCode::InsufficientIrd,
                ),
            ),
            (
                // RFC 6581 and `relaxed_ird_ord` off: the responder does not
                // silently lower its ORD 1 to the initiator's IRD 0; it
                // rejects, mirroring the strict initiator.
                "responder ORD over initiator IRD, strict responder",
                s(|x| x.ird = 0),
                s(|x| {
                    x.ird = 1;
                    x.ord = 1;
                    x.relaxed_ird_ord = false
                }),
                Expect::Reject(
                    N::InsufficientIrd { ird: 0, ord: 1 },
                    LlpErrorCode::InsufficientIrd,
                ),
            ),
            (
                "responder ORD over initiator IRD, strict responder, both over",
                s(|x| {
                    x.ird = 2;
                    x.ord = 8
                }),
                s(|x| {
                    x.ird = 4;
                    x.ord = 16;
                    x.relaxed_ird_ord = false
                }),
                Expect::Reject(
                    N::InsufficientIrd { ird: 4, ord: 8 },
                    LlpErrorCode::InsufficientIrd,
                ),
            ),
            (
                "strict responder, everything fits",
                s(|x| {
                    x.ird = 4;
                    x.ord = 2
                }),
                s(|x| {
                    x.ird = 2;
                    x.ord = 4;
                    x.relaxed_ird_ord = false
                }),
                ird_ord((4, 2), (2, 4)),
            ),
            (
                "responder ORD over initiator IRD, relaxed responder: lowered",
                s(|x| x.ird = 0),
                s(|x| {
                    x.ird = 1;
                    x.ord = 1
                }),
                ird_ord((0, 1), (1, 0)),
            ),
            (
                "no limit on both sides",
                s(|x| {
                    x.ird = IRD_ORD_NO_LIMIT;
                    x.ord = IRD_ORD_NO_LIMIT
                }),
                s(|x| {
                    x.ird = IRD_ORD_NO_LIMIT;
                    x.ord = IRD_ORD_NO_LIMIT
                }),
                ird_ord(
                    (IRD_ORD_NO_LIMIT, IRD_ORD_NO_LIMIT),
                    (IRD_ORD_NO_LIMIT, IRD_ORD_NO_LIMIT),
                ),
            ),
            (
                "no limit initiator, limited responder",
                s(|x| {
                    x.ird = IRD_ORD_NO_LIMIT;
                    x.ord = IRD_ORD_NO_LIMIT
                }),
                s(|x| {
                    x.ird = 16;
                    x.ord = 32
                }),
                ird_ord((IRD_ORD_NO_LIMIT, 16), (16, 32)),
            ),
            (
                "zero ird/ord",
                s(|x| {
                    x.ird = 0;
                    x.ord = 0
                }),
                s(|x| {
                    x.ird = 0;
                    x.ord = 5
                }),
                ird_ord((0, 0), (0, 0)),
            ),
        ]);
        rows
    }

    /// Every row: Request and Reply go through the wire (emit, parse) and the
    /// two sides' views are checked against each other and the expectation.
    #[test]
    fn negotiation_table() {
        for (name, ini, rsp, expect) in table() {
            let req = request(&ini).unwrap();
            let req_wire = Repr::parse_bytes(&req.to_bytes().unwrap(), &Limits::default())
                .unwrap()
                .0;
            assert_eq!(req_wire, req, "{name}");
            let response = respond(&rsp, &req_wire).unwrap();
            match (response, &expect) {
                (Response::Reject { reason, reply }, Expect::Reject(want, code)) => {
                    assert_eq!(reason, *want, "{name}");
                    assert_eq!(reason.llp_error_code(), *code, "{name}");
                    assert!(
                        reply.reject && reply.kind == FrameKind::Reply && !reply.markers,
                        "{name}"
                    );
                    let reply = Repr::parse_bytes(&reply.to_bytes().unwrap(), &Limits::default())
                        .unwrap()
                        .0;
                    assert!(
                        matches!(complete(&ini, &reply), Err(InitiatorError::Rejected { .. })),
                        "{name}"
                    );
                }
                (Response::Reject { reason, .. }, _) => {
                    panic!("{name}: unexpected reject {reason:?}")
                }
                (Response::Accept { agreed: r, reply }, expect) => {
                    let reply = Repr::parse_bytes(&reply.to_bytes().unwrap(), &Limits::default())
                        .unwrap()
                        .0;
                    let i = complete(&ini, &reply);
                    match expect {
                        Expect::Agree {
                            rev,
                            crc,
                            ini_markers_rx,
                            rsp_markers_rx,
                            ini: (ii, io),
                            rsp: (ri, ro),
                            rtr,
                            enhanced,
                        } => {
                            let i = i.unwrap_or_else(|e| panic!("{name}: initiator failed: {e}"));
                            assert_eq!((i.rev, r.rev), (*rev, *rev), "{name}: rev");
                            assert_eq!((i.crc, r.crc), (*crc, *crc), "{name}: crc");
                            assert_eq!(
                                (i.markers_rx, r.markers_tx),
                                (*ini_markers_rx, *ini_markers_rx),
                                "{name}"
                            );
                            assert_eq!(
                                (r.markers_rx, i.markers_tx),
                                (*rsp_markers_rx, *rsp_markers_rx),
                                "{name}"
                            );
                            assert_eq!(i.tx_framing(), r.rx_framing(), "{name}");
                            assert_eq!(r.tx_framing(), i.rx_framing(), "{name}");
                            assert_eq!((i.ird, i.ord), (*ii, *io), "{name}: initiator ird/ord");
                            assert_eq!((r.ird, r.ord), (*ri, *ro), "{name}: responder ird/ord");
                            assert_eq!((i.rtr, r.rtr), (*rtr, *rtr), "{name}: rtr");
                            assert_eq!((i.enhanced, r.enhanced), (*enhanced, *enhanced), "{name}");
                            if *enhanced {
                                // RFC 6581: neither side's ORD exceeds the other's IRD.
                                assert!(i.ord <= r.ird && r.ord <= i.ird, "{name}");
                            }
                        }
                        Expect::InitiatorFails(want, code) => {
                            let e = i.expect_err(name);
                            assert_eq!(e, InitiatorError::Protocol(*want), "{name}");
                            assert_eq!(e.llp_error_code(), Some(*code), "{name}");
                        }
                        Expect::Reject(..) => panic!("{name}: accepted, expected reject"),
                    }
                }
            }
        }
    }

    #[test]
    fn private_data_passes_both_ways() {
        let ini = s(|x| x.private_data = b"from initiator".to_vec());
        let rsp = s(|x| x.private_data = b"from responder".to_vec());
        let req = request(&ini).unwrap();
        let Response::Accept { agreed, reply } = respond(&rsp, &req).unwrap() else {
            panic!()
        };
        assert_eq!(agreed.peer_private_data, b"from initiator");
        let mine = complete(&ini, &reply).unwrap();
        assert_eq!(mine.peer_private_data, b"from responder");
        assert_eq!(
            mine.peer,
            Some(Rev2Params {
                peer_to_peer: false,
                rtr: RtrKinds::NONE,
                ird: 1,
                ord: 1
            })
        );
        // A ULP reject with private data.
        let reject = reject_reply(&rsp, &req, b"go away").unwrap();
        assert_eq!(
            reject.rev2,
            Some(Rev2Params {
                ird: 1,
                ord: 1,
                ..Default::default()
            })
        );
        assert_eq!(
            complete(&ini, &reject),
            Err(InitiatorError::Rejected {
                private_data: b"go away".to_vec(),
                rev2: reject.rev2
            })
        );
        assert_eq!(complete(&ini, &reject).unwrap_err().llp_error_code(), None);
        assert_eq!(
            reject_reply(&rsp, &req, &[0; 509]),
            Err(SettingsError::PrivateDataTooLong {
                len: 509,
                limit: 508
            })
        );
    }

    #[test]
    fn malformed_replies_and_requests() {
        let ini = LocalSettings::default();
        let req = request(&ini).unwrap();
        let Response::Accept { reply, .. } = respond(&LocalSettings::default(), &req).unwrap()
        else {
            panic!()
        };
        let fails = |r: Repr| complete(&ini, &r).unwrap_err();
        assert_eq!(
            fails(req.clone()),
            InitiatorError::Protocol(NegotiationError::WrongFrameKind {
                expected: FrameKind::Reply
            })
        );
        assert_eq!(
            fails(Repr {
                enhanced: false,
                rev2: None,
                ..reply.clone()
            }),
            InitiatorError::Protocol(NegotiationError::MissingRev2Params)
        );
        let rev1_ini = s(|x| x.rev = 1);
        assert_eq!(
            complete(&rev1_ini, &reply),
            Err(InitiatorError::Protocol(
                NegotiationError::RevisionMismatch { sent: 1, got: 2 }
            ))
        );
        let word = reply.rev2.unwrap();
        assert_eq!(
            fails(Repr {
                rev2: Some(Rev2Params { ord: 5, ..word }),
                ..reply.clone()
            }),
            InitiatorError::Protocol(NegotiationError::InsufficientIrd { ird: 1, ord: 5 })
        );
        // The message does not call a value the peer's when it is this side's:
        // `ird` and `ord` belong to different sides, whichever check failed.
        let strict = s(|x| {
            x.ord = 8;
            x.relaxed_ird_ord = false
        });
        let reply4 = Repr {
            rev2: Some(Rev2Params { ird: 4, ..word }),
            ..reply.clone()
        };
        let e = complete(&strict, &reply4).unwrap_err();
        assert_eq!(
            e,
            InitiatorError::Protocol(NegotiationError::InsufficientIrd { ird: 4, ord: 8 })
        );
        assert_eq!(
            e.to_string(),
            "MPA negotiation failed: insufficient IRD resources: an ORD of 8 exceeds \
             the other side's IRD of 4"
        );
        let required = s(|x| x.crc = CrcPolicy::Required);
        assert_eq!(
            complete(&required, &reply),
            Err(InitiatorError::Protocol(NegotiationError::CrcNotConfirmed))
        );
        // P2P: the Reply picks a kind that was not offered.
        let p2p = p2p_offer(WRITE);
        let bad_pick = Repr {
            rev2: Some(Rev2Params {
                peer_to_peer: true,
                rtr: READ,
                ..word
            }),
            ..reply.clone()
        };
        assert_eq!(
            complete(&p2p, &bad_pick),
            Err(InitiatorError::Protocol(NegotiationError::NoMatchingRtr))
        );
        let no_a = Repr {
            rev2: Some(Rev2Params {
                peer_to_peer: false,
                rtr: WRITE,
                ..word
            }),
            ..reply.clone()
        };
        assert_eq!(
            complete(&p2p, &no_a),
            Err(InitiatorError::Protocol(NegotiationError::NoMatchingRtr))
        );
        // The responder is handed a Reply.
        let Response::Reject { reason, reply: rej } =
            respond(&LocalSettings::default(), &reply).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            reason,
            NegotiationError::WrongFrameKind {
                expected: FrameKind::Request
            }
        );
        assert_eq!(reason.llp_error_code(), LlpErrorCode::InvalidRequestReply);
        assert!(rej.reject);
        // P2P offer with no kinds: taken as Write (siw).
        let empty_offer = Repr {
            rev2: Some(Rev2Params {
                peer_to_peer: true,
                rtr: RtrKinds::NONE,
                ird: 1,
                ord: 1,
            }),
            ..req.clone()
        };
        let Response::Accept { agreed, reply } =
            respond(&LocalSettings::default(), &empty_offer).unwrap()
        else {
            panic!()
        };
        assert_eq!(agreed.rtr, Some(RtrKind::Write));
        assert_eq!(reply.rev2.unwrap().to_bytes(), [0x80, 0x01, 0x80, 0x01]);
        assert_eq!(
            WireError::BadKey.llp_error_code(),
            LlpErrorCode::InvalidRequestReply
        );
    }

    #[test]
    fn invalid_settings() {
        assert_eq!(request(&s(|x| x.rev = 3)), Err(SettingsError::Revision(3)));
        assert_eq!(
            request(&s(|x| x.ird = 0x4000)),
            Err(SettingsError::IrdOrdRange(0x4000))
        );
        assert_eq!(
            request(&s(|x| {
                x.rev = 1;
                x.p2p = true
            })),
            Err(SettingsError::P2pNeedsRev2)
        );
        assert_eq!(
            request(&p2p_offer(RtrKinds::NONE)),
            Err(SettingsError::NoRtrKinds)
        );
        assert_eq!(
            request(&s(|x| x.private_data = vec![0; 509])),
            Err(SettingsError::PrivateDataTooLong {
                len: 509,
                limit: 508
            })
        );
        assert!(request(&s(|x| {
            x.rev = 1;
            x.private_data = vec![0; 512]
        }))
        .is_ok());
        let req = request(&LocalSettings::default()).unwrap();
        assert_eq!(
            respond(&s(|x| x.rev = 0), &req),
            Err(SettingsError::Revision(0))
        );
        assert_eq!(
            complete(&s(|x| x.rev = 0), &req),
            Err(InitiatorError::Settings(SettingsError::Revision(0)))
        );
    }
}
