"""The linear scaling rule with gradual warm-up (Goyal et al. 2017). Pure.

Part of the omru package: `omru.elastic` (``ctx.scale_lr``) and the zoo
worker share it.

Per-GPU batch ``b`` is fixed; on ``W`` ranks the global batch is
``B = b * W`` and the target learning rate is ``base_lr * B / base_batch``.
Momentum and weight decay are never changed.

New job: the lr ramps linearly, per iteration, from ``base_lr`` to the target
over ``warmup_epochs`` epochs, then stays at the target.

After a resize (resume on a different world size) -- our choice: a short
re-warm-up. The lr ramps linearly from the lr in effect when the checkpoint was
taken to the new target over ``max(1, remaining warm-up)`` epochs: one epoch
when the original warm-up is over, otherwise whatever was left of it. A sudden
2x jump (or drop) of the lr right after a resize is what destabilises training
with a large batch; one epoch of ramp is enough to avoid it and costs nothing
when the lr shrinks. Resuming on the same world size continues the saved ramp
unchanged, so a crash-restart is invisible in the lr curve.

Decay (optional, ``decay="cosine"``): the lr above is multiplied by
``0.5 * (1 + cos(pi * progress / total_epochs))``, a function of the job's
progress only, so it is the same whatever the world size and survives resizes
unchanged. ``decay="none"`` (the default) keeps the lr constant after warm-up.

The schedule is a frozen dataclass saved in checkpoints as a dict.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

REWARMUP_EPOCHS = 1.0
DECAYS = ("none", "cosine")


def target_lr(base_lr: float, base_batch: int, batch_size: int, world_size: int) -> float:
    """lr for the global batch ``batch_size * world_size``."""
    return base_lr * batch_size * world_size / base_batch


@dataclass(frozen=True)
class LrSchedule:
    """lr(progress) = linear ramp from ``ramp_from_lr`` at ``ramp_start`` to
    ``target`` at ``ramp_start + ramp_epochs``, constant afterwards.
    ``progress`` is in epochs (fractional within an epoch)."""

    target: float
    world_size: int
    global_batch: int
    ramp_start: float
    ramp_from_lr: float
    ramp_epochs: float
    decay: str = "none"
    total_epochs: int = 1

    def undecayed(self, progress: float) -> float:
        if self.ramp_epochs <= 0 or progress >= self.ramp_start + self.ramp_epochs:
            return self.target
        frac = max(0.0, (progress - self.ramp_start) / self.ramp_epochs)
        return self.ramp_from_lr + (self.target - self.ramp_from_lr) * frac

    def lr(self, progress: float) -> float:
        lr = self.undecayed(progress)
        if self.decay == "cosine":
            lr *= 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress / self.total_epochs)))
        return lr

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "LrSchedule":
        return cls(**data)


def new_job(base_lr: float, base_batch: int, batch_size: int, world_size: int, warmup_epochs: float,
            decay: str = "none", total_epochs: int = 1) -> LrSchedule:
    """Schedule of a job that starts from scratch."""
    return LrSchedule(
        target=target_lr(base_lr, base_batch, batch_size, world_size),
        world_size=world_size,
        global_batch=batch_size * world_size,
        ramp_start=0.0,
        ramp_from_lr=base_lr,
        ramp_epochs=float(warmup_epochs),
        decay=decay,
        total_epochs=total_epochs,
    )


def resumed(saved: LrSchedule, epoch: int, base_lr: float, base_batch: int, batch_size: int, world_size: int) -> LrSchedule:
    """Schedule after resuming at epoch boundary ``epoch`` on ``world_size`` ranks."""
    if world_size == saved.world_size:
        return saved
    current = saved.undecayed(epoch)
    remaining = max(0.0, saved.ramp_start + saved.ramp_epochs - epoch)
    return replace(
        saved,
        target=target_lr(base_lr, base_batch, batch_size, world_size),
        world_size=world_size,
        global_batch=batch_size * world_size,
        ramp_start=float(epoch),
        ramp_from_lr=current,
        ramp_epochs=max(REWARMUP_EPOCHS, remaining),
    )
