"""Bad input that once ended in a traceback, a hang or a silently different model: each is one
line on stderr and exit status 2 (the CLI), or a SpecError (the API)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from simulator.errors import SpecError
from simulator.runs import sizes
from simulator.specs.hf import check_key_typos
from simulator.specs.loader import (
    MAX_SPEC_BYTES,
    MODELS_DIR,
    list_models,
    load_model,
    read_yaml,
)
from simulator.specs.workload import TraceDataset
from simulator.workload.traces import read_trace
from tests.clitools import one_line_error

SCENARIO = """\
name: bad
model: {model}
replicas: [{{hardware: h100_sxm, engine: vllm{group}}}]
workload:
  dataset: {{name: random, input_len: {input_len}, output_len: {output_len}}}
  num_prompts: {num_prompts}
  request_rate: 8
"""


def scenario(tmp_path: Path, **fields: object) -> Path:
    values = {"model": "llama-3.1-8b", "group": "", "input_len": 300, "output_len": 10}
    values |= {"num_prompts": 10, **fields}
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(**values), encoding="utf-8")
    return path


def hf_config(tmp_path: Path, name: str = "config.json", **changes: object) -> Path:
    """Llama-3.1-8B's config.json with `changes` (None deletes a key)."""
    cfg = json.loads((MODELS_DIR / "llama-3.1-8b.json").read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    path = tmp_path / name
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


# -- a step budget below the prompts without chunked prefill -----------------------------------
def test_a_budget_below_the_prompts_without_chunked_prefill_is_refused_up_front(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    group = ", scheduler: {kind: continuous, max_num_batched_tokens: 256, chunked_prefill: false}"
    err = one_line_error(capsys, "run", str(scenario(tmp_path, group=group)))
    assert "max_num_batched_tokens: 256 is below the longest request's prompt + output (310" in err


def test_the_bench_flags_name_the_budget_flag(capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(
        capsys,
        *("bench", "throughput", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"),
        *("--num-prompts", "4", "--input-len", "300", "--max-num-batched-tokens", "256"),
        "--no-enable-chunked-prefill",
    )
    assert "--max-num-batched-tokens: 256 is below the longest request's prompt + output" in err


def test_a_budget_below_a_preempted_request_is_refused_up_front(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # 300-token prompts fit a 512-token step, but a request preempted after 300 output tokens
    # re-prefills 600: it would never be scheduled again ("nothing schedulable" mid-run)
    group = (
        ", gpu_memory_utilization: 0.235, scheduler: {kind: continuous, "
        "max_num_batched_tokens: 512, chunked_prefill: false}"
    )
    err = one_line_error(capsys, "run", str(scenario(tmp_path, group=group, output_len=1000)))
    assert "512 is below the longest request's prompt + output (1300 tokens)" in err


def test_a_budget_that_holds_the_prompts_still_runs(tmp_path: Path) -> None:
    import simulator as sim

    group = ", scheduler: {kind: continuous, max_num_batched_tokens: 512, chunked_prefill: false}"
    result = sim.run(scenario(tmp_path, group=group, num_prompts=3, output_len=200))
    assert result.summary["completed"] == 3


# -- aliases, recursion and size caps -----------------------------------------------------------
LAUGHS = "".join(
    f"  - &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" if i else "  - &l0 [lol, lol]\n"
    for i in range(9)
)


def test_a_sweep_of_billion_laughs_is_refused_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    base = scenario(tmp_path)
    sweep = tmp_path / "laughs.yaml"
    sweep.write_text(
        f"base: {base.name}\nx:\n{LAUGHS}grid:\n  workload.request_rate: *l8\n", encoding="utf-8"
    )
    err = one_line_error(capsys, "sweep", str(sweep), "--out", str(tmp_path / "out"))
    assert "aliases expand" in err and "write the values out" in err


def test_grid_values_multiplied_by_aliases_are_refused(tmp_path: Path) -> None:
    # five grid paths of nine aliased lists each: 9**5 runs of nested values
    text = "grid:\n  a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]\n" + "".join(
        f"  {k}: &{k} [{', '.join([f'*{p}'] * 9)}]\n" for p, k in zip("abcd", "bcde", strict=True)
    )
    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError, match="aliases expand"):
        read_yaml(path)


def test_a_few_aliases_still_load(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("g: &g {hardware: h100_sxm, count: 2}\nreplicas: [*g, *g, *g]\n", "utf-8")
    assert read_yaml(path)["replicas"] == [{"hardware": "h100_sxm", "count": 2}] * 3


def test_a_document_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("a: &a [1, *a]\n", encoding="utf-8")
    with pytest.raises(SpecError, match="recursive"):
        read_yaml(path)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_spec_file_is_read_up_to_its_cap(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("bench", "latency", "--hardware", "/dev/zero", "--model", "llama-3.1-8b")
    err = one_line_error(capsys, *args)
    assert "/dev/zero: larger than 16 MiB, the most a spec file may be" in err


def test_a_spec_file_over_the_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    with path.open("wb") as fh:
        fh.truncate(MAX_SPEC_BYTES + 1)  # sparse: nothing written
    with pytest.raises(SpecError, match="larger than 16 MiB"):
        load_model(str(path))


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_trace_must_be_a_regular_file() -> None:
    with pytest.raises(SpecError, match="not a regular file"):
        read_trace(TraceDataset(path=Path("/dev/zero"), format="csv"), with_timestamps=False)


# -- overflow and structure ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"num_prompts": 2**64}, "workload.num_prompts"),
        ({"output_len": 2**64}, "output_len"),
        ({"input_len": 2**64}, "input_len"),
        ({"group": ", swap_space_gib: 1e308"}, "swap_space_gib"),
        ({"group": ", tensor_parallel_size: 18446744073709551616"}, "tensor_parallel_size"),
    ],
)
def test_overflowing_numbers_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fields: dict[str, object], named: str
) -> None:
    err = one_line_error(capsys, "run", str(scenario(tmp_path, **fields)))
    assert named in err and "less than or equal to" in err


def test_yaml_nested_thousands_deep_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    assert "malformed YAML" in one_line_error(capsys, "run", str(path))


def test_a_config_json_nested_thousands_deep_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    err = one_line_error(capsys, "bench", "latency", "--hardware", "h100_sxm", "--model", str(path))
    assert "malformed JSON: nested too deeply" in err


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"mlp_only_layers": 5}, "mlp_only_layers: expected a list of layer indices, got 5"),
        (
            {
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "config_groups": {"g": {"weights": {"num_bits": [8], "type": "int"}}},
                }
            },
            "num_bits must be an integer, got [8]",
        ),
        ({"num_hidden_layers": 10**9}, "num_layers: Input should be less than or equal to 10000"),
    ],
)
def test_config_json_of_the_wrong_shape_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, changes: dict[str, object], reason: str
) -> None:
    if "mlp_only_layers" in changes:  # read where the model has experts: Qwen-MoE's key
        changes |= {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
    path = hf_config(tmp_path, **changes)
    err = one_line_error(capsys, "bench", "latency", "--hardware", "h100_sxm", "--model", str(path))
    assert reason in err


def test_a_trace_timestamp_of_1e308_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("ts,p,o\n0,10,10\n1e308,10,10\n", encoding="utf-8")
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: t\nmodel: llama-3.1-8b\nreplicas: [{hardware: h100_sxm}]\nworkload:\n"
        "  dataset: {name: trace, path: t.csv, timestamp_column: ts, prompt_column: p, "
        "output_column: o}\n  arrival: trace\n",
        encoding="utf-8",
    )
    err = one_line_error(capsys, "run", str(path))
    assert "line 3, column 'ts': 1e+308 is not within 1e+09 s of the earliest row" in err


# -- absurd sizes ---------------------------------------------------------------------------------
def test_requests_beyond_the_machines_memory_are_refused_before_drawing_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sizes, "available_memory_bytes", lambda: 8 * 2**30)
    err = one_line_error(capsys, "run", str(scenario(tmp_path, num_prompts=10**9)))
    assert "workload.num_prompts: 1,000,000,000 requests need about 2,048.9 GiB" in err
    assert "more than 80% of the 8.0 GiB this machine has available" in err


def test_the_bench_flag_names_the_size(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sizes, "available_memory_bytes", lambda: 2**30)
    err = one_line_error(
        capsys,
        *("bench", "throughput", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"),
        *("--num-prompts", str(10**7)),
    )
    assert err.startswith("llmsim: error: --num-prompts: 10,000,000 requests need about")


def test_a_streamed_run_takes_a_tenth_of_the_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    # 10**7 requests on a 24 GiB machine: refused with every row kept, run when streamed
    monkeypatch.setattr(sizes, "available_memory_bytes", lambda: 24 * 2**30)
    with pytest.raises(SpecError, match="stream them"):
        sizes.check_fits(10**7)
    sizes.check_fits(10**7, stream=True)
    with pytest.raises(SpecError, match=r"\(200 bytes each\).*: ask for fewer$"):
        sizes.check_fits(10**9, stream=True)


def test_what_fits_is_not_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizes, "available_memory_bytes", lambda: 2**40)
    sizes.check_fits(10**7)
    monkeypatch.setattr(sizes, "available_memory_bytes", lambda: None)  # unknown: no check
    sizes.check_fits(10**12)


def test_a_long_run_says_what_it_will_take(capsys: pytest.CaptureFixture[str]) -> None:
    sizes.announce_long_run(1_000, 100.0)  # well under a minute: nothing said
    assert capsys.readouterr().err == ""
    sizes.announce_long_run(10**7, 256.0)
    per_request = sizes.SECONDS_PER_REQUEST + 256 * sizes.SECONDS_PER_OUTPUT_TOKEN
    minutes = 10**7 * per_request / 60
    err = capsys.readouterr().err
    assert err == (
        f"llmsim: note: simulating 10,000,000 requests: up to about {minutes / 60:,.1f} h and "
        f"{10**7 * sizes.BYTES_PER_REQUEST / 2**30:,.1f} GiB of memory\n"
    )


def test_a_plan_for_a_trillion_requests_a_second_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = Path("scenarios/plan_chat.yaml").read_text(encoding="utf-8")
    path = tmp_path / "plan.yaml"
    path.write_text(text.replace("request_rate: 33 ", "request_rate: 1e12 "), encoding="utf-8")
    err = one_line_error(capsys, "plan", str(path))
    assert "workload.request_rate: Input should be less than or equal to 1000000" in err


def test_a_billion_layers_is_refused_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = hf_config(tmp_path, num_hidden_layers=10**9)
    err = one_line_error(capsys, "run", str(scenario(tmp_path, model=path)))
    assert "num_layers: Input should be less than or equal to 10000" in err


# -- Hugging Face configs that would silently change the model ----------------------------------
def test_a_key_one_letter_off_is_an_error_with_did_you_mean(tmp_path: Path) -> None:
    path = hf_config(tmp_path, num_key_value_heads=None, num_key_value_head=8)
    with pytest.raises(SpecError, match="did you mean 'num_key_value_heads'") as err:
        load_model(str(path))
    assert err.value.field == "num_key_value_head"


def test_a_missing_mlp_width_is_an_error_not_four_times_hidden(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="missing") as err:
        load_model(str(hf_config(tmp_path, intermediate_size=None)))
    assert err.value.field == "intermediate_size"


def test_a_missing_context_length_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="missing") as err:
        load_model(str(hf_config(tmp_path, max_position_embeddings=None)))
    assert err.value.field == "max_position_embeddings"


def test_heads_must_divide_the_hidden_size(tmp_path: Path) -> None:
    path = hf_config(tmp_path, num_attention_heads=7, num_key_value_heads=7)
    with pytest.raises(SpecError, match="7 heads do not divide hidden_size 4096"):
        load_model(str(path))
    # unless the architecture gives its head size
    explicit = hf_config(
        tmp_path, "explicit.json", num_attention_heads=7, num_key_value_heads=7, head_dim=128
    )
    assert load_model(str(explicit)).attention.head_dim == 128


def test_documented_defaults_stay() -> None:
    # BLOOM's MLP is 4 x hidden and it has no position table: its config gives neither
    bloom = json.loads((MODELS_DIR / "bloom-176b.json").read_text(encoding="utf-8"))
    assert "intermediate_size" not in bloom and "max_position_embeddings" not in bloom
    assert load_model("bloom-176b").mlp.intermediate_size == 4 * bloom["hidden_size"]


def test_every_bundled_model_loads_and_no_key_of_theirs_is_a_typo() -> None:
    for model_id in list_models():
        load_model(model_id)
        cfg = json.loads((MODELS_DIR / f"{model_id}.json").read_text(encoding="utf-8"))
        check_key_typos(cfg)


@pytest.mark.parametrize(
    "cfg",
    [
        {"n_heads": 32, "n_layers": 32, "d_model": 4096},  # MPT's spellings
        {"num_attention_heads": 32, "num_heads": 32},  # both present: nothing is missing
        {"rope_theta": 1e6, "use_cache": True, "pad_token_id": 0},  # far from any key read
    ],
)
def test_real_keys_are_not_typos(cfg: dict[str, object]) -> None:
    check_key_typos(cfg)


# -- trace rows and warnings ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        # a blank line before the bad row: the file's line, not the data row's number
        ("t.csv", "ts,p,o\n0,10,10\n\n1,10,10\n2,-5,10\n", "line 5, column 'p': -5 is not"),
        (
            "t.jsonl",
            '{"ts": 0, "p": 10, "o": 10}\n\n{"ts": 1, "p": -1, "o": 10}\n',
            "line 3, column 'p': -1 is not",
        ),
        # numbers with one that is not: that one, not the first row as a datetime
        ("t.csv", "ts,p,o\n0,10,10\n1,10,10\nabc,10,10\n", "line 4, column 'ts': 'abc' is not"),
        ("t.csv", "ts,p,o\n0,10,10\n1,1e30,10\n", "line 3, column 'p': 1e+30 is not a token"),
        ("t.csv", "ts,p,o\n-1e308,10,10\n1e308,10,10\n", "line 3, column 'ts': 1e+308"),
        ("t.jsonl", '{"ts": 0, "p": 18446744073709551616, "o": 1}\n', "line 1, column 'p'"),
    ],
)
def test_trace_errors_name_the_offending_line_without_warnings(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    ds = TraceDataset(path=path, timestamp_column="ts", prompt_column="p", output_column="o")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would fail here
        with pytest.raises(SpecError) as err:
            read_trace(ds, with_timestamps=True)
    assert message in err.value.reason


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (("latency", "--num-iters", str(2**64)), "--num-iters: must be at most 1,000,000"),
        (("latency", "--batch-size", str(2**64)), "--batch-size: must be at most 1,000,000"),
        (("throughput", "--num-prompts", str(2**64)), "--num-prompts: Input should be less"),
        (("throughput", "--output-len", str(2**64)), "--output-len: Input should be less"),
        (("throughput", "--swap-space", "1e308"), "--swap-space: Input should be less"),
    ],
)
def test_bench_flags_that_overflow_are_one_line(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], line: str
) -> None:
    err = one_line_error(
        capsys, "bench", *flags, "--hardware", "h100_sxm", "--model", "llama-3.1-8b"
    )
    assert err.startswith(f"llmsim: error: {line}")
