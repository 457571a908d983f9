"""lint.py: planted patterns in lint_cases/ are found exactly where their `# expect:` markers say, the clean twins
have no findings (and really compile as one graph), and scope, suppression and errors behave."""

import importlib.util
import re
import textwrap
from pathlib import Path

import pytest
import torch

from fullgraph.diagnose.lint import lint_paths, lint_source, python_files
from fullgraph.diagnose.report import Finding
from fullgraph.diagnose.rules import BY_ID
from fullgraph.errors import FullgraphError, UsageError

CASES = Path(__file__).parent / "lint_cases"
BAD = sorted(CASES.glob("*_bad.py"))
GOOD = sorted(CASES.glob("*_good.py"))
EXPECT = re.compile(r"#\s*expect:\s*(FG\d{3}(?:\s*,\s*FG\d{3})*)\s*$")


def expected(path: Path) -> set[tuple[int, str]]:
    """(line, rule) for every `# expect: FG001[, FG002]` marker in a case file."""
    out = set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if m := EXPECT.search(line):
            out |= {(number, rule.strip()) for rule in m.group(1).split(",")}
    return out


def forward(body: str, args: str = "x", init: str = "") -> str:
    """A module whose forward has `body`; `init` goes into __init__ (not scanned)."""
    init_body = textwrap.indent(textwrap.dedent(init), " " * 8) if init else ""
    return (
        "import torch\nfrom torch import nn\n\n\nclass M(nn.Module):\n"
        f"    def __init__(self):\n        super().__init__()\n{init_body}\n"
        f"    def forward(self, {args}):\n{textwrap.indent(textwrap.dedent(body), ' ' * 8)}\n"
    )


def rules_in(src: str) -> set[str]:
    return {f.rule for f in lint_source(src)}


def test_every_planted_case_has_a_clean_twin():
    assert len(BAD) >= len(BY_ID)
    assert {p.name.replace("_bad.py", "_good.py") for p in BAD} == {p.name for p in GOOD}


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_planted_patterns_are_found_where_marked(path):
    want = expected(path)
    assert want, f"{path.name} has no `# expect:` markers"
    got = {(f.line, f.rule) for f in lint_paths([path])}
    assert got == want, f"missed {sorted(want - got)}; not planted {sorted(got - want)}"


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_clean_twins_have_no_findings(path):
    assert not expected(path)
    assert lint_paths([path]) == []


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_clean_twins_compile_as_one_graph_without_recompiling(path):
    """The twins are compile-friendly in fact, not only to the lint."""
    spec = importlib.util.spec_from_file_location(f"lint_case_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, make_inputs = module.example()
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(model, backend=counting_backend, fullgraph=True)
    compiled(*make_inputs())
    compiled(*make_inputs())  # fresh values, same shapes: must not recompile
    assert len(graphs) == 1


# The brief's list of what is never a finding (DESIGN.md errata 2 and friends).
NOT_FINDINGS = [
    "if x.shape[0] > 10:\n    x = x * 2",
    "if x.dim() == 4 or x.ndim == 3:\n    x = x * 2",
    "if x.ndim:\n    x = x * 2",
    "if x.size(0) > 1 and len(x) > 2 and x.numel() > 0:\n    x = x * 2",
    "if self.training:\n    x = x * 2",
    "if self.config.use_bias and self.some_flag:\n    x = x * 2",
    "if isinstance(x, tuple) or x is None or x is not None:\n    x = x * 2",
    "if x.dtype == torch.float16 and x.is_cuda:\n    x = x.float()",
    "if torch.compiler.is_compiling() or not torch.jit.is_scripting():\n    x = x * 2",
    "assert x.shape[-1] == self.dim",
    "for i in range(10):\n    x = x * 2",
    "for i in range(self.num_layers):\n    x = x * 2",
    "for block in self.blocks:\n    x = block(x)",
    "y = torch.where(x > 0, x, 0)",
    "y = x[:, 0] + x[..., :4].sum()",
    "parts = [x, x * 2]\npair = (x, x)\ny = torch.cat(parts)",
    "outs = []\nouts.append(x)\nouts.sort(key=len)",
    "values, order = x.sort(dim=-1)",
    "x[x > 0] = 0",
    "self.cache[:, 0] = x",
    "y = self.norm(x) if self.training else x",
    "n = int(x.shape[0]) + float(self.scale)",
    "for d in range(x.dim()):\n    x = x.flip(d)",
    "for d in range(x.ndim - 1):\n    x = x.flip(d)",
    "y = x.relu()\nif y.shape[-1] > 2 and y.requires_grad:\n    y = y * 2",
]

# Bare arguments in conditions are taken for flags (a multi-element tensor there would raise in eager).
FLAG_ARGUMENTS = ["if use_cache:\n    x = x * 2", "if rank == 0 and mode != 'fast':\n    x = x * 2"]


@pytest.mark.parametrize("body", FLAG_ARGUMENTS)
def test_conditions_on_bare_arguments_are_not_findings(body):
    assert lint_source(forward(body, args="x, use_cache, rank, mode")) == []


@pytest.mark.parametrize("body", NOT_FINDINGS)
def test_shape_flag_and_config_code_is_not_a_finding(body):
    assert lint_source(forward(body)) == []


@pytest.mark.parametrize(
    ("body", "rule"),
    [
        ("(idx,) = torch.where(x > 0)", "FG008"),
        ("y = self.history.pop()", "FG005"),
        ("y = x.cpu().numpy()", "FG002"),
        ("keep = x > 0\nkept = x[:, keep]", "FG008"),
        ("y = x if x.any() else -x", "FG001"),
        ("peak = x.amax()\nif peak > 1:\n    x = x / peak", "FG001"),
        ("keep = scores > 0.5\ny = x.T[keep]", "FG008"),
        ("y = torch.cat(list(inputs.values()))", "FG006"),
    ],
)
def test_one_line_patterns(body, rule):
    assert rules_in(forward(body, args="x, scores, inputs")) == {rule}


def test_an_argument_annotated_tensor_is_a_tensor_in_conditions_too():
    assert rules_in(forward("if x > 0:\n    x = -x", args="x: torch.Tensor")) == {"FG001"}


def test_finding_fields_come_from_the_rule_table():
    [f] = lint_source(forward("print(x)\nreturn x"), path="m.py")
    r = BY_ID["FG004"]
    assert f == Finding("m.py", 10, 9, "FG004", r.message.format(what="print(x)"), r.fix)


def test_a_chain_is_one_finding_and_two_calls_on_a_line_are_two():
    assert len(lint_source(forward("y = x.cpu().numpy()"))) == 1
    assert [f.col for f in lint_source(forward("y = x.min().item() + x.max().item()"))] == [13, 30]


def test_only_forward_compiled_functions_and_their_callees_are_scanned():
    src = """
import torch
from torch import nn


def unused(x):
    print("never called from forward")


def shared(x):
    print("via forward")  # expect


class M(nn.Module):
    def forward(self, x):
        return self._a(x)

    def _a(self, x):
        return self._b(x) + self._a(x)  # recursion must terminate

    def _b(self, x):
        return shared(x)

    def other(self, x):
        print("not reached")


@torch.compile
def step(x):
    print("compiled")  # expect


@torch.compile(mode="max-autotune")
def step2(x):
    print("compiled with options")  # expect


def plain(x):
    print("passed to torch.compile")  # expect


fast = torch.compile(plain)


@torch.compiler.disable
def eager_only(x):
    print("runs eagerly by design")
"""
    lines = src.splitlines()
    want = {i for i, line in enumerate(lines, 1) if line.endswith("# expect")}
    assert {f.line for f in lint_source(src)} == want


def test_bare_compile_and_aliased_torch_decorate():
    src = "import torch as T\nfrom torch import compile\n\n\n@compile\ndef f(x):\n    print(x)\n\n\n"
    src += "@T.compile\ndef g(x):\n    print(x)\n"
    assert [f.line for f in lint_source(src)] == [7, 12]


def test_disabled_callee_is_not_scanned():
    src = forward("return helper(x)").replace(
        "class M", "@torch.compiler.disable\ndef helper(x):\n    print(x)\n    return x\n\n\nclass M"
    )
    assert lint_source(src) == []


@pytest.mark.parametrize(
    ("comment", "left"),
    [
        ("# fullgraph: ignore[FG004]", {"FG002"}),
        ("# fullgraph: ignore[FG002]", {"FG004"}),
        ("# fullgraph: ignore[FG002,FG004]", set()),
        ("# fullgraph:ignore[ fg004 , FG002 ]", set()),
        ("# fullgraph: ignore", set()),
        ("# noqa", {"FG002", "FG004"}),
    ],
)
def test_suppression_comment_on_the_line(comment, left):
    assert rules_in(forward(f"print(x.item())  {comment}")) == left


def test_suppression_applies_to_its_own_line_only_and_not_inside_strings():
    assert rules_in(forward("# fullgraph: ignore\nprint(x)")) == {"FG004"}
    assert rules_in(forward('print("# fullgraph: ignore")')) == {"FG004"}


def test_unparseable_source_names_the_file_and_line():
    with pytest.raises(FullgraphError, match=r"^bad\.py:2: cannot parse: "):
        lint_source("x = 1\ndef f(:\n", path="bad.py")
    with pytest.raises(FullgraphError, match="cannot parse"):
        lint_source("x = 1\0", path="nul.py")


def test_lint_paths_errors(tmp_path):
    with pytest.raises(FullgraphError, match="no such file"):
        lint_paths([tmp_path / "missing.py"])
    with pytest.raises(UsageError, match="unknown rule FG999"):
        lint_paths([tmp_path], select=["FG001", "FG999"])
    (tmp_path / "latin.py").write_bytes(b"x = '\xe9'\n")
    with pytest.raises(FullgraphError, match=r"latin\.py: cannot read"):
        lint_paths([tmp_path / "latin.py"])


def test_select_limits_the_rules():
    path = CASES / "host_sync_bad.py"
    assert {f.rule for f in lint_paths([path], select=["fg002"])} == {"FG002"}
    assert lint_paths([path], select=["FG001"]) == []


def test_directories_are_searched_for_python_files(tmp_path):
    bad = "def forward(self, x):\n    print(x)\n"
    for rel in ("pkg/a.py", "pkg/sub/b.py", ".venv/c.py", ".git/d.py", "pkg/__pycache__/e.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"class M:\n    {bad.replace(chr(10), chr(10) + '    ')}")
    (tmp_path / "pkg/notes.txt").write_text("print(x)")
    (tmp_path / "script").write_text("class M:\n    def forward(self, x):\n        print(x)\n")
    files = python_files([tmp_path / "pkg", tmp_path / "script", tmp_path / "pkg" / "a.py"])
    assert [Path(f).relative_to(tmp_path).as_posix() for f in files] == ["pkg/a.py", "pkg/sub/b.py", "script"]
    assert len(lint_paths([tmp_path])) == 2  # a.py and b.py; hidden dirs and __pycache__ skipped


# What a compiled inference call never runs is not scanned: the doctor runs the model in eval mode, and Dynamo
# evaluates is_compiling() (True) and torch.jit.is_scripting() (False) while tracing.
NEVER_RUN = [
    "if self.training:\n    print(x)\n    x = x[x > 0]",
    "if not self.training:\n    x = x * 2\nelse:\n    print(x)",
    "if self.gradient_checkpointing and self.training:\n    logger.warning('no cache')",
    "if self.training and x.sum() > 0:\n    x = x * 2",
    "y = x.item() if self.training else x",
    "if not torch.compiler.is_compiling():\n    print(x.shape)",
    "if not is_torchdynamo_compiling() and x.sum() > 0:\n    x = x * 2",
    "if torch.jit.is_scripting():\n    print(x)",
    "synced = False if torch.compiler.is_compiling() else x.any().item()",
    "skip = False\nif self.training:\n    skip = torch.rand([]) < 0.1\nif not skip:\n    x = x * 2",
    "if self.training:\n    self._drop(x)",
]


@pytest.mark.parametrize("body", NEVER_RUN)
def test_code_a_compiled_inference_call_never_runs_is_not_scanned(body):
    src = forward(body).replace("class M", "logger = None\n\n\nclass M")
    src += "\n    def _drop(self, x):\n        print(x)\n"  # reached only from a training branch
    assert lint_source(src) == []


@pytest.mark.parametrize(
    ("body", "rule"),
    [
        ("if self.training:\n    x = x * 2\nelse:\n    print(x)", "FG004"),
        ("if x.sum() > 0 and self.training:\n    x = x * 2", "FG001"),  # evaluated before the flag settles it
        ("if torch.compiler.is_compiling():\n    y = x.item()", "FG002"),
    ],
)
def test_the_branch_a_compiled_call_takes_is_scanned(body, rule):
    assert rules_in(forward(body)) == {rule}


@pytest.mark.parametrize(
    "args",
    [
        "x, use_cache: bool = False",
        "x, output_attentions: bool | None = None",
        "x, is_causal=True",
        "x, flag: Optional[bool] = None",
    ],
)
def test_flags_are_not_python_scalar_findings(args):
    body = "if use_cache or is_causal:\n    x = x * 2\nreturn x"
    assert lint_source(forward(body, args=args)) == []


@pytest.mark.parametrize(
    "body",
    [
        "return x[:, -logits_to_keep:]",  # a size, fixed per call site
        "return self.embed(x, cache_length=logits_to_keep)",  # passed on
        "if logits_to_keep > 0:\n    x = x[:, :logits_to_keep]\nreturn x",  # tested
        "return torch.zeros(logits_to_keep)",
    ],
)
def test_numbers_only_tested_sliced_or_passed_on_are_not_findings(body):
    assert lint_source(forward(body, args="x, logits_to_keep: int | torch.Tensor = 0")) == []


@pytest.mark.parametrize(
    "body",
    [
        "return x * scale",
        "return scale * x.relu()",
        "return x + float(scale) / 2",
        "half = scale / 2\nreturn x - half",
        "for _ in range(scale):\n    x = x * 2\nreturn x",
    ],
)
def test_numbers_computed_with_are_python_scalar_findings(body):
    [f] = lint_source(forward(body, args="x, scale: int = 2"))
    assert (f.rule, f.line) == ("FG010", 9)


def test_python_scalars_of_helpers_and_called_forwards_are_not_findings():
    src = forward("return self._mix(x)") + "\n    def _mix(self, x, alpha: float = 0.5):\n        return x * alpha\n"
    assert lint_source(src) == []


@pytest.mark.parametrize(
    "body",
    [
        "kwargs.pop('output_attentions', None)\nkwargs.pop('output_hidden_states')",
        "opts = kwargs\nopts.clear()",
        "self.extra.pop('k', None)\nself.extra.pop(key, None)",
    ],
)
def test_dict_pops_and_the_calls_own_kwargs_are_not_list_mutations(body):
    assert lint_source(forward(body, args="x, key, *args, **kwargs")) == []


def test_a_set_once_attribute_is_not_module_state_mutation():
    body = """\
if self.config.problem_type is None:
    if x.shape[-1] == 1:
        self.config.problem_type = "regression"
    else:
        self.config.problem_type = "single_label_classification"
        self.other = 1
if self.cache is None and x.shape[0] > 4:
    self.cache = x
if self.last is None or x.shape[0] > 4:  # may run on every call
    self.last = x
"""
    assert [(f.rule, f.line) for f in lint_source(forward(body))] == [("FG009", 15), ("FG009", 19)]


@pytest.mark.parametrize(
    ("args", "body"),
    [
        ("x, output_attentions: torch.Tensor | None = False", "if output_attentions:\n    x = x * 2"),
        (
            "x, cache: torch.Tensor | None = None",
            "n = 0 if cache is None else cache.get_seq_length()\nif n == 0:\n    x = x * 2",
        ),
        ("x", "emb, frames = self.embed(x)\nif frames != 8:\n    x = x * 2"),
    ],
)
def test_misread_tensors_from_library_code(args, body):
    """Found in transformers: a flag annotated Tensor, a Cache annotated Tensor, a submodule returning a tuple."""
    assert lint_source(forward(body, args=args)) == []


def test_tensor_subclass_annotations_are_tensors():
    assert rules_in(forward("if ids > 0:\n    x = -x", args="x, ids: torch.LongTensor | None = None")) == {"FG001"}
