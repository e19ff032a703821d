"""The dashboard's feed shows overload relief's marks (issue 23): a session's row carries its shed kind and
reason as the summary holds them, and the events list says when it was shed and when it came back."""

from __future__ import annotations

from services.admission.fleet_feed import FleetFeed


def test_a_capacity_lost_session_is_shown_and_its_shed_and_resume_are_events():
    feed = FleetFeed(None, None, queue=lambda: {"entries": []}, heartbeat_s=1.0)  # type: ignore[arg-type]
    base = {"session_id": "c1", "owner_server_id": "e0", "owner_version": 1, "state": "serving"}
    feed._session("c1", base)
    why = "capacity_lost: e0's device measured past its limit; re-queued until a device has room"
    feed._session("c1", {**base, "state": "suspended", "shed": "capacity_lost", "reason": why})
    row = feed.snapshot()["sessions"][0]
    assert (row["state"], row["shed"], row["reason"]) == ("suspended", "capacity_lost", why)
    feed._session("c1", {**base, "shed": "", "reason": ""})
    shed = [e for e in feed.snapshot()["events"] if e["kind"] == "shed"]
    assert [e["text"] for e in reversed(shed)] == [f"c1 capacity_lost: {why}", "c1 resumed"]
