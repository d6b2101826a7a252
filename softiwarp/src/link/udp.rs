//! UDP link: each Ethernet frame is one UDP datagram between two fixed endpoints, as
//! QEMU's `-netdev dgram` (and its older `-netdev socket,udp=`) carries a guest's frames.
//!
//! Two processes on one host, or on two hosts, join their soft devices this way with no
//! root, no TAP and no bridge: each binds `bind` and sends to `peer`. The socket is
//! `connect(2)`ed to `peer`, so the kernel delivers only the peer's datagrams (anything
//! else sent to our port is dropped before we see it) and the link carries exactly one
//! conversation.
//!
//! A datagram is a whole frame or nothing (UDP keeps boundaries), so the link needs no
//! framing of its own. The largest datagram over IPv4 carries 65,507 bytes of payload
//! (65,535 less the 20-byte IP and 8-byte UDP headers), so the IP MTU is at most
//! [`UDP_MAX_MTU`] = 65,493 (less the 14-byte Ethernet header). Over the loopback
//! interface (MTU 65,536) no datagram is fragmented; between hosts a large MTU means IP
//! fragmentation of every datagram, so pick the MTU of the path less 42 bytes there.
//!
//! Like a NIC, the link drops silently what cannot go out: a full socket buffer
//! (`EAGAIN`) or a peer not listening yet (the `ECONNREFUSED` of an ICMP port
//! unreachable, reported on a later call); TCP above retransmits. It has no link state:
//! it is `Up` from open to drop (a peer that went away is a silent one, as a cable
//! pulled at the far end of a switch). The pcap and fault middlewares wrap it as any
//! other [`Link`].

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};

use super::{check_mtu, Link, LinkError, LinkEvent};

/// Largest IP MTU of a UDP link over IPv4, in bytes: 65,507 bytes of UDP payload less
/// the 14-byte Ethernet header.
pub const UDP_MAX_MTU: usize = 65_507 - super::ETHERNET_HEADER_LEN;

/// Socket receive and send buffer the link asks for, in bytes: 4 MiB (the kernel caps
/// it at `net.core.rmem_max` / `wmem_max` for an unprivileged process). A 256 KiB TCP
/// window of 1,514-byte frames is about 180 datagrams; the default buffer (208 KiB of
/// accounted memory, about 2 bytes per payload byte) drops some of them at full speed.
pub const UDP_SOCKET_BUFFER: usize = 4 << 20;

/// Configuration of a [`UdpLink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpConfig {
    /// Local address and port to bind (`0.0.0.0:PORT`, `127.0.0.1:PORT`, ...).
    pub bind: SocketAddr,
    /// The other end's address and port: frames go there, and only its datagrams are
    /// received.
    pub peer: SocketAddr,
    /// IP MTU in bytes, 68..=[`UDP_MAX_MTU`]. Default 1500.
    pub mtu: usize,
}

impl UdpConfig {
    /// `bind` to `peer` with an MTU of 1500 bytes.
    pub fn new(bind: SocketAddr, peer: SocketAddr) -> Self {
        UdpConfig {
            bind,
            peer,
            mtu: 1500,
        }
    }
}

/// One end of a UDP link (see the [module docs](self)).
#[derive(Debug)]
pub struct UdpLink {
    sock: UdpSocket,
    name: String,
    mtu: usize,
    /// Frames dropped on send (full socket buffer, peer not listening).
    dropped: u64,
}

impl UdpLink {
    /// Binds `cfg.bind`, connects to `cfg.peer`, sets the socket non-blocking with
    /// [`UDP_SOCKET_BUFFER`]-byte buffers (as far as the kernel allows).
    ///
    /// Errors: [`LinkError::Config`] (MTU out of range, `bind` and `peer` of different
    /// address families), [`LinkError::Io`] (the address is in use or not local, ...).
    pub fn open(cfg: &UdpConfig) -> Result<UdpLink, LinkError> {
        check_mtu(cfg.mtu, UDP_MAX_MTU)?;
        if cfg.bind.is_ipv4() != cfg.peer.is_ipv4() {
            return Err(LinkError::Config(format!(
                "bind address {} and peer {} are of different families",
                cfg.bind, cfg.peer
            )));
        }
        let sock = UdpSocket::bind(cfg.bind).map_err(|e| LinkError::io("bind the UDP link", e))?;
        sock.connect(cfg.peer)
            .map_err(|e| LinkError::io("connect the UDP link to its peer", e))?;
        sock.set_nonblocking(true)
            .map_err(|e| LinkError::io("set the UDP link non-blocking", e))?;
        // Best effort: the kernel caps both at its *_max sysctls.
        use nix::sys::socket::{setsockopt, sockopt};
        let _ = setsockopt(&sock, sockopt::RcvBuf, &UDP_SOCKET_BUFFER);
        let _ = setsockopt(&sock, sockopt::SndBuf, &UDP_SOCKET_BUFFER);
        let local = sock
            .local_addr()
            .map_err(|e| LinkError::io("read the UDP link's address", e))?;
        Ok(UdpLink {
            sock,
            name: format!("udp:{local}>{}", cfg.peer),
            mtu: cfg.mtu,
            dropped: 0,
        })
    }

    /// The bound local address (with the port the kernel chose when `bind` had port 0).
    ///
    /// Errors: [`LinkError::Io`] if the socket cannot tell.
    pub fn local_addr(&self) -> Result<SocketAddr, LinkError> {
        self.sock
            .local_addr()
            .map_err(|e| LinkError::io("read the UDP link's address", e))
    }

    /// Frames dropped on send so far (full socket buffer, peer not listening).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// True for the errors a connected UDP socket reports when the peer is not (yet)
/// listening or the path is briefly unusable: the frame is dropped, as on a wire.
fn transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        WouldBlock | ConnectionRefused | HostUnreachable | NetworkUnreachable
    )
}

impl Link for UdpLink {
    fn name(&self) -> &str {
        &self.name
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        loop {
            match self.sock.recv(buf) {
                // A datagram too short for an Ethernet header is nobody's frame.
                Ok(n) if n < super::ETHERNET_HEADER_LEN => continue,
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                // The ICMP error of an earlier send to a peer not listening: skip it.
                Err(e) if transient(&e) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(LinkError::io("receive from the UDP link", e)),
            }
        }
    }

    fn send(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        if frame.len() > self.max_frame_len() {
            return Err(LinkError::FrameTooLarge {
                len: frame.len(),
                max: self.max_frame_len(),
            });
        }
        loop {
            match self.sock.send(frame) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if transient(&e) => {
                    self.dropped += 1;
                    return Ok(());
                }
                Err(e) => return Err(LinkError::io("send on the UDP link", e)),
            }
        }
    }

    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    fn poll_event(&mut self) -> Option<LinkEvent> {
        None
    }

    fn state(&self) -> LinkEvent {
        LinkEvent::Up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(mtu: usize) -> (UdpLink, UdpLink) {
        // Port 0 on both, then each connected to the other's real port.
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (pa, pb) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        drop((a, b));
        let la = UdpLink::open(&UdpConfig {
            bind: pa,
            peer: pb,
            mtu,
        })
        .unwrap();
        let lb = UdpLink::open(&UdpConfig {
            bind: pb,
            peer: pa,
            mtu,
        })
        .unwrap();
        (la, lb)
    }

    fn frame(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
            .collect()
    }

    fn recv_one(l: &mut UdpLink, buf: &mut [u8]) -> usize {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            if let Some(n) = l.recv(buf).unwrap() {
                return n;
            }
            assert!(std::time::Instant::now() < deadline, "no frame within 5 s");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn frames_cross_whole_in_both_directions_and_nothing_is_pending_after() {
        let (mut a, mut b) = pair(9000);
        let mut buf = vec![0u8; b.max_frame_len()];
        for len in [14, 60, 1514, 9014] {
            a.send(&frame(len, 1)).unwrap();
            let n = recv_one(&mut b, &mut buf);
            assert_eq!(&buf[..n], &frame(len, 1)[..]);
            b.send(&frame(len, 2)).unwrap();
            let n = recv_one(&mut a, &mut buf);
            assert_eq!(&buf[..n], &frame(len, 2)[..]);
        }
        assert_eq!(a.recv(&mut buf).unwrap(), None);
        assert_eq!((a.state(), a.poll_event()), (LinkEvent::Up, None));
    }

    #[test]
    fn a_frame_above_the_mtu_is_refused_and_datagrams_of_strangers_are_not_seen() {
        let (mut a, mut b) = pair(1500);
        assert!(matches!(
            a.send(&frame(1515, 0)),
            Err(LinkError::FrameTooLarge {
                len: 1515,
                max: 1514
            })
        ));
        // A third socket sends to b's port: the connected socket drops it.
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        stranger
            .send_to(&frame(100, 9), b.local_addr().unwrap())
            .unwrap();
        a.send(&frame(100, 3)).unwrap();
        let mut buf = vec![0u8; b.max_frame_len()];
        let n = recv_one(&mut b, &mut buf);
        assert_eq!(&buf[..n], &frame(100, 3)[..]);
        assert_eq!(b.recv(&mut buf).unwrap(), None);
    }

    #[test]
    fn sending_to_a_peer_not_listening_drops_silently() {
        let gone = UdpSocket::bind("127.0.0.1:0").unwrap();
        let peer = gone.local_addr().unwrap();
        drop(gone);
        let mut l = UdpLink::open(&UdpConfig::new("127.0.0.1:0".parse().unwrap(), peer)).unwrap();
        for _ in 0..3 {
            l.send(&frame(60, 0)).unwrap();
        }
        let mut buf = vec![0u8; l.max_frame_len()];
        // The ICMP errors are absorbed, not reported as frames or errors.
        assert_eq!(l.recv(&mut buf).unwrap(), None);
        assert!(l.dropped() >= 1, "dropped {}", l.dropped());
    }

    #[test]
    fn bad_configurations_are_refused() {
        let v4: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let v6: SocketAddr = "[::1]:9".parse().unwrap();
        for mtu in [67, UDP_MAX_MTU + 1] {
            let e = UdpLink::open(&UdpConfig {
                bind: v4,
                peer: v4,
                mtu,
            })
            .unwrap_err();
            assert!(matches!(e, LinkError::Config(_)), "{e}");
        }
        assert_eq!(UDP_MAX_MTU, 65_493);
        let e = UdpLink::open(&UdpConfig::new(v4, v6)).unwrap_err();
        assert!(e.to_string().contains("different families"), "{e}");
    }
}
