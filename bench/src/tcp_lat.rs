//! Raw smoltcp TCP ping-pong, the latency baseline of iwperf's Send ping-pong: the
//! client sends `size` bytes and waits until `size` bytes came back, the server echoes
//! every `size` bytes it receives. One thread per side, polling the way the bandwidth
//! baseline does ([`crate::tcp`]: spin after activity, then sleep on the link's fd).
//!
//! The client reports half of each round trip (perftest's `send_lat` convention), in
//! nanoseconds.

use std::time::{Duration, Instant};

use softiwarp::link::Link;
use softiwarp::smoltcp::socket::tcp::State;

use crate::tcp::{check_alive, Role, Stack, TcpBenchConfig};
use crate::BenchError;

/// How many round trips, or for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounds {
    /// Exactly this many.
    Count(u64),
    /// As many as fit in this time.
    Time(Duration),
}

/// Reads from `s` into `buf[*have..]` while data is there; true if anything came.
fn fill(
    s: &mut softiwarp::smoltcp::socket::tcp::Socket<'static>,
    buf: &mut [u8],
    have: &mut usize,
) -> Result<bool, BenchError> {
    let mut moved = false;
    while *have < buf.len() && s.can_recv() {
        let n = s
            .recv_slice(&mut buf[*have..])
            .map_err(|e| BenchError::Tcp(format!("recv: {e}")))?;
        if n == 0 {
            break;
        }
        *have += n;
        moved = true;
    }
    Ok(moved)
}

/// Runs the echo server on `link` (up): listens on `cfg.port`, calls `ready`, echoes
/// every `size` bytes until the client closes. Returns the messages echoed.
///
/// Errors: link or TCP failure; [`BenchError::Timeout`] after `cfg.timeout`.
pub fn run_echo_server<L: Link>(
    link: L,
    cfg: &TcpBenchConfig,
    size: usize,
    ready: impl FnOnce(),
) -> Result<u64, BenchError> {
    if size == 0 {
        return Err(BenchError::Config("ping-pong size 0".into()));
    }
    let mut st = Stack::new(link, cfg)?;
    st.socket()
        .listen(cfg.port)
        .map_err(|e| BenchError::Tcp(format!("listen: {e}")))?;
    st.poll();
    ready();
    let deadline = Instant::now() + cfg.timeout;
    let mut buf = vec![0u8; size];
    let mut have = 0usize;
    let mut echoed = 0u64;
    let mut seen_peer = false;
    loop {
        st.poll();
        let mut moved = false;
        let s = st.socket();
        moved |= fill(s, &mut buf, &mut have)?;
        if have == size && s.send_capacity() - s.send_queue() >= size {
            s.send_slice(&buf)
                .map_err(|e| BenchError::Tcp(format!("send: {e}")))?;
            have = 0;
            echoed += 1;
            moved = true;
        }
        seen_peer |= !matches!(
            s.state(),
            State::Listen | State::SynReceived | State::Closed
        );
        if seen_peer && !s.may_recv() && s.recv_queue() == 0 {
            s.close();
            break;
        }
        if Instant::now() > deadline {
            return Err(BenchError::Timeout(
                cfg.timeout,
                format!("echo server: {echoed} echoed"),
            ));
        }
        st.idle(moved)?;
    }
    st.linger(
        |s| matches!(s, State::Closed | State::TimeWait),
        Duration::from_millis(500),
    )?;
    Ok(echoed)
}

/// Runs the ping client on `link` (up): connects to `cfg.peer:cfg.port`, runs `rounds`
/// round trips of `size` bytes, closes. Returns the half round trips in nanoseconds.
///
/// Errors: link or TCP failure; [`BenchError::Timeout`] after `cfg.timeout`.
pub fn run_ping_client<L: Link>(
    link: L,
    cfg: &TcpBenchConfig,
    size: usize,
    rounds: Rounds,
) -> Result<Vec<u64>, BenchError> {
    if size == 0 {
        return Err(BenchError::Config("ping-pong size 0".into()));
    }
    debug_assert_eq!(cfg.role, Role::Client);
    let mut st = Stack::new(link, cfg)?;
    let deadline = Instant::now() + cfg.timeout;
    let local_port = 40000 + (cfg.iface.random_seed % 20000) as u16;
    st.connect(cfg.peer, cfg.port, local_port)?;
    while st.socket().state() != State::Established {
        st.poll();
        check_alive(st.socket(), "connecting")?;
        if Instant::now() > deadline {
            return Err(BenchError::Timeout(
                cfg.timeout,
                "ping client: connect".into(),
            ));
        }
        st.idle(false)?;
    }
    let msg = vec![0x5au8; size];
    let mut buf = vec![0u8; size];
    let start = Instant::now();
    let (count, until) = match rounds {
        Rounds::Count(n) => (n, None),
        Rounds::Time(d) => (u64::MAX, Some(start + d)),
    };
    let mut samples = Vec::with_capacity(count.min(1 << 20) as usize);
    while (samples.len() as u64) < count && until.is_none_or(|u| Instant::now() < u) {
        let t0 = Instant::now();
        let s = st.socket();
        if s.send_slice(&msg)
            .map_err(|e| BenchError::Tcp(format!("send: {e}")))?
            != size
        {
            return Err(BenchError::Tcp("send buffer full in a ping-pong".into()));
        }
        let mut have = 0;
        let mut moved = true;
        loop {
            st.poll();
            let s = st.socket();
            check_alive(s, "ping-pong")?;
            moved |= fill(s, &mut buf, &mut have)?;
            if have == size {
                break;
            }
            if Instant::now() > deadline {
                return Err(BenchError::Timeout(
                    cfg.timeout,
                    format!("ping client: {} round trips", samples.len()),
                ));
            }
            st.idle(moved)?;
            moved = false;
        }
        samples.push(t0.elapsed().as_nanos() as u64 / 2);
    }
    st.socket().close();
    st.linger(
        |s| matches!(s, State::Closed | State::TimeWait),
        Duration::from_millis(500),
    )?;
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::test_iface;
    use softiwarp::link::{MemoryConfig, MemoryLink};
    use std::net::Ipv4Addr;

    fn iface(n: u8) -> softiwarp::transport::smoltcp_glue::InterfaceConfig {
        test_iface(1, n)
    }

    #[test]
    fn ping_pong_over_a_memory_link() {
        let (a, b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let scfg = TcpBenchConfig::new(Role::Server, iface(1), Ipv4Addr::new(10, 9, 1, 2));
        let ccfg = TcpBenchConfig::new(Role::Client, iface(2), Ipv4Addr::new(10, 9, 1, 1));
        let (tx, rx) = std::sync::mpsc::channel();
        let server =
            std::thread::spawn(move || run_echo_server(a, &scfg, 8, move || tx.send(()).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let samples = run_ping_client(b, &ccfg, 8, Rounds::Count(200)).unwrap();
        assert_eq!(samples.len(), 200);
        assert!(samples.iter().all(|&s| s > 0));
        assert_eq!(server.join().unwrap().unwrap(), 200);
    }
}
