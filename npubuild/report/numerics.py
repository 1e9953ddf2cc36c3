"""report.md section on numerics: accuracy on the evaluation set, per-output error, FVP cycles next to Vela's."""

from __future__ import annotations


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def worst_node_text(m: dict) -> str:
    """The node with the largest own error (fed the QDQ model's inputs: verify/node_errors), e.g.
    `resize_70 (Resize) 1 LSB on 1.74%`; '-' where the check measured none."""
    w = m.get("tosa_worst_node")
    if not w:
        return "-"
    return f"{w['node']} ({w['op_type']}) {w['max_error_lsb']:.0f} LSB on {w['mismatched']:.2%}"


def numerics_markdown(builds: list[dict]) -> list[str]:
    """One row per build that has numerics; nothing when no build ran a TOSA check."""
    rows = []
    notes: dict[str, int] = {}  # an FVP skip reason -> its footnote number: said once under the table, not per row
    for b in builds:
        m = b.get("metrics") or {}
        if m.get("tosa_snr_db") is None:
            continue
        fvp = b.get("stages", {}).get("fvp", {})
        if m.get("fvp_npu_cycles") is not None:
            fvp_text = f"{_f(m.get('fvp_npu_cycles'), 'd')} ({_f(m.get('fvp_vs_vela_cycles'), '.2f')}x Vela)"
        elif fvp.get("reason"):
            fvp_text = f"{fvp.get('status', '-')} [{notes.setdefault(fvp['reason'], len(notes) + 1)}]"
        else:
            fvp_text = fvp.get("status", "-")
        rows.append(f"| {b['spec']}/{b['model']}/{b['target']} | {float_text(m)} | {agreement_text(m)} | "
                    f"{evaluate_text(m)} | {_f(m.get('float_accuracy'), '.2%')} | "
                    f"{_f(m.get('accuracy'), '.2%')} | {_f(m.get('tosa_max_error_lsb'), '.0f')} | {worst_node_text(m)} | "
                    f"{_f(m.get('tosa_snr_db'), '.1f')} | {_f(m.get('quant_snr_db'), '.1f')} | "
                    f"{_f(m.get('npu_cycles'), 'd')} | {fvp_text.strip()} |")
    if not rows:
        return []
    return ["", "## Numerics and accuracy", "",
            "Against float: the graph the target deploys against the float model on samples that did not calibrate "
            "it (SNR of the worst output; in brackets the QDQ model's own, then the largest and mean error in the "
            "output's LSB); an output that has collapsed (SNR < 6 dB, but a probability within its LSB) fails the default gate "
            "`max_collapsed_outputs`. TOSA: the integer graph against the QDQ model it implements.", "",
            "| build | against float: SNR dB (QDQ) / LSB max, mean / samples | agreement with float | evaluate: deployed "
            "(QDQ, float) | float top-1 | int8 top-1 | TOSA max LSB | worst node (own LSB) | TOSA SNR dB | quant SNR dB "
            "| Vela NPU cycles | FVP NPU cycles |",
            "|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---|", *rows, *collapsed_rows(builds),
            *([""] + [f"[{n}] FVP: {reason}" + ("  " if n < len(notes) else "") for reason, n in notes.items()]
              if notes else [])]


def float_text(m: dict) -> str:
    """`24.1 (24.3) / 9, 1.2 / 4 held-back`, with the collapsed outputs counted: the deployed graph vs float."""
    if m.get("float_snr_db") is None:
        return "-"
    text = (f"{m['float_snr_db']:.1f} ({_f(m.get('qdq_float_snr_db'), '.1f')}) / "
            f"{_f(m.get('float_max_error_lsb'), '.0f')}, {_f(m.get('float_mean_error_lsb'), '.1f')} / "
            f"{m.get('float_samples')} {m.get('float_samples_from')}")
    return text + (f" / **{m['collapsed_outputs']} collapsed**" if m.get("collapsed_outputs") else "")


def agreement_text(m: dict) -> str:
    parts = [f"{label} {m[key]:.1%}" for key, label in (("float_top1_agreement", "top-1"), ("float_mask_iou", "mask IoU"),
                                                          ("float_decision_agreement", "decisions"))
             if m.get(key) is not None]
    return ", ".join(parts) or "-"


def evaluate_text(m: dict) -> str:
    if m.get("eval_metric") is None:
        return "-"
    rest = ", ".join(_f(m.get(k), ".4g") for k in ("eval_qdq_score", "eval_float_score"))
    return f"{m['eval_metric']} {_f(m.get('eval_score'), '.4g')} ({rest}) on {m.get('eval_samples')} ({m.get('eval_engine')})"


def collapsed_rows(builds: list[dict]) -> list[str]:
    """Each collapsed output of each build, under the table: which one, how far from float."""
    lines = []
    for b in builds:
        for name, o in ((b.get("metrics") or {}).get("float_outputs") or {}).items():
            if o.get("collapsed"):
                lines.append(f"- {b['spec']}/{b['model']}/{b['target']}: output `{name}` collapsed against float: "
                             f"SNR {o['snr_db']:.1f} dB (QDQ model {_f(o.get('qdq_snr_db'), '.1f')} dB), "
                             f"mean error {_f(o.get('mean_error_lsb'), '.1f')} LSB, max {_f(o.get('max_error_lsb'), '.0f')}")
    return ["", *lines] if lines else []


def stored_layers(build_dir, build_id: str, lower_key: str | None) -> dict:
    """The last `debug-numerics` result of a build, while its lowering is unchanged ({} otherwise)."""
    import json
    from pathlib import Path

    path = Path(build_dir) / "builds" / build_id / "layers.json"
    try:
        res = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {"layer_numerics": res} if lower_key is not None and res.get("lower_key") == lower_key else {}
