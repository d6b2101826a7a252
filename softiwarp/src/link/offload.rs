//! TCP/IPv4 offloads between a link and its device: checksum offload both ways, TCP
//! segmentation offload (TSO) on send and coalesced frames on receive.
//!
//! A link that reports [`Link::tcp_offload`] takes, through [`Link::send_tcp_offload`],
//! an Ethernet II / IPv4 / TCP frame whose TCP checksum is not computed (smoltcp leaves
//! it zero when the device offloads it) and whose TCP payload may be longer than the MSS
//! (a **super-segment**, at most [`OFFLOAD_MAX_FRAME`] bytes): the link (for a TAP, the
//! kernel: `virtio_net_hdr` with `VIRTIO_NET_HDR_F_NEEDS_CSUM` and `gso_type`
//! `VIRTIO_NET_HDR_GSO_TCPV4`, `include/uapi/linux/virtio_net.h`) completes the checksum
//! and cuts the payload into pieces of `gso_size` bytes, the last one shorter, each with
//! a copy of the headers (sequence numbers advanced, PSH and FIN on the last piece only,
//! CWR on the first only: what Linux's `tcp_gso_segment` does). Received frames come
//! with an [`RxMeta`]: how far their TCP checksum can be trusted ([`RxCsum`]) and, for a
//! coalesced frame, the size of the segments it was made of.
//!
//! [`segment_tcp4`] does the same cutting in software: links without the offload (the
//! default [`Link::send_tcp_offload`]) and the middlewares that must see frames as they
//! are on the wire (a pcap capture, fault injection) use it.

use smoltcp::wire::{checksum, IpProtocol, Ipv4Address};

#[allow(unused_imports)] // doc links
use super::Link;
use super::LinkError;

/// Longest frame in bytes of the offload interface: an Ethernet II header (14 bytes) and
/// the largest IPv4 datagram (65535 bytes, RFC 791): what one TAP `write` or `read` with
/// TSO carries at most (the kernel's default `gso_max_size` is 64 KiB).
pub const OFFLOAD_MAX_FRAME: usize = 14 + 65_535;

/// How far a received frame's TCP checksum can be trusted (`virtio_net_hdr.flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RxCsum {
    /// The frame carries a full checksum nobody checked: the receiver verifies it
    /// (`flags` 0; every frame of a link without offload).
    #[default]
    Unverified,
    /// The checksum is partial (`VIRTIO_NET_HDR_F_NEEDS_CSUM`): the TCP checksum field
    /// holds only the pseudo-header sum. The frame was built in this host's memory and
    /// never crossed a wire, so its data is intact (Linux treats `CHECKSUM_PARTIAL` as
    /// verified too: `skb_csum_unnecessary`).
    Partial,
    /// The kernel verified the checksum (`VIRTIO_NET_HDR_F_DATA_VALID`).
    Valid,
}

/// What a link says about a received frame ([`Link::recv_meta`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RxMeta {
    /// Length of the frame in bytes.
    pub len: usize,
    /// The state of its TCP checksum.
    pub csum: RxCsum,
    /// For a coalesced TCP frame (payload longer than one segment), the segment size in
    /// bytes it was made of (`virtio_net_hdr.gso_size`); `None` for a plain frame.
    pub gso_size: Option<u16>,
}

/// Byte offset of the IPv4 header in an Ethernet II frame.
const IPV4: usize = 14;

/// The positions of an Ethernet II / IPv4 / TCP frame: IPv4 header length, TCP header
/// length and TCP segment length (header and payload) in bytes, or `None` if `frame` is
/// not IPv4 carrying TCP, or is cut short.
pub(crate) fn tcp4_layout(frame: &[u8]) -> Option<(usize, usize, usize)> {
    if frame.len() < IPV4 + 20 || frame[12..14] != [0x08, 0x00] || frame[IPV4] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(frame[IPV4] & 0x0f) * 4;
    if ihl < 20 || frame[IPV4 + 9] != 6 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([frame[IPV4 + 2], frame[IPV4 + 3]]));
    let tcp = IPV4 + ihl;
    if total < ihl + 20 || IPV4 + total > frame.len() {
        return None;
    }
    let doff = usize::from(frame[tcp + 12] >> 4) * 4;
    if doff < 20 || ihl + doff > total {
        return None;
    }
    Some((ihl, doff, total - ihl))
}

fn addrs(frame: &[u8]) -> (Ipv4Address, Ipv4Address) {
    let a = |at: usize| Ipv4Address::new(frame[at], frame[at + 1], frame[at + 2], frame[at + 3]);
    (a(IPV4 + 12), a(IPV4 + 16))
}

/// The TCP pseudo-header sum (RFC 9293 3.1) of `frame` for a TCP segment of `tcp_len`
/// bytes, folded, not complemented: what a partial checksum field holds.
fn pseudo_sum(frame: &[u8], tcp_len: usize) -> u16 {
    let (src, dst) = addrs(frame);
    checksum::pseudo_header_v4(&src, &dst, IpProtocol::Tcp, tcp_len as u32)
}

/// Writes the pseudo-header sum into the TCP checksum field of an IPv4/TCP `frame` (a
/// partial checksum, as `CHECKSUM_PARTIAL` wants it: the kernel adds the segment's sum).
/// Returns `(ihl, doff)`, or `None` if `frame` is not IPv4/TCP (left unchanged).
pub(crate) fn fill_partial_csum(frame: &mut [u8]) -> Option<(usize, usize)> {
    let (ihl, doff, tcp_len) = tcp4_layout(frame)?;
    let at = IPV4 + ihl + 16;
    let sum = pseudo_sum(frame, tcp_len);
    frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    Some((ihl, doff))
}

/// Computes and writes the full TCP checksum of an IPv4/TCP `frame` (whatever its
/// checksum field held). `false` if `frame` is not IPv4/TCP.
pub(crate) fn fill_tcp_csum(frame: &mut [u8]) -> bool {
    let Some((ihl, _, tcp_len)) = tcp4_layout(frame) else {
        return false;
    };
    let start = IPV4 + ihl;
    frame[start + 16..start + 18].fill(0);
    let sum = !checksum::combine(&[
        pseudo_sum(frame, tcp_len),
        checksum::data(&frame[start..start + tcp_len]),
    ]);
    frame[start + 16..start + 18].copy_from_slice(&sum.to_be_bytes());
    true
}

/// Whether the TCP checksum of an IPv4/TCP `frame` is right; `true` for anything else
/// (the stack's own checks apply to it).
pub(crate) fn tcp_csum_ok(frame: &[u8]) -> bool {
    let Some((ihl, _, tcp_len)) = tcp4_layout(frame) else {
        return true;
    };
    let start = IPV4 + ihl;
    checksum::combine(&[
        pseudo_sum(frame, tcp_len),
        checksum::data(&frame[start..start + tcp_len]),
    ]) == !0
}

/// Cuts an IPv4/TCP `frame` into wire frames of at most `gso_size` bytes of TCP payload
/// each (no cutting for `None`, or a payload that fits), with complete IPv4 and TCP
/// checksums, and hands each to `out` in order, built in `scratch`. The pieces are what
/// Linux's GSO makes of a super-segment (`tcp_gso_segment`, `inet_gso_segment`): the
/// headers copied, the IPv4 Total Length and Identification (one more per piece) and
/// the TCP Sequence Number adjusted, FIN and PSH kept on the last piece only and CWR on
/// the first only. A frame that is not IPv4/TCP goes to `out` as it is.
///
/// Errors: the first error `out` returns (the remaining pieces are not made).
pub fn segment_tcp4(
    frame: &[u8],
    gso_size: Option<u16>,
    scratch: &mut Vec<u8>,
    mut out: impl FnMut(&[u8]) -> Result<(), LinkError>,
) -> Result<(), LinkError> {
    let Some((ihl, doff, tcp_len)) = tcp4_layout(frame) else {
        return out(frame);
    };
    let hdrs = IPV4 + ihl + doff;
    let payload = &frame[hdrs..IPV4 + ihl + tcp_len];
    let mss = gso_size.map_or(payload.len(), usize::from).max(1);
    let tcp = IPV4 + ihl;
    let seq0 = u32::from_be_bytes(frame[tcp + 4..tcp + 8].try_into().unwrap_or_default());
    let id0 = u16::from_be_bytes([frame[IPV4 + 4], frame[IPV4 + 5]]);
    let flags0 = frame[tcp + 13];
    // An empty payload is still one segment.
    let count = payload.len().div_ceil(mss).max(1);
    for index in 0..count {
        let off = index * mss;
        let piece = &payload[off..payload.len().min(off + mss)];
        let last = index + 1 == count;
        scratch.clear();
        scratch.extend_from_slice(&frame[..hdrs]);
        scratch.extend_from_slice(piece);
        let ip_total = (ihl + doff + piece.len()) as u16;
        scratch[IPV4 + 2..IPV4 + 4].copy_from_slice(&ip_total.to_be_bytes());
        let id = id0.wrapping_add(index as u16);
        scratch[IPV4 + 4..IPV4 + 6].copy_from_slice(&id.to_be_bytes());
        let seq = seq0.wrapping_add(off as u32);
        scratch[tcp + 4..tcp + 8].copy_from_slice(&seq.to_be_bytes());
        let mut flags = flags0;
        if !last {
            flags &= !(0x01 | 0x08); // FIN, PSH
        }
        if index > 0 {
            flags &= !0x80; // CWR
        }
        scratch[tcp + 13] = flags;
        scratch[IPV4 + 10..IPV4 + 12].fill(0);
        let ip_sum = !checksum::data(&scratch[IPV4..IPV4 + ihl]);
        scratch[IPV4 + 10..IPV4 + 12].copy_from_slice(&ip_sum.to_be_bytes());
        fill_tcp_csum(scratch);
        out(scratch)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::{IpAddress, Ipv4Packet, TcpPacket};

    /// An Ethernet/IPv4/TCP frame with `payload`, flags `flags`, checksums zero.
    fn frame(payload: &[u8], flags: u8) -> Vec<u8> {
        let mut f = vec![0u8; 54];
        f[12] = 0x08;
        f[14] = 0x45;
        let total = (40 + payload.len()) as u16;
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f[18..20].copy_from_slice(&7u16.to_be_bytes());
        f[22] = 64;
        f[23] = 6;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        f[34..36].copy_from_slice(&1000u16.to_be_bytes());
        f[36..38].copy_from_slice(&2000u16.to_be_bytes());
        f[38..42].copy_from_slice(&0xffff_fff0u32.to_be_bytes());
        f[46] = 0x50;
        f[47] = flags;
        f.extend_from_slice(payload);
        f
    }

    fn pieces(f: &[u8], gso: Option<u16>) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        let mut s = Vec::new();
        segment_tcp4(f, gso, &mut s, |p| {
            v.push(p.to_vec());
            Ok(())
        })
        .unwrap();
        v
    }

    #[test]
    fn a_super_segment_is_cut_like_linux_gso() {
        let payload: Vec<u8> = (0..2500u32).map(|i| (i * 7) as u8).collect();
        // CWR | ACK | PSH | FIN
        let f = frame(&payload, 0x80 | 0x10 | 0x08 | 0x01);
        let p = pieces(&f, Some(1000));
        assert_eq!(p.len(), 3);
        let mut joined = Vec::new();
        for (i, s) in p.iter().enumerate() {
            let ip = Ipv4Packet::new_checked(&s[14..]).unwrap();
            assert!(ip.verify_checksum());
            assert_eq!(ip.ident(), 7 + i as u16);
            let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
            let (a, b) = (IpAddress::v4(10, 0, 0, 1), IpAddress::v4(10, 0, 0, 2));
            assert!(tcp.verify_checksum(&a, &b));
            assert!(tcp_csum_ok(s));
            assert_eq!(
                tcp.seq_number().0 as u32,
                0xffff_fff0u32.wrapping_add(1000 * i as u32)
            );
            assert_eq!(tcp.payload().len(), [1000, 1000, 500][i]);
            assert_eq!(tcp.fin(), i == 2);
            assert_eq!(tcp.psh(), i == 2);
            assert_eq!(tcp.cwr(), i == 0);
            assert!(tcp.ack());
            joined.extend_from_slice(tcp.payload());
        }
        assert_eq!(joined, payload);
        // No cut without a size, or when the payload fits; an empty payload is one piece.
        assert_eq!(pieces(&f, None).len(), 1);
        assert_eq!(pieces(&f, Some(2500)).len(), 1);
        let ack = frame(&[], 0x10);
        let p = pieces(&ack, Some(1000));
        assert_eq!(p.len(), 1);
        assert!(tcp_csum_ok(&p[0]));
        // Not TCP: handed on untouched.
        let arp = vec![0u8; 42];
        assert_eq!(pieces(&arp, Some(10)), vec![arp]);
    }

    #[test]
    fn partial_plus_data_is_the_full_checksum() {
        let mut f = frame(b"hello, world", 0x18);
        assert_eq!(fill_partial_csum(&mut f), Some((20, 20)));
        // The pseudo-header sum plus the segment's own sum (the partial field included
        // once) is what the kernel completes: the full checksum.
        let partial = u16::from_be_bytes([f[50], f[51]]);
        let mut full = f.clone();
        assert!(fill_tcp_csum(&mut full));
        let seg_sum = {
            let mut s = f[34..].to_vec();
            s[16..18].fill(0);
            checksum::data(&s)
        };
        assert_eq!(
            !checksum::combine(&[partial, seg_sum]),
            u16::from_be_bytes([full[50], full[51]])
        );
        assert!(tcp_csum_ok(&full));
        assert!(!tcp_csum_ok(&f));
        full[60] ^= 1;
        assert!(!tcp_csum_ok(&full));
        assert_eq!(tcp4_layout(&f[..40]), None);
    }
}
