//! The run-time loader: `libibverbs.so.1` and `librdmacm.so.1` opened with
//! `dlopen` (libloading), every symbol this crate calls resolved once.

use super::types::*;
use core::ffi::{c_char, c_int, c_void};
use libloading::Library;
use std::fmt;

/// The soname of libibverbs (rdma-core's verbs library, ABI 1).
pub const IBVERBS_SONAME: &str = "libibverbs.so.1";
/// The soname of librdmacm (rdma-core's connection manager library, ABI 1).
pub const RDMACM_SONAME: &str = "librdmacm.so.1";

/// Why rdma-core could not be loaded. `Display` is one line, meant for the
/// user as is (tools print it and exit with status 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// The library could not be opened (not installed, or not on the loader's
    /// path). Display: `rdma-core (<soname>) not found`.
    NotFound {
        /// The soname asked for, e.g. `libibverbs.so.1`.
        soname: String,
        /// The dynamic loader's message (`dlerror()`), for logs.
        detail: String,
    },
    /// The library opened but lacks a symbol this crate needs (an rdma-core
    /// older than the one it was written for). Display:
    /// `rdma-core (<soname>) lacks <symbol>`.
    MissingSymbol {
        /// The library's soname.
        soname: String,
        /// The missing symbol.
        symbol: &'static str,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotFound { soname, .. } => write!(f, "rdma-core ({soname}) not found"),
            LoadError::MissingSymbol { soname, symbol } => {
                write!(f, "rdma-core ({soname}) lacks {symbol}")
            }
        }
    }
}

impl std::error::Error for LoadError {}

/// Declares the symbol table: one `Option`-free fn pointer per symbol, filled
/// by `resolve`, which fails on the first missing symbol.
macro_rules! symbols {
    ($table:ident { $( $name:ident : fn( $($arg:ty),* ) -> $ret:ty ; )* }) => {
        /// Function pointers resolved from one library.
        #[allow(non_snake_case)]
        #[derive(Clone, Copy)]
        pub(crate) struct $table {
            $( pub(crate) $name: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        impl $table {
            /// Resolves every symbol of the table in `lib`.
            fn resolve(lib: &Library, soname: &str) -> Result<$table, LoadError> {
                Ok($table {
                    $( $name: {
                        // SAFETY: the type is the C prototype of the symbol in
                        // rdma-core 44's headers (see the module contract); the
                        // pointer is copied out and only used while `lib` is
                        // kept open by `RdmaCore`.
                        let sym = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                        };
                        match sym {
                            Ok(s) => *s,
                            Err(_) => {
                                return Err(LoadError::MissingSymbol {
                                    soname: soname.to_string(),
                                    symbol: stringify!($name),
                                })
                            }
                        }
                    }, )*
                })
            }
        }
    };
}

symbols!(Ibverbs {
    ibv_get_device_list: fn(*mut c_int) -> *mut *mut IbvDevice;
    ibv_free_device_list: fn(*mut *mut IbvDevice) -> ();
    ibv_open_device: fn(*mut IbvDevice) -> *mut IbvContext;
    ibv_close_device: fn(*mut IbvContext) -> c_int;
    ibv_query_device: fn(*mut IbvContext, *mut IbvDeviceAttr) -> c_int;
    ibv_query_port: fn(*mut IbvContext, u8, *mut IbvPortAttr) -> c_int;
    ibv_get_async_event: fn(*mut IbvContext, *mut IbvAsyncEvent) -> c_int;
    ibv_ack_async_event: fn(*mut IbvAsyncEvent) -> ();
    ibv_alloc_pd: fn(*mut IbvContext) -> *mut IbvPd;
    ibv_dealloc_pd: fn(*mut IbvPd) -> c_int;
    ibv_reg_mr: fn(*mut IbvPd, *mut c_void, usize, c_int) -> *mut IbvMr;
    ibv_dereg_mr: fn(*mut IbvMr) -> c_int;
    ibv_create_comp_channel: fn(*mut IbvContext) -> *mut IbvCompChannel;
    ibv_destroy_comp_channel: fn(*mut IbvCompChannel) -> c_int;
    ibv_create_cq: fn(*mut IbvContext, c_int, *mut c_void, *mut IbvCompChannel, c_int) -> *mut IbvCq;
    ibv_destroy_cq: fn(*mut IbvCq) -> c_int;
    ibv_get_cq_event: fn(*mut IbvCompChannel, *mut *mut IbvCq, *mut *mut c_void) -> c_int;
    ibv_ack_cq_events: fn(*mut IbvCq, u32) -> ();
});

symbols!(Rdmacm {
    rdma_create_event_channel: fn() -> *mut RdmaEventChannel;
    rdma_destroy_event_channel: fn(*mut RdmaEventChannel) -> ();
    rdma_create_id: fn(*mut RdmaEventChannel, *mut *mut RdmaCmId, *mut c_void, c_int) -> c_int;
    rdma_destroy_id: fn(*mut RdmaCmId) -> c_int;
    rdma_bind_addr: fn(*mut RdmaCmId, *mut libc::sockaddr) -> c_int;
    rdma_resolve_addr: fn(*mut RdmaCmId, *mut libc::sockaddr, *mut libc::sockaddr, c_int) -> c_int;
    rdma_resolve_route: fn(*mut RdmaCmId, c_int) -> c_int;
    rdma_listen: fn(*mut RdmaCmId, c_int) -> c_int;
    rdma_connect: fn(*mut RdmaCmId, *mut RdmaConnParam) -> c_int;
    rdma_accept: fn(*mut RdmaCmId, *mut RdmaConnParam) -> c_int;
    rdma_reject: fn(*mut RdmaCmId, *const c_void, u8) -> c_int;
    rdma_disconnect: fn(*mut RdmaCmId) -> c_int;
    rdma_get_cm_event: fn(*mut RdmaEventChannel, *mut *mut RdmaCmEvent) -> c_int;
    rdma_ack_cm_event: fn(*mut RdmaCmEvent) -> c_int;
    rdma_create_qp: fn(*mut RdmaCmId, *mut IbvPd, *mut IbvQpInitAttr) -> c_int;
    rdma_destroy_qp: fn(*mut RdmaCmId) -> ();
    rdma_get_devices: fn(*mut c_int) -> *mut *mut IbvContext;
    rdma_free_devices: fn(*mut *mut IbvContext) -> ();
});

/// rdma-core, loaded: both libraries open and every symbol resolved.
///
/// Loaded once per process is enough (`dlopen` refcounts); the libraries stay
/// open while any `RdmaCore` (or an object made through it, which holds an
/// `Arc<RdmaCore>`) lives.
pub struct RdmaCore {
    pub(crate) ibv: Ibverbs,
    pub(crate) cm: Rdmacm,
    // Declared last: dropped (dlclose) after nothing can call through the
    // tables any more.
    _ibverbs_lib: Library,
    _rdmacm_lib: Library,
}

impl fmt::Debug for RdmaCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RdmaCore")
    }
}

impl RdmaCore {
    /// Opens `libibverbs.so.1` and `librdmacm.so.1` and resolves every symbol
    /// this crate uses.
    ///
    /// # Errors
    ///
    /// [`LoadError::NotFound`] (Display `rdma-core (libibverbs.so.1) not
    /// found`, or the same with `librdmacm.so.1`) when a library is absent,
    /// [`LoadError::MissingSymbol`] when it is too old. Never panics.
    pub fn load() -> Result<RdmaCore, LoadError> {
        RdmaCore::load_from(IBVERBS_SONAME, RDMACM_SONAME)
    }

    /// [`RdmaCore::load`] with other library names (tests: a bogus soname).
    pub(crate) fn load_from(ibverbs: &str, rdmacm: &str) -> Result<RdmaCore, LoadError> {
        let ibverbs_lib = open(ibverbs)?;
        let ibv = Ibverbs::resolve(&ibverbs_lib, ibverbs)?;
        let rdmacm_lib = open(rdmacm)?;
        let cm = Rdmacm::resolve(&rdmacm_lib, rdmacm)?;
        Ok(RdmaCore {
            ibv,
            cm,
            _ibverbs_lib: ibverbs_lib,
            _rdmacm_lib: rdmacm_lib,
        })
    }
}

/// `dlopen(soname, RTLD_NOW | RTLD_LOCAL)`, as a [`LoadError::NotFound`] on failure.
fn open(soname: &str) -> Result<Library, LoadError> {
    // SAFETY: opening runs the library's ELF constructors. libibverbs' and
    // librdmacm's constructors only initialise their own state (rdma-core
    // 44: `ibverbs_init` is lazy, librdmacm's `ucma_init` runs on first use);
    // a library of that soname that is not rdma-core is outside the contract.
    match unsafe { Library::new(soname) } {
        Ok(lib) => Ok(lib),
        Err(e) => {
            tracing::debug!(soname, error = %e, "dlopen failed");
            Err(LoadError::NotFound {
                soname: soname.to_string(),
                detail: e.to_string(),
            })
        }
    }
}

/// Reads a fixed-size C string field (NUL-terminated, or the whole array).
pub(crate) fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_a_one_line_error_not_a_panic() {
        let e = RdmaCore::load_from("libibverbs-bogus.so.9", RDMACM_SONAME).unwrap_err();
        assert!(matches!(e, LoadError::NotFound { .. }));
        assert_eq!(e.to_string(), "rdma-core (libibverbs-bogus.so.9) not found");
        let e = RdmaCore::load_from(IBVERBS_SONAME, "librdmacm-bogus.so.9");
        // On a machine without libibverbs the first library fails first.
        let e = e.unwrap_err().to_string();
        assert!(
            e == "rdma-core (librdmacm-bogus.so.9) not found"
                || e == "rdma-core (libibverbs.so.1) not found",
            "{e}"
        );
    }

    #[test]
    fn not_found_display_names_the_real_sonames() {
        let e = LoadError::NotFound {
            soname: IBVERBS_SONAME.into(),
            detail: "x".into(),
        };
        assert_eq!(e.to_string(), "rdma-core (libibverbs.so.1) not found");
        let e = LoadError::NotFound {
            soname: RDMACM_SONAME.into(),
            detail: String::new(),
        };
        assert_eq!(e.to_string(), "rdma-core (librdmacm.so.1) not found");
        let e = LoadError::MissingSymbol {
            soname: IBVERBS_SONAME.into(),
            symbol: "ibv_reg_mr",
        };
        assert_eq!(
            e.to_string(),
            "rdma-core (libibverbs.so.1) lacks ibv_reg_mr"
        );
    }

    #[test]
    fn a_library_without_the_symbols_is_missing_symbol() {
        // libc opens but has no ibv_get_device_list.
        let e = RdmaCore::load_from("libc.so.6", RDMACM_SONAME).unwrap_err();
        assert_eq!(
            e,
            LoadError::MissingSymbol {
                soname: "libc.so.6".into(),
                symbol: "ibv_get_device_list"
            }
        );
    }

    #[test]
    fn c_string_fields() {
        let mut a = [0 as c_char; 8];
        for (i, b) in b"siw0".iter().enumerate() {
            a[i] = *b as c_char;
        }
        assert_eq!(c_chars_to_string(&a), "siw0");
        let full = [b'x' as c_char; 4];
        assert_eq!(c_chars_to_string(&full), "xxxx");
    }
}
