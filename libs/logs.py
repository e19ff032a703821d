"""structlog JSON logging with bound context (session_id, server_id, version, move_id)."""

from __future__ import annotations

import logging
import sys

import structlog


def setup(level: str = "info", *, json: bool = True) -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format="%(message)s")
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def bind(**ctx: object) -> None:
    """Bind context for the current task (contextvars), e.g. bind(session_id=sid, version=3)."""
    structlog.contextvars.bind_contextvars(**ctx)
