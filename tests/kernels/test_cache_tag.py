"""Our ops' fingerprint in torch's compile-cache keys: a cached graph built against an older fake must miss."""

import pytest
import torch

from fullgraph.kernels import _library

pytestmark = pytest.mark.skipif(
    not hasattr(torch.compiler.config, "cache_key_tag"), reason="this torch has no torch.compiler.config.cache_key_tag"
)


@pytest.fixture
def tag():
    before = torch.compiler.config.cache_key_tag
    yield
    torch.compiler.config.cache_key_tag = before


def test_importing_fullgraph_tags_the_caches_with_the_ops_sources():
    assert torch.compiler.config.cache_key_tag.split("|")[-1] == "fullgraph-" + _library.ops_fingerprint()


def test_a_users_tag_is_kept_and_ours_replaced_when_the_sources_change(tag, monkeypatch):
    torch.compiler.config.cache_key_tag = "team-a|fullgraph-0000"
    monkeypatch.setattr(_library, "ops_fingerprint", lambda: "1111")
    _library.tag_compile_caches()
    assert torch.compiler.config.cache_key_tag == "team-a|fullgraph-1111"


def test_the_fingerprint_follows_the_op_sources(tmp_path, monkeypatch):
    for sub in ("kernels", "ops"):
        (tmp_path / "fullgraph" / sub).mkdir(parents=True)
        (tmp_path / "fullgraph" / sub / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(_library, "__file__", str(tmp_path / "fullgraph" / "kernels" / "_library.py"))
    first = _library.ops_fingerprint()
    (tmp_path / "fullgraph" / "ops" / "a.py").write_text("x = 2\n")  # a fake's strides, say
    assert _library.ops_fingerprint() != first
