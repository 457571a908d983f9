"""A full disk during every save of deploy (cache artifacts, a precompiled model, a package's build and move, the
regional description): one line naming the path and the free space, and nothing left behind, neither the target
nor a temporary file or folder. The child process's file size limit (RLIMIT_FSIZE) stands in for the full disk:
its writes past 64 KiB fail with EFBIG, as writes to a full disk fail with ENOSPC."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.deploy.test_precompile import needs_api

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, os, resource, signal, sys, types
import torch
from fullgraph.deploy import build, cache, precompile, regional
from tests.deploy._models import Linears

folder, results = sys.argv[1], {}
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))


def attempt(name, save):
    try:
        save()
        results[name] = None
    except Exception as e:
        results[name] = {"type": type(e).__name__, "msg": str(e)}


class Big:  # what torch.compile(...).aot_compile returns, serialized larger than the limit
    def save_compiled_function(self, path):
        with open(path, "wb") as f:
            f.write(b"c" * 200_000)


def build_big(program, package_path, inductor_configs):  # AOTInductor's build, writing a large library
    with open(package_path, "wb") as f:
        f.write(b"p" * 200_000)
    return package_path


torch.compiler.save_cache_artifacts = lambda: (b"a" * 200_000, None)
attempt("m.cache", lambda: cache.save_cache(os.path.join(folder, "m.cache")))
precompile._aot_compile = lambda model, args, mode, options, declared=False: Big()
x = torch.randn(4, 8)
attempt("m.fgpre", lambda: precompile.save_precompiled(Linears(), (x,), os.path.join(folder, "m.fgpre")))
torch._inductor.aoti_compile_and_package = build_big
attempt("m.pt2", lambda: build.export(Linears(), (x,), os.path.join(folder, "m.pt2")))
group = types.SimpleNamespace(class_name="m.Block", paths=("blocks.0", "blocks.1"))
names = [f"blocks.0.weight_{i}" for i in range(5000)]
attempt("r.pt2.json", lambda: regional._record(os.path.join(folder, "r.pt2"), group, names, ["x"]))
print(json.dumps(results))
"""


@needs_api
def test_every_deploy_save_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for target, got in results.items():
        assert got is not None and got["type"] == "DiskFullError", (target, got)
        msg = got["msg"]
        assert msg.startswith(f"could not save {folder / target}: "), (target, msg)
        assert "the file is larger than this process may write" in msg and "\n" not in msg, msg
        assert re.search(r"[\d.]+ MiB free in ", msg), msg
    assert sorted(results) == ["m.cache", "m.fgpre", "m.pt2", "r.pt2.json"]
    assert os.listdir(folder) == [], "a target, a temporary file or a work folder was left behind"
