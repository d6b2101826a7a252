//! Root-only: the same `iwping` on both backends. The host-built
//! binary is copied into the siw VM (`shared/tools/siwvm/siw-peer-vm.sh --add`, harness
//! [`netlab::siwvm`]) and runs there as `iwping --device siw0` (rdma-core, kernel siw),
//! against our soft `iwping` on the host's TAP; both directions, `-C 10 -v -V`:
//!
//! - server in the VM (`--device siw0 -s`), client on the host (soft device);
//! - server on the host (soft device), client in the VM (`--device siw0 -c`).
//!
//! Both sides exit 0, both check every ping's data (`-V`), and each prints the ten ping
//! lines rping prints; the rdma-core side reports the ORD/IRD it used (`-d`), clamped to
//! siw's caps.
//!
//! Skips (saying so) when not root; when the VM cannot be built or booted it skips too,
//! except in CI (`CI` set), where that is a failure.

use std::path::PathBuf;
use std::time::Duration;

use iwping::rping::{client_line, ping_data, server_line};
use netlab::siwvm::{ensure_built, SiwVm, Variant, HOST_IP, VM_IP};
use netlab::{format_mac, PeerSpec};

const IWPING: &str = env!("CARGO_BIN_EXE_iwping");
/// Where the binary lands in the guest.
const GUEST_IWPING: &str = "/opt/iw/iwping";
const PINGS: u64 = 10;

fn vm_or_skip(test: &str) -> Option<SiwVm> {
    if !netlab::netns::is_root() {
        eprintln!("skipping {test}: needs root (namespaces, TAPs, a VM)");
        return None;
    }
    let in_ci = std::env::var_os("CI").is_some();
    if let Err(e) = ensure_built() {
        assert!(!in_ci, "{test}: the siw VM must build in CI: {e}");
        eprintln!("skipping {test}: cannot build the siw VM: {e}");
        return None;
    }
    // A debug build is ~75 MB with its debug info: too much for the guest's initramfs
    // (256 MB of RAM; "Initramfs unpacking failed: write error"). A stripped copy is ~8 MB.
    let stripped =
        std::env::temp_dir().join(format!("iwping-guest-{}", netlab::netns::unique_tag()));
    let strip = std::process::Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(IWPING)
        .status();
    let binary = match strip {
        Ok(s) if s.success() => stripped.clone(),
        other => {
            eprintln!("{test}: strip failed ({other:?}); copying the unstripped binary");
            PathBuf::from(IWPING)
        }
    };
    let files = [(binary, GUEST_IWPING.to_owned())];
    let vm = SiwVm::start_with_files(Variant::Default, &files);
    let _ = std::fs::remove_file(&stripped);
    match vm {
        Ok(vm) => {
            println!("{test}: VM up in {:.1?}", vm.boot_time());
            Some(vm)
        }
        Err(e) => {
            assert!(!in_ci, "{test}: the siw VM must boot in CI: {e}");
            eprintln!("skipping {test}: cannot boot the siw VM: {e}");
            None
        }
    }
}

/// Our soft `iwping` on the host's TAP.
fn soft_iwping(vm: &SiwVm, name: &str) -> PeerSpec {
    let ep = vm.endpoint();
    PeerSpec::new(name, IWPING).netns(ep.netns.clone()).args([
        "--tap".to_owned(),
        ep.tap.clone(),
        "--ip".to_owned(),
        format!("{}/{}", ep.ip, ep.prefix_len),
        "--mac".to_owned(),
        format_mac(&ep.mac),
        "--timeout".to_owned(),
        "30".to_owned(),
    ])
}

const COMMON: &str = "-C 10 -v -V";

/// The lines of `text` that start with `prefix`, cut to `width` characters (the guest's
/// output comes through its serial console, which may cut long lines; the data itself is
/// checked by `-V` on both sides).
fn lines(text: &str, prefix: &str, width: usize) -> Vec<String> {
    text.lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.chars().take(width).collect())
        .collect()
}

fn want(line: fn(&[u8]) -> String, width: usize) -> Vec<String> {
    (0..PINGS)
        .map(|i| line(&ping_data(i, iwping::rping::DEFAULT_SIZE)))
        .map(|l| l.chars().take(width).collect())
        .collect()
}

#[test]
fn rdma_core_iwping_in_the_vm_against_soft_iwping_both_directions() {
    let test = "rdma_core_iwping_in_the_vm_against_soft_iwping_both_directions";
    let Some(vm) = vm_or_skip(test) else {
        return;
    };
    let guest = format!("RUST_LOG=warn {GUEST_IWPING} --device siw0");

    // 1. Server in the VM (rdma-core), client on the host (soft device).
    vm.spawn(
        "dev-s",
        &format!("{guest} -s -a 0.0.0.0 -d {COMMON} --timeout 60"),
    )
    .expect("start iwping --device siw0 -s");
    // siw listens on a kernel TCP socket: 0.0.0.0:7174.
    if let Err(e) = vm.wait_listening(7174, Duration::from_secs(60)) {
        let log = vm.exec("cat /tmp/dev-s.log", Duration::from_secs(5));
        panic!(
            "iwping --device siw0 -s never listened ({e}): {log:?}\n{}",
            vm.console()
        );
    }
    let client = soft_iwping(&vm, "iwping-soft-c")
        .args(["-c", "-a", &VM_IP.to_string()])
        .args(COMMON.split(' '))
        .spawn()
        .expect("start soft iwping -c");
    let ours = client
        .wait(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("soft iwping -c: {e}\n{}", vm.console()));
    let (rc, theirs) = vm
        .wait_spawned("dev-s", Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("iwping --device siw0 -s: {e}"));
    let context = format!(
        "soft iwping -c ({}):\n{}\n{}\niwping --device siw0 -s (rc {rc}):\n{theirs}",
        ours.status, ours.stdout, ours.stderr
    );
    println!("server in the VM:\n{context}");
    assert!(ours.status.success(), "{context}");
    assert_eq!(rc, 0, "{context}");
    assert_eq!(
        lines(&ours.stdout, "ping data: ", 200),
        want(client_line, 200),
        "{context}"
    );
    assert_eq!(
        lines(&theirs, "server ping data: ", 60),
        want(server_line, 60),
        "{context}"
    );
    // rping's client asks IRD 1 / ORD 1; the rdma-core server mirrors it (within siw's
    // ORD/IRD of 128).
    assert!(theirs.contains("rdma_accept (IRD 1, ORD 1)"), "{context}");

    // 2. Server on the host (soft device), client in the VM (rdma-core).
    let mut server = soft_iwping(&vm, "iwping-soft-s")
        .args(["-s", "-d"])
        .args(COMMON.split(' '))
        .spawn()
        .expect("start soft iwping -s");
    server
        .wait_for_line(|l| l == "rdma_listen", Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("soft iwping -s did not listen: {e}"));
    let theirs = vm.exec(
        &format!("{guest} -c -a {HOST_IP} -d {COMMON} --timeout 60"),
        Duration::from_secs(120),
    );
    let ours = server
        .wait(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("soft iwping -s: {e}\n{}", vm.console()));
    let (rc, theirs) = theirs.unwrap_or_else(|e| panic!("iwping --device siw0 -c: {e}"));
    let context = format!(
        "soft iwping -s ({}):\n{}\n{}\niwping --device siw0 -c (rc {rc}):\n{theirs}",
        ours.status, ours.stdout, ours.stderr
    );
    println!("client in the VM:\n{context}");
    assert!(ours.status.success(), "{context}");
    assert_eq!(rc, 0, "{context}");
    assert_eq!(
        lines(&ours.stdout, "server ping data: ", 200),
        want(server_line, 200),
        "{context}"
    );
    assert_eq!(
        lines(&theirs, "ping data: ", 60),
        want(client_line, 60),
        "{context}"
    );
    assert!(
        theirs.contains("rdma_connect successful (peer ORD 1, IRD 1)"),
        "{context}"
    );
}
