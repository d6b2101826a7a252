//! Root-only: the crate end to end on a real rdma-core device, the Linux
//! kernel's siw in the QEMU VM of `shared/tools/siwvm/siw-peer-vm.sh`. The
//! example `cxgb4_smoke` is copied into the guest and run there against
//! `siw0`: a server and a client thread connect through librdmacm, the
//! client RDMA Writes 4 KiB into the server's MR, reads it back, Sends 5
//! inline bytes; both check the data, disconnect, and drop everything in
//! order. A second run deletes the device under live connections
//! (`--removal`). About 10 s per VM run.
//!
//! Skips (saying so) when not root; when the VM cannot be built, or the
//! example was not built (`cargo test` builds examples; `--test siw_vm`
//! alone does not), it skips too, except under `CI`, where that fails.

use netlab::siwvm::{ensure_built, script_path};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// `target/<profile>/examples/cxgb4_smoke`, beside this test's `deps/`.
fn smoke_exe() -> PathBuf {
    let me = std::env::current_exe().unwrap();
    me.parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/cxgb4_smoke")
}

/// Deletes the namespace (bridge, TAP) and run directory on drop.
struct Lab {
    ns: String,
    run_dir: PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = Command::new(script_path())
            .args(["netns-down", &self.ns])
            .stdin(Stdio::null())
            .output();
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

/// Boots the VM with the example copied in, runs `cmd` in it (the example
/// is `/opt/cx4/cxgb4_smoke`), returns the console; `None` when skipped.
/// `letter` tells the tests' namespaces and links apart.
fn run_in_vm(test: &str, letter: char, cmd: &str) -> Option<String> {
    if !netlab::netns::is_root() {
        eprintln!("skipping {test}: needs root (namespace, TAP, VM)");
        return None;
    }
    let in_ci = std::env::var_os("CI").is_some();
    if let Err(e) = ensure_built() {
        assert!(!in_ci, "the siw VM must build in CI: {e}");
        eprintln!("skipping {test}: cannot build the siw VM: {e}");
        return None;
    }
    let exe = smoke_exe();
    if !exe.is_file() {
        assert!(!in_ci, "{} not built", exe.display());
        eprintln!(
            "skipping {test}: {} not built (cargo build -p cxgb4 --example cxgb4_smoke)",
            exe.display()
        );
        return None;
    }
    // One VM at a time, and names of their own per test.
    static ONE_VM: Mutex<()> = Mutex::new(());
    let _one = ONE_VM.lock().unwrap_or_else(|p| p.into_inner());
    let tag = format!("{letter}{}", std::process::id() % 100_000);
    let lab = Lab {
        ns: format!("cx4ns{tag}"),
        run_dir: PathBuf::from(format!("/tmp/siwvm-run/cx4-{tag}")),
    };
    std::fs::create_dir_all(&lab.run_dir).unwrap();
    let tap = format!("cx4t{tag}");
    let up = Command::new(script_path())
        .args(["netns-up", &lab.ns, &format!("cx4b{tag}"), &tap])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        up.status.success(),
        "netns-up: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let out = Command::new("timeout")
        .arg("400")
        .arg(script_path())
        .env("SIWVM_NETNS", &lab.ns)
        .env("SIWVM_RUN", &lab.run_dir)
        .args([
            "run",
            "--add",
            &format!("{}:/opt/cx4/cxgb4_smoke", exe.display()),
            "cx4smoke",
            &tap,
            "10.99.0.1/24",
            cmd,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let console = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{console}");
    assert!(
        out.status.success(),
        "{test}: the VM run failed (status {:?})",
        out.status
    );
    Some(console)
}

fn assert_lines(console: &str, lines: &[&str]) {
    for want in lines {
        assert!(console.contains(want), "missing {want:?} in the console");
    }
}

#[test]
fn smoke_on_kernel_siw_in_the_vm() {
    let cmd = "timeout 120 /opt/cx4/cxgb4_smoke siw0 10.99.0.1 7471";
    let Some(console) = run_in_vm("smoke_on_kernel_siw_in_the_vm", 's', cmd) else {
        return;
    };
    assert_lines(
        &console,
        &[
            r#"devices: [DeviceInfo { name: "siw0", transport: Iwarp, node_type: 4 }]"#,
            "client: device siw0 caps DeviceCaps {",
            "client: transport Iwarp, port 1 max message ",
            "client: QP with another context's CQ refused: invalid argument: rdma_create_qp",
            "server: a second CQ on the channel refused: completion channel already has a CQ",
            "client: strict Read sink without REMOTE_WRITE refused: invalid argument: RDMA Read sink MR without REMOTE_WRITE (iw_cxgb4 requires it)",
            "client: RDMA Write and Read of 4 KiB verified",
            "client: idle CM channel errno 11, idle async fd errno 11",
            "server: receive of 5 bytes, 4 KiB written by the peer verified",
            "client: Ok(()); server: Ok(())",
            "SMOKE OK",
            "SIWVM-CMD-EXIT rc=0",
        ],
    );
}

/// `rdma link delete siw0` from another process while connected: one
/// DEVICE_REMOVAL per live id (server: the connection's id and the
/// listener; client: its id; about 150 ms on an idle host), the 4 posted
/// receives of each side flushed, teardown done with the id handles dropped
/// before their events (the ack-before-destroy order is the events' own);
/// the delete still waits while the process lives (librdmacm's cached
/// context) and finishes as soon as it exits.
#[test]
fn device_removal_on_kernel_siw_in_the_vm() {
    let cmd = "timeout 120 /opt/cx4/cxgb4_smoke siw0 10.99.0.1 7472 --removal; \
               n=0; while rdma link show | grep -q siw0 && [ $n -lt 100 ]; do \
               sleep 0.05; n=$((n+1)); done; echo \"siw0 listed for $n more polls\"";
    let Some(console) = run_in_vm("device_removal_on_kernel_siw_in_the_vm", 'r', cmd) else {
        return;
    };
    assert_lines(
        &console,
        &[
            "client: 1 removal events (one per id) after ",
            "; 4 completions, 4 flushed",
            "server: 2 removal events (one per id) after ",
            "removal: rdma link delete still waiting (our fds), as expected",
            "REMOVAL OK",
            "siw0 listed for 0 more polls",
            "SIWVM-CMD-EXIT rc=0",
        ],
    );
    for side in ["client", "server"] {
        let line = console
            .lines()
            .find(|l| l.starts_with(&format!("{side}: ")) && l.contains("removal events"))
            .unwrap();
        assert!(line.ends_with("4 completions, 4 flushed"), "{line}");
    }
}
