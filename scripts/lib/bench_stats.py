"""How every benchmark script takes its figures (import it from their
Python: scripts/lib/bench.sh puts this folder on PYTHONPATH).

median: the median of the rounds (nan when there are none, so a missing
contender shows as nan in the table instead of stopping the report);
ratio: lockstep's figure over the peer's (nan when either is missing);
read_rows: a JSON-lines file as a list of dicts.
"""
import json
import math
import statistics


def median(values):
    values = list(values)
    return statistics.median(values) if values else math.nan


def ratio(mine, peer):
    if math.isnan(mine) or math.isnan(peer) or peer == 0:
        return math.nan
    return mine / peer


def read_rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
