"""The lean load path (issue 35): a process that loads an AOT package with no Python custom ops imports no compiler.

Each check runs in a fresh interpreter, since this one has imported everything already. Also here: the names that
`fullgraph.deploy` and `fullgraph.compile` import on first use, and `fullgraph.replay.under_graphs`, marked a
constant for Dynamo on first use rather than at import.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fullgraph.compile
from fullgraph import deploy

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch._dynamo", "torch._inductor", "triton", "sympy", "fullgraph.compile.compiled")
REPORT = f"import json, sys; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"


def run_python(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def heavy_imported(code: str) -> list[str]:
    """The modules of HEAVY that `code` imported, run in a fresh interpreter (the last line of its stdout)."""
    return json.loads(run_python("-c", f"{code}\n{REPORT}").stdout.strip().splitlines()[-1])


def test_import_fullgraph_imports_no_compiler():
    assert heavy_imported("import fullgraph") == []


def test_loading_a_package_without_python_ops_imports_no_compiler(mlp_package):
    path, _ = mlp_package
    code = (
        "import torch\n"
        "from fullgraph.deploy import load\n"
        f"m = load({str(path)!r})\n"
        "assert m.custom_ops == () and m(torch.randn(4, 8)).shape == (4, 4)"
    )
    assert heavy_imported(code) == []
    assert heavy_imported(code) == []  # again, with the probe's verdict remembered


def test_fullgraph_load_imports_no_compiler(mlp_package):
    """`python -m fullgraph load PKG --input ...`, run as -m runs it (runpy), with HEAVY's imports printed at exit."""
    path, _ = mlp_package
    argv = ["fullgraph", "load", str(path), "--input", "4x8:fp32", "--reps", "2"]
    code = (
        f"import atexit, runpy, sys\natexit.register(lambda: exec({REPORT!r}))\nsys.argv = {argv!r}\n"
        "runpy.run_module('fullgraph', run_name='__main__', alter_sys=True)"
    )
    done = run_python("-c", code)
    assert "output 4x4:float32@cpu" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_compile_package_imports_its_names_on_first_use():
    code = (
        "import fullgraph.compile as c\n"
        "assert c.GraphedCall.__module__ == 'fullgraph.compile.graphs'\n"
        "assert set(c.__all__) <= set(dir(c))"
    )
    assert heavy_imported(code) == []
    assert callable(fullgraph.compile) and fullgraph.compile.compile.__module__ == "fullgraph.compile.compiled"
    assert {name: getattr(fullgraph.compile, name) for name in fullgraph.compile.__all__}
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        fullgraph.compile.nothing  # noqa: B018


def test_every_deploy_name_still_resolves():
    assert set(deploy.__all__) <= set(dir(deploy))
    for name in deploy.__all__:
        assert getattr(deploy, name).__module__.startswith("fullgraph."), name
    assert deploy.cache.__name__ == "fullgraph.deploy.cache"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        deploy.nothing  # noqa: B018


def test_deploy_names_that_compile_import_our_ops_first():
    """As `import fullgraph.deploy` did: our ops registered and their fingerprint in torch's compile-cache keys."""
    code = (
        "import torch\n"
        "from fullgraph.deploy import load, save_cache\n"
        "assert 'fullgraph.ops' in sys.modules and 'fullgraph-' in torch.compiler.config.cache_key_tag"
    )
    run_python("-c", "import sys\n" + code)


def test_the_triton_version_is_read_without_importing_triton():
    pytest.importorskip("triton")
    code = (
        "from fullgraph.deploy._common import environment\n"
        "seen = environment()['triton']\n"
        "assert 'triton' not in sys.modules\n"
        "import triton\n"
        "assert seen == triton.__version__, (seen, triton.__version__)"  # what headers recorded before
    )
    run_python("-c", "import sys\n" + code)


def test_under_graphs_is_marked_a_constant_on_first_use_inside_a_trace():
    """Imported before Dynamo, first read inside a fullgraph=True trace: a constant there (no break), as when the
    module marked it at import."""
    code = (
        "import torch\n"
        "from fullgraph import replay\n"
        "assert 'torch._dynamo' not in sys.modules and 'under_graphs' not in vars(replay)\n"
        "f = torch.compile(lambda x: x + 1 if replay.under_graphs() else x - 1, fullgraph=True, backend='eager')\n"
        "with replay.replayed():\n"
        "    assert f(torch.zeros(3)).tolist() == [1.0, 1.0, 1.0]\n"
        "assert replay.under_graphs._dynamo_marked_constant"
    )
    run_python("-c", "import sys\n" + code)
