//! The public surface: the device (open, listen, connect, ULPDUs, close) and the verbs
//! objects, re-exported at the crate root.

pub(crate) mod device;
pub(crate) mod verbs_objects;
