//! DDP (RFC 5041) and RDMAP (RFC 5040, RFC 7306). Being written.
