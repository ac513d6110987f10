"""tasks.evaluation: the held-out evaluation, checked against NumPy and TFF's own."""

import dataclasses
import json
import os
import subprocess
import sys
import threading

from absl import flags
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from launch import train
from launch.run import errors
from launch.run import resumption
from launch.run import run_config
import tasks
from tasks import evaluation
import small_runs


def _weights(task, seed=1):
  """Random (not initial) model weights, so that accuracies are not all alike."""
  model = task.keras_model_fn()
  rng = np.random.default_rng(seed)
  for v in model.trainable_weights:
    v.assign(rng.normal(0, 0.1, v.shape).astype(np.float32))
  weights = tff.learning.models.ModelWeights.from_model(model)
  return tf.nest.map_structure(np.asarray, weights), model


def _client_arrays(task):
  """Per test client (sorted ids): its preprocessed (x, y) as NumPy arrays."""
  test = task.datasets.test_data
  out = []
  for cid in sorted(test.client_ids):
    batches = list(task.datasets.eval_preprocess_fn(
        test.create_tf_dataset_for_client(cid)).as_numpy_iterator())
    out.append((np.concatenate([b['x'] for b in batches]),
                np.concatenate([b['y'] for b in batches])))
  return out


def _correct_and_count(logits, y):
  """Correct predictions and targets that count (Shakespeare's padding, y < 0, does not)."""
  mask = y >= 0
  return int(np.sum((np.argmax(logits, -1) == y) & mask)), int(np.sum(mask))


@pytest.mark.parametrize('name', ['emnist', 'shakespeare'])
def test_global_evaluation_covers_every_test_example_with_its_accuracy(small_task, name):
  task = small_task(name)
  weights, model = _weights(task)
  held_out = evaluation.read_held_out(task)
  metrics = evaluation.Evaluator(task.model_fn, held_out)(weights)
  clients = _client_arrays(task)
  correct = count = examples = 0
  for x, y in clients:
    c, n = _correct_and_count(model(x, training=False).numpy(), y)
    correct, count, examples = correct + c, count + n, examples + len(x)
  assert held_out.num_examples == examples == metrics['num_examples']
  assert metrics['sparse_categorical_accuracy'] == pytest.approx(correct / count, abs=1e-7)


def test_global_loss_is_the_example_weighted_mean_of_the_batches_losses(small_task):
  task = small_task('emnist')
  weights, model = _weights(task)
  held_out = evaluation.read_held_out(task)
  metrics = evaluation.Evaluator(task.model_fn, held_out)(weights)
  x = np.concatenate([x for x, _ in _client_arrays(task)])
  y = np.concatenate([y for _, y in _client_arrays(task)])
  logits = model(x, training=False).numpy().astype(np.float64)
  log_softmax = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1,
                                       keepdims=True)) - logits.max(-1, keepdims=True)
  per_example = -log_softmax[np.arange(len(y)), y]
  # Every example weighs the same in the pooled mean, however the batches are cut.
  assert metrics['loss'] == pytest.approx(per_example.mean(), rel=1e-5)


def test_per_client_pools_as_tffs_federated_evaluation_and_spreads_by_hand(
    small_task, tff_context):
  del tff_context  # TFF's own evaluation runs in the managed worker.
  task = small_task('shakespeare')
  weights, model = _weights(task, seed=2)
  held_out = evaluation.read_held_out(task, evaluation.PER_CLIENT)
  metrics = evaluation.Evaluator(task.model_fn, held_out, parallel=2)(weights)

  local = []
  for x, y in _client_arrays(task):
    correct, count = _correct_and_count(model(x, training=False).numpy(), y)
    local.append(correct / count)
  # After the Keras model's use: TFF builds its models in graph mode.
  fed_eval = tff.learning.algorithms.build_fed_eval(task.model_fn)
  test = task.datasets.test_data
  data = [task.datasets.eval_preprocess_fn(test.create_tf_dataset_for_client(c))
          for c in sorted(test.client_ids)]
  tff_metrics = fed_eval.next(fed_eval.set_model_weights(fed_eval.initialize(), weights),
                              data).metrics['client_work']['eval']['current_round_metrics']
  for name in ('sparse_categorical_accuracy', 'loss', 'num_examples', 'num_batches'):
    assert metrics[name] == pytest.approx(float(tff_metrics[name]), rel=1e-6), name

  assert metrics['num_clients'] == len(local) == len(test.client_ids)
  assert metrics['local_accuracy_mean'] == pytest.approx(np.mean(local), abs=1e-7)
  assert metrics['local_accuracy_std'] == pytest.approx(np.std(local), abs=1e-7)


def test_results_do_not_depend_on_how_many_groups_run_at_once(small_task):
  task = small_task('emnist')
  weights, _ = _weights(task)
  for kind in evaluation.KINDS:
    held_out = evaluation.read_held_out(task, kind)
    one = evaluation.Evaluator(task.model_fn, held_out, parallel=1)(weights)
    three = evaluation.Evaluator(task.model_fn, held_out, parallel=3)(weights)
    assert one == three


def test_several_weights_at_once_give_each_its_own_metrics(small_task):
  """A batched group's cells evaluated together (`evaluate_many`), spread over the slots
  (one group a cell, or three), give what each gives alone, to the bit."""
  task = small_task('emnist')
  cells = [_weights(task, seed)[0] for seed in (1, 2, 3)]
  for kind in evaluation.KINDS:
    held_out = evaluation.read_held_out(task, kind)
    alone = [evaluation.Evaluator(task.model_fn, held_out)(w) for w in cells]
    evaluator = evaluation.Evaluator(task.model_fn, held_out, parallel=2)
    for _ in range(2):  # The first call traces; the second runs the slots in threads.
      assert evaluator.evaluate_many(cells) == alone, kind
    evaluator.close()
  assert len({m['loss'] for m in alone}) == len(cells)  # The cells differ.


def test_several_weights_at_once_after_a_model_was_made_in_a_graph(small_task):
  """A warm slot's evaluator, used by a run alone (one slot), then by a batched group,
  whose process made models in a graph: Keras invalidates models made outside a graph
  and not yet called, so the second slot's model is made when first needed."""
  task = small_task('emnist')
  cells = [_weights(task, seed)[0] for seed in (1, 2)]
  held_out = evaluation.read_held_out(task)
  assert len(held_out.groups) == 1
  evaluator = evaluation.Evaluator(task.model_fn, held_out, parallel=2)
  alone = [evaluator(w) for w in cells]
  with tf.Graph().as_default():
    task.model_fn()
  assert evaluator.evaluate_many(cells) == alone
  evaluator.close()


def test_threads_run_only_graphs_the_first_call_traced_in_its_own_thread(small_task):
  """Tracing in two threads at once crashed TensorFlow (SIGSEGV) in one validation run."""
  task = small_task('emnist')
  tracing_threads = []

  def record(x):  # Python in a tf.function's model runs only while it is traced.
    tracing_threads.append(threading.current_thread().name)
    return x

  def model_fn():
    inner = task.keras_model_fn()
    keras_model = tf.keras.Sequential(
        [tf.keras.Input(inner.input_shape[1:]), tf.keras.layers.Lambda(record), inner])
    return tff.learning.models.from_keras_model(
        keras_model, loss=task.spec.loss_fn(), metrics=task.spec.metrics_fn(),
        input_spec=task.datasets.element_type_structure)

  held_out = evaluation.read_held_out(task, evaluation.PER_CLIENT)
  assert len(held_out.groups) == 3  # Two models: one evaluates two clients, one one.
  evaluator = evaluation.Evaluator(model_fn, held_out, parallel=2)
  weights, _ = _weights(task)
  tracing_threads.clear()
  first = evaluator(weights)
  assert tracing_threads and set(tracing_threads) == {threading.current_thread().name}
  traced = len(tracing_threads)
  second = evaluator(weights)
  evaluator.close()
  assert len(tracing_threads) == traced  # The pool's threads ran, and traced nothing.
  assert first == second


def test_a_subsample_is_fixed_and_drawn_from_the_test_examples(small_task):
  task = small_task('emnist')
  first = evaluation.read_held_out(task, num_examples=25)
  again = evaluation.read_held_out(task, num_examples=25)
  assert first.num_examples == 25
  pixels = lambda h: np.concatenate([b['x'].numpy() for g in h.groups for b in g])
  np.testing.assert_array_equal(pixels(first), pixels(again))
  every = {x.tobytes() for x, _ in [(x, 0) for a, _ in _client_arrays(task) for x in a]}
  assert all(x.tobytes() in every for x in pixels(first))
  assert first.description == (
      'global: 25 examples, a fixed subsample (seed 0) of the test set, batch 100')
  # --scale=small asks for 5,000 of a small federation's fewer: that is the whole test set,
  # in the same batches, and its record says so rather than "a subsample".
  whole = evaluation.read_held_out(task)
  at_least_all = evaluation.read_held_out(task, num_examples=whole.num_examples)
  assert at_least_all.description == whole.description == (
      f'global: {whole.num_examples} examples, the whole test set, batch 100')
  np.testing.assert_array_equal(pixels(at_least_all), pixels(whole))


def _log_softmax(logits):
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _tff_loss(logits, y, batch_size):
  """TFF's evaluation loss, by NumPy: each batch's Keras loss (the mean cross-entropy over
  its targets that count) weighted by the batch's examples."""
  losses, weights = [], []
  for i in range(0, len(y), batch_size):
    lp, yb = _log_softmax(logits[i: i + batch_size]), y[i: i + batch_size]
    mask = yb >= 0
    ce = -np.take_along_axis(lp, np.maximum(yb, 0)[..., None], -1)[..., 0]
    losses.append(ce[mask].mean())
    weights.append(len(yb))
  return np.average(losses, weights=weights)


@pytest.mark.parametrize('name', ['emnist', 'shakespeare'])
def test_the_metrics_at_the_chosen_batch_are_those_at_the_training_batch(small_task, name):
  """The chosen batch changes no count and no accuracy (up to float32 round-off); the loss is
  TFF's example-weighted mean of batch losses at either batch, which for an image (one loss
  per example) is the mean over examples whatever the batch."""
  task = small_task(name)
  weights, model = _weights(task)
  x, y = (np.concatenate(parts) for parts in zip(*_client_arrays(task)))
  chosen = evaluation.batch_size_for(name, 'cpu')
  at = {}
  for batch_size in (task.spec.batch_size, chosen):
    held_out = evaluation.read_held_out(task, batch_size=batch_size)
    assert held_out.batch_size == batch_size
    assert {len(b['x']) for g in held_out.groups for b in g[:-1]} <= {batch_size}
    at[batch_size] = evaluation.Evaluator(task.model_fn, held_out)(weights)
    pooled = np.concatenate([b['x'].numpy() for g in held_out.groups for b in g])
    targets = np.concatenate([b['y'].numpy() for g in held_out.groups for b in g])
    logits = model(pooled, training=False).numpy().astype(np.float64)
    assert at[batch_size]['loss'] == pytest.approx(
        _tff_loss(logits, targets, batch_size), rel=1e-5)
  trained, evaluated = at[task.spec.batch_size], at[chosen]
  assert trained['num_examples'] == evaluated['num_examples'] == len(x)
  correct, count = _correct_and_count(model(x, training=False).numpy(), y)
  for metrics in (trained, evaluated):
    assert metrics['sparse_categorical_accuracy'] == pytest.approx(correct / count, abs=1e-7)
  if name == 'emnist':
    assert evaluated['loss'] == pytest.approx(trained['loss'], rel=1e-6)


def test_a_batch_changes_only_how_the_examples_are_cut(small_task):
  """The same examples in the same order at any batch, globally and per client."""
  task = small_task('shakespeare')
  for kind in evaluation.KINDS:
    old = evaluation.read_held_out(task, kind)
    new = evaluation.read_held_out(task, kind, batch_size=7)
    assert old.batch_size == task.spec.eval_batch_size and new.batch_size == 7
    assert len(old.groups) == len(new.groups) or kind == evaluation.GLOBAL
    for name in ('x', 'y'):
      np.testing.assert_array_equal(
          np.concatenate([b[name].numpy() for g in old.groups for b in g]),
          np.concatenate([b[name].numpy() for g in new.groups for b in g]))
    assert new.description.endswith(', batch 7')


def _train(capsys, *args):
  """launch.train's main in this process: (exit status, stdout, stderr)."""
  flags.FLAGS.unparse_flags()
  flags.FLAGS(['train', '--task=emnist', '--algo=fedavg', *small_runs.FLAGS, *args])
  try:
    rc = train.main(['train'])
  finally:
    flags.FLAGS.unparse_flags()
  out, err = capsys.readouterr()
  return rc, out, err


@pytest.mark.parametrize('args, says', [
    (['--num_eval_clients=2'], 'num_eval_clients must be a positive number and chooses'),
    (['--evaluation=per_client', '--eval_examples=5'], 'eval_examples must be a positive'),
    (['--eval_examples=0'], 'eval_examples must be a positive number'),
])
def test_settings_that_do_not_fit_the_evaluation_end_in_one_line(tmp_path, capsys, args, says):
  rc, _, err = _train(capsys, f'--root_output_dir={tmp_path}', f'--cache_dir={tmp_path}/data',
                      *args)
  assert rc == 2, err
  assert says in err and len(err.strip().splitlines()) == 1
  assert not os.listdir(tmp_path)  # Refused before anything was written, data included.


def test_a_run_recorded_before_the_setting_resumes_with_its_per_client_evaluation(
    tmp_path, capsys, synthetic_cache_dir):
  base = [f'--root_output_dir={tmp_path}', f'--cache_dir={synthetic_cache_dir}',
          '--experiment_name=old']
  rc, _, err = _train(capsys, *base, '--total_rounds=1', '--evaluation=per_client',
                      '--num_eval_clients=1')
  assert rc == 0, err
  run_dir = tmp_path / 'old'
  # As an older version wrote them: no evaluation settings, num_eval_clients=1.
  for path, part in ((run_dir / 'flags.json', None),
                     (run_dir / 'checkpoints' / 'run_identity.json', 'settings')):
    record = json.loads(path.read_text())
    settings = record if part is None else record[part]
    del settings['evaluation'], settings['eval_examples']
    path.write_text(json.dumps(record))
  rc, out, err = _train(capsys, *base, '--total_rounds=2')
  assert rc == 0, err
  assert 'evaluation: per_client' in out and '1 test clients' in out
  recorded = json.loads((run_dir / 'flags.json').read_text())
  assert (recorded['evaluation'], recorded['num_eval_clients']) == ('per_client', 1)
  header = (run_dir / 'metrics.csv').read_text().splitlines()[0]
  assert 'evaluation/local_accuracy_mean' in header


def test_a_new_run_takes_the_chosen_batch_and_a_recorded_run_keeps_its_own(tmp_path):
  config = run_config.ExperimentConfig(
      task='shakespeare', algo='fedavg', root_output_dir=str(tmp_path), experiment_name='r')
  old_batch = tasks.SPECS['shakespeare'].eval_batch_size
  new = run_config.resolve_evaluation(config)
  assert new.eval_batch_size == evaluation.batch_size_for('shakespeare', 'cpu') != old_batch
  assert new.recorded()['eval_batch_size'] == new.eval_batch_size
  # As a version before the choice recorded the run: no batch, which was the task's.
  record = new.recorded()
  del record['eval_batch_size']
  flags_json = tmp_path / 'r' / 'flags.json'
  flags_json.parent.mkdir()
  flags_json.write_text(json.dumps(record))
  resumed = run_config.resolve_evaluation(config)
  assert resumed.eval_batch_size == old_batch
  assert resumption.check_resumable(resumed)  # Its record reads as today's.
  # A recorded batch is kept where the run resumes on another executor...
  flags_json.write_text(json.dumps(dict(record, eval_batch_size=64)))
  on_gpu = dataclasses.replace(config, executor='gpu')
  assert run_config.resolve_evaluation(on_gpu).eval_batch_size == 64
  # ... another one is refused, and --overwrite starts a new run at the chosen batch.
  with pytest.raises(errors.ExperimentError, match='eval_batch_size: 64 -> 16'):
    resumption.check_resumable(run_config.resolve_evaluation(
        dataclasses.replace(config, eval_batch_size=16)))
  overwritten = run_config.resolve_evaluation(dataclasses.replace(on_gpu, overwrite=True))
  assert overwritten.eval_batch_size == evaluation.batch_size_for('shakespeare', 'gpu')


def test_a_run_recorded_before_the_batch_resumes_and_records_it(
    tmp_path, capsys, synthetic_cache_dir):
  base = [f'--root_output_dir={tmp_path}', f'--cache_dir={synthetic_cache_dir}',
          '--experiment_name=old']
  rc, _, err = _train(capsys, *base, '--total_rounds=1')
  assert rc == 0, err
  run_dir = tmp_path / 'old'
  for path, part in ((run_dir / 'flags.json', None),
                     (run_dir / 'checkpoints' / 'run_identity.json', 'settings')):
    record = json.loads(path.read_text())
    del (record if part is None else record[part])['eval_batch_size']
    path.write_text(json.dumps(record))
  rc, out, err = _train(capsys, *base, '--total_rounds=2')
  assert rc == 0, err
  old_batch = tasks.SPECS['emnist'].eval_batch_size
  assert f'the whole test set, batch {old_batch}' in out
  assert json.loads((run_dir / 'flags.json').read_text())['eval_batch_size'] == old_batch


def test_a_new_run_evaluates_at_the_batch_it_records(tmp_path, capsys, synthetic_cache_dir):
  rc, out, err = _train(capsys, '--task=shakespeare', f'--root_output_dir={tmp_path}',
                        f'--cache_dir={synthetic_cache_dir}', '--experiment_name=new',
                        '--total_rounds=1')
  assert rc == 0, err
  batch = evaluation.batch_size_for('shakespeare', 'cpu')
  assert batch != tasks.SPECS['shakespeare'].eval_batch_size
  (line,) = [l for l in out.splitlines() if l.startswith('evaluation: ')]
  assert line.endswith(f', batch {batch}'), line
  assert json.loads((tmp_path / 'new' / 'flags.json').read_text())['eval_batch_size'] == batch


_ON_A_SECOND_DEVICE = '''
import sys
import numpy as np
import tensorflow as tf
cpu, = tf.config.list_physical_devices('CPU')
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tensorflow_federated as tff
import tasks
from launch import train
from tasks import evaluation
task = tasks.get('emnist', data_source='synthetic', cache_dir=sys.argv[1], synthetic_settings=dict(
    num_train_clients=2, num_test_clients=3, mean_examples_per_client=40))
weights = tf.nest.map_structure(np.asarray, tff.learning.models.ModelWeights.from_model(
    task.keras_model_fn()))
results = []
for device in (None, '/device:CPU:1'):
  held_out = evaluation.read_held_out(task, device=device)
  print('data on', {b['x'].device for g in held_out.groups for b in g})
  results.append(evaluation.Evaluator(task.model_fn, held_out, device=device)(weights))
print('same', results[0] == results[1])
'''


def test_the_test_examples_and_models_stay_on_the_device_asked_for(tmp_path):
  # A second logical CPU stands in for a GPU (this machine has none).
  proc = subprocess.run([sys.executable, '-c', _ON_A_SECOND_DEVICE, str(tmp_path)],
                        cwd=small_runs.REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert lines[0] == "data on {'/job:localhost/replica:0/task:0/device:CPU:0'}"
  assert lines[1] == "data on {'/job:localhost/replica:0/task:0/device:CPU:1'}"
  assert lines[2] == 'same True'
