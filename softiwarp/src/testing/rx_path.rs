//! The whole receive path under a hostile byte stream: one QP bound to a connection
//! after a real MPA exchange, fed arbitrary TCP payload from the peer, with the
//! invariants checked after each input ([`run`]). Used by the fuzz target
//! `fuzz/fuzz_targets/rx_path.rs` and the bounded proptest
//! `softiwarp/tests/qp/rx_path_fuzz.rs`.
//!
//! # What runs
//!
//! Two sans-IO [`MpaConn`]s, the device's and the peer's, exchange the MPA Request and
//! Reply in memory (CRC on: [`CrcPolicy::Wanted`] on both sides; Markers in both
//! directions when the input asks, RFC 5044 §5 and §7.1; IRD = ORD = 4). The device's
//! `MpaConn` is bound to a real `QpUlp` / `QpCore` (the binding the device's engine
//! uses, [`crate::rdmap::binding`]) around a [`QpEngine`], which reaches RTS in
//! [`Ulp::on_established`]. The glue between the two is the few lines of
//! `transport::conn::Conn` that do not touch the smoltcp socket, mirrored call for call
//! (this module cannot call them: they take a `tcp::Socket`):
//!
//! - receive (`Conn::rx_pass`): bytes go to [`MpaConn::handle_rx_in_place`] with the
//!   same in-place callback (a Terminate is never taken in place), what was not
//!   consumed is offered again later, then the MPA events are drained;
//! - MPA events (`Conn::on_mpa_event`): `Established` → [`Ulp::on_established`], a
//!   ULPDU → [`Ulp::on_ulpdu`] or, for a Terminate that parses,
//!   [`Ulp::on_terminate`] and the connection fails; an MPA error → the upper's queued
//!   Terminate ([`Ulp::poll_terminate`]), else, unless its stream already ended
//!   ([`Ulp::stream_ended`]), the LLP Terminate (`ErrorCause` of
//!   [`MpaError::terminate_cause`]), if one may be sent; then [`Ulp::on_error`];
//! - transmit (`Conn::tx`, `Conn::pull_from_upper`): [`Ulp::poll_terminate`] first
//!   (sent, then the connection fails), else [`Ulp::poll_ulpdu`] framed by
//!   [`MpaConn::frame_into`] or [`MpaConn::send_ulpdu`], in full operation or while a
//!   responder holds fewer than [`MAX_HELD_ULPDUS`] ULPDUs;
//! - the engine thread's abort of a connection whose QP went to Error by itself
//!   (`QpCore::orphaned`): [`Ulp::on_closed`]; an aborted connection (that, the peer's
//!   Terminate, an upper-layer error) writes nothing more (`Conn::tx` resets it first);
//! - the peer's FIN (mode 3, `Conn::service`): [`MpaConn::handle_tcp_closed`], then the
//!   final [`Ulp::on_closed`].
//!
//! Everything the device transmits is read back by the peer's `MpaConn` (its deframer
//! checks length, CRC and Markers), which is how Terminates are counted.
//!
//! # The device's resources
//!
//! One PD, CQs of [`CQ_DEPTH`], the QP with `sq_sig_all` (every send WR completes),
//! and five MRs of [`MR_LEN`] bytes, each filled with its own pattern:
//!
//! | index | MR | access | iova | may change |
//! |---|---|---|---|---|
//! | 0 | `write` | local + remote write | [`IOVA_WRITE`] | all of it |
//! | 1 | `read` | remote read | [`IOVA_READ`] | never |
//! | 2 | `fast` | fast-registered (`alloc_mr`, then a Fast Register WR: local + remote write, remote read, [`FR_LEN`] bytes); remotely invalidatable | [`IOVA_FAST`] | the first [`FR_LEN`] bytes |
//! | 3 | `local` | none (source of the device's own Send and Write) | [`IOVA_LOCAL`] | never |
//! | 4 | `recv` | local write: the receive buffers and the Read sink | [`IOVA_RECV`] | only the SGEs of [`RECV_SGES`] and [`READ_SINK`] |
//!
//! Posted once RTS is reached (as the verbs API allows): the receives of
//! [`RECV_SGES`] (wr_id 100..), and the send WRs 1: Fast Register of `fast`, 2: Send
//! of 32 bytes of `local`, 3: RDMA Read of [`READ_SINK`]`.1` bytes into the sink,
//! 4: RDMA Write of 32 bytes of `local`.
//!
//! # Input format
//!
//! - byte 0: bit 0 Markers; bit 1 the device is the MPA initiator (else the
//!   responder); bits 2-3 the mode: 0 raw, 1 framed, 2 mixed, 3 framed and then the
//!   peer's FIN (a graceful close, RFC 5044 §7.2); bits 4-7 the largest
//!   chunk, an index into [`CHUNKS`].
//! - byte 1: the seed of the chunk sizes (each TCP read is 1 to the largest chunk bytes).
//! - raw mode: the rest is the peer's TCP payload after the MPA Reply (or Request).
//! - framed and mixed modes: records `flags, len, [pos], body[len]`, each body framed by
//!   the peer's `MpaConn` as one FPDU (length, pad, CRC, Markers right), after the
//!   fix-ups `flags` asks for ([`apply_fixups`]): bit 0 patch an STag, bits 1-3 which
//!   ([`Harness::stags`]), bit 4 put the peer's MSN and MO of the record's queue
//!   ([`QueuePos`]), bit 5 patch the Read Request's source STag / TO (offsets 34 / 38)
//!   instead of the DDP header's (2 / 6), bit 6 patch the TO (the MR's iova plus the
//!   TO's last byte), bit 7 a `pos` byte follows `len`. In mixed mode the first record with bit 7 whose FPDU was
//!   framed has its FPDU's byte `pos % fpdu_len` XORed with 0x5a: one corrupted FPDU.
//!
//! # Invariants ([`run`] panics when one breaks)
//!
//! - The device's output always deframes at the peer; it sends at most one Terminate and
//!   nothing after it; it never queues more incoming Read Requests than IRD nor has
//!   more Read Requests outstanding than ORD (RFC 5040 §6.8, RFC 6581).
//! - After the input (and the device's responses, until quiet): the QP is RTS, no
//!   Terminate was sent, the connection is live, and its queue counters are consistent
//!   (outstanding + retired = posted); or it is in Error and sent exactly one Terminate,
//!   or none because the peer's Terminate or FIN ended it.
//! - Nothing is placed once the QP is in Error (RFC 5040 §7), and a peer's Terminate
//!   (whose header parses) that ends RTS is not answered with a Terminate.
//! - The `read` and `local` MRs never change, nor the guard bytes of `recv` (outside
//!   the SGEs) and of `fast` (past [`FR_LEN`]). Bytes outside every MR's buffer: the
//!   data path has no `unsafe` code, so a stray index panics; AddressSanitizer (the
//!   fuzz target's default build) watches the rest.
//! - After moving the QP to Error and draining the CQs, every posted WR completed
//!   exactly once and each work queue in posting order, no completion names a WR that
//!   was not posted or another QP, a successful receive's `byte_len` fits its SGEs, and
//!   the retired counts equal the posted counts.

use std::collections::{BTreeMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ddp_rdmap::terminate::ErrorCause;
use ddp_rdmap::{ulpdu, Header};
use mpa::negotiate::{CrcPolicy, LocalSettings};
use verbs::{
    AccessFlags, AsyncEvent, FastReg, QpCap, QpState, RecvWr, SendWr, Sge, Stag, WcOpcode, WcStatus,
};

use crate::rdmap::binding::{self, CoreRef, QpCore, QpUlp};
use crate::rdmap::engine::{QpEngine, QpInit};
use crate::resources::completion_queue::CompletionQueue;
use crate::resources::event_queue::EventQueue;
use crate::resources::stag_table::{MemoryRegion, MrTable, PdId};
use crate::transport::mpa_conn::{MpaConfig, MpaConn, MpaError, MpaEvent, State};
use crate::transport::{terminate_ulpdu, ConnError, ConnId, Established, Ulp, MAX_HELD_ULPDUS};

/// Bytes of every MR's buffer.
pub const MR_LEN: usize = 256;
/// Bytes of the `fast` MR's fast registration (the rest of its buffer is guard).
pub const FR_LEN: u64 = 192;
/// iova of the remotely writable MR.
pub const IOVA_WRITE: u64 = 0x1000;
/// iova of the remotely readable MR.
pub const IOVA_READ: u64 = 0x2000;
/// iova of the local-only MR.
pub const IOVA_LOCAL: u64 = 0x3000;
/// iova the `fast` MR is fast-registered at.
pub const IOVA_FAST: u64 = 0x4000;
/// iova of the receive-buffer MR.
pub const IOVA_RECV: u64 = 0x5000;
/// The receive WRs (wr_id 100 + index): per WR its SGEs as (offset in `recv`, bytes).
pub const RECV_SGES: &[&[(u64, u32)]] = &[
    &[(0, 40)],
    &[(48, 40)],
    &[(96, 40), (144, 16)],
    &[(168, 32)],
];
/// The RDMA Read WR's sink in `recv`: (offset, bytes).
pub const READ_SINK: (u64, u32) = (208, 40);
/// The largest TCP read, by the index in byte 0's bits 4-7.
pub const CHUNKS: [usize; 16] = [
    1,
    2,
    3,
    5,
    8,
    13,
    21,
    34,
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    1 << 16,
];
/// Depth of each CQ (far more than the WRs posted: no overflow).
pub const CQ_DEPTH: usize = 1024;
/// IRD and ORD of both sides.
pub const IRD_ORD: u16 = 4;
/// The QP number.
pub const QPN: u32 = 7;
/// Remote address and key of the device's RDMA Read (the peer's buffer).
pub const READ_REMOTE: (u64, u32) = (0x9000, 0x4321_0001);
/// Remote address and key of the device's RDMA Write.
pub const WRITE_REMOTE: (u64, u32) = (0xa000, 0x5555_0002);

/// One framed record of the framed and mixed modes (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The fix-ups (bits 0-6; bit 7 is set by [`Input::to_bytes`] iff `corrupt_at`).
    pub flags: u8,
    /// Where to corrupt the record's FPDU (mixed mode).
    pub corrupt_at: Option<u8>,
    /// The ULPDU before fix-ups (at most 255 bytes).
    pub body: Vec<u8>,
}

/// What the peer sends after the MPA exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Raw TCP payload.
    Raw(Vec<u8>),
    /// ULPDUs framed as valid FPDUs.
    Framed(Vec<Record>),
    /// ULPDUs framed as valid FPDUs, then the peer closes its half (FIN).
    FramedThenFin(Vec<Record>),
    /// ULPDUs framed as valid FPDUs, one of them corrupted.
    Mixed(Vec<Record>),
}

/// A structured input, encoded by [`Input::to_bytes`] into what [`run`] takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// Markers negotiated (both directions).
    pub markers: bool,
    /// The device is the MPA initiator.
    pub device_initiator: bool,
    /// Index into [`CHUNKS`] (0..16) of the largest TCP read.
    pub max_chunk: u8,
    /// Seed of the chunk sizes.
    pub chunk_seed: u8,
    /// The peer's bytes.
    pub mode: Mode,
}

impl Input {
    /// The encoding described in the [module docs](self).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mode = match self.mode {
            Mode::Raw(_) => 0,
            Mode::Framed(_) => 1,
            Mode::FramedThenFin(_) => 3,
            Mode::Mixed(_) => 2,
        };
        let mut out = vec![
            u8::from(self.markers)
                | u8::from(self.device_initiator) << 1
                | mode << 2
                | (self.max_chunk & 15) << 4,
            self.chunk_seed,
        ];
        match &self.mode {
            Mode::Raw(b) => out.extend_from_slice(b),
            Mode::Framed(rs) | Mode::Mixed(rs) | Mode::FramedThenFin(rs) => {
                for r in rs {
                    let len = r.body.len().min(255);
                    out.push((r.flags & 0x7f) | if r.corrupt_at.is_some() { 0x80 } else { 0 });
                    out.push(len as u8);
                    if let Some(p) = r.corrupt_at {
                        out.push(p);
                    }
                    out.extend_from_slice(&r.body[..len]);
                }
            }
        }
        out
    }
}

/// What a run ended with (for tests that check more than the invariants).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The QP's state after the input, before the final move to Error.
    pub state: QpState,
    /// The device's Terminate, if it sent one (its cause, if it parsed).
    pub terminate: Option<Option<ErrorCause>>,
    /// Whether the peer's Terminate reached the device.
    pub peer_terminated: bool,
    /// Whether the peer closed its half (mode 3) while the connection was live.
    pub peer_closed: bool,
    /// Non-Terminate ULPDUs the device sent.
    pub ulpdus_sent: usize,
    /// ULPDUs handed to the QP (in place or copied).
    pub ulpdus_received: usize,
    /// Every completion (send CQ then receive CQ, each in CQ order), after the flush.
    pub completions: Vec<(u64, WcOpcode, WcStatus)>,
}

/// A fixed-seed generator of chunk sizes (a 32-bit LCG; only determinism matters).
struct Chunker {
    state: u32,
    max: usize,
}

impl Chunker {
    fn next(&mut self) -> usize {
        self.state = self
            .state
            .wrapping_mul(1_664_525)
            .wrapping_add(1_013_904_223);
        1 + (self.state >> 8) as usize % self.max
    }
}

/// Watches the QP around each ULPDU it is handed: the MRs' bytes when it first is in
/// Error (nothing may be placed after that, RFC 5040 §7 / RFC 5041 §7), and whether
/// the ULPDU that ended RTS was the peer's Terminate (never answered by one).
struct Watch {
    core: CoreRef,
    mr: [Arc<MemoryRegion>; 5],
    at_error: Option<Vec<Vec<u8>>>,
    /// Set when a ULPDU moved the QP out of RTS: whether it was a Terminate whose
    /// header parses.
    ended_by_terminate: Option<bool>,
}

impl Watch {
    /// Whether the QP is in RTS (call before handing a ULPDU over).
    fn live(&self) -> bool {
        binding::lock(&self.core).qp.state() == QpState::Rts
    }

    /// After the ULPDU `u` was handed over, `live` being [`Watch::live`] before.
    fn after(&mut self, live: bool, u: &[u8]) {
        if live && self.ended_by_terminate.is_none() && !self.live() {
            self.ended_by_terminate = Some(Header::is_terminate(u) && Header::parse(u).is_ok());
        }
        self.snapshot_if_error();
    }

    fn snapshot_if_error(&mut self) {
        if self.at_error.is_none() && binding::lock(&self.core).qp.state() == QpState::Error {
            self.at_error = Some(self.mr.iter().map(|m| m.to_vec()).collect());
        }
    }
}

/// The device side and the peer's `MpaConn`.
pub struct Harness {
    mrs: Arc<MrTable>,
    pd: PdId,
    core: CoreRef,
    ulp: QpUlp,
    dev: MpaConn,
    peer: MpaConn,
    scq: Arc<CompletionQueue>,
    rcq: Arc<CompletionQueue>,
    errored: Arc<AtomicBool>,
    /// `write`, `read`, `fast`, `local`, `recv`.
    mr: [Arc<MemoryRegion>; 5],
    /// Each MR's bytes at the start.
    before: [Vec<u8>; 5],
    /// The STag the `fast` MR gets from its Fast Register WR.
    fast_stag: Stag,
    watch: Watch,
    now: u64,
    /// Received bytes MPA did not take yet (a socket's receive queue).
    unread: Vec<u8>,
    /// `Conn::rx_stopped`: MPA takes no more bytes.
    rx_stopped: bool,
    /// `Conn::final_sent`: the connection's final event went to the upper.
    final_sent: bool,
    /// The connection was aborted (no more bytes either way).
    aborted: bool,
    posted_sends: BTreeMap<u64, ()>,
    posted_recvs: BTreeMap<u64, u32>,
    /// What the peer's deframer got from the device.
    terminates_out: Vec<Option<ErrorCause>>,
    ulpdus_out: usize,
    ulpdus_after_terminate: usize,
    ulpdus_in: usize,
    peer_terminated: bool,
    peer_closed: bool,
    /// Next expected MSN per untagged queue (for the MSN fix-up).
    queues: [QueuePos; 3],
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("dev", &self.dev.state())
            .field("peer", &self.peer.state())
            .field("terminates_out", &self.terminates_out)
            .finish_non_exhaustive()
    }
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..MR_LEN)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

impl Harness {
    /// Sets up the device (MRs, CQs, QP bound to its connection), runs the MPA
    /// exchange and posts the WRs. Panics if any of it fails (a harness bug).
    pub fn new(markers: bool, device_initiator: bool) -> Harness {
        let mrs = Arc::new(MrTable::with_seed(64, 0x5eed));
        let pd = mrs.alloc_pd().expect("pd");
        let scq = CompletionQueue::new(1, CQ_DEPTH).expect("cq");
        let rcq = CompletionQueue::new(2, CQ_DEPTH).expect("cq");
        let len = MR_LEN as u64;
        let reg = |iova, access| mrs.reg_mr(pd, iova, len, access).expect("reg_mr");
        let w = reg(
            IOVA_WRITE,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        );
        let r = reg(IOVA_READ, AccessFlags::REMOTE_READ);
        let local = reg(IOVA_LOCAL, AccessFlags::empty());
        let recv = reg(IOVA_RECV, AccessFlags::LOCAL_WRITE);
        let fast = mrs.alloc_mr(pd, len).expect("alloc_mr");
        let mr = [w, r, fast, local, recv];
        for (i, m) in mr.iter().enumerate() {
            m.write(0, &pattern(0x11 * (i as u8 + 1))).expect("fill");
        }
        let before = mr.clone().map(|m| m.to_vec());
        let fast_stag = mr[2].stag().with_key(mrs.fresh_key(&mr[2]));

        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        let mut init = QpInit::new(QPN, pd, cap);
        init.sq_sig_all = true;
        let qp =
            QpEngine::new(init, Arc::clone(&mrs), Arc::clone(&scq), Arc::clone(&rcq)).expect("qp");
        let errored = Arc::new(AtomicBool::new(false));
        let mut c = QpCore::new(
            qp,
            Arc::clone(&scq),
            Arc::clone(&rcq),
            Arc::new(EventQueue::<AsyncEvent>::new()),
            Arc::new(AtomicBool::new(false)),
        );
        // As the engine's CreateQp and bind (`bindable`, `connect_qp` / `accept_qp`).
        c.errored = Some(Arc::clone(&errored));
        c.conn = Some(ConnId(1));
        c.generation = 1;
        c.after();
        let core = Arc::new(Mutex::new(c));
        let ulp = QpUlp::new(Arc::clone(&core), 1);
        let watch = Watch {
            core: Arc::clone(&core),
            mr: mr.clone(),
            at_error: None,
            ended_by_terminate: None,
        };

        let settings = LocalSettings {
            crc: CrcPolicy::Wanted,
            markers_rx: markers,
            ird: IRD_ORD,
            ord: IRD_ORD,
            ..LocalSettings::default()
        };
        let cfg = MpaConfig {
            settings,
            ..MpaConfig::default()
        };
        let (dev, peer) = if device_initiator {
            (
                MpaConn::initiator(cfg.clone(), 0),
                MpaConn::responder(cfg, 0),
            )
        } else {
            (
                MpaConn::responder(cfg.clone(), 0),
                MpaConn::initiator(cfg, 0),
            )
        };
        let mut h = Harness {
            mrs,
            pd,
            core,
            ulp,
            dev: dev.expect("mpa config"),
            peer: peer.expect("mpa config"),
            scq,
            rcq,
            errored,
            mr,
            before,
            fast_stag,
            watch,
            now: 0,
            unread: Vec::new(),
            rx_stopped: false,
            final_sent: false,
            aborted: false,
            posted_sends: BTreeMap::new(),
            posted_recvs: BTreeMap::new(),
            terminates_out: Vec::new(),
            ulpdus_out: 0,
            ulpdus_after_terminate: 0,
            ulpdus_in: 0,
            peer_terminated: false,
            peer_closed: false,
            queues: [QueuePos { msn: 1, mo: 0 }; 3],
        };
        // The MPA exchange, each side's bytes through the other's receive path.
        if !device_initiator {
            let req = h.peer_transmit();
            h.rx(&req);
        }
        h.service_tx();
        if device_initiator {
            let reply = h.peer_transmit();
            h.rx(&reply);
        }
        assert_eq!(
            h.state(),
            QpState::Rts,
            "the MPA exchange must bring the QP to RTS"
        );
        let msn = h.dev.initial_msn().expect("established");
        h.queues = [msn.send_rx, msn.read_rx, 1].map(|msn| QueuePos { msn, mo: 0 });
        h.post_all();
        h.service_tx();
        h
    }

    /// The STags the fix-ups choose from (index 0..8): `write`, `read`, `fast` (as
    /// fast-registered), `local`, `recv`, 0, 1 (the RTR's), `fast` before its Fast
    /// Register.
    pub fn stags(&self) -> [(u32, u64); 8] {
        let s = |m: &Arc<MemoryRegion>| m.stag().raw();
        [
            (s(&self.mr[0]), IOVA_WRITE),
            (s(&self.mr[1]), IOVA_READ),
            (self.fast_stag.raw(), IOVA_FAST),
            (s(&self.mr[3]), IOVA_LOCAL),
            (s(&self.mr[4]), IOVA_RECV),
            (0, 0),
            (1, 0),
            (s(&self.mr[2]), 0),
        ]
    }

    fn state(&self) -> QpState {
        binding::lock(&self.core).qp.state()
    }

    /// Queues WRs as `Qp::post_send` / `Qp::post_recv` do (post side, doorbell).
    fn post_all(&mut self) {
        let c = binding::lock(&self.core);
        let mut p = c.shared.lock_post();
        let recv = &self.mr[4];
        for (i, sges) in RECV_SGES.iter().enumerate() {
            let id = 100 + i as u64;
            let list = sges
                .iter()
                .map(|&(off, len)| Sge::new(IOVA_RECV + off, len, recv.stag()))
                .collect();
            p.recv_q.push_back(RecvWr::new(id, list));
            p.recvs += 1;
            self.posted_recvs.insert(id, sges.iter().map(|s| s.1).sum());
        }
        let local = self.mr[3].stag();
        let reg = FastReg {
            mr: self.mr[2].stag(),
            key: self.fast_stag.key(),
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            iova: IOVA_FAST,
            length: FR_LEN,
        };
        let sends = [
            SendWr::fast_reg(1, reg),
            SendWr::send(2, vec![Sge::new(IOVA_LOCAL, 32, local)]),
            SendWr::rdma_read(
                3,
                vec![Sge::new(IOVA_RECV + READ_SINK.0, READ_SINK.1, recv.stag())],
                READ_REMOTE.0,
                Stag::from_raw(READ_REMOTE.1),
            ),
            SendWr::rdma_write(
                4,
                vec![Sge::new(IOVA_LOCAL + 32, 32, local)],
                WRITE_REMOTE.0,
                Stag::from_raw(WRITE_REMOTE.1),
            ),
        ];
        for wr in sends {
            self.posted_sends.insert(wr.wr_id, ());
            p.send_q.push_back(wr);
            p.sends += 1;
        }
        drop(p);
        c.shared.has_work.store(true, Ordering::Release);
    }

    /// The peer's pending bytes (and marks them sent).
    fn peer_transmit(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(b) = self.peer.poll_transmit() {
            let n = b.len();
            out.extend_from_slice(b);
            self.peer.transmit_done(n).expect("transmit_done");
        }
        out
    }

    /// The device's transmitted bytes, read by the peer's `MpaConn`.
    fn peer_receives(&mut self, bytes: &[u8]) {
        let mut off = 0;
        while off < bytes.len() {
            let n = self.peer.handle_rx(&bytes[off..], self.now);
            if n == 0 {
                break;
            }
            off += n;
        }
        while let Some(ev) = self.peer.poll_event() {
            match ev {
                MpaEvent::ConnectRequest { .. } => {
                    self.peer
                        .accept(b"", IRD_ORD, IRD_ORD)
                        .expect("the peer accepts");
                }
                MpaEvent::Ulpdu(u) => {
                    if !self.terminates_out.is_empty() {
                        self.ulpdus_after_terminate += 1;
                    }
                    if Header::is_terminate(&u) {
                        self.terminates_out.push(ulpdu::terminate_cause(&u));
                    } else {
                        self.ulpdus_out += 1;
                    }
                }
                MpaEvent::Error(e) => {
                    panic!("the device's output does not deframe at the peer: {e}")
                }
                MpaEvent::Established { .. } | MpaEvent::Rejected { .. } | MpaEvent::Closed => {}
            }
        }
    }

    /// `Conn::fail` / `Conn::emit` of a final event.
    fn fail(&mut self, error: ConnError) {
        if !self.final_sent {
            self.final_sent = true;
            self.ulp.on_error(&error);
        }
    }

    /// `Conn::drain_mpa` with `Conn::on_mpa_event`.
    fn drain_mpa(&mut self) {
        while let Some(ev) = self.dev.poll_event() {
            match ev {
                MpaEvent::ConnectRequest { .. } => {
                    // The device's `accept_qp`: the QP is bound before the accept.
                    self.dev
                        .accept(b"", IRD_ORD, IRD_ORD)
                        .expect("the device accepts");
                }
                MpaEvent::Established { agreed } => {
                    let info = Established {
                        role: self.dev.role(),
                        mulpdu: self.dev.mulpdu().unwrap_or(0),
                        emss: self.dev.config().emss,
                        initial_msn: self.dev.initial_msn().expect("established"),
                        agreed,
                        local: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 4791),
                        remote: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 40000),
                    };
                    self.ulp.on_established(&info);
                }
                MpaEvent::Rejected { private_data } => {
                    self.fail(ConnError::Rejected { private_data });
                }
                MpaEvent::Ulpdu(u) => {
                    if self.rx_stopped || self.final_sent {
                        continue;
                    }
                    self.ulpdus_in += 1;
                    if Header::is_terminate(&u) {
                        self.peer_terminated = true;
                    }
                    if let Some(cause) = ulpdu::terminate_cause(&u) {
                        self.rx_stopped = true;
                        self.aborted = true;
                        let live = self.watch.live();
                        self.ulp.on_terminate(&u);
                        self.watch.after(live, &u);
                        self.fail(ConnError::TerminateReceived(cause));
                    } else {
                        let live = self.watch.live();
                        self.ulp.on_ulpdu(u.clone());
                        self.watch.after(live, &u);
                    }
                }
                MpaEvent::Error(e) => {
                    let reading = !self.rx_stopped;
                    self.rx_stopped = true;
                    let (own, ended) = if reading {
                        (self.ulp.poll_terminate(), self.ulp.stream_ended())
                    } else {
                        (None, false)
                    };
                    let terminate = match own {
                        Some(t) => Some(t),
                        None if ended => None,
                        None => e.terminate_cause().and_then(terminate_ulpdu),
                    };
                    if let Some(t) = terminate {
                        if self.dev.can_send_terminate() {
                            let _ = self.dev.send_terminate(&[&t]);
                        }
                    }
                    let error = match e {
                        MpaError::PeerClosedDuringStartup { graceful: false }
                        | MpaError::ConnectionLost {
                            graceful: false, ..
                        } => ConnError::Reset,
                        e => ConnError::Mpa(e),
                    };
                    self.fail(error);
                }
                MpaEvent::Closed => {
                    if !self.final_sent {
                        self.ulp.on_disconnected();
                    }
                }
            }
        }
    }

    /// `Conn::rx`: `bytes` arrive; MPA takes what it will.
    fn rx(&mut self, bytes: &[u8]) {
        self.unread.extend_from_slice(bytes);
        self.now += 10;
        while !self.unread.is_empty() && !self.rx_stopped && !self.aborted {
            let upper_live = !self.final_sent;
            let ulp = &mut self.ulp;
            let taken = &mut self.ulpdus_in;
            let watch = &mut self.watch;
            let used = if upper_live {
                self.dev
                    .handle_rx_in_place(&self.unread, self.now, &mut |u: &[u8]| {
                        if Header::is_terminate(u) {
                            return false;
                        }
                        let live = watch.live();
                        if !ulp.on_ulpdu_in_place(u) {
                            return false;
                        }
                        watch.after(live, u);
                        *taken += 1;
                        true
                    })
            } else {
                self.dev.handle_rx(&self.unread, self.now)
            };
            self.unread.drain(..used);
            self.drain_mpa();
            self.watch.snapshot_if_error();
            self.check_orphaned();
            if used == 0 {
                break;
            }
        }
        self.ulp.rx_done();
    }

    /// The engine thread's abort of a connection whose QP went to Error by itself.
    fn check_orphaned(&mut self) {
        if self.errored.swap(false, Ordering::AcqRel) && !self.final_sent {
            self.final_sent = true;
            self.aborted = true;
            self.rx_stopped = true;
            self.ulp.on_closed();
        }
    }

    /// `Conn::tx` / `Conn::pull_from_upper` until the upper has nothing more, then the
    /// bytes go to the peer.
    fn service_tx(&mut self) {
        loop {
            if self.final_sent || self.aborted || self.dev.llp_close().is_some() {
                break;
            }
            if self.dev.transmit_pending() > 0 {
                self.flush_tx();
            }
            if let Some(t) = self.ulp.poll_terminate() {
                let cause = ulpdu::terminate_cause(&t);
                match self.dev.send_terminate(&[&t]) {
                    Ok(()) => {
                        self.rx_stopped = true;
                        self.fail(ConnError::TerminateSent(cause));
                    }
                    Err(e) => {
                        self.aborted = true;
                        self.fail(ConnError::Ulp(e));
                    }
                }
                break;
            }
            let state = self.dev.state();
            let hold =
                state == State::AwaitingFirstFpdu && self.dev.held_ulpdus() < MAX_HELD_ULPDUS;
            if state != State::FullOperation && !hold {
                break;
            }
            let Some(mulpdu) = self.dev.mulpdu() else {
                break;
            };
            let dev = &mut self.dev;
            let mut direct = Vec::new();
            let mut emit = |parts: &[&[u8]]| {
                if dev.transmit_pending() == 0 {
                    let mut buf = vec![0u8; 4096];
                    if let Some(n) = dev.frame_into(&mut buf, parts)? {
                        direct.extend_from_slice(&buf[..n]);
                        return Ok(());
                    }
                }
                dev.send_ulpdu(parts)
            };
            let polled = self.ulp.poll_ulpdu(mulpdu, &mut emit);
            if !direct.is_empty() {
                self.peer_receives(&direct);
            }
            match polled {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    self.aborted = true;
                    self.fail(ConnError::Ulp(e));
                    break;
                }
            }
            self.check_orphaned();
        }
        self.flush_tx();
        self.check_orphaned();
    }

    /// `Conn::write_pending`, unless the connection is aborted: `Conn::tx` resets an
    /// aborted socket first, so what MPA still queued (e.g. the LLP Terminate for a
    /// bad FPDU deframed in the same read behind the peer's Terminate) never leaves.
    fn flush_tx(&mut self) {
        if self.aborted {
            return;
        }
        let mut out = Vec::new();
        while let Some(b) = self.dev.poll_transmit() {
            let n = b.len();
            out.extend_from_slice(b);
            if self.dev.transmit_done(n).is_err() {
                break;
            }
        }
        if !out.is_empty() {
            self.peer_receives(&out);
        }
    }

    /// Frames one record's ULPDU (after its fix-ups) at the peer; returns the FPDU
    /// bytes (none if the peer refused it or holds it).
    fn frame(&mut self, flags: u8, body: &[u8]) -> Vec<u8> {
        let mut body = body.to_vec();
        let stags = self.stags();
        apply_fixups(flags, &mut body, &stags, &mut self.queues);
        if self.peer.send_ulpdu(&[&body]).is_err() {
            return Vec::new();
        }
        self.peer_transmit()
    }

    /// The peer's FIN once MPA took every byte (`Conn::service`: the peer's FIN is
    /// reported when the receive queue is empty or MPA takes no more), then, once the
    /// device's own FIN went out and TCP is closed, the final `Closed`.
    fn peer_fin(&mut self) {
        self.quiesce();
        if self.aborted || self.final_sent {
            return;
        }
        self.peer_closed = true;
        self.dev.handle_tcp_closed(true);
        self.drain_mpa();
        self.service_tx();
        if !self.final_sent {
            self.final_sent = true;
            self.ulp.on_closed();
        }
    }

    /// Runs the device until nothing more happens: transmit, MPA timers far ahead.
    fn quiesce(&mut self) {
        for _ in 0..8 {
            self.service_tx();
            self.now += 20_000_000;
            self.dev.handle_timeout(self.now);
            self.drain_mpa();
            let pending = std::mem::take(&mut self.unread);
            self.rx(&pending);
            self.check_orphaned();
        }
    }

    /// Checks the invariants that hold at any time.
    fn check_now(&self) {
        assert!(
            self.terminates_out.len() <= 1,
            "more than one Terminate sent: {:?}",
            self.terminates_out
        );
        assert_eq!(
            self.ulpdus_after_terminate, 0,
            "ULPDUs sent after the Terminate"
        );
        let c = binding::lock(&self.core);
        assert!(
            c.qp.read_responses_pending() <= usize::from(IRD_ORD),
            "more incoming Read Requests queued than IRD"
        );
        assert!(
            c.qp.reads_outstanding() <= usize::from(IRD_ORD),
            "more Read Requests outstanding than ORD"
        );
        let counters = c.qp.counters();
        assert!(
            counters.sq_retired() + c.qp.sq_outstanding() as u64 <= self.posted_sends.len() as u64,
            "more send WRs retired or outstanding than posted"
        );
        assert!(
            counters.rq_retired() + c.qp.rq_outstanding() as u64 <= self.posted_recvs.len() as u64,
            "more receive WRs retired or outstanding than posted"
        );
    }

    /// Checks the final invariants (see the [module docs](self)) and returns the
    /// outcome; moves the QP to Error.
    pub fn finish(mut self) -> Outcome {
        self.quiesce();
        self.check_now();
        let state = self.state();
        let terminate = self.terminates_out.first().copied();
        match state {
            QpState::Rts => {
                assert!(
                    terminate.is_none(),
                    "a Terminate was sent but the QP is RTS"
                );
                assert!(!self.final_sent, "the connection ended but the QP is RTS");
                let mut c = binding::lock(&self.core);
                c.take_posted();
                let counters = c.qp.counters();
                assert_eq!(
                    counters.sq_retired() + c.qp.sq_outstanding() as u64,
                    self.posted_sends.len() as u64,
                    "send queue: outstanding + retired != posted"
                );
                assert_eq!(
                    counters.rq_retired() + c.qp.rq_outstanding() as u64,
                    self.posted_recvs.len() as u64,
                    "receive queue: outstanding + retired != posted"
                );
            }
            QpState::Error => {
                assert!(
                    terminate.is_some() || self.peer_terminated || self.peer_closed,
                    "the QP is in Error but no Terminate was sent, none received, no FIN"
                );
                if self.watch.ended_by_terminate == Some(true) {
                    assert_eq!(terminate, None, "the peer's Terminate was answered by one");
                }
            }
            s => panic!("the QP ended in {s}"),
        }
        // Unchanged memory.
        let now: Vec<Vec<u8>> = self.mr.iter().map(|m| m.to_vec()).collect();
        if let Some(then) = &self.watch.at_error {
            for (i, (a, b)) in then.iter().zip(&now).enumerate() {
                assert_eq!(a, b, "MR {i} changed after the QP went to Error");
            }
        }
        assert_eq!(now[1], self.before[1], "the remote-read-only MR changed");
        assert_eq!(now[3], self.before[3], "the local-only MR changed");
        assert_eq!(
            now[2][FR_LEN as usize..],
            self.before[2][FR_LEN as usize..],
            "the fast-registered MR changed past its registration"
        );
        let mut allowed = [false; MR_LEN];
        for &(off, len) in RECV_SGES.iter().flat_map(|s| s.iter()).chain([&READ_SINK]) {
            allowed[off as usize..off as usize + len as usize].fill(true);
        }
        for i in 0..MR_LEN {
            assert!(
                allowed[i] || now[4][i] == self.before[4][i],
                "guard byte {i} of the receive MR changed"
            );
        }
        // Move to Error and drain: every WR completes exactly once.
        {
            let mut c = binding::lock(&self.core);
            c.take_posted();
            c.enter_error();
            c.after();
            assert_eq!(c.qp.sq_outstanding(), 0, "send WRs left after the flush");
            assert_eq!(c.qp.rq_outstanding(), 0, "receive WRs left after the flush");
            let counters = c.qp.counters();
            assert_eq!(counters.sq_retired(), self.posted_sends.len() as u64);
            assert_eq!(counters.rq_retired(), self.posted_recvs.len() as u64);
        }
        let sends = self.scq.poll(usize::MAX).expect("send CQ");
        let recvs = self.rcq.poll(usize::MAX).expect("recv CQ");
        assert!(
            !self.scq.is_error() && !self.rcq.is_error(),
            "a CQ overflowed"
        );
        let mut seen = BTreeMap::new();
        for wc in &sends {
            assert_eq!(wc.qp_num, QPN);
            assert!(
                self.posted_sends.contains_key(&wc.wr_id),
                "send completion for wr_id {} never posted",
                wc.wr_id
            );
            *seen.entry(wc.wr_id).or_insert(0) += 1;
        }
        for wc in &recvs {
            assert_eq!(wc.qp_num, QPN);
            let Some(&room) = self.posted_recvs.get(&wc.wr_id) else {
                panic!("receive completion for wr_id {} never posted", wc.wr_id)
            };
            if wc.status == WcStatus::Success {
                assert!(
                    wc.byte_len <= room,
                    "receive byte_len {} > {room}",
                    wc.byte_len
                );
            }
            *seen.entry(wc.wr_id).or_insert(0) += 1;
        }
        for id in self.posted_sends.keys().chain(self.posted_recvs.keys()) {
            assert_eq!(
                seen.get(id),
                Some(&1),
                "wr_id {id} completed {:?} times",
                seen.get(id)
            );
        }
        // Each work queue completes in order (the posting order is the wr_id order).
        for (what, wcs) in [("send", &sends), ("receive", &recvs)] {
            let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "{what} completions out of order: {ids:?}"
            );
        }
        let _ = (&self.mrs, self.pd);
        Outcome {
            state,
            terminate,
            peer_terminated: self.peer_terminated,
            peer_closed: self.peer_closed,
            ulpdus_sent: self.ulpdus_out,
            ulpdus_received: self.ulpdus_in,
            completions: sends
                .iter()
                .chain(&recvs)
                .map(|w| (w.wr_id, w.opcode, w.status))
                .collect(),
        }
    }
}

/// Where the peer is in one untagged queue (QN 0 Send, 1 Read Request, 2 Terminate),
/// as the MSN fix-up sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePos {
    /// The MSN of the message in progress or the next one (RFC 5041 §4.3).
    pub msn: u32,
    /// The MO of the next segment of that message: payload bytes sent of it so far.
    pub mo: u32,
}

/// The fix-ups of a framed record (see the [module docs](self)), given the STags and
/// iovas of [`Harness::stags`] and the peer's position in each untagged queue. With
/// the MSN fix-up an untagged record gets its queue's MSN and MO (so multi-segment
/// messages reassemble); every untagged record moves the position on (MO by its
/// payload, past the 18-byte header; to the next MSN at MO 0 when L is set). Fields
/// past the body's end are left alone.
pub fn apply_fixups(
    flags: u8,
    body: &mut [u8],
    stags: &[(u32, u64); 8],
    queues: &mut [QueuePos; 3],
) {
    let (stag, iova) = stags[usize::from(flags >> 1) & 7];
    let (stag_at, to_at) = if flags & 0x20 != 0 { (34, 38) } else { (2, 6) };
    if flags & 1 != 0 {
        if let Some(f) = body.get_mut(stag_at..stag_at + 4) {
            f.copy_from_slice(&stag.to_be_bytes());
        }
    }
    if flags & 0x40 != 0 {
        if let Some(f) = body.get_mut(to_at..to_at + 8) {
            let to = iova + u64::from(f[7]);
            f.copy_from_slice(&to.to_be_bytes());
        }
    }
    let untagged = body.first().is_some_and(|b| b & 0x80 == 0);
    if untagged && body.len() >= 18 {
        let q = &mut queues[usize::from(body[9] & 3).min(2)];
        if flags & 0x10 != 0 {
            body[10..14].copy_from_slice(&q.msn.to_be_bytes());
            body[14..18].copy_from_slice(&q.mo.to_be_bytes());
        }
        let msn = u32::from_be_bytes([body[10], body[11], body[12], body[13]]);
        let mo = u32::from_be_bytes([body[14], body[15], body[16], body[17]]);
        if body[0] & 0x40 != 0 {
            *q = QueuePos {
                msn: msn.wrapping_add(1),
                mo: 0,
            };
        } else {
            *q = QueuePos {
                msn,
                mo: mo.wrapping_add((body.len() - 18) as u32),
            };
        }
    }
}

/// Runs one input (the encoding of the [module docs](self)) and checks every
/// invariant; panics when one breaks.
pub fn run(data: &[u8]) -> Outcome {
    let (head, rest) = match data {
        [a, b, rest @ ..] => ([*a, *b], rest),
        [a] => ([*a, 0], &[][..]),
        [] => ([0, 0], &[][..]),
    };
    let markers = head[0] & 1 != 0;
    let device_initiator = head[0] & 2 != 0;
    let mode = (head[0] >> 2) & 3;
    let mut chunker = Chunker {
        state: u32::from(head[1]) | u32::from(head[0]) << 8,
        max: CHUNKS[usize::from(head[0] >> 4)],
    };
    let mut h = Harness::new(markers, device_initiator);
    // The peer's whole byte stream, then delivered in chunks.
    let mut wire: VecDeque<u8> = VecDeque::new();
    if mode == 0 {
        wire.extend(rest);
    } else {
        let mut corrupted = mode != 2;
        let mut i = 0;
        while i + 2 <= rest.len() {
            let flags = rest[i];
            let len = usize::from(rest[i + 1]);
            i += 2;
            let pos = if flags & 0x80 != 0 {
                let p = rest.get(i).copied().unwrap_or(0);
                i = (i + 1).min(rest.len());
                Some(p)
            } else {
                None
            };
            let end = (i + len).min(rest.len());
            let body = &rest[i..end];
            i = end;
            let mut fpdu = h.frame(flags, body);
            if let (Some(p), false) = (pos, corrupted) {
                if !fpdu.is_empty() {
                    let at = usize::from(p) % fpdu.len();
                    fpdu[at] ^= 0x5a;
                    corrupted = true;
                }
            }
            wire.extend(fpdu);
        }
    }
    while !wire.is_empty() {
        let n = chunker.next().min(wire.len());
        let chunk: Vec<u8> = wire.drain(..n).collect();
        h.rx(&chunk);
        h.service_tx();
        h.check_now();
    }
    if mode == 3 {
        h.peer_fin();
    }
    h.finish()
}
