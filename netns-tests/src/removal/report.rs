//! The peer's machine-readable report ([`PeerReport`], one `RESULT <json>` line).

use super::*;

/// One QP's work requests, counted by the peer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpReport {
    /// QP number.
    pub qpn: u32,
    /// `load`, `churn`, `held`, `after`, `readd`.
    pub purpose: String,
    /// WRs posted (send and receive) that the post call accepted.
    pub posted: u64,
    /// Completions polled (any status).
    pub completed: u64,
    /// ... with `Success`.
    pub success: u64,
    /// ... with `WrFlushErr`.
    pub flushed: u64,
    /// ... with another status.
    pub errors: u64,
    /// The QP's state when it was destroyed (`Error` expected once its connection or
    /// device ended).
    pub final_state: String,
}

/// One rdma-cm id as its callbacks saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdReport {
    /// The id's serial.
    pub serial: u64,
    /// `listener`, `load`, `churn`, `held`, `after`, `readd`, `passive`.
    pub purpose: String,
    /// Event kinds delivered, in order.
    pub events: Vec<String>,
    /// `DeviceRemoval` events delivered.
    pub removals: u32,
    /// `user` (destroy called), `return` (a callback returned Destroy), or empty.
    pub destroyed: String,
}

/// Live objects at the end (all zero when nothing leaked).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndStats {
    /// `RdmaCmStats::ids_alive`.
    pub ids_alive: usize,
    /// `RdmaCmStats::devices_held` (after the device was released or removed).
    pub devices_held: usize,
    /// `RdmaCmStats::events_unacked`.
    pub events_unacked: usize,
    /// `RdmaCmStats::internal_listeners`.
    pub internal_listeners: usize,
    /// `RdmaCmStats::timers_pending`.
    pub timers_pending: usize,
    /// Sum over devices of `ProviderStats::conns_alive`.
    pub conns_alive: usize,
    /// Sum of `ProviderStats::conns_watched`.
    pub conns_watched: usize,
    /// Sum of `ProviderStats::listeners`.
    pub listeners: usize,
    /// Sum of `ProviderStats::qp_refs`.
    pub qp_refs: usize,
}

/// What a peer prints as `RESULT <json>`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PeerReport {
    /// `server` / `client`.
    pub role: String,
    /// The scenario.
    pub scenario: String,
    /// Names of our devices the RDMA CM removed.
    pub removed_devices: Vec<String>,
    /// When the peer first noticed something of the removal: a `DeviceRemoval`, the
    /// end of a long-lived connection, a flushed completion on a load QP (ns).
    pub first_notice_ns: Option<u64>,
    /// What that first notice was.
    pub first_notice: Option<String>,
    /// The first `DeviceRemoval` delivered (ns).
    pub first_removal_ns: Option<u64>,
    /// The churn thread's phase at the first notice.
    pub phase_at_notice: Option<String>,
    /// Every QP.
    pub qps: Vec<QpReport>,
    /// Every id.
    pub ids: Vec<IdReport>,
    /// `DeviceRemoval` events delivered (counted by the callbacks).
    pub device_removals: usize,
    /// `RdmaCmStats::device_removals` (the CM's count; must equal the above).
    pub cm_device_removals: usize,
    /// `RdmaCmStats::removals_skipped`: ids of a removed device that got nothing
    /// because their destroy had been asked.
    pub removals_skipped: usize,
    /// Ids destroyed by a destroy call.
    pub destroyed_by_user: usize,
    /// Ids destroyed by a callback's Destroy return.
    pub destroyed_by_return: usize,
    /// When each long-lived connection ended (ns) and how.
    pub load_ends: Vec<(u64, String)>,
    /// Connections established (server: accepted; client: connected).
    pub established: usize,
    /// Of those, after one of our devices was removed.
    pub established_after_removal: usize,
    /// Seed scenario: when the held callback returned (ns).
    pub hold_returned_ns: Option<u64>,
    /// Destroy-blocked scenario: when the blocked destroy started and returned (ns).
    pub blocked_destroy_ns: Option<(u64, u64)>,
    /// Readd scenario: the new device carried an RDMA Write on a new id.
    pub readd_ok: Option<bool>,
    /// Churn cycles started.
    pub churn_cycles: usize,
    /// Live objects at the end.
    pub stats: EndStats,
    /// Threads other than the main one still there at the end (names).
    pub threads_left: Vec<String>,
    /// Broken invariants (empty when all is well).
    pub violations: Vec<String>,
    /// When the report was made (ns).
    pub done_ns: u64,
}

impl PeerReport {
    /// The report in a peer's stdout (its `RESULT ` line).
    ///
    /// Errors: [`ReportError`]: no such line, or bad JSON.
    pub fn from_stdout(stdout: &str) -> Result<PeerReport, ReportError> {
        let line = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("RESULT "))
            .next_back()
            .ok_or(ReportError::Missing)?;
        serde_json::from_str(line).map_err(ReportError::Json)
    }

    /// The ids with this purpose.
    pub fn ids_of<'a>(&'a self, purpose: &'a str) -> impl Iterator<Item = &'a IdReport> {
        self.ids.iter().filter(move |i| i.purpose == purpose)
    }

    /// Every QP drained: posted == completed.
    pub fn lost_completions(&self) -> Vec<&QpReport> {
        self.qps
            .iter()
            .filter(|q| q.posted != q.completed)
            .collect()
    }
}

/// Why a peer's report could not be read from its stdout.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The peer printed no `RESULT ` line (it failed before the end).
    #[error("no RESULT line")]
    Missing,
    /// The last `RESULT ` line is not a [`PeerReport`] in JSON.
    #[error("bad RESULT line: {0}")]
    Json(#[source] serde_json::Error),
}
