"""Input checks shared by the algorithm core: clear ``ValueError``s that name the argument and
the shapes seen, raised before any arithmetic, so a caller never gets a broadcasting error from
deep inside torch."""

from __future__ import annotations

import torch

_MASK_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def check_tensor(name: str, x, ndim: int | None = None) -> torch.Tensor:
    """Refuse anything but a tensor (of ``ndim`` dimensions when given)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(x.shape)}")
    return x


def check_same_shape(**tensors: torch.Tensor) -> None:
    """All named tensors share one shape; the message lists every name with its shape."""
    items = list(tensors.items())
    for name, x in items:
        check_tensor(name, x)
    shapes = {tuple(x.shape) for _, x in items}
    if len(shapes) > 1:
        seen = ", ".join(f"{n}={tuple(x.shape)}" for n, x in items)
        raise ValueError(f"shape mismatch: expected equal shapes, got {seen}")


def check_mask(mask: torch.Tensor, shape: tuple[int, ...], name: str = "response_mask") -> torch.Tensor:
    """A 0/1 mask of ``shape``; bool or a float/integer dtype. Returns it as a bool tensor.

    Values are not inspected (that would synchronise a GPU); a float mask is read as ``mask != 0``.
    """
    check_tensor(name, mask)
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    if mask.dtype in _MASK_DTYPES:
        return mask.bool()
    if mask.dtype.is_floating_point:
        return mask != 0
    raise ValueError(f"{name} must be bool, integer or float 0/1 values, got dtype {mask.dtype}")


def check_nonempty_rows(mask: torch.Tensor, name: str = "response_mask") -> None:
    """Every row holds at least one response token (needed where a row's last token is used)."""
    empty = (~mask.bool()).all(dim=-1)
    if bool(empty.any()):
        rows = empty.nonzero().flatten().tolist()
        raise ValueError(f"{name} has rows without any response token: rows {rows[:10]} of shape {tuple(mask.shape)}")


def check_groups(n: int, group_size: int, name: str = "scores") -> int:
    """``group_size`` ≥ 2 divides the batch of ``n`` rows; returns the number of groups."""
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2:
        raise ValueError(f"group_size must be an int >= 2 (a baseline needs other samples), got {group_size!r}")
    if n % group_size != 0:
        raise ValueError(
            f"group_size={group_size} does not divide the batch: {name} has {n} rows "
            f"(rows g*G .. g*G+G-1 must share prompt g)"
        )
    return n // group_size


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Σ x over mask; masked positions never contribute, even when they hold NaN or inf."""
    x = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x.sum() if dim is None else x.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean of x over mask; 0 where the mask is empty (never NaN)."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = False) -> torch.Tensor:
    """Variance of x over mask (``unbiased``: Bessel's n - 1); 0 where fewer values than needed."""
    centred = torch.where(mask, x - masked_mean(x, mask), torch.zeros((), dtype=x.dtype, device=x.device))
    count = mask.sum() - int(unbiased)
    return centred.square().sum() / count.clamp(min=1).to(x.dtype)
