"""Ranks forked from a server that imported the framework once: ~5 s of CPU less per rank.

Every rank of a multi-process test is a fresh Python process that imports its framework (torch
with ``torch._dynamo``, which the first optimizer imports, and ``horovod.torch``: about 5 s of CPU
here; TensorFlow and ``horovod.tensorflow``: about 6 s), most of a short launch's work. With
``HVDC_ZYGOTE=1`` (the tests set it) the launchers start, as each rank, ``python tests/zygote.py
run SCRIPT ARGS...``: a client of ~30 ms that hands its argv, its environment, its working
directory and its stdin/stdout/stderr (file descriptors, over a Unix socket) to a server that
imported :data:`PRELOAD` (not hvdcompress: each rank imports the code under test itself). The
server forks; the child takes the client's environment and streams, runs the script as
``__main__`` (``runpy``), runs the exit handlers registered since the fork (Horovod's shutdown,
the exit barrier) and exits; the client exits with the child's status. Everything a launch does
stays real: horovodrun or torchrun, one process per rank, ``hvd.init()`` or
``init_process_group`` in the child.

What a fresh interpreter reads at start-up is redone in the child: ``PYTHONPATH`` (``sys.path``),
``OMP_NUM_THREADS`` (``torch.set_num_threads``), ``PYTHONUNBUFFERED``, ``PYTHONWARNINGS``,
``PYTHONFAULTHANDLER``, and a test's :data:`STACKS_AT_ENV` (every thread's stack printed then,
before the test kills a launch that hangs); Python's and numpy's global random state are drawn
afresh. The hash seed cannot be: two servers with different seeds serve the even and the odd
ranks, so that neighbouring ranks still iterate sets in different orders, as separate processes
would.

Bounds: the client's death (horovodrun's or torchrun's SIGTERM to the rank, the launcher's
SIGKILL of strays, or its own parent's death: ``PR_SET_PDEATHSIG``) closes its socket, and the
server kills the child at once; the server exits when the process that started it (a pytest
worker) is gone.
"""
from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ENABLE = "HVDC_ZYGOTE"
SOCKETS = "HVDC_ZYGOTE_SOCKETS"   # the servers' socket paths, ':'-separated (set for the ranks)
HERE = Path(__file__).resolve()
_servers: dict = {}   # kind -> the socket paths of its two servers

#: epoch seconds at which a forked rank prints every thread's stack: a test sets it a little before
#: it kills a launch that hangs (tests/hvd/common.STACKS_AT_ENV, the same name, for scripts run
#: without the servers)
STACKS_AT_ENV = "HVDCOMPRESS_TEST_STACKS_AT"


# ---- launcher side -------------------------------------------------------------------------------
#: what each kind of server imports before it forks (a script that names TensorFlow gets "tf")
PRELOAD = {
    "torch": ["torch", "torch._dynamo", "torch.distributed.algorithms.ddp_comm_hooks",
              "torch.distributed.fsdp", "horovod.torch", "numpy"],
    "tf": ["tensorflow", "horovod.tensorflow", "numpy"],
}


def command(script: str | os.PathLike, args: list, env: dict) -> tuple[list, dict]:
    """``(argv after the interpreter, env)`` that runs ``script args`` as a rank: through the
    servers of its kind when ``HVDC_ZYGOTE=1``, else as it is."""
    kind = _kind(Path(script))
    if os.environ.get(ENABLE) != "1" or kind is None:
        return [str(script), *map(str, args)], env
    if kind not in _servers:
        _servers[kind] = _start(kind, env)
    return [str(HERE), "run", str(script), *map(str, args)], {**env, SOCKETS: ":".join(_servers[kind])}


def module_command(module: str, args: list, env: dict) -> tuple[list, dict]:
    """:func:`command` for ``python -m module args`` (torchrun: ``torch.distributed.run``)."""
    argv, env = command(importlib.util.find_spec(module).origin, args, env)
    if argv[0] != str(HERE):
        return ["-m", module, *map(str, args)], env
    return [str(HERE), "run", "-m", module, *map(str, args)], env


def _kind(script: Path) -> Optional[str]:
    """The server a script's ranks fork from: "tf" for one that names TensorFlow (or a tf_*.py
    that runs others), "torch" for one that names torch, where that framework is installed;
    None (a plain process) otherwise."""
    text = script.read_text()
    kind = "tf" if script.name.startswith("tf_") or "tensorflow" in text else "torch" if "torch" in text else None
    return kind if kind is not None and importlib.util.find_spec(PRELOAD[kind][0]) is not None else None


def _start(kind: str, env: dict) -> list:
    """Start two servers of ``kind`` (hash seeds 1 and 2); their socket paths, once they listen
    (60 s at most)."""
    work = Path(tempfile.mkdtemp(prefix=f"hvdc-zygote-{kind}-"))
    started = []
    for seed in (1, 2):
        path = work / f"server{seed}.sock"
        server_env = {**os.environ, **env, "PYTHONHASHSEED": str(seed), "OMP_NUM_THREADS": "1"}
        started.append((str(path), subprocess.Popen(
            [sys.executable, str(HERE), "serve", kind, str(path), str(os.getpid())],
            env=server_env, stdin=subprocess.DEVNULL, start_new_session=True)))
    deadline = time.monotonic() + 60
    while not all(Path(p).exists() for p, _ in started):
        if time.monotonic() > deadline or any(proc.poll() is not None for _, proc in started):
            raise RuntimeError(f"the {kind} rank servers of tests/zygote.py did not start within 60 s in {work}")
        time.sleep(0.1)
    return [p for p, _ in started]


# ---- rank side: the client -----------------------------------------------------------------------
def client(argv: list) -> int:
    """Hand this rank to a server (even ranks to the first, odd to the second); its exit status."""
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG: gone with the process that started it
    paths = os.environ[SOCKETS].split(":")
    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("RANK", "0")))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(paths[rank % len(paths)])
    message = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(conn, [struct.pack("!I", len(message)) + message], [0, 1, 2])
    status = b""
    while len(status) < 4:
        chunk = conn.recv(4 - len(status))
        if not chunk:
            return 70   # the server went away
        status += chunk
    return struct.unpack("!i", status)[0]


# ---- the server ----------------------------------------------------------------------------------
def _receive(conn: socket.socket) -> tuple:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    size = struct.unpack("!I", data[:4])[0]
    while len(data) < 4 + size:
        data += conn.recv(4 + size - len(data))
    return json.loads(data[4:4 + size]), fds


def serve(kind: str, path: str, parent: int) -> None:
    """Import ``kind``'s modules, then fork one child per client until ``parent`` is gone."""
    for module in PRELOAD[kind]:
        importlib.import_module(module)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    os.replace(path + ".new", path)
    children: dict = {}   # pid -> the client's connection
    while os.getppid() == parent:
        readable, _, _ = select.select([listener, *children.values()], [], [], 0.2)
        for conn in readable:
            if conn is listener:
                client_conn, _ = listener.accept()
                request, fds = _receive(client_conn)
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in children.values():
                        other.close()
                    _child(client_conn, request, fds)   # never returns
                for fd in fds:
                    os.close(fd)
                children[pid] = client_conn
            else:   # a client closed: its rank was killed
                pid = next(p for p, c in children.items() if c is conn)
                _kill(pid)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                code = os.waitstatus_to_exitcode(status)
                try:
                    conn.sendall(struct.pack("!i", code if code >= 0 else 128 - code))
                except OSError:
                    pass
                conn.close()
    for pid in children:
        _kill(pid)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _child(conn: socket.socket, request: dict, fds: list) -> None:
    """Become the rank: the client's streams, environment, directory and argv; run the script."""
    import atexit
    import faulthandler
    import io
    import random
    import runpy
    import threading
    import traceback
    import warnings

    import numpy as np

    conn.close()
    os.setsid()   # a session, hence a scheduling autogroup, of its own, as horovodrun gives each rank
    atexit._clear()   # the server's handlers are not the rank's
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    env = request["env"]
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=unbuffered, line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, line_buffering=True)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)   # with SOCKETS: a launcher forked here (torchrun) forks its ranks too
    argv = list(request["argv"])
    module = argv[1] if argv[0] == "-m" else None   # python -m module: the directory first, as Python puts it
    if module is not None:
        argv = [importlib.util.find_spec(module).origin, *argv[2:]]
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd() if module else os.path.dirname(os.path.abspath(argv[0])), *extra,
                   *[p for p in sys.path[1:] if p not in extra and p != str(HERE.parent)]]
    sys.argv = argv
    if env.get("OMP_NUM_THREADS", "").isdigit() and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
    if env.get("PYTHONWARNINGS"):
        warnings.simplefilter(env["PYTHONWARNINGS"])
    if env.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    if env.get(STACKS_AT_ENV):   # a test's kill time: every thread's stack first
        faulthandler.dump_traceback_later(max(1.0, float(env[STACKS_AT_ENV]) - time.time()))
    random.seed()
    np.random.seed()
    code = 0
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    except BaseException:
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()   # as an uncaught exception sets them
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()   # what the interpreter does at exit: wait for non-daemon threads,
        atexit._run_exitfuncs()  # then the exit handlers
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "run":
        sys.exit(client(sys.argv[2:]))
