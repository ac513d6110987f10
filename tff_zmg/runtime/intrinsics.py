"""TFF's intrinsics as `interpreter.FederatedInterpreter` evaluates them.

Each entry of `INTRINSICS` takes (the interpreter, the intrinsic's type) and returns the
function the intrinsic is, on `federated_values`' values: client work through the
interpreter's `map_clients` (placed on the devices' slots), server work through its
`on_server` (the first device), aggregations in client order.
"""

import tensorflow as tf
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.types import placements
from tensorflow_federated.python.core.impl.utils import tensorflow_utils

from tff_zmg.runtime import federated_values


# The intrinsics: each takes (interpreter, its type) and returns the function it is.


def _federated_map(interp, type_signature):
  del type_signature

  def apply(arg):
    fn, value = arg[0], arg[1]
    if value.placement == placements.SERVER.uri:
      return interp.server(interp.on_server(lambda: fn(value.members[0])))
    if value.all_equal:
      return interp.at_clients(interp.map_clients(fn, value.members), all_equal=True)
    return interp.at_clients(interp.map_clients(fn, value.members))

  return apply


def _federated_apply(interp, type_signature):
  del type_signature
  return lambda arg: interp.server(interp.on_server(lambda: arg[0](arg[1].members[0])))


def _federated_broadcast(interp, type_signature):
  del type_signature
  return lambda value: interp.at_clients([value.members[0]], all_equal=True)


def _federated_value_at(placement):
  def intrinsic(interp, type_signature):
    del type_signature
    return lambda value: federated_values.Placed(placement, [value], True)
  return intrinsic


def _federated_eval_at_server(interp, type_signature):
  del type_signature
  return lambda fn: interp.server(interp.on_server(fn))


def _federated_eval_at_clients(interp, type_signature):
  # Without a CLIENTS argument the number of clients is not known: evaluated once, the
  # value every client computes (TFF's workers, too, need a cardinality to do more).
  return lambda fn: interp.at_clients(
      interp.map_clients(lambda _: fn(), [None]), all_equal=type_signature.result.all_equal
  )


def _federated_zip(placement):
  def intrinsic(interp, type_signature):
    del type_signature

    def zip_values(struct):
      names = [name for name, _ in structure.iter_elements(struct)]
      values = [value for _, value in structure.iter_elements(struct)]
      if placement == placements.SERVER.uri:
        return interp.server(structure.Struct(
            [(n, v.members[0]) for n, v in zip(names, values)]))
      if all(v.all_equal for v in values):
        return interp.at_clients(
            [structure.Struct([(n, v.members[0]) for n, v in zip(names, values)])],
            all_equal=True)
      members = zip(*(interp.members(v) for v in values))
      return interp.at_clients(
          [structure.Struct(list(zip(names, client))) for client in members])
    return zip_values
  return intrinsic


def _federated_sum(interp, type_signature):
  del type_signature
  return lambda value: interp.server(
      interp.on_server(lambda: federated_values.sum_in_order(interp.members(value))))


def _federated_mean(interp, type_signature):
  del type_signature
  return lambda value: interp.server(
      interp.on_server(lambda: federated_values.mean_in_order(interp.members(value))))


def _federated_weighted_mean(interp, type_signature):
  del type_signature

  def weighted_mean(arg):
    values, weights = interp.members(arg[0]), interp.members(arg[1])
    return interp.server(interp.on_server(lambda: federated_values.mean_in_order(values, weights)))
  return weighted_mean


def _federated_extremum(reduce):
  def intrinsic(interp, type_signature):
    del type_signature

    def extremum(value):
      members = interp.members(value)

      def compute():
        result = members[0]
        for member in members[1:]:
          result = federated_values.map_leaves(reduce, result, member)
        return result
      return interp.server(interp.on_server(compute))
    return extremum
  return intrinsic


def _federated_aggregate(interp, type_signature):
  del type_signature

  def aggregate(arg):
    value, zero, accumulate, _, report = (arg[i] for i in range(5))

    def compute():
      accumulator = zero
      for member in interp.members(value):
        accumulator = accumulate(structure.Struct([(None, accumulator), (None, member)]))
      return report(accumulator)
    return interp.server(interp.on_server(compute))
  return aggregate


def _federated_select(interp, type_signature):
  element_type = type_signature.result.member.element

  def select(arg):
    keys, _, server_value, select_fn = (arg[i] for i in range(4))
    value = server_value.members[0]

    def for_client(client_keys):
      elements = [select_fn(structure.Struct([(None, value), (None, key)]))
                  for key in tf.unstack(tf.convert_to_tensor(client_keys))]
      return tensorflow_utils.make_data_set_from_elements(
          None, [federated_values.export(e, element_type) for e in elements], element_type)
    return interp.at_clients([for_client(k) for k in keys.members], keys.all_equal)
  return select


def _sequence_map(interp, type_signature):
  parameter = type_signature.parameter
  element_type, result_type = parameter[1].element, type_signature.result.element

  def sequence_map(arg):
    fn, dataset = arg[0], arg[1]
    results = [federated_values.export(fn(e), result_type)
               for e in federated_values.iterate(dataset, element_type)]
    return tensorflow_utils.make_data_set_from_elements(None, results, result_type)
  return sequence_map


def _sequence_reduce(interp, type_signature):
  element_type = type_signature.parameter[0].element

  def sequence_reduce(arg):
    dataset, zero, op = arg[0], arg[1], arg[2]
    accumulator = zero
    for element in federated_values.iterate(dataset, element_type):
      accumulator = op(structure.Struct([(None, accumulator), (None, element)]))
    return accumulator
  return sequence_reduce


def _sequence_sum(interp, type_signature):
  element_type = type_signature.parameter.element

  def sequence_sum(dataset):
    elements = list(federated_values.iterate(dataset, element_type))
    if not elements:
      return federated_values.generic_zero(element_type)
    return federated_values.sum_in_order(elements)
  return sequence_sum


def _generic_binary(op):
  def intrinsic(interp, type_signature):
    del interp, type_signature
    return lambda arg: federated_values.map_leaves(op, arg[0], arg[1])
  return intrinsic


def _generic_zero_intrinsic(interp, type_signature):
  del interp
  return lambda: federated_values.generic_zero(type_signature)


INTRINSICS = {
    'federated_aggregate': _federated_aggregate,
    'federated_apply': _federated_apply,
    'federated_broadcast': _federated_broadcast,
    'federated_eval_at_clients': _federated_eval_at_clients,
    'federated_eval_at_server': _federated_eval_at_server,
    'federated_map': _federated_map,
    'federated_map_all_equal': _federated_map,
    'federated_max': _federated_extremum(tf.maximum),
    'federated_mean': _federated_mean,
    'federated_min': _federated_extremum(tf.minimum),
    'federated_select': _federated_select,
    'federated_sum': _federated_sum,
    'federated_value_at_clients': _federated_value_at(placements.CLIENTS.uri),
    'federated_value_at_server': _federated_value_at(placements.SERVER.uri),
    'federated_weighted_mean': _federated_weighted_mean,
    'federated_zip_at_clients': _federated_zip(placements.CLIENTS.uri),
    'federated_zip_at_server': _federated_zip(placements.SERVER.uri),
    'generic_divide': _generic_binary(tf.divide),
    'generic_multiply': _generic_binary(tf.multiply),
    'generic_plus': _generic_binary(tf.add),
    'generic_zero': _generic_zero_intrinsic,
    'sequence_map': _sequence_map,
    'sequence_reduce': _sequence_reduce,
    'sequence_sum': _sequence_sum,
}
