"""Ctrl-C during a call that waits in C.

Python runs its SIGINT handler between bytecodes only, so a call waiting in
the C library for a peer (that crashed, hangs, or never calls) would hold
KeyboardInterrupt until its deadline: a minute by default, a gloo group's
30 minutes under from_process_group. A watcher thread learns of SIGINT
through signal.set_wakeup_fd. When the main thread is still inside an
arbiter call a moment later (so Python could not raise KeyboardInterrupt
itself), the watcher aborts that call's communicator: the call returns
ABORTED, KeyboardInterrupt follows at once, and the peers learn that this
rank aborted, as after abort().

Installed on the first communicator made in the main thread, where no
wakeup fd is set already (asyncio's event loop sets one; then Ctrl-C waits
for the deadline as before). It acts only while SIGINT raises
KeyboardInterrupt (Python's default handler), and only on a call that was
already waiting when the signal came (see MIN_CALL_AGE_SECONDS). The call
path only notes when each call began.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

# How long Python gets to raise KeyboardInterrupt by itself: a main thread
# that is in arbiter's Python code (not waiting in C) leaves it by then.
GRACE_SECONDS = 0.1
# How long a call must have run when the watcher sees the signal: a younger
# one may have started after Python raised (and the program caught) a
# KeyboardInterrupt for it, while this thread waited for the CPU. A call
# left alone that way ends at its deadline, or at the next Ctrl-C.
MIN_CALL_AGE_SECONDS = 0.1

_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Starts the watcher once per process, where it can work (see above)."""
    global _installed
    with _install_lock:
        if _installed or threading.current_thread() is not threading.main_thread():
            return
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(read_fd)
            os.close(write_fd)
            return
        if previous != -1:  # someone else's: leave it
            signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
            return
        _installed = True
        threading.Thread(target=_watch, args=(read_fd,), name="arbiter-sigint",
                         daemon=True).start()


def _watch(read_fd: int) -> None:
    main = threading.main_thread()
    while True:
        try:
            signals = os.read(read_fd, 256)
        except OSError:
            return
        if not signals:
            return
        # Only where SIGINT still raises KeyboardInterrupt: a handler set
        # since (a graceful shutdown, asyncio's) decides for itself.
        if signal.SIGINT not in signals or \
                signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            continue
        # The call the main thread is in now: aborted only if it began well
        # before this thread saw the signal and is the same call after the
        # grace (not one made after a KeyboardInterrupt the program caught).
        seen_at = time.monotonic()
        before = _call_frame(main)
        if before is None:
            continue
        time.sleep(GRACE_SECONDS)
        comm = _waiting_communicator(main, before)
        del before
        if comm is None or seen_at - comm._call_started < MIN_CALL_AGE_SECONDS:
            continue
        print(f"arbiter: Ctrl-C while rank {comm.rank}'s call waited on its peers: aborting "
              "the communicator (abort()), so that KeyboardInterrupt is raised now",
              file=sys.stderr, flush=True)
        try:
            comm.abort()
        except Exception:  # closed meanwhile: nothing waits any more
            pass


def _call_frame(main: threading.Thread):
    """The main thread's innermost frame when it is arbiter's, else None."""
    frame = sys._current_frames().get(main.ident)
    if frame is None or not frame.f_globals.get("__name__", "").startswith("arbiter"):
        return None
    return frame


def _waiting_communicator(main: threading.Thread, before):
    """The communicator whose call the main thread is still in: the same
    frame as `before` (held, so no new frame can take its place)."""
    from .communicator import Communicator

    frame = _call_frame(main)
    if frame is not before:
        return None
    local = frame.f_locals
    for name in ("comm", "self"):
        candidate = local.get(name)
        # Held for every call (and empty()): the C call is in progress.
        if isinstance(candidate, Communicator) and candidate._lock.locked():
            return candidate
    return None


def _forget_in_child() -> None:
    # The child has no watcher thread; its first communicator installs one.
    global _installed
    if _installed:
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:  # forked from another thread: left as it is
            return
        _installed = False


os.register_at_fork(after_in_child=_forget_in_child)
