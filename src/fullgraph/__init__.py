"""fullgraph: make PyTorch inference compile cleanly under torch.compile and run fast."""

from fullgraph._version import __version__
from fullgraph.errors import FullgraphError, UsageError

__all__ = ["FullgraphError", "UsageError", "__version__"]
