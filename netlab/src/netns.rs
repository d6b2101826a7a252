//! Network namespaces and TAP topologies for root-only tests, removed by `Drop` guards.
//!
//! Everything is done with `ip(8)` (iproute2) and `sysctl(8)`, as transport-notes.md
//! describes, so a failing step prints the same error an operator would see. Threads
//! enter a namespace with `setns(2)` (`CLONE_NEWNET` affects only the calling thread).
//!
//! [`TapPair`] builds the topology of transport-notes.md: two namespaces, each with a TAP
//! and one end of a veth pair enslaved to a bridge, bridge netfilter and IPv6 off, the same
//! MTU everywhere, `txqueuelen` 10000 on TAPs and veths. The userspace stack owns the IP
//! addresses; the kernel interfaces have none.
//!
//! Names carry the process id and a counter ([`unique_tag`]) so tests can run in
//! parallel, and stay within the 15-byte interface name limit.

use std::fs::File;
use std::io;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;

use nix::sched::{setns, CloneFlags};

/// `true` if the process runs as root (effective uid 0), which namespaces and TAPs need.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A short tag unique within this machine for the life of the process: the pid and a
/// per-process counter, e.g. `"4711x3"` (at most 11 bytes).
pub fn unique_tag() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}x{}",
        std::process::id() % 10_000_000,
        NEXT.fetch_add(1, Ordering::Relaxed) % 100
    )
}

/// Runs `program ARGS...` and returns its stdout.
fn run(program: &str, args: &[&str]) -> io::Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot start `{program}`: {e} (is iproute2 installed?)"),
            )
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(io::Error::other(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Runs `ip ARGS...` in the caller's namespace.
///
/// Errors: the command could not be started, or exited non-zero (message has its stderr).
pub fn run_ip(args: &[&str]) -> io::Result<()> {
    run("ip", args).map(drop)
}

/// Runs `ip ARGS...` in the caller's namespace and returns what it printed on stdout.
///
/// Errors: as [`run_ip`].
pub fn ip_output(args: &[&str]) -> io::Result<String> {
    run("ip", args)
}

/// One `ip` command in a namespace, ready to go: an `ip -n NS -batch -` started by
/// [`ArmedIp::arm`] waits for the command on stdin, so that [`ArmedIp::fire`] costs a
/// pipe write rather than a process start (which took up to 400 ms on a loaded 2-core
/// machine). Used to tear a TAP down at a chosen moment. Dropping it unfired kills the
/// `ip`.
#[derive(Debug)]
pub struct ArmedIp {
    child: Child,
    cmd: String,
}

impl ArmedIp {
    /// Starts `ip -n NS -batch -` (stdout discarded, stderr kept for the error) for
    /// `command` (one `ip` command without the `ip`, e.g. `link del tap0`), at nice -15
    /// (`nice(1)`; as root, which these tests are): the action is the administrator's,
    /// and a test that times the device from it must not time the scheduler instead (on
    /// two cores with a busy loop on each, an `ip` at nice 0 waited up to a second to
    /// run after [`ArmedIp::fire`] wrote its command). Without the privilege `nice`
    /// warns and runs `ip` at the usual priority.
    ///
    /// Errors: `nice` or `ip` cannot be started.
    pub fn arm(ns: &str, command: &str) -> io::Result<ArmedIp> {
        let child = Command::new("nice")
            .args(["-n", "-15", "ip", "-n", ns, "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        Ok(ArmedIp {
            child,
            cmd: format!("{command}\n"),
        })
    }

    /// Runs the command now: writes it to the waiting `ip` and waits for it to exit.
    /// Returns [`crate::now_ns`] just before the write and after `ip` exited (the kernel
    /// acted in between).
    ///
    /// Errors: the write failed, or `ip` failed (its stderr in the message).
    pub fn fire(mut self) -> io::Result<(u64, u64)> {
        use std::io::Write;
        let t = crate::now_ns();
        let mut stdin = self
            .child
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("no stdin"))?;
        stdin.write_all(self.cmd.as_bytes())?;
        drop(stdin);
        let status = self.child.wait()?;
        let t_done = crate::now_ns();
        if !status.success() {
            let mut err = String::new();
            if let Some(mut e) = self.child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return Err(io::Error::other(format!(
                "`ip -batch` {}: {status}: {err}",
                self.cmd.trim()
            )));
        }
        Ok((t, t_done))
    }
}

impl Drop for ArmedIp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates TAP `tap` in namespace `ns` (persistent, `ip tuntap add`) with `mtu` and
/// `txqueuelen`, enslaves it to the existing bridge `bridge`, sets it up, and commits
/// its pending link changes (`ip link show dev TAP`; see [`TapPair::create`]).
///
/// Errors: the first failing `ip` step (what was made is left for the caller's clean-up).
pub fn add_tap_on_bridge(
    ns: &str,
    tap: &str,
    bridge: &str,
    mtu: usize,
    txqueuelen: u32,
) -> io::Result<()> {
    let (mtu, qlen) = (mtu.to_string(), txqueuelen.to_string());
    let ip = |args: &[&str]| {
        let mut all = vec!["-n", ns];
        all.extend_from_slice(args);
        run_ip(&all)
    };
    ip(&["tuntap", "add", "dev", tap, "mode", "tap"])?;
    ip(&["link", "set", tap, "mtu", &mtu, "txqueuelen", &qlen])?;
    ip(&["link", "set", tap, "master", bridge])?;
    ip(&["link", "set", tap, "up"])?;
    ip(&["link", "show", "dev", tap])
}

/// Deletes the namespaces this module made (`swns<pid>x...`) whose process is gone, e.g.
/// after a test run was killed before its `Drop` guards ran. Namespaces of live
/// processes are left alone. Returns the names deleted.
///
/// Errors: none; a namespace that cannot be deleted is logged and skipped.
pub fn remove_stale() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("swns")
            .and_then(|r| r.split_once('x'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match run_ip(&["netns", "del", &name]) {
            Ok(()) => removed.push(name),
            Err(e) => tracing::warn!(ns = %name, error = %e, "cannot delete stale namespace"),
        }
    }
    removed
}

/// A named network namespace (`ip netns add`), deleted on drop (`ip netns del`).
///
/// Deleting the name does not end the namespace while a thread is still in it or an fd
/// still refers to it; its interfaces go when the last reference does.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates namespace `name`, brings its loopback up and turns off bridge netfilter and
    /// IPv6 in it (the bridge-netfilter keys exist only when `br_netfilter` is loaded;
    /// missing keys are ignored).
    ///
    /// Errors: `ip`/`sysctl` failures (e.g. the name exists, or not root).
    pub fn create(name: &str) -> io::Result<NetNs> {
        run_ip(&["netns", "add", name])?;
        let ns = NetNs {
            name: name.to_owned(),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        ns.exec(
            "sysctl",
            &[
                "-q",
                "-e",
                "-w",
                "net.bridge.bridge-nf-call-iptables=0",
                "net.bridge.bridge-nf-call-arptables=0",
                "net.bridge.bridge-nf-call-ip6tables=0",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ],
        )?;
        Ok(ns)
    }

    /// The namespace name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n NAME ARGS...`.
    ///
    /// Errors: as [`run_ip`].
    pub fn ip(&self, args: &[&str]) -> io::Result<()> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run_ip(&all)
    }

    /// Runs `ip netns exec NAME PROGRAM ARGS...`.
    ///
    /// Errors: the command could not be started or exited non-zero.
    pub fn exec(&self, program: &str, args: &[&str]) -> io::Result<()> {
        let mut all = vec!["netns", "exec", self.name.as_str(), program];
        all.extend_from_slice(args);
        run_ip(&all)
    }

    /// Moves the calling thread into this namespace (`setns(2)` on
    /// `/run/netns/NAME`). Sockets, TAPs and interface lookups made afterwards by this
    /// thread belong to the namespace; other threads are unaffected.
    ///
    /// Errors: the namespace file cannot be opened, or `setns` fails.
    pub fn enter(&self) -> io::Result<()> {
        let f = File::open(format!("/run/netns/{}", self.name))?;
        setns(&f, CloneFlags::CLONE_NEWNET)?;
        Ok(())
    }

    /// Spawns a thread that enters this namespace, then runs `f`.
    ///
    /// The join result is `Err` if entering failed (then `f` did not run).
    pub fn spawn<F, T>(&self, f: F) -> JoinHandle<io::Result<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let file = File::open(&path)?;
            setns(&file, CloneFlags::CLONE_NEWNET)?;
            Ok(f())
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(e) = run_ip(&["netns", "del", &self.name]) {
            tracing::warn!(ns = %self.name, error = %e, "cannot delete network namespace");
        }
    }
}

/// Settings of a [`TapPair`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TapPairConfig {
    /// MTU in bytes of every interface (TAPs at most 65521). Default 1500.
    pub mtu: usize,
    /// `txqueuelen` in frames of the TAPs and veths. Default 10000 (transport-notes.md:
    /// the default 1000 can hang a transfer).
    pub txqueuelen: u32,
}

impl Default for TapPairConfig {
    fn default() -> Self {
        TapPairConfig {
            mtu: 1500,
            txqueuelen: 10_000,
        }
    }
}

/// Two namespaces A and B, each with a persistent TAP (`ip tuntap add`) on a bridge with
/// one end of a veth pair joining them. Everything is up; nothing has an IP address.
/// Dropping it deletes the interfaces and then the namespaces.
#[derive(Debug)]
pub struct TapPair {
    /// Namespace A.
    pub a: NetNs,
    /// Namespace B.
    pub b: NetNs,
    /// TAP interface name in A.
    pub tap_a: String,
    /// TAP interface name in B.
    pub tap_b: String,
    /// The MTU in bytes of every interface.
    pub mtu: usize,
    /// Veth ends and bridges in A and B, deleted on drop.
    others: [(String, String); 2],
}

impl TapPair {
    /// Builds the topology with fresh names (see [`unique_tag`]), after removing what
    /// killed runs left behind ([`remove_stale`]).
    ///
    /// Errors: any failing `ip` step (what was built so far is removed).
    pub fn create(config: TapPairConfig) -> io::Result<TapPair> {
        remove_stale();
        let tag = unique_tag();
        let a = NetNs::create(&format!("swns{tag}a"))?;
        let b = NetNs::create(&format!("swns{tag}b"))?;
        let (va, vb) = (format!("swv{tag}a"), format!("swv{tag}b"));
        let (ba, bb) = (format!("swb{tag}a"), format!("swb{tag}b"));
        let pair = TapPair {
            a,
            b,
            tap_a: format!("swt{tag}a"),
            tap_b: format!("swt{tag}b"),
            mtu: config.mtu,
            others: [(va.clone(), ba.clone()), (vb.clone(), bb.clone())],
        };
        let mtu = config.mtu.to_string();
        let qlen = config.txqueuelen.to_string();
        run_ip(&[
            "link",
            "add",
            &va,
            "netns",
            pair.a.name(),
            "type",
            "veth",
            "peer",
            "name",
            &vb,
            "netns",
            pair.b.name(),
        ])?;
        for (ns, tap, veth, br) in [
            (&pair.a, &pair.tap_a, &va, &ba),
            (&pair.b, &pair.tap_b, &vb, &bb),
        ] {
            ns.ip(&["link", "add", br, "type", "bridge", "stp_state", "0"])?;
            add_tap_on_bridge(ns.name(), tap, br, config.mtu, config.txqueuelen)?;
            ns.ip(&["link", "set", veth, "mtu", &mtu, "txqueuelen", &qlen])?;
            ns.ip(&["link", "set", veth, "master", br])?;
            ns.ip(&["link", "set", br, "mtu", &mtu])?;
            for dev in [br, veth] {
                ns.ip(&["link", "set", dev, "up"])?;
            }
        }
        // Commit pending link changes now. The kernel applies carrier changes (qdisc
        // activation, bridge port state) in its linkwatch work, rate-limited to one run a
        // second for "non-urgent" devices (a veth whose index equals its peer's, which is
        // the usual case in two fresh namespaces, is one); without this, frames were lost
        // for up to 0.9 s after the topology was built although every interface already
        // reported up (measured). A single-device RTM_GETLINK (`ip link show DEV`) runs the
        // pending work for that device (`rtnl_getlink` -> `linkwatch_sync_dev`).
        for (ns, devs) in [
            (&pair.a, [&va, &ba, &pair.tap_a]),
            (&pair.b, [&vb, &bb, &pair.tap_b]),
        ] {
            for dev in devs {
                ns.ip(&["link", "show", "dev", dev])?;
            }
        }
        Ok(pair)
    }
}

impl TapPair {
    /// The bridge names in A and B (each holds its side's TAP and veth end).
    pub fn bridges(&self) -> [&str; 2] {
        [&self.others[0].1, &self.others[1].1]
    }
}

impl Drop for TapPair {
    fn drop(&mut self) {
        // Namespace teardown would remove these too; deleting them first makes the
        // cleanup independent of threads that still hold a namespace reference. Errors
        // (e.g. a TAP a test already deleted) are expected and ignored.
        let [(va, ba), (_, bb)] = &self.others;
        for (ns, dev) in [
            (&self.a, &self.tap_a),
            (&self.b, &self.tap_b),
            (&self.a, va), // deletes its peer in B too
            (&self.a, ba),
            (&self.b, bb),
        ] {
            let _ = ns.ip(&["link", "del", dev]);
        }
        // The NetNs fields drop next and delete the namespaces.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_unique_and_names_fit() {
        let a = unique_tag();
        let b = unique_tag();
        assert_ne!(a, b);
        // "swns" + tag + "a" must fit the 15-byte interface name limit.
        assert!(format!("swns{a}a").len() <= 15, "{a}");
    }
}
