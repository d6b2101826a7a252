//! iwdump. Being written.
