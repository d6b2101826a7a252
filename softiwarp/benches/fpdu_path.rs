//! The FPDU data path of one QP, per core, with MPA CRC32c on:
//!
//! - `tx`: `QpEngine::poll_transmit` of a 64 KiB RDMA Write into an `mpa` `Framer` through
//!   the `PartsSink` the device uses (DDP/RDMAP header + MR slice as two parts; the
//!   framer copies them and computes the CRC in the same pass);
//! - `rx`: the `mpa` `Deframer` (CRC check) over the FPDU stream of a 64 KiB Write,
//!   each ULPDU handed in place to `QpEngine::handle_ulpdu`, which checks the STag and
//!   places the payload into the MR.
//!
//! Throughput is payload bytes per second. MULPDUs: 1454 (MTU 1500, EMSS 1460) and
//! 8954 (MTU 9000).
//!
//! `floor` measures CRC32c alone and copy + CRC32c in FPDU-sized pieces, the work the
//! data path cannot avoid, for comparison.
//!
//! Run: `cargo bench -p softiwarp --bench fpdu_path` (add `-- --quick` for a short run).
//!
//! Fixed workload for instruction counts (no criterion, no timing): with
//! `FPDU_PATH_COUNT=<tx|rx>:<MULPDU>:<iterations>` the binary runs that many 64 KiB
//! Writes through the one path and exits, e.g.
//! `FPDU_PATH_COUNT=rx:1454:200 valgrind --tool=callgrind target/release/deps/fpdu_path-*`
//! (run it with two iteration counts and take the difference to drop the setup).

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput};
use mpa::deframer::{Deframer, DeframerConfig};
use mpa::fpdu::{Framer, Framing};
use softiwarp::rdmap::binding::PartsSink;
use softiwarp::rdmap::engine::{QpEngine, QpInit};
use softiwarp::resources::completion_queue::CompletionQueue;
use softiwarp::resources::stag_table::{MemoryRegion, MrTable};
use verbs::{AccessFlags, QpCap, QpState, SendWr, Sge};

const LEN: usize = 64 * 1024;
const MULPDUS: [usize; 2] = [1454, 8954];
const CRC: Framing = Framing {
    crc: true,
    markers: false,
};

struct End {
    qp: QpEngine,
    mr: Arc<MemoryRegion>,
}

fn end(qp_num: u32) -> End {
    let mrs = Arc::new(MrTable::new());
    let pd = mrs.alloc_pd().unwrap();
    let cq = CompletionQueue::new(qp_num, 1 << 16).unwrap();
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qp = QpEngine::new(
        QpInit::new(qp_num, pd, cap),
        Arc::clone(&mrs),
        Arc::clone(&cq),
        cq,
    )
    .unwrap();
    for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
        qp.modify_state(s).unwrap();
    }
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = mrs.reg_mr(pd, 0x10_0000, LEN as u64, access).unwrap();
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + 3) as u8).collect();
    mr.write(0, &data).unwrap();
    End { qp, mr }
}

/// Posts an unsignaled 64 KiB Write from `src` to `dst`'s MR.
fn post_write(src: &mut End, dst: &End) {
    let sge = Sge::new(src.mr.iova(), LEN as u32, src.mr.stag());
    src.qp
        .post_send(SendWr::rdma_write(
            1,
            vec![sge],
            dst.mr.iova(),
            dst.mr.stag(),
        ))
        .unwrap();
}

/// Frames every ULPDU of the QP's pending work into `out` (initialised room, as the
/// device's MPA transmit queue keeps it: no zero-fill per FPDU); returns the FPDU
/// count and the bytes framed.
fn transmit(
    qp: &mut QpEngine,
    framer: &mut Framer,
    out: &mut [u8],
    mulpdu: usize,
) -> (usize, usize) {
    let mut end = 0usize;
    let mut sink = PartsSink::new(|parts: &[&[u8]]| {
        let n = framer.write_parts(parts, &mut out[end..])?;
        end += n;
        Ok::<(), mpa::fpdu::FrameError>(())
    });
    while qp.poll_transmit(mulpdu, &mut sink).unwrap() {}
    assert!(sink.take_error().is_none());
    (sink.emitted(), end)
}

/// Deframes `stream` (the FPDUs of one 64 KiB Write) and places each ULPDU into `qp`'s
/// memory; returns the FPDU count.
fn receive(qp: &mut QpEngine, stream: &[u8]) -> usize {
    let mut deframer = Deframer::new(DeframerConfig::new(CRC));
    let mut n = 0;
    let mut input = stream;
    while !input.is_empty() {
        let (used, item) = deframer.decode(input);
        input = &input[used..];
        match item {
            Some(Ok(fpdu)) => {
                qp.handle_ulpdu(fpdu.ulpdu).unwrap();
                n += 1;
            }
            Some(Err(e)) => panic!("{e}"),
            None => break,
        }
    }
    n
}

/// The fixed workload of `FPDU_PATH_COUNT` (see the module docs).
fn count(spec: &str) {
    let parts: Vec<&str> = spec.split(':').collect();
    let [path, mulpdu, iters] = parts[..] else {
        panic!("FPDU_PATH_COUNT={spec}: expected <tx|rx>:<MULPDU>:<iterations>");
    };
    let mulpdu: usize = mulpdu.parse().expect("MULPDU");
    let iters: usize = iters.parse().expect("iterations");
    let mut a = end(1);
    let mut b = end(2);
    let mut framer = Framer::new(CRC);
    let mut out = vec![0u8; 2 * LEN];
    let mut fpdus = 0;
    let cpu_start = thread_cpu_ns();
    match path {
        "tx" => {
            for _ in 0..iters {
                post_write(&mut a, &b);
                fpdus += transmit(&mut a.qp, &mut framer, &mut out, mulpdu).0;
            }
        }
        "rx" => {
            post_write(&mut a, &b);
            let (_, len) = transmit(&mut a.qp, &mut framer, &mut out, mulpdu);
            out.truncate(len);
            for _ in 0..iters {
                fpdus += receive(&mut b.qp, &out);
            }
            assert_eq!(b.mr.to_vec(), a.mr.to_vec());
        }
        _ => panic!("FPDU_PATH_COUNT={spec}: path must be tx or rx"),
    }
    let cpu = thread_cpu_ns()
        .zip(cpu_start)
        .map(|(e, s)| e.saturating_sub(s));
    let per_write = cpu.map_or("?".to_string(), |ns| format!("{}", ns / iters as u64));
    println!(
        "{path} MULPDU {mulpdu}: {iters} Writes of {LEN} bytes, {fpdus} FPDUs, \
         {per_write} ns of thread CPU time per Write (setup included)"
    );
}

/// This thread's time on a CPU so far, in ns (`/proc/thread-self/schedstat`, first
/// field), so that figures on a loaded machine count only this thread's running time.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn tx(c: &mut Criterion) {
    let mut g = c.benchmark_group("tx");
    g.throughput(Throughput::Bytes(LEN as u64));
    for mulpdu in MULPDUS {
        let mut a = end(1);
        let b = end(2);
        let mut framer = Framer::new(CRC);
        let mut out = vec![0u8; 2 * LEN];
        g.bench_with_input(
            BenchmarkId::new("write_64KiB_crc", mulpdu),
            &mulpdu,
            |bench, &m| {
                bench.iter(|| {
                    post_write(&mut a, &b);
                    transmit(&mut a.qp, &mut framer, &mut out, m)
                })
            },
        );
    }
    g.finish();
}

fn rx(c: &mut Criterion) {
    let mut g = c.benchmark_group("rx");
    g.throughput(Throughput::Bytes(LEN as u64));
    for mulpdu in MULPDUS {
        let mut a = end(1);
        let mut b = end(2);
        let mut framer = Framer::new(CRC);
        let mut stream = vec![0u8; 2 * LEN];
        post_write(&mut a, &b);
        let (fpdus, len) = transmit(&mut a.qp, &mut framer, &mut stream, mulpdu);
        stream.truncate(len);
        g.bench_with_input(
            BenchmarkId::new("write_64KiB_crc", mulpdu),
            &mulpdu,
            |bench, _| {
                bench.iter(|| {
                    let n = receive(&mut b.qp, &stream);
                    assert_eq!(n, fpdus);
                    n
                })
            },
        );
        assert_eq!(b.qp.state(), QpState::Rts);
        assert_eq!(b.mr.to_vec(), a.mr.to_vec());
    }
    g.finish();
}

/// What the hardware gives for the same bytes: CRC32c alone, and copy + CRC32c in
/// FPDU-sized pieces (the work the data path cannot avoid).
fn floor(c: &mut Criterion) {
    use mpa::crc::Engine;
    let mut g = c.benchmark_group("floor");
    g.throughput(Throughput::Bytes(LEN as u64));
    let src: Vec<u8> = (0..LEN).map(|i| (i * 13 + 1) as u8).collect();
    let mut dst = vec![0u8; LEN];
    g.bench_function("crc32c_64KiB", |b| b.iter(|| mpa::crc::crc32c(&src)));
    for mulpdu in MULPDUS {
        g.bench_with_input(
            BenchmarkId::new("copy_crc32c_64KiB", mulpdu),
            &(mulpdu - 14),
            |b, &room| {
                b.iter(|| {
                    let mut crc = 0u32;
                    for (s, d) in src.chunks(room).zip(dst.chunks_mut(room)) {
                        d.copy_from_slice(s);
                        crc ^= mpa::crc::crc32c_append(0, d);
                    }
                    crc
                })
            },
        );
    }
    g.finish();
    // Each CRC32c engine on one FPDU's worth of octets (MULPDU - 14 of ULPDU plus the
    // 6-octet header and the ULPDU_Length field; docs/ARCHITECTURE.md, "The CRC32c
    // engines"); the engine in use is `Engine::current()`.
    let mut g = c.benchmark_group("crc32c_engine");
    for engine in [Engine::Crc32c, Engine::CrcFast, Engine::Sse42ThreeStreams] {
        for len in [1450usize, 8950, LEN] {
            g.throughput(Throughput::Bytes(len as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("{engine:?}"), len),
                &src[..len],
                |b, data| b.iter(|| engine.append(0, data)),
            );
        }
    }
    g.finish();
}

mod group {
    // `criterion_group!` defines a public function; it stays inside this module.
    criterion::criterion_group!(benches, super::floor, super::tx, super::rx);
}

fn main() {
    if let Ok(spec) = std::env::var("FPDU_PATH_COUNT") {
        count(&spec);
        return;
    }
    // What `criterion_main!` expands to.
    group::benches();
    Criterion::default().configure_from_args().final_summary();
}
