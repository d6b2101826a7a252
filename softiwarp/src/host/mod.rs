//! The host-TCP transport (design.md section 4.1): a soft device bound to a host network
//! interface, each connection a kernel TCP socket, as Linux siw rides the kernel's TCP
//! (`rdma link add NAME type siw netdev IF`).
//!
//! **Room.** Beside [`crate::transport`] (the smoltcp transport), below the engine. The
//! MPA connection, its upper ([`Ulp`](crate::transport::Ulp)), the listeners' bounds and
//! the [`LlpStack`](crate::transport::llp::LlpStack) seam the engine drives are
//! `transport`'s, shared, not copied; this room adds what differs: the kernel socket
//! under a connection ([`socket`]), the stack of kernel sockets with its epoll set
//! ([`HostStack`]), the interface's facts followed through rtnetlink ([`netdev`]), and
//! the one ioctl nix does not wrap (`sys`).
//!
//! Open a device on one with [`LinkConfig::netdev`](crate::LinkConfig::netdev).

pub mod netdev;
pub mod netns;
pub(crate) mod socket;
mod stack;
mod sys;

pub use stack::{HostInfo, HostStack, SharedAddrs};
