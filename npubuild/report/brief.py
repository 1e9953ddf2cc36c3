"""One-line descriptions of a build that every output shares: why it failed, and its headline figures.

The progress lines, the closing summary, report.md/html, the baseline comparison and JUnit all say the
same thing about a build, in the same words.
"""

from __future__ import annotations

from npubuild.errors import plain_message
from npubuild.report.status import Status, passed, placement_status


def num(v, digits: int = 4) -> str:
    """A figure as people read it: `0.2719`, `271856`, `37.1`; `-` when absent."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if abs(v) >= 10 ** digits:
            return f"{v:.0f}"
        if v != 0 and abs(v) < 1e-3:
            return f"{v:.2e}"
        return f"{v:.{digits}g}"
    return str(v)


def human_bytes(n: float) -> str:
    """`512 B`, `67.2 KiB`, `67.2 MiB`, `1.3 GiB`: a size in the largest binary unit that keeps it >= 1."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def gate_text(g: dict) -> str:
    """`gate max_sram_kib failed: sram_kib = 176, limit 128` (figures as people read them, not raw floats)."""
    value = "not measured" if g.get("value") is None else num(g["value"])
    return f"gate {g['name']} failed: {g['metric']} = {value}, limit {num(g['limit'])}"


def gate_failure_text(g: dict, metrics: dict) -> str:
    """A failed gate's line, and for the collapse gate which outputs collapsed and how far from float."""
    return gate_text(g) + (collapse_text(metrics) if g["name"] == "max_collapsed_outputs" else "")


def collapse_text(metrics: dict) -> str:
    """` ('scores' 0.4 dB, 37.2 LSB mean vs float on 4 held-back samples)`: what collapsed (verify/accuracy.py)."""
    outs = [(k, o) for k, o in (metrics.get("float_outputs") or {}).items() if o.get("collapsed")]
    if not outs:
        return ""
    parts = [f"'{k}' {o['snr_db']:.1f} dB" + (f", {o['mean_error_lsb']:.1f} LSB mean" if o.get("mean_error_lsb")
                                               is not None else "") for k, o in outs[:3]]
    return (f" ({'; '.join(parts)} vs float on {metrics.get('float_samples')} {metrics.get('float_samples_from')} "
            f"samples: {collapsed_model(metrics.get('precision'))})")


def collapsed_model(precision: dict | None) -> str:
    """Which quantised model collapsed, and for an int8 one what may hold it: 16-bit activations keep 256 times
    the levels (mp_hand_landmark_lite's world landmarks 4.1 -> 17.4 dB against float). A range no activation
    precision spans (oww_melspectrogram's log power: 2.3 dB int8, 3.9 dB 16x8) is held by layers kept in float on the
    host (35.7 dB: bench/precision_real.md)."""
    if not precision:
        return ("the int8 model has collapsed; 16-bit activations (quantization: {activations: int16}, or "
                "precision: auto with a budget) may hold it")
    if precision.get("int16_groups") == precision.get("groups"):
        return ("the model has collapsed with every activation in 16 bits; what no integer grid holds can stay in float "
                "on the host CPU (quantization.layers: {NODE: {activations: float}}, or precision: auto with "
                "host_float: true in its budget; npubuild debug-numerics names where the error jumps)")
    return (f"the mixed-precision model has collapsed ({precision.get('int16_groups')} of {precision.get('groups')} "
            "activation groups in 16 bits" + ("" if precision.get("float_layers") else
                                             "; layers kept in float on the host may hold it") + ")")


def eval_text(metrics: dict) -> str | None:
    """`top1_agreement 0.891 (QDQ 0.906)`: the spec's evaluate: metric on the deployed graph, or None."""
    score = metrics.get("eval_score")
    if not isinstance(score, (int, float)):
        return None
    qdq = metrics.get("eval_qdq_score")
    return f"{metrics.get('eval_metric')} {num(score)}" + (f" (QDQ {num(qdq)})" if isinstance(qdq, (int, float)) else "")


def failure_cause(entry: dict) -> str | None:
    """Why a report entry did not pass: the failed stage and its first error line, else the gates that fell
    short, else what kept it from being built; None for a passed build."""
    if passed(entry.get("status")):
        return None
    for stage, s in entry.get("stages", {}).items():
        if s.get("status") == "failed" and s.get("error"):
            return f"{stage}: {plain_message(s['error'])}"
    if entry.get("errors"):
        return plain_message(entry["errors"][0])
    bad = [g for g in entry.get("gates", []) if not g.get("ok")]
    if bad:
        return "; ".join(gate_failure_text(g, entry.get("metrics") or {}) for g in bad)
    missing = [(k, s) for k, s in entry.get("stages", {}).items() if s.get("status") == "skipped" and "reason" not in s]
    if missing:
        stage, s = missing[0]
        why = s.get("not_run") or "an earlier task failed or the run stopped"
        return f"not built: stage {stage} did not run ({why})"
    return str(entry.get("status", "failed"))


def pools_text(metrics: dict) -> str:
    """`sram 72.0/128 KiB (56%)`, per pool; a model split around host nodes has a set of pools per NPU
    partition, each labelled: `NPU part 0: sram 10.1/384 KiB (3%), ...; NPU part 2: ...`."""
    by_part: dict[int, list[str]] = {}
    for p in metrics.get("pools") or []:
        size = p.get("size_kib") or 0
        pct = f" ({p['used_kib'] / size:.0%})" if size else ""
        by_part.setdefault(int(p.get("partition", 0)), []).append(f"{p['pool']} {p['used_kib']:.1f}/{size:g} KiB{pct}")
    if len(by_part) <= 1:
        return ", ".join(t for texts in by_part.values() for t in texts)
    return "; ".join(f"NPU part {k}: " + ", ".join(v) for k, v in sorted(by_part.items()))


def result_line(build_id: str, entry: dict, where: str | None = None) -> str:
    """A finished build's one line: `ok     kws/ds_cnn/ethos-u55-128  0.2719 ms (3,678 inf/s), sram ...`, or
    `FAILED kws/ds_cnn/ethos-u55-128 (vela)` naming where it failed (its error line says why). `where`: the
    failed stage or gates when known; else read from the report entry."""
    if where is None and entry.get("status") is not None and not passed(entry["status"]):
        failed = [k for k, s in entry.get("stages", {}).items() if s.get("status") == "failed"]
        where = ", ".join(failed or [f"gate {g['name']}" for g in entry.get("gates", []) if not g.get("ok")]) or \
            str(entry.get("status"))
    if where:
        return f"FAILED {build_id} ({where})"
    metrics = entry.get("metrics") or {}
    figures = headline(metrics, placement_status(metrics))
    return f"ok     {build_id}" + (f"  {figures}" if figures else "")


def headline(metrics: dict, status: str | None = None) -> str:
    """A passed build's figures for its result line: time, rate, memory, offload, the integer graph's SNR against
    the QDQ model and the deployed graph's against float, the spec's evaluate: metric (and, for a build the host
    runs wholly or mostly, that first)."""
    parts = [status.removeprefix("passed ").strip("()")] if status in (Status.HOST_ONLY, Status.MOSTLY_HOST) else []
    ms = metrics.get("inference_ms")
    if isinstance(ms, (int, float)) and ms > 0:
        parts.append(f"{num(ms)} ms ({1000 / ms:,.0f} inf/s)")
    pools = pools_text(metrics)
    if pools:
        parts.append(pools)
    off = metrics.get("npu_offload")
    if isinstance(off, (int, float)):
        parts.append(f"NPU {off:.0%}")
    snr = metrics.get("tosa_snr_db")
    if isinstance(snr, (int, float)):
        parts.append(f"SNR {snr:.1f} dB")
    vs_float = metrics.get("float_snr_db")
    if isinstance(vs_float, (int, float)):
        parts.append(f"vs float {vs_float:.1f} dB")
    ev = eval_text(metrics)
    if ev:
        parts.append(ev)
    return ", ".join(parts)
