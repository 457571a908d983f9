import json
import os
import subprocess
import sys

import pytest

from fullgraph import env
from fullgraph.cli.main import main


def run_cli(*args, env_extra=None, cwd=None):
    """Run `python -m fullgraph ARGS` in a fresh process, as a user would."""
    e = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "fullgraph", *args], capture_output=True, text=True, env=e, cwd=cwd, timeout=300
    )


def test_unknown_subcommand_prints_usage_and_exits_2():
    r = run_cli("frobnicate")
    assert r.returncode == 2
    assert "usage: fullgraph" in r.stderr and "invalid choice: 'frobnicate'" in r.stderr


def test_unknown_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["env", "--no-such-flag"])
    assert e.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_no_subcommand_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2
    assert "usage: fullgraph" in capsys.readouterr().err


def test_env_json_parses_and_names_every_field():
    r = run_cli("env", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    expected = {
        "fullgraph", "python", "platform", "torch", "torch_cuda", "triton", "cuda_available", "gpu",
        "gpu_capability", "gpu_count", "gpu_memory_gib", "driver", "triton_gpu", "triton_interpreter",
        "triton_interpret", "inductor_cache_dir", "git_commit", "attention_device", "attention", "attention_dispatch",
    }  # fmt: skip
    assert set(d) == expected
    names = {p["name"] for p in d["attention"]}
    assert {"sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"} <= names
    assert any(p["ok"] for p in d["attention"] if p["name"] == "sdpa-math")
    assert d["triton_interpreter"]["ok"] == env.has_triton()
    dispatch = d["attention_dispatch"]
    assert dispatch["backends"]["sdpa-math"]["installed"] and dispatch["backends"]["sdpa-math"]["runs"]
    assert dispatch["cache"].endswith("attention_choices.json")


def test_env_text_lists_backends():
    r = run_cli("env")
    assert r.returncode == 0, r.stderr
    assert "Attention backends" in r.stdout and "sdpa-math" in r.stdout
    assert "inductor cache" in r.stdout
    assert "auto picks among those that run; its cached choices" in r.stdout


def test_env_without_triton_says_so(tmp_path):
    # A `triton` package that fails to import stands in for a machine without Triton.
    fake = tmp_path / "triton"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('triton hidden by the test')\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    r = run_cli("env", "--json", env_extra={"PYTHONPATH": path})
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["triton"] is None
    assert not d["triton_interpreter"]["ok"] and "not importable" in d["triton_interpreter"]["detail"]
    text = run_cli("env", env_extra={"PYTHONPATH": path})
    assert text.returncode == 0 and "not installed" in text.stdout


def test_user_error_is_one_line_exit_2():
    if env.has_cuda():
        pytest.skip("needs a machine without CUDA to request a missing device")
    r = run_cli("bench", "ceilings", "--device", "cuda", "--csv", os.devnull)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "torch sees no CUDA device" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_verbose_shows_traceback():
    if env.has_cuda():
        pytest.skip("needs a machine without CUDA to request a missing device")
    r = run_cli("--verbose", "bench", "ceilings", "--device", "cuda", "--csv", os.devnull)
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_console_script_runs():
    script = os.path.join(os.path.dirname(sys.executable), "fullgraph")
    if not os.path.exists(script):
        pytest.skip("fullgraph is not installed as a console script in this environment")
    r = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"fullgraph {env.__version__}"


# Runs fullgraph's CLI with numpy unimportable, as on a base install (numpy is optional to torch and to us).
NO_NUMPY = """
import importlib.machinery
import sys

class HideNumpy(importlib.machinery.PathFinder):  # the path finder, blind to numpy as if it were not installed
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.split(".")[0] == "numpy" else super().find_spec(name, path, target)

sys.meta_path[:] = [HideNumpy if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
if sys.argv[1:] == ["import-torch"]:
    import torch
else:
    from fullgraph.cli.main import main
    sys.exit(main(sys.argv[1:]))
"""


def _without_numpy(*args):
    return subprocess.run([sys.executable, "-c", NO_NUMPY, *args], capture_output=True, text=True, timeout=300)


def test_a_base_install_without_numpy_prints_no_numpy_warning(tmp_path):
    control = _without_numpy("import-torch")
    assert control.returncode == 0, control.stderr
    if "Failed to initialize NumPy" not in control.stderr:
        pytest.skip("this torch imports without numpy silently: nothing to hide")
    r = _without_numpy("env", "--no-probe")
    assert r.returncode == 0 and "Attention backends" in r.stdout, r.stderr
    assert "NumPy" not in r.stderr, r.stderr
    r = _without_numpy("bench", "ceilings", "--device", "cpu", "--copy-mib", "1", "--gemm-n", "32", "--reps", "2",
                       "--csv", os.devnull)  # fmt: skip
    assert r.returncode == 0 and "TB/s" in r.stdout, r.stderr
    assert "NumPy" not in r.stderr, r.stderr
    r = _without_numpy("doctor", "--mode", "eager", "--no-profile", "--json", str(tmp_path / "r.json"), "--html",
                       str(tmp_path / "r.html"))  # fmt: skip
    assert r.returncode == 0 and "recommendation" in r.stdout, r.stderr
    assert "NumPy" not in r.stderr, r.stderr
