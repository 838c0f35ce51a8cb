"""Request traces: the bundled Azure traces and user CSV/JSONL files, read into a `Trace`.

A trace has one request per row: prompt and output token counts, optionally a timestamp, and
optionally what the request shares with others (for prefix caching):

- `session_column`: rows with the same value are turns of one conversation, each prompt
  starting with the conversation so far (earlier prompt and output). Rows without a value
  share nothing this way.
- `prefix_column` with `prefix_len_column`: rows with the same prefix id start with the same
  content (a system prompt, a document), the first `prefix_len` tokens of it.

Ids may be numbers or strings; they are only compared for equality. Problems in a file are
SpecErrors naming the file, the column and the line of the file (1-based, a CSV's header being
line 1; blank lines counted, as an editor numbers them).
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.errors import SpecError
from simulator.specs._base import MAX_TOKENS
from simulator.specs.loader import check_data_file
from simulator.specs.workload import TraceDataset

# The most seconds from a trace's first row to its last: timestamps are seconds (or datetimes),
# and a trace longer than this (31.7 years) is a unit slip (milliseconds, nanoseconds) or a
# corrupt row, which would overflow the arrival times.
MAX_TRACE_SPAN_S = 1e9
# Maps a data row (0-based, in file order) to the line of the file it is on.
LineOf = Callable[[int], int]

TRACE_DIR = Path(__file__).resolve().parent.parent / "data" / "traces"
BUNDLED_FILES = {
    "azure-code": "azure_llm_2023_code.csv",
    "azure-conv": "azure_llm_2023_conv.csv",
}


@dataclass(frozen=True)
class Trace:
    """A trace's rows in file order. Ids are small integers (-1: none); None: no such column."""

    timestamps_s: np.ndarray | None  # seconds since the earliest row
    prompt_len: np.ndarray
    output_len: np.ndarray
    session_id: np.ndarray | None = None
    prefix_id: np.ndarray | None = None
    prefix_len: np.ndarray | None = None  # tokens, at most the row's prompt

    def __len__(self) -> int:
        return len(self.prompt_len)

    def rows(self, index: np.ndarray) -> Trace:
        """The rows at `index` (in that order)."""

        def pick(arr: np.ndarray | None) -> np.ndarray | None:
            return None if arr is None else arr[index]

        return Trace(
            pick(self.timestamps_s),
            self.prompt_len[index],
            self.output_len[index],
            pick(self.session_id),
            pick(self.prefix_id),
            pick(self.prefix_len),
        )


@functools.cache
def bundled_trace(name: str) -> Trace:
    path = TRACE_DIR / BUNDLED_FILES[name]
    dtypes = {"TIMESTAMP": str, "ContextTokens": np.int64, "GeneratedTokens": np.int64}
    frame = pd.read_csv(path, dtype=dtypes)
    cols = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    return _parse_trace(frame, cols, source=str(path), fields=("", "", ""), line_of=_csv_line(path))


def read_trace(ds: TraceDataset, *, with_timestamps: bool) -> Trace:
    source = str(ds.path)
    check_data_file(ds.path, source=source, field="dataset.path")
    try:
        if ds.file_format == "csv":
            frame, line_of = pd.read_csv(ds.path), _csv_line(ds.path)
        else:
            frame, lines = _read_jsonl(ds.path)
            line_of = lines.__getitem__
    except FileNotFoundError:
        raise SpecError("trace file not found", source=source, field="dataset.path") from None
    except OSError as exc:
        raise SpecError(f"cannot read trace file ({exc.strerror})", source=source) from None
    except UnicodeDecodeError:
        raise SpecError(f"malformed {ds.file_format}: not UTF-8 text", source=source) from None
    except ValueError as exc:  # pandas' and json's parser errors are ValueErrors
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecError(f"malformed {ds.file_format}: {reason}", source=source) from None
    ts_col = ds.timestamp_column if with_timestamps else None
    cols = (ts_col, ds.prompt_column, ds.output_column)
    fields = ("dataset.timestamp_column", "dataset.prompt_column", "dataset.output_column")
    trace = _parse_trace(frame, cols, source=source, fields=fields, line_of=line_of)
    return _with_sharing(trace, frame, ds, source=source, line_of=line_of)


def _csv_line(path: Path) -> LineOf:
    """The file line of a CSV's data row: the header is the first line that is not blank, and
    pandas skips blank lines (counted here only when an error names a row)."""

    def line_of(row: int) -> int:
        seen = -2  # the header's number among non-blank lines is -1
        with path.open(encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, start=1):
                if line.strip():
                    seen += 1
                    if seen == row:
                        return number
        return row + 2

    return line_of


def _read_jsonl(path: Path) -> tuple[pd.DataFrame, list[int]]:
    """One JSON object per line, and the file line of each row (blank lines are skipped).
    Not pd.read_json: pandas 2 turns a numeric column named "timestamp" into dates (epoch
    milliseconds), and its date-guessing switches are deprecated."""
    rows, numbers = [], []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"line {number}: {exc.msg}") from None
                except RecursionError:
                    raise ValueError(f"line {number}: nested too deeply") from None
                if not isinstance(row, dict):
                    raise ValueError(f"line {number}: expected a JSON object")
                rows.append(row)
                numbers.append(number)
    return pd.DataFrame.from_records(rows), numbers


def _require_columns(
    frame: pd.DataFrame, cols: tuple[str | None, ...], fields: tuple[str, ...], source: str
) -> None:
    for col, field in zip(cols, fields, strict=True):
        if col is not None and col not in frame.columns:
            known = ", ".join(map(str, frame.columns))
            raise SpecError(f"no column {col!r} (columns: {known})", source=source, field=field)


def _parse_trace(
    frame: pd.DataFrame,
    cols: tuple[str | None, str, str],
    *,
    source: str,
    fields: tuple[str, str, str],
    line_of: LineOf,
) -> Trace:
    _require_columns(frame, cols, fields, source)
    if frame.empty:
        raise SpecError("the trace has no rows", source=source)
    ts_col, prompt_col, output_col = cols
    timestamps = None
    if ts_col is not None:
        timestamps = _seconds(frame[ts_col], source=source, field=fields[0], line_of=line_of)
    prompt = _token_counts(frame[prompt_col], source=source, field=fields[1], line_of=line_of)
    output = _token_counts(frame[output_col], source=source, field=fields[2], line_of=line_of)
    for arr in (timestamps, prompt, output):
        if arr is not None:
            arr.setflags(write=False)  # the bundled traces are cached: nobody may edit them
    return Trace(timestamps, prompt, output)


def _with_sharing(
    trace: Trace, frame: pd.DataFrame, ds: TraceDataset, *, source: str, line_of: LineOf
) -> Trace:
    """`trace` with the session and prefix columns `ds` names, if any."""
    cols = (ds.session_column, ds.prefix_column, ds.prefix_len_column)
    fields = ("dataset.session_column", "dataset.prefix_column", "dataset.prefix_len_column")
    _require_columns(frame, cols, fields, source)
    session = None if ds.session_column is None else _ids(frame[ds.session_column])
    prefix_id = prefix_len = None
    if ds.prefix_column is not None and ds.prefix_len_column is not None:
        prefix_id = _ids(frame[ds.prefix_column])
        # a row without a prefix id needs no length
        lengths = frame[ds.prefix_len_column].where(prefix_id >= 0, 0)
        counts = _token_counts(lengths, source=source, field=fields[2], least=0, line_of=line_of)
        prefix_len = np.where(prefix_id >= 0, np.minimum(counts, trace.prompt_len), 0)
    return Trace(
        trace.timestamps_s, trace.prompt_len, trace.output_len, session, prefix_id, prefix_len
    )


def _ids(column: pd.Series) -> np.ndarray:
    """Equal values -> equal small integers, from 0; missing values -> -1."""
    codes, _ = pd.factorize(column, use_na_sentinel=True)
    return np.asarray(codes, dtype=np.int64)


def _bad_value(
    column: pd.Series, bad: np.ndarray, what: str, *, source: str, field: str, line_of: LineOf
) -> SpecError:
    row = int(np.flatnonzero(bad)[0])
    value = column.iloc[row]
    shown = (
        "an empty cell"
        if pd.isna(value)
        else repr(value.item() if hasattr(value, "item") else value)
    )
    return SpecError(
        f"line {line_of(row)}, column {column.name!r}: {shown} is not {what}",
        source=source,
        field=field,
    )


def _numbers(column: pd.Series) -> np.ndarray:
    """The column as float64, NaN where a cell is not a number (numbers too large for a float
    become inf, quietly)."""
    if column.dtype == object:  # Python ints beyond int64 (a JSONL 2**64) make pandas raise
        column = column.map(_as_float)
    with np.errstate(over="ignore", invalid="ignore"):
        return pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64)


def _as_float(value: object) -> object:
    """An int as a float (beyond a float's range: inf of its sign); anything else as it is."""
    if not isinstance(value, int):
        return value
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _token_counts(
    column: pd.Series, *, source: str, field: str, line_of: LineOf, least: int = 1
) -> np.ndarray:
    """Non-negative numbers up to MAX_TOKENS, rounded; below `least` becomes `least` (a request
    yields at least one token)."""
    values = _numbers(column)
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        raise _bad_value(column, bad, "a token count", source=source, field=field, line_of=line_of)
    huge = values > MAX_TOKENS
    if huge.any():
        what = f"a token count of at most {MAX_TOKENS:,}"
        raise _bad_value(column, huge, what, source=source, field=field, line_of=line_of)
    return np.maximum(np.rint(values), least).astype(np.int64)


def _seconds(column: pd.Series, *, source: str, field: str, line_of: LineOf) -> np.ndarray:
    """Seconds since the earliest row, from numbers (seconds) or datetime strings; at most
    MAX_TRACE_SPAN_S from the first to the last."""
    numeric = _numbers(column)
    finite = np.isfinite(numeric)
    if finite.any():  # a column of numbers: the first cell that is none is the bad one
        if not finite.all():
            raise _bad_value(
                column, ~finite, "seconds", source=source, field=field, line_of=line_of
            )
        with np.errstate(over="ignore", invalid="ignore"):
            seconds = numeric - numeric.min()
    else:
        with warnings.catch_warnings():  # pandas warns of formats it infers cell by cell
            warnings.simplefilter("ignore")
            stamps = pd.to_datetime(column, format="ISO8601", errors="coerce", utc=True)
        bad = stamps.isna().to_numpy()
        if bad.any():
            what = "seconds or a datetime"
            raise _bad_value(column, bad, what, source=source, field=field, line_of=line_of)
        seconds = (stamps - stamps.min()).dt.total_seconds().to_numpy(dtype=np.float64)
    late = ~np.isfinite(seconds) | (seconds > MAX_TRACE_SPAN_S)
    if late.any():
        what = f"within {MAX_TRACE_SPAN_S:.0e} s of the earliest row (seconds, not ms or ns)"
        raise _bad_value(column, late, what, source=source, field=field, line_of=line_of)
    return seconds


def replay_rows(
    trace: Trace, *, num_prompts: int | None, time_scale: float
) -> tuple[np.ndarray, Trace]:
    """The first num_prompts rows in time order (all: None), and their times since the first,
    multiplied by `time_scale`."""
    assert trace.timestamps_s is not None
    rows = len(trace)
    n = rows if num_prompts is None else num_prompts
    if n > rows:
        raise SpecError(
            f"{n} requests asked for, but the trace has {rows} rows (a replay cannot be longer)",
            field="num_prompts",
        )
    order = np.argsort(trace.timestamps_s, kind="stable")[:n]
    start = trace.timestamps_s[order[0]]
    arrival = (trace.timestamps_s[order] - start) * time_scale
    return arrival, trace.rows(order)


def take_rows(rows: int, num_prompts: int | None, rng: np.random.Generator) -> np.ndarray:
    """Which of `rows` rows give num_prompts requests (all: None): the first ones in file order,
    then, past the end, uniform draws with replacement (vLLM's maybe_oversample_requests)."""
    n = rows if num_prompts is None else num_prompts
    index = np.arange(min(n, rows))
    if n > rows:
        index = np.concatenate([index, rng.integers(0, rows, size=n - rows)])
    return index
