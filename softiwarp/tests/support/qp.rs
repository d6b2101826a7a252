//! Harness of the `qp` tests: two QP engines wired back to back by moving
//! whole ULPDUs (no MPA, no TCP), plus helpers to register MRs and post receives.

use std::collections::VecDeque;
use std::sync::Arc;

use softiwarp::rdmap::engine::{QpEngine, QpEvent, QpInit, RxError};
use softiwarp::resources::completion_queue::CompletionQueue;
use softiwarp::resources::stag_table::{MemoryRegion, MrOptions, MrTable};
use softiwarp::PdId;
use verbs::{AccessFlags, QpCap, QpState, RecvWr, Sge, WorkCompletion};

/// MULPDU for an EMSS of 1448 without markers (docs/ARCHITECTURE.md).
pub const MULPDU: usize = 1442;
/// Payload bytes per tagged segment at [`MULPDU`].
pub const TAGGED_ROOM: usize = MULPDU - 14;
/// Payload bytes per untagged segment at [`MULPDU`].
pub const UNTAGGED_ROOM: usize = MULPDU - 18;

#[allow(unused_imports)] // each test binary uses a subset
pub use super::{all_access, cap, pattern, Rng, RngExt};

/// One end: its device's MR table, a PD, the QP and its CQs.
pub struct Side {
    pub mrs: Arc<MrTable>,
    pub pd: PdId,
    pub qp: QpEngine,
    pub scq: Arc<CompletionQueue>,
    pub rcq: Arc<CompletionQueue>,
}

impl Side {
    /// A QP in Reset on its own device (MR table).
    pub fn new(qp_num: u32, cap: QpCap, tweak: impl FnOnce(&mut QpInit)) -> Side {
        let mrs = Arc::new(MrTable::new());
        let pd = mrs.alloc_pd().unwrap();
        let scq = CompletionQueue::new(qp_num * 2, 1 << 16).unwrap();
        let rcq = CompletionQueue::new(qp_num * 2 + 1, 1 << 16).unwrap();
        let mut init = QpInit::new(qp_num, pd, cap);
        tweak(&mut init);
        let qp = QpEngine::new(init, Arc::clone(&mrs), Arc::clone(&scq), Arc::clone(&rcq)).unwrap();
        Side {
            mrs,
            pd,
            qp,
            scq,
            rcq,
        }
    }

    /// Moves the QP Reset -> Init -> RTR -> RTS.
    pub fn bring_up(&mut self) {
        for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
            self.qp.modify_state(s).unwrap();
        }
    }

    /// Registers an MR of `len` bytes at `iova`.
    pub fn reg(&self, iova: u64, len: u64, access: AccessFlags) -> Arc<MemoryRegion> {
        self.mrs.reg_mr(self.pd, iova, len, access).unwrap()
    }

    /// Registers an MR of `len` bytes at `iova` that the peer may invalidate by a
    /// Send with Invalidate ([`MrOptions::remote_invalidate`]).
    pub fn reg_invalidatable(&self, iova: u64, len: u64, access: AccessFlags) -> Arc<MemoryRegion> {
        let options = MrOptions {
            remote_invalidate: true,
        };
        self.mrs
            .reg_mr_with(self.pd, iova, len, access, options)
            .unwrap()
    }

    /// Posts a receive WR of one SGE covering `len` bytes at buffer offset `off`.
    pub fn post_recv(&mut self, wr_id: u64, mr: &MemoryRegion, off: u64, len: u32) {
        let sge = Sge::new(mr.iova() + off, len, mr.stag());
        self.qp.post_recv(RecvWr::new(wr_id, vec![sge])).unwrap();
    }

    pub fn send_wcs(&self) -> Vec<WorkCompletion> {
        self.scq.poll(usize::MAX).unwrap()
    }

    pub fn recv_wcs(&self) -> Vec<WorkCompletion> {
        self.rcq.poll(usize::MAX).unwrap()
    }

    pub fn events(&mut self) -> Vec<QpEvent> {
        std::iter::from_fn(|| self.qp.poll_event()).collect()
    }

    /// Transmits every ULPDU the QP has now.
    pub fn drain_tx(&mut self, mulpdu: usize) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| self.qp.poll_transmit_vec(mulpdu).unwrap()).collect()
    }
}

/// Two QPs back to back.
pub struct Pair {
    pub a: Side,
    pub b: Side,
    pub mulpdu: usize,
    /// ULPDUs in flight, per direction (TCP keeps them in order).
    pub a_to_b: VecDeque<Vec<u8>>,
    pub b_to_a: VecDeque<Vec<u8>>,
    /// Errors returned by `handle_ulpdu`: ('a' or 'b' = the receiving side).
    pub rx_errors: Vec<(char, RxError)>,
    /// ULPDUs moved so far.
    pub moved: usize,
}

impl Pair {
    /// Two connected QPs in RTS with the default [`QpInit`] and `cap`.
    pub fn new(cap: QpCap) -> Pair {
        Pair::with(cap, |_| {}, |_| {})
    }

    /// Two connected QPs in RTS, each [`QpInit`] adjusted by its closure.
    pub fn with(cap: QpCap, ta: impl FnOnce(&mut QpInit), tb: impl FnOnce(&mut QpInit)) -> Pair {
        let mut a = Side::new(1, cap, ta);
        let mut b = Side::new(2, cap, tb);
        a.bring_up();
        b.bring_up();
        Pair {
            a,
            b,
            mulpdu: MULPDU,
            a_to_b: VecDeque::new(),
            b_to_a: VecDeque::new(),
            rx_errors: Vec::new(),
            moved: 0,
        }
    }

    /// A transmits one ULPDU into the A->B pipe; true if it had one.
    pub fn tx_a(&mut self) -> bool {
        match self.a.qp.poll_transmit_vec(self.mulpdu).unwrap() {
            Some(u) => {
                self.a_to_b.push_back(u);
                true
            }
            None => false,
        }
    }

    /// B transmits one ULPDU into the B->A pipe.
    pub fn tx_b(&mut self) -> bool {
        match self.b.qp.poll_transmit_vec(self.mulpdu).unwrap() {
            Some(u) => {
                self.b_to_a.push_back(u);
                true
            }
            None => false,
        }
    }

    /// B receives the oldest ULPDU from A.
    pub fn rx_b(&mut self) -> bool {
        match self.a_to_b.pop_front() {
            Some(u) => {
                self.moved += 1;
                if let Err(e) = self.b.qp.handle_ulpdu(&u) {
                    self.rx_errors.push(('b', e));
                }
                true
            }
            None => false,
        }
    }

    /// A receives the oldest ULPDU from B.
    pub fn rx_a(&mut self) -> bool {
        match self.b_to_a.pop_front() {
            Some(u) => {
                self.moved += 1;
                if let Err(e) = self.a.qp.handle_ulpdu(&u) {
                    self.rx_errors.push(('a', e));
                }
                true
            }
            None => false,
        }
    }

    /// Runs both directions, one ULPDU each way per round, until nothing moves.
    pub fn pump(&mut self) {
        loop {
            let mut any = false;
            any |= self.tx_a();
            any |= self.rx_b();
            any |= self.tx_b();
            any |= self.rx_a();
            if !any {
                break;
            }
        }
    }

    /// Like [`Pair::pump`] but choosing the next action at random: stresses the
    /// interleavings (each direction stays in order, as over TCP).
    pub fn pump_random(&mut self, rng: &mut Rng) {
        let mut idle = 0;
        while idle < 64 {
            let moved = match rng.below(4) {
                0 => self.tx_a(),
                1 => self.rx_b(),
                2 => self.tx_b(),
                _ => self.rx_a(),
            };
            idle = if moved { 0 } else { idle + 1 };
        }
        self.pump();
    }
}
