import argparse
import json
import re
import subprocess
import sys

import pytest

from fullgraph.bench.suites import fleet
from tests.redis_server import redis_fixture  # noqa: F401  (the fixture `redis`)


def _args(**kw):
    base = {"device": "cpu", "reps": 1, "model": "vit_mini", "batch": 1, "dtype": None, "preset": None, "depth": 1,
            "routes": None, "timeout": 300.0, "replicas": 2, "variants": "sequential", "remote": None}  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_url_carries_password_and_database():
    assert fleet._url("redis://127.0.0.1:6379/0", "pw", 1) == "redis://:pw@127.0.0.1:6379/1"
    assert fleet._url("rediss://:pw@cache:6380/0", None, 0) == "rediss://:pw@cache:6380/0"


def test_arguments_are_checked():
    with pytest.raises(Exception, match="--replicas at least 2"):
        fleet.run(_args(replicas=1), fleet.Sources(None, print))
    with pytest.raises(Exception, match="--profile-calls -1: give 0"):
        fleet.run(_args(profile_calls=-1), fleet.Sources(None, print))
    with pytest.raises(Exception, match="--profile-calls 5: the replicas are held only for steady rounds"):
        fleet.run(_args(profile_calls=5, steady_rounds=0), fleet.Sources(None, print))


@pytest.mark.slow
def test_later_replicas_have_no_remote_fx_graph_misses_and_published_replicas_compile_nothing(redis):
    """Fresh processes with empty local caches (a CPU compile of a 1-block ViT is ~15-40 s each on 2 cores): the
    second sequential replica's FX graph comes from Redis; after one process published the precompiled code, each
    published replica runs it (no frame compiled: no FX-graph lookup at all) and matches eager fp32."""
    url = f"redis://:{redis.password}@127.0.0.1:{redis.port}/0"
    said: list[str] = []
    rows, table, failure = fleet.run(_args(remote=url, variants="sequential,published"),
                                     fleet.Sources(None, said.append))  # fmt: skip
    assert failure is None, table
    # each replica's figures as it finished, before the table (a run cut short keeps them)
    line = next(m for m in said if m.startswith("sequential-2: first_output_s"))
    assert re.match(
        r"sequential-2: first_output_s [\d.]+, median_ms [\d.]+, \d+ modules imported in the window, "
        r"FX hit/miss 1/0, remote",
        line,
    ), line
    value = {(r.variant, r.metric): r.value for r in rows}
    assert value[("sequential-2", "fxgraph_cache_hit")] == 1 and value[("sequential-2", "fxgraph_cache_miss")] == 0
    assert value[("sequential-2", "remote_miss")] == 0 and value[("sequential-2", "remote_refused")] == 0
    assert value[("sequential-1", "remote_put")] >= 1 and value[("sequential-2", "rel_err")] < 1e-4
    how = {r.variant: json.loads(r.params).get("how") for r in rows if r.metric == "ok"}
    # the code each replica ran: the one that compiled and the one that loaded its graph from Redis ran the same
    code = {r.variant: json.loads(r.params).get("code") for r in rows if r.metric == "ok"}
    assert code["sequential-1"] and code["sequential-1"] == code["sequential-2"], code
    assert code["sequential-1"][:8] in table
    assert how["published-1"] == how["published-2"] == "published precompiled code"
    for name in ("published-1", "published-2"):
        assert value[(name, "fxgraph_cache_hit")] == value[(name, "fxgraph_cache_miss")] == 0
        assert value[(name, "rel_err")] < 1e-4
        # the bootstrap imported fullgraph's and Inductor's compilers before the window (before it did, a published
        # replica's window first imported ~625 modules on the CPU, a cold one's ~914); now what remains is the
        # loaded code's own and, on the CPU, the C++ build's
        assert value[(name, "window_imports")] < 300
    # no cold variant: the first sequential replica, which compiled, is the baseline for the ratios
    assert value[("sequential-2", "first_output_x_cold")] == pytest.approx(
        value[("sequential-2", "first_output_s")] / value[("sequential-1", "first_output_s")]
    )
    assert "published precompiled code" in table and "published-0" in table
    # every replica that ran a model stayed alive and timed its steady state in turns with the others
    assert "steady state: 5 rounds of 1 calls, the 4 replicas in turn" in said
    for name in ("sequential-1", "sequential-2", "published-1", "published-2"):
        assert value[(name, "steady_rounds")] == 5 and value[(name, "steady_ms")] > 0
        # then each ran 20 calls under torch's profiler: its ops' own time per call (kernels on a GPU)
        profiled = next(json.loads(r.params)["profile_us"] for r in rows if r.variant == name and r.metric == "ok")
        assert any(k.startswith("aten::") for k in profiled) and all(v > 0 for v in profiled.values()), profiled
        assert value[(name, "profiled_us_per_call")] == pytest.approx(sum(profiled.values()))
    assert "profiles: 20 calls of each of the 4 replicas under torch's profiler" in said
    assert re.search(r"kernels, fastest \S+ \([\d.]+ ms\) against slowest", table), table
    assert ("published-0", "steady_rounds") not in value


def test_a_replica_is_summed_up_in_one_line():
    child = {"first_output_s": 1.5, "median_ms": 0.77, "counters": {}, "how": "published precompiled code",
             "window_imports": 31}  # fmt: skip
    ok = {"name": "published-1", "ok": True, "error": None, "remote": {"hit": 1, "miss": 2}, "child": child}
    assert fleet.summary(ok) == (
        "published-1: first_output_s 1.500, median_ms 0.770, 31 modules imported in the window, FX hit/miss 0/0, "
        "remote hit/miss/refused 1/2/0 (published precompiled code)"
    )
    failed = {"name": "cold-2", "ok": False, "error": "exit 1: RuntimeError: boom", "remote": {}, "child": {}}
    assert fleet.summary(failed) == "cold-2: exit 1: RuntimeError: boom"


def test_the_cold_median_is_the_baseline_and_a_fallback_is_a_failure():
    def replica(name, first, steady, **child):
        return {"name": name, "ok": True, "error": None, "process_s": 20.0, "remote": {}, "output": None,
                "child": {"first_output_s": first, "median_ms": steady, **child}}  # fmt: skip

    plan = fleet.plan_from(_args())
    runs = {
        "cold": [replica("cold-1", 10.0, 2.0), replica("cold-2", 14.0, 2.2), replica("cold-3", 12.0, 2.1)],
        "published": [
            replica("published-0", None, None, action="publish", file_bytes=2e6, publish_s=9.0),
            replica("published-1", 1.2, 2.1, how="published precompiled code"),
            replica("published-2", 11.0, 2.1, how="compiled here: no published entry"),
        ],
    }
    rows, table, failure = fleet.report(plan, runs, None)
    value = {(r.variant, r.metric): r.value for r in rows}
    assert value[("published-1", "first_output_x_cold")] == pytest.approx(0.1)  # 1.2 s over the median 12 s
    assert value[("published-1", "steady_x_cold")] == pytest.approx(1.0)
    assert ("cold-1", "first_output_x_cold") not in value and ("published-0", "first_output_x_cold") not in value
    assert failure == "published-2: not served from the published code (compiled here: no published entry)"
    assert "cold median 12.00 s" in table and "published 2.0 MB in 9.0 s" in table


def test_together_replicas_miss_only_what_they_claimed():
    def replica(name, first, remote):
        return {"name": name, "ok": True, "error": None, "process_s": 20.0, "remote": remote, "output": None,
                "child": {"first_output_s": first, "median_ms": 2.0}}  # fmt: skip

    claimant = {"hit": 0, "miss": 2, "claimed": 2, "waited": 0, "waited_s": 0.0,
                "by_cache": {"fx-graph-v1.miss": 1, "fx-graph-v1.claimed": 1}}  # fmt: skip
    waiter = {"hit": 2, "miss": 0, "claimed": 0, "waited": 1, "waited_s": 9.5, "by_cache": {"fx-graph-v1.hit": 1}}
    late = {"hit": 0, "miss": 1, "claimed": 0, "waited": 1, "waited_s": 300.0, "by_cache": {"fx-graph-v1.miss": 1}}
    plan = fleet.plan_from(_args())
    runs = {"cold": [replica("cold-1", 10.0, {})],
            "together": [replica("together-1", 12.0, claimant), replica("together-2", 13.0, waiter),
                         replica("together-3", 20.0, late)]}  # fmt: skip
    rows, table, failure = fleet.report(plan, runs, None)
    assert failure == ("together-3: 1 remote FX-graph misses, 0 of them claimed (it compiled what another replica "
                       "was compiling)")  # fmt: skip
    value = {(r.variant, r.metric): r.value for r in rows}
    assert value[("together-2", "remote_waited_s")] == 9.5 and value[("together-1", "remote_claimed")] == 2
    assert "9.5" in next(line for line in table.splitlines() if line.startswith("together-2"))
    assert fleet.summary(runs["together"][1]).endswith(
        "remote hit/miss/refused 2/0/0, waited 9.5 s for another's compile"
    )


def test_a_held_child_answers_each_time_request_with_one_line_until_exit(capsys):
    from fullgraph.deploy import coldstart

    asked: list[int] = []

    def steady(reps):
        asked.append(reps)
        return 0.5 * reps

    coldstart._hold(steady, iter(["time 3\n", "\n", "time x\n", "time 7\n", "exit\n", "time 9\n"]))
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert asked == [3, 7]  # nothing after `exit`
    assert lines[0] == {"round_ms": 1.5} and lines[2] == {"round_ms": 3.5}
    assert "unknown request 'time x'" in lines[1]["error"] and len(lines) == 3


# A stand-in replica speaking coldstart's --hold protocol: its report and remote lines, then one round per request
# (the round's figure is its name's length plus 10 per request so far), logging each request it answers; it exits
# with status 3 at request DIE (0: never).
FAKE = """
import json, sys
name, die, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print("a line that is not JSON", flush=True)
print(json.dumps({"action": "compile", "ok": True, "holding": True, "median_ms": 99.0}), flush=True)
print(json.dumps({"remote": {"hit": 2, "miss": 0}}), flush=True)
n = 0
for line in sys.stdin:
    if line.startswith("exit"):
        break
    if line.startswith("profile"):  # a name-dependent kernel time, and one kernel alike in every replica
        print(json.dumps({"profile_us": {"gemm": 10.0 * len(name), "norm": 5.0}}), flush=True)
        continue
    n += 1
    if n == die:
        print("RuntimeError: lost the device", file=sys.stderr, flush=True)
        sys.exit(3)
    with open(log, "a") as f:
        f.write(f"{name} {line.split()[1]}\\n")
    print(json.dumps({"round_ms": float(len(name) + 10 * n)}), flush=True)
"""


def _fake(tmp_path, name, die=0):
    log = tmp_path / "asked.log"
    with open(tmp_path / f"{name}.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", FAKE, name, str(die), str(log)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)  # fmt: skip
    return fleet._Replica(name, proc, str(tmp_path))


def test_steady_rounds_interleave_the_held_replicas_rotating_the_order_and_a_dead_one_fails(tmp_path):
    runs = {"cold": [fleet._finish(_fake(tmp_path, "a"), 30.0)],
            "published": [fleet._finish(_fake(tmp_path, "bb"), 30.0), fleet._finish(_fake(tmp_path, "ccc", die=2),
                                                                                    30.0)]}  # fmt: skip
    a, b, c = runs["cold"][0], *runs["published"]
    assert a["ok"] and a["remote"] == {"hit": 2, "miss": 0} and fleet._steady(a) == 99.0 and "rep" in a
    said: list[str] = []
    reps = [r["rep"] for r in (a, b, c)]
    try:
        fleet.steady_rounds(runs, 3, 4, 30.0, said.append)
    finally:
        for r in (a, b, c):
            if r.get("rep"):
                fleet._close(r, 10.0)
    assert said == ["steady state: 3 rounds of 4 calls, the 3 replicas in turn"]
    # round 1: a bb ccc; round 2 starts one later (bb ccc a: ccc dies); round 3 (ccc a bb) skips the dead one
    order = (tmp_path / "asked.log").read_text().split("\n")
    assert order == ["a 4", "bb 4", "ccc 4", "bb 4", "a 4", "a 4", "bb 4", ""]
    assert a["rounds_ms"] == [11.0, 21.0, 31.0] and fleet._steady(a) == 21.0  # the median of its rounds
    assert fleet._steady(b) == 22.0 and b["ok"]
    assert not c["ok"] and c["rounds_ms"] == [13.0]
    assert c["error"] == "exit 3: stopped answering in steady round 2"
    assert "RuntimeError: lost the device" in (tmp_path / "ccc.log").read_text()
    for r, rep in zip((a, b, c), reps, strict=True):  # every process ended and its log written
        assert "rep" not in r and rep.proc.returncode == (3 if r is c else 0)
        assert (tmp_path / f"{r['name']}.log").exists()


def test_profiles_name_the_kernels_that_differ_between_the_fastest_and_slowest_replica(tmp_path):
    runs = {"cold": [fleet._finish(_fake(tmp_path, "a"), 30.0)],
            "published": [fleet._finish(_fake(tmp_path, "bbb"), 30.0)]}  # fmt: skip
    said: list[str] = []
    try:
        fleet.steady_rounds(runs, 1, 4, 30.0, said.append)
        fleet.profile_replicas(runs, 7, 30.0, said.append)
    finally:
        for r in fleet._held(runs):
            fleet._close(r, 10.0)
    a, b = runs["cold"][0], runs["published"][0]
    assert said[-1] == "profiles: 7 calls of each of the 2 replicas under torch's profiler"
    assert a["profile_us"] == {"gemm": 10.0, "norm": 5.0} and b["profile_us"] == {"gemm": 30.0, "norm": 5.0}
    lines = fleet.profile_differences(runs)
    assert (
        lines[0] == "kernels, fastest a (11 ms) against slowest bbb (13 ms): 15.0 / 35.0 us per call in its top kernels"
    )
    assert lines[1].split() == ["gemm", "10.00", "30.00", "us"]  # the kernel that differs first
    rows, table, _ = fleet.report(fleet.plan_from(_args()), runs, None)
    value = {(r.variant, r.metric): r.value for r in rows}
    assert value[("bbb", "profiled_us_per_call")] == 35.0 and lines[1] in table
    assert fleet.profile_differences({"cold": [a]}) == []  # one replica: nothing to compare


def test_a_held_child_profiles_on_request(capsys):
    import torch

    from fullgraph.deploy import coldstart

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    steady = coldstart.Steady(model, (torch.randn(8, 16),), torch.device("cpu"))
    coldstart._hold(steady, iter(["profile 5\n", "time 3\n", "exit\n"]))
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    ops = lines[0]["profile_us"]
    assert any("addmm" in k for k in ops) and all(v > 0 for v in ops.values()), ops  # real ops, their own time
    assert len(ops) <= coldstart.PROFILE_TOP and lines[1]["round_ms"] > 0


def test_a_replica_that_dies_before_its_report_fails_with_its_exit_status_and_stderr(tmp_path):
    code = "import sys; print('RuntimeError: CUDA error: out of memory', file=sys.stderr); sys.exit(2)"
    with open(tmp_path / "x.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True, start_new_session=True)  # fmt: skip
    r = fleet._finish(fleet._Replica("x", proc, str(tmp_path)), 30.0)
    assert not r["ok"] and r["error"] == "exit 2: RuntimeError: CUDA error: out of memory"
    assert "rep" not in r


def test_interleaved_rounds_set_the_steady_ratio_and_are_kept_in_the_csv():
    def replica(name, alone, rounds):
        child = {"first_output_s": 10.0, "median_ms": alone, "how": "published precompiled code"}
        return {"name": name, "ok": True, "error": None, "process_s": 20.0, "remote": {}, "output": None,
                "child": child, "rounds_ms": rounds}  # fmt: skip

    # timed alone, the cold replica (the first processes on a fresh machine) looked 5% slower; interleaved, not
    runs = {"cold": [replica("cold-1", 2.10, [2.0, 2.02, 1.98])],
            "published": [replica("published-1", 2.00, [2.04, 2.0, 2.02])]}  # fmt: skip
    rows, table, failure = fleet.report(fleet.plan_from(_args()), runs, None)
    value = {(r.variant, r.metric): r.value for r in rows}
    assert value[("published-1", "steady_x_cold")] == pytest.approx(2.02 / 2.0)
    assert value[("published-1", "median_ms")] == 2.0 and value[("published-1", "steady_rounds")] == 3
    params = next(json.loads(r.params) for r in rows if r.variant == "published-1")
    assert params["rounds_ms"] == [2.04, 2.0, 2.02]
    assert "steady: the median of 3 rounds of 1 calls, the replicas interleaved" in table and failure is None


def test_a_replica_with_no_report_by_its_timeout_is_stopped_and_failed(tmp_path):
    with open(tmp_path / "slow.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)  # fmt: skip
    r = fleet._finish(fleet._Replica("slow", proc, str(tmp_path)), 0.5)
    assert not r["ok"] and r["error"].startswith("exit -9, SIGKILL: no report within 0.5 s")
    assert proc.returncode == -9
