"""Device placement of the in-process runtime, on the devices a CPU machine can offer.

* `tf_computation.place_nodes` on a traced `tf.function`'s GraphDef: tf.data stays on
  the host, the model goes to the target device.
* Two logical CPU devices stand in for two GPUs: TFF's FedAvg (DATASET_ITERATOR loop, the
  GPU loop) runs its clients on both, counted from TensorFlow's run metadata, and the
  weights equal the one-device run.
* XLA_CPU stands in for an accelerator without tf.data kernels: the model runs there,
  iterators stay on the host.
* `python -m launch.check_devices` on this machine.

Logical devices and XLA devices must be configured before TensorFlow initializes its
runtime, which the test process has long done, so those checks run in a fresh Python each
(one script, `_SCRIPT`, run in two modes). The run metadata's `step_stats` stay empty for
eager function calls; what TensorFlow records is, per function it instantiates (once per
device slot, at its first call), the partition graphs it executes on each device
(`RunMetadata.function_graphs[i].partition_graphs`): the counts below are nodes of those.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import psutil
import pytest
import tensorflow as tf

from tff_zmg.runtime import gpu_diagnosis
from tff_zmg.runtime import tf_computation
import worker_processes

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TIMEOUT_S = 300
# XLA compiles the model ops into clusters of its own kernels, whose float sums may be
# ordered differently from TensorFlow's CPU (oneDNN) kernels.
_XLA_TOLERANCE = 1e-5
_MODEL_OP = re.compile(r'MatMul|Conv2D|BiasAdd|Softmax')
_ITERATOR_OP = re.compile(r'Iterator|^Optional')

_SCRIPT = textwrap.dedent(r'''
    import collections, glob, json, os, re, sys
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    import numpy as np
    import tensorflow as tf

    mode, dump_dir = sys.argv[1], sys.argv[2]
    if mode == 'two_cpus':
      cpu = tf.config.list_physical_devices('CPU')[0]
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
      devices = ['/device:CPU:0', '/device:CPU:1']
    else:
      devices = ['/device:XLA_CPU:0']
    logical = [d.name for d in tf.config.list_logical_devices()]
    if mode == 'xla_cpu' and not tf.config.list_logical_devices('XLA_CPU'):
      print('RESULT ' + json.dumps(dict(skip=f'TensorFlow offers no XLA_CPU device: {logical}')))
      sys.exit(0)

    import tensorflow_federated as tff
    from tensorflow.python.eager import context as eager_context
    from tff_zmg.runtime import in_process

    def model_fn():
      keras_model = tf.keras.Sequential([
          tf.keras.layers.InputLayer(input_shape=(4,)),
          tf.keras.layers.Dense(
              3, kernel_initializer=tf.keras.initializers.GlorotUniform(1)),
      ])
      return tff.learning.models.from_keras_model(
          keras_model,
          loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
          input_spec=collections.OrderedDict(
              x=tf.TensorSpec((None, 4), tf.float32), y=tf.TensorSpec([None], tf.int32)))

    def client_data(i):
      rng = np.random.default_rng(i)
      return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
          x=rng.normal(size=(4, 4)).astype(np.float32),
          y=rng.integers(0, 3, size=4).astype(np.int32))).batch(2)

    process = tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
        loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR)
    data = [client_data(i) for i in range(4)]
    with in_process.in_process_context():
      initial = process.initialize()

    # 'round': FedAvg's rounds (MapReduceForm); 'client_work': a client work's `next`, whose
    # results are at CLIENTS (the interpreter).
    client_work = tff.learning.templates.build_model_delta_client_work(
        model_fn, tff.learning.optimizers.build_sgdm(0.1),
        tff.learning.ClientWeighting.NUM_EXAMPLES,
        loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR)

    def two_rounds(devices, shape):
      # One client at a time per device: one import of the client graph per device.
      with in_process.in_process_context(devices, clients_per_device=1) as context:
        if shape == 'round':
          state = initial
          for _ in range(2):
            state = process.next(state, data).state
          weights = process.get_model_weights(state).trainable
        else:
          start = process.get_model_weights(initial)
          results = client_work.next(client_work.initialize(), [start] * 4, data).result
          weights = [u for r in results for u in r.update]
      return [w.tolist() for w in weights], context.last_client_devices

    def run(shape):
      # Exporting the run metadata clears it: each shape counts only its own functions,
      # all instantiated at their first call here (the shapes' computations are distinct).
      tf_context = eager_context.context()
      tf_context.enable_run_metadata()
      weights, client_devices = two_rounds(devices, shape)
      metadata = tf_context.export_run_metadata()
      tf_context.disable_run_metadata()
      host_weights, _ = two_rounds(['/device:CPU:0'], shape)

      # Per device, op -> nodes in the partition graphs of every function the rounds ran.
      # Summed over all functions: slots instantiating at once (threads) may share one
      # `function_graphs` entry.
      ops = collections.defaultdict(collections.Counter)
      clusters = collections.defaultdict(list)
      for function_graph in metadata.function_graphs:
        for graph in function_graph.partition_graphs:
          for node in graph.node:
            device = '/device:' + node.device.split('/device:')[-1]
            ops[device][node.op] += 1
            if node.op == '_XlaCompile':
              clusters[device].append(node.attr['function'].func.name)

      # What each XLA cluster holds, from TensorFlow's clustering dump
      # (`mark_for_compilation`).
      cluster_ops = collections.defaultdict(collections.Counter)
      for path in glob.glob(os.path.join(dump_dir, 'mark_for_compilation_annotated*.pbtxt')):
        from google.protobuf import text_format
        graph = text_format.Parse(open(path).read(), tf.compat.v1.GraphDef())
        for node in graph.node:
          if '_XlaCluster' in node.attr:
            cluster = node.attr['_XlaCluster'].s.decode()
            cluster_ops[cluster][node.op + ' @' + node.device.split('/device:')[-1]] += 1
      return dict(
          logical=logical, weights=weights, host_weights=host_weights,
          client_devices=client_devices, ops=ops, clusters=clusters, cluster_ops=cluster_ops)

    # argv[3]: the shapes to run, in order, comma-separated; one result per shape.
    print('RESULT ' + json.dumps({shape: run(shape) for shape in sys.argv[3].split(',')}))
''')


def _run_script(mode: str, tmp_path, env_extra=None, shapes=('round',)) -> dict:
  """{shape: its result} from one run of `_SCRIPT`."""
  dump_dir = tmp_path / 'dump'
  dump_dir.mkdir()
  env = dict(os.environ, PYTHONPATH=_REPO, TF_CPP_MIN_LOG_LEVEL='2')
  env.update(env_extra or {})
  completed = subprocess.run(
      [sys.executable, '-c', _SCRIPT, mode, str(dump_dir), ','.join(shapes)],
      cwd=_REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
      timeout=_TIMEOUT_S,
  )
  output = completed.stdout + completed.stderr
  assert completed.returncode == 0, output[-5000:]
  results = [line for line in completed.stdout.splitlines() if line.startswith('RESULT ')]
  assert len(results) == 1, output[-5000:]
  return json.loads(results[0][len('RESULT '):])


def _max_diff(actual, expected) -> float:
  assert len(actual) == len(expected)
  return max(
      float(tf.reduce_max(tf.abs(tf.constant(a) - tf.constant(e))))
      for a, e in zip(actual, expected)
  )


def _count(ops_by_device: dict, device: str, pattern) -> int:
  return sum(n for op, n in ops_by_device.get(device, {}).items() if pattern.search(op))


def test_place_nodes_keeps_tf_data_on_the_host():
  variable = tf.Variable(tf.ones([3, 2]))

  @tf.function
  def train(dataset):
    total = tf.zeros([2])
    for x in iter(dataset):  # A while loop over an iterator, in the function library.
      total += tf.reduce_sum(tf.matmul(x, variable), axis=0)
    return total

  dataset = tf.data.Dataset.from_tensor_slices(tf.ones([4, 3])).batch(2)
  graph_def = train.get_concrete_function(dataset).graph.as_graph_def()
  placed = tf_computation.place_nodes(graph_def, '/device:GPU:0')  # A GraphDef: no GPU needed.
  nodes = list(placed.node) + [n for f in placed.library.function for n in f.node_def]
  assert placed.library.function, 'the loop body should be a library function'
  by_op = {}
  for node in nodes:
    by_op.setdefault(node.op, set()).add(node.device)
  tf_data = [op for op in by_op if 'Dataset' in op or _ITERATOR_OP.search(op)]
  assert any('IteratorGetNext' in op for op in tf_data), sorted(by_op)
  for op in tf_data:
    assert by_op[op] == {tf_computation.HOST_DEVICE}, (op, by_op[op])
  assert by_op['MatMul'] == {'/device:GPU:0'}
  # Registered for GPU only as DEVICE_DEFAULT kernels: still GPU ops, the variable's reads too.
  assert by_op['ReadVariableOp'] == {'/device:GPU:0'}
  # The host default keeps everything there.
  on_host = tf_computation.place_nodes(graph_def, tf_computation.HOST_DEVICE)
  assert {n.device for n in on_host.node} == {tf_computation.HOST_DEVICE}


def _node(name, op, inputs=(), **type_attrs):
  node = tf.compat.v1.NodeDef(name=name, op=op, input=list(inputs))
  for key, dtype in type_attrs.items():
    node.attr[key].type = dtype.as_datatype_enum
  return node


def test_place_nodes_keeps_forwarded_tf_data_variants_on_the_host():
  # The lowered control flow TFF's graphs hold: the loop body's `Switch` forwards the
  # iterator's optional (host), while a TensorList variant stays with the model.
  graph_def = tf.compat.v1.GraphDef(node=[
      _node('data', 'Placeholder', dtype=tf.variant),
      _node('iterator', 'AnonymousIteratorV3'),
      _node('optional', 'IteratorGetNextAsOptional', ['iterator']),
      _node('has_value', 'OptionalHasValue', ['optional']),
      _node('switch', 'Switch', ['optional', 'has_value'], T=tf.variant),
      _node('merge', 'Merge', ['switch:1', 'next'], T=tf.variant),
      _node('next', 'NextIteration', ['merge'], T=tf.variant),
      _node('value', 'OptionalGetValue', ['switch:1']),
      _node('x', 'Placeholder', dtype=tf.float32),
      _node('matmul', 'MatMul', ['x', 'x'], T=tf.float32),
      _node('list', 'TensorListReserve'),
      _node('list_switch', 'Switch', ['list', 'has_value'], T=tf.variant),
  ])
  placed = {n.name: n.device for n in tf_computation.place_nodes(graph_def, '/device:GPU:0').node}
  host = {name for name, device in placed.items() if device == tf_computation.HOST_DEVICE}
  assert host == {
      'data', 'iterator', 'optional', 'has_value', 'switch', 'merge', 'next', 'value'
  }
  assert placed['list_switch'] == placed['matmul'] == '/device:GPU:0'


@pytest.fixture(scope='module')
def two_cpus(tmp_path_factory) -> dict:
  """Both shapes' results on two logical CPUs, from one fresh Python (one start-up of
  TensorFlow and TFF, one FedAvg built) that the two tests below only read."""
  return _run_script('two_cpus', tmp_path_factory.mktemp('two_cpus'),
                     shapes=('round', 'client_work'))


def test_two_logical_cpus_run_the_clients_and_equal_one_device(two_cpus):
  result = two_cpus['round']
  assert result['logical'][:2] == ['/device:CPU:0', '/device:CPU:1'], result['logical']
  assert _max_diff(result['weights'], result['host_weights']) <= 1e-6

  # Each device slot's `work` runs the model on its device (forward and gradient MatMul,
  # BiasAdd, ...) and its iterator on the host.
  ops = result['ops']
  assert sorted(ops) == ['/device:CPU:0', '/device:CPU:1'], sorted(ops)
  for device in ops:
    assert _count(ops, device, re.compile('MatMul')) >= 2, (device, ops[device])
    assert _count(ops, device, re.compile('BiasAdd')) >= 1, (device, ops[device])
  assert _count(ops, '/device:CPU:0', re.compile('IteratorGetNext')) == 2, ops['/device:CPU:0']
  assert _count(ops, '/device:CPU:1', _ITERATOR_OP) == 0, ops['/device:CPU:1']
  # TensorFlow names a function's host-memory outputs (all a CPU device's are) after the
  # task's host CPU, so on logical CPUs `last_client_devices` cannot tell them apart; on a
  # GPU, the float updates it reads live in GPU memory and carry the GPU's name.
  assert len(result['client_devices']) == 4
  assert all(d.endswith('/device:CPU:0') for d in result['client_devices'])


def test_two_logical_cpus_run_a_client_works_clients_when_interpreted(two_cpus):
  """Placement holds for computations of other shapes: a client work's `next`."""
  result = two_cpus['client_work']
  assert _max_diff(result['weights'], result['host_weights']) <= 1e-6
  ops = result['ops']
  assert sorted(ops) == ['/device:CPU:0', '/device:CPU:1'], sorted(ops)
  for device in ops:
    assert _count(ops, device, re.compile('MatMul')) >= 2, (device, ops[device])
  assert _count(ops, '/device:CPU:0', re.compile('IteratorGetNext')) > 0, ops['/device:CPU:0']
  assert _count(ops, '/device:CPU:1', _ITERATOR_OP) == 0, ops['/device:CPU:1']
  assert len(result['client_devices']) == 4


def test_xla_cpu_runs_the_model_while_iterators_stay_on_the_host(tmp_path):
  result = _run_script(
      'xla_cpu', tmp_path,
      env_extra=dict(
          TF_XLA_FLAGS='--tf_xla_enable_xla_devices --tf_xla_clustering_debug',
          TF_DUMP_GRAPH_PREFIX=str(tmp_path / 'dump'),
      ),
  )
  if 'skip' in result:
    pytest.skip(result['skip'])
  result = result['round']
  assert _max_diff(result['weights'], result['host_weights']) <= _XLA_TOLERANCE

  ops, clusters = result['ops'], result['clusters']
  xla, host = '/device:XLA_CPU:0', '/device:CPU:0'
  # Iterators and optionals on the host only.
  assert _count(ops, host, re.compile('IteratorGetNext')) > 0
  assert _count(ops, host, re.compile('MakeIterator|AnonymousIterator')) > 0
  assert _count(ops, xla, _ITERATOR_OP) == 0, ops[xla]
  # No model op left on the host: XLA_CPU ran them, compiled into clusters.
  assert _count(ops, host, _MODEL_OP) == 0, ops[host]
  assert ops[xla].get('_XlaRun', 0) > 0, ops[xla]
  ran_on_xla = {}
  for cluster in clusters[xla]:
    for op_at, n in result['cluster_ops'].get(cluster, {}).items():
      ran_on_xla[op_at] = ran_on_xla.get(op_at, 0) + n
  assert ran_on_xla.get('MatMul @XLA_CPU:0', 0) >= 2, (clusters, ran_on_xla)  # Forward, gradient.
  assert ran_on_xla.get('BiasAdd @XLA_CPU:0', 0) >= 1, ran_on_xla
  assert not [op for op in ran_on_xla if not op.endswith('@XLA_CPU:0')], ran_on_xla


def test_check_devices_on_this_machine(tmp_path):
  before = worker_processes.worker_pids()
  completed = subprocess.run(
      [sys.executable, '-m', 'launch.check_devices', f'--cache_dir={tmp_path}'],
      cwd=_REPO, env=dict(os.environ, CUDA_VISIBLE_DEVICES=''), stdin=subprocess.DEVNULL,
      capture_output=True, text=True, timeout=_TIMEOUT_S,
  )
  out = completed.stdout
  assert completed.returncode == 0, (out + completed.stderr)[-5000:]
  assert re.search(r'^tf_build: version=\S+ is_cuda_build=\w+ cuda_version=', out, re.M), out
  assert re.search(r'^tf_gpus: physical=none logical=none$', out, re.M), out
  # Why, in one line with its fix; here (CUDA_VISIBLE_DEVICES='' too) the missing driver first.
  causes = re.findall(r'^no_gpu_cause: (.*)$', out, re.M)
  assert len(causes) == 1, out
  if gpu_diagnosis.driver_cause():
    assert causes == [gpu_diagnosis.driver_cause()], out
    assert causes[0].startswith('no NVIDIA driver: libcuda.so.1 cannot be loaded'), out
  assert 'no GPU: the in-process round ran on the CPU' in out
  assert re.search(r'^tff_worker: binary=\S*worker_binary', out, re.M), out
  assert re.search(r'^tff_worker_log: Found devices: \[/physical_device:CPU:0\]', out, re.M), out
  counts = re.search(r'^ops: device=/device:CPU:0 nodes=(\d+) model_ops=(\d+)$', out, re.M)
  assert counts and int(counts.group(2)) > 0, out
  assert re.search(r'^placement: /device:CPU:0 ran \d+ model ops$', out, re.M), out
  diff = re.search(r'^weights: max_abs_diff=(\S+) .* PASS$', out, re.M)
  assert diff and float(diff.group(1)) <= 1e-5, out
  # Nothing claims a GPU ran anything.
  assert not re.search(r'^(ops|placement):.*GPU', out, re.M), out
  # Its worker is gone: stopped by the program, and none is left among our descendants.
  worker = re.search(r'^tff_worker pid=(\d+) stopped=yes$', out, re.M)
  assert worker, out
  try:
    process = psutil.Process(int(worker.group(1)))
    alive = process.status() != psutil.STATUS_ZOMBIE and 'worker_binary' in ' '.join(
        process.cmdline()
    )
  except psutil.NoSuchProcess:
    alive = False
  assert not alive, f'the worker of launch.check_devices outlived it: {worker.group(0)}'
  assert worker_processes.worker_pids() <= before
