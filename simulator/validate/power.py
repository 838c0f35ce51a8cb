"""The `power` suites: board power of whole runs against Splitwise's DGX-A100 power readings.

Splitwise profiled vLLM of late 2023 (fp16, eager) on DGX-A100: `batch_size` prompts of
`prompt_size` tokens prefilled in one step, then `token_size - 1` decode steps, on
`tensor_parallel` GPUs, recording the peak and the average GPU power of each run as fractions of
TDP (nvidia-smi readings). Per configuration we take the median over its repeats and predict
with the serving model:

- the prefill step and the mean decode step times of the `iteration` suites (engine `vllm-0.2`);
- each phase's utilisation from the operator list (`power.step_work_s`; the decode step at the
  run's mean context, prompt + token_size / 2) and its power from `power.PowerModel`;
- combined as the measurement does: average = time-weighted mean over the run (the prefill at
  its power, the decode steps at theirs); peak = the highest reading of a sensor averaging over
  `power.sensor_window_s`, which sees a prefill shorter than its window mixed with decode power.

Predicted and measured values are fractions of TDP (in the suites' `predicted_s` and
`measured_s` columns, which hold each suite's quantity). The A100's power shape (active, compute
and memory fractions) and sensor window are fitted to the llama-2-70b rows (`fit_power`;
`python -m simulator.validate.power --fit` prints them for hardware_specs/a100_sxm_80gb.yaml):
suite `power_fit`; the bloom-176b rows are the held-out check, suite `power`.

Excluded, with the reason in `attrs["skipped"]`: configurations the iteration suites skip
(capped batches, memory does not fit); configurations without power readings (the profile has
zeros there: it recorded power for 128-token outputs only); and readings whose average is within
IMPLAUSIBLE_ABOVE_IDLE of TDP of the idle draw, though the GPUs were busy prefilling and
decoding throughout (the 8192-token prompts of every TP read 0.17-0.18 of TDP on average, where
4096-token prompts read 0.39-0.68 and idle is 0.15: the reading missed the run).
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from simulator.costmodel.batch import BatchShape
from simulator.runs.energy import PowerModel, step_work_s
from simulator.specs import load_engine, load_hardware, load_model
from simulator.specs.deployment import Parallelism, resolve_precision
from simulator.specs.engine import EngineSpec
from simulator.specs.hardware import HardwareSpec, PowerSpec
from simulator.validate import data
from simulator.validate.frame import finish, median_repeats
from simulator.validate.iteration import ENGINE, KEYS, case_labels, iteration_cases

POWER, POWER_FIT = "power", "power_fit"
FIT_MODELS = ("llama-2-70b",)  # the power shape is fitted to these rows; the rest are held out
IMPLAUSIBLE_ABOVE_IDLE = 0.1  # of TDP: an average this close to idle cannot be a busy run's
FITTED = ("active_fraction", "compute_fraction", "memory_fraction", "sensor_window_s")


def phase_frame(hw: HardwareSpec, engine: EngineSpec, measured: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration with usable power readings: the readings, the predicted
    prefill and mean decode step times (s) and each phase's work at peak (`*_compute_s`,
    `*_memory_s`, see `step_work_s`). `measured`: `data.splitwise()` rows plus the power
    columns. `attrs["skipped"]` lists what was left out and why."""
    steps = iteration_cases(hw, engine, measured)
    # a prefill row past the all-reduce step is still the prefill step of its configuration
    steps["kind"] = steps["kind"].where(~steps["kind"].str.startswith("prefill"), "prefill")
    times = steps.pivot_table(index=[*KEYS, "model_id"], columns="kind", values="predicted_s")
    power = median_repeats(measured, KEYS, ["peak_power", "average_power"])
    conf = times.reset_index().merge(power, on=KEYS)
    skipped = list(steps.attrs.get("skipped", []))
    idle = hw.power.idle_w / hw.power.tdp_w
    missing = (conf["peak_power"] <= 0) | (conf["average_power"] <= 0)
    implausible = ~missing & (conf["average_power"] < idle + IMPLAUSIBLE_ABOVE_IDLE)
    if missing.any():
        skipped.append(
            f"power: {int(missing.sum())} configurations without a power reading (zeros)"
        )
    reason = "average power reading at idle level during a busy run"
    skipped += [f"power {c}: {reason}" for c in case_labels(conf[implausible])]
    conf = conf[~missing & ~implausible].reset_index(drop=True)
    frames = [_phase_work(g, hw) for _, g in conf.groupby(["model_id", "tensor_parallel"])]
    out = pd.concat(frames, ignore_index=True) if frames else conf
    out.attrs["skipped"] = skipped
    return out


def _phase_work(conf: pd.DataFrame, hw: HardwareSpec) -> pd.DataFrame:
    """Add each phase's work at peak for the configurations of one (model, TP)."""
    model = load_model(str(conf["model_id"].iloc[0]))
    layout = Parallelism(tp=int(conf["tensor_parallel"].iloc[0]))
    prec = resolve_precision(model, hw, dtype="float16")
    window = model.attention.batch_window
    b = conf["batch_size"].to_numpy(dtype=float)
    p = conf["prompt_size"].to_numpy(dtype=float)
    t = conf["token_size"].to_numpy(dtype=float)
    pre = BatchShape.prefill(batch_size=b, prompt_len=p, window=window)
    dec = BatchShape.decode(batch_size=b, context_len=p + t / 2.0, window=window)
    pre_c, pre_m = step_work_s(model, hw, layout, prec, pre)
    dec_c, dec_m = step_work_s(model, hw, layout, prec, dec)
    shape = b.shape
    return conf.assign(
        prefill_compute_s=np.broadcast_to(pre_c, shape),
        prefill_memory_s=np.broadcast_to(pre_m, shape),
        decode_compute_s=np.broadcast_to(dec_c, shape),
        decode_memory_s=np.broadcast_to(dec_m, shape),
    )


def predict(frame: pd.DataFrame, hw: HardwareSpec) -> pd.DataFrame:
    """Per configuration of `phase_frame`: each phase's watts and the run's predicted peak and
    average reading as fractions of TDP (`predicted_peak`, `predicted_average`)."""
    model = PowerModel.from_hardware(hw)
    pre_s = frame["prefill"].to_numpy(dtype=float)
    dec_s = frame["decode"].to_numpy(dtype=float)
    pre_w = model.power_w(
        u_compute=frame["prefill_compute_s"] / pre_s, u_memory=frame["prefill_memory_s"] / pre_s
    )
    dec_w = model.power_w(
        u_compute=frame["decode_compute_s"] / dec_s, u_memory=frame["decode_memory_s"] / dec_s
    )
    decode_time = (frame["token_size"].to_numpy(dtype=float) - 1.0) * dec_s
    average = (pre_w * pre_s + dec_w * decode_time) / (pre_s + decode_time)
    window = hw.power.sensor_window_s
    seen = np.minimum(pre_s, window)
    peak = np.maximum(dec_w, (pre_w * seen + dec_w * (window - seen)) / window)
    tdp = hw.power.tdp_w
    return frame.assign(
        prefill_w=pre_w,
        decode_w=dec_w,
        predicted_peak=peak / tdp,
        predicted_average=average / tdp,
    )


def power_cases(hw: HardwareSpec, engine: EngineSpec, measured: pd.DataFrame) -> pd.DataFrame:
    """The suites' rows: a `peak` and an `average` row per configuration, suite `power_fit`
    for FIT_MODELS and `power` for the rest; values are fractions of TDP."""
    frame = predict(phase_frame(hw, engine, measured), hw)
    base = frame.assign(device=hw.id, engine=engine.id)
    cases = case_labels(frame)
    rows = pd.concat(
        [
            base.assign(
                kind=kind,
                case=f"{kind} " + cases,
                predicted_s=frame[f"predicted_{kind}"],
                measured_s=frame[f"{kind}_power"],
            )
            for kind in ("peak", "average")
        ],
        ignore_index=True,
    )
    rows["suite"] = np.where(rows["model_id"].isin(FIT_MODELS), POWER_FIT, POWER)
    out = pd.concat(
        [finish(g, suite=str(s), fitted=s == POWER_FIT) for s, g in rows.groupby("suite")],
        ignore_index=True,
    )
    out.attrs["skipped"] = frame.attrs.get("skipped", [])
    return out


def _default_hardware() -> HardwareSpec:
    return load_hardware(data.SPLITWISE_HARDWARE["a100-80gb"])


def power_suite(
    hardware: HardwareSpec | None = None, engine: EngineSpec | None = None
) -> pd.DataFrame:
    """The power suites on the DGX-A100 profile (`a100_sxm_80gb`, engine `vllm-0.2` unless
    given)."""
    hw = hardware or _default_hardware()
    eng = engine or load_engine(ENGINE)
    return power_cases(hw, eng, _measured())


def _measured() -> pd.DataFrame:
    return data.read_measured(
        "splitwise/perf_model_a100.csv", [*data.SPLITWISE_COLUMNS, "peak_power", "average_power"]
    )


def fit_power(hardware: HardwareSpec | None = None) -> dict[str, float]:
    """Least-squares fit (log of predicted / measured, peak and average rows alike) of the
    power shape and sensor window to the FIT_MODELS rows; returns FITTED's values."""
    from scipy.optimize import least_squares

    hw = hardware or _default_hardware()
    frame = phase_frame(hw, load_engine(ENGINE), _measured())
    frame = frame[frame["model_id"].isin(FIT_MODELS)]
    measured = np.log(frame[["peak_power", "average_power"]].to_numpy(dtype=float))

    def residuals(x: np.ndarray) -> np.ndarray:
        power = hw.power.model_copy(update=dict(zip(FITTED, map(float, x), strict=True)))
        got = predict(frame, hw.model_copy(update={"power": power}))
        predicted = np.log(got[["predicted_peak", "predicted_average"]].to_numpy(dtype=float))
        return (predicted - measured).ravel()

    start = np.array([getattr(hw.power, name) for name in FITTED], dtype=float)
    fit = least_squares(residuals, start, bounds=([0.0, 0.0, 0.0, 1e-3], [1.0, 5.0, 5.0, 2.0]))
    return {name: float(v) for name, v in zip(FITTED, fit.x, strict=True)}


def _check_fitted(spec: PowerSpec, fitted: dict[str, float], rel: float) -> list[str]:
    """Names of the fitted values the spec differs from by more than `rel`."""
    return [k for k, v in fitted.items() if abs(getattr(spec, k) - v) > rel * abs(v)]


def main(argv: list[str]) -> int:
    """`--fit`: print the fitted values; `--check`: exit 1 if the spec's differ by > 2%."""
    fitted = fit_power()
    if "--check" in argv:
        off = _check_fitted(_default_hardware().power, fitted, rel=0.02)
        print("power fit: " + (f"differs in {', '.join(off)}" if off else "matches the spec"))
        return 1 if off else 0
    for name, value in fitted.items():
        print(f"  {name}: {value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
