"""FG004 planted: print and logging in forward and in a helper it calls."""

import logging

from torch import nn

logger = logging.getLogger(__name__)
audit = logging.getLogger("audit")


class Noisy(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.logger = logging.getLogger("noisy")

    def forward(self, x):
        print("input", x.shape)  # expect: FG004
        logger.info("forward")  # expect: FG004
        audit.debug("called")  # expect: FG004
        logging.warning("plain logging")  # expect: FG004
        self.logger.info("on the module")  # expect: FG004
        logging.getLogger(__name__).error("inline logger")  # expect: FG004
        return self._tail(self.proj(x))

    def _tail(self, h):
        print("tail")  # expect: FG004
        return h
