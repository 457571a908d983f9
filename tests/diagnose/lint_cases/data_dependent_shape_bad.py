"""FG008 planted: outputs whose size depends on tensor values (the seed's DynamicNMS, and friends)."""

import torch
from torch import nn


class DynamicNMS(nn.Module):
    def forward(self, boxes, scores):
        keep = scores > 0.5
        kept = boxes[keep]  # expect: FG008
        top = boxes[scores > 0.9]  # expect: FG008
        valid = ~torch.isnan(scores)
        clean = scores[valid & keep]  # expect: FG008
        idx = torch.nonzero(keep)  # expect: FG008
        rows = keep.nonzero(as_tuple=True)  # expect: FG008
        labels = torch.unique(scores)  # expect: FG008
        distinct = scores.unique()  # expect: FG008
        picked = torch.masked_select(scores, keep)  # expect: FG008
        (where,) = torch.where(keep)  # expect: FG008
        cols = boxes.T[:, keep]  # expect: FG008
        return kept, top, clean, idx, rows, labels, distinct, picked, where, cols
