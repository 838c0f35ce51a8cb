"""ShareGPT read from its file (`--dataset-path`): vLLM's sampling (shuffle by seed, first two
turns, its length filter, oversampling), token counts by a tokenizer.json or estimated from
bytes, errors naming the file, and the CLI and scenario paths."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clitools import run_cli
from factories import scenario_data, write_yaml

from simulator.errors import SpecError
from simulator.runs import runner
from simulator.specs.scenario import load_scenario
from simulator.specs.workload import ShareGPTDataset
from simulator.workload.datasets import sharegpt_lengths
from simulator.workload.sharegpt_file import BYTES_PER_TOKEN, sharegpt_file_lengths

RNG = np.random.default_rng(0)


def words(n: int) -> str:
    """`n` words of 3 letters and a space: 4 bytes, one estimated token, each."""
    return " ".join(["abc"] * n) + " "


def convo(prompt_words: int, reply_words: int, *, turns: int = 2) -> dict[str, Any]:
    texts = [words(prompt_words), words(reply_words)] + ["more"] * (turns - 2)
    return {
        "id": f"{prompt_words}-{reply_words}",
        "conversations": [
            {"from": "human" if i % 2 == 0 else "gpt", "value": t} for i, t in enumerate(texts)
        ],
    }


def write_sharegpt(folder: Path, entries: list[Any]) -> Path:
    path = folder / "sharegpt.json"
    path.write_text(json.dumps(entries), encoding="utf-8")
    return path


def vllm_reference(
    entries: list[dict[str, Any]], n: int, seed: int, output_len: int | None = None
) -> list[tuple[int, int]]:
    """vLLM's ShareGPTDataset.load_data + sample + maybe_oversample_requests, written from its
    code, with the byte estimate for the tokenizer."""
    data = [e for e in entries if "conversations" in e and len(e["conversations"]) >= 2]
    random.seed(seed)
    random.shuffle(data)

    def count(text: str) -> int:
        return max(1, round(len(text.encode()) / BYTES_PER_TOKEN))

    out: list[tuple[int, int]] = []
    for e in data:
        if len(out) >= n:
            break
        p = count(e["conversations"][0]["value"])
        o = count(e["conversations"][1]["value"]) if output_len is None else output_len
        too_short = p < 4 or (output_len is None and o < 4)
        if too_short or p > 1024 or p + o > 2048:
            continue
        out.append((p, o))
    if len(out) < n:
        random.seed(seed)
        out += random.choices(out, k=n - len(out))
    return out


ENTRIES = [convo(p, r) for p, r in [(10, 50), (2, 30), (300, 100), (1100, 5), (900, 1200)]] + [
    convo(20 + i, 3 + (i * 37) % 400, turns=2 + i % 3) for i in range(60)
]
ENTRIES += [{"id": "one-turn", "conversations": [{"from": "human", "value": "hi"}]}, {"id": "x"}]


@pytest.mark.parametrize(("n", "seed", "output_len"), [(20, 0, None), (7, 3, None), (30, 0, 64)])
def test_the_file_is_sampled_as_vllm_does(
    tmp_path: Path, n: int, seed: int, output_len: int | None
) -> None:
    path = write_sharegpt(tmp_path, ENTRIES)
    before = random.getstate()
    prompt, output = sharegpt_file_lengths(
        path, n=n, seed=seed, tokenizer=None, output_len=output_len
    )
    assert random.getstate() == before  # vLLM's generator, not the process's global one
    expected = vllm_reference(ENTRIES, n, seed, output_len)
    assert list(zip(prompt.tolist(), output.tolist(), strict=True)) == expected
    # the filter: no prompt of 2 words, none over 1024 tokens, no total over 2048
    assert prompt.min() >= 4 and prompt.max() <= 1024 and (prompt + output).max() <= 2048
    if output_len is None:
        assert output.min() >= 4


def test_too_few_conversations_are_oversampled_as_vllm_does(tmp_path: Path) -> None:
    few = [convo(10, 50), convo(30, 8), convo(2, 9)]  # the last fails the filter
    path = write_sharegpt(tmp_path, few)
    prompt, output = sharegpt_file_lengths(path, n=9, seed=0, tokenizer=None, output_len=None)
    assert list(zip(prompt.tolist(), output.tolist(), strict=True)) == vllm_reference(few, 9, 0)
    assert set(prompt.tolist()) == {10, 30}


def test_a_tokenizer_counts_the_tokens(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "<s>": 1, "abc": 2, "more": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    # a BOS on every text, as Llama's tokenizer.json adds and vLLM's count includes
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    folder = tmp_path / "tok"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    path = write_sharegpt(tmp_path, [convo(10, 50), convo(300, 100)])
    for where in (folder, folder / "tokenizer.json"):
        prompt, output = sharegpt_file_lengths(
            path, n=2, seed=0, tokenizer=str(where), output_len=None
        )
        assert sorted(zip(prompt.tolist(), output.tolist(), strict=True)) == [(11, 51), (301, 101)]


@pytest.mark.parametrize(
    ("content", "words_"),
    [
        (None, "cannot read file"),
        ("{not json", "not ShareGPT's JSON"),
        ('{"a": 1}', "expected a list of conversations"),
        (json.dumps([convo(1, 1)]), "no conversation passes vLLM's ShareGPT filter"),
        (json.dumps([{"conversations": [{"value": 3}, {"value": "x"}]}]), "0.conversations"),
    ],
)
def test_a_bad_file_is_a_spec_error_naming_it(
    tmp_path: Path, content: str | None, words_: str
) -> None:
    path = tmp_path / "sharegpt.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(SpecError, match=words_) as err:
        sharegpt_file_lengths(path, n=3, seed=0, tokenizer=None, output_len=None)
    assert err.value.source == str(path)


def test_a_tokenizer_needs_a_file_and_a_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="give path too"):
        ShareGPTDataset(tokenizer="tok")
    path = write_sharegpt(tmp_path, [convo(10, 50)])
    with pytest.raises(SpecError, match=r"no tokenizer\.json there") as err:
        sharegpt_file_lengths(path, n=1, seed=0, tokenizer=str(tmp_path), output_len=None)
    assert err.value.field == "tokenizer"


def test_without_a_path_the_length_model_draws(tmp_path: Path) -> None:
    drawn, _ = sharegpt_lengths(ShareGPTDataset(), n=50, rng=np.random.default_rng(1))
    path = write_sharegpt(tmp_path, ENTRIES)
    read, _ = sharegpt_lengths(ShareGPTDataset(path=path), n=50, rng=RNG)
    assert len(drawn) == len(read) == 50
    assert not np.array_equal(drawn, read)


def test_bench_serve_reads_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_sharegpt(tmp_path, ENTRIES)
    args = ["bench", "serve", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"]
    args += ["--dataset-name", "sharegpt", "--dataset-path", str(path), "--num-prompts", "20"]
    code, out, err = run_cli(capsys, *args, "--seed", "3", "--json")
    assert code == 0, err
    assert "estimated from its text" in err
    summary = json.loads(out)
    expected = vllm_reference(ENTRIES, 20, 3)
    assert summary["total_input_tokens"] == sum(p for p, _ in expected)
    assert summary["total_output_tokens"] == sum(o for _, o in expected)
    code, _, err = run_cli(capsys, *args[:-2], "--dataset-path", str(tmp_path / "nope.json"))
    assert code == 2 and err.count("\n") == 1
    assert "nope.json: cannot read file (no such file)" in err
    code, _, err = run_cli(capsys, *args[:-2], "--dataset-path", str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and "is a folder" in err


@pytest.mark.parametrize("content", [b"{bad", b"{}", b"[]", b"\xff\xfe"])
def test_a_file_that_is_not_sharegpt_gets_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    # the estimate's note is for a run that succeeds: the error line stands alone
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    args = ["bench", "serve", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"]
    args += ["--dataset-name", "sharegpt", "--dataset-path", str(path), "--num-prompts", "4"]
    code, out, err = run_cli(capsys, *args)
    assert (code, out, err.count("\n")) == (2, "", 1)
    assert err.startswith(f"llmsim: error: {path}: ")


def test_a_scenario_names_the_file_beside_it(tmp_path: Path) -> None:
    write_sharegpt(tmp_path, ENTRIES)
    data = scenario_data(input_len=1, output_len=1, num_prompts=20, request_rate=10)
    data["workload"]["dataset"] = {"name": "sharegpt", "path": "sharegpt.json"}
    scenario = load_scenario(write_yaml(tmp_path / "s.yaml", data))
    assert scenario.workload.dataset.path == tmp_path / "sharegpt.json"  # type: ignore[union-attr]
    result = runner.run(scenario)
    expected = vllm_reference(ENTRIES, 20, 0)
    assert result.summary["total_input_tokens"] == sum(p for p, _ in expected)


def test_bench_throughput_takes_the_dataset_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # vllm bench throughput --dataset-name sharegpt --dataset-path F [--output-len O]
    path = write_sharegpt(tmp_path, ENTRIES)
    args = ["bench", "throughput", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"]
    args += ["--dataset-name", "sharegpt", "--num-prompts", "20", "--json"]
    code, out, err = run_cli(capsys, *args, "--dataset-path", str(path))
    assert code == 0, err
    expected = vllm_reference(ENTRIES, 20, 0)
    summary = json.loads(out)
    assert summary["total_num_tokens"] == sum(p + o for p, o in expected)
    code, out, err = run_cli(capsys, *args, "--dataset-path", str(path), "--output-len", "64")
    assert code == 0 and json.loads(out)["total_num_tokens"] == sum(
        p + 64 for p, _ in vllm_reference(ENTRIES, 20, 0, output_len=64)
    )
    code, out, err = run_cli(capsys, *args, "--input-len", "100")  # the length model
    assert code == 0 and "--input-len has no effect with ShareGPT" in err
    code, _, err = run_cli(capsys, *args, "--prefix-len", "8")
    assert code == 2 and "prefix_len: applies to --dataset-name random" in err
    random_args = [a for a in args if a not in ("--dataset-name", "sharegpt")]
    code, out, err = run_cli(capsys, *random_args, "--tokenizer", "meta-llama/Llama-3.1-8B")
    assert code == 0 and "no effect on the prediction: --tokenizer" in err
    assert json.loads(out)["total_num_tokens"] == 20 * (1024 + 128)  # RandomDataset's defaults
