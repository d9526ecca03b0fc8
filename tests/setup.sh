#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine, as root: the tools the
# namespace test cluster runs (sshd, iproute2, iptables), the baselines the benchmarks compare
# against (pdsh, iperf3), headless Chromium (and a font) for the HTML report's test, the CPU build of torch, and
# preflight itself with its test extras; gcc compiles the fake libnvidia-ml.so.1 of tests/test_nvml_library.py.
set -euo pipefail
cd "$(dirname "$0")/.."

apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  openssh-server openssh-client iproute2 iptables procps util-linux pdsh iperf3 slurm-wlm munge chromium fonts-dejavu-core \
  gcc libc6-dev binutils >/dev/null
# The CPU build; a bare `torch` would pull several GB of CUDA wheels.
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[test]"
