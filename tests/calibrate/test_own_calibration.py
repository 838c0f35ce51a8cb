"""`python -m simulator.calibrate --gemm-csv FILE --hardware SPEC.yaml`: a device of one's own
fitted to GEMMs timed on it (tools/measure_gpu.py's format), written beside the spec."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator import calibrate
from simulator.calibrate.fit import predict
from simulator.calibrate.own import read_gemm_csv
from simulator.specs import load_hardware
from simulator.specs.loader import hardware_dirs
from simulator.validate import data
from simulator.validate.gemm_library import library_groups

SHAPES = {(4096, 4096), (14336, 4096), (4096, 14336), (1024, 8192)}


def _spec(tmp_path: Path, name: str = "my_gpu.yaml") -> Path:
    source = next(d / "h200_sxm.yaml" for d in hardware_dirs() if (d / "h200_sxm.yaml").is_file())
    return Path(shutil.copy(source, tmp_path / name))


def _timings(tmp_path: Path, rows: pd.DataFrame) -> Path:
    path = tmp_path / "gemm.csv"
    rows.to_csv(path, index=False)
    return path


def _h200_rows() -> pd.DataFrame:
    rows = data.llmsim_gemm("h200_sxm")
    return rows[[(n, k) in SHAPES for n, k in zip(rows["n"], rows["k"], strict=True)]]


def _mape(hw_path: str | Path, rows: pd.DataFrame) -> float:
    hw = load_hardware(str(hw_path))
    groups = library_groups(hw, rows)
    measured = np.concatenate([g.measured_s for g in groups])
    return float(np.mean(np.abs(predict(groups, hw) / measured - 1)) * 100)


def test_a_spec_of_ones_own_is_fitted_and_the_loader_finds_it(tmp_path: Path) -> None:
    spec, rows = _spec(tmp_path), _h200_rows()
    before = _mape(spec, rows)
    csv = str(_timings(tmp_path, rows))
    assert calibrate.main(["--gemm-csv", csv, "--hardware", str(spec)]) == 0
    written = tmp_path / "calibration" / "my_gpu.yaml"
    assert "GENERATED" in written.read_text()
    fitted, plain = load_hardware(str(spec)), load_hardware(str(spec), calibrated=False)
    assert fitted.efficiency.gemm != plain.efficiency.gemm
    # GEMMs only: the attention is still the one its spec names (H100's fitted attention)
    h100 = load_hardware("h100_sxm").efficiency
    assert fitted.efficiency.attention == h100.attention
    own_busbw = {"busbw_fraction": plain.efficiency.collective.busbw_fraction}
    assert fitted.efficiency.collective == h100.collective.model_copy(update=own_busbw)
    assert _mape(spec, rows) < before
    # a second run replaces its own file
    assert calibrate.main(["--gemm-csv", csv, "--hardware", str(spec)]) == 0


def test_the_fit_recovers_a_device_uniformly_slower_than_its_spec(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    rows = _h200_rows()
    hw = load_hardware(str(spec), calibrated=False)
    groups = library_groups(hw, rows)
    slow = pd.concat(
        [g.rows.assign(latency_ms=predict([g], hw) * 1.25e3) for g in groups], ignore_index=True
    )
    assert _mape(spec, slow) == pytest.approx(20.0, abs=0.5)  # 1 - 1/1.25 fast everywhere
    csv = str(_timings(tmp_path, slow))
    assert calibrate.main(["--gemm-csv", csv, "--hardware", str(spec)]) == 0
    assert _mape(spec, slow) < 3.0


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda df: df.drop(columns=["latency_ms"]), "missing columns ['latency_ms']"),
        (lambda df: df.assign(latency_ms=-1.0), "line 2: m, n, k and latency_ms must be positive"),
        (lambda df: df[df["gemm_dtype"] == "fp8"], "gemm_dtype: no bfloat16 rows to fit"),
    ],
)
def test_bad_timings_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit, reason: str
) -> None:
    csv = _timings(tmp_path, edit(_h200_rows()))
    assert calibrate.main(["--gemm-csv", str(csv), "--hardware", str(_spec(tmp_path))]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and reason in err and str(csv) in err
    with pytest.raises(Exception, match="cannot read"):
        read_gemm_csv(tmp_path / "missing.csv")


def test_a_shipped_calibration_or_an_id_is_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv = str(_timings(tmp_path, _h200_rows()))
    assert calibrate.main(["--gemm-csv", csv, "--hardware", "h200_sxm"]) == 2
    assert "give the path of your own hardware spec file" in capsys.readouterr().err
    shipped = calibrate.calibration_path("h100_sxm").parent.parent / "h100_sxm.yaml"
    before = calibrate.calibration_path("h100_sxm").read_text()
    assert calibrate.main(["--gemm-csv", csv, "--hardware", str(shipped)]) == 2
    assert "fitted to other data" in capsys.readouterr().err
    assert calibrate.calibration_path("h100_sxm").read_text() == before
    with pytest.raises(SystemExit):  # argparse: the two flags go together
        calibrate.main(["--gemm-csv", csv])
