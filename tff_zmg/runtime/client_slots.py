"""Clients spread over devices and run a few at a time per device, results in client order.

Client i belongs to device i % len(devices) (a fixed placement); each device has
`clients_per_device` slots (a thread each), and a device's free slot takes its next waiting
client, so that one large client does not leave the device's other slots idle behind a fixed
share (clients' sizes vary tenfold in the papers' federations). Results come back in client
order whichever slot ran a client, so what is computed from them does not depend on timing.
A thread running a client knows its slot and device (`current`), so that each slot uses its
own import of a graph (two threads must not share one's variables).

A caller may ask for a check between clients (`between_clients`): a run's stop, honoured
before the next client's result is taken. If it raises, the clients not yet started are
dropped, those running end, and the caller gets the exception: the round is abandoned,
and nothing of it was returned.
"""

import collections
import concurrent.futures
import contextlib
import contextvars
import threading
from typing import Any, Callable, Iterator, Sequence

# The check `between_clients` installs for the calls made inside it (None: no check).
_CHECK = contextvars.ContextVar('tff_zmg_between_clients', default=None)


@contextlib.contextmanager
def between_clients(check: Callable[[], None]):
  """Inside, every `ClientSlots.imap` (and `map`) calls `check` in the calling thread
  before each client's result is taken; what it raises abandons the call."""
  token = _CHECK.set(check)
  try:
    yield
  finally:
    _CHECK.reset(token)


class ClientSlots:
  """The slots of some devices (see the module docstring)."""

  def __init__(self, devices: Sequence[str], clients_per_device: int):
    self.devices = list(devices)
    self.slots = clients_per_device * len(self.devices)
    self._local = threading.local()

  @property
  def current(self) -> tuple[int, str]:
    """(slot, device) of the calling thread; the server's (-1, first device) elsewhere."""
    return getattr(self._local, 'slot', -1), getattr(self._local, 'device', self.devices[0])

  def map(self, fn: Callable[[Any], Any], members: Sequence[Any]) -> list:
    """[fn(m) for m in members], client i on devices[i % n]."""
    return list(self.imap(fn, members))

  def imap(self, fn: Callable[[Any], Any], members: Sequence[Any]) -> Iterator[Any]:
    """fn(m) for each member, yielded in client order as soon as each is ready."""
    num_devices = len(self.devices)
    slots = min(self.slots, len(members))
    check = _CHECK.get() or (lambda: None)
    if slots <= 1:
      self._local.slot, self._local.device = 0, self.devices[0]
      try:
        for member in members:
          check()
          yield fn(member)
      finally:
        del self._local.slot, self._local.device
      return
    futures = [concurrent.futures.Future() for _ in members]
    waiting = [collections.deque(range(d, len(members), num_devices))
               for d in range(num_devices)]

    def run_slot(slot):
      self._local.slot, self._local.device = slot, self.devices[slot % num_devices]
      queue = waiting[slot % num_devices]
      while True:
        try:
          i = queue.popleft()  # Atomic: each client is taken by one slot.
        except IndexError:
          return
        try:
          futures[i].set_result(fn(members[i]))
        except BaseException as e:  # pylint: disable=broad-except
          futures[i].set_exception(e)

    threads = [threading.Thread(target=run_slot, args=(s,), daemon=True,
                                name=f'tff_zmg-client-slot-{s}') for s in range(slots)]
    for thread in threads:
      thread.start()
    try:
      for future in futures:
        check()
        yield future.result()
    finally:
      for queue in waiting:  # An abandoned call starts no other client.
        queue.clear()
      for thread in threads:
        thread.join()
