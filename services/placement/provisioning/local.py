"""`local`: engine-host processes on this machine, started and stopped by `statefleet up`'s supervisor.

The backend writes what it wants as one empty file per wanted host in `directory`; the
supervisor (`statefleet/supervisor.py`) starts a process for every wanted host among the
ids it prepared credentials for, and stops (SIGTERM, then SIGKILL after a grace) every one no
longer wanted. The supervisor stays the only parent of every process: its ordered shutdown,
crash restarts and parent-death signal keep working, and a placement instance that dies
takes no engine host with it. The files are also the backend's memory: a placement instance
that takes the fleet tenure over sees what its predecessor asked for.
"""

from __future__ import annotations

from pathlib import Path

from libs.errors import BadRequest


class LocalProvisioner:
    def __init__(self, directory: str | Path, slots: list[str]) -> None:
        if not slots:
            raise BadRequest("the local provisioner needs at least one host id", field="provision_hosts")
        self.directory = Path(directory)
        self.slots = list(slots)
        self.directory.mkdir(parents=True, exist_ok=True)

    def managed(self) -> set[str]:
        return {h for h in self.slots if (self.directory / h).exists()}

    def start(self, count: int) -> list[str]:
        running = self.managed()
        chosen = [h for h in self.slots if h not in running][:max(count, 0)]
        for h in chosen:
            (self.directory / h).touch()
        return chosen

    def stop(self, host_id: str) -> None:
        if host_id in self.slots:
            (self.directory / host_id).unlink(missing_ok=True)


def wanted(directory: str | Path, slots: list[str]) -> set[str]:
    """What the supervisor reads: the hosts the backend wants running."""
    d = Path(directory)
    return {h for h in slots if (d / h).exists()}
