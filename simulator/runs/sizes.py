"""What a simulation will cost before it starts: memory, refused when the machine does not have
it, and time, announced on stderr when the run is long.

The figures are measured on this code (`llmsim run` of the quickstart scenario, Llama-3.1-8B on
one H100 under vLLM, Poisson arrivals above capacity, on the 2-core development machine): the
peak resident memory (`resource.getrusage` ru_maxrss) and wall time of runs of 10,000 and
50,000 requests (20,000 and 100,000 at 256 output tokens), the difference divided by the extra
requests. Memory per request came out 1.6 KB at 16 output tokens, 0.9 KB at 256 and 1.8 KB at
1,024 (the request table, the engine's Request objects, the recorder's request, step and
inter-token rows, the summary's arrays); time per request 0.44 ms at 16 output tokens, 0.95 ms
at 256 and 4.9 ms at 1,024 (decode steps grow with the output).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from simulator.errors import SpecError

# Bytes of memory one simulated request takes, all told: the largest measured (1.8 KB at 1,024
# output tokens, see the module docstring) rounded up to the 2.2 KB an earlier measurement of
# a 10**7-request run found (23 GB).
BYTES_PER_REQUEST = 2_200
# The same in stream mode (`outputs: stream`), which keeps running sums instead of rows: the
# request table and the requests in flight. Measured as above on streamed runs of 100,000 and
# 400,000 synthetic requests (512/128 tokens at 40/s on 4 H100 replicas, 2026-11-29): 195 and
# 235 MiB peak, 141 bytes a request between them, rounded up.
STREAM_BYTES_PER_REQUEST = 200
# Seconds of simulation per request, and per output token of a request: a line through the
# measured 0.44 ms at 16 output tokens and 4.9 ms at 1,024 (module docstring), runs at a few
# requests per second where each decode step carries few requests. Under load a step carries
# many and the run is faster (benchmarks/bench_serving.py --million, 1,000,000 requests of 128
# output tokens at 40/s on 4 replicas: 207 s where this gives 930 s), so this is an upper
# estimate.
SECONDS_PER_REQUEST = 3.7e-4
SECONDS_PER_OUTPUT_TOKEN = 4.4e-6
# A run expected to take longer than this says so on stderr before it starts.
LONG_RUN_S = 60.0
# What of the available memory a run may plan to use (the rest: the interpreter, the specs,
# other processes' growth).
USABLE_FRACTION = 0.8
_MEMINFO = Path("/proc/meminfo")


def available_memory_bytes() -> int | None:
    """Memory the machine can give without swapping: Linux's MemAvailable, else the free
    physical pages; None where neither is known (then nothing is refused)."""
    try:
        for line in _MEMINFO.read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def bytes_per_request(*, stream: bool = False) -> int:
    """Memory one simulated request takes: BYTES_PER_REQUEST, or STREAM_BYTES_PER_REQUEST
    in stream mode."""
    return STREAM_BYTES_PER_REQUEST if stream else BYTES_PER_REQUEST


def check_fits(
    num_requests: int, *, field: str = "workload.num_prompts", stream: bool = False
) -> None:
    """SpecError naming `field` when simulating `num_requests` requests needs more memory
    (`bytes_per_request` each) than USABLE_FRACTION of what the machine has available."""
    available = available_memory_bytes()
    each = bytes_per_request(stream=stream)
    need = num_requests * each
    if available is None or need <= USABLE_FRACTION * available:
        return
    hint = "ask for fewer"
    if not stream:
        hint += ", or stream them (llmsim run --outputs stream)"
    raise SpecError(
        f"{num_requests:,} requests need about {_gib(need)} of memory to simulate "
        f"({each:,} bytes each), more than {USABLE_FRACTION:.0%} of the "
        f"{_gib(available)} this machine has available: {hint}",
        field=field,
    )


def estimate_s(num_requests: int, mean_output_tokens: float) -> float:
    """Seconds a run of `num_requests` requests of `mean_output_tokens` output tokens takes to
    simulate at most, about (the development machine's speed; a loaded run is faster)."""
    per_request = SECONDS_PER_REQUEST + SECONDS_PER_OUTPUT_TOKEN * mean_output_tokens
    return num_requests * per_request


def announce_long_run(
    num_requests: int, mean_output_tokens: float, *, stream: bool = False
) -> None:
    """Say on stderr what a run longer than LONG_RUN_S will take (time and memory), before it
    starts: a run of 10**7 requests is tens of minutes."""
    seconds = estimate_s(num_requests, mean_output_tokens)
    if seconds <= LONG_RUN_S:
        return
    took = f"{seconds / 60:,.0f} min" if seconds < 7200 else f"{seconds / 3600:,.1f} h"
    sys.stderr.write(
        f"llmsim: note: simulating {num_requests:,} requests: up to about {took} and "
        f"{_gib(num_requests * bytes_per_request(stream=stream))} of memory\n"
    )
