"""nats-py is imported in `libs/bus/` only, and its exceptions are named in `libs/bus/failures.py` only:
every other module gets our typed errors and annotates with the bus's own type names (`bus.Client`, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUS = ROOT / "libs" / "bus"
FAILURES = BUS / "failures.py"
SOURCE_DIRS = ("libs", "services", "statefleet", "bench")


def _nats_imports(path: Path) -> list[str]:
    """The nats-py modules `path` imports (`import nats...`, `from nats... import ...`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        modules = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        found += [m for m in modules if m == "nats" or m.startswith("nats.")]
    return found


def _sources() -> list[Path]:
    sources = [p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py")]
    assert len(sources) > 100  # the walk found the tree
    return sources


def test_no_module_outside_the_bus_package_imports_nats_py():
    outside = {str(p.relative_to(ROOT)): _nats_imports(p) for p in _sources() if BUS not in p.parents}
    assert {path: mods for path, mods in outside.items() if mods} == {}


def test_only_failures_names_nats_py_errors():
    inside = {p.name: [m for m in _nats_imports(p) if m.endswith(".errors")] for p in BUS.glob("*.py") if p != FAILURES}
    assert {name: mods for name, mods in inside.items() if mods} == {}
    assert "nats.errors" in _nats_imports(FAILURES)
