//! The device under the connection managers (siw_cm.c's role).

pub mod iwcm;
pub mod rdmacm;
