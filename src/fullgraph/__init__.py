"""fullgraph: make PyTorch inference compile cleanly under torch.compile and run fast."""

from fullgraph._version import __version__
from fullgraph.errors import FullgraphError, UsageError

__all__ = ["FullgraphError", "UsageError", "__version__", "doctor"]


def doctor(model, example_inputs, **kwargs):
    """Examine a model: graph breaks, recompiles, every compile mode timed; see fullgraph.diagnose.doctor."""
    from fullgraph.diagnose.doctor import doctor as run

    return run(model, example_inputs, **kwargs)
