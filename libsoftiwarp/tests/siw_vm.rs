//! Unmodified host programs under libsoftiwarp against the Linux kernel:
//! the kernel's siw in the QEMU VM of `shared/tools/siwvm` (rping and
//! perftest from Debian in the guest), the library on a TAP on the VM's bridge in the
//! VM's namespace (`SOFTIWARP_DEVICE=link=tap:...`). rping with `-V` and
//! `ib_write_bw -R` in both directions. Root (TAP, namespace, VM); skips with a note
//! otherwise, and fails under `CI` if the VM cannot be built.

mod support;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use netlab::siwvm::{ensure_built, SiwVm, Variant, HOST_IP, VM_IP};
use support::{check_pings, require, rping_teardown_race, LibDir};

/// A host program under the library in the VM's namespace, in its own process group.
struct Host {
    child: Child,
}

impl Host {
    /// `prog` under the library with `SOFTIWARP_DEVICE=device`, in the VM's namespace.
    fn spawn(vm: &SiwVm, lib: &LibDir, device: &str, prog: &str, args: &[&str]) -> Host {
        let ep = vm.endpoint();
        let child = Command::new("ip")
            .args(["netns", "exec", &ep.netns, "env"])
            .arg(format!(
                "LD_PRELOAD={}",
                lib.dir.join("libsoftiwarp.so").display()
            ))
            .arg(format!("SOFTIWARP_DEVICE={device}"))
            .arg(prog)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {prog}: {e}"));
        Host { child }
    }

    /// Waits up to `limit` (then kills its group by its id); (exit code, stdout, stderr).
    fn wait(mut self, limit: Duration) -> (Option<i32>, String, String) {
        let deadline = Instant::now() + limit;
        let code = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s.code();
            }
            if Instant::now() >= deadline {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", self.child.id())])
                    .status();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let (mut out, mut err) = (String::new(), String::new());
        if let Some(mut o) = self.child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (code, out, err)
    }
}

/// perftest's result row: the line after the `#bytes` header; (bytes, iterations, BW
/// average in Gbit/s... or MB/s as perftest prints it).
fn bw_row(text: &str) -> Vec<f64> {
    let mut lines = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    lines.next();
    lines
        .next()
        .map(|l| {
            l.split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn vm_or_skip(test: &str) -> Option<SiwVm> {
    if !netlab::netns::is_root() {
        eprintln!("skipping {test}: needs root (namespace, TAP, VM)");
        return None;
    }
    if !require("rping") || !require("ib_write_bw") {
        return None;
    }
    if let Err(e) = ensure_built() {
        assert!(
            std::env::var_os("CI").is_none(),
            "the siw VM must build in CI: {e}"
        );
        eprintln!("skipping {test}: cannot build the siw VM: {e}");
        return None;
    }
    Some(SiwVm::start(Variant::Default).unwrap_or_else(|e| panic!("{test}: {e}")))
}

#[test]
fn host_rping_and_ib_write_bw_under_the_library_against_kernel_siw_both_directions() {
    let test = "host_rping_and_ib_write_bw_under_the_library_against_kernel_siw";
    let Some(vm) = vm_or_skip(test) else { return };
    let ep = vm.endpoint();
    let device = format!("link=tap:{},ip={}/{}", ep.tap, ep.ip, ep.prefix_len);
    rping_and_ib_write_bw_both_directions(&vm, &device);
}

/// The same programs on a host-TCP device: the library on the host's kernel TCP over the
/// VM's bridge (`SOFTIWARP_DEVICE=netdev=BRIDGE`, the kernel holding `HOST_IP` there).
#[test]
fn host_tcp_rping_and_ib_write_bw_under_the_library_against_kernel_siw_both_directions() {
    let test = "host_tcp_rping_and_ib_write_bw_under_the_library_against_kernel_siw";
    let Some(vm) = vm_or_skip(test) else { return };
    let bridge = vm.host_tcp_interface().expect("HOST_IP on the bridge");
    rping_and_ib_write_bw_both_directions(&vm, &format!("netdev={bridge}"));
}

/// rping with `-V` and `ib_write_bw -R`, each with the kernel as server and then as
/// client, our side under the library with `device` as its device line.
fn rping_and_ib_write_bw_both_directions(vm: &SiwVm, device: &str) {
    let lib = LibDir::new("siwvm");
    let long = Duration::from_secs(120);

    // 1. Kernel rping server in the VM, host rping client under the library.
    vm.spawn("rps", &format!("rping -s -a {VM_IP} -C 10 -v"))
        .unwrap();
    vm.wait_listening(7174, long).unwrap();
    let (code, out, err) = Host::spawn(
        vm,
        &lib,
        device,
        "rping",
        &["-c", "-a", &VM_IP.to_string(), "-C", "10", "-v", "-V"],
    )
    .wait(long);
    let (rc, vm_out) = vm.wait_spawned("rps", long).unwrap_or_else(|e| {
        panic!("VM rping server: {e}\nhost client (exit {code:?}):\n{out}\n{err}")
    });
    assert!(
        code == Some(0) || rping_teardown_race(code, &err),
        "host rping client (exit {code:?}):\n{out}\n{err}\nVM server:\n{vm_out}"
    );
    assert_eq!(rc, 0, "VM rping server:\n{vm_out}");
    check_pings(&out, "ping data: ", 10, "host rping client");
    check_pings(&vm_out, "server ping data: ", 10, "VM rping server");

    // 2. Host rping server under the library, kernel rping client in the VM.
    let server = Host::spawn(
        vm,
        &lib,
        device,
        "rping",
        &["-s", "-a", &HOST_IP.to_string(), "-C", "10", "-v"],
    );
    std::thread::sleep(Duration::from_secs(1));
    let (rc, vm_out) = vm
        .exec(
            &format!("rping -c -a {HOST_IP} -C 10 -v -V"),
            Duration::from_secs(60),
        )
        .unwrap();
    let (code, out, err) = server.wait(Duration::from_secs(30));
    assert!(
        rc == 0 || rping_teardown_race(Some(rc), &vm_out),
        "VM rping client (exit {rc}):\n{vm_out}\nhost server:\n{out}\n{err}"
    );
    assert_eq!(code, Some(0), "host rping server:\n{out}\n{err}");
    check_pings(&vm_out, "ping data: ", 10, "VM rping client");
    check_pings(&out, "server ping data: ", 10, "host rping server");

    // 3. ib_write_bw -R: kernel server in the VM, host client under the library.
    vm.spawn("bws", "ib_write_bw -R -n 200").unwrap();
    vm.wait_listening(18515, long).unwrap();
    let (code, out, err) = Host::spawn(
        vm,
        &lib,
        device,
        "ib_write_bw",
        &["-R", "-n", "200", &VM_IP.to_string()],
    )
    .wait(long);
    let (rc, vm_out) = vm.wait_spawned("bws", long).unwrap_or_else(|e| {
        panic!("VM ib_write_bw server: {e}\nhost client (exit {code:?}):\n{out}\n{err}")
    });
    assert_eq!(
        code,
        Some(0),
        "host ib_write_bw client:\n{out}\n{err}\nVM:\n{vm_out}"
    );
    assert_eq!(rc, 0, "VM ib_write_bw server:\n{vm_out}");
    let row = bw_row(&out);
    assert_eq!(row.first(), Some(&65536.0), "client row: {out}");
    assert_eq!(row.get(1), Some(&200.0), "client row: {out}");
    println!("to the VM: host ib_write_bw -R: {out}");

    // 4. ib_write_bw -R: host server under the library, kernel client in the VM.
    let server = Host::spawn(vm, &lib, device, "ib_write_bw", &["-R", "-n", "200"]);
    std::thread::sleep(Duration::from_secs(1));
    let (rc, vm_out) = vm
        .exec(&format!("ib_write_bw -R -n 200 {HOST_IP}"), long)
        .unwrap();
    let (code, out, err) = server.wait(Duration::from_secs(30));
    assert_eq!(
        rc, 0,
        "VM ib_write_bw client:\n{vm_out}\nhost server:\n{out}\n{err}"
    );
    assert_eq!(code, Some(0), "host ib_write_bw server:\n{out}\n{err}");
    let row = bw_row(&vm_out);
    assert_eq!(row.first(), Some(&65536.0), "VM client row: {vm_out}");
    assert_eq!(row.get(1), Some(&200.0), "VM client row: {vm_out}");
    println!("from the VM: kernel ib_write_bw -R: {vm_out}");
}
