//! Root-only: the same iwperf on both backends against each other. The Linux
//! kernel's siw runs in the QEMU VM of `shared/tools/siwvm/siw-peer-vm.sh`, with this
//! iwperf (stripped) copied in (`--add`); our soft device runs on the host, on a TAP
//! on the VM's bridge, in the VM's namespace.
//!
//! - `iwperf server --device siw0` in the VM (rdma-core through libibverbs and
//!   librdmacm, on the VM's address found from siw0's interface) against `iwperf
//!   client` on the soft device: Write, Read and Send of 64 KiB with `--verify`.
//! - The reverse: the soft `iwperf server` on the host against `iwperf client --device
//!   siw0` in the VM.
//!
//! Each run must succeed with the data verified on the receiving side and the
//! connection counted on both (and a Send latency run each way); the figures are printed (under emulation they measure
//! the VM, not us). Skips (saying so) when not root or when the VM cannot be built;
//! under `CI` that fails instead.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use bench::iwperf::EXIT_DEVICE_REMOVAL;
use netlab::siwvm::{ensure_built, script_path};

const IWPERF: &str = env!("CARGO_BIN_EXE_iwperf");
/// The guest's address (siw0's interface, eth0).
const VM_IP: &str = "10.97.0.1";
/// The soft device's address on the host's TAP.
const HOST_IP: &str = "10.97.0.2";
/// Where the binary is in the guest.
const GUEST_IWPERF: &str = "/opt/iw/iwperf";
/// Messages per run: enough to go round every slot of the verified buffers twice.
const ITERS: &str = "300";

/// The namespace (bridge, TAPs), the VM and its run directory; all removed on drop.
struct Lab {
    ns: String,
    run_dir: PathBuf,
    name: String,
    host_tap: String,
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.script(&["stop", &self.name]);
        let _ = self.script(&["netns-down", &self.ns]);
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

impl Lab {
    fn script(&self, args: &[&str]) -> Output {
        Command::new(script_path())
            .env("SIWVM_RUN", &self.run_dir)
            .env("SIWVM_NETNS", &self.ns)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run siw-peer-vm.sh")
    }

    /// Runs `cmd` in the guest; (exit status, output).
    fn exec(&self, cmd: &str, timeout: Duration) -> (i32, String) {
        let t = timeout.as_secs().max(1).to_string();
        let out = self.script(&["exec", &self.name, "--timeout", &t, cmd]);
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    fn console(&self) -> String {
        std::fs::read_to_string(self.run_dir.join(format!("{}.log", self.name))).unwrap_or_default()
    }

    /// iwperf on the host's soft device, in the namespace, on our TAP.
    fn host_iwperf(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, IWPERF])
            .args(args)
            .args(["--tap", &self.host_tap, "--ip", &format!("{HOST_IP}/24")]);
        c
    }
}

impl Lab {
    /// Starts `iwperf server --timeout 120 EXTRA` on the host's soft device and waits
    /// for its READY; (the process, the rest of its stdout).
    fn host_server(
        &self,
        extra: &[&str],
        what: &str,
    ) -> (
        std::process::Child,
        std::io::Lines<BufReader<std::process::ChildStdout>>,
    ) {
        let mut server = self
            .host_iwperf(&[&["server", "--timeout", "120"], extra].concat())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("host server");
        let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
        let ready = lines
            .next()
            .and_then(Result::ok)
            .is_some_and(|l| l == "READY");
        assert!(ready, "{what}: the server did not get ready");
        (server, lines)
    }
}

/// Builds the lab and boots the VM with iwperf in it, or says why the test is skipped.
fn lab_or_skip(test: &str) -> Option<Lab> {
    if !netlab::netns::is_root() {
        eprintln!("skipping {test}: needs root (namespace, TAPs, a VM)");
        return None;
    }
    let in_ci = std::env::var_os("CI").is_some();
    if let Err(e) = ensure_built() {
        assert!(!in_ci, "{test}: the siw VM must build in CI: {e}");
        eprintln!("skipping {test}: cannot build the siw VM: {e}");
        return None;
    }
    let tag = format!("{}", std::process::id() % 100_000);
    let lab = Lab {
        ns: format!("iwpvm{tag}"),
        run_dir: PathBuf::from(format!("/tmp/siwvm-run/iwp-{tag}")),
        name: format!("iwp{tag}"),
        host_tap: format!("iwph{tag}"),
    };
    std::fs::create_dir_all(&lab.run_dir).unwrap();
    // The guest has 512 MiB at most: a stripped copy of the binary.
    let stripped = lab.run_dir.join("iwperf");
    let st = Command::new("strip")
        .args(["-o"])
        .arg(&stripped)
        .arg(IWPERF)
        .status()
        .expect("strip");
    assert!(st.success(), "strip {IWPERF}");
    let vm_tap = format!("iwpv{tag}");
    let up = lab.script(&[
        "netns-up",
        &lab.ns,
        &format!("iwpb{tag}"),
        &vm_tap,
        &lab.host_tap,
    ]);
    assert!(
        up.status.success(),
        "netns-up: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let add = format!("{}:{GUEST_IWPERF}", stripped.display());
    let t0 = Instant::now();
    let start = lab.script(&[
        "start",
        "--mem",
        "512",
        "--add",
        &add,
        &lab.name,
        &vm_tap,
        &format!("{VM_IP}/24"),
    ]);
    assert!(
        start.status.success(),
        "start: {}{}\n{}",
        String::from_utf8_lossy(&start.stdout),
        String::from_utf8_lossy(&start.stderr),
        lab.console()
    );
    println!("{test}: VM up in {:.1?}", t0.elapsed());
    Some(lab)
}

fn json_of(out: &str) -> serde_json::Value {
    let line = out
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in:\n{out}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// A client's report: one bandwidth row of `op`, 64 KiB, every message done, the data
/// verified by the receiver (Write, Send: the server; Read: the client). Returns its
/// Gbit/s.
fn check_client(report: &serde_json::Value, op: &str, what: &str) -> f64 {
    assert_eq!(report["exit_code"], 0, "{what}: {report}");
    assert_eq!(report["connections"], 1, "{what}: {report}");
    assert_eq!(report["error"], serde_json::Value::Null, "{what}: {report}");
    let rows = report["bandwidth"].as_array().expect("bandwidth rows");
    assert_eq!(rows.len(), 1, "{what}: {report}");
    let r = &rows[0];
    assert_eq!(r["op"], op, "{what}: {r}");
    assert_eq!(r["size"], 65536, "{what}: {r}");
    assert_eq!(
        r["iterations"],
        ITERS.parse::<u64>().unwrap(),
        "{what}: {r}"
    );
    assert_eq!(r["verify"], "passed", "{what}: {r}");
    assert_eq!(r["mismatches"], 0, "{what}: {r}");
    assert_eq!(r["partial"], false, "{what}: {r}");
    let gbps = r["gbps"].as_f64().unwrap();
    assert!(gbps > 0.0, "{what}: {r}");
    gbps
}

/// A server's summary: one connection served, its checks passed (Write, Send) or off
/// (Read: the client checks), the client's WR count received.
fn check_server(summary: &serde_json::Value, op: &str, what: &str) {
    assert_eq!(summary["exit_code"], 0, "{what}: {summary}");
    assert_eq!(summary["connections"], 1, "{what}: {summary}");
    let b = &summary["bandwidth"];
    assert_eq!(
        b["client_wrs"],
        ITERS.parse::<u64>().unwrap(),
        "{what}: {b}"
    );
    assert_eq!(b["mismatches"], 0, "{what}: {b}");
    if op == "send" {
        assert_eq!(b["messages"], ITERS.parse::<u64>().unwrap(), "{what}: {b}");
    }
    if op != "read" {
        assert_eq!(b["verify"], "passed", "{what}: {b}");
        assert!(b["checked"].as_u64().unwrap() > 0, "{what}: {b}");
    }
}

fn client_args(op: &str) -> Vec<&str> {
    vec![
        "--op", op, "--size", "65536", "--iters", ITERS, "--verify", "--json",
    ]
}

/// Round trips of a latency run.
const LAT_ITERS: u64 = 200;

fn lat_args(op: &str) -> Vec<&str> {
    vec![
        "--lat", "--op", op, "--size", "8", "--iters", "200", "--json",
    ]
}

/// A latency client's report: every round trip done, a typical time; returns it (us).
fn check_lat_client(report: &serde_json::Value, op: &str, what: &str) -> f64 {
    assert_eq!(report["exit_code"], 0, "{what}: {report}");
    let l = &report["latency"];
    assert_eq!(l["op"], op, "{what}: {l}");
    assert_eq!(l["iterations"], LAT_ITERS, "{what}: {l}");
    assert_eq!(l["partial"], false, "{what}: {l}");
    let t = l["t_typical"].as_f64().unwrap();
    assert!(t > 0.0 && t <= l["t_max"].as_f64().unwrap(), "{what}: {l}");
    t
}

/// A latency server's summary: Sends and Writes are answered once per round trip.
fn check_lat_server(summary: &serde_json::Value, op: &str, what: &str) {
    assert_eq!(summary["exit_code"], 0, "{what}: {summary}");
    assert_eq!(summary["connections"], 1, "{what}: {summary}");
    if op != "read" {
        assert_eq!(summary["answered"], LAT_ITERS, "{what}: {summary}");
    }
}

/// The rdma-core server in the VM, our soft client on the host with `client`'s
/// options; (the client's report, the server's summary).
fn rdma_core_server_soft_client(
    lab: &Lab,
    op: &str,
    client: &[&str],
) -> (serde_json::Value, serde_json::Value) {
    let what = format!("{op}: server --device siw0 in the VM, soft client");
    let log = format!("/tmp/iwps-{op}.log");
    let cmd = format!(
        "( {GUEST_IWPERF} server --device siw0 --timeout 120 --json; echo \"RC=$?\" ) > {log} 2>&1 & echo started"
    );
    let (rc, out) = lab.exec(&cmd, Duration::from_secs(30));
    assert_eq!(rc, 0, "{what}: {out}");
    // Listening once it printed READY.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (_, text) = lab.exec(&format!("cat {log}"), Duration::from_secs(30));
        if text.contains("READY") {
            break;
        }
        assert!(
            !text.contains("RC=") && Instant::now() < deadline,
            "{what}: the server did not get ready:\n{text}\n{}",
            lab.console()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut args = vec!["client", "--peer", VM_IP];
    args.extend(client);
    let out = lab
        .host_iwperf(&args)
        .stdin(Stdio::null())
        .output()
        .expect("host client");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let server_log = || lab.exec(&format!("cat {log}"), Duration::from_secs(30)).1;
    assert!(
        out.status.success(),
        "{what}: client {:?}\n{text}\n{}\nserver:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        server_log()
    );
    let report = json_of(&text);
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let text = server_log();
        if text.contains("RC=") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(text.contains("RC=0"), "{what}: server:\n{text}");
    (report, json_of(&text))
}

/// Our soft server on the host, the rdma-core client in the VM with `client`'s
/// options; (the client's report, the server's summary).
fn soft_server_rdma_core_client(
    lab: &Lab,
    op: &str,
    client: &[&str],
) -> (serde_json::Value, serde_json::Value) {
    let what = format!("{op}: soft server, client --device siw0 in the VM");
    let (mut server, lines) = lab.host_server(&["--json"], &what);
    let cmd = format!(
        "{GUEST_IWPERF} client --device siw0 --peer {HOST_IP} {}",
        client.join(" ")
    );
    let (rc, out) = lab.exec(&cmd, Duration::from_secs(150));
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = server.wait().expect("server exit");
    let mut err = String::new();
    if let Some(mut e) = server.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert_eq!(
        rc,
        0,
        "{what}: client in the VM:\n{out}\nserver: {status:?}\n{}\n{err}",
        rest.join("\n")
    );
    assert!(status.success(), "{what}: server {status:?}\n{err}");
    (json_of(&out), json_of(&rest.join("\n")))
}

/// Device removal on the rdma-core backend. The soft server on the
/// host; `iwperf client --device siw0 --verify` in the VM runs two connections, one
/// writing and one reading (RDMA Reads in flight on the ORQ are the WRs whose flushes
/// kernel siw's removal can lose: `cxgb4::wr_track`) until, once it printed progress,
/// `rdma link delete siw0` runs from another process in the background (with a
/// timeout: it blocks until every verbs fd of the device is closed). The client must
/// get exactly one `DeviceRemoval` for each of its two ids, complete every WR it posted
/// (the in-flight ones flushed), and exit with
/// `EXIT_DEVICE_REMOVAL` (5) within 5 s of the delete; the delete then finishes.
/// Returns (the exit's delay in ms, the client's removal line).
fn removal_on_rdma_core(lab: &Lab) -> (f64, String) {
    let what = "removal: soft server (host) <- client --device siw0 (VM)";
    let (mut server, _lines) = lab.host_server(&[], what);
    // /proc/uptime: the guest's clock in 10 ms steps, read just before the delete
    // starts and just after the client exits.
    let cmd = format!(
        "{GUEST_IWPERF} client --device siw0 --peer {HOST_IP} --op write,read --qps 2 --size 65536 \
         --duration 60 --progress --verify > /tmp/rm.out 2> /tmp/rm.err & P=$!; \
         n=0; while ! grep -q '^PROGRESS' /tmp/rm.out && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done; \
         T0=$(cut -d' ' -f1 /proc/uptime); \
         ( timeout 30 rdma link delete siw0; echo \"DEL_RC=$?\" > /tmp/del.rc ) & \
         wait $P; RC=$?; T1=$(cut -d' ' -f1 /proc/uptime); \
         n=0; while [ ! -s /tmp/del.rc ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n+1)); done; \
         echo \"RC=$RC T0=$T0 T1=$T1\"; cat /tmp/del.rc; cat /tmp/rm.err"
    );
    let (rc, out) = lab.exec(&cmd, Duration::from_secs(120));
    // The host's server sees its connection end; it has no more to do.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if server.try_wait().ok().flatten().is_none() {
        let _ = server.kill();
    }
    let _ = server.wait();
    assert_eq!(rc, 0, "{what}:\n{out}");
    let field = |key: &str| -> String {
        out.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("{what}: no {key} in:\n{out}"))
            .to_string()
    };
    assert_eq!(
        field("RC="),
        EXIT_DEVICE_REMOVAL.to_string(),
        "{what}: the client's exit status:\n{out}"
    );
    let t0: f64 = field("T0=").parse().unwrap();
    let t1: f64 = field("T1=").parse().unwrap();
    let ms = (t1 - t0) * 1000.0;
    assert!(
        ms <= 5000.0,
        "{what}: exit {ms} ms after the delete:\n{out}"
    );
    assert_eq!(field("DEL_RC="), "0", "{what}: rdma link delete:\n{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("iwperf: DeviceRemoval: "))
        .unwrap_or_else(|| panic!("{what}: no removal line:\n{out}"))
        .trim()
        .to_string();
    assert!(
        line.contains("2 events for 2 ids (2 live)"),
        "{what}: {line}"
    );
    assert!(line.ends_with(" 0 outstanding"), "{what}: {line}");
    (ms, line.trim_start_matches("iwperf: ").to_string())
}

#[test]
fn iwperf_on_kernel_siw_and_on_the_soft_device_both_directions() {
    let test = "iwperf_on_kernel_siw_and_on_the_soft_device_both_directions";
    let Some(lab) = lab_or_skip(test) else { return };
    let to_vm = "server --device siw0 (VM) <- soft client (host)";
    let from_vm = "soft server (host) <- client --device siw0 (VM)";
    let mut rows = Vec::new();
    for (sides, in_vm_server) in [(to_vm, true), (from_vm, false)] {
        let run = |op: &str, client: &[&str]| {
            if in_vm_server {
                rdma_core_server_soft_client(&lab, op, client)
            } else {
                soft_server_rdma_core_client(&lab, op, client)
            }
        };
        for op in ["write", "read", "send"] {
            let what = format!("{op}: {sides}");
            let (report, summary) = run(op, &client_args(op));
            let g = check_client(&report, op, &what);
            check_server(&summary, op, &what);
            rows.push(format!(
                "| {op:5} | 64 KiB bandwidth | {sides} | {g:.3} Gbit/s |"
            ));
        }
        // Latency: Send only. A Write latency run against the VM's server once stopped
        // for good with the client's 8-byte Write (a whole 28-byte FPDU) unread in the
        // guest's socket (kernel siw did not take it); the client now gives up after
        // LAT_ANSWER_TIMEOUT, but a flaky test would not do.
        let op = "send";
        let what = format!("{op} latency: {sides}");
        let (report, summary) = run(op, &lat_args(op));
        let t = check_lat_client(&report, op, &what);
        check_lat_server(&summary, op, &what);
        rows.push(format!("| {op:5} | 8 B latency | {sides} | {t:.1} us |"));
    }
    // Last (siw0 is gone after it): the removal on the rdma-core backend.
    let (ms, line) = removal_on_rdma_core(&lab);
    rows.push(format!(
        "| write+read | removal: exit {ms:.0} ms after `rdma link delete siw0` | {from_vm} | {line} |"
    ));
    println!(
        "{ITERS} messages (--verify) / {LAT_ITERS} round trips; as the client measured (under emulation: the VM's speed)"
    );
    println!("| op | test | sides | result |\n|---|---|---|---:|");
    for r in rows {
        println!("{r}");
    }
}
