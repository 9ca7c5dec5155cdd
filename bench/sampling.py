"""A measure taken every few tenths of a second on a thread of its own while a block runs."""

from __future__ import annotations

import threading


class PeriodicSampler:
    """Calls `sample()` at the block's start, every `interval` seconds while it runs, and once
    more at its end."""

    def __init__(self, interval: float):
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)

    def __enter__(self) -> "PeriodicSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _loop(self) -> None:
        self.sample()
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        raise NotImplementedError
