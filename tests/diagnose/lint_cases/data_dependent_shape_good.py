"""FG008's clean twin: the compile-friendly NMS of the seed's exercise 2.4, with fixed-size outputs and masks."""

import torch
from torch import nn


class FixedNMS(nn.Module):
    def __init__(self, max_boxes: int = 4):
        super().__init__()
        self.max_boxes = max_boxes

    def forward(self, boxes, scores):
        keep = scores > 0.5
        masked = torch.where(keep, scores, torch.zeros_like(scores))
        top, order = masked.topk(self.max_boxes)
        kept = boxes[order] * (top > 0).unsqueeze(-1)  # an index tensor of fixed size, then a mask multiply
        corners = boxes[:, 0] + boxes[..., :2].sum(-1)
        scores = scores.clone()
        scores[~keep] = 0  # a masked store keeps the shape
        if self.training and boxes.shape[0] > self.max_boxes:
            kept = kept * 1.0
        return kept, top, corners, scores


def example():
    """The model and a maker of fresh inputs, for the compile test."""
    return FixedNMS().eval(), lambda: (torch.randn(16, 4), torch.rand(16))
