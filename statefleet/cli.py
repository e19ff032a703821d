"""`statefleet` command line: up, serve, status, engines, host, backends, admit-calc, session, nats-auth."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from libs import config as configmod
from libs.errors import BadRequest, StatefleetError
from statefleet import json_out
from statefleet.registry import SERVICES


def _serve(args: argparse.Namespace) -> int:
    from libs.service import run
    from statefleet.registry import service_type

    typ = service_type(args.service)
    cfg = configmod.load(typ.config_type, args.config)
    if args.nats_url:
        cfg.nats_url = args.nats_url
    run(typ, cfg)
    return 0


def _up(args: argparse.Namespace) -> int:
    from statefleet.supervisor import Supervisor

    return Supervisor(data_dir=args.data_dir, nats_url=args.nats_url, engines=args.engines,
                      device=args.device, autoscale=args.autoscale).run()


def _min_max(text: str) -> tuple[int, int]:
    """`MIN:MAX` engine hosts, 1 ≤ MIN ≤ MAX."""
    try:
        lo, hi = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX (two integers), got {text!r}") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"need 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


def _nats_auth(args: argparse.Namespace) -> int:
    from libs.bus_auth import write_auth

    creds = write_auth(Path(args.out), args.engine_host)
    print(f"wrote {args.out}/auth.conf (include it in nats-server.conf) and one <user>.env per user: "
          + ", ".join(sorted(creds)))
    return 0


def _status(args: argparse.Namespace) -> int:
    from statefleet.status import print_status

    return asyncio.run(print_status(args.nats_url, as_json=args.json, all_sessions=args.all))


def _engines(args: argparse.Namespace) -> int:
    from statefleet.engines import print_engines

    return asyncio.run(print_engines(args.nats_url, host=args.host, as_json=args.json))


def _backends(args: argparse.Namespace) -> int:
    from statefleet.backends import print_backends

    return asyncio.run(print_backends(args.nats_url, as_json=args.json))


def _admit_calc(args: argparse.Namespace) -> int:
    from libs import admissibility as adm

    try:
        move = adm.Transfer(state_bytes=args.state_bytes, dirty_rate_bps=args.dirty_rate,
                        horizon_s=args.horizon_ms / 1e3, bandwidth_bps=adm.gbps(args.bandwidth_gbps),
                        setup_s=args.setup_ms / 1e3, codec_ratio=args.codec_ratio, codec_s=args.codec_ms / 1e3)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    print(json_out.dumps(adm.evaluate(move).as_json(), indent=0))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="statefleet", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="embedded NATS, all services and engine hosts, supervised")
    up.add_argument("--data-dir", default="var", help="where NATS data and logs go (default ./var)")
    up.add_argument("--nats-url", default="", help="use this NATS instead of starting one")
    up.add_argument("--engines", type=int, default=2, help="engine hosts to start (default 2)")
    up.add_argument("--device", default="cpu", help="device for engine hosts: cpu, or cuda to use cuda:0..N-1")
    up.add_argument("--autoscale", type=_min_max, default=None, metavar="MIN:MAX",
                    help="let placement start and stop engine hosts with the load, between MIN and MAX "
                         "(replaces --engines; docs/fleet.md)")
    up.set_defaults(func=_up)

    auth = sub.add_parser("nats-auth", help="per-service NATS users and permissions for a production server")
    auth.add_argument("--out", required=True, help="directory for auth.conf, credentials.json and <user>.env")
    auth.add_argument("--engine-host", action="append", default=[], help="an engine host id (repeat per host)")
    auth.set_defaults(func=_nats_auth)

    serve = sub.add_parser("serve", help="run one service in the foreground")
    serve.add_argument("service", choices=sorted(SERVICES))
    serve.add_argument("--config", default=None, help="TOML config file (env SF_* overrides it)")
    serve.add_argument("--nats-url", default="", help="overrides the config's nats_url")
    serve.set_defaults(func=_serve)

    status = sub.add_parser("status", help="the fleet as read from the bus")
    status.add_argument("--nats-url", default="", help="default: $SF_NATS_URL, ./var/nats.url, then :4222")
    status.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    status.add_argument("--all", action="store_true", help="list closed sessions too (JSON always has them)")
    status.set_defaults(func=_status)

    engines = sub.add_parser("engines", help="engine hosts' sessions and serving metrics (rtf, periods, latency)")
    engines.add_argument("--nats-url", default="", help="default: $SF_NATS_URL, ./var/nats.url, then :4222")
    engines.add_argument("--host", default="", help="only this engine host")
    engines.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    engines.set_defaults(func=_engines)

    backends = sub.add_parser("backends", help="the backends each engine host can serve (from its heartbeat)")
    backends.add_argument("--nats-url", default="", help="default: $SF_NATS_URL, ./var/nats.url, then :4222")
    backends.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    backends.set_defaults(func=_backends)

    calc = sub.add_parser("admit-calc", help="admissibility of one state move (Worldline §4), as JSON")
    calc.add_argument("--state-bytes", type=float, required=True, help="state size S in bytes")
    calc.add_argument("--dirty-rate", type=float, required=True, help="dirty rate D in bytes/s (0: stop-and-copy)")
    calc.add_argument("--horizon-ms", type=float, required=True, help="horizon H in milliseconds")
    calc.add_argument("--bandwidth-gbps", type=float, required=True, help="path bandwidth B in Gb/s (1e9 bit/s)")
    calc.add_argument("--setup-ms", type=float, default=0.0, help="fixed per-move setup cost X")
    calc.add_argument("--codec-ratio", type=float, default=1.0, help="codec wire/state ratio r (1: no codec)")
    calc.add_argument("--codec-ms", type=float, default=0.0, help="codec time Y")
    calc.set_defaults(func=_admit_calc)

    from statefleet import hosts, session

    session.add_parser(sub)
    hosts.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except StatefleetError as e:
        print(f"statefleet: {e.detail}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
