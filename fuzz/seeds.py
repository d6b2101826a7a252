#!/usr/bin/env python3
"""Seed corpora for the fuzz targets from the kernel siw captures in ../shared/pcaps.

Without seeds, `mpa_frame` rarely gets past the 16-byte MPA key. Writes
fuzz/corpus/<target>/seed-* (ignored by git); run.sh calls it when a corpus is empty.

`rx_path` (input format in softiwarp/src/testing/rx_path.rs) gets, per siw stream, its
FPDUs after the MPA frame as raw TCP payload (mode 0; only the CRC-on streams deframe,
the harness negotiates CRC) and its ULPDUs as framed records (mode 1, bodies cut to 255
bytes, the MSN fix-up on untagged ones), the device in the role of the stream's
receiver; plus hand-built records that reach every MR (`rx_path_records`).
"""
import glob, os, struct, sys

here = os.path.dirname(os.path.abspath(__file__))
pcaps = os.path.join(here, "..", "..", "shared", "pcaps")


def streams(path):
    """Reassembled TCP payload per direction (4-tuple), in sequence order."""
    data = open(path, "rb").read()
    off, segs = 24, {}
    while off + 16 <= len(data):
        incl = struct.unpack("<I", data[off + 8:off + 12])[0]
        pkt = data[off + 16:off + 16 + incl]
        off += 16 + incl
        if len(pkt) < 34 or pkt[12:14] != b"\x08\x00" or pkt[23] != 6:
            continue
        ip = pkt[14:]
        ihl = (ip[0] & 15) * 4
        total = struct.unpack(">H", ip[2:4])[0]
        tcp = ip[ihl:total]
        sport, dport, seq = struct.unpack(">HHI", tcp[:8])
        payload = tcp[(tcp[12] >> 4) * 4:]
        if payload:
            segs.setdefault((ip[12:16], sport, ip[16:20], dport), {}).setdefault(seq, payload)
    for key, by_seq in segs.items():
        base, buf = min(by_seq), bytearray()
        for seq in sorted(by_seq):
            o = (seq - base) & 0xFFFFFFFF
            if o <= len(buf):
                buf += by_seq[seq][len(buf) - o:]
        yield key, bytes(buf)


def main():
    n = 0
    for target in ("mpa_frame", "mpa_deframer", "ddp_rdmap_ulpdu", "rx_path"):
        os.makedirs(os.path.join(here, "corpus", target), exist_ok=True)
    for path in sorted(glob.glob(os.path.join(pcaps, "*.pcap"))):
        for _, s in streams(path):
            if not s.startswith(b"MPA ID R") or len(s) < 20:
                continue
            n += 1
            frame_len = 20 + struct.unpack(">H", s[18:20])[0]
            write("mpa_frame", f"seed-{n}", b"\x07" + s[:frame_len + 64])
            crc = 1 if s[16] & 0x40 else 0
            write("mpa_deframer", f"seed-{n}", bytes([crc | 4, 0, 7]) + s[frame_len:frame_len + 3000])
            off, m = frame_len, 0
            # The device receives this stream: responder if the stream is the Request's.
            role = 0 if s.startswith(b"MPA ID Req") else 2
            records = bytearray()
            while off + 2 <= len(s) and m < 12:
                ulen = struct.unpack(">H", s[off:off + 2])[0]
                ulpdu = s[off + 2:off + 2 + ulen]
                write("ddp_rdmap_ulpdu", f"seed-{n}-{m}", ulpdu)
                body = ulpdu[:255]
                if body:
                    records += bytes([0x10 if body[0] & 0x80 == 0 else 0, len(body)]) + body
                off += 2 + ulen + (4 - (2 + ulen) % 4) % 4 + 4
                m += 1
            write("rx_path", f"seed-{n}-framed", bytes([role | 0x4 | 0xf0, n]) + records)
            if crc:
                write("rx_path", f"seed-{n}-raw", bytes([role | 0xf0, n]) + s[frame_len:frame_len + 4000])
    for i, recs in enumerate(rx_path_records()):
        for head in (0x14, 0x17, 0x38, 0x95, 0x1e):
            write("rx_path", f"seed-hand-{i}-{head:02x}", bytes([head, i]) + recs)
    print(f"seeded from {n} MPA streams", file=sys.stderr)


def rx_path_records():
    """Framed records (flags, len, body) for rx_path: a Send, Writes to each MR, the
    Read Response to the device's Read, a Read Request of the readable MR, a Send with
    Invalidate of the fast-registered MR, the peer's Terminate."""
    def tagged(op, to_low, payload):
        return bytes([0xC1, 0x40 | op]) + bytes(4) + bytes(7) + bytes([to_low]) + payload

    def untagged(op, qn, payload, inv=0):
        return bytes([0x41, 0x40 | op]) + struct.pack(">IIII", inv, qn, 0, 0) + payload

    def rec(flags, body):
        return bytes([flags, len(body)]) + body

    stag, msn, to, rr_src = 0x01, 0x10, 0x40, 0x20
    send = rec(msn, untagged(3, 0, b"hello"))
    writes = b"".join(rec(stag | to | i << 1, tagged(0, 8, b"written!")) for i in range(5))
    rresp = rec(stag | to | 4 << 1, tagged(2, 208, bytes(range(40))))
    rreq = rec(msn | stag | to | rr_src | 1 << 1, untagged(1, 1, bytes(12) + struct.pack(">I", 16) + bytes(12)))
    sinv = rec(msn | stag | 2 << 1, untagged(4, 0, b"inv"))
    term = rec(0, untagged(7, 2, bytes([0x02, 0, 0, 0])))
    return [send, writes, rresp, rreq, sinv, send + writes + rresp + rreq + sinv + send, send + term]


def write(target, name, data):
    with open(os.path.join(here, "corpus", target, name), "wb") as f:
        f.write(data)


if __name__ == "__main__":
    main()
