import pytest
import torch
import torch._dynamo.testing

from fullgraph import env
from fullgraph.errors import FullgraphError
from fullgraph.ops import CustomOp, counters, measured, policy
from fullgraph.ops.custom_op import choose


class Double(CustomOp):
    """A toy op whose two implementations are told apart by their results."""

    name = "toy_double"

    def forward_native(self, x):
        return x * 2

    def forward_kernel(self, x):
        return x * 2 + 1000  # not a real kernel: marks which path ran


def test_subclass_registers_its_name():
    from fullgraph.ops.policies import KNOWN_OPS

    assert "toy_double" in KNOWN_OPS and "rms_norm" in KNOWN_OPS


def test_native_policy_runs_native_and_counts():
    x = torch.randn(5)
    before = counters[("toy_double", "eager", "native")]
    torch.testing.assert_close(Double(policy="native")(x), x * 2)
    assert counters[("toy_double", "eager", "native")] == before + 1


def test_kernel_policy_where_kernels_run():
    m = Double(policy="kernel")
    x = torch.randn(5)
    if env.triton_runs_on("cpu")[0]:
        torch.testing.assert_close(m(x), x * 2 + 1000)
    else:
        with pytest.raises(FullgraphError, match="policy 'kernel'"):
            m(x)


def test_auto_in_eager_is_the_kernel_where_it_runs():
    expect = "kernel" if env.triton_runs_on("cpu")[0] else "native"
    assert Double().implementation("cpu") == expect
    assert choose("toy_double", None, torch.device("cpu"), compiling=False) == expect


def test_auto_under_compile_is_native_for_a_checked_call(monkeypatch):
    # a checked op's call carries no model shape (ops/measured.py: the decision data is read in tests/ops/
    # test_measured.py), so compiled auto is the native form whatever the GPU measured
    monkeypatch.setattr(measured, "_names", {0: "NVIDIA H200"})
    assert measured.compiled_choice("linear_gelu", torch.device("cuda", 0)) == "native"
    if env.triton_runs_on("cpu")[0]:  # under compile, auto on the CPU is the native form whatever the table says
        assert Double().implementation("cpu", compiling=True) == "native"


def test_context_changes_a_cached_choice():
    m = Double()
    x = torch.randn(3)
    with policy(toy_double="native"):
        torch.testing.assert_close(m(x), x * 2)
    if env.triton_runs_on("cpu")[0]:
        torch.testing.assert_close(m(x), x * 2 + 1000)  # the cached "native" did not outlive the block


def test_compiled_graph_follows_policy_and_counts_traces():
    m = Double()
    f = torch.compile(m, fullgraph=True)
    x = torch.randn(4)
    with policy(toy_double="native"):
        before = counters[("toy_double", "compiled", "native")]
        for _ in range(20):  # more calls than the recompile limit: nothing in the graph may guard on a count
            torch.testing.assert_close(f(x), x * 2)
        assert counters[("toy_double", "compiled", "native")] == before + 1
    if env.triton_runs_on("cpu")[0]:
        with policy(toy_double="kernel"):  # a policy change recompiles: compiled code guards on it
            torch.testing.assert_close(f(x), x * 2 + 1000)


def test_bad_instance_policy():
    with pytest.raises(ValueError, match="unknown policy"):
        Double(policy="fastest")


def test_call_kernel_uses_the_op_whenever_something_watches(triton_device):
    from fullgraph.kernels._library import call_kernel
    from fullgraph.kernels.rms_norm import rms_norm_fwd

    calls = []

    class Spy:
        """Stands in for a registered op: records which path `call_kernel` took."""

        def __call__(self, *args):
            calls.append("op")
            return rms_norm_fwd(*args)

        def launcher(self, *args):
            calls.append("launcher")
            return rms_norm_fwd.launcher(*args)

    x = torch.randn(3, 64, device=triton_device)
    w = torch.randn(64, device=triton_device, requires_grad=True)
    with torch.no_grad():
        call_kernel(Spy(), x, w, 1e-6)
    call_kernel(Spy(), x, w, 1e-6)  # w needs a gradient: autograd must see the op
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode, torch.no_grad():
        call_kernel(Spy(), mode.from_tensor(x), mode.from_tensor(w), 1e-6)
    assert calls == ["launcher", "op", "op"]


def test_cached_eager_choices_follow_every_policy_change_and_stay_small():
    from fullgraph.ops import custom_op, rms_norm

    x = torch.randn(3, 8)
    custom_op._FUNCTIONAL.clear()  # other tests' entries; what this one adds must stay few
    ran = lambda impl: counters[("rms_norm", "eager", impl)]  # noqa: E731
    runs = env.triton_runs_on("cpu")[0]
    for _ in range(50):  # each block changes the policy twice: the caches must neither go stale nor grow
        before = ran("native")
        with policy(rms_norm="native"):
            rms_norm(x)
        assert ran("native") == before + 1
        if runs:
            before = ran("kernel")
            with policy(rms_norm="kernel"):
                rms_norm(x)
            assert ran("kernel") == before + 1
    module = Double()
    for _ in range(50):
        with policy(toy_double="native"):
            torch.testing.assert_close(module(x), x * 2)
    assert len(custom_op._FUNCTIONAL) <= 4 and len(module._choices) <= 2


def test_eager_auto_takes_the_native_form_below_the_size_where_a_kernel_pays(monkeypatch):
    if not env.triton_runs_on("cpu")[0]:
        pytest.skip("needs kernels to run here (TRITON_INTERPRET=1)")
    monkeypatch.setitem(measured.EAGER_KERNEL_MIN_NUMEL, "cpu", 64)
    module = Double(policy="auto")
    small, large = torch.randn(4, 8), torch.randn(8, 8)  # 32 and 64 elements, either side of the threshold
    for _ in range(3):  # the cached choices keep the size classes apart
        torch.testing.assert_close(module(small), small * 2)
        torch.testing.assert_close(module(large), large * 2 + 1000)
    with policy(toy_double="kernel"):  # an explicit policy is obeyed at any size
        torch.testing.assert_close(module(small), small * 2)  # the instance's own "auto" wins over the context
        torch.testing.assert_close(Double()(small), small * 2 + 1000)
    floor = measured.EAGER_KERNEL_MIN_NUMEL["cuda"]
    assert measured.eager_kernel_pays("cuda", floor) and not measured.eager_kernel_pays("cuda", floor - 1)


def test_a_functional_forms_cached_choice_keeps_the_size_classes_apart_as_a_modules_does(monkeypatch):
    if not env.triton_runs_on("cpu")[0]:
        pytest.skip("needs kernels to run here (TRITON_INTERPRET=1)")
    from fullgraph.ops import RMSNorm, custom_op, rms_norm

    monkeypatch.setitem(measured.EAGER_KERNEL_MIN_NUMEL, "cpu", 64)
    custom_op._FUNCTIONAL.clear()
    small, large = torch.randn(4, 8), torch.randn(8, 8)  # 32 and 64 elements, either side of the threshold
    module = RMSNorm(8)
    for _ in range(3):  # the first call of each size class fills the cache; the next ones run from it
        for x, impl in ((small, "native"), (large, "kernel")):
            before = counters[("rms_norm", "eager", impl)]
            with policy(rms_norm="auto"):
                torch.testing.assert_close(rms_norm(x, module.weight), module(x))
            assert counters[("rms_norm", "eager", impl)] == before + 2  # the functional call and the module's


def test_an_ops_own_eager_floor_replaces_the_devices_for_that_op_only(monkeypatch):
    if not env.triton_runs_on("cpu")[0]:
        pytest.skip("needs kernels to run here (TRITON_INTERPRET=1)")
    from fullgraph.ops import RMSNorm, custom_op, layer_norm, rms_norm

    monkeypatch.setitem(measured.EAGER_KERNEL_MIN_NUMEL, "cpu", 1 << 20)
    monkeypatch.setitem(measured.EAGER_KERNEL_MIN_NUMEL_BY_OP, "cpu", {"rms_norm": 64})
    custom_op._FUNCTIONAL.clear()
    assert measured.eager_floor("cpu", "rms_norm") == 64 and measured.eager_floor("cpu", "layer_norm") == 1 << 20
    small, large = torch.randn(4, 8), torch.randn(8, 8)  # either side of rms_norm's own floor, below the device's
    module = RMSNorm(8)
    for x, impl in ((small, "native"), (large, "kernel"), (large, "kernel")):
        before = counters[("rms_norm", "eager", impl)], counters[("layer_norm", "eager", "native")]
        with policy(all="auto"):
            torch.testing.assert_close(rms_norm(x, module.weight), module(x))
            layer_norm(x)  # below the device's floor: native at both sizes
        after = counters[("rms_norm", "eager", impl)], counters[("layer_norm", "eager", "native")]
        assert after == (before[0] + 2, before[1] + 1)  # rms_norm: the functional call and the module's
    assert not measured.eager_kernel_pays("cpu", 64, "layer_norm") and measured.eager_kernel_pays("cpu", 64, "rms_norm")
    assert [measured.eager_size_class("cpu", n) for n in (63, 64, 1 << 20)] == [0, 1, 2]
