"""Training schedule: the learning rate at each step (`lr_at`) and the
`--time-budget` pacing that fits a run's step count to its wall time
(`Pacer`). Split out of train.py, which imports both."""

import math
import time


class Pacer:
    """`--time-budget`: fits the run's step count to the wall time left.

    Re-fitted every `every` steps from step 30 on (not once from steps
    10-30, whose pace includes the allocator's and the kernels' warm-up: on
    an H200 that measured 56 ms a step against 26.7 ms later, and the run
    used 128 s of its 225 s). Per stage (the teacher-forced steps and the
    late stage's simulated ones, which cost more), the pace is the mean
    step time over the later half of the steps measured so far, checkpoints
    included; until late steps are measured they are guessed at `late_cost`
    teacher-forced steps. The final evaluation's time (`eval_batches`
    forward batches of the late stage, about half a training step each) is
    kept aside. The step count may grow back up to `cap` (the `--steps`
    given), and a run in its late stage stays there."""

    def __init__(self, budget, t_start, cap, late_frac, late_cost, eval_batches, every=50):
        self.budget, self.t_start, self.cap = budget, t_start, cap
        self.late_frac, self.late_cost, self.eval_batches, self.every = late_frac, late_cost, eval_batches, every
        self.durs = {False: [], True: []}
        self.last = None
        self.n = 0

    def pace(self, late):
        d = self.durs[late]
        return sum(d[len(d) // 2 :]) / len(d[len(d) // 2 :]) if d else None

    def after_step(self, step, total, late):
        """Called after each step (`step` steps done, `late`: it was a
        late-stage step); returns the new total, or None to keep it."""
        now = time.time()
        self.n += 1
        if self.last is not None and self.n > 10:
            self.durs[late].append(now - self.last)
        self.last = now
        if self.n < 30 or (self.n - 30) % self.every:
            return None
        early = self.pace(False)
        late_pace = self.pace(True) if len(self.durs[True]) >= 10 else None
        if late_pace is None:
            late_pace = (early or 0.0) * self.late_cost
        if early is None:
            early = late_pace
        left = self.budget - (now - self.t_start) - self.eval_batches * 0.5 * late_pace
        lf = self.late_frac
        if not lf:
            fit = step + left / early
        elif late:
            # Stay in the late stage: step / total >= 1 - lf (always, at lf = 1).
            fit = step + left / late_pace if lf >= 1.0 else min(step + left / late_pace, step / (1.0 - lf))
        else:
            # The late stage starts at (1 - lf) * total.
            fit = (left + step * early) / ((1.0 - lf) * early + lf * late_pace)
            if (1.0 - lf) * fit < step:
                fit = step + left / late_pace
        fit = min(self.cap, max(step + 1, int(fit)))
        return fit if fit != total else None


def lr_at(step, total, r):
    if step < r["warmup"]:
        return r["lr"] * (step + 1) / r["warmup"]
    p = (step - r["warmup"]) / max(1, total - r["warmup"])
    return 1e-5 + 0.5 * (r["lr"] - 1e-5) * (1 + math.cos(math.pi * min(1.0, p)))
