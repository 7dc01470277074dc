"""The KTO trainer's metrics over the rows of every process, and TRL's advice on the desirable /
undesirable weights of an unbalanced dataset."""

from __future__ import annotations

import torch

from .. import distributed


def kto_metrics(parts: list, uses_kl: bool) -> dict[str, torch.Tensor]:
    """TRL's KTO metrics of one step (or one evaluation) over every process. ``parts``: one
    ``((losses, rewards, logps, z0), labels)`` per micro-batch pass, ``labels`` the rows that count
    (empty for a stand-in). ``kto/loss`` is the mean over the rows; ``kl`` the mean ``z0`` of the
    passes (each already the whole micro-batch's, the same on every process); ``rewards/*`` and
    ``logps/*`` the means over the desirable (chosen) and undesirable (rejected) rows, each absent
    when no such row was scored."""
    values = []  # per pass: rows, loss sum, desirable and undesirable rows, their reward sums, their logp sums
    for (losses, rewards, logps, _), labels in parts:
        n = len(labels)
        if not n:
            continue
        chosen = torch.tensor(labels, dtype=torch.bool, device=losses.device)
        per_row = torch.stack([losses.detach()[:n], rewards[:n], logps[:n]]).double()
        values.append(
            torch.stack(
                [
                    torch.tensor(float(n), dtype=torch.float64, device=losses.device),
                    per_row[0].sum(),
                    chosen.double().sum(),
                    (~chosen).double().sum(),
                    per_row[1][chosen].sum(),
                    per_row[1][~chosen].sum(),
                    per_row[2][chosen].sum(),
                    per_row[2][~chosen].sum(),
                ]
            )
        )
    totals = torch.stack(values).sum(0).tolist() if values else [0.0] * 8  # one device synchronisation
    rows, loss, n_c, n_r, rc, rr, lc, lr = distributed.sum_floats(totals)
    metrics = {"kto/loss": torch.tensor(loss / max(rows, 1.0))}
    if uses_kl:
        metrics["kl"] = torch.stack([p[0][3].detach().double().cpu() for p in parts]).mean()
    if n_c:
        metrics["rewards/chosen"], metrics["logps/chosen"] = torch.tensor(rc / n_c), torch.tensor(lc / n_c)
    if n_r:
        metrics["rewards/rejected"], metrics["logps/rejected"] = torch.tensor(rr / n_r), torch.tensor(lr / n_r)
    if n_c and n_r:
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
