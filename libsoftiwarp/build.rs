//! Links libsoftiwarp.so with rdma-core's version nodes (libsoftiwarp.map), so the
//! `.symver` aliases of the entry points (`ibv_reg_mr@@IBVERBS_1.1`, ...) have their
//! nodes and a program linked against Debian's libibverbs / librdmacm finds every
//! version it needs.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    println!("cargo:rerun-if-changed=libsoftiwarp.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/libsoftiwarp.map");
}
