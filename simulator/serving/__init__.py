"""The simpy discrete-event serving engine: requests, the paged KV cache and its tiers, schedulers,
replicas (plain, pipelined, DP-attention groups), disaggregated pools, the router and the
cluster."""

from simulator.serving import native

native.choose()  # the compiled engine, or its sources (native.py says when)
