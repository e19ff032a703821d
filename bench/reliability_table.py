"""docs/reliability.md's table from the last chaos run (`var/chaos/results.json`, written by `make chaos`).

    python -m bench.reliability_table [--results PATH] [--out docs/reliability.md]

Rewrites only the part of the page between the two table markers, so the prose around it stays.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- chaos-table:begin -->", "<!-- chaos-table:end -->"
COLUMNS = ("drill", "faults injected", "sessions (affected)", "inputs acked", "inputs lost", "applied twice",
           "dual authorizations", "recovery s (per fault)", "passed", "run")


def table(results: dict[str, dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name in sorted(results):
        r = results[name]
        recovery = ", ".join(f"{s:g}" for s in r["recovery_s"]) or "—"
        lines.append("| " + " | ".join([
            f"`{name}`", "<br>".join(r["faults"]), f"{r['sessions']} ({r['sessions_affected']})",
            str(r["inputs_acked"]), str(r["inputs_lost"]), str(r["inputs_applied_twice"]),
            str(r["dual_authorizations"]), recovery, "yes" if r["passed"] else "**no**", r["at"]]) + " |")
    return "\n".join(lines)


def render(page: str, results: dict[str, dict]) -> str:
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table(results)}\n{END}{tail}"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.reliability_table", description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=ROOT / "var" / "chaos" / "results.json")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "reliability.md")
    args = p.parse_args()
    results = json.loads(args.results.read_text())
    args.out.write_text(render(args.out.read_text(), results))
    print(f"{args.out}: {len(results)} drills")


if __name__ == "__main__":
    main()
