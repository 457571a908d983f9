"""TARGET: a tiny BERT classifier (random weights, no download) that takes keyword inputs, as a tokenizer's dict.

fullgraph doctor tests/diagnose/targets/bert.py:model --input 2x16:int64 --input attention_mask=2x16:int64
fullgraph doctor tests/diagnose/targets/bert.py:with_inputs
"""

import torch

VOCAB = 1024  # over the range `--input N:int64` draws ids from, so a spec's random ids are valid tokens


def model():
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, num_labels=3,
    )  # fmt: skip
    return BertForSequenceClassification(config).eval()


def inputs(batch: int = 2, seq: int = 16) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(0, VOCAB, (batch, seq))
    attention_mask = torch.ones(batch, seq, dtype=torch.int64)
    attention_mask[-1, seq * 2 // 3 :] = 0  # the last sequence is padded
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def with_inputs():
    return model(), (), inputs()
