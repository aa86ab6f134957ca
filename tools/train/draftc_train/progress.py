"""A tiny progress reporter for long loops (data generation, training).

    p = Progress(total_steps, "train", unit="step")
    for step in ...:
        ...
        p.update(1, loss=loss, lr=lr)       # extra fields are printed as key=value
    p.close()

Prints to stderr at most every ``interval`` seconds (default 2): one line
rewritten with ``\\r`` when stderr is a TTY, plain lines otherwise (logs).
A line shows done/total, percent, the rate over the whole run and over the
recent window, the ETA from the recent rate, and the last fields given.
"""

from __future__ import annotations

import sys
import time


def fmt_duration(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "?"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _fmt_value(v) -> str:
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3e}"
        return f"{v:.4g}"
    return str(v)


class Progress:
    def __init__(self, total: int | None, desc: str = "", unit: str = "it",
                 interval: float = 2.0, stream=None, initial: int = 0):
        self.total = total
        self.desc = desc
        self.unit = unit
        self.interval = interval
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.n = initial
        self.start_n = initial
        self.t0 = time.monotonic()
        self.last_print = 0.0
        self.fields: dict = {}
        # recent window for the ETA: (time, n) samples
        self._window: list[tuple[float, int]] = [(self.t0, initial)]
        self._closed = False
        self._line_len = 0
        self._printed_n: int | None = None

    def update(self, n: int = 1, **fields) -> None:
        self.n += n
        if fields:
            self.fields.update(fields)
        now = time.monotonic()
        if now - self.last_print >= self.interval:
            self._window.append((now, self.n))
            while len(self._window) > 2 and now - self._window[0][0] > 60.0:
                self._window.pop(0)
            self._emit(now)

    def set(self, **fields) -> None:
        """Updates the fields without advancing."""
        self.fields.update(fields)

    def rate(self) -> float:
        dt = time.monotonic() - self.t0
        return (self.n - self.start_n) / dt if dt > 0 else 0.0

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        elapsed = now - self.t0
        done = self.n - self.start_n
        rate = done / elapsed if elapsed > 0 else 0.0
        (t_old, n_old) = self._window[0]
        recent = (self.n - n_old) / (now - t_old) if now - t_old > 0 else rate
        parts = [self.desc] if self.desc else []
        if self.total:
            parts.append(f"{self.n}/{self.total} {self.unit} ({100.0 * self.n / self.total:.1f}%)")
        else:
            parts.append(f"{self.n} {self.unit}")
        parts.append(f"{rate:.3g} {self.unit}/s")
        if self.total:
            left = self.total - self.n
            r = recent if recent > 0 else rate
            eta = left / r if r > 0 else float("inf")
            parts.append(f"elapsed {fmt_duration(elapsed)} ETA {fmt_duration(eta)}")
        else:
            parts.append(f"elapsed {fmt_duration(elapsed)}")
        parts.extend(f"{k}={_fmt_value(v)}" for k, v in self.fields.items())
        return " | ".join(parts)

    def _emit(self, now: float, final: bool = False) -> None:
        self.last_print = now
        self._printed_n = self.n
        text = self.line(now)
        if self.tty:
            pad = max(0, self._line_len - len(text))
            self.stream.write("\r" + text + " " * pad + ("\n" if final else ""))
            self._line_len = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.tty or self.n != self._printed_n:
            self._emit(time.monotonic(), final=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
