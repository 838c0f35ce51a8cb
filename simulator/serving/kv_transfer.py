"""The KV-cache transfer from a prefill replica to a decode replica (disaggregated serving).

The link (`KVTransferSpec.kind`), per GPU and per direction, at its achieved bandwidth:

- `nvlink`: the GPU fabric of one node, at the bandwidth to one peer
  (`interconnect.peer_bw_bytes_per_s`: an NVSwitch port's full speed, one xGMI link on a mesh)
  x `nvlink_fraction`; latency `interconnect.latency_s`. Both pools on one hardware type with a
  GPU fabric.
- `infiniband` / `roce`: the GPU's NIC (`interconnect.scale_out_bw_bytes_per_s`) x
  `network_fraction`; latency `interconnect.scale_out_latency_s` (the specs give one scale-out
  network, so both kinds read the same fields).
- `pcie`: the host link (`host.pcie_bw_bytes_per_s` x the spec's measured
  `efficiency.host_link_fraction`); latency `pcie_latency_s`.
- `auto`: nvlink when every GPU of the deployment is of one hardware type with a GPU fabric and
  fits in one node; pcie when they fit in one node without a fabric; else the scale-out network.

The slower end of the two specs sets the bandwidth, the longer latency the latency;
`bandwidth_bytes_per_s` / `latency_s` replace them (taken as achieved: no fraction applies).
The fractions are in kv_transfer.yaml with their sources.

Time on the wire for a prompt of n tokens: the decode replica receives what its GPUs hold,
n x (KV bytes per token per decode GPU) x decode GPUs (KV heads replicated over TP ranks, and
MLA's latent, go to every rank that holds them), over min(prefill GPUs, decode GPUs) links in
parallel (each GPU sends or receives its own shard): X = n B / (bw min(Gp, Gd)). The KV is in
place X + latency after the link starts.

Layer by layer (`layerwise: true`): the KV is taken as produced evenly over the request's
prefill span S (its first scheduled step to its last prefill step), layer by layer, and each
layer's KV is sent as soon as it exists. With L layers the link starts after the first layer
(S / L) and the last layer leaves after the prefill ends, so the exposed time is
max(X / L, X - S (L - 1) / L) + latency: X / L when the link keeps up with the compute, the
rest of X otherwise. This needs the decode replica's blocks when the prefill starts; the
simulator picks the decode replica when the prefill ends, and a request admitted there at once
is taken to have been placed at the start (if it had to wait for room, nothing overlaps).

Contention: a replica has one link (its GPUs' NICs together); transfers that share the prefill
replica's or the decode replica's link run one after another, in the order they are scheduled.
Not modelled: per-layer message costs, congestion in the network fabric beyond the two ends,
host-side limits of aggregating many NICs (see kv_transfer.yaml), compression of the KV.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pydantic import Field

from simulator.costmodel.deployment import Deployment
from simulator.costmodel.memory import kv_bytes_per_token_per_device
from simulator.errors import SpecError
from simulator.specs._base import Frozen, Seconds
from simulator.specs.hardware import HardwareSpec
from simulator.specs.loader import read_yaml, validate
from simulator.specs.serving import KVTransferSpec, LinkKind

FACTORS_FILE = Path(__file__).with_name("kv_transfer.yaml")


class LinkFactors(Frozen):
    """The empirical factors of kv_transfer.yaml."""

    nvlink_fraction: float = Field(gt=0, le=1)
    network_fraction: float = Field(gt=0, le=1)
    pcie_latency_s: Seconds = Field(ge=0)


@cache
def link_factors() -> LinkFactors:
    return validate(LinkFactors, read_yaml(FACTORS_FILE), source=str(FACTORS_FILE))


@dataclass(frozen=True)
class TransferModel:
    """One prefill group -> decode group link, resolved. Bandwidth is achieved, per GPU and
    direction; `bytes_per_token` is what the decode replica receives per prompt token."""

    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float
    bytes_per_token: float
    parallel_links: int
    num_layers: int
    layerwise: bool

    def wire_s(self, tokens: int) -> float:
        """Seconds the link is busy moving the KV of `tokens` prompt tokens."""
        return tokens * self.bytes_per_token / (self.bandwidth_bytes_per_s * self.parallel_links)

    def schedule(
        self,
        *,
        tokens: int,
        prefill_start_s: float,
        prefill_end_s: float,
        admitted_s: float,
        link_free_s: float,
    ) -> tuple[float, float]:
        """(when the link is free again, when the KV is in place) for a request whose prefill
        ran from `prefill_start_s` to `prefill_end_s`, admitted by the decode replica at
        `admitted_s`, on a link free from `link_free_s` (see the module doc)."""
        wire = self.wire_s(tokens)
        if self.layerwise and admitted_s <= prefill_end_s:
            per_layer = (prefill_end_s - prefill_start_s) / self.num_layers
            start = max(prefill_start_s + per_layer, link_free_s)
            end = max(start + wire, prefill_end_s + wire / self.num_layers)
        else:
            end = max(admitted_s, prefill_end_s, link_free_s) + wire
        return end, end + self.latency_s

    def describe(self) -> str:
        overlap = ", layer by layer" if self.layerwise else ""
        return (
            f"{self.kind} {self.bandwidth_bytes_per_s / 1e9:.1f} GB/s per GPU x "
            f"{self.parallel_links}, {self.latency_s * 1e6:.1f} us, "
            f"{self.bytes_per_token / 1e3:.1f} kB per token{overlap}"
        )


def _gpus(dep: Deployment) -> int:
    return dep.layout.devices_per_replica


def device_link(kind: str, hw: HardwareSpec, factors: LinkFactors) -> tuple[float, float]:
    """(achieved bandwidth per GPU and direction, latency) of `kind` on `hw`."""
    net = hw.interconnect
    match kind:
        case "nvlink":
            return net.peer_bw_bytes_per_s * factors.nvlink_fraction, net.latency_s
        case "pcie":
            link = hw.host.pcie_bw_bytes_per_s * hw.efficiency.host_link_fraction
            return link, factors.pcie_latency_s
        case _:  # infiniband, roce, the scale-out network
            return net.scale_out_bw_bytes_per_s * factors.network_fraction, net.scale_out_latency_s


def fabric_kind(hw: HardwareSpec) -> str:
    """The link between two GPUs of one node of `hw`: its GPU fabric, else PCIe."""
    return "pcie" if hw.interconnect.topology == "pcie" else "nvlink"


def resolve_link_kind(kind: LinkKind, pools: Sequence[tuple[Deployment, int]]) -> str:
    """The link `kind` names, `auto` resolved over every group of the deployment."""
    ids = {dep.hardware.id for dep, _ in pools}
    first = pools[0][0].hardware
    one_type = len(ids) == 1
    fabric = first.interconnect.topology != "pcie"
    if kind == "nvlink" and not (one_type and fabric):
        why = "hardware types differ" if not one_type else f"{first.id} has no GPU fabric"
        raise SpecError(
            f"nvlink joins GPUs of one node with a GPU fabric ({why}); use infiniband, roce "
            "or pcie",
            field="kv_transfer.kind",
        )
    if kind != "auto":
        return kind
    gpus = sum(_gpus(dep) * count for dep, count in pools)
    if one_type and gpus <= first.interconnect.gpus_per_node:
        return fabric_kind(first)
    return "scale-out"


def transfer_links(
    spec: KVTransferSpec | None,
    *,
    pools: Sequence[tuple[str, Deployment, int]],
) -> dict[tuple[int, int], TransferModel]:
    """The link of every (prefill group, decode group) pair, by group index. `pools`: (role,
    deployment, replica count) per replica group, in scenario order."""
    spec = spec or KVTransferSpec()
    factors = link_factors()
    kind = resolve_link_kind(spec.kind, [(dep, count) for _, dep, count in pools])
    links = {}
    for i, (role_p, prefill, _) in enumerate(pools):
        for j, (role_d, decode, _) in enumerate(pools):
            if role_p != "prefill" or role_d != "decode":
                continue
            if prefill.precision.kv_cache != decode.precision.kv_cache:
                raise SpecError(
                    f"the decode pool's KV cache is {decode.precision.kv_cache}, the prefill "
                    f"pool's {prefill.precision.kv_cache}: the transferred blocks must match",
                    field=f"replicas.{j}.kv_cache_dtype",
                )
            (bw_p, lat_p), (bw_d, lat_d) = (
                device_link(kind, d.hardware, factors) for d in (prefill, decode)
            )
            per_gpu = kv_bytes_per_token_per_device(decode.model, decode.layout, decode.precision)
            links[i, j] = TransferModel(
                kind=kind,
                bandwidth_bytes_per_s=spec.bandwidth_bytes_per_s or min(bw_p, bw_d),
                latency_s=spec.latency_s if spec.latency_s is not None else max(lat_p, lat_d),
                bytes_per_token=per_gpu * _gpus(decode),
                parallel_links=min(_gpus(prefill), _gpus(decode)),
                num_layers=decode.model.num_layers,
                layerwise=spec.layerwise,
            )
    return links
