import os
import sys

import pytest

from fullgraph import _paths
from fullgraph._paths import display_path, module_name


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A site-packages directory on sys.path, a project with a pyproject.toml, and a plain folder, under tmp."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "transformers" / "models" / "bert").mkdir(parents=True)
    (site / "transformers" / "models" / "bert" / "modeling_bert.py").write_text("")
    project = tmp_path / "proj"
    (project / "src" / "pkg").mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    (project / "src" / "pkg" / "model.py").write_text("")
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "script.py").write_text("")
    here = tmp_path / "here"
    (here / "sub").mkdir(parents=True)
    monkeypatch.chdir(here)
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    _paths.project_root.cache_clear()
    return tmp_path


def test_under_the_current_directory_is_relative_to_it(tree):
    assert display_path(tree / "here" / "sub" / "a.py") == os.path.join("sub", "a.py")
    assert display_path("sub/a.py") == os.path.join("sub", "a.py")


def test_site_packages_files_read_as_their_package_path(tree):
    path = tree / "venv" / "lib" / "python3.11" / "site-packages" / "transformers" / "models" / "bert"
    assert display_path(path / "modeling_bert.py") == os.path.join("transformers", "models", "bert", "modeling_bert.py")


def test_project_files_are_relative_to_the_project_root(tree):
    assert display_path(tree / "proj" / "src" / "pkg" / "model.py") == os.path.join("src", "pkg", "model.py")


def test_anything_else_is_absolute_never_a_climb(tree):
    shown = display_path(tree / "loose" / "script.py")
    assert shown == str(tree / "loose" / "script.py")
    assert ".." not in shown.split(os.sep)


def test_symlinked_site_packages_still_matches(tree, tmp_path):
    link = tmp_path / "linked"
    link.symlink_to(tree / "venv" / "lib" / "python3.11" / "site-packages" / "transformers")
    assert display_path(link / "models" / "bert" / "modeling_bert.py").startswith("transformers")


@pytest.mark.parametrize("name", ["<string>", "<frozen importlib._bootstrap>", ""])
def test_names_that_are_not_files_come_back_unchanged(name):
    assert display_path(name) == name


def test_module_name_from_the_deepest_import_root(tree):
    site = tree / "venv" / "lib" / "python3.11" / "site-packages"
    assert module_name(site / "transformers" / "models" / "bert" / "modeling_bert.py") == (
        "transformers.models.bert.modeling_bert"
    )
    assert module_name(site / "transformers" / "__init__.py") == "transformers"
    assert module_name(os.__file__) == "os"
    assert module_name(tree / "loose" / "script.txt") is None


def test_module_name_of_a_file_outside_every_import_root(tree, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(tree / "proj" / "src")])
    assert module_name(tree / "proj" / "src" / "pkg" / "model.py") == "pkg.model"
    assert module_name(tree / "loose" / "script.py") is None


def test_a_removed_current_directory_leaves_absolute_paths(tree, monkeypatch):
    def gone():
        raise FileNotFoundError("cwd removed")

    monkeypatch.setattr(os, "getcwd", gone)
    path = tree / "loose" / "script.py"
    assert display_path(path) == str(path)
