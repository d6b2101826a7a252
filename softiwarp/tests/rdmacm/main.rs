//! The soft device under the RDMA CM (`softiwarp::cm::rdmacm`, siw_cm.c's role), on
//! memory links (no root): one connected pair at a time ([`pair`]), many clients and
//! servers with removals at random moments ([`stress`]), calls and removals at awkward
//! moments ([`adversarial`]), and the order of device removal ([`removal_order`]).

#![allow(dead_code)] // the shared support modules serve several binaries

// rdma-cm's own test support (the per-id callback checker, the removal tally), shared
// with rdma-cm/tests/stress.rs; its fake provider (`iw_cm::testing`) is unused here.
#[path = "../../../rdma-cm/tests/support/mod.rs"]
mod cm_support;
mod support;

mod adversarial;
mod host;
mod pair;
mod removal_order;
mod stress;
