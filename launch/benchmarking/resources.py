"""Measuring what a run costs: peak resident memory of a process and its TFF workers."""

import threading
import time

import psutil


class PeakMemorySampler:
  """Samples the resident memory of this process plus its children (TFF's worker).

  A background thread reads it every `interval_s`; `stop()` returns the peak in bytes.
  Sampling misses spikes shorter than the interval; at 50 ms that is well below a
  round's length.
  """

  def __init__(self, interval_s: float = 0.05):
    self._process = psutil.Process()
    self._interval_s = interval_s
    self.peak = 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def rss(self) -> int:
    """Resident bytes of this process and all its live descendants now."""
    total = self._process.memory_info().rss
    for child in self._process.children(recursive=True):
      try:
        total += child.memory_info().rss
      except psutil.Error:
        pass  # A child that just ended.
    return total

  def _run(self):
    while not self._stop.is_set():
      self.peak = max(self.peak, self.rss())
      time.sleep(self._interval_s)

  def stop(self) -> int:
    self._stop.set()
    self._thread.join()
    return max(self.peak, self.rss())
