"""compile_tuned: a tune result's compile settings and op policies, the policies in force around this model's calls
only; export's settings from the same file; results that cannot be applied are refused by name."""

import pytest
import torch
from torch import nn

from fullgraph import ops
from fullgraph.compile.tuned import TuneResult
from fullgraph.deploy import compile_tuned, read_tuned
from fullgraph.deploy.tuned import export_settings
from fullgraph.errors import UsageError
from fullgraph.ops import policies


class Probe(nn.Module):
    """An RMSNorm model that records the rms_norm policy in force each time its forward runs in Python."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc = ops.RMSNorm(8), nn.Linear(8, 8)
        self.seen: list[str] = []

    def forward(self, x):
        self.seen.append(policies.effective("rms_norm"))
        return self.fc(self.norm(x))


def test_an_eager_pick_runs_under_its_policies_and_leaves_the_process_alone():
    model = Probe()
    cm = compile_tuned(model, TuneResult(config="eager fp32", ops={"rms_norm": "native"}))
    x = torch.randn(3, 8)
    torch.testing.assert_close(cm(x), model.fc(ops.rms_norm(x, model.norm.weight)))
    assert model.seen[0] == "native"
    assert policies.effective("rms_norm") == "auto"  # nothing leaked out of the call
    model(x)
    assert model.seen[-1] == "auto"


def test_a_compiled_pick_traces_with_its_policies(tmp_path):
    path = TuneResult(config="compile dev fp32", ops={"all": "native"}).save(tmp_path / "t.json")
    model = Probe()
    before = ops.counters[("rms_norm", "compiled", "native")]
    cm = compile_tuned(model, str(path))
    x = torch.randn(4, 8)
    out = cm(x)
    assert ops.counters[("rms_norm", "compiled", "native")] == before + 1
    assert cm.stats.frames_compiled >= 1
    torch.testing.assert_close(out, model.fc(ops.rms_norm(x, model.norm.weight)), rtol=1e-5, atol=1e-5)


def test_an_op_this_fullgraph_lacks_is_named_before_anything_compiles():
    with pytest.raises(UsageError, match=r"unknown op.*warp_norm"):
        compile_tuned(Probe(), TuneResult(config="compile dev fp32", ops={"warp_norm": "kernel"}))


def test_compile_tuned_refuses_a_second_context_and_contradictions():
    r = TuneResult(config="compile dev bf16")
    with pytest.raises(UsageError, match="applies the result's op policies itself"):
        compile_tuned(Probe(), r, around=lambda: None)
    with pytest.raises(UsageError, match="contradicts the choice"):
        compile_tuned(Probe(), r, dtype=torch.float16)


def test_export_takes_the_dtype_and_the_policies(tmp_path):
    path = TuneResult(config="compile edge bf16", ops={"attention": "kernel"}).save(tmp_path / "t.json")
    assert export_settings(path) == {"dtype": torch.bfloat16, "ops": {"attention": "kernel"}, "preset": "edge",
                                     "mode": None}  # fmt: skip
    eager = TuneResult(config="eager fp32").save(tmp_path / "e.json")
    assert export_settings(eager) == {"dtype": torch.float32, "ops": {}, "preset": None, "mode": None}


def test_read_tuned_refuses_what_is_not_a_result(tmp_path):
    with pytest.raises(UsageError, match="cannot read a tune result from int"):
        read_tuned(3)
    (tmp_path / "x.txt").write_text("{}")
    with pytest.raises(UsageError, match="is not a fullgraph tune result"):
        read_tuned(str(tmp_path / "x.txt"))
