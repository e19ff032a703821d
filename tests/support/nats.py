"""The per-test nats-server with the per-service users `statefleet up` generates (`libs/bus_auth.py`):
`url` carries the operator's (CLI) credentials, `url_for(service, host_id)` a service's own, so stack tests
run each service under the permissions it has in production."""

from __future__ import annotations

from dataclasses import dataclass, field

from libs import bus_auth
from libs.natsd import NatsServer

# Engine hosts the per-test server has users for; stack tests name their hosts from these.
ENGINE_HOSTS = ("e0", "e1", "e2", "h0", "h1", "h2")


@dataclass
class AuthNatsServer(NatsServer):
    credentials: dict[str, bus_auth.Credential] = field(default_factory=dict)

    @property
    def plain_url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.url_for(bus_auth.CLI_USER)

    def url_for(self, service: str, host_id: str = "") -> str:
        return bus_auth.url_with(self.plain_url, self.credentials[bus_auth.user_for(service, host_id)])


def start_auth_server(store_dir) -> AuthNatsServer:
    creds = bus_auth.write_auth(store_dir / "auth", list(ENGINE_HOSTS))
    return AuthNatsServer(store_dir=store_dir, config_file=store_dir / "auth" / "auth.conf",
                          credentials=creds).start()
