"""The Keras conformance table's figures: each feature's largest difference from the plain
model, and each refusal's message.

    python bench/keras_conformance.py               # runs every row (a few minutes on 2 cores)
    python bench/keras_conformance.py --table_only  # rewrites the page from the JSON

Runs the rows of tests/keras/conformance.py (the table the tests check) through
lingpipe.keras.Pipeline, and PipelinedSequential where a row says so, under each of the
row's schedules, over 2 logical devices; writes bench/results/keras_conformance.json
and docs/keras_conformance.md (the table, with the machine and the date).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "keras_conformance.json")
PAGE = os.path.join(HERE, "..", "docs", "keras_conformance.md")


def Run() -> dict:
    common.Setup(2)
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "keras"))
    import conformance

    rows = []
    for name, feature in conformance.FEATURES.items():
        fronts = [(s, "Pipeline") for s in feature.schedules]
        if feature.sequential:
            fronts.append(("1f1b", "PipelinedSequential"))
        for schedule, front in fronts:
            figures = conformance.Compare(feature, schedule, front)
            print(f"{name} [{schedule}, {front}]: {figures}", flush=True)
            rows.append(
                dict(
                    feature=name,
                    schedule=schedule,
                    front=front,
                    tolerance=feature.tolerance,
                    **figures,
                )
            )
    refusals = []
    for what, (error, _) in conformance.REFUSALS.items():
        try:
            conformance.Refuse(what)
            message = "(not refused)"
        except error as e:
            message = str(e).strip()
        refusals.append(dict(what=what, error=error.__name__, message=message))
    today = datetime.date.today().isoformat()
    return dict(machine=common.Machine(), date=today, rows=rows, refusals=refusals)


def Page(result: dict) -> str:
    machine = result["machine"]
    lines = [
        "# Keras conformance",
        "",
        "Each Keras training feature through `lingpipe.keras.Pipeline` (and",
        "`PipelinedSequential` where marked) against the same plain Keras model: fit's",
        "weights and history over 2 epochs, then evaluate and predict, on 2 logical devices.",
        "Each figure is the largest difference relative to the plain model's largest value",
        "(`max |pipelined - plain| / max |plain|`). Written by `python",
        "bench/keras_conformance.py` from `bench/results/keras_conformance.json`; the tests",
        "(`tests/keras/test_conformance.py`) check every row against its tolerance.",
        "",
        f"Machine: {machine['cpu_count']} CPU cores ({machine['machine']}), TensorFlow "
        f"{machine['tf']}, Python {machine['python']}; {result['date']}.",
        "",
        "| feature | schedule | weights | history | evaluate | predict | tolerance |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        where = r["schedule"] + ("" if r["front"] == "Pipeline" else ", PipelinedSequential")
        figures = [r.get(k) for k in ("weights", "history", "evaluate", "predict")]
        cells = ["-" if v is None else f"{v:.1e}" for v in figures]
        lines.append(
            f"| {r['feature']} | {where} | " + " | ".join(cells) + f" | {r['tolerance']:g} |"
        )
    lines += ["", "## Refused, in one line, before any training step", ""]
    lines += ["| what | error | message |", "|---|---|---|"]
    for r in result["refusals"]:
        message = r["message"].replace("|", "\\|")
        lines.append(f"| {r['what']} | {r['error']} | {message} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table_only", action="store_true", help="rewrite the page from the JSON")
    args = parser.parse_args()
    if args.table_only:
        with open(RESULTS) as f:
            result = json.load(f)
    else:
        result = Run()
        common.WriteJson(RESULTS, result)
    with open(PAGE, "w") as f:
        f.write(Page(result))
    print(f"wrote {os.path.relpath(PAGE)} from {os.path.relpath(RESULTS)}")


if __name__ == "__main__":
    main()
