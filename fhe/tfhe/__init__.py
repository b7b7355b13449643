"""TFHE through concrete-python: the backend (``backend.py``), the recipe and pre-flight
(``recipe.py``), the encrypted-vs-clear comparison (``compare.py``) and the search for the first
diverging node (``divergence.py``). Importing this package imports no FHE library; its modules
import concrete-python only."""

from __future__ import annotations

import ctypes
import signal


def restore_sigpipe() -> None:
    """Put back Python's SIGPIPE disposition (ignored: a write to a closed socket or pipe raises
    BrokenPipeError). The first encrypted run starts Concrete's runtime (HPX), which installs a
    SIGPIPE handler that aborts the whole process instead: a client hanging up, or `fhe compare |
    head`, would kill it with a stack trace. Through libc, so it works from any thread."""
    ctypes.CDLL(None).signal(int(signal.SIGPIPE), ctypes.c_void_p(int(signal.SIG_IGN)))
