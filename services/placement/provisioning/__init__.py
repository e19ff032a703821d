"""Provisioning backends: where the autoscaler gets engine hosts from and gives them back to.

One small interface (`Provisioner`): ask for hosts, give one back, list the ones it runs.
`local` starts and stops engine-host processes on this machine (through `statefleet up`'s
supervisor); `sim` hands out simulated hosts (the fleet simulator, and tests that bring
their own engine processes). A backend only ever stops a host it started.
"""

from __future__ import annotations

from typing import Protocol


class Provisioner(Protocol):
    def managed(self) -> set[str]:
        """The hosts it runs (asked for and not given back), booted or not."""
        ...

    def start(self, count: int) -> list[str]:
        """Ask for `count` more engine hosts; their ids (fewer when it has no more to give)."""
        ...

    def stop(self, host_id: str) -> None:
        """Give the host back. The caller has made sure it owns no session."""
        ...
