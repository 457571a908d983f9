import json

import pytest

from fullgraph.compile.options import inductor_options, registered_backends
from fullgraph.compile.presets import MODES, PRESETS, Preset, get_preset
from fullgraph.errors import UsageError


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_round_trips_json_and_names_real_mechanisms(name):
    p = PRESETS[name]
    assert Preset.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert p.summary and p.maps  # each says what it is for and how
    assert p.backend in registered_backends()
    assert set(dict(p.options)) <= inductor_options()  # no invented keys (DESIGN.md, erratum 4)
    assert p.mode in MODES


def test_the_chapters_nonexistent_options_are_named_as_dropped():
    dropped = " ".join(what for p in PRESETS.values() for what, _ in p.drops)
    for key in ("int8", "aot_inductor", "joint_graph", "backend='ipex'", "backend='cudagraphs'"):
        assert key in dropped
    assert "torchao" in " ".join(why for _, why in PRESETS["edge"].drops)


def test_perception_is_static_one_graph_with_cuda_graphs():
    p = get_preset("perception")
    assert (p.mode, p.fullgraph, p.dynamic) == ("reduce-overhead", True, False)
    assert dict(p.options)["shape_padding"] is True


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(name="x", mode="fast"), "mode 'fast' is not one of"),
        (dict(name="x", backend="eager", mode="max-autotune"), "needs backend='inductor'"),
        (dict(name="bad name!"), "preset name"),
        (dict(name="x", options=(("a", 1), ("a", 2))), "unique"),
    ],
)
def test_invalid_presets_are_refused(fields, message):
    with pytest.raises(UsageError, match=message):
        Preset(**fields)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(UsageError, match="unknown preset 'fastest'; choose one of dev, perception, planning, edge"):
        get_preset("fastest")
    with pytest.raises(UsageError, match="unknown preset"):
        get_preset(None)
    with pytest.raises(UsageError, match="do not exist"):
        Preset.from_dict({"name": "x", "speed": "max"})
