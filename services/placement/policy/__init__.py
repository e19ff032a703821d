"""Fleet policies as pure, deterministic functions over a typed fleet snapshot.

`decide(fleet, params)` returns one decision's typed actions (Place, Move, ScaleOut, Drain,
StopHost, Suspend, Resume) and the refusals behind what it could not do; the placement service
applies the actions and the fleet simulator (`bench/fleet.py`) replays them. The parts are
public too, for callers (and baselines) that compose them differently.
"""

from services.placement.policy.actions import (
    Action,
    Decision,
    Drain,
    Move,
    Place,
    Refusal,
    Resume,
    ScaleOut,
    StopHost,
    Suspend,
)
from services.placement.policy.decide import decide, react
from services.placement.policy.params import Params
from services.placement.policy.snapshot import Fleet, Host, HostState, PathRates, Session, SessionState, Shed

__all__ = ["Action", "Decision", "Drain", "Fleet", "Host", "HostState", "Move", "Params", "PathRates", "Place",
           "Refusal", "Resume", "ScaleOut", "Session", "SessionState", "Shed", "StopHost", "Suspend", "decide", "react"]
