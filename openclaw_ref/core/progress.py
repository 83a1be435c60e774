"""Progress bars on stderr, drawn only when stderr is a terminal: a log file or a pipe gets no
bar (tqdm's carriage returns would garble it), only the lines its owner writes.

Invariant: a bar never creates a multiprocessing lock. tqdm's default lock holds a named POSIX
semaphore, and a rank ends with ``os._exit`` (a wedged group cannot be torn down), so its
finalizer never ran and the resource tracker warned of a "leaked semaphore" at the end of every
spawned run. One process draws its own bars, so a thread lock is enough.
"""

from __future__ import annotations

import sys
import threading
from typing import Any


def progress_bar(**kwargs: Any) -> Any:
    """A tqdm bar on stderr (``kwargs`` as tqdm's), disabled unless stderr is a terminal."""
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    return tqdm(file=sys.stderr, disable=not sys.stderr.isatty(), **kwargs)
