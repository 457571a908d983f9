"""FG003 planted: NumPy, SciPy and pandas calls in forward, whatever the import spelling."""

import numpy
import numpy as np
import pandas as pd
import scipy.special
import torch
from numpy import clip as np_clip
from scipy import ndimage
from torch import nn


class Calibrate(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        h = self.proj(x)
        ramp = torch.as_tensor(np.linspace(0.0, 1.0, 8))  # expect: FG003
        gain = scipy.special.erf(0.5)  # expect: FG003
        bound = np_clip(2.0, 0.0, 1.0)  # expect: FG003
        root = numpy.sqrt(2.0)  # expect: FG003
        table = pd.DataFrame({"a": [1.0]})  # expect: FG003
        smooth = ndimage.gaussian_filter1d([1.0, 2.0], 1.0)  # expect: FG003
        return h * ramp * gain * bound * root, table, smooth
