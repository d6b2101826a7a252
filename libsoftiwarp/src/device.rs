//! The process's soft devices and the one RDMA CM over them, built on first use
//! (`ibv_get_device_list`, `rdma_create_event_channel`, ...: the lookups that open them
//! are [`crate::context`]'s, which hands [`all`] the maker of each device's context of
//! CM ids; [`get`] finds the device of a context among the devices open).
//!
//! **Which devices.** With `SOFTIWARP_DEVICE` unset or empty (the usual case): one host-TCP
//! device (`softiwarp::LinkConfig::netdev`) per host interface that is up and has an
//! IPv4 address, `lo` included, in interface-index order, named `siw_<ifname>` as
//! rdma-core users name a kernel siw device (`rdma link add siw_eth0 type siw netdev
//! eth0`; [`sw::spec::netdev_device_name`]: the name cut to 63 bytes, the limit of
//! `ibv_get_device_name`). Their addresses, MTU and ports are the interfaces' and the
//! kernel's, so `rping -s -a 0.0.0.0` and `rping -c -a 127.0.0.1` (or the host's name)
//! meet with no configuration. The interfaces are read once, at first use: one that
//! comes up later gets no device. With `SOFTIWARP_DEVICE` set: the one device its line
//! describes ([`sw::spec`]; `netdev=IF` is a host-TCP device on `IF`).
//!
//! **One CM.** Every device is added to one [`SoftRdmaCm`], as the kernel's rdma_cm
//! spans every RDMA device: `rdma_resolve_addr` picks the device by route,
//! `rdma_bind_addr` by address, and a wildcard `rdma_listen` listens on all of them. A
//! CM id's `verbs` is the CM context of the device its id is on
//! ([`crate::context::of_device`]).
//!
//! **The GID.** A host-TCP device reports its interface's MAC
//! (`/sys/class/net/IF/address`) as its GID and node GUID, as siw does; an interface
//! without one (`lo`: all zeros) gets a locally administered MAC derived from its name
//! ([`derived_mac`]).
//!
//! **No device.** A malformed `SOFTIWARP_DEVICE`, a link that cannot be opened, or, with
//! it unset, no interface up with an IPv4 address, leaves the process without a device:
//! `ibv_get_device_list` returns an empty list, `rdma_create_event_channel` fails with
//! `ENODEV`, and one line on stderr names the key or the interfaces and the problem
//! ([`sw::spec::SpecError`]). A host interface whose device cannot be opened is
//! left out with one line on stderr; the others serve.
//!
//! MPA runs as the line says, plain MPA by default (`p2p=off`), as kernel siw's
//! default build: with the library offering peer-to-peer mode by default, a host
//! `rping` against kernel siw 6.1 in the siw VM hung (Write RTR offered) or crashed
//! the guest's kernel (iw_cm's `BUG` at iwcm.c:969, Read RTR offered). Programs whose
//! passive side writes first (`ib_write_lat`) need `p2p=on` between two library
//! processes: MPA forbids the Responder to send an FPDU before it has received one
//! (RFC 5044 section 7.1.2), and the Initiator's ready-to-receive message of
//! peer-to-peer mode is that first FPDU (iw_cxgb4's default mode). The devices made
//! for the host's interfaces run the same defaults.

use std::ffi::c_int;
use std::sync::{Arc, OnceLock};

use cxgb4::ffi::types::{IbvContext, IbvDevice, IBV_TRANSPORT_IWARP};
use sw::cm::rdmacm::{SoftDevice, SoftRdmaCm};
use sw::spec::{DeviceSpec, LinkKind};

use crate::abi::IBV_NODE_RNIC;
use crate::boundary::{copy_cstr, into_raw, zeroed};
use crate::objects::CtxObj;

/// The environment variable holding the device line (see `softiwarp::spec`).
pub const ENV: &str = "SOFTIWARP_DEVICE";

/// One device of the process.
pub struct Soft {
    /// The soft device.
    pub device: Arc<sw::Device>,
    /// Its place in the device list (`ibv_get_device_index`).
    pub index: usize,
    /// Its IPv4 MTU, bytes.
    pub mtu: usize,
    /// Its MAC (the GID, as siw reports it).
    pub mac: [u8; 6],
    /// `struct ibv_device *` (leaked: lives as long as the process), followed by a
    /// zeroed `struct verbs_device` tail (`crate::abi::IbvDeviceWithTail`).
    ibdev: usize,
    /// The context librdmacm's ids on this device point at (`id->verbs`), never closed.
    cm_ctx: Arc<CtxObj>,
}

impl Soft {
    /// The `struct ibv_device` of the device.
    pub fn ibdev(&self) -> *mut IbvDevice {
        self.ibdev as *mut IbvDevice
    }

    /// The context of CM ids on the device (`id->verbs`).
    pub fn cm_ctx(&self) -> *mut IbvContext {
        self.cm_ctx.ptr()
    }

    /// The node GUID (`ibv_get_device_guid`, `node_guid`): the MAC as EUI-64 (siw's
    /// rule), in network order as a `__be64` value.
    pub fn guid(&self) -> u64 {
        let m = self.mac;
        let eui = [m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]];
        u64::from_ne_bytes(eui)
    }
}

/// The devices and the RDMA CM over them.
pub struct Devices {
    cm: SoftRdmaCm,
    list: Vec<Soft>,
}

impl Devices {
    /// The devices, in list order.
    pub fn list(&self) -> &[Soft] {
        &self.list
    }

    /// The RDMA CM over them.
    pub fn cm(&self) -> &SoftRdmaCm {
        &self.cm
    }
}

/// Makes a new published context of a device, `(dev, index, cm)` as
/// [`crate::context::new_context`], which [`all`] is handed: a context's operations are
/// in modules above this one, which look devices up here.
pub type NewContext = fn(*mut IbvDevice, usize, bool) -> Result<Arc<CtxObj>, c_int>;

static DEVICES: OnceLock<Option<Devices>> = OnceLock::new();

/// The devices, opened on first call (each device's context of CM ids made by
/// `new_context`); `None` (after one line on stderr) if there are none (see the
/// [module docs](self)).
pub fn all(new_context: NewContext) -> Option<&'static Devices> {
    DEVICES.get_or_init(|| open(new_context)).as_ref()
}

/// The device at `index` in the list, among the devices open: the device of a context
/// (a context exists only once [`all`] has opened them).
pub fn get(index: usize) -> Option<&'static Soft> {
    DEVICES.get()?.as_ref()?.list.get(index)
}

fn open(new_context: NewContext) -> Option<Devices> {
    if let Ok(filter) = std::env::var("SOFTIWARP_LOG") {
        // Diagnostics on request only: `SOFTIWARP_LOG=debug` (an EnvFilter) to stderr.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    // Set but empty is as unset (`SOFTIWARP_DEVICE= prog`).
    let from_env = std::env::var(ENV).ok().filter(|v| !v.trim().is_empty());
    let specs = match &from_env {
        Some(line) => match DeviceSpec::parse(line) {
            Ok(s) => vec![s],
            Err(e) => {
                eprintln!("libsoftiwarp: {e}; no device");
                return None;
            }
        },
        None => host_specs()?,
    };
    let cm = match SoftRdmaCm::new(rdma_cm::RdmaCmConfig {
        name: "libsoftiwarp".into(),
        ..rdma_cm::RdmaCmConfig::default()
    }) {
        Ok(cm) => cm,
        Err(e) => {
            eprintln!("libsoftiwarp: cannot start the RDMA CM: {e}; no device");
            return None;
        }
    };
    let mut list = Vec::with_capacity(specs.len());
    for spec in &specs {
        match open_one(&cm, spec, list.len(), new_context) {
            Ok(s) => list.push(s),
            Err(e) if from_env.is_some() => {
                eprintln!("libsoftiwarp: {ENV}: {e}; no device");
                return None;
            }
            Err(e) => eprintln!("libsoftiwarp: {}: {e}; left out", spec.name),
        }
    }
    if list.is_empty() {
        // Every interface's device failed: each said why above.
        return None;
    }
    Some(Devices { cm, list })
}

/// One `netdev` spec per host interface that is up with an IPv4 address, in index
/// order; `None` (after one line on stderr) if there is none or the interfaces cannot
/// be read.
fn host_specs() -> Option<Vec<DeviceSpec>> {
    let example = "netdev=eth0, or link=udp:127.0.0.1:7000,peer=127.0.0.1:7001,ip=10.9.0.1/24";
    let ifs = match sw::host::netdev::interfaces() {
        Ok(ifs) => ifs,
        Err(e) => {
            eprintln!(
                "libsoftiwarp: {ENV} is not set and the host's interfaces cannot be read: {e}; no device (set {ENV}, e.g. {example})"
            );
            return None;
        }
    };
    let specs: Vec<DeviceSpec> = ifs
        .iter()
        .filter(|i| i.up && !i.addrs.is_empty())
        .filter_map(|i| DeviceSpec::netdev(&i.name).ok())
        .collect();
    if specs.is_empty() {
        eprintln!(
            "libsoftiwarp: {ENV} is not set and no interface is up with an IPv4 address; no device (set {ENV}, e.g. {example})"
        );
        return None;
    }
    Some(specs)
}

/// Opens the device of `spec` as the `index`th of the list (its context of CM ids made
/// by `new_context`) and adds it to `cm`; what went wrong, in words, if it could not.
fn open_one(
    cm: &SoftRdmaCm,
    spec: &DeviceSpec,
    index: usize,
    new_context: NewContext,
) -> Result<Soft, String> {
    let mut config = spec.to_config();
    if let LinkKind::Netdev(ifname) = &spec.link {
        config.interface.mac = interface_mac(ifname);
    }
    let mac = config.interface.mac;
    // The key the user wrote: `netdev` for a host interface, `link` otherwise.
    let key = match &spec.link {
        LinkKind::Netdev(_) => "netdev",
        _ => "link",
    };
    let device = sw::Device::open(config)
        .map(Arc::new)
        .map_err(|e| format!("{key}: cannot open the device: {e}"))?;
    let mut dev: IbvDevice = zeroed();
    dev.node_type = IBV_NODE_RNIC;
    dev.transport_type = IBV_TRANSPORT_IWARP;
    copy_cstr(&mut dev.name, &spec.name);
    copy_cstr(&mut dev.dev_name, &format!("uverbs{index}"));
    copy_cstr(
        &mut dev.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs{index}"),
    );
    copy_cstr(
        &mut dev.ibdev_path,
        &format!("/sys/class/infiniband/{}", spec.name),
    );
    let ibdev: *mut IbvDevice =
        into_raw(crate::abi::IbvDeviceWithTail { dev, tail: [0; 8] }).cast();
    let cm_ctx = new_context(ibdev, index, true).map_err(|e| {
        let e = std::io::Error::from_raw_os_error(e);
        format!("cannot make the RDMA CM's device context: {e}")
    })?;
    SoftDevice::new(device.clone())
        .map_err(|e| e.to_string())
        .and_then(|d| cm.add_device(d).map_err(|e| e.to_string()))
        .map_err(|e| format!("cannot add the device to the RDMA CM: {e}"))?;
    crate::events::start_async_events(index, device.clone());
    Ok(Soft {
        mtu: device.mtu(),
        device,
        index,
        mac,
        ibdev: ibdev as usize,
        cm_ctx,
    })
}

/// The MAC of host interface `ifname` (`/sys/class/net/IF/address`), or, if it has
/// none (`lo`, tunnels: all zeros or absent) or it cannot be read, [`derived_mac`].
pub fn interface_mac(ifname: &str) -> [u8; 6] {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/address"))
        .ok()
        .and_then(|s| parse_mac(s.trim()))
        .filter(|m| *m != [0; 6] && m[0] & 1 == 0)
        .unwrap_or_else(|| derived_mac(ifname))
}

/// A unicast, locally administered MAC from the interface name: `02` and five bytes of
/// its FNV-1a hash (a GID that is not zero, and differs between interfaces).
pub fn derived_mac(ifname: &str) -> [u8; 6] {
    let h = ifname
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
        .to_be_bytes();
    [0x02, h[0], h[1], h[2], h[3], h[4]]
}

/// Six hex bytes separated by `:`.
fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for m in &mut mac {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *m = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The errno of "no device": `ENODEV`.
pub const NO_DEVICE: c_int = libc::ENODEV;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_and_derived_ones_are_local_unicast_and_differ() {
        assert_eq!(parse_mac("02:fc:00:00:00:01"), Some([2, 0xfc, 0, 0, 0, 1]));
        for bad in [
            "",
            "02:fc:00:00:00",
            "02:fc:00:00:00:01:02",
            "2:fc:0:0:0:1",
            "zz:00:00:00:00:00",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad:?}");
        }
        let (lo, eth0) = (derived_mac("lo"), derived_mac("eth0"));
        assert_eq!(lo[0], 0x02);
        assert_ne!(lo, eth0);
        assert_eq!(lo, derived_mac("lo"));
        // An interface with no MAC of its own, or none at all, gets the derived one.
        assert_eq!(interface_mac("no-such-if-x"), derived_mac("no-such-if-x"));
    }
}
