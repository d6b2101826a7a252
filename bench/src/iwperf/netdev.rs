//! The IPv4 address of an rdma-core device, for `iwperf server --device NAME`
//! without `--bind`: the device's network interface, found through sysfs, and its
//! first IPv4 address.
//!
//! An iWARP device's GID 0 is its interface's MAC address in the first 6 bytes (siw's
//! `siw_query_gid`, iw_cxgb4's `c4iw_query_gid`), so the interface is the one in
//! `/sys/class/net` with that address (or, where the kernel lists it,
//! `ports/1/gid_attrs/ndevs/0`).

use std::net::Ipv4Addr;
use std::path::Path;

/// The MAC address in the first 6 bytes of a GID as sysfs prints it
/// (`0252:5400:1234:0000:0000:0000:0000:0000`), lowercase and colon-separated
/// (`02:52:54:00:12:34`) as `/sys/class/net/*/address`; `None` for a GID that is not
/// 8 groups of 4 hex digits, or all zero.
pub fn gid_mac(gid: &str) -> Option<String> {
    let groups: Vec<&str> = gid.trim().split(':').collect();
    if groups.len() != 8
        || groups
            .iter()
            .any(|g| g.len() != 4 || !g.chars().all(|c| c.is_ascii_hexdigit()))
    {
        return None;
    }
    let hex: String = groups[..3].concat().to_ascii_lowercase();
    if hex.chars().all(|c| c == '0') {
        return None;
    }
    let bytes: Vec<&str> = (0..6).map(|i| &hex[2 * i..2 * i + 2]).collect();
    Some(bytes.join(":"))
}

/// The network interface of RDMA device `device`, from sysfs under `sys` (normally
/// `/sys`): `ports/1/gid_attrs/ndevs/0` if the kernel lists it, else the interface
/// whose MAC is in GID 0.
pub fn device_netdev(sys: &Path, device: &str) -> Option<String> {
    let port = sys.join("class/infiniband").join(device).join("ports/1");
    if let Ok(n) = std::fs::read_to_string(port.join("gid_attrs/ndevs/0")) {
        let n = n.trim();
        if !n.is_empty() {
            return Some(n.to_owned());
        }
    }
    let mac = gid_mac(&std::fs::read_to_string(port.join("gids/0")).ok()?)?;
    let mut names: Vec<String> = std::fs::read_dir(sys.join("class/net"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read_to_string(e.path().join("address"))
                .is_ok_and(|a| a.trim().eq_ignore_ascii_case(&mac))
        })
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    // Several (a bond, VLANs): the first by name, for a stable answer.
    names.sort();
    names.into_iter().next()
}

/// The first IPv4 address of interface `ifname` (`getifaddrs(3)`).
pub fn interface_ipv4(ifname: &str) -> Option<Ipv4Addr> {
    nix::ifaddrs::getifaddrs()
        .ok()?
        .filter(|a| a.interface_name == ifname)
        .find_map(|a| a.address?.as_sockaddr_in().map(|s| s.ip()))
}

/// The IPv4 address of RDMA device `device` (its interface's first), if it has one.
pub fn device_ipv4(device: &str) -> Option<Ipv4Addr> {
    let ifname = device_netdev(Path::new("/sys"), device)?;
    let ip = interface_ipv4(&ifname);
    tracing::debug!(device, ifname, ?ip, "device address");
    ip
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_gives_the_mac() {
        assert_eq!(
            gid_mac("0252:5400:12ab:0000:0000:0000:0000:0000\n").as_deref(),
            Some("02:52:54:00:12:ab")
        );
        assert_eq!(gid_mac("0000:0000:0000:0000:0000:0000:0000:0000"), None);
        assert_eq!(gid_mac("0252:5400:12ab"), None);
        assert_eq!(gid_mac("025x:5400:12ab:0000:0000:0000:0000:0000"), None);
    }

    #[test]
    fn netdev_found_by_ndev_or_by_mac() {
        let dir = std::env::temp_dir().join(format!("iwperf-netdev-{}", std::process::id()));
        let port = dir.join("class/infiniband/siw0/ports/1");
        std::fs::create_dir_all(port.join("gids")).unwrap();
        std::fs::write(
            port.join("gids/0"),
            "0252:5400:12ab:0000:0000:0000:0000:0000\n",
        )
        .unwrap();
        for (name, mac) in [("lo", "00:00:00:00:00:00"), ("eth1", "02:52:54:00:12:ab")] {
            std::fs::create_dir_all(dir.join("class/net").join(name)).unwrap();
            std::fs::write(dir.join("class/net").join(name).join("address"), mac).unwrap();
        }
        assert_eq!(device_netdev(&dir, "siw0").as_deref(), Some("eth1"));
        assert_eq!(device_netdev(&dir, "siw1"), None);
        std::fs::create_dir_all(port.join("gid_attrs/ndevs")).unwrap();
        std::fs::write(port.join("gid_attrs/ndevs/0"), "eth7\n").unwrap();
        assert_eq!(device_netdev(&dir, "siw0").as_deref(), Some("eth7"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn loopback_has_its_address() {
        assert_eq!(interface_ipv4("lo"), Some(Ipv4Addr::LOCALHOST));
        assert_eq!(interface_ipv4("no-such-if0"), None);
    }
}
