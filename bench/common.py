"""The bench/ convention: `python -m bench.NAME [--quick] --json PATH`.

Each benchmark writes one JSON object (numbers measured in that run, ratios
against a baseline measured in the same run, and its stated targets), prints a
short human table, and shows progress while it works.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def parser(name: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=description)
    p.add_argument("--quick", action="store_true", help="a smaller run for CI and smoke checks")
    p.add_argument("--json", required=True, type=Path, help="where to write the JSON result")
    return p


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write(path: Path, result: dict[str, Any]) -> None:
    result = {**result, "environment": environment()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}")


def table(rows: list[tuple[str, Any, str]]) -> None:
    """Print (metric, value, target-or-note) rows."""
    width = max(len(r[0]) for r in rows)
    for metric, value, note in rows:
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"  {metric:<{width}}  {shown:>14}  {note}")


def progress(items: Iterable[T], total: int, label: str, every_s: float = 2.0) -> Iterator[T]:
    """Yield items, printing a progress line at most every `every_s` seconds (to stderr)."""
    start = last = time.monotonic()
    for i, item in enumerate(items, 1):
        yield item
        now = time.monotonic()
        if now - last >= every_s or i == total:
            rate = i / max(now - start, 1e-9)
            print(f"\r{label}: {i}/{total} ({100 * i / total:5.1f}%) {rate:,.0f}/s", end="", file=sys.stderr)
            last = now
    print(file=sys.stderr)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 100]."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]
