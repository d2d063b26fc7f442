"""The objective's terms: each metric's goal and its coefficient in the weighted aggregate.

    sum_m w_m * s_m * metric_m / sum_m w_m,   s_m = +1 where metric m's goal is target.goal, else -1

(`target.weights`, default 1; `target.goals`, default `target.goal`), so `target.goal` stays the
direction of the aggregate. Where no weight differs from another and no goal from target.goal,
`coefficients` says None: the objective is then the plain mean, computed as before weights
existed, to the last bit. Plain Python: the proxies' scoring (climb.runtime.targets), the checks
and the search's mathematics (climb.optimize.multi) all read it.
"""
from __future__ import annotations


def named_goal(metric: str) -> str | None:
    """The goal a metric's name implies: "minimize" for a loss (bpb, train_loss, a task's
    gold_loss_per_byte), "maximize" for an accuracy (a task's acc, acc_norm), None where the name
    does not say."""
    if metric in ("bpb", "train_loss") or metric.endswith("/gold_loss_per_byte"):
        return "minimize"
    if metric.endswith(("/acc", "/acc_norm")):
        return "maximize"
    return None


def metric_goal(name: str, target) -> str:
    """The goal of one of the objective's metrics (`target`: a TargetConfig): its own
    (`target.goals`), else `target.goal`."""
    return target.goals.get(name, target.goal)


def coefficients(target) -> list[tuple[str, float]] | None:
    """Each objective term's coefficient in the aggregate, s_m * w_m / sum(w), in objective order;
    None where the aggregate is the plain mean (no weight differs from another, no goal differs
    from target.goal)."""
    names = list(target.objective)
    w = [float(target.weights.get(m, 1.0)) for m in names]
    s = [1.0 if metric_goal(m, target) == target.goal else -1.0 for m in names]
    if all(x > 0 for x in s) and all(x == w[0] for x in w):
        return None
    total = sum(w)
    return [(m, sm * wm / total) for m, sm, wm in zip(names, s, w)]


def describe(target) -> str:
    """The objective as a short name: "bpb+piqa/acc" for a plain mean (as always), and with
    weights or goals each term's weight, and its own goal where it is not target.goal, e.g.
    "1 bpb + 0.5 piqa/acc (maximize)"."""
    if coefficients(target) is None:
        return "+".join(target.objective)
    return " + ".join(f"{target.weights.get(m, 1.0):g} {m}"
                      + (f" ({metric_goal(m, target)})" if metric_goal(m, target) != target.goal else "")
                      for m in target.objective)
