"""Which rank gates each step, and why (``compare --ranks``).

With tensor parallelism every step waits, at its next collective, for the slowest rank's
batch.  Per aligned step: W[r] is rank r's batch wall time and C[r, cause] batch-tail's split
of it.  The gating rank g is argmax W; its excess is W[g] - median(W).  The excess is split
into causes as the difference between g's split and the split of the median rank (the mean of
the two middle ranks when there are an even number): those differences sum to the excess
exactly, so "residency 2.1 ms of a 2.4 ms excess" is the same time split as batch-tail applied
to the difference.  The cause of the step's excess is the largest positive difference.
"""
from __future__ import annotations

import numpy as np

from engramprof.analysis.verdicts import CAUSES, col

MS_COLS = [f"ms_{col(c)}" for c in CAUSES]


def matrices(tables: list, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(W: steps x ranks wall ms, C: steps x ranks x causes ms) of the aligned rows."""
    W = np.column_stack([t["wall_ms"].to_numpy(np.float64)[index[:, r]] for r, t in enumerate(tables)])
    C = np.stack([t[MS_COLS].to_numpy(np.float64)[index[:, r]] for r, t in enumerate(tables)], axis=1)
    return W, C


def reference(W: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the median wall time and the median rank's split (mean of the two middle
    ranks for an even count)."""
    S, N = W.shape
    order = np.argsort(W, axis=1, kind="stable")
    steps = np.arange(S)
    if N % 2:
        mid = order[:, N // 2]
        return W[steps, mid], C[steps, mid]
    a, b = order[:, N // 2 - 1], order[:, N // 2]
    return (W[steps, a] + W[steps, b]) / 2, (C[steps, a] + C[steps, b]) / 2


def attribute(W: np.ndarray, C: np.ndarray) -> dict:
    """Per step: gating rank, excess ms, the excess split by cause and its top cause; and
    per rank: each rank's own excess over the median split the same way (for the heat map)."""
    S, N = W.shape
    med, ref_split = reference(W, C)
    gate = np.argmax(W, axis=1)
    steps = np.arange(S)
    excess = W[steps, gate] - med
    diff = C[steps, gate] - ref_split                       # (S, causes): sums to excess
    top = np.argmax(diff, axis=1)
    own = C - ref_split[:, None, :]                         # (S, N, causes)
    own_top = np.argmax(own, axis=2)
    return {"median": med, "gate": gate, "excess": excess, "diff": diff, "top": top,
            "rank_excess": np.maximum(W - med[:, None], 0.0), "rank_top": own_top}


def summarise(W: np.ndarray, att: dict, labels: list[int], traces: list[str], tables: list) -> dict:
    """The per-rank summary of ``compare --ranks`` (the JSON's ranks list and the totals)."""
    S, N = W.shape
    ranks = []
    for r in range(N):
        mine = (att["gate"] == r) & (att["excess"] > 0)  # a step no rank is slower in has no gating rank
        causes = att["diff"][mine].sum(axis=0) if mine.any() else np.zeros(len(CAUSES))
        order = np.argsort(-causes, kind="stable")
        top = CAUSES[int(order[0])] if mine.any() and causes[order[0]] > 0 else None
        ranks.append({
            "rank": labels[r], "trace": traces[r],
            "gated_steps": int(mine.sum()),
            "gated_share": round(float(mine.mean()) if S else 0.0, 4),
            "excess_ms": round(float(att["excess"][mine].sum()), 4),
            "top_cause": top,
            "excess_by_cause_ms": {c: round(float(max(causes[i], 0.0)), 4) for i, c in enumerate(CAUSES)},
            "batch_ms": {"p50": round(float(np.percentile(W[:, r], 50)), 4) if S else None,
                         "p99": round(float(np.percentile(W[:, r], 99)), 4) if S else None},
            "batches": int(len(tables[r])),
        })
    gating = max(ranks, key=lambda x: (x["gated_steps"], x["excess_ms"])) if ranks else None
    if gating is not None and not gating["excess_ms"] > 0:  # ranks even: none gates (not "0 ms slower")
        gating = None
    return {"gating_rank": gating["rank"] if gating else None, "ranks": ranks,
            "lost_to_stragglers_ms": round(float(att["excess"].sum()), 4),
            "step_ms": {"p50": round(float(np.percentile(W.max(axis=1), 50)), 4),
                        "p99": round(float(np.percentile(W.max(axis=1), 99)), 4)},
            "median_rank_ms": {"p50": round(float(np.percentile(att["median"], 50)), 4)}}


def worst_steps(steps: np.ndarray, W: np.ndarray, att: dict, labels: list[int], top: int) -> list[dict]:
    order = np.argsort(-att["excess"], kind="stable")[:top]
    return [{"step": int(steps[i]), "gating_rank": labels[int(att["gate"][i])],
             "step_ms": round(float(W[i].max()), 4), "median_ms": round(float(att["median"][i]), 4),
             "excess_ms": round(float(att["excess"][i]), 4), "cause": CAUSES[int(att["top"][i])]
             if att["excess"][i] > 0 else None} for i in order]
