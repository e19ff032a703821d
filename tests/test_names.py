"""Every bus name is spelled once, in `libs/names.py`: no other production module has a subject,
stream or bucket literal."""

from __future__ import annotations

import ast
from pathlib import Path

from libs import names

ROOT = Path(__file__).resolve().parent.parent
NAMES_FILE = ROOT / "libs" / "names.py"
# The values `libs/names.py` defines (stream and bucket names); a copy of one elsewhere is a second home.
DEFINED = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str) and v.lower().startswith("sf")}


def _bus_literals(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith("sf.") or node.value in DEFINED:
                found.append(f"{path}:{node.lineno}: {node.value!r}")
    return found


def test_no_bus_name_is_spelled_outside_names():
    sources = [p for d in ("libs", "services", "statefleet") for p in (ROOT / d).rglob("*.py") if p != NAMES_FILE]
    assert sources
    assert [hit for p in sources for hit in _bus_literals(p)] == []


def test_the_scan_sees_a_literal_subject_and_a_copied_bucket_name(tmp_path):
    stray = tmp_path / "stray.py"
    stray.write_text(f'A = "sf.fence.meta"\nB = f"sf.output.{{sid}}"\nC = {names.SESSION_STREAM!r}\nD = "x"\n')
    assert len(_bus_literals(stray)) == 3
