//! From a captured frame to a TCP segment, with the `etherparse` crate.
//!
//! Link types understood: Ethernet (with VLAN tags), raw IP, IPv4, IPv6, Linux
//! cooked capture v1, BSD/OpenBSD loopback. Parsing is lax about truncation: a frame
//! cut short by the snapshot length still yields its TCP segment, with
//! [`TcpSegment::payload`] holding the captured part and [`TcpSegment::wire_len`]
//! the length the IP header announces ([`TcpSegment::is_truncated`]); when the
//! cut falls inside the TCP header, the segment is rebuilt from its first 14
//! octets (ports, sequence number, flags) with no payload captured. TCP
//! checksums are not verified (captures taken with offloads on, or edited like
//! `bad-crc.pcap`, carry stale ones).
//!
//! [`decode`] also reports oddities of the frame that do not stop decoding
//! ([`FrameWarning`]): a record whose captured length exceeds the original
//! length, an IPv4 total length smaller than the IPv4 header, a frame cut
//! before its IP header ended.

use std::net::{IpAddr, SocketAddr};

use etherparse::{EtherType, LaxNetSlice, LaxSlicedPacket, TransportSlice};

use crate::capture::{Frame, LinkType};

/// The TCP flags iwdump cares about.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpFlags {
    /// SYN: the sequence number is the ISN; the segment occupies one sequence number.
    pub syn: bool,
    /// ACK: the acknowledgment number field is valid.
    pub ack: bool,
    /// FIN: end of this direction's data; occupies one sequence number after the data.
    pub fin: bool,
    /// RST: the connection is aborted.
    pub rst: bool,
}

/// One TCP segment taken out of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSegment<'a> {
    /// Sender's address and port.
    pub src: SocketAddr,
    /// Receiver's address and port.
    pub dst: SocketAddr,
    /// Sequence number of the first octet (of the SYN when `flags.syn`).
    pub seq: u32,
    /// Flags.
    pub flags: TcpFlags,
    /// Captured payload octets (a prefix of the real payload when the frame was
    /// truncated by the snapshot length).
    pub payload: &'a [u8],
    /// Payload length on the wire, in octets, from the IP length fields
    /// (`>= payload.len()`).
    pub wire_len: u32,
}

impl TcpSegment<'_> {
    /// Whether the capture holds less of the payload than was on the wire
    /// (`payload.len() < wire_len`): the frame was cut by the snapshot length,
    /// or its IP length field claims more than the frame holds. The missing
    /// octets are a hole in the stream, not data.
    pub fn is_truncated(&self) -> bool {
        (self.payload.len() as u64) < u64::from(self.wire_len)
    }
}

/// Something odd about a frame that does not stop its decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameWarning {
    /// The capture record holds more octets than its original length says
    /// (incl_len > orig_len): a corrupt record header.
    #[error("captured length {captured} exceeds the original length {orig} (corrupt record)")]
    CapturedBeyondOriginal {
        /// Octets captured (incl_len).
        captured: usize,
        /// Original length on the wire (orig_len), octets.
        orig: u32,
    },
    /// The IPv4 total length is smaller than the IPv4 header (RFC 791); the
    /// payload was taken from the captured octets instead.
    #[error(
        "IPv4 total length {total_len} is smaller than its {header_len}-octet header \
         (payload taken from the captured octets)"
    )]
    Ipv4TotalLenBelowHeader {
        /// The Total Length field, octets.
        total_len: u16,
        /// The IPv4 header length (IHL * 4), octets.
        header_len: usize,
    },
    /// The snapshot length cut the frame before its IP header ended: whether
    /// it carried TCP cannot be told, so it is not decoded.
    #[error(
        "frame cut by the capture before its IP header ended ({captured} of {orig} octets \
         captured): not decoded"
    )]
    CutBeforeIp {
        /// Octets captured (incl_len).
        captured: usize,
        /// Original length on the wire (orig_len), octets.
        orig: u32,
    },
}

/// What [`decode`] found in a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The TCP segment, `None` for frames that carry no TCP.
    pub segment: Option<TcpSegment<'a>>,
    /// Oddities of the frame, in the order found.
    pub warnings: Vec<FrameWarning>,
}

/// Why a frame that looked like it carries TCP could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// The capture's link type is not one of those listed in the module docs.
    #[error("unsupported link type {0}")]
    UnsupportedLinkType(i32),
    /// The link, IP or TCP header is malformed or truncated (etherparse's message).
    #[error("malformed packet: {0}")]
    Malformed(String),
    /// A fragmented IP datagram carrying TCP: iwdump does not defragment.
    #[error("fragmented IP datagram carrying TCP (not reassembled)")]
    Fragmented,
    /// The capture cut the frame inside the first 14 octets of its TCP header
    /// (snapshot length, or an IP length beyond the frame): not even the
    /// sequence number and flags are there, and any payload is lost.
    #[error("TCP header cut by the capture: {captured} of its first 14 octets captured")]
    TcpHeaderCut {
        /// Octets of the TCP header captured.
        captured: usize,
    },
}

/// Octets of the TCP header up to and including the flags octet.
const TCP_FLAGS_END: usize = 14;

/// Take the TCP segment out of `frame`: [`decode`] without the warnings.
///
/// Returns `Ok(None)` for frames that carry no TCP (ARP, UDP, ICMP, ...).
///
/// # Errors
/// As [`decode`]. Never panics.
pub fn decode_tcp<'a>(frame: &Frame<'a>) -> Result<Option<TcpSegment<'a>>, PacketError> {
    decode(frame).map(|d| d.segment)
}

/// Take the TCP segment out of `frame`, with the frame's oddities
/// ([`FrameWarning`]). The segment is `None` for frames that carry no TCP
/// (ARP, UDP, ICMP, ...).
///
/// # Errors
/// [`PacketError`] when the frame looks like TCP but cannot be decoded
/// ([`PacketError::TcpHeaderCut`] when the capture cut it inside the first 14
/// octets of the TCP header), or the link type is unknown. Never panics.
pub fn decode<'a>(frame: &Frame<'a>) -> Result<Decoded<'a>, PacketError> {
    let mut warnings = Vec::new();
    if frame.data.len() as u64 > u64::from(frame.orig_len) {
        warnings.push(FrameWarning::CapturedBeyondOriginal {
            captured: frame.data.len(),
            orig: frame.orig_len,
        });
    }
    let segment = decode_segment(frame, &mut warnings)?;
    Ok(Decoded { segment, warnings })
}

fn decode_segment<'a>(
    frame: &Frame<'a>,
    warnings: &mut Vec<FrameWarning>,
) -> Result<Option<TcpSegment<'a>>, PacketError> {
    let data = frame.data;
    let sliced = match frame.link_type {
        LinkType::ETHERNET => LaxSlicedPacket::from_ethernet(data)
            .map_err(|e| PacketError::Malformed(e.to_string()))?,
        LinkType::RAW | LinkType::IPV4 | LinkType::IPV6 => {
            LaxSlicedPacket::from_ip(data).map_err(|e| PacketError::Malformed(e.to_string()))?
        }
        LinkType::NULL | LinkType::LOOP => {
            let ip = data
                .get(4..)
                .ok_or_else(|| PacketError::Malformed("loopback header truncated".into()))?;
            match LaxSlicedPacket::from_ip(ip) {
                Ok(p) => p,
                // Address families other than IPv4/IPv6.
                Err(_) => return Ok(None),
            }
        }
        LinkType::LINUX_SLL => {
            // 16-byte header; the protocol type (an EtherType) is its last u16.
            let (Some(proto), Some(rest)) = (data.get(14..16), data.get(16..)) else {
                return Err(PacketError::Malformed("Linux SLL header truncated".into()));
            };
            let ether_type = EtherType(u16::from_be_bytes([proto[0], proto[1]]));
            LaxSlicedPacket::from_ether_type(ether_type, rest)
        }
        LinkType(other) => return Err(PacketError::UnsupportedLinkType(other)),
    };

    let Some(net) = &sliced.net else {
        if sliced.stop_err.is_some() && (data.len() as u64) < u64::from(frame.orig_len) {
            warnings.push(FrameWarning::CutBeforeIp {
                captured: data.len(),
                orig: frame.orig_len,
            });
        }
        return Ok(None);
    };
    let (src_ip, dst_ip, ip_payload, intended_ip_payload): (IpAddr, IpAddr, _, usize) = match net {
        LaxNetSlice::Ipv4(v4) => {
            let h = v4.header();
            let header_len = usize::from(h.ihl()) * 4;
            if usize::from(h.total_len()) < header_len {
                warnings.push(FrameWarning::Ipv4TotalLenBelowHeader {
                    total_len: h.total_len(),
                    header_len,
                });
            }
            let intended = usize::from(h.total_len()).saturating_sub(header_len);
            (
                h.source_addr().into(),
                h.destination_addr().into(),
                v4.payload(),
                intended,
            )
        }
        LaxNetSlice::Ipv6(v6) => {
            let h = v6.header();
            let intended =
                usize::from(h.payload_length()).saturating_sub(v6.extensions().slice().len());
            (
                h.source_addr().into(),
                h.destination_addr().into(),
                v6.payload(),
                intended,
            )
        }
    };
    if ip_payload.ip_number != etherparse::IpNumber::TCP {
        return Ok(None);
    }
    if ip_payload.fragmented {
        return Err(PacketError::Fragmented);
    }
    let tcp = match &sliced.transport {
        Some(TransportSlice::Tcp(tcp)) => tcp,
        // The capture ends inside the TCP header: rebuild what is there.
        _ if ip_payload.incomplete && ip_payload.payload.len() < intended_ip_payload => {
            return cut_tcp_header(src_ip, dst_ip, ip_payload.payload, intended_ip_payload);
        }
        _ => {
            let why = match &sliced.stop_err {
                Some((e, _layer)) => e.to_string(),
                None => "no TCP header".to_string(),
            };
            return Err(PacketError::Malformed(why));
        }
    };
    let payload = tcp.payload();
    let wire_len = if ip_payload.incomplete {
        intended_ip_payload
            .saturating_sub(usize::from(tcp.data_offset()) * 4)
            .max(payload.len())
    } else {
        payload.len()
    };
    Ok(Some(TcpSegment {
        src: SocketAddr::new(src_ip, tcp.source_port()),
        dst: SocketAddr::new(dst_ip, tcp.destination_port()),
        seq: tcp.sequence_number(),
        flags: TcpFlags {
            syn: tcp.syn(),
            ack: tcp.ack(),
            fin: tcp.fin(),
            rst: tcp.rst(),
        },
        payload,
        wire_len: u32::try_from(wire_len).unwrap_or(u32::MAX),
    }))
}

/// The segment of a TCP header the capture cut short (`tcp` holds its first
/// octets, `intended` the TCP header and payload length the IP header
/// announces): no payload captured, `wire_len` from the IP length and the data
/// offset.
fn cut_tcp_header<'a>(
    src_ip: IpAddr,
    dst_ip: IpAddr,
    tcp: &[u8],
    intended: usize,
) -> Result<Option<TcpSegment<'a>>, PacketError> {
    let Some(h) = tcp.get(..TCP_FLAGS_END) else {
        return Err(PacketError::TcpHeaderCut {
            captured: tcp.len(),
        });
    };
    let data_offset = usize::from(h[12] >> 4) * 4;
    if data_offset < 20 {
        return Err(PacketError::Malformed(format!(
            "TCP data offset {data_offset} below the 20-octet header"
        )));
    }
    let flags = h[13];
    let wire_len = intended.saturating_sub(data_offset);
    Ok(Some(TcpSegment {
        src: SocketAddr::new(src_ip, u16::from_be_bytes([h[0], h[1]])),
        dst: SocketAddr::new(dst_ip, u16::from_be_bytes([h[2], h[3]])),
        seq: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        flags: TcpFlags {
            syn: flags & 0x02 != 0,
            ack: flags & 0x10 != 0,
            fin: flags & 0x01 != 0,
            rst: flags & 0x04 != 0,
        },
        payload: &[],
        wire_len: u32::try_from(wire_len).unwrap_or(u32::MAX),
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    /// An Ethernet/IPv4/TCP frame from `a:pa` to `b:pb`.
    pub(crate) fn eth_tcp(
        a: [u8; 4],
        pa: u16,
        b: [u8; 4],
        pb: u16,
        seq: u32,
        flags: TcpFlags,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4(a, b, 64)
            .tcp(pa, pb, seq, 1000);
        if flags.syn {
            builder = builder.syn();
        }
        if flags.ack {
            builder = builder.ack(1);
        }
        if flags.fin {
            builder = builder.fin();
        }
        if flags.rst {
            builder = builder.rst();
        }
        let mut out = Vec::with_capacity(builder.size(payload.len()));
        builder.write(&mut out, payload).expect("build frame");
        out
    }

    fn frame(data: &[u8]) -> Frame<'_> {
        Frame {
            number: 1,
            link_type: LinkType::ETHERNET,
            data,
            orig_len: data.len() as u32,
        }
    }

    #[test]
    fn ethernet_ipv4_tcp() {
        let flags = TcpFlags {
            ack: true,
            ..TcpFlags::default()
        };
        let bytes = eth_tcp(
            [10, 0, 0, 2],
            4000,
            [10, 0, 0, 1],
            7174,
            77,
            flags,
            b"hello",
        );
        let seg = decode_tcp(&frame(&bytes)).unwrap().unwrap();
        assert_eq!(seg.src, "10.0.0.2:4000".parse().unwrap());
        assert_eq!(seg.dst, "10.0.0.1:7174".parse().unwrap());
        assert_eq!(seg.seq, 77);
        assert_eq!(seg.flags, flags);
        assert_eq!(seg.payload, b"hello");
        assert_eq!(seg.wire_len, 5);
    }

    #[test]
    fn snapped_frame_keeps_wire_len() {
        let bytes = eth_tcp(
            [10, 0, 0, 2],
            1,
            [10, 0, 0, 1],
            2,
            5,
            TcpFlags::default(),
            &[7; 100],
        );
        let cut = &bytes[..bytes.len() - 40];
        let seg = decode_tcp(&frame(cut)).unwrap().unwrap();
        assert_eq!(seg.payload.len(), 60);
        assert_eq!(seg.wire_len, 100);
    }

    /// A capture that cuts the frame inside the TCP header: the segment is
    /// rebuilt from the ports, sequence number and flags, with nothing of its
    /// 100 payload octets captured.
    #[test]
    fn cut_inside_tcp_header() {
        let flags = TcpFlags {
            ack: true,
            fin: true,
            ..TcpFlags::default()
        };
        let bytes = eth_tcp(
            [10, 0, 0, 2],
            4000,
            [10, 0, 0, 1],
            7174,
            77,
            flags,
            &[7; 100],
        );
        for captured in [14usize, 16, 19] {
            let cut = &bytes[..14 + 20 + captured];
            let f = Frame {
                orig_len: bytes.len() as u32,
                ..frame(cut)
            };
            let d = decode(&f).unwrap();
            assert!(d.warnings.is_empty());
            let seg = d.segment.unwrap();
            assert_eq!(seg.src, "10.0.0.2:4000".parse().unwrap());
            assert_eq!(seg.dst, "10.0.0.1:7174".parse().unwrap());
            assert_eq!((seg.seq, seg.flags), (77, flags));
            assert_eq!((seg.payload.len(), seg.wire_len), (0, 100));
            assert!(seg.is_truncated());
        }
        let cut = &bytes[..14 + 20 + 13];
        assert_eq!(
            decode_tcp(&frame(cut)),
            Err(PacketError::TcpHeaderCut { captured: 13 })
        );
        // A whole frame is not truncated.
        let seg = decode_tcp(&frame(&bytes)).unwrap().unwrap();
        assert!(!seg.is_truncated());
    }

    #[test]
    fn frame_warnings() {
        let bytes = eth_tcp(
            [10, 0, 0, 2],
            1,
            [10, 0, 0, 1],
            2,
            5,
            TcpFlags::default(),
            b"hello",
        );
        // incl_len > orig_len.
        let f = Frame {
            orig_len: 10,
            ..frame(&bytes)
        };
        let d = decode(&f).unwrap();
        assert_eq!(
            d.warnings,
            vec![FrameWarning::CapturedBeyondOriginal {
                captured: bytes.len(),
                orig: 10
            }]
        );
        assert_eq!(d.segment.unwrap().payload, b"hello");
        // IPv4 total length 10, under the 20-octet header.
        let mut small = bytes.clone();
        small[16..18].copy_from_slice(&10u16.to_be_bytes());
        let d = decode(&frame(&small)).unwrap();
        assert_eq!(
            d.warnings,
            vec![FrameWarning::Ipv4TotalLenBelowHeader {
                total_len: 10,
                header_len: 20
            }]
        );
        assert_eq!(
            d.warnings[0].to_string(),
            "IPv4 total length 10 is smaller than its 20-octet header \
             (payload taken from the captured octets)"
        );
        let seg = d.segment.unwrap();
        assert_eq!((seg.payload, seg.wire_len), (&b"hello"[..], 5));
        // A clean frame has no warnings.
        assert!(decode(&frame(&bytes)).unwrap().warnings.is_empty());
        // Cut by the snapshot length inside the IPv4 header.
        let f = Frame {
            orig_len: bytes.len() as u32,
            ..frame(&bytes[..24])
        };
        let d = decode(&f).unwrap();
        assert_eq!(d.segment, None);
        assert_eq!(
            d.warnings,
            vec![FrameWarning::CutBeforeIp {
                captured: 24,
                orig: bytes.len() as u32
            }]
        );
    }

    #[test]
    fn non_tcp_and_garbage() {
        // ARP-ish: EtherType 0x0806.
        let mut arp = vec![0u8; 42];
        arp[12] = 0x08;
        arp[13] = 0x06;
        assert_eq!(decode_tcp(&frame(&arp)).unwrap(), None);
        // Every prefix of a TCP frame: no panic.
        let bytes = eth_tcp(
            [1, 2, 3, 4],
            1,
            [5, 6, 7, 8],
            2,
            5,
            TcpFlags::default(),
            b"xyz",
        );
        for cut in 0..bytes.len() {
            let _ = decode_tcp(&frame(&bytes[..cut]));
        }
        let odd = Frame {
            number: 1,
            link_type: LinkType(147),
            data: &bytes,
            orig_len: 0,
        };
        assert_eq!(decode_tcp(&odd), Err(PacketError::UnsupportedLinkType(147)));
    }

    #[test]
    fn raw_ip_and_sll() {
        let bytes = eth_tcp(
            [1, 2, 3, 4],
            1,
            [5, 6, 7, 8],
            2,
            5,
            TcpFlags::default(),
            b"xyz",
        );
        let raw = Frame {
            number: 1,
            link_type: LinkType::RAW,
            data: &bytes[14..],
            orig_len: 0,
        };
        assert_eq!(decode_tcp(&raw).unwrap().unwrap().payload, b"xyz");
        let mut sll = vec![0u8; 14];
        sll.extend_from_slice(&[0x08, 0x00]);
        sll.extend_from_slice(&bytes[14..]);
        let f = Frame {
            number: 1,
            link_type: LinkType::LINUX_SLL,
            data: &sll,
            orig_len: 0,
        };
        assert_eq!(decode_tcp(&f).unwrap().unwrap().payload, b"xyz");
    }
}
