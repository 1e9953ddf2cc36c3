"""Issue 34's hardening cases, measured: `python bench/hardening.py --issue34 [--tree DIR]`.

Each probe runs npubuild in a subprocess (`--tree DIR`: the npubuild package of another checkout, e.g. an
extract of main, put first on PYTHONPATH; so the same probes measure before and after) and prints one row:
a run stopped by a failure while a model was edited, `-n` far past the machine (process count and memory of
the whole process tree, sampled), a planted graph in an unkeyed cache, a cache URL without a key, restoring a
256 MiB entry (peak RSS), full disks (a tmpfs: root only), each input fault (exit code, lines, whether it is
called internal), a NaN baseline, debris in a stage's subdirectories. `-n 100000` runs only with --huge-n
(on the code before it forked ~4,000 processes: do not point it at an old tree).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import onnx
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from npbtest.builds import flip_weight_signs, tiny_project  # noqa: E402


class Runner:
    """npubuild from this checkout or from `tree`, with a clean environment (no cache variables)."""

    def __init__(self, tree: Path | None):
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("NPUBUILD_")}
        if tree is not None:
            self.env["PYTHONPATH"] = str(tree)

    def run(self, args: list[str], cwd: Path, env: dict | None = None, timeout: float = 900,
            **kw) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "npubuild", *args], cwd=cwd, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout, **kw)

    def python(self, code: str, cwd: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=self.env, capture_output=True, text=True,
                              timeout=900)


def _lines(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    internal = " internal" if "internal error" in err else ""
    trace = " traceback" if "Traceback" in err else ""
    return f"{len(lines)} line(s){internal}{trace}"


def _kws_project(root: Path) -> Path:
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    shutil.copy(REPO / "configs" / "kws.yaml", root / "configs" / "kws.yaml")
    shutil.copy(REPO / "configs" / "models" / "ds_cnn.onnx", root / "configs" / "models" / "ds_cnn.onnx")
    return root


# ------------------------------------------------------------------------------------------------ the probes

def stale(r: Runner, tmp: Path) -> tuple[str, str]:
    root = tmp / "stale"
    models = tiny_project(root, 2)
    r.run(["build", "-q", "--cache", "off"], root)
    before = {b["spec"]: b for b in json.loads((root / "build" / "report.json").read_text())["builds"]}
    (root / "configs" / "models" / "broken.onnx").write_bytes(b"not ONNX")
    spec = root / "configs" / "s0.yaml"
    spec.write_text(spec.read_text().replace("models/m0.onnx", "models/broken.onnx"))
    flip_weight_signs(models[1], 1)
    proc = r.run(["build", "-q", "--cache", "off"], root)
    b = {e["spec"]: e for e in json.loads((root / "build" / "report.json").read_text())["builds"]}["s1"]
    now = hashlib.sha256(models[1].read_bytes()).hexdigest()
    sha = "current" if b["inputs"]["model_sha256"] == now else (
        "the edited model's before the edit" if b["inputs"]["model_sha256"] else "null")
    snr = b["metrics"].get("tosa_snr_db")
    summary = next((ln for ln in proc.stdout.splitlines() if "builds:" in ln), "").split("builds: ")[-1].split(" (")[0]
    same = " (the earlier run's)" if snr is not None and snr == before["s1"]["metrics"].get("tosa_snr_db") else ""
    return ("a failure stops the run before an edited model's build (no --keep-going)",
            f"edited build {b['status']}, model sha256 {sha}, SNR {snr}{same}; summary `{summary}`")


def _tree_sampler(pid: int, stop: threading.Event, peak: dict) -> None:
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    while not stop.is_set():
        try:
            procs = [root, *root.children(recursive=True)]
            rss = 0
            for p in procs:
                try:
                    rss += p.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            peak["procs"] = max(peak.get("procs", 0), len(procs))
            peak["rss"] = max(peak.get("rss", 0), rss)
        except psutil.NoSuchProcess:
            return
        time.sleep(0.01)


def many_jobs(r: Runner, tmp: Path, n: int) -> tuple[str, str]:
    root = _kws_project(tmp / f"jobs{n}")
    stop, peak = threading.Event(), {}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "npubuild", "build", "-q", "--cache", "off", "-n", str(n)],
                            cwd=root, env=r.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = threading.Thread(target=_tree_sampler, args=(proc.pid, stop, peak))
    sampler.start()
    _, err = proc.communicate(timeout=1800)
    stop.set()
    sampler.join()
    note = next((ln for ln in err.splitlines() if ln.startswith(("note:", "error:"))), "")
    run = json.loads((root / "build" / "run.json").read_text()) if (root / "build" / "run.json").is_file() else {}
    tasks = sum(len(run.get(k, [])) for k in ("executed", "cached", "failed", "blocked", "not_run"))
    return (f"kws (3 targets, {tasks} tasks) -n {n}, cold",
            f"exit {proc.returncode}, {time.perf_counter() - start:.0f} s, peak {peak.get('procs', 0)} processes, "
            f"{peak.get('rss', 0) / 2**30:.2f} GiB RSS (sampled every 10 ms)" + (f"; `{note[:110]}`" if note else ""))


def planted(r: Runner, tmp: Path) -> tuple[str, str]:
    root = tmp / "planted"
    tiny_project(root, 1)
    cache = tmp / "planted-cache"
    r.run(["build", "-q", "--cache", str(cache), "--build-dir", "b0"], root)
    clean = json.loads((root / "b0" / "report.json").read_text())["builds"][0]["metrics"]["tosa_snr_db"]
    other = tmp / "other"
    models = tiny_project(other, 1)
    flip_weight_signs(models[0], 0)
    r.run(["build", "-q", "--cache", "off"], other)
    graph = next((other / "build" / "stages" / "lower").glob("*/model.tosa")).read_bytes()
    (mpath,) = [m for m in cache.glob("*/*/manifest.json") if "model.tosa" in json.loads(m.read_text())["files"]]
    manifest = json.loads(mpath.read_text())
    info = manifest["files"]["model.tosa"]
    (mpath.parent / info["path"]).write_bytes(graph)
    info.update(sha256=hashlib.sha256(graph).hexdigest(), size=len(graph))
    mpath.write_text(json.dumps(manifest))
    r.run(["build", "-q", "--cache", str(cache), "--build-dir", "b1"], root)
    run = json.loads((root / "b1" / "run.json").read_text())
    said = {s: ("restored" if any(t.startswith(f"{s}:") for t in run["from_cache"]) else "ran")
            for s in ("lower", "tosa-check", "vela")}
    snr = json.loads((root / "b1" / "report.json").read_text())["builds"][0]["metrics"]["tosa_snr_db"]
    return ("a planted model.tosa in an unkeyed cache (manifest sha256 updated), fresh build dir",
            f"lower {said['lower']}, tosa-check {said['tosa-check']}, vela {said['vela']}; reported SNR "
            f"{snr:.1f} dB ({'the genuine graph' + chr(39) + 's' if snr == clean else 'the planted graph' + chr(39) + 's'})")


def url_cache(r: Runner, tmp: Path) -> tuple[str, str]:
    root = tmp / "url"
    tiny_project(root, 1)
    proc = r.run(["build", "-q", "--cache", f"file://{tmp / 'shared'}"], root)
    return ("a cache reached over a URL (file://) without a key", f"exit {proc.returncode}, {_lines(proc.stderr)}")


def streamed(r: Runner, tmp: Path) -> tuple[str, str]:
    src = tmp / "entry"
    src.mkdir()
    with open(src / "big.bin", "wb") as f:
        for i in range(256):
            f.write(bytes([i]) * (1 << 20))
    put = f"""
from pathlib import Path
from npubuild.engine.cache import StageCache
StageCache({str(tmp / 'bigcache')!r}, use_env_key=False).put('ab' * 20, Path({str(src)!r}), {{}}, set())
"""
    r.python(put, tmp)  # in its own process: the restore's peak below is the restore's alone
    code = f"""
import resource, time
from pathlib import Path
from npubuild.engine.cache import StageCache
c = StageCache({str(tmp / 'bigcache')!r}, use_env_key=False)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
assert c.get('ab' * 20, Path({str(tmp / 'dest')!r}), {{'big.bin'}}) is not None
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base, time.perf_counter() - t)
"""
    proc = r.python(code, tmp)
    rss_kib, seconds = proc.stdout.split() if proc.returncode == 0 else ("?", "?")
    return ("restoring a 256 MiB entry file (peak RSS added)",
            f"{int(rss_kib) / 1024:.0f} MiB, {float(seconds):.1f} s" if rss_kib != "?" else proc.stderr[-200:])


def _mount(where: Path, kib: int) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def full_disks(r: Runner, tmp: Path) -> list[tuple[str, str]]:
    root = _kws_project(tmp / "full")
    spec = root / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("[ethos-u55-128, ethos-u65-256, ethos-u85-256]", "[ethos-u55-128]"))
    r.run(["build", "-q", "--cache", "off", "--build-dir", str(tmp / "measure")], root)
    need = sum(p.stat().st_size for p in (tmp / "measure").rglob("*") if p.is_file()) // 1024
    rows = []
    for share in (20, 2, 1.15):
        disk = tmp / f"disk{share}"
        kib = int(need / share)
        if not _mount(disk, kib):
            return [("full disks", "skipped: cannot mount a tmpfs (not root)")]
        try:
            proc = r.run(["build", "-q", "--cache", "off", "--build-dir", str(disk / "b")], root)
            first = proc.stderr.strip().splitlines()[0][:150] if proc.stderr.strip() else ""
            rows.append((f"build dir on a {kib} KiB tmpfs (the build needs {need} KiB)",
                         f"exit {proc.returncode}, {_lines(proc.stderr)}: `{first}`"))
        finally:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    disk = tmp / "cachedisk"
    if _mount(disk, 64):
        try:
            proc = r.run(["build", "-q", "--cache", str(disk / "cache"), "--build-dir", str(tmp / "b-cache")], root)
            first = proc.stderr.strip().splitlines()[0][:150] if proc.stderr.strip() else ""
            rows.append(("shared cache on a 64 KiB tmpfs", f"exit {proc.returncode}, {_lines(proc.stderr)}: `{first}`"))
        finally:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    return rows


def input_faults(r: Runner, tmp: Path) -> list[tuple[str, str]]:
    root = _kws_project(tmp / "faults")
    spec = root / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("[ethos-u55-128, ethos-u65-256, ethos-u85-256]", "[ethos-u55-128]"))
    r.run(["build", "-q", "--cache", "off"], root)
    deep = tmp / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    flipped = bytearray((REPO / "configs" / "models" / "ds_cnn.onnx").read_bytes())
    flipped[12] ^= 0xFF  # inside the producer name: a string that is no longer UTF-8
    (root / "flipped.onnx").write_bytes(bytes(flipped))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    passthrough = helper.make_model(helper.make_graph([], "g", [x], [x]), opset_imports=[helper.make_opsetid("", 17)])
    passthrough.ir_version = 8
    onnx.save(passthrough, root / "passthrough.onnx")
    nan = json.loads((root / "build" / "report.json").read_text())
    nan["builds"][0]["metrics"]["tosa_snr_db"] = float("nan")
    (tmp / "nan.json").write_text(json.dumps(nan))
    (tmp / "empty").mkdir()
    (tmp / "bad.yaml").write_bytes(b"version: 1\nname: k\xe9ws\n")
    cases = [
        ("compile --target ../../../../etc/passwd", ["compile", "configs/models/ds_cnn.onnx", "--target",
                                                     "../../../../etc/passwd", "--build-dir", "bc"], {}),
        ("debug-numerics --samples 1000000000", ["debug-numerics", "configs/kws.yaml", "--samples", "1000000000"], {}),
        ("report --baseline (100000-deep JSON)", ["report", "--baseline", str(deep)], {}),
        ("--cache nosuchproto://x", ["build", "-q", "--cache", "nosuchproto://x"], {}),
        ("missing $NPUBUILD_CACHE_KEY_FILE", ["build", "-q", "--build-dir", "bk", "--cache", str(tmp / "kc")],
         {"NPUBUILD_CACHE_KEY_FILE": str(tmp / "nokey")}),
        ("a byte-flipped ONNX header (byte 12, in the producer name)", ["compile", "flipped.onnx", "--target", "ethos-u55-128",
                                                 "--build-dir", "bf"], {}),
        ("a model whose output is its input", ["compile", "passthrough.onnx", "--target", "ethos-u55-128",
                                              "--build-dir", "bp"], {}),
        ("report --baseline with a NaN metric", ["report", "--baseline", str(tmp / "nan.json")], {}),
        ("report --junit DIR", ["report", "--junit", str(tmp)], {}),
        ("validate DIR without specs", ["validate", str(tmp / "empty")], {}),
        ("validate invalid-UTF-8 YAML", ["validate", str(tmp / "bad.yaml")], {}),
    ]
    rows = []
    for label, args, env in cases:
        proc = r.run(args, root, env=env)
        said = proc.stderr.strip().splitlines()[-1][:120] if proc.stderr.strip() else proc.stdout.strip()[-80:]
        if "No regression" in proc.stdout:
            said += " / stdout: No regression."
        rows.append((label, f"exit {proc.returncode}, {_lines(proc.stderr)}: `{said.replace('|', '/')}`"))
    return rows


def debris(r: Runner, tmp: Path) -> tuple[str, str]:
    root = _kws_project(tmp / "debris")
    spec = root / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("[ethos-u55-128, ethos-u65-256, ethos-u85-256]", "[ethos-u55-128]"))
    r.run(["build", "-q", "--cache", "off"], root)
    (vela,) = (root / "build" / "stages" / "vela").iterdir()
    planted = [vela / "firmware" / ".a.c.x.tmp", vela / "raw" / ".b.npz.y.tmp", vela / ".c.json.z.tmp"]
    for p in planted:
        p.write_bytes(b"x")
    (vela / "stage.json").unlink()
    r.run(["build", "-q", "--cache", "off"], root)
    left = [p.relative_to(vela).as_posix() for p in planted if p.exists()]
    clean = r.run(["clean", "--stale"], root).stdout.strip()
    return ("temp files in vela's firmware/, raw/ and top level, then the task reruns",
            f"{len(left)} of 3 left ({', '.join(left) or 'none'}); then clean --stale: `{clean[:90]}`")


def main(argv: list[str]) -> int:
    tree = Path(argv[argv.index("--tree") + 1]).resolve() if "--tree" in argv else None
    r = Runner(tree)
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="npubuild-issue34-") as d:
        tmp = Path(d)
        rows.append(stale(r, tmp))
        rows.append(many_jobs(r, tmp, 50))
        if "--huge-n" in argv:
            rows.append(many_jobs(r, tmp, 100000))
        rows.append(planted(r, tmp))
        rows.append(url_cache(r, tmp))
        rows.append(streamed(r, tmp))
        rows += full_disks(r, tmp)
        rows += input_faults(r, tmp)
        rows.append(debris(r, tmp))
    print(f"| case | {'tree ' + str(tree) if tree else 'this checkout'} |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    return 0
