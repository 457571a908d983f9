"""fullgraph: make PyTorch inference compile cleanly under torch.compile and run fast."""

from fullgraph._version import __version__
from fullgraph.errors import FullgraphError, UsageError

__all__ = ["FullgraphError", "UsageError", "__version__", "compile", "doctor", "export", "load", "trusted_guards"]


def __getattr__(name):
    # `fullgraph.compile(model, ...)` without importing torch at `import fullgraph`: the subpackage is imported on
    # first use, and it is callable (fullgraph/compile/__init__.py says why it is not a function here).
    if name == "compile":
        import importlib

        return importlib.import_module("fullgraph.compile")
    raise AttributeError(f"module 'fullgraph' has no attribute {name!r}")


def export(model, example_inputs, path, **options):
    """An AOTInductor package of `model` at `path` (torch.export + aoti_compile_and_package); see
    fullgraph.deploy.build.export for the options."""
    from fullgraph.deploy import export as run

    return run(model, example_inputs, path, **options)


def load(path, **options):
    """A callable from an AOTInductor package, loaded only after a child process loaded it safely; see
    fullgraph.deploy.package.load."""
    from fullgraph.deploy import load as run

    return run(path, **options)


def doctor(model, args=(), kwargs=None, **options):
    """Examine `model(*args, **kwargs)`: graph breaks, recompiles, every compile mode timed, where the time goes;
    see fullgraph.diagnose.doctor.doctor for the options."""
    from fullgraph.diagnose.doctor import doctor as run

    return run(model, args, kwargs, **options)


def trusted_guards(entries):
    """A `guard_filter_fn` for plain `torch.compile(model, options={"guard_filter_fn": fullgraph.trusted_guards})`
    of a model built from fullgraph's ops: Dynamo stops checking, on every call, that fullgraph's own functions and
    modules are still the same objects (`fullgraph.compile` does this itself); see fullgraph.compile.guards."""
    from fullgraph.compile.guards import trusted_code

    return trusted_code(entries)
