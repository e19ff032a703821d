"""Control items sent over a peer connection's data channel, into fence's ingress.

Each text (or binary) message is one item, exactly as on the input WebSocket
(`{"kind", "data", "id"?}`), and goes through the same `Ingress.submit`: the session's token,
the envelope, the backend's kinds and size, the pending-items bound, then a durable store. Each is
answered in order with `{"ack": {"seq", "duplicate"?, "id"?}}` or `{"ack": {"error": <problem>, "id"?}}`
(the item's id echoed where it had one). At most WS_WINDOW items are unanswered at once, as on the
socket; one beyond that is answered 429 (busy) in its turn and not stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
import structlog

from libs import errors
from libs.tasks import STOP_TIMEOUT_S, cancel_and_wait
from services.fence.ingress import WS_WINDOW, Ingress, _answer
from services.fence.problems import problem_body

_log = structlog.get_logger("statefleet.fence.rtc")
_ids = msgspec.json.Decoder(dict)


class ChannelInput:
    def __init__(self, ingress: Ingress, session_id: str, token: str, send: Callable[[str], None]) -> None:
        self.ingress, self.session_id, self.token, self.send = ingress, session_id, token, send
        self.unanswered = 0
        self._bodies: asyncio.Queue[tuple[bytes, errors.StatefleetError | None]] = asyncio.Queue()
        self._answers: asyncio.Queue[tuple[str | None, asyncio.Future | errors.StatefleetError]] = asyncio.Queue()
        self._tasks = [asyncio.create_task(self._submit()), asyncio.create_task(self._answer())]

    def message(self, data: str | bytes) -> None:
        body = data.encode() if isinstance(data, str) else bytes(data)
        self.unanswered += 1
        refused = None
        if self.unanswered > WS_WINDOW:  # answered in its turn, with its id, and never submitted
            refused = errors.Busy(f"{WS_WINDOW} items are unanswered on this channel; wait for their answers",
                                  retry_after_s=1)
        self._bodies.put_nowait((body, refused))

    async def _submit(self) -> None:
        """Items validated and queued for storing in the order they came."""
        while True:
            body, refused = await self._bodies.get()
            item_id = _item_id(body)
            answer: errors.StatefleetError | asyncio.Future[Any]
            if refused is not None:
                answer = refused
            else:
                try:
                    answer = await self.ingress.submit(self.session_id, self.token, body)
                except errors.StatefleetError as e:
                    answer = e
                except Exception:
                    _log.exception("rtc_input_failed", session_id=self.session_id)
                    answer = errors.Internal("internal error")
            await self._answers.put((item_id, answer))

    async def _answer(self) -> None:
        while True:
            item_id, answer = await self._answers.get()
            try:
                reply = _answer(await answer) if isinstance(answer, asyncio.Future) else {"error": problem_body(answer)}
            except errors.StatefleetError as e:
                reply = {"error": problem_body(e)}
            if item_id is not None:
                reply["id"] = item_id
            self.unanswered -= 1
            self.send(msgspec.json.encode({"ack": reply}).decode())

    async def close(self) -> None:
        """Stop answering; items already queued for storing are still stored (their futures run on)."""
        await cancel_and_wait(self._tasks, timeout_s=STOP_TIMEOUT_S)


def _item_id(body: bytes) -> str | None:
    try:
        value = _ids.decode(body).get("id")
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, str) and len(value) <= 128 else None
