"""The recorder's flat buffers come out as the rows they stand for: one per step (a decode run
expanded step by step) and the ITL sample, whatever the order replicas record in."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.metrics.recorder import STEP_COLUMNS, Recorder

# (replica, kind, steps, num_seqs, prefill tokens, kv growth): kind 0 a step, 1 a decode run
EVENT = st.tuples(
    st.integers(0, 3),
    st.integers(0, 1),
    st.integers(1, 6),
    st.integers(1, 40),
    st.integers(0, 2048),
    st.integers(0, 9),
)


def record(events: list[tuple[int, int, int, int, int, int]]) -> tuple[Recorder, dict[str, list]]:
    """Feed `events` to a recorder; returns it and the rows it must give, built row by row."""
    recorder = Recorder()
    rows: dict[int, list[tuple[float, ...]]] = {}
    gaps: dict[int, list[tuple[float, float]]] = {}  # each replica's, in its order
    clock = dict.fromkeys(range(4), 0.0)
    kv = dict.fromkeys(range(4), 100)
    for i, (replica, kind, steps, seqs, prefill, growth) in enumerate(events):
        start = clock[replica]
        ends = [start + 0.01 * (j + 1) + 1e-4 * i for j in range(steps)]
        if kind == 0:
            recorder.step(
                replica=replica,
                start_s=start,
                end_s=ends[0],
                num_seqs=seqs,
                prefill_tokens=prefill,
                decode_tokens=seqs - 1,
                kv_used_blocks=kv[replica],
            )
            rows.setdefault(replica, []).append(
                (replica, start, ends[0], seqs, prefill, seqs - 1, kv[replica])
            )
            ends = ends[:1]
        else:
            before, after = kv[replica], kv[replica] + growth
            recorder.decode_run(
                replica=replica,
                start_s=start,
                end_s=ends,
                num_seqs=seqs,
                kv_before=before,
                kv_after=after,
            )
            slope = (after - before) / max(steps - 1, 1)
            for j, end in enumerate(ends):
                begin = start if j == 0 else ends[j - 1]
                used = round(before + slope * j)
                rows.setdefault(replica, []).append((replica, begin, end, seqs, 0, seqs, used))
                if j:
                    gaps.setdefault(replica, []).append((end - ends[j - 1], seqs))
            kv[replica] = after
        recorder.itl([0.002 * (i + 1)])
        recorder.itl_weighted(0.003 * (i + 1), seqs)
        clock[replica] = ends[-1]
    ones = [(0.002 * (i + 1), 1.0) for i in range(len(events))]
    weighted = [(0.003 * (i + 1), float(e[3])) for i, e in enumerate(events)]
    expected = {
        "steps": [row for r in sorted(rows) for row in rows[r]],
        # one-token gaps, weighted ones, then the runs' steps by replica
        "itl": ones + weighted + [gap for r in sorted(gaps) for gap in gaps[r]],
    }
    return recorder, expected


@settings(max_examples=40, deadline=None)
@given(st.lists(EVENT, max_size=30))
def test_rows_are_the_recorded_steps_and_gaps(
    events: list[tuple[int, int, int, int, int, int]],
) -> None:
    recorder, expected = record(events)
    values, weights = recorder.itl_sample()
    frame = recorder.step_frame()
    assert list(frame.columns) == list(STEP_COLUMNS)
    want = np.array(expected["steps"], dtype=float).reshape(-1, len(STEP_COLUMNS))
    np.testing.assert_array_equal(frame.to_numpy(dtype=float), want)
    itl = np.array(expected["itl"], dtype=float).reshape(-1, 2)
    np.testing.assert_array_equal(values, itl[:, 0])
    np.testing.assert_array_equal(weights, itl[:, 1])


def test_release_lets_the_rows_go_and_recording_starts_afresh() -> None:
    recorder, _ = record([(0, 1, 3, 4, 0, 2), (1, 0, 1, 2, 64, 0)])
    assert len(recorder.step_frame()) == 4
    with pytest.raises(RuntimeError, match="release"):  # its buffers went into the frame
        recorder.decode_run(
            replica=0, start_s=9.0, end_s=[9.5], num_seqs=1, kv_before=0, kv_after=0
        )
    recorder.release()
    assert len(recorder.step_frame()) == 0 and len(recorder.itl_sample()[0]) == 0
    recorder.release()
    recorder.step(
        replica=0,
        start_s=0.0,
        end_s=1.0,
        num_seqs=1,
        prefill_tokens=8,
        decode_tokens=0,
        kv_used_blocks=1,
    )
    assert recorder.step_frame()["prefill_tokens"].tolist() == [8]
