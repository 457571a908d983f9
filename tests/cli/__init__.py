"""What the CLI tests share."""


def last_error(capsys, command: str) -> str:
    """The one error line `fullgraph COMMAND` printed last on stderr, with no traceback before it."""
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in err), err
    assert err[-1].startswith(f"fullgraph {command}: error: "), err
    return err[-1]
