"""GrammarWorkerPool: a few grammar worker processes (compile_worker.py); a worker that dies fails one request.

llguidance is native code: a hostile schema can overflow its stack (a segfault kills the whole process, with no log
line). Compiling in child processes turns that into a ValueError for the one request whose grammar was being
compiled; the dead worker is replaced by a fresh one on its next use. Workers are started on first use (most engines
never see a grammar) and each runs one compile at a time.
"""

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import jaxpaged
from jaxpaged.sampling.grammar.worker_protocol import read_frame, write_frame

NUM_GRAMMAR_WORKERS = 2
"""Grammar worker processes per engine: compiles of different constraints run side by side, and one slow compile
leaves another worker for the next request."""
COMPILE_TIMEOUT_S = 60.0
"""Longest a worker may spend on one constraint; past it the worker is killed and the request refused."""
_START_TIMEOUT_S = 120.0
"""How long a new worker may take to import llguidance and build the tokenizer."""


class GrammarWorkerCrash(ValueError):
    """The worker died or overran COMPILE_TIMEOUT_S on this constraint (the message says which)."""


class GrammarWorker:
    """One compile_worker child process and its pipes; start() again after it died."""

    def __init__(self, tokenizer_spec: tuple[str, int, list[int]], env: Optional[dict[str, str]] = None) -> None:
        """tokenizer_spec: (the Hugging Face tokenizer JSON, vocab size, EOS ids); env: extra variables (tests)."""
        self._tokenizer_spec = tokenizer_spec
        self._env = env
        self.process: Optional[subprocess.Popen] = None

    def start(self) -> None:
        """Starts the child and waits until it has built its tokenizer."""
        # The child imports the same jaxpaged as this process (not whichever one its working directory holds).
        package_root = str(Path(jaxpaged.__file__).resolve().parent.parent)
        python_path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
        self.process = subprocess.Popen([sys.executable, "-m", "jaxpaged.sampling.grammar.compile_worker"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env={**os.environ, "PYTHONPATH": python_path, **(self._env or {})})
        reply = self._call(self._tokenizer_spec, _START_TIMEOUT_S)
        if reply[0] != "ready":
            raise RuntimeError(f"grammar worker failed to start: {reply}")

    def compile(self, key: tuple) -> tuple[str, str]:
        """("ok", grammar) or ("error", why) for a constraint key; GrammarWorkerCrash if the worker died on it."""
        if self.process is None or self.process.poll() is not None:
            self.start()
        return self._call(key, COMPILE_TIMEOUT_S)

    def stop(self) -> None:
        """Ends the child (closing its stdin is enough; a stuck one is killed)."""
        process, self.process = self.process, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            process.wait(2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _call(self, message: Any, timeout_s: float) -> Any:
        process = self.process
        assert process is not None and process.stdin is not None and process.stdout is not None
        reply: list[Any] = []
        # The read blocks; a thread lets this one give up at the deadline (a stuck compile holds no lock here).
        reader = threading.Thread(target=lambda: reply.append(_read_or_none(process)), daemon=True)
        try:
            write_frame(process.stdin, message)
        except (BrokenPipeError, OSError):
            pass  # it died before reading: the reply below is None and says why
        reader.start()
        reader.join(timeout_s)
        if reader.is_alive() or not reply or reply[0] is None:
            timed_out = reader.is_alive()
            self.stop()
            returncode = process.wait()
            raise GrammarWorkerCrash(f"the grammar engine took longer than {COMPILE_TIMEOUT_S:g} s on this "
                                     f"constraint" if timed_out else
                                     f"the grammar engine crashed on this constraint ({_exit_reason(returncode)})")
        return reply[0]


def _read_or_none(process: subprocess.Popen) -> Any:
    try:
        assert process.stdout is not None
        return read_frame(process.stdout)
    except (OSError, ValueError, EOFError):
        return None


def _exit_reason(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


class GrammarWorkerPool:
    """NUM_GRAMMAR_WORKERS GrammarWorkers; compile() borrows an idle one (thread-safe, blocks while all are busy)."""

    def __init__(self, tokenizer_spec: tuple[str, int, list[int]], num_workers: int = NUM_GRAMMAR_WORKERS,
                 env: Optional[dict[str, str]] = None) -> None:
        self._workers = [GrammarWorker(tokenizer_spec, env) for _ in range(num_workers)]
        # Last in, first out: the worker used last (already started) takes the next compile; another one starts
        # only while it is busy.
        self._idle: queue.LifoQueue[GrammarWorker] = queue.LifoQueue()
        for worker in reversed(self._workers):
            self._idle.put(worker)
        self.num_crashes = 0
        """Workers lost to a crash or a timeout so far."""
        self.num_compiles = 0
        """Constraints sent to a worker so far."""

    def compile(self, key: tuple) -> tuple[str, str]:
        """("ok", grammar) or ("error", why); GrammarWorkerCrash (a ValueError) when the worker died on it."""
        worker = self._idle.get()
        try:
            self.num_compiles += 1
            return worker.compile(key)
        except GrammarWorkerCrash:
            self.num_crashes += 1
            raise
        finally:
            self._idle.put(worker)

    def close(self) -> None:
        """Stops every worker (an idle pool holds no processes again until its next compile)."""
        for worker in self._workers:
            worker.stop()

    def processes(self) -> list[subprocess.Popen]:
        """The workers' live processes (tests)."""
        return [w.process for w in self._workers if w.process is not None and w.process.poll() is None]

