//! Root-only: real TAPs in network namespaces (links, a smoltcp echo, and devices with
//! engine threads); each test skips when not run as root.

#[path = "../support/mod.rs"]
mod support;

mod engine;
mod host_interop;
mod netns;
