"""Seeded mutations of a compile spec (text) and of a small ONNX model (fields and bytes) for the fuzz test."""

from __future__ import annotations

import copy
import random

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SPEC = """version: 1
name: fuzz
models:
  m:
    path: models/m.onnx
    input_shapes: {x: [1, 4, 8, 8]}
    calibration: {random: {samples: 4, seed: 0, low: -1.0, high: 1.0}}
targets: [ethos-u55-128, {extends: ethos-u85-256, name: u85-small, pools: {sram: {size_kib: 256}}}]
pipeline: default
quantization: {per_channel: true, method: minmax}
verify: {tosa: true, samples: 2, fvp: auto}
expect: {npu_offload: 1.0, max_tosa_error_lsb: 1}
"""

JUNK = ["", "~", "null", "-1", "0", "1e400", "-1e400", ".nan", "9" * 40, "[]", "{}", "[1, [2, [3]]]", "{a: {b: c}}",
        "'\u202e'", "\"\\x00\"", "&a x", "*a", "!!python/object:os.system", "!!binary AAAA", "<<: {x: 1}",
        "../../../../etc/passwd", "/etc/passwd", "kws.yaml", "ethos-u99-1", "\t", "? [a]\n: b", "yes", "0x1F",
        "2001-01-01", "--- \n---", "%YAML 1.1", "@x", "`x`", "\ud7ff", "|\n  x", ">-\n  x", "[" * 40, "{" * 30]
CHARS = ["\x00", "\x07", "\x1b", "\t", "\r", "\n", "\ufeff", "\u2028", ":", "-", "#", "&", "*", "!", "|", ">", "'",
         '"', "%", "@", "`", "{", "}", "[", "]", ","]


def mutate_spec(rng: random.Random, text: str = SPEC) -> str:
    """One to three random edits of the spec's text."""
    lines = text.splitlines()
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(9)
        i = rng.randrange(len(lines)) if lines else 0
        if op == 0 and lines:
            del lines[i]
        elif op == 1 and lines:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif op == 2 and lines:
            line = lines[i]
            pos = rng.randrange(len(line) + 1)
            lines[i] = line[:pos] + rng.choice(CHARS) + line[pos:]
        elif op == 3 and lines and ":" in lines[i]:
            key, _, _ = lines[i].partition(":")
            lines[i] = f"{key}: {rng.choice(JUNK)}"
        elif op == 4:
            lines.insert(i, rng.choice(["extends: ../../../outside.yaml", "extends: /etc/passwd.yaml",
                                        "extends: fuzz.yaml", "search_paths: [../../..]", "search_paths: [/]",
                                        "a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
                                        "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: [*c,*c,*c,*c,*c,*c,*c,*c,*c]"]))
        elif op == 5:
            text2 = "\n".join(lines)
            cut = rng.randrange(len(text2) + 1)
            lines = text2[:cut].splitlines()
        elif op == 6 and lines:
            lines[i] = "  " * rng.randrange(6) + lines[i].lstrip()
        elif op == 7 and lines:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines.insert(i, "x" + "".join(rng.choice("[{") for _ in range(rng.randrange(1, 200))))
    return "\n".join(lines) + ("\n" if rng.random() < 0.9 else "")


def base_model() -> onnx.ModelProto:
    """Conv -> Relu -> MaxPool -> Flatten -> Gemm: small (a few KiB), and every field a mutation can hit."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.uniform(-0.5, 0.5, (8, 4, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.uniform(-0.1, 0.1, (8,)).astype(np.float32), "b"),
             numpy_helper.from_array(rng.uniform(-0.5, 0.5, (128, 10)).astype(np.float32), "fc_w"),
             numpy_helper.from_array(rng.uniform(-0.1, 0.1, (10,)).astype(np.float32), "fc_b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv0", pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu0"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool0", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten0", axis=1),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc0")]
    graph = helper.make_graph(nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


OPS = ["Relu", "Sigmoid", "Conv", "Add", "Mul", "MatMul", "Gemm", "Reshape", "Transpose", "Softmax", "Concat",
       "Split", "Slice", "Pad", "Resize", "MaxPool", "AveragePool", "GlobalAveragePool", "Flatten", "Squeeze",
       "Unsqueeze", "Gather", "ReduceMean", "Clip", "Identity", "Dropout", "Where", "Greater", "Cast", "Shape",
       "ConstantOfShape", "Expand", "Tile", "DepthToSpace", "LSTM", "If", "Loop", "NonZero", "TopK", "Einsum"]
INTS = [0, -1, 1, 2, 3, 7, 255, 65536, 2**31 - 1, -(2**31), 2**62]
FLOATS = [0.0, -0.0, 1e-45, 1e38, 3.4e38, float("nan"), float("inf"), -float("inf"), 1e30, -7.5]


def _mutate_fields(rng: random.Random, m: onnx.ModelProto) -> None:
    g = m.graph
    op = rng.randrange(13)
    if op == 0 and g.node:  # an attribute's integers
        node = rng.choice(list(g.node))
        ints = [a for a in node.attribute if a.type == onnx.AttributeProto.INTS]
        if ints:
            a = rng.choice(ints)
            a.ints[rng.randrange(len(a.ints))] = rng.choice(INTS)
        else:
            node.attribute.append(helper.make_attribute(rng.choice(["axis", "group", "strides", "pads"]),
                                                        rng.choice(INTS)))
    elif op == 1 and g.initializer:  # an initializer's dims
        t = rng.choice(list(g.initializer))
        if t.dims:
            t.dims[rng.randrange(len(t.dims))] = rng.choice(INTS[:7])
    elif op == 2 and g.initializer:  # its data type
        rng.choice(list(g.initializer)).data_type = rng.randrange(0, 40)
    elif op == 3 and g.initializer:  # its bytes
        t = rng.choice(list(g.initializer))
        raw = bytearray(t.raw_data)
        if raw:
            cut = rng.choice([0, len(raw) // 2, len(raw) - 1, len(raw) + 8])
            t.raw_data = bytes(raw[:cut]) if cut <= len(raw) else bytes(raw) + b"\0" * 8
    elif op == 4 and g.initializer:  # NaN, Inf, huge or tiny values
        t = rng.choice(list(g.initializer))
        if t.data_type == TensorProto.FLOAT and t.raw_data:
            a = np.frombuffer(t.raw_data, np.float32).copy()
            a[rng.randrange(a.size)] = rng.choice(FLOATS)
            t.raw_data = a.tobytes()
    elif op == 5:  # a graph input's or output's shape or type
        vi = rng.choice(list(g.input) + list(g.output))
        dims = vi.type.tensor_type.shape.dim
        if dims and rng.random() < 0.7:
            d = dims[rng.randrange(len(dims))]
            choice = rng.choice([0, -3, 1, 5, 100000, "batch"])
            if isinstance(choice, str):
                d.dim_param = choice
            else:
                d.dim_value = choice
        else:
            vi.type.tensor_type.elem_type = rng.randrange(0, 27)
    elif op == 6 and g.node:  # an op type
        rng.choice(list(g.node)).op_type = rng.choice(OPS)
    elif op == 7 and g.node:  # rewire an edge
        node = rng.choice(list(g.node))
        names = [n for x in g.node for n in x.output] + [i.name for i in g.input] + ["", "nowhere"]
        if node.input:
            node.input[rng.randrange(len(node.input))] = rng.choice(names)
    elif op == 8 and g.node:  # drop or duplicate a node
        i = rng.randrange(len(g.node))
        if rng.random() < 0.5:
            del g.node[i]
        else:
            g.node.insert(i, copy.deepcopy(g.node[i]))
    elif op == 9:  # the opset or IR version
        if rng.random() < 0.5:
            m.opset_import[0].version = rng.randrange(1, 30)
        else:
            m.ir_version = rng.randrange(0, 14)
    elif op == 10 and g.initializer:  # external data
        t = rng.choice(list(g.initializer))
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", rng.choice(["../../x.bin", "/etc/hostname", "w.bin", "", "."])),
                     ("length", str(rng.choice([0, 4, 10**12])))):
            e = t.external_data.add()
            e.key, e.value = k, v
    elif op == 11:  # a Constant node with a big or odd value
        shape = rng.choice([[1], [0], [3, 0, 2], [1 << 20]])
        value = helper.make_tensor("v", TensorProto.FLOAT, shape, np.zeros(int(np.prod(shape)), np.float32))
        g.node.insert(0, helper.make_node("Constant", [], ["k"], name="k0", value=value))
        g.node[-1].input.append("k")
    else:  # a ConstantOfShape that would expand
        shape = numpy_helper.from_array(np.array(rng.choice([[1 << 40], [1 << 15, 1 << 15], [-1], [0]]), np.int64), "s")
        g.initializer.append(shape)
        g.node.insert(0, helper.make_node("ConstantOfShape", ["s"], ["z"], name="cos0"))
        g.node.append(helper.make_node("Add", ["y", "z"], ["y2"], name="add_z"))


def mutate_model(rng: random.Random) -> bytes:
    """The base model with one to three field edits, or (one case in five) its bytes flipped or cut."""
    m = base_model()
    if rng.random() < 0.2:
        data = bytearray(m.SerializeToString())
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data[: rng.randrange(len(data) // 2, len(data) + 1)])
    for _ in range(rng.randint(1, 3)):
        _mutate_fields(rng, m)
    return m.SerializeToString()


# ------------------------------------------------------------------ issue 34: bytes, strings, reports, flags

def mutate_spec_bytes(rng: random.Random, text: str = SPEC) -> tuple[bytes, int, int]:
    """The spec with one byte that cannot start or continue UTF-8 put somewhere: (bytes, its 1-based line,
    its 1-based column in characters)."""
    lines = text.splitlines(keepends=True)
    i = rng.randrange(len(lines))
    pos = rng.randrange(len(lines[i].rstrip("\n")) + 1)
    bad = bytes([rng.choice([0x80, 0x9B, 0xC0, 0xC3, 0xE9, 0xF8, 0xFE, 0xFF])])
    tail = b"" if bad[0] not in (0xC3, 0xE9) else b"x"  # a lead byte followed by a non-continuation byte
    data = "".join(lines[:i]).encode() + lines[i][:pos].encode() + bad + tail + lines[i][pos:].encode() + \
        "".join(lines[i + 1:]).encode()
    return data, i + 1, pos + 1


def mutate_model_strings(rng: random.Random) -> tuple[bytes, str]:
    """The base model with one byte of one of its strings (producer, node, input or output names) made a byte
    that is not UTF-8, as a bit flip in the file does: (bytes, the string's value)."""
    m = base_model()
    m.producer_name = "npubuild.fuzz"
    strings = [m.producer_name, *(n.name for n in m.graph.node), *(n.op_type for n in m.graph.node),
               *(i.name for i in m.graph.input), *(o.name for o in m.graph.output)]
    data = bytearray(m.SerializeToString())
    target = rng.choice(sorted(set(s for s in strings if len(s) > 1)))
    at = data.find(target.encode())
    data[at + rng.randrange(len(target))] = rng.choice([0x80, 0x9B, 0xC3, 0xFF])
    return bytes(data), target


HOSTILE_METRICS = ["NaN", "Infinity", "-Infinity", '"12.5"', "true", "[]", "{}", "1e999", '"NaN"']


def mutate_report(rng: random.Random, report: dict) -> tuple[str, bool]:
    """A report.json with one metric of one build replaced by a hostile JSON value, or (one case in four) a
    plain number: (the JSON text, whether the damage should be refused)."""
    import json

    out = json.loads(json.dumps(report))
    b = rng.choice(out["builds"])
    metric = rng.choice(["inference_ms", "sram_kib", "tosa_snr_db", "npu_offload", "tosa_max_error_lsb"])
    if rng.random() < 0.25:
        b["metrics"][metric] = rng.choice([0, 1.5, 1e6, -3])
        return json.dumps(out), False
    b["metrics"][metric] = "@@HOSTILE@@"
    text = json.dumps(out).replace('"@@HOSTILE@@"', rng.choice(HOSTILE_METRICS))
    return text, True


def hostile_flags(rng: random.Random) -> tuple[list[str], dict[str, str], str]:
    """One hostile command line or environment for a built project: (args, env, what the answer must be:
    'ok', 'clamped' or 'bad')."""
    case = rng.randrange(9)
    if case == 0:
        return ["build", "-q", "-n", str(rng.choice([3, 64, 10**5, 10**12]))], {}, "clamped"
    if case == 1:
        return ["build", "-q", "-n", rng.choice(["0", "-4", "x", "1e3"])], {}, "bad"
    if case == 2:
        return ["build", "-q"], {"NPUBUILD_STAGE_WORKERS": rng.choice(["0", "-1", "many", "1.5"])}, "bad"
    if case == 3:
        return ["build", "-q"], {"NPUBUILD_STAGE_MEMORY_MIB": rng.choice(["0", "4G", "-9", "x"])}, "bad"
    if case == 4:
        return ["build", "-q", "--cache", rng.choice(["nosuchproto://x", "s3x://b", "file://" + "a" * 10])], {}, "bad"
    if case == 5:
        return ["build", "-q"], {"NPUBUILD_CACHE_KEY_FILE": rng.choice(["/nonexistent/key", "/", "/dev/null"])}, "bad"
    if case == 6:
        return ["debug-numerics", "configs/fuzz.yaml", "--target", "ethos-u55-128", "--samples",
                rng.choice(["0", "1001", str(10**9), "-1", "two"])], {}, "bad"
    if case == 7:
        return ["compile", "configs/models/m.onnx", "--target",
                rng.choice(["../../../../etc/passwd", "/etc/passwd", "..", "a/b", "ethos-u55-128/../x"])], {}, "bad"
    return ["report", "--junit", rng.choice([".", "configs", "/"])], {}, "bad"
