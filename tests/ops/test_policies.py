import pytest

from fullgraph.errors import UsageError
from fullgraph.ops import policies as pol


@pytest.fixture(autouse=True)
def clean_state():
    saved = pol.snapshot()
    yield
    pol.restore(saved)


def test_default_is_auto():
    pol.load_env("")
    assert pol.effective("rms_norm") == "auto"


def test_env_spec_parsing():
    assert pol.parse_spec("+rms_norm,-rope, layer_norm=auto") == {
        "rms_norm": pol.Policy.KERNEL,
        "rope": pol.Policy.NATIVE,
        "layer_norm": pol.Policy.AUTO,
    }
    assert pol.parse_spec("none") == {"all": pol.Policy.NATIVE}
    assert pol.parse_spec("") == {}


@pytest.mark.parametrize("bad", ["rms_norm", "rms_norm=fast", "+"])
def test_bad_env_spec(bad):
    with pytest.raises(UsageError, match=r"FULLGRAPH_OPS|policy"):
        pol.load_env(bad)
        pol.check_env()


def test_unknown_op_in_env_is_reported():
    pol.load_env("+no_such_op")
    with pytest.raises(UsageError, match="no_such_op"):
        pol.check_env()


def test_precedence_instance_context_class_env():
    pol.load_env("-rms_norm")
    assert pol.effective("rms_norm") == "native"
    pol.set_policy(rms_norm="kernel")
    assert pol.effective("rms_norm") == "kernel"
    with pol.policy(rms_norm="auto"):
        assert pol.effective("rms_norm") == "auto"
        assert pol.effective("rms_norm", instance="native") == "native"
        with pol.policy(rms_norm="native"):
            assert pol.effective("rms_norm") == "native"
        assert pol.effective("rms_norm") == "auto"
    assert pol.effective("rms_norm") == "kernel"


def test_all_applies_to_every_op_but_a_named_op_wins():
    pol.load_env("all,-layer_norm")
    assert pol.effective("rms_norm") == "kernel"
    assert pol.effective("layer_norm") == "native"


def test_context_restores_on_error_and_changes_version():
    v = pol.version()
    with pytest.raises(RuntimeError), pol.policy(rms_norm="kernel"):
        inside = pol.version()
        assert inside != v
        raise RuntimeError
    assert "ctx:rms_norm" not in pol._state
    assert pol.version() == v  # the state before the block, so its cached choices still hold
    with pol.policy(rms_norm="kernel"):
        assert pol.version() == inside


def test_unknown_names_and_values_are_errors():
    with pytest.raises(UsageError, match="unknown op"):
        pol.set_policy(rms_nrom="kernel")
    with pytest.raises(UsageError, match="unknown policy 'fast'"), pol.policy(rms_norm="fast"):
        pass


def test_a_policy_block_is_its_threads_alone():
    """A server thread running a tuned model under its policies must not change what another thread resolves."""
    import threading

    inside, outside = threading.Event(), threading.Event()
    seen = {}

    def worker():
        with pol.policy(rms_norm="kernel"):
            seen["worker"] = pol.effective("rms_norm")
            inside.set()
            outside.wait(5)

    t = threading.Thread(target=worker)
    t.start()
    assert inside.wait(5)
    seen["main"] = pol.effective("rms_norm")
    v_main = pol.version()
    outside.set()
    t.join()
    assert seen == {"worker": "kernel", "main": "auto"}
    assert pol.version() == v_main  # the other thread's block left this thread's state (and its number) alone
    pol.set_policy(rms_norm="native")  # the process's settings reach every thread
    got = []
    t = threading.Thread(target=lambda: got.append(pol.effective("rms_norm")))
    t.start()
    t.join()
    assert got == ["native"]


def test_compiled_code_guards_on_the_threads_policy_block():
    """Dynamo traces the thread-local context entries and guards on them, as it did on the process dict."""
    import threading

    import torch

    def f(x):
        return x + 1 if pol.effective("rms_norm") == "kernel" else x - 1

    cf = torch.compile(f, fullgraph=True, backend="eager")
    x = torch.zeros(2)
    got = {}

    def worker():
        with pol.policy(rms_norm="kernel"):
            got["worker"] = cf(x)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    got["main"] = cf(x)
    assert got["worker"].tolist() == [1.0, 1.0] and got["main"].tolist() == [-1.0, -1.0]


def test_a_fresh_threads_first_compiled_trace_reads_the_policy_state():
    """version() is read while Dynamo traces our blocks (ops.direct): in a fresh thread of a fresh process it must not
    take a lock or set state there (a lock inside a trace: 'Unsupported context manager', fullgraph=True failed)."""
    import subprocess
    import sys

    code = (
        "import threading, torch\n"
        "from fullgraph.models.dit import DiT, config\n"
        "torch.manual_seed(0)\n"
        "m = DiT(config('dit_s', dim=64, heads=2, depth=1)).eval()\n"
        "x, c = torch.randn(1, 16, 64), torch.randn(1, 64)\n"
        "out = []\n"
        "def run():\n"
        "    with torch.no_grad():\n"
        "        out.append(torch.compile(m, fullgraph=True, backend='eager')(x, c))\n"
        "t = threading.Thread(target=run); t.start(); t.join()\n"
        "with torch.no_grad():\n"
        "    ref = m(x, c)\n"
        "print('ok' if out and torch.allclose(out[0], ref, atol=1e-5) else 'failed')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().endswith("ok"), done.stderr[-2000:]
