# Diagnosis only (reconcile_bench --profile-memory): on SIGUSR2 the operator writes where its memory
# is: tracemalloc's top allocations (RANKOPS_BENCH_TRACEMALLOC_FRAMES frames, 0: tracemalloc off,
# only the allocators' own numbers), gc objects by type, pymalloc's arenas and glibc's heaps.
import os

_dump = os.environ.get("RANKOPS_BENCH_TRACEMALLOC")
if _dump:
    import gc
    import signal
    import sys
    import threading
    import tracemalloc
    from collections import Counter

    _frames = int(os.environ.get("RANKOPS_BENCH_TRACEMALLOC_FRAMES", "10"))
    if _frames:
        tracemalloc.start(_frames)

    def _allocators(out) -> None:
        """pymalloc's and glibc's own accounts: what is in use vs what they hold."""
        import ctypes
        out.flush()
        saved = os.dup(2)
        with open(_dump + ".malloc", "w") as err:   # both write to fd 2 from C
            os.dup2(err.fileno(), 2)
            try:
                sys._debugmallocstats()
                try:
                    ctypes.CDLL("libc.so.6").malloc_stats()
                except (OSError, AttributeError):
                    pass
            finally:
                os.dup2(saved, 2)
                os.close(saved)
        text = open(_dump + ".malloc").read()
        keep = [line for line in text.splitlines() if any(w in line for w in (
            "arenas allocated", "arenas reclaimed", "arenas highwater", "Total", "bytes in allocated blocks",
            "bytes in available blocks", "unused pools", "Arena ", "system bytes", "in use bytes"))]
        out.write("\n== allocators\n" + "\n".join(keep) + "\n")

    def _write(*_):
        with open(_dump + ".tmp", "w") as out:
            if _frames:
                snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
                by_file = snap.statistics("filename")
                out.write(f"traced {sum(s.size for s in by_file) / 2**20:.1f} MiB\n\n== by file\n")
                for s in by_file[:25]:
                    out.write(f"{s.size / 2**20:8.2f} MiB {s.count:8d} {s.traceback[0].filename}\n")
                out.write("\n== by line\n")
                for s in snap.statistics("lineno")[:40]:
                    out.write(f"{s.size / 2**20:8.2f} MiB {s.count:8d} {s.traceback[0]}\n")
                out.write("\n== by traceback\n")
                for s in snap.statistics("traceback")[:25]:
                    out.write(f"{s.size / 2**20:8.2f} MiB {s.count:8d}\n")
                    for frame in s.traceback.format()[-20:]:
                        out.write(f"      {frame}\n")
            types = Counter(type(o).__name__ for o in gc.get_objects())
            out.write("\n== gc objects by type\n" + "".join(f"{c:9d} {t}\n" for t, c in types.most_common(30)))
            out.write(f"\nthreads {threading.active_count()}\n")
            _allocators(out)
            _holders(out, os.environ.get("RANKOPS_BENCH_HOLDERS_OF", "Body"))
        os.replace(_dump + ".tmp", _dump)

    def _holders(out, type_name: str) -> None:
        """What keeps objects of `type_name` alive: the referrer chains of three of them."""
        import types as _types
        found = [o for o in gc.get_objects() if type(o).__name__ == type_name][:3]
        out.write(f"\n== what holds {type_name}\n")
        for obj in found:
            chain, seen = [obj], {id(found)}
            for _ in range(6):
                refs = [r for r in gc.get_referrers(chain[-1]) if id(r) not in seen
                        and r is not chain and not isinstance(r, _types.FrameType)]
                if not refs:
                    break
                seen.update(id(r) for r in refs)
                chain.append(refs[0])
                out.write("   " * len(chain) + f"{type(refs[0]).__qualname__} "
                          f"({len(refs)} referrers: {sorted({type(r).__qualname__ for r in refs})[:6]})\n")
            out.write("\n")

    signal.signal(signal.SIGUSR2, _write)
