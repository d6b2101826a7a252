//! The handle every device object holds (siw's `struct siw_device` as its objects see
//! it): the command queue into the engine thread, its wake-up, the state the engine
//! shares, and the device's STag table; with [`DeviceError`], what device calls
//! return, and [`COMMAND_TIMEOUT`], how long they wait for the engine.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use verbs::{AsyncEvent, VerbsError};

use super::progress::{Budget, Drove};
use super::{Command, Shared};
use crate::link::{GoneReason, LinkError};
use crate::resources::event_queue::{DeviceEnd, EventQueue};
use crate::resources::stag_table::MrTable;
use crate::transport::stream::Waker;
use crate::transport::StackError;

/// How long a call waits for the engine's answer before giving up with
/// [`DeviceError::NoAnswer`]: 10 s (the engine answers in microseconds; this only guards
/// against a wedged engine).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of device calls.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The link could not be opened or set up.
    #[error("link: {0}")]
    Link(#[from] LinkError),
    /// The stack refused the call (bad port, backlog, settings, state...).
    #[error("{0}")]
    Stack(#[from] StackError),
    /// The engine thread could not be started, or could not enter the namespace.
    #[error("engine thread: {0}")]
    Thread(std::io::Error),
    /// The device's link is gone (device removal).
    #[error("device gone ({0:?})")]
    Gone(GoneReason),
    /// The device was shut down.
    #[error("device shut down")]
    Closed,
    /// The engine did not answer within [`COMMAND_TIMEOUT`].
    #[error("no answer from the engine")]
    NoAnswer,
    /// A verbs object was refused (e.g. a QP not in Reset or Init, already bound to
    /// a connection, or of another device).
    #[error("verbs: {0}")]
    Verbs(#[from] VerbsError),
}

/// What connections, listeners and verbs objects hold of their device.
#[derive(Debug)]
pub(crate) struct Handle {
    pub(crate) cmds: Sender<Command>,
    pub(crate) waker: Waker,
    pub(crate) shared: Arc<Shared>,
    /// The device's STag table (PDs and MRs).
    pub(crate) mrs: Arc<MrTable>,
    next_qpn: std::sync::atomic::AtomicU32,
    next_cq: std::sync::atomic::AtomicU32,
    next_srq: std::sync::atomic::AtomicU32,
    /// SRQs of the device not yet destroyed (bounded by `DeviceAttr::max_srq`).
    pub(crate) srqs: std::sync::atomic::AtomicUsize,
    /// Who drives the device: its progress lock and the owner of its link.
    pub(crate) driving: Arc<super::Driving>,
    /// [`crate::DeviceConfig::strict_read_sink`].
    pub(crate) strict_read_sink: bool,
}

/// A post call's budget: one pass (siw caps a burst in the caller's context too).
pub(crate) const POST_BUDGET: Budget = Budget {
    passes: 1,
    rounds: 16,
};

/// The budget of a poll or wait that found its CQ empty: a few passes.
pub(crate) const POLL_BUDGET: Budget = Budget {
    passes: 4,
    rounds: u32::MAX,
};

impl Handle {
    /// The handle of a device whose engine takes `cmds`, is woken by `waker` and shares
    /// `shared`, with an empty STag table.
    /// `driving` is the device's progress lock and link owner.
    pub(crate) fn new(
        cmds: Sender<Command>,
        waker: Waker,
        shared: Arc<Shared>,
        driving: Arc<super::Driving>,
    ) -> Handle {
        Handle {
            cmds,
            waker,
            shared,
            mrs: Arc::new(MrTable::new()),
            next_qpn: std::sync::atomic::AtomicU32::new(1),
            next_cq: std::sync::atomic::AtomicU32::new(1),
            next_srq: std::sync::atomic::AtomicU32::new(1),
            srqs: std::sync::atomic::AtomicUsize::new(0),
            driving,
            strict_read_sink: false,
        }
    }

    /// The same handle with [`crate::DeviceConfig::strict_read_sink`] set to `strict`.
    pub(crate) fn with_strict_read_sink(mut self, strict: bool) -> Handle {
        self.strict_read_sink = strict;
        self
    }

    /// True if verbs calls drive the device ([`super::ProgressMode::Hybrid`]).
    pub(crate) fn drives(&self) -> bool {
        self.driving.hybrid()
    }

    /// Drives the device within `budget` if verbs calls drive it and no other thread
    /// does (then holds the link's lease); work left at the budget's end goes to the
    /// engine thread (woken). Returns true if this call ran a pass that moved something.
    pub(crate) fn drive(&self, budget: Budget) -> bool {
        if !self.drives() {
            return false;
        }
        matches!(
            self.driving.app_drive(budget),
            Drove::Drove { active: true, .. }
        )
    }

    /// `Err(DeviceGone)` once the device is gone or shut down.
    pub(crate) fn alive(&self) -> Result<(), VerbsError> {
        match self.shared.ended() {
            Some(_) => Err(VerbsError::DeviceGone),
            None => Ok(()),
        }
    }

    /// Holds the device's gate open (for reading): while the guard lives, WRs queued on
    /// a QP are certain to be taken by the engine. `Err(DeviceGone)` once the engine
    /// took its last command.
    pub(crate) fn gate(&self) -> Result<super::progress::GateOpen<'_>, VerbsError> {
        self.shared.gate.enter().ok_or(VerbsError::DeviceGone)
    }

    /// Enqueues QP work for the engine, without waking it. Refused with
    /// [`VerbsError::DeviceGone`] once the engine took its last command; otherwise
    /// the engine is certain to run it (see `Shared::gate`).
    pub(crate) fn enqueue(&self, cmd: Command) -> Result<(), VerbsError> {
        let _gate = self.gate()?;
        self.cmds.send(cmd).map_err(|_| VerbsError::DeviceGone)
    }

    /// Rings QP `qpn`'s doorbell (`first`: the QP had no WRs waiting to be taken, so
    /// it joins the doorbell list): the engine takes its newly posted WRs. In Hybrid
    /// mode a `transmit` ring (new Sends) drives the device right here, every time;
    /// otherwise the engine is woken on a first ring if it covers the link (an
    /// application thread holding the lease or polling the link takes the doorbell at
    /// its next pass).
    pub(crate) fn ring(&self, qpn: u32, first: bool, transmit: bool) {
        if first {
            self.shared
                .doorbell
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(qpn);
        }
        if !self.drives() {
            if first {
                self.waker.wake();
            }
        } else if transmit {
            // The poster drives (or the holder's re-check takes the doorbell).
            self.drive(POST_BUDGET);
        } else if first && self.driving.engine_covers_link() {
            self.waker.wake();
        }
    }

    /// Wakes the engine thread.
    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    /// Enqueues a command with a reply channel and waits for the answer (verbs
    /// calls): `DeviceGone` if the engine ended, an `ETIMEDOUT` [`VerbsError::Os`] if
    /// it did not answer within [`COMMAND_TIMEOUT`].
    pub(crate) fn call_verbs<T>(
        &self,
        call: &'static str,
        make: impl FnOnce(Sender<Result<T, VerbsError>>) -> Command,
    ) -> Result<T, VerbsError> {
        let (tx, rx) = mpsc::channel();
        self.enqueue(make(tx))?;
        self.wake();
        match rx.recv_timeout(COMMAND_TIMEOUT) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(VerbsError::Os {
                call,
                errno: libc::ETIMEDOUT,
            }),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(VerbsError::DeviceGone),
        }
    }

    /// The next QP number (never 0; wraps after 2^32 - 1).
    pub(crate) fn next_qpn(&self) -> u32 {
        loop {
            let n = self
                .next_qpn
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n != 0 {
                return n;
            }
        }
    }

    /// The next CQ handle.
    pub(crate) fn next_cq(&self) -> u32 {
        self.next_cq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The next SRQ handle.
    pub(crate) fn next_srq(&self) -> u32 {
        self.next_srq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The device's verbs asynchronous event queue.
    pub(crate) fn async_events(&self) -> Arc<EventQueue<AsyncEvent>> {
        Arc::clone(&self.shared.async_events)
    }

    /// The engine's "poll again" flag.
    pub(crate) fn kick(&self) -> Arc<std::sync::atomic::AtomicBool> {
        Arc::clone(&self.shared.kick)
    }

    /// Sends a command whose reply is a [`DeviceError`] result and waits for it.
    pub(crate) fn call_dev<T>(
        &self,
        make: impl FnOnce(Sender<Result<T, DeviceError>>) -> Command,
    ) -> Result<T, DeviceError> {
        let (tx, rx): (_, Receiver<Result<T, DeviceError>>) = mpsc::channel();
        self.post(make(tx))?;
        match rx.recv_timeout(COMMAND_TIMEOUT) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(DeviceError::NoAnswer),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(self.ended_error()),
        }
    }

    pub(crate) fn ended_error(&self) -> DeviceError {
        match self.shared.ended() {
            Some(DeviceEnd::Gone(r)) => DeviceError::Gone(r),
            _ => DeviceError::Closed,
        }
    }

    /// Sends a command without waiting.
    pub(crate) fn post(&self, cmd: Command) -> Result<(), DeviceError> {
        if let Some(DeviceEnd::Gone(r)) = self.shared.ended() {
            return Err(DeviceError::Gone(r));
        }
        self.cmds.send(cmd).map_err(|_| self.ended_error())?;
        self.waker.wake();
        Ok(())
    }

    /// Sends a command and waits for its result.
    pub(crate) fn call<T>(
        &self,
        make: impl FnOnce(Sender<Result<T, StackError>>) -> Command,
    ) -> Result<T, DeviceError> {
        let (tx, rx): (_, Receiver<Result<T, StackError>>) = mpsc::channel();
        self.post(make(tx))?;
        match rx.recv_timeout(COMMAND_TIMEOUT) {
            Ok(r) => Ok(r?),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(DeviceError::NoAnswer),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(self.ended_error()),
        }
    }
}
