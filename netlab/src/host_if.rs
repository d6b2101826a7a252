//! A host interface as the tools' `--netdev IF` names it (the soft device on the host's
//! kernel TCP, bound to IF, as `rdma link add NAME type siw netdev IF`): whether it
//! exists and which IPv4 addresses it holds, and the messages for the options that do not
//! go with it. Shared by `iwperf` and `iwping` so both say the same thing.

use std::net::Ipv4Addr;

/// A host interface and its IPv4 addresses with prefix lengths, as `getifaddrs(3)` lists
/// them now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInterface {
    /// The interface name.
    pub name: String,
    /// Its IPv4 addresses and prefix lengths (at least one).
    pub addrs: Vec<(Ipv4Addr, u8)>,
}

impl HostInterface {
    /// Finds interface `name` (in the calling thread's namespace) and its IPv4 addresses.
    ///
    /// Errors: [`InterfaceError::NoSuch`] (no interface of that name: the message lists
    /// those there are), [`InterfaceError::NoIpv4`] (it has no IPv4 address: the message
    /// says how to give it one), [`InterfaceError::Lookup`] (`getifaddrs` failed).
    pub fn find(name: &str) -> Result<HostInterface, InterfaceError> {
        let all: Vec<nix::ifaddrs::InterfaceAddress> = nix::ifaddrs::getifaddrs()
            .map_err(|e| InterfaceError::Lookup(e.to_string()))?
            .collect();
        if !all.iter().any(|a| a.interface_name == name) {
            let mut found: Vec<String> = all.iter().map(|a| a.interface_name.clone()).collect();
            found.sort();
            found.dedup();
            return Err(InterfaceError::NoSuch {
                name: name.to_owned(),
                found,
            });
        }
        let addrs: Vec<(Ipv4Addr, u8)> = all
            .iter()
            .filter(|a| a.interface_name == name)
            .filter_map(|a| {
                let ip = a.address.as_ref()?.as_sockaddr_in()?.ip();
                let mask = a.netmask.as_ref()?.as_sockaddr_in()?.ip();
                // A contiguous mask's prefix length is its count of ones.
                Some((ip, u32::from(mask).count_ones() as u8))
            })
            .collect();
        if addrs.is_empty() {
            return Err(InterfaceError::NoIpv4(name.to_owned()));
        }
        Ok(HostInterface {
            name: name.to_owned(),
            addrs,
        })
    }

    /// The addresses as `A.B.C.D/P`, comma-separated.
    pub fn addrs_text(&self) -> String {
        self.addrs
            .iter()
            .map(|(a, p)| format!("{a}/{p}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Why a `--netdev IF` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterfaceError {
    /// No interface of that name in this namespace.
    #[error("no interface named '{name}' (found: {})", found.join(", "))]
    NoSuch {
        /// The name asked for.
        name: String,
        /// The interfaces there are.
        found: Vec<String>,
    },
    /// The interface has no IPv4 address (the device's addresses are the interface's).
    #[error("interface '{0}' has no IPv4 address (the device uses the interface's addresses: give it one, e.g. `ip addr add 10.0.0.1/24 dev {0}`)")]
    NoIpv4(String),
    /// `getifaddrs` failed.
    #[error("cannot list the interfaces: {0}")]
    Lookup(String),
}

/// The usage message for option `option` (`--tap`, `--ip`, `--pcap`, ...) given with
/// `--netdev ifname`: what the option is for and what to do instead.
pub fn netdev_conflict(ifname: &str, option: &str) -> String {
    match option {
        "--pcap" => format!(
            "--pcap captures a TAP or UDP link's frames; a --netdev device's traffic is the kernel's TCP on {ifname}: capture with tcpdump -i {ifname}"
        ),
        "--ip" | "--mac" => format!(
            "{option} sets the address of a TAP or UDP link's own stack; a --netdev device has {ifname}'s addresses (change them with `ip addr add A.B.C.D/P dev {ifname}`)"
        ),
        "--mtu" => format!(
            "--mtu sets a TAP or UDP link's MTU; a --netdev device uses {ifname}'s (`ip link set {ifname} mtu N`)"
        ),
        "--no-offload" => format!(
            "--no-offload turns a TAP's offload off; on --netdev the kernel's segmentation offload applies (`ethtool -K {ifname} gso off gro off`)"
        ),
        _ => format!("--netdev {ifname} and {option} name two different links: give one"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_127_0_0_1_slash_8() {
        let lo = HostInterface::find("lo").unwrap();
        assert!(lo.addrs.contains(&(Ipv4Addr::LOCALHOST, 8)), "{lo:?}");
        assert!(lo.addrs_text().contains("127.0.0.1/8"));
    }

    #[test]
    fn an_unknown_interface_names_those_there_are() {
        let e = HostInterface::find("nosuchif9").unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with("no interface named 'nosuchif9' (found: "),
            "{m}"
        );
        assert!(m.contains("lo"), "{m}");
    }

    #[test]
    fn conflicts_say_what_to_do_instead() {
        assert!(netdev_conflict("eth0", "--pcap").ends_with("capture with tcpdump -i eth0"));
        assert!(netdev_conflict("eth0", "--ip").contains("dev eth0"));
        assert_eq!(
            netdev_conflict("eth0", "--tap"),
            "--netdev eth0 and --tap name two different links: give one"
        );
    }
}
