"""Subjects, streams and buckets that more than one service touches.

Each name has one owner that provisions it at start-up (idempotently); the
others only use it.
"""

from __future__ import annotations

SERVICES = ("fence", "admission", "placement", "mover", "engine_host")

# KV: live service instances (owner: every service, for itself). Entries expire when heartbeats stop.
SERVICES_BUCKET = "sf_services"
# KV: engine hosts with device, memory, capacity and load (owner: engine_host).
ENGINES_BUCKET = "sf_engines"
# KV: one summary per session for `statefleet status` and dashboards: a hint, never authority.
SESSIONS_BUCKET = "sf_sessions"

# Heartbeat entries live this many heartbeats before they expire.
HEARTBEAT_TTL_FACTOR = 3


def ping_subject(service: str) -> str:
    return f"sf.{service}.ping"


def engine_subject(host_id: str, verb: str) -> str:
    return f"sf.engine.{host_id}.{verb}"


# KV: one record per session admission knows (contract, verdict, placement decision) (owner: admission).
ADMISSION_BUCKET = "sf_admission"
# Request/reply: PlaceRequest → Placement, or Rejected(reason="no_fit") (owner: placement).
PLACEMENT_PLACE = "sf.placement.place"


# Engine output for the frontend: `OutputChunk`s of one session (owner: engine_host).
def output_subject(session_id: str) -> str:
    return f"sf.output.{session_id}"


# Object Store bucket for small session checkpoints (owner: engine_host; large ones go to a filesystem path).
CHECKPOINTS_BUCKET = "sf_checkpoints"


# ---- browser part (issue 14): the mover's names that admission's fleet feed and operator actions use
# Request/reply: MoveRequest → MoveReceipt (owner: mover).
MOVER_MOVE = "sf.mover.move"
# Every move's receipt, on `sf.mover.receipt.<session_id>` (owner: mover, stream SF_MOVES).
MOVER_RECEIPTS = "sf.mover.receipt.>"
# KV: moves in flight, journalled before they touch a host (owner: mover).
MOVES_INFLIGHT_BUCKET = "sf_moves_inflight"
