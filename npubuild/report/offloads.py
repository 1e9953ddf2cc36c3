"""report.md sections on placement: where nodes run (offloads, partitions) and the most expensive layers."""

from __future__ import annotations

TOP_LAYERS = 5


def _fmt_ops(ops: list[str]) -> str:
    return ", ".join(ops) if ops else "-"


def placement_markdown(builds: list[dict]) -> list[str]:
    """Per build: the CPU-placed nodes with their rule, the partition count, and the top layers by cycles."""
    lines: list[str] = []
    for b in builds:
        m = b.get("metrics") or {}
        offloads, layers = m.get("offloads"), m.get("top_layers")
        if not offloads and not layers:
            continue
        lines += ["", f"## {b['spec']}/{b['model']}/{b['target']}: placement and costliest layers", ""]
        if offloads:
            on_host = [p for p in offloads if p["kind"] != "npu"]
            lines.append(f"{m.get('npu_partitions')} NPU partition(s); {len(on_host)} of {len(offloads)} ONNX nodes "
                         "on the CPU.")
            mixed = [p for p in offloads if p.get("precision")]
            if mixed:  # a build with 16-bit activations or 4-bit weights: each node's precision
                counts: dict[str, int] = {}
                for p in mixed:
                    counts[p["precision"]] = counts.get(p["precision"], 0) + 1
                lines.append("Precision per node: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + "; "
                             + ", ".join(f"{p['node']} {p['precision']}" for p in mixed) + ".")
            if on_host:
                lines += ["", "| node | op | host partition | TOSA ops | rule | reason |", "|---|---|---:|---|---|---|"]
                lines += [f"| {p['node']} | {p['op_type']} | {p['partition']} | {_fmt_ops(p['tosa_ops'])} | "
                          f"{p['rule']} | {p['reason']} |" for p in on_host]
        if layers:
            lines += ["", "| ONNX node | Vela op | partition | cycles | % of cycles | MACs | MAC util % |",
                      "|---|---|---:|---:|---:|---:|---:|"]
            lines += [f"| {lay.get('onnx_node') or lay.get('tensor')} | {lay.get('npu_op')} | {lay.get('partition')} | "
                      f"{lay.get('cycles')} | {lay.get('cycles_pct')} | {lay.get('macs')} | {lay.get('mac_util_pct')} |"
                      for lay in layers[:TOP_LAYERS]]
    return lines
