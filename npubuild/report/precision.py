"""report.md and report.html on precision: which layers are 16-bit or have 4-bit weights, and for
`precision: auto` what the search measured, what each choice cost and bought (frontend/precision/)."""

from __future__ import annotations

from html import escape


def _cycles(d: dict) -> str:
    return ", ".join(f"{t} {'+' if v >= 0 else ''}{v}" for t, v in d.items()) or "-"


def precision_lines(m: dict) -> list[str]:
    """Plain-text lines of one build's precision (empty for an 8x8 build)."""
    p = m.get("precision")
    if not p:
        return []
    lines = [f"{p['mode']}: {p['int16_groups']} of {p['groups']} activation groups int16 "
             f"({', '.join(p['int16_layers']) or 'none'}); {p['int4_layers']} of {p['weighted_layers']} weighted "
             f"layers with int4 weights ({', '.join(p['int4_weights']) or 'none'})"]
    if "met" in p:
        b = p["budget"]
        want = (f"SNR >= {b['min_snr_db']} dB" if b.get("min_snr_db") is not None else "") + \
            (f" top-1 agreement >= {b['min_top1_agreement']}" if b.get("min_top1_agreement") is not None else "")
        cyc = "; ".join(f"{t}: int8 {c['int8']}, all-int16 {c['int16']}, chosen {c['chosen']} cycles"
                        for t, c in p["cycles"].items())
        lines.append(f"budget {want.strip()}, slowdown <= {b['max_slowdown']}x: {'met' if p['met'] else 'NOT MET'}; "
                     f"calibration SNR vs float int8 {p['int8']['snr_db']} dB, all-int16 {p['int16']['snr_db']} dB, "
                     f"chosen {p['chosen']['snr_db']} dB; {cyc}")
        if p.get("int16_meets") is False:
            lines.append("16 bits everywhere does not reach the budget either: the int8 weights (the widest Ethos-U "
                         "weights) limit the accuracy")
    return lines


def choice_rows(p: dict) -> list[tuple[str, str, str, str]]:
    """(precision, layers, cost in cycles per target, what it buys) per choice the search made."""
    rows = [("int16", ", ".join(g["layers"]) or g["group"], _cycles(g["cycles"]), f"{g['loss_db']} dB")
            for g in p.get("int16_choices", [])]
    rows += [("int4 weights", lay["layer"], _cycles(lay["cycles"]),
              f"-{lay['weight_bytes_saved']} weight bytes for {lay['loss_db']} dB")
             for lay in p.get("int4_choices", [])]
    return rows


def precision_markdown(builds: list[dict]) -> list[str]:
    out: list[str] = []
    for b in builds:
        m = b.get("metrics") or {}
        lines = precision_lines(m)
        if not lines:
            continue
        if not out:
            out += ["", "## Precision", ""]
        out.append(f"- {b['spec']}/{b['model']}/{b['target']}: " + "; ".join(lines))
        rows = choice_rows(m["precision"])
        if rows:
            out += ["", "  | precision | layers | cycles (per target) | buys |", "  |---|---|---|---|"]
            out += [f"  | {a} | {c} | {d} | {e} |" for a, c, d, e in rows]
    return out


def precision_html(m: dict) -> str:
    lines = precision_lines(m)
    if not lines:
        return ""
    rows = choice_rows(m["precision"])
    body = "".join(f"<p>{escape(line)}</p>" for line in lines)
    if rows:
        body += ("<table><tr><th>precision</th><th>layers</th><th>cycles (per target)</th><th>buys</th></tr>"
                 + "".join(f"<tr><td>{escape(a)}</td><td>{escape(c)}</td><td>{escape(d)}</td><td>{escape(e)}</td></tr>"
                           for a, c, d, e in rows) + "</table>")
    return "<h4>Precision</h4>" + body
