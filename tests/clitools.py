"""Running `llmsim` in this process from a test: `run_cli(capsys, *args)`, and
`one_line_error` for a command that must fail as bad input."""

from __future__ import annotations

import pytest

from simulator.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `llmsim ARGS` run in this process."""
    try:
        main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    else:
        code = 0
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one error line of `llmsim ARGS`, which must exit 2 and print nothing else."""
    code, out, err = run_cli(capsys, *args)
    assert out == ""
    assert code == 2, err
    assert err.startswith("llmsim: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "Warning" not in err
    return err
