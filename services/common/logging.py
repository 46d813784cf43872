"""structlog set-up: one JSON object per line on stderr, one line per event.

Call `configure(service)` once at a server's entry point; modules get their
logger with `get_logger(__name__)`.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure(service: str, level: str = "INFO") -> None:
    """Send structured JSON lines for `service` to stderr at `level`."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"log level {level!r} is unknown")
    logging.basicConfig(stream=sys.stderr, level=numeric, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)


class _Stderr:
    """Whatever sys.stderr is at write time (pytest swaps it between tests)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """A structlog logger tagged with the module name."""
    return structlog.get_logger(module=name)
