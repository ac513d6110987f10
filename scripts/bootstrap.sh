#!/usr/bin/env bash
# Creates .venv and installs tff_zmg with its tested dependency set. Idempotent: a second
# run with unchanged requirements only checks a stamp and returns in well under a second.
#
#   bash scripts/bootstrap.sh          # the set every machine needs (TensorFlow's CUDA build)
#   bash scripts/bootstrap.sh --gpu    # and the CUDA 11.8 / cuDNN 8.7 wheels it loads on a GPU
#                                      # (requirements/gpu.txt: about 2 GB)
set -euo pipefail
cd "$(dirname "$0")/.."

gpu=0
for arg in "$@"; do
  case "$arg" in
    --gpu) gpu=1 ;;
    *) echo "bootstrap: unknown argument '$arg' (the only one is --gpu)" >&2; exit 2 ;;
  esac
done

venv=.venv
stamp="$venv/.tff_zmg-installed"
cpu_set=$(cat requirements/constraints.txt requirements/overrides.txt requirements/requirements.txt setup.py | sha256sum | cut -d' ' -f1)
# The GPU set's stamp covers the CPU set's too: a plain run after `--gpu` has nothing to do,
# and `--gpu` after a plain run installs the GPU wheels.
gpu_set=$(printf '%s\n' "$cpu_set" | cat - requirements/gpu.txt | sha256sum | cut -d' ' -f1)
want=$cpu_set
if (( gpu )); then want=$gpu_set; fi
if [[ -x "$venv/bin/python" && -f "$stamp" ]]; then
  have=$(cat "$stamp")
  if [[ "$have" == "$want" || ( $gpu == 0 && "$have" == "$gpu_set" ) ]]; then
    exit 0
  fi
fi

# TFF 0.87.0 supports CPython 3.9-3.11 only; take the newest such interpreter on PATH.
python=""
for candidate in "${PYTHON:-}" python3.11 python3.10 python3.9 python3; do
  [[ -n "$candidate" ]] || continue
  command -v "$candidate" >/dev/null 2>&1 || continue
  if "$candidate" -c 'import sys; sys.exit(0 if (3, 9) <= sys.version_info[:2] <= (3, 11) else 1)'; then
    python=$candidate
    break
  fi
done
if [[ -z "$python" ]]; then
  echo "bootstrap: tff_zmg needs Python 3.9, 3.10 or 3.11 (TensorFlow Federated 0.87.0 supports" \
       "no other); none was found on PATH. Install one, or set PYTHON=/path/to/python3.11." >&2
  exit 1
fi

echo "bootstrap: creating $venv with $("$python" --version 2>&1) and installing dependencies" \
     "(first run only; several minutes)" >&2
if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
# pip's stderr without the conflicts of the pins below, which it reports on every install
# ("ERROR: ... dependency conflicts"): one line says they are expected.
quiet_conflicts() {
  local status=0 log
  log=$(mktemp)
  "$@" 2>"$log" || status=$?
  awk -f scripts/expected_pip_conflicts.awk "$log" >&2
  rm -f "$log"
  return "$status"
}
"${pip[@]}" install -U 'pip>=23' 'setuptools>=65' wheel
# TFF pins jax/jaxlib 0.4.14, which is not served, and its google-vizier needs a
# grpcio-tools that wants protobuf 4 (TF 2.14 needs 3.20): install both without their
# requirements and give them the rest, with jax 0.4.13, from the constraints file.
"${pip[@]}" install --no-deps -c requirements/constraints.txt tensorflow-federated google-vizier
quiet_conflicts "${pip[@]}" install -c requirements/constraints.txt -r requirements/requirements.txt
if (( gpu )); then
  # Under the same constraints, so that only the listed wheels are added (gpu.txt says why
  # each, and why TensorRT is left out).
  quiet_conflicts "${pip[@]}" install -c requirements/constraints.txt -r requirements/gpu.txt
fi
# Then the versions the resolver cannot pick, each with its reason (overrides.txt).
quiet_conflicts "${pip[@]}" install --no-deps -r requirements/overrides.txt
quiet_conflicts "${pip[@]}" install --no-deps --no-build-isolation -e .
# (The managed context, installed lazily, replaces TFF's own, whose clean-up prints a
# traceback at exit.)
TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}" "$venv/bin/python" -c 'import tensorflow_federated, tff_zmg, tasks, launch; tff_zmg.set_default_execution_context(start=False)' \
  || { echo "bootstrap: the installed set does not import; see the error above." >&2; exit 1; }
echo "$want" > "$stamp"
echo "bootstrap: done ($venv)" >&2
