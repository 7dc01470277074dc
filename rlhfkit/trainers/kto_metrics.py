"""The KTO trainer's metrics over the rows of every process, and TRL's advice on the desirable /
undesirable weights of an unbalanced dataset."""

from __future__ import annotations

import torch

from .. import distributed


def kto_metrics(parts: list) -> dict[str, torch.Tensor]:
    """TRL's KTO metrics of one step (or one evaluation) over every process. ``parts``: one
    ``((losses, rewards, logps, z0), labels)`` per micro-batch pass, ``labels`` the rows that count
    (empty for a stand-in); every process has as many passes. ``kto/loss`` is the mean over the rows;
    as TRL logs them, ``kl`` is the mean ``z0`` of the passes (each already the whole micro-batch's)
    and ``rewards/*`` / ``logps/*`` the mean over the passes of each pass's mean over its desirable
    (chosen) or undesirable (rejected) rows of every process — a name absent when no pass had such
    rows."""
    per_pass = []  # per pass: rows, loss sum, desirable and undesirable rows, their reward sums, their logp sums
    for (losses, rewards, logps, _), labels in parts:
        n = len(labels)
        chosen = torch.tensor(labels, dtype=torch.bool, device=losses.device)
        values = torch.stack([losses.detach()[:n], rewards[:n], logps[:n]]).double()
        per_pass.append(
            torch.stack(
                [
                    torch.tensor(float(n), dtype=torch.float64, device=losses.device),
                    values[0].sum(),
                    chosen.double().sum(),
                    (~chosen).double().sum(),
                    values[1][chosen].sum(),
                    values[1][~chosen].sum(),
                    values[2][chosen].sum(),
                    values[2][~chosen].sum(),
                ]
            )
        )
    totals = torch.tensor(distributed.sum_floats(torch.stack(per_pass).flatten().tolist())).view(-1, 8)
    metrics = {"kto/loss": totals[:, 1].sum() / totals[:, 0].sum().clamp(min=1)}
    metrics["kl"] = torch.stack([p[0][3].detach().double().cpu() for p in parts]).mean()  # 0 without (TRL's too)
    for side, count, reward, logp in (("chosen", 2, 4, 6), ("rejected", 3, 5, 7)):
        some = totals[:, count] > 0
        if some.any():
            metrics[f"rewards/{side}"] = (totals[some, reward] / totals[some, count]).mean()
            metrics[f"logps/{side}"] = (totals[some, logp] / totals[some, count]).mean()
    if "rewards/chosen" in metrics and "rewards/rejected" in metrics:
        metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
    return metrics


def weight_advice(rows: list, desirable_weight: float, undesirable_weight: float) -> str | None:
    """TRL's warning when the training rows are unbalanced and neither weight is in the range eq. 8
    of the KTO paper recommends (``λ_D n_D / (λ_U n_U)`` in [1, 4/3]); None otherwise."""
    n_d = max(sum(1 for r in rows if r.label), 1)
    n_u = max(len(rows) - n_d, 1)
    if n_d == n_u:
        return None
    d_low, d_high = round(n_u * undesirable_weight / n_d, 2), round(n_u * undesirable_weight / n_d * 1.33, 2)
    u_low, u_high = round(n_d * desirable_weight / n_u / 1.33, 2), round(n_d * desirable_weight / n_u, 2)
    if d_low <= desirable_weight <= d_high or u_low <= undesirable_weight <= u_high:
        return None
    return (
        f"train_dataset: {n_d} desirable and {n_u} undesirable rows, and the weights are outside the range the KTO "
        f"paper recommends: set EITHER desirable_weight in [{d_low}, {d_high}] OR undesirable_weight in "
        f"[{u_low}, {u_high}] (not both)"
    )
