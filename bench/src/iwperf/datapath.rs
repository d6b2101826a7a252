//! The verbs side of iwperf: one PD and one CQ per process, per connection a data MR
//! and a small control MR, and the loops that post and poll.
//!
//! # Buffers
//!
//! A data MR is `slots` message slots of `slot_len` bytes. Without `--verify` the slots
//! are few (at most [`BUFFER_BUDGET`] bytes in all, like the raw TCP baseline's 1 MiB
//! send pattern) and WRs cycle through them. With `--verify` each side has `tx_depth`
//! slots (the server's receives: one slot per posted receive), slot `k` of connection
//! `i` holds the pattern [`slot_pattern`]`(i, k)`, and Writes and Sends carry the WR's
//! sequence number in their first 8 bytes, so the receiver can tell every message (Send)
//! or the last message of every slot (Write) from any other:
//!
//! - Write: after the client's `Done` (with the number of WRs), the server checks that
//!   each of its slots holds the last Write aimed at it.
//! - Send: the server checks each message as its receive completes (sequence number
//!   and pattern).
//! - Read: the client checks each slot as its Read completes (the server's slots hold
//!   their patterns).
//!
//! # Flow control
//!
//! Every send-queue WR is posted within a [`SendWindow`]: data WRs within the QP's data
//! window ([`QpBufs::window`]: `tx_depth`, or less where the device's send queue or CQ
//! is smaller; Reads also the negotiated ORD), control messages within
//! [`CTRL_SENDS`]; both signal one WR in a few, and a slot is free again only once a
//! signaled completion at or after it was polled (verbs' rule, not the soft device's
//! looser one). No loop posts until `QueueFull` to find out when to poll: a refused post
//! is an error. The one CQ holds every QP's windows and receive queues, so it cannot
//! overrun; if it does anyway, the poll's error (with the completions lost) ends the
//! run with the WR counts.
//!
//! Sends need a posted receive at the server (iWARP has no RNR retry: a
//! Send without one is a fatal error, RFC 5040 7.2), so the server posts its receives
//! before it accepts, tells the client how many ([`AcceptInfo::credits`]), reposts each
//! as it completes and returns them in batches of a quarter as [`Ctrl::Credit`]; the
//! client keeps one credit back for its `Done`.
//!
//! # End of a run
//!
//! The client's last data WR is signaled; once it completed (which means every earlier
//! one did: send queue completions are in order) the client sends `Done` with its WR
//! count; the server checks what it must and answers `DoneAck` with the outcome. Latency
//! runs end with the client's disconnect.

use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs::provider::{
    CompletionQueue, Device as _, MemoryRegion, ProtectionDomain, Provider, ProviderError,
    QueuePair,
};
use verbs::{
    AccessFlags, DeviceCaps, QpCap, RecvWr, SendFlags, SendWr, Sge, WcStatus, WorkCompletion,
};

use super::conn::{check_interrupted, CmStatus, VerbsSetup};
use super::ledger::{WrCounts, WrLedger};
use super::report::{gbps, BwResult, LatStats};
use super::window::SendWindow;
use super::wire::{AcceptInfo, Ctrl, Mode, MrInfo, Op, TestParams, VerifyStatus, CTRL_LEN};
use super::IwperfError;

/// Bytes of data buffer per connection and side when not verifying (the raw TCP
/// baseline sends from a 1 MiB pattern).
pub const BUFFER_BUDGET: usize = 1 << 20;
/// Bytes of receive slots per connection the server may use when verifying Sends.
pub const VERIFY_BUDGET: usize = 16 << 20;
/// Receives for control messages each side keeps posted.
pub const CTRL_RECVS: u32 = 16;
/// Send-queue slots of a QP for control messages (`Credit`, `Done`, `DoneAck`), beside
/// its data window: the control messages' [`SendWindow`], which signals every
/// `CTRL_SENDS / 2`-th.
pub const CTRL_SENDS: u32 = 16;
/// The smallest `max_qp_wr` iwperf runs with: a data WR beside the control messages, and
/// 8 receives (a Send test's server).
pub const MIN_QP_WR: u32 = CTRL_SENDS + 8;
/// Bytes per control slot.
const CTRL_SLOT: usize = 64;
/// Receives each side keeps posted in a latency run.
pub const LAT_RECVS: u32 = 16;
/// Largest message sent inline (copied into the WR instead of read from the MR).
pub const MAX_INLINE: u32 = 256;
/// Inline data asked for when the device does not say what it takes
/// (`DeviceCaps::max_inline` 0: rdma-core reports no figure but iw_cxgb4's; kernel siw
/// takes 80 bytes): enough for the control messages ([`CTRL_LEN`] + 1 bytes).
pub const UNKNOWN_INLINE: u32 = 64;
/// How long a latency client waits for one answer before it gives up (a message the
/// peer never took: the run ends with [`IwperfError::Connection`] instead of hanging).
pub const LAT_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// How a side waits when there is nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Bandwidth runs: keep polling (yielding the CPU between polls) for this long
    /// after the last progress before blocking on the CQ. Default 0: block at once
    /// (measured: the application thread shares its core with the device's engine
    /// thread, and yielding to it costs more than a wake-up; Send 6.4 -> 12 Gbit/s,
    /// Write 9.9 -> 13.7 at MTU 65000).
    pub spin: Duration,
    /// Latency runs: the same (default 200 us: one round trip is shorter, and a
    /// blocked waiter's wake-up doubles it: 10.5 -> 19 us at 8 bytes).
    pub lat_spin: Duration,
    /// Bandwidth runs: when idle, sleep this long instead of waiting on the CQ (0:
    /// wait on the CQ).
    pub nap: Duration,
    /// Server, Send tests: receives to post per connection (perftest's `--rx-depth`).
    pub rx_depth: u32,
    /// Server: what a client's test parameters may make the server allocate.
    pub limits: ServerLimits,
}

/// Server: the most a client's test may ask for. The parameters arrive from the network
/// (the MPA Request's private data), so the server checks each request against these
/// before it makes a QP or allocates a byte, and rejects what exceeds them with the
/// reason in the Reject's private data (`iwperf server --max-size / --max-qps /
/// --max-tx-depth / --max-memory` raise them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Largest message, bytes. Default 64 MiB.
    pub max_size: u32,
    /// Most connections (QPs) in one test. Default 256.
    pub max_qps: u16,
    /// Deepest send queue of the client (also the slot count of verified buffers).
    /// Default 4096.
    pub max_tx_depth: u16,
    /// Most bytes of data buffers and patterns the whole test may make the server
    /// allocate (the request's connection count times what its connection needs).
    /// Default 1 GiB.
    pub max_memory: u64,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_size: 64 << 20,
            max_qps: 256,
            max_tx_depth: 4096,
            max_memory: 1 << 30,
        }
    }
}

impl ServerLimits {
    /// Checks a request's `params`, whose connection needs `bytes` of buffers, against
    /// the limits.
    ///
    /// Errors: the first limit exceeded, as a line for both ends (it becomes the
    /// Reject's private data, which RFC 5044 caps at 512 bytes: the line is shorter).
    pub fn check(&self, params: &TestParams, bytes: u64) -> Result<(), String> {
        let over = |what: &str, asked: u64, limit: u64, opt: &str| {
            Err(format!(
                "{what} {asked} exceeds the server's limit of {limit} (iwperf server {opt})"
            ))
        };
        if params.size > self.max_size {
            return over(
                "message size",
                params.size.into(),
                self.max_size.into(),
                "--max-size",
            );
        }
        if params.qps > self.max_qps {
            return over(
                "QP count",
                params.qps.into(),
                self.max_qps.into(),
                "--max-qps",
            );
        }
        if params.tx_depth > self.max_tx_depth {
            return over(
                "send-queue depth",
                params.tx_depth.into(),
                self.max_tx_depth.into(),
                "--max-tx-depth",
            );
        }
        let total = bytes.saturating_mul(params.qps.into());
        if total > self.max_memory {
            return over(
                "buffer memory (bytes)",
                total,
                self.max_memory,
                "--max-memory",
            );
        }
        Ok(())
    }
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            spin: Duration::ZERO,
            lat_spin: Duration::from_micros(200),
            nap: Duration::ZERO,
            rx_depth: 512,
            limits: ServerLimits::default(),
        }
    }
}

/// How long a run is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RunLength {
    /// This many data WRs per connection (bandwidth) or round trips (latency).
    Iters(u64),
    /// Until this much time has passed since the first post.
    Time(Duration),
}

/// A progress report, about once a second (client side).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Seconds since the first post.
    pub seconds: f64,
    /// Payload bytes completed so far (bandwidth) or round trips (latency).
    pub amount: u64,
    /// Gbit/s over the last interval (bandwidth; 0 for latency).
    pub gbps: f64,
}

/// The pattern of slot `slot` of connection `index`: `len` pseudo-random bytes, the
/// same on both sides.
pub fn slot_pattern(index: u16, slot: u32, len: usize) -> Vec<u8> {
    crate::tcp::pattern(
        len,
        0x1a2b_0000_0000 ^ (u64::from(index) << 32) ^ (u64::from(slot) << 1),
    )
}

// Work request ids: kind in the top 4 bits, the connection's position in 16 bits, then
// a sequence number or slot.
const K_DATA_SEND: u64 = 1;
const K_CTRL_SEND: u64 = 2;
const K_DATA_RECV: u64 = 3;
const K_CTRL_RECV: u64 = 4;
const N_BITS: u32 = 44;

fn wr_id(kind: u64, pos: usize, n: u64) -> u64 {
    kind << 60 | (pos as u64 & 0xffff) << N_BITS | (n & ((1 << N_BITS) - 1))
}

fn wr_kind(id: u64) -> u64 {
    id >> 60
}

fn wr_pos(id: u64) -> usize {
    ((id >> N_BITS) & 0xffff) as usize
}

fn wr_n(id: u64) -> u64 {
    id & ((1 << N_BITS) - 1)
}

fn setup_err(what: &str) -> impl Fn(ProviderError) -> IwperfError + '_ {
    move |e| IwperfError::Setup(format!("{what}: {e}"))
}

/// The SGE of `[offset, offset + len)` of `mr`. The ranges are the side's own slots,
/// inside the MR; one that is not is still described as asked, and the device
/// refuses it at post time (a local protection error), as a C program's would be.
fn sge<M: MemoryRegion>(mr: &M, offset: u64, len: u32) -> Sge {
    usize::try_from(offset)
        .ok()
        .and_then(|o| mr.sge(o, len))
        .unwrap_or_else(|| Sge::new(mr.iova().wrapping_add(offset), len, mr.lkey()))
}

/// One connection's buffers and what the peer said.
pub struct QpBufs<P: Provider> {
    /// The test parameters (from the client).
    pub params: TestParams,
    /// The QP.
    pub qp: Arc<P::Qp>,
    /// The data MR.
    pub data: P::Mr,
    /// Slots in `data`.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_len: u32,
    /// The control MR (receives of control messages).
    pub ctrl: P::Mr,
    /// Data receives posted (server Send tests, latency runs).
    pub data_recvs: u32,
    /// The data WRs that may be outstanding on the send queue ([`SendWindow`]):
    /// `tx_depth`, or less where the device granted a smaller send queue (beside
    /// [`CTRL_SENDS`]) or a smaller CQ ([`Side`]'s CQ share).
    pub window: u32,
    /// Client: the server's answer; server: what it answered.
    pub accept: AcceptInfo,
    /// The side's WR ledger (shared by its QPs).
    ledger: Arc<WrLedger>,
    /// Client: the RDMA Reads it may have in flight (its ORD as negotiated: at most
    /// what it asked for and what the server's IRD allows).
    pub ord: u16,
    /// Patterns of the client's slots (when verifying).
    patterns: Vec<Vec<u8>>,
    /// Server: the connection went away before the test started
    /// ([`VerbsSetup::retire_qp`]); the run leaves it out (its buffers stay until
    /// [`Side::release`]: positions in the list are in the WR ids).
    retired: bool,
}

impl<P: Provider> QpBufs<P> {
    /// Posts `wrs` on the send queue in order (one doorbell) and counts them in the
    /// ledger once posted (a refused list counts none).
    fn post_sends(&self, wrs: impl IntoIterator<Item = SendWr>) -> Result<(), ProviderError> {
        let (mut signaled, mut unsignaled) = (0, 0);
        self.qp.post_send_list(wrs.into_iter().inspect(|w| {
            if w.flags.contains(SendFlags::SIGNALED) {
                signaled += 1;
            } else {
                unsignaled += 1;
            }
        }))?;
        self.ledger.posted_sends(signaled, unsignaled);
        Ok(())
    }

    /// Posts one send-queue WR and counts it ([`Self::post_sends`]).
    fn post_send(&self, wr: SendWr) -> Result<(), ProviderError> {
        self.post_sends(std::iter::once(wr))
    }

    /// Posts `wrs` on the receive queue in order and counts them once posted.
    fn post_recvs(&self, wrs: impl IntoIterator<Item = RecvWr>) -> Result<(), ProviderError> {
        let mut n = 0;
        self.qp
            .post_recv_list(wrs.into_iter().inspect(|_| n += 1))?;
        self.ledger.posted_recvs(n);
        Ok(())
    }

    /// Posts one receive WR and counts it.
    fn post_recv(&self, wr: RecvWr) -> Result<(), ProviderError> {
        self.post_recvs(std::iter::once(wr))
    }
}

impl<P: Provider> std::fmt::Debug for QpBufs<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpBufs")
            .field("params", &self.params)
            .field("qp", &self.qp.qp_num())
            .field("slots", &self.slots)
            .field("slot_len", &self.slot_len)
            .field("accept", &self.accept)
            .field("retired", &self.retired)
            .finish_non_exhaustive()
    }
}

/// Which side of the test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Accepts, receives, answers.
    Server,
    /// Connects, drives the run, measures.
    Client,
}

/// The verbs objects of one side on a device of provider `P`: PD, CQ and each
/// connection's buffers. Implements [`VerbsSetup`] for [`super::conn`].
pub struct Side<P: Provider> {
    role: Role,
    tuning: Tuning,
    pd: Option<P::Pd>,
    cq: Option<P::Cq>,
    /// The device's limits (read with the first QP); what the side asks for is clamped
    /// to them.
    caps: Option<DeviceCaps>,
    /// The connections' buffers, in the order their QPs were made.
    pub qps: Vec<QpBufs<P>>,
    /// Every WR posted and completion polled on this side.
    ledger: Arc<WrLedger>,
    /// The largest data window each connection's share of the CQ leaves room for
    /// (`u32::MAX` until the CQ is made; less than `tx_depth` only where the device's
    /// `max_cqe` is smaller than the test needs).
    cq_window: u32,
}

impl<P: Provider> std::fmt::Debug for Side<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side")
            .field("role", &self.role)
            .field("tuning", &self.tuning)
            .field("caps", &self.caps)
            .field("qps", &self.qps)
            .finish_non_exhaustive()
    }
}

impl<P: Provider> Side<P> {
    /// An empty side; the PD and CQ are made with the first QP.
    pub fn new(role: Role, tuning: Tuning) -> Side<P> {
        Side {
            role,
            tuning,
            pd: None,
            cq: None,
            caps: None,
            qps: Vec::new(),
            ledger: Arc::default(),
            cq_window: u32::MAX,
        }
    }

    fn cq(&self) -> &P::Cq {
        self.cq.as_ref().expect("CQ made with the first QP")
    }

    /// After a `DeviceRemoval` ended the run: polls the CQ until every WR this side
    /// posted has completed, successfully or flushed ([`WrCounts::outstanding`] is 0),
    /// or until `limit` passes; returns the counts then, and the poll's error if the
    /// CQ failed (an overrun: its completions lost). Every posted WR completes exactly
    /// once (design.md section 5): a WR still outstanding is a lost one.
    pub fn drain_after_removal(&self, limit: Duration) -> (WrCounts, Option<String>) {
        let Some(cq) = self.cq.as_ref() else {
            return (self.ledger.counts(), None);
        };
        let deadline = Instant::now() + limit;
        let mut wcs = vec![WorkCompletion::new(0, WcStatus::Success, verbs::WcOpcode::Send, 0); 64];
        while self.ledger.counts().outstanding() > 0 && Instant::now() < deadline {
            match cq.poll_into(&mut wcs) {
                Ok(0) => {
                    // A failed wait shows at the next poll.
                    let _ = cq.wait(Duration::from_millis(5));
                }
                Ok(n) => self.ledger.completed(&wcs[..n]),
                Err(e) => return (self.ledger.counts(), Some(format!("poll CQ: {e}"))),
            }
        }
        (self.ledger.counts(), None)
    }

    /// The inline data asked for at QP creation: [`MAX_INLINE`], or less if the device
    /// takes less, or [`UNKNOWN_INLINE`] when it does not say.
    fn max_inline(&self) -> u32 {
        match self.caps.map(|c| c.max_inline) {
            None => MAX_INLINE,
            Some(0) => UNKNOWN_INLINE,
            Some(n) => MAX_INLINE.min(n),
        }
    }

    fn pos_of(&self, qp_num: u32) -> Option<usize> {
        self.qps.iter().position(|q| q.qp.qp_num() == qp_num)
    }

    /// Bytes of data buffer and patterns that [`Side::add_qp`] allocates for a
    /// connection with `p` (the control buffer's few KiB aside).
    fn buffer_bytes(&self, p: &TestParams) -> u64 {
        let (slots, slot_len, _) = self.data_slots(p);
        u64::from(slots) * u64::from(slot_len)
            + u64::from(self.pattern_slots(p, slots)) * u64::from(p.size)
    }

    /// How many slot patterns [`Side::add_qp`] keeps for a connection with `p` whose
    /// data buffer has `slots` slots: the client's slots (Write, Send sources; Read
    /// checks the server's slots, which have the same count when verifying) and the
    /// server's Read source.
    fn pattern_slots(&self, p: &TestParams, slots: u32) -> u32 {
        let verify = p.verify && p.mode == Mode::Bandwidth;
        match (self.role, p.op) {
            (_, _) if p.mode == Mode::Latency => 0,
            (Role::Server, Op::Read) => slots,
            _ if verify => u32::from(p.tx_depth),
            _ => 0,
        }
    }

    fn data_slots(&self, p: &TestParams) -> (u32, u32, u32) {
        let size = p.size as usize;
        let depth = u32::from(p.tx_depth);
        let few = |slot_len: usize, n: u32| -> u32 {
            n.min((BUFFER_BUDGET / slot_len.max(1)).max(1) as u32)
        };
        if p.mode == Mode::Latency {
            return (2, p.size, LAT_RECVS);
        }
        match (self.role, p.op) {
            (Role::Server, Op::Send) => {
                let slot_len = size.max(CTRL_LEN + 1);
                let recvs = if p.verify {
                    self.tuning
                        .rx_depth
                        .min((VERIFY_BUDGET / slot_len).max(8) as u32)
                } else {
                    self.tuning.rx_depth
                }
                .max(8)
                // No more than the device's receive queue holds.
                .min(self.caps.map_or(u32::MAX, |c| c.max_qp_wr.max(8)));
                let slots = if p.verify {
                    recvs
                } else {
                    few(slot_len, recvs)
                };
                (slots, slot_len as u32, recvs)
            }
            _ => {
                let slots = if p.verify { depth } else { few(size, depth) };
                (slots, p.size, 0)
            }
        }
    }

    /// Registers the buffers of a new QP, fills patterns and posts receives.
    fn add_qp(&mut self, params: &TestParams, qp: &Arc<P::Qp>) -> Result<&QpBufs<P>, IwperfError> {
        let (slots, slot_len, data_recvs) = self.data_slots(params);
        // The data window: what the test asks, within the send queue the device granted
        // (beside the control messages) and the connection's share of the CQ.
        let granted = qp.cap();
        let window = u32::from(params.tx_depth)
            .max(1)
            .min(self.cq_window)
            .min(granted.max_send_wr.saturating_sub(CTRL_SENDS));
        // One receive queue: a side posts either control receives or data receives,
        // never both (receives are consumed in posting order).
        let ctrl_recvs = if data_recvs == 0 { CTRL_RECVS } else { 0 };
        if window == 0 || granted.max_recv_wr < ctrl_recvs + data_recvs {
            return Err(IwperfError::Setup(format!(
                "the QP's queues are too small: {granted:?} granted, {} sends and {} receives needed",
                CTRL_SENDS + 1,
                ctrl_recvs + data_recvs
            )));
        }
        let pd = self.pd.as_ref().expect("PD made with the first QP");
        let len = u64::from(slots) * u64::from(slot_len);
        let mr_len = usize::try_from(len)
            .map_err(|_| IwperfError::Setup(format!("a data buffer of {len} bytes")))?;
        // The data MR is also the sink of the client's RDMA Reads: iw_cxgb4 wants
        // REMOTE_WRITE there (DeviceCaps::read_sink_needs_remote_write).
        let mut data = pd
            .reg_mr(
                mr_len,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            )
            .map_err(setup_err("register the data MR"))?;
        let ctrl = pd
            .reg_mr(CTRL_SLOT * CTRL_RECVS as usize, AccessFlags::LOCAL_WRITE)
            .map_err(setup_err("register the control MR"))?;
        let verify = params.verify && params.mode == Mode::Bandwidth;
        let pattern_slots = self.pattern_slots(params, slots);
        let patterns: Vec<Vec<u8>> = (0..pattern_slots)
            .map(|k| slot_pattern(params.index, k, params.size as usize))
            .collect();
        let fill = match (self.role, params.op) {
            (Role::Server, Op::Read) => true,
            (Role::Client, Op::Write | Op::Send) => verify,
            _ => false,
        };
        if fill {
            for (k, p) in patterns.iter().enumerate().take(slots as usize) {
                data.write(k * slot_len as usize, p)
                    .map_err(setup_err("fill the data MR"))?;
            }
        }
        let pos = self.qps.len();
        // Receives: data receives for the server of a Send test and both sides of a
        // latency run (all into slot 1); control receives otherwise.
        let mut recvs: Vec<RecvWr> = (0..ctrl_recvs)
            .map(|k| {
                RecvWr::new(
                    wr_id(K_CTRL_RECV, pos, u64::from(k)),
                    vec![sge(&ctrl, k as u64 * CTRL_SLOT as u64, CTRL_SLOT as u32)],
                )
            })
            .collect();
        for r in 0..data_recvs {
            let (slot, n) = if params.mode == Mode::Latency {
                (1, 1)
            } else {
                (r % slots, u64::from(r))
            };
            recvs.push(RecvWr::new(
                wr_id(K_DATA_RECV, pos, n),
                vec![sge(&data, u64::from(slot) * u64::from(slot_len), slot_len)],
            ));
        }
        let n_recvs = recvs.len() as u64;
        qp.post_recv_list(recvs)
            .map_err(|e| IwperfError::Setup(format!("post receives: {e}")))?;
        self.ledger.posted_recvs(n_recvs);
        let accept = AcceptInfo {
            mr: MrInfo {
                iova: data.iova(),
                rkey: data.rkey().raw(),
                len,
            },
            slots,
            slot_len,
            credits: if params.op == Op::Send && params.mode == Mode::Bandwidth {
                data_recvs
            } else {
                0
            },
            // Set with the CM's ConnParam at the accept (`conn::accept_all`).
            ird: 0,
        };
        self.qps.push(QpBufs {
            params: *params,
            qp: Arc::clone(qp),
            data,
            slots,
            slot_len,
            ctrl,
            data_recvs,
            window,
            accept,
            ledger: self.ledger.clone(),
            ord: 0,
            patterns,
            retired: false,
        });
        Ok(&self.qps[pos])
    }

    /// Drops every QP handle, MR, the CQ and the PD (QPs first), and checks that every
    /// QP's queues were retired.
    pub fn release(&mut self) {
        for q in self.qps.drain(..) {
            drop(q);
        }
        self.cq = None;
        self.pd = None;
    }
}

/// The CQ of a test of `qps` connections, each with a data window of `depth` WRs,
/// [`CTRL_SENDS`] control messages and `recvs` receives: the entries to ask for (each
/// connection's windows and receive queue: everything it can leave unpolled) and the
/// data window each connection's share leaves room for (`depth`, or less where the
/// device's `max_cqe` is smaller).
///
/// Errors: [`IwperfError::Setup`] when `max_cqe` cannot hold even one data WR beside
/// every connection's receives and control messages.
fn cq_size(depth: u32, recvs: u32, qps: u16, max_cqe: u32) -> Result<(u32, u32), IwperfError> {
    let qps = u32::from(qps.max(1));
    let fixed = CTRL_SENDS.saturating_add(recvs);
    let n = depth.saturating_add(fixed).saturating_mul(qps).min(max_cqe);
    match (n / qps).checked_sub(fixed) {
        Some(window) if window > 0 => Ok((n, window.min(depth))),
        _ => Err(IwperfError::Setup(format!(
            "the device's CQs hold at most {max_cqe} completions (max_cqe); {qps} connections need {} (fewer QPs, or a smaller receive depth)",
            fixed.saturating_add(1).saturating_mul(qps)
        ))),
    }
}

impl<P: Provider> VerbsSetup<P> for Side<P> {
    fn qp_resources(
        &mut self,
        device: &P::Device,
        params: &TestParams,
    ) -> Result<(&P::Pd, &P::Cq, QpCap), IwperfError> {
        if self.caps.is_none() {
            let caps = device.caps().map_err(setup_err("query the device"))?;
            if caps.max_qp_wr < MIN_QP_WR {
                return Err(IwperfError::Setup(format!(
                    "the device's queues hold at most {} WRs (max_qp_wr); iwperf needs {MIN_QP_WR}",
                    caps.max_qp_wr
                )));
            }
            self.caps = Some(caps);
        }
        let caps = self.caps.expect("read above");
        let (_, _, data_recvs) = self.data_slots(params);
        // At least one data WR (a request from the network may say 0).
        let depth = u32::from(params.tx_depth).max(1);
        if self.pd.is_none() {
            self.pd = Some(device.alloc_pd().map_err(setup_err("allocate the PD"))?);
        }
        if self.cq.is_none() {
            // Every connection of the test completes into this one CQ, made with the
            // first, and they may run different ops (`--op write,send`): size each
            // connection's share for the op that needs the most receives. (Sized from a
            // first Write request, a Send connection's receives overflowed it when the
            // server fell behind: found by the root-only flood test.)
            let most_recvs = Op::ALL
                .iter()
                .map(|&op| self.data_slots(&TestParams { op, ..*params }).2)
                .max()
                .unwrap_or(data_recvs)
                .max(data_recvs);
            let (n, window) = cq_size(depth, most_recvs + CTRL_RECVS, params.qps, caps.max_cqe)?;
            self.cq = Some(device.create_cq(n).map_err(setup_err("create the CQ"))?);
            self.cq_window = window;
        }
        let max_wr = caps.max_qp_wr.max(1);
        let cap = QpCap {
            max_send_wr: (depth.min(self.cq_window) + CTRL_SENDS).min(max_wr),
            max_recv_wr: (data_recvs + CTRL_RECVS).min(max_wr),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: self.max_inline(),
        };
        Ok((
            self.pd.as_ref().expect("made above"),
            self.cq.as_ref().expect("made above"),
            cap,
        ))
    }

    fn admit(&self, params: &TestParams) -> Result<(), String> {
        self.tuning.limits.check(params, self.buffer_bytes(params))
    }

    fn retire_qp(&mut self, qp_num: u32) {
        if let Some(pos) = self.pos_of(qp_num) {
            self.qps[pos].retired = true;
        }
    }

    fn caps(&self) -> Option<DeviceCaps> {
        self.caps
    }

    fn server_qp(
        &mut self,
        params: &TestParams,
        qp: &Arc<P::Qp>,
    ) -> Result<AcceptInfo, IwperfError> {
        Ok(self.add_qp(params, qp)?.accept)
    }

    fn client_qp(&mut self, params: &TestParams, qp: &Arc<P::Qp>) -> Result<MrInfo, IwperfError> {
        Ok(self.add_qp(params, qp)?.accept.mr)
    }

    fn client_accepted(
        &mut self,
        qp_num: u32,
        accept: AcceptInfo,
        ord: u16,
    ) -> Result<(), IwperfError> {
        let pos = self
            .pos_of(qp_num)
            .ok_or_else(|| IwperfError::Setup(format!("no buffers for QP {qp_num}")))?;
        let q = &mut self.qps[pos];
        if accept.slot_len < q.params.size.min(accept.slot_len.max(1))
            || u64::from(accept.slots) * u64::from(accept.slot_len) > accept.mr.len
        {
            return Err(IwperfError::Connection(format!(
                "the server's buffer does not fit: {accept:?}"
            )));
        }
        if q.params.mode == Mode::Bandwidth
            && q.params.op != Op::Send
            && accept.slot_len < q.params.size
        {
            return Err(IwperfError::Connection(format!(
                "the server's slots ({} bytes) are smaller than the messages ({})",
                accept.slot_len, q.params.size
            )));
        }
        q.accept = accept;
        q.ord = ord;
        if q.params.verify && q.params.op == Op::Read && q.params.mode == Mode::Bandwidth {
            // The server's slots hold their patterns; reads are checked against them.
            q.patterns = (0..accept.slots)
                .map(|k| slot_pattern(q.params.index, k, q.params.size as usize))
                .collect();
        }
        Ok(())
    }
}

/// Waits politely: polls (yielding the CPU) for `spin` after the last progress, then
/// blocks on the CQ for at most 1 ms at a time.
struct Idle {
    spin: Duration,
    nap: Duration,
    since: Option<Instant>,
}

impl Idle {
    fn new(spin: Duration, nap: Duration) -> Idle {
        Idle {
            spin,
            nap,
            since: None,
        }
    }

    fn progressed(&mut self) {
        self.since = None;
    }

    fn wait<C: CompletionQueue>(&mut self, cq: Option<&C>) {
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if now.duration_since(since) < self.spin {
            std::thread::yield_now();
        } else if !self.nap.is_zero() {
            // Sleep instead of waiting on the CQ: the engine then never has to wake
            // this thread (a context switch per completion on a shared core).
            std::thread::sleep(self.nap);
        } else {
            match cq {
                Some(cq) => {
                    // An error shows at the next poll.
                    let _ = cq.wait(Duration::from_millis(1));
                }
                None => std::thread::sleep(Duration::from_micros(50)),
            }
        }
    }
}

/// How long a completion in error waits for rdma-cm to say why: the device's engine
/// flushes the QPs when the link goes, before rdma-cm has delivered `DeviceRemoval`
/// (and a `Disconnected` may come first).
const CLASSIFY_WAIT: Duration = Duration::from_millis(1000);
/// After a `Disconnected`, how long to wait for a `DeviceRemoval` still.
const CLASSIFY_AFTER_DISCONNECT: Duration = Duration::from_millis(300);

/// Waits (at most [`CLASSIFY_WAIT`]) until rdma-cm reported a removal, or a while after
/// it reported a disconnect; true if removed.
fn removal_follows(status: &CmStatus) -> bool {
    let t0 = Instant::now();
    let mut disconnected_at: Option<Instant> = None;
    while !status.removed() {
        let now = Instant::now();
        if status.disconnected() > 0 {
            let d = *disconnected_at.get_or_insert(now);
            if now.duration_since(d) >= CLASSIFY_AFTER_DISCONNECT {
                return false;
            }
        }
        if now.duration_since(t0) >= CLASSIFY_WAIT {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

/// What a completion in error means: the device was removed (rdma-cm's
/// `DeviceRemoval`, waited for briefly: [`removal_follows`]), or the connection
/// failed.
fn wc_error(wc: &WorkCompletion, status: &CmStatus) -> IwperfError {
    if removal_follows(status) {
        return IwperfError::DeviceRemoved(format!(
            "DeviceRemoval; work requests flushed ({:?} on QP {})",
            wc.opcode, wc.qp_num
        ));
    }
    if wc.status == WcStatus::WrFlushErr {
        return IwperfError::Connection(format!(
            "QP {} flushed: the connection ended{}",
            wc.qp_num,
            if status.disconnected() > 0 {
                " (peer disconnected)"
            } else {
                ""
            }
        ));
    }
    IwperfError::Connection(format!(
        "work completion {} on QP {} ({:?}, vendor_err {:#x})",
        wc.status.ibv_name(),
        wc.qp_num,
        wc.opcode,
        wc.vendor_err
    ))
}

fn removed_err() -> IwperfError {
    IwperfError::DeviceRemoved("DeviceRemoval during the run".into())
}

/// A failed poll (soft device: `CQ ... overflowed: N completions lost`) ends the run,
/// with this side's WR counts so far.
fn poll_err(e: impl std::fmt::Display, ledger: &WrLedger) -> IwperfError {
    IwperfError::Connection(format!("poll CQ: {e}; WRs: {}", ledger.counts()))
}

/// Polls up to `wcs.len()` completions; any in error ends the run ([`wc_error`]).
fn poll_ok<'w, C: CompletionQueue>(
    cq: &C,
    wcs: &'w mut [WorkCompletion],
    status: &CmStatus,
    ledger: &WrLedger,
) -> Result<&'w [WorkCompletion], IwperfError> {
    let n = poll_counted(cq, wcs, ledger)?;
    match wcs[..n].iter().find(|wc| !wc.is_success()) {
        Some(wc) => Err(wc_error(wc, status)),
        None => Ok(&wcs[..n]),
    }
}

/// Polls up to `wcs.len()` completions and counts them in `ledger`; how many.
fn poll_counted<C: CompletionQueue>(
    cq: &C,
    wcs: &mut [WorkCompletion],
    ledger: &WrLedger,
) -> Result<usize, IwperfError> {
    let n = cq.poll_into(wcs).map_err(|e| poll_err(e, ledger))?;
    ledger.completed(&wcs[..n]);
    Ok(n)
}

fn post_err(e: impl std::fmt::Display) -> IwperfError {
    IwperfError::Connection(format!("post: {e}"))
}

/// Reads the control message in control slot `slot` (or data slot) of `mr`.
fn read_ctrl<M: MemoryRegion>(mr: &M, offset: usize, len: u32) -> Result<Ctrl, IwperfError> {
    let mut b = vec![0u8; (len as usize).min(CTRL_SLOT.max(CTRL_LEN + 1))];
    mr.read(offset, &mut b)
        .map_err(|e| IwperfError::Connection(format!("read control message: {e}")))?;
    Ctrl::decode(&b).map_err(|e| IwperfError::Connection(e.to_string()))
}

fn repost_ctrl<P: Provider>(q: &QpBufs<P>, pos: usize, slot: u64) -> Result<(), IwperfError> {
    q.post_recv(RecvWr::new(
        wr_id(K_CTRL_RECV, pos, slot),
        vec![sge(&q.ctrl, slot * CTRL_SLOT as u64, CTRL_SLOT as u32)],
    ))
    .map_err(post_err)
}

/// The window of a QP's control messages: [`CTRL_SENDS`] outstanding, one in
/// `CTRL_SENDS / 2` signaled.
fn ctrl_window() -> SendWindow {
    SendWindow::new(CTRL_SENDS.into(), (CTRL_SENDS / 2).into())
}

/// Sends the control message `c` within the control window `win`; `Ok(false)` (nothing
/// posted) while the window is full: poll, then try again.
fn send_ctrl<P: Provider>(
    q: &QpBufs<P>,
    pos: usize,
    win: &mut SendWindow,
    c: Ctrl,
) -> Result<bool, ProviderError> {
    let Some((seq, signaled)) = win.take(false) else {
        return Ok(false);
    };
    let wr = SendWr::send_inline(
        wr_id(K_CTRL_SEND, pos, seq),
        c.encode_distinct(q.params.size as usize),
    );
    q.post_send(signaled_if(wr, signaled))?;
    Ok(true)
}

/// A send-queue WR `wr`, signaled if `signaled`.
fn signaled_if(wr: SendWr, signaled: bool) -> SendWr {
    if signaled {
        wr.with_flags(SendFlags::SIGNALED)
    } else {
        wr
    }
}

/// Index of `op` in [`Op::ALL`].
fn op_slot(op: Op) -> usize {
    Op::ALL.iter().position(|&o| o == op).unwrap_or(0)
}

/// Client state of one connection in a bandwidth run.
#[derive(Debug)]
struct ClientQp {
    /// The data WRs: `posted()` so far, `done()` (completed, in order).
    data: SendWindow,
    /// The control messages (`Done`).
    ctrl: SendWindow,
    credits: u64,
    last_posted: bool,
    done_sent: bool,
    end: Option<Instant>,
    ack: Option<(VerifyStatus, u64)>,
    local_mismatches: u64,
}

/// Runs the client side of a bandwidth test over every connection of `side` at once
/// (one thread, one CQ) and returns one result per operation (in [`Op::ALL`] order),
/// and the error that ended the run early, if any (then the results are partial).
pub fn client_bandwidth<P: Provider>(
    side: &mut Side<P>,
    status: &CmStatus,
    length: RunLength,
    progress: &mut dyn FnMut(&Progress),
) -> (Vec<BwResult>, Option<IwperfError>) {
    let mut st: Vec<ClientQp> = side
        .qps
        .iter()
        .map(|q| {
            let depth = u64::from(q.window);
            let limit = if q.params.op == Op::Read {
                depth.min(u64::from(q.ord.max(1)))
            } else {
                depth
            };
            // Every WR signaled when verifying (each is checked as it completes),
            // otherwise one in eight of the window.
            let every = if q.params.verify { 1 } else { limit / 8 };
            ClientQp {
                data: SendWindow::new(limit, every),
                ctrl: ctrl_window(),
                credits: u64::from(q.accept.credits),
                last_posted: false,
                done_sent: false,
                end: None,
                ack: None,
                local_mismatches: 0,
            }
        })
        .collect();
    let start = Instant::now();
    let mut peak = [0.0f64; 3];
    let err = client_bw_loop(side, status, length, progress, &mut st, start, &mut peak).err();
    let now = Instant::now();
    let results = Op::ALL
        .into_iter()
        .filter_map(|op| {
            let mine: Vec<(&QpBufs<P>, &ClientQp)> = side
                .qps
                .iter()
                .zip(&st)
                .filter(|(q, _)| q.params.op == op)
                .collect();
            let first = mine.first()?;
            let size = first.0.params.size;
            let iterations: u64 = mine.iter().map(|(_, s)| s.data.done()).sum();
            let end = mine
                .iter()
                .map(|(_, s)| s.end.unwrap_or(now))
                .max()
                .unwrap_or(now);
            let seconds = end.duration_since(start).as_secs_f64();
            let bytes = iterations * u64::from(size);
            let verify_on = first.0.params.verify;
            let mismatches: u64 = mine
                .iter()
                .map(|(_, s)| s.local_mismatches + s.ack.map_or(0, |a| a.1))
                .sum();
            let failed = mismatches > 0
                || mine
                    .iter()
                    .any(|(_, s)| matches!(s.ack, Some((VerifyStatus::Failed, _))));
            let avg = gbps(bytes, seconds);
            Some(BwResult {
                op,
                size,
                qps: mine.len(),
                iterations,
                bytes,
                seconds,
                gbps: avg,
                peak_gbps: peak[op_slot(op)].max(avg),
                mpps: if seconds > 0.0 {
                    iterations as f64 / seconds / 1e6
                } else {
                    0.0
                },
                verify: match (verify_on, failed) {
                    (false, _) => VerifyStatus::Off,
                    (true, false) => VerifyStatus::Passed,
                    (true, true) => VerifyStatus::Failed,
                },
                mismatches,
                partial: err.is_some(),
            })
        })
        .collect();
    (results, err)
}

fn client_bw_loop<P: Provider>(
    side: &mut Side<P>,
    status: &CmStatus,
    length: RunLength,
    progress: &mut dyn FnMut(&Progress),
    st: &mut [ClientQp],
    start: Instant,
    peak: &mut [f64; 3],
) -> Result<(), IwperfError> {
    let Side {
        cq,
        qps,
        tuning,
        ledger,
        ..
    } = side;
    let cq = cq.as_ref().expect("CQ made with the first QP");
    let (iters, until) = match length {
        RunLength::Iters(n) => (n.max(1), None),
        RunLength::Time(d) => (u64::MAX, Some(start + d)),
    };
    let mut wcs = vec![WorkCompletion::new(0, WcStatus::Success, verbs::WcOpcode::Send, 0); 64];
    let mut idle = Idle::new(tuning.spin, tuning.nap);
    let mut batch: Vec<SendWr> = Vec::with_capacity(64);
    // `--verify` of Reads: one read-back buffer for the whole run.
    let mut got = Vec::new();
    let mut last_report = start;
    let mut report_bytes = 0u64;
    let mut last_sample = start;
    let mut sample_bytes = [0u64; 3];
    // The last time anything moved (a WR posted, a completion); a run with WRs in
    // flight and nothing moving for STALL_LIMIT ends.
    let mut last_moved = start;
    loop {
        let now = Instant::now();
        check_interrupted()?;
        if status.removed() {
            return Err(removed_err());
        }
        let time_up = until.is_some_and(|u| now >= u);
        let mut moved = false;
        // Post data WRs.
        for (pos, (q, s)) in qps.iter_mut().zip(st.iter_mut()).enumerate() {
            if s.last_posted {
                continue;
            }
            batch.clear();
            let size = q.params.size;
            // Within the window: a full one waits for the completions polled below.
            while (q.params.op != Op::Send || s.credits > 1) && !s.last_posted {
                let last = s.data.posted() + 1 >= iters || time_up;
                let Some((i, signaled)) = s.data.take(last) else {
                    break;
                };
                let slot = (i % u64::from(q.slots)) * u64::from(q.slot_len);
                let rslot = (i % u64::from(q.accept.slots)) * u64::from(q.accept.slot_len);
                if q.params.verify && q.params.op != Op::Read && size >= 8 {
                    q.data
                        .write(slot as usize, &i.to_le_bytes())
                        .map_err(|e| IwperfError::Setup(format!("stamp: {e}")))?;
                }
                let sge = vec![sge(&q.data, slot, size)];
                let id = wr_id(K_DATA_SEND, pos, i);
                let rkey = verbs::Stag::from_raw(q.accept.mr.rkey);
                let wr = match q.params.op {
                    Op::Write => SendWr::rdma_write(id, sge, q.accept.mr.iova + rslot, rkey),
                    Op::Read => SendWr::rdma_read(id, sge, q.accept.mr.iova + rslot, rkey),
                    Op::Send => {
                        s.credits -= 1;
                        SendWr::send(id, sge)
                    }
                };
                batch.push(signaled_if(wr, signaled));
                s.last_posted = last;
            }
            if !batch.is_empty() {
                q.post_sends(batch.drain(..)).map_err(post_err)?;
                moved = true;
            }
        }
        // Completions.
        for wc in poll_ok(cq, &mut wcs, status, ledger)? {
            moved = true;
            let pos = wr_pos(wc.wr_id);
            let (Some(q), Some(s)) = (qps.get(pos), st.get_mut(pos)) else {
                continue;
            };
            match wr_kind(wc.wr_id) {
                K_DATA_SEND => {
                    let seq = wr_n(wc.wr_id);
                    let newly = s.data.completed(seq);
                    sample_bytes[op_slot(q.params.op)] += newly * u64::from(q.params.size);
                    report_bytes += newly * u64::from(q.params.size);
                    if q.params.verify && q.params.op == Op::Read && !q.patterns.is_empty() {
                        let slot = (seq % u64::from(q.slots)) as usize * q.slot_len as usize;
                        let want = &q.patterns[(seq % q.patterns.len() as u64) as usize];
                        got.resize(want.len(), 0);
                        q.data
                            .read(slot, &mut got)
                            .map_err(|e| IwperfError::Setup(format!("read back: {e}")))?;
                        if &got != want {
                            s.local_mismatches += 1;
                        }
                    }
                    if s.last_posted && s.data.outstanding() == 0 {
                        s.end = Some(Instant::now());
                    }
                }
                K_CTRL_SEND => {
                    s.ctrl.completed(wr_n(wc.wr_id));
                }
                K_CTRL_RECV => {
                    let slot = wr_n(wc.wr_id);
                    match read_ctrl(&q.ctrl, slot as usize * CTRL_SLOT, wc.byte_len)? {
                        Ctrl::Credit(c) => s.credits += u64::from(c),
                        Ctrl::DoneAck {
                            verify, mismatches, ..
                        } => s.ack = Some((verify, mismatches)),
                        Ctrl::Done { .. } => {
                            return Err(IwperfError::Connection(
                                "unexpected Done from the server".into(),
                            ))
                        }
                    }
                    repost_ctrl(q, pos, slot)?;
                }
                _ => {}
            }
        }
        // Done messages.
        for (pos, (q, s)) in qps.iter().zip(st.iter_mut()).enumerate() {
            if s.last_posted && s.data.outstanding() == 0 && !s.done_sent {
                if q.params.op == Op::Send && s.credits == 0 {
                    continue;
                }
                let wrs = s.data.posted();
                let c = Ctrl::Done {
                    wrs,
                    bytes: wrs * u64::from(q.params.size),
                };
                if send_ctrl(q, pos, &mut s.ctrl, c).map_err(post_err)? {
                    if q.params.op == Op::Send {
                        s.credits -= 1;
                    }
                    s.done_sent = true;
                    moved = true;
                }
            }
        }
        if st.iter().all(|s| s.ack.is_some()) {
            return Ok(());
        }
        let now = Instant::now();
        let dt = now.duration_since(last_sample);
        if dt >= Duration::from_millis(100) {
            for (p, b) in peak.iter_mut().zip(sample_bytes.iter_mut()) {
                *p = p.max(gbps(*b, dt.as_secs_f64()));
                *b = 0;
            }
            last_sample = now;
        }
        let dr = now.duration_since(last_report);
        if dr >= Duration::from_secs(1) {
            let total: u64 = qps
                .iter()
                .zip(st.iter())
                .map(|(q, s)| s.data.done() * u64::from(q.params.size))
                .sum();
            progress(&Progress {
                seconds: now.duration_since(start).as_secs_f64(),
                amount: total,
                gbps: gbps(report_bytes, dr.as_secs_f64()),
            });
            report_bytes = 0;
            last_report = now;
        }
        if moved {
            last_moved = now;
            idle.progressed();
        } else {
            if now.duration_since(last_moved) >= STALL_LIMIT {
                let in_flight: u64 = st.iter().map(|s| s.data.outstanding()).sum();
                return Err(IwperfError::Connection(format!(
                    "no completion in {} s with {in_flight} WRs in flight: the peer or the path stopped answering",
                    STALL_LIMIT.as_secs()
                )));
            }
            idle.wait(Some(cq));
        }
    }
}

/// How long a client's bandwidth run waits with nothing moving (no WR posted, no
/// completion) before it gives up: a peer killed without a FIN (a crashed soft device
/// sends none) leaves the transport retransmitting for minutes (kernel TCP's
/// `tcp_retries2`: about 15). Long enough for the siw VM under emulation, whose
/// 64 KiB Writes took up to 2 s each on a loaded host.
pub const STALL_LIMIT: Duration = Duration::from_secs(30);

/// What the server saw in a bandwidth run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ServerReport {
    /// Connections served.
    pub connections: usize,
    /// Data messages received (Send tests) over all connections.
    pub messages: u64,
    /// Data WRs the clients reported in their `Done`.
    pub client_wrs: u64,
    /// The outcome of the checks.
    pub verify: VerifyStatus,
    /// Messages or slots that did not match.
    pub mismatches: u64,
    /// Messages or slots checked.
    pub checked: u64,
}

#[derive(Debug)]
struct ServerQp {
    /// The control messages (`Credit`, `DoneAck`).
    ctrl: SendWindow,
    received: u64,
    reposts: Vec<RecvWr>,
    unreported: u32,
    done: Option<u64>,
    acked: bool,
    mismatches: u64,
    checked: u64,
    /// Why this connection failed (a completion in error, a malformed control message,
    /// a refused post): it is then left alone and the others go on (a peer that breaks
    /// its own connection, e.g. a hostile one that joined the test, cannot end the
    /// others' runs).
    failed: Option<IwperfError>,
}

impl ServerQp {
    /// A connection's state; a `retired` one (gone before the test started) is done
    /// from the start.
    fn new(retired: bool) -> ServerQp {
        ServerQp {
            ctrl: ctrl_window(),
            received: 0,
            reposts: Vec::new(),
            unreported: 0,
            done: None,
            acked: retired,
            mismatches: 0,
            checked: 0,
            failed: None,
        }
    }

    /// Marks the connection of `q` failed with `e` (done with, as far as the loop goes).
    fn fail<P: Provider>(&mut self, q: &QpBufs<P>, e: IwperfError) {
        tracing::warn!(
            index = q.params.index,
            "connection {} failed: {e}; the others go on",
            q.params.index
        );
        self.failed = Some(IwperfError::Connection(format!(
            "connection {} of the test failed: {e}",
            q.params.index
        )));
        self.acked = true;
    }
}

/// Checks a message or slot against its pattern with the sequence number `seq` in the
/// first 8 bytes (when `size >= 8`).
fn matches(got: &[u8], pattern: &[u8], seq: u64) -> bool {
    if got.len() != pattern.len() {
        return false;
    }
    if got.len() >= 8 {
        got[..8] == seq.to_le_bytes() && got[8..] == pattern[8..]
    } else {
        got == pattern
    }
}

/// Server, Write tests: after `Done { wrs: n }`, checks that each slot holds the last
/// Write aimed at it. Returns (mismatches, slots checked).
fn check_write_slots<P: Provider>(q: &QpBufs<P>, n: u64) -> Result<(u64, u64), IwperfError> {
    check_slots(&q.data, q.slots, q.slot_len, &q.patterns, n)
}

/// [`check_write_slots`] over `slots` slots of `slot_len` bytes in `data`, each
/// expected to hold a pattern of `patterns` (the writer's slot `i % patterns.len()`)
/// stamped with `i`, the last of the `n` Writes aimed at it.
fn check_slots<M: MemoryRegion>(
    data: &M,
    slots: u32,
    slot_len: u32,
    patterns: &[Vec<u8>],
    n: u64,
) -> Result<(u64, u64), IwperfError> {
    let s = u64::from(slots);
    let src_slots = patterns.len() as u64;
    if src_slots == 0 || s == 0 {
        return Ok((0, 0));
    }
    let (mut bad, mut checked) = (0, 0);
    let mut got = vec![0u8; patterns[0].len()];
    for k in 0..s.min(n) {
        let last = k + s * ((n - 1 - k) / s);
        data.read((k * u64::from(slot_len)) as usize, &mut got)
            .map_err(|e| IwperfError::Setup(format!("read slot: {e}")))?;
        checked += 1;
        if !matches(&got, &patterns[(last % src_slots) as usize], last) {
            bad += 1;
        }
    }
    Ok((bad, checked))
}

/// Runs the server side of a bandwidth test until every connection's `Done` was
/// answered or the connection failed (a failed connection ends only itself: the others
/// run on). Returns what it saw, and the error that ended it early or the first
/// connection's failure, if any (a removed device ends it at once).
pub fn server_bandwidth<P: Provider>(
    side: &Side<P>,
    status: &CmStatus,
) -> (ServerReport, Option<IwperfError>) {
    // Retired connections (gone before the test started) are done from the start.
    let mut st: Vec<ServerQp> = side.qps.iter().map(|q| ServerQp::new(q.retired)).collect();
    let err = server_bw_loop(side, status, &mut st).err();
    let verify_on = side.qps.iter().any(|q| q.params.verify);
    let mismatches: u64 = st.iter().map(|s| s.mismatches).sum();
    let report = ServerReport {
        connections: side.qps.iter().filter(|q| !q.retired).count(),
        messages: st.iter().map(|s| s.received).sum(),
        client_wrs: st.iter().filter_map(|s| s.done).sum(),
        verify: match (verify_on, mismatches > 0) {
            (false, _) => VerifyStatus::Off,
            (true, false) => VerifyStatus::Passed,
            (true, true) => VerifyStatus::Failed,
        },
        mismatches,
        checked: st.iter().map(|s| s.checked).sum(),
    };
    (report, err)
}

fn server_bw_loop<P: Provider>(
    side: &Side<P>,
    status: &CmStatus,
    st: &mut [ServerQp],
) -> Result<(), IwperfError> {
    let cq = side.cq();
    let ledger = &*side.ledger;
    let mut wcs = vec![WorkCompletion::new(0, WcStatus::Success, verbs::WcOpcode::Send, 0); 64];
    let mut idle = Idle::new(side.tuning.spin, side.tuning.nap);
    let mut buf = Vec::new();
    loop {
        check_interrupted()?;
        if status.removed() {
            return Err(removed_err());
        }
        let mut moved = false;
        let n = poll_counted(cq, &mut wcs, ledger)?;
        for wc in &wcs[..n] {
            moved = true;
            let pos = wr_pos(wc.wr_id);
            let (Some(q), Some(s)) = (side.qps.get(pos), st.get_mut(pos)) else {
                continue;
            };
            if s.failed.is_some() || q.retired || wc.qp_num != q.qp.qp_num() {
                continue;
            }
            if !wc.is_success() {
                match wc_error(wc, status) {
                    e @ IwperfError::DeviceRemoved(_) => return Err(e),
                    e => s.fail(q, e),
                }
                continue;
            }
            match wr_kind(wc.wr_id) {
                K_DATA_RECV => {
                    let r = wr_n(wc.wr_id);
                    let slot = r % u64::from(q.slots);
                    let off = (slot * u64::from(q.slot_len)) as usize;
                    if wc.byte_len != q.params.size {
                        // A control message in a data slot: the client's Done.
                        match read_ctrl(&q.data, off, wc.byte_len) {
                            Ok(Ctrl::Done { wrs, .. }) => s.done = Some(wrs),
                            Ok(_) => {}
                            Err(e) => s.fail(q, e),
                        }
                        continue;
                    }
                    if q.params.verify && !q.patterns.is_empty() {
                        buf.resize(q.params.size as usize, 0);
                        q.data
                            .read(off, &mut buf)
                            .map_err(|e| IwperfError::Setup(format!("read slot: {e}")))?;
                        let seq = s.received;
                        s.checked += 1;
                        if !matches(
                            &buf,
                            &q.patterns[(seq % q.patterns.len() as u64) as usize],
                            seq,
                        ) {
                            s.mismatches += 1;
                        }
                    }
                    s.received += 1;
                    s.reposts.push(RecvWr::new(
                        wc.wr_id,
                        vec![sge(&q.data, slot * u64::from(q.slot_len), q.slot_len)],
                    ));
                }
                K_CTRL_SEND => {
                    s.ctrl.completed(wr_n(wc.wr_id));
                }
                K_CTRL_RECV => {
                    let slot = wr_n(wc.wr_id);
                    match read_ctrl(&q.ctrl, slot as usize * CTRL_SLOT, wc.byte_len) {
                        Ok(Ctrl::Done { wrs, .. }) => s.done = Some(wrs),
                        Ok(_) => {}
                        Err(e) => {
                            s.fail(q, e);
                            continue;
                        }
                    }
                    if let Err(e) = repost_ctrl(q, pos, slot) {
                        s.fail(q, e);
                    }
                }
                _ => {}
            }
        }
        for (pos, (q, s)) in side.qps.iter().zip(st.iter_mut()).enumerate() {
            if s.failed.is_some() || q.retired {
                continue;
            }
            if !s.reposts.is_empty() {
                // One doorbell for the batch.
                s.unreported += s.reposts.len() as u32;
                if let Err(e) = q.post_recvs(s.reposts.drain(..)) {
                    s.fail(q, post_err(e));
                    continue;
                }
            }
            let batch = (q.data_recvs / 4).max(1);
            if q.params.op == Op::Send && s.unreported >= batch && s.done.is_none() {
                // A full control window waits for its signaled completion (polled
                // above); the credits go out with the next Credit.
                match send_ctrl(q, pos, &mut s.ctrl, Ctrl::Credit(s.unreported)) {
                    Ok(true) => {
                        s.unreported = 0;
                        moved = true;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        s.fail(q, post_err(e));
                        continue;
                    }
                }
            }
            if let (Some(wrs), false, true) = (s.done, s.acked, s.ctrl.has_room()) {
                match q.params.op {
                    Op::Write if q.params.verify => {
                        let (bad, checked) = check_write_slots(q, wrs)?;
                        s.mismatches += bad;
                        s.checked += checked;
                    }
                    Op::Send if q.params.verify && s.received != wrs => {
                        s.mismatches += wrs.abs_diff(s.received);
                    }
                    _ => {}
                }
                let verify = match (q.params.verify, s.mismatches) {
                    (false, _) => VerifyStatus::Off,
                    (true, 0) => VerifyStatus::Passed,
                    _ => VerifyStatus::Failed,
                };
                let ack = Ctrl::DoneAck {
                    verify,
                    mismatches: s.mismatches,
                    checked: s.checked,
                };
                if let Err(e) = send_ctrl(q, pos, &mut s.ctrl, ack) {
                    s.fail(q, post_err(e));
                    continue;
                }
                s.acked = true;
                moved = true;
            }
        }
        if st.iter().all(|s| s.acked) {
            // The first connection that failed, if any, after the others completed.
            return match st.iter_mut().find_map(|s| s.failed.take()) {
                Some(e) => Err(e),
                None => Ok(()),
            };
        }
        if moved {
            idle.progressed();
        } else {
            idle.wait(Some(cq));
        }
    }
}

/// Runs the client side of a latency test on the first connection of `side`: one
/// message at a time (Send: answered by a Send; Write: answered by a Write, both
/// detected by polling the last byte of the buffer; Read: one Read). Returns the
/// statistics (half round trips for Send and Write, whole ones for Read, as perftest),
/// and the error that ended it early, if any.
pub fn client_latency<P: Provider>(
    side: &mut Side<P>,
    status: &CmStatus,
    length: RunLength,
    progress: &mut dyn FnMut(&Progress),
) -> (Option<LatStats>, Option<IwperfError>) {
    let mut samples = Vec::new();
    let err = client_lat_loop(side, status, length, progress, &mut samples).err();
    let q = &side.qps[0];
    let mut stats = LatStats::from_samples(q.params.op, q.params.size, &samples);
    if let Some(s) = stats.as_mut() {
        s.partial = err.is_some();
    }
    (stats, err)
}

fn lat_payload<P: Provider>(q: &QpBufs<P>, v: u8) -> Vec<u8> {
    let mut p = vec![0x5a; q.params.size as usize];
    if let Some(last) = p.last_mut() {
        *last = v;
    }
    p
}

fn client_lat_loop<P: Provider>(
    side: &mut Side<P>,
    status: &CmStatus,
    length: RunLength,
    progress: &mut dyn FnMut(&Progress),
    samples: &mut Vec<u64>,
) -> Result<(), IwperfError> {
    let max_inline = side.max_inline();
    let Side {
        cq,
        qps,
        tuning,
        ledger,
        ..
    } = side;
    let cq = cq.as_ref().expect("CQ made with the first QP");
    let q = &mut qps[0];
    let size = q.params.size;
    let inline = size <= max_inline.min(q.qp.cap().max_inline_data);
    let start = Instant::now();
    let (iters, until) = match length {
        RunLength::Iters(n) => (n.max(1), None),
        RunLength::Time(d) => (u64::MAX, Some(start + d)),
    };
    samples.reserve(iters.min(1 << 20) as usize);
    let mut wcs = vec![WorkCompletion::new(0, WcStatus::Success, verbs::WcOpcode::Send, 0); 16];
    let mut idle = Idle::new(tuning.lat_spin, Duration::ZERO);
    let mut last_report = start;
    let remote_in = q.accept.mr.iova + u64::from(q.accept.slot_len);
    let rkey = verbs::Stag::from_raw(q.accept.mr.rkey);
    let my_in = q.slot_len as usize;
    let mut byte = [0u8; 1];
    // One WR per round trip; a Send's or Write's slot is free again once a signaled
    // one's completion is polled (every Read is signaled: its completion is the answer).
    let w = u64::from(q.window);
    let mut win = SendWindow::new(w, w / 2);
    let mut i = 0u64;
    while i < iters && until.is_none_or(|u| Instant::now() < u) {
        let v = (i % 255 + 1) as u8;
        let t0 = Instant::now();
        let Some((seq, signaled)) = win.take(q.params.op == Op::Read) else {
            // Each round trip below waits for room for the next.
            return Err(IwperfError::Connection("the send queue is full".into()));
        };
        let id = wr_id(K_DATA_SEND, 0, seq);
        let wr = match q.params.op {
            Op::Send if inline => SendWr::send_inline(id, lat_payload(q, v)),
            Op::Send => SendWr::send(id, vec![sge(&q.data, 0, size)]),
            Op::Write => {
                let p = lat_payload(q, v);
                if inline {
                    SendWr::rdma_write_inline(id, p, remote_in, rkey)
                } else {
                    q.data
                        .write(0, &p)
                        .map_err(|e| IwperfError::Setup(format!("fill: {e}")))?;
                    SendWr::rdma_write(id, vec![sge(&q.data, 0, size)], remote_in, rkey)
                }
            }
            Op::Read => SendWr::rdma_read(
                id,
                vec![sge(&q.data, u64::from(q.slot_len), size)],
                q.accept.mr.iova,
                rkey,
            ),
        };
        q.post_send(signaled_if(wr, signaled)).map_err(post_err)?;
        // Wait for the answer, then for room in the window for the next WR.
        idle.progressed();
        let mut rtt = None;
        while rtt.is_none() || !win.has_room() {
            check_interrupted()?;
            if status.removed() {
                return Err(IwperfError::DeviceRemoved(
                    "DeviceRemoval during the run".into(),
                ));
            }
            if t0.elapsed() > LAT_ANSWER_TIMEOUT {
                return Err(IwperfError::Connection(match rtt {
                    None => format!(
                        "no answer to round trip {i} in {} s",
                        LAT_ANSWER_TIMEOUT.as_secs()
                    ),
                    Some(_) => format!(
                        "no send completion to free the send queue in {} s",
                        LAT_ANSWER_TIMEOUT.as_secs()
                    ),
                }));
            }
            let mut answered = false;
            for wc in poll_ok(cq, &mut wcs, status, ledger)? {
                match wr_kind(wc.wr_id) {
                    K_DATA_RECV if q.params.op == Op::Send => {
                        answered = true;
                        q.post_recv(RecvWr::new(
                            wc.wr_id,
                            vec![sge(&q.data, u64::from(q.slot_len), q.slot_len)],
                        ))
                        .map_err(post_err)?;
                    }
                    K_DATA_SEND => {
                        win.completed(wr_n(wc.wr_id));
                        answered |= q.params.op == Op::Read;
                    }
                    _ => {}
                }
            }
            if q.params.op == Op::Write && rtt.is_none() {
                q.data
                    .read(my_in + size as usize - 1, &mut byte)
                    .map_err(|e| IwperfError::Setup(format!("poll byte: {e}")))?;
                answered = byte[0] == v;
            }
            if answered && rtt.is_none() {
                rtt = Some(t0.elapsed().as_nanos() as u64);
                continue;
            }
            idle.wait(if q.params.op == Op::Write && rtt.is_none() {
                None
            } else {
                Some(cq)
            });
        }
        let rtt = rtt.unwrap_or_default();
        samples.push(if q.params.op == Op::Read {
            rtt
        } else {
            rtt / 2
        });
        i += 1;
        let now = Instant::now();
        if now.duration_since(last_report) >= Duration::from_secs(1) {
            progress(&Progress {
                seconds: now.duration_since(start).as_secs_f64(),
                amount: i,
                gbps: 0.0,
            });
            last_report = now;
        }
    }
    Ok(())
}

/// Runs the server side of a latency test: answers each Send with a Send and each
/// Write with a Write (Reads need nothing), until the client disconnects. Returns the
/// round trips answered, or the error that ended it (a removal, or a failure other than
/// the client's disconnect).
pub fn server_latency<P: Provider>(
    side: &mut Side<P>,
    status: &CmStatus,
) -> Result<u64, IwperfError> {
    let max_inline = side.max_inline();
    let Side {
        cq,
        qps,
        tuning,
        ledger,
        ..
    } = side;
    let cq = cq.as_ref().expect("CQ made with the first QP");
    let q = qps
        .iter_mut()
        .find(|q| !q.retired)
        .ok_or_else(|| IwperfError::Connection("no connection to serve".into()))?;
    // Disconnects of connections retired before the test started do not count.
    let disconnected_before = status.disconnected();
    let size = q.params.size;
    let inline = size <= max_inline.min(q.qp.cap().max_inline_data);
    let mut wcs = vec![WorkCompletion::new(0, WcStatus::Success, verbs::WcOpcode::Send, 0); 16];
    let mut idle = Idle::new(tuning.lat_spin, Duration::ZERO);
    let remote_in = q.params.client_mr.iova + u64::from(size);
    let rkey = verbs::Stag::from_raw(q.params.client_mr.rkey);
    let my_in = q.slot_len as usize + size as usize - 1;
    let mut byte = [0u8; 1];
    let mut answered = 0u64;
    // Sends received and not answered yet (the window was full).
    let mut due = 0u64;
    let w = u64::from(q.window);
    let mut win = SendWindow::new(w, w / 2);
    let mut flushed_at: Option<Instant> = None;
    loop {
        check_interrupted()?;
        if status.removed() {
            return Err(removed_err());
        }
        if status.disconnected() > disconnected_before {
            return Ok(answered);
        }
        if let Some(t) = flushed_at {
            if t.elapsed() > Duration::from_secs(2) {
                return Err(IwperfError::Connection(
                    "QP flushed without a disconnect".into(),
                ));
            }
        }
        let mut moved = false;
        let n = poll_counted(cq, &mut wcs, ledger)?;
        for wc in &wcs[..n] {
            moved = true;
            if wc.qp_num != q.qp.qp_num() {
                continue;
            }
            if !wc.is_success() {
                if wc.status == WcStatus::WrFlushErr {
                    flushed_at.get_or_insert_with(Instant::now);
                    continue;
                }
                return Err(wc_error(wc, status));
            }
            match wr_kind(wc.wr_id) {
                K_DATA_SEND => {
                    win.completed(wr_n(wc.wr_id));
                }
                K_DATA_RECV if q.params.op == Op::Send => {
                    q.post_recv(RecvWr::new(
                        wc.wr_id,
                        vec![sge(&q.data, u64::from(q.slot_len), q.slot_len)],
                    ))
                    .map_err(post_err)?;
                    due += 1;
                }
                _ => {}
            }
        }
        // Answers, within the window (a full one waits for the next completion).
        while due > 0 {
            let Some((seq, signaled)) = win.take(false) else {
                break;
            };
            let id = wr_id(K_DATA_SEND, 0, seq);
            let wr = if inline {
                SendWr::send_inline(id, vec![0xa5; size as usize])
            } else {
                SendWr::send(id, vec![sge(&q.data, 0, size)])
            };
            q.post_send(signaled_if(wr, signaled)).map_err(post_err)?;
            due -= 1;
            answered += 1;
        }
        if q.params.op == Op::Write {
            let v = (answered % 255 + 1) as u8;
            q.data
                .read(my_in, &mut byte)
                .map_err(|e| IwperfError::Setup(format!("poll byte: {e}")))?;
            // Answered once there is room in the window (the byte stays until then).
            let slot = if byte[0] == v { win.take(false) } else { None };
            if let Some((seq, signaled)) = slot {
                let p = lat_payload(q, v);
                let id = wr_id(K_DATA_SEND, 0, seq);
                let wr = if inline {
                    SendWr::rdma_write_inline(id, p, remote_in, rkey)
                } else {
                    q.data
                        .write(0, &p)
                        .map_err(|e| IwperfError::Setup(format!("fill: {e}")))?;
                    SendWr::rdma_write(id, vec![sge(&q.data, 0, size)], remote_in, rkey)
                };
                q.post_send(signaled_if(wr, signaled)).map_err(post_err)?;
                answered += 1;
                moved = true;
            }
        }
        if moved {
            idle.progressed();
        } else {
            idle.wait(if q.params.op == Op::Write {
                None
            } else {
                Some(cq)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_ids_round_trip() {
        let id = wr_id(K_CTRL_RECV, 63, 12345);
        assert_eq!(
            (wr_kind(id), wr_pos(id), wr_n(id)),
            (K_CTRL_RECV, 63, 12345)
        );
        let id = wr_id(K_DATA_SEND, 0, (1 << N_BITS) - 1);
        assert_eq!(
            (wr_kind(id), wr_pos(id), wr_n(id)),
            (K_DATA_SEND, 0, (1 << N_BITS) - 1)
        );
    }

    #[test]
    fn the_cq_holds_every_connection_whatever_op_comes_first() {
        use softiwarp::link::{MemoryConfig, MemoryLink};
        use softiwarp::{Device, DeviceConfig, LinkConfig};
        let (a, _b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let dev = Arc::new(
            Device::open(DeviceConfig::new(
                "cqsz",
                LinkConfig::memory(a),
                std::net::Ipv4Addr::new(10, 9, 3, 1),
                24,
            ))
            .unwrap(),
        );
        // `--op write,send --qps 2`: the Write connection's request came first.
        let write = TestParams {
            op: Op::Write,
            mode: Mode::Bandwidth,
            verify: true,
            size: 4096,
            qps: 2,
            index: 0,
            tx_depth: 16,
            client_mr: MrInfo::default(),
            rd_depth: 0,
        };
        let dev =
            softiwarp::cm::provider::SoftDev(softiwarp::cm::rdmacm::SoftDevice::new(dev).unwrap());
        let mut side: Side<softiwarp::cm::provider::SoftCm<'_>> =
            Side::new(Role::Server, Tuning::default());
        let send_recvs = side
            .data_slots(&TestParams {
                op: Op::Send,
                ..write
            })
            .2;
        assert!(send_recvs >= 64, "{send_recvs}");
        let (_, cq, _) = side.qp_resources(&dev, &write).unwrap();
        // Each connection's send queue and receives, the Send one's included.
        assert_eq!(
            cq.0.capacity(),
            2 * (16 + CTRL_SENDS + send_recvs + CTRL_RECVS) as usize
        );
        side.release();
    }

    #[test]
    fn the_cq_holds_every_window_and_receive_queue_or_the_windows_shrink_to_fit() {
        // Two connections of 64 data WRs, 16 control messages and 16 receives each.
        assert_eq!(cq_size(64, 16, 2, 1 << 22).unwrap(), (192, 64));
        // A device with a smaller CQ: each connection's share keeps its receives and
        // control messages, the data window gets the rest.
        assert_eq!(cq_size(64, 16, 2, 100).unwrap(), (100, 18));
        assert_eq!(cq_size(64, 16, 2, 66).unwrap(), (66, 1));
        // Not even one data WR beside them: refused, with what it would take.
        let e = cq_size(64, 16, 2, 65).unwrap_err().to_string();
        assert!(
            e.contains("at most 65 completions") && e.contains("need 66"),
            "{e}"
        );
        // Whatever the numbers (a receive depth from the command line), no overflow.
        assert_eq!(cq_size(1, u32::MAX, 1, 1 << 22).unwrap_err().exit_code(), 1);
    }

    #[test]
    fn slot_patterns_differ_and_repeat() {
        assert_eq!(slot_pattern(1, 2, 100), slot_pattern(1, 2, 100));
        assert_ne!(slot_pattern(1, 2, 100), slot_pattern(1, 3, 100));
        assert_ne!(slot_pattern(1, 2, 100), slot_pattern(2, 2, 100));
        assert_eq!(&slot_pattern(0, 0, 100)[..10], &slot_pattern(0, 0, 10)[..]);
    }

    #[test]
    fn write_slot_check_finds_corrupt_and_stale_slots() {
        use softiwarp::link::{MemoryConfig, MemoryLink};
        use softiwarp::{Device, DeviceConfig, LinkConfig};
        let (a, _b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let dev = Device::open(DeviceConfig::new(
            "chk",
            LinkConfig::memory(a),
            std::net::Ipv4Addr::new(10, 9, 2, 1),
            24,
        ))
        .unwrap();
        let pd = dev.alloc_pd().unwrap();
        let (slots, len, n) = (16u32, 100usize, 37u64);
        let mr = softiwarp::cm::provider::SoftMr(
            pd.reg_mr(
                u64::from(slots) * len as u64,
                0x1000,
                AccessFlags::LOCAL_WRITE,
            )
            .unwrap(),
        );
        let patterns: Vec<Vec<u8>> = (0..slots).map(|k| slot_pattern(3, k, len)).collect();
        // What 37 Writes from 16 source slots into 16 target slots leave behind.
        for i in 0..n {
            let mut m = patterns[(i % 16) as usize].clone();
            m[..8].copy_from_slice(&i.to_le_bytes());
            mr.0.write((i % 16) as usize * len, &m).unwrap();
        }
        assert_eq!(
            check_slots(&mr, slots, len as u32, &patterns, n).unwrap(),
            (0, 16)
        );
        // Told of only 5 Writes: 5 slots are checked, and they hold later Writes.
        assert_eq!(
            check_slots(&mr, slots, len as u32, &patterns, 5).unwrap(),
            (5, 5)
        );
        // One flipped payload byte.
        mr.0.write(3 * len + 50, &[!patterns[3][50]]).unwrap();
        assert_eq!(
            check_slots(&mr, slots, len as u32, &patterns, n).unwrap(),
            (1, 16)
        );
        // A stale slot: slot 4 still holds Write 20, not Write 36.
        let mut stale = patterns[4].clone();
        stale[..8].copy_from_slice(&20u64.to_le_bytes());
        mr.0.write(4 * len, &stale).unwrap();
        assert_eq!(
            check_slots(&mr, slots, len as u32, &patterns, n).unwrap(),
            (2, 16)
        );
    }

    #[test]
    fn stamped_messages_match_only_their_sequence() {
        let p = slot_pattern(0, 0, 64);
        let mut m = p.clone();
        m[..8].copy_from_slice(&7u64.to_le_bytes());
        assert!(matches(&m, &p, 7));
        assert!(!matches(&m, &p, 8));
        m[40] ^= 1;
        assert!(!matches(&m, &p, 7));
        // Short messages carry no sequence number.
        let s = slot_pattern(0, 0, 4);
        assert!(matches(&s, &s, 99));
        assert!(!matches(&s[..3], &s, 0));
    }
}
