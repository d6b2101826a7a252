//! Links libsoftiwarp.so with rdma-core's version nodes (libsoftiwarp.map), so the
//! `.symver` aliases of the entry points (`ibv_reg_mr@@IBVERBS_1.1`, ...) have their
//! nodes and a program linked against Debian's libibverbs / librdmacm finds every
//! version it needs; and builds `src/blocking.c`, the three blocking entry points
//! (`src/blocking.rs` has their contract), with the system's C compiler (`$CC`, else
//! `cc`: the linker rustc already needs), linked whole into the library.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    println!("cargo:rerun-if-changed=libsoftiwarp.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/libsoftiwarp.map");

    println!("cargo:rerun-if-changed=src/blocking.c");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let obj = out.join("blocking.o");
    // -fexceptions: the frames get the unwind tables and cleanup handlers that glibc's
    // cancellation (a forced unwind) runs through.
    run(Command::new(&cc)
        .args([
            "-c",
            "-O2",
            "-fPIC",
            "-fexceptions",
            "-Wall",
            "-Werror",
            "-o",
        ])
        .arg(&obj)
        .arg(format!("{dir}/src/blocking.c")));
    let lib = out.join("libswblocking.a");
    let _ = std::fs::remove_file(&lib);
    run(Command::new("ar").arg("crs").arg(&lib).arg(&obj));
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static:+whole-archive=swblocking");
}

/// Runs `cmd`; panics (failing the build) with its output if it fails.
fn run(cmd: &mut Command) {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}
