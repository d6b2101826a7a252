//! The peer's command line ([`PeerArgs`]): its role and scenario.

use super::*;

/// Which side a peer plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
pub enum Role {
    /// Listens and accepts.
    Server,
    /// Connects, runs the load and the churn.
    Client,
}

/// What the peer does (see the [module docs](crate::removal)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
pub enum Scenario {
    /// Load and churn; removal at a random moment.
    Load,
    /// Client: one extra connection whose `Established` callback announces
    /// `IN_CALLBACK`, sleeps `--hold-ms` and returns Destroy (the 2007 seed).
    Seed,
    /// Client: one extra connection whose `Established` callback sleeps `--hold-ms`;
    /// another thread destroys that id meanwhile (blocked), then `DESTROY_BLOCKED`.
    DestroyBlocked,
    /// Client: after the removal, waits for the TAP to come back (`WAITING_FOR_TAP`),
    /// opens a new device on it and uses it with a new id.
    Readd,
    /// Server: a wildcard listener over two devices. Client: load connections to both
    /// addresses; once those to the second address ended, `--after-removal` new ones to
    /// the first.
    Wildcard,
}

/// Command line of `removal-peer` (see the [module docs](crate::removal)).
#[derive(Debug, Clone, clap::Args)]
pub struct PeerArgs {
    /// Server or client.
    #[arg(value_enum)]
    pub role: Role,
    /// `--tap --ip --mac --pcap`: the TAP to open (in this namespace) and this side's
    /// address/prefix. `--mac` is ignored (the MAC is derived from the address, as the
    /// harness's plan has it); `--pcap` is refused (the peer does not capture).
    #[command(flatten)]
    pub link: netlab::LinkArgs,
    /// Server, wildcard scenario: a second TAP and its address/prefix.
    #[arg(long)]
    pub extra_tap: Option<String>,
    /// Address/prefix of the second device.
    #[arg(long)]
    pub extra_ip: Option<String>,
    /// Client: the server's addresses (load connections are spread over them).
    #[arg(long = "peer-ip")]
    pub peer_ips: Vec<Ipv4Addr>,
    /// The scenario.
    #[arg(long, value_enum, default_value = "load")]
    pub scenario: Scenario,
    /// Seed (which ids return Destroy from `DeviceRemoval`).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Client: long-lived connections with RDMA Writes, Reads and Sends in flight.
    #[arg(long, default_value_t = 3)]
    pub load_qps: usize,
    /// Client: run the churn thread.
    #[arg(long)]
    pub churn: bool,
    /// Client: every third churn cycle resolves a silent address first.
    #[arg(long)]
    pub slow_resolve: bool,
    /// Client: wait this long after READY before connecting.
    #[arg(long, default_value_t = 0)]
    pub start_delay_ms: u64,
    /// Server: hold churn connection requests this long before accepting.
    #[arg(long, default_value_t = 0)]
    pub hold_accept_ms: u64,
    /// Seed and destroy-blocked scenarios: how long the held callback sleeps.
    #[arg(long, default_value_t = 600)]
    pub hold_ms: u64,
    /// TCP user timeout (ms): how long a side waits for a peer that went silent.
    #[arg(long, default_value_t = 1500)]
    pub tcp_timeout_ms: u64,
    /// TCP keep-alive interval (ms).
    #[arg(long, default_value_t = 400)]
    pub keepalive_ms: u64,
    /// After the long-lived connections ended: how long to wait for a removal of our
    /// device before ending (ms).
    #[arg(long, default_value_t = 300)]
    pub linger_ms: u64,
    /// Server: end after this long with no connection alive (ms), once
    /// `--expect-connections` were established.
    #[arg(long, default_value_t = 300)]
    pub idle_ms: u64,
    /// Server: connections to see established before ending on idleness.
    #[arg(long, default_value_t = 1)]
    pub expect_connections: usize,
    /// Server: end if no connection at all was established this long after READY (ms).
    #[arg(long, default_value_t = 4000)]
    pub first_connection_ms: u64,
    /// Client (wildcard): connections to make to the first address after those to the
    /// others ended.
    #[arg(long, default_value_t = 0)]
    pub after_removal: usize,
    /// Client: post load WRs until the send queue is full before polling, instead of
    /// keeping at most its depth outstanding (the mistake a real program must not
    /// make: with application threads driving, the send queue never fills and the
    /// tight CQ overruns). Only to check that an overrun is reported.
    #[arg(long)]
    pub post_until_full: bool,
    /// A file the harness creates once its action on a TAP (`ip link del` / `set down`)
    /// returned. Until it exists the peer does not conclude that its device was not
    /// removed: on a loaded machine the kernel can take longer to carry the action out
    /// (two seconds, with busy loops on both cores) than the TCP user timeout takes to
    /// end the connections, and a peer that exited on that timeout never saw its removal.
    #[arg(long)]
    pub acted_file: Option<std::path::PathBuf>,
    /// Give up (with a violation) after this many seconds.
    #[arg(long, default_value_t = 30.0)]
    pub max_secs: f64,
}
