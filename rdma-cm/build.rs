//! Declares the `loom` cfg (RUSTFLAGS="--cfg loom" switches the sync primitives to loom's
//! and enables tests/loom_*.rs; see README.md), so rustc's check-cfg knows it.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
