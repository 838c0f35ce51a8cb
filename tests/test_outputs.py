"""Result folders are whole or absent, whatever stops their writer (an exception, Ctrl-C,
SIGKILL, a full disk); `llmsim report` refuses one that is cut short or mixes two runs; a folder
lock names its holder and dies with it; no output is written through a planted link."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from clitools import one_line_error, run_cli
from factories import scenario_data, write_yaml

from simulator.errors import SpecError
from simulator.outputs import (
    LOCK_FILE,
    MANIFEST,
    atomic_folder,
    check_manifest,
    folder_lock,
    replace_file,
)
from simulator.runs import runner

REPO = Path(__file__).resolve().parents[1]
TINY = scenario_data(input_len=128, output_len=16, num_prompts=20, request_rate=10)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def hidden_siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """Two different runs' scenario files (seed 0 and seed 1)."""
    folder = tmp_path_factory.mktemp("scenarios")
    a = write_yaml(folder / "a.yaml", {**TINY, "seed": 0})
    b = write_yaml(folder / "b.yaml", {**TINY, "seed": 1, "name": "other"})
    yield a, b


# -- atomic folders -------------------------------------------------------------------------------
def test_a_new_folder_gets_a_manifest_and_nothing_else_is_left(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "out"
    with atomic_folder(out, "run", ["a.csv"]) as folder:
        assert folder.parent == out.parent and not out.exists()
        (folder / "a.csv").write_text("x\n1\n")
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["llmsim"] == "run" and manifest["files"]["a.csv"]["bytes"] == 4
    check_manifest(out, "run", ["a.csv"])
    assert hidden_siblings(out) == []


@pytest.mark.parametrize(
    "failure",
    [KeyboardInterrupt(), RuntimeError("boom"), OSError(errno.ENOSPC, "No space left on device")],
    ids=["ctrl-c", "bug", "full-disk"],
)
@pytest.mark.parametrize("at", range(4))
def test_a_run_stopped_at_any_file_leaves_the_previous_folder_whole(
    tmp_path: Path,
    two_runs: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    failure: BaseException,
    at: int,
) -> None:
    out = tmp_path / "run"
    runner.save_run(runner.run(two_runs[0]), out)
    before = snapshot(out)
    result = runner.run(two_runs[1])
    # the writer fails at its `at`-th CSV (requests, steps, itl) or at the manifest
    real, calls = pd.DataFrame.to_csv, [0]

    def failing(self: pd.DataFrame, *args: object, **kwargs: object) -> object:
        calls[0] += 1
        if calls[0] > at:
            raise failure
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_csv", failing)
    if at == 3:
        monkeypatch.setattr("simulator.outputs.write_manifest", lambda *_: failing(pd.DataFrame()))
    with pytest.raises(type(failure)) as err:
        runner.save_run(result, out)
    if isinstance(failure, OSError):
        assert err.value.filename == str(out)  # named for the one-line error
    assert snapshot(out) == before
    assert hidden_siblings(out) == []
    monkeypatch.undo()
    runner.save_run(result, out)  # and the next write replaces it whole
    check_manifest(out, "run", runner.RUN_FILES)
    assert json.loads((out / "summary.json").read_text())["scenario"] == "other"


# A writer that replaces one folder over and over with version A or B, each of several files
# of a few MB (the last one written tells the version too); killed at a random moment.
WRITER = """
import signal
import sys
from pathlib import Path
from simulator.outputs import atomic_folder
# Ctrl-C raises KeyboardInterrupt, as in a shell's foreground job (a background job's children
# start with SIGINT ignored, and Python then leaves it so)
signal.signal(signal.SIGINT, signal.default_int_handler)
out = Path(sys.argv[1])
names = [f"part{i}.csv" for i in range(6)]
n = 0
while True:
    version = "AB"[n % 2]
    with atomic_folder(out, "run", names) as folder:
        for name in names:
            (folder / name).write_text((version * 99 + "\\n") * 30000)
    n += 1
    if n == 2:
        print("ready", flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_a_writer_killed_at_a_random_moment_leaves_a_whole_folder(
    tmp_path: Path, sig: signal.Signals
) -> None:
    out = tmp_path / "out"
    names = [f"part{i}.csv" for i in range(6)]
    rng = random.Random(sig)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _ in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(out)], stdout=subprocess.PIPE, env=env
        )
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0, 0.3))  # the moment of the kill, not a deadline
        proc.send_signal(sig)
        while True:
            try:
                proc.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                # a Ctrl-C can be lost: Python drops an exception raised inside a finalizer
                # ("Exception ignored in ..."), and the writer writes on; press it again, as a
                # user would (a retry, not a deadline: the test never fails on time)
                proc.send_signal(sig)
        check_manifest(out, "run", names)
        versions = {(out / name).read_text()[0] for name in names}
        assert len(versions) == 1, versions  # all A or all B, never a mix
        if sig == signal.SIGINT:
            assert hidden_siblings(out) == []  # Ctrl-C cleans up after itself
    with atomic_folder(out, "run", names) as folder:  # a later write removes a kill's leftovers
        (folder / names[0]).write_text("C")
    assert hidden_siblings(out) == []


def test_a_folder_holding_other_files_is_refused_and_kept(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with (
        pytest.raises(SpecError, match=r"holds notes\.txt, which a result folder does not"),
        atomic_folder(out, "run", ["a.csv"]) as folder,
    ):
        (folder / "a.csv").write_text("x")  # pragma: no cover
    assert snapshot(out) == {"notes.txt": b"mine"}
    assert hidden_siblings(out) == []


def test_cli_run_out_into_a_foreign_folder_exits_2_before_running(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    two_runs: tuple[Path, Path],
) -> None:
    def no_run(*_: object, **__: object) -> None:
        raise AssertionError("ran")

    monkeypatch.setattr(runner, "run", no_run)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("years of work")
    err = one_line_error(capsys, "run", str(two_runs[0]), "--out", str(tmp_path / "home"))
    assert "thesis.tex" in err
    assert (tmp_path / "home" / "thesis.tex").read_text() == "years of work"


def test_cli_run_out_on_a_full_disk_exits_2_and_keeps_the_old_folder(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    two_runs: tuple[Path, Path],
) -> None:
    out = tmp_path / "run"
    assert run_cli(capsys, "run", str(two_runs[0]), "--out", str(out))[0] == 0
    before = snapshot(out)

    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", full)
    err = one_line_error(capsys, "run", str(two_runs[1]), "--out", str(out))
    assert err == f"llmsim: error: {out}: No space left on device\n"
    assert snapshot(out) == before


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_output_json_to_a_full_device_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli(
        capsys,
        *("bench", "latency", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"),
        *("--output-len", "4", "--output-json", "/dev/full"),
    )
    assert code == 2
    assert err == "llmsim: error: /dev/full: No space left on device\n"


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_cli_run_out_past_a_file_size_limit_exits_2_and_keeps_the_old_folder(
    tmp_path: Path, two_runs: tuple[Path, Path]
) -> None:
    # a real write refused by the system (EFBIG), as a full file system refuses one (ENOSPC)
    import resource

    out = tmp_path / "run"
    runner.save_run(runner.run(two_runs[0]), out)
    before = snapshot(out)

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))

    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "simulator", "run", str(two_runs[1]), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=limit,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"llmsim: error: {out}: File too large\n"
    assert snapshot(out) == before
    assert hidden_siblings(out) == []


# -- report ---------------------------------------------------------------------------------------
def test_report_refuses_a_folder_mixing_two_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], two_runs: tuple[Path, Path]
) -> None:
    # what a writer file by file left when stopped: the new run's first files, the old rest
    old, new = tmp_path / "old", tmp_path / "new"
    runner.save_run(runner.run(two_runs[0]), old)
    runner.save_run(runner.run(two_runs[1]), new)
    for name in ("summary.json", "requests.csv"):
        (old / name).write_bytes((new / name).read_bytes())
    err = one_line_error(capsys, "report", str(old))
    assert "requests.csv" in err and "mixes two results" in err
    assert not (old / "report.html").exists()


def test_report_refuses_an_incomplete_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], two_runs: tuple[Path, Path]
) -> None:
    out = tmp_path / "run"
    runner.save_run(runner.run(two_runs[0]), out)
    steps = out / "steps.csv"
    steps.write_bytes(steps.read_bytes()[: steps.stat().st_size // 2])  # torn
    err = one_line_error(capsys, "report", str(out))
    assert str(steps) in err
    (out / MANIFEST).unlink()  # cut short before its last file
    err = one_line_error(capsys, "report", str(out))
    assert "no manifest.json" in err


# -- single files and links -----------------------------------------------------------------------
def test_replace_file_replaces_a_planted_link_and_leaves_its_target(tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "sweep.yaml"
    link.symlink_to(target)
    replace_file(link, "new")
    assert target.read_text() == "keep me"
    assert not link.is_symlink() and link.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt", "sweep.yaml"]


# -- locks ----------------------------------------------------------------------------------------
def test_a_held_lock_is_refused_naming_its_holder(tmp_path: Path) -> None:
    with (
        folder_lock(tmp_path, "llmsim sweep"),
        pytest.raises(SpecError, match=rf"another llmsim sweep .*pid {os.getpid()} on "),
        folder_lock(tmp_path, "llmsim sweep"),
    ):
        pass  # pragma: no cover
    with folder_lock(tmp_path, "llmsim sweep"):  # released: taken again
        pass


HOLDER = """
import sys, time
from pathlib import Path
from simulator.outputs import folder_lock
with folder_lock(Path(sys.argv[1]), "llmsim sweep"):
    print("held", flush=True)
    sys.stdin.read()
"""


def hold_lock(folder: Path) -> subprocess.Popen[bytes]:
    """A process holding `folder`'s lock until its stdin closes (or it is killed)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
    return proc


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
def test_the_lock_of_a_killed_process_is_taken_over(tmp_path: Path) -> None:
    proc = hold_lock(tmp_path)
    with (
        pytest.raises(SpecError, match=f"pid {proc.pid} on "),
        folder_lock(tmp_path, "llmsim sweep"),
    ):
        pass  # pragma: no cover
    proc.kill()
    proc.wait()
    assert f"pid {proc.pid} " in (tmp_path / LOCK_FILE).read_text()  # stale
    with folder_lock(tmp_path, "llmsim sweep"):
        assert f"pid {os.getpid()} " in (tmp_path / LOCK_FILE).read_text()


def test_a_link_planted_as_the_lock_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep me")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / LOCK_FILE).symlink_to(target)
    with (
        pytest.raises(SpecError, match="is a symbolic link"),
        folder_lock(tmp_path / "out", "llmsim sweep"),
    ):
        pass  # pragma: no cover
    assert target.read_text() == "keep me"


def test_a_run_into_the_working_folder_replaces_it_and_stays_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two_runs: tuple[Path, Path]
) -> None:
    out = tmp_path / "here"
    out.mkdir()
    monkeypatch.chdir(out)
    for scenario in two_runs:  # into an empty working folder, then over its own result
        runner.save_run(runner.run(scenario), ".")
        check_manifest(out, "run", runner.RUN_FILES)
        assert Path.cwd() == out and Path("summary.json").is_file()
    assert json.loads(Path("summary.json").read_text())["scenario"] == "other"
    assert hidden_siblings(out) == []
