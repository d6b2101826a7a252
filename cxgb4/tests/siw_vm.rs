//! Root-only: the crate end to end on a real rdma-core device, the Linux
//! kernel's siw in the QEMU VM of `shared/tools/siwvm/siw-peer-vm.sh`. The
//! example `cxgb4_smoke` is copied into the guest and run there against
//! `siw0`: a server and a client thread connect through librdmacm, the
//! client RDMA Writes 4 KiB into the server's MR, reads it back, Sends 5
//! inline bytes; both check the data, disconnect, and drop everything in
//! order.
//!
//! Skips (saying so) when not root; when the VM cannot be built, or the
//! example was not built (`cargo test` builds examples; `--test siw_vm`
//! alone does not), it skips too, except under `CI`, where that fails.

use netlab::siwvm::{ensure_built, script_path};
use std::path::PathBuf;
use std::process::{Command, Stdio};

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

#[test]
fn smoke_on_kernel_siw_in_the_vm() {
    if !netlab::netns::is_root() {
        eprintln!("skipping smoke_on_kernel_siw_in_the_vm: needs root (namespace, TAP, VM)");
        return;
    }
    let in_ci = std::env::var_os("CI").is_some();
    if let Err(e) = ensure_built() {
        assert!(!in_ci, "the siw VM must build in CI: {e}");
        eprintln!("skipping smoke_on_kernel_siw_in_the_vm: cannot build the siw VM: {e}");
        return;
    }
    let exe = smoke_exe();
    if !exe.is_file() {
        assert!(!in_ci, "{} not built", exe.display());
        eprintln!(
            "skipping smoke_on_kernel_siw_in_the_vm: {} not built (cargo build -p cxgb4 --example cxgb4_smoke)",
            exe.display()
        );
        return;
    }
    let pid = std::process::id();
    let lab = Lab {
        ns: format!("cx4ns{pid}"),
        run_dir: PathBuf::from(format!("/tmp/siwvm-run/cx4-{pid}")),
    };
    std::fs::create_dir_all(&lab.run_dir).unwrap();
    let tap = format!("cx4t{pid}");
    let up = Command::new(script_path())
        .args(["netns-up", &lab.ns, &format!("cx4b{pid}"), &tap])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        up.status.success(),
        "netns-up: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let out = Command::new("timeout")
        .arg("240")
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
            "timeout 60 /opt/cx4/cxgb4_smoke siw0 10.99.0.1 7471",
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
        "the VM run failed (status {:?})",
        out.status
    );
    for want in [
        r#"devices: [DeviceInfo { name: "siw0", transport: Iwarp, node_type: 4 }]"#,
        "client: device siw0 caps DeviceCaps {",
        "client: transport Iwarp, port 1 max message ",
        "server: a second CQ on the channel refused: completion channel already has a CQ",
        "client: RDMA Write and Read of 4 KiB verified",
        "client: idle CM channel errno 11, idle async fd errno 11",
        "server: receive of 5 bytes, 4 KiB written by the peer verified",
        "client: Ok(()); server: Ok(())",
        "SMOKE OK",
        "SIWVM-CMD-EXIT rc=0",
    ] {
        assert!(console.contains(want), "missing {want:?} in the console");
    }
    drop(lab);
}
