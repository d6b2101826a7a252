#!/usr/bin/env python3
"""Seed corpora for the fuzz targets from the kernel siw captures in ../shared/pcaps.

Without seeds, `mpa_frame` rarely gets past the 16-byte MPA key. Writes
fuzz/corpus/<target>/seed-* (ignored by git); run.sh calls it when a corpus is empty.
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
    for target in ("mpa_frame", "mpa_deframer", "ddp_rdmap_ulpdu"):
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
            while off + 2 <= len(s) and m < 12:
                ulen = struct.unpack(">H", s[off:off + 2])[0]
                write("ddp_rdmap_ulpdu", f"seed-{n}-{m}", s[off + 2:off + 2 + ulen])
                off += 2 + ulen + (4 - (2 + ulen) % 4) % 4 + 4
                m += 1
    print(f"seeded from {n} MPA streams", file=sys.stderr)


def write(target, name, data):
    with open(os.path.join(here, "corpus", target, name), "wb") as f:
        f.write(data)


if __name__ == "__main__":
    main()
