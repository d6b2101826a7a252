//! Shared helpers for the integration tests: where the reference captures live.

#![allow(dead_code)]

use std::path::PathBuf;

/// The reference captures: `shared/pcaps`, checked out next to the repository.
pub fn pcap_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/pcaps");
    assert!(
        dir.join("rping.pcap").is_file(),
        "reference captures missing: expected them in {} (shared/pcaps next to the repository)",
        dir.display()
    );
    dir
}

/// Path of one reference capture; panics when it is missing.
pub fn pcap(name: &str) -> PathBuf {
    let p = pcap_dir().join(name);
    assert!(p.is_file(), "reference capture {} is missing", p.display());
    p
}

/// Every reference capture, sorted by name.
pub const ALL: &[&str] = &[
    "bad-crc.pcap",
    "ib_send_bw.pcap",
    "ib_write_bw.pcap",
    "rping-srv_crc-cli_crc.pcap",
    "rping-srv_p2p-cli_p2p.pcap",
    "rping.pcap",
];

/// Dissect a reference capture.
pub fn dissect(name: &str) -> iwdump::Report {
    iwdump::dissect_file(pcap(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}
