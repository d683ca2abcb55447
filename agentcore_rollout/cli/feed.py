"""A run's requests submitted a window at a time: at most `window` in the engine (submitted,
not ended), the next as one ends. So a run's memory does not grow with its dataset, and
`limits.queue_timeout` counts from when a request could start, not from the run's start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable

from .. import RolloutHandle, RolloutOutcome
from .journal import Journaled


class Feed:
    """`async for outcome in Feed(jobs, submit, window)`: outcomes as they end. `close()`
    submits no more; `cancel()` also cancels what is in the engine (each ends `cancelled`).
    Jobs never submitted stay in the journal, for `--resume`."""

    def __init__(
        self, jobs: Iterable[Journaled], submit: Callable[[Journaled], RolloutHandle], window: int
    ) -> None:
        self._jobs, self._submit, self._window = iter(jobs), submit, window
        self.running: dict[asyncio.Future[RolloutOutcome], RolloutHandle] = {}
        self.closed = False

    def close(self) -> None:
        """Submit no more; what is in the engine runs on."""
        self.closed = True

    def cancel(self) -> None:
        self.close()
        for handle in self.running.values():
            handle.cancel()

    async def __aiter__(self) -> AsyncIterator[RolloutOutcome]:
        try:
            while True:
                while not self.closed and len(self.running) < self._window:
                    if (job := next(self._jobs, None)) is None:
                        break
                    handle = self._submit(job)
                    self.running[asyncio.ensure_future(handle)] = handle
                if not self.running:
                    return
                done, _ = await asyncio.wait(self.running, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    del self.running[future]
                    yield future.result()
        finally:  # the consumer stopped early (an error): nothing is left running unowned
            self.cancel()
            await asyncio.gather(*self.running, return_exceptions=True)
