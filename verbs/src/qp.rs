//! Queue pair states, legal transitions, capabilities and modify attributes:
//! `enum ibv_qp_state`, `enum ibv_qp_type`, `struct ibv_qp_cap`,
//! `struct ibv_qp_attr` and `enum ibv_qp_attr_mask` of `<infiniband/verbs.h>`
//! (`ibv_create_qp(3)`, `ibv_modify_qp(3)`).
//!
//! # Transitions
//!
//! [`check_transition`] is the state table of `ibv_modify_qp` for an RC QP.
//! libibverbs itself passes the request to the kernel, whose
//! `ib_modify_qp_is_ok()` (drivers/infiniband/core/verbs.c, `qp_state_table`)
//! decides; that table is reproduced here:
//!
//! | from \ to | Reset | Init | RTR | RTS | SQD | SQE | Error |
//! |---|---|---|---|---|---|---|---|
//! | Reset | yes | yes | - | - | - | - | - |
//! | Init  | yes | yes | yes | - | - | - | yes |
//! | RTR   | yes | - | - | yes | - | - | yes |
//! | RTS   | yes | - | - | yes | yes | - | yes |
//! | SQD   | yes | - | - | yes | yes | - | yes |
//! | SQE   | yes | - | - | yes | - | - | yes |
//! | Error | yes | - | - | - | - | - | yes |
//!
//! That is: Reset→Init, Init→Init, Init→RTR, RTR→RTS, RTS→RTS, RTS→SQD,
//! SQD→RTS, SQD→SQD, SQE→RTS, any state→Reset, and any state *except Reset*
//! →Error. Reset→Error is refused by the kernel table (a Reset QP holds no WRs,
//! so there is nothing to flush); some hardware drivers accept it, the core
//! does not.
//!
//! The table governs `modify_qp` calls. A backend moving a QP to Error on
//! its own (a Terminate, RFC 5040 §6; loss of the TCP connection or of the
//! device) does so from any connected state without consulting it.

use crate::access::AccessFlags;
use bitflags::bitflags;
use core::fmt;
use thiserror::Error;

/// QP state: `enum ibv_qp_state`, with its libibverbs numeric values (the
/// discriminants). `IBV_QPS_UNKNOWN` (7) is not represented.
///
/// For an iWARP RC QP driven by the connection manager: Init is where the
/// consumer posts receives before connecting; RTR/RTS are entered as the MPA
/// exchange completes (RFC 5044 §7.1); Error is entered on disconnect,
/// Terminate or `modify_qp`, flushing all WRs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum QpState {
    /// `IBV_QPS_RESET` (0): freshly created; no WR may be posted.
    Reset = 0,
    /// `IBV_QPS_INIT` (1): receives may be posted; nothing is processed.
    Init = 1,
    /// `IBV_QPS_RTR` (2): ready to receive: incoming messages are processed.
    Rtr = 2,
    /// `IBV_QPS_RTS` (3): ready to send: both queues are processed.
    Rts = 3,
    /// `IBV_QPS_SQD` (4): send queue drain: new send WRs are not started.
    Sqd = 4,
    /// `IBV_QPS_SQE` (5): send queue error (InfiniBand UC/UD); an RC QP goes
    /// to Error instead.
    Sqe = 5,
    /// `IBV_QPS_ERR` (6): error; every WR completes flushed.
    Error = 6,
}

impl QpState {
    /// Every state, in numeric order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Error,
    ];

    /// The libibverbs numeric value.
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }

    /// The state for a libibverbs numeric value; `None` for
    /// `IBV_QPS_UNKNOWN` (7) and undefined values.
    pub const fn from_ibv(value: u32) -> Option<QpState> {
        if (value as usize) < QpState::ALL.len() {
            Some(QpState::ALL[value as usize])
        } else {
            None
        }
    }

    /// The libibverbs constant name, e.g. `"IBV_QPS_RTS"`.
    pub const fn ibv_name(self) -> &'static str {
        match self {
            QpState::Reset => "IBV_QPS_RESET",
            QpState::Init => "IBV_QPS_INIT",
            QpState::Rtr => "IBV_QPS_RTR",
            QpState::Rts => "IBV_QPS_RTS",
            QpState::Sqd => "IBV_QPS_SQD",
            QpState::Sqe => "IBV_QPS_SQE",
            QpState::Error => "IBV_QPS_ERR",
        }
    }

    /// The short name used in messages: `RESET`, `INIT`, `RTR`, `RTS`, `SQD`,
    /// `SQE`, `ERR`.
    pub const fn as_str(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Error => "ERR",
        }
    }

    /// True if `ibv_post_recv` is allowed in this state: every state but
    /// Reset (in Error the WR completes flushed).
    pub const fn can_post_recv(self) -> bool {
        !matches!(self, QpState::Reset)
    }

    /// True if `ibv_post_send` is allowed in this state: RTS, SQD (where the
    /// WR waits until the QP returns to RTS), and SQE and Error (where the WR
    /// completes flushed). Reset, Init and RTR refuse send WRs.
    pub const fn can_post_send(self) -> bool {
        matches!(
            self,
            QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Error
        )
    }
}

/// Formats as the short state name (see [`QpState::as_str`]).
impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An illegal QP state transition requested of `modify_qp`. Maps to `EINVAL`
/// (`ibv_modify_qp(3)` fails with it when `ib_modify_qp_is_ok()` refuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
#[error("illegal QP state transition {from} -> {to}")]
pub struct QpTransitionError {
    /// The QP's current state.
    pub from: QpState,
    /// The requested state.
    pub to: QpState,
}

/// Checks a `modify_qp` state change of an RC QP against the kernel's
/// `qp_state_table` (see the [module documentation](self) for the table).
///
/// Pure function: no QP is touched.
///
/// # Errors
///
/// [`QpTransitionError`] naming `from` and `to` when the transition is not in
/// the table.
pub const fn check_transition(from: QpState, to: QpState) -> Result<(), QpTransitionError> {
    use QpState::*;
    let legal = match (from, to) {
        (Reset, Reset) | (Reset, Init) => true,
        (Reset, _) => false,
        (_, Reset) | (_, Error) => true,
        (Init, Init) | (Init, Rtr) => true,
        (Rtr, Rts) => true,
        (Rts, Rts) | (Rts, Sqd) => true,
        (Sqd, Rts) | (Sqd, Sqd) => true,
        (Sqe, Rts) => true,
        _ => false,
    };
    if legal {
        Ok(())
    } else {
        Err(QpTransitionError { from, to })
    }
}

/// QP transport type: `enum ibv_qp_type`. iWARP offers Reliable Connected
/// only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum QpType {
    /// `IBV_QPT_RC` (2): reliable connected, over one MPA/TCP connection.
    #[default]
    Rc = 2,
}

impl QpType {
    /// The libibverbs numeric value.
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }

    /// The type for a libibverbs numeric value; `None` for every type but
    /// `IBV_QPT_RC` (2).
    pub const fn from_ibv(value: u32) -> Option<QpType> {
        match value {
            2 => Some(QpType::Rc),
            _ => None,
        }
    }
}

/// Queue sizes of a QP: `struct ibv_qp_cap` (`ibv_create_qp(3)`).
///
/// On creation these are the consumer's minimums; the backend may round up
/// and reports the actual values back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpCap {
    /// Maximum number of outstanding send WRs (`max_send_wr`), in WRs.
    pub max_send_wr: u32,
    /// Maximum number of outstanding receive WRs (`max_recv_wr`), in WRs.
    pub max_recv_wr: u32,
    /// Maximum number of SGEs in one send WR (`max_send_sge`).
    pub max_send_sge: u32,
    /// Maximum number of SGEs in one receive WR (`max_recv_sge`).
    pub max_recv_sge: u32,
    /// Maximum inline payload of one send WR (`max_inline_data`), in bytes.
    pub max_inline_data: u32,
}

bitflags! {
    /// Which [`QpAttr`] fields a `modify_qp` sets: the subset of
    /// `enum ibv_qp_attr_mask` meaningful for iWARP, with the libibverbs bit
    /// values. Derived by [`QpAttr::mask`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `IBV_QP_STATE` (1 << 0).
        const STATE = 1 << 0;
        /// `IBV_QP_CUR_STATE` (1 << 1).
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY` (1 << 2).
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS` (1 << 3).
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_MAX_QP_RD_ATOMIC` (1 << 13): ORD.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC` (1 << 17): IRD.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_CAP` (1 << 19).
        const CAP = 1 << 19;
    }
}

/// Attributes for `modify_qp`: `struct ibv_qp_attr` plus its mask, as one
/// value whose `Some` fields are the ones to change (`ibv_modify_qp(3)`).
///
/// InfiniBand path fields (PSNs, P_Key, address vectors, timeouts, retry
/// counts, path MTU, destination QPN) have no iWARP meaning and are left out:
/// the connection manager and TCP provide them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpAttr {
    /// Move the QP to this state (`qp_state`, `IBV_QP_STATE`); checked with
    /// [`check_transition`].
    pub qp_state: Option<QpState>,
    /// Assume this is the current state (`cur_qp_state`, `IBV_QP_CUR_STATE`).
    pub cur_qp_state: Option<QpState>,
    /// Incoming remote operations the QP accepts (`qp_access_flags`,
    /// `IBV_QP_ACCESS_FLAGS`): `REMOTE_WRITE`, `REMOTE_READ`,
    /// `REMOTE_ATOMIC`. The MR local-write rule does not apply here.
    pub qp_access_flags: Option<AccessFlags>,
    /// ORD: RDMA Reads / atomics this QP may have outstanding as the
    /// requester (`max_rd_atomic`, `IBV_QP_MAX_QP_RD_ATOMIC`). In iWARP,
    /// negotiated in the MPA Rev 2 ORD field (RFC 6581 §3).
    pub max_rd_atomic: Option<u8>,
    /// IRD: incoming RDMA Read Requests / atomics this QP can have in
    /// progress as the responder (`max_dest_rd_atomic`,
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`). In iWARP, negotiated in the MPA Rev 2 IRD
    /// field (RFC 6581 §3).
    pub max_dest_rd_atomic: Option<u8>,
    /// New queue sizes (`cap`, `IBV_QP_CAP`), if the backend supports
    /// resizing.
    pub cap: Option<QpCap>,
    /// Request an `IBV_EVENT_SQ_DRAINED` async event when the QP reaches SQD
    /// (`en_sqd_async_notify`, `IBV_QP_EN_SQD_ASYNC_NOTIFY`).
    pub en_sqd_async_notify: Option<bool>,
}

impl QpAttr {
    /// Attributes that only change the state.
    pub const fn state(to: QpState) -> QpAttr {
        QpAttr {
            qp_state: Some(to),
            cur_qp_state: None,
            qp_access_flags: None,
            max_rd_atomic: None,
            max_dest_rd_atomic: None,
            cap: None,
            en_sqd_async_notify: None,
        }
    }

    /// The `attr_mask` libibverbs would be given for these attributes.
    pub const fn mask(&self) -> QpAttrMask {
        let mut m = QpAttrMask::empty();
        if self.qp_state.is_some() {
            m = m.union(QpAttrMask::STATE);
        }
        if self.cur_qp_state.is_some() {
            m = m.union(QpAttrMask::CUR_STATE);
        }
        if self.en_sqd_async_notify.is_some() {
            m = m.union(QpAttrMask::EN_SQD_ASYNC_NOTIFY);
        }
        if self.qp_access_flags.is_some() {
            m = m.union(QpAttrMask::ACCESS_FLAGS);
        }
        if self.max_rd_atomic.is_some() {
            m = m.union(QpAttrMask::MAX_QP_RD_ATOMIC);
        }
        if self.max_dest_rd_atomic.is_some() {
            m = m.union(QpAttrMask::MAX_DEST_RD_ATOMIC);
        }
        if self.cap.is_some() {
            m = m.union(QpAttrMask::CAP);
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `enum ibv_qp_state` in rdma-core's `libibverbs/verbs.h`.
    #[test]
    fn state_values_match_verbs_h() {
        let expected = [
            (QpState::Reset, 0),
            (QpState::Init, 1),
            (QpState::Rtr, 2),
            (QpState::Rts, 3),
            (QpState::Sqd, 4),
            (QpState::Sqe, 5),
            (QpState::Error, 6),
        ];
        for (s, v) in expected {
            assert_eq!(s.to_ibv(), v);
            assert_eq!(QpState::from_ibv(v), Some(s));
        }
        assert_eq!(QpState::from_ibv(7), None, "IBV_QPS_UNKNOWN");
        assert_eq!(QpType::Rc.to_ibv(), 2, "IBV_QPT_RC");
        assert_eq!(QpType::from_ibv(2), Some(QpType::Rc));
        assert_eq!(QpType::from_ibv(3), None, "IBV_QPT_UC");
        assert_eq!(QpType::from_ibv(4), None, "IBV_QPT_UD");
    }

    /// The full 7x7 table, row = from, column = to, in the order Reset, Init,
    /// RTR, RTS, SQD, SQE, Error (the kernel's `qp_state_table`).
    #[test]
    fn transition_table_exhaustive() {
        const T: bool = true;
        const F: bool = false;
        #[rustfmt::skip]
        let table: [[bool; 7]; 7] = [
            //           Reset Init  RTR   RTS   SQD   SQE   Error
            /* Reset */ [T,    T,    F,    F,    F,    F,    F],
            /* Init  */ [T,    T,    T,    F,    F,    F,    T],
            /* RTR   */ [T,    F,    F,    T,    F,    F,    T],
            /* RTS   */ [T,    F,    F,    T,    T,    F,    T],
            /* SQD   */ [T,    F,    F,    T,    T,    F,    T],
            /* SQE   */ [T,    F,    F,    T,    F,    F,    T],
            /* Error */ [T,    F,    F,    F,    F,    F,    T],
        ];
        let mut legal = 0;
        for (i, from) in QpState::ALL.into_iter().enumerate() {
            for (j, to) in QpState::ALL.into_iter().enumerate() {
                let got = check_transition(from, to);
                if table[i][j] {
                    legal += 1;
                    assert_eq!(got, Ok(()), "{from} -> {to} should be legal");
                } else {
                    assert_eq!(
                        got,
                        Err(QpTransitionError { from, to }),
                        "{from} -> {to} should be illegal"
                    );
                }
            }
        }
        assert_eq!(legal, 22);
    }

    #[test]
    fn transition_error_names_states() {
        let e = check_transition(QpState::Rts, QpState::Init).unwrap_err();
        assert_eq!(e.from, QpState::Rts);
        assert_eq!(e.to, QpState::Init);
        assert_eq!(e.to_string(), "illegal QP state transition RTS -> INIT");
        assert_eq!(
            check_transition(QpState::Reset, QpState::Error)
                .unwrap_err()
                .to_string(),
            "illegal QP state transition RESET -> ERR"
        );
    }

    #[test]
    fn post_permissions() {
        let recv: Vec<bool> = QpState::ALL.iter().map(|s| s.can_post_recv()).collect();
        assert_eq!(recv, [false, true, true, true, true, true, true]);
        let send: Vec<bool> = QpState::ALL.iter().map(|s| s.can_post_send()).collect();
        assert_eq!(send, [false, false, false, true, true, true, true]);
    }

    /// `enum ibv_qp_attr_mask` in rdma-core's `libibverbs/verbs.h`.
    #[test]
    fn attr_mask_values_match_verbs_h() {
        assert_eq!(QpAttrMask::STATE.bits(), 1);
        assert_eq!(QpAttrMask::CUR_STATE.bits(), 2);
        assert_eq!(QpAttrMask::EN_SQD_ASYNC_NOTIFY.bits(), 4);
        assert_eq!(QpAttrMask::ACCESS_FLAGS.bits(), 8);
        assert_eq!(QpAttrMask::MAX_QP_RD_ATOMIC.bits(), 1 << 13);
        assert_eq!(QpAttrMask::MAX_DEST_RD_ATOMIC.bits(), 1 << 17);
        assert_eq!(QpAttrMask::CAP.bits(), 1 << 19);
    }

    #[test]
    fn attr_mask_derivation() {
        assert_eq!(QpAttr::default().mask(), QpAttrMask::empty());
        assert_eq!(QpAttr::state(QpState::Error).mask().bits(), 1);
        let a = QpAttr {
            qp_state: Some(QpState::Rts),
            qp_access_flags: Some(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE),
            max_rd_atomic: Some(16),
            max_dest_rd_atomic: Some(32),
            ..QpAttr::default()
        };
        assert_eq!(a.mask().bits(), 1 | 8 | (1 << 13) | (1 << 17));
        let all = QpAttr {
            qp_state: Some(QpState::Sqd),
            cur_qp_state: Some(QpState::Rts),
            qp_access_flags: Some(AccessFlags::empty()),
            max_rd_atomic: Some(1),
            max_dest_rd_atomic: Some(1),
            cap: Some(QpCap::default()),
            en_sqd_async_notify: Some(true),
        };
        assert_eq!(all.mask(), QpAttrMask::all());
    }
}
