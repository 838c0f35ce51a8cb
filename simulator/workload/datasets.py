"""The built-in datasets of a workload (`workload.py`) and the prompt and output lengths they give.

The fields mirror `vllm bench serve --dataset-name` (vllm/benchmarks/serve.py and datasets.py):

- `random`: vLLM's RandomDataset lengths, uniform integers in [floor(L(1-r)), ceil(L(1+r))].
- `sharegpt`: with `path` (vLLM's --dataset-path), the lengths vLLM takes from that ShareGPT JSON
  (`sharegpt_file.py`). Without it (ShareGPT cannot be shipped or downloaded), lengths come from
  lognormals fitted to what `vllm bench serve --dataset-name sharegpt` sends, after vLLM's own
  ShareGPT filter.
  With ShareGPT_V3_unfiltered_cleaned_split, a Llama-3.1 tokenizer, seed 0 and 1000 prompts, every
  published run shows 215,196 input tokens (mean 215.2) and 197,090 to 198,532 generated tokens
  (vllm-project/vllm PR #15720 and other reports); generation can stop early, so those bound the
  requested output lengths from below: a mean of about 199. For scale, the vLLM paper (Kwon et al.,
  SOSP'23, arXiv:2309.06180, Fig. 11) reports means of 161 in / 338 out for raw ShareGPT with the
  OPT tokenizer. The prompts' spread is measured: the first 320 prompt lengths of that sampling
  (seed 0, Llama 3 tokenizer; simulator/data/traces/sharegpt_v3_prompt_lens.csv) fix it by
  maximum likelihood (`fit_sharegpt_prompts`): inside the filter's 4-1024 tokens they are close
  to log-uniform (median 77, a tenth under 11, a tenth over 611). The outputs' spread is an
  assumption: no per-request lengths of the dataset's completions were found.
- `azure-code`, `azure-conv`: the bundled Azure LLM inference traces of 2023-11-16
  (Azure/AzurePublicDataset, CC-BY-4.0; see simulator/data/traces/README.md), read by `traces.py`.

Not modelled: tokenizer special tokens (vLLM subtracts them from --random-input-len; here the
length is used as given) and correlation between prompt and output length in synthetic ShareGPT
requests.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from simulator.specs.workload import (
    SHAREGPT_MAX_PROMPT_LEN,
    SHAREGPT_MIN_LEN,
    RandomDataset,
    ShareGPTDataset,
    sharegpt_filter,
)

# Lognormals (of token counts, before vLLM's filter) whose filtered means are 215.2 prompt and
# 199 output tokens (see the module docstring for the sources). Prompts: sigma fitted to the
# bundled lengths vLLM sends (`fit_sharegpt_prompts`, which a test reruns; its likelihood is flat
# from about 3 up: at sigma 1.2, assumed before, it is e^89 times lower), mu tied to the mean.
# Outputs: sigma assumed, mu solved numerically for the mean (4M samples).
SHAREGPT_PROMPT_MEAN = 215.2
SHAREGPT_PROMPTS_FILE = Path(__file__).parents[1] / "data/traces/sharegpt_v3_prompt_lens.csv"
SHAREGPT_PROMPT_LOGNORMAL = (5.878, 3.447)  # (mu, sigma) of ln(prompt tokens)
SHAREGPT_OUTPUT_LOGNORMAL = (4.912, 0.9)  # (mu, sigma) of ln(output tokens)


def random_lengths(
    ds: RandomDataset, *, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) token counts of `n` requests, int64, both >= 1."""
    # vLLM RandomDataset.get_sampling_params (vllm/benchmarks/datasets.py): "Bounds use floor for
    # low and ceil for high", output_low = max(output_low, 1), inclusive integer ranges, inputs
    # drawn before outputs. With the same seed the lengths equal vLLM's when the tokenizer adds
    # no special tokens.
    r = ds.range_ratio
    in_lo, in_hi = math.floor(ds.input_len * (1 - r)), math.ceil(ds.input_len * (1 + r))
    out_lo = max(math.floor(ds.output_len * (1 - r)), 1)
    out_hi = max(math.ceil(ds.output_len * (1 + r)), 1)
    prompt = rng.integers(in_lo, in_hi + 1, size=n, dtype=np.int64)
    output = rng.integers(out_lo, out_hi + 1, size=n, dtype=np.int64)
    return prompt, output


def sharegpt_lengths(
    ds: ShareGPTDataset, *, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) token counts of `n` requests: read from `ds.path` as vLLM samples it
    (`rng` unused), or lognormal draws kept only where vLLM's ShareGPT filter would keep them
    (rejection)."""
    if ds.path is not None:
        from simulator.workload.sharegpt_file import sharegpt_file_lengths  # it imports this

        return sharegpt_file_lengths(
            ds.path, n=n, seed=ds.seed, tokenizer=ds.tokenizer, output_len=ds.output_len
        )
    kept_p: list[np.ndarray] = []
    kept_o: list[np.ndarray] = []
    have, pass_rate = 0, 0.9  # about 94% of draws pass with the default output lengths
    while have < n:
        batch = min(int((n - have) / pass_rate * 1.1) + 64, 4_000_000)
        prompt = np.rint(rng.lognormal(*SHAREGPT_PROMPT_LOGNORMAL, size=batch)).astype(np.int64)
        if ds.output_len is None:
            output = np.rint(rng.lognormal(*SHAREGPT_OUTPUT_LOGNORMAL, size=batch)).astype(np.int64)
        else:
            output = np.full(batch, ds.output_len, dtype=np.int64)
        ok = sharegpt_filter(prompt, output, check_output=ds.output_len is None)
        kept_p.append(prompt[ok])
        kept_o.append(output[ok])
        have += int(ok.sum())
        pass_rate = max(float(ok.mean()), 1e-4)
    return np.concatenate(kept_p)[:n], np.concatenate(kept_o)[:n]


def fit_sharegpt_prompts(
    lengths: np.ndarray, *, mean: float = SHAREGPT_PROMPT_MEAN
) -> tuple[float, float]:
    """(mu, sigma) of the prompt lognormal: ln(tokens) a normal truncated to vLLM's filter
    window (4-1024 tokens after rounding), sigma the maximum-likelihood fit to `lengths` with
    mu set, for each sigma, so that the truncated mean is `mean` (the published mean of 1000
    prompts holds more of the location than a sample of 320). Rounded to 3 decimals."""
    from scipy import optimize, stats

    logs = np.log(np.asarray(lengths, dtype=float))
    lo, hi = math.log(SHAREGPT_MIN_LEN - 0.5), math.log(SHAREGPT_MAX_PROMPT_LEN + 0.5)
    normal = stats.norm

    def truncated_mean(mu: float, sigma: float) -> float:
        a, b = (lo - mu) / sigma, (hi - mu) / sigma
        inside = normal.cdf(b - sigma) - normal.cdf(a - sigma)
        return float(math.exp(mu + sigma**2 / 2) * inside / (normal.cdf(b) - normal.cdf(a)))

    def mu_for(sigma: float) -> float:
        return float(optimize.brentq(lambda mu: truncated_mean(mu, sigma) - mean, 0.0, 12.0))

    def nll(sigma: float) -> float:
        mu = mu_for(sigma)
        mass = normal.cdf((hi - mu) / sigma) - normal.cdf((lo - mu) / sigma)
        return float(-(normal.logpdf(logs, mu, sigma).sum() - len(logs) * math.log(mass)))

    fit = optimize.minimize_scalar(nll, bounds=(0.5, 8.0), method="bounded")
    sigma = float(fit.x)
    return round(mu_for(sigma), 3), round(sigma, 3)
