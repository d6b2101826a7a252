//! The transport `Stack` (smoltcp TCP + MPA) on memory links with a virtual clock (pair,
//! negotiation, several FPDUs per round), and devices with real engine threads.

#[path = "../support/mod.rs"]
mod support;

mod batching;
mod device;
mod host;
mod listener;
mod negotiation;
mod pair;
mod udp;
