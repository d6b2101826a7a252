//! libsoftiwarp: the libibverbs and librdmacm C ABI of rdma-core 44 (Debian 12) over
//! the soft iWARP device, so unmodified RDMA programs (rping, perftest, ibv_devinfo)
//! run with no root and no kernel module. With no configuration the process has one
//! device per host interface that is up with an IPv4 address, named `siw_<ifname>`
//! (`siw_lo`, `siw_eth0`: [`device`]), on the host's kernel TCP, so programs meet on
//! the host's own addresses:
//!
//! ```text
//! LD_PRELOAD=/path/to/libsoftiwarp.so rping -s -a 0.0.0.0 -v &
//! LD_PRELOAD=/path/to/libsoftiwarp.so rping -c -a 127.0.0.1 -v -C 10
//! ```
//!
//! `SOFTIWARP_DEVICE` gives the process one device of its own instead
//! (`softiwarp::spec`: `netdev=eth0`, or a UDP link or a TAP with an address of its
//! own):
//!
//! ```text
//! SOFTIWARP_DEVICE=link=udp:127.0.0.1:7000,peer=127.0.0.1:7001,ip=10.9.0.1/24 \
//!     LD_PRELOAD=/path/to/libsoftiwarp.so rping -s -a 10.9.0.1 -v
//! ```
//!
//! or with `libibverbs.so.1` and `librdmacm.so.1` symlinked to `libsoftiwarp.so` in a
//! directory on `LD_LIBRARY_PATH`. See README.md for what is implemented.
//!
//! | module | what |
//! |---|---|
//! | [`boundary`] | the raw-pointer steps and their contract, `catch_unwind`, `errno`, cancellation off |
//! | [`blocking`] | the three blocking calls: waiting in C's `read(2)` (signals, `pthread_cancel`) |
//! | [`abi`] | C layouts beyond `cxgb4::ffi::types`, enum values |
//! | [`handles`] | the live handles (validated before use) and the graveyard of destroyed ones |
//! | [`objects`] | the Rust objects behind the C pointers |
//! | [`ops`] | the context's ops table: the data path rdma-core's header inlines call (post, poll, arm a CQ, post to an SRQ) |
//! | [`events`] | asynchronous events: the open contexts, the map from soft objects to ours, the thread per device that delivers to them |
//! | [`device`] | the process's soft devices (one per host interface, or `SOFTIWARP_DEVICE`'s), the one RDMA CM over them |
//! | [`ibv`] | libibverbs entry points on an open context |
//! | [`ex`] | the extended verbs: the `verbs_context` operations, `ibv_create_cq_ex` / `ibv_create_qp_ex` and their poll and `ibv_wr_*` APIs |
//! | [`context`] | making a context (its ops, `verbs_context` head, async events), the devices opened on first use, the device list, `ibv_open_device` / `ibv_close_device` |
//! | [`cm`] | librdmacm entry points |
//! | [`ep`] | librdmacm's synchronous endpoint API, `rdma_migrate_id`, and the calls for QPs made outside the CM (`rdma_init_qp_attr`, `rdma_establish`) |
//! | [`stubs`] | entry points not implemented: one warning, the man page's error |
//!
//! Every exported function is `sw_<name>` aliased to `<name>@@<rdma-core version>` by
//! `.symver` (the version nodes come from `libsoftiwarp.map`, see build.rs).

pub mod abi;
pub mod blocking;
pub mod boundary;
pub mod cm;
pub mod context;
pub mod device;
pub mod ep;
pub mod events;
pub mod ex;
pub mod handles;
pub mod ibv;
pub mod maps;
pub mod objects;
pub mod ops;
pub mod stubs;
