"""The pure admission core driven as the service drives it: candidates offered one by one, each admitted one
recorded on the host its verdict names."""

from __future__ import annotations

from libs.contracts import Contract, Demand
from libs.schemas.common import EngineEntry
from services.admission.core import AdmissionCore, Candidate
from tests.support.fleet_rows import c1


def offer(core: AdmissionCore, hosts: list[EngineEntry], n: int, contract: Contract | None = None,
          first: int = 0) -> list[str]:
    """Offer `n` sessions (`s<first>`…); each entry is the host an admitted one was placed on, else
    `outcome:reason`."""
    out = []
    for i in range(first, first + n):
        v = core.submit(Candidate(session_id=f"s{i}", backend="world", contract=contract or c1()), hosts, 1000.0)
        if v.outcome == "admitted":
            e = v.estimates[0]
            core.placed(f"s{i}", e.host_id, Demand(busy_fraction=e.busy_fraction, state_bytes=e.state_bytes), 1000.0)
            out.append(e.host_id)
        else:
            out.append(f"{v.outcome}:{v.estimates[0].reason}")
    return out
