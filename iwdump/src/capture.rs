//! Reading capture files: legacy pcap (both byte orders, micro- and nanosecond
//! magic, the "modified" Kuznetzov variant) and pcapng, with the `pcap-parser` crate.
//!
//! The whole file is expected in memory; frames borrow from it. Frame numbers are
//! 1-based and count packets only (not pcapng's other blocks), exactly like
//! Wireshark's "No." column.

use pcap_parser::nom::IResult;
use pcap_parser::pcapng::Block;
use pcap_parser::{
    parse_pcap_frame, parse_pcap_frame_be, parse_pcap_frame_modified, parse_pcap_header,
    LegacyPcapBlock, PcapError, PcapNGSlice,
};

/// Link-layer type of a frame: the `LINKTYPE_*` number of the tcpdump.org registry
/// (1 = Ethernet, 101 = raw IP, 113 = Linux cooked v1, 228 = IPv4, 229 = IPv6, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkType(pub i32);

impl LinkType {
    /// `LINKTYPE_NULL`: BSD loopback, 4-byte host-order address family.
    pub const NULL: LinkType = LinkType(0);
    /// `LINKTYPE_ETHERNET`: Ethernet II / 802.3.
    pub const ETHERNET: LinkType = LinkType(1);
    /// `LINKTYPE_RAW`: raw IPv4 or IPv6, version taken from the first nibble.
    pub const RAW: LinkType = LinkType(101);
    /// `LINKTYPE_LOOP`: OpenBSD loopback, 4-byte network-order address family.
    pub const LOOP: LinkType = LinkType(108);
    /// `LINKTYPE_LINUX_SLL`: Linux "cooked" capture, version 1.
    pub const LINUX_SLL: LinkType = LinkType(113);
    /// `LINKTYPE_IPV4`: raw IPv4.
    pub const IPV4: LinkType = LinkType(228);
    /// `LINKTYPE_IPV6`: raw IPv6.
    pub const IPV6: LinkType = LinkType(229);
}

/// Which container format a capture uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Legacy libpcap format (magic `a1b2c3d4` and its variants).
    Pcap,
    /// pcapng (section header block magic `0a0d0d0a`).
    Pcapng,
}

/// One captured packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Frame number, 1-based, in file order (Wireshark's "No.").
    pub number: u64,
    /// Link-layer type of `data`.
    pub link_type: LinkType,
    /// The captured bytes (at most the snapshot length; may be shorter than `orig_len`).
    pub data: &'a [u8],
    /// Length of the packet on the wire, in octets, as recorded by the capturer.
    pub orig_len: u32,
}

/// Why a capture file could not be read (or could not be read to its end).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaptureError {
    /// The input starts with neither a pcap nor a pcapng header: unusable input.
    #[error("not a pcap or pcapng file: {0}")]
    NotACapture(String),
    /// The file ends inside the record of frame `frame` (a truncated download or
    /// a capture still being written). Frames before it were delivered.
    #[error("capture truncated: frame {frame} is incomplete")]
    Truncated {
        /// Number the incomplete frame would have had.
        frame: u64,
    },
    /// A record could not be parsed; frames before it were delivered.
    #[error("malformed capture record at frame {frame}: {detail}")]
    Malformed {
        /// Number of the frame the bad record would have had.
        frame: u64,
        /// What was wrong, in words.
        detail: String,
    },
}

/// Signature shared by pcap-parser's three legacy record parsers.
type LegacyParseFn =
    for<'b> fn(&'b [u8]) -> IResult<&'b [u8], LegacyPcapBlock<'b>, PcapError<&'b [u8]>>;

enum Inner<'a> {
    Legacy {
        rem: &'a [u8],
        parse: LegacyParseFn,
        link_type: LinkType,
    },
    Ng {
        slice: PcapNGSlice<'a>,
        /// Link type of each interface of the current section, by interface id.
        interfaces: Vec<LinkType>,
    },
    Done,
}

/// An iterator over the frames of an in-memory capture file.
///
/// Yields `Ok(Frame)` for each packet in file order, then at most one `Err` (a
/// truncated or malformed record), after which it is exhausted. Never panics on
/// any input.
pub struct Capture<'a> {
    format: Format,
    next_number: u64,
    inner: Inner<'a>,
}

impl<'a> Capture<'a> {
    /// Recognise the file format from its first bytes and prepare to iterate.
    ///
    /// # Errors
    /// [`CaptureError::NotACapture`] when `bytes` starts with neither a pcap nor a
    /// pcapng header (including an empty or too short input).
    pub fn new(bytes: &'a [u8]) -> Result<Capture<'a>, CaptureError> {
        if let Ok(slice) = PcapNGSlice::from_slice(bytes) {
            return Ok(Capture {
                format: Format::Pcapng,
                next_number: 1,
                inner: Inner::Ng {
                    slice,
                    interfaces: Vec::new(),
                },
            });
        }
        match parse_pcap_header(bytes) {
            Ok((rem, header)) => {
                let parse: LegacyParseFn = if header.is_modified_format() {
                    parse_pcap_frame_modified
                } else if header.is_bigendian() {
                    parse_pcap_frame_be
                } else {
                    parse_pcap_frame
                };
                Ok(Capture {
                    format: Format::Pcap,
                    next_number: 1,
                    inner: Inner::Legacy {
                        rem,
                        parse,
                        link_type: LinkType(header.network.0),
                    },
                })
            }
            Err(pcap_parser::nom::Err::Incomplete(_)) => Err(CaptureError::NotACapture(format!(
                "only {} bytes, too short for a capture header",
                bytes.len()
            ))),
            Err(_) => Err(CaptureError::NotACapture(match bytes.get(..4) {
                Some(m) => format!(
                    "unknown magic number {:02x}{:02x}{:02x}{:02x}",
                    m[0], m[1], m[2], m[3]
                ),
                None => "too short".to_string(),
            })),
        }
    }

    /// The container format recognised by [`Capture::new`].
    pub fn format(&self) -> Format {
        self.format
    }

    fn frame(&mut self, link_type: LinkType, data: &'a [u8], orig_len: u32) -> Frame<'a> {
        let number = self.next_number;
        self.next_number += 1;
        Frame {
            number,
            link_type,
            data,
            orig_len,
        }
    }

    fn fail(&mut self, err: CaptureError) -> Option<Result<Frame<'a>, CaptureError>> {
        self.inner = Inner::Done;
        Some(Err(err))
    }
}

fn describe(e: &PcapError<&[u8]>) -> String {
    match e {
        PcapError::NomError(_, kind) | PcapError::OwnedNomError(_, kind) => {
            format!("parser error {kind:?}")
        }
        other => other.to_string(),
    }
}

impl<'a> Iterator for Capture<'a> {
    type Item = Result<Frame<'a>, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        let number = self.next_number;
        match &mut self.inner {
            Inner::Done => None,
            Inner::Legacy {
                rem,
                parse,
                link_type,
            } => {
                if rem.is_empty() {
                    self.inner = Inner::Done;
                    return None;
                }
                let link_type = *link_type;
                match parse(rem) {
                    Ok((rest, LegacyPcapBlock { data, origlen, .. })) => {
                        *rem = rest;
                        Some(Ok(self.frame(link_type, data, origlen)))
                    }
                    Err(pcap_parser::nom::Err::Incomplete(_)) => {
                        self.fail(CaptureError::Truncated { frame: number })
                    }
                    Err(pcap_parser::nom::Err::Error(e) | pcap_parser::nom::Err::Failure(e)) => {
                        let detail = describe(&e);
                        self.fail(CaptureError::Malformed {
                            frame: number,
                            detail,
                        })
                    }
                }
            }
            Inner::Ng { slice, interfaces } => loop {
                let block = match slice.next() {
                    None => {
                        self.inner = Inner::Done;
                        return None;
                    }
                    Some(Ok(block)) => block,
                    Some(Err(pcap_parser::nom::Err::Incomplete(_))) => {
                        return self.fail(CaptureError::Truncated { frame: number });
                    }
                    Some(Err(
                        pcap_parser::nom::Err::Error(e) | pcap_parser::nom::Err::Failure(e),
                    )) => {
                        let detail = describe(&e);
                        return self.fail(CaptureError::Malformed {
                            frame: number,
                            detail,
                        });
                    }
                };
                let pcap_parser::PcapBlockOwned::NG(block) = block else {
                    continue;
                };
                match block {
                    Block::SectionHeader(_) => interfaces.clear(),
                    Block::InterfaceDescription(idb) => interfaces.push(LinkType(idb.linktype.0)),
                    Block::EnhancedPacket(epb) => {
                        let Some(&lt) = usize::try_from(epb.if_id)
                            .ok()
                            .and_then(|i| interfaces.get(i))
                        else {
                            let detail = format!(
                                "packet refers to interface {} but only {} are described",
                                epb.if_id,
                                interfaces.len()
                            );
                            return self.fail(CaptureError::Malformed {
                                frame: number,
                                detail,
                            });
                        };
                        // The block's data is padded to 32 bits; caplen is the real length.
                        let n = usize::try_from(epb.caplen)
                            .map_or(epb.data.len(), |c| c.min(epb.data.len()));
                        let data = &epb.data[..n];
                        return Some(Ok(self.frame(lt, data, epb.origlen)));
                    }
                    Block::SimplePacket(spb) => {
                        let Some(&lt) = interfaces.first() else {
                            return self.fail(CaptureError::Malformed {
                                frame: number,
                                detail: "simple packet block before any interface".into(),
                            });
                        };
                        // Padded to 32 bits; a simple packet is never longer than origlen.
                        let n = usize::try_from(spb.origlen)
                            .map_or(spb.data.len(), |c| c.min(spb.data.len()));
                        let data = &spb.data[..n];
                        return Some(Ok(self.frame(lt, data, spb.origlen)));
                    }
                    _ => {}
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A little-endian microsecond pcap header for Ethernet, snaplen 65535.
    pub(crate) fn pcap_header() -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        v.extend_from_slice(&2u16.to_le_bytes());
        v.extend_from_slice(&4u16.to_le_bytes());
        v.extend_from_slice(&0i32.to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&65535u32.to_le_bytes());
        v.extend_from_slice(&1u32.to_le_bytes());
        v
    }

    fn record(v: &mut Vec<u8>, data: &[u8]) {
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&2u32.to_le_bytes());
        v.extend_from_slice(&(data.len() as u32).to_le_bytes());
        v.extend_from_slice(&(data.len() as u32).to_le_bytes());
        v.extend_from_slice(data);
    }

    #[test]
    fn legacy_frames_numbered_from_one() {
        let mut v = pcap_header();
        record(&mut v, &[1, 2, 3]);
        record(&mut v, &[4, 5]);
        let cap = Capture::new(&v).unwrap();
        assert_eq!(cap.format(), Format::Pcap);
        let frames: Vec<_> = cap.map(Result::unwrap).collect();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].number, 1);
        assert_eq!(frames[0].data, &[1, 2, 3]);
        assert_eq!(frames[0].link_type, LinkType::ETHERNET);
        assert_eq!(frames[1].number, 2);
        assert_eq!(frames[1].data, &[4, 5]);
        assert_eq!(frames[1].orig_len, 2);
    }

    #[test]
    fn big_endian_legacy() {
        let mut v = Vec::new();
        v.extend_from_slice(&0xa1b2_c3d4u32.to_be_bytes());
        v.extend_from_slice(&2u16.to_be_bytes());
        v.extend_from_slice(&4u16.to_be_bytes());
        v.extend_from_slice(&[0; 8]);
        v.extend_from_slice(&65535u32.to_be_bytes());
        v.extend_from_slice(&101u32.to_be_bytes());
        v.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1, 0x45]);
        let frames: Vec<_> = Capture::new(&v).unwrap().map(Result::unwrap).collect();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].link_type, LinkType::RAW);
        assert_eq!(frames[0].data, &[0x45]);
    }

    #[test]
    fn truncated_last_record() {
        let mut v = pcap_header();
        record(&mut v, &[1, 2, 3]);
        record(&mut v, &[4, 5, 6, 7]);
        v.truncate(v.len() - 2);
        let mut cap = Capture::new(&v).unwrap();
        assert!(cap.next().unwrap().is_ok());
        assert_eq!(
            cap.next().unwrap(),
            Err(CaptureError::Truncated { frame: 2 })
        );
        assert!(cap.next().is_none());
        // Truncated inside the record header too.
        let mut v = pcap_header();
        v.extend_from_slice(&[1, 0, 0]);
        let mut cap = Capture::new(&v).unwrap();
        assert_eq!(
            cap.next().unwrap(),
            Err(CaptureError::Truncated { frame: 1 })
        );
    }

    #[test]
    fn not_a_capture() {
        assert!(matches!(
            Capture::new(b""),
            Err(CaptureError::NotACapture(_))
        ));
        assert!(matches!(
            Capture::new(b"hello, world, this is not a pcap file at all"),
            Err(CaptureError::NotACapture(_))
        ));
        assert!(matches!(
            Capture::new(&[0xd4, 0xc3]),
            Err(CaptureError::NotACapture(_))
        ));
    }

    fn ng_block(v: &mut Vec<u8>, kind: u32, body: &[u8]) {
        let len = 12 + body.len().div_ceil(4) * 4;
        v.extend_from_slice(&kind.to_le_bytes());
        v.extend_from_slice(&(len as u32).to_le_bytes());
        v.extend_from_slice(body);
        v.resize(v.len() + (4 - body.len() % 4) % 4, 0);
        v.extend_from_slice(&(len as u32).to_le_bytes());
    }

    fn pcapng_file(packets: &[&[u8]]) -> Vec<u8> {
        let mut v = Vec::new();
        let mut shb = Vec::new();
        shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
        shb.extend_from_slice(&1u16.to_le_bytes());
        shb.extend_from_slice(&0u16.to_le_bytes());
        shb.extend_from_slice(&(-1i64).to_le_bytes());
        ng_block(&mut v, 0x0a0d_0d0a, &shb);
        let mut idb = Vec::new();
        idb.extend_from_slice(&1u16.to_le_bytes());
        idb.extend_from_slice(&0u16.to_le_bytes());
        idb.extend_from_slice(&0u32.to_le_bytes());
        ng_block(&mut v, 1, &idb);
        for p in packets {
            let mut epb = Vec::new();
            epb.extend_from_slice(&0u32.to_le_bytes());
            epb.extend_from_slice(&0u32.to_le_bytes());
            epb.extend_from_slice(&0u32.to_le_bytes());
            epb.extend_from_slice(&(p.len() as u32).to_le_bytes());
            epb.extend_from_slice(&(p.len() as u32).to_le_bytes());
            epb.extend_from_slice(p);
            ng_block(&mut v, 6, &epb);
        }
        v
    }

    #[test]
    fn pcapng_packets() {
        let v = pcapng_file(&[&[9, 8, 7], &[6, 5, 4, 3, 2]]);
        let cap = Capture::new(&v).unwrap();
        assert_eq!(cap.format(), Format::Pcapng);
        let frames: Vec<_> = cap.map(Result::unwrap).collect();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].number, 1);
        assert_eq!(frames[0].data, &[9, 8, 7]);
        assert_eq!(frames[1].number, 2);
        assert_eq!(frames[1].data, &[6, 5, 4, 3, 2]);
        assert_eq!(frames[1].link_type, LinkType::ETHERNET);
    }

    #[test]
    fn pcapng_truncated_and_garbage_do_not_panic() {
        let v = pcapng_file(&[&[9, 8, 7], &[6, 5, 4, 3, 2]]);
        for cut in 0..v.len() {
            if let Ok(cap) = Capture::new(&v[..cut]) {
                let _ = cap.count();
            }
        }
        let mut g = v.clone();
        let mut x: u32 = 12345;
        for i in 28..g.len() {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            if x.is_multiple_of(7) {
                g[i] = (x >> 16) as u8;
            }
            if let Ok(cap) = Capture::new(&g) {
                let _ = cap.count();
            }
        }
    }

    #[test]
    fn legacy_garbage_does_not_panic() {
        let mut v = pcap_header();
        record(&mut v, &[1, 2, 3]);
        record(&mut v, &[4, 5, 6, 7]);
        for cut in 0..v.len() {
            if let Ok(cap) = Capture::new(&v[..cut]) {
                let _ = cap.count();
            }
        }
        // A record claiming 4 GiB of data.
        let mut v = pcap_header();
        v.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0]);
        let mut cap = Capture::new(&v).unwrap();
        assert_eq!(
            cap.next().unwrap(),
            Err(CaptureError::Truncated { frame: 1 })
        );
    }
}
