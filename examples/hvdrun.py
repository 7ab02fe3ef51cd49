"""Run a Python script under ``horovodrun --gloo`` and collect what each rank reports, via files.

Support code of the examples, the tests and the benchmarks, not part of the package: they put
``examples/`` on ``sys.path`` (the examples run from here). Launcher side (tests,
``examples/demo.py``, the benchmarks)::

    from hvdrun import run_script
    out = run_script("train.py", np=2, args=["--epochs", "3"], timeout=300)
    out.results[0]       # rank 0's records, in the order it wrote them
    out.outputs[1].stderr

Rank side (the script)::

    from hvdrun import result
    result(accuracy=0.91, step_ms=12.5)   # one JSON record, appended to <dir>/rank<R>.jsonl

Why files: horovodrun multiplexes every rank's stdout into one stream and forwards it in chunks
of at most 1000 bytes, so under load a long ``RESULT {json}`` line of one rank can arrive cut
by another rank's output. Here every rank appends its records to its own file in a fresh
directory (the launcher passes it in :data:`RESULTS_ENV`), and horovodrun's
``--output-filename`` keeps each rank's stdout and stderr apart, so a failure or a time-out
shows the tail of each rank's stderr. A launch either returns every rank's records or raises
:class:`LaunchError`; it never waits longer than its ``timeout``.

:func:`progress`: a tqdm bar that stays readable under horovodrun (one line per interval);
:func:`compression_figures`: what its postfix shows of the compression (bytes ratio, sparsity).

No torch or TensorFlow import here: the launcher side runs in drivers that do not load a
framework. With ``HVDRUN_FORK=1`` horovodrun starts from a fork server that imported one Horovod
extension (:func:`start_horovodrun`: its Gloo check then costs nothing instead of a TensorFlow
import).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Mapping, Optional, Sequence

from tqdm import tqdm

RESULTS_ENV = "HVDCOMPRESS_RESULTS_DIR"
"""Environment variable naming the directory each rank writes ``rank<R>.jsonl`` into."""

TAIL_CHARS = 3000
"""How much of each rank's stderr a :class:`LaunchError` shows."""

LOG_TAIL_CHARS = 1000
"""How much of horovodrun's own output it shows: the end says which rank failed first, or why
horovodrun could not start."""

TERMINATE_GRACE_S = 15.0
"""After a time-out: how long horovodrun gets to stop its ranks (it gives each 5 s) before
it and any rank still alive are killed."""


def write_hosts(path: str | os.PathLike, slots: int) -> None:
    """Offer ``localhost:<slots>`` to an elastic job's host discovery that reads ``path``
    (examples/discover_hosts.sh): the file is written beside it, then renamed over it, never
    truncated and written in place. A discovery that read it empty in between would see every
    host removed, and Horovod would have the old ranks skip the state sync of the reset that a
    new rank then joins (horovod/horovod#3494), a deadlock."""
    path = Path(path)
    written = path.with_name(path.name + ".new")
    written.write_text(f"localhost:{slots}\n")
    os.replace(written, path)


# ---- rank side ------------------------------------------------------------------------------------
def write_result(rank: int, values: Mapping[str, Any]) -> None:
    """Append one record ``{"rank": rank, **values}`` for the launcher of this process.

    Under :func:`run_script` (:data:`RESULTS_ENV` set) the record is one JSON line appended to
    ``<dir>/rank<rank>.jsonl`` with a single unbuffered ``write``: each rank owns its file, so
    records are never interleaved, whatever their size. Without a launcher (a script run by
    hand) the record is printed as ``RESULT {json}`` on stdout for a person to read.
    """
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative int, got {rank!r}")
    line = json.dumps({"rank": rank, **values}) + "\n"
    directory = os.environ.get(RESULTS_ENV)
    if not directory:
        print("RESULT " + line, end="", flush=True)
        return
    data = line.encode()
    fd = os.open(os.path.join(directory, f"rank{rank}.jsonl"),
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while data:  # a regular file takes it in one write; loop only on a short write
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def result(**values: Any) -> None:
    """:func:`write_result` for this process's Horovod rank (``HOROVOD_RANK``, set by horovodrun;
    0 when the script runs alone, without a launcher)."""
    rank = os.environ.get("HOROVOD_RANK")
    if rank is None and os.environ.get(RESULTS_ENV):
        raise RuntimeError(f"{RESULTS_ENV} is set but HOROVOD_RANK is not: start this script "
                           "with horovodrun (hvdrun.run_script), or pass the rank "
                           "to write_result")
    write_result(int(rank or 0), values)


class _Lines:
    """A file for tqdm that writes each refresh of the bar as one line: horovodrun prefixes every
    line of a rank's output, so tqdm's carriage returns would make one ever-growing line."""

    def __init__(self, stream: IO[str]):
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip()
        if text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


class _LineBar(tqdm):
    """tqdm without a terminal: ``set_postfix`` only records the figures, and the next line
    (at most one per ``mininterval``, and the last at close) shows them. tqdm's own
    ``set_postfix`` redraws at every call, one line per step under horovodrun."""

    def set_postfix(self, ordered_dict=None, refresh: bool = False, **kwargs: Any) -> None:
        super().set_postfix(ordered_dict, refresh=False, **kwargs)


def progress(total: int, stream: Optional[IO[str]] = None, interval_s: float = 10.0,
             **kwargs: Any) -> tqdm:
    """A tqdm progress bar on ``stream`` (default stderr): redrawn in place on a terminal; under
    horovodrun or into a file (not a terminal), one line at most every ``interval_s`` seconds
    (``set_postfix`` does not add lines there). ``kwargs`` go to tqdm (``desc``, ``disable``,
    ``ncols``...)."""
    stream = sys.stderr if stream is None else stream
    if stream.isatty():
        return tqdm(total=total, file=stream, **kwargs)
    return _LineBar(total=total, file=_Lines(stream), mininterval=interval_s, **kwargs)


def compression_figures(total_bytes: Any, sparsity: Optional[float] = None) -> dict:
    """The figures of a compressed run for a progress line: the bytes ratio so far (dense / sent
    gradient bytes of this rank, from a front end's ``total_bytes``, a
    :class:`hvdcompress.ByteCount`-like object with ``dense`` and ``sent``), and the sparsity
    only for a compressor that has one (``SparsityScheduler.get_sparsity()`` is None for the
    others: a quantiser's "sparsity 0" says nothing)."""
    figures = {}
    dense, sent = getattr(total_bytes, "dense", 0), getattr(total_bytes, "sent", 0)
    if sent:
        figures["bytes"] = f"{dense / sent:.1f}x fewer"
    if sparsity is not None:
        figures["sparsity"] = f"{sparsity:.4f}"
    return figures


def figures_text(figures: Mapping[str, str]) -> str:
    """``compression_figures`` as ``", bytes 32.0x fewer, sparsity 0.9990"`` (empty if none)."""
    return "".join(f", {key} {value}" for key, value in figures.items())


# ---- launcher side --------------------------------------------------------------------------------
@dataclass
class RankOutput:
    """What one rank printed."""

    stdout: str
    stderr: str


@dataclass
class Launch:
    """A finished launch: ``results[r]`` holds rank r's records in the order it wrote them."""

    results: list[list[dict]]
    outputs: list[RankOutput]
    log: str
    seconds: float

    @property
    def records(self) -> list[dict]:
        """Every record, ordered by rank, then by the order each rank wrote them."""
        return [rec for per_rank in self.results for rec in per_rank]


class LaunchError(RuntimeError):
    """horovodrun exited non-zero or ran past its time-out. The message holds the tail of each
    rank's stderr; ``outputs`` and ``log`` (horovodrun's own output) hold everything, ``results``
    each rank's records written before it stopped (``Launch.results``' form)."""

    def __init__(self, message: str, returncode: Optional[int], timed_out: bool,
                 outputs: list[RankOutput], log: str, results: Optional[list[list[dict]]] = None):
        super().__init__(message)
        self.returncode = returncode
        self.timed_out = timed_out
        self.outputs = outputs
        self.log = log
        self.results = results if results is not None else []

    @property
    def combined_output(self) -> str:
        """Every rank's stdout then stderr, rank by rank, then horovodrun's own output."""
        parts = [f"{o.stdout}{o.stderr}" for o in self.outputs]
        return "".join(parts) + self.log


def horovodrun_path() -> Path:
    """The ``horovodrun`` installed next to the running Python (the same environment)."""
    return Path(sys.executable).parent / "horovodrun"


def read_results(directory: str | os.PathLike, np: int) -> list[list[dict]]:
    """Every rank's records from ``<directory>/rank<R>.jsonl`` (``[]`` for a rank that wrote none)."""
    per_rank = []
    for rank in range(np):
        path = Path(directory) / f"rank{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        records = []
        for i, line in enumerate(lines):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {i + 1} is not one JSON record ({e}): "
                                 f"{line[:200]!r}") from None
        per_rank.append(records)
    return per_rank


def _rank_outputs(output_dir: Path, np: int) -> list[RankOutput]:
    """Each rank's stdout and stderr from horovodrun's ``--output-filename`` directory, whose
    per-rank folders are ``rank.<R>`` with R zero-padded to the width of ``np - 1``, without the
    ``[R]<stream>:`` horovodrun puts before every line (and after every ``\r``)."""
    found = {int(d.name.split(".", 1)[1]): d for d in output_dir.glob("rank.*") if d.is_dir()}

    def text(rank: int, stream: str) -> str:
        path = found[rank] / stream if rank in found else None
        raw = path.read_text(errors="replace") if path and path.exists() else ""
        return re.sub(rf"(?m)(?:^|(?<=\r))\[{rank}\]<{stream}>:", "", raw)
    return [RankOutput(text(r, "stdout"), text(r, "stderr")) for r in range(np)]


def _tails(outputs: list[RankOutput], log: str) -> str:
    """The end of each rank's stderr, and of horovodrun's own output."""
    parts = []
    for rank, out in enumerate(outputs):
        tail = out.stderr[-TAIL_CHARS:] or "(empty)\n"
        parts.append(f"--- rank {rank} stderr (last {TAIL_CHARS} chars) ---\n{tail}")
    parts.append(f"--- horovodrun's own output (last {LOG_TAIL_CHARS} chars) ---\n"
                 f"{log[-LOG_TAIL_CHARS:] or '(empty)'}")
    return "\n".join(parts)


def _environ_has(pid: str, entry: bytes) -> bool:
    """Whether process ``pid``'s environment holds ``entry`` (``NAME=value``)."""
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours
        return False


def _kill_strays(results_dir: Path) -> None:
    """Kill any rank of this launch still alive: horovodrun's middlemen put each rank in its own
    session, so they are found by the unique results directory in their environment."""
    if not Path("/proc").is_dir():
        return
    entry = f"{RESULTS_ENV}={results_dir}".encode()
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        if _environ_has(pid, entry):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def _stop(proc: subprocess.Popen, results_dir: Path) -> None:
    """SIGTERM to horovodrun (it then stops its ranks), SIGKILL to whatever is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()
    _kill_strays(results_dir)


# ---- starting horovodrun ----------------------------------------------------------------------------
class _Forked:
    """The part of :class:`subprocess.Popen` the launchers use, for a forked horovodrun."""

    def __init__(self, process) -> None:
        self._process = process
        self.pid = process.pid

    @property
    def returncode(self) -> Optional[int]:
        return self._process.exitcode

    def poll(self) -> Optional[int]:
        return self._process.exitcode

    def wait(self, timeout: Optional[float] = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired("horovodrun", timeout)
        return self._process.exitcode


def _horovodrun_main(argv: list, env: dict, log_path: Optional[str]) -> None:
    """The forked horovodrun: a session of its own (the launcher kills the group), the given
    environment and output, then horovodrun's own entry point with ``argv``."""
    os.setsid()
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    if log_path is not None:
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
    sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = argv
    from horovod.runner.launch import run_commandline
    sys.exit(run_commandline())


_SERVER: dict = {}


def start_horovodrun(args: Sequence[str], env: Mapping[str, str], log_path: Optional[Path]):
    """``horovodrun *args`` started in a session of its own, its output into ``log_path`` (None:
    this process's); returns a :class:`subprocess.Popen` or its equivalent (pid, wait, poll,
    returncode).

    By default this runs the ``horovodrun`` command. Every horovodrun first checks that Horovod
    was built with Gloo by importing a framework extension, TensorFlow's first, in a forked
    process: 3-4 s of a launch here. With ``HVDRUN_FORK=1`` (the tests set it: they launch
    ~35 times), horovodrun's own entry point (what the command runs, with the same arguments)
    is started instead from a fork server that imported the extension once
    (:mod:`multiprocessing`'s forkserver, one per launcher process), and the check's fork
    inherits it. As with any forkserver, each child first imports the launcher's ``__main__``
    (as ``__mp_main__``): use it where ``__main__`` is a module (``python -m pytest``) or a
    script whose work sits under ``if __name__ == "__main__":``."""
    horovodrun = horovodrun_path()
    if not horovodrun.exists():
        raise FileNotFoundError(f"no horovodrun next to {sys.executable} (is Horovod installed "
                                "in this environment?)")
    if os.environ.get("HVDRUN_FORK", "0") != "1":
        streams = {} if log_path is None else {"stdout": open(log_path, "w"), "stderr": subprocess.STDOUT}
        try:
            return subprocess.Popen([str(horovodrun), *args], env=dict(env), stdin=subprocess.DEVNULL,
                                    start_new_session=True, **streams)
        finally:
            if streams:
                streams["stdout"].close()
    import importlib.util
    import multiprocessing

    first = "context" not in _SERVER
    if first:
        context = multiprocessing.get_context("forkserver")
        framework = "tensorflow" if importlib.util.find_spec("tensorflow") else "torch"
        context.set_forkserver_preload(["horovod.runner.launch", f"horovod.{framework}"])
        _SERVER["context"] = context
    process = _SERVER["context"].Process(
        target=_horovodrun_main, args=(["horovodrun", *args], dict(env), None if log_path is None else str(log_path)))
    # the first start also starts the server, with this environment: its TensorFlow import
    # without the banner
    quiet = first and "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    if quiet:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    try:
        process.start()
    finally:
        if quiet:
            del os.environ["TF_CPP_MIN_LOG_LEVEL"]
    return _Forked(process)


def run_script(script: str | os.PathLike, np: int = 2, args: Sequence[Any] = (),
               timeout: float = 300.0, env: Optional[Mapping[str, str]] = None,
               echo: bool = False) -> Launch:
    """Run ``python script *args`` as ``np`` (>= 2) Horovod ranks: ``horovodrun -np np -H
    localhost:np --gloo`` with the horovodrun and Python of this environment; return every
    rank's records.

    The ranks get this process's environment, ``OMP_NUM_THREADS=1``, ``PYTHONUNBUFFERED=1``,
    then ``env`` (which wins), and :data:`RESULTS_ENV` naming a fresh directory (removed
    afterwards). ``echo`` shows horovodrun's live output on this process's stdout/stderr (the
    demo's progress bars); otherwise it is kept in ``Launch.log``. Raises :class:`LaunchError`
    when horovodrun exits non-zero, or after ``timeout`` seconds (the ranks are then killed),
    with the tail of each rank's stderr in the message.
    """
    if not isinstance(np, int) or np < 2:
        # horovodrun 0.28.1 --output-filename fails for one process (log10(0) padding the rank)
        raise ValueError(f"np must be an int >= 2 (number of ranks), got {np!r}; run a single "
                         "process without horovodrun")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    work = Path(tempfile.mkdtemp(prefix="hvdcompress-launch-"))
    try:
        results_dir, output_dir = work / "results", work / "output"
        results_dir.mkdir()
        cmd = ["-np", str(np), "-H", f"localhost:{np}", "--gloo",
               "--output-filename", str(output_dir), sys.executable, str(script), *map(str, args)]
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                    **(env or {}), RESULTS_ENV: str(results_dir)}
        log_path = work / "horovodrun.log"
        log_path.touch()
        start = time.monotonic()
        proc = start_horovodrun(cmd, full_env, None if echo else log_path)
        try:
            proc.wait(timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # also on KeyboardInterrupt: leave no rank behind
            if proc.poll() is None:
                _stop(proc, results_dir)
        seconds = time.monotonic() - start
        log = log_path.read_text(errors="replace")
        outputs = _rank_outputs(output_dir, np)
        what = f"horovodrun -np {np} {script}"
        try:
            results = read_results(results_dir, np)
        except ValueError:   # a rank stopped in a record: the launch's own error below says why
            if not timed_out and proc.returncode == 0:
                raise
            results = []
        if timed_out:
            raise LaunchError(f"{what} timed out after {timeout:g} s (a rank hung or was too "
                              f"slow); all ranks were killed.\n{_tails(outputs, log)}",
                              None, True, outputs, log, results)
        if proc.returncode != 0:
            raise LaunchError(f"{what} failed (exit code {proc.returncode}).\n"
                              f"{_tails(outputs, log)}", proc.returncode, False, outputs, log, results)
        return Launch(results, outputs, log, seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
