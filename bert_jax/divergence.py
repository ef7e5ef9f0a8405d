"""Divergence: which steps went wrong, and which checkpoints a run can continue from.

A checkpoint is judged by the loss its parameters give. The parameters saved at step N are first used by step N+1:
when that step is healthy, checkpoint N is *verified*; when it diverges, checkpoint N is set aside as `N.diverged`
(kept, never deleted) and the run names the newest verified checkpoint. A step diverges when its loss, gradient
norm or new parameters are not finite, or when its loss spikes: more than `train.spike_factor` times the median of
the previous `train.spike_window` healthy losses (checked once that many are known; a factor of 0 turns it off).

What a run knows about its own health travels in every checkpoint (the `health` item), so a resumed run judges
spikes against the same history and keeps the same verified checkpoints as the uninterrupted one would.
"""

import dataclasses
import math
import statistics


class DivergenceError(RuntimeError):
    """A training step diverged (non-finite values or a loss spike); the message names the checkpoint to resume."""


class Diverged(Exception):
    """Raised by Monitor.check at the first step that diverged; the job decides what follows (pretraining rewinds
    or stops with a DivergenceError, fine-tuning stops)."""

    def __init__(self, step: int, problem: str):
        super().__init__(f"step {step} {problem}")
        self.step = step
        self.problem = problem


@dataclasses.dataclass
class Health:
    """The part of a run's state that judges its steps, saved with each checkpoint as JSON.

    losses: the most recent healthy losses (oldest first), at most the spike window's length.
    verified: steps of checkpoints whose parameters gave a healthy next step.
    rewinds: the rewinds this run's lineage went through, oldest first: {"step": the checkpoint resumed from,
        "skip_batches": batches of input skipped after it, "automatic": whether the run did it on divergence}.
    """
    losses: list[float] = dataclasses.field(default_factory=list)
    verified: list[int] = dataclasses.field(default_factory=list)
    rewinds: list[dict] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, value: dict | None) -> "Health":
        value = value or {}
        return cls(losses=[float(x) for x in value.get("losses", [])],
                   verified=sorted(int(x) for x in value.get("verified", [])),
                   rewinds=[dict(x) for x in value.get("rewinds", [])])

    def automatic_rewinds(self) -> int:
        return sum(1 for rewind in self.rewinds if rewind.get("automatic"))

    def has_rewind(self, step: int, skip_batches: int) -> bool:
        """True when this lineage already went back to checkpoint `step` skipping `skip_batches` on request."""
        return any(rewind == {"step": step, "skip_batches": skip_batches, "automatic": False}
                   for rewind in self.rewinds)


def validate_config(train) -> None:
    """Errors naming the field: the spike detector's settings."""
    if not (train.spike_factor == 0 or train.spike_factor > 1):
        raise ValueError(f"--config.train.spike_factor={train.spike_factor}: must be above 1 (a loss that "
                         "many times the recent median is a spike), or 0 to detect non-finite values only")
    if train.spike_window < 1:
        raise ValueError(f"--config.train.spike_window={train.spike_window}: must be at least 1 (steps of "
                         "loss history a spike is judged against)")


class Monitor:
    """Judges each step from its host metrics, in step order, and keeps the health record up to date."""

    def __init__(self, spike_factor: float, spike_window: int, health: Health | None = None):
        self.spike_factor = spike_factor
        self.spike_window = spike_window
        self.health = health or Health()
        del self.health.losses[:-spike_window]

    def problem(self, metrics: dict[str, float]) -> str | None:
        """None for a healthy step (its loss joins the history); else what went wrong, in words.

        `metrics` holds the step's loss and, when the step updated parameters, grad_norm and params_finite (1.0 when
        every new parameter is finite).
        """
        loss = metrics["loss"]
        checks = [("loss", math.isfinite(loss))]
        detail = f"loss {loss:.6g}"
        if "grad_norm" in metrics:
            checks.append(("gradient norm", math.isfinite(metrics["grad_norm"])))
            detail += f", gradient norm {metrics['grad_norm']:.6g}"
        if "params_finite" in metrics:
            checks.append(("parameters", metrics["params_finite"] == 1.0))
        bad = [name for name, ok in checks if not ok]
        if bad:
            return f"went non-finite ({', '.join(bad)}; {detail})"
        losses = self.health.losses
        if self.spike_factor and len(losses) >= self.spike_window:
            median = statistics.median(losses)
            if loss > self.spike_factor * median:
                return (f"spiked: loss {loss:.6g} is {loss / median:.3g} times the median {median:.6g} of the "
                        f"previous {len(losses)} steps (train.spike_factor={self.spike_factor:g})")
        losses.append(loss)
        del losses[:-self.spike_window]
        return None

    def check(self, step: int, metrics: dict[str, float]) -> None:
        """Raises Diverged when step `step` (with these host `metrics`, see `problem`) diverged."""
        problem = self.problem(metrics)
        if problem:
            raise Diverged(step, problem)

    def verify(self, step: int) -> None:
        """Checkpoint `step` (if one was saved) gave a healthy next step."""
        if step not in self.health.verified:
            self.health.verified.append(step)
            self.health.verified.sort()

    def newest_verified(self, existing: list[int]) -> int | None:
        candidates = [step for step in self.health.verified if step in existing]
        return max(candidates) if candidates else None

    def record(self, existing: list[int]) -> dict:
        """The health to save with a checkpoint: verified steps still on disk only, so the record stays small."""
        return dataclasses.replace(self.health, losses=list(self.health.losses),
                                   verified=[step for step in self.health.verified if step in existing]).to_json()
