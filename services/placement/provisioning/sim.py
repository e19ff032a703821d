"""`sim`: hosts that exist only as ids with a boot time, for the fleet simulator and tests.

`booted(now)` says which of the asked-for hosts have finished booting (and pre-warming) by
`now` on the caller's clock. A caller with real processes behind the ids (a test starting
engine hosts itself) passes `on_start` / `on_stop`.
"""

from __future__ import annotations

from collections.abc import Callable


class SimProvisioner:
    def __init__(self, *, clock: Callable[[], float], boot_s: float = 0.0,
                 name: Callable[[int], str] = "sim-{}".format, limit: int = 1 << 30,
                 on_start: Callable[[str], None] | None = None,
                 on_stop: Callable[[str], None] | None = None) -> None:
        self.clock, self.boot_s, self.name, self.limit = clock, boot_s, name, limit
        self.on_start, self.on_stop = on_start, on_stop
        self.asked: dict[str, float] = {}  # host → when it was asked for
        self.stopped: list[str] = []
        self._next = 0

    def managed(self) -> set[str]:
        return set(self.asked)

    def start(self, count: int) -> list[str]:
        out = []
        for _ in range(min(max(count, 0), self.limit - len(self.asked))):
            host_id = self.name(self._next)
            self._next += 1
            self.asked[host_id] = self.clock()
            out.append(host_id)
            if self.on_start is not None:
                self.on_start(host_id)
        return out

    def stop(self, host_id: str) -> None:
        if self.asked.pop(host_id, None) is None:
            return
        self.stopped.append(host_id)
        if self.on_stop is not None:
            self.on_stop(host_id)

    def booted(self, now: float) -> list[str]:
        return sorted(h for h, at in self.asked.items() if now - at >= self.boot_s)
