"""What the model tests share: the op-policy counts a call adds."""

from fullgraph import ops


def policy_counts(run):
    """run() and the op-policy counts it added: {(op, "eager" | "compiled", impl): n}."""
    before = dict(ops.counters)
    out = run()
    return out, {k: v - before.get(k, 0) for k, v in ops.counters.items() if v != before.get(k, 0)}
