"""PromQL over stored series, with Prometheus 2.x's semantics: the simulator's triggers and recording
rules, `slopilot query`, and tests comparing it with a real Prometheus.

    tree = compile_query('histogram_quantile(0.9, sum by (le) (rate(x_bucket[1m])))')  # parse + check
    Evaluator(store).eval(tree, t_ms)                                           # one instant
    instant_query(store, text, t_ms) / range_query(store, text, start, end, step)  # API-shaped answers

Torch-free and pure: the simulator and the control plane both use it. A store is anything with
instant() and window() (promql.storage).
"""

from promql.api import format_value, instant_query, range_query
from promql.engine import DEFAULT_STEP, LOOKBACK, Evaluator
from promql.parse import PromQLError, compile_query
from promql.storage import Labels, MemoryStorage, Storages, labels_of
from promql.tree import lookbehind

__all__ = ["DEFAULT_STEP", "LOOKBACK", "Evaluator", "Labels", "MemoryStorage", "PromQLError", "Storages",
           "compile_query", "format_value", "instant_query", "labels_of", "lookbehind", "range_query"]
