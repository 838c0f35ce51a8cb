"""The simpy discrete-event serving engine: requests, the paged KV cache and its tiers, schedulers,
replicas (plain, pipelined, DP-attention groups), disaggregated pools, the router and the
cluster."""
