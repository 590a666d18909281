"""A forked worker whose messages the parent reads until a hard deadline, then kills it.

egglog 13.2 cannot interrupt a running iteration, so a hard time bound needs a process
boundary: the search runs in a child forked from the optimizing process (it inherits the
seeded e-graph; nothing is re-built), sends picklable messages through a pipe, and is killed
with SIGKILL when the parent stops waiting. fork() only: where it is missing (Windows) or
unsafe to use, the caller runs the search in-process.
"""
from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import struct
import sys
import threading
import time
import warnings
from collections.abc import Callable

_HEADER = struct.Struct("!Q")


def available() -> bool:
    """fork() exists and is the platform's well-tested start method (Linux)."""
    return hasattr(os, "fork") and sys.platform.startswith("linux")


class WorkerDied(RuntimeError):
    """The worker exited without saying it was done (a crash or the OOM killer)."""


class Worker:
    """`work(send)` runs in a forked child; the parent calls `recv(until)` and finally `stop()`.

    A reader thread in the parent empties the pipe as messages arrive, so the child never
    blocks on a full pipe while the parent is busy with other work (the caller's thread keeps
    the e-graph, which egglog binds to the thread that made it).
    """

    def __init__(self, work: Callable[[Callable[[object], None]], None]):
        r, w = os.pipe()
        # Freeze every object alive now: the child's garbage collector then never touches (so
        # never copies) the parent's heap pages (0.15 s on a small graph), and never runs a
        # finalizer of the parent's garbage, which may wait on a lock some other thread of the
        # parent held at fork time (seen as a hang). Nested in frozen_heap(), the outer block
        # unfreezes; otherwise the parent unfreezes right after the fork.
        outer = _frozen_here or gc.get_freeze_count() > 0
        gc.freeze()
        try:
            with warnings.catch_warnings():  # Python 3.12 warns about fork() with threads alive
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            if not outer:
                gc.unfreeze()
            os.close(r)
            os.close(w)
            raise
        if pid != 0 and not outer:
            gc.unfreeze()
        if pid == 0:  # the child: never returns into the caller's stack
            os.close(r)
            code = 0
            try:
                work(lambda msg: _write(w, msg))
            except BaseException as e:  # noqa: BLE001 - every failure goes to the parent
                code = 1
                with contextlib.suppress(BaseException):  # the parent sees WorkerDied instead
                    _write(w, ("error", _picklable(e)))
            finally:
                os._exit(code)
        os.close(w)
        self.pid, self.fd, self.buf, self.eof = pid, r, bytearray(), False
        self.arrived = threading.Condition()
        self.reader = threading.Thread(target=self._read, name="optimus_egg-worker-pipe", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 1 << 20)
            except OSError:
                chunk = b""
            with self.arrived:
                self.buf += chunk
                self.eof = not chunk
                self.arrived.notify_all()
            if not chunk:
                return

    def recv(self, until: float) -> object | None:
        """The next message, or None when `until` (perf_counter time) passes first."""
        with self.arrived:
            while True:
                if len(self.buf) >= _HEADER.size:
                    (n,) = _HEADER.unpack_from(self.buf)
                    if len(self.buf) >= _HEADER.size + n:
                        body = bytes(self.buf[_HEADER.size:_HEADER.size + n])
                        del self.buf[:_HEADER.size + n]
                        return pickle.loads(body)
                if self.eof:
                    raise WorkerDied("the search worker exited without a result")
                left = until - time.perf_counter()
                if left <= 0:
                    return None
                self.arrived.wait(left)

    def stop(self) -> None:
        """Kill the child (if still running); a daemon thread reaps it, and closes the pipe once
        the reader sees it close (the kernel's teardown of a big child takes ~10 ms, which the
        caller need not wait for)."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        threading.Thread(target=self._reap, name="optimus_egg-worker-reap", daemon=True).start()

    def _reap(self) -> None:
        os.waitpid(self.pid, 0)
        self.reader.join()
        os.close(self.fd)


@contextlib.contextmanager
def frozen_heap():
    """Keep the cyclic garbage collector out of the way for a while: every object alive now is
    moved out of its reach, and collections are paused until the block ends.

    The optimizer builds ~10^5 short-lived, nearly all acyclic objects per 10,000 FX nodes.
    Each full collection would rescan the whole torch heap, and even with that frozen, the
    collections the optimizer's own objects trigger took ~0.4 s of a 4 s optimize on the
    10,000-node bench graph (measured side by side, 4 runs each). The few cycles made inside
    (FX nodes) are collected after the block. A forked worker inherits both settings. Nested
    use freezes once (gc.freeze/unfreeze are process-wide), and a heap someone else froze
    stays frozen.
    """
    global _frozen_here
    if _frozen_here or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    was_enabled = gc.isenabled()
    gc.disable()
    _frozen_here = True
    try:
        yield
    finally:
        _frozen_here = False
        if was_enabled:
            gc.enable()
        gc.unfreeze()


# Whether frozen_heap() froze the heap (and will unfreeze it). gc.get_freeze_count() answers
# the same question but walks every frozen object: ~25 ms inside a 1,000-node optimize.
_frozen_here = False


def _write(fd: int, msg: object) -> None:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    data = _HEADER.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _picklable(e: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(e).__name__}: {e}")
