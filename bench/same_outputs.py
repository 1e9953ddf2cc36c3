"""Show that two npubuild trees build the same outputs: TOSA files byte for byte, report.json equal.

For refactors that must not change behaviour. Builds every spec in configs/ plus a few extra builds
that reach other paths (a host-partitioned U55 model, raw Vela output checked by npu-sim, U65's own
lowering, the FP pipeline) with each tree, then compares:

- every file the lower stage wrote (model.tosa, <family>_*.tosa, host .onnx, io.json) per build;
- Vela's summary.json and firmware files per build;
- report.json, after removing what legitimately differs: run ids, seconds, cached flags, the npubuild
  source fingerprint in versions and in the stage-dir hashes of paths.

    python bench/same_outputs.py REV_A [REV_B]      # git revisions; REV_B defaults to the working tree
    python bench/same_outputs.py REV_A REV_B --b-families   # B lowers only its targets' families: compare those
    python bench/same_outputs.py X --keep DIR --compare-only [--b-families]   # again, on DIR's two builds

Each revision is checked out into a temporary git worktree and run with the current interpreter and
PYTHONPATH pointing at it. Exits 1 and lists the differences if there are any.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
HASH_DIR = re.compile(r"-[0-9a-f]{8}(?=/|$)")
VOLATILE = {"seconds", "cached", "from_cache", "run_id", "layers_path"}

EXTRA_SPEC = """version: 1
name: extra
models:
  cmp:
    path: models/cmp.onnx
    input_shapes: {x: [1, 4, 8, 8]}
    calibration: {random: {samples: 16, seed: 0}}
  ds_cnn:
    path: models/ds_cnn.onnx
    input_shapes: {input: [1, 1, 49, 10]}
    calibration: {random: {samples: 16, seed: 0}}
  unet:
    path: models/unet.onnx
    input_shapes: {input: [1, 1, 64, 64]}
    calibration: {random: {samples: 16, seed: 0}}
targets:
  - ethos-u65-256
  - {extends: ethos-u55-128, name: u55-raw, vela: {output_format: raw}}
verify: {tosa: true, samples: 4}
"""
FP_SPEC = """version: 1
name: extra_fp
models:
  resnet8:
    path: models/resnet8.onnx
    calibration: {random: {samples: 8, seed: 0}}
targets: [ethos-u55-128]
pipeline: fp
verify: {tosa: true, samples: 4}
"""


def compare_select_model() -> onnx.ModelProto:
    """Conv -> Greater/Relu -> Where -> Conv: GREATER and SELECT run on the host for U55."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("Greater", ["c", "thr"], ["g"], name="gt"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Where", ["g", "c", "r"], ["s"], name="sel"),
             helper.make_node("Conv", ["s", "w2"], ["y"], name="conv_b")]
    inits = [numpy_helper.from_array(rng.uniform(-1, 1, (8, 4, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.uniform(-1, 1, (8, 8, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(0.25, np.float32), "thr")]
    graph = helper.make_graph(nodes, "cmp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def make_project(root: Path) -> Path:
    """configs/ as shipped plus the extra specs, in a scratch project of its own."""
    shutil.copytree(REPO / "configs", root / "configs")
    (root / "dodo.py").write_text("# scratch project\n")
    onnx.save(compare_select_model(), root / "configs" / "models" / "cmp.onnx")
    (root / "configs" / "extra.yaml").write_text(EXTRA_SPEC)
    (root / "configs" / "extra_fp.yaml").write_text(FP_SPEC)
    return root


def checkout(rev: str | None, scratch: Path) -> Path:
    if rev is None:
        return REPO
    tree = scratch / f"tree-{rev.replace('/', '_')}"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(tree), rev], check=True,
                   capture_output=True)
    return tree


def build(tree: Path, project: Path, out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-m", "npubuild", "build", str(project / "configs"), "--build-dir",
                           str(out), "-n", "2", "--keep-going", "--progress", "plain", "--cache", "off"],
                          cwd=project, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"build with {tree} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")


def normalised(obj, build_dir: str):
    """report.json without what differs between two trees building the same thing."""
    if isinstance(obj, dict):
        return {k: normalised(v, build_dir) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [normalised(v, build_dir) for v in obj]
    if isinstance(obj, str):
        return HASH_DIR.sub("-HASH", obj.replace(build_dir, "BUILD"))
    return obj


FAMILY_KEYED = ("families", "partitioning", "partitioned")  # io.json, lower and tosa-check metrics


def only_families(obj, families: set[str]):
    """`obj` with the per-family entries (FAMILY_KEYED dicts) of the other families left out."""
    if isinstance(obj, dict):
        return {k: {f: only_families(r, families) for f, r in v.items() if f in families}
                if k in FAMILY_KEYED and isinstance(v, dict) else only_families(v, families) for k, v in obj.items()}
    if isinstance(obj, list):
        return [only_families(v, families) for v in obj]
    return obj


def built_families(build_dir: Path, report: dict) -> dict[str, set[str]]:
    """Per build id: the lowering families its lower stage built (io.json)."""
    out = {}
    for b in report["builds"]:
        tosa = b.get("artifacts", {}).get("tosa")
        io = Path(tosa).parent / "io.json" if tosa else None
        if io is not None and io.is_file():
            out[f"{b['spec']}/{b['model']}/{b['target']}"] = set(json.loads(io.read_text()).get("families", {}))
    return out


def stage_files(build_dir: Path, report: dict, families: dict[str, set[str]] | None = None) -> dict[str, bytes]:
    """Per build id: the lower stage's and the vela stage's files (not the records, which carry keys); with
    `families`, only the files and io.json entries of those families of each build (the others' are left out)."""
    out = {}
    for b in report["builds"]:
        bid = f"{b['spec']}/{b['model']}/{b['target']}"
        arts = b.get("artifacts", {})
        dirs = {"lower": Path(arts["tosa"]).parent} if "tosa" in arts else {}
        if "vela" in arts:
            vela = Path(arts["vela"]).parent
            dirs["vela"] = vela.parent if vela.name == "raw" else vela
        keep = families.get(bid) if families is not None else None
        others = {"u55", "u65", "u85", "u85wide"} - keep if keep is not None else set()
        for stage, d in dirs.items():
            for p in sorted(d.rglob("*")):
                if p.is_file() and p.name not in ("stage.json", "inputs.json", "vela.log") \
                        and not p.name.endswith(".vela.log") and not p.name.startswith("."):
                    if stage == "lower" and p.name.split("_")[0] in others:
                        continue  # a family this build's lower stage need not build
                    data = p.read_bytes()
                    if p.name in ("summary.json", "npubuild_deployment.json") or p.suffix == ".json":
                        obj = normalised(json.loads(data), str(build_dir))
                        data = json.dumps(obj if keep is None else only_families(obj, keep), sort_keys=True).encode()
                    out[f"{bid} {stage}/{p.relative_to(d)}"] = data
    return out


def shared(x, y, path: str, one_sided: set[str]):
    """Both sides restricted to the mapping keys they both have (a newer tree may add report fields);
    the keys only one side has go into `one_sided`, listed but not compared."""
    if isinstance(x, dict) and isinstance(y, dict):
        one_sided.update(f"{path}{k}" for k in set(x) ^ set(y))
        both = [k for k in x if k in y]
        pairs = {k: shared(x[k], y[k], f"{path}{k}.", one_sided) for k in both}
        return {k: v[0] for k, v in pairs.items()}, {k: v[1] for k, v in pairs.items()}
    return x, y


def compare(a: Path, b: Path, b_families: bool = False) -> list[str]:
    """The differences between the builds in `a` and `b`; with `b_families`, A's builds restricted to the
    lowering families B's built (B lowers only the families its targets need)."""
    ra, rb = (json.loads((d / "report.json").read_text()) for d in (a, b))
    diffs = []
    for r in (ra, rb):
        r["versions"].pop("npubuild", None)
    families = built_families(b, rb) if b_families else None
    na, nb = normalised(ra, str(a)), normalised(rb, str(b))
    if families is not None:
        for x in (na, nb):
            x["builds"] = [only_families(e, families.get(f"{e['spec']}/{e['model']}/{e['target']}", set()))
                           for e in x["builds"]]
    one_sided: set[str] = set()
    pairs = [shared(x, y, "", one_sided) for x, y in zip(na["builds"], nb["builds"], strict=False)]
    if one_sided:
        print(f"report fields on one side only (not compared): {', '.join(sorted(one_sided))}")
    for x, y in pairs:
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            mkeys = sorted(k for k in set(x.get("metrics", {})) | set(y.get("metrics", {}))
                           if x.get("metrics", {}).get(k) != y.get("metrics", {}).get(k))
            diffs.append(f"report {x.get('spec')}/{x.get('model')}/{x.get('target')}: {keys} metrics {mkeys}")
    if len(na["builds"]) != len(nb["builds"]) or na["versions"] != nb["versions"]:
        diffs.append("report: different build lists or tool versions")
    fa, fb = stage_files(a, ra, families), stage_files(b, rb, families)
    for name in sorted(set(fa) | set(fb)):
        if fa.get(name) != fb.get(name):
            diffs.append(f"file {name}: {'missing in A' if name not in fa else 'missing in B' if name not in fb else 'differs'}")
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev_a")
    ap.add_argument("rev_b", nargs="?", help="default: the working tree")
    ap.add_argument("--keep", type=Path, help="build into this directory and keep it")
    ap.add_argument("--b-families", action="store_true",
                    help="compare only the lowering families B built (B lowers only those its targets need)")
    ap.add_argument("--compare-only", action="store_true", help="compare the builds already in --keep")
    args = ap.parse_args()
    if args.compare_only:
        diffs = compare(args.keep / "build-a", args.keep / "build-b", args.b_families)
        print("\n".join(diffs) or "identical")
        return 1 if diffs else 0
    scratch = Path(tempfile.mkdtemp(prefix="npb-same-")) if args.keep is None else args.keep
    trees = []
    try:
        outs = []
        for side, rev in (("a", args.rev_a), ("b", args.rev_b)):
            tree = checkout(rev, scratch)
            trees.append(tree)
            project = make_project(scratch / f"project-{side}")
            out = scratch / f"build-{side}"
            build(tree, project, out)
            outs.append(out)
        diffs = compare(*outs, args.b_families)
        n = len(json.loads((outs[0] / "report.json").read_text())["builds"])
        files = len(stage_files(outs[0], json.loads((outs[0] / "report.json").read_text())))
        if diffs:
            print("\n".join(diffs))
            print(f"{len(diffs)} difference(s) over {n} builds and {files} stage files")
            return 1
        print(f"identical: {n} builds' report entries and {files} lower/vela stage files")
        return 0
    finally:
        for tree in trees:
            if tree != REPO:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
