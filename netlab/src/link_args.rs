//! The options every lab tool and peer binary takes to find its link: [`LinkArgs`]
//! (`--tap --ip --mac --pcap`, flattened into each tool's clap command line, as smoltcp's
//! `examples/utils.rs` shares `add_tuntap_options`), and the CIDR/MAC parsers behind it.

use std::net::Ipv4Addr;
use std::path::PathBuf;

/// Where a tool's soft device sits: the TAP it opens, the IPv4 address/prefix and MAC its
/// userspace stack owns (the kernel interface has none), and an optional capture.
///
/// `#[command(flatten)]` it into a tool's arguments. The address and MAC stay text until
/// [`LinkArgs::cidr`] and [`LinkArgs::mac`] parse them, so each tool reports a bad value
/// the way it always has.
#[derive(Debug, Clone, clap::Args)]
pub struct LinkArgs {
    /// The TAP interface to open (in this process's namespace).
    #[arg(long)]
    pub tap: String,
    /// This side's IPv4 address and prefix length, e.g. 10.234.0.1/24.
    #[arg(long)]
    pub ip: String,
    /// This side's MAC address, six hex octets (e.g. 02:00:0a:ea:00:01).
    #[arg(long)]
    pub mac: Option<String>,
    /// Capture this side's link to a pcap file.
    #[arg(long)]
    pub pcap: Option<PathBuf>,
}

impl LinkArgs {
    /// `--ip` parsed: the address and prefix length.
    ///
    /// Errors: [`parse_cidr`]'s message.
    pub fn cidr(&self) -> Result<(Ipv4Addr, u8), String> {
        parse_cidr(&self.ip)
    }

    /// `--mac` parsed, `None` when not given.
    ///
    /// Errors: [`parse_mac`]'s message.
    pub fn mac(&self) -> Result<Option<[u8; 6]>, String> {
        self.mac.as_deref().map(parse_mac).transpose()
    }
}

/// Formats a MAC address as `02:00:0a:ea:00:01`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses a MAC address written as six colon-separated hex octets.
///
/// Errors: a message naming the input.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    let bad = || format!("bad MAC address {s:?} (want six hex octets, e.g. 02:00:0a:ea:00:01)");
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(parts) {
        *m = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    Ok(mac)
}

/// Parses `A.B.C.D/P` into an address and prefix length (0..=32).
///
/// Errors: a message naming the input.
pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let bad = || format!("bad address {s:?} (want A.B.C.D/P)");
    let (a, p) = s.split_once('/').ok_or_else(bad)?;
    let prefix: u8 = p.parse().map_err(|_| bad())?;
    if prefix > 32 {
        return Err(bad());
    }
    Ok((a.parse().map_err(|_| bad())?, prefix))
}
