"""Credentials in URLs, masked wherever the engine writes text: outcomes' errors, session-call
errors, log lines and their tracebacks. Done here, not at each call, because a URL with a
password reaches an error message from many places (a proxy, an endpoint URL, a library's
exception text), and the AWS SDK masks only the proxy URLs it names."""

from __future__ import annotations

import logging
import re

# user info runs to the last '@' before the host: a raw '@' in a password is masked too
_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^\s/?#'\"<>]+@")


def redact(text: str) -> str:
    """`text` with the user info of every URL in it masked: `http://***:***@proxy:3128`."""
    return _USERINFO.sub(r"\1***:***@", text) if "@" in text else text


class _Redacting(logging.Filter):
    """Masks a record's message, and its traceback, before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "@" in message:
            record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


_FILTER = _Redacting()


def get_logger(name: str) -> logging.Logger:
    """`logging.getLogger(name)`, its records redacted (a filter on a logger is not inherited
    by its children, so each of the package's loggers takes one)."""
    log = logging.getLogger(name)
    log.addFilter(_FILTER)
    return log
