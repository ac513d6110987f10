"""A round's client work on TFF workers of other machines, the rest in this process.

TFF's mergeable context splits a round at its aggregation and merges SERVER-placed
results, so it cannot return what the clients of a stateful algorithm keep (their new
states are CLIENTS-placed). Here the training process evaluates the round itself
(`interpreter.FederatedInterpreter`) and sends only the clients' work away: each
`federated_map` of a compiled computation over the round's clients is cut into one
contiguous slice per worker, every worker runs `federated_map(work, its slice)` through
TFF's executor service (the states go in with the data and come back with the update),
and the results are put back in client order. Everything aggregated is aggregated here,
in client order, so the result does not depend on which worker ran whom; it equals the
one-process run.

A worker that stops answering fails the round with `cpp_worker.WorkerUnavailableError`
(the training program's exit 4, resumable): nothing of the round is kept, so no client's
state is ever half-written.
"""

import concurrent.futures
import threading
from typing import Any, Sequence

import grpc
import tensorflow_federated as tff

from tff_zmg.runtime import cpp_worker
from tff_zmg.runtime import federated_values


def slices(count: int, num_workers: int) -> list[range]:
  """Contiguous client ranges, one per worker, their sizes differing by at most one."""
  base, extra = divmod(count, num_workers)
  bounds = [0]
  for w in range(num_workers):
    bounds.append(bounds[-1] + base + (w < extra))
  return [range(bounds[w], bounds[w + 1]) for w in range(num_workers)]


class RemoteClientWork:
  """Runs compiled client computations over slices of clients on TFF workers.

  Args:
    workers: Connected `cpp_worker.RemoteWorker`s (or `LocalWorker`s); their lives are
      the caller's.
  """

  def __init__(self, workers: Sequence[Any]):
    if not workers:
      raise ValueError('no workers given')
    self.workers = list(workers)
    self._contexts = [cpp_worker.create_sync_context([w]) for w in self.workers]
    self._mapped: dict[int, tuple[Any, Any]] = {}
    self._lock = threading.Lock()
    self.last_client_workers: list[int] = []

  def _mapped_computation(self, block) -> Any:
    """`federated_map(block, {P}@CLIENTS)`, made once per compiled block."""
    with self._lock:
      cached = self._mapped.get(id(block))
      if cached is None or cached[0] is not block:
        work = tff.framework.ConcreteComputation.from_building_block(block)

        @tff.federated_computation(
            tff.FederatedType(block.type_signature.parameter, tff.CLIENTS))
        def mapped(values):
          return tff.federated_map(work, values)

        cached = (block, mapped)
        self._mapped[id(block)] = cached
      return cached[1]

  def map(self, block, members: Sequence[Any]) -> list:
    """[block(m) for m in members], slice w of the clients on worker w, in client order.

    Raises:
      cpp_worker.WorkerUnavailableError: a worker stopped answering (names it).
    """
    mapped = self._mapped_computation(block)
    parameter, result = block.type_signature.parameter, block.type_signature.result
    parts = [s for s in slices(len(members), len(self.workers))]

    def run(w):
      if not parts[w]:
        return []
      arg = [federated_values.export(members[i], parameter) for i in parts[w]]
      outputs = self._contexts[w].invoke(mapped, arg)
      return [federated_values.ingest(o, result) for o in outputs]

    with concurrent.futures.ThreadPoolExecutor(len(self.workers)) as pool:
      futures = [pool.submit(run, w) for w in range(len(self.workers))]
      try:
        results = [f.result() for f in futures]
      except grpc.RpcError as e:
        lost = [w.address for w in self.workers
                if hasattr(w, 'wait_ready') and not w.wait_ready(w.connect_timeout_s)]
        if not lost:
          raise
        raise cpp_worker.WorkerUnavailableError(
            lost, f'the TFF worker{"s" if len(lost) > 1 else ""} at {", ".join(lost)}'
            f' stopped answering ({e.code().name if isinstance(e, grpc.Call) else e})',
        ) from e
    self.last_client_workers = [w for w, part in enumerate(parts) for _ in part]
    return [r for part in results for r in part]
