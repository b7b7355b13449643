"""Progress bars that suit where they are shown: tqdm's bar on a terminal; in a log (stderr not a
terminal: CI, ``make demo > log``, a notebook's captured output) plain lines, the first, then at
most one every :data:`LOG_INTERVAL_S` seconds, then the last, never one per update (a bar whose
postfix changes every step refreshes every step)."""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm

LOG_INTERVAL_S = 30.0


class _Lines:
    """A file for tqdm that turns its refreshes (``\\r`` + text) into lines, at most one per
    interval."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.last: float | None = None

    def write(self, text: str, force: bool = False) -> None:
        text = text.replace("\r", "").strip()
        now = time.monotonic()
        if text and (force or self.last is None or now - self.last >= LOG_INTERVAL_S):
            self.stream.write(text + "\n")
            self.last = now

    def flush(self) -> None:
        self.stream.flush()


class _LogBar(tqdm):
    """tqdm writing throttled plain lines, and the final state when it closes."""

    def __init__(self, **kwargs) -> None:
        self._lines = _Lines(sys.stderr)
        super().__init__(file=self._lines, ascii=True, ncols=100, **kwargs)

    def close(self) -> None:
        if not self.disable and self.n:
            self._lines.write(str(self), force=True)
        super().close()


def progress_bar(enabled: bool = True, **kwargs) -> tqdm:
    """``tqdm(**kwargs)``, off when not ``enabled``, plain throttled lines when stderr is not a
    terminal."""
    if not enabled:
        return tqdm(disable=True, **kwargs)
    if sys.stderr.isatty():
        return tqdm(**kwargs)
    return _LogBar(**kwargs)
