"""Which graph inputs are dynamic, and the static shape each gets from the spec's `input_shapes:`.

Exporters leave dims open for batch, image height and width, sequence length: torch's dynamic axes
(`batch`, `sequence`), Paddle's `p2o.DynamicDimension.N` and -1, tf2onnx's `unk__N`, onnx's unnamed `?`.
An NPU graph is static, so each must get a size. The rules, applied in order:
- the spec's `input_shapes: {name: [dims]}` sets an input's whole shape (a dim the model fixes must agree);
- a named dim is the same size wherever it appears (ONNX's meaning of a dim_param): Silero VAD's `state`
  [2, batch, 128] takes `batch` from `input` [batch, sequence];
- a dynamic dim 0 still open is the batch: 1.
What stays open is one error line naming every such input, axis and dim, and the `input_shapes:` entry
that would close it. `npubuild validate` prints what was dynamic and what it became.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from npubuild.errors import InputError


@dataclass(frozen=True)
class InputShape:
    """One graph input: its dims as the model declares them (an int, or the dim's name, '?' for none) and
    as the build will use them, with where each dynamic dim's size came from."""

    name: str
    declared: tuple[int | str, ...]
    resolved: tuple[int | None, ...]
    origins: tuple[str, ...]  # per dim: "model", "input_shapes", "batch", or "as '<name>'"

    @property
    def dynamic(self) -> bool:
        return any(isinstance(d, str) for d in self.declared)

    def describe(self) -> str:
        """'x [batch, 3, H, W] -> [1, 3, 160, 160] (input_shapes)'."""
        decl = ", ".join(str(d) for d in self.declared)
        res = ", ".join("?" if d is None else str(d) for d in self.resolved)
        why = sorted({o for o, d in zip(self.origins, self.declared, strict=True) if isinstance(d, str)})
        return f"{self.name} [{decl}] -> [{res}] ({', '.join(why)})"


def _declared(vi: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        else:  # a name, nothing, or Paddle's -1
            dims.append(d.dim_param or "?")
    return tuple(dims)


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def resolve(model: onnx.ModelProto, shapes: dict[str, list[int]], where: str) -> list[InputShape]:
    """Every graph input's static shape under `shapes`; one InputError for all that stays open."""
    inputs = graph_inputs(model)
    names = {i.name for i in inputs}
    for name in shapes:
        if name not in names:
            raise InputError(f"input_shapes names '{name}', but the model's inputs are {sorted(names)}", where)
    declared = {vi.name: _declared(vi) for vi in inputs}
    sizes: dict[str, tuple[int, str]] = {}  # dim name -> (size, what set it)
    resolved: dict[str, list[int | None]] = {}
    origins: dict[str, list[str]] = {}

    def bind(label: int | str, size: int, what: str) -> None:
        if not isinstance(label, str) or label == "?":
            return
        known = sizes.get(label)
        if known is not None and known[0] != size:
            raise InputError(f"dim '{label}' is {known[0]} for {known[1]} but {size} for {what}: a named dim is "
                             "one size throughout the model", where)
        sizes.setdefault(label, (size, what))

    for vi in inputs:
        dims, given = declared[vi.name], shapes.get(vi.name)
        if given is None:
            resolved[vi.name] = [d if isinstance(d, int) else None for d in dims]
            origins[vi.name] = ["model" if isinstance(d, int) else "" for d in dims]
            continue
        if len(given) != len(dims):
            raise InputError(f"input '{vi.name}' has rank {len(dims)}, input_shapes gives {len(given)} dims", where)
        for axis, (d, v) in enumerate(zip(dims, given, strict=True)):
            if isinstance(d, int) and d != v:
                raise InputError(f"input '{vi.name}': dim {d} is fixed in the model, spec says {v}", where)
            bind(d, v, f"input '{vi.name}' axis {axis}")
        resolved[vi.name] = list(given)
        origins[vi.name] = ["model" if isinstance(d, int) else "input_shapes" for d in dims]
    for batch_pass in (False, True):  # named dims first, then an open dim 0 is the batch (1), then names again
        for vi in inputs:
            dims, res, why = declared[vi.name], resolved[vi.name], origins[vi.name]
            for axis, d in enumerate(dims):
                if res[axis] is not None:
                    continue
                if isinstance(d, str) and d in sizes:
                    res[axis], why[axis] = sizes[d][0], f"as '{d}'"
                elif batch_pass and axis == 0:
                    res[axis], why[axis] = 1, "batch"
                    bind(d, 1, f"input '{vi.name}' axis 0 (the batch)")
        if batch_pass:
            for vi in inputs:
                for axis, d in enumerate(declared[vi.name]):
                    if resolved[vi.name][axis] is None and isinstance(d, str) and d in sizes:
                        resolved[vi.name][axis], origins[vi.name][axis] = sizes[d][0], f"as '{d}'"
    result = [InputShape(vi.name, declared[vi.name], tuple(resolved[vi.name]), tuple(origins[vi.name]))
              for vi in inputs]
    open_ = [s for s in result if None in s.resolved]
    if open_:
        raise InputError(open_dims_message(open_), where)
    return result


def open_dims_message(open_: list[InputShape]) -> str:
    """'input 'x' has dynamic dims at axis 2 ('H'), axis 3: set input_shapes in the spec, e.g. input_shapes:
    {x: [1, 3, <H>, <size>]}'."""
    parts, example = [], []
    for s in open_:
        pairs = list(zip(s.declared, s.resolved, strict=True))
        dims = [f"axis {a} ('{d}')" if d != "?" else f"axis {a}" for a, (d, r) in enumerate(pairs) if r is None]
        parts.append(f"input '{s.name}' has dynamic dim{'s' if len(dims) > 1 else ''} at {', '.join(dims)}")
        shown = [str(r) if r is not None else f"<{d if d != '?' else 'size'}>" for d, r in pairs]
        example.append(f"{s.name}: [{', '.join(shown)}]")
    return f"{'; '.join(parts)}: set input_shapes in the spec, e.g. input_shapes: {{{', '.join(example)}}}"


def apply(model: onnx.ModelProto, resolved: list[InputShape]) -> None:
    """Write the resolved dims into the model's graph inputs."""
    by_name = {s.name: s for s in resolved}
    for vi in graph_inputs(model):
        s = by_name[vi.name]
        for d, v in zip(vi.type.tensor_type.shape.dim, s.resolved, strict=True):
            d.Clear()
            d.dim_value = int(v)
