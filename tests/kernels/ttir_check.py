"""Build every kernel for a Hopper target with the argument types Inductor's wrapper gives them: the Triton IR,
then the whole compilation to a binary.

A kernel launched directly gets Triton's own typing (Python floats as fp32); inside a torch.compile graph,
Inductor's wrapper launches it with floats as fp64 and ints equal to 1 as constants. A kernel that only
compiles one way breaks torch.compile on the GPU, which CI has no GPU to see; building the IR needs none.

Run without TRITON_INTERPRET (the interpreter replaces triton.jit): python -m tests.kernels.ttir_check
Prints one line per case: "ok <case>" or "FAIL <case>: <error>".
"""

import inspect
import sys

import torch

import fullgraph.kernels.flash_attention as fa
from fullgraph import env
from fullgraph.kernels import layer_norm, modulate, rms_norm, rope

_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32"}


_calls: list = []
TARGET = None  # set in main: GPUTarget("cuda", 90, 32)


class _Record:
    """Stands in for `launch(kernel)[grid](...)`: keeps the kernel and its arguments, launches nothing."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        return lambda *args, **kwargs: _calls.append((self.kernel, args, kwargs))


def inductor_signature(kernel, args, kwargs):
    """(signature, constexprs) as Inductor's user-kernel wrapper types them."""
    bound = dict(zip(kernel.arg_names, args, strict=False)) | kwargs
    signature, constexprs = {}, {}
    for p in kernel.params:
        value = bound.get(p.name)
        if p.is_constexpr or value is None or (type(value) is int and value == 1):
            signature[p.name] = "constexpr"
            constexprs[(p.num,)] = value
        elif isinstance(value, torch.Tensor):
            signature[p.name] = "*" + _TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[p.name] = "i1"
        elif isinstance(value, float):
            signature[p.name] = "fp64"
        else:
            signature[p.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
    return signature, constexprs


def build_ir(kernel, signature, constexprs) -> None:
    from triton._C.libtriton import ir
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    backend = make_backend(TARGET)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    args = [options, backend.get_codegen_implementation(options), backend.get_module_map(), context]
    if "target" in inspect.signature(source.make_ir).parameters:
        args.insert(0, TARGET)
    source.make_ir(*args)


def build_cubin(kernel, signature, constexprs, num_warps: int, num_stages: int) -> None:
    """The whole compilation to a Hopper binary, which runs the backend's passes (warp specialization among
    them) that building the IR does not; ptxas ships with triton, and no GPU is needed."""
    import triton
    from triton.compiler import ASTSource

    if kernel.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})
    serialized = wgmma_serialized(compiled.asm["ptx"])
    if serialized:
        raise RuntimeError(serialized)


def wgmma_serialized(ptx: str) -> str:
    """ptxas's note when it serializes every wgmma of a kernel (each product waited on before the next issues),
    which triton's own build does not show: "" when there is none. It happens when an instruction touches the
    accumulator of a product in flight (C7514); the Gluon kernel's first form lost a quarter of its speed so."""
    import os
    import subprocess
    import tempfile

    import triton

    if "wgmma" not in ptx:  # nothing to serialize (the row kernels, Triton kernels built without wgmma)
        return ""
    ptxas = os.environ.get("TRITON_PTXAS_PATH") or os.path.join(
        os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        arch = "sm_90a" if ".target sm_90a" in ptx else "sm_90"
        done = subprocess.run([ptxas, f"-arch={arch}", "-v", path, "-o", path + ".cubin"], capture_output=True,
                              text=True)  # fmt: skip
    notes = [line for line in (done.stdout + done.stderr).splitlines() if "serialized" in line]
    return notes[0].split("Potential Performance Loss: ")[-1] if notes else ""


def cases():
    """(name, call) pairs: each call runs one launcher on CPU tensors through the recorder."""
    bf16 = {"dtype": torch.bfloat16}
    x, w = torch.randn(6, 64, **bf16), torch.randn(64, **bf16)
    q, kv = torch.randn(1, 4, 100, 128, **bf16), torch.randn(1, 2, 100, 128, **bf16)
    cos = torch.randn(100, 64)
    shift = torch.randn(1, 64, **bf16)
    yield "rms_norm", lambda: rms_norm.rms_norm_fwd.launcher(x, w, 1e-6)
    yield "rms_norm_residual", lambda: rms_norm.rms_norm_residual_fwd.launcher(x, x, w, 1e-6)
    yield "layer_norm", lambda: layer_norm.layer_norm_fwd.launcher(x, w, w, 1e-5)
    x3, p3 = torch.randn(2, 3, 3072, **bf16), torch.randn(2, 1, 3072, **bf16)  # the DiT's rows of 3072, per batch
    yield "layer_norm_modulate", lambda: layer_norm.layer_norm_modulate_fwd.launcher(x3, p3, p3, 1e-6)
    yield (
        "layer_norm_modulate_residual",
        lambda: layer_norm.layer_norm_modulate_residual_fwd.launcher(x3, x3, p3, p3, p3, 1e-6),
    )
    yield "rope", lambda: rope.rope_fwd.launcher(q, cos, cos, False, 2)
    yield "rope interleaved partial", lambda: rope.rope_fwd.launcher(q, cos[:, :40], cos[:, :40], True, 2)
    # q and k as views of a [B, N, 3, H, D] projection, grouped (fewer k heads), weights in float32
    qkv = torch.randn(1, 100, 3, 4, 128, **bf16)
    w32 = torch.randn(128)
    yield (
        "qk_norm_rope",
        lambda: rope.qk_norm_rope_fwd.launcher(
            qkv[:, :, 0], qkv[:, :, 1, :2], w32, w32, cos, cos, 1e-6, 1e-6, False, 1
        ),
    )
    yield (
        "qk_norm_rope interleaved partial unweighted",
        lambda: rope.qk_norm_rope_fwd.launcher(q, kv, None, None, cos[:, :40], cos[:, :40], 1e-6, 1e-6, True, 2),
    )
    # head dim 72 and width 1408: rows in power-of-two pieces, strides not multiples of 16
    qkv72, w72, cos36 = torch.randn(1, 100, 3, 4, 72, **bf16), torch.randn(72), torch.randn(100, 36)
    for interleaved in (False, True):
        yield (
            f"qk_norm_rope 72 interleaved={int(interleaved)}",
            lambda i=interleaved: rope.qk_norm_rope_fwd.launcher(
                qkv72[:, :, 0], qkv72[:, :, 1], w72, w72, cos36, cos36, 1e-6, 1e-6, i, 1
            ),
        )
    x1408, p1408 = torch.randn(2, 3, 1408, **bf16), torch.randn(2, 1, 1408, **bf16)
    yield (
        "layer_norm_modulate_residual 1408",
        lambda: layer_norm.layer_norm_modulate_residual_fwd.launcher(x1408, x1408, p1408, p1408, p1408, 1e-6),
    )
    # a DiT block's two branches in one sum (the next block's first norm), and its second norm writing y alone
    yield (
        "layer_norm_modulate_residual two branches 1408",
        lambda: layer_norm.layer_norm_modulate_residual_fwd.launcher(
            x1408, x1408, p1408, p1408, p1408, 1e-6, x1408, p1408
        ),
    )
    yield (
        "layer_norm_modulate_residual_y 1408",
        lambda: layer_norm.layer_norm_modulate_residual_y_fwd.launcher(x1408, x1408, p1408, p1408, p1408, 1e-6),
    )
    yield "modulate", lambda: modulate.modulate_fwd.launcher(x, shift, shift)
    yield "gated_residual", lambda: modulate.gated_residual_fwd.launcher(x, x, shift)
    for tma, ws in ((False, False), (True, False), (True, True)):
        for causal in (False, True):
            cfg = fa.Config(128, 64, 4, 2, tma, ws)
            yield (
                f"flash_attention tma={int(tma)} ws={int(ws)} causal={int(causal)}",
                lambda c=cfg, causal=causal: _with_config(c, q, kv, causal),
            )
    # whole key blocks: the single warp-specialized loop the launcher picks on Hopper
    q256 = torch.randn(1, 4, 256, 128, **bf16)
    yield "flash_attention ws_tile", lambda: _with_config(fa.WS_TILE, q256, q256, False)
    if gluon_builds():
        for block_n, stages, causal, ws in ((128, 2, False, False), (64, 3, False, False), (128, 2, True, False),
                                             (128, 2, False, True), (64, 4, True, True)):  # fmt: skip
            cfg = fa.Config(128, block_n, 4 if ws else 8, stages, ws=ws, gluon=True)
            yield (
                f"flash_attention gluon{' ws' if ws else ''} {block_n}/{stages} causal={int(causal)}",
                lambda c=cfg, causal=causal: _with_config(c, q, q, causal),
            )


def gluon_builds() -> bool:
    """The Gluon kernel is written against Triton 3.6's Gluon API (built with 3.6 and 3.8); older ones differ."""
    return env.triton_at_least(3, 6)


def _with_config(cfg, q, kv, causal):
    fa.override = cfg
    try:
        fa.flash_attention_fwd.launcher(q, kv, kv, causal, 0.088)
    finally:
        fa.override = None


def main() -> int:
    global TARGET
    from triton.backends.compiler import GPUTarget

    TARGET = GPUTarget("cuda", 90, 32)
    failed = 0
    for module in (fa, modulate, rms_norm, rope):  # the modules that launch (layer_norm uses rms_norm's)
        module.launch = _Record
    fa.launch_direct = _Record  # the Gluon kernel's launch
    fa._tma_fits = lambda *tensors: True  # the cases' tensors are aligned; on the CPU the check says no GPU
    fa._gluon_refusal = lambda *args: ""  # likewise: it refuses anything but a Hopper GPU
    for name, call in cases():
        _calls.clear()
        call()
        (kernel, args, kwargs), *_ = _calls
        warps, stages = kwargs.pop("num_warps", 4), kwargs.pop("num_stages", 3)  # triton's defaults
        try:
            signature = inductor_signature(kernel, args, kwargs)
            if not kernel.is_gluon():  # a Gluon kernel's IR needs the warp count: built by the compilation below
                build_ir(kernel, *signature)
            build_cubin(kernel, *signature, warps, stages)
            print(f"ok {name}")
        except Exception as e:
            failed += 1
            cause = e.__cause__ or e
            print(f"FAIL {name}: {type(cause).__name__}: {str(cause).strip().splitlines()[-1]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
