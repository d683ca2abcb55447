"""One OpenTelemetry trace per rollout, when an OTLP endpoint is configured by the standard
variables; only then is `opentelemetry` imported (the `otel` extra). Otherwise every span of
`RolloutSpans` is a no-op, so a run without a collector pays nothing and needs no package. A
process that set up its own tracer provider keeps it. The spans and how the context reaches the
agent and the gateway: docs/observability.md#the-spans."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..contract import TRACEPARENT_PATTERN

if TYPE_CHECKING:
    from .._batch import RolloutOutcome
    from .._results.buffer import Delivery

TRACEPARENT = "traceparent"
_TRACEPARENT = re.compile(TRACEPARENT_PATTERN)
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_SCOPE = "agentcore_rollout"
_FLUSH_MILLIS = 5000  # a collector that is down holds the engine's close this long at most


def configured() -> bool:
    """Whether this process exports traces: an OTLP endpoint set, the SDK not disabled."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(os.environ.get(name, "").strip() for name in _ENDPOINTS)


def tracer(service: str) -> Any | None:
    """This process's tracer when `configured()`, else None (nothing imported). Without a
    tracer provider of the process's own, the SDK's is set up, named `service` unless
    `OTEL_SERVICE_NAME` names it."""
    if not configured():
        return None
    from opentelemetry import trace

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        _install(service)
    return trace.get_tracer(_SCOPE)


def _install(service: str) -> None:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service}
    provider = TracerProvider(resource=Resource.create(named))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


async def flush() -> None:
    """Export the spans still batched (at engine close), off the event loop, for at most
    `_FLUSH_MILLIS`."""
    if not configured():
        return
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if hasattr(provider, "force_flush"):
        await asyncio.to_thread(provider.force_flush, _FLUSH_MILLIS)


def checked_traceparent(value: Any) -> str | None:
    """`value` if it is None or a well-formed `traceparent`; else ValueError, one line."""
    if value is None or (isinstance(value, str) and _TRACEPARENT.match(value)):
        return value
    raise ValueError("traceparent must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")


def traceparent_of(span: Any) -> str | None:
    """The W3C `traceparent` naming `span` as the parent."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT)


def current_headers() -> dict[str, str]:
    """The `traceparent` header of the current span, when configured and inside one."""
    if not configured():
        return {}
    from opentelemetry import trace

    span = trace.get_current_span()
    if not span.get_span_context().is_valid:
        return {}
    header = traceparent_of(span)
    return {TRACEPARENT: header} if header else {}


def parent(traceparent: str | None) -> Any:
    """The OpenTelemetry context whose span `traceparent` names (None: a new trace)."""
    if traceparent is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({TRACEPARENT: traceparent})


@contextmanager
def child_span(
    tracer: Any, name: str, traceparent: str | None, attributes: dict[str, Any]
) -> Iterator[Any]:
    """A current span `name`, the child of `traceparent` (the agent's and the gateway's)."""
    with tracer.start_as_current_span(name, parent(traceparent), attributes=attributes) as span:
        yield span


def _ns(unix: float) -> int:
    return int(unix * 1e9)


class RolloutSpans:
    """One request's spans, begun at submit (`submitted_at`), ended once with its outcome.
    With no tracer, every method does nothing."""

    def __init__(self, tracer: Any | None, attributes: dict[str, Any], submitted_at: float):
        self._tracer = tracer
        self._open: dict[str, Any] = {}
        self._attempts = 0
        if tracer is None:
            return
        from opentelemetry import trace

        at = _ns(submitted_at)
        self._root = tracer.start_span("rollout", attributes=attributes, start_time=at)
        self._context = trace.set_span_in_context(self._root)
        self._begin("queue", at)

    def _begin(self, name: str, at: int | None = None, **attributes: Any) -> None:
        start = time.time_ns() if at is None else at
        span = self._tracer.start_span(name, self._context, attributes=attributes, start_time=start)
        self._open[name] = span

    def _end(self, name: str, at: float | None = None, **attributes: Any) -> None:
        span = self._open.pop(name, None)
        if span is not None:
            span.set_attributes(attributes)
            span.end(None if at is None else _ns(at))

    @property
    def traceparent(self) -> str | None:
        """The root's `traceparent` (the gateway session's parent for turns sent without one)."""
        return None if self._tracer is None else traceparent_of(self._root)

    def attempt(self) -> str | None:
        """A start attempt is being sent: the first ends `queue` and begins `session.start`
        and `agent`, a later one is a retry. The `agent` span's traceparent, for the agent."""
        if self._tracer is None:
            return None
        self._attempts += 1
        if self._attempts == 1:
            self._end("queue")
            self._begin("session.start")
            self._begin("agent")
        else:
            self._open["session.start"].add_event("retry", {"attempt": self._attempts})
        return traceparent_of(self._open["agent"])

    def started(self, endpoint: str) -> None:
        """The session started, on `endpoint`."""
        self._end("session.start", endpoint=endpoint, attempts=self._attempts)

    def delivered(self, delivery: Delivery) -> None:
        """The buffer's delivery: the agent's span ends where its result was written, and the
        `result` span runs from there to the delivery; `handoff` begins."""
        if self._tracer is None:
            return
        result, handed = delivery.result, delivery.handed_off_at
        written = min(result.timings.finished, handed) if result is not None else handed
        began = getattr(self._open.get("agent"), "start_time", None)  # None: not sampled
        written = max(written, began / 1e9) if began is not None else written
        self._end("agent", written)
        self._begin("result", _ns(written), via=delivery.via)
        self._end("result", handed, valid=result is not None)
        self._begin("handoff", _ns(handed))

    def ended(self, outcome: RolloutOutcome | None) -> None:
        """The outcome is built: every open span ends, the root with what it says (None: the
        request's task was cancelled before it had one)."""
        if self._tracer is None:
            return
        from opentelemetry.trace import StatusCode

        for name in list(self._open):
            self._end(name)
        root = self._root
        if outcome is None:
            root.set_status(StatusCode.ERROR, "cancelled before its outcome")
            root.end()
            return
        root.set_attributes(_outcome_attributes(outcome))
        if outcome.error:
            root.set_status(StatusCode.ERROR, outcome.error[:256])
        root.end()


UNTRACED = RolloutSpans(None, {}, 0.0)
"""The spans of every request while OpenTelemetry is not configured: none."""


def _outcome_attributes(outcome: RolloutOutcome) -> dict[str, Any]:
    cost = outcome.cost
    found = {
        "outcome": outcome.outcome.value,
        "error_kind": outcome.error.split(":", 1)[0][:64] if outcome.error else None,
        "reward": outcome.reward,
        "cost_usd": cost.usd if cost is not None else None,
        "sandbox_seconds": cost.sandbox_seconds if cost is not None else None,
        "prompt_tokens": cost.prompt_tokens if cost is not None else None,
        "completion_tokens": cost.completion_tokens if cost is not None else None,
        "gateway_session_id": outcome.gateway_session_id,
    }
    return {f"rollout.{k}": v for k, v in found.items() if v is not None}
