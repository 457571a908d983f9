"""The README's quick start is what CI runs: keep the two in step."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_ci_runs_the_quick_start_verbatim():
    commands = quick_start_commands()
    assert len(commands) == 2
    assert commands[0].endswith("fullgraph doctor") and "pytest" in commands[1]
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    for cmd in commands:
        # verbatim, or verbatim followed by the stop-on-failure guard (an && chain does not stop under set -e)
        assert any(line == cmd or line.startswith(cmd + " || fail ") for line in ci_lines), cmd


def test_benchmarks_readme_names_every_script():
    """benchmarks/README.md lists each script with the question it answers (issue 32, item 5): a script added without
    its entry fails here."""
    text = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "benchmarks" / "probes").glob("*.py"))
    assert scripts
    unlisted = [str(p.relative_to(ROOT)) for p in scripts if p.name != "__init__.py" and p.name not in text]
    assert not unlisted, f"not in benchmarks/README.md: {unlisted}"
