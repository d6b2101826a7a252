//! The crate's error: a library that would not load, a device name that
//! matched nothing, or a failed verbs / CM call.

use crate::ffi::LoadError;
use verbs::VerbsError;

/// Why a call of this crate failed. `Display` is one line, fit for a tool to
/// print before exiting (status 3 for the first two kinds).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// rdma-core is not installed (or too old): `rdma-core (libibverbs.so.1)
    /// not found`.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// No RDMA device has this name: `no RDMA device named 'X' (found: a,
    /// b)`, or `(found: none)`.
    #[error("no RDMA device named '{name}' (found: {})", found_list(.found))]
    NoSuchDevice {
        /// The name asked for.
        name: String,
        /// The names libibverbs listed.
        found: Vec<String>,
    },
    /// A verbs or CM call failed; the error names the call (for errno
    /// pass-through) and carries the errno libibverbs / librdmacm gave.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
}

fn found_list(found: &[String]) -> String {
    if found.is_empty() {
        "none".to_string()
    } else {
        found.join(", ")
    }
}

impl Error {
    /// The errno of a [`Error::Verbs`]; `ENODEV` (19) for a missing device,
    /// `ELIBACC` (79) for a library that would not load.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Load(_) => libc::ELIBACC,
            Error::NoSuchDevice { .. } => libc::ENODEV,
            Error::Verbs(e) => e.errno(),
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = core::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_such_device_lists_what_was_found() {
        let e = Error::NoSuchDevice {
            name: "cxgb4_0".into(),
            found: vec!["siw0".into(), "rxe0".into()],
        };
        assert_eq!(
            e.to_string(),
            "no RDMA device named 'cxgb4_0' (found: siw0, rxe0)"
        );
        assert_eq!(e.errno(), 19);
        let e = Error::NoSuchDevice {
            name: "X".into(),
            found: vec![],
        };
        assert_eq!(e.to_string(), "no RDMA device named 'X' (found: none)");
    }

    #[test]
    fn load_and_verbs_errors_display_as_their_source() {
        let e = Error::from(LoadError::NotFound {
            soname: "librdmacm.so.1".into(),
            detail: "dlopen".into(),
        });
        assert_eq!(e.to_string(), "rdma-core (librdmacm.so.1) not found");
        assert_eq!(e.errno(), 79);
        let e = Error::from(VerbsError::Os {
            call: "rdma_listen",
            errno: 98,
        });
        assert_eq!(e.to_string(), "rdma_listen failed with errno 98");
        assert_eq!(e.errno(), 98);
    }
}
