"""The one error hierarchy of statefleet.

Every error carries a stable `code`, a human `detail`, whether a retry can
succeed, and structured `fields` (ids, sizes) so callers and logs never parse
messages. Errors also subclass the matching stdlib type so a caller may catch
either (`except ValueError` catches `BadRequest`).

Errors cross the bus as `libs.schemas.common.ErrorReply` and are rebuilt on
the caller's side by `by_code`, keyed by `code`.
"""

from __future__ import annotations

from typing import Any, ClassVar


class StatefleetError(Exception):
    code: ClassVar[str] = "error"
    http_status: ClassVar[int] = 500
    retryable: ClassVar[bool] = False

    def __init__(self, detail: str, **fields: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.fields = fields

    def __getattr__(self, name: str) -> Any:
        # Structured fields read as attributes: `err.session_id`.
        fields = self.__dict__.get("fields", {})
        if name in fields:
            return fields[name]
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.detail!r}, {self.fields!r})"


class Internal(StatefleetError):
    """A bug or an unexpected failure on the remote side; its details stay in its log."""

    code = "internal"


class BadRequest(StatefleetError, ValueError):
    code = "bad_request"
    http_status = 400


class SchemaError(BadRequest):
    """A payload that does not decode into the expected message type."""

    code = "schema"


class UnsupportedInput(BadRequest):
    """An input item of a kind (or shape) the session's backend does not take."""

    code = "unsupported_input"
    http_status = 422


class BadInitInput(BadRequest):
    """Session init inputs that are well typed but do not hold together: an image whose bytes do not
    match its size, audio that is not whole samples (rules a schema cannot state)."""

    code = "bad_init_input"
    http_status = 422


class UnsupportedVersion(SchemaError):
    code = "unsupported_version"


class ConfigError(StatefleetError, ValueError):
    """A bad config file or env value; names the field."""

    code = "config"


class Unauthorized(StatefleetError, PermissionError):
    code = "unauthorized"
    http_status = 401


class Forbidden(StatefleetError, PermissionError):
    code = "forbidden"
    http_status = 403


class NotFound(StatefleetError, LookupError):
    code = "not_found"
    http_status = 404


class Conflict(StatefleetError):
    """A compare-and-set lost, a stale version, a verb in the wrong lifecycle state."""

    code = "conflict"
    http_status = 409


class TooLarge(BadRequest):
    code = "too_large"
    http_status = 413


class Busy(StatefleetError):
    """A bounded queue is full; nothing was accepted, retry later."""

    code = "busy"
    http_status = 429
    retryable = True


class Rejected(StatefleetError):
    """A well-formed request that policy declines (admission, move admission), with its reason."""

    code = "rejected"
    http_status = 422


class Unavailable(StatefleetError, ConnectionError):
    code = "unavailable"
    http_status = 503
    retryable = True


class Timeout(StatefleetError, TimeoutError):
    code = "timeout"
    http_status = 504
    retryable = True


class IntegrityError(StatefleetError):
    """Bytes that fail verification (CRC mismatch, truncated or extra data)."""

    code = "integrity"
    http_status = 502


def _all_subclasses(cls: type[StatefleetError]) -> list[type[StatefleetError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


def by_code(code: str) -> type[StatefleetError]:
    """The error class for a wire code; unknown codes map to Internal."""
    for cls in _all_subclasses(StatefleetError):
        if cls.code == code:
            return cls
    return Internal
