"""The package boundaries the README's layout section states, held against the code.

The layer order is read from the README itself (its list of operator/rankops/, top first), so the
section cannot drift from the code: every module belongs to a listed part, and each part imports
only parts listed below it. The dev harness (dev/rankops_dev/, the rankops-dev distribution) stands
above the whole product: the product imports nothing of it, and it imports the product's parts but
never controller/ (it has its own API client). Imports are read from the source, those inside
functions included (a lazy import is a dependency all the same). The last test checks, in a fresh
interpreter, what a module really loads."""
from __future__ import annotations

import ast
import fnmatch
import pathlib
import re
import subprocess
import sys
from collections import defaultdict

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "operator" / "rankops"
HARNESS = ROOT / "dev" / "rankops_dev"
# What the harness never imports of the product: the operator's shell and its API client.
HARNESS_NEVER = ("rankops.controller",)
# "Imports only ..." in the README's lines: a part -> the parts it may import.
ONLY = {
    "gates/": {"triton/", "progress.py"},
    "triton/": {"api/", "nodelabels.py"},
    "validator/": {"api/", "nodelabels.py"},
    "api/": {"images.py"},
    "fetcher/": set(),
    "nodelabels.py": set(), "images.py": set(), "metrics.py": set(), "progress.py": set(), "yamlio.py": set(),
}
# The only code of the product that talks to the Kubernetes API (imports its client or kopf), and the
# only code of the product that parses a command line.
API_CLIENTS = {"controller/", "validator/node.py", "commands/run.py"}
COMMAND_LINES = {"commands/", "cli.py", "validator/heartbeat.py"}


def layout_lines() -> list[list[str]]:
    """The README's layout of operator/rankops/, top first: the names on each line."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("\noperator/rankops/ ") + 1:]
    lines = []
    for line in block.splitlines()[1:]:
        if line and not line.startswith(" "):  # the next top-level entry
            break
        match = re.match(r"^  (\S.*?)(\s{2,}|$)", line)
        if match:
            lines.append([name.strip() for name in match.group(1).split(",")])
    return lines


LINES = layout_lines()
PARTS = [name for line in LINES for name in line]
RANK = {name: i for i, line in enumerate(LINES) for name in line}


def part_of(path: str) -> str | None:
    """The README's part of a file (relative to operator/rankops/): the most specific name that
    matches it, a folder by prefix, a file by name or pattern."""
    matching = [name for name in PARTS
                if (name.endswith("/") and path.startswith(name)) or fnmatch.fnmatch(path, name)]
    return max(matching, key=len, default=None)


def module_path(module: str) -> str | None:
    """operator/rankops/-relative path of a rankops module (a package: its __init__.py)."""
    rel = pathlib.Path(*module.split(".")[1:])
    for candidate in (rel.with_suffix(".py"), rel / "__init__.py"):
        if (PACKAGE / candidate).is_file():
            return candidate.as_posix()
    return None


def imports(path: pathlib.Path) -> set[str]:
    """Every module a file imports, at any depth of its code (from rankops import x: rankops.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def edges() -> dict[tuple[str, str], set[str]]:
    """(importing part, imported part) -> the files and modules, for every import across parts."""
    found: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for module in imports(path):
            target = module_path(module) if module.startswith("rankops.") else None
            if target is None:
                continue
            source_part, target_part = part_of(rel), part_of(target)
            if source_part != target_part:
                found[(source_part, target_part)].add(f"{rel} imports {module}")
    return found


EDGES = edges()


def test_every_module_is_in_a_part_the_readme_lists():
    unlisted = sorted(path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
                      if path.name != "__init__.py" or path.parent != PACKAGE
                      if part_of(path.relative_to(PACKAGE).as_posix()) is None)
    assert not unlisted, f"modules the README's layout does not place: {unlisted}"
    assert not [name for name in PARTS if not any(part_of(p.relative_to(PACKAGE).as_posix()) == name
                                                   for p in PACKAGE.rglob("*"))], "a listed part has no file"


def test_each_part_imports_only_parts_listed_below_it():
    upward = sorted(f"{a} -> {b}: {sorted(why)[0]}" for (a, b), why in EDGES.items()
                    if RANK[b] <= RANK[a])
    assert not upward, "imports beside or up the README's layers:\n" + "\n".join(upward)


def test_no_package_imports_its_way_back_to_itself():
    """The order above rules cycles out; this names one, should a part be listed twice over."""
    graph = defaultdict(set)
    for a, b in EDGES:
        graph[a].add(b)

    def cycle_from(start: str, node: str, seen: tuple[str, ...]) -> tuple[str, ...] | None:
        for nxt in sorted(graph[node]):
            if nxt == start:
                return (*seen, nxt)
            if nxt not in seen:
                found = cycle_from(start, nxt, (*seen, nxt))
                if found:
                    return found
        return None

    cycles = [cycle_from(part, part, (part,)) for part in sorted(graph)]
    assert not [" -> ".join(c) for c in cycles if c]


@pytest.mark.parametrize("part", sorted(ONLY))
def test_what_a_part_imports_only(part):
    imported = {b for (a, b) in EDGES if a == part}
    assert imported <= ONLY[part], f"{part} imports {sorted(imported - ONLY[part])}: " + \
        "; ".join(sorted(w for (a, b), why in EDGES.items() if a == part and b not in ONLY[part] for w in why))


def _importing(root: pathlib.Path, prefixes: tuple[str, ...]) -> list[str]:
    """'file imports module' for each file under root importing a module under one of prefixes."""
    return sorted(f"{path.relative_to(ROOT)} imports {m}" for path in root.rglob("*.py") for m in imports(path)
                  if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_no_part_of_the_product_imports_the_harness():
    assert not _importing(PACKAGE, ("rankops_dev",))


def test_the_harness_has_its_own_api_client_and_keeps_its_command_lines_on_top():
    assert not _importing(HARNESS, HARNESS_NEVER)
    below_commands = [line for line in _importing(HARNESS, ("rankops_dev.commands", "rankops.cli"))
                      if not line.startswith(("dev/rankops_dev/commands/", "dev/rankops_dev/__main__.py"))]
    assert not below_commands, below_commands


def test_the_dev_commands_reach_rankops_through_an_entry_point_into_the_harness_commands():
    import tomllib

    project = tomllib.loads((ROOT / "dev" / "pyproject.toml").read_text())["project"]
    points = project["entry-points"]["rankops.commands"]
    assert points == {"dev": "rankops_dev.commands.dev:add_commands"}, points
    assert "rankops" in project["dependencies"]


def _modules_importing(prefixes: tuple[str, ...]) -> set[str]:
    return {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
            if any(m == p or m.startswith(p + ".") for m in imports(path) for p in prefixes)}


def _outside(paths: set[str], allowed: set[str]) -> list[str]:
    return sorted(p for p in paths if part_of(p) not in allowed and p not in allowed)


def test_only_the_controller_the_validator_agent_and_run_talk_to_the_api():
    assert not _outside(_modules_importing(("kubernetes", "kopf")), API_CLIENTS)


def test_every_command_line_lives_in_commands():
    from rankops.cli import COMMAND_MODULES

    assert all(m.startswith("rankops.commands.") for m in COMMAND_MODULES), COMMAND_MODULES
    assert not _outside(_modules_importing(("argparse",)), COMMAND_LINES)


def _loaded_after(module: str) -> set[str]:
    code = (f"import importlib, sys; importlib.import_module({module!r}); "
            "print('\\n'.join(m for m in sys.modules if m.startswith('rankops')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.split())


@pytest.mark.parametrize("module, never", [
    ("rankops.render.desired", ("rankops.validator", "rankops.controller", "rankops.gates", "rankops_dev")),
    ("rankops.modelplan", ("rankops.validator", "rankops.controller", "rankops_dev")),
    ("rankops.poolplan", ("rankops.controller", "rankops.planner", "rankops_dev")),
    ("rankops.triton.client", ("rankops.gates", "rankops.controller", "rankops.validator", "rankops.render")),
    ("rankops.triton.image_fit", ("rankops.validator", "rankops.render", "rankops.controller")),
    ("rankops.validator.node", ("rankops.controller", "rankops.render", "rankops.triton", "rankops_dev")),
    ("rankops.commands.fetch", ("rankops.api", "rankops.controller", "rankops.render", "rankops_dev")),
])
def test_a_module_loads_nothing_its_layout_line_rules_out(module, never):
    loaded = _loaded_after(module)
    crossed = sorted(m for m in loaded for prefix in never if m == prefix or m.startswith(prefix + "."))
    assert not crossed, f"{module} imports {crossed}"
