//! The public surface: the device (open, listen, connect, ULPDUs, close) and the verbs
//! objects, re-exported at the crate root.

pub mod device;
pub mod verbs_objects;
