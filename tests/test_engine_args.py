"""`EngineArgs`: vLLM's engine flags -> the fields of a scenario's replica group."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.errors import SpecError
from simulator.specs.engine_args import EngineArgs


def test_defaults_leave_the_scheduler_to_the_engine_profile() -> None:
    group = EngineArgs().replica_group(hardware="h100_sxm")
    assert group["hardware"] == "h100_sxm" and group["engine"] == "vllm"
    assert (group["count"], group["data_parallel_size"]) == (1, 1)
    assert set(group["scheduler"].values()) == {None}
    assert group["swap_space_gib"] == 4.0  # vLLM's --swap-space default
    assert group["speculative"] is None and group["offload"] is None
    assert group["kv_offload"] is None


@pytest.mark.parametrize(
    ("expert_parallel", "count", "ranks"),
    [(False, 4, 1), (True, 1, 4)],  # replicas; or one replica of 4 DP-attention ranks
)
def test_data_parallel_size_is_replicas_or_attention_ranks(
    expert_parallel: bool, count: int, ranks: int
) -> None:
    args = EngineArgs(data_parallel_size=4, enable_expert_parallel=expert_parallel)
    group = args.replica_group(hardware="h100_sxm")
    assert (group["count"], group["data_parallel_size"]) == (count, ranks)
    assert group["enable_expert_parallel"] is expert_parallel


def test_scheduler_flags_go_to_the_scheduler() -> None:
    args = EngineArgs(
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        enable_chunked_prefill=False,
        scheduling_policy="priority",
        preemption_mode="swap",
        num_scheduler_steps=4,
        multi_step_stream_outputs=False,
    )
    assert args.replica_group(hardware="l40s")["scheduler"] == {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 2048,
        "chunked_prefill": False,
        "policy": "priority",
        "preemption_mode": "swap",
        "num_scheduler_steps": 4,
        "multi_step_stream_outputs": False,
    }


def test_kv_offloading_needs_its_size_and_prefix_caching() -> None:
    with pytest.raises(SpecError, match="needs --kv-offloading-size") as exc:
        EngineArgs(kv_offloading_backend="lmcache").replica_group(hardware="h100_sxm")
    assert exc.value.field == "kv_offloading_backend"
    with pytest.raises(SpecError, match="needs prefix caching") as exc:
        EngineArgs(kv_offloading_size=8, enable_prefix_caching=False).replica_group(
            hardware="h100_sxm"
        )
    assert exc.value.field == "kv_offloading_size"
    for caching in (True, None):  # None: the engine's default, on in vLLM V1
        args = EngineArgs(kv_offloading_size=8, enable_prefix_caching=caching)
        assert args.replica_group(hardware="h100_sxm")["kv_offload"] == {
            "cpu_gib": 8,
            "backend": "native",
        }


def test_json_flags_are_parsed_and_bad_json_is_a_spec_error() -> None:
    args = EngineArgs(
        speculative_config='{"method": "ngram", "num_speculative_tokens": 2, '
        '"acceptance_rate": 0.5}',
        offload_config='{"transfer": "sync"}',
        cpu_offload_gb=10,
    )
    group = args.replica_group(hardware="h100_sxm")
    assert group["speculative"]["num_speculative_tokens"] == 2
    assert group["offload"] == {"transfer": "sync"}
    assert group["cpu_offload_gb"] == 10
    with pytest.raises(SpecError, match="not valid JSON"):
        EngineArgs(speculative_config="{eagle").replica_group(hardware="h100_sxm")


def test_engine_args_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        EngineArgs().tensor_parallel_size = 2  # type: ignore[misc]
