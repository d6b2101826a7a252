//! Address and route selection, sans-IO: which device reaches a destination, with
//! which source address, through which next hop. Pure functions over a snapshot of the
//! registered devices' IPv4 configuration (what `rdma_resolve_addr` asks the kernel's
//! routing table through `rdma_resolve_ip` / `addr4_resolve`).
//!
//! The rules, in order:
//!
//! 1. A source address, if given (or bound with `bind_addr`), must belong to a device
//!    ([`RouteError::SourceNotLocal`] otherwise); only that device is considered.
//! 2. **Local**: the destination is one of the candidate devices' own addresses: that
//!    device, next hop = the destination (the kernel's loopback case).
//! 3. **Kernel**: a device on the host kernel's TCP that owns the source address the
//!    kernel's route to the destination uses ([`DeviceRoutes::kernel_source`]): that
//!    device, next hop = the destination, source = that address (a given source must
//!    equal it).
//! 4. **Direct**: the longest-prefix subnet containing the destination, over every
//!    candidate device's addresses (ties: the device added first, then its first
//!    address); next hop = the destination. Source = the given one, or that subnet's
//!    address.
//! 5. **Gateway**: the first candidate device (in the order they were added) with a
//!    gateway inside one of its subnets; next hop = the gateway; source = the given one,
//!    or the address of the subnet holding the gateway.
//! 6. Otherwise [`RouteError::Unreachable`] (the kernel's `-ENETUNREACH`, delivered as
//!    an `AddrError` event).

use core::fmt;
use std::net::Ipv4Addr;

/// An IPv4 address of a device with its prefix length (an interface address:
/// `10.0.0.1/24`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Subnet {
    /// The device's address.
    pub addr: Ipv4Addr,
    /// The prefix length, 0..=32.
    pub prefix_len: u8,
}

impl Ipv4Subnet {
    /// `addr/prefix_len` (a prefix above 32 is treated as 32).
    pub const fn new(addr: Ipv4Addr, prefix_len: u8) -> Ipv4Subnet {
        Ipv4Subnet {
            addr,
            prefix_len: if prefix_len > 32 { 32 } else { prefix_len },
        }
    }

    /// The netmask as a `u32`.
    pub const fn mask(&self) -> u32 {
        if self.prefix_len == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix_len as u32)
        }
    }

    /// Whether `ip` is inside the subnet.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        (u32::from(ip) & self.mask()) == (u32::from(self.addr) & self.mask())
    }
}

impl fmt::Display for Ipv4Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// One device's IPv4 configuration, as route selection sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRoutes {
    /// The device's addresses.
    pub addrs: Vec<Ipv4Subnet>,
    /// Its default gateway, if any.
    pub gateway: Option<Ipv4Addr>,
    /// The source address the host kernel routes the destination from, for a device on
    /// the kernel's TCP ([`crate::CmDevice::route_source`]); `None` otherwise.
    pub kernel_source: Option<Ipv4Addr>,
}

/// How a destination is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteKind {
    /// The destination is the device's own address.
    Local,
    /// The destination is on one of the device's subnets.
    Direct,
    /// Through the device's gateway.
    Gateway,
    /// Where the host kernel's route goes: the device owns the source address the
    /// kernel picked ([`DeviceRoutes::kernel_source`]).
    Kernel,
}

/// The chosen route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Route {
    /// Index of the device in the slice given to [`select_route`].
    pub device: usize,
    /// The source address.
    pub src: Ipv4Addr,
    /// Where to send (and resolve the hardware address of): the destination, or the
    /// gateway.
    pub next_hop: Ipv4Addr,
    /// How.
    pub kind: RouteKind,
}

/// Why no route was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum RouteError {
    /// The given source address belongs to no device (`-EADDRNOTAVAIL`).
    #[error("source address {0} belongs to no device")]
    SourceNotLocal(Ipv4Addr),
    /// No device reaches the destination (`-ENETUNREACH`).
    #[error("no device reaches {0}")]
    Unreachable(Ipv4Addr),
    /// The destination cannot be connected to (unspecified, broadcast or multicast;
    /// `-EINVAL`).
    #[error("{0} is not a unicast destination")]
    NotUnicast(Ipv4Addr),
}

/// Choose the device, source address and next hop for `dst` (see the module docs for
/// the rules).
///
/// # Errors
/// [`RouteError`].
pub fn select_route(
    devices: &[DeviceRoutes],
    dst: Ipv4Addr,
    src: Option<Ipv4Addr>,
) -> Result<Route, RouteError> {
    if dst.is_unspecified() || dst.is_broadcast() || dst.is_multicast() {
        return Err(RouteError::NotUnicast(dst));
    }
    let candidates: Vec<usize> = match src {
        Some(s) => {
            let owner = devices
                .iter()
                .position(|d| d.addrs.iter().any(|a| a.addr == s))
                .ok_or(RouteError::SourceNotLocal(s))?;
            vec![owner]
        }
        None => (0..devices.len()).collect(),
    };
    // 2. Local.
    for &i in &candidates {
        if devices[i].addrs.iter().any(|a| a.addr == dst) {
            return Ok(Route {
                device: i,
                src: src.unwrap_or(dst),
                next_hop: dst,
                kind: RouteKind::Local,
            });
        }
    }
    // 3. The kernel's route, for devices on the kernel's TCP.
    for &i in &candidates {
        if let Some(ks) = devices[i].kernel_source {
            if devices[i].addrs.iter().any(|a| a.addr == ks) && src.is_none_or(|s| s == ks) {
                return Ok(Route {
                    device: i,
                    src: ks,
                    next_hop: dst,
                    kind: RouteKind::Kernel,
                });
            }
        }
    }
    // 4. Direct: longest prefix; ties keep the first found.
    let mut best: Option<(usize, Ipv4Subnet)> = None;
    for &i in &candidates {
        for a in &devices[i].addrs {
            if a.contains(dst) && best.is_none_or(|(_, b)| a.prefix_len > b.prefix_len) {
                best = Some((i, *a));
            }
        }
    }
    if let Some((i, a)) = best {
        return Ok(Route {
            device: i,
            src: src.unwrap_or(a.addr),
            next_hop: dst,
            kind: RouteKind::Direct,
        });
    }
    // 5. Gateway.
    for &i in &candidates {
        if let Some(gw) = devices[i].gateway {
            if let Some(a) = devices[i].addrs.iter().find(|a| a.contains(gw)) {
                return Ok(Route {
                    device: i,
                    src: src.unwrap_or(a.addr),
                    next_hop: gw,
                    kind: RouteKind::Gateway,
                });
            }
        }
    }
    Err(RouteError::Unreachable(dst))
}

/// The index of the device owning `ip`, if any.
pub fn device_owning(devices: &[DeviceRoutes], ip: Ipv4Addr) -> Option<usize> {
    devices
        .iter()
        .position(|d| d.addrs.iter().any(|a| a.addr == ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn dev(addrs: &[(&str, u8)], gw: Option<&str>) -> DeviceRoutes {
        DeviceRoutes {
            kernel_source: None,
            addrs: addrs
                .iter()
                .map(|&(a, p)| Ipv4Subnet::new(ip(a), p))
                .collect(),
            gateway: gw.map(ip),
        }
    }

    #[test]
    fn subnet_contains() {
        let s = Ipv4Subnet::new(ip("10.1.2.3"), 24);
        assert!(s.contains(ip("10.1.2.200")));
        assert!(!s.contains(ip("10.1.3.1")));
        assert!(Ipv4Subnet::new(ip("1.2.3.4"), 0).contains(ip("200.1.1.1")));
        assert!(Ipv4Subnet::new(ip("1.2.3.4"), 32).contains(ip("1.2.3.4")));
        assert!(!Ipv4Subnet::new(ip("1.2.3.4"), 32).contains(ip("1.2.3.5")));
        assert_eq!(Ipv4Subnet::new(ip("1.2.3.4"), 40).prefix_len, 32);
        assert_eq!(Ipv4Subnet::new(ip("1.2.3.4"), 20).to_string(), "1.2.3.4/20");
    }

    #[test]
    fn direct_route_picks_the_device_whose_subnet_holds_the_destination() {
        let devs = [
            dev(&[("10.0.0.1", 24)], None),
            dev(&[("10.0.1.1", 24)], None),
        ];
        let r = select_route(&devs, ip("10.0.1.9"), None).unwrap();
        assert_eq!(
            r,
            Route {
                device: 1,
                src: ip("10.0.1.1"),
                next_hop: ip("10.0.1.9"),
                kind: RouteKind::Direct
            }
        );
    }

    #[test]
    fn longest_prefix_wins_and_ties_keep_the_first_device() {
        let devs = [
            dev(&[("10.0.0.1", 16)], None),
            dev(&[("10.0.5.1", 24)], None),
            dev(&[("10.0.5.2", 24)], None),
        ];
        let r = select_route(&devs, ip("10.0.5.9"), None).unwrap();
        assert_eq!((r.device, r.src), (1, ip("10.0.5.1")));
        let r = select_route(&devs, ip("10.0.6.9"), None).unwrap();
        assert_eq!((r.device, r.src), (0, ip("10.0.0.1")));
    }

    #[test]
    fn second_address_of_a_device_is_used_when_its_subnet_matches() {
        let devs = [dev(&[("10.0.0.1", 24), ("192.168.7.1", 24)], None)];
        let r = select_route(&devs, ip("192.168.7.40"), None).unwrap();
        assert_eq!(r.src, ip("192.168.7.1"));
    }

    #[test]
    fn gateway_route_when_no_subnet_matches() {
        let devs = [
            dev(&[("10.0.0.1", 24)], None),
            dev(&[("10.0.1.1", 24)], Some("10.0.1.254")),
        ];
        let r = select_route(&devs, ip("8.8.8.8"), None).unwrap();
        assert_eq!(
            r,
            Route {
                device: 1,
                src: ip("10.0.1.1"),
                next_hop: ip("10.0.1.254"),
                kind: RouteKind::Gateway
            }
        );
        // A gateway outside the device's subnets is unusable.
        let devs = [dev(&[("10.0.0.1", 24)], Some("172.16.0.1"))];
        assert_eq!(
            select_route(&devs, ip("8.8.8.8"), None),
            Err(RouteError::Unreachable(ip("8.8.8.8")))
        );
    }

    #[test]
    fn local_destination() {
        let devs = [
            dev(&[("10.0.0.1", 24)], None),
            dev(&[("10.0.0.2", 24)], None),
        ];
        let r = select_route(&devs, ip("10.0.0.2"), None).unwrap();
        assert_eq!(
            (r.device, r.kind, r.src),
            (1, RouteKind::Local, ip("10.0.0.2"))
        );
    }

    #[test]
    fn source_address_restricts_the_device() {
        let devs = [
            dev(&[("10.0.0.1", 24)], None),
            dev(&[("10.0.0.2", 24)], None),
        ];
        let r = select_route(&devs, ip("10.0.0.9"), Some(ip("10.0.0.2"))).unwrap();
        assert_eq!((r.device, r.src), (1, ip("10.0.0.2")));
        assert_eq!(
            select_route(&devs, ip("10.0.0.9"), Some(ip("10.9.9.9"))),
            Err(RouteError::SourceNotLocal(ip("10.9.9.9")))
        );
        // The source's device does not reach the destination: unreachable, even though
        // another device would.
        let devs = [
            dev(&[("10.0.0.1", 24)], None),
            dev(&[("10.0.1.1", 24)], None),
        ];
        assert_eq!(
            select_route(&devs, ip("10.0.1.5"), Some(ip("10.0.0.1"))),
            Err(RouteError::Unreachable(ip("10.0.1.5")))
        );
    }

    #[test]
    fn non_unicast_destinations_are_refused() {
        let devs = [dev(&[("10.0.0.1", 24)], None)];
        for d in ["0.0.0.0", "255.255.255.255", "224.0.0.1"] {
            assert_eq!(
                select_route(&devs, ip(d), None),
                Err(RouteError::NotUnicast(ip(d)))
            );
        }
        assert_eq!(
            select_route(&[], ip("10.0.0.1"), None),
            Err(RouteError::Unreachable(ip("10.0.0.1")))
        );
    }

    #[test]
    fn device_owning_an_address() {
        let devs = [
            dev(&[("10.0.0.1", 24)], None),
            dev(&[("10.0.1.1", 24), ("10.0.2.1", 24)], None),
        ];
        assert_eq!(device_owning(&devs, ip("10.0.2.1")), Some(1));
        assert_eq!(device_owning(&devs, ip("10.0.2.2")), None);
    }

    #[test]
    fn the_kernels_route_picks_the_host_device_owning_its_source() {
        let mut lo = dev(&[("127.0.0.1", 8)], None);
        let mut eth = dev(&[("192.0.2.2", 24)], None);
        let tap = dev(&[("10.0.0.1", 24)], Some("10.0.0.254"));
        // 198.51.100.7 is off every subnet; the kernel routes it from eth's address.
        eth.kernel_source = Some(ip("192.0.2.2"));
        lo.kernel_source = Some(ip("192.0.2.2"));
        let devs = [lo, tap, eth];
        let r = select_route(&devs, ip("198.51.100.7"), None).unwrap();
        assert_eq!(
            (r.device, r.src, r.next_hop, r.kind),
            (2, ip("192.0.2.2"), ip("198.51.100.7"), RouteKind::Kernel)
        );
        // A source the kernel did not pick keeps the other rules (here: tap's gateway).
        let r = select_route(&devs, ip("198.51.100.7"), Some(ip("10.0.0.1"))).unwrap();
        assert_eq!((r.device, r.kind), (1, RouteKind::Gateway));
        // Without kernel sources nothing reaches it but the gateway.
        let plain = [dev(&[("192.0.2.2", 24)], None)];
        assert_eq!(
            select_route(&plain, ip("198.51.100.7"), None),
            Err(RouteError::Unreachable(ip("198.51.100.7")))
        );
    }
}
