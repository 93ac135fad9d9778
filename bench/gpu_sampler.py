"""SM clock and board power read beside a measurement: nvidia-smi samples every 50 ms in the
background, each stamped with time.time() on arrival; window(t0, t1) gives the medians of the
samples that fell inside an interval. The H100/H200 run attention at their power cap, so a
timing means more with the clock it ran at (docs/perf-notes.md, "Clock and power").
No nvidia-smi, or any failure: window() gives (None, None) and the measurement goes on."""

from __future__ import annotations

import statistics
import subprocess
import threading
import time


class GpuSampler:
    def __init__(self, device=0, period_ms: int = 50, command=None):
        self.samples: list[tuple[float, float, float]] = []  # (time, clock MHz, power W)
        self._lock = threading.Lock()
        self._proc = None
        cmd = command or ["nvidia-smi", "-i", str(device), "--query-gpu=clocks.sm,power.draw",
                          "--format=csv,noheader,nounits", "-lms", str(period_ms)]
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except (OSError, ValueError):
            return
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                clock, power = float(parts[0]), float(parts[1])
            except (IndexError, ValueError):
                continue
            with self._lock:
                self.samples.append((time.time(), clock, power))

    def window(self, t0: float, t1: float):
        """Median SM clock (MHz) and power (W) of the samples taken between t0 and t1."""
        with self._lock:
            inside = [(c, p) for t, c, p in self.samples if t0 <= t <= t1]
        if not inside:
            return None, None
        return statistics.median(c for c, _ in inside), statistics.median(p for _, p in inside)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _self_test() -> int:
    """The sampler on a stand-in for nvidia-smi (CI machines have no GPU): samples inside a window
    give their medians, an empty window and a missing command give (None, None)."""
    import sys
    fake = [sys.executable, "-c",
            "import time\nfor i in range(30):\n    print(f'{1500 + i}, {600 + i}', flush=True)\n    time.sleep(0.03)"]
    with GpuSampler(command=fake) as s:
        time.sleep(0.2)
        t0 = time.time()
        time.sleep(0.4)
        t1 = time.time()
        clock, power = s.window(t0, t1)
        ok = clock is not None and 1500 < clock < 1530 and power - clock == -900
        ok = ok and s.window(t1 + 100, t1 + 200) == (None, None)
    with GpuSampler(command=["/nonexistent/nvidia-smi"]) as s:
        ok = ok and s.window(0, time.time()) == (None, None)
    print("gpu_sampler self-test:", "ok" if ok else f"FAILED (window {clock}, {power})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(_self_test())
