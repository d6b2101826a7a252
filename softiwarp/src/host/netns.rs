//! The network namespace a host-TCP device lives in, so that every kernel socket of the
//! device is made there, whichever thread makes it.
//!
//! A socket belongs to the network namespace of the thread that created it (socket(7),
//! network_namespaces(7)). A device opened with [`DeviceConfig::netns`](crate::DeviceConfig::netns)
//! builds its stack on its engine thread inside that namespace, but a connect or a
//! listen can run on an application thread (it drives the device inside a verbs call),
//! and the RDMA CM asks the kernel's route from its own thread. [`Netns::run`] makes a
//! closure's sockets in the device's namespace: at once when the calling thread is
//! already there (one `stat(2)`), else between two `setns(2)` calls (which need
//! `CAP_SYS_ADMIN`, as entering the namespace did).

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;

use nix::sched::{setns, CloneFlags};

/// This thread's network namespace file.
const SELF_NS: &str = "/proc/thread-self/ns/net";

/// A network namespace, held open. See the [module docs](self).
#[derive(Debug)]
pub struct Netns {
    file: File,
    ino: u64,
    dev: u64,
}

impl Netns {
    /// The calling thread's network namespace.
    ///
    /// Errors: the namespace file cannot be opened (no `/proc`).
    pub fn current() -> io::Result<Netns> {
        let file = File::open(SELF_NS)?;
        let m = file.metadata()?;
        Ok(Netns {
            ino: m.ino(),
            dev: m.dev(),
            file,
        })
    }

    /// Runs `f` with the calling thread in this namespace, and back in its own after.
    ///
    /// Errors: the thread's namespace cannot be read, or `setns(2)` fails (`EPERM`
    /// without `CAP_SYS_ADMIN`); `f` did not run then.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> io::Result<T> {
        let m = std::fs::metadata(SELF_NS)?;
        if (m.ino(), m.dev()) == (self.ino, self.dev) {
            return Ok(f());
        }
        let back = File::open(SELF_NS)?;
        setns(&self.file, CloneFlags::CLONE_NEWNET)?;
        let r = f();
        if let Err(e) = setns(&back, CloneFlags::CLONE_NEWNET) {
            // The thread would stay in the device's namespace: say so loudly.
            tracing::error!(error = %e, "cannot return to the thread's network namespace");
        }
        Ok(r)
    }
}
