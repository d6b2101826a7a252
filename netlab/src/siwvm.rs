//! A Linux kernel siw peer in a QEMU VM, for interop tests: a Drop guard around
//! `shared/tools/siwvm/siw-peer-vm.sh`.
//!
//! ```text
//!  namespace swns<tag>v
//!  [our peer: smoltcp 10.77.0.9] -- TAP swh<tag> --+
//!                                                    bridge swb<tag>
//!  [VM: kernel siw, eth0 10.77.0.1] -- TAP swv<tag> -+
//! ```
//!
//! [`SiwVm::start`] makes the namespace with its bridge and two TAPs (`netns-up`), boots
//! the VM with the chosen siw build ([`Variant`]) on one TAP (`start`, about 7 s under
//! software emulation), and gives our side the other TAP ([`SiwVm::endpoint`]). Commands
//! run in the guest through the script's control port ([`SiwVm::exec`], one at a time:
//! the script's `exec` readers share one FIFO), or in the background with their output
//! and exit status kept in a guest file ([`SiwVm::spawn`], [`SiwVm::wait_spawned`]).
//! Dropping the guard stops the VM (by the pid the script recorded), deletes the
//! namespace and the run directory, also while a panic unwinds.
//!
//! Each guard has its own run directory (`/tmp/siwvm-run/<tag>`, the script's
//! `SIWVM_RUN`), so VM names never collide; a run killed outright leaves a directory whose
//! VMs the next [`SiwVm::start`] stops (the pid files name them, and a pid is killed only
//! if its command line still names that run directory) before the namespace goes too
//! ([`crate::netns::remove_stale`], the `swns<pid>x` scheme).
//!
//! The VM needs the script's build products (`SIWVM_CACHE`, default `/tmp/siwvm/cache`):
//! [`ensure_built`] runs `build` once per process when they are missing (Debian's archive,
//! about a minute). Root is required.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::topology::Endpoint;

/// The guest's address.
pub const VM_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 77, 0, 1);
/// The address our side uses.
pub const HOST_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 77, 0, 9);
/// Prefix length of the VM subnet.
pub const PREFIX_LEN: u8 = 24;
/// Where run directories go.
const RUN_ROOT: &str = "/tmp/siwvm-run";

/// The four siw builds the script provides (siw's MPA knobs are compile-time constants).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// MPA rev 2 with IRD/ORD, CRC only when the peer asks, no P2P.
    Default,
    /// `mpa_crc_required`: asks for CRC as initiator.
    Crc,
    /// `peer_to_peer`: as initiator, P2P with a zero-length Write RTR (STag 1, TO 0).
    P2p,
    /// `mpa_version = 1`: MPA rev 1 as initiator, no IRD/ORD exchange.
    MpaV1,
}

impl Variant {
    /// Every variant.
    pub const ALL: [Variant; 4] = [Variant::Default, Variant::Crc, Variant::P2p, Variant::MpaV1];

    /// The script's name for it (`--variant`).
    pub fn name(self) -> &'static str {
        match self {
            Variant::Default => "default",
            Variant::Crc => "crc",
            Variant::P2p => "p2p",
            Variant::MpaV1 => "mpav1",
        }
    }
}

/// Errors of the VM harness.
#[derive(Debug, thiserror::Error)]
pub enum SiwVmError {
    /// Not root.
    #[error("needs root (namespaces, TAPs, the VM's build)")]
    NotRoot,
    /// The script is not where it should be.
    #[error("siw-peer-vm.sh not found at {0} (set SIWVM_SCRIPT)")]
    NoScript(PathBuf),
    /// `build` failed (its output attached).
    #[error("building the siw VM failed: {0}")]
    Build(String),
    /// A script step failed.
    #[error("`siw-peer-vm.sh {step}` failed: {output}")]
    Script {
        /// The arguments.
        step: String,
        /// Its stdout and stderr.
        output: String,
    },
    /// A command in the guest did not finish in time.
    #[error("guest command `{0}` did not finish within {1:?}")]
    Timeout(String, Duration),
    /// Starting a process failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The script: `$SIWVM_SCRIPT`, else `shared/tools/siwvm/siw-peer-vm.sh` beside the
/// project (`../shared` of the workspace root).
pub fn script_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SIWVM_SCRIPT") {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tools/siwvm/siw-peer-vm.sh")
}

fn cache_dir() -> PathBuf {
    std::env::var_os("SIWVM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/siwvm/cache"))
}

/// Whether the build products (kernel, initramfs) are in the cache.
pub fn is_built() -> bool {
    let c = cache_dir();
    c.join("vmlinuz").is_file() && c.join("initrd.img").is_file()
}

/// Runs the script's `build` unless its products are cached; once per process (later
/// calls return the first outcome). Takes about a minute from an empty cache (Debian's
/// archive; the script installs its host tools with apt-get when missing).
///
/// Errors: [`SiwVmError::NotRoot`], [`SiwVmError::NoScript`], [`SiwVmError::Build`].
pub fn ensure_built() -> Result<(), SiwVmError> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    if !crate::netns::is_root() {
        return Err(SiwVmError::NotRoot);
    }
    let script = script_path();
    if !script.is_file() {
        return Err(SiwVmError::NoScript(script));
    }
    BUILT
        .get_or_init(|| {
            if is_built() {
                return Ok(());
            }
            let t0 = Instant::now();
            let out = Command::new(&script)
                .arg("build")
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if out.status.success() && is_built() {
                eprintln!("siwvm: built in {:.0?}", t0.elapsed());
                Ok(())
            } else {
                let lines: Vec<&str> = text.lines().collect();
                Err(lines[lines.len().saturating_sub(30)..].join("\n"))
            }
        })
        .clone()
        .map_err(SiwVmError::Build)
}

/// A running kernel-siw VM on its own namespace and bridge. See the [module docs](self).
#[derive(Debug)]
pub struct SiwVm {
    script: PathBuf,
    run_dir: PathBuf,
    name: String,
    variant: Variant,
    endpoint: Endpoint,
    bridge: String,
    boot: Duration,
    ns_made: bool,
}

/// Serializes `exec` calls: the script's readers share the VM's output FIFO.
static EXEC_LOCK: Mutex<()> = Mutex::new(());

impl SiwVm {
    /// Builds the namespace, bridge and TAPs, and boots a VM running `variant`; returns
    /// once siw0 is up in the guest.
    ///
    /// Errors: [`SiwVmError::NotRoot`]; [`SiwVmError::NoScript`]; [`SiwVmError::Script`]
    /// when `netns-up` or `start` fails (what was made is removed).
    pub fn start(variant: Variant) -> Result<SiwVm, SiwVmError> {
        SiwVm::start_with_files(variant, &[])
    }

    /// [`SiwVm::start`], with host files copied into the guest: each `(src, dst)` puts
    /// the host file `src` at the guest path `dst` (the script's `--add src:dst`), e.g. a
    /// host-built binary to run there (same glibc; rdma-core is in the guest).
    ///
    /// Errors: as [`SiwVm::start`] (a missing `src` fails the script's `start`).
    pub fn start_with_files(
        variant: Variant,
        files: &[(PathBuf, String)],
    ) -> Result<SiwVm, SiwVmError> {
        if !crate::netns::is_root() {
            return Err(SiwVmError::NotRoot);
        }
        let script = script_path();
        if !script.is_file() {
            return Err(SiwVmError::NoScript(script));
        }
        stop_stale_vms(&script);
        crate::netns::remove_stale();
        let tag = crate::netns::unique_tag();
        let run_dir = Path::new(RUN_ROOT).join(&tag);
        std::fs::create_dir_all(&run_dir)?;
        let netns = format!("swns{tag}v");
        let mut vm = SiwVm {
            script,
            run_dir,
            name: format!("siw-{}", variant.name()),
            variant,
            endpoint: Endpoint {
                netns: netns.clone(),
                tap: format!("swh{tag}"),
                ip: HOST_IP,
                prefix_len: PREFIX_LEN,
                mac: crate::host_mac(9),
            },
            bridge: format!("swb{tag}"),
            boot: Duration::ZERO,
            ns_made: false,
        };
        let vm_tap = format!("swv{tag}");
        vm.script(&[
            "netns-up",
            &netns,
            &vm.bridge.clone(),
            &vm_tap,
            &vm.endpoint.tap.clone(),
        ])?;
        vm.ns_made = true;
        crate::signals::registry().namespaces.insert(netns.clone());
        // Commit pending carrier changes on the new links (see ARCHITECTURE.md, "Link
        // failure detection"): otherwise the first frames may be lost.
        let _ = crate::netns::run_ip(&["-n", &netns, "link", "show"]);
        let t0 = Instant::now();
        let cidr = format!("{VM_IP}/{PREFIX_LEN}");
        let name = vm.name.clone();
        let mut args: Vec<String> = vec!["start".into(), "--variant".into(), variant.name().into()];
        for (src, dst) in files {
            args.push("--add".into());
            args.push(format!("{}:{dst}", src.display()));
        }
        args.extend([name, vm_tap, cidr]);
        vm.script(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        vm.boot = t0.elapsed();
        Ok(vm)
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.script);
        c.env("SIWVM_RUN", &self.run_dir)
            .env("SIWVM_NETNS", &self.endpoint.netns)
            .stdin(Stdio::null());
        c
    }

    fn script(&self, args: &[&str]) -> Result<String, SiwVmError> {
        let out = self.command().args(args).output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(SiwVmError::Script {
                step: args.join(" "),
                output: text,
            })
        }
    }

    /// The siw build running in the guest.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Where our side lives: the namespace, the TAP to open, [`HOST_IP`], a MAC.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The bridge joining the two TAPs (for a capture with tcpdump).
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// Gives the kernel of the VM's namespace [`HOST_IP`] on the bridge and returns the
    /// bridge's name: the interface a host-TCP device (`--netdev`, `netdev=`) uses to
    /// reach the guest through the kernel's TCP, instead of a smoltcp device on
    /// [`Endpoint::tap`] (use one or the other in a VM: both would own [`HOST_IP`]).
    /// Calling it again is harmless.
    ///
    /// Errors: the `ip addr add` fails for another reason than the address being there.
    pub fn host_tcp_interface(&self) -> Result<String, SiwVmError> {
        let cidr = format!("{HOST_IP}/{PREFIX_LEN}");
        let out = Command::new("ip")
            .args([
                "-n",
                &self.endpoint.netns,
                "addr",
                "replace",
                &cidr,
                "dev",
                &self.bridge,
            ])
            .output()?;
        if !out.status.success() {
            return Err(SiwVmError::Script {
                step: format!("ip addr replace {cidr} dev {}", self.bridge),
                output: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(self.bridge.clone())
    }

    /// From `start` to siw0 up in the guest.
    pub fn boot_time(&self) -> Duration {
        self.boot
    }

    /// The guest's console log so far.
    pub fn console(&self) -> String {
        std::fs::read_to_string(self.run_dir.join(format!("{}.log", self.name)))
            .unwrap_or_else(|e| format!("(no console log: {e})"))
    }

    /// Runs `cmd` (a shell command line) in the guest and returns its exit status and
    /// output (stdout and stderr merged).
    ///
    /// Errors: [`SiwVmError::Timeout`] (the command keeps running in the guest);
    /// [`SiwVmError::Io`].
    pub fn exec(&self, cmd: &str, timeout: Duration) -> Result<(i32, String), SiwVmError> {
        let _one = EXEC_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let out = self
            .command()
            .args(["exec", &self.name, "--timeout"])
            .arg(timeout.as_secs().max(1).to_string())
            .arg(cmd)
            .output()?;
        let rc = out.status.code().unwrap_or(-1);
        if rc == 124 {
            return Err(SiwVmError::Timeout(cmd.to_owned(), timeout));
        }
        Ok((rc, String::from_utf8_lossy(&out.stdout).into_owned()))
    }

    /// Waits up to `timeout` until a kernel TCP socket of the guest listens on
    /// `0.0.0.0:port` (`/proc/net/tcp`, state LISTEN): what a kernel rping or an rdma-core
    /// server on siw shows once `rdma_listen` returned. Short guest commands, retried: one
    /// lost on the control port (seen once in a while under load) costs seconds, not the
    /// run.
    ///
    /// Errors: [`SiwVmError::Timeout`] when it never listens; [`SiwVmError::Io`].
    pub fn wait_listening(&self, port: u16, timeout: Duration) -> Result<(), SiwVmError> {
        let probe = format!("grep -q ':{port:04X} 00000000:0000 0A' /proc/net/tcp");
        let deadline = Instant::now() + timeout;
        loop {
            match self.exec(&probe, Duration::from_secs(5)) {
                Ok((0, _)) => return Ok(()),
                Ok(_) | Err(SiwVmError::Timeout(..)) => {}
                Err(e) => return Err(e),
            }
            if Instant::now() >= deadline {
                return Err(SiwVmError::Timeout(probe, timeout));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts `cmd` in the background in the guest; its output and exit status go to a
    /// guest file named after `tag`, read by [`SiwVm::wait_spawned`].
    ///
    /// Errors: as [`SiwVm::exec`].
    pub fn spawn(&self, tag: &str, cmd: &str) -> Result<(), SiwVmError> {
        let line = format!("( {cmd}; echo \"SIWVM-RC=$?\" ) > /tmp/{tag}.log 2>&1 & echo started");
        self.exec(&line, Duration::from_secs(30)).map(|_| ())
    }

    /// Waits up to `timeout` for the command started by [`SiwVm::spawn`] under `tag` to
    /// end; returns its exit status and output.
    ///
    /// Errors: [`SiwVmError::Timeout`] (its output so far is in the message's command).
    pub fn wait_spawned(&self, tag: &str, timeout: Duration) -> Result<(i32, String), SiwVmError> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        loop {
            if let Ok((_, text)) =
                self.exec(&format!("cat /tmp/{tag}.log"), Duration::from_secs(30))
            {
                if let Some(rc) = text
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("SIWVM-RC="))
                    .and_then(|v| v.parse::<i32>().ok())
                {
                    let body: Vec<&str> = text
                        .lines()
                        .filter(|l| !l.starts_with("SIWVM-RC="))
                        .collect();
                    return Ok((rc, body.join("\n")));
                }
                last = text;
            }
            if Instant::now() >= deadline {
                return Err(SiwVmError::Timeout(
                    format!("{tag} (output so far: {last})"),
                    timeout,
                ));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for SiwVm {
    fn drop(&mut self) {
        let _ = self.script(&["stop", &self.name.clone()]);
        if self.ns_made {
            let _ = crate::netns::run_ip(&["netns", "del", &self.endpoint.netns]);
            crate::signals::registry()
                .namespaces
                .remove(&self.endpoint.netns);
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

/// Stops the VMs of run directories whose harness process is gone (a run killed
/// outright), by the pids their pid files hold, and removes those directories. A pid is
/// killed only if its command line still names that run directory (a qemu this harness
/// started), never by name.
fn stop_stale_vms(script: &Path) {
    let Ok(entries) = std::fs::read_dir(RUN_ROOT) else {
        return;
    };
    for e in entries.flatten() {
        let tag = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = tag
            .split_once('x')
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = e.path();
        if let Ok(files) = std::fs::read_dir(&dir) {
            for f in files.flatten() {
                let p = f.path();
                if p.extension().is_some_and(|x| x == "pid") {
                    let Some(name) = p.file_stem().map(|s| s.to_string_lossy().into_owned()) else {
                        continue;
                    };
                    // `stop` checks the pid's command line names this VM; the run
                    // directory check below is ours.
                    let qpid = std::fs::read_to_string(&p).unwrap_or_default();
                    let cmdline =
                        std::fs::read(format!("/proc/{}/cmdline", qpid.trim())).unwrap_or_default();
                    if String::from_utf8_lossy(&cmdline).contains(&*dir.to_string_lossy()) {
                        let _ = Command::new(script)
                            .env("SIWVM_RUN", &dir)
                            .args(["stop", &name])
                            .stdin(Stdio::null())
                            .output();
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
