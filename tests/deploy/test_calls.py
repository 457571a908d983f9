"""Telling a failed package call apart: inputs that do not fit the exported ones (with declared dynamic dims), and
torch's out-of-memory count rising."""

import torch

from fullgraph.deploy._calls import OomCount, cuda_device, dynamic_ranges, misfit, tensor_specs


def test_tensor_specs_read_the_tensors_of_a_signature_and_skip_the_rest():
    specs = tensor_specs("4x3x224x224:bfloat16@cuda, 7, :float32@cpu, 'text'")
    assert specs == [((4, 3, 224, 224), "bfloat16", "cuda"), ((), "float32", "cpu")]


def test_misfit_names_the_first_difference_and_none_when_inputs_fit():
    fixed = dynamic_ranges({"fullgraph_dynamic": "{}", "fullgraph_flat_dynamic": "{}"}, "fullgraph_")
    exported = "4x8:float32@cpu, 4x2:float32@cpu"
    assert misfit("4x8:float32@cpu, 4x2:float32@cpu", exported, fixed) is None
    assert misfit("8x8:float32@cpu, 4x2:float32@cpu", exported, fixed) == "dim 0 of input 0 is 8, exported fixed at 4"
    assert misfit("4x8:bfloat16@cpu, 4x2:float32@cpu", exported, fixed) == (
        "input 0 is bfloat16 on cpu, it takes float32 on cpu"
    )
    assert misfit("4x8:float32@cpu", exported, fixed) == "1 tensor inputs given, it takes 2"
    assert misfit("4x8x1:float32@cpu, 4x2:float32@cpu", exported, fixed) == "input 0 has 3 dims, it takes 2"
    assert misfit("8x8:float32@cpu", None, fixed) is None  # nothing recorded: nothing to say


def test_declared_dims_by_input_index_and_the_lenient_reading_of_older_packages():
    flat = dynamic_ranges({"fullgraph_flat_dynamic": '{"1": {"0": [1, 64]}}'}, "fullgraph_")
    exported = "4x8:float32@cpu, 4x2:float32@cpu"
    assert misfit("4x8:float32@cpu, 9x2:float32@cpu", exported, flat) is None
    assert misfit("4x8:float32@cpu, 65x2:float32@cpu", exported, flat) == (
        "dim 0 of input 1 is 65, outside its declared range 1..64"
    )
    assert misfit("9x8:float32@cpu, 9x2:float32@cpu", exported, flat) == "dim 0 of input 0 is 9, exported fixed at 4"
    # Recorded by name only (an older export): any input's declared dim is free within the widest range.
    named = dynamic_ranges({"fullgraph_dynamic": '{"x": {"0": [2, 8]}, "y": {"-1": [1, 16]}}'}, "fullgraph_")
    assert misfit("9x8:float32@cpu, 4x16:float32@cpu", exported, named) == (
        "dim 0 of input 0 is 9, outside its declared range 2..8"
    )
    assert misfit("8x8:float32@cpu, 4x16:float32@cpu", exported, named) is None


def test_the_out_of_memory_count_rises_only_after_a_new_event(monkeypatch):
    counts = iter([3, 3, 5, 5])
    monkeypatch.setattr(OomCount, "read", staticmethod(lambda device: next(counts)))
    ooms, gpu = OomCount(), torch.device("cuda", 0)
    ooms.start(gpu)  # baseline 3
    assert ooms.rose(gpu) is False  # still 3
    assert ooms.rose(gpu) is True  # 5: an out-of-memory since the last reading
    assert ooms.rose(gpu) is False  # still 5
    assert ooms.rose(None) is False
    assert cuda_device((torch.randn(2),), {"m": torch.randn(1)}) is None
