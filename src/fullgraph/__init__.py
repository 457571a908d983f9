"""fullgraph: make PyTorch inference compile cleanly under torch.compile and run fast."""

from fullgraph._version import __version__
from fullgraph.errors import FullgraphError, UsageError

__all__ = ["FullgraphError", "UsageError", "__version__", "doctor"]


def doctor(model, args=(), kwargs=None, **options):
    """Examine `model(*args, **kwargs)`: graph breaks, recompiles, every compile mode timed, where the time goes;
    see fullgraph.diagnose.doctor.doctor for the options."""
    from fullgraph.diagnose.doctor import doctor as run

    return run(model, args, kwargs, **options)
