"""Progress bars that suit where they are shown: tqdm's bar on a terminal; in a log (stderr not a
terminal: CI, ``make demo > log``, a notebook's captured output) one plain line at most every
:data:`LOG_INTERVAL_S` seconds, never thousands of carriage-return updates."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

LOG_INTERVAL_S = 30.0


class _Lines:
    """A file for tqdm that turns each refresh (``\\r`` + text) into one line."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip()
        if text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(enabled: bool = True, **kwargs) -> tqdm:
    """``tqdm(**kwargs)``, off when not ``enabled``, line-based when stderr is not a terminal."""
    if not enabled:
        return tqdm(disable=True, **kwargs)
    if sys.stderr.isatty():
        return tqdm(**kwargs)
    return tqdm(
        file=_Lines(sys.stderr),
        mininterval=LOG_INTERVAL_S,
        maxinterval=LOG_INTERVAL_S,
        ascii=True,
        dynamic_ncols=False,
        ncols=100,
        **kwargs,
    )
