//! `iwping --device NAME` where NAME is no RDMA device (or rdma-core is not installed):
//! one line on stderr saying so, exit status 3, nothing on stdout.
//! Needs neither root nor rdma-core.

use std::process::Command;

fn iwping(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_iwping"))
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .expect("run iwping")
}

fn check_one_line_status_3(args: &[&str]) {
    let out = iwping(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "stderr: {stderr}");
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    let line = lines[0];
    // Either rdma-core is there and has no such device, or it is not installed.
    let no_device = line.starts_with("iwping: no RDMA device named 'nope_dev9' (found: ");
    let no_rdma_core = line.starts_with("iwping: rdma-core (") && line.ends_with(") not found");
    assert!(no_device || no_rdma_core, "{line}");
}

#[test]
fn a_device_that_does_not_exist_is_one_line_and_status_3() {
    check_one_line_status_3(&["--device", "nope_dev9", "-c", "-a", "10.0.0.1", "-C", "1"]);
    check_one_line_status_3(&["--device", "nope_dev9", "-s"]);
}

#[test]
fn device_and_tap_do_not_mix_and_the_soft_device_still_needs_tap_and_ip() {
    let out = iwping(&["--device", "siw0", "--tap", "t0", "-s"]);
    assert_eq!(out.status.code(), Some(2), "clap's usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    let out = iwping(&["-s"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--tap") && err.contains("--ip"), "{err}");
}

/// Values clap cannot check alone (rping's size range, `-a` for the client, `--ip`) are
/// usage errors like clap's own: status 2 and one line, before any device is opened.
#[test]
fn bad_option_values_are_status_2_with_one_line() {
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "-c",
                "-a",
                "10.0.0.1",
                "-S",
                "10",
                "--tap",
                "nosuchtapx",
                "--ip",
                "10.0.0.2/24",
            ],
            "Invalid size 10",
        ),
        (
            &["-c", "--tap", "nosuchtapx", "--ip", "10.0.0.2/24"],
            "the client needs -a ADDR",
        ),
        (
            &[
                "-c",
                "-a",
                "10.0.0.1",
                "--tap",
                "nosuchtapx",
                "--ip",
                "10.0.0.2/99",
            ],
            "bad address",
        ),
        (
            &["-c", "-a", "10.0.0.1", "-S", "10", "--device", "nosuch"],
            "Invalid size 10",
        ),
    ];
    for (args, want) in cases {
        let out = iwping(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// The soft device's MPA options mean nothing on a kernel device (its driver sets
/// them): with `--device` they are refused (clap's conflict, status 2), before any
/// device is looked for.
#[test]
fn soft_mpa_options_with_device_are_refused() {
    for opt in [
        &["--p2p"][..],
        &["--crc", "required"],
        &["--mpa-rev", "1"],
        &["--rtr", "read"],
        &["--first-fpdu-delay-ms", "0"],
    ] {
        let mut args = vec!["-c", "-a", "10.0.0.1", "--device", "nosuch"];
        args.extend_from_slice(opt);
        let out = iwping(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.lines()
                .next()
                .unwrap_or("")
                .contains("cannot be used with"),
            "{args:?}: {err}"
        );
    }
}
