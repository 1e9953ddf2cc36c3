"""What the lower stage's tolerance check records with random samples only and with the calibration file's
real rows added (ethosu/families.real_feeds, issue 33), and what the real rows cost.

A benchmark script, not a test: it prints a markdown table. Build the specs once (any tree: the lower task's
config, and so its directory, is the same), then run it from the project root on the same specs and build dir:

    python -m npubuild build specs/ --build-dir /tmp/b --keep-going
    PYTHONPATH=. python bench/tolerance_real.py specs/*.yaml --build-dir /tmp/b [--json out.json] [--every-row]

Per INT lower task whose QDQ model the build dir holds: the model through the pipeline's passes, lowered for
its families by lower_families twice, without and with the task's calibration file (none: the two are the
same run, shown once). Per family that the tolerance check measures (check_partitioned: a split family, an own
graph that rounds differently, an exact one model.tosa's outputs refute): max_error_lsb before -> after, the
worst error of the random samples and of the real rows apart, the TOSA reference-model runs the check makes
and their CPU seconds (in process: the check runs no child), and the error the stage raises, if any.
--every-row: then each such family and model.tosa on every row of the calibration file, against the QDQ model
(what two rows miss), one JSON line per family.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from npubuild.config.load import load_specs
from npubuild.errors import StageError
from npubuild.ethosu import families
from npubuild.frontend.data import graph_inputs, load_arrays
from npubuild.frontend.passes import run_passes
from npubuild.tosa.run import OnnxSession
from npubuild.verify import partitioned


@dataclass
class CheckTally:
    """What the tolerance check did in one lower_families run, per family."""

    # family -> per check_partitioned call (the family's partitions, then its baseline's if measured): error per
    # sample, the random ones first
    errors: dict[str, list[list[float]]] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)  # family -> TOSA reference-model runs in the check
    cpu_s: dict[str, float] = field(default_factory=dict)  # family -> the check's CPU seconds
    family: str = ""
    inside: bool = False


@contextmanager
def tallied() -> Iterator[CheckTally]:
    """families.check_partitioned, its per-sample errors and its reference-model runs, counted per family."""
    tally = CheckTally()
    orig_split, orig_check = families.family_split, families.check_partitioned
    orig_worst, orig_run = families.worst_error, partitioned.run_tosa

    def family_split(model, partial, io, fam, *args, **kwargs):
        tally.family = fam
        return orig_split(model, partial, io, fam, *args, **kwargs)

    def check_partitioned(*args, **kwargs):
        tally.inside, start = True, time.process_time()
        tally.errors.setdefault(tally.family, []).append([])
        try:
            return orig_check(*args, **kwargs)
        finally:
            tally.inside = False
            fam = tally.family
            tally.cpu_s[fam] = tally.cpu_s.get(fam, 0.0) + time.process_time() - start

    def worst_error(model, feeds, ref, worst=0.0, got=None):
        err = orig_worst(model, feeds, ref, 0.0, got)
        if tally.inside:
            tally.errors[tally.family][-1].append(err)
        return max(worst, err)

    def run_tosa(*args, **kwargs):
        if tally.inside:
            tally.runs[tally.family] = tally.runs.get(tally.family, 0) + 1
        return orig_run(*args, **kwargs)

    families.family_split, families.check_partitioned = family_split, check_partitioned
    families.worst_error, partitioned.run_tosa = worst_error, run_tosa
    try:
        yield tally
    finally:
        families.family_split, families.check_partitioned = orig_split, orig_check
        families.worst_error, partitioned.run_tosa = orig_worst, orig_run


def measure(model: onnx.ModelProto, fams: list[str], optimise: str, calibration: Path | None) -> dict:
    """One lower_families run's family records and check tally (the stage's error instead, where it raises)."""
    with tempfile.TemporaryDirectory() as tmp, tallied() as tally:
        start = time.process_time()
        try:
            io, _ = families.lower_families(model, "int", Path(tmp), fams, optimise=optimise, calibration=calibration)
            recs = {f: {"max_error_lsb": r.max_error_lsb, "same_as_model_tosa": r.same_as_model_tosa,
                        "files": [p.file for p in r.partitions]} for f, r in io.families.items()}
            error = None
        except StageError as exc:
            recs, error = {}, str(exc)
        return {"families": recs, "error": error, "errors": tally.errors, "runs": tally.runs, "cpu_s": tally.cpu_s,
                "stage_cpu_s": time.process_time() - start}


def every_row(model: onnx.ModelProto, fams: list[str], optimise: str, calibration: Path) -> list[dict]:
    """Each family the tolerance check measures, and model.tosa, against the QDQ model on every calibration row."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        lower_dir = Path(tmp)
        io, _ = families.lower_families(model, "int", lower_dir, fams, optimise=optimise)
        arrays = load_arrays(calibration, model)
        names = [n for n, _, _ in graph_inputs(model)]
        rows = [{k: np.asarray(arrays[k][i]) for k in names} for i in range(min(arrays[k].shape[0] for k in names))]
        qdq = OnnxSession(lower_dir / "model_partitioning.onnx")
        refs = [qdq(feeds) for feeds in rows]
        whole = partitioned.PartitionedModel(lower_dir, [io.whole_partition([])], io.outputs) if io.whole_graph \
            else None
        base = [partitioned.worst_error(whole, f, r) for f, r in zip(rows, refs, strict=True)] if whole else []
        for fam, rec in io.families.items():
            if rec.max_error_lsb is None or rec.same_as_model_tosa:
                continue
            model_of = partitioned.PartitionedModel(lower_dir, rec.partitions, io.outputs)
            start = time.process_time()
            errs = [partitioned.worst_error(model_of, f, r) for f, r in zip(rows, refs, strict=True)]
            out.append({"family": fam, "rows": len(rows), "error": errs, "model_tosa_error": base,
                        "over_model_tosa_plus_1": [i for i, e in enumerate(errs) if e > (base[i] if base else 0) + 1],
                        "cpu_s": round(time.process_time() - start, 2)})
    return out


def lower_tasks(specs: list[Path], build_dir: Path) -> Iterator[tuple[str, Path, dict, Path | None]]:
    """Each INT lower task of the build dir (stages/lower/*/stage.json) for a model of the specs, with the QDQ
    model it lowered (found by its input task's key: another tree's stage keys differ, its source being in
    them) and the model's calibration file: label, model, config, calibration."""
    calibration = {b.model_name: b.calibration_npy for b in load_specs(specs)}
    for record in sorted((build_dir / "stages" / "lower").glob("*/stage.json")):
        config = json.loads(record.read_text())["config"]
        label = record.parent.name.rsplit("-", 1)[0]
        if label not in calibration or config["pipeline"]["profile"] != "int":
            continue
        src = next(iter(sorted((build_dir / "stages").glob(f"*/{label}-{config['input'][:8]}/model_qdq.onnx"))), None)
        if src is not None:
            yield label, src, config, calibration[label]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+", type=Path)
    ap.add_argument("--build-dir", type=Path, required=True)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--every-row", action="store_true", help="also every calibration row, per family checked")
    args = ap.parse_args()
    out = {}
    print("| model | family | graph | before | after | random / real rows | check runs | check CPU s |")
    # check runs and CPU: the family's check and, where its error is over MAX_PARTITION_LSB, its baseline's
    print("|---|---|---|---:|---:|---|---|---|")
    for label, src, config, calibration in lower_tasks(args.specs, args.build_dir):
        model = onnx.load(str(src))
        model = ir.serde.serialize_model(run_passes(ir.serde.deserialize_model(model), config["pipeline"]["passes"]))
        fams, optimise = list(config.get("families", [])), config.get("optimise", "performance")
        before = measure(model, fams, optimise, None)
        after = measure(model, fams, optimise, calibration) if calibration is not None else before
        out[label] = {"calibration": str(calibration) if calibration else None, "before": before, "after": after}
        for fam in fams:
            b, a = before["families"].get(fam, {}), after["families"].get(fam, {})
            errs = (after["errors"].get(fam) or [[]])[0]  # the family's own check; a baseline's is after it
            n_random = len((before["errors"].get(fam) or [[]])[0])
            real = f"{max(errs[n_random:]):g}" if errs[n_random:] else "none"  # no calibration file: no rows
            split = f"{max(errs[:n_random], default=0):g} / {real}" if errs else "-"
            graph = "model.tosa" if b.get("files") == ["model.tosa"] else \
                ("same_as_model_tosa" if b.get("same_as_model_tosa") else f"{len(b.get('files', []))} part(s)")
            runs = f"{before['runs'].get(fam, 0)} -> {after['runs'].get(fam, 0)}"
            cpu = f"{before['cpu_s'].get(fam, 0):.2f} -> {after['cpu_s'].get(fam, 0):.2f}"
            print(f"| {label} | {fam} | {graph} | {b.get('max_error_lsb')} | "
                  f"{a.get('max_error_lsb') if not after['error'] else after['error']} | {split} | {runs} | {cpu} |",
                  flush=True)
        if args.every_row and calibration is not None:
            for line in every_row(model, fams, optimise, calibration):
                out[label].setdefault("every_row", []).append(line)
                print(json.dumps({"model": label, **line}), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
