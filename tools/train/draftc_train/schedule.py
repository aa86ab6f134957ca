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
    given), and a run in its late stage stays there.

    Between re-fits (and before step 30) only an overrun near the end is
    acted on: once less than a quarter of the budget is left, a step count
    that the present stage's pace cannot finish in time is cut at once. A
    run whose steps began with little of its budget left (features
    computed on a busy host) would otherwise pass its deadline before
    step 30: the toy campaign's EAGLE-3 on a 2-core host running three other
    trainings began its steps with about 10 s of its 176 s left, at 4.5 s a
    step, and was killed at its time limit. Until the pace is measured
    (step 11) the last step's time stands for it."""

    def __init__(self, budget, t_start, cap, late_frac, late_cost, eval_batches, every=50):
        self.budget, self.t_start, self.cap = budget, t_start, cap
        self.late_frac, self.late_cost, self.eval_batches, self.every = late_frac, late_cost, eval_batches, every
        self.durs = {False: [], True: []}
        self.last = None
        self.last_dur = None
        self.n = 0

    def pace(self, late):
        d = self.durs[late]
        return sum(d[len(d) // 2 :]) / len(d[len(d) // 2 :]) if d else None

    def after_step(self, step, total, late):
        """Called after each step (`step` steps done, `late`: it was a
        late-stage step); returns the new total, or None to keep it."""
        now = time.time()
        self.n += 1
        if self.last is not None:
            self.last_dur = now - self.last
            if self.n > 10:
                self.durs[late].append(self.last_dur)
        self.last = now
        if self.n < 30 or (self.n - 30) % self.every:
            return self.cut_near_deadline(step, total, late, now)
        early = self.pace(False)
        late_pace = self.pace(True) if len(self.durs[True]) >= 10 else None
        if late_pace is None:
            late_pace = (early or 0.0) * self.late_cost
        if early is None:
            early = late_pace
        left = self.left(now, late_pace)
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

    def left(self, now, late_pace):
        """Seconds left for training steps: the budget's rest less the final
        evaluation's (`eval_batches` batches of about half a step each)."""
        return self.budget - (now - self.t_start) - self.eval_batches * 0.5 * late_pace

    def cut_near_deadline(self, step, total, late, now):
        """Between re-fits: the step count the present stage's pace can
        still finish, when it is below `total` and less than a quarter of
        the budget is left; else None."""
        pace = self.pace(late) or self.last_dur
        if pace is None or self.budget - (now - self.t_start) > 0.25 * self.budget:
            return None
        fit = max(step + 1, int(step + self.left(now, pace) / pace))
        return fit if fit < total else None


def lr_at(step, total, r):
    if step < r["warmup"]:
        return r["lr"] * (step + 1) / r["warmup"]
    p = (step - r["warmup"]) / max(1, total - r["warmup"])
    return 1e-5 + 0.5 * (r["lr"] - 1e-5) * (1 + math.cos(math.pi * min(1.0, p)))
