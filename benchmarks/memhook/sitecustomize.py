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
            _collect(out)
        os.replace(_dump + ".tmp", _dump)

    def _rss_mib() -> float:
        with open("/proc/self/status") as status:
            kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        return kib / 1024

    def _collect(out) -> None:
        """How much of it is cyclic garbage a full collection would free (it runs one)."""
        import ctypes
        before, counts = _rss_mib(), gc.get_count()
        freed = gc.collect()
        after = _rss_mib()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        out.write(f"\n== full collection\ncounts before {counts}; {freed} objects freed; "
                  f"RSS {before:.1f} -> {after:.1f} MiB, {_rss_mib():.1f} MiB after malloc_trim\n"
                  f"gc stats {gc.get_stats()}\n")

    def _holders(out, type_name: str) -> None:
        """What keeps objects of `type_name` alive: for three of them, the shortest referrer path
        to a root (a frame, a module, a class, a contextvars Context, a thread, a task)."""
        import asyncio
        import contextvars
        import types as _types
        from collections import deque
        everything = gc.get_objects()
        found = [o for o in everything if type(o).__name__ == type_name][:3]
        del everything
        out.write(f"\n== what holds {type_name}\n")
        here = sys._getframe()
        mine = set()
        frame = here
        while frame is not None:
            mine.add(id(frame))
            frame = frame.f_back
        roots = (_types.FrameType, _types.ModuleType, type, contextvars.Context, threading.Thread, asyncio.Task)

        def describe(o) -> str:
            if isinstance(o, _types.FrameType):
                return f"frame {o.f_code.co_name} {o.f_code.co_filename}:{o.f_lineno}"
            if isinstance(o, dict):
                return f"dict keys={list(o)[:8]}"
            if isinstance(o, (list, tuple, set)):
                return f"{type(o).__qualname__} len={len(o)}"
            if isinstance(o, _types.CellType):
                return "cell"
            if isinstance(o, _types.FunctionType):
                return f"function {o.__qualname__}"
            if isinstance(o, contextvars.Context):
                return f"Context vars={[v.name for v in o]}"
            return f"{type(o).__module__}.{type(o).__qualname__}"

        for obj in found:
            parent = {id(obj): None}
            keep = {id(obj): obj}
            queue = deque([(obj, 0)])
            ignore = mine | {id(found), id(parent), id(keep), id(queue)}
            root = None
            while queue and root is None:
                current, depth = queue.popleft()
                if depth >= 14:
                    continue
                for ref in gc.get_referrers(current):
                    if id(ref) in ignore or id(ref) in parent:
                        continue
                    if isinstance(ref, _types.FrameType) and ref.f_code.co_filename == __file__:
                        continue
                    parent[id(ref)], keep[id(ref)] = id(current), ref
                    if isinstance(ref, roots):
                        root = ref
                        break
                    queue.append((ref, depth + 1))
            if root is None:
                out.write(f"  no root found ({len(parent)} objects visited):\n")
                for key, ref in keep.items():
                    out.write(f"    {describe(ref)} <- {describe(keep[parent[key]]) if parent[key] else '-'}"
                              f" (referrers {len(gc.get_referrers(ref))})\n")
                out.write("\n")
                continue
            step = id(root)
            while step is not None:
                out.write(f"  {describe(keep[step])}\n")
                step = parent[step]
            out.write("\n")

    signal.signal(signal.SIGUSR2, _write)
