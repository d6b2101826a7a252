//! Tests of iwperf's send-queue windows and CQ sizing on a provider that keeps verbs'
//! rules strictly, over the soft device's memory link in one process.
//!
//! [`Strict`] wraps a provider (here the soft device's) and frees a send-queue slot only
//! when a completion at or after its WR is polled, as iw_cxgb4 and the InfiniBand
//! providers do; the soft device and Linux siw free an unsignaled WR's slot as soon as
//! it completes, so a program that never signals, or that posts until `QueueFull` to
//! find out when to poll, works there and fails on hardware. A receive slot is free
//! once its completion is polled. It can also report smaller `max_qp_wr` and `max_cqe`
//! than the soft device's, and make CQs smaller than asked (to force an overrun).

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use verbs::provider::{
    CmEvent, CmEventKind, CmId, CompletionQueue, ConnParam, Device, Provider, ProviderError,
    QueuePair,
};
use verbs::{DeviceCaps, QpCap, RecvWr, SendWr, VerbsError, WorkCompletion, WorkQueue};

/// What the wrapped device claims and does beyond the inner one's limits.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// `max_qp_wr` reported and enforced at QP creation.
    max_qp_wr: u32,
    /// `max_cqe` reported and enforced at CQ creation.
    max_cqe: u32,
    /// Entries a CQ has fewer than asked for (a device that breaks its word).
    cq_short: u32,
}

impl Limits {
    const NONE: Limits = Limits {
        max_qp_wr: u32::MAX,
        max_cqe: u32::MAX,
        cq_short: 0,
    };
}

/// One QP's queues as verbs counts them.
#[derive(Debug, Default)]
struct Queues {
    /// The wr_ids of the send WRs not yet known complete, oldest first.
    sends: VecDeque<u64>,
    max_send: usize,
    /// Receives posted and not yet polled.
    recvs: usize,
    max_recv: usize,
}

#[derive(Debug)]
struct Shared {
    limits: Limits,
    qps: Mutex<HashMap<u32, Queues>>,
}

impl Shared {
    fn with<R>(&self, qp_num: u32, f: impl FnOnce(&mut Queues) -> R) -> R {
        let mut qps = self.qps.lock().unwrap_or_else(PoisonError::into_inner);
        f(qps.entry(qp_num).or_default())
    }

    /// Frees what the polled completions `wcs` free.
    fn polled(&self, wcs: &[WorkCompletion]) {
        for wc in wcs {
            self.with(wc.qp_num, |q| {
                if wc.opcode.is_recv() {
                    q.recvs = q.recvs.saturating_sub(1);
                } else if let Some(i) = q.sends.iter().position(|&id| id == wc.wr_id) {
                    // Completions are in order: this WR and every one before it.
                    q.sends.drain(..=i);
                }
            });
        }
    }
}

fn queue_full(call: &'static str, queue: WorkQueue, depth: usize) -> ProviderError {
    ProviderError::verbs(
        call,
        VerbsError::QueueFull {
            queue,
            depth: u32::try_from(depth).unwrap_or(u32::MAX),
        },
    )
}

/// The strict provider over `P`.
struct Strict<'p, P> {
    inner: &'p P,
    shared: Arc<Shared>,
}

impl<'p, P: Provider> Strict<'p, P> {
    fn new(inner: &'p P, limits: Limits) -> Self {
        Strict {
            inner,
            shared: Arc::new(Shared {
                limits,
                qps: Mutex::default(),
            }),
        }
    }
}

struct StrictCq<C> {
    inner: C,
    shared: Arc<Shared>,
}

impl<C: CompletionQueue> CompletionQueue for StrictCq<C> {
    fn poll(&self, max: usize) -> Result<Vec<WorkCompletion>, ProviderError> {
        let wcs = self.inner.poll(max)?;
        self.shared.polled(&wcs);
        Ok(wcs)
    }

    fn wait(&self, timeout: Duration) -> Result<bool, ProviderError> {
        self.inner.wait(timeout)
    }

    fn poll_into(&self, out: &mut [WorkCompletion]) -> Result<usize, ProviderError> {
        let n = self.inner.poll_into(out)?;
        self.shared.polled(&out[..n]);
        Ok(n)
    }
}

struct StrictQp<Q> {
    inner: Q,
    shared: Arc<Shared>,
}

impl<Q: QueuePair> QueuePair for StrictQp<Q> {
    fn qp_num(&self) -> u32 {
        self.inner.qp_num()
    }

    fn cap(&self) -> QpCap {
        self.inner.cap()
    }

    fn post_send(&self, wr: SendWr) -> Result<(), ProviderError> {
        let num = self.qp_num();
        self.shared.with(num, |q| {
            if q.sends.len() >= q.max_send {
                return Err(queue_full("ibv_post_send", WorkQueue::Send, q.max_send));
            }
            q.sends.push_back(wr.wr_id);
            Ok(())
        })?;
        self.inner.post_send(wr).inspect_err(|_| {
            self.shared.with(num, |q| q.sends.pop_back());
        })
    }

    fn post_recv(&self, wr: RecvWr) -> Result<(), ProviderError> {
        let num = self.qp_num();
        self.shared.with(num, |q| {
            if q.recvs >= q.max_recv {
                return Err(queue_full("ibv_post_recv", WorkQueue::Recv, q.max_recv));
            }
            q.recvs += 1;
            Ok(())
        })?;
        self.inner.post_recv(wr).inspect_err(|_| {
            self.shared.with(num, |q| q.recvs -= 1);
        })
    }
}

struct StrictDev<D> {
    inner: D,
    shared: Arc<Shared>,
}

impl<D: Device> Device for StrictDev<D> {
    type Pd = D::Pd;
    type Cq = StrictCq<D::Cq>;

    fn name(&self) -> String {
        self.inner.name()
    }

    fn caps(&self) -> Result<DeviceCaps, ProviderError> {
        let l = self.shared.limits;
        let mut c = self.inner.caps()?;
        c.max_qp_wr = c.max_qp_wr.min(l.max_qp_wr);
        c.max_cqe = c.max_cqe.min(l.max_cqe);
        Ok(c)
    }

    fn alloc_pd(&self) -> Result<D::Pd, ProviderError> {
        self.inner.alloc_pd()
    }

    fn create_cq(&self, cqe: u32) -> Result<Self::Cq, ProviderError> {
        let l = self.shared.limits;
        if cqe > l.max_cqe {
            return Err(ProviderError::call(
                "ibv_create_cq",
                nix::libc::EINVAL,
                "cqe",
            ));
        }
        Ok(StrictCq {
            inner: self
                .inner
                .create_cq(cqe.saturating_sub(l.cq_short).max(1))?,
            shared: self.shared.clone(),
        })
    }
}

struct StrictId<I> {
    inner: I,
    shared: Arc<Shared>,
}

impl<I: CmId> CmId for StrictId<I> {
    type Device = StrictDev<I::Device>;
    type Qp = StrictQp<I::Qp>;

    fn key(&self) -> u64 {
        self.inner.key()
    }

    fn bind_addr(&self, addr: SocketAddr) -> Result<(), ProviderError> {
        self.inner.bind_addr(addr)
    }

    fn listen(&self, backlog: u32) -> Result<(), ProviderError> {
        self.inner.listen(backlog)
    }

    fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), ProviderError> {
        self.inner.resolve_addr(src, dst, timeout)
    }

    fn resolve_route(&self, timeout: Duration) -> Result<(), ProviderError> {
        self.inner.resolve_route(timeout)
    }

    fn connect(&self, param: &ConnParam) -> Result<(), ProviderError> {
        self.inner.connect(param)
    }

    fn accept(&self, param: &ConnParam) -> Result<(), ProviderError> {
        self.inner.accept(param)
    }

    fn reject(&self, private_data: &[u8]) -> Result<(), ProviderError> {
        self.inner.reject(private_data)
    }

    fn disconnect(&self) -> Result<(), ProviderError> {
        self.inner.disconnect()
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.local_addr()
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.inner.peer_addr()
    }

    fn device(&self) -> Option<Self::Device> {
        Some(StrictDev {
            inner: self.inner.device()?,
            shared: self.shared.clone(),
        })
    }

    fn create_qp(
        &self,
        pd: &<Self::Device as Device>::Pd,
        send_cq: &<Self::Device as Device>::Cq,
        recv_cq: &<Self::Device as Device>::Cq,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> Result<Self::Qp, ProviderError> {
        let max = self.shared.limits.max_qp_wr;
        if cap.max_send_wr > max || cap.max_recv_wr > max {
            return Err(ProviderError::call(
                "rdma_create_qp",
                nix::libc::EINVAL,
                "cap",
            ));
        }
        let inner = self
            .inner
            .create_qp(pd, &send_cq.inner, &recv_cq.inner, cap, sq_sig_all)?;
        let granted = inner.cap();
        self.shared.with(inner.qp_num(), |q| {
            *q = Queues {
                max_send: granted.max_send_wr as usize,
                max_recv: granted.max_recv_wr as usize,
                ..Queues::default()
            }
        });
        Ok(StrictQp {
            inner,
            shared: self.shared.clone(),
        })
    }
}

struct StrictEvent<E> {
    inner: E,
    shared: Arc<Shared>,
}

impl<E: CmEvent> CmEvent for StrictEvent<E> {
    type Id = StrictId<E::Id>;

    fn kind(&self) -> CmEventKind {
        self.inner.kind()
    }

    fn status(&self) -> i32 {
        self.inner.status()
    }

    fn id_key(&self) -> u64 {
        self.inner.id_key()
    }

    fn take_new_id(&mut self) -> Option<Self::Id> {
        Some(StrictId {
            inner: self.inner.take_new_id()?,
            shared: self.shared.clone(),
        })
    }

    fn conn_param(&self) -> ConnParam {
        self.inner.conn_param()
    }
}

impl<P: Provider> Provider for Strict<'_, P> {
    type Mr = P::Mr;
    type Pd = P::Pd;
    type Cq = StrictCq<P::Cq>;
    type Qp = StrictQp<P::Qp>;
    type Device = StrictDev<P::Device>;
    type Id = StrictId<P::Id>;
    type Event = StrictEvent<P::Event>;

    fn create_id(&self) -> Result<Self::Id, ProviderError> {
        Ok(StrictId {
            inner: self.inner.create_id()?,
            shared: self.shared.clone(),
        })
    }

    fn get_event(&self, timeout: Duration) -> Result<Option<Self::Event>, ProviderError> {
        Ok(self.inner.get_event(timeout)?.map(|inner| StrictEvent {
            inner,
            shared: self.shared.clone(),
        }))
    }
}

mod tests {
    use super::*;
    use crate::iwperf::conn::DeviceOptions;
    use crate::iwperf::datapath::{RunLength, Tuning};
    use crate::iwperf::peer::{
        drive, on_soft_device, serve, ClientReport, ClientTest, ServerSummary,
    };
    use crate::iwperf::wire::{Mode, Op, VerifyStatus};
    use crate::iwperf::IwperfError;
    use softiwarp::link::{MemoryConfig, MemoryLink};

    const PORT: u16 = 18528;
    const SERVER: Ipv4Addr = Ipv4Addr::new(10, 237, 0, 1);
    const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 237, 0, 2);

    fn test(op: Op, mode: Mode, tx_depth: u16, iters: u64) -> ClientTest {
        ClientTest {
            server: SocketAddrV4::new(SERVER, PORT),
            ops: vec![op],
            mode,
            size: 64,
            qps: 1,
            tx_depth,
            verify: mode == Mode::Bandwidth,
            length: RunLength::Iters(iters),
            connect_timeout: Duration::from_secs(10),
            indices: None,
        }
    }

    /// One run between a server and a client on strict providers over soft devices on
    /// one memory link (`server` and `client`: each device's limits), with `tuning` on
    /// both sides.
    fn run(
        tag: &str,
        t: &ClientTest,
        tuning: Tuning,
        server: Limits,
        client: Limits,
    ) -> (
        ClientReport,
        Option<IwperfError>,
        ServerSummary,
        Option<IwperfError>,
    ) {
        let (a, b) = MemoryLink::pair(MemoryConfig {
            mtu: 9000,
            names: (format!("{tag}-a"), format!("{tag}-b")),
            ..MemoryConfig::default()
        })
        .expect("memory link");
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        // Hybrid progress (the default): application threads drive the device inside
        // post_send, so WRs complete while they are posted (where waiting for
        // `QueueFull` before polling overruns a CQ).
        let sdev = DeviceOptions::memory(&format!("{tag}s"), a, SERVER);
        let server = std::thread::spawn(move || {
            let mut summary = ServerSummary::default();
            let mut leaked = 0;
            let err = on_soft_device(sdev, &mut leaked, |p, _| {
                let strict = Strict::new(p, server);
                let addr = SocketAddrV4::new(SERVER, PORT);
                serve(
                    &strict,
                    addr,
                    16,
                    tuning,
                    Duration::from_secs(10),
                    move |_| {
                        let _ = ready_tx.send(());
                    },
                    &mut summary,
                )
            });
            (summary, err)
        });
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("server ready");
        let mut report = ClientReport::default();
        let mut leaked = 0;
        let cdev = DeviceOptions::memory(&format!("{tag}c"), b, CLIENT);
        let cerr = on_soft_device(cdev, &mut leaked, |p, _| {
            let strict = Strict::new(p, client);
            drive(&strict, None, t, tuning, &mut |_| {}, &mut report)
        });
        let (summary, serr) = server.join().expect("server thread");
        (report, cerr, summary, serr)
    }

    /// A run that must succeed: both sides without error, every WR verified or every
    /// round trip measured.
    fn passes(tag: &str, t: &ClientTest, tuning: Tuning, server: Limits, client: Limits) {
        let (report, cerr, summary, serr) = run(tag, t, tuning, server, client);
        assert!(cerr.is_none(), "{tag}: client: {}", cerr.unwrap());
        assert!(serr.is_none(), "{tag}: server: {}", serr.unwrap());
        let RunLength::Iters(n) = t.length else {
            unreachable!()
        };
        match t.mode {
            Mode::Bandwidth => {
                let r = &report.bandwidth[0];
                assert_eq!(r.iterations, n * u64::from(t.qps), "{tag}");
                assert_eq!(r.verify, VerifyStatus::Passed, "{tag}");
            }
            Mode::Latency => {
                assert_eq!(report.latency.expect("latency").iterations, n, "{tag}");
                assert_eq!(summary.answered, Some(n), "{tag}");
            }
        }
    }

    #[test]
    fn latency_runs_longer_than_the_send_queue_free_their_slots_by_signaling() {
        // 200 round trips through send queues of 4 + 16 WRs: each side's Sends (or
        // Writes) are unsignaled but one in two of the window, and a full window waits
        // for the signaled one's completion. Before, every Send or Write was unsignaled
        // and the strict send queue filled after 20 round trips (`QueueFull`).
        for op in [Op::Send, Op::Write] {
            let t = test(op, Mode::Latency, 4, 200);
            let tag = format!("slat{}", op_tag(op));
            passes(&tag, &t, Tuning::default(), Limits::NONE, Limits::NONE);
        }
    }

    fn op_tag(op: Op) -> &'static str {
        match op {
            Op::Write => "w",
            Op::Read => "r",
            Op::Send => "s",
        }
    }

    #[test]
    fn send_credits_keep_flowing_through_a_strict_send_queue() {
        // 2,000 Sends, 8 receives at the server: 1,000 Credit messages through the
        // server's control window of 16. Before, every Credit was unsignaled, the
        // server's send queue filled after the first 20 and its `QueueFull` was
        // swallowed: no more credits, and the client stalled until STALL_LIMIT.
        let t = test(Op::Send, Mode::Bandwidth, 4, 2000);
        let tuning = Tuning {
            rx_depth: 8,
            ..Tuning::default()
        };
        passes("scred", &t, tuning, Limits::NONE, Limits::NONE);
    }

    #[test]
    fn a_small_device_send_queue_bounds_the_data_window() {
        // max_qp_wr 40: the client's send queue is 40 WRs, so its data window is
        // 40 - 16 = 24 although --tx-depth asks for 64. Before, the client posted 64
        // Writes at once into 40 slots (`QueueFull`, the run failed).
        let small = Limits {
            max_qp_wr: 40,
            ..Limits::NONE
        };
        for op in [Op::Write, Op::Read, Op::Send] {
            let t = test(op, Mode::Bandwidth, 64, 500);
            let tag = format!("ssq{}", op_tag(op));
            passes(&tag, &t, Tuning::default(), small, small);
        }
    }

    #[test]
    fn a_small_device_cq_bounds_the_data_window() {
        // max_cqe 100 for two connections of 64 verified (all signaled) Writes: each
        // connection's share holds its 16 control receives, 16 control messages and a
        // data window of 18. Before, the CQ was clamped to 100 and the windows stayed
        // at 64: 128 completions for 100 entries, an overrun.
        let small = Limits {
            max_cqe: 100,
            ..Limits::NONE
        };
        let t = ClientTest {
            qps: 2,
            ..test(Op::Write, Mode::Bandwidth, 64, 500)
        };
        passes("scq", &t, Tuning::default(), Limits::NONE, small);
        // A CQ that cannot hold even the receives is refused before the run.
        let tiny = Limits {
            max_cqe: 60,
            ..Limits::NONE
        };
        let (_, cerr, _, _) = run("scqt", &t, Tuning::default(), Limits::NONE, tiny);
        let e = cerr.expect("a CQ too small for the receives");
        assert!(matches!(e, IwperfError::Setup(_)), "{e}");
        assert!(e.to_string().contains("at most 60 completions"), "{e}");
    }

    #[test]
    fn a_cq_overrun_is_an_error_with_the_completions_lost() {
        // A device whose CQs hold 90 entries fewer than asked (6 of 96): the client's
        // 64 verified Writes overrun it. The run ends with the poll's error, the count
        // of completions lost and the WR counts, and the connection-failure status.
        let liar = Limits {
            cq_short: 90,
            ..Limits::NONE
        };
        let t = test(Op::Write, Mode::Bandwidth, 64, 500);
        let (report, cerr, _, _) = run("sovr", &t, Tuning::default(), Limits::NONE, liar);
        let e = cerr.expect("the overrun ends the run");
        let text = e.to_string();
        assert!(matches!(e, IwperfError::Connection(_)), "{text}");
        assert!(
            text.starts_with("connection: poll CQ: ibv_poll_cq: CQ")
                && text.contains("overflowed: ")
                && text.contains(" completions lost; WRs: ")
                && text.contains(" receives posted, "),
            "{text}"
        );
        assert_eq!(e.exit_code(), crate::iwperf::EXIT_CONNECTION);
        assert!(report.bandwidth[0].partial);
    }
}
