//! A soft device described in one line of text: the `SOFTIWARP_DEVICE` environment
//! variable of programs that cannot take options of ours (an unmodified rdma-core
//! application under libsoftiwarp), and any tool that wants the same syntax.
//!
//! The line is comma-separated `key=value` pairs:
//!
//! | key | value | default |
//! |---|---|---|
//! | `name` | the device name (`ibv_get_device_name`), 1..=63 bytes of `[A-Za-z0-9_.-]` | `softiwarp0`; with `netdev`, `siw_IFNAME` ([`netdev_device_name`]) |
//! | `netdev` | a host interface by name: the device runs on the host's kernel TCP on that interface's addresses (`LinkConfig::netdev`, as `rdma link add NAME type siw netdev IFNAME`); excludes `link`, `peer`, `ip`, `mac`, `mtu` | - |
//! | `link` | `tap:IFNAME`, or `udp:BIND_ADDR:PORT` (the UDP link's local end) | required unless `netdev` |
//! | `peer` | the UDP link's other end, `ADDR:PORT` | required with `udp:`, refused with `tap:` |
//! | `ip` | the device's IPv4 address and prefix, `ADDR/PREFIX` | required unless `netdev` |
//! | `mac` | `xx:xx:xx:xx:xx:xx` | `02:00:` + the address's four bytes |
//! | `mtu` | IP MTU in bytes (UDP link only; a TAP's MTU is the interface's) | 1500 |
//! | `crc` | `on` (ask for MPA CRC) or `off` (use it when the peer asks) | `on` |
//! | `mpa_rev` | `1` or `2` | `2` |
//! | `p2p` | `on` (MPA peer-to-peer mode with a Read RTR, as iw_cxgb4) or `off` | `off` |
//! | `first_fpdu_delay_ms` | as the connecting side, hold the first FPDU this many milliseconds after the MPA Reply, 0..=1000 (`MpaConfig::first_fpdu_delay_us`) | [`DEFAULT_FIRST_FPDU_DELAY_MS`] |
//! | `tcp_buffer` | each connection's TCP send and receive buffer in bytes, [`MIN_TCP_BUFFER`]..=[`MAX_SPEC_TCP_BUFFER`] (`TcpConfig::rx_buffer`, `tx_buffer`); 1048576 lets bulk runs at MTU 1500 fill whole super-segments (docs/ARCHITECTURE.md, "TAP segmentation offload") | 262144 (`TcpConfig::default`) |
//!
//! A `netdev` line (`netdev=eth0`, optionally with `name` and the MPA and TCP keys) is a
//! host-TCP device: its addresses, MTU and ports are the interface's and the kernel's,
//! so the keys that describe a link of our own are refused beside it. The MAC (the GID)
//! of such a device is the caller's to fill in from the interface
//! ([`DeviceSpec::to_config`] leaves the default).
//!
//! [`DeviceSpec::parse`] names the key and the problem in its error
//! ([`SpecError`]), so a caller can print one line and go on without a device.

use std::net::{Ipv4Addr, SocketAddr};

use mpa::negotiate::{CrcPolicy, LocalSettings};

use crate::link::UdpConfig;
use crate::{DeviceConfig, LinkConfig};

/// Default device name: `softiwarp0`.
pub const DEFAULT_NAME: &str = "softiwarp0";

/// Longest device name in bytes: 63 (libibverbs' `IBV_SYSFS_NAME_MAX` less its NUL).
pub const MAX_NAME: usize = 63;

/// Longest interface name in bytes: 15 (the kernel's `IFNAMSIZ` less its NUL).
pub const MAX_IFNAME: usize = 15;

/// The name of the device on host interface `ifname`: `siw_` + the interface name (as
/// rdma-core users name a kernel siw device, `rdma link add siw_eth0 type siw netdev
/// eth0`), cut to [`MAX_NAME`] bytes at a character boundary.
pub fn netdev_device_name(ifname: &str) -> String {
    let mut name = format!("siw_{ifname}");
    let mut end = name.len().min(MAX_NAME);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name.truncate(end);
    name
}

/// Default of the `first_fpdu_delay_ms` key, in milliseconds: 20, as iwping's. A device
/// described by a line serves programs that talk to foreign peers, and a Linux siw
/// responder (6.1) leaves an FPDU that arrives right behind its MPA Reply unread in its
/// socket until more data comes (`siw_accept` installs the QP's receive upcall after
/// sending the Reply; docs/ARCHITECTURE.md, "Interop with kernel siw"): an rping client
/// then hangs. The hold costs the connecting side 20 ms once per connection.
pub const DEFAULT_FIRST_FPDU_DELAY_MS: u64 = 20;

/// Smallest `tcp_buffer` value, bytes (16 KiB: room for a few FPDUs at MTU 1500).
pub const MIN_TCP_BUFFER: usize = 16 * 1024;

/// Largest `tcp_buffer` value, bytes (64 MiB; each connection holds two such buffers).
pub const MAX_SPEC_TCP_BUFFER: usize = 64 * 1024 * 1024;

/// Which link a [`DeviceSpec`] names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkKind {
    /// A TAP interface by name (`link=tap:IFNAME`).
    Tap(String),
    /// A UDP link from `bind` to `peer` (`link=udp:BIND:PORT,peer=ADDR:PORT`).
    Udp {
        /// Local address and port.
        bind: SocketAddr,
        /// The other end.
        peer: SocketAddr,
    },
    /// A host interface by name, the host's kernel TCP on its addresses (`netdev=IFNAME`).
    Netdev(String),
}

/// A parsed `SOFTIWARP_DEVICE` line (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// Device name.
    pub name: String,
    /// The link.
    pub link: LinkKind,
    /// IPv4 address (`0.0.0.0` for a `netdev` device: it has its interface's).
    pub ip: Ipv4Addr,
    /// Prefix length, 0..=32 (0 for a `netdev` device).
    pub prefix: u8,
    /// MAC address, if given.
    pub mac: Option<[u8; 6]>,
    /// IP MTU in bytes (UDP link; unused otherwise).
    pub mtu: usize,
    /// Ask for MPA CRC.
    pub crc: bool,
    /// MPA revision, 1 or 2.
    pub mpa_rev: u8,
    /// MPA peer-to-peer mode with a Read RTR.
    pub p2p: bool,
    /// Initiator's hold of its first FPDU after the MPA Reply, in milliseconds.
    pub first_fpdu_delay_ms: u64,
    /// Each connection's TCP send and receive buffer in bytes, if given (else the
    /// device default, `TcpConfig::default`).
    pub tcp_buffer: Option<usize>,
}

/// Why a `SOFTIWARP_DEVICE` line was refused: the key, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SOFTIWARP_DEVICE: {key}: {problem}")]
pub struct SpecError {
    /// The key at fault (`link`, `ip`, ...; `SOFTIWARP_DEVICE` for the line as a whole).
    pub key: String,
    /// What is wrong, in words.
    pub problem: String,
}

/// The `link` value before `peer` and `mtu` are checked against it.
enum RawLink {
    Tap(String),
    Udp(SocketAddr),
}

fn err(key: &str, problem: impl Into<String>) -> SpecError {
    SpecError {
        key: key.to_owned(),
        problem: problem.into(),
    }
}

fn on_off(key: &str, v: &str) -> Result<bool, SpecError> {
    match v {
        "on" | "1" | "true" | "yes" => Ok(true),
        "off" | "0" | "false" | "no" => Ok(false),
        _ => Err(err(key, format!("{v:?} is not on or off"))),
    }
}

fn parse_mac(v: &str) -> Result<[u8; 6], SpecError> {
    let bad = || {
        err(
            "mac",
            format!("{v:?} is not six hex bytes like 02:00:0a:00:00:01"),
        )
    };
    let parts: Vec<&str> = v.split(':').collect();
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(parts) {
        if p.len() != 2 {
            return Err(bad());
        }
        *m = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    if mac[0] & 1 == 1 {
        return Err(err("mac", format!("{v} is a multicast address")));
    }
    Ok(mac)
}

/// The keys of a line as given, before they are checked against each other.
#[derive(Default)]
struct Keys {
    name: Option<String>,
    netdev: Option<String>,
    link: Option<RawLink>,
    peer: Option<SocketAddr>,
    ip: Option<(Ipv4Addr, u8)>,
    mac: Option<[u8; 6]>,
    mtu: Option<usize>,
    crc: Option<bool>,
    mpa_rev: Option<u8>,
    p2p: Option<bool>,
    delay: Option<u64>,
    tcp_buffer: Option<usize>,
}

/// Checks an interface name as the kernel does (`dev_valid_name`): 1..=15 bytes, not
/// `.` or `..`, no `/`, `:` or white space.
fn check_ifname(key: &str, v: &str) -> Result<(), SpecError> {
    let ok = (1..=MAX_IFNAME).contains(&v.len())
        && v != "."
        && v != ".."
        && !v.chars().any(|c| c == '/' || c == ':' || c.is_whitespace());
    if ok {
        Ok(())
    } else {
        Err(err(
            key,
            format!("{v:?} is not an interface name (1-15 bytes, no '/', ':' or spaces)"),
        ))
    }
}

impl Keys {
    /// Stores one `key=value` pair.
    fn set(&mut self, key: &str, value: &str) -> Result<(), SpecError> {
        fn once<T>(slot: &mut Option<T>, key: &str, v: T) -> Result<(), SpecError> {
            if slot.is_some() {
                return Err(err(key, "given twice"));
            }
            *slot = Some(v);
            Ok(())
        }
        match key {
            "name" => {
                let ok = (1..=MAX_NAME).contains(&value.len())
                    && value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
                if !ok {
                    return Err(err(key, format!("{value:?} is not 1-63 of [A-Za-z0-9_.-]")));
                }
                once(&mut self.name, key, value.to_owned())
            }
            "netdev" => {
                check_ifname(key, value)?;
                once(&mut self.netdev, key, value.to_owned())
            }
            "link" => {
                let l = if let Some(ifname) = value.strip_prefix("tap:") {
                    if ifname.is_empty() || ifname.len() > MAX_IFNAME {
                        return Err(err(key, format!("TAP name {ifname:?} is not 1-15 bytes")));
                    }
                    RawLink::Tap(ifname.to_owned())
                } else if let Some(addr) = value.strip_prefix("udp:") {
                    RawLink::Udp(
                        addr.parse::<SocketAddr>()
                            .map_err(|_| err(key, format!("{addr:?} is not ADDR:PORT")))?,
                    )
                } else {
                    return Err(err(
                        key,
                        format!("{value:?} is neither tap:IFNAME nor udp:ADDR:PORT"),
                    ));
                };
                once(&mut self.link, key, l)
            }
            "peer" => {
                let a = value
                    .parse::<SocketAddr>()
                    .map_err(|_| err(key, format!("{value:?} is not ADDR:PORT")))?;
                once(&mut self.peer, key, a)
            }
            "ip" => {
                let bad = || {
                    err(
                        key,
                        format!("{value:?} is not ADDR/PREFIX like 10.0.0.1/24"),
                    )
                };
                let (a, p) = value.split_once('/').ok_or_else(bad)?;
                let a: Ipv4Addr = a.parse().map_err(|_| bad())?;
                let p: u8 = p.parse().map_err(|_| bad())?;
                if p > 32 {
                    return Err(bad());
                }
                once(&mut self.ip, key, (a, p))
            }
            "mac" => {
                let m = parse_mac(value)?;
                once(&mut self.mac, key, m)
            }
            "mtu" => {
                let m: usize = value
                    .parse()
                    .map_err(|_| err(key, format!("{value:?} is not a number")))?;
                if !(576..=crate::link::UDP_MAX_MTU).contains(&m) {
                    return Err(err(
                        key,
                        format!("{m} is outside 576..={}", crate::link::UDP_MAX_MTU),
                    ));
                }
                once(&mut self.mtu, key, m)
            }
            "crc" => once(&mut self.crc, key, on_off(key, value)?),
            "mpa_rev" => {
                let r = match value {
                    "1" => 1,
                    "2" => 2,
                    _ => return Err(err(key, format!("{value:?} is neither 1 nor 2"))),
                };
                once(&mut self.mpa_rev, key, r)
            }
            "p2p" => once(&mut self.p2p, key, on_off(key, value)?),
            "first_fpdu_delay_ms" => {
                let ms: u64 = value
                    .parse()
                    .map_err(|_| err(key, format!("{value:?} is not a number")))?;
                if ms > 1000 {
                    return Err(err(key, format!("{ms} is outside 0..=1000")));
                }
                once(&mut self.delay, key, ms)
            }
            "tcp_buffer" => {
                let n: usize = value
                    .parse()
                    .map_err(|_| err(key, format!("{value:?} is not a number of bytes")))?;
                if !(MIN_TCP_BUFFER..=MAX_SPEC_TCP_BUFFER).contains(&n) {
                    return Err(err(
                        key,
                        format!("{n} is outside {MIN_TCP_BUFFER}..={MAX_SPEC_TCP_BUFFER}"),
                    ));
                }
                once(&mut self.tcp_buffer, key, n)
            }
            _ => Err(err(
                key,
                "unknown key (known: name, netdev, link, peer, ip, mac, mtu, crc, mpa_rev, p2p, first_fpdu_delay_ms, tcp_buffer)",
            )),
        }
    }

    /// The spec, once the keys agree with each other.
    fn finish(self) -> Result<DeviceSpec, SpecError> {
        let (link, (ip, prefix), default_name) = if let Some(ifname) = self.netdev {
            // The interface is the link: its addresses, MTU and MAC are the host's.
            let given = [
                ("link", self.link.is_some()),
                ("peer", self.peer.is_some()),
                ("ip", self.ip.is_some()),
                ("mac", self.mac.is_some()),
                ("mtu", self.mtu.is_some()),
            ];
            if let Some((key, _)) = given.iter().find(|(_, g)| *g) {
                return Err(err(
                    key,
                    format!(
                        "not with netdev={ifname} (the device runs on that host interface's kernel TCP, with its addresses, MTU and MAC)"
                    ),
                ));
            }
            let name = netdev_device_name(&ifname);
            (LinkKind::Netdev(ifname), (Ipv4Addr::UNSPECIFIED, 0), name)
        } else {
            let link = match self.link.ok_or_else(|| {
                err(
                    "link",
                    "missing (tap:IFNAME or udp:ADDR:PORT, or netdev=IFNAME instead)",
                )
            })? {
                RawLink::Tap(ifname) => {
                    if self.peer.is_some() {
                        return Err(err("peer", "only for a udp: link"));
                    }
                    if self.mtu.is_some() {
                        return Err(err(
                            "mtu",
                            "only for a udp: link (a TAP has its interface's MTU)",
                        ));
                    }
                    LinkKind::Tap(ifname)
                }
                RawLink::Udp(bind) => {
                    let peer = self.peer.ok_or_else(|| {
                        err("peer", "missing (the UDP link's other end, ADDR:PORT)")
                    })?;
                    if bind.is_ipv4() != peer.is_ipv4() {
                        return Err(err(
                            "peer",
                            format!("{peer} and {bind} are of different families"),
                        ));
                    }
                    LinkKind::Udp { bind, peer }
                }
            };
            let ip = self.ip.ok_or_else(|| err("ip", "missing (ADDR/PREFIX)"))?;
            (link, ip, DEFAULT_NAME.to_owned())
        };
        if self.mpa_rev == Some(1) && self.p2p == Some(true) {
            return Err(err("p2p", "needs mpa_rev=2"));
        }
        Ok(DeviceSpec {
            name: self.name.unwrap_or(default_name),
            link,
            ip,
            prefix,
            mac: self.mac,
            mtu: self.mtu.unwrap_or(1500),
            crc: self.crc.unwrap_or(true),
            mpa_rev: self.mpa_rev.unwrap_or(2),
            p2p: self.p2p.unwrap_or(false),
            first_fpdu_delay_ms: self.delay.unwrap_or(DEFAULT_FIRST_FPDU_DELAY_MS),
            tcp_buffer: self.tcp_buffer,
        })
    }
}

impl DeviceSpec {
    /// Parses a line of comma-separated `key=value` pairs (the [module docs](self)).
    ///
    /// Errors: [`SpecError`] naming the first key that is missing, unknown, repeated or
    /// malformed, or that is refused beside another (`ip` with `netdev`, ...).
    pub fn parse(line: &str) -> Result<DeviceSpec, SpecError> {
        let mut keys = Keys::default();
        for pair in line.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| err(pair, "not a key=value pair"))?;
            keys.set(key.trim(), value.trim())?;
        }
        keys.finish()
    }

    /// The line `netdev=IFNAME` and nothing else: a host-TCP device on `ifname` named
    /// [`netdev_device_name`]`(ifname)`, every other key at its default.
    ///
    /// Errors: [`SpecError`] (key `netdev`) if `ifname` is not a valid interface name.
    pub fn netdev(ifname: &str) -> Result<DeviceSpec, SpecError> {
        let mut keys = Keys::default();
        keys.set("netdev", ifname)?;
        keys.finish()
    }

    /// The [`DeviceConfig`] this line describes (defaults for everything it does not
    /// say). With `p2p=on` the MPA settings start from [`LocalSettings::chelsio`]. A
    /// `netdev` line gives [`LinkConfig::netdev`] and leaves the MAC at the default of
    /// `DeviceConfig::new` for the caller to set from the interface.
    pub fn to_config(&self) -> DeviceConfig {
        let link = match &self.link {
            LinkKind::Tap(ifname) => LinkConfig::tap(ifname),
            LinkKind::Udp { bind, peer } => LinkConfig::udp(UdpConfig {
                bind: *bind,
                peer: *peer,
                mtu: self.mtu,
            }),
            LinkKind::Netdev(ifname) => LinkConfig::netdev(ifname),
        };
        let mut cfg = DeviceConfig::new(&self.name, link, self.ip, self.prefix);
        if let Some(mac) = self.mac {
            cfg.interface.mac = mac;
        }
        let mut settings = if self.p2p {
            LocalSettings::chelsio()
        } else {
            LocalSettings::default()
        };
        settings.rev = self.mpa_rev;
        settings.crc = if self.crc {
            CrcPolicy::Wanted
        } else {
            CrcPolicy::IfPeerAsks
        };
        cfg.mpa.settings = settings;
        cfg.mpa.first_fpdu_delay_us = self.first_fpdu_delay_ms * 1000;
        if let Some(n) = self.tcp_buffer {
            cfg.tcp.rx_buffer = n;
            cfg.tcp.tx_buffer = n;
        }
        cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_udp_line_parses_to_every_field() {
        let s = DeviceSpec::parse(
            "name=sw1, link=udp:127.0.0.1:7000,peer=127.0.0.1:7001,ip=10.5.0.1/24,\
             mac=02:aa:00:00:00:01,mtu=9000,crc=off,mpa_rev=2,p2p=on,first_fpdu_delay_ms=0,\
             tcp_buffer=1048576",
        )
        .unwrap();
        assert_eq!(
            s,
            DeviceSpec {
                name: "sw1".into(),
                link: LinkKind::Udp {
                    bind: "127.0.0.1:7000".parse().unwrap(),
                    peer: "127.0.0.1:7001".parse().unwrap(),
                },
                ip: Ipv4Addr::new(10, 5, 0, 1),
                prefix: 24,
                mac: Some([2, 0xaa, 0, 0, 0, 1]),
                mtu: 9000,
                crc: false,
                mpa_rev: 2,
                p2p: true,
                first_fpdu_delay_ms: 0,
                tcp_buffer: Some(1 << 20),
            }
        );
        let cfg = s.to_config();
        assert_eq!(cfg.name, "sw1");
        assert_eq!(cfg.interface.mac, [2, 0xaa, 0, 0, 0, 1]);
        assert!(cfg.mpa.settings.p2p);
        assert_eq!(cfg.mpa.settings.crc, CrcPolicy::IfPeerAsks);
        assert_eq!(cfg.mpa.first_fpdu_delay_us, 0);
        assert!(matches!(cfg.link.spec, crate::LinkSpec::Udp(ref u) if u.mtu == 9000));
        assert_eq!((cfg.tcp.rx_buffer, cfg.tcp.tx_buffer), (1 << 20, 1 << 20));
    }

    #[test]
    fn a_tap_line_takes_the_defaults() {
        let s = DeviceSpec::parse("link=tap:swtap0,ip=10.0.0.2/16").unwrap();
        assert_eq!(s.name, DEFAULT_NAME);
        assert_eq!(s.link, LinkKind::Tap("swtap0".into()));
        assert_eq!(
            (s.ip, s.prefix, s.mac, s.mtu),
            (Ipv4Addr::new(10, 0, 0, 2), 16, None, 1500)
        );
        assert_eq!((s.crc, s.mpa_rev, s.p2p), (true, 2, false));
        assert_eq!(s.first_fpdu_delay_ms, 20);
        let cfg = s.to_config();
        assert_eq!(cfg.interface.mac, [2, 0, 10, 0, 0, 2]);
        assert_eq!(cfg.mpa.first_fpdu_delay_us, 20_000);
        assert_eq!(cfg.mpa.settings.crc, CrcPolicy::Wanted);
        assert_eq!(s.tcp_buffer, None);
        let default = crate::transport::smoltcp_glue::TcpConfig::default();
        assert_eq!(
            (cfg.tcp.rx_buffer, cfg.tcp.tx_buffer),
            (default.rx_buffer, default.tx_buffer)
        );
    }

    #[test]
    fn a_netdev_line_is_a_host_tcp_device_named_after_the_interface() {
        let s = DeviceSpec::parse("netdev=lo").unwrap();
        assert_eq!(s.name, "siw_lo");
        assert_eq!(s.link, LinkKind::Netdev("lo".into()));
        assert_eq!((s.ip, s.prefix, s.mac), (Ipv4Addr::UNSPECIFIED, 0, None));
        assert_eq!((s.crc, s.mpa_rev, s.p2p), (true, 2, false));
        assert_eq!(s.first_fpdu_delay_ms, DEFAULT_FIRST_FPDU_DELAY_MS);
        assert_eq!(DeviceSpec::netdev("lo").unwrap(), s);
        let cfg = s.to_config();
        assert_eq!(cfg.name, "siw_lo");
        assert!(matches!(cfg.link.spec, crate::LinkSpec::Netdev(ref n) if n == "lo"));

        // The MPA and TCP keys apply; a name replaces the default.
        let s =
            DeviceSpec::parse("netdev=eth0,name=rdma0,p2p=on,crc=off,tcp_buffer=1048576").unwrap();
        assert_eq!(s.name, "rdma0");
        assert_eq!(s.link, LinkKind::Netdev("eth0".into()));
        let cfg = s.to_config();
        assert!(cfg.mpa.settings.p2p);
        assert_eq!(cfg.mpa.settings.crc, CrcPolicy::IfPeerAsks);
        assert_eq!((cfg.tcp.rx_buffer, cfg.tcp.tx_buffer), (1 << 20, 1 << 20));
    }

    #[test]
    fn netdev_device_names_are_siw_and_the_interface_cut_to_63_bytes() {
        assert_eq!(netdev_device_name("eth0"), "siw_eth0");
        assert_eq!(netdev_device_name("enp0s31f6"), "siw_enp0s31f6");
        let long = netdev_device_name(&"x".repeat(100));
        assert_eq!(long.len(), MAX_NAME);
        assert!(long.starts_with("siw_xxx"));
        // Never in the middle of a character.
        let cut = netdev_device_name(&"é".repeat(40));
        assert!(cut.len() <= MAX_NAME && cut.ends_with('é'), "{cut}");
    }

    #[test]
    fn netdev_refuses_the_keys_of_a_link_of_our_own_and_bad_interface_names() {
        for (extra, key) in [
            ("link=tap:t0", "link"),
            ("link=udp:127.0.0.1:1", "link"),
            ("peer=127.0.0.1:2", "peer"),
            ("ip=10.0.0.1/24", "ip"),
            ("mac=02:00:00:00:00:01", "mac"),
            ("mtu=9000", "mtu"),
        ] {
            for line in [format!("netdev=lo,{extra}"), format!("{extra},netdev=lo")] {
                let e = DeviceSpec::parse(&line).unwrap_err();
                assert_eq!(e.key, key, "{line}: {e}");
                assert!(e.problem.starts_with("not with netdev=lo"), "{line}: {e}");
                assert!(e
                    .to_string()
                    .starts_with(&format!("SOFTIWARP_DEVICE: {key}: ")));
            }
        }
        for bad in ["", "a/b", "a:1", "a b", ".", "..", "sixteen-bytes-xx"] {
            let e = DeviceSpec::parse(&format!("netdev={bad}")).unwrap_err();
            assert_eq!(e.key, "netdev", "{bad:?}: {e}");
            assert!(e.problem.contains("not an interface name"), "{bad:?}: {e}");
            assert_eq!(DeviceSpec::netdev(bad).unwrap_err(), e);
        }
        let e = DeviceSpec::parse("netdev=lo,netdev=eth0").unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.problem.as_str()),
            ("netdev", "given twice")
        );
        let e = DeviceSpec::parse("netdev=lo,mpa_rev=1,p2p=on").unwrap_err();
        assert_eq!(e.key, "p2p");
        // Without netdev, a line without a link says both ways of giving one.
        let e = DeviceSpec::parse("ip=10.0.0.1/24").unwrap_err();
        assert!(e.problem.contains("netdev=IFNAME"), "{e}");
    }

    #[test]
    fn each_problem_names_its_key() {
        let cases: &[(&str, &str, &str)] = &[
            ("ip=10.0.0.1/24", "link", "missing"),
            ("link=tap:t0", "ip", "missing"),
            ("link=udp:127.0.0.1:1,ip=10.0.0.1/24", "peer", "missing"),
            (
                "link=tap:t0,peer=1.2.3.4:5,ip=10.0.0.1/24",
                "peer",
                "only for a udp",
            ),
            (
                "link=tap:t0,mtu=9000,ip=10.0.0.1/24",
                "mtu",
                "only for a udp",
            ),
            ("link=eth:x,ip=10.0.0.1/24", "link", "neither"),
            (
                "link=udp:nowhere,peer=1.2.3.4:5,ip=10.0.0.1/24",
                "link",
                "not ADDR:PORT",
            ),
            ("link=tap:t0,ip=10.0.0.1", "ip", "ADDR/PREFIX"),
            ("link=tap:t0,ip=10.0.0.1/33", "ip", "ADDR/PREFIX"),
            (
                "link=tap:t0,ip=10.0.0.1/24,mac=01:00:00:00:00:01",
                "mac",
                "multicast",
            ),
            ("link=tap:t0,ip=10.0.0.1/24,mac=zz", "mac", "six hex bytes"),
            ("link=tap:t0,ip=10.0.0.1/24,crc=maybe", "crc", "on or off"),
            (
                "link=tap:t0,ip=10.0.0.1/24,mpa_rev=3",
                "mpa_rev",
                "neither 1 nor 2",
            ),
            (
                "link=tap:t0,ip=10.0.0.1/24,mpa_rev=1,p2p=on",
                "p2p",
                "mpa_rev=2",
            ),
            (
                "link=tap:t0,ip=10.0.0.1/24,first_fpdu_delay_ms=1001",
                "first_fpdu_delay_ms",
                "outside 0..=1000",
            ),
            (
                "link=tap:t0,ip=10.0.0.1/24,first_fpdu_delay_ms=soon",
                "first_fpdu_delay_ms",
                "not a number",
            ),
            (
                "link=tap:t0,ip=10.0.0.1/24,tcp_buffer=1000",
                "tcp_buffer",
                "outside 16384..=67108864",
            ),
            (
                "link=tap:t0,ip=10.0.0.1/24,tcp_buffer=1M",
                "tcp_buffer",
                "not a number",
            ),
            (
                "link=tap:t0,ip=10.0.0.1/24,colour=blue",
                "colour",
                "unknown key",
            ),
            ("link=tap:t0,ip=10.0.0.1/24,ip=10.0.0.2/24", "ip", "twice"),
            ("link=tap:t0,ip=10.0.0.1/24,name=a b", "name", "not 1-63"),
            ("link=tap:t0,ip=10.0.0.1/24,oops", "oops", "key=value"),
            (
                "link=udp:127.0.0.1:1,peer=127.0.0.1:2,ip=10.0.0.1/24,mtu=70000",
                "mtu",
                "outside",
            ),
        ];
        for (line, key, problem) in cases {
            let e = DeviceSpec::parse(line).unwrap_err();
            assert_eq!(e.key, *key, "{line}: {e}");
            assert!(e.problem.contains(problem), "{line}: {e}");
            assert!(e
                .to_string()
                .starts_with(&format!("SOFTIWARP_DEVICE: {key}: ")));
        }
    }
}
