//! The process's one soft device, built from `SOFTIWARP_DEVICE` on first use
//! (`ibv_get_device_list`, `rdma_create_event_channel`, ...), and the RDMA CM over it.
//!
//! A missing or malformed `SOFTIWARP_DEVICE`, or a link that cannot be opened, leaves
//! the process without a device: `ibv_get_device_list` returns an empty list,
//! `rdma_create_event_channel` fails with `ENODEV`, and one line on stderr names the
//! key and the problem ([`softiwarp::spec::SpecError`]).
//!
//! MPA runs as the line says, plain MPA by default (`p2p=off`), as kernel siw's
//! default build: with the library offering peer-to-peer mode by default, a host
//! `rping` against kernel siw 6.1 in the siw VM hung (Write RTR offered) or crashed
//! the guest's kernel (iw_cm's `BUG` at iwcm.c:969, Read RTR offered). Programs whose
//! passive side writes first (`ib_write_lat`) need `p2p=on` between two library
//! processes: MPA forbids the Responder to send an FPDU before it has received one
//! (RFC 5044 section 7.1.2), and the Initiator's ready-to-receive message of
//! peer-to-peer mode is that first FPDU (iw_cxgb4's default mode).

use std::ffi::c_int;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock};

use cxgb4::ffi::types::{IbvContext, IbvDevice, IBV_SYSFS_NAME_MAX, IBV_TRANSPORT_IWARP};
use sw::cm::rdmacm::{SoftDevice, SoftRdmaCm};
use sw::spec::DeviceSpec;

use crate::abi::IBV_NODE_RNIC;
use crate::boundary::{copy_cstr, into_raw, zeroed};
use crate::objects::{CtxObj, CtxState, FdQueue};

/// The environment variable holding the device line (see `softiwarp::spec`).
pub const ENV: &str = "SOFTIWARP_DEVICE";

/// The device and its RDMA CM.
pub struct Soft {
    /// The soft device.
    pub device: Arc<sw::Device>,
    /// The RDMA CM over it.
    pub cm: SoftRdmaCm,
    /// Its IPv4 MTU, bytes.
    pub mtu: usize,
    /// Its MAC (the GID, as siw reports it).
    pub mac: [u8; 6],
    /// `struct ibv_device *` (leaked: lives as long as the process).
    ibdev: usize,
    /// The context librdmacm's ids point at (`id->verbs`), never closed.
    cm_ctx: Arc<CtxObj>,
}

impl Soft {
    /// The `struct ibv_device` of the device.
    pub fn ibdev(&self) -> *mut IbvDevice {
        self.ibdev as *mut IbvDevice
    }

    /// The context of CM ids (`id->verbs`).
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

static SOFT: OnceLock<Option<Soft>> = OnceLock::new();

/// The device, opened on first call; `None` (after one line on stderr) if
/// `SOFTIWARP_DEVICE` is missing or wrong or the device cannot be opened.
pub fn soft() -> Option<&'static Soft> {
    SOFT.get_or_init(open).as_ref()
}

fn open() -> Option<Soft> {
    if let Ok(filter) = std::env::var("SOFTIWARP_LOG") {
        // Diagnostics on request only: `SOFTIWARP_LOG=debug` (an EnvFilter) to stderr.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let line = match std::env::var(ENV) {
        Ok(v) => v,
        Err(_) => {
            eprintln!(
                "libsoftiwarp: {ENV}: not set (e.g. {ENV}=link=udp:127.0.0.1:7000,peer=127.0.0.1:7001,ip=10.9.0.1/24); no device"
            );
            return None;
        }
    };
    let spec = match DeviceSpec::parse(&line) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("libsoftiwarp: {e}; no device");
            return None;
        }
    };
    let config = spec.to_config();
    let mac = config.interface.mac;
    let device = match sw::Device::open(config) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            eprintln!("libsoftiwarp: {ENV}: link: cannot open the device: {e}; no device");
            return None;
        }
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
    let added = SoftDevice::new(device.clone())
        .map_err(|e| e.to_string())
        .and_then(|d| cm.add_device(d).map_err(|e| e.to_string()));
    if let Err(e) = added {
        eprintln!("libsoftiwarp: cannot add the device to the RDMA CM: {e}; no device");
        return None;
    }
    let mut dev: IbvDevice = zeroed();
    dev.node_type = IBV_NODE_RNIC;
    dev.transport_type = IBV_TRANSPORT_IWARP;
    copy_cstr(&mut dev.name, &spec.name);
    copy_cstr(&mut dev.dev_name, "uverbs0");
    copy_cstr(&mut dev.dev_path, "/sys/class/infiniband_verbs/uverbs0");
    let mut ibdev_path = String::from("/sys/class/infiniband/");
    ibdev_path.push_str(&spec.name[..spec.name.len().min(IBV_SYSFS_NAME_MAX)]);
    copy_cstr(&mut dev.ibdev_path, &ibdev_path);
    let ibdev = into_raw(dev);
    let cm_ctx = match new_context(ibdev, true) {
        Ok(c) => c,
        Err(e) => {
            let e = std::io::Error::from_raw_os_error(e);
            eprintln!("libsoftiwarp: cannot make the RDMA CM's device context: {e}; no device");
            return None;
        }
    };
    Some(Soft {
        mtu: device.mtu(),
        device,
        cm,
        mac,
        ibdev: ibdev as usize,
        cm_ctx,
    })
}

/// A new published context of `dev` whose ops are this library's data path (`cm`:
/// the context of CM ids, never closed); `Err(errno)` if its `async_fd` cannot be
/// made (`EMFILE` when the process is out of fds).
pub fn new_context(dev: *mut IbvDevice, cm: bool) -> Result<Arc<CtxObj>, c_int> {
    let mut c: IbvContext = zeroed();
    c.device = dev;
    c.ops.poll_cq = Some(crate::ibv::poll_cq);
    c.ops.req_notify_cq = Some(crate::ibv::req_notify_cq);
    c.ops.post_send = Some(crate::ibv::post_send);
    c.ops.post_recv = Some(crate::ibv::post_recv);
    c.cmd_fd = -1;
    let events = Arc::new(FdQueue::new(crate::boundary::new_eventfd()?));
    c.async_fd = events.raw_fd();
    c.num_comp_vectors = 1;
    let ctx = CtxObj::new(
        c,
        CtxState {
            events: Mutex::new(Some(events)),
            cm,
            unacked: AtomicUsize::new(0),
        },
    );
    CtxObj::publish(&ctx);
    crate::ibv::add_context(&ctx);
    crate::ibv::start_async_events();
    Ok(ctx)
}

/// The errno of "no device": `ENODEV`.
pub const NO_DEVICE: c_int = libc::ENODEV;
