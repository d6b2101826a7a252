//! Root-only: RDMA Writes, Sends and Reads of 64 KiB at MTU 1500 between `iwperf` peers
//! in two namespaces (one QP each). The client's TAP has TCP segmentation offload (the default), the
//! server's has none, so the kernel cuts the client's super-segments into wire segments
//! before the server reads (and captures) them: the capture is what kernel siw, Chelsio
//! hardware or Wireshark on the wire would see.
//!
//! Asserted:
//!
//! - every byte verified at both ends;
//! - no wire segment carries octets of two FPDUs, and none is over the MSS; iwdump
//!   decodes the capture with no error;
//! - the offloading client puts a message's one short segment where a super-segment
//!   ends (`ddp_rdmap::segment::Segments::next_remainder_first`): Writes and Sends with
//!   a short segment before their last one are on the wire, and the next super-segment
//!   runs on into the next message; the server, without the offload, keeps every short
//!   segment last (its Read Responses); tshark decodes it all with no error;
//! - the client wrote fewer frames to its TAP than it sent messages' worth of two
//!   super-segments each (printed; the figure depends on the machine's load).

mod iwperf_support;

use std::net::IpAddr;
use std::time::Duration;

use iwdump::report::{PduKind, PduRecord};
use iwperf_support::*;
use netlab::{leftover_namespaces, wait_all, Topology};

/// MULPDU at MTU 1500 without Markers: MSS 1460 less the MPA length field and CRC.
const MULPDU: usize = 1460 - 2 - 4;

/// A file removed when dropped (also when the test fails).
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// FPDUs of `src` with DDP Last clear and a payload short of a full segment, per
/// opcode; and the number of FPDUs of `src` of that opcode.
fn short_before_last(pdus: &[PduRecord], src: IpAddr, opcode: &str) -> (usize, usize) {
    let mut short = 0;
    let mut all = 0;
    for p in pdus.iter().filter(|p| p.src.ip() == src) {
        let PduKind::Fpdu(f) = &p.kind else { continue };
        if f.opcode != opcode {
            continue;
        }
        all += 1;
        if !f.last && usize::from(f.ulpdu_len) < MULPDU {
            short += 1;
        }
    }
    (short, all)
}

#[test]
fn offloaded_messages_reach_the_wire_one_fpdu_per_segment_short_segment_where_a_run_ends() {
    if skip_unless_root(
        "offloaded_messages_reach_the_wire_one_fpdu_per_segment_short_segment_where_a_run_ends",
    ) {
        return;
    }
    let bin = iwperf();
    let pcap = TempFile(
        std::env::temp_dir().join(format!("iwperf-offload-wire-{}.pcap", std::process::id())),
    );
    let pcap_arg = pcap.0.display().to_string();
    let topo = Topology::create(1500).expect("topology");
    let names = topo.namespaces();
    let (client_ns, client_tap, client_ip) =
        (topo.b().netns.clone(), topo.b().tap.clone(), topo.b().ip);
    let server = start_server(
        &topo,
        &bin,
        &[
            "--no-offload",
            "--pcap",
            &pcap_arg,
            "--pcap-limit",
            "80000000",
            "--tcp-buffer",
            "1048576",
            "--json",
            "--timeout",
            "60",
        ],
    );
    const ITERS: u64 = 200;
    let client = start_client(
        &topo,
        &bin,
        &[
            "--op",
            "write,send,read",
            "--qps",
            "3",
            "--size",
            "65536",
            "--iters",
            &ITERS.to_string(),
            "--tcp-buffer",
            "1048576",
            "--verify",
            "--json",
        ],
    );
    let outs =
        wait_all(vec![server, client], Duration::from_secs(180)).unwrap_or_else(|e| panic!("{e}"));
    // Frames the client wrote to its TAP (the TAP's kernel RX side), before cleanup.
    let client_writes = netlab::netns::ip_output(&[
        "-n",
        &client_ns,
        "-s",
        "-j",
        "link",
        "show",
        "dev",
        &client_tap,
    ])
    .ok()
    .and_then(|out| serde_json::from_str::<serde_json::Value>(&out).ok())
    .and_then(|j| j[0]["stats64"]["rx"]["packets"].as_u64());
    drop(topo);
    assert_eq!(leftover_namespaces(&names), Vec::<String>::new());

    let (s, c) = (json(&outs[0]), json(&outs[1]));
    assert_eq!(c["exit_code"], 0, "{c}");
    assert_eq!(s["exit_code"], 0, "{s}");
    let bw = c["bandwidth"].as_array().expect("bandwidth");
    assert_eq!(bw.len(), 3, "{c}");
    for (r, op) in bw.iter().zip(["write", "read", "send"]) {
        assert_eq!(r["op"], op, "{r}");
        assert_eq!(r["verify"], "passed", "{r}");
        assert_eq!(r["mismatches"], 0, "{r}");
        assert_eq!(r["iterations"].as_u64(), Some(ITERS), "{r}");
    }
    assert_eq!(s["bandwidth"]["verify"], "passed", "{s}");
    assert_eq!(s["bandwidth"]["mismatches"], 0, "{s}");

    let report = iwdump::dissect_file(&pcap.0).expect("iwdump reads the capture");
    assert!(
        report.errors.is_empty(),
        "iwdump errors: {:?}",
        &report.errors[..report.errors.len().min(5)]
    );
    let client = IpAddr::V4(client_ip);
    // Per connection and direction, FPDUs in stream order: each starts in a frame after
    // the one where the previous FPDU ended (no segment holds octets of two FPDUs).
    let mut spans: Vec<(usize, bool, u64, u64, u64, u64)> = report
        .pdus
        .iter()
        .filter(|p| matches!(p.kind, PduKind::Fpdu(_)))
        .map(|p| {
            (
                p.tcp_id,
                p.src.ip() == client,
                p.offset,
                p.first_frame,
                p.frame,
                p.wire_len,
            )
        })
        .collect();
    spans.sort_unstable();
    let mut prev: Option<(usize, bool, u64)> = None;
    for &(tcp, from_client, offset, first, last, wire_len) in &spans {
        assert!(wire_len <= 1460, "an FPDU over the MSS: {wire_len} octets");
        if let Some((t, d, prev_last)) = prev {
            if (t, d) == (tcp, from_client) {
                assert!(
                    first > prev_last,
                    "connection {tcp}: FPDU at stream offset {offset} starts in frame {first}, where the previous one ended ({prev_last})"
                );
            }
        }
        prev = Some((tcp, from_client, last));
    }

    let (w_short, w_all) = short_before_last(&report.pdus, client, "Write");
    let (s_short, s_all) = short_before_last(&report.pdus, client, "Send");
    let server_ip = report
        .pdus
        .iter()
        .map(|p| p.src.ip())
        .find(|ip| *ip != client)
        .expect("server FPDUs");
    let (r_short, r_all) = short_before_last(&report.pdus, server_ip, "ReadResponse");
    println!(
        "client TAP writes: {client_writes:?} for {} messages; short segments before the last: \
         Write {w_short} of {w_all} FPDUs, Send {s_short} of {s_all}, Read Response (server, no offload) {r_short} of {r_all}",
        3 * ITERS
    );
    assert!(
        w_all > 1000 && s_all > 1000 && r_all > 1000,
        "capture too short"
    );
    // The offloading sender moved short segments to where its runs ended (the old
    // segmentation never put one before a message's last segment).
    assert!(w_short > 0, "no Write with its short segment moved");
    assert!(s_short > 0, "no Send with its short segment moved");
    // Without the offload nothing moves.
    assert_eq!(r_short, 0, "the server has no offload");

    // Wireshark's iWARP dissectors take the moved segments as they come.
    match netlab::capture::tshark_summary(&pcap.0) {
        Ok(t) => {
            println!("tshark: {t:?}");
            assert_eq!(t.mpa_requests, 3, "{t:?}");
            assert!(t.ddp_frames > 3000, "{t:?}");
            assert_eq!(t.malformed, 0, "{t:?}");
            assert_eq!(t.bad_crc_frames, 0, "{t:?}");
            assert_eq!(t.expert_errors, 0, "{t:?}");
        }
        Err(netlab::capture::TsharkError::NotInstalled(e)) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "tshark missing in CI: {e}"
            );
            eprintln!("tshark not installed: skipping the Wireshark check");
        }
        Err(e) => panic!("tshark: {e}"),
    }
}
