"""ShareGPT read from its file: the lengths `vllm bench serve --dataset-name sharegpt
--dataset-path F` sends, where the built-in `sharegpt` dataset (`datasets.py`) draws them from a
fitted length model.

vLLM's ShareGPTDataset (vllm/benchmarks/datasets.py) keeps the entries with a "conversations"
list of at least two turns, shuffles them with Python's `random` seeded by `--seed`
(`random.seed(seed); random.shuffle(data)`) and takes them in that order: the first turn is the
prompt, the second the completion, whose token count is the output length unless
`--sharegpt-output-len` sets one. An entry is kept when is_valid_sequence passes (prompt at least
4 tokens, output at least 4 unless set, prompt at most 1024, the two at most 2048). Too few kept:
`random.seed(seed)` again and `random.choices` of the kept ones make up the count. The same file,
seed and token counts give the same requests as vLLM: Python's `random` is the same generator
(here a `random.Random` of its own, so the caller's global state is left alone).

Token counts: with a `tokenizer` (vLLM's `--tokenizer`; here a local `tokenizer.json`, or a
folder holding one) the Hugging Face `tokenizers` library counts them as vLLM's
`tokenizer(text).input_ids` does, special tokens included (`pip install 'llmsim[tokenizers]'`).
Without one they are estimated from the text: UTF-8 bytes / BYTES_PER_TOKEN, rounded, at least
1. That figure is an assumption: OpenAI's rule of thumb of about 4 characters of English text a
token (its help article "What are tokens and how to count them?"), whose cl100k vocabulary is
where Llama 3's tokenizer starts; counting bytes rather than characters keeps scripts of 2-3
byte characters (most CJK text takes 1-1.5 characters a token) from being undercounted 3x.
Code and non-English text stray from it either way.

Read once per (file, its size and time, seed, tokenizer, count, output length): a sweep that
varies anything else reuses the lengths.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from simulator.errors import SpecError
from simulator.specs.loader import check_data_file
from simulator.specs.workload import sharegpt_filter

BYTES_PER_TOKEN = 4.0  # estimate, see the module docstring
CHUNK = 2048  # entries tokenized at a time (a run needs a few hundred to a few thousand)

Counter = Callable[[list[str]], list[int]]


def sharegpt_file_lengths(
    path: Path, *, n: int, seed: int, tokenizer: str | None, output_len: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) token counts of the `n` requests vLLM would send from ShareGPT file
    `path` (int64 arrays, read-only); SpecError naming the file when it cannot be read, is not
    ShareGPT's JSON or has no conversation to take."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise SpecError(f"cannot read file ({exc.strerror})", source=str(path)) from None
    return _lengths(str(path), stat.st_size, stat.st_mtime_ns, n, seed, tokenizer, output_len)


@functools.lru_cache(maxsize=8)
def _lengths(
    path: str,
    _size: int,
    _mtime_ns: int,
    n: int,
    seed: int,
    tokenizer: str | None,
    output_len: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    entries = _conversations(Path(path))
    rng = random.Random(seed)  # the generator vLLM seeds globally, without touching ours
    rng.shuffle(entries)
    count = _counter(tokenizer)
    kept_p: list[np.ndarray] = []
    kept_o: list[np.ndarray] = []
    have = 0
    for prompts, completions in _chunks(entries):
        if have >= n:
            break
        prompt = np.array(count(prompts), dtype=np.int64)
        output = np.array(count(completions), dtype=np.int64)
        if output_len is not None:
            output[:] = output_len
        ok = sharegpt_filter(prompt, output, check_output=output_len is None)
        kept_p.append(prompt[ok][: n - have])
        kept_o.append(output[ok][: n - have])
        have += len(kept_p[-1])
    if not have:
        raise SpecError(
            "no conversation passes vLLM's ShareGPT filter (prompt 4-1024 tokens, output at "
            "least 4, the two at most 2048)",
            source=path,
        )
    prompt, output = np.concatenate(kept_p), np.concatenate(kept_o)
    if have < n:  # vLLM's maybe_oversample_requests: random.seed(seed), random.choices
        extra = np.array(random.Random(seed).choices(range(have), k=n - have), dtype=np.int64)
        prompt = np.concatenate([prompt, prompt[extra]])
        output = np.concatenate([output, output[extra]])
    prompt.flags.writeable = output.flags.writeable = False
    return prompt, output


def _conversations(path: Path) -> list[tuple[str, str]]:
    """(first turn, second turn) of every entry vLLM keeps, in file order."""
    check_data_file(path, source=str(path))
    try:
        with path.open(encoding="utf-8") as fh:
            data: Any = json.load(fh)
    except OSError as exc:
        raise SpecError(f"cannot read file ({exc.strerror})", source=str(path)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"not ShareGPT's JSON ({exc})", source=str(path)) from None
    except RecursionError:
        raise SpecError("not ShareGPT's JSON (nested too deeply)", source=str(path)) from None
    if not isinstance(data, list):
        raise SpecError("not ShareGPT's JSON: expected a list of conversations", source=str(path))
    pairs = []
    for i, entry in enumerate(data):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        prompt, completion = (t.get("value") if isinstance(t, dict) else None for t in turns[:2])
        if not (isinstance(prompt, str) and isinstance(completion, str)):
            raise SpecError(
                "a turn without a text 'value'", source=str(path), field=f"{i}.conversations"
            )
        pairs.append((prompt, completion))
    return pairs


def _chunks(entries: list[tuple[str, str]]) -> Iterator[tuple[list[str], list[str]]]:
    for start in range(0, len(entries), CHUNK):
        chunk = entries[start : start + CHUNK]
        yield [p for p, _ in chunk], [c for _, c in chunk]


def _counter(tokenizer: str | None) -> Counter:
    """Token counts of texts: by `tokenizer`'s tokenizer.json, or estimated from their bytes."""
    if tokenizer is None:
        return lambda texts: [
            max(1, round(len(t.encode("utf-8")) / BYTES_PER_TOKEN)) for t in texts
        ]
    file = Path(tokenizer)
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise SpecError(
            "no tokenizer.json there (give the file, or a local folder holding one)",
            source=tokenizer,
            field="tokenizer",
        )
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SpecError(
            "counting tokens needs the tokenizers package: pip install 'llmsim[tokenizers]'",
            field="tokenizer",
        ) from None
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:  # the library raises its own (Rust) exception types
        raise SpecError(f"not a tokenizer file ({exc})", source=str(file)) from None
    return lambda texts: [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=True)]
