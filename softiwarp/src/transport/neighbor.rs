//! Neighbour resolution on request (ARP, RFC 826): what `rdma_resolve_addr` needs from a
//! device before it reports `AddrResolved` (the kernel's `rdma_resolve_ip` ->
//! `addr_resolve_neigh` -> `neigh_event_send`).
//!
//! smoltcp resolves neighbours by itself, but only when it has a packet for one, and its
//! neighbour cache is private. So the stack asks on its own: [`Neighbors`] (sans-IO, no
//! clock reads) sends an ARP Request for the address at once and every
//! [`PROBE_INTERVAL`] (Linux `retrans_time_ms`) until the timeout, learns sender
//! addresses from every ARP frame the link delivers (Requests and Replies: the stack's
//! frame tracker hands them over before smoltcp sees them), and answers from what it
//! learned for [`CACHE_LIFETIME`] (smoltcp's own entry lifetime). smoltcp processes the
//! same Reply (its Target is our address), so the connection that follows finds the
//! neighbour in smoltcp's cache too and sends its SYN without an ARP round of its own.
//!
//! Completions ([`NeighborReply`]) run on the engine thread: they must only enqueue
//! (design.md section 5: no user code on the engine thread).

use std::collections::HashMap;
use std::net::Ipv4Addr;

use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr,
};

/// Time between two ARP Requests for an address still unresolved: 1 s (Linux's default
/// `retrans_time_ms`).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How long a learned neighbour answers a resolution without a new Request: 60 s
/// (smoltcp's neighbour cache entry lifetime).
pub const CACHE_LIFETIME: Duration = Duration::from_secs(60);

/// Bytes of an Ethernet frame carrying an ARP packet for IPv4 (14 + 28).
pub const ARP_FRAME_LEN: usize = 42;

/// Why a neighbour was not resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NeighborError {
    /// No ARP Reply within the timeout (`-ETIMEDOUT`; Linux: the neighbour entry
    /// becomes FAILED).
    #[error("no ARP reply within the timeout")]
    TimedOut,
    /// The address is not on the device's subnet, or not a unicast host address: ARP
    /// cannot reach it (`-EHOSTUNREACH`; resolve the gateway instead).
    #[error("{0} is not a unicast address on the device's subnet")]
    NotOnLink(Ipv4Addr),
    /// The device is gone or shut down before an answer came (`-ENODEV`).
    #[error("the device is gone")]
    DeviceGone,
}

/// The outcome of a resolution: the neighbour's Ethernet address.
pub type NeighborResult = Result<[u8; 6], NeighborError>;

/// The completion of one resolution: called exactly once, with the outcome. Dropping it
/// uncalled (the device ended with the resolution pending, or the request never
/// reached the engine) completes it with [`NeighborError::DeviceGone`].
pub struct NeighborReply(Option<Box<dyn FnOnce(NeighborResult) + Send>>);

impl NeighborReply {
    /// A completion calling `done`. It runs on the thread that drove the device (the
    /// engine thread, or an application thread inside a verbs call), after the progress
    /// lock is released, or on the thread of the call that failed at once: it should
    /// only enqueue, never block.
    pub fn new(done: impl FnOnce(NeighborResult) + Send + 'static) -> Self {
        NeighborReply(Some(Box::new(done)))
    }

    /// Completes with `result`.
    pub fn complete(mut self, result: NeighborResult) {
        if let Some(done) = self.0.take() {
            // The caller's closure: inside a progress pass it runs after unlock.
            crate::progress_outbox::defer_call(move || done(result));
        }
    }
}

impl Drop for NeighborReply {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            crate::progress_outbox::defer_call(move || done(Err(NeighborError::DeviceGone)));
        }
    }
}

impl std::fmt::Debug for NeighborReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NeighborReply")
            .field("pending", &self.0.is_some())
            .finish()
    }
}

struct Query {
    ip: Ipv4Addr,
    deadline: Instant,
    next_probe: Instant,
    reply: NeighborReply,
}

/// The resolutions in progress and the neighbours learned from ARP (sans-IO: time is
/// passed in, frames are handed in and out).
#[derive(Default)]
pub struct Neighbors {
    learned: HashMap<Ipv4Addr, ([u8; 6], Instant)>,
    queries: Vec<Query>,
}

impl std::fmt::Debug for Neighbors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Neighbors")
            .field("learned", &self.learned.len())
            .field("pending", &self.queries.len())
            .finish()
    }
}

impl Neighbors {
    /// Starts resolving `ip` at `now`, giving up at `now + timeout`: answered at once if
    /// `ip` was learned less than [`CACHE_LIFETIME`] ago, else by a later
    /// [`Neighbors::learn`] or [`Neighbors::poll`] (which sends the first Request).
    pub fn start(&mut self, ip: Ipv4Addr, timeout: Duration, now: Instant, reply: NeighborReply) {
        if let Some(&(mac, at)) = self.learned.get(&ip) {
            if now < at + CACHE_LIFETIME {
                reply.complete(Ok(mac));
                return;
            }
        }
        self.queries.push(Query {
            ip,
            deadline: now + timeout,
            next_probe: now,
            reply,
        });
    }

    /// Records that `ip` is at `mac` (seen at `now`) and completes its resolutions.
    pub fn learn(&mut self, ip: Ipv4Addr, mac: [u8; 6], now: Instant) {
        self.learned.insert(ip, (mac, now));
        let mut i = 0;
        while i < self.queries.len() {
            if self.queries[i].ip == ip {
                let q = self.queries.swap_remove(i);
                tracing::debug!(%ip, mac = %EthernetAddress(mac), "neighbour resolved");
                q.reply.complete(Ok(mac));
            } else {
                i += 1;
            }
        }
    }

    /// Resolutions in progress.
    pub fn pending(&self) -> usize {
        self.queries.len()
    }

    /// Times out what is due at `now` and calls `probe(ip)` for each address whose next
    /// ARP Request is due (once per address per call). Returns when to be polled again.
    pub fn poll(&mut self, now: Instant, mut probe: impl FnMut(Ipv4Addr)) -> Option<Instant> {
        let mut probed: Vec<Ipv4Addr> = Vec::new();
        let mut next: Option<Instant> = None;
        let mut i = 0;
        while i < self.queries.len() {
            let q = &mut self.queries[i];
            if now >= q.deadline {
                let q = self.queries.swap_remove(i);
                tracing::debug!(ip = %q.ip, "neighbour resolution timed out");
                q.reply.complete(Err(NeighborError::TimedOut));
                continue;
            }
            if now >= q.next_probe {
                if !probed.contains(&q.ip) {
                    probed.push(q.ip);
                    probe(q.ip);
                }
                q.next_probe = now + PROBE_INTERVAL;
            }
            let t = q.next_probe.min(q.deadline);
            next = Some(next.map_or(t, |n: Instant| n.min(t)));
            i += 1;
        }
        next
    }
}

/// The sender of an Ethernet frame carrying an IPv4-over-Ethernet ARP Request or Reply:
/// `(sender protocol address, sender hardware address)`; `None` for anything else,
/// malformed input included (never panics).
pub fn arp_sender(frame: &[u8]) -> Option<(Ipv4Addr, [u8; 6])> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Arp {
        return None;
    }
    let arp = ArpPacket::new_checked(eth.payload()).ok()?;
    let ArpRepr::EthernetIpv4 {
        operation,
        source_hardware_addr,
        source_protocol_addr,
        ..
    } = ArpRepr::parse(&arp).ok()?
    else {
        return None;
    };
    if !matches!(operation, ArpOperation::Request | ArpOperation::Reply)
        || !source_hardware_addr.is_unicast()
        || source_protocol_addr.is_unspecified()
    {
        return None;
    }
    Some((source_protocol_addr, source_hardware_addr.0))
}

/// Writes a broadcast ARP Request "who has `target`, tell `ip` at `mac`" into `frame`
/// ([`ARP_FRAME_LEN`] bytes; RFC 826, Target Hardware Address zero).
pub fn emit_arp_request(frame: &mut [u8], mac: [u8; 6], ip: Ipv4Addr, target: Ipv4Addr) {
    let mut eth = EthernetFrame::new_unchecked(frame);
    EthernetRepr {
        src_addr: EthernetAddress(mac),
        dst_addr: EthernetAddress::BROADCAST,
        ethertype: EthernetProtocol::Arp,
    }
    .emit(&mut eth);
    let mut arp = ArpPacket::new_unchecked(eth.payload_mut());
    ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: EthernetAddress(mac),
        source_protocol_addr: ip,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: target,
    }
    .emit(&mut arp);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn reply() -> (NeighborReply, mpsc::Receiver<NeighborResult>) {
        let (tx, rx) = mpsc::channel();
        (
            NeighborReply::new(move |r| {
                let _ = tx.send(r);
            }),
            rx,
        )
    }

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const MAC: [u8; 6] = [2, 0, 10, 0, 0, 2];

    #[test]
    fn a_request_round_trips_through_the_parser() {
        let mut f = [0u8; ARP_FRAME_LEN];
        emit_arp_request(&mut f, MAC, A, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(&f[..6], &[0xff; 6], "broadcast");
        assert_eq!(&f[12..14], &[0x08, 0x06], "ARP ethertype");
        assert_eq!(arp_sender(&f), Some((A, MAC)));
        // Truncated or foreign frames are not ARP senders.
        assert_eq!(arp_sender(&f[..30]), None);
        f[12] = 0x08;
        f[13] = 0x00;
        assert_eq!(arp_sender(&f), None);
        assert_eq!(arp_sender(&[]), None);
    }

    #[test]
    fn probes_every_interval_until_learned_or_timed_out() {
        let mut n = Neighbors::default();
        let t0 = Instant::from_secs(5);
        let (r1, rx1) = reply();
        let (r2, rx2) = reply();
        n.start(A, Duration::from_millis(2500), t0, r1);
        n.start(
            Ipv4Addr::new(10, 0, 0, 3),
            Duration::from_millis(1500),
            t0,
            r2,
        );
        let mut probes = Vec::new();
        assert_eq!(n.poll(t0, |ip| probes.push(ip)), Some(t0 + PROBE_INTERVAL));
        assert_eq!(probes.len(), 2, "one Request each, at once");
        // Nothing due: no new Request.
        n.poll(t0 + Duration::from_millis(500), |ip| probes.push(ip));
        assert_eq!(probes.len(), 2);
        n.poll(t0 + PROBE_INTERVAL, |ip| probes.push(ip));
        assert_eq!(probes.len(), 4, "the second Request each");
        // .3 times out at 1.5 s.
        n.poll(t0 + Duration::from_millis(1500), |ip| probes.push(ip));
        assert_eq!(rx2.try_recv(), Ok(Err(NeighborError::TimedOut)));
        assert!(rx1.try_recv().is_err());
        n.learn(A, MAC, t0 + Duration::from_millis(1600));
        assert_eq!(rx1.try_recv(), Ok(Ok(MAC)));
        assert_eq!(n.pending(), 0);
        assert_eq!(
            n.poll(t0 + Duration::from_secs(2), |_| panic!("no probe")),
            None
        );
        // Learned: answered at once, until the entry is too old.
        let (r3, rx3) = reply();
        n.start(A, Duration::from_secs(1), t0 + Duration::from_secs(10), r3);
        assert_eq!(rx3.try_recv(), Ok(Ok(MAC)));
        let (r4, rx4) = reply();
        n.start(A, Duration::from_secs(1), t0 + Duration::from_secs(100), r4);
        assert!(rx4.try_recv().is_err());
        assert_eq!(n.pending(), 1);
        drop(n);
        assert_eq!(
            rx4.try_recv(),
            Ok(Err(NeighborError::DeviceGone)),
            "dropped pending"
        );
    }
}
