"""Who is calling the session API: the admin (the operator's token) or a tenant (its API key).

Creating, reading and deleting sessions needs `Authorization: Bearer <admin token | API key>`
whenever either is configured (`statefleet up` always generates the admin token); a stack
with neither is a development stack and its session routes are open. A tenant sees and
deletes only its own sessions; the admin, every session. A credential is compared in
constant time and is never logged; a header that is not ASCII is no credential.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from aiohttp import web

from libs.errors import Forbidden, Unauthorized

ADMIN = ""  # the tenant name recorded for sessions the admin creates


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str
    admin: bool

    def may_touch(self, tenant: str) -> bool:
        return self.admin or self.tenant == tenant


OPEN = Caller(tenant=ADMIN, admin=True)  # who calls a development stack without credentials


class Credentials:
    def __init__(self, admin_token: str, api_keys: dict[str, str]) -> None:
        self.admin_token = admin_token
        self._keys = [(tenant, key.encode()) for tenant, key in sorted(api_keys.items())]

    @property
    def required(self) -> bool:
        return bool(self.admin_token or self._keys)

    def caller(self, request: web.Request) -> Caller:
        """The caller of a session route; `Unauthorized` without a known credential."""
        if not self.required:
            return OPEN
        token = _bearer(request)
        if token is not None:
            if self.admin_token and hmac.compare_digest(token, self.admin_token.encode()):
                return Caller(tenant=ADMIN, admin=True)
            match = ""
            for tenant, key in self._keys:  # every key compared: the time taken names no tenant
                if hmac.compare_digest(token, key):
                    match = tenant
            if match:
                return Caller(tenant=match, admin=False)
        raise Unauthorized("sessions need Authorization: Bearer <API key or admin token>", field="Authorization")

    def admin(self, request: web.Request) -> None:
        """Refuse anyone but the admin (the fleet routes)."""
        if not self.admin_token:
            raise Forbidden("the admin API is disabled: no admin_token is configured")
        token = _bearer(request)
        if token is None or not hmac.compare_digest(token, self.admin_token.encode()):
            raise Unauthorized("fleet operations need Authorization: Bearer <admin token>", field="Authorization")


def _bearer(request: web.Request) -> bytes | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token or not token.isascii():
        return None  # a non-UTF-8 header arrives as surrogates: not a credential, never an error
    return token.encode()
