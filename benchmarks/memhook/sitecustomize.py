# Diagnosis only (reconcile_bench --profile-memory): tracemalloc in the operator, dumped on SIGUSR2.
import os
_dump = os.environ.get("RANKOPS_BENCH_TRACEMALLOC")
if _dump:
    import gc, signal, sys, tracemalloc
    from collections import Counter
    tracemalloc.start(int(os.environ.get("RANKOPS_BENCH_TRACEMALLOC_FRAMES", "10")))

    def _write(*_):
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        with open(_dump + ".tmp", "w") as out:
            total = sum(s.size for s in snap.statistics("filename"))
            out.write(f"traced {total / 2**20:.1f} MiB\n\n== by file\n")
            for s in snap.statistics("filename")[:25]:
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
            import threading, asyncio
            out.write(f"\nthreads {threading.active_count()}\n")
        os.replace(_dump + ".tmp", _dump)

    signal.signal(signal.SIGUSR2, _write)
