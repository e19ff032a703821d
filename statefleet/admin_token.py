"""The admin token of a `statefleet up` stack: generated once, kept in `<data dir>/admin_token` (0600).

Admission takes it as `SF_ADMIN_TOKEN`; the CLI sends it on the session routes. An operator's
own `SF_ADMIN_TOKEN` wins over the file, for both.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

FILE = "admin_token"
ENV = "SF_ADMIN_TOKEN"


def ensure(data_dir: str | Path) -> str:
    """The stack's admin token: the environment's, else the saved one, else a new one saved now."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    path = Path(data_dir) / FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


def read(data_dir: str | Path) -> str:
    """The token the CLI sends ("" when there is none: a stack without credentials)."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    path = Path(data_dir) / FILE
    return path.read_text().strip() if path.exists() else ""
