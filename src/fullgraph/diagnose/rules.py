"""The lint rules: data only (the checker is lint.py; each rule's why, and examples, are in docs/rules.md).

`message` is a template: `{what}` becomes the offending code. `fix` is printed after it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    message: str
    fix: str


RULES: tuple[Rule, ...] = (
    Rule(
        "FG001",
        "tensor-value-branch",
        "`{what}` branches on a tensor's value: Dynamo cannot trace a data-dependent branch and breaks the graph",
        "compute both sides and select with torch.where(cond, a, b) or a mask; keep value checks out of forward",
    ),
    Rule(
        "FG002",
        "host-sync",
        "`{what}` is a host sync: the CPU waits for the device, and .item() and .tolist() also break the graph",
        "keep the value a tensor and use it in tensor ops; convert it after the model call, outside forward",
    ),
    Rule(
        "FG003",
        "numpy-scipy-pandas",
        "`{what}` runs NumPy/SciPy/pandas code in forward: SciPy and pandas break the graph, NumPy is rewritten",
        "write it with torch ops on the tensor's device, or compute it once in __init__ or before the call",
    ),
    Rule(
        "FG004",
        "print-logging",
        "`{what}` prints or logs in forward: Dynamo breaks the graph at every print and logging call",
        "log outside the model, or list the function in torch._dynamo.config.reorderable_logging_functions",
    ),
    Rule(
        "FG005",
        "persistent-list-mutation",
        "`{what}` mutates a list that outlives the call: Dynamo guards on its contents, so every call recompiles",
        "return the values (a tuple, or torch.cat of a local list), or write into a buffer registered in __init__",
    ),
    Rule(
        "FG006",
        "input-dict-iteration",
        "`{what}` iterates a dict passed to forward: the loop is unrolled per key and each new key set recompiles",
        "flatten the dict before the model (collate_fn), or read fixed keys at the top: x = inputs['image']",
    ),
    Rule(
        "FG007",
        "loop-over-tensor-size",
        "`{what}` loops over a tensor size: unrolled and guarded on that size, so each new size recompiles",
        "vectorize over that dimension (batched ops, torch.vmap), or loop a fixed count set in __init__",
    ),
    Rule(
        "FG008",
        "data-dependent-shape",
        "`{what}` makes an output whose size depends on tensor values: a graph break, or no CUDA graph when captured",
        "keep shapes fixed: torch.where(mask, x, 0), x * mask, topk with a fixed k, or torch.nonzero_static(m, size=n)",
    ),
    Rule(
        "FG009",
        "module-state-mutation",
        "`{what}` writes module state in forward: a stored Python value is guarded, so each new value recompiles",
        "register a buffer in __init__ and update it in place (self.buf.copy_(v)), or return the state to the caller",
    ),
    Rule(
        "FG010",
        "python-scalar-argument",
        "forward argument `{what}` is a Python scalar: Dynamo guards on its value, so a new value recompiles",
        "pass a tensor (torch.tensor(v, device=x.device)), or fix the value in __init__",
    ),
)

BY_ID: dict[str, Rule] = {r.id: r for r in RULES}

# What the checks match, by name. A method in VALUE_METHODS reads a tensor's value: a condition calling it is
# data-dependent (FG001). SIZE_METHODS (and is_*) return sizes or flags, which Dynamo guards on instead.
VALUE_METHODS = frozenset(
    {"sum", "any", "all", "item", "max", "min", "mean", "median", "std", "var", "norm", "prod", "amax", "amin",
     "argmax", "argmin", "count_nonzero", "equal", "allclose", "is_nonzero", "tolist"}
)  # fmt: skip
SIZE_METHODS = frozenset({"size", "dim", "ndimension", "numel", "nelement", "element_size", "stride", "get_device"})
# A tensor's attributes that are tensors (its .shape, .dtype, .device are not).
TENSOR_ATTRS = frozenset({"T", "mT", "H", "mH", "real", "imag", "data", "grad"})
SYNC_METHODS = frozenset({"item", "tolist", "numpy", "cpu"})  # FG002, with .synchronize(), .to("cpu"), int(t), float(t)
NON_TORCH_LIBS = frozenset({"numpy", "scipy", "pandas"})  # FG003: calls into these, import aliases resolved
LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "log"})
LOGGER_NAMES = frozenset({"logger", "_logger", "LOGGER", "log", "_log"})  # and names bound to logging.getLogger(...)
LIST_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "sort", "clear", "reverse"})
DICT_VIEWS = frozenset({"items", "keys", "values"})
DYNAMIC_SHAPE_OPS = frozenset({"nonzero", "unique", "unique_consecutive", "masked_select", "argwhere"})
MASK_FUNCS = frozenset(
    {"isnan", "isinf", "isfinite", "isneginf", "isposinf", "isin", "isclose", "logical_and", "logical_or",
     "logical_not", "logical_xor", "eq", "ne", "gt", "ge", "lt", "le", "bool"}
)  # fmt: skip
# torch functions that return tensors live in these namespaces (and torch.ops.*), less is_*/has_*/get_*/set_*,
# CamelCase classes and these:
TENSOR_NAMESPACES = frozenset(
    {"torch", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special", "torch.nested", "torch.sparse"}
)
NOT_TENSOR_TORCH = frozenset({"finfo", "iinfo", "device", "numel", "broadcast_shapes"})
# Methods whose result is a Python value, not a tensor: tensor-to-Python conversions, and methods tensors lack.
PYTHON_METHODS = frozenset(
    {"item", "tolist", "numpy", "get", "keys", "values", "items", "copy", "count", "index", "format", "join",
     "startswith", "endswith", "lower", "upper", "strip"}
)  # fmt: skip
# Calls whose value a compiled call knows (syntax.known_truth): Dynamo evaluates them while tracing.
COMPILING = frozenset({"is_compiling", "is_dynamo_compiling", "is_torchdynamo_compiling"})  # True when compiled
NOT_COMPILING = frozenset({"is_scripting", "is_tracing"})  # torch.jit's: False when compiled
NUMBER_FUNCS = frozenset({"float", "int", "abs", "round", "min", "max"})  # a number in, a number out (value_names)
COMPILE = frozenset({"torch.compile"})
DISABLE = frozenset({"torch.compiler.disable", "torch._dynamo.disable"})  # callees that run eagerly: not scanned
