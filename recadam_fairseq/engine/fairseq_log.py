"""fairseq's ``--log-format json`` output read back: every json record by kind (train_inner, valid, train), and the
validations per subset with the other subsets validated at the same update. The one parser of fairseq's logs
(the task scripts' summaries and terminal lines, both comparisons, the benchmarks, plot_run.py, the tests)."""

import json
from collections import defaultdict

from recadam_fairseq.engine.aggregate import OTHERS, to_float


def read_log(path):
    """{kind: [record, ...]} for the json records of a fairseq log file (train_inner, valid, train)."""
    with open(path) as f:
        return parse_log_lines(f)


def parse_log_lines(lines):
    """The json records of fairseq log lines: "... | INFO | train_inner | {...}", "INFO:train_inner:{...}"
    (Python's default log format, e.g. on distributed ranks) or bare json lines."""
    out = defaultdict(list)
    for line in lines:
        brace = line.find("{")
        if brace < 0:
            continue
        head = line[:brace].replace(":", "|")
        kind = head.rstrip(" |").rsplit("|", 1)[-1].strip() if "|" in head else ""
        try:
            rec = json.loads(line[brace:])
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        if not kind:  # bare json lines (no logging prefix): tell them apart by their keys
            kind = "valid" if any(k.startswith("valid_") for k in rec) else "train_inner"
        out[kind].append(rec)
    return out


def parse_log(path):
    """fairseq json log -> ({subset: [stats of one validation, ...]}, last update number seen).

    Lines are either bare json (--log-file) or prefixed ("... | INFO | valid | {...}"). A
    validation line holds "<subset>_num_updates"; train lines hold "num_updates" (train_inner)
    or "train_num_updates" (end of epoch).
    """
    valid, last = defaultdict(list), None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            i = line.find('{"')
            if i < 0:
                continue
            try:
                rec = json.loads(line[i:])
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            for key in rec:
                if key == "num_updates" or key.endswith("_num_updates"):
                    n = to_float(rec[key])
                    if n is not None:
                        last = int(n) if last is None else max(last, int(n))
                if not key.endswith("_num_updates"):
                    continue
                subset = key[: -len("_num_updates")]
                if subset == "train":
                    continue
                valid[subset].append({k[len(subset) + 1:]: v for k, v in rec.items() if k.startswith(subset + "_")})
    for e in valid.get("valid", []):  # the other subsets at the same update (translation's original domain)
        e[OTHERS] = {}
        for subset, es in valid.items():
            same = [x for x in es if x.get("num_updates") == e.get("num_updates")]
            if subset != "valid" and same:
                e[OTHERS][subset] = same[-1]
    return valid, last
