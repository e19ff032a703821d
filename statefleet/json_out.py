"""The CLI's JSON output: always valid JSON.

`json.dumps` writes a float that is not finite as `NaN`/`Infinity`, which no JSON parser takes
(a metric of a session with no samples yet is NaN); msgspec writes it as `null`.
"""

from __future__ import annotations

from typing import Any

import msgspec


def dumps(value: Any, *, indent: int = 2) -> str:
    return msgspec.json.format(msgspec.json.encode(value), indent=indent).decode()
