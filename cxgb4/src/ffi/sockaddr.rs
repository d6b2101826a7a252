//! `std::net::SocketAddr` <-> `struct sockaddr_storage` (`AF_INET` /
//! `AF_INET6`, ports and addresses in network byte order), as librdmacm takes
//! and returns addresses.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A `sockaddr_storage` holding `addr`, zero-filled past the family's struct.
pub fn to_storage(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero bytes are a valid sockaddr_storage (plain integers).
    let mut storage: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and as aligned as
            // sockaddr_in (the C standard's guarantee, checked by the layout
            // test's sizes); the write stays inside `storage`.
            unsafe { core::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6 (28 bytes, 4-aligned).
            unsafe { core::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    storage
}

/// The address in `storage`; `None` for a family other than `AF_INET` /
/// `AF_INET6` (for example `AF_UNSPEC`: not bound yet).
pub fn from_storage(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which
            // fits inside it and needs no more alignment than it has.
            let sin: libc::sockaddr_in =
                unsafe { core::ptr::read((storage as *const libc::sockaddr_storage).cast()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6: libc::sockaddr_in6 =
                unsafe { core::ptr::read((storage as *const libc::sockaddr_storage).cast()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_round_trip_and_wire_order() {
        let a: SocketAddr = "192.168.7.2:7471".parse().unwrap();
        let s = to_storage(a);
        assert_eq!(s.ss_family as i32, libc::AF_INET);
        assert_eq!(from_storage(&s), Some(a));
        // The bytes as the kernel reads them: family (host order), port
        // 7471 = 0x1d2f big-endian, then 192.168.7.2.
        // SAFETY (test): reading the storage's first 8 bytes.
        let bytes: [u8; 8] =
            unsafe { core::ptr::read((&s as *const libc::sockaddr_storage).cast()) };
        assert_eq!(&bytes[2..], &[0x1d, 0x2f, 192, 168, 7, 2]);
    }

    #[test]
    fn ipv6_round_trip() {
        let a: SocketAddr = "[fe80::1%3]:4791".parse().unwrap();
        let s = to_storage(a);
        assert_eq!(s.ss_family as i32, libc::AF_INET6);
        assert_eq!(from_storage(&s), Some(a));
    }

    #[test]
    fn unspecified_family_is_none() {
        // SAFETY (test): all-zero sockaddr_storage (AF_UNSPEC).
        let s: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
        assert_eq!(from_storage(&s), None);
    }
}
