# Helpers the benchmark scripts share (source it).

# bench_cpu: this machine's CPU model, as lscpu names it (every table says it).
bench_cpu() {
  lscpu | sed -n 's/^Model name: *//p' | head -n 1
}

# bench_fail LOG: a contender failed; show its log's end and stop.
bench_fail() {
  echo "benchmark run failed ($1):" >&2
  tail -n 20 "$1" >&2
  exit 1
}

# The scripts' Python takes its medians and ratios from bench_stats.py.
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
