import pytest


@pytest.fixture(autouse=True)
def fullgraph_cache(tmp_path, monkeypatch):
    """fullgraph's cache folder (the probe verdicts) under this test's tmp folder, never the user's."""
    folder = tmp_path / "fullgraph-cache"
    monkeypatch.setenv("FULLGRAPH_CACHE_DIR", str(folder))
    return folder


@pytest.fixture(scope="session")
def mlp_package(tmp_path_factory):
    """One small CPU package, exported once per session (tens of seconds on 2 cores): `_models.MLP` at batch 4,
    inputs 4x8, every dim fixed. Returns (path, model)."""
    import torch

    from fullgraph.deploy import export
    from tests.deploy._models import MLP

    model = MLP().eval()
    path = tmp_path_factory.mktemp("mlp-package") / "mlp.pt2"
    export(model, (torch.randn(4, 8),), path)
    return path, model
