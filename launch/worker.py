r"""Serves TFF's executor service on this machine: `python -m launch.worker --port=8000`.

Runs TFF's C++ `worker_binary` (the one inside the installed TFF package) in the
foreground, listening on `--port` of every network interface, until Ctrl-C or SIGTERM.
Training programs on other machines then spread their rounds' clients over such workers:

  python -m launch.train --task=emnist --algo=fedzmg --workers=hostA:8000,hostB:8000

Every worker must run the same TFF version as the training program (this prints its
own). The service has no authentication or encryption: run it on a trusted network only.

Exit status: as every program's (docs/operations.md, "Exit statuses"); here 0 also
when stopped (Ctrl-C, SIGTERM or SIGHUP: a server's normal end), 2 a port already in use,
4 the worker ended by itself, 5 the worker could not start.
"""

import socket
import sys
import time

from absl import flags
from absl import logging
import portpicker
import tensorflow_federated as tff

from launch.cli import exit_status
from launch.cli import failures
from tff_zmg.runtime import cpp_worker

_PORT = flags.DEFINE_integer('port', None, 'TCP port to serve on (all interfaces).')
_MAX_CONCURRENT = flags.DEFINE_integer(
    'max_concurrent_computation_calls', -1,
    'How many client computations this worker runs at once (<= 0: no limit); lower it if'
    ' the worker runs out of memory.',
)
_INTRA_OP_THREADS = flags.DEFINE_integer(
    'intra_op_parallelism_threads', None,
    'Threads each TF op may use (default: TF\'s, every core); with many clients per'
    ' round, cores // clients this worker runs at once is faster.',
    lower_bound=1,
)

_POLL_S = 0.5


def _tail(path: str, lines: int = 20) -> str:
  try:
    with open(path, errors='replace') as f:
      return ''.join(f.readlines()[-lines:])
  except OSError:
    return ''


@failures.one_line_errors('worker')
def main(argv) -> int:
  del argv
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  port = _PORT.value
  # Checked here rather than marked required, so that importing this module next to
  # another program's flags (tests, a launcher of launchers) does not make --port theirs.
  if port is None:
    raise ValueError('--port is required, e.g. --port=8000')
  if not 1 <= port <= 65535:
    raise ValueError(f'--port must be in 1..65535, got {port}')
  if not portpicker.is_port_free(port):
    raise ValueError(f'port {port} is already in use on this machine; choose another --port')
  # worker_binary ignores SIGINT, so it is stopped with SIGTERM (`LocalWorker.stop`).
  worker = cpp_worker.LocalWorker(
      _MAX_CONCURRENT.value, port=port, intra_op_threads=_INTRA_OP_THREADS.value
  )
  keep_log = False
  try:
    try:
      worker.stub()
    except cpp_worker.WorkerStartError as e:
      keep_log = True  # The message names it: kept beyond this program's temporary folder.
      worker.stop(keep_log=True)
      log_path = worker.log_path
      kept = failures.keep_after_exit(log_path)
      raise cpp_worker.WorkerStartError(str(e).replace(log_path, kept)) from None
    print(
        f'TFF {tff.__version__} worker (pid {worker.pid}) serving on'
        f' {socket.gethostname()}:{port}; its log is {worker.log_path}.'
        f' Train elsewhere with --workers={socket.gethostname()}:{port}. Ctrl-C stops it.',
        flush=True,
    )
    while worker.poll() is None:
      time.sleep(_POLL_S)
    status, keep_log = worker.poll(), True
    worker.stop(keep_log=True)
    log_path = failures.keep_after_exit(worker.log_path)
    last = _tail(log_path, 1).strip() or 'empty'
    print(
        f'worker: error: the TFF worker ended by itself (status {status}); its log'
        f' {log_path} ends with: {last}',
        file=sys.stderr,
    )
    return exit_status.WORKER_LOST
  except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP (launch/cli/failures.py).
    print('worker: stopped', flush=True)
    return 0
  finally:
    worker.stop(keep_log=keep_log)


if __name__ == '__main__':
  # Its log is in this program's temporary folder, which the next program removes if this
  # one is killed; a log a failure names is moved out first (`failures.keep_after_exit`).
  failures.run_program('worker', main)
