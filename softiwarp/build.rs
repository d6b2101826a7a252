//! Declares the `loom` cfg (RUSTFLAGS="--cfg loom" switches `src/sync.rs` to loom's
//! primitives and enables tests/loom_progress.rs), so rustc's check-cfg knows it.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
