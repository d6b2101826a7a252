//! smoltcp glue: a [`smoltcp::phy::Device`] over any [`Link`], an `Interface` builder and
//! a TCP socket builder with the soft device's defaults.
//!
//! [`LinkDevice`] owns one receive and one transmit buffer, each `max_frame_len()` bytes,
//! allocated once: a frame is read straight into the receive buffer (for a TAP, by the
//! `read(2)` itself; no per-receive zero-fill, unlike smoltcp's `TunTapInterface`, see
//! transport-notes.md), and smoltcp builds each outgoing frame in the transmit buffer,
//! which is then handed to [`Link::send`] (for a TAP, `write(2)` from it).
//!
//! Link errors never reach smoltcp: a failed send is counted (the frame is lost, TCP
//! retransmits) and the link reports the state change through [`Link::poll_event`],
//! which the engine polls. While the link is not up, `transmit` offers no token, so smoltcp
//! keeps what it has to send (its timers, including the TCP user timeout, keep running).
//!
//! # Offload
//!
//! Over a link that offloads TCP ([`Link::tcp_offload`], a TAP opened with
//! `TapOffload::Tcp4`), read once when the device is made: the buffers are
//! [`OFFLOAD_MAX_FRAME`] bytes; the capabilities turn smoltcp's TCP checksums off (the
//! link completes them on send; smoltcp requires that for segmentation) and give it a
//! TSO limit of [`tso_payload_max`] payload bytes; every TCP frame goes out through
//! [`Link::send_tcp_offload`] with smoltcp's `segmentation_offload_size`. On receive,
//! a frame the link did not vouch for ([`RxCsum::Unverified`]) has its TCP checksum
//! checked here, and a bad one is dropped and counted ([`DeviceStats::rx_csum_errors`]).
//!
//! # Example
//!
//! ```
//! use std::net::Ipv4Addr;
//! use softiwarp::link::{MemoryConfig, MemoryLink};
//! use softiwarp::transport::smoltcp_glue::{build_interface, InterfaceConfig, LinkDevice, TcpConfig};
//! use softiwarp::smoltcp::{iface::SocketSet, time::Instant};
//!
//! let (a, _b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
//! let mut dev = LinkDevice::new(a);
//! let cfg = InterfaceConfig {
//!     mac: [0x02, 0, 0, 0, 0, 1],
//!     address: Ipv4Addr::new(10, 0, 0, 1),
//!     prefix_len: 24,
//!     gateway: None,
//!     random_seed: 7,
//! };
//! let now = Instant::from_millis(0);
//! let mut iface = build_interface(&cfg, &mut dev, now).unwrap();
//! let mut sockets = SocketSet::new(Vec::new());
//! let tcp = sockets.add(TcpConfig::default().socket().unwrap());
//! iface.poll(now, &mut dev, &mut sockets);
//! ```

use std::net::Ipv4Addr;
use std::num::{NonZeroU16, NonZeroUsize};
use std::time::Duration;

use smoltcp::iface::{Config, Interface};
use smoltcp::phy::{Checksum, Device, DeviceCapabilities, Medium, PacketMeta, RxToken, TxToken};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};

use crate::link::offload::{fill_tcp_csum, tcp4_layout, tcp_csum_ok};
use crate::link::{Link, LinkError, RxCsum, OFFLOAD_MAX_FRAME};

/// Length in bytes of an IPv4 header without options (RFC 791).
pub const IPV4_HEADER_LEN: usize = 20;
/// Length in bytes of a TCP header without options (RFC 9293).
pub const TCP_HEADER_LEN: usize = 20;

/// The TCP MSS in bytes for an IP MTU in bytes: `mtu - 40` (IPv4 and TCP headers without
/// options; RFC 9293 3.7.1), 0 for an MTU under 40. This is what smoltcp announces and
/// uses for an interface of that MTU, since it sends no TCP options in data segments
/// unless timestamps are enabled (they are not here).
pub fn mss_for_mtu(mtu: usize) -> usize {
    mtu.saturating_sub(IPV4_HEADER_LEN + TCP_HEADER_LEN)
}

/// Frame counters of a [`LinkDevice`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Frames received and handed to smoltcp.
    pub rx_frames: u64,
    /// Bytes of those frames (Ethernet header included).
    pub rx_bytes: u64,
    /// Frames smoltcp sent that the link accepted.
    pub tx_frames: u64,
    /// Bytes of those frames (Ethernet header included).
    pub tx_bytes: u64,
    /// Receive calls that failed (link gone, OS error).
    pub rx_errors: u64,
    /// Frames smoltcp sent that the link refused (link down or gone, OS error); lost.
    pub tx_errors: u64,
    /// TCP super-segments sent for the link to cut ([`Link::send_tcp_offload`] with a
    /// segment size), included in `tx_frames`.
    pub tx_super_segments: u64,
    /// Coalesced frames received (more than one segment's payload), in `rx_frames`.
    pub rx_coalesced: u64,
    /// Received TCP frames dropped for a wrong checksum, verified here because the link
    /// offloads checksums and had not verified them ([`RxCsum::Unverified`]).
    pub rx_csum_errors: u64,
}

/// Largest TCP payload in bytes of one super-segment for an IP MTU in bytes, with TCP
/// segmentation offload: the most whole MSS-sized segments (`mss_for_mtu`) that fit in
/// one IPv4 datagram of 65535 bytes with 40 bytes of headers (at MTU 1500: 44 x 1460 =
/// 64240). Whole segments, so that a super-segment smoltcp cuts at this size ends where
/// its segments would have ended without the offload.
pub fn tso_payload_max(mtu: usize) -> usize {
    let mss = mss_for_mtu(mtu).max(1);
    let room = 65_535 - IPV4_HEADER_LEN - TCP_HEADER_LEN;
    (room / mss).max(1) * mss
}

/// A smoltcp device over a [`Link`]. See the [module docs](self).
#[derive(Debug)]
pub struct LinkDevice<L> {
    link: L,
    rx_buf: Vec<u8>,
    tx_buf: Vec<u8>,
    stats: DeviceStats,
    /// The link does the TCP offloads ([`Link::tcp_offload`], read once at `new`).
    offload: bool,
}

impl<L: Link> LinkDevice<L> {
    /// Wraps `link`, allocating its two frame buffers (`max_frame_len()` bytes each, or
    /// [`OFFLOAD_MAX_FRAME`] when the link offloads TCP).
    pub fn new(link: L) -> Self {
        let offload = link.tcp_offload();
        let n = if offload {
            OFFLOAD_MAX_FRAME.max(link.max_frame_len())
        } else {
            link.max_frame_len()
        };
        LinkDevice {
            link,
            rx_buf: vec![0; n],
            tx_buf: vec![0; n],
            stats: DeviceStats::default(),
            offload,
        }
    }

    /// Whether the device hands TCP checksums and segmentation to its link ([module
    /// docs](self), "Offload").
    pub fn offload(&self) -> bool {
        self.offload
    }

    /// The largest TCP payload in bytes smoltcp puts in one frame: with the offload
    /// [`tso_payload_max`] of the link's MTU, else the MSS.
    pub fn tcp_payload_max(&self) -> usize {
        if self.offload {
            tso_payload_max(self.link.mtu())
        } else {
            mss_for_mtu(self.link.mtu())
        }
    }

    /// The link.
    pub fn link(&self) -> &L {
        &self.link
    }

    /// The link, mutably (to poll events or fail a memory link).
    pub fn link_mut(&mut self) -> &mut L {
        &mut self.link
    }

    /// Unwraps the link.
    pub fn into_link(self) -> L {
        self.link
    }

    /// Frame counters so far.
    pub fn stats(&self) -> DeviceStats {
        self.stats
    }

    /// Reads the next frame into the receive buffer and returns its length in bytes
    /// (`None`: nothing pending, or a receive error, counted). The first half of
    /// `receive`, for a wrapper that looks at the frame ([`LinkDevice::rx_frame`])
    /// before it hands out the tokens ([`LinkDevice::tokens`]).
    pub(crate) fn fill_rx(&mut self) -> Option<usize> {
        loop {
            match self.link.recv_meta(&mut self.rx_buf) {
                Ok(Some(m)) => {
                    let n = m.len;
                    self.stats.rx_frames += 1;
                    self.stats.rx_bytes += n as u64;
                    if self.offload && !self.rx_checked(n, m.csum) {
                        self.stats.rx_csum_errors += 1;
                        continue;
                    }
                    if m.gso_size.is_some() {
                        self.stats.rx_coalesced += 1;
                    }
                    return Some(n);
                }
                Ok(None) => return None,
                Err(e) => {
                    self.stats.rx_errors += 1;
                    tracing::trace!(link = self.link.name(), error = %e, "receive failed");
                    return None;
                }
            }
        }
    }

    /// With the offload smoltcp verifies no TCP checksum (it cannot tell per frame
    /// whether one is complete), so it is done here: an unverified frame's is checked
    /// (`false`: drop it); a partial one is trusted ([`RxCsum::Partial`]) and, for a
    /// segment without payload (an ACK, SYN, FIN, RST), completed, since the transport's
    /// segment tracker reads the windows of such frames only when their checksums are
    /// right (`seg_tracker::parse_seg`); a payload's checksum is not computed.
    fn rx_checked(&mut self, n: usize, csum: RxCsum) -> bool {
        let frame = &mut self.rx_buf[..n];
        match csum {
            RxCsum::Unverified => tcp_csum_ok(frame),
            RxCsum::Partial => {
                if tcp4_layout(frame).is_some_and(|(_, doff, tcp_len)| tcp_len == doff) {
                    fill_tcp_csum(frame);
                }
                true
            }
            RxCsum::Valid => true,
        }
    }

    /// The `n`-byte frame [`LinkDevice::fill_rx`] read.
    pub(crate) fn rx_frame(&self, n: usize) -> &[u8] {
        &self.rx_buf[..n]
    }

    /// The tokens of the `n`-byte frame [`LinkDevice::fill_rx`] read.
    pub(crate) fn tokens(&mut self, n: usize) -> (LinkRxToken<'_>, LinkTxToken<'_, L>) {
        let LinkDevice {
            link,
            rx_buf,
            tx_buf,
            stats,
            offload,
        } = self;
        (
            LinkRxToken {
                frame: &rx_buf[..n],
            },
            LinkTxToken {
                link,
                buf: tx_buf,
                stats,
                offload: *offload,
                gso_size: None,
            },
        )
    }
}

/// Receive token: the frame just read, borrowed from the device's receive buffer.
#[derive(Debug)]
pub struct LinkRxToken<'a> {
    frame: &'a [u8],
}

impl RxToken for LinkRxToken<'_> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        f(self.frame)
    }
}

/// Transmit token: builds the frame in the device's transmit buffer, then sends it.
#[derive(Debug)]
pub struct LinkTxToken<'a, L> {
    link: &'a mut L,
    buf: &'a mut Vec<u8>,
    stats: &'a mut DeviceStats,
    offload: bool,
    /// smoltcp's `PacketMeta::segmentation_offload_size` for this frame.
    gso_size: Option<NonZeroU16>,
}

impl<L: Link> TxToken for LinkTxToken<'_, L> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        if self.buf.len() < len {
            // smoltcp never asks for more than the MTU it was given; grow rather than fail.
            self.buf.resize(len, 0);
        }
        let frame = &mut self.buf[..len];
        let r = f(frame);
        let sent = if self.offload {
            // Every TCP frame has its checksum left to the link (capabilities()).
            let gso = self.gso_size.map(NonZeroU16::get);
            self.stats.tx_super_segments += u64::from(gso.is_some());
            self.link.send_tcp_offload(frame, gso)
        } else {
            self.link.send(frame)
        };
        match sent {
            Ok(()) => {
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += len as u64;
            }
            Err(e) => {
                self.stats.tx_errors += 1;
                tracing::trace!(link = self.link.name(), error = %e, "frame not sent");
            }
        }
        r
    }

    fn set_meta(&mut self, meta: PacketMeta) {
        self.gso_size = meta.segmentation_offload_size;
    }
}

impl<L: Link> Device for LinkDevice<L> {
    type RxToken<'a>
        = LinkRxToken<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = LinkTxToken<'a, L>
    where
        Self: 'a;

    fn receive(&mut self, _timestamp: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let n = self.fill_rx()?;
        Some(self.tokens(n))
    }

    fn transmit(&mut self, _timestamp: Instant) -> Option<Self::TxToken<'_>> {
        // A link that is not up would refuse the frame; tell smoltcp to hold it instead.
        if !self.link.state().is_up() {
            return None;
        }
        Some(LinkTxToken {
            link: &mut self.link,
            buf: &mut self.tx_buf,
            stats: &mut self.stats,
            offload: self.offload,
            gso_size: None,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        // smoltcp's MTU for Ethernet includes the 14-byte header.
        caps.max_transmission_unit = self.link.max_frame_len();
        caps.max_burst_size = None;
        if self.offload {
            // The link completes TCP checksums on send, and received ones are checked
            // in `fill_rx` (smoltcp requires TX checksum offload with segmentation).
            caps.checksum.tcp = Checksum::None;
            caps.segmentation.tcpv4 = NonZeroUsize::new(
                caps.max_transmission_unit - self.link.mtu()
                    + IPV4_HEADER_LEN
                    + TCP_HEADER_LEN
                    + tso_payload_max(self.link.mtu()),
            );
        }
        caps
    }
}

/// Configuration of one smoltcp `Interface`: Ethernet with ARP, one IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterfaceConfig {
    /// Unicast Ethernet MAC address (bit 0 of the first octet clear, not all zero).
    pub mac: [u8; 6],
    /// The interface's IPv4 address (unicast).
    pub address: Ipv4Addr,
    /// Prefix length in bits of the attached subnet, 0..=32.
    pub prefix_len: u8,
    /// Default gateway, inside the subnet; `None` for on-link peers only.
    pub gateway: Option<Ipv4Addr>,
    /// Seed of smoltcp's random numbers (ephemeral ports, initial sequence numbers); use a
    /// different one per run outside tests.
    pub random_seed: u64,
}

/// Builds a smoltcp `Interface` for `device` as `config` says, at time `now`.
///
/// ARP is smoltcp's (Ethernet medium): it answers for `address` and resolves peers, with
/// its neighbor cache (60 s entries).
///
/// Errors: [`LinkError::Config`] for a multicast or zero MAC, a non-unicast address, a
/// prefix over 32, or a gateway outside the subnet (smoltcp would panic on the first two).
pub fn build_interface<L: Link>(
    config: &InterfaceConfig,
    device: &mut LinkDevice<L>,
    now: Instant,
) -> Result<Interface, LinkError> {
    let mac = EthernetAddress(config.mac);
    if !mac.is_unicast() || config.mac == [0; 6] {
        return Err(LinkError::Config(format!(
            "MAC {mac} is not a unicast address"
        )));
    }
    let a = config.address;
    if a.is_unspecified() || a.is_multicast() || a.is_broadcast() {
        return Err(LinkError::Config(format!(
            "IPv4 address {a} is not unicast"
        )));
    }
    if config.prefix_len > 32 {
        return Err(LinkError::Config(format!(
            "prefix length {} exceeds 32",
            config.prefix_len
        )));
    }
    let cidr = IpCidr::new(IpAddress::Ipv4(a), config.prefix_len);
    if let Some(gw) = config.gateway {
        if !cidr.contains_addr(&IpAddress::Ipv4(gw)) || gw == a {
            return Err(LinkError::Config(format!(
                "gateway {gw} is not another host of {cidr}"
            )));
        }
    }
    let mut cfg = Config::new(HardwareAddress::Ethernet(mac));
    cfg.random_seed = config.random_seed;
    let mut iface = Interface::new(cfg, device, now);
    iface.update_ip_addrs(|addrs| {
        // The address list holds at least one entry (IFACE_MAX_ADDR_COUNT >= 1).
        let _ = addrs.push(cidr);
    });
    if let Some(gw) = config.gateway {
        iface
            .routes_mut()
            .add_default_ipv4_route(gw)
            .map_err(|_| LinkError::Config("route table full".into()))?;
    }
    Ok(iface)
}

/// TCP socket settings. Defaults: 256 KiB buffers each way (faster than bigger ones,
/// transport-notes.md), Nagle off, keep-alive every 5 s, user timeout 20 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpConfig {
    /// Receive buffer in bytes, 1..=1 GiB. It is the advertised window; smoltcp picks the
    /// window scale (RFC 7323) from it (shift 3 for 256 KiB).
    pub rx_buffer: usize,
    /// Transmit buffer in bytes, 1..=1 GiB. The stack rounds it down to a whole number of
    /// segments ([`TcpConfig::socket_for_mss`]).
    pub tx_buffer: usize,
    /// Nagle's algorithm (RFC 896); off for iWARP, where each FPDU goes out at once.
    pub nagle: bool,
    /// Idle time after which a keep-alive probe is sent; `None` disables keep-alive.
    pub keep_alive: Option<Duration>,
    /// User timeout (RFC 9293 3.8.4): the connection is aborted if the peer sends nothing
    /// for this long while data is outstanding, keep-alive is on, or a connect is pending.
    /// Must exceed `keep_alive`. `None` disables it.
    pub timeout: Option<Duration>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            rx_buffer: 256 * 1024,
            tx_buffer: 256 * 1024,
            nagle: false,
            keep_alive: Some(Duration::from_secs(5)),
            timeout: Some(Duration::from_secs(20)),
        }
    }
}

/// Largest TCP buffer in bytes smoltcp accepts: 1 GiB (window scale 14, RFC 7323 2.3).
pub const MAX_TCP_BUFFER: usize = 1 << 30;

fn to_smol(d: Duration) -> smoltcp::time::Duration {
    smoltcp::time::Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl TcpConfig {
    /// Checks the sizes and timers.
    ///
    /// Errors: [`LinkError::Config`] for an empty or over-1-GiB buffer, a zero keep-alive,
    /// or a timeout not longer than the keep-alive interval.
    pub fn validate(&self) -> Result<(), LinkError> {
        for (name, n) in [("rx_buffer", self.rx_buffer), ("tx_buffer", self.tx_buffer)] {
            if n == 0 || n > MAX_TCP_BUFFER {
                return Err(LinkError::Config(format!(
                    "{name} of {n} bytes is outside 1..={MAX_TCP_BUFFER}"
                )));
            }
        }
        if self.keep_alive == Some(Duration::ZERO) {
            return Err(LinkError::Config("keep_alive interval must be > 0".into()));
        }
        if let (Some(k), Some(t)) = (self.keep_alive, self.timeout) {
            if t <= k {
                return Err(LinkError::Config(format!(
                    "timeout {t:?} must exceed the keep-alive interval {k:?}"
                )));
            }
        }
        Ok(())
    }

    /// A new, closed smoltcp TCP socket with these settings.
    ///
    /// Errors: as [`TcpConfig::validate`].
    pub fn socket(&self) -> Result<tcp::Socket<'static>, LinkError> {
        self.socket_for_mss(0)
    }

    /// As [`TcpConfig::socket`], with the transmit buffer rounded down to a whole number
    /// of `mss`-byte segments when it holds at least two (`mss` 0: as configured).
    ///
    /// smoltcp's transmit buffer is a ring, restarted at its beginning whenever it is
    /// empty (as after the MPA exchange). With a whole number of EMSS-sized FPDUs in it,
    /// a stream of such FPDUs (MULPDU-sized ULPDUs, RFC 5044 8.1) never has one across the
    /// ring's end, so each is framed straight into the ring with one copy; one across the
    /// end would be framed into MPA's own buffer and copied again, and be sent as two
    /// segments. At MTU 65000 with 256 KiB that was one FPDU in four (the MPA stream
    /// gained about 3% of raw TCP's throughput from this; raw TCP, which writes 64 KiB
    /// pieces, gains nothing, docs/PERFORMANCE.md).
    ///
    /// Errors: as [`TcpConfig::validate`].
    pub fn socket_for_mss(&self, mss: usize) -> Result<tcp::Socket<'static>, LinkError> {
        self.validate()?;
        let tx_len = if mss > 0 && self.tx_buffer >= 2 * mss {
            self.tx_buffer - self.tx_buffer % mss
        } else {
            self.tx_buffer
        };
        let rx = tcp::SocketBuffer::new(vec![0u8; self.rx_buffer]);
        let tx = tcp::SocketBuffer::new(vec![0u8; tx_len]);
        let mut s = tcp::Socket::new(rx, tx);
        s.set_nagle_enabled(self.nagle);
        s.set_keep_alive(self.keep_alive.map(to_smol));
        s.set_timeout(self.timeout.map(to_smol));
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::{MemoryConfig, MemoryLink};

    fn cfg() -> InterfaceConfig {
        InterfaceConfig {
            mac: [0x02, 0, 0, 0, 0, 1],
            address: Ipv4Addr::new(10, 0, 0, 1),
            prefix_len: 24,
            gateway: Some(Ipv4Addr::new(10, 0, 0, 254)),
            random_seed: 1,
        }
    }

    #[test]
    fn the_transmit_ring_holds_whole_segments() {
        let c = TcpConfig::default();
        assert_eq!(c.socket().unwrap().send_capacity(), 256 * 1024);
        assert_eq!(c.socket_for_mss(0).unwrap().send_capacity(), 256 * 1024);
        assert_eq!(c.socket_for_mss(1460).unwrap().send_capacity(), 179 * 1460);
        assert_eq!(c.socket_for_mss(64960).unwrap().send_capacity(), 4 * 64960);
        // Fewer than two segments: as configured.
        let small = TcpConfig {
            tx_buffer: 3000,
            ..c
        };
        assert_eq!(small.socket_for_mss(1460).unwrap().send_capacity(), 2920);
        assert_eq!(small.socket_for_mss(1501).unwrap().send_capacity(), 3000);
        assert_eq!(c.socket_for_mss(1460).unwrap().recv_capacity(), 256 * 1024);
    }

    #[test]
    fn tso_limit_is_whole_segments_in_one_datagram() {
        assert_eq!(tso_payload_max(1500), 44 * 1460);
        assert_eq!(tso_payload_max(9000), 7 * 8960);
        assert_eq!(tso_payload_max(65000), 64960);
        assert_eq!(tso_payload_max(65521), 65481);
        // A memory link never offloads: its device keeps smoltcp's checksums and MSS.
        let (a, _b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let dev = LinkDevice::new(a);
        assert!(!dev.offload());
        assert_eq!(dev.tcp_payload_max(), 1460);
        let caps = dev.capabilities();
        assert!(caps.segmentation.tcpv4.is_none());
        assert!(caps.checksum.tcp.rx() && caps.checksum.tcp.tx());
    }

    #[test]
    fn mss_is_mtu_minus_40() {
        assert_eq!(mss_for_mtu(1500), 1460);
        assert_eq!(mss_for_mtu(9000), 8960);
        assert_eq!(mss_for_mtu(65521), 65481);
        assert_eq!(mss_for_mtu(30), 0);
    }

    #[test]
    fn capabilities_follow_the_link() {
        let (a, _b) = MemoryLink::pair(MemoryConfig {
            mtu: 9000,
            ..Default::default()
        })
        .unwrap();
        let dev = LinkDevice::new(a);
        let caps = dev.capabilities();
        assert_eq!(caps.medium, Medium::Ethernet);
        assert_eq!(caps.max_transmission_unit, 9014);
        assert_eq!(caps.ip_mtu(), 9000);
        assert_eq!(dev.rx_buf.len(), 9014);
    }

    #[test]
    fn interface_config_is_validated() {
        let (a, _b) = MemoryLink::pair(MemoryConfig::default()).unwrap();
        let mut dev = LinkDevice::new(a);
        let now = Instant::from_micros(0);
        let iface = build_interface(&cfg(), &mut dev, now).unwrap();
        assert_eq!(iface.ipv4_addr(), Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(
            iface.hardware_addr(),
            HardwareAddress::Ethernet(EthernetAddress([2, 0, 0, 0, 0, 1]))
        );
        let bad = [
            InterfaceConfig {
                mac: [0x01, 0, 0, 0, 0, 1],
                ..cfg()
            },
            InterfaceConfig {
                mac: [0; 6],
                ..cfg()
            },
            InterfaceConfig {
                address: Ipv4Addr::UNSPECIFIED,
                ..cfg()
            },
            InterfaceConfig {
                address: Ipv4Addr::new(224, 0, 0, 1),
                ..cfg()
            },
            InterfaceConfig {
                prefix_len: 33,
                ..cfg()
            },
            InterfaceConfig {
                gateway: Some(Ipv4Addr::new(10, 0, 1, 1)),
                ..cfg()
            },
            InterfaceConfig {
                gateway: Some(Ipv4Addr::new(10, 0, 0, 1)),
                ..cfg()
            },
        ];
        for b in bad {
            assert!(
                matches!(
                    build_interface(&b, &mut dev, now),
                    Err(LinkError::Config(_))
                ),
                "{b:?}"
            );
        }
    }

    #[test]
    fn tcp_config_defaults_and_checks() {
        let c = TcpConfig::default();
        let s = c.socket().unwrap();
        assert_eq!(s.recv_capacity(), 256 * 1024);
        assert_eq!(s.send_capacity(), 256 * 1024);
        assert!(!s.nagle_enabled());
        assert_eq!(s.keep_alive(), Some(smoltcp::time::Duration::from_secs(5)));
        assert_eq!(s.timeout(), Some(smoltcp::time::Duration::from_secs(20)));
        for bad in [
            TcpConfig { rx_buffer: 0, ..c },
            TcpConfig {
                tx_buffer: MAX_TCP_BUFFER + 1,
                ..c
            },
            TcpConfig {
                keep_alive: Some(Duration::ZERO),
                ..c
            },
            TcpConfig {
                timeout: Some(Duration::from_secs(5)),
                ..c
            },
        ] {
            assert!(matches!(bad.socket(), Err(LinkError::Config(_))), "{bad:?}");
        }
        let none = TcpConfig {
            keep_alive: None,
            timeout: None,
            ..c
        };
        assert!(none.socket().is_ok());
    }
}
