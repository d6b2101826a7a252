//! Two namespaces joined by one veth whose ends hold the kernel's addresses: the
//! topology of the host-TCP transport (a soft device bound to a host interface rides
//! the kernel's TCP, `--netdev IF`), and of kernel TCP between the same two ends.
//!
//! ```text
//!  namespace A                         namespace B
//!  veth end A 10.234.0.1/24 ---------- veth end B 10.234.0.2/24
//! ```
//!
//! No bridge and no TAP. Names use [`crate::netns::unique_tag`] as the rest of the lab
//! (`swns<tag>a`, `swv<tag>a`), so a killed run's namespaces are removed by the next
//! [`crate::netns::remove_stale`]; dropping a [`VethPair`] deletes the veth (if a test
//! has not) and both namespaces, also while a panic unwinds.

use std::net::Ipv4Addr;
use std::path::Path;

use crate::netns::{is_root, remove_stale, unique_tag, NetNs};
use crate::peer::PeerSpec;
use crate::signals::registry;
use crate::topology::{host_ip, Side};
use crate::HarnessError;

/// Two namespaces joined by a veth with an address on each end; see the
/// [module docs](self).
#[derive(Debug)]
pub struct VethPair {
    a: NetNs,
    b: NetNs,
    veth: [String; 2],
    mtu: usize,
}

impl VethPair {
    /// Builds it: namespaces A and B, a veth with end A in A and end B in B, MTU `mtu`,
    /// [`host_ip`]`(1)/24` on end A and `host_ip(2)/24` on end B, both up, the pending
    /// link changes committed (see [`crate::netns::TapPair::create`]).
    ///
    /// Errors: [`HarnessError::NotRoot`]; [`HarnessError::Setup`] if an `ip` step fails
    /// (what was built is removed).
    pub fn create(mtu: usize) -> Result<VethPair, HarnessError> {
        if !is_root() {
            return Err(HarnessError::NotRoot);
        }
        remove_stale();
        let tag = unique_tag();
        let setup = HarnessError::Setup;
        let a = NetNs::create(&format!("swns{tag}a")).map_err(setup)?;
        let b = NetNs::create(&format!("swns{tag}b")).map_err(setup)?;
        {
            let mut reg = registry();
            reg.namespaces.insert(a.name().to_owned());
            reg.namespaces.insert(b.name().to_owned());
        }
        let pair = VethPair {
            a,
            b,
            veth: [format!("swv{tag}a"), format!("swv{tag}b")],
            mtu,
        };
        pair.build().map_err(setup)?;
        Ok(pair)
    }

    fn build(&self) -> std::io::Result<()> {
        let [va, vb] = &self.veth;
        crate::netns::run_ip(&[
            "link",
            "add",
            va,
            "netns",
            self.a.name(),
            "type",
            "veth",
            "peer",
            "name",
            vb,
            "netns",
            self.b.name(),
        ])?;
        let mtu = self.mtu.to_string();
        for (ns, veth, n) in [(&self.a, va, 1), (&self.b, vb, 2)] {
            ns.ip(&["link", "set", veth, "mtu", &mtu, "txqueuelen", "10000"])?;
            ns.ip(&["addr", "add", &format!("{}/24", host_ip(n)), "dev", veth])?;
            ns.ip(&["link", "set", veth, "up"])?;
        }
        for (ns, veth) in [(&self.a, va), (&self.b, vb)] {
            ns.ip(&["link", "show", "dev", veth])?;
        }
        Ok(())
    }

    /// The namespace of `side`.
    pub fn netns(&self, side: Side) -> &NetNs {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    /// The veth end in `side`'s namespace.
    pub fn veth(&self, side: Side) -> &str {
        match side {
            Side::A => &self.veth[0],
            Side::B => &self.veth[1],
        }
    }

    /// The address on `side`'s veth end (`host_ip(1)` for A, `host_ip(2)` for B).
    pub fn ip(&self, side: Side) -> Ipv4Addr {
        match side {
            Side::A => host_ip(1),
            Side::B => host_ip(2),
        }
    }

    /// The MTU in bytes of the veth.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The two namespace names, A then B.
    pub fn namespaces(&self) -> [String; 2] {
        [self.a.name().to_owned(), self.b.name().to_owned()]
    }

    /// A [`PeerSpec`] that runs `program` in `side`'s namespace.
    pub fn peer(&self, side: Side, name: &str, program: impl AsRef<Path>) -> PeerSpec {
        PeerSpec::new(name, program).netns(self.netns(side).name().to_owned())
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        {
            let mut reg = registry();
            reg.namespaces.remove(self.a.name());
            reg.namespaces.remove(self.b.name());
        }
        // Deletes both ends; fails (ignored) when a test deleted the veth already.
        let _ = self.a.ip(&["link", "del", &self.veth[0]]);
        // The NetNs fields drop next and delete the namespaces.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_veth_pair_carries_kernel_tcp_and_leaves_nothing() {
        if crate::skip_unless_root("a_veth_pair_carries_kernel_tcp_and_leaves_nothing") {
            return;
        }
        let pair = VethPair::create(1500).unwrap();
        let names = pair.namespaces();
        let a_ip = pair.ip(Side::A);
        let server = pair.netns(Side::A).spawn(move || {
            let l = std::net::TcpListener::bind((a_ip, 0))?;
            let port = l.local_addr()?.port();
            Ok::<_, std::io::Error>((l, port))
        });
        let (l, port) = server.join().unwrap().unwrap().unwrap();
        let client = pair.netns(Side::B).spawn(move || {
            let mut s = std::net::TcpStream::connect((a_ip, port))?;
            std::io::Write::write_all(&mut s, b"over the veth")
        });
        let (mut s, from) = l.accept().unwrap();
        assert_eq!(from.ip(), std::net::IpAddr::V4(pair.ip(Side::B)));
        let mut got = String::new();
        std::io::Read::read_to_string(&mut s, &mut got).unwrap();
        client.join().unwrap().unwrap().unwrap();
        assert_eq!(got, "over the veth");
        drop((s, l));
        drop(pair);
        assert_eq!(crate::leftover_namespaces(&names), Vec::<String>::new());
    }
}
