//! Devices: the list libibverbs sees, and an open device [`Context`] with
//! its capabilities ([`DeviceCaps`]).

use crate::caps::DeviceCaps;
use crate::cq::{CompChannel, Cq};
use crate::error::{Error, Result};
use crate::ffi::handles::{RawCompChannel, RawContext, RawCq, RawPd};
use crate::ffi::types::*;
use crate::ffi::RdmaCore;
use crate::pd::Pd;
use crate::read_sink::ReadSinkRule;
use crate::translate::{async_event_from_ibv, verbs_error};
use std::sync::Arc;
use verbs::{AsyncEvent, VerbsError};

/// `enum ibv_transport_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// `IBV_TRANSPORT_IB` (0): InfiniBand, RoCE.
    Ib,
    /// `IBV_TRANSPORT_IWARP` (1): iw_cxgb4, siw, irdma (iWARP mode).
    Iwarp,
    /// `IBV_TRANSPORT_USNIC` (2).
    Usnic,
    /// `IBV_TRANSPORT_USNIC_UDP` (3).
    UsnicUdp,
    /// `IBV_TRANSPORT_UNSPECIFIED` (4).
    Unspecified,
    /// `IBV_TRANSPORT_UNKNOWN` (-1) or a value this crate does not know.
    Unknown(i32),
}

impl Transport {
    /// The transport of an `ibv_device.transport_type` value.
    pub const fn from_raw(v: i32) -> Transport {
        match v {
            IBV_TRANSPORT_IB => Transport::Ib,
            IBV_TRANSPORT_IWARP => Transport::Iwarp,
            IBV_TRANSPORT_USNIC => Transport::Usnic,
            IBV_TRANSPORT_USNIC_UDP => Transport::UsnicUdp,
            IBV_TRANSPORT_UNSPECIFIED => Transport::Unspecified,
            other => Transport::Unknown(other),
        }
    }
}

/// One device of the list (`ibv_get_device_list(3)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel device name (`cxgb4_0`, `siw0`).
    pub name: String,
    /// Its transport.
    pub transport: Transport,
    /// `enum ibv_node_type` (4 = RNIC for iWARP devices).
    pub node_type: i32,
}

/// The RDMA devices libibverbs sees. Empty when the kernel has no RDMA
/// device or no uverbs support (libibverbs' `ENOSYS`).
///
/// # Errors
///
/// [`Error::Verbs`] if `ibv_get_device_list` fails otherwise.
pub fn devices(core: &RdmaCore) -> Result<Vec<DeviceInfo>> {
    let raw = core
        .raw_devices()
        .map_err(|e| verbs_error("ibv_get_device_list", e))?;
    Ok(raw
        .into_iter()
        .map(|d| DeviceInfo {
            name: d.name,
            transport: Transport::from_raw(d.transport_type),
            node_type: d.node_type,
        })
        .collect())
}

/// Asks librdmacm to release its cached device contexts of devices that are
/// gone (`rdma_get_devices` + `rdma_free_devices`), the last step after a
/// device removal once every id, QP, CQ, MR and PD of the device is
/// destroyed (shared/rdma-core-notes.md section 3, step 4). Returns how many
/// devices librdmacm still lists.
///
/// Measured on kernel siw (tests/siw_vm.rs): when the removed device was the
/// only one, this releases nothing: librdmacm 44's `sync_devices_list`
/// returns `ENODEV` on an empty device list before it closes a removed
/// device's context, so its uverbs fd stays open and the kernel's `rdma link
/// delete` waits until the process exits. A process that must let the
/// removal finish exits (or re-execs) after its cleanup.
///
/// # Errors
///
/// [`Error::Verbs`] if `rdma_get_devices` fails (other than `ENODEV`: no
/// device, which is 0).
pub fn release_cached_devices(core: &RdmaCore) -> Result<usize> {
    core.sync_cm_devices()
        .map_err(|e| verbs_error("rdma_get_devices", e).into())
}

/// An open device: opened by name ([`Context::open`]), or the one librdmacm
/// opened for a CM id ([`crate::CmId::context`]), on which that id's QP must
/// be made.
///
/// Drop order: everything made on the context holds it (through `Arc`s), so
/// it is closed after its last PD, CQ and channel; librdmacm's own context
/// is never closed here.
#[derive(Clone)]
pub struct Context {
    pub(crate) raw: Arc<RawContext>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.raw.device_name())
            .finish()
    }
}

impl Context {
    /// Opens the device named `name` (`ibv_open_device(3)`).
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchDevice`] (with the names found) if no device has that
    /// name; [`Error::Verbs`] if listing or opening fails.
    pub fn open(core: &Arc<RdmaCore>, name: &str) -> Result<Context> {
        match RawContext::open(core, name).map_err(|e| verbs_error("ibv_open_device", e))? {
            Some(raw) => Ok(Context { raw: Arc::new(raw) }),
            None => Err(Error::NoSuchDevice {
                name: name.to_string(),
                found: devices(core)?.into_iter().map(|d| d.name).collect(),
            }),
        }
    }

    /// The device name.
    pub fn name(&self) -> String {
        self.raw.device_name()
    }

    /// The device's transport.
    pub fn transport(&self) -> Transport {
        Transport::from_raw(self.raw.transport_type())
    }

    /// The device's capabilities (`ibv_query_device(3)`, completed with the
    /// driver facts of [`crate::caps::from_device_attr`]).
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`] if the query fails.
    pub fn caps(&self) -> Result<DeviceCaps> {
        let attr = self
            .raw
            .query_device()
            .map_err(|e| verbs_error("ibv_query_device", e))?;
        Ok(crate::caps::from_device_attr(&attr))
    }

    /// The largest message of port `port` (1-based), bytes
    /// (`ibv_query_port(3)`: `max_msg_sz`).
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`] if the query fails (`EINVAL` for a port that does
    /// not exist).
    pub fn max_msg_size(&self, port: u8) -> Result<u32> {
        let attr = self
            .raw
            .query_port(port)
            .map_err(|e| verbs_error("ibv_query_port", e))?;
        Ok(attr.max_msg_sz)
    }

    /// Allocates a protection domain (`ibv_alloc_pd(3)`).
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`] (`ENOMEM` as out of resources).
    pub fn alloc_pd(&self) -> Result<Pd> {
        let raw = RawPd::alloc(&self.raw).map_err(|e| verbs_error("ibv_alloc_pd", e))?;
        // The Read-sink rule is on where the device has it (a failed query: off).
        let strict = self.caps().is_ok_and(|c| c.read_sink_needs_remote_write);
        Ok(Pd {
            raw: Arc::new(raw),
            sinks: Arc::new(ReadSinkRule::new(strict)),
        })
    }

    /// Creates a completion channel (`ibv_create_comp_channel(3)`).
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`].
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        let raw = RawCompChannel::create(&self.raw)
            .map_err(|e| verbs_error("ibv_create_comp_channel", e))?;
        Ok(CompChannel {
            raw: Arc::new(raw),
            bound: Arc::default(),
        })
    }

    /// Creates a CQ of at least `cqe` entries (`ibv_create_cq(3)`), bound to
    /// `channel` for event notification if given (one live CQ per channel).
    ///
    /// # Errors
    ///
    /// [`VerbsError::InvalidArgument`] if `channel` already has a live CQ;
    /// [`Error::Verbs`]: `EINVAL` above the device's `max_cqe`; `EOPNOTSUPP`
    /// if the provider has no `poll_cq` / `req_notify_cq`.
    pub fn create_cq(&self, cqe: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        let cqe = i32::try_from(cqe).map_err(|_| VerbsError::InvalidArgument { what: "cqe" })?;
        let mut bound = channel.map(|c| c.bound.lock().unwrap_or_else(|p| p.into_inner()));
        if bound.as_ref().is_some_and(|b| b.strong_count() > 0) {
            return Err(VerbsError::InvalidArgument {
                what: "completion channel already has a CQ",
            }
            .into());
        }
        let raw = RawCq::create(&self.raw, cqe, channel.map(|c| &c.raw))
            .map_err(|e| verbs_error("ibv_create_cq", e))?;
        let raw = Arc::new(raw);
        if let Some(b) = bound.as_mut() {
            **b = Arc::downgrade(&raw);
        }
        Ok(Cq {
            raw,
            channel: channel.map(|c| c.raw.clone()),
            trackers: Arc::default(),
        })
    }

    /// The fd that is readable when [`Context::get_async_event`] has an event.
    pub fn async_fd(&self) -> i32 {
        self.raw.async_fd()
    }

    /// Makes [`Context::get_async_event`] return `EAGAIN` (errno 11) instead
    /// of blocking when no event is pending. On a context taken from a CM id
    /// this changes librdmacm's shared context for every user of it.
    ///
    /// # Errors
    ///
    /// The OS error of `fcntl`.
    pub fn set_async_nonblocking(&self, on: bool) -> std::io::Result<()> {
        crate::ffi::set_nonblocking(self.async_fd(), on)
    }

    /// Takes one asynchronous event (`ibv_get_async_event(3)`; blocks unless
    /// the async fd was made non-blocking) and acknowledges it. `Ok(None)`
    /// for an event type `verbs::AsyncEvent` does not represent (InfiniBand
    /// path, LID, SM events).
    ///
    /// # Errors
    ///
    /// [`Error::Verbs`] (`EAGAIN` as errno 11 on a non-blocking fd).
    pub fn get_async_event(&self) -> Result<Option<AsyncEvent>> {
        let raw = self
            .raw
            .get_async_event()
            .map_err(|e| verbs_error("ibv_get_async_event", e))?;
        Ok(async_event_from_ibv(&raw))
    }
}
