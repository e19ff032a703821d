"""How close admission's estimates are to what an engine host then measures.

For each backend and quality tier, one C1 session with that tier as its floor is created through
admission's HTTP API on a real stack (embedded nats-server, fence, placement, admission, one
engine host), runs for `--seconds`, and the host's own per-stage metrics are read back.
Admission budgets a session's device share from the host's start-up profile row at the floor
(quantum = the denoise stage, share = quantum / period); the host runs the best tier it can. The
baseline is the profile row of the tier the session ran at, measured in this run at start-up;
the comparison is the serving-time measurement of the same quantity.

    python -m bench.estimates [--quick] --json PATH [--seconds S] [--period-ms P]
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path

import aiohttp

from bench import common
from libs import bus, names
from libs.natsd import NatsServer
from libs.schemas.engine import SessionMetrics, SessionRef
from services.admission.service import AdmissionConfig, AdmissionService
from services.engine_host.service import EngineHostConfig, EngineHostService
from services.fence.service import FenceConfig, FenceService
from services.placement.service import PlacementConfig, PlacementService

TARGET_MEAN_ABS_REL_ERROR = 0.25


async def measure(seconds: float, period_ms: float, tmp: Path) -> list[dict]:
    server = NatsServer(store_dir=tmp / "nats").start()
    quiet = dict(nats_url=server.url, log_json=False, log_level="warning", heartbeat_s=0.5)
    fence = FenceService(FenceConfig(**quiet, http_port=0))
    host = EngineHostService(EngineHostConfig(**quiet, host_id="h0", profile_blocks=9, torch_threads=1,
                                              checkpoint_every_s=3600.0, checkpoint_dir=str(tmp / "ckpt")))
    placement = PlacementService(PlacementConfig(**quiet))
    started = [fence, host, placement]
    rows: list[dict] = []
    try:
        for svc in started:
            await svc.start()
        admission = AdmissionService(AdmissionConfig(**quiet, http_port=0, max_sessions_per_host=64))
        await admission.start()
        started.append(admission)
        await _until(lambda: bool(admission._live()))
        cases = [(r.backend, r.tier) for r in host.profile]
        async with aiohttp.ClientSession(f"http://127.0.0.1:{admission.http_port}") as http:
            for backend, tier in common.progress(cases, len(cases), "estimate vs measurement"):
                rows.append(await _one(http, host, backend, tier, seconds, period_ms))
    finally:
        for svc in reversed(started):
            await svc.stop()
        server.stop()
    return rows


async def _one(http: aiohttp.ClientSession, host: EngineHostService, backend: str, tier: int,
               seconds: float, period_ms: float) -> dict:
    contract = {"session_class": "C1", "quality_floor": tier, "determinism": "T1", "period_ms": period_ms}
    async with http.post("/v1/sessions", json={"contract": contract, "backend": backend, "seed": 1}) as resp:
        created = await resp.json()
        if resp.status != 201:
            raise RuntimeError(f"create {backend}@{tier}: {resp.status} {created}")
    sid = created["session_id"]
    estimate = created["verdict"]["estimates"][0]
    await _until(lambda: sid in host.runtime.sessions)
    await asyncio.sleep(seconds)
    m = await bus.request(host.nc, names.engine_subject("h0", "metrics"), SessionRef(session_id=sid),
                          SessionMetrics)
    denoise = next(s for s in m.stages if s.stage == "denoise")
    async with http.delete(f"/v1/sessions/{sid}"):
        pass
    # Admission budgets the floor; the host runs the best tier it can (it steps down only under
    # pressure), so the estimate's error is judged at the tier the session actually ran.
    profiled = next(r.quantum_ms for r in host.profile if (r.backend, r.tier) == (backend, m.tier))
    return {"backend": backend, "floor": tier, "ran_at_tier": m.tier, "blocks": m.blocks,
            "quantum_ms_budgeted_at_floor": estimate["quantum_ms"],
            "busy_fraction_budgeted_at_floor": estimate["busy_fraction"],
            "quantum_ms_profiled": profiled, "quantum_ms_measured": denoise.mean_ms,
            "busy_fraction_measured": denoise.mean_ms / period_ms,
            "rel_error": (denoise.mean_ms - profiled) / profiled}


async def _until(predicate, timeout_s: float = 30.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("the stack did not come up")


def main() -> None:
    p = common.parser("estimates", __doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=None, help="how long each session runs (default 4, quick 1.5)")
    p.add_argument("--period-ms", type=float, default=100.0)
    args = p.parse_args()
    seconds = args.seconds or (1.5 if args.quick else 4.0)
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(measure(seconds, args.period_ms, Path(tmp)))
    errors = [abs(r["rel_error"]) for r in rows]
    result = {
        "rows": rows,
        "mean_abs_rel_error": statistics.fmean(errors),
        "max_abs_rel_error": max(errors),
        "seconds_per_session": seconds,
        "period_ms": args.period_ms,
        "targets": {"mean_abs_rel_error": f"<= {TARGET_MEAN_ABS_REL_ERROR}"},
    }
    print("  backend floor  ran  budget@floor ms  profiled@ran ms  measured ms  rel error")
    for r in rows:
        print(f"  {r['backend']:<7} {r['floor']:>5} {r['ran_at_tier']:>4}  {r['quantum_ms_budgeted_at_floor']:>15.3f}"
              f"  {r['quantum_ms_profiled']:>15.3f}  {r['quantum_ms_measured']:>11.3f}  {r['rel_error']:+9.1%}")
    common.table([("mean_abs_rel_error", result["mean_abs_rel_error"], f"target <= {TARGET_MEAN_ABS_REL_ERROR}"),
                  ("max_abs_rel_error", result["max_abs_rel_error"], "")])
    common.write(args.json, result)


if __name__ == "__main__":
    main()
