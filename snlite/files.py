"""Every file snlite writes (a program, parameters, JSON, a plot, a trace, a snapshot, the paper's
report) is written whole or not at all: into a temporary file in the same folder, then renamed over
the name asked for. An interrupted or failed write (Ctrl-C, a full disk, an error half-way through a
figure) leaves the file that was there before as it was, never half of a new one.

A symbolic link is written through (the file it names is replaced, the link stays), and a path that
is not a regular file (``/dev/null``, ``/dev/stdout``, a named pipe) is written into directly: there
is nothing there to rename over, and replacing it would destroy a device.

Standard output is written too: :func:`main` runs a command so that a reader who goes away
(``| head``) ends it quietly, as ``cat`` does, not with a traceback.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import select
import shutil
import stat
import sys

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a command whose reader went away


@contextlib.contextmanager
def replacing(path, mode: str = "w"):
    """Open a temporary file next to ``path`` for writing (``mode`` "w" or "wb"); when the block ends
    normally, rename it to ``path`` (replacing any file there); when it raises, delete it. The new file
    gets the permissions of the file it replaces, or those ``open()`` would give it (0666 less the
    umask). A link is followed; a device or a pipe is written into, as ``open()`` would."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode {mode!r}: a file is replaced as text ('w') or bytes ('wb')")
    path = os.path.expanduser(os.fspath(path))
    if os.path.exists(path) and not os.path.isfile(path):  # a device or a pipe (isfile follows links)
        with open(path, mode) as f:
            yield f
        return
    path = os.path.realpath(path)  # a link to a file (or to a file yet to be): that file is replaced
    folder = os.path.dirname(path)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        if os.path.exists(path):  # keep its permissions (a 0600 file stays private)
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def copy_into(source, path) -> None:
    """The file ``source`` copied over ``path`` as :func:`replacing` writes it: whole or not at all,
    through a link, keeping the replaced file's permissions (a folder of files made elsewhere, moved
    into place: ``snlite paper``'s)."""
    with open(source, "rb") as src, replacing(path, "wb") as f:
        shutil.copyfileobj(src, f)


def write_text(path, text: str) -> None:
    """``text`` as the whole of the file ``path``, replacing it only once it is all written."""
    with replacing(path, "w") as f:
        f.write(text)


def main(command) -> int:
    """``command()``'s exit status, or :data:`EXIT_BROKEN_PIPE`, said nothing, where the reader of
    standard output went away (``python -m snlite.assignments list | head``)."""
    try:
        try:
            status = command()
        except SystemExit as e:  # argparse's --help, and its usage errors: printed, still to flush
            status = e.code
        sys.stdout.flush()  # here, not at exit, where a closed pipe could only be reported, not ignored
        return status
    except BrokenPipeError:
        if not _reader_gone():  # another pipe broke (a subprocess's): an error like any other
            raise
        discard_stdout()
        return EXIT_BROKEN_PIPE


def _reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll says so; where there is no poll,
    as on Windows, it is taken to be)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll, or no real standard output
        return True


def discard_stdout() -> None:
    """Point standard output at /dev/null, so that flushing it at exit cannot fail again."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (a test's capture): nothing will flush it at exit
