"""`statefleet session create | send | watch | move | delete`: drive one session end to end.

create/delete speak admission's HTTP API; send speaks fence's ingress with the
session's input token; watch and move speak NATS (the session log and output
subjects, the mover's request subject). `create` keeps the token it was shown
once in `<data-dir>/sessions/<id>.json` (mode 0600) so `send` can find it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp

from libs import bus, errors, names
from libs.fence.ownership import read_owner
from libs.schemas.base import decode
from libs.schemas.engine import OutputChunk
from libs.schemas.fence import LogRecord
from libs.schemas.motion import MoveReceipt, MoveRequest
from libs.session_classes import SESSION_CLASSES
from statefleet import admin_token, init_files, json_out
from statefleet.status import default_nats_url


def _sessions_dir(data_dir: str) -> Path:
    return Path(data_dir) / "sessions"


def _saved(data_dir: str, sid: str) -> dict[str, Any]:
    path = _sessions_dir(data_dir) / f"{sid}.json"
    if not path.exists():
        raise errors.NotFound(f"no saved token for {sid} in {path.parent}; pass --token", session_id=sid)
    return json.loads(path.read_text())


async def _http(method: str, url: str, *, body: Any = None, token: str = "") -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with aiohttp.ClientSession() as http, http.request(method, url, json=body, headers=headers) as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if text else None)
    except aiohttp.ClientError as e:
        raise errors.Unavailable(f"cannot reach {url}: {e}") from None


def _fail_on_problem(status: int, body: Any) -> None:
    if status >= 400:
        detail = body.get("detail", "") if isinstance(body, dict) else str(body)
        field = f" (field {body['field']})" if isinstance(body, dict) and body.get("field") else ""
        raise errors.by_code(body.get("code", "") if isinstance(body, dict) else "")(f"HTTP {status}: {detail}{field}")


async def create(args) -> int:
    contract: dict[str, Any] = {"session_class": args.session_class, "quality_floor": args.quality_floor,
                                "determinism": args.determinism}
    if args.period_ms:
        contract["period_ms"] = args.period_ms
    if args.deadline_ms:
        contract["deadline_ms"] = args.deadline_ms
    body = {"contract": contract, "backend": args.backend, "seed": args.seed, "prompt": args.prompt}
    if args.image:
        body["image"] = init_files.read_image(args.image)
    if args.audio:
        body["audio"] = init_files.read_audio(args.audio)
    status, created = await _http("POST", f"{args.admission_url.rstrip('/')}/v1/sessions", body=body,
                                  token=admin_token.read(args.data_dir))
    _fail_on_problem(status, created)
    folder = _sessions_dir(args.data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{created['session_id']}.json"
    path.touch(mode=0o600)
    path.write_text(json.dumps(created))
    shown = {k: created[k] for k in ("session_id", "state", "host_id", "input_url", "input_ws_url",
                                     "output_ws_url")}
    print(json_out.dumps({**shown, "token_saved_to": str(path)}))
    return 0


async def send(args) -> int:
    saved = {} if (args.token and args.ingress_url) else _saved(args.data_dir, args.session_id)
    token = args.token or saved["input_token"]
    url = saved.get("input_url") or f"{args.ingress_url.rstrip('/')}/v1/sessions/{args.session_id}/items"
    try:
        data = json.loads(args.data)
    except json.JSONDecodeError:
        data = args.data  # plain text is sent as a JSON string
    status, ack = await _http("POST", url, body={"kind": args.kind, "data": data}, token=token)
    _fail_on_problem(status, ack)
    print(json_out.dumps(ack, indent=0))
    return 0


async def delete(args) -> int:
    status, body = await _http("DELETE", f"{args.admission_url.rstrip('/')}/v1/sessions/{args.session_id}",
                               token=admin_token.read(args.data_dir))
    _fail_on_problem(status, body)
    (_sessions_dir(args.data_dir) / f"{args.session_id}.json").unlink(missing_ok=True)
    print(f"deleted {args.session_id}")
    return 0


async def move(args) -> int:
    nc = await bus.connect(args.nats_url or default_nats_url(), name="statefleet-session-move")
    try:
        owner = (await read_owner(nc.jetstream(), args.session_id)).view.owner
        if owner is None:
            raise errors.NotFound(f"session {args.session_id} has no owner to move from", session_id=args.session_id)
        req = MoveRequest(session_id=args.session_id, source=owner.server_id, dest=args.to,
                          deadline_s=args.deadline_s, mode=args.mode)
        receipt = await bus.request(nc, names.MOVER_MOVE, req, MoveReceipt, timeout_s=args.deadline_s + 30)
    finally:
        await nc.close()
    print(json_out.dumps(receipt))
    return 0 if receipt.outcome == "committed" else 1


async def watch(args) -> int:
    """Print the owner `(server_id, version)` as it changes and one line per output block."""
    nc = await bus.connect(args.nats_url or default_nats_url(), name="statefleet-session-watch")
    sid = args.session_id
    done = asyncio.Event()
    blocks: set[int] = set()
    last_owner: tuple[str, int, bool] | None = None

    def show_owner(view) -> None:
        nonlocal last_owner
        if view.owner is None:
            return
        now = (view.owner.server_id, view.owner.version, view.claim == view.owner)
        if now != last_owner:
            last_owner = now
            state = "closed" if view.closed else ("claimed" if now[2] else "assigned")
            print(f"{time.strftime('%H:%M:%S')} owner {now[0]} v{now[1]} {state}", flush=True)

    async def on_log(msg) -> None:
        try:
            show_owner(decode(msg.data, LogRecord).view)
        except errors.SchemaError:
            pass

    async def on_output(chunk: OutputChunk) -> None:
        # A block regenerated after a failover (`replayed`) that was shown already is dropped; one the
        # dead host never got out is shown, marked.
        if chunk.block not in blocks and chunk.part == 0:
            blocks.add(chunk.block)
            mark = " (replayed)" if chunk.replayed else ""
            print(f"{time.strftime('%H:%M:%S')} block {chunk.block} {chunk.kind} {chunk.shape}{mark}", flush=True)
            if args.blocks and len(blocks) >= args.blocks:
                done.set()

    try:
        show_owner((await read_owner(nc.jetstream(), sid)).view)
        await nc.subscribe(names.session_log_subject(sid), cb=on_log)
        await bus.subscribe_events(nc, names.output_subject(sid), OutputChunk, on_output)
        try:
            await asyncio.wait_for(done.wait(), args.seconds or None)
        except TimeoutError:
            pass
    finally:
        await nc.close()
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("session", help="create, send to, watch, move and delete one session")
    verbs = p.add_subparsers(dest="verb", required=True)
    admission = os.environ.get("SF_ADMISSION_URL", "http://127.0.0.1:8700")

    c = verbs.add_parser("create", help="admit a session (POST /v1/sessions) and save its input token")
    c.add_argument("--backend", default="avatar", help="a backend the hosts serve (`statefleet backends`)")
    c.add_argument("--class", dest="session_class", default="C1", choices=SESSION_CLASSES)
    c.add_argument("--period-ms", type=float, default=0.0,
                   help="C1: one block per period (default: the media one block of the backend makes)")
    c.add_argument("--deadline-ms", type=float, default=0.0)
    c.add_argument("--quality-floor", type=int, default=1)
    c.add_argument("--determinism", default="T1", choices=["T0", "T1", "T2"])
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--prompt", default="")
    c.add_argument("--image", default="", help="init image: a binary PPM (P6) file, for backends that start from one")
    c.add_argument("--audio", default="", help="init audio: a 16 kHz mono 16-bit WAV file")
    c.set_defaults(run=create)

    s = verbs.add_parser("send", help="send one input item through fence's ingress")
    s.add_argument("session_id")
    s.add_argument("--kind", default="text", choices=["text", "action", "audio", "json"])
    s.add_argument("--data", required=True, help='JSON value (e.g. \'{"keys": ["w"]}\'); other text is a string')
    s.add_argument("--token", default="", help="default: the token `create` saved")
    s.add_argument("--ingress-url", default="", help="with --token: fence's ingress base URL")
    s.set_defaults(run=send)

    w = verbs.add_parser("watch", help="show the owner (server_id, version) and output blocks as they come")
    w.add_argument("session_id")
    w.add_argument("--blocks", type=int, default=0, help="stop after this many blocks (0: never)")
    w.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: never)")
    w.set_defaults(run=watch)

    m = verbs.add_parser("move", help="ask the mover to migrate the live session to another engine host")
    m.add_argument("session_id")
    m.add_argument("--to", required=True, help="destination engine host id")
    m.add_argument("--deadline-s", type=float, default=10.0, help="the move's horizon")
    m.add_argument("--mode", default="stop_and_copy", choices=["stop_and_copy", "precopy"])
    m.set_defaults(run=move)

    d = verbs.add_parser("delete", help="delete the session (ordered shutdown on its host)")
    d.add_argument("session_id")
    d.set_defaults(run=delete)

    for verb in (c, s, w, m, d):
        verb.add_argument("--admission-url", default=admission)
        verb.add_argument("--nats-url", default="", help="default: $SF_NATS_URL, ./var/nats.url, then :4222")
        verb.add_argument("--data-dir", default="var", help="where `create` keeps tokens (default ./var)")
    p.set_defaults(func=lambda args: asyncio.run(args.run(args)))
