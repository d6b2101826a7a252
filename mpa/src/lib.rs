//! MPA (RFC 5044, RFC 6581). Being written.
