//! rping's protocol, as rdma-core's `librdmacm/examples/rping.c` speaks it: the message
//! the two sides exchange by Send, the order of the exchange, and the ping data.
//!
//! Each ping (repeated `-C` times, forever without `-C`):
//!
//! 1. The client fills its *source* buffer with the ping data ([`ping_data`]) and Sends
//!    its [`RdmaInfo`] (I/O virtual address, rkey, size).
//! 2. The server RDMA-Reads `size` bytes from there into its own buffer, then Sends a
//!    "go ahead" (an [`INFO_LEN`]-byte message whose content is ignored).
//! 3. The client Sends the [`RdmaInfo`] of its *sink* buffer.
//! 4. The server RDMA-Writes the data it read (up to and including its first NUL) into
//!    the sink, then Sends another "go ahead".
//! 5. The client compares source and sink (`-V`) and prints the sink (`-v`).
//!
//! Every Send carries exactly [`INFO_LEN`] bytes: rping rejects a receive of any other
//! length ("Received bogus data"). The client ends with `rdma_disconnect`; the server
//! treats the DISCONNECTED event as the end of a successful run (exit 0).
//!
//! The facts here (layout, order, data pattern, defaults and limits) are rping's; the
//! code is ours.

/// rping's default port (`cb->port = htobe16(7174)`).
pub const RPING_PORT: u16 = 7174;

/// rping's default ping data size in bytes (`cb->size = 64`).
pub const DEFAULT_SIZE: usize = 64;

/// Smallest `-S` rping accepts, in bytes: `sizeof("2147483647") + sizeof("rdma-ping-%d: ")`
/// (11 + 15), room for the longest prefix and its NUL.
pub const MIN_SIZE: usize = 26;

/// Largest `-S` rping accepts, in bytes (`RPING_BUFSIZE - 1`, 64 KiB - 1).
pub const MAX_SIZE: usize = 65_535;

/// Length in bytes of [`RdmaInfo`] on the wire (`struct rping_rdma_info`), and of every
/// Send rping makes.
pub const INFO_LEN: usize = 16;

/// Send queue depth rping asks for (`RPING_SQ_DEPTH`); its CQ holds twice as many.
pub const SQ_DEPTH: u32 = 16;

/// `struct rping_rdma_info`: where a buffer is, in network byte order on the wire:
/// `buf` (u64, the buffer's I/O virtual address: the TO the peer uses), `rkey` (u32),
/// `size` (u32, bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaInfo {
    /// Address of the buffer (a tagged offset for RDMA Read/Write).
    pub buf: u64,
    /// The STag the peer uses to access it.
    pub rkey: u32,
    /// Its size in bytes.
    pub size: u32,
}

/// A message that is not an [`RdmaInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("received bogus data, size {0} (an rping message has {INFO_LEN} bytes)")]
pub struct BogusMessage(pub usize);

impl RdmaInfo {
    /// The 16 bytes on the wire: `buf`, `rkey`, `size`, each big-endian.
    pub fn encode(&self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&self.buf.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    /// Parses a received message.
    ///
    /// Errors: [`BogusMessage`] unless `bytes` is exactly [`INFO_LEN`] long (rping's
    /// check on `wc->byte_len`).
    pub fn decode(bytes: &[u8]) -> Result<RdmaInfo, BogusMessage> {
        let b: &[u8; INFO_LEN] = bytes.try_into().map_err(|_| BogusMessage(bytes.len()))?;
        let (buf, rest) = b.split_at(8);
        let (rkey, size) = rest.split_at(4);
        Ok(RdmaInfo {
            buf: u64::from_be_bytes(buf.try_into().unwrap_or_default()),
            rkey: u32::from_be_bytes(rkey.try_into().unwrap_or_default()),
            size: u32::from_be_bytes(size.try_into().unwrap_or_default()),
        })
    }
}

/// First and last character of the cycling part of the ping data (`'A'` .. `'z'`).
const FIRST: u8 = b'A';
const LAST: u8 = b'z';

/// The ping data of ping number `ping` (from 0) in a buffer of `size` bytes
/// (`size >= 1`): `"rdma-ping-<ping>: "`, then characters from `'A' + ping % 58`
/// upward, wrapping from `'z'` back to `'A'`, and a NUL in the last byte
/// (rping's `rping_test_client`; the prefix is cut to `size - 1` bytes as `snprintf`
/// would).
pub fn ping_data(ping: u64, size: usize) -> Vec<u8> {
    let mut buf = vec![0u8; size];
    if size == 0 {
        return buf;
    }
    let prefix = format!("rdma-ping-{ping}: ");
    let n = prefix.len().min(size - 1);
    buf[..n].copy_from_slice(&prefix.as_bytes()[..n]);
    let span = u64::from(LAST - FIRST) + 1;
    let mut c = FIRST + (ping % span) as u8;
    for b in buf.iter_mut().skip(prefix.len()) {
        *b = c;
        c = if c >= LAST { FIRST } else { c + 1 };
    }
    buf[size - 1] = 0;
    buf
}

/// The bytes of `buf` up to its first NUL (all of it if none): what rping prints with
/// `%s` and what its server RDMA-Writes back (`strlen(rdma_buf) + 1` bytes, the NUL
/// included, when there is one).
pub fn c_string(buf: &[u8]) -> &[u8] {
    match buf.iter().position(|&b| b == 0) {
        Some(n) => &buf[..n],
        None => buf,
    }
}

/// The line rping's client prints for a ping with `-v`: `ping data: <data>`.
pub fn client_line(data: &[u8]) -> String {
    format!("ping data: {}", String::from_utf8_lossy(c_string(data)))
}

/// The line rping's server prints for a ping with `-v`: `server ping data: <data>`.
pub fn server_line(data: &[u8]) -> String {
    format!(
        "server ping data: {}",
        String::from_utf8_lossy(c_string(data))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_is_three_big_endian_fields() {
        let i = RdmaInfo {
            buf: 0x0000_5555_dead_b000,
            rkey: 0x0000_0201,
            size: 64,
        };
        let b = i.encode();
        assert_eq!(
            b,
            [
                0x00, 0x00, 0x55, 0x55, 0xde, 0xad, 0xb0, 0x00, 0x00, 0x00, 0x02, 0x01, 0x00, 0x00,
                0x00, 0x40
            ]
        );
        assert_eq!(RdmaInfo::decode(&b), Ok(i));
        assert_eq!(RdmaInfo::decode(&b[..15]), Err(BogusMessage(15)));
        assert_eq!(RdmaInfo::decode(&[0; 17]), Err(BogusMessage(17)));
    }

    /// The lines kernel rping printed in the VM (`siw-peer-vm.sh demo`, -S 64).
    #[test]
    fn ping_data_matches_what_kernel_rping_prints() {
        assert_eq!(
            client_line(&ping_data(0, 64)),
            "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
        );
        assert_eq!(
            server_line(&ping_data(9, 64)),
            "server ping data: rdma-ping-9: JKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyzA"
        );
        let d = ping_data(57, 64);
        assert_eq!(&d[14..16], b"zA", "ping 57 starts at 'z' and wraps");
        assert_eq!(ping_data(58, 64)[14], b'A', "ping 58 starts over at 'A'");
        assert_eq!(d.len(), 64);
        assert_eq!(d[63], 0);
        assert_eq!(c_string(&d).len(), 63);
    }

    #[test]
    fn ping_data_edges() {
        assert!(ping_data(0, 0).is_empty());
        assert_eq!(ping_data(0, 1), vec![0]);
        // Cut prefix, as snprintf(buf, 5, ...) would.
        assert_eq!(ping_data(3, 5), b"rdma\0".to_vec());
        // The minimum size holds the longest prefix.
        let d = ping_data(2_147_483_647, MIN_SIZE);
        // 2147483647 % 58 = 7: the cycle starts at 'H'.
        assert_eq!(c_string(&d), b"rdma-ping-2147483647: HIJ");
        let big = ping_data(1, MAX_SIZE);
        assert_eq!(big.len(), MAX_SIZE);
        assert_eq!(c_string(&big).len(), MAX_SIZE - 1);
        assert!(big[..MAX_SIZE - 1]
            .iter()
            .all(|&b| (b' '..=b'z').contains(&b)));
    }
}
