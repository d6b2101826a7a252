//! What the two iwperf peers tell each other: the test parameters in the MPA Request's
//! private data (client -> server), the server's memory region in the MPA Reply's private
//! data (server -> client), and small control messages as inline Sends during the run
//! (credits, end of run, verification result).
//!
//! All three are fixed little-endian layouts behind a 4-byte magic and a version byte;
//! a peer that sends anything else is refused with [`WireError`] (never a panic). The
//! private data fits comfortably in the 508 bytes an MPA rev 2 Request/Reply carries
//! (RFC 6581: 512 less the IRD/ORD word).

/// The operation one QP runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// RDMA Write (RFC 5040 4.3) into the server's memory region.
    Write,
    /// RDMA Read (RFC 5040 4.4) of the server's memory region.
    Read,
    /// Send (RFC 5040 4.5) into the server's posted receives.
    Send,
}

impl Op {
    /// Every operation, in the order the demo runs them.
    pub const ALL: [Op; 3] = [Op::Write, Op::Read, Op::Send];

    /// The name on the command line and in reports: `write`, `read`, `send`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
        }
    }

    /// Parses [`Op::name`].
    pub fn from_name(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.name() == s)
    }

    fn code(self) -> u8 {
        match self {
            Op::Write => 0,
            Op::Read => 1,
            Op::Send => 2,
        }
    }

    fn from_code(c: u8) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.code() == c)
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Bandwidth (stream of WRs) or latency (ping-pong) test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// As many WRs in flight as `tx_depth` allows; perftest's `*_bw`.
    Bandwidth,
    /// One message at a time, each answered; perftest's `*_lat`.
    Latency,
}

/// A peer's message could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than the layout.
    #[error("{what}: {got} bytes, expected at least {want}")]
    Short {
        /// Which message.
        what: &'static str,
        /// Bytes received.
        got: usize,
        /// Bytes the layout needs.
        want: usize,
    },
    /// The magic or version is not ours (another program, or another iwperf version).
    #[error("{what}: not an iwperf message (magic {magic:#010x}, version {version})")]
    NotOurs {
        /// Which message.
        what: &'static str,
        /// The magic found.
        magic: u32,
        /// The version found.
        version: u8,
    },
    /// A field is out of range.
    #[error("{what}: bad field {field} = {value}")]
    BadField {
        /// Which message.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
}

const PARAMS_MAGIC: u32 = 0x4957_5046; // "IWPF"
const ACCEPT_MAGIC: u32 = 0x4957_5041; // "IWPA"
const CTRL_MAGIC: u32 = 0x4957_5043; // "IWPC"
const VERSION: u8 = 1;

/// A memory region as the peer addresses it: iova (the Tagged Offset of byte 0), STag
/// (rkey) and length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MrInfo {
    /// Tagged Offset of the first byte.
    pub iova: u64,
    /// The STag the peer names it by (`rkey`).
    pub rkey: u32,
    /// Length in bytes.
    pub len: u64,
}

/// The test parameters of one connection (client -> server, MPA Request private data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestParams {
    /// This connection's operation.
    pub op: Op,
    /// Bandwidth or latency.
    pub mode: Mode,
    /// Check the data at the receiver.
    pub verify: bool,
    /// Message size in bytes.
    pub size: u32,
    /// Connections the client opens in all (the server waits for this many).
    pub qps: u16,
    /// This connection's index, 0..qps.
    pub index: u16,
    /// Send-queue depth of the client (WRs in flight per QP); also the slot count of
    /// both sides' data buffers when verifying.
    pub tx_depth: u16,
    /// The client's data buffer (the server writes into it in Write latency tests).
    pub client_mr: MrInfo,
    /// The client's RDMA Read depth: the ORD and IRD it asks for in the CM's
    /// `ConnParam`, repeated here for a server whose CM reports none (MPA rev 1 carries
    /// no IRD/ORD; ARCHITECTURE.md, "MPA rev 1: no IRD/ORD"). 0: not given (an iwperf
    /// from before this field, which sent 0 in these reserved octets).
    pub rd_depth: u16,
}

/// Length in bytes of an encoded [`TestParams`].
pub const PARAMS_LEN: usize = 40;

/// Largest RDMA Read depth asked for (ORD/IRD), as perftest's default: the most a
/// client puts in [`TestParams::rd_depth`] and in its `ConnParam`.
pub const MAX_RD_ATOMIC: u16 = 16;

fn put_mr(out: &mut Vec<u8>, mr: &MrInfo) {
    out.extend_from_slice(&mr.iova.to_le_bytes());
    out.extend_from_slice(&mr.rkey.to_le_bytes());
    out.extend_from_slice(&mr.len.to_le_bytes());
}

/// A little-endian reader over a checked-length slice.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(&self.b[self.at..self.at + N]);
        self.at += N;
        a
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn mr(&mut self) -> MrInfo {
        MrInfo {
            iova: self.u64(),
            rkey: self.u32(),
            len: self.u64(),
        }
    }
}

/// Checks length, magic and version; returns a reader past them.
fn open<'a>(
    b: &'a [u8],
    what: &'static str,
    magic: u32,
    len: usize,
) -> Result<Reader<'a>, WireError> {
    if b.len() < len {
        return Err(WireError::Short {
            what,
            got: b.len(),
            want: len,
        });
    }
    let mut r = Reader { b, at: 0 };
    let (m, v) = (r.u32(), r.u8());
    if m != magic || v != VERSION {
        return Err(WireError::NotOurs {
            what,
            magic: m,
            version: v,
        });
    }
    Ok(r)
}

impl TestParams {
    /// The [`PARAMS_LEN`]-byte encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(PARAMS_LEN);
        out.extend_from_slice(&PARAMS_MAGIC.to_le_bytes());
        out.push(VERSION);
        out.push(self.op.code());
        out.push(match self.mode {
            Mode::Bandwidth => 0,
            Mode::Latency => 1,
        });
        out.push(u8::from(self.verify));
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.qps.to_le_bytes());
        out.extend_from_slice(&self.index.to_le_bytes());
        out.extend_from_slice(&self.tx_depth.to_le_bytes());
        out.extend_from_slice(&self.rd_depth.to_le_bytes());
        put_mr(&mut out, &self.client_mr);
        debug_assert_eq!(out.len(), PARAMS_LEN);
        out
    }

    /// Decodes [`TestParams::encode`]'s bytes (trailing bytes ignored).
    ///
    /// Errors: [`WireError`] for a short or foreign message, an unknown op or mode, a
    /// zero size, QP count or depth, or an index not below the QP count.
    pub fn decode(b: &[u8]) -> Result<TestParams, WireError> {
        const WHAT: &str = "test parameters";
        let mut r = open(b, WHAT, PARAMS_MAGIC, PARAMS_LEN)?;
        let bad = |field, value: u64| WireError::BadField {
            what: WHAT,
            field,
            value,
        };
        let op = r.u8();
        let op = Op::from_code(op).ok_or(bad("op", op.into()))?;
        let mode = match r.u8() {
            0 => Mode::Bandwidth,
            1 => Mode::Latency,
            m => return Err(bad("mode", m.into())),
        };
        let verify = r.u8() != 0;
        let size = r.u32();
        let qps = r.u16();
        let index = r.u16();
        let tx_depth = r.u16();
        let rd_depth = r.u16();
        let client_mr = r.mr();
        if size == 0 {
            return Err(bad("size", 0));
        }
        if qps == 0 || index >= qps {
            return Err(bad("index", index.into()));
        }
        if tx_depth == 0 {
            return Err(bad("tx_depth", 0));
        }
        Ok(TestParams {
            op,
            mode,
            verify,
            size,
            qps,
            index,
            tx_depth,
            client_mr,
            rd_depth,
        })
    }
}

/// The server's answer (MPA Reply private data): its data buffer for this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AcceptInfo {
    /// The server's data buffer (target of Writes, source of Reads).
    pub mr: MrInfo,
    /// Number of message slots in it.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_len: u32,
    /// Send tests: receive WRs the server posted before accepting (the client's first
    /// credits).
    pub credits: u32,
    /// The server's IRD as accepted (its `ConnParam::responder_resources`), repeated
    /// for a client whose CM reports none (MPA rev 1): the client's ORD stays within it.
    /// 0: not given (an older iwperf).
    pub ird: u16,
}

/// Length in bytes of an encoded [`AcceptInfo`].
pub const ACCEPT_LEN: usize = 40;

impl AcceptInfo {
    /// The [`ACCEPT_LEN`]-byte encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ACCEPT_LEN);
        out.extend_from_slice(&ACCEPT_MAGIC.to_le_bytes());
        out.push(VERSION);
        out.extend_from_slice(&self.ird.to_le_bytes());
        out.push(0);
        put_mr(&mut out, &self.mr);
        out.extend_from_slice(&self.slots.to_le_bytes());
        out.extend_from_slice(&self.slot_len.to_le_bytes());
        out.extend_from_slice(&self.credits.to_le_bytes());
        debug_assert_eq!(out.len(), ACCEPT_LEN);
        out
    }

    /// Decodes [`AcceptInfo::encode`]'s bytes.
    ///
    /// Errors: [`WireError`] for a short or foreign message or zero slots.
    pub fn decode(b: &[u8]) -> Result<AcceptInfo, WireError> {
        const WHAT: &str = "accept info";
        let mut r = open(b, WHAT, ACCEPT_MAGIC, ACCEPT_LEN)?;
        let ird = r.u16();
        let _pad = r.u8();
        let mr = r.mr();
        let slots = r.u32();
        let slot_len = r.u32();
        let credits = r.u32();
        if slots == 0 {
            return Err(WireError::BadField {
                what: WHAT,
                field: "slots",
                value: 0,
            });
        }
        Ok(AcceptInfo {
            mr,
            slots,
            slot_len,
            credits,
            ird,
        })
    }
}

/// The verification outcome the receiver of the data reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VerifyStatus {
    /// Not asked for.
    Off,
    /// Every checked byte matched.
    Passed,
    /// Mismatches were found.
    Failed,
}

/// A control message (an inline Send between the peers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ctrl {
    /// Send tests, server -> client: this many more receive WRs are posted.
    Credit(u32),
    /// Client -> server: the client's last data WR completed; it posted `wrs` data WRs
    /// of `bytes` bytes in all on this connection.
    Done {
        /// Data WRs posted on this connection.
        wrs: u64,
        /// Payload bytes of those WRs.
        bytes: u64,
    },
    /// Server -> client, after `Done`: what the server's checks found.
    DoneAck {
        /// The outcome.
        verify: VerifyStatus,
        /// Messages (or slots) that did not match.
        mismatches: u64,
        /// Messages the server received (Send tests) or checked.
        checked: u64,
    },
}

/// Length in bytes of an encoded [`Ctrl`] (before [`Ctrl::encode_distinct`] padding).
pub const CTRL_LEN: usize = 32;

impl Ctrl {
    /// The [`CTRL_LEN`]-byte encoding.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, a, b, c) = match *self {
            Ctrl::Credit(n) => (1u8, u64::from(n), 0, 0),
            Ctrl::Done { wrs, bytes } => (2, wrs, bytes, 0),
            Ctrl::DoneAck {
                verify,
                mismatches,
                checked,
            } => (
                3,
                match verify {
                    VerifyStatus::Off => 0,
                    VerifyStatus::Passed => 1,
                    VerifyStatus::Failed => 2,
                },
                mismatches,
                checked,
            ),
        };
        let mut out = Vec::with_capacity(CTRL_LEN + 1);
        out.extend_from_slice(&CTRL_MAGIC.to_le_bytes());
        out.push(VERSION);
        out.push(kind);
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
        out.extend_from_slice(&c.to_le_bytes());
        out
    }

    /// The encoding, one byte longer when `data_size` equals [`CTRL_LEN`]: in Send tests
    /// control and data messages share the receive queue and the receiver tells them
    /// apart by length (a data message is exactly `data_size` bytes).
    pub fn encode_distinct(&self, data_size: usize) -> Vec<u8> {
        let mut v = self.encode();
        if data_size == v.len() {
            v.push(0);
        }
        v
    }

    /// Decodes [`Ctrl::encode`]'s bytes (trailing bytes ignored).
    ///
    /// Errors: [`WireError`] for a short or foreign message or an unknown kind.
    pub fn decode(b: &[u8]) -> Result<Ctrl, WireError> {
        const WHAT: &str = "control message";
        let mut r = open(b, WHAT, CTRL_MAGIC, CTRL_LEN)?;
        let kind = r.u8();
        let _pad: [u8; 2] = r.take();
        let (a, b, c) = (r.u64(), r.u64(), r.u64());
        let bad = |field, value| WireError::BadField {
            what: WHAT,
            field,
            value,
        };
        match kind {
            1 => Ok(Ctrl::Credit(
                u32::try_from(a).map_err(|_| bad("credit", a))?,
            )),
            2 => Ok(Ctrl::Done { wrs: a, bytes: b }),
            3 => Ok(Ctrl::DoneAck {
                verify: match a {
                    0 => VerifyStatus::Off,
                    1 => VerifyStatus::Passed,
                    2 => VerifyStatus::Failed,
                    v => return Err(bad("verify", v)),
                },
                mismatches: b,
                checked: c,
            }),
            k => Err(bad("kind", k.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> TestParams {
        TestParams {
            op: Op::Read,
            mode: Mode::Latency,
            verify: true,
            size: 65536,
            qps: 8,
            index: 7,
            tx_depth: 128,
            client_mr: MrInfo {
                iova: 0x1234_5678_9abc,
                rkey: 0x0102_0304,
                len: 8 << 20,
            },
            rd_depth: 16,
        }
    }

    #[test]
    fn params_round_trip_and_golden_bytes() {
        let p = params();
        let b = p.encode();
        assert_eq!(b.len(), PARAMS_LEN);
        assert_eq!(&b[..9], &[0x46, 0x50, 0x57, 0x49, 1, 1, 1, 1, 0x00]);
        assert_eq!(&b[9..12], &[0x00, 0x01, 0x00]); // size 65536 LE
        assert_eq!(&b[16..20], &[128, 0, 16, 0]); // tx_depth, then rd_depth
        assert_eq!(TestParams::decode(&b), Ok(p));
        // Trailing bytes are ignored.
        let mut longer = b.clone();
        longer.extend_from_slice(&[9; 20]);
        assert_eq!(TestParams::decode(&longer), Ok(p));
    }

    #[test]
    fn bad_params_are_typed_errors() {
        let b = params().encode();
        assert!(matches!(
            TestParams::decode(&b[..10]),
            Err(WireError::Short { got: 10, .. })
        ));
        let mut x = b.clone();
        x[0] ^= 1;
        assert!(matches!(
            TestParams::decode(&x),
            Err(WireError::NotOurs { .. })
        ));
        let mut x = b.clone();
        x[5] = 9;
        assert!(matches!(
            TestParams::decode(&x),
            Err(WireError::BadField { field: "op", .. })
        ));
        let mut p = params();
        p.index = 8;
        assert!(matches!(
            TestParams::decode(&p.encode()),
            Err(WireError::BadField { field: "index", .. })
        ));
        assert!(TestParams::decode(&[]).is_err());
    }

    #[test]
    fn accept_and_ctrl_round_trip() {
        let a = AcceptInfo {
            mr: MrInfo {
                iova: 1 << 40,
                rkey: 0xabcdef01,
                len: 4096,
            },
            slots: 16,
            slot_len: 256,
            credits: 512,
            ird: 12,
        };
        let b = a.encode();
        assert_eq!(b.len(), ACCEPT_LEN);
        // The IRD in the octets after the version, little-endian.
        assert_eq!(&b[4..8], &[1, 12, 0, 0]);
        assert_eq!(AcceptInfo::decode(&b), Ok(a));
        let mut zero = a;
        zero.slots = 0;
        assert!(AcceptInfo::decode(&zero.encode()).is_err());
        for c in [
            Ctrl::Credit(77),
            Ctrl::Done {
                wrs: 5000,
                bytes: 5000 * 65536,
            },
            Ctrl::DoneAck {
                verify: VerifyStatus::Failed,
                mismatches: 3,
                checked: 99,
            },
        ] {
            let e = c.encode();
            assert_eq!(e.len(), CTRL_LEN);
            assert_eq!(Ctrl::decode(&e), Ok(c));
            assert_eq!(c.encode_distinct(CTRL_LEN).len(), CTRL_LEN + 1);
            assert_eq!(c.encode_distinct(8).len(), CTRL_LEN);
            assert_eq!(Ctrl::decode(&c.encode_distinct(CTRL_LEN)), Ok(c));
        }
        let mut e = Ctrl::Credit(1).encode();
        e[5] = 42;
        assert!(Ctrl::decode(&e).is_err());
    }

    #[test]
    fn op_names() {
        for op in Op::ALL {
            assert_eq!(Op::from_name(op.name()), Some(op));
        }
        assert_eq!(Op::from_name("atomic"), None);
    }
}
