#!/usr/bin/env python3
"""Where a live process's heap memory is resident, by malloc chunk size. Prints numbers,
asserts nothing; needs to read /proc/PID/mem and /proc/PID/pagemap (root, or the same user
with ptrace allowed).

    bench/heap_residency.py PID

Walks glibc's chunks in the main heap ([heap]) and in every thread arena's heap (the
anonymous read-write mappings at 64 MiB boundaries), and shares each resident page out
between the chunks lying on it, by the bytes each has on it. A chunk size that a kind of
allocation always has (libmicrohttpd's connection pool: 32,784 bytes for 32 KiB; a
request arena's chunk) then shows what that kind costs in RSS, which is less than what
it allocates when pages were never touched and more than what it writes when malloc
handed it memory others had touched. Used for docs/performance.md, "Parked long-polls"
(bench/sync_longpoll.py runs it at each step with SYNC_BENCH_HEAPS=1).
"""

import collections
import struct
import sys

PAGE = 4096
HEAP_ALIGN = 1 << 26  # glibc's HEAP_MAX_SIZE on 64-bit: thread heaps start at multiples
MIN_CHUNK = 32


def heaps(pid):
    with open(f"/proc/{pid}/maps", encoding="ascii") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            name = fields[5] if len(fields) > 5 else ""
            if fields[1] == "rw-p" and (name == "[heap]" or (not name and lo % HEAP_ALIGN == 0)):
                yield lo, hi


def resident_pages(pagemap, lo, hi):
    pagemap.seek(lo // PAGE * 8)
    data = pagemap.read((hi - lo) // PAGE * 8)
    return [bool(struct.unpack_from("<Q", data, i * 8)[0] >> 63) for i in range((hi - lo) // PAGE)]


def walk(buf, off):
    """Chunks (offset, size) from off while their sizes chain to the end of buf."""
    chunks = []
    while off + 16 <= len(buf):
        size = struct.unpack_from("<Q", buf, off + 8)[0] & ~7
        if size < MIN_CHUNK or off + size > len(buf):
            break
        chunks.append((off, size))
        off += size
    return chunks, off


def first_chain(buf):
    """The chunks of a heap: after its header (and, for an arena's first heap, the arena's
    own state), the first offset whose chain of sizes reaches the heap's end."""
    for start in range(0, PAGE, 16):
        chunks, end = walk(buf, start)
        if len(chunks) > 2 and end >= len(buf) - MIN_CHUNK:
            return chunks
    return None


def main():
    pid = int(sys.argv[1])
    resident = collections.Counter()
    count = collections.Counter()
    unparsed = 0
    with open(f"/proc/{pid}/mem", "rb", 0) as mem, open(f"/proc/{pid}/pagemap", "rb", 0) as pagemap:
        for lo, hi in heaps(pid):
            res = resident_pages(pagemap, lo, hi)  # first: reading maps untouched pages to the zero page
            mem.seek(lo)
            try:
                buf = mem.read(hi - lo)
            except OSError:
                continue
            chunks = first_chain(buf)
            if chunks is None:
                unparsed += sum(res) * PAGE
                continue
            for i, (off, size) in enumerate(chunks):
                end = off + size
                in_use = (i < len(chunks) - 1 and end + 16 <= len(buf)
                          and struct.unpack_from("<Q", buf, end + 8)[0] & 1)  # next chunk's PREV_INUSE
                key = size if in_use else "free"
                count[key] += 1
                page = (lo + off) // PAGE * PAGE
                while page < lo + end:
                    if res[(page - lo) // PAGE]:
                        resident[key] += min(lo + end, page + PAGE) - max(lo + off, page)
                    page += PAGE
    total = sum(resident.values())
    print(f"  heaps: {total / 2**20:.1f} MiB resident in chunks"
          f"{f', {unparsed / 2**20:.1f} MiB not walked' if unparsed else ''}; by chunk size:")
    for key, value in resident.most_common(8):
        what = "free chunks" if key == "free" else f"{key:6d} B chunks"
        print(f"    {what} x{count[key]:7d}: {value / 2**20:7.2f} MiB, {value / count[key]:6.0f} B each")


if __name__ == "__main__":
    main()
