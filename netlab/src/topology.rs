//! The two-namespace topology with its addressing plan.
//!
//! ```text
//!  namespace A                                   namespace B
//!  [peer A: smoltcp 10.234.0.1] -- TAP A         TAP B -- [peer B: smoltcp 10.234.0.2]
//!                                  |               |
//!                               bridge A -- veth -- bridge B
//! ```
//!
//! The kernel interfaces carry no address: each peer's userspace stack owns its IP
//! address and MAC and answers ARP itself. Built by [`crate::netns::TapPair`]
//! (bridge netfilter and IPv6 off, one MTU everywhere, `txqueuelen` 10000, pending link
//! changes committed so no frame is lost at start-up); removed when the [`Topology`] is
//! dropped, also while a panic unwinds.

use std::net::Ipv4Addr;
use std::path::Path;

use crate::link_args::format_mac;
use crate::netns::{is_root, TapPair, TapPairConfig};
use crate::peer::PeerSpec;
use crate::signals::registry;
use crate::HarnessError;

/// One side of a [`Topology`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Namespace A (host 1).
    A,
    /// Namespace B (host 2).
    B,
}

/// Where a peer on one side lives and which addresses its stack uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The namespace name.
    pub netns: String,
    /// The TAP interface in it, for the peer to open.
    pub tap: String,
    /// The IPv4 address the peer's stack owns.
    pub ip: Ipv4Addr,
    /// Prefix length in bits of the subnet both peers are on.
    pub prefix_len: u8,
    /// The MAC address the peer's stack uses (locally administered, unicast).
    pub mac: [u8; 6],
}

/// The IPv4 address of host `n` (1 for A, 2 for B) in the harness's subnet 10.234.0.0/24.
pub fn host_ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 234, 0, n)
}

/// The MAC address of host `n`: `02:00:0a:ea:00:n` (locally administered, unicast).
pub fn host_mac(n: u8) -> [u8; 6] {
    [0x02, 0x00, 0x0a, 0xea, 0x00, n]
}

/// Two namespaces with a TAP each, joined by bridges and a veth; see the
/// [module docs](self). Dropping it deletes every interface and both namespaces.
#[derive(Debug)]
pub struct Topology {
    a: Endpoint,
    b: Endpoint,
    mtu: usize,
    // Dropped after `Drop::drop` below has unregistered the names.
    pair: TapPair,
}

impl Topology {
    /// Builds the topology with every interface at `mtu` bytes (68..=65521) and
    /// `txqueuelen` 10000.
    ///
    /// Errors: [`HarnessError::NotRoot`]; [`HarnessError::Setup`] if an `ip` step fails
    /// (what was built is removed).
    pub fn create(mtu: usize) -> Result<Topology, HarnessError> {
        Topology::with_config(TapPairConfig {
            mtu,
            ..TapPairConfig::default()
        })
    }

    /// Builds the topology as `config` says.
    ///
    /// Errors: as [`Topology::create`].
    pub fn with_config(config: TapPairConfig) -> Result<Topology, HarnessError> {
        if !is_root() {
            return Err(HarnessError::NotRoot);
        }
        let pair = TapPair::create(config).map_err(HarnessError::Setup)?;
        {
            let mut reg = registry();
            reg.namespaces.insert(pair.a.name().to_owned());
            reg.namespaces.insert(pair.b.name().to_owned());
        }
        let endpoint = |ns: &str, tap: &str, n: u8| Endpoint {
            netns: ns.to_owned(),
            tap: tap.to_owned(),
            ip: host_ip(n),
            prefix_len: 24,
            mac: host_mac(n),
        };
        Ok(Topology {
            a: endpoint(pair.a.name(), &pair.tap_a, 1),
            b: endpoint(pair.b.name(), &pair.tap_b, 2),
            mtu: config.mtu,
            pair,
        })
    }

    /// Side A.
    pub fn a(&self) -> &Endpoint {
        &self.a
    }

    /// Side B.
    pub fn b(&self) -> &Endpoint {
        &self.b
    }

    /// One side.
    pub fn side(&self, side: Side) -> &Endpoint {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    /// The MTU in bytes of every interface.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The underlying namespaces and interfaces (e.g. to run `ip` in a namespace, or to
    /// delete a TAP to emulate device removal).
    pub fn pair(&self) -> &TapPair {
        &self.pair
    }

    /// The two namespace names, A then B.
    pub fn namespaces(&self) -> [String; 2] {
        [self.a.netns.clone(), self.b.netns.clone()]
    }

    /// Gives `side`'s kernel an address of the subnet: host `n`'s ([`host_ip`], /24) on
    /// that side's bridge, so that ordinary kernel sockets of threads in that namespace
    /// (see [`crate::netns::NetNs::spawn`]) reach the other side's userspace stack over
    /// the same bridges and veth (the kernel answers ARP for it; bridge netfilter is off).
    /// `n` must not be 1 or 2, the peers' addresses. Returns the address; it goes with
    /// the namespace.
    ///
    /// Errors: [`HarnessError::Setup`] if `ip addr add` fails (e.g. the address exists).
    pub fn add_kernel_address(&self, side: Side, n: u8) -> Result<Ipv4Addr, HarnessError> {
        let (ns, bridge) = match side {
            Side::A => (&self.pair.a, self.pair.bridges()[0]),
            Side::B => (&self.pair.b, self.pair.bridges()[1]),
        };
        let ip = host_ip(n);
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", bridge])
            .map_err(HarnessError::Setup)?;
        Ok(ip)
    }

    /// A [`PeerSpec`] that runs `program` in `side`'s namespace.
    pub fn peer(&self, side: Side, name: &str, program: impl AsRef<Path>) -> PeerSpec {
        PeerSpec::new(name, program).netns(self.side(side).netns.clone())
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let mut reg = registry();
        reg.namespaces.remove(&self.a.netns);
        reg.namespaces.remove(&self.b.netns);
        // `pair` drops next: interfaces, then namespaces.
    }
}

/// Those of `names` that are still listed by `ip netns list` (i.e. under `/run/netns`).
/// Tests assert this is empty after dropping a [`Topology`].
pub fn leftover_namespaces<S: AsRef<str>>(names: &[S]) -> Vec<String> {
    names
        .iter()
        .map(AsRef::as_ref)
        .filter(|n| Path::new("/run/netns").join(n).exists())
        .map(str::to_owned)
        .collect()
}

impl Endpoint {
    /// The arguments that tell a peer binary where it is: `--tap T --ip A/P --mac M`.
    pub fn peer_args(&self) -> Vec<String> {
        vec![
            "--tap".into(),
            self.tap.clone(),
            "--ip".into(),
            format!("{}/{}", self.ip, self.prefix_len),
            "--mac".into(),
            format_mac(&self.mac),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link_args::{parse_cidr, parse_mac};

    #[test]
    fn addresses_parse_and_format() {
        assert_eq!(format_mac(&host_mac(2)), "02:00:0a:ea:00:02");
        assert_eq!(parse_mac("02:00:0a:ea:00:02"), Ok(host_mac(2)));
        assert!(parse_mac("02:00:0a:ea:00").is_err());
        assert!(parse_mac("02:00:0a:ea:00:zz").is_err());
        assert_eq!(parse_cidr("10.234.0.1/24"), Ok((host_ip(1), 24)));
        assert!(parse_cidr("10.234.0.1").is_err());
        assert!(parse_cidr("10.234.0.1/33").is_err());
        assert!(parse_cidr("10.234.0/24").is_err());
    }
}
