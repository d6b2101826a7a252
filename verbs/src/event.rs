//! Asynchronous events: `struct ibv_async_event` and `enum ibv_event_type` of
//! `<infiniband/verbs.h>` (`ibv_get_async_event(3)`).
//!
//! Async events report conditions not tied to one WR: a QP or CQ that broke,
//! the device or a port going away or coming back. Like completions they are
//! queued by the backend and taken by the consumer; the backend never calls
//! consumer code to deliver them (design.md §5).

use core::fmt;

/// The event type: `enum ibv_event_type`, with its libibverbs numeric values
/// (the discriminants) and, through `Display`, the strings of
/// `ibv_event_type_str(3)`. The InfiniBand-only types (path migration, LID,
/// P_Key, SM, client reregister, GID change, WQ) are not represented.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum AsyncEventType {
    /// `IBV_EVENT_CQ_ERR` (0): CQ overrun; the CQ is unusable.
    CqErr = 0,
    /// `IBV_EVENT_QP_FATAL` (1): local work queue catastrophic error; the QP
    /// went to Error (for iWARP: a Terminate, or the connection was lost).
    QpFatal = 1,
    /// `IBV_EVENT_QP_REQ_ERR` (2): invalid request local work queue error;
    /// the peer sent a request the QP could not accept (RFC 5040 §7 Terminate
    /// of the invalid-request kind).
    QpReqErr = 2,
    /// `IBV_EVENT_QP_ACCESS_ERR` (3): local access violation work queue
    /// error; an incoming operation failed a protection check (invalid STag,
    /// bounds, rights; RFC 5040 §7).
    QpAccessErr = 3,
    /// `IBV_EVENT_COMM_EST` (4): communication established (first message
    /// received while in RTR).
    CommEst = 4,
    /// `IBV_EVENT_SQ_DRAINED` (5): the send queue of a QP in SQD has drained.
    SqDrained = 5,
    /// `IBV_EVENT_DEVICE_FATAL` (8): local catastrophic error; the device is
    /// unusable (for the soft device: its link was removed).
    DeviceFatal = 8,
    /// `IBV_EVENT_PORT_ACTIVE` (9): the port (link) came up.
    PortActive = 9,
    /// `IBV_EVENT_PORT_ERR` (10): the port (link) went down.
    PortErr = 10,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` (15): fewer WRs than the armed limit
    /// remain in an SRQ; the limit is disarmed (`ibv_modify_srq(3)`).
    SrqLimitReached = 15,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED` (16): a QP attached to an SRQ in Error
    /// has no more receive WQEs to complete.
    QpLastWqeReached = 16,
}

impl AsyncEventType {
    /// Every represented type, in numeric order.
    pub const ALL: [AsyncEventType; 11] = [
        AsyncEventType::CqErr,
        AsyncEventType::QpFatal,
        AsyncEventType::QpReqErr,
        AsyncEventType::QpAccessErr,
        AsyncEventType::CommEst,
        AsyncEventType::SqDrained,
        AsyncEventType::DeviceFatal,
        AsyncEventType::PortActive,
        AsyncEventType::PortErr,
        AsyncEventType::SrqLimitReached,
        AsyncEventType::QpLastWqeReached,
    ];

    /// The libibverbs numeric value.
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }

    /// The type for a libibverbs numeric value; `None` for the types not
    /// represented and undefined values.
    pub const fn from_ibv(value: u32) -> Option<AsyncEventType> {
        Some(match value {
            0 => AsyncEventType::CqErr,
            1 => AsyncEventType::QpFatal,
            2 => AsyncEventType::QpReqErr,
            3 => AsyncEventType::QpAccessErr,
            4 => AsyncEventType::CommEst,
            5 => AsyncEventType::SqDrained,
            8 => AsyncEventType::DeviceFatal,
            9 => AsyncEventType::PortActive,
            10 => AsyncEventType::PortErr,
            15 => AsyncEventType::SrqLimitReached,
            16 => AsyncEventType::QpLastWqeReached,
            _ => return None,
        })
    }

    /// The libibverbs constant name, e.g. `"IBV_EVENT_QP_FATAL"`.
    pub const fn ibv_name(self) -> &'static str {
        match self {
            AsyncEventType::CqErr => "IBV_EVENT_CQ_ERR",
            AsyncEventType::QpFatal => "IBV_EVENT_QP_FATAL",
            AsyncEventType::QpReqErr => "IBV_EVENT_QP_REQ_ERR",
            AsyncEventType::QpAccessErr => "IBV_EVENT_QP_ACCESS_ERR",
            AsyncEventType::CommEst => "IBV_EVENT_COMM_EST",
            AsyncEventType::SqDrained => "IBV_EVENT_SQ_DRAINED",
            AsyncEventType::DeviceFatal => "IBV_EVENT_DEVICE_FATAL",
            AsyncEventType::PortActive => "IBV_EVENT_PORT_ACTIVE",
            AsyncEventType::PortErr => "IBV_EVENT_PORT_ERR",
            AsyncEventType::SrqLimitReached => "IBV_EVENT_SRQ_LIMIT_REACHED",
            AsyncEventType::QpLastWqeReached => "IBV_EVENT_QP_LAST_WQE_REACHED",
        }
    }

    /// The string `ibv_event_type_str(3)` returns for this type.
    pub const fn as_str(self) -> &'static str {
        match self {
            AsyncEventType::CqErr => "CQ error",
            AsyncEventType::QpFatal => "local work queue catastrophic error",
            AsyncEventType::QpReqErr => "invalid request local work queue error",
            AsyncEventType::QpAccessErr => "local access violation work queue error",
            AsyncEventType::CommEst => "communication established",
            AsyncEventType::SqDrained => "send queue drained",
            AsyncEventType::DeviceFatal => "local catastrophic error",
            AsyncEventType::PortActive => "port active",
            AsyncEventType::PortErr => "port error",
            AsyncEventType::SrqLimitReached => "SRQ limit reached",
            AsyncEventType::QpLastWqeReached => "last WQE reached",
        }
    }
}

/// Formats as `ibv_event_type_str(3)` does.
impl fmt::Display for AsyncEventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An asynchronous event with the object it concerns: `struct
/// ibv_async_event` (`element` union + `event_type`).
///
/// QPs are named by QP number, CQs and SRQs by the backend's handles, ports by
/// port number (the soft device has one port, number 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// `IBV_EVENT_CQ_ERR`: the CQ overflowed (more completions than entries)
    /// and can no longer be used (`ibv_poll_cq(3)`: CQ overrun).
    CqErr {
        /// Handle of the CQ.
        cq: u32,
    },
    /// `IBV_EVENT_QP_FATAL`: the QP went to Error for a local or transport
    /// reason; its WRs are flushed.
    QpFatal {
        /// QP number.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_REQ_ERR`: the QP went to Error on an invalid incoming
    /// request.
    QpReqErr {
        /// QP number.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_ACCESS_ERR`: the QP went to Error on an incoming access
    /// violation.
    QpAccessErr {
        /// QP number.
        qp_num: u32,
    },
    /// `IBV_EVENT_COMM_EST`: first incoming message on a QP in RTR.
    CommEst {
        /// QP number.
        qp_num: u32,
    },
    /// `IBV_EVENT_SQ_DRAINED`: the QP in SQD has no outstanding send WRs
    /// (requested with [`crate::QpAttr::en_sqd_async_notify`]).
    SqDrained {
        /// QP number.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: the SRQ-attached QP in Error will
    /// produce no more receive completions.
    QpLastWqeReached {
        /// QP number.
        qp_num: u32,
    },
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: fewer WRs than the armed limit remain in
    /// the SRQ, which disarmed itself (reported once per arming).
    SrqLimitReached {
        /// Handle of the SRQ.
        srq: u32,
    },
    /// `IBV_EVENT_DEVICE_FATAL`: the device is unusable; every QP is in
    /// Error. Delivered once per device context.
    DeviceFatal,
    /// `IBV_EVENT_PORT_ACTIVE`: the port's link came up.
    PortActive {
        /// Port number (from 1).
        port: u8,
    },
    /// `IBV_EVENT_PORT_ERR`: the port's link went down.
    PortErr {
        /// Port number (from 1).
        port: u8,
    },
}

impl AsyncEvent {
    /// The event's type (`ibv_async_event.event_type`).
    pub const fn event_type(&self) -> AsyncEventType {
        match self {
            AsyncEvent::CqErr { .. } => AsyncEventType::CqErr,
            AsyncEvent::QpFatal { .. } => AsyncEventType::QpFatal,
            AsyncEvent::QpReqErr { .. } => AsyncEventType::QpReqErr,
            AsyncEvent::QpAccessErr { .. } => AsyncEventType::QpAccessErr,
            AsyncEvent::CommEst { .. } => AsyncEventType::CommEst,
            AsyncEvent::SqDrained { .. } => AsyncEventType::SqDrained,
            AsyncEvent::QpLastWqeReached { .. } => AsyncEventType::QpLastWqeReached,
            AsyncEvent::SrqLimitReached { .. } => AsyncEventType::SrqLimitReached,
            AsyncEvent::DeviceFatal => AsyncEventType::DeviceFatal,
            AsyncEvent::PortActive { .. } => AsyncEventType::PortActive,
            AsyncEvent::PortErr { .. } => AsyncEventType::PortErr,
        }
    }

    /// The QP number for QP events, `None` otherwise.
    pub const fn qp_num(&self) -> Option<u32> {
        match self {
            AsyncEvent::QpFatal { qp_num }
            | AsyncEvent::QpReqErr { qp_num }
            | AsyncEvent::QpAccessErr { qp_num }
            | AsyncEvent::CommEst { qp_num }
            | AsyncEvent::SqDrained { qp_num }
            | AsyncEvent::QpLastWqeReached { qp_num } => Some(*qp_num),
            _ => None,
        }
    }

    /// The SRQ handle for SRQ events, `None` otherwise.
    pub const fn srq(&self) -> Option<u32> {
        match self {
            AsyncEvent::SrqLimitReached { srq } => Some(*srq),
            _ => None,
        }
    }
}

/// Formats as the type's `ibv_event_type_str(3)` string followed by the
/// object, e.g. `"local work queue catastrophic error (QP 0x11)"`.
impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.event_type();
        match self {
            AsyncEvent::CqErr { cq } => write!(f, "{t} (CQ {cq:#x})"),
            AsyncEvent::SrqLimitReached { srq } => write!(f, "{t} (SRQ {srq:#x})"),
            AsyncEvent::PortActive { port } | AsyncEvent::PortErr { port } => {
                write!(f, "{t} (port {port})")
            }
            AsyncEvent::DeviceFatal => write!(f, "{t}"),
            _ => match self.qp_num() {
                Some(qp) => write!(f, "{t} (QP {qp:#x})"),
                None => write!(f, "{t}"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `enum ibv_event_type` in rdma-core's `libibverbs/verbs.h`, with the
    /// strings of `ibv_event_type_str()` in `libibverbs/enum_strs.c`.
    #[test]
    fn values_and_strings_match_rdma_core() {
        let expected = [
            (AsyncEventType::CqErr, 0, "CQ error"),
            (
                AsyncEventType::QpFatal,
                1,
                "local work queue catastrophic error",
            ),
            (
                AsyncEventType::QpReqErr,
                2,
                "invalid request local work queue error",
            ),
            (
                AsyncEventType::QpAccessErr,
                3,
                "local access violation work queue error",
            ),
            (AsyncEventType::CommEst, 4, "communication established"),
            (AsyncEventType::SqDrained, 5, "send queue drained"),
            (AsyncEventType::DeviceFatal, 8, "local catastrophic error"),
            (AsyncEventType::PortActive, 9, "port active"),
            (AsyncEventType::PortErr, 10, "port error"),
            (AsyncEventType::SrqLimitReached, 15, "SRQ limit reached"),
            (AsyncEventType::QpLastWqeReached, 16, "last WQE reached"),
        ];
        assert_eq!(expected.len(), AsyncEventType::ALL.len());
        for (t, v, s) in expected {
            assert_eq!(t.to_ibv(), v, "{t:?}");
            assert_eq!(AsyncEventType::from_ibv(v), Some(t));
            assert_eq!(t.to_string(), s);
        }
        // IBV_EVENT_PATH_MIG (6), PATH_MIG_ERR (7), LID_CHANGE (11) ...
        for v in [6, 7, 11, 12, 13, 14, 17, 18, 19, 20] {
            assert_eq!(AsyncEventType::from_ibv(v), None, "{v}");
        }
    }

    #[test]
    fn event_types_and_elements() {
        let qp = AsyncEvent::QpFatal { qp_num: 0x11 };
        assert_eq!(qp.event_type(), AsyncEventType::QpFatal);
        assert_eq!(qp.qp_num(), Some(0x11));
        assert_eq!(
            qp.to_string(),
            "local work queue catastrophic error (QP 0x11)"
        );

        let cq = AsyncEvent::CqErr { cq: 3 };
        assert_eq!(cq.event_type().to_ibv(), 0);
        assert_eq!(cq.qp_num(), None);
        assert_eq!(cq.to_string(), "CQ error (CQ 0x3)");

        assert_eq!(
            AsyncEvent::PortErr { port: 1 }.to_string(),
            "port error (port 1)"
        );
        assert_eq!(
            AsyncEvent::DeviceFatal.to_string(),
            "local catastrophic error"
        );
        assert_eq!(
            AsyncEvent::QpAccessErr { qp_num: 2 }
                .event_type()
                .ibv_name(),
            "IBV_EVENT_QP_ACCESS_ERR"
        );
        assert_eq!(AsyncEvent::SqDrained { qp_num: 9 }.qp_num(), Some(9));

        let srq = AsyncEvent::SrqLimitReached { srq: 4 };
        assert_eq!(srq.event_type().to_ibv(), 15);
        assert_eq!((srq.srq(), srq.qp_num()), (Some(4), None));
        assert_eq!(srq.to_string(), "SRQ limit reached (SRQ 0x4)");
        assert_eq!(qp.srq(), None);
    }
}
