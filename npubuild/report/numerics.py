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
        rows.append(f"| {b['spec']}/{b['model']}/{b['target']} | {_f(m.get('float_accuracy'), '.2%')} | "
                    f"{_f(m.get('accuracy'), '.2%')} | {_f(m.get('tosa_max_error_lsb'), '.0f')} | {worst_node_text(m)} | "
                    f"{_f(m.get('tosa_snr_db'), '.1f')} | {_f(m.get('quant_snr_db'), '.1f')} | "
                    f"{_f(m.get('npu_cycles'), 'd')} | {fvp_text.strip()} |")
    if not rows:
        return []
    return ["", "## Numerics and accuracy", "",
            "| build | float top-1 | int8 top-1 | TOSA max LSB | worst node (own LSB) | TOSA SNR dB | quant SNR dB | Vela NPU cycles | FVP NPU cycles |",
            "|---|---:|---:|---:|---|---:|---:|---:|---|", *rows,
            *([""] + [f"[{n}] FVP: {reason}" + ("  " if n < len(notes) else "") for reason, n in notes.items()]
              if notes else [])]


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
