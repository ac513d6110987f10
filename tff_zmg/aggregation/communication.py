"""The bytes one client receives and sends in a round, read from the process's types.

A round compiled to TFF's MapReduceForm (`tff.backends.mapreduce`, what the in-process runtime
runs) says exactly what crosses the network: the server's `prepare` computes the value every
client receives, and each client's `work` returns the values the server aggregates (for the
federated aggregate and the secure sums). Their types are static, so

    bytes(type) = sum over its tensors of  prod(shape) * itemsize(dtype)
    broadcast   = bytes(prepare's result)      (the model, and e.g. SCAFFOLD's c)
    upload      = bytes(work's result)         (the update as the aggregator encodes it,
                                                e.g. SCAFFOLD's c_i+ - c_i)

per client and round. What a client keeps (its data, its state between rounds) never
travels and is not counted. The encoded update is measured, not restated: under
`compressed` the work's result holds TF Model Optimization's bit-packed `int32` words (28
bits of each used, so that a word serializes as a 4-byte varint) and each tensor's
`[min, max]`, so a float32 tensor of `n > threshold` elements counts `4 ceil(n b / 28) + 8`
bytes instead of `4 n`: 28 / b times fewer (3.5 at 8 bits), not the 32 / b one might expect.

Each direction is split into `tensor_bytes` (values of rank >= 1: the model, updates,
control variates, prototypes, encoded words) and `scalar_bytes` (rank 0: learning rates and
other client hyperparameters, the round index, update weights, metric sums, counts, clip
norms): FedAvg and FedZMG send the same tensors; their scalars differ by FedZMG's client
hyperparameters (momentum, weight decay), which TFF broadcasts with the model.
"""

import dataclasses
import math

import numpy as np
import tensorflow_federated as tff

from tff_zmg.runtime import forms
from tff_zmg.templates import stateful_clients


@dataclasses.dataclass(frozen=True)
class Traffic:
  """Bytes in one direction, per client and round."""

  tensor_bytes: int  # Values of rank >= 1.
  scalar_bytes: int  # Values of rank 0.

  @property
  def total(self) -> int:
    return self.tensor_bytes + self.scalar_bytes


@dataclasses.dataclass(frozen=True)
class ClientBytes:
  """What one client receives (`broadcast`) and sends (`upload`) in a round."""

  broadcast: Traffic
  upload: Traffic

  def as_dict(self) -> dict[str, int]:
    """Flat columns for a run's summary and metrics table."""
    return {
        'broadcast_bytes_per_client': self.broadcast.total,
        'upload_bytes_per_client': self.upload.total,
        'broadcast_tensor_bytes_per_client': self.broadcast.tensor_bytes,
        'upload_tensor_bytes_per_client': self.upload.tensor_bytes,
    }


def traffic(type_spec: tff.Type) -> Traffic:
  """`sum prod(shape) * itemsize(dtype)` over the tensors of `type_spec`, by rank.

  Raises:
    ValueError: If a tensor's shape is not fully known, or `type_spec` holds something
      other than tensors and structures of them (its bytes would depend on the data).
  """
  tensor_bytes = scalar_bytes = 0
  for leaf in _tensor_types(type_spec):
    if leaf.shape is None or any(d is None for d in leaf.shape):
      raise ValueError(f'{leaf} has a shape not known before the round: its bytes vary')
    size = math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
    if leaf.shape:
      tensor_bytes += size
    else:
      scalar_bytes += size
  return Traffic(tensor_bytes=tensor_bytes, scalar_bytes=scalar_bytes)


def _tensor_types(type_spec: tff.Type):
  if isinstance(type_spec, tff.TensorType):
    yield type_spec
  elif isinstance(type_spec, tff.StructType):
    for _, element in tff.structure.iter_elements(type_spec):
      yield from _tensor_types(element)
  else:
    raise ValueError(f'only tensors and structures have a size in bytes, got {type_spec}')


def round_form(process) -> tff.backends.mapreduce.MapReduceForm:
  """The MapReduceForm of one round of `process` (seconds of TFF's compiler, once per round).

  A stateful-clients process compiles its round with the clients' states in files
  (`next_with_state_files`), the shape MapReduceForm takes; the state files' paths are
  client data, not communication.
  """
  if isinstance(process, stateful_clients.StatefulClientsLearningProcess):
    return forms.map_reduce_form(process.next_with_state_files)
  return forms.map_reduce_form(process.next)


def client_bytes(process) -> ClientBytes:
  """The bytes one client receives and sends per round in `process` (module docstring)."""
  form = round_form(process)
  return ClientBytes(
      broadcast=traffic(form.prepare.type_signature.result),
      upload=traffic(form.work.type_signature.result),
  )
