"""`statefleet host list | drain HOST | undrain HOST`: engine-host lifecycle, asked of placement over NATS.

`drain` answers once every session is off the host and prints each session's outcome:
moved (live, through the mover), handed_over (checkpoint + replay, because its live move
was inadmissible or failed), no_room or failed (the session stays; the host stays draining).
"""

from __future__ import annotations

import asyncio
import json

import msgspec

from libs import bus, names
from libs.schemas.placement import DrainReport, HostInfo, HostList, HostRequest, HostsRequest
from statefleet.status import default_nats_url

DRAIN_TIMEOUT_S = 300.0


async def _ask(nats_url: str, subject: str, msg, reply_type, timeout_s: float = 5.0):
    nc = await bus.connect(nats_url or default_nats_url(), name="statefleet-host")
    try:
        return await bus.request(nc, subject, msg, reply_type, timeout_s=timeout_s)
    finally:
        await nc.close()


def _print_hosts(hosts: list[HostInfo]) -> None:
    print(f"{'host':<14} {'state':<9} {'incarnation':<17} {'sessions':>8} {'reserved':>8} {'busy':>5}")
    for h in hosts:
        print(f"{h.host_id:<14} {h.state:<9} {h.incarnation or '-':<17} {h.sessions:>8} {h.reserved:>8} "
              f"{h.busy_fraction:>5.2f}")


async def run(args) -> int:
    if args.verb == "list":
        listed = await _ask(args.nats_url, names.PLACEMENT_HOSTS, HostsRequest(), HostList)
        if args.json:
            print(json.dumps(msgspec.to_builtins(listed), indent=2))
        else:
            _print_hosts(listed.hosts)
        return 0
    if args.verb == "undrain":
        info = await _ask(args.nats_url, names.PLACEMENT_UNDRAIN, HostRequest(host_id=args.host), HostInfo)
        print(json.dumps(msgspec.to_builtins(info)) if args.json else f"{info.host_id} {info.state}")
        return 0
    report = await _ask(args.nats_url, names.PLACEMENT_DRAIN, HostRequest(host_id=args.host), DrainReport,
                        timeout_s=args.timeout_s)
    if args.json:
        print(json.dumps(msgspec.to_builtins(report), indent=2))
    else:
        for o in report.outcomes:
            print(f"{o.session_id:<34} {o.outcome:<12} {o.dest or '-':<14} {o.detail}")
        print(f"{report.host_id} {report.state}; {report.remaining} sessions left on it")
    return 0 if report.remaining == 0 else 1


def add_parser(sub) -> None:
    p = sub.add_parser("host", help="engine hosts: list (up/draining/drained/dead), drain, undrain")
    verbs = p.add_subparsers(dest="verb", required=True)
    for verb, help_ in (("list", "every engine host placement knows, with its state and incarnation"),
                        ("drain", "stop placing on HOST and move every session off it; prints each outcome"),
                        ("undrain", "let HOST take sessions again")):
        v = verbs.add_parser(verb, help=help_)
        if verb != "list":
            v.add_argument("host")
        if verb == "drain":
            v.add_argument("--timeout-s", type=float, default=DRAIN_TIMEOUT_S, help="how long to wait for the drain")
        v.add_argument("--nats-url", default="", help="default: $SF_NATS_URL, ./var/nats.url, then :4222")
        v.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda args: asyncio.run(run(args)))
