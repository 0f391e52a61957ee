"""The console's last line under a torch elastic launcher: the launcher prints a failed child's traceback after the
child exits, so a one-line error is repeated after it by a detached process. Standard library only, so that any
module may use it."""

from __future__ import annotations

import os
import sys

__all__ = ["OneLineError", "repeat_after_launcher"]


class OneLineError(RuntimeError):
    """An error whose one-line message says all the user needs (a reward function that raised, say): a launch that
    fails with it repeats the line after the launcher's traceback (`repeat_after_launcher`), as its last line."""


# Run by `repeat_after_launcher` in a process of its own: wait until the launcher has exited (its pidfd becomes
# readable), at most argv[2] seconds, then print argv[3]. No imports beyond the standard library's `select`.
_REPEAT = """import select, sys
if select.select([int(sys.argv[1])], [], [], float(sys.argv[2]))[0]:
    sys.stderr.write(sys.argv[3] + "\\n")
"""


def repeat_after_launcher(line: str, environ=os.environ, wait_seconds: float = 300.0) -> None:
    """Under a torch elastic launcher (``accelerate launch``, ``torchrun``), print ``line`` once more after the
    launcher has exited: it follows a failed process with a ~40-line traceback that would otherwise bury the one
    useful line. A detached process (its own session, so the launcher's stop of this process's group spares it)
    waits on the launcher, this process's parent, and writes to the same stderr. Linux only (pidfd); elsewhere,
    and outside a launcher, the line is printed once, before the traceback."""
    if "TORCHELASTIC_RUN_ID" not in environ:
        return
    import subprocess

    try:
        launcher = os.pidfd_open(os.getppid())
    except (AttributeError, OSError):
        return
    try:
        subprocess.Popen(
            [sys.executable, "-S", "-c", _REPEAT, str(launcher), str(wait_seconds), line],
            pass_fds=(launcher,),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
    except OSError:
        pass  # the line was printed once already
    finally:
        os.close(launcher)
