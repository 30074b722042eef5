"""Every file snlite writes (a program, parameters, JSON, a plot, a trace, a snapshot, the paper's
report) is written whole or not at all: into a temporary file in the same folder, then renamed over
the name asked for. An interrupted or failed write (Ctrl-C, a full disk, an error half-way through a
figure) leaves the file that was there before as it was, never half of a new one.
"""
from __future__ import annotations

import contextlib
import os
import secrets


@contextlib.contextmanager
def replacing(path, mode: str = "w"):
    """Open a temporary file next to ``path`` for writing (``mode`` "w" or "wb"); when the block ends
    normally, rename it to ``path`` (replacing any file there); when it raises, delete it. The new file
    gets the permissions ``open()`` would give it (0666 less the umask)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode {mode!r}: a file is replaced as text ('w') or bytes ('wb')")
    path = os.path.expanduser(os.fspath(path))
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path, text: str) -> None:
    """``text`` as the whole of the file ``path``, replacing it only once it is all written."""
    with replacing(path, "w") as f:
        f.write(text)
