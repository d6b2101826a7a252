//! One side of an MPA ULPDU transfer between two processes, on the public
//! [`softiwarp::Device`] API over a TAP: what the `iwarp-peer` binary (and `bench-peer
//! fpdu`) run inside a namespace.
//!
//! The server opens a [`Device`] on its TAP, listens, reports readiness, accepts one
//! connection and receives the [`crate::ulpdu`] stream until the client closes. The
//! client opens its device, connects, sends the stream and closes gracefully. Either
//! side can capture its link to a pcap file, keeping only the first bytes
//! ([`netlab::capture::CappedPcap`]).

use std::fs::File;
use std::io::BufWriter;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mpa::negotiate::CrcPolicy;
use softiwarp::link::{Link, LinkEvent, Pcap, TapLink};
use softiwarp::transport::smoltcp_glue::TcpConfig;
use softiwarp::transport::{MpaDefaults, MpaParams};
use softiwarp::{Device, DeviceConfig, LinkConfig, LinkSpec};

use crate::ulpdu::{recv_stream, send_stream, TransferConfig, TransferError, TransferStats};
use netlab::capture::CappedPcap;

/// Which side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRole {
    /// Listens, accepts, receives.
    Server,
    /// Connects, sends.
    Client,
}

/// Settings of one side.
#[derive(Debug, Clone)]
pub struct MpaPeerOptions {
    /// Server or client.
    pub role: PeerRole,
    /// The TAP to open (in the calling thread's namespace).
    pub tap: String,
    /// This side's address.
    pub ip: Ipv4Addr,
    /// Prefix length of the subnet.
    pub prefix_len: u8,
    /// This side's MAC.
    pub mac: [u8; 6],
    /// The server's address (client only).
    pub peer_ip: Ipv4Addr,
    /// The server's TCP port.
    pub port: u16,
    /// MPA CRC policy of this side (`Wanted` on either side turns CRC on for both).
    pub crc: CrcPolicy,
    /// The transfer.
    pub transfer: TransferConfig,
    /// Capture the link to this file, keeping at most this many bytes of whole records.
    pub pcap: Option<(PathBuf, u64)>,
    /// The engine's busy-poll time after activity.
    pub spin: Duration,
    /// TCP socket settings.
    pub tcp: TcpConfig,
    /// Limit for link-up, connection setup and the peer's arrival.
    pub setup_timeout: Duration,
    /// TAP checksum and segmentation offload (`TapOffload::Tcp4`); default on.
    pub offload: bool,
}

impl MpaPeerOptions {
    /// Options with the defaults: port 7174 (rping's), CRC wanted, 1 GiB verified, no capture, the engine's default spin, the device's TCP defaults,
    /// 20 s setup timeout.
    pub fn new(role: PeerRole, tap: &str, ip: Ipv4Addr, mac: [u8; 6], peer_ip: Ipv4Addr) -> Self {
        MpaPeerOptions {
            role,
            tap: tap.to_owned(),
            ip,
            prefix_len: 24,
            mac,
            peer_ip,
            port: 7174,
            crc: CrcPolicy::Wanted,
            transfer: TransferConfig {
                amount: crate::ulpdu::Amount::Bytes(1 << 30),
                verify: true,
                ulpdu_size: None,
                abort_after: None,
            },
            pcap: None,
            spin: softiwarp::EngineConfig::default().spin,
            tcp: TcpConfig::default(),
            setup_timeout: Duration::from_secs(20),
            offload: true,
        }
    }
}

/// Errors of a peer.
#[derive(Debug, thiserror::Error)]
pub enum MpaPeerError {
    /// The TAP could not be opened or did not come up, or the capture file failed.
    #[error("link: {0}")]
    Link(String),
    /// The device could not be opened, or a device call failed.
    #[error("device: {0}")]
    Device(#[from] softiwarp::DeviceError),
    /// No connection request came in time, or the listener ended.
    #[error("listen: {0}")]
    Listen(#[from] softiwarp::ListenError),
    /// The connection did not get established.
    #[error("connect: {0}")]
    Connect(#[from] softiwarp::ConnectError),
    /// The transfer failed.
    #[error("transfer: {0}")]
    Transfer(#[from] TransferError),
}

fn open_link(opts: &MpaPeerOptions) -> Result<Box<dyn Link>, MpaPeerError> {
    let err = |e: softiwarp::link::LinkError| MpaPeerError::Link(e.to_string());
    let mut tap =
        TapLink::open_with(&opts.tap, crate::tcp::tap_offload(opts.offload)).map_err(err)?;
    // A TAP just attached has no carrier until the kernel's linkwatch work has run.
    let t0 = Instant::now();
    loop {
        while tap.poll_event().is_some() {}
        match tap.state() {
            LinkEvent::Up => break,
            s if t0.elapsed() > opts.setup_timeout => {
                return Err(MpaPeerError::Link(format!("{} not up: {s:?}", opts.tap)))
            }
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    Ok(match &opts.pcap {
        None => Box::new(tap),
        Some((path, limit)) => {
            let file = File::create(path)
                .map_err(|e| MpaPeerError::Link(format!("create {}: {e}", path.display())))?;
            let out = CappedPcap::new(BufWriter::with_capacity(1 << 16, file), *limit);
            let clock = Box::new(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
            });
            Box::new(Pcap::with_writer(tap, out, clock).map_err(err)?)
        }
    })
}

/// Runs one side as `opts` says; the server calls `ready` once it listens. The device is
/// shut down (and a capture flushed) before this returns.
///
/// Errors: [`MpaPeerError`].
pub fn run(opts: &MpaPeerOptions, ready: impl FnOnce()) -> Result<TransferStats, MpaPeerError> {
    let link = open_link(opts)?;
    let mut cfg = DeviceConfig::new(
        match opts.role {
            PeerRole::Server => "server",
            PeerRole::Client => "client",
        },
        LinkConfig {
            spec: LinkSpec::Boxed(link),
            pcap: None,
            faults: None,
        },
        opts.ip,
        opts.prefix_len,
    );
    cfg.interface.mac = opts.mac;
    cfg.interface.random_seed ^= u64::from(std::process::id());
    cfg.tcp = opts.tcp;
    cfg.mpa = MpaDefaults::default();
    cfg.mpa.settings.crc = opts.crc;
    cfg.engine.spin = opts.spin;
    let device = Device::open(cfg)?;
    let stats = match opts.role {
        PeerRole::Server => {
            let listener = device.listen(opts.port, 1)?;
            ready();
            let request = listener.next_request(opts.setup_timeout)?;
            let conn = request.accept(b"", 1, 1)?;
            conn.wait_established(opts.setup_timeout)?;
            let stats = recv_stream(&conn, &opts.transfer)?;
            // The client closed; let our side's close complete before the device goes.
            match conn.wait_ended(Duration::from_secs(5)) {
                Some(None) => {}
                Some(Some(e)) => tracing::warn!(error = %e, "connection failed after the transfer"),
                None => tracing::warn!("connection did not close within 5 s"),
            }
            stats
        }
        PeerRole::Client => {
            let conn = device.connect(
                opts.peer_ip,
                opts.port,
                MpaParams {
                    private_data: Vec::new(),
                    ird: 1,
                    ord: 1,
                    settings: None,
                },
            )?;
            conn.wait_established(opts.setup_timeout)?;
            send_stream(&conn, &opts.transfer)?
        }
    };
    drop(device);
    Ok(stats)
}
