"""benchmarks/e2e.py's method names, parsed without launching anything: the DDP methods
(``ddp-dense``, ``ddp-fp16``, ``ddp-powersgd``, ``ddp:<hvdcompress method>``) next to the
Horovod ones, and the reasons names that cannot run are skipped with; convergence.py's driver when
a launch fails (its launcher replaced)."""
from __future__ import annotations

import json

import pytest

from benchmarks import e2e


@pytest.mark.parametrize("method", ["dgc", "powersgd", "int8", "onebit-ef", "topk:k=0.001",
                                    "dgc-warmup", "int8-a2a"])
def test_ddp_prefix_parses_as_the_horovod_method(method):
    assert e2e.hvdc_spec(f"ddp:{method}") == e2e.hvdc_spec(method)
    assert e2e.optimizer_options(f"ddp:{method}") == e2e.optimizer_options(method)
    assert e2e.method_problem(f"ddp:{method}") is None


def test_ddp_dgc_params():
    assert e2e.hvdc_params("ddp:dgc") == {"compressor": "dgc", "sparsity": "0.999"}
    assert e2e.hvdc_params("ddp:topk:k=0.001@collective=allgather") == {"compressor": "topk",
                                                                        "k": "0.001"}
    assert e2e.optimizer_options("ddp:int8@collective=alltoall") == {"collective": "alltoall"}


@pytest.mark.parametrize("method", ["nocomm", "hvd-dense", "hvd-fp16", "ddp-dense", "ddp-fp16",
                                    "ddp-powersgd"])
def test_builtin_methods_run(method):
    assert e2e.method_problem(method) is None
    assert not e2e.two_level(method)


def test_which_methods_use_ddp():
    ddp = ["ddp-dense", "ddp-fp16", "ddp-powersgd", "ddp:dgc", "ddp:topk:k=0.01"]
    assert all(e2e.uses_ddp(m) for m in ddp)
    assert not any(e2e.uses_ddp(m) for m in ["nocomm", "hvd-dense", "dgc", "powersgd"])


def test_two_level_through_the_hook():
    assert e2e.two_level("ddp:dgc-2l") and e2e.two_level("ddp:dgc@intra_node=fp16")
    assert not e2e.two_level("ddp:dgc")
    assert e2e.optimizer_options("ddp:dgc-2l4")["ranks_per_node"] == 4


@pytest.mark.parametrize("method, says", [
    ("ddp:hvd-dense", "ddp-dense, ddp-fp16, ddp-powersgd"),
    ("ddp:ddp-powersgd", "after 'ddp:' an hvdcompress method"),
    ("ddp:", "after 'ddp:' an hvdcompress method"),
    ("ddp:ddp:dgc", "after 'ddp:' an hvdcompress method"),
    ("ddp-int8", "ddp:<method>"),
    ("ddp:nosuch", "compressor='nosuch' is unknown"),
    ("nosuch", "compressor='nosuch' is unknown"),
    ("ddp:dgc:nosuch=1", "nosuch"),
    ("ddp:int8@bucket=4", "optimizer option(s) ['bucket']"),
])
def test_unknown_methods_say_why(method, says):
    assert says in e2e.method_problem(method)


def test_runnable_skips_with_the_reason(capsys):
    assert e2e.runnable(["ddp-dense", "ddp:nosuch", "ddp:dgc"], "e2e") == ["ddp-dense", "ddp:dgc"]
    assert "e2e: skipping ddp:nosuch: from_params: compressor='nosuch'" in capsys.readouterr().out


def test_the_adam_collective_aliases_carry_their_option():
    assert e2e.optimizer_options("onebit-ef-adam-ag") == {"collective": "allgather"}
    assert e2e.hvdc_params("int8-adam-ag") == {"compressor": "int8", "adam": "frozen"}


def test_convergence_keeps_the_methods_that_finished_before_a_launch_failed(tmp_path, monkeypatch):
    """A launch that times out after its first method: that method's record is written to the
    JSON, the exit names the method lost, nothing else is reported as run."""
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(e2e.__file__).parent))   # convergence.py imports e2e as a script
    from hvdrun import LaunchError

    from benchmarks import convergence
    done = {"rank": 0, "method": "hvd-dense", "final_bpb": 3.0, "curve": [[0, 8.0]], "bytes": None}

    def timed_out(*args, **kwargs):
        raise LaunchError("horovodrun -np 2 convergence.py timed out after 5 s", None, True, [], "",
                          [[done], []])

    monkeypatch.setattr(convergence, "run_script", timed_out)
    out = tmp_path / "lm.json"
    with pytest.raises(SystemExit) as info:
        convergence.main(["--task", "lm", "--optimizer", "adamw", "--nps", "2", "--json", str(out),
                          "--methods", "hvd-dense,onebit-ef-adam"])
    assert "timed out after 5 s" in str(info.value) and "unfinished at 2 ranks: onebit-ef-adam" in str(info.value)
    assert json.loads(out.read_text()) == {"2": {"hvd-dense": done}}


def test_convergence_stop_after_reaches_the_workers_and_is_checked(tmp_path, monkeypatch, capsys):
    """``--stop-after K`` is passed to every rank (which ends after K steps of the ``--steps``
    schedule); a K above ``--steps`` is refused with the flag, the value and what is allowed."""
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(e2e.__file__).parent))
    from benchmarks import convergence
    flags = {}

    def launched(script, np, args, timeout):
        flags["args"] = args
        raise convergence.LaunchError("stopped here", None, False, [], "", [[]])

    monkeypatch.setattr(convergence, "run_script", launched)
    common = ["--task", "lm", "--optimizer", "adamw", "--nps", "2", "--json", str(tmp_path / "lm.json"),
              "--methods", "hvd-dense", "--steps", "1000"]
    with pytest.raises(SystemExit):
        convergence.main(common + ["--stop-after", "300"])
    assert "--stop-after=300" in flags["args"] and "--steps=1000" in flags["args"]
    with pytest.raises(SystemExit) as info:
        convergence.parse_args(common + ["--stop-after", "1001"])
    assert info.value.code == 2 and "--stop-after 1001: allowed: 0 (the whole run) to --steps (1000)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        convergence.parse_args(common + ["--stop-after", "-1"])
