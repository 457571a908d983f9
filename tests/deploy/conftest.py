import pytest


@pytest.fixture(autouse=True)
def fullgraph_cache(tmp_path, monkeypatch):
    """fullgraph's cache folder (the probe verdicts) under this test's tmp folder, never the user's."""
    folder = tmp_path / "fullgraph-cache"
    monkeypatch.setenv("FULLGRAPH_CACHE_DIR", str(folder))
    return folder
