"""examples/hvdrun.py, the launcher of the tests, examples and benchmarks: per-rank result files,
stderr tails on failure, bounded waits, a progress bar that reads well under horovodrun.

The horovodrun tests run tiny framework-free scripts (no hvd.init: horovodrun only starts them
with HOROVOD_RANK set), so they take seconds, not the minutes a torch import costs here.
"""
from __future__ import annotations

import io
import json
import random
import re
import textwrap
import time
from pathlib import Path

import pytest
from conftest import run_horovod, run_horovod_failing
from hvdrun import (
    RESULTS_ENV,
    TERMINATE_GRACE_S,
    LaunchError,
    progress,
    read_results,
    result,
    run_script,
    write_result,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

RECORD_CHARS = 50_000


def script(tmp_path, body: str) -> str:
    path = tmp_path / "probe.py"
    path.write_text(f"import os, sys, time\nsys.path.insert(0, {str(EXAMPLES)!r})\n"
                    "from hvdrun import result\n"
                    "rank = int(os.environ['HOROVOD_RANK'])\n" + textwrap.dedent(body))
    return str(path)


def payload(rank: int, i: int) -> str:
    """A record body the test can rebuild: pseudo-random letters, different per rank and record."""
    rng = random.Random(1000 * rank + i)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(RECORD_CHARS))


# ---- the progress bar ----------------------------------------------------------------------------
class Pipe(io.StringIO):
    """What horovodrun gives a rank: not a terminal."""

    def isatty(self) -> bool:
        return False


def test_progress_writes_whole_lines_when_not_on_a_terminal():
    out = Pipe()
    bar = progress(5, stream=out, interval_s=0, desc="dgc")
    for _ in range(5):
        bar.update()
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) >= 5 and all(line.startswith("dgc") for line in lines)
    assert "5/5" in lines[-1]


def test_progress_redraws_in_place_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True
    out = Terminal()
    bar = progress(3, stream=out, mininterval=0)
    bar.update(3)
    bar.close()
    assert "\r" in out.getvalue()


# ---- rank side, in this process --------------------------------------------------------------------
def test_write_result_appends_one_json_line_per_call(tmp_path, monkeypatch):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path))
    write_result(1, {"a": 1})
    write_result(1, {"b": [1.5, "x" * 100_000]})
    lines = (tmp_path / "rank1.jsonl").read_text().splitlines()
    assert [json.loads(l) for l in lines] == [{"rank": 1, "a": 1}, {"rank": 1, "b": [1.5, "x" * 100_000]}]
    assert read_results(tmp_path, 3) == [[], [json.loads(l) for l in lines], []]


def test_result_takes_the_rank_from_horovodrun(tmp_path, monkeypatch):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path))
    monkeypatch.setenv("HOROVOD_RANK", "2")
    result(x=3)
    assert read_results(tmp_path, 3)[2] == [{"rank": 2, "x": 3}]
    monkeypatch.delenv("HOROVOD_RANK")
    with pytest.raises(RuntimeError, match="HOROVOD_RANK is not"):
        result(x=4)


def test_without_a_launcher_the_record_is_printed(monkeypatch, capsys):
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    monkeypatch.delenv("HOROVOD_RANK", raising=False)
    result(acc=0.5)
    assert capsys.readouterr().out == 'RESULT {"rank": 0, "acc": 0.5}\n'


def test_a_cut_record_is_reported_with_its_file_and_line(tmp_path):
    (tmp_path / "rank0.jsonl").write_text('{"rank": 0}\n{"rank": 0, "x": [1, 2\n')
    with pytest.raises(ValueError, match=r"rank0.jsonl line 2 is not one JSON record"):
        read_results(tmp_path, 1)


@pytest.mark.parametrize("kwargs, message", [({"np": 1}, "np must be an int >= 2"),
                                             ({"timeout": 0}, "timeout must be > 0")])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_script("x.py", **kwargs)


# ---- under horovodrun ------------------------------------------------------------------------------
@pytest.mark.horovod
@pytest.mark.parametrize("fork", ["1", "0"])
def test_the_forked_horovodrun_and_the_command_give_the_same_launch(tmp_path, monkeypatch, fork):
    """horovodrun's entry point from the fork server (HVDRUN_FORK=1, the tests' setting) and the
    horovodrun command (the default): the same ranks, environment and records, and the exit code
    of a failure. One launch each (the command takes ~20 s to start here): the last rank exits 5
    once the others' records are written (a bounded wait), so every record arrives and the
    launch fails."""
    monkeypatch.setenv("HVDRUN_FORK", fork)
    path = script(tmp_path, f"""
        result(size=int(os.environ["HOROVOD_SIZE"]), mine=os.environ["HVDRUN_PROBE"], fork=os.environ["HVDRUN_FORK"])
        if rank == 2:
            others = [os.path.join(os.environ[{RESULTS_ENV!r}], f"rank{{r}}.jsonl") for r in (0, 1)]
            deadline = time.monotonic() + 60
            while not all(os.path.exists(p) for p in others) and time.monotonic() < deadline:
                time.sleep(0.05)
            sys.exit(5)
    """)
    with pytest.raises(LaunchError) as info:
        run_script(path, np=3, env={"HVDRUN_PROBE": "x7"}, timeout=120)
    assert info.value.returncode != 0 and not info.value.timed_out
    assert info.value.results == [[{"rank": r, "size": 3, "mine": "x7", "fork": fork}] for r in range(3)]


@pytest.mark.horovod
def test_large_records_come_back_intact_while_ranks_flood_stdout(tmp_path):
    # Each rank writes 3 records of 50 kB while both flood the shared stdout with long lines:
    # the stream horovodrun multiplexes would cut and interleave them, the files do not.
    path = script(tmp_path, f"""
        import random
        def payload(i):
            rng = random.Random(1000 * rank + i)
            return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range({RECORD_CHARS}))
        for i in range(3):
            print(str(rank) * 30_000, flush=True)
            result(i=i, text=payload(i))
    """)
    launch = run_script(path, np=2, timeout=120)
    for rank in (0, 1):
        assert [r["i"] for r in launch.results[rank]] == [0, 1, 2]
        for r in launch.results[rank]:
            assert r == {"rank": rank, "i": r["i"], "text": payload(rank, r["i"])}
        assert str(rank) * 30_000 in launch.outputs[rank].stdout  # stdout kept apart per rank
    # the tests' wrapper: one flat list, by rank then by record order
    flat = run_horovod(path, np=2, timeout=120)
    assert [(r["rank"], r["i"]) for r in flat] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


@pytest.mark.horovod
def test_a_failing_rank_shows_its_stderr_tail(tmp_path):
    path = script(tmp_path, """
        if rank == 1:
            print("noise\\n" * 5000 + "rank 1 gives up: marker-7f3a", file=sys.stderr, flush=True)
            sys.exit(3)
        time.sleep(600)  # horovodrun stops rank 0 when rank 1 fails, long before the timeout
    """)
    with pytest.raises(LaunchError) as info:
        run_script(path, np=2, timeout=120)
    err = info.value
    assert not err.timed_out and err.returncode != 0
    message = str(err)
    rank1 = message.index("--- rank 1 stderr")
    assert "marker-7f3a" in message[rank1:]
    assert "failed (exit code" in message
    assert len(message) < 4 * 3000 + 1000  # tails, not whole outputs
    assert "marker-7f3a" in err.outputs[1].stderr and "marker-7f3a" not in err.outputs[0].stderr
    # the tests' wrapper for scripts expected to fail returns every rank's output
    assert "rank 1 gives up: marker-7f3a" in run_horovod_failing(path, np=2)


@pytest.mark.horovod
def test_a_rank_that_fails_in_the_middle_of_a_record_still_gives_the_launch_error(tmp_path):
    """The cut record of a failed launch is dropped: the error says why the launch failed, not
    that a record does not parse."""
    path = script(tmp_path, f"""
        with open(os.path.join(os.environ[{RESULTS_ENV!r}], f"rank{{rank}}.jsonl"), "a") as f:
            f.write('{{"rank": ' + str(rank))   # no end: the rank stops in its record
        print("rank gives up: marker-c07", file=sys.stderr, flush=True)
        sys.exit(3)
    """)
    with pytest.raises(LaunchError) as info:
        run_script(path, np=2, timeout=120)
    assert info.value.returncode != 0 and info.value.results == []
    assert "marker-c07" in str(info.value)


@pytest.mark.horovod
def test_a_hang_ends_at_the_timeout_with_a_clear_message(tmp_path):
    path = script(tmp_path, """
        result(before="the hang")   # kept: a long benchmark keeps the methods that finished
        print(f"pid {os.getpid()}: rank {rank} about to hang", file=sys.stderr, flush=True)
        time.sleep(600)
    """)
    timeout = 10  # horovodrun starts these light ranks in 1-2 s here (2 cores, during the suite)
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        run_script(path, np=2, timeout=timeout)
    elapsed = time.monotonic() - start
    err = info.value
    assert err.timed_out and err.returncode is None
    assert err.results == [[{"rank": r, "before": "the hang"}] for r in (0, 1)]
    assert elapsed < timeout + TERMINATE_GRACE_S + 10, elapsed
    message = str(err)
    assert f"timed out after {timeout} s" in message
    for rank in (0, 1):
        assert f"rank {rank} about to hang" in message[message.index(f"--- rank {rank} stderr"):]
    pids = [int(re.search(r"pid (\d+): rank", o.stderr).group(1)) for o in err.outputs]
    deadline = time.monotonic() + 5  # SIGKILL was sent; give the kernel a moment to deliver it
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(running, pids)), "the hung ranks were left running"


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
