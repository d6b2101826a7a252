//! The iWARP CM over soft devices (`softiwarp::cm::iwcm::SoftProvider`): interop shapes and
//! a seeded connect/accept/destroy stress.

#[path = "../iwcm_support/mod.rs"]
mod iwcm_support;

mod interop;
mod stress;
