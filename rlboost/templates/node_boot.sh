#!/bin/bash
# rlboost node bootstrap for direct providers: AWS user-data and GCP startup-script.
# rlboost puts `export NAME=value` lines (trainer URL, enrolment credential, worker id, notice source...)
# where the marker below is. Anyone allowed to describe the instance reads them, so no job token, TLS key
# or secret variable is among them: the node enrols for those (contracts/enrolment.py). No cloud
# credentials are passed: a worker only dials home to the trainer.
set -euo pipefail
# @RLBOOST_ENV@
exec >>/var/log/rlboost.log 2>&1
# whatever fails below (an install, the job's setup), the node powers off rather than bill idle
trap 'shutdown -h now' EXIT
python3 -m venv /opt/rlboost
/opt/rlboost/bin/pip install -q "$RLBOOST_PIP_SPEC"
# the job file's `setup:` commands (RLBOOST_SETUP_B64), in rlboost's venv, before rlboost starts
if [ -n "${RLBOOST_SETUP_B64:-}" ]; then
  echo "$RLBOOST_SETUP_B64" | base64 -d >/var/lib/rlboost-setup.sh
  (source /opt/rlboost/bin/activate && bash -e /var/lib/rlboost-setup.sh)
fi
if [ "$RLBOOST_ROLE" = "trainer" ]; then
  mkdir -p /var/lib/rlboost/run
  echo "$RLBOOST_SPEC_B64" | base64 -d >/var/lib/rlboost/spec.yaml
  /opt/rlboost/bin/python -m rlboost.trainer --spec /var/lib/rlboost/spec.yaml --host 0.0.0.0 \
    --port "$RLBOOST_TRAINER_PORT" --run-dir /var/lib/rlboost/run --linger 120 || true
else
  /opt/rlboost/bin/python -m rlboost.worker || true
fi
# Done (or failed): the EXIT trap powers off. AWS instances are launched to terminate on shutdown;
# GCP ones stop billing for compute. The controller (or `rlboost gc`) deletes what is left.
