"""The operator's runtime is two objects built at start-up (controller/runtime.py), not module
state (issue 27, item 3): importing the controller package starts no thread and keeps nothing
mutable at module level, and each controller owns what it remembers."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from rankops.controller import runtime
from rankops.controller.context import OperatorContext

CONTROLLER = Path(runtime.__file__).parent

PROBE = textwrap.dedent('''
    import collections, importlib, json, pkgutil, threading
    import rankops.controller as package
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"rankops.controller.{info.name}")
        for name, value in vars(module).items():
            constant = name.lstrip("_").isupper() or name.startswith("__")
            if not constant and isinstance(value, (dict, list, set, collections.deque)):
                found.append(f"{info.name}.{name}")
    print(json.dumps({"threads": sorted(t.name for t in threading.enumerate()), "mutable": found}))
''')


def test_importing_the_controller_package_starts_no_thread_and_keeps_no_mutable_module_state():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["threads"] == ["MainThread"], seen
    assert seen["mutable"] == [], "module-level state belongs to a controller object"


def test_two_controllers_share_nothing_and_start_their_threads_only_when_asked():
    import threading

    before = threading.active_count()
    first, first_pools = runtime.build(OperatorContext(interval=3.0, resync=30.0))
    second, _ = runtime.build(OperatorContext())
    assert threading.active_count() == before, "built, not started"
    assert first.clock.interval_s == 3.0 and second.clock.interval_s == OperatorContext().interval
    first.status_written["u"] = "1"
    first.memory.writes.applied["u"] = "digest"
    assert second.status_written == {} and second.memory.writes.applied == {}
    assert first_pools.models is first and first_pools.pause is first.pause
