"""Reports: plotly figures from the result DataFrames, and one self-contained HTML file per
run, sweep or plan folder (`llmsim report DIR [-o report.html]`, `write_report`).

The figure functions are pure (DataFrames in, `plotly.graph_objects.Figure` out), for
notebooks:

    from simulator import run
    from simulator.report import latency_cdf, kv_usage
    result = run("scenarios/quickstart.yaml")
    latency_cdf(result.sim.requests, slo={"ttft_ms": 500}).show()
"""

from simulator.report.build import write_report
from simulator.report.costfigures import cost_frontier, op_breakdown, roofline
from simulator.report.figures import (
    batch_size,
    fleet_replicas,
    kv_usage,
    latency_cdf,
    power_trace,
    queue_length,
    rate_latency,
    throughput_latency_pareto,
)
from simulator.report.load import PlanFolder, RunFolder, SweepFolder, load
from simulator.report.ops import RunOps, run_op_costs, step_op_costs

__all__ = [
    "PlanFolder",
    "RunFolder",
    "RunOps",
    "SweepFolder",
    "batch_size",
    "cost_frontier",
    "fleet_replicas",
    "kv_usage",
    "latency_cdf",
    "load",
    "op_breakdown",
    "power_trace",
    "queue_length",
    "rate_latency",
    "roofline",
    "run_op_costs",
    "step_op_costs",
    "throughput_latency_pareto",
    "write_report",
]
