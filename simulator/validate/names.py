"""Every name `llmsim validate --suite` accepts, in output order, without importing a suite (the
CLI's help lists them). Each suite module keeps its own constant; a test checks that the two
agree."""

# a union names the row-level suites it is made of
UNIONS: dict[str, tuple[str, ...]] = {"iteration": ("iteration_prefill", "iteration_decode")}
SUITE_NAMES = (
    "ops", "gemm_library_fit",  # kernels (fitted): aiconfigurator's, and this project's GEMMs
    "ops_amd", "ops_amd_fit",  # MI300X's 8-bit GEMMs, AMD aiter's timings (held out / fitted)
    "ops_nvfp4", "ops_nvfp4_fit",  # B200's NVFP4 GEMMs, published timings (held out / fitted)
    "moe", "moe_fit",  # the fused MoE kernel (held out / fitted)
    "sampler", "sampler_fit",  # vLLM's sampler (held out / fitted)
    "layers", "layers_fit",  # a layer's GEMMs (held out / fitted)
    "elementwise", "elementwise_fit",  # a layer's memory-bound kernels (held out / fitted)
    # engine steps (held out / fitted)
    "iteration", "iteration_prefill", "iteration_decode", "iteration_engine_fit",
    # whole benchmarks, published results (held out)
    "e2e_throughput", "e2e_serving", "e2e_serving_curve", "e2e_latency", "e2e_energy",
    # board power (fractions of TDP, not time; fitted or not)
    "power", "power_fit", "e2e_energy_fit",
)  # fmt: skip
