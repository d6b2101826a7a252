//! The user-space cost of a bulk transfer, raw smoltcp TCP against the MPA FPDU stream
//! driven inline (`bench::inline`), over an in-memory link in one process: no TAP, no
//! kernel network path, so what differs is only our code and smoltcp's. A fixed
//! workload, for A/B comparisons of the stack's per-FPDU path by CPU time per byte or,
//! under callgrind, by instructions:
//!
//! ```sh
//! cargo build --release -p bench --example stack_path
//! taskset -c 0,1 target/release/examples/stack_path tcp 256 1500
//! taskset -c 0,1 target/release/examples/stack_path fpdu-crc 256 1500
//! STACK_PATH_SPIN_US=0 valgrind --tool=callgrind target/release/examples/stack_path fpdu-crc 32 1500
//! ```
//!
//! Arguments: variant (`tcp`, `fpdu-crc`, `fpdu-nocrc`), MiB to move, link MTU. Prints
//! each side's thread CPU time per MiB in microseconds.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use bench::inline::{self, InlineConfig};
use bench::tcp::{self, Amount, Role, TcpBenchConfig};
use mpa::negotiate::CrcPolicy;
use softiwarp::link::{MemoryConfig, MemoryLink};
use softiwarp::transport::smoltcp_glue::{InterfaceConfig, TcpConfig};

fn iface(n: u8) -> InterfaceConfig {
    tcp::test_iface(9, n)
}

/// CPU time of the calling thread in nanoseconds (`/proc/thread-self/schedstat`).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let t0 = thread_cpu_ns();
    let r = f();
    (r, thread_cpu_ns() - t0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let variant = args.get(1).map_or("fpdu-crc", String::as_str).to_string();
    let mib: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(256);
    let mtu: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1500);
    let bytes = mib << 20;
    let (a, b) = MemoryLink::pair(MemoryConfig {
        mtu,
        ..MemoryConfig::default()
    })
    .expect("memory link");
    // Busy-poll time after activity (`STACK_PATH_SPIN_US`, default 50 as the device);
    // 0 under callgrind, so that waiting costs no instructions.
    let spin = Duration::from_micros(
        std::env::var("STACK_PATH_SPIN_US")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(50),
    );
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let ((server, server_ns), (client, client_ns)) = if variant == "tcp" {
        let mut scfg = TcpBenchConfig::new(Role::Server, iface(1), Ipv4Addr::new(10, 9, 9, 2));
        scfg.spin = spin;
        let mut ccfg = TcpBenchConfig::new(Role::Client, iface(2), Ipv4Addr::new(10, 9, 9, 1));
        ccfg.spin = spin;
        ccfg.amount = Amount::Bytes(bytes);
        let server = std::thread::spawn(move || {
            timed(|| tcp::run_server(a, &scfg, move || ready_tx.send(()).unwrap()))
        });
        ready_rx.recv().expect("server ready");
        let client = timed(|| tcp::run_client(b, &ccfg));
        (server.join().expect("server thread"), client)
    } else {
        let crc = if variant == "fpdu-nocrc" {
            CrcPolicy::IfPeerAsks
        } else {
            CrcPolicy::Wanted
        };
        let cfg = |role, n| InlineConfig {
            role,
            iface: iface(n),
            server: SocketAddrV4::new(Ipv4Addr::new(10, 9, 9, 1), 7174),
            amount: Amount::Bytes(bytes),
            crc,
            tcp: TcpConfig::default(),
            verify: false,
            spin,
            timeout: Duration::from_secs(120),
        };
        let scfg = cfg(Role::Server, 1);
        let ccfg = cfg(Role::Client, 2);
        let server = std::thread::spawn(move || {
            timed(|| inline::run(a, &scfg, move || ready_tx.send(()).unwrap()))
        });
        ready_rx.recv().expect("server ready");
        let client = timed(|| inline::run(b, &ccfg, || ()));
        (server.join().expect("server thread"), client)
    };
    let server = server.expect("server");
    let client = client.expect("client");
    assert_eq!(server.bytes, bytes, "server got every byte");
    println!(
        "{variant} mtu {mtu}: {mib} MiB, client {:.1} us/MiB, server {:.1} us/MiB, {} client frames",
        client_ns as f64 / 1e3 / mib as f64,
        server_ns as f64 / 1e3 / mib as f64,
        client.tx_frames
    );
}
