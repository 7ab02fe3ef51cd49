"""tests/zygote.py, the rank servers of the launches: a forked rank sees what a fresh process
would (argv, environment, a session of its own, one thread, a hash seed unlike its neighbour's),
and its exit status reaches horovodrun."""
import pytest
import zygote
from conftest import HVD_SCRIPTS, run_horovod, run_horovod_failing

pytestmark = pytest.mark.horovod


def test_a_forked_rank_sees_what_a_fresh_process_would():
    records = run_horovod("torch_zygote_probe.py", np=2, args=["0", "x y"], env={"HVDC_PROBE": "p1"})
    assert [r["rank"] for r in records] == [0, 1]
    for r in records:
        assert r["argv"] == ["0", "x y"] and r["main"] == "__main__" and r["rank_env"] == str(r["rank"])
        assert r["own_session"] and r["threads"] == 1 and r["probe"] == "p1" and r["total"] == 2.0
        assert str(HVD_SCRIPTS) in r["path"] and r["forked"]   # forked from the server that imported dynamo
    assert records[0]["hash"] != records[1]["hash"]   # the two servers' hash seeds


def test_a_rank_s_exit_status_fails_the_launch():
    out = run_horovod_failing("torch_zygote_probe.py", np=2, args=["3"])
    assert "Exit code: 3" in out, out[-2000:]


def test_scripts_go_to_the_server_of_their_framework(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("print('no framework')\n")
    assert zygote._kind(HVD_SCRIPTS / "torch_identical.py") == "torch"
    assert zygote._kind(HVD_SCRIPTS / "tf_train.py") == "tf"
    assert zygote._kind(plain) is None and zygote.command(plain, ["a"], {})[0] == [str(plain), "a"]
