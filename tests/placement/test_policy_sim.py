"""The fleet simulator (bench/fleet*.py): trace formats detected and parsed, and one seed, one result."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import fleet, fleet_trace, fleet_workload
from bench.fleet_trace import TraceError

SHARED = Path("/work/shared/traces")
TINY = {"concurrency": 8, "request_span_s": None, "servegen_span_s": 1200.0, "generated_span_s": 600.0}


def write(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"trace.{kind}"
    p.write_text(fleet_trace.fixture_text(kind), newline="")
    return p


@pytest.mark.parametrize("kind", ["azure", "mooncake", "servegen"])
def test_each_format_is_detected_by_content_not_name(tmp_path, kind):
    assert fleet_trace.detect(write(tmp_path, kind)) == kind


def test_azure_rows_become_relative_arrivals_with_context_sizes(tmp_path):
    kind, got = fleet_trace.rows(write(tmp_path, "azure"))
    assert kind == "azure"
    assert [round(a.t_s, 4) for a in got] == [0.0, 1.052, 5.52] and [a.size for a in got] == [4808, 3180, 120]


def test_azure_timestamps_in_other_releases_shapes_parse(tmp_path):
    """Whole seconds, a `T`, a zone offset or `Z`: the forms later Azure releases and re-exports use."""
    p = tmp_path / "azure.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.003502+00:00,10,1\n"
                 "2024-05-10 00:00:02+00:00,20,1\n2024-05-10T00:00:03.5Z,30,1\n")
    _, got = fleet_trace.rows(p)
    assert [round(a.t_s, 6) for a in got] == [0.0, 1.996498, 3.496498]


def test_mooncake_timestamps_are_milliseconds(tmp_path):
    _, got = fleet_trace.rows(write(tmp_path, "mooncake"))
    assert [a.t_s for a in got] == [0.0, 3.0, 5.999] and got[0].size == 6758


def test_servegen_windows_are_sampled_at_the_scaled_rate(tmp_path):
    _, windows = fleet_trace.rows(write(tmp_path, "servegen"))
    assert len(windows) == 4 and windows[0]["dist"] == "Weibull" and windows[1]["rate"] == 0
    got = fleet_trace.servegen_arrivals(windows, 1.0, None, np.random.default_rng(0))
    assert 600 < len(got) < 2000  # (1.5 + 0.5) × 600 + 0.8 × 600 expected = 1680 at most, bursty
    assert all(0 <= a.t_s < 1200 for a in got)


def test_an_unknown_format_or_a_bad_row_is_a_typed_error_naming_the_line(tmp_path):
    other = tmp_path / "x.csv"
    other.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match="not an Azure CSV"):
        fleet_trace.detect(other)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5}\n{"timestamp": "x", "input_length": 5}\n')
    with pytest.raises(TraceError, match=":2:"):
        fleet_trace.rows(bad)


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared traces not on this machine")
def test_the_shared_traces_read():
    found = {fleet_trace.detect(p) for p in SHARED.iterdir() if p.suffix in (".csv", ".jsonl")}
    assert found == {"azure", "mooncake", "servegen"}
    kind, got = fleet_trace.rows(SHARED / "AzureLLMInferenceTrace_code.csv")
    assert kind == "azure" and len(got) == 8819 and got[0].t_s == 0.0


def test_a_session_draw_follows_its_arrival_and_the_published_bounds():
    arrivals = [fleet_trace.Arrival(float(i), size=i) for i in range(300)]
    specs = fleet_workload.sessions(arrivals, 1.0, 4 << 30, np.random.default_rng(3))
    assert len(specs) == 300 and {s.tier for s in specs} == {4, 8, 16}
    assert all(fleet_workload.CLIP_MIN_S <= s.duration_s <= fleet_workload.INTERACTIVE_MAX_S for s in specs)
    assert all(s.arrival_s <= a < b <= s.arrival_s + s.duration_s for s in specs for a, b in s.idle)


def run(tmp_path: Path, name: str, seed: int) -> dict:
    kind, specs, _ = fleet.workload(None, seed, TINY)
    _, _, end = fleet.offered(specs)
    res = fleet.run_arms(specs, fleet.params("profile"), end, fleet.first_fit_hosts(specs), 1)
    for r in res.values():
        r.pop("wall_s")
    path = tmp_path / name
    path.write_text(json.dumps(res, sort_keys=True))
    return res


def test_the_simulator_is_deterministic_for_a_seed(tmp_path):
    a = run(tmp_path, "a.json", 7)
    run(tmp_path, "b.json", 7)
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    assert a["statefleet"]["sessions"] > 0
    run(tmp_path, "c.json", 8)
    assert (tmp_path / "c.json").read_text() != (tmp_path / "a.json").read_text()


@pytest.mark.slow
def test_the_simulator_gives_the_same_numbers_whatever_the_processs_hash_seed(tmp_path):
    """Sets yield their members in an order that follows PYTHONHASHSEED; no result may depend on it."""
    import os
    import subprocess
    import sys

    code = "import sys; from pathlib import Path; from tests.placement.test_policy_sim import run; " \
           "run(Path(sys.argv[1]), sys.argv[2], 7)"
    for seed in ("0", "1"):
        subprocess.run([sys.executable, "-c", code, str(tmp_path), f"h{seed}.json"], check=True, capture_output=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}, cwd=Path(__file__).resolve().parents[2])
    assert (tmp_path / "h0.json").read_text() == (tmp_path / "h1.json").read_text()


@pytest.mark.parametrize("content", [b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,10,1\nnot a time,5,5\n",
                                     b"\xff\xfe\x00binary", None])
def test_a_bad_trace_file_ends_the_run_with_a_message_not_a_traceback(tmp_path, monkeypatch, capsys, content):
    trace = tmp_path / "t.csv"
    if content is not None:
        trace.write_bytes(content)
    monkeypatch.setattr("sys.argv", ["bench.fleet", "--quick", "--trace", str(trace), "--json", str(tmp_path / "o.json")])
    with pytest.raises(SystemExit) as e:
        fleet.main()
    assert str(e.value).startswith("bench.fleet: cannot read the trace:") and not (tmp_path / "o.json").exists()


def test_the_warm_up_runs_before_the_window_and_nothing_in_it_is_counted():
    """The trace's opening arrivals are replayed before 0, drawn after the window's own sessions (which
    they leave unchanged); every figure counts only the window [0, end]."""
    _, specs, shape = fleet.workload(None, 7, TINY)
    warm = [s for s in specs if s.arrival_s < 0]
    window = [s for s in specs if s.arrival_s >= 0]
    assert warm and shape["warmup_sessions"] == len(warm) and shape["sessions"] == len(window)
    assert all(-fleet.WARMUP_S <= s.arrival_s < 0 and s.session_id.startswith("w") for s in warm)
    assert len({s.session_id for s in specs}) == len(specs)
    rng = np.random.default_rng(7)
    arrivals = fleet_trace.generated(TINY["generated_span_s"], TINY["concurrency"] / fleet_workload.mean_duration_s(), rng)
    assert fleet_workload.sessions(arrivals, 1.0, fleet.ROW[8].state_bytes, rng) == window
    _, _, end = fleet.offered(specs)
    res = fleet.run_arms(specs, fleet.params("profile"), end, fleet.first_fit_hosts(specs), 1,
                         only=("static_peak", "statefleet"))
    for r in res.values():
        assert r["sessions"] == len(window)  # arrivals within the window only
        assert r["gpu_hours"] <= r["peak_gpus"] * end / 3600 + 1e-9  # host time over [0, end] only
        assert min(r["series"]["t_s"]) >= 0
    # static peak holds its fleet over exactly the window
    assert res["static_peak"]["gpu_hours"] == pytest.approx(fleet.first_fit_hosts(specs) * end / 3600)
