"""The package boundaries the README's layout states: checked in a fresh interpreter, so what a
module pulls in is what it imports, not what an earlier test loaded."""
import subprocess
import sys

import pytest


def _loaded_after(module: str) -> set[str]:
    code = (f"import importlib, sys; importlib.import_module({module!r}); "
            "print('\\n'.join(m for m in sys.modules if m.startswith('rankops')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.split())


@pytest.mark.parametrize("module, never", [
    ("rankops.render.desired", ("rankops.validator", "rankops.controller", "rankops.gates", "rankops.devcluster")),
    ("rankops.modelplan", ("rankops.validator", "rankops.controller", "rankops.devcluster")),
    ("rankops.triton.client", ("rankops.gates", "rankops.controller", "rankops.validator", "rankops.render")),
    ("rankops.triton.image_fit", ("rankops.validator", "rankops.render", "rankops.controller")),
    ("rankops.validator.node", ("rankops.controller", "rankops.render", "rankops.devcluster")),
])
def test_a_package_does_not_import_what_its_layout_line_rules_out(module, never):
    loaded = _loaded_after(module)
    crossed = sorted(m for m in loaded for prefix in never if m == prefix or m.startswith(prefix + "."))
    assert not crossed, f"{module} imports {crossed}"
