//! The `iwdump` binary: exit status, text and JSON output.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn iwdump(args: &[&str], file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iwdump"))
        .args(args)
        .arg(file)
        .output()
        .expect("run iwdump")
}

fn tmp_file(name: &str, contents: &[u8]) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&p, contents).expect("write temp file");
    p
}

#[test]
fn clean_capture_exits_0() {
    let out = iwdump(&[], &common::pcap("rping.pcap"));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("MPA Request"));
    assert!(text.contains("MPA Reply"));
    assert!(text.contains("10.77.0.2:42307 -> 10.77.0.1:7174"));
    assert!(text.contains("ReadResponse"));
    // One line per FPDU and per MPA frame, then the summary.
    let pdu_lines = text.lines().filter(|l| l.contains(" -> ")).count();
    assert!(pdu_lines >= 72, "{pdu_lines} lines");
    assert!(text.contains("0 errors"));
}

#[test]
fn bad_crc_exits_1() {
    let out = iwdump(&[], &common::pcap("bad-crc.pcap"));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("CRC BAD"));
    assert!(text.contains("error: frame 10"));
}

#[test]
fn unusable_input_exits_2_with_one_line() {
    let junk = tmp_file("not-a-pcap.txt", b"this is not a capture file, just text\n");
    let empty = tmp_file("empty.pcap", b"");
    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-such-file.pcap");
    for f in [junk, empty, missing] {
        let out = iwdump(&[], &f);
        assert_eq!(out.status.code(), Some(2), "{f:?}: {out:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("iwdump: "), "{err}");
        assert!(out.stdout.is_empty());
    }
    // A usage error is also status 2 (clap).
    let out = Command::new(env!("CARGO_BIN_EXE_iwdump")).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn truncated_capture_exits_1() {
    let bytes = std::fs::read(common::pcap("rping.pcap")).unwrap();
    let cut = tmp_file("rping-cut.pcap", &bytes[..bytes.len() - 30]);
    let out = iwdump(&["--json"], &cut);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let errors = v["errors"].as_array().unwrap();
    assert!(errors.iter().any(|e| e["kind"] == "capture"));
}

#[test]
fn json_output_has_the_fields() {
    let out = iwdump(&["--json"], &common::pcap("rping-srv_p2p-cli_p2p.pcap"));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["fpdus"], 22);
    assert_eq!(v["opcodes"]["Write"], 4);
    assert_eq!(v["opcodes"]["Send"], 12);
    assert_eq!(v["messages"]["ReadRequest"], 3);
    assert_eq!(v["errors"].as_array().unwrap().len(), 0);
    assert!(v.get("pdus").is_none(), "per-PDU records only with -v");
    let c = &v["connections"][0];
    assert_eq!(c["initiator"], "10.77.0.2:34314");
    assert_eq!(c["responder"], "10.77.0.1:7174");
    for (side, words, rtr_read) in [
        ("request", "8001 c001", true),
        ("reply", "8001 8001", false),
    ] {
        let m = &c[side];
        assert_eq!(m["revision"], 2);
        assert_eq!(m["markers"], false);
        assert_eq!(m["crc"], false);
        assert_eq!(m["reject"], false);
        assert_eq!(m["enhanced"], true);
        assert_eq!(m["ird"], 1);
        assert_eq!(m["ord"], 1);
        assert_eq!(m["p2p"], true);
        assert_eq!(m["rtr_write"], true);
        assert_eq!(m["rtr_read"], rtr_read);
        assert_eq!(m["private_data_len"], 4);
        assert_eq!(m["ird_ord_words"], words);
    }

    let out = iwdump(&["--json"], &common::pcap("bad-crc.pcap"));
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let errors = v["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["frame"], 10);
    assert_eq!(errors[0]["kind"], "crc");
    assert!(errors[0]["offset"].is_u64());
    assert!(errors[0]["message"].is_string());
}

#[test]
fn verbose_json_lists_pdus() {
    let out = iwdump(&["--json", "-v"], &common::pcap("rping.pcap"));
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pdus = v["pdus"].as_array().unwrap();
    assert_eq!(pdus.len(), 72);
    assert_eq!(pdus[0]["type"], "mpa_request");
    let fpdu = pdus.iter().find(|p| p["type"] == "fpdu").unwrap();
    for k in [
        "frame",
        "offset",
        "opcode",
        "last",
        "ulpdu_len",
        "crc",
        "ddp",
    ] {
        assert!(fpdu.get(k).is_some(), "missing {k}: {fpdu}");
    }
}
